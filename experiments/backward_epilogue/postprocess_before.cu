// Stage 8's postprocess after the WGMMA build's bulk reductions (DQ_BULK): the float32 dQ they
// summed, tile by tile in the accumulators' order (stages/stage8_wgmma.cu), back to rows in q's
// dtype, in one pass. Thread t's elements 4n … 4n + 3 of a 64 × 64 tile sit at (128n + t)·4:
// with t = 32w + 4g + i4 they are rows 16w + g and 16w + g + 8, columns 8n + 2·i4 and + 1. One
// thread here per 4 floats, so the reads are a warp's 512 contiguous bytes; rows past Sq (the
// padding of the last query block) are dropped. In PyTorch this was a copy through a 9-D
// permuted view (stages/stage8.py, tiles_in_order: the reference the tests hold this to). `scale`:
// the softmax scale where the dK/dV kernel left it out of dS (SCALE_AT_END), else 1.
#include "attention.cuh"
#include "mma.cuh"

extern "C" __global__ void __launch_bounds__(256)
attention_backward_postprocess(const float4* acc, elem_t* dq, int Sq, int n_q_blocks, long long quads, float scale) {
    constexpr int ATOMS = (HEAD_DIM + 63) / 64;  // D 96: two, the second's last 32 columns dropped
    const long long f = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (f >= quads) return;
    const float4 x = acc[f];
    const long long tile = f / 1024;  // (bh · n_q_blocks + query block) · ATOMS + 64-column block
    const int within = (int)(f % 1024), n = within / 128, t = within % 128;
    const int w = t / 32, g = t % 32 / 4, i4 = t % 4;
    const int atom = (int)(tile % ATOMS), qb = (int)(tile / ATOMS % n_q_blocks);
    const long long bh = tile / ATOMS / n_q_blocks;
    const int row = 64 * qb + 16 * w + g;
    const int col = 64 * atom + 8 * n + 2 * i4;
    if (ATOMS * 64 != HEAD_DIM && col >= HEAD_DIM) return;
    elem_t* const out = dq + (bh * Sq + row) * HEAD_DIM + col;
    if (row < Sq) *reinterpret_cast<unsigned*>(out) = pack2(x.x * scale, x.y * scale);
    if (row + 8 < Sq) *reinterpret_cast<unsigned*>(out + 8 * HEAD_DIM) = pack2(x.z * scale, x.w * scale);
}

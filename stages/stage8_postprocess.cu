// Stage 8's postprocess after the WGMMA build's bulk reductions (DQ_BULK): the float32 dQ they
// summed, tile by tile in the accumulators' order (stages/stage8_wgmma.cu), back to rows in q's
// dtype, in one pass. Thread t's elements 4n … 4n + 3 of a 64 × 64 tile sit at (128n + t)·4:
// with t = 32w + 4g + i4 they are rows 16w + g and 16w + g + 8, columns 8n + 2·i4 and + 1. So
// the 16 floats at (128n + 32w + 4g)·4 (lanes i4 = 0 … 3) hold columns 8n … 8n + 7 of those two
// rows: one thread here reads them (64 contiguous bytes) and stores two whole 16-byte pieces of
// rows. A warp's lanes take the 8 pieces (n) of 4 rows: its stores fill whole 128-byte lines.
// Rows past Sq (the padding of the last query block) are dropped. In PyTorch this was a copy
// through a 9-D permuted view (stages/stage8.py, tiles_in_order: the reference the tests hold
// this to). `scale`: the softmax scale where the dK/dV kernel left it out of dS (SCALE_AT_END), else 1.
#include "attention.cuh"
#include "mma.cuh"

extern "C" __global__ void __launch_bounds__(256)
attention_backward_postprocess(const float4* acc, elem_t* dq, int Sq, int n_q_blocks, long long pieces, float scale) {
    constexpr int ATOMS = (HEAD_DIM + 63) / 64;  // D 96: two, the second's last 32 columns dropped
    const long long f = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (f >= pieces) return;
    const long long tile = f / 256;  // (bh · n_q_blocks + query block) · ATOMS + 64-column block
    const int u = (int)(f % 256), n = u % 8, g = u / 8 % 8, w = u / 64;
    const int atom = (int)(tile % ATOMS), qb = (int)(tile / ATOMS % n_q_blocks);
    const long long bh = tile / ATOMS / n_q_blocks;
    const int row = 64 * qb + 16 * w + g, col = 64 * atom + 8 * n;
    if (ATOMS * 64 != HEAD_DIM && col >= HEAD_DIM) return;
    const float4* const in = acc + tile * 1024 + 128 * n + 32 * w + 4 * g;
    float4 x[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) x[i] = __ldg(in + i);
    elem_t* const out = dq + (bh * Sq + row) * HEAD_DIM + col;
    if (row < Sq)
        *reinterpret_cast<uint4*>(out) = make_uint4(pack2(x[0].x * scale, x[0].y * scale), pack2(x[1].x * scale, x[1].y * scale),
                                                    pack2(x[2].x * scale, x[2].y * scale), pack2(x[3].x * scale, x[3].y * scale));
    if (row + 8 < Sq)
        *reinterpret_cast<uint4*>(out + 8 * HEAD_DIM) = make_uint4(pack2(x[0].z * scale, x[0].w * scale), pack2(x[1].z * scale, x[1].w * scale),
                                                                   pack2(x[2].z * scale, x[2].w * scale), pack2(x[3].z * scale, x[3].w * scale));
}

// The same after ROWS80's dK/dV kernel, whose tiles are 64 columns of D × 80 queries and hold dQᵀ:
// thread t = 32w + 4g + i4's elements 4n … 4n + 3 (n < 10) at (128n + t)·4 are columns 16w + g and
// + 8 of D, queries 8n + 2·i4 and + 1. One thread here takes (n, w, i4): the 8 float4 of g = 0 … 7
// (64 contiguous bytes per g and 4 lanes) hold 16 columns of D of its two queries, which it stores
// as two 32-byte pieces of rows.
extern "C" __global__ void __launch_bounds__(256)
attention_backward_postprocess_rows80(const float4* acc, elem_t* dq, int Sq, int n_q_blocks, long long pieces, float scale) {
    constexpr int ATOMS = (HEAD_DIM + 63) / 64, QR = 80;
    const long long f = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (f >= pieces) return;
    const long long tile = f / 160;  // (bh · n_q_blocks + query block) · ATOMS + 64-column block
    const int u = (int)(f % 160), i4 = u % 4, w = u / 4 % 4, n = u / 16;
    const int atom = (int)(tile % ATOMS), qb = (int)(tile / ATOMS % n_q_blocks);
    const long long bh = tile / ATOMS / n_q_blocks;
    const int row = QR * qb + 8 * n + 2 * i4, col = 64 * atom + 16 * w;
    if (ATOMS * 64 != HEAD_DIM && col >= HEAD_DIM) return;
    const float4* const in = acc + tile * (QR * 16) + 128 * n + 32 * w + i4;
    float4 x[8];
#pragma unroll
    for (int g = 0; g < 8; ++g) x[g] = __ldg(in + 4 * g);
    elem_t* const out = dq + (bh * Sq + row) * HEAD_DIM + col;
    if (row < Sq) {
        uint4* const o = reinterpret_cast<uint4*>(out);
        o[0] = make_uint4(pack2(x[0].x * scale, x[1].x * scale), pack2(x[2].x * scale, x[3].x * scale),
                          pack2(x[4].x * scale, x[5].x * scale), pack2(x[6].x * scale, x[7].x * scale));
        o[1] = make_uint4(pack2(x[0].z * scale, x[1].z * scale), pack2(x[2].z * scale, x[3].z * scale),
                          pack2(x[4].z * scale, x[5].z * scale), pack2(x[6].z * scale, x[7].z * scale));
    }
    if (row + 1 < Sq) {
        uint4* const o = reinterpret_cast<uint4*>(out + HEAD_DIM);
        o[0] = make_uint4(pack2(x[0].y * scale, x[1].y * scale), pack2(x[2].y * scale, x[3].y * scale),
                          pack2(x[4].y * scale, x[5].y * scale), pack2(x[6].y * scale, x[7].y * scale));
        o[1] = make_uint4(pack2(x[0].w * scale, x[1].w * scale), pack2(x[2].w * scale, x[3].w * scale),
                          pack2(x[4].w * scale, x[5].w * scale), pack2(x[6].w * scale, x[7].w * scale));
    }
}

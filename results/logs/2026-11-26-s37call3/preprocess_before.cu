// Stage 8's preprocess, before either build's kernels: for every query row, padded to whole
// 64-row blocks,
//     δ = Σ_d dO·O   in float32 (the row's term of dS = P ∘ (dP − δ)), and
//     lse·log2 e     the saved log-sum-exp in the kernels' base-2 units;
// +∞ for a row that sees no key (lse = −∞) and for the padding, so that P = 0 there, and δ = 0
// for the padding. One warp per row, lane l reading elements l, l + 32, … of dO and O. With
// dq_zero (the float32 dQ that the dK/dV kernel's reductions add into, rows × D floats) the
// warp also writes the row's D zeros there, in the same pass. One kernel, one pass over dO and
// O: in PyTorch this was six elementwise kernels with float32 temporaries, and a seventh that
// zeroed dQ.
#include "attention.cuh"

extern "C" __global__ void __launch_bounds__(256)
attention_backward_preprocess(const elem_t* dout, const elem_t* out, const float* lse, float* delta,
                              float* lse2, float* dq_zero, int Sq, int Sq_pad, int H, long long rows,
                              long long o_batch, long long o_head, int o_row,
                              long long d_batch, long long d_head, int d_row) {
    const long long row_id = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / 32;  // (b·H + h)·Sq_pad + row
    const int lane = threadIdx.x % 32;
    if (row_id >= rows) return;
    const long long bh = row_id / Sq_pad;
    const int row = (int)(row_id % Sq_pad), b = (int)(bh / H), h = (int)(bh % H);
    float d = 0.0f, l2 = __int_as_float(0x7f800000);  // +∞
    if (row < Sq) {
        const elem_t* o = out + b * o_batch + h * o_head + (size_t)row * o_row;
        const elem_t* g = dout + b * d_batch + h * d_head + (size_t)row * d_row;
#pragma unroll
        for (int c = lane; c < HEAD_DIM; c += 32) d += to_float(o[c]) * to_float(g[c]);
#pragma unroll
        for (int offset = 16; offset > 0; offset /= 2) d += __shfl_xor_sync(0xffffffffu, d, offset);
        const float l = lse[bh * Sq + row];
        if (!(isinf(l) && l < 0.0f)) l2 = l * 1.44269504088896341f;  // log2(e), as a float
    }
    if (lane == 0) {
        delta[row_id] = d;
        lse2[row_id] = l2;
    }
    if (dq_zero != nullptr) {
#pragma unroll
        for (int c = lane; c < HEAD_DIM; c += 32) dq_zero[row_id * HEAD_DIM + c] = 0.0f;
    }
}

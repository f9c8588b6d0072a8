// Stage 8's preprocess, before either build's kernels: for every query row, padded to whole
// 64-row blocks,
//     δ = Σ_d dO·O   in float32 (the row's term of dS = P ∘ (dP − δ)), and
//     lse·log2 e     the saved log-sum-exp in the kernels' base-2 units;
// +∞ for a row that sees no key (lse = −∞) and for the padding, so that P = 0 there, and δ = 0
// for the padding. With dq_zero (the float32 dQ that the dK/dV kernel's reductions add into,
// rows × D floats) it also writes the row's D zeros there, in the same pass. One kernel, one
// pass over dO and O: in PyTorch this was six elementwise kernels with float32 temporaries, and
// a seventh that zeroed dQ.
//
// It only moves memory (at D 64 it reads 4 bytes and writes 4 per element of dQ), so what
// matters is how many bytes each thread has in flight: a row is D/8 threads, each loading 16
// bytes of O and 16 of dO (8 elements) and storing 32 bytes of zeros, instead of a warp per row
// loading 2-byte elements one at a time (which reached 61% of the H100's DRAM bandwidth at
// B16 H16 S2048 D64 in Nsight Compute, results/logs/2026-11-26-adea0d9-h100). The launcher hands
// it rows whose start is 16-byte aligned (a copy otherwise).
#include "attention.cuh"

constexpr int DP = (HEAD_DIM + 63) / 64 * 64;  // dQ's float32 row (D 96: 128, as the WGMMA build's tiles)
constexpr int ROW_THREADS = DP / 8;  // threads per row, 8 elements each (D 96: the last 4 read none)

extern "C" __global__ void __launch_bounds__(256)
attention_backward_preprocess(const elem_t* dout, const elem_t* out, const float* lse, float* delta,
                              float* lse2, float* dq_zero, int Sq, int Sq_pad, int H, long long rows,
                              long long o_batch, long long o_head, int o_row,
                              long long d_batch, long long d_head, int d_row) {
    const long long thread = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long row_id = thread / ROW_THREADS;  // (b·H + h)·Sq_pad + row
    const int part = (int)(thread % ROW_THREADS), c0 = 8 * part;
    if (row_id >= rows) return;  // never splits a warp: rows is a multiple of 64 (whole 64-row blocks)
    const long long bh = row_id / Sq_pad;
    const int row = (int)(row_id % Sq_pad), b = (int)(bh / H), h = (int)(bh % H);
    float d = 0.0f, l2 = __int_as_float(0x7f800000);  // +∞
    if (row < Sq && (DP == HEAD_DIM || c0 < HEAD_DIM)) {
        const uint4 o = *reinterpret_cast<const uint4*>(out + b * o_batch + h * o_head + (size_t)row * o_row + c0);
        const uint4 g = *reinterpret_cast<const uint4*>(dout + b * d_batch + h * d_head + (size_t)row * d_row + c0);
        const elem_t* oe = reinterpret_cast<const elem_t*>(&o);
        const elem_t* ge = reinterpret_cast<const elem_t*>(&g);
#pragma unroll
        for (int c = 0; c < 8; ++c) d += to_float(oe[c]) * to_float(ge[c]);
        if (part == 0) {
            const float l = lse[bh * Sq + row];
            if (!(isinf(l) && l < 0.0f)) l2 = l * 1.44269504088896341f;  // log2(e), as a float
        }
    }
    // the row's ROW_THREADS lanes are consecutive and start at a multiple of ROW_THREADS
#pragma unroll
    for (int offset = ROW_THREADS / 2; offset > 0; offset /= 2) d += __shfl_xor_sync(0xffffffffu, d, offset);
    if (part == 0) {
        delta[row_id] = d;
        lse2[row_id] = l2;
    }
    if (dq_zero != nullptr) {
        float4* const z = reinterpret_cast<float4*>(dq_zero + row_id * DP + c0);
        z[0] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        z[1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
}

// FP8 attention's loop on Hopper (issue 25's second step, after fp8_tile_probe.cu's one tile;
// experiments/fp8_loop_probe/fp8_loop_probe.py runs it against lib.fp8's emulation and the float64 reference).
// The simplest whole forward with both FP8 products, before any of stage 6's machinery:
//   - one warpgroup per block, 64 query rows of one (batch, head), head dim 128 (one e4m3 row is
//     one 128-byte row of the 128-byte swizzle); key tiles of 128;
//   - every thread copies 16-byte chunks into the swizzled tiles and the block waits (no TMA, no
//     producer, no ring: each tile is copied, then used);
//   - S = Q·Kᵀ: wgmma m64n128k32 e4m3 from shared memory, four k-steps of 32 bytes;
//   - the online softmax in float32 on S·(q_descale·k_descale·scale·log2 e);
//   - P·2^8 (p_offset) cast to e4m3 in place: each thread packs its own accumulators into its A
//     registers (lib.fp8.a8_sources), because Vᵀ comes with each k-step's keys in key_order
//     (lib.fp8.v_for_pv); O += P·V with wgmma m64n128k32, B = Vᵀ (K-major: keys along the row);
//   - O · v_descale / (2^8 · l) to bf16.
// Q and K descales are per (batch, K/V head), as lib.fp8.prepare makes them; GQA: query head h
// reads K/V head h / (H / H_kv).
#include "fp8.cuh"  // sw128, wgmma_e4m3_ss/rs, to_e4m3x2
#include <cuda_bf16.h>

constexpr int D = 128, BLOCK_M = 64, BLOCK_N = 128;

__device__ __forceinline__ float exp2_approx(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}
// `rows` rows of 128 bytes from global (row stride `stride` bytes, rows past `valid` and bytes
// past `width` as zeros) into a swizzled tile.
__device__ __forceinline__ void copy_rows(u8* tile, const u8* src, int rows, int valid, long long stride,
                                          int col0, int width) {
    for (int i = threadIdx.x; i < rows * 8; i += 128) {
        const int row = i / 8, c = (i % 8) * 16;
        uint4 x = make_uint4(0, 0, 0, 0);
        if (row < valid && col0 + c < width) x = *reinterpret_cast<const uint4*>(src + row * stride + col0 + c);
        *reinterpret_cast<uint4*>(tile + sw128(row, c)) = x;
    }
}

extern "C" __global__ void __launch_bounds__(128, 1)
fp8_loop_probe(const u8* __restrict__ q, const u8* __restrict__ k, const u8* __restrict__ vt,
               const float* __restrict__ q_descale, const float* __restrict__ k_descale,
               const float* __restrict__ v_descale, __nv_bfloat16* __restrict__ out, int H, int Hk, int Sq,
               int Sk, int Skp, float scale_log2, int p_offset) {
    extern __shared__ unsigned char raw[];
    u8* const sq = reinterpret_cast<u8*>((reinterpret_cast<size_t>(raw) + 1023) & ~size_t(1023));
    u8* const sk = sq + BLOCK_M * 128;   // K: 128 keys × 128 bytes
    u8* const sv = sk + BLOCK_N * 128;   // Vᵀ: 128 dims × 128 keys (bytes), keys in key_order per k-step
    const int q0 = blockIdx.x * BLOCK_M, h = blockIdx.y, b = blockIdx.z, hk = h / (H / Hk);
    const int t = threadIdx.x, w = t / 32, lane = t % 32;
    const float c = q_descale[b * Hk + hk] * k_descale[b * Hk + hk] * scale_log2;  // raw S → log2 units
    const float off = p_offset ? 256.0f : 1.0f;

    copy_rows(sq, q + ((size_t)(b * H + h) * Sq + q0) * D, BLOCK_M, Sq - q0, D, 0, D);
    const u8* const kh = k + (size_t)(b * Hk + hk) * Sk * D;
    const u8* const vh = vt + (size_t)(b * Hk + hk) * D * Skp;
    const unsigned long long dq = smem_desc(sq, 0), dk = smem_desc(sk, 0), dv = smem_desc(sv, 0);

    float o[64], m[2] = {NEG_INF, NEG_INF}, l[2] = {0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < 64; ++i) o[i] = 0.0f;
    for (int k0 = 0; k0 < Sk; k0 += BLOCK_N) {
        __syncthreads();  // every thread is done with the previous tiles
        copy_rows(sk, kh + (size_t)k0 * D, BLOCK_N, Sk - k0, D, 0, D);
        copy_rows(sv, vh, D, D, Skp, k0, Skp);
        fence_proxy_async();
        __syncthreads();

        float s[64];
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) wgmma_e4m3_ss(s, dq + ((kk * 32) >> 4), dk + ((kk * 32) >> 4), kk > 0);
        wgmma_commit();
        wgmma_wait<0>();
        fence_registers(s);

        // Thread t holds rows r0 = 16w + lane/4 and r0 + 8, columns 8n + 2(lane%4) (+1):
        // s[4n], s[4n+1] in row r0, s[4n+2], s[4n+3] in row r0 + 8 (as in stage 6).
        float mx[2] = {m[0], m[1]};
#pragma unroll
        for (int n = 0; n < BLOCK_N / 8; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                if (k0 + 8 * n + 2 * (lane % 4) + (e & 1) >= Sk) s[4 * n + e] = NEG_INF;
                mx[e >> 1] = fmaxf(mx[e >> 1], s[4 * n + e]);
            }
        float alpha[2], base[2], sum[2] = {0.0f, 0.0f};
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
            base[r] = mx[r] * c;
            alpha[r] = m[r] == NEG_INF ? 0.0f : exp2_approx(m[r] * c - base[r]);
            m[r] = mx[r];
        }
#pragma unroll
        for (int n = 0; n < BLOCK_N / 8; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                s[4 * n + e] = exp2_approx(fmaf(s[4 * n + e], c, -base[e >> 1]));
                sum[e >> 1] += s[4 * n + e];
            }
#pragma unroll
        for (int r = 0; r < 2; ++r) l[r] = l[r] * alpha[r] + sum[r];
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
            o[4 * n] *= alpha[0]; o[4 * n + 1] *= alpha[0];
            o[4 * n + 2] *= alpha[1]; o[4 * n + 3] *= alpha[1];
        }
        // P·2^8 in e4m3, packed in place: register r of k-step kk takes accumulators j0, j0 + 1,
        // j0 + 4, j0 + 5 with j0 = 16·kk + 8·(r/2) + 2·(r%2) (lib.fp8.a8_sources).
        unsigned p[4][4];
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                const int j0 = 16 * kk + 8 * (r / 2) + 2 * (r % 2);
                p[kk][r] = to_e4m3x2(s[j0] * off, s[j0 + 1] * off) | (to_e4m3x2(s[j0 + 4] * off, s[j0 + 5] * off) << 16);
            }
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) wgmma_e4m3_rs(o, p[kk], dv + ((kk * 32) >> 4), 1);
        wgmma_commit();
        wgmma_wait<0>();
        fence_registers(o);
        fence_registers(p);
    }

    // O · v_descale / (2^8 · l), rows past Sq not stored; 4-byte stores of two bf16.
    const float vd = v_descale[b * Hk + hk];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
        const int row = q0 + 16 * w + lane / 4 + 8 * r;
        if (row >= Sq) continue;
        const float f = l[r] > 0.0f ? vd / (off * l[r]) : 0.0f;
        __nv_bfloat16* const dst = out + ((size_t)(b * H + h) * Sq + row) * D + 2 * (lane % 4);
#pragma unroll
        for (int n = 0; n < D / 8; ++n)
            *reinterpret_cast<__nv_bfloat162*>(dst + 8 * n) = __floats2bfloat162_rn(o[4 * n + 2 * r] * f, o[4 * n + 2 * r + 1] * f);
    }
}

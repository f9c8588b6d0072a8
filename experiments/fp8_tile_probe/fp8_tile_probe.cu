// One FP8 tile on Hopper, checked piece by piece (issue 25's first step; experiments/fp8_tile_probe/fp8_tile_probe.py
// runs it against torch). One warpgroup, one block:
//   1. S = A·Bᵀ, 64 × 64 over K = 128, wgmma m64n64k32 e4m3 with both operands in shared memory
//      (K-major, 128-byte rows, 128-byte swizzle: one e4m3 row of 128 is one 128-byte row);
//   2. the same product with A from registers, each thread's 16 bytes per k-step gathered from
//      shared memory as lib.fp8.a8_element says the fragment is laid out;
//   3. O = P·V with P = e4m3(S) straight from step 1's accumulators: each thread packs its own
//      float32 accumulators into its A registers (lib.fp8.a8_sources), no shuffle, because the
//      host stores Vᵀ with the keys of each k-step in lib.fp8.key_order().
// Each result goes out in the accumulator layout (lib.fp8.acc_element).
#include "fp8.cuh"  // sw128, wgmma_e4m3_ss/rs, to_e4m3x2

__device__ __forceinline__ void store_acc(float* out, const float (&d)[32]) {  // 64 × 64, row-major
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
    for (int i = 0; i < 32; ++i)
        out[(16 * w + lane / 4 + 8 * ((i / 2) % 2)) * 64 + 8 * (i / 4) + 2 * (lane % 4) + i % 2] = d[i];
}

extern "C" __global__ void __launch_bounds__(128, 1)
fp8_tile_probe(const u8* a, const u8* b, const u8* vt, float* s_ss, float* s_rs, float* o_pv) {
    extern __shared__ unsigned char raw[];
    u8* const base = reinterpret_cast<u8*>((reinterpret_cast<size_t>(raw) + 1023) & ~size_t(1023));
    u8* const sa = base;              // A: 64 rows × 128 bytes
    u8* const sb = base + 64 * 128;   // B: 64 rows (the N of S) × 128 bytes
    u8* const sv = base + 128 * 128;  // Vᵀ: 64 rows (dims) × 128 bytes, keys 0–63 in key_order per k-step
    const int t = threadIdx.x, w = t / 32, lane = t % 32;
    for (int i = t; i < 64 * 8; i += 128) {  // 16-byte chunks, written where the swizzle puts them
        const int row = i / 8, c = (i % 8) * 16;
        *reinterpret_cast<uint4*>(sa + sw128(row, c)) = *reinterpret_cast<const uint4*>(a + row * 128 + c);
        *reinterpret_cast<uint4*>(sb + sw128(row, c)) = *reinterpret_cast<const uint4*>(b + row * 128 + c);
        *reinterpret_cast<uint4*>(sv + sw128(row, c)) = *reinterpret_cast<const uint4*>(vt + row * 128 + c);
    }
    fence_proxy_async();
    __syncthreads();
    const unsigned long long da = smem_desc(sa, 0), db = smem_desc(sb, 0), dv = smem_desc(sv, 0);

    // 1. both operands from shared memory: four k-steps of 32 bytes along the 128-byte rows
    float s[32];
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) wgmma_e4m3_ss(s, da + ((kk * 32) >> 4), db + ((kk * 32) >> 4), kk > 0);
    wgmma_commit();
    wgmma_wait<0>();
    fence_registers(s);
    store_acc(s_ss, s);

    // 2. A from registers: byte i of k-step kk is A[row][32·kk + k] with (row, k) = a8_element(t, i)
    unsigned ar[4][4];
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            unsigned x = 0;
#pragma unroll
            for (int byte = 0; byte < 4; ++byte) {
                const int i = 4 * r + byte;
                const int row = 16 * w + lane / 4 + 8 * ((i / 4) % 2), k = 4 * (lane % 4) + i % 4 + 16 * (i / 8);
                x |= (unsigned)sa[sw128(row, 32 * kk + k)] << (8 * byte);
            }
            ar[kk][r] = x;
        }
    float s2[32];
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) wgmma_e4m3_rs(s2, ar[kk], db + ((kk * 32) >> 4), kk > 0);
    wgmma_commit();
    wgmma_wait<0>();
    fence_registers(s2);
    fence_registers(ar);
    store_acc(s_rs, s2);

    // 3. P = e4m3(S) packed in place: register r of k-step kk takes accumulators j0, j0 + 1,
    //    j0 + 4, j0 + 5 with j0 = 16·kk + 8·(r/2) + 2·(r%2) (lib.fp8.a8_sources); O = P·V over
    //    the 64 keys, two k-steps, Vᵀ K-major with its keys in key_order.
    unsigned pr[2][4];
#pragma unroll
    for (int kk = 0; kk < 2; ++kk)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const int j0 = 16 * kk + 8 * (r / 2) + 2 * (r % 2);
            pr[kk][r] = (unsigned)to_e4m3x2(s[j0], s[j0 + 1]) | ((unsigned)to_e4m3x2(s[j0 + 4], s[j0 + 5]) << 16);
        }
    float o[32];
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 2; ++kk) wgmma_e4m3_rs(o, pr[kk], dv + ((kk * 32) >> 4), kk > 0);
    wgmma_commit();
    wgmma_wait<0>();
    fence_registers(o);
    fence_registers(pr);
    store_acc(o_pv, o);
}

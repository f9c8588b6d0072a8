// Stage 7's quantization of 16-bit inputs: q, k, v (fp16 or bf16) to e4m3 with one scale per
// batch entry and K/V head, and V transposed into the order P·V reads it, in two passes over
// each tensor's bytes. It computes exactly what lib.fp8.prepare and lib.fp8.v_for_pv compute in
// PyTorch (the tests compare the bytes), where PyTorch needed a float32 copy, an absolute value,
// a reduction, a division and a cast per tensor, and a gather for V: several passes, each
// writing a temporary.
//
//   fp8_amax  pass 1, one launch for q, k and v: the largest |x| of each slab (a batch entry's
//             K/V head: for q, the G·Sq rows of that head's query heads; for k and v its Sk
//             rows), 16 bytes per thread, one atomicMax per block on the float's bits (for
//             x >= 0 the bits order as the values do).
//   fp8_cast  pass 2, one launch for the three: q and k (and v, when not transposed) as
//             x / s in e4m3 (s = amax / 448, at least 1e-12, the descale), 8 elements per
//             thread; |x / s| <= 448 by construction, and SATFINITE rounds the last ulp above
//             it down, as PyTorch's cast does. V transposed: a block per 32 keys of a slab casts
//             them into shared memory as [key][d], then each output row d of Vᵀ [B·H_kv, D, Sk']
//             (Sk' = Sk rounded up to 32, zeros after the last key) takes the 32 keys in
//             lib.fp8.key_order().
// fp8_cast and the attention kernel after it are launched with PDL (stages/stage7.py: PDL): each
// block lets the next kernel start once its own work is done (griddep_launch_dependents at its
// end), and fp8_cast waits for the amaxes (griddep_wait) before its first read of them; the
// attention kernel waits for the casts. (Let go at each block's start, the attention kernel's
// blocks, which each need a whole SM's registers, could take SMs the casts still need.)
// Each launch's blocks are numbered along x alone (the tensors' ranges one after another), so
// no count of batch entries and heads meets the 65,535 limit of a grid's y. At small shapes the
// launches themselves cost more than the bytes (six launches took 22 µs at B1 H8 S512 before
// they were merged into two). The launcher (stages/stage7.py, quantize) hands it contiguous
// tensors whose data starts 16-byte aligned.
#include "attention.cuh"
#include "pdl.cuh"
#include <cuda_fp8.h>

constexpr float E4M3_MAX = 448.0f;

__device__ __forceinline__ void load8(const elem_t* p, float (&x)[8]) {
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    const elem_t* e = reinterpret_cast<const elem_t*>(&raw);
#pragma unroll
    for (int i = 0; i < 8; ++i) x[i] = to_float(e[i]);
}
// The descale of slab s from its amax bits: lib.fp8.scales' amax / 448, never below 1e-12, as PyTorch
// computes it — a float tensor divided by a Python number is multiplied by the number's reciprocal (in
// float), which is not always the quotient's last bit (results/logs/2026-11-26-5a26bd5-h100).
__device__ __forceinline__ float descale_of(const unsigned* amax, long long s) {
    return fmaxf(__uint_as_float(amax[s]) * (1.0f / E4M3_MAX), 1e-12f);
}
__device__ __forceinline__ unsigned short to_e4m3x2(float a, float b) {
    return __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
}

// Slab s's amax, shared out among `per_slab` blocks (this is block b of them), 8 elements per
// thread and step; each warp's max, then the block's through shared memory (warp_max), then one
// atomicMax per block.
__device__ __forceinline__ void amax_slab(const elem_t* x, unsigned* amax, long long slab_elems, long long s,
                                          long long b, long long per_slab) {
    const elem_t* base = x + s * slab_elems;
    float m = 0.0f;
    for (long long i = 8 * (b * blockDim.x + threadIdx.x); i < slab_elems; i += 8LL * per_slab * blockDim.x) {
        float v[8];
        load8(base + i, v);
#pragma unroll
        for (int j = 0; j < 8; ++j) m = fmaxf(m, fabsf(v[j]));
    }
#pragma unroll
    for (int o = 16; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    __shared__ float warp_max[8];
    if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = m;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < blockDim.x / 32; ++w) m = fmaxf(m, warp_max[w]);
        atomicMax(amax + s, __float_as_uint(m));
    }
}

// grid x = slabs · (per_q + 2 · per_kv): q's slabs (per_q blocks each), then k's, then v's
// (per_kv each); amax [3][slabs]; slab sizes are multiples of 8 elements.
extern "C" __global__ void __launch_bounds__(256)
fp8_amax(const elem_t* q, const elem_t* k, const elem_t* v, unsigned* amax, long long slabs,
         long long slab_q, long long slab_kv, long long per_q, long long per_kv) {
    long long b = blockIdx.x;
    if (b < slabs * per_q) {
        amax_slab(q, amax, slab_q, b / per_q, b % per_q, per_q);
    } else {
        b -= slabs * per_q;
        const int t = 1 + (int)(b / (slabs * per_kv));  // 1: k, 2: v
        b %= slabs * per_kv;
        amax_slab(t == 1 ? k : v, amax + t * slabs, slab_kv, b / per_kv, b % per_kv, per_kv);
    }
    griddep_launch_dependents();
}

// Block b of a plain cast: elements 8·(256b + thread) … of x (n elements, slabs of slab_elems).
__device__ __forceinline__ void cast_block(const elem_t* x, const unsigned* amax, float* descale, unsigned char* out,
                                           long long slab_elems, long long n, long long b) {
    const long long i = 8 * (b * blockDim.x + threadIdx.x);
    if (i >= n) return;
    const long long s = i / slab_elems;
    const float d = descale_of(amax, s);
    if (i % slab_elems == 0) descale[s] = d;
    float v[8];
    load8(x + i, v);
    uint2 packed;
    packed.x = to_e4m3x2(__fdiv_rn(v[0], d), __fdiv_rn(v[1], d)) | (unsigned)to_e4m3x2(__fdiv_rn(v[2], d), __fdiv_rn(v[3], d)) << 16;
    packed.y = to_e4m3x2(__fdiv_rn(v[4], d), __fdiv_rn(v[5], d)) | (unsigned)to_e4m3x2(__fdiv_rn(v[6], d), __fdiv_rn(v[7], d)) << 16;
    *reinterpret_cast<uint2*>(out + i) = packed;
}

// Keys 32·kb … 32·kb + 31 of slab s of v into Vᵀ, in key order.
__device__ __forceinline__ void cast_vt_block(const elem_t* v, const unsigned* amax, float* descale, unsigned char* vt,
                                              int Sk, int Sk_pad, long long s, int kb) {
    constexpr int D = HEAD_DIM;
    __shared__ unsigned char tile[32][D];  // [key][d], e4m3
    const int key0 = 32 * kb;
    const float d = descale_of(amax, s);
    if (kb == 0 && threadIdx.x == 0) descale[s] = d;
    for (int c = threadIdx.x; c < 32 * D / 8; c += blockDim.x) {  // 8 elements of one key each
        const int key = c / (D / 8), col = 8 * (c % (D / 8));
        float x[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        if (key0 + key < Sk) load8(v + (s * Sk + key0 + key) * D + col, x);
#pragma unroll
        for (int j = 0; j < 8; j += 2)
            *reinterpret_cast<unsigned short*>(&tile[key][col + j]) = to_e4m3x2(__fdiv_rn(x[j], d), __fdiv_rn(x[j + 1], d));
    }
    __syncthreads();
    for (int c = threadIdx.x; c < D * 4; c += blockDim.x) {  // 8 bytes of one output row each
        const int row = c / 4, k0 = 8 * (c % 4);
        uint2 b = make_uint2(0u, 0u);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int k = k0 + i;  // slot k holds key key_order(k) of these 32
            const unsigned byte = tile[8 * (2 * (k / 16) + (k % 4) / 2) + 2 * ((k % 16) / 4) + k % 2][row];
            if (i < 4) b.x |= byte << (8 * i);
            else b.y |= byte << (8 * (i - 4));
        }
        *reinterpret_cast<uint2*>(vt + (s * D + row) * Sk_pad + key0 + k0) = b;
    }
}

// grid x = nq + nk + (Sk_pad > 0 ? slabs · Sk_pad / 32 : nv) with nq, nk, nv = ceil(elements / 2048):
// q's cast blocks, k's, then v's — into Vᵀ (Sk_pad > 0, Sk' keys per row) or cast as it is.
extern "C" __global__ void __launch_bounds__(256)
fp8_cast(const elem_t* q, const elem_t* k, const elem_t* v, const unsigned* amax, float* descale,
         unsigned char* q8, unsigned char* k8, unsigned char* v8, long long slabs, long long n_q, long long n_kv,
         int Sk, int Sk_pad) {
    griddep_wait();  // every block of fp8_amax done, its amaxes visible
    const long long nq = (n_q + 2047) / 2048, nk = (n_kv + 2047) / 2048;
    const long long b = blockIdx.x;
    if (b < nq)
        cast_block(q, amax, descale, q8, n_q / slabs, n_q, b);
    else if (b < nq + nk)
        cast_block(k, amax + slabs, descale + slabs, k8, n_kv / slabs, n_kv, b - nq);
    else if (Sk_pad == 0)
        cast_block(v, amax + 2 * slabs, descale + 2 * slabs, v8, n_kv / slabs, n_kv, b - nq - nk);
    else
        cast_vt_block(v, amax + 2 * slabs, descale + 2 * slabs, v8, Sk, Sk_pad, (b - nq - nk) / (Sk_pad / 32),
                      (int)((b - nq - nk) % (Sk_pad / 32)));
    griddep_launch_dependents();
}

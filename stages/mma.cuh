// The mma.sync-era PTX instructions, as stage 5 introduced them and the stages after it use
// them (stage 8's backward): cp.async copies, ldmatrix fragment loads, the m16n8k16 product
// with its documented fragment layout, a bare 2^x, and the packing of two floats into one
// register of two 16-bit elements. Include after attention.cuh (elem_t, ELEM_BF16).
#pragma once

__device__ __forceinline__ unsigned smem_addr(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
// Copy 16 bytes global → shared without stopping; src_bytes = 0 writes 16 zero bytes instead.
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(smem_addr(dst)), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n"); }
// Wait until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" :: "n"(N)); }

// Four 8×8 matrices of 16-bit elements from shared memory: lanes 8i … 8i + 7 give the row
// addresses of matrix i; lane t receives row t / 4, elements 2(t % 4) and 2(t % 4) + 1, of
// each (x.trans: of each transposed).
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const elem_t* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], const elem_t* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)));
}

// c[4] += a[4] · b[2]: one m16n8k16 tensor-core product, 16-bit inputs, fp32 accumulators.
// Thread t = 4g + i holds c rows g and g + 8, columns 2i and 2i + 1: c[0], c[1] in row g,
// c[2], c[3] in row g + 8.
__device__ __forceinline__ void mma_16816(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
#ifdef ELEM_BF16
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
#else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
#endif
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 2^x in one MUFU.EX2. exp2f() adds a range check and two multiplies around it so that results
// below 2^-126 stay exact (denormals); probabilities that small are 0 for the output anyway, and
// those extra instructions were about a fifth of the loop's. (.ftz: denormals flush to 0.)
__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}
// Two floats → two 16-bit elements in one register (the low half is the first).
__device__ __forceinline__ unsigned pack2(float lo, float hi) {
#ifdef ELEM_BF16
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
#else
    __half2 h = __floats2half2_rn(lo, hi);
#endif
    return *reinterpret_cast<unsigned*>(&h);
}

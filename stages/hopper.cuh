// Hopper (sm_90a) building blocks for stage 6, one thin wrapper per PTX instruction: the
// copy engine (TMA) and its transaction-count barriers (mbarrier), the asynchronous
// warpgroup tensor-core product (wgmma) and its shared-memory descriptors, register
// reallocation (setmaxnreg) and named barriers. Kernel logic stays in stages/stage6.cu.
//
// Every wrapper is `asm volatile` with a "memory" clobber where it orders memory, so the
// compiler keeps them in program order. The PTX ISA's sections on cp.async.bulk.tensor,
// mbarrier, wgmma and setmaxnreg are the reference for each.
#pragma once
#include "attention.cuh"

// The driver's tensor map, opaque to the kernel: 128 bytes, 64-byte aligned. (NVRTC cannot
// include cuda.h, so it is declared here; the host encodes it, lib/stage6 passes it by value.)
struct alignas(64) CUtensorMap { unsigned long long opaque[16]; };

__device__ __forceinline__ unsigned smem_u32(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// ---- mbarrier: a shared-memory barrier that also counts bytes -------------------------------
// A phase completes when `count` threads have arrived AND every byte announced with
// expect_tx has landed. Waiters ask "has the phase with this parity completed?".
__device__ __forceinline__ void mbar_init(unsigned long long* bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(smem_u32(bar)), "r"(count) : "memory");
}
// Make the initialised barriers visible to the copy engine (the async proxy).
__device__ __forceinline__ void mbar_init_fence() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// Arrive once and announce `bytes` more bytes that copies will deliver to this phase.
__device__ __forceinline__ void mbar_arrive_expect_bytes(unsigned long long* bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n"
                 :: "r"(smem_u32(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned long long* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" :: "r"(smem_u32(bar)) : "memory");
}
// Spin until the phase of this parity has completed (try_wait suspends the thread for a
// while in hardware before it reports "not yet", so the loop is not a hot spin).
__device__ __forceinline__ void mbar_wait(unsigned long long* bar, unsigned parity) {
    unsigned done;
    do {
        asm volatile("{\n .reg .pred p;\n"
                     " mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     " selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done) : "r"(smem_u32(bar)), "r"(parity) : "memory");
    } while (!done);
}

// ---- TMA: one instruction copies a whole box of a tensor into shared memory ----------------
// Coordinates are innermost first: {d, s, h, b} for a [B, H, S, D] tensor. Elements outside
// the tensor (rows past S) arrive as zeros, and the box's full size is counted on `bar`.
__device__ __forceinline__ void tma_load_4d(void* dst, const CUtensorMap* map, unsigned long long* bar,
                                            int c0, int c1, int c2, int c3) {
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3, %4, %5}], [%6];\n"
                 :: "r"(smem_u32(dst)), "l"(reinterpret_cast<unsigned long long>(map)),
                    "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(smem_u32(bar)) : "memory");
}
// The same for a 5-D map, {d, s, g, hk, b}: stage 6's packed queries (PACK_GQA), where the box
// holds every query row of the g query heads that share K/V head hk.
__device__ __forceinline__ void tma_load_5d(void* dst, const CUtensorMap* map, unsigned long long* bar,
                                            int c0, int c1, int c2, int c3, int c4) {
    asm volatile("cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3, %4, %5, %6}], [%7];\n"
                 :: "r"(smem_u32(dst)), "l"(reinterpret_cast<unsigned long long>(map)),
                    "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4), "r"(smem_u32(bar)) : "memory");
}
// The other way: a box of shared memory (laid out as the map's swizzle says) into the tensor;
// rows of the box past the tensor's end are not written. Asynchronous: commit the copies as a
// group, and wait for the group's reads of shared memory before the buffer is written again.
__device__ __forceinline__ void tma_store_4d(const CUtensorMap* map, const void* src, int c0, int c1, int c2, int c3) {
    asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n"
                 :: "l"(reinterpret_cast<unsigned long long>(map)), "r"(smem_u32(src)),
                    "r"(c0), "r"(c1), "r"(c2), "r"(c3) : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
__device__ __forceinline__ void tma_prefetch_map(const CUtensorMap* map) {
    asm volatile("prefetch.tensormap [%0];\n" :: "l"(reinterpret_cast<unsigned long long>(map)) : "memory");
}
// Ordinary stores to shared memory that wgmma or TMA read next need this in the writing thread.
__device__ __forceinline__ void fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// ---- register reallocation and named barriers ------------------------------------------------
// Every warp of a warpgroup executes the same setmaxnreg: the producer gives registers back,
// the consumers take them (the kernel must start with a register cap: __launch_bounds__(n, 1)).
template <int N> __device__ __forceinline__ void regs_release() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" :: "n"(N));
}
template <int N> __device__ __forceinline__ void regs_claim() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" :: "n"(N));
}
// Barrier `id` (1–15; 0 is __syncthreads) completes when `threads` threads reached it;
// arrive counts this thread without waiting.
__device__ __forceinline__ void named_bar_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" :: "r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_bar_arrive(int id, int threads) {
    asm volatile("bar.arrive %0, %1;\n" :: "r"(id), "r"(threads) : "memory");
}

// ---- wgmma: a warpgroup (4 warps) multiplies a 64-row tile asynchronously ------------------
// Shared-memory operand descriptor for a tile stored in 128-byte-swizzled rows (what TMA
// writes with SWIZZLE_128B): bits 0–13 start address / 16, 16–29 leading byte offset / 16,
// 32–45 stride byte offset / 16, 62–63 swizzle mode (1 = 128 B).
//   K-major (the reduction dimension contiguous, Q and K here): rows are 128 B apart, groups of
//     8 rows 1024 B apart (stride offset); the leading offset is unused.
//   MN-major (V as the B operand of P·V: its rows are keys = the reduction dimension): 8 key
//     rows of 128 B form a group, groups 1024 B apart (stride offset); the next 64 columns of
//     D live in the next 128-byte-wide block, `lead_bytes` further on (leading offset).
__device__ __forceinline__ unsigned long long smem_desc(const void* tile, unsigned lead_bytes) {
    const unsigned long long addr = smem_u32(tile);
    return ((addr & 0x3FFFF) >> 4) | ((unsigned long long)((lead_bytes >> 4) & 0x3FFF) << 16) |
           ((unsigned long long)(1024 >> 4) << 32) | (1ull << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Wait until at most N committed groups of this warpgroup are still running.
template <int N> __device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" :: "n"(N) : "memory");
}
// Keep the compiler from moving reads or writes of accumulator registers across a wgmma
// issue or wait: it does not know that the tensor core writes them in the background.
template <int N> __device__ __forceinline__ void fence_registers(float (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i]) :: "memory");
}
template <int N> __device__ __forceinline__ void fence_registers(unsigned (&r)[N][4]) {
#pragma unroll
    for (int i = 0; i < N; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(r[i][j]) :: "memory");
}

#ifdef ELEM_BF16
#define WGMMA_TYPES ".f32.bf16.bf16"
#else
#define WGMMA_TYPES ".f32.f16.f16"
#endif
#define WG_R32 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, " \
               "%17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define WG_R64 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, " \
               "%17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, " \
               "%33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, " \
               "%49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define WG_R88 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, " \
               "%17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, " \
               "%33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, " \
               "%49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, " \
               "%65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, " \
               "%81, %82, %83, %84, %85, %86, %87}"
#define WG_F4(d, i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3])
#define WG_F16(d, i) WG_F4(d, i), WG_F4(d, i + 4), WG_F4(d, i + 8), WG_F4(d, i + 12)
#define WG_F32(d) WG_F16(d, 0), WG_F16(d, 16)
#define WG_F64(d) WG_F16(d, 0), WG_F16(d, 16), WG_F16(d, 32), WG_F16(d, 48)
#define WG_F88(d) WG_F64(d), WG_F16(d, 64), WG_F4(d, 80), WG_F4(d, 84)
#define WG_R48 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18,  " \
               "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35,  " \
               "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}"
#define WG_R128 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18,  " \
               "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35,  " \
               "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52,  " \
               "%53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69,  " \
               "%70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86,  " \
               "%87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102,  " \
               "%103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116,  " \
               "%117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}"
#define WG_F48(d) WG_F32(d), WG_F16(d, 32)
#define WG_F128(d) WG_F64(d), WG_F16(d, 64), WG_F16(d, 80), WG_F16(d, 96), WG_F16(d, 112)

// d[64×N] (+)= A[64×16] · B[16×N] for one k-step of 16, fp32 accumulators, N/2 per thread:
// thread t of warp w holds rows 16w + t/4 and 16w + t/4 + 8, columns 8j + 2(t%4) and +1 of
// each 8-column slice j (the mma.sync m16n8 layout, repeated along N).
//   ss: A and B from shared memory, both K-major (S = Q·Kᵀ);
//   rs: A from registers (the mma.sync m16n8k16 A-fragment layout: P straight from the
//       softmax), B from shared memory MN-major (V, transposed by the tensor core).
// `accumulate` = 0 overwrites d (the first k-step of S); rs's trailing 1 is the transpose bit.
template <int N> struct Wgmma;
template <> struct Wgmma<64> {
    static __device__ __forceinline__ void ss(float (&d)[32], unsigned long long a, unsigned long long b, int accumulate) {
        asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %34, 0;\n"
                     " wgmma.mma_async.sync.aligned.m64n64k16" WGMMA_TYPES " " WG_R32 ", %32, %33, p, 1, 1, 0, 0;\n}\n"
                     : WG_F32(d) : "l"(a), "l"(b), "r"(accumulate));
    }
    static __device__ __forceinline__ void rs(float (&d)[32], const unsigned (&a)[4], unsigned long long b, int accumulate) {
        asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %37, 0;\n"
                     " wgmma.mma_async.sync.aligned.m64n64k16" WGMMA_TYPES " " WG_R32
                     ", {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
                     : WG_F32(d) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
    }
};
template <> struct Wgmma<128> {
    static __device__ __forceinline__ void ss(float (&d)[64], unsigned long long a, unsigned long long b, int accumulate) {
        asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %66, 0;\n"
                     " wgmma.mma_async.sync.aligned.m64n128k16" WGMMA_TYPES " " WG_R64 ", %64, %65, p, 1, 1, 0, 0;\n}\n"
                     : WG_F64(d) : "l"(a), "l"(b), "r"(accumulate));
    }
    static __device__ __forceinline__ void rs(float (&d)[64], const unsigned (&a)[4], unsigned long long b, int accumulate) {
        asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %69, 0;\n"
                     " wgmma.mma_async.sync.aligned.m64n128k16" WGMMA_TYPES " " WG_R64
                     ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
                     : WG_F64(d) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
    }
};
template <> struct Wgmma<176> {  // S only (a key tile of 176): 88 accumulators per thread
    static __device__ __forceinline__ void ss(float (&d)[88], unsigned long long a, unsigned long long b, int accumulate) {
        asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %90, 0;\n"
                     " wgmma.mma_async.sync.aligned.m64n176k16" WGMMA_TYPES " " WG_R88 ", %88, %89, p, 1, 1, 0, 0;\n}\n"
                     : WG_F88(d) : "l"(a), "l"(b), "r"(accumulate));
    }
};
// O only, head dims 96 and 256 (stage 6's P·V, N = the head dim): 48 and 128 accumulators per thread.
template <> struct Wgmma<96> {
    static __device__ __forceinline__ void rs(float (&d)[48], const unsigned (&a)[4], unsigned long long b, int accumulate) {
        asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %53, 0;\n"
                     " wgmma.mma_async.sync.aligned.m64n96k16" WGMMA_TYPES " " WG_R48
                     ", {%48, %49, %50, %51}, %52, p, 1, 1, 1;\n}\n"
                     : WG_F48(d) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
    }
};
template <> struct Wgmma<256> {
    static __device__ __forceinline__ void rs(float (&d)[128], const unsigned (&a)[4], unsigned long long b, int accumulate) {
        asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %133, 0;\n"
                     " wgmma.mma_async.sync.aligned.m64n256k16" WGMMA_TYPES " " WG_R128
                     ", {%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"
                     : WG_F128(d) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
    }
};

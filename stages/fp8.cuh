// FP8 (e4m3) pieces for Hopper, shared by issue 25's probes (experiments/fp8_tile_probe/fp8_tile_probe.cu,
// experiments/fp8_loop_probe/fp8_loop_probe.cu) and, later, stage 7: the 128-byte swizzle of one e4m3 row of 128,
// wgmma m64nNk32 e4m3 with both operands in shared memory (ss) or A from registers (rs), for
// N = 64 (32 accumulators per thread) and N = 128 (64), rs also for N = 72 and 136 (P·V with a
// column of ones), ss also for the wider key tiles of N = 160, 192 and 224, and the float → e4m3
// pair conversion.
#pragma once
#include "hopper.cuh"
#include <cuda_fp8.h>

typedef unsigned char u8;

// Byte offset of (row, byte c) in a tile of 128-byte rows with the 128-byte swizzle.
__device__ __forceinline__ int sw128(int row, int c) { return row * 128 + (((c / 16) ^ (row % 8)) * 16) + c % 16; }

__device__ __forceinline__ void wgmma_e4m3_ss(float (&d)[32], unsigned long long a, unsigned long long b, int acc) {
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %34, 0;\n"
                 " wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 " WG_R32 ", %32, %33, p, 1, 1;\n}\n"
                 : WG_F32(d) : "l"(a), "l"(b), "r"(acc));
}
__device__ __forceinline__ void wgmma_e4m3_rs(float (&d)[32], const unsigned (&a)[4], unsigned long long b, int acc) {
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %37, 0;\n"
                 " wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 " WG_R32
                 ", {%32, %33, %34, %35}, %36, p, 1, 1;\n}\n"
                 : WG_F32(d) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(acc));
}
__device__ __forceinline__ void wgmma_e4m3_ss(float (&d)[64], unsigned long long a, unsigned long long b, int acc) {
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %66, 0;\n"
                 " wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 " WG_R64 ", %64, %65, p, 1, 1;\n}\n"
                 : WG_F64(d) : "l"(a), "l"(b), "r"(acc));
}
__device__ __forceinline__ void wgmma_e4m3_rs(float (&d)[64], const unsigned (&a)[4], unsigned long long b, int acc) {
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %69, 0;\n"
                 " wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 " WG_R64
                 ", {%64, %65, %66, %67}, %68, p, 1, 1;\n}\n"
                 : WG_F64(d) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(acc));
}
// O += P·V with one more 8-column slice (stage 7's ROW_SUM_MMA: a column of ones beside V gives
// each row's sum of P in the products): N = 72 at D64 (36 accumulators), 136 at D128 (68).
#define WG_R36 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, " \
               "%17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35}"
#define WG_R68 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, " \
               "%17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, " \
               "%33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, " \
               "%49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67}"
__device__ __forceinline__ void wgmma_e4m3_rs(float (&d)[36], const unsigned (&a)[4], unsigned long long b, int acc) {
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %41, 0;\n"
                 " wgmma.mma_async.sync.aligned.m64n72k32.f32.e4m3.e4m3 " WG_R36
                 ", {%36, %37, %38, %39}, %40, p, 1, 1;\n}\n"
                 : WG_F32(d), WG_F4(d, 32) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(acc));
}
__device__ __forceinline__ void wgmma_e4m3_rs(float (&d)[68], const unsigned (&a)[4], unsigned long long b, int acc) {
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %73, 0;\n"
                 " wgmma.mma_async.sync.aligned.m64n136k32.f32.e4m3.e4m3 " WG_R68
                 ", {%68, %69, %70, %71}, %72, p, 1, 1;\n}\n"
                 : WG_F64(d), WG_F4(d, 64) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(acc));
}
// S = Q·Kᵀ over wider key tiles (BLOCK_N 160, 192, 224: FlashAttention-3's FP8 tiles are
// 160 keys at D64 and 224 at D128): 80, 96 and 112 accumulators per thread, both operands
// from shared memory.
#define WG_R80 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
               "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
               "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
               "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
               "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79}"
#define WG_R96 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
               "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
               "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
               "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
               "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
               "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95}"
#define WG_R112 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
               "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
               "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
               "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
               "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
               "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
               "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111}"
#define WG_F80(d) WG_F64(d), WG_F16(d, 64)
#define WG_F96(d) WG_F64(d), WG_F16(d, 64), WG_F16(d, 80)
#define WG_F112(d) WG_F64(d), WG_F16(d, 64), WG_F16(d, 80), WG_F16(d, 96)
__device__ __forceinline__ void wgmma_e4m3_ss(float (&d)[80], unsigned long long a, unsigned long long b, int acc) {
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %82, 0;\n"
                 " wgmma.mma_async.sync.aligned.m64n160k32.f32.e4m3.e4m3 " WG_R80 ", %80, %81, p, 1, 1;\n}\n"
                 : WG_F80(d) : "l"(a), "l"(b), "r"(acc));
}
__device__ __forceinline__ void wgmma_e4m3_ss(float (&d)[96], unsigned long long a, unsigned long long b, int acc) {
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %98, 0;\n"
                 " wgmma.mma_async.sync.aligned.m64n192k32.f32.e4m3.e4m3 " WG_R96 ", %96, %97, p, 1, 1;\n}\n"
                 : WG_F96(d) : "l"(a), "l"(b), "r"(acc));
}
__device__ __forceinline__ void wgmma_e4m3_ss(float (&d)[112], unsigned long long a, unsigned long long b, int acc) {
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %114, 0;\n"
                 " wgmma.mma_async.sync.aligned.m64n224k32.f32.e4m3.e4m3 " WG_R112 ", %112, %113, p, 1, 1;\n}\n"
                 : WG_F112(d) : "l"(a), "l"(b), "r"(acc));
}
// Two floats → two e4m3 bytes, the first in the low byte (round to nearest, saturating).
__device__ __forceinline__ unsigned to_e4m3x2(float lo, float hi) {
    return __nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE, __NV_E4M3);
}

// Shared by the CUDA C++ stages (1 and up): the element type, conversions, and the one
// bounds-checked copy of a tile from global to shared memory. Kernel logic stays in each
// stage's own .cu file.
//
// Compile-time constants, set by lib.nvrtc.compile_stage:
//   HEAD_DIM   the head dimension D (64 or 128)
//   ELEM_BF16  defined for bfloat16 inputs; otherwise float16
//
// What every kernel is told about its inputs, the same way in every stage:
//   Layouts. q [B, H, Sq, D], k and v [B, H_kv, Sk, D] are read where they lie, with any
//     strides whose last dimension is unit-stride (a model's .transpose(1, 2) view of a
//     [B, S, H, D] tensor, a slice of heads ...): each comes with its batch and head strides
//     (64-bit: a tensor may hold more than 2^31 elements) and its row (sequence) stride, all in
//     elements. The output is a fresh contiguous [B, H, Sq, D] tensor.
//   Grouped-query attention: H_kv = H / group heads of K/V; query head h reads K/V head h / group.
//   Packed rows. When every row stride is D (any contiguous [B, H, S, D] tensor, and slices of
//     its batches or heads), the launcher compiles the kernel with ROWS_PACKED defined: each
//     kernel then replaces its row-stride arguments by the constant D (row_stride below), so the
//     compiler folds every row step of a copy into the load's immediate offset, as it could
//     before strides were arguments. Other layouts run the build with run-time row strides.
//   The grid. gridDim.y and gridDim.z stop at 65535 blocks, gridDim.x at 2^31 − 1, so (batch,
//     head) is folded into blockIdx.x with the tile index: blockIdx.x counts the tiles of
//     (batch 0, head 0), then those of (0, 1), and so on (bh = b·H + h). Neighbouring blocks are
//     neighbouring tiles of one head, reading the same K and V, as with a 2-D grid.
#pragma once
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <mma.h>

#ifndef HEAD_DIM
#error "HEAD_DIM must be defined (lib.nvrtc.compile_stage does it)"
#endif

#ifdef ELEM_BF16
typedef __nv_bfloat16 elem_t;
#else
typedef __half elem_t;
#endif

__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ elem_t to_elem(float x) {
#ifdef ELEM_BF16
    return __float2bfloat16(x);
#else
    return __float2half(x);
#endif
}

#ifdef ROWS_PACKED
constexpr bool ROWS_ARE_PACKED = true;
#else
constexpr bool ROWS_ARE_PACKED = false;
#endif
// The row stride a kernel uses: the constant D in a packed build, the argument otherwise.
__device__ __forceinline__ int row_stride(int given) { return ROWS_ARE_PACKED ? HEAD_DIM : given; }

// exp(x) = 2^(x·log2 e): the kernels fold log2(e) into the scale once and call exp2f, which
// compiles to one MUFU.EX2 plus a three-instruction range fix-up (stage 5 drops the fix-up).
#define LOG2E 1.4426950408889634f
// NVRTC has no <cmath>: the masked score, −∞, from the bit pattern.
#define NEG_INF __int_as_float(0xff800000)

// Copy the ROWS × COLS tile whose top-left element is (row0, col0) of a row-major matrix with
// n_rows rows and row stride ld into dst[ROWS][LD_DST] (shared memory, row-major; LD_DST >
// COLS pads each row, see stage 2). Rows at or past n_rows are filled with zeros: that is how
// every stage masks the tail of a sequence that is not a multiple of its tile.
//
// The block's THREADS threads take one element each per step, so consecutive threads read
// consecutive addresses (coalesced). Step j moves element tid + j·THREADS: its row and
// column are the thread's own (computed once) plus offsets of j alone, so a step costs a few
// adds, a compare, a load and a store rather than a division.
// Each thread first issues up to MAX_IN_FLIGHT loads (4 unless the stage asks for more), then
// stores them: several loads in flight per thread, not 1, hide the few hundred cycles a load
// from L2 takes.
template <int ROWS, int COLS, int THREADS, int LD_DST = COLS, int MAX_IN_FLIGHT = 4>
__device__ __forceinline__ void load_tile(elem_t* dst, const elem_t* __restrict__ src, int row0,
                                          int n_rows, int ld, int col0) {
    constexpr int PER_THREAD = ROWS * COLS / THREADS;
    constexpr int BATCH = PER_THREAD < MAX_IN_FLIGHT ? PER_THREAD : MAX_IN_FLIGHT;
    static_assert(ROWS * COLS % THREADS == 0 && PER_THREAD % BATCH == 0, "tile and block sizes");
    static_assert(THREADS % COLS == 0 || COLS % THREADS == 0, "powers of two");
    // Where this thread starts; step j adds j·THREADS elements = (dr rows, dc columns).
    const int r_t = THREADS >= COLS ? threadIdx.x / COLS : 0;
    const int c_t = THREADS >= COLS ? threadIdx.x % COLS : threadIdx.x;
    const elem_t* from = src + (size_t)(row0 + r_t) * ld + col0 + c_t;
    elem_t* to = dst + r_t * LD_DST + c_t;
    const int rows_left = n_rows - row0 - r_t;  // rows r_t + dr with dr >= rows_left are past the end
    const elem_t zero = to_elem(0.0f);
    // In a packed build (ROWS_PACKED, above) ld is the constant D: every step's offset dr·ld is
    // known at compile time and the copy is simply unrolled. Otherwise ld is a kernel argument,
    // so the offset of each step is the same in every call: left alone, the compiler computes
    // them all once, before the caller's loop over tiles, and keeps them in registers (64 for a
    // 32 × 128 tile on 64 threads: spills). A copy of many batches (stages 2 and 3) therefore
    // loops over them; one of one or two batches (stages 1 and 4) is unrolled, and steps from
    // row to row by adding ld to a pointer that an empty asm statement "changes", so that
    // nothing can be computed ahead.
    constexpr bool UNROLL = ROWS_ARE_PACKED || PER_THREAD / BATCH <= 2;
    constexpr bool LAUNDER = UNROLL && !ROWS_ARE_PACKED;
#pragma unroll(UNROLL ? PER_THREAD / BATCH : 1)
    for (int b = 0; b < PER_THREAD; b += BATCH) {
        elem_t x[BATCH];
#pragma unroll
        for (int j = 0; j < BATCH; ++j) {
            const int step = (b + j) * THREADS, dr = step / COLS, dc = step % COLS;
            if constexpr (LAUNDER) {
                const int prev_dr = step == 0 ? 0 : (step - THREADS) / COLS;
                if (dr != prev_dr) {  // on to row r_t + dr (all known at compile time)
                    from += (size_t)(dr - prev_dr) * ld;
                    asm volatile("" : "+l"(from));
                }
                x[j] = dr < rows_left ? from[dc] : zero;
            } else {
                x[j] = dr < rows_left ? from[(size_t)dr * ld + dc] : zero;
            }
        }
#pragma unroll
        for (int j = 0; j < BATCH; ++j) {
            const int step = (b + j) * THREADS, dr = step / COLS, dc = step % COLS;
            to[dr * LD_DST + dc] = x[j];
        }
    }
}

// Causal attention: the kernels' `causal` is 0 (none), 1 (top-left, SDPA's is_causal: query i
// sees keys j <= i, also when Sq != Sk) or 2 (bottom-right, causal_lower_right: the queries are
// the last Sq key positions, so query i sees keys j <= i + Sk − Sq). Both are "key j <= query i
// + diag"; the kernels shift the query by diag before asking key_visible. A row that sees no
// key at all (bottom-right, Sq > Sk) ends with l = 0 and is written as zeros (inv_sum), as SDPA
// writes it.
__device__ __forceinline__ int causal_diagonal(int causal, int Sq, int Sk) { return causal == 2 ? Sk - Sq : 0; }
__device__ __forceinline__ bool key_visible(int key, int query, int n_keys, bool causal) {
    return key < n_keys && (!causal || key <= query);
}
__device__ __forceinline__ float inv_sum(float l) { return l > 0.0f ? 1.0f / l : 0.0f; }

// A WMMA operand fragment (m16n16k16, matrix_a or matrix_b, either layout) loaded from shared
// memory: wmma::load_matrix_sync, except that in bfloat16 the PTX instruction names its state
// space. NVRTC turns mma.h's bf16 loads into wmma.load ... .bf16 on a *generic* address, while
// it gives the fp16 ones .shared; without .shared ptxas cannot use ldmatrix (LDSM) and loads
// each fragment as four generic 32-bit loads (LD.E), plus register transposes (MOVM) for the
// layouts ldmatrix would have transposed. Issued with .shared, a bf16 fragment compiles to one
// LDSM as in fp16. Same instruction, same registers: only where the address points is said.
// Defining BF16_GENERIC_FRAGMENT_LOADS restores mma.h's loads (the stage 3 notebook compiles
// both to show the difference).
namespace frag_detail {
template <class A, class B> struct same { static constexpr bool value = false; };
template <class A> struct same<A, A> { static constexpr bool value = true; };
}  // namespace frag_detail

template <class Use, class Layout>
__device__ __forceinline__ void load_fragment(
        nvcuda::wmma::fragment<Use, 16, 16, 16, elem_t, Layout>& f, const elem_t* p, unsigned ld) {
#if defined(ELEM_BF16) && !defined(BF16_GENERIC_FRAGMENT_LOADS)
    using namespace nvcuda::wmma;
    static_assert(sizeof(f.x) == 16, "an m16n16k16 bf16 operand fragment is four 32-bit registers");
    unsigned* x = reinterpret_cast<unsigned*>(&f.x[0]);
    const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
    constexpr bool is_a = frag_detail::same<Use, matrix_a>::value;
    constexpr bool row = frag_detail::same<Layout, row_major>::value;
#define FRAG_LOAD(OP)                                                                      \
    asm volatile(OP " {%0, %1, %2, %3}, [%4], %5;"                                        \
                 : "=r"(x[0]), "=r"(x[1]), "=r"(x[2]), "=r"(x[3]) : "r"(a), "r"(ld) : "memory")
    if constexpr (is_a && row) FRAG_LOAD("wmma.load.a.sync.aligned.row.m16n16k16.shared.bf16");
    else if constexpr (is_a) FRAG_LOAD("wmma.load.a.sync.aligned.col.m16n16k16.shared.bf16");
    else if constexpr (row) FRAG_LOAD("wmma.load.b.sync.aligned.row.m16n16k16.shared.bf16");
    else FRAG_LOAD("wmma.load.b.sync.aligned.col.m16n16k16.shared.bf16");
#undef FRAG_LOAD
#else
    nvcuda::wmma::load_matrix_sync(f, p, ld);
#endif
}

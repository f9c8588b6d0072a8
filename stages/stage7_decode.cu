// Decoding from an e4m3 KV cache, FP8's own path (issue 50 item 2; stages/stage7_decode.py).
//
// Decoding multiplies every cached key and value by a few query rows (a K/V head's G·Sq), so its
// time is the cache's bytes over the memory bandwidth, and e4m3 halves them. Stage 6's KV_FP8
// build widens each e4m3 tile into a 16-bit tile in shared memory for its wgmma consumers: the
// bytes go DRAM → shared → registers → shared → tensor cores, and three warps a block widen
// (2.5–2.6 TB/s of e4m3 at best, experiments/fp8_kv_decode). Here nothing 16-bit is ever stored:
//
//   - each warp copies its own chunks of K and V (CHUNK keys) into a ring of STAGES chunks in
//     shared memory with cp.async, whole 128-byte lines at a time (no barrier between warps: a
//     warp runs its own pipeline);
//   - a thread widens its bytes in registers straight into the operands of m16n8k16 products
//     (mma.sync, 16-bit inputs, fp32 accumulators): one cvt per two values into fp16 products
//     (fp16 Q, and bf16 Q with F16_PRODUCTS, the launcher's default), or a prmt, a shift and a
//     mask per two into bf16 products;
//   - the products are arranged so that no operand needs a transpose. S = Q·Kᵀ takes Q (16 query
//     rows, G·Sq ≤ 16 of them real) as the A operand and K as B, whose fragment holds, per
//     thread, four head-dim positions of one key: four consecutive bytes once the head dim is
//     read in a permuted order (Q is loaded in the same order, so the dot products are the
//     same). O = P·V takes P from S's accumulators as the A operand (the FlashAttention-2
//     register reuse) and V as B, whose fragment holds two pairs of keys for one column:
//     thread (g, c) reads four consecutive keys 4c … 4c + 3 (the keys of S's columns are
//     numbered so that they are), and a prmt that picks byte u of two keys' words is both the
//     transpose and the first step of the widening.
//
// The grid: one block per (split, batch entry, K/V head), WARPS warps; warp w takes chunks w,
// w + WARPS, ... of its split's keys, with its own running max, sum and output; the block's
// warps are merged through shared memory at the end. One split: the block writes the output.
// Several: each has its rows' output normalized and their log-sum-exp (log2); the splits of a
// (batch entry, K/V head) launched as one cluster (CLUSTER_MERGE, 2-8 splits) merge them through
// distributed shared memory, otherwise the last of its blocks to finish merges them from global
// memory. Either way a call is one launch.
//
// Compile-time constants: HEAD_DIM (64, 128), ELEM_BF16 (bf16 Q and output, else fp16), CHUNK
// (keys a warp takes at a time: 16 or 32), STAGES (chunks in a warp's ring), WARPS, QROWS (8 or
// 16 query rows held), MIN_BLOCKS (launch bounds), F16_PRODUCTS (bf16 Q: fp16 products),
// CLUSTER_MERGE and CLUSTER_MAX, PACKED_ROWS (chosen from the cache's strides), and the switches
// IDLE_ACCUMULATORS, WHOLE_CHUNK_COPIES, SPLIT_S_CHAIN, EVICT_FIRST, PREFETCH_256 (each explained where it is defined;
// stages/stage7_decode.py's SWITCHES).
#include "attention.cuh"
#include "mma.cuh"

#ifndef CHUNK
#define CHUNK 32
#endif
#ifndef STAGES
#define STAGES 3
#endif
#ifndef WARPS
#define WARPS 4
#endif
constexpr int D = HEAD_DIM;
static_assert(D == 64 || D == 128, "e4m3 decoding is built at D 64 and 128");
static_assert(CHUNK == 16 || CHUNK == 32, "a chunk is one or two k-steps of P·V");
static_assert(STAGES >= 2 && STAGES <= 8, "ring depth");
constexpr int ROWS = 16;           // query rows per K/V head: one m16 tile (G·Sq ≤ 16 real)
// QROWS 8: a build for G·Sq ≤ 8, which leaves the m16 tile's rows 8-15 out of every register (a
// lane keeps row g only: half the accumulators, so more warps fit an SM); 16: both halves.
#ifndef QROWS
#define QROWS 16
#endif
#ifndef MIN_BLOCKS
#define MIN_BLOCKS 1  // blocks an SM must hold (launch bounds: the registers a thread may take)
#endif
constexpr int HALVES = QROWS / 8;  // rows g (and g + 8) of a lane
// F16_PRODUCTS (bf16 Q): the products in fp16 all the same. Each query row is scaled by a power of
// two that puts its largest magnitude in [2^14, 2^15) and rounded to fp16, which holds bf16's 8
// bits of mantissa exactly (fp16 has 11) down to 2^-14 of the scaled row's largest element; the
// scores take the power of two back. K and V then widen with one cvt per two values, as the
// fp16 build's do, instead of the bit placement below (a prmt, a shift and a mask per two
// values), and P goes to the tensor cores in fp16 (finer than bf16 on [2^-14, 1]).
#if !defined(ELEM_BF16) || (defined(F16_PRODUCTS) && F16_PRODUCTS)
#define PRODUCTS_F16 1
#else
#define PRODUCTS_F16 0
#endif
static_assert(QROWS == 8 || QROWS == 16, "QROWS");
constexpr int KSTEPS = D / 16;     // k-steps of S = Q·Kᵀ; thread c holds 4 bytes of each: word j
constexpr int KPIECES = D / 64;    // 16-byte pieces of a key row per thread (D128: 2, D64: 1)
constexpr int NTILES = D / 8;      // n-tiles of O = P·V (8 head-dim columns each)
constexpr int VBYTES = D / 8;      // bytes of a value row per thread: column g·VBYTES + u is n-tile u's
constexpr int STILES = CHUNK / 8;  // n-tiles of S per chunk (8 keys each)
constexpr int PSTEPS = CHUNK / 16; // k-steps of P·V per chunk
// A warp's ring: per chunk, CHUNK rows of K then CHUNK rows of V, as they lie in memory, in
// 128-byte lines (one row at D128, two at D64) whose 16-byte units are swizzled (swizzled):
//   - copies: each instruction of the warp copies 4 whole lines, 8 lanes a line, 16 bytes a lane,
//     so that every 8 lanes read 128 contiguous bytes of the cache. (A first form had each lane
//     copy the bytes it reads back; Nsight Compute found V's copies asking L2 for every sector
//     twice, L2 at 91% of its throughput where DRAM was at 65%: experiments/fp8_decode_registers.)
//   - reads: a lane's 16 (8) bytes of K or V as the fragments want them, no bank conflicts: the
//     swizzle puts the 8 lanes of a quarter warp (two keys of S's fragment; four value rows of
//     P·V's) on 8 different 16-byte units (at D64 the 16 lanes of a half warp on 16 8-byte ones).
// Lanes read bytes other lanes copied, so the warp meets at a __syncwarp after its copies land and
// before it overwrites a slot.
constexpr int LINE_ROWS = 128 / D;
constexpr int CHUNK_BYTES = 2 * CHUNK * D;
constexpr int COPIES = CHUNK * D / 512;  // copy instructions per chunk for K (and as many for V)
constexpr int RING_BYTES = WARPS * STAGES * CHUNK_BYTES;
constexpr int MERGE_STRIDE = D + 4;  // floats a row takes in the warps' merge (D + D/32 used)
// The byte of row `row`, column `col` (a multiple of 8) in a chunk's K or V.
__device__ __forceinline__ int swizzled(int row, int col) {
    const int swz = 2 * ((row >> 2) & 3) ^ (D == 128 ? 4 * (row & 1) : 0);  // in 16-byte units
    const int unit = ((row % LINE_ROWS) * D + col) / 16;
    return (row / LINE_ROWS) * 128 + 16 * (unit ^ swz) + col % 16;
}

// Word j of a key row that thread c reads: bytes (j / 4)·64 + 16c + 4(j % 4) … + 3, the head-dim
// columns 2c, 2c + 1, 2c + 8, 2c + 9 of k-step j as S's B fragment numbers them. A warp's
// 16-byte reads of one piece cover 64 contiguous bytes of each of 8 keys.
__device__ __forceinline__ int key_word_col(int j, int c) { return (j / 4) * 64 + 16 * c + 4 * (j % 4); }
// The key (within a chunk) of S's n-tile t, column n: 16(t/2) + 4(n/2) + 2(t%2) + n%2. Then P·V's
// k-step s gives thread (g, c) the keys 16s + 4c … 16s + 4c + 3 (its B fragment's rows 2c, 2c+1
// and 2c+8, 2c+9): four consecutive value rows.
__device__ __forceinline__ int key_of(int t, int n) { return 16 * (t / 2) + 4 * (n / 2) + 2 * (t % 2) + (n % 2); }

// Two e4m3 bytes to two 16-bit values: bytes `sel`'s picks of (lo, hi) (prmt's selector; the
// sign-replicating nibbles 8-B copy each byte's sign through the high half of its lane).
// bf16: the shift by 4 and the mask put eeee mmm under bf16's exponent and mantissa and keep one
// copy of the sign in bit 15: the bf16 of value·2^-120, exactly, subnormals too (stage 6's
// widen4, stages/stage6.cu); FOLD leaves the 2^-120 for the descales, otherwise one bf16x2
// multiply by 2^120 gives the value. fp16: cvt from e4m3, exact.
// prmt selectors: bytes b, b + 1 of one word (a key's two head-dim columns), each with its sign
// in the next byte (bf16), or byte b of two words (two keys' values of one column).
template <int B> constexpr unsigned SAME_WORD = (0x8u | (B + 1)) << 12 | (B + 1) << 8 | (0x8u | B) << 4 | B;
template <int B> constexpr unsigned TWO_WORDS = (0x8u | (B + 4)) << 12 | (B + 4) << 8 | (0x8u | B) << 4 | B;
template <unsigned SEL, bool FOLD>
__device__ __forceinline__ unsigned widen2(unsigned lo, unsigned hi) {
#if !PRODUCTS_F16
    unsigned x;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(x) : "r"(lo), "r"(hi), "n"(SEL));
    x = (x << 4) & 0x87F087F0u;
    if (!FOLD) asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(x) : "r"(x), "r"(0x7B807B80u));
    return x;
#else
    unsigned x = lo, r;
    if constexpr (SEL == SAME_WORD<2>) {  // a word's high half as it is
        asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %1;\n cvt.rn.f16x2.e4m3x2 %0, h;\n}\n" : "=r"(r) : "r"(x));
        return r;
    }
    if constexpr (SEL != SAME_WORD<0>)  // the two bytes alone, in the low half: SEL's first and third nibbles
        asm("prmt.b32 %0, %1, %2, %3;" : "=r"(x) : "r"(lo), "r"(hi), "n"(((SEL >> 4) & 0xF0u) | (SEL & 0xFu)));
    asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %1;\n cvt.rn.f16x2.e4m3x2 %0, l;\n}\n" : "=r"(r) : "r"(x));
    return r;
#endif
}

// 2^120, what a folded widening leaves out of each bf16 value (fp16: nothing)
#define WIDEN_FOLD __int_as_float(0x7B800000)
// Whether a block's bf16 widening leaves 2^120 to its descales: where the key's descale times the
// call's scale (log2 units) and the value's descale are below 2^7 in magnitude, so that neither
// product nears float's 2^128 (stage 6's rule, `folds` in stages/stage6.cu).
__device__ __forceinline__ bool folds(float scale_log2, float kd, float vd) {
#if !PRODUCTS_F16
    return fabsf(scale_log2 * kd) < 128.0f && fabsf(vd) < 128.0f;
#else
    (void)scale_log2, (void)kd, (void)vd;
    return false;
#endif
}

// Two probabilities in one register, in the products' type: Q's (mma.cuh's pack2), or fp16 where
// bf16 Q's products run in fp16.
__device__ __forceinline__ unsigned pack_p(float lo, float hi) {
#if PRODUCTS_F16 && defined(ELEM_BF16)
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<unsigned*>(&h);
#else
    return pack2(lo, hi);
#endif
}

struct Args {
    const elem_t* q;
    const unsigned char* k;
    const unsigned char* v;
    const float* k_descale;  // [B, H_kv]
    const float* v_descale;
    const int* seqlens_k;    // [B] or null (every key)
    elem_t* out;             // [B, H, Sq, D], contiguous
    float* part_o;           // [B·H_kv, splits, ROWS, D] (splits > 1)
    float* part_lse;         // [B·H_kv, splits, ROWS], log2
    int* counts;             // [B·H_kv] blocks done (splits > 1), zero between launches
    long long q_sb, q_sh, q_sr;
    long long k_sb, k_sh, k_sr;
    long long v_sb, v_sh, v_sr;
    int H, Hk, Sq, Sk, splits, causal;  // causal: 0 none, 1 top-left, 2 bottom-right
    float scale_log2;        // softmax scale · log2 e
};

// IDLE_ACCUMULATORS (the QROWS 8 build): rows 8-15's two accumulators of every product stay in
// registers that are never read, instead of being thrown away. An m16n8k16 takes its four
// accumulators in four consecutive registers, so thrown-away ones must be zeroed before each
// product (a CS2R before each of a chunk's 64 mma: 59 of its 723 instructions, SASS); kept ones
// cost 2 registers per accumulator tile (40 a thread at D128; the build has room at 8 warps an SM).
#ifndef IDLE_ACCUMULATORS
#define IDLE_ACCUMULATORS 1
#endif
constexpr int ACC = (HALVES == 2 || IDLE_ACCUMULATORS) ? 4 : 2;  // accumulators a lane keeps per tile

// A warp's running softmax state and output: rows g (and g + 8) of its lane (o[u][e], e < 2·HALVES;
// the rest idle).
struct RowState {
    float m[HALVES], l[HALVES];
    float o[NTILES][ACC];
};

// c += a·b (m16n8k16, fp32 accumulators) on a lane's HALVES: with one half, rows 8-15 of A are
// zero, and their two accumulators (c[2], c[3]) are idle registers (IDLE_ACCUMULATORS) or
// outputs no one reads.
__device__ __forceinline__ void mma_rows(float (&c)[ACC], const unsigned (&a)[4], unsigned b0, unsigned b1) {
#if !PRODUCTS_F16
#define MMA_TYPES "f32.bf16.bf16.f32"
#else
#define MMA_TYPES "f32.f16.f16.f32"
#endif
    if constexpr (ACC == 4) {
        const unsigned a1 = HALVES == 2 ? a[1] : 0u, a3 = HALVES == 2 ? a[3] : 0u;
        asm("mma.sync.aligned.m16n8k16.row.col." MMA_TYPES " {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%0, %1, %2, %3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a1), "r"(a[2]), "r"(a3), "r"(b0), "r"(b1));
    } else {
        float d2, d3;
        asm("mma.sync.aligned.m16n8k16.row.col." MMA_TYPES " {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%0, %1, %10, %10};\n"
            : "+f"(c[0]), "+f"(c[1]), "=f"(d2), "=f"(d3)
            : "r"(a[0]), "r"(0u), "r"(a[2]), "r"(0u), "r"(b0), "r"(b1), "f"(0.0f));
    }
#undef MMA_TYPES
}

// WHOLE_CHUNK_COPIES: a chunk whose keys all lie before `keys` (every chunk but a cache's last) is
// copied without a bound check per copy (the SEL of its source and size and the ISETP before each
// cp.async: 32 + 8 of a chunk's instructions, SASS).
#ifndef WHOLE_CHUNK_COPIES
#define WHOLE_CHUNK_COPIES 1
#endif
// (`at`: a shared-space address, such as a register plus a constant, which ptxas folds into the
// instruction)
// EVICT_FIRST: the cache's copies carry an L2 eviction hint (an evict_first policy, made once by
// createpolicy): each line of K and V is read once, so a set of L2 gives up those lines before the
// lines other kernels left there. A decoding step follows kernels that leave L2 full of dirty lines
// (the timing's flush does too, experiments/l2_flush_writeback); without the hint the cache's reads
// evict them all, and their write-back to memory shares the read's bandwidth.
// The copies of a chunk that the cache's end cuts (a cache's last, src-size 0 past it) go without
// the hint: with it (.L2::cache_hint and a src-size in one cp.async) some builds raised "illegal
// instruction" on such caches and others did not (H200, NVRTC 13.0; experiments/fp8_decode_evict_first).
// PREFETCH_256: the copies ask L2 to fetch 256 bytes around each line (cp.async's .L2::256B), two
// of a chunk's 128-byte rows at once.
#ifndef EVICT_FIRST
#define EVICT_FIRST 0
#endif
#ifndef PREFETCH_256
#define PREFETCH_256 0
#endif
#if PREFETCH_256
#define CP_ASYNC_CG "cp.async.cg.shared.global.L2::256B"
#else
#define CP_ASYNC_CG "cp.async.cg.shared.global"
#endif
__device__ __forceinline__ unsigned long long stream_policy() {
    unsigned long long p;  // not volatile: the compiler makes it once
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(p));
    return p;
}
__device__ __forceinline__ void cp_async_16_at(unsigned at, const void* src) {
#if EVICT_FIRST
    asm volatile(CP_ASYNC_CG ".L2::cache_hint [%0], [%1], 16, %2;\n" :: "r"(at), "l"(src), "l"(stream_policy()));
#else
    asm volatile(CP_ASYNC_CG " [%0], [%1], 16;\n" :: "r"(at), "l"(src));
#endif
}
__device__ __forceinline__ void cp_async_16_whole(void* dst, const void* src) { cp_async_16_at(smem_addr(dst), src); }

// CLUSTER_MERGE: a build launched with the splits of each work tile as one thread-block cluster
// (splits ≤ 8, the portable cluster size), which merges them through distributed shared memory
// instead of the last block to finish reading every split's rows back from global memory
// (a fence, an atomic counter and a read of L2 on the way to the output).
#ifndef CLUSTER_MERGE
#define CLUSTER_MERGE 0
#endif
#ifndef CLUSTER_MAX
#define CLUSTER_MAX 8  // the most blocks a cluster merges (stages/stage7_decode.py's CLUSTER_MAX)
#endif
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
// The float at `p` (this block's shared memory) in block `rank` of the cluster.
__device__ __forceinline__ float ld_cluster(const float* p, int rank) {
    unsigned addr;
    float v;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(addr) : "r"(smem_addr(p)), "r"(rank));
    asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(addr));
    return v;
}

// SPLIT_S_CHAIN: S's k-steps accumulate into two sets of registers (even and odd), added at the
// end, so that each n-tile's chain of dependent mma is half as long (a warp waits on its own
// instructions at the small caches: experiments/fp8_decode_registers).
#ifndef SPLIT_S_CHAIN
#define SPLIT_S_CHAIN 0
#endif

// PACKED_ROWS: the build for caches whose key rows lie D bytes apart (k and v's stride(2) == D, as
// in a contiguous [B, H_kv, S_k, D] cache; the launcher picks it): the row stride is a constant, so
// a chunk's 2·COPIES copy addresses are two registers plus immediates instead of a 64-bit add each.
#ifndef PACKED_ROWS
#define PACKED_ROWS 0
#endif

// Issue the warp's chunk i (key chunk first + i·WARPS) into ring slot i % STAGES; keys at or past
// `keys` are zero-filled (a cache's unused slots may hold anything, and 0·NaN is NaN).
__device__ __forceinline__ void issue_chunk(const Args& a, unsigned char* ring, const unsigned char* kbase,
                                            const unsigned char* vbase, int first, int n_chunks, int keys, int i) {
    const int lane = threadIdx.x % 32;
    if (i < n_chunks) {
        const int key0 = (first + i * WARPS) * CHUNK;
        unsigned char* slot = ring + (i % STAGES) * CHUNK_BYTES;
        // this lane's row of copy j is row0 + 4j·LINE_ROWS: one pointer each, stepped
        const int row0 = (lane / 8) * LINE_ROWS + (16 * (lane % 8)) / D, col = (16 * (lane % 8)) % D;
#if PACKED_ROWS
        const long long k_sr = D, v_sr = D;  // known here: each copy's address is the first's plus a constant
#else
        const long long k_sr = a.k_sr, v_sr = a.v_sr;
#endif
        const unsigned char* kp = kbase + (long long)(key0 + row0) * k_sr + col;
        const unsigned char* vp = vbase + (long long)(key0 + row0) * v_sr + col;
        const long long kstep = 4LL * LINE_ROWS * k_sr, vstep = 4LL * LINE_ROWS * v_sr;
        if (WHOLE_CHUNK_COPIES && key0 + CHUNK <= keys) {  // the warp's branch: key0 is the warp's
#pragma unroll
            for (int j = 0; j < COPIES; ++j) {
                const int row = row0 + 4 * LINE_ROWS * j;
                cp_async_16_whole(slot + swizzled(row, col), kp);
                cp_async_16_whole(slot + CHUNK * D + swizzled(row, col), vp);
                kp += kstep, vp += vstep;
            }
            cp_async_commit();
            return;
        }
        const int left = keys - key0 - row0;  // copy j reads a key while 4j·LINE_ROWS < left
#pragma unroll
        for (int j = 0; j < COPIES; ++j) {
            const int row = row0 + 4 * LINE_ROWS * j;
            const bool in = 4 * LINE_ROWS * j < left;
            cp_async_16(slot + swizzled(row, col), in ? kp : kbase, in ? 16 : 0);  // no hint: see EVICT_FIRST
            cp_async_16(slot + CHUNK * D + swizzled(row, col), in ? vp : vbase, in ? 16 : 0);
            kp += kstep, vp += vstep;
        }
    }
    cp_async_commit();  // an empty group past the end keeps the count
}

// HOISTED_ADDRESSES: every shared-memory address a lane copies to or reads from is its own part,
// worked out once before the loop, plus a constant and the slot's offset; its cache pointers step by
// a chunk. The swizzle's lane terms do not change with the chunk: a copy's row is row0 + 4j·LINE_ROWS
// (its swizzle repeats every 4 copies, 2048 bytes on), a key read's is key_of(t, g), whose swizzle
// is g's alone, and a value read's 16ks + 4c + r, whose swizzle is c's and r's parity. Without it
// the compiler worked them out from the thread index for every chunk: about 85 of a chunk's ~590
// instructions (SASS, D128 (32, 2, 8): 505 with it). Predicted a few % at the small caches; measured
// 0.99-1.02x without it against with it (experiments/fp8_decode_registers, "Addresses worked out
// once"): what those rows wait for is not the count of instructions.
#ifndef HOISTED_ADDRESSES
#define HOISTED_ADDRESSES 1
#endif
constexpr int COPY_ROWS = COPIES < 4 ? COPIES : 4;  // copies whose lane offsets differ (then + 2048 bytes)
struct LaneAddresses {
    unsigned copy[COPY_ROWS];        // copy j's shared address in slot 0: copy[j % 4] + 2048·(j / 4)
    unsigned key[KPIECES], value[2]; // key piece p of key_of(0, g); value row 4c + (r % 2)
    const unsigned char *kp, *vp;    // the lane's first copy of the warp's first chunk
    long long k_chunk, v_chunk;      // a chunk on (the warp's next: WARPS chunks of the cache)
};
__device__ __forceinline__ LaneAddresses lane_addresses(const Args& a, const unsigned char* ring,
                                                        const unsigned char* kbase, const unsigned char* vbase,
                                                        int first) {
    const int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
    const int row0 = (lane / 8) * LINE_ROWS + (16 * (lane % 8)) / D, col = (16 * (lane % 8)) % D;
    LaneAddresses la;
#pragma unroll
    for (int j = 0; j < COPY_ROWS; ++j) la.copy[j] = smem_addr(ring) + swizzled(row0 + 4 * LINE_ROWS * j, col);
#pragma unroll
    for (int p = 0; p < KPIECES; ++p) la.key[p] = swizzled(key_of(0, g), 64 * p + 16 * c);
#pragma unroll
    for (int r = 0; r < 2; ++r) la.value[r] = CHUNK * D + swizzled(4 * c + r, VBYTES * g);
#if PACKED_ROWS
    const long long k_sr = D, v_sr = D;
#else
    const long long k_sr = a.k_sr, v_sr = a.v_sr;
#endif
    la.kp = kbase + (long long)(first * CHUNK + row0) * k_sr + col;
    la.vp = vbase + (long long)(first * CHUNK + row0) * v_sr + col;
    la.k_chunk = (long long)WARPS * CHUNK * k_sr, la.v_chunk = (long long)WARPS * CHUNK * v_sr;
    // opaque to the compiler, which would otherwise work them out again inside the loop
#pragma unroll
    for (int j = 0; j < COPY_ROWS; ++j) asm volatile("" : "+r"(la.copy[j]));
#pragma unroll
    for (int p = 0; p < KPIECES; ++p) asm volatile("" : "+r"(la.key[p]));
    asm volatile("" : "+r"(la.value[0]), "+r"(la.value[1]), "+l"(la.kp), "+l"(la.vp));
    return la;
}
// issue_chunk with the lane's addresses: a whole chunk's copies are the lane's offsets plus
// constants; a chunk that the cache's end cuts takes issue_chunk's bound checks.
__device__ __forceinline__ void issue_chunk_at(const Args& a, const LaneAddresses& la, unsigned char* ring,
                                               const unsigned char* kbase, const unsigned char* vbase,
                                               int first, int n_chunks, int keys, int i) {
    if (!(WHOLE_CHUNK_COPIES && i < n_chunks && (first + i * WARPS) * CHUNK + CHUNK <= keys)) {
        issue_chunk(a, ring, kbase, vbase, first, n_chunks, keys, i);
        return;
    }
    const unsigned slot = (i % STAGES) * CHUNK_BYTES;
    const unsigned char* kp = la.kp + i * la.k_chunk;
    const unsigned char* vp = la.vp + i * la.v_chunk;
#if PACKED_ROWS
    constexpr long long kstep = 4LL * LINE_ROWS * D, vstep = kstep;
#else
    const long long kstep = 4LL * LINE_ROWS * a.k_sr, vstep = 4LL * LINE_ROWS * a.v_sr;
#endif
    unsigned at[COPY_ROWS];  // the slot's copy addresses; the rest are these plus constants
#pragma unroll
    for (int j = 0; j < COPY_ROWS; ++j) at[j] = la.copy[j] + slot;
#pragma unroll
    for (int j = 0; j < COPIES; ++j) {
        cp_async_16_at(at[j % COPY_ROWS] + 2048 * (j / COPY_ROWS), kp + j * kstep);
        cp_async_16_at(at[j % COPY_ROWS] + 2048 * (j / COPY_ROWS) + CHUNK * D, vp + j * vstep);
    }
    cp_async_commit();
}

// The warp's chunks, its first STAGES − 1 already issued (issue_chunk) by the kernel, right behind
// Q's and the descales' loads, so that all of them wait on memory at once.
template <bool FOLD>
__device__ __forceinline__ void decode_chunks(const Args& a, RowState& st, const unsigned (&qa)[KSTEPS][4],
                                              unsigned char* ring, const unsigned char* kbase,
                                              const unsigned char* vbase, int first, int n_chunks,
                                              int keys, const int (&limit)[HALVES], const float (&sl)[HALVES]) {
    const int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
#if HOISTED_ADDRESSES
    const LaneAddresses la = lane_addresses(a, ring, kbase, vbase, first);
#endif
    for (int i = 0; i < n_chunks; ++i) {
        __syncwarp();  // every lane done reading the slot issue_chunk refills
#if HOISTED_ADDRESSES
        issue_chunk_at(a, la, ring, kbase, vbase, first, n_chunks, keys, i + STAGES - 1);
#else
        issue_chunk(a, ring, kbase, vbase, first, n_chunks, keys, i + STAGES - 1);
#endif
        cp_async_wait<STAGES - 1>();
        __syncwarp();  // every lane's copies of chunk i landed, seen by the warp
        const unsigned char* slot = ring + (i % STAGES) * CHUNK_BYTES;
        const int key0 = (first + i * WARPS) * CHUNK;
        // S = Q·Kᵀ, STILES n-tiles of 8 keys (SPLIT_S_CHAIN: odd k-steps into a second accumulator)
        float s[STILES][ACC], s_odd[STILES][ACC];
#pragma unroll
        for (int t = 0; t < STILES; ++t) {
#pragma unroll
            for (int e = 0; e < ACC; ++e) s[t][e] = 0.0f, s_odd[t][e] = 0.0f;
#pragma unroll
            for (int p = 0; p < KPIECES; ++p) {
#if HOISTED_ADDRESSES  // the lane's part, and t's: lane 0's offset from its key_of(0, 0)
                const uint4 w = *reinterpret_cast<const uint4*>(
                    slot + la.key[p] + (swizzled(key_of(t, 0), 64 * p) - swizzled(key_of(0, 0), 64 * p)));
#else
                const uint4 w = *reinterpret_cast<const uint4*>(slot + swizzled(key_of(t, g), 64 * p + 16 * c));
#endif
                const unsigned wd[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
                for (int j = 0; j < 4; ++j)
                    mma_rows(SPLIT_S_CHAIN && j % 2 ? s_odd[t] : s[t], qa[4 * p + j],
                             widen2<SAME_WORD<0>, FOLD>(wd[j], wd[j]), widen2<SAME_WORD<2>, FOLD>(wd[j], wd[j]));
            }
            if (SPLIT_S_CHAIN)
#pragma unroll
                for (int e = 0; e < 2 * HALVES; ++e) s[t][e] += s_odd[t][e];
        }
        // scale, mask (keys past the rows' limits), and the online softmax
        float mx[HALVES];
        int lowest = limit[0];
#pragma unroll
        for (int h = 0; h < HALVES; ++h) mx[h] = NEG_INF, lowest = min(lowest, limit[h]);
        const bool edge = key0 + CHUNK > lowest;
#pragma unroll
        for (int t = 0; t < STILES; ++t)
#pragma unroll
            for (int e = 0; e < 2 * HALVES; ++e) {
                const int h = e / 2;
                float x = s[t][e] * sl[h];
                if (edge && key0 + key_of(t, 2 * c + e % 2) >= limit[h]) x = NEG_INF;
                s[t][e] = x;
                mx[h] = fmaxf(mx[h], x);
            }
        float alpha[HALVES], base[HALVES];
#pragma unroll
        for (int h = 0; h < HALVES; ++h) {
            mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
            mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
            const float m_new = fmaxf(st.m[h], mx[h]);
            base[h] = m_new == NEG_INF ? 0.0f : m_new;  // a row with no key yet: every p is 0
            alpha[h] = fast_exp2(st.m[h] - base[h]);
            st.m[h] = m_new;
            st.l[h] *= alpha[h];
        }
#pragma unroll
        for (int u = 0; u < NTILES; ++u)
#pragma unroll
            for (int e = 0; e < 2 * HALVES; ++e) st.o[u][e] *= alpha[e / 2];
        unsigned pa[PSTEPS][4];
#pragma unroll
        for (int t = 0; t < STILES; ++t) {
            float p[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int e = 0; e < 2 * HALVES; ++e) {
                p[e] = fast_exp2(s[t][e] - base[e / 2]);
                st.l[e / 2] += p[e];
            }
            pa[t / 2][2 * (t % 2)] = pack_p(p[0], p[1]);      // row g, keys of n-tile t
            pa[t / 2][2 * (t % 2) + 1] = HALVES == 2 ? pack_p(p[2], p[3]) : 0u;  // row g + 8
        }
        // O += P·V, PSTEPS k-steps of 16 keys; thread (g, c) reads keys 4c … 4c + 3 of each
#pragma unroll
        for (int ks = 0; ks < PSTEPS; ++ks) {
            unsigned w[4][VBYTES / 4];
#pragma unroll
            for (int r = 0; r < 4; ++r) {
#if HOISTED_ADDRESSES
                const unsigned char* from = slot + la.value[r % 2] + (swizzled(16 * ks + r, 0) - swizzled(r % 2, 0));
#else
                const unsigned char* from = slot + CHUNK * D + swizzled(16 * ks + 4 * c + r, VBYTES * g);
#endif
                if constexpr (VBYTES == 16) {
                    const uint4 x = *reinterpret_cast<const uint4*>(from);
                    w[r][0] = x.x, w[r][1] = x.y, w[r][2] = x.z, w[r][3] = x.w;
                } else {
                    const uint2 x = *reinterpret_cast<const uint2*>(from);
                    w[r][0] = x.x, w[r][1] = x.y;
                }
            }
            const unsigned a4[4] = {pa[ks][0], pa[ks][1], pa[ks][2], pa[ks][3]};
#pragma unroll
            for (int wi = 0; wi < VBYTES / 4; ++wi) {
                mma_rows(st.o[4 * wi + 0], a4, widen2<TWO_WORDS<0>, FOLD>(w[0][wi], w[1][wi]),
                          widen2<TWO_WORDS<0>, FOLD>(w[2][wi], w[3][wi]));
                mma_rows(st.o[4 * wi + 1], a4, widen2<TWO_WORDS<1>, FOLD>(w[0][wi], w[1][wi]),
                          widen2<TWO_WORDS<1>, FOLD>(w[2][wi], w[3][wi]));
                mma_rows(st.o[4 * wi + 2], a4, widen2<TWO_WORDS<2>, FOLD>(w[0][wi], w[1][wi]),
                          widen2<TWO_WORDS<2>, FOLD>(w[2][wi], w[3][wi]));
                mma_rows(st.o[4 * wi + 3], a4, widen2<TWO_WORDS<3>, FOLD>(w[0][wi], w[1][wi]),
                          widen2<TWO_WORDS<3>, FOLD>(w[2][wi], w[3][wi]));
            }
        }
    }
    cp_async_wait<0>();
}

// The kernels take Args' fields one by one (the launcher passes scalars), in its order.
#define ARGS_PARAMS                                                                                      \
    const elem_t *q, const unsigned char *k, const unsigned char *v, const float *k_descale,           \
        const float *v_descale, const int *seqlens_k, elem_t *out, float *part_o, float *part_lse,      \
        int *counts,                                                                                    \
        long long q_sb, long long q_sh, long long q_sr, long long k_sb, long long k_sh, long long k_sr, \
        long long v_sb, long long v_sh, long long v_sr, int H, int Hk, int Sq, int Sk, int splits,      \
        int causal, float scale_log2
#define ARGS_MAKE                                                                                       \
    const Args a{q, k, v, k_descale, v_descale, seqlens_k, out, part_o, part_lse, counts, q_sb, q_sh, q_sr, \
                 k_sb, k_sh, k_sr, v_sb, v_sh, v_sr, H, Hk, Sq, Sk, splits, causal, scale_log2}

extern "C" __global__ void __launch_bounds__(WARPS * 32, MIN_BLOCKS) decode_e4m3(ARGS_PARAMS) {
    ARGS_MAKE;
    extern __shared__ __align__(128) unsigned char smem[];  // the ring's lines 128-byte aligned
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
    const int split = blockIdx.x % a.splits, bk = blockIdx.x / a.splits;
    const int b = bk / a.Hk, hk = bk % a.Hk;
    const int group = a.H / a.Hk, rows = group * a.Sq;
    const int keys = a.seqlens_k ? max(0, min(a.seqlens_k[b], a.Sk)) : a.Sk;
    // row r is query head hk·group + r / Sq, query i = r % Sq; it sees the keys before its limit:
    // every key, or causal top-left (1) those up to i, bottom-right (2) those up to keys − Sq + i
    int limit[HALVES];
#pragma unroll
    for (int h = 0; h < HALVES; ++h) {
        const int r = g + 8 * h, i = r % a.Sq;
        limit[h] = r >= rows || a.causal == 0 ? keys : a.causal == 1 ? min(keys, i + 1) : keys - a.Sq + 1 + i;
    }
    // Q as S's A fragments, head-dim columns in key_word_col's order; rows past G·Sq are zero
    unsigned qa[KSTEPS][4] = {};
#pragma unroll
    for (int h = 0; h < HALVES; ++h) {
        const int r = g + 8 * h;
        const elem_t* qrow = a.q + (long long)b * a.q_sb + (long long)(hk * group + r / a.Sq) * a.q_sh +
                             (long long)(r % a.Sq) * a.q_sr;
#pragma unroll
        for (int j = 0; j < KSTEPS; ++j) {
            uint2 x = make_uint2(0u, 0u);
            if (r < rows) x = *reinterpret_cast<const uint2*>(qrow + key_word_col(j, c));
            qa[j][h] = x.x;      // columns 2c, 2c + 1 (rows g, g + 8: registers 0, 1)
            qa[j][2 + h] = x.y;  // columns 2c + 8, 2c + 9 (registers 2, 3)
        }
    }
    const float kd = a.k_descale[bk], vd = a.v_descale[bk];
    // this split's key chunks, and this warp's: w, w + WARPS, ...; their first STAGES − 1 issued
    // now, behind Q's loads and before Q is used (both wait on memory at once)
    const int chunks = (keys + CHUNK - 1) / CHUNK;
    const int per_split = (chunks + a.splits - 1) / a.splits;
    const int c0 = min(chunks, split * per_split), c1 = min(chunks, c0 + per_split);
    const int first = c0 + warp, n_chunks = first < c1 ? (c1 - first + WARPS - 1) / WARPS : 0;
    const unsigned char* kbase = a.k + (long long)b * a.k_sb + (long long)hk * a.k_sh;
    const unsigned char* vbase = a.v + (long long)b * a.v_sb + (long long)hk * a.v_sh;
    unsigned char* ring = smem + warp * STAGES * CHUNK_BYTES;
#pragma unroll
    for (int i = 0; i < STAGES - 1; ++i) issue_chunk(a, ring, kbase, vbase, first, n_chunks, keys, i);
    float q_unscale[HALVES];  // what a row's scores are multiplied by to undo its scaling
#pragma unroll
    for (int h = 0; h < HALVES; ++h) q_unscale[h] = 1.0f;
#if PRODUCTS_F16 && defined(ELEM_BF16)
    // F16_PRODUCTS: each row times 2^(141 − e), e the biased exponent of its largest |q| (the
    // quad's four lanes hold its columns), then rounded to fp16
#pragma unroll
    for (int h = 0; h < HALVES; ++h) {
        unsigned top = 0;  // the largest magnitude's bits (for x >= 0 the bits order as the values)
#pragma unroll
        for (int j = 0; j < KSTEPS; ++j)
#pragma unroll
            for (int w = 0; w < 2; ++w) {
                const unsigned v = qa[j][h + 2 * w];
                top = max(top, max((v & 0x7FFFu) << 16, v & 0x7FFF0000u));
            }
        top = max(top, __shfl_xor_sync(0xffffffffu, top, 1));
        top = max(top, __shfl_xor_sync(0xffffffffu, top, 2));
        const int e = min(254, max(0, (int)(top >> 23)));
        const int up = top == 0 ? 127 : min(253, max(1, 268 - e));  // the scale's biased exponent (2^-126 … 2^126)
        const float scale = __int_as_float(up << 23);
        q_unscale[h] = __int_as_float((254 - up) << 23);  // 2^(127 − (up − 127)): exact
#pragma unroll
        for (int j = 0; j < KSTEPS; ++j)
#pragma unroll
            for (int w = 0; w < 2; ++w) {
                const __nv_bfloat162 v = *reinterpret_cast<const __nv_bfloat162*>(&qa[j][h + 2 * w]);
                const __half2 f = __floats2half2_rn(__low2float(v) * scale, __high2float(v) * scale);
                qa[j][h + 2 * w] = *reinterpret_cast<const unsigned*>(&f);
            }
    }
#endif
    const bool fold = folds(a.scale_log2, kd, vd);
    float sl[HALVES];
#pragma unroll
    for (int h = 0; h < HALVES; ++h) sl[h] = a.scale_log2 * kd * (fold ? WIDEN_FOLD : 1.0f) * q_unscale[h];
    const float vscale = vd * (fold ? WIDEN_FOLD : 1.0f);
    RowState st;
#pragma unroll
    for (int h = 0; h < HALVES; ++h) st.m[h] = NEG_INF, st.l[h] = 0.0f;
#pragma unroll
    for (int u = 0; u < NTILES; ++u)
#pragma unroll
        for (int e = 0; e < ACC; ++e) st.o[u][e] = 0.0f;
    if (fold)
        decode_chunks<true>(a, st, qa, ring, kbase, vbase, first, n_chunks, keys, limit, sl);
    else
        decode_chunks<false>(a, st, qa, ring, kbase, vbase, first, n_chunks, keys, limit, sl);
    // the row sums over the quad (each thread summed its own keys' p)
#pragma unroll
    for (int h = 0; h < HALVES; ++h) {
        st.l[h] += __shfl_xor_sync(0xffffffffu, st.l[h], 1);
        st.l[h] += __shfl_xor_sync(0xffffffffu, st.l[h], 2);
    }
    // merge the warps: each writes its max, sum and unnormalized rows into shared memory (the
    // ring, now idle), then thread i takes columns of the block's rows
    __syncthreads();
    // [WARPS][ROWS] rows of MERGE_STRIDE floats; column col at col + col / 32, so that a warp's
    // stores of its lanes' columns (2c·D/8 + u) fall on different banks
    float* o_sm = reinterpret_cast<float*>(smem);
    float* ml_sm = o_sm + WARPS * ROWS * MERGE_STRIDE;                // [WARPS][ROWS][2]
#pragma unroll
    for (int h = 0; h < HALVES; ++h) {
        const int r = g + 8 * h;
        float* orow = o_sm + (warp * ROWS + r) * MERGE_STRIDE;
#pragma unroll
        for (int u = 0; u < NTILES; ++u) {
            const int c0 = (2 * c) * VBYTES + u, c1 = (2 * c + 1) * VBYTES + u;  // columns (2c)·D/8 + u, (2c + 1)·D/8 + u
            orow[c0 + c0 / 32] = st.o[u][2 * h];
            orow[c1 + c1 / 32] = st.o[u][2 * h + 1];
        }
        if (c == 0) ml_sm[(warp * ROWS + r) * 2] = st.m[h], ml_sm[(warp * ROWS + r) * 2 + 1] = st.l[h];
    }
    __syncthreads();
    const long long part = (long long)bk * a.splits + split;
#if CLUSTER_MERGE
    // this block's rows of the split, normalized, and their log2-sum-exps: past the warps' merge
    float* part_sm = ml_sm + WARPS * ROWS * 2 + 4;  // + 16 bytes: the flag's place (unused here)
    float* lse_sm = part_sm + ROWS * D;
    (void)part;
#endif
    for (int i = threadIdx.x; i < rows * D; i += WARPS * 32) {
        const int r = i / D, d = i % D;
        float m = NEG_INF;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) m = fmaxf(m, ml_sm[(w * ROWS + r) * 2]);
        const float base = m == NEG_INF ? 0.0f : m;
        float l = 0.0f, o = 0.0f;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) {
            const float f = fast_exp2(ml_sm[(w * ROWS + r) * 2] - base);
            l += f * ml_sm[(w * ROWS + r) * 2 + 1];
            o += f * o_sm[(w * ROWS + r) * MERGE_STRIDE + d + d / 32];
        }
        const float y = l > 0.0f ? o / l * vscale : 0.0f;  // a row that saw no key: 0
        if (a.splits == 1) {
            a.out[(((long long)b * a.H + hk * group + r / a.Sq) * a.Sq + r % a.Sq) * D + d] = to_elem(y);
        } else {
#if CLUSTER_MERGE
            part_sm[r * D + d] = y;
            if (d == 0) lse_sm[r] = l > 0.0f ? base + __log2f(l) : NEG_INF;
#else
            a.part_o[(part * ROWS + r) * D + d] = y;
            if (d == 0) a.part_lse[part * ROWS + r] = l > 0.0f ? base + __log2f(l) : NEG_INF;
#endif
        }
    }
    if (a.splits == 1) return;
#if CLUSTER_MERGE
    // The splits of a work tile are one cluster (the launcher's cluster dims: splits blocks, split =
    // the block's rank): each block takes a slice of the output's elements and merges them from
    // every block's rows in shared memory (weights 2^(lse_s − max lse); a row no split saw: 0).
    // The second barrier keeps each block's shared memory alive until the others have read it.
    // Every block's two values are loaded before any is used (the loop unrolled to CLUSTER_MAX):
    // one round trip through the cluster, where a loop of a.splits steps would wait on each load.
    cluster_sync();
    for (int i = split * WARPS * 32 + threadIdx.x; i < rows * D; i += a.splits * WARPS * 32) {
        const int r = i / D, d = i % D;
        float lse[CLUSTER_MAX], part[CLUSTER_MAX];
#pragma unroll
        for (int s = 0; s < CLUSTER_MAX; ++s) {
            lse[s] = s < a.splits ? ld_cluster(lse_sm + r, s) : NEG_INF;
            part[s] = s < a.splits ? ld_cluster(part_sm + r * D + d, s) : 0.0f;
        }
        float m = NEG_INF;
#pragma unroll
        for (int s = 0; s < CLUSTER_MAX; ++s) m = fmaxf(m, lse[s]);
        float wsum = 0.0f, o = 0.0f;
        if (m != NEG_INF)
#pragma unroll
            for (int s = 0; s < CLUSTER_MAX; ++s) {
                const float w = fast_exp2(lse[s] - m);  // 0 past a.splits (lse −∞)
                wsum += w;
                o += w * part[s];
            }
        a.out[(((long long)b * a.H + hk * group + r / a.Sq) * a.Sq + r % a.Sq) * D + d] =
            to_elem(wsum > 0.0f ? o / wsum : 0.0f);
    }
    cluster_sync();
    return;
#endif
    // Split-KV: the last of the work tile's blocks to finish merges every split's rows (their
    // weights 2^(lse_s − max lse); a row no split saw: 0) and resets the counter for the next
    // launch. The partial rows are read past L1 (__ldcg): other blocks wrote them.
    // (the flag in dynamic shared memory, past the merge's rows: a static __shared__ variable would
    // come first and move the ring off its 128-byte alignment; at 48 KB of ring it would also take
    // the block past the 48 KB a kernel gets without asking)
    int* last = reinterpret_cast<int*>(ml_sm + WARPS * ROWS * 2);
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) *last = atomicAdd(a.counts + bk, 1) == a.splits - 1;
    __syncthreads();
    if (!*last) return;
    __threadfence();
    const long long p0 = (long long)bk * a.splits;
    for (int i = threadIdx.x; i < rows * D; i += WARPS * 32) {
        const int r = i / D, d = i % D;
        float m = NEG_INF;
        for (int s = 0; s < a.splits; ++s) m = fmaxf(m, __ldcg(a.part_lse + (p0 + s) * ROWS + r));
        float wsum = 0.0f, o = 0.0f;
        if (m != NEG_INF)
            for (int s = 0; s < a.splits; ++s) {
                const float w = fast_exp2(__ldcg(a.part_lse + (p0 + s) * ROWS + r) - m);
                wsum += w;
                o += w * __ldcg(a.part_o + ((p0 + s) * ROWS + r) * D + d);
            }
        a.out[(((long long)b * a.H + hk * group + r / a.Sq) * a.Sq + r % a.Sq) * D + d] =
            to_elem(wsum > 0.0f ? o / wsum : 0.0f);
    }
    if (threadIdx.x == 0) a.counts[bk] = 0;
}

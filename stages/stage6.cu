// Stage 6 — Hopper: TMA + WGMMA, warp-specialized (sm_90a). The FlashAttention-3 design.
//
// A block owns BLOCK_M = 64·CONSUMERS query rows of one (batch, head) and is made of
// warpgroups (4 warps, 128 threads each), each with one job:
//   - the producer (warpgroup 0; one thread does the work) copies tiles with the copy engine
//     (TMA): Q once, then K and V tiles of BLOCK_N keys into rings of STAGES buffers. Each
//     buffer has a "full" mbarrier that completes when its bytes have landed and an "empty"
//     one that completes when every consumer warp is done with it. K and V have barriers of
//     their own: a K buffer is free as soon as S = Q·Kᵀ is done, long before P·V is;
//   - the consumers (warpgroups 1 … CONSUMERS), 64 query rows each, run
//       S = Q·Kᵀ    wgmma, both operands read from shared memory by descriptor,
//       the online softmax on S in the accumulator registers (as in stage 5),
//       O += P·V    wgmma, P from registers (the accumulator layout is the A-operand layout),
//                   V from shared memory, transposed by the tensor core on the fly.
// wgmma is asynchronous: a warpgroup issues it, goes on, and waits for it later, so the
// tensor cores and the softmax's exp2/FMA units can work at the same time.
//
// What changes from stage 5:
//   1. wgmma instead of mma.sync: 64×N×16 per instruction per warpgroup instead of 16×8×16
//      per warp, operands straight from shared memory: no ldmatrix, no operand registers for
//      Q, K, V.
//   2. TMA instead of cp.async: one thread issues a whole tile's copy; the hardware computes
//      the addresses, zero-fills rows past the sequence end, applies the 128-byte swizzle that
//      wgmma reads, and counts the bytes on an mbarrier.
//   3. Warp specialization: producer and consumers are different warps that meet only at
//      the mbarriers, instead of every warp copying and then computing. With SETMAXNREG the
//      producer hands most of its registers to the consumers (setmaxnreg).
//   4. The FlashAttention-3 schedule, each piece a compile-time switch the notebook measures:
//        PINGPONG       consumer warpgroups take turns issuing their products (named
//                       barriers), so one warpgroup's softmax runs while the other's
//                       products occupy the tensor cores (PINGPONG=1); or (PINGPONG=2, as
//                       cuDNN's Hopper kernels do) take turns running their softmax, so
//                       one warpgroup has the exp2 unit (MUFU) to itself while the other's
//                       products run;
//        INTRA_OVERLAP  within a warpgroup, the next tile's S = Q·Kᵀ and this tile's O += P·V
//                       are issued together, and the softmax of the new S runs while P·V is
//                       still in the tensor cores.
//      WARP_SPECIALIZED=0 builds the baseline without a producer: consumer 0's first thread
//      issues the copies itself, between its own products.
//        DYNAMIC_WORK   for a persistent launch (one block per SM): the producer takes each
//                       next work tile from a global counter (atomicAdd) instead of the fixed
//                       stride blockIdx.x + k·gridDim.x, and tells the consumers which one it
//                       took through shared memory. With causal masking the work tiles of a
//                       head differ in length; a fixed stride can hand some SMs mostly long
//                       ones, a counter hands each SM the next tile as soon as it is free.
//        CARRY_PV       for a persistent launch: a work tile's last P·V is issued with the
//                       next work tile's first S, so the overlap runs on across work tiles
//                       instead of draining at each one's end.
//   5. LAZY_RESCALE (FlashAttention-4's conditional rescaling): -1 rescales O by every tile's
//      correction factor, as FlashAttention-3 does (64 FMUL per tile and thread at D128); k >= 0
//      keeps a row's running max until a tile's exceeds it by a factor over 2^k (k in the
//      exponent's scaled log2 units), and a warp skips
//      the rescale when none of its rows changed max (one vote). With k = 8 O is in practice
//      rescaled only after the first tile; P then reaches up to 2^8, harmless in fp16/bf16.
//   6. Short queries and few work tiles (decoding), two ideas of flash-decoding:
//        split-KV       n_splits (a launch argument) cuts each work tile's key tiles into that
//                       many ranges, each its own block, so B·H small still fills the GPU; a
//                       block writes its rows' O/l in fp32 and their log2-sum-exp, and the
//                       last of a work tile's blocks to finish (COMBINE_IN_BLOCK, the
//                       decoding build: split_counts, a counter per work tile) or a second
//                       kernel (attention_combine_splits) weighs the partial results into
//                       the output;
//        PACK_GQA       a block takes all G·Sq query rows of the G query heads that share one
//                       K/V head (one 5-D box of Q), so K and V are read once per group and a
//                       wgmma's 64 rows hold G·Sq useful rows instead of Sq;
//        BLOCKS_PER_SM  2: two such blocks (one consumer each, a smaller ring) share an SM, so
//                       one streams K and V while the other starts or ends.
//   7. The models' variants (issue 51), each a compile-time switch whose build without it (0, the
//      default) is the kernel above, unchanged; a build with any takes five more arguments
//      (VARIANT_PARAMS: cap_mul, cap_log2, win_left, win_right, sinks), every other build none:
//        SOFTCAP        Gemma 2's logit softcapping: the scaled scores s become c·tanh(s / c)
//                       before the mask (cap_scores). 1: tanh.approx.f32 (one MUFU.TANH a score,
//                       relative error up to 2^-11); 2: tanh from ex2 and rcp (two MUFU a score,
//                       absolute error ~2^-22), for where the first's error, times c in the logit,
//                       exceeds a 16-bit output's rounding.
//        WINDOW         a sliding window (left, right): query i of a sequence, at key position
//                       i + len_k − len_q (bottom-right), sees keys i + len_k − len_q − left …
//                       i + len_k − len_q + right, within the causal mask if there is one. A
//                       work tile's key tiles start at its first row's left edge and end at its
//                       last row's right edge (work_tile), so a block's cost grows with the
//                       window, not with the keys; a consumer stops at its own rows' right edge
//                       (my_tiles); the tiles that cut a row's window mask per score (softmax).
//        SINKS          gpt-oss's attention sinks: one logit σ_h per query head (sinks, float32
//                       [H], natural units, neither scaled nor capped) joins each row's softmax
//                       denominator, none of its numerators: at the end of a work tile the row
//                       sum l gets 2^(σ·log2 e − base) (close_rows), O is divided by the larger
//                       sum and the log-sum-exp the kernel writes includes it. Split-KV: the
//                       split blocks leave it out and the combine (combine_part, or the combine
//                       kernel) adds it once, as one more partial whose O is zero.
//   8. PAGE_SIZE (issue 50): a paged KV cache, K and V in pages of PAGE_SIZE keys that a per-entry
//      table (page_table [B][max_pages]) maps to a [num_pages, page_size, H_kv, D] cache, as vLLM's and
//      FlashAttention's. Only the producer changes: a key tile is copied one box per page (or a slice
//      of one page), from ids it reads a tile ahead (load_tile, tile_pages); the consumers see the
//      same ring. The build without it (0, the default) is the kernel above, unchanged.
//   9. KV_FP8 (issue 50): decoding from an e4m3 KV cache, the true K being k_fp8 · k_descale[b][hk]
//      (and V likewise), FlashAttention-3's convention; Q stays 16-bit. Decoding reads the cache once
//      and does little else, so half the bytes is up to half the time. The producer copies each e4m3
//      tile into a staging buffer, and its otherwise idle warps 1-3 widen it into the 16-bit ring
//      (e4m3 → fp16 or bf16 is exact: widen_tile); the consumers run unchanged, k_descale joins
//      the softmax's scale of each work tile (one K/V head per packed work tile) and v_descale
//      multiplies O. Only the packed decoding build takes it. The build without it (0, the
//      default) is the kernel above, unchanged.
// Grouped-query attention: query head h reads K/V head h / group. Any strides: the tensor maps
// are encoded from the tensors' real strides (stages/stage6.py). TIMELINE=1 records clock64
// stamps of one block's warpgroups for the notebook's Gantt chart.
#include "hopper.cuh"
#include "pdl.cuh"         // griddep_wait, griddep_launch_dependents
#include "work_queue.cuh"  // handed_out: the work queue's order

#if !defined(BLOCK_N) || !defined(STAGES) || !defined(CONSUMERS)
#error "BLOCK_N, STAGES and CONSUMERS are set by stages/stage6.py"
#endif
#ifndef WARP_SPECIALIZED
#define WARP_SPECIALIZED 1
#endif
#ifndef SETMAXNREG
#define SETMAXNREG 1
#endif
#ifndef PINGPONG
#define PINGPONG 1
#endif
#ifndef INTRA_OVERLAP
#define INTRA_OVERLAP 1
#endif
#ifndef TIMELINE
#define TIMELINE 0
#endif
#ifndef EXP2_POLY_EIGHTHS
#define EXP2_POLY_EIGHTHS 0
#endif
#ifndef LAZY_RESCALE
#define LAZY_RESCALE -1
#endif
#ifndef DYNAMIC_WORK
#define DYNAMIC_WORK 0
#endif
#ifndef PACK_GQA
#define PACK_GQA 0
#endif
#ifndef SEQS
#define SEQS 0  // per-sequence offsets or key lengths (cu_q, cu_k, used_k): a build of its own
#endif
#ifndef Q_STAGES
#define Q_STAGES 1  // Q buffers: 2 or 3 let a persistent block load its next work tile's Q early
#endif
#ifndef COMBINE_IN_BLOCK
#define COMBINE_IN_BLOCK 0  // 1: split-KV's last block per work tile may combine (split_counts non-null)
#endif
#ifndef O_TMA_STORE
#define O_TMA_STORE 0  // 1: O leaves through shared memory and a TMA store (see the epilogue)
#endif
#ifndef CARRY_PV
#define CARRY_PV 0  // 1: a work tile's last P·V goes with the next work tile's first S (see the consumers)
#endif
#ifndef BLOCKS_PER_SM
#define BLOCKS_PER_SM 1  // 2 or 3: blocks of one consumer sharing an SM (decoding; see the registers below)
#endif
#ifndef SKIP_ROWS_PAST_END
#define SKIP_ROWS_PAST_END 1  // 1: a consumer whose 64 rows all lie past the last query computes nothing (see my_tiles)
#endif
#ifndef SOFTCAP
#define SOFTCAP 0  // 1: c·tanh(s / c) on the scores by tanh.approx; 2: by ex2 and rcp (see cap_scores)
#endif
static_assert(SOFTCAP >= 0 && SOFTCAP <= 2, "SOFTCAP is 0 (off), 1 (tanh.approx) or 2 (tanh from ex2)");
#ifndef WINDOW
#define WINDOW 0  // 1: a sliding window, win_left and win_right keys either side of a row's position (see work_tile)
#endif
#ifndef SINKS
#define SINKS 0  // 1: a logit per query head in each row's softmax denominator (see close_rows)
#endif
#ifndef PAGE_SIZE
#define PAGE_SIZE 0  // 16-256: K and V in pages of that many keys, found through a page table (see tile_pages)
#endif
#ifndef PAGE_IDS_AHEAD
#define PAGE_IDS_AHEAD 0  // PAGE_SIZE, producer: >0 copies the page ids that many key tiles ahead into shared memory (see fetch_page_ids)
#endif
#ifndef KV_FP8
#define KV_FP8 0  // 1: K and V in e4m3, widened to 16 bits in shared memory by the producer (see widen_tile)
#endif
#ifndef KV_FP8_STAGED
#define KV_FP8_STAGED 2  // KV_FP8: e4m3 staging buffers of K (and of V), each freed once widened
#endif
#ifndef KV_FP8_WIDE
#define KV_FP8_WIDE 0  // KV_FP8: each widening thread loads 16 e4m3 bytes of a row at once, not 8 (widen_tile)
#endif
#ifndef KV_FP8_FOLD
#define KV_FP8_FOLD 0  // KV_FP8, bf16: the widening leaves each value times 2^-120, the descales take 2^120 (widen4)
#endif
static_assert(WARP_SPECIALIZED || (!SETMAXNREG && !PINGPONG && !INTRA_OVERLAP),
              "the baseline without a producer warpgroup runs without the FA3 schedule");
static_assert(!PINGPONG || CONSUMERS >= 2, "ping-pong needs two consumer warpgroups");
static_assert(!DYNAMIC_WORK || WARP_SPECIALIZED, "the producer warpgroup takes the work tiles from the queue");
static_assert(!CARRY_PV || (WARP_SPECIALIZED && INTRA_OVERLAP),
              "the carried P·V is the overlap's last product, issued with the next tile's first S");
static_assert(!CARRY_PV || !O_TMA_STORE || Q_STAGES >= 2,
              "a carried tile's O is staged in its Q buffer, which the next tile's Q must not need");
static_assert(!O_TMA_STORE || (WARP_SPECIALIZED && !PACK_GQA && !SEQS),
              "the TMA-store epilogue writes [B, H, S, D] rows of one head per consumer");

constexpr int D = HEAD_DIM;
constexpr int BLOCK_M = 64 * CONSUMERS;           // query rows per block, 64 per consumer
constexpr int ATOMS = (D + 63) / 64;               // 128-byte-wide column blocks of a row
// D96: two column blocks, the second half filled: the copy engine zero-fills a box's columns past
// the tensor's D (and counts the whole box's bytes), Q·Kᵀ reads the first D/16 = 6 k-steps only,
// and P·V runs over PV_N columns (128: the D128 layout and instruction, O's columns 96-127 stay
// zero and are never written out; 96: m64n96k16, a half-used second swizzle block).
#ifndef PV_N
#define PV_N (D == 96 ? 128 : D)
#endif
static_assert(PV_N == D || (D == 96 && PV_N == 128), "P·V over the head dim, or D96 padded to 128");
constexpr int Q_BYTES = BLOCK_M * ATOMS * 64 * 2;
constexpr int KV_BYTES = BLOCK_N * ATOMS * 64 * 2;
constexpr int THREADS = 128 * (CONSUMERS + WARP_SPECIALIZED);
// Registers per thread after setmaxnreg: the producer keeps few, the consumers take the rest
// of the 64K-register file (2 consumers: 128·24 + 256·240 = 64,512 ≤ 65,536; 3: 128·32 + 384·160).
// The work queue's producer also works out each next tile's coordinates: with 24 registers it
// spilled (28 bytes at D64); it keeps 40 with one or two consumers (128·40 + 256·232 = 64,512).
// BLOCKS_PER_SM > 1 (one consumer, decoding): blocks share an SM, so that one block's start and
// end (Q's wait, the epilogue's stores) run while another streams K and V, as cuDNN's decoding
// kernels do with 2-4 small blocks per SM. Each block then gets 1/BLOCKS_PER_SM of the registers:
// two blocks 128·40 + 128·216 = 32,768 each; three 128·24 + 128·136 = 20,480 (80 per thread at launch).
// PAGE_SIZE: the producer holds a key tile's page ids (up to 8) besides, and spilled 16 bytes with
// 24 (D128, 16-key pages): 40 as with the work queue.
// KV_FP8: the producer's warps 1-3 widen tiles, up to eight rows' loads in flight each (widen_tile):
// 96 with one block per SM (one consumer: 128·96 + 128·240, far below 64K); with two blocks per SM
// 64 and the consumer 192 (128·64 + 128·192 = 32,768): at D128 the producer spilled 20 bytes with 56
// and 24 with 48 (ptxas, both dtypes), 40 spilled 16 bytes at D64; the consumer fits in 192 at both.
constexpr int PRODUCER_REGS = BLOCKS_PER_SM == 3 ? 24 : BLOCKS_PER_SM == 2 ? (KV_FP8 ? 64 : 40)
                            : KV_FP8 ? 96
                            : CONSUMERS == 3 ? 32 : DYNAMIC_WORK && PAGE_SIZE ? 56 : DYNAMIC_WORK || PAGE_SIZE ? 40 : 24;
constexpr int CONSUMER_REGS = BLOCKS_PER_SM == 3 ? 136 : BLOCKS_PER_SM == 2 ? (KV_FP8 ? 192 : 216)
                            : CONSUMERS == 3 ? 160 : DYNAMIC_WORK && PAGE_SIZE ? 224 : DYNAMIC_WORK || PAGE_SIZE ? 232 : 240;
static_assert(BLOCKS_PER_SM == 1 || (CONSUMERS == 1 && BLOCKS_PER_SM <= (WARP_SPECIALIZED ? 3 : 4)),
              "several blocks per SM: one consumer, and a producer in two or three blocks or none in up to four");
constexpr int TURN_BAR = 4;  // named barriers TURN_BAR + c: consumer c's turn to issue products
constexpr int SPLIT_BAR = 7;  // named barrier of every consumer thread: the split count (split-KV)
static_assert(CONSUMERS <= 3, "named barriers 1-3 and 4-6 are the consumers' own");
static_assert(D == 64 || D == 96 || D == 128 || D == 256, "head dims 64, 96, 128 and 256");
static_assert(BLOCK_N == 64 || BLOCK_N == 128 || BLOCK_N == 176, "key tiles of 64, 128 or 176");
static_assert(Q_STAGES >= 1 && Q_STAGES <= 3, "one to three Q buffers (Q_STAGES)");
#if PAGE_SIZE
static_assert(SEQS, "a paged cache is read through per-entry key counts (seqlens_k): the SEQS build");
static_assert(PAGE_SIZE >= 16 && PAGE_SIZE <= 256 && (PAGE_SIZE & (PAGE_SIZE - 1)) == 0,
              "pages of 16, 32, 64, 128 or 256 keys");
static_assert(BLOCK_N % PAGE_SIZE == 0 || PAGE_SIZE % BLOCK_N == 0,
              "a key tile is whole pages, or a page whole key tiles (no 176-key tiles)");
constexpr int PAGE_BOX = PAGE_SIZE < BLOCK_N ? PAGE_SIZE : BLOCK_N;  // rows per copy
constexpr int TILE_PAGES = BLOCK_N / PAGE_BOX;                        // copies per key tile and column block
#endif
static_assert(PAGE_IDS_AHEAD == 0 || (PAGE_SIZE && WARP_SPECIALIZED && PAGE_IDS_AHEAD <= 8),
              "page ids ahead in shared memory: a paged build's producer warpgroup, 1-8 key tiles ahead");
#if KV_FP8
static_assert(WARP_SPECIALIZED && SETMAXNREG && PACK_GQA && SEQS && CONSUMERS == 1 && !DYNAMIC_WORK && !PAGE_SIZE
              && !O_TMA_STORE && !CARRY_PV && !SOFTCAP && !WINDOW && !SINKS && !TIMELINE,
              "KV_FP8: the packed decoding build with a producer warpgroup, walking a fixed stride of work tiles");
static_assert(D == 64 || D == 128, "KV_FP8: head dims 64 and 128");
static_assert(KV_FP8_STAGED >= 1 && KV_FP8_STAGED <= 8, "KV_FP8: one to eight staging buffers");
constexpr int WIDEN_THREADS = 96;  // the producer's warps 1-3
#endif

// Shared memory. A tile is stored as ATOMS blocks of [rows][64] elements: each row of a block
// is 128 bytes, the width of one 128-byte swizzle pattern (TMA box width ≤ 128 B with that
// swizzle), and each block starts on a 1024-byte boundary (8 rows × 128 B, where the pattern
// repeats). That is the layout wgmma's descriptors describe.
// Q_STAGES = 2 or 3: Q buffers used by a block's work tiles in turn (count % Q_STAGES).
struct Smem {
    elem_t q[Q_STAGES][ATOMS][BLOCK_M][64];
    elem_t k[STAGES][ATOMS][BLOCK_N][64];
    elem_t v[STAGES][ATOMS][BLOCK_N][64];
#if KV_FP8
    // KV_FP8: each ring buffer's e4m3 tile as the copy engine brings it, rows of D bytes (no
    // swizzle), and the barriers its bytes complete; k_full and v_full then complete when the
    // producer's warps 1-3 have widened it into the ring (widen_tile).
    unsigned char k8[KV_FP8_STAGED][BLOCK_N][D];
    unsigned char v8[KV_FP8_STAGED][BLOCK_N][D];
    unsigned long long k_staged[KV_FP8_STAGED], v_staged[KV_FP8_STAGED];      // its bytes have landed
    unsigned long long k_unstaged[KV_FP8_STAGED], v_unstaged[KV_FP8_STAGED];  // it has been widened
#endif
    unsigned long long q_full[Q_STAGES], q_empty[Q_STAGES];
    unsigned long long k_full[STAGES], v_full[STAGES], k_empty[STAGES], v_empty[STAGES];
    int work[Q_STAGES];  // DYNAMIC_WORK: the work tile whose Q is in that buffer (n_work: none left)
    int last_split;      // split-KV: this block was the last of its work tile's splits to finish
#if PAGE_IDS_AHEAD
    int page_ids[PAGE_IDS_AHEAD][TILE_PAGES];  // the producer's next key tiles' page ids (fetch_page_ids)
#endif
};

__device__ __forceinline__ float fast_exp2(float x) {  // one MUFU.EX2, as in stage 5
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}
// 2^x for x <= 0 on the FMA pipes instead of MUFU (FlashAttention-4's trick; MUFU does 16
// exp2 per SM per clock, the FMA pipes 128 operations): x = j + f with j = round(x) and f in
// [-0.5, 0.5]; 2^f by a degree-4 polynomial (relative error 2.6e-6, fitted to 2^f on that
// interval; fp16's rounding is 4.9e-4), 2^j added to the exponent bits. Adding 1.5·2^23 rounds
// x to an integer kept in the sum's low mantissa bits; shifted left by 23 they are j·2^23.
__device__ __forceinline__ float poly_exp2(float x) {
    x = fmaxf(x, -125.0f);  // masked scores (−∞) and underflow: 2^-125, nothing next to 1
    const float t = x + 12582912.0f;
    const float f = x - (t - 12582912.0f);
    const float p = fmaf(fmaf(fmaf(fmaf(0.009571807f, f, 0.055918004f), f, 0.24024703f), f, 0.69312179f), f, 0.99999928f);
    return __int_as_float(__float_as_int(p) + (__float_as_int(t) << 23));
}
// 1/x as one MUFU.RCP (rel. error ~2^-23, far below a 16-bit output's rounding), without the
// IEEE division's range tests and refinement, which sat in every work tile's epilogue.
__device__ __forceinline__ float fast_rcp(float x) {
    float y;
    asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}
// ---- SOFTCAP: the scores capped, c·tanh(s / c) of the scaled score s = q·k·scale ---------------
// The cap is folded into the softmax's units: the consumer scales the raw product by cap_mul and
// keeps t = tanh(q·k·scale / c) in place of the score, and its scale_log2 becomes cap_log2 =
// c·log2 e, so that every later step (the row max, exp2(t·scale_log2 − base), the log-sum-exp)
// sees c·tanh(s / c) in the same scaled log2 units as an uncapped build sees s. One FMUL and the
// tanh a score; the mask comes after (masked keys get −∞ whatever the cap made of them). The host
// works out cap_mul and cap_log2 (stages/stage6.py), so that both stay kernel parameters, read
// from the constant bank by the FMUL itself: no register held for them beside S, P and O.
//   SOFTCAP 1: cap_mul = |scale| / c; tanh.approx.f32 (MUFU.TANH), relative error up to 2^-11:
//              in the logit c·t that is up to c·2^-11, beside fp16's 2^-11 rounding of P.
//   SOFTCAP 2: cap_mul = 2·|scale|·log2(e) / c; tanh(x) = 1 − 2 / (2^(2x·log2 e) + 1), one
//              MUFU.EX2 and one MUFU.RCP (each ~2^-22): t within a few 2^-23 of tanh, at every x
//              (2^(…) = +∞ gives 1, 0 gives −1).
__device__ __forceinline__ float tanh_approx(float x) {
    float y;
    asm("tanh.approx.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}
template <int N>
__device__ __forceinline__ void cap_scores(float (&s)[N], float cap_mul) {
#pragma unroll
    for (int i = 0; i < N; ++i) {
        if (SOFTCAP == 1) s[i] = tanh_approx(s[i] * cap_mul);
        else s[i] = fmaf(-2.0f, fast_rcp(fast_exp2(s[i] * cap_mul) + 1.0f), 1.0f);
    }
}
__device__ __forceinline__ unsigned pack2(float lo, float hi) {  // two floats → two 16-bit elements
#ifdef ELEM_BF16
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
#else
    __half2 h = __floats2half2_rn(lo, hi);
#endif
    return *reinterpret_cast<unsigned*>(&h);
}

// ---- timeline (TIMELINE=1): clock64 stamps of block 0's first TL_TILES key tiles, per warpgroup --
// Indexed by ring position, which runs on across work tiles: with short work tiles (a persistent
// block at S 512: 3-4 key tiles each) the chart shows the gaps between one work tile and the next.
#if TIMELINE
constexpr int TL_TILES = 16, TL_EVENTS = 4;  // per warpgroup and tile: 4 stamps
#define STAMP(role, tile, ev)                                                                    \
    do {                                                                                         \
        if (stamps && (threadIdx.x % 128) == 0 && (tile) < TL_TILES)                             \
            stamps[((role) * TL_TILES + (tile)) * TL_EVENTS + (ev)] = clock64();                 \
    } while (0)
#else
#define STAMP(role, tile, ev) do {} while (0)
#endif

// ---- the producer's copies -------------------------------------------------------------------
// A block's work tile number `count` (0, 1, …) has Q buffer count % Q_STAGES, reused by work
// tile count + Q_STAGES once every consumer thread released it: with one buffer the next Q
// waits for this tile's last S = Q·Kᵀ; with two it waits only for the tile before, so it is
// loaded while this tile's products still run; with three, for the tile two before, so a short
// work tile's next Q is not held back by the end of the one before it (with the TMA-store
// epilogue a buffer is free only once its O has been copied out). With DYNAMIC_WORK the buffer's `work` slot
// also tells the consumers which work tile w this is: the store comes before the arrival on
// q_full (an arrive releases, a wait acquires), so a consumer that has waited for q_full reads
// this w. Nothing overwrites it before every consumer has read it: the next store waits for
// q_empty, which the consumers release after reading.
// PACK_GQA: the box is the G·Sq query rows of K/V head hk (q_bytes counts them).
__device__ __forceinline__ void load_q(Smem& sm, const CUtensorMap* map, int count, int q0, int h, int hk,
                                       int b, int w, int q_bytes) {  // q0: the row coordinate, b: the batch's
    const int qs = count % Q_STAGES;
    mbar_wait(&sm.q_empty[qs], ((count / Q_STAGES) & 1) ^ 1);
    if (DYNAMIC_WORK) sm.work[qs] = w;
    mbar_arrive_expect_bytes(&sm.q_full[qs], q_bytes);
#pragma unroll
    for (int a = 0; a < ATOMS; ++a) {
        if (PACK_GQA) tma_load_5d(&sm.q[qs][a][0][0], map, &sm.q_full[qs], 64 * a, q0, 0, hk, b);
        else tma_load_4d(&sm.q[qs][a][0][0], map, &sm.q_full[qs], 64 * a, q0, h, b);
    }
}
// Tile `key_tile` of K or V into its ring (`ring` = sm.k or sm.v with its barriers) at ring
// position `pos` (counted over the block's whole life, so parities carry across work tiles),
// once buffer pos % STAGES is free again: when its previous use, pos − STAGES, was released —
// the ((pos / STAGES) − 1)-th phase of its empty barrier. For the first STAGES positions the
// parity asked for is that of the phase "before the first", which counts as completed.
// PAGE_SIZE (issue 50: a paged KV cache, vLLM's and FlashAttention's page_table): K and V are
// [num_pages, page_size, H_kv, D] caches, whose maps stages/stage6_paged.py encodes as [num_pages,
// H_kv, page_size, D] (innermost first: D, page row, head, page), boxes of PAGE_BOX rows; batch
// entry b's key j is row j % PAGE_SIZE of page page_table[b][j / PAGE_SIZE]. A key tile is then
// TILE_PAGES copies per 64-column block (pages smaller than a tile) into successive PAGE_BOX-row
// slices of the ring buffer, or one copy from row key0 % PAGE_SIZE of its page (pages of several
// tiles). Every slice starts a multiple of 16 rows (2 KB) in: the 128-byte swizzle, which the copy
// engine applies from the shared address, repeats every 8 rows, so wgmma reads the tile as if one
// copy had brought it. The copies still count KV_BYTES on the full barrier.
// The producer looks a tile's page ids up (tile_pages) one key tile ahead, as it issues the copies of
// the tile before, so their latency hides under its wait for a free buffer. Pages the last tile
// reaches wholly past the entry's used keys get id -1, which the copy engine fills with zeros
// (out of the map's bounds: no read, the bytes still counted), so neither their table entries nor
// their contents matter; an id out of [0, num_pages) reads zeros the same way. The rows of the last
// used page past the used keys are read and masked (P = 0) — P·V then multiplies them by 0, so they
// must be finite, as in the contiguous build's rows past seqlens_k.
#if PAGE_SIZE
struct PageTable { const int* table; int max_pages; };  // int32 [B][max_pages]
struct Pages { int id[TILE_PAGES]; int row; };           // one key tile's pages, its first row in the first
#else
struct PageTable {};
struct Pages {};
#endif
__device__ __forceinline__ void load_tile(elem_t (*ring)[ATOMS][BLOCK_N][64], unsigned long long* full,
                                          unsigned long long* empty, const CUtensorMap* map,
                                          int pos, int key_tile, int hk, int b, int k_start, const Pages& pg) {
    const int st = pos % STAGES;
    mbar_wait(&empty[st], ((pos / STAGES) & 1) ^ 1);
    mbar_arrive_expect_bytes(&full[st], KV_BYTES);
#if PAGE_SIZE
#pragma unroll
    for (int a = 0; a < ATOMS; ++a)
#pragma unroll
        for (int i = 0; i < TILE_PAGES; ++i)
            tma_load_4d(&ring[st][a][i * PAGE_BOX][0], map, &full[st], 64 * a, pg.row, hk, pg.id[i]);
#else
#pragma unroll
    for (int a = 0; a < ATOMS; ++a) tma_load_4d(&ring[st][a][0][0], map, &full[st], 64 * a, k_start + key_tile * BLOCK_N, hk, b);
#endif
}

// ---- KV_FP8: e4m3 tiles staged, then widened into the ring ------------------------------------
// Decoding reads every key once and multiplies it by a handful of query rows: its time is the
// cache's bytes over the memory bandwidth, and an e4m3 cache has half the bytes of a 16-bit one.
// The tensor cores would take e4m3 only with Q in e4m3 too (stage 7's product); here the products
// stay 16-bit and each tile is widened on its way: the producer's thread 0 copies key tile j of
// K (and of V) with the copy engine into staging buffer j % KV_FP8_STAGED (load_staged: one box
// of BLOCK_N rows × D bytes, unswizzled), its bytes completing k_staged; warps 1-3, idle in the
// build without it, wait for ring buffer j % STAGES to be free (k_empty, from the consumers) and
// for the staged bytes, write the tile widened to 16 bits into the ring in the 128-byte swizzle
// the copy engine would have written (widen_tile), complete k_full, on which the consumers wait
// as before, and k_unstaged, on which thread 0 waits before it copies into that staging buffer
// again. The staging buffers are half a ring buffer's bytes and are freed as soon as they are
// read, so a block keeps more of the cache's bytes on their way from memory than its ring holds:
// what a memory-bound loop needs to reach the bandwidth (with staging freed only with its ring
// buffer, D128 held two 128-key tiles, 64 KB, and read 1.5-1.7 TB/s on the H200).
#if KV_FP8
__device__ __forceinline__ void load_staged(unsigned char (*stage)[BLOCK_N][D], unsigned long long* staged,
                                            unsigned long long* unstaged, const CUtensorMap* map,
                                            int pos, int key_tile, int hk, int b, int k_start) {
    const int st = pos % KV_FP8_STAGED;
    mbar_wait(&unstaged[st], ((pos / KV_FP8_STAGED) & 1) ^ 1);
    mbar_arrive_expect_bytes(&staged[st], BLOCK_N * D);
    tma_load_4d(&stage[st][0][0], map, &staged[st], 0, k_start + key_tile * BLOCK_N, hk, b);
}
// Four e4m3 values (bytes 0-3 of w, byte 0 the first column) → four 16-bit elements, two per word
// as pack2 makes them (the first in the low half). Every e4m3 value is exact in both 16-bit types.
//   fp16: cvt.rn.f16x2.e4m3x2 widens two at a time (sm_89 and later);
//   bf16: no such instruction on sm_90, so the bits are moved: e4m3 is s eeee mmm with exponent
//     bias 7, bf16 s eeeeeeee mmmmmmm with bias 127. prmt puts each byte in the low half of a
//     16-bit lane with its sign copied through the high half (selector nibbles 8-B), a shift by 4
//     puts eeee mmm under bf16's exponent and mantissa fields, and the mask keeps them and one
//     copy of the sign in bit 15: the bf16 of value·2^-120, exactly (subnormals too: e4m3's
//     0.mmm·2^-6 lands on bf16's 0.mmm·2^-126). One bf16x2 multiply by 2^120 (0x7B80), exact, gives
//     the value. (e4m3's NaN, 0x7F, would come out as 480; a cache holds no NaN.)
//   KV_FP8_FOLD (bf16): no multiply; the consumers multiply each work tile's descales by 2^120
//     instead (two float multiplies a work tile against two bf16x2 multiplies per four values),
//     in every work tile whose descales leave room for it (folds); the others' tiles are widened
//     with the multiply, as without the switch.
#define KV_FOLD __int_as_float(0x7B800000)  // 2^120: what widen4<true> leaves out of each bf16 value
// Whether a work tile's bf16 widening leaves its 2^120 to the descales: where the key's descale
// times the call's scale (log2 units) and the value's descale are both below 2^7 in magnitude, so
// that neither folded factor comes near float's 2^128 (a descale is amax / 448: |v| amax below
// 57,344). Producer and consumers decide it from the same three floats. NaN and ±inf: no.
__device__ __forceinline__ bool folds(float call_scale_log2, float kd, float vd) {
#if KV_FP8_FOLD && defined(ELEM_BF16)
    return fabsf(call_scale_log2 * kd) < 128.0f && fabsf(vd) < 128.0f;
#else
    (void)call_scale_log2, (void)kd, (void)vd;
    return false;  // fp16's widening is exact as it is: nothing to fold
#endif
}
template <bool FOLD>
__device__ __forceinline__ uint2 widen4(unsigned w) {
    uint2 r;
#ifdef ELEM_BF16
    unsigned lo, hi;
    asm("prmt.b32 %0, %1, 0, 0x9180;" : "=r"(lo) : "r"(w));  // bytes b0, sign(b0), b1, sign(b1)
    asm("prmt.b32 %0, %1, 0, 0xB3A2;" : "=r"(hi) : "r"(w));  // bytes b2, sign(b2), b3, sign(b3)
    lo = (lo << 4) & 0x87F087F0u;
    hi = (hi << 4) & 0x87F087F0u;
    if (FOLD) {  // value·2^-120 as it is: k_descale and v_descale take the 2^120 (KV_FOLD)
        r.x = lo, r.y = hi;
    } else {
        asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(r.x) : "r"(lo), "r"(0x7B807B80u));
        asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(r.y) : "r"(hi), "r"(0x7B807B80u));
    }
#else
    asm("{\n .reg .b16 lo, hi;\n mov.b32 {lo, hi}, %2;\n"
        " cvt.rn.f16x2.e4m3x2 %0, lo;\n cvt.rn.f16x2.e4m3x2 %1, hi;\n}\n" : "=r"(r.x), "=r"(r.y) : "r"(w));
#endif
    return r;
}
// One staged tile (BLOCK_N rows of D e4m3 bytes) widened into its ring buffer by the producer's
// warps 1-3. Thread i takes 16-byte chunk c = i % (D/8) (8 elements) of rows i / (D/8), then every
// WIDEN_THREADS / (D/8)-th row after it (6 at D128, 12 at D64): the chunk lands in column block
// c / 8 at chunk (c % 8) ^ (row % 8), the copy engine's 128-byte swizzle that the consumers'
// descriptors describe. A warp's 32 chunks are consecutive in the staged tile: its 8-byte loads
// read 256 contiguous bytes, and each quarter of its 16-byte stores one whole swizzled row (all 8
// bank groups), so neither conflicts. Each thread makes its stores visible to the tensor cores
// (fence.proxy.async) and arrives on `full` (WIDEN_THREADS arrivals complete it).
// KV_FP8_WIDE: 16 bytes of a row a thread (LDS.128, half the loads), widened into two 16-byte
// chunks of the ring; the column block of both is the same (chunks 2c and 2c + 1 of eight).
template <bool FOLD>
__device__ __forceinline__ void widen_store(unsigned char* to, unsigned row, unsigned chunk, unsigned w0, unsigned w1) {
    const uint2 lo = widen4<FOLD>(w0), hi = widen4<FOLD>(w1);
    *reinterpret_cast<uint4*>(to + 128 * row + 16 * ((chunk % 8) ^ (row % 8))) = make_uint4(lo.x, lo.y, hi.x, hi.y);
}
template <bool FOLD>
__device__ __forceinline__ void widen_tile(const unsigned char (*src)[D], elem_t (*dst)[BLOCK_N][64],
                                           unsigned long long* staged, unsigned long long* unstaged, unsigned staged_parity,
                                           unsigned long long* empty, unsigned long long* full, unsigned ring_parity) {
    constexpr int BYTES = KV_FP8_WIDE ? 16 : 8;  // e4m3 bytes of a row a thread loads at once
    constexpr int CHUNKS = D / BYTES, STEP = WIDEN_THREADS / CHUNKS;  // chunks per row; rows per step
    static_assert(WIDEN_THREADS % CHUNKS == 0, "each thread keeps its chunk of every row it widens");
    const unsigned i = threadIdx.x - 32, c = i % CHUNKS;
    const unsigned char* const from = &src[i / CHUNKS][BYTES * c];
    // the ring row's 16-byte chunks it writes: c (8 bytes loaded), or 2c and 2c + 1 (16), in one column block
    unsigned char* const to = reinterpret_cast<unsigned char*>(&dst[(BYTES / 8) * c / 8][0][0]);
    mbar_wait(empty, ring_parity ^ 1);  // the consumers are done with this ring buffer
    mbar_wait(staged, staged_parity);
    // The loads of a batch of rows are issued before the stores of the batch before: the compiler
    // may not move a load of the staging buffer above a store to the ring (it cannot tell that they
    // do not overlap), and a loop of load, widen, store ran each row's shared-memory round trip one
    // after another (1.5-1.7 TB/s of e4m3 on the H200, whatever the staging depth).
    constexpr int ROWS_EACH = (BLOCK_N + STEP - 1) / STEP;  // rows a thread widens, at most
    // rows loaded ahead: as many bytes in flight with 16-byte loads (two blocks per SM: the producer's
    // 64 registers spilled 36 bytes at D128 with two 16-byte rows)
    constexpr int BATCH = BLOCKS_PER_SM == 1 ? (KV_FP8_WIDE ? 2 : 4) : (KV_FP8_WIDE ? 1 : 2);
    const unsigned row0 = i / CHUNKS;
#if KV_FP8_WIDE
    using chunk_t = uint4;
#else
    using chunk_t = uint2;
#endif
    auto load = [&](chunk_t (&x)[BATCH], int b0) {
#pragma unroll
        for (int b = 0; b < BATCH; ++b)
            if (b0 + b < ROWS_EACH && row0 + (b0 + b) * STEP < BLOCK_N)
                x[b] = *reinterpret_cast<const chunk_t*>(from + (b0 + b) * STEP * D);
    };
    chunk_t x[BATCH], y[BATCH];
    load(x, 0);
#pragma unroll
    for (int b0 = 0; b0 < ROWS_EACH; b0 += BATCH) {
        if (b0 + BATCH < ROWS_EACH) load(y, b0 + BATCH);  // the next batch's loads, in flight
#pragma unroll
        for (int b = 0; b < BATCH; ++b) {
            const unsigned row = row0 + (b0 + b) * STEP;
            if (b0 + b < ROWS_EACH && row < BLOCK_N) {
#if KV_FP8_WIDE
                widen_store<FOLD>(to, row, 2 * c, x[b].x, x[b].y);
                widen_store<FOLD>(to, row, 2 * c + 1, x[b].z, x[b].w);
#else
                const uint2 lo = widen4<FOLD>(x[b].x), hi = widen4<FOLD>(x[b].y);
                *reinterpret_cast<uint4*>(to + 128 * row + 16 * ((c % 8) ^ (row % 8))) = make_uint4(lo.x, lo.y, hi.x, hi.y);
#endif
            }
        }
#pragma unroll
        for (int b = 0; b < BATCH; ++b) x[b] = y[b];
    }
    mbar_arrive(unstaged);  // this thread's loads are done: the copy engine may refill the staging buffer
    fence_proxy_async();    // generic-proxy writes, read next by wgmma
    mbar_arrive(full);
}
#endif

// A block's work tile: BLOCK_M query rows of one (batch, head) — with PACK_GQA the G·Sq rows of
// one (batch, K/V head) — and one of n_splits ranges of its key tiles: key tiles t0 …
// t0 + n_tiles − 1. Work w is split w % n_splits of query block (w / n_splits) % n_qb of head
// w / (n_splits·n_qb); causal work starts with the heaviest query block of each head (and a work
// queue hands its last tiles out in another order: stages/work_queue.cuh). The host
// picks per_split so that no range is empty for the longest keys (and n_splits = 1 with causal
// masking); a shorter sequence's ranges past its end, and query blocks past its last query,
// have n_tiles = 0.
// Where batch entry b's rows are (Seqs): [B, H, S, D] tensors, all Sq queries and Sk keys; or
// packed sequences (cu_q non-null: [1, H, total, D] views, sequence b is rows cu_q[b] …
// cu_q[b + 1] − 1 of q and cu_k[b] … of k and v; Sq, Sk are then the longest lengths); used_k,
// if non-null, cuts entry b's keys to its first used_k[b] (decoding against caches of
// different lengths, FlashAttention's seqused_k). Only the SEQS build reads them: with none, the
// [B, H, S, D] build's lengths stay the kernel's arguments (the build that always read them
// recorded 3-6% slower at B1 H8 S512 and B16 H16 S2048 D64: 8a2314b's record against
// 511f4c1's). Causal (stages/attention.cuh): query i of a
// sequence sees its keys j <= i + diag, diag = 0 (top-left) or len_k − len_q (bottom-right).
// WINDOW: win_left and win_right, finite (the host makes an unbounded side reach every key).
struct Seqs {
    const int *cu_q, *cu_k, *used_k;
    int Sq, Sk, causal;
#if WINDOW
    int win_left, win_right;
#endif
};
// Division by a number fixed for the launch (the splits, query blocks per head, heads, group) as a
// multiply-high, an add and a shift (Granlund and Montgomery's magic number, exact for 0 <= n < 2^31),
// made once per thread. A work tile's coordinates were four dependent integer divisions, each ~20
// instructions around a MUFU.RCP, at every work tile's start and again at its end: there Nsight
// Compute found the consumers' warps waiting at S 512 (results/logs/2026-11-26-f942a3b-h100). Making
// the magic takes a 64-bit division: the consumers make theirs while their first Q is being copied;
// the producer, whose coordinates are worked out a work tile ahead, divides.
struct Divisor {
    int d;
    unsigned m;
    int s;
    __device__ __forceinline__ void make(int d_) {
        d = d_;
        s = d_ > 1 ? 32 - __clz(d_ - 1) : 0;
        m = (unsigned)((((1ull << s) - (unsigned long long)d_) << 32) / (unsigned long long)d_) + 1u;
    }
    __device__ __forceinline__ int div(int n) const {
        return (int)((__umulhi((unsigned)n, m) + (unsigned)n) >> s);
    }
};
struct PlainDivisor {  // the producer's: the compiler's division
    int d;
    __device__ __forceinline__ void make(int d_) { d = d_; }
    __device__ __forceinline__ int div(int n) const { return n / d; }
};
// The divisors of a work index: splits, query blocks per head, heads (K/V heads with PACK_GQA),
// the GQA group, and (PACK_GQA) Sq, which splits a block row into head and query.
template <class Div>
struct WorkDivs {
    Div splits, qb, heads, group, sq;
    __device__ __forceinline__ WorkDivs(int n_splits, int n_qb, int H, int group_, int Sq) {
        splits.make(n_splits);
        qb.make(n_qb);
        heads.make(PACK_GQA ? H / group_ : H);
        group.make(group_);
        sq.make(PACK_GQA ? Sq : 1);
    }
};
struct Work {
    int b, h, hk, q0, split, t0, n_tiles;
    int q_start, k_start, len_q, len_k, diag, bmap;  // bmap: the batch coordinate of the tensor maps
};
template <class Div>
__device__ __forceinline__ Work work_tile(int w, const WorkDivs<Div>& dv, const Seqs& sq, int per_split) {
    Work t;
    const int ws = dv.splits.div(w);
    t.split = w - ws * dv.splits.d;
    const int bh = dv.qb.div(ws);  // (batch, head), or (batch, K/V head) with PACK_GQA
    const int qb_in = ws - bh * dv.qb.d;
    const int qb = sq.causal ? dv.qb.d - 1 - qb_in : qb_in;
    t.b = dv.heads.div(bh);
    const int hh = bh - t.b * dv.heads.d;
    if (PACK_GQA) { t.hk = hh; t.h = t.hk * dv.group.d; }  // t.h: the group's first query head
    else { t.h = hh; t.hk = dv.group.div(t.h); }
    t.q0 = qb * BLOCK_M;
    if (SEQS && sq.cu_q != nullptr) {
        t.q_start = sq.cu_q[t.b], t.len_q = sq.cu_q[t.b + 1] - t.q_start;
        t.k_start = sq.cu_k[t.b], t.len_k = sq.cu_k[t.b + 1] - t.k_start;
        t.bmap = 0;
    } else {
        t.q_start = 0, t.len_q = sq.Sq, t.k_start = 0, t.len_k = sq.Sk, t.bmap = t.b;
    }
    if (SEQS && sq.used_k != nullptr) t.len_k = min(max(sq.used_k[t.b], 0), t.len_k);
    t.diag = sq.causal == 2 ? t.len_k - t.len_q : 0;
    const int rows_end = PACK_GQA ? t.len_q : min(t.q0 + BLOCK_M, t.len_q);  // one past the block's last query
    const int n_keys = rows_end <= t.q0 ? 0  // no query here (PACK_GQA: q0 = 0)
                       : sq.causal ? max(0, min(t.len_k, rows_end + t.diag)) : t.len_k;  // causal: none past the diagonal
#if WINDOW
    // The block's keys: from its first row's left edge to its last row's right edge (rows q0 …
    // rows_end − 1 at key positions + len_k − len_q), within the causal ones; the key tiles
    // before the first are skipped, and the splits (split-KV) divide the tiles from there on.
    const int wdiag = t.len_k - t.len_q;
    const int w_end = max(0, min(n_keys, rows_end + wdiag + sq.win_right));
    const int first_tile = w_end == 0 ? 0 : max(0, t.q0 + wdiag - sq.win_left) / BLOCK_N;
    t.t0 = first_tile + t.split * per_split;
    t.n_tiles = max(0, min((w_end + BLOCK_N - 1) / BLOCK_N, t.t0 + per_split) - t.t0);
#else
    t.t0 = t.split * per_split;
    t.n_tiles = max(0, min((n_keys + BLOCK_N - 1) / BLOCK_N, t.t0 + per_split) - t.t0);
#endif
    return t;
}

// PAGE_SIZE: the pages of key tile `key_tile` of work tile t (see load_tile). The ids are read
// unconditionally, the index clamped into the entry's table row, and only then those past the
// entry's last used page (from t.len_k, itself a read of used_k) replaced by -1: the table's read
// does not wait for used_k's. Without PAGE_SIZE: nothing.
__device__ __forceinline__ Pages tile_pages(const PageTable& pt, const Work& t, int key_tile) {
#if PAGE_SIZE
    Pages pg;
    const int key0 = key_tile * BLOCK_N, first = key0 / PAGE_SIZE;
    const int last = (t.len_k - 1) / PAGE_SIZE;  // the last used page (a tile exists only when len_k > 0)
    const int* const row = pt.table + (size_t)t.b * pt.max_pages;
    pg.row = PAGE_SIZE > BLOCK_N ? key0 % PAGE_SIZE : 0;
#pragma unroll
    for (int i = 0; i < TILE_PAGES; ++i) {
        const int id = __ldg(row + min(first + i, pt.max_pages - 1));
        pg.id[i] = first + i <= last ? id : -1;
    }
    return pg;
#else
    return {};
#endif
}

// PAGE_IDS_AHEAD (small pages): the producer copies key tile j's ids into shared memory with
// cp.async (4 bytes each, index clamped into the row as in tile_pages) PAGE_IDS_AHEAD tiles before
// it issues tile j's copies, one cp.async group per key tile (empty past the work tile's last tile),
// and before tile j waits for all but the latest PAGE_IDS_AHEAD − 1 groups — tile j's — then reads
// the ids from shared memory (page_ids_at). No register waits on a table read across the loop:
// the register read-ahead one tile ahead (tile_pages) stalls the producer on its id loads
// (R2UR of the loaded ids) whenever a table read takes longer than the wait for a free buffer.
#if PAGE_IDS_AHEAD
__device__ __forceinline__ void fetch_page_ids(int* slot, const PageTable& pt, const Work& t, int key_tile, bool any) {
    if (any) {
        const int first = key_tile * BLOCK_N / PAGE_SIZE;
        const int* const row = pt.table + (size_t)t.b * pt.max_pages;
#pragma unroll
        for (int i = 0; i < TILE_PAGES; ++i)
            asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n"
                         :: "r"((unsigned)__cvta_generic_to_shared(slot + i)), "l"(row + min(first + i, pt.max_pages - 1))
                         : "memory");
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
__device__ __forceinline__ Pages page_ids_at(const int* slot, const Work& t, int key_tile) {
    asm volatile("cp.async.wait_group %0;\n" :: "n"(PAGE_IDS_AHEAD - 1) : "memory");
    Pages pg;
    const int key0 = key_tile * BLOCK_N, first = key0 / PAGE_SIZE;
    const int last = (t.len_k - 1) / PAGE_SIZE;
    pg.row = PAGE_SIZE > BLOCK_N ? key0 % PAGE_SIZE : 0;
#pragma unroll
    for (int i = 0; i < TILE_PAGES; ++i) pg.id[i] = first + i <= last ? slot[i] : -1;
    return pg;
}
#endif

// ---- the consumers' products ----------------------------------------------------------------
// Descriptor offsets (in the 16-byte units of the start-address field) of k-step kk (16 of D):
// within a 128-byte row, +32 bytes per step; past 64 columns, the next column block.
template <int ROWS>
__device__ __forceinline__ unsigned long long k_step(int kk) {
    return (unsigned long long)(((kk / 4) * ROWS * 128 + (kk % 4) * 32) >> 4);
}
// S = Q·Kᵀ: D/16 wgmma of 64 × BLOCK_N × 16.
__device__ __forceinline__ void issue_qk(float (&s)[BLOCK_N / 2], unsigned long long q_desc,
                                         unsigned long long k_desc) {
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
        Wgmma<BLOCK_N>::ss(s, q_desc + k_step<BLOCK_M>(kk), k_desc + k_step<BLOCK_N>(kk), kk > 0);
    wgmma_commit();
}
// O += P·V: BLOCK_N/16 wgmma of 64 × D × 16; step t reads V rows 16t … 16t + 15 (2048 bytes on).
// A work tile's first P·V (fresh) writes O instead of adding to it: O needs no zeroing (nor
// rescaling) before it, and its registers hold nothing between work tiles (zeros kept live
// across a work tile's start spilled).
__device__ __forceinline__ void issue_pv(float (&o)[PV_N / 2], const unsigned (&p)[BLOCK_N / 16][4],
                                         unsigned long long v_desc, bool fresh) {
    wgmma_fence();
#pragma unroll
    for (int t = 0; t < BLOCK_N / 16; ++t) Wgmma<PV_N>::rs(o, p[t], v_desc + ((t * 16 * 128) >> 4), t > 0 || !fresh);
    wgmma_commit();
}

// ---- the softmax, on S where wgmma left it ------------------------------------------------------
// Thread t of warp w holds rows r0 = 16w + t/4 and r0 + 8 of its warpgroup's 64, columns
// 8n + 2(t%4) and +1 of each 8-column slice n: s[4n], s[4n+1] in row r0, s[4n+2], s[4n+3] in
// row r0 + 8. The four threads of a row combine with two shuffles. m holds each row's max of
// the raw scores, l this thread's share of its row sum; `scale_log2` > 0. WINDOW: qpos holds each
// row's last visible key (causal = true) and qlo its first.
template <bool MASK>
__device__ __forceinline__ void softmax_tile(float (&s)[BLOCK_N / 2], float (&m)[2], float (&l)[2],
                                             float (&alpha)[2], int key0, const int (&qpos)[2], int Sk,
                                             bool causal, float scale_log2, const int (&qlo)[2]) {
    const int lane = threadIdx.x % 32;
    if (MASK) {
        // Key key0 + 8n + 2(lane % 4) + (e & 1) is visible to a row of query position qpos when
        // it is < Sk and (causal) <= qpos: one compare per score against a per-row limit on the
        // compile-time part 8n + (e & 1).
        const int first = key0 + 2 * (lane % 4);
        const int limit[2] = {(causal ? min(Sk - 1, qpos[0]) : Sk - 1) - first,
                              (causal ? min(Sk - 1, qpos[1]) : Sk - 1) - first};
#if WINDOW
        // and (WINDOW) >= qlo: a second compare per score, in the tiles that cut a window only
        const int lowest[2] = {qlo[0] - first, qlo[1] - first};
#pragma unroll
        for (int n = 0; n < BLOCK_N / 8; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                if (8 * n + (e & 1) > limit[e >> 1] || 8 * n + (e & 1) < lowest[e >> 1]) s[4 * n + e] = NEG_INF;
#else
#pragma unroll
        for (int n = 0; n < BLOCK_N / 8; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                if (8 * n + (e & 1) > limit[e >> 1]) s[4 * n + e] = NEG_INF;
#endif
    }
    float mx[2] = {m[0], m[1]};
#pragma unroll
    for (int n = 0; n < BLOCK_N / 8; ++n) {
        mx[0] = fmaxf(mx[0], fmaxf(s[4 * n], s[4 * n + 1]));
        mx[1] = fmaxf(mx[1], fmaxf(s[4 * n + 2], s[4 * n + 3]));
    }
    float base[2], sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
#if LAZY_RESCALE >= 0
        // Keep the running max unless this tile's exceeds it by more than LAZY_RESCALE in the
        // exponent's scaled log2 units: P and l then grow up to 2^LAZY_RESCALE instead of
        // 1, and O and l, which share the max, stay exact. A kept max gives alpha = 1 exactly.
        if (!(mx[r] * scale_log2 > m[r] * scale_log2 + float(LAZY_RESCALE))) mx[r] = m[r];
        base[r] = mx[r] == NEG_INF ? 0.0f : mx[r] * scale_log2;
        alpha[r] = mx[r] == m[r] ? 1.0f : fast_exp2(m[r] * scale_log2 - base[r]);
#else
        base[r] = mx[r] == NEG_INF ? 0.0f : mx[r] * scale_log2;  // a row with nothing visible yet
        alpha[r] = fast_exp2(m[r] * scale_log2 - base[r]);       // 0 on the first tile (m = −∞)
#endif
        m[r] = mx[r];
    }
#pragma unroll
    for (int n = 0; n < BLOCK_N / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const float x = fmaf(s[4 * n + e], scale_log2, -base[e >> 1]);
            // EXP2_POLY_EIGHTHS of every 8 column slices take the polynomial: fewer MUFU.EX2 where
            // that unit, not the tensor cores, would set the pace.
            s[4 * n + e] = n % 8 < EXP2_POLY_EIGHTHS ? poly_exp2(x) : fast_exp2(x);
            sum[e >> 1] += s[4 * n + e];
        }
#pragma unroll
    for (int r = 0; r < 2; ++r) l[r] = l[r] * alpha[r] + sum[r];
}
__device__ __forceinline__ void rescale(float (&o)[PV_N / 2], const float (&alpha)[2]) {
#if LAZY_RESCALE >= 0
    // A warp's 16 rows kept their maxima: nothing to scale (one vote, warp-uniform branch).
    if (!__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) return;
#endif
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
        o[4 * n] *= alpha[0]; o[4 * n + 1] *= alpha[0];
        o[4 * n + 2] *= alpha[1]; o[4 * n + 3] *= alpha[1];
    }
}
// P in 16 bits: the accumulator slices 2t and 2t + 1 are exactly the A fragment of k-step t.
__device__ __forceinline__ void to_operand(const float (&s)[BLOCK_N / 2], unsigned (&p)[BLOCK_N / 16][4]) {
#pragma unroll
    for (int t = 0; t < BLOCK_N / 16; ++t)
#pragma unroll
        for (int r = 0; r < 4; ++r) p[t][r] = pack2(s[8 * t + 2 * r], s[8 * t + 2 * r + 1]);
}

// ---- ping-pong: consumer c issues its products (PINGPONG=1) or runs its softmax (PINGPONG=2) only
// on its turn, then passes the turn on. take_turn/give_turn are the turn itself; turn_begin and
// turn_end mark the products, softmax_begin and softmax_end the softmax: each pair takes the turn
// only in its own mode.
__device__ __forceinline__ void take_turn(int c) { named_bar_sync(TURN_BAR + c, 256); }
__device__ __forceinline__ void turn_begin(int c) {
    if (PINGPONG == 1) take_turn(c);
}
// The turns go round across a block's work tiles: the last consumer's final turn of one work
// tile passes to consumer 0's first of the next, so consumer 0 starts it as soon as its operands
// are in, not after the last consumer's epilogue (a persistent block at S 512 waited 2-4k clocks
// per work tile there). Every consumer takes as many turns per work tile as the others.
__device__ __forceinline__ void give_turn(int c) { named_bar_arrive(TURN_BAR + (c + 1) % CONSUMERS, 256); }
__device__ __forceinline__ void turn_end(int c) {
    if (PINGPONG == 1) give_turn(c);
}
__device__ __forceinline__ void softmax_begin(int c) {
    if (PINGPONG == 2) take_turn(c);
}
__device__ __forceinline__ void softmax_end(int c) {
    if (PINGPONG == 2) give_turn(c);
}
// Turns per key tile: one per softmax (PINGPONG=2); with the products' turns, one per issue — S
// and the previous P·V together with INTRA_OVERLAP (plus one for the last P·V per work tile),
// else S and P·V apart.
constexpr int TILE_TURNS = PINGPONG == 2 || INTRA_OVERLAP ? 1 : 2;
// A warp tells the producer it is done with a buffer (the empty barriers count 4 warps ×
// CONSUMERS arrivals).
__device__ __forceinline__ void release(unsigned long long* empty) {
    __syncwarp();
    if (threadIdx.x % 32 == 0) mbar_arrive(empty);
}

// The Q buffer is released by every consumer thread, not one per warp: with DYNAMIC_WORK each
// thread has also read sm.work, which the producer overwrites once Q is released, and its own
// arrival (a release) orders that read before the overwrite. (A warp's __syncwarp and one
// lane's arrival order it too, but compute-sanitizer's racecheck does not follow that chain:
// it reported the overwrite at the queue's end as a race.)
__device__ __forceinline__ void release_q(Smem& sm, int qs) { mbar_arrive(&sm.q_empty[qs]); }

// ---- split-KV: a work tile's partial results weighed into its output, in its last block ----------
// Split i saw keys whose exponentials sum to 2^lse_i (scaled log2 units) and wrote O_i = their
// weighted mean of V. A row's output is Σ w_i·O_i / Σ w_i with w_i = 2^(lse_i − max lse).
// The last block of a work tile combines its few rows so, in the same launch. Each thread takes
// four adjacent columns of one row (`part`: row part / (D/4), columns 4·(part % (D/4)) …) and
// reads its splits eight at a time, the log2-sum-exps and the partial columns together, then
// weighs them against the running max (as the online softmax does): one L2 round trip per eight
// splits for the whole work tile. (Before, one warp per row read a row's log2-sum-exps, then its
// partial rows, one row after another: at B1 H8/1 D64, 8 rows on 4 warps, four round trips.)
// Rows are read from L2 (__ldcg): other SMs wrote them.
// SINKS: the row's sink (sink_log2 = σ·log2 e, −∞ for none) is one more partial, of weight
// 2^(sink_log2 − max) and O zero: the running max and weight start from it.
__device__ __forceinline__ void combine_part(const float* __restrict__ o_part, const float* __restrict__ lse_part,
                                             elem_t* __restrict__ out, size_t row, int col, int n_splits,
                                             float sink_log2 = NEG_INF) {
    const float* const lse = lse_part + row * n_splits;
    const float* const o = o_part + row * n_splits * D + col;
    float mx = SINKS ? sink_log2 : NEG_INF, wsum = SINKS && sink_log2 != NEG_INF ? 1.0f : 0.0f;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int i0 = 0; i0 < n_splits; i0 += 8) {
        float l[8];
        float4 part[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) {  // every load of the eight first, then the arithmetic
            const bool in = i0 + j < n_splits;
            l[j] = in ? __ldcg(lse + i0 + j) : NEG_INF;
            part[j] = in ? __ldcg(reinterpret_cast<const float4*>(o + (size_t)(i0 + j) * D)) : make_float4(0, 0, 0, 0);
        }
        float m = mx;
#pragma unroll
        for (int j = 0; j < 8; ++j) m = fmaxf(m, l[j]);
        const float base = m == NEG_INF ? 0.0f : m;  // no split saw a key yet: weights 0
        const float carry = exp2f(mx - base);        // the sums so far, rescaled to the new max
        wsum *= carry;
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[e] *= carry;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const float w = exp2f(l[j] - base);
            wsum += w;
            acc[0] = fmaf(w, part[j].x, acc[0]);
            acc[1] = fmaf(w, part[j].y, acc[1]);
            acc[2] = fmaf(w, part[j].z, acc[2]);
            acc[3] = fmaf(w, part[j].w, acc[3]);
        }
        mx = m;
    }
    const float inv_total = 1.0f / fmaxf(wsum, 1e-30f);
    elem_t* const dst = out + row * D + col;
    *reinterpret_cast<unsigned*>(dst) = pack2(acc[0] * inv_total, acc[1] * inv_total);
    *reinterpret_cast<unsigned*>(dst + 2) = pack2(acc[2] * inv_total, acc[3] * inv_total);
}

// Programmatic dependent launch (PDL, sm_90): split-KV's combine kernel is launched so that it
// may be scheduled while this kernel still runs (stages/stage6.py: PDL_COMBINE), and waits in
// griddep_wait until this grid has finished and its partial rows are visible. Every block lets
// it go at once (griddep_launch_dependents; a no-op when no such launch follows): its blocks
// take their SM slots and wait there, so what the stream would spend between the two kernels
// (the end of this grid, the launch of the next, its blocks' start) overlaps this one's work.
// This kernel may be launched so too (PDL_KERNEL), after whatever kernel came before it in the
// stream: its blocks then set up their barriers and prefetch the tensor maps, and wait
// (griddep_wait, before the first read or write of global memory) for that kernel to finish.
// griddep_wait returns at once in a grid launched without PDL (stages/pdl.cuh).

// A build with a model variant takes its arguments after the others (cap_mul, cap_log2: see
// cap_scores; win_left, win_right: the window, made finite by the host; sinks: float32 [H] or
// null); a build without one has today's signature.
#if SOFTCAP || WINDOW || SINKS
#define VARIANT_PARAMS , float cap_mul, float cap_log2, int win_left, int win_right, const float* __restrict__ sinks
#else
#define VARIANT_PARAMS
#endif
// PAGE_SIZE: the page table (int32 [B][max_pages]) and its row length, after those.
#if PAGE_SIZE
#define PAGED_PARAMS , const int* __restrict__ page_table, int max_pages
#else
#define PAGED_PARAMS
#endif
// KV_FP8: the descales, float32 [B][H_kv] each, after those.
#if KV_FP8
#define FP8_PARAMS , const float* __restrict__ k_descale, const float* __restrict__ v_descale
#else
#define FP8_PARAMS
#endif
extern "C" __global__ void __launch_bounds__(THREADS, BLOCKS_PER_SM)
attention_wgmma(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
                const __grid_constant__ CUtensorMap v_map, const __grid_constant__ CUtensorMap o_map,
                elem_t* __restrict__ out,
                float* __restrict__ o_part, float* __restrict__ lse_part, int Sq, int Sk, int H, int group,
                float scale_log2, int causal, int n_work, int n_splits, int per_split, int tail_heads, long long* timeline,
                int* work_queue, int* split_counts, const int* cu_q, const int* cu_k, const int* used_k,
                float* __restrict__ lse_out VARIANT_PARAMS PAGED_PARAMS FP8_PARAMS) {
#if WINDOW
    const Seqs seqs{cu_q, cu_k, used_k, Sq, Sk, causal, win_left, win_right};
#else
    const Seqs seqs{cu_q, cu_k, used_k, Sq, Sk, causal};
#endif
#if PAGE_SIZE
    const PageTable pages{page_table, max_pages};
#else
    const PageTable pages{};
#endif
    // Work tiles: (batch·head, query block) pairs, n_qb query blocks per head. A launch with
    // one block per work tile runs each once; a persistent launch (one block per SM) walks
    // work w = blockIdx.x, + gridDim.x, ...: the producer then fetches the next tile's Q and
    // K/V while the consumers still finish this one.
    const int n_qb = PACK_GQA ? 1 : (Sq + BLOCK_M - 1) / BLOCK_M;
    const int q_bytes = PACK_GQA ? ATOMS * Sq * group * 128 : Q_BYTES;  // the Q box, as TMA counts it
    extern __shared__ unsigned char smem_raw[];
    // wgmma's swizzled layout repeats every 1024 bytes: align the tiles to that. The offset is
    // added to the shared array itself, so the compiler still knows every access through `sm` is
    // to shared memory (STS, LDS); a pointer rebuilt from an integer is generic (ST, LD), and the
    // consumers' read of the work slot became a system-scope generic load.
    Smem& sm = *reinterpret_cast<Smem*>(smem_raw + ((1024u - (unsigned)__cvta_generic_to_shared(smem_raw) % 1024u) % 1024u));
    // The warpgroup index, read from lane 0: the same number, but now the compiler knows it is
    // the same in every lane of a warp. Everything computed from it (the consumer's rows of Q,
    // the wgmma descriptors, the ring positions) then lives in uniform registers, where wgmma
    // reads its descriptors: without this, ptxas builds each descriptor in ordinary registers
    // and copies it over (R2UR) before every wgmma, ~100 extra instructions per key tile at D128.
    const int wg = __shfl_sync(0xffffffffu, threadIdx.x / 128, 0);
    griddep_launch_dependents();
    if (threadIdx.x == 0) {
        for (int qs = 0; qs < Q_STAGES; ++qs) {
            mbar_init(&sm.q_full[qs], 1);
            mbar_init(&sm.q_empty[qs], 128 * CONSUMERS);  // every consumer thread: see release_q
        }
#if KV_FP8
        for (int st = 0; st < KV_FP8_STAGED; ++st) {
            mbar_init(&sm.k_staged[st], 1);  // the copy's bytes
            mbar_init(&sm.v_staged[st], 1);
            mbar_init(&sm.k_unstaged[st], WIDEN_THREADS);  // every widening thread's loads
            mbar_init(&sm.v_unstaged[st], WIDEN_THREADS);
        }
#endif
        for (int st = 0; st < STAGES; ++st) {
#if KV_FP8
            mbar_init(&sm.k_full[st], WIDEN_THREADS);  // every widening thread
            mbar_init(&sm.v_full[st], WIDEN_THREADS);
#else
            mbar_init(&sm.k_full[st], 1);
            mbar_init(&sm.v_full[st], 1);
#endif
            mbar_init(&sm.k_empty[st], 4 * CONSUMERS);
            mbar_init(&sm.v_empty[st], 4 * CONSUMERS);
        }
        mbar_init_fence();
        tma_prefetch_map(&q_map); tma_prefetch_map(&k_map); tma_prefetch_map(&v_map);
    }
    griddep_wait();  // the kernel before this one in the stream, when launched with PDL
    __syncthreads();

#if WARP_SPECIALIZED
    if (wg == 0) {  // ---- producer ----
        if (SETMAXNREG) regs_release<PRODUCER_REGS>();
        if (threadIdx.x == 0) {
            int pos = 0;  // ring position
            int count = 0;
            const WorkDivs<PlainDivisor> dv(n_splits, n_qb, H, group, Sq);
            auto work_q = [&](int w, int count) {  // the Q of work tile w, the block's count-th
                const Work t = work_tile(w, dv, seqs, per_split);
                load_q(sm, &q_map, count, t.q_start + t.q0, t.h, t.hk, t.bmap, w, q_bytes);
            };
            // The work queue's slot-th tile (stages/work_queue.cuh: the causal tail's order).
            // The consumers read the tile's index from its Q slot (sm.work).
            const int w0 = handed_out(blockIdx.x, n_work, n_qb, tail_heads, DYNAMIC_WORK);
            if (w0 < n_work) work_q(w0, 0);
            for (int w = w0, next; w < n_work; w = next, ++count) {
                // The next work tile: asked for now, its answer needed only at its Q's copy.
                next = DYNAMIC_WORK ? handed_out(atomicAdd(&work_queue[0], 1) + (int)gridDim.x, n_work, n_qb, tail_heads, DYNAMIC_WORK) : w + (int)gridDim.x;
                const Work t = work_tile(w, dv, seqs, per_split);
                long long* const stamps = (TIMELINE && blockIdx.x == 0) ? timeline : nullptr;
                (void)stamps;
                // The next work tile's Q: with two buffers right after this tile's first K and V
                // (its buffer was freed by the tile before), a whole work tile before it is
                // needed; with one, after this tile's copies (its S = Q·Kᵀ must finish first).
                // CARRY_PV: after the second K and V. The tile before is finished, and its Q buffer
                // freed, only after this tile's first softmax: waiting for it sooner would hold
                // back the second K, which the consumers need right then.
                bool next_q = next >= n_work;
                const int q_after = CARRY_PV && t.n_tiles > 1 ? 1 : 0;
#if PAGE_IDS_AHEAD
#pragma unroll
                for (int a = 0; a < PAGE_IDS_AHEAD; ++a)  // the first tiles' ids, a group each
                    fetch_page_ids(sm.page_ids[a], pages, t, t.t0 + a, a < t.n_tiles);
#else
                Pages pg = tile_pages(pages, t, t.t0);  // PAGE_SIZE: the first tile's pages (K's and V's)
#endif
                for (int j = 0; j < t.n_tiles; ++j, ++pos) {  // stamps: K, V copied; the waits before them
#if PAGE_IDS_AHEAD
                    const Pages pg = page_ids_at(sm.page_ids[j % PAGE_IDS_AHEAD], t, t.t0 + j);
#endif
                    STAMP(0, pos, 2);
#if KV_FP8  // into the staging buffers; warps 1-3 widen them into the ring (below)
                    load_staged(sm.k8, sm.k_staged, sm.k_unstaged, &k_map, pos, t.t0 + j, t.hk, t.bmap, t.k_start);
                    load_staged(sm.v8, sm.v_staged, sm.v_unstaged, &v_map, pos, t.t0 + j, t.hk, t.bmap, t.k_start);
#else
                    load_tile(sm.k, sm.k_full, sm.k_empty, &k_map, pos, t.t0 + j, t.hk, t.bmap, t.k_start, pg);
                    STAMP(0, pos, 0);
                    STAMP(0, pos, 3);
                    load_tile(sm.v, sm.v_full, sm.v_empty, &v_map, pos, t.t0 + j, t.hk, t.bmap, t.k_start, pg);
#endif
                    STAMP(0, pos, 1);
#if PAGE_IDS_AHEAD
                    // this slot's ids are in the copies above; refill it with tile j + PAGE_IDS_AHEAD's
                    fetch_page_ids(sm.page_ids[j % PAGE_IDS_AHEAD], pages, t, t.t0 + j + PAGE_IDS_AHEAD,
                                   j + PAGE_IDS_AHEAD < t.n_tiles);
#else
                    if (PAGE_SIZE && j + 1 < t.n_tiles) pg = tile_pages(pages, t, t.t0 + j + 1);  // read ahead
#endif
                    if (Q_STAGES >= 2 && !next_q && j == q_after) work_q(next, count + 1), next_q = true;
                }
                if (!next_q) work_q(next, count + 1);
            }
            if (DYNAMIC_WORK) {
                // No work left: say so through the Q slot (a plain arrival, no bytes), then count
                // this block out. The last block out resets the queue for the next launch: by then
                // every block has taken its last index, so nothing reads the counter any more.
                // A launch that stops part way cannot leave a count for a later one to read: a
                // fault on the device (a trap, an illegal address) ends the process's CUDA
                // context, and every later call in it fails instead of running.
                const int qs = count % Q_STAGES;
                mbar_wait(&sm.q_empty[qs], ((count / Q_STAGES) & 1) ^ 1);
                sm.work[qs] = n_work;
                mbar_arrive(&sm.q_full[qs]);
                __threadfence();  // this block's last take from the counter before its count-out
                if (atomicAdd(&work_queue[1], 1) == (int)gridDim.x - 1) {
                    atomicExch(&work_queue[0], 0);
                    atomicExch(&work_queue[1], 0);
                }
            }
        }
#if KV_FP8
        else if (threadIdx.x >= 32) {  // warps 1-3: the same work tiles and ring positions, widening
            const WorkDivs<PlainDivisor> dv(n_splits, n_qb, H, group, Sq);
            int pos = 0;
            for (int w = blockIdx.x; w < n_work; w += gridDim.x) {
                const Work t = work_tile(w, dv, seqs, per_split);
                const int kv = t.b * (H / group) + t.hk;  // the work tile's descales, as the consumers read them
                const bool fold = folds(scale_log2, __ldg(k_descale + kv), __ldg(v_descale + kv));
                for (int j = 0; j < t.n_tiles; ++j, ++pos) {
                    const int st = pos % STAGES, sst = pos % KV_FP8_STAGED;
                    const unsigned parity = (pos / STAGES) & 1, sparity = (pos / KV_FP8_STAGED) & 1;
                    if (fold) {
                        widen_tile<true>(sm.k8[sst], sm.k[st], &sm.k_staged[sst], &sm.k_unstaged[sst], sparity,
                                         &sm.k_empty[st], &sm.k_full[st], parity);
                        widen_tile<true>(sm.v8[sst], sm.v[st], &sm.v_staged[sst], &sm.v_unstaged[sst], sparity,
                                         &sm.v_empty[st], &sm.v_full[st], parity);
                    } else {
                        widen_tile<false>(sm.k8[sst], sm.k[st], &sm.k_staged[sst], &sm.k_unstaged[sst], sparity,
                                          &sm.k_empty[st], &sm.k_full[st], parity);
                        widen_tile<false>(sm.v8[sst], sm.v[st], &sm.v_staged[sst], &sm.v_unstaged[sst], sparity,
                                          &sm.v_empty[st], &sm.v_full[st], parity);
                    }
                }
            }
        }
#endif
        return;
    }
    if (SETMAXNREG) regs_claim<CONSUMER_REGS>();
#endif
    const WorkDivs<Divisor> dv(n_splits, n_qb, H, group, Sq);
    // ---- consumer c: query rows q0 + 64c … q0 + 64c + 63 of each work tile ----
    const int c = wg - WARP_SPECIALIZED, lane = threadIdx.x % 32, warp = (threadIdx.x / 32) % 4;
    const int role = c + 1;  // timeline row
    (void)role;
    // The softmax takes each row's max of the raw scores, so it needs scale > 0. For a
    // negative scale, s·scale = (−s)·|scale|: each work tile's Q rows get their sign flipped.
#if KV_FP8
    const float call_scale_log2 = scale_log2;  // times each work tile's k_descale (below)
    bool negate_q = false;
    float v_scale = 1.0f;
#else
    const bool negate_q = scale_log2 < 0.0f;
    scale_log2 = fabsf(scale_log2);
    // Scale 0 gives every visible key the same weight; a tiny positive scale does exactly that
    // in fp32 and keeps masked keys at −∞·scale = −∞ rather than 0·(−∞) = NaN.
    if (scale_log2 == 0.0f) scale_log2 = 1e-30f;
#endif
#if SOFTCAP
    scale_log2 = cap_log2;  // the scores become t = tanh(q·k·|scale| / c) (cap_scores), in units of c·log2 e
#endif
    auto k_desc = [&](int st) { return smem_desc(&sm.k[st][0][0][0], 0); };
    auto v_desc = [&](int st) { return smem_desc(&sm.v[st][0][0][0], BLOCK_N * 128); };

    long long* const stamps = (TIMELINE && blockIdx.x == 0) ? timeline : nullptr;
    (void)stamps;
    // This thread's two rows of work tile t, r = 0, 1: query position qpos[r] of head head[r]
    // (valid: the row exists). With PACK_GQA block row i is query i % Sq of head t.h + i / Sq.
    auto rows_of = [&](const Work& t, int (&qpos)[2], int (&head)[2], bool (&valid)[2]) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int i = 64 * c + 16 * warp + lane / 4 + 8 * r;
            if (PACK_GQA) {
                const int g = dv.sq.div(i);
                qpos[r] = i - g * Sq; head[r] = t.h + g; valid[r] = g < group && qpos[r] < t.len_q;
            } else {
                qpos[r] = t.q0 + i; head[r] = t.h; valid[r] = qpos[r] < t.len_q;
            }
        }
    };
    float o[PV_N / 2];
    unsigned p[BLOCK_N / 16][4];
    auto zero_o = [&]() {
#pragma unroll
        for (int i = 0; i < PV_N / 2; ++i) o[i] = 0.0f;
    };
    // A row's sum l (this thread's share) and max m → 1 / l and its log2-sum-exp, base + log2(l)
    // (the softmax's base is max·scale_log2), which split-KV's combine weighs by.
#if SINKS
    // SINKS: the row's sink σ (of its query head, read here at the work tile's end rather than
    // held in registers through it) joins the sum: l + 2^(σ·log2 e − base) with base =
    // m·scale_log2, the units l is kept in; the log-sum-exp, log2(2^base·l + 2^(σ·log2 e)), from
    // the larger of the two so that neither overflows. A row that saw no key: O = 0 (as without
    // sinks, and as the reference gives), its log-sum-exp the sink's alone. Split-KV blocks
    // (n_splits > 1) leave it out: the combine adds it once (combine_part, attention_combine_splits).
    auto close_rows = [&](float (&l)[2], const float (&m)[2], float (&inv_l)[2], float (&lse)[2], const Work& t) {
        int sq_pos[2], sq_head[2];
        bool sq_valid[2];
        rows_of(t, sq_pos, sq_head, sq_valid);
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
            l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
            const float sink = sinks != nullptr && sq_valid[r] && n_splits == 1 ? __ldg(sinks + sq_head[r]) * LOG2E : NEG_INF;
            if (m[r] == NEG_INF) {
                lse[r] = sink;
                inv_l[r] = 0.0f;
            } else {
                const float base = m[r] * scale_log2, top = fmaxf(base, sink);
                lse[r] = top + __log2f(l[r] * fast_exp2(base - top) + fast_exp2(sink - top));
                inv_l[r] = fast_rcp(l[r] + fast_exp2(sink - base));  // 2^(…) = +∞: 0, the sink takes all
            }
        }
    };
#else
    auto close_rows = [&](float (&l)[2], const float (&m)[2], float (&inv_l)[2], float (&lse)[2]) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
            l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
            lse[r] = m[r] == NEG_INF ? NEG_INF : m[r] * scale_log2 + __log2f(l[r]);
            inv_l[r] = l[r] > 0.0f ? fast_rcp(l[r]) : 0.0f;  // no key seen: zeros, as SDPA gives
        }
    };
#endif

    // ---- the end of work tile w (the block's count-th): O / l out, rows that do not exist
    // clipped; 4-byte stores of two elements. With n_splits > 1, this block's share in fp32
    // instead: O / l and the rows' log2-sum-exp, for the combine.
    auto finish = [&](int w, int count, const float (&inv_l)[2], const float (&lse)[2]) {
        const Work t = work_tile(w, dv, seqs, per_split);
        const int qs = count % Q_STAGES;
        int qpos[2], head[2];
        bool valid[2];
        rows_of(t, qpos, head, valid);
        if (O_TMA_STORE && n_splits == 1) {
            // O / l in 16 bits into this consumer's rows of its work tile's Q buffer (every
            // S = Q·Kᵀ is done), in the 128-byte swizzle the tensor maps describe: 16-byte chunk k
            // of a row lives at chunk k ^ (row % 8). Then one thread stores the 64 rows with the
            // copy engine, one box per 64 columns; it clips rows past the sequence's end. The
            // consumer goes on at once instead of issuing D/4 scattered 4-byte stores per thread
            // (measured at S 512: 2-3k clocks per work tile). The buffer is released to the
            // producer only once the copy has read it.
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const int row = 16 * warp + lane / 4 + 8 * r;  // of the consumer's 64
                unsigned char* const base = reinterpret_cast<unsigned char*>(&sm.q[qs][0][64 * c + row][0]);
#pragma unroll
                for (int n = 0; n < D / 8; ++n)
                    *reinterpret_cast<unsigned*>(base + (n / 8) * BLOCK_M * 128 + ((n % 8) ^ (row % 8)) * 16 + 4 * (lane % 4)) =
                        pack2(o[4 * n + 2 * r] * inv_l[r], o[4 * n + 2 * r + 1] * inv_l[r]);
            }
            fence_proxy_async();         // generic-proxy writes, read next by the copy engine
            named_bar_sync(1 + c, 128);  // the consumer's 64 rows are all there
            if (threadIdx.x % 128 == 0 && t.q0 + 64 * c < t.len_q) {
#pragma unroll
                for (int a = 0; a < ATOMS; ++a) tma_store_4d(&o_map, &sm.q[qs][a][64 * c][0], 64 * a, t.q0 + 64 * c, t.h, t.b);
                bulk_commit();
                bulk_wait_read();
            }
        }
        if (O_TMA_STORE) release_q(sm, qs);
        // What the backward needs (stage 8), when asked for (lse_out non-null, [B, H, Sq] rows,
        // one launch without splits): each row's log-sum-exp of the scaled scores in natural
        // units, −∞ for a row that saw no key.
        if (lse_out != nullptr && n_splits == 1 && lane % 4 == 0) {
#pragma unroll
            for (int r = 0; r < 2; ++r)
                if (valid[r]) lse_out[((size_t)t.b * H + head[r]) * Sq + qpos[r]] = lse[r] * 0.6931471805599453f;
        }
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            if (!valid[r] || (O_TMA_STORE && n_splits == 1)) continue;
            // The output's row: of [B, H, Sq], or of [total_q, H] for packed sequences.
            const size_t row = SEQS && cu_q != nullptr ? (size_t)(t.q_start + qpos[r]) * H + head[r]
                                               : ((size_t)t.b * H + head[r]) * Sq + qpos[r];
            if (n_splits == 1) {
                elem_t* const dst = out + row * D + 2 * (lane % 4);
#pragma unroll
                for (int n = 0; n < D / 8; ++n)
                    *reinterpret_cast<unsigned*>(dst + 8 * n) = pack2(o[4 * n + 2 * r] * inv_l[r], o[4 * n + 2 * r + 1] * inv_l[r]);
            } else {  // o_part [rows][n_splits][D], lse_part [rows][n_splits]
                float* const dst = o_part + (row * n_splits + t.split) * D + 2 * (lane % 4);
#pragma unroll
                for (int n = 0; n < D / 8; ++n)
                    *reinterpret_cast<float2*>(dst + 8 * n) = make_float2(o[4 * n + 2 * r] * inv_l[r], o[4 * n + 2 * r + 1] * inv_l[r]);
                if (lane % 4 == 0) lse_part[row * n_splits + t.split] = lse[r];
            }
        }
#if COMBINE_IN_BLOCK
        if (n_splits > 1 && split_counts != nullptr) {
            // The last of the work tile's blocks to get here combines its rows. Each thread's
            // partial rows are made visible to every SM (__threadfence) before the block counts
            // itself in; the block that counts last sees every other split's rows after its count
            // (the fence after it). It also sets the counter back to 0 for the next launch. (A
            // launch cut short leaves no counter behind that a later one could read: a fault on the
            // device ends the process's CUDA context, and every later call fails.)
            __threadfence();
            named_bar_sync(SPLIT_BAR, 128 * CONSUMERS);
            int* const count = split_counts + w / n_splits;
            if (threadIdx.x == 128 * WARP_SPECIALIZED) {  // the first consumer thread
                const bool last = atomicAdd(count, 1) == n_splits - 1;
                if (last) atomicExch(count, 0);
                sm.last_split = last;
            }
            named_bar_sync(SPLIT_BAR, 128 * CONSUMERS);
            if (sm.last_split) {
                __threadfence();
                const int rows = PACK_GQA ? group * Sq : BLOCK_M;
                for (int p = threadIdx.x - 128 * WARP_SPECIALIZED; p < rows * (D / 4); p += 128 * CONSUMERS) {
                    const int i = p / (D / 4);
                    int qp, hd;  // block row i: query qp of head hd (as rows_of)
                    if (PACK_GQA) {
                        const int g = dv.sq.div(i);
                        qp = i - g * Sq, hd = t.h + g;
                    } else {
                        qp = t.q0 + i, hd = t.h;
                    }
                    if (qp >= t.len_q) continue;
                    const size_t row = SEQS && cu_q != nullptr ? (size_t)(t.q_start + qp) * H + hd
                                                               : ((size_t)t.b * H + hd) * Sq + qp;
#if SINKS
                    combine_part(o_part, lse_part, out, row, 4 * (p % (D / 4)), n_splits,
                                 sinks != nullptr ? __ldg(sinks + hd) * LOG2E : NEG_INF);
#else
                    combine_part(o_part, lse_part, out, row, 4 * (p % (D / 4)), n_splits);
#endif
                }
            }
        }
#endif
    };

    // ---- CARRY_PV: a work tile's last O += P·V is not issued at its end but with the next work
    // tile's first S = Q·Kᵀ, in the same turn, and the next tile's first softmax runs while it is
    // in the tensor cores; only then is the tile finished (its O stored). Without it the tensor
    // cores wait at every work tile's end through the last P·V alone, the epilogue and the next
    // first S, which at S 512 is a fifth of a work tile. Kept meanwhile: P in p, O in o (already
    // rescaled), the ring position of its V, the work tile and its rows' 1 / l and lse.
    bool pend = false, pend_fresh = false;  // pend_fresh: it is its tile's only P·V
    // Its work tile is always the block's previous one, count − 1: in a fixed stride w − gridDim.x,
    // from the queue pend_w (fewer registers held across work tiles: three consumers have 160).
    int pend_pos = 0, pend_w = 0;
    int w = blockIdx.x, count = 0;  // the block's count-th work tile, w
    float pend_inv_l[2] = {0.0f, 0.0f}, pend_lse[2] = {NEG_INF, NEG_INF};
    auto settle_pending = [&]() {  // the pending P·V was issued: wait for it, release V, finish
        wgmma_wait<0>();
        fence_registers(o);
        fence_registers(p);
        release(&sm.v_empty[pend_pos % STAGES]);
        STAMP(role, pend_pos, 3);
        finish(DYNAMIC_WORK ? pend_w : w - (int)gridDim.x, count - 1, pend_inv_l, pend_lse);
        pend = false;
    };
    // One turn of its own: the pending P·V (if any) alone. Each branch issues and waits for its
    // own products: ptxas checks every path for an accumulator read while its wgmma may still
    // run, and serializes every wgmma of the kernel if one path (even one that never runs, as a
    // path through two separate tests of `pend` would be) has it.
    auto flush_alone = [&]() {
        if (pend) {
            mbar_wait(&sm.v_full[pend_pos % STAGES], (pend_pos / STAGES) & 1);
            turn_begin(c);
            issue_pv(o, p, v_desc(pend_pos % STAGES), pend_fresh);
            turn_end(c);
            settle_pending();
        } else {
            turn_begin(c);
            turn_end(c);
        }
    };

    int pos = 0;  // ring position, as the producer counts it
    if (PINGPONG && c == CONSUMERS - 1) named_bar_arrive(TURN_BAR, 256);  // consumer 0 goes first
    for (;; w += gridDim.x, ++count) {
        const int qs = count % Q_STAGES;  // this work tile's Q buffer
        if (DYNAMIC_WORK) {  // which work tile the producer took: published with its Q
            mbar_wait(&sm.q_full[qs], (count / Q_STAGES) & 1);
            // read by lane 0 and passed round: ptxas then knows w, and every count made from it,
            // is the same across the warp (as for wg above), and branches on it are uniform. The
            // three-consumer queue (whose producer kept its 32 registers) went 94.4 → 88.4 µs at
            // D64 causal S 512 (B32 H16, bf16; results/logs/2026-11-25-fd50989-call2 against
            // -18b9a4f-call3)
            w = __shfl_sync(0xffffffffu, *reinterpret_cast<volatile int*>(&sm.work[qs]), 0);
        }
        if (w >= n_work) break;
        const Work t = work_tile(w, dv, seqs, per_split);
        const int n_tiles = t.n_tiles;
        int qpos[2], head[2];
        bool valid[2];
        rows_of(t, qpos, head, valid);
#if KV_FP8
        // The true scores are q·(k_fp8·k_descale)·scale: the work tile's one K/V head (packed) has
        // one descale, which joins the softmax's scale as the call's scale did above (a negative
        // product flips Q's sign, 0 weighs every key alike); v_descale multiplies O (finish's 1/l).
        {
            const int kv = t.b * (H / group) + t.hk;
            const float kd = __ldg(k_descale + kv), vd = __ldg(v_descale + kv);
            const float fold = folds(call_scale_log2, kd, vd) ? KV_FOLD : 1.0f;  // as the widening warps chose
            scale_log2 = call_scale_log2 * kd * fold;
            negate_q = scale_log2 < 0.0f;
            scale_log2 = fabsf(scale_log2);
            if (scale_log2 == 0.0f) scale_log2 = 1e-30f;
            v_scale = vd * fold;
        }
#endif
#if !WARP_SPECIALIZED
        if (threadIdx.x == 0) {  // no producer: consumer 0's first thread starts the ring
            load_q(sm, &q_map, count, t.q_start + t.q0, t.h, t.hk, t.bmap, w, q_bytes);
            for (int j = 0; j < min(STAGES, n_tiles); ++j) {
                const Pages pg = tile_pages(pages, t, t.t0 + j);
                load_tile(sm.k, sm.k_full, sm.k_empty, &k_map, pos + j, t.t0 + j, t.hk, t.bmap, t.k_start, pg);
                load_tile(sm.v, sm.v_full, sm.v_empty, &v_map, pos + j, t.t0 + j, t.hk, t.bmap, t.k_start, pg);
            }
        }
#endif
        mbar_wait(&sm.q_full[qs], (count / Q_STAGES) & 1);
        const unsigned long long q_desc = smem_desc(&sm.q[qs][0][64 * c][0], 0);
        if (negate_q) {
#pragma unroll
            for (int a = 0; a < ATOMS; ++a) {
                uint4* rows = reinterpret_cast<uint4*>(&sm.q[qs][a][64 * c][0]);  // 64 rows × 8 chunks
                for (int i = threadIdx.x % 128; i < 64 * 8; i += 128)
                    rows[i] = make_uint4(rows[i].x ^ 0x80008000u, rows[i].y ^ 0x80008000u,
                                         rows[i].z ^ 0x80008000u, rows[i].w ^ 0x80008000u);
            }
            fence_proxy_async();          // generic-proxy writes, read next by wgmma
            named_bar_sync(1 + c, 128);   // the whole warpgroup's rows are flipped
        }
        // A tile needs masking if it reaches past the keys, or (causal) past this warpgroup's
        // first query position's diagonal (PACK_GQA: every head's rows start at query 0).
        const int first_row = PACK_GQA ? 0 : t.q0 + 64 * c;
        const int rows_end = PACK_GQA ? t.len_q : first_row + 64;
        const int qdiag[2] = {qpos[0] + t.diag, qpos[1] + t.diag};  // the last key each row may see
        // Causal: the block's tiles reach its last consumer's diagonal, but this consumer's rows
        // end before rows_end, and the last tiles may lie wholly past them. It skips their
        // products and only hands their buffers (and, with ping-pong, `turns` turns each) on:
        // pass_on. (Without a producer, consumer 0 refills the ring inside its loop: it keeps
        // every tile.) Counted from key 0: causal work is split only where this consumer's rows
        // include the last query (splits_causal: packed, or one consumer and one query block,
        // bottom-right); there rows_end + diag >= len_k, so the count covers every tile and
        // my_tiles is the range's own n_tiles. Other causal work starts at t0 = 0.
        // Bottom-right with Sq > Sk, a consumer's rows may see no key at all: my_tiles = 0.
        // SKIP_ROWS_PAST_END: the last query block of a sequence whose length is not a multiple
        // of BLOCK_M has consumers whose rows all lie past its end (at D64, 192 rows a block: S
        // 1024 leaves two of the last block's three consumers without a row). Their products
        // would be on zeros and never stored; instead they take my_tiles = 0, and the SM's other
        // consumers get the tensor cores and the exp2 unit to themselves. Consumer 0 always has
        // a row, except in a packed sequence's work tile past its end, where without a producer
        // it must still refill the ring: with a producer only.
        const bool past_end = SKIP_ROWS_PAST_END && WARP_SPECIALIZED && !PACK_GQA && first_row >= t.len_q;
#if WINDOW
        // WINDOW: a row's last key is the nearer of its causal diagonal and its window's right
        // edge (qhi), its first its window's left edge (qlo), at key position qpos + len_k − len_q.
        // Over the consumer's rows first_row … rows_end − 1 the lowest last key is its first
        // row's (hi_first) and the highest first key its last row's (lo_last): a tile between the
        // two, within the keys, needs no mask. The consumer's tiles end at its last row's last
        // key (keys_end), counted from the work tile's first tile t0, where the window began.
        const int wdiag = t.len_k - t.len_q;
        const int qhi[2] = {causal ? min(qdiag[0], qpos[0] + wdiag + win_right) : qpos[0] + wdiag + win_right,
                            causal ? min(qdiag[1], qpos[1] + wdiag + win_right) : qpos[1] + wdiag + win_right};
        const int qlo[2] = {qpos[0] + wdiag - win_left, qpos[1] + wdiag - win_left};
        const int hi_first = causal ? min(first_row + t.diag, first_row + wdiag + win_right) : first_row + wdiag + win_right;
        const int lo_last = rows_end - 1 + wdiag - win_left;
        const int keys_end = max(0, min(causal ? min(t.len_k, rows_end + t.diag) : t.len_k, rows_end + wdiag + win_right));
        const int my_tiles = past_end ? 0 : WARP_SPECIALIZED
            ? max(0, min(n_tiles, (keys_end + BLOCK_N - 1) / BLOCK_N - t.t0)) : n_tiles;
#else
        const int my_tiles = past_end ? 0 : causal && WARP_SPECIALIZED
            ? min(n_tiles, (max(0, min(t.len_k, rows_end + t.diag)) + BLOCK_N - 1) / BLOCK_N) : n_tiles;
#endif
        auto pass_on = [&](int cur, int turns) {
            for (int i = 0; PINGPONG && i < turns; ++i) {
                take_turn(c);
                give_turn(c);
            }
            // Released only once full: an early arrival would count towards the buffer's
            // previous use, which another consumer may still be reading.
            mbar_wait(&sm.k_full[cur % STAGES], (cur / STAGES) & 1);
            release(&sm.k_empty[cur % STAGES]);
            mbar_wait(&sm.v_full[cur % STAGES], (cur / STAGES) & 1);
            release(&sm.v_empty[cur % STAGES]);
        };
        auto softmax = [&](float (&s)[BLOCK_N / 2], float (&m)[2], float (&l)[2], float (&alpha)[2], int j) {
            const int kt = t.t0 + j;  // the key tile
#if SOFTCAP
            cap_scores(s, cap_mul);  // before the mask: masked keys get −∞ whatever the cap made of them
#endif
#if WINDOW
            if ((kt + 1) * BLOCK_N > t.len_k || (kt + 1) * BLOCK_N - 1 > hi_first || kt * BLOCK_N < lo_last)
                softmax_tile<true>(s, m, l, alpha, kt * BLOCK_N, qhi, t.len_k, true, scale_log2, qlo);
            else
                softmax_tile<false>(s, m, l, alpha, kt * BLOCK_N, qhi, t.len_k, true, scale_log2, qlo);
#else
            if ((kt + 1) * BLOCK_N > t.len_k || (causal && (kt + 1) * BLOCK_N - 1 > first_row + t.diag))
                softmax_tile<true>(s, m, l, alpha, kt * BLOCK_N, qdiag, t.len_k, causal, scale_log2, qdiag);
            else
                softmax_tile<false>(s, m, l, alpha, kt * BLOCK_N, qdiag, t.len_k, causal, scale_log2, qdiag);
#endif
        };

        float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.0f, 0.0f}, alpha[2];
        float s[BLOCK_N / 2];

        if (my_tiles == 0) {
            // No key for these rows (a sequence without keys, a query block past its sequence's
            // end, bottom-right rows before the first key): Q is released and the tiles the other
            // consumers use are passed on, with as many turns as they take — TILE_TURNS per tile,
            // with the products' turns one more for INTRA_OVERLAP's last P·V (and at least one);
            // with CARRY_PV one per tile and at least one, the first spent on the pending P·V —
            // and the rows get zeros below.
            if (!O_TMA_STORE) release_q(sm, qs);
            if (CARRY_PV) {
                flush_alone();
                for (int j = 0; j < n_tiles; ++j) pass_on(pos + j, j > 0 ? TILE_TURNS : 0);
            } else {
                for (int j = 0; j < n_tiles; ++j) pass_on(pos + j, TILE_TURNS);
                if (PINGPONG == 1 && (INTRA_OVERLAP || n_tiles == 0)) {
                    take_turn(c);
                    give_turn(c);
                }
            }
        } else {
#if INTRA_OVERLAP
            // Tile 0's S alone (CARRY_PV: with the previous work tile's last P·V); then each turn
            // issues S of tile j with P·V of tile j − 1, and the softmax of tile j runs while
            // P·V j − 1 is still in the tensor cores. first_tile is called with a constant, once
            // with a carried P·V and once without: inlined, each copy is a path whose waits are
            // known at compile time (see flush_alone).
            auto first_tile = [&](const bool CARRIED) {
                mbar_wait(&sm.k_full[pos % STAGES], (pos / STAGES) & 1);
                if (CARRIED) mbar_wait(&sm.v_full[pend_pos % STAGES], (pend_pos / STAGES) & 1);
                STAMP(role, pos, 0);
                turn_begin(c);
                issue_qk(s, q_desc, k_desc(pos % STAGES));
                if (CARRIED) issue_pv(o, p, v_desc(pend_pos % STAGES), pend_fresh);
                turn_end(c);
                if (CARRIED) wgmma_wait<1>();
                else wgmma_wait<0>();
                fence_registers(s);
                release(&sm.k_empty[pos % STAGES]);
                STAMP(role, pos, 1);
                softmax_begin(c);
                softmax(s, m, l, alpha, 0);
                if (!CARRY_PV) to_operand(s, p);
                softmax_end(c);
                STAMP(role, pos, 2);
                if (CARRY_PV) {
                    if (CARRIED) settle_pending();  // P is free once the previous tile's P·V is done
                    to_operand(s, p);
                }
            };
            if (CARRY_PV && pend) first_tile(true);
            else first_tile(false);
            for (int j = 1; j < my_tiles; ++j) {
                const int cur = pos + j, prev = cur - 1;
                mbar_wait(&sm.k_full[cur % STAGES], (cur / STAGES) & 1);
                mbar_wait(&sm.v_full[prev % STAGES], (prev / STAGES) & 1);
                STAMP(role, cur, 0);
                turn_begin(c);
                issue_qk(s, q_desc, k_desc(cur % STAGES));
                if (j > 1) rescale(o, alpha);  // tile j − 1's factor, while Q·Kᵀ j runs, before P·V j − 1 adds to O
                issue_pv(o, p, v_desc(prev % STAGES), j == 1);
                turn_end(c);
                wgmma_wait<1>();  // S of tile j is ready; P·V of tile j − 1 may still run
                fence_registers(s);
                release(&sm.k_empty[cur % STAGES]);
                STAMP(role, cur, 1);
                softmax_begin(c);
                softmax(s, m, l, alpha, j);
                softmax_end(c);
                STAMP(role, cur, 2);
                wgmma_wait<0>();
                fence_registers(o);
                fence_registers(p);  // read by that P·V: rewritten only now
                release(&sm.v_empty[prev % STAGES]);
                STAMP(role, prev, 3);
                to_operand(s, p);
            }
            if (!O_TMA_STORE) release_q(sm, qs);  // every Q·Kᵀ of this work tile is done: the producer may refill Q
            const int last = pos + my_tiles - 1;
#if CARRY_PV
            // The last P·V waits for the next work tile's first turn (or the one after the loop).
            if (my_tiles > 1) rescale(o, alpha);
#if SINKS
            close_rows(l, m, pend_inv_l, pend_lse, t);
#else
            close_rows(l, m, pend_inv_l, pend_lse);
#endif
            pend = true, pend_fresh = my_tiles == 1, pend_pos = last, pend_w = w;
            for (int j = my_tiles; j < n_tiles; ++j) pass_on(pos + j, TILE_TURNS);  // the tiles above: their turns
#else
            mbar_wait(&sm.v_full[last % STAGES], (last / STAGES) & 1);
            turn_begin(c);
            if (my_tiles > 1) rescale(o, alpha);
            issue_pv(o, p, v_desc(last % STAGES), my_tiles == 1);
            turn_end(c);
            wgmma_wait<0>();
            fence_registers(o);
            fence_registers(p);
            release(&sm.v_empty[last % STAGES]);
            STAMP(role, pos + my_tiles - 1, 3);
            for (int j = my_tiles; j < n_tiles; ++j) pass_on(pos + j, TILE_TURNS);  // the tiles above: their turns
#endif
#else
            // One tile at a time: S, its softmax, then P·V, each product waited for at once.
            for (int j = 0; j < my_tiles; ++j) {
                const int cur = pos + j, st = cur % STAGES;
                mbar_wait(&sm.k_full[st], (cur / STAGES) & 1);
                STAMP(role, cur, 0);
                turn_begin(c);
                issue_qk(s, q_desc, k_desc(st));
                turn_end(c);
                wgmma_wait<0>();
                fence_registers(s);
                release(&sm.k_empty[st]);
                if (!O_TMA_STORE && j == my_tiles - 1) release_q(sm, qs);
                STAMP(role, cur, 1);
                softmax_begin(c);
                softmax(s, m, l, alpha, j);
                if (j > 0) rescale(o, alpha);
                to_operand(s, p);
                softmax_end(c);
                STAMP(role, cur, 2);
                mbar_wait(&sm.v_full[st], (cur / STAGES) & 1);
                turn_begin(c);
                issue_pv(o, p, v_desc(st), j == 0);
                turn_end(c);
                wgmma_wait<0>();
                fence_registers(o);
                fence_registers(p);
                release(&sm.v_empty[st]);
                STAMP(role, cur, 3);
#if !WARP_SPECIALIZED
                if (threadIdx.x == 0 && j + STAGES < n_tiles) {  // refill these buffers once all are done
                    const Pages pg = tile_pages(pages, t, t.t0 + j + STAGES);
                    load_tile(sm.k, sm.k_full, sm.k_empty, &k_map, cur + STAGES, t.t0 + j + STAGES, t.hk, t.bmap, t.k_start, pg);
                    load_tile(sm.v, sm.v_full, sm.v_empty, &v_map, cur + STAGES, t.t0 + j + STAGES, t.hk, t.bmap, t.k_start, pg);
                }
#endif
            }
            for (int j = my_tiles; j < n_tiles; ++j) pass_on(pos + j, TILE_TURNS);  // the tiles above: their turns
#endif
        }
        pos += n_tiles;
        if (!pend) {  // finished now (with CARRY_PV, a tile whose rows saw no key)
            if (my_tiles == 0) zero_o();  // no P·V wrote O: zeros, as SDPA gives
            float inv_l[2], lse[2];
#if SINKS
            close_rows(l, m, inv_l, lse, t);
#else
            close_rows(l, m, inv_l, lse);
#endif
#if KV_FP8
            inv_l[0] *= v_scale, inv_l[1] *= v_scale;  // O·v_descale, and so each split's partial rows
#endif
            finish(w, count, inv_l, lse);
        }
    }
    if (CARRY_PV) flush_alone();  // the last work tile's last P·V, in one more turn of every consumer
    // The last consumer's final turn went to consumer 0, who takes it here: every turn barrier
    // sees as many arrivals as waits, and nothing is left pending when the block ends.
    if (PINGPONG && c == 0) take_turn(0);
}

// ---- split-KV: the partial results of a row's n_splits blocks, weighed into its output ----------
// Split i saw keys whose exponentials sum to 2^lse_i (scaled log2 units) and wrote O_i = their
// weighted mean of V. The row's output is Σ w_i·O_i / Σ w_i with w_i = 2^(lse_i − max lse).
// One block of 4 warps per row of [B·H·Sq]: warp w sums the splits i ≡ w (mod 4), each lane
// D/32 adjacent columns, several partial rows in flight at once (unrolled); the four sums meet
// in shared memory. (One warp walking all 128 splits of a row waited 128 L2 round trips, and
// decoding has few rows: B1 H8 Sq1 is 8 rows, so that wait was the whole kernel.)
constexpr int MAX_SPLITS = 128;
// SINKS: the row's sink joins as one more partial of O zero (sinks, float32 [H]; the row's head is
// row % H for packed sequences' [total_q, H] rows, else (row / Sq) % H of [B, H, Sq]).
#if SINKS
#define COMBINE_SINK_PARAMS , const float* __restrict__ sinks, int H, int Sq, int rows_by_token
#else
#define COMBINE_SINK_PARAMS
#endif
extern "C" __global__ void __launch_bounds__(128)
attention_combine_splits(const float* __restrict__ o_part, const float* __restrict__ lse_part, elem_t* __restrict__ out,
                         int rows, int n_splits COMBINE_SINK_PARAMS) {
    constexpr int COLS = D / 32;
    __shared__ float sums[4][D];
    __shared__ float lse_s[MAX_SPLITS];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int row = blockIdx.x;
    griddep_wait();  // the split blocks' partial rows, when launched with PDL
    const float* const lse = lse_part + (size_t)row * n_splits;
    float mx = NEG_INF;
    for (int i = threadIdx.x; i < n_splits; i += 128) {
        lse_s[i] = lse[i];
        mx = fmaxf(mx, lse_s[i]);
    }
#pragma unroll
    for (int k = 16; k > 0; k /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, k));
    if (lane == 0) sums[warp][0] = mx;
    __syncthreads();
    mx = fmaxf(fmaxf(sums[0][0], sums[1][0]), fmaxf(sums[2][0], sums[3][0]));
#if SINKS
    const float sink = sinks != nullptr ? __ldg(sinks + (rows_by_token ? row % H : (row / Sq) % H)) * LOG2E : NEG_INF;
    mx = fmaxf(mx, sink);
#endif
    if (mx == NEG_INF) mx = 0.0f;  // no split saw a key (not launched so): weights 0, output 0
    __syncthreads();               // sums[·][0] is read: it may be overwritten now
    float acc[COLS] = {}, wsum = 0.0f;
    const float* const o = o_part + (size_t)row * n_splits * D + lane * COLS;
#pragma unroll 8
    for (int i = warp; i < n_splits; i += 4) {
        const float w = exp2f(lse_s[i] - mx);
        wsum += w;
#if HEAD_DIM % 64 == 0
#pragma unroll
        for (int e = 0; e < COLS; e += 2) {
            const float2 part = *reinterpret_cast<const float2*>(o + (size_t)i * D + e);
            acc[e] = fmaf(w, part.x, acc[e]);
            acc[e + 1] = fmaf(w, part.y, acc[e + 1]);
        }
#else  // D96: three columns a lane, no pairs
#pragma unroll
        for (int e = 0; e < COLS; ++e) acc[e] = fmaf(w, o[(size_t)i * D + e], acc[e]);
#endif
    }
#pragma unroll
    for (int e = 0; e < COLS; ++e) sums[warp][lane * COLS + e] = acc[e];
    __shared__ float wsums[4];  // each warp's share of the weights (the same in all its lanes)
    if (lane == 0) wsums[warp] = wsum;
    __syncthreads();
#if SINKS
    const float inv_total = 1.0f / fmaxf(wsums[0] + wsums[1] + wsums[2] + wsums[3] + exp2f(sink - mx), 1e-30f);
#else
    const float inv_total = 1.0f / fmaxf(wsums[0] + wsums[1] + wsums[2] + wsums[3], 1e-30f);
#endif
    if (warp == 0) {
#if HEAD_DIM % 64 == 0
        elem_t* const dst = out + (size_t)row * D + lane * COLS;
#pragma unroll
        for (int e = 0; e < COLS; e += 2) {
            const int c = lane * COLS + e;
            const float x0 = sums[0][c] + sums[1][c] + sums[2][c] + sums[3][c];
            const float x1 = sums[0][c + 1] + sums[1][c + 1] + sums[2][c + 1] + sums[3][c + 1];
            *reinterpret_cast<unsigned*>(dst + e) = pack2(x0 * inv_total, x1 * inv_total);
        }
#else  // D96: each lane a pair of the first 64 columns, lanes 0-15 one more of the last 32
        for (int c = 2 * lane; c < D; c += 64) {
            const float x0 = sums[0][c] + sums[1][c] + sums[2][c] + sums[3][c];
            const float x1 = sums[0][c + 1] + sums[1][c + 1] + sums[2][c + 1] + sums[3][c + 1];
            *reinterpret_cast<unsigned*>(out + (size_t)row * D + c) = pack2(x0 * inv_total, x1 * inv_total);
        }
#endif
    }
}

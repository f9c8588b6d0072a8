// Stage 8, the Hopper build (WGMMA 1, sm_90a): the kernels of stages/stage8.cu — dK and dV per
// block of keys, dQ in a pass of its own or summed from the dK/dV kernel — with every product a
// warpgroup's wgmma instead of warps' mma.sync. Read stage8.cu first. This file changes the
// machinery, not the algorithm, one compile-time switch at a time (stages/stage8.py, SWITCHES;
// its WGMMA_BUILD says which ones the stage runs at each head dim, and why):
//
//   - A warpgroup (4 warps, 128 threads) makes each product as one 64-row wgmma: in the dK/dV
//     kernel it owns 64 keys (warp w the 16 keys [16w, 16w + 16), as before), in the dQ pass 64
//     query rows.
//   - Operands come from shared memory through descriptors (stages/hopper.cuh), in the
//     128-byte-swizzled layout wgmma reads: a D-wide tile is D/64 "atoms" of [rows][64]
//     elements, 128-byte rows, chunk c of row r at chunk c ^ (r % 8). The cp.async copies write
//     that layout directly, and so does TMA (TMA_LOADS).
//   - The transposed operands cost nothing: dV += Pᵀ·dO and dK += dSᵀ·Q read dO and Q as B
//     "MN-major" (the tensor core transposes 16-bit tiles as it reads), and so does
//     dQ += dS·K with K. Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ read both operands K-major.
//   - Pᵀ and dSᵀ, in the accumulator layout, are the register A operand of the next wgmma, as
//     P is in stage 6's P·V.
// cp.async writes shared memory through the generic proxy, wgmma reads it through the async
// proxy: each thread fences (fence.proxy.async) after its copies land, before the barrier.
//
// The switches, in the order the stage 8 notebook measures them:
//   OVERLAP 1 lets the exponentials run under the tensor core: each product is committed as a
//     group of its own, and the warpgroup waits only for the one it needs next — P is computed
//     while dPᵀ is still being multiplied, and dS (dK/dV kernel) while dV += Pᵀ·dO is.
//   WARPGROUPS 2: a dK/dV block is two warpgroups that own 64 keys each (128 keys) and share
//     every Q and dO tile they copy — half the copies per key, and twice the work per barrier.
//   DQ_ATOMICS 1: no dQ pass. Each warpgroup also stores its dSᵀ (keys × 64 queries) to shared
//     memory; after a barrier it computes dQ = dS·K for 64 query rows and 64 columns of D and
//     adds them to a float32 dQ in global memory with vector reductions (red.global.add.v2.f32).
//     Five products per tile instead of the dQ pass's seven, for traffic into dQ: the 64-row
//     partial sums of every key block. With two warpgroups at D 128 they split D's two 64-column
//     halves over all 128 keys (each row of dQ gets one addition per 128 keys); otherwise each
//     warpgroup adds its own 64 keys' share over all of D (64 columns are one wgmma's width).
//   DQ_BULK 1 (with DQ_ATOMICS): the copy engine adds them instead. Each warpgroup stores its
//     64 × 64 partial dQ to shared memory (4 floats per store, in the accumulators' own order;
//     two buffers, so step it − 1's may still be read out while step it writes) and one thread
//     hands the 16 KB to a bulk reduction (cp.reduce.async.bulk .add.f32) into a float32 dQ
//     kept in that order, 16 KB per (64 query rows, 64 columns); the launcher puts the rows back
//     in order when it converts dQ to q's dtype. No reduction instructions in the warps' stream,
//     and no memory fence waiting for them.
//   DQ_TURNS 1 (two warpgroups at D 64, with DQ_ATOMICS): the warpgroups take turns, step by
//     step, computing dQ over all 128 keys of the block (both warpgroups' dSᵀ, after a block
//     barrier) instead of each adding its own 64 keys' share every step: half the additions
//     into dQ, and each warpgroup makes a dQ product every other step, twice as long.
//   TMA_LOADS 1 (dK/dV kernel): the copy engine loads each step's Q and dO tiles (tensor maps,
//     swizzled as wgmma reads them) and its lse and δ rows (bulk copies), issued by one thread
//     two steps ahead into the two buffers; a buffer's "full" mbarrier counts the bytes, its
//     "empty" one the threads done with it. No copy instructions in the other threads' stream,
//     no proxy fence, and no block-wide barrier at the top of each step: the warpgroups may
//     drift apart by up to a step (as far as the dS exchange of DQ_ATOMICS lets them).
//   DQ_EARLY 1 (with DQ_ATOMICS): a warpgroup goes on to the exchange of dSᵀ and its dQ product
//     while its dV and dK products still run, instead of waiting for them first. Two warpgroups
//     meet at that exchange every step (a block barrier when dQ reads both warpgroups' keys);
//     waiting for its own products first made the warpgroup whose products were queued second
//     arrive late, and the tensor cores idle between the last dK and the first dQ. The price:
//     dQ's 32 accumulators live beside Pᵀ and dSᵀ's 32 registers, which the running products
//     still read.
//   BLOCKS_PER_SM 3 (one warpgroup at D 64, without OVERLAP): launch bounds that make ptxas fit
//     the kernel in 168 registers and one buffer of dQ tiles instead of two (74 KB of shared
//     memory), so that three blocks share an SM instead of two. A step is a chain of waits (Sᵀ,
//     the exponentials, dPᵀ, dS, dK and dV, the barrier, dQ, its store); a third block's chain
//     fills more of the others' waits. The price: a step waits until the copy engine has read
//     the step before's dQ tiles out.
//   PRODUCER 1 (with TMA_LOADS and DQ_BULK): a warpgroup of its own, after the others, moves the
//     data, as FlashAttention-3's backward does: its warp 0 issues the loads of Q, dO, lse and δ
//     into the two buffers, and warp 1 + w the bulk reductions of warpgroup w's dQ tiles, so that
//     the copy engine's work is no longer issued (nor waited for) between a warpgroup's products.
//     A warpgroup stores its tiles and arrives on their "full" mbarrier; the producer's thread
//     hands them to the copy engine and, once the copy engine has read the turn before's tiles
//     out (cp.async.bulk.wait_group.read), arrives on that buffer's "empty" one, which is all a
//     warpgroup ever waits for before it writes a buffer again. The producer keeps 24 registers
//     (setmaxnreg) and gives the rest to the warpgroups that multiply (FlashAttention-3's 24 and
//     240 with two of them); one warpgroup at D 64 takes 232 so that two blocks still share an SM.
//   DS_GUARD 1 (where a dQ product reads both warpgroups' dSᵀ: two warpgroups at D 128, or
//     DQ_TURNS): the dSᵀ store ordered after the other warpgroup's dQ product of the step before.
//     One buffer holds both warpgroups' dSᵀ, and that product may still be reading it; without
//     the guard only time keeps them apart (the writer first makes a whole step of products and
//     exponentials). The reader arrives at named barrier 4 + (the other warpgroup) once its
//     product is waited for (bar.arrive: it does not wait); the writer waits at 4 + its own before
//     its stores, so it waits only if that read is not done. FlashAttention-3 syncs both
//     warpgroups there (BwdNamedBarriers::PdS with one dS stage).
//   DK_LAST 1 (with DQ_ATOMICS; one dQ product per turn: D 128's halves, or D 64): the products in
//     FlashAttention-3's order. dK += dSᵀ·Q is issued after the dQ product instead of before the
//     dSᵀ exchange, and the warpgroup waits for dQ alone (dK may still run) before it stores its
//     dQ tile: the tensor core works on dK while the warps store dQ and start the next step,
//     where it idled before. The price: dK no longer runs under the dSᵀ stores and the exchange
//     (dV, issued earlier, still may), and dSᵀ's registers stay live until dK is done.
//   DS_STMATRIX 1 (with DQ_ATOMICS): a warp stores its dSᵀ for the dQ product with four stmatrix, one
//     per 16 queries (four 8 × 8 tiles: its 16 keys × 16 queries), instead of sixteen 4-byte stores.
//     The same bytes at the same places; the stores sit between dS and the exchange before dQ.
//   PREP_EARLY 1: what a step's exponentials need besides Sᵀ is ready when Sᵀ lands: the thread's 16
//     columns of lse read into registers (8-byte pairs) and the step's first query row worked out
//     (a division) before the products are issued, instead of after the wait for Sᵀ, whose latency
//     then sat between the product and the exponentials. PREP_EARLY 2: δ's 16 columns too, read
//     once Sᵀ is in, ready for dS when dPᵀ is. The price: lse's 16 registers live across the products
//     (PREP_EARLY 2: δ's 16 more, from the wait for Sᵀ on); at D 128 PREP_EARLY 2 spills (NVRTC 13.0).
//     PREP_EARLY 3: the same reads and division after the products are issued, before the wait.
//   KV_REGS 1 (D 64): K and V of the warpgroup's 64 keys read into registers once per block (32 a
//     thread), the A operands of Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ. With both operands in shared memory a
//     64 × 64 × 16 wgmma reads 4 KB, as much as shared memory delivers while the tensor core makes
//     it; from registers it reads Q's or dO's 2 KB. KV_REGS 2: K alone. At D 128 K alone spills.
//   MASK_SPLIT 1 (the builds without SOFTCAP): a step whose tile neither the causal diagonal nor a
//     window's edge cuts computes its exponentials without the per-score compares and selects
//     (two instructions a score, every step, even without a mask); the tiles that an edge cuts
//     keep them. FlashAttention-3 makes the masked steps a loop of their own for the same reason.
//   SCALE_AT_END 1 (with DQ_BULK, or the dQ pass): dSᵀ = Pᵀ ∘ (dPᵀ − δ) without the softmax scale,
//     which every product of dS carries linearly: dK's accumulators take it once before their
//     store, and the postprocess once per element of dQ, instead of one multiply per score every
//     step (32 a thread). At D 64 the scale is 2⁻³, so dSᵀ's 16-bit values are the scaled ones'
//     times 8 exactly and dK and dQ come out bit-equal; at D 128 they round differently.
//   EPILOGUE_SMEM 1: dK and dV leave through shared memory. Each thread writes its accumulators'
//     pairs (4 bytes, 8 rows apart) into Q's and dO's buffers, free once every product of the
//     last step is done; then each warp stores its own 16 rows in whole 16-byte pieces: a
//     quarter of the store instructions, each writing whole 128-byte lines, where the pairs wrote
//     16 bytes of 8 lines each. At S 512 a block walks only 8 steps, so its end counts.
//   LONGEST_FIRST 1 (causal calls without a window): blocks start in another order. Head by
//     head, a head's key block 0 (which walks every query block) starts before its last (one or
//     two), and the last heads' longest blocks start among the last of the launch. Instead key
//     block j of every head in a section starts before block j + 1 of any: sections of a power
//     of two of heads whose Q, dO and float32 dQ fit 40 MB of L2 (FlashAttention-3's causal
//     scheduler). No block's sums change; dQ's float32 additions come in another order.
//   ROWS80 1 (D 96/128: two warpgroups splitting dQ's columns, the producer; no variants): 80 queries a
//     step instead of 64, FlashAttention-3's full-attention tile at D 128. Per score, K and V are read
//     from shared memory, and dQ's product reads K, 4/5 as often. 80 queries are no 64-row wgmma, so dQ is
//     made transposed, dQᵀ = Kᵀ·dSᵀ (FlashAttention-3's dQ_swapAB): 64 columns of D × 80 queries, dSᵀ
//     the B operand, its queries 64-79 in a second 64-query atom (a 16-wide wgmma reads them); its
//     tiles go to a postprocess of their own. Shared memory holds one buffer of dQ tiles, not two.
//     Sᵀ and dPᵀ take 40 registers a thread each, beside dK's and dV's 128: dV is issued after dS,
//     not before (Pᵀ's 20 registers are not live beside dS's), and DK_LAST and PREP_EARLY stay off;
//     with either, ptxas serializes the wgmma (C7512).
// Not here (FlashAttention-3 has it): the next query block's Sᵀ and dPᵀ issued before this block's
// dK is waited for; tried with DK_LAST, slower at D 64 and spilled at D 128 (experiments/backward_dk_last).
//
// Head dim 96 (Phi-3's): the tiles are D 128's (DP), columns 96-127 zeros. K and V are copied with
// those columns zero-filled, and the copy engine zero-fills Q's and dO's boxes past column 96,
// counting each whole box's bytes. Sᵀ and dPᵀ read only the first 96 columns (six k-steps). dK,
// dV and dQ are made over all 128 columns, whose last 32 stay zero, and stored only up to column
// 96. dQ's float32 sum keeps 128 columns; the postprocess drops the last 32.
//
// Head dim 256 (issue 51; no switch: the only build that fits). A warpgroup's dK and dV for 64
// keys over all of D would take D registers a thread (256), more than a thread has. So at D 256
// two warpgroups share one block's 64 keys (KEYS = 64) and split D: warpgroup w holds dK and dV
// for columns 128w … 128w + 127 (128 registers, as a warpgroup at D 128 holds), reading its half
// of Q's and dO's columns. Sᵀ and dPᵀ need all of D, and both warpgroups compute them, the same
// 64 × 64 products twice: six products of a step's 64 keys × 64 queries × 256 where one
// warpgroup would make four. dQ is made by the dQ pass (one warpgroup, 128 accumulators a
// thread): there is no room for a dSᵀ buffer and dQ tiles beside two Q and two dO tiles of 32 KB.
// Shared memory: K, V 32 KB each, two Q and two dO tiles 128 KB; the dQ pass 192 KB.
//
// The models' variants (issue 51; stage 6's forward has them, stages/stage6.cu section 7), each a
// compile-time switch whose build without it (the define absent) is the kernel above, unchanged;
// a build with either takes four more arguments (VARIANT_PARAMS: cap_mul, cap_log2, win_left,
// win_right). With P = exp(S' − lse), S' the capped and masked score and lse the forward's:
//     dV = Pᵀ·dO,  dP = dO·Vᵀ,  dS' = P ∘ (dP − δ),  δ = rowsum(dO ∘ O)   (as without variants)
//   SOFTCAP  S' = c·tanh(S / c), S = q·k·scale: dS = dS' ∘ (1 − t²), t = tanh(S / c) = S' / c.
//            t is recomputed per score as the forward computes it (1: tanh.approx, 2: from ex2
//            and rcp; cap_mul = scale / c, times 2·log2 e for 2, so t has the sign of S whatever
//            the scale's), P = 2^(t·cap_log2 − lse·log2 e) with cap_log2 = c·log2 e. The 16-bit P
//            that dV's product reads is packed first; the float P ∘ (1 − t²) stays for dS.
//   WINDOW   query q (key position q + Sk − Sq, bottom-right) sees keys q + lo_off … q + hi_off
//            (lo_off = Sk − Sq − left, hi_off = Sk − Sq + right, with causal the nearer of that and
//            the diagonal): the same mask per score as the forward; a key block walks only the
//            query blocks whose rows see one of its keys (the mirror of the forward's key range),
//            the dQ pass only the key tiles its rows see, and the tiles cut by an edge mask per score.
//   Sinks    change nothing here: the forward's O and lse already hold the sink's share, and its
//            gradient, dσ_h = −Σ_rows exp(σ_h − lse)·δ, is taken on the host from lse and δ
//            (stages/stage8_variants.py, sinks_gradient).
#include "hopper.cuh"
#include "mma.cuh"

#ifndef OVERLAP
#define OVERLAP 1
#endif
#ifndef WARPGROUPS
#define WARPGROUPS 1
#endif
#ifndef DQ_ATOMICS
#define DQ_ATOMICS 0
#endif
#ifndef DQ_BULK
#define DQ_BULK 0
#endif
#ifndef TMA_LOADS
#define TMA_LOADS 0
#endif
#ifndef DQ_TURNS
#define DQ_TURNS 0
#endif
#ifndef DQ_EARLY
#define DQ_EARLY 0
#endif
#ifndef BLOCKS_PER_SM
#define BLOCKS_PER_SM 1
#endif
#ifndef PRODUCER
#define PRODUCER 0
#endif
#ifndef DS_GUARD
#define DS_GUARD 0
#endif
#ifndef DK_LAST
#define DK_LAST 0
#endif
#ifndef MASK_SPLIT
#define MASK_SPLIT 0
#endif
#ifndef DS_STMATRIX
#define DS_STMATRIX 0
#endif
#ifndef PREP_EARLY
#define PREP_EARLY 0
#endif
#ifndef KV_REGS
#define KV_REGS 0
#endif
#ifndef ROWS80
#define ROWS80 0
#endif
#ifndef SCALE_AT_END
#define SCALE_AT_END 0
#endif
#ifndef EPILOGUE_SMEM
#define EPILOGUE_SMEM 0
#endif
#ifndef LONGEST_FIRST
#define LONGEST_FIRST 0
#endif
#ifndef SOFTCAP
#define SOFTCAP 0  // 1: c·tanh(s / c) on the scores by tanh.approx; 2: by ex2 and rcp (as stage 6's)
#endif
#ifndef WINDOW
#define WINDOW 0  // 1: a sliding window, win_left and win_right keys either side of a row's position
#endif
static_assert(SOFTCAP >= 0 && SOFTCAP <= 2, "SOFTCAP is 0 (off), 1 (tanh.approx) or 2 (tanh from ex2)");
#if SOFTCAP || WINDOW
#define VARIANT_PARAMS , float cap_mul, float cap_log2, int win_left, int win_right
#else
#define VARIANT_PARAMS
#endif
#if SOFTCAP
// t = tanh(x / c) from x·cap_mul, as stage 6's cap_scores: tanh.approx.f32 (SOFTCAP 1) or
// 1 − 2 / (2^(2x·log2 e / c) + 1) with one MUFU.EX2 and one MUFU.RCP (SOFTCAP 2).
__device__ __forceinline__ float cap_tanh(float x_mul) {
    float y;
    if (SOFTCAP == 1) {
        asm("tanh.approx.f32 %0, %1;\n" : "=f"(y) : "f"(x_mul));
    } else {
        float r;
        asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(fast_exp2(x_mul) + 1.0f));
        y = fmaf(-2.0f, r, 1.0f);
    }
    return y;
}
#endif

constexpr int D = HEAD_DIM;     // the tensors' head dim
constexpr int DP = (D + 63) / 64 * 64;  // the tiles' (D 96: 128, columns 96-127 zero; see "Head dim 96")
constexpr int ATOMS = DP / 64;  // 64-column atoms of a tile
constexpr int ROWS = 64;        // keys per warpgroup, queries per step; queries per dQ block, keys per tile
constexpr int THREADS = 128;    // one warpgroup
constexpr int QR = ROWS80 ? 80 : ROWS;  // the dK/dV kernel's queries per step (ROWS80: FlashAttention-3's 80)
constexpr int DS_PARTS = ROWS80 ? 2 : 1;  // dSᵀ's 64-query atoms (ROWS80: queries 64-79 in a second one)
constexpr bool DV_EARLY = OVERLAP && !ROWS80;  // dV issued before dS is computed (ROWS80: after, see there)
constexpr bool SPLIT_D = D > 128;  // two warpgroups share 64 keys, each with half of D (above)
constexpr int DKV = SPLIT_D ? DP / 2 : DP;     // the columns of dK and dV a warpgroup holds
constexpr int KEYS = SPLIT_D ? ROWS : ROWS * WARPGROUPS;  // keys per dK/dV block
constexpr int KEY_THREADS = THREADS * WARPGROUPS;
constexpr bool DQ_SPLITS_D = ATOMS == WARPGROUPS;  // dQ: one 64-column half of D per warpgroup, over all keys
constexpr bool DQ_ALL_KEYS = DQ_SPLITS_D || DQ_TURNS;  // a warpgroup's dQ product covers all the block's keys
static_assert(!DQ_TURNS || (WARPGROUPS == 2 && !DQ_SPLITS_D && DQ_ATOMICS),
              "DQ_TURNS: two warpgroups that do not split D, summing dQ in this kernel");
constexpr int CHUNKS = DP / 8;
static_assert(WARPGROUPS == 1 || WARPGROUPS == 2, "one or two warpgroups");
static_assert(!SPLIT_D || (D == 256 && WARPGROUPS == 2 && !DQ_ATOMICS && !PRODUCER),
              "D 256: two warpgroups that split D, dQ by its own pass");
static_assert(!DQ_BULK || DQ_ATOMICS, "DQ_BULK is a way of DQ_ATOMICS");
static_assert(!DQ_EARLY || DQ_ATOMICS, "DQ_EARLY: the dQ product in this kernel");
static_assert(!DS_GUARD || (DQ_ATOMICS && DQ_ALL_KEYS && WARPGROUPS == 2),
              "DS_GUARD: guards the dSᵀ that this kernel's dQ product reads from both warpgroups");
static_assert(!DS_GUARD || D == 64 || DQ_SPLITS_D, "DS_GUARD: one dQ product per warpgroup and step (its arrival)");
static_assert(!DK_LAST || (DQ_ATOMICS && !DQ_EARLY && (DQ_SPLITS_D || ATOMS == 1)),
              "DK_LAST: dK after this kernel's dQ product, one dQ product per turn (D 128's halves, or D 64)");
static_assert(!KV_REGS || D == 64, "KV_REGS: K (and V) in registers, 16 (32) a thread at D 64 (at D 128 K alone spills)");
static_assert(!ROWS80 || (DP == 128 && DQ_SPLITS_D && PRODUCER && !SOFTCAP && !WINDOW),
              "ROWS80: D 96/128's two warpgroups splitting dQ's columns, with the producer, no variants");
static_assert(!PRODUCER || (TMA_LOADS && DQ_BULK && BLOCKS_PER_SM == 1),
              "PRODUCER issues the TMA loads and the bulk reductions (TMA_LOADS, DQ_BULK), two dQ buffers");
// The block: the warpgroups that multiply (threads 0 … KEY_THREADS − 1, as without a producer),
// then PRODUCER's. Registers after setmaxnreg: 128·24 + 256·240 = 64,512 of the 65,536 with two
// warpgroups; one at D 64, launched for two blocks per SM (128 a thread), 128·24 + 128·232 =
// 32,768 (its shared memory fits twice); one at D 128 (one block per SM: 170 KB) keeps 248.
constexpr int BLOCK_THREADS = KEY_THREADS + (PRODUCER ? THREADS : 0);
constexpr int MIN_BLOCKS = PRODUCER ? (WARPGROUPS == 1 && D == 64 ? 2 : 1) : BLOCKS_PER_SM;
constexpr int PRODUCER_REGS = 24, CONSUMER_REGS = WARPGROUPS == 2 ? 240 : D == 64 ? 232 : 248;
constexpr int LOADER = PRODUCER ? KEY_THREADS : 0;  // the thread that issues the TMA loads
#if DQ_BULK
constexpr int DQ_TILES = DQ_SPLITS_D ? 1 : ATOMS;  // 64 × 64 partial dQ tiles per warpgroup and step
#endif
constexpr int DQ_BUFFERS = BLOCKS_PER_SM == 3 || ROWS80 ? 1 : 2;  // of DQ_BULK's tiles: step it writes while step it − 1's are read out

// Element offset of (row, col) in a [ATOMS][R][64] tile, 128-byte swizzle.
template <int R>
__device__ __forceinline__ int sw(int row, int col) {
    return (col / 64) * R * 64 + row * 64 + ((((col % 64) / 8) ^ (row % 8)) * 8) + col % 8;
}
// Rows [row0, row0 + R) of an [n_rows, D] matrix with row stride ld into a swizzled tile, by
// the block's NT threads, 16 bytes per thread and step, asynchronously; rows past n_rows become zeros.
template <int R, int NT = THREADS>
__device__ __forceinline__ void copy_tile(elem_t* tile, const elem_t* src, int row0, int n_rows, int ld) {
    constexpr int STEP = NT / CHUNKS;
    const int r = threadIdx.x / CHUNKS, c = (threadIdx.x % CHUNKS) * 8;
#pragma unroll
    for (int i = 0; i < R / STEP; ++i) {
        const int row = r + i * STEP;
        const bool inside = row0 + row < n_rows && (DP == D || c < D);  // D 96: columns 96-127 zeros
        cp_async_16(tile + sw<R>(row, c), inside ? src + (size_t)(row0 + row) * ld + c : src, inside ? 16 : 0);
    }
}
// Descriptor offset (16-byte units) of k-step kk (16 columns) in a K-major [ATOMS][R][64] tile:
// +32 bytes per step within an atom's 128-byte rows, the next atom every 4 steps.
template <int R>
__device__ __forceinline__ unsigned long long k_step(int kk) {
    return (unsigned long long)(((kk / 4) * R * 128 + (kk % 4) * 32) >> 4);
}
// ... and of k-step t (16 rows) of an MN-major one: 16 rows of 128 bytes further.
__device__ __forceinline__ unsigned long long row_step(int t) { return (unsigned long long)((t * 16 * 128) >> 4); }
__device__ __forceinline__ unsigned long long kmajor(const void* tile) { return smem_desc(tile, 0); }
template <int R>
__device__ __forceinline__ unsigned long long mnmajor(const void* tile) { return smem_desc(tile, R * 128); }

// 64 rows × N columns of A·Bᵀ over D (both K-major, A in a tile of RA rows, B of N): the scores, or dP.
template <int RA = ROWS, int N = ROWS>
__device__ __forceinline__ void issue_rows_d(float (&acc)[N / 2], unsigned long long a, unsigned long long b) {
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) Wgmma<N>::ss(acc, a + k_step<RA>(kk), b + k_step<N>(kk), kk > 0);
}
// Accumulator element i of thread t in warp w: row 16w + t/4 + 8·((i / 2) % 2), column
// 8·(i / 4) + 2·(t % 4) + i % 2. Four of them per 8 columns, so k-step t of the next product
// (16 columns) is elements 8t … 8t + 7, packed two by two.
template <int T>
__device__ __forceinline__ void pack_a(unsigned (&a)[T][4], const float (&acc)[8 * T]) {
#pragma unroll
    for (int t = 0; t < T; ++t) {
        a[t][0] = pack2(acc[8 * t], acc[8 * t + 1]);
        a[t][1] = pack2(acc[8 * t + 2], acc[8 * t + 3]);
        a[t][2] = pack2(acc[8 * t + 4], acc[8 * t + 5]);
        a[t][3] = pack2(acc[8 * t + 6], acc[8 * t + 7]);
    }
}

struct KeySmem {  // the dK/dV kernel's shared memory (1024-byte aligned members)
    elem_t k[ATOMS][KEYS][64];
    elem_t v[ATOMS][KEYS][64];
    elem_t q[2][ATOMS][QR][64];
    elem_t dout[2][ATOMS][QR][64];
#if DQ_ATOMICS
    // dSᵀ of the step: keys × 64 queries, the A operand of dS·K (MN-major); ROWS80: keys × 80 queries,
    // the B operand of dQᵀ = Kᵀ·dSᵀ, queries 64-79 in the first 16 columns of a second atom
    elem_t ds[DS_PARTS][KEYS][64];
#endif
#if DQ_BULK
    float dq[DQ_BUFFERS][WARPGROUPS][DQ_TILES][64 * QR];  // each warpgroup's partial dQ, in accumulator order
#endif
    float lse[2][QR];
    float delta[2][QR];
    unsigned long long full[2], empty[2];  // TMA_LOADS: each buffer's mbarriers
#if PRODUCER
    unsigned long long dq_full[DQ_BUFFERS][WARPGROUPS], dq_empty[DQ_BUFFERS][WARPGROUPS];  // each dQ buffer's
#endif
};
struct QuerySmem {  // the dQ pass's
    elem_t q[ATOMS][ROWS][64];
    elem_t dout[ATOMS][ROWS][64];
    elem_t k[2][ATOMS][ROWS][64];
    elem_t v[2][ATOMS][ROWS][64];
};
// wgmma's layout repeats every 1024 bytes. The offset is added to the shared array itself (not
// to a pointer rebuilt from an integer) so that the compiler still knows the struct is in shared
// memory and uses shared loads and stores (STS, not generic ST), as stage 6 found.
template <class T>
__device__ __forceinline__ T& aligned_smem(unsigned char* raw) {
    return *reinterpret_cast<T*>(raw + ((1024u - (unsigned)__cvta_generic_to_shared(raw) % 1024u) % 1024u));
}

// d (+)= (the 64 × 16 MN-major A) · (the 16 × 64 MN-major B): dQ = dS·K, both operands read
// transposed from shared memory (the two trailing 1s).
__device__ __forceinline__ void wgmma_ss_tt(float (&d)[32], unsigned long long a, unsigned long long b, int accumulate) {
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %34, 0;\n"
                 " wgmma.mma_async.sync.aligned.m64n64k16" WGMMA_TYPES " " WG_R32 ", %32, %33, p, 1, 1, 1, 1;\n}\n"
                 : WG_F32(d) : "l"(a), "l"(b), "r"(accumulate));
}
// d (+)= (the 64 × 16 MN-major A) · (the 16 × 16 MN-major B): ROWS80's dQᵀ for queries 64-79.
__device__ __forceinline__ void wgmma_ss_tt16(float (&d)[8], unsigned long long a, unsigned long long b, int accumulate) {
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %10, 0;\n"
                 " wgmma.mma_async.sync.aligned.m64n16k16" WGMMA_TYPES " {%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, 1, 1;\n}\n"
                 : WG_F4(d, 0), WG_F4(d, 4) : "l"(a), "l"(b), "r"(accumulate));
}
// Sᵀ and dPᵀ with 80 queries (ROWS80): 64 keys × 80, 40 accumulators a thread, both operands K-major.
template <> struct Wgmma<80> {
    static __device__ __forceinline__ void ss(float (&d)[40], unsigned long long a, unsigned long long b, int accumulate) {
        asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %42, 0;\n"
                     " wgmma.mma_async.sync.aligned.m64n80k16" WGMMA_TYPES " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, "
                     "%10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, "
                     "%29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39}, %40, %41, p, 1, 1, 0, 0;\n}\n"
                     : WG_F32(d), WG_F4(d, 32), WG_F4(d, 36) : "l"(a), "l"(b), "r"(accumulate));
    }
};
// d (+)= A·Bᵀ for one 16-column k-step: A (64 rows × 16) in registers, in pack_a's layout, and B
// K-major in shared memory (KV_REGS: Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ with K and V held in registers).
__device__ __forceinline__ void wgmma_rs_kmajor(float (&d)[32], const unsigned (&a)[4], unsigned long long b, int accumulate) {
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %37, 0;\n"
                 " wgmma.mma_async.sync.aligned.m64n64k16" WGMMA_TYPES " " WG_R32
                 ", {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
                 : WG_F32(d) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
}
// Four 8×8 tiles of 16-bit elements from registers to shared memory (sm_90's stmatrix): register j
// of lane t holds row t / 4, elements 2(t % 4) and 2(t % 4) + 1, of tile j (an accumulator fragment,
// packed); lanes 8j … 8j + 7 give the shared addresses of tile j's rows, 16 bytes each.
__device__ __forceinline__ void stmatrix_x4(unsigned addr, unsigned r0, unsigned r1, unsigned r2, unsigned r3) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n"
                 :: "r"(addr), "r"(r0), "r"(r1), "r"(r2), "r"(r3) : "memory");
}
// *p += (x, y): two adjacent floats of global memory, one reduction (sm_90's vector red).
__device__ __forceinline__ void red_add2(float* p, float x, float y) {
    asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" :: "l"(p), "f"(x), "f"(y) : "memory");
}
// bytes contiguous bytes from global to shared memory by the copy engine, counted on bar.
__device__ __forceinline__ void bulk_load(void* dst, const void* src, unsigned bytes, unsigned long long* bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                 :: "r"(smem_u32(dst)), "l"(src), "r"(bytes), "r"(smem_u32(bar)) : "memory");
}
// dst[0 … bytes/4) += src[…] by the copy engine: a bulk reduction from shared memory, committed
// to this thread's bulk group (hopper.cuh's bulk_commit / bulk_wait_read).
__device__ __forceinline__ void bulk_reduce_add(float* dst, const float* src, unsigned bytes) {
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n"
                 :: "l"(dst), "r"(smem_u32(src)), "r"(bytes) : "memory");
}

// The bulk reductions that read a dQ buffer this step is about to overwrite are done reading:
// with two buffers all but the last group (step it − 1's may still be read), with one all.
__device__ __forceinline__ void bulk_wait_read_buffers() {
    if (DQ_BUFFERS == 2) asm volatile("cp.async.bulk.wait_group.read 1;\n" ::: "memory");
    else asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}

#if TMA_LOADS
#define TMA_MAPS const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap dout_map,
#else
#define TMA_MAPS
#endif
extern "C" __global__ void __launch_bounds__(BLOCK_THREADS, MIN_BLOCKS)
attention_backward(TMA_MAPS const elem_t* q, const elem_t* k, const elem_t* v, const elem_t* dout,
                   const float* lse2, const float* delta, float* dq_accum, elem_t* dk, elem_t* dv,
                   int Sq, int Sk, int Sq_pad, float scale_log2, float scale, int causal, int H, int group,
                   long long q_batch, long long q_head, int q_row, long long k_batch, long long k_head, int k_row,
                   long long v_batch, long long v_head, int v_row, long long o_batch, long long o_head, int o_row
                   VARIANT_PARAMS) {
    extern __shared__ unsigned char smem_raw[];
    KeySmem& sm = aligned_smem<KeySmem>(smem_raw);
    const int tid = threadIdx.x, wg = tid / THREADS, warp = tid % THREADS / 32, lane = tid % 32;
    const int g = lane / 4, i4 = lane % 4;
    const int n_key_blocks = (Sk + KEYS - 1) / KEYS;
    int bhk = blockIdx.x / n_key_blocks, key_block = blockIdx.x % n_key_blocks;  // head by head
#if LONGEST_FIRST && !WINDOW
    if (causal) {  // key block j of every head in a section before block j + 1
        constexpr long long SECTION_L2_BYTES = 40ll << 20;
        const int n_heads = gridDim.x / n_key_blocks;
        const long long head_bytes = (long long)group * Sq_pad * D * 8;  // Q and dO (16-bit), dQ (float32)
        int section = 1;
        while (section < n_heads && 2 * section * head_bytes <= SECTION_L2_BYTES) section *= 2;
        const int s = blockIdx.x / (section * n_key_blocks), in = blockIdx.x % (section * n_key_blocks);
        const int heads = min(section, n_heads - s * section);  // the last section may hold fewer
        key_block = in / heads;
        bhk = s * section + in % heads;
    }
#endif
    const int b = bhk / (H / group), hk = bhk % (H / group);
    const int n0 = key_block * KEYS, kw = SPLIT_D ? 0 : ROWS * wg, nw = n0 + kw;  // the block's keys, the warpgroup's
    const int cw = SPLIT_D ? DKV * wg : 0;  // the first of the warpgroup's dK and dV columns
    k += b * k_batch + hk * k_head;
    v += b * v_batch + hk * v_head;

    const int diag = causal_diagonal(causal, Sq, Sk);
    const int n_q_blocks = (Sq + QR - 1) / QR;
#if WINDOW
    // query q sees keys q + lo_off … q + hi_off (win_left, win_right finite: the host clamps an
    // unbounded side to reach every key). The block's keys n0 … n_end − 1 are seen by queries
    // n0 − hi_off … n_end − 1 − lo_off: the query blocks first … first + per_head − 1.
    const int hi_off = causal ? min(diag, Sk - Sq + win_right) : Sk - Sq + win_right;
    const int lo_off = Sk - Sq - win_left;
    const int q_end = min(Sq, min(n0 + KEYS, Sk) - lo_off);  // one past the last query that sees a key
    const int first = min(n_q_blocks, max(0, n0 - hi_off) / QR);
    const int per_head = max(0, (max(0, q_end) + QR - 1) / QR - first);
#else
    const int first = causal ? min(n_q_blocks, max(0, n0 - diag) / QR) : 0;
    const int per_head = n_q_blocks - first;
#endif
    const int n_iter = per_head * group;
    auto head_of = [&](int it) { return hk * group + it / per_head; };
    auto m0_of = [&](int it) { return (first + it % per_head) * QR; };
    auto issue = [&](int it) {  // Q, dO, lse and δ of step it into buffer it % 2 (TMA_LOADS: thread LOADER alone)
        const int h = head_of(it), m0 = m0_of(it), buf = it % 2;
#if TMA_LOADS
        mbar_arrive_expect_bytes(&sm.full[buf], 2 * QR * DP * 2 + 2 * QR * 4);  // whole boxes, zero-filled ones too
#pragma unroll
        for (int a = 0; a < ATOMS; ++a) {  // rows past Sq arrive as zeros
            tma_load_4d(&sm.q[buf][a][0][0], &q_map, &sm.full[buf], 64 * a, m0, h, b);
            tma_load_4d(&sm.dout[buf][a][0][0], &dout_map, &sm.full[buf], 64 * a, m0, h, b);
        }
        const size_t row = ((size_t)b * H + h) * Sq_pad + m0;
        bulk_load(&sm.lse[buf][0], lse2 + row, QR * 4, &sm.full[buf]);
        bulk_load(&sm.delta[buf][0], delta + row, QR * 4, &sm.full[buf]);
#else
        copy_tile<QR, KEY_THREADS>(&sm.q[buf][0][0][0], q + b * q_batch + h * q_head, m0, Sq, q_row);
        copy_tile<QR, KEY_THREADS>(&sm.dout[buf][0][0][0], dout + b * o_batch + h * o_head, m0, Sq, o_row);
        const size_t row = ((size_t)b * H + h) * Sq_pad + m0;
        if (tid < QR / 4) cp_async_16(&sm.lse[buf][4 * tid], lse2 + row + 4 * tid, 16);
        else if (tid < QR / 2) cp_async_16(&sm.delta[buf][4 * (tid - QR / 4)], delta + row + 4 * (tid - QR / 4), 16);
#endif
    };
    if (!PRODUCER || tid < KEY_THREADS) {
        copy_tile<KEYS, KEY_THREADS>(&sm.k[0][0][0], k, n0, Sk, k_row);
        copy_tile<KEYS, KEY_THREADS>(&sm.v[0][0][0], v, n0, Sk, v_row);
    }
#if TMA_LOADS
    if (tid == LOADER) {
        for (int i = 0; i < 2; ++i) {
            mbar_init(&sm.full[i], 1);
            mbar_init(&sm.empty[i], KEY_THREADS);  // every thread, after its last read of the buffer
        }
#if PRODUCER
        for (int i = 0; i < DQ_BUFFERS; ++i)
            for (int w = 0; w < WARPGROUPS; ++w) {
                mbar_init(&sm.dq_full[i][w], THREADS);  // every thread of warpgroup w, after its stores
                mbar_init(&sm.dq_empty[i][w], 1);       // the producer's thread, once they are read out
            }
#endif
        mbar_init_fence();
        for (int i = 0; i < min(2, n_iter); ++i) issue(i);
    }
    cp_async_commit();
    cp_async_wait<0>();
    fence_proxy_async();  // K and V, visible to wgmma
    __syncthreads();      // and everybody's; the barriers initialised
#if PRODUCER
    if (wg == WARPGROUPS) {  // ---- the producer: one thread of warp 0 loads, one of warp 1 + w sums w's dQ ----
        regs_release<PRODUCER_REGS>();
        if (warp == 0 && lane == 0) {
            // step it into buffer it % 2 once every consumer thread is done with step it − 2 (the
            // phase before this one: on a fresh barrier, the wait for parity 1 passes at once)
            for (int it = 2; it < n_iter; ++it) {
                mbar_wait(&sm.empty[it % 2], ((it / 2) % 2) ^ 1);
                issue(it);
            }
        } else if (warp <= WARPGROUPS && lane == 0) {
            // warpgroup w's turns at dQ (every step, or with DQ_TURNS every other one), u-th into
            // buffer u % 2. One thread per warpgroup, so that each has its own bulk groups: the
            // wait for one warpgroup's reads never waits for the other's.
            const int w = warp - 1, c0 = DQ_SPLITS_D ? 64 * w : 0;
            int u = 0;
            for (int it = DQ_TURNS ? w : 0; it < n_iter; it += DQ_TURNS ? 2 : 1, ++u) {
                const int slot = u % DQ_BUFFERS;
                mbar_wait(&sm.dq_full[slot][w], (u / DQ_BUFFERS) % 2);  // the warpgroup's stores
                float* const dst = dq_accum + (((size_t)b * H + head_of(it)) * (Sq_pad / QR) + m0_of(it) / QR) * DP * QR;
                for (int c = c0; c < (DQ_SPLITS_D ? c0 + 64 : DP); c += 64)
                    bulk_reduce_add(dst + (c / 64) * 64 * QR, sm.dq[slot][w][(c - c0) / 64], 64 * QR * 4);
                bulk_commit();
                if (DQ_BUFFERS == 1) {  // ROWS80's one buffer: free once this turn's tiles are read out
                    asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
                    mbar_arrive(&sm.dq_empty[0][w]);
                } else if (u > 0) {  // turn u − 1's tiles read out (turn u's may still be): its buffer is free
                    bulk_wait_read_buffers();
                    mbar_arrive(&sm.dq_empty[(u - 1) % DQ_BUFFERS][w]);
                }
            }
            asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");  // before the block's memory goes
        }
        return;
    }
    regs_claim<CONSUMER_REGS>();
#endif
#else
    if (n_iter > 0) issue(0);
    cp_async_commit();
#endif

    float dk_acc[DKV / 2], dv_acc[DKV / 2];  // this warpgroup's 64 keys × D (D 256: × its half)
#pragma unroll
    for (int i = 0; i < DKV / 2; ++i) dk_acc[i] = dv_acc[i] = 0.0f;
    const int key0 = nw + 16 * warp + g;  // this thread's keys: key0 and key0 + 8
#if KV_REGS
    // K and V of this warpgroup's 64 keys, the A operands of Sᵀ and dPᵀ, read into registers once
    // for the whole block: k-step kk's register j holds key row 16·warp + g + 8·(j % 2), columns
    // 16kk + 8·(j / 2) + 2·i4 and + 1 (pack_a's layout). The products then read only Q and dO from
    // shared memory, half the bytes they read with both operands there. Only with TMA_LOADS (config()
    // says why): there the barrier above has seen K's and V's copies land.
    unsigned kf[D / 16][4], vf[D / 16][4];
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int at = sw<KEYS>(kw + 16 * warp + g + 8 * (j % 2), 16 * kk + 8 * (j / 2) + 2 * i4);
            kf[kk][j] = *reinterpret_cast<const unsigned*>(&sm.k[0][0][0] + at);
            if (KV_REGS == 1) vf[kk][j] = *reinterpret_cast<const unsigned*>(&sm.v[0][0][0] + at);
        }
#endif

#if DS_GUARD
    // Two warpgroups that both read all of dSᵀ every step (D 128): each arrives once for a step
    // −1 that read nothing, so that every step's store waits alike; a last wait after the loop
    // takes the last step's arrival (no barrier is left half-arrived at the block's exit).
    if (!DQ_TURNS) named_bar_arrive(5 - wg, 2 * THREADS);
#endif
    for (int it = 0; it < n_iter; ++it) {
#if TMA_LOADS
        mbar_wait(&sm.full[it % 2], (it / 2) % 2);  // this step's tiles have landed
#else
        cp_async_wait<0>();
        fence_proxy_async();  // this thread's copies, visible to wgmma
        __syncthreads();      // everybody's; and every wgmma of block it − 1 is done (waited below)
        if (it + 1 < n_iter) issue(it + 1);
        cp_async_commit();
#endif
        const int buf = it % 2;
        int m0 = m0_of(it);
        // PREP_EARLY: lse of the thread's 16 query columns (8j + 2·i4 and + 1: entries 2j and 2j + 1)
        // into registers, and m0 worked out, before the products are issued: the empty asm keeps the
        // compiler from sinking m0's division below the wait for Sᵀ (it moves arithmetic freely
        // across the asm statements that wait). PREP_EARLY 2: δ too, once Sᵀ is in.
        // PREP_EARLY 3: the same reads and m0 after the products are issued, before the wait for Sᵀ.
        float lse_r[QR / 4], delta_r[QR / 4];
        auto prep = [&] {
#pragma unroll
            for (int j = 0; j < QR / 8; ++j) {
                const float2 l = *reinterpret_cast<const float2*>(&sm.lse[buf][8 * j + 2 * i4]);
                lse_r[2 * j] = l.x, lse_r[2 * j + 1] = l.y;
            }
            asm volatile("" : "+r"(m0));
        };
        if (PREP_EARLY == 1 || PREP_EARLY == 2) prep();
        // score element i's query column: 8·(i / 4) + 2·i4 + i % 2
        auto lse_at = [&](int i) { return PREP_EARLY ? lse_r[2 * (i / 4) + i % 2] : sm.lse[buf][8 * (i / 4) + 2 * i4 + i % 2]; };
        auto delta_at = [&](int i) { return PREP_EARLY == 2 ? delta_r[2 * (i / 4) + i % 2] : sm.delta[buf][8 * (i / 4) + 2 * i4 + i % 2]; };

        // Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ (64 keys × 64 queries each), a commit group each.
        float s[QR / 2], dp[QR / 2];
        wgmma_fence();
#if KV_REGS
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) wgmma_rs_kmajor(s, kf[kk], kmajor(&sm.q[buf][0][0][0]) + k_step<QR>(kk), kk > 0);
        wgmma_commit();
        if (KV_REGS == 1) {
#pragma unroll
            for (int kk = 0; kk < D / 16; ++kk) wgmma_rs_kmajor(dp, vf[kk], kmajor(&sm.dout[buf][0][0][0]) + k_step<QR>(kk), kk > 0);
        } else {
            issue_rows_d<KEYS, QR>(dp, kmajor(&sm.v[0][kw][0]), kmajor(&sm.dout[buf][0][0][0]));
        }
        wgmma_commit();
#else
        issue_rows_d<KEYS, QR>(s, kmajor(&sm.k[0][kw][0]), kmajor(&sm.q[buf][0][0][0]));
        wgmma_commit();
        issue_rows_d<KEYS, QR>(dp, kmajor(&sm.v[0][kw][0]), kmajor(&sm.dout[buf][0][0][0]));
        wgmma_commit();
#endif
        if (PREP_EARLY == 3) prep();
        if (OVERLAP) wgmma_wait<1>();  // Sᵀ is done; dPᵀ may still be running
        else wgmma_wait<0>();
        fence_registers(s);
        if (PREP_EARLY == 2) {  // δ: read now, ready when dPᵀ is (not live across Sᵀ's product, as lse is)
#pragma unroll
            for (int j = 0; j < QR / 8; ++j) {
                const float2 d = *reinterpret_cast<const float2*>(&sm.delta[buf][8 * j + 2 * i4]);
                delta_r[2 * j] = d.x, delta_r[2 * j + 1] = d.y;
            }
        }

        // Pᵀ: element i is key key0 + 8·((i / 2) % 2) and query 8·(i / 4) + 2·i4 + i % 2.
#if WINDOW
        // a tile cut by a row's window edge (or the causal diagonal within it) masks per score:
        // key − query > hi_off or < lo_off, i.e. (over, under below) over + 8·hh − c > 0 or
        // under + 8·hh − c < 0, c = 8·(i / 4) + i % 2 known at compile time
        const bool straddles = nw + ROWS - 1 > m0 + hi_off || nw < m0 + QR - 1 + lo_off;
        const int over = key0 - m0 - 2 * i4 - hi_off, under = key0 - m0 - 2 * i4 - lo_off;
#else
        const bool straddles = causal && m0 + diag < nw + ROWS - 1;
#endif
        unsigned pa[QR / 16][4], dsa[QR / 16][4];
#if SOFTCAP
        // t = tanh(S / c) per score, P from the capped score; the 16-bit P of dV's product packed
        // two by two (pack_a's layout), s[i] keeping P·(1 − t²) for dS.
#pragma unroll
        for (int i = 0; i < QR / 2; i += 2) {
            float p2[2];
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int col = 8 * ((i + e) / 4) + 2 * i4 + (i + e) % 2;
                const float t = cap_tanh(s[i + e] * cap_mul);
                float p = fast_exp2(fmaf(t, cap_log2, -lse_at(i + e)));
#if WINDOW
                const int c = 8 * ((i + e) / 4) + (i + e) % 2 - 8 * (((i + e) / 2) % 2);
                if (straddles && (over - c > 0 || under - c < 0)) p = 0.0f;
#else
                if (straddles && key0 + 8 * (((i + e) / 2) % 2) > m0 + col + diag) p = 0.0f;
#endif
                p2[e] = p;
                s[i + e] = p * fmaf(-t, t, 1.0f);
            }
            pa[i / 8][(i % 8) / 2] = pack2(p2[0], p2[1]);
        }
#else
#if MASK_SPLIT
        if (!straddles) {  // no edge cuts the tile: no compares
#pragma unroll
            for (int i = 0; i < QR / 2; ++i)
                s[i] = fast_exp2(fmaf(s[i], scale_log2, -lse_at(i)));
        } else
#endif
#pragma unroll
        for (int i = 0; i < QR / 2; ++i) {
            const int col = 8 * (i / 4) + 2 * i4 + i % 2;
            float p = fast_exp2(fmaf(s[i], scale_log2, -lse_at(i)));
#if WINDOW
            const int c = 8 * (i / 4) + i % 2 - 8 * ((i / 2) % 2);
            if (straddles && (over - c > 0 || under - c < 0)) p = 0.0f;
#else
            if (straddles && key0 + 8 * ((i / 2) % 2) > m0 + col + diag) p = 0.0f;
#endif
            s[i] = p;
        }
        pack_a(pa, s);
#endif
        // dV += Pᵀ·dO (64 keys × D over the 64 queries, dO MN-major): with OVERLAP issued now, to
        // run under dPᵀ's end and the dS below.
        if (DV_EARLY) {
            wgmma_fence();
#pragma unroll
            for (int t = 0; t < QR / 16; ++t)
                Wgmma<DKV>::rs(dv_acc, pa[t], mnmajor<QR>(&sm.dout[buf][cw / 64][0][0]) + row_step(t), 1);
            wgmma_commit();
            wgmma_wait<1>();  // dPᵀ is done (groups complete in order); dV may still be running
        } else if (OVERLAP) {
            wgmma_wait<0>();  // ROWS80: dPᵀ, with dV issued after dS (Pᵀ's registers not live beside dS's)
        }
        fence_registers(dp);
        // dSᵀ = Pᵀ ∘ (dPᵀ − δ)·scale (SOFTCAP: s holds Pᵀ ∘ (1 − t²); SCALE_AT_END: without the scale)
        const float ds_scale = SCALE_AT_END ? 1.0f : scale;
#pragma unroll
        for (int i = 0; i < QR / 2; ++i) dp[i] = s[i] * (dp[i] - delta_at(i)) * ds_scale;
        pack_a(dsa, dp);

        // dK += dSᵀ·Q (Q MN-major), and without OVERLAP dV here too. (DK_LAST: dK after dQ, below.)
        auto issue_dk = [&](int t) { Wgmma<DKV>::rs(dk_acc, dsa[t], mnmajor<QR>(&sm.q[buf][cw / 64][0][0]) + row_step(t), 1); };
        if (!DV_EARLY || !DK_LAST) {
            wgmma_fence();
#pragma unroll
            for (int t = 0; t < QR / 16; ++t) {
                if (!DV_EARLY) Wgmma<DKV>::rs(dv_acc, pa[t], mnmajor<QR>(&sm.dout[buf][cw / 64][0][0]) + row_step(t), 1);
                if (!DK_LAST) issue_dk(t);
            }
            wgmma_commit();
        }
#if DQ_ATOMICS
#if DS_GUARD
        // the other warpgroup's dQ product of step it − 1 is done with sm.ds (DS_GUARD, above);
        // with DQ_TURNS it made one when this warpgroup did not
        if (DQ_TURNS ? it > 0 && it % 2 == wg : true) named_bar_sync(4 + wg, 2 * THREADS);
#endif
        // dSᵀ to shared memory, rows ROWS·wg + 16·warp + g (+ 8): dsa[t][j] holds queries
        // 16t + 8·(j / 2) + 2·i4 and + 1 of row + 8·(j % 2) (pack_a's layout). ROWS80: k-step 4
        // (queries 64-79) goes to the second atom, as k-step 0 to the first.
#if DS_STMATRIX
        {
            // tile j of k-step t: rows 8·(j % 2) …, queries 16t + 8·(j / 2) …, one 16-byte chunk of
            // each row (chunk 2t + j / 2 at (2t + j / 2) ^ row % 8); lane l gives tile l / 8's row l % 8
            const int lr = lane % 8 + 8 * ((lane / 8) % 2);
            const unsigned row_addr = smem_u32(&sm.ds[0][ROWS * wg + 16 * warp + lr][0]);
#pragma unroll
            for (int t = 0; t < QR / 16; ++t)
                stmatrix_x4(row_addr + (t / 4) * KEYS * 128 + (((2 * (t % 4) + lane / 16) ^ (lane % 8)) * 16),
                            dsa[t][0], dsa[t][1], dsa[t][2], dsa[t][3]);
        }
#elif PRODUCER
        {
            // The same addresses as below, from one row pointer and chunk c at c ^ g (rows g and
            // g + 8 share the swizzle), the XORs worked out each step: hoisted out of the loop, the
            // 16 addresses took registers that the 240 the producer leaves a warpgroup do not have
            // (ptxas spilled). The empty asm hides g's value, so the compiler cannot hoist them.
            int gx = g;
            asm volatile("" : "+r"(gx));
            elem_t* const ds_row = &sm.ds[0][0][0] + (ROWS * wg + 16 * warp + g) * 64 + 2 * i4;
#pragma unroll
            for (int t = 0; t < QR / 16; ++t)
#pragma unroll
                for (int j = 0; j < 4; ++j)
                    *reinterpret_cast<unsigned*>(ds_row + (t / 4) * KEYS * 64 + 8 * 64 * (j % 2) +
                                                 (((2 * (t % 4) + j / 2) ^ gx) * 8)) = dsa[t][j];
        }
#else
#pragma unroll
        for (int t = 0; t < QR / 16; ++t)
#pragma unroll
            for (int j = 0; j < 4; ++j)
                *reinterpret_cast<unsigned*>(&sm.ds[0][0][0] + sw<KEYS>(ROWS * wg + 16 * warp + g + 8 * (j % 2),
                                                                     16 * t + 8 * (j / 2) + 2 * i4)) = dsa[t][j];
#endif
        fence_proxy_async();  // these stores, visible to wgmma
        if (!DQ_EARLY && !DK_LAST) {
            wgmma_wait<0>();  // dV and dK done: pa and dsa free their registers for dQ's
            fence_registers(pa);
            fence_registers(dsa);
        }  // DQ_EARLY, DK_LAST: pa and dsa stay live (the fences at the step's end) while dV and dK run
        // The dQ tiles of step it − 2, which this step overwrites, were read out (those of step
        // it − 1 may still be in flight: two buffers); the barrier tells the warpgroup. (PRODUCER:
        // the buffer's empty mbarrier does, below.)
        if (DQ_BULK && !PRODUCER && tid % THREADS == 0) bulk_wait_read_buffers();
        // Every warpgroup's dSᵀ when a dQ product reads all keys' dS; else the warpgroup's own.
        // (PRODUCER: the consumers' threads alone, by a named barrier.)
        if (DQ_ALL_KEYS) {
            if (PRODUCER) named_bar_sync(3, KEY_THREADS);
            else __syncthreads();
        } else {
            named_bar_sync(1 + wg, THREADS);
        }
        // dQ rows m0 … m0 + 63, columns c0 … c0 + 63, over keys k0 … (both operands MN-major).
        const int c0 = DQ_SPLITS_D ? 64 * wg : 0, k0 = DQ_ALL_KEYS ? 0 : ROWS * wg;
        constexpr int DQ_STEPS = (DQ_ALL_KEYS ? KEYS : ROWS) / 16;
        const bool dq_turn = !DQ_TURNS || it % 2 == wg;  // this warpgroup makes this step's dQ
        // DQ_TURNS: a warpgroup's own turns alternate its two buffers
        const int dq_buf = DQ_TURNS ? (it / 2) % DQ_BUFFERS : it % DQ_BUFFERS;
#if !DQ_BULK
        float* const dq_rows = dq_accum + (((size_t)b * H + head_of(it)) * Sq_pad + m0 + 16 * warp + g) * DP;
#endif
#pragma unroll
        for (int c = c0; dq_turn && c < (DQ_SPLITS_D ? c0 + 64 : DP); c += 64) {
            float dq[32], dq16[8];  // ROWS80: dQᵀ, columns c … c + 63 of D × queries 0-63 and 64-79
            wgmma_fence();
#pragma unroll
            for (int t = 0; t < DQ_STEPS; ++t) {
                if (ROWS80) {  // dQᵀ = Kᵀ·dSᵀ (FlashAttention-3's dQ_swapAB): 80 queries are no 64-row wgmma
                    wgmma_ss_tt(dq, mnmajor<KEYS>(&sm.k[c / 64][k0][0]) + row_step(t),
                                mnmajor<KEYS>(&sm.ds[0][k0][0]) + row_step(t), t > 0);
                    wgmma_ss_tt16(dq16, mnmajor<KEYS>(&sm.k[c / 64][k0][0]) + row_step(t),
                                  mnmajor<KEYS>(&sm.ds[1][k0][0]) + row_step(t), t > 0);
                } else {
                    wgmma_ss_tt(dq, mnmajor<KEYS>(&sm.ds[0][k0][0]) + row_step(t),
                                mnmajor<KEYS>(&sm.k[c / 64][k0][0]) + row_step(t), t > 0);
                }
            }
            wgmma_commit();
            if (DK_LAST) {  // dK queued behind dQ; wait for dQ alone (and dV, before it)
#pragma unroll
                for (int t = 0; t < QR / 16; ++t) issue_dk(t);
                wgmma_commit();
                wgmma_wait<1>();
            } else {
                wgmma_wait<0>();
            }
            fence_registers(dq);
            if (ROWS80) fence_registers(dq16);
#if DS_GUARD
            // This product has read sm.ds: the other warpgroup may store its next dSᵀ (DS_GUARD;
            // the loop makes one product here, D 64's or this warpgroup's half of D 128's). Before
            // the wait for a free dQ buffer below: after it, the other warpgroup waited for this
            // one's bulk reductions too (0.93-0.94x at D 64 in a record).
            if (DQ_TURNS ? it + 1 < n_iter : true) named_bar_arrive(5 - wg, 2 * THREADS);
#endif
#if DQ_BULK
            // Thread t's elements 4n … 4n + 3 at (128n + t)·4 of the tile: a warp's stores are 512
            // contiguous bytes. The launcher's postprocess reads this order back. (ROWS80: dQᵀ's
            // elements, n = 8, 9 from dq16; the tile is 64 columns of D × 80 queries.)
            float* const tile = sm.dq[dq_buf][wg][(c - c0) / 64];
#if PRODUCER
            // the copy engine has read this buffer's tiles of two turns ago out
            if (c == c0) mbar_wait(&sm.dq_empty[dq_buf][wg], (((DQ_TURNS ? it / 2 : it) / DQ_BUFFERS) % 2) ^ 1);
#endif
#pragma unroll
            for (int n = 0; n < 8; ++n)
                *reinterpret_cast<float4*>(tile + (128 * n + tid % THREADS) * 4) =
                    make_float4(dq[4 * n], dq[4 * n + 1], dq[4 * n + 2], dq[4 * n + 3]);
            if (ROWS80) {
#pragma unroll
                for (int n = 0; n < 2; ++n)
                    *reinterpret_cast<float4*>(tile + (128 * (8 + n) + tid % THREADS) * 4) =
                        make_float4(dq16[4 * n], dq16[4 * n + 1], dq16[4 * n + 2], dq16[4 * n + 3]);
            }
#else
            // dq element i: row 16·warp + g + 8·((i / 2) % 2), column c + 8·(i / 4) + 2·i4 + i % 2.
#pragma unroll
            for (int i = 0; i < 32; i += 2)
                red_add2(dq_rows + 8 * ((i / 2) % 2) * DP + c + 8 * (i / 4) + 2 * i4, dq[i], dq[i + 1]);
#endif
        }
        if (DK_LAST && !dq_turn) {  // DQ_TURNS: the other warpgroup's turn at dQ; dK alone
            wgmma_fence();
#pragma unroll
            for (int t = 0; t < QR / 16; ++t) issue_dk(t);
            wgmma_commit();
        }
#if DQ_BULK
        if (dq_turn) {
            fence_proxy_async();                     // the tiles, visible to the copy engine
#if PRODUCER
            mbar_arrive(&sm.dq_full[dq_buf][wg]);    // this thread's are stored: the producer sums them
#else
            named_bar_sync(1 + wg, THREADS);         // the whole warpgroup's
            if (tid % THREADS == 0) {
                // dQ tile (bh, query block, 64-column block): 4,096 floats from dq_accum + 4096 × its index
                float* const dst = dq_accum + (((size_t)b * H + head_of(it)) * (Sq_pad / QR) + m0 / QR) * DP * QR;
#pragma unroll
                for (int c = c0; c < (DQ_SPLITS_D ? c0 + 64 : DP); c += 64)
                    bulk_reduce_add(dst + (c / 64) * 64 * QR, sm.dq[dq_buf][wg][(c - c0) / 64], 64 * QR * 4);
                bulk_commit();
            }
#endif
        }
#endif
#endif
        wgmma_wait<0>();  // before the next copy may overwrite these buffers, and pa/dsa change
        fence_registers(pa);  // read by the asynchronous products until here
        fence_registers(dsa);
        fence_registers(dv_acc);
        fence_registers(dk_acc);
#if TMA_LOADS
        // This thread is done with buffer it % 2 (its wgmmas waited for, its lse and δ read);
        // once every thread is, thread 0 refills it with step it + 2 (thread 0 waits for the
        // slowest thread here, the others go on).
        mbar_arrive(&sm.empty[buf]);
        if (!PRODUCER && tid == 0 && it + 2 < n_iter) {
            mbar_wait(&sm.empty[buf], (it / 2) % 2);
            issue(it + 2);
        }
#endif
    }
#if DS_GUARD
    if (!DQ_TURNS) named_bar_sync(4 + wg, 2 * THREADS);  // the other's last arrival (above the loop)
#endif
    cp_async_wait<0>();
    // (PRODUCER: the consumers issued no bulk groups, so this waits for nothing)
    if (DQ_BULK && tid % THREADS == 0) asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");  // before the block's memory goes
#if SCALE_AT_END
#pragma unroll
    for (int i = 0; i < DKV / 2; ++i) dk_acc[i] *= scale;  // the scale dSᵀ went without
#endif
    // dK and dV, rows key0 and key0 + 8: element i at column 8·(i / 4) + 2·i4 + i % 2.
    const size_t out_rows = (size_t)bhk * Sk;
#if EPILOGUE_SMEM
    // [KEYS][DP], dK over Q's buffers and dV over dO's; 16-byte piece c of row r at c ^ (r % 8):
    // the pairs' stores (8 rows, 4 lanes each) and the pieces' loads (8 lanes, one row) hit 32
    // banks. Each warp reads back only the 16 rows it wrote, so a warp barrier orders them.
    static_assert(sizeof(KeySmem::q) >= KEYS * DP * sizeof(elem_t) && sizeof(KeySmem::dout) == sizeof(KeySmem::q),
                  "dK and dV fit in Q's and dO's buffers");
    elem_t* const dk_tile = &sm.q[0][0][0][0];
    elem_t* const dv_tile = &sm.dout[0][0][0][0];
    auto piece = [](int r, int c) { return r * DP + ((c / 8) ^ (r % 8)) * 8 + c % 8; };
    named_bar_sync(3, KEY_THREADS);  // every warpgroup's products are done reading Q and dO
    const int row0 = kw + 16 * warp;  // the warp's 16 keys, rows of the block's
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
#pragma unroll
        for (int n = 0; n < DKV / 8; ++n) {
            const int r = row0 + g + 8 * hh, c = cw + 8 * n + 2 * i4;
            *reinterpret_cast<unsigned*>(dk_tile + piece(r, c)) = pack2(dk_acc[4 * n + 2 * hh], dk_acc[4 * n + 2 * hh + 1]);
            *reinterpret_cast<unsigned*>(dv_tile + piece(r, c)) = pack2(dv_acc[4 * n + 2 * hh], dv_acc[4 * n + 2 * hh + 1]);
        }
    }
    __syncwarp();
    constexpr int PIECES = DKV / 8;  // 16-byte pieces of a row's DKV columns
#pragma unroll
    for (int j = 0; j < 16 * PIECES / 32; ++j) {
        const int r = row0 + (lane + 32 * j) / PIECES, c = cw + 8 * ((lane + 32 * j) % PIECES);
        if (n0 + r < Sk && (DP == D || c < D)) {  // D 96: columns 96-127 are not the tensor's
            const size_t at_out = (out_rows + n0 + r) * D + c;
            *reinterpret_cast<uint4*>(dk + at_out) = *reinterpret_cast<const uint4*>(dk_tile + piece(r, c));
            *reinterpret_cast<uint4*>(dv + at_out) = *reinterpret_cast<const uint4*>(dv_tile + piece(r, c));
        }
    }
#else
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        const int key = key0 + 8 * hh;
        if (key < Sk) {
#pragma unroll
            for (int n = 0; n < DKV / 8; ++n) {
                if (DP != D && cw + 8 * n >= D) continue;  // D 96: columns 96-127 are not the tensor's
                const size_t at_out = (out_rows + key) * D + cw + 8 * n + 2 * i4;
                *reinterpret_cast<unsigned*>(dk + at_out) = pack2(dk_acc[4 * n + 2 * hh], dk_acc[4 * n + 2 * hh + 1]);
                *reinterpret_cast<unsigned*>(dv + at_out) = pack2(dv_acc[4 * n + 2 * hh], dv_acc[4 * n + 2 * hh + 1]);
            }
        }
    }
#endif
}

// The dQ pass: 64 query rows of one (batch, head) per block; K and V tiles of 64 keys through a
// ring of two. S = Q·Kᵀ and dP = dO·Vᵀ, dS in registers, dQ += dS·K with K MN-major.
extern "C" __global__ void __launch_bounds__(THREADS, 1)
attention_backward_dq(const elem_t* q, const elem_t* k, const elem_t* v, const elem_t* dout,
                      const float* lse2, const float* delta, elem_t* dq,
                      int Sq, int Sk, int Sq_pad, float scale_log2, float scale, int causal, int H, int group,
                      long long q_batch, long long q_head, int q_row, long long k_batch, long long k_head, int k_row,
                      long long v_batch, long long v_head, int v_row, long long o_batch, long long o_head, int o_row
                      VARIANT_PARAMS) {
    extern __shared__ unsigned char smem_raw[];
    QuerySmem& sm = aligned_smem<QuerySmem>(smem_raw);
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int g = lane / 4, i4 = lane % 4;
    const int n_q_blocks = (Sq + ROWS - 1) / ROWS;
    const int bh = blockIdx.x / n_q_blocks, b = bh / H, h = bh % H;
    const int m0 = (n_q_blocks - 1 - blockIdx.x % n_q_blocks) * ROWS;  // causal: longest first
    k += b * k_batch + h / group * k_head;
    v += b * v_batch + h / group * v_head;
    const int diag = causal_diagonal(causal, Sq, Sk);
#if WINDOW
    // rows m0 … m0 + 63 see keys m0 + lo_off … m0 + 63 + hi_off: key tiles j0 … n_tiles − 1
    const int hi_off = causal ? min(diag, Sk - Sq + win_right) : Sk - Sq + win_right;
    const int lo_off = Sk - Sq - win_left;
    const int n_keys = max(0, min(Sk, m0 + ROWS + hi_off));
    const int n_tiles = (n_keys + ROWS - 1) / ROWS;
    const int j0 = min(n_tiles, max(0, m0 + lo_off) / ROWS);
#else
    const int n_keys = causal ? max(0, min(Sk, m0 + ROWS + diag)) : Sk;
    const int n_tiles = (n_keys + ROWS - 1) / ROWS;
    constexpr int j0 = 0;
#endif

    copy_tile<ROWS>(&sm.q[0][0][0], q + b * q_batch + h * q_head, m0, Sq, q_row);
    copy_tile<ROWS>(&sm.dout[0][0][0], dout + b * o_batch + h * o_head, m0, Sq, o_row);
    if (n_tiles > j0) {
        copy_tile<ROWS>(&sm.k[0][0][0][0], k, j0 * ROWS, Sk, k_row);
        copy_tile<ROWS>(&sm.v[0][0][0][0], v, j0 * ROWS, Sk, v_row);
    }
    cp_async_commit();
    const int query0 = m0 + 16 * warp + g;  // this thread's rows: query0 and query0 + 8
    const size_t row_at = (size_t)bh * Sq_pad + query0;
    const float lse_r[2] = {__ldg(lse2 + row_at), __ldg(lse2 + row_at + 8)};
    const float delta_r[2] = {__ldg(delta + row_at), __ldg(delta + row_at + 8)};

    float dq_acc[DP / 2];
#pragma unroll
    for (int i = 0; i < DP / 2; ++i) dq_acc[i] = 0.0f;

    for (int j = j0; j < n_tiles; ++j) {
        cp_async_wait<0>();
        fence_proxy_async();
        __syncthreads();
        if (j + 1 < n_tiles) {
            copy_tile<ROWS>(&sm.k[(j + 1 - j0) % 2][0][0][0], k, (j + 1) * ROWS, Sk, k_row);
            copy_tile<ROWS>(&sm.v[(j + 1 - j0) % 2][0][0][0], v, (j + 1) * ROWS, Sk, v_row);
        }
        cp_async_commit();
        const int buf = (j - j0) % 2, k0 = j * ROWS;

        float s[32], dp[32];
        wgmma_fence();
        issue_rows_d(s, kmajor(&sm.q[0][0][0]), kmajor(&sm.k[buf][0][0][0]));
        wgmma_commit();
        issue_rows_d(dp, kmajor(&sm.dout[0][0][0]), kmajor(&sm.v[buf][0][0][0]));
        wgmma_commit();
        if (OVERLAP) wgmma_wait<1>();  // S is done; P is computed while dP is multiplied
        else wgmma_wait<0>();
        fence_registers(s);

        // P, then dS in place of dP: element i is row query0 + 8·((i / 2) % 2), key
        // k0 + 8·(i / 4) + 2·i4 + i % 2.
#if WINDOW
        const bool straddles = k0 + ROWS - 1 > m0 + hi_off || k0 < m0 + ROWS - 1 + lo_off;
#else
        const bool straddles = causal && k0 + ROWS - 1 > m0 + diag;
#endif
#pragma unroll
        for (int i = 0; i < 32; ++i) {
            const int hh = (i / 2) % 2;
#if SOFTCAP
            const float t = cap_tanh(s[i] * cap_mul);  // P from the capped score, dS from P·(1 − t²)
            float p = fast_exp2(fmaf(t, cap_log2, -lse_r[hh]));
#else
            float p = fast_exp2(fmaf(s[i], scale_log2, -lse_r[hh]));
#endif
#if WINDOW
            const int key = k0 + 8 * (i / 4) + 2 * i4 + i % 2, row = query0 + 8 * hh;
            if (straddles && (key > row + hi_off || key < row + lo_off)) p = 0.0f;
#else
            if (straddles && k0 + 8 * (i / 4) + 2 * i4 + i % 2 > query0 + 8 * hh + diag) p = 0.0f;
#endif
#if SOFTCAP
            s[i] = p * fmaf(-t, t, 1.0f);
#else
            s[i] = p;
#endif
        }
        wgmma_wait<0>();
        fence_registers(dp);
#pragma unroll
        for (int i = 0; i < 32; ++i) dp[i] = s[i] * (dp[i] - delta_r[(i / 2) % 2]) * scale;
        unsigned dsa[ROWS / 16][4];
        pack_a(dsa, dp);
        wgmma_fence();
#pragma unroll
        for (int t = 0; t < ROWS / 16; ++t)
            Wgmma<DP>::rs(dq_acc, dsa[t], mnmajor<ROWS>(&sm.k[buf][0][0][0]) + row_step(t), 1);
        wgmma_commit();
        wgmma_wait<0>();
        fence_registers(dsa);
        fence_registers(dq_acc);
    }
    cp_async_wait<0>();
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        const int row = query0 + 8 * hh;
        if (row < Sq) {
            elem_t* const to = dq + ((size_t)bh * Sq + row) * D + 2 * i4;
#pragma unroll
            for (int n = 0; n < D / 8; ++n)
                *reinterpret_cast<unsigned*>(to + 8 * n) = pack2(dq_acc[4 * n + 2 * hh], dq_acc[4 * n + 2 * hh + 1]);
        }
    }
}

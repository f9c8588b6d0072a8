// Stage 7 — FP8 (e4m3): FlashAttention-3's third idea, on stage 6's kernel (sm_90a).
//
// Stage 6's warp-specialized kernel (a TMA producer warpgroup, consumer warpgroups of 64 query
// rows running asynchronous wgmma, ping-pong and the softmax overlapped with P·V) with both
// products in e4m3, which the tensor cores run at twice the 16-bit rate. What changes from
// stage 6 (diff stages/stage6.cu stages/stage7.cu):
//   1. Q, K and Vᵀ tiles hold e4m3 bytes. A row of Q or K is D bytes: at D = 128 one 128-byte
//      swizzle row (as 64 16-bit elements were in stage 6), at D = 64 one 64-byte row in the
//      64-byte swizzle.
//   2. S = Q·Kᵀ: wgmma m64nNk32 e4m3 — 32 bytes of D per k-step, D/32 steps.
//   3. O += P·V: 8-bit wgmma takes both shared-memory operands K-major only (the tensor core
//      transposes B on the fly for 16-bit types alone), so its B operand is Vᵀ [D][keys], laid
//      out before the kernel by lib.fp8.v_for_pv (a separate pass) or, with V_IN_KERNEL, by the
//      producer warpgroup from V's own tiles (FlashAttention-3's way: transpose_v), with each
//      32-key k-step's keys in lib.fp8.key_order(). In that order P's e4m3 A fragment takes each
//      thread's own accumulators (to_operand): no shuffle, only conversions and byte packing.
//   4. Scales: S holds raw products of e4m3 values. The work tile's q_descale·k_descale (one
//      each per batch entry and K/V head, FlashAttention-3's shape) joins the softmax scale, and
//      v_descale joins O's final 1 / l.
//   5. P in e4m3 with FlashAttention-3's offset (P_OFFSET_LOG2 = 8): the softmax's base is the
//      row max minus 8 in log2 units, so P lies in [0, 2^8] instead of [0, 1], clear of e4m3's
//      subnormals below 2^-6; l carries the same factor, which cancels in O / l. The lazy rescale
//      may keep a row's max only while no score exceeds it (LAZY_RESCALE 0): with the offset, a
//      P above 1.75 would pass e4m3's largest value, 448.
//   6. O leaves in 16 bits (the call's output type, elem_t here) by plain stores.
//   7. Key tiles up to 224 keys (stages/stage7.py picks 192 at D128): the products between two
//      tiles' fixed costs take half stage 6's time, so wider tiles pay more here. A Vᵀ tile
//      then comes in sub-tiles of VT_ATOM keys, each its own copy and swizzle (see Smem).
//   8. ROW_SUM_MMA (stages/stage7.py turns it on at D64): each row's sum of P comes out of P·V,
//      from a row of ones under every Vᵀ sub-tile, instead of an FADD per score (see O_COLS).
//   9. TAIL_SPLIT (with the work queue): the last work tiles, those that would run alone in a
//      last partial wave, are split into pieces along the keys, each writing its rows in fp32,
//      and a small kernel after this one combines them (see work_item and finish_piece).
// Stage 6's serving paths (split-KV, packed GQA, packed sequences, per-entry key lengths), its
// TMA-store epilogue, CARRY_PV and the timeline are not in this stage: stages/stage7.py refuses
// those options and runs decoding shapes unsplit.
#include "fp8.cuh"  // hopper.cuh, wgmma_e4m3_ss/rs, to_e4m3x2
#include "pdl.cuh"  // griddep_wait: launched with PDL after stage7_quantize.cu's casts
#include "work_queue.cuh"  // handed_out: the work queue's order

#if !defined(BLOCK_N) || !defined(STAGES) || !defined(CONSUMERS)
#error "BLOCK_N, STAGES and CONSUMERS are set by stages/stage7.py"
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
#ifndef EXP2_POLY_EIGHTHS
#define EXP2_POLY_EIGHTHS 0
#endif
#ifndef LAZY_RESCALE
#define LAZY_RESCALE 0
#endif
#ifndef DYNAMIC_WORK
#define DYNAMIC_WORK 0
#endif
#ifndef Q_STAGES
#define Q_STAGES 1  // Q buffers: 2 lets a persistent block load its next work tile's Q early
#endif
#ifndef V_IN_KERNEL
#define V_IN_KERNEL 0  // 1: the producer warpgroup transposes V's tiles itself (no Vᵀ pass before the kernel)
#endif
#ifndef P_OFFSET_LOG2
#define P_OFFSET_LOG2 8  // P cast to e4m3 as P·2^8 (FlashAttention-3's Max_offset); 0: as it is
#endif
#ifndef ROW_SUM_MMA
#define ROW_SUM_MMA 0  // 1: each row's sum of P comes out of P·V, from a row of ones under Vᵀ (O_COLS)
#endif
#ifndef TAIL_SPLIT
#define TAIL_SPLIT 0  // 1: the queue's last partial wave of work tiles split along the keys (work_item)
#endif
#ifndef SKIP_ROWS_PAST_END
#define SKIP_ROWS_PAST_END 1  // 1: a consumer whose 64 rows all lie past the last query computes nothing (as in stage 6)
#endif
static_assert(WARP_SPECIALIZED || (!SETMAXNREG && !PINGPONG && !INTRA_OVERLAP),
              "the baseline without a producer warpgroup runs without the FA3 schedule");
static_assert(!PINGPONG || CONSUMERS >= 2, "ping-pong needs two consumer warpgroups");
static_assert(!DYNAMIC_WORK || WARP_SPECIALIZED, "the producer warpgroup takes the work tiles from the queue");
static_assert(!TAIL_SPLIT || DYNAMIC_WORK, "the queue hands out the tail's pieces as it frees SMs");
static_assert(!V_IN_KERNEL || (WARP_SPECIALIZED && !DYNAMIC_WORK),
              "the producer warpgroup transposes V, all its threads walking the same fixed stride of work tiles");
static_assert(LAZY_RESCALE <= 0, "P·2^P_OFFSET_LOG2 must stay within e4m3's 448: a kept max may not be exceeded");
static_assert(P_OFFSET_LOG2 >= 0 && P_OFFSET_LOG2 <= 8, "P·2^8 is the most e4m3 holds (448)");

constexpr int D = HEAD_DIM;
constexpr int BLOCK_M = 64 * CONSUMERS;           // query rows per block, 64 per consumer
constexpr int Q_BYTES = BLOCK_M * D;              // e4m3: one byte per element
constexpr int KV_BYTES = BLOCK_N * D;             // a K tile, and a Vᵀ tile (D rows of BLOCK_N keys)
constexpr int THREADS = 128 * (CONSUMERS + WARP_SPECIALIZED);
// ROW_SUM_MMA: the softmax's row sums move from the FMA pipes (one FADD per score, 13% of the
// instructions at D64) to the tensor cores, which are busy about half the time here. Vᵀ's
// tiles get 8 more rows, a row of ones (e4m3 1.0 = 0x38) and 7 of zeros, written once per
// block (the copies fill only the first D); P·V then runs N = D + 8 and its column D is
// Σ P·1 for each row: l is the sum of the e4m3 P that P·V multiplied (lib.fp8's sum_rounded),
// not of the fp32 P before rounding. That column is moved into l in fp32 after every P·V
// (take_row_sums): left to grow in the accumulator over a long row, its sums kept too few bits
// (Hopper's FP8 wgmma keeps about 13 below the largest addend, and cuts toward zero), and
// every P being positive those cuts added up: 9x the kernel rule's RMSE allowance at S 8192,
// 1.4x at S 2048 (results/logs/2026-11-26-4103813-h100).
constexpr int O_COLS = D + 8 * ROW_SUM_MMA;  // O's accumulator columns (and Vᵀ sub-tile rows)
// Registers per thread after setmaxnreg, as in stage 6 (2 consumers: 128·24 + 256·240 = 64,512;
// 3: 128·32 + 384·160; the work queue's producer keeps 40 with one or two consumers; a producer
// that transposes V keeps 64 — with 56 it spilled a register: 128·64 + 256·216 = 63,488,
// 128·64 + 384·144 = 63,488).
constexpr int PRODUCER_REGS = V_IN_KERNEL ? 64 : CONSUMERS == 3 ? 32 : DYNAMIC_WORK ? 40 : 24;
constexpr int CONSUMER_REGS = V_IN_KERNEL ? (CONSUMERS == 3 ? 144 : 216) : CONSUMERS == 3 ? 160 : DYNAMIC_WORK ? 232 : 240;
constexpr int PRODUCER_BAR = 8;  // named barrier of the producer warpgroup's 128 threads (V_IN_KERNEL)
constexpr int TURN_BAR = 4;  // named barriers TURN_BAR + c: consumer c's turn to issue products
static_assert(CONSUMERS <= 3, "named barriers 1-3 and 4-6 are the consumers' own");
static_assert(D == 64 || D == 128, "head dims 64 and 128");
// Key tiles of 128 to 224 keys (FlashAttention-3's FP8 tiles: 160 at D64, 224 at D128). A Vᵀ
// tile is stored as BLOCK_N / VT_ATOM sub-tiles of [D][VT_ATOM] bytes, each row one swizzle row
// of the widest pattern that divides BLOCK_N (128, 64 or 32 bytes): the copy engine swizzles
// rows of at most 128 bytes, and a 32-key k-step must lie inside one row.
constexpr int VT_ATOM = BLOCK_N % 128 == 0 ? 128 : BLOCK_N % 64 == 0 ? 64 : 32;
static_assert(BLOCK_N == 128 || BLOCK_N == 160 || BLOCK_N == 192 || BLOCK_N == 224,
              "key tiles of 128, 160, 192 or 224 (fp8.cuh's S products)");
static_assert(!V_IN_KERNEL || BLOCK_N == 128, "transpose_v writes one 128-byte-swizzled Vᵀ tile of 128 keys");
static_assert(Q_STAGES == 1 || Q_STAGES == 2, "one Q buffer, or two (Q_STAGES)");

// Shared memory. Q and K tiles are [rows][D] bytes, Vᵀ tiles [BLOCK_N / VT_ATOM][D][VT_ATOM]
// bytes: each row is one swizzle row (D = 128: 128 bytes, the 128-byte swizzle; D = 64: the
// 64-byte swizzle; Vᵀ's VT_ATOM bytes, its own), and every tile starts on a 1024-byte boundary,
// where each pattern repeats. That is the layout TMA writes with the maps' swizzle and wgmma's
// descriptors describe.
struct Smem {
    u8 q[Q_STAGES][BLOCK_M][D];
    u8 k[STAGES][BLOCK_N][D];
    u8 vt[STAGES][BLOCK_N / VT_ATOM][O_COLS][VT_ATOM];  // rows D … O_COLS − 1: ROW_SUM_MMA's ones
#if V_IN_KERNEL
    u8 vs[2][BLOCK_N][D];  // V tiles as TMA brings them ([keys][D], laid out as K's), before transpose_v
    unsigned long long vs_full[2];
#endif
    unsigned long long q_full[Q_STAGES], q_empty[Q_STAGES];
    unsigned long long k_full[STAGES], v_full[STAGES], k_empty[STAGES], v_empty[STAGES];
    int work[Q_STAGES];  // DYNAMIC_WORK: the work item whose Q is in that buffer (n_items: none left)
};

// Descriptor of a K-major e4m3 tile whose rows are ROW bytes, each one swizzle row (Q and K: D
// bytes; a Vᵀ sub-tile: VT_ATOM): groups of 8 rows 8·ROW bytes apart (stride offset), swizzle
// mode 1, 2 or 3 for 128-, 64- or 32-byte rows; for 128-byte rows hopper.cuh's smem_desc.
template <int ROW>
__device__ __forceinline__ unsigned long long kmajor_desc(const void* tile) {
    static_assert(ROW == 128 || ROW == 64 || ROW == 32, "rows of one 128-, 64- or 32-byte swizzle row");
    constexpr unsigned long long mode = ROW == 128 ? 1 : ROW == 64 ? 2 : 3;
    return ((smem_u32(tile) & 0x3FFFF) >> 4) | ((unsigned long long)((8 * ROW) >> 4) << 32) | (mode << 62);
}

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
__device__ __forceinline__ unsigned pack2(float lo, float hi) {  // two floats → two 16-bit elements
#ifdef ELEM_BF16
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
#else
    __half2 h = __floats2half2_rn(lo, hi);
#endif
    return *reinterpret_cast<unsigned*>(&h);
}

// ---- the producer's copies -------------------------------------------------------------------
// A block's work tile number `count` (0, 1, …) has Q buffer count % Q_STAGES, reused by work
// tile count + Q_STAGES once every consumer thread released it: with one buffer the next Q
// waits for this tile's last S = Q·Kᵀ; with two it waits only for the tile before, so it is
// loaded while this tile's products still run. With DYNAMIC_WORK the buffer's `work` slot
// also tells the consumers which work tile w this is: the store comes before the arrival on
// q_full (an arrive releases, a wait acquires), so a consumer that has waited for q_full reads
// this w. Nothing overwrites it before every consumer has read it: the next store waits for
// q_empty, which the consumers release after reading.
__device__ __forceinline__ void load_q(Smem& sm, const CUtensorMap* map, int count, int q0, int h, int b, int w) {
    const int qs = count % Q_STAGES;
    mbar_wait(&sm.q_empty[qs], ((count / Q_STAGES) & 1) ^ 1);
    if (DYNAMIC_WORK) sm.work[qs] = w;
    mbar_arrive_expect_bytes(&sm.q_full[qs], Q_BYTES);
    tma_load_4d(&sm.q[qs][0][0], map, &sm.q_full[qs], 0, q0, h, b);
}
// Tile `key_tile` of K ({0, keys, hk, b}: rows of D bytes) or of Vᵀ ({keys, 0, hk, b}: D rows of
// BLOCK_N keys, one copy per sub-tile of VT_ATOM keys) into its ring at ring position `pos`
// (counted over the block's whole life, so
// parities carry across work tiles), once buffer pos % STAGES is free again: when its previous
// use, pos − STAGES, was released — the ((pos / STAGES) − 1)-th phase of its empty barrier. For
// the first STAGES positions the parity asked for is that of the phase "before the first",
// which counts as completed.
__device__ __forceinline__ void load_tile(u8* tile, unsigned long long* full, unsigned long long* empty,
                                          const CUtensorMap* map, int pos, int key_tile, int hk, int b,
                                          bool transposed) {
    const int st = pos % STAGES;
    mbar_wait(&empty[st], ((pos / STAGES) & 1) ^ 1);
    mbar_arrive_expect_bytes(&full[st], KV_BYTES);
    if (transposed)
        for (int a = 0; a < BLOCK_N / VT_ATOM; ++a)
            tma_load_4d(tile + a * O_COLS * VT_ATOM, map, &full[st], key_tile * BLOCK_N + a * VT_ATOM, 0, hk, b);
    else tma_load_4d(tile, map, &full[st], 0, key_tile * BLOCK_N, hk, b);
}

#if V_IN_KERNEL
// Byte (key, byte) of a tile of D-byte rows as TMA writes it: 16-byte chunk c of row r at chunk
// c ^ (r mod 8) with the 128-byte swizzle (D = 128), c ^ ((r / 2) mod 4) with the 64-byte one.
__device__ __forceinline__ int kv_offset(int row, int byte) {
    const int chunk = D == 128 ? (byte / 16) ^ (row % 8) : (byte / 16) ^ ((row / 2) % 4);
    return row * D + chunk * 16 + byte % 16;
}
// V tile [BLOCK_N keys][D] → Vᵀ tile [D][BLOCK_N slots] (128-byte rows, 128-byte swizzle), the
// keys of each 32-slot k-step in lib.fp8.key_order(): what lib.fp8.v_for_pv lays out in global
// memory, here done per tile by the producer warpgroup's 128 threads (`pt`: 0-127). A task is
// 4 dims × one 16-slot chunk of Vᵀ; its slots 4q … 4q + 3 take keys 2q, 2q + 1, 2q + 8, 2q + 9
// of the chunk's 16. Four 4-byte loads (4 dims of 4 keys), a 4 × 4 byte transpose (six byte
// permutes), four 4-byte stores (4 keys of each dim).
// (Shared-memory loads and stores by address: through a generic pointer computed from the
// aligned base, the compiler could not tell these were shared and emitted generic LD/ST.)
__device__ __forceinline__ unsigned lds32(unsigned addr) {
    unsigned v;
    asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(addr) : "memory");
    return v;
}
__device__ __forceinline__ void sts32(unsigned addr, unsigned v) {
    asm volatile("st.shared.u32 [%0], %1;\n" :: "r"(addr), "r"(v) : "memory");
}
// Each lane starts its four words and four dims at its own rotation (rq, re): in the plain
// order the 32 lanes of a store instruction hit rows d with only two values of d mod 8, 16-way
// bank conflicts at D 128 (counted offline: 2,048 store wavefronts per tile against 128 rotated).
__device__ __forceinline__ void transpose_v(const u8* src_tile, u8* dst_tile, int pt) {
    const unsigned src = smem_u32(src_tile), dst = smem_u32(dst_tile);
    const int rq = (pt % 32) >> 3, re = (pt >> 1) & 3;
    for (int task = pt; task < (D / 4) * (BLOCK_N / 16); task += 128) {
        const int d0 = 4 * (task % (D / 4)), c = task / (D / 4), key0 = 16 * c;
#pragma unroll
        for (int qq = 0; qq < 4; ++qq) {
            const int q = (qq + rq) & 3;
            const int k = key0 + 2 * q;
            const unsigned w0 = lds32(src + kv_offset(k, d0)), w1 = lds32(src + kv_offset(k + 1, d0));
            const unsigned w2 = lds32(src + kv_offset(k + 8, d0)), w3 = lds32(src + kv_offset(k + 9, d0));
            const unsigned lo01 = __byte_perm(w0, w1, 0x5140), hi01 = __byte_perm(w0, w1, 0x7362);
            const unsigned lo23 = __byte_perm(w2, w3, 0x5140), hi23 = __byte_perm(w2, w3, 0x7362);
            const unsigned out[4] = {__byte_perm(lo01, lo23, 0x5410), __byte_perm(lo01, lo23, 0x7632),
                                     __byte_perm(hi01, hi23, 0x5410), __byte_perm(hi01, hi23, 0x7632)};
#pragma unroll
            for (int ee = 0; ee < 4; ++ee) {  // dim d0 + e: row d0 + e of Vᵀ, chunk c swizzled, word q
                const int e = (ee + re) & 3, d = d0 + e;
                const unsigned word = e == 0 ? out[0] : e == 1 ? out[1] : e == 2 ? out[2] : out[3];  // selects: no local memory
                sts32(dst + d * BLOCK_N + ((c ^ (d % 8)) * 16) + 4 * q, word);
            }
        }
    }
}
#endif

// A block's work tile: BLOCK_M query rows of one (batch, head) and its key tiles 0 …
// n_tiles − 1. Work w is query block w % n_qb of head w / n_qb; causal work starts with the
// heaviest query block of each head. Causal (stages/attention.cuh): query i sees keys
// j <= i + diag, diag = 0 (top-left) or Sk − Sq (bottom-right).
struct Work {
    int w, b, h, hk, q0, diag;
    int kt0, n_tiles;  // its key tiles kt0 … kt0 + n_tiles − 1 (all of them, unless a piece)
    int split;         // TAIL_SPLIT: which piece of work tile w (−1: the whole tile)
};
__device__ __forceinline__ Work work_tile(int w, int n_qb, int H, int group, int Sq, int Sk, int causal) {
    Work t;
    t.w = w, t.kt0 = 0, t.split = -1;
    const int bh = w / n_qb;
    const int qb = causal ? n_qb - 1 - w % n_qb : w % n_qb;
    t.b = bh / H;
    t.h = bh % H;
    t.hk = t.h / group;
    t.q0 = qb * BLOCK_M;
    t.diag = causal == 2 ? Sk - Sq : 0;
    const int rows_end = min(t.q0 + BLOCK_M, Sq);  // one past the block's last query
    const int n_keys = causal ? max(0, min(Sk, rows_end + t.diag)) : Sk;  // causal: none past the diagonal
    t.n_tiles = (n_keys + BLOCK_N - 1) / BLOCK_N;
    return t;
}
// TAIL_SPLIT. With n_work work tiles of equal length on P persistent blocks, the queue's last
// n_work mod P tiles run alone, one per SM, while the other SMs idle for a whole work tile (at
// B4 H16 S8192 D128: 4 tiles of 4,096 on 132 SMs, one work tile in 32). So the queue hands out
// items instead: work tiles 0 … tail_first − 1 whole, then each of the last R = n_work −
// tail_first tiles in `pieces` ranges of its key tiles, every tile's first piece, then every
// second, ... (stages/stage7.py: tail_pieces says how many). A piece's rows end in fp32
// partial results (finish_piece), which attention_fp8_combine_tail weighs into the output after
// this kernel. Without the split, tail_first = n_work and every item is a work tile.
__device__ __forceinline__ int n_items(int n_work, int tail_first, int pieces) {
    return tail_first + (n_work - tail_first) * pieces;
}
__device__ __forceinline__ Work work_item(int item, int n_qb, int H, int group, int Sq, int Sk, int causal,
                                          int n_work, int tail_first, int pieces) {
    if (!TAIL_SPLIT || item < tail_first) return work_tile(item, n_qb, H, group, Sq, Sk, causal);
    const int tail = n_work - tail_first, i = item - tail_first, split = i / tail;
    Work t = work_tile(tail_first + i % tail, n_qb, H, group, Sq, Sk, causal);
    const int kt0 = split * t.n_tiles / pieces;  // pieces <= n_tiles: none is empty
    t.n_tiles = (split + 1) * t.n_tiles / pieces - kt0;
    t.kt0 = kt0, t.split = split;
    return t;
}

// ---- the consumers' products ----------------------------------------------------------------
// S = Q·Kᵀ: D/32 wgmma of 64 × BLOCK_N × 32 (e4m3); k-step kk reads bytes 32kk … of each row,
// +32 bytes on the descriptors' start address (2 in its 16-byte units), inside the swizzle row.
__device__ __forceinline__ void issue_qk(float (&s)[BLOCK_N / 2], unsigned long long q_desc,
                                         unsigned long long k_desc) {
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 32; ++kk) wgmma_e4m3_ss(s, q_desc + 2 * kk, k_desc + 2 * kk, kk > 0);
    wgmma_commit();
}
// O += P·V: BLOCK_N/32 wgmma of 64 × D × 32; step t reads keys 32t … 32t + 31 of each Vᵀ row:
// sub-tile t / (VT_ATOM/32), 32 bytes further into its rows per step inside it (the start
// address in 16-byte units). A work tile's first P·V (fresh) writes O instead of adding to it: O
// needs no zeroing (nor rescaling) before it.
__device__ __forceinline__ void issue_pv(float (&o)[O_COLS / 2], const unsigned (&p)[BLOCK_N / 32][4],
                                         unsigned long long v_desc, bool fresh) {
    wgmma_fence();
#pragma unroll
    for (int t = 0; t < BLOCK_N / 32; ++t) {
        constexpr int steps = VT_ATOM / 32;  // k-steps per sub-tile
        wgmma_e4m3_rs(o, p[t], v_desc + (((t / steps) * O_COLS * VT_ATOM + (t % steps) * 32) >> 4), t > 0 || !fresh);
    }
    wgmma_commit();
}

// ---- the softmax, on S where wgmma left it ------------------------------------------------------
// Thread t of warp w holds rows r0 = 16w + t/4 and r0 + 8 of its warpgroup's 64, columns
// 8n + 2(t%4) and +1 of each 8-column slice n: s[4n], s[4n+1] in row r0, s[4n+2], s[4n+3] in
// row r0 + 8. The four threads of a row combine with two shuffles. m holds each row's max of
// the raw scores, l this thread's share of its row sum; `scale_log2` > 0 (with the descales).
// The exponentials are taken against max − P_OFFSET_LOG2: P and l carry a factor 2^8.
template <bool MASK>
__device__ __forceinline__ void softmax_tile(float (&s)[BLOCK_N / 2], float (&m)[2], float (&l)[2],
                                             float (&alpha)[2], int key0, const int (&qpos)[2], int Sk,
                                             bool causal, float scale_log2) {
    const int lane = threadIdx.x % 32;
    if (MASK) {
        // Key key0 + 8n + 2(lane % 4) + (e & 1) is visible to a row of query position qpos when
        // it is < Sk and (causal) <= qpos: one compare per score against a per-row limit on the
        // compile-time part 8n + (e & 1).
        const int first = key0 + 2 * (lane % 4);
        const int limit[2] = {(causal ? min(Sk - 1, qpos[0]) : Sk - 1) - first,
                              (causal ? min(Sk - 1, qpos[1]) : Sk - 1) - first};
#pragma unroll
        for (int n = 0; n < BLOCK_N / 8; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                if (8 * n + (e & 1) > limit[e >> 1]) s[4 * n + e] = NEG_INF;
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
        // A row with nothing visible yet keeps base 0 (its exponentials are 0). With
        // LAZY_RESCALE 0 a row whose max did not grow keeps alpha = 1 exactly, and a warp whose
        // rows all kept theirs skips the rescale (see rescale).
        const float top = mx[r] == NEG_INF ? 0.0f : mx[r] * scale_log2;
        base[r] = top - float(P_OFFSET_LOG2);
        alpha[r] = LAZY_RESCALE == 0 && mx[r] == m[r] ? 1.0f : fast_exp2(m[r] * scale_log2 - top);  // 0 on the first tile (m = −∞)
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
            if (!ROW_SUM_MMA) sum[e >> 1] += s[4 * n + e];
        }
#pragma unroll
    for (int r = 0; r < 2 && !ROW_SUM_MMA; ++r) l[r] = l[r] * alpha[r] + sum[r];
}
// O (and, with ROW_SUM_MMA, l, which then follows O's scale) times alpha, before P·V adds to it.
__device__ __forceinline__ void rescale(float (&o)[O_COLS / 2], float (&l)[2], const float (&alpha)[2]) {
#if LAZY_RESCALE >= 0
    // A warp's 16 rows kept their maxima: nothing to scale (one vote, warp-uniform branch).
    if (!__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) return;
#endif
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
        o[4 * n] *= alpha[0]; o[4 * n + 1] *= alpha[0];
        o[4 * n + 2] *= alpha[1]; o[4 * n + 3] *= alpha[1];
    }
    if (ROW_SUM_MMA) l[0] *= alpha[0], l[1] *= alpha[1];
}
// ROW_SUM_MMA, once a P·V has finished: its column D (the quad's first lane; the other lanes
// hold zero columns there, and add nothing) into l, and the column back to zero, so that the
// tensor cores only ever sum one key tile's P. Zeroed by subtracting itself: an accumulator
// register given a constant between two wgmma made ptxas serialize them (C7511).
__device__ __forceinline__ void take_row_sums(float (&o)[O_COLS / 2], float (&l)[2]) {
    if (!ROW_SUM_MMA) return;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const float tile_sum = o[(O_COLS - 8) / 2 + 2 * r];
        l[r] += tile_sum;
        o[(O_COLS - 8) / 2 + 2 * r] -= tile_sum;
    }
}
// P in e4m3: register r of k-step t takes accumulators j0, j0 + 1, j0 + 4, j0 + 5 with
// j0 = 16t + 8(r/2) + 2(r%2) (lib.fp8.a8_sources), first in the lowest byte: the keys of Vᵀ's
// k-step come in lib.fp8.key_order(), which makes these the same thread's own scores.
__device__ __forceinline__ void to_operand(const float (&s)[BLOCK_N / 2], unsigned (&p)[BLOCK_N / 32][4]) {
#pragma unroll
    for (int t = 0; t < BLOCK_N / 32; ++t)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const int j0 = 16 * t + 8 * (r / 2) + 2 * (r % 2);
            p[t][r] = to_e4m3x2(s[j0], s[j0 + 1]) | (to_e4m3x2(s[j0 + 4], s[j0 + 5]) << 16);
        }
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
// are in, not after the last consumer's epilogue. Every consumer takes as many turns per work
// tile as the others.
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
// The Q buffer is released by every consumer thread (each has also read sm.work, which the
// producer overwrites once Q is released: its own arrival orders that read before it).
__device__ __forceinline__ void release_q(Smem& sm, int qs) { mbar_arrive(&sm.q_empty[qs]); }

extern "C" __global__ void __launch_bounds__(THREADS, 1)
attention_fp8(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
              const __grid_constant__ CUtensorMap vt_map, elem_t* __restrict__ out,
              const float* __restrict__ q_descale, const float* __restrict__ k_descale,
              const float* __restrict__ v_descale, int Sq, int Sk, int H, int group,
              float scale_log2, int causal, int n_work, int tail_heads, int* work_queue,
              int tail_first, int pieces, float* __restrict__ o_part, float* __restrict__ lse_part) {
    // Work tiles: (batch·head, query block) pairs, n_qb query blocks per head. A launch with
    // one block per work tile runs each once; a persistent launch (one block per SM) walks
    // work w = blockIdx.x, + gridDim.x, ...: the producer then fetches the next tile's Q and
    // K/V while the consumers still finish this one.
    const int n_qb = (Sq + BLOCK_M - 1) / BLOCK_M;
    const int Hk = H / group;
    // What the queue hands out: n_work work tiles, the tail's in pieces (TAIL_SPLIT, work_item).
    const int items = TAIL_SPLIT ? n_items(n_work, tail_first, pieces) : n_work;
    auto item_work = [&](int item) { return work_item(item, n_qb, H, group, Sq, Sk, causal, n_work, tail_first, pieces); };
    extern __shared__ unsigned char smem_raw[];
    // The swizzled layouts repeat every 1024 bytes (128-byte swizzle; 512 for 64-byte): align to that.
    Smem& sm = *reinterpret_cast<Smem*>((reinterpret_cast<size_t>(smem_raw) + 1023) & ~size_t(1023));
    // The warpgroup index, read from lane 0: the compiler then knows it is warp-uniform, and the
    // descriptors and ring positions computed from it live in uniform registers (see stage 6).
    const int wg = __shfl_sync(0xffffffffu, threadIdx.x / 128, 0);
    if (threadIdx.x == 0) {
        for (int qs = 0; qs < Q_STAGES; ++qs) {
            mbar_init(&sm.q_full[qs], 1);
            mbar_init(&sm.q_empty[qs], 128 * CONSUMERS);  // every consumer thread: see release_q
        }
        for (int st = 0; st < STAGES; ++st) {
            mbar_init(&sm.k_full[st], 1);
            mbar_init(&sm.v_full[st], V_IN_KERNEL ? 128 : 1);  // V_IN_KERNEL: every producer thread's share of Vᵀ
            mbar_init(&sm.k_empty[st], 4 * CONSUMERS);
            mbar_init(&sm.v_empty[st], 4 * CONSUMERS);
        }
#if V_IN_KERNEL
        mbar_init(&sm.vs_full[0], 1);
        mbar_init(&sm.vs_full[1], 1);
#endif
        mbar_init_fence();
        tma_prefetch_map(&q_map); tma_prefetch_map(&k_map); tma_prefetch_map(&vt_map);
    }
    griddep_wait();  // the kernel before this one (quantize's casts), when launched with PDL
#if ROW_SUM_MMA
    {  // rows D … D + 7 of every Vᵀ sub-tile: ones, then zeros (whole rows alike: any swizzle leaves them so)
        constexpr int words = 8 * VT_ATOM / 4, subtiles = STAGES * (BLOCK_N / VT_ATOM);
        for (int i = threadIdx.x; i < subtiles * words; i += THREADS) {
            unsigned* rows = reinterpret_cast<unsigned*>(&sm.vt[0][0][0][0] + (i / words) * O_COLS * VT_ATOM + D * VT_ATOM);
            rows[i % words] = i % words < VT_ATOM / 4 ? 0x38383838u : 0u;
        }
        fence_proxy_async();  // generic-proxy writes, read by wgmma
    }
#endif
    __syncthreads();

#if WARP_SPECIALIZED
    if (wg == 0) {  // ---- producer ----
        if (SETMAXNREG) regs_release<PRODUCER_REGS>();
#if V_IN_KERNEL
        // Every producer thread walks the work tiles (a fixed stride); thread 0 issues the copies,
        // and all 128 transpose each V tile from a staging buffer (two, taken in turn by ring
        // position) into the Vᵀ ring. Thread 0 asks for ring position pos + 1's V tile while the
        // tile of pos is transposed: its staging buffer was last read for pos − 1, which every
        // producer thread finished before the barrier that ended that turn.
        const int pt = threadIdx.x;
        auto stage_v = [&](int p, int key_tile, int hk, int b) {  // a V tile → staging buffer p % 2
            mbar_arrive_expect_bytes(&sm.vs_full[p % 2], KV_BYTES);
            tma_load_4d(&sm.vs[p % 2][0][0], &vt_map, &sm.vs_full[p % 2], 0, key_tile * BLOCK_N, hk, b);
        };
        int pos = 0, count = 0;
        bool staged = false;  // ring position pos's V tile is already on its way into staging
        if (pt == 0 && blockIdx.x < n_work) {
            const Work t = work_tile(blockIdx.x, n_qb, H, group, Sq, Sk, causal);
            load_q(sm, &q_map, 0, t.q0, t.h, t.b, blockIdx.x);
        }
        for (int w = blockIdx.x; w < n_work; w += gridDim.x, ++count) {
            const int next = w + (int)gridDim.x;
            const Work t = work_tile(w, n_qb, H, group, Sq, Sk, causal);
            const Work nt = work_tile(next < n_work ? next : w, n_qb, H, group, Sq, Sk, causal);  // the next work tile
            bool next_q = next >= n_work;
            if (pt == 0 && !staged && t.n_tiles > 0) stage_v(pos, 0, t.hk, t.b);
            for (int j = 0; j < t.n_tiles; ++j, ++pos) {
                const int st = pos % STAGES;
                const bool more = j + 1 < t.n_tiles;
                staged = more || (next < n_work && nt.n_tiles > 0);  // ring position pos + 1 has a V tile
                if (pt == 0) {
                    load_tile(&sm.k[st][0][0], sm.k_full, sm.k_empty, &k_map, pos, j, t.hk, t.b, false);
                    if (staged) stage_v(pos + 1, more ? j + 1 : 0, more ? t.hk : nt.hk, more ? t.b : nt.b);
                    if (Q_STAGES == 2 && !next_q) load_q(sm, &q_map, count + 1, nt.q0, nt.h, nt.b, next), next_q = true;
                }
                mbar_wait(&sm.vs_full[pos % 2], (pos / 2) & 1);          // the V tile has landed
                mbar_wait(&sm.v_empty[st], ((pos / STAGES) & 1) ^ 1);    // and the consumers are done with Vᵀ buffer st
                transpose_v(&sm.vs[pos % 2][0][0], &sm.vt[st][0][0][0], pt);
                fence_proxy_async();                // ordinary stores to shared memory, read next by wgmma
                mbar_arrive(&sm.v_full[st]);
                named_bar_sync(PRODUCER_BAR, 128);  // staging buffer pos % 2 is free again
            }
            if (pt == 0 && !next_q) load_q(sm, &q_map, count + 1, nt.q0, nt.h, nt.b, next);
        }
#else
        if (threadIdx.x == 0) {
            int pos = 0;  // ring position
            int count = 0;
            auto work_q = [&](int w, int count) {  // the Q of work tile w, the block's count-th
                const Work t = item_work(w);
                load_q(sm, &q_map, count, t.q0, t.h, t.b, w);
            };
            // The work queue's slot-th tile, as in stage 6 (stages/work_queue.cuh). The consumers
            // read the index from the Q slot.
            const int w0 = handed_out(blockIdx.x, items, n_qb, tail_heads, DYNAMIC_WORK);
            if (w0 < items) work_q(w0, 0);
            for (int w = w0, next; w < items; w = next, ++count) {
                // The next work tile: asked for now, its answer needed only at its Q's copy.
                next = DYNAMIC_WORK ? handed_out(atomicAdd(&work_queue[0], 1) + (int)gridDim.x, items, n_qb, tail_heads, DYNAMIC_WORK) : w + (int)gridDim.x;
                const Work t = item_work(w);
                // The next work tile's Q: with two buffers right after this tile's first K and V
                // (its buffer was freed by the tile before), a whole work tile before it is
                // needed; with one, after this tile's copies (its S = Q·Kᵀ must finish first).
                bool next_q = next >= items;
                for (int j = 0; j < t.n_tiles; ++j, ++pos) {
                    const int st = pos % STAGES;
                    load_tile(&sm.k[st][0][0], sm.k_full, sm.k_empty, &k_map, pos, t.kt0 + j, t.hk, t.b, false);
                    load_tile(&sm.vt[st][0][0][0], sm.v_full, sm.v_empty, &vt_map, pos, t.kt0 + j, t.hk, t.b, true);
                    if (Q_STAGES == 2 && !next_q) work_q(next, count + 1), next_q = true;
                }
                if (!next_q) work_q(next, count + 1);
            }
            if (DYNAMIC_WORK) {
                // No work left: say so through the Q slot (a plain arrival, no bytes), then count
                // this block out. The last block out resets the queue for the next launch: by then
                // every block has taken its last index, so nothing reads the counter any more.
                // A launch that stops part way cannot leave a count for a later one to read: a
                // fault on the device (a trap, an illegal address) ends the process's CUDA
                // context, and every later call in it fails instead of running (as in stage 6).
                const int qs = count % Q_STAGES;
                mbar_wait(&sm.q_empty[qs], ((count / Q_STAGES) & 1) ^ 1);
                sm.work[qs] = items;
                mbar_arrive(&sm.q_full[qs]);
                __threadfence();  // this block's last take from the counter before its count-out
                if (atomicAdd(&work_queue[1], 1) == (int)gridDim.x - 1) {
                    atomicExch(&work_queue[0], 0);
                    atomicExch(&work_queue[1], 0);
                }
            }
        }
#endif
        return;
    }
    if (SETMAXNREG) regs_claim<CONSUMER_REGS>();
#endif
    // ---- consumer c: query rows q0 + 64c … q0 + 64c + 63 of each work tile ----
    const int c = wg - WARP_SPECIALIZED, lane = threadIdx.x % 32, warp = (threadIdx.x / 32) % 4;
    auto k_desc = [&](int st) { return kmajor_desc<D>(&sm.k[st][0][0]); };
    auto v_desc = [&](int st) { return kmajor_desc<VT_ATOM>(&sm.vt[st][0][0][0]); };

    // This thread's two rows of work tile t, r = 0, 1: query position qpos[r] (valid: it exists).
    auto rows_of = [&](const Work& t, int (&qpos)[2], bool (&valid)[2]) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            qpos[r] = t.q0 + 64 * c + 16 * warp + lane / 4 + 8 * r;
            valid[r] = qpos[r] < Sq;
        }
    };
    float o[O_COLS / 2];
    unsigned p[BLOCK_N / 32][4];
    auto zero_o = [&]() {
#pragma unroll
        for (int i = 0; i < O_COLS / 2; ++i) o[i] = 0.0f;
    };

    // ---- the end of a work tile: O · v_descale / l out (l and O share P's 2^8, which cancels),
    // rows that do not exist clipped; 4-byte stores of two elements.
    auto finish = [&](const Work& t, float (&l)[2]) {
        int qpos[2];
        bool valid[2];
        rows_of(t, qpos, valid);
        const float vd = v_descale[t.b * Hk + t.hk];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
            l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
            const float f = l[r] > 0.0f ? vd / l[r] : 0.0f;  // no key seen: zeros, as SDPA gives
            if (!valid[r]) continue;
            elem_t* const dst = out + (((size_t)t.b * H + t.h) * Sq + qpos[r]) * D + 2 * (lane % 4);
#pragma unroll
            for (int n = 0; n < D / 8; ++n)
                *reinterpret_cast<unsigned*>(dst + 8 * n) = pack2(o[4 * n + 2 * r] * f, o[4 * n + 2 * r + 1] * f);
        }
    };

#if TAIL_SPLIT
    // ---- the end of a piece of work tile t (TAIL_SPLIT): its rows' O · v_descale / l in fp32
    // and their log2-sum-exps, each row's share of what the whole tile would have summed, for
    // attention_fp8_combine_tail. (The combine first ran here, in the last piece to finish: that
    // build's main loop ran 1-2.6% slower even where nothing was split, results/logs/
    // 2026-11-26-5580a3e-h100.)
    auto finish_piece = [&](const Work& t, float (&l)[2], const float (&m)[2], float scale_tile) {
        const size_t piece = (size_t)(t.w - tail_first) * pieces + t.split;
        const float vd = v_descale[t.b * Hk + t.hk];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int row = 64 * c + 16 * warp + lane / 4 + 8 * r;  // of the work tile's BLOCK_M
            l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
            l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
            const float f = l[r] > 0.0f ? vd / l[r] : 0.0f;
            float* const dst = o_part + (piece * BLOCK_M + row) * D + 2 * (lane % 4);
#pragma unroll
            for (int n = 0; n < D / 8; ++n)
                *reinterpret_cast<float2*>(dst + 8 * n) = make_float2(o[4 * n + 2 * r] * f, o[4 * n + 2 * r + 1] * f);
            // P and l carry 2^P_OFFSET_LOG2 against the base m·scale: log2 Σ 2^(s·scale) is
            // m·scale + log2 l − P_OFFSET_LOG2.
            if (lane % 4 == 0)
                lse_part[piece * BLOCK_M + row] =
                    l[r] > 0.0f ? m[r] * scale_tile + __log2f(l[r]) - float(P_OFFSET_LOG2) : NEG_INF;
        }
    };
#endif

    int pos = 0;  // ring position, as the producer counts it
    int w = blockIdx.x, count = 0;  // the block's count-th work tile, w
    if (PINGPONG && c == CONSUMERS - 1) named_bar_arrive(TURN_BAR, 256);  // consumer 0 goes first
    for (;; w += gridDim.x, ++count) {
        const int qs = count % Q_STAGES;  // this work tile's Q buffer
        if (DYNAMIC_WORK) {  // which work tile the producer took: published with its Q
            mbar_wait(&sm.q_full[qs], (count / Q_STAGES) & 1);
            w = __shfl_sync(0xffffffffu, *reinterpret_cast<volatile int*>(&sm.work[qs]), 0);
        }
        if (w >= items) break;
        const Work t = item_work(w);
        const int n_tiles = t.n_tiles;
        int qpos[2];
        bool valid[2];
        rows_of(t, qpos, valid);
#if !WARP_SPECIALIZED
        if (threadIdx.x == 0) {  // no producer: consumer 0's first thread starts the ring
            load_q(sm, &q_map, count, t.q0, t.h, t.b, w);
            for (int j = 0; j < min(STAGES, n_tiles); ++j) {
                const int st = (pos + j) % STAGES;
                load_tile(&sm.k[st][0][0], sm.k_full, sm.k_empty, &k_map, pos + j, j, t.hk, t.b, false);
                load_tile(&sm.vt[st][0][0][0], sm.v_full, sm.v_empty, &vt_map, pos + j, j, t.hk, t.b, true);
            }
        }
#endif
        mbar_wait(&sm.q_full[qs], (count / Q_STAGES) & 1);
        const unsigned long long q_desc = kmajor_desc<D>(&sm.q[qs][64 * c][0]);
        // The softmax takes each row's max of the raw scores, so it needs a positive factor from
        // raw score to log2 units: the call's scale·log2 e times this (batch, K/V head)'s
        // q_descale·k_descale. For a negative one, s·f = (−s)·|f|: this consumer's Q rows get
        // their sign bits flipped (bit 7 of each e4m3 byte).
        float scale_tile = scale_log2 * q_descale[t.b * Hk + t.hk] * k_descale[t.b * Hk + t.hk];
        if (scale_tile < 0.0f) {
            uint4* rows = reinterpret_cast<uint4*>(&sm.q[qs][64 * c][0]);  // 64 rows of D bytes
            for (int i = threadIdx.x % 128; i < 64 * D / 16; i += 128)
                rows[i] = make_uint4(rows[i].x ^ 0x80808080u, rows[i].y ^ 0x80808080u,
                                     rows[i].z ^ 0x80808080u, rows[i].w ^ 0x80808080u);
            fence_proxy_async();          // generic-proxy writes, read next by wgmma
            named_bar_sync(1 + c, 128);   // the whole warpgroup's rows are flipped
            scale_tile = -scale_tile;
        }
        // Scale 0 gives every visible key the same weight; a tiny positive scale does exactly that
        // in fp32 and keeps masked keys at −∞·scale = −∞ rather than 0·(−∞) = NaN.
        if (scale_tile == 0.0f) scale_tile = 1e-30f;
        // A tile needs masking if it reaches past the keys, or (causal) past this warpgroup's
        // first query position's diagonal.
        const int first_row = t.q0 + 64 * c;
        const int rows_end = first_row + 64;
        const int qdiag[2] = {qpos[0] + t.diag, qpos[1] + t.diag};  // the last key each row may see
        // Causal: the block's tiles reach its last consumer's diagonal, but this consumer's rows
        // end before rows_end, and the last tiles may lie wholly past them. It skips their
        // products and only hands their buffers (and, with ping-pong, `turns` turns each) on:
        // pass_on. (Without a producer, consumer 0 refills the ring inside its loop: it keeps
        // every tile.) Bottom-right with Sq > Sk, a consumer's rows may see no key: my_tiles = 0.
        // SKIP_ROWS_PAST_END (stage 6's): a consumer whose rows all lie past Sq (the last query
        // block at S 2048 with 192 rows a block) computes nothing, my_tiles = 0.
        const bool past_end = SKIP_ROWS_PAST_END && WARP_SPECIALIZED && first_row >= Sq;
        const int my_tiles = past_end ? 0 : causal && WARP_SPECIALIZED
            ? min(n_tiles, max(0, (max(0, min(Sk, rows_end + t.diag)) + BLOCK_N - 1) / BLOCK_N - t.kt0)) : n_tiles;
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
            const int kt = t.kt0 + j;  // the key tile, counted from the first key (a piece starts at kt0)
            if ((kt + 1) * BLOCK_N > Sk || (causal && (kt + 1) * BLOCK_N - 1 > first_row + t.diag))
                softmax_tile<true>(s, m, l, alpha, kt * BLOCK_N, qdiag, Sk, causal, scale_tile);
            else
                softmax_tile<false>(s, m, l, alpha, kt * BLOCK_N, qdiag, Sk, causal, scale_tile);
        };

        float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.0f, 0.0f}, alpha[2];
        float s[BLOCK_N / 2];

        if (my_tiles == 0) {
            // No key for these rows (a query block past the sequence's end, bottom-right rows
            // before the first key): Q is released and the tiles the other consumers use are
            // passed on, with as many turns as they take — TILE_TURNS per tile, with the
            // products' turns one more for INTRA_OVERLAP's last P·V (and at least one) — and the
            // rows get zeros below.
            release_q(sm, qs);
            for (int j = 0; j < n_tiles; ++j) pass_on(pos + j, TILE_TURNS);
            if (PINGPONG == 1 && (INTRA_OVERLAP || n_tiles == 0)) {
                take_turn(c);
                give_turn(c);
            }
        } else {
#if INTRA_OVERLAP
            // Tile 0's S alone; then each turn issues S of tile j with P·V of tile j − 1, and the
            // softmax of tile j runs while P·V j − 1 is still in the tensor cores.
            mbar_wait(&sm.k_full[pos % STAGES], (pos / STAGES) & 1);
            turn_begin(c);
            issue_qk(s, q_desc, k_desc(pos % STAGES));
            turn_end(c);
            wgmma_wait<0>();
            fence_registers(s);
            release(&sm.k_empty[pos % STAGES]);
            softmax_begin(c);
            softmax(s, m, l, alpha, 0);
            to_operand(s, p);
            softmax_end(c);
            for (int j = 1; j < my_tiles; ++j) {
                const int cur = pos + j, prev = cur - 1;
                mbar_wait(&sm.k_full[cur % STAGES], (cur / STAGES) & 1);
                mbar_wait(&sm.v_full[prev % STAGES], (prev / STAGES) & 1);
                turn_begin(c);
                issue_qk(s, q_desc, k_desc(cur % STAGES));
                if (j > 1) rescale(o, l, alpha);  // tile j − 1's factor, while Q·Kᵀ j runs, before P·V j − 1 adds to O
                issue_pv(o, p, v_desc(prev % STAGES), j == 1);
                turn_end(c);
                wgmma_wait<1>();  // S of tile j is ready; P·V of tile j − 1 may still run
                fence_registers(s);
                release(&sm.k_empty[cur % STAGES]);
                softmax_begin(c);
                softmax(s, m, l, alpha, j);
                softmax_end(c);
                wgmma_wait<0>();
                fence_registers(o);
                fence_registers(p);  // read by that P·V: rewritten only now
                take_row_sums(o, l);
                release(&sm.v_empty[prev % STAGES]);
                to_operand(s, p);
            }
            release_q(sm, qs);  // every Q·Kᵀ of this work tile is done: the producer may refill Q
            const int last = pos + my_tiles - 1;
            mbar_wait(&sm.v_full[last % STAGES], (last / STAGES) & 1);
            turn_begin(c);
            if (my_tiles > 1) rescale(o, l, alpha);
            issue_pv(o, p, v_desc(last % STAGES), my_tiles == 1);
            turn_end(c);
            wgmma_wait<0>();
            fence_registers(o);
            fence_registers(p);
            take_row_sums(o, l);
            release(&sm.v_empty[last % STAGES]);
            for (int j = my_tiles; j < n_tiles; ++j) pass_on(pos + j, TILE_TURNS);  // the tiles above: their turns
#else
            // One tile at a time: S, its softmax, then P·V, each product waited for at once.
            for (int j = 0; j < my_tiles; ++j) {
                const int cur = pos + j, st = cur % STAGES;
                mbar_wait(&sm.k_full[st], (cur / STAGES) & 1);
                turn_begin(c);
                issue_qk(s, q_desc, k_desc(st));
                turn_end(c);
                wgmma_wait<0>();
                fence_registers(s);
                release(&sm.k_empty[st]);
                if (j == my_tiles - 1) release_q(sm, qs);
                softmax_begin(c);
                softmax(s, m, l, alpha, j);
                if (j > 0) rescale(o, l, alpha);
                to_operand(s, p);
                softmax_end(c);
                mbar_wait(&sm.v_full[st], (cur / STAGES) & 1);
                turn_begin(c);
                issue_pv(o, p, v_desc(st), j == 0);
                turn_end(c);
                wgmma_wait<0>();
                fence_registers(o);
                fence_registers(p);
                take_row_sums(o, l);
                release(&sm.v_empty[st]);
#if !WARP_SPECIALIZED
                if (threadIdx.x == 0 && j + STAGES < n_tiles) {  // refill these buffers once all are done
                    const int nst = (cur + STAGES) % STAGES;
                    load_tile(&sm.k[nst][0][0], sm.k_full, sm.k_empty, &k_map, cur + STAGES, j + STAGES, t.hk, t.b, false);
                    load_tile(&sm.vt[nst][0][0][0], sm.v_full, sm.v_empty, &vt_map, cur + STAGES, j + STAGES, t.hk, t.b, true);
                }
#endif
            }
            for (int j = my_tiles; j < n_tiles; ++j) pass_on(pos + j, TILE_TURNS);  // the tiles above: their turns
#endif
        }
        pos += n_tiles;
        if (my_tiles == 0) zero_o();  // no P·V wrote O: zeros, as SDPA gives
#if TAIL_SPLIT
        if (t.split >= 0) {
            finish_piece(t, l, m, scale_tile);
            continue;
        }
#endif
        finish(t, l);
    }
    // The last consumer's final turn went to consumer 0, who takes it here: every turn barrier
    // sees as many arrivals as waits, and nothing is left pending when the block ends.
    if (PINGPONG && c == 0) take_turn(0);
}

#if TAIL_SPLIT
// TAIL_SPLIT's combine, launched after attention_fp8 (with PDL: it waits on the GPU for that grid
// and its writes): row i of the tail's work tile r (work tile tail_first + r) is Σ w_s·O_s / Σ w_s
// over its pieces s, w_s = 2^(lse_s − max lse), as stage 6's split-KV combine weighs its splits.
// Each thread takes four adjacent columns of one row; the pieces in one order: the same bits on
// every run.
extern "C" __global__ void __launch_bounds__(256)
attention_fp8_combine_tail(const float* __restrict__ o_part, const float* __restrict__ lse_part,
                           elem_t* __restrict__ out, int Sq, int Sk, int H, int group, int n_work,
                           int tail_first, int pieces) {
    griddep_wait();
    const int tail = n_work - tail_first;
    const int part = blockIdx.x * blockDim.x + threadIdx.x;
    if (part >= tail * BLOCK_M * (D / 4)) return;
    const int row = part / (D / 4), col = 4 * (part % (D / 4));
    const int r = row / BLOCK_M, i = row % BLOCK_M;
    const Work t = work_tile(tail_first + r, (Sq + BLOCK_M - 1) / BLOCK_M, H, group, Sq, Sk, 0);
    if (t.q0 + i >= Sq) return;
    const size_t first = (size_t)r * pieces;
    float top = NEG_INF;
    for (int s = 0; s < pieces; ++s) top = fmaxf(top, __ldcg(lse_part + (first + s) * BLOCK_M + i));
    float wsum = 0.0f, acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 4
    for (int s = 0; s < pieces; ++s) {
        const float lse = __ldcg(lse_part + (first + s) * BLOCK_M + i);
        const float4 x = __ldcg(reinterpret_cast<const float4*>(o_part + ((first + s) * BLOCK_M + i) * D + col));
        const float w = top == NEG_INF ? 0.0f : fast_exp2(lse - top);
        wsum += w;
        acc[0] = fmaf(w, x.x, acc[0]), acc[1] = fmaf(w, x.y, acc[1]);
        acc[2] = fmaf(w, x.z, acc[2]), acc[3] = fmaf(w, x.w, acc[3]);
    }
    const float f = wsum > 0.0f ? 1.0f / wsum : 0.0f;
    elem_t* const dst = out + (((size_t)t.b * H + t.h) * Sq + t.q0 + i) * D + col;
    *reinterpret_cast<unsigned*>(dst) = pack2(acc[0] * f, acc[1] * f);
    *reinterpret_cast<unsigned*>(dst + 2) = pack2(acc[2] * f, acc[3] * f);
}
#endif

// Stage 5 — vectorized, asynchronous, P in registers: the FlashAttention-2 formulation.
//
// One kernel. A block owns BLOCK_Q query rows of one (batch, head) — warp w the WARP_Q rows
// [WARP_Q·w, WARP_Q·(w + 1)), in M_TILES = WARP_Q / 16 slices of 16 — and streams the keys and
// values through shared memory, BLOCK_K rows at a time. For each K/V tile, all in registers
// except the tiles themselves:
//   S = Q·Kᵀ with mma.sync (m16n8k16), Q and K read by ldmatrix; each K fragment serves the
//     warp's M_TILES slices, so a warp of 32 rows reads K (and V) half as often per product;
//   the online softmax on S where it lies: each thread holds two rows' worth of scores, and
//     the four threads of a row combine their max with two warp shuffles;
//   P, converted to 16 bits in registers, is already laid out as the A operand of the next
//     product (an m16n8k16 accumulator pair is an A fragment): O += P·V, V read by
//     ldmatrix.trans. P never touches shared memory.
// At the end O / l goes out through shared memory in 16-byte stores.
//
// What changes from stage 4, four things:
//   1. 128-bit global accesses: every copy moves 16 bytes (8 elements) per thread, where
//      stage 4 moved 2.
//   2. cp.async: the copies go from global to shared memory without passing through registers,
//      and without waiting. The K/V tiles form a ring of STAGES buffers: while the warps
//      compute on tile j, the copy of tile j + STAGES − 1 is in flight. One barrier per tile.
//   3. A swizzled shared-memory layout instead of padding: the 16-byte chunk c of row r is
//      stored at chunk c ^ (r % 8) of that row. The 8 rows that one ldmatrix phase reads (and
//      the 8 chunks that 8 threads of a cp.async phase write) then fall in 8 different groups
//      of 4 banks: no conflicts, and no wasted bytes. (NO_SWIZZLE, for the comparison, stores
//      rows plainly: 8 rows of one chunk then share 4 banks, an 8-way conflict.)
//   4. mma.sync with explicit fragments instead of WMMA: the PTX documents which thread holds
//      which element, so the softmax can work on S in the accumulator registers, and P can
//      feed the second product directly. S and P no longer go through shared memory, and the
//      rescale needs no row map: thread t holds rows t/4 and t/4 + 8 of its warp's 16.
//
// Idea by idea: each idea is a compile-time switch, so that its gain can be measured alone
// (stages/stage5.py: IDEAS). The defaults below are the stage's build; the other values undo
// one idea each, back towards stage 4:
//   COPY_BYTES      16: 16-byte cp.async copies;  2: one element per copy, through registers
//   STAGES          K/V ring depth, set with the tiles (2);  1: copy, wait, then compute
//   NO_SWIZZLE      1: plain rows (8-way bank conflicts);   PAD_ROWS 1: rows padded by 16 bytes
//   P_IN_REGISTERS  1: P feeds P·V from registers;  0: P goes through shared memory, as in stage 4
//   FAST_EXP2       1: ex2.approx.ftz;  0: exp2f, with its range fix-ups
#include "attention.cuh"

#if !defined(BLOCK_Q) || !defined(BLOCK_K) || !defined(STAGES) || !defined(WARP_Q)
#error "BLOCK_Q, BLOCK_K, STAGES and WARP_Q are set by stages/stage5.py"
#endif
#ifndef COPY_BYTES
#define COPY_BYTES 16
#endif
#ifndef NO_SWIZZLE
#define NO_SWIZZLE 0
#endif
#ifndef PAD_ROWS
#define PAD_ROWS 0
#endif
#ifndef P_IN_REGISTERS
#define P_IN_REGISTERS 1
#endif
#ifndef FAST_EXP2
#define FAST_EXP2 1
#endif
#ifndef VARLEN
#define VARLEN 0  // packed sequences (attention_varlen): sequence offsets cu_q, cu_k
#endif
#if (COPY_BYTES != 16 && COPY_BYTES != 2) || STAGES < 1 || (NO_SWIZZLE && PAD_ROWS)
#error "COPY_BYTES is 16 or 2, STAGES at least 1, and padded rows are not swizzled (PAD_ROWS or NO_SWIZZLE)"
#endif
constexpr int M_TILES = WARP_Q / 16;     // 16-row slices per warp
constexpr int WARPS = BLOCK_Q / WARP_Q;  // warp w computes query rows [WARP_Q·w, WARP_Q·(w + 1))
constexpr int THREADS = 32 * WARPS;
constexpr int D = HEAD_DIM;
constexpr int CHUNKS = D / 8;            // 16-byte chunks per row of a tile
constexpr int KT = D / 16;               // k-steps of S = Q·Kᵀ (16 of D each)
constexpr int NT_S = BLOCK_K / 8;        // n-tiles of S (8 keys each)
constexpr int NT_O = D / 8;              // n-tiles of O (8 of D each)
// Row stride of the Q, K and V tiles (elements): padding shifts each row by 16 bytes (stage 4).
constexpr int LD = PAD_ROWS ? D + 8 : D;
// Without P_IN_REGISTERS each warp stores its P (WARP_Q × BLOCK_K) in shared memory, rows
// padded by 16 bytes: the 4-byte stores of the accumulator layout and the ldmatrix reads are
// then both conflict-free.
constexpr int LD_P = BLOCK_K + 8;
// Shared memory: Q, then STAGES K tiles and STAGES V tiles (then P, without P_IN_REGISTERS);
// O reuses Q's place at the end.
constexpr int SMEM_ELEMS = (BLOCK_Q + 2 * STAGES * BLOCK_K) * LD + (P_IN_REGISTERS ? 0 : BLOCK_Q * LD_P);

// ---- the PTX instructions this stage adds: stages/mma.cuh (stage 8 uses them too) ----------
#include "mma.cuh"

// The 2^x of the softmax: FAST_EXP2 0 measures what fast_exp2 saves over exp2f.
#if FAST_EXP2
#define EXP2 fast_exp2
#else
#define EXP2 exp2f
#endif

// ---- the layout ------------------------------------------------------------------------------
// Where element (row, col) of a tile with D columns sits: its 16-byte chunk is XOR-ed with
// row % 8 (col must be a multiple of 8 for the address of a whole chunk). Plain and padded
// rows, for the comparison, keep the chunk where it is.
__device__ __forceinline__ int at(int row, int col) {
#if NO_SWIZZLE || PAD_ROWS
    return row * LD + col;
#else
    return row * D + (((col / 8) ^ (row % 8)) * 8) + col % 8;
#endif
}

// Copy rows [row0, row0 + ROWS) of an [n_rows, D] matrix with row stride ld into a tile, 16 bytes per
// thread and step, asynchronously; rows past n_rows are filled with zeros. A step of the block
// covers STEP_ROWS whole rows; thread t always takes chunk t % CHUNKS of row t / CHUNKS of the
// step, so its addresses are computed once and each step adds a constant (STEP_ROWS is a
// multiple of 8, which leaves the swizzle pattern unchanged).
template <int ROWS>
__device__ __forceinline__ void copy_tile_async(elem_t* tile, const elem_t* src, int row0, int n_rows, int ld) {
    constexpr int STEP_ROWS = THREADS / CHUNKS;
    static_assert(THREADS % CHUNKS == 0 && STEP_ROWS % 8 == 0 && ROWS % STEP_ROWS == 0, "tile and block sizes");
    const int r = threadIdx.x / CHUNKS, c = (threadIdx.x % CHUNKS) * 8;
    elem_t* const to = tile + at(r, c);
    const elem_t* const from = src + (size_t)(row0 + r) * ld + c;
    const size_t step = (size_t)STEP_ROWS * ld;
    const int rows_left = n_rows - row0 - r;
#pragma unroll
    for (int i = 0; i < ROWS / STEP_ROWS; ++i) {
        const bool inside = i * STEP_ROWS < rows_left;
        cp_async_16(to + i * STEP_ROWS * LD, inside ? from + i * step : src, inside ? 16 : 0);
    }
}

// COPY_BYTES 2: the same copy as stage 4's, one 2-byte element per thread and step, through
// registers: up to 16 loads in flight, then their stores. The thread waits for its loads, so
// its copies overlap none of its own arithmetic (cp.async copies at least 4 bytes).
template <int ROWS>
__device__ __forceinline__ void copy_tile_elements(elem_t* tile, const elem_t* src, int row0, int n_rows, int ld) {
    constexpr int STEP_ROWS = THREADS / D;  // whole rows per step of the block
    constexpr int STEPS = ROWS / STEP_ROWS, BATCH = STEPS < 16 ? STEPS : 16;
    static_assert(THREADS % D == 0 && ROWS % STEP_ROWS == 0 && STEPS % BATCH == 0, "tile and block sizes");
    const int r = threadIdx.x / D, c = threadIdx.x % D;
    const elem_t* from = src + (size_t)(row0 + r) * ld + c;
    const int rows_left = n_rows - row0 - r;
#pragma unroll 1
    for (int b = 0; b < STEPS; b += BATCH) {
        elem_t x[BATCH];
#pragma unroll
        for (int j = 0; j < BATCH; ++j) {
            x[j] = (b + j) * STEP_ROWS < rows_left ? *from : to_elem(0.0f);
            from += (size_t)STEP_ROWS * ld;
            asm volatile("" : "+l"(from));  // one add per row: no 64-bit offsets held in registers
        }
#pragma unroll
        for (int j = 0; j < BATCH; ++j) tile[at(r + (b + j) * STEP_ROWS, c)] = x[j];
    }
}

template <int ROWS>
__device__ __forceinline__ void copy_tile(elem_t* tile, const elem_t* src, int row0, int n_rows, int ld) {
#if COPY_BYTES == 16
    copy_tile_async<ROWS>(tile, src, row0, n_rows, ld);
#else
    copy_tile_elements<ROWS>(tile, src, row0, n_rows, ld);
#endif
}

// Flip the sign of the Q chunks this thread copied (copy_tile_async's mapping), in place.
__device__ __forceinline__ void negate_own_chunks(elem_t* tile) {
    constexpr int STEP_ROWS = THREADS / CHUNKS;
    elem_t* const mine = tile + at(threadIdx.x / CHUNKS, (threadIdx.x % CHUNKS) * 8);
#pragma unroll
    for (int i = 0; i < BLOCK_Q / STEP_ROWS; ++i) {
        uint4* const chunk = reinterpret_cast<uint4*>(mine + i * STEP_ROWS * LD);
        const uint4 x = *chunk;
        *chunk = make_uint4(x.x ^ 0x80008000u, x.y ^ 0x80008000u, x.z ^ 0x80008000u, x.w ^ 0x80008000u);
    }
}

extern "C" __global__ void __launch_bounds__(THREADS, 1)
attention_fused(const elem_t* q, const elem_t* k, const elem_t* v, elem_t* out, int Sq, int Sk,
                float scale_log2, int causal, int H, int group,
                long long q_batch, long long q_head, int q_row, long long k_batch, long long k_head,
                int k_row, long long v_batch, long long v_head, int v_row, const int* cu_q, const int* cu_k,
                float* lse_out) {
    q_row = row_stride(q_row), k_row = row_stride(k_row), v_row = row_stride(v_row);  // attention.cuh
    extern __shared__ __align__(128) unsigned char smem_raw[];
    elem_t* const q_tile = reinterpret_cast<elem_t*>(smem_raw);
    elem_t* const k_tiles = q_tile + BLOCK_Q * LD;             // STAGES tiles of BLOCK_K × D
    elem_t* const v_tiles = k_tiles + STAGES * BLOCK_K * LD;

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int g = lane / 4, i4 = lane % 4;  // this thread's rows g, g + 8 and columns 2·i4, 2·i4 + 1
    // blockIdx.x: query tile q0 / BLOCK_Q of (batch b, head h), see attention.cuh
    const int n_q_tiles = (Sq + BLOCK_Q - 1) / BLOCK_Q;
    const int bh = blockIdx.x / n_q_tiles, b = bh / H, h = bh % H;
    // Causal blocks near the end of the sequence have the most tiles: start those first.
    const int q0 = (n_q_tiles - 1 - blockIdx.x % n_q_tiles) * BLOCK_Q;
    q += b * q_batch + h * q_head;  // q, k, v read in place, with their strides
    k += b * k_batch + h / group * k_head;  // grouped-query: H / group K/V heads
    v += b * v_batch + h / group * v_head;
    // Packed sequences (VARLEN: stages/stage5.py, attention_varlen): q, k, v are one
    // [1, H, total, D] view each, sequence b is rows cu_q[b] … cu_q[b + 1] − 1 of q and of the
    // output ([total, H, D], rows H·D apart) and rows cu_k[b] … of k and v, and Sq, Sk arrive
    // as the longest lengths (the grid's). Blocks past a shorter sequence's end have no rows.
    // A build of its own (VARLEN, set by the launcher), so that the [B, H, S, D] build keeps Sq
    // and Sk as kernel parameters rather than registers (at D128 this kernel is at 255).
#if VARLEN
    const int q_start = cu_q[b], k_start = cu_k[b];
    Sq = cu_q[b + 1] - q_start, Sk = cu_k[b + 1] - k_start;
    if (q0 >= Sq) return;
    q += (size_t)q_start * q_row, k += (size_t)k_start * k_row, v += (size_t)k_start * v_row;
    out += ((size_t)q_start * H + h) * D;
    const int out_row = H * D;
#else
    out += (size_t)bh * Sq * D;
    constexpr int out_row = D;
#endif

    // Causal: query i sees keys j <= i + diag (attention.cuh); skip tiles past the diagonal.
    const int diag = causal_diagonal(causal, Sq, Sk);
    const int n_keys = causal ? max(0, min(Sk, q0 + BLOCK_Q + diag)) : Sk;
    const int n_tiles = (n_keys + BLOCK_K - 1) / BLOCK_K;

    // The pipeline's start: Q, then the first STAGES − 1 K/V tiles, one commit group each.
    copy_tile<BLOCK_Q>(q_tile, q, q0, Sq, q_row);
    cp_async_commit();
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < n_tiles) {
            copy_tile<BLOCK_K>(k_tiles + s * BLOCK_K * LD, k, s * BLOCK_K, Sk, k_row);
            copy_tile<BLOCK_K>(v_tiles + s * BLOCK_K * LD, v, s * BLOCK_K, Sk, v_row);
        }
        cp_async_commit();
    }
    // The ldmatrix addresses of the loop, hoisted. at() moves by a constant when the row moves
    // by a multiple of 8 and the column by a multiple of 64, so each lane needs only the
    // offsets of its row within the first 16 and of its chunk pair within the first 8 chunks:
    // four offsets for K and four for Q and V, not one per (k-step, n-tile) pair.
    //   Q (A operand, 16 rows × 16 of D) and V (ldmatrix.trans): lane t gives row t % 16 at
    //   column 8·(t / 16) of the pair of 8-column chunks;
    //   K (B operand, 16 of D × 8 keys, two n-tiles at once): lane t gives key 8·(t / 16) + t % 8
    //   at column 8·((t / 8) % 2).
    int k_off[4], qv_off[4];
#pragma unroll
    for (int t = 0; t < 4; ++t) {
        k_off[t] = at((lane / 16) * 8 + lane % 8, (2 * t + (lane / 8) % 2) * 8);
        qv_off[t] = at(lane % 16, (2 * t + lane / 16) * 8);
    }
    const elem_t* const q_warp = q_tile + warp * WARP_Q * LD;  // this warp's rows of Q
    // The softmax below takes each row's max of the raw scores and applies the scale in one
    // FFMA per score, which needs scale > 0. For a negative scale, s·scale = (−s)·|scale|:
    // negate Q once (the sign bit of each 16-bit element) and use |scale|.
    if (scale_log2 < 0.0f) {
#if COPY_BYTES == 16
        cp_async_wait<STAGES - 1>();  // this thread's own Q chunks have landed
        negate_own_chunks(q_tile);    // the loop's first barrier publishes them
#else
        __syncthreads();              // element copies: chunks come from several threads
        for (int i = tid; i < BLOCK_Q * CHUNKS; i += THREADS) {
            uint4* const chunk = reinterpret_cast<uint4*>(q_tile + at(i / CHUNKS, (i % CHUNKS) * 8));
            const uint4 x = *chunk;
            *chunk = make_uint4(x.x ^ 0x80008000u, x.y ^ 0x80008000u, x.z ^ 0x80008000u, x.w ^ 0x80008000u);
        }
#endif
        scale_log2 = -scale_log2;
    }
    // Scale 0: every visible key weighs the same, but 0 × a masked −∞ would be NaN. The smallest
    // normal float instead keeps −∞ for masked keys and makes every other product 0 to float
    // precision.
    if (scale_log2 == 0.0f) scale_log2 = 1.17549435e-38f;

    float o[M_TILES][NT_O][4];  // O: WARP_Q rows × D per warp, as m16n8 accumulators
#pragma unroll
    for (int m = 0; m < M_TILES; ++m)
#pragma unroll
        for (int n = 0; n < NT_O; ++n) o[m][n][0] = o[m][n][1] = o[m][n][2] = o[m][n][3] = 0.0f;
    // Per slice m, rows g (h = 0) and g + 8 (h = 1): the running max of the raw scores, and this
    // thread's share of the running sum l (its 2 columns of each n-tile).
    float row_max[M_TILES][2], row_sum[M_TILES][2];
#pragma unroll
    for (int m = 0; m < M_TILES; ++m) row_max[m][0] = row_max[m][1] = NEG_INF, row_sum[m][0] = row_sum[m][1] = 0.0f;
    const int row0 = q0 + warp * WARP_Q + g + diag;  // this thread's first query row (+ diag); the others + 8, + 16, …
#if !P_IN_REGISTERS
    elem_t* const p_warp = v_tiles + STAGES * BLOCK_K * LD + warp * WARP_Q * LD_P;  // this warp's P
#endif

    for (int j = 0; j < n_tiles; ++j) {
#if STAGES == 1
        // No ring: once every warp is done with tile j − 1, tile j is copied into the one
        // buffer, and everybody waits for it. Copy and compute take turns.
        __syncthreads();
        copy_tile<BLOCK_K>(k_tiles, k, j * BLOCK_K, Sk, k_row);
        copy_tile<BLOCK_K>(v_tiles, v, j * BLOCK_K, Sk, v_row);
        cp_async_commit();
        cp_async_wait<0>();
        __syncthreads();
#else
        // Tile j has landed for this thread; the barrier makes it so for all, and makes sure
        // that every warp is done with tile j − 1, whose buffer the next copy overwrites.
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        const int next = j + STAGES - 1;
        if (next < n_tiles) {
            copy_tile<BLOCK_K>(k_tiles + (next % STAGES) * BLOCK_K * LD, k, next * BLOCK_K, Sk, k_row);
            copy_tile<BLOCK_K>(v_tiles + (next % STAGES) * BLOCK_K * LD, v, next * BLOCK_K, Sk, v_row);
        }
        cp_async_commit();  // possibly empty: keeps one group per tile, so the wait above counts right
#endif
        const int k0 = j * BLOCK_K;
        // Causal: a tile whose first key is past this warp's last row is all masked for it
        // (the warp still takes part in the copies and barriers).
        if (causal && k0 > q0 + warp * WARP_Q + WARP_Q - 1 + diag) continue;
        const elem_t* k_tile = k_tiles + (j % STAGES) * BLOCK_K * LD;
        const elem_t* v_tile = v_tiles + (j % STAGES) * BLOCK_K * LD;

        // S = Q·Kᵀ, slice by slice of 16 rows: s[m][n] is the m16n8 tile of rows 16m … and keys
        // 8n … . Every K fragment read goes to all M_TILES slices.
        float s[M_TILES][NT_S][4];
#pragma unroll
        for (int m = 0; m < M_TILES; ++m)
#pragma unroll
            for (int n = 0; n < NT_S; ++n) s[m][n][0] = s[m][n][1] = s[m][n][2] = s[m][n][3] = 0.0f;
#pragma unroll
        for (int kt = 0; kt < KT; ++kt) {
            unsigned a[M_TILES][4];
#pragma unroll
            for (int m = 0; m < M_TILES; ++m) ldmatrix_x4(a[m], q_warp + m * 16 * LD + (kt / 4) * 64 + qv_off[kt % 4]);
#pragma unroll
            for (int n = 0; n < NT_S; n += 2) {
                unsigned b[4];
                ldmatrix_x4(b, k_tile + n * 8 * LD + (kt / 4) * 64 + k_off[kt % 4]);  // = at(key, col)
#pragma unroll
                for (int m = 0; m < M_TILES; ++m) {
                    mma_16816(s[m][n], a[m], b[0], b[1]);
                    mma_16816(s[m][n + 1], a[m], b[2], b[3]);
                }
            }
        }

        // −∞ where a key is masked. Only the tiles that need it are checked: the last one (keys
        // past Sk) and, when causal, those that reach past this warp's first row.
        if (k0 + BLOCK_K > Sk || (causal && k0 + BLOCK_K - 1 > q0 + warp * WARP_Q + diag)) {
#pragma unroll
            for (int m = 0; m < M_TILES; ++m)
#pragma unroll
                for (int n = 0; n < NT_S; ++n)
#pragma unroll
                    for (int e = 0; e < 4; ++e)
                        if (!key_visible(k0 + n * 8 + 2 * i4 + e % 2, row0 + 16 * m + 8 * (e / 2), Sk, causal))
                            s[m][n][e] = NEG_INF;
        }

        // The online softmax, rows g (e = 0, 1) and g + 8 (e = 2, 3) of each slice. A row's
        // 8·NT_S scores are spread over the 4 threads 4g … 4g + 3: shuffles with lane masks 1
        // and 2 combine them.
#pragma unroll
        for (int m = 0; m < M_TILES; ++m) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                float mx = row_max[m][h];
#pragma unroll
                for (int n = 0; n < NT_S; ++n) mx = fmaxf(mx, fmaxf(s[m][n][2 * h], s[m][n][2 * h + 1]));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 2));
                // In log2 units, scale folded in: p = 2^(s·scale_log2 − max·scale_log2), one FFMA
                // and one MUFU.EX2 (fast_exp2) per score. A row with no visible key yet keeps max −∞: subtract
                // 0 instead (no NaN).
                const float base = mx == NEG_INF ? 0.0f : mx * scale_log2;
                const float rescale = EXP2(row_max[m][h] * scale_log2 - base);  // O and l were summed against the old max
                row_max[m][h] = mx;
                float sum = 0.0f;
#pragma unroll
                for (int n = 0; n < NT_S; ++n) {
                    s[m][n][2 * h] = EXP2(fmaf(s[m][n][2 * h], scale_log2, -base));
                    s[m][n][2 * h + 1] = EXP2(fmaf(s[m][n][2 * h + 1], scale_log2, -base));
                    sum += s[m][n][2 * h] + s[m][n][2 * h + 1];
                }
                row_sum[m][h] = row_sum[m][h] * rescale + sum;  // reduced over the 4 threads at the end
#pragma unroll
                for (int n = 0; n < NT_O; ++n) {
                    o[m][n][2 * h] *= rescale;
                    o[m][n][2 * h + 1] *= rescale;
                }
            }
        }

        // O += P·V. The accumulators of S's n-tiles 2kt and 2kt + 1, packed to 16 bits, are
        // exactly the A fragment of P's k-step kt (16 rows × 16 keys). V's B operand (16 keys ×
        // 8 of D) needs V transposed: ldmatrix.trans, lane t giving key 16·kt + t % 16 at
        // column n·8 + 8·(t / 16). Every V fragment read goes to all M_TILES slices.
#if !P_IN_REGISTERS
        // The round trip that P_IN_REGISTERS saves: the warp stores its P, 16-bit, where the
        // accumulator layout has it (row, key), and reads it back below as Q is read.
#pragma unroll
        for (int m = 0; m < M_TILES; ++m)
#pragma unroll
            for (int n = 0; n < NT_S; ++n) {
                elem_t* const at_p = p_warp + (16 * m + g) * LD_P + 8 * n + 2 * i4;
                *reinterpret_cast<unsigned*>(at_p) = pack2(s[m][n][0], s[m][n][1]);
                *reinterpret_cast<unsigned*>(at_p + 8 * LD_P) = pack2(s[m][n][2], s[m][n][3]);
            }
        __syncwarp();
#endif
#pragma unroll
        for (int kt = 0; kt < BLOCK_K / 16; ++kt) {
            unsigned p[M_TILES][4];
#pragma unroll
            for (int m = 0; m < M_TILES; ++m) {
#if P_IN_REGISTERS
                p[m][0] = pack2(s[m][2 * kt][0], s[m][2 * kt][1]);
                p[m][1] = pack2(s[m][2 * kt][2], s[m][2 * kt][3]);
                p[m][2] = pack2(s[m][2 * kt + 1][0], s[m][2 * kt + 1][1]);
                p[m][3] = pack2(s[m][2 * kt + 1][2], s[m][2 * kt + 1][3]);
#else
                ldmatrix_x4(p[m], p_warp + (16 * m + lane % 16) * LD_P + 16 * kt + 8 * (lane / 16));
#endif
            }
#pragma unroll
            for (int n = 0; n < NT_O; n += 2) {
                unsigned b[4];
                ldmatrix_x4_trans(b, v_tile + kt * 16 * LD + (n / 8) * 64 + qv_off[(n / 2) % 4]);
#pragma unroll
                for (int m = 0; m < M_TILES; ++m) {
                    mma_16816(o[m][n], p[m], b[0], b[1]);
                    mma_16816(o[m][n + 1], p[m], b[2], b[3]);
                }
            }
        }
    }

    // l: the sum of the 4 threads' shares of each row; then O / l, through shared memory (Q's
    // place: this warp's own rows, which only this warp read) for 16-byte stores.
    // A block barrier, not a warp's: this warp's rows of Q were copied by every warp's threads,
    // and a block whose rows see no key (n_tiles = 0, bottom-right with Sq > Sk) passed no
    // barrier since. With only __syncwarp a copy issued by another warp could land on these rows
    // after this warp had written its zeros there (seen once on the H100 under load: a row of Q
    // values in place of zeros, results/logs/2026-11-25-3103364-call5).
    cp_async_wait<0>();  // no copy of this thread's may still be writing (the last groups are empty)
    __syncthreads();     // ... nor any other thread's; every lane is done reading Q
    elem_t* const o_tile = q_tile;
#pragma unroll
    for (int m = 0; m < M_TILES; ++m) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float l = row_sum[m][h];
            l += __shfl_xor_sync(0xffffffff, l, 1);
            l += __shfl_xor_sync(0xffffffff, l, 2);
            const float inv_l = inv_sum(l);
            const int r = warp * WARP_Q + 16 * m + g + 8 * h;
#if !VARLEN
            // What the backward needs (stage 8): the row's log-sum-exp of the scaled scores, in
            // natural units, −∞ for a row that sees no key. row_max is of the raw scores and
            // scale_log2 > 0 here (a negative scale negated Q above): ln Σ e^(s·scale) =
            // (max·scale_log2 + log2 l)·ln 2. [B, H, Sq] fp32; null when not asked for.
            if (lse_out != nullptr && i4 == 0 && q0 + r < Sq)
                lse_out[(size_t)bh * Sq + q0 + r] =
                    l > 0.0f ? (row_max[m][h] * scale_log2 + __log2f(l)) * 0.6931471805599453f : NEG_INF;
#endif
#pragma unroll
            for (int n = 0; n < NT_O; ++n)
                *reinterpret_cast<unsigned*>(o_tile + at(r, n * 8) + 2 * i4) =
                    pack2(o[m][n][2 * h] * inv_l, o[m][n][2 * h + 1] * inv_l);
        }
    }
    __syncwarp();
#pragma unroll
    for (int i = lane; i < WARP_Q * CHUNKS; i += 32) {
        const int r = warp * WARP_Q + i / CHUNKS, c = (i % CHUNKS) * 8;
        if (q0 + r < Sq)
            *reinterpret_cast<uint4*>(out + (size_t)(q0 + r) * out_row + c) = *reinterpret_cast<const uint4*>(o_tile + at(r, c));
    }
}

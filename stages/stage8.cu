// Stage 8 — the backward pass: FlashAttention-2's algorithm with mma.sync.
//
// Given the forward's inputs q, k, v, its output's gradient dO and the row log-sum-exp it saved
// (lse), the gradients are, with S = scale·Q·Kᵀ and P = softmax(S) = exp(S − lse):
//     dV = Pᵀ·dO      dP = dO·Vᵀ      dS = P ∘ (dP − δ),  δ = rowsum(dO ∘ O)
//     dK = scale·dSᵀ·Q      dQ = scale·dS·K
// No S or P of a whole row is ever stored: each is recomputed tile by tile from Q, K and lse,
// as the forward computed it. δ (one number per query row) comes first, from dO and O
// (stages/stage8_preprocess.cu, launched by stages/stage8.py: the preprocess).
//
// One block owns BLOCK_N keys of one (batch, K/V head) — warp w the 16 keys [16w, 16w + 16) —
// and keeps their dK and dV in registers while it walks over every query block of every query
// head of the group (GQA: a K/V head's gradients add up over the heads that read it). Its K
// and V tiles are copied into shared memory once. For each BLOCK_M-row block of queries, with
// Q, dO, lse and δ copied by cp.async into a ring of two buffers (the next block's copy in
// flight while this one is computed), warp w computes, all in registers:
//   Sᵀ = K_w·Qᵀ (16 keys × BLOCK_M queries: the transposed scores, so that each warp's rows are
//     its own keys, whose dK and dV it holds), Pᵀ = 2^(Sᵀ·scale·log2 e − lse·log2 e);
//   dV_w += Pᵀ·dO, with Pᵀ's accumulators repacked to 16 bits as the A operand (as the forward
//     of stage 5 feeds P·V);
//   dPᵀ = V_w·dOᵀ, dSᵀ = Pᵀ ∘ (dPᵀ − δ)·scale;
//   dK_w += dSᵀ·Q.
// dQ needs all the keys of a query row. The stage's build (DQ_ATOMICS 0) computes it in a second
// kernel, attention_backward_dq, which walks over the keys for each block of queries as the
// forward does: it recomputes S, P, dP and dS there and keeps its rows of dQ in registers — two
// more products per tile than the atomics below, and no traffic but the tiles it reads.
// DQ_ATOMICS 1 (the alternative this stage measures, stages/stage8.py) keeps dQ in this
// kernel: the warps store dSᵀ to shared memory, and after a barrier each computes some 16 × 16
// tiles of dS·K and adds them to a float32 dQ in global memory with atomic adds (every key
// block adds its share to the same rows: (keys / BLOCK_N) additions per element of dQ, 34 GB
// at B4 H16 S8192 D128); the launcher converts the sum to q's dtype at the end. At the end
// dK and dV are written.
//
// Causal (attention.cuh: key j visible to query i when j <= i + diag): a key block's first
// query block is the one holding its first visible query; blocks before it are skipped, and
// only blocks that straddle the diagonal test keys one by one. Query rows past Sq are zeros in
// Q and dO, with lse = +∞ (the launcher pads lse and δ to whole blocks), so their P is 0. Keys
// past Sk are zero rows of K and V: their gradients are not written, and their dS meets K's
// zeros in dS·K.
#include "attention.cuh"
#include "mma.cuh"

#if !defined(BLOCK_N) || !defined(BLOCK_M)
#error "BLOCK_N and BLOCK_M are set by stages/stage8.py"
#endif
#ifndef DQ_ATOMICS
#define DQ_ATOMICS 0  // the stage's build: dQ by its own pass (stages/stage8.py, SWITCHES)
#endif
constexpr int D = HEAD_DIM;
constexpr int WARPS = BLOCK_N / 16;    // warp w owns keys [16w, 16w + 16) of the block
constexpr int THREADS = 32 * WARPS;
constexpr int CHUNKS = D / 8;          // 16-byte chunks per row of a D-wide tile
constexpr int KT = D / 16;             // k-steps over D
constexpr int NT_M = BLOCK_M / 8;      // n-tiles of Sᵀ and dPᵀ (8 queries each)
constexpr int NT_D = D / 8;            // n-tiles of dK and dV (8 of D each)
static_assert((BLOCK_M == 32 || BLOCK_M % 64 == 0) && BLOCK_N % 16 == 0 && D % 64 == 0, "tile sizes");

// Shared memory, in 16-bit elements: K and V (BLOCK_N × D each), two Q and two dO buffers
// (BLOCK_M × D each), dSᵀ (BLOCK_N × BLOCK_M, with DQ_ATOMICS); then two lse and two δ buffers
// (BLOCK_M floats).
constexpr int SMEM_ELEMS = 2 * BLOCK_N * D + 4 * BLOCK_M * D + (DQ_ATOMICS ? BLOCK_N * BLOCK_M : 0);
constexpr int SMEM_BYTES_NEEDED = SMEM_ELEMS * 2 + 4 * BLOCK_M * 4;

// Swizzled rows, as in stage 5: chunk c of row r of a W-wide tile sits at chunk c ^ (r % 8), so
// the 8 rows one ldmatrix phase reads fall in 8 different groups of 4 banks. A 32-wide row (the
// dSᵀ tile at BLOCK_M = 32) is half of a 128-byte line: chunk c ^ ((r / 2) % 4) puts the 8 rows'
// chunks in 8 different places of the 4 lines they share.
template <int W>
__device__ __forceinline__ int at(int row, int col) {
    static_assert(W == 32 || W % 64 == 0, "tile width");
    const int flip = W == 32 ? (row / 2) % 4 : row % 8;
    return row * W + (((col / 8) ^ flip) * 8) + col % 8;
}

// Rows [row0, row0 + ROWS) of a [n_rows, D] matrix with row stride ld into a D-wide tile, 16
// bytes per thread and step, asynchronously; rows past n_rows become zeros.
template <int ROWS, int NT = THREADS>  // NT: the block's threads
__device__ __forceinline__ void copy_rows(elem_t* tile, const elem_t* src, int row0, int n_rows, int ld) {
    constexpr int STEP_ROWS = NT / CHUNKS;
    static_assert(NT % CHUNKS == 0 && ROWS % STEP_ROWS == 0, "tile and block sizes");
    const int r = threadIdx.x / CHUNKS, c = (threadIdx.x % CHUNKS) * 8;
#pragma unroll
    for (int i = 0; i < ROWS / STEP_ROWS; ++i) {
        const int row = r + i * STEP_ROWS;
        const bool inside = row0 + row < n_rows;
        cp_async_16(tile + at<D>(row, c), inside ? src + (size_t)(row0 + row) * ld + c : src, inside ? 16 : 0);
    }
}

// BLOCK_M floats (lse or δ of one query block; the launcher pads them to whole blocks).
__device__ __forceinline__ void copy_floats(float* dst, const float* src) {
    for (int i = threadIdx.x; i < BLOCK_M / 4; i += THREADS) cp_async_16(dst + 4 * i, src + 4 * i, 16);
}

extern "C" __global__ void __launch_bounds__(THREADS)
attention_backward(const elem_t* q, const elem_t* k, const elem_t* v, const elem_t* dout,
                   const float* lse2, const float* delta, float* dq_accum, elem_t* dk, elem_t* dv,
                   int Sq, int Sk, int Sq_pad, float scale_log2, float scale, int causal, int H, int group,
                   long long q_batch, long long q_head, int q_row, long long k_batch, long long k_head, int k_row,
                   long long v_batch, long long v_head, int v_row, long long o_batch, long long o_head, int o_row) {
    extern __shared__ __align__(128) unsigned char smem_raw[];
    elem_t* const k_tile = reinterpret_cast<elem_t*>(smem_raw);
    elem_t* const v_tile = k_tile + BLOCK_N * D;
    elem_t* const q_tiles = v_tile + BLOCK_N * D;      // two buffers
    elem_t* const do_tiles = q_tiles + 2 * BLOCK_M * D;  // two buffers
    elem_t* const ds_tile = do_tiles + 2 * BLOCK_M * D;  // dSᵀ: BLOCK_N keys × BLOCK_M queries
    float* const lse_tiles = reinterpret_cast<float*>(ds_tile + (DQ_ATOMICS ? BLOCK_N * BLOCK_M : 0));
    float* const delta_tiles = lse_tiles + 2 * BLOCK_M;

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int g = lane / 4, i4 = lane % 4;  // accumulator rows g, g + 8 and columns 2·i4, 2·i4 + 1
    const int n_key_blocks = (Sk + BLOCK_N - 1) / BLOCK_N;
    const int bhk = blockIdx.x / n_key_blocks, b = bhk / (H / group), hk = bhk % (H / group);
    const int n0 = (blockIdx.x % n_key_blocks) * BLOCK_N;  // the block's first key
    k += b * k_batch + hk * k_head;
    v += b * v_batch + hk * v_head;

    // Which query blocks see these keys: with causal masking, queries i >= n0 − diag.
    const int diag = causal_diagonal(causal, Sq, Sk);
    const int n_q_blocks = (Sq + BLOCK_M - 1) / BLOCK_M;
    const int first = causal ? min(n_q_blocks, max(0, n0 - diag) / BLOCK_M) : 0;
    const int per_head = n_q_blocks - first;
    const int n_iter = per_head * group;  // every query head of the group, block by block

    // Where iteration it reads: query head hk·group + it / per_head, block first + it % per_head.
    auto head_of = [&](int it) { return hk * group + it / per_head; };
    auto m0_of = [&](int it) { return (first + it % per_head) * BLOCK_M; };
    auto issue = [&](int it) {
        const int h = head_of(it), m0 = m0_of(it), buf = it % 2;
        copy_rows<BLOCK_M>(q_tiles + buf * BLOCK_M * D, q + b * q_batch + h * q_head, m0, Sq, q_row);
        copy_rows<BLOCK_M>(do_tiles + buf * BLOCK_M * D, dout + b * o_batch + h * o_head, m0, Sq, o_row);
        const size_t row = ((size_t)b * H + h) * Sq_pad + m0;
        copy_floats(lse_tiles + buf * BLOCK_M, lse2 + row);
        copy_floats(delta_tiles + buf * BLOCK_M, delta + row);
    };

    copy_rows<BLOCK_N>(k_tile, k, n0, Sk, k_row);
    copy_rows<BLOCK_N>(v_tile, v, n0, Sk, v_row);
    if (n_iter > 0) issue(0);
    cp_async_commit();

    float dk_acc[NT_D][4], dv_acc[NT_D][4];  // this warp's 16 keys × D, as m16n8 accumulators
#pragma unroll
    for (int n = 0; n < NT_D; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) dk_acc[n][e] = dv_acc[n][e] = 0.0f;

    const int key_row0 = 16 * warp;  // this warp's keys within the block
    for (int it = 0; it < n_iter; ++it) {
        // Block it has landed for this thread; the barrier makes it so for all, and makes sure
        // that every warp is done with block it − 1 (its buffers and the dSᵀ tile).
        cp_async_wait<0>();
        __syncthreads();
        if (it + 1 < n_iter) issue(it + 1);
        cp_async_commit();
        const int buf = it % 2, h = head_of(it), m0 = m0_of(it);
        const elem_t* const q_tile = q_tiles + buf * BLOCK_M * D;
        const elem_t* const do_tile = do_tiles + buf * BLOCK_M * D;
        const float* const lse_t = lse_tiles + buf * BLOCK_M;
        const float* const delta_t = delta_tiles + buf * BLOCK_M;

        // Sᵀ = K_w·Qᵀ and dPᵀ = V_w·dOᵀ, 16 keys × BLOCK_M queries each: A from this warp's rows
        // of K (V), B from Q (dO) rows read as columns (ldmatrix, as stage 5 reads K).
        float s[NT_M][4], dp[NT_M][4];
#pragma unroll
        for (int n = 0; n < NT_M; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[n][e] = dp[n][e] = 0.0f;
#pragma unroll
        for (int kt = 0; kt < KT; ++kt) {
            unsigned ak[4], av[4];
            ldmatrix_x4(ak, k_tile + at<D>(key_row0 + lane % 16, 16 * kt + 8 * (lane / 16)));
            ldmatrix_x4(av, v_tile + at<D>(key_row0 + lane % 16, 16 * kt + 8 * (lane / 16)));
#pragma unroll
            for (int n = 0; n < NT_M; n += 2) {
                const int row = 8 * n + 8 * (lane / 16) + lane % 8, col = 16 * kt + 8 * ((lane / 8) % 2);
                unsigned bq[4], bo[4];
                ldmatrix_x4(bq, q_tile + at<D>(row, col));
                ldmatrix_x4(bo, do_tile + at<D>(row, col));
                mma_16816(s[n], ak, bq[0], bq[1]);
                mma_16816(s[n + 1], ak, bq[2], bq[3]);
                mma_16816(dp[n], av, bo[0], bo[1]);
                mma_16816(dp[n + 1], av, bo[2], bo[3]);
            }
        }

        // Pᵀ and dSᵀ in place: element e of n-tile n is key key_row0 + g + 8·(e / 2) and query
        // 8n + 2·i4 + e % 2 of the block. Causal: only a block that straddles the diagonal
        // (some key past some query) tests each key.
        const bool straddles = causal && m0 + diag < n0 + BLOCK_N - 1;
#pragma unroll
        for (int n = 0; n < NT_M; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int col = 8 * n + 2 * i4 + e % 2;
                float p = fast_exp2(fmaf(s[n][e], scale_log2, -lse_t[col]));
                if (straddles && n0 + key_row0 + g + 8 * (e / 2) > m0 + col + diag) p = 0.0f;
                s[n][e] = p;
                dp[n][e] = p * (dp[n][e] - delta_t[col]) * scale;
            }

        // dV_w += Pᵀ·dO and dK_w += dSᵀ·Q: the accumulators of n-tiles 2kt and 2kt + 1 are the
        // A fragment of k-step kt (16 keys × 16 queries); B from dO (Q) rows, transposed.
#pragma unroll
        for (int kt = 0; kt < BLOCK_M / 16; ++kt) {
            const unsigned ap[4] = {pack2(s[2 * kt][0], s[2 * kt][1]), pack2(s[2 * kt][2], s[2 * kt][3]),
                                    pack2(s[2 * kt + 1][0], s[2 * kt + 1][1]), pack2(s[2 * kt + 1][2], s[2 * kt + 1][3])};
            const unsigned ads[4] = {pack2(dp[2 * kt][0], dp[2 * kt][1]), pack2(dp[2 * kt][2], dp[2 * kt][3]),
                                     pack2(dp[2 * kt + 1][0], dp[2 * kt + 1][1]), pack2(dp[2 * kt + 1][2], dp[2 * kt + 1][3])};
#if DQ_ATOMICS
            // dSᵀ to shared memory for dQ, in the same 16-bit values the dK product uses.
            *reinterpret_cast<unsigned*>(ds_tile + at<BLOCK_M>(key_row0 + g, 16 * kt + 2 * i4)) = ads[0];
            *reinterpret_cast<unsigned*>(ds_tile + at<BLOCK_M>(key_row0 + g + 8, 16 * kt + 2 * i4)) = ads[1];
            *reinterpret_cast<unsigned*>(ds_tile + at<BLOCK_M>(key_row0 + g, 16 * kt + 8 + 2 * i4)) = ads[2];
            *reinterpret_cast<unsigned*>(ds_tile + at<BLOCK_M>(key_row0 + g + 8, 16 * kt + 8 + 2 * i4)) = ads[3];
#endif
#pragma unroll
            for (int n = 0; n < NT_D; n += 2) {
                const int row = 16 * kt + lane % 16, col = 8 * n + 8 * (lane / 16);
                unsigned bo[4], bq[4];
                ldmatrix_x4_trans(bo, do_tile + at<D>(row, col));
                ldmatrix_x4_trans(bq, q_tile + at<D>(row, col));
                mma_16816(dv_acc[n], ap, bo[0], bo[1]);
                mma_16816(dv_acc[n + 1], ap, bo[2], bo[3]);
                mma_16816(dk_acc[n], ads, bq[0], bq[1]);
                mma_16816(dk_acc[n + 1], ads, bq[2], bq[3]);
            }
        }

#if DQ_ATOMICS
        // dQ += dS·K for this query block, over the block's BLOCK_N keys: 16 × 16 tiles of dQ
        // (query tile mt, D columns 16·np …) shared out among the warps. A = dS (query × key) is
        // dSᵀ in shared memory read transposed; B = K (key × D) read transposed, as V in stage 5.
        __syncthreads();
        float* const dq_rows = dq_accum + ((size_t)b * H + h) * Sq * D;
        for (int u = warp; u < (BLOCK_M / 16) * (D / 16); u += WARPS) {
            const int mt = u / (D / 16), np = u % (D / 16);
            float acc[2][4] = {};
#pragma unroll
            for (int kk = 0; kk < BLOCK_N / 16; ++kk) {
                const int mat = lane / 8, r = lane % 8;
                unsigned a[4], bk[4];
                ldmatrix_x4_trans(a, ds_tile + at<BLOCK_M>(16 * kk + 8 * (mat / 2) + r, 16 * mt + 8 * (mat % 2)));
                ldmatrix_x4_trans(bk, k_tile + at<D>(16 * kk + lane % 16, 16 * np + 8 * (lane / 16)));
                mma_16816(acc[0], a, bk[0], bk[1]);
                mma_16816(acc[1], a, bk[2], bk[3]);
            }
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
                const int row = m0 + 16 * mt + g + 8 * hh;
                if (row < Sq) {
#pragma unroll
                    for (int j = 0; j < 2; ++j) {
                        float* const to = dq_rows + (size_t)row * D + 16 * np + 8 * j + 2 * i4;
                        atomicAdd(to, acc[j][2 * hh]);
                        atomicAdd(to + 1, acc[j][2 * hh + 1]);
                    }
                }
            }
        }
#endif
    }

    cp_async_wait<0>();  // nothing may still be copying when the block ends (n_iter = 0)
    // dK (scale is in dS already) and dV of this warp's 16 keys, rows g and g + 8, straight
    // from the accumulators to the [B, H_kv, Sk, D] outputs.
    const size_t out_rows = (size_t)bhk * Sk;
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        const int key = n0 + key_row0 + g + 8 * hh;
        if (key < Sk) {
#pragma unroll
            for (int n = 0; n < NT_D; ++n) {
                const size_t at_out = (out_rows + key) * D + 8 * n + 2 * i4;
                *reinterpret_cast<unsigned*>(dk + at_out) = pack2(dk_acc[n][2 * hh], dk_acc[n][2 * hh + 1]);
                *reinterpret_cast<unsigned*>(dv + at_out) = pack2(dv_acc[n][2 * hh], dv_acc[n][2 * hh + 1]);
            }
        }
    }
}

// ---- the separate dQ pass (DQ_ATOMICS 0) -------------------------------------------------------
// One block per DQ_ROWS query rows of one (batch, head), warp w the 16 rows [16w, 16w + 16), as
// the forward of stage 5 is laid out; K and V tiles of DQ_KEYS keys stream through a ring of two
// buffers. Per tile, in registers: S = Q·Kᵀ and dP = dO·Vᵀ (16 rows × DQ_KEYS), P = 2^(S·scale
// ·log2 e − lse·log2 e), dS = P ∘ (dP − δ)·scale, and dQ += dS·K with dS's accumulators repacked
// as the A operand. dQ leaves in q's dtype: no float32 buffer, no conversion pass.
constexpr int DQ_WARPS = 4, DQ_THREADS = 32 * DQ_WARPS, DQ_ROWS = 16 * DQ_WARPS, DQ_KEYS = 64;
constexpr int DQ_SMEM_BYTES_NEEDED = (2 * DQ_ROWS * D + 4 * DQ_KEYS * D) * 2;

extern "C" __global__ void __launch_bounds__(DQ_THREADS)
attention_backward_dq(const elem_t* q, const elem_t* k, const elem_t* v, const elem_t* dout,
                      const float* lse2, const float* delta, elem_t* dq,
                      int Sq, int Sk, int Sq_pad, float scale_log2, float scale, int causal, int H, int group,
                      long long q_batch, long long q_head, int q_row, long long k_batch, long long k_head, int k_row,
                      long long v_batch, long long v_head, int v_row, long long o_batch, long long o_head, int o_row) {
    extern __shared__ __align__(128) unsigned char smem_raw[];
    elem_t* const q_tile = reinterpret_cast<elem_t*>(smem_raw);
    elem_t* const do_tile = q_tile + DQ_ROWS * D;
    elem_t* const k_tiles = do_tile + DQ_ROWS * D;     // two buffers
    elem_t* const v_tiles = k_tiles + 2 * DQ_KEYS * D;  // two buffers

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int g = lane / 4, i4 = lane % 4;
    const int n_q_blocks = (Sq + DQ_ROWS - 1) / DQ_ROWS;
    const int bh = blockIdx.x / n_q_blocks, b = bh / H, h = bh % H;
    const int m0 = (n_q_blocks - 1 - blockIdx.x % n_q_blocks) * DQ_ROWS;  // causal: longest first
    k += b * k_batch + h / group * k_head;
    v += b * v_batch + h / group * v_head;
    const int diag = causal_diagonal(causal, Sq, Sk);
    const int n_keys = causal ? max(0, min(Sk, m0 + DQ_ROWS + diag)) : Sk;
    const int n_tiles = (n_keys + DQ_KEYS - 1) / DQ_KEYS;

    copy_rows<DQ_ROWS, DQ_THREADS>(q_tile, q + b * q_batch + h * q_head, m0, Sq, q_row);
    copy_rows<DQ_ROWS, DQ_THREADS>(do_tile, dout + b * o_batch + h * o_head, m0, Sq, o_row);
    if (n_tiles > 0) {
        copy_rows<DQ_KEYS, DQ_THREADS>(k_tiles, k, 0, Sk, k_row);
        copy_rows<DQ_KEYS, DQ_THREADS>(v_tiles, v, 0, Sk, v_row);
    }
    cp_async_commit();
    // This thread's rows g and g + 8 of its warp's 16: their lse (log2 units) and δ.
    const size_t row_at = (size_t)bh * Sq_pad + m0 + 16 * warp + g;
    const float lse_r[2] = {__ldg(lse2 + row_at), __ldg(lse2 + row_at + 8)};
    const float delta_r[2] = {__ldg(delta + row_at), __ldg(delta + row_at + 8)};
    const int query0 = m0 + 16 * warp + g;  // row g's query; row g + 8's is query0 + 8

    float dq_acc[NT_D][4];
#pragma unroll
    for (int n = 0; n < NT_D; ++n) dq_acc[n][0] = dq_acc[n][1] = dq_acc[n][2] = dq_acc[n][3] = 0.0f;

    for (int j = 0; j < n_tiles; ++j) {
        cp_async_wait<0>();
        __syncthreads();  // tile j has landed for all; every warp is done with tile j − 1
        if (j + 1 < n_tiles) {
            copy_rows<DQ_KEYS, DQ_THREADS>(k_tiles + ((j + 1) % 2) * DQ_KEYS * D, k, (j + 1) * DQ_KEYS, Sk, k_row);
            copy_rows<DQ_KEYS, DQ_THREADS>(v_tiles + ((j + 1) % 2) * DQ_KEYS * D, v, (j + 1) * DQ_KEYS, Sk, v_row);
        }
        cp_async_commit();
        const elem_t* const k_tile = k_tiles + (j % 2) * DQ_KEYS * D;
        const elem_t* const v_tile = v_tiles + (j % 2) * DQ_KEYS * D;
        const int k0 = j * DQ_KEYS;

        // S = Q·Kᵀ and dP = dO·Vᵀ: A from this warp's rows of Q (dO), B from K (V) rows.
        float s[DQ_KEYS / 8][4], dp[DQ_KEYS / 8][4];
#pragma unroll
        for (int n = 0; n < DQ_KEYS / 8; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[n][e] = dp[n][e] = 0.0f;
#pragma unroll
        for (int kt = 0; kt < KT; ++kt) {
            unsigned aq[4], ao[4];
            ldmatrix_x4(aq, q_tile + at<D>(16 * warp + lane % 16, 16 * kt + 8 * (lane / 16)));
            ldmatrix_x4(ao, do_tile + at<D>(16 * warp + lane % 16, 16 * kt + 8 * (lane / 16)));
#pragma unroll
            for (int n = 0; n < DQ_KEYS / 8; n += 2) {
                const int row = 8 * n + 8 * (lane / 16) + lane % 8, col = 16 * kt + 8 * ((lane / 8) % 2);
                unsigned bk[4], bv[4];
                ldmatrix_x4(bk, k_tile + at<D>(row, col));
                ldmatrix_x4(bv, v_tile + at<D>(row, col));
                mma_16816(s[n], aq, bk[0], bk[1]);
                mma_16816(s[n + 1], aq, bk[2], bk[3]);
                mma_16816(dp[n], ao, bv[0], bv[1]);
                mma_16816(dp[n + 1], ao, bv[2], bv[3]);
            }
        }
        // dS in place of dP: element e of n-tile n is row g + 8·(e / 2), key k0 + 8n + 2·i4 + e % 2.
        const bool straddles = causal && k0 + DQ_KEYS - 1 > m0 + 16 * warp + diag;
#pragma unroll
        for (int n = 0; n < DQ_KEYS / 8; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                float p = fast_exp2(fmaf(s[n][e], scale_log2, -lse_r[e / 2]));
                if (straddles && k0 + 8 * n + 2 * i4 + e % 2 > query0 + 8 * (e / 2) + diag) p = 0.0f;
                dp[n][e] = p * (dp[n][e] - delta_r[e / 2]) * scale;
            }
        // dQ += dS·K: dS's accumulators of n-tiles 2kt, 2kt + 1 are the A fragment of k-step kt;
        // B = K (key × D) read transposed, as V in stage 5.
#pragma unroll
        for (int kt = 0; kt < DQ_KEYS / 16; ++kt) {
            const unsigned a[4] = {pack2(dp[2 * kt][0], dp[2 * kt][1]), pack2(dp[2 * kt][2], dp[2 * kt][3]),
                                   pack2(dp[2 * kt + 1][0], dp[2 * kt + 1][1]), pack2(dp[2 * kt + 1][2], dp[2 * kt + 1][3])};
#pragma unroll
            for (int n = 0; n < NT_D; n += 2) {
                unsigned bk[4];
                ldmatrix_x4_trans(bk, k_tile + at<D>(16 * kt + lane % 16, 8 * n + 8 * (lane / 16)));
                mma_16816(dq_acc[n], a, bk[0], bk[1]);
                mma_16816(dq_acc[n + 1], a, bk[2], bk[3]);
            }
        }
    }
    cp_async_wait<0>();
    // dQ rows g and g + 8, straight from the accumulators, in q's dtype ([B, H, Sq, D]).
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        const int row = query0 + 8 * hh;
        if (row < Sq) {
            elem_t* const to = dq + ((size_t)bh * Sq + row) * D + 2 * i4;
#pragma unroll
            for (int n = 0; n < NT_D; ++n)
                *reinterpret_cast<unsigned*>(to + 8 * n) = pack2(dq_acc[n][2 * hh], dq_acc[n][2 * hh + 1]);
        }
    }
}

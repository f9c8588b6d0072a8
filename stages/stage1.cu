// Stage 1 — unfused attention on tensor cores.
//
// Three kernels, one per step of the definition, each a complete pass over global memory:
//   attention_scores   S = Q·Kᵀ            fp32, written to a [B·H, Sq_pad, Sk_pad] buffer
//   attention_softmax  P = softmax(scale·S) in q's dtype, causal mask applied, same buffer shape
//   attention_pv       O = P·V
// The matrix products run on tensor cores through WMMA: one warp multiplies 16×16 tiles of
// fp16/bf16 with fp32 accumulation (mma_sync). The price is the S×S matrix: 6 bytes per
// (query, key) pair written and read back, against 2·D bytes per token for q, k, v and out.
//
// Shapes: Sq_pad and Sk_pad are Sq and Sk rounded up to TILE. Padded rows and columns of P
// are zeros, so the tensor cores can work on whole tiles without reading past K or V.
// q, k and v are read in place with their strides; each kernel folds (batch, head) into
// blockIdx.x (see attention.cuh).
#include "attention.cuh"
using namespace nvcuda;

constexpr int TILE = 32;         // each block computes a TILE×TILE tile of its output
constexpr int K_STEP = 16;       // the inner dimension of one WMMA product
constexpr int THREADS = 128;     // 4 warps: warp w computes the 16×16 quarter (w / 2, w % 2)
constexpr int SOFTMAX_THREADS = 256;

typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc_frag;

// S[bh, i, j] = q[b, h, i, :]·k[b, h / group, j, :] for a TILE×TILE tile. grid
// (Sk_pad / TILE · B·H, Sq_pad / TILE).
extern "C" __global__ void __launch_bounds__(THREADS)
attention_scores(const elem_t* q, const elem_t* k, float* s, int Sq, int Sk, int H, int group,
                 long long q_batch, long long q_head, int q_row, long long k_batch,
                 long long k_head, int k_row) {
    __shared__ __align__(32) elem_t q_tile[TILE][K_STEP];
    __shared__ __align__(32) elem_t k_tile[TILE][K_STEP];
    // blockIdx.x: column tile col0 / TILE of (batch b, head h), see attention.cuh
    const int n_col_tiles = (Sk + TILE - 1) / TILE;
    const int ld_s = n_col_tiles * TILE, rows_pad = gridDim.y * TILE;
    const int bh = blockIdx.x / n_col_tiles, b = bh / H, h = bh % H;
    const int col0 = blockIdx.x % n_col_tiles * TILE, row0 = blockIdx.y * TILE;
    q += b * q_batch + h * q_head;  // q, k read in place, with their strides
    k += b * k_batch + h / group * k_head;  // grouped-query: H / group K/V heads
    s += (size_t)bh * rows_pad * ld_s;
    const int warp = threadIdx.x / 32, wr = warp / 2, wc = warp % 2;

    acc_frag acc;
    wmma::fill_fragment(acc, 0.0f);
    for (int d0 = 0; d0 < HEAD_DIM; d0 += K_STEP) {
        load_tile<TILE, K_STEP, THREADS>(&q_tile[0][0], q, row0, Sq, q_row, d0);
        load_tile<TILE, K_STEP, THREADS>(&k_tile[0][0], k, col0, Sk, k_row, d0);
        __syncthreads();
        wmma::fragment<wmma::matrix_a, 16, 16, 16, elem_t, wmma::row_major> a;
        // Kᵀ read column-major is K read row-major: no transpose is ever materialised.
        wmma::fragment<wmma::matrix_b, 16, 16, 16, elem_t, wmma::col_major> b;
        load_fragment(a, &q_tile[wr * 16][0], K_STEP);
        load_fragment(b, &k_tile[wc * 16][0], K_STEP);
        wmma::mma_sync(acc, a, b, acc);
        __syncthreads();  // before the next step overwrites the tiles
    }
    wmma::store_matrix_sync(s + (size_t)(row0 + wr * 16) * ld_s + col0 + wc * 16, acc, ld_s,
                            wmma::mem_row_major);
}

// Reduce one value per thread over the block through shared memory: a tree of halving steps.
template <bool MAX>
__device__ float block_reduce(float x, float* scratch) {
    scratch[threadIdx.x] = x;
    __syncthreads();
    for (int half = SOFTMAX_THREADS / 2; half > 0; half /= 2) {
        if (threadIdx.x < half) {
            const float y = scratch[threadIdx.x + half];
            scratch[threadIdx.x] = MAX ? fmaxf(scratch[threadIdx.x], y) : scratch[threadIdx.x] + y;
        }
        __syncthreads();
    }
    const float result = scratch[0];
    __syncthreads();  // scratch is reused by the next reduction
    return result;
}

// One block per row of S: P[i, j] = exp(scale·S[i, j] − m) / l over the keys row i sees,
// m the row's max (so exp never overflows), l the sum; zeros elsewhere. Three passes over
// the row: max, sum, write. grid (Sq_pad · B·H).
extern "C" __global__ void __launch_bounds__(SOFTMAX_THREADS)
attention_softmax(const float* s, elem_t* p, int Sq, int Sk, int ld_s, float scale_log2,
                  int causal) {
    __shared__ float scratch[SOFTMAX_THREADS];
    // blockIdx.x: row `row` of (batch, head) bh, see attention.cuh
    const int rows_pad = (Sq + TILE - 1) / TILE * TILE;
    const int row = blockIdx.x % rows_pad, bh = blockIdx.x / rows_pad;
    const size_t offset = ((size_t)bh * rows_pad + row) * ld_s;
    s += offset;
    p += offset;
    if (row >= Sq) {  // a padding row: zeros, so P·V reads defined values
        for (int j = threadIdx.x; j < ld_s; j += SOFTMAX_THREADS) p[j] = to_elem(0.0f);
        return;
    }
    const int n_keys = causal ? min(row + 1, Sk) : Sk;  // keys past n_keys are masked

    float m = NEG_INF;
    for (int j = threadIdx.x; j < n_keys; j += SOFTMAX_THREADS) m = fmaxf(m, s[j] * scale_log2);
    m = block_reduce<true>(m, scratch);

    float l = 0.0f;
    for (int j = threadIdx.x; j < n_keys; j += SOFTMAX_THREADS) l += exp2f(s[j] * scale_log2 - m);
    const float inv_l = 1.0f / block_reduce<false>(l, scratch);

    for (int j = threadIdx.x; j < ld_s; j += SOFTMAX_THREADS)
        p[j] = to_elem(j < n_keys ? exp2f(s[j] * scale_log2 - m) * inv_l : 0.0f);
}

// O[bh, i, :] = Σ_j P[bh, i, j]·v[b, h / group, j, :] for a TILE-row × TILE-column tile of O.
// grid (HEAD_DIM / TILE · B·H, Sq_pad / TILE).
extern "C" __global__ void __launch_bounds__(THREADS)
attention_pv(const elem_t* p, const elem_t* v, elem_t* out, int Sq, int Sk, int ld_p,
             int causal, int H, int group, long long v_batch, long long v_head, int v_row) {
    __shared__ __align__(32) elem_t p_tile[TILE][K_STEP];
    __shared__ __align__(32) elem_t v_tile[K_STEP][TILE];
    __shared__ __align__(32) float o_tile[TILE][TILE];
    // blockIdx.x: column tile col0 / TILE of (batch b, head h), see attention.cuh
    constexpr int n_col_tiles = HEAD_DIM / TILE;
    const int rows_pad = gridDim.y * TILE;
    const int bh = blockIdx.x / n_col_tiles, b = bh / H, h = bh % H;
    const int col0 = blockIdx.x % n_col_tiles * TILE, row0 = blockIdx.y * TILE;
    p += (size_t)bh * rows_pad * ld_p;
    v += b * v_batch + h / group * v_head;  // v read in place, with its strides
    out += (size_t)bh * Sq * HEAD_DIM;
    const int warp = threadIdx.x / 32, wr = warp / 2, wc = warp % 2;
    // Causal: P is zero right of the diagonal, so keys past the tile's last row add nothing.
    const int n_keys = causal ? min(ld_p, row0 + TILE) : ld_p;

    acc_frag acc;
    wmma::fill_fragment(acc, 0.0f);
    for (int j0 = 0; j0 < n_keys; j0 += K_STEP) {
        load_tile<TILE, K_STEP, THREADS>(&p_tile[0][0], p, row0, rows_pad, ld_p, j0);
        load_tile<K_STEP, TILE, THREADS>(&v_tile[0][0], v, j0, Sk, v_row, col0);  // zeros past Sk
        __syncthreads();
        wmma::fragment<wmma::matrix_a, 16, 16, 16, elem_t, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, elem_t, wmma::row_major> b;
        load_fragment(a, &p_tile[wr * 16][0], K_STEP);
        load_fragment(b, &v_tile[0][wc * 16], TILE);
        wmma::mma_sync(acc, a, b, acc);
        __syncthreads();
    }
    // The accumulator's layout inside a warp is opaque: go through shared memory to convert
    // to q's dtype and to leave out the padding rows.
    wmma::store_matrix_sync(&o_tile[wr * 16][wc * 16], acc, TILE, wmma::mem_row_major);
    __syncthreads();
    for (int i = threadIdx.x; i < TILE * TILE; i += THREADS) {
        const int r = i / TILE, c = i % TILE;
        if (row0 + r < Sq) out[(size_t)(row0 + r) * HEAD_DIM + col0 + c] = to_elem(o_tile[r][c]);
    }
}

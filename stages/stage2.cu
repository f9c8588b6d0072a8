// Stage 2 — fused attention with the online softmax.
//
// One kernel. A block owns BLOCK_Q query rows of one (batch, head) and streams the keys and
// values through shared memory, BLOCK_K rows at a time. For each K/V tile:
//   S = Q·Kᵀ on tensor cores (WMMA), into shared memory — never to global memory;
//   the online softmax: each row's running max m and sum l are updated, the tile's
//     probabilities P = exp(scale·S − m) are written, and the row of O computed so far is
//     rescaled by exp(m_old − m_new), because it was summed against the old max;
//   O += P·V on tensor cores.
// At the end O / l is written out. q, k, v are read once per block and the output is written
// once: global traffic is linear in the sequence length, not quadratic.
//
// Done simply: one thread per query row runs the softmax (the first BLOCK_Q threads; the
// others wait at a barrier), and every step is separated from the next by __syncthreads().
// S, P and O live in shared memory in column-major order ([column][row]): when the 32
// threads of a warp each walk along their own row, at each step they touch 32 consecutive
// words, one per bank.
#include "attention.cuh"
using namespace nvcuda;

constexpr int BLOCK_Q = 32;              // query rows per block
constexpr int BLOCK_K = 32;              // keys per K/V tile
constexpr int WARPS = BLOCK_Q / 16;      // warp w computes query rows [16w, 16w + 16)
constexpr int THREADS = 32 * WARPS;
constexpr int D = HEAD_DIM;

extern "C" __global__ void __launch_bounds__(THREADS)
attention_fused(const elem_t* q, const elem_t* k, const elem_t* v, elem_t* out, int Sq, int Sk,
                float scale_log2, int causal) {
    __shared__ __align__(32) elem_t q_tile[BLOCK_Q][D];
    __shared__ __align__(32) elem_t k_tile[BLOCK_K][D];
    __shared__ __align__(32) elem_t v_tile[BLOCK_K][D];
    __shared__ __align__(32) float s_t[BLOCK_K][BLOCK_Q];   // S, column-major
    __shared__ __align__(32) elem_t p_t[BLOCK_K][BLOCK_Q];  // P, column-major
    __shared__ __align__(32) float o_t[D][BLOCK_Q];         // O (not yet divided by l)
    __shared__ float inv_l[BLOCK_Q];

    const int tid = threadIdx.x, warp = tid / 32;
    const int q0 = blockIdx.x * BLOCK_Q, bh = blockIdx.y;
    q += (size_t)bh * Sq * D;
    k += (size_t)bh * Sk * D;
    v += (size_t)bh * Sk * D;
    out += (size_t)bh * Sq * D;

    load_tile<BLOCK_Q, D>(&q_tile[0][0], q, q0, Sq, D, 0);  // zeros past Sq
    for (int i = tid; i < D * BLOCK_Q; i += THREADS) (&o_t[0][0])[i] = 0.0f;
    __syncthreads();
    // Each warp keeps its 16 rows of Q in registers, as WMMA fragments, for the whole loop.
    wmma::fragment<wmma::matrix_a, 16, 16, 16, elem_t, wmma::row_major> q_frag[D / 16];
    for (int d = 0; d < D / 16; ++d) wmma::load_matrix_sync(q_frag[d], &q_tile[warp * 16][d * 16], D);

    // Thread r < BLOCK_Q owns query row q0 + r: its running max (in log2 units) and sum.
    const int row = q0 + tid;
    float row_max = NEG_INF, row_sum = 0.0f;
    // Causal: keys past the tile's last query are masked for every row; skip those tiles.
    const int n_keys = causal ? min(Sk, q0 + BLOCK_Q) : Sk;

    for (int k0 = 0; k0 < n_keys; k0 += BLOCK_K) {
        __syncthreads();  // every warp is done with the previous K/V tile
        load_tile<BLOCK_K, D>(&k_tile[0][0], k, k0, Sk, D, 0);  // zeros past Sk
        load_tile<BLOCK_K, D>(&v_tile[0][0], v, k0, Sk, D, 0);
        __syncthreads();

        // S = Q·Kᵀ: warp w computes rows [16w, 16w + 16) of the tile's scores.
        for (int n = 0; n < BLOCK_K / 16; ++n) {
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> s_frag;
            wmma::fill_fragment(s_frag, 0.0f);
            for (int d = 0; d < D / 16; ++d) {
                wmma::fragment<wmma::matrix_b, 16, 16, 16, elem_t, wmma::col_major> k_frag;
                wmma::load_matrix_sync(k_frag, &k_tile[n * 16][d * 16], D);
                wmma::mma_sync(s_frag, q_frag[d], k_frag, s_frag);
            }
            wmma::store_matrix_sync(&s_t[n * 16][warp * 16], s_frag, BLOCK_Q, wmma::mem_col_major);
        }
        __syncthreads();

        // The online softmax, one thread per row.
        if (tid < BLOCK_Q) {
            float tile_max = NEG_INF;
            for (int c = 0; c < BLOCK_K; ++c)
                if (key_visible(k0 + c, row, Sk, causal)) tile_max = fmaxf(tile_max, s_t[c][tid] * scale_log2);
            const float new_max = fmaxf(row_max, tile_max);
            const float base = new_max == NEG_INF ? 0.0f : new_max;  // no key seen yet: no NaN
            const float rescale = exp2f(row_max - base);  // O and l were summed against row_max
            row_sum *= rescale;
            for (int c = 0; c < BLOCK_K; ++c) {
                const float p = key_visible(k0 + c, row, Sk, causal) ? exp2f(s_t[c][tid] * scale_log2 - base) : 0.0f;
                row_sum += p;
                p_t[c][tid] = to_elem(p);
            }
            for (int d = 0; d < D; ++d) o_t[d][tid] *= rescale;
            row_max = new_max;
        }
        __syncthreads();

        // O += P·V: warp w updates its 16 rows of O, D/16 column tiles.
        for (int n = 0; n < D / 16; ++n) {
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> o_frag;
            wmma::load_matrix_sync(o_frag, &o_t[n * 16][warp * 16], BLOCK_Q, wmma::mem_col_major);
            for (int c = 0; c < BLOCK_K / 16; ++c) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, elem_t, wmma::col_major> p_frag;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, elem_t, wmma::row_major> v_frag;
                wmma::load_matrix_sync(p_frag, &p_t[c * 16][warp * 16], BLOCK_Q);
                wmma::load_matrix_sync(v_frag, &v_tile[c * 16][n * 16], D);
                wmma::mma_sync(o_frag, p_frag, v_frag, o_frag);
            }
            wmma::store_matrix_sync(&o_t[n * 16][warp * 16], o_frag, BLOCK_Q, wmma::mem_col_major);
        }
    }

    if (tid < BLOCK_Q) inv_l[tid] = 1.0f / row_sum;
    __syncthreads();
    // Write O / l; consecutive threads write consecutive elements of a row (coalesced).
    for (int i = tid; i < BLOCK_Q * D; i += THREADS) {
        const int r = i / D, d = i % D;
        if (q0 + r < Sq) out[(size_t)(q0 + r) * D + d] = to_elem(o_t[d][r] * inv_l[r]);
    }
}

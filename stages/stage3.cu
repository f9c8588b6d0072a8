// Stage 3 — fused attention, the softmax done by warps.
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
// What changes from stage 2: the warp that computed 16 rows of S also runs their softmax
// and owns their rows of P and O. Two lanes share a row: lane l takes row l % 16 and half of
// the tile's columns (and half of O's), and the two halves combine their max and their sum
// with one warp shuffle each. All 32 lanes of every warp work, and the rows a warp touches
// are its own, so the barriers between the steps become __syncwarp(); the block meets only
// around the K/V tile that all warps share. The shared-memory layouts are stage 2's.
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

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
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

    // Lanes l and l + 16 of warp w own query row q0 + r, r = 16w + l % 16: its running max (in
    // log2 units) and sum. Each takes half of the columns: c0 is where its half starts.
    const int r = warp * 16 + lane % 16, row = q0 + r, half = lane / 16;
    const int c0 = half * (BLOCK_K / 2), d0 = half * (D / 2);
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
        __syncwarp();  // the warp's own rows of S are in shared memory

        // The online softmax, two lanes per row; the warp's other rows are no business of ours.
        {
            float tile_max = NEG_INF;
            for (int c = c0; c < c0 + BLOCK_K / 2; ++c)
                if (key_visible(k0 + c, row, Sk, causal)) tile_max = fmaxf(tile_max, s_t[c][r] * scale_log2);
            tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffff, tile_max, 16));  // other half
            const float new_max = fmaxf(row_max, tile_max);
            const float base = new_max == NEG_INF ? 0.0f : new_max;  // no key seen yet: no NaN
            const float rescale = exp2f(row_max - base);  // O and l were summed against row_max
            float tile_sum = 0.0f;
            for (int c = c0; c < c0 + BLOCK_K / 2; ++c) {
                const float p = key_visible(k0 + c, row, Sk, causal) ? exp2f(s_t[c][r] * scale_log2 - base) : 0.0f;
                tile_sum += p;
                p_t[c][r] = to_elem(p);
            }
            row_sum = row_sum * rescale + tile_sum + __shfl_xor_sync(0xffffffff, tile_sum, 16);
            for (int d = d0; d < d0 + D / 2; ++d) o_t[d][r] *= rescale;
            row_max = new_max;
        }
        __syncwarp();  // the warp's rows of P and O are ready for its P·V

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

    if (half == 0) inv_l[r] = 1.0f / row_sum;
    __syncwarp();
    // Each warp writes O / l for its own 16 rows; consecutive lanes write consecutive elements.
    for (int i = lane; i < 16 * D; i += 32) {
        const int rr = warp * 16 + i / D, d = i % D;
        if (q0 + rr < Sq) out[(size_t)(q0 + rr) * D + d] = to_elem(o_t[d][rr] * inv_l[rr]);
    }
}

// Stage 3 — fused attention, the softmax done by warps.
//
// One kernel. A block owns BLOCK_Q query rows of one (batch, head) and streams the keys and
// values through shared memory, BLOCK_K rows at a time. For each K/V tile:
//   S = Q·Kᵀ on tensor cores (WMMA), into shared memory — never to global memory;
//   the online softmax: each row's running max m and sum l are updated, the tile's
//     probabilities P = exp(scale·S − m) are written, and the row of O computed so far is
//     rescaled by exp(m_old − m_new), because it was summed against the old max;
//   O += P·V on tensor cores, O staying in registers (WMMA accumulator fragments).
// At the end O / l is written out. q, k, v are read once per block and the output is written
// once: global traffic is linear in the sequence length, not quadratic.
//
// What changes from stage 2: the warp that computed 16 rows of S also runs their softmax,
// as it already owns their rows of O. Two neighbouring lanes share a row: lane l takes row
// l / 2 and every other column (the even ones or the odd ones), and the two combine their max
// and their sum with one warp shuffle each. All 32 lanes of every warp work, and the rows a
// warp touches are its own, so the barriers between the steps become __syncwarp(); the block
// meets only around the K/V tile that all warps share. The shared-memory layouts are stage
// 2's: S and P column-major, with LD_S chosen so that the two lanes of a row, one column
// apart, land 16 banks apart.
//
// Shared memory has 32 banks of 4 bytes; a warp's access takes one pass per distinct address
// in the busiest bank. A WMMA load reads 16-byte pieces of 8 rows at once: with rows of 128
// bytes (D = 64 fp16) all 8 start in the same 4 banks, an 8-way conflict. Each row of the
// shared tiles is therefore padded by 16 bytes (LD = D + 8), which staggers the 8 rows over
// all 32 banks.
#include "attention.cuh"
using namespace nvcuda;

constexpr int BLOCK_Q = 32;              // query rows per block
constexpr int BLOCK_K = 32;              // keys per K/V tile
constexpr int WARPS = BLOCK_Q / 16;      // warp w computes query rows [16w, 16w + 16)
constexpr int THREADS = 32 * WARPS;
constexpr int D = HEAD_DIM;
constexpr int LD = D + 8;                // row stride of the Q, K and V tiles (elements)
constexpr int LD_O = D + 4;              // ... of the O tile (floats)
constexpr int LD_S = BLOCK_Q + 16;       // column stride of S (floats)
constexpr int LD_P = BLOCK_Q + 8;        // column stride of P (elements)

typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc_frag;

// The big tiles are needed one after the other, so they share one piece of shared memory:
// Q until it is in registers, then the K/V tile of each step, then O on its way out.
union Tiles {
    elem_t q[BLOCK_Q][LD];
    struct { elem_t k[BLOCK_K][LD]; elem_t v[BLOCK_K][LD]; } kv;
    float o[BLOCK_Q][LD_O];
};

// At D 128, ask for 6 blocks per SM: that leaves 168 registers a thread, what the kernel needs
// (NVRTC 13.5 picks 168 by itself). Left to itself, NVRTC 13.0 (the H100 machine's) gives the D 128
// build 209, so only 4 blocks fit: a third slower (stage 3 as 4506624 built it, 168 registers, next
// to ab5e7dc's, experiments/kernel_or_run/then_and_now.py). At D 64 the registers fit 8 blocks
// anyway.
#if HEAD_DIM == 128
#define MIN_BLOCKS_PER_SM , 6
#else
#define MIN_BLOCKS_PER_SM
#endif

extern "C" __global__ void __launch_bounds__(THREADS MIN_BLOCKS_PER_SM)
attention_fused(const elem_t* q, const elem_t* k, const elem_t* v, elem_t* out, int Sq, int Sk,
                float scale_log2, int causal, int H, int group,
                long long q_batch, long long q_head, int q_row, long long k_batch, long long k_head,
                int k_row, long long v_batch, long long v_head, int v_row) {
    q_row = row_stride(q_row), k_row = row_stride(k_row), v_row = row_stride(v_row);  // attention.cuh
    __shared__ __align__(32) Tiles tiles;
    __shared__ __align__(32) float s_t[BLOCK_K][LD_S];      // S, column-major
    __shared__ __align__(32) elem_t p_t[BLOCK_K][LD_P];     // P, column-major
    __shared__ __align__(32) float row_ids[16][16];         // row_ids[r][c] = r, see below
    __shared__ float rescale_of[BLOCK_Q];                   // this step's exp(m_old − m_new)
    __shared__ float inv_l[BLOCK_Q];                        // at the end, 1 / l

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    // blockIdx.x: query tile q0 / BLOCK_Q of (batch b, head h), see attention.cuh
    const int n_q_tiles = (Sq + BLOCK_Q - 1) / BLOCK_Q;
    const int bh = blockIdx.x / n_q_tiles, b = bh / H, h = bh % H;
    const int q0 = blockIdx.x % n_q_tiles * BLOCK_Q;
    q += b * q_batch + h * q_head;  // q, k, v read in place, with their strides
    k += b * k_batch + h / group * k_head;  // grouped-query: H / group K/V heads
    v += b * v_batch + h / group * v_head;
    out += (size_t)bh * Sq * D;

    load_tile<BLOCK_Q, D, THREADS, LD>(&tiles.q[0][0], q, q0, Sq, q_row, 0);  // zeros past Sq
    for (int i = tid; i < 16 * 16; i += THREADS) row_ids[i / 16][i % 16] = float(i / 16);
    __syncthreads();
    // Each warp keeps its 16 rows of Q in registers, as WMMA fragments, for the whole loop.
    wmma::fragment<wmma::matrix_a, 16, 16, 16, elem_t, wmma::row_major> q_frag[D / 16];
    for (int d = 0; d < D / 16; ++d) load_fragment(q_frag[d], &tiles.q[warp * 16][d * 16], LD);
    // O (16 rows × D per warp) stays in accumulator fragments. To rescale a row we must know
    // which row each of a fragment's elements belongs to, and WMMA does not say. Loading a
    // matrix whose every element is its row number into a fragment of the same kind tells us:
    // element i of every such fragment sits in row my_rows.x[i].
    acc_frag o_frag[D / 16], my_rows;
    for (int n = 0; n < D / 16; ++n) wmma::fill_fragment(o_frag[n], 0.0f);
    wmma::load_matrix_sync(my_rows, &row_ids[0][0], 16, wmma::mem_row_major);

    // Lanes 2i and 2i + 1 of warp w own query row q0 + r, r = 16w + i: its running max (in
    // log2 units) and sum. Lane l takes the columns c with c % 2 == l % 2. `row` is its position
    // shifted by the causal diagonal (attention.cuh): the last key it may see.
    const int diag = causal_diagonal(causal, Sq, Sk);
    const int r = warp * 16 + lane / 2, row = q0 + r + diag, c0 = lane % 2;
    float row_max = NEG_INF, row_sum = 0.0f;
    // Causal: keys past the tile's last query (shifted by the diagonal, attention.cuh) are
    // masked for every row; skip those tiles.
    const int n_keys = causal ? max(0, min(Sk, q0 + BLOCK_Q + diag)) : Sk;

    for (int k0 = 0; k0 < n_keys; k0 += BLOCK_K) {
        __syncthreads();  // every warp is done with the previous K/V tile (or with Q)
        load_tile<BLOCK_K, D, THREADS, LD>(&tiles.kv.k[0][0], k, k0, Sk, k_row, 0);  // zeros past Sk
        load_tile<BLOCK_K, D, THREADS, LD>(&tiles.kv.v[0][0], v, k0, Sk, v_row, 0);
        __syncthreads();

        // S = Q·Kᵀ: warp w computes rows [16w, 16w + 16) of the tile's scores.
        for (int n = 0; n < BLOCK_K / 16; ++n) {
            acc_frag s_frag;
            wmma::fill_fragment(s_frag, 0.0f);
            for (int d = 0; d < D / 16; ++d) {
                wmma::fragment<wmma::matrix_b, 16, 16, 16, elem_t, wmma::col_major> k_frag;
                load_fragment(k_frag, &tiles.kv.k[n * 16][d * 16], LD);
                wmma::mma_sync(s_frag, q_frag[d], k_frag, s_frag);
            }
            wmma::store_matrix_sync(&s_t[n * 16][warp * 16], s_frag, LD_S, wmma::mem_col_major);
        }
        __syncwarp();  // the warp's own rows of S are in shared memory

        // The online softmax, two lanes per row; the other warps' rows are not our business.
        {
            float tile_max = NEG_INF;
            // Fully unrolled at D = 64; at D = 128 by half, since unrolled all the way the
            // kernel needs so many registers that fewer blocks fit on an SM.
#pragma unroll(D == 64 ? BLOCK_K / 2 : BLOCK_K / 4)
            for (int j = 0; j < BLOCK_K / 2; ++j) {
                const int c = 2 * j + c0;
                if (key_visible(k0 + c, row, Sk, causal)) tile_max = fmaxf(tile_max, s_t[c][r] * scale_log2);
            }
            tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffff, tile_max, 1));  // the other lane
            const float new_max = fmaxf(row_max, tile_max);
            const float base = new_max == NEG_INF ? 0.0f : new_max;  // no key seen yet: no NaN
            const float rescale = exp2f(row_max - base);  // O and l were summed against row_max
            float tile_sum = 0.0f;
#pragma unroll(D == 64 ? BLOCK_K / 2 : BLOCK_K / 4)
            for (int j = 0; j < BLOCK_K / 2; ++j) {
                const int c = 2 * j + c0;
                const float p = key_visible(k0 + c, row, Sk, causal) ? exp2f(s_t[c][r] * scale_log2 - base) : 0.0f;
                tile_sum += p;
                p_t[c][r] = to_elem(p);
            }
            tile_sum += __shfl_xor_sync(0xffffffff, tile_sum, 1);
            row_sum = row_sum * rescale + tile_sum;
            if (c0 == 0) rescale_of[r] = rescale;
            row_max = new_max;
        }
        __syncwarp();  // the warp's rows of P and their rescale factors are ready

        // O = O·rescale + P·V: warp w updates its 16 rows of O, D/16 column tiles.
        float rescale[acc_frag::num_elements];
        for (int i = 0; i < acc_frag::num_elements; ++i) rescale[i] = rescale_of[warp * 16 + int(my_rows.x[i])];
        for (int n = 0; n < D / 16; ++n) {
            for (int i = 0; i < acc_frag::num_elements; ++i) o_frag[n].x[i] *= rescale[i];
            for (int c = 0; c < BLOCK_K / 16; ++c) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, elem_t, wmma::col_major> p_frag;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, elem_t, wmma::row_major> v_frag;
                load_fragment(p_frag, &p_t[c * 16][warp * 16], LD_P);
                load_fragment(v_frag, &tiles.kv.v[c * 16][n * 16], LD);
                wmma::mma_sync(o_frag[n], p_frag, v_frag, o_frag[n]);
            }
        }
    }

    if (c0 == 0) inv_l[r] = inv_sum(row_sum);  // (not rescale_of: a lane may still read it)
    __syncthreads();  // also: every warp is done with the last K/V tile, which tiles.o reuses
    for (int n = 0; n < D / 16; ++n) {
        for (int i = 0; i < acc_frag::num_elements; ++i) o_frag[n].x[i] *= inv_l[warp * 16 + int(my_rows.x[i])];
        wmma::store_matrix_sync(&tiles.o[warp * 16][n * 16], o_frag[n], LD_O, wmma::mem_row_major);
    }
    __syncwarp();
    // Each warp writes O / l for its own 16 rows; consecutive lanes write consecutive elements.
    for (int i = lane; i < 16 * D; i += 32) {
        const int rr = warp * 16 + i / D, d = i % D;
        if (q0 + rr < Sq) out[(size_t)(q0 + rr) * D + d] = to_elem(tiles.o[rr][d]);
    }
}

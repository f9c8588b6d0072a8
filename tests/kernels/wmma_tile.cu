// A 16x16 tile product on tensor cores through WMMA: c = a · b, fp16 in, fp32 accumulate.
// The harness's NVRTC path is tested with it (offline: it compiles and its SASS has HMMA;
// on a GPU: it launches on torch tensors and matches torch).
#include <mma.h>
using namespace nvcuda;

extern "C" __global__ void wmma_tile(const half* a, const half* b, float* c, float alpha) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, half, wmma::row_major> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
    wmma::fill_fragment(fc, 0.0f);
    wmma::load_matrix_sync(fa, a, 16);
    wmma::load_matrix_sync(fb, b, 16);
    wmma::mma_sync(fc, fa, fb, fc);
    for (int i = 0; i < fc.num_elements; ++i) fc.x[i] *= alpha;
    wmma::store_matrix_sync(c, fc, 16, wmma::mem_row_major);
}

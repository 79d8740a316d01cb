/* fragment_index.cpp - must not compile: a kernel reading a WMMA fragment's
 * elements, whose layout across the warp CUDA does not document (the
 * emulator's mma.h refuses x[]). With VLMD_FRAGMENT_CONTROL it compiles:
 * what is refused is the indexing alone. */
#include <mma.h>

using namespace nvcuda;

void read_an_element(float *out)
{
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 0.0f);
#ifndef VLMD_FRAGMENT_CONTROL
    out[0] = acc.x[0];
#endif
    wmma::store_matrix_sync(out, acc, 16, wmma::mem_row_major);
}

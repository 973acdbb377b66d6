// tile_mm.h's helpers against element loops: pack_transposed, whose whole
// VL x VL blocks are transposed in registers and whose edges element by
// element, at sizes that are and are not whole blocks, at odd source strides.
#include <stdlib.h>

#include "test_util.h"
#include "tile_mm.h"

Test(tile_mm, pack_transposed_equals_element_loop) {
    // (n rows, w columns) of the source; its stride lds >= w, the packed stride ldd >= n.
    const int cases[][4] = {{VL, VL, VL, VL},     {64, 64, 256, 64},         {2 * VL, VL, VL + 3, 2 * VL + 5},
                            {VL + 3, 2 * VL + 1, 2 * VL + 7, VL + 3}, {5, 3, 3, 16}, {3 * VL - 1, VL - 1, VL, 3 * VL}};
    for (size_t t = 0; t < sizeof cases / sizeof cases[0]; t++) {
        int n = cases[t][0], w = cases[t][1], lds = cases[t][2], ldd = cases[t][3];
        real *src = test_randn((int64_t)n * lds, 7 + (int)t);
        real *dst = xmalloc((size_t)w * ldd * sizeof(real));
        for (int64_t i = 0; i < (int64_t)w * ldd; i++) dst[i] = -1;   // every element must be written
        pack_transposed(dst, ldd, src, lds, n, w);
        for (int c = 0; c < w; c++)
            for (int i = 0; i < ldd; i++) {
                real want = i < n ? src[(int64_t)i * lds + c] : 0;
                cr_assert(dst[(int64_t)c * ldd + i] == want, "case %zu (n %d, w %d): dst[%d][%d] = %g, want %g", t, n,
                          w, c, i, (double)dst[(int64_t)c * ldd + i], (double)want);
            }
        free(src);
        free(dst);
    }
}

// fuzz_gemm_cache: the file where gemm = auto keeps its measurement
// (blas.h: blas_auto_cache_lookup, blas_auto_cache_store). Input: the file's
// bytes. Invariants: nothing crashes or leaks; a lookup's verdict is a
// backend and a ratio in range; after a store, every line of the file is
// well formed, the stored key reads back (ratio to the file's 4 decimals),
// the keys the input had are still found with their verdicts (the file had
// at most 64), and storing the same line again leaves the same bytes.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blas.h"
#include "fuzz_util.h"

static void fail(const char *what, const char *key) {
    fprintf(stderr, "fuzz_gemm_cache: %s (key \"%s\")\n", what, key);
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > (1 << 16)) return 0;
    const char *path = fuzz_path("gemm_auto");
    fuzz_write_file(path, data, size);
    // The keys in the input's first lines (up to its first tab), and a fixed one.
    static const char *fixed = "AMD EPYC|family 25 model 17 stepping 1|cpu AVX-512|threads 2";
    char keys[4][128];
    int nk = 0;
    for (size_t at = 0; at < size && nk < 4;) {
        const uint8_t *nl = memchr(data + at, '\n', size - at), *tab = memchr(data + at, '\t', size - at);
        size_t end = nl ? (size_t)(nl - data) : size;
        if (tab && (size_t)(tab - data) < end && (size_t)(tab - data) - at < sizeof keys[0]) {
            memcpy(keys[nk], data + at, (size_t)(tab - data) - at);
            keys[nk][(size_t)(tab - data) - at] = 0;
            if (strlen(keys[nk]) == (size_t)(tab - data) - at && keys[nk][0]) nk++;
        }
        at = end + 1;
    }
    double before[4];
    GemmBackend was[4];
    bool had[4];
    for (int i = 0; i < nk; i++) {
        had[i] = blas_auto_cache_lookup(path, keys[i], &before[i], &was[i]);
        if (had[i] && (!(before[i] >= 1e-3 && before[i] <= 1000) || (was[i] != GEMM_OPENBLAS && was[i] != GEMM_ONEDNN)))
            fail("a verdict out of range", keys[i]);
    }
    double r = 0.25 + (size % 7) * 0.1;
    if (!blas_auto_cache_store(path, fixed, r, GEMM_ONEDNN)) fail("cannot store", fixed);
    double back;
    GemmBackend b;
    if (!blas_auto_cache_lookup(path, fixed, &back, &b) || b != GEMM_ONEDNN || fabs(back - r) > 5e-5)
        fail("the stored line does not read back", fixed);
    size_t lines = 0;   // (a file of 63 lines or more loses its oldest, which these are)
    for (size_t i = 0; i < size; i++) lines += data[i] == '\n';
    for (int i = 0; i < nk && lines < 62; i++) {
        if (!had[i] || !strcmp(keys[i], fixed)) continue;
        if (!blas_auto_cache_lookup(path, keys[i], &back, &b) || b != was[i] ||
            fabs(back - before[i]) > 5e-5 * (1 + before[i]))
            fail("an update lost or changed another machine's line", keys[i]);
    }
    size_t n1, n2;
    uint8_t *one = fuzz_read_file(path, &n1);
    for (size_t i = 0, start = 0; i < n1; i++)   // every line: key TAB ratio TAB backend
        if (one[i] == '\n') {
            int tabs = 0;
            for (size_t j = start; j < i; j++) {
                if (one[j] == 0) fail("a NUL byte written", fixed);
                tabs += one[j] == '\t';
            }
            if (tabs != 2) fail("a malformed line written", fixed);
            start = i + 1;
        } else if (i == n1 - 1) {
            fail("a last line without its newline", fixed);
        }
    if (!blas_auto_cache_store(path, fixed, r, GEMM_ONEDNN)) fail("cannot store again", fixed);
    uint8_t *two = fuzz_read_file(path, &n2);
    if (n1 != n2 || memcmp(one, two, n1)) fail("storing the same line twice changed the file", fixed);
    free(one);
    free(two);
    return 0;
}

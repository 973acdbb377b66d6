// blas_env.h: which OpenBLAS kernels run, for the headers of logs and benchmarks.
//
// OpenBLAS picks its kernel set once, when the library loads: from
// OPENBLAS_CORETYPE if set, else from the CPU. Debian 12's OpenBLAS (0.3.21)
// predates AMD Zen 5; on such machines the environment pins Haswell (AVX2)
// kernels, and this project keeps whatever the environment chose (the
// AVX-512 SkylakeX set is faster there, docs/benchmarks.md, but is not ours to
// switch on). Benchmarks print the set so figures can be compared.
#ifndef AG_BLAS_ENV_H
#define AG_BLAS_ENV_H

// The kernel set OpenBLAS uses ("Haswell", "SkylakeX", ...).
const char *blas_core_name(void);

#endif

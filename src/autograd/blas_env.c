#include "blas_env.h"

#include <cblas.h>

const char *blas_core_name(void) {
    const char *name = openblas_get_corename();
    return name ? name : "?";
}

#include "tensor.h"

#include <string.h>

int64_t shape_numel(int ndim, const int *shape) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    return n;
}

const char *tensor_shape_str(const Tensor *t, char *buf, size_t n) {
    size_t used = 0;
    used += (size_t)snprintf(buf + used, n - used, "(");
    for (int i = 0; i < t->ndim && used < n; i++)
        used += (size_t)snprintf(buf + used, n - used, i ? ", %d" : "%d", t->shape[i]);
    if (used < n) snprintf(buf + used, n - used, ")");
    return buf;
}

bool tensor_same_shape(const Tensor *a, const Tensor *b) {
    if (a->ndim != b->ndim) return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return false;
    return true;
}

int tensor_dim(const Tensor *t, int d) {
    if (d < 0) d += t->ndim;
    ASSERT(d >= 0 && d < t->ndim, "dimension %d out of range for a %d-d tensor", d, t->ndim);
    return t->shape[d];
}

int64_t tensor_rows(const Tensor *t) {
    return t->numel / t->shape[t->ndim - 1];
}

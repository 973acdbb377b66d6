#include "params.h"

#include <stdlib.h>
#include <string.h>

void params_init(ParamStore *ps) { memset(ps, 0, sizeof *ps); }

void params_free(ParamStore *ps) {
    for (int i = 0; i < ps->n; i++) {
        free((char *)ps->params[i]->name);
        free(ps->params[i]);
    }
    free(ps->params);
    free(ps->inits);
    free(ps->offsets);
    dev_free(ps->device, ps->data);
    dev_free(ps->device, ps->grad);
    free(ps->host);
    memset(ps, 0, sizeof *ps);
}

Tensor *params_add(ParamStore *ps, const char *name, int ndim, const int *shape, ParamInit init,
                   unsigned flags) {
    ASSERT(!ps->finalized, "params_add('%s') after params_finalize: register every parameter first", name);
    ASSERT(ndim >= 1 && ndim <= TENSOR_MAX_DIMS, "parameter '%s': %d dimensions", name, ndim);
    ASSERT(!params_find(ps, name), "parameter '%s' registered twice", name);
    if (ps->n == ps->cap) {
        ps->cap = ps->cap ? 2 * ps->cap : 64;
        ps->params = xrealloc(ps->params, (size_t)ps->cap * sizeof *ps->params);
        ps->inits = xrealloc(ps->inits, (size_t)ps->cap * sizeof *ps->inits);
        ps->offsets = xrealloc(ps->offsets, (size_t)ps->cap * sizeof *ps->offsets);
    }
    Tensor *t = xcalloc(1, sizeof *t);
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) {
        ASSERT(shape[i] > 0, "parameter '%s': dimension %d is %d", name, i, shape[i]);
        t->shape[i] = shape[i];
    }
    t->numel = shape_numel(ndim, shape);
    t->flags = TENSOR_PARAM | flags;
    t->requires_grad = !(flags & TENSOR_FROZEN);
    size_t len = strlen(name) + 1;
    char *copy = xmalloc(len);
    memcpy(copy, name, len);
    t->name = copy;
    ps->params[ps->n] = t;
    ps->inits[ps->n] = init;
    ps->offsets[ps->n] = ps->numel;
    ps->numel += t->numel;
    ps->n++;
    return t;
}

static void apply_init(Tensor *t, const ParamInit *in, Rng *rng) {
    real *d = t->data;
    switch (in->kind) {
    case INIT_ZEROS: for (int64_t i = 0; i < t->numel; i++) d[i] = 0; break;
    case INIT_ONES: for (int64_t i = 0; i < t->numel; i++) d[i] = 1; break;
    case INIT_CONST: for (int64_t i = 0; i < t->numel; i++) d[i] = (real)in->a; break;
    case INIT_NORMAL: for (int64_t i = 0; i < t->numel; i++) d[i] = (real)(in->a * rng_normal(rng)); break;
    case INIT_UNIFORM:
        for (int64_t i = 0; i < t->numel; i++) d[i] = (real)rng_range(rng, in->a, in->b);
        break;
    case INIT_FN:
        ASSERT(in->fn, "parameter '%s': INIT_FN without a function", t->name);
        in->fn(d, t->numel, rng, in->a, in->b);
        break;
    default: FAIL("parameter '%s': unknown init kind %d", t->name, in->kind);
    }
}

void params_finalize(ParamStore *ps, uint64_t seed) {
    ASSERT(!ps->finalized, "params_finalize called twice");
    ps->data = xaligned((size_t)(ps->numel ? ps->numel : 1) * sizeof(real));
    ps->grad = xaligned((size_t)(ps->numel ? ps->numel : 1) * sizeof(real));
    memset(ps->grad, 0, (size_t)ps->numel * sizeof(real));
    Rng rng;
    rng_seed(&rng, seed);
    for (int i = 0; i < ps->n; i++) {
        Tensor *t = ps->params[i];
        t->data = ps->data + ps->offsets[i];
        t->grad = t->requires_grad ? ps->grad + ps->offsets[i] : NULL;
        apply_init(t, &ps->inits[i], &rng);
    }
    ps->finalized = true;
}

void params_zero_grad(ParamStore *ps) { dev_zero(ps->device, ps->grad, (size_t)ps->numel * sizeof(real)); }

void params_to_device(ParamStore *ps, Device device) {
    ASSERT(ps->finalized, "params_to_device before params_finalize");
    if (device == ps->device) return;
    ASSERT(ps->device == DEVICE_CPU, "params_to_device: the values are on %s already", device_name(ps->device));
    size_t bytes = (size_t)(ps->numel ? ps->numel : 1) * sizeof(real);
    real *data = dev_alloc(device, bytes), *grad = dev_alloc(device, bytes);
    dev_from_host(data, device, ps->data, (size_t)ps->numel * sizeof(real));
    dev_zero(device, grad, bytes);
    free(ps->grad);
    ps->host = ps->data;
    ps->data = data;
    ps->grad = grad;
    ps->device = device;
    for (int i = 0; i < ps->n; i++) {
        Tensor *t = ps->params[i];
        t->data = ps->data + ps->offsets[i];
        t->grad = t->requires_grad ? ps->grad + ps->offsets[i] : NULL;
        if (device == DEVICE_CUDA) t->flags |= TENSOR_ON_GPU;
    }
}

const real *params_pull(ParamStore *ps) {
    if (ps->device == DEVICE_CPU) return ps->data;
    dev_to_host(ps->host, ps->data, (size_t)ps->numel * sizeof(real), ps->device);
    return ps->host;
}

void params_set_frozen(ParamStore *ps, Tensor *p, bool frozen) {
    ASSERT(ps->finalized, "params_set_frozen('%s') before params_finalize", p->name);
    for (int i = 0; i < ps->n; i++) {
        if (ps->params[i] != p) continue;
        if (frozen) {
            p->flags |= TENSOR_FROZEN;
            p->requires_grad = false;
            p->grad = NULL;
            dev_zero(ps->device, ps->grad + ps->offsets[i], (size_t)p->numel * sizeof(real));
        } else {
            p->flags &= ~(unsigned)TENSOR_FROZEN;
            p->requires_grad = true;
            p->grad = ps->grad + ps->offsets[i];
        }
        return;
    }
    FAIL("params_set_frozen: tensor '%s' is not in this ParamStore", p->name ? p->name : "?");
}

Tensor *params_find(const ParamStore *ps, const char *name) {
    for (int i = 0; i < ps->n; i++)
        if (strcmp(ps->params[i]->name, name) == 0) return ps->params[i];
    return NULL;
}

int64_t params_count(const ParamStore *ps, bool trainable_only) {
    int64_t n = 0;
    for (int i = 0; i < ps->n; i++)
        if (!trainable_only || ps->params[i]->requires_grad) n += ps->params[i]->numel;
    return n;
}

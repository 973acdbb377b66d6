// optim_device.c: optim_device.h's step, eagerly or from a CUDA graph.
#include "optim_device.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "optim_common.h"

// Elements per chunk of the update's table: a block's share (16 per thread).
#define OPTIM_CHUNK 4096

bool optim_device_supported(Device d) { return d != DEVICE_CPU; }

void optim_device_init(OptimDevice *od, Device d, bool graphs) {
    memset(od, 0, sizeof *od);
    od->device = d;
    od->graphs = graphs;
    od->g = graphs ? dev_graph_new(d) : NULL;
    od->graphs = od->g != NULL;
    od->hyper = dev_alloc(d, 3 * sizeof(real));
    od->scratch = dev_alloc(d, DEVICE_OPTIM_SCRATCH);
    od->stat = dev_alloc(d, sizeof(DeviceOptimStat));
}

void optim_device_free(OptimDevice *od) {
    if (!od->hyper) return;   // (never initialised, or freed)
    if (od->g) dev_graph_free(od->g);
    dev_free(od->device, od->chunks);
    dev_free(od->device, od->hyper);
    dev_free(od->device, od->scratch);
    dev_free(od->device, od->stat);
    free(od->chunks_host);
    memset(od, 0, sizeof *od);
}

// The table of chunks of the update: every slice (optim_common.h) cut into
// pieces of at most OPTIM_CHUNK elements; n_chunks set.
static DeviceOptimChunk *chunk_table(const Optimizer *opt, const ParamStore *ps, int *n_chunks) {
    OptimSlice *sl;
    int ns = optim_slices(opt, ps, &sl);
    int64_t n = 0;
    for (int s = 0; s < ns; s++) n += (sl[s].b - sl[s].a + OPTIM_CHUNK - 1) / OPTIM_CHUNK;
    ASSERT(n < INT_MAX, "optim_device: %lld chunks", (long long)n);
    DeviceOptimChunk *c = xmalloc((size_t)(n ? n : 1) * sizeof *c);
    int k = 0;
    for (int s = 0; s < ns; s++)
        for (int64_t a = sl[s].a; a < sl[s].b; a += OPTIM_CHUNK)
            c[k++] = (DeviceOptimChunk){a, sl[s].b - a < OPTIM_CHUNK ? sl[s].b - a : OPTIM_CHUNK, sl[s].decay};
    free(sl);
    *n_chunks = k;
    return c;
}

// Field by field: in the float32 build a chunk has 4 bytes of padding after
// decay, which a compound literal leaves as whatever was there, so a memcmp
// of two equal tables could differ and capture the graph again.
static bool chunks_same(const DeviceOptimChunk *a, const DeviceOptimChunk *b, int n) {
    for (int i = 0; i < n; i++)
        if (a[i].a != b[i].a || a[i].n != b[i].n || memcmp(&a[i].decay, &b[i].decay, sizeof a[i].decay)) return false;
    return true;
}

// (Re)build the work's arguments when opt, ps or the settings are not those
// it was built for (a resumed run's moments, a shard, a flag changed).
static void settle(OptimDevice *od, const Optimizer *opt, const ParamStore *ps, int accum, double max_norm) {
    int n_chunks;
    DeviceOptimChunk *c = chunk_table(opt, ps, &n_chunks);
    DeviceOptimStep k;
    memset(&k, 0, sizeof k);   // (compared with memcmp: the padding too)
    k.adamw = opt->kind == OPTIM_ADAMW;
    k.p = ps->data, k.g = ps->grad, k.m = opt->m, k.v = opt->v;
    k.numel = ps->numel, k.lo = opt->lo, k.hi = opt->hi;
    k.chunks = od->chunks, k.n_chunks = n_chunks;
    k.scale_first = accum > 1, k.inv_accum = (real)(1.0 / accum), k.max_norm = max_norm;
    k.b1 = (real)opt->beta1, k.b2 = (real)opt->beta2, k.eps = (real)opt->eps, k.mu = (real)opt->momentum;
    k.hyper = od->hyper, k.scratch = od->scratch, k.stat = od->stat;
    bool same = od->have_key && !memcmp(&k, &od->k, sizeof k) && od->k.n_chunks == n_chunks &&
                chunks_same(c, od->chunks_host, n_chunks);
    if (same) {
        free(c);
        return;
    }
    dev_free(od->device, od->chunks);
    od->chunks = dev_alloc(od->device, (size_t)(n_chunks ? n_chunks : 1) * sizeof *c);
    dev_from_host(od->chunks, od->device, c, (size_t)n_chunks * sizeof *c);
    free(od->chunks_host);
    od->chunks_host = c;
    k.chunks = od->chunks;
    memcpy(&od->k, &k, sizeof k);   // (the padding too: settle compares with memcmp)
    od->have_key = true;
    od->captured = false;
    od->tables++;
}

// Capture the work (nothing runs); false, with why, when the capture failed.
static bool capture(OptimDevice *od) {
    const void *in[1] = {od->hyper_host};
    size_t bytes[1] = {sizeof od->hyper_host};
    dev_graph_begin(od->g, in, bytes, 1);
    dev_from_host(od->hyper, od->device, od->hyper_host, sizeof od->hyper_host);
    device_kernels(od->device)->optim_queue(&od->k);
    char why[200];
    bool ok = dev_graph_end(od->g, why, sizeof why);
    // The step's learning rate must come from hyper_host at every launch.
    if (ok && dev_graph_traced(od->g) != 1) {
        ok = false;
        snprintf(why, sizeof why, "the learning rate's copy was not traced to the step's values");
    }
    if (!ok) {
        od->off = true;
        snprintf(od->why, sizeof od->why, "%s", why);
        if (!od->quiet) fprintf(stderr, "train: cuda_graph: the optimizer step's capture failed (%s); on without\n", why);
        return false;
    }
    od->captured = true;
    od->captures++;
    return true;
}

void optim_device_step(OptimDevice *od, Optimizer *opt, ParamStore *ps, int accum, double max_norm, double lr,
                       OptimDeviceResult *r) {
    ASSERT(opt->kind == OPTIM_ADAMW || opt->kind == OPTIM_SGD, "optim_device_step: optimizer kind %d",
           (int)opt->kind);
    ASSERT(opt->numel == ps->numel && opt->device == od->device && ps->device == od->device,
           "optim_device_step: optimizer (%lld elements, %s), parameters (%lld, %s), step on %s",
           (long long)opt->numel, device_name(opt->device), (long long)ps->numel, device_name(ps->device),
           device_name(od->device));
    ASSERT(accum >= 1, "optim_device_step: accum %d", accum);
    settle(od, opt, ps, accum, max_norm);
    // adamw_step's values, in its arithmetic
    int64_t t = opt->step + 1;
    od->hyper_host[0] = (real)lr;
    od->hyper_host[1] = opt->kind == OPTIM_ADAMW ? (real)(1.0 - pow(opt->beta1, (double)t)) : 1;
    od->hyper_host[2] = opt->kind == OPTIM_ADAMW ? (real)(1.0 - pow(opt->beta2, (double)t)) : 1;
    if (od->g && !od->off && !od->captured) capture(od);
    if (od->g && !od->off && od->captured) {
        const void *in[1] = {od->hyper_host};
        dev_graph_launch(od->g, in);
        od->replays++;
    } else {
        dev_from_host(od->hyper, od->device, od->hyper_host, sizeof od->hyper_host);
        device_kernels(od->device)->optim_queue(&od->k);
        od->eager++;
    }
    DeviceOptimStat st;
    dev_to_host(&st, od->stat, sizeof st, od->device);
    r->norm = sqrt(st.sumsq);
    r->stepped = isfinite(r->norm);
    if (r->stepped) opt->step = t;
    // optim_nonfinite_param's choice: the least flat index of the three
    long long best = st.bad[0];
    if (st.bad[1] != LLONG_MAX && st.bad[1] + opt->lo < best) best = st.bad[1] + opt->lo;
    if (st.bad[2] != LLONG_MAX && st.bad[2] + opt->lo < best) best = st.bad[2] + opt->lo;
    r->bad = best == LLONG_MAX ? NULL : ps->params[optim_param_of(ps, (int64_t)best)];
}

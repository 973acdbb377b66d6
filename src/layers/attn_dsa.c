// attn_dsa.c: the `attn_dsa` mixer, softmax attention restricted to the
// positions a lightweight indexer picks (MODEL.md `attn_dsa`).
//
//   q, k, v, Wo as in `attn` (attn_layer.h)
//   ū = stop_gradient(u);  qI = RoPE(ū WqI) (H_I x d_I),  kI = RoPE(ū WkI) (d_I),  w = ū WwI (H_I)
//   I_ts = sum_j w_tj ReLU(qI_tj . kI_s) / sqrt(d_I)              op_dsa_index_scores
//   Sel_t = top-k of I_t over s <= t (ties: later position)         dsa_topk
//   o_t = softmax over Sel_t of q_t . k_s / sqrt(dk), times v       op_sparse_attention
// With topk >= T every position is selected and the dense op_attention runs.
// Decoding keeps the KV cache plus the indexer keys kI (in the GPU's memory
// for a GPU cache).
// Modes (attn_dsa.h): DSA_SPARSE as above; DSA_DISTILL dense attention plus
// the KL over all s <= t; DSA_SPARSE_KL sparse attention plus the KL over Sel_t.
// Documents (docs.h): the attention, the indexer's candidates (and so Sel_t),
// the target and the KL stay inside each document, s in [lo(t), t], with RoPE
// positions (of q, k, qI, kI) restarting at every document, as in `attn`.
// In decoding, a reset row indexes and attends from its document's first slot.
// On a GPU tape (tp->device) the same steps run on the device, through its
// DeviceKernels (device.h): the selection (B, T, K), the targets and the
// kept mass never leave it (dsa_attend).
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attn_dsa.h"
#include "attn_kernel.h"
#include "attn_layer.h"
#include "device.h"
#include "docs.h"
#include "dsa_kernel.h"
#include "dsa_sel_kl.h"
#include "mixer_common.h"

struct DsaCache;

typedef struct DsaLayer {
    AttnLayer attn;
    Tensor *wq_idx;     // (D, HI*dI)
    Tensor *wk_idx;     // (D, dI)
    Tensor *ww_idx;     // (D, HI)
    DsaMode mode;
    Tensor *last_kl;    // (1) on the last forward's tape, or NULL
    double last_mass;
    double *mass_dev;   // (1) GPU memory: the last GPU DSA_DISTILL forward's mass, or NULL (never ran)
    bool mass_on_dev;   // the last DSA_DISTILL forward ran on the GPU: *mass_dev is the figure
    // attn_dsa_record / attn_dsa_replay (attn_dsa.h): the caller's buffers.
    int *rec;           // (rec_rows, topk), or NULL
    int rec_rows;
    // While dsa_prefill runs a fresh window through dsa_forward: the cache its
    // keys, values and indexer keys go to, at slots fill->kv.pos... (else NULL).
    struct DsaCache *fill;
    const int *replay;  // (replay_rows, topk), or NULL
    int replay_rows;
    DsaReplayReport report;
} DsaLayer;

// In the memory of kv.dev (on the GPU: kI, scores and sel; cand is NULL).
typedef struct DsaCache {
    KVCache kv;
    real *kI;           // (B, max_T, dI) indexer keys after RoPE
    real *scores;       // CPU: (max_T) one query's indexer scores; GPU: (B, max_T), every row's
    int *sel;           // (B, topk)
    void *cand;         // CPU: DSA_TOPK_WORK(max_T) bytes of top-k scratch
} DsaCache;

static const char *dsa_check(const MixerConfig *c, char *why, size_t n) {
    const char *key = attn_layer_check(c, why, n);
    if (key) return key;
    const struct { const char *key; int value; } pos[] = {
        {"index_heads", c->index_heads}, {"index_dim", c->index_dim}, {"topk", c->topk}};
    for (size_t i = 0; i < sizeof pos / sizeof pos[0]; i++)
        if (pos[i].value <= 0) {
            snprintf(why, n, "attn_dsa: %s = %d must be positive", pos[i].key, pos[i].value);
            return pos[i].key;
        }
    if (c->index_dim % 2 != 0) {
        snprintf(why, n, "the DSA indexer's RoPE rotates pairs of dimensions: index_dim = %d must be even",
                 c->index_dim);
        return "index_dim";
    }
    return NULL;
}

static void dsa_create(Mixer *m, ParamStore *ps, const char *prefix) {
    const MixerConfig *c = &m->cfg;
    DsaLayer *L = xcalloc(1, sizeof *L);
    attn_layer_create(&L->attn, ps, prefix, c);
    double std = 1.0 / sqrt(c->d_model);
    L->wq_idx = param_linear(ps, prefix, "wq_idx", c->d_model, c->index_heads * c->index_dim, std);
    L->wk_idx = param_linear(ps, prefix, "wk_idx", c->d_model, c->index_dim, std);
    L->ww_idx = param_linear(ps, prefix, "ww_idx", c->d_model, c->index_heads, std);
    m->impl = L;
}

static void dsa_destroy(Mixer *m) {
    DsaLayer *L = m->impl;
    if (L && L->mass_dev) dev_free(DEVICE_CUDA, L->mass_dev);
    free(L);
}

// The same data, cut from the graph: the indexer never moves the main model.
static Tensor *stop_gradient(Tape *tp, Tensor *u) {
    Tensor *d = tape_alloc(tp, sizeof *d);
    *d = *u;
    d->requires_grad = false;
    d->grad = NULL;
    d->flags &= ~TENSOR_PARAM;
    return d;
}

// RoPE at pos (B, T) or, when NULL, at pos0 + t.
static Tensor *rope_at(Tape *tp, Tensor *x, int hd, int pos0, const int *pos, double base) {
    return pos ? op_rope_pos(tp, x, hd, pos, base) : op_rope(tp, x, hd, pos0, base);
}

// ---------------------------------------------------------------- record and replay (attn_dsa.h)

// Slots slot0 .. slot0+n-1 of the record (a cache of B = 1 row) <- n
// selection rows sel in dev's memory, each pick plus `shift` (a fresh
// window selects by its own positions 0..: its slots are shift + those).
static void record_rows(const DsaLayer *L, int B, int K, int slot0, const int *sel, int n, Device dev, int shift) {
    ASSERT(B == 1, "attn_dsa record: one row (got %d)", B);
    ASSERT(slot0 >= 0 && slot0 + n <= L->rec_rows, "attn_dsa record: slots %d .. %d of a record of %d", slot0,
           slot0 + n - 1, L->rec_rows);
    int *r = L->rec + (int64_t)slot0 * K;
    dev_to_host(r, sel, (size_t)n * K * sizeof(int), dev);
    for (int64_t i = 0; shift && i < (int64_t)n * K; i++) r[i] += r[i] < 0 ? 0 : shift;
}

// Query t's indexer score of key k in double, and into *mag the size of its
// rounding: c sum_j |w_j| sum_i |qI_ji kI_i|.
static double score_of(const real *q, const real *w, const real *k, int HI, int dI, double *mag) {
    double acc = 0, m = 0, c = 1.0 / sqrt((double)dI);
    for (int j = 0; j < HI; j++) {
        double z = 0, za = 0;
        for (int i = 0; i < dI; i++) {
            z += (double)q[j * dI + i] * k[i];
            za += fabs((double)q[j * dI + i] * k[i]);
        }
        if (z > 0) acc += w[j] * z;
        m += fabs((double)w[j]) * za;
    }
    *mag = c * m;
    return c * acc;
}

// The relative score gap of recorded picks r against the forward's own o
// (both ascending, -1 padded, K) for query t whose candidates are [lo, t]:
// INFINITY when r is not a valid selection (a key out of range, out of
// order, or a different count than o's).
static double pick_gap(const int *r, const int *o, int K, int t, int lo, const real *q, const real *w,
                       const real *kI, int HI, int dI) {
    int nr = 0, no = 0;
    for (int i = 0; i < K; i++) {
        if (r[i] >= 0) {
            if (r[i] < lo || r[i] > t || (i > 0 && r[i] <= r[i - 1]) || nr != i) return INFINITY;
            nr++;
        } else if (r[i] != -1) return INFINITY;
        no += o[i] >= 0;
    }
    if (nr != no) return INFINITY;
    double best_missed = -INFINITY, worst_taken = INFINITY, mag = 0, m;
    int i = 0, j = 0;   // a merge of the two ascending lists
    while (i < nr || j < no) {
        if (j >= no || (i < nr && r[i] < o[j])) {   // a recorded pick the forward did not make
            worst_taken = fmin(worst_taken, score_of(q, w, kI + (int64_t)r[i++] * dI, HI, dI, &m));
            mag = fmax(mag, m);
        } else if (i >= nr || o[j] < r[i]) {        // the forward's own pick the record lacks
            best_missed = fmax(best_missed, score_of(q, w, kI + (int64_t)o[j++] * dI, HI, dI, &m));
            mag = fmax(mag, m);
        } else i++, j++;
    }
    double gap = best_missed - worst_taken;
    return gap <= 0 ? 0 : gap / (mag > 0 ? mag : 1);
}

// After a sparse forward's own selection sel (1, T, K; in the tape's device
// memory): a prefill window records it, a check's replay puts the recorded
// rows in its place and reports how they differ.
static void record_or_replay(Tape *tp, DsaLayer *L, const MixerConfig *c, int *sel, Tensor *qI, Tensor *kI,
                             Tensor *w, const int *doc_start, int B, int T, int K) {
    bool record = L->rec && L->fill, replay = L->replay && !L->fill;
    // K < topk (DSA_SPARSE_KL over T <= topk positions): every candidate is picked, as decoding picks them.
    if ((!record && !replay) || K != c->topk) return;
    if (record) {   // the window's positions are its own (0 ..): the cache's slots from its pos on
        record_rows(L, B, K, L->fill->kv.pos, sel, T, tp->device, L->fill->kv.pos);
        return;
    }
    ASSERT(B == 1, "attn_dsa replay: one row (got %d)", B);
    ASSERT(T <= L->replay_rows, "attn_dsa replay: %d positions, %d recorded", T, L->replay_rows);
    size_t bytes = (size_t)T * K * sizeof(int);
    bool dev = tp->device != DEVICE_CPU;
    int *own = dev ? xmalloc(bytes) : sel;
    if (dev) dev_to_host(own, sel, bytes, tp->device);
    const int *first = docs_first(tp, doc_start, B, T);
    int HI = c->index_heads, dI = c->index_dim;
    real *hq = NULL, *hk = NULL, *hw = NULL;   // the indexer's inputs on the host, read once a row differs
    bool changed = false;
    for (int t = 0; t < T; t++) {
        const int *r = L->replay + (int64_t)t * K;
        int *o = own + (int64_t)t * K;
        if (r[0] == DSA_REC_NONE) continue;
        L->report.rows++;
        if (!memcmp(r, o, (size_t)K * sizeof(int))) continue;
        L->report.differ++;
        if (!hq) {
            hq = dev ? xmalloc(qI->numel * sizeof(real)) : qI->data;
            hk = dev ? xmalloc(kI->numel * sizeof(real)) : kI->data;
            hw = dev ? xmalloc(w->numel * sizeof(real)) : w->data;
            if (dev) {
                dev_to_host(hq, qI->data, qI->numel * sizeof(real), tp->device);
                dev_to_host(hk, kI->data, kI->numel * sizeof(real), tp->device);
                dev_to_host(hw, w->data, w->numel * sizeof(real), tp->device);
            }
        }
        int lo = first && first[t] > 0 ? first[t] : 0;
        double g = pick_gap(r, o, K, t, lo, hq + (int64_t)t * HI * dI, hw + (int64_t)t * HI, hk, HI, dI);
        if (L->report.differ == 1 || g > L->report.worst) {   // (g >= 0)
            L->report.worst = g;
            L->report.worst_row = t;
        }
        if (isinf(g)) continue;   // not a selection: the forward keeps its own row
        memcpy(o, r, (size_t)K * sizeof(int));
        changed = true;
    }
    if (dev) {
        if (changed) dev_from_host(sel, tp->device, own, bytes);
        free(own);
        if (hq) free(hq), free(hk), free(hw);
    }
}

static void put_index_keys(Tape *tp, const Mixer *m, struct DsaCache *dc, Tensor *u);
static void store_index_keys(struct DsaCache *dc, const Tensor *kI);

// The selection and the attention: dsa_forward's steps after the
// projections, on the tape's device (there the selection, the targets and
// the kept mass stay). Pops the no-grad mode DSA_SPARSE pushed, as
// dsa_forward does.
static Tensor *dsa_attend(Tape *tp, DsaLayer *L, const MixerConfig *c, Tensor *q, Tensor *k, Tensor *v, Tensor *qI,
                          Tensor *kI, Tensor *w, const int *doc_start, int B, int T, int K) {
    const DeviceKernels *dk = device_kernels(tp->device);
    int H = c->n_heads;
    double scale = 1.0 / sqrt(c->d_k);
    const int *docs = dk->dsa_docs(tp, doc_start, B, T);
    int *sel = tape_dalloc(tp, (size_t)B * T * K * sizeof(int));
    Tensor *o;
    if (L->mode == DSA_DISTILL) {   // the KL needs every score and the dense target: O(T^2) memory
        Tensor *Isc = op_dsa_index_scores(tp, qI, kI, w, c->index_heads, doc_start);
        dk->dsa_topk(sel, Isc->data, B, T, K, docs);
        o = op_attention(tp, q, k, v, H, scale, doc_start);
        Tensor *p = tape_tensorv(tp, 3, B, T, T);   // the target: a constant
        dk->dsa_attn_target(p->data, q->data, k->data, B, T, H, c->d_k, scale, docs);
        L->last_kl = op_dsa_kl(tp, Isc, p, doc_start);
        L->mass_on_dev = tp->device != DEVICE_CPU;   // then read back only when asked (attn_dsa_last_mass)
        if (L->mass_on_dev && !L->mass_dev) L->mass_dev = dev_alloc(tp->device, sizeof(double));
        dk->dsa_selected_mass(L->mass_on_dev ? L->mass_dev : &L->last_mass, p->data, sel, B, T, K);
    } else {   // scores and selection tile by tile: no (B, T, T) matrix
        dk->dsa_index_select(tp, sel, qI->data, kI->data, w->data, B, T, c->index_heads, c->index_dim, K, docs);
        record_or_replay(tp, L, c, sel, qI, kI, w, doc_start, B, T, K);
        if (L->mode == DSA_SPARSE) tape_no_grad_pop(tp);
        o = op_sparse_attention(tp, q, k, v, sel, K, H, scale);
        if (L->mode == DSA_SPARSE_KL) {   // the KL over the selection: O(T K) memory
            Tensor *p = tape_tensorv(tp, 3, B, T, K);
            dk->dsa_sparse_target(p->data, q->data, k->data, sel, B, T, K, H, c->d_k, scale);
            L->last_kl = op_dsa_sel_kl(tp, qI, kI, w, sel, K, p, c->index_heads);
        }
    }
    return o;
}

static Tensor *dsa_forward(Tape *tp, Mixer *m, Tensor *u, const int *doc_start, Tensor *s_in, Tensor **s_out) {
    const MixerConfig *c = &m->cfg;
    DsaLayer *L = m->impl;
    ASSERT(s_in == NULL, "attn_dsa: has no recurrent state, s_in must be NULL (got %s)", SHAPE(s_in));
    ASSERT(u->ndim == 3, "attn_dsa: u %s must be (B, T, D)", SHAPE(u));
    if (s_out) *s_out = NULL;
    L->last_kl = NULL;
    int B = u->shape[0], T = u->shape[1], H = c->n_heads, K = imin(c->topk, T);
    const int *pos = attn_doc_positions(tp, doc_start, B, T);   // NULL: no boundary
    if (!pos) doc_start = NULL;
    Tensor *q, *k, *v;
    attn_layer_qkv(tp, &L->attn, c, u, 0, pos, &q, &k, &v);
    if (L->fill) kvcache_put(&L->fill->kv, k, v);   // a fresh prefill window: the rows the steps would cache
    double scale = 1.0 / sqrt(c->d_k);
    Tensor *o;
    if (L->mode == DSA_SPARSE && c->topk >= T) {   // everything is selected: the dense kernel is the same math
        if (L->fill) put_index_keys(tp, m, L->fill, u);
        return attn_layer_out(tp, &L->attn, op_attention(tp, q, k, v, H, scale, doc_start), u);
    }
    // The indexer only needs a graph when its KL will be back-propagated.
    if (L->mode == DSA_SPARSE) tape_no_grad_push(tp);
    Tensor *ub = stop_gradient(tp, u);
    Tensor *qI = rope_at(tp, op_matmul(tp, ub, L->wq_idx, false, false), c->index_dim, 0, pos, c->rope_base);
    Tensor *kI = rope_at(tp, op_matmul(tp, ub, L->wk_idx, false, false), c->index_dim, 0, pos, c->rope_base);
    Tensor *w = op_matmul(tp, ub, L->ww_idx, false, false);
    if (L->fill) store_index_keys(L->fill, kI);
    o = dsa_attend(tp, L, c, q, k, v, qI, kI, w, doc_start, B, T, K);
    return attn_layer_out(tp, &L->attn, o, u);
}

static void *dsa_cache_new(const Mixer *m, int B, int max_T, Device dev) {
    const MixerConfig *c = &m->cfg;
    if (dev != DEVICE_CPU) {   // the same buffers in the GPU's memory (dsa_step's device path)
        DsaCache *dc = xcalloc(1, sizeof *dc);
        kvcache_init(&dc->kv, c, B, max_T, dev);
        dc->kI = dev_alloc(dev, (size_t)B * max_T * c->index_dim * sizeof(real));
        dc->scores = dev_alloc(dev, (size_t)B * max_T * sizeof(real));
        dc->sel = dev_alloc(dev, (size_t)B * c->topk * sizeof(int));
        return dc;
    }
    DsaCache *dc = xcalloc(1, sizeof *dc);
    kvcache_init(&dc->kv, c, B, max_T, DEVICE_CPU);
    dc->kI = xmalloc((size_t)B * max_T * c->index_dim * sizeof(real));
    dc->scores = xmalloc((size_t)max_T * sizeof(real));
    dc->sel = xmalloc((size_t)B * c->topk * sizeof(int));
    dc->cand = xmalloc(DSA_TOPK_WORK(max_T));
    return dc;
}

static void dsa_cache_free(void *cache) {
    DsaCache *dc = cache;
    if (!dc) return;
    if (dc->kv.dev != DEVICE_CPU) {
        Device dev = dc->kv.dev;
        kvcache_free(&dc->kv);
        dev_free(dev, dc->kI);
        dev_free(dev, dc->scores);
        dev_free(dev, dc->sel);
        free(dc);
        return;
    }
    kvcache_free(&dc->kv);
    free(dc->kI);
    free(dc->scores);
    free(dc->sel);
    free(dc->cand);
    free(dc);
}

// On either device the same steps; a GPU's indexer scores, top-k and
// sparse attention take every row at once.
static Tensor *dsa_step(Tape *tp, Mixer *m, void *cache, Tensor *u) {
    const MixerConfig *c = &m->cfg;
    const DsaLayer *L = m->impl;
    DsaCache *dc = cache;
    KVCache *kv = &dc->kv;
    int B = kv->B, HI = c->index_heads, dI = c->index_dim, K = c->topk;
    ASSERT(u->ndim == 3 && u->shape[0] == B && u->shape[1] == 1 && u->shape[2] == c->d_model,
           "attn_dsa step: u %s must be (%d, 1, %d)", SHAPE(u), B, c->d_model);
    ASSERT(kv->pos < kv->max_T, "attn_dsa step: the KV cache is full (%d positions)", kv->max_T);
    ASSERT(!tape_grad_enabled(tp), "attn_dsa step: decoding runs in no-grad mode (tape_no_grad_push first)");
    ASSERT(kv->dev == tp->device, "attn_dsa step: a %s cache on a %s tape", device_name(kv->dev),
           device_name(tp->device));
    const DeviceKernels *dk = device_kernels(tp->device);
    int pos = kv->pos;
    double scale = 1.0 / sqrt(c->d_k);
    const int *rp = kvcache_positions(tp, kv, 1);   // RoPE positions of reset rows (NULL: pos)
    Tensor *q, *k, *v;
    attn_layer_qkv(tp, &L->attn, c, u, pos, rp, &q, &k, &v);
    kvcache_put(kv, k, v);
    store_index_keys(dc, rope_at(tp, op_matmul(tp, u, L->wk_idx, false, false), dI, pos, rp, c->rope_base));
    kv->pos++;
    Tensor *o = tape_tensorv(tp, 3, B, 1, c->n_heads * c->d_v);
    if (L->mode == DSA_DISTILL) {   // the main model as trained: dense attention over the cache
        dk->attn_decode(tp, o->data, q->data, kv->k, kv->v, B, kv->max_T, kv->pos, kv->start, kv->start_dev,
                        c->n_heads, c->d_k, c->d_v, scale);
        return attn_layer_out(tp, &L->attn, o, u);
    }
    Tensor *qI = rope_at(tp, op_matmul(tp, u, L->wq_idx, false, false), dI, pos, rp, c->rope_base);
    Tensor *w = op_matmul(tp, u, L->ww_idx, false, false);
    dk->dsa_decode_select(tp, dc->sel, dc->scores, qI->data, w->data, dc->kI, B, kv->max_T, kv->pos, kv->start,
                          kv->start_dev, HI, dI, K, dc->cand);
    dk->dsa_decode_sparse(o->data, q->data, kv->k, kv->v, B, kv->max_T, dc->sel, K, c->n_heads, c->d_k, c->d_v, scale);
    if (L->rec) record_rows(L, B, K, pos, dc->sel, 1, kv->dev, 0);
    return attn_layer_out(tp, &L->attn, o, u);
}

static void dsa_cache_reset(const Mixer *m, void *cache, int b) { kvcache_reset(&((DsaCache *)cache)->kv, b); }

static DsaLayer *dsa_impl(const Mixer *m, const char *fn) {
    ASSERT(strcmp(m->kind->name, "attn_dsa") == 0, "%s: mixer is '%s', not attn_dsa", fn, m->kind->name);
    return m->impl;
}

void attn_dsa_set_mode(Mixer *m, DsaMode mode) {
    ASSERT(mode >= 0 && mode < DSA_MODE_COUNT, "attn_dsa_set_mode: mode %d", (int)mode);
    dsa_impl(m, "attn_dsa_set_mode")->mode = mode;
}

DsaMode attn_dsa_mode(const Mixer *m) { return dsa_impl(m, "attn_dsa_mode")->mode; }

void attn_dsa_set_distill(Mixer *m, bool on) { attn_dsa_set_mode(m, on ? DSA_DISTILL : DSA_SPARSE); }

Tensor *attn_dsa_last_kl(const Mixer *m) { return dsa_impl(m, "attn_dsa_last_kl")->last_kl; }

double attn_dsa_last_mass(const Mixer *m) {
    const DsaLayer *L = dsa_impl(m, "attn_dsa_last_mass");
    if (!L->mass_on_dev) return L->last_mass;
    double v;   // the GPU's figure, read now (this waits for the stream)
    dev_to_host(&v, L->mass_dev, sizeof v, DEVICE_CUDA);
    return v;
}

void attn_dsa_indexer_params(const Mixer *m, Tensor *out[3]) {
    const DsaLayer *L = dsa_impl(m, "attn_dsa_indexer_params");
    out[0] = L->wq_idx;
    out[1] = L->wk_idx;
    out[2] = L->ww_idx;
}

void attn_dsa_record(Mixer *m, int *rec, int n_rows) {
    DsaLayer *L = dsa_impl(m, "attn_dsa_record");
    ASSERT(!rec || n_rows >= 0, "attn_dsa_record: %d rows", n_rows);
    L->rec = rec;
    L->rec_rows = rec ? n_rows : 0;
}

void attn_dsa_replay(Mixer *m, const int *rec, int n_rows) {
    DsaLayer *L = dsa_impl(m, "attn_dsa_replay");
    ASSERT(!rec || n_rows >= 0, "attn_dsa_replay: %d rows", n_rows);
    L->replay = rec;
    L->replay_rows = rec ? n_rows : 0;
    memset(&L->report, 0, sizeof L->report);
}

DsaReplayReport attn_dsa_replay_report(const Mixer *m) { return dsa_impl(m, "attn_dsa_replay_report")->report; }

// Rotated indexer keys kI (B, T0, dI) into the cache's slots pos...; the cache is not advanced.
static void store_index_keys(DsaCache *dc, const Tensor *kI) {
    KVCache *kv = &dc->kv;
    size_t w = (size_t)kI->shape[2] * sizeof(real), T0 = (size_t)kI->shape[1];
    dev_copy2d(kv->dev, (char *)dc->kI + (size_t)kv->pos * w, (size_t)kv->max_T * w, kI->data, T0 * w, T0 * w,
               (size_t)kv->B);
}

// The indexer keys of u (B, T0, D) into the cache's slots pos... (as the
// steps would rotate them); the cache is not advanced.
static void put_index_keys(Tape *tp, const Mixer *m, DsaCache *dc, Tensor *u) {
    const MixerConfig *c = &m->cfg;
    const DsaLayer *L = m->impl;
    KVCache *kv = &dc->kv;
    const int *rp = kvcache_positions(tp, kv, u->shape[1]);
    store_index_keys(dc, rope_at(tp, op_matmul(tp, u, L->wk_idx, false, false), c->index_dim, kv->pos, rp,
                                 c->rope_base));
}

void attn_cache_prefill(Tape *tp, const Mixer *m, void *cache, Tensor *u) {
    const MixerConfig *c = &m->cfg;
    bool dsa = strcmp(m->kind->name, "attn_dsa") == 0;
    ASSERT(dsa || strcmp(m->kind->name, "attn") == 0, "attn_cache_prefill: mixer is '%s'", m->kind->name);
    // Both caches start with a KVCache (attn's cache is one).
    KVCache *kv = dsa ? &((DsaCache *)cache)->kv : cache;
    int T0 = u->shape[1];
    ASSERT(u->ndim == 3 && u->shape[0] == kv->B && u->shape[2] == c->d_model && kv->pos + T0 <= kv->max_T,
           "attn_cache_prefill: u %s must be (%d, T0, %d) with T0 <= %d free positions", SHAPE(u), kv->B,
           c->d_model, kv->max_T - kv->pos);
    ASSERT(kv->dev == tp->device, "attn_cache_prefill: a %s cache on a %s tape", device_name(kv->dev),
           device_name(tp->device));
    tape_no_grad_push(tp);
    Tensor *q, *k, *v;
    const AttnLayer *A = dsa ? &((const DsaLayer *)m->impl)->attn : m->impl;
    attn_layer_qkv(tp, A, c, u, kv->pos, kvcache_positions(tp, kv, T0), &q, &k, &v);
    kvcache_put(kv, k, v);
    if (dsa) put_index_keys(tp, m, cache, u);
    kv->pos += T0;
    tape_no_grad_pop(tp);
}

// A sparse window after cached keys: every query of the window as its step
// would take it (its top-k by the indexer over its row's cached keys and
// the window's up to itself, then attention over those). On the CPU the
// scores by products (dsa_prefix_select) and the queries in parallel; on a
// GPU the decoding step's kernels over the window's queries at once.
static Tensor *sparse_after_cache(Tape *tp, Mixer *m, DsaCache *dc, Tensor *u) {
    const MixerConfig *c = &m->cfg;
    const DsaLayer *L = m->impl;
    KVCache *kv = &dc->kv;
    int B = kv->B, T0 = u->shape[1], H = c->n_heads, HI = c->index_heads, dI = c->index_dim, K = c->topk;
    int pos = kv->pos;
    const int *rp = kvcache_positions(tp, kv, T0);
    Tensor *q, *k, *v;
    attn_layer_qkv(tp, &L->attn, c, u, pos, rp, &q, &k, &v);
    kvcache_put(kv, k, v);
    put_index_keys(tp, m, dc, u);
    Tensor *qI = rope_at(tp, op_matmul(tp, u, L->wq_idx, false, false), dI, pos, rp, c->rope_base);
    Tensor *w = op_matmul(tp, u, L->ww_idx, false, false);
    Tensor *o = tape_tensorv(tp, 3, B, T0, H * c->d_v);
    const DeviceKernels *dk = device_kernels(tp->device);
    int *sel = tape_dalloc(tp, (size_t)B * T0 * K * sizeof(int));
    dk->dsa_prefix_select(tp, sel, qI->data, w->data, dc->kI, B, kv->max_T, pos, T0, kv->start, kv->start_dev, HI, dI,
                          K);
    dk->dsa_prefix_sparse(o->data, q->data, kv->k, kv->v, B, T0, kv->max_T, sel, K, H, c->d_k, c->d_v,
                          1.0 / sqrt(c->d_k));
    if (L->rec) record_rows(L, B, K, pos, sel, T0, tp->device, 0);
    return attn_layer_out(tp, &L->attn, o, u);
}

// MixerKind.prefill: the output the steps would give. They attend densely in
// DSA_DISTILL mode, and sparsely otherwise (DSA_SPARSE_KL too, without a KL):
// a fresh window runs the forward of that attention, without any KL, whose
// DSA_DISTILL target would be a (B, T0, T0) matrix, and which puts the
// window's keys, values and indexer keys in the cache as it makes them
// (DsaLayer.fill); a sparse window after cached keys goes to
// sparse_after_cache.
static Tensor *dsa_prefill(Tape *tp, Mixer *m, void *cache, Tensor *u) {
    const MixerConfig *c = &m->cfg;
    DsaLayer *L = m->impl;
    DsaCache *dc = cache;
    ASSERT(u->ndim == 3 && u->shape[0] == dc->kv.B && u->shape[2] == c->d_model,
           "attn_dsa prefill: u %s must be (%d, T, %d)", SHAPE(u), dc->kv.B, c->d_model);
    ASSERT(!tape_grad_enabled(tp), "attn_dsa prefill: runs in no-grad mode (tape_no_grad_push first)");
    ASSERT(dc->kv.dev == tp->device && dc->kv.pos + u->shape[1] <= dc->kv.max_T,
           "attn_dsa prefill: a %s cache on a %s tape, %d positions into %d free", device_name(dc->kv.dev),
           device_name(tp->device), u->shape[1], dc->kv.max_T - dc->kv.pos);
    Tensor *y;
    if (L->mode == DSA_DISTILL) {   // dense attention over the cache (keys and values put)
        y = attn_layer_prefill(tp, &L->attn, c, &dc->kv, u);
        put_index_keys(tp, m, dc, u);
    } else if (!kvcache_fresh(&dc->kv)) {
        y = sparse_after_cache(tp, m, dc, u);
    } else {
        DsaMode mode = L->mode;
        L->mode = DSA_SPARSE;
        L->fill = dc;   // the window's keys, values and indexer keys to the cache (and a record's slots)
        y = dsa_forward(tp, m, u, NULL, NULL, NULL);   // (dense when topk >= T0: every key is selected)
        L->fill = NULL;
        L->mode = mode;
    }
    dc->kv.pos += u->shape[1];
    return y;
}

const MixerKind MIXER_ATTN_DSA = {
    .name = "attn_dsa",
    .recurrent = false,
    .create = dsa_create,
    .forward = dsa_forward,
    .cache_new = dsa_cache_new,
    .cache_free = dsa_cache_free,
    .step = dsa_step,
    .cache_reset = dsa_cache_reset,
    .prefill = dsa_prefill,
    .destroy = dsa_destroy,
    .check = dsa_check,
};

#include "poseval.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *const CONTEXT_NAMES[POSEVAL_COUNT] = {"carry", "full", "window"};

const char *poseval_context_name(PosevalContext c) { return c >= 0 && c < POSEVAL_COUNT ? CONTEXT_NAMES[c] : "?"; }

int poseval_context_parse(const char *s) {
    for (int c = 0; c < POSEVAL_COUNT; c++)
        if (!strcmp(s, CONTEXT_NAMES[c])) return c;
    return -1;
}

bool poseval_all_recurrent(const LM *lm) {
    for (int l = 0; l < lm->cfg.n_layers; l++)
        if (!lm->blocks[l].mixer->kind->forward_carry) return false;
    return true;
}

// The widest row of any tensor a forward of `rows` positions makes, as
// lm_config_check (lm.h) counts it: rows x widest must stay within int32 elements.
static bool rows_fit(const LM *lm, int64_t rows) {
    const LMConfig *c = &lm->cfg;
    const MixerConfig *m = &c->mixer;
    int64_t widths[] = {c->d_model, c->d_ff, c->vocab_size, (int64_t)m->n_heads * m->d_k,
                        (int64_t)m->n_heads * m->d_v, (int64_t)m->index_heads * m->index_dim, m->topk};
    int64_t widest = 1;
    for (size_t i = 0; i < sizeof widths / sizeof widths[0]; i++)
        if (widths[i] > widest) widest = widths[i];
    return rows <= INT32_MAX / widest;
}

// -log softmax(row)[target], in double.
static double row_nll(const real *row, int V, int target) {
    double mx = row[0], z = 0;
    for (int v = 1; v < V; v++) mx = fmax(mx, (double)row[v]);
    for (int v = 0; v < V; v++) z += exp((double)row[v] - mx);
    return mx + log(z) - (double)row[target];
}

// nll of the targets tok[i0 + t + 1], t < T, from logits (T, V) of the
// inputs tok[i0 + t]; `want[t]` false leaves nll[i0 + t] alone.
static void score_rows(const real *logits, int V, const int *tok, const int *doc_start, int64_t i0, int T,
                       const bool *want, double *nll) {
    for (int t = 0; t < T; t++) {
        int64_t i = i0 + t;
        if (want && !want[t]) continue;
        nll[i] = doc_start && doc_start[i + 1] ? NAN : row_nll(logits + (int64_t)t * V, V, tok[i + 1]);
    }
}

// Copy flags [i0, i0 + T) of doc_start into dst; NULL when there are none.
static const int *slice_flags(int *dst, const int *doc_start, int64_t i0, int T) {
    if (!doc_start) return NULL;
    memcpy(dst, doc_start + i0, (size_t)T * sizeof(int));
    return dst;
}

// The tape the forwards run on, and where their logits are read: on the
// CPU the tensor itself, on a GPU a host copy in buf (grown to fit).
typedef struct Scorer {
    Tape tp;
    Device dev;
    real *buf;
    size_t cap;
} Scorer;

static const real *host_logits(Scorer *sc, const Tensor *logits) {
    if (sc->dev == DEVICE_CPU) return logits->data;
    size_t bytes = (size_t)logits->numel * sizeof(real);
    if (bytes > sc->cap) {
        free(sc->buf);
        sc->buf = xmalloc(bytes);
        sc->cap = bytes;
    }
    dev_to_host(sc->buf, logits->data, bytes, sc->dev);
    return sc->buf;
}

static void score_carry(LM *lm, Scorer *sc, const int *tok, const int *doc_start, int64_t m, int chunk, double *nll) {
    int V = lm->cfg.vocab_size;
    int *flags = doc_start ? xmalloc((size_t)chunk * sizeof(int)) : NULL;
    LMCache *carry = lm_cache_new_on(lm, 1, 1, sc->dev);
    for (int64_t i0 = 0; i0 < m; i0 += chunk) {
        int T = m - i0 < chunk ? (int)(m - i0) : chunk;
        Tensor *logits =
            lm_forward_carry(&sc->tp, lm, tok + i0, slice_flags(flags, doc_start, i0, T), 1, T, carry);
        score_rows(host_logits(sc, logits), V, tok, doc_start, i0, T, NULL, nll);
        tape_reset(&sc->tp);
    }
    lm_cache_free(lm, carry);
    free(flags);
}

static void score_full(LM *lm, Scorer *sc, const int *tok, const int *doc_start, int64_t m, double *nll) {
    Tensor *logits = lm_forward_docs(&sc->tp, lm, tok, doc_start, 1, (int)m, NULL, NULL);
    score_rows(host_logits(sc, logits), lm->cfg.vocab_size, tok, doc_start, 0, (int)m, NULL, nll);
    tape_reset(&sc->tp);
}

// Windows of W inputs starting at 0, S, 2S, ... (the last one moved back to
// end at input m - 1), B to a forward; each scores the inputs past the end
// of the windows before it.
static void score_window(LM *lm, Scorer *sc, const int *tok, const int *doc_start, int64_t m, int W, int S, int B,
                         double *nll) {
    if (W > m) W = (int)m;
    int V = lm->cfg.vocab_size;
    int *x = xmalloc((size_t)B * W * sizeof(int));
    int *flags = doc_start ? xmalloc((size_t)B * W * sizeof(int)) : NULL;
    bool *want = xmalloc((size_t)B * W * sizeof(bool));
    int64_t *starts = xmalloc((size_t)B * sizeof(int64_t));
    int64_t done = 0;   // inputs [0, done) are scored
    for (int64_t start = 0; done < m;) {
        int b = 0;
        for (; b < B && done < m; b++, start += S) {
            int64_t s = start + W > m ? m - W : start;
            starts[b] = s;
            memcpy(x + (int64_t)b * W, tok + s, (size_t)W * sizeof(int));
            if (flags) memcpy(flags + (int64_t)b * W, doc_start + s, (size_t)W * sizeof(int));
            for (int t = 0; t < W; t++) want[(int64_t)b * W + t] = s + t >= done;
            done = s + W;
        }
        const real *logits = host_logits(sc, lm_forward_docs(&sc->tp, lm, x, flags, b, W, NULL, NULL));
        for (int r = 0; r < b; r++)
            score_rows(logits + (int64_t)r * W * V, V, tok, doc_start, starts[r], W, want + (int64_t)r * W, nll);
        tape_reset(&sc->tp);
    }
    free(x);
    free(flags);
    free(want);
    free(starts);
}

Status poseval_score(LM *lm, const int *tok, const int *doc_start, int64_t n, const PosevalSpec *sp, double *nll,
                     int64_t *pos, Device dev) {
    int64_t m = n - 1;   // inputs, each with its target
    if (m < 1) return status_err("fewer than 2 tokens: nothing to score");
    switch (sp->context) {
    case POSEVAL_CARRY:
        if (!poseval_all_recurrent(lm))
            return status_err("context carry needs every layer recurrent (linear, mamba, mamba2, gdn, gdp, kda): "
                              "attention layers would see only their chunk; use full or window");
        if (sp->chunk < 1) return status_err("chunk %d: must be at least 1", sp->chunk);
        if (!rows_fit(lm, sp->chunk)) return status_err("chunk %d: too many rows for one forward", sp->chunk);
        break;
    case POSEVAL_FULL:
        if (m > INT32_MAX || !rows_fit(lm, m))
            return status_err("context full: %lld positions in one forward is more than this build's tensors "
                              "hold; cut the text (--seq) or use window",
                              (long long)m);
        break;
    case POSEVAL_WINDOW:
        if (sp->window < 1 || sp->stride < 1 || sp->stride > sp->window || sp->batch < 1)
            return status_err("window %d, stride %d, batch %d: need 1 <= stride <= window and batch >= 1",
                              sp->window, sp->stride, sp->batch);
        if (!rows_fit(lm, (int64_t)sp->batch * sp->window))
            return status_err("window %d x batch %d: too many rows for one forward", sp->window, sp->batch);
        break;
    default:
        return status_err("unknown context %d", (int)sp->context);
    }
    for (int64_t i = 0, begin = 0; i < m; i++) {
        if (doc_start && doc_start[i]) begin = i;
        pos[i] = i - begin;
    }
    Scorer sc = {.dev = dev};
    tape_init_on(&sc.tp, dev);
    tape_no_grad_push(&sc.tp);
    if (sp->context == POSEVAL_CARRY) score_carry(lm, &sc, tok, doc_start, m, sp->chunk, nll);
    else if (sp->context == POSEVAL_FULL) score_full(lm, &sc, tok, doc_start, m, nll);
    else score_window(lm, &sc, tok, doc_start, m, sp->window, sp->stride, sp->batch, nll);
    tape_no_grad_pop(&sc.tp);
    tape_free(&sc.tp);
    free(sc.buf);
    return status_ok();
}

void poseval_buckets(const double *nll, const int64_t *pos, const int *target_bytes, int64_t n, const int64_t *edges,
                     int n_edges, PosevalBucket *out) {
    for (int k = 0; k < n_edges; k++) {
        ASSERT(edges[k] > (k ? edges[k - 1] : 0), "poseval_buckets: edge %d (%lld) does not increase", k,
               (long long)edges[k]);
        out[k] = (PosevalBucket){.lo = k ? edges[k - 1] : 0, .hi = edges[k]};
    }
    for (int64_t i = 0; i < n; i++) {
        if (isnan(nll[i])) continue;
        // Binary search: the first edge past pos[i].
        int lo = 0, hi = n_edges;
        while (lo < hi) {
            int mid = (lo + hi) / 2;
            if (edges[mid] > pos[i]) hi = mid;
            else lo = mid + 1;
        }
        if (lo == n_edges) continue;
        PosevalBucket *b = &out[lo];
        b->nll += nll[i];
        b->tokens++;
        b->pos_sum += (double)pos[i];
        if (target_bytes) b->bytes += target_bytes[i];
    }
}

int poseval_default_edges(int64_t max_pos, int64_t *edges, int max_edges) {
    int k = 0;
    for (int64_t e = 256; k < max_edges; e *= 4) {
        edges[k++] = e;
        if (e > max_pos) break;
    }
    return k;
}

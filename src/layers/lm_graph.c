// lm_graph.c: lm_graph.h's micro-batch replayed from a CUDA graph.
#include "lm_graph.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void lm_graph_init(LMGraph *gr, Device d, bool on) {
    memset(gr, 0, sizeof *gr);
    gr->g = on ? dev_graph_new(d) : NULL;
    if (gr->g) {
        gr->loss_dev = dev_alloc(d, sizeof(real));
        dev_zero(d, gr->loss_dev, sizeof(real));
    }
}

void lm_graph_free(LMGraph *gr) {
    if (gr->g) {
        dev_graph_free(gr->g);
        dev_free(DEVICE_CUDA, gr->loss_dev);
    }
    free(gr->key_doc);
    free(gr->prev_doc);
    memset(gr, 0, sizeof *gr);
}

// The micro-batch's key; doc flags copied into *flags (grown to B*T).
static LMGraphKey key_of(const Tape *tp, const int *x, const int *y, const int *doc, int B, int T,
                         const LMCache *carry) {
    LMGraphKey k = {.B = B, .T = T, .docs = doc != NULL, .carry = carry, .x = x, .y = y};
    for (int64_t i = 0; i < (int64_t)B * T; i++) k.count += y[i] >= 0;
    k.block = arena_mark(&tp->data);
    return k;
}

static bool ids_in_range(const int *x, const int *y, int n, int V) {
    for (int i = 0; i < n; i++)
        if (x[i] < 0 || x[i] >= V || y[i] >= V) return false;
    return true;
}

static bool key_equal(const LMGraphKey *a, const int *a_doc, const LMGraphKey *b, const int *doc) {
    if (a->B != b->B || a->T != b->T || a->count != b->count || a->docs != b->docs ||
        !arena_mark_same(a->block, b->block) || a->carry != b->carry || a->x != b->x || a->y != b->y)
        return false;
    return !a->docs || !memcmp(a_doc, doc, (size_t)a->B * a->T * sizeof(int));
}

static void key_store(LMGraphKey *dst, int **dst_doc, const LMGraphKey *k, const int *doc) {
    *dst = *k;
    if (k->docs) {
        *dst_doc = xrealloc(*dst_doc, (size_t)k->B * k->T * sizeof(int));
        memcpy(*dst_doc, doc, (size_t)k->B * k->T * sizeof(int));
    }
}

static Tensor *loss_of(Tape *tp, LM *lm, const int *x, const int *y, const int *doc, int B, int T, LMCache *carry) {
    return carry ? lm_loss_carry(tp, lm, x, y, doc, B, T, carry, NULL) : lm_loss_docs(tp, lm, x, y, doc, B, T, NULL);
}

static double eager(Tape *tp, LM *lm, const int *x, const int *y, const int *doc, int B, int T, LMCache *carry) {
    Tensor *loss = loss_of(tp, lm, x, y, doc, B, T, carry);
    double v = tape_item(tp, loss);
    tape_backward(tp, loss);
    tape_reset(tp);
    return v;
}

static double replay(LMGraph *gr, const int *x, const int *y) {
    const void *in[2] = {x, y};
    dev_graph_launch(gr->g, in);
    real v;
    dev_to_host(&v, gr->loss_dev, sizeof v, DEVICE_CUDA);
    gr->replays++;
    return (double)v;
}

// Capture this micro-batch (nothing runs), then launch it. False: the
// capture failed; graphs are off and the caller runs it eagerly.
static bool capture(LMGraph *gr, Tape *tp, LM *lm, const int *x, const int *y, const int *doc, int B, int T,
                    LMCache *carry) {
    size_t bytes[2] = {(size_t)B * T * sizeof(int), (size_t)B * T * sizeof(int)};
    const void *in[2] = {x, y};
    dev_graph_begin(gr->g, in, bytes, 2);
    Tensor *loss = loss_of(tp, lm, x, y, doc, B, T, carry);
    dev_copy(DEVICE_CUDA, gr->loss_dev, loss->data, sizeof(real));
    tape_backward(tp, loss);
    char why[200];
    bool ok = dev_graph_end(gr->g, why, sizeof why);
    tape_reset(tp);
    // Every id and target must come from x and y at a replay: a copy of them
    // that was not traced would replay this micro-batch's.
    if (ok && dev_graph_traced(gr->g) < 2) {
        ok = false;
        snprintf(why, sizeof why, "the token ids and targets were not traced to the batch");
    }
    if (!ok) {
        gr->off = true;
        snprintf(gr->why, sizeof gr->why, "%s", why);
        if (!gr->quiet) fprintf(stderr, "train: cuda_graph: capture failed (%s); training on without graphs\n", why);
        return false;
    }
    gr->captures++;
    return true;
}

// ATTNLAB_CUDA_GRAPH_TRACE set (non-empty): a line on stderr before each
// micro-batch runs (how, and its key), and the GPU waited for after it, so
// that a kernel's fault is reported right after the line of its micro-batch.
static bool trace_on(void) {
    static int on = -1;
    if (on < 0) {
        const char *e = getenv("ATTNLAB_CUDA_GRAPH_TRACE");
        on = e && *e;
    }
    return on;
}

static void trace(const LMGraph *gr, const Tape *tp, const char *how, const int *doc, int B, int T) {
    if (!trace_on()) return;
    int flags = 0;
    for (int64_t i = 0; doc && i < (int64_t)B * T; i++) flags += doc[i] != 0;
    char arena[80] = "arena not settled";
    const ArenaBlock *b = arena_settled(&tp->data);
    if (b) snprintf(arena, sizeof arena, "arena block %llu at %p", (unsigned long long)b->serial, (void *)b->mem);
    // (a captured micro-batch counts as a capture and a replay)
    fprintf(stderr, "cuda_graph: micro-batch %lld: %s; B %d, T %d, %d document flag%s, %s\n",
            (long long)(gr->replays + gr->eager), how, B, T, flags, flags == 1 ? "" : "s", arena);
}

static double traced_end(Tape *tp, double loss) {
    if (trace_on()) dev_sync(tp->device);
    return loss;
}

double lm_graph_micro_batch(LMGraph *gr, Tape *tp, LM *lm, const int *x, const int *y, const int *doc, int B, int T,
                            LMCache *carry) {
    // (Every micro-batch of a graph run allocates alike: the capture's is
    // made in the block the eager ones settled.)
    tp->graphable = gr->g != NULL;
    if (!gr->g || gr->off) {
        trace(gr, tp, "eager (graphs off)", doc, B, T);
        gr->eager++;
        return traced_end(tp, eager(tp, lm, x, y, doc, B, T, carry));
    }
    LMGraphKey k = key_of(tp, x, y, doc, B, T, carry);
    // A replay skips the ops' checks of the ids and targets: an id outside
    // the vocabulary runs eagerly, where op_embedding stops with its message.
    if (gr->have_key && key_equal(&gr->key, gr->key_doc, &k, doc) && ids_in_range(x, y, B * T, lm->cfg.vocab_size)) {
        trace(gr, tp, "replay", doc, B, T);
        return traced_end(tp, replay(gr, x, y));
    }
    bool repeat = gr->have_prev && key_equal(&gr->prev, gr->prev_doc, &k, doc);
    key_store(&gr->prev, &gr->prev_doc, &k, doc);
    gr->have_prev = true;
    if (repeat) {
        trace(gr, tp, "capture, then replay", doc, B, T);
        gr->have_key = false;
        if (capture(gr, tp, lm, x, y, doc, B, T, carry)) {
            key_store(&gr->key, &gr->key_doc, &k, doc);
            gr->have_key = true;
            return traced_end(tp, replay(gr, x, y));
        }
    }
    trace(gr, tp, "eager", doc, B, T);
    gr->eager++;
    return traced_end(tp, eager(tp, lm, x, y, doc, B, T, carry));
}

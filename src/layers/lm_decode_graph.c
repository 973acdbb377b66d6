// lm_decode_graph.c: lm_decode_graph.h's decoding step from a CUDA graph.
#include "lm_decode_graph.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mixer.h"

const char *lm_decode_graph_refusal(const LM *lm, char *why, size_t n) {
    for (int l = 0; l < lm->cfg.n_layers; l++) {
        const MixerKind *k = lm->blocks[l].mixer->kind;
        if (k->recurrent || (k->step_replayable && k->step_advance)) continue;
        snprintf(why, n,
                 "layer %d is %s: its step writes and reads its cache at the cache's length, a host value a graph "
                 "would keep from the capture",
                 l, k->name);
        return why;
    }
    return NULL;
}

// Why c's steps cannot be replayed now (a layer's cache that keeps its
// length on the host: attn on a cache too long for its graph's grid), NULL
// when they can.
static const char *cache_refusal(const LM *lm, const LMCache *c, char *why, size_t n) {
    for (int l = 0; l < lm->cfg.n_layers; l++) {
        const MixerKind *k = lm->blocks[l].mixer->kind;
        if (!k->step_replayable || k->step_replayable(c->mixer[l])) continue;
        snprintf(why, n, "layer %d (%s): its cache of %d positions is read from the host", l, k->name, c->max_T);
        return why;
    }
    return NULL;
}

// The host's share of the steps of every layer's cache: delta steps on.
static void advance(const LM *lm, LMCache *c, int delta) {
    c->pos += delta;
    for (int l = 0; l < lm->cfg.n_layers; l++) {
        const MixerKind *k = lm->blocks[l].mixer->kind;
        if (k->step_advance) k->step_advance(c->mixer[l], delta);
    }
}

void lm_decode_graph_init(LMDecodeGraph *dg, const LM *lm, Device d, bool on) {
    memset(dg, 0, sizeof *dg);
    char why[256];
    if (!on || lm_decode_graph_refusal(lm, why, sizeof why)) return;
    dg->g = dev_graph_new(d);
}

void lm_decode_graph_free(LMDecodeGraph *dg) {
    if (dg->g) dev_graph_free(dg->g);
    free(dg->tok);
    memset(dg, 0, sizeof *dg);
}

static void eager(LMDecodeGraph *dg, Tape *tp, LM *lm, LMCache *c, const int *tokens, real *logits) {
    Tensor *lg = lm_step(tp, lm, c, tokens);
    dev_to_host(logits, lg->data, (size_t)lg->numel * sizeof(real), tp->device);   // (before the reset frees it)
    tape_reset(tp);
    dg->eager++;
}

static void set_tokens(LMDecodeGraph *dg, const int *tokens, int B) {
    if (dg->B != B) {
        dg->tok = xrealloc(dg->tok, (size_t)B * sizeof(int));
        dg->B = B;
    }
    memcpy(dg->tok, tokens, (size_t)B * sizeof(int));
}

// Capture this step (nothing runs); false when the capture failed (graphs
// are then off, the cache as before the step).
static bool capture(LMDecodeGraph *dg, Tape *tp, LM *lm, LMCache *c) {
    const void *in[1] = {dg->tok};
    size_t bytes[1] = {(size_t)c->B * sizeof(int)};
    char why[200];
    if (cache_refusal(lm, c, why, sizeof why)) {
        dg->off = true;
        snprintf(dg->why, sizeof dg->why, "%s", why);
        if (!dg->quiet) fprintf(stderr, "generate: cuda_graph: %s; decoding without graphs\n", why);
        return false;
    }
    dev_graph_begin(dg->g, in, bytes, 1);
    Tensor *lg = lm_step(tp, lm, c, dg->tok);
    bool ok = dev_graph_end(dg->g, why, sizeof why);
    ArenaMark block = arena_mark(&tp->data);
    tape_reset(tp);
    advance(lm, c, -1);   // (nothing ran: the step's counts go with the launch)
    // The ids must come from tok at a replay, and every address from the block the key names.
    if (ok && dev_graph_traced(dg->g) < 1) {
        ok = false;
        snprintf(why, sizeof why, "the token ids were not traced to the step's input");
    } else if (ok && !arena_mark_same(block, dg->prev)) {
        ok = false;
        snprintf(why, sizeof why, "the tape's arena grew while capturing");
    }
    if (!ok) {
        dg->off = true;
        snprintf(dg->why, sizeof dg->why, "%s", why);
        if (!dg->quiet) fprintf(stderr, "generate: cuda_graph: capture failed (%s); decoding on without graphs\n", why);
        return false;
    }
    dg->logits = lg->data;
    dg->block = block;
    dg->cache = c;
    dg->captures++;
    return true;
}

static void replay(LMDecodeGraph *dg, const LM *lm, LMCache *c, Device d, real *logits) {
    ASSERT(c->pos < c->max_T, "lm_step: the cache holds %d positions and is full", c->max_T);
    const void *in[1] = {dg->tok};
    dev_graph_launch(dg->g, in);
    dev_to_host(logits, dg->logits, (size_t)c->B * lm->cfg.vocab_size * sizeof(real), d);   // (the captured block)
    advance(lm, c, 1);
    dg->replays++;
}

static bool ids_in_range(const int *x, int n, int V) {
    for (int i = 0; i < n; i++)
        if (x[i] < 0 || x[i] >= V) return false;
    return true;
}

void lm_decode_graph_step(LMDecodeGraph *dg, Tape *tp, LM *lm, LMCache *c, const int *tokens, real *logits) {
    tp->graphable = dg->g != NULL;
    int V = lm->cfg.vocab_size;
    // An id outside the vocabulary runs eagerly, where op_embedding stops with its message.
    if (!dg->g || dg->off || !ids_in_range(tokens, c->B, V)) {
        eager(dg, tp, lm, c, tokens, logits);
        return;
    }
    ArenaMark block = arena_mark(&tp->data);
    if (dg->logits && arena_mark_same(block, dg->block) && c == dg->cache && c->B == dg->B) {
        set_tokens(dg, tokens, c->B);
        replay(dg, lm, c, tp->device, logits);
        return;
    }
    dg->logits = NULL;
    // Settled: the same block two steps in a row.
    if (arena_mark_same(block, dg->prev) && c->pos < c->max_T) {
        set_tokens(dg, tokens, c->B);
        if (capture(dg, tp, lm, c)) {
            replay(dg, lm, c, tp->device, logits);
            return;
        }
    }
    dg->prev = block;
    eager(dg, tp, lm, c, tokens, logits);
}

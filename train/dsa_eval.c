#include "dsa_eval.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runlog.h"

void dsa_eval_run(Tape *tp, LM *lm, const Batcher *bt, int n_batches, int *x, int *y, int *doc, DsaMode restore,
                  DsaEval *out) {
    memset(out, 0, sizeof *out);
    if (!batcher_has_flags(bt)) doc = NULL;
    tape_no_grad_push(tp);
    for (int i = 0; i < n_batches; i++) {
        batcher_val(bt, i, x, y, doc);
        lm_set_dsa_mode(lm, DSA_DISTILL);
        Tensor *loss = lm_loss_docs(tp, lm, x, y, doc, batcher_share(bt), bt->T, NULL);
        out->val_dense += tape_item(tp, loss);   // (the tape's device: a GPU run reads the scalars back)
        out->kl += lm->dsa_kl ? tape_item(tp, lm->dsa_kl) : NAN;
        out->mass += lm_dsa_mass(lm);
        tape_reset(tp);
        lm_set_dsa_mode(lm, DSA_SPARSE);
        loss = lm_loss_docs(tp, lm, x, y, doc, batcher_share(bt), bt->T, NULL);
        out->val_sparse += tape_item(tp, loss);
        tape_reset(tp);
    }
    tape_no_grad_pop(tp);
    lm_set_dsa_mode(lm, restore);
    if (n_batches > 0) {
        out->kl /= n_batches;
        out->mass /= n_batches;
        out->val_dense /= n_batches;
        out->val_sparse /= n_batches;
    }
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

// Seconds for `steps` tokens; on a GPU the last token's logits are read back
// (a copy to the host waits for the stream), as generate reads each token's.
static double time_steps(Tape *tp, LM *lm, LMCache *c, Rng *r, int steps) {
    double t0 = runlog_now();
    for (int i = 0; i < steps; i++) {
        int tok = (int)rng_below(r, (uint64_t)lm->cfg.vocab_size);
        Tensor *lg = lm_step(tp, lm, c, &tok);
        if (i == steps - 1 && c->device != DEVICE_CPU) {
            real x;
            dev_to_host(&x, lg->data, sizeof x, c->device);
        }
        tape_reset(tp);
    }
    return runlog_now() - t0;
}

void dsa_eval_decode_speed(LM *lm, Device dev, int ctx, int steps, uint64_t seed, DsaMode restore,
                           double *dense_tok_s, double *sparse_tok_s) {
    // One cache, prefilled once (attn and attn_dsa layers: random keys and
    // values; decode time does not depend on their contents beyond the
    // top-k's bookkeeping). Then rounds of `steps` tokens, dense and sparse
    // alternating, after a warm-up: the medians of the rounds, so a burst of
    // other work on the machine moves one round, not the figure.
    const int warm = 8;
    int D = lm->cfg.d_model;
    LMCache *c = lm_cache_new_on(lm, 1, ctx + warm + 2 * DSA_DECODE_ROUNDS * steps, dev);
    Tape tp;
    tape_init_on(&tp, dev);
    tape_no_grad_push(&tp);
    Rng r;
    rng_seed(&r, seed);
    real *x = xmalloc((size_t)ctx * D * sizeof(real));
    for (int l = 0; l < lm->cfg.n_layers; l++) {
        const Mixer *m = lm->blocks[l].mixer;
        if (strcmp(m->kind->name, "attn") != 0 && strcmp(m->kind->name, "attn_dsa") != 0) continue;
        for (int64_t i = 0; i < (int64_t)ctx * D; i++) x[i] = (real)rng_normal(&r);
        attn_cache_prefill(&tp, m, c->mixer[l], tape_tensor_copy(&tp, 3, (int[]){1, ctx, D}, x));
        tape_reset(&tp);
    }
    free(x);
    c->pos = ctx;
    lm_set_dsa_mode(lm, DSA_DISTILL);
    time_steps(&tp, lm, c, &r, warm / 2);
    lm_set_dsa_mode(lm, DSA_SPARSE);
    time_steps(&tp, lm, c, &r, warm / 2);
    double dense[DSA_DECODE_ROUNDS], sparse[DSA_DECODE_ROUNDS];
    for (int k = 0; k < DSA_DECODE_ROUNDS; k++) {
        lm_set_dsa_mode(lm, DSA_DISTILL);   // every attn_dsa layer attends to the whole cache
        dense[k] = steps / time_steps(&tp, lm, c, &r, steps);
        lm_set_dsa_mode(lm, DSA_SPARSE);    // to its top-k
        sparse[k] = steps / time_steps(&tp, lm, c, &r, steps);
    }
    qsort(dense, DSA_DECODE_ROUNDS, sizeof *dense, cmp_double);
    qsort(sparse, DSA_DECODE_ROUNDS, sizeof *sparse, cmp_double);
    *dense_tok_s = dense[DSA_DECODE_ROUNDS / 2];
    *sparse_tok_s = sparse[DSA_DECODE_ROUNDS / 2];
    lm_set_dsa_mode(lm, restore);
    tape_free(&tp);
    lm_cache_free(lm, c);
}

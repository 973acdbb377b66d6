#include "dsa_eval.h"

#include <math.h>
#include <string.h>

#include "runlog.h"

void dsa_eval_run(Tape *tp, LM *lm, const Batcher *bt, int n_batches, int *x, int *y, DsaMode restore,
                  DsaEval *out) {
    memset(out, 0, sizeof *out);
    tape_no_grad_push(tp);
    for (int i = 0; i < n_batches; i++) {
        batcher_val(bt, i, x, y);
        lm_set_dsa_mode(lm, DSA_DISTILL);
        Tensor *loss = lm_loss(tp, lm, x, y, bt->B, bt->T, NULL);
        out->val_dense += loss->data[0];
        out->kl += lm->dsa_kl ? lm->dsa_kl->data[0] : NAN;
        out->mass += lm_dsa_mass(lm);
        tape_reset(tp);
        lm_set_dsa_mode(lm, DSA_SPARSE);
        loss = lm_loss(tp, lm, x, y, bt->B, bt->T, NULL);
        out->val_sparse += loss->data[0];
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

// Tokens/s of `steps` decode steps after a prefilled context of ctx positions.
static double decode_rate(LM *lm, int ctx, int steps, uint64_t seed) {
    const int warm = 2;
    int D = lm->cfg.d_model;
    LMCache *c = lm_cache_new(lm, 1, ctx + warm + steps);
    Tape tp;
    tape_init(&tp);
    tape_no_grad_push(&tp);
    Rng r;
    rng_seed(&r, seed);
    for (int l = 0; l < lm->cfg.n_layers; l++) {
        const Mixer *m = lm->blocks[l].mixer;
        if (strcmp(m->kind->name, "attn") != 0 && strcmp(m->kind->name, "attn_dsa") != 0) continue;
        Tensor *u = tape_tensorv(&tp, 3, 1, ctx, D);
        for (int64_t i = 0; i < u->numel; i++) u->data[i] = (real)rng_normal(&r);
        attn_cache_prefill(&tp, m, c->mixer[l], u);
        tape_reset(&tp);
    }
    c->pos = ctx;
    double t0 = 0;
    for (int i = 0; i < warm + steps; i++) {
        if (i == warm) t0 = runlog_now();
        int tok = (int)rng_below(&r, (uint64_t)lm->cfg.vocab_size);
        lm_step(&tp, lm, c, &tok);
        tape_reset(&tp);
    }
    double dt = runlog_now() - t0;
    tape_free(&tp);
    lm_cache_free(lm, c);
    return steps / dt;
}

void dsa_eval_decode_speed(LM *lm, int ctx, int steps, uint64_t seed, DsaMode restore, double *dense_tok_s,
                           double *sparse_tok_s) {
    lm_set_dsa_mode(lm, DSA_DISTILL);
    *dense_tok_s = decode_rate(lm, ctx, steps, seed);
    lm_set_dsa_mode(lm, DSA_SPARSE);
    *sparse_tok_s = decode_rate(lm, ctx, steps, seed);
    lm_set_dsa_mode(lm, restore);
}

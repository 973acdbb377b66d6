#include "model_setup.h"

#include <omp.h>
#include <string.h>

#include "tokenizer.h"

bool model_mixer_known(const char *name) { return mixer_kind_find(name) != NULL; }

Status model_config_from_train(const TrainConfig *tc, LMConfig *lc) {
    memset(lc, 0, sizeof *lc);
    lc->vocab_size = TOKENIZER_VOCAB;
    lc->d_model = tc->model.d_model;
    lc->d_ff = tc->model.d_ff;
    lc->tied = tc->model.tied_embeddings;
    lc->norm_eps = tc->model.norm_eps;
    if (tc->model.layers.n > LM_MAX_LAYERS) return status_err("[model] layers: more than %d layers", LM_MAX_LAYERS);
    lc->n_layers = tc->model.layers.n;
    for (int l = 0; l < lc->n_layers; l++) {
        if (!mixer_kind_find(tc->model.layers.name[l]))
            return status_err("[model] layers: mixer '%s' is not built into this program (known: %s)",
                              tc->model.layers.name[l], mixer_kind_names());
        snprintf(lc->layers[l], sizeof lc->layers[l], "%s", tc->model.layers.name[l]);
    }
    MixerConfig mc = mixer_config_default(tc->model.d_model, tc->model.n_heads, tc->model.d_k, tc->model.d_v);
    mc.chunk_size = tc->model.chunk_size;
    mc.conv_size = tc->model.conv_size;
    mc.form = tc->model.form;
    mc.rope_base = tc->model.rope_base;
    mc.norm_eps = tc->model.norm_eps;
    mc.index_heads = tc->model.index_heads;
    mc.index_dim = tc->model.index_dim;
    mc.topk = tc->model.topk;
    lc->mixer = mc;
    return status_ok();
}

Status model_build(const TrainConfig *tc, LM *lm, ParamStore *ps) {
    LMConfig lc;
    Status s = model_config_from_train(tc, &lc);
    if (!s.ok) return s;
    params_init(ps);
    lm_create(lm, &lc, ps);
    params_finalize(ps, (uint64_t)tc->train.seed);
    return status_ok();
}

int model_set_threads(int threads) {
    if (threads > 0) omp_set_num_threads(threads);
    return omp_get_max_threads();
}

double model_eval_loss(Tape *tp, LM *lm, const Batcher *bt, int n_batches, int *x, int *y) {
    double total = 0;
    tape_no_grad_push(tp);
    for (int i = 0; i < n_batches; i++) {
        batcher_val(bt, i, x, y);
        Tensor *loss = lm_loss(tp, lm, x, y, bt->B, bt->T, NULL);
        total += loss->data[0];
        tape_reset(tp);
    }
    tape_no_grad_pop(tp);
    return n_batches > 0 ? total / n_batches : 0.0;
}

#include "ckpt_loaders.h"

#include <math.h>
#include <stdlib.h>

#include "checkpoint.h"
#include "model_setup.h"

static const char *BASE_INI =
    "[model]\nlayers = gdn,attn_dsa,mamba\nd_model = 8\nn_heads = 2\nd_k = 4\nd_v = 4\nd_ff = 16\n"
    "chunk_size = 4\nconv_size = 2\nindex_heads = 2\nindex_dim = 2\ntopk = 3\n[train]\nseed = 5\n";

void ckpt_build_model(TrainConfig *cfg, LM *lm, ParamStore *ps) {
    config_defaults(cfg, model_mixer_known);
    if (!config_load_string(cfg, BASE_INI, "base").ok || !config_validate(cfg).ok) abort();
    if (!model_build(cfg, lm, ps, NULL).ok) abort();
}

static void require_finite(const ParamStore *ps, const Optimizer *opt) {
    if (optim_nonfinite_param(ps, opt)) abort();
}

void ckpt_load_every_way(const char *path) {
    // 1. generate: the model is whatever the stored config says.
    TrainConfig cfg;
    LM lm;
    ParamStore ps;
    if (model_load_checkpoint(path, &cfg, &lm, &ps, NULL).ok) {
        require_finite(&ps, NULL);
        lm_destroy(&lm);
        params_free(&ps);
    }
    config_free(&cfg);

    // 2. --resume and 3. init_from, into the known model.
    ckpt_build_model(&cfg, &lm, &ps);
    Optimizer opt;
    adamw_init(&opt, &ps, 0.9, 0.95, 1e-8, 0.1);
    real first = ps.data[0];
    CheckpointState st = {0};
    Status s = checkpoint_load(path, &ps, &opt, &st);
    if (s.ok) {
        require_finite(&ps, &opt);
        if (st.step < 0 || !st.config_text) abort();
        free(st.config_text);
    } else if (ps.data[0] != first) {
        abort();   // a failed load changed the model
    }
    double carry[CKPT_CARRY_ROWS * CKPT_CARRY_ROW];   // 4. the carried states of --resume with carry_state
    if (checkpoint_load_carry(path, carry, CKPT_CARRY_ROWS, CKPT_CARRY_ROW).ok)
        for (int i = 0; i < CKPT_CARRY_ROWS * CKPT_CARRY_ROW; i++)
            if (!isfinite(carry[i])) abort();
    ParamsLoadReport rep;
    if (checkpoint_load_params(path, &ps, &rep).ok) require_finite(&ps, NULL);
    optim_free(&opt);
    lm_destroy(&lm);
    params_free(&ps);
    config_free(&cfg);
}

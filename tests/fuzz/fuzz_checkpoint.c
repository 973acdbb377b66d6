// fuzz_checkpoint: the checkpoint loader through its three entry points, on
// structure-aware edits of a valid checkpoint (fuzz_util.h): generate's
// (the stored config, validated, then the model built only after its
// datasets are checked, then loaded), --resume's (parameters, AdamW and the
// run state into a known model) and init_from's (parameters by name).
// Invariants: no crash, leak, hang or huge allocation; a failed load leaves
// the model unchanged; a successful one leaves only finite values.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint.h"
#include "config.h"
#include "fuzz_util.h"
#include "model_setup.h"

static const char *BASE_INI =
    "[model]\nlayers = gdn,attn_dsa,mamba\nd_model = 8\nn_heads = 2\nd_k = 4\nd_v = 4\nd_ff = 16\n"
    "chunk_size = 4\nconv_size = 2\nindex_heads = 2\nindex_dim = 2\ntopk = 3\n[train]\nseed = 5\n";

static uint8_t *base_image;
static size_t base_size;
static const char *targets[96];
static int n_targets;

enum { CARRY_ROWS = 3, CARRY_ROW = 7 };

static void build_model(TrainConfig *cfg, LM *lm, ParamStore *ps) {
    config_defaults(cfg, model_mixer_known);
    if (!config_load_string(cfg, BASE_INI, "base").ok || !config_validate(cfg).ok) abort();
    if (!model_build(cfg, lm, ps, NULL).ok) abort();
}

static void init_base(void) {
    TrainConfig cfg;
    LM lm;
    ParamStore ps;
    build_model(&cfg, &lm, &ps);
    Optimizer opt;
    adamw_init(&opt, &ps, 0.9, 0.95, 1e-8, 0.1);
    for (int64_t i = 0; i < ps.numel; i++) ps.grad[i] = (real)(0.01 * (i % 7) - 0.03);
    optim_step(&opt, &ps, 0.01);
    static double carry[CARRY_ROWS * CARRY_ROW];   // a carried state ([train] carry_state)
    for (int i = 0; i < CARRY_ROWS * CARRY_ROW; i++) carry[i] = 0.25 * (i % 5) - 0.5;
    CheckpointState st = {.step = 3, .config_text = cfg.text, .carry = carry, .carry_rows = CARRY_ROWS,
                          .carry_row = CARRY_ROW};
    rng_seed(&st.sampler.rng, 1);
    rng_seed(&st.model_rng, 2);
    const char *path = fuzz_path("base.h5");
    if (!checkpoint_save(path, &ps, &opt, &st).ok) abort();
    base_image = fuzz_read_file(path, &base_size);
    static const char *fixed[] = {"/format_version", "/config", "/optim", "/optim/m", "/optim/v", "/optim/step",
                                  "/state", "/state/step", "/state/sampler", "/state/model_rng", "/state/carry",
                                  "/params"};
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) targets[n_targets++] = fixed[i];
    for (int i = 0; i < ps.n && n_targets < 96; i++) {
        char *name = malloc(strlen(ps.params[i]->name) + 9);
        sprintf(name, "/params/%s", ps.params[i]->name);
        targets[n_targets++] = name;
    }
    optim_free(&opt);
    lm_destroy(&lm);
    params_free(&ps);
    config_free(&cfg);
}

static void require_finite(const ParamStore *ps, const Optimizer *opt) {
    if (optim_nonfinite_param(ps, opt)) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!base_image) init_base();
    const char *path = fuzz_path("ckpt.h5");
    fuzz_write_file(path, base_image, base_size);
    FuzzBytes b = {data, size};
    fuzz_edit_hdf5(path, &b, targets, n_targets);

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
    build_model(&cfg, &lm, &ps);
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
    double carry[CARRY_ROWS * CARRY_ROW];   // 4. the carried states of --resume with carry_state
    if (checkpoint_load_carry(path, carry, CARRY_ROWS, CARRY_ROW).ok)
        for (int i = 0; i < CARRY_ROWS * CARRY_ROW; i++)
            if (!isfinite(carry[i])) abort();
    ParamsLoadReport rep;
    if (checkpoint_load_params(path, &ps, &rep).ok) require_finite(&ps, NULL);
    optim_free(&opt);
    lm_destroy(&lm);
    params_free(&ps);
    config_free(&cfg);
    return 0;
}

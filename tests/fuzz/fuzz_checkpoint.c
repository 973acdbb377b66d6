// fuzz_checkpoint: the checkpoint loader through its three entry points, on
// structure-aware edits of a valid checkpoint (fuzz_util.h): generate's
// (the stored config, validated, then the model built only after its
// datasets are checked, then loaded), --resume's (parameters, AdamW and the
// run state into a known model) and init_from's (parameters by name).
// Invariants: no crash, leak, hang or huge allocation; a failed load leaves
// the model unchanged; a successful one leaves only finite values. The files
// are libhdf5's own, so h5io walks them in this process, not in its sandbox.
#include <stdlib.h>
#include <string.h>

#include "checkpoint.h"
#include "ckpt_loaders.h"
#include "fuzz_util.h"
#include "h5io_walk.h"

static uint8_t *base_image;
static size_t base_size;
static const char *targets[96];
static int n_targets;

static void init_base(void) {
    TrainConfig cfg;
    LM lm;
    ParamStore ps;
    ckpt_build_model(&cfg, &lm, &ps);
    Optimizer opt;
    adamw_init(&opt, &ps, 0.9, 0.95, 1e-8, 0.1);
    for (int64_t i = 0; i < ps.numel; i++) ps.grad[i] = (real)(0.01 * (i % 7) - 0.03);
    optim_step(&opt, &ps, 0.01);
    static double carry[CKPT_CARRY_ROWS * CKPT_CARRY_ROW];   // a carried state ([train] carry_state)
    for (int i = 0; i < CKPT_CARRY_ROWS * CKPT_CARRY_ROW; i++) carry[i] = 0.25 * (i % 5) - 0.5;
    CheckpointState st = {.step = 3, .config_text = cfg.text, .carry = carry, .carry_rows = CKPT_CARRY_ROWS,
                          .carry_row = CKPT_CARRY_ROW};
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

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!base_image) {
        h5io_sandbox(false);   // libhdf5 wrote every file this target reads (fuzz_checkpoint_raw: the sandbox)
        init_base();
    }
    const char *path = fuzz_path("ckpt.h5");
    fuzz_write_file(path, base_image, base_size);
    FuzzBytes b = {data, size};
    fuzz_edit_hdf5(path, &b, targets, n_targets);

    ckpt_load_every_way(path);
    return 0;
}

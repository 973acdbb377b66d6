// The trainer end to end on tiny models: config errors, bit-exact resume,
// overfitting one batch, dump-state, and `generate --check` on a hybrid of
// every mixer.
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <hdf5.h>
#include <hdf5_hl.h>

#include "blas.h"
#include "checkpoint.h"
#include "dump_state.h"
#include "test_util.h"
#include "tile_amx.h"
#include "vocab_cost.h"
#include "trainer.h"

// A scratch folder with a small corpus and tiny.ini (test_tiny_config); returns the folder.
static const char *scratch(const char *layers, int steps, const char *extra) {
    return test_dir_of(test_tiny_config("train", layers, steps, NULL, extra));
}

static TrainerOptions opts(const char *dir, bool resume) {
    static char cfg[512];
    snprintf(cfg, sizeof cfg, "%s/tiny.ini", dir);
    TrainerOptions o = {0};
    o.config = cfg;
    o.resume = resume;
    o.quiet = true;
    return o;
}

// --resume with the given --set overrides (sets must outlive the options).
static TrainerOptions resume_opts(const char *dir, const char **sets, int n_sets) {
    TrainerOptions o = opts(dir, true);
    o.sets = sets;
    o.n_sets = n_sets;
    return o;
}

// A fresh run of dir's tiny.ini to its end (the caller frees t).
static void run_to_end(Trainer *t, const char *dir) {
    TrainerOptions o = opts(dir, false);
    Status s = trainer_setup(t, &o);
    cr_assert(s.ok, "%s", s.msg);
    cr_assert_eq(trainer_run(t, &o), 0);
}

// The run of o stopped after `at` steps (as Ctrl-C would), in the same run
// folder as an earlier run of o; leaves its checkpoint for a resume.
static void run_interrupted(Trainer *t, TrainerOptions o, int at) {
    o.stop_after = at;
    o.overwrite = true;
    Status s = trainer_setup(t, &o);
    cr_assert(s.ok, "%s", s.msg);
    cr_assert_eq(trainer_run(t, &o), 130);
    cr_assert_eq(t->step, at);
    trainer_free(t);
}

Test(train, config_errors_name_file_line_key_and_write_nothing) {
    const char *dir = scratch("gdn", 2, "lerning_rate = 0.1\n");
    static Trainer t;
    TrainerOptions o = opts(dir, false);
    Status s = trainer_setup(&t, &o);
    cr_assert(!s.ok);
    cr_assert(strstr(s.msg, "tiny.ini:") && strstr(s.msg, "lerning_rate") && strstr(s.msg, "unknown key"),
              "got: %s", s.msg);
    char run[600];
    snprintf(run, sizeof run, "%s/run", dir);
    struct stat st;
    cr_assert(stat(run, &st) != 0, "a failed setup must write nothing");
    // A bad value, through --set.
    dir = scratch("gdn", 2, NULL);
    o = opts(dir, false);
    const char *sets[] = {"train.lr=fast"};
    o.sets = sets;
    o.n_sets = 1;
    s = trainer_setup(&t, &o);
    cr_assert(!s.ok);
    cr_assert(strstr(s.msg, "--set") && strstr(s.msg, "lr") && strstr(s.msg, "fast"), "got: %s", s.msg);
    // A missing file.
    o = opts("/nonexistent_dir", false);
    s = trainer_setup(&t, &o);
    cr_assert(!s.ok);
    cr_assert(strstr(s.msg, "/nonexistent_dir/tiny.ini"), "got: %s", s.msg);
}

Test(train, resume_is_bit_exact, .timeout = 120) {
    enum { N = 6 };
    const char *dir = scratch("gdn,attn", N, NULL);
    static Trainer a, b;
    TrainerOptions o = opts(dir, false);
    Status s = trainer_setup(&a, &o);
    cr_assert(s.ok, "%s", s.msg);
    cr_assert_eq(trainer_run(&a, &o), 0);
    double straight[N];
    for (int i = 0; i < N; i++) straight[i] = trainer_loss(&a, i);
    trainer_free(&a);
    run_interrupted(&a, o, 3);   // then resumed
    TrainerOptions r = opts(dir, true);
    s = trainer_setup(&b, &r);
    cr_assert(s.ok, "%s", s.msg);
    cr_assert_eq(b.step, 3);
    cr_assert_eq(trainer_run(&b, &r), 0);
    double resumed[N];
    for (int i = 3; i < N; i++) resumed[i] = trainer_loss(&b, i);
    test_assert_resumed_losses(resumed, straight, 3, N);
    cr_assert(straight[N - 1] < straight[0], "the loss should fall: %g -> %g", straight[0], straight[N - 1]);
    trainer_free(&b);
}

#ifndef AG_DOUBLE
// The user's path with bf16 products, chosen by --set (not in the ini): the
// run keeps precision = bf16 in config.ini and its checkpoint, an
// interrupted run resumes bit for bit (the attention tiles and the dense
// products round the same way again), `generate --check` decodes the bf16
// checkpoint (in float32) equal to its parallel forward, and indexer
// fine-tuning starts from it, in bf16 too.
Test(train, bf16_run_resumes_bit_exact_generates_and_finetunes, .timeout = 180) {
    if (!(onednn_built() && onednn_has_bf16())) cr_skip_test("this CPU has no AVX512_BF16 (or no oneDNN)");
    enum { N = 6 };
    const char *dir = scratch("gdn,attn", N, NULL);
    static Trainer a, b, f;
    const char *bf[] = {"train.precision=bf16"};
    TrainerOptions o = opts(dir, false);
    o.sets = bf;
    o.n_sets = 1;
    Status s = trainer_setup(&a, &o);
    cr_assert(s.ok, "%s", s.msg);
    cr_assert_eq((int)blas_precision, PRECISION_BF16);
    cr_assert_eq(trainer_run(&a, &o), 0);
    double straight[N];
    for (int i = 0; i < N; i++) straight[i] = trainer_loss(&a, i);
    trainer_free(&a);
    char path[700];
    snprintf(path, sizeof path, "%s/run/config.ini", dir);
    char *ini = test_read_file(path);
    cr_assert(strstr(ini, "\nprecision = bf16\n"), "config.ini should keep the --set: %s", ini);
    free(ini);
    run_interrupted(&a, o, 3);
    test_use_backend(0);   // (float32 products now: the resume must bring bf16 back from the checkpoint)
    TrainerOptions r = opts(dir, true);
    s = trainer_setup(&b, &r);
    cr_assert(s.ok, "%s", s.msg);
    cr_assert_eq((int)blas_precision, PRECISION_BF16, "the resumed run must multiply in bf16 again");
    cr_assert_eq(trainer_run(&b, &r), 0);
    double resumed[N];
    for (int i = 3; i < N; i++) resumed[i] = trainer_loss(&b, i);
    test_assert_resumed_losses(resumed, straight, 3, N);
    trainer_free(&b);
    char ckpt[700], err[700];
    snprintf(ckpt, sizeof ckpt, "%s/run/checkpoint.h5", dir);
    char *text = NULL;
    s = checkpoint_read_config(ckpt, &text);
    cr_assert(s.ok && strstr(text, "\nprecision = bf16\n"), "the checkpoint's config: %s", s.ok ? text : s.msg);
    free(text);
    char *gen = (char *)test_program("generate");
    snprintf(err, sizeof err, "%s/gen.err", dir);
    char *argv[] = {gen, "--checkpoint", ckpt, "--prompt", "the light", "--max-tokens", "20", "--check", NULL};
    int rc = test_spawn(argv, NULL, NULL, err, 60, NULL);
    char *out = test_read_file(err);
    cr_assert(rc == 0 && out && strstr(out, "OK"), "generate --check on the bf16 checkpoint (exit %d):\n%s", rc,
              out ? out : "");
    free(out);
    // Indexer fine-tuning from it, still bf16 (--set again), into a folder of its own.
    char init[800], rd[800];
    snprintf(init, sizeof init, "finetune.init_from=%s", ckpt);
    snprintf(rd, sizeof rd, "train.run_dir=%s/ft", dir);
    const char *ft[] = {"finetune.mode=indexer", init, rd, "model.topk=8", "model.index_heads=2",
                        "model.index_dim=8", "train.steps=3", "train.precision=bf16"};
    TrainerOptions fo = opts(dir, false);
    fo.sets = ft;
    fo.n_sets = 8;
    s = trainer_setup(&f, &fo);
    cr_assert(s.ok, "%s", s.msg);
    cr_assert_eq((int)blas_precision, PRECISION_BF16);
    cr_assert_eq(trainer_run(&f, &fo), 0);
    cr_assert(isfinite(trainer_loss(&f, 2)), "the distillation loss: %g", trainer_loss(&f, 2));
    trainer_free(&f);
}
#endif

#ifndef AG_DOUBLE
// bf16_tiles = auto chooses once too (AMX and AVX512_BF16 tiles sum in
// another order): config.ini and the checkpoint name the kind it chose, and
// an interrupted run resumes on that kind, bit for bit, whatever was
// selected in between.
Test(train, bf16_tiles_choice_is_kept_on_resume, .timeout = 120) {
    if (!(onednn_built() && onednn_has_bf16())) cr_skip_test("this CPU has no AVX512_BF16 (or no oneDNN)");
    enum { N = 6 };
    const char *dir = scratch("attn", N, "precision = bf16\n");   // bf16_tiles left at auto
    static Trainer a, b;
    TrainerOptions o = opts(dir, false);
    Status s = trainer_setup(&a, &o);
    cr_assert(s.ok, "%s", s.msg);
    int chose = a.cfg.train.bf16_tiles;
    cr_assert(chose != BF16_TILES_AUTO && chose == (int)bf16_tiles_current(), "auto stays in the config: %d", chose);
    char why[200];
    if (amx_bf16_usable(why, sizeof why)) cr_assert_eq(chose, BF16_TILES_AMX, "auto on an AMX CPU");
    else {
        cr_assert_neq(chose, BF16_TILES_AMX, "auto chose AMX tiles on a CPU without them (%s)", why);
        cr_log_info("auto could not choose AMX: %s", why);
    }
    char want[64];
    snprintf(want, sizeof want, "\nbf16_tiles = %s\n", bf16_tiles_name((Bf16Tiles)chose));
    cr_assert(strstr(a.cfg.text, want), "the effective config should say %s", want + 1);
    cr_assert_eq(trainer_run(&a, &o), 0);
    double straight[N];
    for (int i = 0; i < N; i++) straight[i] = trainer_loss(&a, i);
    trainer_free(&a);
    run_interrupted(&a, o, 3);
    char path[700];
    snprintf(path, sizeof path, "%s/run/checkpoint.h5", dir);
    char *text = NULL;
    s = checkpoint_read_config(path, &text);
    cr_assert(s.ok && strstr(text, want), "the checkpoint's config should say %s", want + 1);
    free(text);
    char err[256];   // another kind in between: the resume must bring the run's own back
    cr_assert(bf16_tiles_select(chose == BF16_TILES_AMX ? BF16_TILES_AVX512BF16 : BF16_TILES_FP32, err, sizeof err));
    TrainerOptions r = opts(dir, true);
    s = trainer_setup(&b, &r);
    cr_assert(s.ok, "%s", s.msg);
    cr_assert_eq((int)bf16_tiles_current(), chose);
    cr_assert_eq(trainer_run(&b, &r), 0);
    double resumed[N];
    for (int i = 3; i < N; i++) resumed[i] = trainer_loss(&b, i);
    test_assert_resumed_losses(resumed, straight, 3, N);
    trainer_free(&b);
    cr_assert(bf16_tiles_select(BF16_TILES_AUTO, err, sizeof err));
}
#endif

// gemm = auto chooses once: the run's config.ini and checkpoint name the
// backend it chose, and a resume multiplies on that one whatever a new
// measurement would say (here: whichever backend was selected last).
Test(train, auto_gemm_choice_is_kept_on_resume, .timeout = 120) {
    const char *dir = scratch("gdn", 2, NULL);   // [train] gemm left at its default, auto
    static Trainer a, b;
    TrainerOptions o = opts(dir, false);
    Status s = trainer_setup(&a, &o);
    cr_assert(s.ok, "%s", s.msg);
    int chose = a.cfg.train.gemm;
    cr_assert(chose == GEMM_OPENBLAS || chose == GEMM_ONEDNN, "auto stays in the config: %d", chose);
    cr_assert_eq(chose, (int)blas_backend);
    char want[64];
    snprintf(want, sizeof want, "\ngemm = %s\n", blas_backend_name((GemmBackend)chose));
    cr_assert(strstr(a.cfg.text, want), "the effective config should say %s", want + 1);
    cr_assert_eq(trainer_run(&a, &o), 0);
    trainer_free(&a);
    char path[700];
    snprintf(path, sizeof path, "%s/run/config.ini", dir);
    char *ini = test_read_file(path);
    cr_assert(strstr(ini, want), "config.ini should say %s", want + 1);
    free(ini);
    snprintf(path, sizeof path, "%s/run/checkpoint.h5", dir);
    char *text = NULL;
    s = checkpoint_read_config(path, &text);
    cr_assert(s.ok, "%s", s.msg);
    cr_assert(strstr(text, want), "the checkpoint's config should say %s", want + 1);
    free(text);
    // Resume after another backend was selected: the run's own comes back.
    test_use_backend(test_n_backends() - 1 - (chose == GEMM_ONEDNN));
    const char *sets[] = {"train.steps=3"};
    TrainerOptions r = resume_opts(dir, sets, 1);
    s = trainer_setup(&b, &r);
    cr_assert(s.ok, "%s", s.msg);
    cr_assert_eq((int)blas_backend, chose);
    cr_assert_eq(b.cfg.train.gemm, chose);
    cr_assert_eq(trainer_run(&b, &r), 0);
    trainer_free(&b);
}

#ifdef AG_DOUBLE
// A resumed run whose backend cannot run here (this float64 build has no
// oneDNN) says so, and how to go on.
Test(train, resume_on_a_backend_this_build_lacks_says_how_to_go_on, .timeout = 120) {
    const char *dir = scratch("gdn", 2, NULL);
    static Trainer a, b;
    run_to_end(&a, dir);
    trainer_free(&a);
    const char *sets[] = {"train.steps=3", "train.gemm=onednn"};
    TrainerOptions r = resume_opts(dir, sets, 2);
    Status s = trainer_setup(&b, &r);
    cr_assert(!s.ok);
    cr_assert(strstr(s.msg, "--resume") && strstr(s.msg, "onednn") && strstr(s.msg, "--set train.gemm=auto"), "%s",
              s.msg);   // (a failed setup frees what it made)
    sets[1] = "train.gemm=auto";
    s = trainer_setup(&b, &r);
    cr_assert(s.ok, "%s", s.msg);
    cr_assert_eq(b.cfg.train.gemm, GEMM_OPENBLAS);
    cr_assert_eq(trainer_run(&b, &r), 0);
    trainer_free(&b);
}
#endif

Test(train, tiny_model_overfits_one_batch, .timeout = 120) {
    // A one-window corpus split: train on the same batch every step.
    const char *dir = scratch("gdn,attn", 150, NULL);
    static Trainer t;
    TrainerOptions o = opts(dir, false);
    Status s = trainer_setup(&t, &o);
    cr_assert(s.ok, "%s", s.msg);
    const TrainConfig *c = &t.cfg;
    int n = c->data.batch_size * c->data.seq_len;
    batcher_train(&t.bt, t.x, t.y, NULL);
    double first = 0, last = 0;
    Optimizer *opt = &t.opt;
    for (int step = 0; step < 150; step++) {
        params_zero_grad(&t.ps);
        Tensor *loss = lm_loss(&t.tp, &t.lm, t.x, t.y, c->data.batch_size, c->data.seq_len, NULL);
        if (step == 0) first = loss->data[0];
        last = loss->data[0];
        tape_backward(&t.tp, loss);
        tape_reset(&t.tp);
        optim_clip_grad_norm(&t.ps, 1.0);
        optim_step(opt, &t.ps, 1e-2);
    }
    cr_assert(first > 2.0, "an untrained byte model starts near log(256)/some: %g", first);
    cr_assert(last < 0.2 * first, "one batch of %d tokens should be memorised: %g -> %g", n, first, last);
    trainer_free(&t);
}

Test(train, dump_state_holds_loss_logits_params_and_grads) {
    const char *dir = scratch("mamba,attn", 2, NULL);
    static Trainer t;
    TrainerOptions o = opts(dir, false);
    Status s = trainer_setup(&t, &o);
    cr_assert(s.ok, "%s", s.msg);
    batcher_train(&t.bt, t.x, t.y, NULL);
    char path[600];
    snprintf(path, sizeof path, "%s/state.h5", dir);
    s = dump_state_write(path, &t.tp, &t.lm, &t.ps,
                         &(DumpBatch){t.x, t.y, NULL, t.cfg.data.batch_size, t.cfg.data.seq_len, NULL, false});
    cr_assert(s.ok, "%s", s.msg);
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    cr_assert_geq(f, 0);
    float loss;
    cr_assert_geq(H5LTread_dataset_float(f, "/loss", &loss), 0);
    cr_assert(loss > 1.0f && loss < 10.0f, "loss %g", loss);
    // The dumped gradient of the embedding equals a fresh backward's.
    Tensor *E = params_find(&t.ps, "embed");
    float *g = malloc((size_t)E->numel * sizeof(float));
    cr_assert_geq(H5LTread_dataset_float(f, "/grads/embed", g), 0);
    double norm = 0;
    for (int64_t i = 0; i < E->numel; i++) {
        cr_assert_float_eq(g[i], (float)E->grad[i], 1e-6);
        norm += g[i] * (double)g[i];
    }
    cr_assert_gt(norm, 0);
    hsize_t dims[3];
    cr_assert_geq(H5LTget_dataset_info(f, "/logits", dims, NULL, NULL), 0);
    cr_assert_eq(dims[2], 256);
    free(g);
    H5Fclose(f);
    trainer_free(&t);
}

Test(train, generate_check_parity_on_a_hybrid_of_every_mixer, .timeout = 120) {
    const char *dir = scratch("gdn,attn,mamba,linear,attn_dsa", 2, NULL);
    static Trainer t;
    TrainerOptions o = opts(dir, false);
    Status s = trainer_setup(&t, &o);
    cr_assert(s.ok, "%s", s.msg);
    cr_assert_eq(trainer_run(&t, &o), 0);
    trainer_free(&t);
    char *gen = (char *)test_program("generate");   // beside unit_tests, whatever the working folder
    char ckpt[1024], cmd[1024];
    snprintf(ckpt, sizeof ckpt, "%s/run/checkpoint.h5", dir);
    snprintf(cmd, sizeof cmd, "%s/gen.err", dir);
    // (No shell: the scratch folder's path comes from TMPDIR.) --check reports on stderr.
    char *argv[] = {gen, "--checkpoint", ckpt, "--prompt", "the light", "--max-tokens", "30", "--check", NULL};
    int rc = test_spawn(argv, NULL, NULL, cmd, 60, NULL);
    char out[2048] = {0};
    FILE *f = fopen(cmd, "r");
    if (f) {
        size_t n = fread(out, 1, sizeof out - 1, f);
        out[n] = 0;
        fclose(f);
    }
    cr_assert_eq(rc, 0, "generate --check failed:\n%s", out);
    cr_assert(strstr(out, "OK"), "got:\n%s", out);
    // The attn_dsa layer's picks were recorded at every position and replayed (attn_dsa.h).
    cr_assert(strstr(out, "are its own top-k at 39 of 39 rows"), "got:\n%s", out);
}

Test(train, nonfinite_loss_stops_and_keeps_the_last_checkpoint, .timeout = 120) {
    const char *dir = scratch("gdn,attn", 2, NULL);
    static Trainer a, b;
    run_to_end(&a, dir);   // a good checkpoint at step 2
    real *good = xmalloc((size_t)a.ps.numel * sizeof(real));
    memcpy(good, a.ps.data, (size_t)a.ps.numel * sizeof(real));
    int64_t numel = a.ps.numel;
    trainer_free(&a);
    // Resume for two more steps with a poisoned weight: the first loss is NaN.
    const char *sets[] = {"train.steps=4"};
    TrainerOptions r = resume_opts(dir, sets, 1);
    Status s = trainer_setup(&b, &r);
    cr_assert(s.ok, "%s", s.msg);
    params_find(&b.ps, "embed")->data[0] = NAN;
    cr_assert_eq(trainer_run(&b, &r), 3, "a non-finite loss stops the run with exit code 3");
    cr_assert_eq(b.step, 2, "no step is taken on a NaN loss");
    trainer_free(&b);
    // The checkpoint on disk is still the good one.
    s = trainer_setup(&b, &r);
    cr_assert(s.ok, "the last good checkpoint must still load: %s", s.msg);
    cr_assert_eq(b.step, 2);
    cr_assert_eq(b.ps.numel, numel);
    for (int64_t i = 0; i < numel; i++)   // checkpoints hold float32 (an identity in the float32 build)
        cr_assert(b.ps.data[i] == (real)(float)good[i], "weight %lld of the checkpoint changed", (long long)i);
    trainer_free(&b);
    free(good);
}

// Before training, train says what the tokenizer costs: the embedding's (and
// an untied output layer's) parameters and their share of the model.
Test(train, the_vocabulary_cost_is_said) {
    ParamStore ps;
    params_init(&ps);
    params_add(&ps, "embed", 2, (int[]){100000, 16}, init_zeros(), 0);
    params_add(&ps, "blocks", 2, (int[]){16, 1000}, init_zeros(), 0);
    params_finalize(&ps, 1);
    char line[400];
    vocab_cost_describe(&ps, line, sizeof line);
    cr_assert(strstr(line, "vocabulary 100000 ids: embedding 100000 x 16 = 1.6M parameters, 99% of the model's 1.62M") &&
                  strstr(line, "most of the model is its vocabulary"),
              "%s", line);
    params_free(&ps);
    params_init(&ps);
    params_add(&ps, "embed", 2, (int[]){256, 16}, init_zeros(), 0);
    params_add(&ps, "blocks", 2, (int[]){16, 10000}, init_zeros(), 0);
    params_add(&ps, "lm_head", 2, (int[]){16, 256}, init_zeros(), 0);
    params_finalize(&ps, 1);
    vocab_cost_describe(&ps, line, sizeof line);
    cr_assert(strstr(line, "embedding 256 x 16 and the output layer (untied) = 8192 parameters, 5% of the model's 168k") &&
                  !strstr(line, "most of"),
              "%s", line);
    params_free(&ps);
    params_init(&ps);   // a tiny byte-level model: its embedding is most of it, but no smaller vocabulary exists
    params_add(&ps, "embed", 2, (int[]){256, 16}, init_zeros(), 0);
    params_add(&ps, "blocks", 2, (int[]){16, 100}, init_zeros(), 0);
    params_finalize(&ps, 1);
    vocab_cost_describe(&ps, line, sizeof line);
    cr_assert(strstr(line, "72% of the model's") && !strstr(line, "most of"), "%s", line);
    params_free(&ps);
}

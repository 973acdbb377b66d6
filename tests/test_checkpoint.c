// HDF5 checkpoints: bit-exact round trip, crash safety, and located errors.
#define _GNU_SOURCE   // nftw
#include <ftw.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint.h"
#include "test_util.h"

static char tmpdir[64];
static void make_tmpdir(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/ckpttestXXXXXX");
    cr_assert_not_null(mkdtemp(tmpdir));
}
static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) { return remove(path); }
static void remove_tmpdir(void) { nftw(tmpdir, remove_entry, 16, FTW_DEPTH | FTW_PHYS); }
TestSuite(checkpoint, .init = make_tmpdir, .fini = remove_tmpdir);

static const char *tpath(char *buf, const char *name) {
    snprintf(buf, 256, "%s/%s", tmpdir, name);
    return buf;
}

// A small model: `variant` 0 is the reference; 1 adds a parameter; 2 changes a shape.
static void make_model(ParamStore *ps, uint64_t seed, int variant) {
    params_init(ps);
    params_add(ps, "embed", 2, (int[]){7, 5}, init_normal(1.0), 0);
    params_add(ps, "layers.0.mixer.wq", 2, (int[]){5, variant == 2 ? 4 : 6}, init_normal(0.3), 0);
    params_add(ps, "layers.0.norm.w", 1, (int[]){5}, init_normal(1.0), TENSOR_NO_DECAY);
    params_add(ps, "layers.0.mixer.A_log", 1, (int[]){3}, init_uniform(-1, 1), TENSOR_NO_DECAY);
    if (variant == 1) params_add(ps, "layers.0.indexer.wq", 2, (int[]){5, 2}, init_normal(1.0), 0);
    params_finalize(ps, seed);
}

// Two AdamW steps with arbitrary gradients so the moments are not zero.
static void train_a_bit(ParamStore *ps, Optimizer *opt) {
    for (int s = 0; s < 2; s++) {
        for (int64_t i = 0; i < ps->numel; i++) ps->grad[i] = (real)(0.01 * ((i * 7 + s * 3) % 11) - 0.05);
        optim_step(opt, ps, 0.01);
    }
}

// What a value becomes after a float32 round trip.
static real as_f32(real x) { return (real)(float)x; }

static void save_reference(const char *path, ParamStore *ps, Optimizer *opt, CheckpointState *st) {
    make_model(ps, 11, 0);
    adamw_init(opt, ps, 0.9, 0.95, 1e-8, 0.1);
    train_a_bit(ps, opt);
    memset(st, 0, sizeof *st);
    st->step = 1234;
    rng_seed(&st->sampler.rng, 99);
    st->sampler.batches = 77;
    rng_seed(&st->model_rng, 5);
    st->config_text = "[train]\nlr = 0.01\n";
    Status s = checkpoint_save(path, ps, opt, st);
    cr_assert(s.ok, "%s", s.msg);
}

Test(checkpoint, round_trip_is_exact) {
    char path[256];
    ParamStore a, b;
    Optimizer oa, ob;
    CheckpointState sa, sb;
    save_reference(tpath(path, "ckpt.h5"), &a, &oa, &sa);
    make_model(&b, 12, 0);   // different values to overwrite
    adamw_init(&ob, &b, 0.9, 0.95, 1e-8, 0.1);
    Status s = checkpoint_load(path, &b, &ob, &sb);
    cr_assert(s.ok, "%s", s.msg);
    // float32 build: bit-exact. float64 build: exactly the float32 rounding of the saved values.
    for (int64_t i = 0; i < a.numel; i++) {
        cr_assert_eq(b.data[i], as_f32(a.data[i]), "param element %lld", (long long)i);
        cr_assert_eq(ob.m[i], as_f32(oa.m[i]));
        cr_assert_eq(ob.v[i], as_f32(oa.v[i]));
    }
#ifndef AG_DOUBLE
    cr_assert_eq(memcmp(a.data, b.data, (size_t)a.numel * sizeof(real)), 0);
#endif
    cr_assert_eq(ob.step, 2);
    cr_assert_eq(sb.step, 1234);
    cr_assert_eq(sb.sampler.batches, 77);
    cr_assert_eq(memcmp(&sb.sampler.rng, &sa.sampler.rng, sizeof(Rng)), 0);
    cr_assert_eq(memcmp(&sb.model_rng, &sa.model_rng, sizeof(Rng)), 0);
    cr_assert_str_eq(sb.config_text, "[train]\nlr = 0.01\n");
    char *text;
    cr_assert(checkpoint_read_config(path, &text).ok);
    cr_assert_str_eq(text, "[train]\nlr = 0.01\n");
    free(text);
    free(sb.config_text);
    optim_free(&oa), optim_free(&ob);
    params_free(&a), params_free(&b);
}

// Copy the first `keep` bytes of src to dst (keep < 0: all).
static void copy_prefix(const char *src, const char *dst, long keep) {
    FILE *in = fopen(src, "rb"), *out = fopen(dst, "wb");
    cr_assert(in && out);
    fseek(in, 0, SEEK_END);
    long n = ftell(in);
    fseek(in, 0, SEEK_SET);
    if (keep < 0 || keep > n) keep = n;
    char *buf = malloc((size_t)n);
    cr_assert_eq(fread(buf, 1, (size_t)n, in), (size_t)n);
    fwrite(buf, 1, (size_t)keep, out);
    free(buf);
    fclose(in);
    fclose(out);
}

static long file_size(const char *p) {
    struct stat s;
    return stat(p, &s) == 0 ? (long)s.st_size : -1;
}

Test(checkpoint, interrupted_write_keeps_previous) {
    char path[256], other[256], tmp[300];
    ParamStore a, b, c;
    Optimizer oa, ob, oc;
    CheckpointState sa;
    save_reference(tpath(path, "run.h5"), &a, &oa, &sa);
    // A newer checkpoint was being written when the process died: its .tmp
    // holds the first half of the bytes, and the rename never happened.
    make_model(&b, 21, 0);
    adamw_init(&ob, &b, 0.9, 0.95, 1e-8, 0.1);
    train_a_bit(&b, &ob);
    cr_assert(checkpoint_save(tpath(other, "newer.h5"), &b, &ob, NULL).ok);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    copy_prefix(other, tmp, file_size(other) / 2);
    make_model(&c, 31, 0);
    adamw_init(&oc, &c, 0.9, 0.95, 1e-8, 0.1);
    Status s = checkpoint_load(path, &c, &oc, NULL);
    cr_assert(s.ok, "the previous checkpoint must still load: %s", s.msg);
    for (int64_t i = 0; i < a.numel; i++) cr_assert_eq(c.data[i], as_f32(a.data[i]));
    // The next save replaces the stale .tmp and lands.
    cr_assert(checkpoint_save(path, &b, &ob, NULL).ok);
    cr_assert_eq(access(tmp, F_OK), -1, "no .tmp left after a successful save");
    cr_assert(checkpoint_load(path, &c, &oc, NULL).ok);
    for (int64_t i = 0; i < b.numel; i++) cr_assert_eq(c.data[i], as_f32(b.data[i]));
    // The half-written file itself is reported, not trusted.
    copy_prefix(other, tmp, file_size(other) / 2);
    s = checkpoint_load(tmp, &c, &oc, NULL);
    cr_assert(!s.ok);
    cr_assert(strstr(s.msg, tmp), "%s", s.msg);
    optim_free(&oa), optim_free(&ob), optim_free(&oc);
    params_free(&a), params_free(&b), params_free(&c);
}

// Load `path` into a model of `variant`; return the status (message checked by caller).
static Status load_variant(const char *path, int variant) {
    ParamStore ps;
    make_model(&ps, 3, variant);
    Status s = checkpoint_load(path, &ps, NULL, NULL);
    params_free(&ps);
    return s;
}

static void expect_msg(Status s, const char *want) {
    cr_assert(!s.ok, "expected an error: %s", want);
    cr_assert_str_eq(s.msg, want);
}

Test(checkpoint, errors_name_file_and_dataset) {
    char path[256], want[600], bad[256];
    ParamStore a;
    Optimizer oa;
    CheckpointState sa;
    save_reference(tpath(path, "ok.h5"), &a, &oa, &sa);

    snprintf(want, sizeof want, "%s: cannot open checkpoint: No such file or directory", tpath(bad, "none.h5"));
    expect_msg(load_variant(bad, 0), want);
    FILE *f = fopen(tpath(bad, "text.h5"), "w");
    fputs("this is not HDF5\n", f);
    fclose(f);
    expect_msg(load_variant(bad, 0), (snprintf(want, sizeof want, "%s: not an HDF5 file", bad), want));
    copy_prefix(path, tpath(bad, "trunc.h5"), file_size(path) / 3);
    Status s = load_variant(bad, 0);
    cr_assert(!s.ok && strstr(s.msg, bad), "truncated file: %s", s.msg);

    expect_msg(load_variant(path, 1),
               (snprintf(want, sizeof want, "%s: /params/layers.0.indexer.wq: missing", path), want));
    expect_msg(load_variant(path, 2), (snprintf(want, sizeof want,
               "%s: /params/layers.0.mixer.wq: shape (5, 6) in the file, (5, 4) in the model", path), want));
    // The model lacks a parameter the file has.
    ParamStore small;
    params_init(&small);
    params_add(&small, "embed", 2, (int[]){7, 5}, init_zeros(), 0);
    params_finalize(&small, 1);
    s = checkpoint_load(path, &small, NULL, NULL);
    cr_assert(!s.ok);
    cr_assert(strstr(s.msg, "/params: 3 parameter(s) the model lacks: layers.0.mixer.A_log"), "%s", s.msg);
    for (int64_t i = 0; i < small.numel; i++) cr_assert_eq(small.data[i], 0, "a failed load changes nothing");
    params_free(&small);
    // Optimizer kind mismatch, and state saved without an optimizer.
    ParamStore b;
    Optimizer sgd;
    make_model(&b, 3, 0);
    sgd_init(&sgd, &b, 0.9, 0);
    expect_msg(checkpoint_load(path, &b, &sgd, NULL),
               (snprintf(want, sizeof want, "%s: /optim: state of optimizer 'adamw', the run uses 'sgd'", path), want));
    char noopt[256];
    cr_assert(checkpoint_save(tpath(noopt, "noopt.h5"), &b, NULL, NULL).ok);
    expect_msg(checkpoint_load(noopt, &b, &sgd, NULL),
               (snprintf(want, sizeof want, "%s: /optim: missing (saved without optimizer state)", noopt), want));
    optim_free(&sgd);
    params_free(&b);
    optim_free(&oa);
    params_free(&a);
}

Test(checkpoint, load_params_by_name_reports_missing) {
    char path[256];
    ParamStore a, b;
    Optimizer oa;
    CheckpointState sa;
    save_reference(tpath(path, "base.h5"), &a, &oa, &sa);
    make_model(&b, 8, 1);   // has the extra layers.0.indexer.wq
    Tensor *idx = params_find(&b, "layers.0.indexer.wq");
    real before = idx->data[3];
    ParamsLoadReport rep;
    Status s = checkpoint_load_params(path, &b, &rep);
    cr_assert(s.ok, "%s", s.msg);
    cr_assert_eq(rep.n_loaded, 4);
    cr_assert_eq(rep.n_missing, 1);
    cr_assert_str_eq(rep.missing, "layers.0.indexer.wq");
    cr_assert_eq(rep.n_unused, 0);
    cr_assert_eq(idx->data[3], before, "a missing parameter keeps its initial value");
    Tensor *wq = params_find(&b, "layers.0.mixer.wq");
    Tensor *wq0 = params_find(&a, "layers.0.mixer.wq");
    for (int64_t i = 0; i < wq->numel; i++) cr_assert_eq(wq->data[i], as_f32(wq0->data[i]));
    // Shape mismatches are still errors.
    ParamStore c;
    make_model(&c, 8, 2);
    s = checkpoint_load_params(path, &c, &rep);
    cr_assert(!s.ok && strstr(s.msg, "/params/layers.0.mixer.wq: shape (5, 6)"), "%s", s.msg);
    params_free(&c);
    optim_free(&oa);
    params_free(&a), params_free(&b);
}

// HDF5 checkpoints: bit-exact round trip, crash safety, and located errors.
#define _GNU_SOURCE   // nftw
#include <dirent.h>
#include <ftw.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <hdf5.h>
#include <hdf5_hl.h>
#include <math.h>

#include "checkpoint.h"
#include "h5io.h"
#include "h5io_walk.h"
#include "test_util.h"

static char tmpdir[512];
static void make_tmpdir(void) {
    snprintf(tmpdir, sizeof tmpdir, "%s", test_tmpdir("checkpoint"));
}
static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) { return remove(path); }
static void remove_tmpdir(void) { nftw(tmpdir, remove_entry, 16, FTW_DEPTH | FTW_PHYS); }
TestSuite(checkpoint, .init = make_tmpdir, .fini = remove_tmpdir);

static const char *tpath(char *buf, const char *name) {
    snprintf(buf, 600, "%s/%s", tmpdir, name);
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
    char path[600];
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
    char path[600], other[600], tmp[700];
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
    // The next save lands beside the stale .tmp (a temporary of its own,
    // fileio.h: never one that was there before) and leaves nothing of its own.
    cr_assert(checkpoint_save(path, &b, &ob, NULL).ok);
    cr_assert_eq(file_size(tmp), file_size(other) / 2, "the stale file is neither reused nor followed");
    DIR *d = opendir(test_dir_of(path));
    cr_assert_not_null(d);
    for (struct dirent *de; (de = readdir(d));)
        cr_assert_null(strstr(de->d_name, ".tmp."), "%s left after a save", de->d_name);
    closedir(d);
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
    char path[600], want[1400], bad[600];
    ParamStore a;
    Optimizer oa;
    CheckpointState sa;
    save_reference(tpath(path, "ok.h5"), &a, &oa, &sa);

    snprintf(want, sizeof want, "%s: cannot open checkpoint: No such file or directory", tpath(bad, "none.h5"));
    expect_msg(load_variant(bad, 0), want);
    FILE *f = fopen(tpath(bad, "text.h5"), "w");
    fputs("this is not HDF5\n", f);
    fclose(f);
    expect_msg(load_variant(bad, 0), (snprintf(want, sizeof want, "%s: not an HDF5 file (not a checkpoint, or truncated)", bad), want));
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
    char noopt[600];
    cr_assert(checkpoint_save(tpath(noopt, "noopt.h5"), &b, NULL, NULL).ok);
    expect_msg(checkpoint_load(noopt, &b, &sgd, NULL),
               (snprintf(want, sizeof want, "%s: /optim: missing (saved without optimizer state)", noopt), want));
    optim_free(&sgd);
    params_free(&b);
    optim_free(&oa);
    params_free(&a);
}

Test(checkpoint, load_params_by_name_reports_missing) {
    char path[600];
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

// ---------------------------------------------------------------- hostile files
//
// Each case edits a valid checkpoint the way an attacker or a corrupting disk
// could (with valid checksums where the point is to reach a later check), and
// expects a clear error naming the file and the dataset, with nothing of the
// model changed. Under ASan any out-of-bounds access fails the run.

typedef void (*Edit)(hid_t f);

// A copy of the reference checkpoint at <tmpdir>/<name>; returns its path (static storage).
static const char *reference_copy(const char *name) {
    static char path[600];
    char ref[600];
    ParamStore a;
    Optimizer oa;
    CheckpointState sa;
    save_reference(tpath(ref, "ref.h5"), &a, &oa, &sa);
    optim_free(&oa);
    params_free(&a);
    copy_prefix(ref, tpath(path, name), -1);
    return path;
}

// A copy of the reference checkpoint with `edit` applied through HDF5; returns its path.
static const char *crafted(const char *name, Edit edit) {
    const char *path = reference_copy(name);
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    cr_assert_geq(f, 0);
    edit(f);
    cr_assert_geq(H5Fclose(f), 0);
    return path;
}

// The full load a --resume does (parameters, AdamW, state); the model must not change on failure.
static Status load_all(const char *path) {
    ParamStore ps;
    Optimizer opt;
    make_model(&ps, 3, 0);
    adamw_init(&opt, &ps, 0.9, 0.95, 1e-8, 0.1);
    real before = ps.data[2];
    CheckpointState st = {0};
    Status s = checkpoint_load(path, &ps, &opt, &st);
    if (!s.ok) cr_assert_eq(ps.data[2], before, "a failed load must change nothing");
    if (s.ok) free(st.config_text);
    optim_free(&opt);
    params_free(&ps);
    return s;
}

static void expect_load_error(const char *path, const char *part) {
    Status s = load_all(path);
    cr_assert(!s.ok, "expected an error containing '%s'", part);
    cr_assert(strstr(s.msg, path) && strstr(s.msg, part), "got: %s (wanted '%s')", s.msg, part);
}

static void relink(hid_t f, const char *name) { cr_assert_geq(H5Ldelete(f, name, H5P_DEFAULT), 0); }

static void config_as_string_array(hid_t f) {
    relink(f, "/config");
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, 8);
    hsize_t n = 3;
    hid_t sp = H5Screate_simple(1, &n, NULL);
    hid_t d = H5Dcreate2(f, "/config", t, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    char data[24] = "[model]\0d_model\0= 99999";
    H5Dwrite(d, t, H5S_ALL, H5S_ALL, H5P_DEFAULT, data);
    H5Dclose(d), H5Sclose(sp), H5Tclose(t);
}
static void version_two_elements(hid_t f) {
    relink(f, "/format_version");
    int32_t v[2] = {2, 2};
    cr_assert(h5io_write(f, "/format_version", H5IO_I32, 1, (hsize_t[]){2}, v));
}
static void version_2e62_elements(hid_t f) {   // a huge dataspace in a few bytes (chunked, never written)
    relink(f, "/format_version");
    hsize_t n = (hsize_t)1 << 62, chunk = 1024;
    hid_t sp = H5Screate_simple(1, &n, NULL);
    hid_t pl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_chunk(pl, 1, &chunk);
    hid_t d = H5Dcreate2(f, "/format_version", H5T_STD_I32LE, sp, H5P_DEFAULT, pl, H5P_DEFAULT);
    cr_assert_geq(d, 0);
    H5Dclose(d), H5Pclose(pl), H5Sclose(sp);
}
static void step_negative(hid_t f) {
    relink(f, "/state/step");
    int64_t v = -5;
    cr_assert(h5io_write(f, "/state/step", H5IO_I64, 1, (hsize_t[]){1}, &v));
}
static void step_2e62(hid_t f) {
    relink(f, "/state/step");
    int64_t v = (int64_t)1 << 62;
    cr_assert(h5io_write(f, "/state/step", H5IO_I64, 1, (hsize_t[]){1}, &v));
}
static void long_optim_kind(hid_t f) {
    H5Adelete_by_name(f, "/optim", "kind", H5P_DEFAULT);
    char kind[101];
    memset(kind, 'a', 100);
    kind[100] = 0;
    cr_assert_geq(H5LTset_attribute_string(f, "/optim", "kind", kind), 0);
}
static void weight_as_int32(hid_t f) {
    relink(f, "/params/embed");
    int32_t w[35] = {0};
    cr_assert(h5io_write(f, "/params/embed", H5IO_I32, 2, (hsize_t[]){7, 5}, w));
}
static void weight_nan(hid_t f) {
    relink(f, "/params/layers.0.norm.w");
    float w[5] = {1, 1, NAN, 1, 1};
    cr_assert(h5io_write(f, "/params/layers.0.norm.w", H5IO_F32, 1, (hsize_t[]){5}, w));
}
static void negative_second_moment(hid_t f) {
    hsize_t n = 35 + 30 + 5 + 3;
    float *v = calloc(n, sizeof *v);
    v[40] = -1;
    relink(f, "/optim/v");
    cr_assert(h5io_write(f, "/optim/v", H5IO_F32, 1, &n, v));
    free(v);
}
static void external_link(hid_t f) {
    relink(f, "/params/embed");
    cr_assert_geq(H5Lcreate_external("/etc/other.h5", "/x", f, "/params/embed", H5P_DEFAULT, H5P_DEFAULT), 0);
}
static void soft_link(hid_t f) {
    relink(f, "/params/embed");
    cr_assert_geq(H5Lcreate_soft("/params/layers.0.mixer.wq", f, "/params/embed", H5P_DEFAULT, H5P_DEFAULT), 0);
}
static void never_written(hid_t f) {
    relink(f, "/params/embed");
    hsize_t dims[2] = {7, 5};
    hid_t sp = H5Screate_simple(2, dims, NULL);
    hid_t pl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_alloc_time(pl, H5D_ALLOC_TIME_LATE);
    hid_t d = H5Dcreate2(f, "/params/embed", H5T_IEEE_F32LE, sp, H5P_DEFAULT, pl, H5P_DEFAULT);
    uint32_t crc = 0;   // even with a checksum attribute, it holds no data
    H5LTset_attribute_uint(f, "/params/embed", "crc32", &crc, 1);
    H5Dclose(d), H5Pclose(pl), H5Sclose(sp);
}
static void compressed(hid_t f) {
    relink(f, "/params/embed");
    hsize_t dims[2] = {7, 5};
    hid_t sp = H5Screate_simple(2, dims, NULL);
    hid_t pl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_chunk(pl, 2, dims);
    H5Pset_deflate(pl, 6);
    hid_t d = H5Dcreate2(f, "/params/embed", H5T_IEEE_F32LE, sp, H5P_DEFAULT, pl, H5P_DEFAULT);
    float w[35] = {0};
    H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, w);
    H5Dclose(d), H5Pclose(pl), H5Sclose(sp);
}
static void no_checksum(hid_t f) { H5Adelete_by_name(f, "/params/embed", "crc32", H5P_DEFAULT); }
static void group_for_dataset(hid_t f) {
    relink(f, "/state/step");
    hid_t g = H5Gcreate2(f, "/state/step", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Gclose(g);
}
static void zero_sampler(hid_t f) {
    relink(f, "/state/sampler");
    uint64_t w[5] = {0};
    cr_assert(h5io_write(f, "/state/sampler", H5IO_U64, 1, (hsize_t[]){5}, w));
}
static void version_one(hid_t f) {
    relink(f, "/format_version");
    int32_t v = 1;
    cr_assert(h5io_write(f, "/format_version", H5IO_I32, 1, (hsize_t[]){1}, &v));
}

Test(checkpoint, hostile_structures_are_refused) {
    expect_load_error(crafted("strarr.h5", config_as_string_array), "/config: a string dataset must be a single");
    char *text = NULL;
    Status s = checkpoint_read_config(crafted("strarr2.h5", config_as_string_array), &text);
    cr_assert(!s.ok && text == NULL && strstr(s.msg, "/config"), "%s", s.msg);
    expect_load_error(crafted("v2.h5", version_two_elements), "/format_version: shape (2) in the file, (1) expected");
    expect_load_error(crafted("v62.h5", version_2e62_elements), "/format_version: shape (4611686018427387904) in the file, (1) expected");
    expect_load_error(crafted("v1.h5", version_one), "/format_version: 1, this build reads version 2");
    expect_load_error(crafted("stepneg.h5", step_negative), "/state/step: -5 is not a step count");
    expect_load_error(crafted("step62.h5", step_2e62), "/state/step: 4611686018427387904 is not a step count");
    expect_load_error(crafted("kind.h5", long_optim_kind), "/optim: attribute 'kind' is 101 bytes long, at most 31");
    expect_load_error(crafted("int.h5", weight_as_int32), "/params/embed: stored as int32, expected float32");
    expect_load_error(crafted("nan.h5", weight_nan), "/params/layers.0.norm.w: element 2 is nan (not a finite number)");
    expect_load_error(crafted("negv.h5", negative_second_moment), "/optim/v: element 40 is -1 (a second moment");
    expect_load_error(crafted("ext.h5", external_link), "/params/embed: an external link");
    expect_load_error(crafted("soft.h5", soft_link), "/params/embed: a soft link");
    expect_load_error(crafted("unwritten.h5", never_written), "/params/embed: never written");
    expect_load_error(crafted("deflate.h5", compressed), "/params/embed: stored with filters (compression)");
    expect_load_error(crafted("nocrc.h5", no_checksum), "/params/embed: no crc32 checksum attribute");
    expect_load_error(crafted("group.h5", group_for_dataset), "/state/step: not a dataset");
    expect_load_error(crafted("zero.h5", zero_sampler), "/state/sampler: not a sampler state");
}

// Flip one bit of the stored bytes of `name` in a copy of the reference checkpoint.
static const char *flipped(const char *copy, const char *name, long byte) {
    const char *path = reference_copy(copy);
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    hid_t d = H5Dopen2(f, name, H5P_DEFAULT);
    haddr_t off = H5Dget_offset(d);
    H5Dclose(d);
    H5Fclose(f);
    cr_assert_neq(off, HADDR_UNDEF);
    FILE *fp = fopen(path, "r+b");
    fseek(fp, (long)off + byte, SEEK_SET);
    int c = fgetc(fp);
    fseek(fp, (long)off + byte, SEEK_SET);
    fputc(c ^ 0x10, fp);
    fclose(fp);
    return path;
}

Test(checkpoint, flipped_bits_are_caught_by_the_checksums) {
    expect_load_error(flipped("flip_w.h5", "/params/layers.0.mixer.wq", 13), "/params/layers.0.mixer.wq: checksum mismatch");
    expect_load_error(flipped("flip_m.h5", "/optim/m", 7), "/optim/m: checksum mismatch");
    expect_load_error(flipped("flip_s.h5", "/state/sampler", 3), "/state/sampler: checksum mismatch");
    char *text = NULL;
    Status s = checkpoint_read_config(flipped("flip_c.h5", "/config", 2), &text);
    cr_assert(!s.ok && strstr(s.msg, "/config: checksum mismatch"), "%s", s.msg);
}

Test(checkpoint, check_params_before_the_model_is_allocated) {
    char path[600];
    ParamStore a;
    Optimizer oa;
    CheckpointState sa;
    save_reference(tpath(path, "ref.h5"), &a, &oa, &sa);
    // Registered, not finalised: shapes only.
    ParamStore big;
    params_init(&big);
    params_add(&big, "embed", 2, (int[]){70000, 5000}, init_zeros(), 0);
    Status s = checkpoint_check_params(path, &big, NULL);
    cr_assert(!s.ok && strstr(s.msg, "/params/embed: shape (7, 5) in the file, (70000, 5000) in the model"), "%s",
              s.msg);
    cr_assert_null(big.data, "nothing allocated");
    params_free(&big);
    ParamStore same;
    params_init(&same);
    params_add(&same, "embed", 2, (int[]){7, 5}, init_zeros(), 0);
    params_add(&same, "layers.0.mixer.wq", 2, (int[]){5, 6}, init_zeros(), 0);
    params_add(&same, "layers.0.norm.w", 1, (int[]){5}, init_zeros(), 0);
    params_add(&same, "layers.0.mixer.A_log", 1, (int[]){3}, init_zeros(), 0);
    s = checkpoint_check_params(path, &same, NULL);
    cr_assert(s.ok, "%s", s.msg);
    params_free(&same);
    optim_free(&oa);
    params_free(&a);
}

// Files that crash Debian's libhdf5 1.10 itself when it reads their
// structure (a NULL read under H5Lexists, reads out of bounds under
// H5Aexists): libhdf5 runs on them only in the sandboxed walk, so every
// loader refuses them as corrupt and the test process lives on.
Test(checkpoint, files_that_crash_libhdf5_are_refused_as_corrupt) {
    static const char *const names[] = {"fuzz_ck_hdf5_localheap_segv.h5", "fuzz_ck_hdf5_attr_segv.h5",
                                        "fuzz_ck_hdf5_attr_segv_named.h5", "fuzz_ck_hdf5_attr_heap_overflow.h5"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char path[600];
        snprintf(path, sizeof path, "%s/tests/fixtures/hostile/%s", SOURCE_DIR, names[i]);
        expect_load_error(path, "corrupt checkpoint");
        char *text = NULL;
        Status s = checkpoint_read_config(path, &text);
        cr_assert(!s.ok && !text && strstr(s.msg, path) && strstr(s.msg, "corrupt checkpoint"), "%s", s.msg);
        ParamStore ps;
        make_model(&ps, 3, 0);
        ParamsLoadReport rep;
        s = checkpoint_load_params(path, &ps, &rep);
        cr_assert(!s.ok && strstr(s.msg, "corrupt checkpoint"), "%s", s.msg);
        params_free(&ps);
    }
}

// The catalog the walk hands back is parsed with every bound checked: no
// cut or flipped byte of a real stream may crash the parser, and a stream
// cut short is never accepted.
Test(checkpoint, catalog_stream_parser_survives_every_cut_and_flip) {
    char path[600];
    ParamStore a;
    Optimizer oa;
    CheckpointState sa;
    save_reference(tpath(path, "cat.h5"), &a, &oa, &sa);
    size_t len = 0;
    unsigned char *stream = h5io_walk_stream(path, &len);
    cr_assert(stream && len > 64);
    H5ioCatalog *cat = NULL;
    Status s = h5io_catalog_parse(stream, len, path, "checkpoint", &cat);
    cr_assert(s.ok, "%s", s.msg);
    cr_assert(h5io_catalog_find(cat, "/params/embed") && h5io_catalog_find(cat, "/optim/m"));
    h5io_catalog_free(cat);
    for (size_t cut = 0; cut < len; cut += 1 + cut / 64) {
        s = h5io_catalog_parse(stream, cut, path, "checkpoint", &cat);
        cr_assert(!s.ok && !cat && strstr(s.msg, "corrupt checkpoint"), "a stream cut at %zu of %zu bytes", cut, len);
    }
    unsigned char *copy = malloc(len);
    for (size_t at = 0; at < len; at += 1 + at / 256) {
        memcpy(copy, stream, len);
        copy[at] ^= 0xa5;
        if (h5io_catalog_parse(copy, len, path, "checkpoint", &cat).ok) h5io_catalog_free(cat);
    }
    free(copy);
    free(stream);
    optim_free(&oa);
    params_free(&a);
}

// checkpoint.c: HDF5 checkpoints (format in checkpoint.h and docs/checkpoint.md).
#include "checkpoint.h"

#include <hdf5.h>
#include <hdf5_hl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "h5io.h"

#define F32 (1u << H5IO_F32)

// ---------------------------------------------------------------- writing

// A float32 dataset of `rank` dims from real data (converted in a float64 build).
static bool write_real(hid_t loc, const char *name, int rank, const hsize_t *dims, const real *data) {
    int64_t n = 1;
    for (int k = 0; k < rank; k++) n *= (int64_t)dims[k];
#ifdef AG_DOUBLE
    float *tmp = xmalloc((size_t)(n ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++) tmp[i] = (float)data[i];
    bool ok = h5io_write(loc, name, H5IO_F32, rank, dims, tmp);
    free(tmp);
    return ok;
#else
    (void)n;
    return h5io_write(loc, name, H5IO_F32, rank, dims, data);
#endif
}

static bool write_i64(hid_t loc, const char *name, int64_t x) {
    return h5io_write(loc, name, H5IO_I64, 1, (hsize_t[]){1}, &x);
}

static bool write_contents(hid_t f, const ParamStore *ps, const Optimizer *opt, const CheckpointState *st) {
    int32_t version = CHECKPOINT_VERSION;
    if (!h5io_write(f, "/format_version", H5IO_I32, 1, (hsize_t[]){1}, &version)) return false;
    hid_t g = H5Gcreate2(f, "/params", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (g < 0) return false;
    bool ok = true;
    for (int i = 0; ok && i < ps->n; i++) {
        const Tensor *p = ps->params[i];
        ASSERT(!strchr(p->name, '/'), "checkpoint: parameter name '%s' contains '/'", p->name);
        hsize_t dims[TENSOR_MAX_DIMS];
        for (int k = 0; k < p->ndim; k++) dims[k] = (hsize_t)p->shape[k];
        ok = write_real(g, p->name, p->ndim, dims, ps->data + ps->offsets[i]);
    }
    H5Gclose(g);
    if (!ok) return false;
    if (opt) {
        ASSERT(opt->numel == ps->numel, "checkpoint_save: optimizer has %lld elements, ParamStore %lld",
               (long long)opt->numel, (long long)ps->numel);
        ASSERT(opt->lo == 0 && opt->hi == ps->numel,
               "checkpoint_save: a sharded optimizer ([%lld, %lld) of %lld): gather the shards first",
               (long long)opt->lo, (long long)opt->hi, (long long)ps->numel);
        g = H5Gcreate2(f, "/optim", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        if (g < 0) return false;
        hsize_t n = (hsize_t)ps->numel;
        ok = H5LTset_attribute_string(f, "/optim", "kind", optim_name(opt->kind)) >= 0 &&
             write_real(g, "m", 1, &n, opt->m) && (!opt->v || write_real(g, "v", 1, &n, opt->v)) &&
             write_i64(g, "step", opt->step);
        H5Gclose(g);
        if (!ok) return false;
    }
    CheckpointState zero = {0};
    if (!st) st = &zero;
    g = H5Gcreate2(f, "/state", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (g < 0) return false;
    uint64_t words[SAMPLER_STATE_WORDS];
    sampler_state_pack(&st->sampler, words);
    ok = write_i64(g, "step", st->step) &&
         h5io_write(g, "sampler", H5IO_U64, 1, (hsize_t[]){SAMPLER_STATE_WORDS}, words) &&
         h5io_write(g, "model_rng", H5IO_U64, 1, (hsize_t[]){4}, st->model_rng.s);
    if (ok && st->carry)
        ok = h5io_write(g, "carry", H5IO_F64, 2, (hsize_t[]){(hsize_t)st->carry_rows, (hsize_t)st->carry_row},
                        st->carry);
    H5Gclose(g);
    if (ok && st->tokenizer_len)
        ok = h5io_write(f, "/tokenizer", H5IO_U8, 1, (hsize_t[]){(hsize_t)st->tokenizer_len}, st->tokenizer);
    return ok && h5io_write_string(f, "/config", st->config_text ? st->config_text : "");
}

Status checkpoint_save(const char *path, const ParamStore *ps, const Optimizer *opt, const CheckpointState *st) {
    ASSERT(ps->finalized, "checkpoint_save before params_finalize");
    hid_t f = h5io_create_memory();
    if (f < 0) return status_err("%s: cannot create the checkpoint in memory", path);
    if (!write_contents(f, ps, opt, st)) {
        H5Fclose(f);
        return status_err("%s: building the checkpoint failed", path);
    }
    return h5io_commit(f, path, "checkpoint");
}

// ---------------------------------------------------------------- reading

static Status open_checkpoint(H5ioFile *hf, const char *path) {
    Status s = h5io_open(hf, path, "checkpoint");
    if (!s.ok) return s;
    H5ioInfo in;
    int32_t version = 0;
    if (!h5io_exists(hf, "/format_version", NULL)) s = status_err("%s: /format_version: missing (not a checkpoint?)", path);
    if (s.ok) s = h5io_check(hf, "/format_version", 1u << H5IO_I32, 1, (hsize_t[]){1}, 1, &in);
    if (s.ok) s = h5io_read(hf, "/format_version", &in, &version);
    if (s.ok && version != CHECKPOINT_VERSION)
        s = status_err("%s: /format_version: %d, this build reads version %d%s", path, version, CHECKPOINT_VERSION,
                       version == 1 ? " (version 1 checkpoints carry no checksums; retrain, or load it with the "
                                      "build that wrote it)"
                                    : "");
    if (!s.ok) h5io_close(hf);
    return s;
}

static Status param_path(const Tensor *p, char *out, size_t n) {
    if (snprintf(out, n, "/params/%s", p->name) >= (int)n) return status_err("parameter name '%s' too long", p->name);
    return status_ok();
}

static Status check_param(const H5ioFile *hf, const Tensor *p, H5ioInfo *info) {
    char full[600];
    Status s = param_path(p, full, sizeof full);
    if (!s.ok) return s;
    hsize_t dims[TENSOR_MAX_DIMS];
    for (int k = 0; k < p->ndim; k++) dims[k] = (hsize_t)p->shape[k];
    s = h5io_check(hf, full, F32, p->ndim, dims, p->numel, info);
    char *e = s.ok ? NULL : strstr(s.msg, " in the file, ");
    if (e && (e = strstr(e, " expected")))   // a shape mismatch: say which side is which
        snprintf(e, sizeof s.msg - (size_t)(e - s.msg), " in the model");
    return s;
}

static void list_add(char *out, size_t n, int *count, const char *name) {
    size_t used = strlen(out);
    if (used + strlen(name) + 6 < n) snprintf(out + used, n - used, "%s%s", *count ? ", " : "", name);
    else if (used + 4 < n && !strstr(out, "...")) strcat(out, "...");
    (*count)++;
}

// Names of the datasets in /params that ps lacks, as a comma list; returns the count.
static int unused_params(const H5ioFile *hf, const ParamStore *ps, char *out, size_t n) {
    out[0] = 0;
    if (!h5io_exists(hf, "/params", NULL)) return 0;
    int count = 0;
    const char *name;
    for (int i = 0; (name = h5io_child(hf, "/params", i)); i++)
        if (!params_find(ps, name)) list_add(out, n, &count, name);
    return count;
}

static Status check_params(const H5ioFile *hf, const ParamStore *ps, ParamsLoadReport *rep) {
    if (rep) memset(rep, 0, sizeof *rep);
    Status s = status_ok();
    for (int i = 0; s.ok && i < ps->n; i++) {
        const Tensor *p = ps->params[i];
        char full[600];
        s = param_path(p, full, sizeof full);
        if (s.ok && rep && !h5io_exists(hf, full, &s)) {
            if (s.ok) list_add(rep->missing, sizeof rep->missing, &rep->n_missing, p->name);
            continue;
        }
        H5ioInfo info;
        if (s.ok) s = check_param(hf, p, &info);
    }
    if (!s.ok) return s;
    char unused[1024];
    int n_unused = unused_params(hf, ps, unused, sizeof unused);
    if (rep) {
        rep->n_unused = n_unused;
        snprintf(rep->unused, sizeof rep->unused, "%s", unused);
    } else if (n_unused) {
        return status_err("%s: /params: %d parameter(s) the model lacks: %s (a different model config?)", hf->path,
                          n_unused, unused);
    }
    return status_ok();
}

Status checkpoint_check_params(const char *path, const ParamStore *ps, ParamsLoadReport *rep) {
    H5ioFile hf;
    Status s = open_checkpoint(&hf, path);
    if (!s.ok) return s;
    s = check_params(&hf, ps, rep);
    h5io_close(&hf);
    return s;
}

// Read a float32 dataset checked as n elements into dst (converted to real),
// then check every value: finite, and >= 0 when nonneg.
static Status read_reals(const H5ioFile *hf, const char *name, int64_t n, real *dst, bool nonneg) {
    H5ioInfo info;   // the caller checked the shape; this gives the info for reading
    Status s = h5io_check(hf, name, F32, -1, NULL, n, &info);
    if (!s.ok) return s;
    if (info.numel != n)
        return status_err("%s: %s: %lld elements, %lld expected", hf->path, name, (long long)info.numel, (long long)n);
    float *raw = sizeof(real) == sizeof(float) ? (float *)dst : xmalloc((size_t)(n ? n : 1) * sizeof(float));
    s = h5io_read(hf, name, &info, raw);
    for (int64_t i = 0; s.ok && i < n; i++) {
        float x = raw[i];
        if (!isfinite(x) || (nonneg && x < 0))
            s = status_err("%s: %s: element %lld is %g (%s)", hf->path, name, (long long)i, (double)x,
                           isfinite(x) ? "a second moment must not be negative" : "not a finite number");
        else if ((void *)raw != (void *)dst)
            dst[i] = (real)x;
    }
    if ((void *)raw != (void *)dst) free(raw);
    return s;
}

// Read a small integer dataset of exactly n elements (its type among `types`).
static Status read_ints(const H5ioFile *hf, const char *name, unsigned types, int n, void *out) {
    H5ioInfo info;
    Status s = h5io_check(hf, name, types, 1, (hsize_t[]){(hsize_t)n}, n, &info);
    return s.ok ? h5io_read(hf, name, &info, out) : s;
}

static bool all_zero(const uint64_t *w, int n) {
    for (int i = 0; i < n; i++)
        if (w[i]) return false;
    return true;
}

static Status read_config(const H5ioFile *hf, char **text) {
    *text = NULL;
    H5ioInfo info;
    Status s = h5io_check(hf, "/config", 1u << H5IO_STRING, 0, NULL, CHECKPOINT_CONFIG_MAX, &info);
    if (!s.ok) return s;
    char *buf = xmalloc(info.elem_size + 1);
    s = h5io_read(hf, "/config", &info, buf);
    buf[info.elem_size] = 0;
    size_t len = strlen(buf);
    for (size_t i = len; s.ok && i < info.elem_size; i++)
        if (buf[i]) s = status_err("%s: /config: holds a NUL byte inside the text", hf->path);
    if (!s.ok) {
        free(buf);
        return s;
    }
    *text = buf;
    return s;
}

static Status read_state(const H5ioFile *hf, CheckpointState *st) {
    uint64_t words[SAMPLER_STATE_WORDS];
    CheckpointState tmp = {0};
    Status s = read_ints(hf, "/state/step", 1u << H5IO_I64, 1, &tmp.step);
    if (s.ok) s = read_ints(hf, "/state/sampler", 1u << H5IO_U64, SAMPLER_STATE_WORDS, words);
    if (s.ok) s = read_ints(hf, "/state/model_rng", 1u << H5IO_U64, 4, tmp.model_rng.s);
    if (!s.ok) return s;
    if (tmp.step < 0 || tmp.step > CHECKPOINT_STEP_MAX)
        return status_err("%s: /state/step: %lld is not a step count", hf->path, (long long)tmp.step);
    if (all_zero(words, 4) || (int64_t)words[4] < 0)
        return status_err("%s: /state/sampler: not a sampler state (zero generator or negative count)", hf->path);
    if (all_zero(tmp.model_rng.s, 4)) return status_err("%s: /state/model_rng: an all-zero generator state", hf->path);
    sampler_state_unpack(&tmp.sampler, words);
    s = read_config(hf, &tmp.config_text);
    if (s.ok) *st = tmp;
    return s;
}

// Read every parameter of ps the file holds into `stage` (ps->numel reals, at
// ps's offsets); present[i] says which.
static Status read_params(const H5ioFile *hf, const ParamStore *ps, real *stage, bool *present) {
    Status s = status_ok();
    for (int i = 0; s.ok && i < ps->n; i++) {
        const Tensor *p = ps->params[i];
        char full[600];
        s = param_path(p, full, sizeof full);
        present[i] = s.ok && h5io_exists(hf, full, NULL);
        if (present[i]) s = read_reals(hf, full, p->numel, stage + ps->offsets[i], false);
    }
    return s;
}

static Status check_optim(const H5ioFile *hf, const ParamStore *ps, const Optimizer *opt) {
    char kind[32];
    if (!h5io_exists(hf, "/optim", NULL)) return status_err("%s: /optim: missing (saved without optimizer state)", hf->path);
    Status s = h5io_read_attr_string(hf, "/optim", "kind", kind, sizeof kind);
    if (s.ok && strcmp(kind, optim_name(opt->kind)) != 0)
        s = status_err("%s: /optim: state of optimizer '%s', the run uses '%s'", hf->path, kind, optim_name(opt->kind));
    H5ioInfo info;
    hsize_t n = (hsize_t)ps->numel;
    if (s.ok) s = h5io_check(hf, "/optim/m", F32, 1, &n, ps->numel, &info);
    if (s.ok && opt->v) s = h5io_check(hf, "/optim/v", F32, 1, &n, ps->numel, &info);
    if (s.ok) s = h5io_check(hf, "/optim/step", 1u << H5IO_I64, 1, (hsize_t[]){1}, 1, &info);
    return s;
}

Status checkpoint_load(const char *path, ParamStore *ps, Optimizer *opt, CheckpointState *st) {
    ASSERT(ps->finalized, "checkpoint_load before params_finalize");
    H5ioFile hf;
    Status s = open_checkpoint(&hf, path);
    if (!s.ok) return s;
    // 1. Check every dataset's metadata, then read and check every value into
    //    staging memory: the gradient block for the parameters (it is zeroed
    //    after), temporary blocks for the moments.
    s = check_params(&hf, ps, NULL);
    if (s.ok && opt) s = check_optim(&hf, ps, opt);
    CheckpointState tmp = {0};
    if (s.ok && st) s = read_state(&hf, &tmp);
    bool *present = xcalloc((size_t)(ps->n ? ps->n : 1), sizeof *present);
    if (s.ok) s = read_params(&hf, ps, ps->grad, present);
    real *m = NULL, *v = NULL;
    int64_t opt_step = 0;
    if (s.ok && opt) {
        m = xmalloc((size_t)(ps->numel ? ps->numel : 1) * sizeof(real));
        s = read_reals(&hf, "/optim/m", ps->numel, m, false);
        if (s.ok && opt->v) {
            v = xmalloc((size_t)(ps->numel ? ps->numel : 1) * sizeof(real));
            s = read_reals(&hf, "/optim/v", ps->numel, v, true);
        }
        if (s.ok) s = read_ints(&hf, "/optim/step", 1u << H5IO_I64, 1, &opt_step);
        if (s.ok && (opt_step < 0 || opt_step > CHECKPOINT_STEP_MAX))
            s = status_err("%s: /optim/step: %lld is not a step count", path, (long long)opt_step);
    }
    // 2. Everything checked: change the model.
    if (s.ok) {
        memcpy(ps->data, ps->grad, (size_t)ps->numel * sizeof(real));
        if (opt) {   // a sharded optimizer keeps its slice
            size_t bytes = (size_t)(opt->hi - opt->lo) * sizeof(real);
            memcpy(opt->m, m + opt->lo, bytes);
            if (opt->v) memcpy(opt->v, v + opt->lo, bytes);
            opt->step = opt_step;
        }
        if (st) *st = tmp;
    } else {
        free(tmp.config_text);
    }
    params_zero_grad(ps);
    free(present);
    free(m);
    free(v);
    h5io_close(&hf);
    return s;
}

Status checkpoint_load_carry(const char *path, double *out, int64_t rows, int64_t row) {
    H5ioFile hf;
    Status s = open_checkpoint(&hf, path);
    if (!s.ok) return s;
    H5ioInfo info;
    if (!h5io_exists(&hf, "/state/carry", &s))
        s = s.ok ? status_err("%s: /state/carry: missing (the run was saved without carry_state)", path) : s;
    else
        s = h5io_check(&hf, "/state/carry", 1u << H5IO_F64, 2, (hsize_t[]){(hsize_t)rows, (hsize_t)row},
                       rows * row, &info);
    if (s.ok) s = h5io_read(&hf, "/state/carry", &info, out);
    for (int64_t i = 0; s.ok && i < rows * row; i++)
        if (!isfinite(out[i])) s = status_err("%s: /state/carry: element %lld is not finite", path, (long long)i);
    h5io_close(&hf);
    return s;
}

Status checkpoint_load_params(const char *path, ParamStore *ps, ParamsLoadReport *rep) {
    ASSERT(ps->finalized, "checkpoint_load_params before params_finalize");
    H5ioFile hf;
    Status s = open_checkpoint(&hf, path);
    if (!s.ok) {
        memset(rep, 0, sizeof *rep);
        return s;
    }
    s = check_params(&hf, ps, rep);
    bool *present = xcalloc((size_t)(ps->n ? ps->n : 1), sizeof *present);
    if (s.ok) s = read_params(&hf, ps, ps->grad, present);
    for (int i = 0; s.ok && i < ps->n; i++) {
        if (!present[i]) continue;
        const Tensor *p = ps->params[i];
        memcpy(ps->data + ps->offsets[i], ps->grad + ps->offsets[i], (size_t)p->numel * sizeof(real));
        rep->n_loaded++;
    }
    params_zero_grad(ps);
    free(present);
    h5io_close(&hf);
    return s;
}

Status checkpoint_read_tokenizer(const char *path, Tokenizer *t) {
    tokenizer_bytes(t);
    H5ioFile hf;
    Status s = open_checkpoint(&hf, path);
    if (!s.ok) return s;
    if (h5io_exists(&hf, "/tokenizer", &s)) {
        H5ioInfo info;
        s = h5io_check(&hf, "/tokenizer", 1u << H5IO_U8, 1, NULL, BPE_FILE_MAX, &info);
        uint8_t *buf = s.ok ? xmalloc((size_t)info.numel + 1) : NULL;
        if (s.ok) s = h5io_read(&hf, "/tokenizer", &info, buf);
        char what[600];
        snprintf(what, sizeof what, "%s: /tokenizer", path);
        if (s.ok) s = tokenizer_from_buffer(t, buf, (size_t)info.numel, what);
        free(buf);
    }
    h5io_close(&hf);
    return s;
}

Status checkpoint_read_config(const char *path, char **text) {
    *text = NULL;
    H5ioFile hf;
    Status s = open_checkpoint(&hf, path);
    if (!s.ok) return s;
    s = read_config(&hf, text);
    h5io_close(&hf);
    return s;
}

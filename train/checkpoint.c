// checkpoint.c: HDF5 checkpoints (format in checkpoint.h and docs/checkpoint.md).
#include "checkpoint.h"

#include <errno.h>
#include <fcntl.h>
#include <hdf5.h>
#include <hdf5_hl.h>
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef AG_DOUBLE
#define H5T_NATIVE_REAL H5T_NATIVE_DOUBLE
#else
#define H5T_NATIVE_REAL H5T_NATIVE_FLOAT
#endif

// ---------------------------------------------------------------- writing

// A float32 dataset of `rank` dims from real data (HDF5 converts in a float64 build).
static bool write_real(hid_t loc, const char *name, int rank, const hsize_t *dims, const real *data) {
    hid_t space = H5Screate_simple(rank, dims, NULL);
    hid_t d = H5Dcreate2(loc, name, H5T_IEEE_F32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    bool ok = space >= 0 && d >= 0 && H5Dwrite(d, H5T_NATIVE_REAL, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) >= 0;
    if (d >= 0) H5Dclose(d);
    if (space >= 0) H5Sclose(space);
    return ok;
}

static bool write_i64(hid_t loc, const char *name, int64_t x) {
    hsize_t one = 1;
    return H5LTmake_dataset(loc, name, 1, &one, H5T_STD_I64LE, &x) >= 0;
}

static bool write_u64s(hid_t loc, const char *name, const uint64_t *x, hsize_t n) {
    return H5LTmake_dataset(loc, name, 1, &n, H5T_STD_U64LE, x) >= 0;
}

static bool write_contents(hid_t f, const ParamStore *ps, const Optimizer *opt, const CheckpointState *st) {
    int version = CHECKPOINT_VERSION;
    hsize_t one = 1;
    if (H5LTmake_dataset(f, "/format_version", 1, &one, H5T_STD_I32LE, &version) < 0) return false;
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
    ok = write_i64(g, "step", st->step) && write_u64s(g, "sampler", words, SAMPLER_STATE_WORDS) &&
         write_u64s(g, "model_rng", st->model_rng.s, 4);
    H5Gclose(g);
    return ok && H5LTmake_dataset_string(f, "/config", st->config_text ? st->config_text : "") >= 0;
}

// fsync a file or directory by path.
static bool sync_path(const char *path, bool dir) {
    int fd = open(path, dir ? O_RDONLY | O_DIRECTORY : O_RDONLY);
    if (fd < 0) return false;
    bool ok = fsync(fd) == 0;
    close(fd);
    return ok;
}

Status checkpoint_save(const char *path, const ParamStore *ps, const Optimizer *opt, const CheckpointState *st) {
    ASSERT(ps->finalized, "checkpoint_save before params_finalize");
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    hid_t f = H5Fcreate(tmp, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    if (f < 0) return status_err("%s: cannot create checkpoint file: %s", tmp, strerror(errno));
    bool ok = write_contents(f, ps, opt, st);
    ok = H5Fflush(f, H5F_SCOPE_GLOBAL) >= 0 && ok;
    ok = H5Fclose(f) >= 0 && ok;
    if (!ok) {
        unlink(tmp);
        return status_err("%s: writing the checkpoint failed (disk full?)", tmp);
    }
    if (!sync_path(tmp, false)) {
        Status s = status_err("%s: fsync failed: %s", tmp, strerror(errno));
        unlink(tmp);
        return s;
    }
    if (rename(tmp, path) != 0) {
        Status s = status_err("%s: cannot rename %s into place: %s", path, tmp, strerror(errno));
        unlink(tmp);
        return s;
    }
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    sync_path(dirname(dir), true);   // make the rename durable; best effort
    return status_ok();
}

// ---------------------------------------------------------------- reading

static Status open_checkpoint(const char *path, hid_t *f) {
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    if (access(path, R_OK) != 0) return status_err("%s: cannot open checkpoint: %s", path, strerror(errno));
#if H5_VERSION_GE(1, 12, 0)
    htri_t is_hdf5 = H5Fis_accessible(path, H5P_DEFAULT);
#else
    htri_t is_hdf5 = H5Fis_hdf5(path);
#endif
    if (is_hdf5 <= 0) return status_err("%s: not an HDF5 file", path);
    *f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (*f < 0) return status_err("%s: cannot open as HDF5 (truncated or corrupt?)", path);
    int version = 0;
    if (H5Lexists(*f, "format_version", H5P_DEFAULT) <= 0 ||
        H5LTread_dataset(*f, "/format_version", H5T_NATIVE_INT, &version) < 0) {
        H5Fclose(*f);
        return status_err("%s: /format_version: missing (not a checkpoint?)", path);
    }
    if (version != CHECKPOINT_VERSION) {
        H5Fclose(*f);
        return status_err("%s: /format_version: %d, this build reads version %d", path, version, CHECKPOINT_VERSION);
    }
    return status_ok();
}

// Does /group/name exist? (group checked first: H5Lexists needs every parent.)
static bool exists(hid_t f, const char *group, const char *name) {
    if (H5Lexists(f, group, H5P_DEFAULT) <= 0) return false;
    char full[1024];
    snprintf(full, sizeof full, "%s/%s", group, name);
    return H5Lexists(f, full, H5P_DEFAULT) > 0;
}

static const char *dims_str(int rank, const hsize_t *d, char *buf, size_t n) {
    size_t u = (size_t)snprintf(buf, n, "(");
    for (int k = 0; k < rank && u < n; k++) u += (size_t)snprintf(buf + u, n - u, "%s%llu", k ? ", " : "", (unsigned long long)d[k]);
    if (u < n) snprintf(buf + u, n - u, ")");
    return buf;
}

// Check that float dataset `full` exists with the expected shape.
static Status check_dataset(hid_t f, const char *path, const char *group, const char *name, int rank,
                            const hsize_t *want) {
    char full[1024];
    snprintf(full, sizeof full, "%s/%s", group, name);
    if (!exists(f, group, name)) return status_err("%s: %s: missing", path, full);
    int frank = -1;
    hsize_t dims[8];
    H5T_class_t cls;
    size_t size;
    if (H5LTget_dataset_ndims(f, full, &frank) < 0 || frank > 8 || H5LTget_dataset_info(f, full, dims, &cls, &size) < 0)
        return status_err("%s: %s: unreadable (corrupt file?)", path, full);
    if (cls != H5T_FLOAT && cls != H5T_INTEGER) return status_err("%s: %s: not a numeric dataset", path, full);
    bool same = frank == rank;
    for (int k = 0; same && k < rank; k++) same = dims[k] == want[k];
    if (!same) {
        char a[96], b[96];
        return status_err("%s: %s: shape %s in the file, %s in the model", path, full, dims_str(frank, dims, a, sizeof a),
                          dims_str(rank, want, b, sizeof b));
    }
    return status_ok();
}

static Status read_into(hid_t f, const char *path, const char *full, hid_t memtype, void *buf) {
    hid_t d = H5Dopen2(f, full, H5P_DEFAULT);
    herr_t e = d >= 0 ? H5Dread(d, memtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) : -1;
    if (d >= 0) H5Dclose(d);
    return e < 0 ? status_err("%s: %s: read failed (truncated or corrupt file?)", path, full) : status_ok();
}

static Status check_param(hid_t f, const char *path, const Tensor *p) {
    hsize_t dims[TENSOR_MAX_DIMS];
    for (int k = 0; k < p->ndim; k++) dims[k] = (hsize_t)p->shape[k];
    return check_dataset(f, path, "/params", p->name, p->ndim, dims);
}

static Status read_param(hid_t f, const char *path, const Tensor *p) {
    char full[1024];
    snprintf(full, sizeof full, "/params/%s", p->name);
    return read_into(f, path, full, H5T_NATIVE_REAL, p->data);
}

// Names of the datasets in /params that ps lacks, as a comma list; returns the count.
static int unused_params(hid_t f, const ParamStore *ps, char *out, size_t n) {
    out[0] = 0;
    hid_t g = H5Gopen2(f, "/params", H5P_DEFAULT);
    if (g < 0) return 0;
    H5G_info_t info;
    int count = 0;
    size_t used = 0;
    if (H5Gget_info(g, &info) >= 0)
        for (hsize_t i = 0; i < info.nlinks; i++) {
            char name[512];
            if (H5Lget_name_by_idx(g, ".", H5_INDEX_NAME, H5_ITER_INC, i, name, sizeof name, H5P_DEFAULT) < 0) continue;
            if (params_find(ps, name)) continue;
            if (used < n) used += (size_t)snprintf(out + used, n - used, "%s%s", count ? ", " : "", name);
            count++;
        }
    H5Gclose(g);
    if (used >= n && n > 4) strcpy(out + n - 4, "...");
    return count;
}

static Status read_state(hid_t f, const char *path, CheckpointState *st) {
    hsize_t one = 1, sw = SAMPLER_STATE_WORDS, rw = 4;
    Status s = check_dataset(f, path, "/state", "step", 1, &one);
    if (s.ok) s = check_dataset(f, path, "/state", "sampler", 1, &sw);
    if (s.ok) s = check_dataset(f, path, "/state", "model_rng", 1, &rw);
    if (!s.ok) return s;
    char *text = NULL;
    s = checkpoint_read_config(path, &text);   // reopens by path; small
    if (!s.ok) return s;
    uint64_t words[SAMPLER_STATE_WORDS];
    CheckpointState tmp = {0};
    s = read_into(f, path, "/state/step", H5T_NATIVE_INT64, &tmp.step);
    if (s.ok) s = read_into(f, path, "/state/sampler", H5T_NATIVE_UINT64, words);
    if (s.ok) s = read_into(f, path, "/state/model_rng", H5T_NATIVE_UINT64, tmp.model_rng.s);
    if (!s.ok) {
        free(text);
        return s;
    }
    sampler_state_unpack(&tmp.sampler, words);
    tmp.config_text = text;
    *st = tmp;
    return s;
}

Status checkpoint_load(const char *path, ParamStore *ps, Optimizer *opt, CheckpointState *st) {
    ASSERT(ps->finalized, "checkpoint_load before params_finalize");
    hid_t f;
    Status s = open_checkpoint(path, &f);
    if (!s.ok) return s;
    // 1. Check everything.
    for (int i = 0; s.ok && i < ps->n; i++) s = check_param(f, path, ps->params[i]);
    char unused[1024];
    int n_unused = s.ok ? unused_params(f, ps, unused, sizeof unused) : 0;
    if (s.ok && n_unused)
        s = status_err("%s: /params: %d parameter(s) the model lacks: %s (a different model config?)", path, n_unused,
                       unused);
    if (s.ok && opt) {
        char kind[32] = "";
        hsize_t n = (hsize_t)ps->numel, one = 1;
        if (H5Lexists(f, "optim", H5P_DEFAULT) <= 0)
            s = status_err("%s: /optim: missing (saved without optimizer state)", path);
        else if (H5LTget_attribute_string(f, "/optim", "kind", kind) < 0 || strcmp(kind, optim_name(opt->kind)))
            s = status_err("%s: /optim: state of optimizer '%s', the run uses '%s'", path, kind, optim_name(opt->kind));
        if (s.ok) s = check_dataset(f, path, "/optim", "m", 1, &n);
        if (s.ok && opt->v) s = check_dataset(f, path, "/optim", "v", 1, &n);
        if (s.ok) s = check_dataset(f, path, "/optim", "step", 1, &one);
    }
    // 2. Read the state first (it allocates), then overwrite parameters and moments.
    CheckpointState tmp = {0};
    if (s.ok && st) s = read_state(f, path, &tmp);
    for (int i = 0; s.ok && i < ps->n; i++) s = read_param(f, path, ps->params[i]);
    if (s.ok && opt) {
        s = read_into(f, path, "/optim/m", H5T_NATIVE_REAL, opt->m);
        if (s.ok && opt->v) s = read_into(f, path, "/optim/v", H5T_NATIVE_REAL, opt->v);
        if (s.ok) s = read_into(f, path, "/optim/step", H5T_NATIVE_INT64, &opt->step);
    }
    if (st) {
        if (s.ok) *st = tmp;
        else if (tmp.config_text) free(tmp.config_text);
    }
    H5Fclose(f);
    return s;
}

Status checkpoint_load_params(const char *path, ParamStore *ps, ParamsLoadReport *rep) {
    ASSERT(ps->finalized, "checkpoint_load_params before params_finalize");
    memset(rep, 0, sizeof *rep);
    hid_t f;
    Status s = open_checkpoint(path, &f);
    if (!s.ok) return s;
    size_t used = 0;
    for (int i = 0; s.ok && i < ps->n; i++) {
        const Tensor *p = ps->params[i];
        if (!exists(f, "/params", p->name)) {
            if (used < sizeof rep->missing)
                used += (size_t)snprintf(rep->missing + used, sizeof rep->missing - used, "%s%s",
                                         rep->n_missing ? ", " : "", p->name);
            rep->n_missing++;
            continue;
        }
        s = check_param(f, path, p);
    }
    if (used >= sizeof rep->missing) strcpy(rep->missing + sizeof rep->missing - 4, "...");
    if (s.ok) rep->n_unused = unused_params(f, ps, rep->unused, sizeof rep->unused);
    for (int i = 0; s.ok && i < ps->n; i++) {
        if (!exists(f, "/params", ps->params[i]->name)) continue;
        s = read_param(f, path, ps->params[i]);
        rep->n_loaded += s.ok;
    }
    H5Fclose(f);
    return s;
}

Status checkpoint_read_config(const char *path, char **text) {
    *text = NULL;
    hid_t f;
    Status s = open_checkpoint(path, &f);
    if (!s.ok) return s;
    H5T_class_t cls;
    size_t size = 0;
    hsize_t dims[1] = {0};
    if (H5Lexists(f, "config", H5P_DEFAULT) <= 0) s = status_err("%s: /config: missing", path);
    else if (H5LTget_dataset_info(f, "/config", dims, &cls, &size) < 0 || cls != H5T_STRING)
        s = status_err("%s: /config: not a string", path);
    if (s.ok) {
        char *buf = xmalloc(size + 1);
        if (H5LTread_dataset_string(f, "/config", buf) < 0) {
            free(buf);
            s = status_err("%s: /config: read failed", path);
        } else {
            buf[size] = 0;
            *text = buf;
        }
    }
    H5Fclose(f);
    return s;
}

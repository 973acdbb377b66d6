#include "dump_state.h"

#include <hdf5.h>
#include <hdf5_hl.h>
#include <stdio.h>
#include <stdlib.h>

static herr_t put_reals(hid_t loc, const char *name, int ndim, const int *shape, const real *data, int64_t n) {
    hsize_t dims[TENSOR_MAX_DIMS];
    for (int i = 0; i < ndim; i++) dims[i] = (hsize_t)shape[i];
    float *tmp = xmalloc((size_t)(n ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++) tmp[i] = (float)data[i];
    herr_t e = H5LTmake_dataset_float(loc, name, ndim, dims, tmp);
    free(tmp);
    return e;
}

// The [model] section of the config as INI text that config_load_string
// reads back (the LM's settings; vocabulary size = the embedding's rows).
static char *model_ini(const LM *lm) {
    const LMConfig *c = &lm->cfg;
    const MixerConfig *m = &c->mixer;
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    ASSERT(f, "dump_state: open_memstream failed");
    fprintf(f, "[model]\nlayers = ");
    for (int l = 0; l < c->n_layers; l++) fprintf(f, "%s%s", l ? "," : "", c->layers[l]);
    fprintf(f,
            "\nd_model = %d\nn_heads = %d\nd_k = %d\nd_v = %d\nd_ff = %d\ntied_embeddings = %s\n"
            "chunk_size = %d\nconv_size = %d\nnorm_eps = %.17g\nrope_base = %.17g\nindex_heads = %d\n"
            "index_dim = %d\ntopk = %d\nform = %s\n",
            c->d_model, m->n_heads, m->d_k, m->d_v, c->d_ff, c->tied ? "true" : "false", m->chunk_size,
            m->conv_size, c->norm_eps, m->rope_base, m->index_heads, m->index_dim, m->topk, mixer_form_name(m->form));
    fclose(f);
    return text;
}

Status dump_state_write(const char *path, Tape *tp, LM *lm, ParamStore *ps, const int *x, const int *y, int B,
                        int T) {
    params_zero_grad(ps);
    Tensor *logits = NULL;
    Tensor *loss = lm_loss(tp, lm, x, y, B, T, &logits);
    tape_backward(tp, loss);

    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    if (f < 0) return status_err("cannot create '%s'", path);
    hsize_t bt[2] = {(hsize_t)B, (hsize_t)T};
    herr_t e = 0;
    e |= H5LTmake_dataset_int(f, "/tokens", 2, bt, x);
    e |= H5LTmake_dataset_int(f, "/targets", 2, bt, y);
    e |= put_reals(f, "/logits", 3, logits->shape, logits->data, logits->numel);
    e |= put_reals(f, "/loss", 1, (int[]){1}, loss->data, 1);
    hid_t gp = H5Gcreate2(f, "params", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    hid_t gg = H5Gcreate2(f, "grads", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    for (int i = 0; i < ps->n; i++) {
        Tensor *p = ps->params[i];
        e |= put_reals(gp, p->name, p->ndim, p->shape, p->data, p->numel);
        const real *g = ps->grad + ps->offsets[i];
        e |= put_reals(gg, p->name, p->ndim, p->shape, g, p->numel);
    }
    H5Gclose(gp);
    H5Gclose(gg);
    char *ini = model_ini(lm);
    e |= H5LTset_attribute_string(f, "/", "config", ini);
    free(ini);
    H5Fclose(f);
    tape_reset(tp);
    if (e < 0) return status_err("writing '%s' failed", path);
    return status_ok();
}

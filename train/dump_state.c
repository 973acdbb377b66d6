#include "dump_state.h"

#include <hdf5.h>
#include <hdf5_hl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "h5io.h"

// Reals in the build's precision (float64 in the float64 build), so an
// independent float64 reference can check them to 1e-9 and below.
static herr_t put_reals(hid_t loc, const char *name, int ndim, const int *shape, const real *data) {
    hsize_t dims[TENSOR_MAX_DIMS];
    for (int i = 0; i < ndim; i++) dims[i] = (hsize_t)shape[i];
#ifdef AG_DOUBLE
    return H5LTmake_dataset_double(loc, name, ndim, dims, data);
#else
    return H5LTmake_dataset_float(loc, name, ndim, dims, data);
#endif
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
    // attn's options only when on: the dump of a model without them reads as it always did.
    if (m->qk_norm) fprintf(f, "qk_norm = true\n");
    if (m->attn_gate) fprintf(f, "attn_gate = true\n");
    if (m->gdp_steps != 2) fprintf(f, "gdp_steps = %d\n", m->gdp_steps);   // else its default (or no gdp layer)
    if (!m->kda_gate_bias) fprintf(f, "kda_gate_bias = false\n");           // likewise
    fclose(f);
    return text;
}

#define DUMP_CARRY_MAX (4 * LM_MAX_LAYERS)   // as the trainer's DUMP_CARRY_MAX: conv and state per layer

// The carried states before the forward (the forward leaves its final states
// in the carry): copies of each buffer, in lm_carry_buffers order.
static int copy_carry(LM *lm, LMCache *carry, real **copies, int64_t *sizes) {
    if (!carry) return 0;
    real *bufs[DUMP_CARRY_MAX];
    int n = lm_carry_buffers(lm, carry, bufs, sizes, DUMP_CARRY_MAX);
    for (int i = 0; i < n; i++) {
        copies[i] = xmalloc((size_t)(sizes[i] ? sizes[i] : 1) * sizeof(real));
        memcpy(copies[i], bufs[i], (size_t)sizes[i] * sizeof(real));
    }
    return n;
}

// /doc_start and /initial_state/<i>: what the step started from besides the tokens.
static herr_t put_start(hid_t f, const int *doc, int B, int T, real *const *init, const int64_t *sizes, int n_init) {
    herr_t e = 0;
    if (doc) e |= H5LTmake_dataset_int(f, "/doc_start", 2, (hsize_t[]){(hsize_t)B, (hsize_t)T}, doc);
    if (n_init == 0) return e;
    hid_t g = H5Gcreate2(f, "initial_state", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    for (int i = 0; i < n_init; i++) {
        char name[32];
        snprintf(name, sizeof name, "%d", i);
        e |= put_reals(g, name, 1, (int[]){(int)sizes[i]}, init[i]);
    }
    return e | (H5Gclose(g) < 0 ? -1 : 0);
}

Status dump_state_write(const char *path, Tape *tp, LM *lm, ParamStore *ps, const DumpBatch *b) {
    const int *x = b->x, *y = b->y, *doc = b->doc;
    int B = b->B, T = b->T;
    params_zero_grad(ps);
    real *init[DUMP_CARRY_MAX];
    int64_t sizes[DUMP_CARRY_MAX];
    int n_init = copy_carry(lm, b->carry, init, sizes);
    Tensor *logits = NULL;
    // The loss the training step computes: documents restart every layer, a carry starts from its states.
    Tensor *loss = b->distill ? lm_distill_loss_docs(tp, lm, x, doc, B, T)
                   : b->carry ? lm_loss_carry(tp, lm, x, y, doc, B, T, b->carry, &logits)
                              : lm_loss_docs(tp, lm, x, y, doc, B, T, &logits);
    tape_backward(tp, loss);

    // Built in memory, then written whole over path (h5io_commit: never
    // through a link or onto a device, and nothing half-written left).
    hid_t f = h5io_create_memory();
    if (f < 0) {
        tape_reset(tp);
        for (int i = 0; i < n_init; i++) free(init[i]);
        return status_err("%s: cannot create the state dump in memory", path);
    }
    hsize_t bt[2] = {(hsize_t)B, (hsize_t)T};
    herr_t e = 0;
    e |= H5LTmake_dataset_int(f, "/tokens", 2, bt, x);
    e |= H5LTmake_dataset_int(f, "/targets", 2, bt, y);
    if (logits) e |= put_reals(f, "/logits", 3, logits->shape, logits->data);
    e |= put_reals(f, "/loss", 1, (int[]){1}, loss->data);
    e |= put_start(f, doc, B, T, init, sizes, n_init);
    for (int i = 0; i < n_init; i++) free(init[i]);
    hid_t gp = H5Gcreate2(f, "params", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    hid_t gg = H5Gcreate2(f, "grads", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    for (int i = 0; i < ps->n; i++) {
        Tensor *p = ps->params[i];
        e |= put_reals(gp, p->name, p->ndim, p->shape, p->data);
        if (p->requires_grad) e |= put_reals(gg, p->name, p->ndim, p->shape, ps->grad + ps->offsets[i]);
    }
    H5Gclose(gp);
    H5Gclose(gg);
    char *ini = model_ini(lm);
    e |= H5LTset_attribute_string(f, "/", "config", ini);
    e |= H5LTset_attribute_string(f, "/", "objective", b->distill ? "distill" : "lm");
    e |= H5LTset_attribute_string(f, "/", "precision", REAL_NAME);
    e |= H5LTset_attribute_int(f, "/", "vocab_size", &lm->cfg.vocab_size, 1);
    free(ini);
    tape_reset(tp);
    if (e < 0) {
        H5Fclose(f);
        return status_err("%s: building the state dump failed", path);
    }
    return h5io_commit(f, path, "state dump");
}

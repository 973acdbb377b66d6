#include "dump_state.h"

#include <hdf5.h>
#include <hdf5_hl.h>
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
    H5Fclose(f);
    tape_reset(tp);
    if (e < 0) return status_err("writing '%s' failed", path);
    return status_ok();
}

#include "model_setup.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "blas.h"
#include "checkpoint.h"
#include "tile_amx.h"
#include "tokenizer.h"

bool model_mixer_known(const char *name) { return mixer_kind_find(name) != NULL; }

Status model_build(const TrainConfig *tc, LM *lm, ParamStore *ps, const char *ckpt) {
    LMConfig lc;
    Status s = config_model(tc, &lc);
    if (!s.ok) return s;
    params_init(ps);
    lm_create(lm, &lc, ps);
    // The parameters are registered but not allocated: a checkpoint that does
    // not hold this model is refused before its config can make us allocate.
    if (ckpt) s = checkpoint_check_params(ckpt, ps, NULL);
    if (!s.ok) {
        lm_destroy(lm);
        params_free(ps);
        return s;
    }
    params_finalize(ps, (uint64_t)tc->train.seed);
    return status_ok();
}

Status model_load_checkpoint(const char *ckpt, TrainConfig *cfg, LM *lm, ParamStore *ps, Tokenizer *tok) {
    char *text = NULL;
    config_defaults(cfg, model_mixer_known);
    memset(lm, 0, sizeof *lm);
    params_init(ps);
    Tokenizer own;
    if (!tok) tok = &own;
    Status s = checkpoint_read_tokenizer(ckpt, tok);   // the vocabulary: the embedding's rows
    if (s.ok) s = checkpoint_read_config(ckpt, &text);
    if (s.ok) s = config_load_string(cfg, text, ckpt);
    free(text);
    cfg->vocab_size = tok->vocab;
    if (s.ok) s = config_validate(cfg);
    if (s.ok) s = model_build(cfg, lm, ps, ckpt);
    if (s.ok) s = checkpoint_load(ckpt, ps, NULL, NULL);
    if (!s.ok && ps->finalized) {
        lm_destroy(lm);
        params_free(ps);
    }
    if (!s.ok || tok == &own) tokenizer_free(tok);
    return s;
}

double model_val_bytes_per_token(const Batcher *bt, const Tokenizer *tok, int n_batches, int *x, int *y) {
    int64_t bytes = 0, count = 0;
    for (int i = 0; i < n_batches; i++) {
        batcher_val(bt, i, x, y, NULL);
        for (int64_t j = 0; j < (int64_t)batcher_share(bt) * bt->T; j++) {
            bytes += tokenizer_token_len(tok, y[j]);
            count++;
        }
    }
    return count ? (double)bytes / (double)count : 1.0;
}

void model_init_process(char **argv) {
    if (getenv("OMP_WAIT_POLICY")) return;
    setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
    execv("/proc/self/exe", argv);   // returns only on failure: go on with libgomp's default
}

int model_set_threads(int threads) {
    if (threads > 0) omp_set_num_threads(threads < MODEL_MAX_THREADS ? threads : MODEL_MAX_THREADS);
    return omp_get_max_threads();
}

Status model_set_products(const TrainConfig *tc) {
    char err[512];
    if (tc->train.device == DEVICE_CUDA) {   // cuBLAS: strict float32, TF32 or bf16 tensor cores when asked
#ifdef AG_DOUBLE
        if (tc->train.precision == PRECISION_BF16)
            return status_err("[train] precision = bf16 needs the float32 build (this float64 build is for "
                              "gradient checks; use build/ rather than build-f64/)");
#endif
        if (!device_cuda_init(err, sizeof err))
            return status_err("[train] device = cuda: %s; or train on the CPU: --device cpu", err);
        device_set_tf32(DEVICE_CUDA, tc->train.precision == PRECISION_TF32);
        device_set_bf16(DEVICE_CUDA, tc->train.precision == PRECISION_BF16);
        return status_ok();
    }
    if (!blas_select((GemmBackend)tc->train.gemm, (GemmPrecision)tc->train.precision, err, sizeof err))
        return status_err("[train] %s", err);   // err names the key and the value
    // The attention's tiles: only bf16 consults them, so only bf16 asks for them.
    if (tc->train.precision == PRECISION_BF16 && !bf16_tiles_select((Bf16Tiles)tc->train.bf16_tiles, err, sizeof err))
        return status_err("[train] %s", err);
    return status_ok();
}

double model_eval_loss(Tape *tp, LM *lm, const Batcher *bt, int n_batches, int *x, int *y, int *doc) {
    double total = 0;
    if (!batcher_has_flags(bt)) doc = NULL;
    tape_no_grad_push(tp);
    for (int i = 0; i < n_batches; i++) {
        batcher_val(bt, i, x, y, doc);
        Tensor *loss = lm_loss_docs(tp, lm, x, y, doc, batcher_share(bt), bt->T, NULL);
        total += tape_item(tp, loss);
        tape_reset(tp);
    }
    tape_no_grad_pop(tp);
    return n_batches > 0 ? total / n_batches : 0.0;
}

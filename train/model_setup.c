#include "model_setup.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "blas.h"
#include "checkpoint.h"
#include "tokenizer.h"

bool model_mixer_known(const char *name) { return mixer_kind_find(name) != NULL; }

Status model_config_from_train(const TrainConfig *tc, LMConfig *lc) {
    memset(lc, 0, sizeof *lc);
    lc->vocab_size = tc->vocab_size > 0 ? tc->vocab_size : TOKENIZER_BYTE_VOCAB;
    lc->d_model = tc->model.d_model;
    lc->d_ff = tc->model.d_ff;
    lc->tied = tc->model.tied_embeddings;
    lc->norm_eps = tc->model.norm_eps;
    if (tc->model.layers.n > LM_MAX_LAYERS) return status_err("[model] layers: more than %d layers", LM_MAX_LAYERS);
    lc->n_layers = tc->model.layers.n;
    for (int l = 0; l < lc->n_layers; l++) {
        if (!mixer_kind_find(tc->model.layers.name[l]))
            return status_err("[model] layers: mixer '%s' is not built into this program (known: %s)",
                              tc->model.layers.name[l], mixer_kind_names());
        snprintf(lc->layers[l], sizeof lc->layers[l], "%s", tc->model.layers.name[l]);
    }
    MixerConfig mc = mixer_config_default(tc->model.d_model, tc->model.n_heads, tc->model.d_k, tc->model.d_v);
    mc.chunk_size = tc->model.chunk_size;
    mc.conv_size = tc->model.conv_size;
    mc.form = tc->model.form;
    mc.rope_base = tc->model.rope_base;
    mc.norm_eps = tc->model.norm_eps;
    mc.index_heads = tc->model.index_heads;
    mc.index_dim = tc->model.index_dim;
    mc.topk = tc->model.topk;
    lc->mixer = mc;
    return status_ok();
}

// Sizes beyond which a tensor's element count or a loop index would leave
// int32 (the kernels index rows and columns with int).
#define MODEL_MAX_TENSOR ((int64_t)INT32_MAX)

const char *model_check(const TrainConfig *tc, char *why, size_t n) {
    LMConfig lc;
    Status s = model_config_from_train(tc, &lc);
    if (!s.ok) {
        snprintf(why, n, "%s", s.msg);
        return "layers";
    }
    bool form_used = false;
    for (int l = 0; l < lc.n_layers; l++) {
        const char *key = mixer_config_check(lc.layers[l], &lc.mixer, why, n);
        if (key) {
            char msg[300];
            snprintf(msg, sizeof msg, "%s", why);
            snprintf(why, n, "layer %d: %s", l, msg);
            return key;
        }
        form_used |= mixer_kind_find(lc.layers[l])->forms != 0;
    }
    if (!form_used && tc->model.form != MIXER_FORM_CHUNKED) {
        snprintf(why, n, "form = %s has no effect: none of the layers (%s...) has training forms to choose "
                         "between (only linear, mamba and gdn do); remove the key",
                 mixer_form_name(tc->model.form), lc.layers[0]);
        return "form";
    }
    // Every tensor of a step must stay within int32 elements.
    const MixerConfig *m = &lc.mixer;
    int64_t D = lc.d_model, F = lc.d_ff, V = lc.vocab_size, H = m->n_heads;
    int64_t widest = D;
    const int64_t widths[] = {F, V, H * m->d_k, H * m->d_v, (int64_t)m->index_heads * m->index_dim};
    for (size_t i = 0; i < sizeof widths / sizeof widths[0]; i++)
        if (widths[i] > widest) widest = widths[i];
    int64_t rows = (int64_t)tc->data.batch_size * tc->data.seq_len;
    if (D * F > MODEL_MAX_TENSOR || D * widest > MODEL_MAX_TENSOR || V * D > MODEL_MAX_TENSOR) {
        snprintf(why, n, "a weight of %lld x %lld elements is more than this build's %lld per tensor",
                 (long long)D, (long long)widest, (long long)MODEL_MAX_TENSOR);
        return "d_model";
    }
    if (rows * widest > MODEL_MAX_TENSOR || rows * m->topk > MODEL_MAX_TENSOR) {
        snprintf(why, n, "batch_size x seq_len = %lld rows of up to %lld numbers is more than %lld per tensor",
                 (long long)rows, (long long)(widest > m->topk ? widest : m->topk), (long long)MODEL_MAX_TENSOR);
        return "seq_len";
    }
    return NULL;
}

Status model_build(const TrainConfig *tc, LM *lm, ParamStore *ps, const char *ckpt) {
    LMConfig lc;
    Status s = model_config_from_train(tc, &lc);
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
    if (tc->train.device == DEVICE_CUDA) {   // cuBLAS: strict float32, or TF32 tensor cores when asked
        if (tc->train.precision == PRECISION_BF16)
            return status_err("[train] precision = bf16: not on the GPU yet (fp32, or tf32 for its tensor cores)");
        if (!device_cuda_init(err, sizeof err))
            return status_err("[train] device = cuda: %s; or train on the CPU: --device cpu", err);
        device_set_tf32(DEVICE_CUDA, tc->train.precision == PRECISION_TF32);
        return status_ok();
    }
    if (!blas_select((GemmBackend)tc->train.gemm, (GemmPrecision)tc->train.precision, err, sizeof err))
        return status_err("[train] %s", err);   // err names the key and the value
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

#include "blas.h"
#include "trainer.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "corpus.h"

#ifndef SOURCE_DIR
#define SOURCE_DIR "."
#endif

static volatile sig_atomic_t stop_requested = 0;
void trainer_request_stop(void) { stop_requested = 1; }

static void default_run_dir(const TrainConfig *cfg, char *out, size_t n) {
    if (cfg->train.run_dir[0]) {
        snprintf(out, n, "%s", cfg->train.run_dir);
        return;
    }
    const char *base = strrchr(cfg->source, '/');
    base = base ? base + 1 : cfg->source;
    char name[CONFIG_STR_MAX];
    snprintf(name, sizeof name, "%s", base);
    char *dot = strrchr(name, '.');
    if (dot) *dot = 0;
    snprintf(out, n, "runs/%.255s", name);
}

static Status setup(Trainer *t, const TrainerOptions *o);

// Load the config: the file, then the --set overrides.
static Status load_config(TrainConfig *cfg, const char *path, const TrainerOptions *o) {
    Status s = config_load_file(cfg, path);
    for (int i = 0; s.ok && i < o->n_sets; i++) s = config_set(cfg, o->sets[i]);
    return s;
}

// [finetune]: reload the config over the [model] section stored in init_from.
static Status finetune_config(Trainer *t, const TrainerOptions *o) {
    const char *ck = t->cfg.finetune.init_from;
    if (access(ck, R_OK) != 0)
        return status_err("[finetune] init_from: cannot read the checkpoint %s (%s): train the model first, "
                          "e.g. train --config tiny_attn.ini, or point init_from at its checkpoint.h5",
                          ck, strerror(errno));
    char *text = NULL;
    Status s = checkpoint_read_config(ck, &text);
    if (!s.ok) return status_err("[finetune] init_from: %s", s.msg);
    TrainConfig base;
    config_defaults(&base, model_mixer_known);
    s = config_load_string(&base, text, ck);
    free(text);
    if (!s.ok) {
        config_free(&base);
        return status_err("[finetune] init_from: the config stored in the checkpoint: %s", s.msg);
    }
    config_free(&t->cfg);
    config_defaults(&t->cfg, model_mixer_known);
    t->cfg.model = base.model;   // the checkpoint's architecture; the file's [model] keys override it
    config_free(&base);
    return load_config(&t->cfg, t->config_path, o);
}

// The attn layers named by dsa_layers (every attn layer when empty) become attn_dsa.
static Status finetune_layers(TrainConfig *c) {
    ConfigNames *ln = &c->model.layers;
    const ConfigInts *dl = &c->finetune.dsa_layers;
    for (int l = 0; l < ln->n; l++) {
        bool chosen = dl->n == 0;
        for (int i = 0; i < dl->n; i++) chosen |= dl->v[i] == l;
        if (chosen && strcmp(ln->name[l], "attn") == 0) snprintf(ln->name[l], sizeof ln->name[l], "attn_dsa");
    }
    for (int l = 0; l < ln->n; l++)
        if (strcmp(ln->name[l], "attn_dsa") == 0) return status_ok();
    return status_err("[finetune] mode = %s: the model (layers from %s) has no attn layer to give an indexer",
                      config_finetune_name(c->finetune.mode), c->finetune.init_from);
}

// Is p one of an attn_dsa layer's indexer weights?
static bool is_indexer_param(const LM *lm, const Tensor *p) {
    for (int l = 0; l < lm->cfg.n_layers; l++) {
        const Mixer *m = lm->blocks[l].mixer;
        if (strcmp(m->kind->name, "attn_dsa") != 0) continue;
        Tensor *w[3];
        attn_dsa_indexer_params(m, w);
        for (int i = 0; i < 3; i++)
            if (w[i] == p) return true;
    }
    return false;
}

// Load init_from's parameters; only indexer weights may be missing.
static Status finetune_load(Trainer *t) {
    const char *ck = t->cfg.finetune.init_from;
    ParamsLoadReport *r = &t->init_report;
    Status s = checkpoint_load_params(ck, &t->ps, r);
    if (!s.ok) return status_err("[finetune] init_from: %s", s.msg);
    if (r->n_unused > 0)
        return status_err("[finetune] init_from: %s holds parameters this model lacks (%s): the [model] section "
                          "differs from the checkpoint's",
                          ck, r->unused);
    int fresh = 0;
    for (int i = 0; i < t->ps.n; i++) fresh += is_indexer_param(&t->lm, t->ps.params[i]);
    // Every non-indexer parameter must have been loaded.
    if (r->n_loaded < t->ps.n - fresh)
        return status_err("[finetune] init_from: %s lacks parameters of the model (%s): the [model] section "
                          "differs from the checkpoint's",
                          ck, r->missing);
    return status_ok();
}

Status trainer_setup(Trainer *t, const TrainerOptions *o) {
    memset(t, 0, sizeof *t);
    Status s = setup(t, o);
    if (!s.ok) trainer_free(t);   // a failed setup leaves nothing behind
    return s;
}

static Status setup(Trainer *t, const TrainerOptions *o) {
    t->last_val_loss = NAN;
    t->last_kl = NAN;
    t->last_dsa = (DsaEval){NAN, NAN, NAN, NAN};
    t->decode_dense_tok_s = t->decode_sparse_tok_s = NAN;
    config_defaults(&t->cfg, model_mixer_known);
    const char *dirs[] = {".", SOURCE_DIR};
    Status s = config_find(o->config, dirs, 2, t->config_path, sizeof t->config_path);
    if (s.ok) s = load_config(&t->cfg, t->config_path, o);
    bool ft = s.ok && t->cfg.finetune.mode != FT_NONE;
    if (ft && t->cfg.finetune.init_from[0]) s = finetune_config(t, o);
    if (s.ok) s = config_validate(&t->cfg);
    if (s.ok && ft) s = finetune_layers(&t->cfg);
    if (!s.ok) return s;
    if (ft) {   // the checkpoint keeps the effective config: generate rebuilds attn_dsa layers from it
        free(t->cfg.text);
        t->cfg.text = config_dump_string(&t->cfg);
    }
    const TrainConfig *c = &t->cfg;
    t->threads = model_set_threads(c->train.threads);

    Corpus corpus;
    s = corpus_load(&corpus, c->data.corpus);
    if (!s.ok) return status_err("[data] corpus: %s", s.msg);
    s = token_cache_load(c->data.cache_dir, c->data.corpus, &corpus, &t->tokens, &t->cache_built, t->cache_path);
    corpus_free(&corpus);
    if (!s.ok) return status_err("token cache: %s", s.msg);
    s = batcher_init(&t->bt, t->tokens.tokens, t->tokens.n, c->data.val_fraction, c->data.batch_size,
                     c->data.seq_len, (uint64_t)c->train.seed);
    if (!s.ok) return status_err("[data]: %s", s.msg);

    s = model_build(c, &t->lm, &t->ps);
    if (!s.ok) return s;
    t->dsa_mode = c->finetune.mode == FT_INDEXER  ? DSA_DISTILL
                  : c->finetune.mode == FT_SPARSE ? DSA_SPARSE_KL
                                                  : DSA_SPARSE;
    lm_set_dsa_mode(&t->lm, t->dsa_mode);
    if (ft && !o->resume) {
        s = finetune_load(t);
        if (!s.ok) return s;
    }
    if (c->finetune.mode == FT_INDEXER)   // only the indexers move
        for (int i = 0; i < t->ps.n; i++)
            if (!is_indexer_param(&t->lm, t->ps.params[i])) params_set_frozen(&t->ps, t->ps.params[i], true);
    rng_seed(&t->model_rng, (uint64_t)c->train.seed ^ 0x5eedull);
    if (c->train.optimizer == CFG_OPT_SGD) sgd_init(&t->opt, &t->ps, c->train.momentum, c->train.weight_decay);
    else adamw_init(&t->opt, &t->ps, c->train.beta1, c->train.beta2, c->train.adam_eps, c->train.weight_decay);
    tape_init(&t->tp);
    size_t bt = (size_t)c->data.batch_size * c->data.seq_len;
    t->x = xmalloc(bt * sizeof(int));
    t->y = xmalloc(bt * sizeof(int));
    t->losses = xmalloc((size_t)(c->train.steps > 0 ? c->train.steps : 1) * sizeof(double));
    for (int i = 0; i < c->train.steps; i++) t->losses[i] = NAN;

    default_run_dir(c, t->run_dir, sizeof t->run_dir);
    snprintf(t->ckpt, sizeof t->ckpt, "%s/checkpoint.h5", t->run_dir);
    if (o->resume) {
        CheckpointState st = {0};
        s = checkpoint_load(t->ckpt, &t->ps, &t->opt, &st);
        if (!s.ok) return status_err("--resume: %s", s.msg);
        t->step = st.step;
        t->bt.state = st.sampler;
        t->model_rng = st.model_rng;
        if (st.config_text && t->cfg.text && strcmp(st.config_text, t->cfg.text) != 0)
            fprintf(stderr, "train: note: %s differs from the config stored in %s\n", t->config_path, t->ckpt);
        free(st.config_text);
    }
    return status_ok();
}

static Status save_checkpoint(Trainer *t) {
    CheckpointState st = {t->step, t->bt.state, t->model_rng, t->cfg.text};
    return checkpoint_save(t->ckpt, &t->ps, &t->opt, &st);
}

// One micro-batch: forward, backward; returns the loss to report (the KL in
// mode = indexer, the LM loss otherwise) and sets t->last_kl.
static double train_micro_batch(Trainer *t, int B, int T) {
    Tensor *loss, *objective;
    if (t->cfg.finetune.mode == FT_INDEXER) {
        loss = objective = lm_distill_loss(&t->tp, &t->lm, t->x, B, T);
        t->last_kl = loss->data[0];
    } else {
        loss = objective = lm_loss(&t->tp, &t->lm, t->x, t->y, B, T, NULL);
        // mode = sparse: + the indexers' KL over the selected positions (it reaches only their weights)
        if (t->lm.dsa_kl && t->cfg.finetune.mode == FT_SPARSE) {
            objective = op_add(&t->tp, loss, t->lm.dsa_kl);
            t->last_kl = t->lm.dsa_kl->data[0];
        }
    }
    double v = loss->data[0];
    tape_backward(&t->tp, objective);
    tape_reset(&t->tp);
    return v;
}

// Validation: the loss, plus the DSA figures when the model has attn_dsa layers.
static void evaluate(Trainer *t, RunLog *rl, int step, bool quiet) {
    const TrainConfig *c = &t->cfg;
    if (lm_dsa_count(&t->lm) == 0) {
        t->last_val_loss = model_eval_loss(&t->tp, &t->lm, &t->bt, c->train.eval_batches, t->x, t->y);
        runlog_eval(rl, step, t->last_val_loss, NAN, NAN);
        return;
    }
    DsaEval *e = &t->last_dsa;
    dsa_eval_run(&t->tp, &t->lm, &t->bt, c->train.eval_batches, t->x, t->y, t->dsa_mode, e);
    t->last_val_loss = e->val_sparse;   // the model as it would be deployed
    runlog_eval(rl, step, e->val_sparse, e->kl, e->mass);
    char json[256];
    snprintf(json, sizeof json,
             "{\"type\":\"dsa_eval\",\"step\":%d,\"kl\":%.6f,\"topk_mass\":%.6f,\"val_loss_sparse\":%.6f,"
             "\"val_loss_dense\":%.6f,\"topk\":%d}",
             step, e->kl, e->mass, e->val_sparse, e->val_dense, c->model.topk);
    runlog_json(rl, json);
    if (!quiet)
        fprintf(stderr, "step %6d | DSA: KL %.4f | top-%d keeps %.2f%% of the attention | val loss sparse %.4f, "
                    "dense %.4f\n",
            step, e->kl, c->model.topk, 100 * e->mass, e->val_sparse, e->val_dense);
}

static void sigint_handler(int sig) {
    (void)sig;
    if (stop_requested) _exit(130);   // a second Ctrl-C leaves at once
    stop_requested = 1;
}

int trainer_run(Trainer *t, const TrainerOptions *o) {
    const TrainConfig *c = &t->cfg;
    int B = c->data.batch_size, T = c->data.seq_len;
    RunLog rl;
    Status s = runlog_open(&rl, t->run_dir, c->train.steps, o->resume);
    if (!s.ok) {
        fprintf(stderr, "train: run folder: %s\n", s.msg);
        return 2;
    }
    char cpath[CONFIG_STR_MAX + 32];
    snprintf(cpath, sizeof cpath, "%s/config.ini", t->run_dir);
    FILE *f = fopen(cpath, "w");
    if (f) {
        config_dump(c, f);
        fclose(f);
    }
    struct utsname un;
    uname(&un);
    if (!o->quiet) {
        fprintf(stderr, "train: %s | layers", t->config_path);
        for (int l = 0; l < c->model.layers.n; l++) fprintf(stderr, "%s%s", l ? "," : " ", c->model.layers.name[l]);
        fprintf(stderr, " | %lld parameters | %s | %d threads on %s, OpenBLAS %s\n",
                (long long)params_count(&t->ps, false), REAL_NAME, t->threads, un.machine, blas_core_name());
        fprintf(stderr, "train: corpus %lld tokens (cache %s: %s) | train %lld, validation %lld | B %d x T %d x accum %d\n",
                (long long)t->tokens.n, t->cache_built ? "built" : "reused", t->cache_path,
                (long long)batcher_train_tokens(&t->bt), (long long)batcher_val_tokens(&t->bt), B, T,
                c->train.accum_steps);
        if (o->resume) fprintf(stderr, "train: resumed from %s at step %lld\n", t->ckpt, (long long)t->step);
        if (c->finetune.mode != FT_NONE && !o->resume) {
            const ParamsLoadReport *r = &t->init_report;
            fprintf(stderr, "train: finetune %s from %s: %d parameters loaded; fresh: %s\n",
                    config_finetune_name(c->finetune.mode), c->finetune.init_from, r->n_loaded,
                    r->n_missing ? r->missing : "none");
        }
        if (c->finetune.mode == FT_INDEXER)
            fprintf(stderr, "train: training the indexers only (%lld weights) on the distillation KL; the rest is "
                            "frozen\n",
                    (long long)params_count(&t->ps, true));
    }
    char json[768];
    snprintf(json, sizeof json,
             "{\"type\":\"start\",\"config\":\"%.300s\",\"params\":%lld,\"threads\":%d,\"precision\":\"%s\","
             "\"start_step\":%lld,\"machine\":\"%s\",\"openblas_core\":\"%s\"}",
             t->config_path, (long long)params_count(&t->ps, false), t->threads, REAL_NAME, (long long)t->step,
             un.machine, blas_core_name());
    runlog_json(&rl, json);

    stop_requested = 0;
    void (*old_handler)(int) = signal(SIGINT, sigint_handler);
    double tok_per_step = (double)B * T * c->train.accum_steps;
    double ema = 0;
    int exit_code = 0, run_steps = 0;
    while (t->step < c->train.steps) {
        double t0 = runlog_now();
        params_zero_grad(&t->ps);
        double loss_sum = 0;
        for (int a = 0; a < c->train.accum_steps; a++) {
            batcher_train(&t->bt, t->x, t->y);
            loss_sum += train_micro_batch(t, B, T);
        }
        double loss = loss_sum / c->train.accum_steps;
        if (!isfinite(loss)) {
            fprintf(stderr, "\ntrain: the loss is %g at step %lld: stopping; the last good checkpoint (%s) is kept\n",
                    loss, (long long)t->step + 1, t->ckpt);
            exit_code = 3;
            break;
        }
        if (c->train.accum_steps > 1) optim_scale_grads(&t->ps, 1.0 / c->train.accum_steps);
        double gnorm = optim_clip_grad_norm(&t->ps, c->train.grad_clip);
        double lr = lr_cosine(t->step, c->train.warmup_steps, c->train.steps, c->train.lr, c->train.min_lr);
        optim_step(&t->opt, &t->ps, lr);
        t->losses[t->step] = loss;
        t->step++;
        run_steps++;
        double dt = runlog_now() - t0;
        ema = ema == 0 ? dt : 0.9 * ema + 0.1 * dt;
        int done = (int)t->step;
        bool print = !o->quiet && (done % c->train.log_every == 0 || done == c->train.steps || run_steps == 1);
        runlog_train(&rl, done, loss, lr, gnorm, tok_per_step / dt, ema * (c->train.steps - done), print);
        if (c->train.eval_every > 0 && done % c->train.eval_every == 0 && done != c->train.steps)
            evaluate(t, &rl, done, o->quiet);
        if (o->stop_after > 0 && run_steps == o->stop_after) stop_requested = 1;
        if ((c->train.checkpoint_every > 0 && done % c->train.checkpoint_every == 0) || stop_requested) {
            s = save_checkpoint(t);
            if (!s.ok) fprintf(stderr, "\ntrain: checkpoint not written: %s\n", s.msg);
        }
        if (stop_requested) {
            if (!o->quiet)
                fprintf(stderr, "\ntrain: interrupted: checkpoint at step %d in %s; continue with --resume\n", done,
                        t->ckpt);
            exit_code = 130;
            break;
        }
    }
    signal(SIGINT, old_handler);
    if (exit_code == 0) {
        evaluate(t, &rl, (int)t->step, o->quiet);
        if (lm_dsa_count(&t->lm) > 0) {
            dsa_eval_decode_speed(&t->lm, DSA_DECODE_CTX, DSA_DECODE_STEPS, (uint64_t)c->train.seed, t->dsa_mode,
                                  &t->decode_dense_tok_s, &t->decode_sparse_tok_s);
            snprintf(json, sizeof json,
                     "{\"type\":\"dsa_decode\",\"context\":%d,\"steps\":%d,\"dense_tok_per_s\":%.1f,"
                     "\"sparse_tok_per_s\":%.1f,\"topk\":%d}",
                     DSA_DECODE_CTX, DSA_DECODE_STEPS, t->decode_dense_tok_s, t->decode_sparse_tok_s, c->model.topk);
            runlog_json(&rl, json);
            if (!o->quiet)
                fprintf(stderr, "train: decoding after %d positions: dense %.0f tokens/s, sparse (top-%d) %.0f "
                                "tokens/s\n",
                        DSA_DECODE_CTX, t->decode_dense_tok_s, c->model.topk, t->decode_sparse_tok_s);
        }
        s = save_checkpoint(t);
        if (!s.ok) {
            fprintf(stderr, "train: final checkpoint not written: %s\n", s.msg);
            exit_code = 1;
        }
        snprintf(json, sizeof json,
                 "{\"type\":\"end\",\"step\":%lld,\"val_loss\":%.6f,\"val_bpb\":%.6f,\"elapsed_s\":%.1f}",
                 (long long)t->step, t->last_val_loss, t->last_val_loss / log(2.0), runlog_now() - rl.t_start);
        runlog_json(&rl, json);
        if (!o->quiet) {
            const char *base = strrchr(t->config_path, '/');
            runlog_plot(&rl, base ? base + 1 : t->config_path);
            fprintf(stderr, "train: done: %lld steps, validation %.4f nats/byte = %.4f bits/byte; in %s: "
                            "checkpoint.h5, metrics.jsonl, loss.png\n",
                    (long long)t->step, t->last_val_loss, t->last_val_loss / log(2.0), t->run_dir);
        }
    }
    runlog_close(&rl);
    return exit_code;
}

void trainer_free(Trainer *t) {
    free(t->x);
    free(t->y);
    free(t->losses);
    tape_free(&t->tp);
    optim_free(&t->opt);
    lm_destroy(&t->lm);
    params_free(&t->ps);
    token_data_free(&t->tokens);
    config_free(&t->cfg);
    memset(t, 0, sizeof *t);
}

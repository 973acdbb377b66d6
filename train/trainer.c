#include "trainer.h"

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

Status trainer_setup(Trainer *t, const TrainerOptions *o) {
    memset(t, 0, sizeof *t);
    Status s = setup(t, o);
    if (!s.ok) trainer_free(t);   // a failed setup leaves nothing behind
    return s;
}

static Status setup(Trainer *t, const TrainerOptions *o) {
    t->last_val_loss = NAN;
    config_defaults(&t->cfg, model_mixer_known);
    const char *dirs[] = {".", SOURCE_DIR};
    Status s = config_find(o->config, dirs, 2, t->config_path, sizeof t->config_path);
    if (s.ok) s = config_load_file(&t->cfg, t->config_path);
    for (int i = 0; s.ok && i < o->n_sets; i++) s = config_set(&t->cfg, o->sets[i]);
    if (s.ok) s = config_validate(&t->cfg);
    if (!s.ok) return s;
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
        fprintf(stderr, " | %lld parameters | %s | %d threads on %s\n", (long long)params_count(&t->ps, false),
                REAL_NAME, t->threads, un.machine);
        fprintf(stderr, "train: corpus %lld tokens (cache %s: %s) | train %lld, validation %lld | B %d x T %d x accum %d\n",
                (long long)t->tokens.n, t->cache_built ? "built" : "reused", t->cache_path,
                (long long)batcher_train_tokens(&t->bt), (long long)batcher_val_tokens(&t->bt), B, T,
                c->train.accum_steps);
        if (o->resume) fprintf(stderr, "train: resumed from %s at step %lld\n", t->ckpt, (long long)t->step);
    }
    char json[768];
    snprintf(json, sizeof json,
             "{\"type\":\"start\",\"config\":\"%.300s\",\"params\":%lld,\"threads\":%d,\"precision\":\"%s\","
             "\"start_step\":%lld,\"machine\":\"%s\"}",
             t->config_path, (long long)params_count(&t->ps, false), t->threads, REAL_NAME, (long long)t->step,
             un.machine);
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
            Tensor *loss = lm_loss(&t->tp, &t->lm, t->x, t->y, B, T, NULL);
            loss_sum += loss->data[0];
            tape_backward(&t->tp, loss);
            tape_reset(&t->tp);
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
        if (c->train.eval_every > 0 && done % c->train.eval_every == 0 && done != c->train.steps) {
            t->last_val_loss = model_eval_loss(&t->tp, &t->lm, &t->bt, c->train.eval_batches, t->x, t->y);
            runlog_eval(&rl, done, t->last_val_loss, NAN, NAN);
        }
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
        t->last_val_loss = model_eval_loss(&t->tp, &t->lm, &t->bt, c->train.eval_batches, t->x, t->y);
        runlog_eval(&rl, (int)t->step, t->last_val_loss, NAN, NAN);
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

#include "trainer.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "blas.h"
#include "corpus.h"
#include "run_config.h"

#ifndef SOURCE_DIR
#define SOURCE_DIR "."
#endif

static volatile sig_atomic_t stop_requested = 0;
static Status setup(Trainer *t, const TrainerOptions *o);
void trainer_request_stop(void) { stop_requested = 1; }

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

// Load init_from's parameters; in fine-tuning only indexer weights may be
// missing, when continuing (mode = none) none may.
static Status init_from_load(Trainer *t) {
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
    if (t->cfg.finetune.mode == FT_NONE) fresh = 0;
    if (r->n_loaded < t->ps.n - fresh)
        return status_err("[finetune] init_from: %s lacks parameters of the model (%s): the [model] section "
                          "differs from the checkpoint's",
                          ck, r->missing);
    if (t->cfg.finetune.restore_optimizer) {
        // Parameters again (cheap) and the moments; the run's own step and data state start fresh.
        s = checkpoint_load(ck, &t->ps, &t->opt, NULL);
        if (!s.ok) return status_err("[finetune] restore_optimizer: %s", s.msg);
    }
    return status_ok();
}

// The run's tokenizer: the checkpoint's when resuming or starting from
// init_from (the model's vocabulary is fixed there: a [data] tokenizer the
// config sets must be that one), else [data] tokenizer; bpe:N is trained on
// the corpus's training split once and kept in cache_dir.
static Status setup_tokenizer(Trainer *t, const Corpus *corpus, const TrainerOptions *o) {
    const TrainConfig *c = &t->cfg;
    const char *from = o->resume ? t->ckpt : c->finetune.init_from[0] ? c->finetune.init_from : NULL;
    const char *spec = c->data.tokenizer;
    int train_vocab = 0;
    tokenizer_spec_is_named(spec, &train_vocab);
    if (from) {
        Status s = checkpoint_read_tokenizer(from, &t->tok);
        if (!s.ok) return status_err("%s%s", o->resume ? "--resume: " : "[finetune] init_from: ", s.msg);
        if (o->resume || !strcmp(spec, "byte")) return status_ok();   // (byte: the default, not a choice)
        Tokenizer mine;
        s = train_vocab ? status_err("[data] tokenizer = %s: the model of %s has its tokenizer already", spec, from)
                        : tokenizer_open(&mine, spec);
        bool same = s.ok && mine.hash == t->tok.hash;
        if (s.ok) tokenizer_free(&mine);
        if (s.ok && !same)
            s = status_err("[data] tokenizer = %s: not the tokenizer the model of %s was trained with", spec, from);
        return s;
    }
    if (!train_vocab) {
        Status s = tokenizer_open(&t->tok, spec);
        return s.ok ? s : status_err("[data] tokenizer: %s", s.msg);
    }
    // bpe:N: the training split's text (the validation split is not seen), cached by corpus and size.
    char path[CONFIG_STR_MAX + 64];
    if (snprintf(path, sizeof path, "%s/tokenizer-%016llx-%d.bpe", c->data.cache_dir,
                 (unsigned long long)corpus->hash, train_vocab) >= (int)sizeof path)
        return status_err("[data] cache_dir: path too long");
    if (access(path, F_OK) == 0 && tokenizer_open(&t->tok, path).ok) return status_ok();
    int64_t n_train = corpus->n - (int64_t)((double)corpus->n * c->data.val_fraction);
    Status s = tokenizer_train(&t->tok, corpus->bytes, n_train, train_vocab);
    if (!s.ok) return status_err("[data] tokenizer = %s: %s", spec, s.msg);
    s = bpe_save(t->tok.bpe, path);
    if (!s.ok) fprintf(stderr, "train: note: the trained tokenizer could not be kept (%s); it is in the checkpoints\n",
                       s.msg);
    return status_ok();
}

Status trainer_setup(Trainer *t, const TrainerOptions *o) {
    memset(t, 0, sizeof *t);
    t->rd.lock_fd = -1;
    Status s = setup(t, o);
    if (!s.ok) trainer_free(t);   // a failed setup leaves nothing behind
    return s;
}

static Status setup(Trainer *t, const TrainerOptions *o) {
    t->last_val_loss = NAN;
    t->last_kl = NAN;
    t->last_dsa = (DsaEval){NAN, NAN, NAN, NAN};
    t->decode_dense_tok_s = t->decode_sparse_tok_s = NAN;
    t->saved_step = -1;
    tokenizer_bytes(&t->tok);
    config_defaults(&t->cfg, model_mixer_known);
    Status s = config_find(o->config, CONFIG_SEARCH_DIRS, CONFIG_N_SEARCH_DIRS, t->config_path, sizeof t->config_path);
    RunConfigArgs args = {t->config_path, o->sets, o->n_sets, o->resume};
    if (s.ok) s = run_config_load(&t->cfg, &args, t->run_dir, sizeof t->run_dir, t->notes, sizeof t->notes);
    if (!s.ok) return s;
    // The run's effective config: what config.ini and every checkpoint hold.
    free(t->cfg.text);
    t->cfg.text = config_dump_string(&t->cfg);
    const TrainConfig *c = &t->cfg;
    bool ft = c->finetune.mode != FT_NONE;
    t->threads = model_set_threads(c->train.threads);
    if (snprintf(t->ckpt, sizeof t->ckpt, "%s/checkpoint.h5", t->run_dir) >= (int)sizeof t->ckpt)
        return status_err("[train] run_dir: path too long");

    Corpus corpus;
    s = corpus_load(&corpus, c->data.corpus);
    if (!s.ok && strstr(s.msg, "kjv.txt: cannot open") && strstr(s.msg, "No such file"))
        return status_err("[data] corpus: %s (the bundled configs train on the King James Bible: run "
                          "scripts/get_corpus.sh in the project folder; it needs Debian's bible-kjv package)",
                          s.msg);
    if (!s.ok) return status_err("[data] corpus: %s", s.msg);
    s = setup_tokenizer(t, &corpus, o);
    if (s.ok) {
        s = token_cache_load(c->data.cache_dir, c->data.corpus, &corpus, &t->tok, &t->tokens, &t->cache_built,
                             t->cache_path);
        if (!s.ok) s = status_err("token cache: %s", s.msg);
    }
    corpus_free(&corpus);
    if (!s.ok) return s;
    t->cfg.vocab_size = t->tok.vocab;
    t->tok_buf = tokenizer_to_buffer(&t->tok, &t->tok_len);
    s = batcher_init(&t->bt, t->tokens.tokens, t->tokens.n, c->data.val_fraction, c->data.batch_size,
                     c->data.seq_len, (uint64_t)c->train.seed);
    if (!s.ok) return status_err("[data]: %s", s.msg);
    t->has_val = batcher_val_tokens(&t->bt) > 0;
    // A checkpoint to load is checked against the model before it is allocated.
    const char *check = o->resume ? t->ckpt : (c->finetune.init_from[0] && !ft) ? c->finetune.init_from : NULL;
    s = model_build(c, &t->lm, &t->ps, check);
    if (!s.ok) return status_err("%s%s", o->resume ? "--resume: " : check ? "[finetune] init_from: " : "", s.msg);
    t->dsa_mode = c->finetune.mode == FT_INDEXER  ? DSA_DISTILL
                  : c->finetune.mode == FT_SPARSE ? DSA_SPARSE_KL
                                                  : DSA_SPARSE;
    lm_set_dsa_mode(&t->lm, t->dsa_mode);
    if (c->finetune.mode == FT_INDEXER)   // only the indexers move
        for (int i = 0; i < t->ps.n; i++)
            if (!is_indexer_param(&t->lm, t->ps.params[i])) params_set_frozen(&t->ps, t->ps.params[i], true);
    rng_seed(&t->model_rng, (uint64_t)c->train.seed ^ 0x5eedull);
    if (c->train.optimizer == CFG_OPT_SGD) sgd_init(&t->opt, &t->ps, c->train.momentum, c->train.weight_decay);
    else adamw_init(&t->opt, &t->ps, c->train.beta1, c->train.beta2, c->train.adam_eps, c->train.weight_decay);
    if (c->finetune.init_from[0] && !o->resume) {
        s = init_from_load(t);
        if (!s.ok) return s;
    }
    tape_init(&t->tp);
    size_t bt = (size_t)c->data.batch_size * c->data.seq_len;
    t->x = xmalloc(bt * sizeof(int));
    t->y = xmalloc(bt * sizeof(int));
    t->val_bytes_per_token =
        t->has_val ? model_val_bytes_per_token(&t->bt, &t->tok, c->train.eval_batches, t->x, t->y) : 1.0;

    if (o->resume) {
        CheckpointState st = {0};
        s = checkpoint_load(t->ckpt, &t->ps, &t->opt, &st);
        if (!s.ok) return status_err("--resume: %s", s.msg);
        free(st.config_text);
        if (st.step > c->train.steps)
            return status_err("--resume: %s is at step %lld, past [train] steps = %d: nothing to resume (raise it "
                              "with --set train.steps=N to train on)",
                              t->ckpt, (long long)st.step, c->train.steps);
        t->step = t->saved_step = st.step;
        t->bt.state = st.sampler;
        t->model_rng = st.model_rng;
    }
    t->first_step = t->step;
    // Last: the run folder (locked, and refused when it holds another run).
    s = run_dir_open(&t->rd, t->run_dir, o->resume ? RUN_RESUME : RUN_FRESH, o->overwrite);
    if (s.ok && o->resume) s = run_dir_trim_logs(&t->rd, t->step);
    return s;
}

double trainer_loss(const Trainer *t, int64_t step) {
    int64_t i = step - t->first_step;
    return (i >= 0 && i < t->n_losses) ? t->losses[i] : NAN;
}

static void record_loss(Trainer *t, double loss) {
    if (t->n_losses == t->cap_losses) {
        t->cap_losses = t->cap_losses ? 2 * t->cap_losses : 1024;
        t->losses = xrealloc(t->losses, (size_t)t->cap_losses * sizeof *t->losses);
    }
    t->losses[t->n_losses++] = loss;
}

// Save, unless the state holds a non-finite value; records saved_step.
static Status save_checkpoint(Trainer *t) {
    const Tensor *bad = optim_nonfinite_param(&t->ps, &t->opt);
    if (bad) return status_err("parameter '%s' (or its optimizer state) is not finite: not saved", bad->name);
    CheckpointState st = {t->step, t->bt.state, t->model_rng, t->cfg.text, t->tok_buf, t->tok_len};
    Status s = checkpoint_save(t->ckpt, &t->ps, &t->opt, &st);
    if (s.ok) t->saved_step = t->step;
    return s;
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

// Validation: the loss, plus the DSA figures when the model has attn_dsa
// layers. Nothing without a validation split (val_fraction = 0).
static void evaluate(Trainer *t, RunLog *rl, int step, bool quiet) {
    const TrainConfig *c = &t->cfg;
    if (!t->has_val) return;
    if (lm_dsa_count(&t->lm) == 0) {
        t->last_val_loss = model_eval_loss(&t->tp, &t->lm, &t->bt, c->train.eval_batches, t->x, t->y);
        runlog_eval(rl, step, t->last_val_loss, t->val_bytes_per_token, NAN, NAN);
        return;
    }
    DsaEval *e = &t->last_dsa;
    dsa_eval_run(&t->tp, &t->lm, &t->bt, c->train.eval_batches, t->x, t->y, t->dsa_mode, e);
    t->last_val_loss = e->val_sparse;   // the model as it would be deployed
    runlog_eval(rl, step, e->val_sparse, t->val_bytes_per_token, e->kl, e->mass);
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

static void stop_handler(int sig) {
    (void)sig;
    if (stop_requested) _exit(130);   // a second Ctrl-C leaves at once
    stop_requested = 1;
}

static void print_start(const Trainer *t, const TrainerOptions *o, const struct utsname *un) {
    const TrainConfig *c = &t->cfg;
    if (t->notes[0]) fprintf(stderr, "%s", t->notes);
    fprintf(stderr, "train: %s | layers", t->config_path);
    for (int l = 0; l < c->model.layers.n; l++) fprintf(stderr, "%s%s", l ? "," : " ", c->model.layers.name[l]);
    fprintf(stderr, " | %lld parameters | %s | %d thread%s on %s, OpenBLAS %s\n", (long long)params_count(&t->ps, false),
            REAL_NAME, t->threads, t->threads == 1 ? "" : "s", un->machine, blas_core_name());
    char tk[64];
    fprintf(stderr, "train: corpus %lld tokens (%s; cache %s: %s) | train %lld, validation %lld | B %d x T %d x accum %d\n",
            (long long)t->tokens.n, tokenizer_describe(&t->tok, tk, sizeof tk), t->cache_built ? "built" : "reused",
            t->cache_path,
            (long long)batcher_train_tokens(&t->bt), (long long)batcher_val_tokens(&t->bt), c->data.batch_size,
            c->data.seq_len, c->train.accum_steps);
    if (t->tokens.note[0]) fprintf(stderr, "train: token cache: %s\n", t->tokens.note);
    if (!t->has_val) fprintf(stderr, "train: val_fraction = 0: no validation split, no evaluations\n");
    if (o->resume) fprintf(stderr, "train: resumed from %s at step %lld\n", t->ckpt, (long long)t->step);
    if (c->finetune.init_from[0] && !o->resume) {
        const ParamsLoadReport *r = &t->init_report;
        if (c->finetune.mode == FT_NONE)
            fprintf(stderr, "train: continuing the model of %s (%d parameters loaded, optimizer %s)\n",
                    c->finetune.init_from, r->n_loaded, c->finetune.restore_optimizer ? "restored" : "fresh");
        else
            fprintf(stderr, "train: finetune %s from %s: %d parameters loaded; fresh: %s\n",
                    config_finetune_name(c->finetune.mode), c->finetune.init_from, r->n_loaded,
                    r->n_missing ? r->missing : "none");
    }
    if (c->finetune.mode == FT_INDEXER)
        fprintf(stderr, "train: training the indexers only (%lld weights) on the distillation KL; the rest is "
                        "frozen\n",
                (long long)params_count(&t->ps, true));
}

static void log_start(const Trainer *t, RunLog *rl, const struct utsname *un) {
    char cfg[700], mach[200], core[100], json[1200];
    snprintf(json, sizeof json,
             "{\"type\":\"start\",\"config\":%s,\"params\":%lld,\"threads\":%d,\"precision\":\"%s\","
             "\"start_step\":%lld,\"machine\":%s,\"openblas_core\":%s}",
             runlog_json_str(t->config_path, cfg, sizeof cfg), (long long)params_count(&t->ps, false), t->threads,
             REAL_NAME, (long long)t->step, runlog_json_str(un->machine, mach, sizeof mach),
             runlog_json_str(blas_core_name(), core, sizeof core));
    runlog_json(rl, json);
}

// The end of a finished run: final evaluation, DSA decode speed, checkpoint,
// the end record, the plot and what was written. Returns the exit code.
static int finish(Trainer *t, RunLog *rl, const TrainerOptions *o) {
    const TrainConfig *c = &t->cfg;
    char json[512];
    evaluate(t, rl, (int)t->step, o->quiet);
    if (lm_dsa_count(&t->lm) > 0) {
        dsa_eval_decode_speed(&t->lm, DSA_DECODE_CTX, DSA_DECODE_STEPS, (uint64_t)c->train.seed, t->dsa_mode,
                              &t->decode_dense_tok_s, &t->decode_sparse_tok_s);
        snprintf(json, sizeof json,
                 "{\"type\":\"dsa_decode\",\"context\":%d,\"rounds\":%d,\"steps_per_round\":%d,"
                 "\"dense_tok_per_s\":%.1f,\"sparse_tok_per_s\":%.1f,\"topk\":%d}",
                 DSA_DECODE_CTX, DSA_DECODE_ROUNDS, DSA_DECODE_STEPS, t->decode_dense_tok_s, t->decode_sparse_tok_s,
                 c->model.topk);
        runlog_json(rl, json);
        if (!o->quiet)
            fprintf(stderr, "train: decoding after %d positions (median of %d rounds of %d tokens): dense %.0f "
                            "tokens/s, sparse (top-%d) %.0f tokens/s\n",
                    DSA_DECODE_CTX, DSA_DECODE_ROUNDS, DSA_DECODE_STEPS, t->decode_dense_tok_s, c->model.topk,
                    t->decode_sparse_tok_s);
    }
    int code = 0;
    Status s = save_checkpoint(t);
    if (!s.ok) {
        fprintf(stderr, "train: the final checkpoint was not written: %s\n", s.msg);
        code = 1;
    }
    double bpb = t->last_val_loss / log(2.0) / t->val_bytes_per_token;
    char val[96] = "\"val_loss\":null,\"val_bpb\":null";
    if (t->has_val) snprintf(val, sizeof val, "\"val_loss\":%.6f,\"val_bpb\":%.6f", t->last_val_loss, bpb);
    snprintf(json, sizeof json, "{\"type\":\"end\",\"step\":%lld,%s,\"elapsed_s\":%.1f}", (long long)t->step, val,
             runlog_now() - rl->t_start);
    runlog_json(rl, json);
    bool plotted = false;
    if (!o->quiet) {
        const char *base = strrchr(t->config_path, '/');
        bool kl = c->finetune.mode == FT_INDEXER;
        RunLogPlot p = {base ? base + 1 : t->config_path, kl ? "distillation KL (nats)" : "loss (nats/byte)",
                        kl ? "validation LM loss (nats/byte)" : "validation", kl};
        plotted = runlog_plot(rl, &p);
    }
    char err[200];
    const char *log_err = runlog_error(rl, err, sizeof err);
    if (log_err) code = code ? code : 1;
    if (!o->quiet) {
        fprintf(stderr, "train: done: %lld step%s", (long long)t->step, t->step == 1 ? "" : "s");
        if (t->has_val && !t->tok.bpe)
            fprintf(stderr, ", validation %.4f nats/byte = %.4f bits/byte", t->last_val_loss, bpb);
        else if (t->has_val)
            fprintf(stderr, ", validation %.4f nats/token = %.4f bits/byte", t->last_val_loss, bpb);
        fprintf(stderr, "; in %s:", t->run_dir);
        if (t->saved_step == t->step) fprintf(stderr, " checkpoint.h5");
        else if (t->saved_step >= 0) fprintf(stderr, " checkpoint.h5 (of step %lld only)", (long long)t->saved_step);
        else fprintf(stderr, " no checkpoint");
        fprintf(stderr, ", metrics.jsonl%s%s\n", log_err ? " (incomplete)" : "", plotted ? ", loss.png" : "");
        if (log_err) fprintf(stderr, "train: logging failed: %s\n", log_err);
    }
    return code;
}

// The stop message when training cannot go on from a non-finite value.
static int stop_nonfinite(const Trainer *t, const char *what) {
    fprintf(stderr, "\ntrain: %s at step %lld: stopping. ", what, (long long)t->step + 1);
    if (t->saved_step >= 0)
        fprintf(stderr, "The last good checkpoint (%s, step %lld) is kept.\n", t->ckpt, (long long)t->saved_step);
    else
        fprintf(stderr, "No checkpoint was written by this run.\n");
    return 3;
}

int trainer_run(Trainer *t, const TrainerOptions *o) {
    const TrainConfig *c = &t->cfg;
    int B = c->data.batch_size, T = c->data.seq_len;
    RunLog rl;
    Status s = runlog_open(&rl, t->run_dir, c->train.steps, o->resume);
    if (s.ok) s = run_dir_write_file(&t->rd, "config.ini", t->cfg.text);
    if (!s.ok) {
        runlog_close(&rl);
        fprintf(stderr, "train: run folder: %s\n", s.msg);
        return 2;
    }
    struct utsname un;
    uname(&un);
    if (!o->quiet) print_start(t, o, &un);
    log_start(t, &rl, &un);

    stop_requested = 0;
    struct sigaction sa = {0}, old_int, old_term;
    sa.sa_handler = stop_handler;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    double tok_per_step = (double)B * T * c->train.accum_steps;
    int warmup = config_warmup_steps(c);
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
            char what[64];
            snprintf(what, sizeof what, "the loss is %g", loss);
            exit_code = stop_nonfinite(t, what);
            break;
        }
        if (c->train.accum_steps > 1) optim_scale_grads(&t->ps, 1.0 / c->train.accum_steps);
        double gnorm = optim_clip_grad_norm(&t->ps, c->train.grad_clip);
        if (!isfinite(gnorm)) {
            exit_code = stop_nonfinite(t, "the gradient norm is not finite");
            break;
        }
        double lr = lr_cosine(t->step, warmup, c->train.steps, c->train.lr, c->train.min_lr);
        optim_step(&t->opt, &t->ps, lr);
        const Tensor *bad = optim_nonfinite_param(&t->ps, &t->opt);
        if (bad) {
            char what[300];
            snprintf(what, sizeof what, "the update made parameter '%s' (or its optimizer state) non-finite", bad->name);
            exit_code = stop_nonfinite(t, what);
            break;
        }
        record_loss(t, loss);
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
            if (!s.ok) fprintf(stderr, "\ntrain: checkpoint of step %d not written: %s\n", done, s.msg);
        }
        if (stop_requested) {
            if (!o->quiet) {
                if (t->saved_step == done)
                    fprintf(stderr, "\ntrain: interrupted: checkpoint at step %d in %s; continue with --resume\n",
                            done, t->ckpt);
                else
                    fprintf(stderr, "\ntrain: interrupted at step %d; the checkpoint could not be written%s\n", done,
                            t->saved_step >= 0 ? " (the one on disk is older)" : "");
            }
            exit_code = 130;
            break;
        }
    }
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    if (exit_code == 0) exit_code = finish(t, &rl, o);
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
    tokenizer_free(&t->tok);
    free(t->tok_buf);
    config_free(&t->cfg);
    run_dir_close(&t->rd);
    memset(t, 0, sizeof *t);
    t->rd.lock_fd = -1;
}

#include "trainer.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "blas.h"
#include "corpus.h"
#include "tile_amx.h"
#include "run_config.h"
#include "signals.h"
#include "vocab_cost.h"

#ifndef SOURCE_DIR
#define SOURCE_DIR "."
#endif

// Bits: STOP_KEEP (SIGUSR1, or a request from code: mpirun keeps the job
// while the ranks save) and STOP_ENDING (SIGINT or SIGTERM: under mpirun,
// mpirun is ending the job and will kill ranks that linger).
enum { STOP_KEEP = 1, STOP_ENDING = 2 };
static volatile sig_atomic_t stop_requested = 0;
// When the first stop signal came (CLOCK_MONOTONIC, ns): a repeat within
// STOP_REPEAT_NS of it is the same request delivered twice (timeout(1) and
// other kills of a process group send the process its signal once directly
// and once through the group, and the two may reach two of its threads).
#define STOP_REPEAT_NS 1000000000LL
static atomic_llong stop_first_ns;
static bool stop_ended_job = false;   // the last stop had a STOP_ENDING on some rank
void trainer_request_stop(void) { stop_requested |= STOP_KEEP; }
bool trainer_stop_ends_job(void) { return stop_ended_job; }

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

// The carried states ([train] carry_state) as rows of doubles: row g of the
// global batch holds, buffer after buffer (lm_carry_buffers), that row's
// part of each (every buffer is (rows, ...), rows outermost). This rank
// holds rows [bt.lo, bt.hi).
#define CARRY_MAX_BUFFERS (4 * LM_MAX_LAYERS)

int64_t trainer_carry_row(Trainer *t) {
    if (!t->carry) return 0;
    real *bufs[CARRY_MAX_BUFFERS];
    int64_t sizes[CARRY_MAX_BUFFERS], row = 0;
    int n = lm_carry_buffers(&t->lm, t->carry, bufs, sizes, CARRY_MAX_BUFFERS);
    for (int i = 0; i < n; i++) row += sizes[i] / t->carry->B;
    return row;
}

// pack: this rank's rows into full (bt.B x row); else full's rows into the
// buffers. A carry on the GPU goes through a host copy of each buffer.
void trainer_carry_copy(Trainer *t, double *full, bool pack) {
    real *bufs[CARRY_MAX_BUFFERS];
    int64_t sizes[CARRY_MAX_BUFFERS];
    int n = lm_carry_buffers(&t->lm, t->carry, bufs, sizes, CARRY_MAX_BUFFERS);
    int64_t row = trainer_carry_row(t), off = 0;
    Device dev = t->carry->device;
    for (int i = 0; i < n; i++) {
        int64_t per = sizes[i] / t->carry->B;
        size_t bytes = (size_t)sizes[i] * sizeof(real);
        real *host = dev == DEVICE_CPU ? bufs[i] : xmalloc(bytes ? bytes : 1);
        if (pack && host != bufs[i]) dev_to_host(host, bufs[i], bytes, dev);
        for (int r = 0; r < t->carry->B; r++) {
            double *f = full + (int64_t)(t->bt.lo + r) * row + off;
            real *b = host + (int64_t)r * per;
            for (int64_t j = 0; j < per; j++) {
                if (pack) f[j] = (double)b[j];
                else b[j] = (real)f[j];
            }
        }
        if (host != bufs[i]) {
            if (!pack) dev_from_host(bufs[i], dev, host, bytes);
            free(host);
        }
        off += per;
    }
}

// Save, unless the state holds a non-finite value; records saved_step.
// Under MPI every rank calls it: the ranks check that they hold the same
// parameters, ZeRO-1 shards of the optimizer state are gathered on rank 0,
// and rank 0 writes the one checkpoint.
static Status save_checkpoint(Trainer *t) {
    Optimizer full = t->opt;
    real *m = NULL, *v = NULL;
    ParamStore host = t->ps;   // the values as the checkpoint reads them: on the host
    if (t->ps.device != DEVICE_CPU) {   // a GPU run (one process): copies of the values and moments
        host.data = (real *)params_pull(&t->ps);
        host.device = DEVICE_CPU;
        m = xmalloc((size_t)t->ps.numel * sizeof(real));
        v = t->opt.v ? xmalloc((size_t)t->ps.numel * sizeof(real)) : NULL;
        optim_pull_moments(&t->opt, m, v);
        full.m = m;
        full.v = v;
        full.device = DEVICE_CPU;
    }
    if (t->opt.lo != 0 || t->opt.hi != t->ps.numel) {   // sharded: the whole state on rank 0
        if (t->rank == 0) {
            m = xmalloc((size_t)t->ps.numel * sizeof(real));
            v = t->opt.v ? xmalloc((size_t)t->ps.numel * sizeof(real)) : NULL;
        }
        dist_gather_moments(t->dg, &t->opt, m, v);
        full.m = m;
        full.v = v;
        full.lo = 0;
        full.hi = t->ps.numel;
    }
    bool agree = dist_params_agree(t->dg);
    Status s = status_ok();
    double *carry = NULL;
    int64_t carry_row = trainer_carry_row(t);
    if (t->carry) {   // every rank's rows, on every rank
        carry = xcalloc((size_t)t->bt.B * carry_row, sizeof *carry);
        trainer_carry_copy(t, carry, true);
        dist_allgather_rows(carry, t->bt.B, carry_row, "carried states");
    }
    if (t->rank != 0) {
        t->saved_step = t->step;   // (rank 0 reports whether it was written)
    } else if (!agree) {
        s = status_err("the ranks' parameters differ: not saved (a rank computed differently; see the README)");
    } else {
        const Tensor *bad = optim_nonfinite_param(&host, &full);
        CheckpointState st = {t->step, t->bt.state, t->model_rng, t->cfg.text, t->tok_buf, t->tok_len,
                              carry, t->bt.B, carry_row};
        if (bad) s = status_err("parameter '%s' (or its optimizer state) is not finite: not saved", bad->name);
        else s = checkpoint_save(t->ckpt, &host, &full, &st);
        if (s.ok) t->saved_step = t->step;
    }
    free(m);
    free(v);
    free(carry);
    return s;
}

// One micro-batch: forward, backward; returns the loss to report (the KL in
// mode = indexer, the LM loss otherwise) and sets t->last_kl. Under MPI the
// losses are this rank's share of the global batch's mean (Tape.loss_rows):
// divided by the global count, so that every row's gradient has the bits it
// has in one process and the ranks' gradients sum to the global one. reduce:
// the last micro-batch of a step under MPI: its backward starts the gradient
// reduction, each gradient scaled by `weight` (1 / accum_steps).
static double train_micro_batch(Trainer *t, int B, int T, bool reduce, double weight) {
    Tensor *loss, *objective;
    t->tp.loss_rows = t->bt.B;
    const int *doc = batcher_has_flags(&t->bt) ? t->doc : NULL;
    if (t->cfg.finetune.mode == FT_INDEXER) {
        loss = objective = lm_distill_loss_docs(&t->tp, &t->lm, t->x, doc, B, T);
        t->last_kl = tape_item(&t->tp, loss);
    } else if (t->graph.g && !reduce) {   // (cuda_graph refuses the modes with a KL to read)
        double v = lm_graph_micro_batch(&t->graph, &t->tp, &t->lm, t->x, t->y, doc, B, T, t->carry);
        t->tp.loss_rows = 0;
        return v;
    } else {
        loss = objective = t->carry ? lm_loss_carry(&t->tp, &t->lm, t->x, t->y, doc, B, T, t->carry, NULL)
                                    : lm_loss_docs(&t->tp, &t->lm, t->x, t->y, doc, B, T, NULL);
        // mode = sparse: + the indexers' KL over the selected positions (it reaches only their weights)
        if (t->lm.dsa_kl && t->cfg.finetune.mode == FT_SPARSE) {
            objective = op_add(&t->tp, loss, t->lm.dsa_kl);
            t->last_kl = tape_item(&t->tp, t->lm.dsa_kl);
        }
    }
    double v = tape_item(&t->tp, loss);
    if (reduce) dist_grads_arm(t->dg, &t->tp, weight);
    tape_backward(&t->tp, objective);
    if (reduce) dist_grads_flush(t->dg);
    tape_reset(&t->tp);
    t->tp.loss_rows = 0;   // (validation weighs each rank's mean itself)
    return v;
}

// This rank's weight in the global batch (1 in a single process).
static double share_weight(const Trainer *t) { return (double)batcher_share(&t->bt) / t->bt.B; }

// Validation: the loss, plus the DSA figures when the model has attn_dsa
// layers. Nothing without a validation split (val_fraction = 0). Under MPI
// each rank scores its share of every validation batch and the
// share-weighted figures are summed.
static void evaluate(Trainer *t, RunLog *rl, int step, bool quiet) {
    const TrainConfig *c = &t->cfg;
    if (!t->has_val) return;
    double w = share_weight(t);
    if (lm_dsa_count(&t->lm) == 0) {
        double loss = w * model_eval_loss(&t->tp, &t->lm, &t->bt, c->train.eval_batches, t->x, t->y, t->doc);
        dist_sum(&loss, 1, "evaluation");
        t->last_val_loss = loss;
        if (t->rank == 0) runlog_eval(rl, step, t->last_val_loss, t->val_bytes_per_token, NAN, NAN);
        return;
    }
    DsaEval *e = &t->last_dsa;
    dsa_eval_run(&t->tp, &t->lm, &t->bt, c->train.eval_batches, t->x, t->y, t->doc, t->dsa_mode, e);
    double v[4] = {w * e->kl, w * e->mass, w * e->val_sparse, w * e->val_dense};
    dist_sum(v, 4, "evaluation");
    *e = (DsaEval){v[0], v[1], v[2], v[3]};
    t->last_val_loss = e->val_sparse;   // the model as it would be deployed
    if (t->rank != 0) return;
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
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);   // (async-signal-safe)
    long long ns = (long long)now.tv_sec * 1000000000LL + now.tv_nsec;
    // A second Ctrl-C, a second or more after the first, leaves at once; not
    // under mpirun, which may deliver Ctrl-C and its own SIGTERM both (and
    // ends a job that does not stop).
    if (stop_requested && dist_size() == 1 && ns - atomic_load(&stop_first_ns) >= STOP_REPEAT_NS) _exit(130);
    if (!stop_requested) atomic_store(&stop_first_ns, ns);   // (before the flag another thread's handler reads)
    stop_requested |= sig == SIGUSR1 ? STOP_KEEP : STOP_ENDING;
}

static void print_start(const Trainer *t, const TrainerOptions *o, const struct utsname *un) {
    const TrainConfig *c = &t->cfg;
    if (t->notes[0]) fprintf(stderr, "%s", t->notes);
    fprintf(stderr, "train: %s | layers", t->config_path);
    for (int l = 0; l < c->model.layers.n; l++) fprintf(stderr, "%s%s", l ? "," : " ", c->model.layers.name[l]);
    fprintf(stderr, " | %lld parameters | %s | ", (long long)params_count(&t->ps, false), REAL_NAME);
    if (t->ranks > 1 && c->train.device == DEVICE_CPU)
        fprintf(stderr, "%d ranks x %d thread%s (MPI%s) on %s, GEMM %s\n", t->ranks, t->threads,
                t->threads == 1 ? "" : "s", c->train.zero ? ", ZeRO-1" : "", un->machine, blas_describe());
    else if (c->train.device == DEVICE_CUDA)
        fprintf(stderr, "%s%s, products %s (cuBLAS%s)%s\n",
                t->ranks > 1 ? "ranks with a GPU each (NCCL), rank 0's " : "GPU ", device_describe(DEVICE_CUDA),
                blas_precision_name((GemmPrecision)c->train.precision),
                c->train.precision == PRECISION_TF32   ? ", TF32 tensor cores"
                : c->train.precision == PRECISION_BF16 ? ", bf16 tensor cores, float32 sums"
                                                       : ", strict IEEE",
                t->graph.g ? ", CUDA graphs" : "");
    else
        fprintf(stderr, "%d thread%s on %s, GEMM %s\n", t->threads, t->threads == 1 ? "" : "s", un->machine,
                blas_describe());
    char tk[64];
    fprintf(stderr, "train: corpus %lld tokens (%s; cache %s%s: %s) | train %lld, validation %lld | B %d x T %d x accum %d\n",
            (long long)t->tokens.n, tokenizer_describe(&t->tok, tk, sizeof tk), t->cache_built ? "built" : "reused",
            t->tokens.mapped ? ", mapped" : "", t->cache_path,
            (long long)batcher_train_tokens(&t->bt), (long long)batcher_val_tokens(&t->bt), c->data.batch_size,
            c->data.seq_len, c->train.accum_steps);
    char cost[400];
    vocab_cost_describe(&t->ps, cost, sizeof cost);
    if (cost[0]) fprintf(stderr, "train: %s\n", cost);
    if (t->tokens.note[0]) fprintf(stderr, "train: token cache: %s\n", t->tokens.note);
    if (t->tokens.n_docs > 0)
        fprintf(stderr, "train: %lld documents ([data] documents = %s), %.0f tokens each on average\n",
                (long long)t->tokens.n_docs, c->data.documents, (double)t->tokens.n / (double)t->tokens.n_docs);
    if (t->bt.streams)
        fprintf(stderr, "train: order = streams: each row reads a stream of %lld tokens (%lld windows)%s\n",
                (long long)t->bt.stream_len, (long long)t->bt.stream_windows,
                t->carry ? "; carry_state: the recurrent layers' state carries from window to window"
                         : ", every window from a zero state");
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
             "\"start_step\":%lld,\"machine\":%s,\"openblas_core\":%s,\"gemm\":\"%s\",\"products\":\"%s\","
             "\"attn_tiles\":\"%s\",\"ranks\":%d,\"zero\":%d,\"device\":\"%s\"}",
             runlog_json_str(t->config_path, cfg, sizeof cfg), (long long)params_count(&t->ps, false), t->threads,
             REAL_NAME, (long long)t->step, runlog_json_str(un->machine, mach, sizeof mach),
             runlog_json_str(blas_core_name(), core, sizeof core), blas_backend_name(blas_backend),
             blas_precision_name(t->cfg.train.device == DEVICE_CUDA ? (GemmPrecision)t->cfg.train.precision
                                                                    : blas_precision),
             t->cfg.train.device == DEVICE_CPU ? bf16_tiles_name(attn_tiles_kind(2, 2, 2, 2)) : "none", t->ranks,
             t->ranks > 1 ? t->cfg.train.zero : 0, device_name((Device)t->cfg.train.device));
    runlog_json(rl, json);
}

// The end of a finished run: final evaluation, DSA decode speed, checkpoint,
// the end record, the plot and what was written. Returns the exit code.
static int finish(Trainer *t, RunLog *rl, const TrainerOptions *o) {
    const TrainConfig *c = &t->cfg;
    char json[768];
    evaluate(t, rl, (int)t->step, o->quiet);
    // (a timing: rank 0 alone, on the run's device)
    if (lm_dsa_count(&t->lm) > 0 && t->rank == 0) {
        dsa_eval_decode_speed(&t->lm, (Device)c->train.device, DSA_DECODE_CTX, DSA_DECODE_STEPS,
                              (uint64_t)c->train.seed, t->dsa_mode, &t->decode_dense_tok_s, &t->decode_sparse_tok_s);
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
    if (!s.ok) {   // (rank 0's verdict; the others wrote nothing)
        fprintf(stderr, "train: the final checkpoint was not written: %s\n", s.msg);
        code = 1;
    }
    double bpb = t->last_val_loss / log(2.0) / t->val_bytes_per_token;
    char val[96] = "\"val_loss\":null,\"val_bpb\":null";
    if (t->has_val) snprintf(val, sizeof val, "\"val_loss\":%.6f,\"val_bpb\":%.6f", t->last_val_loss, bpb);
    DistStats ds = dist_grads_stats(t->dg);
    char comm[200] = "";
    if (ds.steps > 0)
        snprintf(comm, sizeof comm, ",\"ranks\":%d,\"reduced_bytes_per_step\":%lld,\"buckets\":%d,"
                 "\"buckets_started_in_backward\":%.3f,\"comm_wait_ms_per_step\":%.3f,\"comm_span_ms_per_step\":%.3f",
                 t->ranks, (long long)ds.bytes, ds.n_buckets,
                 (double)ds.started_in_backward / ((double)ds.steps * (ds.n_buckets ? ds.n_buckets : 1)),
                 1e3 * ds.wait_s / ds.steps, 1e3 * ds.comm_s / ds.steps);
    snprintf(json, sizeof json, "{\"type\":\"end\",\"step\":%lld,%s,\"elapsed_s\":%.1f%s}", (long long)t->step,
             val, runlog_now() - rl->t_start, comm);
    runlog_json(rl, json);
    bool plotted = false;
    if (!o->quiet) {
        const char *base = strrchr(t->config_path, '/');
        RunLogPlot p = runlog_plot_labels(base ? base + 1 : t->config_path, c->finetune.mode == FT_INDEXER,
                                          t->tok.bpe != NULL);
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

// The stop message when training cannot go on from a non-finite value (rank 0 prints it).
static int stop_nonfinite(const Trainer *t, const char *what) {
    if (t->rank != 0) return 3;
    fprintf(stderr, "\ntrain: %s at step %lld: stopping. ", what, (long long)t->step + 1);
    if (t->saved_step >= 0)
        fprintf(stderr, "The last good checkpoint (%s, step %lld) is kept.\n", t->ckpt, (long long)t->saved_step);
    else
        fprintf(stderr, "No checkpoint was written by this run.\n");
    return 3;
}

// What one step produced.
typedef struct StepResult {
    double loss, gnorm, lr;
    bool stop;          // every rank stops after this step (a signal reached one of them)
    bool stop_ends_job; // and that signal was SIGINT or SIGTERM on some rank (the same on all)
    char what[300];     // why training cannot go on ("" when it can)
} StepResult;

// The scaling, clipping, update and finite check of a GPU run in one
// process: optim_device.h's one stretch of device work (a graph's replay
// when cuda_graph is on), the same bits as the calls of train_step's other
// branch and the same verdicts.
static void device_step(Trainer *t, int warmup, StepResult *r) {
    const TrainConfig *c = &t->cfg;
    double lr = lr_cosine(t->step, warmup, c->train.steps, c->train.lr, c->train.min_lr);
    OptimDeviceResult o;
    optim_device_step(&t->ostep, &t->opt, &t->ps, c->train.accum_steps, c->train.grad_clip, lr, &o);
    r->gnorm = o.norm;
    if (!o.stepped) {
        snprintf(r->what, sizeof r->what, "the gradient norm is not finite");
        return;
    }
    r->lr = lr;
    if (o.bad)
        snprintf(r->what, sizeof r->what, "the update made parameter '%s' (or its optimizer state) non-finite",
                 o.bad->name);
}

// One optimizer step: the micro-batches, the gradients (reduced across ranks
// under MPI), clipping, the update. Every rank reaches the same verdict: the
// loss, the gradient norm and the stop flag are summed over the ranks in one
// small reduction, so a NaN or a signal on one rank stops all at this step.
static void train_step(Trainer *t, int warmup, StepResult *r) {
    const TrainConfig *c = &t->cfg;
    int accum = c->train.accum_steps, Bl = batcher_share(&t->bt), T = c->data.seq_len;
    bool dist = t->dg != NULL;
    memset(r, 0, sizeof *r);
    params_zero_grad(&t->ps);
    double loss_sum = 0;
    for (int a = 0; a < accum; a++) {
        batcher_train(&t->bt, t->x, t->y, t->doc);
        loss_sum += train_micro_batch(t, Bl, T, dist && a == accum - 1, 1.0 / accum);
    }
    r->loss = loss_sum / accum;   // under MPI: this rank's share
    if (dist) {
        dist_grads_wait(t->dg);   // ps->grad: the global batch's gradient (ZeRO-1: on this rank's slice)
        double v[4] = {r->loss, optim_grad_sumsq(&t->ps, t->slice_lo, t->slice_hi), stop_requested ? 1 : 0,
                       stop_requested & STOP_ENDING ? 1 : 0};
        dist_sum(v, 4, "step reduction");
        r->loss = v[0];
        r->gnorm = sqrt(v[1]);
        r->stop = v[2] > 0;
        r->stop_ends_job = v[3] > 0;
    }
    if (!isfinite(r->loss)) {
        snprintf(r->what, sizeof r->what, "the loss is %g", r->loss);
        return;
    }
    if (!dist && t->ostep.hyper) {
        device_step(t, warmup, r);
        return;
    }
    if (!dist) {
        if (accum > 1) optim_scale_grads(&t->ps, 1.0 / accum);
        r->gnorm = optim_clip_grad_norm(&t->ps, c->train.grad_clip);
    } else if (c->train.grad_clip > 0 && r->gnorm > c->train.grad_clip) {
        optim_scale_grads(&t->ps, c->train.grad_clip / (r->gnorm + 1e-6));
    }
    if (!isfinite(r->gnorm)) {
        snprintf(r->what, sizeof r->what, "the gradient norm is not finite");
        return;
    }
    r->lr = lr_cosine(t->step, warmup, c->train.steps, c->train.lr, c->train.min_lr);
    optim_step(&t->opt, &t->ps, r->lr);
    dist_params_allgather(t->dg);   // ZeRO-1: every rank gets the slices the others updated
    const Tensor *bad = optim_nonfinite_param(&t->ps, &t->opt);
    if (dist && c->train.zero) {    // each rank checked its own moments: agree
        double f = bad ? 1 : 0;
        dist_sum(&f, 1, "step check");
        if (f > 0 && !bad) {
            snprintf(r->what, sizeof r->what, "the update made the optimizer state of another rank non-finite");
            return;
        }
    }
    if (bad)
        snprintf(r->what, sizeof r->what, "the update made parameter '%s' (or its optimizer state) non-finite",
                 bad->name);
}

int trainer_run(Trainer *t, const TrainerOptions *opts) {
    const TrainConfig *c = &t->cfg;
    int B = c->data.batch_size, T = c->data.seq_len;
    bool lead = t->rank == 0;
    TrainerOptions quiet_opts = *opts;   // only rank 0 speaks
    quiet_opts.quiet = opts->quiet || !lead;
    const TrainerOptions *o = &quiet_opts;
    RunLog rl;
    memset(&rl, 0, sizeof rl);
    rl.jsonl = rl.tsv = -1;   // (other ranks log nothing)
    rl.t_start = runlog_now();
    Status s = lead ? runlog_open(&rl, t->run_dir, c->train.steps, o->resume) : status_ok();
    if (s.ok && lead) s = run_dir_write_file(&t->rd, "config.ini", t->cfg.text);
    if (!s.ok) fprintf(stderr, "train: run folder: %s\n", s.msg);
    double ok = s.ok ? 0 : 1;
    dist_sum(&ok, 1, "start");
    if (ok > 0) {
        runlog_close(&rl);
        return 2;
    }
    struct utsname un;
    uname(&un);
    if (!o->quiet) print_start(t, o, &un);
    log_start(t, &rl, &un);

    t->graph.quiet = o->quiet;
    t->ostep.quiet = o->quiet;
    stop_requested = 0;
    stop_ended_job = false;
    // (SIGUSR1: what mpirun forwards to the ranks without ending the job.)
    static const int sigs[] = {SIGINT, SIGTERM, SIGUSR1};
    struct sigaction old_sigs[3];
    signals_catch(sigs, 3, stop_handler, old_sigs);
    double tok_per_step = (double)B * T * c->train.accum_steps;   // the global batch
    int warmup = config_warmup_steps(c);
    double ema = 0;
    int exit_code = 0, run_steps = 0;
    while (t->step < c->train.steps) {
        double t0 = runlog_now();
        StepResult r;
        train_step(t, warmup, &r);
        if (r.what[0]) {
            exit_code = stop_nonfinite(t, r.what);
            break;
        }
        record_loss(t, r.loss);
        t->step++;
        run_steps++;
        double dt = runlog_now() - t0;
        ema = ema == 0 ? dt : 0.9 * ema + 0.1 * dt;
        int done = (int)t->step;
        bool print = !o->quiet && (done % c->train.log_every == 0 || done == c->train.steps || run_steps == 1);
        runlog_train(&rl, done, r.loss, r.lr, r.gnorm, tok_per_step / dt, ema * (c->train.steps - done), print);
        if (c->train.eval_every > 0 && done % c->train.eval_every == 0 && done != c->train.steps)
            evaluate(t, &rl, done, o->quiet);
        // One process reads its flag here; ranks act on the flag they summed (the same on all).
        bool stop = t->dg ? r.stop : stop_requested;
        stop_ended_job = t->dg ? r.stop_ends_job : (stop_requested & STOP_ENDING) != 0;
        if (o->stop_after > 0 && run_steps == o->stop_after) stop = true;
        if ((c->train.checkpoint_every > 0 && done % c->train.checkpoint_every == 0) || stop) {
            s = save_checkpoint(t);
            if (!s.ok) fprintf(stderr, "\ntrain: checkpoint of step %d not written: %s\n", done, s.msg);
        }
        if (stop) {
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
    // After a stop by a signal the handler stays until the process ends: a
    // repeat of the signal (timeout(1) sends SIGTERM to the process and to
    // its group) that comes after the checkpoint is written would otherwise
    // end train by the default action (status 143, not 130). A repeat within
    // a second is still the one request; a later one is _exit(130).
    if (!(exit_code == 130 && stop_requested)) signals_restore(sigs, 3, old_sigs);
    if (exit_code == 0) exit_code = finish(t, &rl, o);
    runlog_close(&rl);
    return exit_code;
}

void trainer_free(Trainer *t) {
    free(t->x);
    free(t->y);
    free(t->doc);
    if (t->carry) lm_cache_free(&t->lm, t->carry);
    lm_graph_free(&t->graph);
    optim_device_free(&t->ostep);
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
    dist_grads_free(t->dg);
    memset(t, 0, sizeof *t);
    t->rd.lock_fd = -1;
}

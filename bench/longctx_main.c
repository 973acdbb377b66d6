// longctx: length generalisation on synthetic long-range tasks. Trains a
// small model of each mixer at one length (T = 256) on passkey retrieval
// (data/passkey.h) or MQAR with a gap (data/mqar_gap.h), then tests it on
// fresh sequences at longer lengths (and, for the passkey, at several
// depths), and prints an accuracy table.
//
//   longctx [--task passkey|mqar_gap] [--mixers attn,linear,mamba,gdn,hybrid] [--layers 2] [--width 64] [--params N]
//           [--train-len 256] [--test-lens 256,1024,4096,16384,32768] [--depths 0,0.25,0.5,0.75,1]
//           [--digits 2] [--pairs 8] [--queries 8] [--vocab 64] [--steps 2000] [--batch 16] [--lr 3e-3]
//           [--seed 1] [--eval-every 250] [--stop-at 0.99] [--test-tokens 262144] [--min-seqs 8]
//           [--tsv FILE] [--curve FILE]
//
// Each model: embedding, `layers` x (mixer + SwiGLU MLP of width 2D), tied
// head; H = 2 heads of size D/2 (the setting of bench/mqar_main.c). With
// --params N every model gets the MLP width d_ff nearest to a count of N
// parameters (the mixers' own projections differ: at d_ff = 2D a 2-layer
// attn of width 64 has 11% fewer than gdn); without it d_ff = 2D. "hybrid" is
// (layers - 1) gdn layers, then one attn layer. Training: AdamW (0.9, 0.98,
// weight decay 0.1), gradient clip 1, warm-up 10% then cosine to lr/10; the
// passkey's depth is uniform at random in training. --eval-every N checks the
// accuracy at the training length on 4 fresh batches every N steps (and
// --curve FILE records it); a run stops once a check reaches --stop-at.
//
// Testing: at each length and depth, max(min-seqs, test-tokens / length)
// fresh sequences (at most 64), as many to a forward as fit in 32k tokens.
// Passkey accuracy: the share of sequences whose whole passkey is predicted
// (the argmax of every digit, teacher-forced), and per digit; MQAR: the share
// of answers right (depth "-"; both columns then agree). --stop-at and the
// curve use the same figure at the training length.
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>

#include "version.h"
#include "bench_util.h"
#include "lm.h"
#include "model_setup.h"
#include "mqar_gap.h"
#include "optim.h"
#include "passkey.h"
#include "runlog.h"

#define MAX_LIST 16

static int parse_numbers(const char *s, double *out, int max) {
    char names[MAX_LIST][16];
    int n = bench_parse_names(s, names, max < MAX_LIST ? max : MAX_LIST);
    for (int i = 0; i < n; i++) {
        char *end;
        out[i] = strtod(names[i], &end);
        if (end == names[i] || *end) return -1;
    }
    return n;
}

typedef struct Task {
    bool passkey;
    PasskeySpec pk;
    MqarGapSpec mq;
} Task;

static int task_vocab(const Task *t) { return t->passkey ? t->pk.vocab : t->mq.vocab; }

static Status task_check(const Task *t, int T) {
    if (t->passkey) {
        PasskeySpec s = t->pk;
        s.T = T;
        return passkey_check(&s);
    }
    MqarGapSpec s = t->mq;
    s.T = T;
    return mqar_gap_check(&s);
}

static void task_batch(const Task *t, int T, Rng *r, int B, double depth, int *x, int *y) {
    if (t->passkey) {
        PasskeySpec s = t->pk;
        s.T = T;
        passkey_batch(&s, r, B, depth, x, y, NULL);
    } else {
        MqarGapSpec s = t->mq;
        s.T = T;
        mqar_gap_batch(&s, r, B, x, y);
    }
}

typedef struct Acc {
    double seq;      // sequences whose every scored target is right
    double token;    // scored targets right
    int seqs;
} Acc;

// The figure a task is judged by: a passkey is retrieved when all its digits
// are right; MQAR counts each answer.
static double acc_main(const Task *t, Acc a) { return t->passkey ? a.seq : a.token; }

// Accuracy on n fresh sequences of length T at `depth`, rows per forward so
// that one holds at most 32k tokens.
static Acc evaluate(LM *lm, const Task *t, int T, double depth, int n, uint64_t seed) {
    int rows = 32768 / T > 0 ? 32768 / T : 1;
    if (rows > n) rows = n;
    int *x = xmalloc((size_t)rows * T * sizeof(int)), *y = xmalloc((size_t)rows * T * sizeof(int));
    Tape tp;
    tape_init(&tp);
    tape_no_grad_push(&tp);
    Rng r;
    rng_seed(&r, seed);
    long seq_right = 0, tok_right = 0, tok_total = 0;
    for (int done = 0; done < n; done += rows) {
        int B = n - done < rows ? n - done : rows;
        task_batch(t, T, &r, B, depth, x, y);
        Tensor *logits = lm_forward(&tp, lm, x, B, T, NULL, NULL);
        int V = logits->shape[2];
        for (int b = 0; b < B; b++) {
            bool all = true;
            for (int i = 0; i < T; i++) {
                int64_t k = (int64_t)b * T + i;
                if (y[k] < 0) continue;
                const real *row = logits->data + k * V;
                int best = 0;
                for (int j = 1; j < V; j++)
                    if (row[j] > row[best]) best = j;
                tok_right += best == y[k];
                tok_total++;
                all = all && best == y[k];
            }
            seq_right += all;
        }
        tape_reset(&tp);
    }
    tape_no_grad_pop(&tp);
    tape_free(&tp);
    free(x);
    free(y);
    return (Acc){(double)seq_right / n, tok_total ? (double)tok_right / tok_total : 0, n};
}

static void build_model(LM *lm, ParamStore *ps, const char *mixer, int L, int D, int F, int V, uint64_t seed) {
    LMConfig c;
    memset(&c, 0, sizeof c);
    c.vocab_size = V;
    c.d_model = D;
    c.d_ff = F;
    c.tied = true;
    c.norm_eps = 1e-6;
    c.mixer = mixer_config_default(D, 2, D / 2, D / 2);
    c.mixer.chunk_size = 64;
    c.mixer.topk = 64;
    char layers[LM_MAX_LAYERS * 8] = "";
    for (int l = 0; l < L; l++) {
        const char *kind = strcmp(mixer, "hybrid") ? mixer : (l == L - 1 ? "attn" : "gdn");
        snprintf(layers + strlen(layers), sizeof layers - strlen(layers), "%s%s", l ? "," : "", kind);
    }
    Status s = lm_parse_layers(&c, layers);
    ASSERT(s.ok, "longctx: %s", s.msg);
    params_init(ps);
    lm_create(lm, &c, ps);
    params_finalize(ps, seed);
}

// The MLP width that brings a model's parameter count nearest to `target`
// (0: the default 2D). The mixers differ in their projections; the SwiGLU
// MLP's 3 D F weights per layer absorb the difference, so every mixer gets
// the same budget.
static int matched_d_ff(const char *mixer, int L, int D, int V, long target) {
    if (target <= 0) return 2 * D;
    LM lm;
    ParamStore ps;
    build_model(&lm, &ps, mixer, L, D, 2 * D, V, 1);
    long base = (long)params_count(&ps, false);
    lm_destroy(&lm);
    params_free(&ps);
    long F = 2 * D + lround((double)(target - base) / (3.0 * D * L));
    return F < 1 ? 1 : (int)F;
}

// The command line's settings.
typedef struct Opts {
    Task task;
    char mixers[MAX_LIST][16];
    int n_mixers, n_lens, n_depths;
    double lens[MAX_LIST], depths[MAX_LIST];
    int L, D, train_len, steps, B, eval_every, min_seqs;
    long test_tokens, target_params;
    double lr, stop_at;
    uint64_t seed;
    const char *tsv, *curve;
} Opts;

// Read the arguments over the defaults and check them; false (after a
// message) when one is bad.
static bool parse_opts(int argc, char **argv, Opts *o) {
    *o = (Opts){.task = {.passkey = true, .pk = {64, 2, 0}, .mq = {64, 8, 8, 0}}, .L = 2, .D = 64, .train_len = 256,
                .steps = 2000, .B = 16, .eval_every = 250, .min_seqs = 8, .test_tokens = 262144, .lr = 3e-3,
                .stop_at = 0.99, .seed = 1};
    o->n_mixers = bench_parse_names("attn,linear,mamba,gdn,hybrid", o->mixers, MAX_LIST);
    o->n_lens = parse_numbers("256,1024,4096,16384,32768", o->lens, MAX_LIST);
    o->n_depths = parse_numbers("0,0.25,0.5,0.75,1", o->depths, MAX_LIST);
    for (int i = 1; i < argc; i++) {
        bool has = i + 1 < argc, ok = true;
        const char *a = argv[i], *v = has ? argv[i + 1] : "";
        if (!has) ok = false;
        else if (!strcmp(a, "--task")) ok = !strcmp(v, "passkey") || !strcmp(v, "mqar_gap"), o->task.passkey = !strcmp(v, "passkey");
        else if (!strcmp(a, "--mixers")) o->n_mixers = bench_parse_names(v, o->mixers, MAX_LIST);
        else if (!strcmp(a, "--layers")) o->L = atoi(v), ok = o->L >= 1 && o->L <= LM_MAX_LAYERS;
        else if (!strcmp(a, "--width")) o->D = atoi(v), ok = o->D >= 4 && o->D % 4 == 0;
        else if (!strcmp(a, "--params")) o->target_params = atol(v), ok = o->target_params >= 0;
        else if (!strcmp(a, "--train-len")) o->train_len = atoi(v), ok = o->train_len > 0;
        else if (!strcmp(a, "--test-lens")) ok = (o->n_lens = parse_numbers(v, o->lens, MAX_LIST)) > 0;
        else if (!strcmp(a, "--depths")) ok = (o->n_depths = parse_numbers(v, o->depths, MAX_LIST)) > 0;
        else if (!strcmp(a, "--digits")) o->task.pk.n_digits = atoi(v);
        else if (!strcmp(a, "--pairs")) o->task.mq.n_pairs = atoi(v);
        else if (!strcmp(a, "--queries")) o->task.mq.n_queries = atoi(v);
        else if (!strcmp(a, "--vocab")) o->task.pk.vocab = o->task.mq.vocab = atoi(v);
        else if (!strcmp(a, "--steps")) o->steps = atoi(v), ok = o->steps > 0;
        else if (!strcmp(a, "--batch")) o->B = atoi(v), ok = o->B > 0;
        else if (!strcmp(a, "--lr")) o->lr = atof(v), ok = o->lr > 0;
        else if (!strcmp(a, "--seed")) o->seed = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--eval-every")) o->eval_every = atoi(v), ok = o->eval_every >= 0;
        else if (!strcmp(a, "--stop-at")) o->stop_at = atof(v);
        else if (!strcmp(a, "--test-tokens")) o->test_tokens = atol(v), ok = o->test_tokens > 0;
        else if (!strcmp(a, "--min-seqs")) o->min_seqs = atoi(v), ok = o->min_seqs > 0 && o->min_seqs <= 64;
        else if (!strcmp(a, "--tsv")) o->tsv = v;
        else if (!strcmp(a, "--curve")) o->curve = v;
        else ok = false;
        if (!ok) {
            fprintf(stderr, "longctx: bad or incomplete argument '%s%s%s' (see --help)\n", a, has ? " " : "", v);
            return false;
        }
        i++;
    }
    if (!o->task.passkey) o->n_depths = 1, o->depths[0] = -1;   // MQAR has no depth: its gap is fixed by the length
    for (int k = -1; k < o->n_lens; k++) {
        int T = k < 0 ? o->train_len : (int)o->lens[k];
        Status s = T > 0 ? task_check(&o->task, T) : status_err("length %g", o->lens[k]);
        if (!s.ok) {
            fprintf(stderr, "longctx: %s\n", s.msg);
            return false;
        }
    }
    for (int m = 0; m < o->n_mixers; m++)
        if (strcmp(o->mixers[m], "hybrid") && !mixer_kind_find(o->mixers[m])) {
            fprintf(stderr, "longctx: unknown mixer '%s' (known: %s, hybrid)\n", o->mixers[m], mixer_kind_names());
            return false;
        }
    return true;
}

// Train mixer m's model until o->steps or a check at --stop-at; returns the
// steps taken, with the last check's accuracy and the seconds spent outside
// the checks in *train_acc and *train_secs. x, y: (B, train_len) buffers.
static int train_model(const Opts *o, int m, LM *lm, ParamStore *ps, Optimizer *opt, Tape *tp, int *x, int *y,
                       FILE *cout, double *train_acc_out, double *train_secs) {
    const char *task_name = o->task.passkey ? "passkey" : "mqar_gap";
    Rng r;
    rng_seed(&r, o->seed * 1000 + 7);
    double t0 = runlog_now(), eval_secs = 0, loss_sum = 0, train_acc = NAN;
    int step = 0, loss_n = 0;
    while (step < o->steps) {
        task_batch(&o->task, o->train_len, &r, o->B, -1, x, y);
        params_zero_grad(ps);
        Tensor *loss = lm_loss(tp, lm, x, y, o->B, o->train_len, NULL);
        loss_sum += loss->data[0], loss_n++;
        tape_backward(tp, loss);
        tape_reset(tp);
        optim_clip_grad_norm(ps, 1.0);
        optim_step(opt, ps, lr_cosine(step, o->steps / 10, o->steps, o->lr, o->lr / 10));
        step++;
        if (o->eval_every > 0 && (step % o->eval_every == 0 || step == o->steps)) {
            double e0 = runlog_now();
            train_acc = acc_main(
                &o->task, evaluate(lm, &o->task, o->train_len, -1, 4 * o->B, o->seed + 1000000 + (uint64_t)step));
            eval_secs += runlog_now() - e0;
            printf("  %s step %5d: loss %.4f, accuracy %5.1f%% at T = %d\n", o->mixers[m], step, loss_sum / loss_n,
                   100 * train_acc, o->train_len);
            fflush(stdout);
            if (cout) {
                fprintf(cout, "%s\t%s\t%d\t%.4f\t%.4f\n", task_name, o->mixers[m], step, loss_sum / loss_n, train_acc);
                fflush(cout);
            }
            loss_sum = 0, loss_n = 0;
            if (train_acc >= o->stop_at) break;
        }
    }
    *train_secs = runlog_now() - t0 - eval_secs;
    *train_acc_out = train_acc;
    return step;
}

// Test mixer m's trained model at every length and depth: a line of the
// table each, and a row of the TSV (out, may be NULL).
static void test_model(const Opts *o, int m, LM *lm, long long n_params, int F, int step, double train_secs,
                       double train_acc, FILE *out) {
    const char *task_name = o->task.passkey ? "passkey" : "mqar_gap";
    for (int k = 0; k < o->n_lens; k++)
        for (int d = 0; d < o->n_depths; d++) {
            int T = (int)o->lens[k];
            long want = o->test_tokens / T;
            int n = want < o->min_seqs ? o->min_seqs : (want > 64 ? 64 : (int)want);
            double e0 = runlog_now();
            Acc a =
                evaluate(lm, &o->task, T, o->depths[d], n, o->seed + 99 + 7919 * (uint64_t)k + 104729 * (uint64_t)d);
            double secs = runlog_now() - e0;
            // Passkey: the depth; MQAR: the gap (filler tokens between the last pair and the first query).
            char depth[16];
            int gap = -1;
            if (o->depths[d] < 0) {
                MqarGapSpec g = o->task.mq;
                g.T = T;
                gap = mqar_gap_length(&g);
                snprintf(depth, sizeof depth, "-");
            } else {
                snprintf(depth, sizeof depth, "%g", o->depths[d]);
            }
            char col[16];
            if (o->task.passkey) snprintf(col, sizeof col, "%s", depth);
            else snprintf(col, sizeof col, "%d", gap);
            printf("%-8s %8lld %5d %10.1f %6d %8d %7s %6d %8.1f%% %8.1f%% %8.1f\n", o->mixers[m], n_params, F,
                   train_secs, step, T, col, n, 100 * acc_main(&o->task, a), 100 * a.token, secs);
            fflush(stdout);
            if (out) {
                fprintf(out, "%s\t%s\t%d\t%d\t%d\t%lld\t%d\t%.1f\t%.4f\t%d\t%s\t%d\t%d\t%.4f\t%.4f\t%.1f\t%llu\n",
                        task_name, o->mixers[m], o->L, o->D, F, n_params, step, train_secs, train_acc, T, depth, gap, n,
                        acc_main(&o->task, a), a.token, secs, (unsigned long long)o->seed);
                fflush(out);
            }
        }
}

int main(int argc, char **argv) {
    if (program_version(argc, argv, "longctx")) return 0;   // (linked into bin/ as a user program)
    if (bench_help(argc, argv,
                   "usage: longctx [--task passkey|mqar_gap] [--mixers attn,linear,mamba,gdn,hybrid] [--layers 2]\n"
                   "               [--width 64] [--params N] [--train-len 256] [--test-lens 256,1024,4096,16384,32768]\n"
                   "               [--depths 0,0.25,0.5,0.75,1] [--digits 2] [--pairs 8] [--queries 8] [--vocab 64]\n"
                   "               [--steps 2000] [--batch 16] [--lr 3e-3] [--seed 1] [--eval-every 250]\n"
                   "               [--stop-at 0.99] [--test-tokens 262144] [--min-seqs 8] [--tsv FILE] [--curve FILE]\n"
                   "  trains each mixer on a synthetic long-range task at --train-len and tests it at longer lengths\n"))
        return 0;
    model_init_process(argv);   // OMP_WAIT_POLICY=PASSIVE unless the user set it
    Opts op;
    if (!parse_opts(argc, argv, &op)) return 2;
    const Opts *o = &op;
    FILE *out = o->tsv ? fopen(o->tsv, "w") : NULL, *cout = o->curve ? fopen(o->curve, "w") : NULL;
    if ((o->tsv && !out) || (o->curve && !cout)) {
        fprintf(stderr, "longctx: cannot write '%s'\n", o->tsv && !out ? o->tsv : o->curve);
        return 2;
    }
    struct utsname un;
    uname(&un);
    int threads = omp_get_max_threads();
    if (o->task.passkey)
        printf("# passkey: %d digits, vocab %d", o->task.pk.n_digits, o->task.pk.vocab);
    else
        printf("# mqar_gap: %d pairs, %d queries, vocab %d", o->task.mq.n_pairs, o->task.mq.n_queries,
               o->task.mq.vocab);
    printf(
        "; %d-layer models of width %d trained at T = %d: up to %d steps of batch %d, lr %.0e, seed %llu; %s, "
        "%d thread%s, %s\n",
        o->L, o->D, o->train_len, o->steps, o->B, o->lr, (unsigned long long)o->seed, un.machine, threads,
        threads == 1 ? "" : "s", REAL_NAME);
    printf("%-8s %8s %5s %10s %6s %8s %7s %6s %9s %9s %8s\n", "mixer", "params", "d_ff", "train_s", "steps", "test_T",
           o->task.passkey ? "depth" : "gap", "seqs", "accuracy", "per_token", "test_s");
    if (out)
        fprintf(out, "task\tmixer\tlayers\twidth\td_ff\tparams\tsteps\ttrain_s\ttrain_acc\ttest_T\tdepth\tgap\tseqs\t"
                     "accuracy\ttoken_accuracy\ttest_s\tseed\n");
    if (cout) fprintf(cout, "task\tmixer\tstep\tloss\taccuracy\n");
    int *x = xmalloc((size_t)o->B * o->train_len * sizeof(int)),
        *y = xmalloc((size_t)o->B * o->train_len * sizeof(int));
    for (int m = 0; m < o->n_mixers; m++) {
        LM lm;
        ParamStore ps;
        int F = matched_d_ff(o->mixers[m], o->L, o->D, task_vocab(&o->task), o->target_params);
        build_model(&lm, &ps, o->mixers[m], o->L, o->D, F, task_vocab(&o->task), o->seed);
        long long n_params = (long long)params_count(&ps, false);
        Optimizer opt;
        adamw_init(&opt, &ps, 0.9, 0.98, 1e-8, 0.1);
        Tape tp;
        tape_init(&tp);
        double train_acc, train_secs;
        int step = train_model(o, m, &lm, &ps, &opt, &tp, x, y, cout, &train_acc, &train_secs);
        test_model(o, m, &lm, n_params, F, step, train_secs, train_acc, out);
        tape_free(&tp);
        optim_free(&opt);
        lm_destroy(&lm);
        params_free(&ps);
    }
    if (out) fclose(out);
    if (cout) fclose(cout);
    free(x);
    free(y);
    return 0;
}

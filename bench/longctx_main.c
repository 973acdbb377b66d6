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
    char mixers[MAX_LIST][16];
    int n_mixers = bench_parse_names("attn,linear,mamba,gdn,hybrid", mixers, MAX_LIST);
    double lens[MAX_LIST], depths[MAX_LIST];
    int n_lens = parse_numbers("256,1024,4096,16384,32768", lens, MAX_LIST);
    int n_depths = parse_numbers("0,0.25,0.5,0.75,1", depths, MAX_LIST);
    Task task = {.passkey = true, .pk = {64, 2, 0}, .mq = {64, 8, 8, 0}};
    int L = 2, D = 64, train_len = 256, steps = 2000, B = 16, eval_every = 250, min_seqs = 8;
    long test_tokens = 262144, target_params = 0;
    double lr = 3e-3, stop_at = 0.99;
    uint64_t seed = 1;
    const char *tsv = NULL, *curve = NULL;
    for (int i = 1; i < argc; i++) {
        bool has = i + 1 < argc, ok = true;
        const char *o = argv[i], *v = has ? argv[i + 1] : "";
        if (!has) ok = false;
        else if (!strcmp(o, "--task")) ok = !strcmp(v, "passkey") || !strcmp(v, "mqar_gap"), task.passkey = !strcmp(v, "passkey");
        else if (!strcmp(o, "--mixers")) n_mixers = bench_parse_names(v, mixers, MAX_LIST);
        else if (!strcmp(o, "--layers")) L = atoi(v), ok = L >= 1 && L <= LM_MAX_LAYERS;
        else if (!strcmp(o, "--width")) D = atoi(v), ok = D >= 4 && D % 4 == 0;
        else if (!strcmp(o, "--params")) target_params = atol(v), ok = target_params >= 0;
        else if (!strcmp(o, "--train-len")) train_len = atoi(v), ok = train_len > 0;
        else if (!strcmp(o, "--test-lens")) ok = (n_lens = parse_numbers(v, lens, MAX_LIST)) > 0;
        else if (!strcmp(o, "--depths")) ok = (n_depths = parse_numbers(v, depths, MAX_LIST)) > 0;
        else if (!strcmp(o, "--digits")) task.pk.n_digits = atoi(v);
        else if (!strcmp(o, "--pairs")) task.mq.n_pairs = atoi(v);
        else if (!strcmp(o, "--queries")) task.mq.n_queries = atoi(v);
        else if (!strcmp(o, "--vocab")) task.pk.vocab = task.mq.vocab = atoi(v);
        else if (!strcmp(o, "--steps")) steps = atoi(v), ok = steps > 0;
        else if (!strcmp(o, "--batch")) B = atoi(v), ok = B > 0;
        else if (!strcmp(o, "--lr")) lr = atof(v), ok = lr > 0;
        else if (!strcmp(o, "--seed")) seed = strtoull(v, NULL, 10);
        else if (!strcmp(o, "--eval-every")) eval_every = atoi(v), ok = eval_every >= 0;
        else if (!strcmp(o, "--stop-at")) stop_at = atof(v);
        else if (!strcmp(o, "--test-tokens")) test_tokens = atol(v), ok = test_tokens > 0;
        else if (!strcmp(o, "--min-seqs")) min_seqs = atoi(v), ok = min_seqs > 0 && min_seqs <= 64;
        else if (!strcmp(o, "--tsv")) tsv = v;
        else if (!strcmp(o, "--curve")) curve = v;
        else ok = false;
        if (!ok) {
            fprintf(stderr, "longctx: bad or incomplete argument '%s%s%s' (see --help)\n", o, has ? " " : "", v);
            return 2;
        }
        i++;
    }
    if (!task.passkey) n_depths = 1, depths[0] = -1;   // MQAR has no depth: its gap is fixed by the length
    for (int k = -1; k < n_lens; k++) {
        int T = k < 0 ? train_len : (int)lens[k];
        Status s = T > 0 ? task_check(&task, T) : status_err("length %g", lens[k]);
        if (!s.ok) {
            fprintf(stderr, "longctx: %s\n", s.msg);
            return 2;
        }
    }
    for (int m = 0; m < n_mixers; m++)
        if (strcmp(mixers[m], "hybrid") && !mixer_kind_find(mixers[m])) {
            fprintf(stderr, "longctx: unknown mixer '%s' (known: %s, hybrid)\n", mixers[m], mixer_kind_names());
            return 2;
        }
    FILE *out = tsv ? fopen(tsv, "w") : NULL, *cout = curve ? fopen(curve, "w") : NULL;
    if ((tsv && !out) || (curve && !cout)) {
        fprintf(stderr, "longctx: cannot write '%s'\n", tsv && !out ? tsv : curve);
        return 2;
    }
    struct utsname un;
    uname(&un);
    int threads = omp_get_max_threads();
    if (task.passkey)
        printf("# passkey: %d digits, vocab %d", task.pk.n_digits, task.pk.vocab);
    else
        printf("# mqar_gap: %d pairs, %d queries, vocab %d", task.mq.n_pairs, task.mq.n_queries, task.mq.vocab);
    printf("; %d-layer models of width %d trained at T = %d: up to %d steps of batch %d, lr %.0e, seed %llu; %s, "
           "%d thread%s, %s\n",
           L, D, train_len, steps, B, lr, (unsigned long long)seed, un.machine, threads, threads == 1 ? "" : "s",
           REAL_NAME);
    printf("%-8s %8s %5s %10s %6s %8s %7s %6s %9s %9s %8s\n", "mixer", "params", "d_ff", "train_s", "steps", "test_T",
           task.passkey ? "depth" : "gap", "seqs", "accuracy", "per_token", "test_s");
    if (out)
        fprintf(out, "task\tmixer\tlayers\twidth\td_ff\tparams\tsteps\ttrain_s\ttrain_acc\ttest_T\tdepth\tgap\tseqs\t"
                     "accuracy\ttoken_accuracy\ttest_s\tseed\n");
    if (cout) fprintf(cout, "task\tmixer\tstep\tloss\taccuracy\n");
    const char *task_name = task.passkey ? "passkey" : "mqar_gap";
    int *x = xmalloc((size_t)B * train_len * sizeof(int)), *y = xmalloc((size_t)B * train_len * sizeof(int));
    for (int m = 0; m < n_mixers; m++) {
        LM lm;
        ParamStore ps;
        int F = matched_d_ff(mixers[m], L, D, task_vocab(&task), target_params);
        build_model(&lm, &ps, mixers[m], L, D, F, task_vocab(&task), seed);
        long long n_params = (long long)params_count(&ps, false);
        Optimizer opt;
        adamw_init(&opt, &ps, 0.9, 0.98, 1e-8, 0.1);
        Tape tp;
        tape_init(&tp);
        Rng r;
        rng_seed(&r, seed * 1000 + 7);
        double t0 = runlog_now(), eval_secs = 0, loss_sum = 0, train_acc = NAN;
        int step = 0, loss_n = 0;
        while (step < steps) {
            task_batch(&task, train_len, &r, B, -1, x, y);
            params_zero_grad(&ps);
            Tensor *loss = lm_loss(&tp, &lm, x, y, B, train_len, NULL);
            loss_sum += loss->data[0], loss_n++;
            tape_backward(&tp, loss);
            tape_reset(&tp);
            optim_clip_grad_norm(&ps, 1.0);
            optim_step(&opt, &ps, lr_cosine(step, steps / 10, steps, lr, lr / 10));
            step++;
            if (eval_every > 0 && (step % eval_every == 0 || step == steps)) {
                double e0 = runlog_now();
                train_acc = acc_main(&task, evaluate(&lm, &task, train_len, -1, 4 * B, seed + 1000000 + (uint64_t)step));
                eval_secs += runlog_now() - e0;
                printf("  %s step %5d: loss %.4f, accuracy %5.1f%% at T = %d\n", mixers[m], step, loss_sum / loss_n,
                       100 * train_acc, train_len);
                fflush(stdout);
                if (cout) {
                    fprintf(cout, "%s\t%s\t%d\t%.4f\t%.4f\n", task_name, mixers[m], step, loss_sum / loss_n, train_acc);
                    fflush(cout);
                }
                loss_sum = 0, loss_n = 0;
                if (train_acc >= stop_at) break;
            }
        }
        double train_secs = runlog_now() - t0 - eval_secs;
        for (int k = 0; k < n_lens; k++)
            for (int d = 0; d < n_depths; d++) {
                int T = (int)lens[k];
                long want = test_tokens / T;
                int n = want < min_seqs ? min_seqs : (want > 64 ? 64 : (int)want);
                double e0 = runlog_now();
                Acc a = evaluate(&lm, &task, T, depths[d], n, seed + 99 + 7919 * (uint64_t)k + 104729 * (uint64_t)d);
                double secs = runlog_now() - e0;
                // Passkey: the depth; MQAR: the gap (filler tokens between the last pair and the first query).
                char depth[16];
                int gap = -1;
                if (depths[d] < 0) {
                    MqarGapSpec g = task.mq;
                    g.T = T;
                    gap = mqar_gap_length(&g);
                    snprintf(depth, sizeof depth, "-");
                } else {
                    snprintf(depth, sizeof depth, "%g", depths[d]);
                }
                char col[16];
                if (task.passkey) snprintf(col, sizeof col, "%s", depth);
                else snprintf(col, sizeof col, "%d", gap);
                printf("%-8s %8lld %5d %10.1f %6d %8d %7s %6d %8.1f%% %8.1f%% %8.1f\n", mixers[m], n_params, F,
                       train_secs, step, T, col, n, 100 * acc_main(&task, a), 100 * a.token, secs);
                fflush(stdout);
                if (out) {
                    fprintf(out, "%s\t%s\t%d\t%d\t%d\t%lld\t%d\t%.1f\t%.4f\t%d\t%s\t%d\t%d\t%.4f\t%.4f\t%.1f\t%llu\n",
                            task_name, mixers[m], L, D, F, n_params, step, train_secs, train_acc, T, depth, gap, n,
                            acc_main(&task, a), a.token, secs, (unsigned long long)seed);
                    fflush(out);
                }
            }
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

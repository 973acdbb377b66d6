// mqar: train 2-layer models of each mixer on multi-query associative recall
// (data/mqar.h) at a few widths and report recall accuracy.
//
//   mqar [--mixers attn,gdn,mamba,linear] [--widths 32,64] [--pairs 16] [--seq 128]
//        [--vocab 256] [--steps 1500] [--batch 32] [--lr 3e-3] [--seed 1] [--tsv FILE]
//        [--eval-every N] [--stop-at ACC] [--curve FILE]
//
// Each model: embedding, 2 x (mixer + SwiGLU MLP), tied head; H = 2 heads of
// size d_model / 2, so the recurrent state per layer is 2 x (d/2)^2 numbers.
//
// --lr takes a list (e.g. 1e-3,3e-3): every (mixer, width) is trained once
// per learning rate, and a summary at the end names the best per (mixer,
// width), as the Zoology paper reports. --eval-every N measures accuracy on 4
// fresh batches every N steps (printed, and written to --curve FILE as
// mixer, width, lr, step, mean training loss since the last point, accuracy);
// --stop-at ACC ends a run as soon as such a measurement reaches ACC (e.g.
// 0.99), so a solved run does not spend the rest of its budget. The final
// accuracy is always measured on 16 other fresh batches.
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <time.h>

#include "blas.h"
#include "bench_util.h"
#include "lm.h"
#include "mqar.h"
#include "optim.h"
#include "runlog.h"
#include "model_setup.h"

// Accuracy on scored positions of n_batches fresh batches.
static double evaluate(LM *lm, const MqarSpec *s, int B, int n_batches, uint64_t seed) {
    Tape tp;
    tape_init(&tp);
    tape_no_grad_push(&tp);
    Rng r;
    rng_seed(&r, seed);
    int *x = xmalloc((size_t)B * s->T * sizeof(int)), *y = xmalloc((size_t)B * s->T * sizeof(int));
    long right = 0, total = 0;
    for (int i = 0; i < n_batches; i++) {
        mqar_batch(s, &r, B, x, y);
        Tensor *logits = lm_forward(&tp, lm, x, B, s->T, NULL, NULL);
        int V = logits->shape[2];
        for (int t = 0; t < B * s->T; t++) {
            if (y[t] < 0) continue;
            const real *row = logits->data + (int64_t)t * V;
            int best = 0;
            for (int j = 1; j < V; j++)
                if (row[j] > row[best]) best = j;
            right += best == y[t];
            total++;
        }
        tape_reset(&tp);
    }
    tape_no_grad_pop(&tp);
    tape_free(&tp);
    free(x);
    free(y);
    return total ? (double)right / total : 0;
}

// A 2-layer model of `mixer` and width D (H = 2 heads of D/2, MLP 2D, tied
// head), its parameters drawn from seed.
static void build_model(LM *lm, ParamStore *ps, const char *mixer, int D, int vocab, uint64_t seed) {
    LMConfig c;
    memset(&c, 0, sizeof c);
    c.vocab_size = vocab;
    c.d_model = D;
    c.d_ff = 2 * D;
    c.tied = true;
    c.norm_eps = 1e-6;
    c.mixer = mixer_config_default(D, 2, D / 2, D / 2);
    c.mixer.chunk_size = 32;
    c.mixer.topk = 32;
    char layers[64];
    snprintf(layers, sizeof layers, "%s,%s", mixer, mixer);
    lm_parse_layers(&c, layers);
    params_init(ps);
    lm_create(lm, &c, ps);
    params_finalize(ps, seed);
}

// Train for `steps` (or until a check every eval_every steps reaches
// stop_at, each also a line of the curve file cout when given); returns the
// steps taken and in *secs the seconds of training alone.
static int train_model(LM *lm, ParamStore *ps, Optimizer *opt, Tape *tp, const MqarSpec *spec, const char *mixer, int D,
                       double lr, int steps, int B, int eval_every, double stop_at, uint64_t seed, FILE *cout, int *x,
                       int *y, double *secs) {
    Rng r;
    rng_seed(&r, seed * 1000 + 7);
    double t0 = runlog_now(), eval_secs = 0, loss_sum = 0;
    int step = 0, loss_n = 0;
    while (step < steps) {
        mqar_batch(spec, &r, B, x, y);
        params_zero_grad(ps);
        Tensor *loss = lm_loss(tp, lm, x, y, B, spec->T, NULL);
        loss_sum += loss->data[0], loss_n++;
        tape_backward(tp, loss);
        tape_reset(tp);
        optim_clip_grad_norm(ps, 1.0);
        optim_step(opt, ps, lr_cosine(step, steps / 10, steps, lr, lr / 10));
        step++;
        if (eval_every > 0 && (step % eval_every == 0 || step == steps)) {
            double e0 = runlog_now();
            double a = evaluate(lm, spec, B, 4, seed + 1000000 + (uint64_t)step);
            eval_secs += runlog_now() - e0;
            printf("  %s d%d lr %.0e step %5d: loss %.4f, accuracy %5.1f%%\n", mixer, D, lr, step,
                   loss_sum / loss_n, 100 * a);
            fflush(stdout);
            if (cout) {
                fprintf(cout, "%s\t%d\t%g\t%d\t%.4f\t%.4f\n", mixer, D, lr, step, loss_sum / loss_n, a);
                fflush(cout);
            }
            loss_sum = 0, loss_n = 0;
            if (a >= stop_at) break;
        }
    }
    *secs = runlog_now() - t0 - eval_secs;
    return step;
}

int main(int argc, char **argv) {
    if (bench_help(argc, argv, "usage: mqar [--mixers attn,gdn,mamba,linear] [--widths 32,64] [--pairs 16] [--seq 128] [--vocab 256]\n            [--steps 1500] [--batch 32] [--lr 3e-3[,1e-3...]] [--seed 1] [--tsv FILE] [--eval-every N]\n            [--stop-at ACC] [--curve FILE]\n  multi-query associative recall: trains 2-layer models of each mixer and width, prints accuracy\n")) return 0;
    model_init_process(argv);   // OMP_WAIT_POLICY=PASSIVE unless the user set it
    blas_select_from_env();     // ATTNLAB_GEMM=auto|openblas|onednn (default auto)
    char mixers[8][16], widths_s[8][16];
    int n_mixers = bench_parse_names("attn,gdn,mamba,linear", mixers, 8);
    int n_widths = bench_parse_names("32,64", widths_s, 8);
    MqarSpec spec = {256, 16, 128};
    int steps = 1500, B = 32;
    char lrs_s[8][16];
    int n_lrs = bench_parse_names("3e-3", lrs_s, 8);
    int eval_every = 0;
    double stop_at = 2;   // > 1: never
    uint64_t seed = 1;
    const char *tsv = NULL, *curve = NULL;
    for (int i = 1; i < argc; i++) {
        bool has = i + 1 < argc;
        if (!strcmp(argv[i], "--mixers") && has) n_mixers = bench_parse_names(argv[++i], mixers, 8);
        else if (!strcmp(argv[i], "--widths") && has) n_widths = bench_parse_names(argv[++i], widths_s, 8);
        else if (!strcmp(argv[i], "--pairs") && has) spec.n_pairs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seq") && has) spec.T = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--vocab") && has) spec.vocab = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--steps") && has) steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--batch") && has) B = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--lr") && has) n_lrs = bench_parse_names(argv[++i], lrs_s, 8);
        else if (!strcmp(argv[i], "--eval-every") && has) eval_every = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--stop-at") && has) stop_at = atof(argv[++i]);
        else if (!strcmp(argv[i], "--curve") && has) curve = argv[++i];
        else if (!strcmp(argv[i], "--seed") && has) seed = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--tsv") && has) tsv = argv[++i];
        else {
            fprintf(stderr, "mqar: unknown or incomplete argument '%s' (see the comment at the top of bench/mqar_main.c)\n",
                    argv[i]);
            return 2;
        }
    }
    Status st = mqar_check(&spec);
    if (!st.ok) {
        fprintf(stderr, "%s\n", st.msg);
        return 2;
    }
    for (int m = 0; m < n_mixers; m++)
        if (!mixer_kind_find(mixers[m])) {
            fprintf(stderr, "mqar: unknown mixer '%s' (known: %s)\n", mixers[m], mixer_kind_names());
            return 2;
        }
    double lrs[8];
    for (int l = 0; l < n_lrs; l++) {
        lrs[l] = atof(lrs_s[l]);
        if (!(lrs[l] > 0)) {
            fprintf(stderr, "mqar: learning rate '%s' is not a positive number\n", lrs_s[l]);
            return 2;
        }
    }
    struct utsname un;
    uname(&un);
    printf("# MQAR: vocab %d, %d pairs, T %d; 2-layer models, %d steps of batch %d, AdamW lr", spec.vocab,
           spec.n_pairs, spec.T, steps, B);
    for (int l = 0; l < n_lrs; l++) printf("%s%.0e", l ? "," : " ", lrs[l]);
    printf("; %s, %d thread%s, %s, gemm %s\n", un.machine, omp_get_max_threads(), omp_get_max_threads() == 1 ? "" : "s",
           REAL_NAME, blas_describe());
    printf("%-8s %6s %10s %12s %8s %6s %10s %8s\n", "mixer", "width", "params", "state/layer", "lr", "steps", "accuracy",
           "time_s");
    FILE *out = tsv ? fopen(tsv, "w") : NULL;
    FILE *cout = curve ? fopen(curve, "w") : NULL;
    if ((tsv && !out) || (curve && !cout)) {
        fprintf(stderr, "mqar: cannot write '%s'\n", tsv && !out ? tsv : curve);
        return 2;
    }
    if (out) fprintf(out, "mixer\twidth\tparams\tstate\taccuracy\ttime_s\tlr\tsteps\n");
    if (cout) fprintf(cout, "mixer\twidth\tlr\tstep\tloss\taccuracy\n");
    double best_acc[8][8], best_lr[8][8];
    int *x = xmalloc((size_t)B * spec.T * sizeof(int)), *y = xmalloc((size_t)B * spec.T * sizeof(int));
    for (int m = 0; m < n_mixers; m++)
        for (int w = 0; w < n_widths; w++)
            for (int l = 0; l < n_lrs; l++) {
                int D = atoi(widths_s[w]);
                double lr = lrs[l];
                ParamStore ps;
                LM lm;
                build_model(&lm, &ps, mixers[m], D, spec.vocab, seed);
                Optimizer opt;
                adamw_init(&opt, &ps, 0.9, 0.98, 1e-8, 0.1);
                Tape tp;
                tape_init(&tp);
                double secs;   // training only
                int step = train_model(&lm, &ps, &opt, &tp, &spec, mixers[m], D, lr, steps, B, eval_every, stop_at,
                                       seed, cout, x, y, &secs);
                double acc = evaluate(&lm, &spec, B, 16, seed + 99);
                bool rec = lm.blocks[0].mixer->kind->recurrent;
                long state = rec ? 2L * (D / 2) * (D / 2) : 2L * spec.T * D;   // attn: its KV cache at length T
                printf("%-8s %6d %10lld %12ld %8.0e %6d %9.1f%% %8.1f\n", mixers[m], D,
                       (long long)params_count(&ps, false), state, lr, step, 100 * acc, secs);
                fflush(stdout);
                if (out) {
                    fprintf(out, "%s\t%d\t%lld\t%ld\t%.4f\t%.1f\t%g\t%d\n", mixers[m], D,
                            (long long)params_count(&ps, false), state, acc, secs, lr, step);
                    fflush(out);
                }
                if (l == 0 || acc > best_acc[m][w]) best_acc[m][w] = acc, best_lr[m][w] = lr;
                tape_free(&tp);
                optim_free(&opt);
                lm_destroy(&lm);
                params_free(&ps);
            }
    if (n_lrs > 1) {
        printf("# best learning rate per mixer and width\n");
        for (int m = 0; m < n_mixers; m++)
            for (int w = 0; w < n_widths; w++)
                printf("%-8s %6d %8.0e %9.1f%%\n", mixers[m], atoi(widths_s[w]), best_lr[m][w], 100 * best_acc[m][w]);
    }
    if (out) fclose(out);
    if (cout) fclose(cout);
    free(x);
    free(y);
    return 0;
}

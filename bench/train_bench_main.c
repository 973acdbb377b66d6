// train_bench: tokens/s of a training step of the LM of a config, on random
// tokens (no corpus, no logging, no checkpoints): forward, backward, gradient
// clipping and AdamW, exactly the work of one `train` step.
//
//   train_bench --config tiny_gdn.ini [--set section.key=value ...] [--steps N] [--warmup W] [--profile]
//               [--device cpu|cuda] [--graph on|off|both] [--optim queued|calls]
//
// The first step allocates the tape arena block by block and the second
// consolidates it into one block (page faults both times): time from step 3 on.
//
// Threads: [train] threads (0 = OpenMP's default; OMP_NUM_THREADS). Prints the
// machine, the thread count, the time of each part of the step (median over
// the timed steps) and, last, one line for scripts:
//   RESULT config=<name> B=.. T=.. threads=.. params=.. fwd_ms=.. bwd_ms=.. opt_ms=.. step_ms=.. tokens_per_s=..
//          cpu_ms=.. tokens_per_cpu_s=.. blas_core=.. gemm=.. products=.. device=.. graph=.. optim=.. opt_graph=..
//          attn_tiles=..
//   (cpu: CPU time of all threads per step; gemm, products: [train] gemm and
//   precision as resolved, e.g. --set train.gemm=openblas --set train.precision=bf16; attn_tiles: the
//   attention's tile products, [train] bf16_tiles as resolved under bf16, else fp32)
//   With --device cuda (a build with AG_CUDA) the parameters, moments, tape
//   and step run on the GPU; each part is timed to a synchronisation of the
//   stream; the RESULT line ends in device=cuda (the GPU is named in the header).
//   On the GPU the forward and backward replay from a CUDA graph as in `train`
//   ([train] cuda_graph, lm_graph.h): fwd_ms is then the forward and backward
//   together and bwd_ms 0, and the line ends in graph=on. --graph on|off
//   overrides the config; --graph both times eager steps, then graph steps
//   from the same parameters, one RESULT line each and their ratio.
//   The clip + optimizer part is `train`'s: clipping, AdamW and the finite
//   check of the parameters and moments. On the GPU it is queued as one
//   stretch of work (optim_device.h; --optim queued, the default), replayed
//   from its own graph when the forward and backward are (opt_graph=on in the
//   RESULT line); --optim calls times optim.h's calls instead (a kernel per
//   parameter tensor and three reads back), as `train` ran before.
// bench/compare_torch.sh runs it next to the PyTorch reference.
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <time.h>

#include "bench_util.h"
#include "blas.h"
#include "device.h"
#include "lm_graph.h"
#include "optim_device.h"
#include "model_setup.h"
#include "optim.h"
#include "runlog.h"
#include "tile_amx.h"

#ifndef SOURCE_DIR
#define SOURCE_DIR "."
#endif

static void print_machine(void) {
    struct utsname u;
    if (uname(&u) == 0) printf("machine: %s %s %s\n", u.sysname, u.release, u.machine);
    char cpu[256];
    runlog_cpu_name(cpu, sizeof cpu);
    printf("cpu: %s\n", cpu);
}

static void usage(FILE *f) {
    fprintf(f, "usage: train_bench --config FILE [--set section.key=value ...] [--steps N] [--warmup W] [--profile]\n"
               "                   [--device cpu|cuda] [--graph on|off|both] [--optim queued|calls]\n"
               "  times N training steps (default 5) after W untimed ones (default 2) on random tokens;\n"
               "  --profile also prints the time of each op kind (forward, backward) per step (eager steps);\n"
               "  --graph: CUDA graphs on the GPU (default: [train] cuda_graph), or both: eager, then graphs\n"
               "  --optim: on the GPU, the clip + optimizer work queued as one (default) or optim.h's calls\n");
}

// The header: the machine, the config (file name base) and its model, the
// threads and products, the device.
static void print_setup(const char *base, const LM *lm, const ParamStore *ps, const TrainConfig *cfg, int threads,
                        Device device) {
    int B = cfg->data.batch_size, T = cfg->data.seq_len;
    print_machine();
    printf("config: %s   layers:", base);
    for (int l = 0; l < lm->cfg.n_layers; l++) printf("%s%s", l ? "," : " ", lm->cfg.layers[l]);
    printf("   B %d, T %d, D %d, params %lld, form %s, chunk %d\n", B, T, lm->cfg.d_model,
           (long long)params_count(ps, false), mixer_form_name(cfg->model.form), cfg->model.chunk_size);
    printf("threads: %d (omp_get_max_threads)   precision: %s   OpenBLAS core: %s\n", threads, REAL_NAME,
           blas_core_name());
    if (device == DEVICE_CPU) {
        printf("GEMM: %s\n", blas_describe());
    } else {   // the GPU's products follow [train] precision; blas_describe is the CPU's (unused by the step)
        printf("device: %s\n", device_describe(device));
        printf("products on the GPU: %s\n", blas_precision_name((GemmPrecision)cfg->train.precision));
    }
}

// warmup untimed training steps, then `steps` timed ones on the tokens x, y
// (B = batch_size rows of T = seq_len): each part's wall time (forward,
// backward, clip + optimizer, the step) and the step's CPU time into tf, tb,
// to, ts, tc. With profile the tape profiles the timed steps. With gr the
// forward and backward replay from its graph (tf: both, tb: 0). With od the
// clip + optimizer work is od's (else optim.h's calls). Returns the last
// step's loss.
static double run_steps(LM *lm, ParamStore *ps, Optimizer *opt, Tape *tp, const TrainConfig *cfg, const int *x,
                        const int *y, int warmup, int steps, bool profile, LMGraph *gr, OptimDevice *od, double *tf,
                        double *tb, double *to, double *ts, double *tc) {
    int B = cfg->data.batch_size, T = cfg->data.seq_len;
    double last_loss = 0;
    for (int it = 0; it < warmup + steps; it++) {
        if (profile && it == warmup) tape_profile(tp, true);
        double c0 = runlog_cpu_now(), t0 = runlog_now();
        params_zero_grad(ps);
        double t1, t2;
        if (gr) {   // (reads the loss back: waits)
            last_loss = lm_graph_micro_batch(gr, tp, lm, x, y, NULL, B, T, NULL);
            t1 = t2 = runlog_now();
        } else {
            Tensor *loss = lm_loss(tp, lm, x, y, B, T, NULL);
            dev_sync(tp->device);
            t1 = runlog_now();
            tape_backward(tp, loss);
            real l;
            dev_to_host(&l, loss->data, sizeof l, tp->device);   // (waits for the backward on a GPU)
            last_loss = l;
            tape_reset(tp);
            t2 = runlog_now();
        }
        if (od) {   // (reads the norm and the finite check back: waits)
            OptimDeviceResult r;
            optim_device_step(od, opt, ps, 1, cfg->train.grad_clip, cfg->train.lr, &r);
        } else {
            optim_clip_grad_norm(ps, cfg->train.grad_clip);   // (reads the norm back: waits)
            optim_step(opt, ps, cfg->train.lr);
            (void)optim_nonfinite_param(ps, opt);
        }
        dev_sync(tp->device);
        double t3 = runlog_now(), c3 = runlog_cpu_now();
        if (it >= warmup) {
            int j = it - warmup;
            tf[j] = t1 - t0;
            tb[j] = t2 - t1;
            to[j] = t3 - t2;
            ts[j] = t3 - t0;
            tc[j] = c3 - c0;
        }
    }
    return last_loss;
}

// Times the steps (eagerly, or with CUDA graphs when g; the optimizer's work
// queued as one when queued) and prints the per-step line and the RESULT
// line; returns tokens/s.
static double bench_run(LM *lm, ParamStore *ps, Optimizer *opt, Tape *tp, const TrainConfig *cfg, const char *base,
                        int threads, const int *x, const int *y, int warmup, int steps, bool profile, bool g,
                        bool queued) {
    int B = cfg->data.batch_size, T = cfg->data.seq_len;
    Device device = tp->device;
    LMGraph gr;
    lm_graph_init(&gr, device, g);
    OptimDevice od;
    memset(&od, 0, sizeof od);
    queued = queued && optim_device_supported(device);
    if (queued) optim_device_init(&od, device, g);
    double *tf = xmalloc((size_t)steps * sizeof(double)), *tb = xmalloc((size_t)steps * sizeof(double));
    double *to = xmalloc((size_t)steps * sizeof(double)), *ts = xmalloc((size_t)steps * sizeof(double));
    double *tc = xmalloc((size_t)steps * sizeof(double));
    double last_loss = run_steps(lm, ps, opt, tp, cfg, x, y, warmup, steps, profile, g ? &gr : NULL,
                                 queued ? &od : NULL, tf, tb, to, ts, tc);
    double mf = bench_median(tf, steps), mb = bench_median(tb, steps), mo = bench_median(to, steps);
    double ms = bench_median(ts, steps), mc = bench_median(tc, steps);
    bool on = g && !gr.off;
    if (g)
        printf("CUDA graph: %s; %lld replays, %lld captures, %lld eager micro-batches\n",
               gr.off ? gr.why : "on", (long long)gr.replays, (long long)gr.captures, (long long)gr.eager);
    bool opt_on = queued && od.g && !od.off;
    if (queued && g)
        printf("the optimizer's CUDA graph: %s; %lld replays, %lld captures, %lld eager steps\n",
               od.off ? od.why : "on", (long long)od.replays, (long long)od.captures, (long long)od.eager);
    printf("per step (median of %d after %d warm-up): forward%s %.1f ms, backward %.1f ms, clip+AdamW %.1f ms, "
           "total %.1f ms = %.0f tokens/s; CPU time %.1f ms = %.0f tokens per CPU-second   (last loss %.4f)\n",
           steps, warmup, g ? "+backward (graph)" : "", 1e3 * mf, 1e3 * mb, 1e3 * mo, 1e3 * ms, B * T / ms, 1e3 * mc,
           B * T / mc, last_loss);
    printf("RESULT config=%s B=%d T=%d threads=%d params=%lld fwd_ms=%.2f bwd_ms=%.2f opt_ms=%.2f step_ms=%.2f "
           "tokens_per_s=%.0f cpu_ms=%.2f tokens_per_cpu_s=%.0f blas_core=%s gemm=%s products=%s device=%s graph=%s "
           "optim=%s opt_graph=%s attn_tiles=%s\n",
           base, B, T, threads, (long long)params_count(ps, false), 1e3 * mf, 1e3 * mb, 1e3 * mo, 1e3 * ms,
           B * T / ms, 1e3 * mc, B * T / mc, blas_core_name(), blas_backend_name(blas_backend),
           blas_precision_name(device == DEVICE_CUDA ? (GemmPrecision)cfg->train.precision : blas_precision),
           device_name(device), on ? "on" : "off", queued ? "queued" : "calls", opt_on ? "on" : "off",
           device == DEVICE_CPU ? bf16_tiles_name(attn_tiles_kind(2, 2, 2, 2)) : "none");
    if (profile) {
        printf("op profile (per step, wall time; forward ops include their builders):\n");
        tape_profile_print(tp, stdout, steps);
        tape_profile(tp, false);
    }
    lm_graph_free(&gr);
    if (queued) optim_device_free(&od);
    free(tf);
    free(tb);
    free(to);
    free(ts);
    free(tc);
    return B * T / ms;
}

int main(int argc, char **argv) {
    model_init_process(argv);   // OMP_WAIT_POLICY=PASSIVE unless the user set it
    const char *config = NULL;
    int steps = 5, warmup = 2;   // the tape arena settles into one block during step 2
    bool profile = false;
    Device device = DEVICE_CPU;
    const char *graph_arg = NULL;   // on | off | both (NULL: [train] cuda_graph)
    bool queued = true;             // --optim queued | calls
    TrainConfig cfg;
    config_defaults(&cfg, model_mixer_known);
    const char **sets = calloc((size_t)argc, sizeof *sets);
    int n_sets = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--config") && i + 1 < argc) config = argv[++i];
        else if (!strcmp(argv[i], "--set") && i + 1 < argc) sets[n_sets++] = argv[++i];
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--warmup") && i + 1 < argc) warmup = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--profile")) profile = true;
        else if (!strcmp(argv[i], "--graph") && i + 1 < argc) {
            graph_arg = argv[++i];
            if (strcmp(graph_arg, "on") && strcmp(graph_arg, "off") && strcmp(graph_arg, "both")) {
                fprintf(stderr, "train_bench: --graph '%.40s': expected on, off or both\n", graph_arg);
                return 2;
            }
        }
        else if (!strcmp(argv[i], "--optim") && i + 1 < argc) {
            const char *a = argv[++i];
            if (strcmp(a, "queued") && strcmp(a, "calls")) {
                fprintf(stderr, "train_bench: --optim '%.40s': expected queued or calls\n", a);
                return 2;
            }
            queued = !strcmp(a, "queued");
        }
        else if (!strcmp(argv[i], "--device") && i + 1 < argc) {
            int d = device_parse(argv[++i]);
            if (d < 0) {
                fprintf(stderr, "train_bench: --device '%.40s': expected cpu or cuda\n", argv[i]);
                return 2;
            }
            device = (Device)d;
        }
        else {
            usage(strcmp(argv[i], "--help") ? stderr : stdout);
            return strcmp(argv[i], "--help") ? 2 : 0;
        }
    }
    if (!config || steps < 1 || warmup < 0) {
        usage(stderr);
        return 2;
    }
    char path[CONFIG_STR_MAX];
    Status s = config_find(config, CONFIG_SEARCH_DIRS, CONFIG_N_SEARCH_DIRS, path, sizeof path);
    if (s.ok) s = config_load_file(&cfg, path);
    for (int i = 0; s.ok && i < n_sets; i++) s = config_set(&cfg, sets[i]);
    if (s.ok) s = config_validate(&cfg);
    LM lm;
    ParamStore ps;
    if (s.ok) s = model_build(&cfg, &lm, &ps, NULL);
    if (!s.ok) {
        fprintf(stderr, "train_bench: %s\n", s.msg);
        return 2;
    }
    if (device == DEVICE_CUDA) cfg.train.device = DEVICE_CUDA;   // --device cuda = --set train.device=cuda
    device = (Device)cfg.train.device;
    // Graphs where the config has them (auto: on the GPU) unless --graph says otherwise.
    bool graphs = cfg.train.cuda_graph != CFG_GRAPH_OFF && !config_cuda_graph_refusal(&cfg);
    if (graph_arg) graphs = strcmp(graph_arg, "off") != 0;
    const char *why = graphs ? config_cuda_graph_refusal(&cfg) : NULL;
    if (why) {
        fprintf(stderr, "train_bench: --graph %s: %s\n", graph_arg, why);
        return 2;
    }
    int threads = model_set_threads(cfg.train.threads);
    if (!(s = model_set_products(&cfg)).ok) {   // [train] gemm, precision (--set train.gemm=onednn ...)
        fprintf(stderr, "train_bench: %s\n", s.msg);
        return 2;
    }
    if (device == DEVICE_CUDA) {
        char err[512];
        if (!device_cuda_init(err, sizeof err)) {
            fprintf(stderr, "train_bench: --device cuda: %s\n", err);
            return 2;
        }
        params_to_device(&ps, device);
    }
    int B = cfg.data.batch_size, T = cfg.data.seq_len;
    Optimizer opt;
    adamw_init(&opt, &ps, cfg.train.beta1, cfg.train.beta2, cfg.train.adam_eps, cfg.train.weight_decay);
    Tape tp;
    tape_init_on(&tp, device);
    int *x = xmalloc((size_t)B * T * sizeof(int)), *y = xmalloc((size_t)B * T * sizeof(int));
    Rng r;
    rng_seed(&r, 1);
    for (int i = 0; i < B * T; i++) {
        x[i] = (int)rng_below(&r, (uint64_t)lm.cfg.vocab_size);
        y[i] = (int)rng_below(&r, (uint64_t)lm.cfg.vocab_size);
    }

    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    print_setup(base, &lm, &ps, &cfg, threads, device);

    bool both = graph_arg && !strcmp(graph_arg, "both");
    real *start = NULL;   // both runs start from these values
    if (both) {
        start = xmalloc((size_t)ps.numel * sizeof(real));
        memcpy(start, params_pull(&ps), (size_t)ps.numel * sizeof(real));
    }
    double tps[2] = {0, 0};
    for (int run = both ? 0 : 1; run < 2; run++) {
        bool g = graphs && run == 1;
        if (both && run == 1) {   // the same values, fresh moments
            dev_from_host(ps.data, device, start, (size_t)ps.numel * sizeof(real));
            optim_free(&opt);
            adamw_init(&opt, &ps, cfg.train.beta1, cfg.train.beta2, cfg.train.adam_eps, cfg.train.weight_decay);
        }
        tps[run] = bench_run(&lm, &ps, &opt, &tp, &cfg, base, threads, x, y, warmup, steps, profile && !g, g, queued);
    }
    if (both)
        printf("graph vs eager: %.0f vs %.0f tokens/s = %.2fx\n", tps[1], tps[0], tps[0] > 0 ? tps[1] / tps[0] : 0);
    free(start);
    free(x);
    free(y);
    free(sets);
    tape_free(&tp);
    optim_free(&opt);
    lm_destroy(&lm);
    params_free(&ps);
    config_free(&cfg);
    return 0;
}

// dist_bench: data-parallel training speed and communication, one layout per
// run (not a test). Run it as `train` runs: alone, or under mpirun.
//
//   dist_bench --config tiny_gdn.ini [--steps N] [--set section.key=value ...]
//   OMP_NUM_THREADS=1 mpirun -np 2 dist_bench --config tiny_gdn.ini --set train.zero=1
//
// It trains N steps (default 12) of the config on its corpus through the
// trainer (the real step: shared batches, the reduction overlapped with the
// backward, clipping, AdamW), in a scratch run folder, then measures the
// reduction alone: K times, every bucket of the gradient started at once
// and waited for, as a step would without any overlap (and, with ZeRO-1, the
// all-gather of the parameters). Rank 0 prints one line for scripts:
//   RESULT config=.. params=.. ranks=.. threads=.. zero=.. tokens_per_s=.. step_ms=..
//          comm_ms=.. exposed_ms=.. hidden=.. waited_ms=.. allgather_ms=.. bytes=.. buckets=..
//          opt_state_mb=.. rss_mb=.. load=..
// tokens_per_s and step_ms: medians over the steps after the first 2 (the
// global batch); comm_ms: the reduction alone, median of K; exposed_ms: the
// reduction's time after the backward, from the end of the last rank's
// backward to the last rank's reduced gradient (median over the steps; the
// ranks of one machine share the clock); hidden = 1 - exposed / comm;
// waited_ms: the mean wait of rank 0 (which includes waiting for a slower
// rank); opt_state_mb: this rank's AdamW
// moments; rss_mb: the mean resident memory of a rank; load: the 1-minute
// load average at the end.
#define _GNU_SOURCE   // nftw's FTW_DEPTH with FTW_PHYS
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_util.h"
#include "runlog.h"
#include "trainer.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *x, int n) {
    if (n <= 0) return 0;
    qsort(x, (size_t)n, sizeof *x, cmp_double);
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

// tok_per_s of the training records of metrics.jsonl from step `from` on.
static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

static int step_speeds(const char *run_dir, int from, double *out, int cap) {
    char path[1200];
    snprintf(path, sizeof path, "%s/metrics.jsonl", run_dir);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[4096];
    int n = 0;
    while (n < cap && fgets(line, sizeof line, f)) {
        const char *s = strstr(line, "{\"type\":\"train\",\"step\":");
        const char *v = strstr(line, "\"tok_per_s\":");
        if (!s || !v || atoi(s + strlen("{\"type\":\"train\",\"step\":")) < from) continue;
        out[n++] = strtod(v + strlen("\"tok_per_s\":"), NULL);
    }
    fclose(f);
    return n;
}

static double rss_mb(void) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return 0;
    char line[256];
    double kb = 0;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "VmRSS:", 6)) kb = atof(line + 6);
    fclose(f);
    return kb / 1024;
}

static const char USAGE[] =
    "usage: dist_bench --config FILE [--steps N] [--reps K] [--set section.key=value ...]\n"
    "  trains N steps (default 12) through the trainer, then times the gradient reduction alone K times\n"
    "  (default 5); alone or under mpirun; rank 0 prints a RESULT line\n";

int main(int argc, char **argv) {
    model_init_process(argv);
    dist_init(&argc, &argv);
    if (bench_help(argc, argv, dist_rank() == 0 ? USAGE : "")) {
        dist_finalize();
        return 0;
    }
    const char *config = NULL;
    int steps = 12, reps = 5, n_sets = 0;
    const char **sets = calloc((size_t)argc + 8, sizeof *sets);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--config") && i + 1 < argc) config = argv[++i];
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--set") && i + 1 < argc) sets[n_sets++] = argv[++i];
        else {
            if (dist_rank() == 0) fprintf(stderr, "dist_bench: unknown argument '%s'\n%s", argv[i], USAGE);
            dist_finalize();
            return 2;
        }
    }
    if (!config || steps < 3 || reps < 1) {
        if (dist_rank() == 0) fputs(USAGE, stderr);
        dist_finalize();
        return 2;
    }
    // One scratch run folder, named by rank 0's pid.
    double pid = (double)getpid();
    dist_bcast(&pid, sizeof pid, "setup");
    const char *tmp = getenv("TMPDIR");
    char run_dir[600], set_dir[700], set_steps[64];
    snprintf(run_dir, sizeof run_dir, "%s/attnlab-dist-bench-%.0f", tmp && *tmp ? tmp : "/tmp", pid);
    snprintf(set_dir, sizeof set_dir, "train.run_dir=%s", run_dir);
    snprintf(set_steps, sizeof set_steps, "train.steps=%d", steps);
    const char *fixed[] = {set_dir, set_steps, "train.eval_every=0", "train.checkpoint_every=0",
                           "train.eval_batches=1", "train.log_every=1000000"};
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) sets[n_sets++] = fixed[i];
    TrainerOptions o = {.config = config, .sets = sets, .n_sets = n_sets, .overwrite = true, .quiet = true};
    static Trainer t;
    Status s = trainer_setup(&t, &o);
    if (!s.ok) {
        if (dist_rank() == 0) fprintf(stderr, "dist_bench: %s\n", s.msg);
        dist_finalize();
        return 2;
    }
    int code = trainer_run(&t, &o);
    DistStats run = dist_grads_stats(t.dg);
    // Each step's communication left after the backward: from the moment the last rank ended its
    // backward to the moment the last rank had the reduced gradient (one clock on one machine).
    const double *bwd, *done;
    int n = dist_grads_times(t.dg, &bwd, &done);
    double *late = calloc((size_t)(2 * n + 1), sizeof *late);
    for (int i = 0; i < n; i++) late[i] = -bwd[i], late[n + i] = -done[i];   // max = -min(-x)
    dist_min(late, 2 * n, "bench");
    for (int i = 0; i < n; i++) late[i] = fmax(0, late[i] - late[n + i]);
    double exposed = n > 2 ? 1e3 * median(late + 2, n - 2) : 0;   // (after the first 2 steps)
    free(late);
    // The reduction alone: every bucket at once (an empty tape: nothing to wait for), K times.
    double *comm = calloc((size_t)reps, sizeof *comm), *gather = calloc((size_t)reps, sizeof *gather);
    Tape empty;
    tape_init(&empty);
    for (int k = 0; t.dg && k < reps; k++) {
        dist_barrier("bench");
        double t0 = runlog_now();
        dist_grads_arm(t.dg, &empty, 1.0);
        dist_grads_wait(t.dg);
        double t1 = runlog_now();
        dist_params_allgather(t.dg);
        gather[k] = 1e3 * (runlog_now() - t1);
        comm[k] = 1e3 * (t1 - t0);
    }
    tape_free(&empty);
    double v[1] = {rss_mb()};
    dist_sum(v, 1, "bench");
    if (t.rank == 0) {
        double speeds[4096];
        int n = step_speeds(run_dir, 3, speeds, 4096);
        double tps = median(speeds, n);
        double gb = (double)t.cfg.data.batch_size * t.cfg.data.seq_len * t.cfg.train.accum_steps;
        double c_ms = median(comm, reps), waited = run.steps ? 1e3 * run.wait_s / run.steps : 0;
        double opt_mb = (double)(t.opt.hi - t.opt.lo) * sizeof(real) * (t.opt.v ? 2 : 1) / (1 << 20);
        double load[1] = {0};
        getloadavg(load, 1);
        const char *base = strrchr(t.config_path, '/');
        printf("RESULT config=%s params=%lld ranks=%d threads=%d zero=%d tokens_per_s=%.0f step_ms=%.1f comm_ms=%.2f "
               "exposed_ms=%.2f hidden=%.2f waited_ms=%.2f allgather_ms=%.2f bytes=%lld buckets=%d "
               "opt_state_mb=%.2f rss_mb=%.1f load=%.2f\n",
               base ? base + 1 : t.config_path, (long long)params_count(&t.ps, true), t.ranks, t.threads, t.ranks > 1 ? t.cfg.train.zero : 0, tps,
               tps > 0 ? 1e3 * gb / tps : 0, c_ms, exposed, c_ms > 0 ? 1 - exposed / c_ms : 1, waited,
               median(gather, reps), (long long)run.bytes, run.n_buckets, opt_mb, v[0] / t.ranks, load[0]);
        // (Removed without a shell: the folder's path comes from TMPDIR.)
        if (nftw(run_dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0)
            fprintf(stderr, "dist_bench: could not remove %s\n", run_dir);
    }
    free(comm);
    free(gather);
    trainer_free(&t);
    free(sets);
    dist_finalize();
    return code;
}

// mixer_bench: every mixer and form at the LAYER level, through the MixerKind
// interface (projections, convolutions, gates and output projection
// included), on this machine.
//
//   mixer_bench [-tokens N] [-T 256,1024,...] [-pos 256,1024,...] [-only ROW[:FORM][,ROW[:FORM]...]]
//               [-reps N] [-tsv DIR] [-no-train] [-no-decode] [-decode-threads N (1; 0 = all)]
//               [-profile] [-docs L]
//
// 1. train: one training step (forward, then backward seeded on the output,
//    gradients into u and every parameter) per (mixer, form, T), with B*T
//    fixed (-tokens, default 16384): microseconds per token, best of -reps
//    (-docs L: every row packs documents of random lengths, uniform in
//    [1, 2L-1], mean L, fixed seed, passed as doc_start: the cost of the
//    document boundaries (docs.h))
//    timed steps after one cold step.
// 2. memory: the cold step's tape-arena high-water and the growth of the
//    process's peak resident set during it (arena + any heap the op
//    allocates, e.g. per-thread scratch), measured by resetting VmHWM through
//    /proc/self/clear_refs. Inputs and parameters exist before and are not
//    counted.
// 3. decode: one sequence (B = 1) stepped token by token; at each context
//    position P the fastest of the next 64 steps (also their median and
//    mean in the TSV). The recurrent kinds and
//    attn_dsa reach P by stepping; attn's KV cache is filled directly with
//    random keys and values up to P (stepping there is O(P^2); the values do
//    not change the work of the next step).
//
// Layer: d_model 256, H 4, dk = dv 64, conv 4, chunk 64, attn_dsa top-k 64,
// gdp n_h = 2 (the row gdp_nh3: 3).
// Rows come from two tables (TRAIN_ROWS, DECODE_ROWS); a row is named by its
// mixer kind, or by its own name where one kind has rows of two settings
// (gdp_nh3); -only picks rows by that name. A mixer kind that -only names
// and the tables do not gets rows as gdn's: its chunked and recurrent forms
// (those it has) and, when recurrent, its decoding. A cell is skipped
// when it would need more than ~4 GiB or a step longer than ~60 s, and the
// table says which. TSV files (train.tsv, decode.tsv) go to -tsv DIR.
#include <malloc.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <time.h>

#include "bench_util.h"
#include "attn_layer.h"
#include "blas.h"
#include "mixer.h"
#include "mixer_bench_rows.h"   // TrainRow, DecodeRow, rows_init, rows_picked, check_only
#include "runlog.h"
#include "model_setup.h"

enum { D_MODEL = 256, N_HEADS = 4, D_HEAD = 64, CONV = 4, CHUNK = 64, TOPK = 64 };
enum { DECODE_WINDOW = 64, MAX_LIST = 16 };
#define MAX_STEP_SECONDS 60.0

typedef struct Options {
    int tokens;                          // B*T of a training step
    int Ts[MAX_LIST], nT;                // sequence lengths of the train table
    int pos[MAX_LIST], npos;             // context positions of the decode table
    const char *only;                    // "row" or "row:form", comma-separated, or NULL
    int reps;                            // timed steps per cell (0: 2, or 1 when the cold step took > 3 s)
    const char *tsv_dir;                 // NULL: no TSV
    bool train, decode;
    bool profile;                        // print the tape's op profile of each cell's timed steps
    int decode_threads;                  // threads of the decode table (0: all)
    int doc_len;                         // -docs: mean document length of the train table (0: no documents)
} Options;

// ---- clock, memory, machine ----

// A field of /proc/self/status in KiB ("VmRSS", "VmHWM"), -1 if unreadable.
static long proc_status_kib(const char *field) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    long v = -1;
    size_t n = strlen(field);
    while (fgets(line, sizeof line, f))
        if (strncmp(line, field, n) == 0 && line[n] == ':') {
            v = atol(line + n + 1);
            break;
        }
    fclose(f);
    return v;
}

// While measuring memory, freed large blocks go back to the system at once,
// so that the peak-RSS growth of a step counts its own allocations rather
// than recycled ones; while timing, glibc keeps blocks of up to 32 MiB for
// reuse, as its dynamic threshold does in a long-running program.
static void malloc_measuring(bool on) {
    mallopt(M_MMAP_THRESHOLD, on ? 256 * 1024 : 32 * 1024 * 1024);
    mallopt(M_TRIM_THRESHOLD, on ? 256 * 1024 : 64 * 1024 * 1024);
}

// Return freed memory to the system and restart the peak-RSS counter at the
// current RSS. Returns the current RSS in KiB, or -1 when the counter cannot
// be reset (then the RSS figures are not reported).
static long rss_reset_peak(void) {
    malloc_trim(0);
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (!f) return -1;
    bool ok = fputs("5", f) >= 0;
    ok = fclose(f) == 0 && ok;
    return ok ? proc_status_kib("VmRSS") : -1;
}

static void read_line(const char *path, char *buf, size_t n) {
    snprintf(buf, n, "unknown");
    FILE *f = fopen(path, "r");
    if (!f) return;
    if (fgets(buf, (int)n, f)) buf[strcspn(buf, "\n")] = 0;
    fclose(f);
}

// The commit of the working directory's repository, "+dirty" when it has
// uncommitted changes to tracked files outside docs/; "unknown" outside a repository.
static void git_commit(char *buf, size_t n) {
    snprintf(buf, n, "unknown");
    FILE *p = popen("git rev-parse --short HEAD 2>/dev/null", "r");
    if (!p) return;
    char line[64] = "";
    bool got = fgets(line, sizeof line, p) != NULL;
    if (pclose(p) != 0 || !got) return;
    line[strcspn(line, "\n")] = 0;
    // docs/ is where run_all.sh writes results when told to (--out docs/bench): not a change to the code.
    p = popen("git status --porcelain --untracked-files=no -- . ':!docs' 2>/dev/null", "r");
    bool dirty = p && fgetc(p) != EOF;
    if (p) pclose(p);
    snprintf(buf, n, "%s%s", line, dirty ? "+dirty" : "");
}

static void print_header(const Options *o) {
    char cpu[256], commit[80], load[128], date[64];
    struct utsname u;
    runlog_cpu_name(cpu, sizeof cpu);
    git_commit(commit, sizeof commit);
    read_line("/proc/loadavg", load, sizeof load);
    time_t t = time(NULL);
    strftime(date, sizeof date, "%Y-%m-%d %H:%M:%S %Z", localtime(&t));
    const char *wait = getenv("OMP_WAIT_POLICY");
    printf("# mixer_bench\n");
    printf("cpu:       %s\n", cpu);
    if (uname(&u) == 0) printf("uname:     %s %s %s\n", u.sysname, u.release, u.machine);
    printf("threads:   %d (omp_get_max_threads), OMP_WAIT_POLICY=%s, OpenBLAS core %s\n", omp_get_max_threads(),
           wait ? wait : "unset", blas_core_name());
    printf("gemm:      %s\n", blas_describe());
    printf("date:      %s\n", date);
    printf("commit:    %s\n", commit);
    printf("loadavg:   %s (at start)\n", load);
    printf("precision: %s\n", REAL_NAME);
    printf("layer:     d_model %d, H %d, dk = dv %d, conv %d, chunk %d, attn_dsa top-k %d, gdp n_h 2 (gdp_nh3: 3)\n",
           D_MODEL, N_HEADS, D_HEAD, CONV, CHUNK, TOPK);
    printf("train:     B*T = %d tokens per step, best of %s timed steps after a cold one\n", o->tokens,
           o->reps ? "-reps" : "2 (the cold one itself if it took > 5 s)");
    if (o->doc_len > 0)
        printf("documents: packed in every row, lengths uniform in [1, %d] (mean %d), passed as doc_start\n",
               2 * o->doc_len - 1, o->doc_len);
    printf("\n");
}

// ---- the layer ----

typedef struct Layer {
    ParamStore ps;
    Mixer *m;
} Layer;

static void layer_make(Layer *L, const char *kind, MixerForm form, int gdp_steps) {
    MixerConfig c = mixer_config_default(D_MODEL, N_HEADS, D_HEAD, D_HEAD);
    if (gdp_steps) c.gdp_steps = gdp_steps;
    c.conv_size = CONV;
    c.chunk_size = CHUNK;
    c.topk = TOPK;
    c.form = form;
    params_init(&L->ps);
    L->m = mixer_create(kind, &c, &L->ps, "mixer.");
    params_finalize(&L->ps, 1);
}

static void layer_free(Layer *L) {
    mixer_destroy(L->m);
    params_free(&L->ps);
}

static void fill_normal(Tensor *t, Rng *r, double std) {
    for (int64_t i = 0; i < t->numel; i++) t->data[i] = (real)(std * rng_normal(r));
}

// ---- 1 + 2: training step ----

typedef struct TrainCell {
    int T, B;
    const char *skip;      // NULL: measured; else why not
    double best, median;   // seconds per step (wall clock)
    double best_cpu;       // CPU seconds of all threads in the best step
    double cold;           // seconds of the cold step
    double arena_mib;      // tape arena high-water of the cold step
    double rss_mib;        // peak RSS growth during the cold step (-1: unknown)
} TrainCell;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void train_step(Tape *tp, Layer *L, Tensor *u, const int *doc_start, const Tensor *dy) {
    Tensor *y = L->m->kind->forward(tp, L->m, u, doc_start, NULL, NULL);
    tape_backward_from(tp, y, dy->data);
}

// doc_start (B, T) of documents with lengths uniform in [1, 2 len - 1]; NULL when len is 0.
static int *make_docs(int B, int T, int len) {
    if (len <= 0) return NULL;
    int *d = xcalloc((size_t)B * T, sizeof(int));
    Rng r;
    rng_seed(&r, 3);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t += 1 + (int)rng_below(&r, (uint64_t)(2 * len - 1))) d[(int64_t)b * T + t] = 1;
    return d;
}

static void train_cell(TrainCell *c, const TrainRow *row, const Options *o) {
    Layer L;
    layer_make(&L, row->kind, row->form, row->gdp_steps);
    Tensor *u = tensor_newv(true, 3, c->B, c->T, D_MODEL), *dy = tensor_newv(false, 3, c->B, c->T, D_MODEL);
    Rng r;
    rng_seed(&r, 2);
    fill_normal(u, &r, 1.0);
    fill_normal(dy, &r, 1.0);
    int *docs = make_docs(c->B, c->T, o->doc_len);
    Tape tp;
    tape_init(&tp);

    malloc_measuring(true);
    long rss0 = rss_reset_peak();
    double c0 = runlog_cpu_now(), t0 = runlog_now();
    train_step(&tp, &L, u, docs, dy);
    c->cold = runlog_now() - t0;
    double cold_cpu = runlog_cpu_now() - c0;
    long hwm = proc_status_kib("VmHWM");
    c->rss_mib = rss0 >= 0 && hwm >= 0 ? (hwm - rss0) / 1024.0 : -1;
    c->arena_mib = tp.arena.high_water / 1048576.0;
    tape_reset(&tp);
    malloc_measuring(false);
    // The reset replaced the arena's blocks by one fresh block of the
    // high-water size; touch it once, as the first steps of a training loop
    // do, so that the timed steps do not pay its page faults.
    if (tp.arena.head) memset(tp.arena.head->mem, 0, tp.arena.head->cap);
    if (o->profile) tape_profile(&tp, true);

    // A step over 5 s is its own sample: the arena's page faults are a small
    // part of it, and a second run would double the suite's longest cells.
    int reps = o->reps ? o->reps : c->cold > 5.0 ? 0 : 2;
    double times[64] = {0}, cpus[64] = {0};
    if (reps > 64) reps = 64;
    for (int i = 0; i < reps; i++) {
        params_zero_grad(&L.ps);
        c0 = runlog_cpu_now();
        t0 = runlog_now();
        train_step(&tp, &L, u, docs, dy);
        times[i] = runlog_now() - t0;
        cpus[i] = runlog_cpu_now() - c0;
        tape_reset(&tp);
    }
    if (o->profile && reps > 0) {
        printf("\n# op profile: %s %s, T = %d, B = %d, mean of %d steps\n", TNAME(row), row->label, c->T, c->B, reps);
        tape_profile_print(&tp, stdout, reps);
    }
    if (reps == 0) times[0] = c->cold, cpus[0] = cold_cpu, reps = 1;
    c->best = times[0], c->best_cpu = cpus[0];
    for (int i = 1; i < reps; i++)
        if (times[i] < c->best) c->best = times[i], c->best_cpu = cpus[i];
    c->median = median(times, reps);
    tape_free(&tp);
    tensor_free(u);
    tensor_free(dy);
    free(docs);
    layer_free(&L);
}

static bool row_selected(const Options *o, const char *name, const char *label) {
    return rows_picked(o->only, name, label);
}

static void run_train(const Options *o, FILE *tsv) {
    static TrainCell cells[MAX_ROWS][MAX_LIST];
    printf("## 1. training step (forward + backward), microseconds per token, B*T = %d\n", o->tokens);
    printf("%-9s %-10s", "mixer", "form");
    for (int i = 0; i < o->nT; i++) printf("  %10s%-6d", "T=", o->Ts[i]);
    printf("\n");
    if (tsv)
        fprintf(tsv, "mixer\tform\tT\tB\tus_per_token_best\tus_per_token_median\ttokens_per_s\tcold_s\t"
                     "arena_mib\trss_mib\tstatus\tcpu_us_per_token\n");
    for (int ri = 0; ri < n_train_rows; ri++) {
        const TrainRow *row = &train_rows[ri];
        if (!row_selected(o, TNAME(row), row->label)) continue;
        printf("%-9s %-10s", TNAME(row), row->label);
        fflush(stdout);
        double prev = 0;   // the previous measured step, seconds
        for (int i = 0; i < o->nT; i++) {
            TrainCell *c = &cells[ri][i];
            *c = (TrainCell){.T = o->Ts[i], .B = o->tokens / o->Ts[i], .rss_mib = -1};
            double est = prev * (row->quadratic && i > 0 ? (double)o->Ts[i] / o->Ts[i - 1] : 1.0);
            if (c->B < 1)
                c->skip = "T > tokens";
            else if (row->max_T && c->T > row->max_T)
                c->skip = "memory";
            else if (est > MAX_STEP_SECONDS)
                c->skip = "time";
            if (c->skip) {
                printf("  %16s", c->skip[0] == 'm' ? "skip: > 4 GiB" : c->skip[0] == 't' ? "skip: > 60 s" : "-");
            } else {
                train_cell(c, row, o);
                prev = c->best;
                printf("  %16.2f", 1e6 * c->best / ((double)c->B * c->T));
            }
            fflush(stdout);
            if (tsv) {
                double tok = (double)c->B * c->T;
                if (c->skip)
                    fprintf(tsv, "%s\t%s\t%d\t%d\tNaN\tNaN\tNaN\tNaN\tNaN\tNaN\tskip:%s\tNaN\n", TNAME(row), row->label,
                            c->T, c->B, c->skip);
                else
                    fprintf(tsv, "%s\t%s\t%d\t%d\t%.4f\t%.4f\t%.1f\t%.4f\t%.3f\t%.3f\tok\t%.4f\n", TNAME(row),
                            row->label, c->T, c->B, 1e6 * c->best / tok, 1e6 * c->median / tok, tok / c->best,
                            c->cold, c->arena_mib, c->rss_mib, 1e6 * c->best_cpu / tok);
                fflush(tsv);
            }
        }
        printf("\n");
    }
    for (int ri = 0; ri < n_train_rows; ri++)
        if (train_rows[ri].max_T && row_selected(o, TNAME(&train_rows[ri]), train_rows[ri].label))
            printf("(%s %s above T = %d: %s)\n", TNAME(&train_rows[ri]), train_rows[ri].label, train_rows[ri].max_T,
                   train_rows[ri].why);
    printf("(\"skip: > 60 s\": the step time extrapolated from the previous T exceeds %.0f s)\n\n", MAX_STEP_SECONDS);

    printf("## 1b. the same steps: CPU time of all threads, microseconds per token (less sensitive to load)\n");
    printf("%-9s %-10s", "mixer", "form");
    for (int i = 0; i < o->nT; i++) printf("  %10s%-6d", "T=", o->Ts[i]);
    printf("\n");
    for (int ri = 0; ri < n_train_rows; ri++) {
        const TrainRow *row = &train_rows[ri];
        if (!row_selected(o, TNAME(row), row->label)) continue;
        printf("%-9s %-10s", TNAME(row), row->label);
        for (int i = 0; i < o->nT; i++) {
            const TrainCell *c = &cells[ri][i];
            if (c->skip) printf("  %16s", "-");
            else printf("  %16.2f", 1e6 * c->best_cpu / ((double)c->B * c->T));
        }
        printf("\n");
    }
    printf("\n");

    printf("## 2. memory of one training step, MiB: tape arena high-water / peak RSS growth (B*T = %d)\n",
           o->tokens);
    printf("%-9s %-10s", "mixer", "form");
    for (int i = 0; i < o->nT; i++) printf("  %10s%-6d", "T=", o->Ts[i]);
    printf("\n");
    for (int ri = 0; ri < n_train_rows; ri++) {
        const TrainRow *row = &train_rows[ri];
        if (!row_selected(o, TNAME(row), row->label)) continue;
        printf("%-9s %-10s", TNAME(row), row->label);
        for (int i = 0; i < o->nT; i++) {
            const TrainCell *c = &cells[ri][i];
            if (c->skip)
                printf("  %16s", "-");
            else if (c->rss_mib < 0)
                printf("  %9.1f /    ?", c->arena_mib);
            else
                printf("  %8.1f / %6.1f", c->arena_mib, c->rss_mib);
        }
        printf("\n");
    }
    printf("(RSS growth: arena + heap scratch of the kernels, pages touched during the cold step)\n\n");
}

// ---- 3: decoding ----

// Random keys and values in the first P positions of attn's cache (B = 1).
static void kv_prefill(KVCache *kc, int P, Rng *r) {
    int64_t wk = (int64_t)N_HEADS * D_HEAD, wv = wk;
    for (int64_t i = 0; i < (int64_t)P * wk; i++) kc->k[i] = (real)rng_normal(r);
    for (int64_t i = 0; i < (int64_t)P * wv; i++) kc->v[i] = (real)rng_normal(r);
    kc->pos = P;
}

static void run_decode(const Options *o, FILE *tsv) {
    // One B = 1 step is ~0.1 ms of small products: on 2 threads the wake-up
    // of the second thread at every parallel region costs as much as it
    // saves and jitters from step to step, so the table runs on 1 thread by
    // default, as `generate` does for small models (-decode-threads N).
    int all_threads = omp_get_max_threads();
    int threads = o->decode_threads > 0 ? o->decode_threads : all_threads;
    omp_set_num_threads(threads);
    printf("## 3. decoding, B = 1: microseconds per token at context position P (fastest of %d steps, %d thread%s)\n",
           DECODE_WINDOW, threads, threads == 1 ? "" : "s");
    printf("%-9s", "mixer");
    for (int i = 0; i < o->npos; i++) printf("  %8s%-6d", "P=", o->pos[i]);
    printf("  %s\n", "cache reaches P by");
    if (tsv) fprintf(tsv, "mixer\tpos\tus_per_token_best\tus_per_token_median\tus_per_token_mean\thow\n");
    int max_pos = 0;
    for (int i = 0; i < o->npos; i++) max_pos = imax(max_pos, o->pos[i]);
    for (int ri = 0; ri < n_decode_rows; ri++) {
        const DecodeRow *row = &decode_rows[ri];
        if (!row_selected(o, TNAME(row), NULL)) continue;
        printf("%-9s", TNAME(row));
        fflush(stdout);
        Layer L;
        layer_make(&L, row->kind, MIXER_FORM_RECURRENT, row->gdp_steps);
        const MixerKind *k = L.m->kind;
        void *cache = k->cache_new(L.m, 1, max_pos + DECODE_WINDOW + 1, DEVICE_CPU);
        Tensor *u = tensor_newv(false, 3, 1, 1, D_MODEL);
        Rng r;
        rng_seed(&r, 3);
        fill_normal(u, &r, 1.0);
        Tape tp;
        tape_init(&tp);
        tape_no_grad_push(&tp);
        int pos = 0;   // positions in the cache
        double t_fill = 0;
        for (int i = 0; i < o->npos; i++) {
            int P = o->pos[i];
            double t0 = runlog_now();
            if (row->prefill_kv) {
                kv_prefill(cache, P, &r);
                pos = P;
            }
            for (; pos < P; pos++) {
                k->step(&tp, L.m, cache, u);
                tape_reset(&tp);
            }
            t_fill += runlog_now() - t0;
            double w[DECODE_WINDOW], mean = 0;
            for (int s = 0; s < DECODE_WINDOW; s++) {
                t0 = runlog_now();
                k->step(&tp, L.m, cache, u);
                w[s] = runlog_now() - t0;
                mean += w[s] / DECODE_WINDOW;
                tape_reset(&tp);
            }
            pos += DECODE_WINDOW;
            double med = median(w, DECODE_WINDOW);   // sorts w
            printf("  %14.2f", 1e6 * w[0]);
            fflush(stdout);
            if (tsv)
                fprintf(tsv, "%s\t%d\t%.4f\t%.4f\t%.4f\t%s\n", TNAME(row), P, 1e6 * w[0], 1e6 * med, 1e6 * mean,
                        row->how);
        }
        printf("  %s (%.1f s)\n", row->how, t_fill);
        tape_no_grad_pop(&tp);
        tape_free(&tp);
        tensor_free(u);
        k->cache_free(cache);
        layer_free(&L);
    }
    printf("\n");
    omp_set_num_threads(all_threads);
}

// ---- command line ----

static int parse_list(const char *s, int *out) {
    int n = 0;
    while (*s && n < MAX_LIST) {
        char *end;
        long v = strtol(s, &end, 10);
        ASSERT(end != s && v > 0, "mixer_bench: bad number list '%s'", s);
        out[n++] = (int)v;
        s = *end == ',' ? end + 1 : end;
    }
    return n;
}

#define USAGE                                                                                          \
    "usage: mixer_bench [-tokens N] [-T 256,1024,...] [-pos 256,1024,...] [-only ROW[:FORM],...]\n"     \
    "                   [-reps N] [-tsv DIR] [-no-train] [-no-decode] [-decode-threads N]\n"           \
    "                   [-profile] [-docs L]\n"                                                         \
    "  every mixer and form at the layer level: training time and memory against T, decoding against\n" \
    "  the context length; -docs L packs documents of mean length L into each row; -only gdn,gdp:chunked\n" \
    "  runs only those rows (a mixer kind without rows of its own gets its forms as rows)\n"

static void usage(void) {
    fputs(USAGE, stderr);
    exit(2);
}

int main(int argc, char **argv) {
    if (bench_help(argc, argv, USAGE)) return 0;
    model_init_process(argv);   // OMP_WAIT_POLICY=PASSIVE unless the user set it
    blas_select_from_env();     // ATTNLAB_GEMM=auto|openblas|onednn (default auto)
    Options o = {.tokens = 16384, .train = true, .decode = true, .decode_threads = 1};
    o.nT = parse_list("256,1024,4096,16384", o.Ts);
    o.npos = parse_list("256,1024,4096,16384,32768", o.pos);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "-no-train") == 0) o.train = false;
        else if (strcmp(a, "-no-decode") == 0) o.decode = false;
        else if (strcmp(a, "-profile") == 0) o.profile = true;
        else if (!v) usage();
        else if (strcmp(a, "-tokens") == 0) o.tokens = atoi(v), i++;
        else if (strcmp(a, "-T") == 0) o.nT = parse_list(v, o.Ts), i++;
        else if (strcmp(a, "-pos") == 0) o.npos = parse_list(v, o.pos), i++;
        else if (strcmp(a, "-only") == 0) o.only = v, i++;
        else if (strcmp(a, "-reps") == 0) o.reps = atoi(v), i++;
        else if (strcmp(a, "-tsv") == 0) o.tsv_dir = v, i++;
        else if (strcmp(a, "-decode-threads") == 0) o.decode_threads = atoi(v), i++;
        else if (strcmp(a, "-docs") == 0) o.doc_len = atoi(v), i++;
        else usage();
    }
    rows_init(o.only);
    if (o.only) check_only(o.only);
    ASSERT(o.tokens > 0 && o.reps >= 0 && o.doc_len >= 0, "mixer_bench: -tokens %d, -reps %d, -docs %d", o.tokens,
           o.reps, o.doc_len);
    malloc_measuring(false);
    print_header(&o);

    FILE *ftrain = NULL, *fdecode = NULL;
    char path[1024];
    if (o.tsv_dir) {
        snprintf(path, sizeof path, "%s/train.tsv", o.tsv_dir);
        if (o.train) ftrain = xfopen(path, "w");
        snprintf(path, sizeof path, "%s/decode.tsv", o.tsv_dir);
        if (o.decode) fdecode = xfopen(path, "w");
    }
    double t0 = runlog_now();
    if (o.train) run_train(&o, ftrain);
    if (o.decode) run_decode(&o, fdecode);
    char load[128];
    read_line("/proc/loadavg", load, sizeof load);
    printf("loadavg: %s (at end), total %.0f s\n", load, runlog_now() - t0);
    if (ftrain) fclose(ftrain);
    if (fdecode) fclose(fdecode);
    return 0;
}

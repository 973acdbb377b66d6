#define _GNU_SOURCE   // nftw's FTW_DEPTH with FTW_PHYS
#include "test_util.h"

#include "blas.h"
#include "checkpoint.h"
#include "model_setup.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <libgen.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

jmp_buf test_fail_jmp;
void test_fail_handler(const char *msg) {
    (void)msg;
    longjmp(test_fail_jmp, 1);
}

void fill_normal(Tensor *t, uint64_t seed, double std) {
    Rng r;
    rng_seed(&r, seed);
    for (int64_t i = 0; i < t->numel; i++) t->data[i] = (real)(std * rng_normal(&r));
}

LMConfig test_lm_config(const char *layers, int vocab, int d_model, int d_ff, int d_head, int chunk, int conv) {
    LMConfig c;
    memset(&c, 0, sizeof c);
    c.vocab_size = vocab;
    c.d_model = d_model;
    c.d_ff = d_ff;
    c.tied = true;
    c.norm_eps = 1e-6;
    c.mixer = mixer_config_default(d_model, 2, d_head, d_head);
    c.mixer.chunk_size = chunk;
    c.mixer.conv_size = conv;
    Status s = lm_parse_layers(&c, layers);
    cr_assert(s.ok, "%s", s.msg);
    return c;
}

LMConfig test_tiny_lm_config(const char *layers) {
    LMConfig c = test_lm_config(layers, 11, 8, 12, 4, 4, 3);
    c.mixer.index_heads = 2;
    c.mixer.index_dim = 4;
    c.mixer.topk = 3;
    return c;
}

LMConfig test_bf16_lm_config(const char *layers) { return test_lm_config(layers, 256, 64, 160, 32, 16, 4); }

void test_perturb_params(ParamStore *ps, double rel, uint64_t seed) {
    uint64_t r = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int i = 0; i < ps->n; i++) {
        Tensor *p = ps->params[i];
        for (int64_t j = 0; j < p->numel; j++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;   // 64-bit LCG, top 53 bits
            double u = (double)(r >> 11) / 9007199254740992.0 * 2 - 1;
            p->data[j] = (real)(p->data[j] * (1 + rel * u));
        }
    }
}

void test_l2norm_rows(Tensor *x, int d, double scale) {
    for (int64_t r = 0; r < x->numel / d; r++) {
        real *z = x->data + r * d;
        double s = 0;
        for (int i = 0; i < d; i++) s += (double)z[i] * z[i];
        s = scale / sqrt(s + 1e-6);
        for (int i = 0; i < d; i++) z[i] = (real)(z[i] * s);
    }
}

const Node *test_only_node(const Tape *tp, const char *op) {
    const Node *found = NULL;
    int n = 0;
    for (int i = 0; i < tp->n_nodes; i++)
        if (!strcmp(tp->nodes[i]->op->name, op)) found = tp->nodes[i], n++;
    cr_assert_eq(n, 1, "%d %s nodes on the tape", n, op);
    return found;
}

void test_kda_inputs(Tensor **x, int B, int T, int H, int dk, int dv, uint64_t seed) {
    enum { Q, K, V, BETA, G, S0, N };
    x[Q] = tensor_newv(true, 3, B, T, H * dk);
    x[K] = tensor_newv(true, 3, B, T, H * dk);
    x[V] = tensor_newv(true, 3, B, T, H * dv);
    x[BETA] = tensor_newv(true, 3, B, T, H);
    x[G] = tensor_newv(true, 3, B, T, H * dk);
    x[S0] = tensor_newv(true, 4, B, H, dk, dv);
    for (int i = 0; i < N; i++) fill_normal(x[i], seed + 10 * i, i == S0 ? 0.5 : 1.0);
    test_l2norm_rows(x[Q], dk, 1.0 / sqrt(dk));
    test_l2norm_rows(x[K], dk, 1.0);
    for (int64_t i = 0; i < x[BETA]->numel; i++) x[BETA]->data[i] = (real)(1 / (1 + exp(-x[BETA]->data[i])));
}

real *test_ones(int64_t n) {
    real *p = xmalloc((size_t)(n > 0 ? n : 1) * sizeof(real));
    for (int64_t i = 0; i < n; i++) p[i] = 1;
    return p;
}

real *test_randn(int64_t n, uint64_t seed) {
    Tensor *t = tensor_newv(false, 1, (int)n);
    fill_normal(t, seed, 1.0);
    real *p = xaligned((size_t)n * sizeof(real));
    memcpy(p, t->data, (size_t)n * sizeof(real));
    tensor_free(t);
    return p;
}

Tensor *test_time_slice(const Tensor *x, int t0, int len) {
    int B = x->shape[0], T = x->shape[1], C = x->shape[2];
    Tensor *y = tensor_newv(x->requires_grad, 3, B, len, C);
    for (int b = 0; b < B; b++)
        memcpy(y->data + (int64_t)b * len * C, x->data + ((int64_t)b * T + t0) * C, (size_t)len * C * sizeof(real));
    return y;
}

void fill_uniform(Tensor *t, uint64_t seed, double lo, double hi) {
    Rng r;
    rng_seed(&r, seed);
    for (int64_t i = 0; i < t->numel; i++) t->data[i] = (real)rng_range(&r, lo, hi);
}

double max_rel_diff(const real *a, const real *b, int64_t n) {
    double scale = 0, worst = 0;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(a[i]) || isnan(b[i])) return INFINITY;
        scale = fmax(scale, fmax(fabs((double)a[i]), fabs((double)b[i])));
        worst = fmax(worst, fabs((double)a[i] - (double)b[i]));
    }
    return scale > 0 ? worst / scale : worst;
}

// ---------------------------------------------------------------- scratch folders

// Every scratch folder of a run of unit_tests lives under one root, made
// before the first test and removed after the last by the runner process
// (whatever the tests did, crashes included).
#define TMP_ENV "ATTNLAB_TEST_TMP"
static char tmp_root[256];

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

void test_remove_tree(const char *path) { nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS); }

ReportHook(PRE_ALL)(struct criterion_test_set *set) {
    (void)set;
    const char *base = getenv("TMPDIR");
    snprintf(tmp_root, sizeof tmp_root, "%s/attnlab-tests-XXXXXX", base && *base ? base : "/tmp");
    if (mkdtemp(tmp_root)) setenv(TMP_ENV, tmp_root, 1);
    else tmp_root[0] = 0;
    // gemm = auto's verdict (blas.h): one for the whole run, and nothing
    // written to the user's ~/.cache, unless the caller chose a folder.
    const char *cache = getenv("ATTNLAB_CACHE_DIR");
    if (tmp_root[0] && !(cache && *cache)) setenv("ATTNLAB_CACHE_DIR", tmp_root, 1);
}

ReportHook(POST_ALL)(struct criterion_global_stats *stats) {
    (void)stats;
    if (tmp_root[0]) test_remove_tree(tmp_root);
}

const char *test_tmpdir(const char *tag) {
    static char dir[512];
    const char *root = getenv(TMP_ENV);
    snprintf(dir, sizeof dir, "%s/%s_XXXXXX", root && *root ? root : "/tmp", tag);
    cr_assert_not_null(mkdtemp(dir), "mkdtemp %s: %s", dir, strerror(errno));
    return dir;
}

// ---------------------------------------------------------------- programs

const char *test_program(const char *name) {
    static char path[1024];
    char exe[1024];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    cr_assert(n > 0, "readlink /proc/self/exe");
    exe[n] = 0;
    snprintf(path, sizeof path, "%s/%s", dirname(exe), name);
    cr_assert(access(path, X_OK) == 0, "the program %s is not built", path);
    return path;
}

int test_spawn(char *const argv[], const char *in_path, const char *out_path, const char *err_path, double timeout_s,
               pid_t *pid_out) {
    pid_t pid = fork();
    cr_assert(pid >= 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        const char *paths[3] = {in_path ? in_path : "/dev/null", out_path ? out_path : "/dev/null",
                                err_path ? err_path : "/dev/null"};
        for (int fd = 0; fd < 3; fd++) {
            int f = open(paths[fd], fd == 0 ? O_RDONLY : O_WRONLY | O_CREAT | O_TRUNC, 0644);
            if (f < 0 || dup2(f, fd) < 0) _exit(125);
            close(f);
        }
        execv(argv[0], argv);
        _exit(127);
    }
    if (pid_out) {   // the caller waits (test_wait)
        *pid_out = pid;
        return 0;
    }
    return test_wait(pid, timeout_s);
}

int test_wait(pid_t pid, double timeout_s) {
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        int status;
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
        struct timespec t;
        clock_gettime(CLOCK_MONOTONIC, &t);
        if ((double)(t.tv_sec - t0.tv_sec) + 1e-9 * (double)(t.tv_nsec - t0.tv_nsec) > timeout_s) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            return TEST_TIMED_OUT;
        }
        usleep(2000);
    }
}

char *test_read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    for (size_t got; (got = fread(buf + n, 1, cap - n - 1, f)) > 0;) {
        n += got;
        if (n + 1 == cap) buf = realloc(buf, cap *= 2);
    }
    fclose(f);
    buf[n] = 0;
    return buf;
}

void test_write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "cannot write %s", path);
    fputs(text, f);
    fclose(f);
}

// ---------------------------------------------------------------- JSON

// A strict JSON syntax check (RFC 8259) of one value; *p advances past it.
static bool json_value(const char **p, int depth);

static void json_ws(const char **p) {
    while (**p == ' ' || **p == '\t' || **p == '\n' || **p == '\r') (*p)++;
}

static bool json_string(const char **p) {
    if (**p != '"') return false;
    for ((*p)++; **p != '"'; (*p)++) {
        unsigned char c = (unsigned char)**p;
        if (c < 0x20) return false;   // includes the NUL at the end of the text
        if (c == '\\') {
            (*p)++;
            if (**p == 'u') {
                for (int i = 1; i <= 4; i++)
                    if (!strchr("0123456789abcdefABCDEF", (*p)[i]) || !(*p)[i]) return false;
                *p += 4;
            } else if (!**p || !strchr("\"\\/bfnrt", **p)) {
                return false;
            }
        }
    }
    (*p)++;
    return true;
}

static bool json_number(const char **p) {
    const char *s = *p;
    if (*s == '-') s++;
    if (*s == '0') s++;
    else if (*s >= '1' && *s <= '9') while (*s >= '0' && *s <= '9') s++;
    else return false;
    if (*s == '.') {
        s++;
        if (!(*s >= '0' && *s <= '9')) return false;
        while (*s >= '0' && *s <= '9') s++;
    }
    if (*s == 'e' || *s == 'E') {
        s++;
        if (*s == '+' || *s == '-') s++;
        if (!(*s >= '0' && *s <= '9')) return false;
        while (*s >= '0' && *s <= '9') s++;
    }
    *p = s;
    return true;
}

static bool json_value(const char **p, int depth) {
    if (depth > 64) return false;
    json_ws(p);
    char c = **p;
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        (*p)++;
        json_ws(p);
        if (**p == close) {
            (*p)++;
            return true;
        }
        for (;;) {
            if (c == '{') {
                json_ws(p);
                if (!json_string(p)) return false;
                json_ws(p);
                if (**p != ':') return false;
                (*p)++;
            }
            if (!json_value(p, depth + 1)) return false;
            json_ws(p);
            if (**p == ',') {
                (*p)++;
                continue;
            }
            if (**p != close) return false;
            (*p)++;
            return true;
        }
    }
    if (c == '"') return json_string(p);
    for (const char *lit[] = {"true", "false", "null"}, **l = lit; l < lit + 3; l++)
        if (strncmp(*p, *l, strlen(*l)) == 0) {
            *p += strlen(*l);
            return true;
        }
    return json_number(p);
}

bool test_json_valid(const char *text) {
    const char *p = text;
    if (!json_value(&p, 0)) return false;
    json_ws(&p);
    return *p == 0;
}

int test_jsonl_check(const char *path, char *bad_line, size_t n) {
    char *text = test_read_file(path);
    if (!text) return -1;
    int records = 0;
    char *save = NULL;
    size_t len = strlen(text);
    if (len && text[len - 1] != '\n') {
        snprintf(bad_line, n, "(the file does not end with a newline)");
        free(text);
        return -1;
    }
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (!test_json_valid(line)) {
            snprintf(bad_line, n, "%s", line);
            free(text);
            return -1;
        }
        records++;
    }
    free(text);
    return records;
}

void test_assert_resumed_losses(const double *resumed, const double *straight, int from, int to) {
    for (int i = from; i < to; i++) {
#ifdef AG_DOUBLE
        cr_assert(fabs(resumed[i] - straight[i]) <= 1e-6 * fabs(straight[i]),
                  "step %d: resumed loss %.17g vs uninterrupted %.17g", i + 1, resumed[i], straight[i]);
#else
        cr_assert(memcmp(&resumed[i], &straight[i], sizeof(double)) == 0,
                  "step %d: resumed loss %.17g != uninterrupted %.17g", i + 1, resumed[i], straight[i]);
#endif
    }
}

const char *test_scratch_corpus(const char *tag) {
    static char dir[512];
    snprintf(dir, sizeof dir, "%s", test_tmpdir(tag));
    char path[600];
    snprintf(path, sizeof path, "%s/corpus.txt", dir);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    Rng r;
    rng_seed(&r, 9);
    const char *words[] = {"the ", "light ", "and ", "darkness ", "was ", "good ", "evening ", "morning ", "day.\n"};
    for (int i = 0; i < 4000; i++) fputs(words[rng_below(&r, 9)], f);
    fclose(f);
    return dir;
}

const char *test_dir_of(const char *path) {
    static char dir[1500];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0;
    return dir;
}

const char *test_tiny_config(const char *tag, const char *layers, int steps, const char *run_dir, const char *extra) {
    const char *dir = test_scratch_corpus(tag);
    static char path[1400];
    snprintf(path, sizeof path, "%s/tiny.ini", dir);
    char rd[1100];
    if (run_dir) snprintf(rd, sizeof rd, "%s", run_dir);
    else snprintf(rd, sizeof rd, "%s/run", dir);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fprintf(f,
            "[model]\nlayers = %s\nd_model = 16\nn_heads = 2\nd_k = 8\nd_v = 8\nd_ff = 32\nchunk_size = 8\n"
            "conv_size = 3\nindex_heads = 2\nindex_dim = 4\ntopk = 4\n"
            "[data]\ncorpus = %s/corpus.txt\ncache_dir = %s/cache\nval_fraction = 0.1\nseq_len = 24\nbatch_size = 3\n"
            "[train]\nsteps = %d\nlr = 3e-3\nmin_lr = 3e-4\nwarmup_steps = 1\neval_every = 0\neval_batches = 2\n"
            "checkpoint_every = 0\nlog_every = 1\nrun_dir = %s\n%s",
            layers, dir, dir, steps, rd, extra ? extra : "");
    fclose(f);
    return path;
}

int test_n_backends(void) {
#ifdef AG_DOUBLE
    return 1;
#else
    return onednn_built() ? 2 : 1;
#endif
}

const char *test_use_backend(int i) {
    GemmBackend b = i == 0 ? GEMM_OPENBLAS : GEMM_ONEDNN;
    char err[256];
    cr_assert(i >= 0 && i < test_n_backends() && blas_select(b, PRECISION_FP32, err, sizeof err),
              "backend %d (%s): %s", i, blas_backend_name(b), i < test_n_backends() ? err : "not in this build");
    return blas_backend_name(b);
}

void test_gla_inputs(Tensor **x, int B, int T, int H, int dk, int dv, bool grad_g, bool grad_dt, bool grad_s0,
                     double g_lo, double g_hi, uint64_t seed) {
    x[0] = tensor_newv(true, 3, B, T, H * dk);
    x[1] = tensor_newv(true, 3, B, T, H * dk);
    x[2] = tensor_newv(true, 3, B, T, H * dv);
    x[3] = tensor_newv(grad_g, 3, B, T, H);
    x[4] = tensor_newv(grad_dt, 3, B, T, H);
    x[5] = tensor_newv(grad_s0, 4, B, H, dk, dv);
    fill_normal(x[0], seed + 1, 0.6);
    fill_normal(x[1], seed + 2, 0.6);
    fill_normal(x[2], seed + 3, 1.0);
    fill_uniform(x[3], seed + 4, g_lo, g_hi);
    fill_uniform(x[4], seed + 5, 0.3, 1.5);
    fill_normal(x[5], seed + 6, 0.5);
}

void *test_dev_copy(Tape *tp, const void *host, size_t bytes) {
    void *d = tape_dalloc(tp, bytes);
    dev_from_host(d, tp->device, host, bytes);
    return d;
}

real *test_mixer_forward_host(Mixer *m, const Tensor *u, const int *doc_start, Device d) {
    Tape tp;
    tape_init_on(&tp, d);
    tape_no_grad_push(&tp);
    Tensor *y = m->kind->forward(&tp, m, tape_tensor_copy(&tp, u->ndim, u->shape, u->data), doc_start, NULL, NULL);
    real *out = xmalloc((size_t)y->numel * sizeof(real));
    dev_to_host(out, y->data, (size_t)y->numel * sizeof(real), d);
    tape_free(&tp);
    return out;
}

double test_mixer_decode_docs_diff(Mixer *m, ParamStore *ps, const Tensor *u, const int *doc_start, int *worst_t,
                                   int *worst_b) {
    Device d = device_default();
    if (d != DEVICE_CPU) params_to_device(ps, d);
    int B = u->shape[0], T = u->shape[1], D = u->shape[2];
    real *full = test_mixer_forward_host(m, u, doc_start, d);
    void *cache = m->kind->cache_new(m, B, T, d);
    Tape ts;
    tape_init_on(&ts, d);
    tape_no_grad_push(&ts);
    real *in = xmalloc((size_t)B * D * sizeof(real)), *got = xmalloc((size_t)B * D * sizeof(real));
    double worst = -1;
    for (int t = 0; t < T; t++) {
        for (int b = 0; b < B; b++) {
            if (doc_start && doc_start[(int64_t)b * T + t]) m->kind->cache_reset(m, cache, b);
            memcpy(in + (int64_t)b * D, u->data + ((int64_t)b * T + t) * D, (size_t)D * sizeof(real));
        }
        Tensor *yt = m->kind->step(&ts, m, cache, tape_tensor_copy(&ts, 3, (int[]){B, 1, D}, in));
        cr_assert(yt->ndim == 3 && yt->shape[0] == B && yt->shape[1] == 1 && yt->shape[2] == D, "step gave %s",
                  SHAPE(yt));
        dev_to_host(got, yt->data, (size_t)B * D * sizeof(real), d);
        for (int b = 0; b < B; b++) {
            double e = max_rel_diff(got + (int64_t)b * D, full + ((int64_t)b * T + t) * D, D);
            if (e > worst) {
                worst = e;
                if (worst_t) *worst_t = t;
                if (worst_b) *worst_b = b;
            }
        }
        tape_reset(&ts);
    }
    m->kind->cache_free(cache);
    free(in), free(got), free(full);
    tape_free(&ts);
    return worst;
}

double test_mixer_decode_diff(Mixer *m, ParamStore *ps, const Tensor *u, int *worst_t) {
    return test_mixer_decode_docs_diff(m, ps, u, NULL, worst_t, NULL);
}

real *test_lm_decode_logits_docs(LM *lm, Device d, const int *tokens, const int *doc_start, int B, int T,
                                 real **parallel) {
    int V = lm->cfg.vocab_size;
    Tape tp;
    tape_init_on(&tp, d);
    tape_no_grad_push(&tp);
    LMCache *cache = lm_cache_new_on(lm, B, T, d);
    real *out = xmalloc((size_t)T * B * V * sizeof(real));
    int *tok = xmalloc((size_t)B * sizeof(int));
    for (int t = 0; t < T; t++) {
        for (int b = 0; b < B; b++) {
            if (doc_start && doc_start[(int64_t)b * T + t]) lm_cache_reset_row(lm, cache, b);
            tok[b] = tokens[(int64_t)b * T + t];
        }
        Tensor *lg = lm_step(&tp, lm, cache, tok);
        cr_assert(lg->ndim == 3 && lg->shape[0] == B && lg->shape[1] == 1 && lg->shape[2] == V, "%s", SHAPE(lg));
        dev_to_host(out + (size_t)t * B * V, lg->data, (size_t)B * V * sizeof(real), d);
        tape_reset(&tp);
    }
    if (parallel) {   // the same documents in one parallel forward: (B, T, V)
        Tensor *lg = lm_forward_docs(&tp, lm, tokens, doc_start, B, T, NULL, NULL);
        *parallel = xmalloc((size_t)lg->numel * sizeof(real));
        dev_to_host(*parallel, lg->data, (size_t)lg->numel * sizeof(real), d);
    }
    free(tok);
    tape_no_grad_pop(&tp);
    lm_cache_free(lm, cache);
    tape_free(&tp);
    return out;
}

real *test_lm_decode_logits(LM *lm, Device d, const int *tokens, int B, int T, int reset_at, real **parallel) {
    bool reset = B > 1 && reset_at >= 0 && reset_at < T;
    int *flags = reset ? xcalloc((size_t)B * T, sizeof(int)) : NULL;
    if (flags) flags[1 * T + reset_at] = 1;
    real *out = test_lm_decode_logits_docs(lm, d, tokens, flags, B, T, parallel);
    free(flags);
    return out;
}

double test_lm_decode_diff(LM *lm, ParamStore *ps, const int *tokens, int B, int T) {
    Device d = device_default();
    if (d != DEVICE_CPU) params_to_device(ps, d);
    int V = lm->cfg.vocab_size;
    real *par = NULL, *steps = test_lm_decode_logits(lm, d, tokens, B, T, -1, &par);
    real *step = xmalloc((size_t)B * T * V * sizeof(real));   // (B, T, V) as par
    for (int t = 0; t < T; t++)
        for (int b = 0; b < B; b++)
            memcpy(step + ((size_t)b * T + t) * V, steps + ((size_t)t * B + b) * V, (size_t)V * sizeof(real));
    double e = max_rel_diff(par, step, (int64_t)B * T * V);
    free(steps);
    free(step);
    free(par);
    return e;
}

void test_assert_kernels_set(const DeviceKernels *k, const char *dev) {
    typedef void (*Fn)(void);   // every entry is a function pointer: look at them slot by slot
    size_t n = sizeof *k / sizeof(Fn);
    cr_assert_eq(n * sizeof(Fn), sizeof *k, "DeviceKernels holds something other than function pointers");
    cr_assert(n >= 17, "DeviceKernels has %zu entries", n);
    for (size_t i = 0; i < n; i++) {
        Fn f;
        memcpy(&f, (const char *)k + i * sizeof f, sizeof f);
        cr_assert(f != NULL, "the %s table's entry %zu is not set", dev, i);
    }
}

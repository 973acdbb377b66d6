// gdn_gpu_bench: the delta-rule mixing ops at the OP level on one device
// (the GPU of a CUDA build, or the CPU), for bench/gpu_vs_fla.sh's
// comparison with flash-linear-attention's Triton kernels
// (bench/torch_ref/fla_ops_bench.py prints the same rows for fla).
//
//   gdn_gpu_bench [--device cpu|cuda] [--ops gdn,gdp2,gdp3,kda,kda_rec,attn,gla] [--T 512,1024,...]
//                 [--tokens N] [--H N] [--dk 64,128] [--form chunked|recurrent] [--chunk C]
//                 [--warmup N] [--reps N] [--precision fp32,bf16] [--dump DIR]
//
// For each op, head size dk = dv and T: B = tokens / T rows (B*T fixed,
// default 16384), H heads (default 8); q, k L2-normalised per head, q scaled
// by 1/sqrt(dk) (op_gdn's contract), v and dO normal, beta in (0.1, 0.9),
// g in (-0.1, -0.001). The inputs stay in the device's memory; each timed
// iteration builds the op on a tape of that device and, for pass "fwdbwd",
// runs the backward seeded with dO (a gradient into every input), then
// resets the tape. --warmup iterations first (the arena settles, caches
// fill), then --reps back to back between two device syncs: the mean is the
// row's ms, tokens/s = B*T / that.
//
// Output: a TSV on stdout, comment lines starting with '#', then
//   side op form dtype H dk T B pass ms tokens_per_s
// side is "attnlab", dtype the build's precision ("f32" or "f64"), or "bf16"
// for the rows timed under [train] precision = bf16 (--precision: fp32,
// bf16 or both, default fp32; bf16 with --device cuda in the float32 build
// only): op_gdn's (and so op_gdp's) and op_kda's chunk products, attention's
// and gla's tile products on the tensor cores (src/cuda/gdn_common.cuh,
// kda_chunk.cu, attn_flash_bf16.cu, gla.cu). Both: each (dk, T) timed
// in float32, then in bf16, on the same inputs. form is "flash" for attn.
//
// --dump DIR: instead of timing, one small case per op (B 2, T 200, H 4,
// dk = dv from --dk's first value) into DIR/check_<op>.bin: the inputs, dO,
// the output and the gradients of every input, as float32, for
// fla_ops_bench.py check (the format: the comment above DumpArr).
//
// Ops: gdn = op_gdn; gdpN = op_gdp with N delta steps per token (k, v, beta
// N blocks per token, laid out as fla's gated_delta_product takes them);
// kda = op_kda (a log decay per key channel, docs/kda.md). gdn_rec and kda_rec are gdn and kda in the recurrent form
// whatever --form says, so that one run times the chunked kernels against
// the recurrence: --ops gdn,kda,gdn_rec,kda_rec. attn = op_attention (causal
// softmax attention, the flash kernels; dk = dv, no documents), for the
// softmax layers' share of a hybrid step (it has no fla check: no --dump).
// gla = op_gla_dt as the mamba mixer calls it (g a log decay per head, beta
// as dt, dk = dv, no s0; no --dump either), the linear and mamba layers'
// share.
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "device.h"
#include "attn_kernel.h"
#include "gdn_kernel.h"
#include "gla.h"
#include "kda_kernel.h"
#include "model_setup.h"
#include "runlog.h"

enum { MAX_LIST = 16, OP_GDN = 0, OP_GDP = 1, OP_KDA = 2, OP_ATTN = 3, OP_GLA = 4 };

typedef struct Opts {
    Device dev;
    char ops[MAX_LIST][16];
    int n_ops;
    int Ts[MAX_LIST], n_T;
    int dks[MAX_LIST], n_dk;
    int tokens, H, chunk, warmup, reps;
    MixerForm form;
    const char *dump;   // NULL: time
    bool fp32, bf16;    // --precision: the precisions timed (dump: bf16 when it alone is asked)
} Opts;

// An op name: its kind and steps per token (gdp), or false when unknown.
// *rec: the name asks for the recurrent form (gdn_rec, kda_rec).
static bool op_parse(const char *name, int *kind, int *steps, bool *rec) {
    *steps = 1;
    *rec = !strcmp(name, "gdn_rec") || !strcmp(name, "kda_rec");
    if (!strcmp(name, "gdn") || !strcmp(name, "gdn_rec")) return *kind = OP_GDN, true;
    if (!strcmp(name, "kda") || !strcmp(name, "kda_rec")) return *kind = OP_KDA, true;
    if (!strcmp(name, "attn")) return *kind = OP_ATTN, true;
    if (!strcmp(name, "gla")) return *kind = OP_GLA, true;
    if (!strncmp(name, "gdp", 3) && name[3] >= '1' && name[3] <= '9' && !name[4]) {
        *steps = name[3] - '0';
        *kind = OP_GDP;
        return *steps <= GDP_MAX_STEPS;
    }
    return false;
}

typedef struct Inputs {
    int kind, steps, B, T, H, dk;
    Tensor *q, *k, *v, *beta, *g;   // in the device's memory; k, v, beta: `steps` blocks per token
    Tensor *dO;                     // (B, T, H*dk): the backward's seed
} Inputs;

typedef enum { FILL_NORMAL, FILL_BETA, FILL_G } Fill;

// n values as `fill` says; FILL_NORMAL with width > 0 then L2-normalises each
// row of `width` and scales it.
static void fill_host(real *x, int64_t n, Rng *r, Fill fill, int width, double scale) {
    for (int64_t i = 0; i < n; i++) {
        if (fill == FILL_BETA) x[i] = (real)rng_range(r, 0.1, 0.9);
        else if (fill == FILL_G) x[i] = (real)rng_range(r, -0.1, -0.001);
        else x[i] = (real)rng_normal(r);
    }
    if (fill != FILL_NORMAL || width <= 0) return;
    for (int64_t row = 0; row < n / width; row++) {
        real *z = x + row * width;
        double s = 0;
        for (int i = 0; i < width; i++) s += (double)z[i] * z[i];
        s = scale / sqrt(s + 1e-12);
        for (int i = 0; i < width; i++) z[i] = (real)(z[i] * s);
    }
}

// A (B, T, width) tensor in d's memory filled as fill_host says.
static Tensor *input_on(Device d, Rng *r, int B, int T, int width, Fill fill, int norm_width, double scale) {
    Tensor *t = tensor_new_on(d, 3, (int[]){B, T, width});
    size_t bytes = (size_t)t->numel * sizeof(real);
    real *h = malloc(bytes);
    ASSERT(h, "gdn_gpu_bench: no memory for %zu bytes of inputs", bytes);
    fill_host(h, t->numel, r, fill, norm_width, scale);
    dev_from_host(t->data, d, h, bytes);
    free(h);
    return t;
}

static Inputs inputs_make(Device d, int kind, int steps, int B, int T, int H, int dk, uint64_t seed) {
    Inputs in = {kind, steps, B, T, H, dk, NULL, NULL, NULL, NULL, NULL, NULL};
    Rng r;
    rng_seed(&r, seed);
    int n = steps, gw = kind == OP_KDA ? H * dk : H;   // kda: a log decay per key channel
    in.q = input_on(d, &r, B, T, H * dk, FILL_NORMAL, dk, 1.0 / sqrt(dk));
    in.k = input_on(d, &r, B, T, n * H * dk, FILL_NORMAL, dk, 1.0);
    in.v = input_on(d, &r, B, T, n * H * dk, FILL_NORMAL, 0, 1.0);
    in.beta = input_on(d, &r, B, T, n * H, FILL_BETA, 0, 1.0);
    in.g = input_on(d, &r, B, T, gw, FILL_G, 0, 1.0);
    in.dO = input_on(d, &r, B, T, H * dk, FILL_NORMAL, 0, 1.0);
    return in;
}

// The op's inputs (dO aside) into x; returns how many.
static int inputs_list(const Inputs *in, Tensor **x) {
    x[0] = in->q, x[1] = in->k, x[2] = in->v, x[3] = in->beta, x[4] = in->g;
    return 5;
}

// Gradients come from the tape's arena, so they are dropped (not freed)
// before each step and before the tensors are freed.
static void inputs_grad(Inputs *in, bool on) {
    Tensor *x[5];
    int n = inputs_list(in, x);
    for (int i = 0; i < n; i++) x[i]->requires_grad = on, x[i]->grad = NULL;
}

static void inputs_free(Inputs *in, Device d) {
    inputs_grad(in, false);
    Tensor *x[5];
    int n = inputs_list(in, x);
    for (int i = 0; i < n; i++) tensor_free_on(d, x[i]);
    tensor_free_on(d, in->dO);
}

// ---- the backward's seed, in the device's memory ----
// A node from o to a scalar whose backward writes dO into o's gradient:
// tape_backward_from would copy the seed from the host every step (B*T*H*dv
// values), which is not the op's work. The scalar's value is never read.
static void seed_forward(Node *n) { dev_zero(n->tape->device, n->out[0]->data, sizeof(real)); }

static void seed_backward(Node *n) {
    bool fresh;
    real *g = NODE_GRAD_FRESH(n, 0, &fresh);
    if (!g) return;
    ASSERT(fresh, "gdn_gpu_bench: the op's output feeds only the seed node");
    dev_copy(n->tape->device, g, n->aux, (size_t)n->in[0]->numel * sizeof(real));
}

// The same pair on either device: it calls only device.h's copies.
static const OpDef SEED_OP = {"bench_seed", seed_forward, seed_backward, seed_forward, seed_backward};

static Tensor *op_build(Tape *tp, const Inputs *in, MixerForm form, int chunk) {
    switch (in->kind) {
    case OP_GDN:
        return op_gdn(tp, in->q, in->k, in->v, in->beta, in->g, NULL, NULL, in->H, form, chunk, NULL);
    case OP_GDP:
        return op_gdp(tp, in->q, in->k, in->v, in->beta, in->g, NULL, NULL, in->H, in->steps, form, chunk, NULL);
    case OP_ATTN:   // (q is scaled by 1/sqrt(dk) already; beta and g unused)
        return op_attention(tp, in->q, in->k, in->v, in->H, 1.0, NULL);
    case OP_GLA:   // (beta as dt)
        return op_gla_dt(tp, in->q, in->k, in->v, in->g, in->beta, NULL, NULL, in->H, form, chunk, NULL);
    default:
        return op_kda(tp, in->q, in->k, in->v, in->beta, in->g, NULL, NULL, in->H, form, chunk, NULL);
    }
}

// One iteration: the op, and for a training pass the backward from dO.
static void step(Tape *tp, Inputs *in, bool train, MixerForm form, int chunk) {
    Tensor *o = op_build(tp, in, form, chunk);
    if (!train) return;
    Tensor *loss = tape_tensor(tp, 1, (int[]){1});
    Node *n = tape_run(tp, &SEED_OP, (Tensor *[]){o}, 1, (Tensor *[]){loss}, 1);
    n->aux = in->dO->data;
    tape_backward(tp, loss);
}

// Mean seconds per iteration over `reps` after `warmup`.
static double time_pass(Inputs *in, bool train, const Opts *o) {
    Tape tp;
    tape_init_on(&tp, o->dev);
    double t0 = 0;
    for (int i = 0; i < o->warmup + o->reps; i++) {
        if (i == o->warmup) {
            dev_sync(o->dev);
            t0 = runlog_now();
        }
        inputs_grad(in, train);
        step(&tp, in, train, o->form, o->chunk);
        tape_reset(&tp);
    }
    dev_sync(o->dev);
    double dt = (runlog_now() - t0) / o->reps;
    inputs_grad(in, false);
    tape_free(&tp);
    return dt;
}

// ---- the dump for fla_ops_bench.py --check ----
// File: "ATLDUMP1", the op's name (16 bytes, NUL-padded), int32 H, dk, dv,
// steps, n_arrays; then per array its name (16 bytes), int32 ndim, int32
// shape[4] (unused ones 0) and numel float32 values. Little-endian, as the
// machines that run this are.
typedef struct DumpArr {
    const char *name;
    const Tensor *shape;   // the tensor whose shape it has
    const real *data;      // in device memory
} DumpArr;

static bool write_all(FILE *f, const void *p, size_t bytes) { return fwrite(p, 1, bytes, f) == bytes; }

static bool dump_array(FILE *f, const DumpArr *a, Device d) {
    char name[16] = {0};
    snprintf(name, sizeof name, "%s", a->name);
    int32_t hdr[5] = {a->shape->ndim, 0, 0, 0, 0};
    for (int i = 0; i < a->shape->ndim && i < 4; i++) hdr[1 + i] = a->shape->shape[i];
    int64_t n = a->shape->numel;
    if (!a->data) {
        fprintf(stderr, "gdn_gpu_bench: %s is missing (no gradient reached it)\n", a->name);
        return false;
    }
    real *h = malloc((size_t)n * sizeof(real));
    float *f32 = malloc((size_t)n * sizeof(float));
    bool ok = h && f32;
    if (ok) {
        dev_to_host(h, a->data, (size_t)n * sizeof(real), d);
        for (int64_t i = 0; i < n; i++) f32[i] = (float)h[i];
        ok = write_all(f, name, 16) && write_all(f, hdr, sizeof hdr) && write_all(f, f32, (size_t)n * sizeof(float));
    }
    free(h);
    free(f32);
    return ok;
}

// The check case of one op into dir/check_<op>.bin; false (with the message
// printed) when the file cannot be written.
static bool dump_op(const char *dir, const char *name, int kind, int steps, int dk, const Opts *o) {
    enum { B = 2, T = 200, H = 4 };   // T: three whole chunks of 64 and a partial one
    Inputs in = inputs_make(o->dev, kind, steps, B, T, H, dk, 11);
    Tape tp;
    tape_init_on(&tp, o->dev);
    inputs_grad(&in, true);
    Tensor *out = op_build(&tp, &in, o->form, o->chunk);
    Tensor *loss = tape_tensor(&tp, 1, (int[]){1});
    Node *n = tape_run(&tp, &SEED_OP, (Tensor *[]){out}, 1, (Tensor *[]){loss}, 1);
    n->aux = in.dO->data;
    tape_backward(&tp, loss);
    DumpArr arr[] = {{"q", in.q, in.q->data},       {"k", in.k, in.k->data},          {"v", in.v, in.v->data},
                     {"beta", in.beta, in.beta->data}, {"g", in.g, in.g->data},       {"dO", in.dO, in.dO->data},
                     {"o", out, out->data},          {"dq", in.q, in.q->grad},         {"dk", in.k, in.k->grad},
                     {"dv", in.v, in.v->grad},       {"dbeta", in.beta, in.beta->grad}, {"dg", in.g, in.g->grad}};
    int n_arr = (int)(sizeof arr / sizeof arr[0]);
    char path[4096];
    snprintf(path, sizeof path, "%s/check_%s.bin", dir, name);
    FILE *f = fopen(path, "wb");
    bool ok = f != NULL;
    if (ok) {
        char op[16] = {0};
        snprintf(op, sizeof op, "%s", name);
        int32_t hdr[5] = {H, dk, dk, steps, n_arr};
        ok = write_all(f, "ATLDUMP1", 8) && write_all(f, op, 16) && write_all(f, hdr, sizeof hdr);
        for (int i = 0; ok && i < n_arr; i++) ok = dump_array(f, &arr[i], o->dev);
        ok = (fclose(f) == 0) && ok;
    }
    if (!ok) fprintf(stderr, "gdn_gpu_bench: cannot write %s: %s\n", path, strerror(errno));
    else printf("# wrote %s (B %d, T %d, H %d, dk = dv = %d, %s)\n", path, B, T, H, dk, mixer_form_name(o->form));
    tape_free(&tp);
    inputs_free(&in, o->dev);
    return ok;
}

// ---- arguments ----

static bool parse_int(const char *s, int lo, int hi, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return false;
    *out = (int)v;
    return true;
}

// A comma list of integers in [lo, hi] into out; false when a value is not one.
static bool parse_ints(const char *s, int lo, int hi, int *out, int *n) {
    char names[MAX_LIST][16];
    if (strlen(s) > 15 * MAX_LIST) return false;
    *n = bench_parse_names(s, names, MAX_LIST);
    for (int i = 0; i < *n; i++)
        if (!parse_int(names[i], lo, hi, &out[i])) return false;
    return *n > 0;
}

static const char USAGE[] =
    "usage: gdn_gpu_bench [--device cpu|cuda] [--ops gdn,gdp2,gdp3,kda,kda_rec,attn,gla] [--T 512,1024,...]\n"
    "                     [--tokens N] [--H N] [--dk 64,128] [--form chunked|recurrent] [--chunk C]\n"
    "                     [--warmup N] [--reps N] [--precision fp32,bf16] [--dump DIR]\n"
    "  Tokens/s of the delta-rule ops, attn (softmax attention) and gla (forward, forward+backward)\n"
    "  against T with B*T = tokens fixed; a TSV on stdout (bench/gpu_vs_fla.sh joins it with\n"
    "  fla_ops_bench.py's). --dump DIR writes one small case per op for fla_ops_bench.py --check\n"
    "  instead of timing. --precision fp32,bf16 times each case in both (bf16: the tensor-core\n"
    "  products of [train] precision = bf16, dtype bf16).\n";

static int usage_error(const char *flag, const char *value, const char *what) {
    fprintf(stderr, "gdn_gpu_bench: %s '%.64s': %s\n%s", flag, value ? value : "(missing)", what, USAGE);
    return 2;
}

// Fills o from argv; returns 0, or the exit status after a message.
static int parse_args(int argc, char **argv, Opts *o) {
    *o = (Opts){DEVICE_CPU, {"gdn", "gdp2", "gdp3"}, 3, {512, 1024, 2048, 4096, 8192, 16384}, 6, {64}, 1,
                16384, 8, 64, 3, 20, MIXER_FORM_CHUNKED, NULL, true, false};
    static const char *const FLAGS[] = {"--device", "--ops",    "--T",    "--dk",   "--tokens", "--H",
                                        "--chunk",  "--warmup", "--reps", "--form", "--dump",   "--precision"};
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool known = false;
        for (size_t j = 0; j < sizeof FLAGS / sizeof FLAGS[0]; j++) known |= !strcmp(f, FLAGS[j]);
        if (!known) {
            fprintf(stderr, "gdn_gpu_bench: unknown argument '%.64s'\n%s", f, USAGE);
            return 2;
        }
        if (!v) return usage_error(f, NULL, "needs a value");
        i++;
        if (!strcmp(f, "--device")) {
            int d = device_parse(v);
            if (d < 0) return usage_error(f, v, "not a device (cpu or cuda)");
            o->dev = (Device)d;
        } else if (!strcmp(f, "--ops")) {
            if (strlen(v) > 15 * MAX_LIST) return usage_error(f, v, "too long a list");
            o->n_ops = bench_parse_names(v, o->ops, MAX_LIST);
            for (int j = 0; j < o->n_ops; j++) {
                int kind, steps;
                bool rec;
                if (!op_parse(o->ops[j], &kind, &steps, &rec))
                    return usage_error(f, v, "ops are gdn, gdp1 .. gdp8, kda, gdn_rec, kda_rec, attn and gla");
            }
            if (o->n_ops == 0) return usage_error(f, v, "no op named");
        } else if (!strcmp(f, "--T")) {
            if (!parse_ints(v, 1, 1 << 24, o->Ts, &o->n_T)) return usage_error(f, v, "a comma list of T >= 1");
        } else if (!strcmp(f, "--dk")) {
            if (!parse_ints(v, 1, 256, o->dks, &o->n_dk)) return usage_error(f, v, "a comma list of 1 .. 256");
        } else if (!strcmp(f, "--tokens")) {
            if (!parse_int(v, 1, 1 << 26, &o->tokens)) return usage_error(f, v, "an integer 1 .. 2^26");
        } else if (!strcmp(f, "--H")) {
            if (!parse_int(v, 1, 256, &o->H)) return usage_error(f, v, "an integer 1 .. 256");
        } else if (!strcmp(f, "--chunk")) {
            if (!parse_int(v, 1, 1024, &o->chunk)) return usage_error(f, v, "an integer 1 .. 1024");
        } else if (!strcmp(f, "--warmup")) {
            if (!parse_int(v, 0, 100000, &o->warmup)) return usage_error(f, v, "an integer 0 .. 100000");
        } else if (!strcmp(f, "--reps")) {
            if (!parse_int(v, 1, 100000, &o->reps)) return usage_error(f, v, "an integer 1 .. 100000");
        } else if (!strcmp(f, "--form")) {
            int m = mixer_form_parse(v);
            if (m != MIXER_FORM_CHUNKED && m != MIXER_FORM_RECURRENT)
                return usage_error(f, v, "chunked or recurrent");
            o->form = (MixerForm)m;
        } else if (!strcmp(f, "--precision")) {
            char names[MAX_LIST][16];
            if (strlen(v) > 15 * MAX_LIST) return usage_error(f, v, "too long a list");
            int n = bench_parse_names(v, names, MAX_LIST);
            o->fp32 = o->bf16 = false;
            for (int j = 0; j < n; j++) {
                if (!strcmp(names[j], "fp32")) o->fp32 = true;
                else if (!strcmp(names[j], "bf16")) o->bf16 = true;
                else return usage_error(f, v, "precisions are fp32 and bf16");
            }
            if (n == 0) return usage_error(f, v, "no precision named");
        } else {   // --dump
            o->dump = v;
        }
    }
    if (o->bf16 && (o->dev != DEVICE_CUDA || sizeof(real) != 4))
        return usage_error("--precision", "bf16", "bf16 needs --device cuda and the float32 build");
    for (int j = 0; o->dump && j < o->n_ops; j++)
        if (!strcmp(o->ops[j], "attn") || !strcmp(o->ops[j], "gla"))
            return usage_error("--dump", o->dump, "attn and gla have no fla check to dump for");
    return 0;
}

// The rows of one op: every (dk, T), precision and both passes.
static void bench_op(const Opts *o, const char *name, int kind, int steps) {
    for (int di = 0; di < o->n_dk; di++)
        for (int ti = 0; ti < o->n_T; ti++) {
            int T = o->Ts[ti], dk = o->dks[di], B = o->tokens / T;
            if (B < 1 || (int64_t)B * T != o->tokens) {
                printf("# %s: T %d skipped: it does not divide --tokens %d\n", name, T, o->tokens);
                continue;
            }
            Inputs in = inputs_make(o->dev, kind, steps, B, T, o->H, dk, 1);
            for (int bf = 0; bf < 2; bf++) {
                if (!(bf ? o->bf16 : o->fp32)) continue;
                const char *dtype = bf ? "bf16" : sizeof(real) == 4 ? "f32" : "f64";
                const char *form = kind == OP_ATTN ? "flash" : mixer_form_name(o->form);
                if (o->bf16) device_set_bf16(o->dev, bf);
                for (int train = 0; train < 2; train++) {
                    double s = time_pass(&in, train, o);
                    printf("attnlab\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%s\t%.4f\t%.0f\n", name, form, dtype, o->H, dk,
                           T, B, train ? "fwdbwd" : "fwd", 1e3 * s, (double)B * T / s);
                    fflush(stdout);
                }
                if (o->bf16) device_set_bf16(o->dev, false);
            }
            inputs_free(&in, o->dev);
        }
}

int main(int argc, char **argv) {
    if (bench_help(argc, argv, USAGE)) return 0;
    model_init_process(argv);   // OMP_WAIT_POLICY=PASSIVE unless the user set it
    Opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc) return rc;
    char err[512];
    if (o.dev == DEVICE_CUDA && !device_cuda_init(err, sizeof err)) {
        fprintf(stderr, "gdn_gpu_bench: --device cuda: %s\n", err);
        return 2;
    }
    char cpu[256];
    runlog_cpu_name(cpu, sizeof cpu);
    const char *precs = o.fp32 && o.bf16 ? "fp32,bf16" : o.bf16 ? "bf16" : "fp32";
    printf("# gdn_gpu_bench: device %s (%s), cpu %s, %s, precisions %s, form %s, chunk %d, warmup %d, reps %d\n",
           device_name(o.dev), device_describe(o.dev), cpu, REAL_NAME, precs, mixer_form_name(o.form), o.chunk,
           o.warmup, o.reps);
    if (!o.dump) printf("side\top\tform\tdtype\tH\tdk\tT\tB\tpass\tms\ttokens_per_s\n");
    bool ok = true;
    if (o.dump && o.bf16 && !o.fp32) device_set_bf16(o.dev, true);
    for (int i = 0; i < o.n_ops; i++) {
        int kind = OP_GDN, steps = 1;
        bool rec = false;
        op_parse(o.ops[i], &kind, &steps, &rec);   // (parse_args checked the name)
        Opts oi = o;
        if (rec) oi.form = MIXER_FORM_RECURRENT;
        if (o.dump) ok = dump_op(o.dump, o.ops[i], kind, steps, o.dks[0], &oi) && ok;
        else bench_op(&oi, o.ops[i], kind, steps);
    }
    return ok ? 0 : 1;
}

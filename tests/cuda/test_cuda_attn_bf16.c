// test_cuda_attn_bf16.c: op_attention's flash kernels on the GPU's bf16
// tensor cores (src/cuda/attn_flash_bf16.cu; device_set_bf16, [train]
// precision = bf16; float32 build) against a float64 host reference that
// rounds exactly the operands the semantics name (Q, K, V, dO; P at the
// forward's running max, replaying its 64-key tiles; P and dS of the
// backward) to bf16 and nothing else, at lengths that are and are not whole
// tiles, head dims 32, 64, 128 and padded ones, with and without documents.
//
// The bound is worst-case float32 arithmetic around the reference, element
// by element (reference() spells it out):
//   - a sum of n exact products (bf16 x bf16 is exact in float32), however
//     the tensor cores order it: below 2 (n + 1) 2^-23 times the sum of the
//     terms' sizes (test_cuda_bf16.c's sum_tol);
//   - so a score S is off by e = scale 2 (dk + 1) 2^-23 sum |q_c k_c| plus
//     2^-21 |S| (scale, log2(e)); a weight P = exp(S - m) by the relative
//     rho = e + max e (the max moves too) + 2^-22 (|S| + |m|) + 2^-21 (exp2f
//     is within 2 ulp); the online softmax's rescalings by 2^-20 + 2 max e +
//     2^-21 max |S| a tile; the backward's P = exp(S - lse) by e and lse's
//     error; dP like S, and dS = P (dP - D) by what those give;
//   - the rounding of a P or dS whose float32 value lies anywhere in that
//     interval: where the interval holds a bf16 rounding edge, the term may
//     take the neighbouring bf16 number, and the bound takes that difference;
//   - the outputs' own roundings (2^-23 each).
// Every such bound is then also checked against references that leave out
// one rounding (or all of them): each must be outside it somewhere, so a
// kernel that skipped a rounding would fail. Then the GPU against the CPU's
// bf16 kernel (attn_flash.c, where this build and CPU have it), the float32
// kernels unchanged (other head dims run them, the same bits with bf16 on),
// and a repeated run bit for bit.
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attn_kernel.h"
#include "bf16.h"
#include "blas.h"
#include "cuda_check.h"
#include "device.h"
#include "docs.h"

#ifndef AG_DOUBLE
typedef struct {
    int B, T, H, dk, dv;
    const int *doc_start;   // (B, T) or NULL
} Case;

// op_attention on a tape of device dev with inputs x[map[0]], x[map[1]],
// x[map[2]] as q, k, v, the inputs i of bit i of `grads` taking a gradient,
// the backward seeded with dO; on the GPU with bf16 products on or off (then
// off again). Host copies (malloc): the output in r[0], input i's gradient
// in r[i + 1] (NULL without one).
static void run_map(Device dev, const Case *c, Tensor *const *x, int nx, const int map[3], int grads,
                    const real *dO, bool bf16, real *r[4]) {
    if (dev == DEVICE_CUDA) device_set_bf16(DEVICE_CUDA, bf16);
    Tape tp;
    tape_init_on(&tp, dev);
    Tensor *xs[3];
    for (int i = 0; i < nx; i++) {
        xs[i] = tape_tensor_copy(&tp, x[i]->ndim, x[i]->shape, x[i]->data);
        xs[i]->requires_grad = grads >> i & 1;
    }
    Tensor *o = op_attention(&tp, xs[map[0]], xs[map[1]], xs[map[2]], c->H, 1.0 / sqrt(c->dk), c->doc_start);
    if (grads) tape_backward_from(&tp, o, dO);
    r[0] = malloc((size_t)o->numel * sizeof(real));
    dev_to_host(r[0], o->data, (size_t)o->numel * sizeof(real), dev);
    for (int i = 0; i < 3; i++) {
        r[i + 1] = NULL;
        if (i >= nx || !(grads >> i & 1)) continue;
        r[i + 1] = malloc((size_t)x[i]->numel * sizeof(real));
        dev_to_host(r[i + 1], xs[i]->grad, (size_t)x[i]->numel * sizeof(real), dev);
    }
    dev_sync(dev);
    tape_free(&tp);
    if (dev == DEVICE_CUDA) device_set_bf16(DEVICE_CUDA, false);
}

// q, k, v apart, every one with a gradient: o, dq, dk, dv in r.
static void run_attn(Device dev, const Case *c, Tensor *const *x, const real *dO, bool bf16, real *r[4]) {
    run_map(dev, c, x, 3, (const int[]){0, 1, 2}, 7, dO, bf16, r);
}

static void run_free(real *r[4]) {
    for (int i = 0; i < 4; i++) free(r[i]);
}

// Which roundings a reference makes (bits); ROUND_ALL is the semantics.
enum { RQ = 1, RK = 2, RV = 4, RDO = 8, RP = 16, RDS = 32, ROUND_ALL = 63 };

static double rnd(double x, bool on) { return on ? (double)bf16_round((float)x) : x; }

// The most that rounding a value anywhere in [x - d, x + d] to bf16 (through
// float32, as the kernels) can differ from rounding x: rounding is monotone,
// so the ends give it.
static double flip(double x, double d) {
    double r = rnd(x, true);
    return fmax(fabs(rnd(x + d, true) - r), fabs(rnd(x - d, true) - r));
}

// The relative error bound of a float32 sum of n exact products.
static double sum_rel(int n) { return ldexp(2.0 * (n + 1), -23); }

typedef struct {
    double *v[4];   // o, dq, dk, dv
    double *t[4];   // their bounds (ROUND_ALL's)
} Ref;

static void ref_free(Ref *r) {
    for (int i = 0; i < 4; i++) free(r->v[i]), free(r->t[i]);
}

// One (b, h): the reference of the header with the roundings in `mode`, the
// bounds alongside. o_gpu: the GPU's output, in D = dO . o as the kernel has
// it (the backward's D is of the forward's output, whatever it was).
static void ref_head(const Case *c, const real *q, const real *k, const real *v, const real *dO, const real *o_gpu,
                     const int *first, int b, int h, int mode, Ref *r, double *S, double *Sa) {
    int T = c->T, dk = c->dk, dv = c->dv, ldq = c->H * dk, ldv = c->H * dv;
    double scale = 1.0 / sqrt(dk);
    const double u23 = 0x1p-23, u22 = 0x1p-22, u21 = 0x1p-21, u20 = 0x1p-20;
    int nsum = T + 64;   // terms of a backward sum over queries, at most (the zeros of a part tile add none)
    for (int t = 0; t < T; t++) {
        int lo = first ? docs_begin(first, (int64_t)b * T + t) : 0;
        int64_t rq = ((int64_t)b * T + t) * ldq + h * dk, ro = ((int64_t)b * T + t) * ldv + h * dv;
        double m = -INFINITY, Emax = 0, Mabs = 0;
        for (int s = lo; s <= t; s++) {
            int64_t sk = ((int64_t)b * T + s) * ldq + h * dk;
            double acc = 0, abs = 0;
            for (int j = 0; j < dk; j++) {
                double x = rnd(q[rq + j], mode & RQ) * rnd(k[sk + j], mode & RK);
                acc += x, abs += fabs(x);
            }
            S[s] = scale * acc;
            // e: the score's error (the sum's; scale and log2(e): 4 roundings)
            Sa[s] = scale * sum_rel(dk) * abs + u21 * fabs(S[s]);
            m = fmax(m, S[s]), Emax = fmax(Emax, Sa[s]), Mabs = fmax(Mabs, fabs(S[s]));
        }
        // The forward's tiles: keys from lo / 64 * 64 in 64s; P rounded at
        // the running max mu (over the seen keys up to the tile's end).
        int ntiles = t / 64 - lo / 64 + 1, nfwd = 64 * ntiles;
        double l = 0, rho_max = 0;
        for (int s = lo; s <= t; s++) l += exp(S[s] - m);
        double arel = ntiles * (u20 + 2 * Emax + u21 * Mabs);   // the rescalings
        double *oo = r->v[0] + ro, *to = r->t[0] + ro;
        for (int s = lo; s <= t; s++) {
            int end = imin(t, (s / 64 + 1) * 64 - 1);
            double mu = -INFINITY;
            for (int x = lo; x <= end; x++) mu = fmax(mu, S[x]);
            double P = exp(S[s] - mu), w = exp(mu - m);
            double rho = Sa[s] + Emax + u22 * (fabs(S[s]) + fabs(mu)) + u21 + u23;
            rho_max = fmax(rho_max, rho);
            double Pr = rnd(P, mode & RP), fe = flip(P, rho * P);
            int64_t so = ((int64_t)b * T + s) * ldv + h * dv;
            for (int j = 0; j < dv; j++) {
                double vs = rnd(v[so + j], mode & RV);
                oo[j] += Pr * w * vs / l;
                to[j] += fabs(vs) * w * (fe + Pr * (sum_rel(nfwd) + arel)) / l;
            }
        }
        for (int j = 0; j < dv; j++) to[j] = 1.01 * (to[j] + fabs(oo[j]) * (rho_max + 2 * nfwd * u23 + arel + u23));
        // The backward: P = exp(S - lse), lse off by dL; D = dO . o_gpu in
        // double, then float (as k_flash_rowdot).
        double lse = m + log(l);
        double dL = Emax + rho_max + 2 * nfwd * u23 + arel + u22 * (fabs(m) + fabs(lse)) + u22;
        double Dd = 0;
        for (int j = 0; j < dv; j++) Dd += (double)dO[ro + j] * o_gpu[ro + j];
        double Dt = (float)Dd;
        for (int s = lo; s <= t; s++) {
            int64_t so = ((int64_t)b * T + s) * ldv + h * dv, sk = ((int64_t)b * T + s) * ldq + h * dk;
            double P = exp(S[s] - lse), rho = Sa[s] + dL + u22 * (fabs(S[s]) + fabs(lse)) + u21 + u23;
            double dP = 0, dPa = 0;
            for (int j = 0; j < dv; j++) {
                double x = rnd(dO[ro + j], mode & RDO) * rnd(v[so + j], mode & RV);
                dP += x, dPa += fabs(x);
            }
            double dS = P * (dP - Dt);
            double edS = 1.01 * P * (rho * fabs(dP - Dt) + sum_rel(dv) * dPa + u23 * (fabs(dP) + fabs(Dt)));
            double Pr = rnd(P, mode & RP), fP = flip(P, rho * P), dSr = rnd(dS, mode & RDS), fS = flip(dS, edS);
            for (int j = 0; j < dv; j++) {   // dV_s += P dO_t
                double g = rnd(dO[ro + j], mode & RDO);
                r->v[3][so + j] += Pr * g;
                r->t[3][so + j] += fabs(g) * (fP + Pr * sum_rel(nsum));
            }
            for (int j = 0; j < dk; j++) {   // dQ_t += scale dS K_s, dK_s += scale dS Q_t
                double ks = rnd(k[sk + j], mode & RK), qt = rnd(q[rq + j], mode & RQ);
                r->v[1][rq + j] += scale * dSr * ks;
                r->t[1][rq + j] += scale * fabs(ks) * (fS + fabs(dSr) * sum_rel(nsum));
                r->v[2][sk + j] += scale * dSr * qt;
                r->t[2][sk + j] += scale * fabs(qt) * (fS + fabs(dSr) * sum_rel(nsum));
            }
        }
    }
}

static Ref reference(const Case *c, Tensor *const *x, const real *dO, const real *o_gpu, int mode) {
    int B = c->B, T = c->T;
    int64_t n[4] = {x[2]->numel, x[0]->numel, x[1]->numel, x[2]->numel};
    Ref r;
    for (int i = 0; i < 4; i++)
        r.v[i] = calloc((size_t)n[i], sizeof(double)), r.t[i] = calloc((size_t)n[i], sizeof(double));
    int *first = NULL;
    if (c->doc_start) {
        first = malloc((size_t)B * T * sizeof(int));
        docs_first_fill(first, c->doc_start, B, T);
    }
    double *S = malloc((size_t)T * sizeof(double)), *Sa = malloc((size_t)T * sizeof(double));
    for (int b = 0; b < B; b++)
        for (int h = 0; h < c->H; h++)
            ref_head(c, x[0]->data, x[1]->data, x[2]->data, dO, o_gpu, first, b, h, mode, &r, S, Sa);
    for (int i = 1; i < 4; i++)   // the gradients' last roundings (scale, the write)
        for (int64_t e = 0; e < n[i]; e++) r.t[i][e] = 1.01 * r.t[i][e] + 2 * 0x1p-23 * fabs(r.v[i][e]) + 1e-30;
    free(S), free(Sa), free(first);
    return r;
}

static const char *NAMES[4] = {"o", "dq", "dk", "dv"};

// Row, position, head and column of element e of output i, for messages.
static void where_str(char *s, size_t len, const Case *c, int i, int64_t e) {
    int d = i == 0 || i == 3 ? c->dv : c->dk, W = c->H * d;
    snprintf(s, len, "b %d t %d head %d column %d", (int)(e / W / c->T), (int)(e / W % c->T), (int)(e % W / d),
             (int)(e % d));
}

static Tensor *seq(int B, int T, int width, uint64_t seed) {
    Tensor *t = tensor_newv(true, 3, B, T, width);
    fill_normal(t, seed, 1.0);
    return t;
}

// Documents: row 0 at 0, 5, 40, 63, 64, 65, 130 and T - 1 (one-position
// documents, both sides of a tile edge, one across tiles); row 1 from before
// the window (0 not flagged), then at 3, T / 3 + 1, 70 and 128.
static int *docs_make(int B, int T) {
    int *d = calloc((size_t)B * T, sizeof(int));
    int row0[] = {0, 5, 40, 63, 64, 65, 130, T - 1}, row1[] = {3, T / 3 + 1, 70, 128};
    for (size_t i = 0; i < sizeof row0 / sizeof row0[0]; i++)
        if (row0[i] >= 0 && row0[i] < T) d[row0[i]] = 1;
    for (size_t i = 0; B > 1 && i < sizeof row1 / sizeof row1[0]; i++)
        if (row1[i] > 0 && row1[i] < T) d[T + row1[i]] = 1;
    return d;
}

// The roundings left out one at a time, and all of them; for each, the
// largest excess over the bound seen so far (over the outputs and cases).
static const int VARIANTS[] = {ROUND_ALL & ~RQ, ROUND_ALL & ~RK, ROUND_ALL & ~RV, ROUND_ALL & ~RDO,
                               ROUND_ALL & ~RP, ROUND_ALL & ~RDS, 0};
#define N_VARIANTS ((int)(sizeof VARIANTS / sizeof VARIANTS[0]))

// One case: the GPU's bf16 op within the bound of the reference, every
// output; the variants' excesses into excess[]; the GPU's outputs into
// keep (when not NULL, for the CPU comparison; else freed).
static void check_case(const Case *c, uint64_t seed, double excess[N_VARIANTS], real *keep[4], Ref *keep_ref) {
    Tensor *x[3] = {seq(c->B, c->T, c->H * c->dk, seed), seq(c->B, c->T, c->H * c->dk, seed + 1),
                    seq(c->B, c->T, c->H * c->dv, seed + 2)};
    real *dO = test_randn(x[2]->numel, seed + 3), *g[4];
    run_attn(DEVICE_CUDA, c, x, dO, true, g);
    int64_t n[4] = {x[2]->numel, x[0]->numel, x[1]->numel, x[2]->numel};
    Ref r = reference(c, x, dO, g[0], ROUND_ALL);
    double wmax[4];
    for (int i = 0; i < 4; i++) {
        int64_t e;
        wmax[i] = cuda_worst_ratio(g[i], r.v[i], r.t[i], n[i], &e);
        char at[96];
        where_str(at, sizeof at, c, i, e);
        cr_assert(wmax[i] <= 1, "B %d T %d H %d dk %d dv %d%s: %s at %s is %.9g, the bf16 reference %.9g: error "
                  "%.3g, %.3g times the float32 bound %.3g", c->B, c->T, c->H, c->dk, c->dv,
                  c->doc_start ? ", documents" : "", NAMES[i], at, (double)g[i][e], r.v[i][e],
                  fabs(g[i][e] - r.v[i][e]), wmax[i], r.t[i][e]);
    }
    cr_log_info("T %d dk %d dv %d%s: worst error / bound: o %.3g, dq %.3g, dk %.3g, dv %.3g", c->T, c->dk, c->dv,
                c->doc_start ? " docs" : "", wmax[0], wmax[1], wmax[2], wmax[3]);
    for (int vi = 0; vi < N_VARIANTS; vi++) {
        Ref u = reference(c, x, dO, g[0], VARIANTS[vi]);
        for (int i = 0; i < 4; i++) excess[vi] = fmax(excess[vi], cuda_worst_ratio_d(u.v[i], r.v[i], r.t[i], n[i]));
        ref_free(&u);
    }
    if (keep) memcpy(keep, g, sizeof g);
    else run_free(g);
    if (keep_ref) *keep_ref = r;
    else ref_free(&r);
    free(dO);
    for (int i = 0; i < 3; i++) tensor_free(x[i]);
}

static void assert_variants(const double excess[N_VARIANTS]) {
    const char *what[N_VARIANTS] = {"Q", "K", "V", "dO", "P", "dS", "any operand"};
    cr_log_info("references without one rounding, the worst error / bound: Q %.3g, K %.3g, V %.3g, dO %.3g, "
                "P %.3g, dS %.3g, none %.3g", excess[0], excess[1], excess[2], excess[3], excess[4], excess[5],
                excess[6]);
    for (int vi = 0; vi < N_VARIANTS; vi++)
        cr_assert_gt(excess[vi], 1, "the reference without rounding %s is within the bound everywhere (%.3g of "
                     "it at most): the test would not see a kernel that skips that rounding", what[vi], excess[vi]);
}

static const int DIMS[][2] = {{32, 32}, {64, 64}, {128, 128}, {40, 24}};
#define N_DIMS ((int)(sizeof DIMS / sizeof DIMS[0]))
static const int TS[] = {1, 17, 64, 100, 257};
#define N_TS ((int)(sizeof TS / sizeof TS[0]))

Test(cuda_attn_bf16, against_rounded_reference) {
    cuda_require();
    double excess[N_VARIANTS] = {0};
    for (int ti = 0; ti < N_TS; ti++)
        for (int di = 0; di < N_DIMS; di++)
            for (int docs = 0; docs < 2; docs++) {
                int *ds = docs ? docs_make(2, TS[ti]) : NULL;
                Case c = {2, TS[ti], 2, DIMS[di][0], DIMS[di][1], ds};
                check_case(&c, 1000 + 100 * ti + 10 * di + docs, excess, NULL, NULL);
                free(ds);
            }
    assert_variants(excess);
}

// The GPU's bf16 kernels against the CPU's (attn_flash.c, attn_tiles_bf16):
// the same roundings at the same running maxima (64-key tiles from a
// multiple of 64 on both), so each is within the bound of its reference (D =
// dO . o of its own o) and the two within both bounds and the references'
// difference of each other. The CPU's bf16 tiles need
// AVX512_BF16 code (AG_NATIVE on such a CPU) and oneDNN's bf16 switch: where
// this build or CPU lacks them the test says so and skips.
Test(cuda_attn_bf16, against_cpu_bf16) {
    cuda_require();
    if (!onednn_built() || !onednn_has_bf16())
        cr_skip_test("this build has no oneDNN or this CPU no AVX512_BF16: no bf16 attention on the CPU here");
    char err[256];
    cr_assert(blas_select(GEMM_ONEDNN, PRECISION_BF16, err, sizeof err), "%s", err);
    if (!attn_tiles_bf16(64, 64, ATTN_TILE_Q, ATTN_TILE_K)) {
        blas_select(GEMM_ONEDNN, PRECISION_FP32, err, sizeof err);
        cr_skip_test("this build's CPU attention tiles have no bf16 products (AG_NATIVE=OFF?)");
    }
    cr_assert_eq(ATTN_TILE_K, 64, "the GPU's key tiles are 64 keys; the CPU's default must be too");
    int cases[][3] = {{100, 64, 64}, {257, 32, 32}, {257, 128, 128}, {70, 40, 24}};
    double excess[N_VARIANTS] = {0};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++)
        for (int docs = 0; docs < 2; docs++) {
            int *ds = docs ? docs_make(2, cases[ci][0]) : NULL;
            Case c = {2, cases[ci][0], 2, cases[ci][1], cases[ci][2], ds};
            uint64_t seed = 5000 + 10 * ci + docs;
            real *g[4], *h[4];
            Ref r;
            check_case(&c, seed, excess, g, &r);
            Tensor *x[3] = {seq(c.B, c.T, c.H * c.dk, seed), seq(c.B, c.T, c.H * c.dk, seed + 1),
                            seq(c.B, c.T, c.H * c.dv, seed + 2)};   // check_case's inputs again
            real *dO = test_randn(x[2]->numel, seed + 3);
            run_attn(DEVICE_CPU, &c, x, dO, true, h);
            // The CPU's own reference (D from its own o), and its bound.
            Ref rc = reference(&c, x, dO, h[0], ROUND_ALL);
            int64_t n[4] = {x[2]->numel, x[0]->numel, x[1]->numel, x[2]->numel};
            for (int i = 0; i < 4; i++) {
                int64_t at;
                double w = cuda_worst_ratio(h[i], rc.v[i], rc.t[i], n[i], &at);
                char where[96];
                where_str(where, sizeof where, &c, i, at);
                cr_assert(w <= 1, "T %d dk %d dv %d%s: the CPU's bf16 %s at %s is %.9g, its reference %.9g: %.3g "
                          "times the bound", c.T, c.dk, c.dv, docs ? ", documents" : "", NAMES[i], where,
                          (double)h[i][at], rc.v[i][at], w);
                // GPU against CPU: both bounds, and the two references'
                // difference (their D differ by the outputs' float32 error).
                w = 0;
                for (int64_t e = 0; e < n[i]; e++) {
                    double d = fabs((double)g[i][e] - h[i][e]) /
                               (r.t[i][e] + rc.t[i][e] + fabs(r.v[i][e] - rc.v[i][e]));
                    if (!(d <= w)) w = d, at = e;
                }
                where_str(where, sizeof where, &c, i, at);
                cr_assert(w <= 1, "T %d dk %d dv %d%s: %s at %s: GPU %.9g, CPU %.9g, %.3g times the bound %.3g",
                          c.T, c.dk, c.dv, docs ? ", documents" : "", NAMES[i], where, (double)g[i][at],
                          (double)h[i][at], w, r.t[i][at] + rc.t[i][at] + fabs(r.v[i][at] - rc.v[i][at]));
                cr_log_info("T %d dk %d dv %d%s: %s, GPU against CPU: %.3g of the bound", c.T, c.dk, c.dv,
                            docs ? " docs" : "", NAMES[i], w);
            }
            ref_free(&rc);
            run_free(g), run_free(h), ref_free(&r);
            free(dO), free(ds);
            for (int i = 0; i < 3; i++) tensor_free(x[i]);
        }
    blas_select(GEMM_ONEDNN, PRECISION_FP32, err, sizeof err);
}

static bool same(const real *a, const real *b, int64_t n) { return !memcmp(a, b, (size_t)n * sizeof(real)); }

// Head dims the bf16 kernels do not take (odd ones: the CPU's bf16 pairs need
// them even) run the float32 kernels with bf16 on, the same bits as with it
// off; and float32 runs before and after a bf16 run give the same bits (the
// switch leaves nothing behind), which the bf16 run does not.
Test(cuda_attn_bf16, float32_kernels_unchanged) {
    cuda_require();
    int *ds = docs_make(2, 100);
    int dims[][2] = {{33, 17}, {64, 64}};
    for (int di = 0; di < 2; di++) {
        Case c = {2, 100, 2, dims[di][0], dims[di][1], ds};
        Tensor *x[3] = {seq(2, 100, 2 * c.dk, 70 + di), seq(2, 100, 2 * c.dk, 80 + di), seq(2, 100, 2 * c.dv, 90)};
        real *dO = test_randn(x[2]->numel, 91), *f[4], *h[4], *f2[4];
        int64_t n[4] = {x[2]->numel, x[0]->numel, x[1]->numel, x[2]->numel};
        run_attn(DEVICE_CUDA, &c, x, dO, false, f);
        run_attn(DEVICE_CUDA, &c, x, dO, true, h);
        run_attn(DEVICE_CUDA, &c, x, dO, false, f2);
        for (int i = 0; i < 4; i++) {
            cr_assert(same(f[i], f2[i], n[i]), "dk %d dv %d: %s of float32 runs before and after a bf16 run differ",
                      c.dk, c.dv, NAMES[i]);
            if (di == 0)
                cr_assert(same(f[i], h[i], n[i]), "dk %d dv %d (odd: float32 kernels): %s changed with bf16 on",
                          c.dk, c.dv, NAMES[i]);
            else
                cr_assert(!same(f[i], h[i], n[i]), "dk %d dv %d: %s the same bits with bf16 on: did it run in bf16?",
                          c.dk, c.dv, NAMES[i]);
        }
        run_free(f), run_free(h), run_free(f2);
        free(dO);
        for (int i = 0; i < 3; i++) tensor_free(x[i]);
    }
    free(ds);
}

// Every way the gradients can arrive, in bf16: one tensor as q and k, as q,
// k and v (its gradient is dq, then dk added, then dv: the float32 sums of
// the separate gradients, exactly, since the kernels compute the same bits
// for the same values), and some inputs without a gradient (the others' the
// same bits as with all of them). A repeated run is the same bits.
Test(cuda_attn_bf16, every_way_gradients_arrive) {
    cuda_require();
    int B = 2, T = 70, H = 2, d = 32;
    int *ds = docs_make(B, T);
    Case c = {B, T, H, d, d, ds};
    Tensor *x = seq(B, T, H * d, 41), *v = seq(B, T, H * d, 42), *w = seq(B, T, H * d, 43);
    int64_t n = x->numel;
    real *dO = test_randn(n, 44), *all[4], *again[4], *r[4];
    Tensor *qkv[3] = {x, w, v};
    run_attn(DEVICE_CUDA, &c, qkv, dO, true, all);
    run_attn(DEVICE_CUDA, &c, qkv, dO, true, again);
    for (int i = 0; i < 4; i++) cr_assert(same(all[i], again[i], n), "%s differs between two bf16 runs", NAMES[i]);
    run_free(again);
    // x as q and k: (x, x, v) against (x, x', v) with x' a copy of x.
    Tensor *xx[3] = {x, x, v};
    real *sep[4];
    run_attn(DEVICE_CUDA, &c, xx, dO, true, sep);
    run_map(DEVICE_CUDA, &c, (Tensor *[]){x, v}, 2, (const int[]){0, 0, 1}, 3, dO, true, r);
    cr_assert(same(r[0], sep[0], n), "attention(x, x, v): o differs from attention(x, x', v)");
    for (int64_t e = 0; e < n; e++)
        cr_assert(r[1][e] == (float)(sep[1][e] + sep[2][e]), "attention(x, x, v): dx[%lld] %.9g, dq + dk %.9g",
                  (long long)e, (double)r[1][e], (double)(sep[1][e] + sep[2][e]));
    cr_assert(same(r[2], sep[3], n), "attention(x, x, v): dv differs");
    run_free(r), run_free(sep);
    // x as q, k and v.
    Tensor *x3[3] = {x, x, x};
    run_attn(DEVICE_CUDA, &c, x3, dO, true, sep);
    run_map(DEVICE_CUDA, &c, &x, 1, (const int[]){0, 0, 0}, 1, dO, true, r);
    for (int64_t e = 0; e < n; e++) {
        float want = (float)(sep[1][e] + sep[2][e]) + sep[3][e];
        cr_assert(r[1][e] == want, "attention(x, x, x): dx[%lld] %.9g, (dq + dk) + dv %.9g", (long long)e,
                  (double)r[1][e], (double)want);
    }
    run_free(r), run_free(sep);
    // Some inputs without a gradient (bit i: input i has one).
    int which[] = {1, 2, 4, 6, 3};
    for (int wi = 0; wi < 5; wi++) {
        run_map(DEVICE_CUDA, &c, qkv, 3, (const int[]){0, 1, 2}, which[wi], dO, true, r);
        cr_assert(same(r[0], all[0], n), "gradients of inputs %d (bits): o differs", which[wi]);
        for (int i = 0; i < 3; i++)
            if (r[i + 1])
                cr_assert(same(r[i + 1], all[i + 1], n), "gradients of inputs %d (bits): %s differs from the run "
                          "with all of them", which[wi], NAMES[i + 1]);
        run_free(r);
    }
    run_free(all);
    free(dO), free(ds);
    tensor_free(x), tensor_free(v), tensor_free(w);
}
#endif

// test_cuda_gdn_bf16.c: op_gdn's chunked form on the GPU under precision =
// bf16 (device_set_bf16; float32 build): its per-chunk tile products take
// bf16 operands with float32 sums (src/cuda/gdn_common.cuh lists which,
// gdn_bf16.cuh states the rounding).
//   1. One chunk's forward against a host reference in double that rounds
//      exactly the GPU's operands, exactly so (round to nearest even).
//   2. Forward and backward (o, S_T and every gradient) against the same op
//      in float32 on the GPU, many shapes, gates, documents, s0, within a
//      bound scaled by how much rounding the inputs to bf16 moves them.
//   3. op_gdp (Gated DeltaProduct: op_gdn over an interleaved sequence) the same.
// The float32 path's own tests are test_cuda_gdn.c's; the bf16 model step
// (whose gdn and gdp layers now round their chunks too) test_cuda_bf16.c's.
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "blas.h"
#include "cuda_check.h"
#include "cuda_ops.h"
#include "device.h"
#include "gdn_kernel.h"
#include "test_cuda_gdn.h"

#ifndef AG_DOUBLE
// ---------------------------------------------------------------- one GPU run

enum { MAX_IO = 8 };

// The outputs and every input gradient of f on a tape of device d (host
// copies), the outputs seeded with fixed random gradients, the products bf16
// or not (the CPU's: blas_select, which the caller has checked can).
typedef struct {
    int n_out, n_in;
    real *out[MAX_IO], *grad[MAX_IO];
    int64_t n_o[MAX_IO], n_g[MAX_IO];
} Run;

static Run dev_run(Device d, GradcheckFn f, Tensor *const *in, int n_in, void *ctx, bool bf16) {
    Run r;
    memset(&r, 0, sizeof r);
    r.n_in = n_in;
    cuda_set_products(d, bf16);
    Tape tp;
    tape_init_on(&tp, d);
    Tensor *x[MAX_IO] = {0}, *outs[MAX_IO] = {0};
    for (int i = 0; i < n_in; i++) {
        if (!in[i]) continue;
        x[i] = tape_tensor_copy(&tp, in[i]->ndim, in[i]->shape, in[i]->data);
        x[i]->requires_grad = true;
    }
    r.n_out = f(&tp, x, n_in, ctx, outs);
    real *seeds[MAX_IO];
    for (int i = 0; i < r.n_out; i++) seeds[i] = test_randn(outs[i]->numel, 7 + i);
    tape_backward_multi(&tp, outs, (const real *const *)seeds, r.n_out);
    for (int i = 0; i < r.n_out; i++) {
        r.n_o[i] = outs[i]->numel;
        r.out[i] = malloc((size_t)r.n_o[i] * sizeof(real));
        dev_to_host(r.out[i], outs[i]->data, (size_t)r.n_o[i] * sizeof(real), d);
        free(seeds[i]);
    }
    for (int i = 0; i < n_in; i++) {
        if (!x[i]) continue;
        r.n_g[i] = in[i]->numel;
        r.grad[i] = malloc((size_t)r.n_g[i] * sizeof(real));
        dev_to_host(r.grad[i], x[i]->grad, (size_t)r.n_g[i] * sizeof(real), d);
    }
    dev_sync(d);
    tape_free(&tp);
    cuda_reset_products(d);
    return r;
}

static Run gpu_run(GradcheckFn f, Tensor *const *in, int n_in, void *ctx, bool bf16) {
    cuda_require();
    return dev_run(DEVICE_CUDA, f, in, n_in, ctx, bf16);
}

static void run_free(Run *r) {
    for (int i = 0; i < MAX_IO; i++) free(r->out[i]), free(r->grad[i]);
}

// ||a - b||_2, and where |a - b| is largest (*at) and how large (*max).
static double diff_norm(const real *a, const double *ad, const real *b, int64_t n, int64_t *at, double *max) {
    double s = 0;
    *at = 0, *max = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((ad ? ad[i] : (double)a[i]) - (double)b[i]);
        s += d * d;
        if (d > *max || isnan(d)) *max = d, *at = i;
    }
    return sqrt(s);
}

static double norm2(const real *a, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += (double)a[i] * a[i];
    return sqrt(s);
}

// ---------------------------------------------------------------- 1. one chunk against a rounded reference

static double rnd(double x) { return (double)bf16_round((float)x); }

// The GPU's bf16 forward of the chunked form for T <= C (one chunk, s0 the
// state entering it, no documents), in double, its operands rounded where
// the GPU rounds them (gdn_common.cuh): KK = r(K) r(K)^T, W = r(Tm) r(Xw),
// U = r(Tm) r(Xu), P = (r(Q) r(K)^T) * E, O = diag(b) r(Q) r(S0) + r(P)
// r(Delta); A, the solve, Delta = U - W S0 and S_T = bl S0 + Kd^T Delta
// unrounded. o (B, T, H dv) and sT (B, H, dk, dv).
static void ref_one_chunk(Tensor *const *x, int H, double *o, double *sT) {
    int B = x[IQ]->shape[0], T = x[IQ]->shape[1], dk = x[IQ]->shape[2] / H, dv = x[IV]->shape[2] / H;
    int ldk = H * dk, ldv = H * dv;
    double *G = malloc(sizeof(double) * T), *E = malloc(sizeof(double) * T * T), *Tm = malloc(sizeof(double) * T * T);
    double *W = malloc(sizeof(double) * T * dk), *U = malloc(sizeof(double) * T * dv);
    double *Dl = malloc(sizeof(double) * T * dv), *S0 = malloc(sizeof(double) * dk * dv);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            const real *q = x[IQ]->data + (int64_t)b * T * ldk + h * dk, *k = x[IK]->data + (int64_t)b * T * ldk + h * dk;
            const real *v = x[IV]->data + (int64_t)b * T * ldv + h * dv;
            const real *beta = x[IBETA]->data + (int64_t)b * T * H + h, *g = x[IG]->data + (int64_t)b * T * H + h;
            for (int e = 0; e < dk * dv; e++)
                S0[e] = x[IS0] ? x[IS0]->data[((int64_t)b * H + h) * dk * dv + e] : 0;
            for (int i = 0; i < T; i++) G[i] = (i ? G[i - 1] : 0) + g[(int64_t)i * H];
            for (int i = 0; i < T; i++)
                for (int j = 0; j < T; j++) E[i * T + j] = j <= i ? exp(G[i] - G[j]) : 0;
            for (int i = 0; i < T; i++)   // Tm = (I + A)^-1 by rows
                for (int j = 0; j < T; j++) {
                    double t = i == j;
                    for (int m = j; m < i; m++) {
                        double kk = 0;
                        for (int c = 0; c < dk; c++) kk += rnd(k[(int64_t)i * ldk + c]) * rnd(k[(int64_t)m * ldk + c]);
                        t -= beta[(int64_t)i * H] * E[i * T + m] * kk * Tm[m * T + j];
                    }
                    Tm[i * T + j] = t;
                }
            for (int i = 0; i < T; i++) {
                for (int c = 0; c < dk; c++) {
                    double s = 0;
                    for (int m = 0; m <= i; m++)
                        s += rnd(Tm[i * T + m]) * rnd(beta[(int64_t)m * H] * exp(G[m]) * k[(int64_t)m * ldk + c]);
                    W[i * dk + c] = s;
                }
                for (int c = 0; c < dv; c++) {
                    double s = 0;
                    for (int m = 0; m <= i; m++) s += rnd(Tm[i * T + m]) * rnd(beta[(int64_t)m * H] * v[(int64_t)m * ldv + c]);
                    U[i * dv + c] = s;
                }
                for (int c = 0; c < dv; c++) {
                    double s = U[i * dv + c];
                    for (int r = 0; r < dk; r++) s -= W[i * dk + r] * S0[r * dv + c];
                    Dl[i * dv + c] = s;
                }
            }
            for (int i = 0; i < T; i++)
                for (int c = 0; c < dv; c++) {
                    double s = 0, p;
                    for (int r = 0; r < dk; r++) s += rnd(q[(int64_t)i * ldk + r]) * rnd(S0[r * dv + c]);
                    s *= exp(G[i]);
                    for (int m = 0; m <= i; m++) {
                        p = 0;
                        for (int r = 0; r < dk; r++) p += rnd(q[(int64_t)i * ldk + r]) * rnd(k[(int64_t)m * ldk + r]);
                        s += rnd(p * E[i * T + m]) * rnd(Dl[m * dv + c]);
                    }
                    o[((int64_t)b * T + i) * ldv + h * dv + c] = s;
                }
            double *S = sT + ((int64_t)b * H + h) * dk * dv, bl = exp(G[T - 1]);
            for (int r = 0; r < dk; r++)
                for (int c = 0; c < dv; c++) {
                    double s = bl * S0[r * dv + c];
                    for (int m = 0; m < T; m++) s += exp(G[T - 1] - G[m]) * k[(int64_t)m * ldk + r] * Dl[m * dv + c];
                    S[r * dv + c] = s;
                }
        }
    free(G), free(E), free(Tm), free(W), free(U), free(Dl), free(S0);
}

// The GPU's bf16 result differs from this reference by float32 summation
// (about 1e-6 relative) and by the operands that round the other way: an
// intermediate that the GPU computed in float32 (Tm, Xw, P, Delta) and the
// reference in double rounds to the neighbouring bf16 when it lies within
// their difference (1e-6 of it) of a rounding boundary (2^-8 of it apart):
// about one element in a thousand. Its distance to the reference is then a
// small part (the square root of that share, ~0.03 normwise) of its
// distance to the float32 result, which every operand's rounding makes. A
// kernel that rounded other operands, rounded otherwise (truncation), or
// not at all is as far from the reference as from float32: ratio ~1.
#define REF_RATIO 0.25

static void check_one_chunk(int T, int dk, Regime reg, bool with_s0, uint64_t seed) {
    enum { H = 2, C = 64 };
    Tensor *x[N_IN];
    gdn_test_inputs(x, 1, T, H, dk, dk, reg, with_s0, false, seed);
    GdnCtx c = {H, C, MIXER_FORM_CHUNKED, NULL, 3};
    int n = with_s0 ? N_IN : IS0;
    Run f = gpu_run(gdn_test_op, x, n, &c, false), h = gpu_run(gdn_test_op, x, n, &c, true);
    double *ref[2] = {malloc(sizeof(double) * (size_t)h.n_o[0]), malloc(sizeof(double) * (size_t)h.n_o[1])};
    ref_one_chunk(x, H, ref[0], ref[1]);
    static const char *const names[2] = {"o", "S_T"};
    for (int i = 0; i < 2; i++) {
        int64_t at, at_f;
        double mx, mx_f;
        double dr = diff_norm(NULL, ref[i], h.out[i], h.n_o[i], &at, &mx);
        double df = diff_norm(f.out[i], NULL, h.out[i], h.n_o[i], &at_f, &mx_f), nr = norm2(f.out[i], f.n_o[i]);
        cr_log_info("gdn bf16 T=%d dk=dv=%d regime %d%s %s: to the rounded reference %.3g, to float32 %.3g "
                    "(relative to |%s| %.3g)", T, dk, (int)reg, with_s0 ? " +s0" : "", names[i], dr, df, names[i], nr);
        cr_assert(df > 0, "gdn bf16 T=%d dk=%d regime %d: %s is float32's to the bit: were the products bf16?", T, dk,
                  (int)reg, names[i]);
        cr_assert(dr <= REF_RATIO * df,
                  "gdn bf16 T=%d dk=dv=%d regime %d%s: %s is %.3g from the rounded reference, %.3g from float32 "
                  "(ratio %.3g > %.2f); largest error %.3g at element %lld (GPU %.9g, reference %.9g, float32 %.9g)",
                  T, dk, (int)reg, with_s0 ? " +s0" : "", names[i], dr, df, dr / df, REF_RATIO, mx, (long long)at,
                  (double)h.out[i][at], ref[i][at], (double)f.out[i][at]);
    }
    free(ref[0]), free(ref[1]);
    run_free(&f), run_free(&h);
    gdn_free_inputs(x);
}

Test(cuda_gdn_bf16, one_chunk_against_rounded_reference) {
    static const int Ts[] = {1, 63, 64}, dks[] = {64, 128};
    static const Regime regs[] = {REG_PLAIN, REG_G_ZERO, REG_G_M20, REG_BETA_1};
    for (int d = 0; d < 2; d++)
        for (int t = 0; t < 3; t++)
            for (int r = 0; r < 4; r++) check_one_chunk(Ts[t], dks[d], regs[r], true, 700 + 10 * d + 3 * t + r);
    check_one_chunk(63, 64, REG_PLAIN, false, 760);
}

// ---------------------------------------------------------------- 2. bf16 against float32, both passes

// The bound. Each rounded operand moves by at most u = 2^-8 of itself; the
// products' sums are float32. How far that carries to an output or gradient
// depends on the op's conditioning there (the solve, cancelling sums such
// as dg's), so it is measured, not assumed: the same op in float32 on the
// inputs rounded to bf16 (q, k, v, s0: the operands the products start
// from; beta and g are gates, kept float32) moves each result by D, the
// response to a u-sized relative perturbation of everything downstream of
// the inputs. The bf16 op perturbs, to first order, by a sum over its
// rounded operands, at most ROUND_SITES of them on any path from an input to
// a result (the backward's longest: P, Delta; dQK, K; Tm, dW; dXw, W; dKK,
// K: products of two rounded operands after the forward's K K^T, Tm Xw and Q
// K^T), each no larger than the input rounding's D: normwise error <=
// ROUND_SITES D (plus 2^-20 of the result: float32 sums where D is ~0). The
// errors of independent roundings add in quadrature, so a correct kernel
// stays near sqrt(ROUND_SITES) D; a wrong fragment layout or operand is O(1).
#define ROUND_SITES 12

static Tensor *rounded(const Tensor *t) {
    if (!t) return NULL;
    Tensor *r = tensor_new(t->ndim, t->shape, true);
    for (int64_t i = 0; i < t->numel; i++) r->data[i] = bf16_round(t->data[i]);
    return r;
}

// bf16 run h, float32 run f, float32 run on rounded inputs d: every output
// and gradient of h within the bound of f; h not all f's bits.
static void compare_runs(const char *label, const Run *h, const Run *f, const Run *d, const char *const *in_names) {
    bool differs = false;
    for (int pass = 0; pass < 2; pass++) {
        int cnt = pass ? h->n_in : h->n_out;
        for (int i = 0; i < cnt; i++) {
            const real *hv = pass ? h->grad[i] : h->out[i], *fv = pass ? f->grad[i] : f->out[i];
            const real *dv = pass ? d->grad[i] : d->out[i];
            int64_t n = pass ? h->n_g[i] : h->n_o[i], at, at_d;
            if (!hv) continue;
            char name[16];
            if (pass) snprintf(name, sizeof name, "%s", in_names[i]);
            else snprintf(name, sizeof name, "output %d", i);
            double mx, mx_d, e = diff_norm(hv, NULL, fv, n, &at, &mx), D = diff_norm(dv, NULL, fv, n, &at_d, &mx_d);
            double nf = norm2(fv, n), tol = ROUND_SITES * D + ldexp(nf, -20) + 1e-30;
            differs |= e > 0;
            cr_log_info("%s: %s: bf16 error %.3g, input rounding's %.3g (|%s| %.3g): %.2f of the bound", label, name,
                        e, D, name, nf, e / tol);
            cr_assert(e <= tol,
                      "%s: %s: bf16 vs float32 %.3g normwise (relative %.3g), over %d x the input rounding's %.3g; "
                      "largest error %.3g at element %lld (bf16 %.9g, float32 %.9g)",
                      label, name, e, e / (nf + 1e-300), ROUND_SITES, D, mx, (long long)at, (double)hv[at],
                      (double)fv[at]);
        }
    }
    cr_assert(differs, "%s: the bf16 run is float32's to the bit: were the products bf16?", label);
}

static void check_bf16(int B, int T, int H, int dk, int dv, int C, Regime reg, bool with_s0, const int *docs,
                       uint64_t seed) {
    Tensor *x[N_IN], *xr[N_IN] = {0};
    gdn_test_inputs(x, B, T, H, dk, dv, reg, with_s0, true, seed);
    for (int i = 0; i < N_IN; i++) xr[i] = i == IBETA || i == IG ? x[i] : rounded(x[i]);
    GdnCtx c = {H, C, MIXER_FORM_CHUNKED, docs, 3};
    int n = with_s0 ? N_IN : IS0;
    Run h = gpu_run(gdn_test_op, x, n, &c, true), f = gpu_run(gdn_test_op, x, n, &c, false);
    Run d = gpu_run(gdn_test_op, xr, n, &c, false);
    char label[128];
    snprintf(label, sizeof label, "gdn bf16 B=%d T=%d H=%d dk=%d dv=%d C=%d regime %d%s%s", B, T, H, dk, dv, C,
             (int)reg, with_s0 ? " +s0" : "", docs ? " +docs" : "");
    compare_runs(label, &h, &f, &d, GDN_GRAD_NAMES);
    run_free(&h), run_free(&f), run_free(&d);
    for (int i = 0; i < N_IN; i++)
        if (xr[i] != x[i]) tensor_free(xr[i]);
    gdn_free_inputs(x);
}

Test(cuda_gdn_bf16, forward_and_backward_close_to_float32) {
    static const int Ts[] = {1, 63, 64, 200}, dks[] = {64, 128};
    for (int d = 0; d < 2; d++)
        for (int t = 0; t < 4; t++)
            for (int s = 0; s < 2; s++) check_bf16(2, Ts[t], 2, dks[d], dks[d], 64, REG_PLAIN, s, NULL, 800 + 8 * d + 2 * t + s);
}

Test(cuda_gdn_bf16, gate_regimes) {
    static const Regime regs[] = {REG_G_ZERO, REG_G_M20, REG_BETA_1};
    for (int r = 0; r < 3; r++) {
        check_bf16(2, 200, 2, 64, 64, 64, regs[r], true, NULL, 840 + r);
        check_bf16(1, 130, 2, 128, 128, 64, regs[r], true, NULL, 850 + r);
    }
}

Test(cuda_gdn_bf16, documents_shapes_and_chunks) {
    // Documents at and between chunk edges; dk != dv; chunks of 16, 32 and
    // 128 (the solve's two forms) and one of 100 (partial tiles everywhere).
    enum { B = 2, T = 200 };
    static int doc[B * T];
    memset(doc, 0, sizeof doc);
    static const int starts[] = {0, 5, 63, 64, 65, 130, T - 1};
    for (size_t i = 0; i < sizeof starts / sizeof starts[0]; i++) doc[starts[i]] = 1;
    doc[T + 100] = 1;
    check_bf16(B, T, 2, 64, 64, 64, REG_PLAIN, true, doc, 860);
    check_bf16(B, T, 2, 128, 128, 64, REG_G_M20, false, doc, 861);
    check_bf16(B, T, 2, 64, 32, 16, REG_PLAIN, true, doc, 862);
    check_bf16(1, T, 3, 48, 80, 32, REG_PLAIN, true, NULL, 863);
    check_bf16(1, 300, 2, 64, 64, 128, REG_PLAIN, true, doc, 864);
    check_bf16(2, 250, 1, 40, 24, 100, REG_BETA_1, true, NULL, 865);
}

// The GPU's bf16 gdn against the CPU's, where this build and CPU have the
// CPU's bf16 chunk products. They round different operands (docs/cuda.md:
// the CPU forms Delta = Tm (Xu - Xw S0) and rounds the state's products too;
// the GPU's scans are float32), so they agree to bf16 rounding, not to
// float32 summation: each is within ROUND_SITES D of its own float32 result
// (D as above, measured on the GPU), and the float32 results within their
// difference of each other.
static void check_against_cpu(int B, int T, int dk, Regime reg, bool with_s0, const int *docs, uint64_t seed) {
    Tensor *x[N_IN], *xr[N_IN] = {0};
    gdn_test_inputs(x, B, T, 2, dk, dk, reg, with_s0, true, seed);
    for (int i = 0; i < N_IN; i++) xr[i] = i == IBETA || i == IG ? x[i] : rounded(x[i]);
    GdnCtx c = {2, 64, MIXER_FORM_CHUNKED, docs, 3};
    int n = with_s0 ? N_IN : IS0;
    Run gh = gpu_run(gdn_test_op, x, n, &c, true), gf = gpu_run(gdn_test_op, x, n, &c, false);
    Run gd = gpu_run(gdn_test_op, xr, n, &c, false);
    Run ch = dev_run(DEVICE_CPU, gdn_test_op, x, n, &c, true), cf = dev_run(DEVICE_CPU, gdn_test_op, x, n, &c, false);
    bool cpu_rounded = false;
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < (pass ? n : 2); i++) {
            const real *vh = pass ? gh.grad[i] : gh.out[i], *vc = pass ? ch.grad[i] : ch.out[i];
            const real *vf = pass ? gf.grad[i] : gf.out[i], *vd = pass ? gd.grad[i] : gd.out[i];
            const real *wf = pass ? cf.grad[i] : cf.out[i];
            int64_t m = pass ? gh.n_g[i] : gh.n_o[i], at, at2;
            double mx, mx2, e = diff_norm(vh, NULL, vc, m, &at, &mx), D = diff_norm(vd, NULL, vf, m, &at2, &mx2);
            double f32 = diff_norm(vf, NULL, wf, m, &at2, &mx2), nf = norm2(vf, m);
            cpu_rounded |= diff_norm(vc, NULL, wf, m, &at2, &mx2) > 0;
            double tol = 2 * ROUND_SITES * D + f32 + ldexp(nf, -20) + 1e-30;
            const char *name = pass ? GDN_GRAD_NAMES[i] : i ? "S_T" : "o";
            cr_log_info("gdn bf16 GPU vs CPU B=%d T=%d dk=%d regime %d: %s %.3g (float32 GPU vs CPU %.3g, D %.3g)", B,
                        T, dk, (int)reg, name, e, f32, D);
            cr_assert(e <= tol,
                      "gdn bf16 GPU vs CPU B=%d T=%d dk=dv=%d regime %d%s%s: %s differs by %.3g normwise (relative "
                      "%.3g), over 2 x %d x D %.3g + the float32 runs' %.3g; largest at element %lld (GPU %.9g, CPU "
                      "%.9g)", B, T, dk, (int)reg, with_s0 ? " +s0" : "", docs ? " +docs" : "", name, e,
                      e / (nf + 1e-300), ROUND_SITES, D, f32, (long long)at, (double)vh[at], (double)vc[at]);
        }
    cr_assert(cpu_rounded, "the CPU's bf16 run is its float32 run to the bit: were its chunk products bf16?");
    run_free(&gh), run_free(&gf), run_free(&gd), run_free(&ch), run_free(&cf);
    for (int i = 0; i < N_IN; i++)
        if (xr[i] != x[i]) tensor_free(xr[i]);
    gdn_free_inputs(x);
}

Test(cuda_gdn_bf16, against_cpu_bf16) {
    cuda_require();
    if (!onednn_built() || !onednn_has_bf16())
        cr_skip_test("this build has no oneDNN or this CPU no AVX512_BF16: no bf16 gdn on the CPU here");
    char err[256];
    cr_assert(blas_select(GEMM_ONEDNN, PRECISION_BF16, err, sizeof err), "%s", err);
    bool tiles = tile_products_bf16();
    blas_select(GEMM_OPENBLAS, PRECISION_FP32, err, sizeof err);
    if (!tiles) cr_skip_test("this build's CPU chunk kernels have no bf16 products (AG_NATIVE=OFF?)");
    enum { B = 2, T = 200 };
    static int doc[B * T];
    memset(doc, 0, sizeof doc);
    doc[5] = doc[64] = doc[130] = doc[T + 100] = 1;
    check_against_cpu(B, T, 64, REG_PLAIN, true, doc, 880);
    check_against_cpu(1, 130, 128, REG_G_ZERO, true, NULL, 881);
    check_against_cpu(2, 63, 64, REG_BETA_1, false, NULL, 882);
}

// The node keeps the forward's precision: a backward after bf16 was turned
// off rounds as its forward did, so its gradients are those of a run with
// bf16 on throughout, to the bit.
Test(cuda_gdn_bf16, backward_follows_its_forward) {
    cuda_require();
    Tensor *x[N_IN];
    gdn_test_inputs(x, 1, 100, 2, 64, 64, REG_PLAIN, true, true, 870);
    GdnCtx c = {2, 64, MIXER_FORM_CHUNKED, NULL, 3};
    Run h = gpu_run(gdn_test_op, x, N_IN, &c, true);
    Tape tp;
    tape_init_on(&tp, DEVICE_CUDA);
    Tensor *xs[N_IN], *outs[2];
    for (int i = 0; i < N_IN; i++) {
        xs[i] = tape_tensor_copy(&tp, x[i]->ndim, x[i]->shape, x[i]->data);
        xs[i]->requires_grad = true;
    }
    device_set_bf16(DEVICE_CUDA, true);
    cr_assert_eq(gdn_test_op(&tp, xs, N_IN, &c, outs), 2);
    device_set_bf16(DEVICE_CUDA, false);   // between forward and backward
    real *seeds[2] = {test_randn(outs[0]->numel, 7), test_randn(outs[1]->numel, 8)};
    tape_backward_multi(&tp, outs, (const real *const *)seeds, 2);
    for (int i = 0; i < N_IN; i++) {
        real *g = malloc((size_t)x[i]->numel * sizeof(real));
        dev_to_host(g, xs[i]->grad, (size_t)x[i]->numel * sizeof(real), DEVICE_CUDA);
        dev_sync(DEVICE_CUDA);
        cr_assert(memcmp(g, h.grad[i], (size_t)x[i]->numel * sizeof(real)) == 0,
                  "%s: bf16 turned off between forward and backward gives other gradients than bf16 throughout",
                  GDN_GRAD_NAMES[i]);
        free(g);
    }
    free(seeds[0]), free(seeds[1]);
    tape_free(&tp);
    run_free(&h);
    gdn_free_inputs(x);
}

// The forward's outputs alone (o, S_T) on an unrecorded tape (no input takes
// a gradient: the node keeps no rows for a backward), bf16 products, host
// copies into o and sT (malloc'ed).
static void forward_only(Tensor *const *x, int n, const GdnCtx *c, real **o, real **sT, int64_t *no, int64_t *ns) {
    Tape tp;
    tape_init_on(&tp, DEVICE_CUDA);
    Tensor *xs[N_IN] = {0}, *outs[2];
    for (int i = 0; i < n; i++) xs[i] = tape_tensor_copy(&tp, x[i]->ndim, x[i]->shape, x[i]->data);
    device_set_bf16(DEVICE_CUDA, true);
    cr_assert_eq(gdn_test_op(&tp, xs, n, (void *)c, outs), 2);
    device_set_bf16(DEVICE_CUDA, false);
    *no = outs[0]->numel, *ns = outs[1]->numel;
    *o = malloc((size_t)*no * sizeof(real)), *sT = malloc((size_t)*ns * sizeof(real));
    dev_to_host(*o, outs[0]->data, (size_t)*no * sizeof(real), DEVICE_CUDA);
    dev_to_host(*sT, outs[1]->data, (size_t)*ns * sizeof(real), DEVICE_CUDA);
    dev_sync(DEVICE_CUDA);
    tape_free(&tp);
}

// gdn_chunk64.cu's kernels (bf16, heads of 64, chunks of at most 64) give
// the general kernels' bits (ATTNLAB_GDN_CHUNK64=off): every output and
// gradient of recorded runs, and the outputs of unrecorded forwards,
// over documents, s0, short chunks (40: a partial step of 16; a chunk of
// 128 on 20 positions: the solve's one-register form) and a short last
// chunk; a backward from S_T's gradient alone (no dO) and from o's alone.
// The default must have taken them (three kernels in a recorded run, two
// in a forward), off none.
Test(cuda_gdn_bf16, chunk64_gives_the_same_bits) {
    cuda_require();
    enum { T = 200 };
    static int doc[2 * T];
    memset(doc, 0, sizeof doc);
    doc[0] = doc[5] = doc[63] = doc[64] = doc[130] = doc[T + 100] = 1;
    static const struct {
        int B, T, H, C;
        bool s0;
        const int *doc;
        int outs;   // GdnCtx.outs of the recorded run
    } cases[] = {{2, T, 2, 64, true, doc, 3},   {1, 300, 2, 40, true, NULL, 3}, {2, 63, 1, 64, false, NULL, 3},
                 {1, 20, 2, 128, true, NULL, 3}, {2, 130, 3, 32, true, NULL, 3}, {1, 150, 2, 64, true, doc, 2},
                 {1, 150, 2, 64, true, NULL, 1}};
    for (size_t cs = 0; cs < sizeof cases / sizeof cases[0]; cs++) {
        Tensor *x[N_IN];
        gdn_test_inputs(x, cases[cs].B, cases[cs].T, cases[cs].H, 64, 64, REG_PLAIN, cases[cs].s0, true, 880 + cs);
        GdnCtx c = {cases[cs].H, cases[cs].C, MIXER_FORM_CHUNKED, cases[cs].doc, cases[cs].outs};
        GdnCtx both = c;
        both.outs = 3;
        int n = cases[cs].s0 ? N_IN : IS0;
        Run r[2];
        real *o[2], *sT[2];
        int64_t no = 0, ns = 0;
        for (int fast = 0; fast < 2; fast++) {
            if (!fast) setenv("ATTNLAB_GDN_CHUNK64", "off", 1);
            int before = cu_gdn_chunk64_launches();
            r[fast] = gpu_run(gdn_test_op, x, n, &c, true);
            forward_only(x, n, &both, &o[fast], &sT[fast], &no, &ns);
            int took = cu_gdn_chunk64_launches() - before;
            unsetenv("ATTNLAB_GDN_CHUNK64");
            cr_assert(fast ? took == 5 : took == 0, "case %zu: ATTNLAB_GDN_CHUNK64=%s launched %d of its kernels", cs,
                      fast ? "(unset)" : "off", took);
        }
        for (int i = 0; i < r[0].n_out; i++)
            cr_assert(memcmp(r[0].out[i], r[1].out[i], (size_t)r[0].n_o[i] * sizeof(real)) == 0,
                      "case %zu: output %d differs from the general kernels'", cs, i);
        for (int i = 0; i < n; i++)
            cr_assert(memcmp(r[0].grad[i], r[1].grad[i], (size_t)r[0].n_g[i] * sizeof(real)) == 0,
                      "case %zu: %s differs from the general kernels'", cs, GDN_GRAD_NAMES[i]);
        bool same = memcmp(o[0], o[1], (size_t)no * sizeof(real)) == 0;
        same = same && memcmp(sT[0], sT[1], (size_t)ns * sizeof(real)) == 0;
        cr_assert(same, "case %zu: an unrecorded forward differs from the general kernels'", cs);
        for (int f = 0; f < 2; f++) run_free(&r[f]), free(o[f]), free(sT[f]);
        gdn_free_inputs(x);
    }
}

// An ATTNLAB_GDN_CHUNK64 other than on or off is refused by name, with the
// values it takes, before any launch.
Test(cuda_gdn_bf16, chunk64_setting_refuses_unknown_values) {
    gdn_expect_setting_refused("ATTNLAB_GDN_CHUNK64", "yes", "on (the default) or off", 64, 64, true);
}

// ---------------------------------------------------------------- 3. Gated DeltaProduct

typedef struct {
    int H, steps, chunk;
} GdpCtx;

enum { PQ, PK, PV, PBETA, PG, PS0, P_IN };
static const char *const GDP_NAMES[P_IN] = {"dq", "dk", "dv", "dbeta", "dg", "ds0"};

static int f_gdp(Tape *tp, Tensor *const *x, int n, void *ctx, Tensor **outs) {
    (void)n;
    const GdpCtx *c = ctx;
    outs[0] = op_gdp(tp, x[PQ], x[PK], x[PV], x[PBETA], x[PG], x[PS0], NULL, c->H, c->steps, MIXER_FORM_CHUNKED,
                     c->chunk, &outs[1]);
    return 2;
}

Test(cuda_gdn_bf16, gated_deltaproduct_close_to_float32) {
    enum { B = 2, T = 90, H = 2, dk = 64, dv = 64 };
    for (int steps = 2; steps <= 3; steps++) {
        Tensor *x[P_IN], *xr[P_IN];
        x[PQ] = tensor_newv(true, 3, B, T, H * dk);
        x[PK] = tensor_newv(true, 3, B, T, steps * H * dk);
        x[PV] = tensor_newv(true, 3, B, T, steps * H * dv);
        x[PBETA] = tensor_newv(true, 3, B, T, steps * H);
        x[PG] = tensor_newv(true, 3, B, T, H);
        x[PS0] = tensor_newv(true, 4, B, H, dk, dv);
        fill_normal(x[PQ], 900 + steps, 1.0);
        fill_normal(x[PK], 910 + steps, 1.0);
        fill_normal(x[PV], 920 + steps, 1.0);
        fill_normal(x[PS0], 930 + steps, 0.5);
        test_l2norm_rows(x[PQ], dk, 1.0 / sqrt(dk));
        test_l2norm_rows(x[PK], dk, 1.0);
        fill_uniform(x[PBETA], 940 + steps, 0.1, 0.9);
        fill_uniform(x[PG], 950 + steps, -1.0, -0.01);
        for (int i = 0; i < P_IN; i++) xr[i] = i == PBETA || i == PG ? x[i] : rounded(x[i]);
        GdpCtx c = {H, steps, 64};
        Run h = gpu_run(f_gdp, x, P_IN, &c, true), f = gpu_run(f_gdp, x, P_IN, &c, false);
        Run d = gpu_run(f_gdp, xr, P_IN, &c, false);
        char label[64];
        snprintf(label, sizeof label, "gdp bf16 steps=%d B=%d T=%d H=%d dk=dv=%d", steps, B, T, H, dk);
        compare_runs(label, &h, &f, &d, GDP_NAMES);
        run_free(&h), run_free(&f), run_free(&d);
        for (int i = 0; i < P_IN; i++) {
            if (xr[i] != x[i]) tensor_free(xr[i]);
            tensor_free(x[i]);
        }
    }
}

#else
// The float64 build has no bf16 products: op_gdn's node records none.
Test(cuda_gdn_bf16, float64_build_keeps_float64) {
    cuda_require();
    Tensor *x[N_IN];
    gdn_test_inputs(x, 1, 20, 1, 16, 16, REG_PLAIN, true, false, 990);
    Tape tp;
    tape_init_on(&tp, DEVICE_CUDA);
    Tensor *xs[N_IN], *outs[2];
    for (int i = 0; i < N_IN; i++) xs[i] = tape_tensor_copy(&tp, x[i]->ndim, x[i]->shape, x[i]->data);
    GdnCtx c = {1, 16, MIXER_FORM_CHUNKED, NULL, 3};
    for (int i = 0; i < N_IN; i++) xs[i]->requires_grad = true;   // a recorded node
    cr_assert_eq(gdn_test_op(&tp, xs, N_IN, &c, outs), 2);
    dev_sync(DEVICE_CUDA);
    cr_assert_eq(test_only_node(&tp, "gdn_chunked")->iarg[GDN_ARG_BF16], 0, "the float64 build's gdn node says bf16");
    tape_free(&tp);
    gdn_free_inputs(x);
}
#endif

// A training step with bf16 products (blas.h, [train] precision = bf16)
// against the float32 step: the loss and every gradient. Each bf16 product
// is tested against the product of bf16-rounded operands in
// test_blas_backend.c; a whole step cannot be: rounding to bf16 is a step
// function, and an activation that differs in the last float32 bit (another
// summation order) can round to the neighbouring bf16 number, so two exact
// implementations of bf16 products differ by a fraction of bf16's own error
// after a few layers (measured 0.4% on the gradients here, against 2.5% from
// float32). Float32 builds on a CPU with AVX512_BF16 only (skipped elsewhere).
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "blas.h"
#include "lm.h"
#include "test_util.h"

#ifndef AG_DOUBLE
enum { B = 4, T = 128 };

typedef struct Step {
    double loss;
    real **grads;   // one per parameter, in ParamStore order
} Step;

typedef struct Model {
    LM lm;
    ParamStore ps;
    int x[B * T], y[B * T];
} Model;

// Every mixer kind, wide enough that the projections are real products
// (gemm_rows / gemm_sum_rows; the narrow dt and beta ones stay float32), on
// text and its next bytes as in training (random targets would make every
// gradient a sum of terms that cancel).
static void model_make(Model *m, const char *layers) {
    LMConfig c = test_bf16_lm_config(layers);
    params_init(&m->ps);
    lm_create(&m->lm, &c, &m->ps);
    params_finalize(&m->ps, 5);
    static const char text[] = "In the beginning God created the heaven and the earth. And the earth was "
                               "without form, and void; and darkness was upon the face of the deep. ";
    int n = (int)strlen(text);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            m->x[b * T + t] = (unsigned char)text[(b * 37 + t) % n];
            m->y[b * T + t] = (unsigned char)text[(b * 37 + t + 1) % n];
        }
}

static void model_free(Model *m) {
    lm_destroy(&m->lm);
    params_free(&m->ps);
}

// One forward and backward with the products at prec.
static Step step(Model *m, GemmPrecision prec) {
    char err[256];
    cr_assert(blas_select(GEMM_ONEDNN, prec, err, sizeof err), "%s", err);
    Tape tp;
    tape_init(&tp);
    params_zero_grad(&m->ps);
    Tensor *loss = lm_loss(&tp, &m->lm, m->x, m->y, B, T, NULL);
    tape_backward(&tp, loss);
    Step st = {loss->data[0], xcalloc((size_t)m->ps.n, sizeof(real *))};
    for (int i = 0; i < m->ps.n; i++) {
        Tensor *p = m->ps.params[i];
        st.grads[i] = xmalloc((size_t)p->numel * sizeof(real));
        memcpy(st.grads[i], p->grad, (size_t)p->numel * sizeof(real));
    }
    tape_free(&tp);
    return st;
}

static void step_free(Step *st, int n) {
    for (int i = 0; i < n; i++) free(st->grads[i]);
    free(st->grads);
}

static bool bf16_here(void) { return onednn_built() && onednn_has_bf16(); }
#endif

// Against plain float32. Rounding an operand to bf16 moves it by up to 2^-8
// relative; a product's output moves by ~2^-9 of its terms' size, and the loss
// (a mean over B T = 512 cross-entropies whose errors do not line up) far
// less: measured 1e-4 relative, allowed 2e-3. Gradients: all of them together,
// normwise (the largest dominate: embedding, projections, MLP): measured 2.5%,
// allowed 6%. Each weight matrix (>= 1024 elements) must point the same way:
// cosine >= 0.99 (measured >= 0.9995). A parameter of a few elements (per-head
// decay and dt biases, A_log) is not checked on its own: its gradient is a
// sum over every position whose terms nearly cancel at this point of
// training, and moves by up to 40% of itself with the products' rounding,
// as it would in any bf16 training.
#define BF16_LOSS_TOL 2e-3
#define BF16_GRAD_TOL 6e-2
#define BF16_COSINE_MIN 0.99
#define BF16_WEIGHT_MOVE 0x1p-8
#define BF16_SENSITIVITY_FACTOR 2.0

#ifndef AG_DOUBLE
// h's gradients against f's: every weight of >= 1024 elements must point the
// same way (cosine >= BF16_COSINE_MIN); returns all gradients' largest
// difference over their largest magnitude (normwise) and logs the worst.
static double grads_normwise(const Model *m, const Step *f, const Step *h, const char *what) {
    double max_diff = 0, max_abs = 0, worst_cos = 1;
    const char *worst = "";
    for (int i = 0; i < m->ps.n; i++) {
        const Tensor *p = m->ps.params[i];
        double dot = 0, nf = 0, nh = 0;
        for (int64_t j = 0; j < p->numel; j++) {
            double a = f->grads[i][j], b = h->grads[i][j];
            max_diff = fmax(max_diff, fabs(a - b));
            max_abs = fmax(max_abs, fmax(fabs(a), fabs(b)));
            dot += a * b, nf += a * a, nh += b * b;
        }
        double cosv = dot / sqrt(nf * nh);
        if (p->numel >= 1024) {
            cr_assert_geq(cosv, BF16_COSINE_MIN, "%s: gradient of %s: cosine %.5f", what, p->name, cosv);
            if (cosv < worst_cos) worst_cos = cosv, worst = p->name;
        }
    }
    double dg = max_diff / max_abs;
    cr_log_info("%s: gradients %.3g normwise, worst cosine %.5f (%s)", what, dg, worst_cos, worst);
    return dg;
}

// The bf16 step of `layers` against its float32 step: the loss within
// BF16_LOSS_TOL and not equal; returns the gradients' normwise difference.
static double bf16_vs_fp32(Model *m, const char *layers, double *sensitivity) {
    Step f = step(m, PRECISION_FP32), h = step(m, PRECISION_BF16);
    double dl = fabs(h.loss - f.loss) / fabs(f.loss);
    cr_assert_leq(dl, BF16_LOSS_TOL, "%s: loss fp32 %.8f vs bf16 %.8f: relative %.3g", layers, f.loss, h.loss, dl);
    cr_assert_gt(dl, 0, "%s: the bf16 loss equals the float32 one exactly: were the products bf16?", layers);
    double dg = grads_normwise(m, &f, &h, "fp32 vs bf16");
    if (sensitivity) {   // float32 again, the weights moved by a bf16 rounding's size
        test_perturb_params(&m->ps, BF16_WEIGHT_MOVE, 7);
        Step p = step(m, PRECISION_FP32);
        *sensitivity = grads_normwise(m, &f, &p, "fp32 vs fp32 with weights moved");
        step_free(&p, m->ps.n);
    }
    step_free(&f, m->ps.n);
    step_free(&h, m->ps.n);
    return dg;
}
#endif

Test(bf16_step, loss_and_gradients_close_to_float32) {
#ifdef AG_DOUBLE
    cr_skip_test("bf16 products are float32 builds only");
#else
    if (!bf16_here()) cr_skip_test("this CPU has no AVX512_BF16 (or no oneDNN)");
    Model m;
    model_make(&m, "gdn,mamba,attn,linear");
    double dg = bf16_vs_fp32(&m, "gdn,mamba,attn,linear", NULL);
    cr_assert_leq(dg, BF16_GRAD_TOL, "all gradients, normwise: fp32 vs bf16 %.3g", dg);
    model_free(&m);
#endif
}

// The newer mixers (KDA, Gated DeltaProduct, Mamba-2's own layer) stacked
// are more sensitive at this point of training: moving the weights alone by
// +-2^-8 relative (BF16_WEIGHT_MOVE; rounding to bf16 moves a weight by up to
// 2^-9 and every product's activations as well) changes the float32
// gradients by 9.5 % normwise (the first layer's q and k projections and the
// embedding: a delta rule's L2-normalised keys after a layer whose output
// nearly cancels), and bf16 changes them by 12 %. So the bound here is the
// model's own sensitivity: bf16's difference at most BF16_SENSITIVITY_FACTOR
// times the float32 difference of moved weights (a missing or misplaced
// rounding, or a wrong bf16 kernel, is far outside it), plus the loss and
// the per-weight cosines as above.
Test(bf16_step, newer_mixers_within_float32_sensitivity) {
#ifdef AG_DOUBLE
    cr_skip_test("bf16 products are float32 builds only");
#else
    if (!bf16_here()) cr_skip_test("this CPU has no AVX512_BF16 (or no oneDNN)");
    Model m;
    model_make(&m, "kda,gdp,mamba2");
    double sens;
    double dg = bf16_vs_fp32(&m, "kda,gdp,mamba2", &sens);
    cr_assert_leq(dg, BF16_SENSITIVITY_FACTOR * sens,
                  "kda,gdp,mamba2: fp32 vs bf16 %.3g normwise, over %.1f x the float32 sensitivity %.3g", dg,
                  BF16_SENSITIVITY_FACTOR, sens);
    model_free(&m);
#endif
}

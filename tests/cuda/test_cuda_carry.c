// test_cuda_carry.c: state carried across windows ([train] carry_state) on
// the GPU against the CPU: consecutive windows of every recurrent mixer kind
// (and an attention layer beside them) through lm_loss_carry with AdamW steps
// between them (losses, the first step's gradients, the carried states left
// at the end), and the trainer's carry_state run on the GPU: its losses equal
// the CPU run's, its checkpoint's carried states too, and a run stopped and
// resumed on the GPU repeats the straight run bit for bit.
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "checkpoint.h"
#include "cuda_check.h"
#include "lm.h"
#include "trainer.h"

#define B_ 2
#define T_ 19   // windows not a multiple of the chunk
#define STEPS 3

typedef struct {
    LMCache *carry;
    int tokens[STEPS][B_ * T_], targets[STEPS][B_ * T_], ds[STEPS][B_ * T_];
} CarryData;

// Window s of each row continues the row's stream; row 1 begins a document
// inside window 1.
static void carry_data(CarryData *x) {
    for (int s = 0; s < STEPS; s++)
        for (int i = 0; i < B_ * T_; i++) {
            x->tokens[s][i] = (s * 131 + i * 37 + 11) % 97;
            x->targets[s][i] = (s * 71 + i * 53 + 5) % 97;
            x->ds[s][i] = s == 1 && i == T_ + 7;
        }
}

static Tensor *carry_loss(Tape *tp, LM *lm, int step, void *ctx) {
    CarryData *x = ctx;
    return lm_loss_carry(tp, lm, x->tokens[step], x->targets[step], x->ds[step], B_, T_, x->carry, NULL);
}

typedef struct {
    double loss[STEPS];
    real *grad;      // the first step's gradient block (host)
    int64_t n_grad;
    double *state;   // every carried buffer after the last window, back to back (host)
    int64_t n_state;
} CarryRun;

static void carry_run(Device d, const char *layers, CarryRun *r) {
    LMConfig cfg = cuda_small_lm_config(layers);
    ParamStore ps;
    params_init(&ps);
    LM lm;
    lm_create(&lm, &cfg, &ps);
    params_finalize(&ps, 7);
    if (d != DEVICE_CPU) params_to_device(&ps, d);
    static CarryData x;
    carry_data(&x);
    x.carry = lm_cache_new_on(&lm, B_, 1, d);
    cuda_train_steps(&lm, &ps, d, STEPS, carry_loss, &x, r->loss, &r->grad);
    r->n_grad = ps.numel;
    real *bufs[64];
    int64_t sizes[64];
    int n = lm_carry_buffers(&lm, x.carry, bufs, sizes, 64);
    r->n_state = 0;
    for (int i = 0; i < n; i++) r->n_state += sizes[i];
    r->state = malloc((size_t)r->n_state * sizeof(double));
    for (int64_t i = 0, at = 0; i < n; at += sizes[i], i++) {
        real *h = malloc((size_t)sizes[i] * sizeof(real));
        dev_to_host(h, bufs[i], (size_t)sizes[i] * sizeof(real), d);
        for (int64_t j = 0; j < sizes[i]; j++) r->state[at + j] = h[j];
        free(h);
    }
    lm_cache_free(&lm, x.carry);
    lm_destroy(&lm);
    params_free(&ps);
}

// sqrt(sum (a - b)^2 / sum a^2); a must not be all zero.
static double rel_norm(const double *a, const double *b, int64_t n, const char *what) {
    double d2 = 0, n2 = 0;
    for (int64_t i = 0; i < n; i++) d2 += (a[i] - b[i]) * (a[i] - b[i]), n2 += a[i] * a[i];
    cr_assert(n2 > 0, "%s: all zero", what);
    return sqrt(d2 / n2);
}

static void compare_carry(const char *layers) {
    cuda_require();
    CarryRun c, g;
    carry_run(DEVICE_CPU, layers, &c);
    carry_run(DEVICE_CUDA, layers, &g);
    for (int s = 0; s < STEPS; s++)
        cr_assert(fabs(c.loss[s] - g.loss[s]) <= FORM_TOL * fabs(c.loss[s]),
                  "%s: window %d loss %.10g on the CPU, %.10g on the GPU", layers, s, c.loss[s], g.loss[s]);
    cr_assert(c.n_grad == g.n_grad && c.n_state == g.n_state);
    double e = max_rel_diff(c.grad, g.grad, c.n_grad);
    cr_assert(e <= FORM_TOL, "%s: the first window's gradients differ by %.3e", layers, e);
    e = rel_norm(c.state, g.state, c.n_state, layers);
    cr_assert(e <= FORM_TOL, "%s: the carried states after %d windows differ by %.3e normwise", layers, STEPS, e);
    free(c.state), free(g.state);
    free(c.grad), free(g.grad);
}

Test(cuda_carry, linear) { compare_carry("linear,linear"); }
Test(cuda_carry, mamba) { compare_carry("mamba,mamba"); }
Test(cuda_carry, mamba2) { compare_carry("mamba2,mamba2"); }
Test(cuda_carry, gdn) { compare_carry("gdn,gdn"); }
Test(cuda_carry, gdp) { compare_carry("gdp,gdp"); }
Test(cuda_carry, kda) { compare_carry("kda,kda"); }
Test(cuda_carry, hybrid_with_attention) { compare_carry("gdn,attn,mamba,linear"); }

// The trainer: carry_state = true on the GPU. Its losses equal the CPU run's
// (FORM_TOL, after AdamW steps), so do the checkpoint's carried states; a GPU
// run stopped after 2 steps and resumed (the carry read back from the
// checkpoint into device memory) repeats the straight GPU run bit for bit in
// float32 (float64: checkpoints hold float32 parameters, docs/checkpoint.md).
Test(cuda_carry, trainer_carry_state_on_the_gpu, .timeout = 240) {
    cuda_require();
    enum { N = 4 };
    const char *cfg = test_tiny_config("cudacarry", "gdn,attn,mamba", N, NULL,
                                       "carry_state = true\n[data]\norder = streams\n");
    static Trainer t;
    double loss[2][N];
    int64_t row = 0;
    double *carry[2] = {NULL, NULL};
    const char *on_gpu[] = {"train.device=cuda"};
    for (int dev = 0; dev < 2; dev++) {
        TrainerOptions o = {.config = cfg, .quiet = true, .overwrite = true, .sets = dev ? on_gpu : NULL,
                            .n_sets = dev};
        Status s = trainer_setup(&t, &o);
        cr_assert(s.ok, "%s", s.msg);
        cr_assert(t.carry && t.carry->device == (dev ? DEVICE_CUDA : DEVICE_CPU));
        cr_assert_eq(trainer_run(&t, &o), 0);
        for (int i = 0; i < N; i++) loss[dev][i] = trainer_loss(&t, i);
        row = trainer_carry_row(&t);
        carry[dev] = calloc((size_t)3 * row, sizeof(double));
        s = checkpoint_load_carry(t.ckpt, carry[dev], 3, row);
        cr_assert(s.ok, "%s", s.msg);
        trainer_free(&t);
    }
    for (int i = 0; i < N; i++)
        cr_assert(fabs(loss[0][i] - loss[1][i]) <= FORM_TOL * fabs(loss[0][i]), "step %d: CPU %.10g, GPU %.10g",
                  i + 1, loss[0][i], loss[1][i]);
    double e = rel_norm(carry[0], carry[1], 3 * row, "the CPU run's carried states");
    cr_assert(e <= FORM_TOL, "the checkpoints' carried states differ by %.3e normwise", e);
    free(carry[0]), free(carry[1]);
    // Stopped after 2 steps on the GPU, resumed there.
    TrainerOptions o = {.config = cfg, .quiet = true, .overwrite = true, .sets = on_gpu, .n_sets = 1, .stop_after = 2};
    Status s = trainer_setup(&t, &o);
    cr_assert(s.ok, "%s", s.msg);
    cr_assert_eq(trainer_run(&t, &o), 130);
    trainer_free(&t);
    TrainerOptions r = {.config = cfg, .quiet = true, .resume = true, .sets = on_gpu, .n_sets = 1};
    s = trainer_setup(&t, &r);
    cr_assert(s.ok, "%s", s.msg);
    cr_assert_eq(t.step, 2);
    cr_assert_eq(trainer_run(&t, &r), 0);
    double resumed[N];
    for (int i = 2; i < N; i++) resumed[i] = trainer_loss(&t, i);
    test_assert_resumed_losses(resumed, loss[1], 2, N);
    trainer_free(&t);
}

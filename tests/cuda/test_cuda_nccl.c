// test_cuda_nccl.c: the GPU ranks' gradient reduction (dist_grads_new_nccl,
// train/dist_nccl.c) over a communicator of one, on one GPU. A sum over one
// rank is the identity, so the path must give the single GPU's bits exactly:
// the buckets are scaled by the same kernel as optim_scale_grads, then
// copied out and back by NCCL on its own stream, ordered after the backward
// by an event. A bucket reduced before its gradient was complete, or a step
// that ran before the copies back, would change the bits. Built only with
// NCCL (AG_NCCL); two GPUs are what mpirun -np 2 train ... shows (docs/cuda.md).
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "cuda_check.h"
#include "dist.h"
#include "lm.h"
#include "trainer.h"

#define B_ 2
#define T_ 16
#define ACCUM 2
#define STEPS 3

static Tensor *micro_loss(Tape *tp, LM *lm, int step, int a) {
    int x[B_ * T_], y[B_ * T_];
    for (int i = 0; i < B_ * T_; i++) {
        x[i] = (step * 131 + a * 17 + i * 37 + 11) % 61;
        y[i] = (step * 71 + a * 29 + i * 53 + 5) % 61;
    }
    return lm_loss_docs(tp, lm, x, y, NULL, B_, T_, NULL);
}

typedef struct {
    LM lm;
    ParamStore ps;
    Optimizer opt;
    Tape tp;
} Model;

static void model_new(Model *m, const char *layers) {
    LMConfig cfg = test_tiny_lm_config(layers);
    cfg.vocab_size = 61;
    Status s = lm_parse_layers(&cfg, layers);
    cr_assert(s.ok, "%s", s.msg);
    params_init(&m->ps);
    lm_create(&m->lm, &cfg, &m->ps);
    params_finalize(&m->ps, 11);
    params_to_device(&m->ps, DEVICE_CUDA);
    adamw_init(&m->opt, &m->ps, 0.9, 0.95, 1e-8, 0.1);
    optim_to_device(&m->opt, DEVICE_CUDA);
    tape_init_on(&m->tp, DEVICE_CUDA);
}

static void model_free(Model *m) {
    tape_free(&m->tp);
    optim_free(&m->opt);
    lm_destroy(&m->lm);
    params_free(&m->ps);
}

static real *grads_on_host(const ParamStore *ps) {
    real *h = malloc((size_t)ps->numel * sizeof(real));
    dev_to_host(h, ps->grad, (size_t)ps->numel * sizeof(real), DEVICE_CUDA);
    return h;
}

// Bit-for-bit, or the first element that differs, with its parameter.
static void assert_same_bits(const ParamStore *ps, const real *a, const real *b, const char *what, int step) {
    for (int64_t e = 0; e < ps->numel; e++) {
        if (!memcmp(&a[e], &b[e], sizeof(real))) continue;
        int p = 0;
        while (p + 1 < ps->n && ps->offsets[p + 1] <= e) p++;
        cr_assert(false, "step %d: %s differ first at flat element %lld (parameter '%s' [%lld]): %.17g plain, %.17g "
                         "through NCCL",
                  step, what, (long long)e, ps->params[p]->name, (long long)(e - ps->offsets[p]), (double)a[e],
                  (double)b[e]);
    }
}

// STEPS AdamW steps of ACCUM micro-batches on two copies of one model: the
// single GPU's way (scale by 1 / ACCUM, clip, update) and the GPU ranks' way
// through a communicator of one with small buckets (the last micro-batch's
// backward starts them; clipping from the summed squares). The gradients
// after each reduction and the parameters after each update are the same bits.
static void compare_steps(const char *layers, size_t bucket_bytes) {
    cuda_require();
    Model a, b;
    model_new(&a, layers);
    model_new(&b, layers);
    char err[400];
    DistGrads *g = dist_grads_new_nccl(&b.ps, bucket_bytes, err, sizeof err);
    cr_assert(g, "dist_grads_new_nccl: %s", err);
    int64_t lo, hi;
    dist_grads_slice(g, &lo, &hi);
    cr_assert(lo == 0 && hi == b.ps.numel, "a communicator of one owns [0, %lld), not [%lld, %lld)",
              (long long)b.ps.numel, (long long)lo, (long long)hi);
    const double clip = 0.05;   // (small: the clipping scale runs on every step)
    for (int s = 0; s < STEPS; s++) {
        params_zero_grad(&a.ps);
        params_zero_grad(&b.ps);
        for (int k = 0; k < ACCUM; k++) {
            Tensor *la = micro_loss(&a.tp, &a.lm, s, k);
            tape_backward(&a.tp, la);
            tape_reset(&a.tp);
            Tensor *lb = micro_loss(&b.tp, &b.lm, s, k);
            if (k == ACCUM - 1) dist_grads_arm(g, &b.tp, 1.0 / ACCUM);
            tape_backward(&b.tp, lb);
            if (k == ACCUM - 1) dist_grads_flush(g);
            tape_reset(&b.tp);
        }
        optim_scale_grads(&a.ps, 1.0 / ACCUM);
        dist_grads_wait(g);
        real *ga = grads_on_host(&a.ps), *gb = grads_on_host(&b.ps);
        assert_same_bits(&a.ps, ga, gb, "the gradients", s);
        free(ga), free(gb);
        double na = optim_clip_grad_norm(&a.ps, clip);
        double nb = sqrt(optim_grad_sumsq(&b.ps, lo, hi));
        cr_assert(na == nb, "step %d: gradient norm %.17g plain, %.17g through NCCL", s, na, nb);
        cr_assert(nb > clip, "step %d: the norm %.3g does not reach the clip %.3g: nothing would be clipped", s, nb,
                  clip);
        optim_scale_grads(&b.ps, clip / (nb + 1e-6));
        optim_step(&a.opt, &a.ps, 3e-3);
        optim_step(&b.opt, &b.ps, 3e-3);
        real *pa = malloc((size_t)a.ps.numel * sizeof(real)), *pb = malloc((size_t)b.ps.numel * sizeof(real));
        memcpy(pa, params_pull(&a.ps), (size_t)a.ps.numel * sizeof(real));
        memcpy(pb, params_pull(&b.ps), (size_t)b.ps.numel * sizeof(real));
        assert_same_bits(&a.ps, pa, pb, "the parameters after the update", s);
        free(pa), free(pb);
    }
    DistStats st = dist_grads_stats(g);
    cr_assert_eq(st.steps, STEPS);
    cr_assert(st.n_buckets >= 4, "%d buckets of %zu bytes: the test wants several", st.n_buckets, bucket_bytes);
    cr_assert(st.started_in_backward > 0, "no bucket was started by the backward's hook (%d buckets, %d steps)",
              st.n_buckets, STEPS);
    cr_assert_eq(st.bytes, (int64_t)params_count(&b.ps, true) * (int64_t)sizeof(real));
    dist_grads_free(g);
    model_free(&a);
    model_free(&b);
}

// The gradients are scaled before the copies, so a bucket whose reduction ran
// ahead of the scaling (or of the backward) shows here. Buckets of 64
// elements: the tiny model's 1,792 make ~20 in either precision, small
// parameters sharing one (4,096 bytes gave float32 only 2).
Test(cuda_nccl, one_rank_equals_one_gpu_hybrid, .timeout = 120) { compare_steps("gdn,attn", 64 * sizeof(real)); }
Test(cuda_nccl, one_rank_equals_one_gpu_mamba_one_bucket_per_parameter, .timeout = 120) {
    compare_steps("mamba,linear", sizeof(real));   // every parameter a bucket of its own
}

// The trainer's path: [train] device = cuda with TrainerOptions.nccl_one (the
// GPU ranks' setup, train_step's reduced branch, the checkpoint's parameter
// check) against the plain single-GPU run: the same losses, bit for bit.
Test(cuda_nccl, trainer_one_rank_equals_one_gpu, .timeout = 240) {
    cuda_require();
    enum { N = 4 };
    const char *cfg = test_tiny_config("cudanccl", "gdn,attn", N, NULL,
                                       "device = cuda\naccum_steps = 2\ngrad_clip = 0.05\ndist_bucket_kb = 1\n");
    static Trainer t;
    double loss[2][N];
    real *params[2];
    int64_t numel = 0;
    for (int k = 0; k < 2; k++) {
        TrainerOptions o = {.config = cfg, .quiet = true, .overwrite = true, .nccl_one = k == 1};
        Status s = trainer_setup(&t, &o);
        cr_assert(s.ok, "%s", s.msg);
        cr_assert((t.dg != NULL) == (k == 1), "run %d: the reduction is %s", k, t.dg ? "there" : "missing");
        cr_assert_eq(trainer_run(&t, &o), 0);
        for (int i = 0; i < N; i++) loss[k][i] = trainer_loss(&t, i);
        numel = t.ps.numel;
        params[k] = malloc((size_t)numel * sizeof(real));
        memcpy(params[k], params_pull(&t.ps), (size_t)numel * sizeof(real));
        if (k == 1) {
            DistStats st = dist_grads_stats(t.dg);
            cr_assert_eq(st.steps, N);
            cr_assert(st.n_buckets >= 2, "%d buckets", st.n_buckets);
        }
        trainer_free(&t);
    }
    for (int i = 0; i < N; i++)
        cr_assert(!memcmp(&loss[0][i], &loss[1][i], sizeof(double)), "step %d: loss %.17g on one GPU, %.17g through a "
                                                                    "communicator of one",
                  i + 1, loss[0][i], loss[1][i]);
    for (int64_t e = 0; e < numel; e++)
        cr_assert(!memcmp(&params[0][e], &params[1][e], sizeof(real)),
                  "the final parameters differ first at flat element %lld: %.17g, %.17g", (long long)e,
                  (double)params[0][e], (double)params[1][e]);
    free(params[0]), free(params[1]);
}

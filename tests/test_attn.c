// Causal softmax attention: the flash kernel against finite differences and
// against the naive reference, at sequence lengths that are not multiples of
// the tiles; then the `attn` mixer (gradients, decoding).
#include <math.h>
#include <omp.h>
#include <string.h>

#include "attn_kernel.h"
#include "cuda_ops.h"   // cu_attn_decode (AG_CUDA builds)
#include "test_util.h"

typedef struct {
    int H;
    double scale;
    int tq, tk;     // tile sizes; 0 = the naive reference
} AttnCtx;

static int f_attn(Tape *tp, Tensor *const *in, int n, void *ctx, Tensor **out) {
    AttnCtx *c = ctx;
    out[0] = c->tq ? op_attention_tiled(tp, in[0], in[1], in[2], c->H, c->scale, NULL, c->tq, c->tk)
                   : op_attention_naive(tp, in[0], in[1], in[2], c->H, c->scale);
    return 1;
}

typedef struct {
    Tensor *q, *k, *v;
} QKV;

static QKV qkv_new(int B, int T, int H, int dk, int dv, uint64_t seed, double qk_std) {
    QKV x = {tensor_newv(true, 3, B, T, H * dk), tensor_newv(true, 3, B, T, H * dk),
             tensor_newv(true, 3, B, T, H * dv)};
    fill_normal(x.q, seed, qk_std);
    fill_normal(x.k, seed + 1, qk_std);
    fill_normal(x.v, seed + 2, 1.0);
    return x;
}

static void qkv_free(QKV *x) {
    tensor_free(x->q);
    tensor_free(x->k);
    tensor_free(x->v);
}

// Forward + backward seeded with a fixed random dO; copies o, dq, dk, dv out.
typedef struct {
    real *o, *dq, *dk, *dv;
} AttnRun;

// Forward and backward (dO drawn from seed) on device_default() (AG_DEVICE=cuda: the GPU).
static AttnRun attn_run(QKV *x, AttnCtx *c, uint64_t seed) {
    AttnRun r;
    Tensor *in[3] = {x->q, x->k, x->v};
    cr_assert_eq(gradcheck_run(f_attn, in, 3, c, seed, &r.o, NULL), 1);
    real **dst[3] = {&r.dq, &r.dk, &r.dv};
    for (int i = 0; i < 3; i++) {
        *dst[i] = xmalloc((size_t)in[i]->numel * sizeof(real));
        memcpy(*dst[i], in[i]->grad, (size_t)in[i]->numel * sizeof(real));
    }
    return r;
}

static void attn_run_free(AttnRun *r) {
    free(r->o);
    free(r->dq);
    free(r->dk);
    free(r->dv);
}

Test(attn_kernel, flash_gradcheck_multi_tile) {
    // T = 13 with tiles 4 x 4 (aligned), 4 x 3 and 5 x 2 (query and key
    // tiles cut the diagonal at different places), and 16 x 16 (one tile).
    // In float64 the step is 1e-5, not 1e-6: at 1e-6 the rounding of the
    // checked scalar (~1e-15 / eps) put the worst element of these inputs at
    // 7e-7 rel on average and above the 1e-6 tolerance for 1 seed in 5, the
    // naive reference alike (measured over 60 seeds); at 1e-5, 7e-8 on
    // average, worst 2e-7.
    GradcheckOptions opt = gradcheck_defaults();
#ifdef AG_DOUBLE
    opt.eps = 1e-5;
#endif
    int tiles[][2] = {{4, 4}, {4, 3}, {5, 2}, {16, 16}};
    for (int i = 0; i < 4; i++) {
        QKV x = qkv_new(2, 13, 2, 3, 4, 10 + i, 1.0);
        AttnCtx c = {2, 0.7, tiles[i][0], tiles[i][1]};
        GradcheckResult r = gradcheck("attention", f_attn, (Tensor *[]){x.q, x.k, x.v}, 3, &c, &opt);
        ASSERT_GRADCHECK(r, "attention");
        cr_assert_gt(r.n_checked, 3 * 2 * 13 * 6);
        qkv_free(&x);
    }
}

Test(attn_kernel, naive_gradcheck) {
    QKV x = qkv_new(1, 9, 2, 3, 2, 20, 1.0);
    AttnCtx c = {2, 0.5, 0, 0};
    GradcheckResult r = gradcheck("attention_naive", f_attn, (Tensor *[]){x.q, x.k, x.v}, 3, &c, NULL);
    ASSERT_GRADCHECK(r, "attention_naive");
    qkv_free(&x);
}

static void check_flash_vs_naive(int B, int T, int H, int dk, int dv, int tq, int tk, double qk_std,
                                 uint64_t seed, double tol) {
    QKV x = qkv_new(B, T, H, dk, dv, seed, qk_std);
    AttnCtx cf = {H, 1.0 / sqrt(dk), tq, tk}, cn = {H, 1.0 / sqrt(dk), 0, 0};
    AttnRun f = attn_run(&x, &cf, seed + 7), n = attn_run(&x, &cn, seed + 7);
    const char *what[4] = {"o", "dq", "dk", "dv"};
    real *a[4] = {f.o, f.dq, f.dk, f.dv}, *b[4] = {n.o, n.dq, n.dk, n.dv};
    int64_t len[4] = {x.v->numel, x.q->numel, x.k->numel, x.v->numel};
    for (int i = 0; i < 4; i++) {
        if (T == 1 && (i == 1 || i == 2)) continue;   // dq = dk = 0 up to rounding: nothing to compare
        double d = max_rel_diff(a[i], b[i], len[i]);
        cr_assert_leq(d, tol, "T=%d tiles %dx%d qk_std %g: %s flash vs naive rel diff %.3e", T, tq, tk,
                      qk_std, what[i], d);
    }
    attn_run_free(&f);
    attn_run_free(&n);
    qkv_free(&x);
}

Test(attn_kernel, flash_equals_naive) {
    check_flash_vs_naive(2, 13, 2, 3, 4, 4, 4, 1.0, 30, FORM_TOL);
    check_flash_vs_naive(2, 13, 2, 3, 4, 3, 5, 1.0, 31, FORM_TOL);
    check_flash_vs_naive(1, 150, 3, 8, 5, ATTN_TILE_Q, ATTN_TILE_K, 1.0, 32, FORM_TOL);   // default tiles, 3 of them
    check_flash_vs_naive(1, 1, 2, 4, 4, ATTN_TILE_Q, ATTN_TILE_K, 1.0, 33, FORM_TOL);     // T = 1
    // Sharp softmax (scores of order +-40, nearly one-hot rows): the online
    // max keeps it finite. In float32 the scores themselves carry an absolute
    // rounding error of ~1e-5 that moves P by that relative amount, and
    // dS = P (dP - D) cancels where a row is nearly one-hot, which amplifies it
    // in dq (measured 2e-4 against the double-accumulating reference): 1e-3 there.
    check_flash_vs_naive(1, 40, 2, 8, 8, 8, 8, 6.0, 34, FORM_TOL);
}

Test(attn_kernel, rows_of_p_sum_to_one) {
    // v = ones gives o = ones whatever the scores, for every row and tile cut.
    QKV x = qkv_new(2, 21, 2, 4, 3, 40, 3.0);
    for (int64_t i = 0; i < x.v->numel; i++) x.v->data[i] = 1;
    Tape tp;
    tape_init(&tp);
    Tensor *o = op_attention_tiled(&tp, x.q, x.k, x.v, 2, 0.5, NULL, 4, 6);
    double worst = 0;
    for (int64_t i = 0; i < o->numel; i++) worst = fmax(worst, fabs(o->data[i] - 1.0));
    cr_assert_leq(worst, 10 * REAL_EPS * 21, "max |o - 1| = %.3e", worst);
    tape_free(&tp);
    qkv_free(&x);
}

Test(attn_kernel, first_position_copies_v_and_t1) {
    // Row 0 attends only to itself: o_0 = v_0, at any T (here T = 1 and T = 5).
    // On device_default() (AG_DEVICE=cuda: the GPU).
    AttnCtx c = {2, 1.0, 2, 2};
    for (int T = 1; T <= 5; T += 4) {
        QKV x = qkv_new(2, T, 2, 3, 3, 50, 1.0);
        // T = 1: backward seeded on o; T = 5: a forward alone.
        real seed[12];
        for (int i = 0; i < 12; i++) seed[i] = (real)(i - 5);
        real *o;
        cr_assert_eq(gradcheck_run_seeds(f_attn, (Tensor *[]){x.q, x.k, x.v}, 3, &c,
                                         (const real *[]){T == 1 ? seed : NULL}, &o, NULL),
                     1);
        for (int b = 0; b < 2; b++)
            for (int j = 0; j < 6; j++)
                cr_assert_float_eq(o[(int64_t)b * T * 6 + j], x.v->data[(int64_t)b * T * 6 + j], 1e-6);
        if (T == 1) {   // dq = dk = 0 (a softmax over one key is constant), dv = dO
            for (int i = 0; i < 12; i++) {
                cr_assert_float_eq(x.q->grad[i], 0, 1e-5);
                cr_assert_float_eq(x.k->grad[i], 0, 1e-5);
                cr_assert_float_eq(x.v->grad[i], seed[i], 1e-12);
            }
        }
        free(o);
        qkv_free(&x);
    }
}

// The thread count is the CPU kernel's (OpenMP) business. Under
// AG_DEVICE=cuda attn_run runs on the GPU, which the setting does not reach:
// there this checks that two runs of the GPU kernel agree bit for bit.
Test(attn_kernel, backward_same_for_any_thread_count) {
    QKV x = qkv_new(2, 37, 3, 4, 4, 60, 1.0);
    AttnCtx c = {3, 0.5, 8, 8};
    int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    AttnRun a = attn_run(&x, &c, 61);
    omp_set_num_threads(2);
    AttnRun b = attn_run(&x, &c, 61);
    omp_set_num_threads(saved);
    cr_assert_eq(memcmp(a.o, b.o, (size_t)x.v->numel * sizeof(real)), 0);
    cr_assert_eq(memcmp(a.dq, b.dq, (size_t)x.q->numel * sizeof(real)), 0);
    cr_assert_eq(memcmp(a.dk, b.dk, (size_t)x.k->numel * sizeof(real)), 0);
    cr_assert_eq(memcmp(a.dv, b.dv, (size_t)x.v->numel * sizeof(real)), 0);
    attn_run_free(&a);
    attn_run_free(&b);
    qkv_free(&x);
}

Test(attn_kernel, only_requested_gradients) {
    // k and v constants: only dq is produced, and it equals the full run's dq.
    // Both runs on device_default() (AG_DEVICE=cuda: the GPU, where the
    // backward gets no buffers for dk, dv and must skip them). k and v come
    // back from the run as they went in; on the CPU their grad staying NULL
    // also says that the backward allocated none for them.
    QKV x = qkv_new(1, 11, 2, 3, 3, 70, 1.0);
    AttnCtx c = {2, 0.6, 4, 4};
    AttnRun full = attn_run(&x, &c, 71);
    Tensor *k = tensor_newv(false, 3, 1, 11, 6), *v = tensor_newv(false, 3, 1, 11, 6);
    memcpy(k->data, x.k->data, 66 * sizeof(real));
    memcpy(v->data, x.v->data, 66 * sizeof(real));
    real *o;   // seeded with attn_run's dO (normal values from seed 71)
    cr_assert_eq(gradcheck_run(f_attn, (Tensor *[]){x.q, k, v}, 3, &c, 71, &o, NULL), 1);
    cr_assert_leq(max_rel_diff(o, full.o, 66), FORM_TOL);
    cr_assert_leq(max_rel_diff(x.q->grad, full.dq, 66), FORM_TOL);
    cr_assert_null(k->grad);
    cr_assert_null(v->grad);
    free(o);
    tensor_free(k);
    tensor_free(v);
    attn_run_free(&full);
    qkv_free(&x);
}

// On a CPU tape on purpose: what the CPU kernel keeps in the tape's host
// arena (and its per-thread scratch) is a property of that kernel alone.
Test(attn_kernel, keeps_only_output_and_lse) {
    // A recorded forward at T = 512 takes from the tape only o and the lse,
    // plus headers and one scratch slot per thread of two tiles (S and the
    // output accumulator, independent of T): far below one T x T matrix per
    // head (2 MB here).
    int B = 1, T = 512, H = 2, d = 8;
    QKV x = qkv_new(B, T, H, d, d, 90, 1.0);
    Tape tp;
    tape_init(&tp);
    size_t before = tp.arena.total_used;
    Tensor *o = op_attention(&tp, x.q, x.k, x.v, H, 0.3, NULL);
    size_t used = tp.arena.total_used - before;
    size_t want = (size_t)o->numel * sizeof(real) + (size_t)B * H * T * sizeof(real);
    size_t scratch = (size_t)omp_get_max_threads() *
                     (2 * ATTN_TILE_Q * sizeof(double) + (size_t)ATTN_TILE_Q * (ATTN_TILE_K + d) * sizeof(real) + 64);
    cr_assert(used >= want && used < want + scratch + 4096, "arena grew by %zu bytes, o + lse = %zu, scratch <= %zu",
              used, want, scratch);
    tape_backward_from(&tp, o, x.v->data);   // the backward works from that alone
    cr_assert_not_null(x.q->grad);
    tape_free(&tp);
    qkv_free(&x);
}

// The parallel forward (output 0) and the decoding kernel at every cache
// length n = 1..T with the query of position n - 1 (output 1, (T, B, H*dv)):
// attn_decode_forward on a CPU tape, its GPU twin cu_attn_decode (what the
// attn mixer's step calls there) on a GPU tape. in = q, k, v; q_host: q's
// values (the rows are gathered on the host and copied to the tape).
typedef struct {
    int B, T, H, dk, dv;
    double scale;
    const real *q_host;
} DecodeCtx;

static int f_decode(Tape *tp, Tensor *const *in, int n_in, void *ctx, Tensor **out) {
    const DecodeCtx *c = ctx;
    int B = c->B, T = c->T, H = c->H, dk = c->dk, dv = c->dv;
    out[0] = op_attention(tp, in[0], in[1], in[2], H, c->scale, NULL);
    out[1] = tape_tensorv(tp, 3, T, B, H * dv);
    real *qrow = xmalloc((size_t)B * H * dk * sizeof(real));
    for (int n = 1; n <= T; n++) {
        for (int b = 0; b < B; b++)
            memcpy(qrow + b * H * dk, c->q_host + ((int64_t)b * T + n - 1) * H * dk, H * dk * sizeof(real));
        Tensor *q = tape_tensor_copy(tp, 2, (int[]){B, H * dk}, qrow);
        real *got = out[1]->data + (int64_t)(n - 1) * B * H * dv;
#ifdef AG_CUDA
        if (tp->device == DEVICE_CUDA)
            cu_attn_decode(tp, got, q->data, in[1]->data, in[2]->data, B, T, n, NULL, NULL, H, dk, dv, c->scale);
        else
#endif
            attn_decode_forward(got, q->data, in[1]->data, in[2]->data, B, T, n, NULL, H, dk, dv, c->scale);
    }
    free(qrow);
    return 2;
}

Test(attn_kernel, decode_kernel_equals_last_row) {
    // One query over a cache of n keys = the last row of the parallel forward.
    // On device_default() (AG_DEVICE=cuda: the GPU's decoding kernel).
    int B = 2, T = 19, H = 2, dk = 4, dv = 3;
    QKV x = qkv_new(B, T, H, dk, dv, 80, 1.0);
    DecodeCtx c = {B, T, H, dk, dv, 0.5, x.q->data};
    real *out[2];   // a forward alone: no output seeded
    cr_assert_eq(gradcheck_run_seeds(f_decode, (Tensor *[]){x.q, x.k, x.v}, 3, &c, (const real *[]){NULL, NULL}, out,
                                     NULL),
                 2);
    const real *o = out[0];
    for (int n = 1; n <= T; n++) {
        const real *got = out[1] + (int64_t)(n - 1) * B * H * dv;
        for (int b = 0; b < B; b++) {
            const real *want = o + ((int64_t)b * T + n - 1) * H * dv;
            double d = max_rel_diff(got + b * H * dv, want, H * dv);
            cr_assert_leq(d, FORM_TOL, "n=%d b=%d: %.3e", n, b, d);
        }
    }
    free(out[0]);
    free(out[1]);
    qkv_free(&x);
}

// The decoding kernel over long caches: its keys are cut into parts of 256
// (attn_decode.c), merged by their maxima and sums. Caches of 1 to 1100 keys
// (one part, a part and one key, several parts), rows whose document starts
// later (key0: fewer parts than the longest row), head sizes that are not
// whole vectors, and scores large enough that each part's max differs:
// against softmax attention in double over the same keys, and bit for bit
// the same on 1 and 2 threads, and with attn_decode_set_threads (generate).
// Under AG_DEVICE=cuda the GPU's twin (cu_attn_decode, its parts of 256) too.
Test(attn_kernel, decode_kernel_over_parts_equals_softmax_attention) {
    int B = 3, H = 8, dk = 5, dv = 3, max_T = 1100;
    // The longest caches are long enough for attn_decode_set_threads to take effect.
    cr_assert_geq((int64_t)(1100 + 800 + 401) * H, ATTN_DECODE_PAR_KEYS);
    int ldq = H * dk, ldv = H * dv;
    real *q = test_randn((int64_t)B * ldq, 91), *kc = test_randn((int64_t)B * max_T * ldq, 92);
    real *vc = test_randn((int64_t)B * max_T * ldv, 93);
    real *got = xmalloc((size_t)B * ldv * sizeof(real)), *got2 = xmalloc((size_t)B * ldv * sizeof(real));
    const int ns[] = {1, 7, 256, 257, 700, 1100}, k0[] = {0, 300, 699};
    double scale = 2.0;   // scores of several units: the parts' maxima differ
    for (size_t t = 0; t < sizeof ns / sizeof ns[0]; t++) {
        int n = ns[t], key0[3];
        for (int b = 0; b < B; b++) key0[b] = k0[b] < n ? k0[b] : n - 1;
        int saved = omp_get_max_threads();
        omp_set_num_threads(1);
        attn_decode_forward(got, q, kc, vc, B, max_T, n, key0, H, dk, dv, scale);
        omp_set_num_threads(2);
        attn_decode_forward(got2, q, kc, vc, B, max_T, n, key0, H, dk, dv, scale);
        cr_assert(memcmp(got, got2, (size_t)B * ldv * sizeof(real)) == 0, "n=%d: 1 and 2 threads differ", n);
        omp_set_num_threads(1);   // generate's small models: one thread, attention's long caches on two
        attn_decode_set_threads(2);
        attn_decode_forward(got2, q, kc, vc, B, max_T, n, key0, H, dk, dv, scale);
        attn_decode_set_threads(0);
        omp_set_num_threads(saved);
        cr_assert(memcmp(got, got2, (size_t)B * ldv * sizeof(real)) == 0, "n=%d: attn_decode_set_threads(2) differs",
                  n);
        real *res[2] = {got, NULL};   // the CPU's, and under AG_DEVICE=cuda the GPU's twin (cu_attn_decode)
#ifdef AG_CUDA
        if (device_default() == DEVICE_CUDA) {
            Tape gt;
            tape_init_on(&gt, DEVICE_CUDA);
            size_t bq = (size_t)B * ldq * sizeof(real), bk = (size_t)B * max_T * ldq * sizeof(real),
                   bv = (size_t)B * max_T * ldv * sizeof(real), bo = (size_t)B * ldv * sizeof(real);
            real *go = tape_dalloc(&gt, bo);
            cu_attn_decode(&gt, go, test_dev_copy(&gt, q, bq), test_dev_copy(&gt, kc, bk), test_dev_copy(&gt, vc, bv),
                           B, max_T, n, key0, test_dev_copy(&gt, key0, sizeof key0), H, dk, dv, scale);
            res[1] = got2;
            dev_to_host(res[1], go, bo, DEVICE_CUDA);
            tape_free(&gt);
        }
#endif
        for (int b = 0; b < B; b++)
            for (int h = 0; h < H; h++) {
                const real *qh = q + (int64_t)b * ldq + h * dk;
                double mx = -INFINITY, l = 0, want[3] = {0};
                double *sc = xmalloc((size_t)n * sizeof(double));
                for (int j = key0[b]; j < n; j++) {
                    const real *kj = kc + ((int64_t)b * max_T + j) * ldq + h * dk;
                    double d = 0;
                    for (int c = 0; c < dk; c++) d += (double)qh[c] * kj[c];
                    sc[j] = scale * d;
                    mx = fmax(mx, sc[j]);
                }
                for (int j = key0[b]; j < n; j++) {
                    double w = exp(sc[j] - mx);
                    l += w;
                    for (int c = 0; c < dv; c++) want[c] += w * vc[((int64_t)b * max_T + j) * ldv + h * dv + c];
                }
                free(sc);
                for (int c = 0; c < dv; c++)
                    for (int d = 0; d < 2 && res[d]; d++) {
                        double w = want[c] / l, e = fabs(res[d][b * ldv + h * dv + c] - w);
                        cr_assert_leq(e, FORM_TOL * (1 + fabs(w)), "%s, n=%d b=%d h=%d c=%d: %.9g, want %.9g",
                                      d ? "GPU" : "CPU", n, b, h, c, (double)res[d][b * ldv + h * dv + c], w);
                    }
            }
    }
    free(q);
    free(kc);
    free(vc);
    free(got);
    free(got2);
}

// The prefill kernel (attn_prefix_forward): windows of queries whose keys
// are cached with the window's own. Windows of several query and key tiles
// (64), windows after cached keys and rows whose document starts later
// (key0), one-query windows, head sizes that are not whole vectors: each
// query against softmax attention in double over its row's keys key0 .. its
// own slot, and bit for bit the same on 1 and 2 threads. Under AG_DEVICE=cuda
// the GPU's twin (cu_attn_prefix_forward) against the same reference.
Test(attn_kernel, prefix_kernel_equals_softmax_attention) {
    int B = 3, H = 3, dk = 5, dv = 3, max_T = 330;
    int ldq = H * dk, ldv = H * dv;
    real *kc = test_randn((int64_t)B * max_T * ldq, 94), *vc = test_randn((int64_t)B * max_T * ldv, 95);
    real *qall = test_randn((int64_t)B * max_T * ldq, 96);
    const int wins[][2] = {{0, 150}, {37, 100}, {130, 1}, {200, 130}};   // {pos, T0}
    Tape tp;
    tape_init(&tp);
    double scale = 1.5;
    for (size_t w = 0; w < sizeof wins / sizeof wins[0]; w++) {
        int pos = wins[w][0], T0 = wins[w][1], key0[3] = {0, pos < 20 ? pos : 20, pos < 150 ? pos : 150};
        size_t bytes = (size_t)B * T0 * ldv * sizeof(real);
        real *q = qall, *got = xmalloc(bytes), *got2 = xmalloc(bytes);
        int saved = omp_get_max_threads();
        omp_set_num_threads(1);
        attn_prefix_forward(&tp, got, q, kc, vc, B, max_T, pos, T0, key0, H, dk, dv, scale);
        omp_set_num_threads(2);
        attn_prefix_forward(&tp, got2, q, kc, vc, B, max_T, pos, T0, key0, H, dk, dv, scale);
        omp_set_num_threads(saved);
        cr_assert(memcmp(got, got2, bytes) == 0, "pos %d: 1 and 2 threads differ", pos);
        real *res[2] = {got, NULL};   // the CPU's, and under AG_DEVICE=cuda the GPU's twin
#ifdef AG_CUDA
        if (device_default() == DEVICE_CUDA) {
            Tape gt;
            tape_init_on(&gt, DEVICE_CUDA);
            size_t bq = (size_t)B * T0 * ldq * sizeof(real), bk = (size_t)B * max_T * ldq * sizeof(real),
                   bv = (size_t)B * max_T * ldv * sizeof(real);
            real *go = tape_dalloc(&gt, bytes);
            cu_attn_prefix_forward(go, test_dev_copy(&gt, q, bq), test_dev_copy(&gt, kc, bk),
                                   test_dev_copy(&gt, vc, bv), B, max_T, pos, T0, key0,
                                   test_dev_copy(&gt, key0, sizeof key0), H, dk, dv, scale);
            res[1] = got2;   // (equal to got: its buffer is free)
            dev_to_host(res[1], go, bytes, DEVICE_CUDA);
            tape_free(&gt);
        }
#endif
        double *sc = xmalloc((size_t)max_T * sizeof(double));
        for (int b = 0; b < B; b++)
            for (int i = 0; i < T0; i++)
                for (int h = 0; h < H; h++) {
                    const real *qh = q + ((int64_t)b * T0 + i) * ldq + h * dk;
                    double mx = -INFINITY, l = 0, want[3] = {0};
                    for (int j = key0[b]; j <= pos + i; j++) {
                        const real *kj = kc + ((int64_t)b * max_T + j) * ldq + h * dk;
                        double d = 0;
                        for (int c = 0; c < dk; c++) d += (double)qh[c] * kj[c];
                        sc[j] = scale * d;
                        mx = fmax(mx, sc[j]);
                    }
                    for (int j = key0[b]; j <= pos + i; j++) {
                        double e = exp(sc[j] - mx);
                        l += e;
                        for (int c = 0; c < dv; c++) want[c] += e * vc[((int64_t)b * max_T + j) * ldv + h * dv + c];
                    }
                    for (int c = 0; c < dv; c++)
                        for (int d = 0; d < 2 && res[d]; d++) {
                            double x = want[c] / l, g = res[d][((int64_t)b * T0 + i) * ldv + h * dv + c];
                            cr_assert_leq(fabs(g - x), FORM_TOL * (1 + fabs(x)),
                                          "%s, pos %d b=%d i=%d h=%d c=%d: %.9g, want %.9g", d ? "GPU" : "CPU", pos,
                                          b, i, h, c, g, x);
                        }
                }
        free(sc), free(got), free(got2);
        tape_reset(&tp);
    }
    tape_free(&tp);
    free(kc), free(vc), free(qall);
}

Test(attn_kernel, shape_errors_name_the_op) {
    Tape tp;
    tape_init(&tp);
    Tensor *q = tensor_newv(false, 3, 1, 4, 6), *k = tensor_newv(false, 3, 1, 5, 6);
    cr_assert(EXPECT_FAILURE(op_attention(&tp, q, k, q, 2, 1.0, NULL)));
    cr_assert(strstr(ag_last_error(), "attention") && strstr(ag_last_error(), "(1, 5, 6)"), "got: %s",
              ag_last_error());
    tensor_free(q);
    tensor_free(k);
    tape_free(&tp);
}

Test(attn_kernel, heads_must_divide_width) {
    Tape tp;
    tape_init(&tp);
    Tensor *q = tensor_newv(false, 3, 1, 4, 6);
    cr_assert(EXPECT_FAILURE(op_attention(&tp, q, q, q, 4, 1.0, NULL)));
    cr_assert(strstr(ag_last_error(), "heads"), "got: %s", ag_last_error());
    tensor_free(q);
    tape_free(&tp);
}

// ---- the attn mixer ----

#include "mixer.h"

static const char *const PREFIX = "layers.0.mixer.";

static Mixer *attn_mixer_new(ParamStore *ps, int D, int H, int dk, int dv, uint64_t seed) {
    params_init(ps);
    MixerConfig cfg = mixer_config_default(D, H, dk, dv);
    cfg.out_std = 0.3;   // larger than the LM's default so the output is not tiny
    Mixer *m = mixer_create("attn", &cfg, ps, PREFIX);
    params_finalize(ps, seed);
    return m;
}

static Tensor *param(ParamStore *ps, const char *name) {
    char full[64];
    snprintf(full, sizeof full, "%s%s", PREFIX, name);
    Tensor *p = params_find(ps, full);
    cr_assert_not_null(p, "parameter %s", full);
    return p;
}

static int f_layer(Tape *tp, Tensor *const *in, int n, void *ctx, Tensor **out) {
    Mixer *m = ctx;
    out[0] = m->kind->forward(tp, m, in[0], NULL, NULL, NULL);
    return 1;
}

Test(attn_layer, parameters_and_init) {
    ParamStore ps;
    Mixer *m = attn_mixer_new(&ps, 16, 2, 4, 6, 1);
    cr_assert_eq(ps.n, 4);
    int want[4][2] = {{16, 8}, {16, 8}, {16, 12}, {12, 16}};
    const char *names[4] = {"wq", "wk", "wv", "wo"};
    for (int i = 0; i < 4; i++) {
        Tensor *p = param(&ps, names[i]);
        cr_assert(p->ndim == 2 && p->shape[0] == want[i][0] && p->shape[1] == want[i][1], "%s %s", names[i],
                  SHAPE(p));
        double ss = 0;
        for (int64_t j = 0; j < p->numel; j++) ss += (double)p->data[j] * p->data[j];
        double std = sqrt(ss / p->numel), expect = i < 3 ? 0.25 : 0.3;   // 1/sqrt(D), out_std
        cr_assert(std > 0.6 * expect && std < 1.4 * expect, "%s: std %.3f, expected about %.3f", names[i], std,
                  expect);
    }
    cr_assert_not(m->kind->recurrent);
    mixer_destroy(m);
    params_free(&ps);
}

Test(attn_layer, gradcheck_input_and_every_parameter) {
    ParamStore ps;
    Mixer *m = attn_mixer_new(&ps, 8, 2, 4, 3, 2);
    Tensor *u = tensor_newv(true, 3, 2, 7, 8);
    fill_normal(u, 3, 1.0);
    Tensor *in[] = {u, param(&ps, "wq"), param(&ps, "wk"), param(&ps, "wv"), param(&ps, "wo")};
    GradcheckResult r = gradcheck("attn layer", f_layer, in, 5, m, NULL);
    ASSERT_GRADCHECK(r, "attn layer");
    cr_assert_geq(r.n_checked, 2 * 7 * 8 + 2 * 8 * 8 + 8 * 6 + 6 * 8);
    tensor_free(u);
    mixer_destroy(m);
    params_free(&ps);
}

// Token-by-token decoding equals the parallel forward at every position, on
// device_default() (test_mixer_decode_diff). T = 70 > the 64-query tile, so
// the forward runs two tiles. A step past max_T fails (on the CPU, first).
Test(attn_layer, decode_equals_parallel_forward) {
    int B = 2, T = 70, D = 16;
    ParamStore ps;
    Mixer *m = attn_mixer_new(&ps, D, 2, 8, 4, 4);
    Tape ts;
    tape_init(&ts);
    tape_no_grad_push(&ts);
    void *small = m->kind->cache_new(m, B, 1, DEVICE_CPU);
    m->kind->step(&ts, m, small, tape_tensor_zeros(&ts, 3, (int[]){B, 1, D}));
    cr_assert(EXPECT_FAILURE(m->kind->step(&ts, m, small, tape_tensor_zeros(&ts, 3, (int[]){B, 1, D}))),
              "a step past max_T must fail");
    cr_assert(strstr(ag_last_error(), "full"), "got: %s", ag_last_error());
    m->kind->cache_free(small);
    tape_free(&ts);
    Tensor *u = tensor_newv(false, 3, B, T, D);
    fill_normal(u, 5, 1.0);
    int t = -1;
    double d = test_mixer_decode_diff(m, &ps, u, &t);
    cr_assert_leq(d, DECODE_TOL, "position %d: step vs forward rel diff %.3e", t, d);
    tensor_free(u);
    mixer_destroy(m);
    params_free(&ps);
}

// in = u, wv, wo, then wq, wk (read by the layer only): the layer's output
// (ctx: the mixer) and (u Wv) Wo.
static int f_value_projection(Tape *tp, Tensor *const *in, int n, void *ctx, Tensor **out) {
    Mixer *m = ctx;
    out[0] = m->kind->forward(tp, m, in[0], NULL, NULL, NULL);
    out[1] = op_matmul(tp, op_matmul(tp, in[0], in[1], false, false), in[2], false, false);
    cr_assert(tensor_same_shape(out[0], out[1]), "y %s, (u Wv) Wo %s", SHAPE(out[0]), SHAPE(out[1]));
    return 2;
}

Test(attn_layer, single_position_is_value_projection) {
    // T = 1: the only key is the token itself, so y = (u Wv) Wo, RoPE or not.
    // On device_default() (AG_DEVICE=cuda: the GPU): every parameter is an
    // input of the run, so all move there for it.
    int B = 3, D = 8;
    ParamStore ps;
    Mixer *m = attn_mixer_new(&ps, D, 2, 4, 4, 6);
    Tensor *u = tensor_newv(false, 3, B, 1, D);
    fill_normal(u, 7, 1.0);
    Tensor *in[] = {u, param(&ps, "wv"), param(&ps, "wo"), param(&ps, "wq"), param(&ps, "wk")};
    real *out[2];   // forwards alone: no output seeded
    int64_t on[2];
    cr_assert_eq(gradcheck_run_seeds(f_value_projection, in, 5, m, (const real *[]){NULL, NULL}, out, on), 2);
    cr_assert_leq(max_rel_diff(out[0], out[1], on[0]), FORM_TOL);
    free(out[0]);
    free(out[1]);
    tensor_free(u);
    mixer_destroy(m);
    params_free(&ps);
}

Test(attn_layer, no_recurrent_state) {
    ParamStore ps;
    Mixer *m = attn_mixer_new(&ps, 8, 2, 4, 4, 8);
    Tensor *u = tensor_newv(false, 3, 1, 3, 8), *s = tensor_newv(false, 4, 1, 2, 4, 4);
    fill_normal(u, 9, 1.0);
    Tape tp;
    tape_init(&tp);
    Tensor *s_out = u;   // must be overwritten with NULL
    Tensor *y = m->kind->forward(&tp, m, u, NULL, NULL, &s_out);
    cr_assert_not_null(y);
    cr_assert_null(s_out);
    cr_assert(EXPECT_FAILURE(m->kind->forward(&tp, m, u, NULL, s, NULL)));
    cr_assert(strstr(ag_last_error(), "s_in"), "got: %s", ag_last_error());
    tape_free(&tp);
    tensor_free(u);
    tensor_free(s);
    mixer_destroy(m);
    params_free(&ps);
}

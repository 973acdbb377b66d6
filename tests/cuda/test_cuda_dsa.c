// test_cuda_dsa.c: the DeepSeek sparse-attention pieces on the GPU
// (src/cuda/dsa_index.cu, dsa_topk.cu, dsa_sparse.cu, dsa_sel_kl.cu) against the CPU: op_dsa_index_scores,
// op_sparse_attention, op_dsa_kl, op_dsa_sel_kl (outputs and input gradients,
// 1e-4 / 1e-10 normwise, every way the gradients can arrive), the selection
// (top-k from a score matrix, fused with the scores, and a decoding step's
// over long caches) equal to the CPU's exactly, with ties and documents,
// the targets and the kept mass, whole LMs
// with attn_dsa layers in each mode (loss, every parameter's gradient, AdamW
// steps), and repeated runs bit for bit.
#include <criterion/criterion.h>
#include <math.h>
#include <signal.h>
#include <string.h>

#include "cuda_check.h"
#include "cuda_ops.h"
#include "device.h"
#include "docs.h"
#include "dsa_kernel.h"
#include "dsa_sel_kl.h"
#include "lm.h"
#include "optim.h"

// ---------------------------------------------------------------- inputs

// Documents for B rows of T positions: row 0 flags its start, positions 1
// and 2 (documents of one position), the middle and both sides of the
// 32-row tile edge and the last position; row 1 does not flag 0 (its first
// document began before the window); later rows hold one document. Heap (B*T).
static int *docs_make(int B, int T) {
    int *d = calloc((size_t)B * T, sizeof(int));
    int row0[] = {0, 1, 2, T / 2, 31, 32, 33, 70, T - 1}, row1[] = {3, T / 3 + 1, 64, 65, 100, T - 2};
    for (size_t i = 0; i < sizeof row0 / sizeof row0[0]; i++)
        if (row0[i] >= 0 && row0[i] < T) d[row0[i]] = 1;
    for (size_t i = 0; B > 1 && i < sizeof row1 / sizeof row1[0]; i++)
        if (row1[i] > 0 && row1[i] < T) d[T + row1[i]] = 1;
    return d;
}

// first (B*T) of doc_start (heap), or NULL when nothing is flagged.
static int *first_of(const int *doc_start, int B, int T) {
    if (!doc_start) return NULL;
    int *f = malloc((size_t)B * T * sizeof(int));
    if (docs_first_fill(f, doc_start, B, T)) return f;
    free(f);
    return NULL;
}

// A selection (B, T, K): each row K distinct positions of [lo(t), t] (all
// of them when fewer), ascending, -1 padded. Heap.
static int *sel_random(int B, int T, int K, const int *doc_start, uint64_t seed) {
    int *first = first_of(doc_start, B, T);
    int *sel = malloc((size_t)B * T * K * sizeof(int)), *pool = malloc((size_t)T * sizeof(int));
    Rng r;
    rng_seed(&r, seed);
    for (int64_t row = 0; row < (int64_t)B * T; row++) {
        int t = (int)(row % T), lo = docs_begin(first, row), n = t + 1 - lo;
        int *out = sel + row * K;
        if (n <= K) {
            for (int j = 0; j < K; j++) out[j] = j < n ? lo + j : -1;
            continue;
        }
        for (int i = 0; i < n; i++) pool[i] = lo + i;
        for (int j = 0; j < K; j++) {   // a partial shuffle, then the picks in order
            int i = j + (int)rng_below(&r, (uint64_t)(n - j)), tmp = pool[i];
            pool[i] = pool[j];
            pool[j] = tmp;
        }
        for (int j = 0; j < K; j++) out[j] = -1;
        for (int j = 0, m = 0; m < K; j++) {   // insertion in ascending order
            int v = pool[j], at = m++;
            while (at > 0 && out[at - 1] > v) {
                out[at] = out[at - 1];
                at--;
            }
            out[at] = v;
        }
    }
    free(pool);
    free(first);
    return sel;
}

// The selection as the op on tp wants it: the host array on a CPU tape, a
// copy in device memory on a GPU tape.
static const int *sel_on(Tape *tp, const int *sel, size_t n) {
    if (tp->device == DEVICE_CPU) return sel;
    int *d = tape_dalloc(tp, n * sizeof(int));
    dev_from_host(d, DEVICE_CUDA, sel, n * sizeof(int));
    return d;
}

// Device copies (dev_alloc'd; free with dev_free) of host arrays.
static void *dev_of(const void *h, size_t bytes) {
    void *d = dev_alloc(DEVICE_CUDA, bytes ? bytes : 1);
    dev_from_host(d, DEVICE_CUDA, h, bytes);
    return d;
}

static Tensor *seq(int B, int T, int width, bool grad, uint64_t seed) {
    Tensor *t = tensor_newv(grad, 3, B, T, width);
    fill_normal(t, seed, 1.0);
    return t;
}

// Integers in [-2, 2]: with dI = 4 (c = 1/2) every indexer score is exact on
// both sides, so the two selections must be equal whatever the order of the
// sums, and ties are everywhere.
static Tensor *ints(int B, int T, int width, uint64_t seed) {
    Tensor *t = tensor_newv(false, 3, B, T, width);
    Rng r;
    rng_seed(&r, seed);
    for (int64_t i = 0; i < t->numel; i++) t->data[i] = (real)((int)rng_below(&r, 5) - 2);
    return t;
}

// ---------------------------------------------------------------- indexer scores

typedef struct {
    int HI;
    const int *doc_start;
    const real *p;   // f_index_kl: the target (B, T, T)
    int form;        // 0 apart; 1 qI also read by a later op (the op adds to a begun gradient)
} IndexCtx;

static int f_index(Tape *tp, Tensor *const *x, int n, void *ctx, Tensor **outs) {
    (void)n;
    const IndexCtx *c = ctx;
    outs[0] = op_dsa_index_scores(tp, x[0], x[1], x[2], c->HI, c->doc_start);
    if (c->form == 0) return 1;
    outs[1] = op_scale(tp, x[0], 0.5);
    outs[2] = op_scale(tp, x[1], -1.5);
    outs[3] = op_scale(tp, x[2], 2.0);
    return 4;
}

Test(cuda_dsa, index_scores_against_cpu) {
    int cases[][4] = {// B, T, HI, dI
                      {2, 1, 1, 4},  {2, 7, 2, 8},   {2, 33, 3, 16}, {2, 100, 4, 40},
                      {1, 300, 2, 64}, {3, 65, 1, 33}, {1, 130, 4, 16}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++)
        for (int docs = 0; docs < 2; docs++)
            for (int form = 0; form < 2; form++) {
                int B = cases[ci][0], T = cases[ci][1], HI = cases[ci][2], dI = cases[ci][3];
                int *ds = docs ? docs_make(B, T) : NULL;
                Tensor *x[3] = {seq(B, T, HI * dI, true, 10 + ci), seq(B, T, dI, true, 20 + ci),
                                seq(B, T, HI, true, 30 + ci)};
                IndexCtx c = {HI, ds, NULL, form};
                char label[128];
                snprintf(label, sizeof label, "index scores B %d T %d HI %d dI %d%s%s", B, T, HI, dI,
                         docs ? ", documents" : "", form ? ", gradients begun elsewhere" : "");
                cuda_check_op(label, f_index, x, 3, &c);
                for (int i = 0; i < 3; i++) tensor_free(x[i]);
                free(ds);
            }
}

// Some inputs without a gradient: only qI, only kI, only w, none.
Test(cuda_dsa, index_scores_some_gradients) {
    int B = 2, T = 70, HI = 2, dI = 8;
    int *ds = docs_make(B, T);
    int which[] = {1, 2, 4, 0};
    for (int wi = 0; wi < 4; wi++) {
        Tensor *x[3] = {seq(B, T, HI * dI, which[wi] & 1, 41), seq(B, T, dI, which[wi] & 2, 42),
                        seq(B, T, HI, which[wi] & 4, 43)};
        IndexCtx c = {HI, ds, NULL, 0};
        char label[96];
        snprintf(label, sizeof label, "index scores, gradients of inputs %d (bits)", which[wi]);
        cuda_check_op(label, f_index, x, 3, &c);
        for (int i = 0; i < 3; i++) tensor_free(x[i]);
    }
    free(ds);
}

// ---------------------------------------------------------------- top-k and the fused selection

static void check_sel_equal(const int *a, const int *b, int B, int T, int K, const char *what) {
    for (int64_t i = 0; i < (int64_t)B * T * K; i++)
        cr_assert_eq(a[i], b[i], "%s: B %d T %d K %d: row (b %d, t %d) entry %d: CPU %d, GPU %d", what, B, T, K,
                     (int)(i / K / T), (int)(i / K % T), (int)(i % K), a[i], b[i]);
}

// Score matrices with many ties (values of a few levels, +0 and -0 among
// them) and with distinct values; documents or not; K below, at and above
// the rows' lengths.
Test(cuda_dsa, topk_equals_cpu_with_ties_and_documents) {
    cuda_require();
    int Ts[] = {1, 5, 64, 300, 1100};
    int Ks[] = {1, 3, 16, 64, 200};
    for (int ti = 0; ti < 5; ti++)
        for (int ki = 0; ki < 5; ki++)
            for (int mode = 0; mode < 3; mode++) {
                int B = 2, T = Ts[ti], K = Ks[ki] < T ? Ks[ki] : T;
                int *ds = mode == 2 ? docs_make(B, T) : NULL;
                int64_t n = (int64_t)B * T * T;
                real *S = malloc((size_t)n * sizeof(real));
                Rng r;
                rng_seed(&r, 7 + ti * 10 + ki);
                for (int64_t i = 0; i < n; i++) {
                    if (mode == 0) S[i] = (real)rng_normal(&r);
                    else {   // levels -1, -0, +0, 1, 2: ties everywhere, and the two zeros tie
                        int v = (int)rng_below(&r, 5);
                        S[i] = v == 1 ? (real)-0.0 : v == 2 ? (real)0.0 : (real)(v - 2) - (v == 0 ? 1 : 0);
                    }
                }
                int *cpu = malloc((size_t)B * T * K * sizeof(int)), *gpu = malloc((size_t)B * T * K * sizeof(int));
                dsa_topk(cpu, S, B, T, K, ds);
                int *first = first_of(ds, B, T);
                real *dS = dev_of(S, (size_t)n * sizeof(real));
                int *dfirst = first ? dev_of(first, (size_t)B * T * sizeof(int)) : NULL;
                int *dsel = dev_alloc(DEVICE_CUDA, (size_t)B * T * K * sizeof(int));
                cu_dsa_topk(dsel, dS, B, T, K, dfirst);
                dev_to_host(gpu, dsel, (size_t)B * T * K * sizeof(int), DEVICE_CUDA);
                const char *what[] = {"topk, distinct scores", "topk, ties", "topk, ties and documents"};
                check_sel_equal(cpu, gpu, B, T, K, what[mode]);
                dev_free(DEVICE_CUDA, dS);
                dev_free(DEVICE_CUDA, dsel);
                if (dfirst) dev_free(DEVICE_CUDA, dfirst);
                free(first);
                free(cpu);
                free(gpu);
                free(S);
                free(ds);
            }
}

// The fused scores + top-k (cu_dsa_index_select) against the CPU's
// dsa_index_select, on integer inputs (exact scores, ties): every block-of-
// rows layout (whole batches at once, one batch row per block at T = 3000,
// runs of rows at T = 13000, whose rows are also too long to keep in
// shared memory), with and without documents. Also equal to the top-k of the
// GPU's op_dsa_index_scores.
Test(cuda_dsa, index_select_equals_cpu) {
    cuda_require();
    int cases[][4] = {// B, T, HI, K
                      {3, 7, 2, 3}, {2, 100, 3, 5}, {2, 700, 2, 64}, {2, 3000, 2, 16}, {1, 13000, 1, 8}};
    int dI = 4;
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++)
        for (int docs = 0; docs < 2; docs++) {
            int B = cases[ci][0], T = cases[ci][1], HI = cases[ci][2], K = cases[ci][3];
            int *ds = docs ? docs_make(B, T) : NULL;
            Tensor *qI = ints(B, T, HI * dI, 50 + ci), *kI = ints(B, T, dI, 60 + ci), *w = ints(B, T, HI, 70 + ci);
            size_t ns = (size_t)B * T * K;
            int *cpu = malloc(ns * sizeof(int)), *gpu = malloc(ns * sizeof(int));
            dsa_index_select(cpu, qI->data, kI->data, w->data, B, T, HI, dI, K, ds);
            Tape tp;
            tape_init_on(&tp, DEVICE_CUDA);
            Tensor *dq = tape_tensor_copy(&tp, 3, qI->shape, qI->data), *dk = tape_tensor_copy(&tp, 3, kI->shape, kI->data),
                   *dw = tape_tensor_copy(&tp, 3, w->shape, w->data);
            int *first = first_of(ds, B, T);
            const int *dfirst = first ? sel_on(&tp, first, (size_t)B * T) : NULL;
            int *dsel = tape_dalloc(&tp, ns * sizeof(int));
            cu_dsa_index_select(&tp, dsel, dq->data, dk->data, dw->data, B, T, HI, dI, K, dfirst);
            dev_to_host(gpu, dsel, ns * sizeof(int), DEVICE_CUDA);
            check_sel_equal(cpu, gpu, B, T, K, docs ? "index_select, documents" : "index_select");
            if (T <= 3000) {   // the (B, T, T) scores, then the top-k
                Tensor *Isc = op_dsa_index_scores(&tp, dq, dk, dw, HI, ds);
                cu_dsa_topk(dsel, Isc->data, B, T, K, dfirst);
                dev_to_host(gpu, dsel, ns * sizeof(int), DEVICE_CUDA);
                check_sel_equal(cpu, gpu, B, T, K, "topk of the GPU's scores");
            }
            tape_free(&tp);
            free(first);
            free(cpu);
            free(gpu);
            free(ds);
            tensor_free(qI);
            tensor_free(kI);
            tensor_free(w);
        }
}

// ---------------------------------------------------------------- sparse attention

enum { FORM_PLAIN, FORM_QK_SAME, FORM_ALL_SAME, FORM_ACCUM };

typedef struct {
    const int *sel;   // host (B, T, K)
    int B, T, K, H;
    double scale;
    int form;
} SparseCtx;

static int f_sparse(Tape *tp, Tensor *const *x, int n, void *ctx, Tensor **outs) {
    (void)n;
    const SparseCtx *c = ctx;
    Tensor *q = x[0], *k = x[1], *v = x[2];
    if (c->form == FORM_QK_SAME) k = x[0], v = x[1];
    if (c->form == FORM_ALL_SAME) k = v = x[0];
    const int *sel = sel_on(tp, c->sel, (size_t)c->B * c->T * c->K);
    outs[0] = op_sparse_attention(tp, q, k, v, sel, c->K, c->H, c->scale);
    if (c->form != FORM_ACCUM) return 1;
    outs[1] = op_scale(tp, q, 0.5);
    outs[2] = op_scale(tp, k, -0.75);
    outs[3] = op_scale(tp, v, 1.5);
    return 4;
}

Test(cuda_dsa, sparse_attention_against_cpu) {
    int dims[][2] = {{16, 16}, {64, 64}, {24, 40}, {128, 128}, {5, 3}};
    int Ts[] = {1, 9, 100, 300};
    int Ks[] = {1, 4, 32, 1000};
    for (int di = 0; di < 5; di++)
        for (int ti = 0; ti < 4; ti++)
            for (int ki = 0; ki < 4; ki++) {
                int B = 2, H = 2, T = Ts[ti], K = Ks[ki] < T ? Ks[ki] : T, dk = dims[di][0], dv = dims[di][1];
                if (di == 3 && ti < 2) continue;
                int docs = (ti + ki) % 2;
                int *ds = docs ? docs_make(B, T) : NULL;
                int *sel = sel_random(B, T, K, ds, 80 + ti * 4 + ki);
                Tensor *x[3] = {seq(B, T, H * dk, true, 90 + di), seq(B, T, H * dk, true, 91 + di),
                                seq(B, T, H * dv, true, 92 + di)};
                SparseCtx c = {sel, B, T, K, H, 1.0 / sqrt(dk), FORM_PLAIN};
                char label[128];
                snprintf(label, sizeof label, "sparse attention T %d K %d dk %d dv %d%s", T, K, dk, dv,
                         docs ? ", selection inside documents" : "");
                cuda_check_op(label, f_sparse, x, 3, &c);
                for (int i = 0; i < 3; i++) tensor_free(x[i]);
                free(sel);
                free(ds);
            }
}

// A tensor passed as two or three of q, k, v; gradients begun by another
// op; some inputs without a gradient.
Test(cuda_dsa, sparse_attention_every_way_gradients_arrive) {
    int B = 2, T = 70, H = 2, d = 16, K = 8;
    int *sel = sel_random(B, T, K, NULL, 5);
    SparseCtx c = {sel, B, T, K, H, 0.3, FORM_QK_SAME};
    Tensor *x = seq(B, T, H * d, true, 1), *v = seq(B, T, H * d, true, 2);
    cuda_check_op("sparse attention(x, x, v)", f_sparse, (Tensor *[]){x, v}, 2, &c);
    c.form = FORM_ALL_SAME;
    cuda_check_op("sparse attention(x, x, x)", f_sparse, &x, 1, &c);
    tensor_free(x);
    tensor_free(v);
    int which[] = {1, 2, 4, 6, 0, 7};
    for (int wi = 0; wi < 6; wi++) {
        c.form = wi == 5 ? FORM_ACCUM : FORM_PLAIN;
        Tensor *in[3] = {seq(B, T, H * d, which[wi] & 1, 3), seq(B, T, H * d, which[wi] & 2, 4),
                         seq(B, T, H * 24, which[wi] & 4, 6)};
        char label[96];
        snprintf(label, sizeof label, "sparse attention, gradients of inputs %d (bits)%s", which[wi],
                 wi == 5 ? ", begun elsewhere" : "");
        cuda_check_op(label, f_sparse, in, 3, &c);
        for (int i = 0; i < 3; i++) tensor_free(in[i]);
    }
    free(sel);
}

// ---------------------------------------------------------------- distillation: target, KL, mass

// A target (B, T, T): rows of positive weights on [lo(t), t] (about a
// quarter of them 0, never all), summing to 1; 0 elsewhere. Heap.
static real *target_random(int B, int T, const int *doc_start, uint64_t seed) {
    int *first = first_of(doc_start, B, T);
    real *p = calloc((size_t)B * T * T, sizeof(real));
    Rng r;
    rng_seed(&r, seed);
    for (int64_t row = 0; row < (int64_t)B * T; row++) {
        int t = (int)(row % T), lo = docs_begin(first, row);
        real *pr = p + row * T;
        double sum = 0;
        for (int s = lo; s <= t; s++) {
            pr[s] = rng_below(&r, 4) == 0 && s < t ? 0 : (real)(0.1 + rng_below(&r, 100) / 50.0);
            sum += pr[s];
        }
        for (int s = lo; s <= t; s++) pr[s] = (real)(pr[s] / sum);
    }
    free(first);
    return p;
}

static int f_kl(Tape *tp, Tensor *const *x, int n, void *ctx, Tensor **outs) {
    (void)n;
    const IndexCtx *c = ctx;
    int B = x[0]->shape[0], T = x[0]->shape[1];
    Tensor *p = tape_tensor_copy(tp, 3, (int[]){B, T, T}, c->p);
    outs[0] = op_dsa_kl(tp, x[0], p, c->doc_start);
    return 1;
}

// The indexer's distillation as the layer runs it: scores, then the KL.
static int f_index_kl(Tape *tp, Tensor *const *x, int n, void *ctx, Tensor **outs) {
    (void)n;
    const IndexCtx *c = ctx;
    int B = x[0]->shape[0], T = x[0]->shape[1];
    Tensor *Isc = op_dsa_index_scores(tp, x[0], x[1], x[2], c->HI, c->doc_start);
    Tensor *p = tape_tensor_copy(tp, 3, (int[]){B, T, T}, c->p);
    outs[0] = op_dsa_kl(tp, Isc, p, c->doc_start);
    return 1;
}

Test(cuda_dsa, kl_against_cpu) {
    int Ts[] = {1, 7, 100, 400};
    for (int ti = 0; ti < 4; ti++)
        for (int docs = 0; docs < 2; docs++) {
            int B = 2, T = Ts[ti], HI = 3, dI = 16;
            int *ds = docs ? docs_make(B, T) : NULL;
            real *p = target_random(B, T, ds, 11 + ti);
            IndexCtx c = {HI, ds, p, 0};
            Tensor *I = seq(B, T, T, true, 12 + ti);
            char label[96];
            snprintf(label, sizeof label, "dsa_kl T %d%s", T, docs ? ", documents" : "");
            cuda_check_op(label, f_kl, &I, 1, &c);
            tensor_free(I);
            Tensor *x[3] = {seq(B, T, HI * dI, true, 13 + ti), seq(B, T, dI, true, 14 + ti),
                            seq(B, T, HI, true, 15 + ti)};
            snprintf(label, sizeof label, "dsa_kl of the index scores T %d%s", T, docs ? ", documents" : "");
            cuda_check_op(label, f_index_kl, x, 3, &c);
            for (int i = 0; i < 3; i++) tensor_free(x[i]);
            free(p);
            free(ds);
        }
}

// The targets and the kept mass: dsa_attn_target, dsa_sparse_target and
// dsa_selected_mass against their GPU twins.
Test(cuda_dsa, targets_and_mass_against_cpu) {
    cuda_require();
    int cases[][5] = {// B, T, H, dk, K
                      {2, 1, 2, 16, 1}, {2, 37, 3, 24, 5}, {2, 200, 2, 64, 32}, {1, 700, 4, 32, 64}};
    for (int ci = 0; ci < 4; ci++)
        for (int docs = 0; docs < 2; docs++) {
            int B = cases[ci][0], T = cases[ci][1], H = cases[ci][2], dk = cases[ci][3], K = cases[ci][4];
            int *ds = docs ? docs_make(B, T) : NULL;
            int *first = first_of(ds, B, T);
            Tensor *q = seq(B, T, H * dk, false, 21 + ci), *k = seq(B, T, H * dk, false, 22 + ci);
            int *sel = sel_random(B, T, K, ds, 23 + ci);
            double scale = 1.0 / sqrt(dk);
            size_t np = (size_t)B * T * T, nk = (size_t)B * T * K;
            real *p = malloc(np * sizeof(real)), *pg = malloc(np * sizeof(real));
            real *ps = malloc(nk * sizeof(real)), *psg = malloc(nk * sizeof(real));
            dsa_attn_target(p, q->data, k->data, B, T, H, dk, scale, ds);
            dsa_sparse_target(ps, q->data, k->data, sel, B, T, K, H, dk, scale);
            double mass = dsa_selected_mass(p, sel, B, T, K), mass_g;
            real *dq = dev_of(q->data, (size_t)q->numel * sizeof(real)), *dk_ = dev_of(k->data, (size_t)k->numel * sizeof(real));
            int *dsel = dev_of(sel, nk * sizeof(int)), *dfirst = first ? dev_of(first, (size_t)B * T * sizeof(int)) : NULL;
            real *dp = dev_alloc(DEVICE_CUDA, np * sizeof(real)), *dps = dev_alloc(DEVICE_CUDA, nk * sizeof(real));
            double *dmass = dev_alloc(DEVICE_CUDA, sizeof(double));
            cu_dsa_attn_target(dp, dq, dk_, B, T, H, dk, scale, dfirst);
            cu_dsa_sparse_target(dps, dq, dk_, dsel, B, T, K, H, dk, scale);
            cu_dsa_selected_mass(dmass, dp, dsel, B, T, K);
            dev_to_host(pg, dp, np * sizeof(real), DEVICE_CUDA);
            dev_to_host(psg, dps, nk * sizeof(real), DEVICE_CUDA);
            dev_to_host(&mass_g, dmass, sizeof(double), DEVICE_CUDA);
            double e1 = max_rel_diff(p, pg, (int64_t)np), e2 = max_rel_diff(ps, psg, (int64_t)nk);
            cr_assert(e1 <= FORM_TOL, "attn target T %d docs %d: GPU and CPU differ by %.3e", T, docs, e1);
            cr_assert(e2 <= FORM_TOL, "sparse target T %d docs %d: GPU and CPU differ by %.3e", T, docs, e2);
            cr_assert(fabs(mass - mass_g) <= FORM_TOL * fabs(mass), "selected mass T %d: CPU %.12g, GPU %.12g", T,
                      mass, mass_g);
            dev_free(DEVICE_CUDA, dq);
            dev_free(DEVICE_CUDA, dk_);
            dev_free(DEVICE_CUDA, dsel);
            if (dfirst) dev_free(DEVICE_CUDA, dfirst);
            dev_free(DEVICE_CUDA, dp);
            dev_free(DEVICE_CUDA, dps);
            dev_free(DEVICE_CUDA, dmass);
            free(p);
            free(pg);
            free(ps);
            free(psg);
            free(sel);
            free(first);
            free(ds);
            tensor_free(q);
            tensor_free(k);
        }
}

// ---------------------------------------------------------------- the selection KL

typedef struct {
    const int *sel;
    const real *p;   // (B, T, K)
    int B, T, K, HI;
    int form;        // 1: qI also read by a later op
} SelKlCtx;

static int f_sel_kl(Tape *tp, Tensor *const *x, int n, void *ctx, Tensor **outs) {
    (void)n;
    const SelKlCtx *c = ctx;
    const int *sel = sel_on(tp, c->sel, (size_t)c->B * c->T * c->K);
    Tensor *p = tape_tensor_copy(tp, 3, (int[]){c->B, c->T, c->K}, c->p);
    outs[0] = op_dsa_sel_kl(tp, x[0], x[1], x[2], sel, c->K, p, c->HI);
    if (c->form == 0) return 1;
    outs[1] = op_scale(tp, x[0], 0.5);
    outs[2] = op_scale(tp, x[1], 2.5);
    outs[3] = op_scale(tp, x[2], -1.0);
    return 4;
}

// A target over a selection (B, T, K): positive on the valid entries (a
// quarter 0, never all), summing to 1; 0 at -1 entries. Heap.
static real *sel_target_random(const int *sel, int B, int T, int K, uint64_t seed) {
    real *p = calloc((size_t)B * T * K, sizeof(real));
    Rng r;
    rng_seed(&r, seed);
    for (int64_t row = 0; row < (int64_t)B * T; row++) {
        const int *sr = sel + row * K;
        real *pr = p + row * K;
        double sum = 0;
        int n = 0;
        while (n < K && sr[n] >= 0) n++;
        for (int j = 0; j < n; j++) {
            pr[j] = rng_below(&r, 4) == 0 && j > 0 ? 0 : (real)(0.1 + rng_below(&r, 100) / 50.0);
            sum += pr[j];
        }
        for (int j = 0; j < n; j++) pr[j] = (real)(pr[j] / sum);
    }
    return p;
}

Test(cuda_dsa, sel_kl_against_cpu) {
    int cases[][5] = {// B, T, K, HI, dI
                      {2, 1, 1, 2, 8}, {2, 9, 4, 3, 16}, {2, 100, 16, 4, 16}, {1, 300, 64, 2, 40}, {2, 50, 50, 1, 8}};
    for (int ci = 0; ci < 5; ci++)
        for (int form = 0; form < 2; form++) {
            int B = cases[ci][0], T = cases[ci][1], K = cases[ci][2], HI = cases[ci][3], dI = cases[ci][4];
            int *ds = ci % 2 ? docs_make(B, T) : NULL;
            int *sel = sel_random(B, T, K, ds, 31 + ci);
            real *p = sel_target_random(sel, B, T, K, 32 + ci);
            SelKlCtx c = {sel, p, B, T, K, HI, form};
            Tensor *x[3] = {seq(B, T, HI * dI, true, 33 + ci), seq(B, T, dI, true, 34 + ci),
                            seq(B, T, HI, true, 35 + ci)};
            char label[128];
            snprintf(label, sizeof label, "dsa_sel_kl T %d K %d HI %d dI %d%s", T, K, HI, dI,
                     form ? ", gradients begun elsewhere" : "");
            cuda_check_op(label, f_sel_kl, x, 3, &c);
            for (int i = 0; i < 3; i++) tensor_free(x[i]);
            free(sel);
            free(p);
            free(ds);
        }
}

// ---------------------------------------------------------------- whole LMs

#define LB 3
#define LT 37

static LMConfig dsa_lm_config(const char *layers, int topk) {
    LMConfig c = test_tiny_lm_config(layers);
    c.vocab_size = 97;
    c.d_model = 64;
    c.d_ff = 176;
    c.mixer = mixer_config_default(64, 4, 16, 16);
    c.mixer.chunk_size = 8;
    c.mixer.conv_size = 4;
    c.mixer.index_heads = 2;
    c.mixer.index_dim = 8;
    c.mixer.topk = topk;
    Status s = lm_parse_layers(&c, layers);
    cr_assert(s.ok, "%s", s.msg);
    return c;
}

typedef struct {
    double loss[4], mass;
    real *grad;   // host copy of the whole gradient block after the first step
} DsaRun;

// `steps` AdamW steps of an LM in `mode` on device d: DSA_DISTILL trains
// the indexers on the distillation loss (lm_distill_loss_docs), the others
// the LM loss, plus the KL in DSA_SPARSE_KL.
typedef struct {
    int tokens[LB * LT], targets[LB * LT], ds[LB * LT];
    const int *dsp;   // ds or NULL
    DsaMode mode;
    const char *layers;
    DsaRun *r;
} DsaData;

static Tensor *dsa_run_loss(Tape *tp, LM *lm, int step, void *ctx) {
    DsaData *x = ctx;
    if (x->mode == DSA_DISTILL) {
        Tensor *loss = lm_distill_loss_docs(tp, lm, x->tokens, x->dsp, LB, LT);
        if (step == 0) x->r->mass = lm_dsa_mass(lm);
        return loss;
    }
    Tensor *loss = lm_loss_docs(tp, lm, x->tokens, x->targets, x->dsp, LB, LT, NULL);
    if (x->mode == DSA_SPARSE_KL) {
        cr_assert(lm->dsa_kl, "%s: no KL in DSA_SPARSE_KL mode", x->layers);
        loss = op_add(tp, loss, lm->dsa_kl);
    }
    return loss;
}

static void dsa_lm_run(Device d, const char *layers, int topk, DsaMode mode, bool docs, int steps, DsaRun *r) {
    LMConfig cfg = dsa_lm_config(layers, topk);
    ParamStore ps;
    params_init(&ps);
    LM lm;
    lm_create(&lm, &cfg, &ps);
    params_finalize(&ps, 5);
    if (d != DEVICE_CPU) params_to_device(&ps, d);
    lm_set_dsa_mode(&lm, mode);
    DsaData x = {.mode = mode, .layers = layers, .r = r};
    for (int i = 0; i < LB * LT; i++) {
        x.tokens[i] = (i * 37 + 11) % 97;
        x.targets[i] = (i * 53 + 5) % 97;
        x.ds[i] = 0;
    }
    if (docs) x.ds[1 * LT + 10] = x.ds[1 * LT + 30] = x.ds[2 * LT + 3] = 1;
    x.dsp = docs ? x.ds : NULL;
    r->mass = NAN;
    cuda_train_steps(&lm, &ps, d, steps, dsa_run_loss, &x, r->loss, &r->grad);
    lm_destroy(&lm);
    params_free(&ps);
}

static const char *MODE_NAME[] = {"sparse", "distill", "sparse_kl"};

static void compare_dsa_lm(const char *layers, int topk, DsaMode mode, bool docs) {
    cuda_require();
    DsaRun c, g;
    dsa_lm_run(DEVICE_CPU, layers, topk, mode, docs, 4, &c);
    dsa_lm_run(DEVICE_CUDA, layers, topk, mode, docs, 4, &g);
    const char *m = MODE_NAME[mode], *dn = docs ? " (documents)" : "";
    for (int s = 0; s < 4; s++)
        cr_assert(fabs(c.loss[s] - g.loss[s]) <= FORM_TOL * fabs(c.loss[s]),
                  "%s, topk %d, %s%s: step %d loss %.10g on the CPU, %.10g on the GPU", layers, topk, m, dn, s,
                  c.loss[s], g.loss[s]);
    if (mode == DSA_DISTILL)
        cr_assert(fabs(c.mass - g.mass) <= FORM_TOL * fabs(c.mass), "%s, %s%s: kept mass %.10g CPU, %.10g GPU",
                  layers, m, dn, c.mass, g.mass);
    LMConfig cfg = dsa_lm_config(layers, topk);
    ParamStore ps;
    params_init(&ps);
    LM lm;
    lm_create(&lm, &cfg, &ps);
    for (int i = 0; i < ps.n; i++) {
        int64_t off = ps.offsets[i], n = ps.params[i]->numel;
        double e = max_rel_diff(c.grad + off, g.grad + off, n);
        cr_assert(e <= FORM_TOL, "%s, topk %d, %s%s: gradient of '%s' differs by %.3e", layers, topk, m, dn,
                  ps.params[i]->name, e);
    }
    lm_destroy(&lm);
    params_free(&ps);
    free(c.grad);
    free(g.grad);
}

Test(cuda_dsa, lm_sparse) {
    compare_dsa_lm("attn_dsa,attn_dsa", 5, DSA_SPARSE, false);
    compare_dsa_lm("gdn,attn_dsa", 5, DSA_SPARSE, true);
}
Test(cuda_dsa, lm_sparse_kl) {
    compare_dsa_lm("attn_dsa,attn_dsa", 5, DSA_SPARSE_KL, false);
    compare_dsa_lm("attn_dsa,gdn,attn_dsa", 5, DSA_SPARSE_KL, true);
    compare_dsa_lm("attn_dsa", 40, DSA_SPARSE_KL, true);   // topk >= T: every position selected
}
Test(cuda_dsa, lm_distill) {
    compare_dsa_lm("attn_dsa,attn_dsa", 5, DSA_DISTILL, false);
    compare_dsa_lm("gdn,attn_dsa", 5, DSA_DISTILL, true);
}

// Two GPU runs of each mode (documents on): the same losses, mass and
// gradient block, bit for bit.
Test(cuda_dsa, lm_repeats_bit_for_bit) {
    cuda_require();
    LMConfig cfg = dsa_lm_config("attn_dsa,gdn,attn_dsa", 5);
    ParamStore ps;
    params_init(&ps);
    LM lm;
    lm_create(&lm, &cfg, &ps);
    int64_t numel = ps.numel;
    lm_destroy(&lm);
    params_free(&ps);
    for (int mode = 0; mode < DSA_MODE_COUNT; mode++) {
        DsaRun a, b;
        dsa_lm_run(DEVICE_CUDA, "attn_dsa,gdn,attn_dsa", 5, (DsaMode)mode, true, 3, &a);
        dsa_lm_run(DEVICE_CUDA, "attn_dsa,gdn,attn_dsa", 5, (DsaMode)mode, true, 3, &b);
        for (int s = 0; s < 3; s++)
            cr_assert(a.loss[s] == b.loss[s], "%s: step %d loss %.17g then %.17g", MODE_NAME[mode], s, a.loss[s],
                      b.loss[s]);
        cr_assert(memcmp(a.grad, b.grad, (size_t)numel * sizeof(real)) == 0, "%s: the gradients differ",
                  MODE_NAME[mode]);
        cr_assert(mode != DSA_DISTILL || a.mass == b.mass, "distill: the kept mass differs");
        free(a.grad);
        free(b.grad);
    }
}

// The ops alone, twice on the GPU: sparse attention and the selection KL
// (whose key gradients go through the sort) at a size with many entries per key.
Test(cuda_dsa, ops_repeat_bit_for_bit) {
    cuda_require();
    int B = 2, T = 300, H = 2, d = 32, K = 64, HI = 2, dI = 16;
    int *ds = docs_make(B, T);
    int *sel = sel_random(B, T, K, ds, 77);
    real *p = sel_target_random(sel, B, T, K, 78);
    real *out[2][7];
    for (int run = 0; run < 2; run++) {
        Tape tp;
        tape_init_on(&tp, DEVICE_CUDA);
        Tensor *x[6];
        int widths[6] = {H * d, H * d, H * d, HI * dI, dI, HI};
        for (int i = 0; i < 6; i++) {
            Tensor *h = seq(B, T, widths[i], false, 100 + i);
            x[i] = tape_tensor_copy(&tp, 3, h->shape, h->data);
            x[i]->requires_grad = true;
            tensor_free(h);
        }
        const int *dsel = sel_on(&tp, sel, (size_t)B * T * K);
        Tensor *o = op_sparse_attention(&tp, x[0], x[1], x[2], dsel, K, H, 0.2);
        Tensor *pt = tape_tensor_copy(&tp, 3, (int[]){B, T, K}, p);
        Tensor *kl = op_dsa_sel_kl(&tp, x[3], x[4], x[5], dsel, K, pt, HI);
        real *seed = test_randn(o->numel, 9);
        tape_backward_multi(&tp, (Tensor *[]){o, kl}, (const real *const[]){seed, (real[]){1}}, 2);
        free(seed);
        out[run][6] = malloc(sizeof(real));
        dev_to_host(out[run][6], kl->data, sizeof(real), DEVICE_CUDA);
        for (int i = 0; i < 6; i++) {
            out[run][i] = malloc((size_t)x[i]->numel * sizeof(real));
            dev_to_host(out[run][i], x[i]->grad, (size_t)x[i]->numel * sizeof(real), DEVICE_CUDA);
        }
        tape_free(&tp);
    }
    int widths[6] = {H * d, H * d, H * d, HI * dI, dI, HI};
    for (int i = 0; i < 6; i++)
        cr_assert(memcmp(out[0][i], out[1][i], (size_t)B * T * widths[i] * sizeof(real)) == 0,
                  "gradient %d differs between two runs", i);
    cr_assert(out[0][6][0] == out[1][6][0], "the selection KL differs between two runs");
    for (int r = 0; r < 2; r++)
        for (int i = 0; i < 7; i++) free(out[r][i]);
    free(sel);
    free(p);
    free(ds);
}

// A selection that reads a later position stops the GPU op with a message
// (the kernel traps; the next CUDA call fails). Its own suite: a sanitizer
// run over cuda_dsa/* leaves it out.
Test(cuda_dsa_errors, future_position_stops, .signal = SIGABRT) {
    cuda_require();
    int B = 1, T = 4, K = 2, H = 1, d = 8;
    int sel[] = {0, -1, 0, 1, 1, 3, 2, 3};   // row t = 2 selects 3
    Tape tp;
    tape_init_on(&tp, DEVICE_CUDA);
    Tensor *q = tape_tensorv(&tp, 3, B, T, H * d);
    dev_zero(DEVICE_CUDA, q->data, (size_t)q->numel * sizeof(real));
    op_sparse_attention(&tp, q, q, q, sel_on(&tp, sel, 8), K, H, 1.0);
    dev_sync(DEVICE_CUDA);
}

// ---------------------------------------------------------------- decoding

// attn_dsa decoding on a GPU cache (dsa_step's device path) against the
// CPU's decoding, position by position, two rows, row 1 starting a new
// document at reset_at; and against the GPU's own parallel forward over the
// same documents (the decode-parity bound). Sparse (top-k) and dense
// (DSA_DISTILL) decoding.
typedef struct {
    const char *layers;
    int T, reset_at, topk;
    DsaMode mode;
} DsaDecodeCase;

static real *dsa_decode_run(const DsaDecodeCase *dc, Device d, real **parallel) {
    LMConfig cfg = dsa_lm_config(dc->layers, dc->topk);
    cfg.vocab_size = 61;
    ParamStore ps;
    params_init(&ps);
    LM lm;
    lm_create(&lm, &cfg, &ps);
    params_finalize(&ps, 17);
    if (d != DEVICE_CPU) params_to_device(&ps, d);
    lm_set_dsa_mode(&lm, dc->mode);
    real *out = cuda_decode_logits(&lm, d, 2, dc->T, dc->reset_at, parallel);
    lm_destroy(&lm);
    params_free(&ps);
    return out;
}

static void check_dsa_decode(const DsaDecodeCase *dc) {
    cuda_require();
    int V = 61, B = 2;
    real *par = NULL;
    real *c = dsa_decode_run(dc, DEVICE_CPU, NULL);
    real *g = dsa_decode_run(dc, DEVICE_CUDA, &par);
    for (int t = 0; t < dc->T; t++)
        for (int b = 0; b < B; b++) {
            const real *gs = g + ((size_t)t * B + b) * V;
            double e = max_rel_diff(c + ((size_t)t * B + b) * V, gs, V);
            cr_assert(e <= FORM_TOL, "%s %s: position %d row %d: GPU decode vs CPU decode %.3e", dc->layers,
                      MODE_NAME[dc->mode], t, b, e);
            double p = max_rel_diff(par + ((size_t)b * dc->T + t) * V, gs, V);
            cr_assert(p <= DECODE_TOL, "%s %s: position %d row %d: GPU decode vs GPU parallel forward %.3e",
                      dc->layers, MODE_NAME[dc->mode], t, b, p);
        }
    free(c);
    free(g);
    free(par);
}

Test(cuda_dsa, decode_sparse) { check_dsa_decode(&(DsaDecodeCase){"attn_dsa,gdn,attn_dsa", 23, 9, 5, DSA_SPARSE}); }
Test(cuda_dsa, decode_dense) { check_dsa_decode(&(DsaDecodeCase){"attn_dsa,attn_dsa", 23, 9, 5, DSA_DISTILL}); }
// 300 positions, top 64: rows longer than K, the top-k's ordered pass over several blocks of threads.
Test(cuda_dsa, decode_sparse_long) { check_dsa_decode(&(DsaDecodeCase){"attn_dsa", 300, 120, 64, DSA_SPARSE}); }

// A decoding step's selection (cu_dsa_decode_select: the scores, then one
// block of 1024 threads per row, or for rows of 16,384 keys or more segments
// of 4,096 keys and a merge) against the CPU step's (dsa_index_row, then
// dsa_topk_from) on integer inputs (exact scores, ties everywhere, across
// segments too): caches shorter than K, kept in shared memory, and far
// longer than it (40,000 keys), rows whose keys begin later (start), a last
// segment shorter than K (16,414 keys) and a row too short to split beside
// one that splits.
Test(cuda_dsa, decode_select_equals_cpu_over_long_caches) {
    cuda_require();
    int B = 2, max_T = 40000, HI = 2, dI = 4, K = 64;
    Tensor *kI = ints(B, max_T, dI, 81), *qI = ints(B, 1, HI * dI, 82), *w = ints(B, 1, HI, 83);
    const int lens[] = {40, 3000, 12000, 20000, 16414, 40000},
              starts[][2] = {{0, 0}, {0, 30}, {0, 1500}, {0, 19000}, {0, 0}, {9, 30000}};
    Tape tp;
    tape_init_on(&tp, DEVICE_CUDA);
    real *dk = test_dev_copy(&tp, kI->data, (size_t)kI->numel * sizeof(real));
    real *dq = test_dev_copy(&tp, qI->data, (size_t)qI->numel * sizeof(real));
    real *dw = test_dev_copy(&tp, w->data, (size_t)w->numel * sizeof(real));
    real *dsc = tape_dalloc(&tp, (size_t)B * max_T * sizeof(real));
    int *dstart = tape_dalloc(&tp, (size_t)B * sizeof(int)), *dsel = tape_dalloc(&tp, (size_t)B * K * sizeof(int));
    real *sc = malloc((size_t)max_T * sizeof(real));
    void *work = malloc(DSA_TOPK_WORK(max_T));
    int cpu[64], gpu[2 * 64];
    for (size_t c = 0; c < sizeof lens / sizeof lens[0]; c++) {
        int n = lens[c];
        dev_from_host(dstart, DEVICE_CUDA, starts[c], (size_t)B * sizeof(int));
        cu_dsa_decode_select(&tp, dsel, dsc, dq, dw, dk, B, max_T, n, dstart, HI, dI, K);
        dev_to_host(gpu, dsel, (size_t)B * K * sizeof(int), DEVICE_CUDA);
        for (int b = 0; b < B; b++) {
            int s0 = starts[c][b];
            dsa_index_row(sc + s0, qI->data + (int64_t)b * HI * dI, w->data + (int64_t)b * HI,
                          kI->data + ((int64_t)b * max_T + s0) * dI, dI, n - s0, HI, dI);
            dsa_topk_from(cpu, sc, s0, n, K, work);
            for (int j = 0; j < K; j++)
                cr_assert_eq(gpu[b * K + j], cpu[j], "%d keys, row %d from %d, pick %d: GPU %d, CPU %d", n, b, s0, j,
                             gpu[b * K + j], cpu[j]);
        }
    }
    free(sc);
    free(work);
    tape_free(&tp);
    tensor_free(kI), tensor_free(qI), tensor_free(w);
}

// test_cuda_attn.c: causal softmax attention on the GPU (src/cuda/attn_flash.cu, attn_flash_backward.cu, attn_naive.cu):
// op_attention (the flash kernels) and op_attention_naive (the reference)
// against the CPU at sequence lengths that are and are not multiples of the
// tiles, head dims up to 128 (dk = dv and dk != dv), several batch rows and
// heads, with and without documents (and, for the naive op, a mask of any
// pattern); every way the gradients can arrive (a tensor passed twice, a
// gradient another op has begun, some inputs without one); the GPU flash op
// against the GPU naive op; and a repeated run bit for bit.
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "attn_kernel.h"
#include "cuda_check.h"
#include "device.h"
#include "docs.h"

// How the inputs reach the op: q, k, v apart; one tensor as q and k
// (inputs x, v); one tensor as q, k and v (input x); or q, k, v apart and
// each also read by an op recorded after the attention, whose backward runs
// first, so the attention's adds to a gradient begun by another op.
enum { FORM_PLAIN, FORM_QK_SAME, FORM_ALL_SAME, FORM_ACCUM };

typedef struct {
    int H;
    double scale;
    bool naive;
    const int *doc_start;         // flash: (B, T) or NULL
    const unsigned char *allow;   // naive: (B, T, T) or NULL
    int form;
} AttnCtx;

static int f_attn(Tape *tp, Tensor *const *x, int n, void *ctx, Tensor **outs) {
    (void)n;
    const AttnCtx *c = ctx;
    Tensor *q = x[0], *k = x[1], *v = x[2];
    if (c->form == FORM_QK_SAME) k = x[0], v = x[1];
    if (c->form == FORM_ALL_SAME) k = v = x[0];
    outs[0] = c->naive ? op_attention_naive_masked(tp, q, k, v, c->H, c->scale, c->allow)
                       : op_attention(tp, q, k, v, c->H, c->scale, c->doc_start);
    if (c->form != FORM_ACCUM) return 1;
    outs[1] = op_scale(tp, q, 0.5);
    outs[2] = op_scale(tp, k, -0.75);
    outs[3] = op_scale(tp, v, 1.5);
    return 4;
}

static Tensor *seq(int B, int T, int width, bool grad, uint64_t seed) {
    Tensor *t = tensor_newv(grad, 3, B, T, width);
    fill_normal(t, seed, 1.0);
    return t;
}

// Documents for B rows of T positions: row 0 flags its start, positions 1
// and 2 (documents of one position), the middle, both sides of the 64-key
// tile edge and the last position; row 1 does not flag 0 (its first
// document began before the window) and flags positions inside and at tile
// edges; later rows hold one document. Long rows get documents spanning
// several tiles and tiles wholly skipped. Heap array (B*T).
static int *docs_make(int B, int T) {
    int *d = calloc((size_t)B * T, sizeof(int));
    int row0[] = {0, 1, 2, T / 2, 63, 64, 65, 130, T - 1}, row1[] = {3, T / 3 + 1, 70, 71, 128, T - 2};
    for (size_t i = 0; i < sizeof row0 / sizeof row0[0]; i++)
        if (row0[i] >= 0 && row0[i] < T) d[row0[i]] = 1;
    for (size_t i = 0; B > 1 && i < sizeof row1 / sizeof row1[0]; i++)
        if (row1[i] > 0 && row1[i] < T) d[T + row1[i]] = 1;
    return d;
}

// The block-diagonal causal mask of doc_start (B, T, T), for the naive op.
static unsigned char *mask_of_docs(const int *doc_start, int B, int T) {
    int *first = malloc((size_t)B * T * sizeof(int));
    docs_first_fill(first, doc_start, B, T);
    unsigned char *m = calloc((size_t)B * T * T, 1);
    for (int64_t r = 0; r < (int64_t)B * T; r++)
        for (int s = docs_begin(first, r); s <= r % T; s++) m[r * T + s] = 1;
    free(first);
    return m;
}

// A mask of no pattern: each s <= t allowed with probability 1/2, and one
// random s <= t always (every row must allow some key).
static unsigned char *mask_random(int B, int T, uint64_t seed) {
    Rng r;
    rng_seed(&r, seed);
    unsigned char *m = calloc((size_t)B * T * T, 1);
    for (int64_t row = 0; row < (int64_t)B * T; row++) {
        int t = (int)(row % T);
        for (int s = 0; s <= t; s++) m[row * T + s] = rng_below(&r, 2) == 1;
        m[row * T + rng_below(&r, (uint64_t)t + 1)] = 1;
    }
    return m;
}

static const int DIMS[][2] = {{16, 16}, {32, 32}, {64, 64}, {128, 128}, {24, 40}, {40, 24}, {5, 3}};
#define N_DIMS ((int)(sizeof DIMS / sizeof DIMS[0]))
static const int TS[] = {1, 7, 64, 200, 1000};
#define N_TS ((int)(sizeof TS / sizeof TS[0]))

// One cuda_check_op of the op in c on fresh inputs (B, T, H*dk), (B, T, H*dv).
// At T = 1 (a softmax over one key) the flash op's dq and dk are rounding
// noise around 0 (dS = dP - D), which differs between any two orders of
// summation: only o and dv are compared there.
static void check_case(const char *what, AttnCtx *c, int B, int T, int dk, int dv, uint64_t seed) {
    bool qk_grad = c->naive || T > 1;
    Tensor *x[3] = {seq(B, T, c->H * dk, qk_grad, seed), seq(B, T, c->H * dk, qk_grad, seed + 1),
                    seq(B, T, c->H * dv, true, seed + 2)};
    char label[160];
    snprintf(label, sizeof label, "%s: B %d T %d H %d dk %d dv %d", what, B, T, c->H, dk, dv);
    cuda_check_op(label, f_attn, x, 3, c);
    for (int i = 0; i < 3; i++) tensor_free(x[i]);
}

Test(cuda_attn, flash_against_cpu) {
    for (int ti = 0; ti < N_TS; ti++)
        for (int di = 0; di < N_DIMS; di++)
            for (int docs = 0; docs < 2; docs++) {
                int T = TS[ti], dk = DIMS[di][0], dv = DIMS[di][1];
                int B = T >= 1000 ? 1 : 2, H = T >= 1000 ? 3 : 2;
                int *ds = docs ? docs_make(B, T) : NULL;
                AttnCtx c = {H, 1.0 / sqrt(dk), false, ds, NULL, FORM_PLAIN};
                check_case(docs ? "flash, documents" : "flash", &c, B, T, dk, dv, 100 + 10 * ti + di);
                free(ds);
            }
}

Test(cuda_attn, naive_against_cpu) {
    for (int ti = 0; ti < N_TS; ti++)
        for (int di = 0; di < N_DIMS; di++)
            for (int mask = 0; mask < 3; mask++) {
                int T = TS[ti], dk = DIMS[di][0], dv = DIMS[di][1];
                // The CPU reference is slow at T = 1000: two head shapes there.
                if (T >= 1000 && !(dk == 64 && dv == 64) && !(dk == 24 && dv == 40)) continue;
                int B = T >= 1000 ? 1 : 2, H = 2;
                int *ds = mask == 1 ? docs_make(B, T) : NULL;
                unsigned char *allow = mask == 1 ? mask_of_docs(ds, B, T) : mask == 2 ? mask_random(B, T, 7 + T) : NULL;
                AttnCtx c = {H, 1.0 / sqrt(dk), true, NULL, allow, FORM_PLAIN};
                const char *what[] = {"naive", "naive, documents", "naive, random mask"};
                check_case(what[mask], &c, B, T, dk, dv, 300 + 10 * ti + di);
                free(ds);
                free(allow);
            }
}

// A tensor passed as two or three of q, k, v; gradients begun by another op;
// some inputs without a gradient (only q, only k, only v, none: then nothing
// is recorded and no lse is kept). T = 70: a full and a part tile.
Test(cuda_attn, every_way_gradients_arrive) {
    int B = 2, T = 70, H = 2, d = 16;
    for (int naive = 0; naive < 2; naive++)
        for (int docs = 0; docs < 2; docs++) {
            int *ds = docs ? docs_make(B, T) : NULL;
            unsigned char *allow = naive && docs ? mask_of_docs(ds, B, T) : NULL;
            AttnCtx c = {H, 0.3, naive, naive ? NULL : ds, allow, FORM_PLAIN};
            char label[96];
            const char *op = naive ? "naive" : "flash";
            // One tensor as q and k, and as q, k and v.
            Tensor *x = seq(B, T, H * d, true, 41), *v = seq(B, T, H * d, true, 42);
            c.form = FORM_QK_SAME;
            snprintf(label, sizeof label, "%s%s: attention(x, x, v)", op, docs ? " with documents" : "");
            cuda_check_op(label, f_attn, (Tensor *[]){x, v}, 2, &c);
            c.form = FORM_ALL_SAME;
            snprintf(label, sizeof label, "%s%s: attention(x, x, x)", op, docs ? " with documents" : "");
            cuda_check_op(label, f_attn, &x, 1, &c);
            tensor_free(x);
            tensor_free(v);
            // Gradients begun by another op: the attention adds.
            c.form = FORM_ACCUM;
            check_case(naive ? "naive, gradients begun elsewhere" : "flash, gradients begun elsewhere", &c, B, T, d,
                       d + 8, 43);
            // Only some inputs take a gradient (mask bit i: input i does).
            c.form = FORM_PLAIN;
            int which[] = {1, 2, 4, 6, 0};
            for (int w = 0; w < 5; w++) {
                Tensor *in[3] = {seq(B, T, H * d, which[w] & 1, 44), seq(B, T, H * d, which[w] & 2, 45),
                                 seq(B, T, H * 8, which[w] & 4, 46)};
                snprintf(label, sizeof label, "%s%s: gradients of inputs %d (bits)", op, docs ? " with documents" : "",
                         which[w]);
                cuda_check_op(label, f_attn, in, 3, &c);
                for (int i = 0; i < 3; i++) tensor_free(in[i]);
            }
            free(ds);
            free(allow);
        }
}

// o, dq, dk, dv of c's op on the GPU from inputs x (host), the backward
// seeded with a fixed dO; host copies in got[4] (malloc'd).
static void run_gpu(Tensor *const *x, AttnCtx *c, real **got) {
    Tape tp;
    tape_init_on(&tp, DEVICE_CUDA);
    Tensor *xs[3];
    for (int i = 0; i < 3; i++) {
        xs[i] = tape_tensor_copy(&tp, x[i]->ndim, x[i]->shape, x[i]->data);
        xs[i]->requires_grad = true;
    }
    Tensor *o;
    f_attn(&tp, xs, 3, c, &o);
    real *seed = test_randn(o->numel, 555);
    tape_backward_from(&tp, o, seed);
    got[0] = malloc((size_t)o->numel * sizeof(real));
    dev_to_host(got[0], o->data, (size_t)o->numel * sizeof(real), DEVICE_CUDA);
    for (int i = 0; i < 3; i++) {
        got[i + 1] = malloc((size_t)x[i]->numel * sizeof(real));
        dev_to_host(got[i + 1], xs[i]->grad, (size_t)x[i]->numel * sizeof(real), DEVICE_CUDA);
    }
    dev_sync(DEVICE_CUDA);
    free(seed);
    tape_free(&tp);
}

Test(cuda_attn, gpu_flash_equals_gpu_naive) {
    cuda_require();
    int cases[][3] = {{7, 64, 64}, {64, 24, 40}, {200, 128, 128}, {200, 40, 24}, {1000, 64, 64}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++)
        for (int docs = 0; docs < 2; docs++) {
            int T = cases[ci][0], dk = cases[ci][1], dv = cases[ci][2], B = 2, H = 2;
            Tensor *x[3] = {seq(B, T, H * dk, true, 60 + ci), seq(B, T, H * dk, true, 70 + ci),
                            seq(B, T, H * dv, true, 80 + ci)};
            int *ds = docs ? docs_make(B, T) : NULL;
            unsigned char *allow = docs ? mask_of_docs(ds, B, T) : NULL;
            AttnCtx cf = {H, 1.0 / sqrt(dk), false, ds, NULL, FORM_PLAIN};
            AttnCtx cn = {H, 1.0 / sqrt(dk), true, NULL, allow, FORM_PLAIN};
            real *f[4], *nv[4];
            run_gpu(x, &cf, f);
            run_gpu(x, &cn, nv);
            const char *what[4] = {"o", "dq", "dk", "dv"};
            int64_t len[4] = {x[2]->numel, x[0]->numel, x[1]->numel, x[2]->numel};
            for (int i = 0; i < 4; i++) {
                double e = max_rel_diff(f[i], nv[i], len[i]);
                cr_assert(e <= FORM_TOL, "T %d dk %d dv %d documents %d: %s, GPU flash vs GPU naive %.3e", T, dk, dv,
                          docs, what[i], e);
                free(f[i]);
                free(nv[i]);
            }
            free(ds);
            free(allow);
            for (int i = 0; i < 3; i++) tensor_free(x[i]);
        }
}

Test(cuda_attn, flash_repeats_bit_for_bit) {
    cuda_require();
    int B = 2, T = 200, H = 3, dk = 32, dv = 24;
    Tensor *x[3] = {seq(B, T, H * dk, true, 90), seq(B, T, H * dk, true, 91), seq(B, T, H * dv, true, 92)};
    int *ds = docs_make(B, T);
    AttnCtx c = {H, 0.2, false, ds, NULL, FORM_PLAIN};
    real *a[4], *b[4];
    run_gpu(x, &c, a);
    run_gpu(x, &c, b);
    int64_t len[4] = {x[2]->numel, x[0]->numel, x[1]->numel, x[2]->numel};
    for (int i = 0; i < 4; i++) {
        cr_assert(memcmp(a[i], b[i], (size_t)len[i] * sizeof(real)) == 0, "array %d differs between two runs", i);
        free(a[i]);
        free(b[i]);
    }
    free(ds);
    for (int i = 0; i < 3; i++) tensor_free(x[i]);
}

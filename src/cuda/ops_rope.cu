// ops_rope.cu: op_rope and op_rope_pos on the GPU (ops_rope.c has the math).
//
// The forward builds the cos/sin table on the device, one thread per (entry,
// frequency), from the position and the frequency alone, so a position
// rotates by the same bits in either op, as on the CPU. The frequencies
// base^(-2i/hd) are the CPU's own (host pow, copied over); the angles are
// computed in double. Then one thread per pair rotates it: pair k of the
// whole tensor sits at elements 2k, 2k+1, since every row holds H*hd/2
// whole pairs. Saved: the table and the device copy of the row -> entry
// index.
#include <math.h>

#include "cuda_internal.cuh"
#include "ops_layout.h"

// The node's aux is a RopeTable (ops_layout.h). What the GPU pair saves:
typedef struct CuRopeSaved {
    real *cs;         // (n_pos, hd/2, 2) on the device: cos, sin of each entry's angles
    const int *idx;   // (B*T) on the device, or NULL
} CuRopeSaved;

// cs[e, i] = cos, sin of p(e) * invf[i]; n = n_pos * half.
__global__ void k_rope_table(real *cs, const int *pos, int pos0, const double *invf, int64_t n, int half) {
    CU_FOR(k, n) {
        int64_t e = k / half;
        int i = (int)(k % half);
        int p = pos ? pos[e] : pos0 + (int)e;
        double a = __dmul_rn((double)p, invf[i]);   // rounded: never folded into cos's reduction
        cs[2 * k] = (real)cos(a);
        cs[2 * k + 1] = (real)sin(a);
    }
}

// dst = R src (forward), or dst (=, += unless fresh) R^T src (back), one
// thread per pair. Row r = k / row_pairs uses entry idx[r], or r % T.
__global__ void k_rope_apply(real *dst, const real *src, const real *cs, const int *idx, int64_t npairs,
                             int64_t row_pairs, int T, int half, bool back, bool fresh) {
    CU_FOR(k, npairs) {
        int64_t r = k / row_pairs;
        int64_t e = idx ? (int64_t)idx[r] : r % T;
        const real *ce = cs + (e * half + k % half) * 2;
        real c = ce[0], sn = ce[1], x0 = src[2 * k], x1 = src[2 * k + 1];
        // One spelled-out rounding per pair: the compiler specialises this
        // loop on idx, back and fresh, and left to itself it contracted the
        // versions differently (a row rotated through per-row positions and
        // the same row at an offset differed by an ulp).
        if (back) {
            real d0 = fma(x0, c, mul_rn(x1, sn)), d1 = fma(x1, c, -mul_rn(x0, sn));
            dst[2 * k] = fresh ? d0 : add_rn(dst[2 * k], d0);
            dst[2 * k + 1] = fresh ? d1 : add_rn(dst[2 * k + 1], d1);
        } else {
            dst[2 * k] = fma(x0, c, -mul_rn(x1, sn));
            dst[2 * k + 1] = fma(x0, sn, mul_rn(x1, c));
        }
    }
}

// iarg: 0 head_dim. farg[0]: base. aux: the RopeTable (host).
extern "C" void cu_rope_forward(Node *n) {
    const Tensor *x = n->in[0];
    const RopeTable *tb = (const RopeTable *)n->aux;
    int B = x->shape[0], T = x->shape[1], hd = n->iarg[0], half = hd / 2, H = x->shape[2] / hd;
    int64_t rows = (int64_t)B * T, n_tab = (int64_t)tb->n_pos * half;
    Tape *tp = n->tape;

    // The frequencies exactly as rope_table computes them on the CPU.
    double *invf_h = (double *)tape_alloc(tp, (size_t)half * sizeof(double));
    for (int i = 0; i < half; i++) invf_h[i] = pow(n->farg[0], -2.0 * i / hd);
    double *invf = (double *)tape_dalloc(tp, (size_t)half * sizeof(double));
    cu_from_host(invf, invf_h, (size_t)half * sizeof(double));
    int *pos = NULL, *idx = NULL;
    if (tb->pos) {
        pos = (int *)tape_dalloc(tp, (size_t)tb->n_pos * sizeof(int));
        cu_from_host(pos, tb->pos, (size_t)tb->n_pos * sizeof(int));
    }
    if (tb->idx) {
        idx = (int *)tape_dalloc(tp, (size_t)(rows > 0 ? rows : 1) * sizeof(int));
        cu_from_host(idx, tb->idx, (size_t)rows * sizeof(int));
    }
    real *cs = (real *)tape_dalloc(tp, (size_t)(n_tab > 0 ? 2 * n_tab : 1) * sizeof(real));
    if (n_tab > 0) {
        k_rope_table<<<cu_grid(n_tab), CU_THREADS, 0, cu_stream>>>(cs, pos, tb->pos0, invf, n_tab, half);
        CU_LAUNCHED();
    }
    int64_t npairs = x->numel / 2;
    if (npairs > 0) {
        k_rope_apply<<<cu_grid(npairs), CU_THREADS, 0, cu_stream>>>(n->out[0]->data, x->data, cs, idx, npairs,
                                                                    (int64_t)H * half, T, half, false, false);
        CU_LAUNCHED();
    }
    if (n->recorded) {
        CuRopeSaved *sv = (CuRopeSaved *)tape_alloc(tp, sizeof *sv);
        sv->cs = cs;
        sv->idx = idx;
        n->saved = sv;
    }
}

extern "C" void cu_rope_backward(Node *n) {
    bool fresh;
    real *dx = CU_GRAD_FRESH(n, 0, &fresh);
    const Tensor *x = n->in[0];
    int64_t npairs = x->numel / 2;
    if (!dx || npairs == 0) return;
    const CuRopeSaved *sv = (const CuRopeSaved *)n->saved;
    int T = x->shape[1], hd = n->iarg[0], half = hd / 2, H = x->shape[2] / hd;
    k_rope_apply<<<cu_grid(npairs), CU_THREADS, 0, cu_stream>>>(dx, n->out[0]->grad, sv->cs, sv->idx, npairs,
                                                                (int64_t)H * half, T, half, true, fresh);
    CU_LAUNCHED();
}

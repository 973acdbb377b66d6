// ops_rope.c: rotary position embedding on interleaved pairs.
//
// x (B, T, H*hd): in every head, the pair (2i, 2i+1) at position p = pos0 + t
// is rotated by the angle p * base^(-2i/hd):
//   y0 = x0 cos - x1 sin,   y1 = x0 sin + x1 cos.
// The backward rotates the gradient by the negative angle (the transpose of
// a rotation is its inverse).
#include <math.h>

#include "ops.h"
#include "ops_math.h"

typedef struct RopeSaved {
    real *cs;       // (T, hd/2, 2): cos, sin of each position's angles
} RopeSaved;

// cs (T, hd/2, 2); angles computed in double.
static void rope_table(real *cs, int T, int hd, int pos0, double base) {
    for (int t = 0; t < T; t++)
        for (int i = 0; i < hd / 2; i++) {
            double a = (double)(pos0 + t) * pow(base, -2.0 * i / hd);
            cs[((int64_t)t * (hd / 2) + i) * 2] = (real)cos(a);
            cs[((int64_t)t * (hd / 2) + i) * 2 + 1] = (real)sin(a);
        }
}

// Rotate src into dst (dst = R src, or dst += R^T src when back).
// src, dst: (B, T, H*hd); cs: (T, hd/2, 2).
static void rope_apply(real *dst, const real *src, const real *cs, int B, int T, int H, int hd, bool back) {
    int half = hd / 2;
#pragma omp parallel for collapse(2) if ((int64_t)B * T * H * hd > OPS_PAR_MIN) schedule(static)
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            const real *ct = cs + (int64_t)t * half * 2;
            int64_t base = ((int64_t)b * T + t) * H * hd;
            for (int h = 0; h < H; h++) {
                const real *s = src + base + (int64_t)h * hd;
                real *d = dst + base + (int64_t)h * hd;
                for (int i = 0; i < half; i++) {
                    real c = ct[2 * i], sn = ct[2 * i + 1], x0 = s[2 * i], x1 = s[2 * i + 1];
                    if (back) {
                        d[2 * i] += x0 * c + x1 * sn;
                        d[2 * i + 1] += -x0 * sn + x1 * c;
                    } else {
                        d[2 * i] = x0 * c - x1 * sn;
                        d[2 * i + 1] = x0 * sn + x1 * c;
                    }
                }
            }
        }
}

// iarg: 0 head_dim, 1 pos0. farg[0]: base.
static void rope_forward(Node *n) {
    const Tensor *x = n->in[0];
    int B = x->shape[0], T = x->shape[1], hd = n->iarg[0], H = x->shape[2] / hd;
    real *cs = tape_alloc(n->tape, (size_t)imax(T * hd, 1) * sizeof(real));
    rope_table(cs, T, hd, n->iarg[1], n->farg[0]);
    rope_apply(n->out[0]->data, x->data, cs, B, T, H, hd, false);
    if (n->recorded) {
        RopeSaved *sv = tape_alloc(n->tape, sizeof *sv);
        sv->cs = cs;
        n->saved = sv;
    }
}

static void rope_backward(Node *n) {
    real *dx = NODE_GRAD_IN(n, 0);
    if (!dx) return;
    const Tensor *x = n->in[0];
    const RopeSaved *sv = n->saved;
    int B = x->shape[0], T = x->shape[1], hd = n->iarg[0], H = x->shape[2] / hd;
    rope_apply(dx, n->out[0]->grad, sv->cs, B, T, H, hd, true);
}

static const OpDef OP_ROPE = {"rope", rope_forward, rope_backward};

Tensor *op_rope(Tape *tp, Tensor *x, int head_dim, int pos0, double base) {
    ASSERT(x->ndim == 3, "rope: x must be (B, T, H*head_dim), got %s", SHAPE(x));
    ASSERT(head_dim > 0 && head_dim % 2 == 0 && x->shape[2] % head_dim == 0,
           "rope: head_dim %d must be even and divide the last dimension of x %s", head_dim, SHAPE(x));
    ASSERT(pos0 >= 0 && base > 0, "rope: pos0 %d, base %g", pos0, base);
    Tensor *y = tape_tensor(tp, 3, x->shape);
    Node *n = tape_op(tp, &OP_ROPE, &x, 1, &y, 1);
    n->iarg[0] = head_dim;
    n->iarg[1] = pos0;
    n->farg[0] = base;
    rope_forward(n);
    return y;
}

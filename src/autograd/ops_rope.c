// ops_rope.c: rotary position embedding on interleaved pairs.
//
// x (B, T, H*hd): in every head, the pair (2i, 2i+1) at position p = pos0 + t
// (op_rope) or p = pos[b, t] (op_rope_pos) is rotated by the angle
// p * base^(-2i/hd):
//   y0 = x0 cos - x1 sin,   y1 = x0 sin + x1 cos.
// The backward rotates the gradient by the negative angle (the transpose of
// a rotation is its inverse). An angle is computed from its position alone,
// so a position rotates by the same bits in either op.
//
// The cos/sin table holds one entry per position used: pos0 .. pos0+T-1
// (op_rope); 0 .. max(pos) when that is at most B*T entries (documents in a
// training window: positions < T); else one entry per row (decoding B rows
// at long, per-row positions, where a table up to the position would cost
// O(pos) per step).
#include <math.h>
#include <stdlib.h>

#include "ops.h"
#include "ops_layout.h"
#include "ops_math.h"

typedef struct RopeSaved {
    real *cs;       // (n_pos, hd/2, 2): cos, sin of each table entry's angles
} RopeSaved;

// cs (n_pos, hd/2, 2); angles computed in double, each from its position and
// frequency alone (the same bits whoever computes the entry).
static void rope_table(real *cs, const RopeTable *tb, int hd, double base) {
    int half = hd / 2;
    double *freq = xmalloc((size_t)imax(half, 1) * sizeof(double));
    for (int i = 0; i < half; i++) freq[i] = pow(base, -2.0 * i / hd);
#pragma omp parallel for if ((int64_t)tb->n_pos * half >= 2048) schedule(static)
    for (int e = 0; e < tb->n_pos; e++) {
        int p = tb->pos ? tb->pos[e] : tb->pos0 + e;
        for (int i = 0; i < half; i++) {
            double a = (double)p * freq[i];
            cs[((int64_t)e * half + i) * 2] = (real)cos(a);
            cs[((int64_t)e * half + i) * 2 + 1] = (real)sin(a);
        }
    }
    free(freq);
}

// The table of an earlier rope node of this step whose entries are this
// node's (the same positions pos0 .. pos0+n_pos-1, head size and base): the
// queries' and keys' ropes of every layer share one, which saves
// 2 n_pos hd/2 sines and cosines per op (half of a tiny_attn rope's time).
// NULL when none of the last ROPE_REUSE_SCAN recorded nodes has it.
#define ROPE_REUSE_SCAN 256
static const OpDef OP_ROPE;
static real *rope_table_reuse(const Node *n) {
    const RopeTable *tb = n->aux;
    if (tb->pos) return NULL;   // per-row positions (decoding): not shared
    const Tape *tp = n->tape;
    for (int i = tp->n_nodes - 1, seen = 0; i >= 0 && seen < ROPE_REUSE_SCAN; i--, seen++) {
        const Node *o = tp->nodes[i];
        if (o == n || o->op != &OP_ROPE || !o->saved) continue;
        const RopeTable *ot = o->aux;
        if (!ot->pos && ot->pos0 == tb->pos0 && ot->n_pos == tb->n_pos && o->iarg[0] == n->iarg[0] &&
            o->farg[0] == n->farg[0])
            return ((const RopeSaved *)o->saved)->cs;
    }
    return NULL;
}

// Rotate src into dst (dst = R src; when back, dst += R^T src, or dst = R^T
// src when dst is a fresh gradient).
// src, dst: (B, T, H*hd); cs: the table, row r rotated by entry idx[r] (idx
// (B*T)), or by entry t when idx is NULL.
static void rope_apply(real *dst, const real *src, const real *cs, const int *idx, int B, int T, int H, int hd,
                       bool back, bool fresh) {
    int half = hd / 2;
#pragma omp parallel for collapse(2) if ((int64_t)B * T * H * hd > OPS_PAR_MIN) schedule(static)
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            const real *ct = cs + (int64_t)(idx ? idx[(int64_t)b * T + t] : t) * half * 2;
            int64_t base = ((int64_t)b * T + t) * H * hd;
            for (int h = 0; h < H; h++) {
                const real *s = src + base + (int64_t)h * hd;
                real *d = dst + base + (int64_t)h * hd;
                for (int i = 0; i < half; i++) {
                    real c = ct[2 * i], sn = ct[2 * i + 1], x0 = s[2 * i], x1 = s[2 * i + 1];
                    if (back && fresh) {
                        d[2 * i] = x0 * c + x1 * sn;
                        d[2 * i + 1] = -x0 * sn + x1 * c;
                    } else if (back) {
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

// iarg: 0 head_dim. farg[0]: base. aux: the RopeTable (arena).
static void rope_forward(Node *n) {
    const Tensor *x = n->in[0];
    const RopeTable *tb = n->aux;
    int B = x->shape[0], T = x->shape[1], hd = n->iarg[0], H = x->shape[2] / hd;
    real *cs = n->recorded ? rope_table_reuse(n) : NULL;   // (the tape keeps only recorded nodes)
    if (!cs) {
        cs = tape_alloc(n->tape, (size_t)imax(tb->n_pos * hd, 1) * sizeof(real));
        rope_table(cs, tb, hd, n->farg[0]);
    }
    rope_apply(n->out[0]->data, x->data, cs, tb->idx, B, T, H, hd, false, false);
    if (n->recorded) {
        RopeSaved *sv = tape_alloc(n->tape, sizeof *sv);
        sv->cs = cs;
        n->saved = sv;
    }
}

static void rope_backward(Node *n) {
    bool fresh = false;
    real *dx = NODE_GRAD_FRESH(n, 0, &fresh);
    if (!dx) return;
    const Tensor *x = n->in[0];
    const RopeSaved *sv = n->saved;
    const RopeTable *tb = n->aux;
    int B = x->shape[0], T = x->shape[1], hd = n->iarg[0], H = x->shape[2] / hd;
    rope_apply(dx, n->out[0]->grad, sv->cs, tb->idx, B, T, H, hd, true, fresh);
}

static const OpDef OP_ROPE = {"rope", rope_forward, rope_backward, CUDA_PAIR(cu_rope_forward, cu_rope_backward)};

static Tensor *rope_build(Tape *tp, Tensor *x, int head_dim, int pos0, const int *pos, double base) {
    ASSERT(x->ndim == 3, "rope: x must be (B, T, H*head_dim), got %s", SHAPE(x));
    ASSERT(head_dim > 0 && head_dim % 2 == 0 && x->shape[2] % head_dim == 0,
           "rope: head_dim %d must be even and divide the last dimension of x %s", head_dim, SHAPE(x));
    ASSERT(pos0 >= 0 && base > 0, "rope: pos0 %d, base %g", pos0, base);
    int rows = x->shape[0] * x->shape[1];
    RopeTable *tb = tape_alloc(tp, sizeof *tb);
    *tb = (RopeTable){NULL, pos0, x->shape[1], NULL};
    if (pos) {
        int *idx = tape_alloc(tp, (size_t)imax(rows, 1) * sizeof(int)), mx = -1;
        for (int r = 0; r < rows; r++) {
            ASSERT(pos[r] >= 0, "rope: negative position %d at row %d", pos[r], r);
            mx = imax(mx, pos[r]);
        }
        if (mx < rows) {   // entry p = position p
            for (int r = 0; r < rows; r++) idx[r] = pos[r];
            *tb = (RopeTable){NULL, 0, mx + 1, idx};
        } else {           // entry r = row r's position
            int *pl = tape_alloc(tp, (size_t)rows * sizeof(int));
            for (int r = 0; r < rows; r++) pl[r] = pos[r], idx[r] = r;
            *tb = (RopeTable){pl, 0, rows, idx};
        }
    }
    Tensor *y = tape_tensor(tp, 3, x->shape);
    Node *n = tape_op(tp, &OP_ROPE, &x, 1, &y, 1);
    n->iarg[0] = head_dim;
    n->farg[0] = base;
    n->aux = tb;
    tape_forward(n);
    return y;
}

Tensor *op_rope(Tape *tp, Tensor *x, int head_dim, int pos0, double base) {
    return rope_build(tp, x, head_dim, pos0, NULL, base);
}

Tensor *op_rope_pos(Tape *tp, Tensor *x, int head_dim, const int *pos, double base) {
    ASSERT(pos, "rope: op_rope_pos needs positions (B, T)");
    return rope_build(tp, x, head_dim, 0, pos, base);
}

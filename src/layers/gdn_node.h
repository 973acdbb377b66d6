// gdn_node.h: the node layout of op_gdn, read by its CPU forms
// (gdn_chunk.c, gdn_chunk_backward.c, gdn_naive.c) and its GPU ones
// (src/cuda/gdn_*.cu): plain enums and a static inline function, so C and
// C++ alike.
//
// in: q, k, v, beta, g, s0 (maybe NULL). out: o, S_T. iarg: the sizes below.
// saved: (B, H, NC, dk, dv) the state entering each chunk, NC = ceil(T/C);
// for the chunked form on the GPU, then the forward's rows that its backward
// reads instead of solving for them again: (B, H, T, dk) W = Tm diag(beta b)
// K per chunk, (B, H, T, dv) U = Tm diag(beta) V, (B, H, T, dv) Delta =
// U - W S0, and (B, H, T, min(C, T)) Tm = (I + A)^-1 (a chunk's L x L from
// its first row, leading dim L).
// aux: first (B, T) of the documents (docs.h), or NULL.
#ifndef GDN_NODE_H
#define GDN_NODE_H

#include <stdbool.h>
#include <stddef.h>

enum { GDN_IN_Q, GDN_IN_K, GDN_IN_V, GDN_IN_BETA, GDN_IN_G, GDN_IN_S0, GDN_N_IN };
// BF16: the chunk products in bf16: the CPU's (set by the builder), the GPU's
// chunked form's (set by its forward, cu_gdn_chunk_forward: the builder leaves 0 there)
enum { GDN_ARG_B, GDN_ARG_T, GDN_ARG_H, GDN_ARG_DK, GDN_ARG_DV, GDN_ARG_C, GDN_ARG_BF16 };

// Where saved's parts start, in reals from saved, and its whole length:
// rows false, the states alone (every form but the GPU's chunked one).
typedef struct {
    size_t W, U, Delta, Tm, total;
} GdnSaved;

static inline GdnSaved gdn_saved_layout(size_t B, size_t H, size_t T, size_t C, size_t dk, size_t dv, bool rows) {
    size_t NC = (T + C - 1) / C, cw = C < T ? C : T, r = B * H * T;
    GdnSaved s;
    s.W = B * H * NC * dk * dv;
    s.U = s.W + r * dk;
    s.Delta = s.U + r * dv;
    s.Tm = s.Delta + r * dv;
    s.total = rows ? s.Tm + r * cw : s.W;
    return s;
}

#endif

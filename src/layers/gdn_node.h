// gdn_node.h: the node layout of op_gdn, read by its CPU forms
// (gdn_chunk.c, gdn_chunk_backward.c, gdn_naive.c) and its GPU ones
// (src/cuda/gdn_*.cu): plain enums, so C and C++ alike.
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

enum { GDN_IN_Q, GDN_IN_K, GDN_IN_V, GDN_IN_BETA, GDN_IN_G, GDN_IN_S0, GDN_N_IN };
// BF16: the chunk products in bf16: the CPU's (set by the builder), the GPU's
// chunked form's (set by its forward, cu_gdn_chunk_forward: the builder leaves 0 there)
enum { GDN_ARG_B, GDN_ARG_T, GDN_ARG_H, GDN_ARG_DK, GDN_ARG_DV, GDN_ARG_C, GDN_ARG_BF16 };

#endif

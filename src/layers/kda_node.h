// kda_node.h: the node layout of op_kda (Kimi Delta Attention's mixing op),
// read by its CPU forms (kda_naive.c, kda_chunk.c, kda_chunk_backward.c) and
// its GPU one (src/cuda/kda_naive.cu): plain enums, so C and C++ alike.
//
// Exactly op_gdn's layout (gdn_node.h) except that g is (B, T, H*dk), one log
// decay per key channel.
// in: q, k, v, beta, g, s0 (maybe NULL). out: o (B, T, H*dv), S_T (B, H, dk, dv).
// iarg: the sizes below. saved: (B, H, NC, dk, dv) the state entering each
// chunk of C positions, NC = ceil(T/C), written by the forward of either form
// and read by its backward. aux: first (B, T) of the documents (docs.h), or NULL.
#ifndef KDA_NODE_H
#define KDA_NODE_H

enum { KDA_IN_Q, KDA_IN_K, KDA_IN_V, KDA_IN_BETA, KDA_IN_G, KDA_IN_S0, KDA_N_IN };
enum { KDA_ARG_B, KDA_ARG_T, KDA_ARG_H, KDA_ARG_DK, KDA_ARG_DV, KDA_ARG_C };

#endif

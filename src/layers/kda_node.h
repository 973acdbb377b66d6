// kda_node.h: the node layout of op_kda (Kimi Delta Attention's mixing op),
// read by its CPU forms (kda_naive.c, kda_chunk.c, kda_chunk_backward.c) and
// its GPU one (src/cuda/kda_naive.cu): plain enums, so C and C++ alike.
//
// Exactly op_gdn's layout (gdn_node.h) except that g is (B, T, H*dk), one log
// decay per key channel.
// in: q, k, v, beta, g, s0 (maybe NULL). out: o (B, T, H*dv), S_T (B, H, dk, dv).
// iarg: the sizes below, and KDA_ARG_BF16: the kind of the CPU chunked
// form's products (CHUNK_TILES_*, tile_amx.h; set by the builder from
// chunk_tiles_kind() on a CPU tape, CHUNK_TILES_FP32 on a GPU one, where
// the chunked forward sets it to cu_bf16_products(): 1, CHUNK_TILES_BF16,
// for its bf16 instance), so that the backward rounds as its forward did.
// saved: (B, H, NC, dk, dv) the state entering each chunk of C positions,
// NC = ceil(T/C), written by the forward of either form and read by its
// backward. aux: first (B, T) of the documents (docs.h), or NULL.
#ifndef KDA_NODE_H
#define KDA_NODE_H

enum { KDA_IN_Q, KDA_IN_K, KDA_IN_V, KDA_IN_BETA, KDA_IN_G, KDA_IN_S0, KDA_N_IN };
enum { KDA_ARG_B, KDA_ARG_T, KDA_ARG_H, KDA_ARG_DK, KDA_ARG_DV, KDA_ARG_C, KDA_ARG_BF16 };

// Rows per sub-block of a chunk's decayed products (kda_sub_products; on
// the GPU under bf16, kda_chunk.cu's kda_prep_sub_bf16). The decays of a
// sub-block's rows i against a column j go through its first row r:
// exp(Gamma_i - Gamma_j) = exp(Gamma_i - Gamma_r) exp(Gamma_r - Gamma_j).
// For j < r both exponents are <= 0; for r <= j (inside the sub-block) the
// second is >= 0, at most the channel's span Gamma_r - Gamma_{last row}, and
// a channel takes that route only where its span is at most KDA_SPAN_MAX;
// the others take one exp per element of Gamma_i - Gamma_j <= 0
// (docs/kda.md, "Numerics"). As fla's kernels, 16 rows.
#define KDA_SUB 16
#define KDA_SPAN_MAX 30.0

// op_gdn's node code serves op_kda's (delta_rule_op builds both; the GPU
// reuses gdn_args and the gradient plans), so every index must be op_gdn's.
#include "gdn_node.h"
#ifdef __cplusplus
#define KDA_STATIC_ASSERT static_assert
#else
#define KDA_STATIC_ASSERT _Static_assert
#endif
#define KDA_AT_GDN(x) ((int)KDA_##x == (int)GDN_##x)   // the two enums are distinct types
KDA_STATIC_ASSERT(KDA_AT_GDN(IN_Q) && KDA_AT_GDN(IN_K) && KDA_AT_GDN(IN_V) && KDA_AT_GDN(IN_BETA) &&
                      KDA_AT_GDN(IN_G) && KDA_AT_GDN(IN_S0) && KDA_AT_GDN(N_IN),
                  "op_kda's inputs must sit where op_gdn's do");
KDA_STATIC_ASSERT(KDA_AT_GDN(ARG_B) && KDA_AT_GDN(ARG_T) && KDA_AT_GDN(ARG_H) && KDA_AT_GDN(ARG_DK) &&
                      KDA_AT_GDN(ARG_DV) && KDA_AT_GDN(ARG_C) && KDA_AT_GDN(ARG_BF16),
                  "op_kda's sizes and bf16 kind must sit where op_gdn's do");
#undef KDA_AT_GDN
#undef KDA_STATIC_ASSERT

#endif

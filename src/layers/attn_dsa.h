// attn_dsa.h: the `attn_dsa` mixer's controls beyond MixerKind (attn_dsa.c).
//
// Three modes (attn_dsa_set_mode):
//   DSA_SPARSE     (default) every query attends to the topk positions its
//                  indexer picks; the indexer runs without a graph.
//   DSA_DISTILL    the attention runs dense (the main model as trained) and the
//                  forward records the KL of the indexer against the
//                  head-averaged dense attention over all s <= t (stage 1:
//                  indexer-only fine-tuning, the rest frozen). Decoding in this
//                  mode attends densely too (the dense baseline).
//   DSA_SPARSE_KL  sparse attention as in DSA_SPARSE, and the forward records
//                  the KL restricted to the selected positions (dsa_sel_kl.h),
//                  which reaches only the indexer weights (stage 2: the whole
//                  model trains with sparse attention).
// The KL is the caller's to add to the objective (lm.h collects it).
#ifndef ATTN_DSA_H
#define ATTN_DSA_H

#include "mixer.h"

typedef enum { DSA_SPARSE, DSA_DISTILL, DSA_SPARSE_KL, DSA_MODE_COUNT } DsaMode;

void attn_dsa_set_mode(Mixer *m, DsaMode mode);
DsaMode attn_dsa_mode(const Mixer *m);
// attn_dsa_set_mode(m, on ? DSA_DISTILL : DSA_SPARSE).
void attn_dsa_set_distill(Mixer *m, bool on);
// The last forward's KL, (1) on that forward's tape, or NULL in DSA_SPARSE mode.
Tensor *attn_dsa_last_kl(const Mixer *m);
// The last DSA_DISTILL forward's kept attention mass, mean_t sum_{s in Sel_t} p_ts.
double attn_dsa_last_mass(const Mixer *m);
// The indexer's weights: out[0] wq_idx (D, HI*dI), out[1] wk_idx (D, dI), out[2] ww_idx (D, HI).
void attn_dsa_indexer_params(const Mixer *m, Tensor *out[3]);

// Fill a decode cache of an `attn` or `attn_dsa` mixer with the keys and
// values (and indexer keys) of u (B, T0, D) at positions pos .. pos+T0-1, as
// T0 decode steps would, without computing the attention outputs (which the
// caller does not need: e.g. to time decoding at a long context). Advances
// the cache by T0. Runs in no-grad mode on tp.
void attn_cache_prefill(Tape *tp, const Mixer *m, void *cache, Tensor *u);

#endif

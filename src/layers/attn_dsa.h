// attn_dsa.h: the `attn_dsa` mixer's controls beyond MixerKind (attn_dsa.c).
//
// Normal mode: every query attends to the topk positions its indexer picks.
// Distillation mode: the attention runs dense (the main model as trained) and
// the forward records the KL loss of the indexer against the head-averaged
// attention; the caller adds it to the objective (with the main model's
// weights frozen, so only wq_idx, wk_idx, ww_idx move).
#ifndef ATTN_DSA_H
#define ATTN_DSA_H

#include "mixer.h"

void attn_dsa_set_distill(Mixer *m, bool on);
// The last forward's KL, (1) on that forward's tape, or NULL outside distillation.
Tensor *attn_dsa_last_kl(const Mixer *m);
// The last distillation forward's kept attention mass, mean_t sum_{s in Sel_t} p_ts.
double attn_dsa_last_mass(const Mixer *m);

#endif

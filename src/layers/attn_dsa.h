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

// Checking decoding against the parallel forward (generate --check). The
// selection is a discontinuous function of the scores: where a row's K-th and
// (K+1)-th scores are within rounding of each other, the step and the
// parallel forward, whose sums round differently, may pick different keys and
// their outputs then differ by far more than rounding. So the check replays
// the steps' picks in the parallel forward, which makes the outputs comparable
// everywhere, and checks the picks apart: each must be the forward's own top
// K up to scores within the check's tolerance of each other.
//
// attn_dsa_record(m, rec, n): every later sparse step and prefill window of a
// one-row cache writes its positions' selections (topk ints each, ascending,
// -1 padded) to rec + slot * topk; the caller fills rec (n rows) with
// DSA_REC_NONE first. A window that attends densely (topk >= its length)
// writes nothing: every candidate is picked there. NULL stops recording.
// attn_dsa_replay(m, rec, n): later sparse forwards of one row of T <= n
// positions attend over rec's recorded rows (a row never recorded keeps the
// forward's own) and report in attn_dsa_replay_report. NULL stops replaying.
#define DSA_REC_NONE (-2)

typedef struct DsaReplayReport {
    int64_t rows;     // recorded rows replayed
    int64_t differ;   // of them, rows whose recorded picks are not the forward's own
    double worst;     // the largest relative score gap of those: INFINITY for a pick that is not a candidate
    int64_t worst_row;
} DsaReplayReport;

void attn_dsa_record(Mixer *m, int *rec, int n_rows);
void attn_dsa_replay(Mixer *m, const int *rec, int n_rows);
// Since attn_dsa_replay: the rows replayed, how many differ, and by how much.
// A differing row's gap is max over the forward's own picks it lacks of the
// score minus min over its picks the forward lacks, in double from the
// forward's indexer inputs, relative to sum_j |w_j| |qI_j| . |kI_s| / sqrt(dI)
// of those keys (the size of a score's rounding, up to a factor of eps).
DsaReplayReport attn_dsa_replay_report(const Mixer *m);

#endif

// dsa_eval.h: how well the DeepSeek sparse-attention indexer stands in for
// dense attention (MODEL.md `attn_dsa`): the KL, the attention mass the top-k
// selection keeps, validation loss sparse versus dense, and decoding speed
// dense versus sparse at a long context.
#ifndef DSA_EVAL_H
#define DSA_EVAL_H

#include "batch.h"
#include "lm.h"

typedef struct DsaEval {
    double kl;           // mean over batches of the distillation loss (mean per-layer KL, all s <= t)
    double mass;         // mean over batches and layers of mean_t sum_{s in Sel_t} p_ts
    double val_sparse;   // validation loss with the attn_dsa layers attending to their top-k
    double val_dense;    // validation loss with dense attention (the main model as trained)
} DsaEval;

// Over the n_batches fixed validation batches (no-grad): one pass in
// DSA_DISTILL mode (dense loss, KL, mass) and one in DSA_SPARSE mode. Leaves
// the attn_dsa layers in `restore` mode.
void dsa_eval_run(Tape *tp, LM *lm, const Batcher *bt, int n_batches, int *x, int *y, int *doc, DsaMode restore,
                  DsaEval *out);

// Decoding tokens/s, one sequence after a context of ctx positions, dense
// (DSA_DISTILL: every attn_dsa layer attends to the whole cache) and sparse
// (DSA_SPARSE: top-k): the medians of DSA_DECODE_ROUNDS rounds of `steps`
// tokens each, dense and sparse rounds alternating after a warm-up. The
// attention caches are filled with the keys and values of random inputs
// (attn_cache_prefill: no attention is computed; decode time does not depend
// on what the keys are, beyond the top-k's bookkeeping); recurrent layers
// decode from their zero state. Leaves the attn_dsa layers in `restore` mode.
// dev: where the LM's parameters live (a GPU run decodes on its GPU).
#define DSA_DECODE_ROUNDS 7
void dsa_eval_decode_speed(LM *lm, Device dev, int ctx, int steps, uint64_t seed, DsaMode restore,
                           double *dense_tok_s, double *sparse_tok_s);

#endif

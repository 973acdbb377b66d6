// lm_decode_graph.h: a language model's decoding step (lm_step) replayed
// from a CUDA graph (docs/cuda.md "CUDA graphs"; generate --cuda-graph).
//
// A replay runs the captured step's kernels again with the same arguments
// and addresses; only the token ids are read afresh (copied from the host
// at every launch). So a step can be replayed only where nothing else about
// it changes from token to token. The recurrent mixers' steps: their states
// and convolution windows are updated in place on the device, the same
// addresses every token. attn's step on a GPU: its cache's length lives in
// device memory, where its kernels read it (the slot of the new key and
// value, RoPE's position, the keys to attend to) and advance it; its
// launches are sized for the whole cache (DeviceKernels.attn_step). The
// host's copies of the lengths are moved on after each replay
// (MixerKind.step_advance). attn_dsa's step picks its keys on the host: a
// model with an attn_dsa layer decodes eagerly (lm_decode_graph_refusal).
//
// The step is captured once the tape's device arena has settled (the same
// block two steps in a row: every address of the step is in it) and
// replayed while it and the cache stay the same (the same block, not only
// the same address: arena_settled). A capture that fails (a
// host read or an allocation inside the step) turns graphs off with one
// message; the step then runs eagerly and nothing is lost.
#ifndef AG_LM_DECODE_GRAPH_H
#define AG_LM_DECODE_GRAPH_H

#include "lm.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct LMDecodeGraph {
    CuGraph *g;                // NULL: every step runs eagerly
    bool off;                  // a capture failed: eagerly from then on
    bool quiet;                // no line on stderr when a capture fails
    char why[256];             // why graphs are off (empty while on)
    int *tok;                  // (B) the step's ids: the graph's bound input
    int B;
    const real *logits;        // the captured step's logits (B, 1, V) on the device
    ArenaMark block, prev;     // the captured step's arena block, the last eager step's
    const LMCache *cache;      // the captured step's cache
    int64_t replays, captures, eager;   // steps of each kind
} LMDecodeGraph;

// Why lm's steps cannot be replayed from a graph (its first layer of a kind
// that keeps what changes per token on the host), NULL when they can.
const char *lm_decode_graph_refusal(const LM *lm, char *why, size_t n);
// on: graphs where d has them and lm's steps can be replayed (else every
// step eagerly, silently: the caller checks lm_decode_graph_refusal first
// where `on` was asked for).
void lm_decode_graph_init(LMDecodeGraph *dg, const LM *lm, Device d, bool on);
void lm_decode_graph_free(LMDecodeGraph *dg);
// lm_step(tp, lm, c, tokens) (tokens: c->B ids), from the graph when it
// can be; its logits (c->B, 1, V) copied into the host array `logits`, then
// the tape reset. The same bits as lm_step.
void lm_decode_graph_step(LMDecodeGraph *dg, Tape *tp, LM *lm, LMCache *c, const int *tokens, real *logits);

#ifdef __cplusplus
}
#endif
#endif

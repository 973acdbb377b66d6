// lm_graph.h: a language model's training micro-batch (forward, loss,
// backward into the parameters' gradients) replayed from a CUDA graph
// (docs/cuda.md "CUDA graphs"; [train] cuda_graph).
//
// A replay is valid only if every host-side decision of building the tape
// is the one of the captured micro-batch. Those that depend on the batch are
// made from a key: the documents' flags (the documents' index, RoPE positions,
// convolution and attention masks are made from them on the host), the
// number of counted targets (the loss's divisor), the tape's device block
// (every address of the graph is in it; the block itself, not its address:
// arena_settled) and the shapes and carry. A
// micro-batch whose key is the graph's is replayed; another runs eagerly,
// and a key seen twice in a row is captured (so packed documents that differ
// every step run eagerly, at the eager speed). The token ids and targets
// themselves are refreshed from the caller's arrays before each launch, and
// the embedding's backward sorts the ids on the device when captured.
// A capture that fails (a host read or synchronisation inside it) turns
// graphs off for the rest of the run with one message; nothing stops.
#ifndef AG_LM_GRAPH_H
#define AG_LM_GRAPH_H

#include "lm.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct LMGraphKey {
    int B, T, count;           // shapes, targets >= 0
    bool docs;                 // doc flags given (then `doc` holds them)
    ArenaMark block;           // the tape's device arena block (arena.h: an address may be another block's)
    const LMCache *carry;
    const int *x, *y;          // the bound arrays
} LMGraphKey;

typedef struct LMGraph {
    CuGraph *g;                // NULL: every micro-batch runs eagerly
    bool off;                  // a capture failed: eagerly from then on
    char why[256];             // why graphs are off (empty while on)
    real *loss_dev;            // (1) the captured loss, read after each launch
    LMGraphKey key, prev;      // the captured graph's key, the last micro-batch's
    int *key_doc, *prev_doc;   // their doc flags (B*T)
    bool have_key, have_prev;
    bool quiet;                // no line on stderr when a capture fails
    int64_t replays, captures, eager;   // micro-batches of each kind
} LMGraph;

// on: graphs where the tape's device has them (a CPU tape: eagerly, silently).
void lm_graph_init(LMGraph *gr, Device d, bool on);
void lm_graph_free(LMGraph *gr);
// One micro-batch of lm_loss_docs (or lm_loss_carry when carry is not NULL),
// its backward into the parameters' gradients and tape_reset; returns the
// loss. The same bits as the eager micro-batch. x, y: (B*T) ids and targets;
// doc: (B*T) flags or NULL. A failed capture prints one line to stderr
// (unless gr->quiet) and leaves gr->off set, gr->why saying why.
double lm_graph_micro_batch(LMGraph *gr, Tape *tp, LM *lm, const int *x, const int *y, const int *doc, int B, int T,
                            LMCache *carry);

#ifdef __cplusplus
}
#endif
#endif

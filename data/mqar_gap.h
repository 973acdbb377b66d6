// mqar_gap.h: multi-query associative recall with a gap (mqar.h's task
// stretched to any length): the key-value pairs come first, the queries
// last, and filler fills everything between, so the distance from a pair to
// its query grows with the sequence:
//
//   k_1 v_1 .. k_N v_N | G filler tokens | q_1 a_1 .. q_Q a_Q
//
// A sequence of T + 1 tokens, G = T + 1 - 2 N - 2 Q. The N keys are
// distinct; the Q queries ask distinct keys among them, in random order, and
// each is followed by its value. Inputs are the first T tokens, targets the
// last T; only the Q answers are scored (the others are -1). Trained at one
// T, tested at longer ones, it measures recall across a gap never seen.
//
// Vocabulary: token 0 is not used; [1, 1 + MQAR_GAP_FILLER) filler (i.i.d.),
// then K = (V - 1 - MQAR_GAP_FILLER) / 2 keys and K values.
#ifndef DATA_MQAR_GAP_H
#define DATA_MQAR_GAP_H

#include "common.h"
#include "rng.h"

#define MQAR_GAP_FILLER 16

typedef struct MqarGapSpec {
    int vocab;       // V
    int n_pairs;     // N key-value pairs at the start
    int n_queries;   // Q queries at the end, 1 <= Q <= N
    int T;           // inputs per sequence
} MqarGapSpec;

// Checks that the keys are distinct and that pairs and queries fit in T + 1.
Status mqar_gap_check(const MqarGapSpec *s);
// The filler tokens between the last pair and the first query: T + 1 - 2N - 2Q.
int mqar_gap_length(const MqarGapSpec *s);
// The first key token and the number of keys K (values are the K tokens after the keys).
int mqar_gap_first_key(const MqarGapSpec *s);
int mqar_gap_keys(const MqarGapSpec *s);
// x, y: (B, T) inputs and targets.
void mqar_gap_batch(const MqarGapSpec *s, Rng *rng, int B, int *x, int *y);

#endif

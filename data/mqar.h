// mqar.h: multi-query associative recall (MQAR), the synthetic task that
// separates mixers by how much they can store and retrieve (Arora et al.,
// "Zoology", 2023).
//
// A sequence of T + 1 tokens: first n_pairs key-value pairs
//   k_1 v_1 k_2 v_2 ... k_n v_n
// (keys distinct, from [1, V/2); values from [V/2, V)), then queries to the
// end: a key drawn from the pairs, followed by its value. Inputs are the
// first T tokens and targets the last T; only targets that are the value of
// a query are scored (the others are -1, which the cross-entropy ignores).
// Token 0 pads an odd tail.
#ifndef DATA_MQAR_H
#define DATA_MQAR_H

#include "common.h"
#include "rng.h"

typedef struct MqarSpec {
    int vocab;      // V: keys in [1, V/2), values in [V/2, V)
    int n_pairs;    // key-value pairs stored before the queries
    int T;          // inputs per sequence
} MqarSpec;

// Checks that the pairs fit: distinct keys, and room for at least n_pairs queries.
Status mqar_check(const MqarSpec *s);
// x, y: (B, T) inputs and targets; the queries' value targets are >= V/2, the rest -1.
void mqar_batch(const MqarSpec *s, Rng *rng, int B, int *x, int *y);

#endif

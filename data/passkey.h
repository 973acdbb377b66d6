// passkey.h: passkey retrieval (Mohtashami & Jaggi, "Landmark Attention",
// 2023), the synthetic test of whether a model finds one fact hidden at any
// depth of a long context. Here in tokens of its own vocabulary:
//
//   filler ... KEY d_1 .. d_n filler ... QUERY d_1 .. d_n
//
// A sequence of T + 1 tokens: i.i.d. filler tokens, with the passkey (the
// marker KEY and n digits) inserted at a chosen depth of the filler, and at
// the end the question (the marker QUERY) followed by the passkey again.
// Inputs are the first T tokens, targets the last T; only the n targets that
// spell the answer (after QUERY) are scored, the others are -1 (ignored by
// the cross-entropy). With the digits teacher-forced, the passkey is
// retrieved when all n are predicted (argmax) right.
//
// Depth: the fraction of the filler before the passkey, 0 = at the start of
// the sequence (as far from the question as it gets), 1 = just before the
// question; the KEY marker sits at position round(depth * F) with
// F = T + 1 - 2 (n + 1) filler tokens in all.
#ifndef DATA_PASSKEY_H
#define DATA_PASSKEY_H

#include "common.h"
#include "rng.h"

enum {
    PASSKEY_KEY = 1,        // the marker before the hidden passkey
    PASSKEY_QUERY = 2,      // the marker of the question
    PASSKEY_DIGIT0 = 3,     // digits 0..9 are tokens 3..12
    PASSKEY_FILLER0 = 13    // filler tokens are [13, vocab); token 0 is not used
};

typedef struct PasskeySpec {
    int vocab;      // V >= 14
    int n_digits;   // n: digits of the passkey
    int T;          // inputs per sequence
} PasskeySpec;

// Checks the vocabulary and that the passkey and the question fit in T + 1.
Status passkey_check(const PasskeySpec *s);
// x, y: (B, T) inputs and targets. depth in [0, 1], or negative: uniform at
// random per sequence (training). key_pos (B) or NULL: the position of KEY.
void passkey_batch(const PasskeySpec *s, Rng *rng, int B, double depth, int *x, int *y, int *key_pos);

#endif

#include "passkey.h"

#include <math.h>
#include <stdlib.h>

Status passkey_check(const PasskeySpec *s) {
    if (s->vocab < PASSKEY_FILLER0 + 1)
        return status_err("passkey: vocab %d leaves no filler token (markers and digits take %d)", s->vocab,
                          PASSKEY_FILLER0);
    if (s->n_digits < 1) return status_err("passkey: %d digits: need at least 1", s->n_digits);
    if (s->T + 1 < 2 * (s->n_digits + 1))
        return status_err("passkey: T = %d has no room for a passkey of %d digits and its question", s->T,
                          s->n_digits);
    return status_ok();
}

void passkey_batch(const PasskeySpec *s, Rng *rng, int B, double depth, int *x, int *y, int *key_pos) {
    int n = s->n_digits, L = s->T + 1, F = L - 2 * (n + 1);
    int *seq = xmalloc((size_t)L * sizeof(int));
    int *digits = xmalloc((size_t)n * sizeof(int));
    int n_filler = s->vocab - PASSKEY_FILLER0;
    for (int b = 0; b < B; b++) {
        double d = depth < 0 ? rng_uniform(rng) : depth;
        int p = (int)lround(d * F);   // filler tokens before the passkey
        if (p < 0) p = 0;
        if (p > F) p = F;
        for (int i = 0; i < n; i++) digits[i] = PASSKEY_DIGIT0 + (int)rng_below(rng, 10);
        int t = 0;
        for (int i = 0; i < F; i++) {
            if (i == p) {
                seq[t++] = PASSKEY_KEY;
                for (int j = 0; j < n; j++) seq[t++] = digits[j];
            }
            seq[t++] = PASSKEY_FILLER0 + (int)rng_below(rng, (uint64_t)n_filler);
        }
        if (p == F) {
            seq[t++] = PASSKEY_KEY;
            for (int j = 0; j < n; j++) seq[t++] = digits[j];
        }
        seq[t++] = PASSKEY_QUERY;
        for (int j = 0; j < n; j++) seq[t++] = digits[j];
        if (key_pos) key_pos[b] = p;
        for (int i = 0; i < s->T; i++) {
            x[b * s->T + i] = seq[i];
            y[b * s->T + i] = i >= s->T - n ? seq[i + 1] : -1;   // the answer: the n tokens after QUERY
        }
    }
    free(seq);
    free(digits);
}

#include "mqar.h"

#include <stdlib.h>

Status mqar_check(const MqarSpec *s) {
    if (s->vocab < 4) return status_err("mqar: vocab %d is too small", s->vocab);
    if (s->n_pairs < 1 || s->n_pairs > s->vocab / 2 - 1)
        return status_err("mqar: %d pairs need %d distinct keys, the vocabulary has %d", s->n_pairs, s->n_pairs,
                          s->vocab / 2 - 1);
    if (s->T + 1 < 4 * s->n_pairs)
        return status_err("mqar: T = %d leaves no room for %d queries after %d pairs", s->T, s->n_pairs, s->n_pairs);
    return status_ok();
}

void mqar_batch(const MqarSpec *s, Rng *rng, int B, int *x, int *y) {
    int half = s->vocab / 2, N = s->n_pairs, L = s->T + 1;
    int *seq = xmalloc((size_t)L * sizeof(int));
    int *keys = xmalloc((size_t)(half - 1) * sizeof(int));
    int *vals = xmalloc((size_t)N * sizeof(int));
    bool *scored = xmalloc((size_t)L * sizeof(bool));
    for (int b = 0; b < B; b++) {
        // Distinct keys: a partial Fisher-Yates shuffle of [1, half).
        for (int i = 0; i < half - 1; i++) keys[i] = i + 1;
        for (int i = 0; i < N; i++) {
            int j = i + (int)rng_below(rng, (uint64_t)(half - 1 - i));
            int t = keys[i];
            keys[i] = keys[j];
            keys[j] = t;
            vals[i] = half + (int)rng_below(rng, (uint64_t)(s->vocab - half));
        }
        int p = 0;
        for (int i = 0; i < N; i++) {
            scored[p] = false, seq[p++] = keys[i];
            scored[p] = false, seq[p++] = vals[i];
        }
        while (p + 1 < L) {
            int i = (int)rng_below(rng, (uint64_t)N);
            scored[p] = false, seq[p++] = keys[i];
            scored[p] = true, seq[p++] = vals[i];
        }
        if (p < L) scored[p] = false, seq[p++] = 0;
        for (int t = 0; t < s->T; t++) {
            x[b * s->T + t] = seq[t];
            y[b * s->T + t] = scored[t + 1] ? seq[t + 1] : -1;
        }
    }
    free(seq);
    free(keys);
    free(vals);
    free(scored);
}

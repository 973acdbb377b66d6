#include "mqar_gap.h"

#include <stdlib.h>

int mqar_gap_length(const MqarGapSpec *s) { return s->T + 1 - 2 * s->n_pairs - 2 * s->n_queries; }
int mqar_gap_first_key(const MqarGapSpec *s) { return 1 + MQAR_GAP_FILLER; }
int mqar_gap_keys(const MqarGapSpec *s) { return (s->vocab - 1 - MQAR_GAP_FILLER) / 2; }

Status mqar_gap_check(const MqarGapSpec *s) {
    int K = mqar_gap_keys(s);
    if (s->n_pairs < 1 || s->n_pairs > K)
        return status_err("mqar_gap: %d pairs need %d distinct keys, vocab %d has %d", s->n_pairs, s->n_pairs,
                          s->vocab, K > 0 ? K : 0);
    if (s->n_queries < 1 || s->n_queries > s->n_pairs)
        return status_err("mqar_gap: %d queries: need 1 to %d (one per pair)", s->n_queries, s->n_pairs);
    if (mqar_gap_length(s) < 0)
        return status_err("mqar_gap: T = %d has no room for %d pairs and %d queries", s->T, s->n_pairs,
                          s->n_queries);
    return status_ok();
}

void mqar_gap_batch(const MqarGapSpec *s, Rng *rng, int B, int *x, int *y) {
    int N = s->n_pairs, Q = s->n_queries, L = s->T + 1, G = mqar_gap_length(s);
    int K = mqar_gap_keys(s), key0 = mqar_gap_first_key(s);
    int *seq = xmalloc((size_t)L * sizeof(int));
    int *keys = xmalloc((size_t)K * sizeof(int));
    int *vals = xmalloc((size_t)N * sizeof(int));
    int *order = xmalloc((size_t)N * sizeof(int));
    for (int b = 0; b < B; b++) {
        // Distinct keys: a partial Fisher-Yates shuffle of the K keys.
        for (int i = 0; i < K; i++) keys[i] = key0 + i;
        for (int i = 0; i < N; i++) {
            int j = i + (int)rng_below(rng, (uint64_t)(K - i));
            int t = keys[i];
            keys[i] = keys[j];
            keys[j] = t;
            vals[i] = key0 + K + (int)rng_below(rng, (uint64_t)K);
            order[i] = i;
        }
        // Which pairs are asked, in which order: another partial shuffle.
        for (int i = 0; i < Q; i++) {
            int j = i + (int)rng_below(rng, (uint64_t)(N - i));
            int t = order[i];
            order[i] = order[j];
            order[j] = t;
        }
        int p = 0;
        for (int i = 0; i < N; i++) seq[p++] = keys[i], seq[p++] = vals[i];
        for (int i = 0; i < G; i++) seq[p++] = 1 + (int)rng_below(rng, MQAR_GAP_FILLER);
        for (int i = 0; i < Q; i++) seq[p++] = keys[order[i]], seq[p++] = vals[order[i]];
        for (int t = 0; t < s->T; t++) {
            x[b * s->T + t] = seq[t];
            // Scored: the targets after a query's key, i.e. at inputs L - 2Q + 2i (the answers at L - 2Q + 2i + 1).
            bool answer = t >= L - 2 * Q && (t - (L - 2 * Q)) % 2 == 0;
            y[b * s->T + t] = answer ? seq[t + 1] : -1;
        }
    }
    free(seq);
    free(keys);
    free(vals);
    free(order);
}

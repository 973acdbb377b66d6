// The synthetic long-range tasks (data/passkey.h, data/mqar_gap.h): each
// generator produces what it claims: the passkey at the asked depth and
// repeated after the question, only the answer scored, MQAR's gap growing as
// T + 1 - 2N - 2Q, every token in its range, the same batch from the same
// seed, and bad specs refused.
#include <stdlib.h>
#include <string.h>

#include "mqar_gap.h"
#include "passkey.h"
#include "test_util.h"

// The full sequence (T + 1 tokens) of row b: the inputs and the last target.
static void row_sequence(const int *x, const int *y, int T, int b, int *seq) {
    memcpy(seq, x + b * T, (size_t)T * sizeof(int));
    seq[T] = y[b * T + T - 1];
}

Test(longctx_tasks, passkey_sits_at_the_asked_depth) {
    PasskeySpec s = {32, 5, 199};
    cr_assert(passkey_check(&s).ok);
    enum { B = 3, T = 199 };
    int F = T + 1 - 2 * (s.n_digits + 1);   // 188 filler tokens
    const double depths[] = {0, 0.25, 0.5, 1};
    for (size_t k = 0; k < sizeof depths / sizeof depths[0]; k++) {
        int x[B * T], y[B * T], key_pos[B], seq[T + 1];
        Rng r;
        rng_seed(&r, 3 + k);
        passkey_batch(&s, &r, B, depths[k], x, y, key_pos);
        int want_pos = (int)(depths[k] * F + 0.5);
        for (int b = 0; b < B; b++) {
            row_sequence(x, y, T, b, seq);
            cr_assert_eq(key_pos[b], want_pos, "depth %g: KEY at %d", depths[k], key_pos[b]);
            int keys = 0, queries = 0;
            for (int t = 0; t <= T; t++) {
                keys += seq[t] == PASSKEY_KEY;
                queries += seq[t] == PASSKEY_QUERY;
            }
            cr_assert(keys == 1 && queries == 1, "one KEY and one QUERY (%d, %d)", keys, queries);
            cr_assert_eq(seq[want_pos], PASSKEY_KEY, "depth %g", depths[k]);
            int q = T - s.n_digits;   // QUERY's position: the last n + 1 tokens are the question and answer
            cr_assert_eq(seq[q], PASSKEY_QUERY);
            for (int j = 1; j <= s.n_digits; j++) {
                int d = seq[want_pos + j];
                cr_assert(d >= PASSKEY_DIGIT0 && d < PASSKEY_DIGIT0 + 10, "a digit after KEY: %d", d);
                cr_assert_eq(seq[q + j], d, "the answer repeats the passkey (digit %d)", j);
            }
            for (int t = 0; t <= T; t++) {
                bool in_key = t >= want_pos && t <= want_pos + s.n_digits, in_answer = t >= q;
                if (!in_key && !in_answer)
                    cr_assert(seq[t] >= PASSKEY_FILLER0 && seq[t] < s.vocab, "filler at %d: %d", t, seq[t]);
            }
            // Only the answer is scored: the targets of QUERY and the first n - 1 answer digits.
            for (int t = 0; t < T; t++) {
                int yt = y[b * T + t];
                if (t >= q) cr_assert_eq(yt, seq[t + 1], "answer target at %d", t);
                else cr_assert_eq(yt, -1, "target %d is scored outside the answer", t);
            }
        }
    }
    // Random depth: every position in [0, F] can come, the same batch from the same seed.
    int x[64 * T], y[64 * T], pos[64], x2[64 * T], y2[64 * T], pos2[64];
    Rng r;
    rng_seed(&r, 11);
    passkey_batch(&s, &r, 64, -1, x, y, pos);
    int lo = F, hi = 0;
    for (int b = 0; b < 64; b++) lo = pos[b] < lo ? pos[b] : lo, hi = pos[b] > hi ? pos[b] : hi;
    cr_assert(lo < F / 4 && hi > 3 * F / 4, "random depths spread: %d..%d of %d", lo, hi, F);
    rng_seed(&r, 11);
    passkey_batch(&s, &r, 64, -1, x2, y2, pos2);
    cr_assert(!memcmp(x, x2, sizeof x) && !memcmp(y, y2, sizeof y) && !memcmp(pos, pos2, sizeof pos));
    rng_seed(&r, 12);
    passkey_batch(&s, &r, 64, -1, x2, y2, pos2);
    cr_assert(memcmp(x, x2, sizeof x), "another seed, another batch");
}

Test(longctx_tasks, passkey_bad_specs_are_refused) {
    PasskeySpec small_vocab = {13, 2, 64}, no_digits = {32, 0, 64}, too_short = {32, 5, 10};
    Status st = passkey_check(&small_vocab);
    cr_assert(!st.ok && strstr(st.msg, "no filler"), "got: %s", st.msg);
    st = passkey_check(&no_digits);
    cr_assert(!st.ok && strstr(st.msg, "0 digits"), "got: %s", st.msg);
    st = passkey_check(&too_short);
    cr_assert(!st.ok && strstr(st.msg, "T = 10"), "got: %s", st.msg);
    PasskeySpec tight = {32, 5, 11};   // 12 tokens: KEY + 5 digits, QUERY + 5 digits, no filler
    cr_assert(passkey_check(&tight).ok);
    int x[11], y[11], pos;
    Rng r;
    rng_seed(&r, 1);
    passkey_batch(&tight, &r, 1, 0.5, x, y, &pos);
    cr_assert(pos == 0 && x[0] == PASSKEY_KEY && x[6] == PASSKEY_QUERY);
}

Test(longctx_tasks, mqar_gap_grows_with_the_length) {
    enum { B = 2 };
    const int lengths[] = {39, 255, 1023};
    for (size_t k = 0; k < sizeof lengths / sizeof lengths[0]; k++) {
        MqarGapSpec s = {64, 8, 4, lengths[k]};
        cr_assert(mqar_gap_check(&s).ok);
        int T = s.T, G = mqar_gap_length(&s);
        cr_assert_eq(G, T + 1 - 16 - 8);
        int K = mqar_gap_keys(&s), key0 = mqar_gap_first_key(&s);
        cr_assert(K == (64 - 17) / 2 && key0 == 17);
        int *x = malloc((size_t)B * T * sizeof(int)), *y = malloc((size_t)B * T * sizeof(int));
        int *seq = malloc((size_t)(T + 1) * sizeof(int));
        Rng r;
        rng_seed(&r, 5);
        mqar_gap_batch(&s, &r, B, x, y);
        for (int b = 0; b < B; b++) {
            row_sequence(x, y, T, b, seq);
            int value_of[64], asked[64] = {0};
            memset(value_of, -1, sizeof value_of);
            for (int i = 0; i < s.n_pairs; i++) {
                int key = seq[2 * i], v = seq[2 * i + 1];
                cr_assert(key >= key0 && key < key0 + K && v >= key0 + K && v < key0 + 2 * K, "pair %d: %d %d", i,
                          key, v);
                cr_assert_eq(value_of[key], -1, "keys are distinct");
                value_of[key] = v;
            }
            // The gap: exactly G filler tokens between the last pair and the first query.
            int first_query = 2 * s.n_pairs + G;
            for (int t = 2 * s.n_pairs; t < first_query; t++)
                cr_assert(seq[t] >= 1 && seq[t] <= MQAR_GAP_FILLER, "T %d: filler at %d: %d", T, t, seq[t]);
            cr_assert_eq(first_query, T + 1 - 2 * s.n_queries);
            int scored = 0;
            for (int i = 0; i < s.n_queries; i++) {
                int key = seq[first_query + 2 * i];
                cr_assert(value_of[key] >= 0 && !asked[key], "query %d asks a stored key once", i);
                asked[key] = 1;
                cr_assert_eq(seq[first_query + 2 * i + 1], value_of[key]);
            }
            for (int t = 0; t < T; t++) {
                int yt = y[b * T + t];
                if (yt < 0) continue;
                scored++;
                cr_assert(t >= first_query && (t - first_query) % 2 == 0, "T %d: only answers scored (t = %d)", T, t);
                cr_assert_eq(yt, value_of[seq[t]], "an answer is its key's value");
            }
            cr_assert_eq(scored, s.n_queries);
        }
        // Same seed, same batch.
        int *x2 = malloc((size_t)B * T * sizeof(int)), *y2 = malloc((size_t)B * T * sizeof(int));
        rng_seed(&r, 5);
        mqar_gap_batch(&s, &r, B, x2, y2);
        cr_assert(!memcmp(x, x2, (size_t)B * T * sizeof(int)) && !memcmp(y, y2, (size_t)B * T * sizeof(int)));
        free(x), free(y), free(x2), free(y2), free(seq);
    }
}

Test(longctx_tasks, mqar_gap_bad_specs_are_refused) {
    MqarGapSpec too_many = {40, 12, 4, 255}, no_query = {64, 8, 0, 255}, more_queries = {64, 4, 5, 255},
                too_short = {64, 8, 8, 30};
    Status st = mqar_gap_check(&too_many);
    cr_assert(!st.ok && strstr(st.msg, "12 pairs"), "got: %s", st.msg);
    st = mqar_gap_check(&no_query);
    cr_assert(!st.ok && strstr(st.msg, "0 queries"), "got: %s", st.msg);
    st = mqar_gap_check(&more_queries);
    cr_assert(!st.ok && strstr(st.msg, "5 queries"), "got: %s", st.msg);
    st = mqar_gap_check(&too_short);
    cr_assert(!st.ok && strstr(st.msg, "T = 30"), "got: %s", st.msg);
    MqarGapSpec no_gap = {64, 8, 8, 31};
    cr_assert(mqar_gap_check(&no_gap).ok && mqar_gap_length(&no_gap) == 0);
}

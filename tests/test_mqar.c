// The MQAR generator: layout, scoring mask, determinism, bad specs.
#include <string.h>

#include "mqar.h"
#include "test_util.h"

Test(mqar, queries_recall_the_stored_values) {
    MqarSpec s = {64, 8, 63};
    cr_assert(mqar_check(&s).ok);
    int B = 3, x[3 * 63], y[3 * 63];
    Rng r;
    rng_seed(&r, 5);
    mqar_batch(&s, &r, B, x, y);
    for (int b = 0; b < B; b++) {
        const int *xb = x + b * s.T, *yb = y + b * s.T;
        int value_of[32];
        memset(value_of, -1, sizeof value_of);
        for (int i = 0; i < s.n_pairs; i++) {
            int k = xb[2 * i], v = xb[2 * i + 1];
            cr_assert(k >= 1 && k < 32 && v >= 32 && v < 64, "pair %d: %d %d", i, k, v);
            cr_assert_eq(value_of[k], -1, "keys are distinct");
            value_of[k] = v;
        }
        int scored = 0;
        for (int t = 0; t < s.T; t++) {
            if (yb[t] < 0) continue;
            scored++;
            cr_assert(t >= 2 * s.n_pairs, "no target scored inside the pairs (t = %d)", t);
            cr_assert_eq(yb[t], value_of[xb[t]], "a query's target is its key's value");
        }
        cr_assert_eq(scored, (s.T + 1 - 2 * s.n_pairs) / 2);
    }
    // Same seed, same batch.
    int x2[3 * 63], y2[3 * 63];
    rng_seed(&r, 5);
    mqar_batch(&s, &r, B, x2, y2);
    cr_assert(memcmp(x, x2, sizeof x) == 0 && memcmp(y, y2, sizeof y) == 0);
}

Test(mqar, bad_specs_are_refused) {
    MqarSpec too_many = {16, 8, 63}, too_short = {64, 8, 20};
    Status s = mqar_check(&too_many);
    cr_assert(!s.ok && strstr(s.msg, "8 pairs"), "got: %s", s.msg);
    s = mqar_check(&too_short);
    cr_assert(!s.ok && strstr(s.msg, "T = 20"), "got: %s", s.msg);
}

// bpe_merges.c: the merge list of a rank table (bpe_merges.h).
#include "bpe_merges.h"

#include <stdlib.h>

#include "bpe_impl.h"

// tiktoken's merging of p[0..n) with only the ranks below max_rank: part
// boundaries into at[0..k] (at[0] = 0, at[k] = n); returns k, the parts.
static int merge_below(const Bpe *b, const uint8_t *p, int n, int max_rank, int *at) {
    int k = n;
    for (int i = 0; i <= n; i++) at[i] = i;
    for (;;) {
        int best = -1, best_rank = max_rank;
        for (int i = 0; i + 1 < k; i++) {
            int r = bpe_rank_of(b, p + at[i], at[i + 2] - at[i]);
            if (r >= 0 && r < best_rank) best = i, best_rank = r;   // the leftmost on a tie
        }
        if (best < 0) return k;
        for (int i = best + 1; i < k; i++) at[i] = at[i + 1];
        k--;
    }
}

int bpe_merges(const Bpe *b, int *left, int *right) {
    int *at = xmalloc((BPE_TOKEN_MAX + 1) * sizeof *at);
    int unmade = 0;
    for (int id = 0; id < b->vocab; id++) {
        left[id] = right[id] = -1;
        if (b->kind[id] != BPE_ID_RANK || b->len[id] < 2) continue;
        const uint8_t *p = b->blob + b->off[id];
        if (merge_below(b, p, b->len[id], id, at) != 2) {
            unmade++;
            continue;
        }
        left[id] = bpe_rank_of(b, p, at[1]);
        right[id] = bpe_rank_of(b, p + at[1], b->len[id] - at[1]);
    }
    free(at);
    return unmade;
}

int bpe_rank(const Bpe *b, const uint8_t *p, int len) { return len < 1 ? -1 : bpe_rank_of(b, p, len); }

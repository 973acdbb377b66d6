// docs.c: the index of document boundaries (docs.h).
#include "docs.h"

bool docs_first_fill(int *first, const int *doc_start, int B, int T) {
    bool any = false;
    for (int b = 0; b < B; b++) {
        int f = -1;
        for (int t = 0; t < T; t++) {
            int64_t r = (int64_t)b * T + t;
            if (doc_start && doc_start[r]) f = t, any = true;
            first[r] = f;
        }
    }
    return any;
}

int *docs_first(Tape *tp, const int *doc_start, int B, int T) {
    ASSERT(B >= 0 && T >= 0, "docs_first: B %d, T %d", B, T);
    if (!doc_start || B == 0 || T == 0) return NULL;
    int *first = tape_alloc(tp, (size_t)B * T * sizeof(int));
    return docs_first_fill(first, doc_start, B, T) ? first : NULL;
}

int *docs_end(Tape *tp, const int *first, int B, int T) {
    int *end = tape_alloc(tp, (size_t)imax(B * T, 1) * sizeof(int));
    for (int b = 0; b < B; b++) {
        int e = T;
        for (int t = T - 1; t >= 0; t--) {
            int64_t r = (int64_t)b * T + t;
            end[r] = e;
            if (first && first[r] == t) e = t;   // t begins a document: the one before ends here
        }
    }
    return end;
}

void docs_positions(int *pos, const int *first, int B, int T) {
    for (int64_t r = 0; r < (int64_t)B * T; r++) pos[r] = (int)(r % T) - docs_begin(first, r);
}

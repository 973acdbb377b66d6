// docs.h: document boundaries inside a packed batch.
//
// A batch row of T positions may hold several documents back to back. They
// are marked by doc_start (B, T), row-major like the token ids:
// doc_start[b*T + t] != 0 when position t of row b begins a new document.
// From such a position on, nothing reads anything before it: attention does
// not cross the boundary, a recurrent state and the short convolution's
// history start from zero, RoPE positions count from it. A flag at t = 0
// means the row's initial state (a recurrent mixer's s_in) is not read.
// doc_start = NULL, or an array without a flag, is one document per row:
// exactly the computation without documents, at no cost.
//
// Ops that take doc_start copy what they need into the tape's arena (the
// caller's array may change once the builder returns). Kernels read the
// derived index
//
//   first[b*T + t] = the position where the document holding (b, t) begins,
//                    or -1 when no flag lies in [0, t] (the document began
//                    before the window: the initial state is its history).
//
// and from it: the position inside the document, t - max(first, 0) (what
// RoPE rotates by); whether (b, t) reads the initial state, first < 0; and
// the end of the document, docs_end.
#ifndef AG_DOCS_H
#define AG_DOCS_H

#include "tape.h"

// first (B*T) of doc_start, on tp's arena; NULL when doc_start is NULL or
// flags no position (then every first would be -1: no boundary at all).
int *docs_first(Tape *tp, const int *doc_start, int B, int T);
// The same into a caller's buffer first (B*T); returns whether any position
// is flagged (first is filled either way).
bool docs_first_fill(int *first, const int *doc_start, int B, int T);
// end (B*T): one past the last position of the document holding (b, t)
// (the next flagged position after t, or T), on tp's arena.
int *docs_end(Tape *tp, const int *first, int B, int T);
// pos (B*T): the position of (b, t) inside its document, t - max(first, 0);
// t itself when first is NULL.
void docs_positions(int *pos, const int *first, int B, int T);

// The first position of (b, t)'s document that the window holds (0 for a
// document that began before the window), from first (or NULL).
static inline int docs_begin(const int *first, int64_t r) {
    return first && first[r] > 0 ? first[r] : 0;
}

#endif

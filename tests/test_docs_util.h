// test_docs_util.h: the checks the document-boundary tests share (test_docs_util.c).
//
// A function under test maps inputs to outputs over (B, T) rows that may
// hold several documents (docs.h). Its inputs are of three kinds:
//   DOCS_SEQ     (B, T, ...) tensors cut along time (q, k, v, g, u, x, ...);
//   DOCS_ROW     (B, ...) per-row tensors read by a row's first document only
//                (an initial state s0), may be NULL;
//   DOCS_SHARED  tensors every document reads whole (weights).
// Output 0 is (B, T, ...) along time; an optional output 1 is per row (B, ...)
// and belongs to the row's last document (a final state).
//
// "Packed equals separate": one call over the packed rows against one call
// per document (B = 1, T = its length, no boundaries), with the same random
// gradients seeded on the outputs: both outputs and the gradients of every
// input must agree (normwise, max_rel_diff) within a tolerance.
#ifndef TEST_DOCS_UTIL_H
#define TEST_DOCS_UTIL_H

#include "test_util.h"

typedef enum { DOCS_SEQ, DOCS_ROW, DOCS_SHARED } DocsInKind;

typedef struct DocsFn {
    // Build the outputs on tp; return how many (1 or 2). in[i] of kind
    // DOCS_ROW may be NULL; doc_start (B, T) or NULL.
    int (*fn)(Tape *tp, Tensor *const *in, const int *doc_start, void *ctx, Tensor **out);
    void *ctx;
    int n_in;
    const DocsInKind *kind;   // (n_in)
} DocsFn;

// Boundary patterns for B = 2 rows of T positions cut in chunks of C
// (T >= 2C + 3): row 0 starts documents at 0, at the chunk edge C, at C+1
// and C+2 (several in one chunk, documents of one position), at 2C+1 and at
// T-1 (the last position); row 1 does not flag 0 (its first document reads
// the initial state) and starts documents at 2, 3, at the chunk edge 2C and
// at T-2. Returns a heap array (B*T).
int *docs_pattern(int T, int C);

// The check above; labels name what failed. Gradients of every input that
// requires one are zeroed here first.
void docs_check_packed(const DocsFn *f, Tensor *const *in, const int *doc_start, int B, int T, double tol,
                       const char *label);

// One forward and backward of f with the boundaries doc_start on
// device_default()'s tape (gradcheck_run_seeds: seeds[k] for output k, NULL
// = not seeded): the outputs come back in out[k] (free them), the gradients
// in the inputs' grad. Returns the number of outputs.
int docs_run(const DocsFn *f, Tensor *const *in, const int *doc_start, const real *const *seeds, real **out,
             int64_t *out_n);
// A gradcheck (float64 central differences, the given options or the
// defaults) of f with the boundaries doc_start.
void docs_gradcheck(const DocsFn *f, Tensor *const *in, const int *doc_start, const GradcheckOptions *opt,
                    const char *label);

// Time steps [t0, t0+len) of x (B, T, ...) as a new leaf (requires_grad as x).
Tensor *docs_time_slice(const Tensor *x, int b, int t0, int len);

// ---- a recurrent mixer (mixer.h) as a DocsFn ----
// Its inputs: u (B, T, D) ~ N(0, 1) from seed, s0 (B, H, dk, dv) ~ N(0,
// 0.5^2) from seed + 1, then every parameter of ps (shared); its outputs:
// y = forward(u, doc_start, s0) and S_T.

// docs_gradcheck (opt, NULL: the default options) and docs_check_packed (tol)
// of m over those inputs (from seed) with the boundaries docs (B, T).
void docs_mixer_gradcheck(Mixer *m, const ParamStore *ps, int B, int T, uint64_t seed, const int *docs,
                          const GradcheckOptions *opt, const char *label);
void docs_mixer_check_packed(Mixer *m, const ParamStore *ps, int B, int T, uint64_t seed, const int *docs,
                             double tol, const char *label);
// A forward of m over those inputs (seed 5) with the boundaries docs and
// a backward seeded on both outputs (N(0, 1) from seeds 6 and 7): the
// outputs and the gradients of u, s0 and every parameter, copied out.
typedef struct DocsMixerRun {
    real *out[2], *grad, *du, *ds0;   // grad: ps->numel, in ps's order
    int64_t on[2];
} DocsMixerRun;
DocsMixerRun docs_mixer_run(Mixer *m, ParamStore *ps, int B, int T, const int *docs);
void docs_mixer_run_free(DocsMixerRun *r);
// Two such runs of one model (ps: its parameters, for their names) agree: both outputs, du, ds0 and every
// parameter's gradient within tol (max_rel_diff); label names the case in a failure.
void docs_mixer_runs_agree(const DocsMixerRun *a, const DocsMixerRun *b, const ParamStore *ps, double tol,
                           const char *label);
// m's forward_carry over consecutive windows of u (B, T, D) (lengths wins[0..n-1], summing to T, each at most
// 16) from a fresh CPU cache, against one forward over u with the boundaries docs (B, T): the largest
// max_rel_diff over a window's row (docs NULL: no boundaries). The cache is left in *cache (cache_free it).
double docs_mixer_carry_diff(Mixer *m, const Tensor *u, const int *docs, const int *wins, int n, void **cache);

#endif

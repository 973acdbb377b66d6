// test_util.h: helpers shared by the Criterion tests.
#ifndef TEST_UTIL_H
#define TEST_UTIL_H

#include <criterion/criterion.h>
#include <setjmp.h>
#include <stdint.h>
#include <string.h>
#include <sys/types.h>

#include "config.h"
#include "gradcheck.h"
#include "lm.h"
#include "ops.h"
#include "params.h"

// Fill with N(0, std^2) / uniform values from a fixed seed.
void fill_normal(Tensor *t, uint64_t seed, double std);
void fill_uniform(Tensor *t, uint64_t seed, double lo, double hi);
// An LM of 2 heads of d_head, tied head, norm eps 1e-6, on `layers`.
LMConfig test_lm_config(const char *layers, int vocab, int d_model, int d_ff, int d_head, int chunk, int conv);
// A tiny LM of the given layers (vocabulary 11, d_model 8, 2 heads of 4, d_ff 12, chunks of 4,
// convolutions of 3, DSA indexer 2 x 4 with top-3).
LMConfig test_tiny_lm_config(const char *layers);
// The bf16 step tests' model (CPU and GPU): wide enough (d_model 64, heads of
// 32, d_ff 160, bytes) that the projections are real products, tied head.
LMConfig test_bf16_lm_config(const char *layers);
// Every parameter element times (1 + rel u), u uniform in [-1, 1] from a fixed
// seed: weights moved as far as rounding them to a coarser format would.
void test_perturb_params(ParamStore *ps, double rel, uint64_t seed);
// A float's bit pattern and back (the vector exp tests compare bits).
static inline uint32_t float_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}
static inline float bits_float(uint32_t u) {
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}
// n standard normal values (fill_normal's) in a 64-byte aligned array (free()).
real *test_randn(int64_t n, uint64_t seed);
// Positions [t0, t0+len) of x (B, T, C) as a new leaf tensor (x's requires_grad).
Tensor *test_time_slice(const Tensor *x, int t0, int len);
// n ones, allocated (the seeds of a sum).
real *test_ones(int64_t n);
// Normalise each run of d values of x (the heads of a (B, T, H*d) tensor) to
// unit length, then scale it: q and k as the gdn layer feeds them to op_gdn.
void test_l2norm_rows(Tensor *x, int d, double scale);
// The one node of the op named `op` on tp (asserted: exactly one).
const Node *test_only_node(const Tape *tp, const char *op);
// op_kda's inputs x[0..5] = q, k, v, beta, g, s0, all taking gradients: q, k
// (B, T, H*dk) L2-normalised per head (q scaled by 1/sqrt(dk)) as the layer
// feeds them, v (B, T, H*dv) ~ N(0, 1), beta (B, T, H) a sigmoid of N(0, 1),
// s0 (B, H, dk, dv) ~ N(0, 0.5^2), input i from seed + 10 i; g (B, T, H*dk)
// holds N(0, 1) values for the caller to replace with its decay regime.
void test_kda_inputs(Tensor **x, int B, int T, int H, int dk, int dv, uint64_t seed);
// op_gla's inputs x[0..5] = q, k, v, g, dt, s0: q, k (B, T, H*dk) ~ N(0, 0.6^2),
// v (B, T, H*dv) ~ N(0, 1), g (B, T, H) ~ U[g_lo, g_hi], dt (B, T, H) ~
// U[0.3, 1.5], s0 (B, H, dk, dv) ~ N(0, 0.5^2), from seed + 1 .. seed + 6;
// q, k, v take gradients, g, dt, s0 when their flag says so.
void test_gla_inputs(Tensor **x, int B, int T, int H, int dk, int dv, bool grad_g, bool grad_dt, bool grad_s0,
                     double g_lo, double g_hi, uint64_t seed);

// Relative difference of two arrays, normwise: max_i |a_i - b_i| / max_i max(|a_i|, |b_i|).
// This is what "two forms agree to 1e-10 (float64) / 1e-4 (float32)" means in
// this project: rounding in a sum is relative to the size of what is summed,
// so an element near zero is compared on the array's scale. (An elementwise
// measure would call a one-ulp change of the largest float32 element near
// 1e-4 at a 1e-3 floor, i.e. make 1e-4 unreachable for correct code.)
double max_rel_diff(const real *a, const real *b, int64_t n);

// The mixer's forward of u (B, T, D) on device d (parameters already there)
// in no-grad mode: its output on the host (the caller frees it).
real *test_mixer_forward_host(Mixer *m, const Tensor *u, const int *doc_start, Device d);
// A copy of `bytes` of host memory in tp's device memory (tape_dalloc: freed
// with the tape): a kernel's inputs for its GPU twin.
void *test_dev_copy(Tape *tp, const void *host, size_t bytes);

// Decode parity on device_default() (AG_DEVICE=cuda: the GPU). A mixer's
// forward over u (B, T, D, host), then step() at every position from a fresh
// cache of max_T = T, each step's output of each row against the forward's
// row at that position by max_rel_diff; returns the worst, *worst_t
// (optional) its position. On the GPU the parameters move there for good
// (params_to_device): call it last on ps. (test_mixer_decode_docs_diff
// without documents.)
double test_mixer_decode_diff(Mixer *m, ParamStore *ps, const Tensor *u, int *worst_t);
// The same for an LM: lm_forward's logits over tokens (B*T) against
// lm_step's, compared over all B*T*V logits at once.
double test_lm_decode_diff(LM *lm, ParamStore *ps, const int *tokens, int B, int T);
// Decodes tokens (B, T) through lm (parameters on d already) on device d
// from a fresh cache, row 1 starting a new document at reset_at
// (lm_cache_reset_row; -1 or out of range: never): the step logits (T, B, V),
// allocated, on the host. With parallel: also lm_forward_docs's (B, T, V)
// over the same documents (lm_forward's when there is no reset).
real *test_lm_decode_logits(LM *lm, Device d, const int *tokens, int B, int T, int reset_at, real **parallel);
// The same with the documents doc_start (B, T) (NULL: none): row b's cache
// reset wherever it flags position t, the parallel forward lm_forward_docs.
real *test_lm_decode_logits_docs(LM *lm, Device d, const int *tokens, const int *doc_start, int B, int T,
                                 real **parallel);
// A mixer decoded step by step on device_default() (parameters moved there)
// from a fresh cache, row b's cache reset wherever doc_start (B, T) flags
// position t (NULL: never), against the parallel forward with the same
// documents: the largest max_rel_diff over one (position, row)'s outputs;
// *worst_t, *worst_b (may be NULL) say where.
double test_mixer_decode_docs_diff(Mixer *m, ParamStore *ps, const Tensor *u, const int *doc_start, int *worst_t,
                                   int *worst_b);

// Assert a gradcheck passed; Criterion prints the label and the worst element.
#define ASSERT_GRADCHECK(res, label)                                                                \
    cr_assert((res).passed, "%s: gradcheck max rel err %.3e (input %d, element %lld: analytic %.12g, " \
                            "numeric %.12g)",                                                        \
              (label), (res).max_rel, (res).worst_input, (long long)(res).worst_index, (res).analytic, \
              (res).numeric)

// Catch an ASSERT failure inside the library: EXPECT_FAILURE(stmt) runs stmt
// and yields true iff it failed; the message is then in ag_last_error().
extern jmp_buf test_fail_jmp;
void test_fail_handler(const char *msg);
#define EXPECT_FAILURE(stmt)                                             \
    ({                                                                   \
        volatile bool failed_ = false;                                   \
        ag_set_fail_handler(test_fail_handler);                          \
        if (setjmp(test_fail_jmp) == 0) {                                \
            stmt;                                                        \
        } else {                                                         \
            failed_ = true;                                              \
        }                                                                \
        ag_set_fail_handler(NULL);                                       \
        failed_;                                                         \
    })

// A fresh folder holding corpus.txt, a small English-like text (fixed seed)
// for tiny training runs. Returns the folder (static storage).
const char *test_scratch_corpus(const char *tag);
// A resumed run's losses at steps [from, to) against the uninterrupted run's:
// the same bits in float32; in float64 to 1e-6 relative (checkpoints hold
// float32 parameters, docs/checkpoint.md, so a float64 run resumes from
// rounded weights).
void test_assert_resumed_losses(const double *resumed, const double *straight, int from, int to);

// A fresh empty folder (static storage, overwritten by the next call). Every
// one lives under a root that unit_tests makes at its start and removes at
// its end, so no test leaves anything in /tmp, even when it fails or crashes.
const char *test_tmpdir(const char *tag);
void test_remove_tree(const char *path);

// The path of a program built next to unit_tests (train, generate, ...).
const char *test_program(const char *name);
// Run argv (argv[0] a path) with stdin/stdout/stderr from/to the given files
// (NULL: /dev/null). With pid_out NULL: wait at most timeout_s and return the
// exit code, -signal, or TEST_TIMED_OUT (the child is killed); else return 0
// at once with the child's pid, for test_wait.
#define TEST_TIMED_OUT (-1000)
int test_spawn(char *const argv[], const char *in_path, const char *out_path, const char *err_path, double timeout_s,
               pid_t *pid_out);
int test_wait(pid_t pid, double timeout_s);
// A whole file as a NUL-terminated string (malloc'd), NULL if unreadable.
char *test_read_file(const char *path);
void test_write_file(const char *path, const char *text);

// test_dir_of(path): the folder of a path (static storage).
const char *test_dir_of(const char *path);

// <scratch>/tiny.ini: a tiny model (d_model 16) of `layers` on a scratch
// corpus, `steps` steps, no evaluations or checkpoints on the way; run_dir
// NULL: <scratch>/run. `extra` is appended (e.g. a [finetune] section).
// Returns the path (static storage).
const char *test_tiny_config(const char *tag, const char *layers, int steps, const char *run_dir, const char *extra);

// Is text one valid JSON value (strict RFC 8259 syntax)?
bool test_json_valid(const char *text);
// Check a JSON-lines file: every line valid JSON and the last one complete.
// Returns the number of records, or -1 with the first bad line in bad_line.
int test_jsonl_check(const char *path, char *bad_line, size_t n);

// The product backends of this build (blas.h): OpenBLAS, and oneDNN in a
// float32 build that has it. Tests of products run on each:
//   for (int i = 0; i < test_n_backends(); i++) { test_use_backend(i); ... }
// test_use_backend selects it with float32 products (failing the test if it
// cannot) and returns its name for messages.
int test_n_backends(void);
const char *test_use_backend(int i);

// Every entry of a device's DeviceKernels (device.h) is set: an entry added
// to the struct but not to that device's table is NULL there.
void test_assert_kernels_set(const DeviceKernels *k, const char *dev);

// Tolerances of the two builds for "two forms of the same math agree".
#ifdef AG_DOUBLE
#define FORM_TOL 1e-10
#else
#define FORM_TOL 1e-4
#endif

// Token-by-token decoding against the parallel forward (MODEL.md, Decoding).
#ifdef AG_DOUBLE
#define DECODE_TOL 1e-9
#else
#define DECODE_TOL 1e-4
#endif

#endif

// mixer.h: the interface every token mixer implements (attn, linear, mamba,
// gdn, attn_dsa, mamba2, gdp, kda), chosen by name so the LM can build any
// list of them.
//
// A mixer maps u = RMSNorm(x), shape (B, T, D), to (B, T, D). Recurrent
// mixers (linear, mamba, mamba2, gdn, gdp, kda) take an optional initial
// state and return their final state, both differentiable, shape (B, H, dk,
// dv): S[b,h,i,j] pairs key dimension i with value dimension j, and
// o_t = S_t^T q_t.
//
// Documents (docs.h): forward() takes doc_start (B, T), nonzero where a new
// document begins in a row, or NULL (none: one document per row, at no
// cost). From such a position on the mixer starts fresh: `attn` and
// `attn_dsa` attend (and the indexer selects) within the document only,
// with RoPE positions counted from its start; the recurrent kinds restart
// their state from zero and their short convolution reads no input before
// the start. A flag at t = 0 means s_in is not read for that
// row. A packed row computes what its documents would as separate rows.
//
// Decoding: step() takes u for ONE new position, shape (B, 1, D), on a tape
// in no-grad mode, reads and advances the cache, and returns (B, 1, D). The
// logits it leads to must equal the parallel forward's at the same position.
// cache_reset(b) makes row b's next token the start of a new document (the
// decoding form of a doc_start flag): its state, convolution inputs, or the
// keys its attention may read, are forgotten.
//
// Parameter names (the checkpoint's) are prefix + a short name: wq (D, H*dk),
// wk (D, H*dk), wv (D, H*dv), wo (H*dv, D), wg (D, H*dv), conv_q / conv_k
// (H*dk, W), conv_v (H*dv, W), out_norm (dv), w_dt (D, H), dt_bias (H),
// A_log (H), D (H, dv), w_beta (D, H) (mamba2: D (H), out_norm (H*dv); gdp:
// wk (D, n_h*H*dk), wv (D, n_h*H*dv), w_beta (D, n_h*H), conv_k, conv_v
// likewise: step j's columns are the j-th block; kda: no wg, w_dt; w_f1
// (D, dv), w_f2 (dv, H*dk), dt_bias (H*dk), w_g1 (D, dv), w_g2 (dv, H*dv),
// b_g2 (H*dv)); the indexer's: wq_idx, wk_idx, ww_idx;
// the attention options': q_norm (dk), k_norm (dk), w_gate (D, H*dv).
// Weights are stored (in, out) row-major and applied on the right: y = u W.
#ifndef MIXER_H
#define MIXER_H

#include "ops.h"
#include "params.h"

typedef enum {
    MIXER_FORM_CHUNKED,    // training form of the linear family (default)
    MIXER_FORM_PARALLEL,   // masked parallel O(T^2) form (linear only)
    MIXER_FORM_RECURRENT,  // token by token (the reference / decoding form)
    MIXER_FORM_COUNT
} MixerForm;

const char *mixer_form_name(MixerForm f);
int mixer_form_parse(const char *s);   // -1 if unknown

typedef struct MixerConfig {
    int d_model;           // D
    int n_heads;           // H
    int d_k, d_v;          // head sizes
    int chunk_size;        // C of the chunked forms (default 64); T need not be a multiple
    int conv_size;         // short convolution width (default 4; 0 = no convolution and no SiLU)
    MixerForm form;        // the form forward() uses
    double rope_base;      // 10000
    double norm_eps;       // output-stage RMSNorm eps (1e-6)
    double out_std;        // init std of the output projection wo (the LM sets 1/sqrt(2 L fan_in))
    int index_heads;       // attn_dsa: H_I
    int index_dim;         // attn_dsa: d_I
    int topk;              // attn_dsa: positions each query may attend to
    bool qk_norm;          // attn, attn_dsa: per-head RMSNorm of q and k (gain of d_k shared by the heads) before RoPE
    bool attn_gate;        // attn, attn_dsa: the output o times sigmoid(u W_gate) before Wo
    int gdp_steps;         // gdp: delta-rule steps per token n_h (1..GDP_MAX_STEPS; default 2)
    bool kda_gate_bias;    // kda: the output gate's bias b_g2 (default true; false: no such parameter)
} MixerConfig;

#define GDP_MAX_STEPS 8

MixerConfig mixer_config_default(int d_model, int n_heads, int d_k, int d_v);

typedef struct Mixer Mixer;

typedef struct MixerKind {
    const char *name;
    bool recurrent;        // has a state S of shape (B, H, dk, dv)
    // Register parameters under `prefix` (e.g. "layers.0.mixer.") and set m->impl.
    void (*create)(Mixer *m, ParamStore *ps, const char *prefix);
    // u: (B, T, D) -> (B, T, D). doc_start: (B, T) or NULL. s_in: (B, H, dk,
    // dv) or NULL (zeros); when s_out is non-NULL it receives the final state
    // (recurrent kinds only; that of each row's last document).
    Tensor *(*forward)(Tape *tp, Mixer *m, Tensor *u, const int *doc_start, Tensor *s_in, Tensor **s_out);
    // Decode cache for B sequences of up to max_T positions, in dev's memory
    // (a step, or forward_carry, then runs on a tape of that device).
    void *(*cache_new)(const Mixer *m, int B, int max_T, Device dev);
    void (*cache_free)(void *cache);
    // u: (B, 1, D) in no-grad mode -> (B, 1, D); advances the cache one position.
    Tensor *(*step)(Tape *tp, Mixer *m, void *cache, Tensor *u);
    // Row b (0 <= b < B) of the cache starts a new document at its next step.
    void (*cache_reset)(const Mixer *m, void *cache, int b);
    // Decoding steps replayed from a CUDA graph (lm_decode_graph.h): a kind
    // that is not recurrent needs both. Whether this cache's steps read
    // everything that changes per token from device memory (attn: its length
    // on a GPU), and the host's share of a replayed step: its counters moved
    // by delta steps (+1 after a replay, -1 to undo a capture that ran nothing).
    bool (*step_replayable)(const void *cache);
    void (*step_advance)(void *cache, int delta);
    // Recurrent kinds (NULL for the attention kinds, which keep their
    // within-window behaviour): a window u (B, T, D) that continues the
    // streams held in a decode cache (cache_new(m, B, any max_T)). The cache's
    // state and short-convolution inputs are the window's initial state, read
    // as constants (detached: no gradient reaches them; truncated
    // backpropagation through time), and receive its final ones, so that
    // consecutive windows compute what one pass over the whole stream
    // computes, and decoding may continue from them. A doc_start flag at t = 0
    // starts the row afresh (cache_reset does so between windows).
    Tensor *(*forward_carry)(Tape *tp, Mixer *m, Tensor *u, const int *doc_start, void *cache);
    // Attention kinds (NULL for the recurrent kinds, whose forward_carry does
    // this): decode a window at once. u (B, T0, D) in no-grad mode holds the
    // next T0 positions of every row; returns the output T0 step()s would
    // give and leaves the cache as they would (every window, on either
    // device). NULL (a kind without it): the LM steps each window
    // (lm_prefill).
    Tensor *(*prefill)(Tape *tp, Mixer *m, void *cache, Tensor *u);
    // The buffers that hold a recurrent cache's carried state (for
    // checkpoints): writes up to 4 pointers and element counts, returns how
    // many; the buffers are in the cache's device's memory. NULL for the
    // attention kinds.
    int (*cache_state)(const Mixer *m, void *cache, real **bufs, int64_t *sizes);
    void (*destroy)(Mixer *m);   // frees m->impl (parameters belong to the ParamStore)
    // Training forms this kind implements (bits 1 << MixerForm); 0: the kind
    // has one training form of its own and ignores MixerConfig.form.
    unsigned forms;
    // Constraints of this kind beyond those every mixer has (NULL: none).
    // Returns the config key at fault ("d_k", "index_dim", ...) and writes
    // why into `why`, or NULL when the config is fine.
    const char *(*check)(const MixerConfig *c, char *why, size_t n);
} MixerKind;

struct Mixer {
    const MixerKind *kind;
    MixerConfig cfg;
    void *impl;            // the kind's parameter tensors and settings
};

#define MIXER_FORMS_LINEAR_FAMILY ((1u << MIXER_FORM_CHUNKED) | (1u << MIXER_FORM_RECURRENT))

// Every constraint mixer_create asserts, as a recoverable error, so that a
// config can be checked before a model is built: returns the key at fault
// ("d_k", "form", ...) and writes why, or NULL when `kind` accepts c.
const char *mixer_config_check(const char *kind, const MixerConfig *c, char *why, size_t n);

// The registry: every kind, in one table (mixer.c).
const MixerKind *mixer_kind_find(const char *name);
// Add a kind defined outside the library (examples/custom_mixer.c): its name
// can then appear in [model] layers like a built-in one. k must outlive its
// use; a name already taken is an error.
void mixer_kind_register(const MixerKind *k);
const char *mixer_kind_names(void);   // "attn, linear, ..." for error messages
Mixer *mixer_create(const char *kind, const MixerConfig *cfg, ParamStore *ps, const char *prefix);
void mixer_destroy(Mixer *m);

#endif

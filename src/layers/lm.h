// lm.h: the language model of MODEL.md.
//
//   x_0    = E[token]                                   E: (V, D)
//   x_l+1  = h + MLP(RMSNorm(h)),  h = x_l + Mixer_l(RMSNorm(x_l))
//   logits = RMSNorm(x_L) W_out    (W_out = E^T when embeddings are tied)
//   MLP(u) = (SiLU(u W1) * (u W3)) W2                   W1, W3: (D, F), W2: (F, D)
//
// Parameter names: embed (V, D); layers.<l>.norm1 (D), layers.<l>.mixer.<...>,
// layers.<l>.norm2 (D), layers.<l>.mlp.w1 / w3 (D, F), layers.<l>.mlp.w2 (F, D);
// norm_f (D); lm_head (D, V) when untied.
#ifndef LM_H
#define LM_H

#include "attn_dsa.h"
#include "mixer.h"

#define LM_MAX_LAYERS 64

typedef struct LMConfig {
    int vocab_size;                    // V
    int d_model;                       // D
    int n_layers;                      // L
    char layers[LM_MAX_LAYERS][16];    // mixer kind of each layer
    int d_ff;                          // F
    bool tied;                         // W_out = E^T
    double norm_eps;                   // RMSNorm eps
    MixerConfig mixer;                 // settings every mixer shares (d_model is overwritten)
} LMConfig;

typedef struct LMBlock {
    Tensor *norm1, *norm2;             // (D) each
    Mixer *mixer;
    Tensor *w1, *w3;                   // (D, F)
    Tensor *w2;                        // (F, D)
} LMBlock;

typedef struct LM {
    LMConfig cfg;
    Tensor *embed;                     // (V, D)
    Tensor *norm_f;                    // (D)
    Tensor *lm_head;                   // (D, V), NULL when tied
    LMBlock blocks[LM_MAX_LAYERS];
    // The distillation loss of the last forward: the mean over the attn_dsa
    // layers of their KL (MODEL.md), (1) on that forward's tape; NULL when no
    // layer recorded one (no attn_dsa layer, or all in DSA_SPARSE mode).
    Tensor *dsa_kl;
} LM;

// Parse "gdn,gdn,attn" into cfg->layers / n_layers. Returns a Status naming the bad entry.
Status lm_parse_layers(LMConfig *cfg, const char *list);
// Every constraint lm_create and the layers would assert, as a recoverable
// error, so that a config can be checked before a model is built (as
// mixer_config_check is for one mixer): each layer's mixer_config_check
// (the kinds' registry, mixer.h), a form other than chunked applies to some
// layer, and every tensor of a step over `rows` (batch x sequence) positions
// stays within int32 elements. Returns the config key at fault ("d_k",
// "form", "d_model", "seq_len", ...) and writes why, or NULL when the model
// can be built.
const char *lm_config_check(const LMConfig *c, int64_t rows, char *why, size_t n);
// Register every parameter in ps (the caller then calls params_finalize).
void lm_create(LM *lm, const LMConfig *cfg, ParamStore *ps);
void lm_destroy(LM *lm);

// tokens: (B*T) ids. states_in / states_out: arrays of n_layers tensors
// (B, H, dk, dv) (entries of non-recurrent layers are NULL), or NULL.
// Returns logits (B, T, V).
Tensor *lm_forward(Tape *tp, LM *lm, const int *tokens, int B, int T, Tensor *const *states_in,
                   Tensor **states_out);
// Mean cross-entropy of lm_forward's logits against targets (B*T ids). *logits_out (optional).
Tensor *lm_loss(Tape *tp, LM *lm, const int *tokens, const int *targets, int B, int T, Tensor **logits_out);

// Packed documents (docs.h, mixer.h): doc_start (B*T), nonzero where a
// document begins in a row (a flag at t = 0 also means states_in is not read
// for that row); NULL or no flag = lm_forward / lm_loss exactly. Every layer
// starts fresh at a flag: attention and the DSA indexer stay inside the
// document (RoPE positions restart there), recurrent states and short
// convolutions restart from zero. The logits of a packed row equal those of
// its documents run as separate rows. The targets are the caller's: the one
// at a document's last position (the next document's first token) counts
// unless it is set negative (ignored by op_cross_entropy).
Tensor *lm_forward_docs(Tape *tp, LM *lm, const int *tokens, const int *doc_start, int B, int T,
                        Tensor *const *states_in, Tensor **states_out);
Tensor *lm_loss_docs(Tape *tp, LM *lm, const int *tokens, const int *targets, const int *doc_start, int B, int T,
                     Tensor **logits_out);

// DeepSeek sparse attention (attn_dsa layers; attn_dsa.h).
// Number of attn_dsa layers.
int lm_dsa_count(const LM *lm);
// Put every attn_dsa layer in `mode`.
void lm_set_dsa_mode(LM *lm, DsaMode mode);
// Indexer-only training (stage 1): the layers in DSA_DISTILL mode, run only up
// to the last attn_dsa layer's mixer (nothing after it affects the KL) and
// return the mean KL (1) (= lm->dsa_kl). With the main model frozen the tape
// records only the indexer branches.
Tensor *lm_distill_loss(Tape *tp, LM *lm, const int *tokens, int B, int T);
// The same over packed documents (doc_start as lm_forward_docs's; NULL = lm_distill_loss).
Tensor *lm_distill_loss_docs(Tape *tp, LM *lm, const int *tokens, const int *doc_start, int B, int T);
// Mean over attn_dsa layers of the kept attention mass of the last
// DSA_DISTILL forward (attn_dsa_last_mass).
double lm_dsa_mass(const LM *lm);

// Recurrent decoding: one cache per layer.
// lm_prefill's default window. Measured (tiny configs, 16k-token prompt, 2
// threads): windows of 1024 run as fast as 4096 (tiny_attn 2.4-2.7 s,
// tiny_hybrid 0.85-1.1 s), in 75-126 MB against 195-219 MB of memory.
#define LM_PREFILL_WINDOW 1024
// On a GPU, whose memory holds a long window's activations (~1.6 GB for 16k
// positions at d_model 1024), a prompt of up to 64k positions runs as one
// window (the windows after it: cu_attn_prefix_forward, and attn_dsa's
// cu_dsa_prefix_select and cu_dsa_prefix_sparse).
#define LM_PREFILL_WINDOW_GPU 65536
typedef struct LMCache {
    void *mixer[LM_MAX_LAYERS];
    int B, max_T, pos;
    Device device;   // where its buffers live: lm_step runs on a tape of this device
    int prefill_window;   // positions lm_prefill runs at once (LM_PREFILL_WINDOW, or _GPU on a GPU)
} LMCache;

LMCache *lm_cache_new(const LM *lm, int B, int max_T);   // on the CPU
// On a device: the LM's parameters must live there too (params_to_device).
LMCache *lm_cache_new_on(const LM *lm, int B, int max_T, Device d);
void lm_cache_free(const LM *lm, LMCache *c);
// tokens: (B) ids at position c->pos; call on a tape in no-grad mode. Returns logits (B, 1, V).
Tensor *lm_step(Tape *tp, LM *lm, LMCache *c, const int *tokens);
// Decode T positions of every row at once (a prompt): tokens (B*T) ids, row
// by row. Returns the logits of each row's last position, (B, 1, V), equal
// to the T-th lm_step's, and leaves the cache as T lm_step()s would. Runs
// windows of at most c->prefill_window positions, each layer over a whole
// window: the recurrent kinds by forward_carry, attention by its prefill
// (MixerKind.prefill), and a kind with neither, or a window its prefill
// declines, position by position with step(). Keeps two layers' activations
// of one window at a time. No-grad mode.
Tensor *lm_prefill(Tape *tp, LM *lm, LMCache *c, const int *tokens, int T);
// The same, returning every position's logits, (B, T, V), each equal to its
// lm_step's (e.g. to score a text as one stream: evaluate --stream).
Tensor *lm_prefill_all(Tape *tp, LM *lm, LMCache *c, const int *tokens, int T);
// Row b's next token begins a new document (a doc_start flag in decoding):
// every layer forgets row b's history (MixerKind.cache_reset). The logits
// that follow equal lm_forward_docs's with a flag at that position.
void lm_cache_reset_row(const LM *lm, LMCache *c, int b);

// State carried across windows (truncated backpropagation through time):
// each row reads one contiguous stream, window after window. carry is an
// LMCache (lm_cache_new(lm, B, 1) is enough; lm_cache_new_on for a GPU tape,
// whose device it must share): the recurrent layers (linear,
// mamba, gdn) start from its states (S and the short convolutions' last
// inputs), read as constants (detached: no gradient reaches the previous
// window), and leave their final states in it (MixerKind.forward_carry).
// Attention layers keep their within-window behaviour (their caches are not
// used). Consecutive windows of an all-recurrent model then compute what one
// window over the whole stream computes. A doc_start flag (a flag at t = 0
// too) starts a row afresh, as does lm_cache_reset_row between windows (at
// the end of a row's stream); the carry can also continue as a decoding
// cache. Returns logits (B, T, V).
Tensor *lm_forward_carry(Tape *tp, LM *lm, const int *tokens, const int *doc_start, int B, int T, LMCache *carry);
Tensor *lm_loss_carry(Tape *tp, LM *lm, const int *tokens, const int *targets, const int *doc_start, int B, int T,
                      LMCache *carry, Tensor **logits_out);
// The buffers of the carried state, for checkpoints: up to max pointers and
// element counts (4 per recurrent layer: S, then the q, k, v convolution
// inputs when conv_size > 1), in layer order, in the carry's device's
// memory (carry->device); returns how many.
int lm_carry_buffers(const LM *lm, LMCache *carry, real **bufs, int64_t *sizes, int max);

#endif

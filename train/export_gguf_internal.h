// export_gguf_internal.h: what the GGUF exporter's files share: the
// tokenizer's keys (export_gguf_vocab.c) and the writing of parameters.
#ifndef TRAIN_EXPORT_GGUF_INTERNAL_H
#define TRAIN_EXPORT_GGUF_INTERNAL_H

#include "export_gguf.h"

// Can the tokenizer be written so that llama.cpp gives attnlab's ids?
Status gguf_vocabulary_check(const Tokenizer *tok);
// Its tokenizer.ggml.* keys (model, pre-tokenizer, tokens, types, merges, specials).
void gguf_vocabulary(Gguf *g, const Tokenizer *tok);

// The parameter named by fmt with the layer index l (it must exist).
const Tensor *gguf_param(const ParamStore *ps, const char *fmt, int l);
// A vector, always float32.
void gguf_vector(Gguf *g, const char *name, const Tensor *t);
// A (rows, cols) parameter as ggml's {cols, rows} (as stored) or, transposed,
// {rows, cols}; Q8_0 falls back to float16 for rows not a multiple of 32 long.
void gguf_matrix(Gguf *g, const char *name, const Tensor *t, bool transpose, GgufType type);

// The pass-through block: one block after the model's layers whose weights
// are all zero but its norm gains (1). Its attention's q, k and v are 0, so
// its output is 0 whatever the softmax; its MLP's weights are 0, so
// silu(0) * 0 = 0 goes through a zero ffn_down: it adds exactly 0 to the
// residual stream twice and changes no logit. llama.cpp's hybrid
// architectures need one attention layer: without one their memory's KV
// cache has no tensor and llama_decode stops on GGML_ASSERT(buffer) (setting
// the unused KV index input). kimi-linear's file always has the block; a
// qwen35 or granitehybrid file has it when the model has no 'attn' layer.
bool gguf_pass_through(const char *arch, const TrainConfig *cfg);
// In qwen35 and granitehybrid, where the file's attention sizes are the
// block's alone: one head (one key/value head) of 2 dimensions, the least
// llama.cpp runs: its RoPE turns pairs (ggml's CPU RoPE loops forever over 0
// rotated dimensions and reads past a head of 1; qwen35 always applies it,
// and its position sections must hold a pair), and a granitehybrid head of 1
// with RoPE off stops its attention without flash attention on
// GGML_ASSERT(ggml_can_mul_mat). Its KV cache holds 4 values per position.
enum { GGUF_PASS_HEADS = 1, GGUF_PASS_HEAD_DIM = 2 };
// One of the block's tensors: blk.L.name.weight of ggml shape {ne[0]} (a
// vector: ne[1] = 0) or {ne[0], ne[1]}, every value `value`; vectors and
// gains float32, matrices of zeros Q8_0 or float16 (exact, and smaller).
typedef struct GgufConstant {
    const char *name;
    int64_t ne[2];
    float value;
} GgufConstant;
void gguf_constant_block(Gguf *g, int l, const GgufConstant *t, size_t n);

// The keys every architecture has, under arch's prefix (general.*, sizes,
// RoPE, the RMSNorm epsilon; the attention sizes are the pass-through
// block's where it is the only attention).
void gguf_common_metadata(Gguf *g, const char *arch, const TrainConfig *cfg, int vocab);
// Layer l's plain attention (attn_q, attn_k, attn_v, attn_output) as llama's.
void gguf_attn_plain(Gguf *g, const ParamStore *ps, int l, GgufType type);
// Layer l's SwiGLU MLP (ffn_gate, ffn_up, ffn_down).
void gguf_mlp(Gguf *g, const ParamStore *ps, int l, GgufType type);

// A gdn/attn hybrid as llama.cpp's 'qwen35' (export_gguf_qwen35.c): can it
// be written exactly (an error says what to change)? Then its keys beyond
// gguf_common_metadata's and its layers.
Status gguf_qwen35_check(const TrainConfig *cfg);
void gguf_qwen35(Gguf *g, const TrainConfig *cfg, const ParamStore *ps, GgufType type);

// A model with mamba2 layers (and attn layers) as llama.cpp's
// 'granitehybrid' (export_gguf_mamba2.c): does it have one, can it be
// written exactly (an error says what to change)? Then its keys beyond
// gguf_common_metadata's and its layers.
bool gguf_is_granite(const TrainConfig *cfg);
Status gguf_granite_check(const TrainConfig *cfg);
void gguf_granite(Gguf *g, const TrainConfig *cfg, const ParamStore *ps, GgufType type);

// A model of kda layers as llama.cpp's 'kimi-linear' (export_gguf_kimi.c):
// does it have one, can it be written exactly (an error says what to
// change)? Then its keys beyond gguf_common_metadata's and its layers.
bool gguf_is_kimi(const TrainConfig *cfg);
Status gguf_kimi_check(const TrainConfig *cfg);
void gguf_kimi(Gguf *g, const TrainConfig *cfg, const ParamStore *ps, GgufType type);

#endif

// export_gguf.h: an attnlab model as a GGUF file that llama.cpp runs with
// the same logits (docs/export.md).
//
// What maps, exactly:
//   - a stack of `attn` layers -> llama.cpp's `llama` architecture: RMSNorm,
//     softmax attention with RoPE on interleaved pairs (llama.cpp's "normal"
//     RoPE is that pairing) and 1/sqrt(d_k), SwiGLU MLP, tied or untied
//     output. Needs d_k = d_v (llama.cpp has one head size for both).
//   - a hybrid of `gdn` and `attn` layers (at least one of each, attention
//     with qk_norm and attn_gate) -> llama.cpp's `qwen35` architecture
//     (export_gguf_qwen35.c: the mapping, and why each condition); a stack
//     of `gdn` layers alone -> `qwen35` with one pass-through block after
//     them (export_gguf_internal.h: an attention block that adds exactly 0).
//   - a hybrid of `mamba2` and `attn` layers, or `mamba2` layers alone (with
//     the pass-through block) -> llama.cpp's `granitehybrid`
//     (export_gguf_mamba2.c).
//   - a stack of `kda` layers without the gate bias (kda_gate_bias = false)
//     -> llama.cpp's `kimi-linear`, with one pass-through block after them
//     (export_gguf_kimi.c).
//   - the byte tokenizer -> a byte-level "gpt2" vocabulary of 256 tokens and
//     no merges, so llama.cpp's tokenizer gives every byte its own id, the
//     byte's value, whatever its pre-tokenizer splits.
//   - a BPE -> a "gpt2" vocabulary of its ids, the merges that rebuild its
//     ranks (bpe_merges.h) and the pre-tokenizer of its split pattern
//     (export_gguf_vocab.c; docs/export.md).
// Anything else (other mixers, a BPE whose split pattern llama.cpp lacks) is
// refused with a sentence that names the layer or tokenizer and why: never a
// file that loads and computes something else.
#ifndef TRAIN_EXPORT_GGUF_H
#define TRAIN_EXPORT_GGUF_H

#include "config.h"
#include "gguf.h"
#include "params.h"
#include "tokenizer.h"

// Can this model be written exactly? An error names what cannot.
Status export_gguf_check(const TrainConfig *cfg, const Tokenizer *tok);

// The model's GGUF file: its bytes (malloc'd), *n its size. Weights of type
// `type`; norms stay float32, and a matrix whose rows are not a multiple of
// 32 long is stored as float16 when Q8_0 is asked for.
Status export_gguf_bytes(const TrainConfig *cfg, const ParamStore *ps, const Tokenizer *tok, GgufType type,
                         uint8_t **bytes, size_t *n);

#endif

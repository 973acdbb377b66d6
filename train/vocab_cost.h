// vocab_cost.h: what a tokenizer costs a model, said before training starts.
//
// The embedding (and an untied output layer) has a row per token id: a
// tiktoken vocabulary of 100k ids on a model of d_model 128 is 12.8M
// parameters, most of a tiny model, and its time per token and checkpoint
// size follow.
#ifndef VOCAB_COST_H
#define VOCAB_COST_H

#include <stddef.h>

#include "params.h"

// One line, e.g. "vocabulary 50257 ids: embedding 50257 x 128 = 6.43M
// parameters, 86% of the model's 7.47M (most of the model is its vocabulary)".
// Empty when the store has no "embed" parameter.
void vocab_cost_describe(const ParamStore *ps, char *buf, size_t n);

#endif

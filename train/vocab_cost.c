#include "vocab_cost.h"

#include <stdio.h>

// 1234567 -> "1.23M", 12345 -> "12.3k".
static const char *count_str(double v, char *buf, size_t n) {
    if (v >= 1e6) snprintf(buf, n, "%.3gM", v / 1e6);
    else if (v >= 1e4) snprintf(buf, n, "%.3gk", v / 1e3);
    else snprintf(buf, n, "%.0f", v);
    return buf;
}

void vocab_cost_describe(const ParamStore *ps, char *buf, size_t n) {
    buf[0] = 0;
    const Tensor *e = params_find(ps, "embed"), *head = params_find(ps, "lm_head");
    if (!e || e->ndim != 2) return;
    double vocab_params = (double)e->shape[0] * e->shape[1] + (head ? (double)head->numel : 0);
    double total = (double)params_count(ps, false);
    double share = total > 0 ? vocab_params / total : 0;
    char a[32], b[32];
    snprintf(buf, n, "vocabulary %d ids: embedding %d x %d%s = %s parameters, %.0f%% of the model's %s%s", e->shape[0],
             e->shape[0], e->shape[1], head ? " and the output layer (untied)" : "",
             count_str(vocab_params, a, sizeof a), 100 * share, count_str(total, b, sizeof b),
             // (bytes are the smallest vocabulary: no advice for a tiny byte-level model)
             share > 0.5 && e->shape[0] > 256 ? " (most of the model is its vocabulary: each step and the checkpoint "
                                                "grow with it; a smaller vocabulary, e.g. bpe:N, costs less)"
                                              : "");
}

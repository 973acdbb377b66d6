// leak_cycles N: N forward/backward/reset cycles of a small language-model-like
// graph (embedding, rmsnorm, projections, rope, causal conv, SiLU,
// cross-entropy); run under AddressSanitizer (LeakSanitizer) or valgrind, it
// must report no leak.
#include <stdlib.h>

#include "ops.h"
#include "params.h"

int main(int argc, char **argv) {
    int cycles = argc > 1 ? atoi(argv[1]) : 100;
    enum { V = 11, D = 16, B = 2, T = 8, HD = 4 };
    ParamStore ps;
    params_init(&ps);
    Tensor *E = params_add(&ps, "E", 2, (int[]){V, D}, init_normal(0.5), 0);
    Tensor *w = params_add(&ps, "w", 2, (int[]){D, D}, init_normal(0.1), 0);
    Tensor *g = params_add(&ps, "g", 1, (int[]){D}, init_ones(), TENSOR_NO_DECAY);
    Tensor *cw = params_add(&ps, "conv", 2, (int[]){D, 4}, init_uniform(-0.5, 0.5), 0);
    Tensor *wout = params_add(&ps, "wout", 2, (int[]){D, V}, init_normal(0.1), 0);
    params_finalize(&ps, 1);
    Tape tp;
    tape_init(&tp);
    int ids[B * T], targets[B * T];
    for (int i = 0; i < B * T; i++) ids[i] = (i * 5) % V, targets[i] = i % 9 == 0 ? -1 : (i * 3 + 1) % V;
    double last = 0;
    for (int c = 0; c < cycles; c++) {
        params_zero_grad(&ps);
        Tensor *x = op_embedding(&tp, E, ids, 2, (int[]){B, T});          // (B, T, D)
        Tensor *h = op_rmsnorm(&tp, x, g, 1e-6);
        h = op_matmul(&tp, h, w, false, false);
        h = op_rope(&tp, h, HD, c % 3, 10000.0);
        h = op_silu(&tp, op_conv1d_causal(&tp, h, cw, NULL));
        h = op_add(&tp, x, h);
        Tensor *logits = op_matmul(&tp, h, wout, false, false);        // (B, T, V)
        Tensor *loss = op_cross_entropy(&tp, logits, targets);
        tape_backward(&tp, loss);
        last = loss->data[0];
        tape_reset(&tp);
    }
    tape_free(&tp);
    params_free(&ps);
    printf("leak_cycles: %d cycles, last loss %.6f\n", cycles, last);
    return 0;
}

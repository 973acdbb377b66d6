// leak_cycles N: N forward/backward/reset cycles of a small graph; run under
// AddressSanitizer (LeakSanitizer) or valgrind, it must report no leak.
#include <stdlib.h>

#include "ops.h"
#include "params.h"

int main(int argc, char **argv) {
    int cycles = argc > 1 ? atoi(argv[1]) : 100;
    ParamStore ps;
    params_init(&ps);
    Tensor *w = params_add(&ps, "w", 2, (int[]){16, 16}, init_normal(0.1), 0);
    Tensor *g = params_add(&ps, "g", 1, (int[]){16}, init_ones(), TENSOR_NO_DECAY);
    params_finalize(&ps, 1);
    Tape tp;
    tape_init(&tp);
    Tensor *x = tensor_newv(false, 3, 2, 8, 16);
    for (int64_t i = 0; i < x->numel; i++) x->data[i] = (real)((i % 7) - 3) / 3;
    double last = 0;
    for (int c = 0; c < cycles; c++) {
        params_zero_grad(&ps);
        Tensor *h = op_matmul(&tp, x, w, false, false);
        h = op_mul(&tp, h, g);
        Tensor *loss = op_mean(&tp, op_mul(&tp, h, h));
        tape_backward(&tp, loss);
        last = loss->data[0];
        tape_reset(&tp);
    }
    tape_free(&tp);
    tensor_free(x);
    params_free(&ps);
    printf("leak_cycles: %d cycles, last loss %.6f\n", cycles, last);
    return 0;
}

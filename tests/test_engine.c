// The tape itself: accumulation, no-grad mode, frozen parameters, reset, bad calls.
#include <string.h>

#include "device.h"
#include "test_util.h"

Test(engine, gradients_accumulate_over_reuse) {
    // y = sum(x * x + x): dy/dx = 2x + 1, with x used three times.
    Tape tp;
    tape_init(&tp);
    Tensor *x = tensor_newv(true, 1, 5);
    fill_normal(x, 1, 1.0);
    Tensor *y = op_sum(&tp, op_add(&tp, op_mul(&tp, x, x), x));
    tape_backward(&tp, y);
    for (int i = 0; i < 5; i++) cr_assert_float_eq(x->grad[i], 2 * x->data[i] + 1, 1e-5);
    tape_free(&tp);
    tensor_free(x);
}

Test(engine, no_grad_records_nothing) {
    Tape tp;
    tape_init(&tp);
    Tensor *x = tensor_newv(true, 1, 4);
    tape_no_grad_push(&tp);
    Tensor *y = op_sum(&tp, op_mul(&tp, x, x));
    tape_no_grad_pop(&tp);
    cr_assert_eq(tp.n_nodes, 0);
    cr_assert(!y->requires_grad);
    cr_assert(EXPECT_FAILURE(tape_backward(&tp, y)));
    cr_assert(strstr(ag_last_error(), "does not depend on anything"), "got: %s", ag_last_error());
    tape_free(&tp);
    tensor_free(x);
}

Test(engine, frozen_parameter_gets_no_gradient_and_no_backward_work) {
    ParamStore ps;
    params_init(&ps);
    Tensor *w1 = params_add(&ps, "w1", 2, (int[]){3, 3}, init_normal(1.0), 0);
    Tensor *w2 = params_add(&ps, "w2", 2, (int[]){3, 3}, init_normal(1.0), 0);
    params_finalize(&ps, 7);
    params_set_frozen(&ps, w1, true);
    cr_assert_null(w1->grad);
    Tape tp;
    tape_init(&tp);
    Tensor *x = tensor_newv(false, 2, 2, 3);
    fill_normal(x, 2, 1.0);
    // Branch through the frozen w1 only: it must not be recorded at all.
    Tensor *h1 = op_matmul(&tp, x, w1, false, false);
    cr_assert_eq(tp.n_nodes, 0, "a product of constants and frozen weights must not be recorded");
    Tensor *h2 = op_matmul(&tp, h1, w2, false, false);
    cr_assert_eq(tp.n_nodes, 1);
    tape_backward(&tp, op_sum(&tp, h2));
    double g2 = 0;
    for (int i = 0; i < 9; i++) g2 += w2->grad[i] * w2->grad[i];
    cr_assert_gt(g2, 0);
    for (int64_t i = 0; i < w1->numel; i++) cr_assert_eq(ps.grad[i], 0);
    tape_free(&tp);
    tensor_free(x);
    params_free(&ps);
}

Test(engine, backward_needs_a_scalar_loss) {
    Tape tp;
    tape_init(&tp);
    Tensor *x = tensor_newv(true, 2, 2, 3);
    Tensor *y = op_scale(&tp, x, 2.0);
    cr_assert(EXPECT_FAILURE(tape_backward(&tp, y)));
    cr_assert(strstr(ag_last_error(), "scalar") && strstr(ag_last_error(), "(2, 3)"), "got: %s",
              ag_last_error());
    tape_free(&tp);
    tensor_free(x);
}

Test(engine, reset_reuses_one_arena_block) {
    Tape tp;
    tape_init(&tp);
    Tensor *x = tensor_newv(true, 2, 256, 256);
    for (int step = 0; step < 3; step++) {
        Tensor *y = x;
        for (int k = 0; k < 40; k++) y = op_scale(&tp, y, 1.01);   // ~10 MB: more than one block
        tape_backward(&tp, op_sum(&tp, y));
        tape_reset(&tp);
        cr_assert_not_null(tp.arena.head);
        cr_assert_null(tp.arena.head->next, "after a reset the arena is one block");
    }
    tape_free(&tp);
    tensor_free(x);
}

// A CUDA graph captured in the arena's block may be replayed only while that
// block lives: arena_settled names it by a serial that a new block changes,
// even one made at the freed block's address.
Test(engine, a_block_made_again_is_another_block) {
    Arena a;
    arena_init(&a, 4096);
    cr_assert_null(arena_settled(&a), "an empty arena has not settled");
    arena_alloc(&a, 3000);
    arena_alloc(&a, 3000);   // a second block
    cr_assert_null(arena_settled(&a), "two blocks: not settled");
    arena_reset(&a);
    const ArenaBlock *b = arena_settled(&a);
    cr_assert_not_null(b);
    uint64_t serial = b->serial;
    size_t cap = b->cap;
    for (int i = 0; i < 3; i++) {   // within the block: the same block
        arena_alloc(&a, cap / 2);
        arena_reset(&a);
        cr_assert(arena_settled(&a) == b && b->serial == serial, "a reset within the block keeps it");
    }
    arena_alloc(&a, cap + 1);   // more than it holds: made again
    arena_reset(&a);
    const ArenaBlock *c = arena_settled(&a);
    cr_assert_not_null(c);
    cr_assert_gt(c->serial, serial, "the new block's serial %llu follows %llu", (unsigned long long)c->serial,
                 (unsigned long long)serial);
    cr_assert_geq(c->cap, cap + 1, "the new block holds the high water");
    arena_free(&a);
}

Test(engine, params_are_contiguous_and_seeded) {
    ParamStore a, b;
    params_init(&a);
    params_init(&b);
    for (ParamStore *ps = &a; ps; ps = ps == &a ? &b : NULL) {
        params_add(ps, "x", 2, (int[]){4, 5}, init_normal(0.02), 0);
        params_add(ps, "g", 1, (int[]){5}, init_ones(), TENSOR_NO_DECAY);
        params_finalize(ps, 42);
    }
    cr_assert_eq(a.numel, 25);
    cr_assert_eq(a.params[1]->data, a.data + 20);
    cr_assert_eq(memcmp(a.data, b.data, 25 * sizeof(real)), 0, "same seed, same values");
    cr_assert_eq(a.params[1]->data[3], 1);
    cr_assert(EXPECT_FAILURE(params_add(&a, "late", 1, (int[]){1}, init_zeros(), 0)));
    params_free(&a);
    params_free(&b);
}

// AG_DEVICE picks where gradcheck runs: unset or "cpu" is the CPU; a name that
// is not a device, or "cuda" in a build without the backend, stops with the
// value in the message (not a silent CPU run).
Test(engine, ag_device_is_read_and_checked) {
    setenv("AG_DEVICE", "gpu0", 1);
    cr_assert(EXPECT_FAILURE(device_default()), "AG_DEVICE=gpu0 was accepted");
    cr_assert(strstr(ag_last_error(), "AG_DEVICE=gpu0") != NULL, "%s", ag_last_error());
    if (!device_cuda_built()) {
        setenv("AG_DEVICE", "cuda", 1);
        cr_assert(EXPECT_FAILURE(device_default()), "AG_DEVICE=cuda without the backend was accepted");
        cr_assert(strstr(ag_last_error(), "no CUDA backend") != NULL, "%s", ag_last_error());
    }
    setenv("AG_DEVICE", "cpu", 1);
    cr_assert_eq(device_default(), DEVICE_CPU);
    setenv("AG_DEVICE", "cuda", 1);   // read once: the choice stays
    cr_assert_eq(device_default(), DEVICE_CPU);
}

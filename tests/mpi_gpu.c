// mpi_gpu: GPU ranks under mpirun (device = cuda, a GPU per rank, the
// gradient buckets over NCCL: train/dist_nccl.c), checked as the CPU ranks
// are in mpi_tests.c. Runs only where this build has NCCL and the machine
// two GPUs; elsewhere it is skipped, saying why. One GPU shows the NCCL path
// over a communicator of one (cuda_tests, tests/cuda/test_cuda_nccl.c).
#include <stdlib.h>
#include <string.h>

#include "device.h"
#include "dist.h"
#include "mpi_tests.h"
#include "test_util.h"

// 2 GPU ranks repeat bit for bit and equal one GPU with the whole batch to
// float32 rounding (the sums over the batch in another order, as on the
// CPU); most buckets start during the backward; a checkpoint the 2 ranks
// wrote at step 6 resumes on one GPU and the losses go on as the 2 ranks'.
Test(mpi, gpu_ranks_equal_one_gpu_and_repeat_bitwise, .timeout = 300) {
    if (!dist_nccl_built()) cr_skip_test("this build has no NCCL (a CUDA build with MPI and NCCL: docs/cuda.md)");
    char err[400];
    device_cuda_choose(1);   // (succeeds only where a second GPU is there)
    if (!device_cuda_init(err, sizeof err)) cr_skip_test("two GPUs wanted: %s", err);
    setup_config("mpi_gpu");
    const char *gpu[] = {"--set", "train.device=cuda", NULL};
    Run one = run("gpu_one", 0, gpu), two = run("gpu_two", 2, gpu), again = run("gpu_two_again", 2, gpu);
    cr_assert_eq(loss_diff(&two, &again, 1, 12), 0, "two runs on 2 GPUs give other losses");
    cr_assert_eq(param_diff(&two, &again), 0, "two runs on 2 GPUs give other parameters");
    double l = loss_diff(&one, &two, 1, 12), p = param_diff(&one, &two);
    cr_log_info("2 GPU ranks against one GPU: losses %.1e, parameters %.1e", l, p);
    cr_assert(l <= LOSS_TOL && p <= PARAM_TOL, "2 GPU ranks against one GPU: losses differ by %.3g, parameters by "
                                               "%.3g", l, p);
    char *text = metrics(&two);
    const char *b = strstr(text, "\"buckets\":"), *early = strstr(text, "\"buckets_started_in_backward\":");
    cr_assert(b && early && atoi(b + 10) >= 8 && strtod(early + 30, NULL) >= 0.5, "%s", text);
    free(text);
    // Stopped at step 6 on 2 GPUs, resumed to 12 on one.
    run("gpu_half", 2, (const char *[]){"--set", "train.device=cuda", "--set", "train.steps=6", NULL});
    Run resumed = run("gpu_half", 0, (const char *[]){"--resume", "--set", "train.steps=12", NULL});
    l = loss_diff(&two, &resumed, 1, 12);
    cr_assert(l <= LOSS_TOL, "resumed on one GPU, the losses differ from the 2 ranks' by %.3g", l);
}

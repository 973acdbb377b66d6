// test_cuda_dispatch.c: the GPU's DeviceKernels (src/cuda/dispatch_cuda.cu)
// sets every entry, which it fills field by field.
#include <criterion/criterion.h>

#include "cuda_check.h"
#include "test_util.h"

Test(cuda_dispatch, the_gpu_table_sets_every_entry) {
    cuda_require();
    test_assert_kernels_set(device_kernels(DEVICE_CUDA), "cuda");
    cr_assert_neq(device_kernels(DEVICE_CUDA), device_kernels(DEVICE_CPU));
}

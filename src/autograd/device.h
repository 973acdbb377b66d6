// device.h: where a tape's tensors live: the CPU (always) or an NVIDIA GPU
// (builds with -DAG_CUDA=ON; docs/cuda.md).
//
// A Tape is on one device. On the GPU its tensors' data and gradients come
// from a device arena (one cudaMalloc'd block after the first step, like the
// host arena), its ops run the CUDA half of their OpDef on one stream, and
// only the nodes, the Tensor structs and the ops' host-side arguments stay
// in host memory. Nothing here synchronises except the copies to the host.
#ifndef AG_DEVICE_H
#define AG_DEVICE_H

#include "common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { DEVICE_CPU = 0, DEVICE_CUDA = 1, DEVICE_COUNT } Device;

// True when the library was built with the CUDA backend.
bool device_cuda_built(void);
// True when a GPU can be used now (the backend is built and the driver finds
// a device); else false, with why in err. Initialises the backend (stream,
// cuBLAS handle) on first success.
bool device_cuda_init(char *err, size_t n);
// One line about the GPU for logs ("NVIDIA H200, 132 SMs, 139.8 GiB, CUDA 13.0").
const char *device_describe(Device d);
const char *device_name(Device d);            // "cpu", "cuda"
int device_parse(const char *name);           // -1 when unknown
// Where the library's own checks run (gradcheck): the environment variable
// AG_DEVICE ("cpu", the default when unset or empty, or "cuda"), read once.
// An unknown name, or cuda where the backend is not built or finds no GPU,
// stops with a message naming the value.
Device device_default(void);

// Memory on a device. dev_alloc is 256-byte aligned on the GPU, 64 on the CPU;
// it stops with a message naming the size when the memory is not there.
void *dev_alloc(Device d, size_t bytes);
void dev_free(Device d, void *p);
void dev_zero(Device d, void *p, size_t bytes);                  // asynchronous on the GPU
// Copies between the host and a device. To the host: waits for the stream.
void dev_to_host(void *dst, const void *src, size_t bytes, Device src_dev);
void dev_from_host(void *dst, Device dst_dev, const void *src, size_t bytes);
// Within one device (regions must not overlap; asynchronous on the GPU):
// bytes from src to dst, and `height` rows of `width` bytes, row r from
// src + r * spitch to dst + r * dpitch.
void dev_copy(Device d, void *dst, const void *src, size_t bytes);
// True when p points into d's memory (on the CPU: always). Lets an op take
// an index array (a selection) from either side on a GPU tape.
bool dev_holds(Device d, const void *p);
void dev_copy2d(Device d, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height);
// dst[i] += src[i] for i < n, src in host memory, dst on the device (seeding
// a backward; float64 or float32 as `real`).
void dev_add_from_host(Device d, real *dst, const real *src, int64_t n);
// Fill with NaN (the float64 build's poison of fresh buffers).
void dev_fill_nan(Device d, real *p, int64_t n);
// The GPU's float32 products: strict IEEE (false, the default) or TF32 on
// the tensor cores (true: 10-bit mantissas in the products, float32 sums).
void device_set_tf32(Device d, bool on);
// Wait for everything queued on the GPU; reports a kernel's failure (an
// illegal address, a launch error) with where it was noticed.
void dev_sync(Device d);

#ifdef __cplusplus
}
#endif
#endif

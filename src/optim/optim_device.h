// optim_device.h: a training step's optimizer work on the GPU as one
// stretch of device work (device.h's DeviceOptimStep), run eagerly or
// replayed from a CUDA graph (docs/cuda.md "CUDA graphs"; [train] cuda_graph).
//
// It does what the eager calls of optim.h do for a single process,
//
//     if (accum > 1) optim_scale_grads(ps, 1.0 / accum);
//     norm = optim_clip_grad_norm(ps, max_norm);
//     if (isfinite(norm)) optim_step(opt, ps, lr);
//     bad = optim_nonfinite_param(ps, opt);
//
// with the same bits (the same per-element formulas, the same reductions in
// the same order), but in about a dozen kernels whatever the number of
// parameters (the update is one launch over a table of chunks) and one read
// back (the norm and the finite check together). The learning rate and the
// bias corrections change every step: they are copied to the device at the
// start of the work (a graph refreshes that copy from the host at every
// launch), never baked into it.
#ifndef AG_OPTIM_DEVICE_H
#define AG_OPTIM_DEVICE_H

#include "optim.h"

typedef struct OptimDevice {
    Device device;
    bool graphs;                    // capture and replay (else eagerly, the same work)
    bool off;                       // a capture failed: eagerly from then on
    bool quiet;                     // no line on stderr when a capture fails
    char why[256];                  // why graphs are off (empty while on)
    CuGraph *g;
    bool captured;                  // g holds the work of the current key
    DeviceOptimStep k;              // the work's arguments (device pointers)
    DeviceOptimChunk *chunks;       // (device) the update's table
    DeviceOptimChunk *chunks_host;  // its host copy (the key's part)
    real *hyper;                    // (device) lr, bc1, bc2
    real hyper_host[3];             // what is copied there (the graph's bound input)
    void *scratch;                  // (device) DEVICE_OPTIM_SCRATCH bytes
    DeviceOptimStat *stat;          // (device)
    struct {                        // what the work was built for
        const real *p, *g, *m, *v;
        int64_t lo, hi, numel;
        OptimKind kind;
        int accum;
        double max_norm;
    } key;
    bool have_key;
    int64_t replays, captures, eager;   // steps of each kind
    int64_t tables;                     // times the work's arguments were (re)built
} OptimDevice;

// Whether the trainer runs its steps on d this way (a GPU: on the CPU the
// calls of optim.h are what the CPU's step is, in parallel regions).
bool optim_device_supported(Device d);
// graphs: capture the work once and replay it where d has graphs (when
// capturing fails: one line on stderr unless quiet, then eagerly; `why` says
// why). Any device (the CPU's table runs the same work with its loops).
void optim_device_init(OptimDevice *od, Device d, bool graphs);
void optim_device_free(OptimDevice *od);

typedef struct OptimDeviceResult {
    double norm;            // the gradients' norm after the 1/accum scaling, before clipping
    bool stepped;           // the norm is finite: the update ran and opt->step advanced
    const Tensor *bad;      // the first parameter whose value or moment is not finite after it (NULL: none)
} OptimDeviceResult;

// One step of opt (AdamW or SGD, over the whole ParamStore or opt's shard)
// at learning rate lr: the gradients scaled by 1/accum when accum > 1,
// clipped at max_norm when > 0, the update when the norm is finite, then
// the finite check. ps and opt live on od's device.
void optim_device_step(OptimDevice *od, Optimizer *opt, ParamStore *ps, int accum, double max_norm, double lr,
                       OptimDeviceResult *r);

#endif

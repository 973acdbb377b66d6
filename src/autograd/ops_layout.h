// ops_layout.h: what an op's CPU and GPU halves both read of a node beyond
// its tensors (private to the library; included by src/cuda/ too, so C and
// C++ alike).
#ifndef AG_OPS_LAYOUT_H
#define AG_OPS_LAYOUT_H

#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

// op_rope / op_rope_pos: the node's aux (host memory). Entry e of the table
// rotates by position pos[e] (pos0 + e when pos is NULL); row (b, t) of x
// uses entry idx[b*T + t] (t when idx is NULL).
typedef struct RopeTable {
    const int *pos;   // (n_pos) the position of each entry, or NULL: entry e is position pos0 + e
    int pos0, n_pos;
    const int *idx;   // (B*T) the entry of each row, or NULL: row (b, t) uses entry t
} RopeTable;

// op_transpose: the input padded to 4 dimensions (leading 1s) and the input
// stride that each OUTPUT dimension walks: out[i0,i1,i2,i3] =
// in[sum_k i_k * stride[k]].
typedef struct TransposeMap {
    int shape[4];      // output shape, padded
    int64_t stride[4]; // input strides in output-dimension order
} TransposeMap;

// The map of a transpose of x swapping dimensions d0 and d1 (non-negative).
TransposeMap transpose_map(const Tensor *x, int d0, int d1);

#ifdef __cplusplus
}
#endif
#endif

// gdn_common.cuh: what every GPU file of op_gdn (Gated DeltaNet) shares: the
// kernels' arguments (GdnArgs), their launch shape, and where the backward's
// gradients go (GdnGrads). The chunked (WY) and the recurrent form follow the
// lines of their CPU twins (gdn_kernel.h): gdn_chunk.cu (gdn_chunk.c, the
// forward), gdn_chunk_backward.cu (gdn_chunk_backward.c), gdn_scan.cu (the
// state's recurrence across chunks, both passes), gdn_naive.cu (gdn_naive.c);
// gdn_chunk.cuh holds the per-chunk kernels' block-wide steps; gdn_chunk64.cu
// the bf16 forms of forward 1 and 3 and backward 1 below at heads of 64 and
// chunks of at most 64 (4-warp blocks, products in registers, the same bits).
//
// The plan of the kernels, all files together:
//
// Chunked form: the chunks of every (batch, head) run side by side; only the
// state's recurrence across chunks is sequential, and it is split by blocks
// of NVB columns of the state (the delta rule's columns over dv evolve
// independently: S_C[:, J] = bl S0[:, J] + Kd^T (U[:, J] - W S0[:, J])).
//   forward   1. per chunk (k_gdn_fwd_prep): the decays, (I + A)^-1 and
//                W = Tm diag(beta b) K, U = Tm diag(beta) V, written to
//                per-op rows (B*H, T, dk | dv; when the node is recorded,
//                in n->saved after the states with Tm and, from the scan,
//                Delta, for the backward), with ek (B*H, T) and bl (B*H, NC);
//             2. per (batch, head, column block), chunks in order
//                (k_gdn_fwd_scan): keeps the state entering each chunk (n->saved,
//                or scratch when the node is not recorded), Delta = U - W S0
//                over U's rows, S_C = bl S0 + Kd^T Delta; S_T is the last;
//             3. per chunk (k_gdn_fwd_out): O = diag(b) Q S0 + P Delta.
//   backward  1. per chunk (k_gdn_bwd_prep): the decays again (W, U, Tm,
//                Delta are the forward's), P (kept for step 3), and the
//                parts of dDelta and of the entering state's gradient that
//                do not go through the state: P^T dO and Q^T diag(b) dO;
//             2. per (batch, head, column block), chunks in reverse
//                (k_gdn_bwd_scan): dDelta = Kd dS + P^T dO, dS0 = bl dS +
//                Q^T dY - W^T dDelta, keeping the gradient of the state leaving
//                each chunk (B*H, NC, dk, dv) and dDelta (B*H, T, dv); s0's is the last;
//             3. per chunk (k_gdn_bwd_chunk): the decays, K K^T and A again
//                (gdn_chunk_prepare) and the chunk's input gradients from S0,
//                dS and dDelta; with its workspace in shared memory and room
//                left there, it first copies the chunk's k, q, v and dO rows
//                beside it (stage_in), which its steps then read instead.
// The per-chunk kernels run a fixed grid of blocks (as many as the GPU keeps
// resident), each walking the chunks gridDim.x apart with its workspace in
// device memory (tape_dalloc); every line of a chunk is a block-wide step.
// Products go through blk_gemm (register tiles of 4 x 4 per thread, 64 x 64
// per block, slices of K in shared memory). Elementwise steps spread (row,
// column) over all the threads; a row's dot products are one warp's (lanes
// over the row, then a butterfly of shuffles in double); the running sums
// over a chunk's positions (Gamma, dg) are warp 0's scans (warp0_cumsum).
// (I + A)^-1 is a forward substitution: for chunks of up to 64 positions by
// warps, two columns each, with A^T in shared memory and the columns in
// registers, no barrier (solve_warps); longer ones row by row, one barrier
// per row.
// The scans (the section "the scans" says more) are latency-bound when there
// are few (batch, head) pairs and many chunks (T = 65,536 at B = 1: 1,024
// chunks in a row), so a block keeps its slice of the state (dk x NVB) in
// shared memory for the whole walk, and per chunk only streams its operands
// in (W, K, U or P^T dO: cp.async, the next chunk's while it computes this
// one) and runs two block-wide steps of its own, each ended by one barrier:
// the chunk's rows of Delta (dDelta) from the state, then the state's rows
// from Delta (dDelta). NVB, 32 when there are (batch, head) pairs enough to
// fill the GPU, is 16 or 8 when there are few (chosen on the host, per launch:
// more blocks walk side by side, each with less work per chunk); a column's
// arithmetic is the same whichever, so the results are too. When even that
// leaves most of the GPU idle for a long walk (B = 1, T = 65,536: 1,024
// chunks), the scan takes two levels (scan_groups): the chunks in groups,
// each group walked alone from 0 (and from the identity, for its transition
// Phi, the product of its chunks' bl I - Kd^T W: a state is affine in the
// state entering the group), a short walk across the groups
// (k_gdn_scan_join: S <- Phi S + L), then each group again from its
// entering state, writing what the one-level walk writes. The backward the
// same in reverse, with the transposed transitions.
// Recurrent form: one block per (batch, head); a thread owns a column of S,
// so the forward needs no barrier. The backward replays a stretch of `chunk`
// tokens from its saved state and walks it in reverse, per token a column
// phase then a row phase.
// Precision: float32 (float64 in that build) throughout, except under
// [train] precision = bf16 with device = cuda in the float32 build
// (cu_bf16_products, ops_matmul.cu's switch, kept in the node's GDN_ARG_BF16 by
// the forward so that its backward rounds as it did): then the per-chunk
// kernels' instances with BF = true run, whose tile products take bf16
// operands, rounded to nearest even, with float32 sums (blk_mm<true>,
// gdn_bf16.cuh), as flash-linear-attention's chunk kernels do:
//   forward   K K^T, Q K^T (P), W = Tm Xw, U = Tm Xu, Q S0 and P Delta (O);
//   backward  the same again, P^T dO, Q^T dY, dQ = dY S0^T, dP = dO Delta^T,
//             dQ += dQK K, dK += dQK^T Q, dXw = Tm^T dW, dXu = Tm^T dDelta,
//             dA = -(dXw W^T + dXu U^T), dK += dKK K + dKK^T K.
// Each operand is the float32 matrix that the float32 path multiplies at
// that place (as this path computed it), rounded elementwise; Xw = diag(beta
// b) K and the like are formed in float32 and then rounded once. Stay
// float32: the decays and gates and their exps, A, the solve of (I + A)^-1,
// the scans (both the state's products W S0, Kd^T Delta and their backward
// counterparts Kd dS, W^T dDelta: the state carried between chunks is never
// rounded, and its bf16 copy enters only Q S0 and dY S0^T), the products that
// redo or differentiate those (Delta = U - W S0 in chunk_prepare, dKd =
// Delta dS^T, dW = -dDelta S0^T), the row dots and every output and sum. So
// the backward is the gradient of the forward's function with the rounding
// taken as the identity (straight through), its own products rounded alike.
// The recurrent form (gdn_naive.cu) stays float32.
// Gradients go to scratch (or straight into a fresh buffer that no other
// input shares) and are then added to the inputs' buffers in input order, so
// inputs that are one tensor get the sum. No atomics: every sum is made in a
// fixed order (one thread's chain, or a warp's lanes and shuffles in a fixed
#ifndef AG_GDN_COMMON_CUH
#define AG_GDN_COMMON_CUH

// pattern, then the groups in order), the same whichever block takes a chunk.
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.cuh"
#include "gdn_node.h"

#define GDN_NT 256   // threads of a block of the chunked form (blk_gemm's layout needs exactly this)
// Blocks per multiprocessor that the per-chunk kernels are compiled for (at
// most 65536 / (256 GDN_MINB) registers a thread): 2 for k_gdn_fwd_prep,
// k_gdn_fwd_out and k_gdn_bwd_prep (blk_gemm's register tiles would take them
// to one block otherwise); GDN_CHUNK_MINB for k_gdn_bwd_chunk, 2 as well:
// a block waiting at one of its barriers (blk_gemm's per-slice ones, the
// row steps') then leaves the multiprocessor to the other. In 128
// registers it spills about 420 bytes (stores) / 1,150 (loads) a thread,
// mostly the workspace pointers around the calls of the non-inlined
// blk_gemm_s, and is still faster: gpu_d1024_gdn 486.1 -> 474.4 ms a step
// on the H200 (one device call, A/B; 1: 254 registers, no spill).
// (Keeping those pointers in shared memory instead, written by thread 0,
// spilled less but gave wrong dK and dbeta at 2 blocks per SM, right ones
// at 1: see docs/cuda.md, "Not yet".)
#ifndef GDN_MINB
#define GDN_MINB 2
#endif
#ifndef GDN_CHUNK_MINB
#define GDN_CHUNK_MINB 2
#endif

// Everything a kernel reads, by value.
struct GdnArgs {
    const real *q, *k, *v, *beta, *g, *s0;   // s0 may be NULL (zeros)
    const int *first;                        // (B, T) document starts (docs.h), device copy, or NULL
    real *o, *sT, *saved;                    // saved: NULL when the node is not recorded
    const real *dout, *dsT;                  // backward: the outputs' gradients, either may be NULL
    real *gq, *gk, *gv, *gbeta, *gg, *gs0;   // backward: where the gradients go (written whole), NULL: not wanted
    unsigned char *ws;                       // per-block workspace, ws_stride bytes each
    size_t ws_stride;
    size_t ws_shared;                        // bytes of the workspace's start kept in the block's shared
                                             // memory instead (the SM kernels, gdn_ws_plan); 0: none
    size_t in_shared;                        // bytes after those where the backward's chunk kernel copies
                                             // a chunk's k, q, v, dO rows (stage_in); 0: it reads them in place
    int B, T, H, dk, dv, C, NC, ldk, ldv;
    int Cw;                                  // min(C, T): the longest chunk, what workspaces hold
    // The chunked form's per-op rows, head-major: row t of head bh at (bh T + t).
    int64_t items;                           // B H NC: the chunks
    int NV;                                  // the scans' column blocks per head: ceil(dv / NVB)
    int scanR, scanNS, scanP, scan_vec;      // the scans' tile rows, stages, W/K row pitch, SCAN_VEC_*
    bool scan_acc;                           // the scans' chunks span several tiles (step 2 carries sums)
    // The two-level scan (the section "the scans"): SCAN_WHOLE walks every
    // chunk in one go; else groups of scanG chunks (scanNG of them), first
    // each group alone (SCAN_LOCAL, with NVt column blocks more for the
    // transition), then k_gdn_scan_join across groups, then each group
    // again from its entering state (SCAN_SEEDED).
    int scan_mode, scanG, scanNG, NVt;
    real *scan_grp;                          // (B H, scanNG, dk, dv + dk) per group: its local end state | transition
    real *scan_E;                            // (B H, scanNG, dk, dv) per group: forward the state entering it,
                                             // backward the gradient of the state leaving it
    real *Wb;                                // (B H, T, dk) W of every chunk
    real *Ub;                                // (B H, T, dv) forward: U (not recorded), then Delta; backward:
                                             // P^T dO, then dDelta
    const real *Uin;                         // the rows the scan reads: forward U (Usv or Ub), backward Ub
    // A recorded chunked node's rows after its states (gdn_node.h), NULL when
    // not recorded: U, Delta (the forward's Ub) and Tm of every chunk (its
    // L x L, leading dim L, from the chunk's first row; Cw floats a row).
    real *Usv, *Dsv, *Tmb;
    real *Pb;                                // backward: (B H, T, Cw) P of every chunk, as Tmb
    real *ekb;                               // (B H, T) ek of every chunk
    real *blb;                               // (B H, NC) bl of every chunk
    real *states;                            // (B H, NC, dk, dv) the state entering each chunk (saved or scratch)
    real *dsb;                               // backward (B H, NC, dk, dv): Q^T dY, then dLoss/d(state leaving the chunk)
};

static inline GdnArgs gdn_args(const Node *n) {
    GdnArgs a;
    memset(&a, 0, sizeof a);
    a.B = n->iarg[GDN_ARG_B];
    a.T = n->iarg[GDN_ARG_T];
    a.H = n->iarg[GDN_ARG_H];
    a.dk = n->iarg[GDN_ARG_DK];
    a.dv = n->iarg[GDN_ARG_DV];
    a.C = n->iarg[GDN_ARG_C];
    a.NC = (a.T + a.C - 1) / a.C;
    a.Cw = a.C < a.T ? a.C : a.T;
    a.ldk = a.H * a.dk;
    a.ldv = a.H * a.dv;
    a.q = n->in[GDN_IN_Q]->data;
    a.k = n->in[GDN_IN_K]->data;
    a.v = n->in[GDN_IN_V]->data;
    a.beta = n->in[GDN_IN_BETA]->data;
    a.g = n->in[GDN_IN_G]->data;
    a.s0 = n->in[GDN_IN_S0] ? n->in[GDN_IN_S0]->data : NULL;
    a.o = n->out[0]->data;
    a.sT = n->out[1]->data;
    a.saved = (real *)n->saved;
    // n->aux is host memory: the kernels read a device copy.
    a.first = cu_first_to_device(n->tape, (const int *)n->aux, a.B, a.T);
    return a;
}

// Four consecutive reals of shared memory, 16-byte aligned.
struct R4 {
    real v[4];
};
__device__ __forceinline__ R4 ld4(const real *p) {
    R4 r;
#ifdef AG_DOUBLE
    double2 x = reinterpret_cast<const double2 *>(p)[0], y = reinterpret_cast<const double2 *>(p)[1];
    r.v[0] = x.x, r.v[1] = x.y, r.v[2] = y.x, r.v[3] = y.y;
#else
    float4 x = *reinterpret_cast<const float4 *>(p);
    r.v[0] = x.x, r.v[1] = x.y, r.v[2] = x.z, r.v[3] = x.w;
#endif
    return r;
}
__device__ __forceinline__ void st4(real *p, const real *v) {
#ifdef AG_DOUBLE
    reinterpret_cast<double2 *>(p)[0] = make_double2(v[0], v[1]);
    reinterpret_cast<double2 *>(p)[1] = make_double2(v[2], v[3]);
#else
    *reinterpret_cast<float4 *>(p) = make_float4(v[0], v[1], v[2], v[3]);
#endif
}

// Where the backward writes each input's gradient: straight into the input's
// buffer when it is fresh and no other input shares it, else into scratch
// that gdn_grads_finish adds in input order (the first of a shared buffer,
// fresh, is written; the later ones add).
struct GdnGrads {
    real *dst[GDN_N_IN], *tmp[GDN_N_IN];
    bool fresh[GDN_N_IN];
    int64_t n[GDN_N_IN];
};

// gdn_chunk_backward.cu: plan the gradients' buffers (sets a's g* pointers),
// and after the backward's kernels add the scratch ones to the inputs.
void gdn_grads_plan(Node *n, GdnGrads *gr, GdnArgs *a);
void gdn_grads_finish(const GdnGrads *gr);

// gdn_scan.cu: step 2 of the chunked forward (bwd false) or backward (bwd
// true): the state's recurrence across the chunks of every (batch, head).
void gdn_scan(Node *n, GdnArgs &a, bool bwd);

#endif

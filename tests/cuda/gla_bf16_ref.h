// gla_bf16_ref.h: the float64 reference of op_gla_dt with bf16 chunk
// products and its float32 bounds (test_cuda_gla_bf16_ref.c), for
// test_cuda_gla_bf16.c, whose header states the semantics and the bound.
#ifndef GLA_BF16_REF_H
#define GLA_BF16_REF_H

#include "gla.h"

#define CH 64   // the GPU's chunk (GLA_C); the CPU's chunk in these runs

typedef struct {
    int B, T, H, dk, dv;
    bool g, dt, s0;
    const int *doc_start;   // (B, T) or NULL
} Case;

enum { X_Q, X_K, X_V, X_G, X_DT, X_S0, N_X };
enum { O_O, O_S, O_DQ, O_DK, O_DV, O_DG, O_DDT, O_DS0, N_OUT };

typedef struct {
    Tensor *x[N_X];   // q, k, v, g (mild decay), dt, s0: all made, a case uses some
    real *dO, *dS;    // the seeds of o and of the final state
} Inputs;

// Which roundings a reference makes (bits); ROUND_ALL is the semantics.
// RXK: the state's part's e β k, RXQ: its gradient's part's exp(G) q. PRE:
// those two rounded before their decay scaling instead; PART: the scores
// of a partial chunk rounded too. (Both mistakes, for the tests' variants.)
enum {
    RQ = 1,
    RK = 2,
    RV = 4,
    RDO = 8,
    RA = 16,
    RDP = 32,
    RS = 64,
    RDS = 128,
    RXK = 256,
    RXQ = 512,
    ROUND_ALL = 1023,
    PRE = 1024,
    PART = 2048
};

typedef struct {
    double *v[N_OUT];   // o, final state, dq, dk, dv, dg, ddt, ds0
    double *t[N_OUT];   // their bounds (ROUND_ALL's)
} Ref;

int64_t out_numel(const Case *c, int i);
// The reference of the case with the roundings in `mode`, both outputs
// seeded (in->dO, in->dS), every gradient formed (unused ones are zeros).
Ref reference(const Case *c, const Inputs *in, int mode);
void ref_free(Ref *r);
// Where element e of output i is, for messages.
void where_str(char *s, size_t len, const Case *c, int i, int64_t e);

#endif

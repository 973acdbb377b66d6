// test_cuda_decode.c: decoding on the GPU (lm_step with a GPU cache) against
// decoding on the CPU, step by step, for each mixer kind and a hybrid: two
// rows, one of which starts a new document midway (lm_cache_reset_row), so
// the caches' row resets, the KV cache's per-row start and RoPE positions
// counted from it are covered. Then the GPU's token-by-token logits against
// the GPU's own parallel forward over the same documents (the decode-parity
// test of the CPU suite, on the GPU). A long attention case (300 keys, heads
// of 40) covers the decode kernel's loops over keys, lanes and columns.
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_check.h"
#include "lm.h"

#define B_ 2

typedef struct {
    const char *layers;
    int d_model, heads, dk, dv;
    int T;          // decoded positions
    int reset_at;   // row 1 starts a new document at this position
} DecodeCase;

static LMConfig decode_config(const DecodeCase *dc) {
    LMConfig c = test_tiny_lm_config(dc->layers);
    c.vocab_size = 61;
    c.d_model = dc->d_model;
    c.d_ff = 2 * dc->d_model;
    c.mixer = mixer_config_default(dc->d_model, dc->heads, dc->dk, dc->dv);
    c.mixer.chunk_size = 8;
    c.mixer.conv_size = 4;
    Status s = lm_parse_layers(&c, dc->layers);
    cr_assert(s.ok, "%s", s.msg);
    return c;
}

// Decodes dc->T positions of B_ rows on device d; returns the logits (T, B_, V) on the host.
static real *decode_run(const DecodeCase *dc, Device d, real **parallel) {
    LMConfig cfg = decode_config(dc);
    ParamStore ps;
    params_init(&ps);
    LM lm;
    lm_create(&lm, &cfg, &ps);
    params_finalize(&ps, 17);
    if (d != DEVICE_CPU) params_to_device(&ps, d);
    real *out = cuda_decode_logits(&lm, d, B_, dc->T, dc->reset_at, parallel);
    lm_destroy(&lm);
    params_free(&ps);
    return out;
}

static void check_decode(const DecodeCase *dc) {
    cuda_require();
    int V = decode_config(dc).vocab_size;
    real *par = NULL;
    real *c = decode_run(dc, DEVICE_CPU, NULL);
    real *g = decode_run(dc, DEVICE_CUDA, &par);
    double worst_cpu = 0, worst_par = 0;
    for (int t = 0; t < dc->T; t++)
        for (int b = 0; b < B_; b++) {
            const real *gs = g + ((size_t)t * B_ + b) * V;
            double e = max_rel_diff(c + ((size_t)t * B_ + b) * V, gs, V);
            cr_assert(e <= FORM_TOL, "%s: position %d row %d: GPU decode vs CPU decode %.3e", dc->layers, t, b, e);
            double p = max_rel_diff(par + ((size_t)b * dc->T + t) * V, gs, V);
            cr_assert(p <= DECODE_TOL, "%s: position %d row %d: GPU decode vs GPU parallel forward %.3e", dc->layers,
                      t, b, p);
            worst_cpu = fmax(worst_cpu, e);
            worst_par = fmax(worst_par, p);
        }
    cr_log_info("%s: T %d, worst GPU decode vs CPU decode %.3e, vs GPU parallel %.3e", dc->layers, dc->T, worst_cpu,
                worst_par);
    free(c);
    free(g);
    free(par);
}

Test(cuda_decode, attention) { check_decode(&(DecodeCase){"attn,attn", 64, 4, 16, 16, 23, 9}); }
Test(cuda_decode, linear) { check_decode(&(DecodeCase){"linear,linear", 64, 4, 16, 16, 23, 9}); }
Test(cuda_decode, mamba) { check_decode(&(DecodeCase){"mamba,mamba", 64, 4, 16, 16, 23, 9}); }
Test(cuda_decode, mamba2) { check_decode(&(DecodeCase){"mamba2,mamba2", 64, 4, 16, 16, 23, 9}); }
Test(cuda_decode, gdn) { check_decode(&(DecodeCase){"gdn,gdn", 64, 4, 16, 16, 23, 9}); }
Test(cuda_decode, gdp) { check_decode(&(DecodeCase){"gdp,gdp", 64, 4, 16, 16, 23, 9}); }
Test(cuda_decode, kda) { check_decode(&(DecodeCase){"kda,kda", 64, 4, 16, 16, 23, 9}); }
Test(cuda_decode, hybrid) { check_decode(&(DecodeCase){"gdn,attn,mamba,linear", 64, 4, 16, 16, 23, 1}); }
// 300 keys (> the 256 threads of the output kernel), heads of 40 (> a warp's lanes, not a multiple of 32).
Test(cuda_decode, long_attention_wide_heads) { check_decode(&(DecodeCase){"attn", 80, 2, 40, 40, 300, 120}); }

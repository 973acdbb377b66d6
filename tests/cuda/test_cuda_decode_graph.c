// test_cuda_decode_graph.c: decoding steps replayed from a CUDA graph
// (lm_decode_graph.h, generate --cuda-graph) against the same steps run
// eagerly: every step's logits and the ids picked from them (greedy, so a
// difference in the logits changes what follows) must have the same bits,
// for each recurrent mixer kind and attn (its cache's length read from the
// device), after a prompt run in parallel and without one, with a row
// started afresh mid-way (a document boundary); attn's step that reads the
// length from the device has the bits of the one that takes it from the
// host (a cache too long for the former's grid); attn_dsa is refused with
// the reason (its decoding has its own tests); a capture that fails falls
// back, with the reason, to the same bits.
#include <criterion/criterion.h>
#include <string.h>

#include "cuda_check.h"
#include "lm_decode_graph.h"

#define B_ 2
#define STEPS 9

typedef struct {
    const char *layers;
    int prompt;     // positions of prefill first (0: none)
    int reset_at;   // row 1 starts afresh before this step (-1: never)
    bool profile;   // the tape profiles (it synchronises: the capture must fail)
    int max_T;      // the cache's positions (0: prompt + STEPS)
    int grow_at;    // before this step (> 0) the tape's arena grows and is made again
} DecodeGraphCase;

typedef struct {
    real *logits;   // (STEPS, B_, V)
    int ids[STEPS][B_];
    LMDecodeGraph st;   // counters and why (pointers cleared)
} DecodeGraphRun;

// The first largest logit of a row.
static int argmax(const real *x, int V) {
    int best = 0;
    for (int i = 1; i < V; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

static void decode_run(const DecodeGraphCase *dc, bool graphs, DecodeGraphRun *r) {
    LMConfig cfg = cuda_small_lm_config(dc->layers);
    ParamStore ps;
    params_init(&ps);
    LM lm;
    lm_create(&lm, &cfg, &ps);
    params_finalize(&ps, 11);
    params_to_device(&ps, DEVICE_CUDA);
    int V = cfg.vocab_size;
    Tape tp;
    tape_init_on(&tp, DEVICE_CUDA);
    tape_no_grad_push(&tp);
    if (dc->profile) tape_profile(&tp, true);
    LMCache *cache = lm_cache_new_on(&lm, B_, dc->max_T ? dc->max_T : dc->prompt + STEPS, DEVICE_CUDA);
    LMDecodeGraph dg;
    lm_decode_graph_init(&dg, &lm, DEVICE_CUDA, graphs);
    dg.quiet = true;
    real *last = malloc((size_t)B_ * V * sizeof(real));
    int tok[B_];
    for (int b = 0; b < B_; b++) tok[b] = cuda_decode_token(b, 0);
    if (dc->prompt > 0) {
        int *p = malloc((size_t)B_ * dc->prompt * sizeof(int));
        for (int b = 0; b < B_; b++)
            for (int t = 0; t < dc->prompt; t++) p[b * dc->prompt + t] = cuda_decode_token(b, t);
        Tensor *lg = lm_prefill(&tp, &lm, cache, p, dc->prompt);
        dev_to_host(last, lg->data, (size_t)B_ * V * sizeof(real), DEVICE_CUDA);
        tape_reset(&tp);
        for (int b = 0; b < B_; b++) tok[b] = argmax(last + (size_t)b * V, V);
        free(p);
    }
    r->logits = malloc((size_t)STEPS * B_ * V * sizeof(real));
    for (int s = 0; s < STEPS; s++) {
        if (s == dc->reset_at) lm_cache_reset_row(&lm, cache, 1);
        if (dc->grow_at > 0 && s == dc->grow_at) cuda_arena_made_again(&tp, "step", s);
        for (int b = 0; b < B_; b++) r->ids[s][b] = tok[b];
        real *out = r->logits + (size_t)s * B_ * V;
        lm_decode_graph_step(&dg, &tp, &lm, cache, tok, out);
        for (int b = 0; b < B_; b++) tok[b] = argmax(out + (size_t)b * V, V);
    }
    cr_assert_eq(cache->pos, dc->prompt + STEPS, "%s: the cache counts %d positions, %d decoded", dc->layers,
                 cache->pos, dc->prompt + STEPS);
    r->st = dg;
    r->st.g = NULL;
    r->st.tok = NULL;
    lm_decode_graph_free(&dg);
    free(last);
    lm_cache_free(&lm, cache);
    tape_free(&tp);
    lm_destroy(&lm);
    params_free(&ps);
}

// Asserts that e and g have the same bits (g: with graphs when `graphs`).
static void same_decoding(const DecodeGraphCase *dc, const DecodeGraphRun *e, const DecodeGraphRun *g,
                          const char *how) {
    int V = cuda_small_lm_config(dc->layers).vocab_size;
    for (int s = 0; s < STEPS; s++)
        for (int b = 0; b < B_; b++) {
            cr_assert_eq(e->ids[s][b], g->ids[s][b], "%s: step %d row %d: id %d eagerly, %d %s", dc->layers, s, b,
                         e->ids[s][b], g->ids[s][b], how);
            const real *x = e->logits + ((size_t)s * B_ + b) * V, *y = g->logits + ((size_t)s * B_ + b) * V;
            for (int i = 0; i < V; i++)
                cr_assert(memcmp(&x[i], &y[i], sizeof(real)) == 0,
                          "%s: step %d row %d: logit [%d] %.17g eagerly, %.17g %s (%lld replays, %lld captures%s%s)",
                          dc->layers, s, b, i, (double)x[i], (double)y[i], how, (long long)g->st.replays,
                          (long long)g->st.captures, g->st.off ? ", off: " : "", g->st.why);
        }
}

// Both runs; asserts the same bits; returns the graph run's counters.
static LMDecodeGraph compare(const DecodeGraphCase *dc) {
    cuda_require();
    DecodeGraphRun e, g;
    decode_run(dc, false, &e);
    decode_run(dc, true, &g);
    same_decoding(dc, &e, &g, "with graphs");
    cr_assert(e.st.replays == 0 && e.st.captures == 0 && e.st.eager == STEPS, "%s: the eager run replayed",
              dc->layers);
    free(e.logits);
    free(g.logits);
    return g.st;
}

// A case that must replay: captured once the arena settled, every later step replayed.
static void replays(DecodeGraphCase dc) {
    LMDecodeGraph st = compare(&dc);
    cr_assert(!st.off, "%s: the capture failed: %s", dc.layers, st.why);
    cr_assert(st.captures == 1 && st.replays + st.eager == STEPS && st.replays >= STEPS - 3,
              "%s: %lld captures, %lld replays, %lld eager steps; expected 1 capture by the third step", dc.layers,
              (long long)st.captures, (long long)st.replays, (long long)st.eager);
}

Test(cuda_decode_graph, gdn) { replays((DecodeGraphCase){"gdn,gdn", 5, -1, false, 0}); }
Test(cuda_decode_graph, mamba) { replays((DecodeGraphCase){"mamba,mamba", 5, -1, false, 0}); }
Test(cuda_decode_graph, linear) { replays((DecodeGraphCase){"linear,linear", 5, -1, false, 0}); }
Test(cuda_decode_graph, kda) { replays((DecodeGraphCase){"kda,kda", 5, -1, false, 0}); }
Test(cuda_decode_graph, gdp) { replays((DecodeGraphCase){"gdp,gdp", 5, -1, false, 0}); }
Test(cuda_decode_graph, mamba2) { replays((DecodeGraphCase){"mamba2,mamba2", 5, -1, false, 0}); }
Test(cuda_decode_graph, attn) { replays((DecodeGraphCase){"attn,attn", 5, -1, false, 0}); }
// A prompt over two of the decode kernels' parts (256 keys), the cache longer than what is decoded.
Test(cuda_decode_graph, attn_long_prompt) { replays((DecodeGraphCase){"attn,gdn", 300, -1, false, 700}); }
// The arena made again after the capture (its memory freed, the new block
// often at the same address): the old graph is not replayed; the step runs
// eagerly and the next one is captured in the new block.
Test(cuda_decode_graph, arena_made_again_is_captured_again) {
    DecodeGraphCase dc = {"gdn,attn", 5, -1, false, 0, 5};
    LMDecodeGraph st = compare(&dc);
    cr_assert(!st.off && st.captures == 2 && st.replays == 7 && st.eager == 2,
              "arena made again before step 5: %lld captures, %lld replays, %lld eager; expected 2 (at 1 and 6), 7, "
              "2 (0 and 5) (off: %d %s)",
              (long long)st.captures, (long long)st.replays, (long long)st.eager, st.off, st.why);
}

Test(cuda_decode_graph, tiny_hybrid_layers) { replays((DecodeGraphCase){"gdn,gdn,gdn,attn", 5, -1, false, 0}); }
Test(cuda_decode_graph, recurrent_hybrid_without_a_prompt) {
    replays((DecodeGraphCase){"gdn,mamba,linear,kda", 0, -1, false, 0});
}
Test(cuda_decode_graph, attn_without_a_prompt) { replays((DecodeGraphCase){"attn,mamba", 0, -1, false, 0}); }
Test(cuda_decode_graph, a_row_started_afresh) { replays((DecodeGraphCase){"gdn,mamba2,gdp", 6, 5, false, 0}); }
Test(cuda_decode_graph, an_attn_row_started_afresh) { replays((DecodeGraphCase){"attn,gdn,attn", 6, 4, false, 0}); }

// attn's step reading its cache's length from the device (every GPU step
// whose cache fits the grid, the graphs' too) against the step that takes it
// from the host (a cache of more than 65535 x 8 positions): the same bits,
// rows reset included.
Test(cuda_decode_graph, attn_device_length_equals_host_length) {
    cuda_require();
    DecodeGraphCase dev = {"attn,gdn,attn", 6, 4, false, 0}, host = dev;
    host.max_T = 65535 * 8 + 1;
    DecodeGraphRun a, b;
    decode_run(&host, false, &a);
    decode_run(&dev, false, &b);
    same_decoding(&dev, &a, &b, "reading the length from the device");
    free(a.logits);
    free(b.logits);
}

// A capture that cannot be made (the profiler synchronises) turns graphs
// off with the reason; every step runs eagerly, with the same bits.
Test(cuda_decode_graph, failed_capture_falls_back) {
    LMDecodeGraph st = compare(&(DecodeGraphCase){"gdn,attn", 5, -1, true, 0});
    cr_assert(st.off && st.why[0] && st.replays == 0 && st.captures == 0 && st.eager == STEPS,
              "off %d (%s), %lld replays, %lld eager", st.off, st.why, (long long)st.replays, (long long)st.eager);
}

// attn_dsa (its step picks keys on the host) is refused, naming the layer,
// and no graph is made for it.
Test(cuda_decode_graph, dsa_is_refused) {
    cuda_require();
    LMConfig cfg = cuda_small_lm_config("gdn,attn_dsa");
    ParamStore ps;
    params_init(&ps);
    LM lm;
    lm_create(&lm, &cfg, &ps);
    params_finalize(&ps, 11);
    char why[256];
    const char *r = lm_decode_graph_refusal(&lm, why, sizeof why);
    cr_assert(r && strstr(r, "layer 1 is attn_dsa"), "refusal '%s', expected it to name layer 1, attn_dsa",
              r ? r : "(none)");
    LMDecodeGraph dg;
    lm_decode_graph_init(&dg, &lm, DEVICE_CUDA, true);
    cr_assert(dg.g == NULL, "a graph was made for a refused model");
    lm_decode_graph_free(&dg);
    lm_destroy(&lm);
    params_free(&ps);
}

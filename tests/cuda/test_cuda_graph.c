// test_cuda_graph.c: training micro-batches replayed from a CUDA graph
// (lm_graph.h, [train] cuda_graph) against the same micro-batches run
// eagerly: every loss and, after the AdamW steps, every parameter must have
// the same bits (the same kernels in the same order), for each mixer kind,
// with tokens and targets that change every step (the replay reads them
// afresh), with documents (the same flags every step: replayed; flags that
// differ every step: run eagerly; one boundary between replays), with
// accum_steps 2, with carried states, and when the capture fails (it falls
// back, with the reason, to the same bits); and the trainer's run with
// [train] cuda_graph = on against off (the optimizer's step replayed from its
// own graph: test_cuda_optim_step.c).
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "cuda_check.h"
#include "lm_graph.h"
#include "optim.h"
#include "trainer.h"

#define B_ 3
#define T_ 37   // not a multiple of the chunk
#define N_ (B_ * T_)
#define STEPS 6   // graphs capture at the third micro-batch: several replays after it

typedef enum { BATCH_DOCS_NONE, BATCH_DOCS_SAME, BATCH_DOCS_VARY, BATCH_DOCS_ONCE } BatchDocs;

typedef struct {
    int accum;
    BatchDocs docs;
    bool carry, profile;   // profile: the tape profiles (it synchronises: the capture must fail)
    int grow_at;           // before this micro-batch (> 0) the tape's arena grows and is made again
} GraphCase;

typedef struct {
    double loss[STEPS];
    real *params;   // host copy after the last step
    int64_t numel;
    LMGraph st;     // counters and why (pointers cleared)
    const void *grown_from, *grown_to;   // the arena's block before and after it grew (grow_at)
} GraphRun;

// Micro-batch k's ids, targets (one ignored target, moving) and flags.
static void batch_of(int k, int V, BatchDocs docs, int *x, int *y, int *doc) {
    for (int i = 0; i < N_; i++) {
        x[i] = (i * 37 + 11 + 13 * k) % V;
        y[i] = (i * 53 + 5 + 7 * k) % V;
        doc[i] = 0;
    }
    y[(5 * k + 3) % N_] = -1;
    if (docs == BATCH_DOCS_SAME) {   // documents of 10, 20 and 7 tokens in row 1
        doc[1 * T_ + 10] = 1;
        doc[1 * T_ + 30] = 1;
    } else if (docs == BATCH_DOCS_VARY) {   // a boundary that moves every micro-batch
        doc[1 * T_ + 3 + k % 30] = 1;
        doc[2 * T_ + 20] = k % 2;
    } else if (docs == BATCH_DOCS_ONCE && k == 3) {   // one boundary, in the fourth micro-batch only
        doc[1 * T_ + 10] = 1;
    }
}

static void graph_run(const char *layers, const GraphCase *gc, bool graphs, GraphRun *r) {
    LMConfig cfg = cuda_small_lm_config(layers);
    ParamStore ps;
    params_init(&ps);
    LM lm;
    lm_create(&lm, &cfg, &ps);
    params_finalize(&ps, 7);
    params_to_device(&ps, DEVICE_CUDA);
    Optimizer opt;
    adamw_init(&opt, &ps, 0.9, 0.95, 1e-8, 0.1);
    Tape tp;
    tape_init_on(&tp, DEVICE_CUDA);
    if (gc->profile) tape_profile(&tp, true);
    LMCache *carry = gc->carry ? lm_cache_new_on(&lm, B_, 1, DEVICE_CUDA) : NULL;
    LMGraph gr;
    lm_graph_init(&gr, DEVICE_CUDA, graphs);
    gr.quiet = true;
    int x[N_], y[N_], doc[N_];   // one set of arrays, rewritten for every micro-batch (as the trainer's)
    for (int st = 0; st < STEPS; st++) {
        params_zero_grad(&ps);
        double sum = 0;
        for (int a = 0; a < gc->accum; a++) {
            if (gc->grow_at > 0 && st * gc->accum + a == gc->grow_at) {
                // (As gpu_d1024_hybrid's first batch with a document boundary did on an H100, where the new
                // block was made at the old one's address.)
                r->grown_from = cuda_arena_made_again(&tp, "micro-batch", gc->grow_at);
                r->grown_to = arena_settled(&tp.data)->mem;
            }
            batch_of(st * gc->accum + a, cfg.vocab_size, gc->docs, x, y, doc);
            sum += lm_graph_micro_batch(&gr, &tp, &lm, x, y, gc->docs != BATCH_DOCS_NONE ? doc : NULL, B_, T_, carry);
        }
        r->loss[st] = sum / gc->accum;
        if (gc->accum > 1) optim_scale_grads(&ps, 1.0 / gc->accum);
        optim_clip_grad_norm(&ps, 0.5);
        optim_step(&opt, &ps, 3e-3 * (st + 1));   // a schedule: the lr changes every step
    }
    r->numel = ps.numel;
    r->params = malloc((size_t)ps.numel * sizeof(real));
    memcpy(r->params, params_pull(&ps), (size_t)ps.numel * sizeof(real));
    r->st = gr;
    r->st.g = NULL;
    r->st.key_doc = r->st.prev_doc = NULL;
    r->st.loss_dev = NULL;
    lm_graph_free(&gr);
    if (carry) lm_cache_free(&lm, carry);
    tape_free(&tp);
    optim_free(&opt);
    lm_destroy(&lm);
    params_free(&ps);
}

// Both runs; asserts the same bits; returns the graph run's counters.
static LMGraph compare_graph(const char *layers, const GraphCase *gc) {
    cuda_require();
    GraphRun e = {0}, g = {0};
    graph_run(layers, gc, false, &e);
    graph_run(layers, gc, true, &g);
    if (gc->grow_at)
        cr_log_info("%s: the arena grew before micro-batch %d: its block made again %s (%p -> %p)", layers,
                    gc->grow_at, g.grown_from == g.grown_to ? "at the same address" : "elsewhere", g.grown_from,
                    g.grown_to);
    for (int s = 0; s < STEPS; s++)
        cr_assert(memcmp(&e.loss[s], &g.loss[s], sizeof(double)) == 0,
                  "%s: step %d loss %.17g eagerly, %.17g with graphs (%lld replays, %lld captures%s%s)", layers, s,
                  e.loss[s], g.loss[s], (long long)g.st.replays, (long long)g.st.captures, g.st.off ? ", off: " : "",
                  g.st.why);
    int64_t bad = -1, nbad = 0;
    for (int64_t i = 0; i < e.numel; i++)
        if (memcmp(&e.params[i], &g.params[i], sizeof(real)) != 0) {
            if (bad < 0) bad = i;
            nbad++;
        }
    cr_assert(bad < 0, "%s: %lld of %lld parameters differ after %d steps; the first, [%lld]: %.17g eagerly, %.17g "
                       "with graphs (%lld replays)",
              layers, (long long)nbad, (long long)e.numel, STEPS, (long long)bad, (double)e.params[bad],
              (double)g.params[bad], (long long)g.st.replays);
    cr_assert(e.st.replays == 0 && e.st.captures == 0, "%s: the eager run replayed", layers);
    free(e.params);
    free(g.params);
    return g.st;
}

// A case that must replay: captured once, every later micro-batch replayed.
static void replays(const char *layers, GraphCase gc) {
    LMGraph st = compare_graph(layers, &gc);
    int n = STEPS * gc.accum;
    cr_assert(!st.off, "%s: the capture failed: %s", layers, st.why);
    cr_assert(st.captures == 1 && st.replays == n - 2 && st.eager == 2,
              "%s: %lld captures, %lld replays, %lld eager micro-batches; expected 1, %d, 2 (capture at the third)",
              layers, (long long)st.captures, (long long)st.replays, (long long)st.eager, n - 2);
}

static const GraphCase PLAIN = {.accum = 1};

Test(cuda_graph, gdn) { replays("gdn,gdn", PLAIN); }
Test(cuda_graph, attention) { replays("attn,attn", PLAIN); }
Test(cuda_graph, mamba) { replays("mamba,mamba", PLAIN); }
Test(cuda_graph, linear) { replays("linear,linear", PLAIN); }
Test(cuda_graph, mamba2) { replays("mamba2,mamba2", PLAIN); }
Test(cuda_graph, gdp) { replays("gdp,gdp", PLAIN); }
Test(cuda_graph, kda) { replays("kda,kda", PLAIN); }
Test(cuda_graph, hybrid) { replays("gdn,attn,mamba,linear", PLAIN); }
Test(cuda_graph, hybrid_same_documents) { replays("gdn,attn,mamba,linear", (GraphCase){.accum = 1, .docs = BATCH_DOCS_SAME}); }
Test(cuda_graph, kda_gdp_same_documents) { replays("kda,gdp,attn", (GraphCase){.accum = 1, .docs = BATCH_DOCS_SAME}); }
Test(cuda_graph, accum_steps_2) { replays("gdn,attn,mamba", (GraphCase){.accum = 2}); }
Test(cuda_graph, carry) { replays("gdn,mamba,linear,attn", (GraphCase){.accum = 1, .carry = true}); }
Test(cuda_graph, carry_same_documents) {
    replays("gdn,mamba2,kda", (GraphCase){.accum = 2, .docs = BATCH_DOCS_SAME, .carry = true});
}

// Flags that differ every micro-batch change the host's documents' index:
// never replayed, every micro-batch eager, the same bits.
Test(cuda_graph, documents_that_differ_run_eagerly) {
    GraphCase gc = {.accum = 1, .docs = BATCH_DOCS_VARY};
    LMGraph st = compare_graph("gdn,attn,mamba,linear", &gc);
    cr_assert(!st.off && st.replays == 0 && st.eager == STEPS,
              "differing documents: %lld replays, %lld captures, %lld eager (off: %d %s)", (long long)st.replays,
              (long long)st.captures, (long long)st.eager, st.off, st.why);
}

// The trainer's order on a packed corpus of long documents (most batches
// without a boundary, now and then one with): captured at the third
// micro-batch, the fourth (a boundary: another key) eager, then the graph's
// key again. The same bits whether the fifth replays the first graph or (the
// fourth having grown the arena) runs eagerly.
Test(cuda_graph, replay_after_a_boundary_run_eagerly) {
    GraphCase gc = {.accum = 1, .docs = BATCH_DOCS_ONCE};
    LMGraph st = compare_graph("gdn,attn,mamba,linear", &gc);
    cr_log_info("one boundary: %lld replays, %lld captures, %lld eager", (long long)st.replays,
                (long long)st.captures, (long long)st.eager);
    cr_assert(!st.off && st.captures >= 1 && st.replays >= 2 && st.replays + st.eager == STEPS,
              "one boundary: %lld replays, %lld captures, %lld eager (off: %d %s)", (long long)st.replays,
              (long long)st.captures, (long long)st.eager, st.off, st.why);
}

// The arena grows after the capture (more than its block: a second block,
// then one block of the new size, often at the old one's address): the
// graph's memory was freed, so the graph is not replayed again; the next
// micro-batch runs eagerly, the one after is captured in the new block. On
// an H100, gpu_d1024_hybrid at float32 (whose first batch with a document
// boundary grew the arena) replayed the old graph in a new block at the same
// address and faulted (docs/cuda.md).
Test(cuda_graph, arena_made_again_is_captured_again) {
    GraphCase gc = {.accum = 1, .grow_at = 3};
    LMGraph st = compare_graph("gdn,attn,mamba,linear", &gc);
    cr_assert(!st.off && st.captures == 2 && st.replays == 3 && st.eager == 3,
              "arena made again before micro-batch 3: %lld captures, %lld replays, %lld eager; expected 2 (at 2 and "
              "4), 3 (2, 4, 5), 3 (0, 1, 3) (off: %d %s)",
              (long long)st.captures, (long long)st.replays, (long long)st.eager, st.off, st.why);
}

// A capture that meets a synchronisation (the tape's profile waits for the
// stream after each op) fails: graphs go off with the reason, every
// micro-batch runs eagerly, the same bits, nothing stops.
Test(cuda_graph, failed_capture_falls_back) {
    GraphCase gc = {.accum = 1, .profile = true};
    LMGraph st = compare_graph("gdn,attn", &gc);
    cr_assert(st.off && st.replays == 0 && st.captures == 0, "profiled: off %d, %lld replays, %lld captures", st.off,
              (long long)st.replays, (long long)st.captures);
    cr_assert(strstr(st.why, "synchronisation"), "the reason names the synchronisation: '%s'", st.why);
}

// The trainer: cuda_graph = on repeats cuda_graph = off bit for bit (every
// step's loss and the parameters at the end), replaying every micro-batch
// after the first two; a resumed run captures afresh and repeats it too.
Test(cuda_graph, trainer_on_equals_off, .timeout = 240) {
    cuda_require();
    enum { N = 6 };
    const char *path = test_tiny_config("cudagraph", "gdn,attn,mamba", N, NULL, "device = cuda\n");
    char dir[1400];
    snprintf(dir, sizeof dir, "%s", path);
    *strrchr(dir, '/') = 0;
    static Trainer t;
    double loss[3][N];
    real *params[2] = {NULL, NULL};
    const char *sets[3][1] = {{"train.cuda_graph=off"}, {"train.cuda_graph=on"}, {"train.cuda_graph=on"}};
    for (int run = 0; run < 3; run++) {
        // run 2: stopped after 3 steps, then resumed
        TrainerOptions o = {.config = path, .quiet = true, .overwrite = true, .sets = sets[run], .n_sets = 1,
                            .stop_after = run == 2 ? 3 : 0};
        Status s = trainer_setup(&t, &o);
        cr_assert(s.ok, "%s", s.msg);
        cr_assert((t.graph.g != NULL) == (run > 0), "run %d: graphs %s", run, t.graph.g ? "on" : "off");
        int code = trainer_run(&t, &o);
        if (run == 2) {
            cr_assert_eq(code, 130);
            trainer_free(&t);
            TrainerOptions r = {.config = path, .quiet = true, .resume = true, .sets = sets[run], .n_sets = 1};
            s = trainer_setup(&t, &r);
            cr_assert(s.ok, "%s", s.msg);
            cr_assert_eq(trainer_run(&t, &r), 0);
            for (int i = 3; i < N; i++) loss[2][i] = trainer_loss(&t, i);
            trainer_free(&t);
            break;
        }
        cr_assert_eq(code, 0);
        if (run == 1)
            cr_assert(!t.graph.off && t.graph.captures == 1 && t.graph.replays == N - 2,
                      "graphs: %lld captures, %lld replays, %lld eager (%s)", (long long)t.graph.captures,
                      (long long)t.graph.replays, (long long)t.graph.eager, t.graph.why);
        // The optimizer's step: queued as one with graphs off, captured at the first step and replayed with them.
        const OptimDevice *od = &t.ostep;
        if (run == 1)
            cr_assert(!od->off && od->captures == 1 && od->replays == N && od->eager == 0,
                      "the optimizer's graph: %lld captures, %lld replays, %lld eager (%s)", (long long)od->captures,
                      (long long)od->replays, (long long)od->eager, od->why);
        else
            cr_assert(od->eager == N && od->replays == 0, "without graphs the optimizer's step replayed (%lld of %d eager)",
                      (long long)od->eager, N);
        for (int i = 0; i < N; i++) loss[run][i] = trainer_loss(&t, i);
        params[run] = malloc((size_t)t.ps.numel * sizeof(real));
        memcpy(params[run], params_pull(&t.ps), (size_t)t.ps.numel * sizeof(real));
        int64_t numel = t.ps.numel;
        trainer_free(&t);
        if (run == 1)
            cr_assert(memcmp(params[0], params[1], (size_t)numel * sizeof(real)) == 0,
                      "the parameters after %d steps differ with graphs", N);
    }
    for (int i = 0; i < N; i++)
        cr_assert(memcmp(&loss[0][i], &loss[1][i], sizeof(double)) == 0, "step %d: %.17g without graphs, %.17g with",
                  i + 1, loss[0][i], loss[1][i]);
    test_assert_resumed_losses(loss[2], loss[1], 3, N);
    free(params[0]), free(params[1]);
    test_remove_tree(dir);
}

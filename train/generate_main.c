// generate: sample from a trained checkpoint with recurrent decoding: states
// for linear/mamba/gdn, a KV cache for attn. Tokens are printed as they come.
//
//   generate --checkpoint runs/tiny_gdn/checkpoint.h5 --prompt "In the beginning"
//            [--max-tokens 200] [--temperature 0.8] [--top-k 40] [--seed 1] [--check]
//
// The model is rebuilt from the config stored in the checkpoint: no config
// file is needed. The text goes to stdout (the prompt, then the sample) and
// everything else to stderr, so `generate ... > out.txt` keeps only text.
// The prompt is decoded in parallel windows (lm_prefill), which fill the
// caches and states; --no-prefill steps it token by token.
// --check also runs the parallel forward over the whole sequence and verifies
// that the logits decoding computed (every position with --no-prefill; the
// prompt's last and every sampled one with prefill) equal it.
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "version.h"
#include "attn_dsa.h"
#include "attn_kernel.h"
#include "blas.h"
#include "checkpoint.h"
#include "fileio.h"
#include "lm_decode_graph.h"
#include "model_setup.h"
#include "runlog.h"
#include "tokenizer.h"

#define MAX_TOKENS_LIMIT (1 << 20)   // sampled tokens
#define PROMPT_LIMIT (1 << 20)       // prompt bytes
#define CHECK_LIMIT (1 << 16)        // positions the parallel forward of --check may cover

static void usage(FILE *f) {
    fprintf(f,
            "usage: generate --checkpoint FILE [--prompt TEXT | --prompt-file FILE] [options]\n"
            "  --checkpoint FILE    a checkpoint written by train (the model is rebuilt from its stored config)\n"
            "  --prompt TEXT        the text to continue; \"\" (or no prompt) samples unconditionally,\n"
            "                       starting from a newline as a document start (not printed)\n"
            "  --prompt-file FILE   read the prompt from FILE; '-' reads standard input\n"
            "  --max-tokens N       tokens to sample, 0..%d (default 200)\n"
            "  --temperature T      softmax temperature >= 0; 0 = greedy (default 0.8)\n"
            "  --top-k K            sample among the K most likely tokens; 0 = all (default 40)\n"
            "  --seed S             sampling seed, 0..2^64-1 (default 1)\n"
            "  --threads N          threads for decoding, 1..%d (default: 1 below 10M parameters, where one\n"
            "                       token's work is too small to share, except attention over a long\n"
            "                       cache, which takes all cores; else all cores)\n"
            "  --device D           cpu (default) or cuda: decode on the GPU (a build with -DAG_CUDA=ON)\n"
            "  --cuda-graph G       auto (default), on or off: on the GPU, replay each token's step from a\n"
            "                       CUDA graph (not models with attn_dsa layers; auto: where it can)\n"
            "  --no-echo            print only the sampled text, not the prompt\n"
            "  --no-prefill         step the prompt token by token instead of running it in parallel\n"
            "                       windows (on all cores unless --threads)\n"
            "  --check              verify the decoded logits against the parallel forward (at most %d\n"
            "                       positions in all); attn_dsa layers: the forward replays decoding's\n"
            "                       picks, which must be its own top-k up to near-ties of the scores\n"
            "The text goes to standard output, statistics and errors to standard error.\n",
            MAX_TOKENS_LIMIT, MODEL_MAX_THREADS, CHECK_LIMIT);
}

// Strict number arguments: the whole text, within [lo, hi].
static bool parse_int(const char *opt, const char *v, long long lo, long long hi, long long *out) {
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (!*v || *end || errno) {
        fprintf(stderr, "generate: %s: '%s' is not an integer\n", opt, v);
        return false;
    }
    if (x < lo || x > hi) {
        fprintf(stderr, "generate: %s: %lld is out of range [%lld, %lld]\n", opt, x, lo, hi);
        return false;
    }
    *out = x;
    return true;
}

static bool parse_u64(const char *opt, const char *v, uint64_t *out) {
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (!*v || *end || errno || v[0] == '-') {
        fprintf(stderr, "generate: %s: '%s' is not an integer in [0, 2^64)\n", opt, v);
        return false;
    }
    *out = x;
    return true;
}

static bool parse_real(const char *opt, const char *v, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (!*v || *end || errno || !isfinite(x)) {
        fprintf(stderr, "generate: %s: '%s' is not a finite number\n", opt, v);
        return false;
    }
    if (x < lo || x > hi) {
        fprintf(stderr, "generate: %s: %g is out of range [%g, %g]\n", opt, x, lo, hi);
        return false;
    }
    *out = x;
    return true;
}

// Sample from logits with temperature and top-k, among the ids of cand
// (n_cand >= 1, ascending): those that stand for bytes, so that a model never
// emits an id that prints nothing (a hole in a BPE's ids).
static int sample(const real *logits, const int *cand, int n_cand, double temperature, int top_k, Rng *rng,
                  double *probs, int *order) {
    int best = cand[0];
    for (int i = 1; i < n_cand; i++)
        if (logits[cand[i]] > logits[best]) best = cand[i];
    if (temperature <= 0) return best;
    memcpy(order, cand, (size_t)n_cand * sizeof *order);
    int K = top_k > 0 && top_k < n_cand ? top_k : n_cand;
    for (int i = 0; i < K; i++) {   // partial selection sort: the K largest first
        int m = i;
        for (int j = i + 1; j < n_cand; j++)
            if (logits[order[j]] > logits[order[m]]) m = j;
        int tmp = order[i];
        order[i] = order[m];
        order[m] = tmp;
    }
    double z = 0;
    for (int i = 0; i < K; i++) {
        probs[i] = exp(((double)logits[order[i]] - logits[best]) / temperature);
        z += probs[i];
    }
    double u = rng_uniform(rng) * z;
    for (int i = 0; i < K; i++) {
        u -= probs[i];
        if (u <= 0) return order[i];
    }
    return order[K - 1];
}

// Read a whole stream (the prompt from standard input), at most `max` bytes.
static bool read_stream(FILE *f, int64_t max, char **out, int64_t *n) {
    size_t cap = 4096, len = 0;
    char *buf = xmalloc(cap);
    for (size_t got; (got = fread(buf + len, 1, cap - len, f)) > 0;) {
        len += got;
        if ((int64_t)len > max) {
            free(buf);
            fprintf(stderr, "generate: the prompt is longer than %lld bytes\n", (long long)max);
            return false;
        }
        if (len == cap) buf = xrealloc(buf, cap *= 2);
    }
    *out = buf;
    *n = (int64_t)len;
    return true;
}

typedef struct GenArgs {
    const char *ckpt, *prompt, *prompt_file;
    long long max_tokens, top_k, threads;
    double temperature;
    uint64_t seed;
    bool check, echo, prefill;
    Device device;
    int cuda_graph;   // GEN_GRAPH_*
} GenArgs;

enum { GEN_GRAPH_AUTO, GEN_GRAPH_ON, GEN_GRAPH_OFF };

// 0: parsed; 1: --help shown; 2: bad arguments (reported).
static int parse_args(int argc, char **argv, GenArgs *a) {
    *a = (GenArgs){.max_tokens = 200, .top_k = 40, .threads = -1, .temperature = 0.8, .seed = 1, .echo = true,
                  .prefill = true};
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        bool has = i + 1 < argc;
        bool ok = true;
        if (!strcmp(o, "--help") || !strcmp(o, "-h")) {
            usage(stdout);
            return 1;
        } else if (!strcmp(o, "--check")) a->check = true;
        else if (!strcmp(o, "--no-echo")) a->echo = false;
        else if (!strcmp(o, "--no-prefill")) a->prefill = false;
        else if (!has) {
            fprintf(stderr, "generate: unknown or incomplete argument '%s' (see generate --help)\n", o);
            return 2;
        } else if (!strcmp(o, "--checkpoint")) a->ckpt = argv[++i];
        else if (!strcmp(o, "--prompt")) a->prompt = argv[++i];
        else if (!strcmp(o, "--prompt-file")) a->prompt_file = argv[++i];
        else if (!strcmp(o, "--max-tokens")) ok = parse_int(o, argv[++i], 0, MAX_TOKENS_LIMIT, &a->max_tokens);
        else if (!strcmp(o, "--top-k")) ok = parse_int(o, argv[++i], 0, INT32_MAX, &a->top_k);
        else if (!strcmp(o, "--threads")) ok = parse_int(o, argv[++i], 1, MODEL_MAX_THREADS, &a->threads);
        else if (!strcmp(o, "--temperature")) ok = parse_real(o, argv[++i], 0, 1e6, &a->temperature);
        else if (!strcmp(o, "--seed")) ok = parse_u64(o, argv[++i], &a->seed);
        else if (!strcmp(o, "--device")) {
            int d = device_parse(argv[++i]);
            if (d < 0) {
                fprintf(stderr, "generate: --device: '%s' is not a device (cpu or cuda)\n", argv[i]);
                return 2;
            }
            a->device = (Device)d;
        } else if (!strcmp(o, "--cuda-graph")) {
            const char *v = argv[++i];
            if (!strcmp(v, "auto")) a->cuda_graph = GEN_GRAPH_AUTO;
            else if (!strcmp(v, "on")) a->cuda_graph = GEN_GRAPH_ON;
            else if (!strcmp(v, "off")) a->cuda_graph = GEN_GRAPH_OFF;
            else {
                fprintf(stderr, "generate: --cuda-graph: '%.40s' is not auto, on or off\n", v);
                return 2;
            }
        } else {
            fprintf(stderr, "generate: unknown argument '%s' (see generate --help)\n", o);
            return 2;
        }
        if (!ok) return 2;
    }
    if (!a->ckpt) {
        fprintf(stderr, "generate: --checkpoint FILE is required (see generate --help)\n");
        return 2;
    }
    if (a->cuda_graph == GEN_GRAPH_ON && a->device != DEVICE_CUDA) {
        fprintf(stderr, "generate: --cuda-graph on: graphs decode on the GPU only (add --device cuda)\n");
        return 2;
    }
    if (a->prompt && a->prompt_file) {
        fprintf(stderr, "generate: give --prompt or --prompt-file, not both\n");
        return 2;
    }
    return 0;
}

// The prompt's bytes (malloc'd): the argument, a file, or standard input.
static bool load_prompt(const GenArgs *a, char **text, int64_t *n) {
    if (a->prompt_file && !strcmp(a->prompt_file, "-")) return read_stream(stdin, PROMPT_LIMIT, text, n);
    if (a->prompt_file) {
        uint8_t *d;
        Status s = file_read_all(a->prompt_file, "prompt file", PROMPT_LIMIT, &d, n);
        if (!s.ok) fprintf(stderr, "generate: %s\n", s.msg);
        *text = (char *)d;
        return s.ok;
    }
    const char *p = a->prompt ? a->prompt : "";
    *n = (int64_t)strlen(p);
    if (*n > PROMPT_LIMIT) {
        fprintf(stderr, "generate: the prompt is longer than %d bytes\n", PROMPT_LIMIT);
        return false;
    }
    *text = xmalloc((size_t)*n + 1);
    memcpy(*text, p, (size_t)*n + 1);
    return true;
}

// Decode prompt then sample; --check compares with the parallel forward. Returns the exit code.
// docs_after_eot: the model was trained on documents ([data] documents) with
// a tokenizer that ends each with its end-of-text token; the token after one
// starts a new document, so every layer starts fresh there, as in training.
static int run(const GenArgs *a, LM *lm, ParamStore *ps, const Tokenizer *tk, const char *prompt, int64_t n_prompt,
               bool docs_after_eot) {
    // Decoding one sequence is a chain of small products: below ~10M parameters
    // waking a second thread per op costs more than it saves (measured: 880
    // tokens/s on 1 thread vs 450 on 2 for tiny_gdn).
    long long req = a->threads > 0 ? a->threads : params_count(ps, false) < 10000000 ? 1 : 0;
    int all = omp_get_max_threads();   // before model_set_threads: OMP_NUM_THREADS, or every core
    int threads = model_set_threads((int)req);
    // Attention over a long cache is work enough for every core even where
    // the rest of a token is not (attn_kernel.h): given them unless --threads.
    bool attention = false;   // a layer without a recurrent state (attn, attn_dsa): a cache that grows
    for (int l = 0; l < lm->cfg.n_layers; l++) attention |= !lm->blocks[l].mixer->kind->recurrent;
    int attn_threads = attention && a->threads <= 0 && threads < all ? all : threads;
    if (attn_threads > threads) attn_decode_set_threads(attn_threads);
    blas_select_from_env();   // float32 products on ATTNLAB_GEMM's backend (default auto)
    int V = lm->cfg.vocab_size;
    // The prompt's tokens. An empty prompt conditions on a document start: the
    // tokenizer's end-of-text token, or a newline (the start of a line of text).
    bool unconditional = n_prompt == 0;
    int *prompt_ids = xmalloc((size_t)(n_prompt ? n_prompt : 1) * sizeof(int));
    int64_t n_in = tokenizer_encode(tk, (const uint8_t *)prompt, n_prompt, prompt_ids);
    if (unconditional) n_in = tk->eot >= 0 ? (prompt_ids[0] = tk->eot, 1) : tokenizer_encode(tk, (const uint8_t *)"\n", 1, prompt_ids);
    int64_t total = n_in + a->max_tokens;
    if (a->check && total > CHECK_LIMIT) {
        fprintf(stderr, "generate: --check covers at most %d positions (prompt + max-tokens = %lld)\n", CHECK_LIMIT,
                (long long)total);
        free(prompt_ids);
        return 2;
    }
    int *tokens = xmalloc((size_t)total * sizeof(int));
    memcpy(tokens, prompt_ids, (size_t)n_in * sizeof(int));
    free(prompt_ids);
    TokenizerStream ts = {0};
    uint8_t piece[TOKENIZER_STREAM_OUT_MAX];
    real *step_logits = a->check ? xmalloc((size_t)total * V * sizeof(real)) : NULL;
    double *probs = xmalloc((size_t)V * sizeof(double));
    int *order = xmalloc((size_t)V * sizeof(int));
    int *cand = xmalloc((size_t)V * sizeof(int));   // the ids sample may pick
    int n_cand = tokenizer_emittable_ids(tk, V, cand);
    ASSERT(n_cand > 0, "generate: none of the model's %d ids stands for bytes in its tokenizer", V);
    Rng rng;
    rng_seed(&rng, a->seed);
    real *logits = xmalloc((size_t)V * sizeof(real));   // this step's, on the host
    Tape tp;
    tape_init_on(&tp, a->device);
    tape_no_grad_push(&tp);
    LMCache *cache = lm_cache_new_on(lm, 1, (int)total, a->device);
    LMDecodeGraph dg;   // (--cuda-graph on where refused stopped in main)
    lm_decode_graph_init(&dg, lm, a->device, a->cuda_graph != GEN_GRAPH_OFF);
    // --check: each attn_dsa layer's picks, position by position, for the parallel forward to replay (attn_dsa.h).
    int *picks[LM_MAX_LAYERS] = {0};
    for (int l = 0; a->check && l < lm->cfg.n_layers; l++) {
        Mixer *m = lm->blocks[l].mixer;
        if (strcmp(m->kind->name, "attn_dsa")) continue;
        size_t n = (size_t)total * m->cfg.topk;
        picks[l] = xmalloc(n * sizeof(int));
        for (size_t i = 0; i < n; i++) picks[l][i] = DSA_REC_NONE;
        attn_dsa_record(m, picks[l], (int)total);
    }
    if (a->echo && !unconditional) fwrite(prompt, 1, (size_t)n_prompt, stdout);
    fflush(stdout);
    double t0 = runlog_now(), t_gen = 0;
    // The prompt in parallel windows: work enough for every core even where
    // a token's is not. It is one document (encoded as ordinary text,
    // an end-of-text's text is not the token), as attention's prefill needs.
    bool prefill = a->prefill;
    int prefill_threads = a->threads > 0 ? threads : all;
    int64_t first = 0;   // the first position whose logits decoding computes
    if (prefill) {
        model_set_threads(prefill_threads);
        Tensor *lg = lm_prefill(&tp, lm, cache, tokens, (int)n_in);
        dev_to_host(logits, lg->data, (size_t)V * sizeof(real), a->device);
        tape_reset(&tp);
        model_set_threads(threads);
        first = n_in - 1;
    }
    for (int64_t n = first; n < total; n++) {
        if (n == n_in) t_gen = runlog_now();
        if (n >= n_in || !prefill) {   // else the prefill gave position n_in - 1's logits
            if (docs_after_eot && n > 0 && tokens[n - 1] == tk->eot) lm_cache_reset_row(lm, cache, 0);
            lm_decode_graph_step(&dg, &tp, lm, cache, &tokens[n], logits);   // (resets the tape)
        }
        if (step_logits) memcpy(step_logits + (size_t)n * V, logits, (size_t)V * sizeof(real));
        if (n + 1 >= n_in && n + 1 < total) {
            int next = sample(logits, cand, n_cand, a->temperature, (int)a->top_k, &rng, probs, order);
            tokens[n + 1] = next;
            fwrite(piece, 1, (size_t)tokenizer_stream_push(tk, &ts, next, piece), stdout);   // whole characters
            fflush(stdout);
        }
    }
    double t_end = runlog_now();
    fwrite(piece, 1, (size_t)tokenizer_stream_flush(tk, &ts, piece), stdout);
    printf("\n");
    fflush(stdout);
    double gen_s = t_gen > 0 ? t_end - t_gen : 0;
    double tps = gen_s > 0 ? (double)(total - n_in) / gen_s : 0.0;
    char attn_note[64] = "", prompt_note[96];
    if (attn_threads > threads)
        snprintf(attn_note, sizeof attn_note, "; attention over long caches on %d", attn_threads);
    double prompt_s = (t_gen > 0 ? t_gen : t_end) - t0;
    if (!prefill) snprintf(prompt_note, sizeof prompt_note, "prompt %.2f s token by token", prompt_s);
    else if (a->device == DEVICE_CPU)
        snprintf(prompt_note, sizeof prompt_note, "prompt %.2f s in parallel on %d thread%s", prompt_s,
                 prefill_threads, prefill_threads == 1 ? "" : "s");
    else snprintf(prompt_note, sizeof prompt_note, "prompt %.2f s in parallel", prompt_s);
    if (a->device == DEVICE_CPU)
        fprintf(stderr,
                "generate: %lld prompt + %lld sampled tokens in %.2f s (%s); decoding %.1f tokens/s (%d thread%s%s, "
                "GEMM %s)\n",
                (long long)n_in, a->max_tokens, t_end - t0, prompt_note, tps, threads, threads == 1 ? "" : "s",
                attn_note, blas_backend_name(blas_backend));
    else
        fprintf(stderr,
                "generate: %lld prompt + %lld sampled tokens in %.2f s (%s); decoding %.1f tokens/s (GPU %s; CUDA "
                "graph %s, %lld steps replayed, %lld eager)\n",
                (long long)n_in, a->max_tokens, t_end - t0, prompt_note, tps, device_describe(a->device),
                dg.g && !dg.off ? "on" : "off", (long long)dg.replays, (long long)dg.eager);
    int code = 0;
    if (a->check) {
        int *flags = xcalloc((size_t)total, sizeof *flags);   // the same document starts, in parallel
        for (int64_t n = 1; docs_after_eot && n < total; n++) flags[n] = tokens[n - 1] == tk->eot;
        for (int l = 0; l < lm->cfg.n_layers; l++)
            if (picks[l]) {
                attn_dsa_record(lm->blocks[l].mixer, NULL, 0);
                attn_dsa_replay(lm->blocks[l].mixer, picks[l], (int)total);
            }
        Tensor *pt = lm_forward_docs(&tp, lm, tokens, flags, 1, (int)total, NULL, NULL);
        free(flags);
        real *par = xmalloc((size_t)pt->numel * sizeof(real));
        dev_to_host(par, pt->data, (size_t)pt->numel * sizeof(real), a->device);
        // Normwise relative difference: max |a - b| / max |a| (docs/MODEL.md, project notes).
        double scale = 0;
        for (int64_t i = first * V; i < pt->numel; i++)
            scale = fmax(scale, fmax(fabs((double)par[i]), fabs((double)step_logits[i])));
        if (scale == 0) scale = 1;
#ifdef AG_DOUBLE
        double tol = 1e-9;
#else
        double tol = 1e-4;
#endif
        // Each position's difference: a mismatch says where, and whether it is one position or many.
        double worst = 0;
        int64_t worst_at = first, n_over = 0, first_over = -1;
        for (int64_t n = first; n < total; n++) {
            double d = 0;
            for (int64_t i = n * V; i < (n + 1) * V; i++) d = fmax(d, fabs((double)par[i] - step_logits[i]));
            d /= scale;
            if (d > worst) worst = d, worst_at = n;
            if (d > tol && n_over++ == 0) first_over = n;
        }
        free(par);
        fprintf(stderr, "generate --check: %lld positions%s, max relative difference decoding vs parallel %.3e "
                        "at position %lld (tolerance %.0e): %s\n",
                (long long)(total - first), prefill ? " (the prompt's last and every sampled one)" : "", worst,
                (long long)worst_at, tol, worst <= tol ? "OK" : "MISMATCH");
        if (n_over)
            fprintf(stderr, "generate --check: %lld position%s over the tolerance, the first at %lld\n",
                    (long long)n_over, n_over == 1 ? "" : "s", (long long)first_over);
        code = worst <= tol ? 0 : 1;
        // The sparse layers' picks: replayed above, so the logits compare; checked here against the
        // forward's own top K (a near-tie of two scores may go either way in float arithmetic).
        DsaReplayReport all = {0};
        int worst_layer = -1;
        for (int l = 0; l < lm->cfg.n_layers; l++) {
            if (!picks[l]) continue;
            DsaReplayReport r = attn_dsa_replay_report(lm->blocks[l].mixer);
            attn_dsa_replay(lm->blocks[l].mixer, NULL, 0);
            all.rows += r.rows;
            all.differ += r.differ;
            if (r.differ && (worst_layer < 0 || r.worst > all.worst))
                all.worst = r.worst, all.worst_row = r.worst_row, worst_layer = l;
        }
        if (all.rows) {
            bool ok = all.worst <= tol;
            fprintf(stderr, "generate --check: the attn_dsa picks of decoding, replayed by the parallel forward, "
                            "are its own top-k at %lld of %lld rows (layers x positions)",
                    (long long)(all.rows - all.differ), (long long)all.rows);
            if (all.differ)
                fprintf(stderr, "; the other %lld differ%s, the largest score gap %.3e of the scores' size "
                                "(layer %d, position %lld; tolerance %.0e): %s",
                        (long long)all.differ, all.differ == 1 ? "s" : "", all.worst, worst_layer,
                        (long long)all.worst_row, tol, ok ? "OK (near-ties)" : "MISMATCH");
            fprintf(stderr, "\n");
            if (!ok) code = 1;
        }
    }
    for (int l = 0; l < lm->cfg.n_layers; l++)
        if (picks[l]) {
            attn_dsa_record(lm->blocks[l].mixer, NULL, 0);
            free(picks[l]);
        }
    tape_no_grad_pop(&tp);
    lm_decode_graph_free(&dg);
    lm_cache_free(lm, cache);
    tape_free(&tp);
    free(tokens);
    free(step_logits);
    free(logits);
    free(probs);
    free(order);
    free(cand);
    return code;
}

int main(int argc, char **argv) {
    if (program_version(argc, argv, "generate")) return 0;
    model_init_process(argv);   // OMP_WAIT_POLICY=PASSIVE unless the user set it
    file_check_stdout_at_exit("generate");
    GenArgs a;
    int code = parse_args(argc, argv, &a);
    if (code) return code == 1 ? 0 : 2;
    char *prompt = NULL;
    int64_t n_prompt = 0;
    if (!load_prompt(&a, &prompt, &n_prompt)) return 2;
    TrainConfig cfg;
    LM lm;
    ParamStore ps;
    Tokenizer tok;
    Status s = model_load_checkpoint(a.ckpt, &cfg, &lm, &ps, &tok);
    if (!s.ok) {
        fprintf(stderr, "generate: %s\n", s.msg);
        config_free(&cfg);
        free(prompt);
        return 2;
    }
    char no_graph[256];
    if (a.cuda_graph == GEN_GRAPH_ON && lm_decode_graph_refusal(&lm, no_graph, sizeof no_graph)) {
        fprintf(stderr, "generate: --cuda-graph on: the model of %s cannot replay its steps from a graph: %s "
                        "(auto decodes it without graphs)\n", a.ckpt, no_graph);
        code = 2;
    }
    if (a.device != DEVICE_CPU || code) {   // the model is loaded on the host: now its values move
        char err[512];
        const char *why = NULL;
        if (!code && !device_cuda_init(err, sizeof err)) why = err;
        if (why || code) {
            if (why) fprintf(stderr, "generate: --device cuda: %s; or decode on the CPU: --device cpu\n", why);
            tokenizer_free(&tok);
            lm_destroy(&lm);
            params_free(&ps);
            config_free(&cfg);
            free(prompt);
            return 2;
        }
        params_to_device(&ps, a.device);
    }
    code = run(&a, &lm, &ps, &tok, prompt, n_prompt, strcmp(cfg.data.documents, "none") != 0 && tok.eot >= 0);
    tokenizer_free(&tok);
    lm_destroy(&lm);
    params_free(&ps);
    config_free(&cfg);
    free(prompt);
    return code;
}

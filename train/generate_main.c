// generate: sample from a trained checkpoint with recurrent decoding: states
// for linear/mamba/gdn, a KV cache for attn. Tokens are printed as they come.
//
//   generate --checkpoint runs/tiny_gdn/checkpoint.h5 --prompt "In the beginning"
//            --max-tokens 200 [--temperature 0.8] [--top-k 40] [--seed 1] [--check]
//
// --check also runs the parallel forward over the whole sequence and verifies
// that the token-by-token logits equal it at every position.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint.h"
#include "model_setup.h"
#include "runlog.h"
#include "tokenizer.h"

static void usage(FILE *f) {
    fprintf(f, "usage: generate --checkpoint FILE --prompt TEXT [--max-tokens N] [--temperature T] [--top-k K]\n"
               "                [--seed S] [--check]\n"
               "  --max-tokens N     tokens to sample (default 200)\n"
               "  --temperature T    softmax temperature; 0 = greedy (default 0.8)\n"
               "  --top-k K          sample among the K most likely tokens; 0 = all (default 40)\n"
               "  --seed S           sampling seed (default 1)\n"
               "  --threads N        threads for decoding (default: 1 below 10M parameters, where one token's\n"
               "                     work is too small to share, else all cores)\n"
               "  --check            verify token-by-token logits against the parallel forward\n");
}

// Sample from logits (V) with temperature and top-k.
static int sample(const real *logits, int V, double temperature, int top_k, Rng *rng, double *probs, int *order) {
    int best = 0;
    for (int i = 1; i < V; i++)
        if (logits[i] > logits[best]) best = i;
    if (temperature <= 0) return best;
    for (int i = 0; i < V; i++) order[i] = i;
    int K = top_k > 0 && top_k < V ? top_k : V;
    for (int i = 0; i < K; i++) {   // partial selection sort: the K largest first
        int m = i;
        for (int j = i + 1; j < V; j++)
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

int main(int argc, char **argv) {
    const char *ckpt = NULL, *prompt = NULL;
    int max_tokens = 200, top_k = 40;
    double temperature = 0.8;
    uint64_t seed = 1;
    bool check = false;
    int threads_arg = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool has = i + 1 < argc;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--checkpoint") && has) ckpt = argv[++i];
        else if (!strcmp(a, "--prompt") && has) prompt = argv[++i];
        else if (!strcmp(a, "--max-tokens") && has) max_tokens = atoi(argv[++i]);
        else if (!strcmp(a, "--temperature") && has) temperature = atof(argv[++i]);
        else if (!strcmp(a, "--top-k") && has) top_k = atoi(argv[++i]);
        else if (!strcmp(a, "--seed") && has) seed = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(a, "--threads") && has) threads_arg = atoi(argv[++i]);
        else if (!strcmp(a, "--check")) check = true;
        else {
            fprintf(stderr, "generate: unknown or incomplete argument '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!ckpt || !prompt || max_tokens < 0) {
        usage(stderr);
        return 2;
    }
    char *text = NULL;
    Status s = checkpoint_read_config(ckpt, &text);
    if (!s.ok) {
        fprintf(stderr, "generate: %s\n", s.msg);
        return 2;
    }
    TrainConfig cfg;
    config_defaults(&cfg, model_mixer_known);
    s = config_load_string(&cfg, text, ckpt);
    free(text);
    LM lm;
    ParamStore ps;
    if (s.ok) s = model_build(&cfg, &lm, &ps);
    if (s.ok) s = checkpoint_load(ckpt, &ps, NULL, NULL);
    if (!s.ok) {
        fprintf(stderr, "generate: %s\n", s.msg);
        return 2;
    }
    // Decoding one sequence is a chain of small products: below ~10M parameters
    // waking a second thread per op costs more than it saves (measured: 880
    // tokens/s on 1 thread vs 450 on 2 for tiny_gdn).
    if (threads_arg < 0) threads_arg = params_count(&ps, false) < 10000000 ? 1 : 0;
    int threads = model_set_threads(threads_arg);
    int V = lm.cfg.vocab_size;
    int n_prompt = (int)strlen(prompt);
    if (n_prompt == 0) {
        fprintf(stderr, "generate: the prompt is empty\n");
        return 2;
    }
    int total = n_prompt + max_tokens;
    int *tokens = xmalloc((size_t)total * sizeof(int));
    tokenizer_encode((const uint8_t *)prompt, n_prompt, tokens);
    real *step_logits = check ? xmalloc((size_t)total * V * sizeof(real)) : NULL;
    double *probs = xmalloc((size_t)V * sizeof(double));
    int *order = xmalloc((size_t)V * sizeof(int));
    Rng rng;
    rng_seed(&rng, seed);

    Tape tp;
    tape_init(&tp);
    tape_no_grad_push(&tp);
    LMCache *cache = lm_cache_new(&lm, 1, total);
    fwrite(prompt, 1, (size_t)n_prompt, stdout);
    fflush(stdout);
    double t0 = runlog_now(), t_gen = 0;
    int n = 0;   // tokens fed so far
    for (; n < total; n++) {
        if (n == n_prompt) t_gen = runlog_now();
        Tensor *lg = lm_step(&tp, &lm, cache, &tokens[n]);
        if (step_logits) memcpy(step_logits + (size_t)n * V, lg->data, (size_t)V * sizeof(real));
        if (n + 1 >= n_prompt && n + 1 < total) {
            int next = sample(lg->data, V, temperature, top_k, &rng, probs, order);
            tokens[n + 1] = next;
            unsigned char byte = (unsigned char)next;
            fwrite(&byte, 1, 1, stdout);
            fflush(stdout);
        }
        tape_reset(&tp);
    }
    double t_end = runlog_now();
    printf("\n");
    double gen_s = t_gen > 0 ? t_end - t_gen : 0;
    fprintf(stderr, "generate: %d prompt + %d sampled tokens in %.2f s; decoding %.1f tokens/s (%d threads)\n",
            n_prompt, max_tokens, t_end - t0, gen_s > 0 ? (total - n_prompt) / gen_s : 0.0, threads);
    int code = 0;
    if (check) {
        Tensor *par = lm_forward(&tp, &lm, tokens, 1, total, NULL, NULL);
        // Normwise relative difference: max |a - b| / max |a| (docs/MODEL.md, project notes).
        double worst = 0, scale = 0;
        for (int64_t i = 0; i < par->numel; i++) {
            scale = fmax(scale, fmax(fabs((double)par->data[i]), fabs((double)step_logits[i])));
            worst = fmax(worst, fabs((double)par->data[i] - step_logits[i]));
        }
        worst = scale > 0 ? worst / scale : worst;
#ifdef AG_DOUBLE
        double tol = 1e-9;
#else
        double tol = 1e-4;
#endif
        fprintf(stderr, "generate --check: %d positions, max relative difference token-by-token vs parallel %.3e "
                        "(tolerance %.0e): %s\n",
                total, worst, tol, worst <= tol ? "OK" : "MISMATCH");
        code = worst <= tol ? 0 : 1;
    }
    tape_no_grad_pop(&tp);
    lm_cache_free(&lm, cache);
    tape_free(&tp);
    lm_destroy(&lm);
    params_free(&ps);
    config_free(&cfg);
    free(tokens);
    free(step_logits);
    free(probs);
    free(order);
    return code;
}

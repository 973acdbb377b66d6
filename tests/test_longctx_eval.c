// Evaluation at any length (train/poseval.h, train/doctext.h, evaluate
// --positions): the loss of every position equals a direct computation, one
// forward per document (or per context a sliding window gives), in each
// context mode; buckets sum what they hold; texts split into documents as
// documented; the program's JSON lines agree with its decoder (--stream).
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "doctext.h"
#include "model_setup.h"
#include "poseval.h"
#include "test_util.h"

enum { V = 11, N = 41 };

// Documents at 0, 9, 10 (one token: its target is the next document's first,
// not scored), 23 and 24; the stream's last document is 17 tokens long.
static void make_stream(int *tok, int *flags) {
    for (int i = 0; i < N; i++) tok[i] = (i * 7 + 3 + i / 5) % V, flags[i] = 0;
    int starts[] = {0, 9, 10, 23, 24};
    for (size_t k = 0; k < sizeof starts / sizeof starts[0]; k++) flags[starts[k]] = 1;
}

static void make_lm(LM *lm, ParamStore *ps, const char *layers) {
    LMConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.vocab_size = V;
    cfg.d_model = 8;
    cfg.d_ff = 12;
    cfg.tied = true;
    cfg.norm_eps = 1e-6;
    cfg.mixer = mixer_config_default(8, 2, 4, 4);
    cfg.mixer.chunk_size = 4;
    cfg.mixer.conv_size = 3;
    cr_assert(lm_parse_layers(&cfg, layers).ok);
    params_init(ps);
    lm_create(lm, &cfg, ps);
    params_finalize(ps, 21);
    for (int l = 0; l < cfg.n_layers; l++) {   // decay ~0.6 per step: the state carries history
        char name[64];
        snprintf(name, sizeof name, "layers.%d.mixer.dt_bias", l);
        Tensor *bias = params_find(ps, name);
        for (int h = 0; bias && h < 2; h++) bias->data[h] = (real)(0.1 + 0.4 * h);
    }
}

// -log p(tok[i+1]) with the context tok[c .. i] alone, as its own row (no
// documents, no state): what every mode must give for input i.
static double direct_nll(LM *lm, const int *tok, int64_t c, int64_t i) {
    Tape tp;
    tape_init(&tp);
    tape_no_grad_push(&tp);
    int T = (int)(i - c + 1);
    Tensor *logits = lm_forward(&tp, lm, tok + c, 1, T, NULL, NULL);
    const real *row = logits->data + (int64_t)(T - 1) * V;
    double mx = row[0], z = 0;
    for (int v = 1; v < V; v++) mx = fmax(mx, (double)row[v]);
    for (int v = 0; v < V; v++) z += exp((double)row[v] - mx);
    double nll = mx + log(z) - (double)row[tok[i + 1]];
    tape_no_grad_pop(&tp);
    tape_free(&tp);
    return nll;
}

static int64_t doc_begin(const int *flags, int64_t i) {
    while (i > 0 && !flags[i]) i--;
    return i;
}

// want (N - 1): the direct nll of every input with the context that starts
// at ctx(i), NAN where the target begins a document.
static void direct_all(LM *lm, const int *tok, const int *flags, const int64_t *ctx, double *want) {
    for (int64_t i = 0; i + 1 < N; i++) want[i] = flags[i + 1] ? NAN : direct_nll(lm, tok, ctx[i], i);
}

// nll and pos (N - 1) as poseval_score wrote them against want (direct_all).
static void check_against(const double *want, const int *flags, const double *nll, const int64_t *pos,
                          const char *label) {
    real w[N], g[N];
    int k = 0;
    for (int64_t i = 0; i + 1 < N; i++) {
        cr_assert_eq(pos[i], i - doc_begin(flags, i), "%s: position of input %lld", label, (long long)i);
        if (isnan(want[i])) {
            cr_assert(isnan(nll[i]), "%s: input %lld: its target begins a document, but it is scored", label,
                      (long long)i);
            continue;
        }
        cr_assert(!isnan(nll[i]), "%s: input %lld is not scored", label, (long long)i);
        w[k] = (real)want[i], g[k++] = (real)nll[i];
    }
    double d = max_rel_diff(g, w, k);
    cr_assert_leq(d, FORM_TOL, "%s: differs from the direct computation by %.3e", label, d);
}

Test(longctx_eval, carry_and_full_equal_one_forward_per_document) {
    LM lm;
    ParamStore ps;
    make_lm(&lm, &ps, "gdn,mamba,linear");
    cr_assert(poseval_all_recurrent(&lm));
    int tok[N], flags[N];
    make_stream(tok, flags);
    int64_t ctx[N], pos[N], zero[N] = {0};
    for (int64_t i = 0; i < N; i++) ctx[i] = doc_begin(flags, i);
    int one[N] = {1};   // no documents: the whole stream is one
    double nll[N], want[2][N];
    direct_all(&lm, tok, one, zero, want[0]);
    direct_all(&lm, tok, flags, ctx, want[1]);
    const PosevalSpec specs[] = {{.context = POSEVAL_FULL}, {.context = POSEVAL_CARRY, .chunk = 7},
                                 {.context = POSEVAL_CARRY, .chunk = 1}, {.context = POSEVAL_CARRY, .chunk = 64}};
    for (size_t s = 0; s < sizeof specs / sizeof specs[0]; s++) {
        for (int with_docs = 0; with_docs < 2; with_docs++) {
            Status st = poseval_score(&lm, tok, with_docs ? flags : NULL, N, &specs[s], nll, pos, DEVICE_CPU);
            cr_assert(st.ok, "%s", st.msg);
            char label[64];
            snprintf(label, sizeof label, "%s chunk %d, documents %d", poseval_context_name(specs[s].context),
                     specs[s].chunk, with_docs);
            check_against(want[with_docs], with_docs ? flags : one, nll, pos, label);
        }
    }
    lm_destroy(&lm);
    params_free(&ps);
}

Test(longctx_eval, attention_full_context_and_sliding_window) {
    LM lm;
    ParamStore ps;
    make_lm(&lm, &ps, "attn,gdn");
    cr_assert(!poseval_all_recurrent(&lm));
    int tok[N], flags[N];
    make_stream(tok, flags);
    int64_t ctx[N], pos[N];
    double nll[N], want[N];
    // Carry would show attention only its chunk: refused.
    PosevalSpec carry = {.context = POSEVAL_CARRY, .chunk = 8};
    Status st = poseval_score(&lm, tok, flags, N, &carry, nll, pos, DEVICE_CPU);
    cr_assert(!st.ok && strstr(st.msg, "every layer recurrent"), "got: %s", st.msg);
    // Full: attention over the whole document.
    for (int64_t i = 0; i < N; i++) ctx[i] = doc_begin(flags, i);
    PosevalSpec full = {.context = POSEVAL_FULL};
    st = poseval_score(&lm, tok, flags, N, &full, nll, pos, DEVICE_CPU);
    cr_assert(st.ok, "%s", st.msg);
    direct_all(&lm, tok, flags, ctx, want);
    check_against(want, flags, nll, pos, "full");
    // Windows of 8 advancing by 3, two to a forward: input i is scored in the
    // first window that reaches it and sees the window's tokens of its own
    // document. The last window ends at input N - 2.
    enum { W = 8, S = 3 };
    int64_t done = 0;
    for (int64_t start = 0; done < N - 1; start += S) {
        int64_t s = start + W > N - 1 ? N - 1 - W : start;
        for (int64_t i = done > s ? done : s; i < s + W; i++) {
            int64_t b = doc_begin(flags, i);
            ctx[i] = b > s ? b : s;
        }
        done = s + W;
    }
    PosevalSpec win = {.context = POSEVAL_WINDOW, .window = W, .stride = S, .batch = 2};
    st = poseval_score(&lm, tok, flags, N, &win, nll, pos, DEVICE_CPU);
    cr_assert(st.ok, "%s", st.msg);
    direct_all(&lm, tok, flags, ctx, want);
    check_against(want, flags, nll, pos, "window 8, stride 3");
    lm_destroy(&lm);
    params_free(&ps);
}

Test(longctx_eval, buckets_sum_what_they_hold) {
    double nll[] = {1, 2, NAN, 4, 8, 16, 32};
    int64_t pos[] = {0, 255, 256, 256, 1023, 1024, 5000};
    int bytes[] = {1, 1, 1, 2, 1, 3, 1};
    int64_t edges[] = {256, 1024, 4096};
    PosevalBucket b[3];
    poseval_buckets(nll, pos, bytes, 7, edges, 3, b);
    cr_assert(b[0].lo == 0 && b[0].hi == 256 && b[0].tokens == 2 && b[0].nll == 3 && b[0].bytes == 2);
    cr_assert_eq(b[0].pos_sum, 255);
    cr_assert(b[1].lo == 256 && b[1].tokens == 2 && b[1].nll == 12 && b[1].bytes == 3, "NAN is skipped");
    cr_assert(b[2].tokens == 1 && b[2].nll == 16, "position 5000 is past the last edge");
    int64_t e[16];
    int k = poseval_default_edges(5000, e, 16);
    cr_assert(k == 4 && e[0] == 256 && e[3] == 16384, "256, 1k, 4k, then 16k, past 5000: %d edges", k);
    cr_assert_eq(poseval_default_edges(100, e, 16), 1);
}

Test(longctx_eval, texts_split_into_documents) {
    char sep[8];
    cr_assert_eq(doctext_unescape("\\n\\x41\\\\", sep, 8), 3);
    cr_assert(sep[0] == '\n' && sep[1] == 'A' && sep[2] == '\\');
    cr_assert_eq(doctext_unescape("\\q", sep, 8), -1);
    cr_assert_eq(doctext_unescape("abc\\", sep, 8), -1);
    cr_assert_eq(doctext_unescape("abc", sep, 2), -1);
    Tokenizer tk;
    tokenizer_bytes(&tk);
    const char *text = "\n\nab\n\ncde\n\n\n\nf";
    int ids[32], flags[32];
    int64_t n = doctext_encode(&tk, (const uint8_t *)text, (int64_t)strlen(text), "\n\n", 2, ids, flags);
    cr_assert_eq(n, (int64_t)strlen(text), "bytes: one token a byte");
    // Documents: "\n\n", "ab\n\n", "cde\n\n", "\n\n", "f".
    int want[] = {1, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 1};
    for (int i = 0; i < n; i++) cr_assert_eq(flags[i], want[i], "flag at %d", i);
    int64_t longest;
    cr_assert_eq(doctext_count(flags, n, &longest), 5);
    cr_assert_eq(longest, 5);
    doctext_cut(flags, n, 2);   // "\n\n", "ab", "\n\n", "cd", "e\n", "\n", "\n\n", "f"
    int cut[] = {1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 1, 0, 1};
    for (int i = 0; i < n; i++) cr_assert_eq(flags[i], cut[i], "cut flag at %d", i);
    cr_assert_eq(doctext_count(flags, n, &longest), 8);
    cr_assert_eq(longest, 2);
    n = doctext_encode(&tk, (const uint8_t *)"xyz", 3, NULL, 0, ids, flags);
    cr_assert(n == 3 && flags[0] == 1 && flags[1] == 0 && flags[2] == 0);
}

// evaluate's JSON number `key` in line (NAN when absent).
static double json_num(const char *line, const char *key) {
    char k[64];
    snprintf(k, sizeof k, "\"%s\":", key);
    const char *p = strstr(line, k);
    return p ? strtod(p + strlen(k), NULL) : NAN;
}

// Run evaluate with args; its stdout (malloc'd) after checking the exit code.
static char *run_evaluate(const char *dir, const char *name, char *const args[]) {
    char *argv[24] = {(char *)test_program("evaluate")};
    int n = 1;
    for (; args[n - 1]; n++) argv[n] = args[n - 1];
    argv[n] = NULL;
    char out[1600], err[1600];
    snprintf(out, sizeof out, "%s/%s.out", dir, name);
    snprintf(err, sizeof err, "%s/%s.err", dir, name);
    int code = test_spawn(argv, NULL, out, err, 120, NULL);
    char *text = test_read_file(out), *etext = test_read_file(err);
    cr_assert_eq(code, 0, "evaluate %s: exit %d: %s", name, code, etext);
    free(etext);
    char bad[256];
    cr_assert_gt(test_jsonl_check(out, bad, sizeof bad), 0, "evaluate %s: bad JSON line: %s", name, bad);
    return text;
}

// The per-position view of a trained checkpoint: the buckets add up to the
// total, and the total equals the decoder's (every token sees everything
// before it in both): carry for an all-recurrent model, full for a hybrid.
static void check_program(const char *tag, const char *layers, const char *context) {
    const char *cfg = test_tiny_config(tag, layers, 2, NULL, NULL);
    char dir[1500];
    snprintf(dir, sizeof dir, "%s", test_dir_of(cfg));
    int code = test_spawn((char *[]){(char *)test_program("train"), "--config", (char *)cfg, NULL}, NULL, NULL, NULL,
                          120, NULL);
    cr_assert_eq(code, 0, "train %s", layers);
    char ckpt[1600];
    snprintf(ckpt, sizeof ckpt, "%s/run/checkpoint.h5", dir);
    char *pos = run_evaluate(dir, "positions",
                             (char *[]){"--checkpoint", ckpt, "--val", "--limit", "600", "--positions", "--context",
                                        (char *)context, "--buckets", "16,64,256,1k", "--json", NULL});
    char *stream = run_evaluate(dir, "stream",
                                (char *[]){"--checkpoint", ckpt, "--val", "--limit", "600", "--stream", "--json", NULL});
    double sum = 0, tokens = 0, total = NAN, scored = NAN;
    int buckets = 0;
    for (char *line = strtok(pos, "\n"); line; line = strtok(NULL, "\n")) {
        if (strstr(line, "\"type\":\"bucket\"")) {
            buckets++;
            sum += json_num(line, "loss") * json_num(line, "tokens");
            tokens += json_num(line, "tokens");
        } else if (strstr(line, "\"type\":\"total\"")) {
            total = json_num(line, "loss");
            scored = json_num(line, "tokens_scored");
        }
    }
    cr_assert_eq(buckets, 4, "%s: buckets 0-16, 16-64, 64-256, 256-1k", layers);
    cr_assert(scored == 599 && tokens == 599, "%s: every target once: %g in buckets, %g in total", layers, tokens,
              scored);
    cr_assert(fabs(sum / tokens - total) <= 1e-5 * total, "%s: buckets %.8f vs total %.8f", layers, sum / tokens,
              total);
    double ls = json_num(stream, "loss");
    cr_assert_eq(json_num(stream, "tokens_scored"), 599);
    cr_assert(fabs(total - ls) <= 1e-5 * ls, "%s: --positions --context %s %.8f vs --stream %.8f", layers, context,
              total, ls);
    free(pos);
    free(stream);
}

Test(longctx_eval, program_positions_equal_the_decoder, .timeout = 240) {
    check_program("poseval_gdn", "gdn,mamba", "carry");
    check_program("poseval_hybrid", "gdn,attn", "full");
}

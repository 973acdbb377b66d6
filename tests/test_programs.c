// The programs as users run them, as separate processes: generate's
// arguments, train's exit codes (no leak on an error exit under ASan),
// a full disk, and the fault test: train killed with SIGKILL at random
// moments always leaves a loadable checkpoint and whole JSON lines; SIGTERM
// saves like Ctrl-C.
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "attn_kernel.h"
#include "checkpoint.h"
#include "model_setup.h"
#include "device.h"
#include "test_util.h"
#include "trainer.h"

// Train a tiny model in-process and return its checkpoint's path.
static const char *trained_checkpoint(const char *tag, const char *layers) {
    const char *cfg = test_tiny_config(tag, layers, 2, NULL, NULL);
    static Trainer t;
    TrainerOptions o = {.config = cfg, .quiet = true};
    Status s = trainer_setup(&t, &o);
    cr_assert(s.ok, "%s", s.msg);
    cr_assert_eq(trainer_run(&t, &o), 0);
    static char ckpt[1500];
    snprintf(ckpt, sizeof ckpt, "%s", t.ckpt);
    trainer_free(&t);
    return ckpt;
}

// Run program `prog` with the given arguments (NULL-terminated, at most 30)
// for at most `secs`; returns its exit code, stdout and stderr in *out / *err
// (malloc'd; the files are dir/prog.out, dir/prog.err).
static int run_program(const char *prog, const char *dir, char *const args[], double secs, char **out, char **err) {
    char *argv[32] = {(char *)test_program(prog)};
    int n = 1;
    for (; args[n - 1]; n++) argv[n] = args[n - 1];
    argv[n] = NULL;
    char o[1500], e[1500];
    snprintf(o, sizeof o, "%s/%s.out", dir, prog);
    snprintf(e, sizeof e, "%s/%s.err", dir, prog);
    int code = test_spawn(argv, NULL, o, e, secs, NULL);
    *out = test_read_file(o);
    *err = test_read_file(e);
    return code;
}

static int generate(const char *dir, char *const args[], char **out, char **err) {
    return run_program("generate", dir, args, 60, out, err);
}

Test(programs, generate_checks_its_arguments, .timeout = 120) {
    const char *ckpt = trained_checkpoint("gen_args", "gdn");
    char dir[1500];
    snprintf(dir, sizeof dir, "%s", test_dir_of(ckpt));
    const struct {
        const char *opt, *value, *why;
    } bad[] = {
        {"--threads", "100000", "generate: --threads: 100000 is out of range [1, 1024]"},
        {"--max-tokens", "2147483647", "generate: --max-tokens: 2147483647 is out of range [0, 1048576]"},
        {"--max-tokens", "abc", "generate: --max-tokens: 'abc' is not an integer"},
        {"--max-tokens", "-1", "generate: --max-tokens: -1 is out of range"},
        {"--temperature", "nan", "generate: --temperature: 'nan' is not a finite number"},
        {"--temperature", "-1", "generate: --temperature: -1 is out of range [0, 1e+06]"},
        {"--top-k", "1e3", "generate: --top-k: '1e3' is not an integer"},
        {"--seed", "-3", "generate: --seed: '-3' is not an integer in [0, 2^64)"},
        {"--device", "gpu", "generate: --device: 'gpu' is not a device (cpu or cuda)"},
        {"--cuda-graph", "yes", "generate: --cuda-graph: 'yes' is not auto, on or off"},
        {"--cuda-graph", "on", "generate: --cuda-graph on: graphs decode on the GPU only (add --device cuda)"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *out, *err;
        int code = generate(dir, (char *[]){"--checkpoint", (char *)ckpt, (char *)bad[i].opt, (char *)bad[i].value,
                                            NULL},
                            &out, &err);
        cr_assert_eq(code, 2, "%s %s: exit %d\n%s", bad[i].opt, bad[i].value, code, err);
        cr_assert(strstr(err, bad[i].why), "%s %s:\n%s", bad[i].opt, bad[i].value, err);
        cr_assert_str_eq(out, "", "nothing on stdout on an argument error");
        free(out), free(err);
    }
    // An empty prompt samples unconditionally; the text alone goes to stdout.
    char *out, *err;
    int code = generate(dir, (char *[]){"--checkpoint", (char *)ckpt, "--prompt", "", "--max-tokens", "20", "--seed",
                                        "18446744073709551615", NULL},
                        &out, &err);
    cr_assert_eq(code, 0, "%s", err);
    cr_assert_eq(strlen(out), 21, "20 sampled bytes and a newline: '%s'", out);
    cr_assert(strstr(err, "decoding") && !strstr(out, "decoding"), "statistics on stderr only");
    free(out), free(err);
    // A prompt from a file, echoed, then the sample; --check passes.
    char pf[1600];
    snprintf(pf, sizeof pf, "%s/prompt.txt", dir);
    test_write_file(pf, "the light and");
    code = generate(dir, (char *[]){"--checkpoint", (char *)ckpt, "--prompt-file", pf, "--max-tokens", "5", "--check",
                                    NULL},
                    &out, &err);
    cr_assert_eq(code, 0, "%s", err);
    cr_assert(strncmp(out, "the light and", 13) == 0 && strlen(out) == 13 + 5 + 1, "'%s'", out);
    cr_assert(strstr(err, "OK"), "%s", err);
    free(out), free(err);
    code = generate(dir, (char *[]){"--checkpoint", (char *)ckpt, "--prompt", "x", "--prompt-file", pf, NULL}, &out,
                    &err);
    cr_assert(code == 2 && strstr(err, "not both"), "%s", err);
    free(out), free(err);
    if (!device_cuda_built()) {   // a CPU build says why it cannot decode on a GPU, and what to do instead
        code = generate(dir, (char *[]){"--checkpoint", (char *)ckpt, "--device", "cuda", NULL}, &out, &err);
        cr_assert(code == 2 && strstr(err, "--device cuda: this build has no CUDA backend") &&
                      strstr(err, "--device cpu"),
                  "%s", err);
        cr_assert_str_eq(out, "");
        free(out), free(err);
    }
    code = generate(dir, (char *[]){"--checkpoint", "/nonexistent.h5", NULL}, &out, &err);
    cr_assert(code == 2 && strstr(err, "/nonexistent.h5: cannot open checkpoint"), "%s", err);
    free(out), free(err);
}

// A model trained on documents with a tokenizer that ends each with its
// end-of-text token: generate starts every layer fresh after that token, as
// training did (the unconditional prompt is the token itself), and --check
// compares with a parallel forward that has the same document starts.
Test(programs, generate_starts_fresh_after_end_of_text, .timeout = 180) {
    const char *cfg = test_tiny_config("gen_docs", "gdn,attn,mamba", 2, NULL,
                                       "[data]\ntokenizer = bpe:300\ndocuments = blank_line\n");
    static Trainer t;
    TrainerOptions o = {.config = cfg, .quiet = true};
    Status s = trainer_setup(&t, &o);
    cr_assert(s.ok, "%s", s.msg);
    cr_assert(t.tok.eot >= 0 && t.tokens.n_docs >= 1);
    cr_assert_eq(trainer_run(&t, &o), 0);
    char ckpt[1500], dir[1500];
    snprintf(ckpt, sizeof ckpt, "%s", t.ckpt);
    snprintf(dir, sizeof dir, "%s", test_dir_of(ckpt));
    trainer_free(&t);
    char *out, *err;
    int code = generate(dir, (char *[]){"--checkpoint", ckpt, "--prompt", "", "--max-tokens", "12", "--check", NULL},
                        &out, &err);
    cr_assert_eq(code, 0, "%s", err);
    cr_assert(strstr(err, "OK"), "%s", err);
    free(out), free(err);
    // A prompt (ordinary text: the end-of-text's text is not the token, so
    // one document) prefilled in one parallel forward, then decoded, and the
    // same stepped token by token with --no-prefill: --check passes both, and
    // sampling (same seed) from logits equal to rounding picks the same tokens.
    const char *prompt = "In the beginning God created<|endoftext|>And the earth was";
    char *text[2];
    for (int i = 0; i < 2; i++) {
        code = generate(dir, (char *[]){"--checkpoint", ckpt, "--prompt", (char *)prompt, "--max-tokens", "48",
                                        "--temperature", "1", "--top-k", "0", "--check", i ? "--no-prefill" : NULL,
                                        NULL},
                        &out, &err);
        cr_assert_eq(code, 0, "%s", err);
        cr_assert(strstr(err, "OK") && strstr(err, i ? "token by token" : "in parallel"), "%s", err);
        text[i] = out;
        free(err);
    }
    cr_assert_str_eq(text[0], text[1], "prefill and steps sampled differently");
    free(text[0]), free(text[1]);
}

// A prompt long enough (over 8192 tokens of 2 heads: past attn_kernel.h's
// 16384 keys x heads) that generate gives attention every core while the rest of
// the small model decodes on one thread; --check compares the decoded logits
// with the parallel forward (after the prefill, and with --no-prefill at every
// position), and the status line names the rule.
Test(programs, generate_long_prompt_shares_attention_and_checks, .timeout = 300) {
    const char *ckpt = trained_checkpoint("gen_long", "attn");
    char dir[1500], pf[1600];
    snprintf(dir, sizeof dir, "%s", test_dir_of(ckpt));
    snprintf(pf, sizeof pf, "%s/long_prompt.txt", dir);
    // Bytes from a fixed generator: nothing for the test config's tokenizer
    // to merge, so about a token a byte (checked below).
    char *text = xmalloc(8801);
    uint64_t x = 88172645463325252ull;
    for (int i = 0; i < 8800; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        text[i] = "abcdefghijklmnopqrstuvwxyz ,.;"[x % 30];
    }
    text[8800] = 0;
    test_write_file(pf, text);
    free(text);
    char *out, *err;
    int code = run_program("generate", dir,
                           (char *[]){"--checkpoint", (char *)ckpt, "--prompt-file", pf, "--max-tokens", "4", "--check",
                                      "--no-echo", NULL},
                           240, &out, &err);
    cr_assert_eq(code, 0, "%s", err);
    cr_assert(strstr(err, "OK"), "%s", err);
    long long n_prompt = 0;
    cr_assert(sscanf(err, "generate: %lld prompt", &n_prompt) == 1 && n_prompt * 2 >= ATTN_DECODE_PAR_KEYS, "%s",
              err);
    if (omp_get_num_procs() > 1 && !getenv("OMP_NUM_THREADS"))
        cr_assert(strstr(err, "(1 thread; attention over long caches on "), "%s", err);
    free(out), free(err);
    // The prompt token by token: --check then covers every position, each
    // step attending over the cache with the kernel's threads.
    code = run_program("generate", dir,
                       (char *[]){"--checkpoint", (char *)ckpt, "--prompt-file", pf, "--max-tokens", "4", "--check",
                                  "--no-prefill", "--no-echo", NULL},
                       240, &out, &err);
    cr_assert_eq(code, 0, "%s", err);
    cr_assert(strstr(err, "OK") && strstr(err, "token by token"), "%s", err);
    free(out), free(err);
    // --threads keeps every part on the threads it names.
    code = run_program("generate", dir,
                       (char *[]){"--checkpoint", (char *)ckpt, "--prompt-file", pf, "--max-tokens", "4", "--threads",
                                  "1", "--no-echo", NULL},
                       240, &out, &err);
    cr_assert_eq(code, 0, "%s", err);
    cr_assert(strstr(err, "(1 thread, GEMM"), "%s", err);
    free(out), free(err);
}

// --cuda-graph on for a model whose steps cannot be replayed (attn_dsa picks
// its keys on the host): refused in any build, naming the checkpoint and the
// layer, before the GPU is looked for.
Test(programs, generate_cuda_graph_on_refuses_dsa, .timeout = 120) {
    const char *ckpt = trained_checkpoint("gen_graph_dsa", "gdn,attn_dsa");
    char dir[1500];
    snprintf(dir, sizeof dir, "%s", test_dir_of(ckpt));
    char *out, *err;
    int code = run_program("generate", dir,
                           (char *[]){"--checkpoint", (char *)ckpt, "--device", "cuda", "--cuda-graph", "on", NULL}, 60,
                           &out, &err);
    cr_assert(code == 2 && strstr(err, "--cuda-graph on: the model of ") && strstr(err, ckpt) &&
                  strstr(err, "layer 1 is attn_dsa"),
              "exit %d: %s", code, err);
    cr_assert_str_eq(out, "");
    free(out), free(err);
}

Test(programs, train_error_exits_are_clean, .timeout = 60) {
    const char *cfg = test_tiny_config("train_exit", "gdn", 2, NULL, "lerning_rate = 1\n");
    char dir[1500], err[1600];
    snprintf(dir, sizeof dir, "%s", test_dir_of(cfg));
    snprintf(err, sizeof err, "%s/err.txt", dir);
    // Exit code 2 (under ASan a leak would make it 23), the message names file, line and key.
    int code = test_spawn((char *[]){(char *)test_program("train"), "--config", (char *)cfg, NULL}, NULL, NULL, err,
                          60, NULL);
    char *text = test_read_file(err);
    cr_assert_eq(code, 2, "%s", text);
    cr_assert(strstr(text, "tiny.ini:") && strstr(text, "lerning_rate") && strstr(text, "did you mean lr?"), "%s",
              text);
    free(text);
    const char *good = test_tiny_config("train_exit2", "gdn", 2, NULL, NULL);
    code = test_spawn((char *[]){(char *)test_program("train"), "--config", (char *)good, "--set", "train.lr", NULL},
                      NULL, NULL, err, 60, NULL);
    text = test_read_file(err);
    cr_assert(code == 2 && strstr(text, "expected section.key=value"), "%d %s", code, text);
    free(text);
    code = test_spawn((char *[]){(char *)test_program("train"), "--config", (char *)cfg, "--resume", "--overwrite",
                                 NULL},
                      NULL, NULL, err, 60, NULL);
    cr_assert_eq(code, 2);
}

// Run train with file writes limited to `limit` bytes per file (RLIMIT_FSIZE,
// SIGXFSZ ignored: writes past it fail with EFBIG as on a full disk). Its
// stderr comes back through a pipe (a file would be limited too), into err.
static int train_with_fsize_limit(const char *cfg, rlim_t limit, char **err) {
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit rl = {limit, limit};
        setrlimit(RLIMIT_FSIZE, &rl);
        dup2(fds[1], 2);
        close(fds[0]);
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 1);
        execl(test_program("train"), "train", "--config", cfg, "--overwrite", "--set", "train.checkpoint_every=1",
              "--set", "train.steps=12", (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    for (ssize_t got; (got = read(fds[0], buf + n, cap - n - 1)) > 0;) {
        n += (size_t)got;
        if (n + 1 == cap) buf = realloc(buf, cap *= 2);
    }
    buf[n] = 0;
    close(fds[0]);
    *err = buf;
    return test_wait(pid, 60);
}

Test(programs, a_full_disk_is_reported_and_nothing_false_is_said, .timeout = 120) {
    const char *cfg = test_tiny_config("disk_full", "gdn", 4, NULL, NULL);
    char dir[1500], err[1600], run[1600], p[1700];
    snprintf(dir, sizeof dir, "%s", test_dir_of(cfg));
    snprintf(err, sizeof err, "%s/err.txt", dir);
    snprintf(run, sizeof run, "%s/run", dir);
    // Build the token cache first (it is written under the limit too otherwise).
    cr_assert_eq(test_spawn((char *[]){(char *)test_program("train"), "--config", (char *)cfg, "--set",
                                       "train.steps=1", NULL},
                            NULL, NULL, NULL, 60, NULL),
                 0);
    // 1. Checkpoints (tens of KB) cannot be written, logs can.
    char *text;
    int code = train_with_fsize_limit(cfg, 8000, &text);
    cr_assert_eq(code, 1, "exit %d\n%s", code, text);
    cr_assert(strstr(text, "checkpoint of step 1 not written") && strstr(text, "the final checkpoint was not written"),
              "%s", text);
    cr_assert_null(strstr(text, "loss.png"), "a truncated plot is not claimed:\n%s", text);
    cr_assert(strstr(text, "no checkpoint"), "the final message says no checkpoint was written:\n%s", text);
    cr_assert_null(strstr(text, "checkpoint.h5,"), "%s", text);
    free(text);
    DIR *d = opendir(run);   // no temporary left behind, whatever its name (fileio.h)
    cr_assert_not_null(d);
    for (struct dirent *de; (de = readdir(d));) cr_assert_null(strstr(de->d_name, ".tmp"), "%s left", de->d_name);
    closedir(d);
    snprintf(p, sizeof p, "%s/checkpoint.h5", run);
    cr_assert_neq(access(p, F_OK), 0);
    // 2. The logs fill up: reported once, training and checkpoints go on, whole lines only. The
    //    limit leaves room for config.ini (its size depends on the scratch folder's path).
    struct stat ini;
    snprintf(p, sizeof p, "%s/config.ini", run);
    cr_assert_eq(stat(p, &ini), 0);
    code = train_with_fsize_limit(cfg, (rlim_t)ini.st_size + 400, &text);
    cr_assert_eq(code, 1, "exit %d\n%s", code, text);
    char *first = strstr(text, "/metrics.jsonl failed: File too large; no further records are logged");
    cr_assert(first, "%s", text);
    cr_assert_null(strstr(first + 20, "metrics.jsonl failed"), "reported once:\n%s", text);
    cr_assert(strstr(text, "metrics.jsonl (incomplete)") && strstr(text, "logging failed"), "%s", text);
    free(text);
    snprintf(p, sizeof p, "%s/metrics.jsonl", run);
    char bad[512];
    cr_assert_gt(test_jsonl_check(p, bad, sizeof bad), 0, "%s", bad);
}

// Whole JSON lines, and a checkpoint (if any) that loads into the model its
// config describes; returns its step (-1: no checkpoint).
static int64_t check_run_folder(const char *run, int round) {
    char p[1700], bad[512];
    snprintf(p, sizeof p, "%s/metrics.jsonl", run);
    if (access(p, F_OK) == 0) cr_assert_geq(test_jsonl_check(p, bad, sizeof bad), 0, "round %d: %s", round, bad);
    snprintf(p, sizeof p, "%s/checkpoint.h5", run);
    if (access(p, F_OK) != 0) return -1;
    TrainConfig c;
    LM lm;
    ParamStore ps;
    Status s = model_load_checkpoint(p, &c, &lm, &ps, NULL);
    cr_assert(s.ok, "round %d: the checkpoint must load: %s", round, s.msg);
    CheckpointState st = {0};
    s = checkpoint_load(p, &ps, NULL, &st);
    cr_assert(s.ok, "round %d: %s", round, s.msg);
    free(st.config_text);
    lm_destroy(&lm);
    params_free(&ps);
    config_free(&c);
    return st.step;
}

Test(programs, sigkill_at_random_moments_loses_nothing, .timeout = 300) {
    const char *cfg = test_tiny_config("sigkill", "gdn,attn", 100000, NULL, NULL);
    char dir[1500], run[1600], ckpt[1700];
    snprintf(dir, sizeof dir, "%s", test_dir_of(cfg));
    snprintf(run, sizeof run, "%s/run", dir);
    snprintf(ckpt, sizeof ckpt, "%s/checkpoint.h5", run);
    Rng r;
    rng_seed(&r, 2024);
    // The kill moments scale with how long this build takes to its first
    // checkpoint (start-up included: the ASan build is several times slower).
    pid_t pid;
    test_spawn((char *[]){(char *)test_program("train"), "--config", (char *)cfg, "--overwrite", "--set",
                          "train.checkpoint_every=1", NULL},
               NULL, NULL, NULL, 0, &pid);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < 6000 && access(ckpt, F_OK) != 0; i++) usleep(10000);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    kill(pid, SIGKILL);
    test_wait(pid, 30);
    cr_assert_eq(access(ckpt, F_OK), 0, "no checkpoint within 60 s");
    double first = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec), first0 = first;
    int advanced = 0;
    int64_t last = check_run_folder(run, -1);
    for (int round = 0; round < 24; round++) {
        bool resume = access(ckpt, F_OK) == 0;
        test_spawn((char *[]){(char *)test_program("train"), "--config", (char *)cfg,
                              resume ? "--resume" : "--overwrite", "--set", "train.checkpoint_every=1", NULL},
                   NULL, NULL, NULL, 0, &pid);
        // 0.3x to 3x the time to a first checkpoint: start-up, steps, saves.
        // Under load (16 test jobs beside a GPU run) a resumed start can take
        // longer than the first did: a round that saved nothing widens the
        // window for the next ones (by 1.25x, at most 8x), so the rounds
        // still reach every moment of a run.
        usleep((useconds_t)(1e6 * first * (0.3 + 2.7 * rng_uniform(&r))));
        kill(pid, SIGKILL);
        int code = test_wait(pid, 30);
        cr_assert(code == -SIGKILL || code == 0, "round %d: train exited %d before the kill", round, code);
        int64_t step = check_run_folder(run, round);
        cr_assert_geq(step, last, "round %d: the checkpoint went back from step %lld to %lld", round, (long long)last,
                      (long long)step);
        advanced += step > last;
        if (step == last && first < 8 * first0) first *= 1.25;
        last = step;
    }
    cr_assert_geq(advanced, 8, "a third of the rounds or more got far enough to save (%d of 24 did)", advanced);
}

// Stop a run of train with SIGTERM after a few steps (`again_us` > 0: a
// second SIGTERM that long after the first, as timeout(1) sends, once to the
// process and once to its process group; it may come while the checkpoint is
// written or after); it must save and exit 130. The config's path.
static const char *sigterm_run(const char *name, int again_us) {
    const char *cfg = test_tiny_config(name, "gdn", 100000, NULL, NULL);
    char dir[1500], run[1600], err[1600], ckpt[1700];
    snprintf(dir, sizeof dir, "%s", test_dir_of(cfg));
    snprintf(run, sizeof run, "%s/run", dir);
    snprintf(err, sizeof err, "%s/err.txt", dir);
    snprintf(ckpt, sizeof ckpt, "%s/checkpoint.h5", run);
    pid_t pid;
    test_spawn((char *[]){(char *)test_program("train"), "--config", (char *)cfg, NULL}, NULL, NULL, err, 0, &pid);
    char metrics[1700];
    snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", run);
    for (int i = 0; i < 3000; i++) {   // until a few steps are logged
        char *text = test_read_file(metrics);
        int steps = 0;
        for (const char *q = text; q && (q = strstr(q, "\"type\":\"train\"")); q++) steps++;
        free(text);
        if (steps >= 3) break;
        usleep(10000);
    }
    kill(pid, SIGTERM);
    if (again_us > 0) {
        usleep((useconds_t)again_us);
        kill(pid, SIGTERM);   // (a process that has ended and not been waited for takes it and stays ended)
    }
    int code = test_wait(pid, 60);
    char *text = test_read_file(err);
    cr_assert_eq(code, 130, "%s: train's status %d (130 wanted; a negative one: ended by that signal): %s", name, code,
                 text);
    cr_assert(strstr(text, "interrupted: checkpoint at step") && strstr(text, "continue with --resume"), "%s", text);
    free(text);
    TrainConfig c;
    LM lm;
    ParamStore ps;
    Status s = model_load_checkpoint(ckpt, &c, &lm, &ps, NULL);
    cr_assert(s.ok, "%s", s.msg);
    lm_destroy(&lm);
    params_free(&ps);
    config_free(&c);
    return cfg;
}

Test(programs, sigterm_saves_like_ctrl_c, .timeout = 120) {
    const char *cfg = sigterm_run("sigterm", 0);
    char err[1600];
    snprintf(err, sizeof err, "%s/err.txt", test_dir_of(cfg));
    // And the run resumes from it.
    int code = test_spawn((char *[]){(char *)test_program("train"), "--config", (char *)cfg, "--resume", "--set",
                                     "train.steps=1", NULL},
                          NULL, NULL, err, 60, NULL);
    char *text = test_read_file(err);
    cr_assert(code == 2 && strstr(text, "past [train] steps = 1"), "a checkpoint past step 1 exists: %d %s", code,
              text);
    free(text);
}

// A signal delivered twice within a second is one request: the run saves
// and exits 130, whether the second comes while it saves or after.
Test(programs, sigterm_twice_at_once_still_saves, .timeout = 180) {
    const int again_us[] = {2000, 2000, 2000, 5000, 10000, 20000};
    for (int round = 0; round < 6; round++) {
        char name[32];
        snprintf(name, sizeof name, "sigterm2_%d", round);
        sigterm_run(name, again_us[round]);
    }
}

// evaluate's JSON figure `key` from its stdout.
static double json_number(const char *text, const char *key) {
    char k[64];
    snprintf(k, sizeof k, "\"%s\":", key);
    const char *p = strstr(text, k);
    cr_assert(p, "no %s in: %s", key, text);
    return strtod(p + strlen(k), NULL);
}

static int evaluate_run(const char *dir, char *const args[], char **out, char **err) {
    return run_program("evaluate", dir, args, 120, out, err);
}

// evaluate's stdout (malloc'd); asserts that it succeeds.
static char *evaluate(const char *dir, char *const args[]) {
    char *out, *err;
    int code = evaluate_run(dir, args, &out, &err);
    cr_assert_eq(code, 0, "evaluate failed: %s", err);
    free(err);
    return out;
}

// evaluate's loss (args end with --json).
static double evaluate_loss(const char *dir, char *const args[]) {
    char *out = evaluate(dir, args);
    double loss = json_number(out, "loss");
    free(out);
    return loss;
}

// dir/probe<n>.txt: the first n bytes of the scratch corpus beside dir; returns its path.
static const char *write_probe(const char *dir, int n) {
    static char probe[1600];
    char text[1600];
    snprintf(text, sizeof text, "%s/../corpus.txt", dir);
    snprintf(probe, sizeof probe, "%s/probe%d.txt", dir, n);
    char *all = test_read_file(text);
    all[n] = 0;
    test_write_file(probe, all);
    free(all);
    return probe;
}

Test(programs, evaluate_scores_every_token_once, .timeout = 120) {
    const char *ckpt = trained_checkpoint("evaluate", "gdn,attn");
    char dir[1500], probe[1600];
    snprintf(dir, sizeof dir, "%s", test_dir_of(ckpt));
    snprintf(probe, sizeof probe, "%s", write_probe(dir, 700));
    // One window over the whole text and the decoder's stream see the same context.
    char *w = evaluate(dir, (char *[]){"--checkpoint", (char *)ckpt, "--text", probe, "--window", "699", "--json", NULL});
    char *s = evaluate(dir, (char *[]){"--checkpoint", (char *)ckpt, "--text", probe, "--stream", "--json", NULL});
    double lw = json_number(w, "loss"), ls = json_number(s, "loss");
    cr_assert_eq(json_number(w, "tokens_scored"), 699);
    cr_assert_eq(json_number(s, "tokens_scored"), 699);
    cr_assert(fabs(lw - ls) <= 1e-5 * lw, "window %.8f vs stream %.8f", lw, ls);
    cr_assert(fabs(json_number(w, "bits_per_byte") - lw / log(2.0)) < 1e-5);
    free(w), free(s);
    // A text of three of the stream's windows (LM_PREFILL_WINDOW, 1024): the
    // windows carry the state and the KV cache across as the steps do
    // (--no-prefill), and one window over the whole text agrees with both.
    char probe2[1600];
    snprintf(probe2, sizeof probe2, "%s", write_probe(dir, 2600));
    cr_assert_lt(LM_PREFILL_WINDOW * 2, 2599);
    char *ck = (char *)ckpt;
    double lp = evaluate_loss(dir, (char *[]){"--checkpoint", ck, "--text", probe2, "--stream", "--json", NULL});
    double lt = evaluate_loss(dir, (char *[]){"--checkpoint", ck, "--text", probe2, "--stream", "--no-prefill",
                                              "--json", NULL});
    double l1 =
        evaluate_loss(dir, (char *[]){"--checkpoint", ck, "--text", probe2, "--window", "2599", "--json", NULL});
    cr_assert(fabs(lp - lt) <= 1e-5 * lt && fabs(lp - l1) <= 1e-5 * l1, "stream %.8f, token by token %.8f, window %.8f",
              lp, lt, l1);
    char *out, *err;   // --no-prefill says what it needs
    int code = evaluate_run(dir, (char *[]){"--checkpoint", ck, "--text", probe2, "--no-prefill", NULL}, &out, &err);
    cr_assert(code == 2 && strstr(err, "evaluate: --no-prefill applies to --stream only"), "%d %s", code, err);
    free(out), free(err);
    // Non-overlapping windows of 100 (the last one shifted to end with the text): the same sum as
    // lm_loss over those windows, each target once.
    char *o = evaluate(dir, (char *[]){"--checkpoint", (char *)ckpt, "--text", probe, "--window", "100", "--stride",
                                       "100", "--json", NULL});
    cr_assert_eq(json_number(o, "tokens_scored"), 699);
    double got = json_number(o, "loss");
    free(o);
    TrainConfig c;
    LM lm;
    ParamStore ps;
    cr_assert(model_load_checkpoint(ckpt, &c, &lm, &ps, NULL).ok);
    char *bytes = test_read_file(probe);
    Tape tp;
    tape_init(&tp);
    tape_no_grad_push(&tp);
    double sum = 0;
    int x[100], y[100];
    for (int start = 0, scored = 0; scored < 699; start += 100) {
        int s0 = start + 100 > 699 ? 599 : start;
        int count = 0;
        for (int t = 0; t < 100; t++) {
            x[t] = (unsigned char)bytes[s0 + t];
            y[t] = s0 + t + 1 > scored ? (unsigned char)bytes[s0 + t + 1] : -1;
            count += y[t] >= 0;
        }
        sum += lm_loss(&tp, &lm, x, y, 1, 100, NULL)->data[0] * count;
        scored = s0 + 100;
        tape_reset(&tp);
    }
    tape_no_grad_pop(&tp);
    cr_assert(fabs(got - sum / 699) <= 1e-5 * got, "evaluate %.8f vs windows by hand %.8f", got, sum / 699);
    tape_free(&tp);
    free(bytes);
    lm_destroy(&lm);
    params_free(&ps);
    config_free(&c);
}

// The reals of a .npy that evaluate --logits wrote (version 1.0: a 2-byte
// header length at 8); *n gets their count.
static real *read_npy(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "%s: %s", path, strerror(errno));
    cr_assert_eq(fseek(f, 0, SEEK_END), 0);
    size_t bytes = (size_t)ftell(f);
    rewind(f);
    char *raw = xmalloc(bytes + 1);
    cr_assert_eq(fread(raw, 1, bytes, f), bytes, "%s: short read", path);
    fclose(f);
    cr_assert(bytes > 10 && !memcmp(raw, "\x93NUMPY", 6), "%s: not a .npy", path);
    size_t at = 10 + (size_t)(unsigned char)raw[8] + 256 * (size_t)(unsigned char)raw[9];
    cr_assert(at <= bytes && (bytes - at) % sizeof(real) == 0, "%s: %zu bytes, data at %zu", path, bytes, at);
    // The build's precision: a float32 evaluate beside a float64 unit_tests
    // (a mixed pack) would otherwise read as half as many reals.
    char descr[16];
    snprintf(descr, sizeof descr, "'<f%d'", (int)sizeof(real));
    char first = raw[at];
    raw[at] = 0;   // the header as a string (raw has a byte to spare)
    cr_assert(strstr(raw + 10, descr), "%s: the header is not %s: %s", path, descr, raw + 10);
    raw[at] = first;
    *n = (bytes - at) / sizeof(real);
    real *x = xmalloc(*n * sizeof(real));
    memcpy(x, raw + at, *n * sizeof(real));
    free(raw);
    return x;
}

// evaluate --device: cuda scores windows and --stream on the GPU, equal to the
// CPU (the first window's logits normwise: 1e-4 in float32, 1e-10 in float64;
// the stream's loss as printed); a CPU build, or no GPU, says why and what to
// do; --positions stays on the CPU, said before anything loads.
Test(programs, evaluate_device_cuda_equals_cpu_or_says_why, .timeout = 180) {
    const char *ckpt = trained_checkpoint("evaluate_dev", "gdn,attn,mamba");
    char dir[1500], probe[1600], lc[1600], lg[1600];
    snprintf(dir, sizeof dir, "%s", test_dir_of(ckpt));
    snprintf(probe, sizeof probe, "%s", write_probe(dir, 400));
    snprintf(lc, sizeof lc, "%s/logits_cpu.npy", dir);
    snprintf(lg, sizeof lg, "%s/logits_gpu.npy", dir);
    char *out, *err;
    int code = evaluate_run(dir, (char *[]){"--checkpoint", (char *)ckpt, "--text", probe, "--device", "gpu", NULL},
                            &out, &err);
    cr_assert(code == 2 && strstr(err, "evaluate: --device 'gpu': expected cpu or cuda"), "%d %s", code, err);
    free(out), free(err);
    char why[512] = "";
    bool gpu = device_cuda_built() && device_cuda_init(why, sizeof why);
    char *win_cpu[] = {"--checkpoint", (char *)ckpt, "--text", probe, "--window", "96", "--json", "--logits", lc,
                       "--device", "cpu", NULL};
    char *win_gpu[] = {"--checkpoint", (char *)ckpt, "--text", probe, "--window", "96", "--json", "--logits", lg,
                       "--device", "cuda", NULL};
    char *pos_gpu[] = {"--checkpoint", (char *)ckpt, "--text", probe, "--positions", "--json", "--device", "cuda",
                       NULL};
    if (!gpu) {
        char **runs[] = {win_gpu, pos_gpu};
        for (int r = 0; r < 2; r++) {
            code = evaluate_run(dir, runs[r], &out, &err);
            cr_assert(code == 2 && strstr(err, "evaluate: --device cuda: ") && strstr(err, "--device cpu"), "%d %s",
                      code, err);
            if (!device_cuda_built()) cr_assert(strstr(err, "this build has no CUDA backend"), "%s", err);
            cr_assert_str_eq(out, "");
            free(out), free(err);
        }
        return;
    }
    double cpu_loss = evaluate_loss(dir, win_cpu), gpu_loss = evaluate_loss(dir, win_gpu);
    cr_assert(fabs(cpu_loss - gpu_loss) <= 1e-5 * cpu_loss, "windows: cpu %.6f, cuda %.6f", cpu_loss, gpu_loss);
    size_t na, nb;
    real *a = read_npy(lc, &na), *b = read_npy(lg, &nb);
    cr_assert(na == nb && na == (size_t)96 * 256, "logits: %zu and %zu reals", na, nb);
    double tol = sizeof(real) == 8 ? 1e-10 : 1e-4, d2 = 0, a2 = 0;
    for (size_t i = 0; i < na; i++) d2 += ((double)a[i] - b[i]) * ((double)a[i] - b[i]), a2 += (double)a[i] * a[i];
    cr_assert(sqrt(d2) <= tol * sqrt(a2), "logits differ by %.3g normwise (bound %.0e)", sqrt(d2 / a2), tol);
    free(a), free(b);
    // The stream: the decoder on the GPU, token by token.
    char *stream[] = {"--checkpoint", (char *)ckpt, "--text", probe, "--stream", "--json", "--device", "cpu", NULL};
    cpu_loss = evaluate_loss(dir, stream);
    stream[7] = "cuda";
    gpu_loss = evaluate_loss(dir, stream);
    cr_assert(fabs(cpu_loss - gpu_loss) <= 1e-5 * cpu_loss, "stream: cpu %.6f, cuda %.6f", cpu_loss, gpu_loss);
    // Per position: every bucket's loss and the total, on both devices, in
    // each context (carry needs every layer recurrent: a model of its own).
    char first[1500];   // trained_checkpoint's buffer is reused by the next call
    snprintf(first, sizeof first, "%s", ckpt);
    const char *rec = trained_checkpoint("evaluate_dev_rec", "gdn,mamba");
    static const char *const ctx[][2] = {{"full", NULL}, {"window", "48"}, {"carry", "40"}};
    for (int c = 0; c < 3; c++) {
        char *args[16] = {"--checkpoint", c == 2 ? (char *)rec : first, "--text", probe, "--positions", "--json",
                          "--buckets", "16,64,1000", "--context", (char *)ctx[c][0]};
        int k = 10;
        if (ctx[c][1]) {
            args[k++] = c == 1 ? "--window" : "--chunk";
            args[k++] = (char *)ctx[c][1];
        }
        args[k++] = "--device";
        args[k] = "cpu";   // then cuda; args[k + 1] stays NULL
        char *oc = evaluate(dir, args);
        args[k] = "cuda";
        char *og = evaluate(dir, args);
        int n = 0;
        for (const char *pc = oc, *pg = og; (pc = strstr(pc, "\"loss\":")) != NULL; n++) {
            pg = strstr(pg, "\"loss\":");
            cr_assert(pg, "%s: the GPU's output has fewer losses: %s", ctx[c][0], og);
            double lc = strtod(pc + 7, NULL), lgpu = strtod(pg + 7, NULL);
            cr_assert(fabs(lc - lgpu) <= 1e-5 * lc, "%s, loss %d: cpu %.6f, cuda %.6f", ctx[c][0], n, lc, lgpu);
            pc += 7, pg += 7;
        }
        cr_assert_geq(n, 3, "%s: %d losses in %s", ctx[c][0], n, oc);
        free(oc), free(og);
    }
}

// --device cuda in a build without the CUDA backend (or on a machine without
// a GPU) stops before training with what is missing; --device takes cpu or
// cuda only; --device cpu is stored like any --set (the run's config.ini).
Test(programs, train_device_flag_is_checked_and_stored, .timeout = 90) {
    const char *cfg = test_tiny_config("train_device", "gdn", 2, NULL, NULL);
    char dir[1500], err[1600], ini[1600];
    snprintf(dir, sizeof dir, "%s", test_dir_of(cfg));
    snprintf(err, sizeof err, "%s/err.txt", dir);
    const char *train = test_program("train");
    int code = test_spawn((char *[]){(char *)train, "--config", (char *)cfg, "--device", "gpu", NULL}, NULL, NULL, err,
                          60, NULL);
    char *text = test_read_file(err);
    cr_assert(code == 2 && strstr(text, "--device 'gpu': expected cpu or cuda"), "%d %s", code, text);
    free(text);
    if (!device_cuda_built()) {
        code = test_spawn((char *[]){(char *)train, "--config", (char *)cfg, "--device", "cuda", NULL}, NULL, NULL, err,
                          60, NULL);
        text = test_read_file(err);
        cr_assert(code == 2 && strstr(text, "[train] device = cuda") && strstr(text, "no CUDA backend"), "%d %s",
                  code, text);
        free(text);
    }
    code = test_spawn((char *[]){(char *)train, "--config", (char *)cfg, "--device", "cpu", NULL}, NULL, NULL, err, 60,
                      NULL);
    text = test_read_file(err);
    cr_assert_eq(code, 0, "%s", text);
    free(text);
    // The run folder is the config's run_dir (test_tiny_config puts it beside the config).
    snprintf(ini, sizeof ini, "%s/run/config.ini", dir);
    text = test_read_file(ini);
    cr_assert(text && strstr(text, "device = cpu"), "config.ini lacks the device: %s", text ? text : "(none)");
    free(text);
}

// A newcomer's first day, from outside the programs: every program answers
// --version; evaluate's usage lists its options and its argument errors read
// like train's; a long --stream says how far it got.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runlog.h"
#include "test_util.h"

// Run a built program with args; its stdout and stderr (malloc'd) and exit code.
static int run_prog(const char *name, char *const args[], char **out, char **err) {
    const char *dir = test_tmpdir("first_day");
    char o[1200], e[1200];
    snprintf(o, sizeof o, "%s/out.txt", dir);
    snprintf(e, sizeof e, "%s/err.txt", dir);
    char *argv[16] = {(char *)test_program(name)};
    int k = 1;
    for (; args[k - 1] && k < 15; k++) argv[k] = args[k - 1];
    argv[k] = NULL;
    int code = test_spawn(argv, NULL, o, e, 60, NULL);
    *out = test_read_file(o);
    *err = test_read_file(e);
    cr_assert(*out && *err);
    return code;
}

Test(first_day, every_program_answers_version) {
    static const char *const progs[] = {"train", "generate", "evaluate", "export_model", "tokenize", "longctx"};
    for (int i = 0; i < 6; i++) {
        char *out, *err;
        int code = run_prog(progs[i], (char *[]){"--version", NULL}, &out, &err);
        char want[64];
        snprintf(want, sizeof want, "%s (attnlab ", progs[i]);
        cr_assert(code == 0 && strncmp(out, want, strlen(want)) == 0, "%s: %d '%s' '%s'", progs[i], code, out, err);
        cr_assert(strstr(out, sizeof(real) == 8 ? "float64 build" : "float32 build"), "%s", out);
        free(out), free(err);
    }
}

Test(first_day, evaluate_usage_and_errors_read_like_trains) {
    char *out, *err;
    cr_assert_eq(run_prog("evaluate", (char *[]){"--help", NULL}, &out, &err), 0);
    const char *synopsis_end = strstr(out, "\n  --checkpoint");
    cr_assert(synopsis_end, "%s", out);
    // The usage lines (before the option list) name every option of window and stream scoring.
    static const char *const opts[] = {"--device", "--logits", "--no-prefill", "--stream", "--json"};
    for (int i = 0; i < 5; i++) {
        const char *at = strstr(out, opts[i]);
        cr_assert(at && at < synopsis_end, "the usage line lacks %s:\n%s", opts[i], out);
    }
    free(out), free(err);
    cr_assert_eq(run_prog("evaluate", (char *[]){"--bogus", NULL}, &out, &err), 2);
    cr_assert_str_eq(err, "evaluate: unknown or incomplete argument '--bogus' (see evaluate --help)\n");
    free(out), free(err);
    cr_assert_eq(run_prog("train", (char *[]){"--bogus", NULL}, &out, &err), 2);
    cr_assert_str_eq(err, "train: unknown or incomplete argument '--bogus' (see train --help)\n");
    free(out), free(err);
    // A value error says what is wrong with the value, once (not also "unknown
    // argument"); a size past the limit with its k is refused, not overflowed.
    cr_assert_eq(run_prog("evaluate", (char *[]){"--device", "tpu", NULL}, &out, &err), 2);
    cr_assert_str_eq(err, "evaluate: --device 'tpu': expected cpu or cuda\n");
    free(out), free(err);
    cr_assert_eq(run_prog("evaluate", (char *[]){"--window", "0", NULL}, &out, &err), 2);
    cr_assert_str_eq(err, "evaluate: --window: '0' is not an integer in [1, 1048576]\n");
    free(out), free(err);
    cr_assert_eq(run_prog("evaluate", (char *[]){"--buckets", "16,9223372036854775807k", NULL}, &out, &err), 2);
    cr_assert_str_eq(err, "evaluate: --buckets: '16,9223372036854775807k' is not a list of at most 64 increasing "
                          "positive sizes (e.g. 256,1k,4k)\n");
    free(out), free(err);
}

// The progress line evaluate --stream prints: how far, of how much, how fast;
// one line each off a terminal, and a final one only after progress was shown.
Test(first_day, stream_progress_lines) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    double shown = 0, t0 = runlog_now();
    runlog_progress(f, "evaluate: --stream", 10, 40, t0, &shown, 3600, true);
    runlog_progress(f, "evaluate: --stream", 10, 40, t0, &shown, 3600, false);
    fflush(f);
    cr_assert_eq(len, 0, "nothing before the interval: '%s'", text);
    runlog_progress(f, "evaluate: --stream", 10, 40, t0, &shown, 0, false);
    runlog_progress(f, "evaluate: --stream", 40, 40, t0, &shown, 0, true);
    fclose(f);
    cr_assert(strstr(text, "evaluate: --stream: 10 / 40 tokens (25%), ") &&
                  strstr(text, "tokens/s\nevaluate: --stream: 40 / 40 tokens (100%), "),
              "%s", text);
    free(text);
}

// The programs' outputs (issue 46): no output path destroys what it names.
// export_model, tokenize, evaluate --logits and train --dump-state refuse a
// device, FIFO, folder or symbolic link, an output that is one of their
// inputs or another output, and never follow a planted temporary;
// export_model creates its folders. Every program fails loudly when its
// standard output cannot be written (> /dev/full), and evaluate's error exits
// free the model (under ASan a leak would turn exit 2 into 23).
#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "fileio.h"
#include "test_util.h"

// A tiny model with a BPE tokenizer (so export_model writes tokenizer.bpe),
// trained by the train program; its checkpoint's path (static storage).
static const char *bpe_checkpoint(const char *tag) {
    const char *cfg = test_tiny_config(tag, "gdn", 2, NULL, "[data]\ntokenizer = bpe:300\n");
    static char ckpt[1500];
    snprintf(ckpt, sizeof ckpt, "%s/run/checkpoint.h5", test_dir_of(cfg));
    int code = test_spawn((char *[]){(char *)test_program("train"), "--config", (char *)cfg, NULL}, NULL, NULL, NULL,
                          120, NULL);
    cr_assert(code == 0 && access(ckpt, F_OK) == 0, "train: exit %d", code);
    return ckpt;
}

static const char *at(const char *dir, const char *name) {
    static char p[4][1600];
    static int k;
    k = (k + 1) % 4;
    cr_assert_lt(snprintf(p[k], sizeof p[k], "%s/%s", dir, name), (int)sizeof p[k], "path too long");
    return p[k];
}

// Run `prog` (NULL-terminated args) with stdout to `out` (NULL: dir/prog.out);
// returns the exit code, stderr in *err (malloc'd).
static int run(const char *prog, const char *dir, const char *out, char *const args[], char **err) {
    char *argv[32] = {(char *)test_program(prog)};
    int n = 1;
    for (; args[n - 1]; n++) argv[n] = args[n - 1];
    argv[n] = NULL;
    char o[1600], e[1600];
    snprintf(o, sizeof o, "%s/%s.out", dir, prog);
    snprintf(e, sizeof e, "%s/%s.err", dir, prog);
    int code = test_spawn(argv, NULL, out ? out : o, e, 60, NULL);
    *err = test_read_file(e);
    return code;
}

// The program failed with exit code `want`, saying `why` about `path`, and
// naming no temporary.
static void expect_refusal(int code, int want, char *err, const char *path, const char *why) {
    cr_assert_eq(code, want, "%s: exit %d\n%s", path, code, err);
    cr_assert(strstr(err, path) && strstr(err, why), "%s: expected '%s':\n%s", path, why, err);
    cr_assert_null(strstr(err, ".tmp"), "%s", err);
    free(err);
}

static void expect_same_bytes(const char *path, const uint8_t *want, int64_t n) {
    uint8_t *data;
    int64_t m;
    Status s = file_read_all(path, "file", (int64_t)1 << 30, &data, &m);
    cr_assert(s.ok, "%s", s.msg);
    cr_assert(m == n && memcmp(data, want, (size_t)n) == 0, "%s was changed", path);
    free(data);
}

static int count_temporaries(const char *dir) {
    DIR *d = opendir(dir);
    cr_assert_not_null(d);
    int n = 0;
    for (struct dirent *de; (de = readdir(d));) n += strstr(de->d_name, ".tmp") != NULL;
    closedir(d);
    return n;
}

// A character device of our own (the null device's numbers), so that a
// regression replaces a node in the test's folder, never /dev's.
static void make_device(const char *path) {
    if (mknod(path, S_IFCHR | 0666, makedev(1, 3)) != 0) cr_skip_test("mknod needs root: %s", path);
}

static bool is_kind(const char *path, mode_t kind) {
    struct stat sb;
    return lstat(path, &sb) == 0 && (sb.st_mode & S_IFMT) == kind;
}

Test(outputs, export_model_destroys_nothing_it_is_pointed_at, .timeout = 240) {
    const char *ck = bpe_checkpoint("out_export");
    char ckpt[1500], dir[1500];
    snprintf(ckpt, sizeof ckpt, "%s", ck);
    snprintf(dir, sizeof dir, "%s", test_dir_of(ckpt));
    uint8_t *orig;
    int64_t orig_n;
    cr_assert(file_read_all(ckpt, "checkpoint", (int64_t)1 << 30, &orig, &orig_n).ok);
    char *err;
    // Into folders that do not exist yet: created.
    char *out = (char *)at(dir, "exp/a/b/model.safetensors");
    int code = run("export_model", dir, NULL, (char *[]){"--checkpoint", ckpt, "--out", out, NULL}, &err);
    cr_assert_eq(code, 0, "%s", err);
    free(err);
    cr_assert(is_kind(out, S_IFREG) && is_kind(at(dir, "exp/a/b/config.json"), S_IFREG) &&
              is_kind(at(dir, "exp/a/b/tokenizer.bpe"), S_IFREG));
    // An output that is the checkpoint, or another output.
    code = run("export_model", dir, NULL, (char *[]){"--checkpoint", ckpt, "--out", ckpt, NULL}, &err);
    expect_refusal(code, 1, err, ckpt, "would overwrite the checkpoint");
    code = run("export_model", dir, NULL,
               (char *[]){"--checkpoint", ckpt, "--out", (char *)at(dir, "m.st"), "--config-json", ckpt, NULL}, &err);
    expect_refusal(code, 1, err, ckpt, "would overwrite the checkpoint");
    expect_same_bytes(ckpt, orig, orig_n);
    cr_assert(!is_kind(at(dir, "m.st"), S_IFREG), "nothing is written before every output is checked");
    code = run("export_model", dir, NULL,
               (char *[]){"--checkpoint", ckpt, "--out", (char *)at(dir, "m.st"), "--config-json",
                          (char *)at(dir, "m.st"), NULL},
               &err);
    expect_refusal(code, 1, err, at(dir, "m.st"), "would be the same file");
    code = run("export_model", dir, NULL, (char *[]){"--checkpoint", ckpt, "--out", (char *)at(dir, "config.json"), NULL},
               &err);
    expect_refusal(code, 1, err, at(dir, "config.json"), "would be the same file");
    code = run("export_model", dir, NULL,
               (char *[]){"--checkpoint", ckpt, "--out", (char *)at(dir, "m.st"), "--config-json",
                          (char *)at(dir, "tokenizer.bpe"), NULL},
               &err);
    expect_refusal(code, 1, err, at(dir, "tokenizer.bpe"), "would be the same file");
    // A FIFO (never waited on), a device, a folder: refused and left as they are.
    cr_assert_eq(mkfifo(at(dir, "fifo"), 0644), 0);
    code = run("export_model", dir, NULL, (char *[]){"--checkpoint", ckpt, "--out", (char *)at(dir, "fifo"), NULL}, &err);
    expect_refusal(code, 1, err, at(dir, "fifo"), "is a FIFO");
    cr_assert(is_kind(at(dir, "fifo"), S_IFIFO));
    code = run("export_model", dir, NULL,
               (char *[]){"--checkpoint", ckpt, "--out", (char *)at(dir, "m.st"), "--config-json",
                          (char *)at(dir, "fifo"), NULL},
               &err);
    expect_refusal(code, 1, err, at(dir, "fifo"), "is a FIFO");
    cr_assert(!is_kind(at(dir, "m.st"), S_IFREG));
    code = run("export_model", dir, NULL, (char *[]){"--checkpoint", ckpt, "--out", (char *)at(dir, "exp"), NULL}, &err);
    expect_refusal(code, 1, err, at(dir, "exp"), "is a directory");
    // A symbolic link at the output, and at the temporary names of earlier builds.
    test_write_file(at(dir, "victim"), "precious");
    cr_assert_eq(symlink(at(dir, "victim"), at(dir, "link.st")), 0);
    code = run("export_model", dir, NULL, (char *[]){"--checkpoint", ckpt, "--out", (char *)at(dir, "link.st"), NULL},
               &err);
    expect_refusal(code, 1, err, at(dir, "link.st"), "symbolic link");
    cr_assert_eq(symlink(at(dir, "victim"), at(dir, "m.st.tmp")), 0);
    code = run("export_model", dir, NULL, (char *[]){"--checkpoint", ckpt, "--out", (char *)at(dir, "m.st"), NULL}, &err);
    cr_assert_eq(code, 0, "%s", err);
    free(err);
    char *text = test_read_file(at(dir, "victim"));
    cr_assert_str_eq(text, "precious");
    free(text);
    cr_assert(is_kind(at(dir, "m.st.tmp"), S_IFLNK) && is_kind(at(dir, "m.st"), S_IFREG));
    unlink(at(dir, "m.st.tmp"));
    // A folder that cannot be made (under a regular file: root is stopped too, unlike a read-only folder).
    code = run("export_model", dir, NULL,
               (char *[]){"--checkpoint", ckpt, "--out", (char *)at(dir, "victim/x.st"), NULL}, &err);
    expect_refusal(code, 1, err, at(dir, "victim/x.st"), "Not a directory");
    cr_assert_eq(count_temporaries(dir), 0);
    cr_assert_eq(count_temporaries(at(dir, "exp/a/b")), 0);
    make_device(at(dir, "device"));
    code = run("export_model", dir, NULL, (char *[]){"--checkpoint", ckpt, "--out", (char *)at(dir, "device"), NULL},
               &err);
    expect_refusal(code, 1, err, at(dir, "device"), "is a character device");
    cr_assert(is_kind(at(dir, "device"), S_IFCHR));
    free(orig);
}

Test(outputs, tokenize_out_is_never_an_input_or_a_device, .timeout = 120) {
    const char *dir = test_scratch_corpus("out_tokenize");
    char corpus[1600], tok[1600], in[1600];
    snprintf(corpus, sizeof corpus, "%s", at(dir, "corpus.txt"));
    snprintf(tok, sizeof tok, "%s", at(dir, "t.bpe"));
    snprintf(in, sizeof in, "%s", at(dir, "in.txt"));
    char *before = test_read_file(corpus), *err;
    int code = run("tokenize", dir, NULL, (char *[]){"train", "--corpus", corpus, "--vocab", "270", "--out", corpus, NULL},
                   &err);
    expect_refusal(code, 1, err, corpus, "would overwrite the corpus file");
    char *after = test_read_file(corpus);
    cr_assert_str_eq(after, before);
    free(after), free(before);
    cr_assert_eq(mkfifo(at(dir, "fifo"), 0644), 0);
    code = run("tokenize", dir, NULL,
               (char *[]){"train", "--corpus", corpus, "--vocab", "270", "--out", (char *)at(dir, "fifo"), NULL}, &err);
    expect_refusal(code, 1, err, at(dir, "fifo"), "is a FIFO");
    cr_assert(is_kind(at(dir, "fifo"), S_IFIFO));
    code = run("tokenize", dir, NULL, (char *[]){"train", "--corpus", corpus, "--vocab", "270", "--out", tok, NULL}, &err);
    cr_assert_eq(code, 0, "%s", err);
    free(err);
    test_write_file(in, "the light and");
    code = run("tokenize", dir, NULL, (char *[]){"encode", "--tokenizer", tok, "--in", in, "--out", in, NULL}, &err);
    expect_refusal(code, 1, err, in, "would overwrite the input (--in)");
    char *text = test_read_file(in);
    cr_assert_str_eq(text, "the light and");
    free(text);
    code = run("tokenize", dir, NULL, (char *[]){"encode", "--tokenizer", tok, "--in", in, "--out", tok, NULL}, &err);
    expect_refusal(code, 1, err, tok, "would overwrite the tokenizer file");
    test_write_file(at(dir, "victim"), "precious");
    cr_assert_eq(symlink(at(dir, "victim"), at(dir, "link")), 0);
    code = run("tokenize", dir, NULL,
               (char *[]){"encode", "--tokenizer", tok, "--in", in, "--out", (char *)at(dir, "link"), NULL}, &err);
    expect_refusal(code, 1, err, at(dir, "link"), "symbolic link");
    text = test_read_file(at(dir, "victim"));
    cr_assert_str_eq(text, "precious");
    free(text);
    code = run("tokenize", dir, NULL,
               (char *[]){"encode", "--tokenizer", tok, "--in", in, "--out", (char *)at(dir, "no/ids.txt"), NULL}, &err);
    expect_refusal(code, 1, err, at(dir, "no/ids.txt"), "does not exist");
    code = run("tokenize", dir, NULL,
               (char *[]){"encode", "--tokenizer", tok, "--in", in, "--out", (char *)at(dir, "ids.txt"), NULL}, &err);
    cr_assert_eq(code, 0, "%s", err);
    free(err);
    text = test_read_file(at(dir, "ids.txt"));
    cr_assert(text && strlen(text) > 2 && text[strlen(text) - 1] == '\n', "%s", text);
    free(text);
    cr_assert_eq(count_temporaries(dir), 0);
    make_device(at(dir, "device"));
    code = run("tokenize", dir, NULL,
               (char *[]){"train", "--corpus", corpus, "--vocab", "270", "--out", (char *)at(dir, "device"), NULL}, &err);
    expect_refusal(code, 1, err, at(dir, "device"), "is a character device");
    cr_assert(is_kind(at(dir, "device"), S_IFCHR));
}

Test(outputs, a_failed_standard_output_fails_the_program, .timeout = 240) {
    if (access("/dev/full", W_OK) != 0) cr_skip_test("no /dev/full to write to");
    const char *ck = bpe_checkpoint("out_stdout");
    char ckpt[1500], dir[1500], text[1600];
    snprintf(ckpt, sizeof ckpt, "%s", ck);
    snprintf(dir, sizeof dir, "%s", test_dir_of(ckpt));
    snprintf(text, sizeof text, "%s", at(dir, "../corpus.txt"));
    const struct {
        const char *prog;
        char *args[8];
    } runs[] = {
        {"generate", {"--checkpoint", ckpt, "--max-tokens", "5", NULL}},
        {"evaluate", {"--checkpoint", ckpt, "--text", text, "--limit", "200", NULL}},
        {"evaluate", {"--checkpoint", ckpt, "--text", text, "--limit", "200", "--json", NULL}},
        {"tokenize", {"encode", "--tokenizer", "gpt2", "--in", text, NULL}},
        {"export_model", {"--help", NULL}},
        {"train", {"--help", NULL}},
    };
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        char *err, want[64];
        int code = run(runs[i].prog, dir, "/dev/full", runs[i].args, &err);
        snprintf(want, sizeof want, "%s: cannot write the output (standard output)", runs[i].prog);
        cr_assert(code == 1 && strstr(err, want), "%s %s: exit %d\n%s", runs[i].prog, runs[i].args[0], code, err);
        free(err);
        code = run(runs[i].prog, dir, "/dev/null", runs[i].args, &err);   // the same run, written: exit 0
        cr_assert_eq(code, 0, "%s: %s", runs[i].prog, err);
        free(err);
    }
}

Test(outputs, evaluate_error_exits_free_the_model, .timeout = 240) {
    const char *ck = bpe_checkpoint("out_evaluate");
    char ckpt[1500], dir[1500], text[1600];
    snprintf(ckpt, sizeof ckpt, "%s", ck);
    snprintf(dir, sizeof dir, "%s", test_dir_of(ckpt));
    snprintf(text, sizeof text, "%s", at(dir, "../corpus.txt"));
    cr_assert_eq(mkdir(at(dir, "empty"), 0755), 0);
    cr_assert_eq(mkfifo(at(dir, "fifo"), 0644), 0);
    char both[3300];
    snprintf(both, sizeof both, "%s,%s", text, at(dir, "none.txt"));
    const struct {
        char *args[10];
        const char *why;
    } bad[] = {
        {{"--text", (char *)at(dir, "none.txt"), NULL}, "No such file"},
        {{"--text", both, NULL}, "No such file"},
        {{"--text", (char *)at(dir, "empty"), NULL}, "no regular files"},
        {{"--text", (char *)at(dir, "fifo"), NULL}, "FIFO"},
        {{"--text", "/dev/null", NULL}, "character device"},
        {{"--text", text, "--window", "8", "--stride", "9", NULL}, "--stride 9 is more than the window"},
        {{"--text", text, "--logits", ckpt, NULL}, "would overwrite the checkpoint"},
        {{"--text", text, "--logits", text, NULL}, "would overwrite the text file"},
        {{"--text", text, "--logits", (char *)at(dir, "fifo"), NULL}, "is a FIFO"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *args[14] = {"--checkpoint", ckpt};
        for (int k = 0; bad[i].args[k]; k++) args[2 + k] = bad[i].args[k];
        char *err;
        int code = run("evaluate", dir, NULL, args, &err);
        cr_assert(code == 2 && strstr(err, bad[i].why), "case %zu: exit %d (23: a leak under ASan)\n%s", i, code, err);
        free(err);
    }
    cr_assert(is_kind(at(dir, "fifo"), S_IFIFO) && is_kind(ckpt, S_IFREG));
}

Test(outputs, train_dump_state_is_written_whole_and_only_to_a_file, .timeout = 120) {
    const char *cfg = test_tiny_config("out_dump", "gdn", 2, NULL, NULL);
    char dir[1500];
    snprintf(dir, sizeof dir, "%s", test_dir_of(cfg));
    cr_assert_eq(mkfifo(at(dir, "fifo"), 0644), 0);
    char *err;
    int code = run("train", dir, NULL, (char *[]){"--config", (char *)cfg, "--dump-state", (char *)at(dir, "fifo"), NULL},
                   &err);
    expect_refusal(code, 1, err, at(dir, "fifo"), "is a FIFO");
    cr_assert(is_kind(at(dir, "fifo"), S_IFIFO));
    code = run("train", dir, NULL,
               (char *[]){"--config", (char *)cfg, "--dump-state", (char *)at(dir, "state.h5"), NULL}, &err);
    cr_assert_eq(code, 0, "%s", err);
    free(err);
    cr_assert(is_kind(at(dir, "state.h5"), S_IFREG));
    cr_assert_eq(count_temporaries(dir), 0);
}

// The run folder's files: a link planted at the plot script or the lock file
// is not written through, and a FIFO at a log is refused, not waited on for ever.
Test(outputs, train_run_files_never_follow_a_link_or_wait_on_a_fifo, .timeout = 120) {
    const char *cfg = test_tiny_config("out_runfiles", "gdn", 2, NULL, NULL);
    char dir[1500], run_dir[1600];
    snprintf(dir, sizeof dir, "%s", test_dir_of(cfg));
    snprintf(run_dir, sizeof run_dir, "%s/run", dir);
    cr_assert_eq(mkdir(run_dir, 0755), 0);
    test_write_file(at(dir, "victim"), "precious");
    cr_assert_eq(symlink(at(dir, "victim"), at(run_dir, "loss.gp")), 0);
    char *err;
    int code = run("train", dir, NULL, (char *[]){"--config", (char *)cfg, NULL}, &err);
    cr_assert_eq(code, 0, "%s", err);
    cr_assert(strstr(err, "loss.gp") && strstr(err, "symbolic link") && strstr(err, "no loss plot"), "%s", err);
    free(err);
    char *text = test_read_file(at(dir, "victim"));
    cr_assert_str_eq(text, "precious");
    free(text);
    cr_assert(is_kind(at(run_dir, "loss.gp"), S_IFLNK) && is_kind(at(run_dir, "checkpoint.h5"), S_IFREG));
    cr_assert_eq(count_temporaries(run_dir), 0);
    cr_assert_eq(mkfifo(at(run_dir, "metrics.jsonl.new"), 0644), 0);
    cr_assert_eq(rename(at(run_dir, "metrics.jsonl.new"), at(run_dir, "metrics.jsonl")), 0);
    code = run("train", dir, NULL, (char *[]){"--config", (char *)cfg, "--resume", NULL}, &err);
    cr_assert(code != 0 && code != TEST_TIMED_OUT && strstr(err, "metrics.jsonl") && strstr(err, "is a FIFO"),
              "exit %d\n%s", code, err);
    free(err);
    cr_assert(is_kind(at(run_dir, "metrics.jsonl"), S_IFIFO));
    // The lock file (truncated, then given the pid) is not written through a link either.
    cr_assert_eq(unlink(at(run_dir, ".lock")), 0);
    cr_assert_eq(symlink(at(dir, "victim"), at(run_dir, ".lock")), 0);
    code = run("train", dir, NULL, (char *[]){"--config", (char *)cfg, "--resume", NULL}, &err);
    cr_assert(code == 2 && strstr(err, ".lock") && strstr(err, "symbolic link"), "exit %d\n%s", code, err);
    free(err);
    text = test_read_file(at(dir, "victim"));
    cr_assert_str_eq(text, "precious");
    free(text);
}

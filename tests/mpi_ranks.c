// mpi_ranks: ranks that differ (train/trainer_ranks.h, the checked
// collectives of train/dist.c). Ranks of an MPMD launch with configs or
// arguments of their own, or reading other files at the same path, stop
// before the first step with one message naming the rank, the key and both
// values, and write nothing; ranks that take different paths stop together
// with a message, never inside Open MPI or in a wait without end.
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mpi_tests.h"
#include "test_util.h"

// An MPMD launch of 2 ranks (mpirun -np 1 train ... : -np 1 train ...):
// rank i runs `train --config cfgs[i] --set train.run_dir=<folder>/<name>`
// and then args[i], in the folder wdirs[i] (NULL: this one). Waits (at most
// 120 s) and returns its stderr (free()); r->code is the exit code.
static char *mpmd(Run *r, const char *name, const char *const cfgs[2], const char *const *const args[2],
                  const char *const wdirs[2]) {
    char base[1000];
    snprintf(base, sizeof base, "%s", test_dir_of(cfg_path));
    snprintf(r->dir, sizeof r->dir, "%s/%s", base, name);
    snprintf(r->err, sizeof r->err, "%s/%s.err", base, name);
    char rd[1400];
    snprintf(rd, sizeof rd, "train.run_dir=%s", r->dir);
    char *argv[80];
    int n = 0;
    argv[n++] = MPIEXEC;
    if (geteuid() == 0) argv[n++] = "--allow-run-as-root";
    argv[n++] = "--oversubscribe";
    argv[n++] = "--bind-to";
    argv[n++] = "none";
    for (int i = 0; i < 2; i++) {
        if (i) argv[n++] = ":";
        argv[n++] = "-np";
        argv[n++] = "1";
        if (wdirs && wdirs[i]) {
            argv[n++] = "-wdir";
            argv[n++] = (char *)wdirs[i];
        }
        argv[n++] = (char *)test_program("train");
        argv[n++] = "--config";
        argv[n++] = (char *)(cfgs[i] ? cfgs[i] : cfg_path);
        argv[n++] = "--set";
        argv[n++] = rd;
        for (const char *const *e = args[i]; e && *e && n < 78; e++) argv[n++] = (char *)*e;
    }
    argv[n] = NULL;
    r->code = test_spawn(argv, NULL, NULL, r->err, 120, NULL);
    char *text = test_read_file(r->err);
    cr_assert_not_null(text, "%s", r->err);
    cr_assert(r->code != TEST_TIMED_OUT && r->code != 0, "%s: exit %d:\n%s", name, r->code, text);
    // Stopped by our own message, not inside Open MPI (before every rank compared its
    // settings, mismatched collectives ended in "NBC_Progress: an error 15" or a wait).
    cr_assert(!strstr(text, "NBC_Progress") && !strstr(text, "MPI_ABORT") && !strstr(text, "no progress for"),
              "%s:\n%s", name, text);
    return text;
}

// `what` is said once (rank 0 speaks for all).
static void assert_once(const char *text, const char *what) {
    const char *m = strstr(text, what);
    cr_assert(m && !strstr(m + 1, what), "once: '%s' in:\n%s", what, text);
}

// Nothing was written: no run folder (a run that stops at start-up loses no earlier checkpoint either).
static void assert_no_run(const Run *r) {
    struct stat st;
    cr_assert(stat(r->dir, &st) != 0, "%s was created", r->dir);
}

// A copy of text with each `from` replaced by `to` (free()); `from` must occur.
static char *replace(char *text, const char *from, const char *to) {
    char *at = strstr(text, from);
    cr_assert_not_null(at, "'%s' in:\n%s", from, text);
    size_t head = (size_t)(at - text), n = strlen(text) - strlen(from) + strlen(to);
    char *out = malloc(n + 1);
    snprintf(out, n + 1, "%.*s%s%s", (int)head, text, to, at + strlen(from));
    free(text);
    return out;
}

// Two configs of one MPMD launch that differ in every data setting (corpus,
// documents, seq_len, batch_size, accum_steps): before, the ranks trained on
// silently, each on its own batches. Now the job stops before the first
// step, naming each key with both values, and writes nothing.
Test(mpi, ranks_with_other_data_settings_stop_at_start, .timeout = 120) {
    setup_config("mpi_mpmd_data");
    const char *dir = test_dir_of(cfg_path);
    char b_ini[1500], corpus[1500], b_corpus[1500];
    snprintf(b_ini, sizeof b_ini, "%s/b.ini", dir);
    snprintf(corpus, sizeof corpus, "%s/corpus.txt", dir);
    snprintf(b_corpus, sizeof b_corpus, "%s/b_corpus.txt", dir);
    char *bytes = test_read_file(corpus);   // (the same text under another name)
    test_write_file(b_corpus, bytes);
    free(bytes);
    char *text = test_read_file(cfg_path);
    text = replace(text, "corpus.txt", "b_corpus.txt");
    text = replace(text, "[data]\n", "[data]\ndocuments = blank_line\n");
    text = replace(text, "seq_len = 24", "seq_len = 16");
    text = replace(text, "batch_size = 5", "batch_size = 6");
    text = replace(text, "accum_steps = 2", "accum_steps = 1");
    test_write_file(b_ini, text);
    free(text);
    Run r;
    text = mpmd(&r, "data", (const char *const[]){cfg_path, b_ini}, (const char *const *const[]){NULL, NULL}, NULL);
    char want[3200];
    snprintf(want, sizeof want, "rank 1: data.corpus = %s, rank 0 has %s", b_corpus, corpus);
    const char *expect[] = {"train: the ranks' configs differ: ", want,
                            "rank 1: data.documents = blank_line, rank 0 has none",
                            "rank 1: data.seq_len = 16, rank 0 has 24", "rank 1: data.batch_size = 6, rank 0 has 5",
                            "rank 1: train.accum_steps = 1, rank 0 has 2"};
    for (size_t i = 0; i < sizeof expect / sizeof *expect; i++) assert_once(text, expect[i]);
    assert_no_run(&r);
    free(text);
}

// A learning rate or a clipping threshold of one rank's own (--set on one
// side of an MPMD launch): before, found only by the parameter check at the
// first checkpoint, after the whole run, and no checkpoint was written.
Test(mpi, ranks_with_other_lr_or_grad_clip_stop_at_start, .timeout = 120) {
    setup_config("mpi_mpmd_lr");
    Run r;
    const char *lr[] = {"--set", "train.lr=0.004", NULL}, *clip[] = {"--set", "train.grad_clip=0.5", NULL};
    char *text = mpmd(&r, "lr", (const char *const[]){NULL, NULL}, (const char *const *const[]){NULL, lr}, NULL);
    assert_once(text, "train: the ranks' configs differ: rank 1: train.lr = 0.004, rank 0 has 0.003");
    assert_no_run(&r);
    free(text);
    // (rank 0's value named second: rank 0 is the reference)
    text = mpmd(&r, "clip", (const char *const[]){NULL, NULL}, (const char *const *const[]){clip, NULL}, NULL);
    assert_once(text, "train: the ranks' configs differ: rank 1: train.grad_clip = 1, rank 0 has 0.5");
    assert_no_run(&r);
    free(text);
}

// One path, other files: each rank runs in a folder of its own and reads
// the relative path corpus.txt there (as on machines whose "same path"
// holds different files). The configs agree; the tokens do not.
Test(mpi, the_same_corpus_path_with_other_contents_stops_at_start, .timeout = 120) {
    setup_config("mpi_same_path");
    const char *dir = test_dir_of(cfg_path);
    char corpus[1500], wd[2][1500];
    snprintf(corpus, sizeof corpus, "%s/corpus.txt", dir);
    char *bytes = test_read_file(corpus);
    for (int i = 0; i < 2; i++) {
        snprintf(wd[i], sizeof wd[i], "%s/machine%d", dir, i);
        cr_assert_eq(mkdir(wd[i], 0700), 0, "%s", wd[i]);
        char p[3100];
        snprintf(p, sizeof p, "%s/corpus.txt", wd[i]);
        if (i == 1) bytes[100] = bytes[100] == 'e' ? 'a' : 'e';   // one byte of another value
        test_write_file(p, bytes);
    }
    free(bytes);
    const char *rel[] = {"--set", "data.corpus=corpus.txt", "--set", "data.cache_dir=cache", NULL};
    Run r;
    char *text = mpmd(&r, "same_path", (const char *const[]){NULL, NULL}, (const char *const *const[]){rel, rel},
                      (const char *const[]){wd[0], wd[1]});
    assert_once(text, "train: the ranks' data differ: rank 1: the corpus's tokens = ");
    assert_once(text, "does the same path hold different files on their machines");
    cr_assert(!strstr(text, "configs differ"), "%s", text);
    assert_no_run(&r);
    free(text);
}

// Ranks that take different paths after all (an argument of one rank's
// own) stop together with a message instead of meeting in collectives that
// do not match.
Test(mpi, ranks_on_different_paths_stop_with_a_message, .timeout = 120) {
    setup_config("mpi_paths");
    Run r;
    const char *bad[] = {"--bogus", NULL}, *help[] = {"--help", NULL};
    char *text = mpmd(&r, "bad_arg", (const char *const[]){NULL, NULL}, (const char *const *const[]){NULL, bad}, NULL);
    assert_once(text, "train: rank 1: unknown or incomplete argument '--bogus'");
    assert_once(text, "train: 1 of 2 ranks failed");
    free(text);
    // One rank leaves (--help) while the other starts training.
    text = mpmd(&r, "help", (const char *const[]){NULL, NULL}, (const char *const *const[]){NULL, help}, NULL);
    assert_once(text, "train: the ranks are out of step: rank 0 is at 'setup' after 0 steps; rank 1 at 'the end "
                      "of its run'");
    free(text);
    // Rank 0 writes --dump-state (alone, by design) while rank 1, without it, starts the run.
    char dump[1500];
    snprintf(dump, sizeof dump, "%s/state.h5", test_dir_of(cfg_path));
    const char *dump_args[] = {"--dump-state", dump, NULL};
    text = mpmd(&r, "dump", (const char *const[]){NULL, NULL}, (const char *const *const[]){dump_args, NULL}, NULL);
    assert_once(text, "train: the ranks are out of step: rank 0 is at '--dump-state' after 0 steps; rank 1 at "
                      "'start' after 0 steps");
    free(text);
}

// GPU ranks (device = cuda under mpirun, one GPU each, NCCL) reduce whole
// gradients: ZeRO-1 there is refused at start-up with one message, in any
// build (the check comes before the GPU's), and nothing is written.
Test(mpi, gpu_ranks_refuse_zero_1_with_a_message, .timeout = 120) {
    setup_config("mpi_gpu_zero");
    Run r;
    const char *gpu_zero[] = {"--set", "train.device=cuda", "--set", "train.zero=1", NULL};
    char *text = mpmd(&r, "gpu_zero", (const char *const[]){NULL, NULL},
                      (const char *const *const[]){gpu_zero, gpu_zero}, NULL);
    assert_once(text, "[train] zero = 1 with device = cuda: ZeRO-1 is for the CPU ranks only so far");
    assert_no_run(&r);
    free(text);
}

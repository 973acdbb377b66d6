// A training run as users drive it, off the bundled demo's path: --set stored
// in checkpoints, resume rules, one writer per run folder, no silent
// overwrite, non-finite states never saved, runs without validation,
// continuing a model with init_from, logs cut back on resume, long paths,
// and hostile text in paths (no shell, escaped JSON). Tiny models on a
// scratch corpus, driven through the trainer API.
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <hdf5.h>

#include "checkpoint.h"
#include "h5io.h"
#include "model_setup.h"
#include "runlog.h"
#include "test_util.h"
#include "trainer.h"

static TrainerOptions opts(const char *cfg, bool resume, const char **sets, int n_sets) {
    TrainerOptions o = {0};
    o.config = cfg;
    o.resume = resume;
    o.quiet = true;
    o.sets = sets;
    o.n_sets = n_sets;
    return o;
}

// Set up and run to the end (or stop_after); returns the exit code, fails the test on a setup error.
static int run(Trainer *t, TrainerOptions o) {
    Status s = trainer_setup(t, &o);
    cr_assert(s.ok, "%s", s.msg);
    int code = trainer_run(t, &o);
    return code;
}

Test(run, every_set_is_stored_in_the_checkpoint_and_config_ini, .timeout = 60) {
    const char *cfg = test_tiny_config("run_set", "gdn,attn", 2, NULL, NULL);
    const char *sets[] = {"model.d_model=24", "model.rope_base=500", "model.d_ff=40"};
    static Trainer t;
    cr_assert_eq(run(&t, opts(cfg, false, sets, 3)), 0);
    char ckpt[1500], ini[1500];
    snprintf(ckpt, sizeof ckpt, "%s", t.ckpt);
    snprintf(ini, sizeof ini, "%s/config.ini", t.run_dir);
    trainer_free(&t);
    TrainConfig c;
    LM lm;
    ParamStore ps;
    Status s = model_load_checkpoint(ckpt, &c, &lm, &ps, NULL);   // generate's and init_from's way to the model
    cr_assert(s.ok, "the checkpoint must rebuild its own model: %s", s.msg);
    cr_assert_eq(c.model.d_model, 24);
    cr_assert_eq(c.model.d_ff, 40);
    cr_assert_eq(c.model.rope_base, 500);
    cr_assert_eq(params_find(&ps, "embed")->shape[1], 24);
    char *stored = c.text, *written = test_read_file(ini);
    cr_assert_str_eq(written, stored, "config.ini is the config the checkpoint stores");
    free(written);
    lm_destroy(&lm);
    params_free(&ps);
    config_free(&c);
}

Test(run, resume_keeps_the_runs_config, .timeout = 60) {
    const char *cfg = test_tiny_config("run_resume", "gdn", 8, NULL, NULL);
    const char *four[] = {"train.steps=4"};
    static Trainer t;
    TrainerOptions o = opts(cfg, false, four, 1);
    o.stop_after = 2;
    cr_assert_eq(run(&t, o), 130);
    trainer_free(&t);
    // Without repeating --set: the run's 4 steps, and a note that the file says 8.
    Status s = trainer_setup(&t, &(TrainerOptions){.config = cfg, .resume = true, .quiet = true});
    cr_assert(s.ok, "%s", s.msg);
    cr_assert_eq(t.cfg.train.steps, 4);
    cr_assert(strstr(t.notes, "tiny.ini:") && strstr(t.notes, "sets [train] steps = 8, but the run has 4"), "%s",
              t.notes);
    trainer_free(&t);
    // A --set that would change the model is refused, naming the key and the run's value.
    const char *wide[] = {"model.d_model=32"};
    s = trainer_setup(&t, &(TrainerOptions){.config = cfg, .resume = true, .quiet = true, .sets = wide, .n_sets = 1});
    cr_assert(!s.ok && strstr(s.msg, "--resume: --set model.d_model=32: [model] d_model is 16 in the run"), "%s",
              s.msg);
    const char *lr[] = {"train.lr=0.5"};
    s = trainer_setup(&t, &(TrainerOptions){.config = cfg, .resume = true, .quiet = true, .sets = lr, .n_sets = 1});
    cr_assert(!s.ok && strstr(s.msg, "[train] lr is 0.003 in the run"), "%s", s.msg);
    // A resumable key: applied and reported; the run then ends at the new length.
    const char *six[] = {"train.steps=6"};
    TrainerOptions r = opts(cfg, true, six, 1);
    s = trainer_setup(&t, &r);
    cr_assert(s.ok, "%s", s.msg);
    cr_assert(strstr(t.notes, "[train] steps: 4 -> 6 (--set)"), "%s", t.notes);
    cr_assert_eq(trainer_run(&t, &r), 0);
    cr_assert_eq(t.step, 6);
    trainer_free(&t);
    // Past the end: nothing to resume unless steps grows.
    const char *three[] = {"train.steps=3"};
    s = trainer_setup(&t, &(TrainerOptions){.config = cfg, .resume = true, .quiet = true, .sets = three, .n_sets = 1});
    cr_assert(!s.ok && strstr(s.msg, "is at step 6, past [train] steps = 3"), "%s", s.msg);
}

Test(run, one_writer_per_run_folder_and_no_silent_overwrite, .timeout = 60) {
    const char *cfg = test_tiny_config("run_lock", "gdn", 2, NULL, NULL);
    static Trainer a, b;
    Status s = trainer_setup(&a, &(TrainerOptions){.config = cfg, .quiet = true});
    cr_assert(s.ok, "%s", s.msg);
    s = trainer_setup(&b, &(TrainerOptions){.config = cfg, .quiet = true, .overwrite = true});
    char pid[32];
    snprintf(pid, sizeof pid, "(pid %d)", (int)getpid());
    cr_assert(!s.ok && strstr(s.msg, "another train process") && strstr(s.msg, pid), "%s", s.msg);
    TrainerOptions o = opts(cfg, false, NULL, 0);
    cr_assert_eq(trainer_run(&a, &o), 0);
    trainer_free(&a);   // releases the lock
    // The folder now holds a run: a fresh run is refused, --overwrite replaces it.
    s = trainer_setup(&b, &o);
    cr_assert(!s.ok && strstr(s.msg, "holds a previous run") && strstr(s.msg, "--overwrite"), "%s", s.msg);
    o.overwrite = true;
    s = trainer_setup(&b, &o);
    cr_assert(s.ok, "%s", s.msg);
    cr_assert_neq(access(b.ckpt, F_OK), 0, "--overwrite deletes the previous run's checkpoint");
    trainer_free(&b);
}

Test(run, a_nonfinite_update_is_never_checkpointed, .timeout = 60) {
    const char *cfg = test_tiny_config("run_nan", "gdn,attn", 6, NULL, "[train]\n");
    const char *every[] = {"train.checkpoint_every=1"};
    static Trainer t;
    TrainerOptions o = opts(cfg, false, every, 1);
    o.stop_after = 2;
    cr_assert_eq(run(&t, o), 130);
    trainer_free(&t);
    TrainerOptions r = opts(cfg, true, NULL, 0);
    Status s = trainer_setup(&t, &r);
    cr_assert(s.ok, "%s", s.msg);
    t.opt.m[3] = NAN;   // a poisoned first moment: the loss and gradients stay finite, the update does not
    cr_assert_eq(trainer_run(&t, &r), 3);
    cr_assert_eq(t.step, 2, "the step that made NaN is not counted");
    trainer_free(&t);
    s = trainer_setup(&t, &r);
    cr_assert(s.ok, "the checkpoint on disk is the last good one: %s", s.msg);
    cr_assert_eq(t.step, 2);
    cr_assert_null(optim_nonfinite_param(&t.ps, &t.opt));
    trainer_free(&t);
}

Test(run, no_validation_split_trains_and_saves, .timeout = 60) {
    const char *cfg = test_tiny_config("run_noval", "gdn", 3, NULL, NULL);
    const char *sets[] = {"data.val_fraction=0", "train.eval_every=1"};
    static Trainer t;
    cr_assert_eq(run(&t, opts(cfg, false, sets, 2)), 0);
    cr_assert(!t.has_val);
    cr_assert_eq(access(t.ckpt, F_OK), 0, "the checkpoint is written");
    char metrics[1500], bad[512];
    snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", t.run_dir);
    cr_assert_geq(test_jsonl_check(metrics, bad, sizeof bad), 0, "%s", bad);
    char *text = test_read_file(metrics);
    cr_assert(strstr(text, "\"type\":\"end\",\"step\":3,\"val_loss\":null"), "%s", text);
    cr_assert_null(strstr(text, "\"type\":\"eval\""));
    free(text);
    trainer_free(&t);
}

Test(run, huge_step_counts_allocate_nothing_up_front, .timeout = 60) {
    const char *cfg = test_tiny_config("run_huge", "gdn", 2, NULL, NULL);
    const char *sets[] = {"train.steps=2000000000"};
    static Trainer t;
    TrainerOptions o = opts(cfg, false, sets, 1);
    o.stop_after = 2;
    cr_assert_eq(run(&t, o), 130);
    cr_assert_leq(t.cap_losses, 1024, "losses are kept as they come, not for every planned step");
    cr_assert(isfinite(trainer_loss(&t, 1)) && isnan(trainer_loss(&t, 2)));
    trainer_free(&t);
}

Test(run, init_from_continues_a_model_on_new_text, .timeout = 90) {
    const char *base = test_tiny_config("run_base", "gdn,attn", 3, NULL, NULL);
    static Trainer t;
    cr_assert_eq(run(&t, opts(base, false, NULL, 0)), 0);
    char ckpt[1500];
    snprintf(ckpt, sizeof ckpt, "%s", t.ckpt);
    trainer_free(&t);
    ParamStore ref;
    LM lm;
    TrainConfig rc;
    cr_assert(model_load_checkpoint(ckpt, &rc, &lm, &ref, NULL).ok);
    Optimizer ref_opt;
    adamw_init(&ref_opt, &ref, 0.9, 0.95, 1e-8, 0.1);
    cr_assert(checkpoint_load(ckpt, &ref, &ref_opt, NULL).ok);
    // A new run: no [model] section; init_from gives it (and --set may not change it).
    char extra[1700];
    snprintf(extra, sizeof extra, "[finetune]\ninit_from = %s\n", ckpt);
    const char *cfg = test_tiny_config("run_cont", "gdn,attn", 2, NULL, extra);
    Status s = trainer_setup(&t, &(TrainerOptions){.config = cfg, .quiet = true});
    cr_assert(s.ok, "%s", s.msg);
    cr_assert_eq(t.init_report.n_loaded, ref.n);
    for (int64_t i = 0; i < ref.numel; i++) cr_assert_eq(t.ps.data[i], ref.data[i], "weights continue from init_from");
    for (int64_t i = 0; i < ref.numel; i++) cr_assert_eq(t.opt.m[i], 0, "a fresh optimizer unless restored");
    TrainerOptions o = opts(cfg, false, NULL, 0);
    cr_assert_eq(trainer_run(&t, &o), 0);
    trainer_free(&t);
    char rd[1600];
    snprintf(rd, sizeof rd, "train.run_dir=%s_restored", ckpt);
    const char *restore[] = {"finetune.restore_optimizer=true", rd};
    s = trainer_setup(&t, &(TrainerOptions){.config = cfg, .quiet = true, .sets = restore, .n_sets = 2});
    cr_assert(s.ok, "%s", s.msg);
    for (int64_t i = 0; i < ref.numel; i++) cr_assert_eq(t.opt.m[i], ref_opt.m[i], "restored moments");
    cr_assert_eq(t.opt.step, ref_opt.step);
    cr_assert_eq(t.step, 0, "the new run counts its own steps");
    trainer_free(&t);
    const char *wide[] = {"model.d_model=32"};
    s = trainer_setup(&t, &(TrainerOptions){.config = cfg, .quiet = true, .overwrite = true, .sets = wide, .n_sets = 1});
    cr_assert(!s.ok && strstr(s.msg, "[model] d_model: 32 here, but 16 in the model of"), "%s", s.msg);
    const char *missing[] = {"finetune.init_from=/nonexistent/ckpt.h5"};
    s = trainer_setup(&t, &(TrainerOptions){.config = cfg, .quiet = true, .overwrite = true, .sets = missing, .n_sets = 1});
    cr_assert(!s.ok && strstr(s.msg, "/nonexistent/ckpt.h5"), "%s", s.msg);
    optim_free(&ref_opt);
    lm_destroy(&lm);
    params_free(&ref);
    config_free(&rc);
}

Test(run, resume_cuts_the_logs_back_to_the_checkpoint, .timeout = 60) {
    const char *cfg = test_tiny_config("run_trim", "gdn", 6, NULL, NULL);
    static Trainer t;
    TrainerOptions o = opts(cfg, false, NULL, 0);
    o.stop_after = 3;
    cr_assert_eq(run(&t, o), 130);
    char metrics[1500], tsv[1500];
    snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", t.run_dir);
    snprintf(tsv, sizeof tsv, "%s/loss.tsv", t.run_dir);
    trainer_free(&t);
    // A line of NUL bytes after the first record (what a machine that lost
    // power can leave in a file): dropped on resume, the lines after it kept.
    char *text = test_read_file(metrics);
    char *nl = strchr(text, '\n');
    cr_assert_not_null(nl);
    FILE *f = fopen(metrics, "wb");
    fwrite(text, 1, (size_t)(nl + 1 - text), f);
    fwrite("\0\0\0\0\0\0\0\0\n", 1, 9, f);
    fputs(nl + 1, f);
    fclose(f);
    free(text);
    // What a run killed after its checkpoint at step 3 leaves: later records, then half a line.
    f = fopen(metrics, "a");
    fputs("{\"type\":\"train\",\"step\":4,\"loss\":12345.678}\n{\"type\":\"train\",\"step\":5,\"lo", f);
    fclose(f);
    f = fopen(tsv, "a");
    fputs("4\t12345.678\tNaN\n5\t9.", f);
    fclose(f);
    TrainerOptions r = opts(cfg, true, NULL, 0);
    cr_assert_eq(run(&t, r), 0);
    trainer_free(&t);
    char bad[512];
    cr_assert_gt(test_jsonl_check(metrics, bad, sizeof bad), 0, "every line is whole JSON: %s", bad);
    text = test_read_file(metrics);
    int next = 1;
    for (const char *p = text; (p = strstr(p, "\"type\":\"train\",\"step\":")); p++) {
        int step = atoi(p + strlen("\"type\":\"train\",\"step\":"));
        cr_assert_eq(step, next, "train records run 1, 2, ... once each (got %d, wanted %d)\n%s", step, next, text);
        next++;
    }
    cr_assert_eq(next, 7);
    cr_assert_null(strstr(text, "12345.678"), "the records after the checkpoint are gone");
    free(text);
    text = test_read_file(tsv);
    cr_assert_null(strstr(text, "12345.678"));
    cr_assert(strstr(text, "\n4\t") && strstr(text, "\n6\t") && text[strlen(text) - 1] == '\n', "%s", text);
    free(text);
}

Test(run, long_paths_are_kept_whole_and_read_back, .timeout = 60) {
    const char *dir = test_tmpdir("run_long");
    // A run folder of ~700 characters (several components under the 255 limit of each).
    char rd[1100];
    snprintf(rd, sizeof rd, "%s", dir);
    while (strlen(rd) < 700) strcat(rd, "/a-rather-long-folder-name-for-a-run-of-one-experiment-among-many");
    const char *cfg = test_tiny_config("run_longcfg", "gdn", 1, rd, NULL);
    static Trainer t;
    cr_assert_eq(run(&t, opts(cfg, false, NULL, 0)), 0);
    char path[1400];
    snprintf(path, sizeof path, "%s/checkpoint.h5", rd);
    cr_assert_eq(access(path, F_OK), 0, "the checkpoint is at the full path, not a truncated one");
    trainer_free(&t);
    snprintf(path, sizeof path, "%s/config.ini", rd);
    TrainConfig c;
    config_defaults(&c, model_mixer_known);
    Status s = config_load_file(&c, path);
    cr_assert(s.ok, "config.ini with a %zu-character line reads back: %s", strlen(rd), s.msg);
    cr_assert_str_eq(c.train.run_dir, rd);
    config_free(&c);
}

Test(run, hostile_paths_reach_no_shell_and_stay_valid_json, .timeout = 60) {
    const char *dir = test_tmpdir("run_shell");
    char rd[1100];
    snprintf(rd, sizeof rd, "%s/x'$(touch PWNED)`touch PWNED2`\"q", dir);
    const char *plain = test_tiny_config("run_shellcfg", "gdn", 2, rd, NULL);
    char cfg[1400];   // the config's own path holds a quote too (it goes into metrics.jsonl)
    snprintf(cfg, sizeof cfg, "%s/c\"fg'$(touch PWNED3).ini", dir);
    char *text = test_read_file(plain);
    test_write_file(cfg, text);
    free(text);
    static Trainer t;
    TrainerOptions o = opts(cfg, false, NULL, 0);
    o.quiet = false;   // plots (gnuplot) run only when not quiet
    cr_assert_eq(run(&t, o), 0);
    trainer_free(&t);
    char p[1400];
    snprintf(p, sizeof p, "%s/loss.png", rd);
    struct stat sb;
    cr_assert(stat(p, &sb) == 0 && sb.st_size > 0, "loss.png was drawn in the hostile folder");
    cr_assert_neq(access("PWNED", F_OK), 0, "a command in the run_dir ran");
    cr_assert_neq(access("PWNED2", F_OK), 0, "a command in the run_dir ran");
    cr_assert_neq(access("PWNED3", F_OK), 0, "a command in the config path ran");
    snprintf(p, sizeof p, "%s/PWNED", rd);
    cr_assert_neq(access(p, F_OK), 0, "a command in the run_dir ran");
    snprintf(p, sizeof p, "%s/metrics.jsonl", rd);
    char bad[512];
    cr_assert_gt(test_jsonl_check(p, bad, sizeof bad), 0, "%s", bad);
}

// A run on a BPE trained on its corpus: the checkpoint keeps the tokenizer,
// the model is rebuilt with its vocabulary, a resume and a continued run use
// it, and a checkpoint whose stored tokenizer is damaged is refused.
Test(run, a_bpe_run_keeps_its_tokenizer, .timeout = 120) {
    const char *cfg = test_tiny_config("run_bpe", "gdn,attn", 4, NULL, NULL);
    const char *sets[] = {"data.tokenizer=bpe:300"};
    static Trainer t;
    TrainerOptions o = opts(cfg, false, sets, 1);
    o.stop_after = 2;
    cr_assert_eq(run(&t, o), 130);
    int vocab = t.tok.vocab;
    uint64_t hash = t.tok.hash;
    cr_assert(t.tok.bpe && vocab > 256 && vocab <= 300, "vocabulary %d", vocab);
    cr_assert_eq(params_find(&t.ps, "embed")->shape[0], vocab, "the embedding has a row per id");
    cr_assert_lt(t.tokens.n, 20000, "fewer tokens than bytes (%lld)", (long long)t.tokens.n);
    char ckpt[1500];
    snprintf(ckpt, sizeof ckpt, "%s", t.ckpt);
    trainer_free(&t);
    TrainConfig c;
    LM lm;
    ParamStore ps;
    Tokenizer tok;
    Status s = model_load_checkpoint(ckpt, &c, &lm, &ps, &tok);
    cr_assert(s.ok, "%s", s.msg);
    cr_assert_eq(tok.hash, hash, "the checkpoint holds the run's tokenizer");
    cr_assert_eq(lm.cfg.vocab_size, vocab);
    tokenizer_free(&tok);
    lm_destroy(&lm);
    params_free(&ps);
    config_free(&c);
    // Resume: the checkpoint's tokenizer, whatever the cache holds.
    TrainerOptions r = opts(cfg, true, NULL, 0);
    cr_assert_eq(run(&t, r), 0);
    cr_assert_eq(t.tok.hash, hash);
    cr_assert_eq(t.step, 4);
    trainer_free(&t);
    // Continue on the same text: init_from brings its tokenizer; another one is refused.
    char from[1600], rd[1600];
    snprintf(from, sizeof from, "finetune.init_from=%s", ckpt);
    snprintf(rd, sizeof rd, "train.run_dir=%s_more", ckpt);
    const char *cont[] = {from, rd};
    cr_assert_eq(run(&t, opts(cfg, false, cont, 2)), 0);
    cr_assert_eq(t.tok.hash, hash);
    trainer_free(&t);
    // The config that trained it (its bpe:300 of the same corpus) builds the model's tokenizer: accepted.
    const char *same[] = {from, rd, "data.tokenizer=bpe:300"};
    TrainerOptions os = opts(cfg, false, same, 3);
    os.overwrite = true;
    s = trainer_setup(&t, &os);
    cr_assert(s.ok, "continuing a model with the config that trained it: %s", s.msg);
    cr_assert_eq(t.tok.hash, hash);
    trainer_free(&t);
    const char *other[] = {from, rd, "data.tokenizer=gpt2"};
    TrainerOptions oo = opts(cfg, false, other, 3);
    oo.overwrite = true;
    s = trainer_setup(&t, &oo);
    cr_assert(!s.ok && strstr(s.msg, "was trained with another tokenizer (BPE") && strstr(s.msg, "than this one (") &&
                  strstr(s.msg, "--set data.tokenizer=byte"),
              "%s", s.msg);
    // Another corpus's bpe:300 is another tokenizer: refused, naming the file the config would use.
    char corpus2[1700];
    snprintf(corpus2, sizeof corpus2, "data.corpus=%s/bpe_other.txt", test_tmpdir("run_bpe_other"));
    FILE *f2 = fopen(corpus2 + strlen("data.corpus="), "w");
    cr_assert(f2);
    for (int i = 0; i < 400; i++) fprintf(f2, "zebra quartz %d vexing jumbo %d\n", i, i * 7);
    fclose(f2);
    const char *newtext[] = {from, rd, "data.tokenizer=bpe:300", corpus2};
    TrainerOptions on = opts(cfg, false, newtext, 4);
    on.overwrite = true;
    s = trainer_setup(&t, &on);
    cr_assert(!s.ok && strstr(s.msg, "was trained with another tokenizer") && strstr(s.msg, ".bpe, hash"), "%s",
              s.msg);
    // A stored tokenizer that is not a tokenizer file (with a valid checksum).
    hid_t f = H5Fopen(ckpt, H5F_ACC_RDWR, H5P_DEFAULT);
    H5Ldelete(f, "/tokenizer", H5P_DEFAULT);
    const char junk[] = "#attnlab-bpe 1\nnot a rank line\n";
    cr_assert(h5io_write(f, "/tokenizer", H5IO_U8, 1, (hsize_t[]){sizeof junk - 1}, junk));
    H5Fclose(f);
    s = model_load_checkpoint(ckpt, &c, &lm, &ps, NULL);
    cr_assert(!s.ok && strstr(s.msg, "/tokenizer"), "%s", s.msg);
    config_free(&c);
}

// A run killed before its first checkpoint leaves logs and no checkpoint:
// --resume has nothing to continue, so a plain start takes the folder again
// and says so, instead of pointing at --resume.
Test(run, a_run_stopped_before_its_first_checkpoint_starts_afresh, .timeout = 60) {
    const char *cfg = test_tiny_config("run_nockpt", "gdn", 2, NULL, NULL);
    static Trainer t;
    TrainerOptions o = opts(cfg, false, NULL, 0);
    cr_assert_eq(run(&t, o), 0);
    char ckpt[1500], log[1500];
    snprintf(ckpt, sizeof ckpt, "%s", t.ckpt);
    snprintf(log, sizeof log, "%s/metrics.jsonl", t.run_dir);
    trainer_free(&t);
    cr_assert_eq(unlink(ckpt), 0);
    Status s = trainer_setup(&t, &(TrainerOptions){.config = cfg, .resume = true, .quiet = true});
    cr_assert(!s.ok && strstr(s.msg, "start the run without --resume"), "%s", s.msg);
    s = trainer_setup(&t, &o);
    cr_assert(s.ok, "%s", s.msg);
    cr_assert(strstr(t.notes, "stopped before its first checkpoint") && strstr(t.notes, "started afresh"), "%s",
              t.notes);
    cr_assert_neq(access(log, F_OK), 0, "the stopped run's logs are replaced");
    cr_assert_eq(trainer_run(&t, &o), 0);
    cr_assert_eq(access(ckpt, F_OK), 0);
    trainer_free(&t);
}

// loss.png names the unit of the loss: nats per token, a byte only for the byte tokenizer.
Test(run, the_loss_plot_names_its_unit) {
    RunLogPlot b = runlog_plot_labels("t.ini", false, false), p = runlog_plot_labels("t.ini", false, true);
    cr_assert_str_eq(b.train_label, "loss (nats/byte)");
    cr_assert_str_eq(p.train_label, "loss (nats/token)");
    RunLogPlot k = runlog_plot_labels("t.ini", true, true);
    cr_assert(k.separate && strstr(k.val_label, "nats/token"), "%s", k.val_label);
    cr_assert(strstr(runlog_plot_labels("t.ini", true, false).val_label, "nats/byte"));
}

// init_from: the model's data settings are the run's unless the command line
// gives them; a config file written for other data (the bundled indexer_ft.ini
// names the KJV) is overridden, and each key it changed is said.
Test(run, init_from_keeps_the_models_data_unless_told, .timeout = 90) {
    const char *first = test_tiny_config("run_ftdata_a", "gdn", 2, NULL, NULL);
    const char *docs[] = {"data.documents=blank_line"};
    static Trainer t;
    cr_assert_eq(run(&t, opts(first, false, docs, 1)), 0);
    char ckpt[1500], corpus_a[1500];
    snprintf(ckpt, sizeof ckpt, "%s", t.ckpt);
    snprintf(corpus_a, sizeof corpus_a, "%s", t.cfg.data.corpus);
    trainer_free(&t);
    char from[1600], other_corpus[1500];
    snprintf(from, sizeof from, "finetune.init_from=%s", ckpt);
    const char *second = test_tiny_config("run_ftdata_b", "gdn", 2, NULL, NULL);
    const char *sets[] = {from};
    Status s = trainer_setup(&t, &(TrainerOptions){.config = second, .quiet = true, .sets = sets, .n_sets = 1});
    cr_assert(s.ok, "%s", s.msg);
    snprintf(other_corpus, sizeof other_corpus, "%s", t.cfg.data.corpus);
    cr_assert_str_eq(t.cfg.data.corpus, corpus_a, "the model's corpus, not the file's");
    cr_assert_str_eq(t.cfg.data.documents, "blank_line");
    cr_assert(strstr(t.notes, "[finetune] init_from: [data] corpus = ") && strstr(t.notes, "tiny.ini:") &&
                  strstr(t.notes, "[data] documents = blank_line, as the model was trained (default says none"),
              "%s", t.notes);
    trainer_free(&t);
    // The command line chooses: the file's corpus given with --set is used, and not reported.
    const char *b_dir = test_dir_of(second);
    char corpus_b[1600];
    snprintf(corpus_b, sizeof corpus_b, "data.corpus=%s/corpus.txt", b_dir);
    const char *chosen[] = {from, corpus_b, "data.documents=none"};
    s = trainer_setup(&t, &(TrainerOptions){.config = second, .quiet = true, .sets = chosen, .n_sets = 3});
    cr_assert(s.ok, "%s", s.msg);
    cr_assert_str_eq(t.cfg.data.corpus, corpus_b + strlen("data.corpus="));
    cr_assert_str_eq(t.cfg.data.documents, "none");
    cr_assert(!strstr(t.notes, "[data] corpus") && !strstr(t.notes, "[data] documents"), "%s", t.notes);
    trainer_free(&t);
}

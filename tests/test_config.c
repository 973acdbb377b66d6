// The INI config: defaults, every error kind with its message, overrides,
// dump/parse round trip, finding bundled configs.
#define _GNU_SOURCE   // nftw
#include <ftw.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <limits.h>

#include "config.h"
#include "data_dir.h"
#include "test_util.h"

// Write `text` to <tmpdir>/<name>; returns the path (static buffer per call site use).
static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f, "cannot write %s", path);
    fputs(text, f);
    fclose(f);
}

static char tmpdir[512];
static void make_tmpdir(void) {
    snprintf(tmpdir, sizeof tmpdir, "%s", test_tmpdir("config"));
}

// Load `text` as <tmpdir>/x.ini over the defaults; returns the status.
static Status load_text(TrainConfig *cfg, const char *text, char *path, size_t n) {
    snprintf(path, n, "%s/x.ini", tmpdir);
    write_file(path, text);
    config_defaults(cfg, NULL);
    return config_load_file(cfg, path);
}

// Expect loading `text` to fail with message "<path>:<line>: <rest>".
static void expect_error(const char *text, int line, const char *rest) {
    TrainConfig cfg;
    char path[600], want[1400];
    Status st = load_text(&cfg, text, path, sizeof path);
    cr_assert(!st.ok, "expected an error for:\n%s", text);
    snprintf(want, sizeof want, "%s:%d: %s", path, line, rest);
    cr_assert_str_eq(st.msg, want);
    config_free(&cfg);
}

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    return remove(path);
}
static void remove_tmpdir(void) { nftw(tmpdir, remove_entry, 16, FTW_DEPTH | FTW_PHYS); }
TestSuite(config, .init = make_tmpdir, .fini = remove_tmpdir);

Test(config, defaults) {
    TrainConfig cfg;
    config_defaults(&cfg, NULL);
    cr_assert_eq(cfg.model.layers.n, 2);
    cr_assert_str_eq(cfg.model.layers.name[0], "attn");
    cr_assert_str_eq(cfg.model.layers.name[1], "gdn");
    cr_assert_eq(cfg.model.d_model, 128);
    cr_assert_eq(cfg.model.form, MIXER_FORM_CHUNKED);
    cr_assert(cfg.model.tied_embeddings);
    cr_assert_float_eq(cfg.train.lr, 1e-3, 1e-18);
    cr_assert_eq(cfg.train.optimizer, CFG_OPT_ADAMW);
    cr_assert_eq(cfg.train.seed, 1337);
    cr_assert_eq(cfg.finetune.mode, FT_NONE);
    cr_assert_eq(cfg.finetune.dsa_layers.n, 0);
    cr_assert_str_eq(cfg.finetune.init_from, "");
    cr_assert_null(cfg.text);
    cr_assert(config_validate(&cfg).ok);
    config_free(&cfg);
}

Test(config, loads_values_and_keeps_text) {
    const char *text = "; a comment\n"
                       "# another\n"
                       "[model]\n"
                       "layers = attn, mamba ,attn_dsa, mamba2\n"
                       "d_model = 64   ; inline comment\n"
                       "form = recurrent\n"
                       "tied_embeddings = no\n"
                       "[train]\n"
                       "lr = 3e-4\n"
                       "optimizer = sgd\n"
                       "seed = 12345678901\n"
                       "[data]\n"
                       "corpus = a.txt, /abs/b.txt\n"
                       "[finetune]\n"
                       "mode = indexer\n"
                       "init_from = runs/a/checkpoint.h5\n"
                       "dsa_layers = 2, 0\n";
    TrainConfig cfg;
    char path[600];
    Status st = load_text(&cfg, text, path, sizeof path);
    cr_assert(st.ok, "%s", st.msg);
    cr_assert_eq(cfg.model.layers.n, 4);
    cr_assert_str_eq(cfg.model.layers.name[1], "mamba");
    cr_assert_str_eq(cfg.model.layers.name[2], "attn_dsa");
    cr_assert_str_eq(cfg.model.layers.name[3], "mamba2");
    cr_assert_eq(cfg.model.d_model, 64);
    cr_assert_eq(cfg.model.form, MIXER_FORM_RECURRENT);
    cr_assert(!cfg.model.tied_embeddings);
    cr_assert_float_eq(cfg.train.lr, 3e-4, 1e-18);
    cr_assert_eq(cfg.train.optimizer, CFG_OPT_SGD);
    cr_assert_eq(cfg.train.seed, 12345678901LL);
    // Relative paths in a file are relative to its folder; absolute ones stay.
    char want[1400];
    snprintf(want, sizeof want, "%s/a.txt,/abs/b.txt", tmpdir);
    cr_assert_str_eq(cfg.data.corpus, want);
    snprintf(want, sizeof want, "%s/runs/a/checkpoint.h5", tmpdir);
    cr_assert_str_eq(cfg.finetune.init_from, want);
    cr_assert_str_eq(cfg.data.cache_dir, "cache", "a default is not a path written in the file");
    cr_assert_eq(cfg.finetune.mode, FT_INDEXER);
    cr_assert_eq(cfg.finetune.dsa_layers.n, 2);
    cr_assert_eq(cfg.finetune.dsa_layers.v[0], 2);
    cr_assert_eq(cfg.model.n_heads, 4, "untouched keys keep their defaults");
    cr_assert_str_eq(cfg.text, text);
    cr_assert_str_eq(cfg.source, path);
    cr_assert(config_validate(&cfg).ok);
    config_free(&cfg);
}

Test(config, unknown_key_suggests) {
    expect_error("[train]\n\nsteps = 10\n\n\n\nlerning_rate = 0.1\n", 7,
                 "[train] lerning_rate: unknown key (did you mean lr?)");
    expect_error("[train]\nd_modle = 3\n", 2, "[train] d_modle: unknown key (did you mean [model] d_model?)");
    expect_error("[model]\nseq_len = 3\n", 2, "[model] seq_len: unknown key (it belongs in [data])");
    expect_error("[model]\nzzzz = 3\n", 2, "[model] zzzz: unknown key");
}

Test(config, unknown_section) {
    expect_error("[trian]\nsteps = 1\n", 1, "[trian]: unknown section (did you mean [train]?)");
    // A section with no keys is still reported, at its header.
    expect_error("[model]\nd_model = 8\n[optimizer]\n", 3,
                 "[optimizer]: unknown section (sections: [model] [data] [train] [finetune])");
    expect_error("steps = 1\n", 1,
                 "steps: key outside any section (put it under [model], [data], [train] or [finetune])");
}

Test(config, bad_values) {
    expect_error("[model]\nd_model = 12.5\n", 2, "[model] d_model: '12.5' is not an integer");
    expect_error("[model]\nd_model = 0\n", 2, "[model] d_model: 0 is out of range [1, 65536]");
    expect_error("[train]\nlr = fast\n", 2, "[train] lr: 'fast' is not a finite number");
    expect_error("[train]\nlr = nan\n", 2, "[train] lr: 'nan' is not a finite number");
    expect_error("[train]\nlr =\n", 2, "[train] lr: '' is not a finite number");
    expect_error("[train]\ngrad_clip = -1\n", 2, "[train] grad_clip: -1 is out of range (at least 0)");
    expect_error("[model]\ntied_embeddings = maybe\n", 2,
                 "[model] tied_embeddings: 'maybe' is not a bool (true/false, yes/no, on/off, 1/0)");
    expect_error("[train]\noptimizer = adam\n", 2, "[train] optimizer: 'adam' is not one of adamw|sgd");
    expect_error("[model]\nform = fast\n", 2, "[model] form: 'fast' is not one of chunked|parallel|recurrent");
    expect_error("[train]\nprecision = bf16\nbf16_tiles = amx512\n", 3,
                 "[train] bf16_tiles: 'amx512' is not one of auto|amx|avx512bf16|fp32");
    expect_error("[model]\nlayers = attn,lstm\n", 2,
                 "[model] layers: 'lstm' is not a known mixer (attn, linear, mamba, gdn, attn_dsa, mamba2, gdp, kda)");
    expect_error("[model]\nlayers = attn,,gdn\n", 2, "[model] layers: empty item 2 in the list");
    expect_error("[model]\nlayers =\n", 2, "[model] layers: needs at least 1 item(s)");
    expect_error("[finetune]\ndsa_layers = 1,x\n", 2, "[finetune] dsa_layers: item 'x' is not an integer");
    expect_error("[finetune]\ndsa_layers = -1\n", 2, "[finetune] dsa_layers: -1 is out of range [0, 63]");
}

Test(config, duplicate_key_and_syntax) {
    expect_error("[train]\nlr = 0.1\nsteps = 3\nlr = 0.2\n", 4, "[train] lr: duplicate key (first set on line 2)");
    // The same key in a section opened twice is still a duplicate.
    expect_error("[train]\nlr = 0.1\n[model]\nd_model = 8\n[train]\nlr = 0.2\n", 6,
                 "[train] lr: duplicate key (first set on line 2)");
    expect_error("[train]\nlr 0.1\n", 2, "syntax error (expected [section] or key = value)");
}

Test(config, missing_file) {
    TrainConfig cfg;
    config_defaults(&cfg, NULL);
    Status st = config_load_file(&cfg, "/nonexistent/dir/x.ini");
    cr_assert(!st.ok);
    cr_assert_str_eq(st.msg, "/nonexistent/dir/x.ini: cannot open config: No such file or directory");
    config_free(&cfg);
}

Test(config, overrides) {
    TrainConfig cfg;
    char path[600];
    Status st = load_text(&cfg, "[train]\nlr = 0.1\nsteps = 50\n", path, sizeof path);
    cr_assert(st.ok, "%s", st.msg);
    cr_assert(config_set(&cfg, "train.lr=0.02").ok);
    cr_assert(config_set(&cfg, " model.layers = gdn,gdn,linear").ok);
    cr_assert_float_eq(cfg.train.lr, 0.02, 1e-18);
    cr_assert_eq(cfg.train.steps, 50);
    cr_assert_eq(cfg.model.layers.n, 3);
    cr_assert(config_set(&cfg, "train.lr=0.03").ok, "a later --set overrides an earlier one");
    cr_assert_float_eq(cfg.train.lr, 0.03, 1e-18);
    st = config_set(&cfg, "train.lr=abc");
    cr_assert_str_eq(st.msg, "--set train.lr=abc: [train] lr: 'abc' is not a finite number");
    st = config_set(&cfg, "train.lerning_rate=1");
    cr_assert_str_eq(st.msg, "--set train.lerning_rate=1: [train] lerning_rate: unknown key (did you mean lr?)");
    st = config_set(&cfg, "trian.lr=1");
    cr_assert_str_eq(st.msg, "--set trian.lr=1: [trian] lr: unknown section (did you mean [train]?)");
    st = config_set(&cfg, "lr=1");
    cr_assert_str_eq(st.msg, "--set lr=1: expected section.key=value");
    st = config_set(&cfg, "train.steps=-3");
    cr_assert_str_eq(st.msg, "--set train.steps=-3: [train] steps: -3 is out of range [0, 2e+09]");
    cr_assert_float_eq(cfg.train.lr, 0.03, 1e-18, "a failed --set leaves the value alone");
    config_free(&cfg);
}

static bool only_toy(const char *name) { return !strcmp(name, "toy") || !strcmp(name, "attn") || !strcmp(name, "gdn"); }

Test(config, custom_mixer_checker) {
    TrainConfig cfg;
    config_defaults(&cfg, only_toy);
    cr_assert(config_set(&cfg, "model.layers=toy,attn").ok);
    Status st = config_set(&cfg, "model.layers=mamba");
    cr_assert_str_eq(st.msg, "--set model.layers=mamba: [model] layers: 'mamba' is not a known mixer");
    config_free(&cfg);
}

// Without a checker, the names [model] layers accepts are the mixer kinds'
// registry's (mixer.h), not a list kept beside it: a kind the program
// registers becomes a known name and appears in the message for an unknown one.
static void *toy_cache_new(const Mixer *m, int B, int max_T, Device dev) { return NULL; }
static void toy_cache_free(void *cache) {}
static void toy_cache_reset(const Mixer *m, void *cache, int b) {}
static void toy_create(Mixer *m, ParamStore *ps, const char *prefix) {}
static Tensor *toy_forward(Tape *tp, Mixer *m, Tensor *u, const int *doc_start, Tensor *s_in, Tensor **s_out) {
    return u;
}
static Tensor *toy_step(Tape *tp, Mixer *m, void *cache, Tensor *u) { return u; }

Test(config, mixer_names_come_from_the_registry) {
    static const MixerKind toy = {.name = "toy", .create = toy_create, .forward = toy_forward,
                                  .cache_new = toy_cache_new, .cache_free = toy_cache_free, .step = toy_step,
                                  .cache_reset = toy_cache_reset};
    TrainConfig cfg;
    config_defaults(&cfg, NULL);
    Status st = config_set(&cfg, "model.layers=toy");
    cr_assert_str_eq(st.msg, "--set model.layers=toy: [model] layers: 'toy' is not a known mixer (attn, linear, "
                             "mamba, gdn, attn_dsa, mamba2, gdp, kda)");
    mixer_kind_register(&toy);   // (each test runs in a process of its own)
    st = config_set(&cfg, "model.layers=attn,toy");
    cr_assert(st.ok, "%s", st.msg);
    cr_assert_str_eq(cfg.model.layers.name[1], "toy");
    st = config_set(&cfg, "model.layers=lstm");
    cr_assert_str_eq(st.msg, "--set model.layers=lstm: [model] layers: 'lstm' is not a known mixer (attn, linear, "
                             "mamba, gdn, attn_dsa, mamba2, gdp, kda, toy)");
    config_free(&cfg);
}

Test(config, cross_key_validation) {
    TrainConfig cfg;
    char path[600], want[1400];
    Status st = load_text(&cfg, "[model]\nlayers = attn,attn_dsa\n[finetune]\n\ndsa_layers = 1,2\n", path, sizeof path);
    cr_assert(st.ok, "%s", st.msg);
    st = config_validate(&cfg);
    snprintf(want, sizeof want, "%s:5: [finetune] dsa_layers: layer 2 does not exist (the model has 2 layers)", path);
    cr_assert_str_eq(st.msg, want);
    cr_assert(config_set(&cfg, "finetune.dsa_layers=1").ok);
    cr_assert(config_validate(&cfg).ok);
    cr_assert(config_set(&cfg, "train.min_lr=0.5").ok);
    st = config_validate(&cfg);
    cr_assert_str_eq(st.msg, "--set: [train] min_lr: 0.5 is above lr = 0.001");
    config_free(&cfg);
}

Test(config, dump_parse_round_trip) {
    TrainConfig a, b;
    config_defaults(&a, NULL);
    const char *sets[] = {"model.layers=attn_dsa,linear,mamba", "model.norm_eps=1.2345678901234567e-7",
                          "train.lr=0.1", "train.seed=987654321987", "data.corpus=/x/y z.txt",
                          "finetune.mode=sparse", "finetune.dsa_layers=0,2", "model.tied_embeddings=false",
                          "model.form=parallel", "finetune.init_from=runs/a/ckpt.h5"};
    for (size_t i = 0; i < sizeof sets / sizeof sets[0]; i++) cr_assert(config_set(&a, sets[i]).ok, "%s", sets[i]);
    char *text = config_dump_string(&a);
    config_defaults(&b, NULL);
    Status st = config_load_string(&b, text, "dump");
    cr_assert(st.ok, "%s\n%s", st.msg, text);
    char *text2 = config_dump_string(&b);
    cr_assert_str_eq(text, text2);
    cr_assert_eq(b.model.norm_eps, 1.2345678901234567e-7, "floats are dumped exactly");
    cr_assert_eq(b.train.lr, 0.1);
    cr_assert_eq(b.train.seed, 987654321987LL);
    cr_assert_str_eq(b.data.corpus, "/x/y z.txt");
    cr_assert_eq(b.finetune.mode, FT_SPARSE);
    cr_assert_eq(b.finetune.dsa_layers.n, 2);
    cr_assert_eq(b.model.form, MIXER_FORM_PARALLEL);
    cr_assert(!b.model.tied_embeddings);
    cr_assert_str_eq(b.model.layers.name[2], "mamba");
    cr_assert(strstr(text, "[finetune]\nmode = sparse\n"), "%s", text);
    free(text);
    free(text2);
    config_free(&a);
    config_free(&b);
}

Test(config, help_lists_every_key) {
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    config_help(f);
    fclose(f);
    cr_assert(strstr(buf, "[train]"));
    cr_assert(strstr(buf, "  lr "));
    cr_assert(strstr(buf, "adamw|sgd"));
    cr_assert(strstr(buf, "dsa_layers"));
    cr_assert(strstr(buf, "peak learning rate"));
    free(buf);
}

Test(config, find_bundled) {
    char dir[600], path[CONFIG_STR_MAX];
    snprintf(dir, sizeof dir, "%s/configs", tmpdir);
    cr_assert_eq(mkdir(dir, 0755), 0);
    snprintf(path, sizeof path, "%s/tiny.ini", dir);
    write_file(path, "[train]\nsteps = 1\n");
    const char *dirs[] = {"/nonexistent", tmpdir};
    char out[CONFIG_STR_MAX], want[CONFIG_STR_MAX + 1200];
    Status st = config_find("tiny", dirs, 2, out, sizeof out);
    cr_assert(st.ok, "%s", st.msg);
    cr_assert_str_eq(out, path);
    st = config_find("tiny.ini", dirs, 2, out, sizeof out);
    cr_assert(st.ok, "%s", st.msg);
    cr_assert_str_eq(out, path);
    st = config_find(path, dirs, 0, out, sizeof out);   // an existing path is used as is
    cr_assert(st.ok);
    cr_assert_str_eq(out, path);
    st = config_find("nope", dirs, 2, out, sizeof out);
    snprintf(want, sizeof want,
             "nope: config not found (tried /nonexistent/configs/nope, /nonexistent/configs/nope.ini, "
             "%s/configs/nope, %s/configs/nope.ini)",
             tmpdir, tmpdir);
    cr_assert_str_eq(st.msg, want);
    st = config_find("sub/nope.ini", dirs, 2, out, sizeof out);
    cr_assert_str_eq(st.msg, "sub/nope.ini: config file not found");
}

// Every constraint a layer asserts is a validation error naming where the key was set.
Test(config, layer_constraints_are_validation_errors) {
    TrainConfig cfg;
    char path[600], want[1400];
    const struct {
        const char *text;
        int line;
        const char *rest;
    } cases[] = {
        {"[model]\nlayers = gdn,attn\nd_k = 31\n", 3,
         "[model] d_k: layer 1: attention's RoPE rotates pairs of dimensions: d_k = 31 must be even"},
        {"[model]\nlayers = attn_dsa\nindex_dim = 15\n", 3,
         "[model] index_dim: layer 0: the DSA indexer's RoPE rotates pairs of dimensions: index_dim = 15 must be even"},
        {"[model]\nlayers = gdn\nform = parallel\n", 3,
         "[model] form: layer 0: gdn has no 'parallel' form (it has: chunked, recurrent)"},
        {"[model]\nlayers = attn,attn\nform = recurrent\n", 3,
         "[model] form: form = recurrent has no effect: none of the layers (attn...) has training forms to choose "
         "between (only linear, mamba, mamba2, gdn, gdp and kda do); remove the key"},
        {"[model]\nlayers = gdn\nd_model = 65536\nd_ff = 1048576\n", 3,
         "[model] d_model: a weight of 65536 x 1048576 elements is more than this build's 2147483647 per tensor"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        Status st = load_text(&cfg, cases[i].text, path, sizeof path);
        cr_assert(st.ok, "%s", st.msg);
        st = config_validate(&cfg);
        snprintf(want, sizeof want, "%s:%d: %s", path, cases[i].line, cases[i].rest);
        cr_assert_str_eq(st.msg, want);
        config_free(&cfg);
    }
    // The same checks for a config stored in a checkpoint, and for --set.
    config_defaults(&cfg, NULL);
    Status st = config_load_string(&cfg, "[model]\nlayers = attn\nd_k = 7\n", "run/checkpoint.h5");
    cr_assert(st.ok);
    st = config_validate(&cfg);
    cr_assert(strstr(st.msg, "run/checkpoint.h5:3: [model] d_k:"), "%s", st.msg);
    config_free(&cfg);
    config_defaults(&cfg, NULL);
    cr_assert(config_set(&cfg, "model.layers=gdn,gdn").ok && config_set(&cfg, "model.form=parallel").ok);
    st = config_validate(&cfg);
    cr_assert_str_eq(st.msg, "--set: [model] form: layer 0: gdn has no 'parallel' form (it has: chunked, recurrent)");
    config_free(&cfg);
}

Test(config, warmup_follows_steps_unless_written) {
    TrainConfig cfg;
    config_defaults(&cfg, NULL);
    cr_assert(config_set(&cfg, "train.steps=30").ok);
    cr_assert(config_validate(&cfg).ok, "a short run with the default warm-up is fine");
    cr_assert_eq(config_warmup_steps(&cfg), 2, "0.05 x 30 = 1.5, rounded");
    cr_assert(config_set(&cfg, "train.warmup_fraction=0.5").ok);
    cr_assert_eq(config_warmup_steps(&cfg), 15);
    cr_assert(config_set(&cfg, "train.warmup_steps=20").ok);
    Status st = config_validate(&cfg);
    cr_assert(strstr(st.msg, "--set: [train] warmup_fraction: set together with warmup_steps = 20"), "%s", st.msg);
    cr_assert(config_set(&cfg, "train.warmup_steps=40").ok);
    cr_assert(config_set(&cfg, "train.warmup_fraction=0.05").ok);   // back to the default: no contradiction
    st = config_validate(&cfg);
    cr_assert_str_eq(st.msg, "--set: [train] warmup_steps: 40 is more than steps = 30 (or use warmup_fraction, which "
                             "scales with steps)");
    cr_assert(config_set(&cfg, "train.warmup_steps=7").ok);
    cr_assert(config_validate(&cfg).ok);
    cr_assert_eq(config_warmup_steps(&cfg), 7);
    config_free(&cfg);
}

// A bundled config writes warmup_fraction: --set train.warmup_steps replaces
// it (the command line overrides the file), and the reverse; both on the
// command line still collide.
Test(config, a_set_warmup_replaces_the_files_other_warmup_key) {
    TrainConfig cfg;
    config_defaults(&cfg, NULL);
    cr_assert(config_load_string(&cfg, "[train]\nsteps = 100\nwarmup_fraction = 0.1\n", "tiny.ini").ok);
    cr_assert(config_set(&cfg, "train.warmup_steps=5").ok);
    Status st = config_validate(&cfg);
    cr_assert(st.ok, "%s", st.msg);
    cr_assert_eq(config_warmup_steps(&cfg), 5);
    config_free(&cfg);
    config_defaults(&cfg, NULL);
    cr_assert(config_load_string(&cfg, "[train]\nsteps = 100\nwarmup_steps = 30\n", "tiny.ini").ok);
    cr_assert(config_set(&cfg, "train.warmup_fraction=0.2").ok);
    st = config_validate(&cfg);
    cr_assert(st.ok, "%s", st.msg);
    cr_assert_eq(config_warmup_steps(&cfg), 20);
    cr_assert(config_set(&cfg, "train.warmup_steps=3").ok);
    st = config_validate(&cfg);
    cr_assert(!st.ok && strstr(st.msg, "set together with warmup_steps = 3"), "%s", st.msg);
    config_free(&cfg);
}

// An installed program finds share/attnlab beside its bin/ whatever prefix
// the install chose; a program with none beside it (a build tree) keeps the
// configured path.
Test(config, the_data_folder_is_found_from_the_installed_program) {
    char root[PATH_MAX];
    snprintf(root, sizeof root, "%s", test_tmpdir("prefix"));
    char bin[PATH_MAX + 16], share[PATH_MAX + 16], data[PATH_MAX + 32], exe[PATH_MAX + 32], got[PATH_MAX + 64];
    snprintf(bin, sizeof bin, "%s/bin", root);
    snprintf(share, sizeof share, "%s/share", root);
    snprintf(data, sizeof data, "%s/share/attnlab", root);
    snprintf(exe, sizeof exe, "%s/train", bin);
    cr_assert(mkdir(bin, 0755) == 0);
    cr_assert_str_eq(attnlab_data_dir_for(exe, got, sizeof got), ATTNLAB_DATA_DIR);
    cr_assert(mkdir(share, 0755) == 0 && mkdir(data, 0755) == 0);
    attnlab_data_dir_for(exe, got, sizeof got);
    char real_got[PATH_MAX], real_data[PATH_MAX];
    cr_assert(realpath(got, real_got) && realpath(data, real_data), "%s", got);
    cr_assert_str_eq(real_got, real_data);
    cr_assert_str_eq(attnlab_data_dir_for("train", got, sizeof got), ATTNLAB_DATA_DIR, "no folder in the path");
    test_remove_tree(root);
}

// What config.ini and a checkpoint's /config hold must read back as written:
// a value that cannot is refused when it is set, whatever bytes it holds.
Test(config, values_round_trip_or_are_refused) {
    TrainConfig cfg;
    config_defaults(&cfg, NULL);
    Status st = config_set(&cfg, "train.run_dir=runs/a\n[model]\nd_model = 4");
    cr_assert(strstr(st.msg, "[train] run_dir: contains the control character 0x0a at offset 6"), "%s", st.msg);
    cr_assert(config_set(&cfg, "train.run_dir=runs/a ;x").ok);   // accepted as a value ...
    st = config_validate(&cfg);                                  // ... but it would not read back
    cr_assert(strstr(st.msg, "[train] run_dir: the value 'runs/a ;x' would not read back from config.ini as "
                             "written (it reads 'runs/a'"),
              "%s", st.msg);
    cr_assert(config_set(&cfg, "train.run_dir=a;x#y=z").ok);   // no blank before ';': not a comment
    cr_assert(config_validate(&cfg).ok);
    cr_assert(config_set(&cfg, "train.run_dir=;x").ok);   // written "run_dir = ;x": a comment after the blank
    cr_assert(!config_validate(&cfg).ok);
    config_free(&cfg);
    // A random walk over awkward characters: each value is refused, or reads back identically.
    Rng r;
    rng_seed(&r, 77);
    const char alphabet[] = " \t;#=:[]\"'\\$`()/.,x\x01\x7f\xc3\xa9";
    int accepted = 0;
    for (int trial = 0; trial < 3000; trial++) {
        char value[40], set[80];
        int n = 1 + (int)rng_below(&r, 30);
        for (int i = 0; i < n; i++) value[i] = alphabet[rng_below(&r, sizeof alphabet - 1)];
        value[n] = 0;
        snprintf(set, sizeof set, "data.corpus=%s", value);
        config_defaults(&cfg, NULL);
        if (config_set(&cfg, set).ok && config_validate(&cfg).ok) {
            accepted++;
            char *text = config_dump_string(&cfg);
            TrainConfig back;
            config_defaults(&back, NULL);
            Status s = config_load_string(&back, text, "dump");
            cr_assert(s.ok, "'%s': %s", value, s.msg);
            cr_assert_str_eq(back.data.corpus, cfg.data.corpus, "value '%s'", value);
            free(text);
            config_free(&back);
        }
        config_free(&cfg);
    }
    cr_assert(accepted > 300 && accepted < 3000, "both kinds occur: %d accepted", accepted);
}

Test(config, long_values_read_back) {
    TrainConfig cfg, back;
    config_defaults(&cfg, NULL);
    char set[CONFIG_STR_MAX + 64], value[CONFIG_STR_MAX + 8];
    for (int i = 0; i < CONFIG_STR_MAX - 1; i++) value[i] = "abcdefgh/"[i % 9];
    value[CONFIG_STR_MAX - 1] = 0;
    snprintf(set, sizeof set, "finetune.init_from=%s", value);
    cr_assert(config_set(&cfg, set).ok);
    char *text = config_dump_string(&cfg);
    config_defaults(&back, NULL);
    Status st = config_load_string(&back, text, "dump");
    cr_assert(st.ok, "%s", st.msg);
    cr_assert_str_eq(back.finetune.init_from, value);
    free(text);
    config_free(&back);
    // One character more does not fit, and says so; a long line with an inline comment parses like a short one.
    value[CONFIG_STR_MAX - 1] = 'z';
    value[CONFIG_STR_MAX] = 0;
    snprintf(set, sizeof set, "finetune.init_from=%s", value);
    st = config_set(&cfg, set);
    cr_assert(strstr(st.msg, "value is longer than 1023 characters"), "%s", st.msg);
    char ini[2 * CONFIG_STR_MAX];
    value[300] = 0;
    snprintf(ini, sizeof ini, "[data]\n  corpus =   %s   ; where the text is\n", value);
    config_defaults(&back, NULL);
    st = config_load_string(&back, ini, "x.ini");
    cr_assert(st.ok, "%s", st.msg);
    cr_assert_str_eq(back.data.corpus, value);
    config_free(&back);
    config_free(&cfg);
}

Test(config, special_files_and_line_endings_say_what_is_wrong, .timeout = 10) {
    char fifo[600], dir[600], cr[600], out[CONFIG_STR_MAX];
    snprintf(fifo, sizeof fifo, "%s/fifo.ini", tmpdir);
    cr_assert_eq(mkfifo(fifo, 0644), 0);
    Status st = config_find(fifo, NULL, 0, out, sizeof out);
    cr_assert(strstr(st.msg, "fifo.ini: is a FIFO (named pipe), not a config file"), "%s", st.msg);
    TrainConfig cfg;
    config_defaults(&cfg, NULL);
    st = config_load_file(&cfg, fifo);   // must not wait for a writer
    cr_assert(strstr(st.msg, "the config is a FIFO (named pipe), not a regular file"), "%s", st.msg);
    snprintf(dir, sizeof dir, "%s/dir.ini", tmpdir);
    cr_assert_eq(mkdir(dir, 0755), 0);
    st = config_find(dir, NULL, 0, out, sizeof out);
    cr_assert(strstr(st.msg, "dir.ini: is a directory, not a config file"), "%s", st.msg);
    st = config_find("/dev/null", NULL, 0, out, sizeof out);
    cr_assert_str_eq(st.msg, "/dev/null: is a character device, not a config file");
    snprintf(cr, sizeof cr, "%s/mac.ini", tmpdir);
    write_file(cr, "[train]\rlr = 0.1\rsteps = 3\r");
    st = config_load_file(&cfg, cr);
    cr_assert(strstr(st.msg, "mac.ini:1: carriage return inside a line: the file uses old Mac (CR) line endings"),
              "%s", st.msg);
    write_file(cr, "[train]\r\nlr = 0.1\r\n   steps = 3\r\n");   // CRLF and an indented key are fine
    st = config_load_file(&cfg, cr);
    cr_assert(st.ok, "%s", st.msg);
    cr_assert_eq(cfg.train.steps, 3);
    st = config_find("nosuch.ini", (const char *[]){tmpdir}, 1, out, sizeof out);
    cr_assert_null(strstr(st.msg, ".ini.ini"), "%s", st.msg);
    config_free(&cfg);
}

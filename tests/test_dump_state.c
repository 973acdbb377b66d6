// test_dump_state.c: the `config` attribute of a --dump-state file rebuilds
// the same model (what bench/torch_ref/compare_dump.py relies on).
#include <hdf5.h>
#include <hdf5_hl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "dump_state.h"
#include "model_setup.h"
#include "test_util.h"

static const char *INI = "[model]\nlayers = gdn,attn,mamba,linear,gdp,kda\ngdp_steps = 3\nd_model = 16\nn_heads = 2\n"
                         "d_k = 8\nd_v = 6\n"
                         "d_ff = 24\ntied_embeddings = false\nchunk_size = 5\nconv_size = 3\nnorm_eps = 1e-5\n"
                         "rope_base = 500\nqk_norm = true\nattn_gate = true\nkda_gate_bias = false\n";

Test(dump_state, config_attribute_rebuilds_the_same_model) {
    TrainConfig cfg;
    config_defaults(&cfg, model_mixer_known);
    Status s = config_load_string(&cfg, INI, "test");
    cr_assert(s.ok, "%s", s.msg);
    LM lm;
    ParamStore ps;
    s = model_build(&cfg, &lm, &ps, NULL);
    cr_assert(s.ok, "%s", s.msg);
    int B = 2, T = 7, x[14], y[14];
    for (int i = 0; i < B * T; i++) x[i] = (i * 37) % 256, y[i] = (i * 11 + 3) % 256;
    char path[600];
    snprintf(path, sizeof path, "%s/dump.h5", test_tmpdir("dump"));
    Tape tp;
    tape_init(&tp);
    s = dump_state_write(path, &tp, &lm, &ps, &(DumpBatch){x, y, NULL, B, T, NULL, false});
    cr_assert(s.ok, "%s", s.msg);

    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    cr_assert_geq(f, 0);
    H5T_class_t cls;
    size_t size = 0;
    hsize_t dims[1];
    cr_assert_geq(H5LTget_attribute_info(f, "/", "config", dims, &cls, &size), 0);
    char *text = calloc(size + 1, 1);
    cr_assert_geq(H5LTget_attribute_string(f, "/", "config", text), 0);
    // Reals in the build's precision, so a float64 reference can check a float64 build to 1e-9.
    hid_t d = H5Dopen2(f, "/grads/embed", H5P_DEFAULT);
    hid_t t = H5Dget_type(d);
    cr_assert_eq(H5Tget_size(t), sizeof(real), "gradients stored as %zu-byte reals", H5Tget_size(t));
    H5Tclose(t);
    H5Dclose(d);
    char precision[16] = "", objective[16] = "";
    H5LTget_attribute_string(f, "/", "precision", precision);
    H5LTget_attribute_string(f, "/", "objective", objective);
    cr_assert_str_eq(precision, REAL_NAME);
    cr_assert_str_eq(objective, "lm");
    H5Fclose(f);
    unlink(path);

    TrainConfig back;
    config_defaults(&back, model_mixer_known);
    s = config_load_string(&back, text, "dump");
    cr_assert(s.ok, "%s\n%s", s.msg, text);
    LMConfig a, b;
    cr_assert(config_model(&cfg, &a).ok);
    cr_assert(config_model(&back, &b).ok);
    cr_assert_eq(a.n_layers, b.n_layers);
    for (int l = 0; l < a.n_layers; l++) cr_assert_str_eq(a.layers[l], b.layers[l]);
    cr_assert(a.d_model == b.d_model && a.d_ff == b.d_ff && a.tied == b.tied && a.norm_eps == b.norm_eps);
    cr_assert(a.mixer.n_heads == b.mixer.n_heads && a.mixer.d_k == b.mixer.d_k && a.mixer.d_v == b.mixer.d_v);
    cr_assert(a.mixer.chunk_size == b.mixer.chunk_size && a.mixer.conv_size == b.mixer.conv_size);
    cr_assert(a.mixer.rope_base == b.mixer.rope_base && a.mixer.form == b.mixer.form);
    cr_assert(b.mixer.qk_norm && b.mixer.attn_gate, "attn's options must come back on");
    cr_assert_eq(b.mixer.gdp_steps, 3, "gdp_steps must come back");
    cr_assert(!a.mixer.kda_gate_bias && !b.mixer.kda_gate_bias, "kda_gate_bias = false must come back");
    free(text);
    config_free(&back);
    tape_free(&tp);
    lm_destroy(&lm);
    params_free(&ps);
    config_free(&cfg);
}

// train --dump-state on a run with documents and carried states: the dump
// holds the step's document flags and its initial states, and its loss is
// the step's own (lm_loss_carry with those flags), not the plain loss.
Test(dump_state, the_step_of_a_documents_and_carry_run, .timeout = 60) {
    const char *cfg = test_tiny_config("dump_docs", "gdn,attn", 2, NULL, NULL);
    char dir[1500], path[1600], err[1600];
    snprintf(dir, sizeof dir, "%s", test_dir_of(cfg));
    snprintf(path, sizeof path, "%s/state.h5", dir);
    snprintf(err, sizeof err, "%s/err.txt", dir);
    char *argv[] = {(char *)test_program("train"), "--config", (char *)cfg, "--set", "data.documents=text:day.",
                    "--set", "data.order=streams", "--set", "train.carry_state=true", "--dump-state", path, NULL};
    int code = test_spawn(argv, NULL, NULL, err, 60, NULL);
    char *text = test_read_file(err);
    cr_assert_eq(code, 0, "%s", text);
    free(text);
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    cr_assert_geq(f, 0);
    int B = 3, T = 24, doc[72], tokens[72];
    cr_assert_geq(H5LTread_dataset_int(f, "/doc_start", doc), 0, "the document flags");
    cr_assert_geq(H5LTread_dataset_int(f, "/tokens", tokens), 0);
    int inside = 0;
    for (int b = 0; b < B; b++) {
        cr_assert_eq(doc[b * T], 1, "a stream's first window starts afresh");
        for (int t = 1; t < T; t++) inside += doc[b * T + t];
    }
    cr_assert_gt(inside, 0, "documents start inside the windows (\"day.\" ends one every few words)");
    cr_assert_gt(H5Lexists(f, "/initial_state", H5P_DEFAULT), 0, "the carried states it started from");
    hsize_t n_states = 0;
    hid_t g = H5Gopen2(f, "/initial_state", H5P_DEFAULT);
    H5Gget_num_objs(g, &n_states);
    cr_assert_gt(n_states, 0);
    H5Gclose(g);
    H5Fclose(f);
}

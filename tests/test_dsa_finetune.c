// DeepSeek sparse attention fine-tuning (trainer [finetune], lm_distill_loss,
// the KL over the selection): gradients through the LM wiring, what the tape
// records, frozen weights bit-for-bit, the KL falling, mode = sparse, the
// sparse/dense evaluation, config errors. Tiny models on a scratch corpus.
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <hdf5.h>
#include <hdf5_hl.h>

#include "dsa_kernel.h"
#include "dsa_sel_kl.h"
#include "dump_state.h"
#include "h5io.h"
#include "test_util.h"
#include "trainer.h"

// ---------------------------------------------------------------- scratch runs

// A scratch folder with a corpus and base.ini (layers, steps); returns the folder.
static const char *scratch(const char *layers, int steps) {
    const char *dir = test_scratch_corpus("dsaft");
    char path[512];
    snprintf(path, sizeof path, "%s/base.ini", dir);
    FILE *f = fopen(path, "w");
    fprintf(f,
            "[model]\nlayers = %s\nd_model = 16\nn_heads = 2\nd_k = 8\nd_v = 8\nd_ff = 32\nchunk_size = 8\n"
            "conv_size = 3\n"
            "[data]\ncorpus = %s/corpus.txt\ncache_dir = %s/cache\nval_fraction = 0.1\nseq_len = 24\nbatch_size = 3\n"
            "[train]\nsteps = %d\nlr = 3e-3\nmin_lr = 3e-4\nwarmup_steps = 1\neval_every = 0\neval_batches = 2\n"
            "checkpoint_every = 0\nlog_every = 1\nrun_dir = %s/base\n",
            layers, dir, dir, steps, dir);
    fclose(f);
    return dir;
}

static TrainerOptions opts(const char *path) {
    static char cfg[512];
    snprintf(cfg, sizeof cfg, "%s", path);
    TrainerOptions o = {0};
    o.config = cfg;
    o.quiet = true;
    return o;
}

// Train base.ini in dir; its checkpoint is dir/base/checkpoint.h5.
static void train_base(const char *dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/base.ini", dir);
    static Trainer t;
    TrainerOptions o = opts(path);
    Status s = trainer_setup(&t, &o);
    cr_assert(s.ok, "%s", s.msg);
    cr_assert_eq(trainer_run(&t, &o), 0);
    trainer_free(&t);
}

// dir/<name>.ini: a fine-tuning config over dir/base's checkpoint. Its [model]
// sets only the indexer keys: the rest comes from the checkpoint.
static const char *ft_config(const char *dir, const char *name, const char *mode, int steps, const char *extra) {
    static char path[512];
    snprintf(path, sizeof path, "%s/%s.ini", dir, name);
    FILE *f = fopen(path, "w");
    fprintf(f,
            "[model]\nindex_heads = 2\nindex_dim = 4\ntopk = 4\n"
            "[data]\ncorpus = %s/corpus.txt\ncache_dir = %s/cache\nval_fraction = 0.1\nseq_len = 24\nbatch_size = 3\n"
            "[train]\nsteps = %d\nlr = 1e-2\nmin_lr = 1e-3\nwarmup_steps = 1\nweight_decay = 0.1\neval_every = 10\n"
            "eval_batches = 2\ncheckpoint_every = 0\nlog_every = 1\nrun_dir = %s/%s\n"
            "[finetune]\nmode = %s\ninit_from = %s/base/checkpoint.h5\n%s",
            dir, dir, steps, dir, name, mode, dir, extra ? extra : "");
    fclose(f);
    return path;
}

static bool is_indexer_name(const char *name) {
    size_t n = strlen(name);
    return n > 4 && strcmp(name + n - 4, "_idx") == 0;
}

// A parameter of a checkpoint, as stored (float32).
static float *read_param(const char *path, const char *name, int64_t numel) {
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    cr_assert_geq(f, 0, "%s", path);
    char ds[256];
    snprintf(ds, sizeof ds, "/params/%s", name);
    float *v = malloc((size_t)numel * sizeof(float));
    cr_assert_geq(H5LTread_dataset_float(f, ds, v), 0, "%s:%s", path, ds);
    H5Fclose(f);
    return v;
}

static int count_params_in_file(const char *path) {
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    hid_t g = H5Gopen2(f, "/params", H5P_DEFAULT);
    H5G_info_t info;
    H5Gget_info(g, &info);
    H5Gclose(g);
    H5Fclose(f);
    return (int)info.nlinks;
}

static bool file_contains(const char *path, const char *needle) {
    FILE *f = fopen(path, "r");
    if (!f) return false;
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
    return strstr(buf, needle) != NULL;
}

// ---------------------------------------------------------------- LM wiring

static void lm_tiny(LM *lm, ParamStore *ps, const char *layers, int topk) {
    LMConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.vocab_size = 13;
    cfg.d_model = 8;
    cfg.d_ff = 16;
    cfg.norm_eps = 1e-6;
    cfg.mixer = mixer_config_default(8, 2, 4, 4);
    cfg.mixer.conv_size = 2;
    cfg.mixer.chunk_size = 4;
    cfg.mixer.index_heads = 2;
    cfg.mixer.index_dim = 4;
    cfg.mixer.topk = topk;
    Status st = lm_parse_layers(&cfg, layers);
    cr_assert(st.ok, "%s", st.msg);
    params_init(ps);
    lm_create(lm, &cfg, ps);
    params_finalize(ps, 21);
}

// Freeze everything but the indexers; returns them in w (3 per attn_dsa layer).
static int freeze_main(LM *lm, ParamStore *ps, Tensor **w) {
    int n = 0;
    for (int l = 0; l < lm->cfg.n_layers; l++)
        if (strcmp(lm->blocks[l].mixer->kind->name, "attn_dsa") == 0) {
            attn_dsa_indexer_params(lm->blocks[l].mixer, w + n);
            n += 3;
        }
    for (int i = 0; i < ps->n; i++)
        if (!is_indexer_name(ps->params[i]->name)) params_set_frozen(ps, ps->params[i], true);
    return n;
}

enum { B_ = 2, T_ = 10 };
static int tokens[B_ * T_], targets[B_ * T_];

static void fill_tokens(void) {
    for (int i = 0; i < B_ * T_; i++) {
        tokens[i] = (i * 7 + 3) % 13;
        targets[i] = (i * 5 + 1) % 13;
    }
}

#ifdef AG_DOUBLE
static int f_distill(Tape *tp, Tensor *const *in, int n, void *ctx, Tensor **out) {
    (void)in, (void)n;
    out[0] = lm_distill_loss(tp, ctx, tokens, B_, T_);
    return 1;
}

static int f_sparse_kl(Tape *tp, Tensor *const *in, int n, void *ctx, Tensor **out) {
    (void)in, (void)n;
    LM *lm = ctx;
    lm_forward(tp, lm, tokens, B_, T_, NULL, NULL);
    out[0] = lm->dsa_kl;
    return 1;
}
#endif

Test(dsa_finetune, distill_loss_gradcheck_through_the_lm) {
    // The mean KL of two attn_dsa layers (a gdn and an attn between them, a
    // gdn after, which lm_distill_loss never runs) w.r.t. the six indexer
    // weights. Float64 only: a float32 step crosses the ReLU kinks of the
    // indexer scores (test_attn_dsa.c says the same of the layer-level check).
    fill_tokens();
    LM lm;
    ParamStore ps;
    lm_tiny(&lm, &ps, "gdn,attn_dsa,attn,attn_dsa,gdn", 3);
    Tensor *w[6];
    cr_assert_eq(freeze_main(&lm, &ps, w), 6);
    Tape tp;
    tape_init(&tp);
    Tensor *kl = lm_distill_loss(&tp, &lm, tokens, B_, T_);
    cr_assert(kl && kl->data[0] > 0, "the KL of an untrained indexer is positive");
    tape_free(&tp);
#ifdef AG_DOUBLE
    GradcheckOptions o = gradcheck_defaults();
    o.fixed = ps.params;   // the frozen main model (on the GPU it moves with the inputs)
    o.n_fixed = ps.n;
    GradcheckResult r = gradcheck("lm distill KL", f_distill, w, 6, &lm, &o);
    ASSERT_GRADCHECK(r, "lm distill KL");
    // mode = sparse: the KL over the selection, through lm_forward, w.r.t. the
    // same weights (the selection is piecewise constant in them; a 1e-6 step
    // does not move it here).
    for (int i = 0; i < ps.n; i++) params_set_frozen(&ps, ps.params[i], false);
    lm_set_dsa_mode(&lm, DSA_SPARSE_KL);
    r = gradcheck("lm sparse KL", f_sparse_kl, w, 6, &lm, &o);
    ASSERT_GRADCHECK(r, "lm sparse KL");
#endif
    lm_destroy(&lm);
    params_free(&ps);
}

Test(dsa_finetune, frozen_model_records_only_the_indexer_branches) {
    fill_tokens();
    LM lm;
    ParamStore ps;
    lm_tiny(&lm, &ps, "gdn,attn_dsa,attn,attn_dsa,gdn", 3);
    Tensor *w[6];
    freeze_main(&lm, &ps, w);
    Tape tp;
    tape_init(&tp);
    params_zero_grad(&ps);
    Tensor *kl = lm_distill_loss(&tp, &lm, tokens, B_, T_);
    // Per attn_dsa layer: 3 projections, 2 RoPEs, the scores, the KL; then the
    // mean of the two KLs: add, scale. Nothing of the main model.
    cr_assert_eq(tp.n_nodes, 2 * 7 + 2, "recorded %d nodes", tp.n_nodes);
    const char *allowed[] = {"matmul", "rope", "dsa_index_scores", "dsa_kl", "add", "scale"};
    for (int i = 0; i < tp.n_nodes; i++) {
        const Node *nd = tp.nodes[i];
        bool ok = false;
        for (int j = 0; j < 6; j++) ok |= strcmp(nd->op->name, allowed[j]) == 0;
        cr_assert(ok, "node %d: '%s' is not an indexer op", i, nd->op->name);
        if (strcmp(nd->op->name, "matmul") == 0)
            cr_assert(is_indexer_name(nd->in[1]->name), "node %d: matmul with '%s'", i, nd->in[1]->name);
    }
    tape_backward(&tp, kl);
    for (int i = 0; i < ps.n; i++) {
        const Tensor *p = ps.params[i];
        double ss = 0;
        for (int64_t j = 0; j < p->numel; j++) ss += (double)ps.grad[ps.offsets[i] + j] * ps.grad[ps.offsets[i] + j];
        if (is_indexer_name(p->name)) cr_assert_gt(ss, 0, "%s gets a gradient", p->name);
        else cr_assert_eq(ss, 0, "%s is frozen", p->name);
    }
    tape_free(&tp);
    lm_destroy(&lm);
    params_free(&ps);
}

Test(dsa_finetune, selection_kl_equals_dense_kl_when_all_selected) {
    // K = T: every position selected, the sparse attention is the dense one,
    // so the KL over the selection is the distillation KL; gradients too.
    int B = 2, T = 9, HI = 2, dI = 4, H = 2, dk = 4;
    Tensor *qI = tensor_newv(true, 3, B, T, HI * dI), *kI = tensor_newv(true, 3, B, T, dI),
           *w = tensor_newv(true, 3, B, T, HI), *q = tensor_newv(false, 3, B, T, H * dk),
           *k = tensor_newv(false, 3, B, T, H * dk);
    fill_normal(qI, 1, 1.0);
    fill_normal(kI, 2, 1.0);
    fill_normal(w, 3, 1.0);
    fill_normal(q, 4, 1.0);
    fill_normal(k, 5, 1.0);
    Tape tp;
    tape_init(&tp);
    int *sel = malloc((size_t)B * T * T * sizeof(int));
    for (int r = 0; r < B * T; r++)
        for (int j = 0; j < T; j++) sel[r * T + j] = j <= r % T ? j : -1;
    Tensor *ps = tape_tensorv(&tp, 3, B, T, T), *pd = tape_tensorv(&tp, 3, B, T, T);
    dsa_sparse_target(ps->data, q->data, k->data, sel, B, T, T, H, dk, 0.5);
    dsa_attn_target(pd->data, q->data, k->data, B, T, H, dk, 0.5, NULL);
    cr_assert_leq(max_rel_diff(ps->data, pd->data, ps->numel), FORM_TOL);
    Tensor *ls = op_dsa_sel_kl(&tp, qI, kI, w, sel, T, ps, HI);
    double kl_sel = ls->data[0];
    tape_backward(&tp, ls);
    real *g1 = malloc((size_t)qI->numel * sizeof(real));
    memcpy(g1, qI->grad, (size_t)qI->numel * sizeof(real));
    memset(qI->grad, 0, (size_t)qI->numel * sizeof(real));
    tape_reset(&tp);
    pd = tape_tensorv(&tp, 3, B, T, T);
    dsa_attn_target(pd->data, q->data, k->data, B, T, H, dk, 0.5, NULL);
    Tensor *ld = op_dsa_kl(&tp, op_dsa_index_scores(&tp, qI, kI, w, HI, NULL), pd, NULL);
    cr_assert_leq(fabs(kl_sel - ld->data[0]), FORM_TOL * fabs(ld->data[0]), "%.12g vs %.12g", kl_sel, ld->data[0]);
    tape_backward(&tp, ld);
    cr_assert_leq(max_rel_diff(g1, qI->grad, qI->numel), FORM_TOL);
    tape_free(&tp);
    free(g1);
    free(sel);
    tensor_free(qI), tensor_free(kI), tensor_free(w), tensor_free(q), tensor_free(k);
}

// ---------------------------------------------------------------- the trainer

Test(dsa_finetune, indexer_mode_keeps_the_model_bit_for_bit_and_lowers_the_kl, .timeout = 120) {
    const char *dir = scratch("gdn,attn,attn", 3);
    train_base(dir);
    const char *cfg = ft_config(dir, "ft", "indexer", 40, NULL);
    static Trainer t;
    TrainerOptions o = opts(cfg);
    Status s = trainer_setup(&t, &o);
    cr_assert(s.ok, "%s", s.msg);
    // The checkpoint's architecture, with both attn layers given an indexer.
    cr_assert_str_eq(t.cfg.model.layers.name[0], "gdn");
    cr_assert_str_eq(t.cfg.model.layers.name[1], "attn_dsa");
    cr_assert_str_eq(t.cfg.model.layers.name[2], "attn_dsa");
    cr_assert_eq(t.cfg.model.d_model, 16, "from the checkpoint's config");
    cr_assert_eq(t.init_report.n_missing, 6, "fresh: %s", t.init_report.missing);
    cr_assert(strstr(t.init_report.missing, "layers.1.mixer.wq_idx"), "%s", t.init_report.missing);
    cr_assert_eq(trainer_run(&t, &o), 0);
    // The KL falls: the mean of the last 5 steps well under the first step's.
    double first = trainer_loss(&t, 0), last = 0;
    for (int i = 35; i < 40; i++) last += trainer_loss(&t, i) / 5;
    cr_assert(last < 0.8 * first, "KL %.4f -> %.4f", first, last);
    cr_assert(isfinite(t.last_dsa.kl) && t.last_dsa.mass > 0 && t.last_dsa.mass <= 1 + 1e-12,
              "kl %g mass %g", t.last_dsa.kl, t.last_dsa.mass);
    cr_assert(t.decode_dense_tok_s > 0 && t.decode_sparse_tok_s > 0);
    // Every non-indexer tensor of the saved checkpoint equals the input's, bit for bit.
    char in[600], out[600];
    snprintf(in, sizeof in, "%s/base/checkpoint.h5", dir);
    snprintf(out, sizeof out, "%s/ft/checkpoint.h5", dir);
    cr_assert_eq(count_params_in_file(in), t.ps.n - 6);
    cr_assert_eq(count_params_in_file(out), t.ps.n);
    int n_frozen = 0;
    for (int i = 0; i < t.ps.n; i++) {
        const Tensor *p = t.ps.params[i];
        float *b = read_param(out, p->name, p->numel);
        if (is_indexer_name(p->name)) {   // trained
            cr_assert(!(p->flags & TENSOR_FROZEN), "%s is trained", p->name);
        } else {
            float *a = read_param(in, p->name, p->numel);
            cr_assert(memcmp(a, b, (size_t)p->numel * sizeof(float)) == 0, "%s changed", p->name);
            free(a);
            n_frozen++;
        }
        free(b);
    }
    cr_assert_eq(n_frozen, t.ps.n - 6);
    // The log has the DSA figures; the checkpoint's config has the attn_dsa layers.
    char log[600];
    snprintf(log, sizeof log, "%s/ft/metrics.jsonl", dir);
    cr_assert(file_contains(log, "\"type\":\"dsa_eval\"") && file_contains(log, "\"topk_mass\"") &&
              file_contains(log, "\"val_loss_dense\"") && file_contains(log, "\"dsa_decode\""));
    char *text = NULL;
    cr_assert(checkpoint_read_config(out, &text).ok);
    cr_assert(strstr(text, "layers = gdn,attn_dsa,attn_dsa"), "%s", text);
    free(text);
    trainer_free(&t);
}

Test(dsa_finetune, sparse_mode_moves_every_weight, .timeout = 120) {
    const char *dir = scratch("attn,gdn,attn", 2);
    train_base(dir);
    // Only layer 2 gets an indexer; the stage starts straight from the dense model.
    const char *cfg = ft_config(dir, "sp", "sparse", 3, "dsa_layers = 2\n");
    static Trainer t;
    TrainerOptions o = opts(cfg);
    Status s = trainer_setup(&t, &o);
    cr_assert(s.ok, "%s", s.msg);
    cr_assert_str_eq(t.cfg.model.layers.name[0], "attn");
    cr_assert_str_eq(t.cfg.model.layers.name[2], "attn_dsa");
    cr_assert_eq(t.init_report.n_missing, 3);
    cr_assert_eq(trainer_run(&t, &o), 0);
    cr_assert(isfinite(t.last_kl) && t.last_kl > 0, "the KL term ran: %g", t.last_kl);
    char in[600], out[600];
    snprintf(in, sizeof in, "%s/base/checkpoint.h5", dir);
    snprintf(out, sizeof out, "%s/sp/checkpoint.h5", dir);
    for (int i = 0; i < t.ps.n; i++) {
        const Tensor *p = t.ps.params[i];
        if (is_indexer_name(p->name)) {   // fresh: compare with the initial values instead
            cr_assert(!(p->flags & TENSOR_FROZEN));
            continue;
        }
        float *a = read_param(in, p->name, p->numel), *b = read_param(out, p->name, p->numel);
        cr_assert(memcmp(a, b, (size_t)p->numel * sizeof(float)) != 0, "%s did not move", p->name);
        free(a);
        free(b);
    }
    trainer_free(&t);
    // The indexer weights moved too: rebuild the fresh ones (same seed) and compare.
    static Trainer f;
    o.stop_after = 0;
    char fresh_dir[600];   // a fresh run folder: setup refuses one holding a run
    snprintf(fresh_dir, sizeof fresh_dir, "train.run_dir=%s/sp_fresh", dir);
    const char *fresh_set[] = {fresh_dir};
    o.sets = fresh_set;
    o.n_sets = 1;
    s = trainer_setup(&f, &o);
    cr_assert(s.ok, "%s", s.msg);
    for (const char *nm[] = {"wq_idx", "wk_idx", "ww_idx"}, **p = nm; p < nm + 3; p++) {
        char name[64];
        snprintf(name, sizeof name, "layers.2.mixer.%s", *p);
        Tensor *w0 = params_find(&f.ps, name);
        float *b = read_param(out, name, w0->numel);
        bool moved = false;
        for (int64_t j = 0; j < w0->numel; j++) moved |= b[j] != (float)w0->data[j];
        cr_assert(moved, "%s did not move", name);
        free(b);
    }
    trainer_free(&f);
}

Test(dsa_finetune, topk_at_least_T_gives_sparse_equal_dense, .timeout = 60) {
    const char *dir = scratch("attn,gdn,attn", 1);
    train_base(dir);
    const char *cfg = ft_config(dir, "eq", "indexer", 1, NULL);
    static Trainer t;
    TrainerOptions o = opts(cfg);
    const char *sets[] = {"model.topk=24"};   // = seq_len
    o.sets = sets;
    o.n_sets = 1;
    Status s = trainer_setup(&t, &o);
    cr_assert(s.ok, "%s", s.msg);
    DsaEval e;
    dsa_eval_run(&t.tp, &t.lm, &t.bt, 2, t.x, t.y, t.doc, DSA_DISTILL, &e);
    cr_assert(memcmp(&e.val_sparse, &e.val_dense, sizeof(double)) == 0, "sparse %.17g vs dense %.17g",
              e.val_sparse, e.val_dense);
    cr_assert_float_eq(e.mass, 1.0, 1e-5, "everything kept: %g", e.mass);
    // With topk < T they differ (an untrained indexer drops attention mass).
    t.lm.blocks[0].mixer->cfg.topk = 4;
    t.lm.blocks[2].mixer->cfg.topk = 4;
    dsa_eval_run(&t.tp, &t.lm, &t.bt, 2, t.x, t.y, t.doc, DSA_DISTILL, &e);
    cr_assert(e.val_sparse != e.val_dense && e.mass < 1);
    trainer_free(&t);
}

static Status setup_with(const char *cfg, const char *set) {
    static Trainer t;
    TrainerOptions o = opts(cfg);
    const char *sets[] = {set};
    o.sets = sets;
    o.n_sets = set ? 1 : 0;
    Status s = trainer_setup(&t, &o);
    if (s.ok) trainer_free(&t);
    return s;
}

Test(dsa_finetune, config_errors, .timeout = 60) {
    const char *dir = scratch("gdn,attn", 1);
    train_base(dir);
    const char *cfg = ft_config(dir, "bad", "indexer", 1, NULL);
    Status s = setup_with(cfg, "finetune.init_from=");
    cr_assert(!s.ok && strstr(s.msg, "init_from") && strstr(s.msg, "needs a checkpoint"), "%s", s.msg);
    s = setup_with(cfg, "finetune.init_from=/nonexistent/run/checkpoint.h5");
    cr_assert(!s.ok && strstr(s.msg, "/nonexistent/run/checkpoint.h5"), "%s", s.msg);
    s = setup_with(cfg, "finetune.dsa_layers=0");
    cr_assert(!s.ok && strstr(s.msg, "dsa_layers") && strstr(s.msg, "'gdn'") && strstr(s.msg, "only attn"), "%s",
              s.msg);
    s = setup_with(cfg, "finetune.dsa_layers=5");
    cr_assert(!s.ok && strstr(s.msg, "layer 5 does not exist"), "%s", s.msg);
    s = setup_with(cfg, "model.d_model=32");   // not the checkpoint's architecture
    cr_assert(!s.ok && strstr(s.msg, "--set: [model] d_model: 32 here, but 16 in the model of") &&
                  strstr(s.msg, "(init_from)"),
              "%s", s.msg);
    s = setup_with(cfg, "model.rope_base=500");   // not a shape, but the function the model computes
    cr_assert(!s.ok && strstr(s.msg, "[model] rope_base: 500 here, but 10000 in the model of"), "%s", s.msg);
    s = setup_with(cfg, "model.layers=gdn,attn,attn");
    cr_assert(!s.ok && strstr(s.msg, "[model] layers: gdn,attn,attn here, but gdn,attn in the model"), "%s", s.msg);
    s = setup_with(cfg, "model.layers=gdn,attn");   // repeating the checkpoint's value is fine
    cr_assert(s.ok, "%s", s.msg);
    s = setup_with(cfg, "model.chunk_size=4");      // how the model is computed may change
    cr_assert(s.ok, "%s", s.msg);
    s = setup_with(cfg, "model.index_dim=5");       // the new indexers' constraints are checked
    cr_assert(!s.ok && strstr(s.msg, "[model] index_dim") && strstr(s.msg, "must be even"), "%s", s.msg);
    cr_assert(setup_with(cfg, NULL).ok);
    // A model without attention layers has nothing to give an indexer.
    const char *gdir = scratch("gdn,gdn", 1);
    train_base(gdir);
    s = setup_with(ft_config(gdir, "bad", "indexer", 1, NULL), NULL);
    cr_assert(!s.ok && strstr(s.msg, "no attn layer"), "%s", s.msg);
    // The bundled config parses and points at tiny_attn.ini's checkpoint.
    TrainConfig c;
    config_defaults(&c, NULL);
    char path[CONFIG_STR_MAX];
    const char *dirs[] = {SOURCE_DIR};
    cr_assert(config_find("indexer_ft.ini", dirs, 1, path, sizeof path).ok);
    s = config_load_file(&c, path);
    cr_assert(s.ok, "%s", s.msg);
    cr_assert_eq(c.finetune.mode, FT_INDEXER);
    cr_assert_str_eq(c.finetune.init_from, SOURCE_DIR "/configs/../runs/tiny_attn/checkpoint.h5");
    config_free(&c);
}

// --dump-state in indexer mode: the distillation loss and the indexers' gradients.
Test(dsa_finetune, dump_state_in_indexer_mode, .timeout = 60) {
    const char *dir = scratch("gdn,attn", 1);
    train_base(dir);
    const char *cfg = ft_config(dir, "dump", "indexer", 1, NULL);
    static Trainer t;
    TrainerOptions o = opts(cfg);
    Status s = trainer_setup(&t, &o);
    cr_assert(s.ok, "%s", s.msg);
    batcher_train(&t.bt, t.x, t.y, NULL);
    char path[600];
    snprintf(path, sizeof path, "%s/dump.h5", dir);
    s = dump_state_write(path, &t.tp, &t.lm, &t.ps,
                         &(DumpBatch){t.x, t.y, NULL, t.cfg.data.batch_size, t.cfg.data.seq_len, NULL, true});
    cr_assert(s.ok, "%s", s.msg);
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    double kl;
    cr_assert_geq(H5LTread_dataset_double(f, "/loss", &kl), 0);
    cr_assert(isfinite(kl) && kl > 0, "the KL: %g", kl);
    char objective[16] = "";
    H5LTget_attribute_string(f, "/", "objective", objective);
    cr_assert_str_eq(objective, "distill");
    cr_assert_gt(H5Lexists(f, "/grads/layers.1.mixer.wq_idx", H5P_DEFAULT), 0, "the indexer's gradient");
    cr_assert_eq(H5Lexists(f, "/grads/embed", H5P_DEFAULT), 0, "frozen weights have no gradient");
    cr_assert_eq(H5Lexists(f, "/logits", H5P_DEFAULT), 0);
    H5Fclose(f);
    trainer_free(&t);
}

// Fine-tuning from a checkpoint holding NaN weights is refused at load (it
// used to train on and report a KL of 0).
Test(dsa_finetune, nan_weights_in_init_from_are_refused, .timeout = 60) {
    const char *dir = scratch("gdn,attn", 1);
    train_base(dir);
    char ckpt[600];
    snprintf(ckpt, sizeof ckpt, "%s/base/checkpoint.h5", dir);
    hid_t f = H5Fopen(ckpt, H5F_ACC_RDWR, H5P_DEFAULT);
    H5Ldelete(f, "/params/norm_f", H5P_DEFAULT);
    float w[16];
    for (int i = 0; i < 16; i++) w[i] = i == 5 ? NAN : 1.0f;
    cr_assert(h5io_write(f, "/params/norm_f", H5IO_F32, 1, (hsize_t[]){16}, w));   // a valid checksum
    H5Fclose(f);
    static Trainer t;
    TrainerOptions o = opts(ft_config(dir, "nan", "indexer", 1, NULL));
    Status s = trainer_setup(&t, &o);
    cr_assert(!s.ok && strstr(s.msg, "/params/norm_f: element 5 is nan (not a finite number)"), "%s", s.msg);
}

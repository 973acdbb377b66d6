// trainer_setup.c: everything up to a run's first step (trainer.h): config,
// data, model, optimizer, resume and the run folder.
//
// Under MPI (dist.h) every rank goes through it: rank 0 prepares the data
// first (a BPE tokenizer trained on the corpus, the token cache) while the
// others wait, then they find both ready (or, on a machine that does not
// share the cache folder, build their own). Each phase ends with an
// agreement, so a failure on any rank stops every rank at the same point;
// rank 0 reports its own failure, other ranks report theirs prefixed with
// their rank. Each rank takes its share of every batch, and only rank 0
// takes the run folder (its lock, and the logs it trims on resume).
#include "trainer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "blas.h"
#include "corpus.h"
#include "run_config.h"
#include "tile_amx.h"
#include "trainer_ranks.h"
#include "val_split.h"

// Is p one of an attn_dsa layer's indexer weights?
static bool is_indexer_param(const LM *lm, const Tensor *p) {
    for (int l = 0; l < lm->cfg.n_layers; l++) {
        const Mixer *m = lm->blocks[l].mixer;
        if (strcmp(m->kind->name, "attn_dsa") != 0) continue;
        Tensor *w[3];
        attn_dsa_indexer_params(m, w);
        for (int i = 0; i < 3; i++)
            if (w[i] == p) return true;
    }
    return false;
}

// Load init_from's parameters; in fine-tuning only indexer weights may be
// missing, when continuing (mode = none) none may.
static Status init_from_load(Trainer *t) {
    const char *ck = t->cfg.finetune.init_from;
    ParamsLoadReport *r = &t->init_report;
    Status s = checkpoint_load_params(ck, &t->ps, r);
    if (!s.ok) return status_err("[finetune] init_from: %s", s.msg);
    if (r->n_unused > 0)
        return status_err("[finetune] init_from: %s holds parameters this model lacks (%s): the [model] section "
                          "differs from the checkpoint's",
                          ck, r->unused);
    int fresh = 0;
    for (int i = 0; i < t->ps.n; i++) fresh += is_indexer_param(&t->lm, t->ps.params[i]);
    if (t->cfg.finetune.mode == FT_NONE) fresh = 0;
    if (r->n_loaded < t->ps.n - fresh)
        return status_err("[finetune] init_from: %s lacks parameters of the model (%s): the [model] section "
                          "differs from the checkpoint's",
                          ck, r->missing);
    if (t->cfg.finetune.restore_optimizer) {
        // Parameters again (cheap) and the moments; the run's own step and data state start fresh.
        s = checkpoint_load(ck, &t->ps, &t->opt, NULL);
        if (!s.ok) return status_err("[finetune] restore_optimizer: %s", s.msg);
    }
    return status_ok();
}

// bpe:N of this corpus: trained on its training split (the validation split
// is not seen) once, and kept in cache_dir by corpus and size.
static Status corpus_bpe(const TrainConfig *c, const Corpus *corpus, int vocab, Tokenizer *tok, char *path, size_t n) {
    if (snprintf(path, n, "%s/tokenizer-%016llx-%d.bpe", c->data.cache_dir, (unsigned long long)corpus->hash, vocab) >=
        (int)n)
        return status_err("[data] cache_dir: path too long");
    if (access(path, F_OK) == 0 && tokenizer_open(tok, path).ok) return status_ok();
    int64_t n_train = corpus->n - (int64_t)((double)corpus->n * c->data.val_fraction);
    Status s = tokenizer_train(tok, corpus->bytes, n_train, vocab);
    if (!s.ok) return status_err("[data] tokenizer = %s: %s", c->data.tokenizer, s.msg);
    s = token_cache_make_dir(c->data.cache_dir);   // (a new run's cache folder does not exist yet)
    if (s.ok) s = bpe_save(tok->bpe, path);
    if (!s.ok) fprintf(stderr, "train: note: the trained tokenizer could not be kept (%s); it is in the checkpoints\n",
                       s.msg);
    return status_ok();
}

// init_from with a [data] tokenizer the config sets: the model's vocabulary is
// fixed, so the setting must name the tokenizer the model has. It does when
// it builds the same one (compared by hash): a model continued with the
// config that trained it (bpe:N of the same corpus) is accepted.
static Status check_init_tokenizer(Trainer *t, const Corpus *corpus, const char *from, int train_vocab) {
    const char *spec = t->cfg.data.tokenizer;
    Tokenizer mine;
    char path[CONFIG_STR_MAX + 64] = "";
    Status s = train_vocab ? corpus_bpe(&t->cfg, corpus, train_vocab, &mine, path, sizeof path)
                           : tokenizer_open(&mine, spec);
    if (!s.ok) return s;
    bool same = mine.hash == t->tok.hash;
    char a[64], b[64];
    tokenizer_describe(&t->tok, a, sizeof a);
    tokenizer_describe(&mine, b, sizeof b);
    if (!same)
        s = status_err("[data] tokenizer = %s: the model of %s was trained with another tokenizer (%s, hash %016llx) "
                       "than this one (%s%s%s, hash %016llx); a model keeps its tokenizer: leave [data] tokenizer "
                       "at its default (--set data.tokenizer=byte), which takes the model's",
                       spec, from, a, (unsigned long long)t->tok.hash, b, path[0] ? ", " : "", path,
                       (unsigned long long)mine.hash);
    tokenizer_free(&mine);
    return s;
}

// The run's tokenizer: the checkpoint's when resuming or starting from
// init_from (the model's vocabulary is fixed there: a [data] tokenizer the
// config sets must be that one), else [data] tokenizer.
static Status setup_tokenizer(Trainer *t, const Corpus *corpus, const TrainerOptions *o) {
    const TrainConfig *c = &t->cfg;
    const char *from = o->resume ? t->ckpt : c->finetune.init_from[0] ? c->finetune.init_from : NULL;
    const char *spec = c->data.tokenizer;
    int train_vocab = 0;
    tokenizer_spec_is_named(spec, &train_vocab);
    if (from) {
        Status s = checkpoint_read_tokenizer(from, &t->tok);
        if (!s.ok) return status_err("%s%s", o->resume ? "--resume: " : "[finetune] init_from: ", s.msg);
        // (byte: the default, not a choice; a file's tokenizer is replaced by the model's run's: run_config.h)
        if (o->resume || !strcmp(spec, "byte") || !run_config_from_command_line(c, "data", "tokenizer"))
            return status_ok();
        return check_init_tokenizer(t, corpus, from, train_vocab);
    }
    if (!train_vocab) {
        Status s = tokenizer_open(&t->tok, spec);
        return s.ok ? s : status_err("[data] tokenizer: %s", s.msg);
    }
    char path[CONFIG_STR_MAX + 64];
    return corpus_bpe(c, corpus, train_vocab, &t->tok, path, sizeof path);
}

// gemm = auto decides once per run. Where the two backends are close, its
// measurement can choose either from one start to the next, and they round
// differently: the run keeps what it chose in its config (config.ini and every
// checkpoint say e.g. `gemm = onednn`), so that a resumed run multiplies on the
// same backend and goes on bit for bit. Under mpirun every rank takes rank 0's
// choice. (--set train.gemm=auto on --resume chooses again.)
static void keep_gemm_choice(Trainer *t) {
    int b = (int)blas_backend;
    dist_bcast(&b, sizeof b, "[train] gemm = auto");
    if (b != (int)blas_backend) {
        char err[256];
        if (!blas_select((GemmBackend)b, (GemmPrecision)t->cfg.train.precision, err, sizeof err))
            dist_abort(1, "[train] gemm = auto: rank 0 chose %s, which this rank cannot run: %s",
                       blas_backend_name((GemmBackend)b), err);
    }
    t->cfg.train.gemm = b;
}

// bf16_tiles = auto, the same way: AMX and AVX512_BF16 tiles sum in another
// order, so the run keeps the kind it started with (config.ini, checkpoints),
// and every rank takes rank 0's.
static void keep_tiles_choice(Trainer *t) {
    int k = (int)bf16_tiles_current();
    dist_bcast(&k, sizeof k, "[train] bf16_tiles = auto");
    char err[256];
    if (k != (int)bf16_tiles_current() && !bf16_tiles_select((Bf16Tiles)k, err, sizeof err))
        dist_abort(1, "[train] bf16_tiles = auto: rank 0 chose %s, which this rank cannot run: %s",
                   bf16_tiles_name((Bf16Tiles)k), err);
    t->cfg.train.bf16_tiles = k;
}

// A resumed run whose products cannot run here: which key, and how to go on.
static Status resume_products_error(const TrainConfig *c, Status s) {
    if (c->train.gemm != GEMM_AUTO && strstr(s.msg, "gemm = "))   // (not: bf16's CPU check)
        return status_err("--resume: %s (a run keeps the backend it started on, so that it goes on bit for bit; "
                          "--set train.gemm=auto lets this machine choose, and the products then round "
                          "differently)",
                          s.msg);
    if (c->train.bf16_tiles != BF16_TILES_AUTO && strstr(s.msg, "bf16_tiles = "))
        return status_err("--resume: %s (a run keeps the attention tiles it started on, so that it goes on bit for "
                          "bit; --set train.bf16_tiles=auto lets this machine choose, and the attention's products "
                          "then sum in another order)",
                          s.msg);
    return s;
}

// The config: the file, --set and defaults (or the run's stored one on --resume).
static Status setup_config(Trainer *t, const TrainerOptions *o) {
    t->last_val_loss = NAN;
    t->last_kl = NAN;
    t->last_dsa = (DsaEval){NAN, NAN, NAN, NAN};
    t->decode_dense_tok_s = t->decode_sparse_tok_s = NAN;
    t->saved_step = -1;
    t->rank = dist_rank();
    t->ranks = dist_size();
    tokenizer_bytes(&t->tok);
    config_defaults(&t->cfg, model_mixer_known);
    Status s = config_find(o->config, CONFIG_SEARCH_DIRS, CONFIG_N_SEARCH_DIRS, t->config_path, sizeof t->config_path);
    RunConfigArgs args = {t->config_path, o->sets, o->n_sets, o->resume};
    if (s.ok) s = run_config_load(&t->cfg, &args, t->run_dir, sizeof t->run_dir, t->notes, sizeof t->notes);
    if (s.ok) dist_set_timeout(t->cfg.train.dist_timeout);
    return s;
}

// The threads and the products (a rank may fail here alone: this CPU lacks bf16).
static Status setup_threads(Trainer *t, const TrainerOptions *o) {
    const TrainConfig *c = &t->cfg;
    Status s;
    // Threads per rank: [train] threads, else OMP_NUM_THREADS, else (under MPI) the rank's share of the cores.
    int threads = c->train.threads;
    if (threads == 0 && !getenv("OMP_NUM_THREADS")) threads = dist_default_threads();
    t->threads = model_set_threads(threads);
    if (c->train.device == DEVICE_CUDA && t->ranks > 1) {   // GPU ranks: one GPU each, by their place on the machine
        if (c->train.zero == 1)
            return status_err("[train] zero = 1 with device = cuda: ZeRO-1 is for the CPU ranks only so far; the GPU "
                              "ranks reduce whole gradients (set zero = 0)");
        device_cuda_choose(dist_local_rank());   // (before model_set_products sets the GPU up)
    }
    if (!(s = model_set_products(c)).ok)   // [train] gemm, precision, bf16_tiles: after the threads
        return o->resume ? resume_products_error(c, s) : s;
    return status_ok();
}

// gemm = auto's choice (on every rank at once), and the run's effective config.
static Status setup_effective(Trainer *t) {
    const TrainConfig *c = &t->cfg;
    if (c->train.device == DEVICE_CPU && c->train.gemm == GEMM_AUTO) keep_gemm_choice(t);
    if (c->train.device == DEVICE_CPU && c->train.precision == PRECISION_BF16 && c->train.bf16_tiles == BF16_TILES_AUTO)
        keep_tiles_choice(t);
    // The run's effective config (auto's choice in it): what config.ini and every checkpoint hold.
    free(t->cfg.text);
    t->cfg.text = config_dump_string(&t->cfg);
    if (snprintf(t->ckpt, sizeof t->ckpt, "%s/checkpoint.h5", t->run_dir) >= (int)sizeof t->ckpt)
        return status_err("[train] run_dir: path too long");
    if (c->data.batch_size < t->ranks)
        return status_err("[data] batch_size = %d windows cannot be shared by %d ranks (each takes one at least): "
                          "raise batch_size or start fewer ranks",
                          c->data.batch_size, t->ranks);
    return status_ok();
}

// [data] val_choice = documents with documents: hold out whole documents
// drawn at random (val_split.h). The tokens and document starts are replaced
// by their reordered copies (owned by t->tokens from then on); *train_end
// receives where the held-out documents begin, -1 when the split stays the
// tail (val_choice = tail, no documents, or no validation).
static Status split_documents(Trainer *t, int64_t *train_end) {
    const TrainConfig *c = &t->cfg;
    TokenData *td = &t->tokens;
    *train_end = -1;
    if (c->data.val_choice != CFG_VAL_DOCUMENTS || !(c->data.val_fraction > 0) || td->n_docs < 1) return status_ok();
    if (td->n_docs < 2) {   // nothing to draw from: said, not refused (the default must work on any corpus)
        size_t used = strlen(t->notes);
        snprintf(t->notes + used, sizeof t->notes - used,
                 "[data] val_choice = documents: the corpus is one document, so the validation split is its tail\n");
        return status_ok();
    }
    int *tokens;
    int64_t *starts;
    Status s = val_split_documents(td->tokens, td->n, td->doc_starts, td->n_docs, c->data.val_fraction,
                                   (uint64_t)c->train.seed, &tokens, &starts, train_end);
    if (!s.ok) return status_err("[data] %s", s.msg);
    free(td->owned);   // (a mapped cache stays mapped until token_data_free)
    free(td->doc_starts);
    td->owned = tokens;
    td->tokens = tokens;
    td->doc_starts = starts;
    td->mapped = false;
    return status_ok();
}

// Corpus, tokenizer, token cache, batches.
static Status setup_data(Trainer *t, const TrainerOptions *o) {
    const TrainConfig *c = &t->cfg;
    Corpus corpus;
    Status s = corpus_load(&corpus, c->data.corpus);
    if (!s.ok && strstr(s.msg, "kjv.txt: cannot open") && strstr(s.msg, "No such file"))
        return status_err("[data] corpus: %s (the bundled configs train on the King James Bible: run "
                          "scripts/get_corpus.sh in the project folder; it needs Debian's bible-kjv package)",
                          s.msg);
    if (!s.ok) return status_err("[data] corpus: %s", s.msg);
    s = setup_tokenizer(t, &corpus, o);
    if (s.ok) {
        DocSpec docs;
        s = doc_spec_parse(c->data.documents, &docs);   // (checked with the config)
        if (s.ok)
            s = token_cache_load(c->data.cache_dir, c->data.corpus, &corpus, &t->tok, &docs, &t->tokens,
                                 &t->cache_built, t->cache_path);
        if (!s.ok) s = status_err("token cache: %s", s.msg);
    }
    corpus_free(&corpus);
    if (!s.ok) return s;
    t->cfg.vocab_size = t->tok.vocab;
    t->tok_buf = tokenizer_to_buffer(&t->tok, &t->tok_len);
    int64_t train_end = -1;
    s = split_documents(t, &train_end);
    if (s.ok)
        s = train_end >= 0 ? batcher_init_at(&t->bt, t->tokens.tokens, t->tokens.n, train_end, c->data.batch_size,
                                             c->data.seq_len, (uint64_t)c->train.seed)
                           : batcher_init(&t->bt, t->tokens.tokens, t->tokens.n, c->data.val_fraction,
                                          c->data.batch_size, c->data.seq_len, (uint64_t)c->train.seed);
    if (!s.ok) return status_err("[data]: %s", s.msg);
    batcher_set_documents(&t->bt, t->tokens.doc_starts, t->tokens.n_docs);
    if (c->data.order == CFG_ORDER_STREAMS) {
        s = batcher_set_streams(&t->bt);
        if (!s.ok) return status_err("[data] order = streams: %s", s.msg);
    }
    t->has_val = batcher_val_tokens(&t->bt) > 0;
    return status_ok();
}

// [train] device = cuda: what the GPU backend runs today (docs/cuda.md), and a
// GPU to run it on; otherwise a message naming the key.
static Status check_gpu_run(Trainer *t) {
    char err[512];
    if (!device_cuda_init(err, sizeof err))
        return status_err("[train] device = cuda: %s; or train on the CPU: --device cpu", err);
    return status_ok();
}

// The GPU ranks' gradient reduction over NCCL (every rank at once: it is a
// collective); in one process only when the tests ask for a communicator of one.
static Status setup_gpu_ranks(Trainer *t, const TrainerOptions *o) {
    const TrainConfig *c = &t->cfg;
    if (c->train.device != DEVICE_CUDA || (t->ranks == 1 && !o->nccl_one)) return status_ok();
    char err[400];
    t->dg = dist_grads_new_nccl(&t->ps, (size_t)c->train.dist_bucket_kb << 10, err, sizeof err);
    if (!t->dg) return status_err("[train] device = cuda with %d rank%s: %s", t->ranks, t->ranks == 1 ? "" : "s", err);
    dist_grads_slice(t->dg, &t->slice_lo, &t->slice_hi);
    // No CUDA graph over the buckets: they record events across two streams and the host polls them.
    lm_graph_free(&t->graph);
    return status_ok();
}

// Model, optimizer, the start from init_from or a checkpoint, the run folder.
static Status setup_model(Trainer *t, const TrainerOptions *o) {
    const TrainConfig *c = &t->cfg;
    bool ft = c->finetune.mode != FT_NONE;
    // A checkpoint to load is checked against the model before it is allocated.
    const char *check = o->resume ? t->ckpt : (c->finetune.init_from[0] && !ft) ? c->finetune.init_from : NULL;
    Status s = model_build(c, &t->lm, &t->ps, check);
    if (!s.ok) return status_err("%s%s", o->resume ? "--resume: " : check ? "[finetune] init_from: " : "", s.msg);
    if (c->train.device == DEVICE_CUDA && !(s = check_gpu_run(t)).ok) return s;
    t->dsa_mode = c->finetune.mode == FT_INDEXER  ? DSA_DISTILL
                  : c->finetune.mode == FT_SPARSE ? DSA_SPARSE_KL
                                                  : DSA_SPARSE;
    lm_set_dsa_mode(&t->lm, t->dsa_mode);
    if (c->finetune.mode == FT_INDEXER)   // only the indexers move
        for (int i = 0; i < t->ps.n; i++)
            if (!is_indexer_param(&t->lm, t->ps.params[i])) params_set_frozen(&t->ps, t->ps.params[i], true);
    rng_seed(&t->model_rng, (uint64_t)c->train.seed ^ 0x5eedull);
    // The gradient reduction over the trainable parameters (NULL in one process), and this rank's slice.
    // (The GPU ranks' comes once the parameters are on the GPU: setup_gpu_ranks.)
    size_t bucket_bytes = (size_t)c->train.dist_bucket_kb << 10;
    t->dg = c->train.device == DEVICE_CPU ? dist_grads_new(&t->ps, c->train.zero == 1, bucket_bytes) : NULL;
    dist_grads_slice(t->dg, &t->slice_lo, &t->slice_hi);
    if (t->slice_hi > t->ps.numel) t->slice_hi = t->ps.numel;
    if (c->train.optimizer == CFG_OPT_SGD) sgd_init(&t->opt, &t->ps, c->train.momentum, c->train.weight_decay);
    else adamw_init(&t->opt, &t->ps, c->train.beta1, c->train.beta2, c->train.adam_eps, c->train.weight_decay);
    if (t->dg && c->train.zero == 1) optim_set_shard(&t->opt, t->slice_lo, t->slice_hi);   // ZeRO-1
    if (c->finetune.init_from[0] && !o->resume) {
        s = init_from_load(t);
        if (!s.ok) return s;
    }
    tape_init_on(&t->tp, (Device)c->train.device);
    if (c->train.cuda_graph == CFG_GRAPH_ON && t->ranks > 1)
        return status_err("%s: [train] cuda_graph = on: graphs run in one process, and this run has %d ranks "
                          "(auto trains the ranks without graphs)", t->config_path, t->ranks);
    // [train] cuda_graph: on where supported unless off (on where it is not was a config error).
    lm_graph_init(&t->graph, (Device)c->train.device,
                  c->train.cuda_graph != CFG_GRAPH_OFF && !config_cuda_graph_refusal(c) && t->ranks == 1);
    // The optimizer's step on the GPU: the same work with graphs on or off (so the same bits), a graph of it with them.
    if (t->ranks == 1 && optim_device_supported((Device)c->train.device))
        optim_device_init(&t->ostep, (Device)c->train.device, t->graph.g != NULL);
    size_t bt = (size_t)c->data.batch_size * c->data.seq_len;
    t->x = xmalloc(bt * sizeof(int));
    t->y = xmalloc(bt * sizeof(int));
    t->doc = xcalloc(bt, sizeof(int));
    t->val_bytes_per_token =   // over whole validation batches, the same on every rank
        t->has_val ? model_val_bytes_per_token(&t->bt, &t->tok, c->train.eval_batches, t->x, t->y) : 1.0;
    int64_t lo, hi;
    dist_share(c->data.batch_size, t->rank, t->ranks, &lo, &hi);
    batcher_set_share(&t->bt, (int)lo, (int)hi);
    if (c->train.carry_state) {
        bool any = false;
        for (int l = 0; l < t->lm.cfg.n_layers; l++) any |= t->lm.blocks[l].mixer->kind->forward_carry != NULL;
        if (!any)
            return status_err("[train] carry_state: no layer of this model carries a state (linear, mamba, mamba2, "
                              "gdn, gdp and kda do; attention keeps its within-window behaviour)");
        t->carry = lm_cache_new_on(&t->lm, (int)(hi - lo), 1, (Device)c->train.device);
    }

    if (o->resume) {
        CheckpointState st = {0};
        s = checkpoint_load(t->ckpt, &t->ps, &t->opt, &st);
        if (!s.ok) return status_err("--resume: %s", s.msg);
        free(st.config_text);
        if (st.step > c->train.steps)
            return status_err("--resume: %s is at step %lld, past [train] steps = %d: nothing to resume (raise it "
                              "with --set train.steps=N to train on)",
                              t->ckpt, (long long)st.step, c->train.steps);
        if (t->carry) {
            int64_t row = trainer_carry_row(t);
            double *full = xmalloc((size_t)c->data.batch_size * row * sizeof *full);
            s = checkpoint_load_carry(t->ckpt, full, c->data.batch_size, row);
            if (s.ok) trainer_carry_copy(t, full, false);
            free(full);
            if (!s.ok) return status_err("--resume: %s", s.msg);
        }
        t->step = t->saved_step = st.step;
        t->bt.state = st.sampler;
        t->model_rng = st.model_rng;
    }
    t->first_step = t->step;
    if (c->train.device != DEVICE_CPU) {   // everything is loaded on the host: now the values move
        params_to_device(&t->ps, (Device)c->train.device);
        optim_to_device(&t->opt, (Device)c->train.device);
    }
    return status_ok();
}

// Last (rank 0): the run folder (locked, and refused when it holds another run).
static Status setup_run_dir(Trainer *t, const TrainerOptions *o) {
    Status s = run_dir_open(&t->rd, t->run_dir, o->resume ? RUN_RESUME : RUN_FRESH, o->overwrite);
    if (s.ok && o->resume) s = run_dir_trim_logs(&t->rd, t->step);
    if (s.ok && t->rd.restarted) {
        size_t used = strlen(t->notes);
        snprintf(t->notes + used, sizeof t->notes - used,
                 "%s: the run there stopped before its first checkpoint (nothing to --resume): started afresh, its "
                 "logs replaced\n",
                 t->run_dir);
    }
    return s;
}

// Every rank passes every agreement once, failed or not; after one, s.ok is
// the same on every rank, and so is the verdict of each trainer_ranks_same_*:
// the ranks train the same thing, or none opens the run folder.
static Status setup(Trainer *t, const TrainerOptions *o) {
    Status s = setup_config(t, o);
    s = dist_agree(s, "train");
    if (s.ok) s = trainer_ranks_same_config(t, o);   // (before any rank prepares data for its own)
    if (s.ok) s = setup_threads(t, o);
    s = dist_agree(s, "train");
    if (s.ok) s = setup_effective(t);
    if (s.ok && t->rank == 0) s = setup_data(t, o);
    s = dist_agree(s, "train");
    if (s.ok && t->rank != 0) s = setup_data(t, o);
    s = dist_agree(s, "train");
    if (s.ok) s = trainer_ranks_same_data(t);
    if (s.ok) s = setup_model(t, o);
    s = dist_agree(s, "train");
    if (s.ok) s = trainer_ranks_same_start(t);
    if (s.ok) s = setup_gpu_ranks(t, o);
    s = dist_agree(s, "train");
    if (s.ok && !dist_params_agree(t->dg))
        s = status_err("the ranks built different parameters (are they all running the same build of train?)");
    if (s.ok && t->rank == 0) s = setup_run_dir(t, o);
    return dist_agree(s, "train");
}

Status trainer_setup(Trainer *t, const TrainerOptions *o) {
    memset(t, 0, sizeof *t);
    t->rd.lock_fd = -1;
    Status s = setup(t, o);
    if (!s.ok) trainer_free(t);   // a failed setup leaves nothing behind
    return s;
}

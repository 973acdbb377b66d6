// trainer_ranks.c: the start-up comparison of the ranks' settings (trainer_ranks.h).
#include "trainer_ranks.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "dist.h"
#include "h5io.h"

// A growing settings text of "name = value" lines.
typedef struct Text {
    char *s;
    size_t n, cap;
} Text;

static void add(Text *x, const char *name, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void add(Text *x, const char *name, const char *fmt, ...) {
    char value[CONFIG_STR_MAX + 64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(value, sizeof value, fmt, ap);
    va_end(ap);
    for (char *c = value; *c; c++)   // (one line per setting)
        if (*c == '\n') *c = ' ';
    size_t need = strlen(name) + strlen(value) + 5;
    if (x->n + need > x->cap) {
        x->cap = 2 * (x->n + need);
        x->s = xrealloc(x->s, x->cap);
    }
    x->n += (size_t)snprintf(x->s + x->n, x->cap - x->n, "%s = %s\n", name, value);
}

static bool may_differ(const char *name) {
    const char *list = TRAINER_RANK_KEYS;
    size_t n = strlen(name);
    for (const char *p = strstr(list, name); p; p = strstr(p + 1, name))
        if ((p == list || p[-1] == ' ') && (p[n] == ',' || p[n] == 0)) return true;
    return false;
}

static Status compare(Text *x, const char *what) {
    Status s = dist_same_settings(x->s ? x->s : "", what);
    free(x->s);
    return s;
}

Status trainer_ranks_same_config(const Trainer *t, const TrainerOptions *o) {
    if (dist_size() == 1) return status_ok();
    Text x = {0};
    add(&x, "build", "%s", REAL_NAME);
    add(&x, "--resume", "%s", o->resume ? "given" : "not given");
    for (int i = 0; i < config_n_keys(); i++) {
        ConfigKeyRef k = config_key_ref(i);
        char name[128], value[CONFIG_STR_MAX + 64];
        snprintf(name, sizeof name, "%s.%s", k.section, k.key);
        if (may_differ(name)) continue;
        config_format_key(&t->cfg, i, value, sizeof value);
        add(&x, name, "%s", value);
    }
    return compare(&x, "configs");
}

Status trainer_ranks_same_data(const Trainer *t) {
    if (dist_size() == 1) return status_ok();
    Text x = {0};
    char tk[64];
    add(&x, "tokenizer", "%s (%d ids, hash %016llx)", tokenizer_describe(&t->tok, tk, sizeof tk), t->tok.vocab,
        (unsigned long long)t->tok.hash);
    const TokenData *d = &t->tokens;
    add(&x, "the corpus's tokens", "%lld (CRC-32 %08x)", (long long)d->n,
        h5io_crc32(d->tokens, (size_t)d->n * sizeof *d->tokens));
    add(&x, "documents", "%lld (CRC-32 %08x)", (long long)d->n_docs,
        d->n_docs ? h5io_crc32(d->doc_starts, (size_t)d->n_docs * sizeof *d->doc_starts) : 0u);
    Status s = compare(&x, "data");
    if (!s.ok)
        s = status_err("%s. Their configs agree: does the same path hold different files on their machines ([data] "
                       "corpus, tokenizer)?",
                       s.msg);
    return s;
}

Status trainer_ranks_same_start(const Trainer *t) {
    if (dist_size() == 1) return status_ok();
    Text x = {0};
    uint64_t w[SAMPLER_STATE_WORDS];
    sampler_state_pack(&t->bt.state, w);
    add(&x, "step", "%lld", (long long)t->step);
    add(&x, "sampler state", "%016llx %016llx %016llx %016llx %llu", (unsigned long long)w[0],
        (unsigned long long)w[1], (unsigned long long)w[2], (unsigned long long)w[3], (unsigned long long)w[4]);
    add(&x, "model random state", "%016llx %016llx %016llx %016llx", (unsigned long long)t->model_rng.s[0],
        (unsigned long long)t->model_rng.s[1], (unsigned long long)t->model_rng.s[2],
        (unsigned long long)t->model_rng.s[3]);
    Status s = compare(&x, "starting points");
    if (!s.ok) s = status_err("%s (did --resume read different checkpoints on their machines?)", s.msg);
    return s;
}

#include "mixer.h"

#include <stdlib.h>
#include <string.h>

// One line per mixer kind (each defined in its own file).
extern const MixerKind MIXER_ATTN;       // attn.c
extern const MixerKind MIXER_LINEAR;     // linear.c
extern const MixerKind MIXER_MAMBA;      // mamba.c
extern const MixerKind MIXER_GDN;        // gdn.c
extern const MixerKind MIXER_ATTN_DSA;   // attn_dsa.c
extern const MixerKind MIXER_MAMBA2;     // mamba.c
extern const MixerKind MIXER_GDP;        // gdn.c
extern const MixerKind MIXER_KDA;        // kda.c
static const MixerKind *const KINDS[] = {
    &MIXER_ATTN, &MIXER_LINEAR, &MIXER_MAMBA, &MIXER_GDN, &MIXER_ATTN_DSA, &MIXER_MAMBA2, &MIXER_GDP, &MIXER_KDA,
};

static const char *const FORM_NAMES[MIXER_FORM_COUNT] = {"chunked", "parallel", "recurrent"};

const char *mixer_form_name(MixerForm f) { return f >= 0 && f < MIXER_FORM_COUNT ? FORM_NAMES[f] : "?"; }

int mixer_form_parse(const char *s) {
    for (int i = 0; i < MIXER_FORM_COUNT; i++)
        if (strcmp(s, FORM_NAMES[i]) == 0) return i;
    return -1;
}

MixerConfig mixer_config_default(int d_model, int n_heads, int d_k, int d_v) {
    MixerConfig c;
    memset(&c, 0, sizeof c);
    c.d_model = d_model;
    c.n_heads = n_heads;
    c.d_k = d_k;
    c.d_v = d_v;
    c.chunk_size = 64;
    c.conv_size = 4;
    c.form = MIXER_FORM_CHUNKED;
    c.rope_base = 10000.0;
    c.norm_eps = 1e-6;
    c.out_std = 0.02;
    c.index_heads = 4;
    c.index_dim = 32;
    c.topk = 64;
    c.gdp_steps = 2;
    c.kda_gate_bias = true;
    return c;
}

// Kinds defined outside the library (mixer_kind_register).
#define MAX_EXTRA_KINDS 16
static const MixerKind *extra_kinds[MAX_EXTRA_KINDS];
static int n_extra_kinds;

const MixerKind *mixer_kind_find(const char *name) {
    for (size_t i = 0; i < sizeof KINDS / sizeof KINDS[0]; i++)
        if (KINDS[i] && strcmp(KINDS[i]->name, name) == 0) return KINDS[i];
    for (int i = 0; i < n_extra_kinds; i++)
        if (strcmp(extra_kinds[i]->name, name) == 0) return extra_kinds[i];
    return NULL;
}

void mixer_kind_register(const MixerKind *k) {
    ASSERT(k && k->name && k->create && k->forward && k->cache_new && k->cache_free && k->step && k->cache_reset,
           "mixer_kind_register: a kind needs a name, create, forward, cache_new, cache_free, step and cache_reset");
    ASSERT(strlen(k->name) < 16, "mixer_kind_register: name '%s' is longer than 15 characters", k->name);
    ASSERT(!mixer_kind_find(k->name), "mixer_kind_register: a mixer named '%s' exists already", k->name);
    ASSERT(n_extra_kinds < MAX_EXTRA_KINDS, "mixer_kind_register: more than %d added kinds", MAX_EXTRA_KINDS);
    extra_kinds[n_extra_kinds++] = k;
}

const char *mixer_kind_names(void) {
    static char buf[512];
    buf[0] = 0;
    int n = (int)(sizeof KINDS / sizeof KINDS[0]);
    for (int i = 0; i < n + n_extra_kinds; i++) {
        const MixerKind *k = i < n ? KINDS[i] : extra_kinds[i - n];
        if (!k) continue;
        if (buf[0]) strncat(buf, ", ", sizeof buf - strlen(buf) - 1);
        strncat(buf, k->name, sizeof buf - strlen(buf) - 1);
    }
    return buf;
}

const char *mixer_config_check(const char *kind, const MixerConfig *c, char *why, size_t n) {
    const MixerKind *k = mixer_kind_find(kind);
    if (!k) {
        snprintf(why, n, "unknown mixer '%s' (known: %s)", kind, mixer_kind_names());
        return "layers";
    }
    const struct { const char *key; int value; } dims[] = {
        {"d_model", c->d_model}, {"n_heads", c->n_heads}, {"d_k", c->d_k}, {"d_v", c->d_v},
        {"chunk_size", c->chunk_size}};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
        if (dims[i].value <= 0) {
            snprintf(why, n, "%s: %s = %d must be positive", kind, dims[i].key, dims[i].value);
            return dims[i].key;
        }
    if (c->conv_size < 0) {
        snprintf(why, n, "%s: conv_size = %d must be 0 or more", kind, c->conv_size);
        return "conv_size";
    }
    if (c->form < 0 || c->form >= MIXER_FORM_COUNT) {
        snprintf(why, n, "%s: unknown form %d", kind, (int)c->form);
        return "form";
    }
    if (k->forms && !(k->forms & (1u << c->form))) {
        char list[64] = "";
        for (int f = 0; f < MIXER_FORM_COUNT; f++)
            if (k->forms & (1u << f))
                snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", list[0] ? ", " : "",
                         mixer_form_name((MixerForm)f));
        snprintf(why, n, "%s has no '%s' form (it has: %s)", kind, mixer_form_name(c->form), list);
        return "form";
    }
    return k->check ? k->check(c, why, n) : NULL;
}

Mixer *mixer_create(const char *kind, const MixerConfig *cfg, ParamStore *ps, const char *prefix) {
    const MixerKind *k = mixer_kind_find(kind);
    char why[256];
    const char *key = mixer_config_check(kind, cfg, why, sizeof why);
    ASSERT(!key, "mixer_create: [model] %s: %s", key, why);
    Mixer *m = xcalloc(1, sizeof *m);
    m->kind = k;
    m->cfg = *cfg;
    k->create(m, ps, prefix);
    return m;
}

void mixer_destroy(Mixer *m) {
    if (!m) return;
    if (m->kind->destroy) m->kind->destroy(m);
    free(m);
}

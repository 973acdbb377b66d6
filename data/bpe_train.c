// bpe_train.c: the BPE trainer (bpe_train.h states the rule it implements).
//
// State: the unique pieces ("words") as arrays of token ids with their
// frequencies; for every adjacent pair of ids its count, the words it occurs
// in (a list that may hold words where it no longer occurs: checked on use)
// and its place in a max-heap ordered by (count desc, a asc, b asc). A merge
// visits the words of its pair only: it takes away the word's pair counts,
// rewrites the word, adds the new ones, then re-sorts the pairs it touched.
#define _GNU_SOURCE   // memmem
#include "bpe_train.h"

#include <stdlib.h>
#include <string.h>

#include "bpe_impl.h"

typedef struct BpeTrainer {
    // words: unique pieces
    int64_t n_words, cap_words;
    int64_t *w_text;      // (n_words) where the piece first occurs in the corpus
    int32_t *w_bytes;     // (n_words) its length in bytes
    int64_t *w_start;     // (n_words) its ids start at sym + w_start
    int32_t *w_len;       // (n_words) how many ids it has now
    int64_t *w_freq;      // (n_words)
    int32_t *w_stamp;     // (n_words) the last merge that visited it
    int32_t *sym;
    int64_t n_sym, cap_sym;
    uint32_t *w_table;    // piece bytes -> word + 1
    uint64_t w_mask;
    // tokens: 0..255 the bytes, then the merges
    int n_tok, cap_tok;
    int64_t *t_off;
    int32_t *t_len;
    uint8_t *t_blob;
    int64_t t_blob_n, t_blob_cap;
    uint32_t *t_table;    // token bytes -> id + 1
    uint32_t t_mask;
    // pairs
    int n_pairs, cap_pairs;
    int32_t *pa, *pb;     // (n_pairs) the two ids
    int64_t *cnt;         // (n_pairs) occurrences, weighted by word frequency
    int64_t *pending;     // (n_pairs) change of cnt within the current merge, not yet in the heap
    int32_t *hpos;        // (n_pairs) index in heap
    int32_t **occ;        // (n_pairs) words that held the pair when it was counted
    int32_t *occ_n, *occ_cap, *occ_last;
    int32_t *touch;       // (n_pairs) the last merge that changed its count
    uint32_t *p_table;    // (a, b) -> pair + 1
    uint32_t p_mask;
    int32_t *heap;        // (n_pairs) max-heap of pairs
    int32_t *touched;     // pairs changed by the current merge
    int n_touched, cap_touched;
    int merge_no;
    const uint8_t *text;
} BpeTrainer;

// ---------------------------------------------------------------- words

static void words_grow_table(BpeTrainer *t) {
    uint64_t size = t->w_mask ? 2 * (t->w_mask + 1) : 1 << 16;
    free(t->w_table);
    t->w_table = xcalloc(size, sizeof *t->w_table);
    t->w_mask = size - 1;
    for (int64_t w = 0; w < t->n_words; w++) {
        uint64_t i = bpe_bytes_hash(t->text + t->w_text[w], t->w_bytes[w]) & t->w_mask;
        while (t->w_table[i]) i = (i + 1) & t->w_mask;
        t->w_table[i] = (uint32_t)w + 1;
    }
}

static void words_add(BpeTrainer *t, int64_t at, int len) {
    const uint8_t *p = t->text + at;
    uint64_t i = bpe_bytes_hash(p, len) & t->w_mask;
    for (uint32_t w; (w = t->w_table[i]) != 0; i = (i + 1) & t->w_mask) {
        w--;
        if (t->w_bytes[w] == len && memcmp(t->text + t->w_text[w], p, (size_t)len) == 0) {
            t->w_freq[w]++;
            return;
        }
    }
    ASSERT(t->n_words < UINT32_MAX - 1, "bpe_train: more than 2^32 distinct pieces");
    if (t->n_words == t->cap_words) {
        t->cap_words = t->cap_words ? 2 * t->cap_words : 1 << 14;
        t->w_text = xrealloc(t->w_text, (size_t)t->cap_words * sizeof *t->w_text);
        t->w_bytes = xrealloc(t->w_bytes, (size_t)t->cap_words * sizeof *t->w_bytes);
        t->w_freq = xrealloc(t->w_freq, (size_t)t->cap_words * sizeof *t->w_freq);
    }
    int64_t w = t->n_words++;
    t->w_text[w] = at, t->w_bytes[w] = len, t->w_freq[w] = 1;
    t->w_table[i] = (uint32_t)w + 1;
    if ((uint64_t)t->n_words * 2 > t->w_mask) words_grow_table(t);
}

// ---------------------------------------------------------------- tokens

static int token_find(const BpeTrainer *t, const uint8_t *p, int len) {
    uint32_t i = (uint32_t)bpe_bytes_hash(p, len) & t->t_mask;
    for (uint32_t id; (id = t->t_table[i]) != 0; i = (i + 1) & t->t_mask) {
        id--;
        if (t->t_len[id] == len && memcmp(t->t_blob + t->t_off[id], p, (size_t)len) == 0) return (int)id;
    }
    return -1;
}

static int token_add(BpeTrainer *t, const uint8_t *p, int len) {
    if (t->t_blob_n + len > t->t_blob_cap) {
        t->t_blob_cap = 2 * t->t_blob_cap + len;
        t->t_blob = xrealloc(t->t_blob, (size_t)t->t_blob_cap);
    }
    int id = t->n_tok++;
    t->t_off[id] = t->t_blob_n, t->t_len[id] = len;
    memcpy(t->t_blob + t->t_blob_n, p, (size_t)len);
    t->t_blob_n += len;
    uint32_t i = (uint32_t)bpe_bytes_hash(p, len) & t->t_mask;
    while (t->t_table[i]) i = (i + 1) & t->t_mask;
    t->t_table[i] = (uint32_t)id + 1;
    return id;
}

// ---------------------------------------------------------------- pairs and the heap

static inline bool pair_better(const BpeTrainer *t, int p, int q) {
    if (t->cnt[p] != t->cnt[q]) return t->cnt[p] > t->cnt[q];
    if (t->pa[p] != t->pa[q]) return t->pa[p] < t->pa[q];
    return t->pb[p] < t->pb[q];
}

static void heap_set(BpeTrainer *t, int i, int p) {
    t->heap[i] = p;
    t->hpos[p] = i;
}

static void heap_sift_up(BpeTrainer *t, int i) {
    int p = t->heap[i];
    for (; i > 0 && pair_better(t, p, t->heap[(i - 1) / 2]); i = (i - 1) / 2) heap_set(t, i, t->heap[(i - 1) / 2]);
    heap_set(t, i, p);
}

static void heap_sift_down(BpeTrainer *t, int i) {
    int p = t->heap[i];
    for (;;) {
        int c = 2 * i + 1;
        if (c >= t->n_pairs) break;
        if (c + 1 < t->n_pairs && pair_better(t, t->heap[c + 1], t->heap[c])) c++;
        if (!pair_better(t, t->heap[c], p)) break;
        heap_set(t, i, t->heap[c]);
        i = c;
    }
    heap_set(t, i, p);
}

static uint32_t pair_slot(const BpeTrainer *t, int a, int b) {
    uint64_t k = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    k *= 0x9E3779B97F4A7C15ull;
    return (uint32_t)(k >> 32) & t->p_mask;
}

static void pairs_grow(BpeTrainer *t) {
    int cap = t->cap_pairs ? 2 * t->cap_pairs : 1 << 16;
    t->pa = xrealloc(t->pa, (size_t)cap * sizeof *t->pa);
    t->pb = xrealloc(t->pb, (size_t)cap * sizeof *t->pb);
    t->cnt = xrealloc(t->cnt, (size_t)cap * sizeof *t->cnt);
    t->pending = xrealloc(t->pending, (size_t)cap * sizeof *t->pending);
    t->hpos = xrealloc(t->hpos, (size_t)cap * sizeof *t->hpos);
    t->occ = xrealloc(t->occ, (size_t)cap * sizeof *t->occ);
    t->occ_n = xrealloc(t->occ_n, (size_t)cap * sizeof *t->occ_n);
    t->occ_cap = xrealloc(t->occ_cap, (size_t)cap * sizeof *t->occ_cap);
    t->occ_last = xrealloc(t->occ_last, (size_t)cap * sizeof *t->occ_last);
    t->touch = xrealloc(t->touch, (size_t)cap * sizeof *t->touch);
    t->heap = xrealloc(t->heap, (size_t)cap * sizeof *t->heap);
    t->cap_pairs = cap;
    free(t->p_table);   // keep the table at most half full
    t->p_table = xcalloc(2 * (size_t)cap, sizeof *t->p_table);
    t->p_mask = 2 * (uint32_t)cap - 1;
    for (int p = 0; p < t->n_pairs; p++) {
        uint32_t i = pair_slot(t, t->pa[p], t->pb[p]);
        while (t->p_table[i]) i = (i + 1) & t->p_mask;
        t->p_table[i] = (uint32_t)p + 1;
    }
}

// Add delta to the count of (a, b) as seen in word w (creating the pair).
static void pair_add(BpeTrainer *t, int a, int b, int64_t delta, int32_t w) {
    if (t->t_len[a] + t->t_len[b] > BPE_TOKEN_MAX) return;   // never merged, so never counted
    uint32_t i = pair_slot(t, a, b);
    int p = -1;
    for (uint32_t q; (q = t->p_table[i]) != 0; i = (i + 1) & t->p_mask)
        if (t->pa[q - 1] == a && t->pb[q - 1] == b) {
            p = (int)q - 1;
            break;
        }
    if (p < 0) {
        ASSERT(delta > 0, "bpe_train: pair (%d, %d) loses a count it never had", a, b);
        if (t->n_pairs == t->cap_pairs) {
            pairs_grow(t);
            i = pair_slot(t, a, b);
            while (t->p_table[i]) i = (i + 1) & t->p_mask;
        }
        p = t->n_pairs++;
        t->p_table[i] = (uint32_t)p + 1;
        t->pa[p] = a, t->pb[p] = b, t->cnt[p] = 0, t->pending[p] = 0;
        t->occ[p] = NULL, t->occ_n[p] = t->occ_cap[p] = 0, t->occ_last[p] = -1, t->touch[p] = -1;
        heap_set(t, p, p);   // at the end of the heap with count 0 (init_words heapifies at its end)
        if (t->merge_no >= 0) heap_sift_up(t, p);
    }
    // While merging, counts change only in fix_touched, one at a time, so the
    // heap is whole before each sift (sifting several changed keys in one pass
    // can leave a key above a larger one).
    if (t->merge_no < 0) t->cnt[p] += delta;
    else t->pending[p] += delta;
    if (delta > 0 && t->occ_last[p] != w) {
        if (t->occ_n[p] == t->occ_cap[p]) {
            t->occ_cap[p] = t->occ_cap[p] ? 2 * t->occ_cap[p] : 2;
            t->occ[p] = xrealloc(t->occ[p], (size_t)t->occ_cap[p] * sizeof **t->occ);
        }
        t->occ[p][t->occ_n[p]++] = w;
        t->occ_last[p] = w;
    }
    if (t->touch[p] != t->merge_no) {
        t->touch[p] = t->merge_no;
        if (t->n_touched == t->cap_touched) {
            t->cap_touched = t->cap_touched ? 2 * t->cap_touched : 1024;
            t->touched = xrealloc(t->touched, (size_t)t->cap_touched * sizeof *t->touched);
        }
        t->touched[t->n_touched++] = p;
    }
}

static void word_pairs(BpeTrainer *t, int32_t w, int64_t sign) {
    const int32_t *s = t->sym + t->w_start[w];
    for (int i = 0; i + 1 < t->w_len[w]; i++) pair_add(t, s[i], s[i + 1], sign * t->w_freq[w], w);
}

static void fix_touched(BpeTrainer *t) {
    for (int k = 0; k < t->n_touched; k++) {
        int p = t->touched[k];
        if (t->pending[p] == 0) continue;
        t->cnt[p] += t->pending[p];
        t->pending[p] = 0;
        heap_sift_up(t, t->hpos[p]);
        heap_sift_down(t, t->hpos[p]);
    }
    t->n_touched = 0;
}

// ---------------------------------------------------------------- the steps

static Status count_pieces(BpeTrainer *t, const BpeSplit *split, int64_t n, const BpeTrainOpts *o, BpeTrainStats *st) {
    int64_t pos = 0, last_report = -1;
    BpeSplitIter it;
    while (pos < n) {
        int64_t end = n, len_sp = 0;   // the next special token's text cuts the corpus
        for (int i = 0; i < o->n_specials; i++) {
            size_t l = strlen(o->specials[i]);
            const uint8_t *f = memmem(t->text + pos, (size_t)(end - pos), o->specials[i], l);
            if (f && f - t->text < end) end = f - t->text, len_sp = (int64_t)l;
        }
        bpe_split_begin(&it, split, t->text + pos, end - pos);
        for (int64_t s, e; bpe_split_next(&it, &s, &e);) {
            ASSERT(e - s < INT32_MAX, "bpe_train: a piece of %lld bytes", (long long)(e - s));
            words_add(t, pos + s, (int)(e - s));
            st->pieces++;
            if (o->progress && (pos + e) * 200 / n != last_report) {
                last_report = (pos + e) * 200 / n;
                o->progress(o->progress_ctx, "split", pos + e, n);
            }
        }
        Status sp = bpe_split_status(&it, pos);
        bpe_split_end(&it);
        if (!sp.ok) return status_err("corpus: %s", sp.msg);
        pos = end + len_sp;
    }
    st->unique_pieces = t->n_words;
    return status_ok();
}

static void init_words(BpeTrainer *t) {
    t->w_start = xmalloc((size_t)t->n_words * sizeof *t->w_start + 1);
    t->w_len = xmalloc((size_t)t->n_words * sizeof *t->w_len + 1);
    t->w_stamp = xmalloc((size_t)t->n_words * sizeof *t->w_stamp + 1);
    int64_t total = 0;
    for (int64_t w = 0; w < t->n_words; w++) total += t->w_bytes[w];
    t->sym = xmalloc((size_t)total * sizeof *t->sym + 1);
    for (int64_t w = 0, o = 0; w < t->n_words; w++) {
        t->w_start[w] = o, t->w_len[w] = t->w_bytes[w], t->w_stamp[w] = -1;
        for (int i = 0; i < t->w_bytes[w]; i++) t->sym[o++] = t->text[t->w_text[w] + i];
    }
    t->merge_no = -1;
    for (int64_t w = 0; w < t->n_words; w++) word_pairs(t, (int32_t)w, +1);
    for (int i = t->n_pairs / 2 - 1; i >= 0; i--) heap_sift_down(t, i);
    t->n_touched = 0;
}

// One merge: false when no pair is left.
static bool merge_best(BpeTrainer *t, BpeTrainStats *st) {
    if (t->n_pairs == 0 || t->cnt[t->heap[0]] <= 0) return false;
    int top = t->heap[0], a = t->pa[top], b = t->pb[top];
    uint8_t bytes[2 * BPE_TOKEN_MAX];
    int la = t->t_len[a], lb = t->t_len[b];
    memcpy(bytes, t->t_blob + t->t_off[a], (size_t)la);
    memcpy(bytes + la, t->t_blob + t->t_off[b], (size_t)lb);
    int id = token_find(t, bytes, la + lb);
    if (id >= 0) st->same_bytes_merges++;
    else id = token_add(t, bytes, la + lb);
    t->merge_no++;
    int32_t *list = t->occ[top];
    int n_list = t->occ_n[top];
    t->occ[top] = NULL, t->occ_n[top] = t->occ_cap[top] = 0, t->occ_last[top] = -1;
    for (int k = 0; k < n_list; k++) {
        int32_t w = list[k];
        if (t->w_stamp[w] == t->merge_no) continue;
        t->w_stamp[w] = t->merge_no;
        int32_t *s = t->sym + t->w_start[w];
        int len = t->w_len[w], i = 0;
        while (i + 1 < len && !(s[i] == a && s[i + 1] == b)) i++;
        if (i + 1 >= len) continue;   // the pair left this word in an earlier merge
        word_pairs(t, w, -1);
        int o = 0;
        for (i = 0; i < len;) {
            if (i + 1 < len && s[i] == a && s[i + 1] == b) s[o++] = id, i += 2;
            else s[o++] = s[i++];
        }
        t->w_len[w] = o;
        word_pairs(t, w, +1);
    }
    free(list);
    fix_touched(t);
    ASSERT(t->cnt[top] == 0, "bpe_train: pair (%d, %d) still counts %lld after its merge", a, b, (long long)t->cnt[top]);
    return true;
}

static void bpe_trainer_free(BpeTrainer *t) {
    free(t->w_text), free(t->w_bytes), free(t->w_start), free(t->w_len), free(t->w_freq), free(t->w_stamp);
    free(t->sym), free(t->w_table);
    free(t->t_off), free(t->t_len), free(t->t_blob), free(t->t_table);
    for (int p = 0; p < t->n_pairs; p++) free(t->occ[p]);
    free(t->pa), free(t->pb), free(t->cnt), free(t->pending), free(t->hpos), free(t->occ), free(t->occ_n), free(t->occ_cap);
    free(t->occ_last), free(t->touch), free(t->p_table), free(t->heap), free(t->touched);
}

static Status check_opts(const BpeTrainOpts *o) {
    if (o->n_specials < 0 || o->n_specials > BPE_SPECIALS_MAX)
        return status_err("%d special tokens (0 to %d)", o->n_specials, BPE_SPECIALS_MAX);
    if (o->vocab < 256 + o->n_specials || o->vocab > BPE_VOCAB_MAX)
        return status_err("vocabulary %d: must be in [%d, %d] (256 bytes + %d special tokens at least)", o->vocab,
                          256 + o->n_specials, BPE_VOCAB_MAX, o->n_specials);
    for (int i = 0; i < o->n_specials; i++) {
        size_t l = strlen(o->specials[i]);
        if (l == 0 || l > BPE_TOKEN_MAX || strpbrk(o->specials[i], "\r\n"))
            return status_err("special token '%s': 1 to %d bytes, no line break", o->specials[i], BPE_TOKEN_MAX);
        for (int k = 0; k < i; k++)
            if (strcmp(o->specials[k], o->specials[i]) == 0)
                return status_err("special token '%s' given twice", o->specials[i]);
    }
    return status_ok();
}

Status bpe_train(const uint8_t *text, int64_t n, const BpeTrainOpts *o, uint8_t **file, size_t *len,
                 BpeTrainStats *stats) {
    BpeTrainStats st0 = {0}, *st = stats ? stats : &st0;
    *st = st0;
    Status s = check_opts(o);
    if (!s.ok) return s;
    const char *pattern = o->pattern ? o->pattern : bpe_pattern_named("cl100k_base");
    BpeSplit *split = bpe_split_new(pattern, &s);
    if (!split) return s;
    BpeTrainer t = {.text = text};
    words_grow_table(&t);
    s = count_pieces(&t, split, n, o, st);
    bpe_split_free(split);
    if (!s.ok) {
        bpe_trainer_free(&t);
        return s;
    }
    t.cap_tok = o->vocab;
    t.t_off = xmalloc((size_t)t.cap_tok * sizeof *t.t_off);
    t.t_len = xmalloc((size_t)t.cap_tok * sizeof *t.t_len);
    uint32_t tsize = 1024;
    while (tsize < 2u * (uint32_t)t.cap_tok) tsize *= 2;
    t.t_table = xcalloc(tsize, sizeof *t.t_table);
    t.t_mask = tsize - 1;
    for (int c = 0; c < 256; c++) token_add(&t, &(uint8_t){(uint8_t)c}, 1);
    pairs_grow(&t);
    init_words(&t);
    int target = o->vocab - o->n_specials;
    while (t.n_tok < target && merge_best(&t, st))
        if (o->progress && (t.n_tok - 256) % imax(1, (target - 256) / 200) == 0)
            o->progress(o->progress_ctx, "merge", t.n_tok - 256, target - 256);
    if (o->progress) o->progress(o->progress_ctx, "merge", t.n_tok - 256, target - 256);
    st->merges = t.n_tok - 256;
    st->vocab = t.n_tok + o->n_specials;
    // The ranks as a .tiktoken text, then through the loader: its checks and its canonical form.
    size_t cap = (size_t)t.n_tok * 16 + (size_t)t.t_blob_n * 2 + 64, m = 0;
    char *tk = xmalloc(cap);
    for (int id = 0; id < t.n_tok; id++) {
        m += (size_t)bpe_base64_encode(t.t_blob + t.t_off[id], t.t_len[id], tk + m);
        m += (size_t)snprintf(tk + m, cap - m, " %d\n", id);
    }
    BpeSpecial *sp = xmalloc((size_t)o->n_specials * sizeof *sp + 1);
    for (int i = 0; i < o->n_specials; i++) sp[i] = (BpeSpecial){o->specials[i], t.n_tok + i};
    Bpe *b = bpe_from_tiktoken((const uint8_t *)tk, m, "trained tokenizer", pattern, sp, o->n_specials, &s);
    free(tk), free(sp);
    bpe_trainer_free(&t);
    if (!b) return s;
    *file = bpe_to_buffer(b, len);
    bpe_free(b);
    return status_ok();
}

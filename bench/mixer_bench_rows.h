// mixer_bench_rows.h: the rows of mixer_bench (bench/mixer_bench_main.c, its
// only includer): the tables of training and decoding rows, the rows added
// for a mixer kind that -only names and the tables do not, and which rows an
// -only list picks.
#ifndef MIXER_BENCH_ROWS_H
#define MIXER_BENCH_ROWS_H

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mixer.h"

typedef struct TrainRow {
    const char *kind;      // mixer kind name
    const char *label;     // form as shown: "flash", "parallel", ...
    MixerForm form;        // the MixerConfig form
    bool quadratic;        // step time grows as T^2 (per token as T) at fixed B*T
    int max_T;             // skip longer sequences (0: no limit)
    const char *why;       // why
    int gdp_steps;         // gdp: delta-rule steps per token n_h (0: the default, 2)
    const char *name;      // the row's name in tables and -only (NULL: the kind)
} TrainRow;

static const TrainRow TRAIN_ROWS[] = {
    {"attn", "flash", MIXER_FORM_CHUNKED, true, 0, NULL},
    {"linear", "parallel", MIXER_FORM_PARALLEL, true, 4096,
     "T x T scratch per thread: 3 GiB per thread at T = 16384 (> 4 GiB on 2 threads)"},
    {"linear", "chunked", MIXER_FORM_CHUNKED, false, 0, NULL},
    {"linear", "recurrent", MIXER_FORM_RECURRENT, false, 0, NULL},
    {"mamba", "chunked", MIXER_FORM_CHUNKED, false, 0, NULL},
    {"mamba", "recurrent", MIXER_FORM_RECURRENT, false, 0, NULL},
    {"gdn", "chunked", MIXER_FORM_CHUNKED, false, 0, NULL},
    {"gdn", "recurrent", MIXER_FORM_RECURRENT, false, 0, NULL},
    {"attn_dsa", "sparse", MIXER_FORM_CHUNKED, false, 0, NULL},
    {"mamba2", "chunked", MIXER_FORM_CHUNKED, false, 0, NULL},
    {"mamba2", "recurrent", MIXER_FORM_RECURRENT, false, 0, NULL},
    {"gdp", "chunked", MIXER_FORM_CHUNKED, false, 0, NULL},
    {"gdp", "recurrent", MIXER_FORM_RECURRENT, false, 0, NULL},
    {"gdp", "chunked", MIXER_FORM_CHUNKED, false, 0, NULL, 3, "gdp_nh3"},
    {"gdp", "recurrent", MIXER_FORM_RECURRENT, false, 0, NULL, 3, "gdp_nh3"},
};
enum { N_TRAIN_ROWS = sizeof TRAIN_ROWS / sizeof TRAIN_ROWS[0] };

typedef struct DecodeRow {
    const char *kind;
    const char *how;       // how the cache reaches position P
    bool prefill_kv;       // attn: write the KV cache directly instead of stepping
    int gdp_steps;         // as in TrainRow
    const char *name;
} DecodeRow;

static const DecodeRow DECODE_ROWS[] = {
    {"attn", "KV cache filled directly", true},
    {"linear", "stepped", false},
    {"mamba", "stepped", false},
    {"gdn", "stepped", false},
    {"attn_dsa", "stepped", false},
    {"mamba2", "stepped", false},
    {"gdp", "stepped", false},
    {"gdp", "stepped", false, 3, "gdp_nh3"},
};
enum { N_DECODE_ROWS = sizeof DECODE_ROWS / sizeof DECODE_ROWS[0] };

// A row's name (train or decode row): its own, else its mixer kind's.
#define TNAME(row) ((row)->name ? (row)->name : (row)->kind)

// The rows of this run: the tables', then those rows_init adds.
enum { MAX_ROWS = 48 };
static TrainRow train_rows[MAX_ROWS];
static DecodeRow decode_rows[MAX_ROWS];
static int n_train_rows, n_decode_rows;

// Whether the -only item s (up to its ',' or end) picks the row: "name" picks
// every form of the row, "name:form" one (a decode row has no form: label NULL).
static bool item_picks(const char *s, const char *name, const char *label) {
    size_t n = strlen(name), len = strcspn(s, ",");
    if (len < n || strncmp(s, name, n) != 0) return false;
    if (len == n) return true;
    if (s[n] != ':' || !label) return false;
    return len - n - 1 == strlen(label) && strncmp(s + n + 1, label, len - n - 1) == 0;
}

// The -only item after s: past its ',' (the end of the list after the last).
static const char *next_item(const char *s) {
    s += strcspn(s, ",");
    return *s ? s + 1 : s;
}

static bool has_rows(const char *name) {
    for (int i = 0; i < n_train_rows; i++)
        if (strcmp(TNAME(&train_rows[i]), name) == 0) return true;
    for (int i = 0; i < n_decode_rows; i++)
        if (strcmp(TNAME(&decode_rows[i]), name) == 0) return true;
    return false;
}

// The tables' rows, and rows for every mixer kind that the -only list names
// and the tables do not (one added to the library since, say), so that a
// new kind is measured by its name alone.
static void rows_init(const char *only) {
    for (int i = 0; i < N_TRAIN_ROWS; i++) train_rows[n_train_rows++] = TRAIN_ROWS[i];
    for (int i = 0; i < N_DECODE_ROWS; i++) decode_rows[n_decode_rows++] = DECODE_ROWS[i];
    for (const char *s = only; s && *s; s = next_item(s)) {
        char name[32];
        size_t len = strcspn(s, ",:");
        if (len == 0 || len >= sizeof name) continue;   // check_only names it
        memcpy(name, s, len);
        name[len] = 0;
        const MixerKind *k = mixer_kind_find(name);
        if (!k || has_rows(name)) continue;
        ASSERT(n_train_rows + 2 <= MAX_ROWS && n_decode_rows < MAX_ROWS, "mixer_bench: more than %d rows", MAX_ROWS);
        static const MixerForm forms[] = {MIXER_FORM_CHUNKED, MIXER_FORM_RECURRENT};
        static const char *const labels[] = {"chunked", "recurrent"};
        for (int f = 0; f < 2; f++)
            if (!k->forms || (k->forms & (1u << forms[f])))
                train_rows[n_train_rows++] = (TrainRow){k->name, k->forms ? labels[f] : "own", forms[f]};
        if (k->recurrent) decode_rows[n_decode_rows++] = (DecodeRow){k->name, "stepped", false};
    }
}

// Whether the -only list (NULL: every row) picks the row.
static bool rows_picked(const char *only, const char *name, const char *label) {
    if (!only) return true;
    for (const char *s = only; *s; s = next_item(s))
        if (item_picks(s, name, label)) return true;
    return false;
}

// Every -only item must pick a row: a misspelt name would otherwise run nothing, silently.
static void check_only(const char *only) {
    for (const char *s = only; *s; s = next_item(s)) {
        bool any = false;
        for (int i = 0; i < n_train_rows && !any; i++) any = item_picks(s, TNAME(&train_rows[i]), train_rows[i].label);
        for (int i = 0; i < n_decode_rows && !any; i++) any = item_picks(s, TNAME(&decode_rows[i]), NULL);
        if (any) continue;
        fprintf(stderr, "mixer_bench: -only '%.*s' names no row; the rows:", (int)strcspn(s, ","), s);
        for (int i = 0; i < n_train_rows; i++) fprintf(stderr, " %s:%s", TNAME(&train_rows[i]), train_rows[i].label);
        fprintf(stderr, "; or a mixer kind: %s\n", mixer_kind_names());
        exit(2);
    }
}

#endif

// config_schema.h: the key table behind config.c (private to train/).
#ifndef TRAIN_CONFIG_SCHEMA_H
#define TRAIN_CONFIG_SCHEMA_H

#include "config.h"

typedef enum {
    KEY_INT,      // int
    KEY_I64,      // int64_t
    KEY_FLOAT,    // double
    KEY_BOOL,     // bool: true/false, yes/no, on/off, 1/0
    KEY_STRING,   // char[CONFIG_STR_MAX]
    KEY_ENUM,     // int index into `choices`
    KEY_NAMES,    // ConfigNames: comma list of mixer names
    KEY_INTS,     // ConfigInts: comma list of integers (each in [min, max])
    KEY_COUNT
} KeyType;

typedef struct ConfigKey {
    const char *section, *key;
    KeyType type;
    size_t offset;          // into TrainConfig
    const char *def;        // default, as text (parsed by the same code as a file value)
    double min, max;        // numbers, and items of KEY_INTS; KEY_NAMES: min items
    const char *choices;    // KEY_ENUM: "a|b|c", in the order of the C enum
    const char *alias;      // other spellings people write; only used for "did you mean"
    const char *help;
    unsigned flags;         // KEYF_*
} ConfigKey;

// A key `train --resume` may change with --set (how long and how verbosely
// the run goes on); every other key must stay as the run was started.
#define KEYF_RESUMABLE 1u
// A [model] key that defines the function a trained model computes (shapes,
// eps, RoPE base, ...), as opposed to how it is computed (form, chunk_size).
#define KEYF_ARCH 2u

extern const ConfigKey CONFIG_SCHEMA[];
extern const int CONFIG_N_KEYS;

const ConfigKey *schema_find(const char *section, const char *key);
bool schema_section_known(const char *s);
// Hints for unknown names: " (did you mean lr?)", " (it belongs in [data])", ...
void schema_key_hint(const char *section, const char *key, char *out, size_t n);
void schema_section_hint(const char *section, char *out, size_t n);
// Parse `value` for key k into cfg; on failure write the reason into err.
bool schema_set_value(TrainConfig *cfg, const ConfigKey *k, const char *value, char *err, size_t n);
// The value of key k in cfg as the text that schema_set_value reads back.
void schema_format_value(const TrainConfig *cfg, const ConfigKey *k, char *out, size_t n);
// Strip spaces and tabs (and a trailing CR/LF) in place.
char *schema_trim(char *s);

#endif

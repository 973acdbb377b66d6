"""The [model] section of a config stored in a checkpoint or an export, read
as hostile input: the same keys, bounds and messages as the C programs
(train/config_schema.c, train/config.c, model_check in train/model_setup.c,
mixer_config_check in src/layers/mixer.c), so that a file the C side refuses
is refused here, before anything is allocated from it.

Lines are read as the C side's INI reader reads them: "[section]" headers,
"key = value" (or "key: value"), whole-line comments starting with ';' or '#',
an inline comment at a ';' after a blank. Other sections are checked for
their names only: their keys do not change the model.
"""

import math
import re

from attnlab_model import ModelConfig

INT32_MAX = 2 ** 31 - 1                  # MODEL_MAX_TENSOR: elements of one tensor
STR_MAX = 1024                           # CONFIG_STR_MAX: a value is shorter
LINE_MAX = STR_MAX + 64                  # CONFIG_LINE_MAX
MAX_LAYERS = 64                          # CONFIG_MAX_LAYERS
VOCAB_MAX = 1 << 22                      # BPE_VOCAB_MAX: ids are below it
SECTIONS = ("model", "data", "train", "finetune")
MIXERS = ("attn", "linear", "mamba", "gdn", "attn_dsa", "mamba2", "gdp", "kda")
FORMS = ("chunked", "parallel", "recurrent")
MIXER_FORMS = {"linear": FORMS, "mamba": FORMS, "mamba2": FORMS, "gdn": ("chunked", "recurrent"),
               "gdp": ("chunked", "recurrent"), "kda": ("chunked", "recurrent")}   # attn has no forms
GDP_MAX_STEPS = 8
BIG = 1e300

# [model] keys: type, default, min, max (train/config_schema.c).
MODEL_KEYS = {
    "layers": ("names", "attn,gdn", 1, MAX_LAYERS),
    "d_model": ("int", "128", 1, 1 << 16),
    "n_heads": ("int", "4", 1, 1024),
    "d_k": ("int", "32", 1, 4096),
    "d_v": ("int", "32", 1, 4096),
    "d_ff": ("int", "512", 1, 1 << 20),
    "tied_embeddings": ("bool", "true", 0, 0),
    "chunk_size": ("int", "32", 1, 4096),
    "conv_size": ("int", "4", 0, 64),
    "norm_eps": ("float", "1e-6", 0, 1),
    "rope_base": ("float", "10000", 1, BIG),
    "index_heads": ("int", "4", 1, 1024),
    "index_dim": ("int", "16", 1, 4096),
    "topk": ("int", "64", 1, 1 << 24),
    "qk_norm": ("bool", "false", 0, 0),
    "attn_gate": ("bool", "false", 0, 0),
    "gdp_steps": ("int", "2", 1, GDP_MAX_STEPS),
    "kda_gate_bias": ("bool", "true", 0, 0),
    "form": ("enum", "chunked", 0, 0),
}


class ConfigError(ValueError):
    """A config refused: "SOURCE:LINE: [section] key: what is wrong"."""


def g(x):
    """C's %g."""
    return "%g" % x


def in_range(x, lo, hi):
    if lo <= x <= hi:
        return None
    if hi >= BIG:
        return "%.17g is out of range (at least %s)" % (x, g(lo))
    return "%.17g is out of range [%s, %s]" % (x, g(lo), g(hi))


def parse_value(key, value):
    """(parsed value, None) or (None, why) for one [model] key, as schema_set_value."""
    kind, _, lo, hi = MODEL_KEYS[key]
    if len(value) >= STR_MAX:
        return None, "value is longer than %d characters" % (STR_MAX - 1)
    v = value.strip(" \t").rstrip("\r\n \t")
    if kind == "int":
        if not re.fullmatch(r"[ \t]*[+-]?[0-9]+", v):
            return None, "'%s' is not an integer" % v
        x = int(v)
        if abs(x) >= 2 ** 63:
            return None, "'%s' is not an integer" % v
        why = in_range(float(x), lo, hi)
        return (None, why) if why else (x, None)
    if kind == "float":
        try:
            x = float(v) if v and "_" not in v else None
        except ValueError:
            x = None
        if x is None or not math.isfinite(x):
            return None, "'%s' is not a finite number" % v
        why = in_range(x, lo, hi)
        return (None, why) if why else (x, None)
    if kind == "bool":
        low = v.lower()
        if low in ("true", "yes", "on", "1"):
            return True, None
        if low in ("false", "no", "off", "0"):
            return False, None
        return None, "'%s' is not a bool (true/false, yes/no, on/off, 1/0)" % v
    if kind == "enum":
        return (v, None) if v in FORMS else (None, "'%s' is not one of %s" % (v, "|".join(FORMS)))
    names = []
    for i, item in enumerate(v.split(",") if v else []):
        item = item.strip(" \t\r\n")
        if i == MAX_LAYERS:
            return None, "more than %d items" % MAX_LAYERS
        if not item:
            return None, "empty item %d in the list" % (i + 1)
        if item not in MIXERS:
            return None, "'%s' is not a known mixer" % item
        names.append(item)
    if len(names) < lo:
        return None, "needs at least %d item(s)" % lo
    return names, None


def strip_inline_comment(s):
    m = re.search(r"[ \t];", s)
    return s[:m.start()] if m else s


def read_model_section(text, source):
    """{key: (value text, line)} of [model], every line checked as the C reader checks it."""
    section, found = None, {}
    if text.startswith("\ufeff"):   # a UTF-8 byte order mark, which the C reader skips too
        text = text[1:]
    for n, line in enumerate(text.split("\n"), 1):
        where = "%s:%d: " % (source, n)
        if "\r" in line.rstrip("\r"):
            raise ConfigError(where + "carriage return inside a line: the file uses old Mac (CR) line endings or "
                              "holds a stray CR; convert it to LF line endings")
        if len(line) > LINE_MAX:
            raise ConfigError(where + "line longer than %d characters" % LINE_MAX)
        s = line.strip(" \t\r")
        if not s or s[0] in ";#":
            continue
        if s[0] == "[":
            close = s.find("]")
            if close < 0:
                raise ConfigError(where + "syntax error (expected [section] or key = value)")
            section = s[1:close].strip(" \t")
            if section not in SECTIONS:
                raise ConfigError(where + "[%s]: unknown section (sections: [model] [data] [train] [finetune])"
                                  % section)
            continue
        m = re.match(r"([^=:]*)[=:](.*)", s)
        if not m:
            raise ConfigError(where + "syntax error (expected [section] or key = value)")
        key, value = m.group(1).strip(" \t"), strip_inline_comment(m.group(2)).strip(" \t")
        if section is None:
            raise ConfigError(where + "%s: key outside any section (put it under [model], [data], [train] or "
                              "[finetune])" % key)
        if section != "model":
            continue
        if key not in MODEL_KEYS:
            raise ConfigError(where + "[model] %s: unknown key" % key)
        if key in found:
            raise ConfigError(where + "[model] %s: duplicate key (first set on line %d)" % (key, found[key][1]))
        found[key] = (value, n)
    return found


def model_config(text, source, vocab_size):
    """The ModelConfig of INI text, refused as the C programs refuse it (messages name `source`)."""
    found = read_model_section(text, source)
    vals, where = {}, {}
    for key, (_, default, _, _) in MODEL_KEYS.items():
        value, line = found.get(key, (default, 0))
        x, why = parse_value(key, value)
        where[key] = "%s:%d" % (source, line) if line else "default"
        if why:
            raise ConfigError("%s: [model] %s: %s" % (where[key], key, why))
        vals[key] = x

    def refuse(key, why):
        return ConfigError("%s: [model] %s: %s" % (where[key], key, why))

    for i, kind in enumerate(vals["layers"]):
        forms = MIXER_FORMS.get(kind)
        if forms and vals["form"] not in forms:
            raise refuse("form", "layer %d: %s has no '%s' form (it has: %s)" % (i, kind, vals["form"],
                                                                               ", ".join(forms)))
        if kind in ("attn", "attn_dsa") and vals["d_k"] % 2:
            raise refuse("d_k", "layer %d: attention's RoPE rotates pairs of dimensions: d_k = %d must be even"
                         % (i, vals["d_k"]))
    if vals["form"] != "chunked" and not any(k in MIXER_FORMS for k in vals["layers"]):
        raise refuse("form", "form = %s has no effect: none of the layers (%s...) has training forms to choose "
                     "between (only linear, mamba, mamba2, gdn, gdp and kda do); remove the key"
                     % (vals["form"], vals["layers"][0]))
    for key in ("qk_norm", "attn_gate"):
        if vals[key] and not any(k in ("attn", "attn_dsa") for k in vals["layers"]):
            raise refuse(key, "%s = true has no effect: none of the layers (%s...) is attn or attn_dsa; remove the key"
                         % (key, vals["layers"][0]))
    gdp_used = "gdp" in vals["layers"]
    if not gdp_used and vals["gdp_steps"] != 2:
        raise refuse("gdp_steps", "gdp_steps = %d has no effect: none of the layers (%s...) is gdp; remove the key"
                     % (vals["gdp_steps"], vals["layers"][0]))
    if not vals["kda_gate_bias"] and "kda" not in vals["layers"]:
        raise refuse("kda_gate_bias", "kda_gate_bias = false has no effect: none of the layers (%s...) is kda; "
                     "remove the key" % vals["layers"][0])
    D, F, H, V = vals["d_model"], vals["d_ff"], vals["n_heads"], vocab_size
    n = vals["gdp_steps"] if gdp_used else 1   # gdp's wk, wv: n blocks of H*dk, H*dv
    widest = max(D, F, V, n * H * vals["d_k"], n * H * vals["d_v"], vals["index_heads"] * vals["index_dim"])
    if D * F > INT32_MAX or D * widest > INT32_MAX or V * D > INT32_MAX:
        raise refuse("d_model", "a weight of %d x %d elements is more than this build's %d per tensor"
                     % (D, widest, INT32_MAX))
    return ModelConfig(layers=vals["layers"], d_model=D, n_heads=H, d_k=vals["d_k"], d_v=vals["d_v"], d_ff=F,
                       tied_embeddings=vals["tied_embeddings"], chunk_size=vals["chunk_size"],
                       conv_size=vals["conv_size"], norm_eps=vals["norm_eps"], rope_base=vals["rope_base"],
                       vocab_size=V, qk_norm=vals["qk_norm"], attn_gate=vals["attn_gate"],
                       gdp_steps=vals["gdp_steps"], kda_gate_bias=vals["kda_gate_bias"])

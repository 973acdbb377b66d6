// h5io_catalog.c: the parent's side of the sandboxed walk: the stream of
// object records (h5io_walk.h) parsed with every length and count bounded
// before it is used, and the lookups h5io's checks make in it.
#include "h5io_walk.h"

#include <stdlib.h>
#include <string.h>


typedef struct Reader {
    const unsigned char *p;
    size_t n, at;
} Reader;

static bool take(Reader *r, void *dst, size_t n) {
    if (n > r->n - r->at) return false;
    if (dst) memcpy(dst, r->p + r->at, n);
    r->at += n;
    return true;
}

// n bytes as a fresh NUL-terminated string, or NULL.
static char *take_string(Reader *r, size_t n) {
    if (n > r->n - r->at) return NULL;
    char *s = malloc(n + 1);
    if (!s) return NULL;
    memcpy(s, r->p + r->at, n);
    s[n] = 0;
    r->at += n;
    return s;
}

static bool parse_attrs(Reader *r, H5ioEntry *e) {
    if (e->o.n_attrs == 0) return true;
    e->attrs = calloc(e->o.n_attrs, sizeof *e->attrs);
    if (!e->attrs) return false;
    for (uint32_t i = 0; i < e->o.n_attrs; i++) {
        H5ioAttr *a = &e->attrs[i];
        if (!take(r, &a->h, sizeof a->h) || a->h.name_len == 0 || a->h.name_len > H5IO_NAME_MAX ||
            a->h.value_len > H5IO_ATTR_VALUE_MAX || a->h.state > H5IO_ATTR_OTHER ||
            (a->h.value_len && a->h.value_len != a->h.size))
            return false;
        if (!(a->name = take_string(r, a->h.name_len)) || strlen(a->name) != a->h.name_len) return false;
        if (!(a->value = take_string(r, a->h.value_len))) return false;
    }
    return true;
}

// One record; false if it breaks any bound.
static bool parse_entry(Reader *r, H5ioEntry *e) {
    H5ioObj *o = &e->o;
    if (!take(r, o, sizeof *o)) return false;
    if (o->kind >= H5IO_OBJ_COUNT || o->type < -1 || o->type >= H5IO_TYPE_COUNT || o->space > H5IO_SPACE_OTHER ||
        o->rank < -1 || o->rank > H5IO_MAX_RANK || o->layout > H5IO_LAYOUT_OTHER || o->crc_state > H5IO_CRC_OK ||
        o->name_len == 0 || o->name_len > H5IO_NAME_MAX || o->compact_len > H5IO_COMPACT_MAX ||
        o->n_attrs > H5IO_MAX_ATTRS)
        return false;
    if (!(e->name = take_string(r, o->name_len)) || e->name[0] != '/' || strlen(e->name) != o->name_len) return false;
    if (o->compact_len) {
        if (!(e->compact = malloc(o->compact_len)) || !take(r, e->compact, o->compact_len)) return false;
    }
    return parse_attrs(r, e);
}

void h5io_catalog_free(H5ioCatalog *cat) {
    if (!cat || --cat->refs > 0) return;
    for (int i = 0; i < cat->n; i++) {
        H5ioEntry *e = &cat->e[i];
        for (uint32_t k = 0; e->attrs && k < e->o.n_attrs; k++) {
            free(e->attrs[k].name);
            free(e->attrs[k].value);
        }
        free(e->attrs);
        free(e->compact);
        free(e->name);
    }
    free(cat->e);
    free(cat);
}

Status h5io_catalog_parse(const unsigned char *buf, size_t len, const char *path, const char *what,
                          H5ioCatalog **out) {
    *out = NULL;
    Reader r = {buf, len, 0};
    uint32_t head[4];
    if (!take(&r, head, sizeof head) || head[0] != H5IO_WALK_MAGIC)
        return status_err("%s: corrupt %s: its HDF5 structure could not be read", path, what);
    switch (head[1]) {
    case H5IO_WALK_OK: break;
    case H5IO_WALK_NOT_HDF5: return status_err("%s: not an HDF5 file (not a %s, or truncated)", path, what);
    case H5IO_WALK_CANNOT_OPEN: return status_err("%s: cannot open the %s as HDF5 (truncated or corrupt?)", path, what);
    case H5IO_WALK_TOO_MANY:
        return status_err("%s: corrupt %s: more than %d objects (not a file this program wrote)", path, what,
                          H5IO_MAX_OBJECTS);
    case H5IO_WALK_NO_MEMORY:
        return status_err("%s: corrupt %s: its HDF5 structure needs more memory than any %s does", path, what, what);
    default: return status_err("%s: corrupt %s: its list of objects cannot be read", path, what);
    }
    if (head[2] == 0 || head[2] > H5IO_MAX_OBJECTS + 1)
        return status_err("%s: corrupt %s: its HDF5 structure could not be read", path, what);
    H5ioCatalog *cat = calloc(1, sizeof *cat);
    if (cat) {
        cat->refs = 1;
        cat->e = calloc(head[2], sizeof *cat->e);
    }
    bool ok = cat && cat->e;
    for (uint32_t i = 0; ok && i < head[2]; i++) {
        ok = parse_entry(&r, &cat->e[i]);
        cat->n = (int)i + 1;   // (freed with what it holds, whole or not)
    }
    uint32_t end = 0;
    ok = ok && take(&r, &end, sizeof end) && end == H5IO_WALK_END && r.at == r.n;
    if (!ok) {
        h5io_catalog_free(cat);
        return status_err("%s: corrupt %s: its HDF5 structure could not be read", path, what);
    }
    *out = cat;
    return status_ok();
}

const H5ioEntry *h5io_catalog_find(const H5ioCatalog *cat, const char *name) {
    for (int i = 0; cat && i < cat->n; i++)
        if (strcmp(cat->e[i].name, name) == 0) return &cat->e[i];
    return NULL;
}

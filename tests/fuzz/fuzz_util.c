#define _GNU_SOURCE   // nftw
#include "fuzz_util.h"

#include <ftw.h>
#include <hdf5_hl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "h5io.h"

unsigned fuzz_u8(FuzzBytes *b) {
    if (!b->n) return 0;
    b->n--;
    return *b->p++;
}

unsigned fuzz_u16(FuzzBytes *b) { return fuzz_u8(b) | fuzz_u8(b) << 8; }

static char scratch[256];

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

static void remove_scratch(void) {
    if (scratch[0]) nftw(scratch, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

const char *fuzz_scratch(void) {
    if (!scratch[0]) {
        const char *base = getenv("TMPDIR");
        snprintf(scratch, sizeof scratch, "%s/attnlab-fuzz-XXXXXX", base && *base ? base : "/tmp");
        if (!mkdtemp(scratch)) abort();
        atexit(remove_scratch);
    }
    return scratch;
}

const char *fuzz_path(const char *name) {
    static char buf[512];
    snprintf(buf, sizeof buf, "%s/%s", fuzz_scratch(), name);
    return buf;
}

void fuzz_write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, n, f) != n || fclose(f) != 0) abort();
}

uint8_t *fuzz_read_file(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) abort();
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *d = malloc((size_t)len + 1);
    if (fread(d, 1, (size_t)len, f) != (size_t)len) abort();
    fclose(f);
    *n = (size_t)len;
    return d;
}

// Replace `name` by a dataset of a fuzzed type, rank, shape and content.
static void replace_dataset(hid_t f, const char *name, FuzzBytes *b) {
    H5ioType type = (H5ioType)(fuzz_u8(b) % H5IO_STRING);
    int rank = 1 + (int)(fuzz_u8(b) % 3);
    hsize_t dims[3];
    size_t numel = 1;
    for (int k = 0; k < rank; k++) {
        dims[k] = fuzz_u8(b) % 24;   // zero sizes included
        numel *= (size_t)dims[k];
    }
    size_t esize = type == H5IO_U8 ? 1 : (type == H5IO_F32 || type == H5IO_I32) ? 4 : 8;
    uint8_t *data = calloc(numel ? numel : 1, esize);
    unsigned fill = fuzz_u8(b);
    for (size_t i = 0; i < numel * esize; i++) data[i] = (uint8_t)(fill * (i + 1) + fuzz_u8(b));
    H5Ldelete(f, name, H5P_DEFAULT);
    if (numel) h5io_write(f, name, type, rank, dims, data);
    else H5LTmake_dataset(f, name, rank, dims, H5T_STD_I32LE, data);
    free(data);
    unsigned crc = fuzz_u8(b) % 3;
    if (crc == 1) H5Adelete_by_name(f, name, "crc32", H5P_DEFAULT);
    if (crc == 2) {
        uint32_t wrong = fuzz_u16(b);
        H5Adelete_by_name(f, name, "crc32", H5P_DEFAULT);
        H5LTset_attribute_uint(f, name, "crc32", &wrong, 1);
    }
}

static void replace_string(hid_t f, const char *name, FuzzBytes *b) {
    size_t len = fuzz_u8(b) % 200;
    char *text = malloc(len + 1);
    for (size_t i = 0; i < len; i++) text[i] = (char)fuzz_u8(b);
    text[len] = 0;
    H5Ldelete(f, name, H5P_DEFAULT);
    if (fuzz_u8(b) & 1) {
        h5io_write_string(f, name, text);
    } else {   // an array of fixed-length strings
        hid_t t = H5Tcopy(H5T_C_S1);
        H5Tset_size(t, 1 + len % 9);
        hsize_t n = 1 + fuzz_u8(b) % 5;
        hid_t sp = H5Screate_simple(1, &n, NULL);
        hid_t d = H5Dcreate2(f, name, t, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        char *buf = calloc(n, 1 + len % 9);
        if (d >= 0) H5Dwrite(d, t, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf);
        free(buf);
        if (d >= 0) H5Dclose(d);
        H5Sclose(sp), H5Tclose(t);
    }
    free(text);
}

// A chunked dataset of a huge or odd extent that was never written.
static void unwritten(hid_t f, const char *name, FuzzBytes *b) {
    int rank = 1 + (int)(fuzz_u8(b) % 2);
    hsize_t dims[2], chunk[2];
    for (int k = 0; k < rank; k++) {
        dims[k] = (hsize_t)1 << (fuzz_u8(b) % 62);
        chunk[k] = 1 + fuzz_u8(b) % 64;
        if (chunk[k] > dims[k]) chunk[k] = dims[k];
    }
    H5Ldelete(f, name, H5P_DEFAULT);
    hid_t sp = H5Screate_simple(rank, dims, NULL);
    hid_t pl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_chunk(pl, rank, chunk);
    hid_t d = sp >= 0 ? H5Dcreate2(f, name, H5T_IEEE_F32LE, sp, H5P_DEFAULT, pl, H5P_DEFAULT) : -1;
    if (d >= 0) H5Dclose(d);
    H5Pclose(pl);
    if (sp >= 0) H5Sclose(sp);
}

typedef struct Flip {
    char name[256];
    unsigned offset, mask;
} Flip;

void fuzz_edit_hdf5(const char *path, FuzzBytes *b, const char *const *targets, int n_targets) {
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    if (f < 0) abort();
    Flip flips[8];
    int n_flips = 0;
    for (int edit = 0; edit < 32 && b->n; edit++) {
        unsigned op = fuzz_u8(b) % 10;
        const char *name = targets[fuzz_u8(b) % (unsigned)n_targets];
        const char *other = targets[fuzz_u8(b) % (unsigned)n_targets];
        switch (op) {
        case 0: H5Ldelete(f, name, H5P_DEFAULT); break;
        case 1: replace_dataset(f, name, b); break;
        case 2:
            if (n_flips < 8) {
                snprintf(flips[n_flips].name, sizeof flips[n_flips].name, "%s", name);
                flips[n_flips].offset = fuzz_u16(b);
                flips[n_flips++].mask = 1u << (fuzz_u8(b) % 8);
            }
            break;
        case 3: replace_string(f, name, b); break;
        case 4: {   // a string attribute "kind" of any length on the object
            char kind[80];
            size_t len = fuzz_u8(b) % sizeof kind;
            for (size_t i = 0; i < len; i++) kind[i] = (char)(1 + fuzz_u8(b) % 255);
            kind[len] = 0;
            H5Adelete_by_name(f, name, "kind", H5P_DEFAULT);
            H5LTset_attribute_string(f, name, "kind", kind);
            break;
        }
        case 5:
            H5Ldelete(f, name, H5P_DEFAULT);
            H5Lcreate_soft(other, f, name, H5P_DEFAULT, H5P_DEFAULT);
            break;
        case 6:
            H5Ldelete(f, name, H5P_DEFAULT);
            H5Lcreate_external(path, other, f, name, H5P_DEFAULT, H5P_DEFAULT);
            break;
        case 7: {
            H5Ldelete(f, name, H5P_DEFAULT);
            hid_t g = H5Gcreate2(f, name, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
            if (g >= 0) H5Gclose(g);
            break;
        }
        case 8: unwritten(f, name, b); break;
        case 9: {   // a checksum attribute that is not one uint32
            H5Adelete_by_name(f, name, "crc32", H5P_DEFAULT);
            uint64_t v[3] = {fuzz_u16(b), 0, 0};
            H5LTset_attribute_ulong(f, name, "crc32", (unsigned long *)v, 1 + fuzz_u8(b) % 3);
            break;
        }
        }
    }
    // Stored bytes flipped after the file is closed (offsets known from HDF5).
    haddr_t offsets[8];
    hsize_t sizes[8];
    for (int i = 0; i < n_flips; i++) {
        offsets[i] = HADDR_UNDEF;
        hid_t d = H5Dopen2(f, flips[i].name, H5P_DEFAULT);
        if (d < 0) continue;
        offsets[i] = H5Dget_offset(d);
        sizes[i] = H5Dget_storage_size(d);
        H5Dclose(d);
    }
    H5Fclose(f);
    FILE *fp = fopen(path, "r+b");
    if (!fp) abort();
    for (int i = 0; i < n_flips; i++) {
        if (offsets[i] == HADDR_UNDEF || sizes[i] == 0) continue;
        long at = (long)(offsets[i] + flips[i].offset % sizes[i]);
        fseek(fp, at, SEEK_SET);
        int c = fgetc(fp);
        if (c == EOF) continue;
        fseek(fp, at, SEEK_SET);
        fputc(c ^ (int)flips[i].mask, fp);
    }
    fclose(fp);
}

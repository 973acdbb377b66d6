#include "arena.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

// Blocks of at least 2 MiB are aligned to 2 MiB and offered to the kernel as
// transparent huge pages (THP in "madvise" mode, Debian's default): a
// training step streams through hundreds of MiB of activations, and with
// 4 KiB pages much of that time went to TLB misses and page faults.
#define HUGE_PAGE ((size_t)2 << 20)

static void *block_mem(size_t cap, Device d) {
    if (d != DEVICE_CPU) return dev_alloc(d, cap);
    if (cap < HUGE_PAGE) return xaligned(cap);
    size_t rounded = (cap + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1);
    void *p = aligned_alloc(HUGE_PAGE, rounded);
    if (!p) ag_fail(__FILE__, __LINE__, "out of memory allocating a %zu-byte arena block", cap);
#ifdef MADV_HUGEPAGE
    madvise(p, rounded, MADV_HUGEPAGE);   // advice only: a refusal changes nothing but speed
#endif
    return p;
}

static ArenaBlock *block_new(Arena *a, size_t cap) {
    ArenaBlock *b = xmalloc(sizeof *b);
    b->next = NULL;
    b->cap = cap;
    b->used = 0;
    b->mem = block_mem(cap, a->device);
    b->serial = ++a->blocks_made;
    return b;
}

void arena_init(Arena *a, size_t block_bytes) { arena_init_on(a, block_bytes, DEVICE_CPU); }

void arena_init_on(Arena *a, size_t block_bytes, Device device) {
    a->device = device;
    a->head = NULL;
    a->total_used = 0;
    a->high_water = 0;
    a->default_block = block_bytes ? block_bytes : (size_t)1 << 20;
    a->blocks_made = 0;
}

void *arena_alloc(Arena *a, size_t bytes) {
    size_t need = (bytes + 63) & ~(size_t)63;
    if (need == 0) need = 64;
    if (!a->head || a->head->used + need > a->head->cap) {
        size_t cap = a->default_block;
        if (need > cap) cap = need;
        ArenaBlock *b = block_new(a, cap);
        b->next = a->head;
        a->head = b;
    }
    void *p = a->head->mem + a->head->used;
    a->head->used += need;
    a->total_used += need;
    if (a->total_used > a->high_water) a->high_water = a->total_used;
    return p;
}

void *arena_calloc(Arena *a, size_t bytes) {
    void *p = arena_alloc(a, bytes);
    if (a->device != DEVICE_CPU) dev_zero(a->device, p, bytes);
    else memset(p, 0, bytes);
    return p;
}

static void free_blocks(ArenaBlock *b, Device d) {
    while (b) {
        ArenaBlock *next = b->next;
        if (d != DEVICE_CPU) dev_free(d, b->mem);
        else free(b->mem);
        free(b);
        b = next;
    }
}

void arena_reset(Arena *a) {
    if (a->head && a->head->next) {
        // More than one block: replace them by one that holds the high water.
        free_blocks(a->head, a->device);
        size_t cap = a->high_water > a->default_block ? a->high_water : a->default_block;
        a->head = block_new(a, cap);
    } else if (a->head) {
        a->head->used = 0;
    }
    a->total_used = 0;
}

const ArenaBlock *arena_settled(const Arena *a) { return a->head && !a->head->next ? a->head : NULL; }

ArenaMark arena_mark(const Arena *a) {
    const ArenaBlock *b = arena_settled(a);
    return b ? (ArenaMark){b->mem, b->serial} : (ArenaMark){NULL, 0};
}

void arena_free(Arena *a) {
    free_blocks(a->head, a->device);
    a->head = NULL;
    a->total_used = 0;
}

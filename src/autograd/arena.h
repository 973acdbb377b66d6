// arena.h: a bump allocator for per-step activations.
//
// Everything a forward pass creates (tensors, their data, saved state for the
// backward, gradients of activations) comes from the arena; arena_reset()
// after the backward releases it all at once. After the first step the arena
// consolidates into a single block of its high-water size, so a training loop
// does no malloc per op.
#ifndef AG_ARENA_H
#define AG_ARENA_H

#include "common.h"
#include "device.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ArenaBlock {
    struct ArenaBlock *next;
    size_t cap, used;
    unsigned char *mem;     // 64-byte aligned
    uint64_t serial;        // the arena's count of blocks made when this one was: a block
                            // freed and made again at the same address is another block
} ArenaBlock;

typedef struct Arena {
    ArenaBlock *head;       // current block (a list of full blocks follows)
    size_t total_used;      // bytes handed out since the last reset
    size_t high_water;      // largest total_used seen
    size_t default_block;   // size of a fresh block
    Device device;          // where the blocks are (DEVICE_CPU unless arena_init_on says otherwise)
    uint64_t blocks_made;
} Arena;

void arena_init(Arena *a, size_t block_bytes);
// An arena whose blocks are on `device` (GPU memory: arena_calloc zeroes it
// on the stream; the caller never dereferences what it hands out).
void arena_init_on(Arena *a, size_t block_bytes, Device device);
void *arena_alloc(Arena *a, size_t bytes);    // 64-byte aligned, uninitialised
void *arena_calloc(Arena *a, size_t bytes);   // zeroed
void arena_reset(Arena *a);                   // frees everything handed out
// The arena's one block when it has settled into one (NULL otherwise). What
// a CUDA graph captured in it may be replayed only while this is the same
// block (the same serial): memory freed under a graph is not the graph's any
// more, even where the next block is made at the same address.
const ArenaBlock *arena_settled(const Arena *a);
// That block as a graph's key holds it: its address and serial ({NULL, 0}
// when the arena has not settled); the same settled block when both agree.
typedef struct ArenaMark {
    const void *mem;
    uint64_t serial;
} ArenaMark;
ArenaMark arena_mark(const Arena *a);
static inline bool arena_mark_same(ArenaMark a, ArenaMark b) { return a.mem && a.mem == b.mem && a.serial == b.serial; }
void arena_free(Arena *a);

#ifdef __cplusplus
}
#endif
#endif

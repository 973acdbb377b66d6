// rng.h: a small, seedable, serialisable random generator (xoshiro256**).
#ifndef AG_RNG_H
#define AG_RNG_H

#include <stdint.h>

typedef struct Rng {
    uint64_t s[4];
} Rng;

void rng_seed(Rng *r, uint64_t seed);
uint64_t rng_u64(Rng *r);
double rng_uniform(Rng *r);                 // [0, 1)
double rng_range(Rng *r, double lo, double hi);
double rng_normal(Rng *r);                  // standard normal
uint64_t rng_below(Rng *r, uint64_t n);     // uniform in [0, n)

#endif

/* rng: a small deterministic random generator (splitmix64) and normal samples by Box-Muller, so
 * that every rank draws the same initial weights from the same seed on any platform. Not for
 * cryptography, and not the data-order shuffling of a trainer (that belongs to the executor). */
#ifndef PX_RNG_H
#define PX_RNG_H

#include <stdint.h>

typedef struct PxRng {
	uint64_t state;
} PxRng;

/* A generator for one stream of a seed: streams of the same seed are independent, so a rank can
 * draw one tensor's values without drawing every tensor before it. */
void rng_init(PxRng *r, uint64_t seed, uint64_t stream);
uint64_t rng_next_u64(PxRng *r);
/* Uniform in [0, 1), 53 random bits. */
double rng_uniform(PxRng *r);
/* Standard normal (mean 0, variance 1). */
double rng_normal(PxRng *r);

#endif

#include "rng.h"

#include <math.h>

/* splitmix64 (Steele, Lea and Flood, "Fast splittable pseudorandom number generators", 2014): a
 * Weyl sequence with step 0x9E3779B97F4A7C15 passed through a 64-bit finaliser. */
#define GOLDEN_GAMMA 0x9E3779B97F4A7C15ull

static uint64_t mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

void rng_init(PxRng *r, uint64_t seed, uint64_t stream)
{
	/* stream 0 is the plain splitmix64 sequence of seed (which the tests check against published
	 * values); other streams start from a hashed offset, far apart in the 2^64 cycle */
	r->state = stream ? seed ^ mix64(stream * GOLDEN_GAMMA) : seed;
}

uint64_t rng_next_u64(PxRng *r)
{
	r->state += GOLDEN_GAMMA;
	return mix64(r->state);
}

double rng_uniform(PxRng *r)
{
	return (double)(rng_next_u64(r) >> 11) * 0x1.0p-53;
}

double rng_normal(PxRng *r)
{
	/* Box-Muller with one of its two outputs: simpler than caching the second, and the draw
	 * sequence stays a pure function of the count of calls. 1 - u is in (0, 1], so the log is
	 * finite. */
	double u1 = 1.0 - rng_uniform(r);
	double u2 = rng_uniform(r);
	return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

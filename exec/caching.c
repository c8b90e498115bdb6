#include "caching.h"

#include <stdint.h>
#include <stdlib.h>

/* CUDACachingAllocator.cpp's constants */
#define MIN_BLOCK ((size_t)512)          /* kMinBlockSize */
#define SMALL_SIZE ((size_t)1 << 20)     /* kSmallSize: the largest small request */
#define SMALL_BUFFER ((size_t)2 << 20)   /* kSmallBuffer */
#define LARGE_BUFFER ((size_t)20 << 20)  /* kLargeBuffer */
#define MIN_LARGE_ALLOC ((size_t)10 << 20) /* kMinLargeAlloc */
#define ROUND_LARGE ((size_t)2 << 20)    /* kRoundLarge */

/* A piece of a segment, handed out or cached; a segment's blocks in address order. */
typedef struct Block {
	char *ptr;
	size_t size;
	int used, small;
	struct Block *prev, *next;
	struct Block *seg_next; /* the next segment's first block (segment heads only) */
} Block;

struct Caching {
	CachingSource src;
	Block *segs; /* each segment's first block, chained by seg_next */
	CachingStats st;
};

static size_t round_bytes(size_t bytes)
{
	return bytes < MIN_BLOCK ? MIN_BLOCK : (bytes + MIN_BLOCK - 1) / MIN_BLOCK * MIN_BLOCK;
}

static size_t segment_bytes(size_t size)
{
	if (size <= SMALL_SIZE)
		return SMALL_BUFFER;
	if (size < MIN_LARGE_ALLOC)
		return LARGE_BUFFER;
	return (size + ROUND_LARGE - 1) / ROUND_LARGE * ROUND_LARGE;
}

Caching *caching_create(const CachingSource *src)
{
	Caching *c = calloc(1, sizeof(*c));
	if (c)
		c->src = *src;
	return c;
}

void caching_destroy(Caching *c)
{
	if (!c)
		return;
	for (Block *s = c->segs, *sn; s; s = sn) {
		sn = s->seg_next;
		c->src.unmap(c->src.ctx, s->ptr);
		for (Block *b = s, *n; b; b = n) {
			n = b->next;
			free(b);
		}
	}
	free(c);
}

/* The cached block of the pool that fits best: the smallest at least size long, the lowest
 * address among equals (the pool's set orders blocks by size, then address). */
static Block *best_fit(const Caching *c, size_t size, int small)
{
	Block *best = NULL;
	for (Block *s = c->segs; s; s = s->seg_next) {
		if (s->small != small)
			continue;
		for (Block *b = s; b; b = b->next)
			if (!b->used && b->size >= size &&
			    (!best || b->size < best->size ||
			     (b->size == best->size && (uintptr_t)b->ptr < (uintptr_t)best->ptr)))
				best = b;
	}
	return best;
}

static Block *new_segment(Caching *c, size_t bytes, int small)
{
	Block *b = calloc(1, sizeof(*b));
	if (!b)
		return NULL;
	if (!(b->ptr = c->src.map(c->src.ctx, bytes))) {
		free(b);
		return NULL;
	}
	b->size = bytes, b->small = small, b->seg_next = c->segs;
	c->segs = b;
	c->st.reserved_bytes += bytes;
	if (c->st.reserved_bytes > c->st.reserved_peak_bytes)
		c->st.reserved_peak_bytes = c->st.reserved_bytes;
	c->st.segments++, c->st.maps++;
	return b;
}

void *caching_alloc(Caching *c, size_t bytes)
{
	size_t size = round_bytes(bytes);
	int small = size <= SMALL_SIZE;
	Block *b = best_fit(c, size, small);
	if (!b && !(b = new_segment(c, segment_bytes(size), small)))
		return NULL;
	/* split when the rest is worth keeping: a minimum block in the small pool, more than a
	 * small request in the large one (should_split) */
	size_t rest = b->size - size;
	if (small ? rest >= MIN_BLOCK : rest > SMALL_SIZE) {
		Block *r = calloc(1, sizeof(*r));
		if (!r)
			return NULL;
		*r = (Block){.ptr = b->ptr + size, .size = rest, .small = small, .prev = b,
			     .next = b->next};
		if (b->next)
			b->next->prev = r;
		b->next = r;
		b->size = size;
	}
	b->used = 1;
	c->st.allocated_bytes += b->size;
	if (c->st.allocated_bytes > c->st.allocated_peak_bytes)
		c->st.allocated_peak_bytes = c->st.allocated_bytes;
	return b->ptr;
}

/* Take n out of its segment's list into b (its free neighbour before it). */
static void absorb(Block *b, Block *n)
{
	b->size += n->size;
	b->next = n->next;
	if (n->next)
		n->next->prev = b;
	free(n);
}

int caching_free(Caching *c, void *ptr)
{
	if (!ptr)
		return 0;
	Block *b = NULL;
	for (Block *s = c->segs; s && !b; s = s->seg_next)
		for (Block *x = s; x && !b; x = x->next)
			if (x->ptr == ptr && x->used)
				b = x;
	if (!b)
		return -1;
	b->used = 0;
	c->st.allocated_bytes -= b->size;
	if (b->next && !b->next->used)
		absorb(b, b->next);
	if (b->prev && !b->prev->used) /* b is not a segment's head: its prev keeps that role */
		absorb(b->prev, b);
	return 0;
}

void caching_stats(const Caching *c, CachingStats *out)
{
	*out = c->st;
}

void caching_reset_peak(Caching *c)
{
	c->st.allocated_peak_bytes = c->st.allocated_bytes;
	c->st.reserved_peak_bytes = c->st.reserved_bytes;
}

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

/* An expandable segment: one reservation, its first committed bytes cut into blocks. */
typedef struct Grown {
	char *base;       /* NULL until the pool's first request */
	size_t committed; /* bytes from base made usable */
	Block *head;      /* its first block (also on the segment chain) */
} Grown;

struct Caching {
	CachingSource src;
	AllocConf conf;
	Block *segs; /* each segment's first block, chained by seg_next */
	Grown grown[2]; /* expandable segments: [1] the small pool's, [0] the large's */
	CachingStats st;
};

/* round_size: up to 512 bytes; under roundup_power2_divisions d (d > 1, bytes above 512 d), up to
 * the next multiple of 2^k / d, 2^k the power of two at or below bytes (a power of two as it is) */
static size_t round_bytes(const Caching *c, size_t bytes)
{
	if (bytes < MIN_BLOCK)
		return MIN_BLOCK;
	unsigned d = alloc_conf_divisions(&c->conf, bytes);
	if (d <= 1 || bytes <= MIN_BLOCK * d)
		return (bytes + MIN_BLOCK - 1) / MIN_BLOCK * MIN_BLOCK;
	int k = 63;
	while (!(bytes >> k))
		k--;
	if (bytes == (size_t)1 << k)
		return bytes;
	int shift = 0; /* log2(d) */
	while ((1u << (shift + 1)) <= d)
		shift++;
	if (shift > k)
		return (size_t)1 << (k + 1);
	size_t step = (size_t)1 << (k - shift);
	return (bytes & ~(step - 1)) + (bytes & (step - 1) ? step : 0);
}

static size_t segment_bytes(size_t size)
{
	if (size <= SMALL_SIZE)
		return SMALL_BUFFER;
	if (size < MIN_LARGE_ALLOC)
		return LARGE_BUFFER;
	return (size + ROUND_LARGE - 1) / ROUND_LARGE * ROUND_LARGE;
}

Caching *caching_create(const CachingSource *src, const AllocConf *conf)
{
	if (conf && conf->expandable && (!src->reserve || !src->commit || !src->release))
		return NULL;
	Caching *c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	c->src = *src;
	if (conf)
		c->conf = *conf;
	return c;
}

static int is_grown(const Caching *c, const Block *head)
{
	return head == c->grown[0].head || head == c->grown[1].head;
}

void caching_destroy(Caching *c)
{
	if (!c)
		return;
	for (Block *s = c->segs, *sn; s; s = sn) {
		sn = s->seg_next;
		if (is_grown(c, s))
			c->src.release(c->src.ctx, s->ptr, c->src.reserve_bytes);
		else
			c->src.unmap(c->src.ctx, s->ptr);
		for (Block *b = s, *n; b; b = n) {
			n = b->next;
			free(b);
		}
	}
	free(c);
}

/* Whether a is a better fit than b: the smaller, then the lower address; under expandable
 * segments a block that is not the last of its segment before one that is (the last one's size
 * counts as all it could grow to). */
static int fits_better(const Caching *c, const Block *a, const Block *b)
{
	if (!b)
		return 1;
	int a_end = c->conf.expandable && !a->next, b_end = c->conf.expandable && !b->next;
	if (a_end != b_end)
		return b_end;
	return a->size < b->size || (a->size == b->size && (uintptr_t)a->ptr < (uintptr_t)b->ptr);
}

/* The cached block of the pool that fits best, refused under max_split_size where PyTorch's
 * get_free_block refuses it: a block at or above the limit for a request below it, or one
 * max_non_split_rounding (20 MiB by default) larger than a request at or above it. */
static Block *best_fit(const Caching *c, size_t size, int small)
{
	Block *best = NULL;
	for (Block *s = c->segs; s; s = s->seg_next) {
		if (s->small != small)
			continue;
		for (Block *b = s; b; b = b->next)
			if (!b->used && b->size >= size && fits_better(c, b, best))
				best = b;
	}
	double split = c->conf.max_split_bytes;
	if (best && split > 0) {
		int oversize_req = (double)size >= split;
		size_t over = c->conf.max_non_split_bytes > 0 ?
				      (size_t)c->conf.max_non_split_bytes : LARGE_BUFFER;
		if ((!oversize_req && (double)best->size >= split) ||
		    (oversize_req && best->size >= size + over))
			return NULL;
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

/* The pool's expandable segment grown by the pages the block at its end lacks for size: a new
 * block after a used one, else that block longer (or, when it lacks nothing, that block: one
 * best_fit refused under max_split_size, which find_expandable_block takes). NULL when the
 * reservation is used up or the source refuses. */
static Block *grow(Caching *c, size_t size, int small)
{
	Grown *g = &c->grown[small];
	size_t page = small ? SMALL_BUFFER : LARGE_BUFFER;
	if (!g->base && !(g->base = c->src.reserve(c->src.ctx, c->src.reserve_bytes)))
		return NULL;
	Block *end = g->head;
	while (end && end->next)
		end = end->next;
	size_t have = end && !end->used ? end->size : 0;
	if (have >= size) /* a block max_split_size kept from best_fit, at the end: as it is */
		return end;
	size_t add = (size - have + page - 1) / page * page;
	if (add > c->src.reserve_bytes - g->committed ||
	    c->src.commit(c->src.ctx, g->base + g->committed, add))
		return NULL;
	g->committed += add;
	c->st.reserved_bytes += add;
	if (c->st.reserved_bytes > c->st.reserved_peak_bytes)
		c->st.reserved_peak_bytes = c->st.reserved_bytes;
	c->st.maps++;
	if (end && !end->used) {
		end->size += add;
		return end;
	}
	Block *b = calloc(1, sizeof(*b));
	if (!b)
		return NULL;
	*b = (Block){.ptr = g->base + g->committed - add, .size = add, .small = small, .prev = end};
	if (end) {
		end->next = b;
	} else { /* the segment's first block */
		g->head = b;
		b->seg_next = c->segs;
		c->segs = b;
		c->st.segments++;
	}
	return b;
}

/* Split when the rest is worth keeping (should_split): a minimum block in the small pool or an
 * expandable segment; in the large pool more than a small request, for a request below
 * max_split_size only. */
static int worth_splitting(const Caching *c, size_t size, size_t rest, int small)
{
	if (small || c->conf.expandable)
		return rest >= MIN_BLOCK;
	return rest > SMALL_SIZE &&
	       (c->conf.max_split_bytes <= 0 || (double)size < c->conf.max_split_bytes);
}

void *caching_alloc(Caching *c, size_t bytes)
{
	size_t size = round_bytes(c, bytes);
	int small = size <= SMALL_SIZE;
	Block *b = best_fit(c, size, small);
	if (!b)
		b = c->conf.expandable ? grow(c, size, small) :
					 new_segment(c, segment_bytes(size), small);
	if (!b)
		return NULL;
	size_t rest = b->size - size;
	if (worth_splitting(c, size, rest, small)) {
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

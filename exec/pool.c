#include "pool.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Under AddressSanitizer the pool poisons what no caller holds (free blocks, the tail past what a
 * caller asked for), so that an overrun of an executor buffer is still reported: ASan does not
 * see inside memory mapped by hand. */
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define POISON(p, n) ASAN_POISON_MEMORY_REGION((p), (n))
#define UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define POISON(p, n) ((void)(p), (void)(n))
#define UNPOISON(p, n) ((void)(p), (void)(n))
#endif

/* ---- the bookkeeping ----
 * Blocks are described outside the memory they describe: a caller's overrun cannot corrupt the
 * pool, and a block's first touch is its caller's. A segment's blocks tile the front of its
 * range in address order, free neighbours merged at once; the free blocks of each class (small,
 * large) are on a list searched best-fit; live blocks are found by address in a hash table. */

typedef struct Segment Segment;

typedef struct Block {
	char *ptr;
	size_t bytes;                /* its extent: a multiple of POOL_ALIGN */
	size_t asked;                /* live: what its caller asked for */
	int live;
	Segment *seg;
	struct Block *prev, *next;   /* neighbours in the segment, by address */
	struct Block *fprev, *fnext; /* free: the class's free list */
	struct Block *hnext;         /* live: the hash chain */
} Block;

struct Segment {
	char *base;
	size_t reserved;    /* address space, PROT_NONE beyond the mapped front */
	size_t mapped;      /* [base, base + mapped) is read-write memory */
	size_t brk;         /* the blocks tile [base, base + brk) */
	size_t fresh;       /* from base + fresh on, nothing was written since it was mapped: zero */
	int small;          /* its class */
	long long live;     /* live blocks in it */
	Block *first, *last;
	Segment *next;      /* the class's segments, in the order they were reserved */
};

struct Pool {
	PoolConfig cfg;
	Segment *segs[2];    /* [small] */
	Block *free_list[2]; /* [small] */
	Block **hash;
	size_t hash_cap;     /* a power of two */
	PoolStats st;
};

static size_t round_up(size_t n, size_t to)
{
	return (n + to - 1) / to * to;
}

static void count_mapped(Pool *p, size_t bytes)
{
	p->st.mapped_bytes += bytes;
	if (p->st.mapped_bytes > p->st.mapped_peak_bytes)
		p->st.mapped_peak_bytes = p->st.mapped_bytes;
}

/* ---- live blocks by address ---- */

static size_t hash_slot(const Pool *p, const void *ptr)
{
	uint64_t h = (uint64_t)(uintptr_t)ptr / POOL_ALIGN * 0x9e3779b97f4a7c15ull;
	return (size_t)(h >> 32) & (p->hash_cap - 1);
}

static int hash_grow(Pool *p)
{
	size_t cap = p->hash_cap ? 2 * p->hash_cap : 64;
	Block **t = calloc(cap, sizeof(*t));
	if (!t)
		return -1;
	Block **old = p->hash;
	size_t old_cap = p->hash_cap;
	p->hash = t;
	p->hash_cap = cap;
	for (size_t i = 0; i < old_cap; i++)
		for (Block *b = old[i], *n; b; b = n) {
			n = b->hnext;
			size_t s = hash_slot(p, b->ptr);
			b->hnext = t[s];
			t[s] = b;
		}
	free(old);
	return 0;
}

static void hash_put(Pool *p, Block *b)
{
	size_t s = hash_slot(p, b->ptr);
	b->hnext = p->hash[s];
	p->hash[s] = b;
}

static Block *hash_take(Pool *p, const void *ptr)
{
	for (Block **at = &p->hash[hash_slot(p, ptr)]; *at; at = &(*at)->hnext)
		if ((*at)->ptr == ptr) {
			Block *b = *at;
			*at = b->hnext;
			b->hnext = NULL;
			return b;
		}
	return NULL;
}

/* ---- free lists ---- */

static void free_push(Pool *p, Block *b)
{
	Block **head = &p->free_list[b->seg->small];
	b->fprev = NULL;
	b->fnext = *head;
	if (*head)
		(*head)->fprev = b;
	*head = b;
	p->st.free_blocks++;
}

static void free_pull(Pool *p, Block *b)
{
	if (b->fprev)
		b->fprev->fnext = b->fnext;
	else
		p->free_list[b->seg->small] = b->fnext;
	if (b->fnext)
		b->fnext->fprev = b->fprev;
	b->fprev = b->fnext = NULL;
	p->st.free_blocks--;
}

/* The smallest free block of the class that holds bytes, the lowest of equals (so that the
 * segments' fronts stay low). */
static Block *best_fit(const Pool *p, int small, size_t bytes)
{
	Block *best = NULL;
	for (Block *b = p->free_list[small]; b; b = b->fnext)
		if (b->bytes >= bytes && (!best || b->bytes < best->bytes ||
					  (b->bytes == best->bytes &&
					   (uintptr_t)b->ptr < (uintptr_t)best->ptr)))
			best = b;
	return best;
}

/* ---- segments ---- */

/* A new segment for class small, room for bytes at least; NULL when the system has no address
 * space for it. A reservation refused at the configured size is asked again at half, down to
 * what bytes needs. */
static Segment *segment_reserve(Pool *p, int small, size_t bytes)
{
	size_t need = round_up(bytes, p->cfg.commit_bytes);
	size_t size = need > p->cfg.segment_bytes ? need : p->cfg.segment_bytes;
	void *base;
	for (;;) {
		base = mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
		if (base != MAP_FAILED)
			break;
		if (size == need)
			return NULL;
		size = size / 2 > need ? round_up(size / 2, p->cfg.commit_bytes) : need;
	}
	Segment *s = calloc(1, sizeof(*s));
	if (!s) {
		munmap(base, size);
		return NULL;
	}
	*s = (Segment){.base = base, .reserved = size, .small = small};
	Segment **tail = &p->segs[small];
	while (*tail)
		tail = &(*tail)->next;
	*tail = s;
	p->st.reserves++;
	p->st.segments++;
	return s;
}

/* Map s read-write up to end at least (in commit steps); -1 when the system refuses. */
static int segment_commit(Pool *p, Segment *s, size_t end)
{
	if (end <= s->mapped)
		return 0;
	size_t to = round_up(end, p->cfg.commit_bytes);
	if (to > s->reserved)
		to = s->reserved;
	if (mprotect(s->base + s->mapped, to - s->mapped, PROT_READ | PROT_WRITE))
		return -1;
	POISON(s->base + s->mapped, to - s->mapped);
	p->st.commits++;
	count_mapped(p, to - s->mapped);
	s->mapped = to;
	return 0;
}

/* A free block of bytes at least at s's front: its free last block grown, or a new one; NULL
 * when s has no room left or the system refuses. The block is on its free list. */
static Block *segment_extend(Pool *p, Segment *s, size_t bytes)
{
	Block *last = s->last;
	size_t have = last && !last->live ? last->bytes : 0;
	size_t need = bytes - have;
	if (need > s->reserved - s->brk)
		return NULL;
	Block *b = have ? last : calloc(1, sizeof(*b));
	if (!b || segment_commit(p, s, s->brk + need)) {
		if (b != last)
			free(b);
		return NULL;
	}
	if (have) {
		last->bytes += need;
	} else {
		*b = (Block){.ptr = s->base + s->brk, .bytes = bytes, .seg = s, .prev = last};
		if (last)
			last->next = b;
		else
			s->first = b;
		s->last = b;
		free_push(p, b);
	}
	s->brk += need;
	return b;
}

/* Give back to the system what lies beyond s's last live block. Returns 1 when s is empty. */
static int segment_trim(Pool *p, Segment *s)
{
	Block *last = s->last;
	if (last && !last->live) {
		free_pull(p, last);
		s->brk -= last->bytes;
		s->last = last->prev;
		if (s->last)
			s->last->next = NULL;
		else
			s->first = NULL;
		free(last);
	}
	size_t keep = round_up(s->brk, p->cfg.commit_bytes);
	if (!s->first || keep >= s->mapped)
		return !s->first;
	/* a fresh PROT_NONE mapping in place: the pages go back, the range stays reserved */
	UNPOISON(s->base + keep, s->mapped - keep);
	if (mmap(s->base + keep, s->mapped - keep, PROT_NONE,
		 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0) == MAP_FAILED) {
		POISON(s->base + keep, s->mapped - keep);
		return 0; /* still mapped, still counted */
	}
	p->st.releases++;
	p->st.mapped_bytes -= s->mapped - keep;
	s->mapped = keep;
	if (s->fresh > keep)
		s->fresh = keep;
	return 0;
}

/* Unmap s, whatever it holds, and forget it. */
static void segment_unmap(Pool *p, Segment *s)
{
	for (Block *b = s->first, *n; b; b = n) {
		n = b->next;
		if (b->live) {
			hash_take(p, b->ptr);
			p->st.live_blocks--;
			p->st.live_bytes -= b->bytes;
			p->st.asked_bytes -= b->asked;
		} else {
			free_pull(p, b);
		}
		free(b);
	}
	Segment **at = &p->segs[s->small];
	while (*at != s)
		at = &(*at)->next;
	*at = s->next;
	UNPOISON(s->base, s->mapped);
	munmap(s->base, s->reserved);
	p->st.segments--;
	p->st.mapped_bytes -= s->mapped;
	if (s->mapped)
		p->st.releases++;
	free(s);
}

/* ---- the pool ---- */

Pool *pool_create(const PoolConfig *cfg)
{
	long page = sysconf(_SC_PAGESIZE);
	size_t page_bytes = page > 0 ? (size_t)page : 4096;
	if (!cfg->commit_bytes || cfg->commit_bytes % page_bytes ||
	    cfg->segment_bytes < cfg->commit_bytes || cfg->small_max_bytes > cfg->segment_bytes)
		return NULL;
	Pool *p = calloc(1, sizeof(*p));
	if (!p)
		return NULL;
	p->cfg = *cfg;
	if (hash_grow(p)) {
		free(p);
		return NULL;
	}
	return p;
}

void pool_destroy(Pool *p)
{
	if (!p)
		return;
	for (int k = 0; k < 2; k++)
		while (p->segs[k])
			segment_unmap(p, p->segs[k]);
	free(p->hash);
	free(p);
}

/* Cut b down to bytes, the rest a free block after it (left whole when no node can be had). */
static void split(Pool *p, Block *b, size_t bytes)
{
	if (b->bytes - bytes < POOL_ALIGN)
		return;
	Block *r = calloc(1, sizeof(*r));
	if (!r)
		return;
	*r = (Block){.ptr = b->ptr + bytes, .bytes = b->bytes - bytes, .seg = b->seg, .prev = b,
		     .next = b->next};
	if (b->next)
		b->next->prev = r;
	else
		b->seg->last = r;
	b->next = r;
	b->bytes = bytes;
	free_push(p, r);
}

/* A free block of bytes at least for class small: the best fit, else a segment's front grown,
 * else a new segment's. */
static Block *find_block(Pool *p, int small, size_t bytes)
{
	Block *b = best_fit(p, small, bytes);
	for (Segment *s = p->segs[small]; !b && s; s = s->next)
		b = segment_extend(p, s, bytes);
	if (b)
		return b;
	Segment *s = segment_reserve(p, small, bytes);
	return s ? segment_extend(p, s, bytes) : NULL;
}

static void *take(Pool *p, size_t bytes, int zeroed)
{
	size_t asked = bytes ? bytes : 1;
	if (asked > SIZE_MAX / 2)
		return NULL;
	size_t n = round_up(asked, POOL_ALIGN);
	int small = n <= p->cfg.small_max_bytes;
	if (p->st.live_blocks + 1 > (long long)p->hash_cap && hash_grow(p))
		return NULL;
	Block *b = find_block(p, small, n);
	if (!b)
		return NULL;
	free_pull(p, b);
	split(p, b, n);
	b->live = 1;
	b->asked = asked;
	hash_put(p, b);
	Segment *s = b->seg;
	s->live++;
	size_t off = (size_t)(b->ptr - s->base);
	UNPOISON(b->ptr, asked);
	if (zeroed && off < s->fresh) /* what an earlier block left there; beyond fresh it is zero
					 as mapped */
		memset(b->ptr, 0, asked < s->fresh - off ? asked : s->fresh - off);
	if (off + b->bytes > s->fresh)
		s->fresh = off + b->bytes;
	p->st.live_blocks++;
	p->st.live_bytes += b->bytes;
	p->st.asked_bytes += asked;
	if (p->st.asked_bytes > p->st.asked_peak_bytes)
		p->st.asked_peak_bytes = p->st.asked_bytes;
	return b->ptr;
}

void *pool_alloc(Pool *p, size_t bytes)
{
	return take(p, bytes, 1);
}

void *pool_alloc_empty(Pool *p, size_t bytes)
{
	return take(p, bytes, 0);
}

/* b (free, off its list) merged with its free neighbours, back on its list. */
static void coalesce(Pool *p, Block *b)
{
	Segment *s = b->seg;
	Block *n = b->next;
	if (n && !n->live) {
		free_pull(p, n);
		b->bytes += n->bytes;
		b->next = n->next;
		if (n->next)
			n->next->prev = b;
		else
			s->last = b;
		free(n);
	}
	Block *q = b->prev;
	if (q && !q->live) {
		free_pull(p, q);
		q->bytes += b->bytes;
		q->next = b->next;
		if (b->next)
			b->next->prev = q;
		else
			s->last = q;
		free(b);
		b = q;
	}
	free_push(p, b);
}

void pool_free(Pool *p, void *ptr)
{
	if (!ptr)
		return;
	Block *b = hash_take(p, ptr);
	if (!b) {
		fprintf(stderr, "pool_free: %p was not handed out by this pool (or was freed "
			"already)\n", ptr);
		abort();
	}
	POISON(b->ptr, b->bytes);
	b->live = 0;
	b->seg->live--;
	p->st.live_blocks--;
	p->st.live_bytes -= b->bytes;
	p->st.asked_bytes -= b->asked;
	b->asked = 0;
	coalesce(p, b);
}

void pool_trim(Pool *p)
{
	for (int k = 0; k < 2; k++)
		for (Segment *s = p->segs[k], *n; s; s = n) {
			n = s->next;
			if (segment_trim(p, s))
				segment_unmap(p, s);
		}
}

void pool_reset_peak(Pool *p)
{
	p->st.mapped_peak_bytes = p->st.mapped_bytes;
	p->st.asked_peak_bytes = p->st.asked_bytes;
}

void pool_stats(const Pool *p, PoolStats *out)
{
	*out = p->st;
}

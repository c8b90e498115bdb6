#include "allocator.h"

#include <stdint.h>
#include <stdlib.h>

#include "memory.h"

/* roundup_power2_next_division: size up to the next of divisions equal steps between the powers
 * of two below and above it (a power of two stays; a step below one byte gives the power above) */
static size_t next_division(size_t size, unsigned divisions)
{
	size_t below = 1;
	while (below <= size / 2)
		below *= 2;
	size_t step = below / divisions;
	if (below == size)
		return size;
	if (!step)
		return 2 * below;
	return (size + step - 1) / step * step;
}

size_t alloc_round_bytes(size_t request, const AllocConf *conf)
{
	if (request < ALLOC_MIN_BLOCK)
		return ALLOC_MIN_BLOCK;
	unsigned divisions = conf ? alloc_conf_divisions(conf, request) : 0;
	if (divisions > 1 && request > ALLOC_MIN_BLOCK * divisions)
		return next_division(request, divisions);
	return ALLOC_MIN_BLOCK * ((request + ALLOC_MIN_BLOCK - 1) / ALLOC_MIN_BLOCK);
}

size_t alloc_segment_bytes(size_t rounded)
{
	if (rounded <= ALLOC_SMALL_SIZE)
		return ALLOC_SMALL_BUFFER;
	if (rounded < ALLOC_MIN_LARGE)
		return ALLOC_LARGE_BUFFER;
	return ALLOC_ROUND_LARGE * ((rounded + ALLOC_ROUND_LARGE - 1) / ALLOC_ROUND_LARGE);
}

/* A block: a piece of a segment, handed out or cached; a segment's blocks in address order. */
typedef struct Block {
	size_t size;
	int used;
	long long seg;      /* its segment's index: segments' order stands for their addresses */
	size_t off;         /* its offset in the segment */
	struct Block *prev, *next;
} Block;

typedef struct Model {
	Block **segs;  /* each segment's first block */
	int *seg_small;
	long long n_segs, cap_segs;
	long long grown[2]; /* expandable segments: the small (1) and large (0) pool's, -1 none */
	AllocConf conf;
	Block **by_buf; /* the block each live buffer holds, NULL when none */
	int n_bufs;
	double allocated, reserved, outside;
	AllocPeaks *out;
	int failed, executor;
} Model;

/* What lives outside the allocator: the CUDA context (the driver's) and NCCL's buffers (NCCL maps
 * its own with cudaMalloc). Everything else a framework process holds on the device comes from
 * the caching allocator, cuBLAS's workspace included (PyTorch hands it one; the executor's
 * context takes its own). */
static int outside(const Model *m, const Op *op)
{
	return op->what == BUF_CUDA_CONTEXT || op->what == BUF_NCCL ||
	       (m->executor && op->what == BUF_CUBLAS_WORKSPACE);
}

/* Split a block only when what is left is worth keeping (should_split): at least one minimum
 * block in the small pool and in an expandable segment; in the large pool more than a small
 * request, and only for a request below max_split_size. */
static int should_split(const Model *m, const Block *b, size_t size, int small)
{
	size_t rest = b->size - size;
	if (small || m->conf.expandable)
		return rest >= ALLOC_MIN_BLOCK;
	return (m->conf.max_split_bytes <= 0 || (double)size < m->conf.max_split_bytes) &&
	       rest > ALLOC_SMALL_SIZE;
}

/* The free block at the end of an expandable segment's mapped part, which the unmapped rest
 * follows: its size for best fit is what it could grow to (get_free_block's expandable_size). */
static int at_mapped_end(const Model *m, const Block *b)
{
	return m->conf.expandable && !b->next;
}

/* The cached block that fits best (get_free_block): the smallest free block of the pool at least
 * size long, the lowest address among equals (the pool's set orders by size, then address), an
 * expandable segment's last block only when nothing else fits; then refused under
 * max_split_size when a request below it would take a block at or above it, or one at or above
 * it a block max_non_split_rounding (20 MiB, kLargeBuffer, by default) or more larger than
 * itself. */
static Block *best_fit(const Model *m, size_t size, int small)
{
	Block *best = NULL;
	for (long long s = 0; s < m->n_segs; s++) {
		if (m->seg_small[s] != small)
			continue;
		for (Block *b = m->segs[s]; b; b = b->next) {
			if (b->used || b->size < size)
				continue;
			int tail = at_mapped_end(m, b), best_tail = best && at_mapped_end(m, best);
			if (!best || (best_tail && !tail) ||
			    (tail == best_tail && b->size < best->size))
				best = b;
		}
	}
	double split = m->conf.max_split_bytes, over = m->conf.max_non_split_bytes;
	if (over <= 0)
		over = (double)ALLOC_LARGE_BUFFER;
	if (best && split > 0 &&
	    (((double)size < split && (double)best->size >= split) ||
	     ((double)size >= split && (double)best->size >= (double)size + over)))
		return NULL;
	return best;
}

static Block *new_segment(Model *m, size_t bytes, int small)
{
	if (m->n_segs == m->cap_segs) {
		long long cap = m->cap_segs ? 2 * m->cap_segs : 64;
		Block **segs = realloc(m->segs, (size_t)cap * sizeof(*segs));
		int *kind = segs ? realloc(m->seg_small, (size_t)cap * sizeof(*kind)) : NULL;
		if (segs)
			m->segs = segs;
		if (!kind)
			return NULL;
		m->seg_small = kind;
		m->cap_segs = cap;
	}
	Block *b = calloc(1, sizeof(*b));
	if (!b)
		return NULL;
	*b = (Block){.size = bytes, .seg = m->n_segs};
	m->segs[m->n_segs] = b;
	m->seg_small[m->n_segs++] = small;
	m->reserved += (double)bytes;
	return b;
}

/* Expandable segments (try_allocate_expandable_block): the pool's one segment grows by the pages
 * (2 MiB in the small pool, 20 MiB in the large) that the free block at its end lacks for size,
 * mapped after it and merged with it; the first request makes the segment. A free block at the
 * end that lacks nothing (one get_free_block refused under max_split_size) is taken as it is:
 * find_expandable_block maps no page for it. */
static Block *grow(Model *m, size_t size, int small)
{
	size_t page = small ? ALLOC_SMALL_BUFFER : ALLOC_LARGE_BUFFER;
	long long s = m->grown[small];
	Block *last = NULL;
	if (s >= 0)
		for (last = m->segs[s]; last->next; last = last->next)
			;
	size_t have = last && !last->used ? last->size : 0;
	if (have >= size) /* refused by max_split_size in best_fit, taken here as it is */
		return last;
	size_t pages = (size - have + page - 1) / page * page;
	if (s < 0) {
		Block *b = new_segment(m, pages, small);
		if (b)
			m->grown[small] = b->seg;
		return b;
	}
	m->reserved += (double)pages;
	if (have) {
		last->size += pages;
		return last;
	}
	Block *b = calloc(1, sizeof(*b));
	if (!b)
		return NULL;
	*b = (Block){.size = pages, .seg = s, .off = last->off + last->size, .prev = last};
	last->next = b;
	return b;
}

static void peaks(Model *m)
{
	AllocPeaks *o = m->out;
	if (m->allocated > o->allocated_bytes)
		o->allocated_bytes = m->allocated;
	if (m->reserved > o->reserved_bytes) {
		o->reserved_bytes = m->reserved;
		o->segments = m->n_segs;
	}
	if (m->reserved + m->outside > o->smi_bytes) {
		o->smi_bytes = m->reserved + m->outside;
		o->outside_bytes = m->outside;
	}
}

static int take(Model *m, int buf, double bytes)
{
	size_t size = alloc_round_bytes(bytes > 0 ? (size_t)(bytes + 0.999999) : 0, &m->conf);
	int small = size <= ALLOC_SMALL_SIZE;
	Block *b = best_fit(m, size, small);
	if (!b)
		b = m->conf.expandable ? grow(m, size, small) :
					 new_segment(m, alloc_segment_bytes(size), small);
	if (!b)
		return -1;
	if (should_split(m, b, size, small)) {
		Block *rest = calloc(1, sizeof(*rest));
		if (!rest)
			return -1;
		*rest = (Block){.size = b->size - size, .seg = b->seg, .off = b->off + size,
				.prev = b, .next = b->next};
		if (b->next)
			b->next->prev = rest;
		b->next = rest;
		b->size = size;
	}
	b->used = 1;
	m->by_buf[buf] = b;
	m->allocated += (double)b->size;
	return 0;
}

/* Return buf's block to its pool, merged with free neighbours (free_block, try_merge_blocks). */
static void give(Model *m, int buf)
{
	Block *b = m->by_buf[buf];
	m->by_buf[buf] = NULL;
	b->used = 0;
	m->allocated -= (double)b->size;
	Block *n = b->next;
	if (n && !n->used) {
		b->size += n->size;
		b->next = n->next;
		if (n->next)
			n->next->prev = b;
		free(n);
	}
	Block *p = b->prev;
	if (p && !p->used) {
		p->size += b->size;
		p->next = b->next;
		if (b->next)
			b->next->prev = p;
		free(b);
	}
}

static void on_op(void *ctx, int op_index, int iteration, const Op *op, const double live[N_PLACES])
{
	Model *m = ctx;
	(void)op_index, (void)iteration, (void)live;
	if (m->failed || op->buf < 0 || op->buf >= m->n_bufs)
		return;
	if (op->kind == OP_ALLOC && op->place == PLACE_GPU) {
		if (outside(m, op))
			m->outside += op->bytes;
		else if (take(m, op->buf, op->bytes))
			m->failed = 1;
	} else if (op->kind == OP_FREE && m->by_buf[op->buf]) {
		give(m, op->buf);
	}
	peaks(m);
}

int alloc_replay(Schedule *s, int executor, const AllocConf *conf, AllocPeaks *out,
		 PxError *err)
{
	Model m = {.out = out, .n_bufs = s->n_bufs, .executor = executor, .grown = {-1, -1}};
	if (conf)
		m.conf = *conf;
	*out = (AllocPeaks){0};
	m.by_buf = calloc((size_t)(s->n_bufs > 0 ? s->n_bufs : 1), sizeof(*m.by_buf));
	MemResult mr;
	int rc = !m.by_buf ? px_fail(err, PX_ERR_RUNTIME, "out of memory")
			   : sim_memory(s, &mr, on_op, &m, err);
	if (!rc && m.failed)
		rc = px_fail(err, PX_ERR_RUNTIME, "out of memory");
	for (long long i = 0; i < m.n_segs; i++)
		for (Block *b = m.segs[i], *n; b; b = n) {
			n = b->next;
			free(b);
		}
	free(m.segs);
	free(m.seg_small);
	free(m.by_buf);
	return rc;
}

#include "kv_blocks.h"

#include <stdlib.h>
#include <string.h>

static void unlink_block(KvBlocks *p, long long b)
{
	p->next[p->prev[b]] = p->next[b];
	p->prev[p->next[b]] = p->prev[b];
	p->n_free--;
}

static void append(KvBlocks *p, long long b)
{
	long long tail = p->prev[p->n];
	p->next[tail] = b, p->prev[b] = tail;
	p->next[b] = p->n, p->prev[p->n] = b;
	p->n_free++;
}

void kv_blocks_reset(KvBlocks *p)
{
	p->next[p->n] = p->prev[p->n] = p->n;
	p->n_free = p->evicted = 0;
	for (long long b = 0; b < p->n; b++) {
		p->ref[b] = 0, p->key[b] = -1;
		append(p, b);
	}
}

int kv_blocks_init(KvBlocks *p, long long n)
{
	memset(p, 0, sizeof(*p));
	p->n = n;
	p->ref = malloc((size_t)n * sizeof(*p->ref));
	p->key = malloc((size_t)n * sizeof(*p->key));
	p->prev = malloc((size_t)(n + 1) * sizeof(*p->prev));
	p->next = malloc((size_t)(n + 1) * sizeof(*p->next));
	if (!p->ref || !p->key || !p->prev || !p->next) {
		kv_blocks_free(p);
		return -1;
	}
	kv_blocks_reset(p);
	return 0;
}

void kv_blocks_free(KvBlocks *p)
{
	free(p->ref);
	free(p->key);
	free(p->prev);
	free(p->next);
	memset(p, 0, sizeof(*p));
}

long long kv_blocks_take(KvBlocks *p, long long *dropped)
{
	long long b = p->next[p->n];
	*dropped = -1;
	if (b == p->n)
		return -1;
	unlink_block(p, b);
	if (p->key[b] >= 0) /* BlockPool._maybe_evict_cached_block */
		*dropped = p->key[b], p->key[b] = -1, p->evicted++;
	p->ref[b] = 1;
	return b;
}

void kv_blocks_touch(KvBlocks *p, long long b)
{
	if (p->ref[b]++ == 0)
		unlink_block(p, b);
}

void kv_blocks_drop(KvBlocks *p, long long b)
{
	if (--p->ref[b] == 0)
		append(p, b);
}

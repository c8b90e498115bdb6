/* kv_blocks: a KV cache's blocks as vLLM V1's BlockPool keeps them (vllm/v1/core/block_pool.py):
 * a reference count per block, a free queue whose front is taken first (blocks freed go to its
 * back, so the least recently freed is the first reused), and for the prefix cache the content
 * each full block holds, found by its key until the block is taken for other content. It knows
 * nothing of requests: the replay (infer_replay.c) names the keys and keeps the block tables. */
#ifndef PX_SIM_KV_BLOCKS_H
#define PX_SIM_KV_BLOCKS_H

typedef struct KvBlocks {
	long long n;          /* blocks */
	long long n_free;     /* in the free queue (the cached ones no request references too) */
	long long *ref;       /* (n) requests referencing each block */
	long long *prev, *next; /* (n + 1) the free queue, doubly linked; n its head and tail */
	long long *key;       /* (n) the content a full block holds, -1 none */
	long long evicted;    /* cached blocks taken for other content */
} KvBlocks;

/* p with n blocks, every one free in order 0 .. n-1, none cached. 0, or -1 out of memory
 * (p then holds nothing). kv_blocks_free frees it (and accepts a zeroed p). */
int kv_blocks_init(KvBlocks *p, long long n);
void kv_blocks_free(KvBlocks *p);
/* Every block free again in order, none cached (an empty cache). */
void kv_blocks_reset(KvBlocks *p);

/* The free queue's first block, referenced once and its content dropped (its key returned in
 * *dropped, -1 for none, so the caller forgets where that content was); -1 when none is free. */
long long kv_blocks_take(KvBlocks *p, long long *dropped);
/* Block b found in the cache by a request: one more reference, out of the free queue if no
 * request referenced it. */
void kv_blocks_touch(KvBlocks *p, long long b);
/* A request lets go of block b: one reference less, and at none the block joins the free queue's
 * back, keeping its content. */
void kv_blocks_drop(KvBlocks *p, long long b);

#endif

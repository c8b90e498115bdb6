/* pool: the CPU backend's allocator. Owns the address ranges it reserves from the system, the
 * memory it maps into them as they fill (mmap, mprotect), and the blocks carved from that; a
 * freed block stays mapped for the next request that fits, so that a training step's frees and
 * re-allocations of the same sizes map nothing new. Its figures (the bytes mapped now and at
 * their high-water mark) are the executor's measured memory, read from the mappings, never from
 * what a caller asked for. It knows nothing of places, categories or schedules (arena.h labels
 * the bytes). One thread at a time uses a pool (the runner's). docs/executor_memory.md describes
 * the policy. */
#ifndef PX_EXEC_POOL_H
#define PX_EXEC_POOL_H

#include <stddef.h>

enum {
	POOL_ALIGN = 64, /* every block starts on a cache line; sizes are rounded up to it */
};

/* Each class of request (small, large) has segments of its own: address ranges reserved without
 * memory (PROT_NONE), whose front is mapped read-write in steps of commit_bytes as blocks reach
 * it, so that neighbouring blocks of one segment merge when freed however they were carved.
 * Small requests never split (and fragment) the blocks that large ones reuse. */
typedef struct PoolConfig {
	size_t small_max_bytes; /* requests up to this (aligned) are small */
	size_t segment_bytes;   /* address space reserved for a segment (a larger request: its own) */
	size_t commit_bytes;    /* the mapped front grows in steps of this (a page multiple) */
} PoolConfig;

/* The executor's: small up to 64 KiB; 64 GiB of address space a segment, mapped 64 KiB at a
 * time. */
#define POOL_CONFIG_DEFAULT ((PoolConfig){64u << 10, (size_t)64 << 30, 64u << 10})

typedef struct PoolStats {
	size_t mapped_bytes;      /* mapped read-write from the system now: the segments' fronts */
	size_t mapped_peak_bytes; /* mapped_bytes' highest since creation or pool_reset_peak */
	size_t live_bytes;        /* blocks handed out now, as aligned */
	size_t asked_bytes;       /* what their callers asked for */
	size_t asked_peak_bytes;  /* asked_bytes' highest since creation or pool_reset_peak */
	long long reserves;       /* segments reserved (mmap) since creation */
	long long commits;        /* times a segment's mapped front grew (mprotect) */
	long long releases;       /* times memory went back to the system (pool_trim) */
	long long segments, live_blocks, free_blocks; /* now */
} PoolStats;

typedef struct Pool Pool;

/* An empty pool (nothing reserved); NULL when out of memory or cfg is unusable (a commit step
 * that is no page multiple, a small class above a segment). The caller destroys it. */
Pool *pool_create(const PoolConfig *cfg);
/* Unmap everything, live blocks included. NULL is fine. */
void pool_destroy(Pool *p);

/* bytes (at least one) of zeroed memory aligned to POOL_ALIGN, valid until pool_free; NULL when
 * the system refuses the memory. */
void *pool_alloc(Pool *p, size_t bytes);
/* The same, its contents left as they are (torch.empty): memory no earlier block wrote is still
 * zero as mapped, and none of it is touched, so that pages nobody writes never become resident. */
void *pool_alloc_empty(Pool *p, size_t bytes);
/* Give back a pointer pool_alloc returned (NULL is fine); it stays mapped for reuse. A pointer
 * the pool did not hand out is a caller's bug: it aborts naming it. */
void pool_free(Pool *p, void *ptr);

/* Give back to the system what lies beyond each segment's last live block, and the segments
 * with none (after set-up, before training). */
void pool_trim(Pool *p);
/* The high-water marks start again from what is mapped and asked now. */
void pool_reset_peak(Pool *p);
void pool_stats(const Pool *p, PoolStats *out);

#endif

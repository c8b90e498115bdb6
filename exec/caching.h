/* caching: an allocator of the design of PyTorch's CUDA caching allocator
 * (c10/cuda/CUDACachingAllocator.cpp), for the CUDA backend's device memory: requests rounded to
 * 512 bytes; small ones (up to 1 MiB) carved from 2 MiB segments, 1-10 MiB ones from 20 MiB
 * segments, larger ones from segments of their size rounded to 2 MiB; the best-fitting cached
 * block (smallest, then lowest address) of the request's pool reused, split when what is left is
 * worth keeping, merged with free neighbours when freed; segments never given back until the
 * allocator is destroyed. It owns the blocks and their bookkeeping, not the memory: segments come
 * from a source's map and go back through its unmap (cudaMalloc and cudaFree on CUDA; anything in
 * the tests). Its figures (allocated: the blocks handed out, as rounded; reserved: the segments
 * mapped) are what the executor measures against sim/allocator.h's model of the same rules,
 * implemented apart. One stream: a freed block is reused in stream order, as PyTorch's is.
 * PYTORCH_CUDA_ALLOC_CONF's max_split_size_mb, max_non_split_rounding_mb, roundup_power2_divisions
 * and expandable_segments (engine/allocconf.h) change those rules as PyTorch's do: see
 * caching_create. */
#ifndef PX_EXEC_CACHING_H
#define PX_EXEC_CACHING_H

#include <stddef.h>

#include "../engine/allocconf.h"

typedef struct CachingSource {
	void *(*map)(void *ctx, size_t bytes); /* a segment of bytes, NULL when refused */
	void (*unmap)(void *ctx, void *segment);
	/* For expandable segments: reserve address space of bytes with nothing usable yet (NULL
	 * when refused), make [ptr, ptr + bytes) of it usable (0, or -1 when refused), and give the
	 * whole reservation back. NULL where the source has none. */
	void *(*reserve)(void *ctx, size_t bytes);
	int (*commit)(void *ctx, void *ptr, size_t bytes);
	void (*release)(void *ctx, void *base, size_t bytes);
	size_t reserve_bytes; /* the address space each expandable segment reserves */
	void *ctx;
} CachingSource;

typedef struct CachingStats {
	size_t allocated_bytes, allocated_peak_bytes; /* blocks handed out (rounded sizes) */
	size_t reserved_bytes, reserved_peak_bytes;   /* segments mapped */
	long long segments, maps;                     /* segments now; source maps since creation */
} CachingStats;

typedef struct Caching Caching;

/* An empty allocator over src (copied), with conf's options (NULL: PyTorch's defaults): under
 * max_split_size_mb a block at or above it is neither split nor handed to a request below it,
 * nor to one at or above it that it exceeds by max_non_split_rounding_mb (20 MiB) or more; under
 * roundup_power2_divisions a request is rounded to a division of its power-of-two interval; under expandable_segments each
 * pool (small, large) is one reservation of src->reserve_bytes that grows by the pages (2 MiB,
 * 20 MiB) a request lacks, committed after its last block and merged with it when that one is
 * free, and any block splits where a minimum block is left. NULL when out of host memory, or
 * when conf asks for expandable segments of a source without reserve. The caller destroys it. */
Caching *caching_create(const CachingSource *src, const AllocConf *conf);
/* Unmap every segment, live blocks included. NULL is fine. */
void caching_destroy(Caching *c);
/* A block of at least bytes (its start 512-byte aligned if the segments are); NULL when the
 * source refuses a segment. Contents as the block's last user left them. */
void *caching_alloc(Caching *c, size_t bytes);
/* Give back a pointer caching_alloc returned (NULL is fine); it stays cached. A pointer it did
 * not hand out is a caller's bug: returns -1 and changes nothing; else 0. */
int caching_free(Caching *c, void *ptr);
void caching_stats(const Caching *c, CachingStats *out);
/* The high-water marks start again from now. */
void caching_reset_peak(Caching *c);

#endif

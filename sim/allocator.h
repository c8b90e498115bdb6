/* allocator: a model of PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp),
 * replaying a schedule's device allocations as the framework would request them. Owns the
 * allocator's rules (512-byte rounding, the small and large pools, 2 MiB and 20 MiB segments,
 * best-fit reuse, block splitting and merging) and the peaks they give: torch's
 * max_memory_allocated and max_memory_reserved, and what nvidia-smi shows (reserved plus what
 * lives outside the allocator). It does not decide what is allocated when: the schedule does. */
#ifndef PX_SIM_ALLOCATOR_H
#define PX_SIM_ALLOCATOR_H

#include <stddef.h>

#include "../engine/allocconf.h"
#include "../engine/err.h"
#include "../engine/schedule.h"

/* The allocator's constants (CUDACachingAllocator.cpp) */
#define ALLOC_MIN_BLOCK ((size_t)512)          /* kMinBlockSize: every size rounded to it */
#define ALLOC_SMALL_SIZE ((size_t)1 << 20)     /* kSmallSize: the largest small request */
#define ALLOC_SMALL_BUFFER ((size_t)2 << 20)   /* kSmallBuffer: a small pool's segment */
#define ALLOC_LARGE_BUFFER ((size_t)20 << 20)  /* kLargeBuffer: a segment for 1-10 MiB */
#define ALLOC_MIN_LARGE ((size_t)10 << 20)     /* kMinLargeAlloc */
#define ALLOC_ROUND_LARGE ((size_t)2 << 20)    /* kRoundLarge: larger segments' rounding */
/* Under expandable_segments an allocator's pool grows by pages of kSmallBuffer (small) or
 * kLargeBuffer (large). */

/* A request's size as the allocator rounds it (round_size: to 512 bytes, or under conf's
 * roundup_power2_divisions to a division of its power-of-two interval; conf NULL: PyTorch's
 * defaults) and the segment it would map for it when no cached block fits (get_allocation_size). */
size_t alloc_round_bytes(size_t request, const AllocConf *conf);
size_t alloc_segment_bytes(size_t rounded);

typedef struct AllocPeaks {
	double allocated_bytes; /* max_memory_allocated: the blocks handed out, rounded sizes */
	double reserved_bytes;  /* max_memory_reserved: the segments mapped (cudaMalloc) */
	double outside_bytes;   /* outside the allocator: CUDA context, NCCL's own buffers */
	double smi_bytes;       /* what nvidia-smi shows at the reserved peak: reserved + outside */
	long long segments;     /* segments mapped at the reserved peak */
} AllocPeaks;

/* Replay schedule s's GPU allocations through the model (the whole walk, every micro-batch: the
 * pools' state carries over). Nothing is ever released to the device (no empty_cache, no
 * capacity: the peaks are those of a device large enough). executor: the Parallax executor's
 * process (exec/caching.h: PX_CUDA_ALLOC=caching, or PX_CPU_ALLOC=caching for the CPU backend's
 * device place), whose cuBLAS workspace (CUDA) its context takes with cudaMalloc, outside the
 * allocator; else PyTorch's, which hands cuBLAS one. conf: PYTORCH_CUDA_ALLOC_CONF's
 * expandable_segments (each pool one segment, grown by the pages a request lacks: reserved is
 * what is mapped), max_split_size_mb (no block at or above it split or handed to a request
 * below it), max_non_split_rounding_mb and roundup_power2_divisions; NULL: PyTorch's defaults. */
int alloc_replay(Schedule *s, int executor, const AllocConf *conf, AllocPeaks *out,
		 PxError *err);

#endif

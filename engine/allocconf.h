/* allocconf: PyTorch's caching-allocator settings, the PYTORCH_CUDA_ALLOC_CONF environment
 * variable's text (c10/cuda/CUDAAllocatorConfig.cpp, c10/core/AllocatorConfig.cpp in newer
 * releases), as a scenario's "pytorch_cuda_alloc_conf" gives it: the options that change which
 * memory the allocator maps (expandable_segments, max_split_size_mb, max_non_split_rounding_mb,
 * roundup_power2_divisions), read into one struct that the allocator model (sim/allocator.c) and
 * the executor's allocator (exec/caching.c) both take. It does not apply them. */
#ifndef PX_ALLOCCONF_H
#define PX_ALLOCCONF_H

#include <stddef.h>

#include "err.h"

/* roundup_power2_divisions' intervals (kRoundUpPowerOfTwoIntervals): sizes in [2^(20+i),
 * 2^(21+i)) take entry i, those below 2 MiB entry 0, those of 32 GiB or more entry 15. */
#define ALLOC_CONF_INTERVALS 16

typedef struct AllocConf {
	int expandable;         /* expandable_segments:True */
	double max_split_bytes; /* max_split_size_mb in bytes; 0: no limit (PyTorch's default) */
	/* max_non_split_rounding_mb in bytes: how much larger than a request at or above
	 * max_split_size a cached block it takes may be; 0: kLargeBuffer (20 MiB, the default) */
	double max_non_split_bytes;
	/* roundup_power2_divisions per interval: a request of size in interval i above 512 times
	 * its divisions is rounded up to the next of divisions equal steps between the powers of
	 * two around it; 0 or 1: to 512 bytes only (PyTorch's default) */
	unsigned divisions[ALLOC_CONF_INTERVALS];
} AllocConf;

/* The roundup_power2_divisions entry for a request of size bytes (roundup_power2_divisions(size)):
 * conf's divisions[i] for the interval it falls in. */
unsigned alloc_conf_divisions(const AllocConf *conf, size_t size);

/* Parse text ("expandable_segments:True,max_split_size_mb:512"): options separated by commas,
 * each "key:value" (PyTorch's own lexer, which also splits on ':' and brackets).
 * roundup_power2_divisions is one power of two for every size ("4") or a list of "MiB:divisions"
 * entries, MiB a power of two naming the interval [MiB, 2 MiB), the first entry's divisions also
 * for every smaller size, and ">:divisions" for the last entry's interval and above (PyTorch's
 * parseRoundUpPower2Divisions: "[256:1,512:2,1024:4,>:8]" gives sizes from 1 GiB 8 divisions, not
 * 4). Options PyTorch knows that change nothing Parallax prices (garbage_collection_threshold,
 * whose collection only runs under a memory fraction; the pinned-memory and backend ones) are
 * noted as not modelled; an option PyTorch does not know, or a bad value, is refused naming where
 * (a file and key) and what was expected. out is zeroed first. */
int alloc_conf_parse(const char *text, const char *where, AllocConf *out, PxNotes *notes,
		     PxError *err);

/* conf in words for a report line (" with expandable_segments, max_split_size_mb 512"; "" for
 * PyTorch's defaults), cut to n bytes; roundup_power2_divisions by interval as "[MiB:divisions,...]"
 * where it changes. */
void alloc_conf_describe(const AllocConf *conf, char *buf, size_t n);

#endif

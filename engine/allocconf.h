/* allocconf: PyTorch's caching-allocator settings, the PYTORCH_CUDA_ALLOC_CONF environment
 * variable's text (c10/cuda/CUDAAllocatorConfig.cpp), as a scenario's "pytorch_cuda_alloc_conf"
 * gives it: the options that change which memory the allocator maps (expandable_segments,
 * max_split_size_mb), read into one struct that the allocator model (sim/allocator.c) and the
 * executor's allocator (exec/caching.c) both take. It does not apply them. */
#ifndef PX_ALLOCCONF_H
#define PX_ALLOCCONF_H

#include "err.h"

typedef struct AllocConf {
	int expandable;         /* expandable_segments:True */
	double max_split_bytes; /* max_split_size_mb in bytes; 0: no limit (PyTorch's default) */
} AllocConf;

/* Parse text ("expandable_segments:True,max_split_size_mb:512"): options separated by commas,
 * each "key:value" (PyTorch's own lexer, which also splits on ':' and brackets). Options PyTorch
 * knows that change nothing Parallax prices (garbage_collection_threshold, whose collection only
 * runs under a memory fraction; roundup_power2_divisions; the pinned-memory and backend ones) are
 * noted as not modelled; an option PyTorch does not know, or a bad value, is refused naming where
 * (a file and key) and what was expected. out is zeroed first. */
int alloc_conf_parse(const char *text, const char *where, AllocConf *out, PxNotes *notes,
		     PxError *err);

#endif

/* sparse_layout: DeepSpeed's block-sparse attention layouts (deepspeed/ops/sparse_attention/
 * sparsity_config.py: dense, fixed, variable, bigbird, bslongformer): the settings with DeepSpeed's
 * defaults, the checks its constructors make, and which key blocks each query block of each head
 * attends to, row by row so that a 64k sequence's layout is counted without being stored; also
 * reading ds_config.json's sparse_attention section (dsconfig.c calls it). It prices nothing
 * (activ.c, model.c's products, sim/).
 * Dimension names: nb = blocks per sequence (s / block), r = a query block row, h = a head. */
#ifndef PX_SPARSE_LAYOUT_H
#define PX_SPARSE_LAYOUT_H

#include <stdint.h>

#include "err.h"
#include "jdoc.h"

typedef enum {
	SPARSE_OFF, /* no sparse_attention section: attention is dense */
	SPARSE_DENSE, SPARSE_FIXED, SPARSE_VARIABLE, SPARSE_BIGBIRD, SPARSE_BSLONGFORMER,
} SparseMode;

#define SPARSE_MAX_LIST 64 /* entries of local_window_blocks and global_block_indices */

/* The random blocks (bigbird, variable) come from our own generator, seeded by this constant, the
 * head and the row (sparse_layout.c); DeepSpeed draws them with Python's random.sample, so a layout
 * with random blocks has the same count of them per row as DeepSpeed's, not the same columns. */
#define SPARSE_SEED 0x5eed5ba75eULL

typedef struct SparseAttn {
	SparseMode mode;
	long long block;                 /* tokens per block side */
	int different_layout_per_head;
	int unidirectional;              /* attention "unidirectional" (else "bidirectional") */
	int horizontal_global_attention; /* fixed, variable: global blocks also attend to all */
	long long num_local_blocks;      /* fixed: the local window */
	long long num_global_blocks;     /* fixed: per window; bigbird: the leading blocks */
	long long num_different_global_patterns; /* fixed */
	long long num_random_blocks;     /* bigbird, variable: per row */
	long long num_sliding_window_blocks; /* bigbird, bslongformer */
	long long local_window_blocks[SPARSE_MAX_LIST]; /* variable; the last one repeats */
	int n_local_windows;
	long long global_block_indices[SPARSE_MAX_LIST]; /* variable, bslongformer */
	long long global_block_end_indices[SPARSE_MAX_LIST]; /* when has_global_end: exclusive ends */
	int n_global, has_global_end;
} SparseAttn;

/* mode's settings as DeepSpeed's runtime/config.py fills them from an empty section
 * (runtime/constants.py SPARSE_*_DEFAULT): block 16, one layout for all heads, bidirectional,
 * num_local_blocks 4, num_global_blocks 1, one global pattern, no random blocks, a sliding window
 * of 3, local_window_blocks [4], global_block_indices [0] without ends. */
void sparse_attn_defaults(SparseAttn *sa, SparseMode mode);
/* "fixed", ..., "dense" (SPARSE_OFF: "off"). */
const char *sparse_mode_name(SparseMode mode);

/* The checks of the mode's SparsityConfig constructor that need no sequence. 0, or -1 with *key
 * the offending key (a static string) and why its explanation ("must divide num_local_blocks 4,
 * got 3"). */
int sparse_attn_check(const SparseAttn *sa, const char **key, char *why, size_t n);
/* The checks make_layout makes for a sequence of seq tokens: block divides it, and it has at
 * least as many blocks as the window, random and global blocks a row takes. Same return. */
int sparse_attn_check_seq(const SparseAttn *sa, long long seq, const char **key, char *why,
			  size_t n);

/* Read a sparse_attention section as DeepSpeed's runtime/config.py does (its defaults for what is
 * absent), then sparse_attn_check: errors name the file, line, key and what was expected; keys the
 * mode does not read and unknown keys are warned about. */
int sparse_attn_parse(const JsonObj *o, SparseAttn *sa, PxNotes *notes, PxError *err);

/* Blocks per sequence: seq / block. */
long long sparse_layout_blocks(const SparseAttn *sa, long long seq);
/* Row r of head h's layout (nb blocks) as bits (bit c of word c / 64: key block c is computed);
 * bits holds (nb + 63) / 64 words and is overwritten. Returns the row's blocks. The settings must
 * pass both checks. */
long long sparse_layout_row(const SparseAttn *sa, long long h, long long nb, long long r,
			    uint64_t *bits);
/* Non-zero blocks over all heads of a layout for seq tokens (a heads): the blocks the sparse
 * kernels compute, each block x block scores; and, when causal_pairs is not NULL, the (query,
 * key) pairs a causal model's kernel visits among them (keys at or before the query: a block
 * left of the diagonal block^2, the diagonal block block (block + 1) / 2, one right of it none).
 * 0, or -1 (out of memory) with err. */
int sparse_layout_count(const SparseAttn *sa, long long heads, long long seq, double *blocks,
			double *causal_pairs, PxError *err);
/* The whole layout, heads x nb x nb bytes of 0/1, for the kernels and tests; caller frees; NULL
 * when out of memory. */
unsigned char *sparse_layout_create(const SparseAttn *sa, long long heads, long long nb);

#endif

#include "sparse_layout.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- settings ---- */

void sparse_attn_defaults(SparseAttn *sa, SparseMode mode)
{
	memset(sa, 0, sizeof(*sa));
	sa->mode = mode;
	sa->block = 16;
	sa->num_local_blocks = 4;
	sa->num_global_blocks = 1;
	sa->num_different_global_patterns = 1;
	sa->num_sliding_window_blocks = 3;
	sa->local_window_blocks[0] = 4;
	sa->n_local_windows = 1;
	sa->n_global = 1; /* global_block_indices [0] */
}

const char *sparse_mode_name(SparseMode mode)
{
	static const char *const names[] = {"off", "dense", "fixed", "variable", "bigbird",
					    "bslongformer"};
	return names[mode];
}

static int bad(const char **key, const char *k, char *why, size_t n, const char *fmt, ...)
	__attribute__((format(printf, 5, 6)));
static int bad(const char **key, const char *k, char *why, size_t n, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	*key = k;
	vsnprintf(why, n, fmt, ap);
	va_end(ap);
	return -1;
}

/* global_block_indices against global_block_end_indices (variable and bslongformer) */
static int check_global_ends(const SparseAttn *sa, const char **key, char *why, size_t n)
{
	if (!sa->has_global_end)
		return 0;
	for (int i = 0; i < sa->n_global; i++)
		if (sa->global_block_indices[i] >= sa->global_block_end_indices[i])
			return bad(key, "global_block_end_indices", why, n,
				   "each end must be above its start: global_block_indices %lld has "
				   "end %lld", sa->global_block_indices[i],
				   sa->global_block_end_indices[i]);
	return 0;
}

int sparse_attn_check(const SparseAttn *sa, const char **key, char *why, size_t n)
{
	if (sa->mode == SPARSE_FIXED) {
		if (sa->num_local_blocks % sa->num_global_blocks)
			return bad(key, "num_global_blocks", why, n,
				   "must divide num_local_blocks %lld, got %lld", sa->num_local_blocks,
				   sa->num_global_blocks);
		if (sa->num_different_global_patterns > 1 && !sa->different_layout_per_head)
			return bad(key, "num_different_global_patterns", why, n,
				   "must be 1 unless different_layout_per_head is true, got %lld",
				   sa->num_different_global_patterns);
		long long most = sa->num_local_blocks / sa->num_global_blocks;
		if (sa->num_different_global_patterns > most)
			return bad(key, "num_different_global_patterns", why, n,
				   "must be at most num_local_blocks / num_global_blocks = %lld, got %lld",
				   most, sa->num_different_global_patterns);
	}
	if ((sa->mode == SPARSE_FIXED || sa->mode == SPARSE_VARIABLE) && sa->unidirectional &&
	    sa->horizontal_global_attention)
		return bad(key, "horizontal_global_attention", why, n,
			   "needs attention \"bidirectional\"");
	if (sa->mode == SPARSE_VARIABLE || sa->mode == SPARSE_BSLONGFORMER)
		return check_global_ends(sa, key, why, n);
	/* random.sample(range(0, row + 1), k) has one block to draw from on the first row */
	if (sa->mode == SPARSE_BIGBIRD && sa->unidirectional && sa->num_random_blocks > 1)
		return bad(key, "num_random_blocks", why, n,
			   "must be at most 1 with attention \"unidirectional\" (DeepSpeed samples "
			   "each row's random blocks from the blocks up to it, one on the first row), "
			   "got %lld", sa->num_random_blocks);
	return 0;
}

long long sparse_layout_blocks(const SparseAttn *sa, long long seq)
{
	return sa->block > 0 ? seq / sa->block : 0;
}

int sparse_attn_check_seq(const SparseAttn *sa, long long seq, const char **key, char *why,
			  size_t n)
{
	if (sa->mode == SPARSE_OFF)
		return 0;
	if (seq % sa->block)
		return bad(key, "block", why, n, "must divide the sequence length %lld, got %lld", seq,
			   sa->block);
	long long nb = seq / sa->block;
	int random = sa->mode == SPARSE_BIGBIRD || sa->mode == SPARSE_VARIABLE;
	int sliding = sa->mode == SPARSE_BIGBIRD || sa->mode == SPARSE_BSLONGFORMER;
	if (random && sa->num_random_blocks > nb)
		return bad(key, "num_random_blocks", why, n,
			   "must be at most the %lld blocks of a row, got %lld", nb,
			   sa->num_random_blocks);
	if (sliding && sa->num_sliding_window_blocks > nb)
		return bad(key, "num_sliding_window_blocks", why, n,
			   "must be at most the %lld blocks of a row, got %lld", nb,
			   sa->num_sliding_window_blocks);
	if ((sa->mode == SPARSE_BIGBIRD || sa->mode == SPARSE_FIXED) && sa->num_global_blocks > nb)
		return bad(key, "num_global_blocks", why, n,
			   "must be at most the %lld blocks of a row, got %lld", nb,
			   sa->num_global_blocks);
	return 0;
}

/* ---- rows ---- */

static void set_range(uint64_t *bits, long long lo, long long hi)
{
	for (long long c = lo < 0 ? 0 : lo; c < hi; c++)
		bits[c >> 6] |= 1ULL << (c & 63);
}

static int has(const uint64_t *bits, long long c)
{
	return (int)((bits[c >> 6] >> (c & 63)) & 1);
}

/* keep columns 0..r only (torch.tril on the block layout) */
static void keep_lower(uint64_t *bits, long long nb, long long r)
{
	for (long long c = r + 1; c < nb; c++)
		bits[c >> 6] &= ~(1ULL << (c & 63));
}

/* splitmix64: the row's own stream, so rows are drawn in any order */
static uint64_t mix(uint64_t *state)
{
	uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

/* k distinct columns of [0, range) into an empty row (Floyd's sampling, as random.sample draws k
 * distinct ones), from the stream of (head, row) */
static void set_random(uint64_t *bits, long long range, long long k, long long h, long long r)
{
	uint64_t st = SPARSE_SEED ^ ((uint64_t)h * 0x100000001b3ULL) ^ ((uint64_t)r << 20);
	for (long long j = range - k; j < range; j++) {
		long long c = (long long)(mix(&st) % (uint64_t)(j + 1));
		set_range(bits, has(bits, c) ? j : c, (has(bits, c) ? j : c) + 1);
	}
}

/* the layout a head uses: its own, or head 0's for all */
static long long layout_head(const SparseAttn *sa, long long h)
{
	return sa->different_layout_per_head ? h : 0;
}

/* FixedSparsityConfig: local windows of num_local_blocks; in each full window the global blocks
 * counted back from its end by the head's pattern, in a trailing partial window the same offset
 * clipped to fit; attended to by every row (bidirectional) or the rows from them on. */
static void fixed_row(const SparseAttn *sa, long long h, long long nb, long long r, uint64_t *bits)
{
	long long L = sa->num_local_blocks, G = sa->num_global_blocks;
	long long i0 = r / L * L, end = i0 + L < nb ? i0 + L : nb;
	set_range(bits, i0, sa->unidirectional ? r + 1 : end);
	long long first = L - (1 + h % sa->num_different_global_patterns) * G;
	long long full = nb - nb % L;
	for (long long i = first; i < full; i += L) {
		if (!sa->unidirectional || r >= i)
			set_range(bits, i, i + G);
		if (sa->horizontal_global_attention && r >= i && r < i + G)
			set_range(bits, 0, nb);
	}
	if (full < nb) {
		long long start = full + first < nb - G ? full + first : nb - G;
		if (!sa->unidirectional || r >= start)
			set_range(bits, start, start + G);
		if (sa->horizontal_global_attention && r >= start && r < start + G)
			set_range(bits, 0, nb);
	}
}

/* the global blocks of variable and bslongformer: [start, end) per entry (end = start + 1 without
 * end indices), clipped to the sequence; rows attend to them from row 0 (bidirectional) or from
 * start on; with `rows` they attend to every block */
static void global_list(const SparseAttn *sa, long long nb, long long r, uint64_t *bits, int rows)
{
	for (int g = 0; g < sa->n_global; g++) {
		long long s = sa->global_block_indices[g];
		long long e = sa->has_global_end ? sa->global_block_end_indices[g] : s + 1;
		if (s >= nb)
			continue;
		e = e < nb ? e : nb;
		if (rows && r >= s && r < e)
			set_range(bits, 0, nb);
		if (!sa->unidirectional || r >= s)
			set_range(bits, s, e);
	}
}

/* VariableSparsityConfig: random blocks over the whole row (in either direction), the listed local
 * windows then windows of the last size, global blocks */
static void variable_row(const SparseAttn *sa, long long h, long long nb, long long r,
			 uint64_t *bits)
{
	set_random(bits, nb, sa->num_random_blocks, h, r);
	long long start = 0, end = 0, w = 1;
	for (int i = 0; i < sa->n_local_windows; i++) {
		w = sa->local_window_blocks[i];
		end = end + w < nb ? end + w : nb;
		if (r >= start && r < end)
			set_range(bits, start, sa->unidirectional ? r + 1 : end);
		start += w;
	}
	if (r >= start) {
		long long i0 = start + (r - start) / w * w, e = i0 + w < nb ? i0 + w : nb;
		set_range(bits, i0, sa->unidirectional ? r + 1 : e);
	}
	global_list(sa, nb, r, bits, sa->horizontal_global_attention);
}

static void sliding(const SparseAttn *sa, long long nb, long long r, uint64_t *bits)
{
	long long w = sa->num_sliding_window_blocks / 2;
	set_range(bits, r - w, r + w + 1 < nb ? r + w + 1 : nb);
}

/* BigBirdSparsityConfig: random, sliding window, the leading num_global_blocks rows and columns;
 * unidirectional keeps the lower triangle of the whole */
static void bigbird_row(const SparseAttn *sa, long long h, long long nb, long long r,
			uint64_t *bits)
{
	set_random(bits, sa->unidirectional ? r + 1 : nb, sa->num_random_blocks, h, r);
	sliding(sa, nb, r, bits);
	if (r < sa->num_global_blocks)
		set_range(bits, 0, nb);
	set_range(bits, 0, sa->num_global_blocks);
	if (sa->unidirectional)
		keep_lower(bits, nb, r);
}

/* BSLongformerSparsityConfig: sliding window, global rows and columns; unidirectional keeps the
 * lower triangle */
static void bslongformer_row(const SparseAttn *sa, long long nb, long long r, uint64_t *bits)
{
	sliding(sa, nb, r, bits);
	int uni = sa->unidirectional;
	SparseAttn bi = *sa; /* the global blocks are set in both directions, then the triangle kept */
	bi.unidirectional = 0;
	global_list(&bi, nb, r, bits, 1);
	if (uni)
		keep_lower(bits, nb, r);
}

static long long popcount_row(const uint64_t *bits, long long words)
{
	long long n = 0;
	for (long long i = 0; i < words; i++)
		n += __builtin_popcountll(bits[i]);
	return n;
}

long long sparse_layout_row(const SparseAttn *sa, long long h, long long nb, long long r,
			    uint64_t *bits)
{
	long long words = (nb + 63) / 64, lh = layout_head(sa, h);
	memset(bits, 0, (size_t)words * sizeof(*bits));
	switch (sa->mode) {
	case SPARSE_OFF:
	case SPARSE_DENSE: set_range(bits, 0, nb); break;
	case SPARSE_FIXED: fixed_row(sa, lh, nb, r, bits); break;
	case SPARSE_VARIABLE: variable_row(sa, lh, nb, r, bits); break;
	case SPARSE_BIGBIRD: bigbird_row(sa, lh, nb, r, bits); break;
	case SPARSE_BSLONGFORMER: bslongformer_row(sa, nb, r, bits); break;
	}
	return popcount_row(bits, words);
}

/* ---- whole layouts ---- */

/* heads whose layouts can differ: every head's with different_layout_per_head (fixed's repeat
 * every num_different_global_patterns heads; bslongformer's and dense's never differ) */
static long long distinct_heads(const SparseAttn *sa, long long heads)
{
	if (!sa->different_layout_per_head)
		return 1;
	if (sa->mode == SPARSE_FIXED)
		return heads < sa->num_different_global_patterns ? heads :
								   sa->num_different_global_patterns;
	if (sa->mode == SPARSE_BIGBIRD || sa->mode == SPARSE_VARIABLE)
		return heads;
	return 1;
}

/* The causal pairs of row r's kept blocks (bits): block^2 for each left of the diagonal, block
 * (block + 1) / 2 for the diagonal one; counted a word at a time. */
static double causal_row_pairs(const uint64_t *bits, long long r, long long bs)
{
	long long left = 0;
	for (long long w = 0; w <= r / 64; w++) {
		uint64_t word = bits[w];
		if (w == r / 64) /* the blocks before r in its word */
			word &= r % 64 ? (~0ULL >> (64 - r % 64)) : 0;
		left += __builtin_popcountll(word);
	}
	int diag = (int)(bits[r / 64] >> (r % 64) & 1);
	return (double)left * (double)(bs * bs) + (diag ? (double)(bs * (bs + 1) / 2) : 0);
}

int sparse_layout_count(const SparseAttn *sa, long long heads, long long seq, double *blocks,
			double *causal_pairs, PxError *err)
{
	long long nb = sparse_layout_blocks(sa, seq), dh = distinct_heads(sa, heads), bs = sa->block;
	uint64_t *bits = calloc((size_t)((nb + 63) / 64 + 1), sizeof(*bits));
	if (!bits)
		return px_fail(err, PX_ERR_RUNTIME, "out of memory");
	*blocks = 0;
	if (causal_pairs)
		*causal_pairs = 0;
	for (long long h = 0; h < dh; h++) {
		/* head h's layout serves the heads h, h + dh, h + 2 dh, ... below `heads` */
		double uses = (double)((heads - 1 - h) / dh + 1), n = 0, pairs = 0;
		for (long long r = 0; r < nb; r++) {
			n += (double)sparse_layout_row(sa, h, nb, r, bits);
			if (causal_pairs)
				pairs += causal_row_pairs(bits, r, bs);
		}
		*blocks += uses * n;
		if (causal_pairs)
			*causal_pairs += uses * pairs;
	}
	free(bits);
	return 0;
}

unsigned char *sparse_layout_create(const SparseAttn *sa, long long heads, long long nb)
{
	unsigned char *lay = malloc((size_t)(heads * nb * nb));
	uint64_t *bits = calloc((size_t)((nb + 63) / 64 + 1), sizeof(*bits));
	if (!lay || !bits) {
		free(lay);
		free(bits);
		return NULL;
	}
	for (long long h = 0; h < heads; h++)
		for (long long r = 0; r < nb; r++) {
			sparse_layout_row(sa, h, nb, r, bits);
			for (long long c = 0; c < nb; c++)
				lay[(h * nb + r) * nb + c] = (unsigned char)has(bits, c);
		}
	free(bits);
	return lay;
}

/* ---- reading ds_config.json's sparse_attention ---- */

/* Which modes read each key (runtime/config.py get_sparse_*_config, plus "attention" wherever the
 * mode's SparsityConfig takes it); a key the mode does not read is warned about as DeepSpeed
 * ignores it. */
#define M_(m) (1u << (m))
#define M_ALL (M_(SPARSE_DENSE) | M_(SPARSE_FIXED) | M_(SPARSE_VARIABLE) | M_(SPARSE_BIGBIRD) | \
	       M_(SPARSE_BSLONGFORMER))
static const struct {
	const char *key;
	unsigned modes;
} SPARSE_KEYS[] = {
	{"mode", M_ALL},
	{"block", M_ALL},
	{"different_layout_per_head", M_ALL & ~M_(SPARSE_DENSE)},
	{"attention", M_ALL & ~M_(SPARSE_DENSE)},
	{"num_local_blocks", M_(SPARSE_FIXED)},
	{"num_global_blocks", M_(SPARSE_FIXED) | M_(SPARSE_BIGBIRD)},
	{"horizontal_global_attention", M_(SPARSE_FIXED) | M_(SPARSE_VARIABLE)},
	{"num_different_global_patterns", M_(SPARSE_FIXED)},
	{"num_random_blocks", M_(SPARSE_VARIABLE) | M_(SPARSE_BIGBIRD)},
	{"local_window_blocks", M_(SPARSE_VARIABLE)},
	{"global_block_indices", M_(SPARSE_VARIABLE) | M_(SPARSE_BSLONGFORMER)},
	{"global_block_end_indices", M_(SPARSE_VARIABLE) | M_(SPARSE_BSLONGFORMER)},
	{"num_sliding_window_blocks", M_(SPARSE_BIGBIRD) | M_(SPARSE_BSLONGFORMER)},
};
#define N_SPARSE_KEYS ((int)(sizeof(SPARSE_KEYS) / sizeof(SPARSE_KEYS[0])))

/* A list of block counts or indices (each lo or more, at most SPARSE_MAX_LIST); 0 when absent. */
static int read_list(const JsonObj *o, const char *key, long long lo, long long *out, int *n,
		     PxError *err)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o->obj, key);
	if (!v || cJSON_IsNull(v))
		return 0;
	int len = cJSON_IsArray(v) ? cJSON_GetArraySize(v) : -1;
	for (int i = 0; i < len; i++) {
		const cJSON *e = cJSON_GetArrayItem(v, i);
		if (!cJSON_IsNumber(e) || e->valuedouble != (double)(long long)e->valuedouble ||
		    e->valuedouble < (double)lo || e->valuedouble > 1e12) {
			len = -1;
			break;
		}
		out[i] = (long long)e->valuedouble;
	}
	if (len < 1 || len > SPARSE_MAX_LIST) {
		char where[512];
		jobj_where(o, key, where, sizeof(where));
		return px_fail(err, PX_ERR_INPUT, "%s: %s.%s: expected a list of 1 to %d integers of "
			       "at least %lld", where, o->name, key, SPARSE_MAX_LIST, lo);
	}
	*n = len;
	return 1;
}

static int read_lists(const JsonObj *o, SparseAttn *sa, PxError *err)
{
	int n_end = 0, rc;
	if (read_list(o, "local_window_blocks", 1, sa->local_window_blocks, &sa->n_local_windows,
		      err) < 0 ||
	    read_list(o, "global_block_indices", 0, sa->global_block_indices, &sa->n_global,
		      err) < 0)
		return -1;
	if ((rc = read_list(o, "global_block_end_indices", 1, sa->global_block_end_indices, &n_end,
			    err)) < 0)
		return -1;
	sa->has_global_end = rc;
	if (rc && n_end != sa->n_global) {
		char where[512];
		jobj_where(o, "global_block_end_indices", where, sizeof(where));
		return px_fail(err, PX_ERR_INPUT, "%s: %s.global_block_end_indices: expected as many "
			       "entries as global_block_indices (%d), got %d", where, o->name,
			       sa->n_global, n_end);
	}
	return 0;
}

/* each key the mode does not read: a warning naming it */
static int warn_unread(const JsonObj *o, const SparseAttn *sa, PxNotes *notes)
{
	for (int i = 0; i < N_SPARSE_KEYS; i++) {
		if ((SPARSE_KEYS[i].modes & M_(sa->mode)) ||
		    !cJSON_HasObjectItem(o->obj, SPARSE_KEYS[i].key))
			continue;
		char where[512];
		jobj_where(o, SPARSE_KEYS[i].key, where, sizeof(where));
		if (px_notes_warn(notes, "%s: warning: %s.%s has no effect in mode \"%s\" (DeepSpeed "
				  "does not read it)", where, o->name, SPARSE_KEYS[i].key,
				  sparse_mode_name(sa->mode)))
			return -1;
	}
	return 0;
}

int sparse_attn_parse(const JsonObj *o, SparseAttn *sa, PxNotes *notes, PxError *err)
{
	static const char *const modes[] = {"dense", "fixed", "variable", "bigbird",
					    "bslongformer", NULL}; /* SparseMode order from 1 */
	static const char *const directions[] = {"bidirectional", "unidirectional", NULL};
	const char *known[N_SPARSE_KEYS + 1];
	int mode;
	for (int i = 0; i < N_SPARSE_KEYS; i++)
		known[i] = SPARSE_KEYS[i].key;
	known[N_SPARSE_KEYS] = NULL;
	if (jobj_check_keys(o, known, notes))
		return px_fail(err, PX_ERR_RUNTIME, "out of memory");
	if (jobj_choice(o, "mode", modes, SPARSE_FIXED - 1, &mode, err) < 0)
		return -1;
	sparse_attn_defaults(sa, (SparseMode)(mode + 1));
	if (jobj_int(o, "block", 1, 1 << 20, 16, &sa->block, err) < 0 ||
	    jobj_bool(o, "different_layout_per_head", 0, &sa->different_layout_per_head, err) < 0 ||
	    jobj_choice(o, "attention", directions, 0, &sa->unidirectional, err) < 0 ||
	    jobj_bool(o, "horizontal_global_attention", 0, &sa->horizontal_global_attention,
		      err) < 0 ||
	    jobj_int(o, "num_local_blocks", 1, 1 << 30, 4, &sa->num_local_blocks, err) < 0 ||
	    jobj_int(o, "num_global_blocks", 1, 1 << 30, 1, &sa->num_global_blocks, err) < 0 ||
	    jobj_int(o, "num_different_global_patterns", 1, 1 << 30, 1,
		     &sa->num_different_global_patterns, err) < 0 ||
	    jobj_int(o, "num_random_blocks", 0, 1 << 30, 0, &sa->num_random_blocks, err) < 0 ||
	    jobj_int(o, "num_sliding_window_blocks", 1, 1 << 30, 3,
		     &sa->num_sliding_window_blocks, err) < 0 ||
	    read_lists(o, sa, err))
		return -1;
	if (warn_unread(o, sa, notes))
		return px_fail(err, PX_ERR_RUNTIME, "out of memory");
	const char *key;
	char why[256], where[512];
	if (sparse_attn_check(sa, &key, why, sizeof(why))) {
		jobj_where(o, key, where, sizeof(where));
		return px_fail(err, PX_ERR_INPUT, "%s: %s.%s: %s", where, o->name, key, why);
	}
	return 0;
}

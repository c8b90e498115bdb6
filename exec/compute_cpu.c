/* compute_cpu: the compute backend on the host: every place is host memory, taken from a pool of
 * its own (pool.h: segments mapped from the system and reused; with PX_CPU_ALLOC=caching the
 * device place from caching.h, PyTorch's allocator's design, whose reserve the simulator's model
 * of it predicts), and the kernels are kernels/'s
 * plain-C reference (matrix products through OpenBLAS). Everything runs synchronously, so check
 * has nothing to report. Loops over whole buffers split over kernels/par_cpu's threads
 * (OpenBLAS's count), with results that do not depend on how many there are. */
#include "compute.h"

#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <sys/mman.h>

#include "../kernels/par_cpu.h"
#include "../kernels/precision.h"
#include "caching.h"
#include "pool.h"

typedef struct CpuCtx {
	ComputeShape sh;
	const int *inputs, *targets; /* the caller's, valid until the next set_tokens */
	GptTp tp;                    /* set_tp's; t > 1: the tensor-parallel units */
	float *att;                  /* set_scores': the blocks' attention probabilities, apart */
	const SparseIndex *ix;       /* set_sparse's: block-sparse attention's kept blocks */
	Pool *pool[N_PLACES];        /* each place's memory, so that each has its own figures */
	Caching *dev;                /* PX_CPU_ALLOC=caching: the device place's, in pool's stead */
	double held_peak_bytes;      /* all places' mapped bytes together, at their highest */
} CpuCtx;

static void cpu_destroy(void *ctx)
{
	CpuCtx *c = ctx;
	for (int p = 0; c && p < N_PLACES; p++)
		pool_destroy(c->pool[p]);
	if (c)
		caching_destroy(c->dev);
	free(ctx);
}

/* The caching allocator's segments: anonymous mappings, zero and not resident until written.
 * The length is the allocator's to remember; munmap wants it back, so it rides in front. */
static void *segment_map(void *ctx, size_t bytes)
{
	(void)ctx;
	size_t *p = mmap(NULL, bytes + 4096, PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (p == MAP_FAILED)
		return NULL;
	*p = bytes + 4096;
	return (char *)p + 4096;
}

static void segment_unmap(void *ctx, void *segment)
{
	(void)ctx;
	size_t *p = (size_t *)((char *)segment - 4096);
	munmap(p, *p);
}

/* Expandable segments: address space reserved with no access (and no memory), made usable a
 * range at a time. */
static void *segment_reserve(void *ctx, size_t bytes)
{
	(void)ctx;
	void *p = mmap(NULL, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	return p == MAP_FAILED ? NULL : p;
}

static int segment_commit(void *ctx, void *ptr, size_t bytes)
{
	(void)ctx;
	return mprotect(ptr, bytes, PROT_READ | PROT_WRITE);
}

static void segment_release(void *ctx, void *base, size_t bytes)
{
	(void)ctx;
	munmap(base, bytes);
}

/* PX_CPU_ALLOC: "pool" (the default) or "caching"; -1 with err on anything else */
static int device_caching(int *on, PxError *err)
{
	const char *v = getenv("PX_CPU_ALLOC");
	*on = v && !strcmp(v, "caching");
	if (v && *v && !*on && strcmp(v, "pool"))
		return px_fail(err, PX_ERR_INPUT, "PX_CPU_ALLOC: \"%s\" is not a way of taking the "
			       "device place's memory; expected pool or caching", v);
	return 0;
}

static int cpu_create(const ComputeShape *shape, void **ctx, PxError *err)
{
	if (shape->dt != DT_FP32 &&
	    gpt16_check(&shape->cfg, compute_prec(shape->dt), shape->B, shape->T, err))
		return -1;
	int caching = 0;
	if (device_caching(&caching, err))
		return -1;
	CpuCtx *c = calloc(1, sizeof(*c));
	if (!c)
		return px_fail(err, PX_ERR_RUNTIME, "out of memory");
	c->sh = *shape;
	/* an expandable segment may grow to 64 GiB of address space, taken with no access */
	CachingSource src = {segment_map, segment_unmap, segment_reserve, segment_commit,
			     segment_release, (size_t)64 << 30, NULL};
	for (int p = 0; p < N_PLACES; p++)
		if (!(c->pool[p] = pool_create(&POOL_CONFIG_DEFAULT)) ||
		    (caching && p == PLACE_GPU && !(c->dev = caching_create(&src, &shape->alloc)))) {
			cpu_destroy(c);
			return px_fail(err, PX_ERR_RUNTIME, "out of memory");
		}
	*ctx = c;
	return 0;
}

/* What place p's allocator holds from the system, now and at its high-water mark: its pool's
 * mapped bytes, or the caching allocator's segments (as torch's memory_reserved) */
static void place_held(const CpuCtx *c, int p, double *now_bytes, double *peak_bytes)
{
	if (p == PLACE_GPU && c->dev) {
		CachingStats cs;
		caching_stats(c->dev, &cs);
		*now_bytes = (double)cs.reserved_bytes;
		*peak_bytes = (double)cs.reserved_peak_bytes;
		return;
	}
	PoolStats st;
	pool_stats(c->pool[p], &st);
	*now_bytes = (double)st.mapped_bytes;
	*peak_bytes = (double)st.mapped_peak_bytes;
}

static double mapped_bytes(const CpuCtx *c)
{
	double sum = 0, now, peak;
	for (int p = 0; p < N_PLACES; p++) {
		place_held(c, p, &now, &peak);
		sum += now;
	}
	return sum;
}

static void *cpu_take(CpuCtx *c, Place place, size_t bytes, int zeroed)
{
	void *p;
	if (place == PLACE_GPU && c->dev) { /* a reused block holds its last user's bytes */
		if ((p = caching_alloc(c->dev, bytes ? bytes : 1)) && zeroed)
			memset(p, 0, bytes);
	} else {
		p = zeroed ? pool_alloc(c->pool[place], bytes) : pool_alloc_empty(c->pool[place], bytes);
	}
	double now = mapped_bytes(c);
	if (now > c->held_peak_bytes)
		c->held_peak_bytes = now;
	return p;
}

static void *cpu_alloc(void *ctx, Place place, size_t bytes)
{
	return cpu_take(ctx, place, bytes, 1);
}

static void *cpu_alloc_empty(void *ctx, Place place, size_t bytes)
{
	return cpu_take(ctx, place, bytes, 0);
}

static void cpu_release(void *ctx, Place place, void *ptr)
{
	CpuCtx *c = ctx;
	if (place == PLACE_GPU && c->dev)
		caching_free(c->dev, ptr);
	else
		pool_free(c->pool[place], ptr);
}

static void cpu_held(void *ctx, int place, double *now_bytes, double *peak_bytes)
{
	CpuCtx *c = ctx;
	if (place == N_PLACES) {
		*now_bytes = mapped_bytes(c);
		*peak_bytes = c->held_peak_bytes;
		return;
	}
	place_held(c, place, now_bytes, peak_bytes);
}

static int cpu_caching(void *ctx)
{
	return ((CpuCtx *)ctx)->dev != NULL;
}

static void cpu_settle(void *ctx)
{
	CpuCtx *c = ctx;
	for (int p = 0; p < N_PLACES; p++) {
		pool_trim(c->pool[p]);
		pool_reset_peak(c->pool[p]);
	}
	if (c->dev) /* keeps its segments, as PyTorch's does (no empty_cache) */
		caching_reset_peak(c->dev);
	c->held_peak_bytes = mapped_bytes(c);
}

/* ---- storage ---- */

static float get(const void *p, size_t i, Dtype d)
{
	if (d == DT_FP32)
		return ((const float *)p)[i];
	uint16_t b = ((const uint16_t *)p)[i];
	return d == DT_BF16 ? precision_bf16_to_f32(b) : precision_f16_to_f32(b);
}

static void put(void *p, size_t i, float x, Dtype d)
{
	if (d == DT_FP32)
		((float *)p)[i] = x;
	else
		((uint16_t *)p)[i] = d == DT_BF16 ? precision_f32_to_bf16(x) : precision_f32_to_f16(x);
}

/* arguments of the loops below */
typedef struct BufArgs {
	void *dst;
	const void *src;
	Dtype dd, sd;
	size_t n;
	double *chunk_sums; /* sum_squares: one per chunk */
	atomic_int found;   /* nonfinite */
} BufArgs;

static void convert_range(void *ctx, size_t i0, size_t i1)
{
	BufArgs *a = ctx;
	for (size_t i = i0; i < i1; i++)
		put(a->dst, i, get(a->src, i, a->sd), a->dd);
}

/* [a, a + an) and [b, b + bn) share a byte */
static int overlap(const void *a, size_t an, const void *b, size_t bn)
{
	uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
	return x < y + bn && y < x + an;
}

static void cpu_convert(void *ctx, void *dst, Dtype dd, const void *src, Dtype sd, size_t n)
{
	(void)ctx;
	size_t bytes = n * (size_t)dtype_bytes(dd);
	if (dd == sd && overlap(dst, bytes, src, bytes))
		memmove(dst, src, bytes);
	else if (dd == sd)
		par_cpu_memcpy(dst, src, bytes);
	else if (sd == DT_FP32 && dd == DT_BF16)
		precision_f32_to_bf16_n(dst, src, n);
	else if (sd == DT_FP32 && dd == DT_FP16)
		precision_f32_to_f16_n(dst, src, n);
	else if (dd == DT_FP32 && sd == DT_BF16)
		precision_bf16_to_f32_n(dst, src, n);
	else if (dd == DT_FP32 && sd == DT_FP16)
		precision_f16_to_f32_n(dst, src, n);
	else {
		BufArgs a = {.dst = dst, .src = src, .dd = dd, .sd = sd};
		par_cpu_for(n, PAR_CPU_GRAIN_ELEMS, convert_range, &a);
	}
}

static void add_range(void *ctx, size_t i0, size_t i1)
{
	BufArgs *a = ctx;
	if (a->dd == DT_FP32 && a->sd == DT_FP32) { /* the common case, in a loop that vectorises */
		float *d = a->dst;
		const float *s = a->src;
		for (size_t i = i0; i < i1; i++)
			d[i] += s[i];
		return;
	}
	for (size_t i = i0; i < i1; i++)
		put(a->dst, i, get(a->dst, i, a->dd) + get(a->src, i, a->sd), a->dd);
}

static void cpu_add(void *ctx, void *dst, Dtype dd, const void *src, Dtype sd, size_t n)
{
	(void)ctx;
	BufArgs a = {.dst = dst, .src = src, .dd = dd, .sd = sd};
	par_cpu_for(n, PAR_CPU_GRAIN_ELEMS, add_range, &a);
}

typedef struct ScaleArgs {
	void *x;
	Dtype dt;
	float f;
} ScaleArgs;

static void scale_range(void *ctx, size_t i0, size_t i1)
{
	ScaleArgs *a = ctx;
	for (size_t i = i0; i < i1; i++)
		put(a->x, i, get(a->x, i, a->dt) * a->f, a->dt);
}

static void cpu_scale(void *ctx, void *x, Dtype dt, size_t n, float f)
{
	(void)ctx;
	ScaleArgs a = {x, dt, f};
	par_cpu_for(n, PAR_CPU_GRAIN_ELEMS, scale_range, &a);
}

static void cpu_zero(void *ctx, Place place, void *ptr, size_t bytes)
{
	(void)ctx, (void)place;
	par_cpu_memset(ptr, 0, bytes);
}

/* The sum of squares in fixed chunks of SUMSQ_CHUNK elements: each chunk summed in order, then
 * the chunks' sums in order. The chunks do not depend on the thread count, so neither does the
 * result (a thread takes whole chunks). */
#define SUMSQ_CHUNK ((size_t)1 << 16)

static double sumsq_chunk(const BufArgs *a, size_t c)
{
	size_t i0 = c * SUMSQ_CHUNK, i1 = i0 + SUMSQ_CHUNK < a->n ? i0 + SUMSQ_CHUNK : a->n;
	double s = 0;
	for (size_t i = i0; i < i1; i++) {
		double g = get(a->src, i, a->sd);
		s += g * g;
	}
	return s;
}

static void sumsq_chunks(void *ctx, size_t c0, size_t c1)
{
	BufArgs *a = ctx;
	for (size_t c = c0; c < c1; c++)
		a->chunk_sums[c] = sumsq_chunk(a, c);
}

static double cpu_sum_squares(void *ctx, const void *x, Dtype dt, size_t n)
{
	(void)ctx;
	size_t chunks = (n + SUMSQ_CHUNK - 1) / SUMSQ_CHUNK;
	BufArgs a = {.src = x, .sd = dt, .n = n};
	double s = 0;
	a.chunk_sums = chunks > 1 ? malloc(chunks * sizeof(double)) : NULL;
	if (!a.chunk_sums) { /* one chunk, or no memory for their sums: the same order on one thread */
		for (size_t c = 0; c < chunks; c++)
			s += sumsq_chunk(&a, c);
		return s;
	}
	par_cpu_for(chunks, 1, sumsq_chunks, &a);
	for (size_t c = 0; c < chunks; c++)
		s += a.chunk_sums[c];
	free(a.chunk_sums);
	return s;
}

static void nonfinite_range(void *ctx, size_t i0, size_t i1)
{
	BufArgs *a = ctx;
	for (size_t i = i0; i < i1; i++)
		if (!isfinite(get(a->src, i, a->sd))) {
			atomic_store_explicit(&a->found, 1, memory_order_relaxed);
			return;
		}
}

static int cpu_nonfinite(void *ctx, const void *x, Dtype dt, size_t n)
{
	(void)ctx;
	BufArgs a = {.src = x, .sd = dt};
	atomic_init(&a.found, 0);
	par_cpu_for(n, PAR_CPU_GRAIN_ELEMS, nonfinite_range, &a);
	return atomic_load(&a.found);
}

static void cpu_copy(void *ctx, void *dst, const void *src, size_t bytes)
{
	(void)ctx;
	par_cpu_memcpy(dst, src, bytes);
}

/* ---- the model ---- */

static void cpu_set_tokens(void *ctx, const int *inputs, const int *targets)
{
	CpuCtx *c = ctx;
	c->inputs = inputs;
	c->targets = targets;
}

static void cpu_set_tp(void *ctx, const GptTp *tp)
{
	CpuCtx *c = ctx;
	c->tp = *tp;
}

/* fp32: gpt_cpu's units; 16-bit: gpt16_cpu's; on a tensor-parallel rank gpt_tp_cpu's in either */
#define SHAPE(c) &(c)->sh.cfg, (c)->sh.B, (c)->sh.T
#define TYPED(c) &(c)->sh.cfg, compute_prec((c)->sh.dt), (c)->sh.B, (c)->sh.T
#define TP(c) &(c)->sh.cfg, &(c)->tp, compute_prec((c)->sh.dt), (c)->sh.B, (c)->sh.T

static void cpu_embed_forward(void *ctx, const void *params, void *y, float *scratch)
{
	CpuCtx *c = ctx;
	if (c->tp.t > 1)
		gpt_tp_embed_forward(TP(c), params, c->inputs, y, scratch);
	else if (c->sh.dt == DT_FP32)
		gpt_cpu_embed_forward(SHAPE(c), params, c->inputs, y);
	else
		gpt16_embed_forward(TYPED(c), params, c->inputs, y);
}

static void cpu_block_forward(void *ctx, const void *params, const void *x, void *y, void *acts,
			      float *scratch)
{
	CpuCtx *c = ctx;
	/* dense or block-sparse (c->ix), the scores in acts or apart (c->att) */
	if (c->tp.t > 1)
		gpt_tp_block_forward_att(TP(c), params, x, y, acts, c->att, c->ix, scratch);
	else if (c->sh.dt == DT_FP32)
		gpt_cpu_block_forward_att(SHAPE(c), params, x, y, acts, c->att, c->ix);
	else
		gpt16_block_forward_att(TYPED(c), params, x, y, acts, c->att, c->ix);
}

static void cpu_set_scores(void *ctx, void *att)
{
	((CpuCtx *)ctx)->att = att;
}

static void cpu_set_sparse(void *ctx, const SparseIndex *ix)
{
	((CpuCtx *)ctx)->ix = ix;
}

static void cpu_block_scores(void *ctx, void *acts)
{
	CpuCtx *c = ctx;
	if (c->tp.t > 1)
		gpt_tp_block_scores(TP(c), acts, c->att, c->ix);
	else if (c->sh.dt == DT_FP32)
		gpt_cpu_block_scores(SHAPE(c), acts, c->att, c->ix);
	else
		gpt16_block_scores(TYPED(c), acts, c->att, c->ix);
}

static float cpu_head_forward(void *ctx, const void *params, const void *wte, const void *x,
			      void *acts, float *scratch)
{
	CpuCtx *c = ctx;
	if (c->tp.t > 1)
		return gpt_tp_head_forward(TP(c), params, wte, x, c->targets, acts, scratch);
	if (c->sh.dt == DT_FP32)
		return gpt_cpu_head_forward(SHAPE(c), params, wte, x, c->targets, acts);
	return gpt16_head_forward(TYPED(c), params, wte, x, c->targets, acts);
}

static void cpu_embed_backward(void *ctx, float *grads, const float *dy, float *scratch)
{
	CpuCtx *c = ctx;
	if (c->tp.t > 1) /* scratch: used under sequence parallelism */
		gpt_tp_embed_backward(TP(c), grads, c->inputs, dy, scratch);
	else
		gpt_cpu_embed_backward(SHAPE(c), grads, c->inputs, dy);
}

static void cpu_block_backward(void *ctx, const void *params, float *grads, const void *acts,
			       const float *dy, float *dx, float *scratch)
{
	CpuCtx *c = ctx;
	if (c->tp.t > 1)
		gpt_tp_block_backward_att(TP(c), params, grads, acts, c->att, c->ix, dy, dx,
					  scratch);
	else if (c->sh.dt == DT_FP32)
		gpt_cpu_block_backward_att(SHAPE(c), params, grads, acts, c->att, c->ix, dy, dx,
					   scratch);
	else
		gpt16_block_backward_att(TYPED(c), params, grads, acts, c->att, c->ix, dy, dx,
					 scratch);
}

static void cpu_head_backward(void *ctx, const void *params, const void *wte, float *grads,
			      float *dwte, void *acts, float dloss, float *dx, float *scratch)
{
	CpuCtx *c = ctx;
	if (c->tp.t > 1)
		gpt_tp_head_backward(TP(c), params, wte, grads, dwte, acts, c->targets, dloss, dx,
				     scratch);
	else if (c->sh.dt == DT_FP32)
		gpt_cpu_head_backward(SHAPE(c), params, wte, grads, dwte, acts, c->targets, dloss, dx,
				      scratch);
	else
		gpt16_head_backward(TYPED(c), params, wte, grads, dwte, acts, c->targets, dloss, dx,
				    scratch);
}

/* ---- optimizers ---- */

static void cpu_adamw(void *ctx, Place place, float *w, float *m, float *v, const float *g,
		      size_t n, const OpsAdamw *h, long step, float grad_scale)
{
	(void)ctx, (void)place;
	ops_adamw_step(w, m, v, g, n, h, step, grad_scale);
}

static void cpu_adamw_foreach(void *ctx, Place place, float *w, float *m, float *v,
			      const float *g, size_t n, const OpsAdamw *h, long step,
			      float grad_scale, float *denom)
{
	(void)ctx, (void)place;
	ops_adamw_foreach_step(w, m, v, g, n, h, step, grad_scale, denom);
}

static void cpu_sgd(void *ctx, Place place, float *w, float *buf, const float *g, size_t n,
		    float lr, float momentum, float weight_decay, float grad_scale)
{
	(void)ctx, (void)place;
	ops_sgd_step(w, buf, g, n, lr, momentum, weight_decay, grad_scale);
}

static int cpu_check(void *ctx, PxError *err)
{
	(void)ctx, (void)err;
	return 0;
}

const ComputeBackend compute_cpu_backend = {
	.name = "cpu",
	.create = cpu_create,
	.destroy = cpu_destroy,
	.alloc = cpu_alloc,
	.alloc_empty = cpu_alloc_empty,
	.release = cpu_release,
	.held = cpu_held,
	.settle = cpu_settle,
	.caching = cpu_caching,
	.convert = cpu_convert,
	.add = cpu_add,
	.zero = cpu_zero,
	.scale = cpu_scale,
	.sum_squares = cpu_sum_squares,
	.nonfinite = cpu_nonfinite,
	.to_host = cpu_copy,
	.from_host = cpu_copy,
	.set_tokens = cpu_set_tokens,
	.set_tp = cpu_set_tp,
	.embed_forward = cpu_embed_forward,
	.block_forward = cpu_block_forward,
	.set_scores = cpu_set_scores,
	.block_scores = cpu_block_scores,
	.set_sparse = cpu_set_sparse,
	.head_forward = cpu_head_forward,
	.embed_backward = cpu_embed_backward,
	.block_backward = cpu_block_backward,
	.head_backward = cpu_head_backward,
	.adamw = cpu_adamw,
	.adamw_foreach = cpu_adamw_foreach,
	.sgd = cpu_sgd,
	.check = cpu_check,
};

const ComputeBackend *compute_backend_find(const char *name)
{
	if (!strcmp(name, "cpu"))
		return &compute_cpu_backend;
#ifdef PX_HAVE_CUDA
	if (!strcmp(name, "cuda"))
		return &compute_cuda_backend;
#endif
	return NULL;
}

/* compute_cuda: the compute backend on one CUDA GPU. The device place is device memory (taken
 * as PX_CUDA_ALLOC says, below); the host place is pinned host memory (cudaMallocHost), which
 * kernels read and write in place over the bus (unified addressing) and the host touches directly. The kernels are
 * kernels/'s CUDA twins of the reference, queued on one stream; an update offloaded to the host
 * runs the reference optimizer there. kernels/ stops the process on a CUDA error (with the file,
 * the call and CUDA's message), so check only waits for the stream. */
#include "compute.h"

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/cast_cuda.h"
#include "../kernels/cuda_ctx.h"
#include "../kernels/gpt_cuda.h"
#include "../kernels/optim_cuda.h"
#include "../kernels/sparse_eager_cuda.h"
#include "caching.h"

/* How device memory is taken and given back, PX_CUDA_ALLOC (read at create):
 * - "cached" (the default): cudaMallocAsync and cudaFreeAsync on the compute stream, from the
 *   device's default pool with its release threshold at its maximum, so that the pool keeps what
 *   it took, a caching allocator as PyTorch's. A free is ordered after the work queued before it
 *   (the runner queues its waits for a buffer's collectives on that stream before freeing it), so
 *   nothing synchronises per buffer and a steady step maps no memory.
 * - "async": the same pool with its release threshold 0: at every synchronisation it gives the
 *   system back what is free, and the next step maps it again.
 * - "sync": cudaMalloc, and per release a stream synchronisation then cudaFree (which waits for
 *   the whole device): every buffer its own allocation, so the device's reading is the buffers'
 *   own (the memory-claims checks use it); the first GPU runbook's way (results/gpu/lease1, 2).
 * - "caching": exec/caching.h, PyTorch's caching allocator's design over cudaMalloc'd segments,
 *   which the simulator's model of that allocator (sim/allocator.h) predicts: its measured
 *   reserve is the check of the model's max_memory_reserved. Not yet run on a GPU.
 * GPT-2 124M, bf16, batch 8 x 1024 on one H200 (results/gpu/lease3): a step 55.3 ms cached,
 * 77.6 ms async, 75.4 ms sync; the device's peak 30 MiB above the buffers' sum with a pool, 7 MiB
 * with cudaMalloc. */
typedef enum { ALLOC_ASYNC, ALLOC_CACHED, ALLOC_SYNC, ALLOC_CACHING } AllocMode;

typedef struct CudaCompute {
	ComputeShape sh;
	CudaCtx *ctx;
	int *tokens; /* device: the micro-batch's inputs, then its targets, (B, T) each */
	AllocMode mode;
	cudaMemPool_t pool; /* ALLOC_CACHED's and ALLOC_ASYNC's: the device's default pool */
	Caching *caching;   /* ALLOC_CACHING's blocks */
	void *att;          /* set_scores': the blocks' attention probabilities, apart */
	SparseIndexDev ix;  /* set_sparse's kept blocks, on the device; ix.row_start NULL: dense */
	int failed_sparse;  /* the index did not fit on the device (reported by check) */
} CudaCompute;

/* PX_CUDA_ALLOC's mode; -1 with err on a value that names none */
static int alloc_mode(AllocMode *mode, PxError *err)
{
	const char *v = getenv("PX_CUDA_ALLOC");
	if (!v || !*v || !strcmp(v, "cached"))
		*mode = ALLOC_CACHED;
	else if (!strcmp(v, "async"))
		*mode = ALLOC_ASYNC;
	else if (!strcmp(v, "sync"))
		*mode = ALLOC_SYNC;
	else if (!strcmp(v, "caching"))
		*mode = ALLOC_CACHING;
	else
		return px_fail(err, PX_ERR_INPUT,
			       "PX_CUDA_ALLOC: \"%s\" is not a way of taking device memory; expected "
			       "cached, async, sync or caching", v);
	return 0;
}

/* The pool modes' c->pool: the current device's default pool set up for the mode; a device
 * without pools falls back to sync, saying so. */
static void pool_setup(CudaCompute *c)
{
	int dev = 0, pools = 0;
	if (c->mode != ALLOC_CACHED && c->mode != ALLOC_ASYNC)
		return;
	uint64_t keep = c->mode == ALLOC_CACHED ? UINT64_MAX : 0;
	if (cudaGetDevice(&dev) != cudaSuccess ||
	    cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, dev) != cudaSuccess ||
	    !pools || cudaDeviceGetDefaultMemPool(&c->pool, dev) != cudaSuccess ||
	    cudaMemPoolSetAttribute(c->pool, cudaMemPoolAttrReleaseThreshold, &keep) != cudaSuccess) {
		fprintf(stderr, "backend cuda: device %d: no memory pool to take memory from; "
				"PX_CUDA_ALLOC=sync\n", dev);
		c->mode = ALLOC_SYNC;
		c->pool = NULL;
	}
}

static CudaDtype cdt(Dtype d)
{
	return d == DT_FP32 ? CDT_F32 : d == DT_BF16 ? CDT_BF16 : CDT_F16;
}

/* ALLOC_CACHING's segments: cudaMalloc'd, given back only when the backend goes */
static void *segment_map(void *ctx, size_t bytes)
{
	void *p = NULL;
	(void)ctx;
	return cudaMalloc(&p, bytes) == cudaSuccess ? p : NULL;
}

static void segment_unmap(void *ctx, void *segment)
{
	(void)ctx;
	cudaFree(segment);
}

static int cuda_create(const ComputeShape *shape, void **out, PxError *err)
{
	char why[256];
	int count = 0;
	if (!cuda_ctx_available(why, sizeof(why)) || cudaGetDeviceCount(&count) != cudaSuccess ||
	    count < 1)
		return px_fail(err, PX_ERR_RUNTIME, "backend cuda: no CUDA device: %s", why);
	if (shape->dt != DT_FP32 &&
	    gpt16_check(&shape->cfg, compute_prec(shape->dt), shape->B, shape->T, err))
		return -1;
	AllocMode mode = ALLOC_ASYNC;
	if (alloc_mode(&mode, err))
		return -1;
	CudaCompute *c = calloc(1, sizeof(*c));
	if (!c)
		return px_fail(err, PX_ERR_RUNTIME, "out of memory");
	c->sh = *shape;
	c->mode = mode;
	/* more ranks than devices (ZeRO's claims on one GPU): ranks share them round-robin */
	c->ctx = cuda_ctx_create(shape->device % count);
	c->tokens = cuda_ctx_alloc(2 * (size_t)shape->B * (size_t)shape->T * sizeof(int));
	pool_setup(c);
	/* no reserve: expandable segments need the driver's virtual memory calls, not written */
	CachingSource src = {segment_map, segment_unmap, NULL, NULL, NULL, 0, NULL};
	if (c->mode == ALLOC_CACHING && !(c->caching = caching_create(&src, &shape->alloc))) {
		cuda_ctx_free(c->tokens);
		cuda_ctx_destroy(c->ctx);
		free(c);
		return shape->alloc.expandable ?
			       px_fail(err, PX_ERR_INPUT, "PX_CUDA_ALLOC=caching: the executor's "
				       "allocator runs pytorch_cuda_alloc_conf's expandable_segments on "
				       "backend \"cpu\" only (PX_CPU_ALLOC=caching)") :
			       px_fail(err, PX_ERR_RUNTIME, "out of memory");
	}
	*out = c;
	return 0;
}

static void cuda_destroy(void *cx)
{
	CudaCompute *c = cx;
	if (!c)
		return;
	cuda_ctx_free(c->tokens);
	sparse_eager_cuda_free(&c->ix);
	if (c->caching) {
		cuda_ctx_sync(c->ctx);
		caching_destroy(c->caching);
	}
	cuda_ctx_destroy(c->ctx);
	free(c);
}

static void *cuda_take(CudaCompute *c, Place place, size_t bytes, int zeroed)
{
	void *p = NULL;
	bytes = bytes ? bytes : 1;
	if (place == PLACE_GPU && c->mode != ALLOC_SYNC) {
		/* stream-ordered (the caching allocator's blocks are reused in the one stream's
		 * order, as PyTorch's are): the zeros land before anything queued after them */
		if (c->mode == ALLOC_CACHING)
			p = caching_alloc(c->caching, bytes);
		else if (cudaMallocAsync(&p, bytes, (cudaStream_t)cuda_ctx_stream(c->ctx)) !=
			 cudaSuccess)
			p = NULL;
		if (p && zeroed)
			cuda_ctx_zero(c->ctx, p, bytes);
	} else if (place == PLACE_GPU) {
		if (cudaMalloc(&p, bytes) != cudaSuccess)
			return NULL;
		if (zeroed) {
			cuda_ctx_zero(c->ctx, p, bytes);
			cuda_ctx_sync(c->ctx);
		}
	} else {
		if (cudaMallocHost(&p, bytes) != cudaSuccess)
			return NULL;
		if (zeroed)
			memset(p, 0, bytes);
	}
	return p;
}

static void *cuda_alloc(void *cx, Place place, size_t bytes)
{
	return cuda_take(cx, place, bytes, 1);
}

static void *cuda_alloc_empty(void *cx, Place place, size_t bytes)
{
	return cuda_take(cx, place, bytes, 0);
}

static void cuda_release(void *cx, Place place, void *ptr)
{
	CudaCompute *c = cx;
	if (place == PLACE_GPU && c->mode == ALLOC_CACHING) {
		caching_free(c->caching, ptr);
		return;
	}
	if (place == PLACE_GPU && c->mode != ALLOC_SYNC) {
		cudaFreeAsync(ptr, (cudaStream_t)cuda_ctx_stream(c->ctx));
		return;
	}
	cuda_ctx_sync(c->ctx); /* nothing queued may still use it */
	if (place == PLACE_GPU)
		cudaFree(ptr);
	else
		cudaFreeHost(ptr);
}

/* What the pool holds from the system, now and at its high-water mark (its reserve, as torch's
 * memory_reserved): the device place under a pool mode. Negative, no figure, for the host place
 * (pinned, each buffer its own cudaMallocHost) and under sync (each buffer its own cudaMalloc):
 * the arena's sum of the requests is the figure there. */
static void cuda_held(void *cx, int place, double *now_bytes, double *peak_bytes)
{
	CudaCompute *c = cx;
	cudaMemPool_t pool = place == PLACE_GPU ? c->pool : NULL;
	uint64_t now = 0, high = 0;
	*now_bytes = *peak_bytes = -1;
	if (place == PLACE_GPU && c->caching) { /* its segments, as torch's memory_reserved */
		CachingStats st;
		caching_stats(c->caching, &st);
		*now_bytes = (double)st.reserved_bytes, *peak_bytes = (double)st.reserved_peak_bytes;
		return;
	}
	if (pool &&
	    cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &now) == cudaSuccess &&
	    cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &high) == cudaSuccess)
		*now_bytes = (double)now, *peak_bytes = (double)high;
}

static int cuda_caching(void *cx)
{
	return ((CudaCompute *)cx)->caching != NULL;
}

/* After set-up: the pool gives back what nothing uses, and its high-water mark restarts there. */
static void cuda_settle(void *cx)
{
	CudaCompute *c = cx;
	uint64_t zero = 0;
	if (c->caching) /* keeps its segments, as PyTorch's does (no empty_cache) */
		caching_reset_peak(c->caching);
	if (!c->pool)
		return;
	cuda_ctx_sync(c->ctx);
	cudaMemPoolTrimTo(c->pool, 0);
	cudaMemPoolSetAttribute(c->pool, cudaMemPoolAttrReservedMemHigh, &zero); /* to the current */
}

/* ---- storage ---- */

static void cuda_convert(void *cx, void *dst, Dtype dd, const void *src, Dtype sd, size_t n)
{
	CudaCompute *c = cx;
	cast_cuda(c->ctx, dst, cdt(dd), src, cdt(sd), n);
}

static void cuda_add(void *cx, void *dst, Dtype dd, const void *src, Dtype sd, size_t n)
{
	CudaCompute *c = cx;
	cast_cuda_accumulate(c->ctx, dst, cdt(dd), src, cdt(sd), n);
}

static void cuda_zero(void *cx, Place place, void *ptr, size_t bytes)
{
	CudaCompute *c = cx;
	if (place != PLACE_GPU) { /* pinned host memory: the host writes it once queued work is done */
		cuda_ctx_sync(c->ctx);
		memset(ptr, 0, bytes);
	} else {
		cuda_ctx_zero(c->ctx, ptr, bytes);
	}
}

static double cuda_sum_squares(void *cx, const void *x, Dtype dt, size_t n)
{
	CudaCompute *c = cx;
	return optim_cuda_sum_squares(c->ctx, x, cdt(dt), n);
}

static int cuda_nonfinite(void *cx, const void *x, Dtype dt, size_t n)
{
	CudaCompute *c = cx;
	return cast_cuda_has_nonfinite(c->ctx, x, cdt(dt), n);
}

/* after everything queued, so that the bytes are the latest */
static void cuda_copy_sync(void *cx, void *dst, const void *src, size_t bytes)
{
	CudaCompute *c = cx;
	cuda_ctx_sync(c->ctx);
	if (cudaMemcpy(dst, src, bytes, cudaMemcpyDefault) != cudaSuccess) {
		fprintf(stderr, "compute_cuda: cudaMemcpy of %zu bytes: %s\n", bytes,
			cudaGetErrorString(cudaGetLastError()));
		exit(1);
	}
}

/* ---- the model ---- */

static void cuda_set_tokens(void *cx, const int *inputs, const int *targets)
{
	CudaCompute *c = cx;
	size_t bt = (size_t)c->sh.B * (size_t)c->sh.T;
	cuda_ctx_upload(c->ctx, c->tokens, inputs, bt * sizeof(int));
	cuda_ctx_upload(c->ctx, c->tokens + bt, targets, bt * sizeof(int));
}

#define SHAPE(c) &(c)->sh.cfg, (c)->sh.B, (c)->sh.T
#define SPARSE(c) ((c)->ix.row_start ? &(c)->ix : NULL)
#define TARGETS(c) ((c)->tokens + (size_t)(c)->sh.B * (size_t)(c)->sh.T)

/* fp32: gpt_cuda's units; 16-bit: the gpt16 ones */
#define TYPED(c) &(c)->sh.cfg, cdt((c)->sh.dt), (c)->sh.B, (c)->sh.T

static void cuda_embed_forward(void *cx, const void *params, void *y, float *scratch)
{
	CudaCompute *c = cx;
	(void)scratch;
	if (c->sh.dt == DT_FP32)
		gpt_cuda_embed_forward(c->ctx, SHAPE(c), params, c->tokens, y);
	else
		gpt16_cuda_embed_forward(c->ctx, TYPED(c), params, c->tokens, y);
}

static void cuda_block_forward(void *cx, const void *params, const void *x, void *y, void *acts,
			       float *scratch)
{
	CudaCompute *c = cx;
	(void)scratch;
	if (c->sh.dt == DT_FP32)
		gpt_cuda_block_forward(c->ctx, SHAPE(c), params, x, y, acts, c->att, SPARSE(c));
	else
		gpt16_cuda_block_forward(c->ctx, TYPED(c), params, x, y, acts, c->att);
}

static void cuda_set_scores(void *cx, void *att)
{
	((CudaCompute *)cx)->att = att;
}

/* fp32 units only (runner_supported); the index copied to the device, the old one freed */
static void cuda_set_sparse(void *cx, const SparseIndex *ix)
{
	CudaCompute *c = cx;
	sparse_eager_cuda_free(&c->ix);
	if (ix && sparse_eager_cuda_upload(&c->ix, ix))
		c->failed_sparse = 1;
}

static void cuda_block_scores(void *cx, void *acts)
{
	CudaCompute *c = cx;
	if (c->sh.dt == DT_FP32)
		gpt_cuda_block_scores(c->ctx, SHAPE(c), acts, c->att, SPARSE(c));
	else
		gpt16_cuda_block_scores(c->ctx, TYPED(c), acts, c->att);
}

static size_t cuda_head_act_bytes(const GptConfig *cfg, Dtype dt, int B, int T)
{
	return gpt_cuda_head_act_bytes(cfg, compute_prec(dt), B, T);
}

static float cuda_head_forward(void *cx, const void *params, const void *wte, const void *x,
			       void *acts, float *scratch)
{
	CudaCompute *c = cx;
	(void)scratch;
	if (c->sh.dt == DT_FP32)
		return gpt_cuda_head_forward(c->ctx, SHAPE(c), params, wte, x, TARGETS(c), acts);
	return gpt16_cuda_head_forward(c->ctx, TYPED(c), params, wte, x, TARGETS(c), acts);
}

static void cuda_embed_backward(void *cx, float *grads, const float *dy, float *scratch)
{
	(void)scratch;
	CudaCompute *c = cx;
	gpt_cuda_embed_backward(c->ctx, SHAPE(c), grads, c->tokens, dy);
}

static void cuda_block_backward(void *cx, const void *params, float *grads, const void *acts,
				const float *dy, float *dx, float *scratch)
{
	CudaCompute *c = cx;
	if (c->sh.dt == DT_FP32)
		gpt_cuda_block_backward(c->ctx, SHAPE(c), params, grads, acts, c->att, SPARSE(c), dy,
					dx, scratch);
	else
		gpt16_cuda_block_backward(c->ctx, TYPED(c), params, grads, acts, c->att, dy, dx,
					  scratch);
}

static void cuda_head_backward(void *cx, const void *params, const void *wte, float *grads,
			       float *dwte, void *acts, float dloss, float *dx, float *scratch)
{
	CudaCompute *c = cx;
	if (c->sh.dt == DT_FP32)
		gpt_cuda_head_backward(c->ctx, SHAPE(c), params, wte, grads, dwte, acts, TARGETS(c),
				       dloss, dx, scratch);
	else
		gpt16_cuda_head_backward(c->ctx, TYPED(c), params, wte, grads, dwte, acts,
					 TARGETS(c), dloss, dx, scratch);
}

/* ---- optimizers: on the GPU, or on the host for an offloaded optimizer ---- */

static void cuda_adamw(void *cx, Place place, float *w, float *m, float *v, const float *g,
		       size_t n, const OpsAdamw *h, long step, float grad_scale)
{
	CudaCompute *c = cx;
	if (place == PLACE_GPU) {
		optim_cuda_adamw_step(c->ctx, w, m, v, g, n, h, step, grad_scale);
		return;
	}
	cuda_ctx_sync(c->ctx);
	ops_adamw_step(w, m, v, g, n, h, step, grad_scale);
}

static void cuda_sgd(void *cx, Place place, float *w, float *buf, const float *g, size_t n,
		     float lr, float momentum, float weight_decay, float grad_scale)
{
	CudaCompute *c = cx;
	if (place == PLACE_GPU) {
		optim_cuda_sgd_step(c->ctx, w, buf, g, n, lr, momentum, weight_decay, grad_scale);
		return;
	}
	cuda_ctx_sync(c->ctx);
	ops_sgd_step(w, buf, g, n, lr, momentum, weight_decay, grad_scale);
}

static int cuda_check(void *cx, PxError *err)
{
	CudaCompute *c = cx;
	cuda_ctx_sync(c->ctx);
	if (c->failed_sparse)
		return px_fail(err, PX_ERR_RUNTIME, "out of device memory for the sparse attention "
			       "layout's index");
	return 0;
}

static void *cuda_stream(void *cx)
{
	CudaCompute *c = cx;
	return cuda_ctx_stream(c->ctx);
}

const ComputeBackend compute_cuda_backend = {
	.name = "cuda",
	.create = cuda_create,
	.destroy = cuda_destroy,
	.alloc = cuda_alloc,
	.alloc_empty = cuda_alloc_empty,
	.release = cuda_release,
	.held = cuda_held,
	.settle = cuda_settle,
	.caching = cuda_caching,
	.convert = cuda_convert,
	.add = cuda_add,
	.zero = cuda_zero,
	.sum_squares = cuda_sum_squares,
	.nonfinite = cuda_nonfinite,
	.to_host = cuda_copy_sync,
	.from_host = cuda_copy_sync,
	.set_tokens = cuda_set_tokens,
	.embed_forward = cuda_embed_forward,
	.block_forward = cuda_block_forward,
	.set_scores = cuda_set_scores,
	.set_sparse = cuda_set_sparse,
	.block_scores = cuda_block_scores,
	.head_act_bytes = cuda_head_act_bytes,
	.head_forward = cuda_head_forward,
	.embed_backward = cuda_embed_backward,
	.block_backward = cuda_block_backward,
	.head_backward = cuda_head_backward,
	.adamw = cuda_adamw,
	.sgd = cuda_sgd,
	.check = cuda_check,
	.stream = cuda_stream,
};

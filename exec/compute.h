/* compute: the executor's arithmetic, backend-neutral: memory for each place, conversions and sums
 * between storage dtypes, one GPT unit's forward and backward, the optimizers' updates. The runner
 * touches buffer contents only through this table, so one schedule interpreter drives the CPU
 * (compute_cpu.c) and CUDA (compute_cuda.c) backends alike. Which op runs when is the runner's;
 * how the kernels compute is kernels/'s. */
#ifndef PX_EXEC_COMPUTE_H
#define PX_EXEC_COMPUTE_H

#include <stddef.h>

#include "../engine/allocconf.h"
#include "../engine/err.h"
#include "../engine/dsconfig.h"
#include "../engine/schedule.h"
#include "../kernels/gpt16_cpu.h"
#include "../kernels/gpt_cpu.h"
#include "../kernels/gpt_tp_cpu.h"
#include "../kernels/ops_cpu.h"

/* The shapes one backend context serves: B = micro-batch, T = sequence, as kernels/ use them. */
typedef struct ComputeShape {
	GptConfig cfg;
	int B, T;
	int device; /* CUDA: the device to take (the launcher's local rank); CPU: ignored */
	/* The units' compute type, the scenario's dtype: DT_FP32 runs gpt_cpu's units (and their
	 * CUDA twins); DT_BF16 and DT_FP16 the 16-bit ones (gpt16_cpu.h), whose parameters, hidden
	 * stream and saved activations are of this type. Gradients are fp32 either way. */
	Dtype dt;
	/* the scenario's PyTorch allocator settings, for the device place's caching allocator
	 * (PX_CPU_ALLOC or PX_CUDA_ALLOC=caching: exec/caching.h) */
	AllocConf alloc;
} ComputeShape;

/* kernels/precision.h's name for a storage dtype */
static inline PrecisionType compute_prec(Dtype d)
{
	return d == DT_FP32 ? PREC_F32 : d == DT_BF16 ? PREC_BF16 : PREC_F16;
}

/* A backend: one file fills this table (STYLE.md). ctx is the backend's own state. Pointers are
 * to memory its alloc returned (for the CPU place, ordinary host memory works too). Compute calls
 * may run asynchronously: they report nothing, and a failure is kept until check (the first one
 * wins). Counts are elements. */
typedef struct ComputeBackend {
	const char *name;
	int (*create)(const ComputeShape *shape, void **ctx, PxError *err);
	void (*destroy)(void *ctx); /* NULL is fine */
	/* Zeroed memory of bytes (at least one) in place; NULL when out of memory. */
	void *(*alloc)(void *ctx, Place place, size_t bytes);
	/* The same, its contents undefined (torch.empty), for a buffer most of which may never be
	 * written; NULL: alloc. */
	void *(*alloc_empty)(void *ctx, Place place, size_t bytes);
	void (*release)(void *ctx, Place place, void *ptr);
	/* The bytes the backend's allocator holds from the system for place (N_PLACES: all places
	 * together), now and at their high-water mark: the CPU's pool segments (pool.h), the CUDA
	 * device pool's reserve. Negative for a place where every alloc is a request of its own to
	 * the system (CUDA's pinned host memory, its device memory under PX_CUDA_ALLOC=sync), so
	 * that the bytes asked for are the figure; NULL: so for every place. */
	void (*held)(void *ctx, int place, double *now_bytes, double *peak_bytes);
	/* Give back to the system what no allocation uses, and start the high-water marks again
	 * from now (after set-up). NULL: nothing kept. */
	void (*settle)(void *ctx);
	/* 1 when the device place's memory comes from exec/caching.h (PX_CPU_ALLOC or
	 * PX_CUDA_ALLOC=caching), so that held's figure for it is that allocator's reserve; NULL:
	 * never */
	int (*caching)(void *ctx);

	/* ---- storage ---- */
	/* dst = src (n elements), converted between fp32, fp16 and bf16 (round to nearest even) */
	void (*convert)(void *ctx, void *dst, Dtype dst_dt, const void *src, Dtype src_dt, size_t n);
	/* dst += src, each in its own dtype, the sum in fp32 and rounded once into dst's */
	void (*add)(void *ctx, void *dst, Dtype dst_dt, const void *src, Dtype src_dt, size_t n);
	void (*zero)(void *ctx, Place place, void *ptr, size_t bytes); /* memory of that place */
	/* x *= f (n elements of type dt, the product in fp32 rounded once); NULL where the backend
	 * has none (the runner then averages the reduced sums at the update instead) */
	void (*scale)(void *ctx, void *x, Dtype dt, size_t n, float f);
	double (*sum_squares)(void *ctx, const void *x, Dtype dt, size_t n); /* in double */
	int (*nonfinite)(void *ctx, const void *x, Dtype dt, size_t n);      /* 1: any inf or NaN */
	/* byte copies between this backend's memory and the caller's host memory */
	void (*to_host)(void *ctx, void *host, const void *src, size_t bytes);
	void (*from_host)(void *ctx, void *dst, const void *host, size_t bytes);

	/* ---- the model: kernels/gpt_cpu.h's unit calls (gpt16_cpu.h's when the shape's dt is
	 * 16-bit; gpt_tp_cpu.h's after set_tp) on model-layout parameters (a tensor-parallel rank's
	 * shard), x / y / acts of type dt; grads, dy, dx, scratch fp32. Forward scratch is used only
	 * by the tensor-parallel units (NULL is fine otherwise). */
	/* From now on the units run as rank tp->r of tp->t (kernels/gpt_tp_cpu.h, in the shape's
	 * dt), their collectives through tp's callbacks; NULL where the backend has no
	 * tensor-parallel units. */
	void (*set_tp)(void *ctx, const GptTp *tp);
	void (*set_tokens)(void *ctx, const int *inputs, const int *targets); /* (B, T) each */
	void (*embed_forward)(void *ctx, const void *params, void *y, float *scratch);
	void (*block_forward)(void *ctx, const void *params, const void *x, void *y, void *acts,
			      float *scratch);
	/* Selective recompute: from now on (until set again, NULL: inside acts) the blocks keep
	 * their attention probabilities in att (B, NH/t, T, T; the kept blocks' under block-sparse
	 * attention), and acts holds only what precedes them; block_scores rebuilds att from a
	 * block's kept q, k, v before its backward. Both backends have them (the CPU's for every
	 * unit, the CUDA one's for its dense units). */
	void (*set_scores)(void *ctx, void *att);
	void (*block_scores)(void *ctx, void *acts);
	/* Block-sparse attention (deepspeed.sparse_attention): from now on the blocks attend over
	 * ix's kept blocks (used, not owned), their acts gpt_cpu_block_sparse_act_bytes. NULL where
	 * the backend has no such units (the CPU's without tensor parallelism only). */
	void (*set_sparse)(void *ctx, const SparseIndex *ix);
	/* The head's activations in bytes where the backend lays them out otherwise than
	 * gpt16_head_act_bytes (CUDA pads the logits' rows, gpt_cuda.h); NULL: that size. */
	size_t (*head_act_bytes)(const GptConfig *c, Dtype dt, int B, int T);
	/* returns the mean loss over the B T targets (a synchronising call) */
	float (*head_forward)(void *ctx, const void *params, const void *wte, const void *x,
			      void *acts, float *scratch);
	void (*embed_backward)(void *ctx, float *grads, const float *dy, float *scratch);
	void (*block_backward)(void *ctx, const void *params, float *grads, const void *acts,
			       const float *dy, float *dx, float *scratch);
	void (*head_backward)(void *ctx, const void *params, const void *wte, float *grads,
			      float *dwte, void *acts, float dloss, float *dx, float *scratch);

	/* ---- optimizers: ops_cpu.h's, on fp32 master weights where place keeps them ---- */
	void (*adamw)(void *ctx, Place place, float *w, float *m, float *v, const float *g,
		      size_t n, const OpsAdamw *h, long step, float grad_scale);
	void (*sgd)(void *ctx, Place place, float *w, float *buf, const float *g, size_t n, float lr,
		    float momentum, float weight_decay, float grad_scale);
	/* torch's foreach AdamW, holding denom (n floats) while it runs; NULL where the backend has
	 * none (runner_supported refuses the update there) */
	void (*adamw_foreach)(void *ctx, Place place, float *w, float *m, float *v, const float *g,
			      size_t n, const OpsAdamw *h, long step, float grad_scale, float *denom);

	/* Wait for everything issued; 0, or -1 with the first failure since the last check. */
	int (*check)(void *ctx, PxError *err);
	/* The stream compute is queued on (a cudaStream_t), for comm_set_stream to order started
	 * collectives against with events; NULL (or no function) where compute runs on the host. */
	void *(*stream)(void *ctx);
} ComputeBackend;

extern const ComputeBackend compute_cpu_backend;
#ifdef PX_HAVE_CUDA
extern const ComputeBackend compute_cuda_backend; /* compute_cuda.c */
#endif

/* The backend named name ("cpu", "cuda"), or NULL when this build has none of that name. */
const ComputeBackend *compute_backend_find(const char *name);

#endif

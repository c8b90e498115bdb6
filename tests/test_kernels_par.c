/* Kernels on several threads (kernels/par_cpu): the loop split as documented, a forked child's
 * own workers, and the GPT units (fp32 and bf16), the optimizer and the executor's buffer sums
 * giving bit for bit the same results at 1, 2 and 3 threads, with a check that the loops compared
 * really were split. The GPT units' loops are compared with OpenBLAS on one thread, whose
 * products may round differently at other thread counts on some machines (par_cpu.h); with
 * OpenBLAS's threads the results agree to within its rounding. */
#include <CUnit/CUnit.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../exec/compute.h"
#include "../kernels/gpt16_cpu.h"
#include "../kernels/gpt_cpu.h"
#include "../kernels/ops16_cpu.h"
#include "../kernels/ops_cpu.h"
#include "../kernels/par_cpu.h"
#include "../kernels/rng.h"
#include "suites.h"

/* ---- helpers ---- */

static float *random_floats(size_t n, float std, uint64_t seed)
{
	float *x = malloc((n ? n : 1) * sizeof(float));
	CU_ASSERT_PTR_NOT_NULL_FATAL(x);
	PxRng r;
	rng_init(&r, seed, 0);
	for (size_t i = 0; i < n; i++)
		x[i] = (float)(std * rng_normal(&r));
	return x;
}

static float *copy_floats(const float *x, size_t n)
{
	float *y = malloc((n ? n : 1) * sizeof(float));
	CU_ASSERT_PTR_NOT_NULL_FATAL(y);
	memcpy(y, x, n * sizeof(float));
	return y;
}

/* ---- the split ---- */

enum { MAX_CALLS = 64 };

typedef struct Calls {
	pthread_mutex_t mu;
	int n;
	size_t begin[MAX_CALLS], end[MAX_CALLS];
	pthread_t thread[MAX_CALLS];
	pthread_t caller;   /* hold_caller: the thread that called par_cpu_for */
	int worker_ran;     /* hold_caller: a chunk ran on another thread */
	int caller_waited;  /* hold_caller: the caller's chunk gave up waiting for one */
} Calls;

static void record(void *ctx, size_t begin, size_t end)
{
	Calls *c = ctx;
	pthread_mutex_lock(&c->mu);
	if (c->n < MAX_CALLS) {
		c->begin[c->n] = begin, c->end[c->n] = end;
		c->thread[c->n] = pthread_self();
	}
	c->n++;
	pthread_mutex_unlock(&c->mu);
}

/* 1 when the recorded calls are exactly the chunks [n i / k, n (i + 1) / k), i < k, each once */
static int chunks_are(const Calls *c, size_t n, size_t k)
{
	if ((size_t)c->n != k || k > MAX_CALLS)
		return 0;
	for (size_t i = 0; i < k; i++) {
		int found = 0;
		for (int j = 0; j < c->n; j++)
			found += c->begin[j] == n * i / k && c->end[j] == n * (i + 1) / k;
		if (found != 1)
			return 0;
	}
	return 1;
}

/* distinct threads among the recorded calls */
static int threads_seen(const Calls *c)
{
	int distinct = 0;
	for (int i = 0; i < c->n && i < MAX_CALLS; i++) {
		int first = 1;
		for (int j = 0; j < i; j++)
			first &= !pthread_equal(c->thread[i], c->thread[j]);
		distinct += first;
	}
	return distinct;
}

/* Records the chunk; on the caller's thread, then waits (10 s at most) until a chunk has run on
 * another thread: the call can only finish early if a worker takes part. A worker's chunk takes
 * 2 ms, time enough for every worker woken to claim one. */
static void hold_caller(void *ctx, size_t begin, size_t end)
{
	Calls *c = ctx;
	record(c, begin, end);
	int on_caller = pthread_equal(pthread_self(), c->caller);
	for (int i = 0; on_caller && i < 10000; i++) {
		pthread_mutex_lock(&c->mu);
		int ran = c->worker_ran;
		pthread_mutex_unlock(&c->mu);
		if (ran)
			return;
		usleep(1000);
	}
	pthread_mutex_lock(&c->mu);
	if (on_caller)
		c->caller_waited = 1;
	else
		c->worker_ran = 1;
	pthread_mutex_unlock(&c->mu);
	if (!on_caller)
		usleep(2000);
}

static void record_nested(void *ctx, size_t begin, size_t end)
{
	Calls *inner = ctx;
	(void)begin, (void)end;
	par_cpu_for(10, 1, record, inner);
}

/* par_cpu.h: chunk c of k is [n c / k, n (c + 1) / k), k = min(8 nt, n / min_items). At 3
 * threads, 100 items make 24 chunks and 10 items 10; min_items 4 allows 10 / 4 = 2 chunks, [0, 5)
 * and [5, 10); 3 items with min_items 4 make one, run on the caller; a call from inside a split
 * call runs whole on its own thread. */
static void test_split_as_documented(void)
{
	int before = par_cpu_threads();
	par_cpu_set_threads(3);
	CU_ASSERT_EQUAL(par_cpu_threads(), 3);
	Calls c = {.mu = PTHREAD_MUTEX_INITIALIZER};

	unsigned long split0 = par_cpu_split_calls();
	par_cpu_for(100, 1, record, &c);
	CU_ASSERT(chunks_are(&c, 100, 24));
	CU_ASSERT_EQUAL(par_cpu_split_calls(), split0 + 1);
	c.n = 0;
	par_cpu_for(10, 1, record, &c);
	CU_ASSERT(chunks_are(&c, 10, 10));
	c.n = 0;
	par_cpu_for(10, 4, record, &c);
	CU_ASSERT(chunks_are(&c, 10, 2));

	c.n = 0;
	split0 = par_cpu_split_calls();
	par_cpu_for(3, 4, record, &c);
	CU_ASSERT(chunks_are(&c, 3, 1) && pthread_equal(c.thread[0], pthread_self()));
	CU_ASSERT_EQUAL(par_cpu_split_calls(), split0);
	c.n = 0;
	par_cpu_for(0, 1, record, &c); /* nothing to do: no call */
	CU_ASSERT_EQUAL(c.n, 0);

	/* workers take part, and no more of them than the thread count allows: the pool has two
	 * workers from the 3-thread calls, and at 2 threads only one may join */
	par_cpu_set_threads(2);
	c.n = 0;
	c.caller = pthread_self();
	par_cpu_for(16, 1, hold_caller, &c);
	CU_ASSERT(chunks_are(&c, 16, 16));
	CU_ASSERT(c.worker_ran && !c.caller_waited);
	CU_ASSERT_EQUAL(threads_seen(&c), 2);

	/* the outer call's 2 chunks each make an inner call of 10 items, which runs whole */
	Calls inner = {.mu = PTHREAD_MUTEX_INITIALIZER};
	par_cpu_for(2, 1, record_nested, &inner);
	CU_ASSERT_EQUAL(inner.n, 2);
	CU_ASSERT(inner.begin[0] == 0 && inner.end[0] == 10);
	CU_ASSERT(inner.begin[1] == 0 && inner.end[1] == 10);
	par_cpu_set_threads(before);
}

/* A forked child has none of its parent's worker threads; its first split call must start its
 * own rather than wait for the parent's (GCC's OpenMP runtime hangs there), and they must take
 * part. The child gets 20 s for calls that take milliseconds. */
static void test_fork_child_splits(void)
{
	int before = par_cpu_threads();
	par_cpu_set_threads(2);
	Calls c = {.mu = PTHREAD_MUTEX_INITIALIZER, .caller = pthread_self()};
	par_cpu_for(16, 1, hold_caller, &c); /* the parent's worker exists and has worked */
	CU_ASSERT_FATAL(c.worker_ran);
	fflush(NULL);
	pid_t pid = fork();
	CU_ASSERT_FATAL(pid >= 0);
	if (pid == 0) {
		Calls k = {.mu = PTHREAD_MUTEX_INITIALIZER, .caller = pthread_self()};
		par_cpu_for(16, 1, hold_caller, &k);
		_exit(chunks_are(&k, 16, 16) && k.worker_ran && !k.caller_waited ? 0 : 1);
	}
	int st = 0, done = 0;
	for (int i = 0; i < 2000 && !done; i++) {
		done = waitpid(pid, &st, WNOHANG) == pid;
		if (!done)
			usleep(10000);
	}
	if (!done) {
		kill(pid, SIGKILL);
		waitpid(pid, &st, 0);
		fprintf(stderr, "\nfork: the child's split call did not return in 20 s\n");
	}
	CU_ASSERT(done && WIFEXITED(st) && WEXITSTATUS(st) == 0);
	par_cpu_set_threads(before);
}

/* ---- the GPT units at 1, 2 and 3 threads ---- */

/* Large enough that every split loop is split at 2 and 3 threads (par_cpu.h's grains): N = 256
 * rows of C = 256 (rows of 64, columns of 64), 4 C N = 262,144 GELU elements, 16 (batch, head)
 * pairs, 256 rows of V = 512 logits, 1.7 million parameters for AdamW. */
static const GptConfig PAR_CFG = {.V = 512, .max_T = 64, .C = 256, .L = 2, .NH = 4};
enum { PAR_B = 4, PAR_T = 64 };

/* What one fp32 forward, backward and AdamW step leave: the loss, every activation and
 * temporary (the buffers' slab), the gradients and the updated parameters and moments. */
typedef struct Fp32Run {
	float loss;
	float *slab, *grads, *params, *m, *v;
	size_t slab_elems, n;
} Fp32Run;

/* loops: the kernels' own loops' threads (0: OpenBLAS's count); blas: OpenBLAS's threads */
static void run_fp32(int loops, int blas, const float *params0, const int *tok, const int *tgt,
		     Fp32Run *out)
{
	const GptConfig *c = &PAR_CFG;
	GptCpuBuffers b;
	PxError err = {0};
	par_cpu_set_threads(blas);
	par_cpu_set_loop_threads(loops);
	CU_ASSERT_EQUAL_FATAL(gpt_cpu_buffers_init(&b, c, PAR_B, PAR_T, &err), 0);
	size_t n = gpt_cpu_n_params(c);
	size_t slab = (size_t)(b.scratch - b.slab) + gpt_cpu_scratch_bytes(c, PAR_B, PAR_T) / 4;
	memset(b.slab, 0, slab * sizeof(float));
	out->n = n, out->slab_elems = slab;
	out->params = copy_floats(params0, n);
	out->grads = calloc(n, sizeof(float));
	out->m = calloc(n, sizeof(float));
	out->v = calloc(n, sizeof(float));
	CU_ASSERT_FATAL(out->grads && out->m && out->v);
	out->loss = gpt_cpu_forward(&b, out->params, tok, tgt);
	gpt_cpu_backward(&b, out->params, out->grads, tok, tgt, 1.0f);
	OpsAdamw h = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
	ops_adamw_step(out->params, out->m, out->v, out->grads, n, &h, 1, 0.5f);
	out->slab = copy_floats(b.slab, slab);
	gpt_cpu_buffers_free(&b);
}

static void free_fp32(Fp32Run *r)
{
	free(r->slab), free(r->grads), free(r->params), free(r->m), free(r->v);
}

static int same(const void *a, const void *b, size_t bytes)
{
	return memcmp(a, b, bytes) == 0;
}

/* ||a - b|| / ||a|| over n floats (0 when both are zero). */
static double rel_diff(const float *a, const float *b, size_t n)
{
	double d = 0, s = 0;
	for (size_t i = 0; i < n; i++)
		d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]), s += (double)a[i] * a[i];
	return s > 0 ? sqrt(d / s) : sqrt(d);
}

/* OpenBLAS's products at another thread count round differently in the last bits at most: an
 * fp32 sum of K products moves by about K ulps, 64 x 6e-8 here, far under this bound; a wrong
 * product (a row left out, a thread's part not written) is off by more than 1e-2. */
#define BLAS_THREADS_TOL 1e-5
/* the bf16 units round their intermediates to bf16 (8 bits): a product that moved by its last
 * fp32 bits can flip one, a change of up to 2^-8 = 0.4% in it and what follows from it */
#define BLAS_THREADS_TOL16 4e-3

static void test_gpt_fp32_bit_identical(void)
{
	const GptConfig *c = &PAR_CFG;
	int before = par_cpu_threads(), N = PAR_B * PAR_T;
	size_t n = gpt_cpu_n_params(c);
	float *params = malloc(n * sizeof(float));
	int *tok = malloc((size_t)N * sizeof(int)), *tgt = malloc((size_t)N * sizeof(int));
	CU_ASSERT_FATAL(params && tok && tgt);
	gpt_cpu_init(c, params, 11);
	PxRng r;
	rng_init(&r, 12, 0);
	for (int i = 0; i < N; i++) /* a repeated token makes rows of dwte collide */
		tok[i] = i % 7 == 0 ? 3 : (int)(rng_next_u64(&r) % (uint64_t)c->V),
		tgt[i] = (int)(rng_next_u64(&r) % (uint64_t)c->V);

	Fp32Run one, many;
	run_fp32(1, 1, params, tok, tgt, &one);
	CU_ASSERT(isfinite(one.loss) && fabsf(one.loss - logf((float)c->V)) < 0.5f);
	for (int threads = 2; threads <= 3; threads++) {
		unsigned long split0 = par_cpu_split_calls();
		run_fp32(threads, 1, params, tok, tgt, &many);
		/* every kernel of the step split: dozens of calls (8 a block forward alone) */
		CU_ASSERT(par_cpu_split_calls() - split0 >= 40);
		CU_ASSERT(same(&one.loss, &many.loss, sizeof(float)));
		CU_ASSERT(same(one.slab, many.slab, one.slab_elems * sizeof(float)));
		CU_ASSERT(same(one.grads, many.grads, n * sizeof(float)));
		CU_ASSERT(same(one.params, many.params, n * sizeof(float)));
		CU_ASSERT(same(one.m, many.m, n * sizeof(float)));
		CU_ASSERT(same(one.v, many.v, n * sizeof(float)));
		free_fp32(&many);
	}
	run_fp32(0, 2, params, tok, tgt, &many); /* OpenBLAS's products on 2 threads too */
	CU_ASSERT(fabs((double)many.loss - one.loss) <= BLAS_THREADS_TOL * fabs((double)one.loss));
	CU_ASSERT(rel_diff(one.slab, many.slab, one.slab_elems) < BLAS_THREADS_TOL);
	CU_ASSERT(rel_diff(one.grads, many.grads, n) < BLAS_THREADS_TOL);
	CU_ASSERT(rel_diff(one.params, many.params, n) < BLAS_THREADS_TOL);
	CU_ASSERT(rel_diff(one.m, many.m, n) < BLAS_THREADS_TOL);
	free_fp32(&many);
	free_fp32(&one);
	free(params), free(tok), free(tgt);
	par_cpu_set_loop_threads(0);
	par_cpu_set_threads(before);
}

/* The bf16 units (ops16_cpu: casts, attention with its per-range temporaries, the chunked
 * head): one block forward and backward and the head's, at 1 and 2 threads. */
typedef struct Bf16Run {
	float loss;
	uint16_t *y, *acts, *hacts;
	float *dx, *grads, *hgrads, *dwte, *hdx;
} Bf16Run;

/* loops, blas: as run_fp32's */
static void run_bf16(int loops, int blas, const uint16_t *p1, const uint16_t *ph, const uint16_t *wte,
		     const uint16_t *x, const float *dy, const int *tgt, Bf16Run *o)
{
	const GptConfig *c = &PAR_CFG;
	PrecisionType t = PREC_BF16;
	int B = PAR_B, T = PAR_T;
	size_t btc = (size_t)B * T * c->C, np = gpt_cpu_unit_params(c, 1);
	size_t na = gpt16_block_act_bytes(c, t, B, T), nh = gpt16_head_act_bytes(c, t, B, T);
	float *scratch = calloc(gpt_cpu_scratch_bytes(c, B, T), 1);
	o->y = calloc(btc, 2), o->acts = calloc(na, 1), o->hacts = calloc(nh, 1);
	o->dx = calloc(btc, 4), o->grads = calloc(np, 4), o->hgrads = calloc(2 * (size_t)c->C, 4);
	o->dwte = calloc((size_t)c->V * c->C, 4), o->hdx = calloc(btc, 4);
	CU_ASSERT_FATAL(scratch && o->y && o->acts && o->hacts && o->dx && o->grads && o->hgrads &&
			o->dwte && o->hdx);
	par_cpu_set_threads(blas);
	par_cpu_set_loop_threads(loops);
	gpt16_block_forward(c, t, B, T, p1, x, o->y, o->acts);
	gpt16_block_backward(c, t, B, T, p1, o->grads, o->acts, dy, o->dx, scratch);
	o->loss = gpt16_head_forward(c, t, B, T, ph, wte, o->y, tgt, o->hacts);
	gpt16_head_backward(c, t, B, T, ph, wte, o->hgrads, o->dwte, o->hacts, tgt, 1.0f, o->hdx,
			    scratch);
	free(scratch);
}

static void free_bf16(Bf16Run *o)
{
	free(o->y), free(o->acts), free(o->hacts), free(o->dx), free(o->grads), free(o->hgrads);
	free(o->dwte), free(o->hdx);
}

static void test_gpt_bf16_bit_identical(void)
{
	const GptConfig *c = &PAR_CFG;
	PrecisionType t = PREC_BF16;
	int before = par_cpu_threads(), B = PAR_B, T = PAR_T, N = B * T;
	size_t n = gpt_cpu_n_params(c), btc = (size_t)N * c->C;
	float *params = malloc(n * sizeof(float)), *x32 = random_floats(btc, 1, 21);
	float *dy = random_floats(btc, 1, 22);
	uint16_t *p16 = malloc(n * 2), *x = malloc(btc * 2);
	int *tgt = malloc((size_t)N * sizeof(int));
	CU_ASSERT_FATAL(params && p16 && x && tgt);
	gpt_cpu_init(c, params, 13);
	ops16_round(t, p16, params, n);
	ops16_round(t, x, x32, btc);
	for (int i = 0; i < N; i++)
		tgt[i] = (i * 37 + 5) % c->V;
	const uint16_t *p1 = p16 + gpt_cpu_unit_offset(c, 1), *ph = p16 + gpt_cpu_unit_offset(c, 3);
	size_t np = gpt_cpu_unit_params(c, 1), na = gpt16_block_act_bytes(c, t, B, T);

	Bf16Run one, two;
	run_bf16(1, 1, p1, ph, p16, x, dy, tgt, &one);
	unsigned long split0 = par_cpu_split_calls();
	run_bf16(2, 1, p1, ph, p16, x, dy, tgt, &two);
	CU_ASSERT(par_cpu_split_calls() - split0 >= 20);
	CU_ASSERT(isfinite(one.loss) && same(&one.loss, &two.loss, sizeof(float)));
	CU_ASSERT(same(one.y, two.y, btc * 2));
	CU_ASSERT(same(one.acts, two.acts, na));
	CU_ASSERT(same(one.dx, two.dx, btc * 4));
	CU_ASSERT(same(one.grads, two.grads, np * 4));
	CU_ASSERT(same(one.hgrads, two.hgrads, 2 * (size_t)c->C * 4));
	CU_ASSERT(same(one.dwte, two.dwte, (size_t)c->V * c->C * 4));
	CU_ASSERT(same(one.hdx, two.hdx, btc * 4));
	free_bf16(&two);
	run_bf16(0, 2, p1, ph, p16, x, dy, tgt, &two); /* OpenBLAS's products on 2 threads too */
	CU_ASSERT(fabs((double)two.loss - one.loss) <= BLAS_THREADS_TOL16 * fabs((double)one.loss));
	CU_ASSERT(rel_diff(one.dx, two.dx, btc) < BLAS_THREADS_TOL16);
	CU_ASSERT(rel_diff(one.grads, two.grads, np) < BLAS_THREADS_TOL16);
	CU_ASSERT(rel_diff(one.hgrads, two.hgrads, 2 * (size_t)c->C) < BLAS_THREADS_TOL16);
	CU_ASSERT(rel_diff(one.dwte, two.dwte, (size_t)c->V * c->C) < BLAS_THREADS_TOL16);
	CU_ASSERT(rel_diff(one.hdx, two.hdx, btc) < BLAS_THREADS_TOL16);
	free_bf16(&one), free_bf16(&two);
	free(params), free(x32), free(dy), free(p16), free(x), free(tgt);
	par_cpu_set_loop_threads(0);
	par_cpu_set_threads(before);
}

/* ---- the executor's buffer operations ---- */

/* compute_cpu's sum of squares goes in fixed chunks, so it is the same at any thread count; it
 * must also agree with an independent sum in long double to about double rounding (n = 300,001
 * terms of size about 1: a relative error far below 1e-12). Casts and sums likewise. */
static void test_compute_buffers_bit_identical(void)
{
	const ComputeBackend *cb = &compute_cpu_backend;
	int before = par_cpu_threads();
	enum { N = 300001 };
	float *x = random_floats(N, 1, 31), *acc32 = random_floats(N, 1, 32);
	long double ref = 0;
	for (size_t i = 0; i < N; i++)
		ref += (long double)x[i] * x[i];
	double sums[3];
	uint16_t *h[3];
	float *back[3], *acc[3];
	for (int k = 0; k < 3; k++) {
		par_cpu_set_threads(k + 1);
		sums[k] = cb->sum_squares(NULL, x, DT_FP32, N);
		h[k] = malloc(N * 2), back[k] = malloc(N * 4), acc[k] = copy_floats(acc32, N);
		CU_ASSERT_FATAL(h[k] && back[k]);
		cb->convert(NULL, h[k], DT_BF16, x, DT_FP32, N);
		cb->convert(NULL, back[k], DT_FP32, h[k], DT_BF16, N);
		cb->add(NULL, acc[k], DT_FP32, x, DT_FP32, N);
		cb->add(NULL, h[k], DT_BF16, x, DT_FP32, N);
	}
	CU_ASSERT(fabsl(sums[0] - ref) <= 1e-12L * ref);
	for (int k = 1; k < 3; k++) {
		CU_ASSERT(same(&sums[0], &sums[k], sizeof(double)));
		CU_ASSERT(same(h[0], h[k], N * 2));
		CU_ASSERT(same(back[0], back[k], N * 4));
		CU_ASSERT(same(acc[0], acc[k], N * 4));
	}
	x[N - 5] = INFINITY; /* the last range's: found whichever thread has it */
	CU_ASSERT_EQUAL(cb->nonfinite(NULL, x, DT_FP32, N), 1);
	x[N - 5] = 0;
	CU_ASSERT_EQUAL(cb->nonfinite(NULL, x, DT_FP32, N), 0);
	for (int k = 0; k < 3; k++)
		free(h[k]), free(back[k]), free(acc[k]);
	free(x), free(acc32);
	par_cpu_set_threads(before);
}

int test_kernels_par_register(void)
{
	return PX_ADD_SUITE("kernels_par", {"the split as documented", test_split_as_documented},
			    {"a forked child splits on its own workers", test_fork_child_splits},
			    {"gpt fp32 step: loops bit-identical at 1-3 threads, OpenBLAS threads within 1e-5",
			     test_gpt_fp32_bit_identical},
			    {"gpt bf16 units: loops bit-identical at 1, 2 threads, OpenBLAS threads within a bf16 ulp",
			     test_gpt_bf16_bit_identical},
			    {"executor buffer sums and casts bit-identical",
			     test_compute_buffers_bit_identical});
}

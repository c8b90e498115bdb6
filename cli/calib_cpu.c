#include "calib_cpu.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../engine/clock.h"
#include "../exec/collbench.h"
#include "../exec/compute.h"
#include "../kernels/gpt16_cpu.h"
#include "../kernels/gpt_cpu.h"
#include "../kernels/onebit_cpu.h"
#include "../kernels/par_cpu.h"
#include "../kernels/quant_cpu.h"
#include "../kernels/rng.h"
#include "../sim/hwprofile.h"
#include "calib_coll.h"
#include "launch.h"

/* last: OpenBLAS's header brings <complex.h>, whose I would rename model.h's field */
#include <cblas.h>

/* Dimensions as the kernels name them: B = micro-batch, T = sequence, C = channels, hs = channels
 * per head, V = vocabulary; N = B T tokens. */

/* ---- what is measured ---- */

/* The sgemm grid: the executor's products have m = N tokens (a few hundred to a few thousand)
 * and n, k among C, 3C, 4C and V. */
static const double GRID_FULL[] = {32, 128, 512, 2048};
static const double GRID_QUICK[] = {64, 512};

/* memmove and memset sizes, bytes: in L2, in L3, past it */
static const double STREAM_FULL[] = {65536, 1048576, 16777216, 134217728};
static const double STREAM_QUICK[] = {65536, 4194304};
#define N_STREAM_MAX 4

/* Elements of each storage loop: a unit's parameters in a small model */
#define ELEM_N (1 << 18)

typedef struct KShape {
	int C, T, hs, B, V;
} KShape;

/* The kernels' shapes: 128 to 1024 tokens, widths 64 and 256, sequences 32 to 128, 32 or 64
 * channels a head, vocabularies 256 and 4096, so that each kernel's terms (hwcpu.h: BTC,
 * B T^2 C, B T^2 H, BTV and its weights W) vary independently across them. None is a bundled
 * scenario's shape. */
static const KShape BLOCK_SHAPES[] = {{64, 32, 32, 16, 256},  {64, 128, 32, 2, 256},
				      {256, 32, 64, 4, 256},  {256, 128, 64, 4, 256},
				      {256, 64, 32, 2, 256},  {64, 64, 64, 16, 256},
				      {128, 32, 32, 8, 256},  {128, 128, 64, 2, 256}};
static const KShape HEAD_SHAPES[] = {{64, 64, 32, 8, 256}, {256, 64, 64, 2, 256},
				     {64, 64, 32, 2, 4096}, {256, 64, 64, 8, 4096}};
static const KShape EMBED_SHAPES[] = {{64, 64, 32, 8, 256}, {256, 64, 64, 2, 256}};
#define MAX_SHAPES 8
#define N_BLOCK_QUICK 4

/* Each kernel with its shapes (a block's: the plan's n_block of them). */
static const struct {
	HwCpuKernel k;
	const KShape *s;
	int n;
} KERNEL_SETS[] = {
	{HWCPU_EMBED_FWD, EMBED_SHAPES, 2}, {HWCPU_EMBED_BWD, EMBED_SHAPES, 2},
	{HWCPU_BLOCK_FWD, BLOCK_SHAPES, 8}, {HWCPU_BLOCK_BWD, BLOCK_SHAPES, 8},
	{HWCPU_HEAD_FWD, HEAD_SHAPES, 4},   {HWCPU_HEAD_BWD, HEAD_SHAPES, 4},
};
#define N_KERNEL_SETS (sizeof(KERNEL_SETS) / sizeof(KERNEL_SETS[0]))

typedef struct Plan {
	const double *grid;
	int n_grid;
	const double *stream;
	int n_stream;
	int n_block;
	double target_s;        /* how long each measurement times calls for, a round */
	double kernel_target_s; /* the same for a unit kernel, whose calls are longer */
	int rounds;             /* every measurement that many times, spread over the level */
} Plan;

/* Every time in seconds, in one flat struct of doubles: the ranks' are max-reduced at once. */
typedef struct LevelTimes {
	double gemm[HWCPU_FORMS][4][4][4];
	double copy[N_STREAM_MAX], fill[N_STREAM_MAX];
	double elem[HWCPU_ELEM_OPS][HWCPU_DTYPES][HWCPU_DTYPES];
	double adamw, sgd;
	double onebit_compress, onebit_expand; /* over ELEM_N elements */
	double quantize, dequantize;           /* INT8 in QUANT_BLOCK blocks, ELEM_N elements */
	double kernel[HWCPU_FLAVOURS][HWCPU_KERNELS][MAX_SHAPES];
	double products[HWCPU_FLAVOURS][HWCPU_KERNELS][MAX_SHAPES]; /* the kernel's sgemm calls */
} LevelTimes;

#define MAX_ROUNDS 5

typedef struct Bench {
	Comm *world; /* NULL: one rank */
	Plan plan;
	const ComputeBackend *cb;
	LevelTimes t;                 /* the round being measured, then the level's figures */
	LevelTimes round[MAX_ROUNDS];
	PxError *err;
	int failed;
} Bench;

/* ---- timing ---- */

typedef void (*BenchFn)(void *arg);

/* The time of one call to fn: after an untimed call (and one timed to learn how long a call
 * takes), the mean of as many calls as fit in `target` seconds (at least one). Every rank starts
 * each measurement together (a barrier), so that the level's ranks share the machine
 * throughout. A level is measured in rounds, each figure taken from all its rounds'
 * (quartile_of_rounds): on a machine that other processes load now and then, a burst moves the
 * measurements of one round, not the figure. */
static double time_for(Bench *b, BenchFn fn, void *arg, double target)
{
	if (b->failed || (b->world && comm_barrier(b->world, b->err))) {
		b->failed = 1;
		return 0;
	}
	fn(arg);
	double t0 = px_now_s();
	fn(arg);
	double first = px_now_s() - t0;
	int reps = first > 0 ? (int)fmin(fmax(target / first, 1), 200) : 200;
	t0 = px_now_s();
	for (int r = 0; r < reps; r++)
		fn(arg);
	return (px_now_s() - t0) / reps;
}

static double time_mean(Bench *b, BenchFn fn, void *arg)
{
	return time_for(b, fn, arg, b->plan.target_s);
}

static void fill_normal(float *x, size_t n, double std, uint64_t stream)
{
	PxRng r;
	rng_init(&r, 20240601, stream);
	for (size_t i = 0; i < n; i++)
		x[i] = (float)(std * rng_normal(&r));
}

/* ---- sgemm ---- */

typedef struct Gemm {
	HwCpuForm form;
	int m, n, k;
	float *a, *b, *c;
} Gemm;

/* As kernels/ops_cpu.c calls it: row-major, beta 1 (the bias or the gradient it adds to). */
static void gemm_call(void *arg)
{
	const Gemm *g = arg;
	int ta = g->form == HWCPU_TN, tb = g->form == HWCPU_NT;
	cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
		    g->m, g->n, g->k, 1.0f, g->a, ta ? g->m : g->k, g->b, tb ? g->k : g->n, 1.0f,
		    g->c, g->n);
}

/* Operands for products up to max x max x max. */
static int gemm_buffers(Gemm *g, double max)
{
	size_t n = (size_t)max * (size_t)max;
	g->a = malloc(n * sizeof(float));
	g->b = malloc(n * sizeof(float));
	g->c = calloc(n, sizeof(float));
	if (!g->a || !g->b || !g->c)
		return -1;
	fill_normal(g->a, n, 1, 1);
	fill_normal(g->b, n, 0.02, 2);
	return 0;
}

static double gemm_time(Bench *b, Gemm *g, HwCpuForm form, int m, int n, int k)
{
	g->form = form, g->m = m, g->n = n, g->k = k;
	return time_mean(b, gemm_call, g);
}

static void measure_gemm(Bench *b, Gemm *g)
{
	const Plan *p = &b->plan;
	for (int f = 0; f < HWCPU_FORMS; f++)
		for (int i = 0; i < p->n_grid; i++)
			for (int j = 0; j < p->n_grid; j++)
				for (int q = 0; q < p->n_grid; q++)
					b->t.gemm[f][i][j][q] = gemm_time(b, g, (HwCpuForm)f,
									  (int)p->grid[i], (int)p->grid[j],
									  (int)p->grid[q]);
}

/* ---- memory and the storage loops ---- */

typedef struct Loop {
	const ComputeBackend *cb;
	void *cx;
	int what; /* -1 copy, -2 fill, -3 adamw, -4 sgd, else a HwCpuElemOp */
	Dtype dst, src;
	size_t n;    /* elements, or bytes for copy and fill */
	void *x, *y; /* dst, src */
	float *m, *v, *g;
} Loop;

static const Dtype DTYPES[HWCPU_DTYPES] = {DT_FP32, DT_BF16, DT_FP16};

static void loop_call(void *arg)
{
	Loop *l = arg;
	static const OpsAdamw h = {1e-4, 0.9, 0.95, 1e-8, 0.01};
	switch (l->what) {
	case -1: l->cb->convert(l->cx, l->x, DT_FP32, l->y, DT_FP32, l->n / 4); break;
	case -2: l->cb->zero(l->cx, PLACE_CPU, l->x, l->n); break;
	case -3: l->cb->adamw(l->cx, PLACE_CPU, l->x, l->m, l->v, l->g, l->n, &h, 10, 1.0f); break;
	case -4: l->cb->sgd(l->cx, PLACE_CPU, l->x, l->m, l->g, l->n, 1e-4f, 0.9f, 0.01f, 1.0f); break;
	case HWCPU_CONVERT: l->cb->convert(l->cx, l->x, l->dst, l->y, l->src, l->n); break;
	case HWCPU_ADD: l->cb->add(l->cx, l->x, l->dst, l->y, l->src, l->n); break;
	case HWCPU_SUMSQ: (void)l->cb->sum_squares(l->cx, l->y, l->src, l->n); break;
	default: (void)l->cb->nonfinite(l->cx, l->y, l->src, l->n); break;
	}
}

static void measure_stream(Bench *b, void *cx)
{
	const Plan *p = &b->plan;
	size_t max = (size_t)p->stream[p->n_stream - 1];
	Loop l = {.cb = b->cb, .cx = cx, .x = malloc(max), .y = malloc(max)};
	if (!l.x || !l.y) {
		b->failed = 1;
		px_fail(b->err, PX_ERR_RUNTIME, "out of memory for %zu bytes", 2 * max);
	} else {
		memset(l.x, 1, max), memset(l.y, 2, max); /* the pages exist before the timing */
	}
	for (int i = 0; i < p->n_stream && !b->failed; i++) {
		l.n = (size_t)p->stream[i];
		l.what = -1;
		b->t.copy[i] = time_mean(b, loop_call, &l);
		l.what = -2;
		b->t.fill[i] = time_mean(b, loop_call, &l);
	}
	free(l.x), free(l.y);
}

/* The 1-bit compressed all-reduce's arithmetic (kernels/onebit_cpu.h) on n elements: a worker's
 * compensation and compression (expand 0), or the expansion of n signs at one scale (1). */
typedef struct OnebitLoop {
	int expand;
	size_t n;
	float *m, *error, *buf;
	uint8_t *bits;
} OnebitLoop;

static void onebit_call(void *arg)
{
	OnebitLoop *o = arg;
	float scale = 1e-2f;
	if (o->expand) {
		onebit_cpu_expand(o->bits, &scale, o->n, o->n, o->buf);
		return;
	}
	onebit_cpu_compensate(o->m, o->n, o->error, o->n, o->buf);
	(void)onebit_cpu_compress(o->buf, o->n, o->bits, o->error);
}

static void measure_onebit(Bench *b, const float *src)
{
	OnebitLoop o = {0, ELEM_N, (float *)src, calloc(ELEM_N, sizeof(float)),
			malloc(ELEM_N * sizeof(float)), malloc(ELEM_N / 8)};
	if (!o.error || !o.buf || !o.bits) {
		b->failed = 1;
		px_fail(b->err, PX_ERR_RUNTIME, "out of memory for the 1-bit loops");
	} else {
		b->t.onebit_compress = time_mean(b, onebit_call, &o);
		o.expand = 1;
		b->t.onebit_expand = time_mean(b, onebit_call, &o);
	}
	free(o.error), free(o.buf), free(o.bits);
}

/* ZeRO++'s INT8 blocks (kernels/quant_cpu.h) of about the size qwZ's groups aim at
 * (BUILD_QWZ_TARGET_GROUP) */
#define QUANT_BLOCK 8192

typedef struct QuantLoop {
	int back;      /* dequantize */
	float *x;      /* ELEM_N values, written back by dequantize */
	int8_t *q;     /* ELEM_N */
	float *scales; /* ELEM_N / QUANT_BLOCK */
} QuantLoop;

static void quant_call(void *arg)
{
	QuantLoop *o = arg;
	if (o->back)
		quant_block_dequantize(o->q, o->scales, ELEM_N, QUANT_BLOCK, 8, o->x);
	else
		quant_block_quantize(o->x, ELEM_N, QUANT_BLOCK, 8, o->q, o->scales);
}

static void measure_quant(Bench *b, const float *src)
{
	QuantLoop o = {0, malloc(ELEM_N * sizeof(float)), malloc(ELEM_N),
		       malloc(ELEM_N / QUANT_BLOCK * sizeof(float))};
	if (!o.x || !o.q || !o.scales) {
		b->failed = 1;
		px_fail(b->err, PX_ERR_RUNTIME, "out of memory for the quantization loops");
	} else {
		memcpy(o.x, src, ELEM_N * sizeof(float));
		b->t.quantize = time_mean(b, quant_call, &o);
		o.back = 1;
		b->t.dequantize = time_mean(b, quant_call, &o);
	}
	free(o.x), free(o.q), free(o.scales);
}

static void measure_loops(Bench *b, void *cx)
{
	float *src = malloc(ELEM_N * sizeof(float)), *opt = calloc(3 * (size_t)ELEM_N, sizeof(float));
	void *typed[HWCPU_DTYPES] = {NULL}, *dst = malloc(ELEM_N * sizeof(float));
	int ok = src && opt && dst;
	for (int d = 0; d < HWCPU_DTYPES && ok; d++)
		ok = (typed[d] = malloc(ELEM_N * sizeof(float))) != NULL;
	if (!ok) {
		b->failed = 1;
		px_fail(b->err, PX_ERR_RUNTIME, "out of memory for the storage loops");
		goto out;
	}
	fill_normal(src, ELEM_N, 1e-2, 3); /* gradients' and weights' magnitudes */
	for (int d = 0; d < HWCPU_DTYPES; d++)
		b->cb->convert(cx, typed[d], DTYPES[d], src, DT_FP32, ELEM_N);
	Loop l = {.cb = b->cb, .cx = cx, .n = ELEM_N, .x = dst};
	for (int op = 0; op < HWCPU_ELEM_OPS; op++)
		for (int i = 0; i < HWCPU_DTYPES; i++)
			for (int j = 0; j < HWCPU_DTYPES; j++) {
				if ((op < HWCPU_SUMSQ && op == HWCPU_CONVERT && i == j) ||
				    (op >= HWCPU_SUMSQ && i != j))
					continue; /* a like-to-like convert is a copy */
				b->cb->convert(cx, dst, DTYPES[i], src, DT_FP32, ELEM_N);
				l.what = op, l.dst = DTYPES[i], l.src = DTYPES[j], l.y = typed[j];
				b->t.elem[op][i][j] = time_mean(b, loop_call, &l);
			}
	memcpy(dst, src, ELEM_N * sizeof(float));
	l.what = -3, l.m = opt, l.v = opt + ELEM_N, l.g = opt + 2 * (size_t)ELEM_N;
	memcpy(l.g, src, ELEM_N * sizeof(float));
	b->t.adamw = time_mean(b, loop_call, &l);
	l.what = -4;
	b->t.sgd = time_mean(b, loop_call, &l);
	measure_onebit(b, src);
	measure_quant(b, src);
out:
	free(src), free(opt), free(dst);
	for (int d = 0; d < HWCPU_DTYPES; d++)
		free(typed[d]);
}

/* ---- the unit kernels ---- */

typedef struct Unit {
	const ComputeBackend *cb;
	void *cx;
	HwCpuKernel kind;
	void *params, *x, *y, *acts;
	float *grads, *dy, *dx, *scratch;
	int *tokens;
	size_t own; /* the head's own parameters, before the token embedding */
} Unit;

static void unit_call(void *arg)
{
	Unit *u = arg;
	const ComputeBackend *cb = u->cb;
	size_t e = 0; /* the head's token embedding, past its own parameters */
	switch (u->kind) {
	case HWCPU_EMBED_FWD: cb->embed_forward(u->cx, u->params, u->y, u->scratch); break;
	case HWCPU_EMBED_BWD: cb->embed_backward(u->cx, u->grads, u->dy, u->scratch); break;
	case HWCPU_BLOCK_FWD:
		cb->block_forward(u->cx, u->params, u->x, u->y, u->acts, u->scratch);
		break;
	case HWCPU_BLOCK_BWD:
		cb->block_backward(u->cx, u->params, u->grads, u->acts, u->dy, u->dx, u->scratch);
		break;
	case HWCPU_HEAD_FWD:
		e = u->own;
		(void)cb->head_forward(u->cx, u->params, (char *)u->params + e, u->x, u->acts,
				       u->scratch);
		break;
	default:
		e = u->own;
		cb->head_backward(u->cx, u->params, (char *)u->params + e, u->grads,
				  u->grads + u->own / sizeof(float), u->acts, 1.0f, u->dx, u->scratch);
		break;
	}
}

/* The products kernel k runs at shape s, as kernels/gpt_cpu.c calls them; returns how many. */
static int kernel_products(HwCpuKernel k, const KShape *s, Gemm out[12])
{
	int N = s->B * s->T, C = s->C, n = 0;
	static const int io[4][2] = {{1, 3}, {1, 1}, {1, 4}, {4, 1}}; /* qkv, o, fc, down: x C */
	if (k == HWCPU_BLOCK_FWD || k == HWCPU_BLOCK_BWD)
		for (int i = 0; i < 4; i++) {
			int ci = io[i][0] * C, co = io[i][1] * C;
			if (k == HWCPU_BLOCK_FWD) {
				out[n++] = (Gemm){HWCPU_NN, N, co, ci, 0, 0, 0};
				continue;
			}
			out[n++] = (Gemm){HWCPU_NT, N, ci, co, 0, 0, 0};
			out[n++] = (Gemm){HWCPU_TN, ci, co, N, 0, 0, 0};
		}
	if (k == HWCPU_HEAD_FWD)
		out[n++] = (Gemm){HWCPU_NT, N, s->V, C, 0, 0, 0};
	if (k == HWCPU_HEAD_BWD) {
		out[n++] = (Gemm){HWCPU_NN, N, C, s->V, 0, 0, 0};
		out[n++] = (Gemm){HWCPU_TN, s->V, C, N, 0, 0, 0};
	}
	return n;
}

static void unit_free(Unit *u)
{
	free(u->params), free(u->x), free(u->y), free(u->acts), free(u->grads), free(u->dy);
	free(u->dx), free(u->scratch), free(u->tokens);
	if (u->cx)
		u->cb->destroy(u->cx);
}

/* Buffers for one unit kernel at shape s, flavour fl, with a model's values: parameters as
 * gpt_cpu initialises them, a normalised hidden stream, small gradients. */
static int unit_init(Unit *u, const ComputeBackend *cb, int fl, HwCpuKernel k, const KShape *s,
		     PxError *err)
{
	Dtype dt = fl == HWCPU_FP32 ? DT_FP32 : DT_BF16;
	ComputeShape sh = {{s->V, s->T, s->C, 1, s->C / s->hs}, s->B, s->T, 0, dt, {0}};
	PrecisionType t = compute_prec(dt);
	size_t e = (size_t)dtype_bytes(dt), btc = (size_t)s->B * s->T * s->C;
	int unit = k <= HWCPU_EMBED_BWD ? 0 : k <= HWCPU_BLOCK_BWD ? 1 : 2;
	size_t np = gpt_cpu_unit_params(&sh.cfg, unit), vc = (size_t)s->V * s->C;
	size_t all = np + (unit == 2 ? vc : 0);
	memset(u, 0, sizeof(*u));
	u->cb = cb, u->kind = k, u->own = np * e;
	if (cb->create(&sh, &u->cx, err))
		return -1;
	size_t acts = unit == 2 ? gpt16_head_act_bytes(&sh.cfg, t, s->B, s->T) :
				  gpt16_block_act_bytes(&sh.cfg, t, s->B, s->T);
	float *tmp = malloc((all + (size_t)s->T * s->C) * sizeof(float)); /* + positions */
	u->params = malloc(all * e), u->grads = calloc(all, sizeof(float));
	u->x = malloc(btc * e), u->y = malloc(btc * e), u->acts = calloc(acts, 1);
	u->dy = malloc(btc * sizeof(float)), u->dx = calloc(btc, sizeof(float));
	u->scratch = calloc(gpt_cpu_scratch_bytes(&sh.cfg, s->B, s->T), 1);
	u->tokens = malloc((size_t)s->B * s->T * sizeof(int));
	if (!tmp || !u->params || !u->grads || !u->x || !u->y || !u->acts || !u->dy || !u->dx ||
	    !u->scratch || !u->tokens) {
		free(tmp);
		return px_fail(err, PX_ERR_RUNTIME, "out of memory for a kernel's buffers");
	}
	gpt_cpu_init_unit(&sh.cfg, unit, tmp, 7);
	if (unit == 2) /* the tied token embedding */
		gpt_cpu_init_unit(&sh.cfg, 0, tmp + np, 7);
	cb->convert(u->cx, u->params, dt, tmp, DT_FP32, all);
	free(tmp);
	for (int i = 0; i < s->B * s->T; i++)
		u->tokens[i] = (int)((i * 2654435761u) % (unsigned)s->V);
	cb->set_tokens(u->cx, u->tokens, u->tokens);
	fill_normal(u->dx, btc, 1, 4); /* the stream's values, then rounded into x */
	cb->convert(u->cx, u->x, dt, u->dx, DT_FP32, btc);
	memset(u->dx, 0, btc * sizeof(float));
	fill_normal(u->dy, btc, 1e-3, 5);
	/* backward reads what forward keeps */
	if (k == HWCPU_BLOCK_BWD)
		cb->block_forward(u->cx, u->params, u->x, u->y, u->acts, u->scratch);
	if (k == HWCPU_HEAD_BWD)
		(void)cb->head_forward(u->cx, u->params, (char *)u->params + u->own, u->x, u->acts,
				       u->scratch);
	return 0;
}

static int n_shapes(const Bench *b, size_t set)
{
	return KERNEL_SETS[set].s == BLOCK_SHAPES ? b->plan.n_block : KERNEL_SETS[set].n;
}

static void measure_kernels(Bench *b, Gemm *g)
{
	for (int fl = 0; fl < HWCPU_FLAVOURS; fl++)
		for (size_t i = 0; i < N_KERNEL_SETS && !b->failed; i++) {
			const KShape *shapes = KERNEL_SETS[i].s;
			HwCpuKernel k = KERNEL_SETS[i].k;
			int n = n_shapes(b, i);
			for (int j = 0; j < n && !b->failed; j++) {
				Unit u;
				Gemm prod[12];
				if (unit_init(&u, b->cb, fl, k, &shapes[j], b->err)) {
					unit_free(&u);
					b->failed = 1;
					return;
				}
				b->t.kernel[fl][k][j] = time_for(b, unit_call, &u,
								  b->plan.kernel_target_s);
				unit_free(&u);
				int np = kernel_products(k, &shapes[j], prod);
				for (int q = 0; q < np; q++)
					b->t.products[fl][k][j] += gemm_time(b, g, prod[q].form, prod[q].m,
									     prod[q].n, prod[q].k);
			}
		}
}

/* ---- fitting the kernels' terms ---- */

/* The terms (hwcpu.h) of kernel k at shape s. */
static void shape_terms(HwCpuKernel k, const KShape *s, double t[HWCPU_TERMS])
{
	double N = (double)s->B * s->T, C = s->C;
	memset(t, 0, HWCPU_TERMS * sizeof(double));
	t[HWCPU_BTC] = N * C;
	if (k == HWCPU_BLOCK_FWD || k == HWCPU_BLOCK_BWD) {
		t[HWCPU_BTTC] = N * s->T * C;
		t[HWCPU_BTTH] = N * s->T * (C / s->hs);
		t[HWCPU_W] = 12 * C * C + 13 * C; /* gpt_cpu_unit_params of a block */
	}
	if (k == HWCPU_HEAD_FWD || k == HWCPU_HEAD_BWD) {
		t[HWCPU_BTV] = N * s->V;
		t[HWCPU_W] = 2 * C + (double)s->V * C; /* the final norm, the tied embedding */
	}
}

/* Least squares of y ~ X c over the columns in `use` (a bit set), each row weighted by 1/y (the
 * relative error is what matters); c of the other columns 0. -1 when singular. */
static int lsq(const double (*X)[HWCPU_TERMS], const double *y, int n, unsigned use, double *c)
{
	double A[HWCPU_TERMS][HWCPU_TERMS + 1] = {{0}};
	int col[HWCPU_TERMS], m = 0;
	for (int j = 0; j < HWCPU_TERMS; j++)
		if (use >> j & 1)
			col[m++] = j;
	for (int r = 0; r < n; r++) {
		double w = y[r] > 0 ? 1 / (y[r] * y[r]) : 0;
		for (int a = 0; a < m; a++) {
			for (int q = 0; q < m; q++)
				A[a][q] += w * X[r][col[a]] * X[r][col[q]];
			A[a][m] += w * X[r][col[a]] * y[r];
		}
	}
	for (int a = 0; a < m; a++) { /* Gauss-Jordan with partial pivoting */
		int piv = a;
		for (int r = a + 1; r < m; r++)
			if (fabs(A[r][a]) > fabs(A[piv][a]))
				piv = r;
		if (fabs(A[piv][a]) < 1e-300)
			return -1;
		for (int q = 0; q <= m; q++) {
			double tmp = A[a][q];
			A[a][q] = A[piv][q], A[piv][q] = tmp;
		}
		for (int r = 0; r < m; r++) {
			if (r == a)
				continue;
			double f = A[r][a] / A[a][a];
			for (int q = a; q <= m; q++)
				A[r][q] -= f * A[a][q];
		}
	}
	memset(c, 0, HWCPU_TERMS * sizeof(double));
	for (int a = 0; a < m; a++)
		c[col[a]] = A[a][m] / A[a][a];
	return 0;
}

/* Non-negative least squares over the kernel's terms by trying every subset of them (four at
 * most): the feasible fit with the smallest weighted residual. Returns the largest relative error
 * left at the shapes, in *worst. */
static void fit_terms(HwCpuKernel k, const KShape *s, const double *time, int n,
		      double c[HWCPU_TERMS], double *worst)
{
	double X[MAX_SHAPES][HWCPU_TERMS], best = INFINITY;
	unsigned avail = 0;
	for (int r = 0; r < n; r++) {
		shape_terms(k, &s[r], X[r]);
		for (int j = 0; j < HWCPU_TERMS; j++)
			avail |= (X[r][j] > 0) << j;
	}
	memset(c, 0, HWCPU_TERMS * sizeof(double));
	for (unsigned use = 1; use < 1u << HWCPU_TERMS; use++) {
		double t[HWCPU_TERMS], res = 0;
		if ((use & ~avail) || __builtin_popcount(use) > n || lsq(X, time, n, use, t))
			continue;
		int ok = 1;
		for (int j = 0; j < HWCPU_TERMS; j++)
			ok &= t[j] >= 0;
		for (int r = 0; r < n && ok; r++) {
			double p = 0;
			for (int j = 0; j < HWCPU_TERMS; j++)
				p += t[j] * X[r][j];
			res += time[r] > 0 ? (p - time[r]) * (p - time[r]) / (time[r] * time[r]) : 0;
		}
		if (ok && res < best)
			best = res, memcpy(c, t, sizeof(t));
	}
	*worst = 0;
	for (int r = 0; r < n; r++) {
		double p = 0;
		for (int j = 0; j < HWCPU_TERMS; j++)
			p += c[j] * X[r][j];
		if (time[r] > 0)
			*worst = fmax(*worst, fabs(p - time[r]) / time[r]);
	}
}

/* ---- one level: every rank measures, rank 0 writes ---- */

static cJSON *pair(double x, double y)
{
	cJSON *a = cJSON_CreateArray();
	cJSON_AddItemToArray(a, cJSON_CreateNumber(x));
	cJSON_AddItemToArray(a, cJSON_CreateNumber(y));
	return a;
}

/* Round to 4 significant digits: the figures are means of a loaded machine's calls. */
static double sig4(double v)
{
	if (!(v != 0) || !isfinite(v))
		return v;
	double e = pow(10, floor(log10(fabs(v))) - 3);
	return round(v / e) * e;
}

static void sgemm_json(const Bench *b, cJSON *lv)
{
	const Plan *p = &b->plan;
	cJSON *s = cJSON_AddObjectToObject(lv, "sgemm");
	cJSON_AddStringToObject(s, "_comment", "[m, n, k, GFLOP/s]: cblas_sgemm row-major, beta 1, "
				"as kernels/ops_cpu.c calls it: nn = x w, nt = dy w^T (and the tied "
				"head's x wte^T), tn = x^T dy; 2 m n k FLOPs over the slowest rank's mean "
				"call with every rank of the level multiplying at once");
	for (int f = 0; f < HWCPU_FORMS; f++) {
		cJSON *a = cJSON_AddArrayToObject(s, hwcpu_form_names[f]);
		for (int i = 0; i < p->n_grid; i++)
			for (int j = 0; j < p->n_grid; j++)
				for (int q = 0; q < p->n_grid; q++) {
					double t = b->t.gemm[f][i][j][q];
					cJSON *pt = cJSON_CreateArray();
					cJSON_AddItemToArray(pt, cJSON_CreateNumber(p->grid[i]));
					cJSON_AddItemToArray(pt, cJSON_CreateNumber(p->grid[j]));
					cJSON_AddItemToArray(pt, cJSON_CreateNumber(p->grid[q]));
					cJSON_AddItemToArray(pt, cJSON_CreateNumber(sig4(
						2 * p->grid[i] * p->grid[j] * p->grid[q] / t / 1e9)));
					cJSON_AddItemToArray(a, pt);
				}
	}
}

static void kernels_json(const Bench *b, cJSON *lv)
{
	char note[512];
	cJSON *ks = cJSON_AddObjectToObject(lv, "kernels");
	cJSON_AddStringToObject(ks, "_comment", "seconds per element of each term of the executor's "
				"unit kernels (exec/compute.h) less their products: each kernel timed "
				"at N 128 to 1024 tokens, C 64 and 256, T 32 to 128, 32 or 64 channels "
				"a head, V 256 and 4096, with gpt_cpu's initial weights, its products "
				"timed apart at the same shapes, the rest fitted (non-negative least "
				"squares in relative error) to btc (B T C), bttc (B T^2 C), btth "
				"(B T^2 H), btv (B T V) and w (the unit's weights)");
	for (int fl = 0; fl < HWCPU_FLAVOURS; fl++) {
		cJSON *f = cJSON_AddObjectToObject(ks, hwcpu_flavour_names[fl]);
		for (size_t i = 0; i < N_KERNEL_SETS; i++) {
			HwCpuKernel k = KERNEL_SETS[i].k;
			int n = n_shapes(b, i);
			double rest[MAX_SHAPES], c[HWCPU_TERMS], worst, sum = 0;
			for (int j = 0; j < n; j++) {
				rest[j] = fmax(b->t.kernel[fl][k][j] - b->t.products[fl][k][j], 0);
				sum += b->t.kernel[fl][k][j];
			}
			fit_terms(k, KERNEL_SETS[i].s, rest, n, c, &worst);
			cJSON *o = cJSON_AddObjectToObject(f, hwcpu_kernel_names[k]);
			for (int j = 0; j < HWCPU_TERMS; j++)
				if (c[j] > 0)
					cJSON_AddNumberToObject(o, hwcpu_term_names[j], sig4(c[j]));
			snprintf(note, sizeof(note), "%d shapes, %.3g ms a call on average; the fit "
				 "misses the non-GEMM time by at most %.1f%%", n, sum / n * 1e3,
				 worst * 100);
			cJSON_AddStringToObject(o, "_fit", note);
			int k0 = 0;
			for (int j = 0; j < n; j++) {
				const KShape *sh = &KERNEL_SETS[i].s[j];
				k0 += snprintf(note + k0, sizeof(note) - (size_t)k0, "%sC %d T %d hs %d "
					       "B %d V %d: %.3g ms (products %.3g)", j ? "; " : "",
					       sh->C, sh->T, sh->hs, sh->B, sh->V,
					       b->t.kernel[fl][k][j] * 1e3,
					       b->t.products[fl][k][j] * 1e3);
				if (k0 >= (int)sizeof(note))
					break;
			}
			cJSON_AddStringToObject(o, "_shapes", note);
		}
	}
}

static void loops_json(const Bench *b, cJSON *lv)
{
	const Plan *p = &b->plan;
	char name[64];
	cJSON *e = cJSON_AddObjectToObject(lv, "elementwise_s");
	cJSON_AddStringToObject(e, "_comment", "seconds per element of the executor's storage loops "
				"(exec/compute.h's convert DST from SRC, add DST += SRC, sum_squares, "
				"nonfinite), updates, the 1-bit all-reduce's arithmetic "
				"(kernels/onebit_cpu.c) and ZeRO++'s INT8 quantization in blocks of 8192 "
				"(kernels/quant_cpu.c), over 2^18 elements");
	for (int op = 0; op < HWCPU_ELEM_OPS; op++)
		for (int i = 0; i < HWCPU_DTYPES; i++)
			for (int j = 0; j < HWCPU_DTYPES; j++) {
				double t = b->t.elem[op][i][j];
				if (t <= 0)
					continue;
				if (op < HWCPU_SUMSQ)
					snprintf(name, sizeof(name), "%s.%s.%s", hwcpu_elem_names[op],
						 hwcpu_dtype_names[i], hwcpu_dtype_names[j]);
				else
					snprintf(name, sizeof(name), "%s.%s", hwcpu_elem_names[op],
						 hwcpu_dtype_names[j]);
				cJSON_AddNumberToObject(e, name, sig4(t / ELEM_N));
			}
	cJSON_AddNumberToObject(e, "adamw.fp32", sig4(b->t.adamw / ELEM_N));
	cJSON_AddNumberToObject(e, "sgd.fp32", sig4(b->t.sgd / ELEM_N));
	cJSON_AddNumberToObject(e, "onebit_compress.fp32", sig4(b->t.onebit_compress / ELEM_N));
	cJSON_AddNumberToObject(e, "onebit_expand.fp32", sig4(b->t.onebit_expand / ELEM_N));
	cJSON_AddNumberToObject(e, "quantize.int8", sig4(b->t.quantize / ELEM_N));
	cJSON_AddNumberToObject(e, "dequantize.int8", sig4(b->t.dequantize / ELEM_N));
	cJSON *c = cJSON_AddArrayToObject(lv, "copy_GBps"), *f = cJSON_AddArrayToObject(lv, "fill_GBps");
	for (int i = 0; i < p->n_stream; i++) {
		cJSON_AddItemToArray(c, pair(p->stream[i], sig4(p->stream[i] / b->t.copy[i] / 1e9)));
		cJSON_AddItemToArray(f, pair(p->stream[i], sig4(p->stream[i] / b->t.fill[i] / 1e9)));
	}
}

static void mpi_json(const CalibColl *cc, cJSON *lv)
{
	char note[320];
	cJSON *m = cJSON_AddObjectToObject(lv, "mpi");
	snprintf(note, sizeof(note), "[nccl-tests size in bytes, seconds]: one call over %d ranks "
		 "on host memory, the slowest rank's mean of the timed calls, each size's time at "
		 "most every larger size's (exec/collbench.c)", cc->bench.nranks);
	cJSON_AddStringToObject(m, "_comment", note);
	for (int k = 0; k < COLLBENCH_KINDS; k++) {
		cJSON *a = cJSON_AddArrayToObject(m, coll_name(collbench_kinds[k]));
		double t[COLLBENCH_MAX_SIZES];
		collbench_envelope(&cc->bench, k, t);
		for (int s = 0; s < cc->bench.n_sizes; s++)
			cJSON_AddItemToArray(a, pair(cc->bench.size_bytes[s], sig4(t[s])));
	}
}

static void plan_init(Plan *p, int quick)
{
	*p = (Plan){GRID_FULL, 4, STREAM_FULL, 4, 8, 0.01, 0.06, MAX_ROUNDS};
	if (quick)
		*p = (Plan){GRID_QUICK, 2, STREAM_QUICK, 2, N_BLOCK_QUICK, 0.002, 0.002, 3};
}

/* Every figure the lower quartile of its rounds' (the second of five): what the machine does when
 * the other processes a shared machine runs leave it alone, which a burst of theirs (one round)
 * or a longer stretch (up to three) cannot move, while one lucky round cannot either. */
static void quartile_of_rounds(Bench *b)
{
	enum { N = sizeof(LevelTimes) / sizeof(double) };
	double *out = (double *)(void *)&b->t, v[MAX_ROUNDS];
	int n = b->plan.rounds;
	for (int i = 0; i < N; i++) {
		for (int r = 0; r < n; r++) {
			v[r] = ((const double *)(const void *)&b->round[r])[i];
			for (int j = r; j > 0 && v[j] < v[j - 1]; j--) { /* insertion: a handful */
				double x = v[j];
				v[j] = v[j - 1], v[j - 1] = x;
			}
		}
		out[i] = v[n / 4];
	}
}

/* The slowest rank's time of every measurement, on every rank. */
static int max_over_ranks(Bench *b)
{
	enum { N = sizeof(LevelTimes) / sizeof(double) };
	double *d = (double *)(void *)&b->t;
	float *f = malloc(N * sizeof(float));
	if (!f)
		return px_fail(b->err, PX_ERR_RUNTIME, "out of memory");
	for (int i = 0; i < N; i++)
		f[i] = (float)d[i];
	int rc = collbench_max(b->world, NULL, NULL, f, N, b->err);
	for (int i = 0; !rc && i < N; i++)
		d[i] = f[i];
	free(f);
	return rc;
}

/* Every rank of world (NULL: this process alone) measures; *out (rank 0's, else NULL) is the
 * level's object. */
static int measure_level(const CalibOpts *o, Comm *world, cJSON **out, PxError *err)
{
	Bench *b = calloc(1, sizeof(*b));
	Gemm g = {0};
	void *cx = NULL;
	int rank = world ? comm_rank(world) : 0, ranks = world ? comm_size(world) : 1, rc = -1;
	ComputeShape sh = {{256, 64, 64, 1, 2}, 1, 64, 0, DT_FP32, {0}};
	*out = NULL;
	if (!b)
		return px_fail(err, PX_ERR_RUNTIME, "out of memory");
	b->world = world, b->err = err, b->cb = &compute_cpu_backend;
	plan_init(&b->plan, o->quick);
	if (gemm_buffers(&g, fmax(b->plan.grid[b->plan.n_grid - 1], 4096)) ||
	    b->cb->create(&sh, &cx, err)) {
		px_fail(err, PX_ERR_RUNTIME, "out of memory for the products' operands");
		goto out;
	}
	calib_maybe_hang(o, rank);
	for (int r = 0; r < b->plan.rounds && !b->failed; r++) {
		memset(&b->t, 0, sizeof(b->t));
		measure_gemm(b, &g);
		measure_stream(b, cx);
		measure_loops(b, cx);
		measure_kernels(b, &g);
		b->round[r] = b->t;
	}
	if (b->failed)
		goto out;
	quartile_of_rounds(b);
	if (world && max_over_ranks(b))
		goto out;
	CalibColl coll;
	if (world && calib_coll_measure(&coll, world, NULL, NULL, o->quick, NULL, "mpi (host memory)",
					NULL, err))
		goto out;
	rc = 0;
	if (rank != 0)
		goto out;
	cJSON *lv = cJSON_CreateObject();
	cJSON_AddNumberToObject(lv, "ranks", ranks);
	sgemm_json(b, lv);
	kernels_json(b, lv);
	loops_json(b, lv);
	if (world)
		mpi_json(&coll, lv);
	*out = lv;
out:
	free(g.a), free(g.b), free(g.c);
	if (cx)
		b->cb->destroy(cx);
	free(b);
	return rc;
}

/* ---- the machine and the profile ---- */

/* "model name" of /proc/cpuinfo, or "" */
static void cpu_model(char *buf, size_t n)
{
	char line[512];
	FILE *f = fopen("/proc/cpuinfo", "r");
	buf[0] = '\0';
	while (f && fgets(line, sizeof(line), f)) {
		char *colon = strchr(line, ':');
		if (!strncmp(line, "model name", 10) && colon) {
			snprintf(buf, n, "%s", colon + 2);
			buf[strcspn(buf, "\n")] = '\0';
			break;
		}
	}
	if (f)
		fclose(f);
}

/* The profile around its levels (taken: cJSON owns them afterwards). */
static cJSON *profile_json(const CalibOpts *o, cJSON *levels)
{
	char stamp[32], host[128] = "", model[256], note[1024];
	cJSON *j = cJSON_CreateObject();
	calib_stamp(stamp, sizeof(stamp));
	gethostname(host, sizeof(host) - 1);
	cpu_model(model, sizeof(model));
	snprintf(note, sizeof(note), "measured by parallax calibrate --backend cpu%s on %s, %s: the "
		 "CPU executor's rates with 1 to %d ranks running at once (docs/time_model.md, "
		 "\"CPU profiles\")", o->quick ? " --quick" : "", host, stamp, o->ranks);
	cJSON_AddStringToObject(j, "_comment", note);
	cJSON *c = cJSON_AddObjectToObject(j, "cpu");
	cJSON_AddStringToObject(c, "host", host);
	cJSON_AddStringToObject(c, "model", model);
	cJSON_AddNumberToObject(c, "cores", (double)sysconf(_SC_NPROCESSORS_ONLN));
	cJSON_AddNumberToObject(c, "blas_threads", openblas_get_num_threads());
	cJSON_AddNumberToObject(c, "blas_thread_timeout", par_cpu_blas_timeout());
	cJSON_AddItemToObject(c, "levels", levels);
	return j;
}

/* What was written, one line a level. */
static void print_summary(const char *path)
{
	HwProfile hw;
	PxError err;
	if (hwprofile_load(path, &hw, &err))
		return;
	const HwCpu *c = hw.cpu;
	printf("# parallax calibrate --backend cpu: %s, %d cores, %d OpenBLAS threads a rank -> %s\n",
	       c->model, c->cores, c->blas_threads, path);
	printf("%6s %14s %14s %14s %12s %16s\n", "ranks", "sgemm GFLOP/s", "block fwd ms",
	       "block bwd ms", "copy GB/s", "all_gather ms");
	for (int i = 0; i < c->n_levels; i++) {
		const HwCpuLevel *l = &c->level[i];
		/* GPT-2 small's block on 4 x 64 tokens, for scale: C 768, 12 heads */
		double t[HWCPU_TERMS] = {256.0 * 768, 256.0 * 64 * 768, 256.0 * 64 * 12, 0,
					 12.0 * 768 * 768 + 13 * 768};
		double prod = 0;
		static const double io[4][2] = {{768, 2304}, {768, 768}, {768, 3072}, {3072, 768}};
		for (int q = 0; q < 4; q++)
			prod += hwcpu_gemm_s(l, HWCPU_NN, 256, io[q][1], io[q][0]);
		double fwd = prod + hwcpu_kernel_s(l, HWCPU_16BIT, HWCPU_BLOCK_FWD, t);
		double bwd = 2 * prod + hwcpu_kernel_s(l, HWCPU_16BIT, HWCPU_BLOCK_BWD, t);
		double ag = l->ranks > 1 ? hwcpu_coll_s(l, COLL_ALL_GATHER, 1 << 20) * 1e3 : NAN;
		printf("%6d %14.1f %14.2f %14.2f %12.2f %16.3f\n", l->ranks, hwcpu_gemm_peak(l) / 1e9,
		       fwd * 1e3, bwd * 1e3, l->copy_Bps.y[l->copy_Bps.n - 1] / 1e9, ag);
	}
	printf("# block: GPT-2 small's (C 768, 12 heads) on 4 x 64 tokens, bf16, as the profile "
	       "prices it; all_gather: 1 MiB; '-' or nan: not measured at 1 rank\n");
	hwprofile_free(&hw);
}

/* j's text to path, whole or not at all (path.tmp renamed). */
static int write_json(const char *path, const cJSON *j, PxError *err)
{
	char tmp[4200];
	char *text = cJSON_Print(j);
	if (!text)
		return px_fail(err, PX_ERR_RUNTIME, "out of memory");
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	FILE *f = fopen(tmp, "w");
	int bad = !f || fputs(text, f) < 0 || fputc('\n', f) < 0;
	cJSON_free(text);
	if ((f && fclose(f)) || bad || rename(tmp, path)) {
		unlink(tmp);
		return px_fail(err, PX_ERR_RUNTIME, "%s: cannot write", tmp);
	}
	return 0;
}

static cJSON *read_json(const char *path, PxError *err)
{
	JsonDoc d = {0};
	if (jdoc_load_file(&d, path, err))
		return NULL;
	cJSON *j = d.root;
	d.root = NULL;
	jdoc_free(&d);
	return j;
}

/* ---- the levels ---- */

/* Under a launcher: this job's ranks are one level. */
static int one_level(const CalibOpts *o, PxError *err)
{
	CommConfig cfg;
	Comm *world = NULL;
	cJSON *lv = NULL;
	comm_config_init(&cfg);
	cfg.deadline_s = o->deadline;
	if (comm_init(NULL, &cfg, &world, err))
		return -1;
	int rc = measure_level(o, world, &lv, err);
	if (!rc && lv) { /* rank 0 */
		if (o->part) {
			rc = write_json(o->part, lv, err);
			cJSON_Delete(lv);
		} else {
			cJSON *levels = cJSON_CreateArray();
			cJSON_AddItemToArray(levels, lv);
			cJSON *j = profile_json(o, levels);
			rc = calib_write_profile(o->out, j, err);
			cJSON_Delete(j);
			if (!rc)
				print_summary(o->out);
		}
	}
	PxError ferr;
	if (comm_finalize(world, &ferr) && !rc)
		rc = (*err = ferr, -1);
	return rc;
}

/* Level k > 1: k ranks under mpirun, writing their level to part. Returns mpirun's status. */
static int launch_level(const CalibOpts *o, int k, const char *part)
{
	char deadline[32], hang[32];
	char *args[16];
	int n = 0;
	snprintf(deadline, sizeof(deadline), "%g", o->deadline);
	snprintf(hang, sizeof(hang), "%d", o->hang_rank);
	args[n++] = "calibrate", args[n++] = "--backend", args[n++] = "cpu";
	args[n++] = "--part", args[n++] = (char *)part;
	args[n++] = "--out", args[n++] = (char *)o->out;
	args[n++] = "--deadline", args[n++] = deadline;
	if (o->quick)
		args[n++] = "--quick";
	if (o->hang_rank >= 0)
		args[n++] = "--inject-hang", args[n++] = hang;
	args[n] = NULL;
	fflush(NULL);
	return launch_mpirun("calibrate", k, args, n);
}

/* 1, 2, 4, ... and max itself: the level after k, past max when k is max */
static int next_level(int k, int max)
{
	return k < max && 2 * k > max ? max : 2 * k;
}

int calib_cpu_main(const CalibOpts *o, const CommEnv *env, int launched, PxError *err)
{
	(void)env;
	if (launched)
		return one_level(o, err);
	char part[4200];
	cJSON *levels = cJSON_CreateArray(), *lv = NULL;
	int rc = 0;
	for (int k = 1; k <= o->ranks && !rc; k = next_level(k, o->ranks)) {
		printf("# level %d: %d rank%s measuring at once\n", k, k, k == 1 ? "" : "s");
		fflush(stdout);
		if (k == 1) {
			rc = measure_level(o, NULL, &lv, err);
		} else {
			snprintf(part, sizeof(part), "%s.level%d.part", o->out, k);
			rc = launch_level(o, k, part);
			if (!rc && !(lv = read_json(part, err)))
				rc = -1;
			unlink(part);
			if (rc > 0)
				px_fail(err, PX_ERR_RUNTIME, "the %d ranks measuring level %d stopped "
					"(exit %d); nothing was written", k, k, rc);
		}
		if (lv)
			cJSON_AddItemToArray(levels, lv), lv = NULL;
	}
	if (rc) {
		cJSON_Delete(levels);
		return rc;
	}
	cJSON *j = profile_json(o, levels);
	rc = calib_write_profile(o->out, j, err);
	cJSON_Delete(j);
	if (!rc)
		print_summary(o->out);
	return rc;
}

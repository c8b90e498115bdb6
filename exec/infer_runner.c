/* infer_runner: see infer_runner.h. Dimension names as kernels/infer_cpu.h's; t the
 * tensor-parallel degree, r this rank, Cr = C / t, sp prompt tokens, so output tokens. */
#include "infer_runner.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/clock.h"
#include "../kernels/gpt_tp_cpu.h"
#include "../kernels/infer_cpu.h"
#include "../kernels/rng.h"
#include "pool.h"

/* A block's tensors in gpt_cpu_unit_tensors' order; the four matrices int8 kernels quantize. */
enum { T_LN1_W, T_LN1_B, T_QKV_W, T_QKV_B, T_PROJ_W, T_PROJ_B, T_LN2_W, T_LN2_B, T_FC_W, T_FC_B,
       T_DOWN_W, T_DOWN_B, N_BLOCK_TENSORS };
static const int QUANT_MATS[] = {T_QKV_W, T_PROJ_W, T_FC_W, T_DOWN_W};
enum { N_QUANT_MATS = 4, MAX_PENDING = 4 };

/* One unit's parameters on this rank as stored: each tensor's byte offset and whether it is
 * int8 (then its scales start at scale_off[k] in the unit's scale buffer). */
typedef struct UnitLayout {
	int n;
	size_t numel[GPT_CPU_MAX_TENSORS], off_bytes[GPT_CPU_MAX_TENSORS];
	int quant[GPT_CPU_MAX_TENSORS];
	size_t scale_off[GPT_CPU_MAX_TENSORS], group_elems[GPT_CPU_MAX_TENSORS];
	size_t bytes, load_bytes, scale_bytes, elems;
} UnitLayout;

/* A collective a unit's forward issued, for the schedule's op to match. */
typedef struct Issued {
	CollKind kind;
	int64_t elems;
	int elem_bytes;
} Issued;

struct InferRunner {
	const InferScenario *sc;
	const Schedule *s;
	Comm *tp;
	int r, t;
	GptConfig cfg;
	int B, sp, so, Cr, NHr, Vr, hs;
	PrecisionType act;
	int int8;
	long long q_groups;
	uint64_t seed;
	Pool *pool;
	Arena arena;
	UnitLayout *lay;            /* n_units */
	void **buf;                 /* by buffer id */
	size_t *size;
	const Op **alloc_of;
	int *params, *scales, *staging; /* buffer id by unit, -1 */
	int (*kv)[2];               /* the cache's segments by unit */
	int ws;                     /* the phase's activation buffer */
	int *prompt, *tokens;       /* (B, sp); (B, so) generated */
	int *cur;                   /* (B) the tokens a decode step feeds */
	float *logits[2];           /* (B, V) each: prefill's and the last step's, for checking */
	float *host;                /* the checkpoint on the host: one unit's fp32 values */
	Issued pending[MAX_PENDING];
	int n_pending, n_matched;
	double t_step, t_first, t_last;
	long decode_steps;
};

/* ---- what it runs ---- */

int infer_runner_supported(const InferScenario *sc, PxError *err)
{
	const ModelSpec *m = &sc->model;
	const InferConfig *c = &sc->inf;
	long long t = c->tp;
	const char *why = NULL;
	if (sc->backend != BACKEND_CPU)
		why = "backend \"cpu\" (the executor on host ranks; DeepSpeed's GPUs are predicted, "
		      "not run, and the CUDA backend's inference is not written yet)";
	else if (!model_is_family(m, "gpt2") || !m->lay.tied || m->experts)
		why = "a GPT-2 model (tied head, no experts): the executor's model family";
	else if (c->quant == IQ_GROUPWISE)
		why = "fp32, bf16, fp16 or int8 weights (quant.weight.quantized_initialization's "
		      "weight quantizer is predicted, not run yet)";
	else if (m->V % t || m->a % t)
		why = "a tensor-parallel degree dividing the vocabulary and the heads (Megatron pads "
		      "the vocabulary; the executor does not)";
	else if (c->quant == IQ_INT8_KERNEL) {
		long long h = m->h, sizes[] = {h * 3 * h / t, h / t * h, h * 4 * h / t, 4 * h / t * h};
		for (int i = 0; i < 4 && !why; i++)
			if (sizes[i] % c->q_groups)
				why = "quantization groups dividing every weight matrix of a rank";
	}
	if (!why)
		return 0;
	return px_fail(err, PX_ERR_INPUT, "%s: parallax run serves %s", sc->path, why);
}

/* ---- layouts ---- */

static void layout_unit(InferRunner *r, int u, UnitLayout *l)
{
	GptTensor g[GPT_CPU_MAX_TENSORS];
	int block = u >= 1 && u <= r->cfg.L;
	size_t a = precision_bytes(r->act);
	memset(l, 0, sizeof(*l));
	l->n = gpt_tp_unit_tensors(&r->cfg, r->t, u, g);
	for (int k = 0; k < l->n; k++) {
		l->numel[k] = g[k].numel;
		l->elems += g[k].numel;
		for (int q = 0; block && r->int8 && q < N_QUANT_MATS; q++)
			l->quant[k] |= k == QUANT_MATS[q];
		l->off_bytes[k] = l->bytes;
		l->bytes += l->quant[k] ? g[k].numel : g[k].numel * a;
		if (l->quant[k]) { /* q_groups fp32 scales per matrix, in matrix order */
			l->group_elems[k] = g[k].numel / (size_t)r->q_groups;
			l->scale_off[k] = l->scale_bytes / 4;
			l->scale_bytes += (size_t)r->q_groups * 4;
		}
	}
	l->load_bytes = l->elems * a;
}

static void *tensor(const InferRunner *r, int u, int k)
{
	return (char *)r->buf[r->params[u]] + r->lay[u].off_bytes[k];
}

static InferMat matrix(const InferRunner *r, int u, int k)
{
	const UnitLayout *l = &r->lay[u];
	InferMat m = {.w = tensor(r, u, k), .prec = r->act};
	if (l->quant[k]) {
		m.q = m.w;
		m.scales = (const float *)r->buf[r->scales[u]] + l->scale_off[k];
		m.group_elems = l->group_elems[k];
	}
	return m;
}

/* The activation buffer of a phase over Tn new tokens: the residual stream x (N, C), its normed
 * copy xn (N, C), the attention's q, k, v and output (N, 4 Cr), which the MLP's (N, 4 Cr) reuses
 * (GPT-2's intermediate is 4C), then fp32: a decode step's scores (B, NHr, ctx), the fused
 * prefill's one row of them, or the head's logits (B, Vr) and, with t > 1, gathered (B, V). */
typedef struct WsLayout {
	size_t xn, region, scores, logits, gathered, bytes;
} WsLayout;

static WsLayout ws_layout(const InferRunner *r, int Tn, int ctx)
{
	size_t a = precision_bytes(r->act), N = (size_t)r->B * Tn, C = (size_t)r->cfg.C;
	WsLayout w;
	w.xn = N * C * a;
	w.region = 2 * N * C * a;
	w.scores = w.region + N * 4 * (size_t)r->Cr * a;
	size_t sc = Tn > 1 ? (size_t)ctx : (size_t)r->B * r->NHr * ctx;
	w.logits = w.xn; /* the head needs x and the logits only */
	w.gathered = w.logits + (size_t)r->B * r->Vr * 4;
	size_t head = w.gathered + (r->t > 1 ? (size_t)r->B * r->cfg.V * 4 : 0);
	w.bytes = w.scores + sc * 4;
	if (head > w.bytes)
		w.bytes = head;
	return w;
}

/* ---- set-up: weights ---- */

static void store_values(void *dst, const float *src, size_t n, PrecisionType t)
{
	if (t == PREC_F32)
		memcpy(dst, src, n * 4);
	else if (t == PREC_BF16)
		precision_f32_to_bf16_n(dst, src, n);
	else
		precision_f32_to_f16_n(dst, src, n);
}

/* The schedule's copy of unit u's weights from the host: drawn from the seed (the checkpoint),
 * into the staging buffer in the compute dtype when the unit is quantized (its free quantizes),
 * else straight into the parameters. */
static int load_unit(InferRunner *r, int u, PxError *err)
{
	const UnitLayout *l = &r->lay[u];
	if (r->params[u] < 0)
		return px_fail(err, PX_ERR_RUNTIME, "unit %d's weights are copied in before the schedule "
			       "allocates them", u);
	if (r->t > 1)
		gpt_tp_init_unit(&r->cfg, r->t, r->r, u, r->host, r->seed);
	else
		gpt_cpu_init_unit(&r->cfg, u, r->host, r->seed);
	if (r->staging[u] >= 0) {
		store_values(r->buf[r->staging[u]], r->host, l->elems, r->act);
		return 0;
	}
	for (int k = 0, e = 0; k < l->n; e += (int)l->numel[k], k++)
		store_values(tensor(r, u, k), r->host + e, l->numel[k], r->act);
	return 0;
}

/* Unit u's staged weights into int8 matrices with their scales and the rest as they are. */
static int quantize_unit(InferRunner *r, int u, PxError *err)
{
	const UnitLayout *l = &r->lay[u];
	size_t a = precision_bytes(r->act);
	if (r->scales[u] < 0)
		return px_fail(err, PX_ERR_RUNTIME, "unit %d is quantized before the schedule allocates "
			       "its scales", u);
	const char *src = r->buf[r->staging[u]];
	for (int k = 0; k < l->n; k++) {
		if (l->quant[k])
			infer_cpu_quantize(src, r->act, l->numel[k], l->group_elems[k],
					   tensor(r, u, k), (float *)r->buf[r->scales[u]] +
					   l->scale_off[k]);
		else
			memcpy(tensor(r, u, k), src, l->numel[k] * a);
		src += l->numel[k] * a;
	}
	return 0;
}

/* ---- allocations ---- */

/* The bytes this executor holds for an allocation of the schedule, or 0 when it has no fixed
 * size to check (the activation buffer is checked against its phase's need at the compute). */
static size_t expected_bytes(const InferRunner *r, const Op *op)
{
	int u = op->unit;
	switch (op->what) {
	case BUF_PARAMS: return r->lay[u].bytes;
	case BUF_QUANT_SCALES: return r->lay[u].scale_bytes;
	case BUF_LOAD_STAGING: return r->lay[u].load_bytes;
	default: return 0;
	}
}

static int do_alloc(InferRunner *r, int i, const Op *op, PxError *err)
{
	static const BufWhat known[] = {BUF_PARAMS, BUF_QUANT_SCALES, BUF_LOAD_STAGING,
					BUF_KV_CACHE, BUF_ACTIVATIONS};
	int ok = 0, u = op->unit;
	for (size_t k = 0; k < sizeof(known) / sizeof(known[0]); k++)
		ok |= op->what == known[k];
	if (!ok || op->place != PLACE_GPU || (op->what != BUF_ACTIVATIONS &&
					       (u < 0 || u >= r->cfg.L + 2)))
		return px_fail(err, PX_ERR_RUNTIME, "op %d: allocation of %s (unit %d) on the %s: the "
			       "inference executor holds no such buffer", i, buf_name(op->what), u,
			       place_name(op->place));
	size_t bytes = (size_t)op->bytes, want = expected_bytes(r, op);
	if (want && bytes != want)
		return px_fail(err, PX_ERR_RUNTIME, "op %d: the schedule allocates %zu bytes of %s for "
			       "unit %d; the executor's layout holds %zu", i, bytes,
			       buf_name(op->what), u, want);
	void *p = arena_alloc(&r->arena, (Place)op->place, (MemCat)op->cat, bytes);
	if (!p)
		return px_fail(err, PX_ERR_RUNTIME, "op %d: out of memory for %zu bytes of %s", i, bytes,
			       buf_name(op->what));
	r->buf[op->buf] = p;
	r->size[op->buf] = bytes;
	r->alloc_of[op->buf] = op;
	switch (op->what) {
	case BUF_PARAMS: r->params[u] = op->buf; break;
	case BUF_QUANT_SCALES: r->scales[u] = op->buf; break;
	case BUF_LOAD_STAGING: r->staging[u] = op->buf; break;
	case BUF_ACTIVATIONS: r->ws = op->buf; break;
	case BUF_KV_CACHE: {
		int seg = r->kv[u][0] >= 0;
		size_t tok = infer_kv_seg_bytes(r->B, r->NHr, r->hs, r->act, 1);
		if (seg && r->kv[u][1] >= 0)
			return px_fail(err, PX_ERR_RUNTIME, "op %d: a third KV-cache allocation for unit "
				       "%d", i, u);
		if (bytes % tok)
			return px_fail(err, PX_ERR_RUNTIME, "op %d: unit %d's KV cache of %zu bytes is no "
				       "whole number of tokens of %zu bytes", i, u, bytes, tok);
		r->kv[u][seg] = op->buf;
		break;
	}
	default: break;
	}
	return 0;
}

static int do_free(InferRunner *r, const Op *op, PxError *err)
{
	const Op *a = r->alloc_of[op->buf];
	if (a->what == BUF_LOAD_STAGING && quantize_unit(r, a->unit, err))
		return -1;
	arena_free(&r->arena, (Place)a->place, (MemCat)a->cat, r->buf[op->buf], r->size[op->buf]);
	r->buf[op->buf] = NULL;
	if (a->what == BUF_LOAD_STAGING)
		r->staging[a->unit] = -1;
	else if (a->what == BUF_KV_CACHE)
		r->kv[a->unit][r->kv[a->unit][1] == op->buf] = -1;
	else if (a->what == BUF_ACTIVATIONS)
		r->ws = -1;
	return 0;
}

/* ---- the forward ---- */

/* A collective of the unit's forward on the tensor-parallel group, run now and kept for the
 * schedule's op to match. */
static int issue(InferRunner *r, CollKind kind, void *buf, void *recv, size_t count,
		 PxError *err)
{
	if (r->n_pending == MAX_PENDING)
		return px_fail(err, PX_ERR_RUNTIME, "a unit issued more collectives than the schedule "
			       "holds");
	int rc;
	if (kind == COLL_ALL_REDUCE) {
		rc = comm_all_reduce(r->tp, buf, buf, count, comm_prec(r->act), COMM_SUM, err);
		r->pending[r->n_pending++] = (Issued){kind, (int64_t)count,
						      (int)precision_bytes(r->act)};
	} else {
		rc = comm_all_gather(r->tp, buf, recv, count, COMM_FP32, err);
		r->pending[r->n_pending++] = (Issued){kind, (int64_t)count * r->t, 4};
	}
	return rc;
}

static void *ws_at(const InferRunner *r, size_t off)
{
	return (char *)r->buf[r->ws] + off;
}

static InferKv kv_view(const InferRunner *r, int u)
{
	InferKv kv = {.B = r->B, .NHr = r->NHr, .hs = r->hs, .prec = r->act};
	size_t tok = infer_kv_seg_bytes(r->B, r->NHr, r->hs, r->act, 1);
	for (int s = 0; s < 2; s++) {
		int id = r->kv[u][s];
		kv.seg[s] = id >= 0 ? r->buf[id] : NULL;
		kv.cap[s] = id >= 0 ? (int)(r->size[id] / tok) : 0;
	}
	return kv;
}

static int block_forward(InferRunner *r, int u, int Tn, int pos0, const WsLayout *w,
			 PxError *err)
{
	int N = r->B * Tn, C = r->cfg.C, Cr = r->Cr;
	size_t NC = (size_t)N * C;
	PrecisionType a = r->act;
	void *x = ws_at(r, 0), *xn = ws_at(r, w->xn), *qkv = ws_at(r, w->region);
	void *atty = ws_at(r, w->region + (size_t)N * 3 * Cr * precision_bytes(a)), *hid = qkv;
	float *scores = ws_at(r, w->scores);
	InferKv kv = kv_view(r, u);
	if (pos0 + Tn > kv.cap[0] + kv.cap[1])
		return px_fail(err, PX_ERR_RUNTIME, "unit %d: position %d past the KV cache's %d tokens",
			       u, pos0 + Tn - 1, kv.cap[0] + kv.cap[1]);
	InferMat m;
	infer_cpu_layernorm(xn, x, tensor(r, u, T_LN1_W), tensor(r, u, T_LN1_B), a, N, C);
	m = matrix(r, u, T_QKV_W);
	infer_cpu_linear(qkv, xn, &m, tensor(r, u, T_QKV_B), a, N, C, 3 * Cr);
	infer_cpu_attention(atty, qkv, &kv, a, r->B, Tn, pos0, scores,
			    Tn > 1 ? 0 : (size_t)(kv.cap[0] + kv.cap[1]));
	m = matrix(r, u, T_PROJ_W);
	infer_cpu_linear(xn, atty, &m, NULL, a, N, Cr, C);
	if (r->t > 1 && issue(r, COLL_ALL_REDUCE, xn, NULL, NC, err))
		return -1;
	infer_cpu_residual(x, xn, tensor(r, u, T_PROJ_B), a, NC, C);
	infer_cpu_layernorm(xn, x, tensor(r, u, T_LN2_W), tensor(r, u, T_LN2_B), a, N, C);
	m = matrix(r, u, T_FC_W);
	infer_cpu_linear(hid, xn, &m, tensor(r, u, T_FC_B), a, N, C, 4 * Cr);
	infer_cpu_gelu(hid, a, (size_t)N * 4 * Cr);
	m = matrix(r, u, T_DOWN_W);
	infer_cpu_linear(xn, hid, &m, NULL, a, N, 4 * Cr, C);
	if (r->t > 1 && issue(r, COLL_ALL_REDUCE, xn, NULL, NC, err))
		return -1;
	infer_cpu_residual(x, xn, tensor(r, u, T_DOWN_B), a, NC, C);
	return 0;
}

/* The head: the final norm of each sequence's last row, its logits, gathered, and the greedy
 * choice, written as generated token `step` of every sequence. */
static int head_forward(InferRunner *r, int u, int Tn, int step, const WsLayout *w, PxError *err)
{
	int C = r->cfg.C, V = r->cfg.V, Vr = r->Vr;
	size_t a = precision_bytes(r->act), row = (size_t)Tn * C;
	char *x = ws_at(r, 0);
	float *lg = ws_at(r, w->logits), *all = r->t > 1 ? ws_at(r, w->gathered) : lg;
	for (int b = 0; b < r->B; b++) {
		void *last = x + ((size_t)b * row + (size_t)(Tn - 1) * C) * a;
		infer_cpu_layernorm(last, last, tensor(r, u, 0), tensor(r, u, 1), r->act, 1, C);
	}
	infer_cpu_logits(lg, x + (size_t)(Tn - 1) * C * a, row, tensor(r, 0, 0), r->act, r->B, C,
			 Vr);
	if (r->t > 1 && issue(r, COLL_ALL_GATHER, lg, all, (size_t)r->B * Vr, err))
		return -1;
	float *keep = r->logits[step > 0];
	for (int j = 0; j < r->t; j++) /* gathered: rank j's (B, Vr) block j */
		for (int b = 0; b < r->B; b++)
			memcpy(keep + (size_t)b * V + (size_t)j * Vr, all + ((size_t)j * r->B + b) * Vr,
			       (size_t)Vr * sizeof(float));
	for (int b = 0; b < r->B; b++) {
		int best = -1;
		float bv = 0;
		for (int j = 0; j < r->t; j++) {
			const float *l = all + ((size_t)j * r->B + b) * Vr;
			int k = infer_cpu_argmax(l, Vr);
			if (best < 0 || l[k] > bv)
				best = j * Vr + k, bv = l[k];
		}
		r->tokens[(size_t)b * r->so + step] = best;
		r->cur[b] = best;
	}
	return 0;
}

/* Op i: unit u's forward in a phase (prefill, or decode step `iter` of the block). */
static int do_compute(InferRunner *r, int i, const Op *op, int64_t iter, PxError *err)
{
	int decode = op->role == ROLE_DECODE, u = op->unit;
	if (op->role != ROLE_PREFILL && !decode)
		return px_fail(err, PX_ERR_RUNTIME, "op %d: a %s compute in an inference schedule", i,
			       role_name(op->role));
	if (r->n_pending)
		return px_fail(err, PX_ERR_RUNTIME, "op %d: before unit %d's forward, %d collective(s) "
			       "the previous forward issued are not in the schedule", i, u,
			       r->n_pending);
	if (r->ws < 0)
		return px_fail(err, PX_ERR_RUNTIME, "op %d: a forward without an activation buffer", i);
	int Tn = decode ? 1 : r->sp, pos0 = decode ? r->sp + (int)iter : 0;
	int ctx = 0;
	for (int s = 0; s < 2 && u >= 1 && u <= r->cfg.L; s++)
		ctx += kv_view(r, u).cap[s];
	WsLayout w = ws_layout(r, Tn, ctx ? ctx : 1);
	if (w.bytes > r->size[r->ws])
		return px_fail(err, PX_ERR_RUNTIME, "op %d: unit %d's %s needs %zu bytes of activations; "
			       "the schedule's buffer holds %zu", i, u, role_name(op->role), w.bytes,
			       r->size[r->ws]);
	if (u == 0) {
		if (!decode)
			r->t_step = px_now_s();
		const int *tok = decode ? r->cur : r->prompt;
		infer_cpu_embed(ws_at(r, 0), tok, tensor(r, 0, 0), r->r == 0 ? tensor(r, 0, 1) : NULL,
				r->act, r->B, Tn, pos0, r->cfg.C, r->r * r->Vr, r->Vr);
		if (r->t > 1 && issue(r, COLL_ALL_REDUCE, ws_at(r, 0), NULL,
				      (size_t)r->B * Tn * r->cfg.C, err))
			return -1;
		return 0;
	}
	if (u <= r->cfg.L)
		return block_forward(r, u, Tn, pos0, &w, err);
	if (head_forward(r, u, Tn, decode ? 1 + (int)iter : 0, &w, err))
		return -1;
	double now = px_now_s();
	if (decode)
		r->t_last = now, r->decode_steps++;
	else
		r->t_first = r->t_last = now;
	return 0;
}

/* Op i, a collective of the schedule: the oldest one the forward issued must be it. */
static int do_coll(InferRunner *r, int i, const Op *op, PxError *err)
{
	if (!r->n_pending)
		return px_fail(err, PX_ERR_RUNTIME, "op %d: the schedule's %s of %lld elements on group "
			       "%s: the forward issued none", i, coll_name(op->sub),
			       (long long)op->elems, group_name(op->group));
	Issued g = r->pending[0];
	memmove(r->pending, r->pending + 1, (size_t)--r->n_pending * sizeof(Issued));
	if (g.kind != op->sub || g.elems != op->elems || g.elem_bytes != op->elem_bytes ||
	    op->group != GROUP_TP || op->nranks != r->t)
		return px_fail(err, PX_ERR_RUNTIME, "op %d: the schedule's %s of %lld x %d bytes over %d "
			       "ranks of group %s; the forward issued a %s of %lld x %d bytes over %d",
			       i, coll_name(op->sub), (long long)op->elems, op->elem_bytes, op->nranks,
			       group_name(op->group), coll_name(g.kind), (long long)g.elems,
			       g.elem_bytes, r->t);
	r->n_matched++;
	return 0;
}

int infer_runner_run(InferRunner *r, PxError *err)
{
	SchedWalk w;
	int i;
	sched_walk_init(&w, r->s, 0);
	for (; (i = sched_walk_op(&w, err)) >= 0; sched_walk_advance(&w)) {
		const Op *op = &r->s->ops[i];
		int rc = 0;
		switch (op->kind) {
		case OP_ALLOC: rc = do_alloc(r, i, op, err); break;
		case OP_FREE: rc = do_free(r, op, err); break;
		case OP_COPY:
			rc = op->role == ROLE_WEIGHT_LOAD ? load_unit(r, op->unit, err) :
				px_fail(err, PX_ERR_RUNTIME, "op %d: a %s copy in an inference schedule",
					i, role_name(op->role));
			break;
		case OP_COMPUTE: rc = do_compute(r, i, op, w.iter, err); break;
		case OP_COLL: rc = do_coll(r, i, op, err); break;
		default: break;
		}
		if (rc)
			return -1;
	}
	if (i == SCHED_WALK_ERROR)
		return -1;
	if (r->n_pending)
		return px_fail(err, PX_ERR_RUNTIME, "the last unit's forward issued %d collective(s) the "
			       "schedule does not hold", r->n_pending);
	return 0;
}

/* ---- life ---- */

static void *pool_take(void *ctx, Place place, size_t bytes)
{
	(void)place;
	return pool_alloc(ctx, bytes);
}

static void pool_give(void *ctx, Place place, void *p)
{
	(void)place;
	pool_free(ctx, p);
}

/* The pool's mapped bytes: the device place's (every allocation of an inference schedule is on
 * it, do_alloc checks) and all places'; none on the others. */
static void pool_held(void *ctx, int place, double *now, double *peak)
{
	PoolStats st;
	*now = *peak = 0;
	if (place != PLACE_GPU && place != N_PLACES)
		return;
	pool_stats(ctx, &st);
	*now = (double)st.mapped_bytes;
	*peak = (double)st.mapped_peak_bytes;
}

static void pool_settle(void *ctx)
{
	pool_trim(ctx);
	pool_reset_peak(ctx);
}

int infer_runner_create(const InferScenario *sc, const Schedule *s, Comm *tp, const int *prompt,
			uint64_t seed, InferRunner **out, PxError *err)
{
	const ModelSpec *m = &sc->model;
	InferRunner *r = calloc(1, sizeof(*r));
	*out = NULL;
	if (!r)
		return px_fail(err, PX_ERR_RUNTIME, "out of memory");
	r->sc = sc, r->s = s, r->tp = tp, r->seed = seed;
	r->r = tp ? comm_rank(tp) : 0;
	r->t = tp ? comm_size(tp) : 1;
	r->cfg = (GptConfig){.V = (int)m->V, .max_T = (int)m->max_pos, .C = (int)m->h,
			     .L = (int)m->L, .NH = (int)m->a};
	r->B = (int)sc->wl.batch, r->sp = (int)sc->wl.prompt_tokens, r->so = (int)sc->wl.output_tokens;
	r->Cr = r->cfg.C / r->t, r->NHr = r->cfg.NH / r->t, r->Vr = r->cfg.V / r->t;
	r->hs = r->cfg.C / r->cfg.NH;
	r->act = sc->inf.dtype == IDT_FP32 ? PREC_F32 : sc->inf.dtype == IDT_BF16 ? PREC_BF16 :
		 PREC_F16; /* int8 computes in fp16, as DeepSpeed's int8 kernels */
	r->int8 = sc->inf.quant == IQ_INT8_KERNEL;
	r->q_groups = sc->inf.q_groups;
	r->ws = -1;
	if (sc->inf.tp != r->t) {
		px_fail(err, PX_ERR_RUNTIME, "the scenario's tensor-parallel degree is %lld; this rank's "
			"group has %d", sc->inf.tp, r->t);
		goto fail;
	}
	int n_units = r->cfg.L + 2, nb = s->n_bufs + 1;
	size_t largest = 0;
	r->pool = pool_create(&POOL_CONFIG_DEFAULT);
	r->lay = calloc((size_t)n_units, sizeof(*r->lay));
	r->buf = calloc((size_t)nb, sizeof(void *));
	r->size = calloc((size_t)nb, sizeof(size_t));
	r->alloc_of = calloc((size_t)nb, sizeof(Op *));
	r->params = malloc((size_t)n_units * sizeof(int));
	r->scales = malloc((size_t)n_units * sizeof(int));
	r->staging = malloc((size_t)n_units * sizeof(int));
	r->kv = malloc((size_t)n_units * sizeof(*r->kv));
	r->prompt = malloc((size_t)r->B * r->sp * sizeof(int));
	r->tokens = calloc((size_t)r->B * r->so, sizeof(int));
	r->cur = calloc((size_t)r->B, sizeof(int));
	r->logits[0] = calloc((size_t)r->B * r->cfg.V, sizeof(float));
	r->logits[1] = calloc((size_t)r->B * r->cfg.V, sizeof(float));
	if (!r->logits[0] || !r->logits[1] || !r->pool || !r->lay || !r->buf || !r->size || !r->alloc_of || !r->params || !r->scales ||
	    !r->staging || !r->kv || !r->prompt || !r->tokens || !r->cur) {
		px_fail(err, PX_ERR_RUNTIME, "out of memory");
		goto fail;
	}
	arena_init(&r->arena, pool_take, pool_give, r->pool);
	r->arena.held = pool_held;
	r->arena.settle = pool_settle;
	for (int u = 0; u < n_units; u++) {
		layout_unit(r, u, &r->lay[u]);
		r->params[u] = r->scales[u] = r->staging[u] = r->kv[u][0] = r->kv[u][1] = -1;
		if (gpt_cpu_unit_params(&r->cfg, u) > largest)
			largest = gpt_cpu_unit_params(&r->cfg, u);
	}
	/* the checkpoint a unit is copied from: host memory outside the schedule's (a GPU's
	 * checkpoint lies on the host or on disk), one unit at a time */
	if (!(r->host = malloc(largest * sizeof(float)))) {
		px_fail(err, PX_ERR_RUNTIME, "out of memory");
		goto fail;
	}
	memcpy(r->prompt, prompt, (size_t)r->B * r->sp * sizeof(int));
	*out = r;
	return 0;
fail:
	infer_runner_destroy(r);
	return -1;
}

void infer_runner_destroy(InferRunner *r)
{
	if (!r)
		return;
	free(r->host);
	free(r->lay);
	free(r->buf);
	free(r->size);
	free(r->alloc_of);
	free(r->params);
	free(r->scales);
	free(r->staging);
	free(r->kv);
	free(r->prompt);
	free(r->tokens);
	free(r->cur);
	free(r->logits[0]);
	free(r->logits[1]);
	pool_destroy(r->pool); /* every buffer the walk left live goes with it */
	free(r);
}

const int *infer_runner_tokens(const InferRunner *r)
{
	return r->tokens;
}

const float *infer_runner_logits(const InferRunner *r, int last)
{
	return r->logits[last != 0];
}

const Arena *infer_runner_arena(const InferRunner *r)
{
	return &r->arena;
}

InferTimes infer_runner_times(const InferRunner *r)
{
	return (InferTimes){r->t_first - r->t_step, r->t_last - r->t_first, r->decode_steps};
}

void infer_runner_prompt(int *out, int B, int sp, int V, uint64_t seed)
{
	PxRng g;
	rng_init(&g, seed, 0x70726f6d7074ULL); /* "prompt": a stream of its own */
	for (int i = 0; i < B * sp; i++)
		out[i] = (int)(rng_next_u64(&g) % (uint64_t)V);
}

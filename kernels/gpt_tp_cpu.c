#include "gpt_tp_cpu.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "ops_cpu.h"
#include "rng.h"

/* ---- checks ---- */

int gpt_tp_check(const GptConfig *c, const GptTp *tp, int B, int T, PxError *err)
{
	if (gpt_cpu_check(c, B, T, err))
		return -1;
	int t = tp->t;
	if (t < 1 || tp->r < 0 || tp->r >= t)
		return px_fail(err, PX_ERR_INPUT,
			       "gpt_tp: need t >= 1 and 0 <= r < t, got r = %d, t = %d", tp->r, t);
	if (c->NH % t)
		return px_fail(err, PX_ERR_INPUT,
			       "gpt_tp: the tensor-parallel degree t = %d must divide NH = %d: a rank "
			       "holds whole heads", t, c->NH);
	if (c->V % t)
		return px_fail(err, PX_ERR_INPUT,
			       "gpt_tp: the tensor-parallel degree t = %d must divide V = %d; pad the "
			       "vocabulary to a multiple of t, as Megatron-LM does", t, c->V);
	if (tp->sp && ((long long)B * T) % t)
		return px_fail(err, PX_ERR_INPUT,
			       "gpt_tp: under sequence parallelism t = %d must divide B * T = %lld, "
			       "the rows split over the ranks", t, (long long)B * T);
	if (t > 1 && !tp->all_reduce)
		return px_fail(err, PX_ERR_INPUT, "gpt_tp: t = %d needs an all_reduce callback", t);
	if (t > 1 && tp->sp && (!tp->all_gather || !tp->reduce_scatter))
		return px_fail(err, PX_ERR_INPUT,
			       "gpt_tp: sequence parallelism over t = %d needs all_gather and "
			       "reduce_scatter callbacks", t);
	return 0;
}

int gpt_tp_rows(const GptTp *tp, int B, int T)
{
	return tp->sp ? B * T / tp->t : B * T;
}

/* ---- collectives ---- */

/* A group of one needs no communicator: the reduction is the identity, the gather and scatter
 * copies. */
static void all_reduce(const GptTp *tp, float *buf, size_t n, GptTpOp op)
{
	if (tp->t > 1)
		tp->all_reduce(tp->ctx, buf, n, op);
}

static void all_gather(const GptTp *tp, const float *in, float *out, size_t n)
{
	if (tp->t > 1)
		tp->all_gather(tp->ctx, in, out, n);
	else
		memcpy(out, in, n * sizeof(float));
}

static void reduce_scatter(const GptTp *tp, const float *in, float *out, size_t n)
{
	if (tp->t > 1)
		tp->reduce_scatter(tp->ctx, in, out, n);
	else
		memcpy(out, in, n * sizeof(float));
}

/* The (N, C) input of a column-split layer from this rank's (R, C) rows: the rows themselves
 * without sp, else gathered into buf. */
static const float *gather_rows(const GptTp *tp, const float *rows, float *buf, size_t rc)
{
	if (!tp->sp)
		return rows;
	all_gather(tp, rows, buf, rc);
	return buf;
}

/* The (N, C) partial sums of a row-split layer made whole on this rank's rows: reduced in place
 * without sp (part is then the rows), else reduce-scattered into rows. */
static void reduce_rows(const GptTp *tp, float *part, float *rows, size_t nc, size_t rc)
{
	if (tp->sp)
		reduce_scatter(tp, part, rows, rc);
	else
		all_reduce(tp, part, nc, GPT_TP_SUM);
}

/* ---- shard layout ---- */

enum { REPL, COLS, ROWS };

/* How a tensor is split, by its name (the rest are replicated). A tensor is a (rows, cols)
 * row-major matrix, a vector one row; a column split takes cols / (groups t) columns from each of
 * its groups (c_attn's q, k and v), a row split rows / t rows. */
static const struct {
	const char *name;
	int how, groups, cols_per_C;
} SPLITS[] = {
	{"embed.tokens", ROWS, 1, 1},   {"attn.c_attn.weight", COLS, 3, 3},
	{"attn.c_attn.bias", COLS, 3, 3}, {"attn.o.weight", ROWS, 1, 1},
	{"mlp.fc.weight", COLS, 1, 4},  {"mlp.fc.bias", COLS, 1, 4},
	{"mlp.down.weight", ROWS, 1, 1},
};

typedef struct Split {
	size_t rows, cols;
	int how, groups;
} Split;

static Split split_of(const GptConfig *c, const GptTensor *g)
{
	for (size_t i = 0; i < sizeof(SPLITS) / sizeof(SPLITS[0]); i++)
		if (!strcmp(g->name, SPLITS[i].name)) {
			size_t cols = (size_t)SPLITS[i].cols_per_C * c->C;
			return (Split){g->numel / cols, cols, SPLITS[i].how, SPLITS[i].groups};
		}
	return (Split){1, g->numel, REPL, 1};
}

static size_t shard_numel(const Split *s, int t)
{
	return s->how == REPL ? s->rows * s->cols : s->rows * s->cols / (size_t)t;
}

int gpt_tp_unit_tensors(const GptConfig *c, int t, int unit, GptTensor out[GPT_CPU_MAX_TENSORS])
{
	int n = gpt_cpu_unit_tensors(c, unit, out);
	for (int i = 0; i < n; i++) {
		Split s = split_of(c, &out[i]);
		out[i].numel = shard_numel(&s, t);
	}
	return n;
}

size_t gpt_tp_unit_params(const GptConfig *c, int t, int unit)
{
	GptTensor g[GPT_CPU_MAX_TENSORS];
	size_t sum = 0;
	int n = gpt_tp_unit_tensors(c, t, unit, g);
	for (int i = 0; i < n; i++)
		sum += g[i].numel;
	return sum;
}

GptBlockLayout gpt_tp_block_layout(const GptConfig *c, int t)
{
	GptTensor g[GPT_CPU_MAX_TENSORS];
	size_t off[GPT_CPU_MAX_TENSORS], sum = 0;
	int n = gpt_tp_unit_tensors(c, t, 1, g);
	for (int i = 0; i < n; i++) {
		off[i] = sum;
		sum += g[i].numel;
	}
	return (GptBlockLayout){off[0], off[1], off[2], off[3], off[4],  off[5],
				off[6], off[7], off[8], off[9], off[10], off[11]};
}

/* Rank r's part of one tensor as count runs of n values: run k at whole[off + k wstride] and
 * shard[k sstride]. */
typedef struct Runs {
	size_t n, count, off, wstride, sstride;
} Runs;

static Runs runs_of(const Split *s, int t, int r)
{
	if (s->how == REPL)
		return (Runs){s->rows * s->cols, 1, 0, 0, 0};
	if (s->how == ROWS) {
		size_t n = s->rows / (size_t)t * s->cols;
		return (Runs){n, 1, (size_t)r * n, 0, 0};
	}
	size_t group = s->cols / (size_t)s->groups, n = group / (size_t)t; /* per group and row */
	return (Runs){n, s->rows * (size_t)s->groups, (size_t)r * n, group, n};
}

void gpt_tp_shard_unit(const GptConfig *c, int t, int r, int unit, const float *whole,
		       float *shard)
{
	GptTensor g[GPT_CPU_MAX_TENSORS];
	int nt = gpt_cpu_unit_tensors(c, unit, g);
	for (int i = 0; i < nt; i++) {
		Split s = split_of(c, &g[i]);
		Runs u = runs_of(&s, t, r);
		for (size_t k = 0; k < u.count; k++)
			memcpy(shard + k * u.sstride, whole + u.off + k * u.wstride,
			       u.n * sizeof(float));
		whole += g[i].numel;
		shard += shard_numel(&s, t);
	}
}

void gpt_tp_unshard_unit(const GptConfig *c, int t, int r, int unit, const float *shard,
			 float *whole)
{
	GptTensor g[GPT_CPU_MAX_TENSORS];
	int nt = gpt_cpu_unit_tensors(c, unit, g);
	for (int i = 0; i < nt; i++) {
		Split s = split_of(c, &g[i]);
		Runs u = runs_of(&s, t, r);
		for (size_t k = 0; k < u.count; k++)
			memcpy(whole + u.off + k * u.wstride, shard + k * u.sstride,
			       u.n * sizeof(float));
		whole += g[i].numel;
		shard += shard_numel(&s, t);
	}
}

/* Where element (i, j) of the whole tensor sits in rank r's shard, or SIZE_MAX when elsewhere. */
static size_t shard_index(const Split *s, int t, int r, size_t i, size_t j)
{
	if (s->how == REPL)
		return i * s->cols + j;
	if (s->how == ROWS) {
		size_t per = s->rows / (size_t)t;
		return i / per == (size_t)r ? (i - (size_t)r * per) * s->cols + j : SIZE_MAX;
	}
	size_t group = s->cols / (size_t)s->groups, part = group / (size_t)t;
	size_t g = j / group, in = j % group;
	if (in / part != (size_t)r)
		return SIZE_MAX;
	return i * (s->cols / (size_t)t) + g * part + in % part;
}

/* gpt_cpu_init_unit's rules and streams, value by value in the whole tensor's order, keeping the
 * values of this rank's shard (the values are drawn in sequence, so a rank draws the whole
 * tensor's; it keeps only its own). The tp_kernels suite holds the two to the same bits. */
void gpt_tp_init_unit(const GptConfig *c, int t, int r, int unit, float *shard, uint64_t seed)
{
	GptTensor g[GPT_CPU_MAX_TENSORS];
	int n = gpt_cpu_unit_tensors(c, unit, g);
	float resid_std = GPT_CPU_INIT_STD / sqrtf(2.0f * (float)c->L);
	for (int k = 0; k < n; k++) {
		const char *name = g[k].name;
		size_t len = strlen(name);
		Split s = split_of(c, &g[k]);
		size_t local = shard_numel(&s, t);
		float std = GPT_CPU_INIT_STD;
		if (len >= 5 && strcmp(name + len - 5, ".bias") == 0) {
			memset(shard, 0, local * sizeof(float));
		} else if (strstr(name, "norm")) {
			for (size_t i = 0; i < local; i++)
				shard[i] = 1.0f;
		} else {
			if (!strcmp(name, "attn.o.weight") || !strcmp(name, "mlp.down.weight"))
				std = resid_std;
			PxRng rng;
			rng_init(&rng, seed, (uint64_t)unit * GPT_CPU_MAX_TENSORS + (uint64_t)k + 1);
			for (size_t i = 0; i < s.rows; i++)
				for (size_t j = 0; j < s.cols; j++) {
					float v = (float)(std * rng_normal(&rng));
					size_t at = shard_index(&s, t, r, i, j);
					if (at != SIZE_MAX)
						shard[at] = v;
				}
		}
		shard += local;
	}
}

/* ---- saved activations and scratch ---- */

GptBlockActs gpt_tp_block_acts(const GptConfig *c, const GptTp *tp, int B, int T)
{
	size_t N = (size_t)B * T, C = (size_t)c->C, Ct = C / (size_t)tp->t;
	size_t rc = (size_t)gpt_tp_rows(tp, B, T) * C;
	GptBlockActs a;
	a.x_in = 0;
	a.ln1 = rc;
	a.qkv = 2 * rc;
	a.atty = a.qkv + 3 * N * Ct;
	a.res2 = a.atty + N * Ct;
	a.ln2 = a.res2 + rc;
	a.fc = a.ln2 + rc;
	a.gelu = a.fc + 4 * N * Ct;
	a.att = a.gelu + 4 * N * Ct;
	a.total_elems = a.att + (size_t)B * (size_t)(c->NH / tp->t) * T * T;
	return a;
}

size_t gpt_tp_block_act_bytes(const GptConfig *c, const GptTp *tp, int B, int T)
{
	return gpt_tp_block_acts(c, tp, B, T).total_elems * sizeof(float);
}

static size_t head_act_elems(const GptConfig *c, const GptTp *tp, int B, int T)
{
	return 2 * (size_t)gpt_tp_rows(tp, B, T) * c->C + (size_t)B * T * (c->V / tp->t);
}

size_t gpt_tp_head_act_bytes(const GptConfig *c, const GptTp *tp, int B, int T)
{
	return head_act_elems(c, tp, B, T) * sizeof(float);
}

/* Scratch, in floats:
 *   block: wide_a and wide_b, (N, max(4C/t, C)) each, then under sp a gathered (N, C) region
 *   head: the cross-entropy's statistics (3N), then dlogits' product (N, C), then under sp the
 *         gathered final-norm output (N, C)
 *   embeddings: under sp the gathered or not-yet-scattered (N, C) */
static size_t wide_elems(const GptConfig *c, const GptTp *tp, int B, int T)
{
	size_t C = (size_t)c->C, w = 4 * C / (size_t)tp->t;
	return (size_t)B * T * (w > C ? w : C);
}

size_t gpt_tp_scratch_bytes(const GptConfig *c, const GptTp *tp, int B, int T)
{
	size_t N = (size_t)B * T, nc = N * c->C, sp_nc = tp->sp ? nc : 0;
	size_t block = 2 * wide_elems(c, tp, B, T) + sp_nc, head = 3 * N + nc + sp_nc;
	size_t most = block > head ? block : head;
	return (most > sp_nc ? most : sp_nc) * sizeof(float);
}

/* ---- embeddings ---- */

void gpt_tp_embed_forward(const GptConfig *c, const GptTp *tp, int B, int T, const float *params,
			  const int *tokens, float *y, float *scratch)
{
	size_t N = (size_t)B * T, C = (size_t)c->C, Vt = (size_t)(c->V / tp->t);
	size_t lo = (size_t)tp->r * Vt, R = (size_t)gpt_tp_rows(tp, B, T), row0 = tp->sp ? tp->r * R : 0;
	const float *wte = params, *wpe = params + Vt * C;
	float *part = tp->sp ? scratch : y;

	/* this rank's vocabulary rows, zeros for the others' tokens: the sum over the group adds
	 * one value and zeros, exactly */
	for (size_t i = 0; i < N; i++) {
		size_t tok = (size_t)tokens[i];
		if (tok - lo < Vt)
			memcpy(part + i * C, wte + (tok - lo) * C, C * sizeof(float));
		else
			memset(part + i * C, 0, C * sizeof(float));
	}
	reduce_rows(tp, part, y, N * C, R * C);
	for (size_t i = 0; i < R; i++) {
		const float *pe = wpe + ((row0 + i) % (size_t)T) * C;
		float *yr = y + i * C;
		for (size_t j = 0; j < C; j++)
			yr[j] += pe[j];
	}
}

void gpt_tp_embed_backward(const GptConfig *c, const GptTp *tp, int B, int T, float *grads,
			   const int *tokens, const float *dy, float *scratch)
{
	size_t N = (size_t)B * T, C = (size_t)c->C, Vt = (size_t)(c->V / tp->t);
	size_t lo = (size_t)tp->r * Vt, R = (size_t)gpt_tp_rows(tp, B, T), row0 = tp->sp ? tp->r * R : 0;
	float *dwte = grads, *dwpe = grads + Vt * C;
	const float *all = gather_rows(tp, dy, scratch, R * C);

	for (size_t i = 0; i < N; i++) {
		size_t tok = (size_t)tokens[i];
		if (tok - lo >= Vt)
			continue;
		float *d = dwte + (tok - lo) * C;
		for (size_t j = 0; j < C; j++)
			d[j] += all[i * C + j];
	}
	for (size_t i = 0; i < R; i++) {
		float *d = dwpe + ((row0 + i) % (size_t)T) * C;
		for (size_t j = 0; j < C; j++)
			d[j] += dy[i * C + j];
	}
}

/* ---- transformer block ---- */

/* y (R, C) = the row-split layer's x (N, C_in/t) w (C_in/t, C) + b over the group, on this rank's
 * rows; part (N, C): y itself without sp. */
static void row_split_forward(const GptTp *tp, float *y, float *part, const float *x,
			      const float *w, const float *b, int N, int C_in_t, int C, size_t rc)
{
	float *out = tp->sp ? part : y;
	ops_matmul_forward(out, x, w, tp->r == 0 ? b : NULL, N, C_in_t, C);
	reduce_rows(tp, out, y, (size_t)N * C, rc);
}

void gpt_tp_block_forward(const GptConfig *c, const GptTp *tp, int B, int T, const float *params,
			  const float *x, float *y, float *acts, float *scratch)
{
	int N = B * T, C = c->C, Ct = C / tp->t, R = gpt_tp_rows(tp, B, T);
	size_t rc = (size_t)R * C;
	GptBlockLayout p = gpt_tp_block_layout(c, tp->t);
	GptBlockActs a = gpt_tp_block_acts(c, tp, B, T);
	const float *in;

	/* everything after this copy reads the kept input, which is what lets y be x */
	memcpy(acts + a.x_in, x, rc * sizeof(float));
	/* attention branch over this rank's heads */
	ops_layernorm_forward(acts + a.ln1, NULL, NULL, acts + a.x_in, params + p.ln1_w,
			      params + p.ln1_b, R, C);
	in = gather_rows(tp, acts + a.ln1, scratch, rc);
	ops_matmul_forward(acts + a.qkv, in, params + p.qkv_w, params + p.qkv_b, N, C, 3 * Ct);
	ops_attention_forward(acts + a.atty, acts + a.att, acts + a.qkv, B, T, Ct, c->NH / tp->t);
	row_split_forward(tp, acts + a.res2, scratch, acts + a.atty, params + p.proj_w,
			  params + p.proj_b, N, Ct, C, rc);
	ops_residual_forward(acts + a.res2, acts + a.res2, acts + a.x_in, rc);
	/* MLP branch over this rank's 4C/t columns */
	ops_layernorm_forward(acts + a.ln2, NULL, NULL, acts + a.res2, params + p.ln2_w,
			      params + p.ln2_b, R, C);
	in = gather_rows(tp, acts + a.ln2, scratch, rc);
	ops_matmul_forward(acts + a.fc, in, params + p.fc_w, params + p.fc_b, N, C, 4 * Ct);
	ops_gelu_forward(acts + a.gelu, acts + a.fc, (size_t)N * 4 * Ct);
	row_split_forward(tp, y, scratch, acts + a.gelu, params + p.down_w, params + p.down_b, N,
			  4 * Ct, C, rc);
	ops_residual_forward(y, y, acts + a.res2, rc);
}

/* The row-split layer's backward from this rank's dy rows: its input gradient dx (N, C_in/t) and
 * weight gradient from the whole dy (gathered into buf under sp), its bias's from this rank's
 * rows. */
static void row_split_backward(const GptTp *tp, float *dx, float *dw, float *db, const float *dy,
			       const float *x, const float *w, float *buf, int N, int C_in_t, int C,
			       int R)
{
	const float *all = gather_rows(tp, dy, buf, (size_t)R * C);
	ops_matmul_backward(dx, dw, tp->sp ? NULL : db, all, x, w, N, C_in_t, C);
	if (tp->sp)
		ops_matmul_backward(NULL, NULL, db, dy, NULL, NULL, R, C_in_t, C);
}

/* The column-split layer's backward: dw, db from its input (this rank's norm output rows,
 * gathered again under sp) and dy (N, C_out/t); the input gradient's partial sums into part
 * (N, C), made whole on this rank's rows: returned (part itself without sp, else buf). */
static const float *col_split_backward(const GptTp *tp, float *part, float *dw, float *db,
				       const float *dy, const float *x_rows, const float *w,
				       float *buf, int N, int C, int C_out_t, int R)
{
	size_t rc = (size_t)R * C;
	const float *x = gather_rows(tp, x_rows, buf, rc);
	memset(part, 0, (size_t)N * C * sizeof(float));
	ops_matmul_backward(part, dw, db, dy, x, w, N, C, C_out_t);
	reduce_rows(tp, part, buf, (size_t)N * C, rc);
	return tp->sp ? buf : part;
}

/* Scratch: wide_a and wide_b as gpt_cpu_block_backward's, at this rank's widths, and under sp
 * gath (N, C), which holds in turn a gathered dy, a gathered norm output and a scattered input
 * gradient:
 *   MLP:       wide_a = d gelu, wide_b = d fc, then wide_a[0, NC) = d ln2's partial sums
 *   attention: wide_a[0, N C/t) = d atty, wide_b[0, 3 N C/t) = d qkv, then wide_a = d ln1's */
void gpt_tp_block_backward(const GptConfig *c, const GptTp *tp, int B, int T, const float *params,
			   float *grads, const float *acts, const float *dy, float *dx,
			   float *scratch)
{
	int N = B * T, C = c->C, Ct = C / tp->t, R = gpt_tp_rows(tp, B, T);
	size_t rc = (size_t)R * C, nct = (size_t)N * Ct;
	GptBlockLayout p = gpt_tp_block_layout(c, tp->t);
	GptBlockActs a = gpt_tp_block_acts(c, tp, B, T);
	size_t wide = wide_elems(c, tp, B, T);
	float *wide_a = scratch, *wide_b = scratch + wide, *gath = scratch + 2 * wide;
	const float *d;

	/* MLP branch: y = res2 + down(gelu(fc(ln2(res2)))) */
	memset(wide_a, 0, 4 * nct * sizeof(float));
	row_split_backward(tp, wide_a, grads + p.down_w, grads + p.down_b, dy, acts + a.gelu,
			   params + p.down_w, gath, N, 4 * Ct, C, R);
	memset(wide_b, 0, 4 * nct * sizeof(float));
	ops_gelu_backward(wide_b, wide_a, acts + a.fc, 4 * nct);
	d = col_split_backward(tp, wide_a, grads + p.fc_w, grads + p.fc_b, wide_b, acts + a.ln2,
			       params + p.fc_w, gath, N, C, 4 * Ct, R);
	if (dx != dy)
		memcpy(dx, dy, rc * sizeof(float)); /* the residual path */
	ops_layernorm_backward(dx, grads + p.ln2_w, grads + p.ln2_b, d, acts + a.res2,
			       params + p.ln2_w, R, C);

	/* attention branch: res2 = x + o(attention(qkv(ln1(x)))); dx now holds d res2 */
	memset(wide_a, 0, nct * sizeof(float));
	row_split_backward(tp, wide_a, grads + p.proj_w, grads + p.proj_b, dx, acts + a.atty,
			   params + p.proj_w, gath, N, Ct, C, R);
	memset(wide_b, 0, 3 * nct * sizeof(float));
	ops_attention_backward(wide_b, wide_a, acts + a.qkv, acts + a.att, B, T, Ct, c->NH / tp->t);
	d = col_split_backward(tp, wide_a, grads + p.qkv_w, grads + p.qkv_b, wide_b, acts + a.ln1,
			       params + p.qkv_w, gath, N, C, 3 * Ct, R);
	ops_layernorm_backward(dx, grads + p.ln1_w, grads + p.ln1_b, d, acts + a.x_in,
			       params + p.ln1_w, R, C);
}

/* ---- head ---- */

/* head activations: x_in (R, C) | ln_f (R, C) | probs (N, V/t) */

float gpt_tp_head_forward(const GptConfig *c, const GptTp *tp, int B, int T, const float *params,
			  const float *wte, const float *x, const int *targets, float *acts,
			  float *scratch)
{
	int N = B * T, C = c->C, Vt = c->V / tp->t, R = gpt_tp_rows(tp, B, T);
	size_t rc = (size_t)R * C, lo = (size_t)tp->r * (size_t)Vt;
	float *x_in = acts, *lnf = acts + rc, *probs = acts + 2 * rc;
	float *mx = scratch, *sum = scratch + N, *tgt = scratch + 2 * (size_t)N;
	float *gath = scratch + 3 * (size_t)N + (size_t)N * C;

	memcpy(x_in, x, rc * sizeof(float));
	ops_layernorm_forward(lnf, NULL, NULL, x_in, params, params + C, R, C);
	ops_lm_head_forward(probs, gather_rows(tp, lnf, gath, rc), wte, N, C, Vt);

	/* Megatron's vocabulary-parallel cross-entropy: the max over the group, then each rank's
	 * sum of exponentials and (on the rank holding it) the target's logit, summed */
	for (int i = 0; i < N; i++) {
		const float *l = probs + (size_t)i * Vt;
		float m = -INFINITY;
		for (int j = 0; j < Vt; j++)
			if (l[j] > m)
				m = l[j];
		mx[i] = m;
	}
	all_reduce(tp, mx, (size_t)N, GPT_TP_MAX);
	for (int i = 0; i < N; i++) {
		float *l = probs + (size_t)i * Vt;
		size_t target = targets ? (size_t)targets[i] - lo : SIZE_MAX;
		tgt[i] = target < (size_t)Vt ? l[target] : 0.0f; /* read before l becomes exp */
		double s = 0.0;
		for (int j = 0; j < Vt; j++) {
			float e = expf(l[j] - mx[i]);
			s += e;
			l[j] = e;
		}
		sum[i] = (float)s;
	}
	/* two sums, as Megatron's three separate all-reduces (max, target logits, sums) */
	all_reduce(tp, tgt, (size_t)N, GPT_TP_SUM);
	all_reduce(tp, sum, (size_t)N, GPT_TP_SUM);
	double loss = 0.0;
	for (int i = 0; i < N; i++) {
		float *p = probs + (size_t)i * Vt;
		/* -log softmax = log(sum) - (logit - max), as ops_crossentropy_forward */
		loss += log((double)sum[i]) - ((double)tgt[i] - mx[i]);
		for (int j = 0; j < Vt; j++)
			p[j] /= sum[i];
	}
	return targets ? (float)(loss / N) : 0.0f;
}

const float *gpt_tp_head_probs(const GptConfig *c, const GptTp *tp, int B, int T,
			       const float *acts)
{
	return acts + 2 * (size_t)gpt_tp_rows(tp, B, T) * c->C;
}

void gpt_tp_head_backward(const GptConfig *c, const GptTp *tp, int B, int T, const float *params,
			  const float *wte, float *grads, float *dwte, float *acts,
			  const int *targets, float dloss, float *dx, float *scratch)
{
	int N = B * T, C = c->C, Vt = c->V / tp->t, R = gpt_tp_rows(tp, B, T);
	size_t rc = (size_t)R * C, lo = (size_t)tp->r * (size_t)Vt;
	float *x_in = acts, *lnf = acts + rc, *probs = acts + 2 * rc;
	float *part = scratch + 3 * (size_t)N, *gath = part + (size_t)N * C;

	/* as ops_crossentropy_backward, over this rank's columns */
	float s = dloss / (float)N;
	for (int i = 0; i < N; i++) {
		float *d = probs + (size_t)i * Vt;
		size_t target = (size_t)targets[i] - lo;
		for (size_t j = 0; j < (size_t)Vt; j++)
			d[j] = s * (d[j] - (j == target ? 1.0f : 0.0f));
	}
	memset(part, 0, (size_t)N * C * sizeof(float));
	ops_lm_head_backward(part, NULL, probs, NULL, wte, N, C, Vt);
	ops_lm_head_backward(NULL, dwte, probs, gather_rows(tp, lnf, gath, rc), wte, N, C, Vt);
	reduce_rows(tp, part, gath, (size_t)N * C, rc);
	memset(dx, 0, rc * sizeof(float));
	ops_layernorm_backward(dx, grads, grads + C, tp->sp ? gath : part, x_in, params, R, C);
}

#include "gpt_tp_cpu.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "ops16_cpu.h"
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
static void all_reduce(const GptTp *tp, void *buf, size_t n, PrecisionType dt, GptTpOp op)
{
	if (tp->t > 1)
		tp->all_reduce(tp->ctx, buf, n, dt, op);
}

static void all_gather(const GptTp *tp, const void *in, void *out, size_t n, PrecisionType dt)
{
	if (tp->t > 1)
		tp->all_gather(tp->ctx, in, out, n, dt);
	else
		memcpy(out, in, n * precision_bytes(dt));
}

static void reduce_scatter(const GptTp *tp, const void *in, void *out, size_t n, PrecisionType dt)
{
	if (tp->t > 1)
		tp->reduce_scatter(tp->ctx, in, out, n, dt);
	else
		memcpy(out, in, n * precision_bytes(dt));
}

/* The (N, C) input of a column-split layer from this rank's (R, C) rows: the rows themselves
 * without sp, else gathered into buf. */
static const void *gather_rows(const GptTp *tp, PrecisionType dt, const void *rows, void *buf,
			       size_t rc)
{
	if (!tp->sp)
		return rows;
	all_gather(tp, rows, buf, rc, dt);
	return buf;
}

/* The (N, C) partial sums of a row-split layer made whole on this rank's rows: reduced in place
 * without sp (part is then the rows), else reduce-scattered into rows. */
static void reduce_rows(const GptTp *tp, PrecisionType dt, void *part, void *rows, size_t nc,
			size_t rc)
{
	if (tp->sp)
		reduce_scatter(tp, part, rows, rc, dt);
	else
		all_reduce(tp, part, nc, dt, GPT_TP_SUM);
}

/* src (n fp32) as dt values: src itself at fp32, else rounded into buf */
static const void *as_dt(PrecisionType dt, const float *src, void *buf, size_t n)
{
	if (dt == PREC_F32)
		return src;
	ops16_round(dt, buf, src, n);
	return buf;
}

/* n fp32 values rounded to dt in place, packed at the start of buf: value i goes to bytes
 * [2i, 2i + 2), which only values already read occupy. One thread, in order. */
static void pack(PrecisionType dt, float *buf, size_t n)
{
	for (size_t i = 0; dt != PREC_F32 && i < n; i++) {
		float v = buf[i];
		precision_store(buf, i, v, dt);
	}
}

/* pack's inverse, from the last value down: float i overwrites only dt values i and above. */
static void unpack(PrecisionType dt, float *buf, size_t n)
{
	for (size_t i = n; dt != PREC_F32 && i-- > 0;) {
		float v = precision_load(buf, i, dt);
		buf[i] = v;
	}
}

/* The (N, C) fp32 partial sums of a column-split layer's input gradient made whole on this
 * rank's rows as Megatron's all-reduce (sp: reduce-scatter) makes them, in dt: rounded in place,
 * reduced, widened back. Returns the fp32 result: part itself without sp, rows (N C floats of
 * room) under it. A group of one rounds nothing. */
static const float *reduce_grad_rows(const GptTp *tp, PrecisionType dt, float *part, float *rows,
				     size_t nc, size_t rc)
{
	if (tp->t == 1)
		dt = PREC_F32;
	pack(dt, part, nc);
	reduce_rows(tp, dt, part, rows, nc, rc);
	float *out = tp->sp ? rows : part;
	unpack(dt, out, tp->sp ? rc : nc);
	return out;
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

size_t gpt_tp_block_act_bytes(const GptConfig *c, const GptTp *tp, PrecisionType dt, int B, int T)
{
	return gpt_tp_block_acts(c, tp, B, T).total_elems * precision_bytes(dt);
}

size_t gpt_tp_block_sparse_act_bytes(const GptConfig *c, const GptTp *tp, PrecisionType dt, int B,
				     int T, const SparseIndex *ix)
{
	return (gpt_tp_block_acts(c, tp, B, T).att + sparse_eager_probs_elems(ix, B)) *
	       precision_bytes(dt);
}

/* head activations: x_in (R, C) | ln_f (R, C) of type dt | probs (N, V/t) fp32 */
static size_t head_stream_bytes(const GptConfig *c, const GptTp *tp, PrecisionType dt, int B,
				int T)
{
	return 2 * (size_t)gpt_tp_rows(tp, B, T) * c->C * precision_bytes(dt);
}

size_t gpt_tp_head_act_bytes(const GptConfig *c, const GptTp *tp, PrecisionType dt, int B, int T)
{
	return head_stream_bytes(c, tp, dt, B, T) + 4 * (size_t)B * T * (c->V / tp->t);
}

float *gpt_tp_head_probs(const GptConfig *c, const GptTp *tp, PrecisionType dt, int B, int T,
			 const void *acts)
{
	return (float *)((char *)acts + head_stream_bytes(c, tp, dt, B, T));
}

/* Scratch, in floats:
 *   block: wide_a and wide_b, (N, max(4C/t, C)) each, then under sp a gathered (N, C) region
 *   head: the cross-entropy's statistics (3N), then dlogits' product (N, C), then under sp the
 *         gathered final-norm output (N, C)
 *   embeddings: under sp the gathered or not-yet-scattered (N, C), and in 16-bit this rank's
 *         rounded dy rows after the gathered ones (2 (N + R) C bytes of its 4 N C)
 * A 16-bit value sits where the fp32 one would, in half the room. */
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

void gpt_tp_embed_forward(const GptConfig *c, const GptTp *tp, PrecisionType dt, int B, int T,
			  const void *params, const int *tokens, void *y, float *scratch)
{
	size_t N = (size_t)B * T, C = (size_t)c->C, Vt = (size_t)(c->V / tp->t);
	size_t e = precision_bytes(dt);
	size_t lo = (size_t)tp->r * Vt, R = (size_t)gpt_tp_rows(tp, B, T), row0 = tp->sp ? tp->r * R : 0;
	const void *wte = params, *wpe = precision_at(params, Vt * C, dt);
	void *part = tp->sp ? (void *)scratch : y;

	/* this rank's vocabulary rows, zeros for the others' tokens: the sum over the group adds
	 * one value and zeros, exactly (in 16-bit too) */
	for (size_t i = 0; i < N; i++) {
		size_t tok = (size_t)tokens[i];
		if (tok - lo < Vt)
			memcpy(precision_at(part, i * C, dt), precision_at(wte, (tok - lo) * C, dt),
			       C * e);
		else
			memset(precision_at(part, i * C, dt), 0, C * e);
	}
	reduce_rows(tp, dt, part, y, N * C, R * C);
	for (size_t i = 0; i < R; i++) { /* rn(wte + wpe), ops16_embed_forward's rounding */
		size_t pe = ((row0 + i) % (size_t)T) * C;
		for (size_t j = 0; j < C; j++)
			precision_store(y, i * C + j, precision_load(y, i * C + j, dt) +
						precision_load(wpe, pe + j, dt), dt);
	}
}

void gpt_tp_embed_backward(const GptConfig *c, const GptTp *tp, PrecisionType dt, int B, int T,
			   float *grads, const int *tokens, const float *dy, float *scratch)
{
	size_t N = (size_t)B * T, C = (size_t)c->C, Vt = (size_t)(c->V / tp->t);
	size_t lo = (size_t)tp->r * Vt, R = (size_t)gpt_tp_rows(tp, B, T), row0 = tp->sp ? tp->r * R : 0;
	float *dwte = grads, *dwpe = grads + Vt * C;
	/* every row of dy: fp32 without sp (whole on every rank), gathered in dt under it */
	const void *all = dy;
	PrecisionType at = PREC_F32;
	if (tp->sp) {
		const void *mine = as_dt(dt, dy, precision_at(scratch, N * C, dt), R * C);
		all = gather_rows(tp, dt, mine, scratch, R * C);
		at = dt;
	}

	for (size_t i = 0; i < N; i++) {
		size_t tok = (size_t)tokens[i];
		if (tok - lo >= Vt)
			continue;
		float *d = dwte + (tok - lo) * C;
		for (size_t j = 0; j < C; j++)
			d[j] += precision_load(all, i * C + j, at);
	}
	for (size_t i = 0; i < R; i++) {
		float *d = dwpe + ((row0 + i) % (size_t)T) * C;
		for (size_t j = 0; j < C; j++)
			d[j] += precision_load(all, (row0 + i) * C + j, at);
	}
}

/* ---- transformer block ---- */

/* a block's tensors and saved activations, of type dt */
#define P(f) precision_at(params, p.f, dt)
#define A(f) precision_at(acts, a.f, dt)

/* y (R, C) = the row-split layer's x (N, C_in/t) w (C_in/t, C) + b over the group, on this rank's
 * rows, each rank's partial product rounded to dt before the reduction (Megatron's bf16 output);
 * part (N, C): y itself without sp. */
static void row_split_forward(const GptTp *tp, PrecisionType dt, void *y, void *part,
			      const void *x, const void *w, const void *b, int N, int C_in_t,
			      int C, size_t rc)
{
	void *out = tp->sp ? part : y;
	ops16_matmul_forward(dt, out, x, w, tp->r == 0 ? b : NULL, N, C_in_t, C);
	reduce_rows(tp, dt, out, y, (size_t)N * C, rc);
}

/* The attention branch: x_in already in acts; res2 = x_in + o(attention(qkv(ln1(x_in)))) over
 * this rank's heads; the probabilities in att when it is not NULL (selective recompute's, apart
 * from acts), else at their place in acts. */
void gpt_tp_attention_forward(const GptConfig *c, const GptTp *tp, PrecisionType dt, int B,
			      int T, const GptBlockLayout *lay, const GptBlockActs *acts_at,
			      const void *params, void *acts, void *att, const SparseIndex *ix,
			      float *scratch)
{
	int N = B * T, C = c->C, Ct = C / tp->t, R = gpt_tp_rows(tp, B, T);
	size_t rc = (size_t)R * C;
	GptBlockLayout p = *lay;
	GptBlockActs a = *acts_at;
	ops16_layernorm_forward(dt, A(ln1), A(x_in), P(ln1_w), P(ln1_b), R, C);
	const void *in = gather_rows(tp, dt, A(ln1), scratch, rc);
	ops16_matmul_forward(dt, A(qkv), in, P(qkv_w), P(qkv_b), N, C, 3 * Ct);
	if (ix) /* this rank's heads' kept blocks */
		ops16_sparse_attention_forward(dt, A(atty), att ? att : A(att), A(qkv), ix, B, T, Ct);
	else
		ops16_attention_forward(dt, A(atty), att ? att : A(att), A(qkv), B, T, Ct,
					c->NH / tp->t);
	row_split_forward(tp, dt, A(res2), scratch, A(atty), P(proj_w), P(proj_b), N, Ct, C, rc);
	ops16_residual_forward(dt, A(res2), A(res2), A(x_in), rc);
}

void gpt_tp_block_forward(const GptConfig *c, const GptTp *tp, PrecisionType dt, int B, int T,
			  const void *params, const void *x, void *y, void *acts, float *scratch)
{
	gpt_tp_block_forward_att(c, tp, dt, B, T, params, x, y, acts, NULL, NULL, scratch);
}

void gpt_tp_block_scores(const GptConfig *c, const GptTp *tp, PrecisionType dt, int B, int T,
			 void *acts, void *att, const SparseIndex *ix)
{
	GptBlockActs a = gpt_tp_block_acts(c, tp, B, T);
	/* the forward's arithmetic on the same kept q, k, v of this rank's heads: the same bits,
	 * the attention output rewritten with what it already holds */
	if (ix)
		ops16_sparse_attention_forward(dt, A(atty), att, A(qkv), ix, B, T, c->C / tp->t);
	else
		ops16_attention_forward(dt, A(atty), att, A(qkv), B, T, c->C / tp->t,
					c->NH / tp->t);
}

void gpt_tp_block_forward_att(const GptConfig *c, const GptTp *tp, PrecisionType dt, int B, int T,
			      const void *params, const void *x, void *y, void *acts, void *att,
			      const SparseIndex *ix, float *scratch)
{
	int N = B * T, C = c->C, Ct = C / tp->t, R = gpt_tp_rows(tp, B, T);
	size_t rc = (size_t)R * C;
	GptBlockLayout p = gpt_tp_block_layout(c, tp->t);
	GptBlockActs a = gpt_tp_block_acts(c, tp, B, T);

	/* everything after this copy reads the kept input, which is what lets y be x */
	memcpy(A(x_in), x, rc * precision_bytes(dt));
	gpt_tp_attention_forward(c, tp, dt, B, T, &p, &a, params, acts, att, ix, scratch);
	/* MLP branch over this rank's 4C/t columns */
	ops16_layernorm_forward(dt, A(ln2), A(res2), P(ln2_w), P(ln2_b), R, C);
	const void *in = gather_rows(tp, dt, A(ln2), scratch, rc);
	ops16_matmul_forward(dt, A(fc), in, P(fc_w), P(fc_b), N, C, 4 * Ct);
	ops16_gelu_forward(dt, A(gelu), A(fc), (size_t)N * 4 * Ct);
	row_split_forward(tp, dt, y, scratch, A(gelu), P(down_w), P(down_b), N, 4 * Ct, C, rc);
	ops16_residual_forward(dt, y, y, A(res2), rc);
}

/* The row-split layer's backward from this rank's dy rows (of type dt): its input gradient dx
 * (N, C_in/t) and weight gradient from the whole dy (gathered into buf under sp), its bias's from
 * this rank's rows. */
static void row_split_backward(const GptTp *tp, PrecisionType dt, float *dx, float *dw, float *db,
			       const void *dy, const void *x, const void *w, void *buf, int N,
			       int C_in_t, int C, int R)
{
	const void *all = gather_rows(tp, dt, dy, buf, (size_t)R * C);
	ops16_matmul_backward(dt, dx, dw, tp->sp ? NULL : db, all, x, w, N, C_in_t, C);
	if (tp->sp)
		ops16_matmul_backward(dt, NULL, NULL, db, dy, NULL, NULL, R, C_in_t, C);
}

/* The column-split layer's backward: dw, db from its input (this rank's norm output rows,
 * gathered again under sp) and dy (N, C_out/t, type dt); the input gradient's partial sums into
 * part (N, C), made whole on this rank's rows (reduce_grad_rows): returned (part itself without
 * sp, else buf). */
static const float *col_split_backward(const GptTp *tp, PrecisionType dt, float *part, float *dw,
				       float *db, const void *dy, const void *x_rows, const void *w,
				       float *buf, int N, int C, int C_out_t, int R)
{
	size_t rc = (size_t)R * C;
	const void *x = gather_rows(tp, dt, x_rows, buf, rc);
	memset(part, 0, (size_t)N * C * sizeof(float));
	ops16_matmul_backward(dt, part, dw, db, dy, x, w, N, C, C_out_t);
	return reduce_grad_rows(tp, dt, part, buf, (size_t)N * C, rc);
}

/* Scratch: wide_a and wide_b as gpt16_block_backward's, at this rank's widths, and under sp
 * gath (N, C), which holds in turn a gathered dy, a gathered norm output and a scattered input
 * gradient. A gradient a product takes is rounded to dt first (in fp32 it is its own value):
 *   MLP:       wide_b <- rn(dy); wide_a = d gelu; wide_b = d fc; wide_a <- rn(d fc) in 16-bit;
 *              then d ln2's partial sums in whichever of the two rn(d fc) is not in
 *   attention: wide_b <- rn(d res2); wide_a[0, N C/t) = d atty; wide_b[0, 3 N C/t) = d qkv;
 *              wide_a <- rn(d qkv) in 16-bit; d ln1's partial sums in the other */
/* The attention branch's backward: d res2 (fp32, this rank's rows) in dx on entry, d x_in on
 * return (the residual path included); scratch as the block's; the probabilities in att when it
 * is not NULL, else in acts. */
void gpt_tp_attention_backward(const GptConfig *c, const GptTp *tp, PrecisionType dt, int B,
			       int T, const GptBlockLayout *lay, const GptBlockActs *acts_at,
			       const void *params, float *grads, const void *acts, const void *att,
			       const SparseIndex *ix, float *dx, float *scratch)
{
	int N = B * T, C = c->C, Ct = C / tp->t, R = gpt_tp_rows(tp, B, T);
	size_t rc = (size_t)R * C, nct = (size_t)N * Ct;
	GptBlockLayout p = *lay;
	GptBlockActs a = *acts_at;
	size_t wide = wide_elems(c, tp, B, T);
	float *wide_a = scratch, *wide_b = scratch + wide, *gath = scratch + 2 * wide;
	const void *g16 = as_dt(dt, dx, wide_b, rc);
	memset(wide_a, 0, nct * sizeof(float));
	row_split_backward(tp, dt, wide_a, grads + p.proj_w, grads + p.proj_b, g16, A(atty),
			   P(proj_w), gath, N, Ct, C, R);
	memset(wide_b, 0, 3 * nct * sizeof(float));
	if (ix)
		ops16_sparse_attention_backward(dt, wide_b, wide_a, A(qkv), att ? att : A(att), ix, B,
						T, Ct);
	else
		ops16_attention_backward(dt, wide_b, wide_a, A(qkv), att ? att : A(att), B, T, Ct,
					 c->NH / tp->t);
	g16 = as_dt(dt, wide_b, wide_a, 3 * nct);
	const float *d = col_split_backward(tp, dt, g16 == wide_b ? wide_a : wide_b,
					    grads + p.qkv_w, grads + p.qkv_b, g16, A(ln1),
					    P(qkv_w), gath, N, C, 3 * Ct, R);
	ops16_layernorm_backward(dt, dx, grads + p.ln1_w, grads + p.ln1_b, d, A(x_in), P(ln1_w), R,
				 C);
}

void gpt_tp_block_backward(const GptConfig *c, const GptTp *tp, PrecisionType dt, int B, int T,
			   const void *params, float *grads, const void *acts, const float *dy,
			   float *dx, float *scratch)
{
	gpt_tp_block_backward_att(c, tp, dt, B, T, params, grads, acts, NULL, NULL, dy, dx,
				  scratch);
}

void gpt_tp_block_backward_att(const GptConfig *c, const GptTp *tp, PrecisionType dt, int B,
			       int T, const void *params, float *grads, const void *acts,
			       const void *att, const SparseIndex *ix, const float *dy, float *dx,
			       float *scratch)
{
	int N = B * T, C = c->C, Ct = C / tp->t, R = gpt_tp_rows(tp, B, T);
	size_t rc = (size_t)R * C, nct = (size_t)N * Ct;
	GptBlockLayout p = gpt_tp_block_layout(c, tp->t);
	GptBlockActs a = gpt_tp_block_acts(c, tp, B, T);
	size_t wide = wide_elems(c, tp, B, T);
	float *wide_a = scratch, *wide_b = scratch + wide, *gath = scratch + 2 * wide;

	/* MLP branch: y = res2 + down(gelu(fc(ln2(res2)))) */
	const void *g16 = as_dt(dt, dy, wide_b, rc);
	memset(wide_a, 0, 4 * nct * sizeof(float));
	row_split_backward(tp, dt, wide_a, grads + p.down_w, grads + p.down_b, g16, A(gelu),
			   P(down_w), gath, N, 4 * Ct, C, R);
	memset(wide_b, 0, 4 * nct * sizeof(float));
	ops16_gelu_backward(dt, wide_b, wide_a, A(fc), 4 * nct);
	g16 = as_dt(dt, wide_b, wide_a, 4 * nct);
	const float *d = col_split_backward(tp, dt, g16 == wide_b ? wide_a : wide_b,
					    grads + p.fc_w, grads + p.fc_b, g16, A(ln2), P(fc_w),
					    gath, N, C, 4 * Ct, R);
	if (dx != dy)
		memcpy(dx, dy, rc * sizeof(float)); /* the residual path */
	ops16_layernorm_backward(dt, dx, grads + p.ln2_w, grads + p.ln2_b, d, A(res2), P(ln2_w), R,
				 C);
	/* attention branch: res2 = x + o(attention(qkv(ln1(x)))); dx now holds d res2 */
	gpt_tp_attention_backward(c, tp, dt, B, T, &p, &a, params, grads, acts, att, ix, dx,
				  scratch);
#undef P
#undef A
}

/* ---- head ---- */

float gpt_tp_head_forward(const GptConfig *c, const GptTp *tp, PrecisionType dt, int B, int T,
			  const void *params, const void *wte, const void *x, const int *targets,
			  void *acts, float *scratch)
{
	int N = B * T, C = c->C, Vt = c->V / tp->t, R = gpt_tp_rows(tp, B, T);
	size_t rc = (size_t)R * C, lo = (size_t)tp->r * (size_t)Vt;
	void *x_in = acts, *lnf = precision_at(acts, rc, dt);
	float *probs = gpt_tp_head_probs(c, tp, dt, B, T, acts);
	float *mx = scratch, *sum = scratch + N, *tgt = scratch + 2 * (size_t)N;
	float *gath = scratch + 3 * (size_t)N + (size_t)N * C;

	memcpy(x_in, x, rc * precision_bytes(dt));
	ops16_layernorm_forward(dt, lnf, x_in, params, precision_at(params, C, dt), R, C);
	ops16_lm_head_forward(dt, probs, gather_rows(tp, dt, lnf, gath, rc), wte, N, C, Vt);

	/* Megatron's vocabulary-parallel cross-entropy, in fp32: the max over the group, then each
	 * rank's sum of exponentials and (on the rank holding it) the target's logit, summed */
	for (int i = 0; i < N; i++) {
		const float *l = probs + (size_t)i * Vt;
		float m = -INFINITY;
		for (int j = 0; j < Vt; j++)
			if (l[j] > m)
				m = l[j];
		mx[i] = m;
	}
	all_reduce(tp, mx, (size_t)N, PREC_F32, GPT_TP_MAX);
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
	all_reduce(tp, tgt, (size_t)N, PREC_F32, GPT_TP_SUM);
	all_reduce(tp, sum, (size_t)N, PREC_F32, GPT_TP_SUM);
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

void gpt_tp_head_backward(const GptConfig *c, const GptTp *tp, PrecisionType dt, int B, int T,
			  const void *params, const void *wte, float *grads, float *dwte,
			  void *acts, const int *targets, float dloss, float *dx, float *scratch)
{
	int N = B * T, C = c->C, Vt = c->V / tp->t, R = gpt_tp_rows(tp, B, T);
	size_t rc = (size_t)R * C, lo = (size_t)tp->r * (size_t)Vt, nv = (size_t)N * (size_t)Vt;
	void *x_in = acts, *lnf = precision_at(acts, rc, dt);
	float *probs = gpt_tp_head_probs(c, tp, dt, B, T, acts);
	float *part = scratch + 3 * (size_t)N, *gath = part + (size_t)N * C;

	/* as ops_crossentropy_backward, over this rank's columns; in 16-bit each dlogit is rounded
	 * to dt as it is made (pack), the two products' operand */
	float s = dloss / (float)N;
	for (int i = 0; i < N; i++) {
		float *d = probs + (size_t)i * Vt;
		size_t target = (size_t)targets[i] - lo;
		for (size_t j = 0; j < (size_t)Vt; j++)
			d[j] = s * (d[j] - (j == target ? 1.0f : 0.0f));
	}
	pack(dt, probs, nv);
	memset(part, 0, (size_t)N * C * sizeof(float));
	ops16_lm_head_backward(dt, part, NULL, probs, NULL, wte, N, C, Vt);
	ops16_lm_head_backward(dt, NULL, dwte, probs, gather_rows(tp, dt, lnf, gath, rc), wte, N, C,
			       Vt);
	const float *d = reduce_grad_rows(tp, dt, part, gath, (size_t)N * C, rc);
	memset(dx, 0, rc * sizeof(float));
	ops16_layernorm_backward(dt, dx, grads, grads + C, d, x_in, params, R, C);
}

#include "sparse_eager_cpu.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "par_cpu.h"
#include "precision.h"

int sparse_index_build(SparseIndex *ix, const unsigned char *layout, int NH, int nb, int bs)
{
	long long n = 0;
	memset(ix, 0, sizeof(*ix));
	for (size_t i = 0; i < (size_t)NH * nb * nb; i++)
		n += layout[i] != 0;
	ix->row_start = malloc(((size_t)NH * nb + 1) * sizeof(long long));
	ix->cols = malloc((size_t)(n ? n : 1) * sizeof(int));
	if (!ix->row_start || !ix->cols) {
		sparse_index_free(ix);
		return -1;
	}
	ix->NH = NH, ix->nb = nb, ix->bs = bs, ix->n_kept = n;
	long long k = 0;
	for (int hr = 0; hr < NH * nb; hr++) {
		ix->row_start[hr] = k;
		for (int c = 0; c < nb; c++)
			if (layout[(size_t)hr * nb + c])
				ix->cols[k++] = c;
	}
	ix->row_start[(size_t)NH * nb] = k;
	return 0;
}

void sparse_index_free(SparseIndex *ix)
{
	free(ix->row_start);
	free(ix->cols);
	memset(ix, 0, sizeof(*ix));
}

size_t sparse_eager_probs_elems(const SparseIndex *ix, int B)
{
	return (size_t)B * (size_t)ix->n_kept * (size_t)ix->bs * (size_t)ix->bs;
}

typedef struct EagerArgs {
	PrecisionType t;        /* where a 16-bit unit's products store their results (rnd) */
	float *out;             /* forward: (B, T, C); backward: dqkv (B, T, 3C) */
	float *probs;           /* forward */
	const float *cprobs;    /* backward */
	const float *qkv, *dout;
	const SparseIndex *ix;
	int T, C;
} EagerArgs;

/* x as a 16-bit unit's product stores it, rounded to t (as is in fp32) */
static inline float rnd(float x, PrecisionType t)
{
	return t == PREC_F32 ? x : precision_round(x, t);
}

static float dot(const float *a, const float *b, int n)
{
	float s = 0.0f;
	for (int i = 0; i < n; i++)
		s += a[i] * b[i];
	return s;
}

/* The visible keys of query i (kept blocks ks..ke-1 of its row, keys at or before i) in ascending
 * order, P pointing at the key's probability; the dense op's loop over 0..i when every block is
 * kept. */
#define FOR_VISIBLE(a, b, ks, ke, i, ii, j, P)                                               \
	for (long long k_ = (ks); k_ < (ke); k_++)                                           \
		for (int j = (a)->ix->cols[k_] * (a)->ix->bs, jj_ = 0;                       \
		     jj_ < (a)->ix->bs && j <= (i); jj_++, j++)                              \
			if (((P) = prow(a, b, k_, ii) + jj_), 1)

/* The probabilities of query row ii (within its block row) of kept block k of batch element b. */
static inline float *prow(const EagerArgs *a, int b, long long k, int ii)
{
	const SparseIndex *ix = a->ix;
	float *base = a->probs ? a->probs : (float *)a->cprobs;
	return base + (((size_t)b * (size_t)ix->n_kept + (size_t)k) * ix->bs + (size_t)ii) * ix->bs;
}

/* One (batch, head) of the fused q, k, v: its head size and score scale, a token's stride, the
 * head's offset in a token's q (k and v: + C, + 2C), the batch element's first token. */
typedef struct HeadAt {
	int hs;
	float scale;
	size_t row3, hoff;
	const float *base;
} HeadAt;

static HeadAt head_at(const EagerArgs *a, int b, int h)
{
	HeadAt at = {.hs = a->C / a->ix->NH, .row3 = (size_t)3 * a->C};
	at.scale = 1.0f / sqrtf((float)at.hs);
	at.hoff = (size_t)h * at.hs;
	at.base = a->qkv + (size_t)b * a->T * at.row3;
	return at;
}

/* The kept blocks [*ks, *ke) of the block row of query i of head h. */
static void row_blocks(const SparseIndex *ix, int h, int i, long long *ks, long long *ke)
{
	size_t hr = (size_t)h * ix->nb + (size_t)(i / ix->bs);
	*ks = ix->row_start[hr], *ke = ix->row_start[hr + 1];
}

static void forward_head(const EagerArgs *a, int b, int h)
{
	HeadAt at = head_at(a, b, h);
	int C = a->C, hs = at.hs, bs = a->ix->bs;
	float scale = at.scale;
	size_t row3 = at.row3, hoff = at.hoff;
	const float *base = at.base;
	for (int i = 0; i < a->T; i++) {
		int ii = i % bs;
		long long ks, ke;
		row_blocks(a->ix, h, i, &ks, &ke);
		const float *q = base + i * row3 + hoff;
		float *p, mx = -INFINITY;
		for (long long k = ks; k < ke; k++) /* masked keys are kept as zeros */
			memset(prow(a, b, k, ii), 0, (size_t)bs * sizeof(float));
		FOR_VISIBLE(a, b, ks, ke, i, ii, j, p) {
			*p = rnd(dot(q, base + j * row3 + C + hoff, hs) * scale, a->t);
			if (*p > mx)
				mx = *p;
		}
		double sum = 0.0;
		FOR_VISIBLE(a, b, ks, ke, i, ii, j, p) {
			float e = expf(*p - mx);
			sum += e;
			*p = rnd(e, a->t);
		}
		float inv = sum > 0 ? (float)(1.0 / sum) : 0.0f;
		FOR_VISIBLE(a, b, ks, ke, i, ii, j, p)
			*p = rnd(*p * inv, a->t);
		float *o = a->out + ((size_t)b * a->T + i) * C + hoff;
		memset(o, 0, (size_t)hs * sizeof(float));
		FOR_VISIBLE(a, b, ks, ke, i, ii, j, p) {
			const float *v = base + j * row3 + 2 * (size_t)C + hoff;
			for (int x = 0; x < hs; x++)
				o[x] += *p * v[x];
		}
	}
}

/* As ops_attention_backward's, per query row over its visible keys: dP = dout . v, dv += P dout,
 * dS = P (dP - sum P dP), dq += scale dS k, dk += scale dS q; dP computed twice rather than kept. */
static void backward_head(const EagerArgs *a, int b, int h)
{
	HeadAt at = head_at(a, b, h);
	int C = a->C, hs = at.hs;
	float scale = at.scale;
	size_t row3 = at.row3, hoff = at.hoff;
	const float *base = at.base;
	float *dbase = a->out + (size_t)b * a->T * row3;
	for (int i = 0; i < a->T; i++) {
		int ii = i % a->ix->bs;
		long long ks, ke;
		row_blocks(a->ix, h, i, &ks, &ke);
		const float *q = base + i * row3 + hoff, *g = a->dout + ((size_t)b * a->T + i) * C + hoff;
		float *dq = dbase + i * row3 + hoff, *p;
		double pdp = 0.0;
		FOR_VISIBLE(a, b, ks, ke, i, ii, j, p) {
			const float *v = base + j * row3 + 2 * (size_t)C + hoff;
			float *dv = dbase + j * row3 + 2 * (size_t)C + hoff;
			pdp += *p * rnd(dot(g, v, hs), a->t);
			for (int x = 0; x < hs; x++)
				dv[x] += *p * g[x];
		}
		FOR_VISIBLE(a, b, ks, ke, i, ii, j, p) {
			const float *k = base + j * row3 + C + hoff;
			const float *v = base + j * row3 + 2 * (size_t)C + hoff;
			float *dk = dbase + j * row3 + C + hoff;
			float ds = rnd(*p * (rnd(dot(g, v, hs), a->t) - (float)pdp), a->t) * scale;
			for (int x = 0; x < hs; x++) {
				dq[x] += ds * k[x];
				dk[x] += ds * q[x];
			}
		}
	}
}

static void forward_pairs(void *ctx, size_t p0, size_t p1)
{
	EagerArgs *a = ctx;
	for (size_t bh = p0; bh < p1; bh++)
		forward_head(a, (int)(bh / a->ix->NH), (int)(bh % a->ix->NH));
}

static void backward_pairs(void *ctx, size_t p0, size_t p1)
{
	EagerArgs *a = ctx;
	for (size_t bh = p0; bh < p1; bh++)
		backward_head(a, (int)(bh / a->ix->NH), (int)(bh % a->ix->NH));
}

void sparse_eager_forward_as(PrecisionType t, float *out, float *probs, const float *qkv,
			     const SparseIndex *ix, int B, int T, int C)
{
	EagerArgs a = {.t = t, .out = out, .probs = probs, .qkv = qkv, .ix = ix, .T = T, .C = C};
	par_cpu_for((size_t)B * ix->NH, 1, forward_pairs, &a);
}

void sparse_eager_backward_as(PrecisionType t, float *dqkv, const float *dout, const float *qkv,
			      const float *probs, const SparseIndex *ix, int B, int T, int C)
{
	EagerArgs a = {.t = t, .out = dqkv, .cprobs = probs, .qkv = qkv, .dout = dout, .ix = ix,
		       .T = T, .C = C};
	par_cpu_for((size_t)B * ix->NH, 1, backward_pairs, &a);
}

void sparse_eager_forward(float *out, float *probs, const float *qkv, const SparseIndex *ix,
			  int B, int T, int C)
{
	sparse_eager_forward_as(PREC_F32, out, probs, qkv, ix, B, T, C);
}

void sparse_eager_backward(float *dqkv, const float *dout, const float *qkv, const float *probs,
			   const SparseIndex *ix, int B, int T, int C)
{
	sparse_eager_backward_as(PREC_F32, dqkv, dout, qkv, probs, ix, B, T, C);
}

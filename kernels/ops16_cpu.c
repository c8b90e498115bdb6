#include "ops16_cpu.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops_cpu.h"
#include "par_cpu.h"

/* Loops split over par_cpu's threads as ops_cpu's are: along elements, rows or (batch, head)
 * pairs, each value computed whole by one thread in single-threaded order. */

/* ---- fp32 temporaries ----
 * They come from a few blocks kept between calls: the same sizes recur at every micro-batch, and
 * a block above glibc's mmap threshold (128 KiB: a bf16 GPT-2 block's N x 4C activations at
 * N = 256, C = 128 are 512 KiB) given back to the system is mapped and faulted in again at the
 * next call. Measured on gpt2-mini-cpu-zero3 (bf16) at 1 rank: 35,512 minor page faults a step
 * and a 0.92 s step with malloc and free, where a process whose threshold something else had
 * raised ran 0.55 s with none. Each block carries its capacity in a 16-byte header (keeping
 * malloc's alignment). */

#define F32_HEADER 16
#define F32_KEPT 16

static struct {
	float *p[F32_KEPT];
	pthread_mutex_t mu;
} kept = {.mu = PTHREAD_MUTEX_INITIALIZER};

static size_t capacity(const float *p)
{
	size_t cap;
	memcpy(&cap, (const char *)p - F32_HEADER, sizeof(cap));
	return cap;
}

static float *alloc_f32(size_t n)
{
	n = n ? n : 1;
	pthread_mutex_lock(&kept.mu);
	int best = -1;
	for (int i = 0; i < F32_KEPT; i++) /* the smallest kept block that holds n */
		if (kept.p[i] && capacity(kept.p[i]) >= n &&
		    (best < 0 || capacity(kept.p[i]) < capacity(kept.p[best])))
			best = i;
	float *p = best >= 0 ? kept.p[best] : NULL;
	if (best >= 0)
		kept.p[best] = NULL;
	pthread_mutex_unlock(&kept.mu);
	if (p)
		return p;
	char *raw = malloc(F32_HEADER + n * sizeof(float));
	if (!raw) {
		fprintf(stderr, "ops16_cpu: out of memory for %zu floats of temporaries\n", n);
		abort();
	}
	memcpy(raw, &n, sizeof(n));
	return (float *)(void *)(raw + F32_HEADER);
}

/* p (from alloc_f32, or NULL) kept for the next call, in place of the smallest kept block when
 * every place is taken and that one is smaller. */
static void free_f32(float *p)
{
	if (!p)
		return;
	pthread_mutex_lock(&kept.mu);
	int slot = -1;
	for (int i = 0; i < F32_KEPT && slot < 0; i++)
		if (!kept.p[i])
			slot = i;
	for (int i = 0; i < F32_KEPT && slot < 0; i++)
		if (capacity(kept.p[i]) < capacity(p))
			slot = i;
	float *drop = p;
	if (slot >= 0) {
		drop = kept.p[slot];
		kept.p[slot] = p;
	}
	pthread_mutex_unlock(&kept.mu);
	if (drop)
		free((char *)drop - F32_HEADER);
}

void ops16_widen(PrecisionType t, float *dst, const void *src, size_t n)
{
	if (t == PREC_F32)
		par_cpu_memcpy(dst, src, n * sizeof(float));
	else if (t == PREC_BF16)
		precision_bf16_to_f32_n(dst, src, n);
	else
		precision_f16_to_f32_n(dst, src, n);
}

/* n values of type t as a new fp32 array (caller frees); NULL for NULL */
static float *widen(PrecisionType t, const void *x, size_t n)
{
	if (!x)
		return NULL;
	float *w = alloc_f32(n);
	ops16_widen(t, w, x, n);
	return w;
}

void ops16_round(PrecisionType t, void *dst, const float *src, size_t n)
{
	if (t == PREC_F32)
		par_cpu_memcpy(dst, src, n * sizeof(float));
	else if (t == PREC_BF16)
		precision_f32_to_bf16_n(dst, src, n);
	else
		precision_f32_to_f16_n(dst, src, n);
}

/* ---- linear layers ---- */

/* The products of the widened values are those of the t values: every product of two 16-bit
 * numbers is exact in fp32, so CBLAS on the widened copies sums the same terms cuBLAS does. */
void ops16_matmul_forward(PrecisionType t, void *y, const void *x, const void *w, const void *b,
			  int N, int C_in, int C_out)
{
	if (t == PREC_F32) {
		ops_matmul_forward(y, x, w, b, N, C_in, C_out);
		return;
	}
	size_t ny = (size_t)N * C_out;
	float *xf = widen(t, x, (size_t)N * C_in), *wf = widen(t, w, (size_t)C_in * C_out);
	float *bf = widen(t, b, (size_t)C_out), *yf = alloc_f32(ny);
	ops_matmul_forward(yf, xf, wf, bf, N, C_in, C_out);
	ops16_round(t, y, yf, ny);
	free_f32(xf), free_f32(wf), free_f32(bf), free_f32(yf);
}

void ops16_matmul_backward(PrecisionType t, float *dx, float *dw, float *db, const void *dy,
			   const void *x, const void *w, int N, int C_in, int C_out)
{
	if (t == PREC_F32) {
		ops_matmul_backward(dx, dw, db, dy, x, w, N, C_in, C_out);
		return;
	}
	float *dyf = widen(t, dy, (size_t)N * C_out);
	float *xf = dw ? widen(t, x, (size_t)N * C_in) : NULL;
	float *wf = dx ? widen(t, w, (size_t)C_in * C_out) : NULL;
	ops_matmul_backward(dx, dw, db, dyf, xf, wf, N, C_in, C_out);
	free_f32(dyf), free_f32(xf), free_f32(wf);
}

void ops16_lm_head_forward(PrecisionType t, float *logits, const void *x, const void *wte, int N,
			   int C, int V)
{
	if (t == PREC_F32) {
		ops_lm_head_forward(logits, x, wte, N, C, V);
		return;
	}
	float *xf = widen(t, x, (size_t)N * C), *wf = widen(t, wte, (size_t)V * C);
	ops_lm_head_forward(logits, xf, wf, N, C, V);
	free_f32(xf), free_f32(wf);
}

void ops16_lm_head_backward(PrecisionType t, float *dx, float *dwte, const void *dlogits,
			    const void *x, const void *wte, int N, int C, int V)
{
	if (t == PREC_F32) {
		ops_lm_head_backward(dx, dwte, dlogits, x, wte, N, C, V);
		return;
	}
	float *df = widen(t, dlogits, (size_t)N * V);
	float *xf = dwte ? widen(t, x, (size_t)N * C) : NULL;
	float *wf = dx ? widen(t, wte, (size_t)V * C) : NULL;
	ops_lm_head_backward(dx, dwte, df, xf, wf, N, C, V);
	free_f32(df), free_f32(xf), free_f32(wf);
}

/* ---- normalisation, activation, residual, embedding ---- */

void ops16_layernorm_forward(PrecisionType t, void *y, const void *x, const void *w, const void *b,
			     int N, int C)
{
	if (t == PREC_F32) {
		ops_layernorm_forward(y, NULL, NULL, x, w, b, N, C);
		return;
	}
	size_t n = (size_t)N * C;
	float *xf = widen(t, x, n), *wf = widen(t, w, (size_t)C), *bf = widen(t, b, (size_t)C);
	ops_layernorm_forward(xf, NULL, NULL, xf, wf, bf, N, C); /* in place: y may be x */
	ops16_round(t, y, xf, n);
	free_f32(xf), free_f32(wf), free_f32(bf);
}

void ops16_layernorm_backward(PrecisionType t, float *dx, float *dw, float *db, const float *dy,
			      const void *x, const void *w, int N, int C)
{
	if (t == PREC_F32) {
		ops_layernorm_backward(dx, dw, db, dy, x, w, N, C);
		return;
	}
	float *xf = widen(t, x, (size_t)N * C), *wf = widen(t, w, (size_t)C);
	ops_layernorm_backward(dx, dw, db, dy, xf, wf, N, C);
	free_f32(xf), free_f32(wf);
}

void ops16_gelu_forward(PrecisionType t, void *y, const void *x, size_t n)
{
	if (t == PREC_F32) {
		ops_gelu_forward(y, x, n);
		return;
	}
	float *xf = widen(t, x, n);
	ops_gelu_forward(xf, xf, n);
	ops16_round(t, y, xf, n);
	free_f32(xf);
}

void ops16_gelu_backward(PrecisionType t, float *dx, const float *dy, const void *x, size_t n)
{
	if (t == PREC_F32) {
		ops_gelu_backward(dx, dy, x, n);
		return;
	}
	float *xf = widen(t, x, n);
	ops_gelu_backward(dx, dy, xf, n);
	free_f32(xf);
}

typedef struct Elt16Args {
	PrecisionType t;
	void *y;
	const void *a, *b;
	const int *tokens;
	int T, C;
} Elt16Args;

static void residual_range(void *ctx, size_t i0, size_t i1)
{
	Elt16Args *e = ctx;
	for (size_t i = i0; i < i1; i++)
		precision_store(e->y, i, precision_load(e->a, i, e->t) + precision_load(e->b, i, e->t),
				e->t);
}

void ops16_residual_forward(PrecisionType t, void *y, const void *a, const void *b, size_t n)
{
	Elt16Args e = {.t = t, .y = y, .a = a, .b = b};
	par_cpu_for(n, PAR_CPU_GRAIN_ELEMS, residual_range, &e);
}

static void embed_rows(void *ctx, size_t r0, size_t r1)
{
	Elt16Args *e = ctx;
	PrecisionType t = e->t;
	int C = e->C;
	for (size_t row = r0; row < r1; row++) {
		size_t te = (size_t)e->tokens[row] * C, pe = (row % (size_t)e->T) * C;
		for (int i = 0; i < C; i++)
			precision_store(e->y, row * C + i,
					precision_load(e->a, te + i, t) + precision_load(e->b, pe + i, t),
					t);
	}
}

void ops16_embed_forward(PrecisionType t, void *y, const int *tokens, const void *wte,
			 const void *wpe, int B, int T, int C)
{
	Elt16Args e = {.t = t, .y = y, .a = wte, .b = wpe, .tokens = tokens, .T = T, .C = C};
	size_t grain = PAR_CPU_GRAIN_ELEMS / (size_t)C;
	par_cpu_for((size_t)B * T, grain ? grain : 1, embed_rows, &e);
}

/* ---- attention ---- */

/* One query row of ops16_attention_forward: q, k, v the widened qkv rows of its batch element. */
static void attention_row(PrecisionType t, void *out, void *att, const float *base, size_t row3,
			  int C, int T, int tq, size_t hoff, int hs, float scale, size_t att_off,
			  size_t out_off)
{
	const float *q = base + tq * row3 + hoff;
	float mx = -INFINITY;
	for (int t2 = 0; t2 <= tq; t2++) {
		const float *k = base + t2 * row3 + C + hoff;
		float s = 0.0f;
		for (int i = 0; i < hs; i++)
			s += q[i] * k[i];
		s = precision_round(s * scale, t);
		precision_store(att, att_off + t2, s, t);
		mx = s > mx ? s : mx;
	}
	double sum = 0.0;
	for (int t2 = 0; t2 <= tq; t2++) {
		float e = expf(precision_load(att, att_off + t2, t) - mx);
		sum += e;
		precision_store(att, att_off + t2, e, t);
	}
	float inv = (float)(1.0 / sum);
	for (int t2 = 0; t2 <= tq; t2++)
		precision_store(att, att_off + t2, precision_load(att, att_off + t2, t) * inv, t);
	for (int t2 = tq + 1; t2 < T; t2++)
		precision_store(att, att_off + t2, 0.0f, t);
	for (int i = 0; i < hs; i++) {
		float o = 0.0f;
		for (int t2 = 0; t2 <= tq; t2++)
			o += precision_load(att, att_off + t2, t) * base[t2 * row3 + 2 * (size_t)C + hoff + i];
		precision_store(out, out_off + i, o, t);
	}
}

/* attention over the (batch, head) pairs: each writes its own head's columns and att block */
typedef struct Attn16Args {
	PrecisionType t;
	void *out, *att;    /* forward */
	float *dqkv;        /* backward */
	const float *qf;    /* the widened qkv (B, T, 3C) */
	const float *g, *af; /* backward: rounded dout (B, T, C), widened att (B, NH, T, T) */
	int T, C, NH;
} Attn16Args;

static void attention_forward_pairs(void *ctx, size_t p0, size_t p1)
{
	Attn16Args *a = ctx;
	int T = a->T, C = a->C, NH = a->NH, hs = C / NH;
	float scale = 1.0f / sqrtf((float)hs);
	size_t row3 = (size_t)3 * C;
	for (size_t bh = p0; bh < p1; bh++) {
		size_t b = bh / NH, h = bh % NH;
		for (int tq = 0; tq < T; tq++)
			attention_row(a->t, a->out, a->att, a->qf + b * T * row3, row3, C, T, tq, h * hs,
				      hs, scale, (bh * T + tq) * T, (b * T + tq) * C + h * hs);
	}
}

void ops16_attention_forward(PrecisionType t, void *out, void *att, const void *qkv, int B, int T,
			     int C, int NH)
{
	if (t == PREC_F32) {
		ops_attention_forward(out, att, qkv, B, T, C, NH);
		return;
	}
	float *qf = widen(t, qkv, (size_t)B * T * 3 * C);
	Attn16Args a = {.t = t, .out = out, .att = att, .qf = qf, .T = T, .C = C, .NH = NH};
	par_cpu_for((size_t)B * NH, 1, attention_forward_pairs, &a);
	free_f32(qf);
}

/* One head (b, h) of ops16_attention_backward: qf and g the widened qkv and rounded dout of
 * batch element b, af its (T, T) probabilities, ds a (T, T) temporary. */
static void attention_head_backward(PrecisionType t, float *dbase, const float *qf,
				    const float *g, const float *af, float *ds, int T, int C,
				    size_t hoff, int hs, float scale)
{
	size_t row3 = (size_t)3 * C;
	for (int tq = 0; tq < T; tq++) {
		const float *p = af + (size_t)tq * T, *gr = g + (size_t)tq * C + hoff;
		float *d = ds + (size_t)tq * T;
		for (int t2 = 0; t2 <= tq; t2++) { /* datt, rounded as the GEMM stores it */
			const float *v = qf + t2 * row3 + 2 * (size_t)C + hoff;
			float s = 0.0f;
			for (int i = 0; i < hs; i++)
				s += gr[i] * v[i];
			d[t2] = precision_round(s, t);
		}
		float pdp = 0.0f;
		for (int t2 = 0; t2 <= tq; t2++)
			pdp += p[t2] * d[t2];
		for (int t2 = 0; t2 <= tq; t2++)
			d[t2] = precision_round(p[t2] * (d[t2] - pdp), t);
		for (int t2 = tq + 1; t2 < T; t2++)
			d[t2] = 0.0f;
	}
	for (int r = 0; r < T; r++)
		for (int i = 0; i < hs; i++) {
			/* dq[r] += scale sum_t2 dS[r][t2] k[t2]; dk[r] += scale sum_t dS[t][r] q[t];
			 * dv[r] += sum_t P[t][r] g[t]: each sum in fp32, then added */
			float sq = 0.0f, sk = 0.0f, sv = 0.0f;
			for (int u = 0; u < T; u++) {
				sq += ds[(size_t)r * T + u] * qf[u * row3 + C + hoff + i];
				sk += ds[(size_t)u * T + r] * qf[u * row3 + hoff + i];
				sv += af[(size_t)u * T + r] * g[(size_t)u * C + hoff + i];
			}
			dbase[r * row3 + hoff + i] += scale * sq;
			dbase[r * row3 + C + hoff + i] += scale * sk;
			dbase[r * row3 + 2 * (size_t)C + hoff + i] += sv;
		}
}

/* y (fp32) = a (fp32) rounded to t and back */
static void round_f32_range(void *ctx, size_t i0, size_t i1)
{
	Elt16Args *e = ctx;
	float *y = e->y;
	const float *x = e->a;
	for (size_t i = i0; i < i1; i++)
		y[i] = precision_round(x[i], e->t);
}

/* each range has its own (T, T) temporary */
static void attention_backward_pairs(void *ctx, size_t p0, size_t p1)
{
	Attn16Args *a = ctx;
	int T = a->T, C = a->C, NH = a->NH, hs = C / NH;
	float scale = 1.0f / sqrtf((float)hs);
	size_t tt = (size_t)T * T, row3 = (size_t)3 * C;
	float *ds = alloc_f32(tt);
	for (size_t bh = p0; bh < p1; bh++) {
		size_t b = bh / NH, h = bh % NH;
		attention_head_backward(a->t, a->dqkv + b * T * row3, a->qf + b * T * row3,
					a->g + b * T * C, a->af + bh * tt, ds, T, C, h * hs, hs,
					scale);
	}
	free_f32(ds);
}

void ops16_attention_backward(PrecisionType t, float *dqkv, const float *dout, const void *qkv,
			      const void *att, int B, int T, int C, int NH)
{
	if (t == PREC_F32) { /* no rounding: fp32's own op, so gpt16_cpu at fp32 is gpt_cpu */
		ops_attention_backward(dqkv, dout, qkv, att, B, T, C, NH);
		return;
	}
	size_t nqkv = (size_t)B * T * 3 * C, btc = (size_t)B * T * C, tt = (size_t)T * T;
	float *qf = widen(t, qkv, nqkv), *af = widen(t, att, (size_t)B * NH * tt);
	float *g = alloc_f32(btc);
	Elt16Args r = {.t = t, .y = g, .a = dout};
	par_cpu_for(btc, PAR_CPU_GRAIN_ELEMS, round_f32_range, &r);
	Attn16Args a = {.t = t, .dqkv = dqkv, .qf = qf, .g = g, .af = af, .T = T, .C = C, .NH = NH};
	par_cpu_for((size_t)B * NH, 1, attention_backward_pairs, &a);
	free_f32(qf), free_f32(af), free_f32(g);
}

/* Block-sparse: the kept blocks' probabilities in t where the dense op keeps its (T, T) rows */
void ops16_sparse_attention_forward(PrecisionType t, void *out, void *probs, const void *qkv,
				    const SparseIndex *ix, int B, int T, int C)
{
	if (t == PREC_F32) {
		sparse_eager_forward(out, probs, qkv, ix, B, T, C);
		return;
	}
	size_t btc = (size_t)B * T * C, np = sparse_eager_probs_elems(ix, B);
	float *qf = widen(t, qkv, 3 * btc), *pf = alloc_f32(np), *of = alloc_f32(btc);
	sparse_eager_forward_as(t, of, pf, qf, ix, B, T, C);
	ops16_round(t, probs, pf, np); /* already t's values: stored exactly */
	ops16_round(t, out, of, btc);
	free_f32(qf), free_f32(pf), free_f32(of);
}

void ops16_sparse_attention_backward(PrecisionType t, float *dqkv, const float *dout,
				     const void *qkv, const void *probs, const SparseIndex *ix,
				     int B, int T, int C)
{
	if (t == PREC_F32) {
		sparse_eager_backward(dqkv, dout, qkv, probs, ix, B, T, C);
		return;
	}
	size_t btc = (size_t)B * T * C;
	float *qf = widen(t, qkv, 3 * btc), *pf = widen(t, probs, sparse_eager_probs_elems(ix, B));
	float *g = alloc_f32(btc);
	Elt16Args r = {.t = t, .y = g, .a = dout};
	par_cpu_for(btc, PAR_CPU_GRAIN_ELEMS, round_f32_range, &r);
	sparse_eager_backward_as(t, dqkv, g, qf, pf, ix, B, T, C);
	free_f32(qf), free_f32(pf), free_f32(g);
}

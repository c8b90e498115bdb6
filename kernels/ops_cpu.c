#include "ops_cpu.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "par_cpu.h"

/* Every loop here that is split over threads (par_cpu_for) is split along a dimension whose
 * items are independent: rows for per-row work, columns for sums down the rows (a bias or norm
 * weight's gradient), (batch, head) pairs for attention, elements for elementwise ops. Each value
 * is then computed by one thread in the order the single-threaded loop uses, so the results are
 * bit for bit the same at any thread count. */

/* rows per range for per-row work of about C operations a row */
static size_t rows_grain(int C)
{
	size_t g = PAR_CPU_GRAIN_ELEMS / (size_t)(C > 0 ? C : 1);
	return g ? g : 1;
}

/* ---- linear layers ---- */

typedef struct BiasArgs {
	float *y;
	const float *b;
	int C;
} BiasArgs;

static void bias_rows(void *ctx, size_t i0, size_t i1)
{
	BiasArgs *a = ctx;
	for (size_t i = i0; i < i1; i++)
		memcpy(a->y + i * a->C, a->b, (size_t)a->C * sizeof(float));
}

void ops_matmul_forward(float *y, const float *x, const float *w, const float *b, int N, int C_in,
			int C_out)
{
	/* the bias goes in first so that one GEMM with beta = 1 adds the product onto it */
	float beta = 0.0f;
	if (b) {
		BiasArgs a = {y, b, C_out};
		par_cpu_for((size_t)N, rows_grain(C_out), bias_rows, &a);
		beta = 1.0f;
	}
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C_out, C_in, 1.0f, x, C_in, w,
		    C_out, beta, y, C_out);
}

/* db (C) += the column sums of dy (N, C), split over columns: each column sums its rows in order */
typedef struct ColSumArgs {
	float *db;
	const float *dy;
	int N, C;
} ColSumArgs;

static void colsum_cols(void *ctx, size_t j0, size_t j1)
{
	ColSumArgs *a = ctx;
	for (int i = 0; i < a->N; i++) {
		const float *row = a->dy + (size_t)i * a->C;
		for (size_t j = j0; j < j1; j++)
			a->db[j] += row[j];
	}
}

static void column_sums(float *db, const float *dy, int N, int C)
{
	ColSumArgs a = {db, dy, N, C};
	par_cpu_for((size_t)C, rows_grain(N), colsum_cols, &a);
}

void ops_matmul_backward(float *dx, float *dw, float *db, const float *dy, const float *x,
			 const float *w, int N, int C_in, int C_out)
{
	if (dx)
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, C_in, C_out, 1.0f, dy, C_out,
			    w, C_out, 1.0f, dx, C_in);
	if (dw)
		cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, C_in, C_out, N, 1.0f, x, C_in,
			    dy, C_out, 1.0f, dw, C_out);
	if (db)
		column_sums(db, dy, N, C_out);
}

void ops_lm_head_forward(float *logits, const float *x, const float *wte, int N, int C, int V)
{
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, V, C, 1.0f, x, C, wte, C, 0.0f,
		    logits, V);
}

void ops_lm_head_backward(float *dx, float *dwte, const float *dlogits, const float *x,
			  const float *wte, int N, int C, int V)
{
	if (dx)
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, V, 1.0f, dlogits, V,
			    wte, C, 1.0f, dx, C);
	if (dwte)
		cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, V, C, N, 1.0f, dlogits, V, x,
			    C, 1.0f, dwte, C);
}

/* ---- normalisation and activation ---- */

/* Mean and 1/sqrt(var + eps) of one row, two-pass in double; forward and backward both call this,
 * so backward sees bit for bit the statistics forward used. */
static void layernorm_stats(const float *x, int C, float *mean, float *rstd)
{
	double sum = 0.0, sq = 0.0;
	for (int i = 0; i < C; i++)
		sum += x[i];
	double m = sum / C;
	for (int i = 0; i < C; i++)
		sq += (x[i] - m) * (x[i] - m);
	*mean = (float)m;
	*rstd = (float)(1.0 / sqrt(sq / C + OPS_LAYERNORM_EPS));
}

typedef struct LnArgs {
	float *y, *dx, *dw, *db;
	float *mean, *rstd;
	const float *x, *dy, *w, *b;
	int N, C;
} LnArgs;

static void ln_forward_rows(void *ctx, size_t i0, size_t i1)
{
	LnArgs *a = ctx;
	int C = a->C;
	for (size_t i = i0; i < i1; i++) {
		const float *xr = a->x + i * C;
		float *yr = a->y + i * C;
		float m, r;
		layernorm_stats(xr, C, &m, &r);
		for (int j = 0; j < C; j++)
			yr[j] = (xr[j] - m) * r * a->w[j] + a->b[j];
		if (a->mean)
			a->mean[i] = m;
		if (a->rstd)
			a->rstd[i] = r;
	}
}

void ops_layernorm_forward(float *y, float *mean, float *rstd, const float *x, const float *w,
			   const float *b, int N, int C)
{
	LnArgs a = {.y = y, .mean = mean, .rstd = rstd, .x = x, .w = w, .b = b, .N = N, .C = C};
	par_cpu_for((size_t)N, rows_grain(C), ln_forward_rows, &a);
}

/* With xhat = (x - mean) rstd and g = dy * w, the gradient through the normalisation is
 * dx = rstd (g - mean(g) - xhat mean(g xhat)): the two means remove the components along the
 * directions that normalising takes out (a shift of x and a scaling of x - mean). */
/* One row's share of dw and db, columns j0 .. j1 - 1. */
static void ln_backward_params(const LnArgs *a, size_t i, float m, float r, size_t j0, size_t j1)
{
	const float *xr = a->x + i * a->C, *dyr = a->dy + i * a->C;
	for (size_t j = j0; j < j1; j++) {
		float xhat = (xr[j] - m) * r;
		if (a->dw)
			a->dw[j] += dyr[j] * xhat;
		if (a->db)
			a->db[j] += dyr[j];
	}
}

/* Per row: the statistics (kept in mean and rstd for the column pass) and dx. Without mean (no
 * memory for it) the row also adds its share of dw and db: then it must run on one thread. */
static void ln_backward_rows(void *ctx, size_t i0, size_t i1)
{
	LnArgs *a = ctx;
	int C = a->C;
	const float *w = a->w;
	for (size_t i = i0; i < i1; i++) {
		const float *xr = a->x + i * C, *dyr = a->dy + i * C;
		float m, r;
		layernorm_stats(xr, C, &m, &r);
		if (a->mean)
			a->mean[i] = m, a->rstd[i] = r;
		else
			ln_backward_params(a, i, m, r, 0, (size_t)C);
		if (!a->dx)
			continue;
		double g_sum = 0.0, gx_sum = 0.0;
		for (int j = 0; j < C; j++) {
			float xhat = (xr[j] - m) * r;
			float g = dyr[j] * w[j];
			g_sum += g;
			gx_sum += g * xhat;
		}
		float g_mean = (float)(g_sum / C), gx_mean = (float)(gx_sum / C);
		float *dxr = a->dx + i * C;
		for (int j = 0; j < C; j++) {
			float xhat = (xr[j] - m) * r;
			dxr[j] += r * (dyr[j] * w[j] - g_mean - xhat * gx_mean);
		}
	}
}

/* dw and db split over columns, each summing its rows in order */
static void ln_backward_cols(void *ctx, size_t j0, size_t j1)
{
	LnArgs *a = ctx;
	for (int i = 0; i < a->N; i++)
		ln_backward_params(a, (size_t)i, a->mean[i], a->rstd[i], j0, j1);
}

void ops_layernorm_backward(float *dx, float *dw, float *db, const float *dy, const float *x,
			    const float *w, int N, int C)
{
	LnArgs a = {.dx = dx, .dw = dw, .db = db, .x = x, .dy = dy, .w = w, .N = N, .C = C};
	int params = dw || db;
	if (params && (a.mean = malloc(2 * (size_t)N * sizeof(float))) == NULL) {
		ln_backward_rows(&a, 0, (size_t)N); /* no memory for the statistics: one thread */
		return;
	}
	a.rstd = params ? a.mean + N : NULL;
	par_cpu_for((size_t)N, rows_grain(C), ln_backward_rows, &a);
	if (params)
		par_cpu_for((size_t)C, rows_grain(N), ln_backward_cols, &a);
	free(a.mean);
}

#define GELU_K 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_A 0.044715f

/* arguments of the elementwise ops: out = f(in, in2) */
typedef struct EltArgs {
	float *out, *out2;
	const float *in, *in2;
} EltArgs;

static void gelu_forward_range(void *ctx, size_t i0, size_t i1)
{
	EltArgs *a = ctx;
	const float *x = a->in;
	float *y = a->out;
	for (size_t i = i0; i < i1; i++) {
		float v = x[i];
		y[i] = 0.5f * v * (1.0f + tanhf(GELU_K * (v + GELU_A * v * v * v)));
	}
}

void ops_gelu_forward(float *y, const float *x, size_t n)
{
	EltArgs a = {.out = y, .in = x};
	par_cpu_for(n, PAR_CPU_GRAIN_ELEMS, gelu_forward_range, &a);
}

static void gelu_backward_range(void *ctx, size_t i0, size_t i1)
{
	EltArgs *a = ctx;
	float *dx = a->out;
	const float *dy = a->in, *x = a->in2;
	for (size_t i = i0; i < i1; i++) {
		float v = x[i];
		float th = tanhf(GELU_K * (v + GELU_A * v * v * v));
		float du = GELU_K * (1.0f + 3.0f * GELU_A * v * v); /* d(inner)/dx */
		float grad = 0.5f * (1.0f + th) + 0.5f * v * (1.0f - th * th) * du;
		dx[i] += dy[i] * grad;
	}
}

void ops_gelu_backward(float *dx, const float *dy, const float *x, size_t n)
{
	EltArgs a = {.out = dx, .in = dy, .in2 = x};
	par_cpu_for(n, PAR_CPU_GRAIN_ELEMS, gelu_backward_range, &a);
}

/* ---- attention ---- */

/* Both directions split over the B NH (batch, head) pairs: a pair reads and writes only its own
 * head's columns of its own batch element, and its own (T, T) block of att. */
typedef struct AttnArgs {
	float *out;        /* forward: (B, T, C); backward: dqkv (B, T, 3C) */
	float *att;        /* forward: written */
	const float *qkv;  /* (B, T, 3C) */
	const float *patt; /* backward: the probabilities */
	const float *dout; /* backward: (B, T, C) */
	int T, C, NH;
} AttnArgs;

static void attention_forward_head(const AttnArgs *a, int b, int h)
{
	int T = a->T, C = a->C, hs = C / a->NH;
	float scale = 1.0f / sqrtf((float)hs);
	size_t row3 = (size_t)3 * C; /* stride of one token in qkv */
	const float *base = a->qkv + (size_t)b * T * row3;
	for (int t = 0; t < T; t++) {
		const float *q = base + t * row3 + (size_t)h * hs;
		float *p = a->att + (((size_t)b * a->NH + h) * T + t) * T;
		/* scores over the visible keys 0..t, then a max-shifted softmax */
		float mx = -INFINITY;
		for (int t2 = 0; t2 <= t; t2++) {
			const float *k = base + t2 * row3 + C + (size_t)h * hs;
			float s = 0.0f;
			for (int i = 0; i < hs; i++)
				s += q[i] * k[i];
			p[t2] = s * scale;
			if (p[t2] > mx)
				mx = p[t2];
		}
		double sum = 0.0;
		for (int t2 = 0; t2 <= t; t2++) {
			p[t2] = expf(p[t2] - mx);
			sum += p[t2];
		}
		float inv = (float)(1.0 / sum);
		for (int t2 = 0; t2 <= t; t2++)
			p[t2] *= inv;
		for (int t2 = t + 1; t2 < T; t2++)
			p[t2] = 0.0f; /* masked: kept as zeros so att is a plain T x T */
		float *o = a->out + ((size_t)b * T + t) * C + (size_t)h * hs;
		memset(o, 0, (size_t)hs * sizeof(float));
		for (int t2 = 0; t2 <= t; t2++) {
			const float *v = base + t2 * row3 + 2 * (size_t)C + (size_t)h * hs;
			for (int i = 0; i < hs; i++)
				o[i] += p[t2] * v[i];
		}
	}
}

static void attention_forward_pairs(void *ctx, size_t p0, size_t p1)
{
	AttnArgs *a = ctx;
	for (size_t bh = p0; bh < p1; bh++)
		attention_forward_head(a, (int)(bh / a->NH), (int)(bh % a->NH));
}

void ops_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int NH)
{
	AttnArgs a = {.out = out, .att = att, .qkv = qkv, .T = T, .C = C, .NH = NH};
	par_cpu_for((size_t)B * NH, 1, attention_forward_pairs, &a);
}

static float dot(const float *a, const float *b, int n)
{
	float s = 0.0f;
	for (int i = 0; i < n; i++)
		s += a[i] * b[i];
	return s;
}

/* Per query row: dP[t2] = dout . v[t2]; dv[t2] += P[t2] dout; through the softmax,
 * dS[t2] = P[t2] (dP[t2] - sum_j P[j] dP[j]); then dq += scale sum dS[t2] k[t2] and
 * dk[t2] += scale dS[t2] q. The second pass recomputes dP rather than keeping a T-long scratch row,
 * so the op needs no buffer of its own. */
static void attention_backward_head(const AttnArgs *a, int b, int h)
{
	int T = a->T, C = a->C, hs = C / a->NH;
	float scale = 1.0f / sqrtf((float)hs);
	size_t row3 = (size_t)3 * C, hoff = (size_t)h * hs;
	const float *base = a->qkv + (size_t)b * T * row3;
	float *dbase = a->out + (size_t)b * T * row3;
	for (int t = 0; t < T; t++) {
		const float *q = base + t * row3 + hoff;
		float *dq = dbase + t * row3 + hoff;
		const float *p = a->patt + (((size_t)b * a->NH + h) * T + t) * T;
		const float *g = a->dout + ((size_t)b * T + t) * C + hoff;
		double pdp = 0.0;
		for (int t2 = 0; t2 <= t; t2++) {
			const float *v = base + t2 * row3 + 2 * (size_t)C + hoff;
			float *dv = dbase + t2 * row3 + 2 * (size_t)C + hoff;
			pdp += p[t2] * dot(g, v, hs);
			for (int i = 0; i < hs; i++)
				dv[i] += p[t2] * g[i];
		}
		for (int t2 = 0; t2 <= t; t2++) {
			const float *k = base + t2 * row3 + C + hoff;
			const float *v = base + t2 * row3 + 2 * (size_t)C + hoff;
			float *dk = dbase + t2 * row3 + C + hoff;
			float ds = p[t2] * (dot(g, v, hs) - (float)pdp) * scale;
			for (int i = 0; i < hs; i++) {
				dq[i] += ds * k[i];
				dk[i] += ds * q[i];
			}
		}
	}
}

static void attention_backward_pairs(void *ctx, size_t p0, size_t p1)
{
	AttnArgs *a = ctx;
	for (size_t bh = p0; bh < p1; bh++)
		attention_backward_head(a, (int)(bh / a->NH), (int)(bh % a->NH));
}

void ops_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *att,
			    int B, int T, int C, int NH)
{
	AttnArgs a = {.out = dqkv, .qkv = qkv, .patt = att, .dout = dout, .T = T, .C = C, .NH = NH};
	par_cpu_for((size_t)B * NH, 1, attention_backward_pairs, &a);
}

/* ---- residual and embedding ---- */

static void residual_forward_range(void *ctx, size_t i0, size_t i1)
{
	EltArgs *a = ctx;
	for (size_t i = i0; i < i1; i++)
		a->out[i] = a->in[i] + a->in2[i];
}

void ops_residual_forward(float *y, const float *a, const float *b, size_t n)
{
	EltArgs args = {.out = y, .in = a, .in2 = b};
	par_cpu_for(n, PAR_CPU_GRAIN_ELEMS, residual_forward_range, &args);
}

static void residual_backward_range(void *ctx, size_t i0, size_t i1)
{
	EltArgs *a = ctx;
	for (size_t i = i0; i < i1; i++) {
		a->out[i] += a->in[i];
		a->out2[i] += a->in[i];
	}
}

void ops_residual_backward(float *da, float *db, const float *dy, size_t n)
{
	EltArgs args = {.out = da, .out2 = db, .in = dy};
	par_cpu_for(n, PAR_CPU_GRAIN_ELEMS, residual_backward_range, &args);
}

typedef struct EmbedArgs {
	float *y, *dwte, *dwpe;
	const float *dy, *wte, *wpe;
	const int *tokens;
	int N, T, C;
} EmbedArgs;

static void embed_forward_rows(void *ctx, size_t r0, size_t r1)
{
	EmbedArgs *a = ctx;
	size_t C = (size_t)a->C;
	for (size_t row = r0; row < r1; row++) {
		const float *te = a->wte + (size_t)a->tokens[row] * C;
		const float *pe = a->wpe + (row % (size_t)a->T) * C;
		float *yr = a->y + row * C;
		for (size_t i = 0; i < C; i++)
			yr[i] = te[i] + pe[i];
	}
}

void ops_embed_forward(float *y, const int *tokens, const float *wte, const float *wpe, int B,
		       int T, int C)
{
	EmbedArgs a = {.y = y, .wte = wte, .wpe = wpe, .tokens = tokens, .N = B * T, .T = T, .C = C};
	par_cpu_for((size_t)B * T, rows_grain(C), embed_forward_rows, &a);
}

/* Split over channels: rows that share a token add into the same row of dwte, so each thread
 * takes columns i0 .. i1 - 1 of every row, in row order. */
static void embed_backward_cols(void *ctx, size_t i0, size_t i1)
{
	EmbedArgs *a = ctx;
	size_t C = (size_t)a->C;
	for (size_t row = 0; row < (size_t)a->N; row++) {
		const float *g = a->dy + row * C;
		float *dte = a->dwte ? a->dwte + (size_t)a->tokens[row] * C : NULL;
		float *dpe = a->dwpe ? a->dwpe + (row % (size_t)a->T) * C : NULL;
		for (size_t i = i0; i < i1; i++) {
			if (dte)
				dte[i] += g[i];
			if (dpe)
				dpe[i] += g[i];
		}
	}
}

void ops_embed_backward(float *dwte, float *dwpe, const float *dy, const int *tokens, int B, int T,
			int C)
{
	EmbedArgs a = {.dwte = dwte, .dwpe = dwpe, .dy = dy, .tokens = tokens, .N = B * T, .T = T,
		       .C = C};
	par_cpu_for((size_t)C, rows_grain(B * T), embed_backward_cols, &a);
}

/* ---- loss ---- */

typedef struct CeArgs {
	float *probs;
	const float *logits;
	const int *targets;
	/* with targets: each row's -log softmax into row_loss (N), summed in row order after the
	 * split; without row_loss (no memory for it) added to loss as it goes, on one thread */
	double *row_loss, loss;
	int V;
	float s; /* backward: dloss / N */
} CeArgs;

static void crossentropy_forward_rows(void *ctx, size_t r0, size_t r1)
{
	CeArgs *a = ctx;
	int V = a->V;
	for (size_t i = r0; i < r1; i++) {
		const float *l = a->logits + i * V;
		float *p = a->probs + i * V;
		float mx = -INFINITY;
		for (int j = 0; j < V; j++)
			if (l[j] > mx)
				mx = l[j];
		/* -log softmax = log(sum) - (l[target] - max): the logit is read before probs may
		 * overwrite it, and this form keeps the digits that -log(probs[target]) loses near 1 */
		double lt = a->targets ? (double)l[a->targets[i]] - mx : 0.0;
		double sum = 0.0;
		for (int j = 0; j < V; j++) {
			float e = expf(l[j] - mx); /* float exp, double sum: the sum is where digits go */
			sum += e;
			p[j] = e;
		}
		if (a->targets && a->row_loss)
			a->row_loss[i] = log(sum) - lt;
		else if (a->targets)
			a->loss += log(sum) - lt;
		for (int j = 0; j < V; j++)
			p[j] = (float)(p[j] / sum);
	}
}

float ops_crossentropy_forward(float *probs, const float *logits, const int *targets, int N, int V)
{
	CeArgs a = {.probs = probs, .logits = logits, .targets = targets, .V = V};
	if (targets && !(a.row_loss = malloc((size_t)N * sizeof(double)))) {
		crossentropy_forward_rows(&a, 0, (size_t)N);
		return (float)(a.loss / N);
	}
	par_cpu_for((size_t)N, rows_grain(V), crossentropy_forward_rows, &a);
	if (!targets)
		return 0.0f;
	for (int i = 0; i < N; i++)
		a.loss += a.row_loss[i];
	free(a.row_loss);
	return (float)(a.loss / N);
}

static void crossentropy_backward_rows(void *ctx, size_t r0, size_t r1)
{
	CeArgs *a = ctx;
	int V = a->V;
	for (size_t i = r0; i < r1; i++) {
		const float *p = a->logits + i * V; /* the probabilities */
		float *d = a->probs + i * V;        /* dlogits */
		for (int j = 0; j < V; j++)
			d[j] = a->s * (p[j] - (j == a->targets[i] ? 1.0f : 0.0f));
	}
}

void ops_crossentropy_backward(float *dlogits, const float *probs, const int *targets, int N, int V,
			       float dloss)
{
	CeArgs a = {.probs = dlogits, .logits = probs, .targets = targets, .V = V,
		    .s = dloss / (float)N};
	par_cpu_for((size_t)N, rows_grain(V), crossentropy_backward_rows, &a);
}

/* ---- optimizers ---- */

typedef struct OptArgs {
	float *param, *m, *v;
	const float *grad;
	float b1, b2, one_b1, one_b2, step_size, rsqrt_bc2, eps, decay; /* AdamW */
	float lr, momentum, weight_decay;                              /* SGD */
	float grad_scale;
} OptArgs;

static void adamw_range(void *ctx, size_t i0, size_t i1)
{
	const OptArgs *a = ctx;
	float *param = a->param, *m = a->m, *v = a->v;
	const float *grad = a->grad;
	for (size_t i = i0; i < i1; i++) {
		float g = grad[i] * a->grad_scale;
		m[i] = a->b1 * m[i] + a->one_b1 * g;
		v[i] = a->b2 * v[i] + a->one_b2 * g * g;
		/* m_hat / (sqrt(v_hat) + eps) = (m / bc1) / (sqrt(v) / sqrt(bc2) + eps) */
		param[i] -= a->step_size * m[i] / (sqrtf(v[i]) * a->rsqrt_bc2 + a->eps) +
			    a->decay * param[i];
	}
}

/* per-step constants in double, rounded once: 1 - beta2^step is tiny for early steps with beta2
 * near 1, and folding 1/bias_correction into the step size is PyTorch's own form */
static OptArgs adamw_args(float *param, float *m, float *v, const float *grad, const OpsAdamw *h,
			  long step, float grad_scale)
{
	OptArgs a = {.param = param, .m = m, .v = v, .grad = grad, .grad_scale = grad_scale};
	a.b1 = (float)h->beta1, a.b2 = (float)h->beta2;
	a.one_b1 = (float)(1.0 - h->beta1), a.one_b2 = (float)(1.0 - h->beta2);
	a.step_size = (float)(h->lr / (1.0 - pow(h->beta1, (double)step)));
	a.rsqrt_bc2 = (float)(1.0 / sqrt(1.0 - pow(h->beta2, (double)step)));
	a.eps = (float)h->eps, a.decay = (float)(h->lr * h->weight_decay);
	return a;
}

void ops_adamw_step(float *param, float *m, float *v, const float *grad, size_t n,
		    const OpsAdamw *h, long step, float grad_scale)
{
	OptArgs a = adamw_args(param, m, v, grad, h, step, grad_scale);
	par_cpu_for(n, PAR_CPU_GRAIN_ELEMS, adamw_range, &a);
}

typedef struct ForeachArgs {
	OptArgs o;
	float *denom;
} ForeachArgs;

/* _multi_tensor_adam's first passes: the moments, then exp_avg_sq_sqrt divided and shifted */
static void foreach_moments_range(void *ctx, size_t i0, size_t i1)
{
	const ForeachArgs *f = ctx;
	const OptArgs *a = &f->o;
	for (size_t i = i0; i < i1; i++) {
		float g = a->grad[i] * a->grad_scale;
		a->m[i] = a->b1 * a->m[i] + a->one_b1 * g;
		a->v[i] = a->b2 * a->v[i] + a->one_b2 * g * g;
		f->denom[i] = sqrtf(a->v[i]) * a->rsqrt_bc2 + a->eps;
	}
}

/* then the decoupled decay and _foreach_addcdiv_ */
static void foreach_update_range(void *ctx, size_t i0, size_t i1)
{
	const ForeachArgs *f = ctx;
	const OptArgs *a = &f->o;
	for (size_t i = i0; i < i1; i++) {
		a->param[i] -= a->decay * a->param[i];
		a->param[i] -= a->step_size * a->m[i] / f->denom[i];
	}
}

void ops_adamw_foreach_step(float *param, float *m, float *v, const float *grad, size_t n,
			    const OpsAdamw *h, long step, float grad_scale, float *denom)
{
	ForeachArgs f = {adamw_args(param, m, v, grad, h, step, grad_scale), denom};
	par_cpu_for(n, PAR_CPU_GRAIN_ELEMS, foreach_moments_range, &f);
	par_cpu_for(n, PAR_CPU_GRAIN_ELEMS, foreach_update_range, &f);
}

typedef struct OnebitArgs {
	OptArgs o;
	OpsOnebitMoments moments;
} OnebitArgs;

static void onebit_adam_range(void *ctx, size_t i0, size_t i1)
{
	const OnebitArgs *a = ctx;
	float *param = a->o.param, *m = a->o.m, *v = a->o.v;
	for (size_t i = i0; i < i1; i++) {
		if (a->moments != OPS_ONEBIT_NONE) {
			float g = a->o.grad[i] * a->o.grad_scale;
			m[i] = a->o.b1 * m[i] + a->o.one_b1 * g;
			if (a->moments == OPS_ONEBIT_BOTH)
				v[i] = a->o.b2 * v[i] + a->o.one_b2 * g * g;
		}
		param[i] -= a->o.step_size * m[i] / (sqrtf(v[i]) + a->o.eps) + a->o.decay * param[i];
	}
}

void ops_onebit_adam_step(float *param, float *m, float *v, const float *grad, size_t n,
			  const OpsAdamw *h, OpsOnebitMoments moments, float grad_scale)
{
	OnebitArgs a = {{.param = param, .m = m, .v = v, .grad = grad, .grad_scale = grad_scale},
			moments};
	a.o.b1 = (float)h->beta1, a.o.b2 = (float)h->beta2;
	a.o.one_b1 = (float)(1.0 - h->beta1), a.o.one_b2 = (float)(1.0 - h->beta2);
	a.o.step_size = (float)h->lr, a.o.eps = (float)h->eps;
	a.o.decay = (float)(h->lr * h->weight_decay);
	par_cpu_for(n, PAR_CPU_GRAIN_ELEMS, onebit_adam_range, &a);
}

static void momentum_range(void *ctx, size_t i0, size_t i1)
{
	const OptArgs *a = ctx;
	for (size_t i = i0; i < i1; i++)
		a->m[i] = a->b1 * a->m[i] + a->one_b1 * (a->grad[i] * a->grad_scale);
}

void ops_momentum_update(float *m, const float *grad, size_t n, double beta1, float grad_scale)
{
	OptArgs a = {.m = m, .grad = grad, .grad_scale = grad_scale, .b1 = (float)beta1,
		     .one_b1 = (float)(1.0 - beta1)};
	par_cpu_for(n, PAR_CPU_GRAIN_ELEMS, momentum_range, &a);
}

typedef struct ZeroOneArgs {
	OptArgs o;
	float *u;
	OpsZeroOnePhase phase;
	float lrs;
} ZeroOneArgs;

static void zero_one_range(void *ctx, size_t i0, size_t i1)
{
	const ZeroOneArgs *a = ctx;
	float *p = a->o.param, *m = a->o.m, *u = a->u;
	const float *v = a->o.v;
	for (size_t i = i0; i < i1; i++) {
		float den = sqrtf(v[i]) + a->o.eps;
		switch (a->phase) {
		case OPS_ZO_LOCAL: {
			m[i] = a->o.b1 * m[i] + a->o.one_b1 * (a->o.grad[i] * a->o.grad_scale);
			float d = a->o.step_size * (m[i] / den + a->o.weight_decay * p[i]);
			p[i] -= d;
			u[i] -= d;
			break;
		}
		case OPS_ZO_SYNC_BEGIN:
			p[i] -= u[i];
			u[i] *= den;
			break;
		case OPS_ZO_SYNC_END:
			m[i] = -(u[i] / a->lrs);
			p[i] += u[i] / den;
			u[i] = 0.0f;
			break;
		}
	}
}

void ops_zero_one_step(float *param, float *m, const float *v, float *u, const float *grad,
		       size_t n, const OpsAdamw *h, OpsZeroOnePhase phase, float grad_scale,
		       double lrs)
{
	ZeroOneArgs a = {{.param = param, .m = m, .v = (float *)v, .grad = grad,
			  .grad_scale = grad_scale},
			 u, phase, (float)lrs};
	a.o.b1 = (float)h->beta1, a.o.one_b1 = (float)(1.0 - h->beta1);
	a.o.step_size = (float)h->lr, a.o.eps = (float)h->eps;
	a.o.weight_decay = (float)h->weight_decay;
	par_cpu_for(n, PAR_CPU_GRAIN_ELEMS, zero_one_range, &a);
}

static void sgd_range(void *ctx, size_t i0, size_t i1)
{
	const OptArgs *a = ctx;
	float *param = a->param, *buf = a->m;
	for (size_t i = i0; i < i1; i++) {
		float g = a->grad[i] * a->grad_scale + a->weight_decay * param[i];
		if (buf && a->momentum != 0.0f) {
			buf[i] = a->momentum * buf[i] + g;
			g = buf[i];
		}
		param[i] -= a->lr * g;
	}
}

void ops_sgd_step(float *param, float *buf, const float *grad, size_t n, float lr, float momentum,
		  float weight_decay, float grad_scale)
{
	OptArgs a = {.param = param, .m = buf, .grad = grad, .lr = lr, .momentum = momentum,
		     .weight_decay = weight_decay, .grad_scale = grad_scale};
	par_cpu_for(n, PAR_CPU_GRAIN_ELEMS, sgd_range, &a);
}

/* ---- gradient norm ---- */

double ops_sum_squares(const float *x, size_t n)
{
	double s = 0.0;
	for (size_t i = 0; i < n; i++)
		s += (double)x[i] * x[i];
	return s;
}

float ops_clip_coef(double norm, float max_norm)
{
	if (max_norm <= 0.0f)
		return 1.0f;
	double c = max_norm / (norm + 1e-6);
	return c < 1.0 ? (float)c : 1.0f;
}

#include "ops_cpu.h"

#include <cblas.h>
#include <math.h>
#include <string.h>

/* ---- linear layers ---- */

void ops_matmul_forward(float *y, const float *x, const float *w, const float *b, int N, int C_in,
			int C_out)
{
	/* the bias goes in first so that one GEMM with beta = 1 adds the product onto it */
	float beta = 0.0f;
	if (b) {
		for (int i = 0; i < N; i++)
			memcpy(y + (size_t)i * C_out, b, (size_t)C_out * sizeof(float));
		beta = 1.0f;
	}
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C_out, C_in, 1.0f, x, C_in, w,
		    C_out, beta, y, C_out);
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
		for (int i = 0; i < N; i++) {
			const float *row = dy + (size_t)i * C_out;
			for (int j = 0; j < C_out; j++)
				db[j] += row[j];
		}
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

void ops_layernorm_forward(float *y, float *mean, float *rstd, const float *x, const float *w,
			   const float *b, int N, int C)
{
	for (int i = 0; i < N; i++) {
		const float *xr = x + (size_t)i * C;
		float *yr = y + (size_t)i * C;
		float m, r;
		layernorm_stats(xr, C, &m, &r);
		for (int j = 0; j < C; j++)
			yr[j] = (xr[j] - m) * r * w[j] + b[j];
		if (mean)
			mean[i] = m;
		if (rstd)
			rstd[i] = r;
	}
}

/* With xhat = (x - mean) rstd and g = dy * w, the gradient through the normalisation is
 * dx = rstd (g - mean(g) - xhat mean(g xhat)): the two means remove the components along the
 * directions that normalising takes out (a shift of x and a scaling of x - mean). */
void ops_layernorm_backward(float *dx, float *dw, float *db, const float *dy, const float *x,
			    const float *w, int N, int C)
{
	for (int i = 0; i < N; i++) {
		const float *xr = x + (size_t)i * C, *dyr = dy + (size_t)i * C;
		float m, r;
		layernorm_stats(xr, C, &m, &r);
		double g_sum = 0.0, gx_sum = 0.0;
		for (int j = 0; j < C; j++) {
			float xhat = (xr[j] - m) * r;
			float g = dyr[j] * w[j];
			g_sum += g;
			gx_sum += g * xhat;
			if (dw)
				dw[j] += dyr[j] * xhat;
			if (db)
				db[j] += dyr[j];
		}
		if (!dx)
			continue;
		float g_mean = (float)(g_sum / C), gx_mean = (float)(gx_sum / C);
		float *dxr = dx + (size_t)i * C;
		for (int j = 0; j < C; j++) {
			float xhat = (xr[j] - m) * r;
			dxr[j] += r * (dyr[j] * w[j] - g_mean - xhat * gx_mean);
		}
	}
}

#define GELU_K 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_A 0.044715f

void ops_gelu_forward(float *y, const float *x, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		float v = x[i];
		y[i] = 0.5f * v * (1.0f + tanhf(GELU_K * (v + GELU_A * v * v * v)));
	}
}

void ops_gelu_backward(float *dx, const float *dy, const float *x, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		float v = x[i];
		float th = tanhf(GELU_K * (v + GELU_A * v * v * v));
		float du = GELU_K * (1.0f + 3.0f * GELU_A * v * v); /* d(inner)/dx */
		float grad = 0.5f * (1.0f + th) + 0.5f * v * (1.0f - th * th) * du;
		dx[i] += dy[i] * grad;
	}
}

/* ---- attention ---- */

void ops_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int NH)
{
	int hs = C / NH;
	float scale = 1.0f / sqrtf((float)hs);
	size_t row3 = (size_t)3 * C; /* stride of one token in qkv */
	for (int b = 0; b < B; b++)
		for (int h = 0; h < NH; h++)
			for (int t = 0; t < T; t++) {
				const float *base = qkv + (size_t)b * T * row3;
				const float *q = base + t * row3 + (size_t)h * hs;
				float *p = att + (((size_t)b * NH + h) * T + t) * T;
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
				float *o = out + ((size_t)b * T + t) * C + (size_t)h * hs;
				memset(o, 0, (size_t)hs * sizeof(float));
				for (int t2 = 0; t2 <= t; t2++) {
					const float *v = base + t2 * row3 + 2 * (size_t)C + (size_t)h * hs;
					for (int i = 0; i < hs; i++)
						o[i] += p[t2] * v[i];
				}
			}
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
void ops_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *att,
			    int B, int T, int C, int NH)
{
	int hs = C / NH;
	float scale = 1.0f / sqrtf((float)hs);
	size_t row3 = (size_t)3 * C;
	for (int b = 0; b < B; b++)
		for (int h = 0; h < NH; h++)
			for (int t = 0; t < T; t++) {
				const float *base = qkv + (size_t)b * T * row3;
				float *dbase = dqkv + (size_t)b * T * row3;
				size_t hoff = (size_t)h * hs;
				const float *q = base + t * row3 + hoff;
				float *dq = dbase + t * row3 + hoff;
				const float *p = att + (((size_t)b * NH + h) * T + t) * T;
				const float *g = dout + ((size_t)b * T + t) * C + hoff;
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

/* ---- residual and embedding ---- */

void ops_residual_forward(float *y, const float *a, const float *b, size_t n)
{
	for (size_t i = 0; i < n; i++)
		y[i] = a[i] + b[i];
}

void ops_residual_backward(float *da, float *db, const float *dy, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		da[i] += dy[i];
		db[i] += dy[i];
	}
}

void ops_embed_forward(float *y, const int *tokens, const float *wte, const float *wpe, int B,
		       int T, int C)
{
	for (int b = 0; b < B; b++)
		for (int t = 0; t < T; t++) {
			size_t row = (size_t)b * T + t;
			const float *te = wte + (size_t)tokens[row] * C;
			const float *pe = wpe + (size_t)t * C;
			float *yr = y + row * C;
			for (int i = 0; i < C; i++)
				yr[i] = te[i] + pe[i];
		}
}

void ops_embed_backward(float *dwte, float *dwpe, const float *dy, const int *tokens, int B, int T,
			int C)
{
	for (int b = 0; b < B; b++)
		for (int t = 0; t < T; t++) {
			size_t row = (size_t)b * T + t;
			const float *g = dy + row * C;
			float *dte = dwte ? dwte + (size_t)tokens[row] * C : NULL;
			float *dpe = dwpe ? dwpe + (size_t)t * C : NULL;
			for (int i = 0; i < C; i++) {
				if (dte)
					dte[i] += g[i];
				if (dpe)
					dpe[i] += g[i];
			}
		}
}

/* ---- loss ---- */

float ops_crossentropy_forward(float *probs, const float *logits, const int *targets, int N, int V)
{
	double loss = 0.0;
	for (int i = 0; i < N; i++) {
		const float *l = logits + (size_t)i * V;
		float *p = probs + (size_t)i * V;
		float mx = -INFINITY;
		for (int j = 0; j < V; j++)
			if (l[j] > mx)
				mx = l[j];
		/* -log softmax = log(sum) - (l[target] - max): the logit is read before probs may
		 * overwrite it, and this form keeps the digits that -log(probs[target]) loses near 1 */
		double lt = targets ? (double)l[targets[i]] - mx : 0.0;
		double sum = 0.0;
		for (int j = 0; j < V; j++) {
			float e = expf(l[j] - mx); /* float exp, double sum: the sum is where digits go */
			sum += e;
			p[j] = e;
		}
		loss += log(sum) - lt;
		for (int j = 0; j < V; j++)
			p[j] = (float)(p[j] / sum);
	}
	return targets ? (float)(loss / N) : 0.0f;
}

void ops_crossentropy_backward(float *dlogits, const float *probs, const int *targets, int N, int V,
			       float dloss)
{
	float s = dloss / (float)N;
	for (int i = 0; i < N; i++) {
		const float *p = probs + (size_t)i * V;
		float *d = dlogits + (size_t)i * V;
		for (int j = 0; j < V; j++)
			d[j] = s * (p[j] - (j == targets[i] ? 1.0f : 0.0f));
	}
}

/* ---- optimizers ---- */

void ops_adamw_step(float *param, float *m, float *v, const float *grad, size_t n,
		    const OpsAdamw *h, long step, float grad_scale)
{
	/* per-step constants in double, rounded once: 1 - beta2^step is tiny for early steps with
	 * beta2 near 1, and folding 1/bias_correction into the step size is PyTorch's own form */
	float b1 = (float)h->beta1, b2 = (float)h->beta2;
	float one_b1 = (float)(1.0 - h->beta1), one_b2 = (float)(1.0 - h->beta2);
	float step_size = (float)(h->lr / (1.0 - pow(h->beta1, (double)step)));
	float rsqrt_bc2 = (float)(1.0 / sqrt(1.0 - pow(h->beta2, (double)step)));
	float eps = (float)h->eps, decay = (float)(h->lr * h->weight_decay);
	for (size_t i = 0; i < n; i++) {
		float g = grad[i] * grad_scale;
		m[i] = b1 * m[i] + one_b1 * g;
		v[i] = b2 * v[i] + one_b2 * g * g;
		/* m_hat / (sqrt(v_hat) + eps) = (m / bc1) / (sqrt(v) / sqrt(bc2) + eps) */
		param[i] -= step_size * m[i] / (sqrtf(v[i]) * rsqrt_bc2 + eps) + decay * param[i];
	}
}

void ops_sgd_step(float *param, float *buf, const float *grad, size_t n, float lr, float momentum,
		  float weight_decay, float grad_scale)
{
	for (size_t i = 0; i < n; i++) {
		float g = grad[i] * grad_scale + weight_decay * param[i];
		if (buf && momentum != 0.0f) {
			buf[i] = momentum * buf[i] + g;
			g = buf[i];
		}
		param[i] -= lr * g;
	}
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

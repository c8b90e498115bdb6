/* infer_cpu: see infer_cpu.h. Plain loops: the executor's models are small, and each sum runs
 * in one fixed order (over the reduction dimension, first to last), so that a result does not
 * depend on threads. */
#include "infer_cpu.h"

#include <math.h>
#include <string.h>

#define GELU_K 0.7978845608028654f /* sqrt(2 / pi), ops_cpu.c's */
#define GELU_A 0.044715f
#define LN_EPS 1e-5f
/* output columns a linear accumulates at once (fp32, on the stack) */
#define TILE 256

static inline float ld(const void *p, size_t i, PrecisionType t)
{
	switch (t) {
	case PREC_F32: return ((const float *)p)[i];
	case PREC_BF16: return precision_bf16_to_f32(((const uint16_t *)p)[i]);
	default: return precision_f16_to_f32(((const uint16_t *)p)[i]);
	}
}

static inline void st(void *p, size_t i, float x, PrecisionType t)
{
	switch (t) {
	case PREC_F32: ((float *)p)[i] = x; break;
	case PREC_BF16: ((uint16_t *)p)[i] = precision_f32_to_bf16(x); break;
	default: ((uint16_t *)p)[i] = precision_f32_to_f16(x); break;
	}
}

static inline float mat_at(const InferMat *m, size_t i)
{
	if (m->q)
		return (float)m->q[i] * m->scales[i / m->group_elems];
	return ld(m->w, i, m->prec);
}

/* ---- group quantization ---- */

void infer_cpu_quantize(const void *w, PrecisionType prec, size_t n, size_t group_elems,
			int8_t *q, float *scales)
{
	for (size_t g = 0; g * group_elems < n; g++) {
		size_t i0 = g * group_elems, i1 = i0 + group_elems;
		float amax = 0;
		for (size_t i = i0; i < i1; i++)
			amax = fmaxf(amax, fabsf(ld(w, i, prec)));
		float s = amax / 127.0f;
		scales[g] = s;
		for (size_t i = i0; i < i1; i++) {
			float r = s > 0 ? nearbyintf(ld(w, i, prec) / s) : 0;
			q[i] = (int8_t)fmaxf(-127.0f, fminf(127.0f, r));
		}
	}
}

void infer_cpu_dequantize(const int8_t *q, const float *scales, size_t n, size_t group_elems,
			  float *w)
{
	for (size_t i = 0; i < n; i++)
		w[i] = (float)q[i] * scales[i / group_elems];
}

/* ---- the unit's pieces ---- */

void infer_cpu_linear(void *y, const void *x, const InferMat *w, const void *b, PrecisionType act,
		      int N, int K, int Nout)
{
	float acc[TILE];
	for (int n = 0; n < N; n++)
		for (int o0 = 0; o0 < Nout; o0 += TILE) {
			int no = Nout - o0 < TILE ? Nout - o0 : TILE;
			for (int o = 0; o < no; o++)
				acc[o] = b ? ld(b, (size_t)(o0 + o), act) : 0.0f;
			for (int k = 0; k < K; k++) {
				float xv = ld(x, (size_t)n * K + k, act);
				size_t row = (size_t)k * Nout + o0;
				if (!w->q && w->prec == PREC_F32) { /* the common case, no conversion */
					const float *wr = (const float *)w->w + row;
					for (int o = 0; o < no; o++)
						acc[o] += xv * wr[o];
				} else {
					for (int o = 0; o < no; o++)
						acc[o] += xv * mat_at(w, row + (size_t)o);
				}
			}
			for (int o = 0; o < no; o++)
				st(y, (size_t)n * Nout + o0 + o, acc[o], act);
		}
}

void infer_cpu_layernorm(void *y, const void *x, const void *w, const void *b, PrecisionType act,
			 int N, int C)
{
	for (int n = 0; n < N; n++) {
		size_t r = (size_t)n * C;
		float m = 0, v = 0;
		for (int i = 0; i < C; i++)
			m += ld(x, r + i, act);
		m /= (float)C;
		for (int i = 0; i < C; i++) {
			float d = ld(x, r + i, act) - m;
			v += d * d;
		}
		v /= (float)C;
		float s = 1.0f / sqrtf(v + LN_EPS);
		for (int i = 0; i < C; i++) /* in place: element i is read before it is written */
			st(y, r + i, (ld(x, r + i, act) - m) * s * ld(w, (size_t)i, act) +
			   ld(b, (size_t)i, act), act);
	}
}

void infer_cpu_gelu(void *x, PrecisionType act, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		float v = ld(x, i, act);
		st(x, i, 0.5f * v * (1.0f + tanhf(GELU_K * (v + GELU_A * v * v * v))), act);
	}
}

void infer_cpu_residual(void *y, const void *a, const void *b, PrecisionType act, size_t n,
			int width)
{
	for (size_t i = 0; i < n; i++) {
		float add = ld(a, i, act);
		if (b) /* the bias rounds with the branch, as a layer's output would */
			add = precision_round(add + ld(b, i % (size_t)width, act), act);
		st(y, i, ld(y, i, act) + add, act);
	}
}

void infer_cpu_embed(void *x, const int *tokens, const void *wte, const void *wpe,
		     PrecisionType act, int B, int Tn, int pos0, int C, int vlo, int Vr)
{
	for (int bt = 0; bt < B * Tn; bt++) {
		int tok = tokens[bt] - vlo, pos = pos0 + bt % Tn;
		int mine = tok >= 0 && tok < Vr;
		for (int i = 0; i < C; i++) {
			float v = mine ? ld(wte, (size_t)tok * C + i, act) : 0.0f;
			if (wpe)
				v += ld(wpe, (size_t)pos * C + i, act);
			st(x, (size_t)bt * C + i, v, act);
		}
	}
}

void infer_cpu_logits(float *logits, const void *x, size_t row_stride, const void *wte,
		      PrecisionType act, int B, int C, int Vr)
{
	for (int b = 0; b < B; b++)
		for (int v = 0; v < Vr; v++) {
			float s = 0;
			for (int i = 0; i < C; i++)
				s += ld(x, (size_t)b * row_stride + i, act) *
				     ld(wte, (size_t)v * C + i, act);
			logits[(size_t)b * Vr + v] = s;
		}
}

/* ---- the KV cache ---- */

size_t infer_kv_seg_bytes(int B, int NHr, int hs, PrecisionType prec, int cap)
{
	return 2 * (size_t)B * NHr * (size_t)cap * hs * precision_bytes(prec);
}

/* Element i of the key (which 0) or value (1) of sequence b, head h, position p. */
static size_t kv_index(const InferKv *kv, int s, int which, int b, int h, int p)
{
	size_t one = (size_t)kv->B * kv->NHr * (size_t)kv->cap[s] * kv->hs;
	return which * one + (((size_t)b * kv->NHr + h) * kv->cap[s] + p) * kv->hs;
}

/* The segment holding position p, and p within it. */
static int kv_seg(const InferKv *kv, int *p)
{
	if (*p < kv->cap[0])
		return 0;
	*p -= kv->cap[0];
	return 1;
}

void infer_cpu_attention(void *out, const void *qkv, InferKv *kv, PrecisionType act, int B,
			 int Tn, int pos0, float *scores, size_t score_stride)
{
	int NHr = kv->NHr, hs = kv->hs, Cr = NHr * hs;
	float scale = 1.0f / sqrtf((float)hs);
	/* the new tokens' keys and values first: a token attends to itself */
	for (int b = 0; b < B; b++)
		for (int t = 0; t < Tn; t++) {
			size_t row = ((size_t)b * Tn + t) * 3 * Cr;
			int p = pos0 + t, s = kv_seg(kv, &p);
			for (int h = 0; h < NHr; h++)
				for (int i = 0; i < hs; i++) {
					float k = ld(qkv, row + Cr + (size_t)h * hs + i, act);
					float v = ld(qkv, row + 2 * (size_t)Cr + (size_t)h * hs + i, act);
					st(kv->seg[s], kv_index(kv, s, 0, b, h, p) + i, k, kv->prec);
					st(kv->seg[s], kv_index(kv, s, 1, b, h, p) + i, v, kv->prec);
				}
		}
	for (int b = 0; b < B; b++)
		for (int h = 0; h < NHr; h++) {
			float *sc = scores + ((size_t)b * NHr + h) * score_stride;
			for (int t = 0; t < Tn; t++) {
				size_t row = ((size_t)b * Tn + t) * 3 * Cr + (size_t)h * hs;
				int n = pos0 + t + 1;
				float mx = -INFINITY, sum = 0;
				for (int j = 0; j < n; j++) {
					int p = j, s = kv_seg(kv, &p);
					size_t k0 = kv_index(kv, s, 0, b, h, p);
					float d = 0;
					for (int i = 0; i < hs; i++)
						d += ld(qkv, row + i, act) * ld(kv->seg[s], k0 + i, kv->prec);
					sc[j] = d * scale;
					mx = fmaxf(mx, sc[j]);
				}
				for (int j = 0; j < n; j++) {
					sc[j] = expf(sc[j] - mx);
					sum += sc[j];
				}
				size_t o = ((size_t)b * Tn + t) * Cr + (size_t)h * hs;
				for (int i = 0; i < hs; i++) {
					float a = 0;
					for (int j = 0; j < n; j++) {
						int p = j, s = kv_seg(kv, &p);
						a += sc[j] * ld(kv->seg[s], kv_index(kv, s, 1, b, h, p) + i,
								kv->prec);
					}
					st(out, o + i, a / sum, act);
				}
			}
		}
}

int infer_cpu_argmax(const float *x, int n)
{
	int best = 0;
	for (int i = 1; i < n; i++)
		if (x[i] > x[best])
			best = i;
	return best;
}

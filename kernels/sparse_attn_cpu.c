#include "sparse_attn_cpu.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

/* The keys query i attends to, block by block: the kept blocks c of its block row, keys j of c up
 * to i under a causal mask. Only these are ever visited. */
#define FOR_KEPT(row, nb, bs, i, causal, j)                                                \
	for (int c_ = 0; c_ < (nb); c_++)                                                  \
		if ((row)[c_])                                                             \
			for (int j = c_ * (bs); j < (c_ + 1) * (bs) && (!(causal) || j <= (i)); j++)

static float dot(const float *a, const float *b, int n)
{
	float s = 0;
	for (int x = 0; x < n; x++)
		s += a[x] * b[x];
	return s;
}

/* one (batch, head): q..out point at its (T, hs) slices, lay at its nb x nb layout */
static void forward_head(float *out, float *lse, const float *q, const float *k, const float *v,
			 const unsigned char *lay, int T, int hs, int bs, int causal)
{
	int nb = T / bs;
	float scale = 1.0f / sqrtf((float)hs);
	for (int i = 0; i < T; i++) {
		const unsigned char *row = lay + (size_t)(i / bs) * nb;
		float *o = out + (size_t)i * hs, m = -INFINITY, sum = 0;
		FOR_KEPT(row, nb, bs, i, causal, j) { /* the row's largest kept score */
			float s = scale * dot(q + (size_t)i * hs, k + (size_t)j * hs, hs);
			m = s > m ? s : m;
		}
		memset(o, 0, (size_t)hs * sizeof(*o));
		if (m == -INFINITY) {
			lse[i] = -INFINITY;
			continue;
		}
		FOR_KEPT(row, nb, bs, i, causal, j) {
			float p = expf(scale * dot(q + (size_t)i * hs, k + (size_t)j * hs, hs) - m);
			sum += p;
			for (int x = 0; x < hs; x++)
				o[x] += p * v[(size_t)j * hs + x];
		}
		for (int x = 0; x < hs; x++)
			o[x] /= sum;
		lse[i] = m + logf(sum);
	}
}

void sparse_attn_forward(float *out, float *lse, const float *q, const float *k, const float *v,
			 const unsigned char *layout, int B, int NH, int T, int hs, int bs,
			 int causal)
{
	size_t th = (size_t)T * hs, nb = (size_t)(T / bs);
	for (int b = 0; b < B; b++)
		for (int h = 0; h < NH; h++) {
			size_t bh = (size_t)b * NH + h;
			forward_head(out + bh * th, lse + bh * T, q + bh * th, k + bh * th, v + bh * th,
				     layout + (size_t)h * nb * nb, T, hs, bs, causal);
		}
}

/* p_ij = exp(s_ij - lse_i); dv_j += p_ij dout_i; ds_ij = p_ij (dout_i . v_j - dout_i . out_i);
 * dq_i += scale ds_ij k_j; dk_j += scale ds_ij q_i */
static void backward_head(float *dq, float *dk, float *dv, const float *dout, const float *q,
			  const float *k, const float *v, const float *out, const float *lse,
			  const unsigned char *lay, int T, int hs, int bs, int causal)
{
	int nb = T / bs;
	float scale = 1.0f / sqrtf((float)hs);
	for (int i = 0; i < T; i++) {
		if (lse[i] == -INFINITY)
			continue;
		const unsigned char *row = lay + (size_t)(i / bs) * nb;
		const float *qi = q + (size_t)i * hs, *gi = dout + (size_t)i * hs;
		float d = dot(gi, out + (size_t)i * hs, hs);
		FOR_KEPT(row, nb, bs, i, causal, j) {
			const float *kj = k + (size_t)j * hs;
			float p = expf(scale * dot(qi, kj, hs) - lse[i]);
			float ds = p * (dot(gi, v + (size_t)j * hs, hs) - d);
			for (int x = 0; x < hs; x++) {
				dv[(size_t)j * hs + x] += p * gi[x];
				dq[(size_t)i * hs + x] += scale * ds * kj[x];
				dk[(size_t)j * hs + x] += scale * ds * qi[x];
			}
		}
	}
}

void sparse_attn_backward(float *dq, float *dk, float *dv, const float *dout, const float *q,
			  const float *k, const float *v, const float *out, const float *lse,
			  const unsigned char *layout, int B, int NH, int T, int hs, int bs,
			  int causal)
{
	size_t th = (size_t)T * hs, nb = (size_t)(T / bs);
	for (int b = 0; b < B; b++)
		for (int h = 0; h < NH; h++) {
			size_t bh = (size_t)b * NH + h, o = bh * th;
			backward_head(dq + o, dk + o, dv + o, dout + o, q + o, k + o, v + o, out + o,
				      lse + bh * T, layout + (size_t)h * nb * nb, T, hs, bs, causal);
		}
}

#include "lamb_cpu.h"

#include <math.h>
#include <string.h>

double lamb_cpu_warmup(float *w, float *m, float *v, float *v_fresh, const float *grad, size_t n,
		       const LambHyper *h, float grad_scale, int fresh, double *coeff_freeze)
{
	float b1 = (float)h->beta1, b2 = (float)h->beta2, eps = (float)h->eps;
	float wd = (float)h->weight_decay;
	double wsq = 0, usq = 0;
	for (size_t i = 0; i < n; i++) {
		float g = grad[i] * grad_scale;
		m[i] = b1 * m[i] + (1.0f - b1) * g;
		v[i] = b2 * v[i] + (1.0f - b2) * g * g;
		float u = m[i] / (sqrtf(v[i]) + eps) + wd * w[i];
		wsq += (double)w[i] * w[i];
		usq += (double)u * u;
	}
	if (fresh)
		memcpy(v_fresh, v, n * sizeof(float));
	double coeff = 1.0;
	if (wsq != 0 && usq != 0) {
		coeff = sqrt(wsq) / sqrt(usq);
		coeff = coeff > h->max_coeff ? h->max_coeff : coeff < h->min_coeff ? h->min_coeff : coeff;
	}
	if (coeff != 1.0)
		*coeff_freeze = h->coeff_beta * *coeff_freeze + (1.0 - h->coeff_beta) * coeff;
	float step = (float)(h->lr * coeff);
	for (size_t i = 0; i < n; i++)
		w[i] -= step * (m[i] / (sqrtf(v[i]) + eps) + wd * w[i]);
	return coeff;
}

void lamb_cpu_momentum(float *m, const float *grad, size_t n, double beta1, float grad_scale,
		       float scaling)
{
	float b1 = (float)beta1;
	for (size_t i = 0; i < n; i++)
		m[i] = (b1 * m[i] + (1.0f - b1) * (grad[i] * grad_scale)) * scaling;
}

double lamb_cpu_compressed(float *w, float *m, const float *m_last, const float *v,
			   float *v_fresh, size_t n, const LambHyper *h, float scaling,
			   double coeff_freeze, double *last_factor)
{
	float b1 = (float)h->beta1, b2 = (float)h->beta2, eps = (float)h->eps;
	float wd = (float)h->weight_decay;
	double psq = 0, usq = 0, factor = 0;
	for (size_t i = 0; i < n; i++) {
		m[i] /= scaling;
		float r = (m[i] - m_last[i] * b1) / (1.0f - b1);
		v_fresh[i] = b2 * v_fresh[i] + (1.0f - b2) * r * r;
		float denom = sqrtf(v[i]) + eps, prelim = m[i] / denom, u = prelim + wd * w[i];
		float ratio = denom / (sqrtf(v_fresh[i]) + eps);
		psq += (double)prelim * prelim;
		usq += (double)u * u;
		if (i == 0 || ratio > factor)
			factor = ratio;
	}
	if (wd > 0 && usq > 0) {
		double share = sqrt(psq) / sqrt(usq);
		share = share < 1.0 ? share : 1.0;
		factor = factor * share + (1.0 - share);
	}
	factor = factor > h->factor_max ? h->factor_max : factor;
	factor = factor < h->factor_min ? h->factor_min : factor;
	double hi = *last_factor * (1.0 + h->factor_threshold);
	double lo = *last_factor * (1.0 - h->factor_threshold);
	factor = factor > hi ? hi : factor < lo ? lo : factor;
	*last_factor = factor;
	double coeff = coeff_freeze * factor;
	float step = (float)(h->lr * coeff);
	for (size_t i = 0; i < n; i++)
		w[i] -= step * (m[i] / (sqrtf(v[i]) + eps) + wd * w[i]);
	return coeff;
}

/* lamb_cpu: DeepSpeed's 1-bit LAMB update of one parameter tensor (OnebitLamb,
 * deepspeed/runtime/fp16/onebit/lamb.py), in fp32 on host arrays. The executor calls it tensor by
 * tensor (the coefficients are per tensor) and runs the compressed all-reduce of the fused
 * momenta between lamb_cpu_momentum and lamb_cpu_compressed. No bias correction, as lamb.py. */
#ifndef PX_LAMB_CPU_H
#define PX_LAMB_CPU_H

#include <stddef.h>

typedef struct LambHyper {
	double lr, beta1, beta2, eps, weight_decay;
	double max_coeff, min_coeff, coeff_beta;           /* the LAMB coefficient */
	double factor_max, factor_min, factor_threshold;   /* the compressed stage's factor */
} LambHyper;

/* A warm-up step: m = b1 m + (1 - b1) g, v = b2 v + (1 - b2) g^2 (g = grad * grad_scale), v copied
 * into v_fresh when fresh (the step that reaches freeze_step); update = m / (sqrt(v) + eps) +
 * weight_decay w; the LAMB coefficient ||w|| / ||update|| clamped to [min_coeff, max_coeff] (1
 * when either norm is 0); when it is not 1, coeff_freeze = coeff_beta coeff_freeze + (1 -
 * coeff_beta) coeff; w -= lr coeff update. Returns the coefficient. */
double lamb_cpu_warmup(float *w, float *m, float *v, float *v_fresh, const float *grad, size_t n,
		       const LambHyper *h, float grad_scale, int fresh, double *coeff_freeze);

/* A compressed step before the exchange: m = (b1 m + (1 - b1) grad grad_scale) scaling. */
void lamb_cpu_momentum(float *m, const float *grad, size_t n, double beta1, float grad_scale,
		       float scaling);

/* A compressed step after the exchange averaged m (m_last: the momentum before this step):
 * m /= scaling; the gradient rebuilt, r = (m - b1 m_last) / (1 - b1), updates v_fresh (v stays
 * frozen); update = m / (sqrt(v) + eps) + weight_decay w; factor = max(denom / (sqrt(v_fresh) +
 * eps)), with weight decay blended by min(1, ||m / denom|| / ||update||), clamped to
 * [factor_min, factor_max] and to last_factor (1 +- factor_threshold); last_factor = factor;
 * w -= lr coeff_freeze factor update. Returns the coefficient coeff_freeze x factor. */
double lamb_cpu_compressed(float *w, float *m, const float *m_last, const float *v,
			   float *v_fresh, size_t n, const LambHyper *h, float scaling,
			   double coeff_freeze, double *last_factor);

#endif

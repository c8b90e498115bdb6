/* ops_cpu: forward and backward of each operation of a GPT-2 decoder in plain C with fp32 compute
 * (matrix products through CBLAS), the optimizer updates and the gradient-norm helpers. It is the
 * reference the CUDA kernels are tested against. It knows shapes, not models: how the ops compose
 * into layer units is gpt_cpu's, which tensors live in 16-bit is precision's and the executor's.
 *
 * Dimension names, here and in gpt_cpu: B = batch, T = sequence, C = channels, V = vocabulary,
 * NH = attention heads, hs = C / NH (head size), N = B * T (rows: one per token).
 *
 * Conventions: every backward ACCUMULATES (+=) into all the gradients it is given, inputs' and
 * parameters' alike, so residual branches and micro-batches add up without copies; callers zero
 * first. The one exception is ops_crossentropy_backward, which starts the chain (see there). */
#ifndef PX_OPS_CPU_H
#define PX_OPS_CPU_H

#include <stddef.h>

/* GPT-2's layer_norm_epsilon */
#define OPS_LAYERNORM_EPS 1e-5f

/* ---- linear layers ---- */

/* y (N, C_out) = x (N, C_in) w (C_in, C_out) + b (C_out); w row-major as GPT-2's Conv1D stores it.
 * b may be NULL (no bias). y does not overlap x. */
void ops_matmul_forward(float *y, const float *x, const float *w, const float *b, int N, int C_in,
			int C_out);
/* dx (N, C_in) += dy w^T; dw (C_in, C_out) += x^T dy; db (C_out) += column sums of dy. Any of
 * dx, dw, db may be NULL to skip it. */
void ops_matmul_backward(float *dx, float *dw, float *db, const float *dy, const float *x,
			 const float *w, int N, int C_in, int C_out);

/* The LM head tied to the token embedding: logits (N, V) = x (N, C) wte^T, wte (V, C). */
void ops_lm_head_forward(float *logits, const float *x, const float *wte, int N, int C, int V);
/* dx (N, C) += dlogits wte; dwte (V, C) += dlogits^T x. */
void ops_lm_head_backward(float *dx, float *dwte, const float *dlogits, const float *x,
			  const float *wte, int N, int C, int V);

/* ---- normalisation and activation ---- */

/* Per row of x (N, C): y = (x - mean) * rstd * w + b, rstd = 1 / sqrt(var + eps), var the biased
 * (1/C) variance as PyTorch's LayerNorm. mean and rstd (N) may be NULL; backward does not need
 * them (it recomputes them from x the same way, so a block keeps 16 bytes a token fewer). y may
 * be x. */
void ops_layernorm_forward(float *y, float *mean, float *rstd, const float *x, const float *w,
			   const float *b, int N, int C);
void ops_layernorm_backward(float *dx, float *dw, float *db, const float *dy, const float *x,
			    const float *w, int N, int C);

/* GELU, tanh approximation (GPT-2's gelu_new):
 * 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), elementwise over n values. y may be x. */
void ops_gelu_forward(float *y, const float *x, size_t n);
/* dx += dy * gelu'(x); dx must not be dy (accumulation would count dy twice). */
void ops_gelu_backward(float *dx, const float *dy, const float *x, size_t n);

/* ---- attention ---- */

/* Causal multi-head self-attention without the output projection. qkv (B, T, 3C) is c_attn's
 * output, per token [q | k | v], head h in columns h*hs .. h*hs+hs-1 of each. Writes
 * out (B, T, C), heads side by side, and att (B, NH, T, T): softmax(q k^T / sqrt(hs)) with the
 * causal mask, zero above the diagonal; att is what backward needs besides qkv. */
void ops_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int NH);
/* dqkv (B, T, 3C) += the gradient of out given dout (B, T, C), from qkv and att. */
void ops_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *att,
			    int B, int T, int C, int NH);

/* ---- residual and embedding ---- */

/* y = a + b over n values; y may be a or b. */
void ops_residual_forward(float *y, const float *a, const float *b, size_t n);
/* da += dy; db += dy. */
void ops_residual_backward(float *da, float *db, const float *dy, size_t n);

/* y (B, T, C) = wte[tokens[b, t]] + wpe[t]; wte (V, C), wpe (max_T, C), T <= max_T and every token
 * in [0, V) (gpt_cpu_check_tokens). */
void ops_embed_forward(float *y, const int *tokens, const float *wte, const float *wpe, int B,
		       int T, int C);
/* Scatter-add dy into the rows it came from: dwte[tokens[b, t]] += dy[b, t]; dwpe[t] += dy[b, t].
 * Either may be NULL. */
void ops_embed_backward(float *dwte, float *dwpe, const float *dy, const int *tokens, int B, int T,
			int C);

/* ---- loss ---- */

/* Softmax over each row of logits (N, V) into probs (which may be logits), and the mean over the N
 * rows of -log softmax(logits)[target], accumulated in double. targets NULL: probabilities only,
 * returns 0. */
float ops_crossentropy_forward(float *probs, const float *logits, const int *targets, int N, int V);
/* dlogits = dloss / N * (probs - onehot(target)). WRITES rather than accumulates: the loss gradient
 * starts the chain, and writing lets dlogits overwrite probs in place, saving an (N, V) buffer.
 * dloss is d(objective)/d(mean loss): 1, or the fp16 loss scale, or 1 / accumulation steps. */
void ops_crossentropy_backward(float *dlogits, const float *probs, const int *targets, int N, int V,
			       float dloss);

/* ---- optimizers ---- */

/* Hyperparameters in double, as the Python floats PyTorch takes: 1 - beta is formed in double and
 * only then rounded, so 1 - 0.999 is 0.001 to float precision, not the 4.7e-5-off 1 - 0.999f. */
typedef struct OpsAdamw {
	double lr;
	double beta1, beta2;
	double eps;          /* added to sqrt(v_hat), outside the square root */
	double weight_decay; /* decoupled: p -= lr * weight_decay * p, not added to the gradient */
} OpsAdamw;

/* One AdamW step over n fp32 master weights with fp32 moments m and v, as torch.optim.AdamW and
 * DeepSpeed's FusedAdam (adam_w_mode): g = grad * grad_scale;
 * m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2; m_hat = m / (1 - b1^step), v_hat likewise;
 * p -= lr * (m_hat / (sqrt(v_hat) + eps) + weight_decay * p). step counts from 1. grad_scale
 * folds the loss-scale unscaling and the clipping coefficient into the one pass. */
void ops_adamw_step(float *param, float *m, float *v, const float *grad, size_t n,
		    const OpsAdamw *h, long step, float grad_scale);

/* The same AdamW step as torch's foreach implementation carries it out (torch/optim/adam.py
 * _multi_tensor_adam): the moments of every element first, then denom = sqrt(v) / sqrt(bc2) +
 * eps into denom (n floats, the copy of the second moment that update holds while it runs), then
 * p = p (1 - lr weight_decay) - (lr / bc1) m / denom. The same values as ops_adamw_step up to
 * rounding order. */
void ops_adamw_foreach_step(float *param, float *m, float *v, const float *grad, size_t n,
			    const OpsAdamw *h, long step, float grad_scale, float *denom);

/* 1-bit Adam's update (DeepSpeed's OnebitAdam, runtime/fp16/onebit/adam.py): AdamW's without
 * bias correction, p -= lr (m / (sqrt(v) + eps) + weight_decay p), after its moments are updated
 * from g = grad * grad_scale as `moments` says: OPS_ONEBIT_BOTH m and v (the warm-up),
 * OPS_ONEBIT_MOMENTUM m alone (the compressed phase, v frozen, with no exchange: one rank),
 * OPS_ONEBIT_NONE neither (m already updated and averaged by the compressed all-reduce; grad is
 * not read and may be NULL). */
typedef enum { OPS_ONEBIT_NONE, OPS_ONEBIT_MOMENTUM, OPS_ONEBIT_BOTH } OpsOnebitMoments;
void ops_onebit_adam_step(float *param, float *m, float *v, const float *grad, size_t n,
			  const OpsAdamw *h, OpsOnebitMoments moments, float grad_scale);
/* m = beta1 m + (1 - beta1) grad * grad_scale: the compressed phase's momentum before its
 * compressed all-reduce. */
void ops_momentum_update(float *m, const float *grad, size_t n, double beta1, float grad_scale);

/* 0/1 Adam's steps with its variance v frozen (DeepSpeed's ZeroOneAdam, runtime/fp16/onebit/
 * zoadam.py), u its momentum accumulator, lrs the learning rates summed since the last
 * synchronisation, this step's included. A local step (OPS_ZO_LOCAL): m = b1 m + (1 - b1) g with
 * g = grad * grad_scale; d = lr (m / (sqrt(v) + eps) + weight_decay p); p -= d; u -= d. A
 * synchronising step is that, then OPS_ZO_SYNC_BEGIN: p -= u (back where the last
 * synchronisation left it), u *= sqrt(v) + eps; the caller averages u over the ranks (the
 * compressed all-reduce); then OPS_ZO_SYNC_END: m = -u / lrs,
 * p += u / (sqrt(v) + eps), u = 0. grad is read by OPS_ZO_LOCAL only. */
typedef enum { OPS_ZO_LOCAL, OPS_ZO_SYNC_BEGIN, OPS_ZO_SYNC_END } OpsZeroOnePhase;
void ops_zero_one_step(float *param, float *m, const float *v, float *u, const float *grad,
		       size_t n, const OpsAdamw *h, OpsZeroOnePhase phase, float grad_scale,
		       double lrs);

/* SGD with momentum as torch.optim.SGD (no dampening, no Nesterov):
 * g = grad * grad_scale + weight_decay * p; buf = momentum * buf + g; p -= lr * buf.
 * With momentum 0, buf may be NULL and no state is kept. buf starts at zero, which makes the first
 * step buf = g, as PyTorch's. */
void ops_sgd_step(float *param, float *buf, const float *grad, size_t n, float lr, float momentum,
		  float weight_decay, float grad_scale);

/* ---- gradient norm ---- */

/* Sum of squares of n values in double: shards' (and ranks') sums add, then one sqrt gives the
 * global L2 norm. */
double ops_sum_squares(const float *x, size_t n);
/* The clipping coefficient of torch.nn.utils.clip_grad_norm_: min(1, max_norm / (norm + 1e-6)).
 * max_norm <= 0 means no clipping (1). */
float ops_clip_coef(double norm, float max_norm);

#endif

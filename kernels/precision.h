/* precision: conversions between fp32 and the 16-bit formats the executor keeps tensors in
 * (bf16 and IEEE 754 binary16, "fp16"), rounding to nearest even, and the overflow check behind
 * fp16 loss scaling. It holds no state and does not decide which tensor lives in which format
 * (the executor's plan does). 16-bit values travel as their bit patterns in uint16_t. */
#ifndef PX_PRECISION_H
#define PX_PRECISION_H

#include <stddef.h>
#include <stdint.h>

/* Round to nearest, ties to even. NaN stays NaN (a quiet one, sign kept); values past the largest
 * finite 16-bit number by half an ulp or more become Inf; tiny values round to subnormals or to a
 * zero of the same sign. */
uint16_t precision_f32_to_bf16(float x);
uint16_t precision_f32_to_f16(float x);

/* Exact: every bf16 and fp16 value is an fp32 value. */
float precision_bf16_to_f32(uint16_t bits);
float precision_f16_to_f32(uint16_t bits);

/* Bulk forms of the above over n elements; dst and src do not overlap. */
void precision_f32_to_bf16_n(uint16_t *dst, const float *src, size_t n);
void precision_f32_to_f16_n(uint16_t *dst, const float *src, size_t n);
void precision_bf16_to_f32_n(float *dst, const uint16_t *src, size_t n);
void precision_f16_to_f32_n(float *dst, const uint16_t *src, size_t n);

/* 1 when any of the n values is Inf or NaN, else 0: the fp16 loss scaler skips the step and lowers
 * the scale when the (still scaled) gradients overflowed. */
int precision_has_nonfinite(const float *x, size_t n);

/* ---- element access by type ---- */

/* A tensor's element type, for code that runs one formula over any of the three: the 16-bit
 * compute path keeps its activations and working parameters in PREC_BF16 or PREC_F16. Same order
 * as kernels/cuda_ctx.h's CudaDtype. */
typedef enum PrecisionType { PREC_F32, PREC_BF16, PREC_F16 } PrecisionType;

static inline size_t precision_bytes(PrecisionType t) { return t == PREC_F32 ? 4 : 2; }
/* Where element i of a t array starts. */
static inline void *precision_at(const void *p, size_t i, PrecisionType t)
{
	return (char *)p + i * precision_bytes(t);
}
/* Element i of p as fp32 (exact). */
float precision_load(const void *p, size_t i, PrecisionType t);
/* Element i of p = x rounded to t (nearest even; fp32 stores x as is). */
void precision_store(void *p, size_t i, float x, PrecisionType t);
/* x rounded to t and back: the value a store and a load give. */
float precision_round(float x, PrecisionType t);

#endif

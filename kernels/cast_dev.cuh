/* cast_dev: fp32 <-> bf16 / fp16 for one value, as __host__ __device__ functions on bit patterns,
 * rounding to nearest even with NaN kept NaN and overflow to Inf: the same results, bit for bit,
 * as precision.h's (tests/test_kernels_cuda.c checks that on the host, without a GPU). Included by
 * the .cu files that convert (cast_cuda, optim_cuda); not a module of its own. */
#ifndef PX_CAST_DEV_CUH
#define PX_CAST_DEV_CUH

#include <stdint.h>
#include <string.h>

#include "cuda_ctx.h"

#define CASTD_F32_EXP 0x7F800000u
#define CASTD_F32_MANT 0x007FFFFFu

__host__ __device__ static inline uint32_t castd_bits(float x)
{
#ifdef __CUDA_ARCH__
	return (uint32_t)__float_as_uint(x);
#else
	uint32_t u;
	memcpy(&u, &x, sizeof(u));
	return u;
#endif
}

__host__ __device__ static inline float castd_float(uint32_t u)
{
#ifdef __CUDA_ARCH__
	return __uint_as_float(u);
#else
	float x;
	memcpy(&x, &u, sizeof(x));
	return x;
#endif
}

__host__ __device__ static inline int castd_f32_nonfinite(float x)
{
	return (castd_bits(x) & CASTD_F32_EXP) == CASTD_F32_EXP;
}

/* bf16 keeps the top 16 bits. Rounding: add just under half of the dropped part's range, plus one
 * when the kept part is odd, so exact halves go to the even neighbour; a carry into the exponent
 * is the correctly rounded result (up to Inf). A NaN gets its quiet bit, since its payload may
 * live only in the dropped bits. */
__host__ __device__ static inline uint16_t castd_f32_to_bf16(float x)
{
	uint32_t u = castd_bits(x);
	if ((u & CASTD_F32_EXP) == CASTD_F32_EXP && (u & CASTD_F32_MANT))
		return (uint16_t)((u >> 16) | 0x0040u);
	return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

__host__ __device__ static inline float castd_bf16_to_f32(uint16_t h)
{
	return castd_float((uint32_t)h << 16);
}

/* Round v (a count of units) right by s bits (1..31) to nearest even. */
__host__ __device__ static inline uint32_t castd_rshift_even(uint32_t v, int s)
{
	uint32_t q = v >> s, r = v - (q << s), half = 1u << (s - 1);
	return q + ((r > half) | ((r == half) & q & 1u));
}

/* fp16: 5-bit exponent, bias 15, 10 mantissa bits; below 2^-14 subnormal in units of 2^-24. */
__host__ __device__ static inline uint16_t castd_f32_to_f16(float x)
{
	uint32_t u = castd_bits(x);
	uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
	uint32_t mant = u & CASTD_F32_MANT;
	int e = (int)((u >> 23) & 0xFFu) - 127;
	if (e == 128) /* Inf, or a NaN made quiet */
		return (uint16_t)(sign | 0x7C00u | (mant ? 0x0200u | (mant >> 13) : 0u));
	if (e > 15)
		return (uint16_t)(sign | 0x7C00u);
	if (e >= -14) /* normal: 13 bits dropped; a carry walks into the exponent, up to Inf */
		return (uint16_t)(sign | castd_rshift_even((((uint32_t)(e + 15)) << 23) | mant, 13));
	if (e >= -25) /* subnormal: the 24-bit significand in 2^-24 units, shifted by -(e + 1) */
		return (uint16_t)(sign | castd_rshift_even(mant | 0x800000u, -(e + 1)));
	return sign;
}

__host__ __device__ static inline float castd_f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1Fu, mant = h & 0x3FFu;
	if (exp == 0x1F)
		return castd_float(sign | CASTD_F32_EXP | (mant << 13));
	if (exp)
		return castd_float(sign | ((exp + 112u) << 23) | (mant << 13)); /* 112 = 127 - 15 */
	/* subnormal or zero: mant 2^-24, exact in fp32 */
	float mag = (float)mant * 5.9604644775390625e-8f;
	return sign ? -mag : mag;
}

/* Any of the three types, by CudaDtype, as fp32. */
__host__ __device__ static inline float castd_load(const void *p, size_t i, int dtype)
{
	if (dtype == CDT_BF16)
		return castd_bf16_to_f32(((const uint16_t *)p)[i]);
	if (dtype == CDT_F16)
		return castd_f16_to_f32(((const uint16_t *)p)[i]);
	return ((const float *)p)[i];
}

#endif

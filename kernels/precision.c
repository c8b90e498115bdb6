#include "precision.h"

#include <string.h>

#include "par_cpu.h"

/* Layouts, sign | exponent | mantissa:
 *   fp32 1 | 8 (bias 127) | 23;   bf16 1 | 8 (bias 127) | 7;   fp16 1 | 5 (bias 15) | 10.
 * bf16 is the top half of an fp32, so its rounding works on the dropped low 16 bits; fp16 needs the
 * exponent rebiased and, below 2^-14, the mantissa shifted into a subnormal. */

static uint32_t f32_bits(float x)
{
	uint32_t u;
	memcpy(&u, &x, sizeof(u)); /* memcpy, not a pointer cast: no strict-aliasing trouble */
	return u;
}

static float f32_from_bits(uint32_t u)
{
	float x;
	memcpy(&x, &u, sizeof(x));
	return x;
}

#define F32_EXP_MASK 0x7F800000u
#define F32_MANT_MASK 0x007FFFFFu

/* ---- bf16 ---- */

uint16_t precision_f32_to_bf16(float x)
{
	uint32_t u = f32_bits(x);
	if ((u & F32_EXP_MASK) == F32_EXP_MASK && (u & F32_MANT_MASK))
		/* a NaN whose payload sits only in the dropped bits would truncate to Inf: set the
		 * quiet bit so it stays NaN */
		return (uint16_t)((u >> 16) | 0x0040u);
	/* Adding 0x7FFF rounds up exactly when the low half is above 0x8000; the extra lsb of the
	 * kept half breaks the tie toward even. A carry out of the mantissa bumps the exponent, which
	 * is the right answer, up to and including overflow to Inf. */
	uint32_t lsb = (u >> 16) & 1u;
	return (uint16_t)((u + 0x7FFFu + lsb) >> 16);
}

float precision_bf16_to_f32(uint16_t bits)
{
	return f32_from_bits((uint32_t)bits << 16);
}

/* ---- fp16 ---- */

/* Shift m right by s (1 <= s <= 31), rounding to nearest even on the bits shifted out. */
static uint32_t shift_round_even(uint32_t m, int s)
{
	uint32_t kept = m >> s;
	uint32_t rest = m & ((1u << s) - 1u);
	uint32_t half = 1u << (s - 1);
	if (rest > half || (rest == half && (kept & 1u)))
		kept++;
	return kept;
}

uint16_t precision_f32_to_f16(float x)
{
	uint32_t u = f32_bits(x);
	uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
	int exp = (int)((u >> 23) & 0xFFu);
	uint32_t mant = u & F32_MANT_MASK;

	if (exp == 0xFF) /* Inf, or NaN made quiet so a low-bit payload cannot turn into Inf */
		return mant ? (uint16_t)(sign | 0x7E00u | (mant >> 13)) : (uint16_t)(sign | 0x7C00u);
	int e = exp - 127; /* unbiased; fp32 subnormals (exp 0) land far below fp16's range */
	if (e > 15)
		return (uint16_t)(sign | 0x7C00u);
	if (e >= -14) {
		/* normal fp16: rebias, keep 10 of the 23 mantissa bits. A rounding carry walks into the
		 * exponent, and from the largest finite value (65504) into Inf, as it should. */
		uint32_t h = ((uint32_t)(e + 15) << 10) | (mant >> 13);
		uint32_t rest = mant & 0x1FFFu;
		if (rest > 0x1000u || (rest == 0x1000u && (h & 1u)))
			h++;
		return (uint16_t)(sign | h);
	}
	if (e >= -25) {
		/* subnormal fp16, unit 2^-24: the value (1.m) * 2^e is (mant | 2^23) * 2^(e-23), so the
		 * count of 2^-24 units is that 24-bit integer shifted right by -(e+1), 14..24 bits.
		 * Rounding up from the largest subnormal gives 0x0400, the smallest normal. */
		return (uint16_t)(sign | shift_round_even(mant | 0x800000u, -(e + 1)));
	}
	return sign; /* below half the smallest subnormal: a signed zero */
}

float precision_f16_to_f32(uint16_t bits)
{
	uint32_t sign = (uint32_t)(bits & 0x8000u) << 16;
	uint32_t exp = (bits >> 10) & 0x1Fu;
	uint32_t mant = bits & 0x3FFu;

	if (exp == 0x1F) /* Inf or NaN; the payload moves to the top of the fp32 mantissa */
		return f32_from_bits(sign | F32_EXP_MASK | (mant << 13));
	if (exp != 0)
		return f32_from_bits(sign | ((exp - 15 + 127) << 23) | (mant << 13));
	if (mant == 0)
		return f32_from_bits(sign);
	/* subnormal mant * 2^-24: normalise so the leading one becomes fp32's implicit bit */
	int e = -14;
	while (!(mant & 0x400u)) {
		mant <<= 1;
		e--;
	}
	return f32_from_bits(sign | ((uint32_t)(e + 127) << 23) | ((mant & 0x3FFu) << 13));
}

/* ---- arrays ---- */

/* The bulk conversions split over par_cpu's threads: each element converts on its own. */
typedef struct CastArgs {
	void *dst;
	const void *src;
} CastArgs;

static void f32_to_bf16_range(void *ctx, size_t i0, size_t i1)
{
	CastArgs *a = ctx;
	uint16_t *dst = a->dst;
	const float *src = a->src;
	for (size_t i = i0; i < i1; i++)
		dst[i] = precision_f32_to_bf16(src[i]);
}

static void f32_to_f16_range(void *ctx, size_t i0, size_t i1)
{
	CastArgs *a = ctx;
	uint16_t *dst = a->dst;
	const float *src = a->src;
	for (size_t i = i0; i < i1; i++)
		dst[i] = precision_f32_to_f16(src[i]);
}

static void bf16_to_f32_range(void *ctx, size_t i0, size_t i1)
{
	CastArgs *a = ctx;
	float *dst = a->dst;
	const uint16_t *src = a->src;
	for (size_t i = i0; i < i1; i++)
		dst[i] = precision_bf16_to_f32(src[i]);
}

static void f16_to_f32_range(void *ctx, size_t i0, size_t i1)
{
	CastArgs *a = ctx;
	float *dst = a->dst;
	const uint16_t *src = a->src;
	for (size_t i = i0; i < i1; i++)
		dst[i] = precision_f16_to_f32(src[i]);
}

void precision_f32_to_bf16_n(uint16_t *dst, const float *src, size_t n)
{
	CastArgs a = {dst, src};
	par_cpu_for(n, PAR_CPU_GRAIN_ELEMS, f32_to_bf16_range, &a);
}

void precision_f32_to_f16_n(uint16_t *dst, const float *src, size_t n)
{
	CastArgs a = {dst, src};
	par_cpu_for(n, PAR_CPU_GRAIN_ELEMS, f32_to_f16_range, &a);
}

void precision_bf16_to_f32_n(float *dst, const uint16_t *src, size_t n)
{
	CastArgs a = {dst, src};
	par_cpu_for(n, PAR_CPU_GRAIN_ELEMS, bf16_to_f32_range, &a);
}

void precision_f16_to_f32_n(float *dst, const uint16_t *src, size_t n)
{
	CastArgs a = {dst, src};
	par_cpu_for(n, PAR_CPU_GRAIN_ELEMS, f16_to_f32_range, &a);
}

int precision_has_nonfinite(const float *x, size_t n)
{
	/* on the bits rather than isfinite(), so that -ffast-math builds cannot fold the test away */
	for (size_t i = 0; i < n; i++)
		if ((f32_bits(x[i]) & F32_EXP_MASK) == F32_EXP_MASK)
			return 1;
	return 0;
}

/* ---- element access by type ---- */

float precision_load(const void *p, size_t i, PrecisionType t)
{
	if (t == PREC_F32)
		return ((const float *)p)[i];
	uint16_t b = ((const uint16_t *)p)[i];
	return t == PREC_BF16 ? precision_bf16_to_f32(b) : precision_f16_to_f32(b);
}

void precision_store(void *p, size_t i, float x, PrecisionType t)
{
	if (t == PREC_F32)
		((float *)p)[i] = x;
	else
		((uint16_t *)p)[i] = t == PREC_BF16 ? precision_f32_to_bf16(x) : precision_f32_to_f16(x);
}

float precision_round(float x, PrecisionType t)
{
	if (t == PREC_F32)
		return x;
	return t == PREC_BF16 ? precision_bf16_to_f32(precision_f32_to_bf16(x)) :
				precision_f16_to_f32(precision_f32_to_f16(x));
}

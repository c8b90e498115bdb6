#include "quant_cpu.h"

#include <math.h>

/* One value: DeepSpeed's Params<Symmetric>::quantize (val x scale, __float2int_rn, clamped). */
static int quant_one(float v, float factor, int bits)
{
	int lo = -(1 << (bits - 1)), hi = (1 << (bits - 1)) - 1;
	float r = nearbyintf(v * factor); /* the default rounding mode: to nearest, ties to even */
	int q = r < (float)lo ? lo : r > (float)hi ? hi : (int)r;
	return q;
}

static void put_q(void *q, size_t i, int bits, int v)
{
	uint8_t *b = q;
	if (bits == 8) {
		((int8_t *)q)[i] = (int8_t)v;
		return;
	}
	uint8_t nib = (uint8_t)(v & 0xF);
	if (i % 2 == 0)
		b[i / 2] = (uint8_t)(nib << 4);
	else
		b[i / 2] = (uint8_t)(b[i / 2] | nib);
}

static int get_q(const void *q, size_t i, int bits)
{
	if (bits == 8)
		return ((const int8_t *)q)[i];
	uint8_t b = ((const uint8_t *)q)[i / 2];
	int nib = i % 2 == 0 ? b >> 4 : b & 0xF;
	return nib >= 8 ? nib - 16 : nib; /* sign-extend the 4-bit two's complement */
}

void quant_block_quantize(const float *src, size_t n, size_t block_elems, int bits, void *q,
			  float *scales)
{
	for (size_t b0 = 0, k = 0; b0 < n; b0 += block_elems, k++) {
		size_t b1 = b0 + block_elems < n ? b0 + block_elems : n;
		float m = 0;
		for (size_t i = b0; i < b1; i++)
			m = fabsf(src[i]) > m ? fabsf(src[i]) : m;
		float factor = m == 0 ? 1.0f : (float)(1 << bits) / (2 * m);
		scales[k] = 1 / factor;
		for (size_t i = b0; i < b1; i++)
			put_q(q, i, bits, quant_one(src[i], factor, bits));
	}
	if (bits == 4 && n % 2) /* the unused low nibble */
		((uint8_t *)q)[n / 2] &= 0xF0;
}

void quant_block_dequantize(const void *q, const float *scales, size_t n, size_t block_elems,
			    int bits, float *dst)
{
	for (size_t i = 0; i < n; i++)
		dst[i] = (float)get_q(q, i, bits) * scales[i / block_elems];
}

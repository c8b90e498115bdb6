#include "onebit_cpu.h"

#include <math.h>
#include <string.h>

void onebit_cpu_compensate(const float *m, size_t elems, const float *error, size_t padded,
			   float *buf)
{
	for (size_t k = 0; k < padded; k++)
		buf[k] = (k < elems ? m[k] : 0.0f) + error[k];
}

float onebit_cpu_compress(const float *x, size_t n, uint8_t *bits, float *error)
{
	double s = 0; /* summed in double */
	for (size_t i = 0; i < n; i++)
		s += (double)x[i] * (double)x[i];
	float scale = (float)(sqrt(s) / sqrt((double)n));
	memset(bits, 0, n / 8);
	for (size_t k = 0; k < n; k++) {
		float v = x[k], sg = onebit_sign(v);
		if (sg > 0)
			bits[k / 8] |= (uint8_t)(0x80u >> (k % 8));
		error[k] = v - scale * sg;
	}
	return scale;
}

static float bit_sign(const uint8_t *bits, size_t k)
{
	return bits[k / 8] & (0x80u >> (k % 8)) ? 1.0f : -1.0f;
}

void onebit_cpu_average(const uint8_t *signs, const float *scales, int n_ranks, size_t chunk,
			const float *server_err, float *out)
{
	for (size_t k = 0; k < chunk; k++) {
		float s = 0;
		for (int i = 0; i < n_ranks; i++)
			s += bit_sign(signs + (size_t)i * (chunk / 8), k) *
			     (scales[i] * (1.0f / (float)n_ranks));
		out[k] = s + server_err[k];
	}
}

void onebit_cpu_expand(const uint8_t *bits, const float *scales, size_t chunk, size_t elems,
		       float *m)
{
	for (size_t k = 0; k < elems; k++)
		m[k] = bit_sign(bits, k) * scales[k / chunk];
}

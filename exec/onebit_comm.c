#include "onebit_comm.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ||x||_2 / sqrt(n), the scale torch.norm(x) / np.sqrt(numel) gives (summed in double here). */
static float rms(const float *x, size_t n)
{
	double s = 0;
	for (size_t i = 0; i < n; i++)
		s += (double)x[i] * (double)x[i];
	return (float)(sqrt(s) / sqrt((double)n));
}

/* x's signs into bits, element k at bit 7 - k % 8 of byte k / 8 (cupy.packbits' big-endian
 * order); error <- x - scale * sign(x). */
static void compress(const float *x, size_t n, float scale, uint8_t *bits, float *error)
{
	memset(bits, 0, n / 8);
	for (size_t k = 0; k < n; k++) {
		float s = onebit_sign(x[k]);
		if (s > 0)
			bits[k / 8] |= (uint8_t)(0x80u >> (k % 8));
		error[k] = x[k] - scale * s;
	}
}

static float bit_sign(const uint8_t *bits, size_t k)
{
	return bits[k / 8] & (0x80u >> (k % 8)) ? 1.0f : -1.0f;
}

int onebit_comm_allreduce(Comm *c, float *m, size_t elems, size_t padded_elems, float *worker_err,
			  float *server_err, PxError *err)
{
	int n = comm_size(c);
	size_t chunk = padded_elems / (size_t)n;
	if (padded_elems < elems || padded_elems % (8 * (size_t)n))
		return px_fail(err, PX_ERR_RUNTIME, "1-bit all-reduce of %zu elements padded to %zu: "
			       "the padding must be a multiple of 8 x %d ranks", elems, padded_elems, n);
	/* buf (padded), then the server's compensated chunk; the sign bytes; the scales */
	float *buf = malloc((padded_elems + chunk + 2 * (size_t)n) * sizeof(float));
	uint8_t *bits = malloc(2 * (padded_elems / 8) + chunk / 8);
	int rc = -1;
	if (!buf || !bits) {
		px_fail(err, PX_ERR_RUNTIME, "out of memory for a 1-bit all-reduce of %zu elements",
			elems);
		goto out;
	}
	float *server = buf + padded_elems, *scales = server + chunk, *server_scales = scales + n;
	uint8_t *sent = bits, *recvd = bits + padded_elems / 8, *server_bits = recvd + padded_elems / 8;

	/* the worker: the momentum with its error, padded with zeros, compressed */
	for (size_t k = 0; k < padded_elems; k++)
		buf[k] = (k < elems ? m[k] : 0.0f) + worker_err[k];
	float scale = rms(buf, padded_elems);
	compress(buf, padded_elems, scale, sent, worker_err);
	/* phase 1: chunk j's signs to rank j; every rank's scale */
	if (comm_all_to_all(c, sent, recvd, chunk / 8, COMM_INT8, err) ||
	    comm_all_gather(c, &scale, scales, 1, COMM_FP32, err))
		goto out;
	/* the server: this rank's chunk averaged over the ranks (each sign times its rank's scale
	 * over n, summed rank after rank), its error added, compressed again */
	for (size_t k = 0; k < chunk; k++) {
		float s = 0;
		for (int i = 0; i < n; i++)
			s += bit_sign(recvd + (size_t)i * (chunk / 8), k) * (scales[i] * (1.0f / (float)n));
		server[k] = s + server_err[k];
	}
	float server_scale = rms(server, chunk);
	compress(server, chunk, server_scale, server_bits, server_err);
	/* phase 2: every chunk's signs and scale to every rank */
	if (comm_all_gather(c, server_bits, recvd, chunk / 8, COMM_INT8, err) ||
	    comm_all_gather(c, &server_scale, server_scales, 1, COMM_FP32, err))
		goto out;
	for (size_t k = 0; k < elems; k++)
		m[k] = bit_sign(recvd, k) * server_scales[k / chunk];
	rc = 0;
out:
	free(buf);
	free(bits);
	return rc;
}

#include "onebit_comm.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The call's scratch (the padded buffer, the server's chunk, the scales, the sign bytes), kept
 * between calls and grown when a larger one comes: a step exchanges the same tensors every time,
 * and a block above glibc's mmap threshold given back may be mapped and faulted in again at the
 * next call, as kernels/ops16_cpu.c's temporaries were. On gpt2-mini-cpu-onebit (2 ranks, 10
 * steps, freeze_step 2) this took the minor page faults from 352 to 331 a step; most of either
 * are first touches of the moments and error buffers after step 1. One call at a time holds it. */
static struct {
	pthread_mutex_t mu;
	void *p;
	size_t bytes;
} scratch = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void *scratch_take(size_t bytes)
{
	if (bytes <= scratch.bytes)
		return scratch.p;
	void *p = realloc(scratch.p, bytes);
	if (!p)
		return NULL;
	scratch.p = p, scratch.bytes = bytes;
	return p;
}

int onebit_comm_allreduce(Comm *c, float *m, size_t elems, size_t padded_elems, float *worker_err,
			  float *server_err, PxError *err)
{
	int n = comm_size(c);
	size_t chunk = padded_elems / (size_t)n;
	if (padded_elems < elems || padded_elems % (8 * (size_t)n))
		return px_fail(err, PX_ERR_RUNTIME, "1-bit all-reduce of %zu elements padded to %zu: "
			       "the padding must be a multiple of 8 x %d ranks", elems, padded_elems, n);
	/* buf (padded), then the server's compensated chunk, the scales; the sign bytes */
	size_t floats = (padded_elems + chunk + 2 * (size_t)n) * sizeof(float);
	pthread_mutex_lock(&scratch.mu);
	float *buf = scratch_take(floats + 2 * (padded_elems / 8) + chunk / 8);
	uint8_t *bits = buf ? (uint8_t *)buf + floats : NULL;
	int rc = -1;
	if (!buf) {
		px_fail(err, PX_ERR_RUNTIME, "out of memory for a 1-bit all-reduce of %zu elements",
			elems);
		goto out;
	}
	float *server = buf + padded_elems, *scales = server + chunk, *server_scales = scales + n;
	uint8_t *sent = bits, *recvd = bits + padded_elems / 8, *server_bits = recvd + padded_elems / 8;

	/* the worker: the momentum with its error, padded with zeros, compressed */
	onebit_cpu_compensate(m, elems, worker_err, padded_elems, buf);
	float scale = onebit_cpu_compress(buf, padded_elems, sent, worker_err);
	/* phase 1: chunk j's signs to rank j; every rank's scale */
	if (comm_all_to_all(c, sent, recvd, chunk / 8, COMM_INT8, err) ||
	    comm_all_gather(c, &scale, scales, 1, COMM_FP32, err))
		goto out;
	/* the server: this rank's chunk averaged over the ranks (each sign times its rank's scale
	 * over n, summed rank after rank), its error added, compressed again */
	onebit_cpu_average(recvd, scales, n, chunk, server_err, server);
	float server_scale = onebit_cpu_compress(server, chunk, server_bits, server_err);
	/* phase 2: every chunk's signs and scale to every rank */
	if (comm_all_gather(c, server_bits, recvd, chunk / 8, COMM_INT8, err) ||
	    comm_all_gather(c, &server_scale, server_scales, 1, COMM_FP32, err))
		goto out;
	onebit_cpu_expand(recvd, server_scales, chunk, elems, m);
	rc = 0;
out:
	pthread_mutex_unlock(&scratch.mu);
	return rc;
}

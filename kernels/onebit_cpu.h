/* onebit_cpu: the arithmetic of DeepSpeed's 1-bit compressed all-reduce (runtime/comm/nccl.py
 * compressed_allreduce) on host fp32 arrays, apart from its messages: a worker's buffer
 * compensated with its error and compressed to packed signs and one scale, a chunk owner's
 * average of the ranks' decompressed chunks, and the final expansion. exec/onebit_comm.c runs them
 * around the collectives; cli/calib_cpu.c times them for the CPU profile (sim/opcost_cpu.c prices
 * the compressed all-reduce's compute with those times). */
#ifndef PX_KERNELS_ONEBIT_CPU_H
#define PX_KERNELS_ONEBIT_CPU_H

#include <stddef.h>
#include <stdint.h>

/* The sign DeepSpeed gives x: sign(x).add_(1).bool() mapped to +-1, so +1 for x >= 0 (zero
 * included, and NaN, whose bool is true) and -1 for x < 0. */
static inline float onebit_sign(float x)
{
	return x < 0 ? -1.0f : 1.0f;
}

/* buf[k] <- m[k] + error[k] for k < elems, error[k] for elems <= k < padded (zero padding). */
void onebit_cpu_compensate(const float *m, size_t elems, const float *error, size_t padded,
			   float *buf);

/* x (n, a multiple of 8) compressed: returns its scale ||x||_2 / sqrt(n) (torch.norm(x) /
 * np.sqrt(numel)), writes its signs into bits (n / 8 bytes, element k at bit 7 - k % 8 of byte
 * k / 8: cupy.packbits' big-endian order) and error <- x - scale sign(x). error may be x. */
float onebit_cpu_compress(const float *x, size_t n, uint8_t *bits, float *error);

/* A chunk owner's average: out[k] <- sum over ranks i of sign_i(k) scales[i] / n_ranks, summed
 * rank after rank, plus server_err[k], for k < chunk; signs: n_ranks packed chunks of chunk / 8
 * bytes, rank i's at i chunk / 8. */
void onebit_cpu_average(const uint8_t *signs, const float *scales, int n_ranks, size_t chunk,
			const float *server_err, float *out);

/* m[k] <- sign(k) scales[k / chunk] for k < elems: the gathered chunks expanded. */
void onebit_cpu_expand(const uint8_t *bits, const float *scales, size_t chunk, size_t elems,
		       float *m);

#endif

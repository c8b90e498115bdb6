/* quant_cpu: symmetric block quantization to INT8 and INT4 and back, as DeepSpeed's quantizer
 * kernels do it for ZeRO++ (csrc/includes/quantization_utils.h, Type::Symmetric): per block the
 * largest magnitude m sets the factor s = 2^bits / (2 m) (1 for an all-zero block), each value
 * becomes round-to-nearest-even(v s) clamped to [-2^(bits-1), 2^(bits-1) - 1], and the block's
 * fp32 scale 1/s travels with it; dequantizing multiplies back. It holds no state and does not
 * choose the blocks (engine/build.h: the schedule's groups) or move anything. */
#ifndef PX_QUANT_CPU_H
#define PX_QUANT_CPU_H

#include <stddef.h>
#include <stdint.h>

/* Bytes n values take at bits 8 or 4 (two INT4 values a byte). */
static inline size_t quant_bytes(size_t n, int bits)
{
	return bits == 4 ? (n + 1) / 2 : n;
}

/* Quantize src (n values) in blocks of block_elems (the last one may be shorter): q gets
 * quant_bytes(n, bits) bytes, scales one fp32 per block. INT4 packs value 2i in the byte's high
 * nibble and 2i+1 in its low one (DeepSpeed's PackedInt4 bit-field), an odd count's last low
 * nibble 0. Blocks start at multiples of block_elems; with INT4 block_elems must be even. */
void quant_block_quantize(const float *src, size_t n, size_t block_elems, int bits, void *q,
			  float *scales);

/* The inverse: dst[i] = q_i x the scale of i's block. */
void quant_block_dequantize(const void *q, const float *scales, size_t n, size_t block_elems,
			    int bits, float *dst);

#endif

/* infer_cpu: GPT-2's forward for serving, on the host, one tensor-parallel rank's shard in
 * kernels/gpt_tp_cpu.h's layout: linears whose weights are fp32, bf16, fp16 or int8 with one
 * scale per group (dequantized inside the product), attention of any number of new tokens over a
 * KV cache (the prompt's in prefill, one token in decode), layer norm, GELU, the vocabulary-
 * parallel embedding and head, and the symmetric group quantizer. Activations and the cache are
 * of one storage type (precision.h), every sum in fp32. Which unit runs when, the buffers and the
 * collectives are the caller's (exec/infer_runner.c).
 * Dimensions: B sequences, Tn new tokens each, N = B Tn rows, C channels, NHr heads on this rank,
 * hs = C / NH per head, V vocabulary (Vr = V / t on this rank). */
#ifndef PX_INFER_CPU_H
#define PX_INFER_CPU_H

#include <stddef.h>
#include <stdint.h>

#include "precision.h"

/* A (K, Nout) weight matrix, row-major as ops_matmul_forward's: element i is w's in prec, or,
 * when q is set, q[i] x scales[i / group_elems] (int8, symmetric). */
typedef struct InferMat {
	const void *w;
	PrecisionType prec;
	const int8_t *q;
	const float *scales;
	size_t group_elems;
} InferMat;

/* ---- group quantization (symmetric int8, DeepSpeed's int8 kernels' scheme) ----
 * Each group of group_elems consecutive elements gets scale = max |w| / 127 (0 for an all-zero
 * group) and q = round(w / scale), so that |q x scale - w| <= scale / 2 = max |w| / 254.
 * n must be a multiple of group_elems. w is of type prec. */
void infer_cpu_quantize(const void *w, PrecisionType prec, size_t n, size_t group_elems,
			int8_t *q, float *scales);
/* w (fp32, n) = q x its group's scale */
void infer_cpu_dequantize(const int8_t *q, const float *scales, size_t n, size_t group_elems,
			  float *w);

/* ---- the unit's pieces, activations of type act ---- */

/* y (N, Nout) = x (N, K) W (+ b (Nout) when b is not NULL); y and x do not overlap. */
void infer_cpu_linear(void *y, const void *x, const InferMat *w, const void *b, PrecisionType act,
		      int N, int K, int Nout);
/* y (N, C) = layernorm(x) w + b (eps 1e-5, ops_layernorm_forward's); y may be x. */
void infer_cpu_layernorm(void *y, const void *x, const void *w, const void *b, PrecisionType act,
			 int N, int C);
/* x (n) = gelu(x), the tanh approximation (ops_gelu_forward's) */
void infer_cpu_gelu(void *x, PrecisionType act, size_t n);
/* y (n) += a (n) (+ b (n, broadcast over rows of width) when b is not NULL: a row-split
 * layer's bias, added once to the reduced sum) */
void infer_cpu_residual(void *y, const void *a, const void *b, PrecisionType act, size_t n,
			int width);

/* x (B, Tn, C) = the token rows this rank holds (tokens in [vlo, vlo + Vr), else 0) plus, when
 * wpe is not NULL, the positions pos0 .. pos0 + Tn - 1 (rank 0 adds them: the vocabulary-
 * parallel sum over ranks then counts them once). wte (Vr, C), wpe (max_T, C). */
void infer_cpu_embed(void *x, const int *tokens, const void *wte, const void *wpe,
		     PrecisionType act, int B, int Tn, int pos0, int C, int vlo, int Vr);
/* logits (B, Vr) fp32 = x_b wte^T, x_b the row of each sequence given (stride C), wte (Vr, C). */
void infer_cpu_logits(float *logits, const void *x, size_t row_stride, const void *wte,
		      PrecisionType act, int B, int C, int Vr);

/* ---- the KV cache ---- */

/* One unit's keys and values on this rank for B sequences: positions [0, cap0) in seg[0], the
 * next cap1 in seg[1] (Hugging Face's cache grows in two allocations; DeepSpeed's kernels
 * reserve one, cap1 = 0). Each segment: K then V, each (B, NHr, cap, hs), of type prec. */
typedef struct InferKv {
	void *seg[2];
	int cap[2];
	int B, NHr, hs;
	PrecisionType prec;
} InferKv;

/* Bytes of a segment of cap tokens. */
size_t infer_kv_seg_bytes(int B, int NHr, int hs, PrecisionType prec, int cap);

/* Attention of Tn new tokens at positions pos0 .. pos0 + Tn - 1 of each sequence: their keys and
 * values (qkv (B, Tn, 3 NHr hs), stored [q | k | v] as gpt_tp_cpu's c_attn shard) written into
 * the cache, then out (B, Tn, NHr hs) = softmax(q K^T / sqrt(hs)) V over positions 0 .. the
 * token's own (causal). scores: fp32 room for each (sequence, head) row of pos0 + Tn scores,
 * at scores + (b NHr + h) score_stride (stride 0: one row reused, the fused prefill's). */
void infer_cpu_attention(void *out, const void *qkv, InferKv *kv, PrecisionType act, int B,
			 int Tn, int pos0, float *scores, size_t score_stride);

/* The index of the largest of n values (the first of equals): greedy decoding. */
int infer_cpu_argmax(const float *x, int n);

#endif

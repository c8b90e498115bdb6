/* activ: activation memory of a transformer layer, after Korthikanti et al. 2022 ("Reducing
 * Activation Recomputation in Large Transformer Models"), generalised to the architectures model.c
 * reads (grouped-query attention, gated MLPs, no dropout, 32-bit activations). With 16-bit
 * activations, dropout, kv = h and I = 4h it reproduces the paper's Table 2 exactly. */
#ifndef PX_ACTIV_H
#define PX_ACTIV_H

#include "model.h"

typedef enum { CKPT_NONE, CKPT_SELECTIVE, CKPT_FULL } CkptMode;

typedef struct ActivShape {
	long long s, b;  /* sequence length, micro-batch */
	int t;           /* tensor-parallel degree (1 without tensor parallelism) */
	int sp;          /* sequence parallelism splits the replicated parts across t */
	int flash;       /* FlashAttention: no scores kept, only each row's fp32 log-sum-exp */
	int elem_bytes;  /* 2 for fp16/bf16 activations, 4 for fp32 */
} ActivShape;

/* Bytes one transformer block keeps for backward when nothing is recomputed (CKPT_NONE) or with
 * selective recompute (the attention scores are recomputed). With FlashAttention the scores are
 * never kept whatever the mode: 4 bytes per head and query row (the softmax's log-sum-exp) in
 * their place. */
double activ_block_bytes(const ModelSpec *m, const ActivShape *x, CkptMode mode);
/* Of activ_block_bytes (and activ_moe_block_bytes), the eager attention's kept scores: softmax
 * output, dropout mask and dropout output, (2d + m) a s^2 b / t. 0 with FlashAttention or when
 * selective recompute rebuilds them. */
double activ_block_scores_bytes(const ModelSpec *m, const ActivShape *x, CkptMode mode);
/* Bytes of one block's checkpoint under full recompute: its input, split over t when
 * sequence-parallel or when DeepSpeed partitions activations. */
double activ_checkpoint_bytes(const ModelSpec *m, const ActivShape *x, int partitioned);
/* An MoE block whose local experts receive `slots` tokens (E x capacity). */
double activ_moe_block_bytes(const ModelSpec *m, const ActivShape *x, CkptMode mode,
			     long long slots);
/* Embedding and output-layer bytes per micro-batch: the embedding's dropout mask (first stage) and
 * the head's (last stage); together Korthikanti's (sbhL/t)(p/L + (4/L)(1 + V/h)) with p = 1, i.e.
 * (5sbh + 4sbV)/t in 16-bit with dropout. */
double activ_embed_bytes(const ModelSpec *m, const ActivShape *x);
double activ_head_bytes(const ModelSpec *m, const ActivShape *x);
double activ_ends_bytes(const ModelSpec *m, const ActivShape *x);

#endif

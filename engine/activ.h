/* activ: activation memory of each layer unit, after Korthikanti et al. 2022 ("Reducing Activation
 * Recomputation in Large Transformer Models"), generalised to every composition model.h describes
 * (grouped- and multi-query attention, latent attention, query/key norms, sandwich and output
 * norms, parallel blocks, gated MLPs, MoE, an encoder-decoder's cross-attention, no dropout,
 * 32-bit activations). With 16-bit activations, dropout, kv = h and I = 4h it reproduces the
 * paper's Table 2 exactly. It does not decide where they live (build.c). */
#ifndef PX_ACTIV_H
#define PX_ACTIV_H

#include "model.h"

typedef enum { CKPT_NONE, CKPT_SELECTIVE, CKPT_FULL } CkptMode;

typedef struct ActivShape {
	long long s, b;  /* sequence length (an encoder-decoder's encoder's), micro-batch */
	long long s_dec; /* an encoder-decoder's decoder sequence length; 0: s */
	int t;           /* tensor-parallel degree (1 without tensor parallelism) */
	int sp;          /* sequence parallelism splits the replicated parts across t */
	int flash;       /* FlashAttention: no scores kept, only each row's fp32 log-sum-exp */
	long long attn_block; /* block-sparse self-attention's block side (0: dense attention) */
	double attn_blocks;   /* its layout's non-zero blocks per head (mean over heads) */
	int elem_bytes;  /* 2 for fp16/bf16 activations, 4 for fp32 */
	int hf_eager;    /* the model runs on its Hugging Face eager modules (Scenario.model_code):
			    what they keep beyond Korthikanti's count (activ.c) */
	int autocast;    /* torch autocast over fp32 weights (elem_bytes 2): what its fp32 ops
			    keep beyond the 16-bit count (activ.c) */
	int weights16;   /* with autocast: over 16-bit weights (FSDP's MixedPrecision), whose
			    residual stream is 16-bit */
	int logits_align; /* the logits' rows padded to a multiple of this many elements (the CUDA
			     executor's 8, kernels/ops_cuda.h's ops_cuda_logits_ld); 0: none */
} ActivShape;

/* Bytes unit `unit` keeps for backward per micro-batch when nothing is recomputed (CKPT_NONE) or
 * with selective recompute (the attention scores are recomputed): the embeddings, a block (an
 * MoE block with its local experts receiving `slots` tokens, E x capacity) or the head. With
 * FlashAttention the scores are never kept whatever the mode: 4 bytes per head and query row (the
 * softmax's log-sum-exp) in their place. */
double activ_unit_bytes(const ModelSpec *m, int unit, const ActivShape *x, CkptMode mode,
			long long slots);
/* Of those, the eager attention's kept scores: softmax output, dropout mask and dropout output,
 * (2d + m) a s^2 b / t; under a block-sparse layout the layout's scores in place of the s^2,
 * (2d + m) a n block^2 b / t with n its non-zero blocks per head. 0 with FlashAttention, when selective recompute rebuilds them, or for the
 * ends. */
double activ_unit_scores_bytes(const ModelSpec *m, int unit, const ActivShape *x, CkptMode mode);
/* Bytes of a block's checkpoint under full recompute: its input, split over t when
 * sequence-parallel or when DeepSpeed partitions activations (the encoder's last block also keeps
 * the encoder's output, which every decoder block reads). 0 for the ends. */
double activ_unit_checkpoint_bytes(const ModelSpec *m, int unit, const ActivShape *x,
				   int partitioned);

/* The first block's, as a dense block and as an MoE block; the ends (Korthikanti's
 * (sbhL/t)(p/L + (4/L)(1 + V/h)) with p = 1: (5sbh + 4sbV)/t in 16-bit with dropout). */
double activ_block_bytes(const ModelSpec *m, const ActivShape *x, CkptMode mode);
double activ_block_scores_bytes(const ModelSpec *m, const ActivShape *x, CkptMode mode);
double activ_checkpoint_bytes(const ModelSpec *m, const ActivShape *x, int partitioned);
double activ_moe_block_bytes(const ModelSpec *m, const ActivShape *x, CkptMode mode,
			     long long slots);
double activ_embed_bytes(const ModelSpec *m, const ActivShape *x);
double activ_head_bytes(const ModelSpec *m, const ActivShape *x);
double activ_ends_bytes(const ModelSpec *m, const ActivShape *x);

#endif

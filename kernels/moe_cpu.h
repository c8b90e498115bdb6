/* moe_cpu: a GPT-2 block whose MLP is a Mixture-of-Experts layer as DeepSpeed's
 * deepspeed/moe/sharded_moe.py computes it (TopKGate with k = 1 or 2, MOELayer's dispatch and
 * combine), on one expert-parallel rank, in fp32 or in 16-bit mixed precision (below). It owns the gating (softmax router, top-k, the
 * capacity and which tokens are dropped, the combine weights), the (E, capacity, C) dispatch
 * layout, the local experts' MLPs forward and backward, the block's parameter and saved-activation
 * layouts and its deterministic init. The all-to-alls are the caller's (MoeCpu's callback: an MPI
 * communicator or a test's in-process exchange); which op runs when is the executor's. */
#ifndef PX_MOE_CPU_H
#define PX_MOE_CPU_H

#include <stddef.h>
#include <stdint.h>

#include "gpt_cpu.h"
#include "gpt_tp_cpu.h"
#include "precision.h"

/* Dimension names as in ops_cpu.h (B, T, C, N = B T); S = N tokens this rank gates, E experts,
 * E_l = E / ep local experts, k experts per token, cap = the capacity (tokens per expert),
 * slots = E cap, I = the experts' intermediate size (GPT-2's 4 C).
 *
 * Gating, per micro-batch on each rank (sharded_moe.py top1gating / top2gating with
 * drop_tokens, no noisy gate, top2_2nd_expert_sampling off; the gate in fp32):
 *   logits (S, E) = ln2(x) wg, wg (C, E) without bias; probs = softmax(logits) per token;
 *   e1 = argmax probs (the first on ties, as torch.argmax); top-2: e2 = argmax of the logits
 *   without e1;
 *   location of a token at expert e = the tokens before it (in token order) sent to e as their
 *   first choice; a second choice comes after every first choice of its expert (top2gating adds
 *   the first choices' count);
 *   a choice is kept when its location < cap (tokens over capacity dropped in order);
 *   top-1 with random token selection (use_rts, DeepSpeed's default): of the tokens whose
 *   choice is e, the cap of highest priority are kept (_top_idx: torch.topk of mask1 x uniform
 *   over the tokens), and the kept ones take their locations in token order (the cumsum of the
 *   new mask); a token's priority is moe_cpu_rts_priority's, not torch's draw;
 *   top-1's combine weight is probs[e1]; top-2's are probs[e] of the kept choices over their sum
 *   (the sum clamped below at fp32's epsilon, so a token with both dropped gets 0 and 0);
 *   a dropped token's MLP output is 0: the block passes its residual on.
 * Top-2 with Gumbel sampling of the second expert (top2_2nd_expert_sampling, DeepSpeed's
 * default): the logits, once the probabilities are taken from them, get Gumbel noise added in
 * place (logits += gumbel_rsample(...)), and the second choice is the argmax of the noisy ones
 * without e1; moe_cpu_gumbel's noise, not torch's draw. The backward routes from the saved,
 * noisy logits: the same choices.
 *
 * In 16-bit (MoeCpu.t bf16 or fp16: bf16/fp16 training, the engine having cast the module) the
 * block computes as kernels/gpt16_cpu's, with ops16_cpu's rounding points: parameters, the hidden
 * stream, the saved tensors and everything the all-to-alls move of type t, gradients fp32 and
 * rounded to t where a product takes them or an all-to-all moves them. The gate is TopKGate's:
 * fp32 copies of its input and of the router's weight (input.float(), wg.weight.float()), kept for
 * the backward, fp32 logits, probabilities and combine weights. MOELayer's combine casts the
 * weights to t (combine_weights.type_as(input)) and sums each token's weighted outputs in fp32,
 * rounded once; the block's residual adds that to res2, rounded again. In fp32 every rounding is
 * the identity and the copies are not made. */

/* cap = max(ceil(k S / E x capacity_factor), min_capacity): _capacity(gates, capacity_factor x
 * k, min_capacity), S the tokens a rank gates. */
long long moe_cpu_capacity(long long S, long long E, int k, double capacity_factor,
			   long long min_capacity);

/* Where each token's choices go: per token s and choice j < k (index s k + j), the expert, the
 * slot in that expert's capacity (-1: dropped) and the combine weight (0 when dropped). */
typedef struct MoeRoute {
	int *expert, *slot;
	float *weight;
} MoeRoute;

/* Random token selection's priority of the token whose global index is token (its sequence's
 * index in the run's sample order x T + its position), in a draw named by stream: uniform in
 * [0, 1), 24 bits, a pure function of the two, so that every layout that gates the same token
 * (any ep, tp or dp, a recompute, the backward) gives it the same priority. */
float moe_cpu_rts_priority(uint64_t stream, uint64_t token);
/* Top-2's second-expert sampling: standard Gumbel noise -ln(-ln u), u uniform in (0, 1), for
 * expert e of the token whose global index is token, in the draw named by stream; a pure
 * function of the three. */
float moe_cpu_gumbel(uint64_t stream, uint64_t token, int e);

/* The gating above from logits and their softmax probs (S, E); route's arrays hold S k each.
 * prio: top-1's random token selection, token s's priority (S values; it may be route->weight,
 * which is then overwritten), or NULL for tokens over capacity dropped in order (and for
 * top-2, which has no selection). Returns DeepSpeed's auxiliary load-balancing loss,
 * E sum_e mean_s(probs[s, e]) x (fraction of tokens whose first choice is e, before any is
 * dropped) (both gatings' l_aux; the simulator does not price it and the executor does not add
 * it to the loss). */
double moe_cpu_route(const float *logits, const float *probs, int S, int E, int k, int cap,
		     const float *prio, MoeRoute *route);

/* One rank's view of its MoE layers: every rank of an expert-parallel group makes the same
 * calls in the same order. */
typedef struct MoeCpu {
	int E, k, cap, I;
	int ep, r;   /* the expert-parallel group's size and this rank in it: experts
			[r E/ep, (r+1) E/ep) are local */
	PrecisionType t; /* the compute type (PREC_F32 when zero-initialised) */
	void *ctx;   /* the caller's, passed to all_to_all */
	/* out (ep n) = from each rank q of the group, in rank order, the n elements (of type t) at
	 * q's in + r n; in and out do not overlap, and in may be overwritten. NULL for ep 1 without
	 * tensor parallelism (a copy). Under tensor parallelism (tp below) the same result is due,
	 * moved as DeepSpeed's MOELayer moves it (sharded_moe.py with Megatron's mpu): each
	 * tensor-parallel rank keeps its 1/t of every expert's capacity (drop_tokens), exchanges that
	 * over the expert-parallel group, and the group's pieces are all-gathered over the
	 * tensor-parallel ranks (gather_tokens); every tensor-parallel rank's in is the same. */
	void (*all_to_all)(void *ctx, void *in, void *out, size_t n);
	/* Tensor parallelism (NULL, or a group of one: none). The block's attention is
	 * kernels/gpt_tp_cpu's on this rank's shards (its collectives through tp's callbacks); the
	 * router and the local experts are whole on every tensor-parallel rank, which gate the same
	 * tokens and run the experts over every slot (the capacity gathered whole), so that their
	 * gradients are equal on every rank of the group. No sequence parallelism. */
	const GptTp *tp;
	/* Selective recompute: the attention probabilities are the caller's buffer (att below,
	 * (B, NH/t, T, T) of type t), not part of the saved activations, whose layout then has
	 * no room for them. */
	int scores_apart;
	/* Block-sparse attention (deepspeed.sparse_attention): the kept blocks of the heads this
	 * rank computes (all of them, or its tensor-parallel share), whose probabilities take the
	 * dense ones' place; NULL: dense. */
	const SparseIndex *ix;
	/* Random token selection (top-1 only; 0: tokens over capacity dropped in order): token s
	 * of the N = B T this rank gates has priority moe_cpu_rts_priority(rts_stream,
	 * rts_first + s). Gumbel sampling of the second expert (top-2 only; 0: the deterministic
	 * second choice): expert e's logit of token s gets moe_cpu_gumbel(rts_stream, rts_first +
	 * s, e). The caller names the draw and the micro-batch's first token before each forward
	 * and backward of a block: the backward routes again and must route alike. */
	int rts, gumbel;
	uint64_t rts_stream, rts_first;
	/* Dropless (DeepSpeed's drop_tokens off): the capacity is the busiest expert's count,
	 * all-reduced (max) over the expert-parallel group (under tensor parallelism rounded up
	 * to a multiple of t, the caller's: t must divide it). A forward is
	 * then two calls: moe_cpu_block_gate gives this rank's busiest count, the caller agrees it
	 * over the group and sets cap, and moe_cpu_block_experts runs the rest. The saved
	 * activations' slot part (disp, fc, gelu, eout: MoeBlockActs.slot_bytes at that cap) is the
	 * caller's buffer slot_acts, not in acts; the backward takes the forward's cap and
	 * slot_acts. */
	int dropless;
	void *slot_acts;
} MoeCpu;

/* 0, or -1 with err filled, unless gpt_cpu_check passes (gpt16_check in 16-bit), 1 <= k <= 2,
 * k <= E, rts only with k 1, gumbel only with k 2, ep divides E, 0 <= r < ep, cap >= 1, I = 4 C (gpt_cpu's MLP) and
 * all_to_all is set for ep > 1; under tensor parallelism gpt_tp_check passes, without sp, t
 * divides cap and all_to_all is set. */
int moe_cpu_check(const GptConfig *c, const MoeCpu *m, int B, int T, PxError *err);

/* ---- parameter layout ---- */

#define MOE_CPU_MAX_TENSORS 13

/* An MoE block's tensors on this rank, engine/model.c's names and order: gpt_cpu's first eight
 * (norm1 .. norm2; gpt_tp_cpu's shards of them under tensor parallelism), then mlp.router.weight (C, E), and the local experts' mlp.fc.weight
 * (E_l, C, I), mlp.fc.bias (E_l, I), mlp.down.weight (E_l, I, C), mlp.down.bias (E_l, C), each
 * expert's slice contiguous, local expert 0 first. Returns their count. */
int moe_cpu_unit_tensors(const GptConfig *c, const MoeCpu *m, GptTensor out[MOE_CPU_MAX_TENSORS]);
size_t moe_cpu_unit_params(const GptConfig *c, const MoeCpu *m);

/* gpt_cpu_init_unit's values for the shared tensors (the same stream per tensor; this rank's
 * shard of them, gpt_tp_init_unit's, under tensor parallelism), the router
 * normal(0, GPT_CPU_INIT_STD) and each expert's tensors as a dense MLP's (weights normal, down
 * scaled by 1 / sqrt(2 L), biases 0), each expert drawn from a stream of its own: a rank draws
 * only its local experts, and any ep gives the same model. */
void moe_cpu_init_unit(const GptConfig *c, const MoeCpu *m, int unit, float *params,
		       uint64_t seed);

/* ---- saved activations and scratch ---- */

/* Offsets in an MoE block's saved activations, each in elements of its own type from the
 * buffer's start: the gate's fp32 tensors first, then those of type t (gpt_cpu's attention part,
 * then the MoE MLP's). In fp32 the two units are one. */
typedef struct MoeBlockActs {
	size_t logits, probs; /* fp32 (N, E) each */
	size_t gate_x, gate_w; /* 16-bit only: fp32 copies of ln2 (N, C) and the router (C, E) */
	size_t x_in, ln1, qkv, atty, res2; /* (N, C) (N, C) (N, 3C/t) (N, C/t) (N, C) */
	size_t att;    /* (B, NH/t, T, T): t the tensor-parallel degree, 1 without (the kept
			  blocks' probabilities under ix); none under scores_apart */
	size_t ln2;    /* (N, C) the router's and the dispatch's input */
	size_t disp;   /* (ep, E_l, cap, C) the tokens the local experts received, by source rank */
	size_t fc, gelu; /* (ep, E_l, cap, I) each */
	size_t eout;   /* (E, cap, C) the experts' outputs for this rank's tokens, come back; these
			  four from slot_acts' start when dropless */
	size_t total_bytes; /* 4 (2 N E) + bytes(t) (N (4 C + (4 C + NH T) / t) + slots (2 C +
			       2 I)), and in 16-bit 4 (N C + C E) more; dropless, without the
			       slots' part */
	size_t slot_bytes;  /* the slots' part, bytes(t) slots (2 C + 2 I) */
} MoeBlockActs;
MoeBlockActs moe_cpu_block_acts(const GptConfig *c, const MoeCpu *m, int B, int T);
/* total_bytes: engine/activ.c's MoE block for bytes(t) activations (DeepSpeed's gate), no dropout,
 * no recompute. */
size_t moe_cpu_block_act_bytes(const GptConfig *c, const MoeCpu *m, int B, int T);
/* Scratch of an MoE block's forward or backward: the larger of gpt_cpu's 8 N C and the MoE
 * MLP's backward (two slots x C exchange buffers, two cap x I expert temporaries, the (N, C)
 * gradient of ln2, two (N, E) gate gradients), plus the route (3 N k): floats, x 4 bytes, in
 * either type (what 16-bit keeps in t takes no more room than in fp32). */
size_t moe_cpu_scratch_bytes(const GptConfig *c, const MoeCpu *m, int B, int T);

/* ---- the block ---- */

/* The most choices any expert gets from the S tokens (logits and probs as moe_cpu_route's): top-1
 * each token's first choice, top-2 its two (DeepSpeed's exp_counts, the dropless capacity). */
long long moe_cpu_busiest(const float *logits, const float *probs, int S, int E, int k);

/* y (N, C) = x + attn(ln1(x)), then + moe(ln2(.)); y may be x. Two all-to-alls of E_l cap C
 * elements per rank (dispatch, then combine). params, x, y of type m->t. att: the attention
 * probabilities' buffer under scores_apart, else NULL. */
void moe_cpu_block_forward(const GptConfig *c, const MoeCpu *m, int B, int T, const void *params,
			   const void *x, void *y, void *acts, void *att, float *scratch);
/* The forward in two, dropless: the attention and the gate's logits and probabilities into acts,
 * returning this rank's busiest count (moe_cpu_busiest); then, with cap and slot_acts set, the
 * routing, the all-to-alls, the experts and the combine into y. moe_cpu_block_forward is the
 * two at the fixed cap. */
long long moe_cpu_block_gate(const GptConfig *c, const MoeCpu *m, int B, int T, const void *params,
			     const void *x, void *acts, void *att, float *scratch);
void moe_cpu_block_experts(const GptConfig *c, const MoeCpu *m, int B, int T, const void *params,
			   void *y, void *acts, float *scratch);
/* Selective recompute: att rebuilt from the block's kept q, k, v (and the attention output
 * rewritten with what it holds), bit for bit the forward's, with no collective. */
void moe_cpu_block_scores(const GptConfig *c, const MoeCpu *m, int B, int T, void *acts,
			  void *att);
/* gpt_cpu_block_backward's contract: grads ACCUMULATED (router and local experts included), dx
 * WRITTEN, dx may be dy. Two all-to-alls as forward's (the combine's gradient to the experts,
 * the dispatch's back). grads, dy and dx fp32. */
void moe_cpu_block_backward(const GptConfig *c, const MoeCpu *m, int B, int T,
			    const void *params, float *grads, const void *acts, const void *att,
			    const float *dy, float *dx, float *scratch);

#endif

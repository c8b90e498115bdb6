/* gpt_tp_cpu: gpt_cpu's GPT-2 units on one tensor-parallel rank, r of t, split as Megatron-LM
 * splits them (Shoeybi et al. 2019, section 3; sequence parallelism after Korthikanti et al. 2022,
 * section 4.2.2) and as engine/model.c marks its tensors tp_split. It owns the shard layouts, the
 * cutting of shards out of whole tensors (and the drawing of a shard's initial values), the
 * rank's saved activations and where the collectives go. The collectives are the caller's
 * (GptTp's callbacks: an MPI or NCCL communicator, or a test's in-process sum); so is the
 * all-reduce of the replicated parameters' gradients under sequence parallelism.
 *
 * The units compute in a PrecisionType dt as gpt16_cpu's do: parameters, the hidden stream and the
 * saved activations of type dt, gradients fp32, every 16-bit rounding at ops16_cpu's points; at
 * PREC_F32 they are gpt_cpu's operations. The collectives move what Megatron's move, in dt (the
 * schedule's element size): the row-split layers' rounded partial outputs, the norm outputs and
 * gradient rows gathered under sequence parallelism, and the column-split layers' input-gradient
 * partial sums, rounded to dt to cross the group and widened back to fp32 after it; only the
 * cross-entropy's per-token statistics stay fp32. */
#ifndef PX_GPT_TP_CPU_H
#define PX_GPT_TP_CPU_H

#include <stddef.h>
#include <stdint.h>

#include "gpt_cpu.h"
#include "precision.h"

/* Dimension names as in ops_cpu.h; t the tensor-parallel degree, r this rank (0..t-1). On rank r:
 *   heads [r NH/t, (r+1) NH/t), so c_attn's q, k and v columns of those heads: (C, 3C/t) stored
 *     [q_r | k_r | v_r], which is the layout ops_attention takes for C/t channels and NH/t heads;
 *   mlp.fc's columns [r 4C/t, (r+1) 4C/t): (C, 4C/t), and its bias's;
 *   attn.o's rows [r C/t, (r+1) C/t): (C/t, C); mlp.down's rows [r 4C/t, (r+1) 4C/t): (4C/t, C);
 *     their biases whole (a row-split layer adds one bias to the reduced sum);
 *   embed.tokens's rows [r V/t, (r+1) V/t) (vocabulary-parallel), which the tied head uses too;
 *   norms and embed.positions whole.
 * Tensors keep gpt_cpu's order inside a unit (engine/model.c's), each at its shard's size. */

/* ---- the group ---- */

typedef enum { GPT_TP_SUM, GPT_TP_MAX } GptTpOp;

/* One rank's view of its tensor-parallel group. Every rank of the group makes the same calls in
 * the same order with the same n; each returns when the collective is complete on this rank.
 * With sequence parallelism (sp), the (N, C) activations between the column- and row-split
 * layers' regions (norm inputs and outputs, residuals, the blocks' inputs and outputs) are split
 * by rows: rank r holds rows [r N/t, (r+1) N/t) of the (B T, C) stream, and all_gather /
 * reduce_scatter take the all-reduces' place. */
typedef struct GptTp {
	int r, t;  /* this rank, the group's size */
	int sp;    /* sequence parallelism */
	void *ctx; /* the caller's, passed to every callback */
	/* Each buffer holds n values of type dt (an element size the schedule states per op).
	 * buf (n) = op over the group's bufs, element by element, on every rank */
	void (*all_reduce)(void *ctx, void *buf, size_t n, PrecisionType dt, GptTpOp op);
	/* out (t n) = the ranks' in (n) side by side in rank order; in and out do not overlap */
	void (*all_gather)(void *ctx, const void *in, void *out, size_t n, PrecisionType dt);
	/* out (n) = rank r's n-slice of the group's ins (t n) summed; in and out do not overlap */
	void (*reduce_scatter)(void *ctx, const void *in, void *out, size_t n, PrecisionType dt);
} GptTp;

/* 0, or -1 with err filled, unless gpt_cpu_check passes, 0 <= r < t, t divides NH (whole heads
 * a rank) and V (Megatron pads the vocabulary to a multiple of t), t divides B T under sp, and
 * the callbacks the layout calls are set (all_reduce for t > 1; the other two under sp). */
int gpt_tp_check(const GptConfig *c, const GptTp *tp, int B, int T, PxError *err);

/* Rows of the (B T, C) stream this rank holds between layers: B T, or B T / t under sp. */
int gpt_tp_rows(const GptTp *tp, int B, int T);

/* ---- shard layout ---- */

/* The tensors of a unit on one rank (names as gpt_cpu_unit_tensors, numel the shard's); every
 * rank's shard of a unit has the same size. */
int gpt_tp_unit_tensors(const GptConfig *c, int t, int unit, GptTensor out[GPT_CPU_MAX_TENSORS]);
size_t gpt_tp_unit_params(const GptConfig *c, int t, int unit);
/* Element offsets of a block's tensors in its shard (the sizes in the comment above). */
GptBlockLayout gpt_tp_block_layout(const GptConfig *c, int t);

/* shard (gpt_tp_unit_params) = rank r's part of whole, one unit in gpt_cpu's layout
 * (gpt_cpu_unit_params). */
void gpt_tp_shard_unit(const GptConfig *c, int t, int r, int unit, const float *whole,
		       float *shard);
/* The inverse: rank r's part of whole written from shard (the replicated tensors copied whole);
 * the rest of whole untouched. Each rank's call fills its part, so t calls rebuild a unit. */
void gpt_tp_unshard_unit(const GptConfig *c, int t, int r, int unit, const float *shard,
			 float *whole);
/* gpt_cpu_init_unit's values of rank r's shard, bit for bit, drawn without the whole unit in
 * memory: the same seed gives the same model whatever t is. */
void gpt_tp_init_unit(const GptConfig *c, int t, int r, int unit, float *shard, uint64_t seed);

/* ---- saved activations and scratch ---- */

/* A block's saved activations on one rank, gpt_cpu's fields at this rank's sizes (R = the
 * rows gpt_tp_rows gives):
 *   x_in, ln1, res2, ln2 (R, C) each;  qkv (N, 3C/t), atty (N, C/t), fc and gelu (N, 4C/t),
 *   att (B, NH/t, T, T): 4 B T (4 C (R / N) + 12 C / t + NH T / t) bytes, engine/activ.c's
 *   per-rank figure for fp32 without dropout. Under sp the column-split layers' gathered inputs
 *   are not kept: backward gathers them again (Korthikanti et al., section 4.2.2). */
GptBlockActs gpt_tp_block_acts(const GptConfig *c, const GptTp *tp, int B, int T);
/* the fields above in dt: d (elements) bytes */
size_t gpt_tp_block_act_bytes(const GptConfig *c, const GptTp *tp, PrecisionType dt, int B, int T);
/* The head keeps its input and final-norm output (R, C) each in dt, and its V/t probabilities
 * (N, V/t) in fp32: 2 d R C + 4 N V / t bytes. The embeddings keep nothing. */
size_t gpt_tp_head_act_bytes(const GptConfig *c, const GptTp *tp, PrecisionType dt, int B, int T);
/* Scratch for any one unit's forward or backward on this rank, in any dt (the 16-bit values take
 * the places of fp32 ones, and round and widen the collectives' gradients in place). */
size_t gpt_tp_scratch_bytes(const GptConfig *c, const GptTp *tp, int B, int T);

/* ---- layer units ---- */

/* As gpt_cpu's units: params and grads are the rank's shard of the unit (gpt_tp_unit_tensors),
 * backwards ACCUMULATE into grads and WRITE dx. Activations x, y, dy, dx are (R, C): whole and
 * the same on every rank without sp, rank r's rows under sp. Gradients of split tensors are this
 * rank's, complete. Gradients of replicated tensors (norms, the row-split layers' biases,
 * embed.positions): without sp complete and equal on every rank; under sp the share of this
 * rank's rows, which the caller all-reduces over the group before the optimizer (Megatron's
 * finalize_model_grads). Collectives, in call order (n in elements, N = B T, R as above):
 *   embed forward   all_reduce N C; sp: reduce_scatter to R C
 *   embed backward  sp: all_gather of dy, R C each
 *   block forward   per branch (attention, then MLP): sp: all_gather of the norm's output, R C
 *                   each; then all_reduce N C of the row-split layer's output (sp: reduce_scatter)
 *   block backward  per branch (MLP, then attention): sp: all_gather of dy, then of the norm's
 *                   output again; all_reduce N C of the norm's output gradient (sp:
 *                   reduce_scatter)
 *   head forward    sp: all_gather of the final norm's output; all_reduce N (max, GPT_TP_MAX),
 *                   all_reduce 2N (sum of exponentials and target logit, GPT_TP_SUM)
 *   head backward   sp: all_gather of the final norm's output again; all_reduce N C of its
 *                   input gradient (sp: reduce_scatter) */

/* y (R, C) = token embeddings of tokens (B, T) from this rank's vocabulary rows, summed over the
 * group, plus positions. params: unit 0's shard; scratch: gpt_tp_scratch_bytes (used under sp).
 * Under sp the sum is reduce-scattered and each rank adds its rows' positions (what
 * engine/build.c charges; Megatron-LM, with learned positions, all-reduces the token embeddings,
 * adds the positions and keeps its rows: the same values for t times the traffic). */
void gpt_tp_embed_forward(const GptConfig *c, const GptTp *tp, PrecisionType dt, int B, int T,
			  const void *params, const int *tokens, void *y, float *scratch);
/* dy (R, C) fp32; scratch: gpt_tp_scratch_bytes (used under sp, where dy's rows cross the group
 * in dt). */
void gpt_tp_embed_backward(const GptConfig *c, const GptTp *tp, PrecisionType dt, int B, int T,
			   float *grads, const int *tokens, const float *dy, float *scratch);

/* y = block(x) on this rank; y may be x. acts: gpt_tp_block_act_bytes; scratch:
 * gpt_tp_scratch_bytes (used under sp). The row-split layers' bias goes into rank 0's partial
 * product before the reduction (Megatron adds it after the reduction on every rank: the same sum
 * rounded in another order); that way t = 1 is gpt_cpu_block_forward (gpt16_block_forward in
 * 16-bit) bit for bit. x, y of type dt. */
void gpt_tp_block_forward(const GptConfig *c, const GptTp *tp, PrecisionType dt, int B, int T,
			  const void *params, const void *x, void *y, void *acts, float *scratch);
/* dy, dx fp32; dx may be dy. At t = 1 gpt_cpu_block_backward's (gpt16_block_backward's) bits: a
 * group of one rounds nothing to cross it. */
void gpt_tp_block_backward(const GptConfig *c, const GptTp *tp, PrecisionType dt, int B, int T,
			   const void *params, float *grads, const void *acts, const float *dy,
			   float *dx, float *scratch);

/* Selective recompute, as gpt_cpu's _att units: this rank's probabilities att (B, NH/t, T, T) of
 * type dt apart from acts, which then needs only the elements before gpt_tp_block_acts' att
 * offset; gpt_tp_block_scores rebuilds them (and the attention output) from the kept q, k, v
 * before the backward, bit for bit the forward's, with no collective. */
/* ix (NULL: dense): block-sparse attention over this rank's heads' kept blocks (an index of
 * NH/t heads), their probabilities where the dense ones would be (att, or acts' att offset,
 * gpt_tp_block_sparse_act_bytes in all). */
void gpt_tp_block_forward_att(const GptConfig *c, const GptTp *tp, PrecisionType dt, int B, int T,
			      const void *params, const void *x, void *y, void *acts, void *att,
			      const SparseIndex *ix, float *scratch);
void gpt_tp_block_scores(const GptConfig *c, const GptTp *tp, PrecisionType dt, int B, int T,
			 void *acts, void *att, const SparseIndex *ix);
void gpt_tp_block_backward_att(const GptConfig *c, const GptTp *tp, PrecisionType dt, int B,
			       int T, const void *params, float *grads, const void *acts,
			       const void *att, const SparseIndex *ix, const float *dy, float *dx,
			       float *scratch);
size_t gpt_tp_block_sparse_act_bytes(const GptConfig *c, const GptTp *tp, PrecisionType dt, int B,
				     int T, const SparseIndex *ix);

/* The block's attention branch alone, as the block runs it, on any buffer holding its tensors at
 * lay's offsets (this rank's shards) and its saved activations at a's (elements of dt):
 * forward res2 = x_in + o(attention(qkv(ln1(x_in)))) with x_in already in acts; backward with
 * d res2 (fp32, this rank's rows) in dx on entry, d x_in on return, the branch's parameter
 * gradients accumulated; scratch as gpt_tp_scratch_bytes; att: this rank's probabilities apart
 * from acts (selective recompute), or NULL: at a's att. Its collectives are the block's
 * attention half (above). kernels/moe_cpu's blocks use them under tensor parallelism. */
void gpt_tp_attention_forward(const GptConfig *c, const GptTp *tp, PrecisionType dt, int B,
			      int T, const GptBlockLayout *lay, const GptBlockActs *a,
			      const void *params, void *acts, void *att, const SparseIndex *ix,
			      float *scratch);
void gpt_tp_attention_backward(const GptConfig *c, const GptTp *tp, PrecisionType dt, int B,
			       int T, const GptBlockLayout *lay, const GptBlockActs *a,
			       const void *params, float *grads, const void *acts, const void *att,
			       const SparseIndex *ix, float *dx, float *scratch);

/* Final norm, this rank's V/t logits against the tied embedding's shard (wte: unit 0's first
 * V C / t elements), and Megatron's vocabulary-parallel cross-entropy: each token's max logit,
 * sum of exponentials and target logit reduced over the group. Returns the mean loss over the
 * B T targets, the same on every rank (0 when targets is NULL: probabilities only). */
float gpt_tp_head_forward(const GptConfig *c, const GptTp *tp, PrecisionType dt, int B, int T,
			  const void *params, const void *wte, const void *x, const int *targets,
			  void *acts, float *scratch);
/* This rank's probabilities (B T, V/t), fp32, in the head's acts, for columns
 * [r V/t, (r+1) V/t). */
float *gpt_tp_head_probs(const GptConfig *c, const GptTp *tp, PrecisionType dt, int B, int T,
			 const void *acts);
/* As gpt_cpu_head_backward: grads (final norm) and dwte (this rank's rows) accumulated, dx (R, C)
 * fp32 written; the probabilities in acts become dlogits (in 16-bit rounded to dt in place, the
 * products' operands, packed at the start of the probabilities' space). */
void gpt_tp_head_backward(const GptConfig *c, const GptTp *tp, PrecisionType dt, int B, int T,
			  const void *params, const void *wte, float *grads, float *dwte,
			  void *acts, const int *targets, float dloss, float *dx, float *scratch);

#endif

#include "build_priv.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

long long build_qwz_groups(long long elems)
{
	if (elems <= 0)
		return -1;
	long long g = ceil_div(elems, BUILD_QWZ_TARGET_GROUP);
	while (g < elems && elems % (8 * g))
		g++;
	while (elems % (16 * g) == 0 && elems / g > BUILD_QWZ_TARGET_GROUP)
		g *= 2;
	return elems % (8 * g) == 0 && elems > g ? g : -1;
}

/* qwZ's scales for a gather of n elements over k ranks: each rank's n / k in its groups (a piece
 * DeepSpeed cannot group is counted in groups of the target size: the executor refuses it). */
static long long qwz_scales(long long n, long long k)
{
	long long g = build_qwz_groups(n / k);
	return k * (g > 0 ? g : ceil_div(n / k, BUILD_QWZ_TARGET_GROUP));
}

/* ---- set-up: what lives for the whole run ---- */


static void setup(Builder *b)
{
	const Plan *p = b->p;
	const StagePlan *st = &p->stages[b->stage];
	const ClusterSpec *c = &p->sc->cluster;
	const DsZero *z = &p->sc->ds.zero;
	double part = (double)st->part_elems, flat = (double)(st->flat_dense + st->flat_expert);

	if (p->cuda_runtime) { /* the CUDA runtime's own memory */
		alloc(b, PLACE_GPU, CAT_OVERHEAD, BUF_CUDA_CONTEXT, -1, c->cuda_context_bytes);
		alloc(b, PLACE_GPU, CAT_OVERHEAD, BUF_CUBLAS_WORKSPACE, -1, c->cublas_workspace_bytes);
		alloc(b, PLACE_GPU, CAT_OVERHEAD, BUF_NCCL, -1, c->nccl_buffers_bytes);
	}
	if (p->sc->ds.dtype == DT_FP16) /* loss scale and overflow flag */
		alloc(b, PLACE_GPU, CAT_OVERHEAD, BUF_LOSS_SCALER, -1, 8);

	if (p->stage < 3) {
		b->id_params = alloc(b, PLACE_GPU, CAT_PARAMS, BUF_PARAMS, -1, flat * p->param_bytes);
		if (p->stage < 2)
			b->id_grads = alloc(b, PLACE_GPU, CAT_GRADS, BUF_GRADS, -1, flat * p->grad_bytes);
		/* BF16_Optimizer's bf16 .grad tensors: each backward drops them first
		 * (clear_lp_grads) and autograd makes them again as it goes, so that they are
		 * whole from one backward to the next, through the optimizer step and the next
		 * forward. The schedule holds them whole throughout: exact wherever they are
		 * whole, as at the end of every forward; a backward's early moments are
		 * over-stated by the .grad tensors it has not made yet (docs/models.md). */
		if (p->bf16_optimizer)
			b->id_lp = alloc(b, PLACE_GPU, CAT_GRADS, BUF_LP_GRADS, -1,
					 flat * p->param_bytes);
		if (p->sc->framework == FRAMEWORK_PYTORCH && p->dp > 1)
			b->id_ddp = alloc(b, PLACE_GPU, CAT_BUFFERS, BUF_DDP_BUCKETS, -1,
					  (double)st->local_dense * p->grad_bytes);
	} else {
		/* parameters on NVMe: DeepSpeed's pinned host flat, holding the partition's first
		 * sub-groups, and the rest on NVMe (plan.c plan_param_host) */
		int nvme = p->param_place == PLACE_NVME;
		b->id_part = alloc(b, nvme ? PLACE_CPU : p->param_place, CAT_PARAMS, BUF_PARAM_PART,
				   -1, (nvme ? (double)st->param_host_flat : part) * p->shard_bytes);
		if (nvme && st->param_resident < st->part_elems)
			alloc(b, PLACE_NVME, CAT_PARAMS, BUF_PARAM_SWAP, -1,
			      (double)(st->part_elems - st->param_resident) * p->param_bytes);
		/* padded to dp, so that their collectives can run in place */
		double persist = (double)(ceil_div(st->persist_elems, p->dp) * p->dp);
		b->id_persist = alloc(b, PLACE_GPU, CAT_PARAMS, BUF_PERSISTENT, -1,
				      persist * p->param_bytes);
		b->id_grads = alloc(b, PLACE_GPU, CAT_GRADS, BUF_PERSIST_GRADS, -1,
				    persist * p->grad_bytes);
		/* hpZ's secondary partition lies where the primary does: on the host under
		 * parameter offload (partition_parameters.py _partition_param_sec allocates it on
		 * remote_device, pinned) */
		alloc(b, p->param_place == PLACE_CPU ? PLACE_CPU : PLACE_GPU, CAT_PARAMS,
		      BUF_SECONDARY, -1, (double)st->secondary_elems * p->param_bytes);
		if (p->param_place == PLACE_NVME)
			alloc(b, PLACE_CPU, CAT_BUFFERS, BUF_PARAM_STAGING, -1,
			      (double)z->offload_param.buffer_count * z->offload_param.buffer_size *
				      p->param_bytes);
	}
	/* the reduced gradients' partition in the accumulation dtype: on the device, or at stage 3
	 * under offload on the host (stage3.py grad_partitions_flat_buffer, on its self.device);
	 * stage 1-2 offload reduces straight into the host's fp32 gradients (stage_1_and_2.py) */
	Place gp = p->opt_place == PLACE_GPU ? PLACE_GPU : PLACE_CPU;
	if ((p->stage == 3 && !p->fsdp) || (p->stage == 2 && gp == PLACE_GPU)) /* FSDP: per unit */
		b->id_gradpart = alloc(b, gp, CAT_GRADS, BUF_GRAD_PART, -1, part * p->grad_bytes);
	/* the fp32 gradients the host's optimizer reads: with the optimizer on NVMe they live in
	 * the swap buffer while a sub-group steps, and in their files between steps (its
	 * initialize_optimizer_states' gradient_buffer does not outlive the call); FSDP's
	 * CPUOffload pins them at wrapping (flat_param._cpu_grad) */
	if (p->stage >= 1 && p->opt_place == PLACE_CPU)
		alloc(b, PLACE_CPU, CAT_GRADS, BUF_GRAD_FP32, -1, part * 4);

	/* ZeRO 1-2 with the optimizer on the CPU (stage_1_and_2.py __init__ under cpu_offload): two
	 * buffers of the largest parameter in the model's dtype, one on each side; with gradient
	 * accumulation, the host's copy of the partition's gradients in the parameters' dtype
	 * (accumulated_grads_in_cpu, made by copy_grads_in_partition, which runs with contiguous
	 * gradients). DeepSpeed keeps each tensor the partition touches there whole; the tensors'
	 * parts beyond the partition's ends, which differ rank to rank, are left out. */
	if (p->stage >= 1 && p->stage <= 2 && p->opt_place == PLACE_CPU) {
		double big = (double)st->max_tensor * p->param_bytes;
		alloc(b, PLACE_GPU, CAT_BUFFERS, BUF_OFFLOAD_GPU_TEMP, -1, big);
		alloc(b, PLACE_CPU, CAT_BUFFERS, BUF_OFFLOAD_CPU_TEMP, -1, big);
		if (p->m > 1 && p->contiguous_grads)
			alloc(b, PLACE_CPU, CAT_GRADS, BUF_ACCUM_GRADS, -1, part * p->param_bytes);
	}
	if (p->opt_place == PLACE_NVME) /* the gradients' swap files beside the states' */
		alloc(b, PLACE_NVME, CAT_GRADS, BUF_GRAD_SWAP, -1, part * 4);
	alloc(b, p->opt_place, CAT_OPTIM, BUF_MASTER, -1, part * p->master_bytes);
	alloc(b, p->opt_place, CAT_OPTIM, BUF_OPT_STATES, -1, st->opt_state_bytes);
	if (st->error_feedback_bytes > 0)
		b->id_ef = alloc(b, p->opt_place, CAT_OPTIM, BUF_ERROR_FEEDBACK, -1,
				 st->error_feedback_bytes);
	if (p->opt_place == PLACE_NVME) /* each swap buffer holds one fp32 tensor of the largest
					   sub-group (plan.c plan_subgroups) */
		alloc(b, PLACE_CPU, CAT_BUFFERS, BUF_SWAP, -1,
		      (double)z->offload_optimizer.buffer_count * (double)st->step_elems * 4);
	/* a stage holding a chunk before the model's last receives gradients from the next stage
	 * into one buffer, allocated at its first receive and kept (DeepSpeed's grad_layer) */
	if (p->par.pp > 1 && (b->stage < p->par.pp - 1 || p->par.virtual_stages > 1))
		b->id_pipe_grad = alloc(b, PLACE_GPU, CAT_BUFFERS, BUF_PIPE_GRAD, -1,
					(double)build_pipe_elems(p) * p->param_bytes);
	if (p->stage == 3) /* stage 3's contiguous gradient buffer lives as long as the optimizer */
		build_alloc_buckets(b, 1);
}

/* ---- stage 3: gathering units ---- */

void build_gather(Builder *b, int u, int backward)
{
	const Plan *p = b->p;
	const UnitPlan *up = &p->units[u];
	long long whole = up->gather_dense + up->gather_expert;
	if (b->gathered[u] >= 0 || whole == 0)
		return;
	long long off[2], len[2]; /* the partition slices it reads */
	plan_gather_slices(p, u, off, len);
	/* hpZ's gathers read the secondary partition instead: 1/hpz of each dense piece */
	int secondary = (backward || b->secondary_held) && p->hpz > 1;
	double part_bytes = (secondary ? (double)(up->gather_dense / p->hpz + up->part_expert) :
					 (double)(len[0] + len[1])) * p->shard_bytes;
	/* from NVMe: those partitions beyond what the host flat holds (plan_param_host) */
	long long swapped = 0, resident = p->stages[b->stage].param_resident;
	for (int k = 0; k < 2; k++)
		swapped += off[k] + len[k] - min_ll(off[k] + len[k], max_ll(off[k], resident));
	if (p->param_place == PLACE_NVME && swapped > 0)
		copy(b, COPY_NVME_READ, ROLE_PREFETCH, u, (double)swapped * p->param_bytes);
	if (p->param_place != PLACE_GPU)
		copy(b, COPY_H2D, ROLE_PREFETCH, u, part_bytes);
	/* FSDP2 gathers into the group's all-gather output, then copies it out into the unsharded
	 * parameters, allocated then (foreach_all_gather_copy_out), and frees it: both live at the
	 * copy (its kernel is not timed) */
	int ag = p->fsdp2 ? alloc(b, PLACE_GPU, CAT_BUFFERS, BUF_FSDP_AG_OUTPUT, u,
				  (double)whole * p->param_bytes) : -1;
	int id = b->gathered[u] = ag >= 0 ? ag : alloc(b, PLACE_GPU, CAT_PARAMS, BUF_GATHERED, u,
						       (double)whole * p->param_bytes);
	/* the unit's own flat, then (a tied head) the embedding's flat after it; op->unit names
	 * whose partition is gathered, the slice where this rank's piece of it lies (hpZ's: in the
	 * secondary partition) */
	long long pieces[2][2] = {{u, up->own_gather}, {0, up->gather_dense - up->own_gather}};
	long long at = 0;
	for (int k = 0; k < 2; k++) {
		int src = (int)pieces[k][0];
		long long n = pieces[k][1];
		long long h = p->hpz;
		if (secondary)
			/* hpZ: from the secondary partition, inside the node; qwZ quantizes it too
			 * (DeepSpeed's all_gather_coalesced takes the same quantize flag for either
			 * partition) */
			slice(b, p->qwz ? quantized(b, COLL_ALL_GATHER, ROLE_PREFETCH, GROUP_HPZ, src, n,
						    8, qwz_scales(n, h), id, at)
					: coll(b, COLL_ALL_GATHER, ROLE_PREFETCH, GROUP_HPZ, src, n,
					       p->param_bytes, id, at),
			      -1, p->units[src].secondary_off, n / h);
		else if (p->qwz) /* qwZ: INT8 weights with their scales */
			slice(b, quantized(b, COLL_ALL_GATHER, ROLE_PREFETCH, GROUP_DP, src, n, 8,
					   qwz_scales(n, p->dp), id, at),
			      -1, p->units[src].part_off, n / p->dp);
		else /* over the partition's group (FSDP's HYBRID_SHARD: the node's) */
			slice(b, coll(b, COLL_ALL_GATHER, ROLE_PREFETCH, p->shard_group, src, n,
				      p->param_bytes, id, at), -1, p->units[src].part_off,
			      n / p->shards);
		at += n;
	}
	slice(b, coll(b, COLL_ALL_GATHER, ROLE_PREFETCH, GROUP_EDP, u, up->gather_expert,
		      p->param_bytes, id, at), -1, up->part_off + up->part_dense, up->part_expert);
	if (ag >= 0) {
		b->gathered[u] = alloc(b, PLACE_GPU, CAT_PARAMS, BUF_GATHERED, u,
				       (double)whole * p->param_bytes);
		release(b, &ag);
	}
	b->live_elems += (double)whole;
}

void build_ungather(Builder *b, int u)
{
	if (b->gathered[u] < 0)
		return;
	release(b, &b->gathered[u]);
	b->live_elems -= (double)(b->p->units[u].gather_dense + b->p->units[u].gather_expert);
}

/* Gather u, then prefetch the units that follow in direction dir while the not-yet-used gathered
 * elements stay within stage3_prefetch_bucket_size and everything live within
 * stage3_max_live_parameters. */
static void gather_with_prefetch(Builder *b, int u, int dir)
{
	const Plan *p = b->p;
	const DsZero *z = &p->sc->ds.zero;
	double ahead = 0;

	build_gather(b, u, dir < 0);
	for (int j = u + dir; j >= 0 && j < p->n_units; j += dir) {
		double g = (double)(p->units[j].gather_dense + p->units[j].gather_expert);
		if (g == 0)
			continue;
		if (ahead + g > z->prefetch_bucket_elems)
			break;
		ahead += g;
		if (b->gathered[j] >= 0)
			continue;
		if (b->live_elems + g > z->max_live_elems)
			break;
		build_gather(b, j, dir < 0);
	}
}

/* ---- one unit, forward and backward ---- */

static int is_block(const Plan *p, int u)
{
	return u >= 1 && u <= p->sc->model.L;
}

/* Megatron's tensor-parallel collectives around a unit, one per sublayer of the unit's own
 * tokens (b s h elements; b s_dec h in an encoder-decoder's decoder): per block an all-reduce
 * after attention and after the MLP in forward (a decoder also after its attention over the
 * encoder), and one per sublayer for the input gradients in backward, where a decoder block adds
 * the gradient of the encoder output its cross-attention's K and V read (b s h); with sequence
 * parallelism each becomes an all-gather plus a reduce-scatter, and backward adds the gather of
 * dy for the row-split layer and the column-split layer's input gathered again (Korthikanti et
 * al. 2022, section 4.2.2, and Megatron-LM's layers: the gathered input is not kept). The
 * vocabulary-parallel embedding reduces its output (an encoder-decoder looks up both stacks'
 * tokens; under sequence parallelism a reduce-scatter, whose backward gathers dy), the head
 * gathers its input under sequence parallelism (forward and again backward), reduces its input
 * gradient, and its cross-entropy reduces 3 fp32 values per token in three
 * all-reduces (Megatron's vocab_parallel_cross_entropy: max, target logit, sum of exponentials).
 * A block of DeepSpeed's MoE layer has no MLP all-reduce (moe_colls gathers its tokens). */
/* Whether the MoE blocks are DeepSpeed's MoE layers under tensor parallelism, which split their
 * tokens over the tensor-parallel ranks (moe_colls) and leave an MoE block's MLP without
 * Megatron's all-reduce: its output is whole on every rank once gathered. */
static int moe_tp_splits(const Plan *p)
{
	return p->sc->model.ds_gate && p->par.tp > 1;
}

static void tp_colls(Builder *b, int u, OpRole role)
{
	int forward = role != ROLE_BACKWARD;
	const Plan *p = b->p;
	if (p->par.tp <= 1 || !p->activations_known)
		return;
	const ModelSpec *m = &p->sc->model;
	long long bs = p->shape.b * p->shape.s, h = m->h;
	long long bs_dec = p->shape.b * (p->shape.s_dec ? p->shape.s_dec : p->shape.s);
	long long bs_head = m->lay.L_enc ? bs_dec : bs;
	int d = p->param_bytes, sp = p->shape.sp;
	if (is_block(p, u)) {
		int dec = model_unit_is_decoder(m, u);
		long long bsh = (dec ? bs_dec : bs) * h;
		int mlp = !(p->units[u].moe && moe_tp_splits(p)); /* moe_colls has its own */
		for (int i = 0; i < 1 + mlp + dec; i++) {
			if (sp) {
				/* backward gathers dy for the row-split layer, then the column-split
				 * layer's input again (not kept: Megatron's
				 * LinearWithGradAccumulationAndAsyncCommunication re-gathers it) */
				if (!forward)
					coll(b, COLL_ALL_GATHER, role, GROUP_TP, u, bsh, d, -1, 0);
				coll(b, COLL_ALL_GATHER, role, GROUP_TP, u, bsh, d, -1, 0);
				coll(b, COLL_REDUCE_SCATTER, role, GROUP_TP, u, bsh, d, -1, 0);
			} else {
				coll(b, COLL_ALL_REDUCE, role, GROUP_TP, u, bsh, d, -1, 0);
			}
		}
		if (dec && !forward) /* sequence parallelism is refused for encoder-decoders */
			coll(b, COLL_ALL_REDUCE, role, GROUP_TP, u, bs * h, d, -1, 0);
	} else if (u == 0 && forward) {
		coll(b, sp ? COLL_REDUCE_SCATTER : COLL_ALL_REDUCE, role, GROUP_TP, u, bs * h, d, -1, 0);
		if (m->lay.L_enc)
			coll(b, COLL_ALL_REDUCE, role, GROUP_TP, u, bs_dec * h, d, -1, 0);
	} else if (u == 0 && sp) { /* the reduce-scatter's backward: dy gathered */
		coll(b, COLL_ALL_GATHER, role, GROUP_TP, u, bs * h, d, -1, 0);
	} else if (u == p->n_units - 1 && m->lay.lm_head) {
		if (sp) /* the final norm's output gathered for the head, forward and again backward */
			coll(b, COLL_ALL_GATHER, role, GROUP_TP, u, bs_head * h, d, -1, 0);
		if (forward) /* Megatron's cross-entropy: the max, the target logits, the sums */
			for (int i = 0; i < 3; i++)
				coll(b, COLL_ALL_REDUCE, role, GROUP_TP, u, bs_head, 4, -1, 0);
		else
			coll(b, sp ? COLL_REDUCE_SCATTER : COLL_ALL_REDUCE, role, GROUP_TP, u, bs_head * h, d,
			     -1, 0);
	}
}

/* An MoE block moves its tokens to their experts and back: two all-to-alls forward (dispatch,
 * combine) and two backward, of E x capacity x h elements each. DeepSpeed's MoE layer under
 * tensor parallelism (sharded_moe.py MOELayer.forward; with Megatron's mpu its groups make the
 * experts count as tensor-parallel too, groups.py _create_expert_data_and_model_parallel) sends
 * each tensor-parallel rank's 1/t of every expert's capacity (drop_tokens), then all-gathers
 * the capacity whole over the tensor-parallel group (gather_tokens) for the experts, which
 * compute every token on every rank, and likewise after the combine: an all-gather of
 * E x capacity x h after each all-to-all, forward, and backward where drop_tokens' gradient is
 * gather_tokens. */
static void moe_colls(Builder *b, int u, OpRole role)
{
	const Plan *p = b->p;
	if (!p->units[u].moe)
		return;
	long long whole = p->moe_slots * p->sc->model.h;
	long long t = moe_tp_splits(p) ? p->par.tp : 1;
	/* without drop_tokens the gate all-reduces (max) its busiest expert's count, an int64,
	 * over the expert-parallel group before the dispatch, each time it runs (top1gating,
	 * top2gating: dist.all_reduce(new_capacity, op=MAX, group=ep_group)) */
	if (!p->par.moe.drop_tokens && role != ROLE_BACKWARD)
		coll(b, COLL_ALL_REDUCE, role, GROUP_EP, u, 1, 8, -1, 0);
	for (int i = 0; i < 2; i++) {
		coll(b, COLL_ALL_TO_ALL, role, GROUP_EP, u, whole / t, p->param_bytes, -1, 0);
		if (t > 1)
			coll(b, COLL_ALL_GATHER, role, GROUP_TP, u, whole, p->param_bytes, -1, 0);
	}
}

/* The executor: the kernels run on a model-layout working copy of the unit's parameters in the
 * compute dtype (the parameters' own: fp32, or 16-bit under mixed precision), and write their
 * gradients into an fp32 one in backward; the head's copies include the tied token embedding it
 * uses, an MoE block's its local experts. elem_bytes: the copy's element size. */
static double unit_work_bytes(const Plan *p, int u, int elem_bytes)
{
	if (!p->executor)
		return 0;
	double n = (double)(p->units[u].local_dense + p->units[u].local_expert);
	if (u == p->n_units - 1 && p->par.pp == 1)
		n += (double)tied_local(p);
	return elem_bytes * n;
}

/* Hugging Face's causal-LM loss (loss_utils.py ForCausalLMLoss: logits.float(), then
 * cross_entropy) over the head's rows while it runs, beyond the fp32 log-softmax output the head
 * keeps (activ.c): forward, the logits in the model's type (the model's output holds them) and
 * their fp32 upcast (none in fp32, where .float() is the tensor itself), live beside the
 * log-softmax; backward, nll_loss's gradient and log_softmax's input gradient, fp32 both,
 * beside the kept output, 8 bytes a logit (the input gradient's cast back to the model's type
 * comes once the kept output is freed, within that). BertForMaskedLM's and T5's loss
 * (CrossEntropyLoss on the scores as they are) the same without the upcast: the logits, then the two
 * gradients in their type (fp32 under autocast). 0 under Megatron's code (its
 * vocabulary-parallel cross-entropy works in the upcast copy in place) and for other heads. */
static double loss_temp_bytes(const Plan *p, int u, int backward)
{
	const ModelSpec *m = &p->sc->model;
	const ModelLayout *y = &m->lay;
	if (!p->shape.hf_eager || u != p->n_units - 1 || !y->lm_head || !p->activations_known)
		return 0;
	long long s = y->L_enc && p->shape.s_dec ? p->shape.s_dec : p->shape.s;
	double logits = (double)(p->shape.b * s) * (double)m->V / (double)p->par.tp;
	double d = p->shape.elem_bytes; /* the logits' type: the parameters', or autocast's */
	/* the loss's type: fp32 after ForCausalLMLoss's upcast or under autocast (log_softmax is
	 * an fp32 op there); BertForMaskedLM's and T5's CrossEntropyLoss take the logits as they
	 * are */
	double ls = model_hf_loss_upcasts(m) || p->shape.autocast ? 4 : d;
	return logits * (backward ? 2 * ls : d + (ls > d ? ls : 0));
}

/* torch autocast (plain PyTorch with the Trainer's fp16 or bf16): the 16-bit copies of unit u's
 * weights its products read, the head's of the tied embedding too (plan.c cast_elems). The
 * autocast cache keeps each cast until the forward ends (torch's cached_cast caches a leaf
 * weight's cast whatever the grad mode), and autograd's saved tensors until the unit's
 * backward; a checkpointed block saves nothing, so its copies go when the forward ends and are
 * made again by its recompute. */
static double cast_bytes(const Plan *p, int u)
{
	const DsConfig *ds = &p->sc->ds;
	if (ds->autocast == DT_FP32)
		return 0;
	return (double)p->units[u].cast_elems * dtype_bytes(ds->autocast);
}

void build_forward_unit(Builder *b, int slot, int u)
{
	const Plan *p = b->p;
	const UnitPlan *up = &p->units[u];
	int i = slot * p->n_units + u;

	if (p->fsdp)
		build_fsdp_forward_gather(b, u);
	else if (p->stage == 3)
		gather_with_prefetch(b, u, +1);
	int temp = -1, fp32 = alloc(b, PLACE_GPU, CAT_WORKSPACE, BUF_UNIT_FP32, u,
				    unit_work_bytes(p, u, p->param_bytes));
	if (is_block(p, u) && p->sc->ckpt == CKPT_FULL) {
		b->ckpt[i] = alloc(b, p->ckpt_place, CAT_ACTIV, BUF_CHECKPOINT, u, up->ckpt_bytes);
		/* the forward still builds the layer's activations; they go when it ends */
		temp = alloc(b, PLACE_GPU, CAT_ACTIV, BUF_ACTIVATIONS, u, up->act_bytes);
	} else {
		b->act[i] = alloc(b, PLACE_GPU, CAT_ACTIV, is_block(p, u) ? BUF_ACTIVATIONS : BUF_ENDS,
				  u, up->act_bytes);
	}
	/* selective recompute: the attention core still computes its scores forward, and
	 * drops them once its output is made (Megatron runs it under checkpoint) */
	int scores = is_block(p, u) && p->sc->ckpt == CKPT_SELECTIVE && up->score_bytes > 0 ?
			     alloc(b, PLACE_GPU, CAT_ACTIV, BUF_SCORES, u, up->score_bytes) : -1;
	b->cast[i] = alloc(b, PLACE_GPU, CAT_BUFFERS, BUF_AUTOCAST_WEIGHTS, u, cast_bytes(p, u));
	int loss = alloc(b, PLACE_GPU, CAT_ACTIV, BUF_LOSS_TEMP, u, loss_temp_bytes(p, u, 0));
	compute(b, COMP_FWD, u, up->fwd_flops);
	release(b, &loss);
	/* the unit's collectives are its kernels' (the executor's tensor-parallel units issue them
	 * while they compute), before what the compute op leaves to free; nothing is allocated
	 * between, so the peaks are those of freeing the scores first */
	tp_colls(b, u, ROLE_FORWARD);
	moe_colls(b, u, ROLE_FORWARD);
	release(b, &scores);
	release(b, &temp);
	release(b, &fp32);
	if (b->ckpt[i] >= 0 && p->ckpt_place == PLACE_CPU)
		copy(b, COPY_D2H, ROLE_FORWARD, u, up->ckpt_bytes);
	if (p->fsdp)
		build_fsdp_forward_done(b, u);
	else if (p->stage == 3)
		build_ungather(b, u);
}

/* Selective recompute (Korthikanti et al. 2022, section 5): forward kept everything but the
 * attention core's scores; before the block's backward, QK^T, softmax, dropout and softmax x V
 * run again (the attention products' FLOPs on this rank: 4 b s^2 h / t for multi-head
 * attention), rebuilding the scores (their bytes are the op's traffic), which live until the
 * backward is done. Eager attention only: FlashAttention keeps no scores (score_bytes 0) and its
 * backward kernel recomputes them itself. Returns the scores' buffer, -1 when nothing runs. */
static int recompute_attention_core(Builder *b, int u)
{
	const Plan *p = b->p;
	double scores = p->units[u].score_bytes;
	if (p->sc->ckpt != CKPT_SELECTIVE || !is_block(p, u) || scores <= 0)
		return -1;
	int id = alloc(b, PLACE_GPU, CAT_ACTIV, BUF_SCORES, u, scores);
	compute_moving(b, COMP_RECOMPUTE, u, p->units[u].attn_flops, scores);
	return id;
}

void build_backward_unit(Builder *b, int slot, int u)
{
	const Plan *p = b->p;
	const UnitPlan *up = &p->units[u];
	int i = slot * p->n_units + u;

	if (p->fsdp)
		build_fsdp_backward_gather(b, u);
	else if (p->stage == 3)
		gather_with_prefetch(b, u, -1);
	int fp32 = alloc(b, PLACE_GPU, CAT_WORKSPACE, BUF_UNIT_FP32, u,
			 unit_work_bytes(p, u, p->param_bytes));
	int fp32_grads = alloc(b, PLACE_GPU, CAT_WORKSPACE, BUF_UNIT_GRAD32, u,
			       unit_work_bytes(p, u, 4));
	if (b->ckpt[i] >= 0) { /* full recompute: rebuild the block's activations from its input */
		if (p->ckpt_place == PLACE_CPU)
			copy(b, COPY_H2D, ROLE_RECOMPUTE, u, up->ckpt_bytes);
		b->act[i] = alloc(b, PLACE_GPU, CAT_ACTIV, BUF_ACTIVATIONS, u, up->act_bytes);
		b->cast[i] = alloc(b, PLACE_GPU, CAT_BUFFERS, BUF_AUTOCAST_WEIGHTS, u,
				   cast_bytes(p, u));
		compute(b, COMP_RECOMPUTE, u, up->fwd_flops);
		tp_colls(b, u, ROLE_RECOMPUTE);
		moe_colls(b, u, ROLE_RECOMPUTE);
	}
	int scores = recompute_attention_core(b, u);
	int egrads = build_expert_grads_held(p, u) ?
		alloc(b, PLACE_GPU, CAT_GRADS, BUF_EXPERT_GRADS, u,
		      (double)up->local_expert * p->grad_bytes) : -1;
	if (p->stage >= 2 && build_ds_ipg_buffers(p)) {
		long long xl = build_xl_grad_elems(p, u), tied = tied_local(p);
		if (u == 0 && b->tied_grad >= 0 && (double)tied > p->reduce_bucket_elems)
			xl -= tied; /* the tied embedding's one .grad: the head's held buffer */
		b->xl_grads = alloc(b, PLACE_GPU, CAT_GRADS, BUF_XL_GRADS, u,
				    (double)xl * p->grad_bytes);
	}
	if (p->stage >= 2 && !p->contiguous_grads && !build_grads_direct(p) && up->local_dense > 0)
		/* at stage 3 at least the unit's flat, padded to the group, in which they are
		 * laid for the reduction; FSDP's tensors' own, a tied head's share of the
		 * embedding's gradient after them (autograd sums it at the embedding's backward) */
		b->own_grads = alloc(b, PLACE_GPU, CAT_GRADS, BUF_UNIT_GRADS, u,
				     (double)(p->stage == 3 && !p->fsdp ?
						      max_ll(up->local_dense, up->own_gather) :
						      up->local_dense + build_fsdp_tied(p, u)) *
					     p->grad_bytes);
	int loss = alloc(b, PLACE_GPU, CAT_ACTIV, BUF_LOSS_TEMP, u, loss_temp_bytes(p, u, 1));
	compute(b, COMP_BWD, u, 2 * up->fwd_flops);
	if (!b->oom) { /* stated on the backward op itself */
		int gbuf;
		long long goff;
		build_grads_dest(b, u, &gbuf, &goff);
		sched_grads_to(b->s, gbuf, goff);
	}
	release(b, &loss);
	/* backward runs the block's MLP before its attention: an MoE block's exchanges come
	 * before the attention's tensor-parallel all-reduce */
	moe_colls(b, u, ROLE_BACKWARD);
	tp_colls(b, u, ROLE_BACKWARD);
	release(b, &b->act[i]);
	release(b, &b->ckpt[i]);
	release(b, &b->cast[i]);
	release(b, &scores);
	if (p->fsdp) {
		build_fsdp_unit_grads(b, u);
	} else {
		build_unit_grads(b, u, egrads);
		if (p->stage == 3)
			build_ungather(b, u);
	}
	release(b, &fp32_grads);
	release(b, &fp32);
}

/* The executor's scratch: 8 bsh floats for gpt_cpu's backward; on a tensor-parallel rank what
 * kernels/gpt_tp_cpu.c's units use (gpt_tp_scratch_bytes): the larger of a block's two widest
 * activations (b s max(4h/t, h) each) and the head's three per-token values with its (b s, h)
 * gradient, plus a gathered (b s, h) stream under sequence parallelism. */
double build_exec_scratch_bytes(const Plan *p)
{
	if (!p->executor)
		return 0;
	double bs = (double)(p->shape.b * p->shape.s), h = (double)p->sc->model.h;
	double t = (double)p->par.tp, sp = p->shape.sp ? bs * h : 0;
	const ModelSpec *m = &p->sc->model;
	if (m->experts) { /* kernels/moe_cpu.c's moe_cpu_scratch_bytes; its 8 b s h also hold a
			     tensor-parallel rank's units without sequence parallelism (2 b s
			     max(4h/t, h), and the head's b s (h + 3)) */
		double slots = (double)p->moe_slots, cap = (double)p->moe_capacity;
		double I = (double)(m->moe_I ? m->moe_I : m->I), E = (double)m->experts;
		double mlp = 2 * slots * h + 2 * cap * I + bs * h + 2 * bs * E;
		return 4 * (fmax(8 * bs * h, mlp) + 3 * bs * (double)m->top_k);
	}
	if (p->par.tp <= 1)
		return 4 * 8 * bs * h;
	double block = 2 * bs * fmax(4 * h / t, h) + sp, head = 3 * bs + bs * h + sp;
	return 4 * fmax(fmax(block, head), sp);
}

/* Without pipelining: every unit forward, then backward, repeated for each micro-batch. The
 * executor's hidden-state streams (x in the compute dtype, its gradient in fp32) live for the
 * micro-batch, its scratch for the backward (and the forward too on a tensor-parallel rank, whose
 * head and gathers use it, and in an MoE model, whose blocks dispatch through it). */
static void micro_batch(Builder *b)
{
	const Plan *p = b->p;
	double bsh = p->executor ? (double)(p->shape.b * p->shape.s * p->sc->model.h) : 0;
	double bsh4 = 4 * bsh;
	int hidden = alloc(b, PLACE_GPU, CAT_WORKSPACE, BUF_HIDDEN, -1, bsh4 + p->param_bytes * bsh);
	int scratch = -1, early = p->par.tp > 1 || p->sc->model.experts > 0;
	if (early)
		scratch = alloc(b, PLACE_GPU, CAT_WORKSPACE, BUF_SCRATCH, -1,
				build_exec_scratch_bytes(p));

	for (int u = 0; u < p->n_units; u++)
		build_forward_unit(b, 0, u);
	for (int u = 0; u < p->n_units; u++) /* autocast's cache goes with the forward */
		if (b->ckpt[u] >= 0)
			release(b, &b->cast[u]);
	if (p->stage == 1 || p->stage == 2)
		build_alloc_buckets(b, build_bucket_count(p));
	if (!early)
		scratch = alloc(b, PLACE_GPU, CAT_WORKSPACE, BUF_SCRATCH, -1,
				build_exec_scratch_bytes(p));
	b->ddp_next = 0;
	for (int u = p->n_units - 1; u >= 0; u--) {
		build_backward_unit(b, 0, u);
		build_ddp_ready(b, p->units[u].flat_off);
	}
	build_accumulate_hp(b, 0, p->n_units);
	build_release_prev(b, &b->dense); /* the epilogue's _clear_previous_reduced_grads */
	build_flush_bucket(b, &b->expert);
	const StagePlan *st = &p->stages[b->stage];
	if (p->stage == 3 && st->persist_elems > 0) /* parameters kept whole still reduce-scatter */
		build_reduce_dense(b, -1, -1, st->persist_part_off,
				   ceil_div(st->persist_elems, p->dp) * p->dp, b->id_grads, 0);
	release(b, &scratch);
	if (p->stage == 1 || p->stage == 2)
		build_release_buckets(b);
	/* FSDP with CPUOffload: the backward's last callback hands the optimizer the host's
	 * gradients and drops the device's shards (prepare_gradient_for_optim) */
	for (int u = 0; p->fsdp && p->opt_place != PLACE_GPU && b->fsdp_sync && u < p->n_units; u++)
		release(b, &b->fsdp_shard[u]);
	release(b, &hidden);
}

/* ---- entry ---- */

static int builder_init(Builder *b, const Plan *p, int stage, long long m, Schedule *s)
{
	int n = p->n_units;
	long long slots = p->par.pp > 1 ? m : 1;
	memset(b, 0, sizeof(*b));
	b->p = p;
	b->stage = stage;
	b->m = m;
	b->s = s;
	b->tied_grad = b->own_grads = b->xl_grads = b->fsdp_head = -1;
	b->fsdp_sync = 1;
	b->dense.group = GROUP_DP;
	b->expert.group = GROUP_EDP;
	b->id_params = b->id_grads = b->id_part = b->id_persist = b->id_gradpart = -1;
	b->id_ef = b->id_lp = b->id_ddp = -1;
	b->id_pipe_grad = -1;
	b->buckets[0] = b->buckets[1] = -1;
	long long chunks = slots * p->par.virtual_stages;
	b->gathered = malloc((size_t)n * sizeof(int));
	b->act = malloc((size_t)(n * slots) * sizeof(int));
	b->ckpt = malloc((size_t)(n * slots) * sizeof(int));
	b->cast = malloc((size_t)(n * slots) * sizeof(int));
	b->pipe_in = malloc((size_t)chunks * sizeof(int));
	b->pipe_out = malloc((size_t)chunks * sizeof(int));
	b->expert_start = malloc((size_t)n * sizeof(long long));
	b->bucket_of = malloc((size_t)n * sizeof(int));
	b->fsdp_acc = malloc((size_t)n * sizeof(int));
	b->fsdp_shard = malloc((size_t)n * sizeof(int));
	b->fsdp_post = malloc((size_t)n * sizeof(int));
	b->fsdp_left = malloc((size_t)n * sizeof(int));
	if (!b->gathered || !b->act || !b->ckpt || !b->cast || !b->pipe_in || !b->pipe_out ||
	    !b->expert_start || !b->bucket_of || !b->fsdp_acc || !b->fsdp_shard || !b->fsdp_post ||
	    !b->fsdp_left)
		return -1;
	for (int u = 0; u < n; u++)
		b->gathered[u] = b->fsdp_acc[u] = b->fsdp_shard[u] = b->fsdp_post[u] =
			b->fsdp_left[u] = -1;
	for (long long i = 0; i < n * slots; i++)
		b->act[i] = b->ckpt[i] = b->cast[i] = -1;
	for (long long i = 0; i < chunks; i++)
		b->pipe_in[i] = b->pipe_out[i] = -1;
	long long expert = 0; /* the stage's expert flat holds its units in forward order */
	for (int u = 0; u < n; u++) {
		b->bucket_of[u] = -1;
		b->expert_start[u] = expert;
		if (p->units[u].stage == stage)
			expert += p->units[u].local_expert;
	}
	const StagePlan *st = &p->stages[stage];
	for (int i = 0; i < st->n_buckets; i++)
		for (int u = st->buckets[i].u_lo; u <= st->buckets[i].u_hi; u++)
			if (p->units[u].stage == stage)
				b->bucket_of[u] = i;
	return build_ddp_plan(b);
}

static void builder_free(Builder *b)
{
	free(b->gathered);
	free(b->act);
	free(b->cast);
	free(b->ckpt);
	free(b->pipe_in);
	free(b->pipe_out);
	free(b->expert_start);
	free(b->bucket_of);
	free(b->fsdp_acc);
	free(b->fsdp_shard);
	free(b->fsdp_post);
	free(b->fsdp_left);
	free(b->ddp_at);
	free(b->dense.bufs);
	free(b->expert.bufs);
	free(b->dense.prev);
	free(b->expert.prev);
}

static long long stage_units(const Plan *p, int stage)
{
	long long n = 0;
	for (int u = 0; u < p->n_units; u++)
		n += p->units[u].stage == stage;
	return n;
}

/* Stage `stage`'s schedule with m micro-batches (the plan's m, or fewer to count ops);
 * *pipe_ops (may be NULL) receives the ops of the micro-batches themselves. */
static int build(const Plan *p, int stage, long long m, Schedule *s, long long *pipe_ops,
		 PxError *err)
{
	Builder bb, *b = &bb;
	int rc = 0;

	sched_init(s, stage);
	if (builder_init(b, p, stage, m, s)) {
		b->oom = 1;
		goto out;
	}
	setup(b);
	s->step_begin = s->n;
	/* a pipelined stage unrolls its micro-batches: 4 to 16 ops per micro-batch and unit on
	 * the bundled sweeps, so reserve the most of these and the optimizer step's few hundred
	 * at once instead of growing the ops by copies (a hint: appending still grows past it,
	 * and where the room cannot be had, doubling may still find what is needed) */
	if (p->par.pp > 1)
		(void)sched_reserve(s, s->n + 16 * m * stage_units(p, stage) + 512);
	if (p->par.pp > 1) {
		if ((rc = build_pipelined(b, err)))
			goto out;
	} else if (p->fsdp && p->m > 1) {
		/* FSDP: the first micro-batch makes what the others find (under no_sync each unit's
		 * kept gradient, and SHARD_GRAD_OP's gathered units; with sync_each_batch the
		 * gradient shards), the middle ones add into it, the last reduce-scatters */
		int each = p->sc->fsdp.sync_each_batch;
		b->fsdp_sync = each;
		DO(sched_loop(s, 1));
		micro_batch(b);
		DO(sched_end_loop(s));
		if (p->m > 2 || each) {
			DO(sched_loop(s, each ? p->m - 1 : p->m - 2));
			micro_batch(b);
			DO(sched_end_loop(s));
		}
		if (!each) {
			b->fsdp_sync = 1;
			DO(sched_loop(s, 1));
			micro_batch(b);
			DO(sched_end_loop(s));
		}
	} else if (p->stage == 3 && p->hpz > 1 && p->m > 1) {
		/* hpZ: the first micro-batch's forward gathers over dp and keeps the secondary
		 * partition; the others' forwards gather from it, inside the node (stage3.py drops
		 * it after the step: invalidate_secondary_tensor) */
		DO(sched_loop(s, 1));
		micro_batch(b);
		DO(sched_end_loop(s));
		b->secondary_held = 1;
		DO(sched_loop(s, p->m - 1));
		micro_batch(b);
		DO(sched_end_loop(s));
	} else if (b->n_ddp > 0 && p->m > 1) { /* DDP: no_sync but for the last micro-batch */
		DO(sched_loop(s, p->m - 1));
		micro_batch(b);
		DO(sched_end_loop(s));
		b->ddp_sync = 1;
		DO(sched_loop(s, 1));
		micro_batch(b);
		DO(sched_end_loop(s));
	} else {
		b->ddp_sync = b->n_ddp > 0;
		DO(sched_loop(s, p->m));
		micro_batch(b);
		DO(sched_end_loop(s));
	}
	if (pipe_ops)
		*pipe_ops = s->n - s->step_begin;
	build_optimizer_step(b);
out:
	builder_free(b);
	if (b->oom)
		rc = px_fail(err, PX_ERR_RUNTIME, "out of memory building the schedule");
	if (rc)
		sched_free(s);
	return rc;
}

int build_schedule(const Plan *p, int stage, Schedule *s, PxError *err)
{
	return build(p, stage, p->m, s, NULL, err);
}

/* Without pipelining the micro-batches are one repeat block, whatever their number: the schedule
 * is built. With it (ZeRO 0-1 only, plan.c refuses 2-3), every micro-batch adds the same ops, a
 * forward and a backward of each of the stage's chunks; so the schedule of the fewest
 * micro-batches its order allows (1; the interleaved order needs pp) gives the count of any. */
int build_count_ops(const Plan *p, int stage, long long *n_ops, PxError *err)
{
	long long m = p->par.pp == 1 ? p->m :
		      p->par.schedule == PIPE_INTERLEAVED ? p->par.pp : 1, per_m = 0;
	Schedule s;

	if (m > p->m)
		m = p->m;
	if (build(p, stage, m, &s, &per_m, err))
		return -1;
	*n_ops = s.n;
	if (p->par.pp > 1)
		*n_ops += (p->m - m) * (per_m / m);
	sched_free(&s);
	return 0;
}

long long build_ops_bound(const Plan *p, int stage)
{
	long long passes = (p->par.pp == 1 ? 1 : p->m) + 2;
	return passes * BUILD_OPS_PER_UNIT * stage_units(p, stage) + 1024;
}

int build_check_size(const Plan *p, PxError *err)
{
	long long total = 0, bound = 0;

	if (p->par.pp == 1) /* one repeat block: the micro-batches add nothing */
		return 0;
	for (int s = 0; s < p->par.pp; s++)
		bound += build_ops_bound(p, s);
	if (bound <= BUILD_MAX_OPS) /* far inside: nothing to count (a sweep's usual point) */
		return 0;
	for (int s = 0; s < p->par.pp; s++) {
		long long n;
		if (build_count_ops(p, s, &n, err))
			return -1;
		total += n;
	}
	if (total <= BUILD_MAX_OPS)
		return 0;
	return px_fail(err, PX_ERR_INPUT, "%s: the pipelined schedule of %lld micro-batches (gradient "
		       "accumulation) on %lld stages would hold %lld ops, over the limit of %lld (%.0f "
		       "MiB of schedule); use fewer micro-batches: a larger "
		       "train_micro_batch_size_per_gpu gives the same batch in fewer",
		       p->sc->path, p->m, p->par.pp, total, (long long)BUILD_MAX_OPS,
		       (double)BUILD_MAX_OPS * sizeof(Op) / (1 << 20));
}

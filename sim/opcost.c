#include "opcost.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "opcost_cpu.h"
#include "traffic.h"

#define GB 1e9
/* GEMMs in a GPT block's forward: QKV, QK^T, AV, the output projection and the MLP's two
 * matrices; a backward runs two per forward GEMM (input and weight gradients) of the same size.
 * Where a block's GEMMs cannot be listed (a model given only its parameter count), the efficiency
 * curve is read at one GEMM's average share of the op. */
#define GEMMS_PER_BLOCK 6
#define MAX_GEMMS MODEL_MAX_GEMMS

/* ---- compute and copies ---- */

/* bytes / rate, with nothing to move costing nothing and a rate of 0 costing forever */
static double over(double bytes, double rate)
{
	if (bytes <= 0)
		return 0;
	return rate > 0 ? bytes / rate : INFINITY;
}

Dtype opcost_compute_dtype(const Plan *p)
{
	const DsConfig *ds = &p->sc->ds;
	return ds->autocast != DT_FP32 ? ds->autocast : ds->dtype;
}

double opcost_dtype_peak(const Plan *p)
{
	const GpuSpec *g = &p->sc->cluster.gpu;
	switch (opcost_compute_dtype(p)) {
	case DT_BF16: return g->tflops_bf16 * 1e12;
	case DT_FP16: return g->tflops_fp16 * 1e12;
	default: return g->tflops_fp32 * 1e12;
	}
}

/* The dtype's dense peak as a training step sustains it (the profile's "sustained"): what the
 * GEMM curve's and FlashAttention's single-kernel fractions apply to. */
static double sustained_peak(const Plan *p, const HwProfile *hw)
{
	return opcost_dtype_peak(p) * hw->sustained;
}

static double hbm_Bps(const Plan *p, const HwProfile *hw)
{
	return p->sc->cluster.gpu.hbm_GBps * GB * hw->hbm_efficiency;
}

static int is_block(const Plan *p, int u)
{
	return u >= 1 && u <= p->sc->model.L;
}

/* The GEMMs of one micro-batch's forward through dense block `unit` on this rank, as model.c lists
 * them from the model's composition (the plan's FLOPs come from the same list): first the
 * weights' products, each 2 M K N FLOPs moving (M K + K N + M N) e bytes (e = activation bytes),
 * then the attention's two products per attention, QK^T and AV batched over the rank's a/t heads,
 * moving the b (a/t) s^2 scores and two operands; an MoE block's experts' products batched over
 * the rank's local experts (a grouped GEMM), each over the tokens routed to it. Returns how many,
 * their FLOPs, bytes and whether each is an attention product under a causal mask (attn 2) or not
 * (attn 1), and in *listed their FLOPs, or 0 when they leave more than 1% of the unit's FLOPs
 * unlisted (a parameter-count-only model), which leaves the op to the averaged pricing. (The
 * plan's count also has its bias FLOPs: adds, not GEMMs, well under 1%.) */
static int block_gemms(const Plan *p, int unit, double *flops, double *bytes, int *attn,
		       double *rows, double *listed)
{
	const ModelSpec *m = &p->sc->model;
	const UnitPlan *u = &p->units[unit];
	ModelGemm g[MODEL_MAX_GEMMS];
	double e = (double)p->shape.elem_bytes, sum = 0;
	GemmShape gs = plan_gemm_shape(p);
	int n = 0;
	if (!model_known(m) || u->fwd_flops <= 0)
		return 0;
	int ng = model_unit_gemms(m, unit, &gs, g);
	for (int pass = 0; pass < 2; pass++) /* the weights' products, then the attention's */
		for (int i = 0; i < ng; i++) {
			if ((g[i].kind == GEMM_WEIGHT) != (pass == 0))
				continue;
			flops[n] = 2 * g[i].m * g[i].k * g[i].n * g[i].batch;
			bytes[n] = (g[i].m * g[i].k + g[i].k * g[i].n + g[i].m * g[i].n) * g[i].batch * e;
			rows[n] = g[i].m;
			attn[n++] = pass == 0 ? 0 : g[i].causal ? 2 : 1;
		}
	for (int i = 0; i < n; i++)
		sum += flops[i];
	*listed = sum;
	return sum <= u->fwd_flops * (1 + 1e-12) && sum >= 0.99 * u->fwd_flops ? n : 0;
}

/* FlashAttention's fused kernel in place of the two attention products of `nominal` FLOPs (the
 * full s x s, as FLOP counts take them) over s_q query rows: a causal mask lets it skip the key
 * blocks wholly above the diagonal, so with n = s_q/128 query blocks (FlashAttention-2's tile) it
 * computes (n + 1)/2n of them; its backward recomputes the scores, five products to the
 * forward's two (Dao 2023, algorithm 2). Each pass at the profile's rate for that kernel. */
static double flash_attention_s(const Plan *p, const HwProfile *hw, double nominal, double s_q,
				int causal, int backward)
{
	double blocks = ceil(s_q / 128), peak = sustained_peak(p, hw);
	double executed = causal ? nominal * (blocks + 1) / (2 * blocks) : nominal;
	if (backward)
		return over(2.5 * executed, peak * hw->flash_bwd);
	return over(executed, peak * hw->flash_fwd);
}

/* A block's GEMM time, each GEMM at its own size on the efficiency curve (a batched product read
 * at its whole batch's FLOPs) and no faster than its bytes allow (the roofline); a backward runs
 * two GEMMs of each size; with FlashAttention each attention's two products are its kernel
 * instead; FLOPs left unlisted run at the listed ones' average rate. -1 when the block's GEMMs
 * cannot be listed or the op is not one pass over the block. */
static double block_gemm_s(const Plan *p, const HwProfile *hw, const Op *op)
{
	double flops[MAX_GEMMS], bytes[MAX_GEMMS], rows[MAX_GEMMS], listed, sum = 0;
	double fwd = p->units[op->unit].fwd_flops, peak = sustained_peak(p, hw), hbm = hbm_Bps(p, hw);
	int attn[MAX_GEMMS];
	int n = block_gemms(p, op->unit, flops, bytes, attn, rows, &listed);
	double times = op->flops / fwd; /* 1 forward or recompute, 2 backward */
	if (n == 0 || (fabs(times - 1) > 1e-9 && fabs(times - 2) > 1e-9))
		return -1;
	int flash = p->sc->attention == ATTN_FLASH;
	for (int i = 0; i < n; i++) {
		if (flash && attn[i]) { /* a (scores, context) pair over rows[i] query rows */
			sum += flash_attention_s(p, hw, flops[i] + flops[i + 1], rows[i], attn[i] == 2,
						 times > 1.5);
			i++;
			continue;
		}
		sum += times * fmax(over(flops[i], peak * hw_curve_eval(&hw->gemm, flops[i])),
				    over(bytes[i], hbm));
	}
	return sum * (fwd / listed);
}

/* ---- host overhead ----
 * A framework issues a unit's kernels one by one from the host, each at a cost (the profile's
 * kernel_issue_s); when the GPU finishes them faster than they arrive, the pass takes the host's
 * time. The kernels of one pass through a block (docs/time_model.md, "Host overhead"), by the
 * scenario's model_code:
 *  - megatron: Megatron-LM's ParallelTransformerLayer.forward (fused bias-GeLU and
 *    bias-dropout-add): each weight's GEMM; per attention its input norm, the output's
 *    bias-dropout-add, and eager attention's QK^T, scale-mask-softmax, dropout, AV and the
 *    context's copy back to [s, b, h] (FlashAttention: one kernel for the four); the MLP's
 *    norm, bias-activation and bias-dropout-add;
 *  - huggingface, GPT-2's modules (modeling_gpt2.py GPT2Block, and the other non-Llama
 *    families'): each weight's GEMM (c_attn fused); per attention ln_1, QK^T, the division by
 *    the scale, the causal mask's where, softmax, attn_dropout, AV (eager; SDPA one kernel),
 *    _merge_heads's contiguous copy, resid_dropout and the residual add; the MLP's ln_2, its
 *    activation (NewGELUActivation: pow, mul, add, mul, tanh, add, mul, mul, 8 kernels; a
 *    fused GELU 1), its dropout and the residual add; a dropout only where the config has one;
 *  - huggingface, Llama's modules (modeling_llama.py LlamaDecoderLayer; Gemma's the same in
 *    these counts but where said): q, k, v, o, gate, up, down's GEMMs; two LlamaRMSNorms of 7
 *    kernels in 16 bits (to fp32, pow, mean, add eps, rsqrt, mul, to the dtype, times the
 *    weight; 5 in fp32, whose casts are no-ops; GemmaRMSNorm 10 and 7, four of them in a
 *    Gemma-2 block); rotary embeddings on q and k, 5 each (x cos, rotate_half's negation and
 *    cat, x sin, add); repeat_kv's copies of k and v under grouped-query attention; eager
 *    attention's QK^T, the scaling, Gemma-2's soft-capping (divide, tanh, multiply), the mask's
 *    add, softmax in fp32 and its cast back (16 bits), AV (SDPA or FlashAttention-2 one
 *    kernel); the output's transpose copy, two residual adds, the activation (SiLU, Gemma's
 *    fused tanh GELU) and the product.
 * An MoE block adds DeepSpeed's gate (softmax, top-k, capacity mask, dispatch and combine
 * einsums) and runs its local experts one after another (sharded_moe.py Experts.forward: each
 * its own two GEMMs and activation), where the GEMM list batches them. A backward runs two
 * kernels per GEMM (input and weight gradients) and one per other kernel. The embedding: token
 * and position look-ups and their dropout; other units (the head): the final norm, the logits'
 * GEMM and the loss's six (max, subtract, exp, sum, log, the target's logit), backward two
 * fewer. */
#define ATTN_OWN_KERNELS 2    /* the attention's input norm and bias-dropout-add */
#define EAGER_CORE_KERNELS 3  /* softmax, dropout, the context's copy (QK^T and AV are GEMMs) */
#define MLP_OWN_KERNELS 3     /* norm, bias-activation, bias-dropout-add */
#define GATE_KERNELS 5        /* softmax, top-k, capacity mask, dispatch, combine */
#define GELU_NEW_KERNELS 8    /* NewGELUActivation's elementwise ops */

/* The kernels of a block's forward other than its GEMMs, under Hugging Face's modules. */
static double hf_block_other_kernels(const Plan *p, double attentions, int eager)
{
	const ModelSpec *m = &p->sc->model;
	if (model_hf_llama_attention(m)) {
		int half = p->shape.elem_bytes < 4;
		/* GemmaRMSNorm: the cast to fp32, pow, mean, the epsilon, rsqrt, the product, the
		 * weight's cast, 1 + it, the product, type_as (7 in fp32, whose casts are no-ops) */
		double norm = model_gemma_modules(m) ? (half ? 10 : 7) : (half ? 7 : 5);
		double norms = m->lay.place == NORM_SANDWICH ? 4 : 2; /* Gemma-2's four */
		double core = eager ? 2 + (half ? 2 : 1) + (m->attn_softcap > 0 ? 3 : 0) : 0;
		/* scale, mask, softmax, its cast; Gemma-2's soft-capping: divide, tanh, multiply */
		double gqa = eager && m->kv_heads < m->a ? 2 : 0;
		return norms * norm + attentions * (10 + gqa + core + 1) + 2 + 2;
	}
	double drop = m->dropout ? 1 : 0, attn_drop = m->attn_dropout ? 1 : 0;
	double core = eager ? 3 + attn_drop : 0; /* scale, mask, softmax (and its dropout) */
	double act = m->gelu_new && !m->lay.gated ? GELU_NEW_KERNELS : 1;
	return attentions * (1 + core + 1 + drop + 1) + 1 + act + drop + 1;
}

static double op_kernels(const Plan *p, const Op *op)
{
	int bwd = op->sub == COMP_BWD;
	/* the executor's own C launches are not PyTorch's dispatch (and are not measured yet) */
	if (p->executor || op->unit < 0 || op->unit >= p->n_units)
		return 0;
	if (!is_block(p, op->unit)) {
		if (op->unit == 0)
			return 3;
		return bwd ? 6 : 8;
	}
	double flops[MAX_GEMMS], bytes[MAX_GEMMS], rows[MAX_GEMMS], listed;
	int attn[MAX_GEMMS], products = 0;
	int n = block_gemms(p, op->unit, flops, bytes, attn, rows, &listed);
	for (int i = 0; i < n; i++)
		products += attn[i] != 0;
	if (n == 0) /* a parameter-count-only model: one attention, four weights */
		n = 6, products = 2;
	double attentions = products / 2;
	int eager = p->sc->attention != ATTN_FLASH;
	double gemms = n - products + attentions * (eager ? 2 : 1);
	double other = p->shape.hf_eager ? hf_block_other_kernels(p, attentions, eager) :
		       attentions * (ATTN_OWN_KERNELS + (eager ? EAGER_CORE_KERNELS : 0)) +
			       MLP_OWN_KERNELS;
	if (p->units[op->unit].moe) {
		double local = (double)p->sc->model.experts / (double)(p->par.ep > 0 ? p->par.ep : 1);
		gemms += 2 * (local - 1);
		other += GATE_KERNELS + (local - 1);
	}
	return (bwd ? 2 : 1) * gemms + other;
}

/* The pass's time on the GPU, or the host's time to issue its kernels when that is longer; the
 * difference, the GPU's wait, in *wait when not NULL. */
static double host_bound(const HwProfile *hw, double gpu_s, double kernels, double *wait)
{
	double host = kernels * hw->kernel_issue_s;
	if (wait)
		*wait = fmax(0, host - gpu_s);
	return fmax(gpu_s, host);
}

/* Selective recompute's op (build.c): the block's attention products once more, each priced as
 * the eager forward prices it (its own size on the GEMM curve, no faster than its bytes), then
 * softmax and dropout over the rebuilt scores (op->bytes) at the forward's traffic per byte of
 * scores. A model whose products cannot be listed keeps no scores, so never has this op. */
static double attention_recompute_s(const Plan *p, const HwProfile *hw, const Op *op,
				    double *wait)
{
	double flops[MAX_GEMMS], bytes[MAX_GEMMS], rows[MAX_GEMMS], listed, sum = 0;
	double peak = sustained_peak(p, hw), hbm = hbm_Bps(p, hw);
	int attn[MAX_GEMMS], products = 0;
	int n = block_gemms(p, op->unit, flops, bytes, attn, rows, &listed);
	for (int i = 0; i < n; i++)
		if (attn[i]) {
			sum += fmax(over(flops[i], peak * hw_curve_eval(&hw->gemm, flops[i])),
				    over(bytes[i], hbm));
			products++;
		}
	if (n == 0 && op->flops > 0)
		sum = over(op->flops, peak * hw_curve_eval(&hw->gemm, op->flops / 2));
	/* per attention: QK^T, softmax, dropout, AV and the context's copy */
	double kernels = (products / 2) * (2 + EAGER_CORE_KERNELS);
	return host_bound(hw, sum + over(op->bytes * hw->scores_fwd, hbm), kernels, wait);
}

double opcost_compute_s(const Plan *p, const HwProfile *hw, const Op *op, int stage)
{
	return opcost_compute_wait_s(p, hw, op, stage, NULL);
}

double opcost_compute_wait_s(const Plan *p, const HwProfile *hw, const Op *op, int stage,
			     double *host_wait_s)
{
	const GpuSpec *g = &p->sc->cluster.gpu;
	double hbm = hbm_Bps(p, hw);
	if (host_wait_s)
		*host_wait_s = 0;

	if (hw->cpu)
		return opcost_cpu_compute_s(p, hw, op, stage);
	if (op->sub == COMP_OPTIMIZER) {
		if (p->opt_place != PLACE_GPU) /* CPU Adam over this rank's fp32 partition */
			return over((double)p->stages[stage].part_elems, hw->cpu_adam_elems_per_s);
		return fmax(over(op->flops, g->tflops_fp32 * 1e12), over(op->bytes, hbm));
	}
	if (op->sub == COMP_GRAD_ACCUM) /* an elementwise add: memory-bound */
		return over(op->bytes, hbm);
	if (op->sub == COMP_RECOMPUTE && p->sc->ckpt == CKPT_SELECTIVE && is_block(p, op->unit) &&
	    p->n_units > op->unit)
		return attention_recompute_s(p, hw, op, host_wait_s);
	double gemm = 0;
	if (op->flops > 0 && is_block(p, op->unit) && p->n_units > op->unit)
		gemm = block_gemm_s(p, hw, op);
	if (op->flops > 0 && gemm <= 0) {
		double per = is_block(p, op->unit) ? GEMMS_PER_BLOCK : 1;
		if (op->sub == COMP_BWD)
			per *= 2;
		gemm = over(op->flops, sustained_peak(p, hw) * hw_curve_eval(&hw->gemm, op->flops / per));
	}
	double elementwise = 0; /* layer norms, activations, softmax, dropout: memory-bound */
	if (op->unit >= 0 && op->unit < p->n_units && p->activations_known) {
		const UnitPlan *u = &p->units[op->unit];
		int bwd = op->sub == COMP_BWD;
		/* softmax and dropout run over the scores whether they are kept or (selective
		 * recompute) rebuilt for the backward, which then runs theirs */
		double kept = p->sc->ckpt == CKPT_SELECTIVE ? 0 : u->score_bytes;
		/* torch autocast: forward (and recompute) reads each cast weight in fp32 and writes
		 * its 16-bit copy, backward reads its 16-bit gradient and writes the fp32 one: 6
		 * bytes an element each way (plan.c cast_elems; 0 without autocast) */
		elementwise = over((u->act_bytes - kept) *
					   (bwd ? hw->elementwise_bwd : hw->elementwise_fwd) +
				   u->score_bytes * (bwd ? hw->scores_bwd : hw->scores_fwd) +
				   6.0 * (double)u->cast_elems, hbm);
	}
	return host_bound(hw, fmax(gemm, over(op->bytes, hbm)) + elementwise, op_kernels(p, op),
			  host_wait_s);
}

double opcost_copy_s(const Plan *p, const HwProfile *hw, const Op *op)
{
	const ClusterSpec *c = &p->sc->cluster;
	if (hw->cpu)
		return opcost_cpu_copy_s(p, hw, op);
	if (op->sub == COPY_NVME_READ || op->sub == COPY_NVME_WRITE) /* the node's drives, shared */
		return over(op->bytes,
			    c->gpu.nvme_GBps * GB / (double)c->gpus_per_node * hw->nvme_efficiency);
	return over(op->bytes, c->gpu.pcie_GBps * GB * hw->pcie_efficiency);
}

/* ---- collectives ---- */

/* One GPU's bandwidth to the g members of its group inside its node: NVLink (one direction, the
 * busBw curve) within the NVLink domain, else through the PCIe host bridge. */
static double intra_Bps(const Plan *p, const HwProfile *hw, long long g, double size,
			int allreduce)
{
	const GpuSpec *gpu = &p->sc->cluster.gpu;
	if (g > hw->nvlink_domain)
		return gpu->pcie_GBps * GB * hw->pcie_efficiency;
	double bw = gpu->nvlink_GBps / 2 * GB * hw_curve_eval(&hw->nvlink.efficiency, size);
	return allreduce ? bw * hw->nvlink.allreduce_scale : bw;
}

static double inter_Bps(const Plan *p, const HwProfile *hw, double size)
{
	return p->sc->cluster.gpu.network_GBps * GB * hw_curve_eval(&hw->network.efficiency, size);
}

/* The op's ranks: its group's span, narrowed when the op involves fewer ranks than the group (the
 * tied embedding's all-reduce between the first and the last pipeline stage). */
static GroupSpan op_span(const Plan *p, const Op *op)
{
	GroupSpan sp = p->spans[op->group];
	if (op->nranks > 0 && op->nranks != sp.n) {
		sp.n = op->nranks;
		if (sp.nodes > sp.n)
			sp.nodes = sp.n;
		sp.per_node = (sp.n + sp.nodes - 1) / sp.nodes;
	}
	return sp;
}

/* A call's base latency (the slowest link class it crosses) plus alpha x steps: a ring takes n-1
 * steps per pass (all-reduce two passes) at the slowest hop's latency; tree and hierarchical
 * algorithms take the node's g-1 hops plus log2(nodes) or nodes-1 hops between nodes. */
static double latency_s(const HwProfile *hw, CollKind kind, GroupSpan sp, CollAlgo algo)
{
	double n = (double)sp.n, g = (double)sp.per_node, nodes = (double)sp.nodes;
	double passes = kind == COLL_ALL_REDUCE ? 2 : 1;
	double base = nodes > 1 ? hw->network.base_s : hw->nvlink.base_s;
	if (nodes > 1 && algo != ALGO_RING &&
	    (kind == COLL_ALL_REDUCE || kind == COLL_ALL_GATHER || kind == COLL_REDUCE_SCATTER)) {
		double hops = algo == ALGO_TREE ? ceil(log2(nodes)) : nodes - 1;
		return base + passes * ((g - 1) * hw->nvlink.alpha_s + hops * hw->network.alpha_s);
	}
	return base + passes * (n - 1) * (nodes > 1 ? hw->network.alpha_s : hw->nvlink.alpha_s);
}

/* A send from `stage` to the next stage (forward) or the previous one, over the network when the
 * two sit on different nodes (stages fill nodes in order, per_node of them to a node). */
static double p2p_s(const Plan *p, const HwProfile *hw, const Op *op, int stage, int forward)
{
	GroupSpan sp = p->spans[GROUP_PP];
	long long pp = p->par.pp, peer = forward ? (stage + 1) % pp : (stage + pp - 1) % pp;
	int cross = sp.nodes > 1 && (sp.per_node <= 1 || stage / sp.per_node != peer / sp.per_node);
	if (cross)
		return hw->network.base_s + hw->network.alpha_s +
		       over(op->bytes, inter_Bps(p, hw, op->bytes));
	return hw->nvlink.base_s + hw->nvlink.alpha_s +
	       over(op->bytes, intra_Bps(p, hw, 2, op->bytes, 0));
}

double opcost_coll_s(const Plan *p, const HwProfile *hw, const Op *op, int stage, int forward)
{
	if (op->kind != OP_COLL || op->sub == COLL_P2P_RECV)
		return 0;
	if (hw->cpu)
		return opcost_cpu_coll_s(p, hw, op);
	if (op->sub == COLL_P2P)
		return p2p_s(p, hw, op, stage, forward);
	GroupSpan sp = op_span(p, op);
	if (sp.n <= 1)
		return 0;
	double intra, inter;
	traffic_split(op->sub, op->bytes, sp, p->par.algo, &intra, &inter);
	int in_domain_allreduce = op->sub == COLL_ALL_REDUCE && sp.nodes <= 1;
	/* both link classes work at once; the slower one limits the collective */
	double wire = fmax(over(intra, intra_Bps(p, hw, sp.per_node, op->bytes, in_domain_allreduce)),
			   over(inter, inter_Bps(p, hw, op->bytes)));
	return latency_s(hw, op->sub, sp, p->par.algo) + wire;
}

/* ---- the cache ---- */

/* A duration depends on the op's contents, not on where it sits: a step repeats the same few
 * ops (one block's forward, its tensor-parallel all-reduce, ...) many times, so each duration is
 * priced once and looked up after, by everything it depends on (compared exactly, so the result
 * is the one pricing it again would give). The cache holds a few keys per kind of op (compute
 * or collective, by sub-kind), searched in turn: cheaper than hashing for the handful of distinct
 * ops a schedule has. */
#define DUR_CLASSES (N_COMPS + N_COLLS)
#define DUR_WAYS 4

/* A key is whole 64-bit words, each written once and compared as bits (so the same exact
 * comparison as before, and no byte stores read back as wider loads, which stall the CPU's
 * store forwarding): [0] kind, sub, group (a compute op: whether its unit is the embedding),
 * is_block (2 for MoE) and nranks; [1] aux (a send:
 * its stage x 2 + direction; the optimizer: its stage); then bytes, flops, the unit's activation
 * bytes and a block's forward FLOPs (what, with is_block, tells its GEMMs apart: blocks of one
 * kind share their weights' shapes). */
#define KEY_WORDS 6

typedef struct DurKey {
	uint64_t w[KEY_WORDS];
} DurKey;

typedef struct DurWays {
	DurKey key[DUR_WAYS];
	double dur_s[DUR_WAYS], wait_s[DUR_WAYS]; /* the duration, and its host wait */
	int used, next;   /* keys held; the way the next miss replaces */
} DurWays;

struct OpCostCache {
	DurWays ways[DUR_CLASSES];
};

static uint64_t bits(double x)
{
	uint64_t b;
	memcpy(&b, &x, sizeof(b));
	return b;
}

/* The key of op's duration on stage `stage`: the fields opcost_compute_s and opcost_coll_s
 * read (a unit enters only through whether it is a block, MoE or not, or the embedding, its FLOPs
 * and its activation bytes). */
static void dur_key(const Plan *p, const Op *op, int stage, int forward, DurKey *k)
{
	uint64_t is_blk = 0, group = 0, aux = 0, nranks = 0;
	double act = 0, unit_flops = 0, flops = 0;
	if (op->kind == OP_COMPUTE) {
		int known = op->unit >= 0 && op->unit < p->n_units;
		flops = op->flops;
		is_blk = is_block(p, op->unit) ? 1 + (known && p->units[op->unit].moe) : 0;
		act = known && p->activations_known ? p->units[op->unit].act_bytes : -1;
		unit_flops = known ? p->units[op->unit].fwd_flops : -1;
		aux = op->sub == COMP_OPTIMIZER ? (uint64_t)(uint32_t)stage : 0;
		group = op->unit == 0; /* the embedding's kernels are not the head's (op_kernels) */
	} else {
		group = op->group;
		nranks = (uint32_t)op->nranks;
		aux = op->sub == COLL_P2P ? (uint64_t)(uint32_t)(stage * 2 + forward) : 0;
	}
	k->w[0] = op->kind | (uint64_t)op->sub << 8 | group << 16 | is_blk << 24 | nranks << 32;
	k->w[1] = aux;
	k->w[2] = bits(op->bytes);
	k->w[3] = bits(flops);
	k->w[4] = bits(act);
	k->w[5] = bits(unit_flops);
}

/* Word by word, most telling first: a loop here is vectorised into 16-byte loads of a key just
 * stored as 8-byte words, which stalls as the byte stores did. */
static int key_eq(const DurKey *a, const DurKey *b)
{
	return a->w[0] == b->w[0] && a->w[2] == b->w[2] && a->w[3] == b->w[3] &&
	       a->w[1] == b->w[1] && a->w[4] == b->w[4] && a->w[5] == b->w[5];
}

OpCostCache *opcost_cache_create(void)
{
	return calloc(1, sizeof(OpCostCache));
}

void opcost_cache_destroy(OpCostCache *c)
{
	free(c);
}

double opcost_cached_s(OpCostCache *c, const Plan *p, const HwProfile *hw, const Op *op, int stage,
		       int forward)
{
	return opcost_cached_wait_s(c, p, hw, op, stage, forward, NULL);
}

double opcost_cached_wait_s(OpCostCache *c, const Plan *p, const HwProfile *hw, const Op *op,
			    int stage, int forward, double *host_wait_s)
{
	DurKey k;
	dur_key(p, op, stage, forward, &k);
	DurWays *w = &c->ways[op->kind == OP_COMPUTE ? op->sub % N_COMPS : N_COMPS + op->sub % N_COLLS];
	for (int i = 0; i < w->used; i++)
		if (key_eq(&w->key[i], &k)) {
			if (host_wait_s)
				*host_wait_s = w->wait_s[i];
			return w->dur_s[i];
		}
	double wait = 0;
	double d = op->kind == OP_COMPUTE ? opcost_compute_wait_s(p, hw, op, stage, &wait) :
					    opcost_coll_s(p, hw, op, stage, forward);
	int i = w->used < DUR_WAYS ? w->used++ : w->next;
	w->next = (i + 1) % DUR_WAYS;
	w->key[i] = k, w->dur_s[i] = d, w->wait_s[i] = wait;
	if (host_wait_s)
		*host_wait_s = wait;
	return d;
}

#include "opcost_cpu.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

/* Dimensions as the kernels name them: B = micro-batch, T = sequence, C = channels, H = heads,
 * V = vocabulary; N = B T tokens. */

static const HwCpuLevel *level_of(const Plan *p, const HwProfile *hw)
{
	return hwcpu_level(hw->cpu, (int)p->sc->cluster.gpus_per_node);
}

static int flavour_of(const Plan *p)
{
	return p->sc->ds.dtype == DT_FP32 ? HWCPU_FP32 : HWCPU_16BIT;
}

/* ---- checking ---- */

int opcost_cpu_check(const Plan *p, const HwProfile *hw, PxError *err)
{
	const Scenario *sc = p->sc;
	const ClusterSpec *c = &sc->cluster;
	char have[64];
	if (sc->backend != BACKEND_CPU)
		return px_fail(err, PX_ERR_INPUT, "%s: a CPU profile prices the CPU executor (backend "
			       "\"cpu\"); this scenario runs on GPUs: use a GPU's profile", sc->path);
	if (c->nodes != 1)
		return px_fail(err, PX_ERR_INPUT, "%s: cluster.nodes is %lld: a CPU profile describes "
			       "the ranks of one machine", sc->path, c->nodes);
	if (p->par.tp > 1 || p->par.pp > 1)
		return px_fail(err, PX_ERR_INPUT, "%s: tensor or pipeline parallelism: a CPU profile "
			       "prices data and expert parallelism's collectives only (all_reduce, "
			       "all_gather, reduce_scatter, all_to_all)", sc->path);
	if (sc->ckpt == CKPT_SELECTIVE)
		return px_fail(err, PX_ERR_INPUT, "%s: activation_checkpointing is \"selective\": a "
			       "CPU profile times the CPU executor's kernels, which recompute whole "
			       "blocks or nothing (use \"none\" or \"full\")", sc->path);
	hwcpu_levels_text(hw->cpu, have, sizeof(have));
	const HwCpuLevel *l = level_of(p, hw);
	if (!l)
		return px_fail(err, PX_ERR_INPUT, "%s: the CPU profile has no measurement with %lld "
			       "ranks on the machine (it has %s): run `parallax calibrate --backend "
			       "cpu --ranks %lld` to measure it", sc->path, c->gpus_per_node, have,
			       c->gpus_per_node);
	const OptimKind *ok = sc->ds.opt;
	if (ok && ok->error_feedback != EF_NONE &&
	    (p->onebit_step == ONEBIT_COMPRESSED || p->onebit_step == ONEBIT_INIT) &&
	    p->dp > 1 && hwcpu_coll_s(l, COLL_ALL_TO_ALL, 1) < 0)
		return px_fail(err, PX_ERR_INPUT, "%s: the CPU profile has no all_to_all at %d ranks "
			       "(the 1-bit compressed all-reduce's first phase; profiles written "
			       "before parallax timed it lack it): calibrate again with this "
			       "parallax", sc->path, l->ranks);
	if (!l->have_kernels[flavour_of(p)])
		return px_fail(err, PX_ERR_INPUT, "%s: the CPU profile has no %s kernels at %d ranks "
			       "(the executor's %s units): calibrate again with this parallax",
			       sc->path, hwcpu_flavour_names[flavour_of(p)], l->ranks,
			       dtype_name(sc->ds.dtype));
	return 0;
}

double opcost_cpu_peak(const Plan *p, const HwProfile *hw)
{
	const HwCpuLevel *l = level_of(p, hw);
	return l ? hwcpu_gemm_peak(l) : 0;
}

/* ---- compute ---- */

typedef enum { UNIT_EMBED, UNIT_BLOCK, UNIT_HEAD } UnitKind;

static UnitKind unit_kind(const Plan *p, int u)
{
	if (u <= 0)
		return UNIT_EMBED;
	return u <= p->sc->model.L ? UNIT_BLOCK : UNIT_HEAD;
}

/* The unit's products on the executor: the model's weight products (m tokens, k in, n out),
 * forward y = x w, backward dx = dy w^T and dw = x^T dy; the tied head computes x wte^T, so its
 * forms turn around (dx = dlogits wte, dwte = dlogits^T x). Attention's two products are loops in
 * the kernel, priced with its non-GEMM terms. */
static double unit_gemms_s(const Plan *p, const HwCpuLevel *l, int u, int bwd)
{
	ModelGemm g[MODEL_MAX_GEMMS];
	GemmShape gs = plan_gemm_shape(p);
	int tied_head = unit_kind(p, u) == UNIT_HEAD && p->sc->model.lay.tied;
	int n = model_known(&p->sc->model) ? model_unit_gemms(&p->sc->model, u, &gs, g) : 0;
	double s = 0;
	for (int i = 0; i < n; i++) {
		if (g[i].kind != GEMM_WEIGHT)
			continue;
		double m = g[i].m, k = g[i].k, o = g[i].n, t = 0;
		if (!bwd)
			t = hwcpu_gemm_s(l, tied_head ? HWCPU_NT : HWCPU_NN, m, o, k);
		else if (tied_head)
			t = hwcpu_gemm_s(l, HWCPU_NN, m, k, o) + hwcpu_gemm_s(l, HWCPU_TN, o, k, m);
		else
			t = hwcpu_gemm_s(l, HWCPU_NT, m, k, o) + hwcpu_gemm_s(l, HWCPU_TN, k, o, m);
		s += t * g[i].batch;
	}
	return s;
}

/* Elements of the unit's working parameters: its own, and the tied head's token embedding. */
static double unit_elems(const Plan *p, int u)
{
	double own = (double)p->units[u].params;
	return unit_kind(p, u) == UNIT_HEAD ? own + (double)model_tied_elems(&p->sc->model) : own;
}

/* The kernel call's non-GEMM time: its terms (hwcpu.h) at this shape. An MoE block
 * (kernels/moe_cpu.c) takes the dense block's: its products are the model's (the router, the
 * local experts over capacity x ep rows each), its GELU runs over E x capacity rows where the
 * dense block's runs over N (as many at capacity_factor 1), and its router softmax, dispatch and
 * combine copies are not timed on their own. The attention terms are
 * measured on the dense causal kernel, which visits T (T + 1) / 2 (query, key) pairs a head;
 * under a block-sparse layout the units' kernel visits the layout's causal pairs
 * (kernels/sparse_eager_cpu.c), and T^2 is scaled by their ratio. */
static double unit_kernel_s(const Plan *p, const HwCpuLevel *l, int u, int bwd)
{
	const Scenario *sc = p->sc;
	const ModelSpec *m = &sc->model;
	double B = (double)sc->ds.micro_batch, T = (double)sc->seq, C = (double)m->h, TT = T * T;
	if (sc->ds.sparse.mode != SPARSE_OFF && unit_kind(p, u) == UNIT_BLOCK)
		TT *= sc->sparse_causal_pairs / (T * (T + 1) / 2);
	double terms[HWCPU_TERMS] = {B * T * C, B * TT * C, B * TT * (double)m->a,
				     B * T * (double)m->V, unit_elems(p, u)};
	static const HwCpuKernel kinds[3][2] = {{HWCPU_EMBED_FWD, HWCPU_EMBED_BWD},
						{HWCPU_BLOCK_FWD, HWCPU_BLOCK_BWD},
						{HWCPU_HEAD_FWD, HWCPU_HEAD_BWD}};
	return hwcpu_kernel_s(l, flavour_of(p), kinds[unit_kind(p, u)][bwd], terms);
}

/* The runner around a unit's kernel: its working parameters copied in (load_params); after a
 * backward, its fp32 gradients added into where the schedule reduces them from, in the
 * gradients' dtype (move_grads; the embedding also takes the head's share of the tied
 * gradient). */
static double unit_storage_s(const Plan *p, const HwCpuLevel *l, int u, int bwd)
{
	Dtype pdt = p->sc->ds.dtype, gdt = p->sc->ds.grad_dtype;
	double n = unit_elems(p, u), s = hwcpu_copy_s(l, n * dtype_bytes(pdt));
	if (!bwd)
		return s;
	s += hwcpu_elem_s(l, HWCPU_ADD, gdt, DT_FP32, n);
	if (u == 0)
		s += hwcpu_elem_s(l, HWCPU_ADD, gdt, gdt, (double)model_tied_elems(&p->sc->model));
	return s;
}

/* The optimizer over this rank's partition (runner_optimize): the overflow check (fp16), the
 * gradients' squares for the norm, their fp32 copy, the update, the 16-bit parameters rounded
 * back, the gradients zeroed. */
static double optimizer_s(const Plan *p, const HwCpuLevel *l, int stage)
{
	const DsConfig *ds = &p->sc->ds;
	double n = (double)p->stages[stage].part_elems;
	int offload = p->opt_place != PLACE_GPU;
	Dtype g = offload ? DT_FP32 : ds->grad_dtype;
	double s = hwcpu_elem_s(l, HWCPU_SUMSQ, g, g, n);
	if (ds->dtype == DT_FP16)
		s += hwcpu_elem_s(l, HWCPU_NONFINITE, g, g, n);
	if (g != DT_FP32)
		s += hwcpu_elem_s(l, HWCPU_CONVERT, DT_FP32, g, n);
	int sgd = !strcasecmp(ds->optimizer, "SGD");
	double per = sgd ? l->sgd_s : l->adamw_s;
	/* an unmeasured update: a pass over what it reads and writes (Adam: w, m, v rewritten, g
	 * read; SGD: w and its buffer) */
	s += per > 0 ? n * per : hwcpu_copy_s(l, n * 4 * (sgd ? 3 : 5));
	/* the executor's foreach form (ops_adamw_foreach_step) in two passes: the denominators
	 * written and read again, the first moment read again (12 bytes an element) */
	if (!sgd && p->opt_impl == OPT_IMPL_FOREACH)
		s += hwcpu_copy_s(l, n * 12);
	if (p->master_bytes && !offload)
		s += hwcpu_elem_s(l, HWCPU_CONVERT, ds->dtype, DT_FP32, n);
	double grads = p->stage < 2 ? (double)p->stages[stage].flat_dense : n;
	s += hwcpu_fill_s(l, grads * dtype_bytes(ds->grad_dtype));
	if (offload)
		s += hwcpu_fill_s(l, n * 4);
	return s;
}

double opcost_cpu_compute_s(const Plan *p, const HwProfile *hw, const Op *op, int stage)
{
	const HwCpuLevel *l = level_of(p, hw);
	if (!l)
		return INFINITY;
	if (op->sub == COMP_OPTIMIZER)
		return optimizer_s(p, l, stage);
	if (op->sub == COMP_GRAD_ACCUM) { /* the .grad tensors added into the accumulated ones,
					     each cast first in another dtype (accumulate_hp) */
		Dtype g = p->sc->ds.grad_dtype, d = p->sc->ds.dtype;
		return g == d ? hwcpu_elem_s(l, HWCPU_ADD, g, d, op->flops) :
				hwcpu_elem_s(l, HWCPU_CONVERT, g, d, op->flops) +
					hwcpu_elem_s(l, HWCPU_ADD, g, g, op->flops);
	}
	int u = op->unit, bwd = op->sub == COMP_BWD;
	if (u < 0 || u >= p->n_units)
		return 0;
	return unit_gemms_s(p, l, u, bwd) + unit_kernel_s(p, l, u, bwd) +
	       unit_storage_s(p, l, u, bwd);
}

/* ---- collectives, copies, allocations ---- */

/* n fp32 elements of a 1-bit or quantization loop at per_elem seconds; unmeasured (0): as
 * copying their bytes, as hwcpu_elem_s prices an unmeasured storage loop */
static double loop_s(const HwCpuLevel *l, double per_elem, double n)
{
	return per_elem > 0 ? per_elem * n : hwcpu_copy_s(l, 4 * n);
}

/* A ZeRO++ gather of n elements over the op's ranks (exec/runner_zpp.c). qwZ's (1-byte
 * elements): this rank's piece widened to fp32 and quantized, the values and the scales
 * gathered (two calls), every piece dequantized and narrowed back. hpZ's forward gathers
 * over the data-parallel group also keep the rank's piece of its node (a copy). */
static double zpp_gather_s(const Plan *p, const HwCpuLevel *l, const Op *op)
{
	Dtype pdt = p->sc->ds.dtype;
	double n = (double)op->elems, k = n / op->nranks, s;
	if (op->elem_bytes == 1)
		s = hwcpu_coll_s(l, COLL_ALL_GATHER, n) +
		    hwcpu_coll_s(l, COLL_ALL_GATHER, op->bytes - n) +
		    hwcpu_elem_s(l, HWCPU_CONVERT, DT_FP32, pdt, k) + loop_s(l, l->quantize_s, k) +
		    loop_s(l, l->dequantize_s, n) + hwcpu_elem_s(l, HWCPU_CONVERT, pdt, DT_FP32, n);
	else
		s = hwcpu_coll_s(l, COLL_ALL_GATHER, op->bytes);
	if (p->hpz > 1 && op->group == GROUP_DP)
		s += hwcpu_copy_s(l, n / (double)p->hpz * dtype_bytes(pdt));
	return s;
}

double opcost_cpu_coll_s(const Plan *p, const HwProfile *hw, const Op *op)
{
	const HwCpuLevel *l = level_of(p, hw);
	if (op->kind != OP_COLL || op->sub == COLL_P2P_RECV || op->nranks <= 1)
		return 0;
	if (l && op->sub == COLL_ALL_GATHER && op->role == ROLE_PREFETCH &&
	    (op->elem_bytes == 1 || p->hpz > 1))
		return zpp_gather_s(p, l, op);
	double s = l ? hwcpu_coll_s(l, op->sub, op->bytes) : -1;
	if (s < 0)
		return INFINITY; /* opcost_cpu_check keeps other kinds out */
	/* a 1-bit compressed all-reduce's arithmetic, priced with its first collective
	 * (exec/onebit_comm.c): the worker compensates and compresses the padded buffer, the
	 * chunk's owner reads n ranks' signs of its chunk (padded in all) and compresses the chunk,
	 * and every rank expands the gathered signs (padded) */
	if (op->role == ROLE_ONEBIT_SIGNS) {
		double padded = (double)op->elems * 8, n = op->nranks;
		s += loop_s(l, l->onebit_compress_s, padded + padded / n) +
		     loop_s(l, l->onebit_expand_s, 2 * padded);
	}
	/* BF16_Optimizer's reduction in another type than the gradients': the gradients cast to
	 * it and the sums cast back (exec/runner_coll.c, cast_reduce) */
	if (op->role == ROLE_GRAD_REDUCE && p->bf16_optimizer && p->comm_bytes != p->grad_bytes) {
		Dtype g = p->sc->ds.grad_dtype, c = p->sc->ds.comm_dtype;
		s += hwcpu_elem_s(l, HWCPU_CONVERT, c, g, (double)op->elems) +
		     hwcpu_elem_s(l, HWCPU_CONVERT, g, c, (double)op->elems);
	}
	/* stage 2-3: the bucket (or the persistent gradients) is zeroed for its next use and this
	 * rank's reduced slice added into the gradient partition */
	if (op->sub == COLL_REDUCE_SCATTER && p->stage >= 2 && p->opt_place == PLACE_GPU) {
		Dtype g = p->sc->ds.grad_dtype;
		s += hwcpu_fill_s(l, op->bytes) +
		     hwcpu_elem_s(l, HWCPU_ADD, g, g, (double)op->elems / op->nranks);
	}
	return s;
}

/* Host and "device" are one memory: an offload copy is the conversion it stands for (the
 * runner's copy()): a reduced slice added into the fp32 gradients, the gradients or the updated
 * parameters converted. */
double opcost_cpu_copy_s(const Plan *p, const HwProfile *hw, const Op *op)
{
	const HwCpuLevel *l = level_of(p, hw);
	Dtype pdt = p->sc->ds.dtype, gdt = p->sc->ds.grad_dtype;
	if (!l)
		return INFINITY;
	switch (op->sub) {
	case COPY_D2H:
		if (op->buf >= 0 && op->elems > 0) /* this rank's slice of a reduction */
			return hwcpu_elem_s(l, HWCPU_ADD, DT_FP32, gdt, (double)op->elems / (double)p->dp);
		return hwcpu_elem_s(l, HWCPU_CONVERT, DT_FP32, gdt, op->bytes / dtype_bytes(gdt));
	case COPY_H2D:
		if (op->unit >= 0) /* stage 3 parameter offload: gathered from the host directly */
			return 0;
		return hwcpu_elem_s(l, HWCPU_CONVERT, pdt, DT_FP32, op->bytes / dtype_bytes(pdt));
	default:
		return hwcpu_copy_s(l, op->bytes);
	}
}

/* An allocation comes zeroed (the pool's memset of what an earlier block left), but for a buffer
 * made empty (buf_empty: the contiguous gradient bucket, reduce_bucket_size elements of which a
 * small model uses a sliver; the front it uses is zeroed as it is filled, not priced apart). */
double opcost_cpu_alloc_s(const Plan *p, const HwProfile *hw, const Op *op)
{
	const HwCpuLevel *l = level_of(p, hw);
	if (!l || op->place == PLACE_NVME || buf_empty(op->what))
		return 0;
	return hwcpu_fill_s(l, op->bytes);
}

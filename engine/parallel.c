#include "parallel.h"

#include <stdio.h>
#include <string.h>

void parallel_defaults(ParallelSpec *p)
{
	memset(p, 0, sizeof(*p));
	p->tp = p->pp = p->ep = p->dp = 1;
	p->virtual_stages = 1;
	p->schedule = PIPE_1F1B;
	p->partition = PART_PARAMETERS;
	p->order = ORDER_TP_PP_DP;
	p->algo = ALGO_RING;
	p->moe.k = 1;
	p->moe.capacity_factor = 1.0;
	p->moe.min_capacity = 8; /* TopKGate's default in deepspeed/moe/sharded_moe.py */
	p->moe.interval = 1;
	p->moe.imbalance = 0; /* not given */
	p->moe.drop_tokens = 1;
	p->moe.use_rts = 1; /* MoE(use_rts=True) in deepspeed/moe/layer.py */
	p->moe.second_sampling = 1; /* MoE(top2_2nd_expert_sampling=True), the same */
}

const char *pipe_schedule_name(PipeSchedule s)
{
	return s == PIPE_GPIPE ? "gpipe" : s == PIPE_INTERLEAVED ? "interleaved" : "1f1b";
}

const char *coll_algo_name(CollAlgo a)
{
	return a == ALGO_TREE ? "tree" : a == ALGO_HIERARCHICAL ? "hierarchical" : "ring";
}

int parallel_parse(const JsonObj *par, ParallelSpec *p, PxNotes *notes, PxError *err)
{
	static const char *const known[] = {"tp", "pp", "ep", "sequence_parallel",
					    "pipeline_schedule", "virtual_stages", "partition_method",
					    "rank_order", "collective_algorithm",
					    "make_vocab_size_divisible_by", NULL};
	static const char *const schedules[] = {"1f1b", "gpipe", "interleaved", NULL};
	static const char *const parts[] = {"uniform", "parameters", "type:transformer", NULL};
	static const char *const orders[] = {"tp-pp-dp", "tp-dp-pp", NULL};
	static const char *const algos[] = {"ring", "tree", "hierarchical", NULL};
	int v;

	if (!par->obj)
		return 0;
	if (jobj_check_keys(par, known, notes))
		return px_fail(err, PX_ERR_RUNTIME, "out of memory");
	if (jobj_int(par, "tp", 1, 1 << 20, p->tp, &p->tp, err) < 0 ||
	    jobj_int(par, "pp", 1, 1 << 20, p->pp, &p->pp, err) < 0 ||
	    jobj_int(par, "ep", 1, 1 << 20, p->ep, &p->ep, err) < 0 ||
	    jobj_bool(par, "sequence_parallel", 0, &p->sequence_parallel, err) < 0 ||
	    jobj_int(par, "virtual_stages", 1, 1 << 20, 1, &p->virtual_stages, err) < 0 ||
	    jobj_int(par, "make_vocab_size_divisible_by", 1, 1 << 20, 0, &p->vocab_divisible,
		     err) < 0)
		return -1;
	if (jobj_choice(par, "pipeline_schedule", schedules, PIPE_1F1B, &v, err) < 0)
		return -1;
	p->schedule = (PipeSchedule)v;
	if (jobj_choice(par, "partition_method", parts, p->partition, &v, err) < 0)
		return -1;
	p->partition = (PartitionMethod)v;
	if (jobj_choice(par, "rank_order", orders, ORDER_TP_PP_DP, &v, err) < 0)
		return -1;
	p->order = (RankOrder)v;
	if (jobj_choice(par, "collective_algorithm", algos, ALGO_RING, &v, err) < 0)
		return -1;
	p->algo = (CollAlgo)v;
	return 0;
}

int parallel_parse_moe(const JsonObj *moe, MoeSpec *m, PxNotes *notes, PxError *err)
{
	static const char *const known[] = {"num_experts", "ep_size", "k", "capacity_factor",
					    "eval_capacity_factor", "min_capacity", "drop_tokens",
					    "expert_interval", "imbalance", "use_residual",
					    "noisy_gate_policy", "use_rts", "top2_2nd_expert_sampling",
					    NULL};
	if (!moe->obj)
		return 0;
	if (jobj_check_keys(moe, known, notes))
		return px_fail(err, PX_ERR_RUNTIME, "out of memory");
	if (jobj_int(moe, "num_experts", 1, 1 << 20, m->experts, &m->experts, err) < 0 ||
	    jobj_int(moe, "k", 1, 64, m->k, &m->k, err) < 0 ||
	    jobj_num(moe, "capacity_factor", 0, 1e6, m->capacity_factor, &m->capacity_factor,
		     err) < 0 ||
	    jobj_int(moe, "min_capacity", 0, 1LL << 40, m->min_capacity, &m->min_capacity, err) < 0 ||
	    jobj_bool(moe, "drop_tokens", m->drop_tokens, &m->drop_tokens, err) < 0 ||
	    jobj_bool(moe, "use_rts", m->use_rts, &m->use_rts, err) < 0 ||
	    jobj_bool(moe, "top2_2nd_expert_sampling", m->second_sampling, &m->second_sampling,
		      err) < 0 ||
	    jobj_int(moe, "expert_interval", 1, 1 << 20, m->interval, &m->interval, err) < 0 ||
	    jobj_num(moe, "imbalance", 1, 1e6, m->imbalance, &m->imbalance, err) < 0)
		return -1;
	if (m->k > m->experts && m->experts > 0) {
		char where[512];
		jobj_where(moe, "k", where, sizeof(where));
		return px_fail(err, PX_ERR_INPUT, "%s: moe.k: %lld experts per token but only %lld "
			       "experts", where, m->k, m->experts);
	}
	return 0;
}

/* ---- layout ---- */

GroupSpan parallel_span(long long n, long long stride, long long gpn)
{
	GroupSpan s = {.n = n, .nodes = 1, .per_node = n};
	if (n <= 1)
		return s;
	if (stride >= gpn) { /* every member on its own node */
		s.nodes = n;
		s.per_node = 1;
	} else if (stride * n > gpn) { /* gpn / stride members per node */
		s.per_node = gpn / stride;
		s.nodes = (n + s.per_node - 1) / s.per_node;
	}
	return s;
}

/* Rank strides: TP is innermost; then PP and DP in the configured order. Expert parallelism
 * groups consecutive data-parallel ranks; the expert-data-parallel group strides over them. */
GroupSpan parallel_group_span(const ParallelSpec *p, LayoutGroup g, long long gpn, long long hpz)
{
	long long pp_stride = p->order == ORDER_TP_PP_DP ? p->tp : p->tp * p->dp;
	long long dp_stride = p->order == ORDER_TP_PP_DP ? p->tp * p->pp : p->tp;
	switch (g) {
	case LAYOUT_TP: return parallel_span(p->tp, 1, gpn);
	case LAYOUT_PP: return parallel_span(p->pp, pp_stride, gpn);
	case LAYOUT_DP: return parallel_span(p->dp, dp_stride, gpn);
	case LAYOUT_EP: return parallel_span(p->ep, dp_stride, gpn);
	case LAYOUT_EDP: return parallel_span(p->dp / p->ep, dp_stride * p->ep, gpn);
	case LAYOUT_HPZ: return parallel_span(hpz, dp_stride, gpn);
	default: return parallel_span(1, 1, gpn);
	}
}

RankCoords parallel_rank_coords(const ParallelSpec *p, long long rank)
{
	long long pp_stride = p->order == ORDER_TP_PP_DP ? p->tp : p->tp * p->dp;
	long long dp_stride = p->order == ORDER_TP_PP_DP ? p->tp * p->pp : p->tp;
	return (RankCoords){rank % p->tp, (rank / pp_stride) % p->pp, (rank / dp_stride) % p->dp};
}

long long parallel_stage_of(const ParallelSpec *p, long long rank)
{
	return parallel_rank_coords(p, rank).stage;
}

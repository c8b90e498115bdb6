/* parallel: how a scenario splits its model over the world: tensor, pipeline, expert and data
 * parallelism, the pipeline schedule and partition, Mixture-of-Experts routing, and the rank
 * layout over nodes (which group's members share a node). Owns reading the "parallelism" and
 * "moe" objects (and DeepSpeed's and Mixtral's keys for the same things) and the layout
 * arithmetic; the per-stage work is pipeline.c's and build.c's. */
#ifndef PX_PARALLEL_H
#define PX_PARALLEL_H

#include "jdoc.h"

typedef enum { PIPE_1F1B, PIPE_GPIPE, PIPE_INTERLEAVED } PipeSchedule;
typedef enum { PART_UNIFORM, PART_PARAMETERS, PART_TRANSFORMER } PartitionMethod;
typedef enum { ALGO_RING, ALGO_TREE, ALGO_HIERARCHICAL } CollAlgo;
typedef enum { ORDER_TP_PP_DP, ORDER_TP_DP_PP } RankOrder;

typedef struct MoeSpec {
	long long experts;       /* E; 0 for a dense model */
	long long k;             /* experts per token */
	double capacity_factor;
	long long min_capacity;
	long long interval;      /* every interval-th block has an MoE MLP (1 = all) */
	double imbalance;        /* tokens of the busiest expert over the average, >= 1; 0 when
				    not given: without drop_tokens the plan then takes the busiest
				    count expected under uniform routing (plan.c) */
	int drop_tokens;
	int use_rts;             /* top-1's random token selection (DeepSpeed's default on): which
				    tokens over capacity are dropped; the sizes are the same */
	int second_sampling;     /* top-2's Gumbel sampling of the second expert
				    (top2_2nd_expert_sampling, on by default): which expert, not
				    the sizes */
} MoeSpec;

typedef struct ParallelSpec {
	long long tp, pp, ep, dp;   /* dp is derived: world / (tp * pp) */
	int tp_uneven_heads;        /* tp is DeepSpeed's AutoTP, which spreads heads that tp does
				       not divide unevenly (module_inject/tp_shard.py); Megatron's
				       tp must divide them */
	int sequence_parallel;
	PipeSchedule schedule;
	long long virtual_stages;   /* model chunks per pipeline stage (interleaved) */
	PartitionMethod partition;
	RankOrder order;
	CollAlgo algo;
	long long vocab_divisible;  /* Megatron's --make-vocab-size-divisible-by: the vocabulary
				       padded to a multiple of it times tp (scenario.c); 0 when not
				       given: no padding */
	MoeSpec moe;
} ParallelSpec;

/* Defaults: everything 1, 1F1B, partition by parameters (DeepSpeed's PipelineModule default),
 * TP inside a node first, then PP, then DP; ring collectives. */
void parallel_defaults(ParallelSpec *p);
/* Read the scenario's "parallelism" object (may be absent: par->obj == NULL). */
int parallel_parse(const JsonObj *par, ParallelSpec *p, PxNotes *notes, PxError *err);
/* Read the scenario's "moe" object (DeepSpeed MoE layer arguments). */
int parallel_parse_moe(const JsonObj *moe, MoeSpec *m, PxNotes *notes, PxError *err);

const char *pipe_schedule_name(PipeSchedule s);
const char *coll_algo_name(CollAlgo a);

/* ---- rank layout ---- */

typedef enum { LAYOUT_TP, LAYOUT_PP, LAYOUT_DP, LAYOUT_EP, LAYOUT_EDP, LAYOUT_HPZ, N_LAYOUT } LayoutGroup;

/* Where one communication group's members sit: n members, of which per_node share each of the
 * nodes it spans. */
typedef struct GroupSpan {
	long long n, nodes, per_node;
} GroupSpan;

/* Members of a group at stride `stride` (in ranks) over gpus_per_node-GPU nodes. */
GroupSpan parallel_span(long long n, long long stride, long long gpus_per_node);
/* The span of each group kind under p's layout; hpz is the ZeRO++ secondary-partition size. */
GroupSpan parallel_group_span(const ParallelSpec *p, LayoutGroup g, long long gpus_per_node,
			      long long hpz);
/* The pipeline stage rank r belongs to. */
long long parallel_stage_of(const ParallelSpec *p, long long rank);

/* Where rank r sits under p's layout: its index in its tensor-parallel group, its pipeline stage
 * and its index in its data-parallel group (the strides of parallel_group_span). Ranks with the
 * same tp index and stage form a data-parallel group, ordered by dp index; ranks with the same
 * tp and dp index a pipeline, ordered by stage. */
typedef struct RankCoords {
	long long tp, stage, dp;
} RankCoords;
RankCoords parallel_rank_coords(const ParallelSpec *p, long long rank);

#endif

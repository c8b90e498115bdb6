/* plan: a scenario resolved into numbers every rank agrees on: world and data-parallel size,
 * batch arithmetic, byte widths of each state, where each state lives, and how every layer unit's
 * parameters are partitioned. It does not order anything in time: build.c turns a plan into each
 * rank's schedule. */
#ifndef PX_PLAN_H
#define PX_PLAN_H

#include "scenario.h"
#include "schedule.h"

typedef struct UnitPlan {
	long long params;        /* elements the unit owns */
	long long persist_elems; /* stage 3: owned elements in tensors at or under the persistence
				    threshold, kept whole on every rank */
	long long part_elems;    /* stage 3: this rank's share of the other tensors, each tensor split
				    into dp equal padded pieces */
	long long gather_elems;  /* stage 3: elements an all-gather brings in before the unit runs:
				    dp * part_elems, plus the tied embedding for the head */
	long long gather_part;   /* stage 3: this rank's input to that all-gather */
	int n_tensors;
	long long tensor_elems[MODEL_MAX_TENSORS]; /* owned tensors, forward order */
	double fwd_flops;        /* one micro-batch */
	double act_bytes;        /* kept for backward without recompute (or recomputed) */
	double ckpt_bytes;       /* kept for backward under full recompute */
} UnitPlan;

typedef struct Plan {
	const Scenario *sc;
	long long world, dp;
	int stage;
	long long n_params;       /* Ψ */
	long long flat_elems;     /* stage 0-2: Ψ padded to a multiple of dp */
	long long part_elems;     /* parameters whose optimizer state this rank owns */
	long long persist_elems;  /* stage 3: sum of the units' persist_elems */
	int param_bytes, grad_bytes, comm_bytes;
	int master_bytes;         /* 4 with 16-bit training, 0 in fp32 */
	int state_bytes;          /* 4 per optimizer state */
	int mixed;                /* 16-bit parameters with fp32 master weights */
	Place opt_place, param_place, ckpt_place;
	double reduce_bucket_elems, allgather_bucket_elems;
	int n_units;
	UnitPlan *units;          /* owned, n_units */
	ActivShape shape;
	int activations_known;    /* 0 for a params-only model */
} Plan;

int plan_build(Plan *p, const Scenario *sc, PxError *err);
void plan_free(Plan *p);

/* The ZeRO paper's accounting of model states per device (bytes), for Ψ parameters over nd ranks:
 * 16-bit params and grads (2 + 2) and K = 12 bytes of fp32 optimizer state with mixed-precision
 * Adam; the widths come from the plan so fp32 and other optimizers follow the same formulas. */
typedef struct IdealStates {
	double params_bytes, grads_bytes, optimizer_bytes, total_bytes;
} IdealStates;
IdealStates plan_ideal_states(double psi, long long nd, int stage, int p_bytes, int g_bytes,
			      int k_bytes);

#endif

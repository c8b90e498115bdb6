/* timeline: the step time of a plan, by replaying every pipeline stage's schedule as a
 * discrete-event simulation of one rank of that stage: a compute stream, a prefetch stream
 * (ZeRO-3 all-gathers), a gradient-reduction stream (overlap_comm), two host-copy streams, and
 * the pipeline's sends and receives coupling the stages, so that bubbles emerge from the order
 * rather than from a formula. Owns the order of events and the breakdown of the compute stream's
 * time; durations of single ops are opcost.c's, memory and bytes stay memory.c's and traffic.c's.
 * Assumptions, formulas and known error: docs/time_model.md. */
#ifndef PX_SIM_TIMELINE_H
#define PX_SIM_TIMELINE_H

#include "../engine/plan.h"
#include "../engine/schedule.h"
#include "hwprofile.h"
#include "opcost.h"

/* Where a stage's time went, as seen by its compute stream: the fields sum to the stage's end. */
typedef struct TimeBreakdown {
	double compute_s;         /* fwd + bwd + recompute + optimizer */
	double fwd_s, bwd_s, recompute_s;
	double optimizer_s;       /* on the GPU, or at CPU Adam speed with optimizer offload */
	double host_wait_s;       /* of compute_s: the GPU idle while the host issues a pass's
				     kernels (their issue time over the pass's GPU time) */
	double comm_s[N_GROUPS];  /* exposed communication: the compute stream inside a blocking
				     collective of that group, or waiting for an overlapped one */
	double bubble_s;          /* waiting for another pipeline stage (receives, the tied
				     embedding's all-reduce partner) */
	double offload_stall_s;   /* waiting for host or NVMe copies */
} TimeBreakdown;

typedef struct StageTime {
	double end_s;             /* the stage's last stream goes idle */
	TimeBreakdown bd;
	double model_flops;       /* forward + backward FLOPs of one rank per step */
	double hw_flops;          /* the same plus recompute */
	long long ops;            /* ops simulated */
	long long ops_extrapolated; /* ops of repeat-block iterations and 1F1B steady-state rounds
				       not simulated but extrapolated */
} StageTime;

typedef struct TimeResult {
	double step_s;            /* the slowest stage's end */
	int n_stages;
	StageTime *stages;        /* owned, one per pipeline stage */
	int slowest;
	TimeBreakdown breakdown;  /* the slowest stage's */
	double tokens_per_step;   /* train_batch_size x seq */
	double tokens_per_s;
	/* per GPU per step: model FLOPs are the schedule's forward + backward FLOPs without
	 * recompute (Narayanan et al. 2021's "model FLOPs"); hardware FLOPs add recompute */
	double model_flops_per_gpu, hw_flops_per_gpu;
	double tflops_per_gpu;    /* model FLOPs / step / 1e12 */
	double hw_tflops_per_gpu; /* what Narayanan et al. report as "achieved teraFLOP/s per GPU" */
	double peak_flops_per_gpu;/* dense peak of the training dtype (bf16/fp16; fp32 otherwise) */
	double mfu;               /* model FLOPs / (step_s x peak) */
	double hfu;               /* hardware FLOPs / (step_s x peak) */
} TimeResult;

typedef struct TimelineOpts {
	int full_replay;          /* 1: replay every repeat-block iteration and every pipeline
				     round (no extrapolation) */
} TimelineOpts;

/* Replay stages[0 .. p->par.pp) (stage s's schedule) against hw; out is caller-owned and must be
 * released with timeline_result_free. Errors: a dtype without a peak on this GPU (PX_ERR_INPUT),
 * unbalanced repeat blocks or pipeline sends and receives that never match (PX_ERR_RUNTIME). */
int timeline_run(const Plan *p, Schedule *const *stages, const HwProfile *hw, TimeResult *out,
		 PxError *err);
int timeline_run_opts(const Plan *p, Schedule *const *stages, const HwProfile *hw,
		      const TimelineOpts *opts, TimeResult *out, PxError *err);
void timeline_result_free(TimeResult *r);

/* Wall time and GPU-hours to train `tokens` tokens at r's throughput on `world` GPUs. */
void timeline_train_cost(const TimeResult *r, double tokens, long long world, double *seconds,
			 double *gpu_hours);

/* The durations of single ops are opcost.h's. */

#endif

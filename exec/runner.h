/* runner: runs one rank's schedule for real: allocations through the tracking arena, the GPT
 * kernels for each unit's forward, backward and recompute through a compute backend (CPU or
 * CUDA), the collectives through the communication layer, and the optimizer over this rank's
 * partition. It executes the schedule in its order and nothing else: the simulator prices the same
 * ops. Collectives the replay puts on a stream of their own (engine/streams.h: stage-3 prefetch,
 * overlap_comm reductions) are started at their op and waited for where the schedule next needs
 * their data or buffer (docs/gpu_comm.md). Launching, logging and storing results are
 * cmd_run.c's. */
#ifndef PX_EXEC_RUNNER_H
#define PX_EXEC_RUNNER_H

#include <stdio.h>

#include "../engine/plan.h"
#include "arena.h"
#include "comm.h"
#include "compute.h"
#include "data.h"

typedef struct Runner Runner;

typedef struct StepResult {
	double loss;       /* mean over the global batch */
	int skipped;       /* fp16 overflow: the update was skipped */
	double loss_scale; /* the loss scale this step used (1 without fp16) */
	double grad_norm;  /* global gradient norm before clipping */
	double lr;         /* the learning rate the update used (0 when skipped) */
	int onebit_step;   /* a 1-bit optimizer's step's OneBitStep (engine/onebit.h), else
			      ONEBIT_FULL */
} StepResult;

/* 0 when this executor runs the plan (GPT-2, data parallelism with ZeRO 0-3, Adam/AdamW/SGD and
 * OneBitAdam, ZeroOneAdam and OneBitLamb in fp32 or fp16 (at stage 0, data parallelism alone),
 * optimizer and stage-3 parameter offload to the CPU, contiguous gradients, pipeline parallelism
 * with ZeRO 0-1 and fp32 tensor and sequence parallelism with ZeRO 0-3,
 * ZeRO++'s qwZ, hpZ and qgZ with data parallelism alone, on the CPU backend...),
 * else -1 with a message naming what it does not run. */
int runner_supported(const Plan *p, PxError *err);

/* The communicators of the groups one rank belongs to, NULL where its group is this rank alone
 * (or it belongs to none). */
typedef struct RunnerComms {
	Comm *world;   /* every rank: the loss's mean, outside the schedule */
	Comm *dp;      /* the stage's data-parallel ranks, by dp index */
	/* the pipeline's stages, by stage (pp > 1): activations travel forward on one, gradients
	 * back on the other, so that a stage's two kinds of message to one peer (the interleaved
	 * order's wrap-around on 2 stages) never match each other's receives; the one-value
	 * all-reduces over the stages run on act */
	Comm *pp_act, *pp_grad;
	Comm *tied;    /* the first and last stage of this rank's pipeline (a tied embedding) */
	Comm *tp;      /* the tensor-parallel group, by tp index: the units' own collectives */
	/* ZeRO++ (runner_zpp.c): hpZ's secondary-partition group, and qgZ's two all-to-all groups,
	 * the ranks of one node and one rank of each node */
	Comm *hpz, *node, *xnode;
	/* an MoE model's expert-parallel group (consecutive data-parallel ranks, by ep index: the
	 * all-to-alls) and expert-data-parallel group (the data-parallel ranks holding the same
	 * experts: the experts' reductions), as DeepSpeed's groups.py forms them */
	Comm *ep, *edp;
} RunnerComms;

/* Split world into this rank's groups under plan p's layout (engine/parallel.c's
 * parallel_rank_coords); *stage: the pipeline stage whose schedule it runs. Collective over
 * world. On failure nothing is left to free. */
int runner_comms_split(Comm *world, const Plan *p, RunnerComms *c, int *stage, PxError *err);
void runner_comms_free(RunnerComms *c); /* the splits; world stays the caller's */

/* The memory the CUDA runtime took outside the arena, as measured (gpumem.h) by whoever set it
 * up: the runner counts it where the schedule allocates the context, the cuBLAS workspace and
 * NCCL's buffers (backend cuda), so that measured sits beside predicted. */
typedef struct RunnerRuntime {
	double cuda_context_bytes, cublas_workspace_bytes, nccl_bytes;
	/* called whenever the device arena's peak rises (to read the device's memory then) */
	void (*on_gpu_peak)(void *ctx);
	void *peak_ctx;
} RunnerRuntime;

/* Run the schedule's set-up (its allocations) and initialise the model from seed, every rank
 * alike. s: the schedule of this rank's pipeline stage (its Schedule.rank). comms: this rank's
 * (runner_comms_split's; used, not owned).
 * cb and cx: a compute backend and its context, created for this plan's shapes (runner_shape)
 * and owned by the caller, who destroys them after the runner; cb NULL: the CPU's, created and
 * destroyed by the runner. rt: NULL when the schedule has no CUDA runtime memory. */
int runner_create(const Plan *p, Schedule *s, const RunnerComms *comms, uint64_t seed,
		  const ComputeBackend *cb, void *cx, const RunnerRuntime *rt, Runner **out,
		  PxError *err);

/* A 1-bit optimizer's steps of kind `kind` other than the warm-up's (OneBitAdam, ZeroOneAdam,
 * OneBitLamb; runner_supported says which layouts): ONEBIT_COMPRESSED, ONEBIT_INIT (step 1), or
 * 0/1 Adam's ONEBIT_LOCAL. Their
 * schedule is built from the same plan with plan.onebit_step `kind` for the same stage (used, not
 * owned: it outlives the runner). From then on each step runs the schedule of its kind
 * (engine/onebit.h onebit_step_kind): runner_create's (the warm-up's) or one of these. They must
 * share their set-up; each compressed all-reduce must name the place of a tensor as the kernels
 * lay it out, and a local step's schedule has none. 0, or -1 with err. */
int runner_set_onebit(Runner *r, int kind, Schedule *s, PxError *err);

/* The shapes a compute backend context must serve for plan p. */
ComputeShape runner_shape(const Plan *p, int device);
void runner_destroy(Runner *r);
/* After a failure that left collectives in flight (comm_in_flight), whose buffers must stay
 * as they are until the job is aborted (comm_abort): removes the NVMe swap files and nothing
 * else. */
void runner_abandon(Runner *r);

/* One optimizer step, step counting from 1, on global samples (step - 1) * train_batch onwards. */
int runner_step(Runner *r, long step, const DataSource *data, StepResult *res, PxError *err);

const Arena *runner_arena(const Runner *r);

/* Wall time spent in each kind of schedule op since creation: [CompKind] for computes, then
 * [N_COMPS + CollKind] for collectives, then [N_COMPS + N_COLLS + CopyDir] for copies. A started
 * collective's slot has its start and its exposed wait (where an op waited for it, less from the
 * op's own time), not the time it spent in flight behind compute: the simulator's exposed
 * communication. */
#define RUNNER_N_TIMES (N_COMPS + N_COLLS + N_COPIES)
const double *runner_op_times(const Runner *r);

/* How the schedule's collectives overlapped compute since creation (docs/gpu_comm.md). A
 * collective on the prefetch or reduction stream (engine/streams.h) is started at its op and waited
 * for at the first op that needs its data or buffer; the rest block. */
typedef struct RunnerOverlap {
	long long started;             /* collectives started on a stream of their own */
	long long computes;            /* forward, backward and recompute ops run */
	long long computes_overlapped; /* of those, run while a started collective was in flight */
} RunnerOverlap;
const RunnerOverlap *runner_overlap(const Runner *r);

/* ZeRO-Infinity's optimizer on NVMe, as the kernel counts it (runner_nvme.c): the swap files'
 * disk blocks at their highest (bytes), and the bytes pread and pwrite moved since the set-up;
 * zeros without NVMe. */
void runner_nvme_measured(const Runner *r, double *blocks_peak_bytes, double *read_bytes,
			  double *write_bytes);

/* This rank's training state (its parameters, partitioned as the plan says, master weights,
 * optimizer states, optimizer step and fp16 loss-scaling state) to or from an open file. Between
 * steps gradients are zero, so they are not saved. save fails with the system's reason for a
 * failed write (the caller names the file); load checks the header written by save and fails
 * naming what differs. */
int runner_save(const Runner *r, FILE *f, PxError *err);
int runner_load(Runner *r, FILE *f, const char *path, PxError *err);

#endif

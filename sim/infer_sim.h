/* infer_sim: prices an inference schedule (engine/infer_build.h). Owns the memory per GPU (the
 * memory replay of the schedule, the fit verdict, the largest batch at the workload's context
 * and the longest context at its batch) and the time: each op's roofline (FLOPs against the
 * dtype's peak and the profile's GEMM curve, bytes against HBM, collectives over NVLink), time
 * to first token, time per output token, latency and tokens/s, with the resource that bounds
 * each phase; and continuous batching's steady state (concurrency by Little's law over the
 * schedule's decode steps). Printing and storing are the CLI's. Formulas and calibration: docs/inference.md. */
#ifndef PX_SIM_INFER_SIM_H
#define PX_SIM_INFER_SIM_H

#include "../engine/infer_build.h"
#include "hwprofile.h"
#include "infer_replay.h"
#include "memory.h"
#include "predict.h"

/* What bounds an op, and a phase (the resource with the largest share of its time): compute,
 * HBM bandwidth, the tensor-parallel collectives, or the fixed per-unit time of launching a
 * forward's kernels. */
typedef enum { BOUND_COMPUTE, BOUND_MEMORY, BOUND_COMM, BOUND_LAUNCH, N_BOUNDS } InferBound;

/* The two figures chosen on the calibration runs of scenarios/published/manifest.json (source
 * nemo-llama2-inference, split calibration) and nowhere else; docs/inference.md shows the fit.
 * HBM_FRACTION: what inference's kernels stream of the profile's HBM rate; UNIT_LAUNCH_S: the
 * fixed time of each unit's forward (its kernels' launches and synchronisation). */
#define INFER_HBM_FRACTION 1.05
#define INFER_UNIT_LAUNCH_S 100e-6

typedef struct InferPhase {
	double s;                  /* one prefill, or one decode step */
	double bound_s[N_BOUNDS];  /* of s: the ops each resource bounds, collectives, launches */
	double flops, bytes, comm_bytes; /* this rank's */
	InferBound bound;
} InferPhase;

/* Continuous batching's steady state (docs/inference.md, "Continuous batching"): requests
 * arrive at rate lambda on each replica; prefills (one prompt each, batch 1) take priority and
 * decode steps of the N running sequences fill the rest of the time. */
typedef struct InferContinuous {
	int stable;                /* the replica keeps up with its requests */
	char why[256];             /* when not */
	double rate_replica;       /* lambda: requests/s one replica receives */
	double prefill_s;          /* one prompt's prefill at batch 1 (a trace's: their mean) */
	double prefill_sq_s2;      /* its square (a trace's: the mean of their squares) */
	double prefill_util;       /* rho = lambda x prefill_s: the share of time prefilling */
	double concurrency;        /* N: sequences decoding, lambda x (output - 1) x TPOT */
	double decode_step_s;      /* a decode step at batch N (between the integers, linear) */
	double in_system;          /* requests in the replica, lambda x latency (Little's law) */
	double mean_ctx_tokens;    /* a decoding sequence's mean context: prompt + output / 2 */
	double kv_bytes;           /* the KV cache at that occupancy, N x mean context, per GPU */
	long long max_concurrency; /* sequences at the mean context that memory (or batch_size)
				      allows */
} InferContinuous;

typedef struct InferPrediction {
	InferPlan plan;
	Schedule sched;            /* rank 0's: every rank of every replica runs the same */
	MemResult mem;
	double gpu_capacity_bytes; /* GpuSpec.usable_bytes */
	double peak_bytes, load_peak_bytes; /* the replay's: all of it, and before the step */
	Verdict verdict;
	long long max_batch;       /* sequences at the workload's context that fit (0: none) */
	long long max_ctx;         /* tokens per sequence at fit_batch that fit */
	long long fit_batch;       /* the batch max_ctx and max_layers are found at: the
				      workload's, or under continuous batching the steady state's
				      occupancy (rounded up) */
	long long fit_ctx;         /* the context max_batch is found at: prompt and output, or
				      under continuous batching a sequence's mean over its life
				      (prompt + half the output) */
	long long max_layers;      /* the most blocks of the model's width that fit at the memory
				      table's batch and context (0: none), and their model's */
	double max_params;         /* parameters: the largest model of this shape the cluster
				      holds */
	InferPhase prefill, decode;
	double ttft_s, tpot_s, latency_s;
	double tokens_per_s_replica, tokens_per_s_gpu, tokens_per_s_node; /* generated tokens */
	char hw_source[256];
	InferContinuous cb;        /* workload.batching continuous only */
	InferReplay replay;        /* continuous with a trace: its replay (replayed 1) */
	int replayed;
	InferScenario paged;       /* continuous: a shallow copy of the scenario without kernel
				      injection's reservation (the KV cache paged, as FastGen's and
				      vLLM's are); the plan borrows it. Not to be freed. */
} InferPrediction;

/* Plan, build and price sc with the profile hw (NULL: the GPU's built-in one; source names it).
 * 0, or -1 with err. Free with infer_predict_free (also after a failure). */
int infer_predict(const InferScenario *sc, const HwProfile *hw, const char *source,
		  InferPrediction *pr, PxError *err);
void infer_predict_free(InferPrediction *pr);

const char *infer_bound_name(InferBound b);

/* The phases of a batch of b sequences at sc's workload lengths, built and priced with the
 * profile hw (not NULL) apart: one prefill (TTFT at that batch) and the mean decode step. 0, or
 * -1 with err. */
int infer_price_batch(const InferScenario *sc, const HwProfile *hw, long long b,
		      InferPhase *prefill, InferPhase *decode, PxError *err);

/* One ragged forward (engine/infer_build.h InferRagged) on plan p's ranks, built and priced with
 * the profile hw (not NULL) as a decode step is: *step its time and what bounds it. 0, or -1
 * with err. */
int infer_price_ragged(const InferPlan *p, const HwProfile *hw, const InferRagged *r,
		       InferPhase *step, PxError *err);

/* The time of one collective of `bytes` over n ranks of one node (ring; an all-reduce inside an
 * NVLink domain at the profile's allreduce_scale), as sim/opcost.c prices a training one. */
double infer_coll_s(const HwProfile *hw, const GpuSpec *gpu, CollKind kind, int n, double bytes);

#endif

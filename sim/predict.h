/* predict: the simulator's front door. Resolves a loaded scenario into its plan, builds one
 * schedule per pipeline stage and prices each: memory per place and category, the ZeRO paper's
 * ideal model states, traffic, and whether it fits. Printing and storing the result belong to the
 * CLI. */
#ifndef PX_SIM_PREDICT_H
#define PX_SIM_PREDICT_H

#include "../engine/build.h"
#include "../engine/plan.h"
#include "allocator.h"
#include "hwprofile.h"
#include "memory.h"
#include "moment.h"
#include "onebit.h"
#include "timeline.h"
#include "traffic.h"

/* The fit verdict. The GPU's peak is set against its usable memory (what PyTorch reports as the
 * device's total, cluster.h) less a margin: above usable, it does not fit; within the margin
 * below it, it is tight: whether it runs depends on how the caching allocator's blocks fragment,
 * which the peak does not model (docs/models.md, "Fits, tight, does not fit"). Host memory and
 * NVMe have no margin: they fit or they do not. */
typedef enum { VERDICT_FITS, VERDICT_TIGHT, VERDICT_NO_FIT } Verdict;

/* The margin as a fraction of usable GPU memory: GMLake (Guo et al., ASPLOS 2024) measured
 * PyTorch's caching allocator losing 9.2 GB on average (up to 25 GB) to fragmentation over eight
 * LLM fine-tuning runs on 80 GB A100s, about 11% of the 79.25 GiB torch can use; 10% is that
 * average rounded down. A larger loss (GMLake's worst case is about 30%) still OOMs a "fits". */
#define PREDICT_TIGHT_MARGIN 0.10

typedef struct StagePrediction {
	Schedule sched;     /* what every rank of the stage runs */
	MemResult mem;
	Traffic traffic;
	IdealStates ideal;
	int fits_gpu, fits_cpu, fits_nvme, fits; /* within capacity (a tight GPU fits) */
	Verdict verdict;
	PeakMoment gpu_moment; /* when the GPU peak came */
	AllocPeaks alloc;   /* the GPU's allocations through PyTorch's caching allocator (model) */
	int alloc_known;    /* 1 when alloc holds them: a DeepSpeed (backend "gpu") scenario,
			       predicted whole (not a sweep's fit-only point) */
} StagePrediction;

typedef struct Prediction {
	Plan plan;
	int n_stages;
	StagePrediction *stages; /* owned, one per pipeline stage */
	int worst;               /* the stage with the highest GPU peak */
	/* per rank; the GPU's is its usable memory (GpuSpec.usable_bytes), whose source
	 * gpu_capacity_source names; gpu_memory_bytes is the listed memory */
	double gpu_capacity_bytes, cpu_capacity_bytes, nvme_capacity_bytes;
	double gpu_memory_bytes, gpu_margin_bytes;
	const char *gpu_capacity_source;
	int fits;                /* every stage fits (tight included) */
	Verdict verdict;         /* the worst stage's verdict */
	HwProfile hw;            /* the calibration profile the step time was priced with (without
				    a CPU profile's section, which stays its owner's) */
	char hw_source[256];     /* "built-in H100-SXM" or the --hw file */
	TimeResult time;
	int time_known;          /* 0 when the profile cannot price this scenario (see time_note) */
	char time_note[1024];
	OneBitRun onebit;        /* a 1-bit optimizer's kinds of step and the run's average (the
				    stages above are its warm-up step's) */
} Prediction;

/* Resolve the scenario's batch rules against its data-parallel size, then plan, build and price.
 * sc is updated in place (resolved DeepSpeed values). */
int predict_run(Scenario *sc, Prediction *pr, PxError *err);
/* The same without the step time (time_known 0): what a sweep prices first, to prune what does
 * not fit before replaying it. */
int predict_memory(Scenario *sc, Prediction *pr, PxError *err);
/* predict_memory without the traffic (stages[].traffic left 0), which neither the fit nor the
 * step time needs: what a sweep prices each point with. */
int predict_fit(Scenario *sc, Prediction *pr, PxError *err);
void predict_free(Prediction *pr);

/* Price the step time with profile hw (predict_run uses the GPU's built-in default; a backend
 * "cpu" scenario needs a CPU profile, which the caller finds). A scenario the profile cannot price
 * (a dtype the GPU has no peak for, a CPU scenario and a GPU profile or a CPU profile without its
 * ranks) leaves time_known 0 with the reason in time_note; only a runtime failure is an error. */
int predict_time(Prediction *pr, const HwProfile *hw, const char *source, PxError *err);

/* "fits", "tight", "does not fit". */
const char *predict_verdict_name(Verdict v);
/* The verdict of a GPU peak against usable bytes with PREDICT_TIGHT_MARGIN (the sweep database's
 * reading of a stored point uses the same arithmetic, db/sweepdb.c). */
Verdict predict_gpu_verdict(double peak_bytes, double usable_bytes);

/* Stage indices ordered by GPU peak, highest first (order has n_stages entries). */
void predict_stage_order(const Prediction *pr, int *order);

#endif

/* sweep: a space of scenarios, a base scenario and axes of --set values, and the pricing of one
 * point of it. Owns reading the sweep file, numbering the points (mixed radix, the last axis
 * fastest), and evaluating a point: memory first, the step time only for what fits; over an
 * inference scenario (docs/inference.md) each point is an inference prediction (TTFT, TPOT,
 * latency, tokens/s). Running points in parallel, storing and ranking them is cmd_sweep.c's. */
#ifndef PX_SIM_SWEEP_H
#define PX_SIM_SWEEP_H

#include "../engine/infer_scenario.h"
#include "predict.h"

#define SWEEP_MAX_AXES 24

typedef enum { OBJ_THROUGHPUT, OBJ_COST, OBJ_HEADROOM } SweepObjective;
typedef enum { PT_OK, PT_OOM, PT_INVALID, PT_UNPRICED } PointStatus;

typedef struct SweepAxis {
	char key[256];   /* a --set key */
	int n;
	char **values;   /* owned; each as --set takes it (JSON text) */
	int unread_below; /* a ZeRO stage below which the engine never reads this key, else 0 */
	unsigned auto_bit; /* AUTO_*: with "auto" there, it is read at any stage */
	long long stride;  /* points between one value and the next (the later axes' product) */
} SweepAxis;

typedef struct Sweep {
	char name[128];
	char path[1024];
	Scenario base;            /* the base scenario, with the sweep's "set" applied (training) */
	int infer;                /* the base is an inference scenario: base is unused, ibase holds
				     it (and the "set" overrides, ibase.ov), each point loads it */
	InferScenario ibase;
	int n_axes;
	SweepAxis axes[SWEEP_MAX_AXES];
	long long n_points;       /* the product of the axes' lengths */
	SweepObjective objective;
	int top;
	int n_prices;
	char price_gpu[32][32];
	double price_per_gpu_hour[32];
	char *spec;               /* owned; the sweep file and the base's documents: its identity */
} Sweep;

typedef struct PointResult {
	long long idx;
	PointStatus status;
	long long world;
	char gpu[32];
	double peak_bytes, capacity_bytes, step_s, tokens_per_s, mfu, cost_per_mtoken;
	Verdict verdict;          /* of a sized point: a tight one is priced (status ok) */
	/* inference points (Sweep.infer): step_s is the batch's end-to-end latency, tokens_per_s
	 * the cluster's generated tokens/s, mfu NAN */
	double ttft_s, tpot_s, latency_s, tokens_per_s_gpu;
	long long max_batch, output_tokens;
	int decode_bound;         /* InferBound of a decode step */
	double concurrency;       /* continuous batching: steady-state sequences decoding */
	char note[256];           /* why invalid or unpriced */
	char config[1024];        /* {"key": value, ...} of this point */
} PointResult;

/* Read a sweep file:
 * {"name", "scenario": PATH (relative to the file), "set": {KEY: VALUE}, "axes": {KEY: [VALUES]},
 *  "objective": "throughput" | "cost" | "headroom", "top": N,
 *  "prices": {GPU: USD per GPU-hour} or PATH}. */
int sweep_load(Sweep *sw, const char *path, PxError *err);
void sweep_free(Sweep *sw);

/* Price point idx (0 .. n_points - 1). Never fails for a bad point (status says it); -1 only on
 * running out of memory. */
int sweep_eval(const Sweep *sw, long long idx, PointResult *r, PxError *err);

/* Recent points' results, by the index of the point with the axes they do not read (a stage-3
 * bucket below stage 3, say) at their first value: a worker's own, so that a point differing
 * from one priced before only there takes its result instead of pricing it again. */
typedef struct SweepMemo SweepMemo;
SweepMemo *sweep_memo_create(void); /* owned by the caller; NULL when out of memory */
void sweep_memo_destroy(SweepMemo *m);
/* Results taken instead of priced; *unread (when not NULL): of which taken before the point's
 * scenario was read. */
long long sweep_memo_taken(const SweepMemo *m, long long *unread);
/* sweep_eval, taking and leaving results in m (NULL: price every point in full). */
int sweep_eval_memo(const Sweep *sw, SweepMemo *m, long long idx, PointResult *r, PxError *err);

/* The objective's value, larger is better (cost and time are negated); -inf unless status OK. */
double sweep_score(const Sweep *sw, const PointResult *r);
const char *sweep_status_name(PointStatus s);

#endif

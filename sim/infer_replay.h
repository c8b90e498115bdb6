/* infer_replay: a continuous-batching server replayed over a workload's trace
 * (engine/infer_trace.h), request by request, with the schedule's own costs: each replica takes
 * every replicas-th request in arrival order; a waiting prompt is prefilled alone (its own
 * length's prefill at batch 1) whenever fewer than max_concurrency sequences are decoding, before
 * the next decode step, as vLLM's default scheduler does; otherwise the N decoding sequences take
 * one decode step together (batch N's step at the trace's mean lengths, as the steady state
 * prices it), each gaining a token, and leave with their last. Owns the event loop and its
 * statistics; the costs are sim/infer_sim.c's. */
#ifndef PX_SIM_INFER_REPLAY_H
#define PX_SIM_INFER_REPLAY_H

#include "../engine/infer_scenario.h"
#include "hwprofile.h"

typedef struct InferReplay {
	long long requests;          /* the trace's */
	double ttft_mean_s, ttft_p50_s, ttft_p99_s; /* arrival to first token */
	double tpot_mean_s;          /* (last token - first token) / (output - 1), over requests
					generating more than one token */
	double latency_mean_s, latency_p99_s; /* arrival to last token */
	double makespan_s;           /* first arrival to the last request's end */
	double tokens_per_s_gpu;     /* generated tokens over the makespan, per GPU */
	long long peak_concurrency;  /* most sequences decoding at once on a replica */
	long long waited_for_room;   /* requests that found max_concurrency decoding */
	long long prefills_priced;   /* distinct prompt lengths priced */
} InferReplay;

/* Replay sc's trace (sc->wl.trace.n > 0) over replicas replicas of tp GPUs. 0, or -1 with err. */
int infer_replay(const InferScenario *sc, const HwProfile *hw, long long replicas, long long tp,
		 long long max_concurrency, InferReplay *out, PxError *err);

#endif

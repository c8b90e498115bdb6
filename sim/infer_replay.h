/* infer_replay: a continuous-batching server replayed over a workload's trace
 * (engine/infer_trace.h), request by request, with the schedule's own costs, as vLLM's default
 * scheduler runs it: each replica takes every replicas-th request in arrival order; a waiting
 * prompt is admitted when its tokens fit the KV cache beside the running sequences' (and fewer
 * than max_seqs run) and is prefilled alone (its own length's prefill at batch 1) before the
 * next decode step; otherwise the N running sequences take one decode step together (batch N's
 * step at the context they hold on average: their contexts' sum exactly), each adding a token to the
 * cache, and leave with their last. When a step's tokens do not fit, the sequence admitted last
 * is preempted: its cache freed, it waits before any new request (the preempted in the order
 * they were) and is prefilled again over its prompt and the tokens it had made, which makes its
 * next token (vLLM's recompute). The cache is counted in blocks, as vLLM's block manager counts
 * it: a sequence holding c tokens takes ceil(c / block) blocks; a prompt is admitted only when
 * the blocks it needs leave the watermark's share of all the blocks free (can_allocate), and a
 * decode step needs a new block for each sequence whose last block is full (can_append_slots).
 * Or, with the workload's "scheduler": "split_fuse", DeepSpeed-FastGen's Dynamic SplitFuse as
 * DeepSpeed-MII schedules it: forwards of at most max_ragged_batch_size tokens, the decoding
 * sequences' next tokens first, then prompts in chunks (infer_replay.c says how).
 * Owns the event loop and its statistics; the costs are sim/infer_sim.c's. */
#ifndef PX_SIM_INFER_REPLAY_H
#define PX_SIM_INFER_REPLAY_H

#include "../engine/infer_scenario.h"
#include "hwprofile.h"

typedef struct InferReplayRoom {
	long long replicas, tp;
	long long kv_tokens;         /* the KV cache's tokens per replica that memory holds */
	long long block;             /* tokens a KV block holds (vLLM's block_size; 1: tokens) */
	double watermark;            /* the share of the blocks an admission leaves free */
	long long max_seqs;          /* sequences running at once: batch_size when given */
} InferReplayRoom;

typedef struct InferReplay {
	long long requests;          /* the trace's */
	long long kv_tokens;         /* the room it was replayed with (InferReplayRoom) */
	long long kv_blocks, block;  /* that room in blocks, and a block's tokens */
	double ttft_mean_s, ttft_p50_s, ttft_p99_s; /* arrival to first token */
	double tpot_mean_s, tpot_p99_s; /* (last token - first token) / (output - 1), over the
					requests generating more than one token */
	double latency_mean_s, latency_p99_s; /* arrival to last token */
	double makespan_s;           /* first arrival to the last request's end */
	double tokens_per_s_gpu;     /* generated tokens over the makespan, per GPU */
	long long peak_concurrency;  /* most sequences running at once on a replica */
	long long peak_kv_tokens;    /* most tokens in a replica's KV cache at once */
	long long peak_kv_blocks;    /* most blocks they took at once */
	long long waited_for_room;   /* requests that arrived to no room for their prompt */
	long long preemptions;       /* sequences evicted to make room, each prefilled again */
	long long forwards;          /* forwards run: prefills and decode steps, or under
					split_fuse its ragged batches */
	long long prefix_hit_tokens; /* vllm_v1 with prefix caching: tokens found in the cache at
					admission, not computed (a shared prefix's full blocks,
					or a preempted request's own) */
	long long prefix_evicted_blocks; /* vllm_v1 with prefix caching: blocks whose content could
					still be found, taken for other content */
	long long prompt_tokens;     /* the trace's prompt tokens in all */
	long long prefills_priced;   /* distinct prompt lengths priced */
	double prefill_mean_s, prefill_sq_mean_s2; /* each request's own prefill (its prompt at
					batch 1): their mean and mean square, which the steady
					state's M/G/1 wait takes */
} InferReplay;

/* Replay sc's trace (sc->wl.trace.n > 0) with room. 0, or -1 with err (a prompt alone larger
 * than the KV cache is refused, naming the trace and the request). */
int infer_replay(const InferScenario *sc, const HwProfile *hw, const InferReplayRoom *room,
		 InferReplay *out, PxError *err);

#endif

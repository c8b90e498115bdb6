/* infer_build: an inference scenario as one rank's schedule in schedule.h's vocabulary. Owns the
 * per-rank arithmetic it follows from (weights by dtype or quantized with their scales, the KV
 * cache per token, each unit's FLOPs and memory traffic in prefill and in a decode step, the
 * tensor-parallel all-reduces) and the schedule: weight load, prefill, a repeat block of decode
 * steps. Pricing it is sim/infer_sim.c's. Formulas: docs/inference.md.
 * Dimensions as model.h names them; b = batch, sp = prompt tokens, so = output tokens. */
#ifndef PX_INFER_BUILD_H
#define PX_INFER_BUILD_H

#include "infer_scenario.h"
#include "schedule.h"

/* DeepSpeed-FastGen's memory beside the KV cache: its MemoryConfig's default, mode "reserve" of
 * 1e9 bytes left free after the cache (deepspeed/inference/v2/ragged/manager_configs.py). */
#define INFER_FASTGEN_RESERVE_BYTES 1e9

/* One unit's share of the work on one rank. */
typedef struct InferUnit {
	double weight_bytes;      /* as stored: quantized matrices at their bits, the rest in dtype */
	double scale_bytes;       /* quantization scales (and minimums) */
	double load_bytes;        /* as loaded from the checkpoint: every weight in the compute dtype */
	double quant_elems;       /* elements stored quantized */
	double largest_matrix_elems; /* its largest quantized matrix (the dequantized copy) */
	double prefill_flops, prefill_bytes;
	double decode_flops, decode_bytes; /* one decode step at the mean context */
	double prefill_comm_elems, decode_comm_elems; /* per all-reduce */
	int n_allreduce;          /* tensor-parallel all-reduces per forward (2 in a block) */
	double kv_bytes_per_token; /* this unit's keys and values of one token of one sequence */
	/* a forward's parts by what it holds (infer_build_ragged): */
	double weights_read_bytes; /* the weights' traffic (the embedding's none: a lookup reads
				      its tokens' rows) */
	double token_flops, token_bytes; /* the weight products' per token (the head's per
					   logit row), and the embedding's lookup */
	double pair_flops;         /* a block's QK^T and AV per (query, key) pair */
} InferUnit;

/* The rank's quantities (every rank of a tensor-parallel group holds the same). */
typedef struct InferPlan {
	const InferScenario *sc;  /* borrowed */
	int n_units;
	InferUnit *units;         /* owned, n_units */
	long long tp, replicas;   /* replicas: world / tp, each serving its own batch */
	long long batch;          /* sequences in flight on this replica */
	long long kv_heads_rank;  /* key/value heads this rank caches: kv/t, or 1 when t > kv */
	long long ctx_tokens;     /* tokens of each sequence the KV cache holds at the peak */
	int act_bytes;            /* compute dtype (activations, KV cache) */
	double weight_bytes, scale_bytes, load_peak_extra_bytes;
	double kv_bytes_per_token; /* all layers, one sequence, this rank */
	double kv_bytes;          /* at the peak: batch x ctx_tokens tokens, less the shared
				     prefix's (batch - 1) x shared_tokens */
	double shared_tokens;     /* a request rate's prefix under vLLM V1's prefix cache: the
				     tokens of each sequence held once for all (its cached full
				     blocks, at most ctx_tokens); 0 otherwise */
	double prefill_workspace_bytes, decode_workspace_bytes, dequant_bytes;
	double runtime_bytes;     /* CUDA context, cuBLAS workspace, NCCL buffers (cluster.h) */
	double prefill_flops, decode_flops, prefill_bytes, decode_bytes;
	double mean_ctx;          /* a decode step's mean context (prompt + (so - 1) / 2 + ...) */
} InferPlan;

/* The plan for the scenario with batch b and context ctx (its workload's when 0). 0, or -1 with
 * err (out of memory). Free with infer_plan_free. */
int infer_plan_make(const InferScenario *sc, long long batch, long long ctx, InferPlan *p,
		    PxError *err);
void infer_plan_free(InferPlan *p);

/* GPU bytes at the serving peak (weights, scales, KV cache at ctx_tokens, the larger workspace,
 * the runtime's) and at the load peak (weights so far plus one unit's staging copy). */
double infer_plan_serve_peak_bytes(const InferPlan *p);
double infer_plan_load_peak_bytes(const InferPlan *p);

/* The schedule of one rank: set-up (runtime buffers, each unit's weights loaded and quantized,
 * the KV cache), then the step: prefill of the prompt (a unit's compute and, with t > 1, its
 * all-reduces, role ROLE_PREFILL), then a repeat block of so - 1 decode steps (ROLE_DECODE),
 * each priced at the mean context. */
int infer_build_schedule(const InferPlan *p, Schedule *s, PxError *err);

/* One ragged forward, as DeepSpeed-FastGen's Dynamic SplitFuse (and vLLM's chunked prefill) runs
 * it: decode_seqs sequences add a token each, their queries meeting decode_ctx cached tokens on
 * average, beside prompt chunks of chunk_tokens tokens in all, whose queries meet chunk_pairs
 * (query, key) pairs under the causal mask and read chunk_prior tokens their sequences cached
 * before; logit_rows sequences make a token (the decoding ones, and each chunk that ends its
 * prompt; a mean over forwards may be fractional). */
typedef struct InferRagged {
	long long decode_seqs, chunk_tokens;
	double logit_rows, decode_ctx, chunk_pairs, chunk_prior;
} InferRagged;

/* The schedule of one ragged forward on one rank (no set-up, no buffers: its time only), each
 * unit's compute and its tensor-parallel collectives in role ROLE_DECODE, from p's per-unit
 * parts (any batch's plan). With no chunk it is a decode step of decode_seqs sequences at
 * context decode_ctx; with one chunk of a whole prompt and nothing decoding, that prompt's
 * prefill at batch 1. */
int infer_build_ragged(const InferPlan *p, const InferRagged *r, Schedule *s, PxError *err);

#endif

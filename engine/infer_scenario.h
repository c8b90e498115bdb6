/* infer_scenario: one inference scenario = model x DeepSpeed-Inference config x cluster x workload.
 * Owns reading the scenario file (its "model" and "cluster" sections as a training scenario has
 * them, an "inference" object in deepspeed.init_inference's own keys, a "workload"), checking
 * every key and refusing what is not modelled yet. It does not build the schedule
 * (infer_build.c) nor price it (sim/infer_sim.c). Keys and defaults: docs/inference.md. */
#ifndef PX_INFER_SCENARIO_H
#define PX_INFER_SCENARIO_H

#include "cluster.h"
#include "infer_trace.h"
#include "jdoc.h"
#include "model.h"
#include "scenario.h"

/* The weights' dtype as deepspeed/inference/config.py's DtypeEnum names it; int8 is its
 * int8-kernel path (kernel injection, MoQ): int8 weights, fp16 compute and KV cache. */
typedef enum { IDT_FP32, IDT_FP16, IDT_BF16, IDT_INT8 } InferDtype;

/* How the weights are quantized: not at all; DeepSpeed's int8 kernels (dtype int8: symmetric,
 * q_groups scales per matrix, dequantized inside the GEMM); or its post-training weight
 * quantization (quant.weight.quantized_initialization: 4 or 8 bits, asymmetric, a scale and a
 * minimum in the compute dtype per group of group_size elements, each linear's weight
 * dequantized into a temporary copy before its GEMM, deepspeed/inference/quantization/utils.py). */
typedef enum { IQ_NONE, IQ_INT8_KERNEL, IQ_GROUPWISE } InferQuant;

typedef struct InferConfig {
	long long tp;             /* tensor_parallel.tp_size, or the deprecated mp_size */
	InferDtype dtype;
	int kernel_inject;        /* replace_with_kernel_inject */
	InferQuant quant;
	int quant_bits;           /* 8 or 4; 0 without quantization */
	long long q_groups;       /* IQ_INT8_KERNEL: scale groups per weight matrix */
	long long group_elems;    /* IQ_GROUPWISE: elements per group */
	long long max_out_tokens; /* prompt and generated tokens the kernels reserve (default 1024) */
} InferConfig;

/* A fixed batch: batch sequences, each a prompt of prompt_tokens and output_tokens generated
 * (the first by prefill, the rest by one decode step each). Or continuous batching ("batching":
 * "continuous"): requests arrive at request_rate a second (the whole cluster's, spread evenly
 * over its replicas), each of prompt_tokens and output_tokens on average, and join the running
 * batch as they come; batch then caps the concurrent sequences (vLLM's max_num_seqs) when
 * given, else memory does (sim/infer_sim.c, docs/inference.md). A continuous workload may give
 * its requests as a trace instead ("trace": a file, engine/infer_trace.h), whose means then
 * stand for request_rate, prompt_tokens and output_tokens; a trace is replayed with vLLM's
 * scheduler, or with "scheduler": "split_fuse" FastGen's, or "vllm_v1" vLLM V1's. */
/* The continuous batching schedulers: vLLM's V0 scheduler (a prompt prefilled alone before the
 * running sequences' next step), DeepSpeed-FastGen's Dynamic SplitFuse as DeepSpeed-MII runs it,
 * and vLLM's V1 scheduler (chunked prefill under a token budget, preemption by recompute). The
 * last two form ragged forwards (infer_sched_ragged). */
typedef enum InferScheduler { SCHED_VLLM, SCHED_SPLIT_FUSE, SCHED_VLLM_V1 } InferScheduler;

typedef struct InferWorkload {
	long long batch, prompt_tokens, output_tokens;
	int continuous;
	int batch_given;          /* continuous: batch_size was given (a cap) */
	double request_rate;      /* continuous: requests/s to the cluster */
	InferTrace trace;         /* continuous: the trace's requests (n 0: none) */
	long long block;          /* continuous: tokens a KV-cache block holds (vLLM's block_size,
				     16); the trace's replay allocates the cache in blocks */
	double watermark;         /* continuous: the share of the blocks an admission leaves free
				     (vLLM V0's watermark, 0.01; 0 under split_fuse and vllm_v1) */
	InferScheduler scheduler; /* continuous: whose scheduler forms the forwards (sim/infer_replay.h) */
	long long token_budget;   /* split_fuse, vllm_v1: tokens one forward holds (FastGen's
				     max_ragged_batch_size, 768; vLLM's max_num_batched_tokens, 8192
				     or 2048 by GPU) */
	long long max_ragged_seqs; /* split_fuse: sequences one forward holds (FastGen's
				      max_ragged_sequence_count, 512); vllm_v1: sequences running at
				      once (max_num_seqs, 1024 or 256 by GPU) */
	int prefix_caching;       /* vllm_v1: a trace's shared prefixes are cached and reused
				     (vLLM's enable_prefix_caching, on by default in V1) */
	long long prefix_tokens;  /* request rate, prefix caching: the leading prompt tokens
				     every request shares (a system prompt; 0: none) */
	double cached_prefix;     /* prefix caching: the tokens of a prompt the steady state finds
				     cached, in full blocks and short of its last token:
				     prefix_tokens', or the mean over a trace's requests */
	long long n_prefix_groups; /* a trace's prefix ids under prefix caching (owned, with the
				      trace): each one's share of the requests and the tokens they
				      find cached on average */
	double *prefix_share, *prefix_found;
} InferWorkload;

/* vLLM V1's prefix cache: of a sequence of `tokens` to compute whose first `prefix` are cached,
 * the tokens it finds there: whole blocks of `block`, at most tokens - 1
 * (KVCacheManager.get_computed_blocks: the last token is computed whatever is cached). */
long long infer_prefix_found(long long prefix, long long tokens, long long block);

/* vLLM V1's prefix cache: of batch sequences' cached tokens, those held once for the others,
 * per sequence after the first (their KV is batch x context - (batch - 1) x this). At a request
 * rate the prefix every request finds (cached_prefix); from a trace the expectation over batch
 * requests drawn from its mix: prefix id g, a share f_g of the requests finding H_g tokens on
 * average, is held once among the n_g ~ Binomial(batch, f_g) that have it, saving
 * H_g (batch f_g - 1 + (1 - f_g)^batch) (at batch 2 for a batch of one). 0 without the cache. */
double infer_shared_tokens(const InferWorkload *w, long long batch);

/* Whether w's scheduler forms ragged forwards under a token budget (prompt chunks beside the
 * decoding sequences' tokens). */
static inline int infer_sched_ragged(const InferWorkload *w)
{
	return w->scheduler != SCHED_VLLM;
}

enum { IS_DOC_SCENARIO, IS_DOC_MODEL, IS_DOC_CLUSTER, IS_N_DOCS };

typedef struct InferScenario {
	char name[128];
	char path[1024];
	JsonDoc docs[IS_N_DOCS];
	JsonOverrides ov;         /* a copy of the --set list */
	ModelSpec model;
	ClusterSpec cluster;
	InferConfig inf;
	InferWorkload wl;
	Backend backend;          /* "backend": gpu (DeepSpeed's, the default), or cpu: the Parallax
				     executor on host ranks (parallax run), with no CUDA runtime */
	PxNotes notes;
} InferScenario;

/* Whether the JSON file at path is an inference scenario (an object with an "inference" key):
 * 1 or 0; -1 with err when it cannot be read or parsed. */
int infer_scenario_is(const char *path, PxError *err);

/* Load path with the overrides ov (keys of the scenario, "model.KEY", "cluster.KEY",
 * "inference.KEY", "workload.KEY"); errors (PX_ERR_INPUT) name file:line:col, the key and what
 * was expected. On error the scenario is freed. */
int infer_scenario_load(InferScenario *sc, const char *path, const JsonOverrides *ov,
			PxError *err);
void infer_scenario_free(InferScenario *sc);

const char *infer_dtype_name(InferDtype d);
/* Bytes of one element of the compute dtype (activations, KV cache): int8 computes in fp16. */
int infer_compute_bytes(InferDtype d);

/* The scenario as compact JSON with sections inlined and a "resolved" object; caller frees. */
char *infer_scenario_resolved_json(const InferScenario *sc);

#endif

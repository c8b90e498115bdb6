/* scenario: one training scenario = model x DeepSpeed config x cluster (+ sequence length).
 * Owns reading the scenario file and the files it names, applying --set overrides, and handing
 * back the parsed parts with every warning; also its resolved JSON for the results database.
 * It does not derive the parallel layout or any cost (plan.c, schedule.c, sim/). */
#ifndef PX_SCENARIO_H
#define PX_SCENARIO_H

#include "activ.h"
#include "allocconf.h"
#include "cluster.h"
#include "dsconfig.h"
#include "jdoc.h"
#include "model.h"
#include "parallel.h"

enum { SC_DOC_SCENARIO, SC_DOC_MODEL, SC_DOC_DEEPSPEED, SC_DOC_CLUSTER, SC_N_DOCS };

/* Whose implementation a scenario describes: DeepSpeed's on GPUs ("backend": "gpu", the default),
 * or the Parallax executor's (no dropout; the units compute in the parameters' dtype: working
 * copies, hidden stream and saved activations in fp32, bf16 or fp16, matrix products accumulated
 * and norms, softmax and loss computed in fp32, gradients and scratch fp32) on CPUs ("cpu": no
 * CUDA runtime) or on CUDA GPUs ("cuda": with the CUDA runtime's memory). */
typedef enum { BACKEND_GPU, BACKEND_CPU, BACKEND_CUDA } Backend;

/* How attention runs: "eager" materialises the scores (softmax output, dropout mask) and keeps
 * them for backward, as PyTorch's eager attention and Megatron's do; "flash" is FlashAttention
 * (Dao et al. 2022, 2023): one fused kernel per pass that keeps only each row's softmax
 * log-sum-exp and recomputes the scores in backward. */
typedef enum { ATTN_EAGER, ATTN_FLASH } AttnImpl;

/* Whose training loop drives the model: DeepSpeed's engine ("deepspeed", the default), or plain
 * PyTorch ("pytorch": one process, or DistributedDataParallel over several), as the Hugging Face
 * Trainer and Accelerate run without DeepSpeed. Plain PyTorch has no ZeRO, no DeepSpeed
 * optimizer wrapper and no engine reduction: DistributedDataParallel keeps its own buckets
 * (build_ddp_plan, build_ddp_ready). Its fp16 is read as DeepSpeed's fp16 (fp16 parameters
 * with fp32 master weights), its fp32 as fp32; bf16 is refused (plan.c). Or PyTorch's
 * FullyShardedDataParallel ("fsdp", FSDP1 as the Trainer and Accelerate wrap a model: each
 * transformer layer a unit, the rest the root unit), set by the scenario's "fsdp" object
 * (FsdpSpec; engine/build_fsdp.c). */
typedef enum { FRAMEWORK_DEEPSPEED, FRAMEWORK_PYTORCH, FRAMEWORK_FSDP } Framework;

/* FSDP's options (torch.distributed.fsdp.FullyShardedDataParallel, with Accelerate's names). The
 * sharding strategy: FULL_SHARD frees a unit's gathered parameters after its forward and gathers
 * them again for its backward; SHARD_GRAD_OP keeps them from the forward to the backward. The
 * root unit is not freed between its forward and its backward either way
 * (_runtime_utils.py _post_forward_reshard). backward_prefetch: BACKWARD_PRE gathers the next
 * unit in backward order before the current one computes its gradients, BACKWARD_POST after,
 * NO_PREFETCH when the next one starts. Forward: with limit_all_gathers (the default) the host
 * runs at most one unit ahead; forward_prefetch likewise gathers the next unit before the
 * current one computes. sync_each_batch (Accelerate's GradientAccumulationPlugin): off, the
 * Trainer's and Accelerate's default, runs every micro-batch but the last under no_sync(), so
 * each unit's whole 16-bit gradient is kept until the last one reduce-scatters it. HYBRID_SHARD
 * (and _HYBRID_SHARD_ZERO2, SHARD_GRAD_OP's twin) shards within each node, FULL_SHARD's way, and
 * replicates across the nodes: each reduce-scatter's shard is all-reduced over them. */
typedef enum { FSDP_FULL_SHARD, FSDP_SHARD_GRAD_OP, FSDP_HYBRID_SHARD, FSDP_HYBRID_SHARD_ZERO2 }
	FsdpSharding;
typedef enum { FSDP_BACKWARD_PRE, FSDP_BACKWARD_POST, FSDP_NO_PREFETCH } FsdpPrefetch;
/* auto_wrap_policy: TRANSFORMER_BASED_WRAP makes each transformer layer a unit; SIZE_BASED_WRAP
 * (torch's size_based_auto_wrap_policy, min_num_params) any module whose parameters not in a
 * unit below it reach min_num_params (engine/fsdp_wrap.c), so a small model's layers stay in
 * the root and a large one's linears may each be a unit; NO_WRAP the whole model one unit. */
typedef enum { FSDP_WRAP_TRANSFORMER, FSDP_WRAP_SIZE, FSDP_WRAP_NONE } FsdpWrapPolicy;
typedef struct FsdpSpec {
	FsdpSharding sharding;
	FsdpPrefetch backward_prefetch;
	int forward_prefetch, limit_all_gathers, sync_each_batch;
	int offload_params;      /* CPUOffload(offload_params=True): the shards, their gradients and
				    the optimizer's step on the host */
	int version;             /* 1: FullyShardedDataParallel; 2: fully_shard (FSDP2,
				    Accelerate's fsdp_version 2), each parameter sharded on its
				    first dimension, gathered through a group's all-gather output
				    copied out into the parameters */
	FsdpWrapPolicy wrap;
	double min_num_params;   /* SIZE_BASED_WRAP's threshold (torch's and Accelerate's default
				    1e8) */
	long long post_forward;  /* FSDP2's reshard_after_forward as an int: after a unit's
				    forward it keeps 1/post_forward of its parameters on a group of
				    that many ranks, which its backward gathers from; 0 without
				    (true: FULL_SHARD; false: SHARD_GRAD_OP) */
} FsdpSpec;

/* Whose modules compute the model, which decides what autograd keeps op by op: "megatron" (the
 * default) is Korthikanti et al.'s count, as Megatron's fused kernels keep it (engine/activ.c);
 * "huggingface" is the model's Hugging Face eager modules as the Trainer runs them: GPT-2's
 * "gelu_new" written in elementwise ops, every nn.LayerNorm's fp32 mean and rstd, and the causal
 * LM's loss (ForCausalLMLoss) with its transient logits and gradients at the head (build.c). The
 * executor's own kernels are neither: backends cpu and cuda take the default only (plan.c). */
typedef enum { MODEL_CODE_MEGATRON, MODEL_CODE_HUGGINGFACE } ModelCode;

typedef struct Scenario {
	char name[128];
	char path[1024];
	JsonDoc docs[SC_N_DOCS];  /* the scenario file and any section files it names */
	JsonOverrides ov;         /* a copy of the --set list */
	ModelSpec model;
	DsConfig ds;
	ClusterSpec cluster;
	TrainArgs train_args;
	ParallelSpec par;         /* degrees as written; dp is derived by plan.c */
	long long seq;            /* sequence length, tokens (an encoder-decoder's encoder's) */
	long long seq_dec;        /* an encoder-decoder's decoder's; seq otherwise */
	CkptMode ckpt;
	AttnImpl attention;
	double sparse_blocks;     /* deepspeed.sparse_attention's layout: non-zero blocks per head
				     (mean over heads) at seq; 0 without the section */
	double sparse_causal_pairs; /* of those, the (query, key) pairs a causal kernel visits per
				       head (mean; sparse_layout_count) */
	Backend backend;          /* whose implementation the scenario describes */
	Framework framework;      /* whose training loop */
	FsdpSpec fsdp;            /* framework "fsdp": the "fsdp" object */
	ModelCode model_code;     /* whose modules */
	AllocConf alloc_conf;     /* PyTorch's allocator settings ("pytorch_cuda_alloc_conf") */
	PxNotes notes;            /* warnings and keys not modelled */
} Scenario;

/* Load PATH with the overrides ov (may be NULL), applied in order. The sections model, deepspeed and
 * cluster are each an object or a path relative to the scenario file. An override of a whole
 * section (key "model", "deepspeed" or "cluster") replaces it with an inline object ("{...}") or the
 * JSON file its value names, relative to the current directory; later overrides of keys inside it
 * apply on top. On error the scenario is freed. */
int scenario_load(Scenario *sc, const char *path, const JsonOverrides *ov, PxError *err);
/* The "framework" value naming f ("deepspeed", "pytorch", "fsdp"). */
const char *scenario_framework_name(Framework f);
/* The "model_code" value naming c ("megatron", "huggingface"). */
const char *scenario_model_code_name(ModelCode c);
/* FSDP's names of a sharding strategy and of a backward prefetch ("FULL_SHARD", "BACKWARD_PRE"). */
const char *scenario_fsdp_sharding_name(FsdpSharding s);
/* Whether strategy s frees a unit's gathered weights after its forward (FULL_SHARD's way), and
 * whether it shards within a node only. */
int scenario_fsdp_reshards(FsdpSharding s);
int scenario_fsdp_hybrid(FsdpSharding s);
const char *scenario_fsdp_prefetch_name(FsdpPrefetch b);
const char *scenario_fsdp_wrap_name(FsdpWrapPolicy w);
/* The same with the scenario's own document given as text (the launcher flags' scenario,
 * cli/dslaunch.c); path names it in messages, and relative section paths are relative to its
 * folder. */
int scenario_load_text(Scenario *sc, const char *path, const char *text, const JsonOverrides *ov,
		       PxError *err);
void scenario_free(Scenario *sc);

/* A scenario like base (a loaded one) with more overrides ov applied after base's own, which are
 * applied again to copies of base's documents; no file is read again but those a whole-section
 * override names. For sweeps. */
int scenario_derive(Scenario *sc, const Scenario *base, const JsonOverrides *ov, PxError *err);

/* The scenario as one compact JSON text with every section inlined and overrides applied, plus a
 * "resolved" object of derived values (batch arithmetic, precision); caller frees. */
char *scenario_resolved_json(const Scenario *sc, long long world, long long dp);

#endif

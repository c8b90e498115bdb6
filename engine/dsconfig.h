/* dsconfig: a DeepSpeed config (ds_config.json) as users write it, "auto" values included.
 * Owns reading and checking every documented key, resolving "auto" the way the Hugging Face Trainer
 * integration does, DeepSpeed's batch-size rules and the list of keys read but not yet modelled.
 * It does not decide what memory or traffic a setting causes: plan.c and schedule.c do. */
#ifndef PX_DSCONFIG_H
#define PX_DSCONFIG_H

#include "jdoc.h"
#include "model.h"
#include "onebit.h"
#include "optim.h"
#include "sparse_layout.h"

typedef enum { DT_FP32, DT_FP16, DT_BF16 } Dtype;
typedef enum { DEV_NONE, DEV_CPU, DEV_NVME } OffloadDevice;

static inline int dtype_bytes(Dtype d) { return d == DT_FP32 ? 4 : 2; }
const char *dtype_name(Dtype d);
const char *offload_device_name(OffloadDevice d);

typedef struct DsOffload {
	OffloadDevice device;
	int pin_memory;
	long long buffer_count; /* NVMe swap buffers */
	double buffer_size;     /* elements per parameter swap buffer */
	char nvme_path[256];    /* where the swap files go (""  when not given) */
	double max_in_cpu;      /* parameters on NVMe: elements of the partition DeepSpeed keeps in
				   a pinned host flat (offload_param.max_in_cpu) */
} DsOffload;

typedef struct DsZero {
	int stage;
	double reduce_bucket_elems, allgather_bucket_elems;
	int overlap_comm, contiguous_gradients, reduce_scatter;
	double prefetch_bucket_elems, persistence_threshold_elems, max_live_elems, max_reuse_elems;
	double sub_group_elems;
	DsOffload offload_optimizer, offload_param;
	int quantized_weights, quantized_gradients;
	long long hpz_partition_size;
} DsZero;

typedef struct TrainArgs { /* Hugging Face TrainingArguments that "auto" values come from */
	long long per_device_train_batch_size, gradient_accumulation_steps;
	double learning_rate, weight_decay, adam_beta1, adam_beta2, adam_epsilon, max_grad_norm;
	int fp16, bf16, gradient_checkpointing;
	int autocast;                /* fp16 or bf16 under plain PyTorch (Scenario.framework): the
					Trainer's torch.autocast over fp32 weights, not DeepSpeed's
					16-bit weights (set by scenario.c) */
	char precision_where[512];   /* where fp16 or bf16 was written true */
	/* the Trainer's num_training_steps: max_steps when > 0, else num_train_epochs x the
	 * dataset's update steps per epoch (which a scenario does not give); warm-up steps:
	 * warmup_steps when >= 1, a fraction of the total when in (0, 1), else warmup_ratio */
	long long max_steps;
	double num_train_epochs, warmup_steps, warmup_ratio;
	int optim;                   /* optim: index in optim_trainer_names, -1 when not given */
	long long ddp_bucket_cap_mb; /* DistributedDataParallel's bucket_cap_mb (plain PyTorch): 25,
					torch's default, when not given */
	char optim_where[512];       /* where it was written, for notes */
} TrainArgs;

/* Which values were written "auto" (resolved by dsconfig_resolve). */
enum {
	AUTO_TRAIN_BATCH = 1 << 0, AUTO_MICRO_BATCH = 1 << 1, AUTO_GRAD_ACCUM = 1 << 2,
	AUTO_FP16 = 1 << 3, AUTO_BF16 = 1 << 4, AUTO_CLIP = 1 << 5,
	AUTO_REDUCE_BUCKET = 1 << 6, AUTO_PREFETCH = 1 << 7, AUTO_PERSISTENCE = 1 << 8,
	AUTO_LR = 1 << 9, AUTO_BETAS = 1 << 10, AUTO_EPS = 1 << 11, AUTO_WD = 1 << 12,
	AUTO_WARMUP_MIN_LR = 1 << 13, AUTO_WARMUP_MAX_LR = 1 << 14, AUTO_WARMUP_STEPS = 1 << 15,
	AUTO_TOTAL_STEPS = 1 << 16,
};

typedef struct DsConfig {
	const char *source;          /* file the config came from, for messages */
	JsonObj root;                /* the config as read: errors of the batch rules and "auto"
					found later point into it (valid while its document lives) */
	/* batch: 0 when absent until dsconfig_resolve derives it */
	long long train_batch, micro_batch, grad_accum;
	int fp16, bf16;              /* enabled flags as written or resolved */
	Dtype dtype;                 /* parameters, gradients and activations */
	Dtype autocast;              /* torch autocast's compute type over fp32 parameters (plain
					PyTorch with training_args.fp16 or bf16); DT_FP32: none */
	Dtype grad_dtype;            /* data_types.grad_accum_dtype, default dtype (fp32 for bf16
					without ZeRO: engine.py get_data_types) */
	Dtype comm_dtype;            /* communication_data_type, default dtype (engine.py) */
	int comm_dtype_set, grad_dtype_set;
	/* fp16 dynamic loss scaling */
	double loss_scale;           /* 0 = dynamic */
	long long initial_scale_power, loss_scale_window, hysteresis;
	double min_loss_scale;
	/* optimizer */
	char optimizer[32];
	const OptimKind *opt;        /* the optimizer's kind (optim.c) */
	int optimizer_states;        /* fp32 states per parameter: Adam 2, SGD with momentum 1 (Muon:
					on the parameters outside its hidden matrices) */
	double lr, beta1, beta2, eps, weight_decay, momentum;
	int amsgrad, torch_adam;     /* Adam's params.amsgrad, and torch.optim's Adam (torch_adam) */
	int opt_section;             /* the config has an optimizer section (DeepSpeed builds it) */
	OptimImplKind opt_impl;      /* how the update runs: DeepSpeed's fused kernels, or torch's
					(params.torch_adam with its foreach/fused), or the Trainer's
					training_args.optim when DeepSpeed has no optimizer section */
	int opt_impl_trainer;        /* the Trainer built it (its tensors are the model's own) */
	OneBitParams onebit;         /* the 1-bit optimizers' freeze and local-step params */
	double gradient_clipping;
	/* scheduler: DeepSpeed's WarmupLR and WarmupDecayLR */
	int sched;                   /* 0 none (constant lr), 1 WarmupLR, 2 WarmupDecayLR */
	int sched_linear;            /* warmup_type "linear" (default "log") */
	double warmup_min_lr, warmup_max_lr;
	long long warmup_num_steps, total_num_steps;
	int sched_unresolved;        /* total_num_steps (or warm-up steps derived from it) is "auto"
					and training_args gives no max_steps: a prediction does
					not need it, the executor refuses */
	DsZero zero;
	/* DeepSpeed's own parallelism keys, 0 when absent (the scenario's "parallelism" agrees or
	 * wins, see scenario.c) */
	long long autotp_size, pipeline_stages;
	const char *pipeline_partition;
	/* pipeline.pipe_partitioned, grad_partitioned (default on): with tensor parallelism the
	 * pipe engine sends each rank's 1/t of an activation (of its gradient) between stages and
	 * the receiving stage all-gathers it over the tensor-parallel group (pipe/engine.py,
	 * PartitionedTensor) */
	int pipe_partitioned, grad_partitioned;
	char tp_where[512], pp_where[512];
	/* activation checkpointing section */
	int ac_present, partition_activations, cpu_checkpointing;
	SparseAttn sparse;           /* sparse_attention (mode SPARSE_OFF when absent) */
	unsigned autos;              /* AUTO_* */
} DsConfig;

void train_args_defaults(TrainArgs *t);
/* Read training_args (Hugging Face names); unknown keys are warned about. */
int train_args_parse(const JsonObj *o, TrainArgs *t, PxNotes *notes, PxError *err);

/* Read a DeepSpeed config object. Unknown keys are warned about with the closest valid key; keys
 * that would change the prediction but are not modelled yet go into notes->not_modelled. */
int dsconfig_parse(const JsonObj *o, DsConfig *ds, PxNotes *notes, PxError *err);

/* The learning rate of optimizer update `k` (lrsched.c; 1-based, skipped fp16 steps not counted), as
 * deepspeed/runtime/lr_schedules.py: the scheduler starts at warmup_min_lr and steps after each
 * update, so update k uses iteration k - 2; during warm-up gamma = log(it + 1) / log(N) (linear:
 * it / N) with N = max(2, warmup_num_steps), then 1 (WarmupLR) or a linear decay to 0 at
 * total_num_steps (WarmupDecayLR); lr = min + (max - min) gamma. Without a scheduler: lr. */
double dsconfig_lr(const DsConfig *ds, long k);

/* The scheduler's "auto" values (lrsched.c), as the Trainer fills them from training_args: warmup_min_lr 0,
 * warmup_max_lr learning_rate, total_num_steps max_steps, warmup_num_steps from warmup_steps or
 * warmup_ratio. What cannot be resolved (no max_steps) is noted and sets sched_unresolved; a
 * warm-up that resolves to 0 is refused as DeepSpeed refuses it. */
int dsconfig_resolve_schedule(DsConfig *ds, const TrainArgs *ta, PxNotes *notes, PxError *err);
/* The optimizer's implementation (DsConfig.opt_impl): DeepSpeed's own unless params.torch_adam
 * asks for torch's (foreach unless params.fused is true or params.foreach false), or, without an
 * optimizer section, the Trainer's training_args.optim (today's default adamw_torch_fused). A
 * training_args.optim beside an optimizer section is noted as unused, as the Trainer ignores it. */
void dsconfig_resolve_optimizer_impl(DsConfig *ds, const TrainArgs *ta, PxNotes *notes);

/* Resolve "auto" values (Hugging Face rules: hidden-size based bucket sizes, TrainingArguments for
 * the rest), then DeepSpeed's batch rules for dp data-parallel ranks. */
int dsconfig_resolve(DsConfig *ds, const ModelSpec *m, const TrainArgs *ta, long long dp,
		     PxError *err);

#endif

#include "dsconfig.h"

#include "lrsched.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

const char *dtype_name(Dtype d)
{
	return d == DT_FP16 ? "fp16" : d == DT_BF16 ? "bf16" : "fp32";
}

const char *offload_device_name(OffloadDevice d)
{
	return d == DEV_CPU ? "cpu" : d == DEV_NVME ? "nvme" : "none";
}

/* ---- key tables: what each documented key does to a prediction ---- */

typedef enum {
	K_MODEL, /* modelled */
	K_NONE,  /* no effect on memory, communication or time (logging, learning rate...) */
	K_TIME,  /* changes step time only: listed until the time model exists */
	K_NOT,   /* would change the prediction and is not modelled: listed */
} KeyEffect;

typedef struct DsKey {
	const char *key;
	KeyEffect effect;
} DsKey;

static const DsKey TOP_KEYS[] = {
	{"train_batch_size", K_MODEL}, {"train_micro_batch_size_per_gpu", K_MODEL},
	{"gradient_accumulation_steps", K_MODEL}, {"optimizer", K_MODEL}, {"fp16", K_MODEL},
	{"bf16", K_MODEL}, {"bfloat16", K_MODEL}, {"zero_optimization", K_MODEL},
	{"activation_checkpointing", K_MODEL}, {"communication_data_type", K_MODEL},
	{"data_types", K_MODEL}, {"gradient_clipping", K_NONE}, {"scheduler", K_NONE},
	{"prescale_gradients", K_NONE}, {"gradient_predivide_factor", K_NONE},
	{"steps_per_print", K_NONE}, {"wall_clock_breakdown", K_NONE}, {"dump_state", K_NONE},
	{"memory_breakdown", K_NONE}, {"flops_profiler", K_NONE}, {"tensorboard", K_NONE},
	{"wandb", K_NONE}, {"csv_monitor", K_NONE}, {"comet", K_NONE}, {"comms_logger", K_NONE},
	{"checkpoint", K_NONE}, {"zero_allow_untested_optimizer", K_NONE},
	{"zero_force_ds_cpu_optimizer", K_NONE}, {"timers", K_NONE}, {"nebula", K_NONE},
	{"datastates", K_NONE}, {"vocabulary_size", K_NONE}, {"dataloader_drop_last", K_NONE},
	{"log_level", K_NONE}, {"graph_harvesting", K_NONE},
	{"managed_gradient_accumulation", K_NONE}, {"use_data_before_expert_parallelism", K_NONE},
	/* read by runtime/config.py and used nowhere in DeepSpeed */
	{"disable_allgather", K_NONE},
	/* the all-gather bucket of the deprecated boolean "zero_optimization" */
	{"allgather_size", K_NONE},
	{"gradient_allreduce_op", K_NONE},
	{"aio", K_TIME}, {"amp", K_NOT}, {"sparse_gradients", K_NOT}, {"elasticity", K_NOT},
	{"autotuning", K_NOT}, {"compression_training", K_NOT}, {"data_efficiency", K_NOT},
	{"curriculum_learning", K_NOT}, {"pipeline", K_MODEL}, {"tensor_parallel", K_MODEL},
	{"sequence_parallel_size", K_NOT}, {"seq_parallel_communication_data_type", K_NOT},
	{"eigenvalue", K_NOT}, {"quantize_training", K_NOT}, {"progressive_layer_drop", K_NOT},
	{"sparse_attention", K_MODEL}, {"hybrid_engine", K_NOT}, {"weight_quantization", K_NOT},
	{"torch_autocast", K_NOT}, {"expert_parallel", K_NOT}, {"compile", K_MODEL}, {0},
};

static const DsKey ZERO_KEYS[] = {
	{"stage", K_MODEL}, {"reduce_bucket_size", K_MODEL},
	/* DeepSpeed gathers stage 1-2's updated partitions with one all_gather_into_tensor per
	 * parameter group wherever PyTorch has it (runtime/utils.py all_gather_dp_groups); the
	 * bucket size only splits the legacy per-shard path, so it changes nothing */
	{"allgather_bucket_size", K_NONE},
	{"overlap_comm", K_MODEL}, {"contiguous_gradients", K_MODEL}, {"reduce_scatter", K_MODEL},
	{"offload_optimizer", K_MODEL}, {"offload_param", K_MODEL}, {"cpu_offload", K_MODEL},
	{"cpu_offload_param", K_MODEL}, {"stage3_prefetch_bucket_size", K_MODEL},
	{"stage3_param_persistence_threshold", K_MODEL}, {"stage3_max_live_parameters", K_MODEL},
	{"sub_group_size", K_MODEL}, {"stage3_max_reuse_distance", K_NOT},
	{"zero_hpz_partition_size", K_MODEL}, {"zero_quantized_weights", K_MODEL},
	{"zero_quantized_nontrainable_weights", K_NOT}, {"zero_quantized_gradients", K_MODEL},
	{"mics_shard_size", K_NOT}, {"mics_hierarchical_params_gather", K_NOT},
	/* pydantic's populate_by_name: the stage3_ keys may also be written by their field names */
	{"prefetch_bucket_size", K_MODEL}, {"param_persistence_threshold", K_MODEL},
	{"max_live_parameters", K_MODEL}, {"max_reuse_distance", K_NOT},
	{"gather_16bit_weights_on_model_save", K_NONE}, {"model_persistence_threshold", K_NOT},
	{"module_granularity_threshold", K_TIME}, {"use_all_reduce_for_fetch_params", K_TIME},
	{"allgather_sequential", K_NOT},
	{"stage3_model_persistence_threshold", K_NOT}, {"stage3_allgather_sequential", K_NOT},
	{"zenflow", K_NOT}, {"zeropp_loco_param", K_NOT}, {"leaf_module", K_NOT},
	{"allgather_partitions", K_NONE}, {"load_from_fp32_weights", K_NONE},
	{"elastic_checkpoint", K_NONE}, {"stage3_gather_16bit_weights_on_model_save", K_NONE},
	{"stage3_gather_fp16_weights_on_model_save", K_NONE}, {"ignore_unused_parameters", K_NONE},
	{"legacy_stage1", K_NONE}, {"log_trace_cache_warnings", K_NONE},
	{"memory_efficient_linear", K_NONE}, {"pipeline_loading_checkpoint", K_NONE},
	{"override_module_apply", K_NONE}, {"enable_sanity_checks", K_NONE},
	{"save_muon_momentum_buffer_in_memory", K_NONE}, {"round_robin_gradients", K_TIME},
	{"use_multi_rank_bucket_allreduce", K_TIME}, {"cpu_offload_use_pin_memory", K_TIME},
	{"stage3_module_granularity_threshold", K_TIME},
	{"stage3_use_all_reduce_for_fetch_params", K_TIME},
	{0},
};

static const DsKey OFFLOAD_OPT_KEYS[] = {
	{"device", K_MODEL}, {"nvme_path", K_NONE}, {"pin_memory", K_TIME},
	{"buffer_count", K_MODEL}, {"fast_init", K_NONE}, {"pipeline_read", K_TIME},
	{"pipeline_write", K_TIME}, {"cpuadam_cores_perc", K_TIME}, {"ratio", K_NOT},
	{"super_offload", K_NOT}, {0},
};

static const DsKey OFFLOAD_PARAM_KEYS[] = {
	{"device", K_MODEL}, {"nvme_path", K_NONE}, {"pin_memory", K_TIME},
	{"buffer_count", K_MODEL}, {"buffer_size", K_MODEL}, {"max_in_cpu", K_MODEL}, {0},
};

static const DsKey FP16_KEYS[] = {
	{"enabled", K_MODEL}, {"loss_scale", K_MODEL}, {"initial_scale_power", K_MODEL},
	{"loss_scale_window", K_MODEL}, {"hysteresis", K_MODEL}, {"min_loss_scale", K_MODEL},
	{"consecutive_hysteresis", K_NONE}, {"auto_cast", K_NONE},
	{"fp16_master_weights_and_grads", K_NOT}, {0},
};

static const DsKey BF16_KEYS[] = {
	{"enabled", K_MODEL}, {"immediate_grad_update", K_NONE}, {"check_grad_overflow", K_NONE},
	{"bf16_master_weights_and_grads", K_NOT}, {"bf16_optimizer_states", K_NOT}, {0},
};

static const DsKey AC_KEYS[] = {
	{"partition_activations", K_MODEL}, {"cpu_checkpointing", K_MODEL},
	{"contiguous_memory_optimization", K_NOT}, {"number_checkpoints", K_NOT},
	{"synchronize_checkpoint_boundary", K_TIME}, {"profile", K_NONE}, {0},
};

static const DsKey PIPELINE_KEYS[] = {
	{"stages", K_MODEL}, {"partition", K_MODEL}, {"seed_layers", K_NONE},
	{"activation_checkpoint_interval", K_NOT}, {"pipe_partitioned", K_MODEL},
	{"grad_partitioned", K_MODEL}, {"use_reentrant", K_NONE}, {0},
};

static const DsKey TP_KEYS[] = {
	{"autotp_size", K_MODEL}, {"tp_size", K_MODEL}, {"tp_overlap_comm", K_TIME},
	{"partition_config", K_NOT}, {0},
};

/* compile/config.py CompileConfig (DeepCompile); the older {"disable", "backend"} form was
 * removed in 2024 and is now an unknown key */
static const DsKey COMPILE_KEYS[] = {
	{"deepcompile", K_NOT}, {"free_activation", K_NONE}, {"free_activation_threshold", K_NONE},
	{"offload_activation", K_NONE}, {"offload_activation_pin_memory", K_NONE},
	{"offload_opt_states", K_NONE}, {"double_buffer", K_NONE}, {"symmetric_memory", K_NONE},
	{"debug_log", K_NONE}, {"offload_parameters", K_NONE}, {"sync_before_reduce", K_NONE},
	{"sync_after_reduce", K_NONE}, {"sync_before_allgather", K_NONE},
	{"sync_after_allgather", K_NONE}, {"keep_int_input_tensors", K_NONE},
	{"keep_all_input_tensors", K_NONE}, {"passes", K_NONE}, {0},
};

static const DsKey OPTIMIZER_KEYS[] = {
	{"type", K_MODEL}, {"params", K_MODEL}, {"legacy_fusion", K_NONE}, {0},
};
static const DsKey DATA_TYPES_KEYS[] = {{"grad_accum_dtype", K_MODEL}, {0}};

/* A key counts as set when it is there and not false, null, 0, "none" or "auto" (an "auto" the
 * Trainer does not fill is dropped to the default), and a section when its "enabled" (if it has
 * one) is set. */
static int is_active(const cJSON *v)
{
	if (!v || cJSON_IsNull(v) || cJSON_IsFalse(v))
		return 0;
	if (cJSON_IsNumber(v))
		return v->valuedouble != 0;
	if (cJSON_IsString(v))
		return strcasecmp(v->valuestring, "none") != 0 && strcmp(v->valuestring, "auto") != 0;
	if (cJSON_IsObject(v) && cJSON_HasObjectItem(v, "enabled"))
		return is_active(cJSON_GetObjectItemCaseSensitive(v, "enabled"));
	return 1;
}

/* Warn about unknown keys and list the set keys that are not modelled. */
static int check_section(const JsonObj *o, const DsKey *keys, PxNotes *notes, PxError *err)
{
	const char *known[128];
	int n = 0;
	for (; keys[n].key && n < 127; n++)
		known[n] = keys[n].key;
	known[n] = NULL;
	if (jobj_check_keys(o, known, notes))
		return px_fail(err, PX_ERR_RUNTIME, "out of memory");
	for (int i = 0; i < n; i++) {
		if (keys[i].effect != K_TIME && keys[i].effect != K_NOT)
			continue;
		if (!is_active(cJSON_GetObjectItemCaseSensitive(o->obj, keys[i].key)))
			continue;
		if (px_notes_not_modelled(notes, "%s.%s (%s)", o->name, keys[i].key,
					  keys[i].effect == K_TIME ? "changes step time only" :
								     "not modelled yet"))
			return px_fail(err, PX_ERR_RUNTIME, "out of memory");
	}
	return 0;
}

/* ---- typed reads with "auto" ---- */

static int is_auto(const JsonObj *o, const char *key)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o->obj, key);
	return cJSON_IsString(v) && !strcmp(v->valuestring, "auto");
}

/* An integer or "auto"; 0 when absent. */
static int int_or_auto(const JsonObj *o, const char *key, unsigned flag, long long lo, long long hi,
		       long long *out, unsigned *autos, PxError *err)
{
	if (is_auto(o, key)) {
		*autos |= flag;
		*out = 0;
		return 0;
	}
	if (cJSON_IsString(cJSON_GetObjectItemCaseSensitive(o->obj, key))) {
		char where[512];
		jobj_where(o, key, where, sizeof(where));
		return px_fail(err, PX_ERR_INPUT, "%s: %s.%s: expected an integer or \"auto\", got \"%s\"",
			       where, o->name, key,
			       cJSON_GetObjectItemCaseSensitive(o->obj, key)->valuestring);
	}
	return jobj_int(o, key, lo, hi, 0, out, err) < 0 ? -1 : 0;
}

static int num_or_auto(const JsonObj *o, const char *key, unsigned flag, double lo, double hi,
		       double dflt, double *out, unsigned *autos, PxError *err)
{
	int rc = jobj_num_or_auto(o, key, lo, hi, dflt, out, err);
	if (rc == 2)
		*autos |= flag;
	return rc < 0 ? -1 : 0;
}

static int bool_or_auto(const JsonObj *o, const char *key, unsigned flag, int dflt, int *out,
			unsigned *autos, PxError *err)
{
	if (is_auto(o, key)) {
		*autos |= flag;
		*out = dflt;
		return 0;
	}
	return jobj_bool(o, key, dflt, out, err) < 0 ? -1 : 0;
}

/* DeepSpeed's pydantic sections (zero_optimization, its offload objects, fp16, bf16) drop every
 * "auto" the Trainer has not filled before validating (runtime/config_utils.py
 * DeepSpeedConfigModel), so such a key reads as absent: its default. */
static int dropped_num(const JsonObj *o, const char *key, double lo, double hi, double dflt,
		       double *out, PxError *err)
{
	if (is_auto(o, key)) {
		*out = dflt;
		return 0;
	}
	return jobj_num(o, key, lo, hi, dflt, out, err) < 0 ? -1 : 0;
}

static int dropped_int(const JsonObj *o, const char *key, long long lo, long long hi,
		       long long dflt, long long *out, PxError *err)
{
	if (is_auto(o, key)) {
		*out = dflt;
		return 0;
	}
	return jobj_int(o, key, lo, hi, dflt, out, err) < 0 ? -1 : 0;
}

static int dropped_bool(const JsonObj *o, const char *key, int dflt, int *out, PxError *err)
{
	if (is_auto(o, key)) {
		*out = dflt;
		return 0;
	}
	return jobj_bool(o, key, dflt, out, err) < 0 ? -1 : 0;
}

static int read_dtype(const JsonObj *o, const char *key, Dtype *out, int *set, PxError *err)
{
	const char *s;
	int rc = jobj_str(o, key, NULL, &s, err);
	if (rc <= 0)
		return rc;
	if (!strcasecmp(s, "fp32") || !strcasecmp(s, "float32") || !strcasecmp(s, "float"))
		*out = DT_FP32;
	else if (!strcasecmp(s, "fp16") || !strcasecmp(s, "float16") || !strcasecmp(s, "half"))
		*out = DT_FP16;
	else if (!strcasecmp(s, "bf16") || !strcasecmp(s, "bfloat16"))
		*out = DT_BF16;
	else {
		char where[512];
		jobj_where(o, key, where, sizeof(where));
		return px_fail(err, PX_ERR_INPUT, "%s: %s.%s: expected fp32, fp16 or bf16, got \"%s\"",
			       where, o->name, key, s);
	}
	*set = 1;
	return 1;
}

/* ---- sections ---- */

static int parse_precision(const JsonObj *root, DsConfig *ds, PxNotes *notes, PxError *err)
{
	JsonObj fp16, bf16;
	int rc;

	if ((rc = jobj_child(root, "fp16", &fp16, err)) < 0)
		return -1;
	if (rc) {
		if (check_section(&fp16, FP16_KEYS, notes, err) ||
		    bool_or_auto(&fp16, "enabled", AUTO_FP16, 0, &ds->fp16, &ds->autos, err) ||
		    dropped_num(&fp16, "loss_scale", 0, 1e30, 0, &ds->loss_scale, err) ||
		    dropped_int(&fp16, "initial_scale_power", 0, 64, 16, &ds->initial_scale_power, err) ||
		    dropped_int(&fp16, "loss_scale_window", 1, 1LL << 40, 1000, &ds->loss_scale_window,
				err) ||
		    dropped_int(&fp16, "hysteresis", 1, 1LL << 20, 2, &ds->hysteresis, err) ||
		    dropped_num(&fp16, "min_loss_scale", 0, 1e30, 1, &ds->min_loss_scale, err))
			return -1;
	}
	/* DeepSpeed reads "bf16" and its older spelling "bfloat16" */
	if ((rc = jobj_child(root, "bf16", &bf16, err)) < 0)
		return -1;
	if (!rc && (rc = jobj_child(root, "bfloat16", &bf16, err)) < 0)
		return -1;
	if (rc && (check_section(&bf16, BF16_KEYS, notes, err) ||
		   bool_or_auto(&bf16, "enabled", AUTO_BF16, 0, &ds->bf16, &ds->autos, err)))
		return -1;
	if (read_dtype(root, "communication_data_type", &ds->comm_dtype, &ds->comm_dtype_set, err) < 0)
		return -1;
	JsonObj dt;
	if ((rc = jobj_child(root, "data_types", &dt, err)) < 0)
		return -1;
	if (rc && (check_section(&dt, DATA_TYPES_KEYS, notes, err) ||
		   read_dtype(&dt, "grad_accum_dtype", &ds->grad_dtype, &ds->grad_dtype_set, err) < 0))
		return -1;
	return 0;
}

static int parse_optimizer_params(const JsonObj *params, DsConfig *ds, int *amsgrad,
				  int *torch_adam, int *centered, PxError *err)
{
	double betas[2] = {ds->beta1, ds->beta2};
	const cJSON *b = cJSON_GetObjectItemCaseSensitive(params->obj, "betas");
	if (cJSON_IsString(b) && !strcmp(b->valuestring, "auto"))
		ds->autos |= AUTO_BETAS;
	else if (b && !(cJSON_IsArray(b) && cJSON_GetArraySize(b) == 2 &&
			cJSON_IsNumber(cJSON_GetArrayItem(b, 0)) &&
			cJSON_IsNumber(cJSON_GetArrayItem(b, 1)))) {
		char where[512];
		jobj_where(params, "betas", where, sizeof(where));
		return px_fail(err, PX_ERR_INPUT, "%s: %s.betas: expected [beta1, beta2] or \"auto\"",
			       where, params->name);
	} else if (b) {
		betas[0] = cJSON_GetArrayItem(b, 0)->valuedouble;
		betas[1] = cJSON_GetArrayItem(b, 1)->valuedouble;
	}
	ds->beta1 = betas[0], ds->beta2 = betas[1];
	if (num_or_auto(params, "lr", AUTO_LR, 0, 1e3, ds->lr, &ds->lr, &ds->autos, err) ||
	    num_or_auto(params, "eps", AUTO_EPS, 0, 1, ds->eps, &ds->eps, &ds->autos, err) ||
	    num_or_auto(params, "weight_decay", AUTO_WD, 0, 1e3, 0, &ds->weight_decay, &ds->autos,
			err) ||
	    jobj_num(params, "momentum", 0, 1, 0, &ds->momentum, err) < 0 ||
	    jobj_bool(params, "amsgrad", 0, amsgrad, err) < 0 ||
	    jobj_bool(params, "torch_adam", 0, torch_adam, err) < 0 ||
	    jobj_bool(params, "centered", 0, centered, err) < 0)
		return -1;
	if (cJSON_HasObjectItem(params->obj, "max_grad_norm")) {
		char where[512];
		jobj_where(params, "max_grad_norm", where, sizeof(where));
		return px_fail(err, PX_ERR_INPUT, "%s: %s.max_grad_norm: DeepSpeed refuses: "
			       "'max_grad_norm' is not supported as an optimizer parameter, please "
			       "switch to using the deepspeed parameter 'gradient_clipping'", where,
			       params->name);
	}
	return 0;
}

/* The 1-bit optimizers' schedule params (onebit.h); the other types ignore them, as DeepSpeed's
 * constructors do not take them. */
static int parse_onebit_params(const JsonObj *params, OneBitParams *o, PxError *err)
{
	if (jobj_int(params, "freeze_step", 0, 1LL << 40, o->freeze_step, &o->freeze_step, err) < 0 ||
	    jobj_int(params, "var_freeze_step", 0, 1LL << 40, o->var_freeze_step,
		     &o->var_freeze_step, err) < 0 ||
	    jobj_int(params, "var_update_scaler", 1, 1LL << 40, o->var_update_scaler,
		     &o->var_update_scaler, err) < 0 ||
	    jobj_int(params, "local_step_scaler", 1, 1LL << 40, o->local_step_scaler,
		     &o->local_step_scaler, err) < 0 ||
	    jobj_int(params, "local_step_clipper", 1, 1LL << 40, o->local_step_clipper,
		     &o->local_step_clipper, err) < 0 ||
	    jobj_num(params, "max_coeff", 0, 1e6, o->max_coeff, &o->max_coeff, err) < 0 ||
	    jobj_num(params, "min_coeff", 0, 1e6, o->min_coeff, &o->min_coeff, err) < 0 ||
	    jobj_num(params, "coeff_beta", 0, 1, o->coeff_beta, &o->coeff_beta, err) < 0 ||
	    jobj_num(params, "factor_max", 0, 1e6, o->factor_max, &o->factor_max, err) < 0 ||
	    jobj_num(params, "factor_min", 0, 1e6, o->factor_min, &o->factor_min, err) < 0 ||
	    jobj_num(params, "factor_threshold", 0, 1e6, o->factor_threshold,
		     &o->factor_threshold, err) < 0)
		return -1;
	return 0;
}

/* The optimizer's kind and its states per parameter. ZeRO-dependent checks wait for the zero
 * section (check_optimizer_zero). */
static int parse_optimizer(const JsonObj *root, DsConfig *ds, PxNotes *notes, PxError *err)
{
	JsonObj opt, params;
	const char *type = "AdamW", *hint;
	int rc, amsgrad = 0, torch_adam = 0, centered = 0;

	/* Without an optimizer section DeepSpeed uses the client's; the Trainer's default is AdamW. */
	ds->beta1 = 0.9, ds->beta2 = 0.999, ds->eps = 1e-8, ds->lr = 1e-3;
	if ((rc = jobj_child(root, "optimizer", &opt, err)) < 0)
		return -1;
	ds->opt_section = rc;
	if (rc) {
		if (check_section(&opt, OPTIMIZER_KEYS, notes, err) ||
		    jobj_str(&opt, "type", "AdamW", &type, err) < 0)
			return -1;
	}
	const OptimKind *k = optim_find(type, &hint);
	if (!k) {
		char where[512], names[512];
		jobj_where(&opt, "type", where, sizeof(where));
		if (hint)
			return px_fail(err, PX_ERR_INPUT, "%s: %s.type: \"%s\" is not one of DeepSpeed's "
				       "own optimizers, and torch.optim has no \"%s\" (DeepSpeed takes "
				       "the other names from torch.optim as written): did you mean \"%s\"?",
				       where, opt.name, type, type, hint);
		optim_names(names, sizeof(names));
		return px_fail(err, PX_ERR_INPUT, "%s: %s.type: expected one of %s, got \"%s\"", where,
			       opt.name, names, type);
	}
	snprintf(ds->optimizer, sizeof(ds->optimizer), "%s", k->name);
	ds->opt = k;
	if (rc && (rc = jobj_child(&opt, "params", &params, err)) < 0)
		return -1;
	if (rc && parse_optimizer_params(&params, ds, &amsgrad, &torch_adam, &centered, err))
		return -1;
	onebit_params_default(&ds->onebit);
	if (rc && k->error_feedback != EF_NONE && parse_onebit_params(&params, &ds->onebit, err))
		return -1;
	ds->optimizer_states = k->states + (k->momentum_state && ds->momentum > 0) +
			       (k->centered_state && centered);
	int adam = !strcmp(k->name, "Adam") || !strcmp(k->name, "AdamW");
	ds->opt_impl = OPT_IMPL_FUSED;
	if (adam && torch_adam) {
		/* engine.py passes the other params on to torch.optim.Adam(W), fused and foreach
		 * among them */
		int fused = 0, foreach = 1;
		if (jobj_bool(&params, "fused", 0, &fused, err) < 0 ||
		    jobj_bool(&params, "foreach", 1, &foreach, err) < 0)
			return -1;
		ds->torch_adam = 1;
		ds->opt_impl = fused ? OPT_IMPL_FUSED : foreach ? OPT_IMPL_FOREACH : OPT_IMPL_FOR_LOOP;
	}
	ds->amsgrad = amsgrad && adam;
	return 0;
}

void dsconfig_resolve_optimizer_impl(DsConfig *ds, const TrainArgs *ta, PxNotes *notes)
{
	if (ds->opt_section) {
		if (ta->optim >= 0)
			px_notes_warn(notes, "%s: training_args.optim \"%s\" is not used: the DeepSpeed "
				      "config's optimizer section builds the optimizer (remove the "
				      "section for the Trainer's own)", ta->optim_where,
				      optim_trainer_names[ta->optim]);
		return;
	}
	OptimImplKind k = OPT_IMPL_FUSED; /* adamw_torch_fused, today's default */
	if (ta->optim >= 0)
		optim_impl_from_trainer(optim_trainer_names[ta->optim], &k);
	ds->opt_impl = k;
	ds->opt_impl_trainer = 1;
}

static int parse_offload(const JsonObj *zero, const char *key, const DsKey *keys, DsOffload *off,
			 PxNotes *notes, PxError *err)
{
	JsonObj o;
	const char *dev = "none";
	int rc = jobj_child(zero, key, &o, err);

	const char *path = "";
	off->buffer_count = !strcmp(key, "offload_param") ? 5 : 4;
	off->buffer_size = 1e8;
	off->max_in_cpu = 1e9;
	off->nvme_path[0] = '\0';
	if (rc <= 0)
		return rc;
	if (check_section(&o, keys, notes, err) ||
	    (!is_auto(&o, "device") && jobj_str(&o, "device", "none", &dev, err) < 0) ||
	    jobj_str(&o, "nvme_path", "", &path, err) < 0 ||
	    dropped_bool(&o, "pin_memory", 0, &off->pin_memory, err) ||
	    dropped_int(&o, "buffer_count", 0, 1 << 20, off->buffer_count, &off->buffer_count, err) ||
	    dropped_num(&o, "buffer_size", 0, 1e18, off->buffer_size, &off->buffer_size, err) ||
	    dropped_num(&o, "max_in_cpu", 0, 1e18, off->max_in_cpu, &off->max_in_cpu, err))
		return -1;
	if (strlen(path) >= sizeof(off->nvme_path)) {
		char where[512];
		jobj_where(&o, "nvme_path", where, sizeof(where));
		return px_fail(err, PX_ERR_INPUT, "%s: %s.nvme_path: expected a path of at most %zu "
			       "characters, got %zu", where, o.name, sizeof(off->nvme_path) - 1,
			       strlen(path));
	}
	strcpy(off->nvme_path, path);
	if (!strcasecmp(dev, "none"))
		off->device = DEV_NONE;
	else if (!strcasecmp(dev, "cpu"))
		off->device = DEV_CPU;
	else if (!strcasecmp(dev, "nvme"))
		off->device = DEV_NVME;
	else {
		char where[512];
		jobj_where(&o, "device", where, sizeof(where));
		return px_fail(err, PX_ERR_INPUT, "%s: %s.device: expected none, cpu or nvme, got \"%s\"",
			       where, o.name, dev);
	}
	return 0;
}

/* Defaults from DeepSpeed's zero/config.py; sizes are in elements. */
static void zero_defaults(DsZero *z)
{
	memset(z, 0, sizeof(*z));
	z->reduce_bucket_elems = 5e8;
	z->allgather_bucket_elems = 5e8;
	z->contiguous_gradients = 1;
	z->reduce_scatter = 1;
	z->prefetch_bucket_elems = 5e7;
	z->persistence_threshold_elems = 1e5;
	z->max_live_elems = 1e9;
	z->max_reuse_elems = 1e9;
	z->sub_group_elems = 1e9;
	z->hpz_partition_size = 1;
	z->offload_optimizer.buffer_count = 4;
	z->offload_param.buffer_count = 5;
	z->offload_optimizer.buffer_size = z->offload_param.buffer_size = 1e8;
}

/* The deprecated boolean form, runtime/zero/config.py read_zero_config_deprecated: true is stage
 * 1 with the top-level "allgather_size" as its all-gather bucket, false stage 0. */
static int parse_zero_bool(const JsonObj *root, const cJSON *v, DsZero *z, PxNotes *notes,
			   PxError *err)
{
	char where[512];
	z->stage = cJSON_IsTrue(v);
	if (z->stage && jobj_num(root, "allgather_size", 0, 1e18, z->allgather_bucket_elems,
				 &z->allgather_bucket_elems, err) < 0)
		return -1;
	jobj_where(root, "zero_optimization", where, sizeof(where));
	return px_notes_warn(notes, "%s: warning: %s.zero_optimization: %s is DeepSpeed's deprecated "
			     "form; read as {\"stage\": %d}", where, root->name,
			     z->stage ? "true" : "false", z->stage) ?
		       px_fail(err, PX_ERR_RUNTIME, "out of memory") : 0;
}

/* A stage 3 size written by its alias (stage3_X) or, as pydantic's populate_by_name allows, by
 * its field name (X: axolotl writes max_live_parameters). The Trainer fills only the alias's
 * "auto" (flag); any other "auto" drops to the default. */
static int stage3_num(const JsonObj *zo, const char *alias, unsigned flag, double dflt,
		      double *out, unsigned *autos, PxError *err)
{
	const char *field = alias + strlen("stage3_");
	if (!cJSON_HasObjectItem(zo->obj, alias) && cJSON_HasObjectItem(zo->obj, field))
		return dropped_num(zo, field, 0, 1e18, dflt, out, err);
	if (flag)
		return num_or_auto(zo, alias, flag, 0, 1e18, dflt, out, autos, err);
	return dropped_num(zo, alias, 0, 1e18, dflt, out, err);
}

/* Stage 3's sizes, "auto" included: the three the Trainer fills from hidden_size are resolved
 * later (resolve_autos); the rest drop to their defaults. */
static int parse_zero_sizes(const JsonObj *zo, DsConfig *ds, PxError *err)
{
	DsZero *z = &ds->zero;
	unsigned *a = &ds->autos;
	return num_or_auto(zo, "reduce_bucket_size", AUTO_REDUCE_BUCKET, 0, 1e18,
			   z->reduce_bucket_elems, &z->reduce_bucket_elems, a, err) ||
	       dropped_num(zo, "allgather_bucket_size", 0, 1e18, z->allgather_bucket_elems,
			   &z->allgather_bucket_elems, err) ||
	       stage3_num(zo, "stage3_prefetch_bucket_size", AUTO_PREFETCH, z->prefetch_bucket_elems,
			  &z->prefetch_bucket_elems, a, err) ||
	       stage3_num(zo, "stage3_param_persistence_threshold", AUTO_PERSISTENCE,
			  z->persistence_threshold_elems, &z->persistence_threshold_elems, a, err) ||
	       stage3_num(zo, "stage3_max_live_parameters", 0, z->max_live_elems, &z->max_live_elems,
			  a, err) ||
	       stage3_num(zo, "stage3_max_reuse_distance", 0, z->max_reuse_elems,
			  &z->max_reuse_elems, a, err) ||
	       /* 0 makes every parameter its own sub-group (stage3.py _create_fp16_sub_groups);
		* configs write 1e9 to 1e14 */
	       dropped_num(zo, "sub_group_size", 0, 1e18, z->sub_group_elems, &z->sub_group_elems,
			   err) ?
		       -1 : 0;
}

static int parse_zero(const JsonObj *root, DsConfig *ds, PxNotes *notes, PxError *err)
{
	JsonObj zo;
	DsZero *z = &ds->zero;
	long long stage = 0;
	int rc, legacy_cpu = 0, legacy_params = 0;
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(root->obj, "zero_optimization");

	zero_defaults(z);
	if (cJSON_IsBool(v))
		return parse_zero_bool(root, v, z, notes, err);
	if ((rc = jobj_child(root, "zero_optimization", &zo, err)) <= 0)
		return rc;
	if (check_section(&zo, ZERO_KEYS, notes, err) ||
	    dropped_int(&zo, "stage", 0, 3, 0, &stage, err) || parse_zero_sizes(&zo, ds, err) ||
	    dropped_bool(&zo, "overlap_comm", stage == 3, &z->overlap_comm, err) ||
	    dropped_bool(&zo, "contiguous_gradients", 1, &z->contiguous_gradients, err) ||
	    dropped_bool(&zo, "reduce_scatter", 1, &z->reduce_scatter, err) ||
	    dropped_bool(&zo, "zero_quantized_weights", 0, &z->quantized_weights, err) ||
	    dropped_bool(&zo, "zero_quantized_gradients", 0, &z->quantized_gradients, err) ||
	    dropped_int(&zo, "zero_hpz_partition_size", 0, 1 << 20, 1, &z->hpz_partition_size, err) ||
	    dropped_bool(&zo, "cpu_offload", 0, &legacy_cpu, err) ||
	    dropped_bool(&zo, "cpu_offload_param", 0, &legacy_params, err))
		return -1;
	z->stage = (int)stage;
	if (z->hpz_partition_size == 0) /* DeepSpeed allows 0 (ge=0) and treats it as 1: no hpZ */
		z->hpz_partition_size = 1;
	if (parse_offload(&zo, "offload_optimizer", OFFLOAD_OPT_KEYS, &z->offload_optimizer, notes,
			  err) < 0 ||
	    parse_offload(&zo, "offload_param", OFFLOAD_PARAM_KEYS, &z->offload_param, notes, err) < 0)
		return -1;
	if (legacy_cpu && z->offload_optimizer.device == DEV_NONE) {
		z->offload_optimizer.device = DEV_CPU;
		px_notes_warn(notes, "%s: %s.cpu_offload is deprecated; read as offload_optimizer "
			      "{\"device\": \"cpu\"}", zo.doc->path, zo.name);
	}
	if (legacy_params && z->offload_param.device == DEV_NONE) {
		z->offload_param.device = DEV_CPU;
		px_notes_warn(notes, "%s: %s.cpu_offload_param is deprecated; read as offload_param "
			      "{\"device\": \"cpu\"}", zo.doc->path, zo.name);
	}

	char where[512];
	/* only stage 3 reads offload_param (stage3.py); stage 1-2 never look at it */
	if (z->offload_param.device != DEV_NONE && z->stage != 3) {
		jobj_where(&zo, legacy_params ? "cpu_offload_param" : "offload_param", where,
			   sizeof(where));
		if (px_notes_warn(notes, "%s: warning: %s.offload_param: device %s is ignored at ZeRO "
				  "stage %d, as DeepSpeed ignores it (only stage 3 offloads "
				  "parameters)", where, zo.name,
				  offload_device_name(z->offload_param.device), z->stage))
			return px_fail(err, PX_ERR_RUNTIME, "out of memory");
		z->offload_param.device = DEV_NONE;
	}
	/* ZeRO++ is a part of stage3.py; stage 1-2 take none of its settings (OpenRLHF writes
	 * zero_hpz_partition_size 8 whatever the stage) */
	if (z->stage < 3 && (z->hpz_partition_size > 1 || z->quantized_weights ||
			     z->quantized_gradients)) {
		const char *key = z->hpz_partition_size > 1 ? "zero_hpz_partition_size" :
				  z->quantized_weights ? "zero_quantized_weights" :
							 "zero_quantized_gradients";
		jobj_where(&zo, key, where, sizeof(where));
		if (px_notes_warn(notes, "%s: warning: %s.%s: ZeRO++ is ignored at ZeRO stage %d, as "
				  "DeepSpeed ignores it (only stage 3 reads it)", where, zo.name, key,
				  z->stage))
			return px_fail(err, PX_ERR_RUNTIME, "out of memory");
		z->hpz_partition_size = 1;
		z->quantized_weights = z->quantized_gradients = 0;
	}
	/* the combinations DeepSpeed refuses, with its reasons */
	if (z->offload_optimizer.device != DEV_NONE && z->stage == 0) {
		jobj_where(&zo, "offload_optimizer", where, sizeof(where));
		return px_fail(err, PX_ERR_INPUT, "%s: %s.offload_optimizer: optimizer offload needs "
			       "ZeRO stage 1, 2 or 3, got stage 0 (DeepSpeed builds DeepSpeedCPUAdam, "
			       "which refuses parameters on the GPU)", where, zo.name);
	}
	if (z->offload_optimizer.device == DEV_NVME && z->stage != 3) {
		jobj_where(&zo, "offload_optimizer", where, sizeof(where));
		return px_fail(err, PX_ERR_INPUT, "%s: %s.offload_optimizer.device: NVMe offload "
			       "(ZeRO-Infinity) needs ZeRO stage 3, got stage %d", where, zo.name,
			       z->stage);
	}
	/* stage_1_and_2.py asserts allgather_bucket_size % nccl_start_alignment_factor (2) == 0 */
	if ((z->stage == 1 || z->stage == 2) && fmod(z->allgather_bucket_elems, 2) != 0) {
		jobj_where(&zo, "allgather_bucket_size", where, sizeof(where));
		return px_fail(err, PX_ERR_INPUT, "%s: %s.allgather_bucket_size: %.17g; DeepSpeed "
			       "refuses: allgather_bucket_size must be a multiple of "
			       "nccl_start_alignment_factor, 2", where, zo.name,
			       z->allgather_bucket_elems);
	}
	return 0;
}

static int parse_parallel_keys(const JsonObj *root, DsConfig *ds, PxNotes *notes, PxError *err)
{
	JsonObj o;
	int rc;
	if ((rc = jobj_child(root, "tensor_parallel", &o, err)) < 0)
		return -1;
	if (rc) {
		const char *key = cJSON_HasObjectItem(o.obj, "autotp_size") ? "autotp_size" : "tp_size";
		if (check_section(&o, TP_KEYS, notes, err) ||
		    jobj_int(&o, key, 1, 1 << 20, 0, &ds->autotp_size, err) < 0)
			return -1;
		jobj_where(&o, key, ds->tp_where, sizeof(ds->tp_where));
	}
	/* runtime/config.py get_pipeline_config: both on unless the section turns them off */
	ds->pipe_partitioned = ds->grad_partitioned = 1;
	if ((rc = jobj_child(root, "pipeline", &o, err)) < 0)
		return -1;
	if (rc) {
		if (check_section(&o, PIPELINE_KEYS, notes, err) ||
		    jobj_str(&o, "partition", NULL, &ds->pipeline_partition, err) < 0 ||
		    jobj_bool(&o, "pipe_partitioned", 1, &ds->pipe_partitioned, err) < 0 ||
		    jobj_bool(&o, "grad_partitioned", 1, &ds->grad_partitioned, err) < 0)
			return -1;
		if (!is_auto(&o, "stages") &&
		    jobj_int(&o, "stages", 1, 1 << 20, 0, &ds->pipeline_stages, err) < 0)
			return -1;
		jobj_where(&o, "stages", ds->pp_where, sizeof(ds->pp_where));
	}
	return 0;
}

/* Only its keys are checked: DeepCompile itself is listed as not modelled when on (its other
 * settings act only with it). */
static int parse_compile(const JsonObj *root, PxNotes *notes, PxError *err)
{
	JsonObj o;
	int rc = jobj_child(root, "compile", &o, err);
	return rc <= 0 ? rc : check_section(&o, COMPILE_KEYS, notes, err);
}

static int parse_checkpointing(const JsonObj *root, DsConfig *ds, PxNotes *notes, PxError *err)
{
	JsonObj ac;
	int rc = jobj_child(root, "activation_checkpointing", &ac, err);
	if (rc <= 0)
		return rc;
	ds->ac_present = 1;
	if (check_section(&ac, AC_KEYS, notes, err) ||
	    jobj_bool(&ac, "partition_activations", 0, &ds->partition_activations, err) < 0 ||
	    jobj_bool(&ac, "cpu_checkpointing", 0, &ds->cpu_checkpointing, err) < 0)
		return -1;
	return 0;
}

/* Top-level settings DeepSpeed checks against the ZeRO stage (runtime/config.py, engine.py). */
static int check_top_zero(const JsonObj *root, const DsConfig *ds, PxError *err)
{
	char where[512];
	const char *op;
	JsonObj amp;
	int amp_on = 0;
	if (jobj_str(root, "gradient_allreduce_op", "mean", &op, err) < 0)
		return -1;
	/* where a key sits is found by scanning the text: only for a message */
	int bad_op = strcasecmp(op, "mean") && strcasecmp(op, "sum");
	if (bad_op || (!strcasecmp(op, "sum") && ds->zero.stage == 3))
		jobj_where(root, "gradient_allreduce_op", where, sizeof(where));
	if (bad_op)
		return px_fail(err, PX_ERR_INPUT, "%s: %s.gradient_allreduce_op: expected mean or sum, "
			       "got \"%s\"", where, root->name, op);
	if (!strcasecmp(op, "sum") && ds->zero.stage == 3)
		return px_fail(err, PX_ERR_INPUT, "%s: %s.gradient_allreduce_op: DeepSpeed refuses: "
			       "gradient_allreduce_op='sum' is not supported with ZeRO stage 3", where,
			       root->name);
	if (jobj_child(root, "amp", &amp, err) < 0 ||
	    (!is_auto(&amp, "enabled") && jobj_bool(&amp, "enabled", 0, &amp_on, err) < 0))
		return -1;
	if (amp_on && ds->zero.stage > 0) {
		jobj_where(&amp, "enabled", where, sizeof(where));
		return px_fail(err, PX_ERR_INPUT, "%s: %s.enabled with ZeRO stage %d; DeepSpeed "
			       "refuses: Amp and ZeRO are not currently compatible, please use "
			       "(legacy) fp16 mode which performs similar to amp opt_mode=O2", where,
			       amp.name, ds->zero.stage);
	}
	return 0;
}

/* What DeepSpeed refuses or warns about for an optimizer once the ZeRO stage is known
 * (engine.py _configure_basic_optimizer, _do_optimizer_sanity_check; the ZeRO optimizers). */
static int check_optimizer_zero(const JsonObj *root, DsConfig *ds, PxNotes *notes, PxError *err)
{
	const OptimKind *k = ds->opt;
	const DsZero *z = &ds->zero;
	char where[512];
	JsonObj opt;
	int untested_ok = 0;

	if (jobj_child(root, "optimizer", &opt, err) < 0 ||
	    jobj_bool(root, "zero_allow_untested_optimizer", 0, &untested_ok, err) < 0)
		return -1;
	/* the type's place in the text, found (by scanning) only for a message */
#define AT_TYPE (jobj_where(&opt, "type", where, sizeof(where)), where)
	if (k->no_zero && z->stage > 0)
		return px_fail(err, PX_ERR_INPUT, "%s: %s.type: %s with ZeRO stage %d; DeepSpeed "
			       "refuses: %s (use stage 0)", AT_TYPE, opt.name, k->name, z->stage,
			       k->no_zero);
	if (k->muon && z->stage == 3 && z->reduce_scatter)
		return px_fail(err, PX_ERR_INPUT, "%s: %s.type: Muon at ZeRO stage 3 with "
			       "zero_optimization.reduce_scatter on (set it false); DeepSpeed refuses: "
			       "Muon and reduce scatter cannot be used together", AT_TYPE, opt.name);
	if (k->muon && z->stage == 3 && z->quantized_gradients)
		return px_fail(err, PX_ERR_INPUT, "%s: %s.type: Muon with zero_quantized_gradients; "
			       "DeepSpeed refuses: Muon and all2all process group cannot be used "
			       "together", AT_TYPE, opt.name);
	if (k->muon && (z->stage == 1 || z->stage == 2) && z->reduce_scatter &&
	    z->offload_optimizer.device == DEV_CPU)
		return px_fail(err, PX_ERR_INPUT, "%s: %s.type: Muon with reduce_scatter and optimizer "
			       "offload; DeepSpeed refuses: Muon with reduce scatter does not support "
			       "optimizer offload because offload retains only partition slices; "
			       "disable reduce scatter or optimizer offload", AT_TYPE, opt.name);
	if (ds->amsgrad && !ds->torch_adam) {
		if (z->stage == 0 || z->offload_optimizer.device == DEV_NONE)
			return px_fail(err, PX_ERR_INPUT, "%s: %s.params.amsgrad: DeepSpeed builds "
				       "FusedAdam, which refuses: FusedAdam does not support the AMSGrad "
				       "variant (set params.torch_adam: true for torch.optim's Adam)",
				       AT_TYPE, opt.name);
		/* DeepSpeedCPUAdam takes the flag and keeps Adam's two states */
	} else if (ds->amsgrad) {
		ds->optimizer_states += 1; /* torch.optim's max_exp_avg_sq */
	}
	if (z->stage > 0 && opt.obj && !k->zero_tested && !untested_ok &&
	    px_notes_warn(notes, "%s: warning: %s.type: %s with ZeRO needs "
			  "\"zero_allow_untested_optimizer\": true; DeepSpeed stops otherwise: You are "
			  "using an untested ZeRO Optimizer", AT_TYPE, opt.name, k->name))
		return px_fail(err, PX_ERR_RUNTIME, "out of memory");
	/* the compressed phase is scheduled and priced (onebit.h, sim/onebit.c); what is not: */
	if (k->error_feedback != EF_NONE &&
	    px_notes_not_modelled(notes, "%s.type %s (the compressed all-reduce's compression and "
				  "decompression kernels are not timed, only its messages; "
				  "params.comm_backend_name \"mpi\"'s gathers are priced as NCCL's "
				  "all-to-all and all-gathers)", opt.name, k->name))
		return px_fail(err, PX_ERR_RUNTIME, "out of memory");
	return 0;
#undef AT_TYPE
}

/* sparse_attention: its settings and checks are sparse_layout.c's; the sequence's, scenario.c's */
static int parse_sparse(const JsonObj *root, DsConfig *ds, PxNotes *notes, PxError *err)
{
	JsonObj sa;
	int rc = jobj_child(root, "sparse_attention", &sa, err);
	if (rc <= 0)
		return rc;
	return sparse_attn_parse(&sa, &ds->sparse, notes, err);
}

int dsconfig_parse(const JsonObj *o, DsConfig *ds, PxNotes *notes, PxError *err)
{
	memset(ds, 0, sizeof(*ds));
	ds->source = o->doc->path;
	ds->root = *o;
	if (check_section(o, TOP_KEYS, notes, err) ||
	    int_or_auto(o, "train_batch_size", AUTO_TRAIN_BATCH, 1, 1LL << 40, &ds->train_batch,
			&ds->autos, err) ||
	    int_or_auto(o, "train_micro_batch_size_per_gpu", AUTO_MICRO_BATCH, 1, 1LL << 40,
			&ds->micro_batch, &ds->autos, err) ||
	    int_or_auto(o, "gradient_accumulation_steps", AUTO_GRAD_ACCUM, 1, 1LL << 40,
			&ds->grad_accum, &ds->autos, err) ||
	    num_or_auto(o, "gradient_clipping", AUTO_CLIP, 0, 1e30, 0, &ds->gradient_clipping,
			&ds->autos, err))
		return -1;
	if (parse_precision(o, ds, notes, err) || parse_optimizer(o, ds, notes, err) ||
	    parse_zero(o, ds, notes, err) || check_top_zero(o, ds, err) ||
	    check_optimizer_zero(o, ds, notes, err) ||
	    parse_checkpointing(o, ds, notes, err) || parse_compile(o, notes, err) ||
	    lrsched_parse(o, ds, notes, err) ||
	    parse_parallel_keys(o, ds, notes, err) || parse_sparse(o, ds, notes, err))
		return -1;
	return 0;
}

/* ---- resolution ---- */

void train_args_defaults(TrainArgs *t)
{ /* transformers.TrainingArguments defaults */
	*t = (TrainArgs){.per_device_train_batch_size = 8, .gradient_accumulation_steps = 1,
			 .learning_rate = 5e-5, .adam_beta1 = 0.9, .adam_beta2 = 0.999,
			 .adam_epsilon = 1e-8, .max_grad_norm = 1.0, .max_steps = -1,
			 .num_train_epochs = 3.0, .optim = -1, .ddp_bucket_cap_mb = 25};
}

int train_args_parse(const JsonObj *o, TrainArgs *t, PxNotes *notes, PxError *err)
{
	static const char *const known[] = {
		"per_device_train_batch_size", "gradient_accumulation_steps", "learning_rate",
		"weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon", "max_grad_norm", "fp16",
		"bf16", "gradient_checkpointing", "max_steps", "num_train_epochs", "warmup_steps",
		"warmup_ratio", "optim", "ddp_bucket_cap_mb", NULL};
	train_args_defaults(t);
	if (jobj_check_keys(o, known, notes))
		return px_fail(err, PX_ERR_RUNTIME, "out of memory");
	if (jobj_int(o, "per_device_train_batch_size", 1, 1LL << 40, t->per_device_train_batch_size,
		     &t->per_device_train_batch_size, err) < 0 ||
	    jobj_int(o, "gradient_accumulation_steps", 1, 1LL << 40, t->gradient_accumulation_steps,
		     &t->gradient_accumulation_steps, err) < 0 ||
	    jobj_num(o, "learning_rate", 0, 1e3, t->learning_rate, &t->learning_rate, err) < 0 ||
	    jobj_num(o, "weight_decay", 0, 1e3, 0, &t->weight_decay, err) < 0 ||
	    jobj_num(o, "adam_beta1", 0, 1, t->adam_beta1, &t->adam_beta1, err) < 0 ||
	    jobj_num(o, "adam_beta2", 0, 1, t->adam_beta2, &t->adam_beta2, err) < 0 ||
	    jobj_num(o, "adam_epsilon", 0, 1, t->adam_epsilon, &t->adam_epsilon, err) < 0 ||
	    jobj_num(o, "max_grad_norm", 0, 1e30, t->max_grad_norm, &t->max_grad_norm, err) < 0 ||
	    jobj_bool(o, "fp16", 0, &t->fp16, err) < 0 || jobj_bool(o, "bf16", 0, &t->bf16, err) < 0 ||
	    jobj_bool(o, "gradient_checkpointing", 0, &t->gradient_checkpointing, err) < 0 ||
	    jobj_int(o, "max_steps", -1, 1LL << 50, -1, &t->max_steps, err) < 0 ||
	    jobj_num(o, "num_train_epochs", 0, 1e12, 3.0, &t->num_train_epochs, err) < 0 ||
	    jobj_num(o, "warmup_steps", 0, 1e15, 0, &t->warmup_steps, err) < 0 ||
	    jobj_num(o, "warmup_ratio", 0, 1, 0, &t->warmup_ratio, err) < 0 ||
	    jobj_choice(o, "optim", optim_trainer_names, -1, &t->optim, err) < 0 ||
	    jobj_int(o, "ddp_bucket_cap_mb", 1, 1LL << 20, 25, &t->ddp_bucket_cap_mb, err) < 0)
		return -1;
	if (t->optim >= 0)
		jobj_where(o, "optim", t->optim_where, sizeof(t->optim_where));
	if (t->fp16 && t->bf16) {
		char where[512];
		jobj_where(o, "bf16", where, sizeof(where));
		return px_fail(err, PX_ERR_INPUT, "%s: %s: fp16 and bf16 are both true; expected at "
			       "most one (the Trainer refuses both)", where, o->name);
	}
	if (t->fp16 || t->bf16)
		jobj_where(o, t->fp16 ? "fp16" : "bf16", t->precision_where,
			   sizeof(t->precision_where));
	if (t->warmup_steps >= 1 && t->warmup_steps != floor(t->warmup_steps)) {
		char where[512];
		jobj_where(o, "warmup_steps", where, sizeof(where));
		return px_fail(err, PX_ERR_INPUT, "%s: %s.warmup_steps: expected a whole number of "
			       "steps, or a fraction of the training steps below 1, got %g", where,
			       o->name, t->warmup_steps);
	}
	return 0;
}

/* FILE:LINE:COL of the batch keys or of zero_optimization, found only when an error needs it. */
static const char *where_of(const DsConfig *ds, const char *what, char *buf, size_t n)
{
	const char *key = what;
	if (!strcmp(what, "batch"))
		key = cJSON_HasObjectItem(ds->root.obj, "train_batch_size") ?
			"train_batch_size" : "train_micro_batch_size_per_gpu";
	jobj_where(&ds->root, key, buf, n);
	return buf;
}

static int resolve_autos(DsConfig *ds, const ModelSpec *m, const TrainArgs *ta, long long dp,
			 PxError *err)
{
	char where[512];
	unsigned a = ds->autos;
	unsigned hidden_based = AUTO_REDUCE_BUCKET | AUTO_PREFETCH | AUTO_PERSISTENCE;

	if ((a & hidden_based) && !model_known(m))
		return px_fail(err, PX_ERR_INPUT,
			       "%s: deepspeed.zero_optimization: bucket sizes are \"auto\", which the "
			       "Hugging Face integration fills from the model's hidden_size; the model "
			       "gives only num_parameters: write numbers instead",
			       where_of(ds, "zero_optimization", where, sizeof(where)));
	double h = (double)m->h;
	if (a & AUTO_REDUCE_BUCKET)
		ds->zero.reduce_bucket_elems = h * h;
	/* filled at stage 3 only; below it DeepSpeed drops the "auto" to its default */
	if ((a & AUTO_PREFETCH) && ds->zero.stage == 3)
		ds->zero.prefetch_bucket_elems = floor(0.9 * h * h);
	if ((a & AUTO_PERSISTENCE) && ds->zero.stage == 3)
		ds->zero.persistence_threshold_elems = 10 * h;
	if (a & AUTO_MICRO_BATCH)
		ds->micro_batch = ta->per_device_train_batch_size;
	if (a & AUTO_GRAD_ACCUM)
		ds->grad_accum = ta->gradient_accumulation_steps;
	if (a & AUTO_TRAIN_BATCH)
		ds->train_batch = ta->per_device_train_batch_size * ta->gradient_accumulation_steps * dp;
	if (a & AUTO_FP16)
		ds->fp16 = ta->fp16;
	if (a & AUTO_BF16)
		ds->bf16 = ta->bf16;
	if (a & AUTO_CLIP)
		ds->gradient_clipping = ta->max_grad_norm;
	if (a & AUTO_LR)
		ds->lr = ta->learning_rate;
	if (a & AUTO_BETAS)
		ds->beta1 = ta->adam_beta1, ds->beta2 = ta->adam_beta2;
	if (a & AUTO_EPS)
		ds->eps = ta->adam_epsilon;
	if (a & AUTO_WD)
		ds->weight_decay = ta->weight_decay;
	return 0;
}

/* DeepSpeed's runtime/config.py: derive the missing batch value, then check the product. */
static int resolve_batch(DsConfig *ds, long long dp, PxError *err)
{
	char w[512];
	long long tb = ds->train_batch, mb = ds->micro_batch, ga = ds->grad_accum;

	if (tb && mb && !ga)
		ga = tb / mb / dp;
	else if (tb && ga && !mb)
		mb = tb / dp / ga;
	else if (mb && ga && !tb)
		tb = mb * ga * dp;
	else if (tb && !mb && !ga)
		ga = 1, mb = tb / dp;
	else if (mb && !tb && !ga)
		ga = 1, tb = mb * dp;
	else if (!tb && !mb)
		return px_fail(err, PX_ERR_INPUT, "%s: either train_batch_size or "
			       "train_micro_batch_size_per_gpu needs to be provided",
			       where_of(ds, "batch", w, sizeof(w)));
	if (mb <= 0)
		return px_fail(err, PX_ERR_INPUT, "%s: train_micro_batch_size_per_gpu: %lld has to be "
			       "greater than 0 (train_batch_size %lld over %lld data-parallel ranks)",
			       where_of(ds, "batch", w, sizeof(w)), mb, tb, dp);
	if (ga <= 0)
		return px_fail(err, PX_ERR_INPUT, "%s: gradient_accumulation_steps: %lld has to be "
			       "greater than 0 (train_batch_size %lld, micro-batch %lld, %lld "
			       "data-parallel ranks)", where_of(ds, "batch", w, sizeof(w)), ga, tb, mb, dp);
	if (tb != mb * ga * dp)
		return px_fail(err, PX_ERR_INPUT, "%s: train_batch_size is not equal to "
			       "micro_batch_per_gpu * gradient_acc_step * world_size: %lld != %lld * "
			       "%lld * %lld", where_of(ds, "batch", w, sizeof(w)), tb, mb, ga, dp);
	ds->train_batch = tb, ds->micro_batch = mb, ds->grad_accum = ga;
	return 0;
}

int dsconfig_resolve(DsConfig *ds, const ModelSpec *m, const TrainArgs *ta, long long dp,
		     PxError *err)
{
	if (resolve_autos(ds, m, ta, dp, err) || resolve_batch(ds, dp, err))
		return -1;
	ds->autocast = DT_FP32;
	if (ta->autocast) {
		/* the Trainer without DeepSpeed: torch.autocast over the fp32 model; a "deepspeed"
		 * section's own precision would say 16-bit weights ("auto" follows the Trainer's
		 * and means autocast here) */
		const char *ta_key = ta->fp16 ? "fp16" : "bf16";
		const char *own = ds->fp16 && !(ds->autos & AUTO_FP16) ? "fp16" :
				  ds->bf16 && !(ds->autos & AUTO_BF16) ? "bf16" : NULL;
		if (own)
			return px_fail(err, PX_ERR_INPUT, "%s: deepspeed.%s.enabled is true beside "
				       "training_args.%s (%s) without DeepSpeed (framework \"pytorch\" or "
				       "\"fsdp\"): the Trainer's "
				       "%s without DeepSpeed is torch autocast over fp32 weights, "
				       "DeepSpeed's 16-bit weights; expected one of them (leave the "
				       "deepspeed section's %s out, or \"auto\", for autocast)",
				       ds->source, own, ta_key, ta->precision_where, ta_key, own);
		ds->fp16 = ds->bf16 = 0;
		ds->autocast = ta->fp16 ? DT_FP16 : DT_BF16;
	}
	if (ds->fp16 && ds->bf16)
		return px_fail(err, PX_ERR_INPUT, "%s: fp16 and bf16 are both enabled; DeepSpeed "
			       "refuses: bfloat16 and fp16 modes cannot be simultaneously enabled",
			       ds->source);
	ds->dtype = ds->fp16 ? DT_FP16 : ds->bf16 ? DT_BF16 : DT_FP32;
	/* engine.py get_data_types: bf16 without ZeRO accumulates in fp32 (BF16_Optimizer) */
	if (!ds->grad_dtype_set)
		ds->grad_dtype = ds->dtype == DT_BF16 && ds->zero.stage == 0 ? DT_FP32 : ds->dtype;
	/* engine.py communication_data_type: the model's dtype */
	if (!ds->comm_dtype_set)
		ds->comm_dtype = ds->dtype;
	return 0;
}

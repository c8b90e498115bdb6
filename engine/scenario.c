#include "scenario.h"

#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "family.h"
#include "fsdp_wrap.h"

static const char *const SECTION_KEYS[SC_N_DOCS] = {"", "model", "deepspeed", "cluster"};

/* ---- sections ---- */

/* Check the section named key: an inline object, or a path relative to the scenario's folder,
 * whose file it loads into sc->docs[idx]. */
static int load_section(Scenario *sc, int idx, PxError *err)
{
	const JsonDoc *top = &sc->docs[SC_DOC_SCENARIO];
	const char *key = SECTION_KEYS[idx];
	cJSON *v = cJSON_GetObjectItemCaseSensitive(top->root, key);
	char where[512];

	if (!v) {
		if (idx == SC_DOC_DEEPSPEED) { /* an empty config is DeepSpeed's default */
			v = cJSON_AddObjectToObject(top->root, key);
		} else {
			return px_fail(err, PX_ERR_INPUT, "%s: %s: missing; expected an object or the "
				       "path of a JSON file", top->path, key);
		}
	}
	if (cJSON_IsObject(v))
		return 0;
	if (!cJSON_IsString(v)) {
		JsonObj root;
		jobj_make(&root, top, top->root, "", "", &sc->ov);
		jobj_where(&root, key, where, sizeof(where));
		return px_fail(err, PX_ERR_INPUT, "%s: %s: expected an object or the path of a JSON "
			       "file", where, key);
	}
	char dir_buf[1024], file[2048];
	snprintf(dir_buf, sizeof(dir_buf), "%s", top->path);
	const char *dir = dirname(dir_buf);
	if (v->valuestring[0] == '/')
		snprintf(file, sizeof(file), "%s", v->valuestring);
	else
		snprintf(file, sizeof(file), "%s/%s", dir, v->valuestring);
	if (jdoc_load_file(&sc->docs[idx], file, err))
		return -1;
	if (!cJSON_IsObject(sc->docs[idx].root))
		return px_fail(err, PX_ERR_INPUT, "%s: expected a JSON object for the %s section", file,
			       key);
	return 0;
}

/* The section idx as an object: its own document's root (a file, or a whole-section --set), or
 * the object inline in the scenario. */
static cJSON *section_root(Scenario *sc, int idx)
{
	if (sc->docs[idx].root)
		return sc->docs[idx].root;
	return cJSON_GetObjectItemCaseSensitive(sc->docs[SC_DOC_SCENARIO].root, SECTION_KEYS[idx]);
}

/* --set SECTION=VALUE: an inline object ("{...}", named "--set SECTION" in messages) or the path of
 * a JSON file as typed, relative to the current directory like any path on a command line. It
 * becomes the section's own document, replacing the one read before; the scenario's text is left
 * as it was, so nothing read from it is freed. */
static int replace_section(Scenario *sc, int idx, const JsonOverride *o, PxError *err)
{
	const char *v = o->value + strspn(o->value, " \t\r\n");
	cJSON *parsed = NULL;
	JsonDoc d;
	char name[300];

	if (v[0] == '{') {
		/* malformed text is placed in the argument: "--set model:1:14: malformed JSON" */
		snprintf(name, sizeof(name), "--set %s", o->key);
		if (jdoc_parse(&d, name, o->value, err))
			return -1;
	} else {
		/* a quoted path ("m.json", as a sweep's values are written) or one as typed */
		parsed = cJSON_ParseWithOpts(o->value, NULL, 1);
		if ((parsed && !cJSON_IsString(parsed)) || !v[0]) {
			cJSON_Delete(parsed);
			return px_fail(err, PX_ERR_INPUT, "--set %s=%s: expected an object or the path of a "
				       "JSON file", o->key, o->value);
		}
		const char *path = parsed ? parsed->valuestring : o->value;
		int rc = jdoc_load_file(&d, path, err);
		if (rc == 0 && !cJSON_IsObject(d.root)) {
			rc = px_fail(err, PX_ERR_INPUT, "%s: expected a JSON object for the %s section",
				     path, o->key);
			jdoc_free(&d);
		}
		cJSON_Delete(parsed);
		if (rc) {
			char why[sizeof(err->msg)];
			snprintf(why, sizeof(why), "%s", err->msg);
			return px_fail(err, err->code, "--set %s=%s: %s", o->key, o->value, why);
		}
	}
	jdoc_free(&sc->docs[idx]);
	sc->docs[idx] = d;
	return 0;
}

/* Apply each --set in order: a whole section (model=..., deepspeed=..., cluster=...) is replaced,
 * a key inside one is set in the section as it is at that point, and anything else is set in the
 * scenario's own keys. */
static int apply_overrides(Scenario *sc, PxError *err)
{
	for (int i = 0; i < sc->ov.n; i++) {
		const char *key = sc->ov.v[i].key;
		int idx = SC_DOC_SCENARIO;
		for (int s = SC_DOC_MODEL; s < SC_N_DOCS; s++) {
			size_t n = strlen(SECTION_KEYS[s]);
			if (!strncmp(key, SECTION_KEYS[s], n) && (key[n] == '.' || !key[n])) {
				idx = s;
				key += key[n] ? n + 1 : n;
				break;
			}
		}
		if (idx != SC_DOC_SCENARIO && !key[0]) {
			if (replace_section(sc, idx, &sc->ov.v[i], err))
				return -1;
			continue;
		}
		cJSON *root = idx == SC_DOC_SCENARIO ? sc->docs[SC_DOC_SCENARIO].root :
						       section_root(sc, idx);
		if (jdoc_set_path(root, key, sc->ov.v[i].value, err)) {
			/* jdoc names the path inside the section; name the argument as typed */
			const char *why = strstr(err->msg, ": ");
			char reason[sizeof(err->msg)];
			snprintf(reason, sizeof(reason), "%s", why ? why + 2 : err->msg);
			return px_fail(err, PX_ERR_INPUT, "--set %s=%s: %s", sc->ov.v[i].key,
				       sc->ov.v[i].value, reason);
		}
	}
	return 0;
}

/* ---- the scenario's own keys ---- */

static const char *const FRAMEWORKS[] = {"deepspeed", "pytorch", "fsdp", NULL}; /* Framework order */
static const char *const FSDP_SHARDINGS[] = {"FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD",
					     "_HYBRID_SHARD_ZERO2", NULL};
static const char *const FSDP_PREFETCHES[] = {"BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH", NULL};
static const char *const FSDP_WRAPS[] = {"TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP",
					 NULL}; /* FsdpWrapPolicy order */

const char *scenario_fsdp_sharding_name(FsdpSharding s)
{
	return FSDP_SHARDINGS[s];
}

int scenario_fsdp_reshards(FsdpSharding s)
{
	return s == FSDP_FULL_SHARD || s == FSDP_HYBRID_SHARD;
}

int scenario_fsdp_hybrid(FsdpSharding s)
{
	return s == FSDP_HYBRID_SHARD || s == FSDP_HYBRID_SHARD_ZERO2;
}

const char *scenario_fsdp_prefetch_name(FsdpPrefetch b)
{
	return FSDP_PREFETCHES[b];
}

const char *scenario_fsdp_wrap_name(FsdpWrapPolicy w)
{
	return FSDP_WRAPS[w];
}

/* FSDP2 (fsdp.version 2, torch's fully_shard): reshard_after_forward true (FULL_SHARD's
 * behaviour, the default), false (SHARD_GRAD_OP's) or an int of ranks to keep a unit's
 * parameters over between its forward and its backward (FsdpSpec.post_forward). A hybrid
 * sharding_strategy is FSDP2's 2-D device mesh, not modelled; FSDP1's prefetch options do not
 * apply (fully_shard prefetches one unit ahead, forward and backward, as their defaults do). */
static int parse_fsdp2(Scenario *sc, const JsonObj *o, FsdpSpec *f, PxError *err)
{
	static const char *const v1_only[] = {"backward_prefetch", "forward_prefetch",
					      "limit_all_gathers", NULL};
	char where[512];
	long long version;
	if (jobj_int(o, "version", 1, 2, 1, &version, err) < 0)
		return -1;
	f->version = (int)version;
	const cJSON *raf = cJSON_GetObjectItemCaseSensitive(o->obj, "reshard_after_forward");
	if (cJSON_IsNull(raf)) /* null: as if left out */
		raf = NULL;
	jobj_where(o, raf ? "reshard_after_forward" : "version", where, sizeof(where));
	if (raf && f->version == 1)
		return px_fail(err, PX_ERR_INPUT, "%s: fsdp.reshard_after_forward: FSDP2's (fully_shard); "
			       "with version 1 use sharding_strategy (FULL_SHARD or SHARD_GRAD_OP), or "
			       "set \"version\": 2", where);
	if (f->version == 1)
		return 0;
	if (scenario_fsdp_hybrid(f->sharding))
		return px_fail(err, PX_ERR_INPUT, "%s: fsdp.sharding_strategy: %s with version 2: "
			       "FSDP2 shards hybrid over a 2-D device mesh, not modelled; expected "
			       "FULL_SHARD or SHARD_GRAD_OP (or reshard_after_forward)", where,
			       scenario_fsdp_sharding_name(f->sharding));
	const cJSON *ss = cJSON_GetObjectItemCaseSensitive(o->obj, "sharding_strategy");
	if (raf && ss && !cJSON_IsNull(ss))
		return px_fail(err, PX_ERR_INPUT, "%s: fsdp.reshard_after_forward: given beside "
			       "sharding_strategy; expected one (FSDP2 takes reshard_after_forward: "
			       "FULL_SHARD's true, SHARD_GRAD_OP's false)", where);
	if (cJSON_IsBool(raf)) {
		f->sharding = cJSON_IsTrue(raf) ? FSDP_FULL_SHARD : FSDP_SHARD_GRAD_OP;
	} else if (cJSON_IsNumber(raf) && raf->valuedouble == (double)(long long)raf->valuedouble &&
		   raf->valuedouble >= 2 && raf->valuedouble <= 1 << 20) {
		f->sharding = FSDP_FULL_SHARD;
		f->post_forward = (long long)raf->valuedouble;
	} else if (raf) {
		return px_fail(err, PX_ERR_INPUT, "%s: fsdp.reshard_after_forward: expected true, "
			       "false or a whole number of ranks of at least 2 (fully_shard's bool or "
			       "int)", where);
	}
	for (int i = 0; v1_only[i]; i++) {
		const cJSON *k = cJSON_GetObjectItemCaseSensitive(o->obj, v1_only[i]);
		if (!k || cJSON_IsNull(k))
			continue;
		jobj_where(o, v1_only[i], where, sizeof(where));
		if (px_notes_warn(&sc->notes, "%s: warning: fsdp.%s: FSDP1's, ignored; fully_shard "
				  "(version 2) prefetches one unit ahead, forward and backward", where,
				  v1_only[i]))
			return px_fail(err, PX_ERR_RUNTIME, "out of memory");
	}
	f->backward_prefetch = FSDP_BACKWARD_PRE, f->forward_prefetch = 0, f->limit_all_gathers = 1;
	return 0;
}

/* The scenario's "fsdp" object (framework "fsdp"; FsdpSpec). NO_SHARD is refused by name: it
 * holds what DistributedDataParallel does (framework "pytorch"). Beside
 * another framework the object is ignored with a warning (a scenario compared across them). */
static int parse_fsdp(Scenario *sc, const JsonObj *top, PxError *err)
{
	static const char *const known[] = {"sharding_strategy", "backward_prefetch",
					    "forward_prefetch", "limit_all_gathers", "sync_each_batch",
					    "offload_params", "use_orig_params", "auto_wrap_policy",
					    "transformer_layer_cls_to_wrap", "min_num_params", "version",
					    "reshard_after_forward", NULL};
	FsdpSpec *f = &sc->fsdp;
	JsonObj o;
	const char *strategy;
	int rc = jobj_child(top, "fsdp", &o, err), v;
	*f = (FsdpSpec){.sharding = FSDP_FULL_SHARD, .backward_prefetch = FSDP_BACKWARD_PRE,
			.limit_all_gathers = 1, .version = 1, .wrap = FSDP_WRAP_TRANSFORMER,
			.min_num_params = 1e8};
	if (rc < 0)
		return -1;
	if (rc && sc->framework != FRAMEWORK_FSDP) { /* a scenario priced under another framework */
		char where[512];
		jobj_where(top, "fsdp", where, sizeof(where));
		if (px_notes_warn(&sc->notes, "%s: warning: fsdp: FSDP's options are ignored with "
				  "framework \"%s\"", where, scenario_framework_name(sc->framework)))
			return px_fail(err, PX_ERR_RUNTIME, "out of memory");
		return 0;
	}
	if (!rc)
		return 0;
	if (jobj_check_keys(&o, known, &sc->notes))
		return px_fail(err, PX_ERR_RUNTIME, "out of memory");
	if (jobj_str(&o, "sharding_strategy", "FULL_SHARD", &strategy, err) < 0)
		return -1;
	char where[512];
	jobj_where(&o, "sharding_strategy", where, sizeof(where));
	if (!strcasecmp(strategy, "NO_SHARD"))
		return px_fail(err, PX_ERR_INPUT, "%s: fsdp.sharding_strategy: %s is not modelled; "
			       "expected FULL_SHARD, SHARD_GRAD_OP, HYBRID_SHARD or _HYBRID_SHARD_ZERO2 "
			       "(NO_SHARD holds what DistributedDataParallel does: framework "
			       "\"pytorch\")", where, strategy);
	int found = 0;
	for (int i = 0; FSDP_SHARDINGS[i]; i++)
		if (!strcasecmp(strategy, FSDP_SHARDINGS[i]))
			f->sharding = (FsdpSharding)i, found = 1;
	if (!found)
		return px_fail(err, PX_ERR_INPUT, "%s: fsdp.sharding_strategy: expected FULL_SHARD, "
			       "SHARD_GRAD_OP, HYBRID_SHARD or _HYBRID_SHARD_ZERO2, got \"%s\"", where,
			       strategy);
	if (jobj_choice(&o, "backward_prefetch", FSDP_PREFETCHES, FSDP_BACKWARD_PRE, &v, err) < 0 ||
	    jobj_bool(&o, "forward_prefetch", 0, &f->forward_prefetch, err) < 0 ||
	    jobj_bool(&o, "limit_all_gathers", 1, &f->limit_all_gathers, err) < 0 ||
	    jobj_bool(&o, "sync_each_batch", 0, &f->sync_each_batch, err) < 0 ||
	    jobj_bool(&o, "offload_params", 0, &f->offload_params, err) < 0)
		return -1;
	f->backward_prefetch = (FsdpPrefetch)v;
	if (parse_fsdp2(sc, &o, f, err))
		return -1;
	if (jobj_choice(&o, "auto_wrap_policy", FSDP_WRAPS, FSDP_WRAP_TRANSFORMER, &v, err) < 0 ||
	    jobj_num(&o, "min_num_params", 0, 1e15, 1e8, &f->min_num_params, err) < 0)
		return -1;
	f->wrap = (FsdpWrapPolicy)v;
	if (f->wrap != FSDP_WRAP_SIZE && cJSON_GetObjectItemCaseSensitive(o.obj, "min_num_params")) {
		jobj_where(&o, "min_num_params", where, sizeof(where));
		if (px_notes_warn(&sc->notes, "%s: warning: fsdp.min_num_params: read by "
				  "auto_wrap_policy SIZE_BASED_WRAP only, ignored", where))
			return px_fail(err, PX_ERR_RUNTIME, "out of memory");
	}
	if (!f->limit_all_gathers && !f->forward_prefetch &&
	    px_notes_not_modelled(&sc->notes, "fsdp.limit_all_gathers false: the host may gather "
				  "many units ahead of the device; priced as one ahead"))
		return px_fail(err, PX_ERR_RUNTIME, "out of memory");
	return 0;
}

const char *scenario_framework_name(Framework f)
{
	return FRAMEWORKS[f];
}

static const char *const MODEL_CODES[] = {"megatron", "huggingface", NULL}; /* ModelCode order */

const char *scenario_model_code_name(ModelCode c)
{
	return MODEL_CODES[c];
}

static int parse_top(Scenario *sc, const JsonObj *top, PxError *err)
{
	static const char *const known[] = {"name", "description", "model", "deepspeed", "cluster",
					    "seq_length", "activation_checkpointing",
					    "training_args", "parallelism", "moe", "backend",
					    "attention", "decoder_seq_length", "framework", "model_code",
					    "architecture", "pytorch_cuda_alloc_conf", "fsdp", NULL};
	static const char *const attentions[] = {"eager", "flash", NULL}; /* AttnImpl order */
	const char *name, *ckpt, *backend;
	int attn, fw, code;
	JsonObj ta;
	int rc;

	if (jobj_check_keys(top, known, &sc->notes))
		return px_fail(err, PX_ERR_RUNTIME, "out of memory");
	char stem[1024];
	snprintf(stem, sizeof(stem), "%s", sc->path);
	char *base = basename(stem), *dot = strrchr(base, '.');
	if (dot)
		*dot = '\0';
	if (jobj_str(top, "name", base, &name, err) < 0 ||
	    jobj_str(top, "backend", "gpu", &backend, err) < 0)
		return -1;
	if (!strcmp(backend, "gpu") || !strcmp(backend, "cpu") || !strcmp(backend, "cuda")) {
		sc->backend = backend[0] == 'g' ? BACKEND_GPU : backend[1] == 'p' ? BACKEND_CPU :
			      BACKEND_CUDA;
	} else {
		char where[512];
		jobj_where(top, "backend", where, sizeof(where));
		return px_fail(err, PX_ERR_INPUT, "%s: backend: expected gpu, cpu or cuda, got \"%s\"",
			       where, backend);
	}
	snprintf(sc->name, sizeof(sc->name), "%s", name);

	train_args_defaults(&sc->train_args);
	if ((rc = jobj_child(top, "training_args", &ta, err)) < 0)
		return -1;
	if (rc && train_args_parse(&ta, &sc->train_args, &sc->notes, err))
		return -1;

	/* "full" when asked for, by the scenario or by the Trainer's gradient_checkpointing */
	const char *dflt = sc->train_args.gradient_checkpointing ? "full" : "none";
	if (jobj_str(top, "activation_checkpointing", dflt, &ckpt, err) < 0)
		return -1;
	if (!strcmp(ckpt, "none"))
		sc->ckpt = CKPT_NONE;
	else if (!strcmp(ckpt, "full"))
		sc->ckpt = CKPT_FULL;
	else if (!strcmp(ckpt, "selective"))
		sc->ckpt = CKPT_SELECTIVE;
	else {
		char where[512];
		jobj_where(top, "activation_checkpointing", where, sizeof(where));
		return px_fail(err, PX_ERR_INPUT, "%s: activation_checkpointing: expected none, full "
			       "or selective, got \"%s\"", where, ckpt);
	}

	if (jobj_choice(top, "attention", attentions, ATTN_EAGER, &attn, err) < 0)
		return -1;
	sc->attention = (AttnImpl)attn;
	if (jobj_choice(top, "framework", FRAMEWORKS, FRAMEWORK_DEEPSPEED, &fw, err) < 0)
		return -1;
	sc->framework = (Framework)fw;
	/* FSDP's MixedPrecision runs under the Trainer's autocast too (plan.c fsdp_plan) */
	sc->train_args.autocast = sc->framework != FRAMEWORK_DEEPSPEED &&
				  (sc->train_args.fp16 || sc->train_args.bf16);
	if (parse_fsdp(sc, top, err))
		return -1;
	if (jobj_choice(top, "model_code", MODEL_CODES, MODEL_CODE_MEGATRON, &code, err) < 0)
		return -1;
	sc->model_code = (ModelCode)code;
	const char *conf;
	int rc_conf = jobj_str(top, "pytorch_cuda_alloc_conf", "", &conf, err);
	if (rc_conf < 0)
		return -1;
	sc->alloc_conf = (AllocConf){0}; /* PyTorch's defaults unless the key is given */
	if (rc_conf == 1) {
		char at[480], where[512];
		jobj_where(top, "pytorch_cuda_alloc_conf", at, sizeof(at));
		snprintf(where, sizeof(where), "%s: pytorch_cuda_alloc_conf", at);
		if (alloc_conf_parse(conf, where, &sc->alloc_conf, &sc->notes, err))
			return -1;
	}

	return 0;
}

/* One degree from two places (the scenario's "parallelism" and DeepSpeed's own key): they must
 * agree when both are given. */
static int merge_degree(long long *deg, long long from_ds, const char *ds_where, const char *ds_key,
			int scenario_set, const char *name, PxError *err)
{
	if (!from_ds)
		return 0;
	if (scenario_set && *deg != from_ds)
		return px_fail(err, PX_ERR_INPUT, "%s: %s = %lld disagrees with parallelism.%s = %lld",
			       ds_where, ds_key, from_ds, name, *deg);
	*deg = from_ds;
	return 0;
}

/* parallelism (scenario), DeepSpeed's tensor_parallel/pipeline keys, and MoE from the model
 * config (Mixtral) or the scenario's "moe" object (DeepSpeed MoE layer arguments). */
static int parse_parallel(Scenario *sc, const JsonObj *top, PxError *err)
{
	ParallelSpec *p = &sc->par;
	JsonObj par, moe;
	int rc;

	parallel_defaults(p);
	if (sc->ds.pipeline_partition) {
		static const char *const names[] = {"uniform", "parameters", "type:transformer"};
		int found = 0;
		for (int i = 0; i < 3; i++)
			if (!strcmp(sc->ds.pipeline_partition, names[i]))
				p->partition = (PartitionMethod)i, found = 1;
		if (!found)
			return px_fail(err, PX_ERR_INPUT, "%s: deepspeed.pipeline.partition: expected "
				       "uniform, parameters or type:transformer, got \"%s\"",
				       sc->ds.source, sc->ds.pipeline_partition);
	}
	if ((rc = jobj_child(top, "parallelism", &par, err)) < 0 || parallel_parse(&par, p,
										 &sc->notes, err))
		return -1;
	int tp_set = rc && cJSON_HasObjectItem(par.obj, "tp");
	int pp_set = rc && cJSON_HasObjectItem(par.obj, "pp");
	if (merge_degree(&p->tp, sc->ds.autotp_size, sc->ds.tp_where,
			 "deepspeed.tensor_parallel.autotp_size", tp_set, "tp", err) ||
	    merge_degree(&p->pp, sc->ds.pipeline_stages, sc->ds.pp_where, "deepspeed.pipeline.stages",
			 pp_set, "pp", err))
		return -1;
	const ModelSpec *m = &sc->model;
	if (sc->ds.autotp_size > 1 && !tp_set && model_known(m) &&
	    (m->a % p->tp || m->kv_heads % p->tp)) {
		p->tp_uneven_heads = 1;
		if (px_notes_not_modelled(&sc->notes, "deepspeed.tensor_parallel.autotp_size %lld "
					  "spreads the %lld heads (%lld key/value) unevenly: every rank "
					  "is priced with an even share", p->tp, m->a, m->kv_heads))
			return px_fail(err, PX_ERR_RUNTIME, "out of memory");
	}

	/* MoE: the model's own experts first, then the scenario's "moe" object */
	long long own_experts = sc->model.experts;
	p->moe.experts = sc->model.experts;
	if (sc->model.experts) {
		p->moe.k = sc->model.top_k;
		p->moe.interval = sc->model.moe_interval; /* Qwen2-MoE's decoder_sparse_step */
	}
	if ((rc = jobj_child(top, "moe", &moe, err)) < 0 ||
	    parallel_parse_moe(&moe, &p->moe, &sc->notes, err))
		return -1;
	long long ep_size = 0;
	if (rc && jobj_int(&moe, "ep_size", 1, 1 << 20, 0, &ep_size, err) < 0)
		return -1;
	if (ep_size) {
		char where[512];
		jobj_where(&moe, "ep_size", where, sizeof(where));
		int ep_set = par.obj && cJSON_HasObjectItem(par.obj, "ep");
		if (merge_degree(&p->ep, ep_size, where, "moe.ep_size", ep_set, "ep", err))
			return -1;
	}
	/* Megatron's _vocab_size_with_padding: the embedding and the head hold the vocabulary
	 * rounded up to a multiple of make_vocab_size_divisible_by x tp rows (the padded rows are
	 * never a token, but take part in the softmax) */
	if (p->vocab_divisible && model_known(&sc->model)) {
		long long mult = p->vocab_divisible * p->tp, V = sc->model.vocab_size;
		sc->model.V = (V + mult - 1) / mult * mult;
		sc->model.n_params = model_count_params(&sc->model);
	}
	if (p->moe.experts && !model_known(&sc->model))
		return px_fail(err, PX_ERR_INPUT, "%s: moe needs a model architecture; the model gives "
			       "only num_parameters", sc->path);
	sc->model.experts = p->moe.experts;
	sc->model.top_k = p->moe.k;
	sc->model.moe_interval = p->moe.interval;
	sc->model.ds_gate = !own_experts && sc->model.experts > 0;
	if (sc->model.experts)
		sc->model.n_params = model_count_params(&sc->model);
	return 0;
}

/* seq_length is the tokens of each sequence (an encoder-decoder's encoder's input);
 * decoder_seq_length an encoder-decoder's decoder's, seq_length when not given. */
static int parse_seq(Scenario *sc, const JsonObj *top, PxError *err)
{
	const ModelSpec *m = &sc->model;
	long long dflt = model_known(m) ? m->max_pos : 2048;
	int rc = jobj_int(top, "seq_length", 1, 1 << 24, dflt, &sc->seq, err);
	if (rc < 0)
		return -1;
	if (rc == 0 && model_known(m))
		px_notes_warn(&sc->notes, "%s: seq_length not given: using the model's %lld positions",
			      sc->path, sc->seq);
	rc = jobj_int(top, "decoder_seq_length", 1, 1 << 24, sc->seq, &sc->seq_dec, err);
	if (rc < 0)
		return -1;
	if (rc == 1 && !(model_known(m) && m->lay.L_enc)) {
		char where[512];
		jobj_where(top, "decoder_seq_length", where, sizeof(where));
		px_notes_warn(&sc->notes, "%s: warning: decoder_seq_length applies to an "
			      "encoder-decoder model (t5); the %s model reads seq_length only", where,
			      m->type);
	}
	if (m->lay.pos == POS_LEARNED && model_known(m) && sc->seq > m->max_pos) {
		char where[512];
		jobj_where(top, "seq_length", where, sizeof(where));
		return px_fail(err, PX_ERR_INPUT, "%s: seq_length: %lld is longer than the model's "
			       "%lld learned positions", where, sc->seq, sc->model.max_pos);
	}
	return 0;
}

/* deepspeed.sparse_attention against the rest of the scenario: DeepSpeed's own attention (not the
 * executor's, not FlashAttention) and a sequence its layout fits; then the layout's blocks per
 * head. A model without heads or an encoder-decoder is priced dense, with a note. */
static int parse_sparse(Scenario *sc, const JsonObj *ds, PxError *err)
{
	const SparseAttn *sa = &sc->ds.sparse;
	const ModelSpec *m = &sc->model;
	JsonObj o;
	const char *key = "mode", *what = NULL;
	char why[256], where[512];
	if (sa->mode == SPARSE_OFF)
		return 0;
	if (jobj_child(ds, "sparse_attention", &o, err) < 0)
		return -1;
	if (!model_known(m) || m->lay.L_enc) {
		/* DeepSpeed applies the section only where the model's code builds its
		 * SparseSelfAttention from it; these are priced with dense attention, and say so */
		sc->ds.sparse.mode = SPARSE_OFF;
		if (px_notes_not_modelled(&sc->notes, "deepspeed.sparse_attention (on %s: attention "
					  "priced dense)", !model_known(m) ? "a model given only "
					  "num_parameters" : "an encoder-decoder"))
			return px_fail(err, PX_ERR_RUNTIME, "out of memory");
		return 0;
	}
	if (sc->attention == ATTN_FLASH)
		what = "replaces the attention kernel: remove \"attention\": \"flash\" from the "
		       "scenario";
	if (what) {
		jobj_where(ds, "sparse_attention", where, sizeof(where));
		return px_fail(err, PX_ERR_INPUT, "%s: %s.sparse_attention %s", where, ds->name, what);
	}
	if (sparse_attn_check_seq(sa, sc->seq, &key, why, sizeof(why))) {
		jobj_where(&o, key, where, sizeof(where));
		return px_fail(err, PX_ERR_INPUT, "%s: %s.%s: %s (seq_length %lld)", where, o.name,
			       key, why, sc->seq);
	}
	double blocks, pairs;
	if (sparse_layout_count(sa, m->a, sc->seq, &blocks, &pairs, err))
		return -1;
	sc->sparse_blocks = blocks / (double)m->a;
	sc->sparse_causal_pairs = pairs / (double)m->a;
	return 0;
}

static int copy_overrides(Scenario *sc, const JsonOverrides *ov, PxError *err)
{
	for (int i = 0; ov && i < ov->n; i++)
		if (jov_add_kv(&sc->ov, ov->v[i].key, ov->v[i].value, err))
			return -1;
	return 0;
}

/* "architecture": the Hugging Face class the training script builds, where it is not the
 * config's architectures[0] (AutoModelForSequenceClassification over bert-base-uncased, whose
 * config names BertForMaskedLM): the head the model is priced with. */
static int parse_architecture(Scenario *sc, const JsonObj *top, PxError *err)
{
	const char *arch;
	int rc = jobj_str(top, "architecture", NULL, &arch, err);
	if (rc <= 0)
		return rc;
	char where[512];
	jobj_where(top, "architecture", where, sizeof(where));
	if (family_set_architecture(&sc->model, arch, where, err))
		return -1;
	sc->model.n_params = model_count_params(&sc->model);
	return 0;
}

/* The sections as objects: a section's own document (a file, or a whole-section --set), or the
 * object inline in the scenario. After the overrides, which may replace a section's document. */
static void bind_sections(Scenario *sc, JsonObj sect[SC_N_DOCS])
{
	const JsonDoc *top = &sc->docs[SC_DOC_SCENARIO];
	for (int i = SC_DOC_MODEL; i < SC_N_DOCS; i++) {
		const char *key = SECTION_KEYS[i];
		if (sc->docs[i].root)
			jobj_make(&sect[i], &sc->docs[i], sc->docs[i].root, "", key, &sc->ov);
		else
			jobj_make(&sect[i], top, section_root(sc, i), key, key, &sc->ov);
	}
}

/* What the pricing of SIZE_BASED_WRAP leaves out (plan.c plan_fsdp_wrap): a layer whose
 * modules make several units is gathered whole at the layer, and units outside the layers (the
 * model's own, where its embeddings, final norm and what the layers leave reach min_num_params;
 * an embedding or head module that large) are taken for the root. */
static int fsdp_wrap_notes(Scenario *sc, PxError *err)
{
	const ModelSpec *m = &sc->model;
	const FsdpSpec *f = &sc->fsdp;
	if (sc->framework != FRAMEWORK_FSDP || f->wrap != FSDP_WRAP_SIZE || !model_known(m))
		return 0;
	int n = model_n_units(m), pieces = 0;
	double outer = (double)model_unit_params(m, 0);
	FsdpWrap w = {0};
	for (int u = 1; u < n - 1; u++) {
		if ((u == 1 || model_unit_kind(m, u) != model_unit_kind(m, u - 1)) &&
		    fsdp_wrap_size_based(m, u, f->min_num_params, &w))
			return px_fail(err, PX_ERR_RUNTIME, "%s: unit %d: more tensors than the "
				       "auto-wrap walk holds", sc->path, u);
		pieces = w.pieces > pieces ? w.pieces : pieces;
		outer += (double)w.leftover;
	}
	if (pieces > 1 && px_notes_not_modelled(&sc->notes, "fsdp.auto_wrap_policy SIZE_BASED_WRAP: "
						 "a layer's %d units (its modules of min_num_params "
						 "or more) priced as gathered together at the layer, "
						 "not one after another", pieces))
		return px_fail(err, PX_ERR_RUNTIME, "out of memory");
	double head = (double)model_unit_params(m, n - 1);
	if ((outer >= f->min_num_params || head >= f->min_num_params) &&
	    px_notes_not_modelled(&sc->notes, "fsdp.auto_wrap_policy SIZE_BASED_WRAP: the units "
				  "outside the layers (the model's own, of its embeddings, final norm "
				  "and what the layers leave, %.4g parameters; an embedding or head "
				  "module of min_num_params or more) priced as the root's, gathered "
				  "from the first forward to the end of the backward (FULL_SHARD frees "
				  "each between its forward and its backward)", outer))
		return px_fail(err, PX_ERR_RUNTIME, "out of memory");
	return 0;
}

/* Overrides, then every part read from the documents the scenario holds. */
static int finish_load(Scenario *sc, PxError *err)
{
	JsonObj top, sect[SC_N_DOCS];
	if (apply_overrides(sc, err))
		return -1;
	bind_sections(sc, sect);
	jobj_make(&top, &sc->docs[SC_DOC_SCENARIO], sc->docs[SC_DOC_SCENARIO].root, "", "",
		  &sc->ov);
	if (parse_top(sc, &top, err) ||
	    model_parse(&sect[SC_DOC_MODEL], &sc->model, &sc->notes, err) ||
	    parse_architecture(sc, &top, err) ||
	    dsconfig_parse(&sect[SC_DOC_DEEPSPEED], &sc->ds, &sc->notes, err) ||
	    dsconfig_resolve_schedule(&sc->ds, &sc->train_args, &sc->notes, err) ||
	    cluster_parse(&sect[SC_DOC_CLUSTER], &sc->cluster, &sc->notes, err) ||
	    parse_parallel(sc, &top, err) || parse_seq(sc, &top, err) ||
	    parse_sparse(sc, &sect[SC_DOC_DEEPSPEED], err) || fsdp_wrap_notes(sc, err))
		return -1;
	dsconfig_resolve_optimizer_impl(&sc->ds, &sc->train_args, &sc->notes);
	if (sc->backend != BACKEND_GPU && (sc->model.dropout || sc->model.attn_dropout)) {
		/* what the kernels do; activations counted without masks */
		sc->model.dropout = sc->model.attn_dropout = 0;
		px_notes_warn(&sc->notes, "%s: backend %s: the executor's kernels have no dropout; the "
			      "model's dropout is not applied", sc->path,
			      sc->backend == BACKEND_CPU ? "cpu" : "cuda");
	}
	if (sc->ds.ac_present && sc->ckpt == CKPT_NONE &&
	    (sc->ds.partition_activations || sc->ds.cpu_checkpointing))
		px_notes_warn(&sc->notes, "%s: deepspeed.activation_checkpointing has no effect: "
			      "the scenario does not checkpoint (set activation_checkpointing: full)",
			      sc->path);
	return 0;
}

/* An empty scenario for path, holding a copy of the overrides ov. */
static int begin(Scenario *sc, const char *path, const JsonOverrides *ov, PxError *err)
{
	memset(sc, 0, sizeof(*sc));
	px_notes_init(&sc->notes);
	jov_init(&sc->ov);
	snprintf(sc->path, sizeof(sc->path), "%s", path);
	return copy_overrides(sc, ov, err);
}

/* The scenario document from the file path, or from text (named path) when text is given. */
static int load_top(Scenario *sc, const char *path, const char *text, const JsonOverrides *ov,
		    PxError *err)
{
	if (begin(sc, path, ov, err))
		goto fail;
	if (text ? jdoc_parse(&sc->docs[SC_DOC_SCENARIO], path, text, err) :
		   jdoc_load_file(&sc->docs[SC_DOC_SCENARIO], path, err))
		goto fail;
	if (!cJSON_IsObject(sc->docs[SC_DOC_SCENARIO].root)) {
		px_fail(err, PX_ERR_INPUT, "%s: expected a JSON object with name, model, deepspeed, "
			"cluster and seq_length", path);
		goto fail;
	}
	for (int i = SC_DOC_MODEL; i < SC_N_DOCS; i++)
		if (load_section(sc, i, err))
			goto fail;
	if (finish_load(sc, err))
		goto fail;
	return 0;
fail:
	scenario_free(sc);
	return -1;
}

int scenario_load(Scenario *sc, const char *path, const JsonOverrides *ov, PxError *err)
{
	return load_top(sc, path, NULL, ov, err);
}

int scenario_load_text(Scenario *sc, const char *path, const char *text, const JsonOverrides *ov,
		       PxError *err)
{
	return load_top(sc, path, text, ov, err);
}

int scenario_derive(Scenario *sc, const Scenario *base, const JsonOverrides *ov, PxError *err)
{
	if (begin(sc, base->path, &base->ov, err) || copy_overrides(sc, ov, err))
		goto fail;
	for (int i = 0; i < SC_N_DOCS; i++) {
		const JsonDoc *d = &base->docs[i];
		if (!d->root)
			continue;
		sc->docs[i].path = strdup(d->path);
		sc->docs[i].text = strdup(d->text);
		sc->docs[i].root = cJSON_Duplicate(d->root, 1);
		if (!sc->docs[i].path || !sc->docs[i].text || !sc->docs[i].root) {
			px_fail(err, PX_ERR_RUNTIME, "out of memory");
			goto fail;
		}
	}
	if (finish_load(sc, err))
		goto fail;
	return 0;
fail:
	scenario_free(sc);
	return -1;
}

void scenario_free(Scenario *sc)
{
	if (!sc)
		return;
	for (int i = 0; i < SC_N_DOCS; i++)
		jdoc_free(&sc->docs[i]);
	jov_free(&sc->ov);
	px_notes_free(&sc->notes);
}

/* ---- resolved JSON ---- */

static cJSON *section_copy(const Scenario *sc, int idx)
{
	const cJSON *v = sc->docs[idx].root ?
		sc->docs[idx].root :
		cJSON_GetObjectItemCaseSensitive(sc->docs[SC_DOC_SCENARIO].root, SECTION_KEYS[idx]);
	return cJSON_Duplicate(v, 1);
}

char *scenario_resolved_json(const Scenario *sc, long long world, long long dp)
{
	cJSON *j = cJSON_Duplicate(sc->docs[SC_DOC_SCENARIO].root, 1);
	if (!j)
		return NULL;
	for (int i = SC_DOC_MODEL; i < SC_N_DOCS; i++)
		cJSON_ReplaceItemInObjectCaseSensitive(j, SECTION_KEYS[i], section_copy(sc, i));
	cJSON *r = cJSON_AddObjectToObject(j, "resolved");
	const DsConfig *ds = &sc->ds;
	cJSON_AddStringToObject(r, "name", sc->name);
	cJSON_AddStringToObject(r, "gpu", sc->cluster.gpu.name);
	cJSON_AddNumberToObject(r, "world_size", (double)world);
	cJSON_AddNumberToObject(r, "dp", (double)dp);
	cJSON_AddNumberToObject(r, "num_parameters", sc->model.n_params);
	if (sc->model.arch[0])
		cJSON_AddStringToObject(r, "architecture", sc->model.arch);
	if (sc->model.V != sc->model.vocab_size) /* Megatron's padded vocabulary */
		cJSON_AddNumberToObject(r, "padded_vocab_size", (double)sc->model.V);
	cJSON_AddNumberToObject(r, "seq_length", (double)sc->seq);
	cJSON_AddNumberToObject(r, "train_batch_size", (double)ds->train_batch);
	cJSON_AddNumberToObject(r, "train_micro_batch_size_per_gpu", (double)ds->micro_batch);
	cJSON_AddNumberToObject(r, "gradient_accumulation_steps", (double)ds->grad_accum);
	cJSON_AddStringToObject(r, "dtype", dtype_name(ds->dtype));
	cJSON_AddStringToObject(r, "optimizer", ds->optimizer);
	cJSON_AddStringToObject(r, "framework", scenario_framework_name(sc->framework));
	cJSON_AddStringToObject(r, "model_code", scenario_model_code_name(sc->model_code));
	cJSON_AddNumberToObject(r, "zero_stage", ds->zero.stage);
	cJSON_AddNumberToObject(r, "reduce_bucket_size", ds->zero.reduce_bucket_elems);
	cJSON_AddNumberToObject(r, "stage3_prefetch_bucket_size", ds->zero.prefetch_bucket_elems);
	cJSON_AddNumberToObject(r, "stage3_param_persistence_threshold",
				ds->zero.persistence_threshold_elems);
	static const char *const ck[] = {"none", "selective", "full"};
	cJSON_AddStringToObject(r, "activation_checkpointing", ck[sc->ckpt]);
	cJSON_AddStringToObject(r, "attention", sc->ds.sparse.mode != SPARSE_OFF ? "sparse" :
						sc->attention == ATTN_FLASH ? "flash" : "eager");
	if (sc->ds.sparse.mode != SPARSE_OFF) /* the layout's non-zero blocks per head */
		cJSON_AddNumberToObject(r, "sparse_blocks_per_head", sc->sparse_blocks);
	char *text = cJSON_PrintUnformatted(j);
	cJSON_Delete(j);
	return text;
}

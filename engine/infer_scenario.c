#include "infer_scenario.h"

#include <ctype.h>
#include <libgen.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const SECTION_KEYS[IS_N_DOCS] = {"", "model", "cluster"};

const char *infer_dtype_name(InferDtype d)
{
	static const char *const n[] = {"fp32", "fp16", "bf16", "int8"};
	return (unsigned)d < 4 ? n[d] : "?";
}

int infer_compute_bytes(InferDtype d)
{
	return d == IDT_FP32 ? 4 : 2;
}

static int fail_at(const JsonObj *o, const char *key, PxError *err, const char *what)
{
	char where[512];
	jobj_where(o, key, where, sizeof(where));
	return px_fail(err, PX_ERR_INPUT, "%s: %s%s%s: %s", where, o->name, o->name[0] ? "." : "",
		       key, what);
}

int infer_scenario_is(const char *path, PxError *err)
{
	JsonDoc d;
	if (jdoc_load_file(&d, path, err))
		return -1;
	int is = cJSON_IsObject(d.root) && cJSON_HasObjectItem(d.root, "inference");
	jdoc_free(&d);
	return is;
}

/* ---- sections and overrides ---- */

/* "model" or "cluster": an inline object, or a path relative to the scenario's folder. */
static int load_section(InferScenario *sc, int idx, PxError *err)
{
	const JsonDoc *top = &sc->docs[IS_DOC_SCENARIO];
	const char *key = SECTION_KEYS[idx];
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(top->root, key);
	if (!v)
		return px_fail(err, PX_ERR_INPUT, "%s: %s: missing; expected an object or the path of "
			       "a JSON file", top->path, key);
	if (cJSON_IsObject(v))
		return 0;
	if (!cJSON_IsString(v)) {
		JsonObj root;
		jobj_make(&root, top, top->root, "", "", &sc->ov);
		return fail_at(&root, key, err, "expected an object or the path of a JSON file");
	}
	char dir_buf[1024], file[2048];
	snprintf(dir_buf, sizeof(dir_buf), "%s", top->path);
	if (v->valuestring[0] == '/')
		snprintf(file, sizeof(file), "%s", v->valuestring);
	else
		snprintf(file, sizeof(file), "%s/%s", dirname(dir_buf), v->valuestring);
	if (jdoc_load_file(&sc->docs[idx], file, err))
		return -1;
	if (!cJSON_IsObject(sc->docs[idx].root))
		return px_fail(err, PX_ERR_INPUT, "%s: expected a JSON object for the %s section", file,
			       key);
	return 0;
}

static cJSON *section_root(const InferScenario *sc, int idx)
{
	if (sc->docs[idx].root)
		return sc->docs[idx].root;
	return cJSON_GetObjectItemCaseSensitive(sc->docs[IS_DOC_SCENARIO].root, SECTION_KEYS[idx]);
}

/* "model.KEY" and "cluster.KEY" go into that section (its file's document when it has one);
 * anything else ("inference.dtype", "workload.batch_size") into the scenario's own keys. */
static int apply_overrides(InferScenario *sc, PxError *err)
{
	for (int i = 0; i < sc->ov.n; i++) {
		const JsonOverride *o = &sc->ov.v[i];
		cJSON *root = sc->docs[IS_DOC_SCENARIO].root;
		const char *key = o->key;
		for (int s = IS_DOC_MODEL; s < IS_N_DOCS; s++) {
			size_t n = strlen(SECTION_KEYS[s]);
			if (!strncmp(key, SECTION_KEYS[s], n) && key[n] == '.') {
				root = section_root(sc, s);
				key += n + 1;
				break;
			}
		}
		if (!root || jdoc_set_path(root, key, o->value, err)) {
			const char *why = root ? strstr(err->msg, ": ") : NULL;
			char reason[sizeof(err->msg)];
			snprintf(reason, sizeof(reason), "%s", why ? why + 2 :
				 "the section it names is not an object");
			return px_fail(err, PX_ERR_INPUT, "--set %s=%s: %s", o->key, o->value, reason);
		}
	}
	return 0;
}

/* ---- the "inference" object: deepspeed/inference/config.py's keys ---- */

/* Read and checked, and what each does here: the keys of DeepSpeedInferenceConfig (and their
 * aliases) that change nothing this model prices, or that are listed as not modelled. */
static const char *const INFER_KEYS[] = {
	"tensor_parallel", "tp", "mp_size", "dtype", "replace_with_kernel_inject", "kernel_inject",
	"quant", "quantization_setting", "max_out_tokens", "max_tokens", "min_out_tokens",
	"min_tokens", "enable_cuda_graph", "use_triton", "triton_autotune", "zero",
	"triangular_masking", "tm", "moe", "checkpoint", "base_dir", "set_empty_params",
	"save_mp_checkpoint_path", "checkpoint_config", "ckpt_config", "return_tuple",
	"training_mp_size", "replace_method", "injection_policy", "injection_dict",
	"injection_policy_tuple", "config", "args", "transposed_mode", "mpu", "ep_size", "ep_group",
	"expert_group", "ep_mp_group", "expert_mp_group", "moe_experts", "moe_type",
	"tp_grain_size", NULL};
/* Set (not false, null or empty), these change time or memory in ways not modelled yet. */
static const char *const INFER_NOT_MODELLED[] = {"enable_cuda_graph", "use_triton", "zero",
						  "moe", "ep_size", "moe_experts", NULL};

static const JsonObj *first_of(const JsonObj *o, const char *a, const char *b, const char **key)
{
	*key = cJSON_HasObjectItem(o->obj, a) ? a : cJSON_HasObjectItem(o->obj, b) ? b : a;
	return o;
}

static int set_value(const cJSON *v)
{
	if (!v || cJSON_IsNull(v) || cJSON_IsFalse(v))
		return 0;
	if (cJSON_IsObject(v) || cJSON_IsArray(v))
		return cJSON_GetArraySize(v) > 0;
	if (cJSON_IsNumber(v))
		return v->valuedouble != 0 && !(v->valuedouble == 1 && v->string &&
						 !strcmp(v->string, "ep_size"));
	return 1;
}

static int parse_tp(const JsonObj *o, InferConfig *c, PxNotes *notes, PxError *err)
{
	JsonObj tp;
	const char *key;
	long long mp = 0, size = 0;
	int enabled = 1, rc;
	first_of(o, "tensor_parallel", "tp", &key);
	if ((rc = jobj_child(o, key, &tp, err)) < 0)
		return -1;
	if (rc) {
		static const char *const known[] = {"enabled", "tp_size", "mpu", "tp_group", NULL};
		if (jobj_check_keys(&tp, known, notes) < 0)
			return px_fail(err, PX_ERR_RUNTIME, "out of memory");
		if (jobj_bool(&tp, "enabled", 1, &enabled, err) < 0 ||
		    jobj_int(&tp, "tp_size", 1, 1 << 16, 0, &size, err) < 0)
			return -1;
	}
	if (jobj_int(o, "mp_size", 1, 1 << 16, 0, &mp, err) < 0)
		return -1;
	if (mp && size && mp != size) {
		char what[160];
		snprintf(what, sizeof(what), "%lld disagrees with %s.tp_size = %lld", mp, key, size);
		return fail_at(o, "mp_size", err, what);
	}
	c->tp = !enabled ? 1 : size ? size : mp ? mp : 1;
	return 0;
}

static int parse_dtype(const JsonObj *o, InferConfig *c, PxError *err)
{
	/* DtypeEnum's spellings, in InferDtype order */
	static const char *const names[][5] = {
		{"fp32", "float32", "float", "torch.float32", NULL},
		{"fp16", "float16", "half", "torch.float16", NULL},
		{"bf16", "bfloat16", "bfloat", "torch.bfloat16", NULL},
		{"int8", "torch.int8", NULL},
	};
	const char *s;
	if (jobj_str(o, "dtype", "fp16", &s, err) < 0)
		return -1;
	for (int d = 0; d < 4; d++)
		for (int k = 0; names[d][k]; k++)
			if (!strcmp(s, names[d][k])) {
				c->dtype = (InferDtype)d;
				return 0;
			}
	char what[200];
	snprintf(what, sizeof(what), "expected fp16, bf16, fp32 or int8 (or a torch name of one), "
		 "got \"%s\"", s);
	return fail_at(o, "dtype", err, what);
}

/* quantization_setting: groups, or [mlp_extra_grouping, groups] (init_inference's argument). */
static int parse_qsetting(const JsonObj *o, long long *groups, PxError *err)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o->obj, "quantization_setting");
	if (!v || cJSON_IsNull(v))
		return 0;
	if (cJSON_IsArray(v) && cJSON_GetArraySize(v) == 2)
		v = cJSON_GetArrayItem(v, 1);
	if (!cJSON_IsNumber(v) || v->valuedouble < 1 || v->valuedouble > 1 << 20 ||
	    v->valuedouble != (double)(long long)v->valuedouble)
		return fail_at(o, "quantization_setting", err, "expected a number of groups from 1, or "
			       "[mlp_extra_grouping, groups]");
	*groups = (long long)v->valuedouble;
	return 1;
}

/* quant.weight.quantized_initialization {num_bits, group_size, group_dim, symmetric} */
static int parse_groupwise(const JsonObj *w, InferConfig *c, PxError *err)
{
	JsonObj qi;
	int rc = jobj_child(w, "quantized_initialization", &qi, err), sym;
	long long bits, dim;
	if (rc <= 0 || !cJSON_GetArraySize(qi.obj))
		return rc;
	static const char *const known[] = {"num_bits", "group_size", "group_dim", "symmetric",
					    NULL};
	if (jobj_check_keys(&qi, known, NULL) < 0)
		return px_fail(err, PX_ERR_RUNTIME, "out of memory");
	if (jobj_int(&qi, "num_bits", 4, 8, 8, &bits, err) < 0 ||
	    jobj_int(&qi, "group_dim", 0, 1, 1, &dim, err) < 0 ||
	    jobj_bool(&qi, "symmetric", 0, &sym, err) < 0)
		return -1;
	if (bits != 4 && bits != 8)
		return fail_at(&qi, "num_bits", err, "expected 4 or 8 (DeepSpeed's weight "
			       "quantizer's only widths)");
	if (sym)
		return fail_at(&qi, "symmetric", err, "DeepSpeed's weight quantizer is asymmetric "
			       "only; expected false");
	if (jobj_int(&qi, "group_size", 1, 1LL << 30, 0, &c->group_elems, err) <= 0)
		return c->group_elems ? -1 : fail_at(&qi, "group_size", err, "missing; expected the "
						     "elements of each quantization group");
	c->quant = IQ_GROUPWISE;
	c->quant_bits = (int)bits;
	return 1;
}

static int parse_quant(const JsonObj *o, InferConfig *c, PxNotes *notes, PxError *err)
{
	JsonObj q, w;
	int rc, enabled = 1;
	memset(&w, 0, sizeof(w));
	jobj_make(&w, o->doc, o->obj, o->path, o->name, o->ov);
	long long bits = 8, groups = 1;
	c->q_groups = 1;
	if ((rc = jobj_child(o, "quant", &q, err)) < 0)
		return -1;
	if (rc) {
		static const char *const known[] = {"enabled", "activation", "weight", "qkv", NULL};
		if (jobj_check_keys(&q, known, notes) < 0 || jobj_bool(&q, "enabled", 1, &enabled, err) < 0)
			return -1;
		if ((rc = jobj_child(&q, "weight", &w, err)) < 0)
			return -1;
		if (rc && enabled) {
			static const char *const wk[] = {"enabled", "num_bits", "q_type", "q_groups",
							 "quantized_initialization",
							 "post_init_quant", NULL};
			if (jobj_check_keys(&w, wk, notes) < 0 ||
			    jobj_int(&w, "num_bits", 4, 8, 8, &bits, err) < 0 ||
			    jobj_int(&w, "q_groups", 1, 1 << 20, 1, &groups, err) < 0 ||
			    (rc = parse_groupwise(&w, c, err)) < 0)
				return -1;
			if (set_value(cJSON_GetObjectItemCaseSensitive(w.obj, "post_init_quant")) &&
			    px_notes_not_modelled(notes, "inference.quant.weight.post_init_quant "
						  "(per-layer settings not modelled yet)"))
				return px_fail(err, PX_ERR_RUNTIME, "out of memory");
		}
		JsonObj a;
		int a_on = 0;
		memset(&a, 0, sizeof(a));
		if (jobj_child(&q, "activation", &a, err) < 0)
			return -1;
		if (c->quant == IQ_GROUPWISE && a.obj && jobj_bool(&a, "enabled", 0, &a_on, err) < 0)
			return -1;
		if (a_on && px_notes_not_modelled(notes, "inference.quant.activation (activation "
						  "quantization not modelled yet)"))
			return px_fail(err, PX_ERR_RUNTIME, "out of memory");
	}
	long long qs = 0;
	if ((rc = parse_qsetting(o, &qs, err)) < 0)
		return -1;
	if (c->dtype == IDT_INT8) {
		if (c->quant == IQ_GROUPWISE)
			return fail_at(o, "dtype", err, "int8 and quant.weight.quantized_initialization "
				       "exclude each other: DeepSpeed quantizes fp16 or bf16 weights");
		if (bits != 8)
			return fail_at(&w, "num_bits", err, "dtype int8 takes 8 bits");
		if (!c->kernel_inject)
			return fail_at(o, "dtype", err, "int8 needs replace_with_kernel_inject: true "
				       "(DeepSpeed's int8 kernels)");
		c->quant = IQ_INT8_KERNEL;
		c->quant_bits = 8;
		c->q_groups = rc ? qs : groups;
	} else if (rc && px_notes_warn(notes, "%s: warning: inference.quantization_setting applies "
					"to dtype int8 only; ignored for %s", o->doc->path,
					infer_dtype_name(c->dtype))) {
		return px_fail(err, PX_ERR_RUNTIME, "out of memory");
	}
	return 0;
}

static int parse_inference(const JsonObj *o, InferConfig *c, PxNotes *notes, PxError *err)
{
	const char *key;
	memset(c, 0, sizeof(*c));
	if (jobj_check_keys(o, INFER_KEYS, notes) < 0)
		return px_fail(err, PX_ERR_RUNTIME, "out of memory");
	for (int i = 0; INFER_NOT_MODELLED[i]; i++)
		if (set_value(cJSON_GetObjectItemCaseSensitive(o->obj, INFER_NOT_MODELLED[i])) &&
		    px_notes_not_modelled(notes, "inference.%s (not modelled yet)",
					  INFER_NOT_MODELLED[i]))
			return px_fail(err, PX_ERR_RUNTIME, "out of memory");
	first_of(o, "replace_with_kernel_inject", "kernel_inject", &key);
	if (jobj_bool(o, key, 0, &c->kernel_inject, err) < 0)
		return -1;
	first_of(o, "max_out_tokens", "max_tokens", &key);
	if (jobj_int(o, key, 1, 1LL << 30, 1024, &c->max_out_tokens, err) < 0)
		return -1;
	return parse_tp(o, c, notes, err) || parse_dtype(o, c, err) || parse_quant(o, c, notes, err);
}

long long infer_prefix_found(long long prefix, long long tokens, long long block)
{
	long long most = prefix < tokens - 1 ? prefix : tokens - 1;
	return most / block * block;
}

double infer_shared_tokens(const InferWorkload *w, long long batch)
{
	if (!w->continuous || !w->prefix_caching)
		return 0;
	if (!w->trace.n)
		return w->cached_prefix;
	double b = batch > 2 ? (double)batch : 2, saved = 0;
	for (long long g = 0; g < w->n_prefix_groups; g++) {
		double f = w->prefix_share[g];
		saved += w->prefix_found[g] * (b * f - 1 + pow(1 - f, b));
	}
	return saved / (b - 1);
}

typedef struct IdFound {
	long long id;
	double found;
} IdFound;

static int cmp_id(const void *a, const void *b)
{
	long long x = ((const IdFound *)a)->id, y = ((const IdFound *)b)->id;
	return (x > y) - (x < y);
}

/* A trace's prefix ids (0 aside) into w: each one's share of the requests and the tokens its
 * requests find cached on average (infer_prefix_found). 0, or -1 out of memory. */
static int trace_groups(InferWorkload *w, PxError *err)
{
	long long n = w->trace.n, k = 0, g = 0;
	IdFound *v = malloc((size_t)n * sizeof(*v));
	if (!v)
		return px_fail(err, PX_ERR_RUNTIME, "out of memory");
	for (long long q = 0; q < n; q++) {
		const InferRequest *x = &w->trace.req[q];
		if (x->prefix_id)
			v[k++] = (IdFound){x->prefix_id, (double)infer_prefix_found(
				x->prefix_tokens, x->prompt_tokens, w->block)};
	}
	qsort(v, (size_t)k, sizeof(*v), cmp_id);
	for (long long i = 0; i < k; i++)
		g += !i || v[i].id != v[i - 1].id;
	w->prefix_share = calloc((size_t)g + 1, sizeof(*w->prefix_share));
	w->prefix_found = calloc((size_t)g + 1, sizeof(*w->prefix_found));
	if (!w->prefix_share || !w->prefix_found) {
		free(v);
		return px_fail(err, PX_ERR_RUNTIME, "out of memory");
	}
	for (long long i = 0, at = -1; i < k; i++) {
		at += !i || v[i].id != v[i - 1].id;
		w->prefix_share[at] += 1.0 / (double)n;
		w->prefix_found[at] += v[i].found;
	}
	for (long long i = 0; i < g; i++) /* the sum over the group's requests into their mean */
		w->prefix_found[i] /= w->prefix_share[i] * (double)n;
	w->n_prefix_groups = g;
	free(v);
	return 0;
}

/* workload.trace: the file relative to the scenario's folder (scenario), read; its means stand
 * for the three keys it replaces, which it refuses beside it. */
static int parse_trace(const JsonObj *o, const char *file, const char *scenario,
		       InferWorkload *w, PxError *err)
{
	static const char *const replaced[] = {"request_rate", "prompt_tokens", "output_tokens",
					       "prefix_tokens", NULL};
	if (!w->continuous)
		return fail_at(o, "trace", err, "applies to \"batching\": \"continuous\" only");
	for (int i = 0; replaced[i]; i++)
		if (cJSON_GetObjectItemCaseSensitive(o->obj, replaced[i]))
			return fail_at(o, replaced[i], err, "given beside trace, whose requests "
				       "state it; expected one or the other");
	char dir[1024], path[2048];
	snprintf(dir, sizeof(dir), "%s", scenario);
	char *slash = strrchr(dir, '/');
	if (file[0] == '/' || !slash)
		snprintf(path, sizeof(path), "%s", file);
	else
		snprintf(path, sizeof(path), "%.*s/%s", (int)(slash - dir), dir, file);
	if (infer_trace_load(path, &w->trace, err)) {
		char what[1200];
		snprintf(what, sizeof(what), "%s", err->msg);
		return fail_at(o, "trace", err, what);
	}
	infer_trace_means(&w->trace, &w->request_rate, &w->prompt_tokens, &w->output_tokens);
	for (long long q = 0; w->prefix_caching && q < w->trace.n; q++)
		w->cached_prefix += (double)infer_prefix_found(w->trace.req[q].prefix_tokens,
							       w->trace.req[q].prompt_tokens,
							       w->block) / (double)w->trace.n;
	return w->prefix_caching && w->trace.prefixes ? trace_groups(w, err) : 0;
}

/* vLLM V1's batch defaults for its OpenAI-compatible server (EngineArgs.get_batch_defaults): 8192
 * tokens and 1024 sequences a step on a GPU of at least 70 GiB that is not an A100 (H100, H200,
 * MI300X), 2048 and 256 on the rest; the memory as torch reports it (usable_bytes). */
static void v1_defaults(const GpuSpec *g, long long *tokens, long long *seqs)
{
	char name[64] = "";
	for (size_t i = 0; g->name && g->name[i] && i + 1 < sizeof(name); i++)
		name[i] = (char)tolower((unsigned char)g->name[i]), name[i + 1] = 0;
	int big = g->usable_bytes >= 70.0 * (1 << 30) && !strstr(name, "a100");
	*tokens = big ? 8192 : 2048;
	*seqs = big ? 1024 : 256;
}

/* workload.scheduler: "vllm" (the default: vLLM's V0 scheduler, a prompt prefilled alone before
 * the running sequences' next step), "split_fuse" (DeepSpeed-FastGen's Dynamic SplitFuse), whose
 * forwards hold at most max_ragged_batch_size tokens of at most max_ragged_sequence_count
 * sequences (DSStateManagerConfig's defaults, 768 and 512; its validator wants the count no
 * larger than the tokens), or "vllm_v1" (vLLM V1's scheduler: max_num_batched_tokens a step,
 * max_num_seqs running, v1_defaults'). Continuous batching only. */
static int parse_scheduler(const JsonObj *o, const GpuSpec *gpu, InferWorkload *w, PxError *err)
{
	static const char *const schedulers[] = {"vllm", "split_fuse", "vllm_v1", NULL};
	static const char *const keys[][2] = {
		[SCHED_SPLIT_FUSE] = {"max_ragged_batch_size", "max_ragged_sequence_count"},
		[SCHED_VLLM_V1] = {"max_num_batched_tokens", "max_num_seqs"}};
	int which = SCHED_VLLM;
	int rs = jobj_choice(o, "scheduler", schedulers, 0, &which, err);
	if (rs < 0)
		return -1;
	w->scheduler = (InferScheduler)which;
	if (rs > 0 && !w->continuous)
		return fail_at(o, "scheduler", err, "applies to \"batching\": \"continuous\" only");
	long long dflt[3][2] = {{0, 0}, {768, 512}, {0, 0}};
	v1_defaults(gpu, &dflt[SCHED_VLLM_V1][0], &dflt[SCHED_VLLM_V1][1]);
	for (int k = SCHED_SPLIT_FUSE; k <= SCHED_VLLM_V1; k++) {
		long long toks, seqs;
		int rt = jobj_int(o, keys[k][0], 1, 1 << 24, dflt[k][0], &toks, err);
		int rq = rt < 0 ? -1 : jobj_int(o, keys[k][1], 1, 1 << 24, dflt[k][1], &seqs, err);
		if (rq < 0)
			return -1;
		if (w->scheduler != (InferScheduler)k && (rt > 0 || rq > 0)) {
			char what[96];
			snprintf(what, sizeof(what), "applies to \"scheduler\": \"%s\" only",
				 schedulers[k]);
			return fail_at(o, keys[k][rt > 0 ? 0 : 1], err, what);
		}
		if (w->scheduler == (InferScheduler)k)
			w->token_budget = toks, w->max_ragged_seqs = seqs;
	}
	if (w->scheduler == SCHED_SPLIT_FUSE && w->max_ragged_seqs > w->token_budget)
		return fail_at(o, "max_ragged_sequence_count", err, "larger than "
			       "max_ragged_batch_size; expected at most as many sequences as tokens "
			       "(DeepSpeed's DSStateManagerConfig refuses it too)");
	return 0;
}

static int parse_workload(const JsonObj *o, const char *scenario, long long head_dim,
			  const GpuSpec *gpu, InferWorkload *w, PxNotes *notes, PxError *err)
{
	static const char *const known[] = {"batch_size", "prompt_tokens", "output_tokens",
					    "batching", "request_rate", "trace", "block_size",
					    "watermark", "scheduler", "max_ragged_batch_size",
					    "max_ragged_sequence_count", "max_num_batched_tokens",
					    "max_num_seqs", "enable_prefix_caching", "prefix_tokens",
					    NULL};
	const char *batching, *trace;
	if (jobj_check_keys(o, known, notes) < 0)
		return px_fail(err, PX_ERR_RUNTIME, "out of memory");
	int rc = jobj_int(o, "batch_size", 1, 1 << 24, 1, &w->batch, err);
	if (rc < 0)
		return -1;
	w->batch_given = rc > 0;
	if (jobj_str(o, "batching", "static", &batching, err) < 0)
		return -1;
	if (strcmp(batching, "static") && strcmp(batching, "continuous")) {
		char what[200];
		snprintf(what, sizeof(what), "expected \"static\" (one batch start to end) or "
			 "\"continuous\" (requests join as they arrive), got \"%s\"", batching);
		return fail_at(o, "batching", err, what);
	}
	w->continuous = !strcmp(batching, "continuous");
	if (parse_scheduler(o, gpu, w, err))
		return -1;
	/* vLLM V1 caches full blocks of prompts by their tokens' hash (enable_prefix_caching,
	 * on by default in V1's EngineArgs); V0's scheduler and FastGen's are replayed without */
	int v1 = w->continuous && w->scheduler == SCHED_VLLM_V1;
	if ((rc = jobj_bool(o, "enable_prefix_caching", v1, &w->prefix_caching, err)) < 0)
		return -1;
	if (w->prefix_caching && !v1)
		return fail_at(o, "enable_prefix_caching", err, "applies to \"scheduler\": "
			       "\"vllm_v1\" only (vLLM V0's scheduler and FastGen's are replayed "
			       "without a prefix cache)");
	/* the paged cache: vLLM's (its EngineArgs defaults: block_size 16, watermark 0.01; V1's
	 * KVCacheManager.allocate_slots, to v0.11, takes blocks while any are free: no watermark),
	 * or FastGen's (blocked_flash.py get_kv_block_size: 128 tokens for heads of up to 64, else
	 * 64; no watermark: DeepSpeed-MII admits a prompt while its blocks are free) */
	int fused = w->scheduler == SCHED_SPLIT_FUSE;
	long long dflt_block = !fused ? 16 : head_dim <= 64 ? 128 : 64;
	int rb = jobj_int(o, "block_size", 1, 1 << 20, dflt_block, &w->block, err), rw;
	if (rb < 0 || (rw = jobj_num(o, "watermark", 0, 0.5, w->scheduler == SCHED_VLLM ? 0.01 : 0,
				     &w->watermark, err)) < 0)
		return -1;
	if (!w->continuous && (rb > 0 || rw > 0))
		return fail_at(o, rb > 0 ? "block_size" : "watermark", err, "applies to \"batching\": "
			       "\"continuous\" only (the paged KV cache a trace is replayed with)");
	if ((rc = jobj_str(o, "trace", "", &trace, err)) < 0)
		return -1;
	if (rc > 0)
		return parse_trace(o, trace, scenario, w, err);
	rc = jobj_num(o, "request_rate", 1e-9, 1e12, 0, &w->request_rate, err);
	if (rc < 0)
		return -1;
	if (w->continuous && rc == 0)
		return fail_at(o, "request_rate", err, "missing; continuous batching needs the "
			       "requests per second the cluster receives");
	if (!w->continuous && rc > 0)
		return fail_at(o, "request_rate", err, "applies to \"batching\": \"continuous\" "
			       "only; a static batch is batch_size sequences at once");
	rc = jobj_int(o, "prompt_tokens", 1, 1 << 24, 0, &w->prompt_tokens, err);
	if (rc == 0)
		return fail_at(o, "prompt_tokens", err, "missing; expected the prompt's tokens per "
			       "sequence");
	if (rc < 0 || (rc = jobj_int(o, "output_tokens", 1, 1 << 24, 0, &w->output_tokens, err)) < 0)
		return -1;
	if (rc == 0)
		return fail_at(o, "output_tokens", err, "missing; expected the tokens generated per "
			       "sequence");
	if ((rc = jobj_int(o, "prefix_tokens", 0, w->prompt_tokens, 0, &w->prefix_tokens, err)) < 0)
		return -1;
	if (rc > 0 && !w->prefix_caching)
		return fail_at(o, "prefix_tokens", err, "applies with vLLM V1's prefix cache only "
			       "(\"scheduler\": \"vllm_v1\", enable_prefix_caching on), which "
			       "finds the shared prefix cached");
	if (w->prefix_caching)
		w->cached_prefix = (double)infer_prefix_found(w->prefix_tokens, w->prompt_tokens,
							      w->block);
	return 0;
}

/* ---- what the schedule can be built for ---- */

static int check_model(const InferScenario *sc, const JsonObj *top, PxError *err)
{
	const ModelSpec *m = &sc->model;
	const char *refuse = NULL;
	if (!model_known(m))
		refuse = "needs an architecture (a Hugging Face config.json); num_parameters alone "
			 "gives no KV cache";
	else if (m->experts)
		refuse = "a mixture of experts: MoE inference is not modelled yet (dense models "
			 "only)";
	else if (m->lay.L_enc || !m->lay.causal || !m->lay.lm_head)
		refuse = "not a decoder-only language model: inference is modelled for causal "
			 "decoders only";
	else if (m->lay.mla)
		refuse = "multi-head latent attention caches latents, not keys and values: not "
			 "modelled yet";
	if (!refuse)
		return 0;
	char what[400];
	snprintf(what, sizeof(what), "%s %s", m->type, refuse);
	return fail_at(top, "model", err, what);
}

static int check_layout(const InferScenario *sc, const JsonObj *inf, const JsonObj *wlo,
			PxError *err)
{
	const ModelSpec *m = &sc->model;
	const InferConfig *c = &sc->inf;
	const InferWorkload *w = &sc->wl;
	const char *key = cJSON_HasObjectItem(inf->obj, "mp_size") ? "mp_size" : "tensor_parallel";
	char what[400];
	if (c->tp > sc->cluster.gpus_per_node || cluster_world(&sc->cluster) % c->tp) {
		snprintf(what, sizeof(what), "tensor-parallel size %lld must divide the cluster's %lld "
			 "GPUs and fit one node of %lld (tensor parallelism across nodes is not "
			 "modelled)", c->tp, cluster_world(&sc->cluster), sc->cluster.gpus_per_node);
		return fail_at(inf, key, err, what);
	}
	if (m->a % c->tp || (m->kv_heads % c->tp && c->tp % m->kv_heads)) {
		snprintf(what, sizeof(what), "tensor-parallel size %lld must divide the %lld attention "
			 "heads and divide or be a multiple of the %lld key/value heads", c->tp, m->a,
			 m->kv_heads);
		return fail_at(inf, key, err, what);
	}
	long long ctx = w->prompt_tokens + w->output_tokens;
	if (c->kernel_inject && ctx > c->max_out_tokens) {
		snprintf(what, sizeof(what), "prompt_tokens + output_tokens = %lld exceed "
			 "inference.max_out_tokens = %lld, which DeepSpeed's kernels refuse; raise "
			 "max_out_tokens", ctx, c->max_out_tokens);
		return fail_at(wlo, "output_tokens", err, what);
	}
	if (m->lay.pos == POS_LEARNED && ctx > m->max_pos) {
		snprintf(what, sizeof(what), "prompt_tokens + output_tokens = %lld exceed the model's "
			 "%lld learned positions", ctx, m->max_pos);
		return fail_at(wlo, "output_tokens", err, what);
	}
	if (c->quant == IQ_GROUPWISE) {
		/* each linear's input features split into whole groups (utils.py asserts it); a
		 * row-parallel matrix's are split t ways first */
		long long in_mlp = (m->I ? m->I : 4 * m->h) / c->tp;
		if (m->h % c->group_elems || in_mlp % c->group_elems) {
			snprintf(what, sizeof(what), "%lld must divide the linears' input features (%lld "
				 "hidden, %lld MLP per rank)", c->group_elems, m->h, in_mlp);
			JsonObj q, w8, qi;
			jobj_child(inf, "quant", &q, NULL);
			jobj_child(&q, "weight", &w8, NULL);
			jobj_child(&w8, "quantized_initialization", &qi, NULL);
			return fail_at(&qi, "group_size", err, what);
		}
	}
	return 0;
}

/* ---- loading ---- */

static int parse_all(InferScenario *sc, PxError *err)
{
	static const char *const known[] = {"name", "description", "model", "cluster", "inference",
					    "workload", "backend", NULL};
	JsonObj top, sect[IS_N_DOCS], inf, wl;
	const char *name;
	const JsonDoc *d = &sc->docs[IS_DOC_SCENARIO];
	jobj_make(&top, d, d->root, "", "", &sc->ov);
	for (int i = IS_DOC_MODEL; i < IS_N_DOCS; i++) {
		if (sc->docs[i].root)
			jobj_make(&sect[i], &sc->docs[i], sc->docs[i].root, "", SECTION_KEYS[i], &sc->ov);
		else
			jobj_make(&sect[i], d, section_root(sc, i), SECTION_KEYS[i], SECTION_KEYS[i],
				  &sc->ov);
	}
	if (jobj_check_keys(&top, known, &sc->notes) < 0)
		return px_fail(err, PX_ERR_RUNTIME, "out of memory");
	char stem[1024];
	snprintf(stem, sizeof(stem), "%s", sc->path);
	char *base = basename(stem), *dot = strrchr(base, '.');
	if (dot)
		*dot = '\0';
	const char *backend;
	if (jobj_str(&top, "name", base, &name, err) < 0 ||
	    jobj_str(&top, "backend", "gpu", &backend, err) < 0)
		return -1;
	snprintf(sc->name, sizeof(sc->name), "%s", name);
	if (!strcmp(backend, "gpu") || !strcmp(backend, "cpu"))
		sc->backend = backend[0] == 'g' ? BACKEND_GPU : BACKEND_CPU;
	else
		return fail_at(&top, "backend", err, "expected gpu (DeepSpeed's) or cpu (the Parallax "
			       "executor on host ranks; its CUDA inference is not written yet)");
	if (jobj_child(&top, "inference", &inf, err) <= 0)
		return inf.obj ? -1 : fail_at(&top, "inference", err, "expected an object of "
					       "deepspeed.init_inference's keys");
	int rc = jobj_child(&top, "workload", &wl, err);
	if (rc <= 0)
		return rc < 0 ? -1 : fail_at(&top, "workload", err, "missing; expected {batch_size, "
					      "prompt_tokens, output_tokens}");
	if (model_parse(&sect[IS_DOC_MODEL], &sc->model, &sc->notes, err) ||
	    cluster_parse(&sect[IS_DOC_CLUSTER], &sc->cluster, &sc->notes, err) ||
	    parse_inference(&inf, &sc->inf, &sc->notes, err) ||
	    parse_workload(&wl, sc->path, sc->model.head_dim, &sc->cluster.gpu, &sc->wl,
			   &sc->notes, err) ||
	    check_model(sc, &top, err) ||
	    check_layout(sc, &inf, &wl, err))
		return -1;
	/* a tensor-parallel group's NCCL buffers; cluster.c counts them for any world above 1 */
	if (sc->inf.tp == 1)
		sc->cluster.nccl_buffers_bytes = 0;
	/* the executor on host ranks holds no CUDA context, cuBLAS workspace or NCCL buffers */
	if (sc->backend == BACKEND_CPU)
		sc->cluster.cuda_context_bytes = sc->cluster.cublas_workspace_bytes =
			sc->cluster.nccl_buffers_bytes = 0;
	return 0;
}

int infer_scenario_load(InferScenario *sc, const char *path, const JsonOverrides *ov,
			PxError *err)
{
	memset(sc, 0, sizeof(*sc));
	px_notes_init(&sc->notes);
	jov_init(&sc->ov);
	snprintf(sc->path, sizeof(sc->path), "%s", path);
	for (int i = 0; ov && i < ov->n; i++)
		if (jov_add_kv(&sc->ov, ov->v[i].key, ov->v[i].value, err))
			goto fail;
	if (jdoc_load_file(&sc->docs[IS_DOC_SCENARIO], path, err))
		goto fail;
	if (!cJSON_IsObject(sc->docs[IS_DOC_SCENARIO].root)) {
		px_fail(err, PX_ERR_INPUT, "%s: expected a JSON object with model, cluster, inference "
			"and workload", path);
		goto fail;
	}
	for (int i = IS_DOC_MODEL; i < IS_N_DOCS; i++)
		if (load_section(sc, i, err))
			goto fail;
	if (apply_overrides(sc, err) || parse_all(sc, err))
		goto fail;
	return 0;
fail:
	infer_scenario_free(sc);
	return -1;
}

void infer_scenario_free(InferScenario *sc)
{
	if (!sc)
		return;
	for (int i = 0; i < IS_N_DOCS; i++)
		jdoc_free(&sc->docs[i]);
	jov_free(&sc->ov);
	px_notes_free(&sc->notes);
	infer_trace_free(&sc->wl.trace);
	free(sc->wl.prefix_share);
	free(sc->wl.prefix_found);
	sc->wl.prefix_share = sc->wl.prefix_found = NULL;
}

char *infer_scenario_resolved_json(const InferScenario *sc)
{
	cJSON *j = cJSON_Duplicate(sc->docs[IS_DOC_SCENARIO].root, 1);
	if (!j)
		return NULL;
	for (int i = IS_DOC_MODEL; i < IS_N_DOCS; i++)
		cJSON_ReplaceItemInObjectCaseSensitive(j, SECTION_KEYS[i],
						       cJSON_Duplicate(section_root(sc, i), 1));
	cJSON *r = cJSON_AddObjectToObject(j, "resolved");
	static const char *const quants[] = {"none", "int8_kernel", "groupwise"};
	cJSON_AddStringToObject(r, "kind", "inference");
	cJSON_AddStringToObject(r, "name", sc->name);
	cJSON_AddStringToObject(r, "gpu", sc->cluster.gpu.name);
	cJSON_AddStringToObject(r, "backend", sc->backend == BACKEND_CPU ? "cpu" : "gpu");
	cJSON_AddNumberToObject(r, "world_size", (double)cluster_world(&sc->cluster));
	cJSON_AddNumberToObject(r, "tp", (double)sc->inf.tp);
	cJSON_AddNumberToObject(r, "num_parameters", sc->model.n_params);
	cJSON_AddStringToObject(r, "dtype", infer_dtype_name(sc->inf.dtype));
	cJSON_AddStringToObject(r, "quant", quants[sc->inf.quant]);
	cJSON_AddNumberToObject(r, "quant_bits", sc->inf.quant_bits);
	cJSON_AddNumberToObject(r, "batch_size", (double)sc->wl.batch);
	cJSON_AddNumberToObject(r, "prompt_tokens", (double)sc->wl.prompt_tokens);
	cJSON_AddNumberToObject(r, "output_tokens", (double)sc->wl.output_tokens);
	cJSON_AddStringToObject(r, "batching", sc->wl.continuous ? "continuous" : "static");
	if (sc->wl.continuous) {
		cJSON_AddNumberToObject(r, "request_rate", sc->wl.request_rate);
		cJSON_AddNumberToObject(r, "block_size", (double)sc->wl.block);
		cJSON_AddNumberToObject(r, "watermark", sc->wl.watermark);
		static const char *const names[] = {"vllm", "split_fuse", "vllm_v1"};
		int v1 = sc->wl.scheduler == SCHED_VLLM_V1;
		cJSON_AddStringToObject(r, "scheduler", names[sc->wl.scheduler]);
		if (infer_sched_ragged(&sc->wl)) {
			cJSON_AddNumberToObject(r, v1 ? "max_num_batched_tokens" :
							"max_ragged_batch_size",
						(double)sc->wl.token_budget);
			cJSON_AddNumberToObject(r, v1 ? "max_num_seqs" : "max_ragged_sequence_count",
						(double)sc->wl.max_ragged_seqs);
		}
	}
	char *text = cJSON_PrintUnformatted(j);
	cJSON_Delete(j);
	return text;
}

#include "model.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* ---- tensors ---- */

static long long head_dim(const ModelSpec *m)
{
	return m->a > 0 ? m->h / m->a : m->h;
}

enum { REPL = 0, SPLIT = 1, EXPERT = 2 }; /* how a tensor is spread over ranks */

static int add_as(ModelTensor *t, int n, const char *name, long long numel, int how)
{
	if (numel <= 0 || n >= MODEL_MAX_TENSORS)
		return n;
	t[n].name = name;
	t[n].numel = numel;
	t[n].tp_split = how == SPLIT;
	t[n].expert = how == EXPERT;
	return n + 1;
}

static int add(ModelTensor *t, int n, const char *name, long long numel)
{
	return add_as(t, n, name, numel, REPL);
}

int model_unit_is_moe(const ModelSpec *m, int unit)
{
	return m->experts > 0 && unit >= 1 && unit <= m->L && unit % m->moe_interval == 0;
}

static int norm_tensors(const ModelSpec *m, ModelTensor *t, int n, const char *w, const char *b)
{
	n = add(t, n, w, m->h);
	return m->norm_bias ? add(t, n, b, m->h) : n;
}

/* Megatron's split: QKV, the MLP's first matrices and their biases by columns; the output
 * projections by rows (their biases stay whole); norms whole. An MoE block's router is whole and
 * its experts are spread over expert-parallel ranks instead. */
static int block_tensors(const ModelSpec *m, int unit, ModelTensor *t)
{
	long long h = m->h, q = m->a * head_dim(m), kv = m->kv_heads * head_dim(m), I = m->I;
	long long bias = m->linear_bias, E = m->experts;
	int n = 0, moe = model_unit_is_moe(m, unit), mlp = moe ? EXPERT : SPLIT;
	long long copies = moe ? E : 1;

	if (m->arch == ARCH_PARAMS_ONLY)
		return add(t, 0, "block.params", (long long)llround(m->n_params / (double)m->L));
	n = norm_tensors(m, t, n, "norm1.weight", "norm1.bias");
	if (m->arch == ARCH_GPT2) { /* GPT-2 fuses q, k and v into one c_attn matrix */
		n = add_as(t, n, "attn.c_attn.weight", h * (q + 2 * kv), SPLIT);
		n = add_as(t, n, "attn.c_attn.bias", bias * (q + 2 * kv), SPLIT);
	} else {
		n = add_as(t, n, "attn.q.weight", h * q, SPLIT);
		n = add_as(t, n, "attn.q.bias", bias * q, SPLIT);
		n = add_as(t, n, "attn.k.weight", h * kv, SPLIT);
		n = add_as(t, n, "attn.k.bias", bias * kv, SPLIT);
		n = add_as(t, n, "attn.v.weight", h * kv, SPLIT);
		n = add_as(t, n, "attn.v.bias", bias * kv, SPLIT);
	}
	n = add_as(t, n, "attn.o.weight", q * h, SPLIT);
	n = add(t, n, "attn.o.bias", bias * h);
	n = norm_tensors(m, t, n, "norm2.weight", "norm2.bias");
	if (moe)
		n = add(t, n, "mlp.router.weight", h * E);
	if (m->gated_mlp) {
		n = add_as(t, n, "mlp.gate.weight", copies * h * I, mlp);
		n = add_as(t, n, "mlp.up.weight", copies * h * I, mlp);
	} else {
		n = add_as(t, n, "mlp.fc.weight", copies * h * I, mlp);
		n = add_as(t, n, "mlp.fc.bias", copies * bias * I, mlp);
	}
	n = add_as(t, n, "mlp.down.weight", copies * I * h, mlp);
	return add_as(t, n, "mlp.down.bias", copies * bias * h, moe ? EXPERT : REPL);
}

int model_unit_tensors(const ModelSpec *m, int unit, ModelTensor out[MODEL_MAX_TENSORS])
{
	int n = 0;
	if (unit > 0 && unit <= m->L)
		return block_tensors(m, unit, out);
	if (m->arch == ARCH_PARAMS_ONLY)
		return 0;
	if (unit == 0) {
		n = add_as(out, n, "embed.tokens", m->V * m->h, SPLIT); /* vocabulary-parallel */
		n = add(out, n, "embed.positions", m->learned_pos ? m->max_pos * m->h : 0);
		n = add(out, n, "embed.token_types", m->type_vocab * m->h);
		if (m->arch == ARCH_BERT)
			n = norm_tensors(m, out, n, "embed.norm.weight", "embed.norm.bias");
		return n;
	}
	if (m->arch == ARCH_BERT) {
		n = add(out, n, "pooler.weight", m->h * m->h);
		return add(out, n, "pooler.bias", m->h);
	}
	n = norm_tensors(m, out, n, "final_norm.weight", "final_norm.bias");
	return add_as(out, n, "lm_head.weight", m->has_lm_head && !m->tied ? m->V * m->h : 0, SPLIT);
}

long long model_unit_params(const ModelSpec *m, int unit)
{
	ModelTensor t[MODEL_MAX_TENSORS];
	long long sum = 0;
	int n = model_unit_tensors(m, unit, t);
	for (int i = 0; i < n; i++)
		sum += t[i].numel;
	return sum;
}

long long model_tied_elems(const ModelSpec *m)
{
	return m->has_lm_head && m->tied ? m->V * m->h : 0;
}

double model_count_params(const ModelSpec *m)
{
	if (m->arch == ARCH_PARAMS_ONLY)
		return m->n_params;
	double sum = 0;
	for (int u = 0; u < model_n_units(m); u++)
		sum += (double)model_unit_params(m, u);
	return sum;
}

/* ---- parsing ---- */

typedef struct KeyNames { /* the same dimension under each family's key */
	const char *h, *L, *a, *V, *pos;
} KeyNames;

static const KeyNames GPT2_KEYS = {"n_embd", "n_layer", "n_head", "vocab_size", "n_positions"};
static const KeyNames HF_KEYS = {"hidden_size", "num_hidden_layers", "num_attention_heads",
				 "vocab_size", "max_position_embeddings"};

#define BIG (1LL << 40)

static int need_int(const JsonObj *o, const char *key, long long *out, PxError *err)
{
	int rc = jobj_int(o, key, 1, BIG, 0, out, err);
	if (rc == 0)
		return px_fail(err, PX_ERR_INPUT, "%s: %s%s%s: missing; expected a positive integer",
			       o->doc->path, o->name, *o->name ? "." : "", key);
	return rc < 0 ? -1 : 0;
}

static int read_dims(const JsonObj *o, const KeyNames *k, ModelSpec *m, PxError *err)
{
	if (need_int(o, k->h, &m->h, err) || need_int(o, k->L, &m->L, err) ||
	    need_int(o, k->a, &m->a, err) || need_int(o, k->V, &m->V, err))
		return -1;
	if (jobj_int(o, k->pos, 1, BIG, 2048, &m->max_pos, err) < 0)
		return -1;
	return 0;
}

static int read_dropout(const JsonObj *o, const char *const *keys, double dflt, ModelSpec *m,
			PxError *err)
{
	double p, max_p = 0;
	for (int i = 0; keys[i]; i++) {
		if (jobj_num(o, keys[i], 0, 1, dflt, &p, err) < 0)
			return -1;
		if (p > max_p)
			max_p = p;
	}
	m->dropout = max_p > 0;
	return 0;
}

static int parse_gpt2(const JsonObj *o, ModelSpec *m, PxError *err)
{
	static const char *const drop[] = {"attn_pdrop", "resid_pdrop", "embd_pdrop", NULL};
	if (read_dims(o, &GPT2_KEYS, m, err))
		return -1;
	m->arch = ARCH_GPT2;
	m->kv_heads = m->a;
	if (jobj_int(o, "n_inner", 1, BIG, 4 * m->h, &m->I, err) < 0 ||
	    jobj_bool(o, "tie_word_embeddings", 1, &m->tied, err) < 0)
		return -1;
	m->norm_bias = m->linear_bias = m->learned_pos = m->has_lm_head = 1;
	return read_dropout(o, drop, 0.1, m, err);
}

static int parse_llama(const JsonObj *o, ModelSpec *m, PxError *err)
{
	static const char *const drop[] = {"attention_dropout", NULL};
	int attn_bias, mlp_bias;
	if (read_dims(o, &HF_KEYS, m, err) || need_int(o, "intermediate_size", &m->I, err))
		return -1;
	m->arch = ARCH_LLAMA;
	if (jobj_int(o, "num_key_value_heads", 1, m->a, m->a, &m->kv_heads, err) < 0 ||
	    jobj_bool(o, "tie_word_embeddings", 0, &m->tied, err) < 0 ||
	    jobj_bool(o, "attention_bias", 0, &attn_bias, err) < 0 ||
	    jobj_bool(o, "mlp_bias", 0, &mlp_bias, err) < 0)
		return -1;
	if (attn_bias || mlp_bias)
		return px_fail(err, PX_ERR_INPUT, "%s: %s: attention_bias/mlp_bias true is not supported",
			       o->doc->path, o->name);
	m->gated_mlp = m->has_lm_head = 1;
	return read_dropout(o, drop, 0.0, m, err);
}

static int parse_mixtral(const JsonObj *o, ModelSpec *m, PxError *err)
{
	if (parse_llama(o, m, err))
		return -1;
	if (need_int(o, "num_local_experts", &m->experts, err) ||
	    jobj_int(o, "num_experts_per_tok", 1, m->experts, 2, &m->top_k, err) < 0)
		return -1;
	return 0;
}

static int parse_bert(const JsonObj *o, ModelSpec *m, PxError *err)
{
	static const char *const drop[] = {"hidden_dropout_prob", "attention_probs_dropout_prob", NULL};
	if (read_dims(o, &HF_KEYS, m, err) || need_int(o, "intermediate_size", &m->I, err))
		return -1;
	m->arch = ARCH_BERT;
	m->kv_heads = m->a;
	if (jobj_int(o, "type_vocab_size", 0, BIG, 2, &m->type_vocab, err) < 0)
		return -1;
	m->norm_bias = m->linear_bias = m->learned_pos = 1;
	return read_dropout(o, drop, 0.1, m, err);
}

static int parse_params_only(const JsonObj *o, ModelSpec *m, PxNotes *notes, PxError *err)
{
	if (jobj_num(o, "num_parameters", 1, 1e16, 0, &m->n_params, err) < 0)
		return -1;
	m->arch = ARCH_PARAMS_ONLY;
	int rc = jobj_int(o, "num_hidden_layers", 1, 100000, 64, &m->L, err);
	if (rc < 0)
		return -1;
	if (rc == 0)
		px_notes_warn(notes, "%s: model has no layer structure: its parameters are split into "
			      "64 equal layers for ZeRO-3 gathering (set model.num_hidden_layers); "
			      "activations unknown", o->doc->path);
	return 0;
}

int model_parse(const JsonObj *o, ModelSpec *m, PxNotes *notes, PxError *err)
{
	const char *type = NULL;
	int rc;

	memset(m, 0, sizeof(*m));
	m->top_k = 1;
	m->moe_interval = 1;
	if (jobj_str(o, "model_type", NULL, &type, err) < 0)
		return -1;
	if (cJSON_HasObjectItem(o->obj, "num_parameters")) {
		/* a bare count, or --set model.num_parameters=N over a config: the count wins */
		if (type)
			px_notes_warn(notes, "%s: %s.num_parameters given: the %s architecture is not "
				      "used; activations unknown", o->doc->path, o->name, type);
		type = "params";
	} else if (!type) { /* infer the family from its keys, as a bare config would be read */
		if (cJSON_HasObjectItem(o->obj, "n_embd"))
			type = "gpt2";
		else if (cJSON_HasObjectItem(o->obj, "type_vocab_size"))
			type = "bert";
		else
			type = "llama";
	}
	snprintf(m->type, sizeof(m->type), "%s", type);

	if (!strcmp(type, "params"))
		rc = parse_params_only(o, m, notes, err);
	else if (!strcmp(type, "gpt2"))
		rc = parse_gpt2(o, m, err);
	else if (!strcmp(type, "llama") || !strcmp(type, "mistral"))
		rc = parse_llama(o, m, err);
	else if (!strcmp(type, "mixtral"))
		rc = parse_mixtral(o, m, err);
	else if (!strcmp(type, "bert"))
		rc = parse_bert(o, m, err);
	else {
		char where[512];
		jobj_where(o, "model_type", where, sizeof(where));
		return px_fail(err, PX_ERR_INPUT,
			       "%s: %s%smodel_type: expected gpt2, llama, mistral, mixtral or bert, got "
			       "\"%s\"",
			       where, o->name, *o->name ? "." : "", type);
	}
	if (rc)
		return -1;
	if (m->arch != ARCH_PARAMS_ONLY) {
		if (m->h % m->a || m->a % m->kv_heads)
			return px_fail(err, PX_ERR_INPUT,
				       "%s: %s: hidden size %lld must divide by heads %lld, and heads by "
				       "key/value heads %lld", o->doc->path, o->name, m->h, m->a,
				       m->kv_heads);
		m->n_params = model_count_params(m);
	}
	return 0;
}

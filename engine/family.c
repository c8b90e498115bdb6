#include "family.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

/* ---- what a row holds ---- */

/* The dimensions a config gives. A family lists, for each, the keys that give it (the first one
 * present wins: HF's attribute_map aliases, Falcon's RefinedWeb names) and the default of its
 * configuration class for the first; UNSET defaults are derived after reading (kv = a,
 * head_dim = h/a, I = 4h, the decoder's layers = the encoder's, ...). */
typedef enum {
	D_H, D_L, D_L_DEC, D_A, D_KV, D_HEAD, D_VHEAD, D_I, D_V, D_POS, D_TYPES, D_EXPERTS, D_TOPK,
	D_MOE_I, D_SHARED_I, D_SHARED_N, D_FIRST_DENSE, D_MOE_FREQ, D_SPARSE_STEP, D_Q_LORA,
	D_KV_LORA, D_ROPE, D_NOPE, D_EMBED_DIM, D_BUCKETS, N_DIMS
} Dim;

#define UNSET (-1LL)
#define BIG (1LL << 40)

typedef struct DimKey {
	Dim dim;
	const char *key;
	long long dflt;
} DimKey;

/* A boolean config key setting an int member of ModelLayout (offset) to on or off. */
typedef struct SwitchKey {
	const char *key;
	int dflt;
	size_t offset;
	int on, off;
} SwitchKey;

/* A dropout probability: on the attention probabilities (attn) or on the residual branches and
 * the embeddings. */
typedef struct DropKey {
	const char *key;
	double dflt;
	int attn;
} DropKey;

typedef int (*FamilyHook)(const JsonObj *o, ModelSpec *m, long long dim[N_DIMS], PxError *err);

/* A Hugging Face class of a family with several heads, and the head it ends with: a pooler, a
 * language-model head (with a transform before it, tied to the embeddings, with a bias), and a
 * classifier of `labels` outputs (-1: the config's num_labels) over the pooled token or over
 * every token, with a dropout before it or not. `causal`: the class runs its blocks as a
 * decoder. */
typedef struct HeadRow {
	const char *arch;
	int pooler, mlm, labels, per_token, dropout, causal;
} HeadRow;

struct ModelFamily {
	const char *const *types;  /* model_type, then aliases */
	const DimKey *dims;        /* ends with a NULL key */
	const SwitchKey *switches; /* ends with a NULL key */
	const DropKey *drops;      /* ends with a NULL key */
	const char *const *known;  /* other keys its configuration class reads; NULL-terminated */
	ModelLayout layout;        /* the composition before the switches */
	FamilyHook hook;           /* what a row cannot say (Falcon's architectures, T5's
				      feed_forward_proj, ...); may be NULL */
	const HeadRow *heads;      /* the classes that end the model differently, by the config's
				      architectures or the scenario's "architecture" (BERT's);
				      NULL: one kind of head. The first is the default. */
};

#define SW(key, dflt, member, on, off) {key, dflt, offsetof(ModelLayout, member), on, off}

/* Keys every config may carry (transformers' PretrainedConfig and generation defaults, and keys
 * the Hub's configs commonly hold that no family reads). */
static const char *const COMMON[] = {
	"model_type", "architectures", "auto_map", "torch_dtype", "dtype", "transformers_version",
	"bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "unk_token_id",
	"decoder_start_token_id", "use_cache", "initializer_range", "tie_word_embeddings",
	"return_dict", "output_hidden_states", "output_attentions", "torchscript", "use_bfloat16",
	"tf_legacy_loss", "pruned_heads", "chunk_size_feed_forward", "is_encoder_decoder",
	"is_decoder", "cross_attention_hidden_size", "add_cross_attention", "tie_encoder_decoder",
	"max_length", "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups",
	"diversity_penalty", "temperature", "top_k", "top_p", "typical_p", "repetition_penalty",
	"length_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "bad_words_ids",
	"num_return_sequences", "output_scores", "return_dict_in_generate", "forced_bos_token_id",
	"forced_eos_token_id", "remove_invalid_values", "exponential_decay_length_penalty",
	"suppress_tokens", "begin_suppress_tokens", "finetuning_task", "id2label", "label2id",
	"num_labels", "tokenizer_class", "prefix", "task_specific_params", "problem_type",
	"quantization_config", "gradient_checkpointing", "use_return_dict", NULL};

/* ---- hooks ---- */

static int read_bool(const JsonObj *o, const char *key, int dflt, int *out, PxError *err)
{
	return jobj_bool(o, key, dflt, out, err) < 0 ? -1 : 0;
}

/* Falcon (modeling_falcon.py): the 7B's multi-query attention (one k/v head) with one norm
 * shared by attention and MLP; new_decoder_architecture (40B, 180B) with num_kv_heads groups and
 * a norm each (num_ln_in_parallel_attn, default 2); parallel_attn false (Falcon-RW) is a
 * sequential block. The custom-code RefinedWeb configs are read as transformers' conversion
 * reads them: n_head_kv present means the new architecture. */
static int hook_falcon(const JsonObj *o, ModelSpec *m, long long dim[N_DIMS], PxError *err)
{
	int rw = !strncmp(m->type, "RefinedWeb", 10);
	int new_arch, multi_query, parallel, alibi;
	long long n_ln;
	if (read_bool(o, "new_decoder_architecture",
		      rw && cJSON_HasObjectItem(o->obj, "n_head_kv"), &new_arch, err) ||
	    read_bool(o, "multi_query", 1, &multi_query, err) ||
	    read_bool(o, "parallel_attn", 1, &parallel, err) ||
	    read_bool(o, "alibi", 0, &alibi, err) ||
	    jobj_int(o, "num_ln_in_parallel_attn", 1, 2, new_arch ? 2 : 1, &n_ln, err) < 0)
		return -1;
	if (!new_arch)
		dim[D_KV] = multi_query ? 1 : UNSET;
	m->lay.parallel = parallel ? (new_arch && n_ln == 2 ? 2 : 1) : 0;
	m->lay.pos = alibi ? POS_ALIBI : POS_ROTARY;
	return 0;
}

/* GPT-BigCode (StarCoder): multi-query attention by default. */
static int hook_bigcode(const JsonObj *o, ModelSpec *m, long long dim[N_DIMS], PxError *err)
{
	int multi_query;
	(void)m;
	if (read_bool(o, "multi_query", 1, &multi_query, err))
		return -1;
	dim[D_KV] = multi_query ? 1 : UNSET;
	return 0;
}

/* Gemma-2's logit soft-capping, read as Gemma2Config does: absent, its defaults (50 on the
 * attention scores, 30 on the logits); null, none. */
static int softcap(const JsonObj *o, const char *key, double dflt, double *out, PxError *err)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o->obj, key);
	if (v && cJSON_IsNull(v)) {
		*out = 0;
		return 0;
	}
	return jobj_num(o, key, 1e-6, 1e9, dflt, out, err) < 0 ? -1 : 0;
}

static int hook_gemma2(const JsonObj *o, ModelSpec *m, long long dim[N_DIMS], PxError *err)
{
	(void)dim;
	return softcap(o, "attn_logit_softcapping", 50, &m->attn_softcap, err) ||
	       softcap(o, "final_logit_softcapping", 30, &m->final_softcap, err) ? -1 : 0;
}

/* Phi (phi-1, 1.5, 2): optional LayerNorms on q and k per head. */
static int hook_phi(const JsonObj *o, ModelSpec *m, long long dim[N_DIMS], PxError *err)
{
	int qk;
	(void)dim;
	if (read_bool(o, "qk_layernorm", 0, &qk, err))
		return -1;
	m->lay.qk_norm = qk ? QKNORM_HEAD : QKNORM_NONE;
	return 0;
}

/* OPT: pre-norm blocks with a final norm (do_layer_norm_before, except 350m's post-norm blocks,
 * which have none); word_embed_proj_dim narrower than h adds project_in and project_out. */
static int hook_opt(const JsonObj *o, ModelSpec *m, long long dim[N_DIMS], PxError *err)
{
	int before, remove_final, affine;
	if (read_bool(o, "do_layer_norm_before", 1, &before, err) ||
	    read_bool(o, "_remove_final_layer_norm", 0, &remove_final, err) ||
	    read_bool(o, "layer_norm_elementwise_affine", 1, &affine, err))
		return -1;
	if (!affine) {
		char where[512];
		jobj_where(o, "layer_norm_elementwise_affine", where, sizeof(where));
		return px_fail(err, PX_ERR_INPUT, "%s: %s.layer_norm_elementwise_affine: false (norms "
			       "without parameters) is not modelled; expected true", where, o->name);
	}
	m->lay.place = before ? NORM_PRE : NORM_POST;
	m->lay.final_norm = before && !remove_final;
	if (dim[D_EMBED_DIM] != UNSET && dim[D_EMBED_DIM] != dim[D_H])
		m->lay.embed_dim = dim[D_EMBED_DIM];
	return 0;
}

/* T5: "relu" or "gated-gelu" (T5 v1.1, Flan-T5) feed-forward; an encoder and a decoder stack. */
static int hook_t5(const JsonObj *o, ModelSpec *m, long long dim[N_DIMS], PxError *err)
{
	const char *ff;
	(void)dim;
	if (jobj_str(o, "feed_forward_proj", "relu", &ff, err) < 0)
		return -1;
	const char *act = !strncmp(ff, "gated-", 6) ? ff + 6 : ff;
	if (strcmp(act, "relu") && strcmp(act, "gelu") && strcmp(act, "gelu_new") &&
	    strcmp(act, "silu")) {
		char where[512];
		jobj_where(o, "feed_forward_proj", where, sizeof(where));
		return px_fail(err, PX_ERR_INPUT, "%s: %s.feed_forward_proj: expected \"relu\", "
			       "\"gated-gelu\" or another ACT / gated-ACT, got \"%s\"", where, o->name,
			       ff);
	}
	m->lay.gated = act != ff;
	return 0;
}

/* Qwen2-MoE: a sigmoid gate on the shared expert; mlp_only_layers keep a dense MLP. */
static int hook_qwen2_moe(const JsonObj *o, ModelSpec *m, long long dim[N_DIMS], PxError *err)
{
	const cJSON *list = cJSON_GetObjectItemCaseSensitive(o->obj, "mlp_only_layers");
	const cJSON *it;
	char where[512];
	(void)dim;
	m->shared_gate = 1;
	if (!list || cJSON_IsNull(list))
		return 0;
	jobj_where(o, "mlp_only_layers", where, sizeof(where));
	if (!cJSON_IsArray(list))
		return px_fail(err, PX_ERR_INPUT, "%s: %s.mlp_only_layers: expected a list of layer "
			       "indices", where, o->name);
	cJSON_ArrayForEach(it, list) {
		if (!cJSON_IsNumber(it) || it->valuedouble < 0 ||
		    it->valuedouble != (double)(long long)it->valuedouble)
			return px_fail(err, PX_ERR_INPUT, "%s: %s.mlp_only_layers: expected layer "
				       "indices from 0", where, o->name);
		if (m->n_dense_list >= MODEL_MAX_DENSE_LIST)
			return px_fail(err, PX_ERR_INPUT, "%s: %s.mlp_only_layers: more than %d layers",
				       where, o->name, MODEL_MAX_DENSE_LIST);
		m->dense_list[m->n_dense_list++] = (long long)it->valuedouble;
	}
	return 0;
}

/* DeepSeek: the noaux_tc router (V3) keeps a score-correction bias per expert. The multi-token
 * prediction module of num_nextn_predict_layers (V3) is not part of transformers'
 * DeepseekV3ForCausalLM (its weights, layer 61 of the checkpoint, are not loaded) and is not
 * counted. */
static int hook_deepseek(const JsonObj *o, ModelSpec *m, long long dim[N_DIMS], PxError *err)
{
	const char *method;
	const char *dflt = !strcmp(m->type, "deepseek_v3") ? "noaux_tc" : "greedy";
	(void)dim;
	if (jobj_str(o, "topk_method", dflt, &method, err) < 0)
		return -1;
	m->router_bias = !strcmp(method, "noaux_tc");
	return 0;
}

/* ---- the table ---- */

/* Compositions shared by several rows. */
#define DECODER_RMS \
	.norm = NORM_RMS, .gated = 1, .causal = 1, .pos = POS_ROTARY, .final_norm = 1, .lm_head = 1

static const char *const GPT2_T[] = {"gpt2", NULL};
static const DimKey GPT2_D[] = {
	{D_H, "n_embd", 768}, {D_H, "hidden_size", 768}, {D_L, "n_layer", 12},
	{D_L, "num_hidden_layers", 12}, {D_A, "n_head", 12}, {D_A, "num_attention_heads", 12},
	{D_V, "vocab_size", 50257}, {D_POS, "n_positions", 1024},
	{D_POS, "max_position_embeddings", 1024}, {D_I, "n_inner", UNSET}, {0, NULL, 0}};
static const SwitchKey TIE_ON[] = {SW("tie_word_embeddings", 1, tied, 1, 0), {NULL, 0, 0, 0, 0}};
static const DropKey GPT2_DROP[] = {
	{"attn_pdrop", 0.1, 1}, {"resid_pdrop", 0.1, 0}, {"embd_pdrop", 0.1, 0}, {NULL, 0, 0}};
static const char *const GPT2_K[] = {
	"activation_function", "layer_norm_epsilon", "summary_type", "summary_use_proj",
	"summary_activation", "summary_proj_to_labels", "summary_first_dropout",
	"scale_attn_weights", "scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn", "n_ctx",
	NULL};

static const char *const LLAMA_T[] = {"llama", NULL};
static const DimKey LLAMA_D[] = {
	{D_H, "hidden_size", 4096}, {D_L, "num_hidden_layers", 32},
	{D_A, "num_attention_heads", 32}, {D_KV, "num_key_value_heads", UNSET},
	{D_HEAD, "head_dim", UNSET}, {D_I, "intermediate_size", 11008}, {D_V, "vocab_size", 32000},
	{D_POS, "max_position_embeddings", 2048}, {0, NULL, 0}};
/* attention_bias on q, k, v and o; mlp_bias on the MLP; untied head */
static const SwitchKey LLAMA_SW[] = {
	SW("attention_bias", 0, qkv_bias, 1, 0), SW("attention_bias", 0, o_bias, 1, 0),
	SW("mlp_bias", 0, mlp_bias, 1, 0), SW("tie_word_embeddings", 0, tied, 1, 0),
	{NULL, 0, 0, 0, 0}};
static const DropKey ATTN_DROP[] = {{"attention_dropout", 0.0, 1}, {NULL, 0, 0}};
static const char *const LLAMA_K[] = {
	"hidden_act", "rms_norm_eps", "rope_theta", "rope_scaling", "rope_parameters",
	"pretraining_tp", "layer_types", NULL};

static const char *const MISTRAL_T[] = {"mistral", NULL};
static const DimKey MISTRAL_D[] = {
	{D_H, "hidden_size", 4096}, {D_L, "num_hidden_layers", 32},
	{D_A, "num_attention_heads", 32}, {D_KV, "num_key_value_heads", 8},
	{D_HEAD, "head_dim", UNSET}, {D_I, "intermediate_size", 14336}, {D_V, "vocab_size", 32000},
	{D_POS, "max_position_embeddings", 131072}, {0, NULL, 0}};
static const SwitchKey UNTIED[] = {SW("tie_word_embeddings", 0, tied, 1, 0), {NULL, 0, 0, 0, 0}};
static const char *const MISTRAL_K[] = {
	"hidden_act", "rms_norm_eps", "rope_theta", "rope_scaling", "rope_parameters",
	"sliding_window", "layer_types", NULL};

static const char *const MIXTRAL_T[] = {"mixtral", NULL};
static const DimKey MIXTRAL_D[] = {
	{D_H, "hidden_size", 4096}, {D_L, "num_hidden_layers", 32},
	{D_A, "num_attention_heads", 32}, {D_KV, "num_key_value_heads", 8},
	{D_HEAD, "head_dim", UNSET}, {D_I, "intermediate_size", 14336}, {D_V, "vocab_size", 32000},
	{D_POS, "max_position_embeddings", 131072}, {D_EXPERTS, "num_local_experts", 8},
	{D_TOPK, "num_experts_per_tok", 2}, {0, NULL, 0}};
static const char *const MIXTRAL_K[] = {
	"hidden_act", "rms_norm_eps", "rope_theta", "rope_scaling", "rope_parameters",
	"sliding_window", "output_router_logits", "router_aux_loss_coef", "router_jitter_noise",
	"layer_types", NULL};

static const char *const BERT_T[] = {"bert", NULL};
static const DimKey BERT_D[] = {
	{D_H, "hidden_size", 768}, {D_L, "num_hidden_layers", 12}, {D_A, "num_attention_heads", 12},
	{D_I, "intermediate_size", 3072}, {D_V, "vocab_size", 30522},
	{D_POS, "max_position_embeddings", 512}, {D_TYPES, "type_vocab_size", 2}, {0, NULL, 0}};
static const DropKey BERT_DROP[] = {
	{"hidden_dropout_prob", 0.1, 0}, {"attention_probs_dropout_prob", 0.1, 1}, {NULL, 0, 0}};
static const char *const BERT_K[] = {
	"hidden_act", "layer_norm_eps", "position_embedding_type", "classifier_dropout", NULL};
/* modeling_bert.py's classes: BertModel (the encoder and its pooler); the MLM head,
 * BertOnlyMLMHead (BertPredictionHeadTransform: dense h x h, activation, LayerNorm; then the
 * decoder, tied to the word embeddings, with a bias of V), without the pooler
 * (add_pooling_layer=False); BertForPreTraining's both heads and the next-sentence classifier
 * (h x 2); the classifiers over the pooled [CLS] token (num_labels; one per choice) or over every
 * token (num_labels; question answering's start and end logits). BertLMHeadModel is the MLM
 * head on a causal decoder. */
static const HeadRow BERT_HEADS[] = {
	{"BertModel", 1, 0, 0, 0, 0, 0},
	{"BertForMaskedLM", 0, 1, 0, 0, 0, 0},
	{"BertForPreTraining", 1, 1, 2, 0, 0, 0},
	{"BertLMHeadModel", 0, 1, 0, 0, 0, 1},
	{"BertForNextSentencePrediction", 1, 0, 2, 0, 0, 0},
	{"BertForSequenceClassification", 1, 0, -1, 0, 1, 0},
	{"BertForMultipleChoice", 1, 0, 1, 0, 1, 0},
	{"BertForTokenClassification", 0, 0, -1, 1, 1, 0},
	{"BertForQuestionAnswering", 0, 0, 2, 1, 0, 0},
	{NULL, 0, 0, 0, 0, 0, 0}};

/* A causal LM's classes beside its LM one (modeling_gpt2.py, modeling_llama.py and the families
 * written after it), by the class name's ending: sequence classification's score (h x num_labels,
 * no bias) over every token, of which the last is pooled after (GPT2ForSequenceClassification,
 * LlamaForSequenceClassification: reward models too, num_labels 1); token classification's
 * dropout and classifier with a bias; question answering's start and end logits (a bias). */
typedef struct CausalHead {
	const char *tail;
	int labels, bias, dropout;
} CausalHead;
static const CausalHead CAUSAL_HEADS[] = {
	{"ForSequenceClassification", -1, 0, 0},
	{"ForTokenClassification", -1, 1, 1},
	{"ForQuestionAnswering", 2, 1, 0},
};

static const char *const QWEN2_T[] = {"qwen2", NULL};
static const DimKey QWEN2_D[] = {
	{D_H, "hidden_size", 4096}, {D_L, "num_hidden_layers", 32},
	{D_A, "num_attention_heads", 32}, {D_KV, "num_key_value_heads", 32},
	{D_I, "intermediate_size", 22016}, {D_V, "vocab_size", 151936},
	{D_POS, "max_position_embeddings", 32768}, {0, NULL, 0}};
static const char *const QWEN2_K[] = {
	"hidden_act", "rms_norm_eps", "rope_theta", "rope_scaling", "rope_parameters",
	"use_sliding_window", "sliding_window", "max_window_layers", "layer_types", NULL};

static const char *const QWEN2_MOE_T[] = {"qwen2_moe", NULL};
static const DimKey QWEN2_MOE_D[] = {
	{D_H, "hidden_size", 2048}, {D_L, "num_hidden_layers", 24},
	{D_A, "num_attention_heads", 16}, {D_KV, "num_key_value_heads", 16},
	{D_I, "intermediate_size", 5632}, {D_V, "vocab_size", 151936},
	{D_POS, "max_position_embeddings", 32768}, {D_EXPERTS, "num_experts", 60},
	{D_TOPK, "num_experts_per_tok", 4}, {D_MOE_I, "moe_intermediate_size", 1408},
	{D_SHARED_I, "shared_expert_intermediate_size", 5632},
	{D_SPARSE_STEP, "decoder_sparse_step", 1}, {0, NULL, 0}};
static const SwitchKey QWEN2_MOE_SW[] = {
	SW("qkv_bias", 1, qkv_bias, 1, 0), SW("tie_word_embeddings", 0, tied, 1, 0),
	{NULL, 0, 0, 0, 0}};
static const char *const QWEN2_MOE_K[] = {
	"hidden_act", "rms_norm_eps", "rope_theta", "rope_scaling", "rope_parameters",
	"use_sliding_window", "sliding_window", "max_window_layers", "norm_topk_prob",
	"output_router_logits", "router_aux_loss_coef", "mlp_only_layers", "layer_types", NULL};

static const char *const QWEN3_T[] = {"qwen3", NULL};
static const DimKey QWEN3_D[] = {
	{D_H, "hidden_size", 4096}, {D_L, "num_hidden_layers", 32},
	{D_A, "num_attention_heads", 32}, {D_KV, "num_key_value_heads", 32},
	{D_HEAD, "head_dim", 128}, {D_I, "intermediate_size", 22016}, {D_V, "vocab_size", 151936},
	{D_POS, "max_position_embeddings", 32768}, {0, NULL, 0}};
static const SwitchKey BIAS_UNTIED[] = {
	SW("attention_bias", 0, qkv_bias, 1, 0), SW("attention_bias", 0, o_bias, 1, 0),
	SW("tie_word_embeddings", 0, tied, 1, 0), {NULL, 0, 0, 0, 0}};

static const char *const GEMMA_T[] = {"gemma", NULL};
static const DimKey GEMMA_D[] = {
	{D_H, "hidden_size", 3072}, {D_L, "num_hidden_layers", 28},
	{D_A, "num_attention_heads", 16}, {D_KV, "num_key_value_heads", 16},
	{D_HEAD, "head_dim", 256}, {D_I, "intermediate_size", 24576}, {D_V, "vocab_size", 256000},
	{D_POS, "max_position_embeddings", 8192}, {0, NULL, 0}};
static const SwitchKey BIAS_TIED[] = {
	SW("attention_bias", 0, qkv_bias, 1, 0), SW("attention_bias", 0, o_bias, 1, 0),
	SW("tie_word_embeddings", 1, tied, 1, 0), {NULL, 0, 0, 0, 0}};
static const char *const GEMMA_K[] = {
	"hidden_act", "hidden_activation", "rms_norm_eps", "rope_theta", "rope_scaling",
	"rope_parameters", "use_bidirectional_attention", NULL};

static const char *const GEMMA2_T[] = {"gemma2", NULL};
static const DimKey GEMMA2_D[] = {
	{D_H, "hidden_size", 2304}, {D_L, "num_hidden_layers", 26},
	{D_A, "num_attention_heads", 8}, {D_KV, "num_key_value_heads", 4},
	{D_HEAD, "head_dim", 256}, {D_I, "intermediate_size", 9216}, {D_V, "vocab_size", 256000},
	{D_POS, "max_position_embeddings", 8192}, {0, NULL, 0}};
static const char *const GEMMA2_K[] = {
	"hidden_act", "hidden_activation", "rms_norm_eps", "rope_theta", "rope_scaling",
	"rope_parameters", "query_pre_attn_scalar", "sliding_window", "final_logit_softcapping",
	"attn_logit_softcapping", "cache_implementation", "layer_types",
	"use_bidirectional_attention", NULL};

static const char *const PHI3_T[] = {"phi3", NULL};
static const DimKey PHI3_D[] = {
	{D_H, "hidden_size", 3072}, {D_L, "num_hidden_layers", 32},
	{D_A, "num_attention_heads", 32}, {D_KV, "num_key_value_heads", UNSET},
	{D_I, "intermediate_size", 8192}, {D_V, "vocab_size", 32064},
	{D_POS, "max_position_embeddings", 4096}, {0, NULL, 0}};
static const DropKey PHI_DROP[] = {
	{"resid_pdrop", 0.0, 0}, {"embd_pdrop", 0.0, 0}, {"attention_dropout", 0.0, 1},
	{NULL, 0, 0}};
/* attention_bias: some Phi-3 configs carry it; Phi3Attention has no biases whatever it says */
static const char *const PHI3_K[] = {
	"hidden_act", "rms_norm_eps", "rope_theta", "rope_scaling", "rope_parameters",
	"original_max_position_embeddings", "partial_rotary_factor", "sliding_window",
	"attention_bias", NULL};

static const char *const PHI_T[] = {"phi", NULL};
static const DimKey PHI_D[] = {
	{D_H, "hidden_size", 2048}, {D_L, "num_hidden_layers", 24},
	{D_A, "num_attention_heads", 32}, {D_KV, "num_key_value_heads", UNSET},
	{D_I, "intermediate_size", 8192}, {D_V, "vocab_size", 51200},
	{D_POS, "max_position_embeddings", 2048}, {0, NULL, 0}};
static const char *const PHI_K[] = {
	"hidden_act", "layer_norm_eps", "rope_theta", "rope_scaling", "rope_parameters",
	"partial_rotary_factor", "qk_layernorm", NULL};

static const char *const FALCON_T[] = {"falcon", "RefinedWebModel", "RefinedWeb", NULL};
static const DimKey FALCON_D[] = {
	{D_H, "hidden_size", 4544}, {D_H, "n_embed", 4544}, {D_L, "num_hidden_layers", 32},
	{D_L, "n_layer", 32}, {D_A, "num_attention_heads", 71}, {D_A, "n_head", 71},
	{D_KV, "num_kv_heads", UNSET}, {D_KV, "n_head_kv", UNSET},
	{D_I, "ffn_hidden_size", UNSET}, {D_V, "vocab_size", 65024},
	{D_POS, "max_position_embeddings", 2048}, {0, NULL, 0}};
/* bias on every linear layer; tied head */
static const SwitchKey FALCON_SW[] = {
	SW("bias", 0, qkv_bias, 1, 0), SW("bias", 0, o_bias, 1, 0), SW("bias", 0, mlp_bias, 1, 0),
	SW("tie_word_embeddings", 1, tied, 1, 0), {NULL, 0, 0, 0, 0}};
static const DropKey HIDDEN_ATTN_DROP[] = {
	{"hidden_dropout", 0.0, 0}, {"attention_dropout", 0.0, 1}, {NULL, 0, 0}};
static const char *const FALCON_K[] = {
	"layer_norm_epsilon", "new_decoder_architecture", "multi_query", "parallel_attn", "alibi",
	"num_ln_in_parallel_attn", "activation", "rope_theta", "rope_scaling", "rope_parameters",
	"apply_residual_connection_post_layernorm", NULL};

static const char *const NEOX_T[] = {"gpt_neox", NULL};
static const DimKey NEOX_D[] = {
	{D_H, "hidden_size", 6144}, {D_L, "num_hidden_layers", 44},
	{D_A, "num_attention_heads", 64}, {D_I, "intermediate_size", 24576},
	{D_V, "vocab_size", 50432}, {D_POS, "max_position_embeddings", 2048}, {0, NULL, 0}};
/* use_parallel_residual: attention and MLP side by side, a norm each */
static const SwitchKey NEOX_SW[] = {
	SW("use_parallel_residual", 1, parallel, 2, 0), SW("attention_bias", 1, qkv_bias, 1, 0),
	SW("attention_bias", 1, o_bias, 1, 0), SW("tie_word_embeddings", 0, tied, 1, 0),
	{NULL, 0, 0, 0, 0}};
static const char *const NEOX_K[] = {
	"hidden_act", "layer_norm_eps", "rotary_pct", "rotary_emb_base", "rope_theta",
	"rope_scaling", "rope_parameters", "partial_rotary_factor", "classifier_dropout", NULL};

static const char *const GPTJ_T[] = {"gptj", NULL};
static const DimKey GPTJ_D[] = {
	{D_H, "n_embd", 4096}, {D_H, "hidden_size", 4096}, {D_L, "n_layer", 28},
	{D_L, "num_hidden_layers", 28}, {D_A, "n_head", 16}, {D_A, "num_attention_heads", 16},
	{D_I, "n_inner", UNSET}, {D_V, "vocab_size", 50400}, {D_POS, "n_positions", 2048},
	{D_POS, "max_position_embeddings", 2048}, {0, NULL, 0}};
static const DropKey GPTJ_DROP[] = {
	{"attn_pdrop", 0.0, 1}, {"resid_pdrop", 0.0, 0}, {"embd_pdrop", 0.0, 0}, {NULL, 0, 0}};
static const char *const GPTJ_K[] = {
	"rotary_dim", "rotary", "activation_function", "layer_norm_epsilon", "scale_attn_weights",
	"summary_type", "summary_use_proj", "summary_activation", "summary_proj_to_labels",
	"summary_first_dropout", "n_ctx", NULL};

static const char *const BIGCODE_T[] = {"gpt_bigcode", NULL};
static const char *const BIGCODE_K[] = {
	"activation_function", "layer_norm_epsilon", "scale_attn_weights", "multi_query",
	"attention_softmax_in_fp32", "scale_attention_softmax_in_fp32", "summary_type",
	"summary_use_proj", "summary_activation", "summary_proj_to_labels", "summary_first_dropout",
	"n_ctx", "inference_runner", "max_batch_size", "max_sequence_length", "pad_key_length",
	"pre_allocate_kv_cache", "validate_runner_input", NULL};

static const char *const SC2_T[] = {"starcoder2", NULL};
static const DimKey SC2_D[] = {
	{D_H, "hidden_size", 3072}, {D_L, "num_hidden_layers", 30},
	{D_A, "num_attention_heads", 24}, {D_KV, "num_key_value_heads", 2},
	{D_I, "intermediate_size", 12288}, {D_V, "vocab_size", 49152},
	{D_POS, "max_position_embeddings", 4096}, {0, NULL, 0}};
/* use_bias on every linear layer */
static const SwitchKey SC2_SW[] = {
	SW("use_bias", 1, qkv_bias, 1, 0), SW("use_bias", 1, o_bias, 1, 0),
	SW("use_bias", 1, mlp_bias, 1, 0), SW("tie_word_embeddings", 1, tied, 1, 0),
	{NULL, 0, 0, 0, 0}};
static const DropKey SC2_DROP[] = {
	{"residual_dropout", 0.0, 0}, {"embedding_dropout", 0.0, 0}, {"attention_dropout", 0.0, 1},
	{NULL, 0, 0}};
static const char *const SC2_K[] = {
	"hidden_act", "norm_epsilon", "norm_type", "mlp_type", "rope_theta", "rope_scaling",
	"rope_parameters", "sliding_window", NULL};

static const char *const OLMO2_T[] = {"olmo2", NULL};
static const DimKey OLMO2_D[] = {
	{D_H, "hidden_size", 4096}, {D_L, "num_hidden_layers", 32},
	{D_A, "num_attention_heads", 32}, {D_KV, "num_key_value_heads", UNSET},
	{D_I, "intermediate_size", 11008}, {D_V, "vocab_size", 50304},
	{D_POS, "max_position_embeddings", 2048}, {0, NULL, 0}};
static const char *const OLMO2_K[] = {
	"hidden_act", "rms_norm_eps", "rope_theta", "rope_scaling", "rope_parameters", NULL};

static const char *const OPT_T[] = {"opt", NULL};
static const DimKey OPT_D[] = {
	{D_H, "hidden_size", 768}, {D_L, "num_hidden_layers", 12},
	{D_A, "num_attention_heads", 12}, {D_I, "ffn_dim", 3072}, {D_V, "vocab_size", 50272},
	{D_POS, "max_position_embeddings", 2048}, {D_EMBED_DIM, "word_embed_proj_dim", UNSET},
	{0, NULL, 0}};
static const SwitchKey OPT_SW[] = {
	SW("enable_bias", 1, qkv_bias, 1, 0), SW("enable_bias", 1, o_bias, 1, 0),
	SW("enable_bias", 1, mlp_bias, 1, 0), SW("tie_word_embeddings", 1, tied, 1, 0),
	{NULL, 0, 0, 0, 0}};
static const DropKey OPT_DROP[] = {{"dropout", 0.1, 0}, {"attention_dropout", 0.0, 1}, {NULL, 0, 0}};
static const char *const OPT_K[] = {
	"activation_function", "do_layer_norm_before", "layer_norm_elementwise_affine", "layerdrop",
	"init_std", "activation_dropout", "scale_embedding", NULL};

static const char *const BLOOM_T[] = {"bloom", NULL};
/* BLOOM has no position table (ALiBi): max_position is only the default sequence length */
static const DimKey BLOOM_D[] = {
	{D_H, "hidden_size", 64}, {D_H, "n_embed", 64}, {D_L, "n_layer", 2},
	{D_L, "num_hidden_layers", 2}, {D_A, "n_head", 8}, {D_A, "num_attention_heads", 8},
	{D_V, "vocab_size", 250880}, {D_POS, "seq_length", 2048}, {0, NULL, 0}};
static const char *const BLOOM_K[] = {
	"layer_norm_epsilon", "apply_residual_connection_post_layernorm", "pretraining_tp",
	"slow_but_exact", "attention_softmax_in_fp32", "bias_dropout_fusion",
	"masked_softmax_fusion", "offset_alibi", "skip_bias_add", "skip_bias_add_qkv", "n_inner",
	NULL};

static const char *const T5_T[] = {"t5", NULL};
static const DimKey T5_D[] = {
	{D_H, "d_model", 512}, {D_H, "hidden_size", 512}, {D_HEAD, "d_kv", 64}, {D_I, "d_ff", 2048},
	{D_L, "num_layers", 6}, {D_L, "num_hidden_layers", 6}, {D_L_DEC, "num_decoder_layers", UNSET},
	{D_A, "num_heads", 8}, {D_A, "num_attention_heads", 8}, {D_V, "vocab_size", 32128},
	{D_BUCKETS, "relative_attention_num_buckets", 32}, {D_POS, "n_positions", 512},
	{0, NULL, 0}};
static const DropKey T5_DROP[] = {{"dropout_rate", 0.1, 0}, {"dropout_rate", 0.1, 1}, {NULL, 0, 0}};
static const char *const T5_K[] = {
	"relative_attention_max_distance", "layer_norm_epsilon", "initializer_factor",
	"feed_forward_proj", "dense_act_fn", "is_gated_act", "classifier_dropout", "output_past",
	NULL};

static const char *const DSV2_T[] = {"deepseek_v2", NULL};
static const DimKey DSV2_D[] = {
	{D_H, "hidden_size", 4096}, {D_L, "num_hidden_layers", 30},
	{D_A, "num_attention_heads", 32}, {D_KV, "num_key_value_heads", 32},
	{D_I, "intermediate_size", 11008}, {D_V, "vocab_size", 102400},
	{D_POS, "max_position_embeddings", 2048}, {D_EXPERTS, "n_routed_experts", 0},
	{D_TOPK, "num_experts_per_tok", 1}, {D_MOE_I, "moe_intermediate_size", 1407},
	{D_SHARED_N, "n_shared_experts", 0}, {D_FIRST_DENSE, "first_k_dense_replace", 0},
	{D_MOE_FREQ, "moe_layer_freq", 1}, {D_Q_LORA, "q_lora_rank", 1536},
	{D_KV_LORA, "kv_lora_rank", 512}, {D_ROPE, "qk_rope_head_dim", 64},
	{D_NOPE, "qk_nope_head_dim", 128}, {D_VHEAD, "v_head_dim", 128}, {0, NULL, 0}};
static const char *const DS_K[] = {
	"hidden_act", "rms_norm_eps", "rope_theta", "rope_scaling", "rope_parameters",
	"rope_interleave", "pretraining_tp", "ep_size", "routed_scaling_factor", "topk_method",
	"n_group", "topk_group", "norm_topk_prob", "scoring_func", "aux_loss_alpha", "seq_aux",
	"num_nextn_predict_layers", "qk_head_dim", "head_dim", NULL};

static const char *const DSV3_T[] = {"deepseek_v3", NULL};
static const DimKey DSV3_D[] = {
	{D_H, "hidden_size", 7168}, {D_L, "num_hidden_layers", 61},
	{D_A, "num_attention_heads", 128}, {D_KV, "num_key_value_heads", 128},
	{D_I, "intermediate_size", 18432}, {D_V, "vocab_size", 129280},
	{D_POS, "max_position_embeddings", 4096}, {D_EXPERTS, "n_routed_experts", 256},
	{D_EXPERTS, "num_local_experts", 256}, {D_TOPK, "num_experts_per_tok", 8},
	{D_MOE_I, "moe_intermediate_size", 2048}, {D_SHARED_N, "n_shared_experts", 1},
	{D_FIRST_DENSE, "first_k_dense_replace", 3}, {D_MOE_FREQ, "moe_layer_freq", 1},
	{D_Q_LORA, "q_lora_rank", 1536}, {D_KV_LORA, "kv_lora_rank", 512},
	{D_ROPE, "qk_rope_head_dim", 64}, {D_NOPE, "qk_nope_head_dim", 128},
	{D_VHEAD, "v_head_dim", 128}, {0, NULL, 0}};

static const ModelFamily FAMILIES[] = {
	{GPT2_T, GPT2_D, TIE_ON, GPT2_DROP, GPT2_K,
	 {.norm = NORM_LAYER, .qkv_fused = 1, .qkv_bias = 1, .o_bias = 1, .mlp_bias = 1,
	  .causal = 1, .pos = POS_LEARNED, .final_norm = 1, .lm_head = 1}, NULL, NULL},
	{LLAMA_T, LLAMA_D, LLAMA_SW, ATTN_DROP, LLAMA_K, {DECODER_RMS}, NULL, NULL},
	{MISTRAL_T, MISTRAL_D, UNTIED, ATTN_DROP, MISTRAL_K, {DECODER_RMS}, NULL, NULL},
	{MIXTRAL_T, MIXTRAL_D, UNTIED, ATTN_DROP, MIXTRAL_K, {DECODER_RMS}, NULL, NULL},
	{BERT_T, BERT_D, TIE_ON, BERT_DROP, BERT_K,
	 {.norm = NORM_LAYER, .place = NORM_POST, .qkv_bias = 1, .o_bias = 1, .mlp_bias = 1,
	  .pos = POS_LEARNED, .embed_norm = 1, .pooler = 1}, NULL, BERT_HEADS},
	{QWEN2_T, QWEN2_D, UNTIED, ATTN_DROP, QWEN2_K, {DECODER_RMS, .qkv_bias = 1}, NULL, NULL},
	{QWEN2_MOE_T, QWEN2_MOE_D, QWEN2_MOE_SW, ATTN_DROP, QWEN2_MOE_K, {DECODER_RMS},
	 hook_qwen2_moe, NULL},
	{QWEN3_T, QWEN3_D, BIAS_UNTIED, ATTN_DROP, QWEN2_K, {DECODER_RMS, .qk_norm = QKNORM_HEAD},
	 NULL, NULL},
	{GEMMA_T, GEMMA_D, BIAS_TIED, ATTN_DROP, GEMMA_K, {DECODER_RMS}, NULL, NULL},
	{GEMMA2_T, GEMMA2_D, BIAS_TIED, ATTN_DROP, GEMMA2_K, {DECODER_RMS, .place = NORM_SANDWICH},
	 hook_gemma2, NULL},
	{PHI3_T, PHI3_D, UNTIED, PHI_DROP, PHI3_K,
	 {DECODER_RMS, .qkv_fused = 1, .gate_up_fused = 1}, NULL, NULL},
	{PHI_T, PHI_D, UNTIED, PHI_DROP, PHI_K,
	 {.norm = NORM_LAYER, .parallel = 1, .qkv_bias = 1, .o_bias = 1, .mlp_bias = 1,
	  .causal = 1, .pos = POS_ROTARY, .final_norm = 1, .lm_head = 1, .head_bias = 1},
	 hook_phi, NULL},
	{FALCON_T, FALCON_D, FALCON_SW, HIDDEN_ATTN_DROP, FALCON_K,
	 {.norm = NORM_LAYER, .qkv_fused = 1, .causal = 1, .final_norm = 1, .lm_head = 1},
	 hook_falcon, NULL},
	{NEOX_T, NEOX_D, NEOX_SW, HIDDEN_ATTN_DROP, NEOX_K,
	 {.norm = NORM_LAYER, .qkv_fused = 1, .mlp_bias = 1, .causal = 1, .pos = POS_ROTARY,
	  .final_norm = 1, .lm_head = 1}, NULL, NULL},
	{GPTJ_T, GPTJ_D, UNTIED, GPTJ_DROP, GPTJ_K,
	 {.norm = NORM_LAYER, .parallel = 1, .mlp_bias = 1, .causal = 1, .pos = POS_ROTARY,
	  .final_norm = 1, .lm_head = 1, .head_bias = 1}, NULL, NULL},
	{BIGCODE_T, GPT2_D, TIE_ON, GPT2_DROP, BIGCODE_K,
	 {.norm = NORM_LAYER, .qkv_fused = 1, .qkv_bias = 1, .o_bias = 1, .mlp_bias = 1,
	  .causal = 1, .pos = POS_LEARNED, .final_norm = 1, .lm_head = 1}, hook_bigcode, NULL},
	{SC2_T, SC2_D, SC2_SW, SC2_DROP, SC2_K,
	 {.norm = NORM_LAYER, .causal = 1, .pos = POS_ROTARY, .final_norm = 1, .lm_head = 1},
	 NULL, NULL},
	{OLMO2_T, OLMO2_D, BIAS_UNTIED, ATTN_DROP, OLMO2_K,
	 {DECODER_RMS, .place = NORM_OUTPUT, .qk_norm = QKNORM_WIDTH}, NULL, NULL},
	{OPT_T, OPT_D, OPT_SW, OPT_DROP, OPT_K,
	 {.norm = NORM_LAYER, .causal = 1, .pos = POS_LEARNED, .pos_offset = 2, .final_norm = 1,
	  .lm_head = 1}, hook_opt, NULL},
	{BLOOM_T, BLOOM_D, TIE_ON, HIDDEN_ATTN_DROP, BLOOM_K,
	 {.norm = NORM_LAYER, .qkv_fused = 1, .qkv_bias = 1, .o_bias = 1, .mlp_bias = 1,
	  .causal = 1, .pos = POS_ALIBI, .embed_norm = 1, .final_norm = 1, .lm_head = 1}, NULL, NULL},
	{T5_T, T5_D, TIE_ON, T5_DROP, T5_K,
	 {.norm = NORM_RMS, .causal = 1, .pos = POS_RELATIVE, .final_norm = 1, .lm_head = 1},
	 hook_t5, NULL},
	{DSV2_T, DSV2_D, LLAMA_SW, ATTN_DROP, DS_K, {DECODER_RMS, .mla = 1}, hook_deepseek, NULL},
	{DSV3_T, DSV3_D, LLAMA_SW, ATTN_DROP, DS_K, {DECODER_RMS, .mla = 1}, hook_deepseek, NULL},
};

#define N_FAMILIES ((int)(sizeof(FAMILIES) / sizeof(FAMILIES[0])))

/* ---- lookup ---- */

int family_has_name(const ModelFamily *f, const char *type)
{
	for (int i = 0; f->types[i]; i++)
		if (!strcmp(f->types[i], type))
			return 1;
	return 0;
}

const ModelFamily *family_find(const char *type)
{
	for (int i = 0; i < N_FAMILIES; i++)
		if (family_has_name(&FAMILIES[i], type))
			return &FAMILIES[i];
	return NULL;
}

const char *family_infer(const JsonObj *o)
{
	if (cJSON_HasObjectItem(o->obj, "n_embd"))
		return "gpt2";
	if (cJSON_HasObjectItem(o->obj, "type_vocab_size"))
		return "bert";
	return "llama";
}

void family_list(char *buf, size_t n)
{
	size_t len = 0;
	buf[0] = '\0';
	for (int i = 0; i < N_FAMILIES; i++)
		for (int j = 0; FAMILIES[i].types[j] && len < n; j++)
			len += (size_t)snprintf(buf + len, n - len, "%s%s", len ? ", " : "",
						FAMILIES[i].types[j]);
}

/* ---- reading ---- */

#define MAX_KNOWN 256

/* Every key the family knows: the common ones, its dimension, switch and dropout keys, and its
 * configuration class's others. */
static int known_keys(const ModelFamily *f, const char *out[MAX_KNOWN])
{
	int n = 0;
	for (int i = 0; COMMON[i] && n < MAX_KNOWN - 1; i++)
		out[n++] = COMMON[i];
	for (int i = 0; f->dims[i].key && n < MAX_KNOWN - 1; i++)
		out[n++] = f->dims[i].key;
	for (int i = 0; f->switches[i].key && n < MAX_KNOWN - 1; i++)
		out[n++] = f->switches[i].key;
	for (int i = 0; f->drops[i].key && n < MAX_KNOWN - 1; i++)
		out[n++] = f->drops[i].key;
	for (int i = 0; f->known[i] && n < MAX_KNOWN - 1; i++)
		out[n++] = f->known[i];
	out[n] = NULL;
	return n;
}

/* the dimensions that must be positive when given */
static long long dim_min(Dim d)
{
	return d == D_H || d == D_L || d == D_A || d == D_KV || d == D_HEAD || d == D_VHEAD ||
		       d == D_I || d == D_V || d == D_POS || d == D_TOPK || d == D_MOE_FREQ ||
		       d == D_SPARSE_STEP ?
		       1 :
		       0;
}

static int read_dims(const ModelFamily *f, const JsonObj *o, long long dim[N_DIMS], PxError *err)
{
	int seen[N_DIMS] = {0};
	for (int d = 0; d < N_DIMS; d++)
		dim[d] = UNSET;
	for (int i = 0; f->dims[i].key; i++) {
		const DimKey *k = &f->dims[i];
		long long v;
		if (seen[k->dim] == 2)
			continue; /* an earlier key gave it */
		const cJSON *item = cJSON_GetObjectItemCaseSensitive(o->obj, k->key);
		if (item && cJSON_IsNull(item)) { /* None, as transformers reads it: derived */
			dim[k->dim] = UNSET;
			seen[k->dim] = 2;
			continue;
		}
		int rc = jobj_int(o, k->key, dim_min(k->dim), BIG, k->dflt, &v, err);
		if (rc < 0)
			return -1;
		if (rc == 1 || !seen[k->dim]) /* given, or the first key's default */
			dim[k->dim] = v;
		seen[k->dim] = rc == 1 ? 2 : 1;
	}
	return 0;
}

static int read_switches(const ModelFamily *f, const JsonObj *o, ModelLayout *y, PxError *err)
{
	for (int i = 0; f->switches[i].key; i++) {
		const SwitchKey *s = &f->switches[i];
		int on;
		if (jobj_bool(o, s->key, s->dflt, &on, err) < 0)
			return -1;
		*(int *)((char *)y + s->offset) = on ? s->on : s->off;
	}
	return 0;
}

static int read_drops(const ModelFamily *f, const JsonObj *o, ModelSpec *m, PxError *err)
{
	for (int i = 0; f->drops[i].key; i++) {
		double p;
		if (jobj_num(o, f->drops[i].key, 0, 1, f->drops[i].dflt, &p, err) < 0)
			return -1;
		if (p > 0 && f->drops[i].attn)
			m->attn_dropout = 1;
		else if (p > 0)
			m->dropout = 1;
	}
	return 0;
}

static int ends_with(const char *s, const char *tail)
{
	size_t n = strlen(s), k = strlen(tail);
	return n >= k && !strcmp(s + n - k, tail);
}

/* The classifier class arch names for m, a decoder-only causal LM, by its name's ending; NULL
 * when it names none, or m has no such classes. */
static const CausalHead *causal_head(const ModelSpec *m, const char *arch)
{
	for (size_t i = 0; m->lay.causal && !m->lay.L_enc &&
			   i < sizeof(CAUSAL_HEADS) / sizeof(CAUSAL_HEADS[0]); i++)
		if (ends_with(arch, CAUSAL_HEADS[i].tail))
			return &CAUSAL_HEADS[i];
	return NULL;
}

int family_set_architecture(ModelSpec *m, const char *arch, const char *where, PxError *err)
{
	const ModelFamily *f = m->family;
	if (!f)
		return px_fail(err, PX_ERR_INPUT, "%s: architecture \"%s\" needs a model "
			       "architecture; the model gives only num_parameters", where, arch);
	if (!f->heads) {
		ModelLayout *y = &m->lay;
		if (ends_with(arch, "ForCausalLM") || ends_with(arch, "LMHeadModel") ||
		    ends_with(arch, "ForConditionalGeneration")) { /* the family's own head */
			y->lm_head = 1;
			y->cls_labels = 0;
			m->arch[0] = '\0';
			return 0;
		}
		const CausalHead *k = causal_head(m, arch);
		if (k) {
			y->lm_head = 0; /* (head_bias kept for an LM class later) */
			y->cls_labels = k->labels < 0 ? m->num_labels : k->labels;
			y->cls_tokens = 1;
			y->cls_bias = k->bias;
			y->cls_dropout = k->dropout;
			snprintf(m->arch, sizeof(m->arch), "%s", arch);
			return 0;
		}
		return px_fail(err, PX_ERR_INPUT, "%s: architecture: \"%s\": a %s model is priced with "
			       "its language-model head (...ForCausalLM, ...LMHeadModel) or a "
			       "classifier (...ForSequenceClassification, ...ForTokenClassification, "
			       "...ForQuestionAnswering); other heads are modelled for bert", where,
			       arch, m->type);
	}
	const HeadRow *r = f->heads;
	while (r->arch && strcmp(r->arch, arch))
		r++;
	if (!r->arch) {
		char known[1024];
		size_t len = 0;
		for (const HeadRow *k = f->heads; k->arch && len < sizeof(known); k++)
			len += (size_t)snprintf(known + len, sizeof(known) - len, "%s%s",
						len ? ", " : "", k->arch);
		return px_fail(err, PX_ERR_INPUT, "%s: architecture: \"%s\" is not a %s class "
			       "Parallax prices; expected one of %s", where, arch, m->type, known);
	}
	ModelLayout *y = &m->lay;
	y->pooler = r->pooler;
	y->lm_head = y->head_transform = y->head_bias = r->mlm;
	y->cls_labels = r->labels < 0 ? m->num_labels : r->labels;
	y->cls_tokens = r->per_token;
	y->cls_bias = 1;
	y->cls_dropout = r->dropout;
	y->causal = r->causal;
	snprintf(m->arch, sizeof(m->arch), "%s", r->arch);
	return 0;
}

/* The head the config's class has, with the config's num_labels (else id2label's size;
 * PretrainedConfig's default 2): for a family with several, the class its architectures names
 * first (the family's first class when it names none; a class the family has not, warned about,
 * priced as that first); for a causal LM a classifier class (...ForSequenceClassification and
 * the others of CAUSAL_HEADS), anything else its LM. */
static int read_head(const ModelFamily *f, const JsonObj *o, ModelSpec *m, PxNotes *notes,
		     PxError *err)
{
	const cJSON *id2label = cJSON_GetObjectItemCaseSensitive(o->obj, "id2label");
	long long labels = cJSON_IsObject(id2label) ? cJSON_GetArraySize(id2label) : 2;
	if (jobj_int(o, "num_labels", 1, 1 << 20, labels > 0 ? labels : 2, &m->num_labels, err) < 0)
		return -1;
	const cJSON *list = cJSON_GetObjectItemCaseSensitive(o->obj, "architectures");
	const cJSON *first = cJSON_IsArray(list) ? cJSON_GetArrayItem(list, 0) : NULL;
	char where[512];
	jobj_where(o, "architectures", where, sizeof(where));
	if (!f->heads) /* a causal LM's classifier class (a reward model's config); else its LM */
		return cJSON_IsString(first) && causal_head(m, first->valuestring) ?
			       family_set_architecture(m, first->valuestring, where, err) :
			       0;
	const char *arch = cJSON_IsString(first) ? first->valuestring : f->heads[0].arch;
	if (!family_set_architecture(m, arch, where, err))
		return 0;
	if (px_notes_warn(notes, "%s: %s.architectures: %s is not a class Parallax prices; priced "
			  "as %s", where, o->name, arch, f->heads[0].arch))
		return px_fail(err, PX_ERR_RUNTIME, "out of memory");
	return family_set_architecture(m, f->heads[0].arch, where, err);
}

static long long or_else(long long v, long long dflt)
{
	return v == UNSET ? dflt : v;
}

/* The dimensions into m, the derived defaults filled in, and what no config may say refused. */
static int set_dims(const JsonObj *o, ModelSpec *m, const long long dim[N_DIMS], PxError *err)
{
	static const Dim needed[] = {D_H, D_L, D_A, D_V};
	for (int i = 0; i < 4; i++)
		if (dim[needed[i]] < 1)
			return px_fail(err, PX_ERR_INPUT, "%s: %s: the hidden size, layers, heads and "
				       "vocabulary must be positive integers, not null", o->doc->path,
				       o->name);
	m->h = dim[D_H], m->L = dim[D_L], m->a = dim[D_A], m->V = m->vocab_size = dim[D_V];
	m->kv_heads = or_else(dim[D_KV], m->a);
	m->I = or_else(dim[D_I], 4 * m->h);
	m->max_pos = or_else(dim[D_POS], 2048);
	m->lay.type_vocab = or_else(dim[D_TYPES], 0);
	m->lay.rel_buckets = m->lay.pos == POS_RELATIVE ? or_else(dim[D_BUCKETS], 32) : 0;
	if (m->lay.mla) { /* q and k heads: a non-rotary part and the rotary one */
		m->rope_dim = dim[D_ROPE];
		m->head_dim = dim[D_NOPE] + dim[D_ROPE];
		m->q_lora = or_else(dim[D_Q_LORA], 0);
		m->kv_lora = dim[D_KV_LORA];
		if (m->rope_dim < 0 || dim[D_NOPE] < 1 || m->kv_lora <= 0)
			return px_fail(err, PX_ERR_INPUT, "%s: %s: multi-head latent attention needs "
				       "qk_nope_head_dim and kv_lora_rank above 0", o->doc->path,
				       o->name);
	} else if (dim[D_HEAD] != UNSET) {
		m->head_dim = dim[D_HEAD];
	} else {
		if (m->h % m->a)
			return px_fail(err, PX_ERR_INPUT, "%s: %s: hidden size %lld must divide by "
				       "heads %lld (or give head_dim)", o->doc->path, o->name, m->h,
				       m->a);
		m->head_dim = m->h / m->a;
	}
	m->v_head_dim = or_else(dim[D_VHEAD], m->head_dim);
	if (m->kv_heads > m->a || m->a % m->kv_heads)
		return px_fail(err, PX_ERR_INPUT, "%s: %s: %lld attention heads must divide into "
			       "groups of key/value heads, got %lld key/value heads", o->doc->path,
			       o->name, m->a, m->kv_heads);
	/* MoE */
	m->experts = or_else(dim[D_EXPERTS], 0);
	if (m->experts) {
		m->top_k = or_else(dim[D_TOPK], 1);
		if (m->top_k > m->experts)
			return px_fail(err, PX_ERR_INPUT, "%s: %s: %lld experts per token but only "
				       "%lld experts", o->doc->path, o->name, m->top_k, m->experts);
	}
	m->moe_I = or_else(dim[D_MOE_I], 0);
	m->shared_I = dim[D_SHARED_I] != UNSET ? dim[D_SHARED_I] :
					       or_else(dim[D_SHARED_N], 0) * m->moe_I;
	m->first_dense = or_else(dim[D_FIRST_DENSE], 0);
	m->moe_freq = or_else(dim[D_MOE_FREQ], 1);
	m->moe_interval = or_else(dim[D_SPARSE_STEP], 1);
	/* two stacks: the encoder's layers, then the decoder's */
	if (m->lay.pos == POS_RELATIVE) {
		m->lay.L_enc = m->L;
		m->L += or_else(dim[D_L_DEC], m->L);
	}
	return 0;
}

/* Each family's known keys, sorted once for the whole process (a sweep reads a config per
 * point, on several threads). */
static JsonKeySet known_sets[N_FAMILIES];
static int known_sets_failed;
static pthread_once_t known_sets_once = PTHREAD_ONCE_INIT;

static void sort_known_sets(void)
{
	for (int i = 0; i < N_FAMILIES; i++) {
		const char *known[MAX_KNOWN];
		known_keys(&FAMILIES[i], known);
		known_sets_failed |= jkeys_sort(&known_sets[i], known);
	}
}

int family_read(const ModelFamily *f, const JsonObj *o, ModelSpec *m, PxNotes *notes,
		PxError *err)
{
	long long dim[N_DIMS];

	pthread_once(&known_sets_once, sort_known_sets);
	if (known_sets_failed || jobj_check_keyset(o, &known_sets[f - FAMILIES], notes))
		return px_fail(err, PX_ERR_RUNTIME, "out of memory");
	m->family = f;
	m->lay = f->layout;
	if (read_dims(f, o, dim, err) || read_switches(f, o, &m->lay, err) ||
	    read_drops(f, o, m, err))
		return -1;
	if (f->hook && f->hook(o, m, dim, err))
		return -1;
	/* GPT2Config's and GPTJConfig's default, which a config.json without the key gets */
	const char *act, *dflt = model_is_family(m, "gpt2") || model_is_family(m, "gptj") ?
					 "gelu_new" : "";
	if (jobj_str(o, "activation_function", dflt, &act, err) < 0)
		return -1;
	m->gelu_new = !strcmp(act, "gelu_new");
	/* the head after the dimensions: whether the model is an encoder-decoder (L_enc) is
	 * known only then, as when a scenario's "architecture" sets it */
	return set_dims(o, m, dim, err) || read_head(f, o, m, notes, err) ? -1 : 0;
}

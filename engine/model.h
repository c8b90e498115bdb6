/* model: a transformer described by a Hugging Face config.json (GPT-2, Llama/Mistral, BERT) or by a
 * bare parameter count. Owns the architecture, its tensors per layer unit and its parameter count.
 * It does not know about parallelism or precision (plan.c) or activations (activ.c). */
#ifndef PX_MODEL_H
#define PX_MODEL_H

#include "jdoc.h"

/* Dimension names used across the engine:
 * h = hidden size, L = transformer blocks, a = attention heads, kv = key/value width (GQA),
 * I = MLP intermediate size, V = vocabulary, s = sequence length, b = micro-batch. */

typedef enum { ARCH_GPT2, ARCH_LLAMA, ARCH_BERT, ARCH_PARAMS_ONLY } ModelArch;

typedef struct ModelSpec {
	char type[32];       /* model_type as written ("gpt2", "llama", "mistral", "bert", "params") */
	ModelArch arch;
	long long h, L, a, kv_heads, I, V, max_pos, type_vocab;
	int gated_mlp;       /* SwiGLU: gate, up, down (Llama) instead of fc, proj (GPT-2) */
	int norm_bias;       /* LayerNorm has a bias; RMSNorm does not */
	int linear_bias;     /* linear layers carry biases (GPT-2, BERT) */
	int learned_pos;     /* a position-embedding table (GPT-2, BERT) rather than rotary */
	int tied;            /* LM head shares the token embedding */
	int has_lm_head;     /* BERT's encoder has none; a pooler instead */
	int dropout;         /* dropout masks are kept for backward (GPT-2, BERT configs with p > 0) */
	long long experts;   /* E experts in each MoE block's MLP; 0 for a dense model */
	long long top_k;     /* experts per token */
	long long moe_interval; /* every moe_interval-th block is an MoE block */
	double n_params;     /* the whole model's parameter count */
} ModelSpec;

/* Layer units, in forward order: 0 = embeddings, 1..L = transformer blocks, L+1 = head (final norm,
 * untied LM head or BERT pooler). A params-only model is L equal blocks and empty ends. */
static inline int model_n_units(const ModelSpec *m) { return (int)m->L + 2; }

#define MODEL_MAX_TENSORS 24

typedef struct ModelTensor {
	const char *name;  /* "attn.c_attn.weight" */
	long long numel;   /* all of it: every expert's, whole across tensor-parallel ranks */
	int tp_split;      /* split over tensor-parallel ranks (Megatron column/row/vocab split) */
	int expert;        /* one per expert (numel counts all E); split over expert-parallel ranks */
} ModelTensor;

/* The tensors a unit owns (not the tied embedding the head borrows); returns their count. */
int model_unit_tensors(const ModelSpec *m, int unit, ModelTensor out[MODEL_MAX_TENSORS]);
long long model_unit_params(const ModelSpec *m, int unit);
/* Whether block unit (1..L) has an MoE MLP. */
int model_unit_is_moe(const ModelSpec *m, int unit);
/* Elements the head borrows from the embeddings when the LM head is tied (V*h), else 0. */
long long model_tied_elems(const ModelSpec *m);

/* Read a model object: a Hugging Face config.json (Mixtral's gives experts), or {"num_parameters": N[, "num_hidden_layers": L]}.
 * Unknown keys are not warned about (config.json files carry many unrelated keys). */
int model_parse(const JsonObj *o, ModelSpec *m, PxNotes *notes, PxError *err);

/* Parameter count from the architecture. */
double model_count_params(const ModelSpec *m);

#endif

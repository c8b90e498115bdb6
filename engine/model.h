/* model: a transformer as its family composes it, or a bare parameter count. Owns what follows from
 * the composition: the tensors of each layer unit (with their tensor- and expert-parallel split), the
 * parameter count, and each unit's matrix products (GEMMs) and their FLOPs. Reading a config.json
 * into a ModelSpec is family.c's; activations are activ.c's; parallel degrees and precision are
 * plan.c's. */
#ifndef PX_MODEL_H
#define PX_MODEL_H

#include "jdoc.h"

/* Dimension names used across the engine:
 * h = hidden size, L = transformer blocks, a = attention heads, kv = key/value heads,
 * d = query/key width per head (h/a unless the config gives head_dim), dv = value width per head,
 * I = MLP intermediate size, V = vocabulary, s = sequence length, b = micro-batch,
 * t = tensor-parallel degree, E = routed experts. */

typedef enum { NORM_LAYER, NORM_RMS } NormKind; /* LayerNorm (weight and bias), RMSNorm (weight) */
/* Where a block's norms sit: before attention and MLP (GPT-2, Llama); after each residual add
 * (BERT, OPT-350m); before and after each (Gemma 2's sandwich); on each branch's output before
 * the add (OLMo 2). */
typedef enum { NORM_PRE, NORM_POST, NORM_SANDWICH, NORM_OUTPUT } NormPlace;
typedef enum { POS_ROTARY, POS_LEARNED, POS_ALIBI, POS_RELATIVE } PosKind;
/* Query/key norms: none, one per head of width d (Qwen3, Phi), or over the whole q and k (OLMo 2). */
typedef enum { QKNORM_NONE, QKNORM_HEAD, QKNORM_WIDTH } QkNorm;

/* How a family composes its blocks and ends: a family's table row (family.c) with the switches
 * its config sets. Everything model.c and activ.c derive reads this, never the family's name. */
typedef struct ModelLayout {
	/* attention */
	int mla;              /* multi-head latent attention (DeepSeek V2/V3): q and kv through
				 low-rank latents (q_lora, kv_lora) with a rotary part of rope_dim */
	int qkv_fused;        /* q, k and v as one matrix (GPT-2's c_attn, NeoX, Falcon, BLOOM, Phi-3) */
	int qkv_bias, o_bias; /* biases on the q/k/v projections and on the output projection */
	QkNorm qk_norm;
	int causal;           /* self-attention under a causal mask (not BERT, not T5's encoder) */
	/* norms */
	NormKind norm;
	NormPlace place;
	int parallel;         /* attention and MLP side by side on the block input: 1 with one norm
				 shared (GPT-J, Phi, Falcon-7B), 2 with a norm each (NeoX, Falcon-40B) */
	/* MLP */
	int gated;            /* gate and up matrices (SwiGLU, GeGLU) instead of one fc */
	int gate_up_fused;    /* gate and up as one matrix (Phi-3) */
	int mlp_bias;         /* biases on the MLP's matrices */
	/* ends */
	PosKind pos;
	long long pos_offset; /* learned positions kept beyond max_pos (OPT's offset of 2) */
	int embed_norm;       /* a norm on the embeddings (BERT, BLOOM) */
	long long embed_dim;  /* the embeddings' width when it is not h (OPT-350m's
				 word_embed_proj_dim, with project_in and project_out); 0 = h */
	int final_norm;       /* a norm before the head (not in BERT, nor OPT-350m) */
	int lm_head;          /* a language-model head (not BertModel's, nor a classifier's) */
	int tied;             /* the head shares the token embedding */
	int head_bias;        /* the head has a bias (Phi, GPT-J, BERT's MLM decoder) */
	int head_transform;   /* a dense layer, its activation and a norm before the LM head
				 (BERT's BertPredictionHeadTransform) */
	int pooler;           /* BERT's pooler: a dense layer and tanh over each sequence's first
				 token */
	long long cls_labels; /* a classifier's outputs: over the pooled first token (BERT's
				 sequence classification, next-sentence prediction) or, cls_tokens,
				 over every token (token classification, question answering, a causal
				 LM's sequence classification, which pools the last token after) */
	int cls_tokens;
	int cls_bias;         /* the classifier has a bias */
	int cls_dropout;      /* a dropout before it (its output a tensor of its own) */
	long long type_vocab; /* BERT's token types */
	/* encoder-decoder (T5) */
	long long L_enc;      /* blocks 1..L_enc are the encoder, the rest the decoder; 0: one stack */
	long long rel_buckets; /* T5's relative attention bias: buckets per head in each stack's first
				 block */
} ModelLayout;

#define MODEL_MAX_DENSE_LIST 64

typedef struct ModelSpec {
	char type[32];       /* model_type as written ("gpt2", "llama", "deepseek_v3", "params") */
	const struct ModelFamily *family; /* its row of the families table; NULL: a bare count */
	long long h, L, a, kv_heads, I, V, max_pos;
	long long vocab_size; /* the tokenizer's: the config's vocab_size, of which V is the padded
				 size under Megatron's make_vocab_size_divisible_by (else equal) */
	long long head_dim;  /* d, q and k width per head */
	long long v_head_dim; /* dv */
	long long q_lora, kv_lora, rope_dim; /* MLA's latents (q_lora 0: a full q projection) and
						the rotary part of d */
	int dropout;         /* dropout on the residual branches and embeddings (masks kept) */
	int attn_dropout;    /* dropout on the attention probabilities */
	/* MoE */
	long long experts;   /* E routed experts in each MoE block; 0 for a dense model */
	long long top_k;     /* experts per token */
	long long moe_interval; /* every moe_interval-th block is an MoE block (1-based) */
	long long moe_I;     /* each routed expert's intermediate size; 0: I */
	long long shared_I;  /* the shared experts' intermediate size together (dense); 0: none */
	int shared_gate;     /* a sigmoid gate on the shared experts' output (Qwen2-MoE) */
	int router_bias;     /* a routing bias per expert (DeepSeek-V3's e_score_correction_bias) */
	int ds_gate;         /* the experts are DeepSpeed's MoE layer (the scenario's "moe" object),
				whose TopKGate gates in fp32 */
	int gelu_new;        /* activation_function "gelu_new": Hugging Face's NewGELUActivation,
				the tanh approximation written in elementwise ops */
	double attn_softcap, final_softcap; /* Gemma-2's logit soft-capping, c tanh(x / c), of
				the attention scores and of the logits (attn_logit_softcapping,
				final_logit_softcapping); 0: none */
	long long first_dense; /* the first blocks keep a dense MLP (DeepSeek's first_k_dense_replace) */
	long long moe_freq;  /* of the others, those whose 0-based index divides by moe_freq */
	int n_dense_list;    /* 0-based blocks listed dense (Qwen2-MoE's mlp_only_layers) */
	long long dense_list[MODEL_MAX_DENSE_LIST];
	ModelLayout lay;
	char arch[64];       /* the Hugging Face class modelled ("BertForMaskedLM"); "" when the
				family has one kind of head */
	long long num_labels; /* the config's classification labels (num_labels, or id2label's) */
	double n_params;     /* the whole model's parameter count */
} ModelSpec;

/* Layer units, in forward order: 0 = embeddings, 1..L = transformer blocks (an encoder-decoder's
 * encoder first), L+1 = head (final norm and LM head; BERT's pooler, MLM head and classifiers, as
 * its class has them). A params-only model is L
 * equal blocks and empty ends. */
static inline int model_n_units(const ModelSpec *m) { return (int)m->L + 2; }
/* Whether the model has an architecture (else only num_parameters). */
static inline int model_known(const ModelSpec *m) { return m->family != NULL; }
/* Whether its family is the one named (its model_type, or an alias the table gives it). */
int model_is_family(const ModelSpec *m, const char *type);
/* Whether its Hugging Face modules are Llama's (modeling_llama.py and the families written after
 * it: llama, mistral, mixtral, qwen2): LlamaRMSNorm, eager_attention_forward with its fp32
 * softmax, rotary embeddings, repeat_kv. */
int model_llama_modules(const ModelSpec *m);
/* Its Hugging Face code is Gemma's (modeling_gemma.py, modeling_gemma2.py): GemmaRMSNorm. */
int model_gemma_modules(const ModelSpec *m);
/* Its Hugging Face eager attention is Llama's eager_attention_forward or a copy of it (Gemma's,
 * with Gemma-2's soft-capping): softmax(dtype=float32) then .to(query.dtype), repeat_kv. */
int model_hf_llama_attention(const ModelSpec *m);

/* Whether its Hugging Face loss upcasts the logits to fp32 before the cross-entropy: a causal
 * LM's (ForCausalLMLoss: logits.float()); BertForMaskedLM's and T5's CrossEntropyLoss take them
 * in their own type. */
int model_hf_loss_upcasts(const ModelSpec *m);

#define MODEL_MAX_TENSORS 32

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
/* A block's kind: blocks of one kind have the same tensors, products and activations (whether
 * it is an MoE block, a decoder block, the first of its stack, the encoder's last); the ends
 * are kinds of their own (negative). Lets a planner walk one block of each kind. */
int model_unit_kind(const ModelSpec *m, int unit);
/* Whether block unit is in an encoder-decoder's decoder (its tokens are the decoder's). */
int model_unit_is_decoder(const ModelSpec *m, int unit);
/* Elements the head borrows from the embeddings when the LM head is tied (V x embedding width),
 * else 0. */
long long model_tied_elems(const ModelSpec *m);

/* ---- matrix products ---- */

typedef enum { GEMM_WEIGHT, GEMM_SCORES, GEMM_CONTEXT } GemmKind;

/* One kind of product in a unit's forward on one rank: `batch` products of M x K by K x N, so
 * 2 M K N batch FLOPs moving (M K + K N + M N) batch elements. Weight products take the rank's
 * slice of the weight (a column-parallel matrix N/t, a row-parallel one K/t); an MoE block's
 * expert products are batched over the rank's local experts, M their tokens each. The attention's
 * two products: scores (QK^T, M = query rows, K = d, N = key rows) and context (AV), batched over
 * the rank's heads and the micro-batch. */
typedef struct ModelGemm {
	GemmKind kind;
	int expert;           /* a routed expert's product */
	int causal;           /* attention under a causal mask */
	double m, k, n, batch;
	double bias_flops;    /* FLOPs the plan has always counted for a bias with this product: 2 per
				 element and token of an expert's bias, or of a dense bias longer than h
				 on this rank (under 0.1% of a block) */
} ModelGemm;

#define MODEL_MAX_GEMMS 40

/* The sizes the products depend on: tokens per micro-batch of the (encoder's) sequence s and the
 * decoder's s_dec, b sequences, t tensor-parallel ranks, ep expert-parallel ranks and the tokens
 * each local expert receives per micro-batch. */
typedef struct GemmShape {
	long long s, s_dec, b;
	int t, ep;
	double expert_tokens;
	/* block-sparse self-attention (sparse_layout.h): the block side, 0 for dense attention, and
	 * the layout's non-zero blocks per head (its mean over heads); the two products then run
	 * over those blocks, each block x block, as DeepSpeed's block-sparse matmuls do */
	long long attn_block;
	double attn_blocks;
} GemmShape;

/* The unit's products in forward order; returns their count (0 for the embeddings' lookups or a
 * params-only model). */
int model_unit_gemms(const ModelSpec *m, int unit, const GemmShape *g,
		     ModelGemm out[MODEL_MAX_GEMMS]);
/* Their FLOPs, bias FLOPs included. */
double model_gemms_flops(const ModelGemm *g, int n);

/* Read a model object: a Hugging Face config.json of a family in family.c's table, or
 * {"num_parameters": N[, "num_hidden_layers": L]}. Keys the family does not know are warned about
 * with the closest known key; an unknown model_type is refused, listing the known ones. */
int model_parse(const JsonObj *o, ModelSpec *m, PxNotes *notes, PxError *err);

/* Parameter count from the architecture. */
double model_count_params(const ModelSpec *m);

#endif

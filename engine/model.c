#include "model.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "family.h"

/* ---- one walk for tensors and products ---- */

/* How a tensor is spread over ranks, and the side a product splits: replicated; Megatron's
 * column split (outputs, and their bias, over t: QKV, the MLP's first matrices, the vocabulary);
 * its row split (inputs over t, the bias whole: the output projections); one per routed expert,
 * spread over expert-parallel ranks. */
enum { REPL, COL, ROW, EXPERT };

/* A unit is walked once, in forward order; the walk records its tensors (t non-NULL), its
 * products (g non-NULL, for the sizes in shape), or both, so the two cannot disagree. */
typedef struct Walk {
	const ModelSpec *m;
	ModelTensor *t;
	int nt;
	ModelGemm *g;
	int ng;
	const GemmShape *shape;
	double tok;          /* the block's tokens per micro-batch (b s, or b s_dec in a decoder) */
	double s_self;       /* its own sequence length */
} Walk;

static void tensor(Walk *w, const char *name, long long numel, int how)
{
	if (!w->t || numel <= 0 || w->nt >= MODEL_MAX_TENSORS)
		return;
	w->t[w->nt++] = (ModelTensor){name, numel, how == COL || how == ROW, how == EXPERT};
}

static void gemm(Walk *w, ModelGemm g)
{
	if (w->g && w->ng < MODEL_MAX_GEMMS)
		w->g[w->ng++] = g;
}

/* A linear layer of `in` inputs and `out` outputs over `tokens` tokens (copies of it when `how`
 * is EXPERT: one per routed expert, each seeing its own tokens). */
static void linear(Walk *w, const char *wname, const char *bname, long long in, long long out,
		   int bias, int how, double tokens)
{
	const ModelSpec *m = w->m;
	long long copies = how == EXPERT ? m->experts : 1;
	tensor(w, wname, copies * in * out, how);
	if (bias)
		tensor(w, bname, copies * out, how == ROW ? REPL : how);
	if (!w->g)
		return;
	const GemmShape *s = w->shape;
	double t = s->t, k = (double)in, n = (double)out, mm = tokens, batch = 1, bias_flops = 0;
	if (how == COL)
		n /= t;
	else if (how == ROW)
		k /= t;
	if (how == EXPERT) { /* the rank's local experts, each over the tokens routed to it */
		batch = (double)m->experts / s->ep;
		mm = s->expert_tokens;
		bias_flops = bias ? 2 * batch * mm * n : 0;
	} else if (bias && (how == COL ? n : (double)out) > (double)m->h) {
		bias_flops = 2 * mm * (how == COL ? n : (double)out);
	}
	gemm(w, (ModelGemm){GEMM_WEIGHT, how == EXPERT, 0, mm, k, n, batch, bias_flops});
}

static void norm(Walk *w, const char *wname, const char *bname, long long width)
{
	tensor(w, wname, width, REPL);
	if (w->m->lay.norm == NORM_LAYER)
		tensor(w, bname, width, REPL);
}

/* QK^T and AV over the rank's heads: s_q query rows against s_kv key rows; self-attention under
 * a block-sparse layout over its blocks only. */
static void attention_products(Walk *w, long long dqk, long long dv, double s_q, double s_kv,
			       int causal, int self)
{
	if (!w->g)
		return;
	double batch = (double)w->shape->b * (double)w->m->a / w->shape->t;
	long long blk = w->shape->attn_block;
	if (blk > 0 && self) { /* block-sparse self-attention: the layout's blocks only */
		batch *= w->shape->attn_blocks;
		s_q = s_kv = (double)blk;
		causal = 0; /* the layout says which blocks; each is computed whole */
	}
	gemm(w, (ModelGemm){GEMM_SCORES, 0, causal, s_q, (double)dqk, s_kv, batch, 0});
	gemm(w, (ModelGemm){GEMM_CONTEXT, 0, causal, s_q, s_kv, (double)dv, batch, 0});
}

/* ---- blocks ---- */

typedef struct AttnNames {
	const char *q, *qb, *k, *kb, *v, *vb, *o, *ob;
} AttnNames;

static const AttnNames SELF = {"attn.q.weight", "attn.q.bias", "attn.k.weight", "attn.k.bias",
			       "attn.v.weight", "attn.v.bias", "attn.o.weight", "attn.o.bias"};
static const AttnNames CROSS = {"xattn.q.weight", "xattn.q.bias", "xattn.k.weight",
				"xattn.k.bias", "xattn.v.weight", "xattn.v.bias", "xattn.o.weight",
				"xattn.o.bias"};

/* Multi-head latent attention (DeepSeek-V2, section 2.1): q from h through a q_lora latent (or
 * directly), k and v from one kv_lora latent plus a shared rotary key of rope_dim; the latents
 * are replicated, the per-head up-projections split by heads. */
static void mla_projections(Walk *w)
{
	const ModelSpec *m = w->m;
	long long h = m->h, a = m->a, d = m->head_dim, bias = m->lay.qkv_bias;
	if (m->q_lora) {
		linear(w, "attn.q_a.weight", "attn.q_a.bias", h, m->q_lora, (int)bias, REPL, w->tok);
		tensor(w, "attn.q_a_norm.weight", m->q_lora, REPL);
		linear(w, "attn.q_b.weight", NULL, m->q_lora, a * d, 0, COL, w->tok);
	} else {
		linear(w, "attn.q.weight", NULL, h, a * d, 0, COL, w->tok);
	}
	linear(w, "attn.kv_a.weight", "attn.kv_a.bias", h, m->kv_lora + m->rope_dim, (int)bias,
	       REPL, w->tok);
	tensor(w, "attn.kv_a_norm.weight", m->kv_lora, REPL);
	linear(w, "attn.kv_b.weight", NULL, m->kv_lora, a * (d - m->rope_dim + m->v_head_dim), 0,
	       COL, w->tok);
}

/* Self-attention, or (cross) a decoder's attention over the encoder's output: q from this
 * block's tokens, k and v from the encoder's. */
static void attention(Walk *w, int cross, int first_of_stack, int causal)
{
	const ModelSpec *m = w->m;
	const ModelLayout *y = &m->lay;
	const AttnNames *nm = cross ? &CROSS : &SELF;
	long long h = m->h, d = m->head_dim, dv = m->v_head_dim;
	long long q = m->a * d, k = m->kv_heads * d, v = m->kv_heads * dv;
	double s_enc = w->shape ? (double)w->shape->s : 0, b = w->shape ? (double)w->shape->b : 0;
	double tok_kv = cross ? b * s_enc : w->tok;

	if (y->mla)
		mla_projections(w);
	else if (y->qkv_fused && !cross) {
		linear(w, "attn.c_attn.weight", "attn.c_attn.bias", h, q + k + v, y->qkv_bias, COL,
		       w->tok);
	} else {
		linear(w, nm->q, nm->qb, h, q, y->qkv_bias, COL, w->tok);
		linear(w, nm->k, nm->kb, h, k, y->qkv_bias, COL, tok_kv);
		linear(w, nm->v, nm->vb, h, v, y->qkv_bias, COL, tok_kv);
	}
	if (y->qk_norm != QKNORM_NONE && !cross) {
		int width = y->qk_norm == QKNORM_WIDTH;
		norm(w, "attn.q_norm.weight", "attn.q_norm.bias", width ? q : d);
		norm(w, "attn.k_norm.weight", "attn.k_norm.bias", width ? k : d);
	}
	if (first_of_stack && y->rel_buckets && !cross)
		tensor(w, "attn.rel_bias", y->rel_buckets * m->a, REPL);
	attention_products(w, d, dv, w->s_self, cross ? s_enc : w->s_self, causal && !cross, !cross);
	linear(w, nm->o, nm->ob, m->a * dv, h, y->o_bias, ROW, w->tok);
}

typedef struct MlpNames {
	const char *gate, *gate_b, *up, *up_b, *gate_up, *gate_up_b, *fc, *fc_b, *down, *down_b;
} MlpNames;

static const MlpNames MLP = {"mlp.gate.weight", "mlp.gate.bias", "mlp.up.weight", "mlp.up.bias",
			     "mlp.gate_up.weight", "mlp.gate_up.bias", "mlp.fc.weight",
			     "mlp.fc.bias", "mlp.down.weight", "mlp.down.bias"};
static const MlpNames SHARED = {"mlp.shared.gate.weight", "mlp.shared.gate.bias",
				"mlp.shared.up.weight", "mlp.shared.up.bias",
				"mlp.shared.gate_up.weight", "mlp.shared.gate_up.bias",
				"mlp.shared.fc.weight", "mlp.shared.fc.bias",
				"mlp.shared.down.weight", "mlp.shared.down.bias"};

/* An MLP of intermediate size I: dense (column then row split) or one per routed expert. */
static void mlp(Walk *w, const MlpNames *nm, long long I, int expert)
{
	const ModelLayout *y = &w->m->lay;
	long long h = w->m->h;
	int bias = y->mlp_bias, first = expert ? EXPERT : COL, second = expert ? EXPERT : ROW;
	if (y->gated && y->gate_up_fused) {
		linear(w, nm->gate_up, nm->gate_up_b, h, 2 * I, bias, first, w->tok);
	} else if (y->gated) {
		linear(w, nm->gate, nm->gate_b, h, I, bias, first, w->tok);
		linear(w, nm->up, nm->up_b, h, I, bias, first, w->tok);
	} else {
		linear(w, nm->fc, nm->fc_b, h, I, bias, first, w->tok);
	}
	linear(w, nm->down, nm->down_b, I, h, bias, second, w->tok);
}

/* An MoE block's MLP: the router (and DeepSeek-V3's routing bias), the routed experts, and the
 * shared experts, dense, with Qwen2-MoE's gate on them. */
static void moe(Walk *w)
{
	const ModelSpec *m = w->m;
	linear(w, "mlp.router.weight", NULL, m->h, m->experts, 0, REPL, w->tok);
	if (m->router_bias)
		tensor(w, "mlp.router.score_bias", m->experts, REPL);
	mlp(w, &MLP, m->moe_I ? m->moe_I : m->I, 1);
	if (m->shared_I)
		mlp(w, &SHARED, m->shared_I, 0);
	if (m->shared_gate)
		linear(w, "mlp.shared_gate.weight", NULL, m->h, 1, 0, REPL, w->tok);
}

static void feed_forward(Walk *w, int unit)
{
	if (model_unit_is_moe(w->m, unit))
		moe(w);
	else
		mlp(w, &MLP, w->m->I, 0);
}

static void block(Walk *w, int unit)
{
	const ModelSpec *m = w->m;
	const ModelLayout *y = &m->lay;
	long long h = m->h;
	int dec = model_unit_is_decoder(m, unit), enc = y->L_enc > 0 && !dec;
	int first = unit == 1 || (y->L_enc > 0 && unit == y->L_enc + 1);
	int causal = y->causal && !enc;

	if (w->shape) {
		w->s_self = (double)(dec ? w->shape->s_dec : w->shape->s);
		w->tok = w->s_self * (double)w->shape->b;
	}
	if (y->parallel) {
		norm(w, "norm1.weight", "norm1.bias", h);
		if (y->parallel == 2)
			norm(w, "norm2.weight", "norm2.bias", h);
		attention(w, 0, first, causal);
		feed_forward(w, unit);
		return;
	}
	if (y->place == NORM_PRE || y->place == NORM_SANDWICH)
		norm(w, "norm1.weight", "norm1.bias", h);
	attention(w, 0, first, causal);
	if (y->place != NORM_PRE)
		norm(w, y->place == NORM_SANDWICH ? "norm1_post.weight" : "norm1.weight",
		     y->place == NORM_SANDWICH ? "norm1_post.bias" : "norm1.bias", h);
	if (dec) { /* the decoder's attention over the encoder, with a norm of its own */
		norm(w, "norm_x.weight", "norm_x.bias", h);
		attention(w, 1, 0, 0);
	}
	if (y->place == NORM_PRE || y->place == NORM_SANDWICH)
		norm(w, "norm2.weight", "norm2.bias", h);
	feed_forward(w, unit);
	if (y->place != NORM_PRE)
		norm(w, y->place == NORM_SANDWICH ? "norm2_post.weight" : "norm2.weight",
		     y->place == NORM_SANDWICH ? "norm2_post.bias" : "norm2.bias", h);
	if (enc && unit == y->L_enc) /* the encoder's last norm, before the decoder reads it */
		norm(w, "enc.final_norm.weight", "enc.final_norm.bias", h);
}

/* ---- ends ---- */

static long long embed_width(const ModelSpec *m)
{
	return m->lay.embed_dim ? m->lay.embed_dim : m->h;
}

static void embeddings(Walk *w)
{
	const ModelSpec *m = w->m;
	const ModelLayout *y = &m->lay;
	long long e = embed_width(m);
	tensor(w, "embed.tokens", m->V * e, COL); /* vocabulary-parallel */
	if (y->pos == POS_LEARNED)
		tensor(w, "embed.positions", (m->max_pos + y->pos_offset) * m->h, REPL);
	tensor(w, "embed.token_types", y->type_vocab * m->h, REPL);
	if (y->embed_norm)
		norm(w, "embed.norm.weight", "embed.norm.bias", m->h);
	if (e != m->h)
		linear(w, "embed.project_in.weight", NULL, e, m->h, 0, REPL, w->tok);
}

static void head(Walk *w)
{
	const ModelSpec *m = w->m;
	const ModelLayout *y = &m->lay;
	long long e = embed_width(m);
	double seqs = w->shape ? (double)w->shape->b : 0; /* one token of each sequence */
	if (y->final_norm)
		norm(w, "final_norm.weight", "final_norm.bias", m->h);
	if (y->pooler) /* BertPooler: hidden_states[:, 0] through a dense layer and tanh */
		linear(w, "pooler.weight", "pooler.bias", m->h, m->h, 1, REPL, seqs);
	if (y->cls_labels)
		linear(w, "classifier.weight", "classifier.bias", m->h, y->cls_labels, y->cls_bias,
		       REPL, y->cls_tokens ? w->tok : seqs);
	if (!y->lm_head)
		return;
	if (y->head_transform) { /* BertPredictionHeadTransform: dense, activation, LayerNorm */
		linear(w, "lm_head.transform.weight", "lm_head.transform.bias", m->h, m->h, 1, REPL,
		       w->tok);
		norm(w, "lm_head.transform.norm.weight", "lm_head.transform.norm.bias", m->h);
	}
	if (e != m->h)
		linear(w, "lm_head.project_out.weight", NULL, m->h, e, 0, REPL, w->tok);
	if (y->tied) { /* the embedding's matrix: a product, no tensor of its own */
		ModelTensor *t = w->t;
		w->t = NULL;
		linear(w, "lm_head.weight", NULL, e, m->V, 0, COL, w->tok);
		w->t = t;
		tensor(w, "lm_head.bias", y->head_bias ? m->V : 0, COL);
	} else {
		linear(w, "lm_head.weight", "lm_head.bias", e, m->V, y->head_bias, COL, w->tok);
	}
}

static int walk_unit(const ModelSpec *m, int unit, const GemmShape *shape, ModelTensor *t,
		     ModelGemm *g, int want_gemms)
{
	Walk w = {.m = m, .t = t, .g = g, .shape = shape};
	if (!model_known(m)) {
		if (t && unit >= 1 && unit <= m->L)
			tensor(&w, "block.params", (long long)llround(m->n_params / (double)m->L),
			       REPL);
		return want_gemms ? 0 : w.nt;
	}
	if (shape) { /* the ends see the decoder's tokens in an encoder-decoder, else the only ones */
		w.s_self = (double)(m->lay.L_enc ? shape->s_dec : shape->s);
		w.tok = w.s_self * (double)shape->b;
	}
	if (unit == 0)
		embeddings(&w);
	else if (unit <= m->L)
		block(&w, unit);
	else
		head(&w);
	return want_gemms ? w.ng : w.nt;
}

/* ---- queries ---- */

int model_unit_is_moe(const ModelSpec *m, int unit)
{
	long long layer = unit - 1; /* the family's 0-based layer index */
	if (m->experts <= 0 || unit < 1 || unit > m->L || unit % m->moe_interval ||
	    layer < m->first_dense || (m->moe_freq > 1 && layer % m->moe_freq))
		return 0;
	for (int i = 0; i < m->n_dense_list; i++)
		if (m->dense_list[i] == layer)
			return 0;
	return 1;
}

int model_unit_kind(const ModelSpec *m, int unit)
{
	if (unit < 1 || unit > m->L)
		return unit < 1 ? -1 : -2;
	long long L_enc = m->lay.L_enc;
	int first = unit == 1 || (L_enc > 0 && unit == L_enc + 1);
	return model_unit_is_moe(m, unit) | model_unit_is_decoder(m, unit) << 1 | first << 2 |
	       (L_enc > 0 && unit == L_enc) << 3;
}

int model_unit_is_decoder(const ModelSpec *m, int unit)
{
	return m->lay.L_enc > 0 && unit > m->lay.L_enc && unit <= m->L;
}

int model_unit_tensors(const ModelSpec *m, int unit, ModelTensor out[MODEL_MAX_TENSORS])
{
	return walk_unit(m, unit, NULL, out, NULL, 0);
}

int model_unit_gemms(const ModelSpec *m, int unit, const GemmShape *g,
		     ModelGemm out[MODEL_MAX_GEMMS])
{
	return walk_unit(m, unit, g, NULL, out, 1);
}

double model_gemms_flops(const ModelGemm *g, int n)
{
	double sum = 0;
	for (int i = 0; i < n; i++)
		sum += 2 * g[i].m * g[i].k * g[i].n * g[i].batch;
	for (int i = 0; i < n; i++)
		sum += g[i].bias_flops;
	return sum;
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
	return model_known(m) && m->lay.lm_head && m->lay.tied ? m->V * embed_width(m) : 0;
}

double model_count_params(const ModelSpec *m)
{
	if (!model_known(m))
		return m->n_params;
	double sum = 0;
	for (int u = 0; u < model_n_units(m); u++)
		sum += (double)model_unit_params(m, u);
	return sum;
}

int model_is_family(const ModelSpec *m, const char *type)
{
	return m->family && family_has_name(m->family, type);
}

int model_llama_modules(const ModelSpec *m)
{
	return model_is_family(m, "llama") || model_is_family(m, "mistral") ||
	       model_is_family(m, "mixtral") || model_is_family(m, "qwen2");
}

int model_gemma_modules(const ModelSpec *m)
{
	return model_is_family(m, "gemma") || model_is_family(m, "gemma2");
}

int model_hf_loss_upcasts(const ModelSpec *m)
{
	return m->lay.causal && !m->lay.L_enc;
}

int model_hf_llama_attention(const ModelSpec *m)
{
	return model_llama_modules(m) || model_gemma_modules(m);
}

/* ---- parsing ---- */

static int parse_params_only(const JsonObj *o, ModelSpec *m, PxNotes *notes, PxError *err)
{
	if (jobj_num(o, "num_parameters", 1, 1e16, 0, &m->n_params, err) < 0)
		return -1;
	m->family = NULL;
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

	memset(m, 0, sizeof(*m));
	m->top_k = 1;
	m->moe_interval = 1;
	m->moe_freq = 1;
	if (jobj_str(o, "model_type", NULL, &type, err) < 0)
		return -1;
	if (cJSON_HasObjectItem(o->obj, "num_parameters")) {
		/* a bare count, or --set model.num_parameters=N over a config: the count wins */
		if (type)
			px_notes_warn(notes, "%s: %s.num_parameters given: the %s architecture is not "
				      "used; activations unknown", o->doc->path, o->name, type);
		snprintf(m->type, sizeof(m->type), "params");
		return parse_params_only(o, m, notes, err);
	}
	if (!type) /* infer the family from its keys, as a bare config would be read */
		type = family_infer(o);
	snprintf(m->type, sizeof(m->type), "%s", type);
	const ModelFamily *f = family_find(type);
	if (!f) {
		char where[512], known[1024];
		jobj_where(o, "model_type", where, sizeof(where));
		family_list(known, sizeof(known));
		return px_fail(err, PX_ERR_INPUT, "%s: %s%smodel_type: \"%s\" is not a model family "
			       "Parallax knows; expected one of %s (or num_parameters alone)", where,
			       o->name, *o->name ? "." : "", type, known);
	}
	if (family_read(f, o, m, notes, err))
		return -1;
	m->n_params = model_count_params(m);
	return 0;
}

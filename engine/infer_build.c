#include "infer_build.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- per-unit arithmetic ---- */

/* What the unit's weight products give: FLOPs, the GEMMs' input and output elements (each read
 * or written once), the matrices' elements on this rank and the largest of them. */
typedef struct GemmSums {
	double flops, io_elems, matrix_elems, largest;
	int n_matrices;
} GemmSums;

static GemmSums weight_gemms(const ModelSpec *m, int u, long long b, long long s, long long t)
{
	ModelGemm g[MODEL_MAX_GEMMS];
	GemmShape shape = {.s = s, .s_dec = s, .b = b, .t = (int)t, .ep = 1};
	GemmSums r = {0};
	int n = model_unit_gemms(m, u, &shape, g);
	for (int i = 0; i < n; i++) {
		if (g[i].kind != GEMM_WEIGHT)
			continue;
		r.flops += 2 * g[i].m * g[i].k * g[i].n * g[i].batch + g[i].bias_flops;
		r.io_elems += (g[i].m * g[i].k + g[i].m * g[i].n) * g[i].batch;
		r.matrix_elems += g[i].k * g[i].n * g[i].batch;
		r.largest = fmax(r.largest, g[i].k * g[i].n);
		r.n_matrices++;
	}
	return r;
}

/* Elements of the unit's tensors on this rank (a split tensor's 1/t share), and the largest. */
static double rank_elems(const ModelSpec *m, int u, long long t, double *largest, int *split)
{
	ModelTensor ts[MODEL_MAX_TENSORS];
	int n = model_unit_tensors(m, u, ts);
	double e = 0;
	*largest = 0;
	*split = 0;
	for (int i = 0; i < n; i++) {
		double x = ts[i].tp_split ? (double)ts[i].numel / (double)t : (double)ts[i].numel;
		e += x;
		*largest = fmax(*largest, x);
		*split |= ts[i].tp_split && x == *largest;
	}
	return e;
}

/* Elements stored quantized: DeepSpeed's int8 kernels quantize the blocks' linears; its weight
 * quantizer every nn.Linear and nn.Embedding (utils.py WEIGHT_QUANTIZATION_LAYERS): the blocks',
 * the LM head (when it owns its matrix) and the token embedding (the embeddings' largest). */
static double quantized_elems(const InferScenario *sc, int u, double elems, double largest,
			      const GemmSums *w)
{
	const ModelSpec *m = &sc->model;
	int block = u >= 1 && u <= m->L;
	switch (sc->inf.quant) {
	case IQ_INT8_KERNEL: return block ? w->matrix_elems : 0;
	case IQ_GROUPWISE: return u == 0 ? largest : fmin(w->matrix_elems, elems);
	default: return 0;
	}
}

static void unit_plan(const InferPlan *p, int u, long long b, InferUnit *out)
{
	const InferScenario *sc = p->sc;
	const ModelSpec *m = &sc->model;
	const InferConfig *c = &sc->inf;
	const InferWorkload *wl = &sc->wl;
	long long t = p->tp, sp = wl->prompt_tokens, L = m->L;
	int block = u >= 1 && u <= L, head = u == L + 1, split = 0;
	double act = p->act_bytes, largest;
	/* the head computes the last position's logits only, in prefill as in decode */
	GemmSums pre = weight_gemms(m, u, b, head ? 1 : sp, t);
	GemmSums dec = weight_gemms(m, u, b, 1, t);
	double elems = rank_elems(m, u, t, &largest, &split);
	double q = quantized_elems(sc, u, elems, largest, &dec);

	memset(out, 0, sizeof(*out));
	out->quant_elems = q;
	out->largest_matrix_elems = q > 0 ? (u == 0 ? largest : dec.largest) : 0;
	out->weight_bytes = (elems - q) * act + q * c->quant_bits / 8.0;
	out->load_bytes = elems * act;
	if (c->quant == IQ_INT8_KERNEL && q > 0) /* one fp32 scale per group of each matrix */
		out->scale_bytes = (double)dec.n_matrices * (double)c->q_groups * 4;
	else if (c->quant == IQ_GROUPWISE && q > 0) /* a scale and a minimum in dtype per group */
		out->scale_bytes = ceil(q / (double)c->group_elems) * 2 * act;
	/* the unfused quantizer writes each matrix dequantized and its GEMM reads it back */
	double dequant_traffic = c->quant == IQ_GROUPWISE ? 2 * q * act : 0;
	/* an embedding lookup reads its tokens' rows (counted below), not the table */
	double weights_read = u == 0 ? 0 : out->weight_bytes + out->scale_bytes + dequant_traffic;

	GemmSums one = weight_gemms(m, u, 1, 1, t); /* a token's: the products are linear in them */
	out->weights_read_bytes = weights_read;
	out->token_flops = one.flops;
	out->token_bytes = one.io_elems * act + (u == 0 ? (double)m->h * act : 0);
	out->prefill_flops = pre.flops;
	out->decode_flops = dec.flops;
	out->prefill_bytes = weights_read + pre.io_elems * act;
	out->decode_bytes = weights_read + dec.io_elems * act;
	if (block) {
		double dqk = (double)m->head_dim, dv = (double)(m->v_head_dim ? m->v_head_dim :
								 m->head_dim);
		double heads = (double)m->a / (double)t, bb = (double)b, s = (double)sp;
		out->kv_bytes_per_token = (double)p->kv_heads_rank * (dqk + dv) * act;
		/* QK^T and AV under the causal mask: query i meets i keys (1-based), s(s+1)/2 pairs;
		 * a decode step's query meets the mean context's keys */
		out->pair_flops = 2 * heads * (dqk + dv);
		out->prefill_flops += 2 * bb * heads * (dqk + dv) * s * (s + 1) / 2;
		out->decode_flops += 2 * bb * heads * (dqk + dv) * p->mean_ctx;
		out->prefill_bytes += bb * s * out->kv_bytes_per_token;           /* written */
		out->decode_bytes += bb * (p->mean_ctx + 1) * out->kv_bytes_per_token; /* read, written */
		out->n_allreduce = t > 1 ? 2 : 0; /* attention's and the MLP's row-parallel outputs */
	} else if (u == 0) {
		out->prefill_bytes += (double)b * (double)sp * (double)m->h * act; /* the lookup */
		out->decode_bytes += (double)b * (double)m->h * act;
		out->n_allreduce = t > 1 && split ? 1 : 0; /* a vocabulary-parallel embedding's sum */
	}
	out->prefill_comm_elems = (double)b * (double)sp * (double)m->h;
	out->decode_comm_elems = (double)b * (double)m->h;
}

/* The largest working set of one forward over T tokens: the residual stream and its normed copy,
 * then the larger of attention's (q, k, v and its output) and the MLP's intermediates; at the
 * head the stream and the fp32 logits of its b rows (all of them after the vocabulary-parallel
 * gather). A decode step (decode: its b sequences) also holds its fp32 scores against the
 * cache. */
static double workspace_bytes(const InferPlan *p, double T, long long b, int decode)
{
	const ModelSpec *m = &p->sc->model;
	double t = (double)p->tp, act = p->act_bytes;
	double d = (double)m->head_dim, dv = (double)(m->v_head_dim ? m->v_head_dim : m->head_dim);
	double attn = (double)m->a / t * (d + dv) + (double)p->kv_heads_rank * (d + dv);
	double mlp = (m->lay.gated ? 3.0 : 2.0) * (double)(m->I ? m->I : 4 * m->h) / t;
	double block = T * act * (2.0 * (double)m->h + fmax(attn, mlp));
	double logits = (double)b * (double)m->V * 4 * (p->tp > 1 ? 1 + 1 / t : 1);
	double head = T * act * (double)m->h + logits;
	double scores = decode ? (double)b * (double)m->a / t * (double)p->ctx_tokens * 4 : 0;
	return fmax(block + scores, head);
}

int infer_plan_make(const InferScenario *sc, long long batch, long long ctx, InferPlan *p,
		    PxError *err)
{
	const ModelSpec *m = &sc->model;
	const InferWorkload *wl = &sc->wl;
	memset(p, 0, sizeof(*p));
	p->sc = sc;
	p->tp = sc->inf.tp;
	p->batch = batch;
	p->replicas = cluster_world(&sc->cluster) / p->tp;
	p->kv_heads_rank = m->kv_heads >= p->tp ? m->kv_heads / p->tp : 1;
	p->act_bytes = infer_compute_bytes(sc->inf.dtype);
	if (!ctx)
		ctx = wl->prompt_tokens + wl->output_tokens;
	/* DeepSpeed's kernels reserve max_out_tokens per sequence at start-up */
	p->ctx_tokens = sc->inf.kernel_inject && sc->inf.max_out_tokens > ctx ?
		sc->inf.max_out_tokens : ctx;
	/* decode step j = 1..so-1 attends to sp + j tokens: their mean is sp + so/2 */
	p->mean_ctx = (double)wl->prompt_tokens + (double)wl->output_tokens / 2;
	p->n_units = model_n_units(m);
	p->units = calloc((size_t)p->n_units, sizeof(*p->units));
	if (!p->units)
		return px_fail(err, PX_ERR_RUNTIME, "out of memory");
	double load_so_far = 0;
	for (int u = 0; u < p->n_units; u++) {
		InferUnit *x = &p->units[u];
		unit_plan(p, u, batch, x);
		p->weight_bytes += x->weight_bytes;
		p->scale_bytes += x->scale_bytes;
		p->kv_bytes_per_token += x->kv_bytes_per_token;
		p->prefill_flops += x->prefill_flops;
		p->decode_flops += x->decode_flops;
		p->prefill_bytes += x->prefill_bytes;
		p->decode_bytes += x->decode_bytes;
		p->dequant_bytes = fmax(p->dequant_bytes, sc->inf.quant == IQ_GROUPWISE ?
					x->largest_matrix_elems * p->act_bytes : 0);
		/* a quantized unit arrives whole in dtype, beside the units already stored */
		if (x->quant_elems > 0)
			p->load_peak_extra_bytes = fmax(p->load_peak_extra_bytes, load_so_far +
							x->load_bytes + x->weight_bytes +
							x->scale_bytes);
		load_so_far += x->weight_bytes + x->scale_bytes;
	}
	if (p->load_peak_extra_bytes > 0)
		p->load_peak_extra_bytes -= p->weight_bytes + p->scale_bytes;
	p->load_peak_extra_bytes = fmax(p->load_peak_extra_bytes, 0);
	/* vLLM V1's prefix cache holds a prefix's full blocks once for the sequences that share
	 * it: every one at a request rate, those of one prefix id from a trace */
	p->shared_tokens = fmin(infer_shared_tokens(wl, batch), (double)p->ctx_tokens);
	p->kv_bytes = p->kv_bytes_per_token * ((double)batch * (double)p->ctx_tokens -
					       (double)(batch - 1) * p->shared_tokens);
	if (!infer_sched_ragged(wl)) {
		/* a static batch prefills all its prompts at once, vLLM's scheduler one alone */
		long long pb = wl->continuous ? 1 : batch;
		p->prefill_workspace_bytes = workspace_bytes(p, (double)pb * (double)wl->prompt_tokens,
							     pb, 0);
		p->decode_workspace_bytes = workspace_bytes(p, (double)batch, batch, 1);
	} else {
		/* FastGen's forwards hold at most max_ragged_batch_size tokens, their logits one
		 * row a sequence making a token, and its blocked flash attention keeps no scores;
		 * its engine leaves memory_config's reserve beside the KV cache for all the rest
		 * (DSStateManagerConfig: mode "reserve", 1e9 bytes by default) */
		double T = (double)wl->token_budget;
		long long rows = batch < wl->token_budget ? batch : wl->token_budget;
		double forward = workspace_bytes(p, T, rows, 0);
		/* vLLM V1 sizes its cache after a profiling forward of max_num_batched_tokens
		 * (gpu_model_runner.py profile_run): that forward's peak is what it leaves */
		p->prefill_workspace_bytes = p->decode_workspace_bytes =
			wl->scheduler == SCHED_VLLM_V1 ? forward :
			fmax(forward, INFER_FASTGEN_RESERVE_BYTES);
	}
	const ClusterSpec *cl = &sc->cluster;
	p->runtime_bytes = cl->cuda_context_bytes + cl->cublas_workspace_bytes +
			   cl->nccl_buffers_bytes;
	return 0;
}

void infer_plan_free(InferPlan *p)
{
	if (!p)
		return;
	free(p->units);
	p->units = NULL;
}

double infer_plan_serve_peak_bytes(const InferPlan *p)
{
	return p->runtime_bytes + p->weight_bytes + p->scale_bytes + p->kv_bytes +
	       fmax(p->prefill_workspace_bytes, p->decode_workspace_bytes) + p->dequant_bytes;
}

double infer_plan_load_peak_bytes(const InferPlan *p)
{
	return p->runtime_bytes + p->weight_bytes + p->scale_bytes + p->load_peak_extra_bytes;
}

/* ---- the schedule ---- */

typedef struct IBuilder {
	const InferPlan *p;
	Schedule *s;
	int oom;
} IBuilder;

static int alloc(IBuilder *b, MemCat cat, BufWhat what, int unit, double bytes)
{
	int id = -1;
	if (bytes > 0 && sched_alloc(b->s, PLACE_GPU, cat, what, unit, bytes, &id))
		b->oom = 1;
	return id;
}

static void release(IBuilder *b, int id)
{
	if (id >= 0 && sched_free_buf(b->s, id))
		b->oom = 1;
}

static void load_unit(IBuilder *b, int u)
{
	const InferUnit *x = &b->p->units[u];
	int staging = x->quant_elems > 0 ? alloc(b, CAT_BUFFERS, BUF_LOAD_STAGING, u, x->load_bytes) :
					   -1;
	alloc(b, CAT_PARAMS, BUF_PARAMS, u, x->weight_bytes);
	if (sched_copy(b->s, COPY_H2D, ROLE_WEIGHT_LOAD, u, x->load_bytes))
		b->oom = 1;
	alloc(b, CAT_PARAMS, BUF_QUANT_SCALES, u, x->scale_bytes);
	release(b, staging);
}

/* One forward over every unit: its compute, then its tensor-parallel collectives on the hidden
 * state in ws (the head's: the vocabulary-parallel logits' all-gather, fp32). */
static void forward(IBuilder *b, OpRole role, int ws, long long batch)
{
	const InferPlan *p = b->p;
	int decode = role == ROLE_DECODE;
	for (int u = 0; u < p->n_units; u++) {
		const InferUnit *x = &p->units[u];
		if (sched_compute(b->s, COMP_FWD, u, decode ? x->decode_flops : x->prefill_flops,
				  decode ? x->decode_bytes : x->prefill_bytes)) {
			b->oom = 1;
			return;
		}
		sched_set_role(b->s, role);
		int64_t elems = (int64_t)(decode ? x->decode_comm_elems : x->prefill_comm_elems);
		for (int k = 0; k < x->n_allreduce; k++)
			if (sched_coll(b->s, COLL_ALL_REDUCE, role, GROUP_TP, (int)p->tp, u, elems,
				       p->act_bytes, ws, 0))
				b->oom = 1;
		if (u == p->n_units - 1 && p->tp > 1 &&
		    sched_coll(b->s, COLL_ALL_GATHER, role, GROUP_TP, (int)p->tp, u,
			       (int64_t)batch * p->sc->model.V, 4, ws, 0))
			b->oom = 1;
	}
}

static void phase(IBuilder *b, OpRole role, long long batch)
{
	const InferPlan *p = b->p;
	int ws = alloc(b, CAT_ACTIV, BUF_ACTIVATIONS, -1, role == ROLE_DECODE ?
		       p->decode_workspace_bytes : p->prefill_workspace_bytes);
	int dq = alloc(b, CAT_ACTIV, BUF_DEQUANT, -1, p->dequant_bytes);
	forward(b, role, ws, batch);
	release(b, dq);
	release(b, ws);
}

int infer_build_schedule(const InferPlan *p, Schedule *s, PxError *err)
{
	const InferScenario *sc = p->sc;
	const ClusterSpec *cl = &sc->cluster;
	long long batch = p->batch;
	IBuilder b = {p, s, 0};
	int n_blocks = (int)sc->model.L, *kv = calloc((size_t)n_blocks * 2 + 2, sizeof(int));
	if (!kv)
		return px_fail(err, PX_ERR_RUNTIME, "out of memory");
	sched_init(s, 0);
	alloc(&b, CAT_OVERHEAD, BUF_CUDA_CONTEXT, -1, cl->cuda_context_bytes);
	alloc(&b, CAT_OVERHEAD, BUF_CUBLAS_WORKSPACE, -1, cl->cublas_workspace_bytes);
	alloc(&b, CAT_OVERHEAD, BUF_NCCL, -1, cl->nccl_buffers_bytes);
	for (int u = 0; u < p->n_units; u++)
		load_unit(&b, u);
	/* DeepSpeed's kernels reserve the whole cache at start-up; Hugging Face's grows it: the
	 * prompt's part at prefill, the generated tokens' as decode appends them (one allocation
	 * here: the peak is the same), both freed when the batch ends */
	double sp = (double)sc->wl.prompt_tokens, ctx = (double)p->ctx_tokens;
	int grows = !sc->inf.kernel_inject;
	for (int u = 1; !grows && u <= n_blocks; u++)
		kv[u] = alloc(&b, CAT_BUFFERS, BUF_KV_CACHE, u, p->units[u].kv_bytes_per_token *
			      (double)batch * ctx);
	s->step_begin = s->n;
	double shared = (double)(batch - 1) * fmin(p->shared_tokens, sp); /* held once */
	for (int u = 1; grows && u <= n_blocks; u++)
		kv[u] = alloc(&b, CAT_BUFFERS, BUF_KV_CACHE, u, p->units[u].kv_bytes_per_token *
			      ((double)batch * sp - shared));
	phase(&b, ROLE_PREFILL, batch);
	for (int u = 1; grows && u <= n_blocks; u++)
		kv[n_blocks + u] = alloc(&b, CAT_BUFFERS, BUF_KV_CACHE, u,
					 p->units[u].kv_bytes_per_token * (double)batch * (ctx - sp));
	if (sched_loop(s, sc->wl.output_tokens - 1))
		b.oom = 1;
	phase(&b, ROLE_DECODE, batch);
	if (sched_end_loop(s))
		b.oom = 1;
	for (int u = 1; grows && u <= n_blocks; u++) {
		release(&b, kv[n_blocks + u]);
		release(&b, kv[u]);
	}
	free(kv);
	if (b.oom)
		return px_fail(err, PX_ERR_RUNTIME, "out of memory building the inference schedule");
	return sched_validate(s, err);
}

int infer_build_ragged(const InferPlan *p, const InferRagged *r, Schedule *s, PxError *err)
{
	const ModelSpec *m = &p->sc->model;
	double n = (double)r->decode_seqs, tokens = n + (double)r->chunk_tokens;
	double rows = r->logit_rows;
	/* keys and values: a decoding query's context read and its token written; a chunk's
	 * earlier tokens read and its own written */
	double kv_tokens = n * (r->decode_ctx + 1) + r->chunk_prior + (double)r->chunk_tokens;
	int oom = 0;
	sched_init(s, 0);
	for (int u = 0; u < p->n_units; u++) {
		const InferUnit *x = &p->units[u];
		double t = u == p->n_units - 1 ? rows : tokens; /* the head: the logit rows */
		double flops = t * x->token_flops + x->pair_flops * (n * r->decode_ctx + r->chunk_pairs);
		double bytes = x->weights_read_bytes + t * x->token_bytes +
			       kv_tokens * x->kv_bytes_per_token;
		oom |= sched_compute(s, COMP_FWD, u, flops, bytes);
		if (oom)
			break;
		sched_set_role(s, ROLE_DECODE);
		for (int k = 0; k < x->n_allreduce; k++)
			oom |= sched_coll(s, COLL_ALL_REDUCE, ROLE_DECODE, GROUP_TP, (int)p->tp, u,
					  (int64_t)(tokens * (double)m->h), p->act_bytes, -1, 0);
		if (u == p->n_units - 1 && p->tp > 1)
			oom |= sched_coll(s, COLL_ALL_GATHER, ROLE_DECODE, GROUP_TP, (int)p->tp, u,
					  (int64_t)(rows * (double)m->V), 4, -1, 0);
	}
	if (oom)
		return px_fail(err, PX_ERR_RUNTIME, "out of memory building a ragged forward");
	return 0;
}

#include "infer_report.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "version.h"
#include "paths.h"
#include "store.h"

#define GiB (1024.0 * 1024.0 * 1024.0)

static const char *quant_text(const InferConfig *c, char *buf, size_t n)
{
	if (c->quant == IQ_INT8_KERNEL)
		snprintf(buf, n, "int8 (DeepSpeed int8 kernels, %lld scale group(s) per matrix, "
			 "dequantized in the GEMM)", c->q_groups);
	else if (c->quant == IQ_GROUPWISE)
		snprintf(buf, n, "int%d, groups of %lld with a scale and a minimum each, dequantized "
			 "before each GEMM", c->quant_bits, c->group_elems);
	else
		snprintf(buf, n, "%s", infer_dtype_name(c->dtype));
	return buf;
}

/* The trace's requests replayed one by one (sim/infer_replay.h). */
static void replay_table(FILE *f, const InferPrediction *pr)
{
	const InferReplay *r = &pr->replay;
	fprintf(f, "\ntrace replayed request by request (%lld requests over %lld replica(s), a KV "
		"cache of %lld tokens each in %lld blocks of %lld; %lld prompt lengths priced)\n",
		r->requests, pr->plan.replicas, r->kv_tokens, r->kv_blocks, r->block,
		r->prefills_priced);
	fprintf(f, "%-40s %14s\n", "quantity", "value");
	const struct { const char *name, *fmt; double v; } rows[] = {
		{"time to first token, mean, s", "%14.5f", r->ttft_mean_s},
		{"time to first token, median, s", "%14.5f", r->ttft_p50_s},
		{"time to first token, p99, s", "%14.5f", r->ttft_p99_s},
		{"time per output token, mean, s", "%14.5f", r->tpot_mean_s},
		{"time per output token, p99, s", "%14.5f", r->tpot_p99_s},
		{"end-to-end latency, mean, s", "%14.5f", r->latency_mean_s},
		{"end-to-end latency, p99, s", "%14.5f", r->latency_p99_s},
		{"first arrival to last token, s", "%14.3f", r->makespan_s},
		{"tokens/s per GPU over that span", "%14.1f", r->tokens_per_s_gpu},
		{"most sequences running at once", "%14.0f", (double)r->peak_concurrency},
		{"most tokens in the KV cache", "%14.0f", (double)r->peak_kv_tokens},
		{"most KV blocks taken", "%14.0f", (double)r->peak_kv_blocks},
		{"requests that waited for room", "%14.0f", (double)r->waited_for_room},
		{"sequences preempted (prefilled again)", "%14.0f", (double)r->preemptions},
		{"forwards run", "%14.0f", (double)r->forwards},
	};
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		fprintf(f, "%-40s ", rows[i].name);
		fprintf(f, rows[i].fmt, rows[i].v);
		fputc('\n', f);
	}
	const InferWorkload *w = &pr->paged.wl;
	if (w->prefix_caching)
		fprintf(f, "# prefix cache (enable_prefix_caching): %lld tokens found cached at "
			"admission, %.1f%% of the %lld prompt tokens: full blocks of the trace's shared "
			"prefixes%s and preempted requests' own; %lld cached blocks evicted (least "
			"recently freed first)\n", r->prefix_hit_tokens,
			100.0 * (double)r->prefix_hit_tokens / (double)r->prompt_tokens,
			r->prompt_tokens, w->trace.prefixes ? "" :
			" (the trace has no prefix_id column: none shared)", r->prefix_evicted_blocks);
	if (w->scheduler == SCHED_VLLM_V1)
		fprintf(f, "# vLLM V1's scheduler: steps of at most %lld tokens (max_num_batched_tokens), "
			"the running requests first in admission order (a prompt's rest in chunks, or "
			"one token to decode), then waiting prompts' first chunks; room: the KV cache's "
			"blocks, taken chunk by chunk, the last admitted preempted when they run out; at "
			"most %lld sequences running (max_num_seqs); each step priced as one ragged "
			"batch\n", w->token_budget, w->max_ragged_seqs);
	else if (w->scheduler == SCHED_SPLIT_FUSE)
		fprintf(f, "# DeepSpeed-FastGen's Dynamic SplitFuse, as DeepSpeed-MII schedules it: "
			"forwards of at most %lld tokens (max_ragged_batch_size) of %lld sequences, "
			"each decoding sequence's next token first, then prompts in chunks; each "
			"forward priced as one ragged batch; room: the KV cache's blocks, a prompt "
			"going ahead while they hold all of it%s\n", w->token_budget,
			w->max_ragged_seqs, w->batch_given ? ", and batch_size's sequences" : "");
	else
		fprintf(f, "# vLLM's scheduler: each prompt's own length's prefill; each decode step "
			"at its sequences' mean context (their sum exactly); room: the KV cache's "
			"blocks, %.3g of them kept free at admission (vLLM's watermark)%s\n",
			w->watermark, w->batch_given ? " and batch_size's sequences" : "");
}

void infer_report_table(FILE *f, const InferScenario *sc, const InferPrediction *pr)
{
	const ModelSpec *m = &sc->model;
	const ClusterSpec *c = &sc->cluster;
	const InferPlan *p = &pr->plan;
	const InferWorkload *w = &sc->wl;
	char q[200];
	fprintf(f, "# parallax %s predict: %s (%s), inference\n", PX_VERSION, sc->name, sc->path);
	fprintf(f, "# model      %s, %.4g parameters: L=%lld h=%lld heads=%lld kv=%lld I=%lld "
		"V=%lld\n", m->type, m->n_params, m->L, m->h, m->a, m->kv_heads, m->I, m->V);
	fprintf(f, "# cluster    %lld x %lld %s (%.2f GiB usable each): %lld replica(s) of tensor "
		"parallel %lld\n", c->nodes, c->gpus_per_node, c->gpu.name,
		c->gpu.usable_bytes / GiB, p->replicas, p->tp);
	fprintf(f, "# inference  weights %s; compute and KV cache %s; kernel injection %s; "
		"max_out_tokens %lld\n", quant_text(&sc->inf, q, sizeof(q)),
		sc->inf.dtype == IDT_FP32 ? "fp32" : sc->inf.dtype == IDT_BF16 ? "bf16" : "fp16",
		sc->inf.kernel_inject ? "on" : "off", sc->inf.max_out_tokens);
	char hit[96] = "";
	if (w->cached_prefix > 0)
		snprintf(hit, sizeof(hit), ", %.0f of the prompt's found in the prefix cache",
			 w->cached_prefix);
	if (w->continuous)
		fprintf(f, "# workload   continuous batching: %.4g requests/s (%.4g per replica), "
			"prompt %lld tokens, output %lld tokens on average%s%s%s%s; KV cache paged\n",
			w->request_rate, pr->cb.rate_replica, w->prompt_tokens, w->output_tokens,
			w->trace.n ? " (the means of the trace " : "", w->trace.n ? w->trace.path : "",
			w->trace.n ? ")" : "", hit);
	else
		fprintf(f, "# workload   batch %lld per replica, prompt %lld tokens, output %lld tokens; "
			"KV cache held for %lld tokens a sequence\n", w->batch, w->prompt_tokens,
			w->output_tokens, p->ctx_tokens);

	fprintf(f, "\nmemory per GPU (GiB = 2^30 bytes)\n");
	fprintf(f, "%-34s %10s\n", "part", "GiB");
	const struct { const char *name; double v; } rows[] = {
		{"weights", p->weight_bytes},
		{"quantization scales", p->scale_bytes},
		{"KV cache", p->kv_bytes},
		{"activation workspace", fmax(p->prefill_workspace_bytes, p->decode_workspace_bytes) +
						 p->dequant_bytes},
		{"runtime (CUDA, cuBLAS, NCCL)", p->runtime_bytes},
	};
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
		fprintf(f, "%-34s %10.2f\n", rows[i].name, rows[i].v / GiB);
	fprintf(f, "%-34s %10.2f  %s (usable %.2f)\n", "peak", pr->peak_bytes / GiB,
		predict_verdict_name(pr->verdict), pr->gpu_capacity_bytes / GiB);
	fprintf(f, "# load peak %.2f GiB; KV cache %.0f bytes per token of a sequence on each GPU\n",
		pr->load_peak_bytes / GiB, p->kv_bytes_per_token);
	fprintf(f, "# memory holds at most %lld sequences of %lld tokens per replica, or %lld tokens a "
		"sequence at batch %lld\n", pr->max_batch, pr->fit_ctx, pr->max_ctx, pr->fit_batch);
	fprintf(f, "# the largest model of this width that fits there: %lld blocks, %.4g parameters "
		"(this one %lld blocks, %.4g)\n", pr->max_layers, pr->max_params, m->L, m->n_params);

	if (w->continuous) {
		const InferContinuous *cb = &pr->cb;
		fprintf(f, "\ncontinuous batching, steady state per replica (memory above: %lld "
			"sequences of %.0f tokens, the mean occupancy rounded up)\n",
			p->batch, cb->mean_ctx_tokens);
		fprintf(f, "%-40s %14s\n", "quantity", "value");
		fprintf(f, "%-40s %14.4g\n", "requests/s", cb->rate_replica);
		fprintf(f, "%-40s %14.4f\n", "prefill share of time (rho)", cb->prefill_util);
		fprintf(f, "%-40s %14lld\n", "most concurrent sequences (memory)", cb->max_concurrency);
		if (!cb->stable) {
			fprintf(f, "# not served: %s\n", cb->why);
		} else {
			fprintf(f, "%-40s %14.3f\n", "sequences decoding (N)", cb->concurrency);
			fprintf(f, "%-40s %14.3f\n", "requests in the system (Little)", cb->in_system);
			fprintf(f, "%-40s %14.3f\n", "KV cache at that occupancy, GiB", cb->kv_bytes / GiB);
			fprintf(f, "%-40s %14.5f\n", "decode step at N, s", cb->decode_step_s);
		}
		if (infer_sched_ragged(w))
			fprintf(f, "# %s: forwards of at most %lld tokens give every decoding "
				"sequence its next token and, while prompts wait, carry their tokens "
				"(rho: the share of time they do); decode step: the mean forward, the "
				"TPOT: docs/inference.md\n", w->scheduler == SCHED_VLLM_V1 ?
				"chunked prefill (vLLM V1's scheduler)" :
				"Dynamic SplitFuse (DeepSpeed-FastGen)", w->token_budget);
		else
			fprintf(f, "# prefill and decode steps alternate, prefills first (vLLM's V0 "
				"scheduler; \"scheduler\": \"vllm_v1\" for vLLM V1's chunked prefill, "
				"\"split_fuse\" for Dynamic SplitFuse): docs/inference.md\n");
		if (pr->replayed)
			replay_table(f, pr);
		if (!cb->stable)
			return;
	}
	fprintf(f, "\ntime (profile: %s)\n", pr->hw_source);
	fprintf(f, "%-26s %12s  %s\n", "phase", "seconds", "bound by");
	fprintf(f, "%-26s %12.5f  %s\n", "time to first token", pr->ttft_s,
		infer_bound_name(pr->prefill.bound));
	fprintf(f, "%-26s %12.5f  %s\n", "time per output token", pr->tpot_s,
		infer_bound_name(pr->decode.bound));
	fprintf(f, "%-26s %12.5f\n", "end-to-end latency", pr->latency_s);
	fprintf(f, "\nthroughput (generated tokens)\n");
	fprintf(f, "%-26s %12.1f\n", "tokens/s per GPU", pr->tokens_per_s_gpu);
	fprintf(f, "%-26s %12.1f\n", "tokens/s per node", pr->tokens_per_s_node);
	fprintf(f, "# prefill %.4g FLOP, %.4g bytes per GPU; a decode step %.4g FLOP, %.4g bytes "
		"(at the mean context of %.0f tokens)\n", pr->prefill.flops, pr->prefill.bytes,
		pr->decode.flops, pr->decode.bytes, p->mean_ctx);
	fprintf(f, "# the inference time model, its calibration and known error: "
		"docs/inference.md\n");
	for (int i = 0; i < sc->notes.n_not_modelled; i++)
		fprintf(f, "# not modelled: %s\n", sc->notes.not_modelled[i]);
	for (int i = 0; i < sc->notes.n_warnings; i++)
		fprintf(f, "# %s\n", sc->notes.warnings[i]);
}

/* ---- metrics: one naming for JSON and the database ---- */

int infer_metrics_collect(const InferScenario *sc, const InferPrediction *pr, Metric *out)
{
	const InferPlan *p = &pr->plan;
	int n = 0;
	n = metrics_put(out, n, "infer.memory.gpu.peak_bytes", pr->peak_bytes, "bytes");
	n = metrics_put(out, n, "infer.memory.gpu.load_peak_bytes", pr->load_peak_bytes, "bytes");
	n = metrics_put(out, n, "infer.memory.gpu.weights_bytes", p->weight_bytes, "bytes");
	n = metrics_put(out, n, "infer.memory.gpu.scales_bytes", p->scale_bytes, "bytes");
	n = metrics_put(out, n, "infer.memory.gpu.kv_cache_bytes", p->kv_bytes, "bytes");
	n = metrics_put(out, n, "infer.memory.gpu.workspace_bytes",
		fmax(p->prefill_workspace_bytes, p->decode_workspace_bytes) + p->dequant_bytes,
		"bytes");
	n = metrics_put(out, n, "infer.memory.gpu.runtime_bytes", p->runtime_bytes, "bytes");
	n = metrics_put(out, n, "infer.memory.gpu.capacity_bytes", pr->gpu_capacity_bytes, "bytes");
	n = metrics_put(out, n, "infer.fits", pr->verdict != VERDICT_NO_FIT, "1");
	n = metrics_put(out, n, "infer.kv_cache.bytes_per_token", p->kv_bytes_per_token, "bytes");
	n = metrics_put(out, n, "infer.max_batch", (double)pr->max_batch, "1");
	n = metrics_put(out, n, "infer.max_context_tokens", (double)pr->max_ctx, "1");
	n = metrics_put(out, n, "infer.max_layers", (double)pr->max_layers, "1");
	n = metrics_put(out, n, "infer.max_params", pr->max_params, "1");
	n = metrics_put(out, n, "infer.ttft_s", pr->ttft_s, "s");
	n = metrics_put(out, n, "infer.tpot_s", pr->tpot_s, "s");
	n = metrics_put(out, n, "infer.latency_s", pr->latency_s, "s");
	n = metrics_put(out, n, "infer.tokens_per_s_per_gpu", pr->tokens_per_s_gpu, "1/s");
	n = metrics_put(out, n, "infer.tokens_per_s_per_node", pr->tokens_per_s_node, "1/s");
	n = metrics_put(out, n, "infer.prefill.flops", pr->prefill.flops, "flops");
	n = metrics_put(out, n, "infer.prefill.bytes", pr->prefill.bytes, "bytes");
	n = metrics_put(out, n, "infer.prefill.bound", pr->prefill.bound, "1");
	n = metrics_put(out, n, "infer.decode.flops", pr->decode.flops, "flops");
	n = metrics_put(out, n, "infer.decode.bytes", pr->decode.bytes, "bytes");
	n = metrics_put(out, n, "infer.decode.bound", pr->decode.bound, "1");
	if (sc->wl.continuous) {
		const InferContinuous *c = &pr->cb;
		n = metrics_put(out, n, "infer.continuous.served", c->stable, "1");
		n = metrics_put(out, n, "infer.continuous.requests_per_s_per_replica", c->rate_replica, "1/s");
		n = metrics_put(out, n, "infer.continuous.prefill_utilization", c->prefill_util, "1");
		n = metrics_put(out, n, "infer.continuous.concurrency", c->concurrency, "1");
		n = metrics_put(out, n, "infer.continuous.requests_in_system", c->in_system, "1");
		n = metrics_put(out, n, "infer.continuous.kv_cache_bytes", c->kv_bytes, "bytes");
		n = metrics_put(out, n, "infer.continuous.max_concurrency", (double)c->max_concurrency, "1");
	}
	if (pr->replayed) {
		const InferReplay *r = &pr->replay;
		const struct { const char *name, *unit; double v; } t[] = {
			{"infer.trace.requests", "1", (double)r->requests},
			{"infer.trace.ttft_mean_s", "s", r->ttft_mean_s},
			{"infer.trace.ttft_p50_s", "s", r->ttft_p50_s},
			{"infer.trace.ttft_p99_s", "s", r->ttft_p99_s},
			{"infer.trace.tpot_mean_s", "s", r->tpot_mean_s},
			{"infer.trace.tpot_p99_s", "s", r->tpot_p99_s},
			{"infer.trace.latency_mean_s", "s", r->latency_mean_s},
			{"infer.trace.latency_p99_s", "s", r->latency_p99_s},
			{"infer.trace.makespan_s", "s", r->makespan_s},
			{"infer.trace.tokens_per_s_per_gpu", "1/s", r->tokens_per_s_gpu},
			{"infer.trace.peak_concurrency", "1", (double)r->peak_concurrency},
			{"infer.trace.peak_kv_tokens", "1", (double)r->peak_kv_tokens},
			{"infer.trace.kv_tokens", "1", (double)r->kv_tokens},
			{"infer.trace.peak_kv_blocks", "1", (double)r->peak_kv_blocks},
			{"infer.trace.kv_blocks", "1", (double)r->kv_blocks},
			{"infer.trace.waited_for_room", "1", (double)r->waited_for_room},
			{"infer.trace.preemptions", "1", (double)r->preemptions},
			{"infer.trace.forwards", "1", (double)r->forwards},
		};
		for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++)
			n = metrics_put(out, n, t[i].name, t[i].v, t[i].unit);
		if (pr->paged.wl.prefix_caching) {
			n = metrics_put(out, n, "infer.trace.prefix_hit_tokens",
					(double)r->prefix_hit_tokens, "1");
			n = metrics_put(out, n, "infer.trace.prefix_evicted_blocks",
					(double)r->prefix_evicted_blocks, "1");
		}
	}
	return n;
}

cJSON *infer_report_json(const InferScenario *sc, const InferPrediction *pr)
{
	Metric m[METRICS_MAX];
	int n = infer_metrics_collect(sc, pr, m);
	cJSON *j = cJSON_CreateObject(), *metrics = cJSON_AddObjectToObject(j, "metrics");
	cJSON_AddStringToObject(j, "scenario", sc->name);
	cJSON_AddStringToObject(j, "kind", "inference");
	cJSON_AddStringToObject(j, "fits", predict_verdict_name(pr->verdict));
	cJSON_AddStringToObject(j, "prefill_bound", infer_bound_name(pr->prefill.bound));
	cJSON_AddStringToObject(j, "decode_bound", infer_bound_name(pr->decode.bound));
	cJSON_AddStringToObject(j, "profile", pr->hw_source);
	for (int i = 0; i < n; i++)
		cJSON_AddNumberToObject(metrics, m[i].name, m[i].value);
	cJSON *nm = cJSON_AddArrayToObject(j, "not_modelled"), *wn = cJSON_AddArrayToObject(j,
											       "warnings");
	for (int i = 0; i < sc->notes.n_not_modelled; i++)
		cJSON_AddItemToArray(nm, cJSON_CreateString(sc->notes.not_modelled[i]));
	for (int i = 0; i < sc->notes.n_warnings; i++)
		cJSON_AddItemToArray(wn, cJSON_CreateString(sc->notes.warnings[i]));
	return j;
}

static char *notes_text(const PxNotes *n)
{
	size_t len = 1;
	for (int i = 0; i < n->n_not_modelled; i++)
		len += strlen(n->not_modelled[i]) + 16;
	for (int i = 0; i < n->n_warnings; i++)
		len += strlen(n->warnings[i]) + 2;
	char *s = calloc(len, 1);
	for (int i = 0; s && i < n->n_not_modelled; i++) {
		strcat(s, "not modelled: ");
		strcat(s, n->not_modelled[i]);
		strcat(s, "\n");
	}
	for (int i = 0; s && i < n->n_warnings; i++) {
		strcat(s, n->warnings[i]);
		strcat(s, "\n");
	}
	return s;
}

int infer_store(PxDb *db, const InferScenario *sc, const InferPrediction *pr, long long *run_id,
		PxError *err)
{
	long long world = cluster_world(&sc->cluster);
	Metric m[METRICS_MAX];
	int n = infer_metrics_collect(sc, pr, m), rc = -1;
	char *json = infer_scenario_resolved_json(sc), *notes = notes_text(&sc->notes);
	DbMetric *rows = calloc((size_t)(world * n), sizeof(*rows));
	size_t k = 0;
	if (!json || !notes || !rows) {
		px_fail(err, PX_ERR_RUNTIME, "out of memory storing %s", sc->name);
		goto out;
	}
	for (long long r = 0; r < world; r++)
		for (int i = 0; i < n; i++)
			rows[k++] = (DbMetric){.rank = (int)r, .name = m[i].name, .value = m[i].value,
					       .unit = m[i].unit};
	DbRun run = {.scenario_name = sc->name, .scenario_json = json, .kind = "predicted",
		     .status = "ok", .notes = notes, .metrics = rows, .n_metrics = k,
		     .world_size = world};
	rc = db_write_run(db, &run, run_id, err);
out:
	free(rows);
	free(notes);
	cJSON_free(json);
	return rc;
}

/* ---- the command ---- */

typedef struct InferItem {
	InferScenario sc;
	InferPrediction pr;
	int loaded;
} InferItem;

static int store_item(PxDb *db, void *items, int i, const char **name, long long *id,
		      PxError *err)
{
	InferItem *it = (InferItem *)items + i;
	*name = it->sc.name;
	return infer_store(db, &it->sc, &it->pr, id, err);
}

static void print_all(const InferPredictOpts *o, InferItem *items, int n)
{
	if (o->json) {
		cJSON *out = n == 1 ? infer_report_json(&items[0].sc, &items[0].pr) :
				      cJSON_CreateArray();
		for (int i = 0; n > 1 && i < n; i++)
			cJSON_AddItemToArray(out, infer_report_json(&items[i].sc, &items[i].pr));
		char *text = cJSON_Print(out);
		puts(text);
		cJSON_free(text);
		cJSON_Delete(out);
		return;
	}
	for (int i = 0; i < n; i++) {
		if (i)
			printf("\n");
		infer_report_table(stdout, &items[i].sc, &items[i].pr);
	}
}

int infer_predict_command(const InferPredictOpts *o, char **paths, int n)
{
	PxError err = {0};
	HwProfile hw;
	int rc = 0, have_hw = 0;
	InferItem *items = calloc((size_t)n, sizeof(*items));
	if (!items) {
		fprintf(stderr, "parallax predict: out of memory\n");
		return 1;
	}
	if (o->hw) {
		if (hwprofile_load(o->hw, &hw, &err))
			rc = err.code ? err.code : 1;
		else
			have_hw = 1;
	}
	for (int i = 0; i < n && !rc; i++) {
		char found[PATH_MAX];
		const char *file = paths_find_input(paths[i], found, sizeof(found));
		int is = infer_scenario_is(file, &err);
		if (is == 0)
			px_fail(&err, PX_ERR_INPUT, "%s: a training scenario among inference ones "
				"(no \"inference\" key); predict them apart", file);
		if (is <= 0 || infer_scenario_load(&items[i].sc, file, o->ov, &err)) {
			rc = err.code ? err.code : 1;
			break;
		}
		items[i].loaded = 1;
		if (have_hw) {
			char warn[1024];
			if (hwprofile_gpu_mismatch(&hw, o->hw, &items[i].sc.cluster.gpu, warn,
						   sizeof(warn)))
				px_notes_warn(&items[i].sc.notes, "%s", warn);
			hwprofile_apply_memory(&hw, &items[i].sc.cluster);
		}
		if (infer_predict(&items[i].sc, have_hw ? &hw : NULL, o->hw, &items[i].pr, &err))
			rc = err.code ? err.code : 1;
	}
	if (!rc) {
		print_all(o, items, n);
		if (!o->no_db && store_each(o->db_path, o->json, items, n, store_item, &err))
			rc = err.code ? err.code : 1;
	}
	if (rc)
		fprintf(stderr, "parallax predict: %s\n", err.msg);
	for (int i = 0; i < n; i++) {
		infer_predict_free(&items[i].pr);
		if (items[i].loaded)
			infer_scenario_free(&items[i].sc);
	}
	if (have_hw)
		hwprofile_free(&hw);
	free(items);
	return rc;
}

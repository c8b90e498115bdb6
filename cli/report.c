#include "report.h"

#include <math.h>
#include <string.h>

#include "../sim/metrics.h"
#include "version.h"

#define GiB (1024.0 * 1024.0 * 1024.0)

static const char *ckpt_name(CkptMode c)
{
	return c == CKPT_FULL ? "full" : c == CKPT_SELECTIVE ? "selective" : "none";
}

/* ---- the echo of the effective configuration ---- */

/* DeepSpeed's ZeRO settings as they take effect: the buckets, the stage's optimizer wrapper and
 * offload, stage 3's prefetch and persistence (not FSDP's, whose line echo_config prints). */
static void zero_lines(FILE *f, const Plan *p)
{
	const Scenario *sc = p->sc;
	const DsZero *z = &sc->ds.zero;
	/* without a ZeRO optimizer the buckets are not reduce_bucket_size's (build.c) */
	char buckets[96];
	if (p->zero_optimizer)
		snprintf(buckets, sizeof(buckets), "reduce %.3g allgather %.3g elements",
			 p->reduce_bucket_elems, p->allgather_bucket_elems);
	else if (sc->framework == FRAMEWORK_PYTORCH)
		snprintf(buckets, sizeof(buckets), "DistributedDataParallel's, 1 MiB then %lld MiB",
			 sc->train_args.ddp_bucket_cap_mb);
	else
		snprintf(buckets, sizeof(buckets), "%s", p->bf16_optimizer ?
			 "one flat, all-reduced whole" : "the engine's, 5e8 elements");
	fprintf(f, "# zero       stage %d (optimizer wrapper %s); offload optimizer %s, params %s; "
		"buckets %s; overlap_comm %s, contiguous_gradients "
		"%s\n", z->stage, plan_optimizer_wrapper(p),
		offload_device_name(z->offload_optimizer.device),
		offload_device_name(z->offload_param.device), buckets, z->overlap_comm ? "on" : "off",
		z->contiguous_gradients ? "on" : p->contiguous_grads ? "on (the optimizer's offload "
		"turns it on)" : "off");
	if (z->stage == 3)
		fprintf(f, "# stage 3    prefetch %.3g, persistence threshold %.3g, max live %.3g "
			"elements; %lld parameters persistent\n", z->prefetch_bucket_elems,
			z->persistence_threshold_elems, z->max_live_elems,
			p->stages[0].persist_elems);
}

/* FSDP: the elements of the root's flat (the ends and what the layers leave to it). */
static long long fsdp_root_elems(const Plan *p)
{
	return p->units[0].own_gather + p->units[p->n_units - 1].own_gather;
}

/* FSDP's units as the auto-wrap policy made them, for the header. */
static void fsdp_wrap_text(const Plan *p, char *buf, size_t n)
{
	const FsdpSpec *fs = &p->sc->fsdp;
	if (!p->fsdp || fs->wrap == FSDP_WRAP_TRANSFORMER) {
		snprintf(buf, n, "one flat a transformer layer and the root's for the rest");
		return;
	}
	char min[48] = "";
	if (fs->wrap == FSDP_WRAP_SIZE)
		snprintf(min, sizeof(min), " (min_num_params %.3g)", fs->min_num_params);
	snprintf(buf, n, "%s%s: %s, the root's %.4g parameters (the ends and what the layers "
		 "leave) gathered from the first forward to the end of the backward",
		 scenario_fsdp_wrap_name(fs->wrap), min, p->fsdp_pieces == 0 ? "no layer a unit" :
		 p->fsdp_pieces == 1 ? "at most one unit a layer" : "several units a layer",
		 (double)fsdp_root_elems(p));
}

static void echo_config(FILE *f, const Scenario *sc, const Prediction *pr)
{
	const ModelSpec *m = &sc->model;
	const DsConfig *ds = &sc->ds;
	const ClusterSpec *c = &sc->cluster;
	const Plan *p = &pr->plan;

	char kind[112]; /* the family, and the class where the family's classes differ */
	snprintf(kind, sizeof(kind), m->arch[0] ? "%s (%s)" : "%s", m->type, m->arch);
	char vocab[96]; /* V, and the tokenizer's where Megatron's padding made it more */
	int n = snprintf(vocab, sizeof(vocab), "%lld", m->V);
	if (m->V != m->vocab_size)
		snprintf(vocab + n, sizeof(vocab) - (size_t)n, " (%lld padded to a multiple of %lld)",
			 m->vocab_size, sc->par.vocab_divisible * sc->par.tp);
	fprintf(f, "# parallax %s predict: %s (%s)\n", PX_VERSION, sc->name, sc->path);
	if (!model_known(m))
		fprintf(f, "# model      %.4g parameters (no architecture: activations unknown)\n",
			m->n_params);
	else if (m->lay.L_enc)
		fprintf(f, "# model      %s, %.4g parameters: L=%lld+%lld (encoder+decoder) h=%lld "
			"heads=%lld I=%lld V=%s; seq %lld encoder, %lld decoder\n", kind, m->n_params,
			m->lay.L_enc, m->L - m->lay.L_enc, m->h, m->a, m->I, vocab, sc->seq, sc->seq_dec);
	else
		fprintf(f, "# model      %s, %.4g parameters: L=%lld h=%lld heads=%lld kv=%lld I=%lld "
			"V=%s; seq %lld\n", kind, m->n_params, m->L, m->h, m->a, m->kv_heads, m->I,
			vocab, sc->seq);
	const ParallelSpec *q = &p->par;
	fprintf(f, "# cluster    %lld x %lld %s (%.1f GiB each, %.2f usable; node: %s), world %lld: dp "
		"%lld tp %lld pp %lld ep %lld\n", c->nodes, c->gpus_per_node, c->gpu.name,
		c->gpu.mem_bytes / GiB, c->gpu.usable_bytes / GiB,
		c->gpu.node, p->world, p->dp, q->tp, q->pp, q->ep);
	if (q->tp > 1 || q->pp > 1 || q->ep > 1)
		fprintf(f, "# parallel   layout %s, %s collectives; sequence parallel %s; pipeline %s "
			"x %lld virtual, partition %s\n",
			q->order == ORDER_TP_PP_DP ? "tp-pp-dp" : "tp-dp-pp", coll_algo_name(q->algo),
			p->shape.sp ? "on" : "off", pipe_schedule_name(q->schedule),
			q->virtual_stages,
			q->partition == PART_UNIFORM ? "uniform" :
			q->partition == PART_PARAMETERS ? "parameters" : "type:transformer");
	if (m->experts) { /* where the capacity comes from */
		char how[160];
		if (q->moe.drop_tokens)
			snprintf(how, sizeof(how), "factor %.3g, min %lld", q->moe.capacity_factor,
				 q->moe.min_capacity);
		else if (q->moe.imbalance > 0)
			snprintf(how, sizeof(how), "no drops: the busiest expert's, estimated as "
				 "imbalance %.3g x the mean", q->moe.imbalance);
		else
			snprintf(how, sizeof(how), "no drops: the busiest expert's, as expected under "
				 "uniform routing, a floor: give moe.imbalance for a trained router's");
		fprintf(f, "# moe        %lld experts, top-%lld, every %lld layer(s); capacity %lld "
			"tokens per expert (%s), %lld experts per rank\n", m->experts, m->top_k,
			m->moe_interval, p->moe_capacity, how, m->experts / q->ep);
	}
	if (m->experts && (m->moe_I || m->shared_I || m->first_dense))
		fprintf(f, "# experts    intermediate %lld each; shared experts %lld wide (dense); first "
			"%lld layer(s) dense\n", m->moe_I ? m->moe_I : m->I, m->shared_I,
			m->first_dense);
	if ((p->hpz > 1 && !p->fsdp) || p->qwz || p->qgz)
		fprintf(f, "# zero++     qwZ %s, hpZ %lld, qgZ %s\n", p->qwz ? "on" : "off", p->hpz,
			p->qgz ? "on" : "off");
	if (sc->framework == FRAMEWORK_PYTORCH)
		fprintf(f, "# framework  plain PyTorch (no DeepSpeed engine): %s\n", p->dp > 1 ?
			"DistributedDataParallel, gradients all-reduced during the last micro-batch's "
			"backward" : "one process, nothing reduced");
	char wrap[256];
	fsdp_wrap_text(p, wrap, sizeof(wrap));
	if (p->fsdp2) {
		const FsdpSpec *fs = &sc->fsdp;
		char raf[128];
		if (fs->post_forward > 1)
			snprintf(raf, sizeof(raf), "%lld (1/%lld of a layer kept over %lld ranks from "
				 "its forward to its backward)", fs->post_forward, fs->post_forward,
				 fs->post_forward);
		else
			snprintf(raf, sizeof(raf), "%s", scenario_fsdp_reshards(fs->sharding) ? "true" :
				 "false");
		fprintf(f, "# framework  PyTorch FSDP2 (fully_shard): %s, gathered through an "
			"all-gather output copied out into the parameters; reshard_after_forward %s; "
			"one unit prefetched ahead; %s%s\n", wrap,
			raf, fs->sync_each_batch || p->m == 1 ? "every micro-batch reduce-scatters" :
			"gradient sync off but for the last micro-batch (each unit's whole gradient "
			"kept)", fs->offload_params ? "; CPUOffloadPolicy: shards, their gradients and "
			"the optimizer's step on the host" : "");
	} else if (p->fsdp) {
		const FsdpSpec *fs = &sc->fsdp;
		fprintf(f, "# framework  PyTorch FSDP: %s, %s; backward_prefetch %s, forward one unit "
			"ahead; %s%s\n", scenario_fsdp_sharding_name(fs->sharding), wrap,
			scenario_fsdp_prefetch_name(fs->backward_prefetch),
			fs->sync_each_batch || p->m == 1 ? "every micro-batch reduce-scatters" :
			"no_sync but for the last micro-batch (each unit's whole gradient kept)",
			fs->offload_params ? "; CPUOffload: shards, their gradients and the optimizer's "
			"step on the host" : "");
	}
	fprintf(f, "# batch      train %lld = micro %lld x micro-batches %lld x dp %lld\n",
		ds->train_batch, ds->micro_batch, ds->grad_accum, p->dp);
	const OptimKind *k = ds->opt;
	if (p->fsdp) {
		Dtype mp = ds->autocast != DT_FP32 ? ds->autocast : ds->dtype;
		fprintf(f, "# precision  fp32 shards and gradient shards; %s gathered weights, "
			"gradients and reduce-scatter%s; optimizer %s (%d fp32 states)\n",
			dtype_name(mp), p->mixed ? " (MixedPrecision, under torch autocast)" : "",
			ds->optimizer, ds->optimizer_states);
	} else {
		fprintf(f, "# precision  %s params, %s grads, %s communication%s; optimizer %s (%d "
			"fp32 states%s%s)\n", dtype_name(ds->dtype), dtype_name(ds->grad_dtype),
			dtype_name(ds->comm_dtype),
			p->mixed ? ", fp32 master weights" : p->master_bytes ?
			", fp32 copy of the partition" : ds->autocast == DT_FP16 ?
			", torch autocast fp16 compute (16-bit weight copies)" :
			ds->autocast == DT_BF16 ?
			", torch autocast bf16 compute (16-bit weight copies)" : "",
			ds->optimizer, ds->optimizer_states,
			k && k->muon ? " off the matrices, 1 momentum on them" : "",
			k && k->error_feedback ? " + 1-bit error feedback" : "");
	}
	const OptimImpl *im = optim_impl(p->opt_impl);
	if (im->copies > 0)
		fprintf(f, "# optimizer  %s update (%s): %.3f GiB of fp32 temporaries while it runs "
			"(%s)\n", im->name, ds->opt_impl_trainer ? "the Trainer's training_args.optim" :
			"optimizer.params.torch_adam", p->stages[pr->worst].opt_step_temp_bytes / GiB,
			im->source);
	if (!p->fsdp)
		zero_lines(f, p);
	fprintf(f, "# checkpoint %s%s%s; attention %s%s\n", ckpt_name(sc->ckpt),
		ds->partition_activations && sc->ckpt == CKPT_FULL ? ", partitioned" : "",
		ds->cpu_checkpointing && sc->ckpt == CKPT_FULL ? ", on CPU" : "",
		ds->sparse.mode != SPARSE_OFF ? "block-sparse (DeepSpeed's sparse_attention)" :
		sc->attention == ATTN_FLASH ? "flash (FlashAttention-2)" : "eager",
		sc->model_code == MODEL_CODE_HUGGINGFACE ? "; model code Hugging Face's eager modules "
		"(what they keep op by op, the causal LM loss's transients)" : "");
	if (ds->sparse.mode != SPARSE_OFF) {
		const SparseAttn *a = &ds->sparse;
		double nb = (double)sparse_layout_blocks(a, sc->seq);
		fprintf(f, "# sparse     %s, %s, block %lld: %.4g of %.0f blocks per head kept "
			"(%.3g of the s^2 scores)\n", sparse_mode_name(a->mode),
			a->unidirectional ? "unidirectional" : "bidirectional", a->block,
			sc->sparse_blocks, nb * nb, sc->sparse_blocks / (nb * nb));
	}
}

/* ---- step time ---- */

static void time_table(FILE *f, const Scenario *sc, const Prediction *pr)
{
	const TimeResult *t = &pr->time;
	const TimeBreakdown *b = &t->breakdown;
	if (!pr->time_known) {
		fprintf(f, "\n# step time: not priced: %s\n", pr->time_note);
		return;
	}
	fprintf(f, "\nstep time (pipeline stage %d, the slowest; profile: %s)\n", t->slowest,
		pr->hw_source);
	fprintf(f, "%-26s %12s %8s\n", "part", "seconds", "share");
	const struct { const char *name; double s; } rows[] = {
		{"forward", b->fwd_s}, {"backward", b->bwd_s}, {"recompute", b->recompute_s},
		{"optimizer", b->optimizer_s}, {"pipeline bubble", b->bubble_s},
		{"offload stall", b->offload_stall_s},
	};
	for (unsigned i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
		if (rows[i].s > 0)
			fprintf(f, "%-26s %12.4f %7.1f%%\n", rows[i].name, rows[i].s,
				100 * rows[i].s / t->step_s);
	for (int g = 0; g < N_GROUPS; g++)
		if (b->comm_s[g] > 0) {
			char name[40];
			snprintf(name, sizeof(name), "exposed comm (%s)", group_name(g));
			fprintf(f, "%-26s %12.4f %7.1f%%\n", name, b->comm_s[g],
				100 * b->comm_s[g] / t->step_s);
		}
	fprintf(f, "%-26s %12.4f %7.1f%%\n", "step", t->step_s, 100.0);
	if (b->host_wait_s >= 0.01 * t->step_s) /* worth a line from 1% of the step */
		fprintf(f, "# of the compute, %.4f s (%.1f%% of the step) is the GPU waiting for the "
			"host to issue kernels (host overhead: docs/time_model.md)\n", b->host_wait_s,
			100 * b->host_wait_s / t->step_s);
	if (sc->backend == BACKEND_CPU) { /* a rank is a process on this machine's cores */
		fprintf(f, "# %.0f tokens/s; %.2f GFLOP/s per rank of model FLOPs, %.3f of the "
			"profile's best sgemm rate (%.1f GFLOP/s with the ranks running at once)\n",
			t->tokens_per_s, t->tflops_per_gpu * 1e3, t->mfu, t->peak_flops_per_gpu / 1e9);
		fprintf(f, "# the CPU executor's time model, its assumptions and known error: "
			"docs/time_model.md, \"The CPU executor\"\n");
		return;
	}
	double secs, gpu_h, tokens = 300e9;
	timeline_train_cost(t, tokens, pr->plan.world, &secs, &gpu_h);
	fprintf(f, "# %.0f tokens/s; %.1f TFLOP/s per GPU of model FLOPs (%.1f with recompute), MFU "
		"%.3f; 300B tokens: %.1f days, %.3g GPU-hours\n", t->tokens_per_s, t->tflops_per_gpu,
		t->hw_tflops_per_gpu, t->mfu, secs / 86400, gpu_h);
	fprintf(f, "# the time model's assumptions and known error: docs/time_model.md\n");
}

static void echo_notes(FILE *f, const Scenario *sc)
{
	for (int i = 0; i < sc->notes.n_not_modelled; i++)
		fprintf(f, "# not modelled: %s\n", sc->notes.not_modelled[i]);
	for (int i = 0; i < sc->notes.n_warnings; i++)
		fprintf(f, "# %s\n", sc->notes.warnings[i]);
}

/* ---- tables ---- */

/* A verdict in a table's column: "yes", "tight", "NO". */
static const char *verdict_word(Verdict v)
{
	return v == VERDICT_FITS ? "yes" : v == VERDICT_TIGHT ? "tight" : "NO";
}

static void memory_table(FILE *f, const Prediction *pr)
{
	const StagePrediction *w = &pr->stages[pr->worst];
	const MemPlace *g = &w->mem.place[PLACE_GPU];
	const double ideal[N_CATS] = {w->ideal.params_bytes, w->ideal.grads_bytes,
				      w->ideal.optimizer_bytes};

	fprintf(f, "\nmemory per GPU at its peak (pipeline stage %d of %d, the worst; GiB = 2^30 "
		"bytes)\n", pr->worst, pr->n_stages);
	const MemPlace *nvme = &w->mem.place[PLACE_NVME];
	int nv = nvme->peak_bytes > 0; /* a column of its own where something is on NVMe */
	fprintf(f, "%-14s %16s %16s %16s", "category", "ZeRO-ideal GiB", "GPU GiB", "CPU GiB");
	fprintf(f, nv ? " %16s\n" : "\n", "NVMe GiB");
	for (int c = 0; c < N_CATS; c++) {
		char gpu[32], ideal_s[32];
		if (c == CAT_WORKSPACE && !g->cat_peak[c] && !w->mem.place[PLACE_CPU].cat_peak[c])
			continue; /* only an executor's scenario has any */
		if (c == CAT_ACTIV && !pr->plan.activations_known)
			snprintf(gpu, sizeof(gpu), "unknown");
		else
			snprintf(gpu, sizeof(gpu), "%.3f", g->at_peak[c] / GiB);
		if (c <= CAT_OPTIM)
			snprintf(ideal_s, sizeof(ideal_s), "%.3f", ideal[c] / GiB);
		else
			snprintf(ideal_s, sizeof(ideal_s), "-");
		fprintf(f, "%-14s %16s %16s %16.3f", cat_name(c), ideal_s, gpu,
			w->mem.place[PLACE_CPU].at_peak[c] / GiB);
		if (nv)
			fprintf(f, " %16.3f", nvme->at_peak[c] / GiB);
		fprintf(f, "\n");
	}
	fprintf(f, "%-14s %16.3f %16.3f %16.3f", "total", w->ideal.total_bytes / GiB,
		g->peak_bytes / GiB, w->mem.place[PLACE_CPU].peak_bytes / GiB);
	if (nv)
		fprintf(f, " %16.3f", nvme->peak_bytes / GiB);
	fprintf(f, "\n# ZeRO-ideal: the paper's model states only (Rajbhandari et al. 2020, Table 1)%s; "
		"GPU/CPU%s: this implementation's buffers at the place's peak\n",
		pr->plan.bf16_optimizer && pr->plan.sc->ds.zero.stage == 0 ? ", partitioned as BF16_Optimizer "
		"does (ZeRO-1's, with its gradients in the accumulation dtype)" : "",
		nv ? "/NVMe" : "");
	if (g->cat_peak[CAT_WORKSPACE] > 0)
		fprintf(f, "# workspace: the executor's own working buffers (a unit's working copies, "
			"the hidden state, backward scratch), apart from what DeepSpeed holds\n");

	char when[256];
	moment_describe(&pr->plan, &w->gpu_moment, when, sizeof(when));
	fprintf(f, "# GPU peak: %s\n", when);
	int exec_cuda = pr->plan.sc->backend == BACKEND_CUDA;
	const AllocConf *ac = &pr->plan.sc->alloc_conf;
	char conf[192] = ""; /* the scenario's pytorch_cuda_alloc_conf, as the model applies it */
	alloc_conf_describe(ac, conf, sizeof(conf));
	if (w->alloc_known && pr->plan.sc->backend != BACKEND_CPU) /* sim/allocator.h */
		fprintf(f, "# through %s%s: max_memory_allocated %.3f GiB, max_memory_reserved %.3f "
			"GiB (%lld segments); nvidia-smi %.3f GiB (reserved + %.3f GiB outside it: "
			"CUDA context, %s)\n",
			exec_cuda ? "a caching allocator of PyTorch's design (model; the executor's "
				    "with PX_CUDA_ALLOC=caching)" :
				    "PyTorch's caching allocator (model)", conf,
			w->alloc.allocated_bytes / GiB, w->alloc.reserved_bytes / GiB,
			w->alloc.segments, w->alloc.smi_bytes / GiB, w->alloc.outside_bytes / GiB,
			exec_cuda ? "cuBLAS's workspace, NCCL" : "NCCL");

	fprintf(f, "\n%-6s %14s %14s %13s\n", "place", "peak GiB", "capacity GiB", "fits");
	const double cap[N_PLACES] = {pr->gpu_capacity_bytes, pr->cpu_capacity_bytes,
				      pr->nvme_capacity_bytes};
	const int fits[N_PLACES] = {w->fits_gpu, w->fits_cpu, w->fits_nvme};
	for (int pl = 0; pl < N_PLACES; pl++)
		fprintf(f, "%-6s %14.3f %14.2f %13s\n", place_name(pl),
			w->mem.place[pl].peak_bytes / GiB, cap[pl] / GiB,
			pl == PLACE_GPU ? verdict_word(predict_gpu_verdict(w->mem.place[pl].peak_bytes,
									  cap[pl])) :
			fits[pl] ? "yes" : "NO");
	fprintf(f, "# GPU capacity: usable, %.2f GiB of the listed %.2f GiB (%s); tight: a peak within "
		"%.0f%% (%.2f GiB) of it, where the caching allocator's fragmentation decides\n",
		pr->gpu_capacity_bytes / GiB, pr->gpu_memory_bytes / GiB, pr->gpu_capacity_source,
		100 * PREDICT_TIGHT_MARGIN, pr->gpu_margin_bytes / GiB);
	fprintf(f, "# CPU and NVMe capacity: the node's share per GPU\n");
}

/* The layers a stage holds, as "3-14" (blocks) or "emb,1-12" style ranges over its chunks. */
static void stage_layers(const Prediction *pr, int s, char *buf, size_t n)
{
	const Plan *p = &pr->plan;
	size_t len = 0;
	buf[0] = '\0';
	for (int j = s; j < p->n_chunks; j += (int)p->par.pp) {
		int lo = p->chunk_bounds[j], hi = p->chunk_bounds[j + 1] - 1;
		len += (size_t)snprintf(buf + len, len < n ? n - len : 0, "%s%d-%d", len ? "," : "",
					lo, hi);
	}
}

static void stage_table(FILE *f, const Prediction *pr)
{
	int order[4096];
	if (pr->n_stages <= 1 || pr->n_stages > 4096)
		return;
	predict_stage_order(pr, order);
	fprintf(f, "\nmemory per pipeline stage, worst first (GiB; units: 0 = embedding, 1..L = "
		"layers, L+1 = head)\n");
	fprintf(f, "%5s %-14s %8s %8s %8s %8s %8s %8s %9s %5s\n", "stage", "units", "params",
		"grads", "optim", "activ", "buffers", "overhd", "peak", "fits");
	for (int i = 0; i < pr->n_stages; i++) {
		const StagePrediction *sp = &pr->stages[order[i]];
		const double *c = sp->mem.place[PLACE_GPU].at_peak;
		char units[64];
		stage_layers(pr, order[i], units, sizeof(units));
		fprintf(f, "%5d %-14.14s %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f %9.2f %5s\n", order[i],
			units, c[CAT_PARAMS] / GiB, c[CAT_GRADS] / GiB, c[CAT_OPTIM] / GiB,
			c[CAT_ACTIV] / GiB, c[CAT_BUFFERS] / GiB, c[CAT_OVERHEAD] / GiB,
			sp->mem.place[PLACE_GPU].peak_bytes / GiB, verdict_word(sp->verdict));
	}
}

static void comm_table(FILE *f, const Prediction *pr)
{
	const Traffic *t = &pr->stages[pr->worst].traffic;
	fprintf(f, "\ncommunication per rank per optimizer step (ring algorithms)\n");
	fprintf(f, "%-16s %8s %16s %16s\n", "collective", "calls", "payload GiB", "sent GiB");
	for (int k = 0; k < N_COLLS; k++) {
		if (!t->n_colls[k])
			continue;
		fprintf(f, "%-16s %8lld %16.3f %16.3f\n", coll_name(k), t->n_colls[k],
			t->payload_bytes[k] / GiB, t->wire_bytes[k] / GiB);
	}
	fprintf(f, "%-16s %8s %16.3f %16.3f\n", "total", "",
		traffic_payload_total(t) / GiB, t->wire_total_bytes / GiB);
	fprintf(f, "# payload: nccl-tests \"size\" (the whole array); sent: what this rank puts on "
		"the wire (stage %d)\n", pr->worst);
	fprintf(f, "\n%-8s %16s %16s\n", "group", "payload GiB", "sent GiB");
	for (int g = 0; g < N_GROUPS; g++)
		if (t->group_payload_bytes[g] > 0 || t->group_wire_bytes[g] > 0)
			fprintf(f, "%-8s %16.3f %16.3f\n", group_name(g),
				t->group_payload_bytes[g] / GiB, t->group_wire_bytes[g] / GiB);
	fprintf(f, "\n%-22s %16s\n", "link", "sent GiB");
	fprintf(f, "%-22s %16.3f\n", "intra-node (NVLink)", t->intra_node_bytes / GiB);
	fprintf(f, "%-22s %16.3f\n", "inter-node (network)", t->inter_node_bytes / GiB);
	fprintf(f, "%-22s %16.3f\n", "node egress (network)", t->node_egress_bytes / GiB);
	fprintf(f, "# sent: per rank; node egress: what one node sends to the others, every GPU of "
		"it together\n");
	double copies = 0;
	for (int d = 0; d < N_COPIES; d++)
		copies += t->copy_bytes[d];
	if (copies > 0) {
		fprintf(f, "\n%-16s %16s\n", "offload copy", "GiB per step");
		for (int d = 0; d < N_COPIES; d++)
			if (t->copy_bytes[d] > 0)
				fprintf(f, "%-16s %16.3f\n", copy_name(d), t->copy_bytes[d] / GiB);
	}
}

void report_table(FILE *f, const Scenario *sc, const Prediction *pr)
{
	echo_config(f, sc, pr);
	echo_notes(f, sc);
	memory_table(f, pr);
	stage_table(f, pr);
	comm_table(f, pr);
	report_onebit_table(f, pr);
	time_table(f, sc, pr);
	fprintf(f, "\n# %s on %s: peak %.2f GiB of %.2f GiB usable per GPU (margin %.0f%%, %.2f "
		"GiB): %s\n", sc->name, sc->cluster.gpu.name,
		pr->stages[pr->worst].mem.place[PLACE_GPU].peak_bytes / GiB,
		pr->gpu_capacity_bytes / GiB, 100 * PREDICT_TIGHT_MARGIN, pr->gpu_margin_bytes / GiB,
		pr->verdict == VERDICT_FITS ? "fits" : pr->verdict == VERDICT_TIGHT ?
		"TIGHT (within the margin: the allocator decides)" : "DOES NOT FIT");
}

void report_summary_header(FILE *f)
{
	fprintf(f, "%-28s %-10s %6s %5s %9s %9s %9s %9s %6s %11s %9s %6s\n", "scenario", "gpu",
		"world", "stage", "params", "ideal_GiB", "peak_GiB", "cap_GiB", "fits", "comm_GiB",
		"step_s", "mfu");
}

void report_summary_line(FILE *f, const Scenario *sc, const Prediction *pr)
{
	double payload = traffic_payload_total(&pr->stages[pr->worst].traffic);
	fprintf(f, "%-28.28s %-10s %6lld %5d %9.4g %9.2f %9.2f %9.1f %6s %11.2f %9.3g %6.3f\n", sc->name,
		sc->cluster.gpu.name, pr->plan.world, sc->ds.zero.stage, sc->model.n_params,
		pr->stages[pr->worst].ideal.total_bytes / GiB,
		pr->stages[pr->worst].mem.place[PLACE_GPU].peak_bytes / GiB,
		pr->gpu_capacity_bytes / GiB, verdict_word(pr->verdict), payload / GiB,
		pr->time_known ? pr->time.step_s : NAN, pr->time_known ? pr->time.mfu : NAN);
}

/* ---- JSON ---- */

/* Put value at a dotted name, creating the objects on the way. */
static void json_put(cJSON *root, const char *dotted, cJSON *value)
{
	char name[64];
	snprintf(name, sizeof(name), "%.63s", dotted);
	cJSON *o = root;
	char *seg = name, *dot;
	while ((dot = strchr(seg, '.'))) {
		*dot = '\0';
		cJSON *next = cJSON_GetObjectItemCaseSensitive(o, seg);
		if (!next)
			next = cJSON_AddObjectToObject(o, seg);
		o = next;
		seg = dot + 1;
	}
	cJSON_AddItemToObject(o, seg, value);
}

static cJSON *string_array(char **v, int n)
{
	cJSON *a = cJSON_CreateArray();
	for (int i = 0; i < n; i++)
		cJSON_AddItemToArray(a, cJSON_CreateString(v[i]));
	return a;
}

/* When a stage's GPU peak came, in words (sim/moment.h). */
static cJSON *moment_json(const Prediction *pr, int stage)
{
	const PeakMoment *mo = &pr->stages[stage].gpu_moment;
	char unit[32], text[256];
	cJSON *o = cJSON_CreateObject();
	cJSON_AddStringToObject(o, "phase", moment_phase_name(mo->phase));
	if (mo->unit >= 0)
		cJSON_AddStringToObject(o, "unit", moment_unit_name(&pr->plan, mo->unit, unit,
								      sizeof(unit)));
	else
		cJSON_AddNullToObject(o, "unit");
	if (mo->micro_batch > 0)
		cJSON_AddNumberToObject(o, "micro_batch", mo->micro_batch);
	else
		cJSON_AddNullToObject(o, "micro_batch");
	cJSON_AddNumberToObject(o, "micro_batches", mo->micro_batches);
	cJSON_AddBoolToObject(o, "later_micro_batches_repeat_it", mo->repeats);
	if (mo->what >= 0)
		cJSON_AddStringToObject(o, "allocating", buf_name((BufWhat)mo->what));
	else
		cJSON_AddNullToObject(o, "allocating");
	cJSON_AddNumberToObject(o, "op", mo->op);
	moment_describe(&pr->plan, mo, text, sizeof(text));
	cJSON_AddStringToObject(o, "text", text);
	return o;
}

/* One stage's metrics as a nested object. */
static cJSON *metrics_json(const Prediction *pr, int stage)
{
	Metric m[METRICS_MAX];
	int n = metrics_collect(pr, stage, m);
	cJSON *j = cJSON_CreateObject();
	for (int i = 0; i < n; i++) {
		cJSON *v;
		if (!strcmp(m[i].name, "memory.fits"))
			v = cJSON_CreateBool(m[i].value != 0);
		else if (!strcmp(m[i].name, "memory.verdict")) /* its words; the database's 0-2 */
			v = cJSON_CreateString(predict_verdict_name((Verdict)m[i].value));
		else if (!strncmp(m[i].name, "memory.gpu.peak_moment.", 23))
			continue; /* below, in words */
		else if (!m[i].known)
			v = cJSON_CreateNull();
		else
			v = cJSON_CreateNumber(m[i].value);
		json_put(j, m[i].name, v);
	}
	json_put(j, "memory.gpu_capacity_source", cJSON_CreateString(pr->gpu_capacity_source));
	json_put(j, "memory.gpu.peak_moment", moment_json(pr, stage));
	return j;
}

static cJSON *parallel_json(const Plan *p)
{
	const ParallelSpec *q = &p->par;
	cJSON *j = cJSON_CreateObject();
	cJSON_AddStringToObject(j, "rank_order", q->order == ORDER_TP_PP_DP ? "tp-pp-dp" : "tp-dp-pp");
	cJSON_AddStringToObject(j, "collective_algorithm", coll_algo_name(q->algo));
	cJSON_AddBoolToObject(j, "sequence_parallel", p->shape.sp);
	cJSON_AddStringToObject(j, "pipeline_schedule", pipe_schedule_name(q->schedule));
	cJSON_AddNumberToObject(j, "virtual_stages", (double)q->virtual_stages);
	cJSON_AddNumberToObject(j, "micro_batches", (double)p->m);
	cJSON_AddNumberToObject(j, "edp", (double)p->edp);
	if (p->sc->model.experts) {
		cJSON_AddNumberToObject(j, "experts", (double)p->sc->model.experts);
		cJSON_AddNumberToObject(j, "moe_capacity", (double)p->moe_capacity);
	}
	cJSON *groups = cJSON_AddObjectToObject(j, "groups");
	for (int g = 0; g < N_GROUPS; g++) {
		cJSON *o = cJSON_AddObjectToObject(groups, group_name(g));
		cJSON_AddNumberToObject(o, "ranks", (double)p->spans[g].n);
		cJSON_AddNumberToObject(o, "nodes", (double)p->spans[g].nodes);
		cJSON_AddNumberToObject(o, "per_node", (double)p->spans[g].per_node);
	}
	return j;
}

cJSON *report_json(const Scenario *sc, const Prediction *pr)
{
	const Plan *p = &pr->plan;
	cJSON *j = metrics_json(pr, pr->worst); /* the worst stage's metrics at the top level */
	int order[4096];

	cJSON_AddStringToObject(j, "scenario", sc->name);
	cJSON_AddStringToObject(j, "path", sc->path);
	cJSON_AddStringToObject(j, "parallax_version", PX_VERSION);
	cJSON_AddNumberToObject(j, "world_size", (double)p->world);
	cJSON_AddNumberToObject(j, "dp", (double)p->dp);
	cJSON_AddNumberToObject(j, "tp", (double)p->par.tp);
	cJSON_AddNumberToObject(j, "pp", (double)p->par.pp);
	cJSON_AddNumberToObject(j, "ep", (double)p->par.ep);
	cJSON_AddNumberToObject(j, "num_parameters", sc->model.n_params);
	cJSON_AddNumberToObject(j, "zero_stage", sc->ds.zero.stage);
	cJSON_AddStringToObject(j, "framework", scenario_framework_name(sc->framework));
	cJSON_AddStringToObject(j, "model_code", scenario_model_code_name(sc->model_code));
	if (p->fsdp) {
		cJSON *fs = cJSON_AddObjectToObject(j, "fsdp");
		cJSON_AddStringToObject(fs, "auto_wrap_policy", scenario_fsdp_wrap_name(sc->fsdp.wrap));
		if (sc->fsdp.wrap == FSDP_WRAP_SIZE)
			cJSON_AddNumberToObject(fs, "min_num_params", sc->fsdp.min_num_params);
		cJSON_AddNumberToObject(fs, "root_params", (double)fsdp_root_elems(p));
		cJSON_AddNumberToObject(fs, "max_units_per_layer", p->fsdp_pieces);
	}
	const OptimImpl *im = optim_impl(p->opt_impl);
	cJSON *opt = cJSON_AddObjectToObject(j, "optimizer");
	cJSON_AddStringToObject(opt, "type", sc->ds.optimizer);
	cJSON_AddStringToObject(opt, "implementation", im->name);
	cJSON_AddStringToObject(opt, "built_by", sc->ds.opt_impl_trainer ? "trainer" : "deepspeed");
	cJSON_AddStringToObject(opt, "wrapper", plan_optimizer_wrapper(p));
	cJSON_AddStringToObject(opt, "implementation_source", im->source);
	cJSON_AddNumberToObject(opt, "step_transient_bytes",
				p->stages[pr->worst].opt_step_temp_bytes);
	cJSON_AddNumberToObject(j, "train_batch_size", (double)sc->ds.train_batch);
	cJSON_AddNumberToObject(j, "train_micro_batch_size_per_gpu", (double)sc->ds.micro_batch);
	cJSON_AddNumberToObject(j, "gradient_accumulation_steps", (double)sc->ds.grad_accum);
	cJSON_AddStringToObject(j, "gpu", sc->cluster.gpu.name);
	cJSON_AddBoolToObject(j, "fits_all_stages", pr->fits);
	cJSON_AddStringToObject(j, "verdict", predict_verdict_name(pr->verdict));
	cJSON_AddItemToObject(j, "parallel", parallel_json(p));
	cJSON *stages = cJSON_AddArrayToObject(j, "stages");
	if (pr->n_stages <= 4096) {
		predict_stage_order(pr, order);
		for (int i = 0; i < pr->n_stages; i++) {
			cJSON *o = metrics_json(pr, order[i]);
			char units[256];
			stage_layers(pr, order[i], units, sizeof(units));
			cJSON_AddStringToObject(o, "units", units);
			cJSON_AddItemToArray(stages, o);
		}
	}
	cJSON *onebit = report_onebit_json(pr);
	if (onebit)
		cJSON_AddItemToObject(j, "onebit", onebit);
	cJSON *notes = cJSON_AddObjectToObject(j, "notes");
	cJSON_AddItemToObject(notes, "not_modelled",
			      string_array(sc->notes.not_modelled, sc->notes.n_not_modelled));
	cJSON_AddItemToObject(notes, "warnings",
			      string_array(sc->notes.warnings, sc->notes.n_warnings));
	return j;
}

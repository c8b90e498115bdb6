#include "report.h"

#include <string.h>

#include "../sim/metrics.h"
#include "version.h"

#define GiB (1024.0 * 1024.0 * 1024.0)

static const char *ckpt_name(CkptMode c)
{
	return c == CKPT_FULL ? "full" : c == CKPT_SELECTIVE ? "selective" : "none";
}

/* ---- the echo of the effective configuration ---- */

static void echo_config(FILE *f, const Scenario *sc, const Prediction *pr)
{
	const ModelSpec *m = &sc->model;
	const DsConfig *ds = &sc->ds;
	const DsZero *z = &ds->zero;
	const ClusterSpec *c = &sc->cluster;
	const Plan *p = &pr->plan;

	fprintf(f, "# parallax %s predict: %s (%s)\n", PX_VERSION, sc->name, sc->path);
	if (m->arch == ARCH_PARAMS_ONLY)
		fprintf(f, "# model      %.4g parameters (no architecture: activations unknown)\n",
			m->n_params);
	else
		fprintf(f, "# model      %s, %.4g parameters: L=%lld h=%lld heads=%lld kv=%lld I=%lld "
			"V=%lld; seq %lld\n", m->type, m->n_params, m->L, m->h, m->a, m->kv_heads, m->I,
			m->V, sc->seq);
	fprintf(f, "# cluster    %lld x %lld %s (%.1f GiB each; node: %s), world %lld: dp %lld tp 1 "
		"pp 1 ep 1\n", c->nodes, c->gpus_per_node, c->gpu.name, c->gpu.mem_bytes / GiB,
		c->gpu.node, p->world, p->dp);
	fprintf(f, "# batch      train %lld = micro %lld x accumulation %lld x dp %lld\n",
		ds->train_batch, ds->micro_batch, ds->grad_accum, p->dp);
	fprintf(f, "# precision  %s params, %s grads, %s communication%s; optimizer %s (%d fp32 "
		"states)\n", dtype_name(ds->dtype), dtype_name(ds->grad_dtype),
		dtype_name(ds->comm_dtype), p->mixed ? ", fp32 master weights" : "", ds->optimizer,
		ds->optimizer_states);
	fprintf(f, "# zero       stage %d; offload optimizer %s, params %s; buckets reduce %.3g "
		"allgather %.3g elements; overlap_comm %s, contiguous_gradients %s\n", z->stage,
		offload_device_name(z->offload_optimizer.device),
		offload_device_name(z->offload_param.device), p->reduce_bucket_elems,
		p->allgather_bucket_elems, z->overlap_comm ? "on" : "off",
		z->contiguous_gradients ? "on" : "off");
	if (z->stage == 3)
		fprintf(f, "# stage 3    prefetch %.3g, persistence threshold %.3g, max live %.3g "
			"elements; %lld parameters persistent\n", z->prefetch_bucket_elems,
			z->persistence_threshold_elems, z->max_live_elems, p->persist_elems);
	fprintf(f, "# checkpoint %s%s%s\n", ckpt_name(sc->ckpt),
		ds->partition_activations && sc->ckpt == CKPT_FULL ? ", partitioned" : "",
		ds->cpu_checkpointing && sc->ckpt == CKPT_FULL ? ", on CPU" : "");
}

static void echo_notes(FILE *f, const Scenario *sc)
{
	for (int i = 0; i < sc->notes.n_not_modelled; i++)
		fprintf(f, "# not modelled: %s\n", sc->notes.not_modelled[i]);
	for (int i = 0; i < sc->notes.n_warnings; i++)
		fprintf(f, "# %s\n", sc->notes.warnings[i]);
}

/* ---- tables ---- */

static void memory_table(FILE *f, const Prediction *pr)
{
	const MemPlace *g = &pr->mem.place[PLACE_GPU];
	const double ideal[N_CATS] = {pr->ideal.params_bytes, pr->ideal.grads_bytes,
				      pr->ideal.optimizer_bytes};

	fprintf(f, "\nmemory per GPU at its peak (rank 0; GiB = 2^30 bytes)\n");
	fprintf(f, "%-14s %16s %16s %16s\n", "category", "ZeRO-ideal GiB", "GPU GiB", "CPU GiB");
	for (int c = 0; c < N_CATS; c++) {
		char gpu[32];
		if (c == CAT_ACTIV && !pr->plan.activations_known)
			snprintf(gpu, sizeof(gpu), "unknown");
		else
			snprintf(gpu, sizeof(gpu), "%.3f", g->at_peak[c] / GiB);
		if (c <= CAT_OPTIM)
			fprintf(f, "%-14s %16.3f %16s %16.3f\n", cat_name(c), ideal[c] / GiB, gpu,
				pr->mem.place[PLACE_CPU].at_peak[c] / GiB);
		else
			fprintf(f, "%-14s %16s %16s %16.3f\n", cat_name(c), "-", gpu,
				pr->mem.place[PLACE_CPU].at_peak[c] / GiB);
	}
	fprintf(f, "%-14s %16.3f %16.3f %16.3f\n", "total", pr->ideal.total_bytes / GiB,
		g->peak_bytes / GiB, pr->mem.place[PLACE_CPU].peak_bytes / GiB);
	fprintf(f, "# ZeRO-ideal: the paper's model states only (Rajbhandari et al. 2020, Table 1); "
		"GPU/CPU: this implementation's buffers at the place's peak\n");

	fprintf(f, "\n%-6s %14s %14s %6s\n", "place", "peak GiB", "capacity GiB", "fits");
	const double cap[N_PLACES] = {pr->gpu_capacity_bytes, pr->cpu_capacity_bytes,
				      pr->nvme_capacity_bytes};
	const int fits[N_PLACES] = {pr->fits_gpu, pr->fits_cpu, pr->fits_nvme};
	for (int pl = 0; pl < N_PLACES; pl++)
		fprintf(f, "%-6s %14.3f %14.1f %6s\n", place_name(pl),
			pr->mem.place[pl].peak_bytes / GiB, cap[pl] / GiB, fits[pl] ? "yes" : "NO");
	fprintf(f, "# CPU and NVMe capacity: the node's share per GPU\n");
}

static void comm_table(FILE *f, const Prediction *pr)
{
	const Traffic *t = &pr->traffic;
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
		"the wire\n");
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
	comm_table(f, pr);
	fprintf(f, "\n# %s on %s: peak %.2f GiB of %.2f GiB per GPU: %s\n", sc->name,
		sc->cluster.gpu.name, pr->mem.place[PLACE_GPU].peak_bytes / GiB,
		pr->gpu_capacity_bytes / GiB, pr->fits ? "fits" : "DOES NOT FIT");
}

void report_summary_header(FILE *f)
{
	fprintf(f, "%-28s %-10s %6s %5s %9s %9s %9s %9s %6s %11s\n", "scenario", "gpu", "world",
		"stage", "params", "ideal_GiB", "peak_GiB", "cap_GiB", "fits", "comm_GiB");
}

void report_summary_line(FILE *f, const Scenario *sc, const Prediction *pr)
{
	double payload = traffic_payload_total(&pr->traffic);
	fprintf(f, "%-28.28s %-10s %6lld %5d %9.4g %9.2f %9.2f %9.1f %6s %11.2f\n", sc->name,
		sc->cluster.gpu.name, pr->plan.world, pr->plan.stage, sc->model.n_params,
		pr->ideal.total_bytes / GiB, pr->mem.place[PLACE_GPU].peak_bytes / GiB,
		pr->gpu_capacity_bytes / GiB, pr->fits ? "yes" : "NO", payload / GiB);
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

cJSON *report_json(const Scenario *sc, const Prediction *pr)
{
	const Plan *p = &pr->plan;
	Metric m[METRICS_MAX];
	int n = metrics_collect(pr, m);
	cJSON *j = cJSON_CreateObject();

	cJSON_AddStringToObject(j, "scenario", sc->name);
	cJSON_AddStringToObject(j, "path", sc->path);
	cJSON_AddStringToObject(j, "parallax_version", PX_VERSION);
	cJSON_AddNumberToObject(j, "world_size", (double)p->world);
	cJSON_AddNumberToObject(j, "dp", (double)p->dp);
	cJSON_AddNumberToObject(j, "tp", 1);
	cJSON_AddNumberToObject(j, "pp", 1);
	cJSON_AddNumberToObject(j, "ep", 1);
	cJSON_AddNumberToObject(j, "num_parameters", sc->model.n_params);
	cJSON_AddNumberToObject(j, "zero_stage", p->stage);
	cJSON_AddNumberToObject(j, "train_batch_size", (double)sc->ds.train_batch);
	cJSON_AddNumberToObject(j, "train_micro_batch_size_per_gpu", (double)sc->ds.micro_batch);
	cJSON_AddNumberToObject(j, "gradient_accumulation_steps", (double)sc->ds.grad_accum);
	cJSON_AddStringToObject(j, "gpu", sc->cluster.gpu.name);
	for (int i = 0; i < n; i++) {
		cJSON *v;
		if (!strcmp(m[i].name, "memory.fits"))
			v = cJSON_CreateBool(m[i].value != 0);
		else if (!m[i].known)
			v = cJSON_CreateNull();
		else
			v = cJSON_CreateNumber(m[i].value);
		json_put(j, m[i].name, v);
	}
	cJSON *notes = cJSON_AddObjectToObject(j, "notes");
	cJSON_AddItemToObject(notes, "not_modelled",
			      string_array(sc->notes.not_modelled, sc->notes.n_not_modelled));
	cJSON_AddItemToObject(notes, "warnings",
			      string_array(sc->notes.warnings, sc->notes.n_warnings));
	return j;
}

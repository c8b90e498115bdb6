#include "calib_coll.h"

#include <string.h>

#define GB 1e9

int calib_coll_measure(CalibColl *cc, Comm *world, const ComputeBackend *cb, void *cx, int quick,
		       const GpuSpec *spec, const char *backend, const char *link, PxError *err)
{
	CollBenchOpts o;
	const CommEnv *env = comm_env(world);
	memset(cc, 0, sizeof(*cc));
	cc->backend = backend;
	cc->link = link;
	cc->nodes = env->local_size > 0 ? (env->size + env->local_size - 1) / env->local_size : 1;
	if (spec)
		cc->peak_Bps = link && !strcmp(link, "network") ? spec->network_GBps * GB :
			       spec->nvlink_GBps / 2 * GB;
	collbench_opts_init(&o, quick);
	if (collbench_run(world, &o, cb, cx, &cc->bench, err))
		return -1;
	if (spec)
		collbench_fit(&cc->bench, cc->peak_Bps, &cc->fit);
	return 0;
}

/* ---- the profile ---- */

static cJSON *curve_json(const HwCurve *c)
{
	cJSON *a = cJSON_CreateArray();
	for (int i = 0; i < c->n; i++) {
		cJSON *pt = cJSON_CreateArray();
		cJSON_AddItemToArray(pt, cJSON_CreateNumber(c->x[i]));
		cJSON_AddItemToArray(pt, cJSON_CreateNumber(c->y[i]));
		cJSON_AddItemToArray(a, pt);
	}
	return a;
}

/* "NCCL, 8 ranks on 1 node, fp32" */
static void what_ran(const CalibColl *cc, char *buf, size_t n)
{
	snprintf(buf, n, "%s, %d ranks on %d node%s, %s buffers", cc->backend, cc->bench.nranks,
		 cc->nodes, cc->nodes == 1 ? "" : "s", comm_dtype_name(cc->bench.dt));
}

static void link_json(const CalibColl *cc, cJSON *j, const char *stamp)
{
	char note[1024], what[128];
	const CollBenchFit *f = &cc->fit;
	cJSON *l = cJSON_CreateObject();
	what_ran(cc, what, sizeof(what));
	cJSON_AddNumberToObject(l, "base_s", f->link.base_s);
	cJSON_AddStringToObject(l, "_base_s", "0: one rank count cannot tell a call's base latency "
				"from its steps', so alpha_s holds both (exec/collbench.c)");
	cJSON_AddNumberToObject(l, "alpha_s", f->link.alpha_s);
	snprintf(note, sizeof(note), "measured by parallax calibrate, %s (%s): the smallest size's "
		 "all_gather and reduce_scatter time over the ring's n-1 steps, the call's own "
		 "overhead included (exec/collbench.c)", stamp, what);
	cJSON_AddStringToObject(l, "_alpha_s", note);
	cJSON_AddItemToObject(l, "efficiency", curve_json(&f->link.efficiency));
	snprintf(note, sizeof(note), "measured by parallax calibrate, %s (%s): x: nccl-tests size; "
		 "y: all_gather and reduce_scatter busBw (algBw x (n-1)/n, nccl-tests "
		 "doc/PERFORMANCE.md) with alpha_s's latency taken off, over %.0f GB/s (the catalog's "
		 "%s, one direction), slowest rank's mean of timed calls; %d latency-bound size(s) "
		 "left out%s%s", stamp, what, cc->peak_Bps / GB,
		 !strcmp(cc->link, "nvlink") ? "nvlink_GBps / 2" : "network_GBps_per_gpu",
		 f->n_latency, f->raw ? "; every size was latency-bound: the point is the largest "
		 "size's raw busBw" : "", f->n_clamped ? "; points above the catalog's peak "
		 "recorded as 1" : "");
	cJSON_AddStringToObject(l, "_efficiency", note);
	cJSON_AddNumberToObject(l, "allreduce_scale", f->link.allreduce_scale);
	snprintf(note, sizeof(note), "measured by parallax calibrate (%s): all_reduce busBw over the "
		 "all_gather/reduce_scatter mean at the largest size, %.0f bytes", what,
		 cc->bench.size_bytes[cc->bench.n_sizes - 1]);
	cJSON_AddStringToObject(l, "_allreduce_scale", note);
	cJSON_AddItemToObject(j, cc->link, l);
}

/* No link: the bus bandwidths as a line of text (the profile's '_' keys are strings). */
static void note_json(const CalibColl *cc, cJSON *j, const char *stamp)
{
	char note[2048], what[128];
	int k = 0;
	what_ran(cc, what, sizeof(what));
	k += snprintf(note + k, sizeof(note) - (size_t)k, "measured by parallax calibrate, %s (%s), "
		      "not written as a link: the ranks share GPUs, so the collectives went through "
		      "host memory over MPI, neither NVLink nor the network; the nvlink and network "
		      "sections keep the catalog's figures. busBw GB/s (all_reduce, all_gather, "
		      "reduce_scatter) by nccl-tests size:", stamp, what);
	for (int s = 0; s < cc->bench.n_sizes && k < (int)sizeof(note) - 80; s++)
		k += snprintf(note + k, sizeof(note) - (size_t)k, " %.0f: %.3g %.3g %.3g;",
			      cc->bench.size_bytes[s], cc->fit.busbw_Bps[0][s] / GB,
			      cc->fit.busbw_Bps[1][s] / GB, cc->fit.busbw_Bps[2][s] / GB);
	cJSON_AddStringToObject(j, "_collectives", note);
}

int calib_coll_json(const CalibColl *cc, cJSON *j, const char *stamp)
{
	if (cc->link)
		link_json(cc, j, stamp);
	else
		note_json(cc, j, stamp);
	return 0;
}

void calib_coll_json_single(cJSON *j)
{
	cJSON_AddStringToObject(j, "_collectives", "collective bandwidth not measured (single GPU): "
				"the nvlink and network sections keep the catalog's figures; run "
				"parallax calibrate --ranks N on a node of N GPUs to measure them");
}

/* ---- the table ---- */

void calib_coll_print(const CalibColl *cc, FILE *f)
{
	char what[128];
	const CollBench *b = &cc->bench;
	what_ran(cc, what, sizeof(what));
	fprintf(f, "# collectives: %s; time: the slowest rank's mean of the timed calls\n", what);
	fprintf(f, "%-14s %12s %10s %10s %10s\n", "collective", "size (B)", "time (us)",
		"algbw GB/s", "busbw GB/s");
	for (int k = 0; k < COLLBENCH_KINDS; k++)
		for (int s = 0; s < b->n_sizes; s++)
			fprintf(f, "%-14s %12.0f %10.2f %10.3f %10.3f\n",
				coll_name(collbench_kinds[k]), b->size_bytes[s], b->time_s[k][s] * 1e6,
				collbench_algbw_Bps(b->size_bytes[s], b->time_s[k][s]) / GB,
				cc->fit.busbw_Bps[k][s] / GB);
	const HwLink *l = &cc->fit.link;
	int n = b->nranks;
	fprintf(f, "# fit: alpha %.2f us per step; all_reduce's smallest size: measured %.2f us, "
		"2(n-1) alpha = %.2f us\n", l->alpha_s * 1e6, b->time_s[0][0] * 1e6,
		collbench_ring_steps(COLL_ALL_REDUCE, n) * l->alpha_s * 1e6);
	if (!cc->link) {
		fprintf(f, "# not written as a link (MPI through host memory); see _collectives\n");
		return;
	}
	fprintf(f, "# %s efficiency over %.0f GB/s:", cc->link, cc->peak_Bps / GB);
	for (int i = 0; i < l->efficiency.n; i++)
		fprintf(f, " [%.0f, %.3f]", l->efficiency.x[i], l->efficiency.y[i]);
	fprintf(f, "; allreduce_scale %.3f\n", l->allreduce_scale);
	if (cc->fit.n_clamped)
		fprintf(f, "# warning: %d point(s) above the catalog's %.0f GB/s, recorded as 1\n",
			cc->fit.n_clamped, cc->peak_Bps / GB);
}

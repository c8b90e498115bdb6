/* parallax plot scaling: tokens/s and the per-GPU memory peak of one scenario against the number
 * of GPUs, one point per node count. Each rank keeps the scenario's micro-batch and gradient
 * accumulation, so the global batch grows with the data-parallel size (weak scaling). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plot.h"

#define MAX_POINTS 64

typedef struct ScalePoint {
	long long nodes, gpus, dp, train_batch;
	int ok, timed;           /* priced at all; step time priced too */
	double tokens_per_s, step_s, mfu, peak_bytes;
	Verdict verdict;
	char why[1024];
} ScalePoint;

/* "1,2,4,8" into nodes[]; the count, or -1 with err naming --nodes. */
static int parse_nodes(const char *text, long long *nodes, PxError *err)
{
	int n = 0;
	const char *p = text ? text : "1,2,4,8,16,32,64";
	while (*p) {
		char *end;
		errno = 0;
		long long v = strtoll(p, &end, 10);
		if (end == p || errno || v < 1 || v > 1000000 || (*end && *end != ','))
			return px_fail(err, PX_ERR_INPUT, "--nodes %s: expected node counts from 1 "
				       "to 1000000 separated by commas, like 1,2,4,8", text);
		if (n == MAX_POINTS)
			return px_fail(err, PX_ERR_INPUT, "--nodes %s: at most %d node counts", text,
				       MAX_POINTS);
		for (int i = 0; i < n; i++)
			if (nodes[i] == v)
				return px_fail(err, PX_ERR_INPUT, "--nodes %s: %lld is given twice",
					       text, v);
		nodes[n++] = v;
		p = *end ? end + 1 : end;
		if (*end && !*p)
			return px_fail(err, PX_ERR_INPUT, "--nodes %s: a trailing comma", text);
	}
	if (!n)
		return px_fail(err, PX_ERR_INPUT, "--nodes: expected node counts like 1,2,4,8");
	/* sort, so the curves run left to right */
	for (int i = 1; i < n; i++)
		for (int j = i; j > 0 && nodes[j] < nodes[j - 1]; j--) {
			long long t = nodes[j];
			nodes[j] = nodes[j - 1];
			nodes[j - 1] = t;
		}
	return n;
}

/* Price one node count; an input error (a layout that does not divide) only skips the point. */
static int price_point(const PlotOpts *o, const Scenario *base, const Prediction *bp,
		       ScalePoint *pt, PxError *err)
{
	const ParallelSpec *q = &bp->plan.par;
	long long micro = base->ds.micro_batch, accum = base->ds.grad_accum;
	pt->gpus = pt->nodes * base->cluster.gpus_per_node;
	if (pt->gpus % (q->tp * q->pp)) {
		snprintf(pt->why, sizeof(pt->why), "%lld GPUs do not divide into tp %lld x pp %lld",
			 pt->gpus, q->tp, q->pp);
		return 0;
	}
	pt->dp = pt->gpus / (q->tp * q->pp);
	pt->train_batch = micro * accum * pt->dp;
	char sets[4][96];
	const char *extra[4] = {sets[0], sets[1], sets[2], sets[3]};
	snprintf(sets[0], sizeof(sets[0]), "cluster.nodes=%lld", pt->nodes);
	snprintf(sets[1], sizeof(sets[1]), "deepspeed.train_batch_size=%lld", pt->train_batch);
	snprintf(sets[2], sizeof(sets[2]), "deepspeed.train_micro_batch_size_per_gpu=%lld", micro);
	snprintf(sets[3], sizeof(sets[3]), "deepspeed.gradient_accumulation_steps=%lld", accum);
	Scenario sc;
	Prediction pr;
	PxError why = {0};
	if (plot_predict(o->args[0], &o->ov, extra, 4, o->hw, &sc, &pr, &why)) {
		if (why.code != PX_ERR_INPUT)
			return px_fail(err, why.code ? why.code : PX_ERR_RUNTIME, "%s", why.msg);
		snprintf(pt->why, sizeof(pt->why), "%s", plot_short_reason(why.msg));
		return 0;
	}
	pt->ok = 1;
	pt->peak_bytes = pr.stages[pr.worst].mem.place[PLACE_GPU].peak_bytes;
	pt->verdict = pr.verdict;
	pt->timed = pr.time_known;
	if (pr.time_known) {
		pt->tokens_per_s = pr.time.tokens_per_s;
		pt->step_s = pr.time.step_s;
		pt->mfu = pr.time.mfu;
	} else {
		snprintf(pt->why, sizeof(pt->why), "step time not priced: %.900s", pr.time_note);
	}
	predict_free(&pr);
	scenario_free(&sc);
	return 0;
}

static void data_table(PlotBuf *d, const Scenario *sc, const Prediction *bp,
		       const ScalePoint *pts, int n)
{
	pb_printf(d, "# parallax plot scaling: %s (%s) on %s nodes of %lld GPUs; tp %lld, pp %lld\n",
		  sc->name, sc->path, sc->cluster.gpu.name, sc->cluster.gpus_per_node,
		  bp->plan.par.tp, bp->plan.par.pp);
	pb_printf(d, "# per data-parallel rank: micro-batch %lld x accumulation %lld, seq %lld; "
		  "train_batch_size = micro x accumulation x dp\n", sc->ds.micro_batch,
		  sc->ds.grad_accum, sc->seq);
	pb_printf(d, "# peak: per-GPU memory peak of the worst pipeline stage (GiB = 2^30 bytes); "
		  "capacity %.4f GiB usable (%s); fits: yes, tight (within %.0f%% of it) or no; '-' = "
		  "not priced\n", bp->gpu_capacity_bytes / PLOT_GiB, bp->gpu_capacity_source,
		  100 * PREDICT_TIGHT_MARGIN);
	pb_printf(d, "# %6s %7s %7s %11s %14s %10s %8s %10s %5s\n", "nodes", "gpus", "dp",
		  "train_batch", "tokens_per_s", "step_s", "mfu", "peak_GiB", "fits");
	for (int i = 0; i < n; i++) {
		const ScalePoint *p = &pts[i];
		if (!p->ok) {
			pb_printf(d, "# %lld node(s) left out: %s\n", p->nodes, p->why);
			continue;
		}
		pb_printf(d, "  %6lld %7lld %7lld %11lld", p->nodes, p->gpus, p->dp, p->train_batch);
		if (p->timed)
			pb_printf(d, " %14.1f %10.5f %8.4f", p->tokens_per_s, p->step_s, p->mfu);
		else
			pb_printf(d, " %14s %10s %8s", "-", "-", "-");
		pb_printf(d, " %10.4f %5s\n", p->peak_bytes / PLOT_GiB,
			  p->verdict == VERDICT_FITS ? "yes" : p->verdict == VERDICT_TIGHT ? "tight" : "no");
	}
}

static void script(PlotBuf *g, const Scenario *sc, const Prediction *bp, const ScalePoint *pts,
		   int n)
{
	char text[4096];
	double cap = bp->gpu_capacity_bytes, most = 0, tps_lo = 0, tps_hi = 0;
	long long g_lo = 0, g_hi = 0;
	double ref = 0; /* tokens/s per GPU of the smallest priced point: the linear-scaling line */
	for (int i = 0; i < n; i++) {
		const ScalePoint *p = &pts[i];
		if (!p->ok)
			continue;
		most = fmax(most, p->peak_bytes);
		if (!g_lo)
			g_lo = p->gpus;
		g_hi = p->gpus;
		if (!p->timed)
			continue;
		if (!ref)
			ref = p->tokens_per_s / (double)p->gpus;
		if (!tps_lo || p->tokens_per_s < tps_lo)
			tps_lo = p->tokens_per_s;
		if (ref * (double)p->gpus > tps_hi)
			tps_hi = ref * (double)p->gpus;
		if (p->tokens_per_s > tps_hi)
			tps_hi = p->tokens_per_s;
	}
	/* the memory axis: MiB for small models; a capacity far above every point stays off it */
	double unit = most < PLOT_GiB ? 1024.0 * 1024.0 : PLOT_GiB;
	int cap_shown = most >= cap / 20;
	double top = (cap_shown ? fmax(most, cap) : most) * 1.15 / unit;
	snprintf(text, sizeof(text), "Scaling: %s on %s nodes of %lld GPUs (tp %lld, pp %lld)\n"
		 "per data-parallel rank micro-batch %lld x accumulation %lld, seq %lld; the global "
		 "batch grows with dp", sc->name, sc->cluster.gpu.name, sc->cluster.gpus_per_node,
		 bp->plan.par.tp, bp->plan.par.pp, sc->ds.micro_batch, sc->ds.grad_accum, sc->seq);
	pb_printf(g, "set title ");
	pb_gp_string(g, text);
	pb_printf(g, "\nset datafile missing \"-\"\n"
		  "set xlabel \"GPUs (nodes x %lld; log2 scale)\"\n"
		  "set ylabel \"training throughput (tokens/s, log scale; k = 10^3, M = 10^6)\" "
		  "tc rgb \"#1f5fa0\"\n"
		  "set y2label \"memory per GPU at its peak (%s = 2^%d bytes)\" tc rgb \"#b35900\"\n"
		  "set logscale x 2\nset logscale y 10\n"
		  "set xrange [%.6g:%.6g]\nset y2range [0:%.6g]\n"
		  "# the data file is in GiB; u converts to the right axis' unit\nu = %g\n",
		  sc->cluster.gpus_per_node, unit == PLOT_GiB ? "GiB" : "MiB",
		  unit == PLOT_GiB ? 30 : 20, g_lo / 1.3, g_hi * 1.3, top, PLOT_GiB / unit);
	if (tps_lo > 0) {
		pb_printf(g, "set yrange [%.6g:%.6g]\n", tps_lo / 2, tps_hi * 2);
		plot_log_tics(g, "y", tps_lo / 2, tps_hi * 2);
	}
	pb_printf(g, "set xtics (");
	for (int i = 0, k = 0; i < n; i++)
		if (pts[i].ok)
			pb_printf(g, "%s\"%lld\" %lld", k++ ? ", " : "", pts[i].gpus, pts[i].gpus);
	pb_printf(g, ")\nset ytics nomirror tc rgb \"#1f5fa0\"\nset y2tics tc rgb \"#b35900\"\n"
		  "set grid xtics ytics lc rgb \"#dddddd\"\n"
		  "set key outside right top vertical reverse Left samplen 3 spacing 1.3\n");
	if (cap_shown)
		pb_printf(g, "set arrow 1 from graph 0, second %.6g to graph 1, second %.6g nohead "
			  "lw 2 dt 2 lc rgb \"#c00000\"\n", cap / unit, cap / unit);

	/* the points that could not be priced, under the plot */
	char foot[2048] = "";
	size_t k = 0;
	for (int i = 0; i < n && k < sizeof(foot); i++)
		if (!pts[i].ok || !pts[i].timed)
			k += (size_t)snprintf(foot + k, sizeof(foot) - k, "%s%lld node(s) %s: %s",
					      k ? "\n" : "", pts[i].nodes,
					      pts[i].ok ? "without tokens/s" : "left out",
					      pts[i].why);
	if (k)
		plot_footer(g, 1, foot);

	pb_printf(g, "plot \\\n");
	if (ref > 0)
		pb_printf(g, "\t(x >= %lld && x <= %lld ? %.9g*x : NaN) with lines dt 3 lw 1.5 "
			  "lc rgb \"#7f9fbf\" title \"linear from the first point\", \\\n",
			  g_lo, g_hi, ref);
	pb_printf(g, "\tdatafile using 2:5 with linespoints lw 2 pt 7 ps 1.2 lc rgb \"#1f5fa0\" "
		  "title \"tokens/s (left axis)\", \\\n"
		  "\tdatafile using 2:(u*$8) axes x1y2 with linespoints lw 2 pt 5 ps 1.2 "
		  "lc rgb \"#b35900\" title \"memory peak per GPU (right axis)\", \\\n"
		  "\tNaN with lines lw 2 dt 2 lc rgb \"#c00000\" title ");
	snprintf(text, sizeof(text), "GPU capacity %.1f GiB (%s)", cap / PLOT_GiB,
		 cap_shown ? "right axis" : "off the axis");
	pb_gp_string(g, text);
	pb_printf(g, "\n");
}

int plot_scaling(const PlotOpts *o, PlotSpec *ps, PxError *err)
{
	long long nodes[MAX_POINTS];
	ScalePoint pts[MAX_POINTS];
	Scenario sc;
	Prediction bp;
	int n = parse_nodes(o->nodes, nodes, err), shown = 0, rc = 0;
	if (n < 0)
		return -1;
	/* the scenario as given: its batch arithmetic is what every point keeps per rank */
	if (plot_predict(o->args[0], &o->ov, NULL, 0, o->hw, &sc, &bp, err))
		return -1;
	memset(pts, 0, sizeof(pts));
	for (int i = 0; i < n && !rc; i++) {
		pts[i].nodes = nodes[i];
		rc = price_point(o, &sc, &bp, &pts[i], err);
		shown += pts[i].ok;
	}
	if (!rc && !shown)
		rc = px_fail(err, PX_ERR_INPUT, "%s: no node count could be priced (%lld node(s): %s)",
			     sc.path, pts[0].nodes, pts[0].why);
	if (!rc) {
		snprintf(ps->name, sizeof(ps->name), "%s", sc.name);
		data_table(&ps->dat, &sc, &bp, pts, n);
		script(&ps->gp, &sc, &bp, pts, n);
	}
	predict_free(&bp);
	scenario_free(&sc);
	return rc;
}

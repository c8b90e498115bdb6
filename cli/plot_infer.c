/* parallax plot serving: an inference scenario's latency against its throughput. Each point is
 * the scenario at one batch size (workload.batch_size), priced by sim/infer_sim.c as `parallax
 * predict` prices it: time per output token against generated tokens/s per GPU, one line per
 * value of --series (a dtype, a tensor-parallel size), the resource that bounds a decode step
 * labelled where it changes along a line. Batches that do not fit are left out and named. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../sim/infer_sim.h"
#include "paths.h"
#include "plot.h"

#define MAX_BATCHES 32
#define MAX_SERIES 8

typedef struct ServePoint {
	long long batch;
	int ok, fits;             /* priced at all; fits the GPU (a tight one does) */
	double tokens_per_s_gpu, tpot_s, ttft_s, latency_s, peak_bytes;
	InferBound bound;         /* of a decode step */
	char why[512];            /* why left out */
} ServePoint;

typedef struct Series {
	char value[128];          /* the --series value, "" for the scenario as given */
	ServePoint pts[MAX_BATCHES];
} Series;

/* "1,2,4" into v[] (each 1 to 2^24, at most MAX_BATCHES, sorted, each once); the count, or -1. */
static int parse_batches(const char *text, long long *v, PxError *err)
{
	int n = 0;
	const char *p = text ? text : "1,2,4,8,16,32,64,128,256,512";
	while (*p) {
		char *end;
		errno = 0;
		long long b = strtoll(p, &end, 10);
		if (end == p || errno || b < 1 || b > (1 << 24) || (*end && *end != ',') ||
		    (*end && !end[1]))
			return px_fail(err, PX_ERR_INPUT, "--batches %s: expected batch sizes from 1 to "
				       "%d separated by commas, like 1,8,64", text, 1 << 24);
		if (n == MAX_BATCHES)
			return px_fail(err, PX_ERR_INPUT, "--batches %s: at most %d batch sizes", text,
				       MAX_BATCHES);
		for (int i = 0; i < n; i++)
			if (v[i] == b)
				return px_fail(err, PX_ERR_INPUT, "--batches %s: %lld is given twice",
					       text, b);
		v[n++] = b;
		p = *end ? end + 1 : end;
	}
	for (int i = 1; i < n; i++)
		for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
			long long t = v[j];
			v[j] = v[j - 1];
			v[j - 1] = t;
		}
	return n;
}

/* "KEY=V1,V2" into key and values; the count of values (1 with "" and no key without
 * --series), or -1. */
static int parse_series(const char *text, char *key, size_t kn, Series *s, PxError *err)
{
	if (!text) {
		key[0] = '\0';
		s[0].value[0] = '\0';
		return 1;
	}
	const char *eq = strchr(text, '=');
	if (!eq || eq == text || !eq[1] || (size_t)(eq - text) >= kn)
		return px_fail(err, PX_ERR_INPUT, "--series %s: expected KEY=V1,V2,... such as "
			       "inference.dtype=fp16,int8", text);
	snprintf(key, kn, "%.*s", (int)(eq - text), text);
	int n = 0;
	for (const char *p = eq + 1; *p;) {
		size_t len = strcspn(p, ",");
		if (!len || len >= sizeof(s[0].value))
			return px_fail(err, PX_ERR_INPUT, "--series %s: an empty or over-long value",
				       text);
		if (n == MAX_SERIES)
			return px_fail(err, PX_ERR_INPUT, "--series %s: at most %d values", text,
				       MAX_SERIES);
		snprintf(s[n++].value, sizeof(s[0].value), "%.*s", (int)len, p);
		p += len + (p[len] == ',');
	}
	return n;
}

/* The scenario at path with the --set overrides, then KEY=VALUE pairs (n of them). */
static int load_with(const char *path, const JsonOverrides *base, const char *const *kv, int n,
		     InferScenario *sc, PxError *err)
{
	JsonOverrides ov;
	char buf[600];
	int rc = -1;
	jov_init(&ov);
	for (int i = 0; base && i < base->n; i++) {
		snprintf(buf, sizeof(buf), "%s=%s", base->v[i].key, base->v[i].value);
		if (jov_add(&ov, buf, err))
			goto out;
	}
	for (int i = 0; i < n; i++)
		if (jov_add(&ov, kv[i], err))
			goto out;
	rc = infer_scenario_load(sc, path, &ov, err);
out:
	jov_free(&ov);
	return rc;
}

/* Price one point; an input error (a tp that does not divide the heads, say) leaves it out. */
static int price_point(const char *path, const PlotOpts *o, const char *key, const Series *s,
		       const HwProfile *hw, ServePoint *pt, PxError *err)
{
	char kv[2][400]; /* key (256) = value (128) */
	const char *pairs[2] = {kv[0], kv[1]};
	int n = 0;
	snprintf(kv[n++], sizeof(kv[0]), "workload.batch_size=%lld", pt->batch);
	if (key[0])
		snprintf(kv[n++], sizeof(kv[1]), "%s=%s", key, s->value);
	InferScenario sc;
	InferPrediction pr;
	PxError why = {0};
	if (load_with(path, &o->ov, pairs, n, &sc, &why)) {
		if (why.code != PX_ERR_INPUT)
			return px_fail(err, why.code ? why.code : PX_ERR_RUNTIME, "%s", why.msg);
		snprintf(pt->why, sizeof(pt->why), "%s", plot_short_reason(why.msg));
		return 0;
	}
	if (hw) /* the profile's measured memory, as predict --hw takes it */
		hwprofile_apply_memory(hw, &sc.cluster);
	int rc = infer_predict(&sc, hw, o->hw, &pr, &why);
	if (rc) {
		if (why.code != PX_ERR_INPUT)
			rc = px_fail(err, why.code ? why.code : PX_ERR_RUNTIME, "%s", why.msg);
		else
			rc = 0, snprintf(pt->why, sizeof(pt->why), "%s", plot_short_reason(why.msg));
	} else {
		pt->ok = 1;
		pt->fits = pr.verdict != VERDICT_NO_FIT;
		pt->tokens_per_s_gpu = pr.tokens_per_s_gpu;
		pt->tpot_s = pr.tpot_s;
		pt->ttft_s = pr.ttft_s;
		pt->latency_s = pr.latency_s;
		pt->peak_bytes = pr.peak_bytes;
		pt->bound = pr.decode.bound;
		if (!pt->fits)
			snprintf(pt->why, sizeof(pt->why), "does not fit: peak %.1f GiB, usable %.1f GiB",
				 pr.peak_bytes / PLOT_GiB, pr.gpu_capacity_bytes / PLOT_GiB);
	}
	infer_predict_free(&pr);
	infer_scenario_free(&sc);
	return rc;
}

static const char *series_title(const char *key, const Series *s)
{
	static char t[300];
	const char *k = strrchr(key, '.') ? strrchr(key, '.') + 1 : key;
	if (!key[0])
		return "as given";
	snprintf(t, sizeof(t), "%s %s", k, s->value);
	return t;
}

/* One block per series (gnuplot's index), fitting points only; the rest as '#' lines. */
static void data_table(PlotBuf *d, const InferScenario *sc, const char *key, const Series *s,
		       int ns, int nb)
{
	pb_printf(d, "# parallax plot serving: %s (%s) on %lld x %lld %s; prompt %lld, output %lld "
		  "tokens a sequence\n", sc->name, sc->path, sc->cluster.nodes,
		  sc->cluster.gpus_per_node, sc->cluster.gpu.name, sc->wl.prompt_tokens,
		  sc->wl.output_tokens);
	pb_printf(d, "# one block per series (%s); tokens_per_s_gpu: generated tokens/s per GPU; "
		  "bound: what bounds a decode step\n", key[0] ? key : "the scenario as given");
	for (int i = 0; i < ns; i++) {
		pb_printf(d, "%s# series %d: %s\n", i ? "\n\n" : "", i, series_title(key, &s[i]));
		pb_printf(d, "# %6s %16s %10s %10s %11s %10s  %s\n", "batch", "tokens_per_s_gpu",
			  "tpot_ms", "ttft_s", "latency_s", "peak_GiB", "bound");
		for (int b = 0; b < nb; b++) {
			const ServePoint *p = &s[i].pts[b];
			if (!p->ok || !p->fits) {
				pb_printf(d, "# batch %lld left out: %s\n", p->batch, p->why);
				continue;
			}
			pb_printf(d, "  %6lld %16.3f %10.4f %10.5f %11.5f %10.3f  ", p->batch,
				  p->tokens_per_s_gpu, p->tpot_s * 1e3, p->ttft_s, p->latency_s,
				  p->peak_bytes / PLOT_GiB);
			pb_dat_string(d, infer_bound_name(p->bound));
			pb_printf(d, "\n");
		}
	}
}

static void script(PlotBuf *g, const InferScenario *sc, const char *key, const Series *s, int ns,
		   int nb)
{
	static const char *const colours[MAX_SERIES] = {"#1f5fa0", "#b35900", "#2a8a2a", "#a02060",
							"#6040a0", "#008080", "#806000", "#404040"};
	char text[2048], foot[4096] = "";
	size_t k = 0;
	double xlo = INFINITY, xhi = 0, ylo = INFINITY, yhi = 0;
	int tag = 10;
	snprintf(text, sizeof(text), "Serving: %s on %lld x %lld %s, prompt %lld and output %lld "
		 "tokens\ntime per output token against generated tokens/s per GPU, one point per "
		 "batch size (labelled)", sc->name, sc->cluster.nodes, sc->cluster.gpus_per_node,
		 sc->cluster.gpu.name, sc->wl.prompt_tokens, sc->wl.output_tokens);
	pb_printf(g, "set title ");
	pb_gp_string(g, text);
	pb_printf(g, "\nset xlabel \"generated tokens/s per GPU (log scale)\"\n"
		  "set ylabel \"time per output token, ms (log scale)\"\n"
		  "set logscale xy\nset grid xtics ytics lc rgb \"#dddddd\"\n"
		  "set key outside right top vertical Left reverse samplen 3 spacing 1.3\n");
	for (int i = 0; i < ns; i++)
		for (int b = 0; b < nb; b++) {
			const ServePoint *p = &s[i].pts[b];
			if (p->ok && p->fits) {
				xlo = fmin(xlo, p->tokens_per_s_gpu), xhi = fmax(xhi, p->tokens_per_s_gpu);
				ylo = fmin(ylo, p->tpot_s * 1e3), yhi = fmax(yhi, p->tpot_s * 1e3);
			}
		}
	if (xhi > 0) {
		pb_printf(g, "set xrange [%.6g:%.6g]\nset yrange [%.6g:%.6g]\n", xlo / 1.6, xhi * 1.6,
			  ylo / 1.6, yhi * 1.6);
		plot_log_tics(g, "x", xlo / 1.6, xhi * 1.6);
		plot_log_tics(g, "y", ylo / 1.6, yhi * 1.6);
	}
	/* the decode step's bound: named at a line's first point and wherever it changes */
	for (int i = 0; i < ns; i++) {
		int last = -1;
		for (int b = 0; b < nb; b++) {
			const ServePoint *p = &s[i].pts[b];
			if (!p->ok || !p->fits)
				continue;
			if ((int)p->bound != last) {
				snprintf(text, sizeof(text), "%s%s-bound", last < 0 ? "decode " : "-> ",
					 infer_bound_name(p->bound));
				pb_printf(g, "set label %d ", tag++);
				pb_gp_string(g, text);
				pb_printf(g, " at %.9g, %.9g offset 0.6, -1.2 left font \",9\" tc rgb "
					  "\"%s\"\n", p->tokens_per_s_gpu, p->tpot_s * 1e3,
					  colours[i]);
			}
			last = (int)p->bound;
		}
		for (int b = 0; b < nb && k < sizeof(foot); b++) {
			const ServePoint *p = &s[i].pts[b];
			if (!p->ok || !p->fits)
				k += (size_t)snprintf(foot + k, sizeof(foot) - k, "%s%s: batch %lld %s",
						      k ? "\n" : "", series_title(key, &s[i]),
						      p->batch, p->ok ? p->why : "left out: ");
			if (k < sizeof(foot) && !p->ok)
				k += (size_t)snprintf(foot + k, sizeof(foot) - k, "%s", p->why);
		}
	}
	if (k)
		plot_footer(g, 1, foot);
	pb_printf(g, "plot \\\n");
	for (int i = 0; i < ns; i++) {
		pb_printf(g, "\tdatafile index %d using 2:3 with linespoints lw 2 pt 7 ps 1.1 lc rgb "
			  "\"%s\" title ", i, colours[i]);
		pb_gp_string(g, series_title(key, &s[i]));
		pb_printf(g, ", \\\n\tdatafile index %d using 2:3:(sprintf(\"%%d\", $1)) with labels "
			  "offset -0.8, 0.8 font \",8\" tc rgb \"%s\" notitle%s\n", i, colours[i],
			  i + 1 < ns ? ", \\" : "");
	}
}

int plot_serving(const PlotOpts *o, PlotSpec *ps, PxError *err)
{
	long long batches[MAX_BATCHES];
	Series *series = calloc(MAX_SERIES, sizeof(*series));
	char key[256], found[PATH_MAX];
	HwProfile hw;
	InferScenario base;
	int have_hw = 0, rc = -1, shown = 0;
	const char *path = paths_find_input(o->args[0], found, sizeof(found));
	memset(&base, 0, sizeof(base));
	if (!series)
		return px_fail(err, PX_ERR_RUNTIME, "out of memory");
	int nb = parse_batches(o->batches, batches, err);
	int ns = nb < 0 ? -1 : parse_series(o->series, key, sizeof(key), series, err);
	int is = ns < 0 ? -1 : infer_scenario_is(path, err);
	if (is == 0)
		px_fail(err, PX_ERR_INPUT, "%s: not an inference scenario (no \"inference\" key): "
			"plot serving draws inference scenarios; plot scaling and time draw training "
			"ones", path);
	if (is <= 0 || load_with(path, &o->ov, NULL, 0, &base, err))
		goto out;
	if (base.wl.continuous) {
		px_fail(err, PX_ERR_INPUT, "%s: workload.batching: plot serving draws a static batch "
			"over batch sizes; continuous batching's concurrency follows from its "
			"request rate (sweep workload.request_rate instead)", path);
		goto out;
	}
	if (o->hw) {
		if (hwprofile_load(o->hw, &hw, err))
			goto out;
		have_hw = 1;
		hwprofile_apply_memory(&hw, &base.cluster);
	}
	for (int i = 0; i < ns; i++)
		for (int b = 0; b < nb; b++) {
			ServePoint *p = &series[i].pts[b];
			memset(p, 0, sizeof(*p));
			p->batch = batches[b];
			if (price_point(path, o, key, &series[i], have_hw ? &hw : NULL, p, err))
				goto out;
			shown += p->ok && p->fits;
		}
	if (!shown) {
		px_fail(err, PX_ERR_INPUT, "%s: no batch size could be priced within memory (batch "
			"%lld: %s)", path, batches[0], series[0].pts[0].why);
		goto out;
	}
	snprintf(ps->name, sizeof(ps->name), "%s", base.name);
	data_table(&ps->dat, &base, key, series, ns, nb);
	script(&ps->gp, &base, key, series, ns, nb);
	rc = 0;
out:
	if (have_hw)
		hwprofile_free(&hw);
	infer_scenario_free(&base);
	free(series);
	return rc;
}

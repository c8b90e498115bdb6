/* parallax plot memory: per-GPU memory at the peak by category for ZeRO stages 0-3 of one
 * scenario, as stacked bars beside the GPU's capacity and the ZeRO paper's ideal model states. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "plot.h"

/* One bar: the worst pipeline stage's GPU at its peak. */
typedef struct MemBar {
	int ok;                   /* 0: the stage was refused (why says so) */
	double at_peak[N_CATS];   /* bytes per category at the GPU peak */
	double peak_bytes, ideal_bytes;
	int worst, n_stages;      /* which pipeline stage that is, of how many */
	char why[1024];
} MemBar;

/* The category colours, params first; the time plot uses its own. */
static const char *const CAT_COLOUR[N_CATS] = {"#4e79a7", "#59a14f", "#f28e2b",
					       "#76b7b2", "#edc948", "#bab0ac", "#b07aa1"};

static int price_stages(const PlotOpts *o, MemBar bars[4], PxError *err)
{
	for (int z = 0; z < 4; z++) {
		char set[64];
		const char *extra[] = {set};
		Scenario sc;
		Prediction pr;
		PxError why = {0};
		snprintf(set, sizeof(set), "deepspeed.zero_optimization.stage=%d", z);
		if (plot_predict(o->args[0], &o->ov, extra, 1, NULL, &sc, &pr, &why)) {
			if (why.code != PX_ERR_INPUT) /* a refusal is a result; a failure is not */
				return px_fail(err, why.code ? why.code : PX_ERR_RUNTIME, "%s",
					       why.msg);
			snprintf(bars[z].why, sizeof(bars[z].why), "%s", why.msg);
			continue;
		}
		const MemPlace *g = &pr.stages[pr.worst].mem.place[PLACE_GPU];
		bars[z].ok = 1;
		memcpy(bars[z].at_peak, g->at_peak, sizeof(bars[z].at_peak));
		bars[z].peak_bytes = g->peak_bytes;
		bars[z].ideal_bytes = pr.stages[pr.worst].ideal.total_bytes;
		bars[z].worst = pr.worst;
		bars[z].n_stages = pr.n_stages;
		predict_free(&pr);
		scenario_free(&sc);
	}
	return 0;
}

static void data_table(PlotBuf *d, const Scenario *sc, const Prediction *pr, const MemBar bars[4])
{
	pb_printf(d, "# parallax plot memory: %s (%s) on %lld x %lld %s\n", sc->name, sc->path,
		  sc->cluster.nodes, sc->cluster.gpus_per_node, sc->cluster.gpu.name);
	pb_printf(d, "# per-GPU memory at the GPU peak of the worst pipeline stage, by category, "
		  "for each ZeRO stage (GiB = 2^30 bytes)\n");
	pb_printf(d, "# ideal: the ZeRO paper's model states (Rajbhandari et al. 2020), capacity: "
		  "%.0f bytes per GPU usable (%s)\n", pr->gpu_capacity_bytes, pr->gpu_capacity_source);
	if (!pr->plan.activations_known)
		pb_printf(d, "# activations unknown (the model gives only num_parameters): "
			  "counted as 0\n");
	pb_printf(d, "# %4s %10s %10s %10s %10s %10s %10s %10s %10s %10s %14s %14s %5s\n", "zero",
		  "params", "grads", "optimizer", "activ", "buffers", "overhead", "peak_GiB",
		  "ideal_GiB", "cap_GiB", "peak_bytes", "ideal_bytes", "pp_st");
	for (int z = 0; z < 4; z++) {
		const MemBar *b = &bars[z];
		if (!b->ok) {
			pb_printf(d, "# ZeRO-%d left out: %s\n", z, b->why);
			continue;
		}
		pb_printf(d, "  %4d", z);
		for (int c = 0; c < N_CATS; c++)
			pb_printf(d, " %10.4f", b->at_peak[c] / PLOT_GiB);
		pb_printf(d, " %10.4f %10.4f %10.4f %14.0f %14.0f %5d\n", b->peak_bytes / PLOT_GiB,
			  b->ideal_bytes / PLOT_GiB, pr->gpu_capacity_bytes / PLOT_GiB,
			  b->peak_bytes, b->ideal_bytes, b->worst);
	}
}

/* The reason without its ", got ..." tail, so that refusals of several stages read as one. */
static void reason_stem(const char *msg, char *buf, size_t n)
{
	const char *r = plot_short_reason(msg), *got = strstr(r, ", got ");
	snprintf(buf, n, "%.*s", got ? (int)(got - r) : (int)strlen(r), r);
}

/* Append to buf (size bytes, n used); returns the new length, never past the end. */
static size_t append(char *buf, size_t size, size_t n, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static size_t append(char *buf, size_t size, size_t n, const char *fmt, ...)
{
	va_list ap;
	if (n + 1 >= size)
		return n;
	va_start(ap, fmt);
	int k = vsnprintf(buf + n, size - n, fmt, ap);
	va_end(ap);
	return k < 0 ? n : n + (size_t)k < size ? n + (size_t)k : size - 1;
}

/* The notes under the plot, broken into lines of about 125 characters. */
static void footer(char *foot, size_t size, const MemBar bars[4], int activ_unknown, int offload)
{
	char text[2048] = "", stem[4][512];
	size_t n = 0;
	for (int z = 0; z < 4; z++)
		if (!bars[z].ok)
			reason_stem(bars[z].why, stem[z], sizeof(stem[z]));
	for (int z = 0; z < 4; z++) {
		if (bars[z].ok)
			continue;
		int same = 0; /* already said for a lower stage */
		for (int y = 0; y < z; y++)
			same |= !bars[y].ok && !strcmp(stem[y], stem[z]);
		if (same)
			continue;
		n = append(text, sizeof(text), n, "%sZeRO", n ? "; " : "left out: ");
		for (int y = z; y < 4; y++)
			if (!bars[y].ok && !strcmp(stem[y], stem[z]))
				n = append(text, sizeof(text), n, "%s%d", y == z ? "-" : ", ", y);
		n = append(text, sizeof(text), n, " (%s)", stem[z]);
	}
	if (activ_unknown)
		n = append(text, sizeof(text), n, "%sactivations unknown (the model gives only "
			   "num_parameters)", n ? "; " : "");
	if (offload)
		n = append(text, sizeof(text), n, "%sthe ideal counts the model states wherever "
			   "they live (offload: GPU, CPU and NVMe together)", n ? "; " : "");
	/* break at the last space before every 125th character */
	size_t len = strlen(text), line = 0, last_space = 0, o = 0;
	for (size_t i = 0; i < len && o + 1 < size; i++, line++) {
		foot[o++] = text[i];
		if (text[i] == ' ')
			last_space = o - 1;
		if (line >= 125 && last_space) {
			foot[last_space] = '\n';
			line = o - last_space - 1;
			last_space = 0;
		}
	}
	foot[o] = '\0';
}

/* The x tics: "ZeRO-2 (as given)" marks the scenario's own stage. */
static void xtics(PlotBuf *g, int own)
{
	pb_printf(g, "set xtics (");
	for (int z = 0; z < 4; z++)
		pb_printf(g, "%s\"ZeRO-%d%s\" %d", z ? ", " : "", z, z == own ? " (as given)" : "",
			  z);
	pb_printf(g, ") scale 0\n");
}

/* The y axis: GiB, or MiB when every bar is under 1 GiB; its top, in that unit, leaves room for
 * the bars' labels. A bar far above the GPU's capacity (ZeRO-0 of a 175B model: 3 TiB) would
 * flatten the rest, so the axis stops at 2.5 x capacity and taller bars are cut and labelled so;
 * a capacity far above every bar (a small model) stays off the axis and is named in the key. */
typedef struct MemAxis {
	double unit_bytes;        /* 2^30 or 2^20 */
	const char *unit;         /* "GiB" or "MiB" */
	double top;               /* in units */
	int cap_shown;            /* the capacity is inside the axis */
} MemAxis;

static MemAxis mem_axis(const Prediction *pr, const MemBar bars[4])
{
	MemAxis a = {PLOT_GiB, "GiB", 0, 1};
	double most = 0, cap = pr->gpu_capacity_bytes;
	for (int z = 0; z < 4; z++)
		if (bars[z].ok)
			most = fmax(most, fmax(bars[z].peak_bytes, bars[z].ideal_bytes));
	if (most < PLOT_GiB) {
		a.unit_bytes = 1024.0 * 1024.0;
		a.unit = "MiB";
	}
	if (most > 2.5 * cap)
		a.top = 2.5 * cap;
	else if (most < cap / 20)
		a.top = most * 1.2, a.cap_shown = 0;
	else
		a.top = fmax(most, cap) * 1.15;
	a.top /= a.unit_bytes;
	return a;
}

static void script(PlotBuf *g, const Scenario *sc, const Prediction *pr, const MemBar bars[4])
{
	char text[2048];
	const MemAxis a = mem_axis(pr, bars);
	int refused = 0, pipeline = pr->n_stages > 1;
	for (int z = 0; z < 4; z++)
		refused += !bars[z].ok;
	const ParallelSpec *q = &pr->plan.par;
	double psi = sc->model.n_params;
	snprintf(text, sizeof(text),
		 "Per-GPU memory at the peak by ZeRO stage: %s\n"
		 "%.3g%s parameters, %lld x %s (dp %lld, tp %lld, pp %lld), micro-batch %lld x "
		 "seq %lld%s", sc->name, psi >= 1e9 ? psi / 1e9 : psi >= 1e6 ? psi / 1e6 : psi,
		 psi >= 1e9 ? " B" : psi >= 1e6 ? " M" : "", pr->plan.world,
		 sc->cluster.gpu.name, pr->plan.dp, q->tp, q->pp, sc->ds.micro_batch, sc->seq,
		 pipeline ? "; the worst pipeline stage" : "");
	pb_printf(g, "set title ");
	pb_gp_string(g, text);
	pb_printf(g, "\n# the data file is in GiB; u converts to the axis' unit\nu = %g\n",
		  PLOT_GiB / a.unit_bytes);
	pb_printf(g, "set ylabel \"memory per GPU at its peak (%s = 2^%d bytes)\"\n"
		  "set xlabel \"ZeRO stage (deepspeed.zero_optimization.stage)\"\n", a.unit,
		  a.unit_bytes == PLOT_GiB ? 30 : 20);
	xtics(g, sc->ds.zero.stage);
	pb_printf(g, "set xrange [-0.6:3.6]\nset yrange [0:%.6g]\nset grid ytics lc rgb \"#dddddd\"\n"
		  "set boxwidth 0.6\nset style fill solid 0.9 border rgb \"#404040\"\n"
		  "set key outside right top reverse Left samplen 2\n"
		  "set rmargin 42\nset style textbox opaque noborder\n", a.top);

	/* the capacity: a dashed line across, explained in the key (a label beside it would
	 * collide with the key or with a bar's label) */
	double cap = pr->gpu_capacity_bytes / a.unit_bytes;
	if (a.cap_shown)
		pb_printf(g, "set arrow 1 from graph 0, first %.6g to graph 1, first %.6g nohead lw 2 "
			  "dt 2 lc rgb \"#c00000\" back\n", cap, cap);

	/* refused stages: a note in the empty slot and the reason below the plot */
	int tag = 10;
	for (int z = 0; z < 4; z++) {
		if (bars[z].ok)
			continue;
		pb_printf(g, "set label %d \"left out:\\nrefused\" at %d, graph 0.06 center "
			  "tc rgb \"#808080\"\n", tag++, z);
	}
	int offload = sc->ds.zero.offload_optimizer.device != DEV_NONE ||
		      sc->ds.zero.offload_param.device != DEV_NONE;
	if (refused || !pr->plan.activations_known || offload) {
		char foot[2048];
		footer(foot, sizeof(foot), bars, !pr->plan.activations_known, offload);
		plot_footer(g, tag++, foot);
	}

	/* stacked bars: the sum of categories 1..k drawn for k from the top down, so that each
	 * lower sum covers the part of the one above it that is not its own */
	pb_printf(g, "plot \\\n");
	for (int c = N_CATS - 1; c >= 0; c--)
		pb_printf(g, "\tdatafile using 1:(u * sum [j=2:%d] column(j)) with boxes "
			  "lc rgb \"%s\" title \"%s\", \\\n", 2 + c, CAT_COLOUR[c], cat_name(c));
	pb_printf(g, "\tdatafile using ($1-0.36):(u*$9):(0.72):(0) with vectors nohead lw 3 dt 2 "
		  "lc rgb \"#000000\" title \"ZeRO paper's ideal model states\", \\\n"
		  "\tNaN with lines lw 2 dt 2 lc rgb \"#c00000\" title ");
	snprintf(text, sizeof(text), "GPU capacity %.1f GiB (%s)%s",
		 pr->gpu_capacity_bytes / PLOT_GiB, sc->cluster.gpu.name,
		 a.cap_shown ? "" : ", off the axis");
	pb_gp_string(g, text);
	/* each bar's total above it; a bar cut by the axis says so at the top */
	pb_printf(g, ", \\\n\tdatafile using 1:(u*$8 > %.6g ? %.6g : u*$8):(u*$8 > %.6g ? "
		  "sprintf(\"%%.0f %s\\nabove the axis\", u*$8) : sprintf(\"%%.%df %s\", u*$8)) "
		  "with labels boxed offset 0,%s notitle\n", a.top, a.top * 0.93, a.top, a.unit,
		  a.unit_bytes == PLOT_GiB ? 2 : 1, a.unit, "0.8");
}

int plot_memory(const PlotOpts *o, PlotSpec *ps, PxError *err)
{
	Scenario sc;
	Prediction pr;
	MemBar bars[4] = {{0}};
	/* the scenario as given first: its own errors (a bad --set, a missing file) are the
	 * user's, not a stage's */
	if (plot_predict(o->args[0], &o->ov, NULL, 0, NULL, &sc, &pr, err))
		return -1;
	int rc = price_stages(o, bars, err);
	if (!rc && !bars[0].ok && !bars[1].ok && !bars[2].ok && !bars[3].ok)
		rc = px_fail(err, PX_ERR_INPUT, "%s: every ZeRO stage is refused: %s", sc.path,
			     bars[0].why);
	if (!rc) {
		snprintf(ps->name, sizeof(ps->name), "%s", sc.name);
		data_table(&ps->dat, &sc, &pr, bars);
		script(&ps->gp, &sc, &pr, bars);
	}
	predict_free(&pr);
	scenario_free(&sc);
	return rc;
}

/* parallax plot time: where one optimizer step's time goes, one horizontal stacked bar per
 * scenario (the slowest pipeline stage's compute stream, as sim/timeline.h breaks it down), with
 * MFU and throughput written beside each bar. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plot.h"

/* The parts of a bar, in the order they are stacked: the data file's columns 3, 4, ... */
enum { T_FWD, T_BWD, T_RECOMPUTE, T_OPTIMIZER, T_BUBBLE, T_OFFLOAD, T_COMM0,
       N_PARTS = T_COMM0 + N_GROUPS };
#define COL_PART0 3                      /* column of the first part */
#define COL_STEP (COL_PART0 + N_PARTS)   /* then step_s, tokens/s, MFU, GPUs */

static const char *const PART_NAME[T_COMM0] = {"forward", "backward", "recompute", "optimizer",
					       "pipeline bubble", "offload stall"};
static const char *const PART_COLOUR[N_PARTS] = {
	"#4e79a7", "#76b7b2", "#a0cbe8", "#f28e2b", "#bab0ac", "#9c755f", /* compute, waits */
	"#e15759", "#b07aa1", "#59a14f", "#edc948", "#ff9da7", "#8cd17d", "#d37295", "#86bcb6",
};

typedef struct TimeBar {
	char name[128];
	int ok;                   /* 0: the step time is not priced (why says so) */
	double part_s[N_PARTS];
	double step_s, tokens_per_s, mfu;
	long long world;
	char why[1024];
} TimeBar;

static void fill_bar(TimeBar *b, const Scenario *sc, const Prediction *pr)
{
	snprintf(b->name, sizeof(b->name), "%s", sc->name);
	b->world = pr->plan.world;
	if (!pr->time_known) {
		snprintf(b->why, sizeof(b->why), "%s", pr->time_note);
		return;
	}
	const TimeResult *t = &pr->time;
	const TimeBreakdown *bd = &t->breakdown;
	b->ok = 1;
	b->part_s[T_FWD] = bd->fwd_s;
	b->part_s[T_BWD] = bd->bwd_s;
	b->part_s[T_RECOMPUTE] = bd->recompute_s;
	b->part_s[T_OPTIMIZER] = bd->optimizer_s;
	b->part_s[T_BUBBLE] = bd->bubble_s;
	b->part_s[T_OFFLOAD] = bd->offload_stall_s;
	for (int g = 0; g < N_GROUPS; g++)
		b->part_s[T_COMM0 + g] = bd->comm_s[g];
	b->step_s = t->step_s;
	b->tokens_per_s = t->tokens_per_s;
	b->mfu = t->mfu;
}

static void part_name(int p, char *buf, size_t n)
{
	if (p < T_COMM0)
		snprintf(buf, n, "%s", PART_NAME[p]);
	else
		snprintf(buf, n, "exposed comm (%s)", group_name((CommGroup)(p - T_COMM0)));
}

/* "fwd_s", "comm_dp_s": the data file's column headers */
static const char *column_name(int p, char *buf, size_t n)
{
	static const char *const short_name[T_COMM0] = {"fwd", "bwd", "recompute", "optimizer",
							"bubble", "offload"};
	if (p < T_COMM0)
		snprintf(buf, n, "%s_s", short_name[p]);
	else
		snprintf(buf, n, "comm_%s_s", group_name((CommGroup)(p - T_COMM0)));
	return buf;
}

static void data_table(PlotBuf *d, const TimeBar *bars, int n, const char *hw)
{
	char name[64];
	pb_printf(d, "# parallax plot time: seconds per optimizer step by part, of the slowest "
		  "pipeline stage's compute stream (%s)\n", hw ? hw : "built-in hardware profiles");
	pb_printf(d, "# seconds per step; comm_X: communication of group X the compute stream "
		  "waited for\n");
	pb_printf(d, "# %3s %-32s", "y", "scenario");
	for (int p = 0; p < N_PARTS; p++)
		pb_printf(d, " %12s", column_name(p, name, sizeof(name)));
	pb_printf(d, " %10s %12s %8s %6s\n", "step_s", "tokens/s", "mfu", "gpus");
	int y = 0;
	for (int i = 0; i < n; i++)
		y += bars[i].ok;
	for (int i = 0; i < n; i++) {
		const TimeBar *b = &bars[i];
		if (!b->ok) {
			pb_printf(d, "# %s left out: %s\n", b->name, b->why);
			continue;
		}
		pb_printf(d, "  %3d ", --y); /* the first scenario on top */
		pb_dat_string(d, b->name);
		pb_printf(d, "%*s", (int)(strlen(b->name) < 30 ? 30 - strlen(b->name) : 0), "");
		for (int p = 0; p < N_PARTS; p++)
			pb_printf(d, " %12.5f", b->part_s[p]);
		pb_printf(d, " %10.5f %12.1f %8.4f %6lld\n", b->step_s, b->tokens_per_s, b->mfu,
			  b->world);
	}
}

static void script(PlotBuf *g, const TimeBar *bars, int n, int shown)
{
	char text[2048] = "", name[64];
	double longest = 0;
	int used[N_PARTS] = {0};
	for (int i = 0; i < n; i++) {
		if (!bars[i].ok)
			continue;
		if (bars[i].step_s > longest)
			longest = bars[i].step_s;
		for (int p = 0; p < N_PARTS; p++)
			used[p] |= bars[i].part_s[p] > 0;
	}
	if (shown == 1)
		for (int i = 0; i < n; i++)
			if (bars[i].ok)
				snprintf(text, sizeof(text), "Where the step time goes: %s",
					 bars[i].name);
	if (shown > 1)
		snprintf(text, sizeof(text), "Where the step time goes: %d scenarios", shown);
	pb_printf(g, "set title ");
	size_t len = strlen(text);
	snprintf(text + len, sizeof(text) - len, "\nthe slowest pipeline stage's compute stream; "
		 "exposed comm = communication not hidden behind compute");
	pb_gp_string(g, text);
	pb_printf(g, "\nset xlabel \"time per optimizer step (s)\"\n"
		  "set xrange [0:%.6g]\nset yrange [-0.6:%d.6]\n"
		  "set ytics scale 0\nset grid xtics lc rgb \"#dddddd\"\n"
		  "set style fill solid 0.9 border rgb \"#404040\"\n"
		  "set key outside right top reverse Left samplen 2\nset rmargin 30\n",
		  longest * 1.04, shown - 1);

	/* footer: what was left out */
	char foot[2048] = "";
	size_t k = 0;
	for (int i = 0; i < n; i++)
		if (!bars[i].ok && k < sizeof(foot))
			k += (size_t)snprintf(foot + k, sizeof(foot) - k, "%s%s left out: %s",
					      k ? "\n" : "", bars[i].name,
					      plot_short_reason(bars[i].why));
	if (k)
		plot_footer(g, 1, foot);

	/* one boxxyerror per part: from the sum of the parts before it to the sum including it */
	pb_printf(g, "plot \\\n");
	int first = 1, last = 0;
	for (int p = 0; p < N_PARTS; p++)
		if (used[p])
			last = p;
	for (int p = 0; p < N_PARTS; p++) {
		if (!used[p])
			continue;
		int col = COL_PART0 + p;
		part_name(p, name, sizeof(name));
		pb_printf(g, "\tdatafile using ((sum [j=%d:%d] column(j)) + $%d/2):1:"
			  "(sum [j=%d:%d] column(j)):(sum [j=%d:%d] column(j)):($1-0.3):($1+0.3)",
			  COL_PART0, col - 1, col, COL_PART0, col - 1, COL_PART0, col);
		/* the first part carries the scenario's tic: its name, step time, MFU, tokens/s */
		if (first)
			pb_printf(g, ":ytic(sprintf(\"%%s\\n%%.3g s/step, MFU %%.1f%%%%\\n"
				  "%%.0f tokens/s, %%d GPUs\", strcol(2), $%d, 100*$%d, $%d, "
				  "int($%d)))", COL_STEP, COL_STEP + 2, COL_STEP + 1, COL_STEP + 3);
		pb_printf(g, " with boxxyerror lc rgb \"%s\" title \"%s\"%s\n", PART_COLOUR[p],
			  name, p == last ? "" : ", \\");
		first = 0;
	}
}

int plot_time(const PlotOpts *o, PlotSpec *ps, PxError *err)
{
	int n = o->n_args, shown = 0, rc = 0;
	TimeBar *bars = calloc((size_t)n, sizeof(*bars));
	if (!bars)
		return px_fail(err, PX_ERR_RUNTIME, "out of memory");
	/* every scenario is read and priced before anything is written */
	for (int i = 0; i < n && !rc; i++) {
		Scenario sc;
		Prediction pr;
		if (plot_predict(o->args[i], &o->ov, NULL, 0, o->hw, &sc, &pr, err)) {
			rc = -1;
			break;
		}
		fill_bar(&bars[i], &sc, &pr);
		shown += bars[i].ok;
		predict_free(&pr);
		scenario_free(&sc);
	}
	if (!rc && !shown)
		rc = px_fail(err, PX_ERR_INPUT, "%s: the step time is not priced: %s", o->args[0],
			     bars[0].why);
	if (!rc) {
		snprintf(ps->name, sizeof(ps->name), "%s", bars[0].name);
		if (n > 1) {
			size_t len = strlen(ps->name);
			snprintf(ps->name + len, sizeof(ps->name) - len, "-and-%d-more", n - 1);
		}
		ps->height_px = 260 + 90 * shown;
		if (ps->height_px < 500)
			ps->height_px = 500;
		data_table(&ps->dat, bars, n, o->hw);
		script(&ps->gp, bars, n, shown);
	}
	free(bars);
	return rc;
}

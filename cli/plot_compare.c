/* parallax plot compare: a measured run against its predicted twin, from the results database's
 * predicted_vs_measured view: measured against predicted for every memory.* and comm.* metric of
 * every rank (log-log, with y = x), and rank 0's relative error per metric, the step time
 * (time.step_s) among them; a step time measured but not predicted is said in the title. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../db/db.h"
#include "paths.h"
#include "plot.h"

typedef struct CmpRow {
	int rank;
	char name[64];
	double predicted, measured;
	int has_error;            /* 0: the view's error is NULL (predicted 0) */
	double error;             /* (measured - predicted) / predicted */
} CmpRow;

typedef struct CmpRun {
	long long id, predicted_id;
	char scenario[128], status[16], created[32];
	CmpRow *rows;             /* owned */
	int n_rows, ranks;
	double time_measured_s;   /* rank 0's time.step_s when the prediction has none, else NAN */
	char time_note[256];      /* the prediction's "step time not priced: ..." reason */
} CmpRun;

static const char ROWS_SQL[] =
	"SELECT rank, name, predicted, measured, error FROM predicted_vs_measured "
	"WHERE measured_run_id = ?1 AND (name LIKE 'memory.%' OR name LIKE 'comm.%' "
	"OR name = 'time.step_s') ORDER BY name, rank";

/* A measured step time the view pairs with nothing, and the prediction's reason. */
static void unpaired_time(sqlite3 *db, CmpRun *r)
{
	sqlite3_stmt *st = NULL;
	r->time_measured_s = NAN;
	for (int i = 0; i < r->n_rows; i++)
		if (!strcmp(r->rows[i].name, "time.step_s"))
			return;
	if (sqlite3_prepare_v2(db, "SELECT (SELECT value FROM metrics WHERE run_id = ?1 AND rank = 0"
			       " AND name = 'time.step_s'), (SELECT notes FROM runs WHERE id = ?2)",
			       -1, &st, NULL) == SQLITE_OK) {
		sqlite3_bind_int64(st, 1, r->id);
		sqlite3_bind_int64(st, 2, r->predicted_id);
		if (sqlite3_step(st) == SQLITE_ROW && sqlite3_column_type(st, 0) != SQLITE_NULL) {
			r->time_measured_s = sqlite3_column_double(st, 0);
			const char *n = (const char *)sqlite3_column_text(st, 1);
			const char *t = n ? strstr(n, "step time not priced: ") : NULL;
			if (t) {
				t += strlen("step time not priced: ");
				snprintf(r->time_note, sizeof(r->time_note), "%.*s",
					 (int)strcspn(t, "\n"), t);
			}
		}
	}
	sqlite3_finalize(st);
}

/* ---- reading the database ---- */

static int find_run(sqlite3 *db, const char *path, long long want, CmpRun *r, PxError *err)
{
	sqlite3_stmt *st = NULL;
	int rc = -1;
	if (sqlite3_prepare_v2(db, want ? "SELECT r.id, r.kind, r.predicted_run_id, s.name, r.status, "
				   "r.created_utc FROM runs r JOIN scenarios s ON s.id = r.scenario_id "
				   "WHERE r.id = ?1"
				 : "SELECT r.id, r.kind, r.predicted_run_id, s.name, r.status, "
				   "r.created_utc FROM runs r JOIN scenarios s ON s.id = r.scenario_id "
				   "WHERE r.kind = 'measured' ORDER BY r.id DESC LIMIT 1",
			       -1, &st, NULL) != SQLITE_OK)
		return px_fail(err, PX_ERR_INPUT, "%s: not a parallax database: %s", path,
			       sqlite3_errmsg(db));
	if (want)
		sqlite3_bind_int64(st, 1, want);
	int step = sqlite3_step(st);
	if (step != SQLITE_ROW && step != SQLITE_DONE) {
		px_fail(err, PX_ERR_RUNTIME, "%s: %s", path, sqlite3_errmsg(db));
		goto out;
	}
	if (step == SQLITE_DONE) {
		if (want)
			px_fail(err, PX_ERR_INPUT, "%s: no run %lld", path, want);
		else
			px_fail(err, PX_ERR_INPUT, "%s: no measured run (parallax run stores them)",
				path);
		goto out;
	}
	r->id = sqlite3_column_int64(st, 0);
	const char *kind = (const char *)sqlite3_column_text(st, 1);
	if (!kind || strcmp(kind, "measured")) {
		px_fail(err, PX_ERR_INPUT, "%s: run %lld is a %s run; give a measured one (parallax "
			"run stores them)", path, r->id, kind ? kind : "?");
		goto out;
	}
	r->predicted_id = sqlite3_column_int64(st, 2);
	const char *s = (const char *)sqlite3_column_text(st, 3);
	snprintf(r->scenario, sizeof(r->scenario), "%s", s ? s : "?");
	s = (const char *)sqlite3_column_text(st, 4);
	snprintf(r->status, sizeof(r->status), "%s", s ? s : "?");
	s = (const char *)sqlite3_column_text(st, 5);
	snprintf(r->created, sizeof(r->created), "%s", s ? s : "?");
	rc = 0;
out:
	sqlite3_finalize(st);
	return rc;
}

static int read_rows(sqlite3 *db, const char *path, CmpRun *r, PxError *err)
{
	sqlite3_stmt *st = NULL;
	int cap = 0, step;
	if (sqlite3_prepare_v2(db, ROWS_SQL, -1, &st, NULL) != SQLITE_OK)
		return px_fail(err, PX_ERR_INPUT, "%s: no predicted_vs_measured view: %s", path,
			       sqlite3_errmsg(db));
	sqlite3_bind_int64(st, 1, r->id);
	while ((step = sqlite3_step(st)) == SQLITE_ROW) {
		if (r->n_rows == cap) {
			cap = cap ? 2 * cap : 256;
			CmpRow *rows = realloc(r->rows, (size_t)cap * sizeof(*rows));
			if (!rows) {
				sqlite3_finalize(st);
				return px_fail(err, PX_ERR_RUNTIME, "out of memory");
			}
			r->rows = rows;
		}
		CmpRow *w = &r->rows[r->n_rows++];
		const char *name = (const char *)sqlite3_column_text(st, 1);
		w->rank = sqlite3_column_int(st, 0);
		snprintf(w->name, sizeof(w->name), "%s", name ? name : "?");
		w->predicted = sqlite3_column_double(st, 2);
		w->measured = sqlite3_column_double(st, 3);
		w->has_error = sqlite3_column_type(st, 4) != SQLITE_NULL;
		w->error = sqlite3_column_double(st, 4);
		if (w->rank + 1 > r->ranks)
			r->ranks = w->rank + 1;
	}
	sqlite3_finalize(st);
	if (step != SQLITE_DONE)
		return px_fail(err, PX_ERR_RUNTIME, "%s: %s", path, sqlite3_errmsg(db));
	if (!r->n_rows)
		return px_fail(err, PX_ERR_INPUT, "%s: measured run %lld has no predicted twin with "
			       "memory or communication metrics (predicted_vs_measured is empty "
			       "for it)", path, r->id);
	return 0;
}

/* ---- the data file: block 0 every rank, block 1 rank 0's errors ---- */

/* The data's kind column: 1 memory (bytes), 0 communication (bytes), 2 time (seconds, not on
 * the bytes panel) */
static int kind_of(const CmpRow *w)
{
	return !strncmp(w->name, "memory.", 7) ? 1 : !strncmp(w->name, "time.", 5) ? 2 : 0;
}

/* Rank 0's relative error in percent, with a word for the cases without one. */
static const char *error_pct(const CmpRow *w, double *pct)
{
	*pct = 0;
	if (w->has_error) {
		*pct = 100 * w->error;
		return NULL;
	}
	return w->measured == w->predicted ? "both 0" : "predicted 0";
}

static void data_table(PlotBuf *d, const CmpRun *r, const char *path)
{
	pb_printf(d, "# parallax plot compare: measured run %lld (%s, %s, %s) against predicted "
		  "run %lld in %s\n", r->id, r->scenario, r->status, r->created, r->predicted_id,
		  path);
	pb_printf(d, "# block 0: every memory.* and comm.* metric of every rank (bytes; memory at "
		  "the peak, communication per optimizer step) and the step time (s)\n");
	if (!isnan(r->time_measured_s))
		pb_printf(d, "# step time measured %.6g s, not predicted: %s\n", r->time_measured_s,
			  r->time_note[0] ? r->time_note : "no prediction");
	pb_printf(d, "# %4s %4s %-36s %16s %16s %12s\n", "rank", "kind", "metric", "predicted",
		  "measured", "error_pct");
	for (int i = 0; i < r->n_rows; i++) {
		const CmpRow *w = &r->rows[i];
		double pct;
		const char *word = error_pct(w, &pct);
		pb_printf(d, "  %4d %4d ", w->rank, kind_of(w));
		pb_dat_string(d, w->name);
		pb_printf(d, kind_of(w) == 2 ? "%*s %16.6g %16.6g " : "%*s %16.0f %16.0f ",
			  (int)(strlen(w->name) < 34 ? 34 - strlen(w->name) : 0), "", w->predicted,
			  w->measured);
		if (word)
			pb_printf(d, "%12s\n", "-");
		else
			pb_printf(d, "%12.6g\n", pct);
	}
	pb_printf(d, "\n\n# block 1: rank 0's relative error per metric, "
		  "(measured - predicted) / predicted in percent ('-': predicted 0)\n");
	pb_printf(d, "# %4s %-36s %12s %-14s\n", "y", "metric", "error_pct", "label");
	int n0 = 0;
	for (int i = 0; i < r->n_rows; i++)
		n0 += r->rows[i].rank == 0;
	for (int i = 0, y = n0; i < r->n_rows; i++) {
		const CmpRow *w = &r->rows[i];
		if (w->rank)
			continue;
		double pct;
		char label[32];
		const char *word = error_pct(w, &pct);
		pb_printf(d, "  %4d ", --y);
		pb_dat_string(d, w->name);
		pb_printf(d, "%*s ", (int)(strlen(w->name) < 34 ? 34 - strlen(w->name) : 0), "");
		if (word && strcmp(word, "both 0"))
			pb_printf(d, "%12s ", "-");
		else
			pb_printf(d, "%12.6g ", pct);
		if (!word)
			snprintf(label, sizeof(label), pct ? "%+.3g%%" : "exact", pct);
		pb_dat_string(d, word ? word : label);
		pb_printf(d, "\n");
	}
}

/* ---- the script: two panels ---- */

static void scatter_panel(PlotBuf *g, const CmpRun *r)
{
	double lo = 0, hi = 0;
	int zeros = 0;
	int bytes_rows = 0;
	for (int i = 0; i < r->n_rows; i++) {
		const CmpRow *w = &r->rows[i];
		if (kind_of(w) == 2)
			continue;
		bytes_rows++;
		if (w->predicted <= 0 || w->measured <= 0) {
			zeros++;
			continue;
		}
		double a = fmin(w->predicted, w->measured), b = fmax(w->predicted, w->measured);
		lo = lo && lo < a ? lo : a;
		hi = hi > b ? hi : b;
	}
	if (!hi)
		lo = 1, hi = 10;
	char text[512];
	pb_printf(g, "set origin 0,0\nset size 0.47,0.92\n"
		  "set title \"measured against predicted: %d metrics x %d ranks\"\n"
		  "set xlabel \"predicted (bytes, log scale; k = 10^3, M = 10^6, G = 10^9)\"\n"
		  "set ylabel \"measured (bytes, log scale)\"\n"
		  "set logscale xy 10\nset format xy \"%%.0s%%c\"\n"
		  "set xrange [%.6g:%.6g]\nset yrange [%.6g:%.6g]\nset size ratio -1\n"
		  "set grid xtics ytics lc rgb \"#dddddd\"\n"
		  "set key top left box opaque samplen 2\n",
		  r->ranks ? bytes_rows / r->ranks : 0, r->ranks, lo / 4, hi * 4, lo / 4, hi * 4);
	if (zeros) {
		snprintf(text, sizeof(text), "%d values of 0 not shown on log axes", zeros);
		pb_printf(g, "set label 1 ");
		pb_gp_string(g, text);
		pb_printf(g, " at graph 0.98, graph 0.03 right tc rgb \"#404040\"\n");
	}
	pb_printf(g, "plot \\\n"
		  "\tx with lines dt 2 lc rgb \"#000000\" title \"y = x (exact)\", \\\n"
		  "\tdatafile index 0 using ($4 > 0 && $5 > 0 && $2 == 1 ? $4 : NaN):5 with points "
		  "pt 7 ps 1.3 lc rgb \"#4e79a7\" title \"memory.*\", \\\n"
		  "\tdatafile index 0 using ($4 > 0 && $5 > 0 && $2 == 0 ? $4 : NaN):5 with points "
		  "pt 5 ps 1.1 lc rgb \"#e15759\" title \"comm.*\"\n");
}

static void error_panel(PlotBuf *g, const CmpRun *r)
{
	double worst = 0;
	int n0 = 0, undefined = 0;
	for (int i = 0; i < r->n_rows; i++) {
		const CmpRow *w = &r->rows[i];
		if (w->rank)
			continue;
		n0++;
		double pct;
		const char *word = error_pct(w, &pct);
		undefined += word && strcmp(word, "both 0");
		if (fabs(pct) > worst)
			worst = fabs(pct);
	}
	double span = worst > 0 ? worst * 1.2 : 1;
	pb_printf(g, "unset logscale\nunset label\nunset ylabel\nset size noratio\nset format x \"%%g\"\n"
		  "set format y \"%%g\"\nset datafile missing \"-\"\n"
		  "set origin 0.47,0\nset size 0.53,0.92\n");
	pb_printf(g, "set title \"rank 0: relative error per metric%s\"\n",
		  worst == 0 && !undefined ? " (every one exact)" : "");
	pb_printf(g, "set xlabel \"(measured - predicted) / predicted (%%)\"\n"
		  "set xrange [%.6g:%.6g]\nset yrange [-0.7:%d.7]\n"
		  "set ytics scale 0 font \",10\"\nset grid xtics lc rgb \"#dddddd\"\n"
		  "set style fill solid 0.85 border rgb \"#404040\"\nset key off\n"
		  "set arrow 1 from 0, graph 0 to 0, graph 1 nohead lc rgb \"#000000\"\n"
		  "set lmargin 40\n",
		  -span, span, n0 - 1);
	/* each metric's tic carries its value, so no label can sit on a bar */
	pb_printf(g, "plot datafile index 1 using ($3/2):1:(0):($3):($1-0.35):($1+0.35):"
		  "ytic(strcol(2).\"  (\".strcol(4).\")\") with boxxyerror lc rgb \"#76b7b2\"\n");
}

static void script(PlotBuf *g, const CmpRun *r)
{
	char text[512];
	int len = snprintf(text, sizeof(text), "Predicted against measured: %s, measured run %lld%s "
			   "(predicted run %lld)", r->scenario, r->id,
			   strcmp(r->status, "ok") ? " (failed)" : "", r->predicted_id);
	if (!isnan(r->time_measured_s) && len > 0 && (size_t)len < sizeof(text))
		snprintf(text + len, sizeof(text) - (size_t)len, "\nstep time measured %.3g s, not "
			 "predicted (%.*s)", r->time_measured_s, 120,
			 r->time_note[0] ? r->time_note : "no prediction");
	pb_printf(g, "set multiplot title ");
	pb_gp_string(g, text);
	pb_printf(g, "\n");
	scatter_panel(g, r);
	error_panel(g, r);
	pb_printf(g, "unset multiplot\n");
}

int plot_compare(const PlotOpts *o, PlotSpec *ps, PxError *err)
{
	char dflt[PATH_MAX];
	const char *path = o->db;
	long long want = 0;
	CmpRun r = {0};
	sqlite3 *db = NULL;
	int rc = -1;
	if (!(path = paths_db(path, dflt, sizeof(dflt), 0, err)))
		return -1;
	if (o->n_args) {
		char *end;
		errno = 0;
		want = strtoll(o->args[0], &end, 10);
		if (*end || end == o->args[0] || errno || want <= 0)
			return px_fail(err, PX_ERR_INPUT, "expected a run id (a positive integer), got "
				       "'%s'", o->args[0]);
	}
	if (!(db = db_open_read(path, err)))
		goto out;
	if (find_run(db, path, want, &r, err) || read_rows(db, path, &r, err))
		goto out;
	unpaired_time(db, &r);
	snprintf(ps->name, sizeof(ps->name), "%s", r.scenario);
	ps->width_px = 1500;
	ps->height_px = 760;
	data_table(&ps->dat, &r, path);
	script(&ps->gp, &r);
	rc = 0;
out:
	free(r.rows);
	sqlite3_close(db);
	return rc;
}

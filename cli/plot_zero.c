/* parallax plot zero: ZeRO's memory claims as runs measured them: for one scenario, the latest
 * measured run at each ZeRO stage and data-parallel size, rank 0's peak memory predicted,
 * measured (the device's own reading where the run had one: backend cuda; else the CPU pool's
 * high-water), the bytes the executor requested, the process's peak resident set above what it
 * held before the executor's set-up (CPU runs) and
 * the ZeRO paper's ideal model states, as clustered bars, each labelled with what it is. */
#include <limits.h>
#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../db/db.h"
#include "paths.h"
#include "plot.h"

enum { ZMAX_STAGE = 4, ZMAX_RANKS = 64 };

typedef struct ZeroCell {
	int have, device;          /* a run; its measured figure is the device's reading */
	long long run;
	double predicted, measured, ideal; /* bytes, rank 0 */
	double requested;          /* the executor's requests at their peak (NAN: not stored) */
	double rss_rise;           /* VmHWM less VmRSS before the set-up (NAN: not stored) */
} ZeroCell;

/* rank 0's metric `name` of run `id` */
#define METRIC(id, name) \
	"(SELECT value FROM metrics WHERE run_id = " id " AND rank = 0 AND name = '" name "')"

static const char RUNS_SQL[] =
	"SELECT m.id, json_extract(s.json, '$.resolved.zero_stage'), "
	"json_extract(s.json, '$.resolved.dp'), " METRIC("m.predicted_run_id", "memory.gpu.peak_bytes")
	", " METRIC("m.id", "memory.gpu.device_peak_bytes") ", " METRIC("m.id", "memory.gpu.peak_bytes")
	", " METRIC("m.predicted_run_id", "memory.ideal_model_states_bytes")
	", " METRIC("m.id", "memory.gpu.requested_peak_bytes")
	", " METRIC("m.id", "memory.process.rss_peak_bytes")
	" - " METRIC("m.id", "memory.process.rss_before_setup_bytes")
	" FROM runs m JOIN scenarios s ON s.id = m.scenario_id "
	"WHERE m.kind = 'measured' AND m.status = 'ok' AND s.name = ?1 ORDER BY m.id";

static const char LATEST_SQL[] =
	"SELECT s.name FROM runs m JOIN scenarios s ON s.id = m.scenario_id "
	"WHERE m.kind = 'measured' AND m.status = 'ok' ORDER BY m.id DESC LIMIT 1";

/* The scenario to draw: given, or that of the latest good measured run. */
static int pick_scenario(sqlite3 *db, const char *path, const char *given, char *name, size_t n,
			 PxError *err)
{
	sqlite3_stmt *st;
	if (given) {
		snprintf(name, n, "%s", given);
		return 0;
	}
	if (sqlite3_prepare_v2(db, LATEST_SQL, -1, &st, NULL) != SQLITE_OK)
		return px_fail(err, PX_ERR_INPUT, "%s: not a parallax database: %s", path,
			       sqlite3_errmsg(db));
	int found = sqlite3_step(st) == SQLITE_ROW;
	if (found)
		snprintf(name, n, "%s", (const char *)sqlite3_column_text(st, 0));
	sqlite3_finalize(st);
	return found ? 0 : px_fail(err, PX_ERR_INPUT, "%s: no measured run (parallax run stores "
				   "them)", path);
}

/* a figure runs stored before it was measured lack */
static double column_or_nan(sqlite3_stmt *st, int col)
{
	return sqlite3_column_type(st, col) == SQLITE_NULL ? NAN : sqlite3_column_double(st, col);
}

/* cells[stage][dp]: the latest run of each; returns how many cells have one, or -1 */
static int read_cells(sqlite3 *db, const char *path, const char *scenario,
		      ZeroCell cells[ZMAX_STAGE][ZMAX_RANKS + 1], PxError *err)
{
	sqlite3_stmt *st;
	int n = 0, step;
	if (sqlite3_prepare_v2(db, RUNS_SQL, -1, &st, NULL) != SQLITE_OK)
		return px_fail(err, PX_ERR_INPUT, "%s: not a parallax database: %s", path,
			       sqlite3_errmsg(db));
	sqlite3_bind_text(st, 1, scenario, -1, SQLITE_TRANSIENT);
	while ((step = sqlite3_step(st)) == SQLITE_ROW) {
		int stage = sqlite3_column_int(st, 1), dp = sqlite3_column_int(st, 2);
		int device = sqlite3_column_type(st, 4) != SQLITE_NULL;
		if (stage < 0 || stage >= ZMAX_STAGE || dp < 1 || dp > ZMAX_RANKS ||
		    sqlite3_column_type(st, 3) == SQLITE_NULL)
			continue; /* not an executor's run of a ZeRO data-parallel layout we can draw */
		ZeroCell *c = &cells[stage][dp];
		n += !c->have;
		*c = (ZeroCell){1, device, sqlite3_column_int64(st, 0), sqlite3_column_double(st, 3),
				sqlite3_column_double(st, device ? 4 : 5), sqlite3_column_double(st, 6),
				column_or_nan(st, 7), column_or_nan(st, 8)};
	}
	sqlite3_finalize(st);
	if (step != SQLITE_DONE)
		return px_fail(err, PX_ERR_RUNTIME, "%s: %s", path, sqlite3_errmsg(db));
	if (!n)
		return px_fail(err, PX_ERR_INPUT, "%s: no measured run of scenario '%s' with a predicted "
			       "twin", path, scenario);
	return n;
}

static void data_table(PlotBuf *d, ZeroCell cells[ZMAX_STAGE][ZMAX_RANKS + 1], const char *scenario,
		       const char *path)
{
	pb_printf(d, "# parallax plot zero: %s in %s, the latest measured run of each ZeRO stage and "
		  "data-parallel size; rank 0's memory at its peak, GiB\n", scenario, path);
	pb_printf(d, "# measured: the device's own reading (backend cuda) where 'device' is 1, else "
		  "the CPU pool's high-water (bytes mapped from the system); requested: the bytes the "
		  "executor asked for (the schedule's labels); vmhwm_rise: the process's peak resident set "
		  "(VmHWM) less its resident set before the executor's set-up; ideal: ZeRO's model states "
		  "(Rajbhandari et al. 2020)\n");
	pb_printf(d, "# %-10s %5s %5s %8s %14s %14s %14s %10s %6s %14s %14s\n", "label", "stage",
		  "ranks", "run", "predicted", "measured", "ideal", "error_pct", "device", "requested",
		  "vmhwm_rise");
	for (int s = 0; s < ZMAX_STAGE; s++)
		for (int n = 1; n <= ZMAX_RANKS; n++) {
			const ZeroCell *c = &cells[s][n];
			if (!c->have)
				continue;
			char label[32];
			snprintf(label, sizeof(label), "Z%d N=%d", s, n);
			pb_printf(d, "  ");
			pb_dat_string(d, label);
			pb_printf(d, "%*s %5d %5d %8lld %14.6f %14.6f %14.6f %10.3f %6d %14.6f %14.6f\n",
				  (int)(10 - strlen(label)), "", s, n, c->run, c->predicted / PLOT_GiB,
				  c->measured / PLOT_GiB, c->ideal / PLOT_GiB,
				  c->predicted > 0 ? 100 * (c->measured - c->predicted) / c->predicted : 0,
				  c->device, c->requested / PLOT_GiB, c->rss_rise / PLOT_GiB);
		}
}

static void script(PlotBuf *g, const char *scenario, int any_device)
{
	char title[512];
	snprintf(title, sizeof(title), "Per-rank memory by ZeRO stage and data-parallel ranks: %s",
		 scenario);
	pb_printf(g, "set title ");
	pb_gp_string(g, title);
	pb_printf(g, "\nset ylabel \"GiB per rank (rank 0, at its peak)\"\n"
		  "set xlabel \"ZeRO stage (Z) and data-parallel ranks (N)\"\n"
		  "set style data histograms\nset style histogram clustered gap 1\n"
		  "set style fill solid 0.85 border rgb \"#404040\"\nset boxwidth 0.9\n"
		  "set yrange [0:*]\nset grid ytics lc rgb \"#dddddd\"\nset datafile missing NaN\n"
		  "set key top right box opaque\nset xtics rotate by -30 nomirror\n");
	plot_footer(g, 1, any_device ?
		    "measured: the device's own reading (NVML, else cudaMalloc'd bytes) of each rank's "
		    "process at its peak\nrequested: what the executor asked for (the schedule's "
		    "labels)\nideal: model states only, (2 + 2 + K) x params / N partitioned by stage "
		    "(ZeRO paper, Table 1)" :
		    "measured: the CPU backend's pool high-water (bytes mapped from the system); "
		    "requested: what the executor asked for (the schedule's labels)\nVmHWM rise: the "
		    "process's peak resident set less what it held before the executor's set-up\n"
		    "ideal: model states only, (2 + 2 + K) x params / N partitioned by stage (ZeRO "
		    "paper, Table 1)");
	pb_printf(g, "plot datafile using 5:xtic(1) title \"predicted\" lc rgb \"#4e79a7\", \\\n"
		  "\t'' using 6 title \"%s\" lc rgb \"#f28e2b\", \\\n"
		  "\t'' using 10 title \"requested (the executor's)\" lc rgb \"#59a14f\", \\\n",
		  any_device ? "measured: device reading" : "measured: pool high-water");
	if (!any_device)
		pb_printf(g, "\t'' using 11 title \"VmHWM rise (from before set-up)\" lc rgb \"#e15759\", \\\n");
	pb_printf(g, "\t'' using 7 title \"ZeRO ideal (model states)\" lc rgb \"#bab0ac\"\n");
}

int plot_zero(const PlotOpts *o, PlotSpec *ps, PxError *err)
{
	char dflt[PATH_MAX];
	const char *path = o->db;
	static ZeroCell cells[ZMAX_STAGE][ZMAX_RANKS + 1];
	char scenario[256];
	int rc = -1;
	if (!(path = paths_db(path, dflt, sizeof(dflt), 0, err)))
		return -1;
	memset(cells, 0, sizeof(cells));
	sqlite3 *db = db_open_read(path, err);
	if (!db)
		return -1;
	if (pick_scenario(db, path, o->n_args ? o->args[0] : NULL, scenario, sizeof(scenario), err) ||
	    read_cells(db, path, scenario, cells, err) < 0)
		goto out;
	int any_device = 0;
	for (int s = 0; s < ZMAX_STAGE; s++)
		for (int n = 1; n <= ZMAX_RANKS; n++)
			any_device |= cells[s][n].have && cells[s][n].device;
	snprintf(ps->name, sizeof(ps->name), "%s", scenario);
	ps->width_px = 1300;
	ps->height_px = 760;
	data_table(&ps->dat, cells, scenario, path);
	script(&ps->gp, scenario, any_device);
	rc = 0;
out:
	sqlite3_close(db);
	return rc;
}

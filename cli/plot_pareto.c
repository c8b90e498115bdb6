/* parallax plot pareto: a stored sweep's trade-offs, read from the sweep_points table. Left:
 * time against cost (hours per billion tokens against USD per million tokens, or GPU-hours per
 * million tokens when the sweep has no prices), right: throughput against GPUs; in each the
 * Pareto front, the points no other point beats on both axes, is drawn as a line (of points
 * equal on both, the one the sweep lists first). Points are coloured by GPU type. Only points that fit and were timed (status 'ok') are drawn. */
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

#define MAX_GPU_TYPES 16
#define MAX_DRAWN 20000  /* points off both fronts beyond this are thinned evenly */

typedef struct ParetoPt {
	long long idx, world;
	int gpu;                  /* index into ParetoSweep.gpus */
	double tokens_per_s, cost, mfu;
	unsigned char on_cost, on_gpus;  /* on the time-cost front, the throughput-GPUs front */
} ParetoPt;

typedef struct ParetoSweep {
	long long id, n_points, n_ok, n_oom, n_invalid, n_unpriced;
	char name[256];
	int priced;               /* every drawn point has a USD cost */
	char gpus[MAX_GPU_TYPES][32];
	int n_gpus;
	ParetoPt *pts;
	int n;
} ParetoSweep;

/* ---- the front ---- */

typedef struct FrontKey {
	double a, b;
	int i;
} FrontKey;

static int key_cmp(const void *x, const void *y)
{
	const FrontKey *p = x, *q = y;
	if (p->a != q->a)
		return p->a < q->a ? -1 : 1;
	if (p->b != q->b)
		return p->b > q->b ? -1 : 1;
	return (p->i > q->i) - (p->i < q->i);
}

int plot_pareto_front(const double *a, const double *b, int n, unsigned char *front)
{
	FrontKey *k = malloc((size_t)(n ? n : 1) * sizeof(*k));
	if (!k)
		return -1;
	for (int i = 0; i < n; i++) {
		k[i] = (FrontKey){a[i], b[i], i};
		front[i] = 0;
	}
	/* by a rising (b falling among equal a): a point is on the front when its b beats every
	 * b before it, i.e. of every point at least as good on a */
	qsort(k, (size_t)n, sizeof(*k), key_cmp);
	int count = 0;
	double best = -INFINITY;
	for (int j = 0; j < n; j++)
		if (k[j].b > best) {
			best = k[j].b;
			front[k[j].i] = 1;
			count++;
		}
	free(k);
	return count;
}

/* ---- reading the sweep ---- */

static int sql_fail(PxError *err, sqlite3 *db, const char *path)
{
	return px_fail(err, PX_ERR_RUNTIME, "%s: %s", path, sqlite3_errmsg(db));
}

/* The sweep named by arg (an id, or a name: its newest sweep), or the newest of all. */
static int find_sweep(sqlite3 *db, const char *path, const char *arg, ParetoSweep *s, PxError *err)
{
	sqlite3_stmt *st = NULL;
	long long id = 0;
	if (arg) {
		char *end;
		errno = 0;
		id = strtoll(arg, &end, 10);
		if (*end || end == arg || errno || id <= 0)
			id = 0;
	}
	const char *sql = id ? "SELECT id, name, n_points FROM sweeps WHERE id = ?1"
		: arg ? "SELECT id, name, n_points FROM sweeps WHERE name = ?1 ORDER BY id DESC LIMIT 1"
		      : "SELECT id, name, n_points FROM sweeps ORDER BY id DESC LIMIT 1";
	if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK) {
		if (strstr(sqlite3_errmsg(db), "no such table"))
			return px_fail(err, PX_ERR_INPUT, "%s: holds no sweeps (run parallax sweep "
				       "SWEEP.json --db %s first)", path, path);
		return sql_fail(err, db, path);
	}
	if (id)
		sqlite3_bind_int64(st, 1, id);
	else if (arg)
		sqlite3_bind_text(st, 1, arg, -1, SQLITE_STATIC);
	int step = sqlite3_step(st);
	if (step == SQLITE_ROW) {
		s->id = sqlite3_column_int64(st, 0);
		snprintf(s->name, sizeof(s->name), "%s", (const char *)sqlite3_column_text(st, 1));
		s->n_points = sqlite3_column_int64(st, 2);
	}
	sqlite3_finalize(st);
	if (step == SQLITE_DONE) {
		if (arg)
			return px_fail(err, PX_ERR_INPUT, "%s: no sweep with %s '%s' (the sweeps "
				       "table lists them)", path, id ? "id" : "name", arg);
		return px_fail(err, PX_ERR_INPUT, "%s: holds no sweeps (run parallax sweep "
			       "SWEEP.json --db %s first)", path, path);
	}
	return step == SQLITE_ROW ? 0 : sql_fail(err, db, path);
}

static int gpu_index(ParetoSweep *s, const char *name)
{
	for (int g = 0; g < s->n_gpus; g++)
		if (!strcmp(s->gpus[g], name))
			return g;
	if (s->n_gpus == MAX_GPU_TYPES)
		return -1;
	snprintf(s->gpus[s->n_gpus], sizeof(s->gpus[0]), "%s", name);
	return s->n_gpus++;
}

static int read_points(sqlite3 *db, const char *path, ParetoSweep *s, PxError *err)
{
	sqlite3_stmt *st = NULL;
	if (sqlite3_prepare_v2(db, "SELECT status, count(*) FROM sweep_points WHERE sweep_id = ?1 "
			       "GROUP BY status", -1, &st, NULL) != SQLITE_OK)
		return sql_fail(err, db, path);
	sqlite3_bind_int64(st, 1, s->id);
	while (sqlite3_step(st) == SQLITE_ROW) {
		const char *status = (const char *)sqlite3_column_text(st, 0);
		long long c = sqlite3_column_int64(st, 1);
		if (!strcmp(status, "ok"))
			s->n_ok = c;
		else if (!strcmp(status, "oom"))
			s->n_oom = c;
		else if (!strcmp(status, "invalid"))
			s->n_invalid = c;
		else
			s->n_unpriced = c;
	}
	sqlite3_finalize(st);
	if (s->n_ok > 50000000)
		return px_fail(err, PX_ERR_INPUT, "%s: sweep %lld has %lld priced points; at most "
			       "50000000 can be plotted", path, s->id, s->n_ok);
	s->pts = malloc((size_t)(s->n_ok ? s->n_ok : 1) * sizeof(*s->pts));
	if (!s->pts)
		return px_fail(err, PX_ERR_RUNTIME, "out of memory for %lld points", s->n_ok);
	/* by index, so that of points equal on both axes the front keeps the sweep's first */
	if (sqlite3_prepare_v2(db, "SELECT idx, world, gpu, tokens_per_s, cost_per_mtoken, mfu "
			       "FROM sweep_points WHERE sweep_id = ?1 AND status = 'ok' AND "
			       "tokens_per_s > 0 AND world > 0 ORDER BY idx", -1, &st,
			       NULL) != SQLITE_OK)
		return sql_fail(err, db, path);
	sqlite3_bind_int64(st, 1, s->id);
	int step;
	s->priced = 1;
	while ((step = sqlite3_step(st)) == SQLITE_ROW && s->n < s->n_ok) {
		ParetoPt *p = &s->pts[s->n];
		const char *gpu = (const char *)sqlite3_column_text(st, 2);
		p->idx = sqlite3_column_int64(st, 0);
		p->world = sqlite3_column_int64(st, 1);
		p->gpu = gpu_index(s, gpu ? gpu : "?");
		if (p->gpu < 0) {
			sqlite3_finalize(st);
			return px_fail(err, PX_ERR_INPUT, "%s: sweep %lld has more than %d GPU types "
				       "to colour", path, s->id, MAX_GPU_TYPES);
		}
		p->tokens_per_s = sqlite3_column_double(st, 3);
		if (sqlite3_column_type(st, 4) == SQLITE_NULL)
			s->priced = 0;
		p->cost = sqlite3_column_double(st, 4);
		p->mfu = sqlite3_column_double(st, 5);
		s->n++;
	}
	sqlite3_finalize(st);
	if (step != SQLITE_DONE && step != SQLITE_ROW)
		return sql_fail(err, db, path);
	if (!s->n)
		return px_fail(err, PX_ERR_INPUT, "%s: sweep %lld (%s) has no point that fits and "
			       "was timed (%lld do not fit, %lld refused, %lld unpriced)", path, s->id,
			       s->name, s->n_oom, s->n_invalid, s->n_unpriced);
	/* without a price for every point, cost is GPU-hours per million tokens for all */
	if (!s->priced)
		for (int i = 0; i < s->n; i++)
			s->pts[i].cost = (double)s->pts[i].world / 3600.0 / s->pts[i].tokens_per_s * 1e6;
	return 0;
}

static int mark_fronts(ParetoSweep *s, PxError *err)
{
	size_t n = (size_t)s->n;
	double *a = calloc(n + 1, sizeof(double)), *b = calloc(n + 1, sizeof(double));
	unsigned char *f = calloc(n + 1, 1);
	int rc = -1;
	if (!a || !b || !f)
		goto out;
	for (size_t i = 0; i < n; i++) {
		a[i] = s->pts[i].cost;
		b[i] = s->pts[i].tokens_per_s;
	}
	if (plot_pareto_front(a, b, s->n, f) < 0)
		goto out;
	for (size_t i = 0; i < n; i++) {
		s->pts[i].on_cost = f[i];
		a[i] = (double)s->pts[i].world;
	}
	if (plot_pareto_front(a, b, s->n, f) < 0)
		goto out;
	for (size_t i = 0; i < n; i++)
		s->pts[i].on_gpus = f[i];
	rc = 0;
out:
	free(a);
	free(b);
	free(f);
	return rc ? px_fail(err, PX_ERR_RUNTIME, "out of memory for the Pareto fronts") : 0;
}

/* ---- the data file: one block per GPU type, then the two fronts ---- */

static double hours_per_btoken(const ParetoPt *p)
{
	return 1e9 / p->tokens_per_s / 3600.0;
}

static void point_row(PlotBuf *d, const ParetoSweep *s, const ParetoPt *p, const char *config)
{
	pb_printf(d, "  %10lld %7lld %14.1f %16.6g %16.6g %7.4f ", p->idx, p->world,
		  p->tokens_per_s, hours_per_btoken(p), p->cost, p->mfu);
	pb_dat_string(d, s->gpus[p->gpu]);
	if (config) {
		pb_printf(d, " ");
		pb_dat_string(d, config);
	}
	pb_printf(d, "\n");
}

static int front_cmp_cost(const void *x, const void *y)
{
	const ParetoPt *p = *(const ParetoPt *const *)x, *q = *(const ParetoPt *const *)y;
	return (p->cost > q->cost) - (p->cost < q->cost);
}

static int front_cmp_world(const void *x, const void *y)
{
	const ParetoPt *p = *(const ParetoPt *const *)x, *q = *(const ParetoPt *const *)y;
	return (p->world > q->world) - (p->world < q->world);
}

/* One front, ordered along its x axis, each point with its configuration. */
static int front_block(PlotBuf *d, sqlite3 *db, const char *path, const ParetoSweep *s, int gpus,
		       PxError *err)
{
	int m = 0;
	for (int i = 0; i < s->n; i++)
		m += gpus ? s->pts[i].on_gpus : s->pts[i].on_cost;
	const ParetoPt **f = malloc((size_t)(m ? m : 1) * sizeof(*f));
	if (!f)
		return px_fail(err, PX_ERR_RUNTIME, "out of memory");
	m = 0;
	for (int i = 0; i < s->n; i++)
		if (gpus ? s->pts[i].on_gpus : s->pts[i].on_cost)
			f[m++] = &s->pts[i];
	qsort(f, (size_t)m, sizeof(*f), gpus ? front_cmp_world : front_cmp_cost);
	sqlite3_stmt *st = NULL;
	if (sqlite3_prepare_v2(db, "SELECT config FROM sweep_points WHERE sweep_id = ?1 AND "
			       "idx = ?2", -1, &st, NULL) != SQLITE_OK) {
		free(f);
		return sql_fail(err, db, path);
	}
	pb_printf(d, "\n\n# block %d: the %s front, %d points (config: the sweep's axis values)\n",
		  s->n_gpus + gpus, gpus ? "throughput-GPUs" : "time-cost", m);
	for (int i = 0; i < m; i++) {
		sqlite3_reset(st);
		sqlite3_bind_int64(st, 1, s->id);
		sqlite3_bind_int64(st, 2, f[i]->idx);
		const char *config = sqlite3_step(st) == SQLITE_ROW
			? (const char *)sqlite3_column_text(st, 0) : NULL;
		point_row(d, s, f[i], config ? config : "?");
	}
	sqlite3_finalize(st);
	free(f);
	return 0;
}

static int data_table(PlotBuf *d, sqlite3 *db, const char *path, const ParetoSweep *s,
		      PxError *err)
{
	int off = 0;
	for (int i = 0; i < s->n; i++)
		off += !s->pts[i].on_cost && !s->pts[i].on_gpus;
	int stride = off > MAX_DRAWN ? (off + MAX_DRAWN - 1) / MAX_DRAWN : 1;
	pb_printf(d, "# parallax plot pareto: sweep %lld (%s) in %s\n", s->id, s->name, path);
	pb_printf(d, "# %lld points: %lld fit and were timed, %lld do not fit, %lld refused, %lld "
		  "unpriced; only those that fit and were timed are drawn\n", s->n_points, s->n_ok, s->n_oom,
		  s->n_invalid, s->n_unpriced);
	pb_printf(d, "# cost: %s\n", s->priced ? "USD per million tokens (the sweep's prices)"
		  : "GPU-hours per million tokens (the sweep has no price for every point)");
	if (stride > 1)
		pb_printf(d, "# %d points off both fronts: every %d-th is listed (and drawn)\n", off,
			  stride);
	pb_printf(d, "# blocks 0..%d: one per GPU type, in this order:", s->n_gpus - 1);
	for (int g = 0; g < s->n_gpus; g++)
		pb_printf(d, " %s", s->gpus[g]);
	pb_printf(d, "\n# %10s %7s %14s %16s %16s %7s %s\n", "idx", "gpus", "tokens_per_s",
		  "h_per_Btokens", s->priced ? "usd_per_Mtokens" : "gpuh_per_Mtokens", "mfu",
		  "gpu [config]");
	for (int g = 0; g < s->n_gpus; g++) {
		if (g)
			pb_printf(d, "\n\n");
		pb_printf(d, "# block %d: %s\n", g, s->gpus[g]);
		int seen = 0;
		for (int i = 0; i < s->n; i++) {
			const ParetoPt *p = &s->pts[i];
			if (p->gpu != g)
				continue;
			int off_front = !p->on_cost && !p->on_gpus;
			if (off_front && seen++ % stride)
				continue;
			point_row(d, s, p, NULL);
		}
	}
	if (front_block(d, db, path, s, 0, err) || front_block(d, db, path, s, 1, err))
		return -1;
	return 0;
}

/* ---- the script: two panels ---- */

static const char *const GPU_COLOUR[MAX_GPU_TYPES] = {
	"#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#b07aa1", "#76b7b2", "#edc948", "#9c755f",
	"#ff9da7", "#bab0ac", "#1f5fa0", "#8cd17d", "#d37295", "#86bcb6", "#499894", "#b6992d",
};

static void gpu_points(PlotBuf *g, const ParetoSweep *s, const char *using)
{
	for (int k = 0; k < s->n_gpus; k++) {
		pb_printf(g, "\tdatafile index %d using %s with points pt 7 ps 0.6 lc rgb \"%s\" "
			  "title ", k, using, GPU_COLOUR[k]);
		pb_gp_string(g, s->gpus[k]);
		pb_printf(g, ", \\\n");
	}
}

static void script(PlotBuf *g, const ParetoSweep *s)
{
	char text[512];
	/* explicit ranges: a sweep at one GPU count (or one cost) would leave an empty range */
	double c_lo = INFINITY, c_hi = 0, h_lo = INFINITY, h_hi = 0, t_lo = INFINITY, t_hi = 0;
	long long w_lo = s->pts[0].world, w_hi = w_lo;
	for (int i = 0; i < s->n; i++) {
		const ParetoPt *p = &s->pts[i];
		c_lo = fmin(c_lo, p->cost);
		c_hi = fmax(c_hi, p->cost);
		h_lo = fmin(h_lo, hours_per_btoken(p));
		h_hi = fmax(h_hi, hours_per_btoken(p));
		t_lo = fmin(t_lo, p->tokens_per_s);
		t_hi = fmax(t_hi, p->tokens_per_s);
		w_lo = p->world < w_lo ? p->world : w_lo;
		w_hi = p->world > w_hi ? p->world : w_hi;
	}
	snprintf(text, sizeof(text), "Sweep %s (%lld): %lld configurations fit and were timed of "
		 "%lld (%lld do not fit, %lld refused)", s->name, s->id, s->n_ok, s->n_points,
		 s->n_oom, s->n_invalid);
	pb_printf(g, "set multiplot title ");
	pb_gp_string(g, text);
	pb_printf(g, "\nset datafile missing \"-\"\nset grid xtics ytics lc rgb \"#dddddd\"\n"
		  "set logscale xy 10\nset key top right box opaque samplen 2\n");

	/* left: time against cost, the front at the lower left */
	pb_printf(g, "set origin 0,0\nset size 0.5,0.94\n"
		  "set title \"time against cost: the front is the lower-left edge\"\n"
		  "set xlabel \"%s per million tokens (log scale)\"\n"
		  "set ylabel \"hours per billion tokens (log scale)\"\n"
		  "set xrange [%.6g:%.6g]\nset yrange [%.6g:%.6g]\n",
		  s->priced ? "cost, USD" : "GPU-hours (no prices given)",
		  c_lo / 1.3, c_hi * 1.3, h_lo / 1.3, h_hi * 1.6);
	plot_log_tics(g, "x", c_lo / 1.3, c_hi * 1.3);
	plot_log_tics(g, "y", h_lo / 1.3, h_hi * 1.6);
	pb_printf(g, "plot \\\n");
	gpu_points(g, s, "5:4");
	pb_printf(g, "\tdatafile index %d using 5:4 with linespoints lw 2 pt 6 ps 1.4 "
		  "lc rgb \"#000000\" title \"Pareto front\"\n", s->n_gpus);

	/* right: throughput against GPUs, the front at the upper left */
	pb_printf(g, "set origin 0.5,0\nset size 0.5,0.94\nset logscale x 2\n"
		  "set key top left box opaque samplen 2\n"
		  "set title \"throughput against GPUs: the front is the upper-left edge\"\n"
		  "set xlabel \"GPUs (log2 scale)\"\n"
		  "set ylabel \"tokens/s (log scale)\"\n"
		  "set xrange [%.6g:%.6g]\nset yrange [%.6g:%.6g]\n"
		  "set xtics auto\n", w_lo / 1.5, w_hi * 1.5, t_lo / 1.3, t_hi * 1.6);
	plot_log_tics(g, "y", t_lo / 1.3, t_hi * 1.6);
	pb_printf(g, "plot \\\n");
	gpu_points(g, s, "2:3");
	pb_printf(g, "\tdatafile index %d using 2:3 with steps lw 2 lc rgb \"#000000\" "
		  "notitle, \\\n"
		  "\tdatafile index %d using 2:3 with points pt 6 ps 1.4 lc rgb \"#000000\" "
		  "title \"Pareto front\"\n"
		  "unset multiplot\n", s->n_gpus + 1, s->n_gpus + 1);
}

int plot_pareto(const PlotOpts *o, PlotSpec *ps, PxError *err)
{
	char dflt[PATH_MAX];
	const char *path = o->db;
	ParetoSweep s;
	sqlite3 *db = NULL;
	int rc = -1;
	memset(&s, 0, sizeof(s));
	if (!(path = paths_db(path, dflt, sizeof(dflt), 0, err)))
		return -1;
	if (!(db = db_open_read(path, err)))
		goto out;
	if (find_sweep(db, path, o->n_args ? o->args[0] : NULL, &s, err) ||
	    read_points(db, path, &s, err) || mark_fronts(&s, err) ||
	    data_table(&ps->dat, db, path, &s, err))
		goto out;
	snprintf(ps->name, sizeof(ps->name), "%s", s.name);
	ps->width_px = 1500;
	ps->height_px = 700;
	script(&ps->gp, &s);
	rc = 0;
out:
	free(s.pts);
	sqlite3_close(db);
	return rc;
}

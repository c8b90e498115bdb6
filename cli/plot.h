/* plot: the inside of `parallax plot`. Each plot kind (plot_memory.c, plot_time.c,
 * plot_scaling.c, plot_compare.c, plot_pareto.c, plot_infer.c) computes its numbers and writes, into memory, a
 * gnuplot data table and the script that draws it; cmd_plot.c owns the options, the output files
 * (written as NAME.tmp and renamed only once gnuplot has succeeded) and running gnuplot;
 * plot_common.c the helpers below. Nothing here prices a scenario: sim/predict.h does. */
#ifndef PX_CLI_PLOT_H
#define PX_CLI_PLOT_H

#include <stddef.h>

#include "../sim/predict.h"

#define PLOT_GiB (1024.0 * 1024.0 * 1024.0)

/* ---- a growable text buffer ---- */

typedef struct PlotBuf {
	char *s;        /* owned, NUL-terminated once anything was written */
	size_t len, cap;
	int oom;        /* an append ran out of memory: the text is incomplete */
} PlotBuf;

void pb_init(PlotBuf *b);
void pb_free(PlotBuf *b); /* accepts a zeroed buffer */
void pb_printf(PlotBuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* s as a gnuplot double-quoted string literal: '"' and '\' escaped, a newline written as \n */
void pb_gp_string(PlotBuf *b, const char *s);
/* s as a quoted string column of a gnuplot data file ("..." with '"' replaced by '\'') */
void pb_dat_string(PlotBuf *b, const char *s);

/* ---- what the command was asked ---- */

typedef struct PlotOpts {
	const char *kind;         /* "memory", "time", "scaling", "compare", "pareto" */
	char **args;              /* positional arguments after the kind (not owned) */
	int n_args;
	JsonOverrides ov;         /* --set, in order */
	const char *out;          /* --out PREFIX, NULL for results/plots/KIND-NAME */
	int png, svg;             /* --format */
	const char *nodes;        /* scaling: --nodes 1,2,4 */
	const char *db;           /* compare, pareto: --db FILE */
	const char *hw;           /* time, scaling, serving: --hw FILE */
	const char *batches;      /* serving: --batches 1,2,4 */
	const char *series;       /* serving: --series KEY=V1,V2 */
} PlotOpts;

/* What a plot kind hands back to be written. */
typedef struct PlotSpec {
	char name[256];           /* the default prefix is results/plots/KIND-NAME */
	PlotBuf dat;              /* the data table: '#' header lines, fixed-width columns */
	PlotBuf gp;               /* settings and plot commands; reads the variable `datafile` and
				     is run once per output format after a `reset` */
	int width_px, height_px;
} PlotSpec;

void plot_spec_init(PlotSpec *ps);
void plot_spec_free(PlotSpec *ps);

/* Each fills ps from o; errors carry PX_ERR_INPUT (bad input: exit 2) or PX_ERR_RUNTIME. */
int plot_memory(const PlotOpts *o, PlotSpec *ps, PxError *err);
int plot_time(const PlotOpts *o, PlotSpec *ps, PxError *err);
int plot_scaling(const PlotOpts *o, PlotSpec *ps, PxError *err);
int plot_compare(const PlotOpts *o, PlotSpec *ps, PxError *err);
int plot_pareto(const PlotOpts *o, PlotSpec *ps, PxError *err);
int plot_zero(const PlotOpts *o, PlotSpec *ps, PxError *err);
int plot_serving(const PlotOpts *o, PlotSpec *ps, PxError *err); /* plot_infer.c */

/* The Pareto front of n points that minimise a and maximise b: front[i] = 1 for each point that
 * no other beats (as good on both and better on one); of points equal on both, the first. Returns
 * how many are on it, or -1 when out of memory. */
int plot_pareto_front(const double *a, const double *b, int n, unsigned char *front);

/* ---- shared by the kinds ---- */

/* Load path with the overrides base plus the extra "KEY=VALUE" entries (n_extra of them), predict
 * it and, when hw is given, price its time with that profile. On success sc and pr are the
 * caller's to free (predict_free, scenario_free); on failure nothing is left to free. */
int plot_predict(const char *path, const JsonOverrides *base, const char *const *extra,
		 int n_extra, const char *hw, Scenario *sc, Prediction *pr, PxError *err);

/* Notes under the plot (lines separated by '\n'), as label `tag`, with the bottom margin made
 * room for them. */
void plot_footer(PlotBuf *g, int tag, const char *text);

/* Tics at 1, 2 and 5 of each decade from lo to hi (lo > 0) on a log axis ("x", "y", "y2"),
 * labelled with k = 10^3 and M = 10^6: powers of ten alone leave one tic when the data spans a
 * decade or two. */
void plot_log_tics(PlotBuf *g, const char *axis, double lo, double hi);

/* The reason in a library message: what follows its last ": " ("ZeRO-2 and ZeRO-3 are
 * incompatible with pipeline parallelism"). Points into msg. */
const char *plot_short_reason(const char *msg);

#endif

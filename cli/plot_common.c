/* plot_common: what the plot kinds share: text buffers, a plot's parts, pricing a scenario with
 * extra overrides, and notes under a plot. */
#include <math.h>
#include <stdarg.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hwload.h"
#include "paths.h"
#include "plot.h"

/* ---- text buffers ---- */

void pb_init(PlotBuf *b)
{
	memset(b, 0, sizeof(*b));
}

void pb_free(PlotBuf *b)
{
	free(b->s);
	pb_init(b);
}

static void pb_vprintf(PlotBuf *b, const char *fmt, va_list ap)
{
	va_list again;
	va_copy(again, ap);
	int n = vsnprintf(NULL, 0, fmt, ap);
	if (n < 0 || b->oom) {
		b->oom = 1;
		va_end(again);
		return;
	}
	if (b->len + (size_t)n + 1 > b->cap) {
		size_t cap = b->cap ? b->cap : 4096;
		while (cap < b->len + (size_t)n + 1)
			cap *= 2;
		char *s = realloc(b->s, cap);
		if (!s) {
			b->oom = 1;
			va_end(again);
			return;
		}
		b->s = s;
		b->cap = cap;
	}
	vsnprintf(b->s + b->len, (size_t)n + 1, fmt, again);
	b->len += (size_t)n;
	va_end(again);
}

void pb_printf(PlotBuf *b, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	pb_vprintf(b, fmt, ap);
	va_end(ap);
}

void pb_gp_string(PlotBuf *b, const char *s)
{
	pb_printf(b, "\"");
	for (; *s; s++) {
		if (*s == '"' || *s == '\\')
			pb_printf(b, "\\%c", *s);
		else if (*s == '\n')
			pb_printf(b, "\\n");
		else
			pb_printf(b, "%c", *s);
	}
	pb_printf(b, "\"");
}

void pb_dat_string(PlotBuf *b, const char *s)
{
	pb_printf(b, "\"");
	for (; *s; s++)
		pb_printf(b, "%c", *s == '"' ? '\'' : *s == '\n' ? ' ' : *s);
	pb_printf(b, "\"");
}

void plot_spec_init(PlotSpec *ps)
{
	memset(ps, 0, sizeof(*ps));
	ps->width_px = 1200;
	ps->height_px = 750;
}

void plot_spec_free(PlotSpec *ps)
{
	pb_free(&ps->dat);
	pb_free(&ps->gp);
}

/* ---- shared by the kinds ---- */

int plot_predict(const char *path, const JsonOverrides *base, const char *const *extra,
		 int n_extra, const char *hw, Scenario *sc, Prediction *pr, PxError *err)
{
	JsonOverrides ov;
	char kv[600];
	int rc = -1;
	jov_init(&ov);
	for (int i = 0; base && i < base->n; i++) {
		snprintf(kv, sizeof(kv), "%s=%s", base->v[i].key, base->v[i].value);
		if (jov_add(&ov, kv, err))
			goto out;
	}
	for (int i = 0; i < n_extra; i++)
		if (jov_add(&ov, extra[i], err))
			goto out;
	char found[PATH_MAX];
	if (scenario_load(sc, paths_find_input(path, found, sizeof(found)), &ov, err))
		goto out;
	if (predict_run(sc, pr, err)) {
		scenario_free(sc);
		goto out;
	}
	if (hw) {
		HwProfile prof;
		char warn[1024];
		if (hwprofile_load(hw, &prof, err) || predict_time(pr, &prof, hw, err)) {
			hwprofile_free(&prof);
			predict_free(pr);
			scenario_free(sc);
			goto out;
		}
		/* once per scenario as given: scaling's points (extra) differ only in node count */
		if (n_extra == 0 && (hwprofile_gpu_mismatch(&prof, hw, &sc->cluster.gpu, warn,
							    sizeof(warn)) ||
				     hwload_cpu_mismatch(&prof, hw, warn, sizeof(warn))))
			fprintf(stderr, "parallax plot: %s\n", warn);
		hwprofile_free(&prof);
	} else if (hwload_cpu_default(pr, NULL, err)) { /* a CPU scenario: this machine's */
		predict_free(pr);
		scenario_free(sc);
		goto out;
	}
	rc = 0;
out:
	jov_free(&ov);
	return rc;
}

void plot_footer(PlotBuf *g, int tag, const char *text)
{
	int lines = 1;
	for (const char *c = text; *c; c++)
		lines += *c == '\n';
	pb_printf(g, "set label %d ", tag);
	pb_gp_string(g, text);
	/* the label's first line sits at its position and the rest run down from it: lift it by
	 * as many lines as it has, and make the bottom margin room for them */
	pb_printf(g, " at screen 0.01, screen 0 offset 0, %d left tc rgb \"#404040\"\n"
		  "set bmargin %d\n", lines, 4 + lines);
}

const char *plot_short_reason(const char *msg)
{
	const char *r = msg, *p;
	while ((p = strstr(r, ": ")) != NULL)
		r = p + 2;
	return r;
}

void plot_log_tics(PlotBuf *g, const char *axis, double lo, double hi)
{
	pb_printf(g, "set %stics (", axis);
	int k = 0;
	for (double dec = pow(10, floor(log10(lo))); dec <= hi; dec *= 10)
		for (int m = 0; m < 3; m++) {
			double v = dec * (m == 0 ? 1 : m == 1 ? 2 : 5);
			if (v >= lo && v <= hi)
				pb_printf(g, "%s\"%g%s\" %.9g", k++ ? ", " : "",
					  v >= 1e6 ? v / 1e6 : v >= 1e3 ? v / 1e3 : v,
					  v >= 1e6 ? "M" : v >= 1e3 ? "k" : "", v);
		}
	pb_printf(g, ")\n");
}

#include "hwcpu.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

const char *const hwcpu_form_names[HWCPU_FORMS] = {"nn", "nt", "tn"};
const char *const hwcpu_kernel_names[HWCPU_KERNELS] = {
	"embed_forward", "embed_backward", "block_forward", "block_backward", "head_forward",
	"head_backward"};
const char *const hwcpu_term_names[HWCPU_TERMS] = {"btc_s", "bttc_s", "btth_s", "btv_s",
						   "w_s"};
const char *const hwcpu_elem_names[HWCPU_ELEM_OPS] = {"convert", "add", "sum_squares",
						      "nonfinite"};
const char *const hwcpu_dtype_names[HWCPU_DTYPES] = {"fp32", "bf16", "fp16"};
const char *const hwcpu_flavour_names[HWCPU_FLAVOURS] = {"fp32", "16bit"};
const CollKind hwcpu_coll_kinds[HWCPU_COLLS] = {COLL_ALL_REDUCE, COLL_ALL_GATHER,
						 COLL_REDUCE_SCATTER, COLL_ALL_TO_ALL};

int hwcpu_dtype_index(Dtype d)
{
	return d == DT_BF16 ? 1 : d == DT_FP16 ? 2 : 0;
}

/* ---- reading: messages ---- */

/* "WHERE: NAME[.KEY]: expected WHAT[, got VALUE]": WHERE locates o's KEY (or o itself). */
static int fail(const JsonObj *o, const char *key, const cJSON *got, PxError *err,
		const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static int fail(const JsonObj *o, const char *key, const cJSON *got, PxError *err,
		const char *fmt, ...)
{
	char where[1100], what[400];
	char *text = got ? cJSON_PrintUnformatted(got) : NULL;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	int line, col;
	if (key && key[0])
		jobj_where(o, key, where, sizeof(where));
	else if (!jdoc_locate(o->doc, o->path, &line, &col))
		snprintf(where, sizeof(where), "%s:%d:%d", o->doc->path, line, col);
	else
		snprintf(where, sizeof(where), "%s", o->doc->path);
	px_fail(err, PX_ERR_INPUT, "%s: %s%s%s: expected %s%s%.200s", where, o->name,
		key && key[0] ? "." : "", key ? key : "", what, got ? ", got " : "",
		got ? (text ? text : "(unprintable)") : "");
	cJSON_free(text);
	return -1;
}

/* Keys that are neither known nor '_' comments are refused: a typo would silently lose a
 * measurement. */
static int check_keys(const JsonObj *o, const char *const *known, int n, PxError *err)
{
	const cJSON *m;
	cJSON_ArrayForEach(m, o->obj) {
		int ok = m->string[0] == '_';
		for (int i = 0; i < n && !ok; i++)
			ok = !strcmp(m->string, known[i]);
		if (!ok)
			return fail(o, m->string, NULL, err, "a known key (unknown key '%s')",
				    m->string);
	}
	return 0;
}

/* A child object that must be there. */
static int need_child(const JsonObj *o, const char *key, JsonObj *child, PxError *err)
{
	int rc = jobj_child(o, key, child, err);
	if (rc < 0)
		return -1;
	if (rc == 0)
		return fail(o, key, NULL, err, "an object: the key is missing");
	return 0;
}

/* ---- reading: curves and the grid ---- */

/* [[x, y], ...]: 1 to HWCPU_CURVE_MAX points, x above 0 and increasing, y in (0, y_hi]. */
static int read_curve(const JsonObj *o, const char *key, const char *xname, const char *yname,
		      double y_scale, double y_hi, HwCpuCurve *c, PxError *err)
{
	const cJSON *a = cJSON_GetObjectItemCaseSensitive(o->obj, key);
	int n = cJSON_IsArray(a) ? cJSON_GetArraySize(a) : -1;
	if (!a)
		return fail(o, key, NULL, err, "an array of [%s, %s] points: the key is missing",
			    xname, yname);
	if (n < 1 || n > HWCPU_CURVE_MAX)
		return fail(o, key, a, err, "an array of 1 to %d points [%s, %s]", HWCPU_CURVE_MAX,
			    xname, yname);
	c->n = n;
	for (int i = 0; i < n; i++) {
		const cJSON *pt = cJSON_GetArrayItem(a, i);
		const cJSON *x = cJSON_GetArrayItem(pt, 0), *y = cJSON_GetArrayItem(pt, 1);
		if (!cJSON_IsArray(pt) || cJSON_GetArraySize(pt) != 2 || !cJSON_IsNumber(x) ||
		    !cJSON_IsNumber(y))
			return fail(o, key, pt, err, "point %d to be [%s, %s]", i, xname, yname);
		c->x[i] = x->valuedouble;
		c->y[i] = y->valuedouble * y_scale;
		if (!isfinite(c->x[i]) || c->x[i] <= 0 || (i > 0 && c->x[i] <= c->x[i - 1]))
			return fail(o, key, pt, err, "point %d's %s above 0 and above the previous "
				    "point's", i, xname);
		if (!isfinite(y->valuedouble) || y->valuedouble <= 0 || y->valuedouble > y_hi)
			return fail(o, key, pt, err, "point %d's %s above 0 and at most %g", i, yname,
				    y_hi);
	}
	return 0;
}

/* Index of v in the sorted axis a[0..*n), adding it in order when new; -1 when full. */
static int axis_slot(double *a, int *n, double v)
{
	int i = 0;
	while (i < *n && a[i] < v)
		i++;
	if (i < *n && a[i] == v)
		return i;
	if (*n == HWCPU_GRID)
		return -1;
	memmove(a + i + 1, a + i, (size_t)(*n - i) * sizeof(*a));
	a[i] = v;
	(*n)++;
	return i;
}

/* The axes of one form's points [m, n, k, GFLOP/s]. */
static int read_axes(const JsonObj *o, const char *key, const cJSON *a, HwCpuLevel *l,
		     PxError *err)
{
	const cJSON *pt;
	int i = 0;
	cJSON_ArrayForEach(pt, a) {
		double v[4];
		for (int d = 0; d < 4; d++) {
			const cJSON *x = cJSON_GetArrayItem(pt, d);
			v[d] = cJSON_IsNumber(x) ? x->valuedouble : NAN;
		}
		if (!cJSON_IsArray(pt) || cJSON_GetArraySize(pt) != 4 || !(v[0] >= 1) ||
		    !(v[1] >= 1) || !(v[2] >= 1) || !(v[3] > 0) || !isfinite(v[0] + v[1] + v[2] + v[3]))
			return fail(o, key, pt, err, "point %d to be [m, n, k, GFLOP/s] with m, n, k "
				    "at least 1 and a rate above 0", i);
		if (axis_slot(l->m, &l->n_m, v[0]) < 0 || axis_slot(l->n, &l->n_n, v[1]) < 0 ||
		    axis_slot(l->k, &l->n_k, v[2]) < 0)
			return fail(o, key, pt, err, "at most %d distinct values of m, of n and of k",
				    HWCPU_GRID);
		i++;
	}
	return 0;
}

static int find(const double *a, int n, double v)
{
	for (int i = 0; i < n; i++)
		if (a[i] == v)
			return i;
	return -1;
}

/* "sgemm": {"nn": [[m, n, k, GFLOP/s], ...], "nt": ..., "tn": ...}: every form gives every
 * (m, n, k) of one grid, once. */
static int read_sgemm(const JsonObj *lv, HwCpuLevel *l, PxError *err)
{
	JsonObj s;
	if (need_child(lv, "sgemm", &s, err) || check_keys(&s, hwcpu_form_names, HWCPU_FORMS, err))
		return -1;
	const cJSON *a[HWCPU_FORMS];
	for (int f = 0; f < HWCPU_FORMS; f++) {
		a[f] = cJSON_GetObjectItemCaseSensitive(s.obj, hwcpu_form_names[f]);
		if (!cJSON_IsArray(a[f]) || cJSON_GetArraySize(a[f]) < 1)
			return fail(&s, hwcpu_form_names[f], a[f], err, "an array of points [m, n, k, "
				    "GFLOP/s]");
		if (read_axes(&s, hwcpu_form_names[f], a[f], l, err))
			return -1;
	}
	int want = l->n_m * l->n_n * l->n_k;
	for (int f = 0; f < HWCPU_FORMS; f++) {
		static char seen[HWCPU_GRID][HWCPU_GRID][HWCPU_GRID];
		memset(seen, 0, sizeof(seen));
		const cJSON *pt;
		cJSON_ArrayForEach(pt, a[f]) {
			int i = find(l->m, l->n_m, cJSON_GetArrayItem(pt, 0)->valuedouble);
			int j = find(l->n, l->n_n, cJSON_GetArrayItem(pt, 1)->valuedouble);
			int k = find(l->k, l->n_k, cJSON_GetArrayItem(pt, 2)->valuedouble);
			if (seen[i][j][k]++)
				return fail(&s, hwcpu_form_names[f], pt, err, "each (m, n, k) once");
			l->gemm_flops_per_s[f][i][j][k] = cJSON_GetArrayItem(pt, 3)->valuedouble * 1e9;
		}
		if (cJSON_GetArraySize(a[f]) != want)
			return fail(&s, hwcpu_form_names[f], NULL, err, "every (m, n, k) of the grid "
				    "the forms span together (%d m x %d n x %d k = %d points), got %d",
				    l->n_m, l->n_n, l->n_k, want, cJSON_GetArraySize(a[f]));
	}
	return 0;
}

/* ---- reading: kernels, loops, collectives ---- */

/* "kernels": {"fp32": {"block_forward": {"btc_s": ..., ...}, ...}, "16bit": {...}}: a flavour
 * given has every kernel; a term left out is 0. */
static int read_kernels(const JsonObj *lv, HwCpuLevel *l, PxError *err)
{
	JsonObj ks;
	if (need_child(lv, "kernels", &ks, err) ||
	    check_keys(&ks, hwcpu_flavour_names, HWCPU_FLAVOURS, err))
		return -1;
	for (int fl = 0; fl < HWCPU_FLAVOURS; fl++) {
		JsonObj f;
		int rc = jobj_child(&ks, hwcpu_flavour_names[fl], &f, err);
		if (rc <= 0) {
			if (rc < 0)
				return -1;
			continue;
		}
		l->have_kernels[fl] = 1;
		if (check_keys(&f, hwcpu_kernel_names, HWCPU_KERNELS, err))
			return -1;
		for (int k = 0; k < HWCPU_KERNELS; k++) {
			JsonObj t;
			if (need_child(&f, hwcpu_kernel_names[k], &t, err) ||
			    check_keys(&t, hwcpu_term_names, HWCPU_TERMS, err))
				return -1;
			for (int i = 0; i < HWCPU_TERMS; i++)
				if (jobj_num(&t, hwcpu_term_names[i], 0, 1, 0, &l->kernel_s[fl][k][i],
					     err) < 0)
					return -1;
		}
	}
	if (!l->have_kernels[0] && !l->have_kernels[1])
		return fail(&ks, NULL, NULL, err, "\"fp32\" or \"16bit\" (or both)");
	return 0;
}

/* "elementwise_s": {"convert.bf16.fp32": s, "add.bf16.fp32": s, "sum_squares.bf16": s,
 * "adamw.fp32": s, ...}: seconds per element, each optional. */
static int read_elementwise(const JsonObj *lv, HwCpuLevel *l, PxError *err)
{
	JsonObj e;
	int rc = jobj_child(lv, "elementwise_s", &e, err);
	if (rc <= 0)
		return rc;
	const cJSON *m;
	cJSON_ArrayForEach(m, e.obj) {
		char op[32], a[16], b[16];
		int n = sscanf(m->string, "%31[a-z_].%15[a-z0-9].%15[a-z0-9]", op, a, b);
		double *dst = NULL;
		if (m->string[0] == '_')
			continue;
		if (n == 2 && !strcmp(op, "adamw") && !strcmp(a, "fp32"))
			dst = &l->adamw_s;
		else if (n == 2 && !strcmp(op, "sgd") && !strcmp(a, "fp32"))
			dst = &l->sgd_s;
		else if (n == 2 && !strcmp(op, "onebit_compress") && !strcmp(a, "fp32"))
			dst = &l->onebit_compress_s;
		else if (n == 2 && !strcmp(op, "onebit_expand") && !strcmp(a, "fp32"))
			dst = &l->onebit_expand_s;
		else if (n == 2 && !strcmp(op, "quantize") && !strcmp(a, "int8"))
			dst = &l->quantize_s;
		else if (n == 2 && !strcmp(op, "dequantize") && !strcmp(a, "int8"))
			dst = &l->dequantize_s;
		for (int o = 0; o < HWCPU_ELEM_OPS && !dst && n >= 2; o++) {
			if (strcmp(op, hwcpu_elem_names[o]) || (o < HWCPU_SUMSQ) != (n == 3))
				continue;
			for (int i = 0; i < HWCPU_DTYPES && !dst; i++)
				for (int j = 0; j < HWCPU_DTYPES && !dst; j++)
					if (!strcmp(a, hwcpu_dtype_names[i]) &&
					    !strcmp(n == 3 ? b : a, hwcpu_dtype_names[j]))
						dst = &l->elem_s[o][i][j];
		}
		if (!dst)
			return fail(&e, m->string, NULL, err, "a loop named OP.DST.SRC (convert, add) "
				    "or OP.DTYPE (sum_squares, nonfinite, adamw.fp32, sgd.fp32, "
				    "onebit_compress.fp32, onebit_expand.fp32, quantize.int8, "
				    "dequantize.int8) over fp32, bf16, fp16");
		if (jobj_num(&e, m->string, 1e-15, 1, 0, dst, err) < 0)
			return -1;
	}
	return 0;
}

static int read_mpi(const JsonObj *lv, HwCpuLevel *l, PxError *err)
{
	JsonObj c;
	const char *keys[HWCPU_COLLS]; /* the kinds' schedule names: "all_reduce", ... */
	for (int i = 0; i < HWCPU_COLLS; i++)
		keys[i] = coll_name(hwcpu_coll_kinds[i]);
	int rc = jobj_child(lv, "mpi", &c, err);
	if (rc < 0)
		return -1;
	if (rc == 0 && l->ranks > 1)
		return fail(lv, "mpi", NULL, err, "the collectives' times over %d ranks: the key is "
			    "missing", l->ranks);
	if (rc == 0)
		return 0;
	if (l->ranks == 1)
		return fail(lv, "mpi", NULL, err, "no collectives at 1 rank");
	if (check_keys(&c, keys, HWCPU_COLLS, err))
		return -1;
	for (int i = 0; i < HWCPU_COLLS; i++) {
		if (hwcpu_coll_kinds[i] == COLL_ALL_TO_ALL &&
		    !cJSON_GetObjectItemCaseSensitive(c.obj, keys[i]))
			continue; /* optional: left unpriced */
		if (read_curve(&c, keys[i], "bytes", "seconds", 1, 1e4, &l->coll_s[i], err))
			return -1;
	}
	return 0;
}

static int read_level(const JsonObj *o, const cJSON *item, int idx, HwCpuLevel *l, PxError *err)
{
	static const char *const keys[] = {"ranks", "sgemm", "kernels", "elementwise_s", "copy_GBps",
					   "fill_GBps", "mpi"};
	char path[300], name[300];
	JsonObj lv;
	snprintf(path, sizeof(path), "%s.levels", o->path);
	snprintf(name, sizeof(name), "%s.levels[%d]", o->name, idx);
	jobj_make(&lv, o->doc, item, path, name, NULL);
	long long ranks;
	if (!cJSON_IsObject(item))
		return fail(o, "levels", item, err, "level %d to be an object", idx);
	if (check_keys(&lv, keys, 7, err))
		return -1;
	int rc = jobj_int(&lv, "ranks", 1, 1 << 16, 0, &ranks, err);
	if (rc == 0)
		return fail(&lv, "ranks", NULL, err, "the ranks running at once: the key is missing");
	if (rc < 0)
		return -1;
	l->ranks = (int)ranks;
	if (read_sgemm(&lv, l, err) || read_kernels(&lv, l, err) || read_elementwise(&lv, l, err) ||
	    read_curve(&lv, "copy_GBps", "bytes", "GB/s", 1e9, 1e5, &l->copy_Bps, err) ||
	    read_curve(&lv, "fill_GBps", "bytes", "GB/s", 1e9, 1e5, &l->fill_Bps, err) ||
	    read_mpi(&lv, l, err))
		return -1;
	return 0;
}

int hwcpu_parse(const JsonObj *o, HwCpu *c, PxError *err)
{
	static const char *const keys[] = {"host", "model", "cores", "blas_threads",
					   "blas_thread_timeout", "levels"};
	const char *s;
	long long v;
	memset(c, 0, sizeof(*c));
	if (check_keys(o, keys, 6, err))
		return -1;
	if (jobj_str(o, "host", "", &s, err) < 0)
		return -1;
	snprintf(c->host, sizeof(c->host), "%s", s);
	if (jobj_str(o, "model", "", &s, err) < 0)
		return -1;
	snprintf(c->model, sizeof(c->model), "%s", s);
	if (jobj_int(o, "cores", 0, 1 << 20, 0, &v, err) < 0)
		return -1;
	c->cores = (int)v;
	if (jobj_int(o, "blas_threads", 0, 1 << 20, 0, &v, err) < 0)
		return -1;
	c->blas_threads = (int)v;
	if (jobj_int(o, "blas_thread_timeout", 0, 30, 0, &v, err) < 0)
		return -1;
	c->blas_thread_timeout = (int)v;
	const cJSON *a = cJSON_GetObjectItemCaseSensitive(o->obj, "levels");
	int n = cJSON_IsArray(a) ? cJSON_GetArraySize(a) : -1;
	if (n < 1 || n > HWCPU_MAX_LEVELS)
		return fail(o, "levels", a, err, "an array of 1 to %d levels (one per number of "
			    "ranks measured)", HWCPU_MAX_LEVELS);
	for (int i = 0; i < n; i++) {
		if (read_level(o, cJSON_GetArrayItem(a, i), i, &c->level[i], err))
			return -1;
		if (i > 0 && c->level[i].ranks <= c->level[i - 1].ranks)
			return fail(o, "levels", NULL, err, "levels in increasing ranks: level %d has "
				    "%d after %d", i, c->level[i].ranks, c->level[i - 1].ranks);
	}
	c->n_levels = n;
	return 0;
}

/* ---- evaluating ---- */

const HwCpuLevel *hwcpu_level(const HwCpu *c, int ranks)
{
	for (int i = 0; c && i < c->n_levels; i++)
		if (c->level[i].ranks == ranks)
			return &c->level[i];
	return NULL;
}

void hwcpu_levels_text(const HwCpu *c, char *buf, size_t n)
{
	size_t k = 0;
	buf[0] = '\0';
	for (int i = 0; c && i < c->n_levels && k < n; i++)
		k += (size_t)snprintf(buf + k, n - k, "%s%d", i ? ", " : "", c->level[i].ranks);
}

/* Where v falls on axis a[0..n): the lower index and the fraction towards the next, in log(v);
 * clamped to the ends. */
static void axis_pos(const double *a, int n, double v, int *i, double *f)
{
	*i = 0, *f = 0;
	if (n < 2 || v <= a[0])
		return;
	if (v >= a[n - 1]) {
		*i = n - 2, *f = 1;
		return;
	}
	while (*i < n - 2 && a[*i + 1] < v)
		(*i)++;
	*f = log(v / a[*i]) / log(a[*i + 1] / a[*i]);
}

double hwcpu_gemm_rate(const HwCpuLevel *l, HwCpuForm f, double m, double n, double k)
{
	int i, j, q;
	double fi, fj, fq, r = 0;
	axis_pos(l->m, l->n_m, m, &i, &fi);
	axis_pos(l->n, l->n_n, n, &j, &fj);
	axis_pos(l->k, l->n_k, k, &q, &fq);
	for (int c = 0; c < 8; c++) { /* the cell's corners, each at its trilinear weight */
		int di = c & 1, dj = c >> 1 & 1, dq = c >> 2 & 1;
		double w = (di ? fi : 1 - fi) * (dj ? fj : 1 - fj) * (dq ? fq : 1 - fq);
		if (w == 0)
			continue;
		r += w * l->gemm_flops_per_s[f][i + (l->n_m > 1 ? di : 0)][j + (l->n_n > 1 ? dj : 0)]
					    [q + (l->n_k > 1 ? dq : 0)];
	}
	return r;
}

double hwcpu_gemm_s(const HwCpuLevel *l, HwCpuForm f, double m, double n, double k)
{
	double rate = hwcpu_gemm_rate(l, f, m, n, k);
	return m > 0 && n > 0 && k > 0 ? 2 * m * n * k / rate : 0;
}

double hwcpu_gemm_peak(const HwCpuLevel *l)
{
	double best = 0;
	for (int f = 0; f < HWCPU_FORMS; f++)
		for (int i = 0; i < l->n_m; i++)
			for (int j = 0; j < l->n_n; j++)
				for (int q = 0; q < l->n_k; q++)
					best = fmax(best, l->gemm_flops_per_s[f][i][j][q]);
	return best;
}

double hwcpu_kernel_s(const HwCpuLevel *l, int flavour, HwCpuKernel k,
		      const double terms[HWCPU_TERMS])
{
	double s = 0;
	for (int i = 0; i < HWCPU_TERMS; i++)
		s += l->kernel_s[flavour][k][i] * terms[i];
	return s;
}

double hw_interp_log(int n, const double *x, const double *y, double at)
{
	if (n <= 0)
		return 0;
	if (n == 1 || at <= x[0])
		return y[0];
	if (at >= x[n - 1])
		return y[n - 1];
	int i = 1;
	while (x[i] < at)
		i++;
	double f = log(at / x[i - 1]) / log(x[i] / x[i - 1]);
	return y[i - 1] + f * (y[i] - y[i - 1]);
}

/* Bandwidth at `bytes`: linear in log(bytes) between points, flat beyond. */
static double curve_Bps(const HwCpuCurve *c, double bytes)
{
	return hw_interp_log(c->n, c->x, c->y, bytes);
}

double hwcpu_copy_s(const HwCpuLevel *l, double bytes)
{
	return bytes > 0 ? bytes / curve_Bps(&l->copy_Bps, bytes) : 0;
}

double hwcpu_fill_s(const HwCpuLevel *l, double bytes)
{
	return bytes > 0 ? bytes / curve_Bps(&l->fill_Bps, bytes) : 0;
}

double hwcpu_elem_s(const HwCpuLevel *l, HwCpuElemOp op, Dtype dst, Dtype src, double n)
{
	if (n <= 0)
		return 0;
	int i = hwcpu_dtype_index(dst), j = hwcpu_dtype_index(src);
	double per = op >= HWCPU_SUMSQ ? l->elem_s[op][j][j] : l->elem_s[op][i][j];
	if (per > 0)
		return n * per;
	/* not measured: a pass over its bytes (a like-to-like convert is exactly that) */
	double bytes = n * (dtype_bytes(src) + (op < HWCPU_SUMSQ ? dtype_bytes(dst) : 0));
	return hwcpu_copy_s(l, bytes);
}

double hwcpu_coll_s(const HwCpuLevel *l, CollKind kind, double bytes)
{
	int k = 0;
	while (k < HWCPU_COLLS && hwcpu_coll_kinds[k] != kind)
		k++;
	if (k == HWCPU_COLLS)
		return -1;
	const HwCpuCurve *c = &l->coll_s[k];
	if (c->n <= 0)
		return -1;
	if (c->n == 1 || bytes <= c->x[0])
		return c->y[0];
	int i = 1;
	while (i < c->n - 1 && c->x[i] < bytes)
		i++;
	double slope = (c->y[i] - c->y[i - 1]) / (c->x[i] - c->x[i - 1]);
	return fmax(c->y[i - 1] + slope * (bytes - c->x[i - 1]), c->y[0]);
}

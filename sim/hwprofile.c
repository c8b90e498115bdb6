#include "hwprofile.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* ---- built-in profiles ----
 * Each equals scenarios/hardware/<gpu>.json, which cites the source of every figure (a test loads
 * the files and compares). In short: GEMM plateaus from the project's H100/H200 measurements
 * (shared/reference/hardware.md) and stas00/ml-engineering's MAMF table (A100), the curve's
 * shape from pytorch/ao PR #2427's sweep; NVLink plateaus from nccl-tests issues #212,
 * #149/#228, #272 and nccl #1161; the network's from nccl-tests #119; FlashAttention-2's rates
 * from its paper and a measurement (A100) and FlashAttention-3's paper (H100); the rest are
 * labelled assumptions. */

#define GEMM_X {2.15e9, 1.72e10, 1.37e11, 1.1e12}
#define LINK_X {1048576, 16777216, 268435456}

/* fitted with the elementwise traffic (3.5 and 7 below) by scripts/fit_time_model.sh on MosaicML's
 * A100 40GB and H100 (under 128 GPUs) tables */
#define A100_SUSTAINED 0.897
#define H100_SUSTAINED 0.777
/* fitted with them, one figure for every GPU: bytes non-GEMM kernels move per kept activation
 * byte (attention scores apart), backward twice forward */
#define ELEMENTWISE .elementwise_fwd = 3.5, .elementwise_bwd = 7
/* assumed (no calibration run keeps scores): the same per byte of eager attention's scores */
#define SCORES .scores_fwd = 2, .scores_bwd = 4

/* assumed, not measured: PyTorch eager's host time per kernel (Python, the dispatcher, autograd's
 * bookkeeping, cudaLaunchKernel), about 5-25 us an op by published accounts (docs/time_model.md) */
#define KERNEL_ISSUE .kernel_issue_s = 10e-6

/* NCCL's own latency model for its LL protocol, the one it picks for small messages (where latency
 * matters): a call's base latency and one NVLink ring step (src/graph/tuning.cc,
 * baseLatencies and hwLatencies, ring LL: 6.6 us and 0.6 us) */
#define BASE_S 6.6e-6
#define NVLINK_STEP_S 0.6e-6

#define NETWORK {BASE_S, 5e-6, {3, LINK_X, {0.46, 0.736, 0.92}}, 1}

static const HwProfile DEFAULTS[] = {
	{
		.gpu = "V100-32GB",
		.gemm = {4, GEMM_X, {0.24, 0.64, 0.792, 0.8}},
		.sustained = 1,
		.hbm_efficiency = 0.9,
		ELEMENTWISE, SCORES,
		.flash_fwd = 0, .flash_bwd = 0,
		.nvlink = {BASE_S, NVLINK_STEP_S, {3, LINK_X, {0.4, 0.64, 0.8}}, 1},
		.network = NETWORK,
		.nvlink_domain = 8,
		KERNEL_ISSUE,
		.pcie_efficiency = 0.8, .nvme_efficiency = 0.8, .cpu_adam_elems_per_s = 2.6e8,
	},
	{
		.gpu = "A100-40GB",
		.gemm = {4, GEMM_X, {0.261, 0.695, 0.86, 0.869}},
		.sustained = A100_SUSTAINED,
		.hbm_efficiency = 0.9,
		ELEMENTWISE, SCORES,
		.flash_fwd = 0.6, .flash_bwd = 0.5,
		.nvlink = {BASE_S, NVLINK_STEP_S, {3, LINK_X, {0.35, 0.56, 0.7}}, 1},
		.network = NETWORK,
		.nvlink_domain = 8,
		KERNEL_ISSUE,
		.pcie_efficiency = 0.8, .nvme_efficiency = 0.8, .cpu_adam_elems_per_s = 6.8e8,
	},
	{
		.gpu = "A100-80GB",
		.gemm = {4, GEMM_X, {0.261, 0.695, 0.86, 0.869}},
		.sustained = A100_SUSTAINED,
		.hbm_efficiency = 0.9,
		ELEMENTWISE, SCORES,
		.flash_fwd = 0.6, .flash_bwd = 0.5,
		.nvlink = {BASE_S, NVLINK_STEP_S, {3, LINK_X, {0.35, 0.56, 0.7}}, 1},
		.network = NETWORK,
		.nvlink_domain = 8,
		KERNEL_ISSUE,
		.pcie_efficiency = 0.8, .nvme_efficiency = 0.8, .cpu_adam_elems_per_s = 6.8e8,
	},
	{
		.gpu = "H100-SXM",
		.gemm = {4, GEMM_X, {0.242, 0.646, 0.799, 0.807}},
		.sustained = H100_SUSTAINED,
		.hbm_efficiency = 0.896,
		ELEMENTWISE, SCORES,
		.flash_fwd = 0.35, .flash_bwd = 0.35,
		.nvlink = {BASE_S, NVLINK_STEP_S, {3, LINK_X, {0.411, 0.658, 0.822}}, 1.297},
		.network = NETWORK,
		.nvlink_domain = 8,
		KERNEL_ISSUE,
		.pcie_efficiency = 0.8, .nvme_efficiency = 0.8, .cpu_adam_elems_per_s = 1e9,
	},
	{
		.gpu = "H100-PCIe",
		.gemm = {4, GEMM_X, {0.242, 0.646, 0.799, 0.807}},
		.sustained = H100_SUSTAINED,
		.hbm_efficiency = 0.9,
		ELEMENTWISE, SCORES,
		.flash_fwd = 0.35, .flash_bwd = 0.35,
		.nvlink = {BASE_S, NVLINK_STEP_S, {3, LINK_X, {0.192, 0.306, 0.383}}, 1},
		.network = NETWORK,
		.nvlink_domain = 2,
		KERNEL_ISSUE,
		.pcie_efficiency = 0.8, .nvme_efficiency = 0.8, .cpu_adam_elems_per_s = 1e9,
	},
	{
		.gpu = "H200",
		.gemm = {4, GEMM_X, {0.238, 0.634, 0.784, 0.792}},
		.sustained = H100_SUSTAINED,
		.hbm_efficiency = 0.896,
		ELEMENTWISE, SCORES,
		.flash_fwd = 0.35, .flash_bwd = 0.35,
		.nvlink = {BASE_S, NVLINK_STEP_S, {3, LINK_X, {0.411, 0.658, 0.822}}, 1.284},
		.network = NETWORK,
		.nvlink_domain = 8,
		KERNEL_ISSUE,
		.pcie_efficiency = 0.8, .nvme_efficiency = 0.8, .cpu_adam_elems_per_s = 1e9,
	},
};
#define N_DEFAULTS (int)(sizeof(DEFAULTS) / sizeof(DEFAULTS[0]))
#define FALLBACK 2 /* A100-80GB */

double hw_curve_eval(const HwCurve *c, double x)
{
	return hw_interp_log(c->n, c->x, c->y, x);
}

static const HwProfile *find_default(const char *name)
{
	for (int i = 0; name && i < N_DEFAULTS; i++)
		if (!strcasecmp(DEFAULTS[i].gpu, name))
			return &DEFAULTS[i];
	return NULL;
}

int hwprofile_default(const GpuSpec *gpu, HwProfile *hw)
{
	const HwProfile *d = find_default(gpu ? gpu->name : NULL);
	*hw = d ? *d : DEFAULTS[FALLBACK];
	if (!d)
		snprintf(hw->gpu, sizeof(hw->gpu), "%s", gpu && gpu->name ? gpu->name : "unknown");
	return d ? 0 : -1;
}

/* ---- the fields of a profile file ---- */

typedef enum { F_NUM, F_INT, F_CURVE } FieldKind;

typedef struct Field {
	const char *section, *key;
	FieldKind kind;
	size_t off;       /* into HwProfile */
	double lo, hi;    /* range of the number (F_CURVE: of each point's y) */
	int lo_open;      /* lo itself is refused: a rate or fraction must be above 0 */
} Field;

#define NUM(sec, key, member, lo, hi, open) \
	{sec, key, F_NUM, offsetof(HwProfile, member), lo, hi, open}
#define CURVE(sec, key, member, hi) {sec, key, F_CURVE, offsetof(HwProfile, member), 0, hi, 1}

static const Field FIELDS[] = {
	CURVE("compute", "gemm_efficiency", gemm, 1),
	NUM("compute", "sustained", sustained, 0, 1, 1),
	NUM("compute", "hbm_efficiency", hbm_efficiency, 0, 1, 1),
	NUM("compute", "elementwise_forward", elementwise_fwd, 0, 100, 0),
	NUM("compute", "elementwise_backward", elementwise_bwd, 0, 100, 0),
	NUM("compute", "scores_forward", scores_fwd, 0, 100, 0),
	NUM("compute", "scores_backward", scores_bwd, 0, 100, 0),
	NUM("compute", "flash_forward", flash_fwd, 0, 1, 0),
	NUM("compute", "flash_backward", flash_bwd, 0, 1, 0),
	NUM("nvlink", "base_s", nvlink.base_s, 0, 0.01, 0),
	NUM("nvlink", "alpha_s", nvlink.alpha_s, 0, 0.01, 0),
	CURVE("nvlink", "efficiency", nvlink.efficiency, 1),
	NUM("nvlink", "allreduce_scale", nvlink.allreduce_scale, 0.25, 4, 0),
	{"nvlink", "domain_gpus", F_INT, offsetof(HwProfile, nvlink_domain), 1, 1 << 20, 0},
	NUM("network", "base_s", network.base_s, 0, 0.01, 0),
	NUM("network", "alpha_s", network.alpha_s, 0, 0.01, 0),
	CURVE("network", "efficiency", network.efficiency, 1),
	NUM("network", "allreduce_scale", network.allreduce_scale, 0.25, 4, 0),
	NUM("host", "pcie_efficiency", pcie_efficiency, 0, 1, 1),
	NUM("host", "nvme_efficiency", nvme_efficiency, 0, 1, 1),
	NUM("host", "cpu_adam_elems_per_s_per_gpu", cpu_adam_elems_per_s, 0, 1e13, 1),
	NUM("host", "kernel_issue_s", kernel_issue_s, 0, 0.01, 0),
	NUM("memory", "cuda_context_MiB", context_MiB, 0, 1e6, 0),
	NUM("memory", "cublas_workspace_MiB", cublas_MiB, 0, 1e6, 0),
	NUM("memory", "nccl_MiB", nccl_MiB, 0, 1e6, 0),
};
#define N_FIELDS (int)(sizeof(FIELDS) / sizeof(FIELDS[0]))

static const char *const SECTIONS[] = {"compute", "nvlink", "network", "host", "memory", NULL};

/* ---- locating an array element in the text ---- */

/* Offset of line:col (1-based) in text. */
static size_t text_offset(const char *text, int line, int col)
{
	size_t i = 0;
	for (int l = 1; l < line && text[i]; i++)
		if (text[i] == '\n')
			l++;
	return i + (size_t)(col - 1);
}

static void text_line_col(const char *text, size_t off, int *line, int *col)
{
	size_t start = 0;
	*line = 1;
	for (size_t i = 0; i < off && text[i]; i++)
		if (text[i] == '\n') {
			(*line)++;
			start = i + 1;
		}
	*col = (int)(off - start) + 1;
}

static size_t skip_ws(const char *t, size_t i)
{
	while (t[i] && strchr(" \t\r\n", t[i]))
		i++;
	return i;
}

/* Past the JSON value at t[i] (text cJSON accepted, so only bounds need care). */
static size_t skip_value(const char *t, size_t i)
{
	int depth = 0;
	do {
		if (t[i] == '"') {
			for (i++; t[i] && t[i] != '"'; i++)
				if (t[i] == '\\' && t[i + 1])
					i++;
		} else if (t[i] == '[' || t[i] == '{') {
			depth++;
		} else if (t[i] == ']' || t[i] == '}') {
			depth--;
		} else if (depth == 0) { /* a scalar: up to the next delimiter */
			while (t[i] && !strchr(",]} \t\r\n", t[i]))
				i++;
			return i;
		}
		if (t[i])
			i++;
	} while (t[i] && depth > 0);
	return i;
}

/* "FILE:LINE:COL" of element idx of the array at o.key (idx < 0: the array itself). */
static void where_elem(const JsonObj *o, const char *key, int idx, char *buf, size_t n)
{
	char path[600];
	int line, col;
	snprintf(path, sizeof(path), "%s%s%s", o->path, o->path[0] ? "." : "", key);
	if (jdoc_locate(o->doc, path, &line, &col)) {
		snprintf(buf, n, "%s", o->doc->path);
		return;
	}
	const char *t = o->doc->text;
	size_t i = text_offset(t, line, col);
	if (idx >= 0 && t[i] == '[') {
		i = skip_ws(t, i + 1);
		for (int k = 0; k < idx && t[i] && t[i] != ']'; k++) {
			i = skip_ws(t, skip_value(t, i));
			if (t[i] == ',')
				i = skip_ws(t, i + 1);
		}
		text_line_col(t, i, &line, &col);
	}
	snprintf(buf, n, "%s:%d:%d", o->doc->path, line, col);
}

/* "WHERE: NAME.KEY[IDX]: expected WHAT, got VALUE" */
static int fail_at(const JsonObj *o, const char *key, int idx, const cJSON *got, PxError *err,
		   const char *fmt, ...) __attribute__((format(printf, 6, 7)));
static int fail_at(const JsonObj *o, const char *key, int idx, const cJSON *got, PxError *err,
		   const char *fmt, ...)
{
	char where[700], what[300], index[32] = "";
	char *text = got ? cJSON_PrintUnformatted(got) : NULL;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	where_elem(o, key, idx, where, sizeof(where));
	if (idx >= 0)
		snprintf(index, sizeof(index), "[%d]", idx);
	px_fail(err, PX_ERR_INPUT, "%s: %s%s%s%s: expected %s%s%s", where, o->name,
		o->name[0] ? "." : "", key, index, what, got ? ", got " : "",
		got ? (text ? text : "(unprintable)") : "");
	cJSON_free(text);
	return -1;
}

/* ---- reading ---- */

static const cJSON *member(const JsonObj *o, const char *key)
{
	const cJSON *m = o->obj ? cJSON_GetObjectItemCaseSensitive(o->obj, key) : NULL;
	return cJSON_IsNull(m) ? NULL : m;
}

static int in_range(double v, const Field *f)
{
	return isfinite(v) && (f->lo_open ? v > f->lo : v >= f->lo) && v <= f->hi;
}

static void range_text(const Field *f, char *buf, size_t n)
{
	snprintf(buf, n, "%s %g %s %g", f->lo_open ? "above" : "from", f->lo,
		 f->lo_open ? "and at most" : "to", f->hi);
}

/* Refuse keys that are neither known nor comments ('_' first, a string): a typo in a calibration
 * file would silently keep a default. */
static int check_keys(const JsonObj *o, const char *const *known, PxError *err)
{
	const cJSON *m;
	cJSON_ArrayForEach(m, o->obj) {
		if (m->string[0] == '_') {
			if (!cJSON_IsString(m))
				return fail_at(o, m->string, -1, m, err, "a string (a comment or a source)");
			continue;
		}
		const char *best = NULL;
		int best_d = 1 << 30, ok = 0;
		for (int i = 0; known[i] && !ok; i++) {
			int d = jdoc_edit_distance(m->string, known[i]);
			ok = d == 0;
			if (d < best_d)
				best_d = d, best = known[i];
		}
		if (ok)
			continue;
		char where[700];
		where_elem(o, m->string, -1, where, sizeof(where));
		if (best && best_d <= 3 && (size_t)best_d < strlen(m->string))
			return px_fail(err, PX_ERR_INPUT, "%s: unknown key '%s%s%s'; did you mean "
				       "'%s%s%s'?", where, o->name, o->name[0] ? "." : "", m->string,
				       o->name, o->name[0] ? "." : "", best);
		return px_fail(err, PX_ERR_INPUT, "%s: unknown key '%s%s%s'", where, o->name,
			       o->name[0] ? "." : "", m->string);
	}
	return 0;
}

/* A curve: 1 to HW_CURVE_MAX points [x, y] with x > 0 increasing and y in f's range. */
static int read_curve(const JsonObj *o, const Field *f, const cJSON *a, HwCurve *c, PxError *err)
{
	const char *xname = !strcmp(f->section, "compute") ? "flops" : "message_bytes";
	char range[96];
	range_text(f, range, sizeof(range));
	int n = cJSON_IsArray(a) ? cJSON_GetArraySize(a) : -1;
	if (n < 1 || n > HW_CURVE_MAX)
		return fail_at(o, f->key, -1, a, err, "an array of 1 to %d points [%s, fraction]",
			       HW_CURVE_MAX, xname);
	c->n = n;
	for (int i = 0; i < n; i++) {
		const cJSON *pt = cJSON_GetArrayItem(a, i);
		const cJSON *x = cJSON_GetArrayItem(pt, 0), *y = cJSON_GetArrayItem(pt, 1);
		if (!cJSON_IsArray(pt) || cJSON_GetArraySize(pt) != 2 || !cJSON_IsNumber(x) ||
		    !cJSON_IsNumber(y))
			return fail_at(o, f->key, i, pt, err, "a point [%s, fraction]", xname);
		c->x[i] = x->valuedouble;
		c->y[i] = y->valuedouble;
		if (!(c->x[i] > 0) || !isfinite(c->x[i]))
			return fail_at(o, f->key, i, pt, err, "%s above 0", xname);
		if (i > 0 && c->x[i] <= c->x[i - 1])
			return fail_at(o, f->key, i, pt, err, "%s above the previous point's %g",
				       xname, c->x[i - 1]);
		if (!in_range(c->y[i], f))
			return fail_at(o, f->key, i, pt, err, "a fraction %s", range);
	}
	return 0;
}

static int read_field(const JsonObj *o, const Field *f, HwProfile *hw, int have_base,
		      PxError *err)
{
	char *dst = (char *)hw + f->off;
	const cJSON *item = member(o, f->key);
	char range[96];

	if (!item) {
		if (!strcmp(f->section, "memory"))
			return 0; /* a calibration's, optional: the cluster's figures stand */
		if (!strcmp(f->key, "base_s") && member(o, "alpha_s")) {
			/* a link written before base_s: its alpha_s holds a call's whole latency */
			*(double *)(void *)dst = 0;
			return 0;
		}
		if (!have_base)
			return fail_at(o, f->key, -1, NULL, err, "a value: the key is missing (or "
				       "name a catalog GPU in \"gpu\" to start from its profile)");
		hw->from_base++;
		return 0;
	}
	range_text(f, range, sizeof(range));
	switch (f->kind) {
	case F_CURVE:
		return read_curve(o, f, item, (HwCurve *)(void *)dst, err);
	case F_INT: {
		long long v;
		if (jobj_int(o, f->key, (long long)f->lo, (long long)f->hi, 0, &v, err) < 0)
			return -1;
		*(long long *)(void *)dst = v;
		return 0;
	}
	case F_NUM:
		if (!cJSON_IsNumber(item) || !in_range(item->valuedouble, f))
			return fail_at(o, f->key, -1, item, err, "a number %s", range);
		*(double *)(void *)dst = item->valuedouble;
		return 0;
	}
	return 0;
}

static int unknown_gpu(const JsonObj *root, const char *name, PxError *err)
{
	char list[256] = "";
	for (int i = 0; i < N_DEFAULTS; i++) {
		if (i)
			strncat(list, ", ", sizeof(list) - strlen(list) - 1);
		strncat(list, DEFAULTS[i].gpu, sizeof(list) - strlen(list) - 1);
	}
	return fail_at(root, "gpu", -1, NULL, err, "one of %s, got \"%s\"", list, name);
}

/* A CPU profile: "cpu" and comments only (a machine's executor rates have nothing to take from,
 * or give to, a GPU's profile). */
static int parse_cpu(const JsonObj *root, HwProfile *hw, PxError *err)
{
	JsonObj cpu;
	const cJSON *m;
	cJSON_ArrayForEach(m, root->obj)
		if (m->string[0] != '_' && strcmp(m->string, "cpu"))
			return fail_at(root, m->string, -1, NULL, err, "no '%s' beside \"cpu\" (a CPU "
				       "profile describes a machine's CPU executor, not a GPU)",
				       m->string);
	if (jobj_child(root, "cpu", &cpu, err) <= 0)
		return err->code ? -1 : px_fail(err, PX_ERR_INPUT, "%s: cpu: expected an object",
						root->doc->path);
	snprintf(hw->gpu, sizeof(hw->gpu), "cpu");
	hw->cpu = malloc(sizeof(*hw->cpu));
	if (!hw->cpu)
		return px_fail(err, PX_ERR_RUNTIME, "out of memory");
	if (hwcpu_parse(&cpu, hw->cpu, err)) {
		hwprofile_free(hw);
		return -1;
	}
	return 0;
}

void hwprofile_free(HwProfile *hw)
{
	if (!hw)
		return;
	free(hw->cpu);
	hw->cpu = NULL;
}

int hwprofile_parse(const JsonDoc *d, HwProfile *hw, PxError *err)
{
	static const char *const top[] = {"gpu", "compute", "nvlink", "network", "host", "memory",
					  "cpu", NULL};
	JsonObj root, sec[5];
	const char *gpu = NULL;

	memset(hw, 0, sizeof(*hw));
	if (!cJSON_IsObject(d->root))
		return px_fail(err, PX_ERR_INPUT, "%s: expected a JSON object (a hardware profile)",
			       d->path);
	jobj_make(&root, d, d->root, "", "", NULL);
	if (check_keys(&root, top, err))
		return -1;
	if (cJSON_GetObjectItemCaseSensitive(d->root, "cpu"))
		return parse_cpu(&root, hw, err);
	if (jobj_str(&root, "gpu", NULL, &gpu, err) < 0)
		return -1;
	if (gpu) {
		const HwProfile *base = find_default(gpu);
		if (!base)
			return unknown_gpu(&root, gpu, err);
		*hw = *base;
	} else {
		snprintf(hw->gpu, sizeof(hw->gpu), "custom");
	}
	for (int s = 0; SECTIONS[s]; s++) {
		const char *known[N_FIELDS + 1];
		int n = 0;
		if (jobj_child(&root, SECTIONS[s], &sec[s], err) < 0)
			return -1;
		for (int i = 0; i < N_FIELDS; i++)
			if (!strcmp(FIELDS[i].section, SECTIONS[s]))
				known[n++] = FIELDS[i].key;
		known[n] = NULL;
		if (sec[s].obj && check_keys(&sec[s], known, err))
			return -1;
	}
	for (int i = 0; i < N_FIELDS; i++) {
		int s = 0;
		while (strcmp(SECTIONS[s], FIELDS[i].section))
			s++;
		if (read_field(&sec[s], &FIELDS[i], hw, gpu != NULL, err))
			return -1;
	}
	return 0;
}

int hwprofile_load(const char *path, HwProfile *hw, PxError *err)
{
	JsonDoc d = {0};
	memset(hw, 0, sizeof(*hw)); /* hwprofile_free may follow a failure */
	if (jdoc_load_file(&d, path, err))
		return -1;
	int rc = hwprofile_parse(&d, hw, err);
	jdoc_free(&d);
	return rc;
}

void hwprofile_apply_memory(const HwProfile *hw, ClusterSpec *c)
{
	const double MiB = 1024.0 * 1024.0;
	if (hw->context_MiB > 0)
		c->cuda_context_bytes = hw->context_MiB * MiB;
	if (hw->cublas_MiB > 0)
		c->cublas_workspace_bytes = hw->cublas_MiB * MiB;
	if (hw->nccl_MiB > 0)
		c->nccl_buffers_bytes = hw->nccl_MiB * MiB;
}

/* ---- comparing ---- */

int hwprofile_gpu_mismatch(const HwProfile *hw, const char *path, const GpuSpec *gpu, char *msg,
			   size_t n)
{
	const char *want = gpu && gpu->name ? gpu->name : "unknown";
	if (hw->cpu || !strcmp(hw->gpu, "custom") || !strcasecmp(hw->gpu, want))
		return 0;
	snprintf(msg, n, "%s: warning: --hw profile measured on %s, but the scenario's GPU is %s: the "
		 "step time mixes the %s's efficiencies with the %s's peaks (give a profile of the "
		 "%s, from `parallax calibrate` on one)", path, hw->gpu, want, hw->gpu, want, want);
	return 1;
}

static int curve_equal(const HwCurve *a, const HwCurve *b)
{
	if (a->n != b->n)
		return 0;
	for (int i = 0; i < a->n; i++)
		if (a->x[i] != b->x[i] || a->y[i] != b->y[i])
			return 0;
	return 1;
}

int hwprofile_equal(const HwProfile *a, const HwProfile *b, char *what, size_t n)
{
	if (strcmp(a->gpu, b->gpu)) {
		snprintf(what, n, "gpu");
		return 0;
	}
	if (!a->cpu != !b->cpu || (a->cpu && memcmp(a->cpu, b->cpu, sizeof(*a->cpu)))) {
		snprintf(what, n, "cpu");
		return 0;
	}
	for (int i = 0; i < N_FIELDS; i++) {
		const Field *f = &FIELDS[i];
		const char *pa = (const char *)a + f->off, *pb = (const char *)b + f->off;
		int same = f->kind == F_CURVE ? curve_equal((const HwCurve *)(const void *)pa,
							     (const HwCurve *)(const void *)pb) :
			   f->kind == F_INT ? *(const long long *)(const void *)pa ==
						      *(const long long *)(const void *)pb :
					      *(const double *)(const void *)pa ==
						      *(const double *)(const void *)pb;
		if (!same) {
			snprintf(what, n, "%s.%s", f->section, f->key);
			return 0;
		}
	}
	return 1;
}

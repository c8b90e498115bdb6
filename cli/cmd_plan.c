/* parallax plan: size a cluster before buying it. For each candidate GPU type and node count,
 * search the layouts (ZeRO stage, tp, pp, micro-batch, recompute) for the fastest that fits,
 * then price training a token budget on it, and say which choice wins under a deadline or a
 * budget. A plan over an inference scenario sizes serving instead: the cheapest cluster whose
 * best layout serves a tokens/s or requests/s target within latency bounds. */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "../sim/infer_sim.h"
#include "../sim/sweep.h"
#include "commands.h"
#include "paths.h"
#include "sweep_report.h"

static const char USAGE[] =
	"usage: parallax plan PLAN.json [--accept-tight] [--json]\n"
	"       parallax plan SERVING_PLAN.json [--min-tokens-per-s X] [--min-requests-per-s R]\n"
	"                     [--max-ttft-s S] [--max-tpot-ms M] [--max-latency-s S]\n"
	"                     [--accept-tight] [--json]\n"
	"\n"
	"Size a cluster: for every GPU type and node count of the plan, search the layouts for\n"
	"the fastest one that fits, price training the token budget on it, and name the winner:\n"
	"the cheapest choice within the deadline (and budget), or without a deadline the fastest\n"
	"within the budget. Nothing is written: neither the database nor beside the plan.\n"
	"A layout fits when its GPU peak is below the GPU's usable memory (what PyTorch sees)\n"
	"by more than the 10% margin; one within the margin is tight (the caching allocator's\n"
	"fragmentation decides whether it runs) and is not chosen unless --accept-tight says so.\n"
	"A layout that does not fit is never chosen.\n"
	"\n"
	"  --accept-tight  choose tight layouts too (default: only those that fit with margin)\n"
	"  --json          one JSON object: every cell (gpu, nodes, gpus, fits, verdict, days,\n"
	"                  cost_usd, tokens_per_s, mfu, headroom_bytes, config), the winner's\n"
	"                  index and accept_tight\n"
	"  -h, --help      this help\n"
	"\n"
	"PLAN.json keys (paths relative to the plan file):\n"
	"  scenario       the base scenario (required); its micro-batch and accumulation are\n"
	"                 kept, so the global batch grows with the data-parallel size\n"
	"  tokens         the token budget to train (required)\n"
	"  gpus           GPU types to try, names from `parallax gpus` (required)\n"
	"  nodes          node counts to try (required)\n"
	"  gpus_per_node  default 8\n"
	"  deadline_days  the winner must finish within it (0 or absent: no deadline)\n"
	"  budget_usd     the winner must cost at most this (0 or absent: no budget)\n"
	"  prices         {GPU: USD per GPU-hour}, or the path of a price list such as\n"
	"                 scenarios/prices.json (its per_gpu_hour_usd); without a price the\n"
	"                 cost is not known and such a cell cannot win on cost\n"
	"  search         {KEY: [VALUES]} the layouts to search, any --set key (default: ZeRO\n"
	"                 stage 0-3, tp and pp 1/2/4/8, micro-batch 1/2/4, activation\n"
	"                 checkpointing none/selective/full)\n"
	"  e.g. {\"scenario\": \"base.json\", \"tokens\": 3e11, \"deadline_days\": 30,\n"
	"        \"gpus\": [\"A100-80GB\", \"H100-SXM\"], \"nodes\": [4, 8, 16],\n"
	"        \"prices\": \"prices.json\"}\n"
	"Unknown keys are warned about. Time comes from the step-time model (docs/time_model.md).\n"
	"\n"
	"Serving (the scenario is an inference one, docs/inference.md): for every GPU type and\n"
	"node count, search the layouts for the one with the most generated tokens/s within the\n"
	"latency bounds, and name the winner: the cheapest cluster per hour whose best layout\n"
	"serves the target. Keys (or the flags, which override them):\n"
	"  min_tokens_per_s    generated tokens/s the whole cluster must serve\n"
	"  min_requests_per_s  requests/s (tokens/s over the workload's output tokens); with\n"
	"                      continuous batching, each cell is priced at this request rate\n"
	"  max_ttft_s, max_tpot_ms, max_latency_s   the latency bounds a layout must meet\n"
	"          (of equal tokens/s, as under continuous batching, the lower latency wins)\n"
	"  search  default: inference.tensor_parallel.tp_size 1/2/4/8 and, for a static batch,\n"
	"          workload.batch_size 1 to 256 in powers of two\n"
	"  gpus, nodes, gpus_per_node, prices as above; tokens, deadline_days and budget_usd are\n"
	"  training's and are refused, as are the serving flags on a training plan.\n"
	"Exit status: 0 ok (whether or not a choice wins), 1 runtime failure, 2 bad input.\n";

typedef struct Cell {
	char gpu[32];
	long long nodes, world;
	int found;
	PointResult best;
	double days, cost_usd, price;
} Cell;

static const char *const DEFAULT_SEARCH =
	"{\"deepspeed.zero_optimization.stage\": [0, 1, 2, 3], \"parallelism.tp\": [1, 2, 4, 8],"
	" \"parallelism.pp\": [1, 2, 4, 8], \"deepspeed.train_micro_batch_size_per_gpu\": [1, 2, 4],"
	" \"activation_checkpointing\": [\"none\", \"selective\", \"full\"]}";

/* The directory part of path ("." when it has none) in dir. */
static void dir_of(const char *path, char *dir, size_t n)
{
	snprintf(dir, n, "%s", path);
	char *slash = strrchr(dir, '/');
	if (slash)
		*slash = slash == dir ? (slash[1] = '\0', '/') : '\0';
	else
		snprintf(dir, n, ".");
}

/* Write a sweep file for one cell and load it: the plan's base and search at this GPU and size.
 * The file goes to the temporary directory, never beside the plan (which may be read-only, an
 * installed share/parallax/plans), so the base scenario is named by its absolute path. */
static int cell_sweep(const char *scenario_abs, const cJSON *plan, const char *gpu,
		      long long nodes, long long gpn, double request_rate, Sweep *sw, PxError *err)
{
	const char *tmp = getenv("TMPDIR");
	char path[4096];
	snprintf(path, sizeof(path), "%s/parallax-plan-cell-XXXXXX", tmp && *tmp ? tmp : "/tmp");
	int fd = mkstemp(path);
	if (fd < 0)
		return px_fail(err, PX_ERR_RUNTIME, "%s: cannot create: %s", path, strerror(errno));
	cJSON *s = cJSON_CreateObject();
	cJSON_AddStringToObject(s, "name", "plan-cell");
	cJSON_AddStringToObject(s, "scenario", scenario_abs);
	const cJSON *search = cJSON_GetObjectItemCaseSensitive(plan, "search");
	cJSON_AddItemToObject(s, "axes", search ? cJSON_Duplicate(search, 1) : cJSON_Parse(DEFAULT_SEARCH));
	cJSON *set = cJSON_AddObjectToObject(s, "set");
	cJSON_AddStringToObject(set, "cluster.gpu", gpu);
	cJSON_AddNumberToObject(set, "cluster.nodes", (double)nodes);
	cJSON_AddNumberToObject(set, "cluster.gpus_per_node", (double)gpn);
	if (request_rate > 0) /* a serving plan's continuous batching at its target rate */
		cJSON_AddNumberToObject(set, "workload.request_rate", request_rate);
	/* the base gives micro-batch and accumulation: the global batch follows the size */
	char *text = cJSON_Print(s);
	cJSON_Delete(s);
	FILE *f = fdopen(fd, "w");
	int bad = !f || !text || fputs(text, f) < 0;
	if (f ? fclose(f) != 0 : close(fd) != 0)
		bad = 1;
	cJSON_free(text);
	if (bad) {
		remove(path);
		return px_fail(err, PX_ERR_RUNTIME, "%s: cannot write: %s", path, strerror(errno));
	}
	int rc = sweep_load(sw, path, err);
	remove(path);
	return rc;
}

/* The plan's lists: gpus names known to the catalog, nodes positive integers. */
static int check_lists(const JsonObj *o, const cJSON *gpus, const cJSON *nodes, PxError *err)
{
	char where[512];
	for (const cJSON *g = gpus->child; g; g = g->next) {
		if (!cJSON_IsString(g) || !cluster_find_gpu(g->valuestring)) {
			jobj_where(o, "gpus", where, sizeof(where));
			char *v = cJSON_PrintUnformatted(g);
			px_fail(err, PX_ERR_INPUT, "%s: gpus: expected GPU names from `parallax gpus`, "
				"got %s", where, v ? v : "?");
			cJSON_free(v);
			return -1;
		}
	}
	for (const cJSON *nd = nodes->child; nd; nd = nd->next)
		if (!cJSON_IsNumber(nd) || nd->valuedouble < 1 || nd->valuedouble > 1e6 ||
		    nd->valuedouble != floor(nd->valuedouble)) {
			jobj_where(o, "nodes", where, sizeof(where));
			return px_fail(err, PX_ERR_INPUT, "%s: nodes: expected node counts (integers from "
				       "1 to 1000000)", where);
		}
	if (!gpus->child || !nodes->child) {
		jobj_where(o, !gpus->child ? "gpus" : "nodes", where, sizeof(where));
		return px_fail(err, PX_ERR_INPUT, "%s: %s: expected at least one entry", where,
			       !gpus->child ? "gpus" : "nodes");
	}
	return 0;
}

/* A layout as a short line, "zero 3 tp 1 pp 1 micro 4 ckpt selective": each searched key by its
 * usual short name (else its last component) and its value, from a point's config JSON. */
static void layout_line(const char *config, char *buf, size_t n)
{
	cJSON *c = cJSON_Parse(config);
	size_t len = 0;
	buf[0] = '\0';
	for (const cJSON *k = c ? c->child : NULL; k && len < n; k = k->next) {
		const char *name = sweep_key_short(k->string);
		if (!name)
			name = strrchr(k->string, '.') ? strrchr(k->string, '.') + 1 : k->string;
		char *v = cJSON_IsString(k) ? NULL : cJSON_PrintUnformatted(k);
		len += (size_t)snprintf(buf + len, n - len, "%s%s %s", len ? " " : "", name,
					v ? v : k->valuestring);
		cJSON_free(v);
	}
	cJSON_Delete(c);
}

static double price_of(const cJSON *prices, const char *gpu)
{
	for (const cJSON *p = prices ? prices->child : NULL; p; p = p->next)
		if (!strcasecmp(p->string, gpu) && cJSON_IsNumber(p))
			return p->valuedouble;
	return NAN;
}

/* ---- serving plans ---- */

/* The serving targets and bounds: plan keys, and the flags of the same names that override them
 * (0: none). */
enum { SV_MIN_TPS, SV_MIN_RPS, SV_MAX_TTFT, SV_MAX_TPOT, SV_MAX_LAT, N_SV };
static const struct {
	const char *key, *flag;
} SERVE_KEYS[N_SV] = {
	{"min_tokens_per_s", "min-tokens-per-s"}, {"min_requests_per_s", "min-requests-per-s"},
	{"max_ttft_s", "max-ttft-s"}, {"max_tpot_ms", "max-tpot-ms"},
	{"max_latency_s", "max-latency-s"},
};

typedef struct ServeOpts {
	double v[N_SV];
	int given[N_SV];          /* on the command line */
	int json, accept_tight;
} ServeOpts;

static const char *const DEFAULT_SERVE_SEARCH =
	"{\"inference.tensor_parallel.tp_size\": [1, 2, 4, 8],"
	" \"workload.batch_size\": [1, 2, 4, 8, 16, 32, 64, 128, 256]}";

typedef struct ServeCell {
	char gpu[32];
	long long nodes, world;
	int found, serves;
	PointResult best;         /* the most tokens/s within the bounds */
	double price, usd_per_h;
} ServeCell;

/* Whether the plan's scenario is an inference one: 1, 0 (also when it cannot be found: the
 * training path says why), -1 with err. */
static int plan_is_serving(const JsonObj *o, const char *path, char *abs, size_t n, PxError *err)
{
	const char *scenario;
	char dir[2048], rel[4096];
	if (jobj_str(o, "scenario", NULL, &scenario, err) < 0)
		return -1;
	if (!scenario || n < PATH_MAX)
		return 0;
	dir_of(path, dir, sizeof(dir));
	snprintf(rel, sizeof(rel), "%s/%s", scenario[0] == '/' ? "" : dir, scenario);
	if (!realpath(rel, abs))
		return 0;
	return infer_scenario_is(abs, err);
}

/* A point meets the bounds (unset bounds are met). */
static int within_bounds(const ServeOpts *so, const PointResult *r)
{
	return (!so->v[SV_MAX_TTFT] || r->ttft_s <= so->v[SV_MAX_TTFT]) &&
	       (!so->v[SV_MAX_TPOT] || r->tpot_s * 1e3 <= so->v[SV_MAX_TPOT]) &&
	       (!so->v[SV_MAX_LAT] || r->latency_s <= so->v[SV_MAX_LAT]);
}

/* More tokens/s; at equal tokens/s (continuous batching serves its request rate whatever the
 * layout) the lower latency. */
static int serve_layout_better(const PointResult *a, const PointResult *b)
{
	if (fabs(a->tokens_per_s - b->tokens_per_s) > 1e-9 * b->tokens_per_s)
		return a->tokens_per_s > b->tokens_per_s;
	return a->latency_s < b->latency_s;
}

static int serves_target(const ServeOpts *so, const PointResult *r)
{
	return r->tokens_per_s >= so->v[SV_MIN_TPS] &&
	       r->tokens_per_s / (double)r->output_tokens >= so->v[SV_MIN_RPS] * (1 - 1e-12);
}

/* Cheaper per hour wins; a cell without a price after every priced one, by fewer GPUs; ties by
 * more tokens/s. */
static int serve_better(const ServeCell *a, const ServeCell *b)
{
	if (isnan(a->usd_per_h) != isnan(b->usd_per_h))
		return !isnan(a->usd_per_h);
	if (!isnan(a->usd_per_h) && a->usd_per_h != b->usd_per_h)
		return a->usd_per_h < b->usd_per_h;
	if (isnan(a->usd_per_h) && a->world != b->world)
		return a->world < b->world;
	return a->best.tokens_per_s > b->best.tokens_per_s;
}

static void serve_print(const char *path, const ServeOpts *so, const ServeCell *cells, int n,
			int win, int runner, long long gpn)
{
	printf("# serving plan %s:", path);
	for (int k = 0; k < N_SV; k++)
		if (so->v[k])
			printf(" %s %.4g", SERVE_KEYS[k].key, so->v[k]);
	printf("\n# each cell's layout: the most generated tokens/s within the latency bounds, "
	       "fitting with the %.0f%% margin%s\n", 100 * PREDICT_TIGHT_MARGIN,
	       so->accept_tight ? " or tight (--accept-tight)" : "");
	printf("%-10s %5s %5s %9s %11s %10s %9s %9s %9s %5s %6s  %s\n", "gpu", "nodes", "gpus",
	       "USD/h", "tokens/s", "tok/s/GPU", "ttft_s", "tpot_ms", "latency_s", "fits",
	       "serves", "best layout");
	for (int i = 0; i < n; i++) {
		const ServeCell *cl = &cells[i];
		if (!cl->found) {
			printf("%-10s %5lld %5lld %9.4g %11s %10s %9s %9s %9s %5s %6s  %s\n", cl->gpu,
			       cl->nodes, cl->world, cl->usd_per_h, "-", "-", "-", "-", "-", "-", "no",
			       "no layout fits within the bounds");
			continue;
		}
		char layout[512];
		layout_line(cl->best.config, layout, sizeof(layout));
		printf("%-10s %5lld %5lld %9.4g %11.1f %10.1f %9.4g %9.4g %9.4g %5s %6s  %s%s\n",
		       cl->gpu, cl->nodes, cl->world, cl->usd_per_h, cl->best.tokens_per_s,
		       cl->best.tokens_per_s_gpu, cl->best.ttft_s, cl->best.tpot_s * 1e3,
		       cl->best.latency_s, cl->best.verdict == VERDICT_TIGHT ? "tight" : "yes",
		       cl->serves ? "yes" : "no", layout, i == win ? "   <- winner" : "");
	}
	if (win < 0) {
		printf("# no cell serves the target within the bounds\n");
	} else {
		const ServeCell *w = &cells[win];
		char layout[512];
		layout_line(w->best.config, layout, sizeof(layout));
		printf("# winner: %lld x %lld %s at %.4g USD/h, %.4g USD per million tokens: the "
		       "cheapest per hour of the cells whose best layout serves the target", w->nodes,
		       gpn, w->gpu, w->usd_per_h, w->best.cost_per_mtoken);
		if (runner >= 0)
			printf(" (next: %lld x %lld %s at %.4g USD/h)", cells[runner].nodes, gpn,
			       cells[runner].gpu, cells[runner].usd_per_h);
		printf("\n# its layout %s: %.1f tokens/s (%.1f a GPU), TTFT %.4g s, TPOT %.4g ms, "
		       "a decode step bound by %s\n", layout, w->best.tokens_per_s,
		       w->best.tokens_per_s_gpu, w->best.ttft_s, w->best.tpot_s * 1e3,
		       infer_bound_name((InferBound)w->best.decode_bound));
	}
	printf("# prices: USD per GPU-hour; time: the inference model (docs/inference.md)\n");
}

/* A plan's JSON (training's or serving's cells in out) with the winner's index and the tight
 * choice, printed and deleted. */
static void plan_json_print(cJSON *out, int win, int accept_tight)
{
	cJSON_AddNumberToObject(out, "winner", win);
	cJSON_AddBoolToObject(out, "accept_tight", accept_tight);
	char *t = cJSON_Print(out);
	puts(t);
	cJSON_free(t);
	cJSON_Delete(out);
}

static void serve_json(const ServeCell *cells, int n, int win, int accept_tight)
{
	cJSON *out = cJSON_CreateObject(), *rows = cJSON_AddArrayToObject(out, "cells");
	cJSON_AddStringToObject(out, "kind", "inference");
	for (int i = 0; i < n; i++) {
		const ServeCell *cl = &cells[i];
		cJSON *r = cJSON_CreateObject();
		cJSON_AddStringToObject(r, "gpu", cl->gpu);
		cJSON_AddNumberToObject(r, "nodes", (double)cl->nodes);
		cJSON_AddNumberToObject(r, "gpus", (double)cl->world);
		if (isnan(cl->usd_per_h))
			cJSON_AddNullToObject(r, "usd_per_hour");
		else
			cJSON_AddNumberToObject(r, "usd_per_hour", cl->usd_per_h);
		cJSON_AddBoolToObject(r, "fits", cl->found);
		cJSON_AddBoolToObject(r, "serves", cl->serves);
		if (cl->found) {
			cJSON_AddStringToObject(r, "verdict", predict_verdict_name(cl->best.verdict));
			cJSON_AddNumberToObject(r, "tokens_per_s", cl->best.tokens_per_s);
			cJSON_AddNumberToObject(r, "tokens_per_s_per_gpu", cl->best.tokens_per_s_gpu);
			cJSON_AddNumberToObject(r, "ttft_s", cl->best.ttft_s);
			cJSON_AddNumberToObject(r, "tpot_s", cl->best.tpot_s);
			cJSON_AddNumberToObject(r, "latency_s", cl->best.latency_s);
			cJSON_AddStringToObject(r, "decode_bound",
						infer_bound_name((InferBound)cl->best.decode_bound));
			cJSON_AddItemToObject(r, "config", cJSON_Parse(cl->best.config));
		}
		cJSON_AddItemToArray(rows, r);
	}
	plan_json_print(out, win, accept_tight);
}

/* A serving plan: its keys read and checked, every cell searched, the winner printed. */
static int plan_serving(const char *path, const JsonDoc *d, const JsonObj *o, const char *abs,
			ServeOpts *so, PxError *err)
{
	static const char *const known[] = {"description", "scenario", "gpus", "nodes",
					    "gpus_per_node", "prices", "search", "min_tokens_per_s",
					    "min_requests_per_s", "max_ttft_s", "max_tpot_ms",
					    "max_latency_s", "tokens", "deadline_days", "budget_usd",
					    NULL};
	static const char *const training_only[] = {"tokens", "deadline_days", "budget_usd", NULL};
	char where[512], dir[2048];
	JsonDoc pd = {0};
	PxNotes notes;
	long long gpn;
	ServeCell *cells = NULL;
	int n = 0, rc = -1, continuous = 0;
	px_notes_init(&notes);
	jobj_check_keys(o, known, &notes);
	for (int i = 0; i < notes.n_warnings; i++)
		fprintf(stderr, "parallax plan: %s\n", notes.warnings[i]);
	for (int i = 0; training_only[i]; i++)
		if (cJSON_HasObjectItem(d->root, training_only[i])) {
			jobj_where(o, training_only[i], where, sizeof(where));
			px_fail(err, PX_ERR_INPUT, "%s: %s: a training plan's key, but the scenario %s "
				"is an inference one; a serving plan takes min_tokens_per_s, "
				"min_requests_per_s, max_ttft_s, max_tpot_ms, max_latency_s", where,
				training_only[i], abs);
			goto out;
		}
	for (int k = 0; k < N_SV; k++) {
		double v;
		if (jobj_num(o, SERVE_KEYS[k].key, 0, 1e15, 0, &v, err) < 0)
			goto out;
		if (!so->given[k])
			so->v[k] = v;
	}
	if (jobj_int(o, "gpus_per_node", 1, 64, 8, &gpn, err) < 0)
		goto out;
	const cJSON *gpus = cJSON_GetObjectItemCaseSensitive(d->root, "gpus");
	const cJSON *nodes = cJSON_GetObjectItemCaseSensitive(d->root, "nodes");
	if (!cJSON_IsArray(gpus) || !cJSON_IsArray(nodes)) {
		px_fail(err, PX_ERR_INPUT, "%s: expected scenario (a path), gpus [...] and nodes [...]",
			path);
		goto out;
	}
	if (check_lists(o, gpus, nodes, err))
		goto out;
	{
		InferScenario isc;
		if (infer_scenario_load(&isc, abs, NULL, err))
			goto out;
		continuous = isc.wl.continuous;
		infer_scenario_free(&isc);
	}
	dir_of(path, dir, sizeof(dir));
	const cJSON *prices = cJSON_GetObjectItemCaseSensitive(d->root, "prices");
	if (cJSON_IsString(prices)) {
		char file[4096];
		snprintf(file, sizeof(file), "%s/%s", prices->valuestring[0] == '/' ? "" : dir,
			 prices->valuestring);
		if (jdoc_load_file(&pd, file, err))
			goto out;
		prices = cJSON_GetObjectItemCaseSensitive(pd.root, "per_gpu_hour_usd");
	}
	/* the search: the plan's, else tp (and a static batch's size); continuous batching at the
	 * target request rate */
	cJSON *plan = cJSON_Duplicate(d->root, 1);
	if (!cJSON_HasObjectItem(plan, "search"))
		cJSON_AddItemToObject(plan, "search", cJSON_Parse(continuous ?
			"{\"inference.tensor_parallel.tp_size\": [1, 2, 4, 8]}" : DEFAULT_SERVE_SEARCH));
	cells = calloc((size_t)(cJSON_GetArraySize(gpus) * cJSON_GetArraySize(nodes)) + 1,
		       sizeof(*cells));
	for (const cJSON *g = gpus->child; cells && g; g = g->next)
		for (const cJSON *nd = nodes->child; nd; nd = nd->next) {
			ServeCell *cl = &cells[n++];
			Sweep sw;
			snprintf(cl->gpu, sizeof(cl->gpu), "%s", g->valuestring);
			cl->nodes = (long long)nd->valuedouble;
			cl->world = cl->nodes * gpn;
			cl->price = price_of(prices, cl->gpu);
			cl->usd_per_h = cl->price * (double)cl->world;
			if (cell_sweep(abs, plan, cl->gpu, cl->nodes, gpn,
				       continuous ? so->v[SV_MIN_RPS] : 0, &sw, err)) {
				cJSON_Delete(plan);
				goto out;
			}
			for (long long i = 0; i < sw.n_points; i++) {
				PointResult r;
				if (sweep_eval(&sw, i, &r, err)) {
					sweep_free(&sw);
					cJSON_Delete(plan);
					goto out;
				}
				if (r.status == PT_OK && (so->accept_tight || r.verdict == VERDICT_FITS) &&
				    within_bounds(so, &r) && (!cl->found || serve_layout_better(&r,
											&cl->best)))
					cl->best = r, cl->found = 1;
			}
			sweep_free(&sw);
			cl->serves = cl->found && serves_target(so, &cl->best);
			if (cl->found) /* the cell sweep had no prices: the plan's */
				cl->best.cost_per_mtoken = cl->usd_per_h / 3600 /
							   cl->best.tokens_per_s * 1e6;
		}
	cJSON_Delete(plan);
	if (!cells) {
		px_fail(err, PX_ERR_RUNTIME, "out of memory");
		goto out;
	}
	int win = -1, runner = -1;
	for (int i = 0; i < n; i++) {
		if (!cells[i].serves)
			continue;
		if (win < 0 || serve_better(&cells[i], &cells[win]))
			runner = win, win = i;
		else if (runner < 0 || serve_better(&cells[i], &cells[runner]))
			runner = i;
	}
	if (so->json)
		serve_json(cells, n, win, so->accept_tight);
	else
		serve_print(path, so, cells, n, win, runner, gpn);
	rc = 0;
out:
	free(cells);
	jdoc_free(&pd);
	px_notes_free(&notes);
	return rc;
}

int cmd_plan(int argc, char **argv)
{
	static const struct option longs[] = {{"json", no_argument, 0, 'j'},
					       {"accept-tight", no_argument, 0, 't'},
					       {"min-tokens-per-s", required_argument, 0, 0},
					       {"min-requests-per-s", required_argument, 0, 1},
					       {"max-ttft-s", required_argument, 0, 2},
					       {"max-tpot-ms", required_argument, 0, 3},
					       {"max-latency-s", required_argument, 0, 4},
					       {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
	int json = 0, accept_tight = 0, c, rc = 2, any_serve = -1;
	ServeOpts so = {0};
	optind = 1;
	while ((c = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
		if (c >= 0 && c < N_SV) {
			char *end;
			so.v[c] = strtod(optarg, &end);
			if (end == optarg || *end || !(so.v[c] > 0) || !isfinite(so.v[c]))
				return fprintf(stderr, "parallax plan: --%s %s: expected a positive "
					       "number\n%s", SERVE_KEYS[c].flag, optarg, USAGE), 2;
			so.given[c] = 1;
			any_serve = c;
		} else if (c == 'j')
			json = 1;
		else if (c == 't')
			accept_tight = 1;
		else if (c == 'h')
			return fputs(USAGE, stdout), 0;
		else
			return fputs(USAGE, stderr), 2;
	}
	so.json = json;
	so.accept_tight = accept_tight;
	if (optind != argc - 1)
		return fprintf(stderr, "parallax plan: expected one plan file\n%s", USAGE), 2;
	char found[PATH_MAX];
	const char *path = paths_find_input(argv[optind], found, sizeof(found));
	JsonDoc d = {0}, pd = {0};
	JsonObj o;
	PxError err = {0};
	double tokens, deadline, budget;
	long long gpn;
	Cell *cells = NULL;
	int n = 0;
	PxNotes notes;
	px_notes_init(&notes);
	static const char *const known[] = {"description", "scenario", "tokens", "deadline_days",
					    "budget_usd", "gpus", "nodes", "gpus_per_node",
					    "prices", "search", NULL};
	const char *scenario;
	char dir[2048], scenario_abs[PATH_MAX];
	if (jdoc_load_file(&d, path, &err))
		goto fail;
	if (!cJSON_IsObject(d.root)) {
		px_fail(&err, PX_ERR_INPUT, "%s: expected a JSON object with scenario, tokens, gpus "
			"and nodes", path);
		goto fail;
	}
	jobj_make(&o, &d, d.root, "", "", NULL);
	int serving = plan_is_serving(&o, path, scenario_abs, sizeof(scenario_abs), &err);
	if (serving < 0 || (serving && plan_serving(path, &d, &o, scenario_abs, &so, &err)))
		goto fail;
	if (serving) {
		rc = 0;
		goto out;
	}
	if (any_serve >= 0) {
		px_fail(&err, PX_ERR_INPUT, "%s: --%s: a serving plan's flag, but its scenario is a "
			"training one (no \"inference\" key)", path, SERVE_KEYS[any_serve].flag);
		goto fail;
	}
	jobj_check_keys(&o, known, &notes);
	for (int i = 0; i < notes.n_warnings; i++)
		fprintf(stderr, "parallax plan: %s\n", notes.warnings[i]);
	if (jobj_num(&o, "tokens", 1, 1e16, 0, &tokens, &err) < 0 ||
	    jobj_num(&o, "deadline_days", 0, 1e6, 0, &deadline, &err) < 0 ||
	    jobj_num(&o, "budget_usd", 0, 1e15, 0, &budget, &err) < 0 ||
	    jobj_int(&o, "gpus_per_node", 1, 64, 8, &gpn, &err) < 0 ||
	    jobj_str(&o, "scenario", NULL, &scenario, &err) < 0)
		goto fail;
	const cJSON *gpus = cJSON_GetObjectItemCaseSensitive(d.root, "gpus");
	const cJSON *nodes = cJSON_GetObjectItemCaseSensitive(d.root, "nodes");
	if (!tokens || !cJSON_IsArray(gpus) || !cJSON_IsArray(nodes) || !scenario) {
		px_fail(&err, PX_ERR_INPUT, "%s: expected scenario (a path), tokens, gpus [...] and "
			"nodes [...]", path);
		goto fail;
	}
	if (check_lists(&o, gpus, nodes, &err))
		goto fail;
	dir_of(path, dir, sizeof(dir));
	char rel[4096];
	snprintf(rel, sizeof(rel), "%s/%s", scenario[0] == '/' ? "" : dir, scenario);
	if (!realpath(rel, scenario_abs)) {
		char where[512];
		jobj_where(&o, "scenario", where, sizeof(where));
		px_fail(&err, PX_ERR_INPUT, "%s: scenario: cannot open %s: %s", where, rel,
			strerror(errno));
		goto fail;
	}
	const cJSON *prices = cJSON_GetObjectItemCaseSensitive(d.root, "prices");
	if (cJSON_IsString(prices)) { /* a price list file beside the plan */
		char file[4096];
		snprintf(file, sizeof(file), "%s/%s", prices->valuestring[0] == '/' ? "" : dir,
			 prices->valuestring);
		if (jdoc_load_file(&pd, file, &err))
			goto fail;
		prices = cJSON_GetObjectItemCaseSensitive(pd.root, "per_gpu_hour_usd");
	}
	cells = calloc((size_t)(cJSON_GetArraySize(gpus) * cJSON_GetArraySize(nodes)) + 1,
		       sizeof(*cells));
	for (const cJSON *g = gpus->child; g; g = g->next)
		for (const cJSON *nd = nodes->child; nd; nd = nd->next) {
			Cell *cl = &cells[n++];
			Sweep sw;
			snprintf(cl->gpu, sizeof(cl->gpu), "%s", g->valuestring);
			cl->nodes = (long long)nd->valuedouble;
			cl->world = cl->nodes * gpn;
			cl->price = price_of(prices, cl->gpu);
			if (cell_sweep(scenario_abs, d.root, cl->gpu, cl->nodes, gpn, 0, &sw, &err))
				goto fail;
			for (long long i = 0; i < sw.n_points; i++) {
				PointResult r;
				if (sweep_eval(&sw, i, &r, &err)) {
					sweep_free(&sw);
					goto fail;
				}
				if (r.status == PT_OK && (accept_tight || r.verdict == VERDICT_FITS) &&
				    (!cl->found || r.tokens_per_s > cl->best.tokens_per_s))
					cl->best = r, cl->found = 1;
			}
			sweep_free(&sw);
			if (cl->found) {
				double s = tokens / cl->best.tokens_per_s;
				cl->days = s / 86400;
				cl->cost_usd = cl->price * (double)cl->world * s / 3600;
			}
		}
	/* the winner: cheapest within the deadline (and budget), else fastest within the budget */
	int win = -1;
	for (int i = 0; i < n; i++) {
		const Cell *cl = &cells[i];
		if (!cl->found || (deadline > 0 && cl->days > deadline) ||
		    (budget > 0 && !(cl->cost_usd <= budget)))
			continue;
		if (win < 0 || (deadline > 0 || isnan(cells[win].cost_usd) ?
				cl->cost_usd < cells[win].cost_usd : cl->days < cells[win].days))
			win = i;
	}
	if (json) {
		cJSON *out = cJSON_CreateObject(), *rows = cJSON_AddArrayToObject(out, "cells");
		for (int i = 0; i < n; i++) {
			cJSON *r = cJSON_CreateObject();
			cJSON_AddStringToObject(r, "gpu", cells[i].gpu);
			cJSON_AddNumberToObject(r, "nodes", (double)cells[i].nodes);
			cJSON_AddNumberToObject(r, "gpus", (double)cells[i].world);
			cJSON_AddBoolToObject(r, "fits", cells[i].found);
			if (cells[i].found) {
				cJSON_AddStringToObject(r, "verdict",
							predict_verdict_name(cells[i].best.verdict));
				cJSON_AddNumberToObject(r, "days", cells[i].days);
				cJSON_AddNumberToObject(r, "cost_usd", cells[i].cost_usd);
				cJSON_AddNumberToObject(r, "tokens_per_s", cells[i].best.tokens_per_s);
				cJSON_AddNumberToObject(r, "mfu", cells[i].best.mfu);
				cJSON_AddNumberToObject(r, "headroom_bytes", cells[i].best.capacity_bytes -
							cells[i].best.peak_bytes);
				cJSON_AddItemToObject(r, "config", cJSON_Parse(cells[i].best.config));
			}
			cJSON_AddItemToArray(rows, r);
		}
		plan_json_print(out, win, accept_tight);
	} else {
		printf("# plan %s: %.3g tokens", path, tokens);
		if (deadline > 0)
			printf(", deadline %.0f days", deadline);
		if (budget > 0)
			printf(", budget %.3g USD", budget);
		printf("\n# layouts: those that fit with the %.0f%% margin of usable GPU memory%s\n",
		       100 * PREDICT_TIGHT_MARGIN, accept_tight ? ", and tight ones (--accept-tight)" :
		       "; tight ones left out (--accept-tight takes them)");
		printf("%-10s %6s %6s %9s %12s %12s %7s %9s %5s  %s\n", "gpu", "nodes", "gpus", "days",
		       "cost_USD", "tokens/s", "mfu", "free_GiB", "fits", "best layout");
		for (int i = 0; i < n; i++) {
			const Cell *cl = &cells[i];
			if (!cl->found) {
				printf("%-10s %6lld %6lld %9s %12s %12s %7s %9s %5s  %s\n", cl->gpu,
				       cl->nodes, cl->world, "-", "-", "-", "-", "-", "-",
				       accept_tight ? "nothing fits" : "nothing fits with margin");
				continue;
			}
			char layout[512];
			layout_line(cl->best.config, layout, sizeof(layout));
			printf("%-10s %6lld %6lld %9.2f %12.4g %12.0f %7.3f %9.2f %5s  %s%s\n", cl->gpu,
			       cl->nodes, cl->world, cl->days, cl->cost_usd, cl->best.tokens_per_s,
			       cl->best.mfu, (cl->best.capacity_bytes - cl->best.peak_bytes) / 1073741824.0,
			       cl->best.verdict == VERDICT_TIGHT ? "tight" : "yes", layout,
			       i == win ? "   <- winner" : "");
		}
		if (win >= 0)
			printf("# winner: %lld x %lld %s, %.2f days, %.4g USD (%s)\n", cells[win].nodes,
			       gpn, cells[win].gpu, cells[win].days, cells[win].cost_usd,
			       deadline > 0 ? "the cheapest within the deadline" :
					      "the fastest within the budget");
		else
			printf("# no choice meets the deadline and budget\n");
		printf("# prices: USD per GPU-hour; time: the step-time model (docs/time_model.md)\n");
	}
	rc = 0;
	goto out;
fail:
	fprintf(stderr, "parallax plan: %s\n", err.msg);
	rc = err.code ? err.code : 1;
out:
	free(cells);
	px_notes_free(&notes);
	jdoc_free(&pd);
	jdoc_free(&d);
	return rc;
}

/* parallax plan: size a cluster before buying it. For each candidate GPU type and node count,
 * search the layouts (ZeRO stage, tp, pp, micro-batch, recompute) for the fastest that fits,
 * then price training a token budget on it, and say which choice wins under a deadline or a
 * budget. */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "../sim/sweep.h"
#include "commands.h"

static const char USAGE[] =
	"usage: parallax plan PLAN.json [--json]\n"
	"\n"
	"Size a cluster: for every GPU type and node count of the plan, the fastest layout that\n"
	"fits, its time and cost to train the token budget, and the winner: the cheapest that\n"
	"meets the deadline, or the fastest within the budget.\n"
	"  {\"scenario\": \"base.json\", \"tokens\": 3e11, \"deadline_days\": 30,\n"
	"   \"budget_usd\": 5e6, \"gpus\": [\"A100-80GB\", \"H100-SXM\"], \"nodes\": [4, 8, 16],\n"
	"   \"gpus_per_node\": 8, \"prices\": \"prices.json\",\n"
	"   \"search\": {KEY: [VALUES]}}   (default search: ZeRO stage, tp, pp, micro-batch,\n"
	"                                   activation checkpointing)\n";

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

/* Write a sweep file for one cell and load it: the plan's base and search at this GPU and size. */
static int cell_sweep(const char *plan_path, const cJSON *plan, const char *gpu, long long nodes,
		      long long gpn, Sweep *sw, PxError *err)
{
	char path[4096], dir[2048];
	snprintf(dir, sizeof(dir), "%s", plan_path);
	char *slash = strrchr(dir, '/');
	if (slash)
		*slash = '\0';
	else
		snprintf(dir, sizeof(dir), ".");
	snprintf(path, sizeof(path), "%s/.plan-cell-%d.json", dir, (int)getpid());
	cJSON *s = cJSON_CreateObject();
	cJSON_AddStringToObject(s, "name", "plan-cell");
	cJSON_AddItemToObject(s, "scenario",
			      cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(plan, "scenario"), 1));
	const cJSON *search = cJSON_GetObjectItemCaseSensitive(plan, "search");
	cJSON_AddItemToObject(s, "axes", search ? cJSON_Duplicate(search, 1) : cJSON_Parse(DEFAULT_SEARCH));
	cJSON *set = cJSON_AddObjectToObject(s, "set");
	cJSON_AddStringToObject(set, "cluster.gpu", gpu);
	cJSON_AddNumberToObject(set, "cluster.nodes", (double)nodes);
	cJSON_AddNumberToObject(set, "cluster.gpus_per_node", (double)gpn);
	/* the base gives micro-batch and accumulation: the global batch follows the size */
	char *text = cJSON_Print(s);
	cJSON_Delete(s);
	FILE *f = fopen(path, "w");
	if (!f || !text || fputs(text, f) < 0) {
		if (f)
			fclose(f);
		cJSON_free(text);
		return px_fail(err, PX_ERR_RUNTIME, "%s: cannot write: %m", path);
	}
	fclose(f);
	cJSON_free(text);
	int rc = sweep_load(sw, path, err);
	remove(path);
	return rc;
}

static double price_of(const cJSON *prices, const char *gpu)
{
	for (const cJSON *p = prices ? prices->child : NULL; p; p = p->next)
		if (!strcasecmp(p->string, gpu) && cJSON_IsNumber(p))
			return p->valuedouble;
	return NAN;
}

int cmd_plan(int argc, char **argv)
{
	static const struct option longs[] = {{"json", no_argument, 0, 'j'},
					       {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
	int json = 0, c, rc = 2;
	optind = 1;
	while ((c = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
		if (c == 'j')
			json = 1;
		else if (c == 'h')
			return fputs(USAGE, stdout), 0;
		else
			return fputs(USAGE, stderr), 2;
	}
	if (optind != argc - 1)
		return fprintf(stderr, "parallax plan: expected one plan file\n%s", USAGE), 2;
	const char *path = argv[optind];
	JsonDoc d = {0}, pd = {0};
	JsonObj o;
	PxError err = {0};
	double tokens, deadline, budget;
	long long gpn;
	Cell *cells = NULL;
	int n = 0;
	if (jdoc_load_file(&d, path, &err))
		goto fail;
	jobj_make(&o, &d, d.root, "", "", NULL);
	if (jobj_num(&o, "tokens", 1, 1e16, 0, &tokens, &err) < 0 ||
	    jobj_num(&o, "deadline_days", 0, 1e6, 0, &deadline, &err) < 0 ||
	    jobj_num(&o, "budget_usd", 0, 1e15, 0, &budget, &err) < 0 ||
	    jobj_int(&o, "gpus_per_node", 1, 64, 8, &gpn, &err) < 0)
		goto fail;
	const cJSON *gpus = cJSON_GetObjectItemCaseSensitive(d.root, "gpus");
	const cJSON *nodes = cJSON_GetObjectItemCaseSensitive(d.root, "nodes");
	if (!tokens || !cJSON_IsArray(gpus) || !cJSON_IsArray(nodes) ||
	    !cJSON_GetObjectItemCaseSensitive(d.root, "scenario")) {
		px_fail(&err, PX_ERR_INPUT, "%s: expected scenario, tokens, gpus [...] and nodes [...]",
			path);
		goto fail;
	}
	const cJSON *prices = cJSON_GetObjectItemCaseSensitive(d.root, "prices");
	if (cJSON_IsString(prices)) { /* a price list file beside the plan */
		char file[4096], dir[2048];
		snprintf(dir, sizeof(dir), "%s", path);
		char *slash = strrchr(dir, '/');
		snprintf(file, sizeof(file), "%s/%s", slash ? (*slash = '\0', dir) : ".",
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
			snprintf(cl->gpu, sizeof(cl->gpu), "%s", cJSON_IsString(g) ? g->valuestring : "?");
			cl->nodes = (long long)nd->valuedouble;
			cl->world = cl->nodes * gpn;
			cl->price = price_of(prices, cl->gpu);
			if (cell_sweep(path, d.root, cl->gpu, cl->nodes, gpn, &sw, &err))
				goto fail;
			for (long long i = 0; i < sw.n_points; i++) {
				PointResult r;
				if (sweep_eval(&sw, i, &r, &err)) {
					sweep_free(&sw);
					goto fail;
				}
				if (r.status == PT_OK && (!cl->found || r.tokens_per_s > cl->best.tokens_per_s))
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
		cJSON_AddNumberToObject(out, "winner", win);
		char *t = cJSON_Print(out);
		puts(t);
		cJSON_free(t);
		cJSON_Delete(out);
	} else {
		printf("# plan %s: %.3g tokens", path, tokens);
		if (deadline > 0)
			printf(", deadline %.0f days", deadline);
		if (budget > 0)
			printf(", budget %.3g USD", budget);
		printf("\n");
		printf("%-10s %6s %6s %9s %12s %12s %7s %9s  %s\n", "gpu", "nodes", "gpus", "days",
		       "cost_USD", "tokens/s", "mfu", "free_GiB", "best layout");
		for (int i = 0; i < n; i++) {
			const Cell *cl = &cells[i];
			if (!cl->found) {
				printf("%-10s %6lld %6lld %9s %12s %12s %7s %9s  %s\n", cl->gpu, cl->nodes,
				       cl->world, "-", "-", "-", "-", "-", "nothing fits");
				continue;
			}
			printf("%-10s %6lld %6lld %9.2f %12.4g %12.0f %7.3f %9.2f  %s%s\n", cl->gpu,
			       cl->nodes, cl->world, cl->days, cl->cost_usd, cl->best.tokens_per_s,
			       cl->best.mfu, (cl->best.capacity_bytes - cl->best.peak_bytes) / 1073741824.0,
			       cl->best.config, i == win ? "   <- winner" : "");
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
	jdoc_free(&pd);
	jdoc_free(&d);
	return rc;
}

#include "sweep_report.h"

#include "../sim/infer_sim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MAX_KEYS SWEEP_MAX_AXES

/* The shown points' settings: keys in axis order, each point's value of each as text. */
typedef struct Settings {
	int n_keys, n_points;
	char key[MAX_KEYS][256];
	char shortk[MAX_KEYS][256];
	int differs[MAX_KEYS];
	char (*val)[MAX_KEYS][64]; /* [point][key] */
} Settings;

static void value_text(const cJSON *v, char *buf, size_t n)
{
	if (cJSON_IsString(v)) {
		snprintf(buf, n, "%s", v->valuestring);
		return;
	}
	char *t = cJSON_PrintUnformatted(v);
	snprintf(buf, n, "%s", t ? t : "?");
	cJSON_free(t);
}

const char *sweep_key_short(const char *key)
{
	static const char *const SHORT[][2] = {
		{"deepspeed.zero_optimization.stage", "zero"}, {"parallelism.tp", "tp"},
		{"parallelism.pp", "pp"}, {"parallelism.ep", "ep"},
		{"parallelism.sequence_parallel", "sp"},
		{"deepspeed.train_micro_batch_size_per_gpu", "micro"},
		{"deepspeed.gradient_accumulation_steps", "accum"},
		{"activation_checkpointing", "ckpt"}, {"cluster.gpu", "gpu"},
		{"cluster.nodes", "nodes"}, {"inference.tensor_parallel.tp_size", "tp"},
		{"inference.dtype", "dtype"}, {"workload.batch_size", "batch"},
		{"workload.request_rate", "rate"}, {NULL, NULL}};
	for (int i = 0; SHORT[i][0]; i++)
		if (!strcmp(key, SHORT[i][0]))
			return SHORT[i][1];
	return NULL;
}

/* Each key's usual short name, else the shortest dotted suffix (its last component, or more)
 * that no other differing key ends with. */
static void short_names(Settings *s)
{
	for (int i = 0; i < s->n_keys; i++) {
		const char *k = s->key[i], *best = k;
		if (sweep_key_short(k)) {
			snprintf(s->shortk[i], sizeof(s->shortk[i]), "%s", sweep_key_short(k));
			continue;
		}
		for (const char *p = k + strlen(k); p > k; p--) {
			if (p[-1] != '.')
				continue;
			int clash = 0;
			for (int j = 0; j < s->n_keys && !clash; j++) {
				size_t lj = strlen(s->key[j]), lp = strlen(p);
				clash = j != i && s->differs[j] && lj >= lp &&
					!strcmp(s->key[j] + lj - lp, p) &&
					(lj == lp || s->key[j][lj - lp - 1] == '.');
			}
			if (!clash) {
				best = p;
				break;
			}
		}
		snprintf(s->shortk[i], sizeof(s->shortk[i]), "%s", best);
	}
}

static int settings_read(Settings *s, const PointResult *pts, int n)
{
	memset(s, 0, sizeof(*s));
	s->n_points = n;
	s->val = calloc((size_t)(n ? n : 1), sizeof(*s->val));
	if (!s->val)
		return -1;
	for (int p = 0; p < n; p++) {
		cJSON *c = cJSON_Parse(pts[p].config);
		int k = 0;
		for (const cJSON *v = c ? c->child : NULL; v && k < MAX_KEYS; v = v->next, k++) {
			if (p == 0)
				snprintf(s->key[k], sizeof(s->key[k]), "%s", v->string);
			value_text(v, s->val[p][k], sizeof(s->val[p][k]));
		}
		if (p == 0)
			s->n_keys = k;
		cJSON_Delete(c);
	}
	for (int k = 0; k < s->n_keys; k++)
		for (int p = 1; p < n; p++)
			s->differs[k] |= strcmp(s->val[p][k], s->val[0][k]) != 0;
	short_names(s);
	return 0;
}

static const char *const OBJECTIVE[] = {"tokens/s", "USD per million tokens", "free GiB"};

static void print_summary(FILE *f, const SweepReport *r)
{
	fprintf(f, "# %s: %lld points", r->name, r->n_points);
	if (r->covered < r->n_points)
		fprintf(f, ", %lld %s", r->covered, r->scope);
	fprintf(f, ": %lld priced (%lld of them tight), %lld do not fit, %lld refused, %lld unpriced",
		r->counts[PT_OK], r->tight, r->counts[PT_OOM], r->counts[PT_INVALID],
		r->counts[PT_UNPRICED]);
	if (r->covered < r->n_points && !strcmp(r->scope, "stored"))
		fprintf(f, "; %lld not priced yet (run it again to resume, or merge the other "
			"shards' databases)", r->n_points - r->covered);
	fputc('\n', f);
}

void sweep_report_print(FILE *f, const SweepReport *r)
{
	Settings s;
	print_summary(f, r);
	if (settings_read(&s, r->best, r->n_best)) {
		fprintf(f, "# out of memory listing the best points\n");
		return;
	}
	fprintf(f, "# best %d by %s%s; free_GiB: usable memory less the peak; tight: within %.0f%% of "
		"usable memory, where the allocator decides\n", r->n_best, OBJECTIVE[r->objective],
		!strcmp(r->scope, "stored") ? " of every stored point" : "", 100 * PREDICT_TIGHT_MARGIN);
	int width[MAX_KEYS], last = -1;
	if (r->infer)
		fprintf(f, "# inference: tokens/s = generated tokens/s of the whole cluster; TTFT, TPOT "
			"(ms), latency of a request; bound: what bounds a decode step\n"
			"%4s %8s %-10s %6s %9s %9s %9s %10s %12s %10s %9s %5s %-16s", "rank", "index",
			"gpu", "world", "ttft_s", "tpot_ms", "latency_s", "tok/s/GPU", "tokens/s",
			"USD/Mtok", "free_GiB", "fits", "bound");
	else
		fprintf(f, "%4s %8s %-10s %6s %10s %12s %7s %10s %9s %5s", "rank", "index", "gpu",
			"world", "step_s", "tokens/s", "mfu", "USD/Mtok", "free_GiB", "fits");
	for (int k = 0; k < s.n_keys; k++) {
		if (!s.differs[k])
			continue;
		width[k] = (int)strlen(s.shortk[k]);
		for (int p = 0; p < s.n_points; p++)
			if ((int)strlen(s.val[p][k]) > width[k])
				width[k] = (int)strlen(s.val[p][k]);
		last = k;
	}
	for (int k = 0; k <= last; k++)
		if (s.differs[k])
			fprintf(f, "  %-*s", k == last ? 0 : width[k], s.shortk[k]);
	fputc('\n', f);
	for (int i = 0; i < r->n_best; i++) {
		const PointResult *p = &r->best[i];
		if (r->infer)
			fprintf(f, "%4d %8lld %-10s %6lld %9.4g %9.4g %9.4g %10.1f %12.0f %10.4g %9.2f "
				"%5s %-16s", i + 1, p->idx, p->gpu, p->world, p->ttft_s,
				p->tpot_s * 1e3, p->latency_s, p->tokens_per_s_gpu, p->tokens_per_s,
				p->cost_per_mtoken, (p->capacity_bytes - p->peak_bytes) / 1073741824.0,
				p->verdict == VERDICT_TIGHT ? "tight" : "yes",
				infer_bound_name((InferBound)p->decode_bound));
		else
			fprintf(f, "%4d %8lld %-10s %6lld %10.4g %12.0f %7.3f %10.4g %9.2f %5s", i + 1,
				p->idx, p->gpu, p->world, p->step_s, p->tokens_per_s, p->mfu,
				p->cost_per_mtoken, (p->capacity_bytes - p->peak_bytes) / 1073741824.0,
				p->verdict == VERDICT_TIGHT ? "tight" : "yes");
		for (int k = 0; k <= last; k++)
			if (s.differs[k])
				fprintf(f, "  %-*s", k == last ? 0 : width[k], s.val[i][k]);
		fputc('\n', f);
	}
	int same = 0;
	for (int k = 0; k < s.n_keys; k++)
		if (!s.differs[k] && s.n_points)
			fprintf(f, "%s%s=%s", same++ ? " " : "# the same in every point shown: ",
				s.key[k], s.val[0][k]);
	if (same)
		fputc('\n', f);
	free(s.val);
}

static void add_num(cJSON *o, const char *key, double v)
{
	if (isfinite(v))
		cJSON_AddNumberToObject(o, key, v);
	else
		cJSON_AddNullToObject(o, key);
}

cJSON *sweep_report_json(const SweepReport *r)
{
	static const char *const status[] = {"ok", "oom", "invalid", "unpriced"};
	cJSON *o = cJSON_CreateObject();
	if (!o)
		return NULL;
	cJSON_AddStringToObject(o, "name", r->name);
	cJSON_AddNumberToObject(o, "n_points", (double)r->n_points);
	cJSON_AddStringToObject(o, "scope", r->scope);
	cJSON_AddStringToObject(o, "kind", r->infer ? "inference" : "training");
	cJSON_AddNumberToObject(o, "covered", (double)r->covered);
	cJSON *c = cJSON_AddObjectToObject(o, "counts");
	for (int k = 0; k < 4; k++)
		cJSON_AddNumberToObject(c, status[k], (double)r->counts[k]);
	cJSON_AddNumberToObject(c, "tight", (double)r->tight); /* of ok and unpriced */
	cJSON_AddNumberToObject(o, "tight_margin_fraction", PREDICT_TIGHT_MARGIN);
	cJSON_AddStringToObject(o, "objective", OBJECTIVE[r->objective]);
	cJSON *best = cJSON_AddArrayToObject(o, "best");
	for (int i = 0; i < r->n_best; i++) {
		const PointResult *p = &r->best[i];
		cJSON *b = cJSON_CreateObject();
		cJSON_AddNumberToObject(b, "index", (double)p->idx);
		cJSON_AddStringToObject(b, "gpu", p->gpu);
		cJSON_AddNumberToObject(b, "world", (double)p->world);
		add_num(b, "step_s", p->step_s);
		add_num(b, "tokens_per_s", p->tokens_per_s);
		add_num(b, "mfu", p->mfu);
		add_num(b, "cost_per_mtoken", p->cost_per_mtoken);
		add_num(b, "free_bytes", p->capacity_bytes - p->peak_bytes);
		if (r->infer) {
			add_num(b, "ttft_s", p->ttft_s);
			add_num(b, "tpot_s", p->tpot_s);
			add_num(b, "latency_s", p->latency_s);
			add_num(b, "tokens_per_s_per_gpu", p->tokens_per_s_gpu);
			cJSON_AddStringToObject(b, "decode_bound",
						infer_bound_name((InferBound)p->decode_bound));
		}
		cJSON_AddStringToObject(b, "verdict", predict_verdict_name(p->verdict));
		cJSON *cfg = cJSON_Parse(p->config);
		cJSON_AddItemToObject(b, "config", cfg ? cfg : cJSON_CreateNull());
		cJSON_AddItemToArray(best, b);
	}
	return o;
}

#include "sweep.h"

#include <libgen.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "infer_sim.h"

const char *sweep_status_name(PointStatus s)
{
	static const char *const n[] = {"ok", "oom", "invalid", "unpriced"};
	return n[s];
}

/* ---- reading ---- */

static int read_prices(Sweep *sw, const JsonObj *o, PxError *err)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o->obj, "prices");
	JsonDoc d = {0};
	if (!v)
		return 0;
	if (cJSON_IsString(v)) { /* a price list file, relative to the sweep file */
		char dir[1024], file[2048];
		snprintf(dir, sizeof(dir), "%s", sw->path);
		snprintf(file, sizeof(file), v->valuestring[0] == '/' ? "%s%s" : "%s/%s",
			 v->valuestring[0] == '/' ? "" : dirname(dir), v->valuestring);
		if (jdoc_load_file(&d, file, err))
			return -1;
		v = cJSON_GetObjectItemCaseSensitive(d.root, "per_gpu_hour_usd");
	}
	int rc = 0;
	for (const cJSON *p = v ? v->child : NULL; p && sw->n_prices < 32; p = p->next) {
		if (!cJSON_IsNumber(p) || p->valuedouble < 0) {
			rc = px_fail(err, PX_ERR_INPUT, "%s: prices.%s: expected a price in USD per "
				     "GPU-hour", sw->path, p->string);
			break;
		}
		snprintf(sw->price_gpu[sw->n_prices], 32, "%s", p->string);
		sw->price_per_gpu_hour[sw->n_prices++] = p->valuedouble;
	}
	jdoc_free(&d);
	return rc;
}

/* Keys the engine reads only from some ZeRO stage on, so that points differing only there below
 * it price the same (docs/time_model.md, "Sweep speed"): stage 3's prefetch bucket is read by
 * stage 3's parameter gathers alone (build.c, gather_with_prefetch), unless "auto", which the
 * batch rules resolve, and may refuse, at any stage; contiguous gradient buffers by stage 1-3's
 * reductions alone (build_unit_grads and build_alloc_buckets); overlap_comm by the ZeRO optimizers'
 * reductions alone (engine/streams.h: without ZeRO the engine reduces on the compute stream);
 * reduce_bucket_size by the ZeRO optimizers alone too (without ZeRO the engine's own buckets,
 * build_engine_allreduce, and BF16_Optimizer's one flat, plan.c plan_buckets), unless
 * "auto", which needs the model's hidden size at any stage. */
static const struct {
	const char *key;
	int from_stage;
	unsigned auto_bit; /* AUTO_*: a point holding "auto" there reads it at any stage */
} UNREAD[] = {
	{"deepspeed.zero_optimization.stage3_prefetch_bucket_size", 3, AUTO_PREFETCH},
	{"deepspeed.zero_optimization.contiguous_gradients", 1, 0},
	{"deepspeed.zero_optimization.overlap_comm", 1, 0},
	{"deepspeed.zero_optimization.reduce_bucket_size", 1, AUTO_REDUCE_BUCKET},
};

static void mark_unread(SweepAxis *ax)
{
	for (size_t i = 0; i < sizeof(UNREAD) / sizeof(UNREAD[0]); i++)
		if (!strcmp(ax->key, UNREAD[i].key)) {
			ax->unread_below = UNREAD[i].from_stage;
			ax->auto_bit = UNREAD[i].auto_bit;
		}
}

/* A whole section's value ("model": "llama.json") read relative to the sweep file, as its
 * scenario is: the JSON text of the path made from the sweep's folder, in place of value (owned,
 * cJSON_free). Other keys and values are left alone (returns 0 without touching *value). */
static int section_path_relative(const Sweep *sw, const char *key, char **value, PxError *err)
{
	static const char *const sections[] = {"model", "deepspeed", "cluster", NULL};
	int whole = 0;
	for (int i = 0; sections[i]; i++)
		whole |= !strcmp(key, sections[i]);
	cJSON *v = whole ? cJSON_Parse(*value) : NULL;
	if (!cJSON_IsString(v) || v->valuestring[0] == '/' || v->valuestring[0] == '{') {
		cJSON_Delete(v);
		return 0;
	}
	char dir[1024], file[2048];
	snprintf(dir, sizeof(dir), "%s", sw->path);
	snprintf(file, sizeof(file), "%s/%s", dirname(dir), v->valuestring);
	cJSON_Delete(v);
	cJSON *f = cJSON_CreateString(file);
	char *text = f ? cJSON_PrintUnformatted(f) : NULL;
	cJSON_Delete(f);
	if (!text)
		return px_fail(err, PX_ERR_RUNTIME, "out of memory");
	cJSON_free(*value);
	*value = text;
	return 0;
}

static int read_axes(Sweep *sw, const JsonObj *o, PxError *err)
{
	char where[512];
	const cJSON *axes = cJSON_GetObjectItemCaseSensitive(o->obj, "axes");
	if (!cJSON_IsObject(axes) || !axes->child) {
		jobj_where(o, "axes", where, sizeof(where));
		return px_fail(err, PX_ERR_INPUT, "%s: axes: expected an object of KEY: [VALUES]",
			       where);
	}
	sw->n_points = 1;
	for (const cJSON *a = axes->child; a; a = a->next) {
		SweepAxis *ax = &sw->axes[sw->n_axes];
		if (sw->n_axes == SWEEP_MAX_AXES)
			return px_fail(err, PX_ERR_INPUT, "%s: axes: at most %d", sw->path, SWEEP_MAX_AXES);
		if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) == 0)
			return px_fail(err, PX_ERR_INPUT, "%s: axes.%s: expected a non-empty array of "
				       "values", sw->path, a->string);
		snprintf(ax->key, sizeof(ax->key), "%s", a->string);
		mark_unread(ax);
		ax->n = cJSON_GetArraySize(a);
		ax->values = calloc((size_t)ax->n, sizeof(char *));
		if (!ax->values)
			return px_fail(err, PX_ERR_RUNTIME, "out of memory");
		sw->n_axes++;
		int i = 0;
		for (const cJSON *v = a->child; v; v = v->next, i++) {
			if (!(ax->values[i] = cJSON_PrintUnformatted(v)))
				return px_fail(err, PX_ERR_RUNTIME, "out of memory");
			if (section_path_relative(sw, ax->key, &ax->values[i], err))
				return -1;
		}
		sw->n_points *= ax->n;
	}
	long long stride = 1;
	for (int a = sw->n_axes - 1; a >= 0; a--) {
		sw->axes[a].stride = stride;
		stride *= sw->axes[a].n;
	}
	return 0;
}

/* The identity of a sweep: its file and its base's documents, so that a resumed sweep is the
 * same one and a changed one is new. */
static int make_spec(Sweep *sw, const JsonDoc *file, PxError *err)
{
	const JsonDoc *docs = sw->infer ? sw->ibase.docs : sw->base.docs;
	int n_docs = sw->infer ? IS_N_DOCS : SC_N_DOCS;
	size_t len = strlen(file->text) + 1;
	for (int i = 0; i < n_docs; i++)
		if (docs[i].text)
			len += strlen(docs[i].text) + 1;
	if (!(sw->spec = malloc(len)))
		return px_fail(err, PX_ERR_RUNTIME, "out of memory");
	strcpy(sw->spec, file->text);
	for (int i = 0; i < n_docs; i++)
		if (docs[i].text)
			strcat(strcat(sw->spec, "\n"), docs[i].text);
	return 0;
}

/* A key no scenario reader knows (a typo, say) would change nothing: each point would price the
 * base scenario again. The readers warn "unknown key 'KEY'; did you mean 'CLOSEST'?" about it;
 * such a warning about one of the keys of `keys` (set, or one axis) refuses the sweep. */
/* Whether the key a warning names (up to its closing quote, at w) is key, a dotted prefix of it
 * (the override made an unknown section) or a dotted suffix (the reader names it from its own
 * object down): the inference reader names them so. */
static int warned_key_matches(const char *w, const char *key)
{
	size_t n = strcspn(w, "'"), kn = strlen(key);
	if (n == kn)
		return !strncmp(w, key, n);
	if (n < kn && !strncmp(w, key, n) && key[n] == '.')
		return 1;
	return n < kn && !strncmp(w, key + kn - n, n) && key[kn - n - 1] == '.';
}

static int refuse_if_warned(const Sweep *sw, const char *where, const char *key,
			    const PxNotes *notes, PxError *err)
{
	char needle[300];
	snprintf(needle, sizeof(needle), "unknown key '%s'", key);
	for (int i = 0; i < notes->n_warnings; i++) {
		const char *w = strstr(notes->warnings[i], needle);
		if (!w && sw->infer && (w = strstr(notes->warnings[i], "unknown key '")) &&
		    !warned_key_matches(w + strlen("unknown key '"), key))
			w = NULL;
		if (!w)
			continue;
		const char *hint = strstr(w, "; did you mean");
		return px_fail(err, PX_ERR_INPUT, "%s: %s.%s: no scenario reader knows this key%s",
			       sw->path, where, key, hint ? hint : "");
	}
	return 0;
}

static int unknown_key(const Sweep *sw, const char *where, const cJSON *keys,
		       const PxNotes *notes, PxError *err)
{
	for (const cJSON *k = keys ? keys->child : NULL; k; k = k->next)
		if (refuse_if_warned(sw, where, k->string, notes, err))
			return -1;
	return 0;
}

/* ---- inference sweeps ---- */

/* The inference base loaded again with the sweep's "set" (ibase.ov) and n more keys and values
 * (a point's axes). As infer_scenario_load: on error nothing is left to free. */
static int infer_point_load(const Sweep *sw, InferScenario *sc, const char *const *keys,
			    const char *const *values, int n, PxError *err)
{
	JsonOverrides ov;
	int rc = -1;
	jov_init(&ov);
	for (int i = 0; i < sw->ibase.ov.n; i++)
		if (jov_add_kv(&ov, sw->ibase.ov.v[i].key, sw->ibase.ov.v[i].value, err))
			goto out;
	for (int i = 0; i < n; i++)
		if (jov_add_kv(&ov, keys[i], values[i], err))
			goto out;
	rc = infer_scenario_load(sc, sw->ibase.path, &ov, err);
out:
	jov_free(&ov);
	return rc;
}

/* An inference scenario's keys lie under these; anything else (deepspeed., parallelism.,
 * activation_checkpointing) is a training scenario's and would change nothing here. */
static int infer_key_check(const char *base, const JsonObj *o, const char *key, PxError *err)
{
	static const char *const sections[] = {"model", "cluster", "inference", "workload", NULL};
	for (int i = 0; sections[i]; i++) {
		size_t n = strlen(sections[i]);
		if (!strncmp(key, sections[i], n) && (key[n] == '.' || key[n] == '\0'))
			return 0;
	}
	char where[512];
	jobj_where(o, key, where, sizeof(where));
	return px_fail(err, PX_ERR_INPUT, "%s: %s.%s: not a key of an inference scenario (%s is "
		       "one): expected a key under inference., workload., model. or cluster.%s",
		       where, o->name, key, base,
		       strchr(key, '.') ? "; a training scenario's keys do not apply" : "");
}

static int infer_keys_check(const char *base, const JsonDoc *d, PxError *err)
{
	static const char *const objs[] = {"set", "axes"};
	for (int i = 0; i < 2; i++) {
		const cJSON *obj = cJSON_GetObjectItemCaseSensitive(d->root, objs[i]);
		JsonObj o;
		jobj_make(&o, d, obj, objs[i], objs[i], NULL);
		for (const cJSON *k = obj ? obj->child : NULL; k; k = k->next)
			if (infer_key_check(base, &o, k->string, err))
				return -1;
	}
	return 0;
}

/* Each axis applied alone to the base with one of its values (the first that loads): a
 * warning about its key refuses the sweep. */
static int check_axis_keys(const Sweep *sw, PxError *err)
{
	for (int a = 0; sw->infer && a < sw->n_axes; a++) {
		const SweepAxis *ax = &sw->axes[a];
		for (int i = 0; i < ax->n; i++) {
			InferScenario sc;
			PxError ignored;
			if (infer_point_load(sw, &sc, (const char *const[]){ax->key},
					     (const char *const[]){ax->values[i]}, 1, &ignored))
				continue; /* this value is refused: the point says why */
			int rc = refuse_if_warned(sw, "axes", ax->key, &sc.notes, err);
			infer_scenario_free(&sc);
			if (rc)
				return -1;
			break;
		}
	}
	for (int a = 0; !sw->infer && a < sw->n_axes; a++) {
		const SweepAxis *ax = &sw->axes[a];
		for (int i = 0; i < ax->n; i++) {
			JsonOverrides ov;
			Scenario sc;
			PxError ignored;
			jov_init(&ov);
			int loaded = !jov_add_kv(&ov, ax->key, ax->values[i], &ignored) &&
				     !scenario_derive(&sc, &sw->base, &ov, &ignored);
			jov_free(&ov);
			if (!loaded)
				continue; /* this value is refused: the point says why */
			int rc = refuse_if_warned(sw, "axes", ax->key, &sc.notes, err);
			scenario_free(&sc);
			if (rc)
				return -1;
			break;
		}
	}
	return 0;
}

int sweep_load(Sweep *sw, const char *path, PxError *err)
{
	static const char *const known[] = {"name", "description", "scenario", "set", "axes",
					    "objective", "top", "prices", NULL};
	JsonDoc d = {0};
	JsonObj o;
	JsonOverrides ov;
	const char *name, *scn, *obj;
	long long top;
	PxNotes notes;
	int rc = -1;

	memset(sw, 0, sizeof(*sw));
	jov_init(&ov);
	px_notes_init(&notes);
	snprintf(sw->path, sizeof(sw->path), "%s", path);
	if (jdoc_load_file(&d, path, err))
		goto out;
	jobj_make(&o, &d, d.root, "", "", NULL);
	if (!cJSON_IsObject(d.root)) {
		px_fail(err, PX_ERR_INPUT, "%s: expected a JSON object with scenario and axes", path);
		goto out;
	}
	jobj_check_keys(&o, known, &notes);
	for (int i = 0; i < notes.n_warnings; i++)
		fprintf(stderr, "parallax sweep: %s\n", notes.warnings[i]);
	if (jobj_str(&o, "name", "sweep", &name, err) < 0 ||
	    jobj_str(&o, "objective", "throughput", &obj, err) < 0 ||
	    jobj_int(&o, "top", 1, 1000, 10, &top, err) < 0 || jobj_str(&o, "scenario", NULL, &scn, err) < 0)
		goto out;
	snprintf(sw->name, sizeof(sw->name), "%s", name);
	sw->top = (int)top;
	if (!strcmp(obj, "throughput") || !strcmp(obj, "cost") || !strcmp(obj, "headroom")) {
		sw->objective = !strcmp(obj, "throughput") ? OBJ_THROUGHPUT :
				!strcmp(obj, "cost") ? OBJ_COST : OBJ_HEADROOM;
	} else {
		char where[512];
		jobj_where(&o, "objective", where, sizeof(where));
		px_fail(err, PX_ERR_INPUT, "%s: objective: expected throughput, cost or headroom, "
			"got \"%s\"", where, obj);
		goto out;
	}
	if (!scn) {
		px_fail(err, PX_ERR_INPUT, "%s: scenario: missing; expected the path of a scenario",
			path);
		goto out;
	}
	const cJSON *set = cJSON_GetObjectItemCaseSensitive(d.root, "set");
	for (const cJSON *s = set ? set->child : NULL; s; s = s->next) {
		char *v = cJSON_PrintUnformatted(s);
		if (!v) {
			px_fail(err, PX_ERR_RUNTIME, "out of memory");
			goto out;
		}
		int bad = section_path_relative(sw, s->string, &v, err) ||
			  jov_add_kv(&ov, s->string, v, err);
		cJSON_free(v);
		if (bad)
			goto out;
	}
	char dir[1024], file[2048];
	snprintf(dir, sizeof(dir), "%s", path);
	snprintf(file, sizeof(file), scn[0] == '/' ? "%s%s" : "%s/%s", scn[0] == '/' ? "" : dirname(dir),
		 scn);
	int is = infer_scenario_is(file, err);
	if (is < 0)
		goto out;
	sw->infer = is;
	if (is ? infer_keys_check(file, &d, err) || infer_scenario_load(&sw->ibase, file, &ov, err) :
		 scenario_load(&sw->base, file, &ov, err))
		goto out;
	if (unknown_key(sw, "set", set, is ? &sw->ibase.notes : &sw->base.notes, err) ||
	    read_axes(sw, &o, err) ||
	    check_axis_keys(sw, err) || read_prices(sw, &o, err) || make_spec(sw, &d, err))
		goto out;
	if (sw->objective == OBJ_COST && sw->n_prices == 0) {
		px_fail(err, PX_ERR_INPUT, "%s: objective cost needs prices (USD per GPU-hour per GPU)",
			path);
		goto out;
	}
	rc = 0;
out:
	jov_free(&ov);
	px_notes_free(&notes);
	jdoc_free(&d);
	if (rc)
		sweep_free(sw);
	return rc;
}

void sweep_free(Sweep *sw)
{
	if (!sw)
		return;
	for (int a = 0; a < sw->n_axes; a++) {
		for (int i = 0; sw->axes[a].values && i < sw->axes[a].n; i++)
			cJSON_free(sw->axes[a].values[i]);
		free(sw->axes[a].values);
	}
	scenario_free(&sw->base);
	infer_scenario_free(&sw->ibase);
	free(sw->spec);
	sw->spec = NULL;
	sw->n_axes = 0;
}

/* ---- pricing ---- */

static double price_of(const Sweep *sw, const char *gpu)
{
	for (int i = 0; i < sw->n_prices; i++)
		if (!strcasecmp(sw->price_gpu[i], gpu))
			return sw->price_per_gpu_hour[i];
	return NAN;
}

/* s appended at buf + *at, cut short and terminated as snprintf would; *at counts what did not
 * fit too, so that nothing more is written once the buffer is full (a sweep writes a point's
 * configuration this way, where snprintf's formatting showed in the profile). */
static void append(char *buf, size_t n, size_t *at, const char *s)
{
	size_t len = strlen(s);
	if (*at + 1 < n) {
		size_t k = len < n - 1 - *at ? len : n - 1 - *at;
		memcpy(buf + *at, s, k);
		buf[*at + k] = '\0';
	}
	*at += len;
}

/* Price a point whose scenario sc was derived; r->config is written already. */
static int price(const Sweep *sw, Scenario *sc, PointResult *r, PxError *err)
{
	Prediction pr;
	PxError why = {0};

	snprintf(r->gpu, sizeof(r->gpu), "%s", sc->cluster.gpu.name);
	r->world = cluster_world(&sc->cluster);
	if (predict_fit(sc, &pr, &why)) {
		if (why.code == PX_ERR_RUNTIME)
			return px_fail(err, why.code, "%s", why.msg);
		r->status = PT_INVALID;
		snprintf(r->note, sizeof(r->note), "%.255s", why.msg);
		return 0;
	}
	r->peak_bytes = pr.stages[pr.worst].mem.place[PLACE_GPU].peak_bytes;
	r->capacity_bytes = pr.gpu_capacity_bytes;
	r->verdict = pr.verdict;
	r->status = pr.fits ? PT_OK : PT_OOM; /* what does not fit is not timed; a tight point is */
	if (pr.fits) {
		HwProfile hw;
		hwprofile_default(&sc->cluster.gpu, &hw);
		if (predict_time(&pr, &hw, "built-in", &why)) {
			predict_free(&pr);
			return px_fail(err, why.code, "%s", why.msg);
		}
		if (!pr.time_known) {
			r->status = PT_UNPRICED;
			snprintf(r->note, sizeof(r->note), "%.255s", pr.time_note);
		} else {
			r->step_s = pr.time.step_s;
			r->tokens_per_s = pr.time.tokens_per_s;
			r->mfu = pr.time.mfu;
			double price = price_of(sw, r->gpu);
			r->cost_per_mtoken = price * (double)r->world / 3600.0 / r->tokens_per_s * 1e6;
		}
	}
	predict_free(&pr);
	return 0;
}

/* Price an inference point (its scenario loaded): what does not fit is not timed; continuous
 * batching that cannot keep up with its request rate is unpriced, saying why. */
static int price_infer(const Sweep *sw, const InferScenario *sc, PointResult *r, PxError *err)
{
	InferPrediction pr;
	PxError why = {0};
	snprintf(r->gpu, sizeof(r->gpu), "%s", sc->cluster.gpu.name);
	r->world = cluster_world(&sc->cluster);
	r->mfu = NAN;
	if (infer_predict(sc, NULL, NULL, &pr, &why)) {
		infer_predict_free(&pr);
		if (why.code == PX_ERR_RUNTIME)
			return px_fail(err, why.code, "%s", why.msg);
		r->status = PT_INVALID;
		snprintf(r->note, sizeof(r->note), "%.255s", why.msg);
		return 0;
	}
	r->peak_bytes = pr.peak_bytes;
	r->capacity_bytes = pr.gpu_capacity_bytes;
	r->verdict = pr.verdict;
	r->max_batch = pr.max_batch;
	r->output_tokens = sc->wl.output_tokens;
	r->status = pr.verdict == VERDICT_NO_FIT ? PT_OOM : PT_OK;
	if (r->status == PT_OK && sc->wl.continuous && !pr.cb.stable) {
		r->status = PT_UNPRICED;
		snprintf(r->note, sizeof(r->note), "%.255s", pr.cb.why);
	} else if (r->status == PT_OK) {
		r->ttft_s = pr.ttft_s;
		r->tpot_s = pr.tpot_s;
		r->latency_s = pr.latency_s;
		r->step_s = pr.latency_s;
		r->tokens_per_s_gpu = pr.tokens_per_s_gpu;
		r->tokens_per_s = pr.tokens_per_s_gpu * (double)r->world;
		r->decode_bound = pr.decode.bound;
		r->concurrency = sc->wl.continuous ? pr.cb.concurrency : (double)sc->wl.batch;
		r->cost_per_mtoken = price_of(sw, r->gpu) * (double)r->world / 3600.0 /
				     r->tokens_per_s * 1e6;
	}
	infer_predict_free(&pr);
	return 0;
}

/* ---- results shared between points ---- */

#define MEMO_SLOTS 64

typedef struct MemoEntry {
	long long key;   /* the point's index with its unread axes at their first value; -1: empty */
	unsigned unread; /* bit a: the point did not read axis a */
	PointResult r;   /* its result (idx and config are each point's own) */
} MemoEntry;

struct SweepMemo {
	MemoEntry e[MEMO_SLOTS];
	uint64_t plain[SWEEP_MAX_AXES]; /* bit i: axis a's value i has read without error, not
					    "auto", at a stage that does not read it */
	long long taken;                /* results taken instead of priced */
	long long unread;               /* of which taken before reading the scenario */
};

SweepMemo *sweep_memo_create(void)
{
	SweepMemo *m = calloc(1, sizeof(*m));
	for (int i = 0; m && i < MEMO_SLOTS; i++)
		m->e[i].key = -1;
	return m;
}

void sweep_memo_destroy(SweepMemo *m)
{
	free(m);
}

long long sweep_memo_taken(const SweepMemo *m, long long *unread)
{
	if (unread)
		*unread = m ? m->unread : 0;
	return m ? m->taken : 0;
}

/* The slot for a point in m, or NULL when it reads every axis: a point that leaves axes unread
 * shares its result with those whose other axes are the same and which leave the same axes
 * unread (so that each of them reads nothing the others set differently). */
static MemoEntry *slot_of(SweepMemo *m, long long key)
{
	return &m->e[((unsigned long long)key * 0x9E3779B97F4A7C15ull) >> 58]; /* 64 slots */
}

static MemoEntry *memo_slot(const Sweep *sw, SweepMemo *m, const Scenario *sc, long long idx,
			    const int *digit, unsigned *unread, long long *key)
{
	*unread = 0;
	*key = idx;
	for (int a = 0; a < sw->n_axes; a++) {
		const SweepAxis *ax = &sw->axes[a];
		if (sc->ds.zero.stage < ax->unread_below && !(sc->ds.autos & ax->auto_bit)) {
			*unread |= 1u << a;
			*key -= digit[a] * ax->stride;
			if (m && digit[a] < 64)
				m->plain[a] |= 1ull << digit[a];
		}
	}
	if (!m || !*unread)
		return NULL;
	return slot_of(m, *key);
}

/* The kept result a point takes before its scenario is read, or NULL: one kept for a set S of
 * unread axes, whose point had the same values on every other axis, where this point's values
 * on S are plain. Then this point reads what that one read: its stage is the same, so S is not
 * read, and its scenario reads without error and without "auto" (the values off S are the
 * other point's; those on S are each checked alone, by their key's own type and range). */
static MemoEntry *memo_find(const Sweep *sw, SweepMemo *m, long long idx, const int *digit)
{
	unsigned cand = 0;
	for (int a = 0; m && a < sw->n_axes; a++)
		if (sw->axes[a].unread_below && digit[a] < 64 && (m->plain[a] >> digit[a] & 1))
			cand |= 1u << a;
	for (unsigned set = cand; set; set = (set - 1) & cand) { /* every non-empty subset */
		long long key = idx;
		for (int a = 0; a < sw->n_axes; a++)
			if (set >> a & 1)
				key -= digit[a] * sw->axes[a].stride;
		MemoEntry *e = slot_of(m, key);
		if (e->key == key && e->unread == set)
			return e;
	}
	return NULL;
}

/* All of a result but its point's index and configuration. */
static void result_take(PointResult *dst, const PointResult *src)
{
	dst->status = src->status;
	dst->world = src->world;
	memcpy(dst->gpu, src->gpu, sizeof(dst->gpu));
	dst->peak_bytes = src->peak_bytes;
	dst->capacity_bytes = src->capacity_bytes;
	dst->verdict = src->verdict;
	dst->step_s = src->step_s;
	dst->tokens_per_s = src->tokens_per_s;
	dst->mfu = src->mfu;
	dst->cost_per_mtoken = src->cost_per_mtoken;
	dst->ttft_s = src->ttft_s;
	dst->tpot_s = src->tpot_s;
	dst->latency_s = src->latency_s;
	dst->tokens_per_s_gpu = src->tokens_per_s_gpu;
	dst->max_batch = src->max_batch;
	dst->output_tokens = src->output_tokens;
	dst->decode_bound = src->decode_bound;
	dst->concurrency = src->concurrency;
	memcpy(dst->note, src->note, sizeof(dst->note));
}

/* ---- one point ---- */

int sweep_eval(const Sweep *sw, long long idx, PointResult *r, PxError *err)
{
	return sweep_eval_memo(sw, NULL, idx, r, err);
}

int sweep_eval_memo(const Sweep *sw, SweepMemo *m, long long idx, PointResult *r, PxError *err)
{
	JsonOverrides ov;
	Scenario sc;
	PxError why = {0};
	long long rest = idx, key;
	int digit[SWEEP_MAX_AXES];
	unsigned unread;
	size_t at = 0;

	memset(r, 0, sizeof(*r));
	r->idx = idx;
	jov_init(&ov);
	for (int a = sw->n_axes - 1; a >= 0; a--) { /* the last axis varies fastest */
		const SweepAxis *ax = &sw->axes[a];
		digit[a] = (int)(rest % ax->n);
		const char *v = ax->values[digit[a]];
		rest /= ax->n;
		if (jov_add_kv(&ov, ax->key, v, err)) {
			jov_free(&ov);
			return -1;
		}
	}
	append(r->config, sizeof(r->config), &at, "{");
	for (int a = 0; a < sw->n_axes; a++) { /* the config in the file's axis order */
		const JsonOverride *o = &ov.v[sw->n_axes - 1 - a];
		if (a)
			append(r->config, sizeof(r->config), &at, ", ");
		append(r->config, sizeof(r->config), &at, "\"");
		append(r->config, sizeof(r->config), &at, o->key);
		append(r->config, sizeof(r->config), &at, "\": ");
		append(r->config, sizeof(r->config), &at, o->value);
	}
	append(r->config, sizeof(r->config), &at, "}");

	if (sw->infer) { /* each point loads its file again: no memo */
		const char *keys[SWEEP_MAX_AXES], *vals[SWEEP_MAX_AXES];
		InferScenario isc;
		for (int a = 0; a < ov.n; a++)
			keys[a] = ov.v[a].key, vals[a] = ov.v[a].value;
		int rc = infer_point_load(sw, &isc, keys, vals, ov.n, &why);
		jov_free(&ov);
		if (rc) {
			if (why.code == PX_ERR_RUNTIME)
				return px_fail(err, why.code, "%s", why.msg);
			r->status = PT_INVALID;
			snprintf(r->note, sizeof(r->note), "%.255s", why.msg);
			return 0;
		}
		rc = price_infer(sw, &isc, r, err);
		infer_scenario_free(&isc);
		return rc;
	}
	MemoEntry *e = memo_find(sw, m, idx, digit);
	if (e) {
		jov_free(&ov);
		result_take(r, &e->r);
		m->taken++;
		m->unread++;
		return 0;
	}
	if (scenario_derive(&sc, &sw->base, &ov, &why)) {
		jov_free(&ov);
		if (why.code == PX_ERR_RUNTIME)
			return px_fail(err, why.code, "%s", why.msg);
		r->status = PT_INVALID;
		snprintf(r->note, sizeof(r->note), "%.255s", why.msg);
		return 0;
	}
	jov_free(&ov);
	e = memo_slot(sw, m, &sc, idx, digit, &unread, &key);
	if (e && e->key == key && e->unread == unread) {
		result_take(r, &e->r);
		m->taken++;
		scenario_free(&sc);
		return 0;
	}
	int rc = price(sw, &sc, r, err);
	scenario_free(&sc);
	if (rc == 0 && e) {
		e->key = key;
		e->unread = unread;
		e->r = *r;
	}
	return rc;
}

double sweep_score(const Sweep *sw, const PointResult *r)
{
	if (r->status != PT_OK)
		return -INFINITY;
	switch (sw->objective) {
	case OBJ_COST: return isnan(r->cost_per_mtoken) ? -INFINITY : -r->cost_per_mtoken;
	case OBJ_HEADROOM: return r->capacity_bytes - r->peak_bytes;
	default: return r->tokens_per_s;
	}
}

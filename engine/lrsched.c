#include "lrsched.h"

#include <math.h>
#include <string.h>

static int is_auto(const JsonObj *o, const char *key)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o->obj, key);
	return cJSON_IsString(v) && !strcmp(v->valuestring, "auto");
}

/* A learning rate, or "auto" (flag set, value left for dsconfig_resolve_schedule). */
static int lr_or_auto(const JsonObj *o, const char *key, unsigned flag, double dflt, double *out,
		      unsigned *autos, PxError *err)
{
	int rc = jobj_num_or_auto(o, key, 0, 1e3, dflt, out, err);
	if (rc == 2)
		*autos |= flag;
	return rc < 0 ? -1 : 0;
}

/* A warm-up of 0 steps: DeepSpeed up to 0.19.4 runs it as 2 (WarmupLR takes max(2, n)); 0.19.5
 * raises. The prediction does not depend on it, so it goes on, saying so. */
static int warn_no_warmup(const JsonObj *prm, PxNotes *notes, const char *why)
{
	char where[512];
	jobj_where(prm, "warmup_num_steps", where, sizeof(where));
	return px_notes_warn(notes, "%s: warning: %s.warmup_num_steps: %s; DeepSpeed 0.19.5 and "
			     "later refuse it (warmup_num_steps must be a positive integer, got 0), "
			     "earlier versions warm up over 2 steps, as parallax run does; set "
			     "training_args.warmup_steps", where, prm->name, why);
}

/* A scheduler count: an integer of at least lo, or "auto" (flag set, value left for
 * dsconfig_resolve_schedule). */
static int sched_steps(const JsonObj *o, const char *key, unsigned flag, long long lo,
		       long long dflt, long long *out, unsigned *autos, PxError *err)
{
	if (is_auto(o, key)) {
		*autos |= flag;
		*out = dflt;
		return 0;
	}
	return jobj_int(o, key, lo, 1LL << 50, dflt, out, err) < 0 ? -1 : 0;
}

int lrsched_parse(const JsonObj *root, DsConfig *ds, PxNotes *notes, PxError *err)
{
	static const char *const keys[] = {"type", "params", NULL};
	JsonObj o, prm;
	const char *type, *wt;
	int rc = jobj_child(root, "scheduler", &o, err);
	if (rc <= 0)
		return rc;
	if (jobj_check_keys(&o, keys, notes))
		return px_fail(err, PX_ERR_RUNTIME, "out of memory");
	if (jobj_str(&o, "type", "", &type, err) < 0)
		return -1;
	if (!strcmp(type, "WarmupLR"))
		ds->sched = 1;
	else if (!strcmp(type, "WarmupDecayLR"))
		ds->sched = 2;
	else {
		px_notes_not_modelled(notes, "%s.type \"%s\" (the executor keeps the learning rate "
				      "constant; memory and traffic do not depend on it)", o.name, type);
		return 0;
	}
	/* lr_schedules.py: WarmupLR's max defaults to the optimizer's lr, WarmupDecayLR's to 1e-3 */
	ds->warmup_max_lr = ds->sched == 1 ? -1 : 1e-3;
	ds->warmup_num_steps = 1000;
	if ((rc = jobj_child(&o, "params", &prm, err)) < 0)
		return -1;
	char where[512];
	long long none = -1;
	if (lr_or_auto(&prm, "warmup_min_lr", AUTO_WARMUP_MIN_LR, 0, &ds->warmup_min_lr, &ds->autos,
		       err) ||
	    lr_or_auto(&prm, "warmup_max_lr", AUTO_WARMUP_MAX_LR, ds->warmup_max_lr,
		       &ds->warmup_max_lr, &ds->autos, err) ||
	    sched_steps(&prm, "warmup_num_steps", AUTO_WARMUP_STEPS, 0, 1000, &ds->warmup_num_steps,
			&ds->autos, err) ||
	    sched_steps(&prm, "total_num_steps", AUTO_TOTAL_STEPS, 0, ds->sched == 2 ? none : 0,
			&ds->total_num_steps, &ds->autos, err) ||
	    jobj_str(&prm, "warmup_type", "log", &wt, err) < 0)
		return -1;
	ds->sched_linear = !strcmp(wt, "linear");
	if (!(ds->autos & AUTO_WARMUP_STEPS) && ds->warmup_num_steps == 0 &&
	    warn_no_warmup(&prm, notes, "0 written"))
		return px_fail(err, PX_ERR_RUNTIME, "out of memory");
	if (ds->sched == 2 && ds->total_num_steps == none && !(ds->autos & AUTO_TOTAL_STEPS)) {
		jobj_where(&prm, "total_num_steps", where, sizeof(where));
		return px_fail(err, PX_ERR_INPUT, "%s: %s.total_num_steps: WarmupDecayLR needs the "
			       "number of training steps (a required argument of DeepSpeed's "
			       "WarmupDecayLR), expected an integer or \"auto\"", where, prm.name);
	}
	return 0;
}

/* transformers' trainer_config_process and trainer_config_finalize: warmup_min_lr = 0,
 * warmup_max_lr = learning_rate, total_num_steps = num_training_steps, warmup_num_steps =
 * get_warmup_steps(num_training_steps). */
int dsconfig_resolve_schedule(DsConfig *ds, const TrainArgs *ta, PxNotes *notes, PxError *err)
{
	unsigned a = ds->autos;
	JsonObj sched, prm;

	if (!ds->sched || !(a & (AUTO_WARMUP_MIN_LR | AUTO_WARMUP_MAX_LR | AUTO_WARMUP_STEPS |
				 AUTO_TOTAL_STEPS)))
		return 0;
	if (jobj_child(&ds->root, "scheduler", &sched, err) <= 0 ||
	    jobj_child(&sched, "params", &prm, err) <= 0)
		return px_fail(err, PX_ERR_RUNTIME, "%s: the scheduler section went missing",
			       ds->source);
	if (a & AUTO_WARMUP_MIN_LR)
		ds->warmup_min_lr = 0;
	if (a & AUTO_WARMUP_MAX_LR)
		ds->warmup_max_lr = ta->learning_rate;
	int total_known = ta->max_steps > 0;
	if (a & AUTO_TOTAL_STEPS) /* only WarmupDecayLR uses it */
		ds->total_num_steps = total_known ? ta->max_steps : ds->sched == 2 ? -1 : 0;
	if (a & AUTO_WARMUP_STEPS) {
		double frac = ta->warmup_steps > 0 && ta->warmup_steps < 1 ? ta->warmup_steps :
									     ta->warmup_ratio;
		if (ta->warmup_steps >= 1)
			ds->warmup_num_steps = (long long)ta->warmup_steps;
		else if (frac == 0)
			ds->warmup_num_steps = 0;
		else if (total_known)
			ds->warmup_num_steps = (long long)ceil((double)ta->max_steps * frac);
		else
			ds->warmup_num_steps = -1;
		if (ds->warmup_num_steps == 0 && warn_no_warmup(&prm, notes, "\"auto\" is the "
							       "Trainer's warm-up, 0 here (training_args."
							       "warmup_steps and warmup_ratio are 0)"))
			return px_fail(err, PX_ERR_RUNTIME, "out of memory");
	}
	if (ds->total_num_steps >= 0 && ds->warmup_num_steps >= 0)
		return 0;
	ds->sched_unresolved = 1;
	if (px_notes_not_modelled(notes, "%s.%s (\"auto\": the Trainer's number of training "
				  "steps, training_args.max_steps or num_train_epochs x the dataset's "
				  "steps per epoch, which the scenario does not give; a prediction "
				  "does not need it, parallax run does)", prm.name,
				  ds->total_num_steps < 0 ? "total_num_steps" : "warmup_num_steps"))
		return px_fail(err, PX_ERR_RUNTIME, "out of memory");
	if (ds->warmup_num_steps < 0)
		ds->warmup_num_steps = 1000;
	if (ds->total_num_steps < 0)
		ds->total_num_steps = 0;
	return 0;
}

double dsconfig_lr(const DsConfig *ds, long k)
{
	if (!ds->sched)
		return ds->lr;
	double max = ds->warmup_max_lr >= 0 ? ds->warmup_max_lr : ds->lr, min = ds->warmup_min_lr;
	long it = k - 2;
	if (it < 0)
		return min;
	double n = ds->warmup_num_steps > 2 ? (double)ds->warmup_num_steps : 2, gamma;
	if (it < n)
		gamma = ds->sched_linear ? (double)it / n : log((double)it + 1) / log(n);
	else if (ds->sched == 1)
		gamma = 1;
	else
		gamma = fmax(0, ((double)ds->total_num_steps - (double)it) /
				       fmax(1, (double)ds->total_num_steps - n));
	return min + (max - min) * gamma;
}


#include "onebit.h"

#include "optim.h"

const char *onebit_step_name(OneBitStep k)
{
	static const char *const names[N_ONEBIT_STEPS] = {"full", "compressed", "local", "init"};
	return k >= 0 && k < N_ONEBIT_STEPS ? names[k] : "?";
}

void onebit_params_default(OneBitParams *o)
{ /* the constructors' defaults: onebit/adam.py, zoadam.py, lamb.py */
	*o = (OneBitParams){.freeze_step = 100000, .var_freeze_step = 100000,
			    .var_update_scaler = 16, .local_step_scaler = 32678,
			    .local_step_clipper = 16, .max_coeff = 10.0, .min_coeff = 0.01,
			    .coeff_beta = 0.9, .factor_max = 4.0, .factor_min = 0.5,
			    .factor_threshold = 0.1};
}

/* 0/1 Adam's counters as zoadam.py keeps them (state of the first parameter: every parameter's
 * step together). */
typedef struct ZeroOne {
	long long var_interval, var_counter, local_interval, local_counter;
	int backward_allreduce; /* the engine's enable_backward_allreduce for the next step */
} ZeroOne;

int onebit_zero_one_frozen(const OneBitParams *o, long long step)
{
	return step >= 2 && step - 1 > o->var_freeze_step;
}

/* Step `step`'s kind, then the counters moved past it. Step 1 is the optimizer's initialisation
 * step: the gradients are all-reduced (the engine's default), the idle accumulator goes through
 * the compressed all-reduce, and no counter moves. */
static OneBitStep zero_one_next(ZeroOne *z, const OneBitParams *o, long long step)
{
	OneBitStep kind;
	if (step == 1) {
		kind = ONEBIT_INIT;
	} else if (!onebit_zero_one_frozen(o, step)) {
		kind = z->backward_allreduce ? ONEBIT_FULL : ONEBIT_COMPRESSED;
		if (step % z->var_interval == 0 && ++z->var_counter == o->var_update_scaler) {
			z->var_counter = 0;
			z->var_interval *= 2;
		}
		z->backward_allreduce = (step + 1) % z->var_interval == 0;
	} else {
		kind = step % z->local_interval == 0 ? ONEBIT_COMPRESSED : ONEBIT_LOCAL;
		if (++z->local_counter == o->local_step_scaler) {
			z->local_counter = 0;
			z->local_interval *= 2;
			if (z->local_interval > o->local_step_clipper)
				z->local_interval = o->local_step_clipper;
		}
	}
	return kind;
}

static void zero_one_init(ZeroOne *z)
{
	*z = (ZeroOne){.var_interval = 1, .local_interval = 1, .backward_allreduce = 1};
}

/* 1-bit Adam's and LAMB's full steps (adam.py's step()): the first call is the initialisation
 * step, which returns before the switch is tested; every later step tests, after its update,
 * whether its count reached freeze_step. So steps 1..max(freeze_step, 2) all-reduce in full, the
 * first of them the initialisation step. */
static long long onebit_full_steps(const OneBitParams *o)
{
	return o->freeze_step > 2 ? o->freeze_step : 2;
}

int onebit_has_kind(int zero_one, OneBitStep k)
{
	return k != ONEBIT_LOCAL || zero_one;
}

OneBitStep onebit_step_kind(const OneBitParams *o, int zero_one, long long step)
{
	if (step <= 1)
		return ONEBIT_INIT;
	if (!zero_one)
		return step <= onebit_full_steps(o) ? ONEBIT_FULL : ONEBIT_COMPRESSED;
	ZeroOne z;
	OneBitStep kind = ONEBIT_FULL;
	zero_one_init(&z);
	for (long long k = 1; k <= step; k++)
		kind = zero_one_next(&z, o, k);
	return kind;
}

void onebit_count_steps(const OneBitParams *o, int zero_one, long long n_steps,
			long long counts[N_ONEBIT_STEPS])
{
	for (int i = 0; i < N_ONEBIT_STEPS; i++)
		counts[i] = 0;
	if (n_steps <= 0)
		return;
	if (!zero_one) {
		long long full = onebit_full_steps(o);
		counts[ONEBIT_INIT] = 1;
		counts[ONEBIT_FULL] = (full < n_steps ? full : n_steps) - 1;
		counts[ONEBIT_COMPRESSED] = n_steps - 1 - counts[ONEBIT_FULL];
		return;
	}
	ZeroOne z;
	zero_one_init(&z);
	for (long long k = 1; k <= n_steps; k++)
		counts[zero_one_next(&z, o, k)]++;
}

OneBitVolume onebit_volume(long long elems, long long n)
{
	OneBitVolume v = {0};
	if (n < 2 || elems <= 0)
		return v;
	v.padded_elems = optim_onebit_padded_elems(elems, n);
	v.chunk_elems = v.padded_elems / n;
	v.sign_bytes = v.padded_elems / 8;
	v.scale_bytes = 4 * n;
	double share = (double)(n - 1) / (double)n;
	v.wire_bytes = 2 * share * (double)(v.sign_bytes + v.scale_bytes);
	v.error_bytes = 4.0 * (double)(v.padded_elems + v.chunk_elems);
	return v;
}

/* onebit: the communication schedule of DeepSpeed's 1-bit optimizers (deepspeed/runtime/fp16/
 * onebit/: OnebitAdam, ZeroOneAdam, OnebitLamb): their optimizer params, which kind of step each
 * step of a run is (full-precision gradient all-reduce, 1-bit compressed all-reduce, local step
 * with no data-parallel exchange) and the bytes of one compressed all-reduce (runtime/comm/
 * nccl.py compressed_allreduce). It does not place buffers (plan.c), add ops (build.c) or price
 * anything (sim/). */
#ifndef PX_ONEBIT_H
#define PX_ONEBIT_H

/* The kinds of optimizer step a 1-bit optimizer's run is made of. */
typedef enum {
	ONEBIT_FULL,       /* the gradients all-reduced in full precision (warm-up; 0/1 Adam's
			      variance-update steps) */
	ONEBIT_COMPRESSED, /* a 1-bit compressed all-reduce (of the momentum, or 0/1 Adam's
			      gradient or accumulated momentum) and no gradient all-reduce */
	ONEBIT_LOCAL,      /* 0/1 Adam after var_freeze_step between synchronisations: nothing
			      exchanged over the data-parallel group */
	ONEBIT_INIT,       /* step 1, the optimizers' initialisation step (`if not
			      self.initialize` in adam.py, zoadam.py, lamb.py): the gradients
			      all-reduced in full (the engine's default), then every tensor's
			      (LAMB: the flat's) still-zero momentum put through the compressed
			      all-reduce as it sets up its error buffers, and no update */
	N_ONEBIT_STEPS
} OneBitStep;

/* "full", "compressed", "local", "init": the kinds' names in reports and metric names. */
const char *onebit_step_name(OneBitStep k);

/* The optimizer params that shape the schedule, with DeepSpeed's defaults. */
typedef struct OneBitParams {
	long long freeze_step;        /* OnebitAdam, OnebitLamb: warm-up steps (100000) */
	long long var_freeze_step;    /* ZeroOneAdam: variance frozen after this step (100000) */
	long long var_update_scaler;  /* ZeroOneAdam: variance updates per interval doubling (16) */
	long long local_step_scaler;  /* ZeroOneAdam: steps per local-interval doubling (32678) */
	long long local_step_clipper; /* ZeroOneAdam: the longest local interval (16) */
	/* OnebitLamb's coefficients: the LAMB coefficient's bounds (10, 0.01), its running
	 * average's beta (0.9), the compressed stage's factor bounds (4, 0.5) and its largest change
	 * from one step to the next (0.1) */
	double max_coeff, min_coeff, coeff_beta, factor_max, factor_min, factor_threshold;
} OneBitParams;

void onebit_params_default(OneBitParams *o);

/* Whether a run of such an optimizer (zero_one: 0/1 Adam) has steps of kind k: every one has
 * its initialisation, full and compressed steps; 0/1 Adam alone has local ones. */
int onebit_has_kind(int zero_one, OneBitStep k);

/* The kind of step `step` (1-based) of a run. Step 1 is the initialisation step. 1-bit Adam and
 * LAMB: steps 2..freeze_step full-precision, then compressed (adam.py and lamb.py switch after the step whose count reaches
 * freeze_step). 0/1 Adam (zoadam.py): up to var_freeze_step, the steps whose count is a multiple
 * of the variance interval (1, doubling after every var_update_scaler such steps) all-reduce the
 * gradient in full, the others compress it; after it, every local_step_interval-th step (1,
 * doubling every local_step_scaler steps up to local_step_clipper) compresses the accumulated
 * momentum and the others are local. zero_one: the optimizer is 0/1 Adam. */
OneBitStep onebit_step_kind(const OneBitParams *o, int zero_one, long long step);

/* Whether step `step` (1-based) of 0/1 Adam runs with its variance frozen: zoadam.py sets
 * freeze_key after the update of the first step whose count passed var_freeze_step, so from step
 * var_freeze_step + 2 on (and never step 1, the initialisation step). Its steps are then local or
 * synchronising (onebit_step_kind), and its error buffers were zeroed after the step before. */
int onebit_zero_one_frozen(const OneBitParams *o, long long step);

/* How many of steps 1..n_steps are of each kind (counts[N_ONEBIT_STEPS]), by walking the rules
 * of onebit_step_kind with their counters. */
void onebit_count_steps(const OneBitParams *o, int zero_one, long long n_steps,
			long long counts[N_ONEBIT_STEPS]);

/* One compressed all-reduce of `elems` fp32 elements over n ranks (n >= 2). The buffer is padded
 * to padded_elems (optim_onebit_padded_elems: a multiple of n lcm(n, 8)), cut into n chunks of
 * chunk_elems, one per rank. Phase 1 all-to-all's the worker's packed sign bits (chunk_elems / 8
 * bytes to each rank; payload padded / 8) and all-gathers its one fp32 scale (payload 4 n); the
 * owner of each chunk averages the n decompressed chunks, adds its server error and recompresses;
 * phase 2 all-gathers the chunks' packed signs (payload padded / 8) and their scales (4 n). */
typedef struct OneBitVolume {
	long long padded_elems, chunk_elems;
	long long sign_bytes;  /* one phase's packed signs, the whole array: padded / 8 */
	long long scale_bytes; /* one phase's scales, the whole array: 4 n */
	double wire_bytes;     /* sent by one rank over both phases (ring all-gather, pairwise
				  all-to-all: (n - 1) / n of each payload) */
	double error_bytes;    /* worker error (padded) and server error (chunk), fp32 */
} OneBitVolume;

OneBitVolume onebit_volume(long long elems, long long n);

#endif

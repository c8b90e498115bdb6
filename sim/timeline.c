#include "timeline.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/build.h"
#include "../engine/streams.h"
#include "opcost.h"
#include "opcost_cpu.h"


/* ---- the replay: state ---- */

/* Streams besides the compute stream: ZeRO-3 gathers, overlapped gradient reductions, inbound
 * copies (H2D, NVMe reads) and outbound copies (D2H, NVMe writes). */
enum { ST_PREFETCH, ST_REDUCE, ST_IN, ST_OUT, N_STREAMS };

/* What the compute stream's time is charged to; A_COMM + g for group g. */
enum {
	A_FWD, A_BWD, A_RECOMPUTE, A_OPTIMIZER, A_BUBBLE, A_OFFLOAD, A_COMM,
	N_ACC = A_COMM + N_GROUPS
};

enum { RUN_DONE, RUN_BLOCKED }; /* what executing one op did */

typedef struct Stream {
	double free_s; /* idle from then on */
	int acc;       /* charge for waiting on it: the group (or copy) of its latest op */
} Stream;

typedef struct Counters {
	double acc[N_ACC];
	double host_wait; /* of the compute charges: the GPU waiting for the host's kernel issue */
	double model_flops, hw_flops;
	long long ops;
} Counters;

/* A repeat block's state at the start of an iteration: every clock relative to the compute
 * stream's (clocks behind it cannot delay anything, so they read 0), with the charge of each. */
typedef struct Snapshot {
	double t;
	double *rel;  /* nrel */
	int *acc;     /* nrel */
	int opt_done, last_comp; /* the flags that steer later ops */
	Counters c;
} Snapshot;

typedef struct Frame {
	int begin;        /* first op of the body */
	int64_t left;     /* iterations not yet started */
	int extrapolate;  /* nothing inside couples stages: a steady state may be extrapolated */
	int have_snap;
	Snapshot snap;
} Frame;

typedef struct SendLog { /* a stage's sends in one direction, in order */
	double *end_s, *dur_s;
	long long n, cap;
} SendLog;

/* A stage's collectives among pipeline stages of one kind (engine/schedule.h's roles): the tied
 * embedding's gradients between the first and last stage, and the one-value all-reduces over
 * every stage. Each kind meets its own members, in order. */
enum { RV_TIED, RV_PIPE, N_RV };
typedef struct Rendezvous {
	int member;              /* the stage holds collectives of this kind */
	long long posted, done;  /* arrived at, and completed */
	double *arrive;          /* when it arrived at each */
	long long cap;
} Rendezvous;

typedef struct StageSim {
	const Schedule *s;
	int stage, done;
	SchedWalk w;             /* the cursor: w.i is the op under it (engine/schedule.h) */
	unsigned char *loop_cross; /* per OP_LOOP: its body holds a pipeline op */
	Frame frame;             /* the repeat block being walked (blocks do not nest) */
	double t;                /* the compute stream is free from t on */
	double last_end;         /* when the data of the latest compute or collective is ready */
	Stream st[N_STREAMS];
	int n_units;
	double *gather_ready;    /* per unit: its stage-3 gathers are done */
	int *gather_acc;
	double *in_ready;        /* per unit + 1 ([0] for unit -1): its inbound copies are done */
	int *buf_unit;           /* per buffer: the unit a gathered-parameter buffer serves, or -1 */
	int opt_done;            /* the optimizer has run: later collectives are not reductions */
	int last_comp;           /* CompKind of the latest compute: the direction of a send */
	Counters c;
	long long ops_extrapolated;
	SendLog sends[2];        /* [1] forward (to the next stage), [0] backward */
	long long recvs[2];
	Rendezvous rv[N_RV];     /* its pipeline-group collectives, by kind */
	int nrel;
	/* the 1F1B steady state (docs/time_model.md): round k is the k-th (forward, backward)
	 * pair of steps, from ops[round_at[k]]; the stage stops at the next round's first op until
	 * every stage is there */
	int *round_at;           /* rounds + 1 */
	int round;               /* the next round to stop at */
	int at_barrier;
	int have_snap;
	Snapshot snap;           /* at the previous round's start */
	long long snap_sends[2], prev_sends[2]; /* sends logged by the previous round's start, and
						   by the one before */
	long long snap_recvs[2];
} StageSim;

typedef struct Sim {
	const Plan *p;
	const HwProfile *hw;
	int full_replay;
	int n;
	StageSim *st;
	OpCostCache *dur; /* op durations, priced once each */
	int rounds;       /* steady 1F1B rounds every stage runs, 0 when none are extrapolated */
} Sim;

static int unit_slot(const StageSim *ss, int unit)
{
	return unit >= 0 && unit < ss->n_units ? unit + 1 : 0;
}

/* ---- the replay: snapshots of a repeat block ---- */

/* Every clock of the stage with its charge, in a fixed order, relative to the compute clock. */
static void state_rel(const StageSim *ss, double *rel, int *acc)
{
	int k = 0;
	for (int i = 0; i < N_STREAMS; i++, k++)
		rel[k] = ss->st[i].free_s, acc[k] = ss->st[i].acc;
	for (int u = 0; u < ss->n_units; u++, k++)
		rel[k] = ss->gather_ready[u], acc[k] = ss->gather_acc[u];
	for (int u = 0; u <= ss->n_units; u++, k++)
		rel[k] = ss->in_ready[u], acc[k] = A_OFFLOAD;
	rel[k] = ss->last_end, acc[k] = 0;
	for (k = 0; k < ss->nrel; k++)
		rel[k] = fmax(rel[k] - ss->t, 0);
}

static void state_shift(StageSim *ss, double dt)
{
	for (int i = 0; i < N_STREAMS; i++)
		ss->st[i].free_s = fmax(ss->st[i].free_s, ss->t) + dt;
	for (int u = 0; u < ss->n_units; u++)
		ss->gather_ready[u] = fmax(ss->gather_ready[u], ss->t) + dt;
	for (int u = 0; u <= ss->n_units; u++)
		ss->in_ready[u] = fmax(ss->in_ready[u], ss->t) + dt;
	ss->last_end = fmax(ss->last_end, ss->t) + dt;
	ss->t += dt;
}

static int snapshot_take(StageSim *ss, Snapshot *sn)
{
	if (!sn->rel) {
		sn->rel = malloc((size_t)ss->nrel * sizeof(*sn->rel));
		sn->acc = malloc((size_t)ss->nrel * sizeof(*sn->acc));
		if (!sn->rel || !sn->acc)
			return -1;
	}
	sn->t = ss->t;
	sn->c = ss->c;
	sn->opt_done = ss->opt_done;
	sn->last_comp = ss->last_comp;
	state_rel(ss, sn->rel, sn->acc);
	return 0;
}

/* The state now equals the snapshot's (to rounding): the next iteration repeats the last one. */
static int snapshot_same(StageSim *ss, const Snapshot *sn, double *rel, int *acc)
{
	double tol = 1e-12 * fmax(ss->t, 1);
	if (ss->opt_done != sn->opt_done || ss->last_comp != sn->last_comp)
		return 0;
	state_rel(ss, rel, acc);
	for (int k = 0; k < ss->nrel; k++) {
		if (fabs(rel[k] - sn->rel[k]) > tol)
			return 0;
		if (rel[k] > tol && acc[k] != sn->acc[k])
			return 0;
	}
	return 1;
}

/* Run the `left` iterations still to come as copies of the last one, shifted in time. */
static void extrapolate(StageSim *ss, const Frame *f)
{
	double r = (double)f->left, dt = ss->t - f->snap.t;
	for (int i = 0; i < N_ACC; i++)
		ss->c.acc[i] += r * (ss->c.acc[i] - f->snap.c.acc[i]);
	ss->c.host_wait += r * (ss->c.host_wait - f->snap.c.host_wait);
	ss->c.model_flops += r * (ss->c.model_flops - f->snap.c.model_flops);
	ss->c.hw_flops += r * (ss->c.hw_flops - f->snap.c.hw_flops);
	ss->ops_extrapolated += f->left * (ss->c.ops - f->snap.c.ops);
	state_shift(ss, r * dt);
}

/* ---- the replay: executing ops ---- */

typedef struct Dep {
	double at;
	int acc;
} Dep;

/* The compute stream waits for every dependency; each stretch of the wait is charged to the
 * dependency that ends it. */
static void wait_for(StageSim *ss, Dep *d, int n)
{
	for (int i = 1; i < n; i++) /* a handful: insertion sort by time */
		for (int j = i; j > 0 && d[j].at < d[j - 1].at; j--) {
			Dep x = d[j];
			d[j] = d[j - 1];
			d[j - 1] = x;
		}
	for (int i = 0; i < n; i++)
		if (d[i].at > ss->t) {
			ss->c.acc[d[i].acc] += d[i].at - ss->t;
			ss->t = d[i].at;
		}
}

static void wait_streams(StageSim *ss)
{
	Dep d[N_STREAMS + 1];
	for (int i = 0; i < N_STREAMS; i++)
		d[i] = (Dep){ss->st[i].free_s, ss->st[i].acc};
	d[N_STREAMS] = (Dep){ss->in_ready[0], A_OFFLOAD};
	wait_for(ss, d, N_STREAMS + 1);
}

static void run_compute(Sim *sim, StageSim *ss, const Op *op)
{
	int slot = unit_slot(ss, op->unit);
	if (op->sub == COMP_OPTIMIZER) { /* DeepSpeed synchronises every stream before the step */
		wait_streams(ss);
	} else {
		Dep d[2] = {{ss->in_ready[slot], A_OFFLOAD}, {0, A_COMM}};
		if (slot > 0)
			d[1] = (Dep){ss->gather_ready[slot - 1], ss->gather_acc[slot - 1]};
		wait_for(ss, d, 2);
	}
	double wait;
	double dur = opcost_cached_wait_s(sim->dur, sim->p, sim->hw, op, ss->stage, 0, &wait);
	static const int charge[N_COMPS] = {A_FWD, A_BWD, A_RECOMPUTE, A_OPTIMIZER, A_BWD};
	ss->c.acc[charge[op->sub < N_COMPS ? op->sub : COMP_FWD]] += dur;
	ss->c.host_wait += wait;
	ss->t += dur;
	ss->last_end = ss->t;
	ss->last_comp = op->sub;
	if (op->sub == COMP_FWD || op->sub == COMP_BWD)
		ss->c.model_flops += op->flops;
	if (op->sub != COMP_OPTIMIZER && op->sub != COMP_GRAD_ACCUM)
		ss->c.hw_flops += op->flops;
	if (op->sub == COMP_OPTIMIZER)
		ss->opt_done = 1;
}

/* The CPU executor's allocations come zeroed: their time is charged to the compute in progress
 * (forward, backward, ... as the latest compute op). */
static void run_cpu_alloc(Sim *sim, StageSim *ss, const Op *op)
{
	static const int charge[N_COMPS] = {A_FWD, A_BWD, A_RECOMPUTE, A_OPTIMIZER, A_BWD};
	double dur = opcost_cpu_alloc_s(sim->p, sim->hw, op);
	ss->t += dur;
	ss->c.acc[charge[ss->last_comp < N_COMPS ? ss->last_comp : COMP_FWD]] += dur;
}

/* Copies run on their stream from the moment they are issued; data leaving the GPU (and data a
 * unit-less copy carries, such as updated parameters) waits for the op that produced it. */
static void run_copy(Sim *sim, StageSim *ss, const Op *op)
{
	int in = op->sub == COPY_H2D || op->sub == COPY_NVME_READ;
	Stream *s = &ss->st[in ? ST_IN : ST_OUT];
	if (sim->hw->cpu) { /* the CPU executor's copies are conversions on its one thread */
		double dur = opcost_copy_s(sim->p, sim->hw, op);
		ss->t += dur;
		ss->c.acc[A_OFFLOAD] += dur;
		ss->last_end = ss->t;
		return;
	}
	double start = fmax(ss->t, s->free_s);
	if (!in || op->unit < 0)
		start = fmax(start, ss->last_end);
	s->free_s = start + opcost_copy_s(sim->p, sim->hw, op);
	s->acc = A_OFFLOAD;
	if (in) {
		double *r = &ss->in_ready[unit_slot(ss, op->unit)];
		*r = fmax(*r, s->free_s);
	}
}

/* The unit a parameter gather serves: the unit its gathered buffer was allocated for (a tied
 * head also gathers the embedding's partition, whose op names unit 0), else the op's unit. */
static int gather_target(const StageSim *ss, const Op *op)
{
	if (op->buf >= 0 && op->buf < ss->s->n_bufs && ss->buf_unit[op->buf] >= 0)
		return ss->buf_unit[op->buf];
	return op->unit;
}

/* A receive that no compute follows: a schedule error. */
static int recv_fed(const StageSim *ss)
{
	for (int i = ss->w.i + 1; i < ss->s->n; i++)
		if (ss->s->ops[i].kind == OP_COMPUTE)
			return 1;
	return 0;
}

static int log_send(SendLog *l, double end, double dur)
{
	if (l->n == l->cap) {
		long long cap = l->cap ? 2 * l->cap : 64;
		double *e = realloc(l->end_s, (size_t)cap * sizeof(*e));
		if (!e)
			return -1;
		l->end_s = e;
		double *d = realloc(l->dur_s, (size_t)cap * sizeof(*d));
		if (!d)
			return -1;
		l->dur_s = d;
		l->cap = cap;
	}
	l->end_s[l->n] = end;
	l->dur_s[l->n++] = dur;
	return 0;
}

static int run_recv(Sim *sim, StageSim *ss, const Op *op, PxError *err)
{
	int fwd = op->role == ROLE_FORWARD; /* activations from the previous stage, else gradients
					       from the next */
	if (!recv_fed(ss))
		return px_fail(err, PX_ERR_RUNTIME, "stage %d, op %d: a pipeline receive that no "
			       "compute follows", ss->stage, ss->w.i);
	int from = fwd ? (ss->stage + sim->n - 1) % sim->n : (ss->stage + 1) % sim->n;
	const SendLog *l = &sim->st[from].sends[fwd];
	long long k = ss->recvs[fwd];
	if (l->n <= k)
		return RUN_BLOCKED;
	/* the wait: first for the sender to get there (bubble), then for the bytes (pp) */
	double ready = l->end_s[k];
	if (ready > ss->t) {
		double wait = ready - ss->t, xfer = fmin(wait, l->dur_s[k]);
		ss->c.acc[A_COMM + op->group] += xfer;
		ss->c.acc[A_BUBBLE] += wait - xfer;
		ss->t = ready;
	}
	ss->recvs[fwd]++;
	return RUN_DONE;
}

static int rv_kind(const Op *op)
{
	return op->role == ROLE_TIED_GRADS ? RV_TIED : RV_PIPE;
}

/* A collective among pipeline stages (the tied embedding's gradients, a one-value all-reduce):
 * it starts when every member stage has arrived at it; waiting for the others is bubble. */
static int run_rendezvous(Sim *sim, StageSim *ss, const Op *op, int *posted, PxError *err)
{
	int kind = rv_kind(op);
	Rendezvous *rv = &ss->rv[kind];
	if (rv->posted == rv->done) {
		Dep d = {ss->in_ready[0], A_OFFLOAD};
		wait_for(ss, &d, 1);
		if (rv->posted == rv->cap) {
			long long cap = rv->cap ? 2 * rv->cap : 8;
			double *a = realloc(rv->arrive, (size_t)cap * sizeof(*a));
			if (!a)
				return px_fail(err, PX_ERR_RUNTIME, "out of memory");
			rv->arrive = a;
			rv->cap = cap;
		}
		rv->arrive[rv->posted++] = ss->t;
		*posted = 1;
	}
	long long k = rv->done;
	double start = ss->t;
	for (int q = 0; q < sim->n; q++) {
		const Rendezvous *o = &sim->st[q].rv[kind];
		if (!o->member)
			continue;
		if (o->posted <= k)
			return RUN_BLOCKED;
		start = fmax(start, o->arrive[k]);
	}
	ss->c.acc[A_BUBBLE] += start - ss->t;
	double dur = opcost_cached_s(sim->dur, sim->p, sim->hw, op, ss->stage, 1);
	ss->t = start + dur;
	ss->c.acc[A_COMM + op->group] += dur;
	ss->last_end = ss->t;
	rv->done++;
	return RUN_DONE;
}

static int run_coll(Sim *sim, StageSim *ss, const Op *op, int *posted, PxError *err)
{
	const Plan *p = sim->p;
	int acc = A_COMM + op->group;
	SchedCollClass k = sched_coll_class(p, op);
	if (k == SCC_RECV)
		return run_recv(sim, ss, op, err);
	if (k == SCC_RENDEZVOUS)
		return run_rendezvous(sim, ss, op, posted, err);
	if (k == SCC_BARRIER)
		wait_streams(ss);
	int slot = unit_slot(ss, k == SCC_PREFETCH ? gather_target(ss, op) : op->unit);

	int fwd = ss->last_comp == COMP_FWD;
	double dur = opcost_cached_s(sim->dur, sim->p, sim->hw, op, ss->stage, fwd);
	/* on a stream of its own from the moment it is issued; not on the CPU executor, where MPI
	 * moves a started collective's bytes only inside MPI calls on the one thread (its wait) */
	if (sched_coll_overlaps(k) && !sim->hw->cpu) {
		Stream *s = &ss->st[k == SCC_PREFETCH ? ST_PREFETCH : ST_REDUCE];
		double start = fmax(fmax(ss->t, s->free_s), ss->in_ready[slot]);
		s->free_s = start + dur;
		s->acc = acc;
		if (k == SCC_REDUCE) {
			ss->last_end = s->free_s;
		} else if (slot > 0 && s->free_s > ss->gather_ready[slot - 1]) {
			ss->gather_ready[slot - 1] = s->free_s;
			ss->gather_acc[slot - 1] = acc;
		}
		return RUN_DONE;
	}
	/* on the compute stream (Megatron's sends are synchronous too), after the copies bringing
	 * its data in: the unit's own and unit-less ones (updated parameters) */
	Dep d = {fmax(ss->in_ready[slot], ss->in_ready[0]), A_OFFLOAD};
	wait_for(ss, &d, 1);
	ss->t += dur;
	ss->c.acc[acc] += dur;
	ss->last_end = ss->t;
	if (k == SCC_SEND && log_send(&ss->sends[fwd], ss->t, dur))
		return px_fail(err, PX_ERR_RUNTIME, "out of memory");
	return RUN_DONE;
}

/* ---- the replay: one stage ---- */

/* A repeat block begins: when nothing in it couples stages, remember the state, so that its
 * steady state can be extrapolated. */
static int loop_begin(Sim *sim, StageSim *ss, const Op *op, PxError *err)
{
	Frame *f = &ss->frame;
	f->extrapolate = op->count > 1 && !sim->full_replay && !ss->loop_cross[ss->w.i];
	f->have_snap = 0;
	if (f->extrapolate) {
		if (snapshot_take(ss, &f->snap))
			return px_fail(err, PX_ERR_RUNTIME, "out of memory");
		f->have_snap = 1;
	}
	return 0;
}

/* An iteration (ss->w.iter) ended: when the state repeats the last iteration's start, the
 * iterations left are copies of it, extrapolated, and the walk leaves the block. */
static int loop_end(StageSim *ss, double *rel, int *acc, PxError *err)
{
	Frame *f = &ss->frame;
	f->left = ss->w.count - 1 - ss->w.iter;
	if (f->left > 0 && f->extrapolate) {
		if (f->have_snap && snapshot_same(ss, &f->snap, rel, acc)) {
			extrapolate(ss, f);
			sched_walk_leave(&ss->w);
		} else if (snapshot_take(ss, &f->snap)) {
			return px_fail(err, PX_ERR_RUNTIME, "out of memory");
		} else {
			f->have_snap = 1;
		}
	}
	return 0;
}

/* Run stage ss until it ends or waits for another stage. Returns 1 when it made progress, 0
 * when it could not, -1 on error. */
static int stage_advance(Sim *sim, StageSim *ss, double *rel, int *acc, PxError *err)
{
	int progress = 0;
	while (!ss->done) {
		if (sim->rounds && ss->round < sim->rounds && ss->w.i == ss->round_at[ss->round]) {
			ss->at_barrier = 1; /* replay() moves it on when every stage is here */
			return progress;
		}
		int i = sched_walk_op(&ss->w, err);
		if (i == SCHED_WALK_ERROR)
			return -1;
		if (i == SCHED_WALK_END) {
			wait_streams(ss); /* the step ends when every stream is idle */
			ss->done = 1;
			return 1;
		}
		const Op *op = &ss->s->ops[i];
		int rc = RUN_DONE, posted = 0;
		switch (op->kind) {
		case OP_LOOP:
			if (loop_begin(sim, ss, op, err))
				return -1;
			sched_walk_advance(&ss->w);
			progress = 1;
			continue;
		case OP_END_LOOP:
			if (loop_end(ss, rel, acc, err))
				return -1;
			sched_walk_advance(&ss->w);
			progress = 1;
			continue;
		case OP_COMPUTE:
			run_compute(sim, ss, op);
			break;
		case OP_COPY:
			run_copy(sim, ss, op);
			break;
		case OP_ALLOC:
			if (sim->hw->cpu)
				run_cpu_alloc(sim, ss, op);
			break;
		case OP_COLL:
			rc = run_coll(sim, ss, op, &posted, err);
			break;
		default: /* allocations and frees take no time */
			break;
		}
		if (rc < 0)
			return -1;
		if (rc == RUN_BLOCKED)
			return progress || posted;
		ss->c.ops += op->kind != OP_ALLOC && op->kind != OP_FREE;
		sched_walk_advance(&ss->w);
		progress = 1;
	}
	return progress;
}

/* ---- the replay: set-up ---- */

/* Match repeat blocks and note which hold pipeline ops (they couple stages, so their iterations
 * are never extrapolated), whether the stage holds a pipeline-group collective, and the unit
 * each gathered-parameter buffer serves: one pass, since a long schedule's ops stream from
 * memory at every pass. */
static int stage_scan(StageSim *ss, PxError *err)
{
	const Schedule *s = ss->s;
	int open = -1; /* the repeat block the scan is in (the walk checks that they pair) */
	(void)err;
	for (int i = 0; i < s->n; i++) {
		const Op *op = &s->ops[i];
		if (op->kind == OP_LOOP) {
			open = i;
		} else if (op->kind == OP_END_LOOP) {
			open = -1;
		} else if (op->kind == OP_COLL && op->group == GROUP_PP) {
			if (open >= 0)
				ss->loop_cross[open] = 1;
			if (op->sub != COLL_P2P && op->sub != COLL_P2P_RECV && i >= s->step_begin)
				ss->rv[rv_kind(op)].member = 1;
		} else if (op->kind == OP_ALLOC && op->what == BUF_GATHERED && op->buf >= 0 &&
			   op->buf < s->n_bufs) {
			ss->buf_unit[op->buf] = op->unit;
		}
	}
	return 0;
}

static int stage_init(StageSim *ss, const Plan *p, const Schedule *s, int stage, PxError *err)
{
	memset(ss, 0, sizeof(*ss));
	ss->s = s;
	ss->stage = stage;
	sched_walk_init(&ss->w, s, s->step_begin); /* the set-up runs once, before any step, and
							takes no time */
	ss->last_comp = COMP_FWD;
	ss->n_units = p->n_units;
	ss->nrel = N_STREAMS + 2 * p->n_units + 2;
	for (int i = 0; i < N_STREAMS; i++)
		ss->st[i].acc = i < ST_IN ? A_COMM : A_OFFLOAD;
	ss->loop_cross = calloc((size_t)s->n + 1, 1);
	ss->gather_ready = calloc((size_t)p->n_units + 1, sizeof(double));
	ss->gather_acc = calloc((size_t)p->n_units + 1, sizeof(int));
	ss->in_ready = calloc((size_t)p->n_units + 1, sizeof(double));
	ss->buf_unit = malloc(((size_t)s->n_bufs + 1) * sizeof(int));
	if (!ss->loop_cross || !ss->gather_ready || !ss->gather_acc ||
	    !ss->in_ready || !ss->buf_unit)
		return px_fail(err, PX_ERR_RUNTIME, "out of memory");
	for (int u = 0; u < p->n_units; u++)
		ss->gather_acc[u] = A_COMM + GROUP_DP;
	for (int b = 0; b < s->n_bufs; b++)
		ss->buf_unit[b] = -1;
	return stage_scan(ss, err);
}

static void stage_free(StageSim *ss)
{
	free(ss->loop_cross);
	free(ss->gather_ready);
	free(ss->gather_acc);
	free(ss->in_ready);
	free(ss->buf_unit);
	for (int d = 0; d < 2; d++) {
		free(ss->sends[d].end_s);
		free(ss->sends[d].dur_s);
	}
	for (int k = 0; k < N_RV; k++)
		free(ss->rv[k].arrive);
	free(ss->round_at);
	free(ss->snap.rel);
	free(ss->snap.acc);
	free(ss->frame.snap.rel);
	free(ss->frame.snap.acc);
}

/* ---- the replay: the pipeline's steady state ---- */

/* Two ops take the same time from the same state: the fields the replay reads (ALLOC and FREE
 * take none; a gather's buffer enters only through the unit it serves). */
static int op_same_timing(const StageSim *ss, const Op *a, const Op *b)
{
	if (a->kind != b->kind)
		return 0;
	if (a->kind == OP_ALLOC || a->kind == OP_FREE)
		return 1;
	int ga = a->kind == OP_COLL ? gather_target(ss, a) : 0;
	int gb = b->kind == OP_COLL ? gather_target(ss, b) : 0;
	/* count and flops share a word with offset, which timing does not read: each is compared
	 * for the one kind that holds it (0 on both sides for every other kind) */
	if (a->kind == OP_LOOP && a->count != b->count)
		return 0;
	if (a->kind == OP_COMPUTE && memcmp(&a->flops, &b->flops, sizeof(a->flops)))
		return 0;
	/* nranks shares a word with a compute's micro-batch, which timing does not read */
	if (a->kind == OP_COLL && a->nranks != b->nranks)
		return 0;
	return a->sub == b->sub && a->group == b->group && a->unit == b->unit && ga == gb &&
	       !memcmp(&a->bytes, &b->bytes, sizeof(a->bytes));
}

/* Round k of the stage holds the same ops as round j: same length, same timing, nothing that
 * couples stages other than sends and receives, and every receive followed by a compute inside
 * the round (a receive's direction is read from the next compute). */
static int round_same(const StageSim *ss, int j, int k)
{
	const Op *ops = ss->s->ops;
	int a = ss->round_at[j], b = ss->round_at[k], n = ss->round_at[j + 1] - a;
	if (ss->round_at[k + 1] - b != n)
		return 0;
	int need_compute = 0;
	for (int i = 0; i < n; i++) {
		const Op *x = &ops[a + i];
		if (!op_same_timing(ss, x, &ops[b + i]))
			return 0;
		if (x->kind == OP_LOOP || x->kind == OP_END_LOOP ||
		    (x->kind == OP_COLL && x->group == GROUP_PP && x->sub != COLL_P2P &&
		     x->sub != COLL_P2P_RECV))
			return 0;
		if (x->kind == OP_COLL && x->sub == COLL_P2P_RECV)
			need_compute = 1;
		else if (x->kind == OP_COMPUTE)
			need_compute = 0;
	}
	return !need_compute;
}

/* The first round from `from` on that does not hold the last round's ops on some stage
 * (sim->rounds when none): how far the last round may be repeated. */
static int rounds_alike(const Sim *sim, int from)
{
	int end = sim->rounds;
	for (int k = 0; k < sim->n; k++)
		for (int r = from; r < end; r++)
			if (!round_same(&sim->st[k], from - 1, r)) {
				end = r;
				break;
			}
	return end;
}

/* Find the rounds: plain 1F1B with m >= pp + 2 micro-batches, where stage s warms up with
 * w = pp - s - 1 forwards and then runs m - w (forward, backward) pairs; every stage runs the
 * first m - pp + 1 of its pairs in the same rounds. Leaves sim->rounds 0 where the shortcut
 * does not apply. */
static int steady_init(Sim *sim)
{
	const Plan *p = sim->p;
	long long pp = sim->n, m = p->m;
	sim->rounds = 0;
	if (sim->full_replay || pp < 2 || p->par.schedule != PIPE_1F1B ||
	    p->par.virtual_stages != 1 || m < pp + 2)
		return 0;
	int rounds = (int)(m - pp + 1);
	for (int k = 0; k < sim->n; k++) {
		StageSim *ss = &sim->st[k];
		long long w = pp - k - 1;
		if (ss->s->n_steps != 2 * m)
			return 0;
		ss->round_at = malloc(((size_t)rounds + 1) * sizeof(int));
		if (!ss->round_at)
			return -1;
		for (int r = 0; r <= rounds; r++) /* round `rounds` begins where the last one ends */
			ss->round_at[r] = ss->s->step_at[w + 2 * r];
	}
	sim->rounds = rounds;
	return 0;
}

static int all_at_barrier(const Sim *sim)
{
	for (int k = 0; k < sim->n; k++)
		if (!sim->st[k].at_barrier)
			return 0;
	return 1;
}

static void steady_off(Sim *sim)
{
	sim->rounds = 0;
	for (int k = 0; k < sim->n; k++)
		sim->st[k].at_barrier = 0;
}

/* The sends stage ss logged in the round just ended repeat those of the round before, dt
 * later. */
static int sends_repeat(const StageSim *ss, double dt, double tol)
{
	for (int d = 0; d < 2; d++) {
		const SendLog *l = &ss->sends[d];
		long long a = ss->prev_sends[d], b = ss->snap_sends[d], n = b - a;
		if (l->n - b != n)
			return 0;
		for (long long i = 0; i < n; i++)
			if (fabs(l->end_s[b + i] - (l->end_s[a + i] + dt)) > tol ||
			    fabs(l->dur_s[b + i] - l->dur_s[a + i]) > tol)
				return 0;
	}
	return 1;
}

/* Every stage starts this round in the state it started the last one in, dt later, the same
 * dt everywhere, and the sends still travelling repeat too: every later round of the same ops
 * repeats the last one, dt later (the argument in docs/time_model.md). Rounds of the same ops
 * take the same receives and log the same sends, so only their times need comparing. */
static int steady_repeats(Sim *sim, double *rel, int *acc, double *dt)
{
	const StageSim *s0 = &sim->st[0];
	*dt = s0->t - s0->snap.t;
	for (int k = 0; k < sim->n; k++) {
		StageSim *ss = &sim->st[k];
		double tol = 1e-12 * fmax(ss->t, 1);
		if (!ss->have_snap || fabs((ss->t - ss->snap.t) - *dt) > tol ||
		    !snapshot_same(ss, &ss->snap, rel, acc) || !sends_repeat(ss, *dt, tol))
			return 0;
	}
	return 1;
}

/* Run rounds round..end-1 as copies of the last one: counters, clocks, the sends they log (each
 * dt after the last round's) and the receives they take; the stages then stand at round end,
 * with no snapshot to compare the next one with yet. */
static int steady_skip(Sim *sim, double dt, int end)
{
	for (int k = 0; k < sim->n; k++) {
		StageSim *ss = &sim->st[k];
		long long r = end - ss->round;
		Frame f = {.left = r, .snap = ss->snap};
		for (int d = 0; d < 2; d++) {
			SendLog *l = &ss->sends[d];
			long long b = ss->snap_sends[d], n = l->n - b;
			for (long long i = 1; i <= r; i++)
				for (long long j = 0; j < n; j++)
					if (log_send(l, l->end_s[b + j] + (double)i * dt, l->dur_s[b + j]))
						return -1;
			ss->recvs[d] += r * (ss->recvs[d] - ss->snap_recvs[d]);
			ss->snap_sends[d] = l->n;
		}
		extrapolate(ss, &f);
		sched_walk_seek(&ss->w, ss->round_at[end]);
		ss->round = end;
		ss->have_snap = 0;
	}
	return 0;
}

/* Every stage stands at the start of the same round: when the state repeats, extrapolate up to
 * the first round whose ops differ from the last one's; else remember the state and go on. */
static int steady_round(Sim *sim, double *rel, int *acc)
{
	double dt;
	int round = sim->st[0].round, end = round;
	if (steady_repeats(sim, rel, acc, &dt))
		end = rounds_alike(sim, round);
	if (end > round) {
		if (steady_skip(sim, dt, end))
			return -1;
	} else {
		for (int k = 0; k < sim->n; k++) {
			StageSim *ss = &sim->st[k];
			if (snapshot_take(ss, &ss->snap))
				return -1;
			ss->have_snap = 1;
			for (int d = 0; d < 2; d++) {
				ss->prev_sends[d] = ss->snap_sends[d];
				ss->snap_sends[d] = ss->sends[d].n;
				ss->snap_recvs[d] = ss->recvs[d];
			}
			ss->round++;
		}
	}
	for (int k = 0; k < sim->n; k++)
		sim->st[k].at_barrier = 0;
	return 0;
}

/* ---- the replay: all stages ---- */

static int fail_stuck(const Sim *sim, PxError *err)
{
	for (int k = 0; k < sim->n; k++) {
		const StageSim *ss = &sim->st[k];
		if (ss->done)
			continue;
		const Op *op = &ss->s->ops[ss->w.i];
		return px_fail(err, PX_ERR_RUNTIME, "pipeline stages wait on each other forever: "
			       "stage %d is stuck at op %d (%s over %s) with %lld forward and %lld "
			       "backward receives done", k, ss->w.i, coll_name(op->sub),
			       group_name(op->group), ss->recvs[1], ss->recvs[0]);
	}
	return px_fail(err, PX_ERR_RUNTIME, "pipeline stages wait on each other forever");
}

/* Advance the stages in turn until all end; a pass in which none moves is a deadlock. Passes
 * alternate direction so that activations (down) and gradients (up) both travel in one pass. */
static int replay(Sim *sim, PxError *err)
{
	int nrel_max = 0;
	for (int k = 0; k < sim->n; k++)
		if (sim->st[k].nrel > nrel_max)
			nrel_max = sim->st[k].nrel;
	double *rel = malloc((size_t)nrel_max * sizeof(*rel));
	int *acc = malloc((size_t)nrel_max * sizeof(*acc));
	int rc = 0;
	if (!rel || !acc) {
		rc = px_fail(err, PX_ERR_RUNTIME, "out of memory");
		goto out;
	}
	for (int pass = 0;; pass++) {
		int all_done = 1, progress = 0;
		for (int i = 0; i < sim->n; i++) {
			StageSim *ss = &sim->st[pass % 2 ? sim->n - 1 - i : i];
			int r = ss->done ? 0 : stage_advance(sim, ss, rel, acc, err);
			if (r < 0) {
				rc = -1;
				goto out;
			}
			progress |= r;
			all_done &= ss->done;
		}
		if (all_done)
			break;
		if (sim->rounds && all_at_barrier(sim)) {
			if (steady_round(sim, rel, acc)) {
				rc = px_fail(err, PX_ERR_RUNTIME, "out of memory");
				goto out;
			}
			continue;
		}
		if (!progress && sim->rounds) { /* never expected: drop the stops, replay in full */
			steady_off(sim);
			continue;
		}
		if (!progress) {
			rc = fail_stuck(sim, err);
			goto out;
		}
	}
out:
	free(rel);
	free(acc);
	return rc;
}

/* ---- results ---- */

static void breakdown_of(const Counters *c, TimeBreakdown *b)
{
	memset(b, 0, sizeof(*b));
	b->fwd_s = c->acc[A_FWD];
	b->bwd_s = c->acc[A_BWD];
	b->recompute_s = c->acc[A_RECOMPUTE];
	b->optimizer_s = c->acc[A_OPTIMIZER];
	b->compute_s = b->fwd_s + b->bwd_s + b->recompute_s + b->optimizer_s;
	b->host_wait_s = c->host_wait;
	for (int g = 0; g < N_GROUPS; g++)
		b->comm_s[g] = c->acc[A_COMM + g];
	b->bubble_s = c->acc[A_BUBBLE];
	b->offload_stall_s = c->acc[A_OFFLOAD];
}

static int summarise(const Sim *sim, TimeResult *out, PxError *err)
{
	const Plan *p = sim->p;
	out->n_stages = sim->n;
	out->stages = calloc((size_t)sim->n, sizeof(*out->stages));
	if (!out->stages)
		return px_fail(err, PX_ERR_RUNTIME, "out of memory");
	for (int k = 0; k < sim->n; k++) {
		const StageSim *ss = &sim->st[k];
		StageTime *st = &out->stages[k];
		st->end_s = ss->t;
		breakdown_of(&ss->c, &st->bd);
		st->model_flops = ss->c.model_flops;
		st->hw_flops = ss->c.hw_flops;
		st->ops = ss->c.ops;
		st->ops_extrapolated = ss->ops_extrapolated;
		out->model_flops_per_gpu += st->model_flops / sim->n;
		out->hw_flops_per_gpu += st->hw_flops / sim->n;
		if (st->end_s > out->stages[out->slowest].end_s)
			out->slowest = k;
	}
	out->step_s = out->stages[out->slowest].end_s;
	out->breakdown = out->stages[out->slowest].bd;
	if (!isfinite(out->step_s))
		return px_fail(err, PX_ERR_INPUT, "%s: the step takes forever: a bandwidth it needs "
			       "is 0 in the cluster (hbm_GBps, nvlink_GBps, network_GBps_per_gpu, "
			       "pcie_GBps or nvme_GBps_per_node) or in the hardware profile",
			       p->sc->path);
	out->tokens_per_step = (double)p->sc->ds.train_batch * (double)p->sc->seq;
	out->peak_flops_per_gpu = sim->hw->cpu ? opcost_cpu_peak(p, sim->hw) : opcost_dtype_peak(p);
	if (out->step_s > 0) {
		out->tokens_per_s = out->tokens_per_step / out->step_s;
		out->tflops_per_gpu = out->model_flops_per_gpu / out->step_s / 1e12;
		out->hw_tflops_per_gpu = out->hw_flops_per_gpu / out->step_s / 1e12;
		out->mfu = out->model_flops_per_gpu / (out->step_s * out->peak_flops_per_gpu);
		out->hfu = out->hw_flops_per_gpu / (out->step_s * out->peak_flops_per_gpu);
	}
	return 0;
}

static int check_peaks(const Plan *p, const HwProfile *hw, PxError *err)
{
	const GpuSpec *g = &p->sc->cluster.gpu;
	if (hw->cpu)
		return opcost_cpu_check(p, hw, err);
	if (p->sc->backend == BACKEND_CPU)
		return px_fail(err, PX_ERR_INPUT, "backend cpu: no CPU hardware profile (a GPU's "
			       "profile cannot time the CPU executor): `parallax calibrate --backend "
			       "cpu` measures this machine into one");
	if (p->sc->attention == ATTN_FLASH && (hw->flash_fwd <= 0 || hw->flash_bwd <= 0))
		return px_fail(err, PX_ERR_INPUT, "%s: attention: \"flash\" cannot be timed on %s: its "
			       "hardware profile's compute.flash_forward and flash_backward must be above "
			       "0 (FlashAttention-2 needs an Ampere or newer GPU); use attention "
			       "\"eager\" or a --hw profile that gives them", p->sc->path, g->name);
	if (opcost_dtype_peak(p) > 0)
		return 0;
	Dtype dt = opcost_compute_dtype(p);
	const char *key = dt == DT_BF16 ? "tflops_bf16" : dt == DT_FP16 ? "tflops_fp16" : "tflops_fp32";
	return px_fail(err, PX_ERR_INPUT, "%s: cluster.%s: %s has no %s peak, which the time model "
		       "needs for %s training; set cluster.%s or train in another precision",
		       p->sc->path, key, g->name, dtype_name(dt), dtype_name(dt), key);
}

int timeline_run_opts(const Plan *p, Schedule *const *stages, const HwProfile *hw,
		      const TimelineOpts *opts, TimeResult *out, PxError *err)
{
	Sim sim = {.p = p, .hw = hw, .full_replay = opts && opts->full_replay,
		   .n = (int)p->par.pp};
	int rc = -1;

	memset(out, 0, sizeof(*out));
	if (check_peaks(p, hw, err))
		return -1;
	if (sim.n < 1)
		return px_fail(err, PX_ERR_RUNTIME, "timeline: a plan without pipeline stages");
	sim.st = calloc((size_t)sim.n, sizeof(*sim.st));
	sim.dur = opcost_cache_create();
	if (!sim.st || !sim.dur) {
		free(sim.st);
		opcost_cache_destroy(sim.dur);
		return px_fail(err, PX_ERR_RUNTIME, "out of memory");
	}
	for (int k = 0; k < sim.n; k++)
		if (stage_init(&sim.st[k], p, stages[k], k, err))
			goto out_free;
	if (steady_init(&sim)) {
		px_fail(err, PX_ERR_RUNTIME, "out of memory");
		goto out_free;
	}
	if (replay(&sim, err) || summarise(&sim, out, err))
		goto out_free;
	rc = 0;
out_free:
	for (int k = 0; k < sim.n; k++)
		stage_free(&sim.st[k]);
	free(sim.st);
	opcost_cache_destroy(sim.dur);
	if (rc)
		timeline_result_free(out);
	return rc;
}

int timeline_run(const Plan *p, Schedule *const *stages, const HwProfile *hw, TimeResult *out,
		 PxError *err)
{
	return timeline_run_opts(p, stages, hw, NULL, out, err);
}

void timeline_result_free(TimeResult *r)
{
	if (!r)
		return;
	free(r->stages);
	memset(r, 0, sizeof(*r));
}

void timeline_train_cost(const TimeResult *r, double tokens, long long world, double *seconds,
			 double *gpu_hours)
{
	double s = r->tokens_per_s > 0 ? tokens / r->tokens_per_s : INFINITY;
	if (seconds)
		*seconds = s;
	if (gpu_hours)
		*gpu_hours = s * (double)world / 3600.0;
}

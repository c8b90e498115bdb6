#include "memory.h"

#include <string.h>

typedef struct Replay {
	MemResult *out;
	double live[N_PLACES];
	double cat[N_PLACES][N_CATS];
	MemTimelineFn fn;
	void *ctx;
} Replay;

static void apply(Replay *r, int i, int iteration, const Op *op, const Op *freed)
{
	if (op->kind == OP_ALLOC) {
		r->live[op->place] += op->bytes;
		r->cat[op->place][op->cat] += op->bytes;
		MemPlace *mp = &r->out->place[op->place];
		if (r->cat[op->place][op->cat] > mp->cat_peak[op->cat])
			mp->cat_peak[op->cat] = r->cat[op->place][op->cat];
		if (r->live[op->place] > mp->peak_bytes) {
			mp->peak_bytes = r->live[op->place];
			mp->peak_op = i;
			memcpy(mp->at_peak, r->cat[op->place], sizeof(mp->at_peak));
		}
	} else if (freed) {
		r->live[freed->place] -= freed->bytes;
		r->cat[freed->place][freed->cat] -= freed->bytes;
	}
	if (r->fn)
		r->fn(r->ctx, i, iteration, op, r->live);
}

/* The walk (engine/schedule.h) checks each op and follows the buffers; allocations and frees
 * move the live bytes. A balanced body (it frees what it allocates) repeats the same curve, so
 * one pass shows its peak unless the caller wants every iteration. */
int sim_memory(Schedule *s, MemResult *out, MemTimelineFn fn, void *ctx, PxError *err)
{
	Replay r = {.out = out, .fn = fn, .ctx = ctx};
	double before[N_PLACES] = {0};
	SchedBufs b;
	SchedWalk w;
	const Op *freed;
	int i;

	memset(out, 0, sizeof(*out));
	if (sched_bufs_init(&b, s, err))
		return -1;
	sched_walk_init(&w, s, 0);
	while ((i = sched_walk_op(&w, err)) >= 0) {
		int stop = sched_walk_run(&w);
		for (int k = i; k < stop; k++) {
			if (sched_bufs_step(&b, &w, k, &freed, err))
				goto out;
			apply(&r, k, (int)w.iter, &s->ops[k], freed);
		}
		if (stop > i) {
			sched_walk_skip_to(&w, stop);
			continue;
		}
		if (s->ops[i].kind == OP_END_LOOP && !memcmp(before, r.live, sizeof(before)) && !fn)
			sched_walk_leave(&w);
		memcpy(before, r.live, sizeof(before));
		if (sched_bufs_step(&b, &w, i, &freed, err))
			goto out;
		sched_walk_advance(&w);
	}
out:
	sched_bufs_free(&b);
	s->valid = i == SCHED_WALK_END;
	if (!s->valid)
		return -1;
	memcpy(out->end_bytes, r.live, sizeof(out->end_bytes));
	return 0;
}

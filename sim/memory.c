#include "memory.h"

#include <stdlib.h>
#include <string.h>

typedef struct Replay {
	MemResult *out;
	int mispredict;       /* a BufWhat whose bytes the replay halves (a test hook), else -1 */
	double live[N_PLACES];
	double cat[N_PLACES][N_CATS];
	MemTimelineFn fn;
	void *ctx;
} Replay;

/* The bytes the replay counts for an allocation. */
static double alloc_bytes(const Replay *r, const Op *a)
{
	return a->what == r->mispredict ? a->bytes / 2 : a->bytes;
}

static void apply(Replay *r, int i, int iteration, const Op *op, const Op *freed)
{
	if (op->kind == OP_ALLOC) {
		r->live[op->place] += alloc_bytes(r, op);
		r->cat[op->place][op->cat] += alloc_bytes(r, op);
		MemPlace *mp = &r->out->place[op->place];
		if (r->cat[op->place][op->cat] > mp->cat_peak[op->cat])
			mp->cat_peak[op->cat] = r->cat[op->place][op->cat];
		if (r->live[op->place] > mp->peak_bytes) {
			mp->peak_bytes = r->live[op->place];
			mp->peak_op = i;
			mp->peak_iter = iteration;
			memcpy(mp->at_peak, r->cat[op->place], sizeof(mp->at_peak));
		}
	} else if (freed) {
		r->live[freed->place] -= alloc_bytes(r, freed);
		r->cat[freed->place][freed->cat] -= alloc_bytes(r, freed);
	}
	if (r->fn)
		r->fn(r->ctx, i, iteration, op, r->live);
}

/* The walk (engine/schedule.h) checks each op and follows the buffers; allocations and frees
 * move the live bytes. A balanced body (it frees what it allocates) repeats the same curve, so
 * one pass shows its peak unless the caller wants every iteration. */
int sim_memory(Schedule *s, MemResult *out, MemTimelineFn fn, void *ctx, PxError *err)
{
	Replay r = {.out = out, .fn = fn, .ctx = ctx, .mispredict = -1};
	double before[N_PLACES] = {0};
	const char *hook = getenv("PARALLAX_TEST_MISPREDICT"); /* docs/testing.md: tests only */
	for (int w = 0; hook && w < N_BUFS; w++)
		if (!strcmp(hook, buf_name((BufWhat)w)))
			r.mispredict = w;
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

#include "memory.h"

#include <stdlib.h>
#include <string.h>

typedef struct Replay {
	const Schedule *s;
	MemResult *out;
	double live[N_PLACES];
	double cat[N_PLACES][N_CATS];
	char *is_live;        /* per buffer id */
	const Op **alloc_of;  /* per buffer id: its ALLOC op */
	MemTimelineFn fn;
	void *ctx;
} Replay;

static int apply(Replay *r, int i, int iteration, PxError *err)
{
	const Op *op = &r->s->ops[i];
	if (op->kind == OP_ALLOC) {
		if (r->is_live[op->buf])
			return px_fail(err, PX_ERR_RUNTIME, "schedule op %d allocates buffer %d twice", i,
				       op->buf);
		r->is_live[op->buf] = 1;
		r->alloc_of[op->buf] = op;
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
	} else if (op->kind == OP_FREE) {
		if (op->buf < 0 || op->buf >= r->s->n_bufs || !r->is_live[op->buf])
			return px_fail(err, PX_ERR_RUNTIME, "schedule op %d frees buffer %d, which is "
				       "not live", i, op->buf);
		const Op *a = r->alloc_of[op->buf];
		r->is_live[op->buf] = 0;
		r->live[a->place] -= a->bytes;
		r->cat[a->place][a->cat] -= a->bytes;
	}
	if (r->fn)
		r->fn(r->ctx, i, iteration, op, r->live);
	return 0;
}

static int find_end(const Schedule *s, int begin)
{
	for (int i = begin + 1; i < s->n; i++)
		if (s->ops[i].kind == OP_END_LOOP)
			return i;
		else if (s->ops[i].kind == OP_LOOP)
			return -1; /* nested loops are not part of the vocabulary */
	return -1;
}

static int replay(Replay *r, PxError *err)
{
	const Schedule *s = r->s;
	for (int i = 0; i < s->n; i++) {
		const Op *op = &s->ops[i];
		if (op->kind == OP_END_LOOP)
			return px_fail(err, PX_ERR_RUNTIME, "schedule op %d ends a loop never begun", i);
		if (op->kind != OP_LOOP) {
			if (apply(r, i, 0, err))
				return -1;
			continue;
		}
		int end = find_end(s, i);
		if (end < 0)
			return px_fail(err, PX_ERR_RUNTIME, "schedule op %d: loop without its end", i);
		for (int64_t it = 0; it < op->count; it++) {
			double before[N_PLACES];
			memcpy(before, r->live, sizeof(before));
			for (int j = i + 1; j < end; j++)
				if (apply(r, j, (int)it, err))
					return -1;
			if (!memcmp(before, r->live, sizeof(before)) && !r->fn)
				break; /* a balanced body repeats the same curve: one pass shows its peak */
		}
		i = end;
	}
	return 0;
}

int sim_memory(const Schedule *s, MemResult *out, MemTimelineFn fn, void *ctx, PxError *err)
{
	Replay r = {.s = s, .out = out, .fn = fn, .ctx = ctx};
	int rc = -1;

	memset(out, 0, sizeof(*out));
	r.is_live = calloc((size_t)s->n_bufs + 1, 1);
	r.alloc_of = calloc((size_t)s->n_bufs + 1, sizeof(*r.alloc_of));
	if (!r.is_live || !r.alloc_of) {
		px_fail(err, PX_ERR_RUNTIME, "out of memory");
		goto out;
	}
	if (replay(&r, err))
		goto out;
	memcpy(out->end_bytes, r.live, sizeof(out->end_bytes));
	rc = 0;
out:
	free(r.is_live);
	free(r.alloc_of);
	return rc;
}

#include "moment.h"

#include <stdio.h>

static const char *const PHASE_NAMES[N_PHASES] = {
	[PHASE_SETUP] = "set-up", [PHASE_FORWARD] = "forward", [PHASE_RECOMPUTE] = "recompute",
	[PHASE_BACKWARD] = "backward", [PHASE_GRAD_REDUCE] = "gradient reduce",
	[PHASE_OPTIMIZER] = "optimizer step", [PHASE_AFTER_STEP] = "parameter update",
};

static const PeakPhase PHASE_OF_COMP[N_COMPS] = {
	[COMP_FWD] = PHASE_FORWARD, [COMP_BWD] = PHASE_BACKWARD,
	[COMP_RECOMPUTE] = PHASE_RECOMPUTE, [COMP_OPTIMIZER] = PHASE_OPTIMIZER,
	[COMP_GRAD_ACCUM] = PHASE_BACKWARD,
};

const char *moment_phase_name(PeakPhase ph)
{
	return ph < N_PHASES ? PHASE_NAMES[ph] : "?";
}

const char *moment_unit_name(const Plan *p, int unit, char *buf, size_t n)
{
	if (unit < 0)
		snprintf(buf, n, "-");
	else if (unit == 0)
		snprintf(buf, n, "embedding");
	else if (unit == p->n_units - 1)
		snprintf(buf, n, "head");
	else
		snprintf(buf, n, "layer %d", unit);
	return buf;
}

/* The first compute op after op in [op+1, hi), or the last before it in [lo, op); NULL if none. */
static const Op *next_compute(const Schedule *s, int op, int hi)
{
	for (int i = op + 1; i < hi; i++)
		if (s->ops[i].kind == OP_COMPUTE)
			return &s->ops[i];
	return NULL;
}

static const Op *prev_compute(const Schedule *s, int op, int lo)
{
	for (int i = op - 1; i >= lo; i--)
		if (s->ops[i].kind == OP_COMPUTE)
			return &s->ops[i];
	return NULL;
}

/* The schedule allocates a unit's buffers before its compute, so an allocation serves the next
 * compute of its stretch (the repeat block's body, or the ops outside it); a unit's gradient
 * buffers come after its backward: one of those before the optimizer's compute is the gradient
 * reduce, and one after the last compute of its stretch belongs to that compute. */
void moment_find(const Plan *p, const Schedule *s, const MemResult *mem, Place pl,
		 PeakMoment *out)
{
	const MemPlace *mp = &mem->place[pl];
	int op = mp->peak_op, loop = -1, end = -1;
	*out = (PeakMoment){.op = op, .unit = -1, .micro_batches = (int)p->m, .what = -1};
	if (op < 0 || op >= s->n)
		return;
	const Op *a = &s->ops[op];
	out->what = a->kind == OP_ALLOC ? a->what : -1;
	if (op < s->step_begin) {
		out->phase = PHASE_SETUP;
		return;
	}
	/* the micro-batches' block holding op (some schedules run them in several: DDP's no_sync
	 * ones and its last, FSDP's first, middle and last, hpZ's first and the rest), or the
	 * first block when op is outside them all; `before`: the micro-batches of the blocks
	 * before it */
	long long before = 0, counted = 0;
	for (int i = s->step_begin; i < s->n; i++) {
		if (s->ops[i].kind == OP_LOOP) {
			if (loop >= 0 && op < i)
				break;
			loop = i, before = counted, counted += s->ops[i].count;
		} else if (s->ops[i].kind == OP_END_LOOP) {
			end = i;
			if (op < i)
				break;
		}
	}
	int in_loop = loop >= 0 && op > loop && op < end;
	int lo = in_loop ? loop + 1 : (loop >= 0 && op > end ? end + 1 : s->step_begin);
	int hi = in_loop ? end : (loop >= 0 && op < loop ? loop : s->n);
	const Op *next = next_compute(s, op, hi), *prev = prev_compute(s, op, lo);
	int unit = a->kind == OP_ALLOC ? a->unit : -1;
	const Op *c = next ? next : prev;
	/* the gradients cast for their reduction, or stage 0's engine bucket flattened */
	int cast = (out->what == BUF_COMM_CAST || out->what == BUF_REDUCE_FLAT) && unit < 0;
	if (next && next->sub == COMP_OPTIMIZER)
		out->phase = unit >= 0 || cast ? PHASE_GRAD_REDUCE : PHASE_OPTIMIZER;
	else if (!next && prev && prev->sub == COMP_OPTIMIZER)
		out->phase = PHASE_AFTER_STEP;
	else
		out->phase = c ? PHASE_OF_COMP[c->sub] : PHASE_OPTIMIZER;
	if (out->phase == PHASE_OPTIMIZER || out->phase == PHASE_AFTER_STEP || cast)
		return;
	if (out->phase == PHASE_GRAD_REDUCE)
		c = prev;
	out->unit = unit >= 0 ? unit : c ? c->unit : -1;
	if (in_loop) { /* every micro-batch runs the body in the same buffers */
		out->micro_batch = (int)before + mp->peak_iter + 1;
		out->repeats = out->micro_batch < out->micro_batches;
	} else if (c) { /* a pipelined stage's ops state their micro-batch */
		out->micro_batch = (a->kind == OP_ALLOC && a->mb > 0 ? a->mb : c->mb) + 1;
	}
}

void moment_describe(const Plan *p, const PeakMoment *m, char *buf, size_t n)
{
	char unit[32], mb[96] = "";
	moment_unit_name(p, m->unit, unit, sizeof(unit));
	if (m->micro_batch > 0)
		snprintf(mb, sizeof(mb), ", micro-batch %d of %d%s", m->micro_batch,
			 m->micro_batches, m->repeats ? " (each later one repeats it)" : "");
	snprintf(buf, n, "%s%s%s%s%s%s", moment_phase_name(m->phase), m->unit >= 0 ? " of " : "",
		 m->unit >= 0 ? unit : "", mb, m->what >= 0 ? ", allocating " : "",
		 m->what >= 0 ? buf_name((BufWhat)m->what) : "");
}

#include "schedule.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

void sched_init(Schedule *s, int rank)
{
	memset(s, 0, sizeof(*s));
	s->rank = rank;
}

void sched_free(Schedule *s)
{
	if (!s)
		return;
	free(s->ops);
	free(s->step_at);
	sched_init(s, s->rank);
}

int sched_reserve(Schedule *s, long long n)
{
	if (n <= s->cap)
		return 0;
	if (n > INT_MAX / 2)
		return -1;
	Op *grown = realloc(s->ops, (size_t)n * sizeof(*grown));
	if (!grown)
		return -1;
	s->ops = grown;
	s->cap = (int)n;
	return 0;
}

int sched_mark_step(Schedule *s)
{
	if (s->n_steps == s->cap_steps) {
		int cap = s->cap_steps ? 2 * s->cap_steps : 64;
		int *grown = realloc(s->step_at, (size_t)cap * sizeof(*grown));
		if (!grown)
			return -1;
		s->step_at = grown;
		s->cap_steps = cap;
	}
	s->step_at[s->n_steps++] = s->n;
	return 0;
}

static Op *push(Schedule *s, OpKind kind)
{
	if (s->n == s->cap) {
		int cap = s->cap ? 2 * s->cap : 256;
		Op *grown = realloc(s->ops, (size_t)cap * sizeof(*grown));
		if (!grown)
			return NULL;
		s->ops = grown;
		s->cap = cap;
	}
	Op *op = &s->ops[s->n++];
	memset(op, 0, sizeof(*op));
	op->kind = (uint8_t)kind;
	op->unit = -1;
	op->buf = -1;
	return op;
}

int sched_alloc(Schedule *s, Place place, MemCat cat, BufWhat what, int unit, double bytes,
		int *buf)
{
	Op *op = push(s, OP_ALLOC);
	if (!op)
		return -1;
	op->place = (uint8_t)place;
	op->cat = (uint8_t)cat;
	op->what = (uint8_t)what;
	op->unit = unit;
	op->bytes = bytes;
	op->buf = s->n_bufs++;
	if (buf)
		*buf = op->buf;
	return 0;
}

int sched_free_buf(Schedule *s, int buf)
{
	Op *op = push(s, OP_FREE);
	if (!op)
		return -1;
	op->buf = buf;
	return 0;
}

int sched_compute(Schedule *s, CompKind kind, int unit, double flops, double bytes)
{
	Op *op = push(s, OP_COMPUTE);
	if (!op)
		return -1;
	op->sub = (uint8_t)kind;
	op->unit = unit;
	op->flops = flops;
	op->bytes = bytes;
	return 0;
}

int sched_coll(Schedule *s, CollKind kind, CommGroup group, int nranks, int unit, int64_t elems,
	       int elem_bytes, int buf, int64_t offset)
{
	Op *op = push(s, OP_COLL);
	if (!op)
		return -1;
	op->sub = (uint8_t)kind;
	op->group = (uint8_t)group;
	op->nranks = nranks;
	op->unit = unit;
	op->elems = elems;
	op->elem_bytes = (uint8_t)elem_bytes;
	op->buf = buf;
	op->offset = offset;
	op->bytes = (double)elems * elem_bytes;
	return 0;
}

int sched_copy(Schedule *s, CopyDir dir, int unit, double bytes)
{
	Op *op = push(s, OP_COPY);
	if (!op)
		return -1;
	op->sub = (uint8_t)dir;
	op->unit = unit;
	op->bytes = bytes;
	op->buf = -1;
	return 0;
}

int sched_copy_reduced(Schedule *s, CopyDir dir, int unit, double bytes, int buf, int64_t offset,
		       int64_t elems)
{
	if (sched_copy(s, dir, unit, bytes))
		return -1;
	Op *op = &s->ops[s->n - 1];
	op->buf = buf;
	op->offset = offset;
	op->elems = elems;
	return 0;
}

int sched_loop(Schedule *s, int64_t count)
{
	Op *op = push(s, OP_LOOP);
	if (!op)
		return -1;
	op->count = count;
	return 0;
}

int sched_end_loop(Schedule *s)
{
	return push(s, OP_END_LOOP) ? 0 : -1;
}

/* ---- names ---- */

#define NAME_OF(table, i) ((unsigned)(i) < sizeof(table) / sizeof(table[0]) ? table[i] : "?")

const char *place_name(Place p)
{
	static const char *const n[] = {"gpu", "cpu", "nvme"};
	return NAME_OF(n, p);
}

const char *cat_name(MemCat c)
{
	static const char *const n[] = {"params", "grads", "optimizer", "activations", "buffers",
					"overhead"};
	return NAME_OF(n, c);
}

const char *coll_name(CollKind k)
{
	static const char *const n[] = {"all_gather", "reduce_scatter", "all_reduce", "all_to_all",
					"broadcast", "p2p", "p2p_recv"};
	return NAME_OF(n, k);
}

const char *group_name(CommGroup g)
{
	static const char *const n[] = {"dp", "tp", "pp", "ep", "hpz", "edp", "node", "xnode"};
	return NAME_OF(n, g);
}

const char *buf_name(BufWhat w)
{
	static const char *const n[] = {
		"cuda_context", "cublas_workspace", "nccl_buffers", "loss_scaler", "params",
		"param_partition", "persistent_params", "gathered_params", "grads", "grad_partition",
		"fp32_grad_partition", "unit_grads", "master_params", "optimizer_states",
		"reduce_bucket", "activations", "checkpoint", "ends_activations", "swap_buffers",
		"secondary_params", "persistent_grads", "unit_fp32", "hidden", "scratch",
		"error_feedback", "optimizer_step_temp"};
	return NAME_OF(n, w);
}

const char *comp_name(CompKind k)
{
	static const char *const n[] = {"forward", "backward", "recompute", "optimizer"};
	return NAME_OF(n, k);
}

const char *copy_name(CopyDir d)
{
	static const char *const n[] = {"h2d", "d2h", "nvme_read", "nvme_write"};
	return NAME_OF(n, d);
}

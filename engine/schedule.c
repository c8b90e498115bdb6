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
	free(s->slices);
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
	s->valid = 0;
	op->kind = (uint8_t)kind;
	op->unit = -1;
	op->buf = -1;
	op->slice = -1;
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
	op->role = (uint8_t)(kind == COMP_FWD ? ROLE_FORWARD :
			     kind == COMP_BWD || kind == COMP_GRAD_ACCUM ? ROLE_BACKWARD :
			     kind == COMP_RECOMPUTE ? ROLE_RECOMPUTE : ROLE_OPTIMIZER);
	op->unit = unit;
	op->flops = flops;
	op->bytes = bytes;
	return 0;
}

int sched_coll(Schedule *s, CollKind kind, OpRole role, CommGroup group, int nranks, int unit,
	       int64_t elems, int elem_bytes, int buf, int64_t offset)
{
	Op *op = push(s, OP_COLL);
	if (!op)
		return -1;
	op->sub = (uint8_t)kind;
	op->role = (uint8_t)role;
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

int sched_copy(Schedule *s, CopyDir dir, OpRole role, int unit, double bytes)
{
	Op *op = push(s, OP_COPY);
	if (!op)
		return -1;
	op->sub = (uint8_t)dir;
	op->role = (uint8_t)role;
	op->unit = unit;
	op->bytes = bytes;
	op->buf = -1;
	return 0;
}

int sched_copy_reduced(Schedule *s, CopyDir dir, int unit, double bytes, int buf, int64_t offset,
		       int64_t elems)
{
	if (sched_copy(s, dir, ROLE_GRAD_REDUCE, unit, bytes))
		return -1;
	Op *op = &s->ops[s->n - 1];
	op->buf = buf;
	op->offset = offset;
	op->elems = elems;
	return 0;
}

int sched_set_slice(Schedule *s, int bucket, int64_t part_off, int64_t part_elems)
{
	if (s->n_slices == s->cap_slices) {
		int cap = s->cap_slices ? 2 * s->cap_slices : 64;
		SchedSlice *grown = realloc(s->slices, (size_t)cap * sizeof(*grown));
		if (!grown)
			return -1;
		s->slices = grown;
		s->cap_slices = cap;
	}
	s->slices[s->n_slices] = (SchedSlice){.bucket = bucket, .cast = -1, .cast_send = -1,
					      .part_off = part_off, .part_elems = part_elems};
	s->ops[s->n - 1].slice = s->n_slices++;
	s->valid = 0;
	return 0;
}

void sched_set_cast(Schedule *s, int buf, int send)
{
	SchedSlice *sl = &s->slices[s->ops[s->n - 1].slice];
	sl->cast = buf;
	sl->cast_send = send;
	s->valid = 0;
}

void sched_grads_to(Schedule *s, int buf, int64_t off)
{
	s->ops[s->n - 1].buf = buf;
	s->ops[s->n - 1].elems = off;
	s->valid = 0;
}

void sched_set_role(Schedule *s, OpRole role)
{
	s->ops[s->n - 1].role = (uint8_t)role;
	s->valid = 0;
}

void sched_set_mb(Schedule *s, int mb)
{
	s->ops[s->n - 1].mb = mb;
	s->valid = 0;
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

/* ---- walking ---- */

void sched_walk_init(SchedWalk *w, const Schedule *s, int from)
{
	memset(w, 0, sizeof(*w));
	w->s = s;
	w->i = from;
	w->body = w->end = -1;
}

void sched_walk_seek(SchedWalk *w, int i)
{
	sched_walk_init(w, w->s, i);
}

/* Which field of op (not a block marker) is out of range, for the message. */
static const char *op_fault(const Schedule *s, const Op *op)
{
	if (op->kind > OP_END_LOOP)
		return "an unknown kind";
	if (op->role >= N_ROLES)
		return "an unknown role";
	if (op->buf < -1 || op->buf >= s->n_bufs || ((op->kind == OP_ALLOC ||
						     op->kind == OP_FREE) && op->buf < 0))
		return "a buffer id outside the schedule's buffers";
	if (op->slice < -1 || op->slice >= s->n_slices)
		return "a slice outside the schedule's slices";
	if ((op->kind == OP_ALLOC || op->kind == OP_COMPUTE) && op->mb < 0)
		return "a negative micro-batch";
	if (op->kind == OP_ALLOC)
		return op->place >= N_PLACES ? "an unknown place" : op->cat >= N_CATS ?
		       "an unknown memory category" : op->what >= N_BUFS ? "an unknown buffer kind" :
		       "a negative size";
	if (op->kind == OP_COLL)
		return op->sub >= N_COLLS ? "an unknown collective" : op->group >= N_GROUPS ?
		       "an unknown group" : op->nranks < 1 ? "a group of no ranks" :
		       "a negative element count";
	return op->kind == OP_COMPUTE ? "an unknown compute kind" : "an unknown copy direction";
}

int sched_walk_check(SchedWalk *w, PxError *err)
{
	const Schedule *s = w->s;
	int i = w->i;
	w->err = err;
	if (i >= s->n) {
		px_fail(err, PX_ERR_RUNTIME, "schedule op %d begins a repeat block that never ends",
			w->body - 1);
		return SCHED_WALK_ERROR;
	}
	const Op *op = &s->ops[i];
	if (op->kind == OP_LOOP) {
		if (w->body == i + 1) /* looked at again before the walk moved on */
			return i;
		if (w->body >= 0) {
			px_fail(err, PX_ERR_RUNTIME, "schedule op %d begins a repeat block inside the "
				"one op %d begins: blocks do not nest", i, w->body - 1);
			return SCHED_WALK_ERROR;
		}
		if (op->count < 0) {
			px_fail(err, PX_ERR_RUNTIME, "schedule op %d: a repeat block of %lld "
				"iterations", i, (long long)op->count);
			return SCHED_WALK_ERROR;
		}
		for (int j = i + 1; j < s->n; j++) {
			if (s->ops[j].kind == OP_LOOP) {
				px_fail(err, PX_ERR_RUNTIME, "schedule op %d begins a repeat block inside "
					"the one op %d begins: blocks do not nest", j, i);
				return SCHED_WALK_ERROR;
			}
			if (s->ops[j].kind == OP_END_LOOP) {
				w->body = i + 1, w->end = j, w->count = op->count;
				return i;
			}
		}
		px_fail(err, PX_ERR_RUNTIME, "schedule op %d begins a repeat block that never ends", i);
		return SCHED_WALK_ERROR;
	}
	if (op->kind == OP_END_LOOP) {
		if (w->end != i) {
			px_fail(err, PX_ERR_RUNTIME, "schedule op %d ends a repeat block never begun", i);
			return SCHED_WALK_ERROR;
		}
		return i;
	}
	if (sched_op_ok(s, op))
		return i;
	px_fail(err, PX_ERR_RUNTIME, "schedule op %d (%s) has %s", i, op_kind_name(op->kind),
		op_fault(s, op));
	return SCHED_WALK_ERROR;
}

int sched_bufs_init(SchedBufs *b, const Schedule *s, PxError *err)
{
	memset(b, 0, sizeof(*b));
	b->live = calloc((size_t)s->n_bufs + 1, 1);
	b->seen = calloc((size_t)s->n_bufs + 1, 1);
	b->alloc_of = calloc((size_t)s->n_bufs + 1, sizeof(*b->alloc_of));
	if (b->live && b->seen && b->alloc_of)
		return 0;
	sched_bufs_free(b);
	return px_fail(err, PX_ERR_RUNTIME, "out of memory");
}

void sched_bufs_free(SchedBufs *b)
{
	free(b->live);
	free(b->seen);
	free(b->alloc_of);
	memset(b, 0, sizeof(*b));
}

/* The slow path of sched_bufs_step: the message naming op i. */
int sched_bufs_fail(const SchedBufs *b, const SchedWalk *w, int i, PxError *err)
{
	const Op *op = &w->s->ops[i];
	if (op->kind == OP_ALLOC)
		return px_fail(err, PX_ERR_RUNTIME, "schedule op %d allocates buffer %d again", i,
			       op->buf);
	if (op->kind == OP_FREE)
		return px_fail(err, PX_ERR_RUNTIME, "schedule op %d frees buffer %d, which is not "
			       "live", i, op->buf);
	if (op->kind == OP_END_LOOP)
		return px_fail(err, PX_ERR_RUNTIME, "schedule op %d ends a repeat block whose body "
			       "leaves %d buffer(s) more live than it found", i,
			       b->n_live - b->live_at_loop);
	return px_fail(err, PX_ERR_RUNTIME, "schedule op %d (%s) works on buffer %d, which is not "
		       "live", i, op_kind_name(op->kind), op->buf);
}

void sched_bufs_renew(SchedBufs *b, const Schedule *s)
{
	for (int k = 0; k < s->n_bufs; k++)
		b->seen[k] = (char)(b->seen[k] && b->live[k]);
}

int sched_validate(Schedule *s, PxError *err)
{
	SchedBufs b;
	SchedWalk w;
	const Op *freed;
	int i;
	if (sched_bufs_init(&b, s, err))
		return -1;
	s->valid = 0; /* check every field, whatever an earlier walk found */
	sched_walk_init(&w, s, 0);
	for (; (i = sched_walk_op(&w, err)) >= 0; sched_walk_advance(&w)) { /* op by op: checked */
		if (s->ops[i].kind == OP_END_LOOP) /* each body once */
			sched_walk_leave(&w);
		if (sched_bufs_step(&b, &w, i, &freed, err))
			goto out;
	}
out:
	sched_bufs_free(&b);
	s->valid = i == SCHED_WALK_END;
	return s->valid ? 0 : -1;
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
					"overhead", "workspace"};
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

int buf_empty(BufWhat w)
{
	return w == BUF_REDUCE_BUCKET;
}

const char *buf_name(BufWhat w)
{
	static const char *const n[] = {
		"cuda_context", "cublas_workspace", "nccl_buffers", "loss_scaler", "params",
		"param_partition", "persistent_params", "gathered_params", "grads", "grad_partition",
		"fp32_grad_partition", "unit_grads", "master_params", "optimizer_states",
		"reduce_bucket", "activations", "checkpoint", "ends_activations", "swap_buffers",
		"secondary_params", "persistent_grads", "unit_fp32", "hidden", "scratch",
		"error_feedback", "optimizer_step_temp", "unit_fp32_grads", "pipe_input",
		"pipe_output", "pipe_grad", "pipe_input_grad", "sp_grads", "attention_scores",
		"kv_cache", "quant_scales", "dequant_weight", "load_staging",
		"grad_flat", "swapped_grads", "expert_grads", "param_swap_buffers", "swapped_params",
		"gpu_offload_temp", "cpu_offload_temp", "accumulated_cpu_grads",
		"offload_grad_copy", "tied_grads", "flattened_bucket", "lp_grads", "lp_upcast", "comm_cast",
		"ddp_buckets", "loss_transients", "extra_large_grads",
		"autocast_weights", "exec_comm_cast", "fsdp_unsharded_grads", "fsdp_reduced_shard",
		"fsdp_all_gather_output", "fsdp_post_forward_shard", "fsdp_root_grads"};
	return NAME_OF(n, w);
}

const char *comp_name(CompKind k)
{
	static const char *const n[] = {"forward", "backward", "recompute", "optimizer",
					"grad_accum"};
	return NAME_OF(n, k);
}

const char *op_kind_name(OpKind k)
{
	static const char *const n[] = {"alloc", "free", "compute", "collective", "copy", "loop",
					"end_loop"};
	return NAME_OF(n, k);
}

const char *role_name(OpRole r)
{
	static const char *const n[] = {"none", "forward", "recompute", "backward", "prefetch",
					"grad_reduce", "overflow", "grad_norm", "optimizer",
					"param_update", "tied_grads", "weight_load", "prefill",
					"decode", "onebit_signs", "onebit_scales",
					"onebit_server_signs", "onebit_server_scales"};
	return NAME_OF(n, r);
}

const char *copy_name(CopyDir d)
{
	static const char *const n[] = {"h2d", "d2h", "nvme_read", "nvme_write"};
	return NAME_OF(n, d);
}

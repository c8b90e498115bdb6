/* runner_fsdp: the runner's FSDP. Each unit's gradient shard bound where its reductions' slices
 * go and the update reads, autograd's cat of a unit's gradients into its flat, and that flat kept
 * across micro-batches under no_sync. HYBRID_SHARD's all-reduce across nodes and the reduced
 * slices' way into the shards are runner_coll.c's. */
#include "runner_int.h"

/* ---- FSDP (Plan.fsdp; engine/build_fsdp.c) ---- */

/* Where the flat gradient unit u's reduction reads starts: its own flat (the root's last unit's
 * lies in its first unit's, after the first's own elements); NULL when none is live. */
static void *fsdp_flat_of(const Runner *r, int u)
{
	int root_tail = u == r->p->n_units - 1;
	int id = r->u_flat[root_tail ? 0 : u];
	return id < 0 ? NULL : at(r->buf[id], root_tail ? r->p->units[0].own_gather : 0, r->gdt);
}

/* One rank: the builder adds no reduce-scatter over a group of one (build_priv.h coll), so unit u's
 * shard takes its flat's elements itself, added in (as the reduction's slice would be). */
static void fsdp_local_reduce(Runner *r, int u)
{
	void *flat = fsdp_flat_of(r, u);
	if (r->n == 1 && flat && r->u_shard[u] >= 0)
		add_into(r, r->buf[r->u_shard[u]], flat, r->gdt, (size_t)r->p->units[u].part_dense,
			 DT_FP32);
}

/* Unit u's gradient shard (buffer id, -1 once freed): where its reductions' slices go
 * (runner_consume) and what the update reads (its segment's gradients). */
void runner_fsdp_bind(Runner *r, int u, int id)
{
	r->u_shard[u] = id;
	for (int i = 0; i < r->n_segs && !r->offload; i++) /* CPUOffload: the host's (segments) */
		if (r->segs[i].part_off == r->p->units[u].part_off)
			r->segs[i].grads = id >= 0 ? r->buf[id] : NULL;
	if (id >= 0)
		fsdp_local_reduce(r, u);
}

/* Autograd's cat of unit u's tensors' gradients (its BUF_UNIT_GRADS, laid as its flat) into the
 * flat's gradient, the padding zero; the root's (unit 0's) after its first unit's the head's
 * own, and the head's share of the tied token embedding added into the embedding's (unit 0's
 * first tensor). */
int runner_fsdp_cat(Runner *r, const Op *op, void *flat, size_t bytes, PxError *err)
{
	int u = op->unit, h = r->head, g = u >= 0 ? r->u_grads[u] : -1;
	int gh = u == 0 ? r->u_grads[h] : -1;
	long long cap = (long long)(bytes / dt_bytes(r->gdt)), own = (long long)unit_params(r, h);
	long long n = g >= 0 ? (long long)(r->size[g] / dt_bytes(r->gdt)) : 0;
	long long at_h = u == 0 ? r->p->units[0].own_gather : 0, vc = (long long)tied_elems(r);
	if (g < 0 || n > cap || (u == 0 && (gh < 0 || at_h + own > cap || vc > n)))
		return px_fail(err, PX_ERR_RUNTIME, "schedule allocation of %s for unit %d: its "
			       "gradients are in no live buffer, or do not fit it",
			       buf_name(op->what), u);
	r->cb->zero(r->cx, op->place, flat, bytes);
	r->cb->convert(r->cx, flat, r->gdt, r->buf[g], r->gdt, (size_t)n);
	if (u == 0) {
		r->cb->convert(r->cx, at(flat, at_h, r->gdt), r->gdt, r->buf[gh], r->gdt, (size_t)own);
		add_into(r, flat, at(r->buf[gh], own, r->gdt), r->gdt, (size_t)vc, r->gdt);
	}
	r->u_flat[u] = op->buf;
	return 0;
}

/* FSDP's COMP_GRAD_ACCUM: under no_sync, the unit's newest flat gradient added into the one kept
 * (the op's buffer), which its reduction reads from then on; into a shard, the reduction's slice
 * went already (runner_consume), or on one rank goes now. */
void runner_fsdp_accumulate(Runner *r, const Op *op)
{
	int u = op->unit;
	if (op->buf < 0 || u < 0)
		return;
	if (r->alloc_of[op->buf]->what != BUF_FSDP_UNSHARDED) {
		fsdp_local_reduce(r, u);
		return;
	}
	int src = r->u_flat[u];
	if (src >= 0 && src != op->buf)
		add_into(r, r->buf[op->buf], r->buf[src], r->gdt,
			 r->size[op->buf] / dt_bytes(r->gdt), r->gdt);
	r->u_flat[u] = op->buf;
}

/* runner_nvme: ZeRO-Infinity's optimizer on NVMe (offload_optimizer.device "nvme", stage 3), run
 * for real: the schedule's NVMe buffers (the fp32 master weights, the optimizer's states, the
 * swapped fp32 gradients) are files (swapfile.h); the host's swap buffer (BUF_SWAP) stages them
 * while the step updates them, a sub-group at a time (each op states the sub-group's range), as
 * DeepSpeed's partitioned_optimizer_swapper does; the swap buffer is buffer_count slots of the
 * largest sub-group. The copies move the bytes with pread and pwrite:
 * - NVMe write of the gradients (at the accumulation boundary): the host's gradient partition
 *   into its file in fp32 (stage3.py swap_out_gradients);
 * - NVMe read before a sub-group's update: its master weights, moments and gradients into their
 *   slots (swap_in_optimizer_state), which are poisoned first, so that only what the files held
 *   is read;
 * - NVMe write after it: its master weights and moments back to their files.
 * Parameters on NVMe (offload_param.device "nvme"): DeepSpeed keeps the partition's first
 * sub-groups in a pinned host flat of offload_param.max_in_cpu elements (engine/plan.c
 * plan_param_host) and the rest in a swap file of the parameters' own nvme_path. Here the host
 * flat is BUF_PARAM_PART and the rest the file (BUF_PARAM_SWAP):
 * - NVMe read before a unit's gather: the unit's swapped slice into the parameter swapper's
 *   buffers (BUF_PARAM_STAGING, poisoned first), from which its all-gather (or, on one rank, its
 *   copy) takes this rank's piece;
 * - NVMe write after a swapped sub-group's update: its parameters, rounded from the master
 *   weights through the same buffers, into the file (stage3.py _partitioned_params_swap_out). */
#include <string.h>
#include <strings.h>

#include "runner_int.h"

static const char OPT_PATH_KEY[] = "zero_optimization.offload_optimizer.nvme_path";
static const char PARAM_PATH_KEY[] = "zero_optimization.offload_param.nvme_path";

/* Whether stage s of p swaps part of its parameter partition to NVMe. */
static int swaps_params(const Plan *p, int s)
{
	return p->param_place == PLACE_NVME && p->stages[s].param_resident < p->stages[s].part_elems;
}

/* The fp32 tensors the update stages, each a sub-group's: the master weights (the optimizer is
 * on NVMe at ZeRO-3 only, whose optimizer keeps them in fp32 training too: Plan.master_bytes),
 * Adam's two moments, the gradients. */
enum { STAGED_TENSORS = 4 };

const char *runner_nvme_supported(const Plan *p)
{
	const DsZero *z = &p->sc->ds.zero;
	if (p->opt_place != PLACE_NVME && p->param_place != PLACE_NVME)
		return NULL;
	if (p->sc->backend != BACKEND_CPU)
		return "NVMe offload on backend \"cpu\" only (its swap buffers are the host's memory, "
		       "read and written with pread and pwrite)";
	for (int s = 0; s < p->par.pp; s++) {
		if (!swaps_params(p, s))
			continue;
		double room = (double)z->offload_param.buffer_count * z->offload_param.buffer_size;
		for (int u = 0; u < p->n_units; u++) {
			long long off[2], len[2];
			plan_gather_slices(p, u, off, len);
			if (p->units[u].stage == s && (double)(len[0] + len[1]) > room)
				return "parameters swapped to NVMe where offload_param.buffer_count x "
				       "buffer_size elements hold every unit's partition slice (the "
				       "swapper's buffers take a unit's swapped parameters at once)";
		}
	}
	if (p->opt_place != PLACE_NVME)
		return NULL;
	if (strcasecmp(p->sc->ds.optimizer, "Adam") && strcasecmp(p->sc->ds.optimizer, "AdamW"))
		return "the optimizer on NVMe with Adam or AdamW (DeepSpeedCPUAdam)";
	if (z->offload_optimizer.buffer_count < STAGED_TENSORS)
		return "the optimizer on NVMe with offload_optimizer.buffer_count 4 or more (master "
		       "weights, two moments and gradients staged at once)";
	return NULL;
}

static int probe(const Plan *p, const char *root, const char *key, PxError *err)
{
	SwapDir d;
	PxError why;
	if (swap_open(&d, root, "probe", key, -1, &why))
		return px_fail(err, why.code, "%s: %s", p->sc->path, why.msg);
	swap_close(&d);
	return 0;
}

int runner_nvme_check_path(const Plan *p, PxError *err)
{
	const DsZero *z = &p->sc->ds.zero;
	int params = 0;
	for (int s = 0; s < p->par.pp; s++)
		params |= swaps_params(p, s);
	if (p->opt_place == PLACE_NVME && probe(p, z->offload_optimizer.nvme_path, OPT_PATH_KEY, err))
		return -1;
	return params ? probe(p, z->offload_param.nvme_path, PARAM_PATH_KEY, err) : 0;
}

int runner_nvme_alloc(Runner *r, const Op *op, size_t bytes, PxError *err)
{
	const DsZero *z = &r->p->sc->ds.zero;
	int params = op->what == BUF_PARAM_SWAP; /* in the parameters' directory */
	SwapDir *d = params ? &r->pswap : &r->swap;
	if (!d->path[0]) {
		int rank = r->world ? comm_rank(r->world) : r->rank;
		if (swap_open(d, params ? z->offload_param.nvme_path : z->offload_optimizer.nvme_path,
			      params ? "params" : "optimizer", params ? PARAM_PATH_KEY : OPT_PATH_KEY,
			      rank, err))
			return -1;
	}
	int f = swap_create(d, bytes, err);
	if (f < 0)
		return -1;
	switch (op->what) {
	case BUF_MASTER: r->sw_master = f, r->id_master = op->buf; break;
	case BUF_OPT_STATES: r->sw_states = f, r->id_states = op->buf; break;
	case BUF_GRAD_SWAP: r->sw_grads = f, r->id_gradswap = op->buf; break;
	case BUF_PARAM_SWAP: r->sw_params = f, r->id_pswap = op->buf; break;
	default:
		return px_fail(err, PX_ERR_RUNTIME, "the CPU executor keeps no %s on NVMe",
			       buf_name(op->what));
	}
	arena_count(&r->arena, PLACE_NVME, op->cat, (double)bytes);
	r->size[op->buf] = bytes;
	r->alloc_of[op->buf] = op;
	return 0;
}

void runner_nvme_free(Runner *r, int id)
{
	const Op *a = r->alloc_of[id];
	arena_count(&r->arena, PLACE_NVME, a->cat, -(double)r->size[id]);
	r->buf[id] = NULL;
}

size_t runner_nvme_staging_bytes(const Runner *r)
{
	/* DeepSpeed's pool: buffer_count buffers of the largest sub-group's fp32 tensor */
	return (size_t)r->p->sc->ds.zero.offload_optimizer.buffer_count *
	       (size_t)r->st->step_elems * 4;
}

int runner_nvme_stage(Runner *r, void *swap, size_t bytes, PxError *err)
{
	long long slot = r->st->step_elems;
	size_t need = (size_t)STAGED_TENSORS * (size_t)slot * 4;
	if (r->id_master < 0 || r->id_states < 0 || r->id_gradswap < 0 || need > bytes)
		return px_fail(err, PX_ERR_RUNTIME, "the NVMe swap buffer (%zu bytes) cannot stage "
			       "a sub-group's master weights, moments and gradients (%zu bytes)", bytes,
			       need);
	float *slots = swap;
	r->buf[r->id_master] = slots;
	r->buf[r->id_states] = slots + slot; /* the first moment, then the second */
	r->nv_grads = slots + 3 * slot;
	r->nv_slot = slot;
	return 0;
}

/* n bytes between buf and file f of d from byte off, written or read. */
static int move(SwapDir *d, int write, int f, size_t off, void *buf, size_t n, PxError *err)
{
	return write ? swap_write(d, f, off, buf, n, err) : swap_read(d, f, off, buf, n, err);
}

/* Elements lo .. hi - 1 of the master weights and the two moments between their slots and
 * files (the moments' file: the first moment of the partition, then the second). */
static int move_state(Runner *r, int write, long long lo, long long hi, PxError *err)
{
	size_t n = 4 * (size_t)(hi - lo), off = 4 * (size_t)lo;
	size_t second = 4 * (size_t)r->st->part_elems + off;
	float *m = r->buf[r->id_states], *v = m + r->nv_slot;
	return move(&r->swap, write, r->sw_master, off, r->buf[r->id_master], n, err) ||
			       move(&r->swap, write, r->sw_states, off, m, n, err) ||
			       move(&r->swap, write, r->sw_states, second, v, n, err) ? -1 : 0;
}

/* The gradient partition (the host's, in the accumulation dtype) into its file in fp32, a slot
 * at a time through the swap buffer's gradient slot (DeepSpeed swaps out fp32 copies of the
 * boundary's gradient partitions: stage3.py partition_grads, swap_out_gradients). */
static int write_grads(Runner *r, PxError *err)
{
	long long part = r->st->part_elems;
	for (long long a = 0; a < part; a += r->nv_slot) {
		long long n = part - a < r->nv_slot ? part - a : r->nv_slot;
		to_f32(r, r->nv_grads, at(r->buf[r->id_gradpart], a, r->gdt), (size_t)n, r->gdt);
		if (swap_write(&r->swap, r->sw_grads, 4 * (size_t)a, r->nv_grads, 4 * (size_t)n, err))
			return -1;
	}
	return 0;
}

/* ---- parameters beyond the host flat ---- */

static size_t pbytes(const Runner *r, long long n)
{
	return dt_bytes(r->pdt) * (size_t)n;
}

/* Partition elements off .. off + n - 1 (all at or beyond r->resident) to or from the file. */
static int param_file(Runner *r, int write, long long off, void *host, long long n, PxError *err)
{
	if (r->id_pswap < 0 || !r->pstage)
		return px_fail(err, PX_ERR_RUNTIME, "schedule op: parameters on NVMe moved before "
			       "their swap file and buffers are allocated");
	return move(&r->pswap, write, r->sw_params, pbytes(r, off - r->resident), host,
		    pbytes(r, n), err);
}

/* Forget what the swapper's buffers hold. */
static void unstage(Runner *r)
{
	memset(r->staged, 0, sizeof(r->staged));
}

/* Of partition elements off .. off + n - 1, how many from off lie in the host flat. */
static long long in_flat(const Runner *r, long long off, long long n)
{
	return off >= r->resident ? 0 : off + n <= r->resident ? n : r->resident - off;
}

int runner_nvme_params_into(const Runner *r, long long off, long long n, void *dst)
{
	long long mem = in_flat(r, off, n);
	long long lo = off + mem, hi = off + n, at_elem = 0; /* the rest: staged? */
	const void *from = NULL;
	for (int k = 0; k < 2 && hi > lo; at_elem += r->staged[k].hi - r->staged[k].lo, k++)
		if (r->pstage && lo >= r->staged[k].lo && hi <= r->staged[k].hi) {
			from = at(r->pstage, at_elem + lo - r->staged[k].lo, r->pdt);
			break;
		}
	if (hi > lo && !from)
		return -1;
	if (mem > 0)
		r->cb->convert(r->cx, dst, r->pdt, at(r->buf[r->id_part], off, r->sdt), r->sdt,
			       (size_t)mem);
	if (hi > lo)
		r->cb->convert(r->cx, at(dst, mem, r->pdt), r->pdt, from, r->pdt, (size_t)(hi - lo));
	return 0;
}

const void *runner_gather_source(const Runner *r, long long off, long long n, void *piece,
				 PxError *err)
{
	if (off + n <= r->resident && r->sdt == r->pdt)
		return at(r->buf[r->id_part], off, r->pdt);
	/* FSDP's MixedPrecision casts the fp32 shard first (flat_param._mp_shard) */
	if (runner_nvme_params_into(r, off, n, piece)) {
		px_fail(err, PX_ERR_RUNTIME, "schedule op: a gather of partition elements %lld-%lld, "
			"on NVMe and not read", off, off + n - 1);
		return NULL;
	}
	return piece;
}

int runner_nvme_params_io(Runner *r, int write, long long off, void *host, long long n,
			  PxError *err)
{
	long long mem = in_flat(r, off, n);
	void *flat = mem > 0 ? at(r->buf[r->id_part], off, r->sdt) : NULL;
	if (mem > 0)
		r->cb->convert(r->cx, write ? flat : host, r->sdt, write ? host : flat, r->sdt,
			       (size_t)mem);
	return n > mem ? param_file(r, write, off + mem, at(host, mem, r->pdt), n - mem, err) : 0;
}

int runner_nvme_split_segments(Runner *r, int n)
{
	for (int i = 0; i < n; i++) {
		Seg *sg = &r->segs[i];
		long long cut = r->resident - sg->part_off;
		if (cut >= sg->n) /* wholly in the host flat */
			continue;
		if (cut <= 0) { /* wholly beyond it */
			sg->params = NULL;
			continue;
		}
		/* runner_create's room (2 n_units + 8) holds stage 3's n_units + 1 and this one */
		memmove(sg + 2, sg + 1, (size_t)(n - i - 1) * sizeof(Seg));
		sg[1] = *sg;
		sg[1].params = NULL;
		sg[1].grads = at(sg->grads, cut, sg->gdt);
		sg[1].part_off += cut, sg[1].n -= cut;
		sg->n = cut;
		n++;
	}
	return n;
}

/* Before a unit's gather: the slices it gathers (plan_gather_slices) that lie beyond the host
 * flat into the swapper's buffers, one after the other, which are poisoned first, so that what
 * the reads miss shows in the gather. */
static int read_unit_params(Runner *r, const Op *op, PxError *err)
{
	long long off[2], len[2], used = 0;
	plan_gather_slices(r->p, op->unit, off, len);
	unstage(r);
	for (int k = 0; k < 2; k++) {
		long long lo = off[k] > r->resident ? off[k] : r->resident, hi = off[k] + len[k];
		if (hi <= lo)
			continue;
		if (used + hi - lo > r->pstage_elems)
			return px_fail(err, PX_ERR_RUNTIME, "schedule op: an NVMe read of %lld "
				       "parameters, over the swapper's buffers' %lld", used + hi - lo,
				       r->pstage_elems);
		void *to = at(r->pstage, used, r->pdt);
		memset(to, 0xff, pbytes(r, hi - lo));
		if (param_file(r, 0, lo, to, hi - lo, err))
			return -1;
		r->staged[k] = (ElemRange){lo, hi};
		used += hi - lo;
	}
	return 0;
}

/* After a swapped sub-group's update (op's range): its parameters rounded from the master
 * weights, a buffer's worth at a time, into the file. */
static int write_updated_params(Runner *r, const Op *op, PxError *err)
{
	long long lo, hi, a, b;
	runner_op_range(r, op, &lo, &hi);
	unstage(r); /* the buffers are overwritten */
	for (long long c = lo > r->resident ? lo : r->resident; c < hi; c += r->pstage_elems) {
		long long e = c + r->pstage_elems < hi ? c + r->pstage_elems : hi;
		memset(r->pstage, 0, pbytes(r, e - c)); /* the padding between units */
		for (int i = 0; i < r->n_segs; i++)
			if (runner_seg_piece(&r->segs[i], c, e, &a, &b))
				from_f32(r, at(r->pstage, a - c, r->pdt), runner_master_at(r, a, lo),
					 (size_t)(b - a), r->pdt);
		if (param_file(r, 1, c, r->pstage, e - c, err))
			return -1;
	}
	return 0;
}

int runner_nvme_copy(Runner *r, const Op *op, PxError *err)
{
	if (op->sub == COPY_NVME_READ && op->role == ROLE_PREFETCH && op->unit >= 0)
		return read_unit_params(r, op, err);
	if (op->sub == COPY_NVME_WRITE && op->role == ROLE_PARAM_UPDATE)
		return write_updated_params(r, op, err);
	if (!r->nv_grads)
		return px_fail(err, PX_ERR_RUNTIME, "schedule op: an NVMe %s before the swap buffer "
			       "is allocated", copy_name(op->sub));
	if (op->sub == COPY_NVME_WRITE && op->role == ROLE_GRAD_REDUCE)
		return write_grads(r, err);
	long long lo, hi;
	runner_op_range(r, op, &lo, &hi);
	if (hi - lo > r->nv_slot)
		return px_fail(err, PX_ERR_RUNTIME, "schedule op: an NVMe %s of %lld elements, over "
			       "the swap buffer's %lld", copy_name(op->sub), hi - lo, r->nv_slot);
	if (op->sub == COPY_NVME_WRITE && op->role == ROLE_OPTIMIZER)
		return move_state(r, 1, lo, hi, err);
	if (op->sub != COPY_NVME_READ || op->role != ROLE_OPTIMIZER)
		return px_fail(err, PX_ERR_RUNTIME, "the CPU executor does not run an NVMe %s for %s",
			       copy_name(op->sub), role_name(op->role));
	/* NaN everywhere the reads are to fill: what they miss shows in the update */
	size_t n = 4 * (size_t)(hi - lo);
	float *m = r->buf[r->id_states];
	memset(r->buf[r->id_master], 0xff, n);
	memset(m, 0xff, n);
	memset(m + r->nv_slot, 0xff, n);
	memset(r->nv_grads, 0xff, n);
	return move_state(r, 0, lo, hi, err) ||
			       swap_read(&r->swap, r->sw_grads, 4 * (size_t)lo, r->nv_grads, n, err) ?
		       -1 : 0;
}

int runner_nvme_params_f32(Runner *r, const Seg *sg, long long a, long long b, float *dst,
			   PxError *err)
{
	if (sg->params) {
		to_f32(r, dst, at(sg->params, a - sg->part_off, r->pdt), (size_t)(b - a), r->pdt);
		return 0;
	}
	for (long long c = a; c < b; c += r->pstage_elems) { /* through the swapper's buffers */
		long long n = b - c < r->pstage_elems ? b - c : r->pstage_elems;
		unstage(r);
		if (runner_nvme_params_io(r, 0, c, r->pstage, n, err))
			return -1;
		to_f32(r, dst + (c - a), r->pstage, (size_t)n, r->pdt);
	}
	return 0;
}

int runner_nvme_sync(Runner *r, PxError *err)
{
	/* the master weights from the parameters, a slot at a time (the moments' files start as
	 * zeros: posix_fallocate's) */
	float *w = r->nv_grads ? r->buf[r->id_master] : NULL; /* no master without NVMe states */
	for (long long lo = 0; w && lo < r->st->part_elems; lo += r->nv_slot) {
		long long hi = lo + r->nv_slot < r->st->part_elems ? lo + r->nv_slot : r->st->part_elems;
		long long a, b;
		for (int i = 0; i < r->n_segs; i++)
			if (runner_seg_piece(&r->segs[i], lo, hi, &a, &b) &&
			    runner_nvme_params_f32(r, &r->segs[i], a, b, w + (a - lo), err))
				return -1;
		if (swap_write(&r->swap, r->sw_master, 4 * (size_t)lo, w, 4 * (size_t)(hi - lo), err))
			return -1;
	}
	/* a step's traffic is counted from here */
	r->swap.read_bytes = r->swap.write_bytes = r->pswap.read_bytes = r->pswap.write_bytes = 0;
	return 0;
}

int runner_nvme_is_file(const Runner *r, int id)
{
	return r->alloc_of[id] && r->alloc_of[id]->place == PLACE_NVME;
}

int runner_nvme_file_io(const Runner *r, int id, int write, void *host, PxError *err)
{
	int f = id == r->id_master ? r->sw_master : id == r->id_states ? r->sw_states :
		id == r->id_pswap ? r->sw_params : r->sw_grads;
	/* its counts are the steps' traffic: a checkpoint's are left out */
	SwapDir d = id == r->id_pswap ? r->pswap : r->swap;
	return move(&d, write, f, 0, host, r->size[id], err);
}

void runner_nvme_measured(const Runner *r, double *blocks_peak_bytes, double *read_bytes,
			  double *write_bytes)
{
	/* both directories' files are made at the set-up and keep their blocks: the peaks add */
	*blocks_peak_bytes = r->swap.blocks_peak + r->pswap.blocks_peak;
	*read_bytes = r->swap.read_bytes + r->pswap.read_bytes;
	*write_bytes = r->swap.write_bytes + r->pswap.write_bytes;
}

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
 * Parameters on NVMe run where DeepSpeed keeps them all in its host flat (a partition under
 * offload_param.max_in_cpu: engine/plan.c plan_param_host), as parameters on the CPU do; the
 * partition's sub-groups it would swap are refused. */
#include <string.h>
#include <strings.h>

#include "runner_int.h"

static const char OPT_PATH_KEY[] = "zero_optimization.offload_optimizer.nvme_path";

/* The fp32 tensors the update stages, each of the partition's size: master weights (mixed
 * precision), Adam's two moments, the gradients. */
static long long staged_tensors(const Plan *p)
{
	return (p->mixed ? 1 : 0) + 2 + 1;
}

const char *runner_nvme_supported(const Plan *p)
{
	const DsZero *z = &p->sc->ds.zero;
	int swapped = 0;
	for (long long s = 0; s < p->par.pp; s++)
		swapped |= p->stages[s].param_resident < p->stages[s].part_elems;
	if (p->opt_place != PLACE_NVME && p->param_place != PLACE_NVME)
		return NULL;
	if (p->sc->backend != BACKEND_CPU)
		return "NVMe offload on backend \"cpu\" only (its swap buffers are the host's memory, "
		       "read and written with pread and pwrite)";
	if (p->param_place == PLACE_NVME && swapped)
		return "parameters on NVMe only where DeepSpeed's host flat holds the whole partition "
		       "(offload_param.max_in_cpu and sub_group_size: the parameters it would swap are "
		       "not swapped here)";
	if (p->opt_place != PLACE_NVME)
		return NULL;
	if (strcasecmp(p->sc->ds.optimizer, "Adam") && strcasecmp(p->sc->ds.optimizer, "AdamW"))
		return "the optimizer on NVMe with Adam or AdamW (DeepSpeedCPUAdam)";
	if (z->offload_optimizer.buffer_count < staged_tensors(p))
		return p->mixed ? "the optimizer on NVMe with offload_optimizer.buffer_count 4 or more "
				  "(master weights, two moments and gradients staged at once)" :
				  "the optimizer on NVMe with offload_optimizer.buffer_count 3 or more "
				  "(two moments and gradients staged at once)";
	return NULL;
}

int runner_nvme_check_path(const Plan *p, PxError *err)
{
	if (p->opt_place != PLACE_NVME)
		return 0;
	const char *root = p->sc->ds.zero.offload_optimizer.nvme_path;
	SwapDir probe;
	PxError why;
	if (swap_open(&probe, root, OPT_PATH_KEY, -1, &why))
		return px_fail(err, why.code, "%s: %s", p->sc->path, why.msg);
	swap_close(&probe);
	return 0;
}

int runner_nvme_alloc(Runner *r, const Op *op, size_t bytes, PxError *err)
{
	if (!r->swap.path[0]) {
		int rank = r->world ? comm_rank(r->world) : r->rank;
		if (swap_open(&r->swap, r->p->sc->ds.zero.offload_optimizer.nvme_path, OPT_PATH_KEY,
			      rank, err))
			return -1;
	}
	int f = swap_create(&r->swap, bytes, err);
	if (f < 0)
		return -1;
	switch (op->what) {
	case BUF_MASTER: r->sw_master = f, r->id_master = op->buf; break;
	case BUF_OPT_STATES: r->sw_states = f, r->id_states = op->buf; break;
	case BUF_GRAD_SWAP: r->sw_grads = f, r->id_gradswap = op->buf; break;
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
	long long slot = r->st->step_elems, k = 0;
	size_t need = (size_t)staged_tensors(r->p) * (size_t)slot * 4;
	if (r->id_states < 0 || r->id_gradswap < 0 || need > bytes)
		return px_fail(err, PX_ERR_RUNTIME, "the NVMe swap buffer (%zu bytes) cannot stage "
			       "a sub-group's master weights, moments and gradients (%zu bytes)", bytes,
			       need);
	float *slots = swap;
	if (r->p->mixed)
		r->buf[r->id_master] = slots + slot * k++;
	r->buf[r->id_states] = slots + slot * k; /* the first moment, then the second */
	k += 2;
	r->nv_grads = slots + slot * k;
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
	if (r->p->mixed && move(&r->swap, write, r->sw_master, off, r->buf[r->id_master], n, err))
		return -1;
	return move(&r->swap, write, r->sw_states, off, m, n, err) ||
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

int runner_nvme_copy(Runner *r, const Op *op, PxError *err)
{
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
	if (r->p->mixed)
		memset(r->buf[r->id_master], 0xff, n);
	memset(m, 0xff, n);
	memset(m + r->nv_slot, 0xff, n);
	memset(r->nv_grads, 0xff, n);
	return move_state(r, 0, lo, hi, err) ||
			       swap_read(&r->swap, r->sw_grads, 4 * (size_t)lo, r->nv_grads, n, err) ?
		       -1 : 0;
}

int runner_nvme_sync(Runner *r, PxError *err)
{
	if (!r->nv_grads)
		return 0;
	/* the master weights from the parameters, a slot at a time (the moments' files start as
	 * zeros: posix_fallocate's) */
	float *w = r->buf[r->id_master];
	for (long long lo = 0; r->p->mixed && lo < r->st->part_elems; lo += r->nv_slot) {
		long long hi = lo + r->nv_slot < r->st->part_elems ? lo + r->nv_slot : r->st->part_elems;
		long long a, b;
		for (int i = 0; i < r->n_segs; i++) {
			const Seg *sg = &r->segs[i];
			if (runner_seg_piece(sg, lo, hi, &a, &b))
				r->cb->convert(r->cx, w + (a - lo), DT_FP32,
					       at(sg->params, a - sg->part_off, r->pdt), r->pdt,
					       (size_t)(b - a));
		}
		if (swap_write(&r->swap, r->sw_master, 4 * (size_t)lo, w, 4 * (size_t)(hi - lo), err))
			return -1;
	}
	r->swap.read_bytes = r->swap.write_bytes = 0; /* a step's traffic is counted from here */
	return 0;
}

int runner_nvme_is_file(const Runner *r, int id)
{
	return r->alloc_of[id] && r->alloc_of[id]->place == PLACE_NVME;
}

int runner_nvme_file_io(const Runner *r, int id, int write, void *host, PxError *err)
{
	int f = id == r->id_master ? r->sw_master : id == r->id_states ? r->sw_states : r->sw_grads;
	SwapDir d = r->swap; /* its counts are the steps' traffic: a checkpoint's are left out */
	return move(&d, write, f, 0, host, r->size[id], err);
}

void runner_nvme_measured(const Runner *r, double *blocks_peak_bytes, double *read_bytes,
			  double *write_bytes)
{
	*blocks_peak_bytes = r->swap.blocks_peak;
	*read_bytes = r->swap.read_bytes;
	*write_bytes = r->swap.write_bytes;
}

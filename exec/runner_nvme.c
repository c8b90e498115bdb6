/* runner_nvme: ZeRO-Infinity's optimizer on NVMe (offload_optimizer.device "nvme", stage 3), run
 * for real: the schedule's NVMe buffers (the fp32 master weights, the optimizer's states, the
 * swapped fp32 gradients) are files (swapfile.h); the host's swap buffer (BUF_SWAP) stages them
 * while the step updates them, as DeepSpeed's partitioned_optimizer_swapper does per sub-group
 * (one sub-group here: the partition). The copies move the bytes with pread and pwrite:
 * - NVMe write of the gradients (at the accumulation boundary): the host's fp32 gradient
 *   partition into its file (stage3.py swap_out_gradients);
 * - NVMe read before the update: master weights, states and gradients into their staging
 *   (swap_in_optimizer_state), which is poisoned first, so that only what the files held is
 *   read;
 * - NVMe write after the update: master weights and states back to their files.
 * Parameters on NVMe run where DeepSpeed keeps them all in its host flat (a partition under
 * offload_param.max_in_cpu: engine/plan.c plan_param_host), as parameters on the CPU do; the
 * partition's sub-groups it would swap are refused. */
#include <math.h>
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
	const StagePlan *st = &p->stages[0];
	if (p->opt_place != PLACE_NVME && p->param_place != PLACE_NVME)
		return NULL;
	if (p->sc->backend != BACKEND_CPU)
		return "NVMe offload on backend \"cpu\" only (its swap buffers are the host's memory, "
		       "read and written with pread and pwrite)";
	if (p->param_place == PLACE_NVME && st->param_resident < st->part_elems)
		return "parameters on NVMe only where DeepSpeed's host flat holds the whole partition "
		       "(offload_param.max_in_cpu and sub_group_size: the parameters it would swap are "
		       "not swapped here)";
	if (p->opt_place != PLACE_NVME)
		return NULL;
	if (strcasecmp(p->sc->ds.optimizer, "Adam") && strcasecmp(p->sc->ds.optimizer, "AdamW"))
		return "the optimizer on NVMe with Adam or AdamW (DeepSpeedCPUAdam)";
	if (z->sub_group_elems < (double)st->part_elems && st->max_tensor_part < st->part_elems)
		return "the optimizer on NVMe with one sub-group holding the partition "
		       "(sub_group_size at least the partition; the update swaps the whole partition "
		       "at once)";
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
	/* DeepSpeed's pool: buffer_count buffers of the largest sub-group's fp32 tensor (here the
	 * gradient partition, as this rank holds it) */
	size_t one = r->id_gradswap >= 0 ? r->size[r->id_gradswap] : 0;
	return (size_t)r->p->sc->ds.zero.offload_optimizer.buffer_count * one;
}

int runner_nvme_stage(Runner *r, void *swap, size_t bytes, PxError *err)
{
	size_t m = r->id_master >= 0 ? r->size[r->id_master] : 0;
	size_t s = r->id_states >= 0 ? r->size[r->id_states] : 0;
	size_t g = r->id_gradswap >= 0 ? r->size[r->id_gradswap] : 0;
	if (r->id_states < 0 || r->id_gradswap < 0 || m + s + g > bytes)
		return px_fail(err, PX_ERR_RUNTIME, "the NVMe swap buffer (%zu bytes) cannot stage "
			       "the master weights, states and gradients (%zu bytes)", bytes, m + s + g);
	char *at = swap;
	if (r->id_master >= 0)
		r->buf[r->id_master] = at;
	r->buf[r->id_states] = at + m;
	r->nv_grads = (float *)(at + m + s);
	return 0;
}

static int write_state(Runner *r, PxError *err)
{
	if (r->id_master >= 0 && r->size[r->id_master] &&
	    swap_write(&r->swap, r->sw_master, r->buf[r->id_master], r->size[r->id_master], err))
		return -1;
	return swap_write(&r->swap, r->sw_states, r->buf[r->id_states], r->size[r->id_states], err);
}

int runner_nvme_copy(Runner *r, const Op *op, PxError *err)
{
	if (!r->nv_grads)
		return px_fail(err, PX_ERR_RUNTIME, "schedule op: an NVMe %s before the swap buffer "
			       "is allocated", copy_name(op->sub));
	if (op->sub == COPY_NVME_WRITE && op->role == ROLE_GRAD_REDUCE)
		return swap_write(&r->swap, r->sw_grads, r->buf[r->id_grad32],
				  r->size[r->id_gradswap], err);
	if (op->sub == COPY_NVME_WRITE && op->role == ROLE_OPTIMIZER)
		return write_state(r, err);
	if (op->sub != COPY_NVME_READ || op->role != ROLE_OPTIMIZER)
		return px_fail(err, PX_ERR_RUNTIME, "the CPU executor does not run an NVMe %s for %s",
			       copy_name(op->sub), role_name(op->role));
	size_t m = r->id_master >= 0 ? r->size[r->id_master] : 0, s = r->size[r->id_states];
	size_t g = r->size[r->id_gradswap];
	/* NaN everywhere the reads are to fill: what they miss shows in the update */
	memset(r->buf[r->id_states], 0xff, s);
	memset(r->nv_grads, 0xff, g);
	if (m) {
		memset(r->buf[r->id_master], 0xff, m);
		if (swap_read(&r->swap, r->sw_master, r->buf[r->id_master], m, err))
			return -1;
	}
	return swap_read(&r->swap, r->sw_states, r->buf[r->id_states], s, err) ||
			       swap_read(&r->swap, r->sw_grads, r->nv_grads, g, err) ? -1 : 0;
}

int runner_nvme_sync(Runner *r, PxError *err)
{
	if (!r->nv_grads)
		return 0;
	if (write_state(r, err))
		return -1;
	r->swap.read_bytes = r->swap.write_bytes = 0; /* a step's traffic is counted from here */
	return 0;
}

void runner_nvme_measured(const Runner *r, double *blocks_peak_bytes, double *read_bytes,
			  double *write_bytes)
{
	*blocks_peak_bytes = r->swap.blocks_peak;
	*read_bytes = r->swap.read_bytes;
	*write_bytes = r->swap.write_bytes;
}

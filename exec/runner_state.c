/* runner_state: what the runner keeps from step to step: the optimizer over this rank's
 * partition (segments, the global norm's and overflow's local parts, fp16 loss scaling, the update)
 * and checkpoints of that state. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/onebit.h"
#include "runner_int.h"

/* ---- the optimizer over this rank's partition ---- */

/* FSDP: unit u's gradients the update reads where they stay put: the host's pinned ones under
 * CPUOffload; NULL otherwise (the device's shards come and go: runner_fsdp_bind). */
static void *fsdp_host_grads(Runner *r, int u)
{
	return r->offload ? (float *)r->buf[r->id_grad32] + r->p->units[u].part_off : NULL;
}

void runner_make_segments(Runner *r)
{
	const Plan *p = r->p;
	const StagePlan *st = r->st;
	int n = 0;
	if (p->stage == 0) {
		r->segs[n++] = (Seg){r->buf[r->id_params], r->buf[r->id_grads], r->gdt, 0,
				     st->flat_dense, 0, NULL};
	} else if (p->stage < 3) {
		for (int i = 0; i < st->n_buckets; i++) {
			long long cnt = st->buckets[i].padded / r->n;
			long long mine = st->buckets[i].flat_off + r->rank * cnt;
			void *grads = p->stage == 1 ? at(r->buf[r->id_grads], mine, r->gdt) :
				runner_partition_grads(r, st->buckets[i].flat_off / r->n);
			r->segs[n++] = (Seg){at(r->buf[r->id_params], mine, r->pdt), grads, r->gdt,
					     st->buckets[i].flat_off / r->n, cnt, mine, NULL};
		}
	} else {
		for (int u = 0; u < p->n_units; u++) /* FSDP's gradient shards come and go
						       (runner_fsdp_bind) */
			if (p->units[u].part_dense > 0)
				r->segs[n++] = (Seg){at(r->buf[r->id_part], r->p->units[u].part_off, r->sdt),
						     p->fsdp ? fsdp_host_grads(r, u) :
						     runner_partition_grads(r, r->p->units[u].part_off),
						     p->fsdp ? DT_FP32 : r->gdt,
						     r->p->units[u].part_off, p->units[u].part_dense, -1,
						     NULL};
		if (r->resident < st->part_elems) /* parameters beyond the host flat: on NVMe */
			n = runner_nvme_split_segments(r, n);
		if (r->persist_cnt > 0)
			r->segs[n++] = (Seg){at(r->buf[r->id_persist], r->rank * r->persist_cnt, r->pdt),
					     runner_partition_grads(r, r->st->persist_part_off), r->gdt,
					     r->st->persist_part_off, r->persist_cnt, -1, NULL};
	}
	if (p->stage < 3) /* an MoE model's experts: the flat after the dense buckets */
		n += runner_moe_segments(r, &r->segs[n]);
	r->n_segs = n;
	/* stage 1-2 under offload: the optimizer reads the host's fp32 copy (stage 3's partition
	 * is the host's already) */
	for (int i = 0; r->offload && p->stage < 3 && i < n; i++) {
		r->segs[i].dev_grads = r->segs[i].grads;
		r->segs[i].grads = (float *)r->buf[r->id_grad32] + r->segs[i].part_off;
		r->segs[i].gdt = DT_FP32;
	}
}

/* Squares of a segment's gradients from element lo to hi of it. */
static double seg_sumsq(const Runner *r, const Seg *sg, long long lo, long long hi)
{
	if (hi <= lo)
		return 0;
	return r->cb->sum_squares(r->cx, at(sg->grads, lo, sg->gdt), sg->gdt, (size_t)(hi - lo));
}

/* The ranges of r->norm_skip are left out: a tied parameter's replica, counted on the first
 * stage, and on tensor-parallel ranks but 0 the tensors the group replicates; in flat
 * coordinates at ZeRO 0-2 (Seg.flat_off), partition ones at 3 (Seg.part_off). */
double runner_local_sumsq(const Runner *r)
{
	double s = 0;
	for (int i = 0; i < r->n_segs; i++) {
		const Seg *sg = &r->segs[i];
		long long from = 0; /* the next element of the segment not yet counted or skipped */
		long long base = sg->flat_off >= 0 ? sg->flat_off : sg->part_off; /* norm_skip's */
		for (int k = 0; k < r->n_norm_skip; k++) {
			long long lo = r->norm_skip[k].lo - base;
			long long hi = r->norm_skip[k].hi - base;
			if (hi <= from || lo >= sg->n)
				continue;
			if (lo > from)
				s += seg_sumsq(r, sg, from, lo);
			from = hi;
		}
		if (from < sg->n)
			s += seg_sumsq(r, sg, from, sg->n);
	}
	return s;
}

int runner_local_overflow(const Runner *r)
{
	for (int i = 0; i < r->n_segs; i++)
		if (r->cb->nonfinite(r->cx, r->segs[i].grads, r->segs[i].gdt, (size_t)r->segs[i].n))
			return 1;
	return 0;
}

static void zero_grads(Runner *r)
{
	int ids[2] = {r->p->stage < 2 ? r->id_grads : r->id_gradpart, r->offload ? r->id_grad32 : -1};
	for (int i = 0; i < 2; i++)
		if (ids[i] >= 0)
			zero(r, ids[i]);
}

/* fp16 dynamic loss scaling as DeepSpeed's: halve on overflow once hysteresis is used up (not
 * below min_loss_scale), double after loss_scale_window good steps; torch's GradScaler is the
 * same with a hysteresis of 1 and no floor (runner.c sets which). */
static void update_scale(Runner *r, int overflow)
{
	if (!r->fp16 || r->ls_static)
		return;
	if (overflow) {
		if (--r->hysteresis <= 0) {
			r->loss_scale = fmax(r->loss_scale / 2, r->ls_min);
			r->hysteresis = r->ls_hysteresis;
		}
		r->good_steps = 0;
	} else if (++r->good_steps % r->ls_window == 0) {
		r->loss_scale *= 2;
	}
}

float runner_grad_factor(Runner *r, double *norm)
{
	if (!r->have_factor) {
		/* the reduced gradients are the ranks' sum, divided by dp here, unless the
		 * reduce-scatters divided them first (r->predivide); a 1-bit compressed step's were
		 * not summed over the ranks (DeepSpeed's enable_backward_allreduce off): this rank's
		 * own, clipped by the ranks' norms averaged (stage 0's norm all-reduce, runner.c
		 * collective) */
		int summed = !(r->onebit && r->step_kind != ONEBIT_FULL) && !r->predivide;
		double sumsq = r->have_norm ? r->sumsq : runner_local_sumsq(r);
		double unscale = 1.0 / (r->loss_scale * (summed ? (double)r->n : 1.0));
		r->gnorm = sqrt(sumsq) * unscale;
		r->factor = (float)(ops_clip_coef(r->gnorm, (float)r->p->sc->ds.gradient_clipping) *
				    unscale);
		r->have_factor = 1;
	}
	if (norm)
		*norm = r->gnorm;
	return r->factor;
}

/* The once-a-step part of the update: overflow, the factor, loss scaling, the learning rate.
 * Whether the step updates. */
static int optimize_begin(Runner *r, StepResult *res)
{
	const DsConfig *ds = &r->p->sc->ds;
	int overflow = r->fp16 ? (r->have_overflow ? r->overflow : runner_local_overflow(r)) : 0;
	runner_grad_factor(r, &res->grad_norm);
	res->skipped = overflow;
	res->loss_scale = r->loss_scale;
	update_scale(r, overflow);
	if (overflow)
		return 0;
	r->opt_steps++;
	res->lr = dsconfig_lr(ds, r->opt_steps);
	/* a 1-bit optimizer's first step sets up its buffers and updates neither its moments nor
	 * the weights (adam.py, zoadam.py: `if not self.initialize`) */
	return !(r->onebit && r->opt_steps == 1);
}

/* Segment sg's elements a .. b - 1 of the partition. Where the step's tensors are: the master
 * weights and moments whole in memory, or a sub-group's in the NVMe swap buffer's slots (from
 * lo); the fp32 gradients the host's (offload), the step's flat copy of the sub-group (from lo)
 * or the NVMe slot (from lo). */
static void update_piece(Runner *r, const Seg *sg, long long a, long long b, long long lo,
			 const OpsAdamw *h, float factor, float lr)
{
	const Plan *p = r->p;
	const DsConfig *ds = &p->sc->ds;
	long long part = r->st->part_elems, off = a - sg->part_off, n = b - a;
	int staged = r->nv_grads != NULL, made = p->flattens_grads;
	long long x = staged ? a - lo : a; /* in the states */
	float *m = r->id_states >= 0 ? (float *)r->buf[r->id_states] + x : NULL;
	float *v = m ? m + (staged ? r->nv_slot : part) : NULL;
	void *params = sg->params ? at(sg->params, off, r->sdt) : NULL; /* NULL: on NVMe */
	/* stage 3 under CPU offload: DeepSpeed's fp32 gradient sub-groups, a copy of the partition
	 * even in fp32 training */
	int copied = !staged && !made &&
		     (sg->gdt != DT_FP32 || (r->offload && p->stage == 3 && !p->fsdp));
	float *g32 = staged ? r->nv_grads + (a - lo) :
		     made ? (float *)r->buf[r->id_grad32] + (a - lo) :
		     copied ? (float *)r->buf[r->id_grad32] + a : (float *)sg->grads + off;
	float *w = p->master_bytes ? runner_master_at(r, a, lo) : params;
	if (copied)
		to_f32(r, g32, at(sg->grads, off, sg->gdt), (size_t)n, sg->gdt);
	Seg piece = *sg;
	piece.part_off = a, piece.n = n;
	if (r->onebit)
		runner_onebit_update(r, &piece, w, m, v, g32, h, factor);
	else if (!strcasecmp(ds->optimizer, "SGD")) /* the momentum, when on, is the one state */
		r->cb->sgd(r->cx, p->opt_place, w, m, g32, (size_t)n, lr, (float)ds->momentum,
			   (float)ds->weight_decay, factor);
	else if (p->opt_impl == OPT_IMPL_FOREACH) /* the temporary: runner_create's check */
		r->cb->adamw_foreach(r->cx, p->opt_place, w, m, v, g32, (size_t)n, h, r->opt_steps,
				     factor, (float *)r->buf[r->id_step_temp] + (a - lo));
	else
		r->cb->adamw(r->cx, p->opt_place, w, m, v, g32, (size_t)n, h, r->opt_steps, factor);
	if (p->master_bytes && !r->params_by_copy && params)
		from_f32(r, params, w, (size_t)n, r->pdt);
}

void runner_optimize(Runner *r, StepResult *res, long long lo, long long hi)
{
	const DsConfig *ds = &r->p->sc->ds;
	if (!r->opt_begun) {
		r->opt_begun = 1;
		r->opt_updates = optimize_begin(r, res);
	}
	if (r->opt_updates) {
		float factor = runner_grad_factor(r, NULL);
		OpsAdamw h = {res->lr, ds->beta1, ds->beta2, ds->eps, ds->weight_decay};
		long long a, b;
		for (int i = 0; i < r->n_segs; i++)
			if (runner_seg_piece(&r->segs[i], lo, hi, &a, &b))
				update_piece(r, &r->segs[i], a, b, lo, &h, factor, (float)res->lr);
	}
	if (hi < r->st->part_elems)
		return;
	if (r->opt_updates && r->onebit)
		runner_onebit_step_done(r, res->lr);
	zero_grads(r);
}

/* ---- checkpoints ---- */

#define CKPT_MAGIC 0x50584b43 /* "CKXP" */

typedef struct CkptHeader {
	uint32_t magic, version;
	int32_t rank, n, stage, n_bufs;
	int64_t opt_steps, good_steps;
	int32_t hysteresis, pad;
	double loss_scale;
} CkptHeader;

/* The buffers that carry state from step to step: those the set-up allocates, but gradients. */
static int is_state(const Runner *r, int id)
{
	const Op *a = r->alloc_of[id];
	if (!a || (!r->buf[id] && !runner_nvme_is_file(r, id)) || a->cat == CAT_GRADS)
		return 0;
	return a->what == BUF_PARAMS || a->what == BUF_PARAM_PART || a->what == BUF_PERSISTENT ||
	       a->what == BUF_MASTER || a->what == BUF_OPT_STATES || a->what == BUF_PARAM_SWAP;
}

/* The largest state buffer: the host staging area that save and load go through (the state may
 * be device memory). Caller frees. */
static void *state_staging(const Runner *r, PxError *err)
{
	size_t most = 1;
	for (int id = 0; id < r->s->n_bufs; id++)
		if (is_state(r, id) && r->size[id] > most)
			most = r->size[id];
	void *host = malloc(most);
	if (!host)
		px_fail(err, PX_ERR_RUNTIME, "out of memory staging a checkpoint");
	return host;
}

int runner_save(const Runner *r, FILE *f, PxError *err)
{
	CkptHeader h = {CKPT_MAGIC, 1, r->rank, r->n, r->p->stage, r->s->n_bufs, r->opt_steps,
			r->good_steps, r->hysteresis, 0, r->loss_scale};
	void *host = state_staging(r, err);
	if (!host)
		return -1;
	int rc = fwrite(&h, sizeof(h), 1, f) == 1 ? 0 :
		 px_fail(err, PX_ERR_RUNTIME, "writing a checkpoint failed: %s", strerror(errno));
	for (int id = 0; !rc && id < r->s->n_bufs; id++) {
		if (!is_state(r, id))
			continue;
		int64_t meta[2] = {id, (int64_t)r->size[id]};
		if (runner_nvme_is_file(r, id)) { /* the state is the file's, not the swap slot's */
			if (runner_nvme_file_io(r, id, 0, host, err))
				rc = -1;
		} else {
			r->cb->to_host(r->cx, host, r->buf[id], r->size[id]);
		}
		if (rc || r->cb->check(r->cx, err))
			rc = -1;
		else if (fwrite(meta, sizeof(meta), 1, f) != 1 ||
			 fwrite(host, 1, r->size[id], f) != r->size[id])
			rc = px_fail(err, PX_ERR_RUNTIME, "writing a checkpoint failed: %s",
				     strerror(errno));
	}
	free(host);
	return rc;
}

int runner_load(Runner *r, FILE *f, const char *path, PxError *err)
{
	CkptHeader h;
	if (fread(&h, sizeof(h), 1, f) != 1 || h.magic != CKPT_MAGIC || h.version != 1)
		return px_fail(err, PX_ERR_INPUT, "%s: not a parallax checkpoint", path);
	if (h.rank != r->rank || h.n != r->n || h.stage != r->p->stage || h.n_bufs != r->s->n_bufs)
		return px_fail(err, PX_ERR_INPUT, "%s: saved by rank %d of %d at ZeRO stage %d; this is "
			       "rank %d of %d at stage %d: resume with the same ranks and scenario", path,
			       h.rank, h.n, h.stage, r->rank, r->n, r->p->stage);
	void *host = state_staging(r, err);
	if (!host)
		return -1;
	for (int id = 0; id < r->s->n_bufs; id++) {
		if (!is_state(r, id))
			continue;
		int64_t meta[2];
		if (fread(meta, sizeof(meta), 1, f) != 1 || meta[0] != id ||
		    meta[1] != (int64_t)r->size[id] || fread(host, 1, r->size[id], f) != r->size[id]) {
			free(host);
			return px_fail(err, PX_ERR_INPUT, "%s: its buffers do not match this scenario's "
				       "(buffer %d)", path, id);
		}
		if (runner_nvme_is_file(r, id) ? runner_nvme_file_io(r, id, 1, host, err) : 0) {
			free(host);
			return -1;
		}
		if (!runner_nvme_is_file(r, id))
			r->cb->from_host(r->cx, r->buf[id], host, r->size[id]);
	}
	free(host);
	if (r->cb->check(r->cx, err))
		return -1;
	r->opt_steps = h.opt_steps;
	r->good_steps = h.good_steps;
	r->hysteresis = h.hysteresis;
	r->loss_scale = h.loss_scale;
	return 0;
}

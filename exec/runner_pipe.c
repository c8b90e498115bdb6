/* runner_pipe: the runner's pipeline parallelism. Which groups a rank belongs to (engine/
 * parallel.c's layout, split into communicators), and the sends and receives between stages of
 * the hidden stream: a forward's activation to the next stage, a backward's gradient to the
 * previous one, through the buffers the schedule names (build_pipelined()). The order
 * of a stage's forwards and backwards is the schedule's; the interpreter is runner.c's. */
#include <stdlib.h>

#include "../engine/streams.h"
#include "runner_int.h"

/* ---- communicators ---- */

void runner_comms_free(RunnerComms *c)
{
	comm_destroy(c->dp);
	comm_destroy(c->pp_act);
	comm_destroy(c->pp_grad);
	comm_destroy(c->tied);
	comm_destroy(c->tp);
	comm_destroy(c->hpz);
	comm_destroy(c->node);
	comm_destroy(c->xnode);
	comm_destroy(c->ep);
	comm_destroy(c->edp);
	*c = (RunnerComms){.world = c->world};
}

int runner_comm_split(Comm *world, int color, int key, int tag, Comm **out, PxError *err)
{
	if (comm_split(world, color, key, tag, out, err))
		return -1;
	if (*out && comm_size(*out) == 1) {
		comm_destroy(*out);
		*out = NULL;
	}
	return 0;
}

int runner_comms_split(Comm *world, const Plan *p, RunnerComms *c, int *stage, PxError *err)
{
	const ParallelSpec *q = &p->par;
	RankCoords at = parallel_rank_coords(q, comm_rank(world));
	int dp = (int)at.dp, st = (int)at.stage, last = (int)q->pp - 1;
	/* every pipeline's first and last stage hold a copy of the tied embedding */
	int tied = q->pp > 1 && model_tied_elems(&p->sc->model) && (st == 0 || st == last);
	*c = (RunnerComms){.world = world};
	*stage = st;
	/* every rank takes part in every split (comm_split is collective over world), in this
	 * order; the colors keep tensor-parallel ranks apart */
	if (runner_comm_split(world, (int)(at.stage * q->tp + at.tp), dp, GROUP_DP, &c->dp, err) ||
	    runner_comm_split(world, (int)(at.dp * q->tp + at.tp), st, GROUP_PP, &c->pp_act, err) ||
	    runner_comm_split(world, (int)(at.dp * q->tp + at.tp), st, GROUP_PP, &c->pp_grad, err) ||
	    runner_comm_split(world, tied ? (int)(at.dp * q->tp + at.tp) : COMM_NO_COLOR, st, GROUP_PP, &c->tied,
		  err) ||
	    runner_comm_split(world, (int)(at.stage * p->dp + at.dp), (int)at.tp, GROUP_TP, &c->tp, err) ||
	    runner_zpp_comms_split(world, p, c, err)) {
		runner_comms_free(c);
		return -1;
	}
	/* an MoE model's: inside the data-parallel group, ep consecutive ranks hold the E experts
	 * between them (an expert-parallel group), and the ranks at the same place in each hold
	 * the same experts (an expert-data-parallel group) */
	long long ep = q->ep, dp_group = at.stage * q->tp + at.tp;
	if (p->sc->model.experts > 0 &&
	    (runner_comm_split(world, (int)(dp_group * (p->dp / ep) + at.dp / ep), (int)(at.dp % ep), GROUP_EP,
		   &c->ep, err) ||
	     runner_comm_split(world, (int)(dp_group * ep + at.dp % ep), (int)(at.dp / ep), GROUP_EDP, &c->edp,
		   err))) {
		runner_comms_free(c);
		return -1;
	}
	return 0;
}

Comm *runner_pipe_comm(const Runner *r, const Op *op)
{
	Comm *c = op->role == ROLE_TIED_GRADS ? r->tied : r->pp_act;
	return c && comm_size(c) == op->nranks ? c : NULL;
}

/* ---- sends and receives ---- */

int runner_pipe_p2p(Runner *r, const Op *op, Pending *q, PxError *err)
{
	int forward = op->role == ROLE_FORWARD, send = op->sub == COLL_P2P, n = r->n_stages;
	Comm *c = forward ? r->pp_act : r->pp_grad;
	/* the whole stream, or this tensor-parallel rank's part of it (plan_pipe_parts), which
	 * starts cnt x rank elements in */
	size_t cnt = (size_t)op->elems, sent = pipe_sent_elems(r, !forward);
	long long from = sent < stream_elems(r) ? (long long)cnt * r->gtp.r : 0;
	void *buf = op->buf >= 0 ? r->buf[op->buf] : NULL;
	if (!c || !buf || cnt != sent || op->elem_bytes != dt_bytes(r->pdt))
		return px_fail(err, PX_ERR_RUNTIME, "a pipeline %s of %lld elements of %d bytes in "
			       "buffer %d: the executor moves %zu elements of %zu bytes of the hidden "
			       "stream between stages through a buffer", coll_name(op->sub),
			       (long long)op->elems, op->elem_bytes, op->buf, sent, dt_bytes(r->pdt));
	/* activations go to the next stage (the last's to the first: the interleaved order's
	 * next chunk), gradients to the previous; a part is received at its place in the whole
	 * buffer (the all-gather after it fills the rest), and sent from a buffer of its size */
	int next = (r->stage + 1) % n, prev = (r->stage + n - 1) % n;
	if (!send) {
		if (comm_recv(c, at(buf, from, r->pdt), cnt, comm_dt(r->pdt), forward ? prev : next,
			      err))
			return -1;
		r->pipe_recvd[forward] = op;
		return 0;
	}
	if (forward)
		r->cb->convert(r->cx, buf, r->pdt, at(hidden_x(r), from, r->pdt), r->pdt, cnt);
	else
		from_f32(r, buf, hidden_dx(r) + from, cnt, r->pdt);
	if (r->cb->check(r->cx, err)) /* the buffer is written before MPI reads it */
		return -1;
	*q = (Pending){.op = op, .stream = SCC_SEND, .recycle_buf = -1};
	if (comm_send_start(c, buf, cnt, comm_dt(r->pdt), forward ? next : prev, &q->req, err))
		return -1;
	r->n_pend++;
	return 0;
}

int runner_pipe_is_gather(const Runner *r, const Op *op)
{
	if (op->kind != OP_COLL || op->group != GROUP_TP || op->sub != COLL_ALL_GATHER || op->buf < 0)
		return 0;
	int what = r->alloc_of[op->buf]->what;
	return what == BUF_PIPE_INPUT || what == BUF_PIPE_GRAD;
}

int runner_pipe_gather(Runner *r, const Op *op, PxError *err)
{
	int grads = op->role == ROLE_BACKWARD;
	size_t whole = stream_elems(r), part = pipe_sent_elems(r, grads);
	if (!r->tp || (size_t)op->elems != whole || part == whole ||
	    part * (size_t)plan_pipe_parts(r->p, grads) != whole)
		return px_fail(err, PX_ERR_RUNTIME, "schedule op %d: an all-gather of %lld elements of "
			       "the pipeline stream over the tensor-parallel group: the executor gathers "
			       "its %zu elements from the ranks' parts", (int)(op - r->s->ops),
			       (long long)op->elems, whole);
	void *buf = r->buf[op->buf];
	return comm_all_gather(r->tp, at(buf, (long long)part * r->gtp.r, r->pdt), buf, part,
			       comm_dt(r->pdt), err);
}

void runner_pipe_take(Runner *r, const Op *compute)
{
	int forward = compute->sub == COMP_FWD;
	const Op *op = r->pipe_recvd[forward];
	if (!op)
		return;
	void *buf = r->buf[op->buf];
	size_t cnt = stream_elems(r);
	if (forward)
		r->cb->convert(r->cx, hidden_x(r), r->pdt, buf, r->pdt, cnt);
	else
		to_f32(r, hidden_dx(r), buf, cnt, r->pdt);
	r->pipe_recvd[forward] = NULL;
}

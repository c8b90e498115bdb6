/* build_pipe: a pipeline stage's schedule (build_priv.h): its own order of forwards and
 * backwards (pipeline.c), the sends and receives between stages and the buffers that hold
 * them. */
#include "build_priv.h"

#include <stdlib.h>

#include "pipeline.h"

/* Elements of the stream a pipeline stage sends per micro-batch (and its boundary buffers hold):
 * b s h, or under sequence parallelism this tensor-parallel rank's rows of it, b s h / t (Megatron
 * sends each rank's sequence shard to the same rank of the next stage: nothing to gather). */
long long build_pipe_elems(const Plan *p)
{
	long long bsh = p->shape.b * p->shape.s * p->sc->model.h;
	return p->shape.sp ? ceil_div(bsh, p->par.tp) : bsh;
}

/* Elements of that stream one send carries (plan_pipe_parts). */
static long long pipe_part(const Plan *p, long long bsh, int grads)
{
	return bsh / plan_pipe_parts(p, grads);
}

/* A receive of part of the stream into buf, made whole there by the all-gather over the
 * tensor-parallel group. */
static void pipe_gather(Builder *b, OpRole role, long long bsh, int buf)
{
	const Plan *p = b->p;
	long long part = pipe_part(p, bsh, role == ROLE_BACKWARD);
	coll(b, COLL_P2P_RECV, role, GROUP_PP, -1, part, p->param_bytes, buf, 0);
	if (part < bsh)
		coll(b, COLL_ALL_GATHER, role, GROUP_TP, -1, bsh, p->param_bytes, buf, 0);
}

/* The receive step st starts from, if any (its micro-batch's ops): a forward's input from the
 * previous stage, into a buffer kept until its backward; a backward's gradient from the next,
 * into the set-up's buffer. */
static void pipe_recv(Builder *b, const PipeStep *st, long long bsh)
{
	const Plan *p = b->p;
	int j = st->chunk * (int)p->par.pp + b->stage, d = p->param_bytes;
	b->mb = st->mb;
	if (st->forward && j > 0) {
		int *in = &b->pipe_in[st->mb * p->par.virtual_stages + st->chunk];
		*in = alloc(b, PLACE_GPU, CAT_ACTIV, BUF_PIPE_INPUT, p->chunk_bounds[j], (double)bsh * d);
		pipe_gather(b, ROLE_FORWARD, bsh, *in);
	} else if (!st->forward && j < p->n_chunks - 1) {
		pipe_gather(b, ROLE_BACKWARD, bsh, b->id_pipe_grad);
	}
}

/* Megatron's interleaved batches (schedules.py, forward_backward_pipelining_with_interleaving):
 * in its steady state each iteration runs a forward and a backward and then exchanges, in one
 * batch, both outputs and both inputs of the next iteration; warming up, a forward's batch
 * receives the next forward's input, and the last warm-up batch the first backward's gradient
 * too, unless every forward is a warm-up one (then the first backward receives its own);
 * cooling down, a backward's batch receives the next backward's. In this order's terms: posted
 * at the end of step k, the receives of step k + 1, and of step k + 2 too when k + 1 is a
 * forward that a backward follows and some backward comes before the stage's last forward;
 * *posted: the last step whose receives are posted. */
static void pipe_batch_recvs(Builder *b, const PipeStep *order, int n, int k, int all_warmup,
			     int *posted, long long bsh)
{
	int upto = k + 1;
	if (k + 2 < n && order[k + 1].forward && !order[k + 2].forward && !all_warmup)
		upto = k + 2;
	for (int j = *posted + 1; j <= upto && j < n; j++)
		pipe_recv(b, &order[j], bsh);
	if (upto > *posted)
		*posted = upto;
}

/* With pipelining: the stage's own order of forwards and backwards (pipeline.c), each step's
 * ops in the step's micro-batch. A chunk receives its input from the previous stage and sends
 * its output to the next, bsh elements per micro-batch each way; gradients come back the same
 * way. The boundary buffers are DeepSpeed's pipe engine's: the received input is kept until the
 * backward has sent its gradient, the sent output until the backward (its autograd root), the
 * received gradient lands in the set-up's buffer, and the input's gradient lives until it is
 * sent (in the interleaved order, until the end of its step: below). The executor's hidden
 * stream (x in the compute dtype, its gradient in fp32) lives for each step, its scratch
 * (build_exec_scratch_bytes) for each backward step and, on a tensor-parallel rank or in an MoE
 * model, each forward step too. */
int build_pipelined(Builder *b, PxError *err)
{
	const Plan *p = b->p;
	long long pp = p->par.pp, v = p->par.virtual_stages, m = b->m;
	long long bsh = build_pipe_elems(p), whole = p->shape.b * p->shape.s * p->sc->model.h;
	double exec_bsh = p->executor ? (double)whole : 0;
	int d = p->param_bytes;
	PipeStep *order = malloc((size_t)(2 * m * v) * sizeof(*order));
	if (!order)
		return px_fail(err, PX_ERR_RUNTIME, "out of memory");
	int n = pipe_order(p->par.schedule, pp, v, m, b->stage, order);
	/* Megatron's interleaved order batches the sends of a forward-backward pair with the
	 * receives of the next pair and waits for them all (batch_isend_irecv): the receives come
	 * at the end of the step before (pipe_batch_recvs), and the sent input gradient lives until
	 * then */
	int batched = p->par.schedule == PIPE_INTERLEAVED, sent_grad = -1, posted = -1;
	int first_bwd = 0; /* every forward before any backward: all of them warm-up ones */
	while (first_bwd < n && order[first_bwd].forward)
		first_bwd++;
	int all_warmup = first_bwd == n / 2;

	for (int k = 0; k < n; k++) {
		const PipeStep *st = &order[k];
		int j = st->chunk * (int)pp + b->stage; /* the global model chunk */
		int first = j == 0, last = j == p->n_chunks - 1;
		int lo = p->chunk_bounds[j], hi = p->chunk_bounds[j + 1];
		int *in = &b->pipe_in[st->mb * v + st->chunk], *out = &b->pipe_out[st->mb * v + st->chunk];
		DO(sched_mark_step(b->s));
		b->mb = st->mb;
		int hidden = alloc(b, PLACE_GPU, CAT_WORKSPACE, BUF_HIDDEN, -1, (4 + d) * exec_bsh);
		int scratch = -1; /* backward's, and forward's too on a tensor-parallel rank or in
				     an MoE model, whose blocks dispatch through it */
		if (!st->forward || p->par.tp > 1 || p->sc->model.experts > 0)
			scratch = alloc(b, PLACE_GPU, CAT_WORKSPACE, BUF_SCRATCH, -1,
					build_exec_scratch_bytes(p));
		if (!batched)
			pipe_recv(b, st, bsh);
		else if (k == 0)
			pipe_batch_recvs(b, order, n, -1, all_warmup, &posted, bsh);
		if (st->forward) {
			for (int u = lo; u < hi; u++)
				build_forward_unit(b, st->mb, u);
			if (!last) {
				/* the pipe engine keeps the sent part (the output's own data is
				 * cleared: only its graph stays for the backward) */
				long long part = pipe_part(p, bsh, 0);
				*out = alloc(b, PLACE_GPU, CAT_ACTIV, BUF_PIPE_OUTPUT, hi - 1,
					     (double)part * d);
				coll(b, COLL_P2P, ROLE_FORWARD, GROUP_PP, -1, part, d, *out, 0);
			}
		} else {
			/* the pipe engine's last stage runs its backwards through the ZeRO optimizer's
			 * (pipe/engine.py _exec_backward_pass: super().backward), which makes its
			 * contiguous gradient buffers each time, replacing the last ones, and no
			 * epilogue frees them before the boundary's reductions */
			if (last && p->stage == 1 && b->n_buckets == 0)
				build_alloc_buckets(b, build_bucket_count(p));
			for (int u = hi - 1; u >= lo; u--)
				build_backward_unit(b, st->mb, u);
			build_accumulate_hp(b, lo, hi);
			release(b, out);
			if (!first) {
				long long part = pipe_part(p, bsh, 1);
				sent_grad = alloc(b, PLACE_GPU, CAT_BUFFERS, BUF_PIPE_INPUT_GRAD, lo,
						  (double)part * d);
				coll(b, COLL_P2P, ROLE_BACKWARD, GROUP_PP, -1, part, d, sent_grad, 0);
				if (!batched)
					release(b, &sent_grad);
				release(b, in);
			}
		}
		if (batched && k + 1 < n)
			pipe_batch_recvs(b, order, n, k, all_warmup, &posted, bsh);
		release(b, &sent_grad);
		b->mb = st->mb;
		release(b, &scratch);
		release(b, &hidden);
	}
	b->mb = 0;
	free(order);
	return 0;
}

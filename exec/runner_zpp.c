/* runner_zpp: the runner's ZeRO++ (stage 3), from the ops engine/build.c schedules for it:
 * - qwZ: a gather whose op moves 1-byte elements quantizes this rank's piece to INT8 in
 *   build_qwz_groups' groups, all-gathers the values and the fp32 scales, and dequantizes every
 *   rank's piece into the gathered buffer the compute reads;
 * - hpZ: after each forward gather over the data-parallel group this rank keeps its piece of the
 *   unit inside its hpz group (the secondary partition, BUF_SECONDARY); backward's gathers over
 *   GROUP_HPZ read it (quantized too under qwZ, as DeepSpeed's);
 * - qgZ: a gradient reduction in two INT4 all-to-alls, inside the node (GROUP_NODE) then across
 *   nodes (GROUP_XNODE), each rank's slice quantized in groups of BUILD_QGZ_GROUP_ELEMS, summed
 *   in fp32 after each, the result added into this rank's gradient partition.
 * Under parameter offload the pieces come from the host's partition (beyond max_in_cpu, the
 * swapper's buffers) and hpZ's secondary partition is on the host too, as DeepSpeed keeps them.
 * Its collectives block. Its scratch (the fp32, INT8 and scale copies) lives outside the arena,
 * as DeepSpeed's transient quantization buffers lie outside the simulator's prediction. Which
 * communicators exist is runner_zpp_comms_split's; the interpreter is runner.c's. */
#include <stdlib.h>
#include <string.h>

#include "../engine/build.h"
#include "../kernels/quant_cpu.h"
#include "runner_int.h"

struct RunnerZpp {
	size_t cap_elems, cap_scales;
	float *f32, *sum;        /* cap_elems each: values before quantizing, sums after */
	int8_t *q_send, *q_recv; /* cap_elems bytes each */
	float *s_send, *s_recv;  /* cap_scales each */
};

/* ---- communicators ---- */

/* DeepSpeed's groups, inside this rank's data-parallel group (the ranks of the same tensor-
 * parallel index; runner_supported: no pipeline or expert parallelism with ZeRO++), numbered by
 * their data-parallel index d: hpz, consecutive blocks of hpz of them
 * (_create_zero_param_parallel_group); node, those of one node (plan_spans' GROUP_NODE: the
 * data-parallel ranks a node holds); xnode, one of each node with the same local index. The
 * colors keep the data-parallel groups apart. */
int runner_zpp_comms_split(Comm *world, const Plan *p, RunnerComms *c, PxError *err)
{
	if (p->hpz <= 1 && !p->qgz && p->shard_group != GROUP_NODE) /* FSDP's HYBRID_SHARD: node */
		return 0;
	RankCoords at = parallel_rank_coords(&p->par, comm_rank(world));
	long long d = at.dp, g = at.stage * p->par.tp + at.tp, n = p->dp;
	long long h = p->hpz, l = p->spans[GROUP_NODE].n;
	return runner_comm_split(world, (int)(g * (n / h) + d / h), (int)(d % h), GROUP_HPZ, &c->hpz,
				 err) ||
	       runner_comm_split(world, (int)(g * (n / l) + d / l), (int)(d % l), GROUP_NODE, &c->node,
				 err) ||
	       runner_comm_split(world, (int)(g * l + d % l), (int)(d / l), GROUP_XNODE, &c->xnode,
				 err) ? -1 : 0;
}

/* ---- scratch ---- */

int runner_zpp_create(Runner *r, PxError *err)
{
	const Plan *p = r->p;
	if (p->hpz <= 1 && !p->qwz && !p->qgz)
		return 0;
	size_t big = (size_t)((r->st->persist_elems + r->n - 1) / r->n * r->n);
	for (int u = 0; u < p->n_units; u++)
		if ((size_t)p->units[u].gather_dense > big)
			big = (size_t)p->units[u].gather_dense;
	RunnerZpp *z = r->zpp = calloc(1, sizeof(*z));
	if (!z)
		return px_fail(err, PX_ERR_RUNTIME, "out of memory");
	/* a piece in groups of at least 8 elements (qwZ), a slice in groups of h (qgZ) */
	z->cap_elems = big + 16;
	z->cap_scales = big / 8 + (size_t)r->n * 2 + 16;
	z->f32 = malloc(z->cap_elems * sizeof(float));
	z->sum = malloc(z->cap_elems * sizeof(float));
	z->q_send = malloc(z->cap_elems);
	z->q_recv = malloc(z->cap_elems);
	z->s_send = malloc(z->cap_scales * sizeof(float));
	z->s_recv = malloc(z->cap_scales * sizeof(float));
	if (!z->f32 || !z->sum || !z->q_send || !z->q_recv || !z->s_send || !z->s_recv)
		return px_fail(err, PX_ERR_RUNTIME, "out of memory");
	return 0;
}

void runner_zpp_destroy(Runner *r)
{
	RunnerZpp *z = r->zpp;
	if (!z)
		return;
	free(z->f32);
	free(z->sum);
	free(z->q_send);
	free(z->q_recv);
	free(z->s_send);
	free(z->s_recv);
	free(z);
	r->zpp = NULL;
}

/* ---- qwZ and hpZ: gathers ---- */

/* Gather k elements of src (storage type) from each of c's ranks into dst (n = k x size),
 * as INT8 in groups (qwZ) or as they are. */
static int gather_piece(Runner *r, Comm *c, const void *src, void *dst, long long k, int quant,
			PxError *err)
{
	RunnerZpp *z = r->zpp;
	int size = comm_size(c);
	long long n = k * size;
	if (!quant)
		return comm_all_gather(c, src, dst, (size_t)k, comm_dt(r->pdt), err);
	long long g = build_qwz_groups(k);
	if (g <= 0 || (size_t)n > z->cap_elems || (size_t)(g * size) > z->cap_scales)
		return px_fail(err, PX_ERR_RUNTIME, "a quantized gather of %lld elements a rank: "
			       "DeepSpeed's quantizer groups a multiple of 8 (and the executor's "
			       "scratch holds %zu)", k, z->cap_elems);
	size_t block = (size_t)(k / g);
	to_f32(r, z->f32, src, (size_t)k, r->pdt);
	quant_block_quantize(z->f32, (size_t)k, block, 8, z->q_send, z->s_send);
	if (comm_all_gather(c, z->q_send, z->q_recv, (size_t)k, COMM_INT8, err) ||
	    comm_all_gather(c, z->s_send, z->s_recv, (size_t)g, COMM_FP32, err))
		return -1;
	for (int j = 0; j < size; j++)
		quant_block_dequantize(z->q_recv + j * k, z->s_recv + (long long)j * g, (size_t)k, block,
				       8, z->f32 + j * k);
	from_f32(r, dst, z->f32, (size_t)n, r->pdt);
	return 0;
}

int runner_zpp_is_gather(const Runner *r, const Op *op)
{
	const Plan *p = r->p;
	return op->kind == OP_COLL && op->sub == COLL_ALL_GATHER && op->role == ROLE_PREFETCH &&
	       (op->group == GROUP_HPZ || (op->group == GROUP_DP && (op->elem_bytes == 1 ||
								     p->hpz > 1)));
}

int runner_zpp_gather(Runner *r, const Op *op, Comm *c, PxError *err)
{
	const Plan *p = r->p;
	int quant = op->elem_bytes == 1;
	long long n = op->elems, k = n / op->nranks, off = r->s->slices[op->slice].part_off;
	void *dst = at(r->buf[op->buf], op->offset, r->pdt);
	if (op->group == GROUP_HPZ) /* backward's: from the secondary partition */
		return gather_piece(r, c, at(r->buf[r->id_secondary], off, r->pdt), dst, k, quant, err);
	const void *src = runner_gather_source(r, off, k, at(dst, (long long)comm_rank(c) * k, r->pdt),
					       err);
	if (!src || gather_piece(r, c, src, dst, k, quant, err))
		return -1;
	if (p->hpz <= 1)
		return 0;
	/* forward's: keep this rank's piece of the unit inside its hpz group, which DeepSpeed
	 * copies from the gathered parameter when it is released (_partition_param_sec) */
	long long sk = n / p->hpz, j = r->hpz ? comm_rank(r->hpz) : 0;
	r->cb->convert(r->cx, at(r->buf[r->id_secondary], p->units[op->unit].secondary_off, r->pdt),
		       r->pdt, at(dst, j * sk, r->pdt), r->pdt, (size_t)sk);
	return 0;
}

/* ---- qgZ: the hierarchical all-to-all reduction ----
 * A reduction of E elements over dp = L x N ranks (L in a node, N nodes); rank d = node x L +
 * local ends with slice d (c = E / dp elements). Inside the node, rank (n, l) sends local peer l'
 * the slices of every node's rank l' (N x c), receives its own local index's from each peer and
 * sums them; across nodes, it sends node n' the sum of slice (n', l) and sums what it receives:
 * slice d summed over every rank. Each slice travels quantized in groups from its start. */

typedef struct QgzShape {
	long long E, c, L, N, per_slice, group; /* per_slice: groups of a slice */
} QgzShape;

static int qgz_shape(const Runner *r, const Op *op, QgzShape *q, PxError *err)
{
	const Plan *p = r->p;
	q->L = p->spans[GROUP_NODE].n, q->N = p->spans[GROUP_XNODE].n;
	q->E = op->unit >= 0 ? p->units[op->unit].own_gather :
			       (r->st->persist_elems + r->n - 1) / r->n * r->n;
	q->c = q->E / r->n;
	q->group = BUILD_QGZ_GROUP_ELEMS(p);
	q->per_slice = (q->c + q->group - 1) / q->group;
	long long want = op->group == GROUP_NODE ? (q->E + 1) / 2 : (q->E / q->L + 1) / 2;
	if (q->E % r->n || q->c % 2 || op->elems != want ||
	    (size_t)q->E > r->zpp->cap_elems || (size_t)(r->n * q->per_slice) > r->zpp->cap_scales)
		return px_fail(err, PX_ERR_RUNTIME, "a qgZ all-to-all of %lld INT4 bytes over %s "
			       "for a reduction of %lld elements: the executor sends slices of an "
			       "even number of elements, %lld bytes", (long long)op->elems,
			       group_name(op->group), q->E, want);
	return 0;
}

/* Quantize m slices of c fp32 values (src, slice after slice) into the send buffers, slice i at
 * position order[i]. */
static void qgz_pack(RunnerZpp *z, const QgzShape *q, const float *src, const long long *order,
		     long long m)
{
	for (long long i = 0; i < m; i++)
		quant_block_quantize(src + i * q->c, (size_t)q->c, (size_t)q->group, 4,
				     z->q_send + order[i] * (q->c / 2),
				     z->s_send + order[i] * q->per_slice);
}

/* dst (m x c) = the sum over `from` senders of the m slices each sent, received in order. */
static void qgz_sum(RunnerZpp *z, const QgzShape *q, long long from, long long m, float *dst)
{
	memset(dst, 0, (size_t)(m * q->c) * sizeof(float));
	float *one = z->f32;
	for (long long s = 0; s < from; s++)
		for (long long i = 0; i < m; i++) {
			long long at_ = s * m + i;
			quant_block_dequantize(z->q_recv + at_ * (q->c / 2), z->s_recv + at_ * q->per_slice,
					       (size_t)q->c, (size_t)q->group, 4, one);
			for (long long e = 0; e < q->c; e++)
				dst[i * q->c + e] += one[e];
		}
}

/* INT4 values and their scales to every rank of c (or to this rank alone when c is NULL). */
static int qgz_exchange(RunnerZpp *z, const QgzShape *q, Comm *c, long long m, PxError *err)
{
	size_t bytes = (size_t)(m * q->c / 2), scales = (size_t)(m * q->per_slice);
	if (!c) {
		memcpy(z->q_recv, z->q_send, bytes);
		memcpy(z->s_recv, z->s_send, scales * sizeof(float));
		return 0;
	}
	return comm_all_to_all(c, z->q_send, z->q_recv, bytes, COMM_INT8, err) ||
	       comm_all_to_all(c, z->s_send, z->s_recv, scales, COMM_FP32, err) ? -1 : 0;
}

/* Inside the node: z->sum gets the N slices of this local index, summed over the node. */
static int qgz_node(Runner *r, const Op *op, const QgzShape *q, PxError *err)
{
	RunnerZpp *z = r->zpp;
	long long order[1024], m = q->L * q->N;
	if (m > 1024)
		return px_fail(err, PX_ERR_RUNTIME, "qgZ over %lld ranks: the executor runs 1024 at "
			       "most", m);
	to_f32(r, z->sum, at(r->buf[op->buf], op->offset, r->gdt), (size_t)q->E, r->gdt);
	/* slice d = node x L + local goes to local peer `local`, in node order */
	for (long long d = 0; d < m; d++)
		order[d] = (d % q->L) * q->N + d / q->L;
	qgz_pack(z, q, z->sum, order, m);
	if (qgz_exchange(z, q, r->node, q->N, err))
		return -1;
	qgz_sum(z, q, q->L, q->N, z->sum);
	return 0;
}

int runner_zpp_reduce(Runner *r, const Op *op, PxError *err)
{
	RunnerZpp *z = r->zpp;
	QgzShape q;
	if (qgz_shape(r, op, &q, err))
		return -1;
	if (op->group == GROUP_NODE)
		return qgz_node(r, op, &q, err);
	if (q.L == 1 && qgz_node(r, op, &q, err)) /* no node op: the node is this rank */
		return -1;
	long long order[1024];
	for (long long i = 0; i < q.N && i < 1024; i++)
		order[i] = i;
	qgz_pack(z, &q, z->sum, order, q.N);
	if (qgz_exchange(z, &q, r->xnode, 1, err))
		return -1;
	qgz_sum(z, &q, q.N, 1, z->sum);
	if (r->offload) /* where a reduce-scatter leaves this rank's slice, which the schedule's copy
			   to the host's fp32 gradients reads next */
		from_f32(r, at(r->buf[op->buf], op->offset + r->rank * q.c, r->gdt), z->sum,
			 (size_t)q.c, r->gdt);
	else
		add_into(r, at(r->buf[r->id_gradpart], r->s->slices[op->slice].part_off, r->gdt),
			 z->sum, DT_FP32, (size_t)q.c, r->gdt);
	return 0;
}

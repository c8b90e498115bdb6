/* comm_mpi_staged: several ranks on one GPU, where NCCL refuses to run, with Open MPI moving the
 * bytes and CUDA holding them. Debian's Open MPI cannot read device memory, so every call copies
 * its send buffer to pinned host memory, runs comm_mpi_backend's call there and copies the result
 * back. CORRECTNESS ONLY: each call synchronises the whole device and crosses PCIe twice, so its
 * times say nothing about a real job's; use it to check results and per-rank memory, never
 * speed. */
#include "comm.h"

#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* What one start owns: the MPI world's handle and the staging buffer every communicator shares
 * (calls come from one thread at a time, so one buffer serves them all). */
typedef struct StagedWorld {
	void *mpi;           /* comm_mpi_backend's world */
	int device;
	void *host;          /* pinned; grown on demand */
	size_t host_bytes;
} StagedWorld;

typedef struct StagedComm {
	void *mpi; /* comm_mpi_backend's communicator */
	StagedWorld *world;
	int rank, size;
} StagedComm;

static const CommBackend *const inner = &comm_mpi_backend;

static int cuda_check(cudaError_t rc, const char *call, PxError *err)
{
	if (rc == cudaSuccess)
		return 0;
	return px_fail(err, PX_ERR_RUNTIME, "%s: %s", call, cudaGetErrorString(rc));
}

/* ---- staging ---- */

/* Host copies of a call's two buffers, laid out as they are on the device: where send and recv
 * overlap (the in-place forms of comm.h) one region holds both at the same distance apart, so
 * that the MPI backend sees the same in-place call. */
typedef struct Stage {
	const char *send_dev;
	char *recv_dev;
	size_t send_bytes, recv_bytes;
	char *send_host, *recv_host;
} Stage;

static int host_get(StagedWorld *w, size_t bytes, PxError *err)
{
	if (w->host_bytes >= bytes)
		return 0;
	if (w->host)
		cudaFreeHost(w->host);
	w->host = NULL;
	w->host_bytes = 0;
	if (cuda_check(cudaMallocHost(&w->host, bytes), "cudaMallocHost", err))
		return -1;
	w->host_bytes = bytes;
	return 0;
}

/* Bytes of host memory st needs, and whether its buffers overlap (then laid out together). */
static size_t stage_span(const Stage *st, int *together)
{
	uintptr_t s = (uintptr_t)st->send_dev, r = (uintptr_t)st->recv_dev;
	*together = st->send_dev && st->recv_dev &&
		    (s == r || (s < r + st->recv_bytes && r < s + st->send_bytes));
	if (!*together)
		return st->send_bytes + st->recv_bytes + 1;
	uintptr_t lo = s < r ? s : r;
	uintptr_t hi = s + st->send_bytes > r + st->recv_bytes ? s + st->send_bytes
							      : r + st->recv_bytes;
	return hi - lo + 1;
}

/* Lay st out in host (stage_span's bytes) and copy send in. */
static int stage_place(Stage *st, char *host, PxError *err)
{
	int together;
	stage_span(st, &together);
	if (together) {
		uintptr_t s = (uintptr_t)st->send_dev, r = (uintptr_t)st->recv_dev;
		uintptr_t lo = s < r ? s : r;
		st->send_host = host + (s - lo);
		st->recv_host = host + (r - lo);
	} else {
		st->send_host = st->send_dev ? host : NULL;
		st->recv_host = st->recv_dev ? host + st->send_bytes : NULL;
	}
	/* the compute that wrote send may be on any stream: wait for all of it */
	if (cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize", err))
		return -1;
	if (st->send_bytes && cuda_check(cudaMemcpy(st->send_host, st->send_dev, st->send_bytes,
						    cudaMemcpyDefault),
					 "cudaMemcpy (to host)", err))
		return -1;
	return 0;
}

/* Lay st out in w's host buffer and copy send in. send_dev or recv_dev may be NULL (no bytes). */
static int stage_in(StagedWorld *w, Stage *st, PxError *err)
{
	int together;
	if (host_get(w, stage_span(st, &together), err))
		return -1;
	return stage_place(st, w->host, err);
}

static int stage_out(const Stage *st, int rc, PxError *err)
{
	if (rc || !st->recv_bytes)
		return rc;
	return cuda_check(cudaMemcpy(st->recv_dev, st->recv_host, st->recv_bytes, cudaMemcpyDefault),
			  "cudaMemcpy (to device)", err);
}

static Stage stage_of(const void *send, size_t send_bytes, void *recv, size_t recv_bytes)
{
	return (Stage){.send_dev = send ? send : NULL, .recv_dev = recv ? recv : NULL,
		       .send_bytes = send ? send_bytes : 0, .recv_bytes = recv ? recv_bytes : 0};
}

/* ---- set-up ---- */

static int staged_init(void **world, CommEnv *env, PxError *err)
{
	int n = 0;
	if (cuda_check(cudaGetDeviceCount(&n), "cudaGetDeviceCount", err))
		return -1;
	StagedWorld *w = calloc(1, sizeof(*w));
	StagedComm *c = calloc(1, sizeof(*c));
	if (!w || !c) {
		free(w);
		free(c);
		return px_fail(err, PX_ERR_RUNTIME, "mpi-staged backend: out of memory");
	}
	/* many ranks per GPU is the point: they share the node's devices round robin */
	w->device = env->local_rank % n;
	if (cuda_check(cudaSetDevice(w->device), "cudaSetDevice", err) ||
	    inner->init(&w->mpi, env, err)) {
		free(w);
		free(c);
		return -1;
	}
	c->mpi = w->mpi;
	c->world = w;
	c->rank = env->rank;
	c->size = env->size;
	*world = c;
	return 0;
}

static int staged_finalize(void *world, PxError *err)
{
	StagedComm *c = world;
	StagedWorld *w = c->world;
	if (w->host)
		cudaFreeHost(w->host);
	int rc = inner->finalize(w->mpi, err);
	free(w);
	free(c);
	return rc;
}

static int staged_split(void *parent, int color, int key, void **out, int *rank, int *size,
			PxError *err)
{
	StagedComm *p = parent;
	*out = NULL;
	StagedComm *c = calloc(1, sizeof(*c));
	if (!c)
		return px_fail(err, PX_ERR_RUNTIME, "mpi-staged backend: out of memory");
	int rc = inner->split(p->mpi, color, key, &c->mpi, rank, size, err);
	if (rc || !c->mpi) {
		free(c); /* failed, or this rank joins no group */
		return rc;
	}
	c->world = p->world;
	c->rank = *rank;
	c->size = *size;
	*out = c;
	return 0;
}

static void staged_comm_free(void *h)
{
	StagedComm *c = h;
	if (!c)
		return;
	inner->comm_free(c->mpi);
	free(c);
}

static void staged_abort(void *world, int code)
{
	StagedComm *c = world;
	inner->abort(c ? c->world->mpi : NULL, code);
}

/* ---- collectives: stage in, the MPI backend's call on host memory, stage out ---- */

static int staged_all_gather(void *h, const void *send, void *recv, size_t count, CommDtype dt,
			     PxError *err)
{
	StagedComm *c = h;
	size_t part = count * comm_dtype_bytes(dt);
	Stage st = stage_of(send, part, recv, part * (size_t)c->size);
	if (stage_in(c->world, &st, err))
		return -1;
	int rc = inner->all_gather(c->mpi, st.send_host, st.recv_host, count, dt, err);
	return stage_out(&st, rc, err);
}

static int staged_reduce_scatter(void *h, const void *send, void *recv, size_t count,
				 CommDtype dt, CommRedOp op, PxError *err)
{
	StagedComm *c = h;
	size_t part = count * comm_dtype_bytes(dt);
	Stage st = stage_of(send, part * (size_t)c->size, recv, part);
	if (stage_in(c->world, &st, err))
		return -1;
	int rc = inner->reduce_scatter(c->mpi, st.send_host, st.recv_host, count, dt, op, err);
	return stage_out(&st, rc, err);
}

static int staged_all_reduce(void *h, const void *send, void *recv, size_t count, CommDtype dt,
			     CommRedOp op, PxError *err)
{
	StagedComm *c = h;
	size_t bytes = count * comm_dtype_bytes(dt);
	Stage st = stage_of(send, bytes, recv, bytes);
	if (stage_in(c->world, &st, err))
		return -1;
	int rc = inner->all_reduce(c->mpi, st.send_host, st.recv_host, count, dt, op, err);
	return stage_out(&st, rc, err);
}

static int staged_reduce(void *h, const void *send, void *recv, size_t count, CommDtype dt,
			 CommRedOp op, int root, PxError *err)
{
	StagedComm *c = h;
	size_t bytes = count * comm_dtype_bytes(dt);
	/* recv means nothing off the root: neither staged nor copied back */
	Stage st = stage_of(send, bytes, c->rank == root ? recv : NULL, bytes);
	if (stage_in(c->world, &st, err))
		return -1;
	int rc = inner->reduce(c->mpi, st.send_host, st.recv_host, count, dt, op, root, err);
	return stage_out(&st, rc, err);
}

static int staged_broadcast(void *h, const void *send, void *recv, size_t count, CommDtype dt,
			    int root, PxError *err)
{
	StagedComm *c = h;
	size_t bytes = count * comm_dtype_bytes(dt);
	Stage st = stage_of(c->rank == root ? send : NULL, bytes, recv, bytes);
	if (stage_in(c->world, &st, err))
		return -1;
	int rc = inner->broadcast(c->mpi, st.send_host, st.recv_host, count, dt, root, err);
	return stage_out(&st, rc, err);
}

static int staged_all_to_all(void *h, const void *send, void *recv, size_t count, CommDtype dt,
			     PxError *err)
{
	StagedComm *c = h;
	size_t whole = count * comm_dtype_bytes(dt) * (size_t)c->size;
	Stage st = stage_of(send, whole, recv, whole);
	if (stage_in(c->world, &st, err))
		return -1;
	int rc = inner->all_to_all(c->mpi, st.send_host, st.recv_host, count, dt, err);
	return stage_out(&st, rc, err);
}

static int staged_send(void *h, const void *buf, size_t count, CommDtype dt, int peer,
		       PxError *err)
{
	StagedComm *c = h;
	Stage st = stage_of(buf, count * comm_dtype_bytes(dt), NULL, 0);
	if (stage_in(c->world, &st, err))
		return -1;
	return inner->send(c->mpi, st.send_host, count, dt, peer, err);
}

static int staged_recv(void *h, void *buf, size_t count, CommDtype dt, int peer, PxError *err)
{
	StagedComm *c = h;
	Stage st = stage_of(NULL, 0, buf, count * comm_dtype_bytes(dt));
	if (stage_in(c->world, &st, err))
		return -1;
	int rc = inner->recv(c->mpi, st.recv_host, count, dt, peer, err);
	return stage_out(&st, rc, err);
}

static int staged_barrier(void *h, PxError *err)
{
	StagedComm *c = h;
	return inner->barrier(c->mpi, err);
}

/* ---- started collectives: staged in at the start, the MPI backend's started call on host
 * memory, staged out at the wait ----
 * Each request has its own pinned buffer, since several may be in flight. The copies are
 * synchronous (correctness only, as everything here); the host blocks at the wait. */

typedef struct StagedReq {
	Stage st;
	char *host;  /* pinned, stage_span's bytes */
	void *inner; /* comm_mpi_backend's request */
} StagedReq;

static void req_free(StagedReq *q)
{
	if (q->host)
		cudaFreeHost(q->host);
	free(q);
}

static int staged_start(void *h, const CommCall *k, void *stream, void **req, PxError *err)
{
	StagedComm *c = h;
	StagedReq *q = calloc(1, sizeof(*q));
	if (!q)
		return px_fail(err, PX_ERR_RUNTIME, "mpi-staged backend: out of memory");
	size_t part = k->count * comm_dtype_bytes(k->dt), whole = part * (size_t)c->size;
	q->st = k->kind == COLL_ALL_GATHER ? stage_of(k->send, part, k->recv, whole) :
		k->kind == COLL_REDUCE_SCATTER ? stage_of(k->send, whole, k->recv, part) :
						 stage_of(k->send, part, k->recv, part);
	int together;
	CommCall hk = *k;
	if (cuda_check(cudaMallocHost((void **)&q->host, stage_span(&q->st, &together)),
		       "cudaMallocHost", err) ||
	    stage_place(&q->st, q->host, err))
		goto out_free;
	hk.send = q->st.send_host;
	hk.recv = q->st.recv_host;
	if (inner->start(c->mpi, &hk, stream, &q->inner, err))
		goto out_free;
	*req = q;
	return 0;
out_free:
	req_free(q);
	return -1;
}

static int staged_wait(void *req, void *stream, int *done, PxError *err)
{
	StagedReq *q = req;
	int rc = inner->wait(q->inner, stream, done, err);
	rc = stage_out(&q->st, rc, err);
	*done = 1;
	req_free(q);
	return rc;
}

static int staged_test(void *req, int *done, PxError *err)
{
	/* a wait here always blocks until done, so nothing is ever left to test */
	return staged_wait(req, NULL, done, err);
}

/* What the MPI backend's messages carried: the staging copies move nothing between ranks. */
static void staged_moved(void *h, int64_t *sent_bytes, int64_t *recv_bytes)
{
	StagedComm *c = h;
	inner->moved(c->mpi, sent_bytes, recv_bytes);
}

const CommBackend comm_mpi_staged_backend = {
	.name = "mpi-staged",
	.init = staged_init,
	.split = staged_split,
	.comm_free = staged_comm_free,
	.finalize = staged_finalize,
	.all_gather = staged_all_gather,
	.reduce_scatter = staged_reduce_scatter,
	.all_reduce = staged_all_reduce,
	.reduce = staged_reduce,
	.broadcast = staged_broadcast,
	.all_to_all = staged_all_to_all,
	.send = staged_send,
	.recv = staged_recv,
	.barrier = staged_barrier,
	.start = staged_start,
	.wait = staged_wait,
	.test = staged_test,
	.moved = staged_moved,
	.abort = staged_abort,
};

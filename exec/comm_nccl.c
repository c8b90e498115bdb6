/* comm_nccl: the NCCL backend of comm.h. Owns the choice of device, the bootstrap of NCCL's unique
 * id (MPI_Bcast under mpirun or srun, a TCP rendezvous under torchrun-style variables), the
 * communication stream, and turning NCCL's and CUDA's errors into messages. Counting, deadlines
 * and argument checks are comm.c's. */
#include "comm_nccl.h"

#include <mpi.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* nccl.h declares ncclGroupStart() without a prototype, which -Wstrict-prototypes rejects */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <nccl.h>
#pragma GCC diagnostic pop

#include "rendezvous.h"

/* The longest the TCP rendezvous waits on its own; comm.c's deadline (60 s by default) normally
 * ends a missing rank's wait long before. */
#define RENDEZVOUS_TIMEOUT_S 900.0

/* What one NCCL start owns; one per process, like the GPU it drives. */
typedef struct NcclWorld {
	int device;
	cudaStream_t stream; /* every call of the world and its splits */
	float *one;          /* device scalar the barrier all-reduces */
	int owns_mpi;        /* this backend started MPI to bootstrap, so it finalizes it */
} NcclWorld;

typedef struct NcclComm {
	ncclComm_t comm;
	NcclWorld *world;
	int rank, size;
	void *scratch;        /* device copy of send for an in-place all_to_all; grown on demand */
	size_t scratch_bytes;
} NcclComm;

/* comm_nccl_stream's answer: the one world of this process, NULL outside init..finalize */
static NcclWorld *the_world;

cudaStream_t comm_nccl_stream(void)
{
	return the_world ? the_world->stream : NULL;
}

int comm_nccl_device(void)
{
	return the_world ? the_world->device : -1;
}

/* ---- errors ---- */

static int nccl_fail(ncclResult_t rc, ncclComm_t comm, const char *call, PxError *err)
{
	const char *last = comm ? ncclGetLastError(comm) : NULL;
	if (last && *last)
		return px_fail(err, PX_ERR_RUNTIME, "%s: %s (%s)", call, ncclGetErrorString(rc),
			       last);
	return px_fail(err, PX_ERR_RUNTIME, "%s: %s", call, ncclGetErrorString(rc));
}

static int cuda_check(cudaError_t rc, const char *call, PxError *err)
{
	if (rc == cudaSuccess)
		return 0;
	return px_fail(err, PX_ERR_RUNTIME, "%s: %s", call, cudaGetErrorString(rc));
}

static int mpi_check(int rc, const char *call, PxError *err)
{
	if (rc == MPI_SUCCESS)
		return 0;
	char s[MPI_MAX_ERROR_STRING];
	int len = 0;
	if (MPI_Error_string(rc, s, &len) != MPI_SUCCESS)
		snprintf(s, sizeof(s), "MPI error %d", rc);
	return px_fail(err, PX_ERR_RUNTIME, "%s: %s", call, s);
}

/* ---- waiting without blocking ----
 * The communicators are non-blocking (ncclConfig_t.blocking = 0): no NCCL call waits for other
 * ranks inside the library, so a missing rank leaves this thread polling here, where comm.c's
 * watchdog can end the job, rather than stuck inside NCCL. */

/* The caller's polling and the watchdog's abort never touch a communicator at once: each look
 * holds this lock, and abort takes it for good (it ends the process), so the poller cannot read
 * a communicator that ncclCommAbort is freeing. */
static pthread_mutex_t poll_mu = PTHREAD_MUTEX_INITIALIZER;

/* Until comm's last operation (init, split, a collective's enqueueing) is no longer in
 * progress. */
static int wait_ready(ncclComm_t comm, const char *call, PxError *err)
{
	ncclResult_t state;
	for (;;) {
		pthread_mutex_lock(&poll_mu);
		ncclResult_t rc = ncclCommGetAsyncError(comm, &state);
		pthread_mutex_unlock(&poll_mu);
		if (rc != ncclSuccess)
			return nccl_fail(rc, comm, "ncclCommGetAsyncError", err);
		if (state == ncclSuccess)
			return 0;
		if (state != ncclInProgress)
			return nccl_fail(state, comm, call, err);
		sched_yield();
	}
}

/* Until everything enqueued on the stream ran, watching comm for errors meanwhile (a peer that
 * died shows up as an asynchronous error, not as a stream error). */
static int wait_stream(NcclComm *m, const char *call, PxError *err)
{
	if (wait_ready(m->comm, call, err))
		return -1;
	for (;;) {
		ncclResult_t state = ncclSuccess;
		pthread_mutex_lock(&poll_mu);
		cudaError_t q = cudaStreamQuery(m->world->stream);
		if (q == cudaErrorNotReady && ncclCommGetAsyncError(m->comm, &state) != ncclSuccess)
			state = ncclSuccess; /* no answer: the stream's is the one that counts */
		pthread_mutex_unlock(&poll_mu);
		if (q == cudaSuccess)
			return 0;
		if (q != cudaErrorNotReady)
			return cuda_check(q, "cudaStreamQuery", err);
		if (state != ncclSuccess && state != ncclInProgress)
			return nccl_fail(state, m->comm, call, err);
		sched_yield();
	}
}

/* The end of every blocking collective. comm.c counts a call as soon as the backend returns, so
 * "completed" must mean the data is in recv: the stream is synchronised here, not left for the
 * caller. The started forms (nccl_start, below) return after the enqueue instead. */
static int finish(NcclComm *m, ncclResult_t rc, const char *call, PxError *err)
{
	if (rc != ncclSuccess && rc != ncclInProgress)
		return nccl_fail(rc, m->comm, call, err);
	return wait_stream(m, call, err);
}

/* ---- set-up ---- */

/* One process per GPU: LOCAL_RANK picks it, unless the launcher left each process one device. */
static int pick_device(const CommEnv *env, int *device, PxError *err)
{
	int n = 0;
	if (cuda_check(cudaGetDeviceCount(&n), "cudaGetDeviceCount", err))
		return -1;
	if (n == 1) {
		*device = 0;
		return 0;
	}
	if (env->local_rank >= n)
		return px_fail(err, PX_ERR_RUNTIME,
			       "local rank %d but only %d CUDA devices are visible: NCCL needs one "
			       "GPU per process (use the MPI backend for several ranks on one GPU)",
			       env->local_rank, n);
	*device = env->local_rank;
	return 0;
}

/* NCCL's unique id from rank 0 to everyone over MPI, started here if the program did not. */
static int id_by_mpi(NcclWorld *w, const CommEnv *env, ncclUniqueId *id, PxError *err)
{
	int inited, rank, size;
	MPI_Initialized(&inited);
	if (!inited) {
		int provided;
		if (mpi_check(MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided),
			      "MPI_Init_thread", err))
			return -1;
		w->owns_mpi = 1;
	}
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	if (rank != env->rank || size != env->size)
		return px_fail(err, PX_ERR_RUNTIME,
			       "%s started rank %d of %d, but MPI sees rank %d of %d: build and "
			       "launch with the same MPI",
			       env->launcher, env->rank, env->size, rank, size);
	ncclResult_t rc = rank == 0 ? ncclGetUniqueId(id) : ncclSuccess;
	/* rank 0 says whether it has an id, so that on failure nobody starts NCCL with garbage */
	int ok = rc == ncclSuccess;
	if (mpi_check(MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD), "MPI_Bcast", err))
		return -1;
	if (!ok)
		return rank == 0 ? nccl_fail(rc, NULL, "ncclGetUniqueId", err)
				 : px_fail(err, PX_ERR_RUNTIME, "rank 0 could not create NCCL's "
								"unique id (see its message)");
	return mpi_check(MPI_Bcast(id, (int)sizeof(*id), MPI_BYTE, 0, MPI_COMM_WORLD), "MPI_Bcast",
			 err);
}

static int id_by_tcp(const CommEnv *env, ncclUniqueId *id, PxError *err)
{
	char host[256];
	int port;
	if (rendezvous_addr_from_env(host, sizeof(host), &port, err))
		return -1;
	if (env->rank == 0) {
		ncclResult_t rc = ncclGetUniqueId(id);
		if (rc != ncclSuccess)
			return nccl_fail(rc, NULL, "ncclGetUniqueId", err);
	}
	return rendezvous_bcast(host, port, env->rank, env->size, id, sizeof(*id),
				RENDEZVOUS_TIMEOUT_S, err);
}

static int unique_id(NcclWorld *w, const CommEnv *env, ncclUniqueId *id, PxError *err)
{
	if (env->size == 1) {
		ncclResult_t rc = ncclGetUniqueId(id);
		return rc == ncclSuccess ? 0 : nccl_fail(rc, NULL, "ncclGetUniqueId", err);
	}
	if (!strcmp(env->launcher, "torchrun"))
		return id_by_tcp(env, id, err);
	if (!strcmp(env->launcher, "mpirun") || !strcmp(env->launcher, "srun"))
		return id_by_mpi(w, env, id, err);
	return px_fail(err, PX_ERR_RUNTIME, "%d ranks but no launcher to bootstrap NCCL from",
		       env->size);
}

static int comm_open(NcclComm *m, const CommEnv *env, const ncclUniqueId *id, PxError *err)
{
	ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
	cfg.blocking = 0;
	ncclResult_t rc = ncclCommInitRankConfig(&m->comm, env->size, *id, env->rank, &cfg);
	if (rc != ncclSuccess && rc != ncclInProgress)
		return nccl_fail(rc, m->comm, "ncclCommInitRankConfig", err);
	if (wait_ready(m->comm, "ncclCommInitRankConfig", err))
		return -1;
	m->rank = env->rank;
	m->size = env->size;
	return 0;
}

/* Finalize (flushing what is in flight) and destroy; after a failure, abort instead, since a
 * communicator that never became ready cannot be finalized. Frees m. */
static int comm_close(NcclComm *m, int failed, PxError *err)
{
	int rc = 0;
	if (m->comm && failed) {
		ncclCommAbort(m->comm);
	} else if (m->comm) {
		ncclResult_t f = ncclCommFinalize(m->comm);
		if (f != ncclSuccess && f != ncclInProgress)
			rc = nccl_fail(f, m->comm, "ncclCommFinalize", err);
		else
			rc = wait_ready(m->comm, "ncclCommFinalize", err);
		ncclResult_t d = ncclCommDestroy(m->comm);
		if (d != ncclSuccess && !rc)
			rc = nccl_fail(d, NULL, "ncclCommDestroy", err);
	}
	if (m->scratch)
		cudaFree(m->scratch);
	free(m);
	return rc;
}

/* Undo world_open as far as it got; frees w. */
static int world_close(NcclWorld *w, PxError *err)
{
	int rc = 0;
	if (w->one)
		cudaFree(w->one);
	if (w->stream)
		cudaStreamDestroy(w->stream);
	if (w->owns_mpi)
		rc = mpi_check(MPI_Finalize(), "MPI_Finalize", err);
	if (the_world == w)
		the_world = NULL;
	free(w);
	return rc;
}

static int world_open(NcclWorld *w, const CommEnv *env, ncclUniqueId *id, PxError *err)
{
	/* the device first: NCCL, and a CUDA-aware MPI, bind to the device current at their start */
	if (pick_device(env, &w->device, err) ||
	    cuda_check(cudaSetDevice(w->device), "cudaSetDevice", err) ||
	    cuda_check(cudaStreamCreateWithFlags(&w->stream, cudaStreamNonBlocking),
		       "cudaStreamCreateWithFlags", err) ||
	    cuda_check(cudaMalloc((void **)&w->one, sizeof(float)), "cudaMalloc", err) ||
	    cuda_check(cudaMemset(w->one, 0, sizeof(float)), "cudaMemset", err))
		return -1;
	return unique_id(w, env, id, err);
}

static int nccl_init(void **world, CommEnv *env, PxError *err)
{
	if (the_world)
		return px_fail(err, PX_ERR_RUNTIME,
			       "nccl backend: already started in this process (one GPU, one world)");
	NcclWorld *w = calloc(1, sizeof(*w));
	NcclComm *m = calloc(1, sizeof(*m));
	if (!w || !m) {
		free(w);
		free(m);
		return px_fail(err, PX_ERR_RUNTIME, "nccl backend: out of memory");
	}
	m->world = w;
	ncclUniqueId id;
	if (world_open(w, env, &id, err) || comm_open(m, env, &id, err)) {
		comm_close(m, 1, NULL);
		world_close(w, NULL);
		return -1;
	}
	the_world = w;
	*world = m;
	return 0;
}

static int nccl_finalize(void *world, PxError *err)
{
	NcclComm *m = world;
	NcclWorld *w = m->world;
	int rc = comm_close(m, 0, err);
	int wc = world_close(w, rc ? NULL : err);
	return rc || wc ? -1 : 0;
}

static int nccl_split(void *parent, int color, int key, void **out, int *rank, int *size,
		      PxError *err)
{
	NcclComm *p = parent;
	*out = NULL;
	NcclComm *m = calloc(1, sizeof(*m));
	if (!m)
		return px_fail(err, PX_ERR_RUNTIME, "nccl backend: out of memory");
	m->world = p->world;
	/* config NULL: the child inherits the parent's, non-blocking included */
	ncclResult_t rc = ncclCommSplit(p->comm, color == COMM_NO_COLOR ? NCCL_SPLIT_NOCOLOR : color,
					key, &m->comm, NULL);
	if (rc != ncclSuccess && rc != ncclInProgress) {
		free(m);
		return nccl_fail(rc, p->comm, "ncclCommSplit", err);
	}
	/* a rank left out gets no communicator: its part of the split shows on the parent */
	if (wait_ready(m->comm ? m->comm : p->comm, "ncclCommSplit", err)) {
		comm_close(m, 1, NULL);
		return -1;
	}
	if (!m->comm) {
		free(m);
		return 0;
	}
	const char *call = "ncclCommUserRank";
	rc = ncclCommUserRank(m->comm, &m->rank);
	if (rc == ncclSuccess) {
		call = "ncclCommCount";
		rc = ncclCommCount(m->comm, &m->size);
	}
	if (rc != ncclSuccess) {
		nccl_fail(rc, m->comm, call, err);
		comm_close(m, 1, NULL);
		return -1;
	}
	*rank = m->rank;
	*size = m->size;
	*out = m;
	return 0;
}

static void nccl_comm_free(void *h)
{
	if (h)
		comm_close(h, 0, NULL);
}

/* From the watchdog's thread while the caller polls: abort the world so that its peers see an
 * error instead of waiting, then end the process; mpirun, srun and torchrun all stop the rest
 * of the job when one process exits early. */
static void nccl_abort(void *world, int code)
{
	NcclComm *m = world;
	pthread_mutex_lock(&poll_mu); /* never unlocked: the poller stops at its next look */
	if (m && m->comm) {
		/* should NCCL's own abort hang, SIGALRM's default action still ends the process */
		alarm(10);
		ncclCommAbort(m->comm);
	}
	_exit(code);
}

/* ---- collectives ---- */

static ncclDataType_t nccl_type(CommDtype dt)
{
	return dt == COMM_FP32 ? ncclFloat32 : dt == COMM_FP16 ? ncclFloat16 :
	       dt == COMM_INT8 ? ncclInt8 : dt == COMM_INT64 ? ncclInt64 : ncclBfloat16;
}

static ncclRedOp_t nccl_op(CommRedOp op)
{
	return op == COMM_MAX ? ncclMax : ncclSum;
}

/* NCCL takes in-place all_gather (send == recv + rank x count) and reduce_scatter (recv == send
 * + rank x count) as comm.h defines them, so both pass straight through. */
static int nccl_all_gather(void *h, const void *send, void *recv, size_t count, CommDtype dt,
			   PxError *err)
{
	NcclComm *m = h;
	ncclResult_t rc = ncclAllGather(send, recv, count, nccl_type(dt), m->comm, m->world->stream);
	return finish(m, rc, "ncclAllGather", err);
}

static int nccl_reduce_scatter(void *h, const void *send, void *recv, size_t count, CommDtype dt,
			       CommRedOp op, PxError *err)
{
	NcclComm *m = h;
	ncclResult_t rc = ncclReduceScatter(send, recv, count, nccl_type(dt), nccl_op(op), m->comm,
					    m->world->stream);
	return finish(m, rc, "ncclReduceScatter", err);
}

static int nccl_all_reduce(void *h, const void *send, void *recv, size_t count, CommDtype dt,
			   CommRedOp op, PxError *err)
{
	NcclComm *m = h;
	ncclResult_t rc = ncclAllReduce(send, recv, count, nccl_type(dt), nccl_op(op), m->comm,
					m->world->stream);
	return finish(m, rc, "ncclAllReduce", err);
}

static int nccl_reduce(void *h, const void *send, void *recv, size_t count, CommDtype dt,
		       CommRedOp op, int root, PxError *err)
{
	NcclComm *m = h;
	ncclResult_t rc = ncclReduce(send, recv, count, nccl_type(dt), nccl_op(op), root, m->comm,
				     m->world->stream);
	return finish(m, rc, "ncclReduce", err);
}

static int nccl_broadcast(void *h, const void *send, void *recv, size_t count, CommDtype dt,
			  int root, PxError *err)
{
	NcclComm *m = h;
	ncclResult_t rc = ncclBroadcast(send, recv, count, nccl_type(dt), root, m->comm,
					m->world->stream);
	return finish(m, rc, "ncclBroadcast", err);
}

/* A device buffer of at least bytes for an in-place all_to_all's copy of send. */
static int scratch_get(NcclComm *m, size_t bytes, PxError *err)
{
	if (m->scratch_bytes >= bytes)
		return 0;
	if (m->scratch)
		cudaFree(m->scratch);
	m->scratch = NULL;
	m->scratch_bytes = 0;
	if (cuda_check(cudaMalloc(&m->scratch, bytes), "cudaMalloc", err))
		return -1;
	m->scratch_bytes = bytes;
	return 0;
}

/* Every pair of ranks swaps blocks in one group of sends and receives; this rank's own block is a
 * device copy. In place, send is first copied aside, since blocks are overwritten as they
 * arrive. */
static int nccl_all_to_all(void *h, const void *send, void *recv, size_t count, CommDtype dt,
			   PxError *err)
{
	NcclComm *m = h;
	cudaStream_t s = m->world->stream;
	size_t part = count * comm_dtype_bytes(dt);
	if (send == recv && part) {
		if (scratch_get(m, part * (size_t)m->size, err) ||
		    cuda_check(cudaMemcpyAsync(m->scratch, send, part * (size_t)m->size,
					       cudaMemcpyDeviceToDevice, s),
			       "cudaMemcpyAsync", err))
			return -1;
		send = m->scratch;
	}
	const char *from = send;
	char *to = recv;
	if (part && cuda_check(cudaMemcpyAsync(to + (size_t)m->rank * part,
					       from + (size_t)m->rank * part, part,
					       cudaMemcpyDeviceToDevice, s),
			       "cudaMemcpyAsync", err))
		return -1;
	ncclResult_t rc = ncclGroupStart(), first;
	const char *call = "ncclGroupStart";
	for (int p = 0; p < m->size && rc == ncclSuccess; p++) {
		if (p == m->rank)
			continue;
		if ((rc = ncclSend(from + (size_t)p * part, count, nccl_type(dt), p, m->comm, s)) !=
		    ncclSuccess)
			call = "ncclSend";
		else if ((rc = ncclRecv(to + (size_t)p * part, count, nccl_type(dt), p, m->comm,
					s)) != ncclSuccess)
			call = "ncclRecv";
	}
	first = rc;
	/* a group once started must be ended, even after a failed call inside it */
	rc = ncclGroupEnd();
	if (first != ncclSuccess && first != ncclInProgress)
		return nccl_fail(first, m->comm, call, err);
	return finish(m, rc, "ncclGroupEnd", err);
}

static int nccl_send(void *h, const void *buf, size_t count, CommDtype dt, int peer,
		     PxError *err)
{
	NcclComm *m = h;
	ncclResult_t rc = ncclSend(buf, count, nccl_type(dt), peer, m->comm, m->world->stream);
	return finish(m, rc, "ncclSend", err);
}

static int nccl_recv(void *h, void *buf, size_t count, CommDtype dt, int peer, PxError *err)
{
	NcclComm *m = h;
	ncclResult_t rc = ncclRecv(buf, count, nccl_type(dt), peer, m->comm, m->world->stream);
	return finish(m, rc, "ncclRecv", err);
}

/* NCCL has no barrier: a one-element all-reduce returns on no rank before every rank joined. */
static int nccl_barrier(void *h, PxError *err)
{
	NcclComm *m = h;
	ncclResult_t rc = ncclAllReduce(m->world->one, m->world->one, 1, ncclFloat32, ncclMax,
					m->comm, m->world->stream);
	return finish(m, rc, "ncclAllReduce (barrier)", err);
}

/* ---- started collectives ----
 * Enqueued on the communication stream after an event recorded on the caller's compute stream
 * (so the collective reads what the compute before it wrote), with an event recorded after it.
 * The wait makes the compute stream wait for that event: the host goes on queueing compute, and
 * comm.c's comm_sync polls the event (and the communicator's errors) under the deadline before
 * the host synchronises the compute stream. Prefetch gathers and reductions share the one
 * communication stream, in the order they were started. */

typedef struct NcclReq {
	NcclComm *m;
	cudaEvent_t done;
} NcclReq;

static ncclResult_t enqueue(NcclComm *m, const CommCall *k, const char **call)
{
	cudaStream_t s = m->world->stream;
	if (k->kind == COLL_ALL_GATHER) {
		*call = "ncclAllGather";
		return ncclAllGather(k->send, k->recv, k->count, nccl_type(k->dt), m->comm, s);
	}
	if (k->kind == COLL_REDUCE_SCATTER) {
		*call = "ncclReduceScatter";
		return ncclReduceScatter(k->send, k->recv, k->count, nccl_type(k->dt), nccl_op(k->op),
					 m->comm, s);
	}
	*call = "ncclAllReduce";
	return ncclAllReduce(k->send, k->recv, k->count, nccl_type(k->dt), nccl_op(k->op), m->comm,
			     s);
}

/* The communication stream waits for what was queued on stream so far. */
static int after_compute(NcclComm *m, cudaStream_t stream, PxError *err)
{
	cudaEvent_t ready;
	if (!stream)
		return 0;
	if (cuda_check(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming),
		       "cudaEventCreateWithFlags", err))
		return -1;
	int rc = cuda_check(cudaEventRecord(ready, stream), "cudaEventRecord", err) ||
		 cuda_check(cudaStreamWaitEvent(m->world->stream, ready, 0), "cudaStreamWaitEvent",
			    err);
	cudaEventDestroy(ready); /* released once the wait it was queued for has happened */
	return rc ? -1 : 0;
}

static int nccl_start(void *h, const CommCall *k, void *stream, void **req, PxError *err)
{
	NcclComm *m = h;
	NcclReq *q = calloc(1, sizeof(*q));
	if (!q)
		return px_fail(err, PX_ERR_RUNTIME, "nccl backend: out of memory");
	q->m = m;
	const char *call = "";
	if (after_compute(m, stream, err) ||
	    cuda_check(cudaEventCreateWithFlags(&q->done, cudaEventDisableTiming),
		       "cudaEventCreateWithFlags", err)) {
		free(q);
		return -1;
	}
	ncclResult_t rc = enqueue(m, k, &call);
	if ((rc != ncclSuccess && rc != ncclInProgress && nccl_fail(rc, m->comm, call, err)) ||
	    wait_ready(m->comm, call, err) ||
	    cuda_check(cudaEventRecord(q->done, m->world->stream), "cudaEventRecord", err)) {
		cudaEventDestroy(q->done);
		free(q);
		return -1;
	}
	*req = q;
	return 0;
}

static int nccl_test(void *req, int *done, PxError *err)
{
	NcclReq *q = req;
	ncclResult_t state = ncclSuccess;
	pthread_mutex_lock(&poll_mu);
	cudaError_t e = cudaEventQuery(q->done);
	if (e == cudaErrorNotReady && ncclCommGetAsyncError(q->m->comm, &state) != ncclSuccess)
		state = ncclSuccess; /* no answer: the event's is the one that counts */
	pthread_mutex_unlock(&poll_mu);
	*done = e != cudaErrorNotReady || (state != ncclSuccess && state != ncclInProgress);
	if (!*done)
		return 0;
	int rc = e != cudaErrorNotReady ? cuda_check(e, "cudaEventQuery", err)
					: nccl_fail(state, q->m->comm, "ncclCommGetAsyncError", err);
	cudaEventDestroy(q->done);
	free(q);
	return rc;
}

/* With a compute stream: queue the dependency there and return. Without one, the host is the
 * consumer: poll until done. */
static int nccl_wait(void *req, void *stream, int *done, PxError *err)
{
	NcclReq *q = req;
	if (stream) {
		*done = 0;
		if (!cuda_check(cudaStreamWaitEvent(stream, q->done, 0), "cudaStreamWaitEvent", err))
			return 0;
		cudaEventDestroy(q->done);
		free(q);
		return -1;
	}
	for (;;) {
		if (nccl_test(q, done, err))
			return -1;
		if (*done)
			return 0;
		sched_yield();
	}
}

const CommBackend comm_nccl_backend = {
	.name = "nccl",
	.init = nccl_init,
	.split = nccl_split,
	.comm_free = nccl_comm_free,
	.finalize = nccl_finalize,
	.all_gather = nccl_all_gather,
	.reduce_scatter = nccl_reduce_scatter,
	.all_reduce = nccl_all_reduce,
	.reduce = nccl_reduce,
	.broadcast = nccl_broadcast,
	.all_to_all = nccl_all_to_all,
	.send = nccl_send,
	.recv = nccl_recv,
	.barrier = nccl_barrier,
	.start = nccl_start,
	.wait = nccl_wait,
	.test = nccl_test,
	/* .moved: none. NCCL keeps no count of the bytes its kernels moved that a program can read
	 * (its profiler plugin API reports events, not a byte total we could test without a GPU),
	 * so comm.c stores the ring formula's figure, marked computed, not counted
	 * (CommCounters.wire_counted = 0); parallax run says so beside it. */
	.abort = nccl_abort,
};

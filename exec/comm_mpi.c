/* comm_mpi: the Open MPI backend of comm.h, for CPU runs and for checking the executor without
 * GPUs. Owns MPI's start and end, splits, its error strings, comm_send/comm_recv and the barrier,
 * and the backend's byte count (moved). The collectives, run over point to point so that their
 * bytes are counted, are comm_mpi_coll.c's; call counts, deadlines and argument checks comm.c's. */
#include "comm_mpi_int.h"

#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- errors ---- */

int mpi_fail(int rc, const char *call, PxError *err)
{
	char s[MPI_MAX_ERROR_STRING];
	int len = 0;
	if (MPI_Error_string(rc, s, &len) != MPI_SUCCESS)
		snprintf(s, sizeof(s), "MPI error %d", rc);
	return px_fail(err, PX_ERR_RUNTIME, "%s: %s", call, s);
}

/* 0 when rc is MPI_SUCCESS, else -1 with err naming call and MPI's string for rc. */
int mpi_check(int rc, const char *call, PxError *err)
{
	return rc == MPI_SUCCESS ? 0 : mpi_fail(rc, call, err);
}

/* count as MPI's int, or -1 with err set: bigger calls must be split by the caller. */
int mpi_count(size_t count, const char *call, PxError *err)
{
	if (count > INT_MAX)
		return px_fail(err, PX_ERR_RUNTIME,
			       "%s: %zu elements is more than MPI's int count allows (%d); split "
			       "the call",
			       call, count, INT_MAX);
	return (int)count;
}

MPI_Datatype mpi_type(CommDtype dt)
{
	return dt == COMM_FP32 ? MPI_FLOAT : dt == COMM_INT8 ? MPI_INT8_T :
	       dt == COMM_INT64 ? MPI_INT64_T : MPI_UINT16_T;
}

/* ---- set-up ---- */

/* This process's place on its node: the ranks that share memory with it. */
static int node_place(MPI_Comm comm, int *local_rank, int *local_size, PxError *err)
{
	MPI_Comm node;
	if (mpi_check(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node),
		      "MPI_Comm_split_type", err))
		return -1;
	MPI_Comm_rank(node, local_rank);
	MPI_Comm_size(node, local_size);
	MPI_Comm_free(&node);
	return 0;
}

static int world_open(MpiWorld *w, MpiComm *m, CommEnv *env, PxError *err)
{
	int inited;
	MPI_Initialized(&inited);
	if (!inited) {
		/* MULTIPLE because comm.c's watchdog calls abort from its own thread while the
		 * caller's thread is blocked inside MPI: two threads in MPI at once, which
		 * SERIALIZED and FUNNELED forbid. Open MPI 4.1 grants it; where it is not granted,
		 * mpi_abort ends the process without calling MPI. */
		if (mpi_check(MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &w->provided),
			      "MPI_Init_thread", err))
			return -1;
		w->owns_mpi = 1;
	} else {
		MPI_Query_thread(&w->provided);
	}
	/* a duplicate keeps this layer's messages apart from the program's own MPI traffic */
	if (mpi_check(MPI_Comm_dup(MPI_COMM_WORLD, &m->comm), "MPI_Comm_dup", err))
		return -1;
	/* errors come back as codes, turned into messages, instead of MPI's default abort */
	if (mpi_check(MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN),
		      "MPI_Comm_set_errhandler", err))
		return -1;
	MPI_Comm_rank(m->comm, &m->rank);
	MPI_Comm_size(m->comm, &m->size);
	if (node_place(m->comm, &env->local_rank, &env->local_size, err))
		return -1;
	env->rank = m->rank;
	env->size = m->size;
	return 0;
}

/* Undo world_open, as far as it got; frees m and w. */
static int world_close(MpiWorld *w, MpiComm *m, PxError *err)
{
	int rc = MPI_SUCCESS, fin = MPI_SUCCESS;
	mpi_scratch_release(w);
	if (m->comm != MPI_COMM_NULL)
		rc = MPI_Comm_free(&m->comm);
	if (w->owns_mpi)
		fin = MPI_Finalize();
	free(m);
	free(w);
	if (rc != MPI_SUCCESS)
		return mpi_fail(rc, "MPI_Comm_free", err);
	return mpi_check(fin, "MPI_Finalize", err);
}

static int mpi_init(void **world, CommEnv *env, PxError *err)
{
	MpiWorld *w = calloc(1, sizeof(*w));
	MpiComm *m = calloc(1, sizeof(*m));
	if (!w || !m) {
		free(w);
		free(m);
		return px_fail(err, PX_ERR_RUNTIME, "mpi backend: out of memory");
	}
	m->comm = MPI_COMM_NULL;
	m->world = w;
	CommEnv got = *env;
	if (world_open(w, m, &got, err)) {
		world_close(w, m, NULL);
		return -1;
	}
	*env = got;
	*world = m;
	return 0;
}

static int mpi_finalize(void *world, PxError *err)
{
	MpiComm *m = world;
	return world_close(m->world, m, err);
}

static int mpi_split(void *parent, int color, int key, void **out, int *rank, int *size,
		     PxError *err)
{
	const MpiComm *p = parent;
	*out = NULL;
	MpiComm *m = calloc(1, sizeof(*m));
	if (!m)
		return px_fail(err, PX_ERR_RUNTIME, "mpi backend: out of memory");
	int rc = MPI_Comm_split(p->comm, color == COMM_NO_COLOR ? MPI_UNDEFINED : color, key,
				&m->comm);
	if (rc != MPI_SUCCESS || m->comm == MPI_COMM_NULL) {
		free(m);
		return mpi_check(rc, "MPI_Comm_split", err);
	}
	/* inherited from the parent already; said again so that no split can lose it */
	MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN);
	MPI_Comm_rank(m->comm, &m->rank);
	MPI_Comm_size(m->comm, &m->size);
	m->world = p->world;
	*rank = m->rank;
	*size = m->size;
	*out = m;
	return 0;
}

static void mpi_comm_free(void *h)
{
	MpiComm *m = h;
	if (!m)
		return;
	MPI_Comm_free(&m->comm);
	free(m);
}

static void mpi_abort(void *world, int code)
{
	const MpiComm *m = world;
	if (m && m->world->provided == MPI_THREAD_MULTIPLE)
		MPI_Abort(MPI_COMM_WORLD, code);
	/* Without MULTIPLE this thread may not call MPI, and during MPI_Finalize it is too late to.
	 * Ending the process is the one way left to stop the job: mpirun and srun tear every rank
	 * down when one exits without finalizing. */
	_exit(code);
}

/* ---- point to point and barrier ----
 * Counted as the collectives are (comm_mpi_coll.c): a send's bytes once MPI_Send returned, a
 * receive's as its status reports them. */

static int mpi_send(void *h, const void *buf, size_t count, CommDtype dt, int peer,
		    PxError *err)
{
	const MpiComm *m = h;
	int n = mpi_count(count, "MPI_Send", err);
	if (n < 0)
		return -1;
	int size = 0;
	if (mpi_check(MPI_Type_size(mpi_type(dt), &size), "MPI_Type_size", err) ||
	    mpi_check(MPI_Send(buf, n, mpi_type(dt), peer, MPI_P2P_TAG, m->comm), "MPI_Send", err))
		return -1;
	m->world->sent_bytes += (int64_t)n * size;
	return 0;
}

static int mpi_recv(void *h, void *buf, size_t count, CommDtype dt, int peer, PxError *err)
{
	const MpiComm *m = h;
	int n = mpi_count(count, "MPI_Recv", err), got, size = 0;
	MPI_Status status;
	if (n < 0 ||
	    mpi_check(MPI_Type_size(mpi_type(dt), &size), "MPI_Type_size", err) ||
	    mpi_check(MPI_Recv(buf, n, mpi_type(dt), peer, MPI_P2P_TAG, m->comm, &status), "MPI_Recv",
		      err) ||
	    mpi_check(MPI_Get_count(&status, mpi_type(dt), &got), "MPI_Get_count", err))
		return -1;
	/* a shorter message is no MPI error, but a schedule that disagrees with its peer's */
	if (got != n)
		return px_fail(err, PX_ERR_RUNTIME,
			       "MPI_Recv: expected %d elements from rank %d, got %d", n, peer, got);
	m->world->recv_bytes += (int64_t)got * size;
	return 0;
}

static int mpi_barrier(void *h, PxError *err)
{
	const MpiComm *m = h;
	return mpi_check(MPI_Barrier(m->comm), "MPI_Barrier", err);
}

static void mpi_moved(void *h, int64_t *sent_bytes, int64_t *recv_bytes)
{
	const MpiComm *m = h;
	*sent_bytes = m->world->sent_bytes;
	*recv_bytes = m->world->recv_bytes;
}

const CommBackend comm_mpi_backend = {
	.name = "mpi",
	.init = mpi_init,
	.split = mpi_split,
	.comm_free = mpi_comm_free,
	.finalize = mpi_finalize,
	.all_gather = mpi_all_gather,
	.reduce_scatter = mpi_reduce_scatter,
	.all_reduce = mpi_all_reduce,
	.reduce = mpi_reduce,
	.broadcast = mpi_broadcast,
	.all_to_all = mpi_all_to_all,
	.send = mpi_send,
	.recv = mpi_recv,
	.barrier = mpi_barrier,
	.start = mpi_start,
	.wait = mpi_wait,
	.test = mpi_test,
	.moved = mpi_moved,
	.send_start = mpi_send_start,
	.abort = mpi_abort,
};

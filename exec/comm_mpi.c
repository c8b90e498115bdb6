/* comm_mpi: the Open MPI backend of comm.h, for CPU runs and for checking the executor without
 * GPUs. Owns MPI's start and end, its error strings, and the fp16/bf16 reductions MPI lacks
 * (summed in fp32, rounded to nearest even). Counting, deadlines and argument checks are comm.c's. */
#include "comm.h"

#include <limits.h>
#include <mpi.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* What one MPI start owns; MPI is per process, so there is one. */
typedef struct MpiWorld {
	int provided;   /* the thread level MPI_Init_thread granted */
	int owns_mpi;   /* this backend called MPI_Init_thread, so it calls MPI_Finalize */
	MPI_Op half_ops[2][N_COMM_REDOPS]; /* [0: fp16, 1: bf16][CommRedOp] */
} MpiWorld;

typedef struct MpiComm {
	MPI_Comm comm;
	MpiWorld *world;
	int rank, size;
} MpiComm;

/* ---- errors ---- */

static int mpi_fail(int rc, const char *call, PxError *err)
{
	char s[MPI_MAX_ERROR_STRING];
	int len = 0;
	if (MPI_Error_string(rc, s, &len) != MPI_SUCCESS)
		snprintf(s, sizeof(s), "MPI error %d", rc);
	return px_fail(err, PX_ERR_RUNTIME, "%s: %s", call, s);
}

/* 0 when rc is MPI_SUCCESS, else -1 with err naming call and MPI's string for rc. */
static int mpi_check(int rc, const char *call, PxError *err)
{
	return rc == MPI_SUCCESS ? 0 : mpi_fail(rc, call, err);
}

/* count as MPI's int, or -1 with err set: bigger calls must be split by the caller. */
static int mpi_count(size_t count, const char *call, PxError *err)
{
	if (count > INT_MAX)
		return px_fail(err, PX_ERR_RUNTIME,
			       "%s: %zu elements is more than MPI's int count allows (%d); split "
			       "the call",
			       call, count, INT_MAX);
	return (int)count;
}

/* ---- 16-bit floats ----
 * Sums are formed in fp32 and rounded once to nearest even. That is the correctly rounded sum of
 * the two 16-bit inputs: fp32's 24 bits are at least 2p + 2 for p = 11 (fp16) and p = 8 (bf16),
 * so rounding twice cannot go wrong (Figueroa, "When is double rounding innocuous?", 1995). */

static float bits_to_f32(uint32_t b)
{
	float f;
	memcpy(&f, &b, sizeof(f));
	return f;
}

static uint32_t f32_to_bits(float f)
{
	uint32_t b;
	memcpy(&b, &f, sizeof(b));
	return b;
}

static float bf16_to_f32(uint16_t h)
{
	return bits_to_f32((uint32_t)h << 16);
}

static uint16_t f32_to_bf16(float f)
{
	uint32_t b = f32_to_bits(f);
	if ((b & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((b >> 16) | 0x40); /* a NaN stays a (quiet) NaN */
	/* adding just under half a unit, plus the kept part's lowest bit, rounds ties to even;
	 * a carry into the exponent is the right answer, up to infinity */
	b += 0x7fffu + ((b >> 16) & 1);
	return (uint16_t)(b >> 16);
}

static float fp16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000) << 16;
	uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff;
	if (exp == 0x1f)
		return bits_to_f32(sign | 0x7f800000u | (man << 13));
	if (exp == 0) {
		/* subnormal or zero: man x 2^-24, exact in fp32 */
		float v = (float)man * (1.0f / 16777216.0f);
		return sign ? -v : v;
	}
	return bits_to_f32(sign | ((exp + 127 - 15) << 23) | (man << 13));
}

/* Round the low `drop` bits of m away, to nearest with ties to even. */
static uint32_t round_shift(uint32_t m, int drop)
{
	uint32_t kept = m >> drop, rest = m & ((1u << drop) - 1), half = 1u << (drop - 1);
	return kept + (rest > half || (rest == half && (kept & 1)));
}

static uint16_t f32_to_fp16(float f)
{
	uint32_t b = f32_to_bits(f);
	uint16_t sign = (uint16_t)((b >> 16) & 0x8000);
	uint32_t a = b & 0x7fffffffu;
	if (a > 0x7f800000u)
		return sign | 0x7e00; /* NaN */
	if (a >= 0x477ff000u)
		return sign | 0x7c00; /* 65520 and up round past 65504, the largest half */
	if (a >= 0x38800000u) {
		/* normal (2^-14 and up): rebias the exponent; a mantissa carry moves it up one */
		uint32_t e = (a >> 23) - 127 + 15;
		return sign | (uint16_t)((e << 10) + round_shift(a & 0x7fffffu, 13));
	}
	if (a <= 0x33000000u)
		return sign; /* 2^-25 and below round to zero (2^-25 is the tie: zero is even) */
	/* subnormal: count units of 2^-24; rounding up from 0x3ff gives 0x400, the smallest normal */
	uint32_t m = (a & 0x7fffffu) | 0x800000u;
	return sign | (uint16_t)round_shift(m, 126 - (int)(a >> 23));
}

/* MPI user functions: inout[i] = in[i] op inout[i], element by element. */
#define HALF_OP(name, to_f32, from_f32, combine)                                          \
	static void name(void *in, void *inout, int *len, MPI_Datatype *dt)               \
	{                                                                                  \
		(void)dt;                                                                  \
		const uint16_t *a = in;                                                    \
		uint16_t *b = inout;                                                       \
		for (int i = 0; i < *len; i++) {                                           \
			float x = to_f32(a[i]), y = to_f32(b[i]);                          \
			b[i] = from_f32(combine);                                          \
		}                                                                          \
	}
HALF_OP(fp16_sum, fp16_to_f32, f32_to_fp16, x + y)
HALF_OP(bf16_sum, bf16_to_f32, f32_to_bf16, x + y)
/* max is exact: one of the two inputs, converted back unchanged */
HALF_OP(fp16_max, fp16_to_f32, f32_to_fp16, x > y ? x : y)
HALF_OP(bf16_max, bf16_to_f32, f32_to_bf16, x > y ? x : y)

static MPI_Datatype mpi_type(CommDtype dt)
{
	/* 16-bit values travel as plain 16-bit words; only the reductions look inside them */
	return dt == COMM_FP32 ? MPI_FLOAT : MPI_UINT16_T;
}

static MPI_Op mpi_op(const MpiComm *m, CommDtype dt, CommRedOp op)
{
	if (dt == COMM_FP32)
		return op == COMM_MAX ? MPI_MAX : MPI_SUM;
	return m->world->half_ops[dt == COMM_BF16][op];
}

static int ops_create(MpiWorld *w, PxError *err)
{
	MPI_User_function *fns[2][N_COMM_REDOPS] = {{fp16_sum, fp16_max}, {bf16_sum, bf16_max}};
	for (int t = 0; t < 2; t++)
		for (int o = 0; o < N_COMM_REDOPS; o++)
			if (mpi_check(MPI_Op_create(fns[t][o], 1, &w->half_ops[t][o]),
				      "MPI_Op_create", err))
				return -1;
	return 0;
}

static void ops_free(MpiWorld *w)
{
	for (int t = 0; t < 2; t++)
		for (int o = 0; o < N_COMM_REDOPS; o++)
			if (w->half_ops[t][o] != MPI_OP_NULL)
				MPI_Op_free(&w->half_ops[t][o]);
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
	if (node_place(m->comm, &env->local_rank, &env->local_size, err) || ops_create(w, err))
		return -1;
	env->rank = m->rank;
	env->size = m->size;
	return 0;
}

/* Undo world_open, as far as it got; frees m and w. */
static int world_close(MpiWorld *w, MpiComm *m, PxError *err)
{
	int rc = MPI_SUCCESS, fin = MPI_SUCCESS;
	ops_free(w);
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
	for (int t = 0; t < 2; t++)
		for (int o = 0; o < N_COMM_REDOPS; o++)
			w->half_ops[t][o] = MPI_OP_NULL;
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

/* ---- collectives ---- */

static int mpi_all_gather(void *h, const void *send, void *recv, size_t count, CommDtype dt,
			  PxError *err)
{
	const MpiComm *m = h;
	int n = mpi_count(count, "MPI_Allgather", err);
	if (n < 0)
		return -1;
	size_t part = count * comm_dtype_bytes(dt);
	if ((uintptr_t)send == (uintptr_t)recv + (size_t)m->rank * part)
		send = MPI_IN_PLACE;
	return mpi_check(MPI_Allgather(send, n, mpi_type(dt), recv, n, mpi_type(dt), m->comm),
			 "MPI_Allgather", err);
}

static int mpi_reduce_scatter(void *h, const void *send, void *recv, size_t count, CommDtype dt,
			      CommRedOp op, PxError *err)
{
	const MpiComm *m = h;
	int n = mpi_count(count, "MPI_Reduce_scatter_block", err);
	if (n < 0)
		return -1;
	size_t part = count * comm_dtype_bytes(dt);
	if ((uintptr_t)recv != (uintptr_t)send + (size_t)m->rank * part)
		return mpi_check(MPI_Reduce_scatter_block(send, recv, n, mpi_type(dt),
							  mpi_op(m, dt, op), m->comm),
				 "MPI_Reduce_scatter_block", err);
	/* NCCL's in place (recv is this rank's block of send) is MPI's in place with the result
	 * at the start of the buffer; send is writable, since recv lies inside it */
	void *whole = (void *)(uintptr_t)send;
	if (mpi_check(MPI_Reduce_scatter_block(MPI_IN_PLACE, whole, n, mpi_type(dt),
					       mpi_op(m, dt, op), m->comm),
		      "MPI_Reduce_scatter_block", err))
		return -1;
	memmove(recv, whole, part);
	return 0;
}

static int mpi_all_reduce(void *h, const void *send, void *recv, size_t count, CommDtype dt,
			  CommRedOp op, PxError *err)
{
	const MpiComm *m = h;
	int n = mpi_count(count, "MPI_Allreduce", err);
	if (n < 0)
		return -1;
	return mpi_check(MPI_Allreduce(send == recv ? MPI_IN_PLACE : send, recv, n, mpi_type(dt),
				       mpi_op(m, dt, op), m->comm),
			 "MPI_Allreduce", err);
}

static int mpi_reduce(void *h, const void *send, void *recv, size_t count, CommDtype dt,
		      CommRedOp op, int root, PxError *err)
{
	const MpiComm *m = h;
	int n = mpi_count(count, "MPI_Reduce", err);
	if (n < 0)
		return -1;
	if (m->rank != root)
		recv = NULL; /* not significant off the root */
	else if (send == recv)
		send = MPI_IN_PLACE; /* MPI forbids passing one buffer as both */
	return mpi_check(MPI_Reduce(send, recv, n, mpi_type(dt), mpi_op(m, dt, op), root, m->comm),
			 "MPI_Reduce", err);
}

static int mpi_broadcast(void *h, const void *send, void *recv, size_t count, CommDtype dt,
			 int root, PxError *err)
{
	const MpiComm *m = h;
	int n = mpi_count(count, "MPI_Bcast", err);
	if (n < 0)
		return -1;
	/* MPI broadcasts one buffer in place; NCCL's root may send from another */
	if (m->rank == root && send != recv)
		memcpy(recv, send, count * comm_dtype_bytes(dt));
	return mpi_check(MPI_Bcast(recv, n, mpi_type(dt), root, m->comm), "MPI_Bcast", err);
}

static int mpi_all_to_all(void *h, const void *send, void *recv, size_t count, CommDtype dt,
			  PxError *err)
{
	const MpiComm *m = h;
	int n = mpi_count(count, "MPI_Alltoall", err);
	if (n < 0)
		return -1;
	if (send == recv)
		return mpi_check(MPI_Alltoall(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, n,
					      mpi_type(dt), m->comm),
				 "MPI_Alltoall", err);
	return mpi_check(MPI_Alltoall(send, n, mpi_type(dt), recv, n, mpi_type(dt), m->comm),
			 "MPI_Alltoall", err);
}

enum { P2P_TAG = 0 }; /* on this layer's own duplicate of the world, so it clashes with nothing */

static int mpi_send(void *h, const void *buf, size_t count, CommDtype dt, int peer,
		    PxError *err)
{
	const MpiComm *m = h;
	int n = mpi_count(count, "MPI_Send", err);
	if (n < 0)
		return -1;
	return mpi_check(MPI_Send(buf, n, mpi_type(dt), peer, P2P_TAG, m->comm), "MPI_Send",
			 err);
}

static int mpi_recv(void *h, void *buf, size_t count, CommDtype dt, int peer, PxError *err)
{
	const MpiComm *m = h;
	int n = mpi_count(count, "MPI_Recv", err), got;
	MPI_Status status;
	if (n < 0 ||
	    mpi_check(MPI_Recv(buf, n, mpi_type(dt), peer, P2P_TAG, m->comm, &status), "MPI_Recv",
		      err) ||
	    mpi_check(MPI_Get_count(&status, mpi_type(dt), &got), "MPI_Get_count", err))
		return -1;
	/* a shorter message is no MPI error, but a schedule that disagrees with its peer's */
	if (got != n)
		return px_fail(err, PX_ERR_RUNTIME,
			       "MPI_Recv: expected %d elements from rank %d, got %d", n, peer, got);
	return 0;
}

static int mpi_barrier(void *h, PxError *err)
{
	const MpiComm *m = h;
	return mpi_check(MPI_Barrier(m->comm), "MPI_Barrier", err);
}

/* ---- started collectives: MPI-3's non-blocking forms ----
 * MPI_Iallgather, MPI_Ireduce_scatter_block and MPI_Iallreduce take the blocking calls' arguments
 * (MPI_IN_PLACE included) plus a request; the buffers belong to MPI until MPI_Wait completes it.
 * Open MPI progresses them inside MPI calls (MPI_Test, MPI_Wait, any other), so on the host the
 * overlap is in the order of operations; the bytes and sums are the blocking calls' (the
 * algorithms may add in another order: fp32 results can differ in the last bits). */

typedef struct MpiReq {
	MPI_Request r;
	void *move_to;       /* an in-place reduce-scatter's result goes here once complete */
	const void *move_from;
	size_t move_bytes;
} MpiReq;

static int start_reduce_scatter(const MpiComm *m, const CommCall *k, MpiReq *q, PxError *err)
{
	int n = mpi_count(k->count, "MPI_Ireduce_scatter_block", err);
	if (n < 0)
		return -1;
	size_t part = k->count * comm_dtype_bytes(k->dt);
	const void *send = k->send;
	void *recv = k->recv;
	if ((uintptr_t)recv == (uintptr_t)send + (size_t)m->rank * part) {
		/* in place as mpi_reduce_scatter does it: the result lands at the buffer's start */
		recv = (void *)(uintptr_t)send;
		send = MPI_IN_PLACE;
		q->move_to = k->recv;
		q->move_from = recv;
		q->move_bytes = part;
	}
	return mpi_check(MPI_Ireduce_scatter_block(send, recv, n, mpi_type(k->dt),
						   mpi_op(m, k->dt, k->op), m->comm, &q->r),
			 "MPI_Ireduce_scatter_block", err);
}

static int start_other(const MpiComm *m, const CommCall *k, MpiReq *q, PxError *err)
{
	const char *call = k->kind == COLL_ALL_GATHER ? "MPI_Iallgather" : "MPI_Iallreduce";
	int n = mpi_count(k->count, call, err);
	if (n < 0)
		return -1;
	const void *send = k->send;
	if (k->kind == COLL_ALL_REDUCE)
		return mpi_check(MPI_Iallreduce(send == k->recv ? MPI_IN_PLACE : send, k->recv, n,
						mpi_type(k->dt), mpi_op(m, k->dt, k->op), m->comm,
						&q->r),
				 call, err);
	size_t part = k->count * comm_dtype_bytes(k->dt);
	if ((uintptr_t)send == (uintptr_t)k->recv + (size_t)m->rank * part)
		send = MPI_IN_PLACE;
	return mpi_check(MPI_Iallgather(send, n, mpi_type(k->dt), k->recv, n, mpi_type(k->dt),
					m->comm, &q->r),
			 call, err);
}

static int mpi_start(void *h, const CommCall *k, void *stream, void **req, PxError *err)
{
	const MpiComm *m = h;
	(void)stream; /* host memory: nothing queued anywhere to wait for */
	MpiReq *q = calloc(1, sizeof(*q));
	if (!q)
		return px_fail(err, PX_ERR_RUNTIME, "mpi backend: out of memory");
	int rc = k->kind == COLL_REDUCE_SCATTER ? start_reduce_scatter(m, k, q, err)
						: start_other(m, k, q, err);
	if (rc) {
		free(q);
		return -1;
	}
	*req = q;
	return 0;
}

static int finish_req(MpiReq *q, int rc, PxError *err)
{
	if (!rc && q->move_bytes)
		memmove(q->move_to, q->move_from, q->move_bytes);
	free(q);
	return rc ? mpi_fail(rc, "MPI_Wait", err) : 0;
}

/* On the host the results are there only once MPI says so: always blocks. */
static int mpi_wait(void *req, void *stream, int *done, PxError *err)
{
	MpiReq *q = req;
	(void)stream;
	*done = 1;
	return finish_req(q, MPI_Wait(&q->r, MPI_STATUS_IGNORE), err);
}

static int mpi_test(void *req, int *done, PxError *err)
{
	MpiReq *q = req;
	int flag = 0, rc = MPI_Test(&q->r, &flag, MPI_STATUS_IGNORE);
	*done = rc != MPI_SUCCESS || flag;
	return *done ? finish_req(q, rc, err) : 0;
}

static int mpi_send_start(void *h, const void *buf, size_t count, CommDtype dt, int peer,
			  void **req, PxError *err)
{
	const MpiComm *m = h;
	int n = mpi_count(count, "MPI_Isend", err);
	if (n < 0)
		return -1;
	MpiReq *q = calloc(1, sizeof(*q));
	if (!q)
		return px_fail(err, PX_ERR_RUNTIME, "mpi backend: out of memory");
	if (mpi_check(MPI_Isend(buf, n, mpi_type(dt), peer, P2P_TAG, m->comm, &q->r), "MPI_Isend",
		      err)) {
		free(q);
		return -1;
	}
	*req = q;
	return 0;
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
	.send_start = mpi_send_start,
	.abort = mpi_abort,
};

/* comm: the executor's collectives, NCCL-shaped and backend-neutral. Owns communicators (world and
 * its splits), argument checks, the deadline every blocking call runs under (a watchdog that stops
 * the whole job) and the per-kind, per-group counters that the executor compares with sim/traffic
 * (wire bytes as the backend counted them). Moving and counting bytes is a backend's job
 * (comm_mpi.c, comm_nccl.c, comm_mpi_staged_cuda.c); mapping schedule ops to calls the executor's. */
#ifndef PX_EXEC_COMM_H
#define PX_EXEC_COMM_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "../engine/err.h"
#include "../engine/schedule.h"
#include "../kernels/precision.h"

/* COMM_INT8: bytes moved as they are (ZeRO++'s quantized values); never reduced. COMM_INT64:
 * counts (an MoE gate's busiest expert, all-reduced with max). */
typedef enum { COMM_FP32, COMM_FP16, COMM_BF16, COMM_INT8, COMM_INT64, N_COMM_DTYPES } CommDtype;
typedef enum { COMM_SUM, COMM_MAX, N_COMM_REDOPS } CommRedOp;

/* the collectives' type for a kernel's values */
static inline CommDtype comm_prec(PrecisionType p)
{
	return p == PREC_F32 ? COMM_FP32 : p == PREC_BF16 ? COMM_BF16 : COMM_FP16;
}

/* Counter rows. Rows 0..N_COLLS-1 are the schedule's CollKind in its order, so row k is compared
 * with sim/traffic's row k: comm_send counts as COLL_P2P, comm_recv as COLL_P2P_RECV (payload the
 * message, nothing sent). The rows after them are calls a schedule has no kind for. */
enum {
	COMM_KIND_REDUCE = N_COLLS, /* wire as a broadcast: the same chain, run backwards */
	COMM_KIND_BARRIER,          /* calls only */
	N_COMM_KINDS
};

/* Counter columns: a CommGroup, or COMM_TAG_WORLD for the world communicator and anything else
 * outside the schedule's groups. */
enum { COMM_TAG_WORLD = N_GROUPS, N_COMM_TAGS };

/* comm_split's color for a rank that joins no group (NCCL_SPLIT_NOCOLOR). */
#define COMM_NO_COLOR (-1)

/* What this rank did, summed over every communicator of one comm_init. Indexed [kind][tag].
 * Wire bytes are counted where the backend counts them (wire_counted: the MPI backends, which
 * report what each point-to-point message of their algorithms carried, exec/comm_mpi_coll.c);
 * NCCL reports no byte counts, so there they are computed: sim/traffic's ring formula applied to
 * the payload, equal to the prediction by construction, and said so wherever they are shown. */
typedef struct CommCounters {
	long long calls[N_COMM_KINDS][N_COMM_TAGS];
	int64_t payload_bytes[N_COMM_KINDS][N_COMM_TAGS]; /* nccl-tests "size": the whole array */
	double wire_bytes[N_COMM_KINDS][N_COMM_TAGS];     /* sent by this rank */
	int64_t recv_bytes[N_COMM_KINDS][N_COMM_TAGS];    /* received, as the transport reported;
							     0 where not counted */
	int wire_counted; /* 1: counted by the transport; 0: computed from the formula */
} CommCounters;

/* Where this process sits in the job. */
typedef struct CommEnv {
	int rank, size;             /* in the world */
	int local_rank, local_size; /* on this node: which GPU to take */
	const char *launcher;       /* "mpirun", "srun", "torchrun" or "none" (a singleton); static */
} CommEnv;

/* The watchdog's line names this rank, the overdue call and its number on the communicator, and,
 * from a progress board the ranks of one node share (exec/progress.h), the members that never
 * reached that call, by world rank, with what they are doing: "rank 0: all_reduce on group dp
 * (call 9 on this communicator) did not complete within 2 s; not arrived: rank 1 (at call 8,
 * outside comm for 2.0 s)"; or "all 4 ranks arrived (...)"; ranks on other nodes are counted as
 * not visible, never named. Without a board (said once at comm_init) the line stops after
 * "within 2 s". docs/gpu_comm.md, "Errors and hangs", has the wording and the limits. */
typedef struct CommConfig {
	double deadline_s; /* longest any blocking call may take before the job is stopped; 0: none */
	FILE *log;         /* where the watchdog writes its line (and comm_init a missing board's
			    * notice); NULL: stderr */
	/* Called by the watchdog thread with its line, before it stops the job (e.g. to record a
	 * failed run); the main thread is blocked in the overdue call meanwhile. NULL: none. */
	void (*on_deadline)(void *ctx, const char *line);
	void *ctx;
} CommConfig;

typedef struct Comm Comm; /* one communicator; opaque */
typedef struct CommRequest CommRequest; /* a started collective (comm_*_start); opaque */

/* A started collective as a backend receives it: the blocking call's arguments. */
typedef struct CommCall {
	int kind;         /* COLL_ALL_GATHER, COLL_REDUCE_SCATTER or COLL_ALL_REDUCE */
	const void *send;
	void *recv;
	size_t count;     /* as the blocking call's */
	CommDtype dt;
	CommRedOp op;     /* the reductions' */
} CommCall;

/* A backend: one file fills this table (nccl-tests' struct testColl). Handles are the backend's
 * own communicators. Every function returns 0, or -1 with err naming the backend call and its
 * error string; comm.c adds the rank, the operation and the group. Counts are elements; count
 * limits are the backend's to check. Calls come from one thread at a time, except abort. */
typedef struct CommBackend {
	const char *name;
	/* Start the runtime; return the world's handle and this process's place in it. */
	int (*init)(void **world, CommEnv *env, PxError *err);
	/* *out is NULL for COMM_NO_COLOR; rank and size are in the new communicator. */
	int (*split)(void *parent, int color, int key, void **out, int *rank, int *size, PxError *err);
	void (*comm_free)(void *h);
	int (*finalize)(void *world, PxError *err);
	int (*all_gather)(void *h, const void *send, void *recv, size_t count, CommDtype dt,
			  PxError *err);
	int (*reduce_scatter)(void *h, const void *send, void *recv, size_t count, CommDtype dt,
			      CommRedOp op, PxError *err);
	int (*all_reduce)(void *h, const void *send, void *recv, size_t count, CommDtype dt,
			  CommRedOp op, PxError *err);
	int (*reduce)(void *h, const void *send, void *recv, size_t count, CommDtype dt,
		      CommRedOp op, int root, PxError *err);
	int (*broadcast)(void *h, const void *send, void *recv, size_t count, CommDtype dt,
			 int root, PxError *err);
	int (*all_to_all)(void *h, const void *send, void *recv, size_t count, CommDtype dt,
			  PxError *err);
	int (*send)(void *h, const void *buf, size_t count, CommDtype dt, int peer, PxError *err);
	int (*recv)(void *h, void *buf, size_t count, CommDtype dt, int peer, PxError *err);
	int (*barrier)(void *h, PxError *err);
	/* Started collectives; all three NULL where the backend has none (comm.c then runs the
	 * blocking call at the start and the wait has nothing to do). stream: comm_set_stream's
	 * (NULL: none). start issues call and returns its request in *req, ordered after what
	 * was queued on stream. wait makes whatever comes after it see the results: either it
	 * blocks until they are there (*done = 1, req freed), or it orders stream after them and
	 * returns at once (*done = 0: test it until done). test never blocks; it frees req once
	 * *done = 1. On failure wait and test free req too. */
	int (*start)(void *h, const CommCall *call, void *stream, void **req, PxError *err);
	int (*wait)(void *req, void *stream, int *done, PxError *err);
	int (*test)(void *req, int *done, PxError *err);
	/* Bytes this process has sent and received through the backend's transport, counted
	 * message by message (never from a formula), for the calls that completed so far: a
	 * blocking call once it returned, a started one once its wait (or the test that found it
	 * done) returned, never earlier, so that the difference across one call is that call's.
	 * h: any handle of the backend. NULL where the backend cannot count (NCCL): the counters
	 * then hold computed wire bytes (CommCounters.wire_counted = 0). */
	void (*moved)(void *h, int64_t *sent_bytes, int64_t *recv_bytes);
	/* A started send (wait and test complete it as a started collective); NULL where the
	 * backend has none. */
	int (*send_start)(void *h, const void *buf, size_t count, CommDtype dt, int peer,
			  void **req, PxError *err);
	/* Stop every process of the job now, with exit status code. Called by the watchdog thread
	 * while the caller's thread is blocked inside another call; world is NULL when that call is
	 * finalize (the handle may be gone). Returns only where stopping the job is not possible
	 * (test fakes); the blocked call must then return. */
	void (*abort)(void *world, int code);
} CommBackend;

extern const CommBackend comm_mpi_backend;
#ifdef PX_HAVE_NCCL
extern const CommBackend comm_nccl_backend; /* comm_nccl.h: one process per GPU */
#endif
#ifdef PX_HAVE_CUDA
extern const CommBackend comm_mpi_staged_backend; /* comm_mpi_staged_cuda.c: many ranks, one GPU */
#endif

/* Exit status of a job the watchdog stopped (timeout(1)'s). */
#define COMM_DEADLINE_EXIT 124

/* ---- set-up ---- */

void comm_config_init(CommConfig *cfg); /* deadline 60 s, log to stderr */

/* Where the launcher put this process, from the environment alone, before any backend starts
 * (CUDA devices must be chosen before NCCL or a CUDA-aware MPI starts): Open MPI's mpirun
 * (OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK/LOCAL_SIZE), then Slurm's srun (SLURM_PROCID, SLURM_NTASKS,
 * SLURM_LOCALID), then torchrun's (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE). Returns 1
 * when a launcher was found, 0 for a singleton (rank 0 of 1), -1 with err when torchrun's
 * variables are incomplete, not numbers, or contradict each other (RANK >= WORLD_SIZE). */
int comm_env_read(CommEnv *env, PxError *err);

/* comm_env_read for callers that only ask whether a launcher is there: malformed variables read
 * as a singleton (0); comm_init then refuses them with comm_env_read's message. */
int comm_env_probe(CommEnv *env);

/* The shared-memory name of this job's progress board on this node (exec/progress.h), into name:
 * "/px-board-UID-JOB-N", JOB the launcher's job id (PMIx's namespace or Open MPI's job id under
 * mpirun, SLURM_JOB_ID.SLURM_STEP_ID under srun, torchrun's run id, port and restart count; the
 * pid without a launcher), N counting this process's calls, so the N-th comm_init of every rank of
 * the job names the same board; characters other than letters, digits, '.', '-' and '_' are
 * replaced. Where the job has a folder of its own for shared memory (COMM_RUN_DIR_ENV, set by
 * parallax's supervisor, which removes it however the job ends), the board is a file there:
 * "DIR/px-board-UID-JOB-N". -1 when the launcher gave no job id, or the name does not fit (no
 * board then). */
int comm_env_board_name(const CommEnv *env, char *name, size_t bytes);

/* The environment variable naming the job's own shared-memory folder (cli/launch.h). */
#define COMM_RUN_DIR_ENV "PX_RUN_DIR"

/* Start backend be (NULL: MPI) and return the world communicator (tag COMM_TAG_WORLD) in *world,
 * owned by the caller until comm_finalize. cfg NULL: defaults. The backend's start runs under the
 * deadline. Fails when the launcher's variables are malformed, or when the launcher's world and
 * the backend's disagree: a program built against another MPI than its mpirun, or the MPI
 * backend under torchrun. */
int comm_init(const CommBackend *be, const CommConfig *cfg, Comm **world, PxError *err);

/* Collective over parent: ranks with the same color form one communicator, ordered by key, whose
 * calls are counted under tag (a CommGroup or COMM_TAG_WORLD). *out is NULL for COMM_NO_COLOR;
 * otherwise owned by the caller, to comm_destroy before comm_finalize. */
int comm_split(Comm *parent, int color, int key, int tag, Comm **out, PxError *err);
void comm_destroy(Comm *c); /* a split communicator; NULL is fine */

/* Shut the backend down and free world. Refused while split communicators are still open. */
int comm_finalize(Comm *world, PxError *err);

int comm_rank(const Comm *c);
int comm_size(const Comm *c);
int comm_tag(const Comm *c);
const CommEnv *comm_env(const Comm *c); /* the world's, as comm_init found it */

/* Change the deadline of every communicator of this comm_init from the next call on; 0: none.
 * Refused unless 0 <= deadline_s <= 1e9. */
int comm_set_deadline(Comm *c, double deadline_s, PxError *err);

/* ---- counters ---- */

const CommCounters *comm_counters(const Comm *c); /* shared by every communicator of one init */
void comm_counters_reset(Comm *c); /* zero every count; wire_counted stays */

/* ---- collectives: NCCL's argument order and conventions ----
 * count is per rank for all_gather, reduce_scatter and all_to_all (count x nranks elements in the
 * whole array), the whole array otherwise. In place: all_reduce and broadcast with send == recv,
 * all_gather with send == recv + rank x count, reduce_scatter with recv == send + rank x count
 * (the rest of send is then undefined), all_to_all with send == recv; other overlaps are refused.
 * fp16 and bf16 add in fp32 and round to nearest even after every addition of the backend's
 * algorithm, so sums over more than two ranks depend on its order. Each call blocks, runs under the deadline and is counted once it
 * completed; it returns 0, or -1 with err as "rank 3: all_gather on group dp: MPI_Allgather: ...". */
int comm_all_gather(Comm *c, const void *send, void *recv, size_t count, CommDtype dt,
		    PxError *err);
int comm_reduce_scatter(Comm *c, const void *send, void *recv, size_t count, CommDtype dt,
			CommRedOp op, PxError *err);
int comm_all_reduce(Comm *c, const void *send, void *recv, size_t count, CommDtype dt,
		    CommRedOp op, PxError *err);
/* recv matters on root only. */
int comm_reduce(Comm *c, const void *send, void *recv, size_t count, CommDtype dt, CommRedOp op,
		int root, PxError *err);
/* send matters on root only. */
int comm_broadcast(Comm *c, const void *send, void *recv, size_t count, CommDtype dt, int root,
		   PxError *err);
/* Rank r's block j (count elements) goes to rank j's block r. */
int comm_all_to_all(Comm *c, const void *send, void *recv, size_t count, CommDtype dt,
		    PxError *err);
int comm_send(Comm *c, const void *buf, size_t count, CommDtype dt, int peer, PxError *err);
int comm_recv(Comm *c, void *buf, size_t count, CommDtype dt, int peer, PxError *err);
int comm_barrier(Comm *c, PxError *err);

/* ---- started collectives ----
 * The same calls, arguments and checks, issued without waiting: *req is the caller's until
 * comm_wait. Until then the call owns its buffers: send must not be written, recv neither read,
 * written nor freed. Every rank starts and calls collectives on a communicator in the same order,
 * blocking ones included. Where the backend has no started form the whole call runs at the start.
 * comm_wait runs under the deadline and counts the call (once); after it, results are in recv for
 * the host (MPI backends) or for the work queued on the compute stream after it (NCCL with
 * comm_set_stream: the host is not blocked; comm_sync waits for the transfers themselves). */
int comm_all_gather_start(Comm *c, const void *send, void *recv, size_t count, CommDtype dt,
			  CommRequest **req, PxError *err);
int comm_reduce_scatter_start(Comm *c, const void *send, void *recv, size_t count, CommDtype dt,
			      CommRedOp op, CommRequest **req, PxError *err);
int comm_all_reduce_start(Comm *c, const void *send, void *recv, size_t count, CommDtype dt,
			  CommRedOp op, CommRequest **req, PxError *err);
/* comm_send, started: buf is the call's until comm_wait, which completes once the peer's
 * receive has matched it (on MPI; sends to one peer match its receives in order). Pipeline
 * stages send while their peer may still be computing: a blocking send of each to the other at
 * once would wait for ever. Refused where the backend has no started send (MPI only). */
int comm_send_start(Comm *c, const void *buf, size_t count, CommDtype dt, int peer,
		    CommRequest **req, PxError *err);
/* Frees req (NULL is fine); -1 with err as the blocking call's on failure. */
int comm_wait(CommRequest *req, PxError *err);
/* Block until every waited request of this comm_init has completed on its device, under the
 * deadline: before the host synchronises a compute stream that waits for one (so that a hung
 * peer ends the job instead of a synchronisation that never returns). Nothing to do on MPI. */
int comm_sync(Comm *c, PxError *err);
/* Requests of this comm_init started and not yet waited. */
int comm_in_flight(const Comm *c);
/* End the job at once with code, for a failure that left requests in flight (comm_in_flight):
 * their buffers are MPI's or NCCL's until completed, so neither freeing them nor finalizing is
 * safe. Flushes stdio first; the backend's abort stops the other ranks too. Does not return. */
void comm_abort(Comm *c, int code);
/* The compute stream (a cudaStream_t, opaque here) that started collectives are ordered against:
 * a start waits for what was queued on it, and a wait queues its dependency there. NULL: none
 * (host compute). For every communicator of c's comm_init. */
void comm_set_stream(Comm *c, void *stream);

/* ---- names ---- */

size_t comm_dtype_bytes(CommDtype dt);
const char *comm_dtype_name(CommDtype dt); /* "fp32", "fp16", "bf16", "int8" */
const char *comm_kind_name(int kind);      /* coll_name's, then "reduce", "barrier" */
const char *comm_tag_name(int tag);        /* group_name's, then "world" */

#endif

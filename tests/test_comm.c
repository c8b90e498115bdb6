/* The executor's communication layer (exec/comm): accounting, argument checks, error messages, the
 * watchdog and the progress board through a fake backend in this process (MPI itself leaks under
 * LeakSanitizer, so the runner never starts it); the real Open MPI backend through mpirun is
 * test_comm_mpi.c's. Expected byte counts are worked by hand from nccl-tests' formulas
 * (doc/PERFORMANCE.md). */
#include <CUnit/CUnit.h>
#include <dirent.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../engine/clock.h"
#include "../exec/comm.h"
#include "../exec/progress.h"
#include "../sim/traffic.h"
#include "suites.h"

/* ---- a fake backend: a world of fake.size ranks of which this process is rank 0 ---- */

static struct {
	int size;       /* of the world */
	int split_size; /* of every split */
	int calls;      /* collectives that reached the backend */
	int fail_next;  /* the next call fails */
	int hang_next;  /* the next call blocks until abort (at most 5 s) */
	double slow_s;  /* every call takes this long */
	int aborted, abort_code;
	int open;       /* handles not yet freed */
	void (*on_call)(void); /* called as every collective reaches the backend; NULL: none */
	/* the counting fake's transport: what each successful call moves, and the totals */
	int64_t per_call_sent, per_call_recv, sent, recvd;
	pthread_mutex_t mu;
	pthread_cond_t cv;
} fake = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

typedef struct FakeComm {
	int rank, size;
} FakeComm;

static void *fake_handle(int size)
{
	FakeComm *f = calloc(1, sizeof(*f));
	if (f) {
		f->size = size;
		fake.open++;
	}
	return f;
}

static int fake_call(PxError *err)
{
	fake.calls++;
	if (fake.on_call)
		fake.on_call();
	if (fake.slow_s > 0)
		nanosleep(&(struct timespec){0, (long)(fake.slow_s * 1e9)}, NULL);
	if (fake.fail_next) {
		fake.fail_next = 0;
		return px_fail(err, PX_ERR_RUNTIME, "fake: injected failure");
	}
	fake.sent += fake.per_call_sent;
	fake.recvd += fake.per_call_recv;
	if (fake.hang_next) {
		fake.hang_next = 0;
		double give_up = px_now_s() + 5;
		pthread_mutex_lock(&fake.mu);
		while (!fake.aborted && px_now_s() < give_up) {
			pthread_mutex_unlock(&fake.mu);
			nanosleep(&(struct timespec){0, 10000000}, NULL);
			pthread_mutex_lock(&fake.mu);
		}
		pthread_mutex_unlock(&fake.mu);
	}
	return 0;
}

static int fake_init(void **world, CommEnv *env, PxError *err)
{
	(void)err;
	env->rank = 0;
	env->size = fake.size;
	env->local_rank = 0;
	env->local_size = fake.size;
	*world = fake_handle(fake.size);
	return *world ? 0 : -1;
}

static int fake_split(void *parent, int color, int key, void **out, int *rank, int *size,
		      PxError *err)
{
	(void)parent, (void)key;
	*out = NULL;
	if (fake_call(err))
		return -1;
	if (color == COMM_NO_COLOR)
		return 0;
	*rank = 0;
	*size = fake.split_size;
	*out = fake_handle(fake.split_size);
	return *out ? 0 : -1;
}

static void fake_free(void *h)
{
	if (h)
		fake.open--;
	free(h);
}

static int fake_finalize(void *world, PxError *err)
{
	(void)err;
	fake_free(world);
	return 0;
}

static int fake_all_gather(void *h, const void *send, void *recv, size_t count, CommDtype dt,
			   PxError *err)
{
	(void)h, (void)send, (void)recv, (void)count, (void)dt;
	return fake_call(err);
}

static int fake_reduce_scatter(void *h, const void *send, void *recv, size_t count, CommDtype dt,
			       CommRedOp op, PxError *err)
{
	(void)h, (void)send, (void)recv, (void)count, (void)dt, (void)op;
	return fake_call(err);
}

static int fake_reduce(void *h, const void *send, void *recv, size_t count, CommDtype dt,
		       CommRedOp op, int root, PxError *err)
{
	(void)h, (void)send, (void)recv, (void)count, (void)dt, (void)op, (void)root;
	return fake_call(err);
}

static int fake_broadcast(void *h, const void *send, void *recv, size_t count, CommDtype dt,
			  int root, PxError *err)
{
	(void)h, (void)send, (void)recv, (void)count, (void)dt, (void)root;
	return fake_call(err);
}

static int fake_p2p(void *h, const void *buf, size_t count, CommDtype dt, int peer, PxError *err)
{
	(void)h, (void)buf, (void)count, (void)dt, (void)peer;
	return fake_call(err);
}

static int fake_recv(void *h, void *buf, size_t count, CommDtype dt, int peer, PxError *err)
{
	return fake_p2p(h, buf, count, dt, peer, err);
}

static int fake_barrier(void *h, PxError *err)
{
	(void)h;
	return fake_call(err);
}

/* Runs on the watchdog's thread: releases the hanging call instead of ending the process. */
static void fake_abort(void *world, int code)
{
	(void)world;
	pthread_mutex_lock(&fake.mu);
	fake.aborted = 1;
	fake.abort_code = code;
	pthread_mutex_unlock(&fake.mu);
}

static const CommBackend fake_backend = {
	.name = "fake",
	.init = fake_init,
	.split = fake_split,
	.comm_free = fake_free,
	.finalize = fake_finalize,
	.all_gather = fake_all_gather,
	.reduce_scatter = fake_reduce_scatter,
	.all_reduce = fake_reduce_scatter,
	.reduce = fake_reduce,
	.broadcast = fake_broadcast,
	.all_to_all = fake_all_gather,
	.send = fake_p2p,
	.recv = fake_recv,
	.barrier = fake_barrier,
	.abort = fake_abort,
};

/* The same fake with a transport that counts (as the MPI backend does): fake.per_call_* bytes a
 * call, whatever the call; comm.c must store these, not a formula's. */
static void fake_moved(void *h, int64_t *sent_bytes, int64_t *recv_bytes)
{
	(void)h;
	*sent_bytes = fake.sent;
	*recv_bytes = fake.recvd;
}

static CommBackend fake_counting_backend;

static const CommBackend *counting_backend(void)
{
	fake_counting_backend = fake_backend;
	fake_counting_backend.name = "fake-counting";
	fake_counting_backend.moved = fake_moved;
	return &fake_counting_backend;
}

/* ---- the launcher's variables: cleared around every test that starts a backend ---- */

static const char *const LAUNCHER_VARS[] = {
	"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
	"OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
	"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"};
#define N_LAUNCHER_VARS (int)(sizeof(LAUNCHER_VARS) / sizeof(LAUNCHER_VARS[0]))
static char *saved_vars[N_LAUNCHER_VARS];

static void env_clear(void)
{
	for (int i = 0; i < N_LAUNCHER_VARS; i++) {
		const char *v = getenv(LAUNCHER_VARS[i]);
		saved_vars[i] = v ? strdup(v) : NULL;
		unsetenv(LAUNCHER_VARS[i]);
	}
}

static void env_restore(void)
{
	for (int i = 0; i < N_LAUNCHER_VARS; i++) {
		if (saved_vars[i])
			setenv(LAUNCHER_VARS[i], saved_vars[i], 1);
		else
			unsetenv(LAUNCHER_VARS[i]);
		free(saved_vars[i]);
		saved_vars[i] = NULL;
	}
}

/* A fake world (backend be) of `size` ranks whose splits have split_size; NULL (and CU_FAIL) on
 * failure. */
static Comm *fake_world_on(const CommBackend *be, int size, int split_size, const CommConfig *cfg)
{
	PxError err = {0};
	Comm *world = NULL;
	pthread_mutex_lock(&fake.mu);
	fake.aborted = fake.abort_code = 0;
	pthread_mutex_unlock(&fake.mu);
	fake.size = size;
	fake.split_size = split_size;
	fake.calls = fake.fail_next = fake.hang_next = 0;
	fake.slow_s = 0;
	fake.per_call_sent = fake.per_call_recv = fake.sent = fake.recvd = 0;
	env_clear();
	if (comm_init(be, cfg, &world, &err)) {
		fprintf(stderr, "\n%s\n", err.msg);
		CU_FAIL("comm_init with the fake backend");
	}
	return world;
}

static Comm *fake_world(int size, int split_size, const CommConfig *cfg)
{
	return fake_world_on(&fake_backend, size, split_size, cfg);
}

static void fake_done(Comm *world)
{
	PxError err = {0};
	if (world && comm_finalize(world, &err)) {
		fprintf(stderr, "\n%s\n", err.msg);
		CU_FAIL("comm_finalize");
	}
	CU_ASSERT_EQUAL(fake.open, 0);
	env_restore();
}

static Comm *split(Comm *parent, int tag)
{
	PxError err = {0};
	Comm *c = NULL;
	if (comm_split(parent, 0, 0, tag, &c, &err)) {
		fprintf(stderr, "\n%s\n", err.msg);
		CU_FAIL("comm_split");
	}
	return c;
}

/* ---- accounting ---- */

static char buf_a[1 << 16], buf_b[1 << 16];

/* Every call once or twice on a world of 4 and a dp group of 2; expected bytes by hand. The fake
 * counts nothing (as NCCL), so wire bytes are computed from the ring formula and said to be. */
static void test_counters_by_hand(void)
{
	PxError err = {0};
	Comm *w = fake_world(4, 2, NULL);
	CU_ASSERT_PTR_NOT_NULL_FATAL(w);
	Comm *dp = split(w, GROUP_DP);
	CU_ASSERT_PTR_NOT_NULL_FATAL(dp);
	CU_ASSERT_EQUAL(comm_size(dp), 2);
	CU_ASSERT_EQUAL(comm_tag(dp), GROUP_DP);

	/* world, n = 4 */
	CU_ASSERT_EQUAL(comm_all_gather(w, buf_a, buf_b, 1000, COMM_FP32, &err), 0);
	CU_ASSERT_EQUAL(comm_all_gather(w, buf_a, buf_b, 1000, COMM_FP32, &err), 0);
	CU_ASSERT_EQUAL(comm_all_reduce(w, buf_a, buf_a, 1000, COMM_BF16, COMM_SUM, &err), 0);
	CU_ASSERT_EQUAL(comm_all_to_all(w, buf_a, buf_b, 8, COMM_FP32, &err), 0);
	CU_ASSERT_EQUAL(comm_broadcast(w, buf_a, buf_b, 100, COMM_FP32, 0, &err), 0);
	CU_ASSERT_EQUAL(comm_reduce(w, buf_a, buf_b, 100, COMM_FP16, COMM_MAX, 3, &err), 0);
	CU_ASSERT_EQUAL(comm_send(w, buf_a, 50, COMM_FP16, 1, &err), 0);
	CU_ASSERT_EQUAL(comm_recv(w, buf_b, 50, COMM_FP16, 3, &err), 0);
	CU_ASSERT_EQUAL(comm_barrier(w, &err), 0);
	/* dp, n = 2 */
	CU_ASSERT_EQUAL(comm_reduce_scatter(dp, buf_a, buf_b, 10, COMM_FP16, COMM_SUM, &err), 0);
	CU_ASSERT_EQUAL(comm_all_reduce(dp, buf_a, buf_b, 6, COMM_FP32, COMM_SUM, &err), 0);
	CU_ASSERT_EQUAL(fake.calls, 1 + 11); /* the split, then the calls */

	const CommCounters *k = comm_counters(w);
	CU_ASSERT_PTR_EQUAL(k, comm_counters(dp)); /* one set per comm_init */
	CU_ASSERT_EQUAL(k->wire_counted, 0);
	const int W = COMM_TAG_WORLD, D = GROUP_DP;
	/* all_gather: 1000 x 4 ranks x 4 B = 16000 payload, 3/4 of it = 12000 sent, twice */
	CU_ASSERT_EQUAL(k->calls[COLL_ALL_GATHER][W], 2);
	CU_ASSERT_EQUAL(k->payload_bytes[COLL_ALL_GATHER][W], 32000);
	CU_ASSERT_EQUAL(k->wire_bytes[COLL_ALL_GATHER][W], 24000);
	/* all_reduce bf16: 2000 payload, 2 x 3/4 = 3000 sent */
	CU_ASSERT_EQUAL(k->payload_bytes[COLL_ALL_REDUCE][W], 2000);
	CU_ASSERT_EQUAL(k->wire_bytes[COLL_ALL_REDUCE][W], 3000);
	/* all_to_all: 8 per peer x 4 x 4 B = 128, 3/4 = 96 */
	CU_ASSERT_EQUAL(k->payload_bytes[COLL_ALL_TO_ALL][W], 128);
	CU_ASSERT_EQUAL(k->wire_bytes[COLL_ALL_TO_ALL][W], 96);
	/* broadcast and reduce: the array, all of it sent */
	CU_ASSERT_EQUAL(k->payload_bytes[COLL_BROADCAST][W], 400);
	CU_ASSERT_EQUAL(k->wire_bytes[COLL_BROADCAST][W], 400);
	CU_ASSERT_EQUAL(k->payload_bytes[COMM_KIND_REDUCE][W], 200);
	CU_ASSERT_EQUAL(k->wire_bytes[COMM_KIND_REDUCE][W], 200);
	/* send: the message, sent; recv: the message, nothing sent */
	CU_ASSERT_EQUAL(k->payload_bytes[COLL_P2P][W], 100);
	CU_ASSERT_EQUAL(k->wire_bytes[COLL_P2P][W], 100);
	CU_ASSERT_EQUAL(k->calls[COLL_P2P_RECV][W], 1);
	CU_ASSERT_EQUAL(k->payload_bytes[COLL_P2P_RECV][W], 100);
	CU_ASSERT_EQUAL(k->wire_bytes[COLL_P2P_RECV][W], 0);
	CU_ASSERT_EQUAL(k->calls[COMM_KIND_BARRIER][W], 1);
	CU_ASSERT_EQUAL(k->payload_bytes[COMM_KIND_BARRIER][W], 0);
	/* dp: reduce_scatter 10 x 2 x 2 B = 40, half sent; all_reduce 24, 2 x 1/2 = 24 sent */
	CU_ASSERT_EQUAL(k->payload_bytes[COLL_REDUCE_SCATTER][D], 40);
	CU_ASSERT_EQUAL(k->wire_bytes[COLL_REDUCE_SCATTER][D], 20);
	CU_ASSERT_EQUAL(k->payload_bytes[COLL_ALL_REDUCE][D], 24);
	CU_ASSERT_EQUAL(k->wire_bytes[COLL_ALL_REDUCE][D], 24);
	CU_ASSERT_EQUAL(k->calls[COLL_ALL_REDUCE][D], 1);
	CU_ASSERT_EQUAL(k->calls[COLL_ALL_REDUCE][W], 1);
	/* nothing anywhere else */
	long long total = 0;
	for (int kind = 0; kind < N_COMM_KINDS; kind++)
		for (int g = 0; g < N_COMM_TAGS; g++)
			total += k->calls[kind][g];
	CU_ASSERT_EQUAL(total, 11);

	comm_counters_reset(dp);
	for (int kind = 0; kind < N_COMM_KINDS; kind++)
		for (int g = 0; g < N_COMM_TAGS; g++)
			CU_ASSERT(!k->calls[kind][g] && !k->payload_bytes[kind][g] &&
				  !k->wire_bytes[kind][g]);
	comm_destroy(dp);
	fake_done(w);
}

/* A backend that counts (the MPI backends): each call is credited with what the transport
 * reported across it, 1001 bytes sent and 999 received a call here, never the formula's share
 * (12000 for the first all-gather); a started call at its wait, not its start; a failed call not
 * at all; and a formula made wrong through sim/traffic's test hook changes the computed figures
 * of a backend that cannot count (NCCL's) but not the counted ones. */
static void test_counters_counted(void)
{
	PxError err = {0};
	Comm *w = fake_world_on(counting_backend(), 4, 2, NULL);
	CU_ASSERT_PTR_NOT_NULL_FATAL(w);
	fake.per_call_sent = 1001;
	fake.per_call_recv = 999;
	const int W = COMM_TAG_WORLD;
	const CommCounters *k = comm_counters(w);
	CU_ASSERT_EQUAL(k->wire_counted, 1);
	CU_ASSERT_EQUAL(comm_all_gather(w, buf_a, buf_b, 1000, COMM_FP32, &err), 0);
	CU_ASSERT_EQUAL(k->payload_bytes[COLL_ALL_GATHER][W], 16000);
	CU_ASSERT_EQUAL(k->wire_bytes[COLL_ALL_GATHER][W], 1001);
	CU_ASSERT_EQUAL(k->recv_bytes[COLL_ALL_GATHER][W], 999);
	/* the fake has no started form: the call runs whole at its start, is counted at its wait */
	CommRequest *q = NULL;
	CU_ASSERT_EQUAL(comm_all_reduce_start(w, buf_a, buf_a, 100, COMM_FP32, COMM_SUM, &q, &err), 0);
	CU_ASSERT_EQUAL(k->calls[COLL_ALL_REDUCE][W], 0);
	CU_ASSERT_EQUAL(k->wire_bytes[COLL_ALL_REDUCE][W], 0);
	CU_ASSERT_EQUAL(comm_barrier(w, &err), 0); /* a call in between keeps its own bytes */
	CU_ASSERT_EQUAL(k->wire_bytes[COMM_KIND_BARRIER][W], 1001);
	CU_ASSERT_EQUAL(comm_wait(q, &err), 0);
	CU_ASSERT_EQUAL(k->calls[COLL_ALL_REDUCE][W], 1);
	CU_ASSERT_EQUAL(k->wire_bytes[COLL_ALL_REDUCE][W], 1001);
	CU_ASSERT_EQUAL(k->recv_bytes[COLL_ALL_REDUCE][W], 999);
	/* a failed call moved nothing the counters keep */
	fake.fail_next = 1;
	CU_ASSERT_EQUAL(comm_all_gather(w, buf_a, buf_b, 1000, COMM_FP32, &err), -1);
	CU_ASSERT_EQUAL(k->wire_bytes[COLL_ALL_GATHER][W], 1001);
	/* the simulator's formula halved: counted bytes do not follow */
	traffic_test_set_wire_scale(0.5);
	CU_ASSERT_EQUAL(comm_all_gather(w, buf_a, buf_b, 1000, COMM_FP32, &err), 0);
	CU_ASSERT_EQUAL(k->wire_bytes[COLL_ALL_GATHER][W], 2002);
	traffic_test_set_wire_scale(1);
	comm_counters_reset(w);
	CU_ASSERT_EQUAL(k->wire_counted, 1); /* a property of the backend, kept */
	CU_ASSERT_EQUAL(k->wire_bytes[COLL_ALL_GATHER][W], 0);
	CU_ASSERT_EQUAL(k->recv_bytes[COLL_ALL_GATHER][W], 0);
	fake_done(w);

	/* computed (a backend without counts): the formula, halved with it */
	w = fake_world(4, 2, NULL);
	CU_ASSERT_PTR_NOT_NULL_FATAL(w);
	k = comm_counters(w);
	traffic_test_set_wire_scale(0.5);
	CU_ASSERT_EQUAL(comm_all_gather(w, buf_a, buf_b, 1000, COMM_FP32, &err), 0);
	traffic_test_set_wire_scale(1);
	CU_ASSERT_EQUAL(k->wire_counted, 0);
	CU_ASSERT_EQUAL(k->wire_bytes[COLL_ALL_GATHER][W], 6000); /* 12000 x 0.5 */
	CU_ASSERT_EQUAL(k->recv_bytes[COLL_ALL_GATHER][W], 0);
	fake_done(w);
}

/* A collective op as sched_coll writes it (payload = elems x elem_bytes), set by field so that this
 * test follows the Op layout rather than the appender's argument list. */
static Op coll_op(CollKind kind, CommGroup group, int nranks, int64_t elems, int elem_bytes)
{
	return (Op){.kind = OP_COLL, .sub = (uint8_t)kind, .group = (uint8_t)group,
		    .elem_bytes = (uint8_t)elem_bytes, .unit = 0, .buf = -1, .nranks = nranks,
		    .slice = -1, .role = ROLE_GRAD_REDUCE, .elems = elems,
		    .bytes = (double)elems * elem_bytes};
}

/* What the executor must show: replaying a schedule's collectives through comm gives exactly the
 * bytes sim/traffic predicts for it, per kind and per group, loops included. Sizes keep every
 * ring share whole, so that sums of shares equal shares of sums. */
static void test_counters_match_simulator(void)
{
	Op ops[] = {
		{.kind = OP_LOOP, .count = 3},
		coll_op(COLL_ALL_GATHER, GROUP_DP, 4, 4000, 2),
		coll_op(COLL_REDUCE_SCATTER, GROUP_DP, 4, 4000, 2),
		coll_op(COLL_ALL_REDUCE, GROUP_TP, 2, 1000, 4),
		{.kind = OP_END_LOOP},
		coll_op(COLL_ALL_REDUCE, GROUP_DP, 4, 6000, 2),
		coll_op(COLL_ALL_TO_ALL, GROUP_EP, 4, 800, 2),
		coll_op(COLL_BROADCAST, GROUP_DP, 4, 512, 4),
		coll_op(COLL_P2P, GROUP_PP, 2, 256, 2),
		coll_op(COLL_P2P_RECV, GROUP_PP, 2, 256, 2),
	};
	Schedule s = {.ops = ops, .n = (int)(sizeof(ops) / sizeof(ops[0])), .step_begin = 0};
	/* one node, ring algorithms: what a backend that knows no topology measures */
	GroupSpan spans[N_GROUPS];
	for (int g = 0; g < N_GROUPS; g++)
		spans[g] = (GroupSpan){.n = 4, .nodes = 1, .per_node = 4};
	Traffic t;
	PxError err = {0};
	CU_ASSERT_EQUAL_FATAL(sim_traffic(&s, spans, ALGO_RING, 4, &t, &err), 0);

	/* one communicator per group; the fake gives every split the op's nranks */
	Comm *w = fake_world(4, 4, NULL);
	CU_ASSERT_PTR_NOT_NULL_FATAL(w);
	Comm *groups[N_GROUPS] = {NULL};
	int times = 1;
	for (int i = s.step_begin; i < s.n; i++) {
		const Op *op = &s.ops[i];
		if (op->kind == OP_LOOP || op->kind == OP_END_LOOP)
			times = op->kind == OP_LOOP ? (int)op->count : 1;
		if (op->kind != OP_COLL)
			continue;
		if (!groups[op->group]) {
			fake.split_size = op->nranks;
			groups[op->group] = split(w, op->group);
		}
		Comm *c = groups[op->group];
		CU_ASSERT_PTR_NOT_NULL_FATAL(c);
		CommDtype dt = op->elem_bytes == 4 ? COMM_FP32 : COMM_BF16;
		size_t whole = (size_t)op->elems, part = whole / (size_t)op->nranks;
		for (int rep = 0; rep < times; rep++) {
			int rc = -1;
			switch (op->sub) {
			case COLL_ALL_GATHER:
				rc = comm_all_gather(c, buf_a, buf_b, part, dt, &err);
				break;
			case COLL_REDUCE_SCATTER:
				rc = comm_reduce_scatter(c, buf_a, buf_b, part, dt, COMM_SUM, &err);
				break;
			case COLL_ALL_REDUCE:
				rc = comm_all_reduce(c, buf_a, buf_a, whole, dt, COMM_SUM, &err);
				break;
			case COLL_ALL_TO_ALL:
				rc = comm_all_to_all(c, buf_a, buf_b, part, dt, &err);
				break;
			case COLL_BROADCAST:
				rc = comm_broadcast(c, buf_a, buf_b, whole, dt, 0, &err);
				break;
			case COLL_P2P:
				rc = comm_send(c, buf_a, whole, dt, 1, &err);
				break;
			case COLL_P2P_RECV:
				rc = comm_recv(c, buf_a, whole, dt, 1, &err);
				break;
			}
			CU_ASSERT_EQUAL(rc, 0);
		}
	}

	const CommCounters *k = comm_counters(w);
	double group_payload[N_GROUPS] = {0}, group_wire[N_GROUPS] = {0};
	for (int kind = 0; kind < N_COLLS; kind++) {
		long long calls = 0;
		double payload = 0, wire = 0;
		for (int g = 0; g < N_COMM_TAGS; g++) {
			calls += k->calls[kind][g];
			payload += (double)k->payload_bytes[kind][g];
			wire += k->wire_bytes[kind][g];
			/* sim/traffic counts a message once per group, at its send */
			if (g < N_GROUPS && kind != COLL_P2P_RECV)
				group_payload[g] += (double)k->payload_bytes[kind][g];
			if (g < N_GROUPS)
				group_wire[g] += k->wire_bytes[kind][g];
		}
		CU_ASSERT_EQUAL(calls, t.n_colls[kind]);
		CU_ASSERT_EQUAL(payload, t.payload_bytes[kind]);
		CU_ASSERT_EQUAL(wire, t.wire_bytes[kind]);
		if (payload != t.payload_bytes[kind] || wire != t.wire_bytes[kind])
			fprintf(stderr, "\n%s: measured %.0f payload %.1f wire, simulated %.0f %.1f\n",
				coll_name(kind), payload, wire, t.payload_bytes[kind],
				t.wire_bytes[kind]);
	}
	for (int g = 0; g < N_GROUPS; g++) {
		CU_ASSERT_EQUAL(group_payload[g], t.group_payload_bytes[g]);
		CU_ASSERT_EQUAL(group_wire[g], t.group_wire_bytes[g]);
	}
	CU_ASSERT_EQUAL(t.n_colls[COLL_P2P_RECV], 1);
	CU_ASSERT_EQUAL(t.wire_bytes[COLL_P2P_RECV], 0);
	/* and the hand sums: 3 x (8000 + 8000) + 6000... as payload */
	CU_ASSERT_EQUAL(t.payload_bytes[COLL_ALL_GATHER], 3 * 8000);
	CU_ASSERT_EQUAL(t.wire_bytes[COLL_ALL_REDUCE], 3 * 4000 + 2 * 3 * 12000 / 4);

	for (int g = 0; g < N_GROUPS; g++)
		comm_destroy(groups[g]);
	fake_done(w);
}

/* ---- refusals and messages ---- */

static void expect_refused(int rc, const PxError *err, const char *want)
{
	CU_ASSERT_EQUAL(rc, -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(err->msg, want));
	if (rc != -1 || !strstr(err->msg, want))
		fprintf(stderr, "\nexpected \"%s\" in \"%s\"\n", want, err->msg);
}

static void test_bad_arguments(void)
{
	PxError err = {0};
	Comm *w = fake_world(4, 2, NULL);
	CU_ASSERT_PTR_NOT_NULL_FATAL(w);
	expect_refused(comm_broadcast(w, buf_a, buf_b, 4, COMM_FP32, 4, &err), &err,
		       "rank 0: broadcast on group world: root 4 is not a rank of 0-3");
	expect_refused(comm_reduce(w, buf_a, buf_b, 4, COMM_FP32, COMM_SUM, -1, &err), &err,
		       "rank 0: reduce on group world: root -1");
	expect_refused(comm_send(w, buf_a, 4, COMM_FP32, 0, &err), &err,
		       "rank 0: send on group world: peer 0 must be another rank of 0-3 (this is 0)");
	expect_refused(comm_recv(w, buf_a, 4, COMM_FP32, 7, &err), &err, "peer 7");
	expect_refused(comm_all_reduce(w, NULL, buf_b, 4, COMM_FP32, COMM_SUM, &err), &err,
		       "rank 0: all_reduce on group world: send or recv is NULL");
	expect_refused(comm_all_reduce(w, buf_a, buf_a + 4, 4, COMM_FP32, COMM_SUM, &err), &err,
		       "overlap");
	/* rank 0's block of an in-place all_gather is recv itself; one element on is not */
	CU_ASSERT_EQUAL(comm_all_gather(w, buf_a, buf_a, 4, COMM_FP32, &err), 0);
	expect_refused(comm_all_gather(w, buf_a + 4, buf_a, 4, COMM_FP32, &err), &err,
		       "send overlaps recv other than at recv + rank x count");
	CU_ASSERT_EQUAL(comm_reduce_scatter(w, buf_a, buf_a, 4, COMM_FP16, COMM_SUM, &err), 0);
	expect_refused(comm_reduce_scatter(w, buf_a, buf_a + 2, 4, COMM_FP16, COMM_SUM, &err),
		       &err, "recv overlaps send");
	expect_refused(comm_all_to_all(w, buf_a, buf_a + 8, 4, COMM_FP32, &err), &err, "overlap");
	expect_refused(comm_all_reduce(w, buf_a, buf_b, 4, (CommDtype)7, COMM_SUM, &err), &err,
		       "unknown data type 7");
	expect_refused(comm_all_reduce(w, buf_a, buf_b, 4, COMM_FP32, (CommRedOp)9, &err), &err,
		       "reduction 9");
	expect_refused(comm_all_gather(w, buf_a, buf_b, SIZE_MAX / 2, COMM_FP32, &err), &err,
		       "count too large");
	Comm *c = NULL;
	expect_refused(comm_split(w, -5, 0, GROUP_DP, &c, &err), &err, "color -5");
	expect_refused(comm_split(w, 0, 0, N_COMM_TAGS, &c, &err), &err, "tag must be 0-8");
	CU_ASSERT_PTR_NULL(c);
	/* zero elements is a call like any other (NCCL allows it), and NULL buffers are fine then */
	CU_ASSERT_EQUAL(comm_all_reduce(w, NULL, NULL, 0, COMM_FP32, COMM_SUM, &err), 0);
	/* only the two in-place calls and the empty one reached the backend and were counted */
	CU_ASSERT_EQUAL(fake.calls, 3);
	const CommCounters *k = comm_counters(w);
	CU_ASSERT_EQUAL(k->calls[COLL_ALL_GATHER][COMM_TAG_WORLD], 1);
	CU_ASSERT_EQUAL(k->calls[COLL_REDUCE_SCATTER][COMM_TAG_WORLD], 1);
	CU_ASSERT_EQUAL(k->calls[COLL_ALL_REDUCE][COMM_TAG_WORLD], 1);
	CU_ASSERT_EQUAL(k->payload_bytes[COLL_ALL_REDUCE][COMM_TAG_WORLD], 0);
	fake_done(w);
}

static void test_backend_errors_named(void)
{
	PxError err = {0};
	Comm *w = fake_world(4, 2, NULL);
	CU_ASSERT_PTR_NOT_NULL_FATAL(w);
	Comm *dp = split(w, GROUP_DP);
	CU_ASSERT_PTR_NOT_NULL_FATAL(dp);
	fake.fail_next = 1;
	expect_refused(comm_all_reduce(dp, buf_a, buf_b, 4, COMM_BF16, COMM_SUM, &err), &err,
		       "rank 0: all_reduce on group dp: fake: injected failure");
	CU_ASSERT_EQUAL(comm_counters(w)->calls[COLL_ALL_REDUCE][GROUP_DP], 0);
	fake.fail_next = 1;
	Comm *c = NULL;
	expect_refused(comm_split(w, 1, 0, GROUP_TP, &c, &err), &err,
		       "rank 0: comm_split on group world: fake: injected failure");
	CU_ASSERT_PTR_NULL(c);
	comm_destroy(dp);
	fake_done(w);
}

/* ---- the watchdog ---- */

static void test_watchdog_fires(void)
{
	PxError err = {0};
	char line[256] = "";
	CommConfig cfg;
	comm_config_init(&cfg);
	CU_ASSERT_EQUAL(cfg.deadline_s, 60);
	cfg.deadline_s = 0.2;
	cfg.log = tmpfile();
	CU_ASSERT_PTR_NOT_NULL_FATAL(cfg.log);
	Comm *w = fake_world(4, 2, &cfg);
	CU_ASSERT_PTR_NOT_NULL_FATAL(w);
	fake.hang_next = 1;
	double t0 = px_now_s();
	int rc = comm_all_gather(w, buf_a, buf_b, 16, COMM_FP32, &err);
	double took = px_now_s() - t0;
	/* The fake's world of 4 is this process alone: the board sees rank 0 and not the three
	 * others, as it would see ranks on other nodes. */
	const char *want = "rank 0: all_gather on group world (call 1 on this communicator) did not "
			   "complete within 0.2 s; the only rank on this node arrived; 3 ranks on "
			   "other nodes not visible";
	CU_ASSERT_EQUAL(rc, -1);
	CU_ASSERT_STRING_EQUAL(err.msg, want);
	CU_ASSERT(took >= 0.2 && took < 2.0);
	CU_ASSERT_EQUAL(fake.abort_code, COMM_DEADLINE_EXIT);
	rewind(cfg.log);
	CU_ASSERT_PTR_NOT_NULL(fgets(line, sizeof(line), cfg.log));
	CU_ASSERT(!strncmp(line, want, strlen(want)) && !strcmp(line + strlen(want), "\n"));
	CU_ASSERT_EQUAL(comm_counters(w)->calls[COLL_ALL_GATHER][COMM_TAG_WORLD], 0);
	/* the next call has its own deadline again */
	fake.aborted = 0;
	CU_ASSERT_EQUAL(comm_barrier(w, &err), 0);
	/* a split's calls are numbered on the split: world calls 1-3 were the all_gather, the
	 * barrier and the split itself; the tp barrier is the split's first, and of its 2 ranks the
	 * other is not visible */
	Comm *tp = split(w, GROUP_TP);
	CU_ASSERT_PTR_NOT_NULL_FATAL(tp);
	fake.hang_next = 1;
	CU_ASSERT_EQUAL(comm_barrier(tp, &err), -1);
	CU_ASSERT_STRING_EQUAL(err.msg, "rank 0: barrier on group tp (call 1 on this communicator) "
			       "did not complete within 0.2 s; the only rank on this node arrived; "
			       "1 rank on another node not visible");
	fake.aborted = 0;
	fake.hang_next = 1;
	CU_ASSERT_EQUAL(comm_barrier(w, &err), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "barrier on group world (call 4 on this "));
	fake.aborted = 0;
	comm_destroy(tp);
	fake_done(w);
	fclose(cfg.log);
}

/* A launcher that names no job (mpirun's variables without PMIx's namespace): no board, said
 * once at comm_init, and the line is the one without it. */
static void test_watchdog_without_board(void)
{
	static const char *const ids[] = {"PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid",
					  "OMPI_MCA_orte_ess_jobid"};
	char *saved[3], line[512] = "";
	PxError err = {0};
	CommConfig cfg;
	comm_config_init(&cfg);
	cfg.deadline_s = 0.2;
	cfg.log = tmpfile();
	CU_ASSERT_PTR_NOT_NULL_FATAL(cfg.log);
	for (int i = 0; i < 3; i++) {
		const char *v = getenv(ids[i]);
		saved[i] = v ? strdup(v) : NULL;
		unsetenv(ids[i]);
	}
	/* fake_world's reset, with mpirun's variables where it clears them */
	fake.aborted = fake.abort_code = 0;
	fake.size = 4;
	fake.split_size = 2;
	fake.calls = fake.fail_next = fake.hang_next = 0;
	fake.slow_s = 0;
	env_clear();
	setenv("OMPI_COMM_WORLD_RANK", "0", 1);
	setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
	setenv("OMPI_COMM_WORLD_LOCAL_RANK", "0", 1);
	setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "4", 1);
	Comm *w = NULL;
	CU_ASSERT_EQUAL_FATAL(comm_init(&fake_backend, &cfg, &w, &err), 0);
	CU_ASSERT_EQUAL(fake.calls, 2); /* the board's two barriers run all the same */
	fake.hang_next = 1;
	CU_ASSERT_EQUAL(comm_all_gather(w, buf_a, buf_b, 16, COMM_FP32, &err), -1);
	CU_ASSERT_STRING_EQUAL(err.msg,
			       "rank 0: all_gather on group world did not complete within 0.2 s");
	rewind(cfg.log);
	CU_ASSERT_PTR_NOT_NULL(fgets(line, sizeof(line), cfg.log));
	CU_ASSERT_STRING_EQUAL(line, "rank 0: comm: no progress board (the launcher gave no job "
			       "id): a missed deadline will name the waiting rank only\n");
	CU_ASSERT_PTR_NOT_NULL(fgets(line, sizeof(line), cfg.log));
	CU_ASSERT_STRING_EQUAL(line,
			       "rank 0: all_gather on group world did not complete within 0.2 s\n");
	CU_ASSERT_PTR_NULL(fgets(line, sizeof(line), cfg.log));
	fake.aborted = 0;
	CU_ASSERT_EQUAL(comm_finalize(w, &err), 0);
	CU_ASSERT_EQUAL(fake.open, 0);
	env_restore();
	for (int i = 0; i < 3; i++) {
		if (saved[i])
			setenv(ids[i], saved[i], 1);
		free(saved[i]);
	}
	fclose(cfg.log);
}

/* ---- the board in the job's folder ---- */

static struct {
	char dir[256], prefix[128]; /* where this test's boards are, and their names' start */
	int at_call, at_deadline;   /* boards there at the first barrier, when the watchdog fired */
} seen;

static int boards(void)
{
	DIR *d = opendir(seen.dir);
	int n = 0;
	for (struct dirent *e; d && (e = readdir(d));)
		n += !strncmp(e->d_name, seen.prefix, strlen(seen.prefix));
	if (d)
		closedir(d);
	return n;
}

static void count_at_call(void)
{
	if (seen.at_call < 0)
		seen.at_call = boards();
}

static void count_at_deadline(void *ctx, const char *line)
{
	(void)ctx, (void)line;
	seen.at_deadline = boards();
}

/* Under parallax's supervisor (PX_RUN_DIR names the job's folder in /dev/shm, which it removes
 * however the job ends) the board is a file of that folder: there at the first barrier, gone once
 * both have passed. A job stopped while starting (the other rank never reaches the board's
 * barrier) loses the board's name before the watchdog stops it, in that folder or, without one,
 * in /dev/shm: before, only the second barrier's passing removed it, and a job aborted there left
 * /dev/shm/px-board-... behind. */
static void test_board_in_run_dir(void)
{
	PxError err = {0};
	CommConfig cfg;
	char ns[64];
	comm_config_init(&cfg);
	cfg.deadline_s = 0.3;
	cfg.on_deadline = count_at_deadline;
	cfg.log = tmpfile();
	CU_ASSERT_PTR_NOT_NULL_FATAL(cfg.log);
	const char *job_dir = px_test_tmpdir();
	snprintf(ns, sizeof(ns), "px-test-%ld", (long)getpid());
	snprintf(seen.prefix, sizeof(seen.prefix), "px-board-%u-%s-", (unsigned)getuid(), ns);
	const char *saved_ns = getenv("PMIX_NAMESPACE");
	char *keep_ns = saved_ns ? strdup(saved_ns) : NULL;
	for (int k = 0; k < 3; k++) { /* in the folder: start, stop; without: stop */
		int stop = k > 0, in_dir = k < 2;
		snprintf(seen.dir, sizeof(seen.dir), "%s", in_dir ? job_dir : "/dev/shm");
		pthread_mutex_lock(&fake.mu);
		fake.aborted = fake.abort_code = 0;
		pthread_mutex_unlock(&fake.mu);
		fake.size = 2;
		fake.split_size = 2;
		fake.calls = fake.fail_next = 0;
		fake.slow_s = 0;
		fake.hang_next = stop; /* the first barrier waits for a rank that never comes */
		fake.on_call = count_at_call;
		seen.at_call = seen.at_deadline = -1;
		env_clear();
		setenv("OMPI_COMM_WORLD_RANK", "0", 1);
		setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
		setenv("OMPI_COMM_WORLD_LOCAL_RANK", "0", 1);
		setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2", 1);
		setenv("PMIX_NAMESPACE", ns, 1);
		if (in_dir)
			setenv(COMM_RUN_DIR_ENV, job_dir, 1);
		Comm *w = NULL;
		int rc = comm_init(&fake_backend, &cfg, &w, &err);
		fake.on_call = NULL;
		CU_ASSERT_EQUAL(seen.at_call, 1);
		CU_ASSERT_EQUAL(boards(), 0);
		if (stop) {
			CU_ASSERT_EQUAL(rc, -1);
			CU_ASSERT_EQUAL(seen.at_deadline, 0);
			CU_ASSERT_EQUAL(fake.abort_code, COMM_DEADLINE_EXIT);
		} else {
			CU_ASSERT_EQUAL_FATAL(rc, 0);
			CU_ASSERT_EQUAL(comm_finalize(w, &err), 0);
		}
		CU_ASSERT_EQUAL(fake.open, 0);
		unsetenv(COMM_RUN_DIR_ENV);
		env_restore();
	}
	if (keep_ns)
		setenv("PMIX_NAMESPACE", keep_ns, 1);
	else
		unsetenv("PMIX_NAMESPACE");
	free(keep_ns);
	fclose(cfg.log);
}

/* ---- the progress board ---- */

#define DOING(kind, tag) PROGRESS_DOING(kind, tag)

static const char *verdict(const ProgressPeer *p, int n, int size, int64_t call, int peer)
{
	static char out[512];
	progress_verdict(p, n, size, call, peer, out, sizeof(out));
	return out;
}

/* Who is missing, from hand-made boards: the members visible on this node, their counts and the
 * waiting call; every expected line is read off the inputs. */
static void test_board_verdict(void)
{
	/* a world of 4 waits for its call 57: rank 1 has entered 56, rank 3 already 58 (it started
	 * the next one), so rank 1 alone is missing */
	ProgressPeer world[4] = {
		{0, 0, 57, DOING(COLL_ALL_REDUCE, COMM_TAG_WORLD), 2.0, 0},
		{1, 1, 56, 0, 2.1, 0},
		{2, 2, 57, DOING(COLL_ALL_REDUCE, COMM_TAG_WORLD), 2.0, 0},
		{3, 3, 58, DOING(COLL_ALL_GATHER, COMM_TAG_WORLD), 0.04, 0},
	};
	CU_ASSERT_STRING_EQUAL(verdict(world, 4, 4, 57, -1),
			       "; not arrived: rank 1 (at call 56, outside comm for 2.1 s)");
	/* every count at or past 57: nobody to blame but the backend */
	world[1].calls = 57;
	CU_ASSERT_STRING_EQUAL(verdict(world, 4, 4, 57, -1), "; all 4 ranks arrived (the hang is "
			       "inside the backend or the network)");
	/* a split of world ranks 1 and 3 (ranks 1 and 0 in it): rank 1 is waiting for the split's
	 * call 5, rank 3 has entered 4 and is stuck in a tp barrier; named by world rank */
	ProgressPeer dp[2] = {
		{1, 1, 5, DOING(COLL_ALL_GATHER, GROUP_DP), 2.0, 0},
		{3, 0, 4, DOING(COMM_KIND_BARRIER, GROUP_TP), 1.96, 0},
	};
	CU_ASSERT_STRING_EQUAL(verdict(dp, 2, 2, 5, -1), "; not arrived: rank 3 (at call 4, in "
			       "barrier on group tp for 2.0 s)");
	/* the same split spread over two nodes: the other member is not visible, and not blamed */
	CU_ASSERT_STRING_EQUAL(verdict(dp, 1, 2, 5, -1), "; the only rank on this node arrived; "
			       "1 rank on another node not visible");
	/* 2 of 8 visible: one missing and gone, 6 elsewhere */
	ProgressPeer two[2] = {{4, 4, 9, DOING(COMM_KIND_BARRIER, COMM_TAG_WORLD), 2.0, 0},
			       {5, 5, 3, DOING(PROGRESS_OP_SPLIT, GROUP_DP), 9.0, 1}};
	CU_ASSERT_STRING_EQUAL(verdict(two, 2, 8, 9, -1), "; not arrived: rank 5 (at call 3, "
			       "process gone); 6 ranks on other nodes not visible");
	two[1].calls = 9;
	CU_ASSERT_STRING_EQUAL(verdict(two, 2, 8, 9, -1), "; the 2 ranks on this node arrived; "
			       "6 ranks on other nodes not visible");
	/* 7 of 8 missing: 4 named, the rest counted */
	ProgressPeer many[8];
	for (int i = 0; i < 8; i++)
		many[i] = (ProgressPeer){i, i, i == 6 ? 2 : 1, i == 6 ? DOING(PROGRESS_OP_FINALIZE,
			COMM_TAG_WORLD) : 0, 3.0, 0};
	CU_ASSERT_STRING_EQUAL(verdict(many, 8, 8, 2, -1),
			       "; not arrived: rank 0 (at call 1, outside comm for 3.0 s), "
			       "rank 1 (at call 1, outside comm for 3.0 s), "
			       "rank 2 (at call 1, outside comm for 3.0 s), "
			       "rank 3 (at call 1, outside comm for 3.0 s), and 3 more");
	/* point to point: the peer is dp rank 0, world rank 3, itself in a recv */
	CU_ASSERT_STRING_EQUAL(verdict(dp, 2, 2, 0, 0), "; its peer, rank 3, is in barrier on "
			       "group tp for 2.0 s");
	dp[1].doing = DOING(COLL_P2P_RECV, GROUP_PP);
	CU_ASSERT_STRING_EQUAL(verdict(dp, 2, 2, 0, 0), "; its peer, rank 3, is in recv on "
			       "group pp for 2.0 s");
	CU_ASSERT_STRING_EQUAL(verdict(dp, 1, 2, 0, 0), "; its peer is on another node, not "
			       "visible");
	/* a short buffer is cut, never overrun */
	char small[16];
	memset(small, 'x', sizeof(small));
	progress_verdict(world, 4, 4, 57, -1, small, 12);
	CU_ASSERT_STRING_EQUAL(small, "; all 4 ran");
	CU_ASSERT_EQUAL(small[12], 'x');
}

/* Two ranks of one node in this process, on one segment: what one publishes the other reads,
 * each communicator read among its own members only. */
static void test_board_shared(void)
{
	char name[128], long_name[400];
	PxError err = {0};
	ProgressBoard *b0 = NULL, *b2 = NULL, *b = NULL;
	ProgressPeer p[4];
	snprintf(name, sizeof(name), "/px-board-test-%ld", (long)getpid());
	/* world ranks 0 and 2 of 4 are here; 1 and 3 are on another node */
	CU_ASSERT_EQUAL_FATAL(progress_open(name, 4, 0, 1, &b0, &err), 0);
	CU_ASSERT_EQUAL_FATAL(progress_open(name, 4, 2, 0, &b2, &err), 0);
	CU_ASSERT_EQUAL(progress_open(name, 5, 1, 0, &b, &err), -EINVAL);
	CU_ASSERT_PTR_NULL(b);
	CU_ASSERT_EQUAL(progress_unlink(name), 0);
	CU_ASSERT_EQUAL(progress_unlink(name), 0); /* gone already: fine */
	CU_ASSERT_EQUAL(progress_open(name, 4, 1, 0, &b, &err), -ENOENT);
	CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "shm_open"));
	int w0 = progress_add(b0, 1, 0), w2 = progress_add(b2, 1, 2);
	int s0 = progress_add(b0, 88, 0), s2 = progress_add(b2, 77, 0); /* two different splits */
	CU_ASSERT(w0 >= 0 && w2 >= 0 && s0 >= 0 && s2 >= 0);
	uint64_t t = 1000000000000ULL;
	progress_enter(b0, w0, 5, DOING(COLL_ALL_GATHER, COMM_TAG_WORLD), t);
	progress_enter(b2, w2, 4, DOING(COMM_KIND_BARRIER, GROUP_TP), t - 1500000000ULL);
	CU_ASSERT_EQUAL(progress_read(b0, 1, t + 500000000ULL, p, 4), 2);
	CU_ASSERT(p[0].rank == 0 && p[0].calls == 5 && p[0].gone == 0);
	CU_ASSERT(p[1].rank == 2 && p[1].rank_in == 2 && p[1].calls == 4 && !p[1].gone);
	CU_ASSERT_DOUBLE_EQUAL(p[1].for_s, 2.0, 1e-9);
	CU_ASSERT_STRING_EQUAL(verdict(p, 2, 4, 5, -1), "; not arrived: rank 2 (at call 4, in "
			       "barrier on group tp for 2.0 s); 2 ranks on other nodes not visible");
	/* split 77 has rank 2 only here; split 88 rank 0 only */
	CU_ASSERT_EQUAL(progress_read(b0, 77, t, p, 4), 1);
	CU_ASSERT(p[0].rank == 2 && p[0].rank_in == 0 && p[0].calls == 0);
	CU_ASSERT_EQUAL(progress_read(b2, 88, t, p, 4), 1);
	CU_ASSERT_EQUAL(p[0].rank, 0);
	progress_leave(b2, t);
	CU_ASSERT_EQUAL(progress_read(b0, 1, t, p, 4), 2);
	CU_ASSERT(p[1].doing == 0 && p[1].for_s == 0 && p[1].calls == 4);
	progress_remove(b2, s2);
	CU_ASSERT_EQUAL(progress_read(b0, 77, t, p, 4), 0);
	/* an entry is free again once removed; a rank has room for PROGRESS_MAX_COMMS */
	int n = 0;
	while (progress_add(b2, 1000 + (uint64_t)n, 0) >= 0)
		n++;
	CU_ASSERT_EQUAL(n, PROGRESS_MAX_COMMS - 1); /* the world's entry holds one */
	CU_ASSERT_EQUAL(progress_add(NULL, 1, 0), -1);
	progress_enter(NULL, 0, 1, 1, t); /* no board: nothing */
	progress_close(b2);
	progress_close(b0);
	progress_close(NULL);
	/* a name the system refuses: an error naming the call, no board */
	memset(long_name, 'x', sizeof(long_name) - 1);
	long_name[0] = '/';
	long_name[sizeof(long_name) - 1] = '\0';
	CU_ASSERT(progress_open(long_name, 4, 0, 1, &b, &err) < 0);
	CU_ASSERT_PTR_NULL(b);
	CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "shm_open /xxx"));
}

static void test_watchdog_quiet_when_in_time(void)
{
	PxError err = {0};
	CommConfig cfg;
	comm_config_init(&cfg);
	cfg.deadline_s = 0.25;
	Comm *w = fake_world(4, 2, &cfg);
	CU_ASSERT_PTR_NOT_NULL_FATAL(w);
	/* 100 calls of 5 ms, each far inside its own 250 ms though together twice as long: every
	 * call has its own deadline, they do not add up */
	fake.slow_s = 0.005;
	for (int i = 0; i < 100; i++)
		CU_ASSERT_EQUAL(comm_all_reduce(w, buf_a, buf_a, 4, COMM_FP32, COMM_SUM, &err), 0);
	/* no deadline at all: a call may take as long as it takes */
	CU_ASSERT_EQUAL(comm_set_deadline(w, 0, &err), 0);
	fake.slow_s = 0.15;
	CU_ASSERT_EQUAL(comm_barrier(w, &err), 0);
	CU_ASSERT_EQUAL(fake.aborted, 0);
	CU_ASSERT_EQUAL(comm_counters(w)->calls[COLL_ALL_REDUCE][COMM_TAG_WORLD], 100);
	expect_refused(comm_set_deadline(w, NAN, &err), &err,
		       "rank 0: comm deadline must be 0 (none) or up to 1e9 seconds, got nan");
	expect_refused(comm_set_deadline(w, -1, &err), &err, "got -1");
	fake_done(w);
	/* and at start-up */
	Comm *none = NULL;
	cfg.deadline_s = -2;
	env_clear();
	expect_refused(comm_init(&fake_backend, &cfg, &none, &err), &err, "got -2");
	CU_ASSERT_PTR_NULL(none);
	env_restore();
}

/* ---- life cycle and environment ---- */

static void test_lifecycle(void)
{
	PxError err = {0};
	Comm *w = fake_world(4, 2, NULL);
	CU_ASSERT_PTR_NOT_NULL_FATAL(w);
	CU_ASSERT_EQUAL(comm_rank(w), 0);
	CU_ASSERT_EQUAL(comm_size(w), 4);
	CU_ASSERT_EQUAL(comm_tag(w), COMM_TAG_WORLD);
	Comm *none = w;
	CU_ASSERT_EQUAL(comm_split(w, COMM_NO_COLOR, 0, GROUP_PP, &none, &err), 0);
	CU_ASSERT_PTR_NULL(none);
	Comm *tp = split(w, GROUP_TP);
	CU_ASSERT_PTR_NOT_NULL_FATAL(tp);
	expect_refused(comm_finalize(tp, &err), &err, "given a split communicator, not the world");
	expect_refused(comm_finalize(w, &err), &err,
		       "rank 0: comm_finalize: 1 split communicators still open");
	comm_destroy(tp);
	comm_destroy(NULL);
	comm_destroy(w); /* the world ends with comm_finalize only */
	CU_ASSERT_EQUAL(fake.open, 1);
	fake_done(w);
	CU_ASSERT_EQUAL(comm_finalize(NULL, &err), 0);
	CU_ASSERT_STRING_EQUAL(comm_kind_name(COLL_P2P), "p2p");
	CU_ASSERT_STRING_EQUAL(comm_kind_name(COLL_P2P_RECV), "p2p_recv");
	CU_ASSERT_STRING_EQUAL(comm_kind_name(COMM_KIND_REDUCE), "reduce");
	CU_ASSERT_STRING_EQUAL(comm_kind_name(COMM_KIND_BARRIER), "barrier");
	CU_ASSERT_STRING_EQUAL(comm_tag_name(GROUP_HPZ), "hpz");
	CU_ASSERT_STRING_EQUAL(comm_tag_name(COMM_TAG_WORLD), "world");
	CU_ASSERT_STRING_EQUAL(comm_dtype_name(COMM_BF16), "bf16");
}

static void test_environment(void)
{
	CommEnv e;
	env_clear();
	CU_ASSERT_EQUAL(comm_env_probe(&e), 0);
	CU_ASSERT(e.rank == 0 && e.size == 1 && e.local_rank == 0 && e.local_size == 1);
	CU_ASSERT_STRING_EQUAL(e.launcher, "none");

	setenv("SLURM_PROCID", "5", 1);
	setenv("SLURM_NTASKS", "8", 1);
	setenv("SLURM_LOCALID", "1", 1);
	CU_ASSERT_EQUAL(comm_env_probe(&e), 1);
	CU_ASSERT(e.rank == 5 && e.size == 8 && e.local_rank == 1 && e.local_size == 0);
	CU_ASSERT_STRING_EQUAL(e.launcher, "srun");

	/* mpirun's variables win over a surrounding Slurm allocation's */
	setenv("OMPI_COMM_WORLD_RANK", "2", 1);
	setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
	setenv("OMPI_COMM_WORLD_LOCAL_RANK", "0", 1);
	setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2", 1);
	CU_ASSERT_EQUAL(comm_env_probe(&e), 1);
	CU_ASSERT(e.rank == 2 && e.size == 4 && e.local_rank == 0 && e.local_size == 2);
	CU_ASSERT_STRING_EQUAL(e.launcher, "mpirun");

	/* the fake says rank 0 of 4 where mpirun said rank 2: another MPI's program */
	PxError err = {0};
	Comm *w = NULL;
	fake.size = 4;
	expect_refused(comm_init(&fake_backend, NULL, &w, &err), &err,
		       "mpirun started this process as rank 2 of 4, but the fake backend sees rank "
		       "0 of 4");
	CU_ASSERT_PTR_NULL(w);
	CU_ASSERT_EQUAL(fake.open, 0);

	setenv("OMPI_COMM_WORLD_SIZE", "x4", 1); /* malformed: not mpirun's */
	CU_ASSERT_EQUAL(comm_env_probe(&e), 1);
	CU_ASSERT_STRING_EQUAL(e.launcher, "srun");
	env_restore();
}

static void set_torchrun(const char *rank, const char *size, const char *local_rank,
			 const char *local_size)
{
	const char *v[] = {rank, size, local_rank, local_size};
	const char *names[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"};
	for (int i = 0; i < 4; i++)
		if (v[i])
			setenv(names[i], v[i], 1);
		else
			unsetenv(names[i]);
}

/* One malformed torchrun environment: comm_env_read names it, comm_env_probe reads a singleton
 * and comm_init refuses to start. */
static void expect_bad_torchrun(const char *want)
{
	CommEnv e;
	PxError err = {0};
	expect_refused(comm_env_read(&e, &err), &err, want);
	CU_ASSERT_EQUAL(comm_env_probe(&e), 0);
	CU_ASSERT_STRING_EQUAL(e.launcher, "none");
	Comm *w = NULL;
	fake.size = 1;
	expect_refused(comm_init(&fake_backend, NULL, &w, &err), &err, want);
	CU_ASSERT_PTR_NULL(w);
	CU_ASSERT_EQUAL(fake.open, 0);
}

static void test_environment_torchrun(void)
{
	CommEnv e;
	PxError err = {0};
	env_clear();
	set_torchrun("5", "8", "1", "4");
	CU_ASSERT_EQUAL(comm_env_read(&e, &err), 1);
	CU_ASSERT(e.rank == 5 && e.size == 8 && e.local_rank == 1 && e.local_size == 4);
	CU_ASSERT_STRING_EQUAL(e.launcher, "torchrun");

	/* Slurm's variables win: torchrun's names are generic, srun's are not */
	setenv("SLURM_PROCID", "3", 1);
	setenv("SLURM_NTASKS", "4", 1);
	CU_ASSERT_EQUAL(comm_env_read(&e, &err), 1);
	CU_ASSERT_STRING_EQUAL(e.launcher, "srun");
	unsetenv("SLURM_PROCID");
	unsetenv("SLURM_NTASKS");

	/* the fake says rank 0 of 8 where torchrun said rank 5 */
	Comm *w = NULL;
	fake.size = 8;
	expect_refused(comm_init(&fake_backend, NULL, &w, &err), &err,
		       "torchrun started this process as rank 5 of 8, but the fake backend sees "
		       "rank 0 of 8: this backend needs mpirun or srun");
	CU_ASSERT_EQUAL(fake.open, 0);

	set_torchrun("x1", "8", "1", "4");
	expect_bad_torchrun("RANK must be a non-negative integer, got 'x1'");
	set_torchrun("1", "8", "-1", "4");
	expect_bad_torchrun("LOCAL_RANK must be a non-negative integer, got '-1'");
	set_torchrun("8", "8", "0", "4");
	expect_bad_torchrun("RANK must be below WORLD_SIZE, got RANK=8 WORLD_SIZE=8");
	set_torchrun("0", "0", "0", "1");
	expect_bad_torchrun("RANK must be below WORLD_SIZE, got RANK=0 WORLD_SIZE=0");
	set_torchrun("1", "8", "4", "4");
	expect_bad_torchrun("LOCAL_RANK must be below LOCAL_WORLD_SIZE");
	set_torchrun("1", "2", "0", "4");
	expect_bad_torchrun("itself at most WORLD_SIZE, got LOCAL_RANK=0 LOCAL_WORLD_SIZE=4 "
			    "WORLD_SIZE=2");
	set_torchrun("1", NULL, "0", "4");
	expect_bad_torchrun("RANK is set but WORLD_SIZE is not");
	set_torchrun("1", "8", "0", "");
	expect_bad_torchrun("RANK is set but LOCAL_WORLD_SIZE is not");

	/* without RANK the rest is somebody else's business */
	set_torchrun(NULL, "8", "x", "y");
	CU_ASSERT_EQUAL(comm_env_read(&e, &err), 0);
	CU_ASSERT_STRING_EQUAL(e.launcher, "none");
	env_restore();
}

int test_comm_register(void)
{
	return PX_ADD_SUITE("comm", {"counters: every call, by hand", test_counters_by_hand},
			    {"counters: a counting backend's bytes, never the formula's",
			     test_counters_counted},
			    {"counters equal sim/traffic's prediction",
			     test_counters_match_simulator},
			    {"bad arguments refused, named, not counted", test_bad_arguments},
			    {"backend errors name rank, call and group", test_backend_errors_named},
			    {"watchdog stops a call past its deadline", test_watchdog_fires},
			    {"watchdog quiet for calls in time", test_watchdog_quiet_when_in_time},
			    {"watchdog without a board: the waiting rank only",
			     test_watchdog_without_board},
			    {"board: who never arrived, by hand", test_board_verdict},
			    {"board: two ranks on one segment", test_board_shared},
			    {"board: in the job's folder, never left behind", test_board_in_run_dir},
			    {"split, destroy, finalize", test_lifecycle},
			    {"launcher environment", test_environment},
			    {"launcher environment: torchrun's", test_environment_torchrun});
}

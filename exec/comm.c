#include "comm.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../sim/traffic.h"
#include "progress.h"

/* What the watchdog asks the progress board about the call in flight. */
typedef struct WaitFor {
	uint64_t key; /* the communicator's on the board; 0: nothing to ask (init) */
	int size;     /* its ranks */
	int64_t call; /* the collective waited for, numbered from 1 on it; 0: point to point */
	int peer;     /* point to point: the other rank, in the communicator */
} WaitFor;

/* The watchdog: one thread per comm_init that sleeps until the deadline of the call in flight.
 * A thread rather than alarm(): a signal handler may not print or call into MPI, and a thread
 * sees the caller blocked in any backend without the backend's help. */
typedef struct Watchdog {
	pthread_t thread;
	pthread_mutex_t mu; /* guards everything below */
	pthread_cond_t cv;  /* on CLOCK_MONOTONIC: wall-clock jumps must not fire it */
	int stop;
	int armed;          /* a call is in flight */
	struct timespec due;
	const char *what;   /* the call in flight: "all_gather", "comm_split" */
	int tag;
	void *abort_h;      /* the world's handle for the backend's abort; NULL during finalize */
	double limit_s;
	WaitFor wait;
	int fired;          /* the deadline passed and the backend's abort returned */
	char line[640];     /* what it printed when it fired, newline included */
} Watchdog;

/* What every communicator of one comm_init shares. */
typedef struct CommState {
	const CommBackend *be;
	CommConfig cfg;
	CommEnv env;
	CommCounters counters;
	Watchdog wd;
	int wd_running;
	Comm *world;
	int n_split; /* split communicators not yet destroyed */
	void *stream;           /* comm_set_stream's */
	int n_started;          /* started, not yet waited */
	CommRequest *unsynced;  /* waited on a device, completion not yet seen (comm_sync) */
	ProgressBoard *board;   /* NULL: none (said at comm_init) */
	ProgressPeer *peers;    /* [env.size]: the watchdog's reading of the board */
	int64_t moved0[2];      /* the backend's moved (sent, received) when the call in hand
				   began: its delta at the end is that call's */
	char board_name[256];   /* the board this rank created, while its name exists */
	atomic_int board_linked; /* board_name is still to be unlinked (by board_open, or by the
				    watchdog before it stops the job) */
} CommState;

struct Comm {
	CommState *st;
	void *h; /* the backend's */
	int rank, size, tag;
	uint64_t key;      /* on the board: the same on every member (split_key) */
	int board_i;       /* this rank's entry for it on the board; -1: none */
	int64_t n_coll;    /* collectives entered on it, comm_split and finalize included */
	uint32_t n_splits; /* comm_split calls on it */
};

struct CommRequest {
	Comm *c;
	void *h;            /* the backend's; NULL where the call ran whole at its start */
	const char *what;
	int kind;
	int64_t payload;
	int64_t moved[2];   /* bytes sent and received, as the backend counted them so far */
	int64_t call;       /* its number on the board, taken at the start */
	CommRequest *next;  /* in CommState.unsynced */
};

/* ---- names ---- */

size_t comm_dtype_bytes(CommDtype dt)
{
	return dt == COMM_FP32 ? 4 : (dt == COMM_FP16 || dt == COMM_BF16) ? 2 : dt == COMM_INT8 ? 1 :
	       dt == COMM_INT64 ? 8 : 0;
}

const char *comm_dtype_name(CommDtype dt)
{
	static const char *const n[] = {"fp32", "fp16", "bf16", "int8", "int64"};
	return (unsigned)dt < N_COMM_DTYPES ? n[dt] : "?";
}

const char *comm_kind_name(int kind)
{
	static const char *const n[] = {"reduce", "barrier"};
	if (kind >= 0 && kind < N_COLLS)
		return coll_name((CollKind)kind);
	return kind >= N_COLLS && kind < N_COMM_KINDS ? n[kind - N_COLLS] : "?";
}

const char *comm_tag_name(int tag)
{
	if (tag >= 0 && tag < N_GROUPS)
		return group_name((CommGroup)tag);
	return tag == COMM_TAG_WORLD ? "world" : "?";
}

/* ---- watchdog ---- */

static void time_add(struct timespec *t, double s)
{
	double whole = (double)(long long)s;
	t->tv_sec += (time_t)whole;
	t->tv_nsec += (long)((s - whole) * 1e9);
	if (t->tv_nsec >= 1000000000L) {
		t->tv_sec++;
		t->tv_nsec -= 1000000000L;
	}
}

static int time_reached(const struct timespec *due)
{
	struct timespec now;
	clock_gettime(CLOCK_MONOTONIC, &now);
	return now.tv_sec > due->tv_sec || (now.tv_sec == due->tv_sec && now.tv_nsec >= due->tv_nsec);
}

static uint64_t time_ns(const struct timespec *t)
{
	return (uint64_t)t->tv_sec * 1000000000u + (uint64_t)t->tv_nsec;
}

/* The watchdog's line: the waiting rank and its call, then, from the board, who never arrived. */
static void watchdog_line(CommState *st, char *line, size_t bytes)
{
	Watchdog *w = &st->wd;
	char where[64] = "", verdict[512] = "";
	if (st->board && w->wait.key) {
		struct timespec now;
		clock_gettime(CLOCK_MONOTONIC, &now);
		int n = progress_read(st->board, w->wait.key, time_ns(&now), st->peers,
				      st->env.size);
		progress_verdict(st->peers, n, w->wait.size, w->wait.call, w->wait.peer, verdict,
				 sizeof(verdict));
		if (w->wait.call > 0)
			snprintf(where, sizeof(where), " (call %lld on this communicator)",
				 (long long)w->wait.call);
	}
	snprintf(line, bytes, "rank %d: %s on group %s%s did not complete within %g s%s\n",
		 st->env.rank, w->what, comm_tag_name(w->tag), where, w->limit_s, verdict);
}

/* Called with the lock held; returns with it held. */
static void watchdog_fire(CommState *st)
{
	Watchdog *w = &st->wd;
	char line[sizeof(w->line)];
	watchdog_line(st, line, sizeof(line));
	memcpy(w->line, line, sizeof(line));
	w->armed = 0;
	w->fired = 1;
	pthread_mutex_unlock(&w->mu);
	/* a board still named (the job stops while starting) must not outlive it */
	if (atomic_exchange(&st->board_linked, 0))
		progress_unlink(st->board_name);
	/* one write: the lines of several ranks reach mpirun's stderr whole */
	FILE *log = st->cfg.log ? st->cfg.log : stderr;
	fputs(line, log);
	fflush(log);
	if (st->cfg.on_deadline)
		st->cfg.on_deadline(st->cfg.ctx, line);
	st->be->abort(w->abort_h, COMM_DEADLINE_EXIT);
	pthread_mutex_lock(&w->mu);
}

static void *watchdog_main(void *arg)
{
	CommState *st = arg;
	Watchdog *w = &st->wd;
	pthread_mutex_lock(&w->mu);
	while (!w->stop) {
		if (!w->armed) {
			pthread_cond_wait(&w->cv, &w->mu);
			continue;
		}
		struct timespec due = w->due;
		int rc = pthread_cond_timedwait(&w->cv, &w->mu, &due);
		/* a wake-up may belong to a later call with a later deadline: look again */
		if (rc == ETIMEDOUT && w->armed && !w->stop && time_reached(&w->due))
			watchdog_fire(st);
	}
	pthread_mutex_unlock(&w->mu);
	return NULL;
}

static int watchdog_start(CommState *st)
{
	Watchdog *w = &st->wd;
	pthread_condattr_t ca;
	if (pthread_condattr_init(&ca))
		return -1;
	int bad = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) || pthread_cond_init(&w->cv, &ca);
	pthread_condattr_destroy(&ca);
	if (bad)
		return -1;
	if (pthread_mutex_init(&w->mu, NULL))
		goto out_cv;
	if (pthread_create(&w->thread, NULL, watchdog_main, st))
		goto out_mu;
	st->wd_running = 1;
	return 0;
out_mu:
	pthread_mutex_destroy(&w->mu);
out_cv:
	pthread_cond_destroy(&w->cv);
	return -1;
}

static void watchdog_stop(CommState *st)
{
	Watchdog *w = &st->wd;
	if (!st->wd_running)
		return;
	pthread_mutex_lock(&w->mu);
	w->stop = 1;
	pthread_cond_signal(&w->cv);
	pthread_mutex_unlock(&w->mu);
	pthread_join(w->thread, NULL);
	pthread_mutex_destroy(&w->mu);
	pthread_cond_destroy(&w->cv);
	st->wd_running = 0;
}

/* wait: what to ask the board if the call overruns (NULL: nothing); now: when the call began
 * (NULL: read the clock). */
static void watchdog_arm(CommState *st, const char *what, int tag, void *abort_h,
			 const WaitFor *wait, const struct timespec *now)
{
	Watchdog *w = &st->wd;
	if (!st->wd_running || st->cfg.deadline_s <= 0)
		return;
	pthread_mutex_lock(&w->mu);
	if (now)
		w->due = *now;
	else
		clock_gettime(CLOCK_MONOTONIC, &w->due);
	time_add(&w->due, st->cfg.deadline_s);
	w->what = what;
	w->tag = tag;
	w->abort_h = abort_h;
	w->wait = wait ? *wait : (WaitFor){.key = 0};
	w->limit_s = st->cfg.deadline_s;
	w->armed = 1;
	w->fired = 0;
	pthread_cond_signal(&w->cv);
	pthread_mutex_unlock(&w->mu);
}

/* Ends the call on the board too. Returns 1 when the deadline passed during the call (the
 * backend's abort returned) and fills err with the watchdog's line. */
static int watchdog_disarm(CommState *st, PxError *err)
{
	Watchdog *w = &st->wd;
	if (st->board) {
		struct timespec now;
		clock_gettime(CLOCK_MONOTONIC, &now);
		progress_leave(st->board, time_ns(&now));
	}
	if (!st->wd_running)
		return 0;
	char line[sizeof(w->line)];
	pthread_mutex_lock(&w->mu);
	int fired = w->fired;
	w->armed = 0;
	w->fired = 0;
	if (fired)
		memcpy(line, w->line, sizeof(line));
	pthread_mutex_unlock(&w->mu);
	if (fired)
		px_fail(err, PX_ERR_RUNTIME, "%.*s", (int)strcspn(line, "\n"), line);
	return fired;
}

/* ---- set-up ---- */

void comm_config_init(CommConfig *cfg)
{
	cfg->deadline_s = 60;
	cfg->log = NULL;
	cfg->on_deadline = NULL;
	cfg->ctx = NULL;
}

/* Prefix the backend's message in err with the rank, the call and the group. */
static int fail_call(const CommState *st, const char *what, int tag, PxError *err)
{
	if (!err)
		return -1;
	char inner[sizeof(err->msg)];
	memcpy(inner, err->msg, sizeof(inner));
	inner[sizeof(inner) - 1] = '\0';
	return px_fail(err, PX_ERR_RUNTIME, "rank %d: %s on group %s: %.900s", st->env.rank, what,
		       comm_tag_name(tag), inner);
}

/* A deadline is 0 (none) or a number of seconds a timespec can hold; NaN is neither. */
static int check_deadline(double s, int rank, PxError *err)
{
	if (s >= 0 && s <= 1e9)
		return 0;
	return px_fail(err, PX_ERR_RUNTIME,
		       "rank %d: comm deadline must be 0 (none) or up to 1e9 seconds, got %g", rank,
		       s);
}

/* Every launcher numbers its processes itself; a backend that disagrees was started differently
 * (the MPI backend under torchrun is a singleton of 1) or linked against another MPI. */
static int check_launcher(const CommEnv *probe, const CommEnv *got, const char *be, PxError *err)
{
	if (strcmp(probe->launcher, "none") &&
	    (probe->rank != got->rank || probe->size != got->size))
		return px_fail(err, PX_ERR_RUNTIME,
			       "%s started this process as rank %d of %d, but the %s backend "
			       "sees rank %d of %d: %s",
			       probe->launcher, probe->rank, probe->size, be, got->rank, got->size,
			       !strcmp(probe->launcher, "torchrun")
				       ? "this backend needs mpirun or srun"
				       : "the program's MPI library is not the launcher's (build "
					 "and launch with the same MPI)");
	return 0;
}

/* The backend's start under the deadline too: a rank that never arrives at the rendezvous must
 * not hold the others forever. The world's handle does not exist yet, so abort gets NULL. */
static int init_backend(CommState *st, Comm *w, PxError *err)
{
	CommEnv got = st->env; /* the watchdog reads st->env meanwhile */
	watchdog_arm(st, "init", COMM_TAG_WORLD, NULL, NULL, NULL);
	int rc = st->be->init(&w->h, &got, err);
	if (watchdog_disarm(st, err)) {
		if (!rc)
			st->be->finalize(w->h, NULL);
		return -1;
	}
	if (rc)
		return fail_call(st, "init", COMM_TAG_WORLD, err);
	st->env = got;
	return 0;
}

/* ---- the progress board (progress.h) ---- */

static int board_barrier(CommState *st, Comm *w, PxError *err)
{
	watchdog_arm(st, "init", COMM_TAG_WORLD, w->h, NULL, NULL);
	int rc = st->be->barrier(w->h, err);
	if (watchdog_disarm(st, err))
		return -1;
	return rc ? fail_call(st, "init", COMM_TAG_WORLD, err) : 0;
}

/* Map the board and put the world on it (key 1: the segment is this comm_init's alone). */
static int board_map(CommState *st, Comm *w, const char *name, int create, PxError *why)
{
	int rc = progress_open(name, st->env.size, st->env.rank, create, &st->board, why);
	if (rc)
		return rc;
	st->peers = calloc((size_t)st->env.size, sizeof(*st->peers));
	if (!st->peers) {
		progress_close(st->board);
		st->board = NULL;
		px_fail(why, PX_ERR_RUNTIME, "out of memory");
		return -ENOMEM;
	}
	w->board_i = progress_add(st->board, w->key, w->rank);
	return 0;
}

/* Every rank of a node maps one segment: the node's first rank creates it, the others open it
 * after a barrier, and after a second barrier every local rank has its world entry up and the
 * name can go. The barriers run whether or not this rank's board works (collectives must
 * match); a board that fails is said once and the job runs without it. Fails only when a
 * barrier does. */
static int board_open(CommState *st, Comm *w, PxError *err)
{
	char name[256];
	PxError why = {0};
	int alone = st->env.size == 1 || !strcmp(st->env.launcher, "none");
	int creator = alone || st->env.local_rank == 0;
	int named = !comm_env_board_name(&st->env, name, sizeof(name));
	int rc = -ENOENT;
	w->key = 1;
	w->board_i = -1;
	if (named && creator)
		rc = board_map(st, w, name, 1, &why);
	if (named && creator && st->board) {
		memcpy(st->board_name, name, sizeof(st->board_name));
		atomic_store(&st->board_linked, 1);
	}
	if (!alone && board_barrier(st, w, err))
		goto out_fail;
	if (named && !creator)
		rc = board_map(st, w, name, 0, &why);
	if (!alone && board_barrier(st, w, err))
		goto out_fail;
	if (atomic_exchange(&st->board_linked, 0))
		progress_unlink(name);
	/* where the creator failed, the others find nothing: it alone says so */
	if (!st->board && (creator || rc != -ENOENT)) {
		FILE *log = st->cfg.log ? st->cfg.log : stderr;
		fprintf(log, "rank %d: comm: no progress board (%s): a missed deadline will name "
			"the waiting rank only\n", st->env.rank,
			named ? why.msg : "the launcher gave no job id");
		fflush(log);
	}
	return 0;
out_fail:
	if (atomic_exchange(&st->board_linked, 0))
		progress_unlink(name);
	progress_close(st->board);
	st->board = NULL;
	free(st->peers);
	st->peers = NULL;
	return -1;
}

/* A split's key, computed alike by its members without talking: they share the parent, split it
 * in the same order (collectives on a communicator are ordered) and chose the same color.
 * splitmix64's finaliser over the three; never 0 (a free entry). */
static uint64_t split_key(uint64_t parent, uint32_t ordinal, int color)
{
	uint64_t z = parent ^ ((uint64_t)ordinal << 32 | (uint32_t)color);
	z += 0x9e3779b97f4a7c15ULL;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	z ^= z >> 31;
	return z ? z : 1;
}

/* Tell the board this rank entered a call on c and read the clock into *now; returns what the
 * watchdog asks the board if the call overruns. call: its number on c (0: point to point);
 * fresh: this is where it is counted (not the wait of a started one). */
static WaitFor board_enter(Comm *c, int op, int64_t call, int fresh, int peer,
			   struct timespec *now)
{
	clock_gettime(CLOCK_MONOTONIC, now);
	progress_enter(c->st->board, fresh ? c->board_i : -1, call,
		       PROGRESS_DOING(op, c->tag), time_ns(now));
	return (WaitFor){.key = c->key, .size = c->size, .call = call, .peer = peer};
}

int comm_init(const CommBackend *be, const CommConfig *cfg, Comm **world, PxError *err)
{
	*world = NULL;
	if (!be)
		be = &comm_mpi_backend;
	CommEnv probe;
	if (comm_env_read(&probe, err) < 0)
		return -1;
	if (cfg && check_deadline(cfg->deadline_s, probe.rank, err))
		return -1;
	CommState *st = calloc(1, sizeof(*st));
	Comm *w = calloc(1, sizeof(*w));
	if (!st || !w) {
		px_fail(err, PX_ERR_RUNTIME, "rank %d: comm_init: out of memory", probe.rank);
		goto out_free;
	}
	st->be = be;
	st->counters.wire_counted = be->moved != NULL;
	if (cfg)
		st->cfg = *cfg;
	else
		comm_config_init(&st->cfg);
	st->env = probe;
	if (watchdog_start(st)) {
		px_fail(err, PX_ERR_RUNTIME, "rank %d: comm_init: cannot start the watchdog thread",
			st->env.rank);
		goto out_free;
	}
	if (init_backend(st, w, err))
		goto out_watchdog;
	w->st = st;
	w->rank = st->env.rank;
	w->size = st->env.size;
	w->tag = COMM_TAG_WORLD;
	st->world = w;
	if (check_launcher(&probe, &st->env, be->name, err) || board_open(st, w, err))
		goto out_backend;
	*world = w;
	return 0;
out_backend:
	be->finalize(w->h, NULL);
out_watchdog:
	watchdog_stop(st);
out_free:
	free(w);
	free(st);
	return -1;
}

int comm_split(Comm *parent, int color, int key, int tag, Comm **out, PxError *err)
{
	*out = NULL;
	if (!parent)
		return px_fail(err, PX_ERR_RUNTIME, "comm_split: no parent communicator");
	CommState *st = parent->st;
	if (tag < 0 || tag >= N_COMM_TAGS || (color < 0 && color != COMM_NO_COLOR))
		return px_fail(err, PX_ERR_RUNTIME,
			       "rank %d: comm_split: tag must be 0-%d and color >= 0 or "
			       "COMM_NO_COLOR, got tag %d color %d",
			       st->env.rank, N_COMM_TAGS - 1, tag, color);
	/* allocated first: running out of memory after the collective would strand the others */
	Comm *c = calloc(1, sizeof(*c));
	if (!c)
		return px_fail(err, PX_ERR_RUNTIME, "rank %d: comm_split: out of memory",
			       st->env.rank);
	uint32_t ordinal = parent->n_splits++;
	struct timespec now;
	WaitFor wf = board_enter(parent, PROGRESS_OP_SPLIT, ++parent->n_coll, 1, -1, &now);
	watchdog_arm(st, "comm_split", parent->tag, st->world->h, &wf, &now);
	int rc = st->be->split(parent->h, color, key, &c->h, &c->rank, &c->size, err);
	if (watchdog_disarm(st, err))
		rc = -1;
	else if (rc)
		fail_call(st, "comm_split", parent->tag, err);
	if (rc || !c->h) {
		free(c);
		return rc ? -1 : 0;
	}
	c->st = st;
	c->tag = tag;
	c->key = split_key(parent->key, ordinal, color);
	c->board_i = progress_add(st->board, c->key, c->rank);
	st->n_split++;
	*out = c;
	return 0;
}

void comm_destroy(Comm *c)
{
	if (!c || c == c->st->world)
		return;
	c->st->be->comm_free(c->h);
	progress_remove(c->st->board, c->board_i);
	c->st->n_split--;
	free(c);
}

int comm_finalize(Comm *world, PxError *err)
{
	if (!world)
		return 0;
	CommState *st = world->st;
	if (world != st->world)
		return px_fail(err, PX_ERR_RUNTIME,
			       "rank %d: comm_finalize: given a split communicator, not the world",
			       st->env.rank);
	if (st->n_split)
		return px_fail(err, PX_ERR_RUNTIME,
			       "rank %d: comm_finalize: %d split communicators still open; "
			       "comm_destroy them first",
			       st->env.rank, st->n_split);
	if (comm_sync(world, err)) /* device waits still queued */
		return -1;
	/* finalize waits for every rank, so a missing one must trip the watchdog here too; the
	 * backend frees the world's handle on its way out, so abort gets NULL */
	struct timespec now;
	WaitFor wf = board_enter(world, PROGRESS_OP_FINALIZE, ++world->n_coll, 1, -1, &now);
	watchdog_arm(st, "finalize", COMM_TAG_WORLD, NULL, &wf, &now);
	int rc = st->be->finalize(world->h, err);
	int fired = watchdog_disarm(st, err);
	if (rc && !fired)
		fail_call(st, "finalize", COMM_TAG_WORLD, err);
	watchdog_stop(st);
	progress_close(st->board);
	free(st->peers);
	free(world);
	free(st);
	return rc || fired ? -1 : 0;
}

int comm_rank(const Comm *c) { return c->rank; }
int comm_size(const Comm *c) { return c->size; }
int comm_tag(const Comm *c) { return c->tag; }
const CommEnv *comm_env(const Comm *c) { return &c->st->env; }

int comm_set_deadline(Comm *c, double deadline_s, PxError *err)
{
	if (check_deadline(deadline_s, c->st->env.rank, err))
		return -1;
	c->st->cfg.deadline_s = deadline_s; /* the call in flight, if any, keeps its own */
	return 0;
}

/* ---- counters ---- */

const CommCounters *comm_counters(const Comm *c)
{
	return &c->st->counters;
}

void comm_counters_reset(Comm *c)
{
	int counted = c->st->counters.wire_counted;
	memset(&c->st->counters, 0, sizeof(c->st->counters));
	c->st->counters.wire_counted = counted;
}

/* The backend's running count of bytes sent and received (zeros where it keeps none). */
static void moved_read(const Comm *c, int64_t m[2])
{
	m[0] = m[1] = 0;
	if (c->st->be->moved)
		c->st->be->moved(c->h, &m[0], &m[1]);
}

/* What the backend counted since the call in hand began, added to m. */
static void moved_add(const Comm *c, int64_t m[2])
{
	int64_t now[2];
	moved_read(c, now);
	m[0] += now[0] - c->st->moved0[0];
	m[1] += now[1] - c->st->moved0[1];
}

/* Only for a backend that cannot count (NCCL): sim/traffic's ring formula, labelled computed
 * (CommCounters.wire_counted = 0). A counting backend's figure never comes from here. */
static double wire_computed(int kind, int64_t payload, int n)
{
	if (kind < N_COLLS)
		return traffic_ring_wire_bytes((CollKind)kind, (double)payload, n);
	if (kind == COMM_KIND_REDUCE)
		return traffic_ring_wire_bytes(COLL_BROADCAST, (double)payload, n);
	return 0; /* barrier: no payload */
}

/* moved: the bytes the backend counted for this call (sent, received). */
static void count_call(Comm *c, int kind, int64_t payload, const int64_t moved[2])
{
	CommCounters *k = &c->st->counters;
	k->calls[kind][c->tag]++;
	k->payload_bytes[kind][c->tag] += payload;
	if (k->wire_counted) {
		k->wire_bytes[kind][c->tag] += (double)moved[0];
		k->recv_bytes[kind][c->tag] += moved[1];
	} else {
		k->wire_bytes[kind][c->tag] += wire_computed(kind, payload, c->size);
	}
}

/* ---- argument checks ---- */

static int fail_args(const Comm *c, const char *what, PxError *err, const char *why)
{
	return px_fail(err, PX_ERR_RUNTIME, "rank %d: %s on group %s: %s", c->st->env.rank, what,
		       comm_tag_name(c->tag), why);
}

/* The checks every call shares; fills *payload (nccl-tests' size) for the counters.
 * blocks: how many count-sized blocks the whole array holds (nranks for gathers, else 1). */
static int check_call(const Comm *c, const char *what, CommDtype dt, CommRedOp op, size_t count,
		      int blocks, int64_t *payload, PxError *err)
{
	if (!c)
		return px_fail(err, PX_ERR_RUNTIME, "%s: no communicator", what);
	if ((unsigned)dt >= N_COMM_DTYPES || (unsigned)op >= N_COMM_REDOPS)
		return px_fail(err, PX_ERR_RUNTIME,
			       "rank %d: %s on group %s: unknown data type %d or reduction %d",
			       c->st->env.rank, what, comm_tag_name(c->tag), (int)dt, (int)op);
	int64_t unit = (int64_t)comm_dtype_bytes(dt) * blocks;
	if (count > (size_t)(INT64_MAX / unit))
		return fail_args(c, what, err, "count too large");
	*payload = (int64_t)count * unit;
	return 0;
}

/* INT8 (ZeRO++'s quantized bytes) is moved, never summed. */
static int check_reducible(const Comm *c, const char *what, CommDtype dt, PxError *err)
{
	return dt == COMM_INT8 ? fail_args(c, what, err, "int8 values are moved, never reduced") : 0;
}

static int overlap(const void *a, size_t a_bytes, const void *b, size_t b_bytes)
{
	uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
	return a_bytes && b_bytes && x < y + b_bytes && y < x + a_bytes;
}

static int check_root(const Comm *c, const char *what, int root, PxError *err)
{
	if (root >= 0 && root < c->size)
		return 0;
	return px_fail(err, PX_ERR_RUNTIME, "rank %d: %s on group %s: root %d is not a rank of 0-%d",
		       c->st->env.rank, what, comm_tag_name(c->tag), root, c->size - 1);
}

static int check_peer(const Comm *c, const char *what, int peer, PxError *err)
{
	if (peer >= 0 && peer < c->size && peer != c->rank)
		return 0;
	return px_fail(err, PX_ERR_RUNTIME,
		       "rank %d: %s on group %s: peer %d must be another rank of 0-%d (this is %d)",
		       c->st->env.rank, what, comm_tag_name(c->tag), peer, c->size - 1, c->rank);
}

/* ---- calls ---- */

/* Every call arms the watchdog, tells the board and notes the backend's byte count before the
 * backend runs, and is counted only once it completed. op, call, fresh, peer: board_enter's. */
static void call_begin(Comm *c, const char *what, int op, int64_t call, int fresh, int peer)
{
	struct timespec now;
	moved_read(c, c->st->moved0);
	WaitFor wf = board_enter(c, op, call, fresh, peer, &now);
	watchdog_arm(c->st, what, c->tag, c->st->world->h, &wf, &now);
}

/* A collective's begin: the next number on c. */
static void coll_begin(Comm *c, const char *what, int kind)
{
	call_begin(c, what, kind, ++c->n_coll, 1, -1);
}

static int call_end(Comm *c, const char *what, int kind, int rc, int64_t payload, PxError *err)
{
	if (watchdog_disarm(c->st, err))
		return -1;
	if (rc)
		return fail_call(c->st, what, c->tag, err);
	int64_t moved[2] = {0, 0};
	moved_add(c, moved);
	count_call(c, kind, payload, moved);
	return 0;
}

/* The checks of the three calls that also have a started form; fill *payload. */
static int check_all_gather(Comm *c, const void *send, void *recv, size_t count, CommDtype dt,
			    int64_t *whole, PxError *err)
{
	const char *what = "all_gather";
	if (check_call(c, what, dt, COMM_SUM, count, c ? c->size : 1, whole, err))
		return -1;
	size_t part = (size_t)*whole / (size_t)c->size;
	if (*whole && (!send || !recv))
		return fail_args(c, what, err, "send or recv is NULL");
	int in_place = (uintptr_t)send == (uintptr_t)recv + (size_t)c->rank * part;
	if (!in_place && overlap(send, part, recv, (size_t)*whole))
		return fail_args(c, what, err,
				 "send overlaps recv other than at recv + rank x count");
	return 0;
}

static int check_reduce_scatter(Comm *c, const void *send, void *recv, size_t count,
				CommDtype dt, CommRedOp op, int64_t *whole, PxError *err)
{
	const char *what = "reduce_scatter";
	if (check_call(c, what, dt, op, count, c ? c->size : 1, whole, err) ||
	    check_reducible(c, what, dt, err))
		return -1;
	size_t part = (size_t)*whole / (size_t)c->size;
	if (*whole && (!send || !recv))
		return fail_args(c, what, err, "send or recv is NULL");
	int in_place = (uintptr_t)recv == (uintptr_t)send + (size_t)c->rank * part;
	if (!in_place && overlap(send, (size_t)*whole, recv, part))
		return fail_args(c, what, err,
				 "recv overlaps send other than at send + rank x count");
	return 0;
}

static int check_all_reduce(Comm *c, const void *send, void *recv, size_t count, CommDtype dt,
			    CommRedOp op, int64_t *bytes, PxError *err)
{
	const char *what = "all_reduce";
	if (check_call(c, what, dt, op, count, 1, bytes, err) || check_reducible(c, what, dt, err))
		return -1;
	if (*bytes && (!send || !recv))
		return fail_args(c, what, err, "send or recv is NULL");
	if (send != recv && overlap(send, (size_t)*bytes, recv, (size_t)*bytes))
		return fail_args(c, what, err, "send and recv overlap without being equal");
	return 0;
}

int comm_all_gather(Comm *c, const void *send, void *recv, size_t count, CommDtype dt,
		    PxError *err)
{
	int64_t whole;
	if (check_all_gather(c, send, recv, count, dt, &whole, err))
		return -1;
	coll_begin(c, "all_gather", COLL_ALL_GATHER);
	int rc = c->st->be->all_gather(c->h, send, recv, count, dt, err);
	return call_end(c, "all_gather", COLL_ALL_GATHER, rc, whole, err);
}

int comm_reduce_scatter(Comm *c, const void *send, void *recv, size_t count, CommDtype dt,
			CommRedOp op, PxError *err)
{
	int64_t whole;
	if (check_reduce_scatter(c, send, recv, count, dt, op, &whole, err))
		return -1;
	coll_begin(c, "reduce_scatter", COLL_REDUCE_SCATTER);
	int rc = c->st->be->reduce_scatter(c->h, send, recv, count, dt, op, err);
	return call_end(c, "reduce_scatter", COLL_REDUCE_SCATTER, rc, whole, err);
}

int comm_all_reduce(Comm *c, const void *send, void *recv, size_t count, CommDtype dt,
		    CommRedOp op, PxError *err)
{
	int64_t bytes;
	if (check_all_reduce(c, send, recv, count, dt, op, &bytes, err))
		return -1;
	coll_begin(c, "all_reduce", COLL_ALL_REDUCE);
	int rc = c->st->be->all_reduce(c->h, send, recv, count, dt, op, err);
	return call_end(c, "all_reduce", COLL_ALL_REDUCE, rc, bytes, err);
}

int comm_reduce(Comm *c, const void *send, void *recv, size_t count, CommDtype dt, CommRedOp op,
		int root, PxError *err)
{
	const char *what = "reduce";
	int64_t bytes;
	if (check_call(c, what, dt, op, count, 1, &bytes, err) || check_reducible(c, what, dt, err) ||
	    check_root(c, what, root, err))
		return -1;
	int is_root = c->rank == root;
	if (bytes && (!send || (is_root && !recv)))
		return fail_args(c, what, err, "send (or recv on the root) is NULL");
	if (is_root && send != recv && overlap(send, (size_t)bytes, recv, (size_t)bytes))
		return fail_args(c, what, err, "send and recv overlap without being equal");
	coll_begin(c, what, COMM_KIND_REDUCE);
	int rc = c->st->be->reduce(c->h, send, recv, count, dt, op, root, err);
	return call_end(c, what, COMM_KIND_REDUCE, rc, bytes, err);
}

int comm_broadcast(Comm *c, const void *send, void *recv, size_t count, CommDtype dt, int root,
		   PxError *err)
{
	const char *what = "broadcast";
	int64_t bytes;
	if (check_call(c, what, dt, COMM_SUM, count, 1, &bytes, err) ||
	    check_root(c, what, root, err))
		return -1;
	int is_root = c->rank == root;
	if (bytes && (!recv || (is_root && !send)))
		return fail_args(c, what, err, "recv (or send on the root) is NULL");
	if (is_root && send != recv && overlap(send, (size_t)bytes, recv, (size_t)bytes))
		return fail_args(c, what, err, "send and recv overlap without being equal");
	coll_begin(c, what, COLL_BROADCAST);
	int rc = c->st->be->broadcast(c->h, send, recv, count, dt, root, err);
	return call_end(c, what, COLL_BROADCAST, rc, bytes, err);
}

int comm_all_to_all(Comm *c, const void *send, void *recv, size_t count, CommDtype dt,
		    PxError *err)
{
	const char *what = "all_to_all";
	int64_t whole;
	if (check_call(c, what, dt, COMM_SUM, count, c ? c->size : 1, &whole, err))
		return -1;
	if (whole && (!send || !recv))
		return fail_args(c, what, err, "send or recv is NULL");
	if (send != recv && overlap(send, (size_t)whole, recv, (size_t)whole))
		return fail_args(c, what, err, "send and recv overlap without being equal");
	coll_begin(c, what, COLL_ALL_TO_ALL);
	int rc = c->st->be->all_to_all(c->h, send, recv, count, dt, err);
	return call_end(c, what, COLL_ALL_TO_ALL, rc, whole, err);
}

/* A send's arguments (blocking or started): its payload into *bytes, or -1 naming what is wrong. */
static int check_send(Comm *c, const void *buf, size_t count, CommDtype dt, int peer,
		      int64_t *bytes, PxError *err)
{
	const char *what = "send";
	if (check_call(c, what, dt, COMM_SUM, count, 1, bytes, err) ||
	    check_peer(c, what, peer, err))
		return -1;
	if (*bytes && !buf)
		return fail_args(c, what, err, "buf is NULL");
	return 0;
}

int comm_send(Comm *c, const void *buf, size_t count, CommDtype dt, int peer, PxError *err)
{
	const char *what = "send";
	int64_t bytes;
	if (check_send(c, buf, count, dt, peer, &bytes, err))
		return -1;
	call_begin(c, what, COLL_P2P, 0, 0, peer);
	int rc = c->st->be->send(c->h, buf, count, dt, peer, err);
	return call_end(c, what, COLL_P2P, rc, bytes, err);
}

int comm_recv(Comm *c, void *buf, size_t count, CommDtype dt, int peer, PxError *err)
{
	const char *what = "recv";
	int64_t bytes;
	if (check_call(c, what, dt, COMM_SUM, count, 1, &bytes, err) ||
	    check_peer(c, what, peer, err))
		return -1;
	if (bytes && !buf)
		return fail_args(c, what, err, "buf is NULL");
	call_begin(c, what, COLL_P2P_RECV, 0, 0, peer);
	int rc = c->st->be->recv(c->h, buf, count, dt, peer, err);
	return call_end(c, what, COLL_P2P_RECV, rc, bytes, err);
}

int comm_barrier(Comm *c, PxError *err)
{
	const char *what = "barrier";
	int64_t none;
	if (check_call(c, what, COMM_FP32, COMM_SUM, 0, 1, &none, err))
		return -1;
	coll_begin(c, what, COMM_KIND_BARRIER);
	int rc = c->st->be->barrier(c->h, err);
	return call_end(c, what, COMM_KIND_BARRIER, rc, 0, err);
}

/* ---- started collectives ---- */

void comm_set_stream(Comm *c, void *stream)
{
	c->st->stream = stream;
}

int comm_in_flight(const Comm *c)
{
	return c->st->n_started;
}

void comm_abort(Comm *c, int code)
{
	CommState *st = c->st;
	fflush(stdout);
	fflush(stderr);
	if (atomic_exchange(&st->board_linked, 0))
		progress_unlink(st->board_name);
	st->be->abort(st->world->h, code);
	_exit(code); /* a backend's abort ends the process; this is in case one returns */
}

/* A backend without a started form runs the whole call now. */
static int run_whole(Comm *c, const CommCall *k, PxError *err)
{
	const CommBackend *be = c->st->be;
	if (k->kind == COLL_ALL_GATHER)
		return be->all_gather(c->h, k->send, k->recv, k->count, k->dt, err);
	if (k->kind == COLL_REDUCE_SCATTER)
		return be->reduce_scatter(c->h, k->send, k->recv, k->count, k->dt, k->op, err);
	return be->all_reduce(c->h, k->send, k->recv, k->count, k->dt, k->op, err);
}

/* The start runs under the deadline too: a backend may block in it (a staged copy, an enqueue
 * NCCL has not finished). */
static int start_call(Comm *c, const char *what, const CommCall *k, int64_t payload,
		      CommRequest **out, PxError *err)
{
	CommState *st = c->st;
	CommRequest *q = calloc(1, sizeof(*q));
	if (!q)
		return px_fail(err, PX_ERR_RUNTIME, "rank %d: %s: out of memory", st->env.rank, what);
	/* a started collective arrives, and is numbered, at its start */
	*q = (CommRequest){.c = c, .what = what, .kind = k->kind, .payload = payload,
			   .call = ++c->n_coll};
	call_begin(c, what, k->kind, q->call, 1, -1);
	int rc = st->be->start ? st->be->start(c->h, k, st->stream, &q->h, err)
			       : run_whole(c, k, err);
	if (watchdog_disarm(st, err) || (rc && fail_call(st, what, c->tag, err))) {
		free(q);
		return -1;
	}
	moved_add(c, q->moved); /* all of it where the call ran whole; nothing yet on MPI */
	st->n_started++;
	*out = q;
	return 0;
}

int comm_all_gather_start(Comm *c, const void *send, void *recv, size_t count, CommDtype dt,
			  CommRequest **req, PxError *err)
{
	int64_t whole;
	*req = NULL;
	if (check_all_gather(c, send, recv, count, dt, &whole, err))
		return -1;
	CommCall k = {COLL_ALL_GATHER, send, recv, count, dt, COMM_SUM};
	return start_call(c, "all_gather", &k, whole, req, err);
}

int comm_reduce_scatter_start(Comm *c, const void *send, void *recv, size_t count, CommDtype dt,
			      CommRedOp op, CommRequest **req, PxError *err)
{
	int64_t whole;
	*req = NULL;
	if (check_reduce_scatter(c, send, recv, count, dt, op, &whole, err))
		return -1;
	CommCall k = {COLL_REDUCE_SCATTER, send, recv, count, dt, op};
	return start_call(c, "reduce_scatter", &k, whole, req, err);
}

int comm_all_reduce_start(Comm *c, const void *send, void *recv, size_t count, CommDtype dt,
			  CommRedOp op, CommRequest **req, PxError *err)
{
	int64_t bytes;
	*req = NULL;
	if (check_all_reduce(c, send, recv, count, dt, op, &bytes, err))
		return -1;
	CommCall k = {COLL_ALL_REDUCE, send, recv, count, dt, op};
	return start_call(c, "all_reduce", &k, bytes, req, err);
}

int comm_send_start(Comm *c, const void *buf, size_t count, CommDtype dt, int peer,
		    CommRequest **req, PxError *err)
{
	const char *what = "send";
	int64_t bytes;
	*req = NULL;
	if (check_send(c, buf, count, dt, peer, &bytes, err))
		return -1;
	CommState *st = c->st;
	if (!st->be->send_start)
		return fail_args(c, what, err, "this backend has no started send");
	CommRequest *q = calloc(1, sizeof(*q));
	if (!q)
		return px_fail(err, PX_ERR_RUNTIME, "rank %d: %s: out of memory", st->env.rank, what);
	/* point to point: no number on the communicator (comm_send's) */
	*q = (CommRequest){.c = c, .what = what, .kind = COLL_P2P, .payload = bytes};
	call_begin(c, what, COLL_P2P, 0, 0, peer);
	int rc = st->be->send_start(c->h, buf, count, dt, peer, &q->h, err);
	if (watchdog_disarm(st, err) || (rc && fail_call(st, what, c->tag, err))) {
		free(q);
		return -1;
	}
	st->n_started++;
	*req = q;
	return 0;
}

int comm_wait(CommRequest *q, PxError *err)
{
	if (!q)
		return 0;
	Comm *c = q->c;
	CommState *st = c->st;
	int done = 1, rc = 0;
	st->n_started--;
	if (q->h) {
		call_begin(c, q->what, q->kind, q->call, 0, -1);
		rc = st->be->wait(q->h, st->stream, &done, err);
		if (watchdog_disarm(st, err) || (rc && fail_call(st, q->what, c->tag, err))) {
			free(q);
			return -1;
		}
		moved_add(c, q->moved);
	}
	count_call(c, q->kind, q->payload, q->moved);
	if (done) {
		free(q);
	} else { /* the device's wait is queued; comm_sync sees it through */
		q->next = st->unsynced;
		st->unsynced = q;
	}
	return 0;
}

/* Test every unsynced request once; drop those done. */
static int sync_pass(CommState *st, PxError *err)
{
	for (CommRequest **pq = &st->unsynced; *pq;) {
		CommRequest *q = *pq;
		int done = 0;
		if (st->be->test(q->h, &done, err)) {
			*pq = q->next;
			fail_call(st, q->what, q->c->tag, err);
			free(q);
			return -1;
		}
		if (done) {
			*pq = q->next;
			free(q);
		} else {
			pq = &q->next;
		}
	}
	return 0;
}

int comm_sync(Comm *c, PxError *err)
{
	CommState *st = c->st;
	if (!st->unsynced)
		return 0;
	CommRequest *first = st->unsynced;
	call_begin(first->c, first->what, first->kind, first->call, 0, -1);
	int rc = 0;
	while (st->unsynced && !(rc = sync_pass(st, err)))
		if (st->unsynced)
			sched_yield();
	if (watchdog_disarm(st, err))
		return -1;
	return rc;
}

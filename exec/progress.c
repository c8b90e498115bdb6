#include "progress.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---- layout ----
 * A header, then one slot per world rank, written by that rank alone and read by the watchdogs
 * of the others: no locks, only atomic loads and stores of aligned words. Those are lock-free
 * (checked here), so they are plain instructions on the shared pages and work between
 * processes; a lock-based fallback would not. */

#if ATOMIC_INT_LOCK_FREE != 2 || ATOMIC_LONG_LOCK_FREE != 2 || ATOMIC_LLONG_LOCK_FREE != 2
#error "the progress board shares atomics between processes: it needs them lock-free"
#endif

#define BOARD_MAGIC 0x70782d626f617264ULL /* "px-board" */

typedef struct SlotComm {
	_Atomic uint64_t key;  /* 0: free */
	_Atomic int64_t calls; /* collectives entered on it */
	_Atomic int rank_in;   /* the slot's rank in it */
} SlotComm;

/* One rank's; 64-byte aligned so that two ranks never write the same cache line. */
typedef struct Slot {
	_Alignas(64) _Atomic int pid; /* 0: no rank of this node has this world rank */
	_Atomic uint32_t doing;       /* PROGRESS_DOING's word; 0: outside comm */
	_Atomic uint64_t since_ns;    /* CLOCK_MONOTONIC when doing last changed */
	SlotComm comms[PROGRESS_MAX_COMMS];
} Slot;

typedef struct Header {
	_Alignas(64) uint64_t magic; /* written by the creator before any other rank opens */
	int32_t size;                /* world ranks, i.e. slots */
} Header;

struct ProgressBoard {
	void *map;
	size_t bytes;
	Slot *slots; /* [size], in map */
	Slot *mine;
	int size;
};

static size_t board_bytes(int size)
{
	return sizeof(Header) + (size_t)size * sizeof(Slot);
}

static uint64_t now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* ---- the segment ---- */

/* A name with a second '/' is a file's path; shm_open would refuse it. */
static int seg_is_path(const char *name)
{
	return name[0] && strchr(name + 1, '/') != NULL;
}

static int seg_open(const char *name, int flags, mode_t mode)
{
	if (seg_is_path(name))
		return open(name, flags | O_CLOEXEC | O_NOFOLLOW, mode);
	return shm_open(name, flags, mode);
}

static int seg_unlink(const char *name)
{
	return seg_is_path(name) ? unlink(name) : shm_unlink(name);
}

static const char *seg_call(const char *name)
{
	return seg_is_path(name) ? "open" : "shm_open";
}

static int sys_fail(PxError *err, int e, const char *call, const char *name)
{
	px_fail(err, PX_ERR_RUNTIME, "%s %s: %s", call, name, strerror(e));
	return -e;
}

/* The creator's descriptor, sized; -errno on failure, with nothing left under name. */
static int board_create(const char *name, size_t bytes, PxError *err)
{
	/* the name carries the job's id, so what is there is a crashed run's, never a live one's */
	seg_unlink(name);
	int fd = seg_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
	if (fd < 0)
		return sys_fail(err, errno, seg_call(name), name);
	/* allocated now: a tmpfs that runs out later would raise SIGBUS on a store, not an error */
	int e = posix_fallocate(fd, 0, (off_t)bytes);
	if (e) {
		close(fd);
		seg_unlink(name);
		return sys_fail(err, e, "posix_fallocate", name);
	}
	return fd;
}

static int board_attach(const char *name, size_t bytes, PxError *err)
{
	int fd = seg_open(name, O_RDWR, 0);
	if (fd < 0)
		return sys_fail(err, errno, seg_call(name), name);
	struct stat sb;
	if (fstat(fd, &sb)) {
		int e = errno;
		close(fd);
		return sys_fail(err, e, "fstat", name);
	}
	if ((size_t)sb.st_size != bytes) {
		close(fd);
		px_fail(err, PX_ERR_RUNTIME, "%s holds %lld bytes, not the %zu of this world size",
			name, (long long)sb.st_size, bytes);
		return -EINVAL;
	}
	return fd;
}

int progress_open(const char *name, int size, int rank, int create, ProgressBoard **out,
		  PxError *err)
{
	*out = NULL;
	if (size < 1 || rank < 0 || rank >= size) {
		px_fail(err, PX_ERR_RUNTIME, "progress board: rank %d of %d", rank, size);
		return -EINVAL;
	}
	size_t bytes = board_bytes(size);
	int fd = create ? board_create(name, bytes, err) : board_attach(name, bytes, err);
	if (fd < 0)
		return fd;
	void *map = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	int e = errno;
	close(fd); /* the mapping keeps the segment */
	if (map == MAP_FAILED) {
		if (create)
			seg_unlink(name);
		return sys_fail(err, e, "mmap", name);
	}
	Header *h = map;
	if (create) {
		h->size = size;
		h->magic = BOARD_MAGIC;
	} else if (h->magic != BOARD_MAGIC || h->size != size) {
		munmap(map, bytes);
		px_fail(err, PX_ERR_RUNTIME, "%s is not a progress board of %d ranks", name, size);
		return -EINVAL;
	}
	ProgressBoard *b = calloc(1, sizeof(*b));
	if (!b) {
		munmap(map, bytes);
		if (create)
			seg_unlink(name);
		px_fail(err, PX_ERR_RUNTIME, "progress board: out of memory");
		return -ENOMEM;
	}
	*b = (ProgressBoard){.map = map, .bytes = bytes, .size = size};
	b->slots = (Slot *)((char *)map + sizeof(Header));
	b->mine = &b->slots[rank];
	atomic_store_explicit(&b->mine->since_ns, now_ns(), memory_order_relaxed);
	atomic_store_explicit(&b->mine->pid, (int)getpid(), memory_order_release);
	*out = b;
	return 0;
}

int progress_unlink(const char *name)
{
	return seg_unlink(name) && errno != ENOENT ? -errno : 0;
}

void progress_close(ProgressBoard *b)
{
	if (!b)
		return;
	munmap(b->map, b->bytes);
	free(b);
}

/* ---- this rank's slot ---- */

int progress_add(ProgressBoard *b, uint64_t key, int rank_in_comm)
{
	if (!b || !key)
		return -1;
	for (int i = 0; i < PROGRESS_MAX_COMMS; i++) {
		SlotComm *c = &b->mine->comms[i];
		if (atomic_load_explicit(&c->key, memory_order_relaxed))
			continue;
		atomic_store_explicit(&c->calls, 0, memory_order_relaxed);
		atomic_store_explicit(&c->rank_in, rank_in_comm, memory_order_relaxed);
		/* the key last: a reader that sees it sees the rest */
		atomic_store_explicit(&c->key, key, memory_order_release);
		return i;
	}
	return -1;
}

void progress_remove(ProgressBoard *b, int idx)
{
	if (b && idx >= 0 && idx < PROGRESS_MAX_COMMS)
		atomic_store_explicit(&b->mine->comms[idx].key, 0, memory_order_relaxed);
}

void progress_enter(ProgressBoard *b, int idx, int64_t call, uint32_t doing, uint64_t t_ns)
{
	if (!b)
		return;
	if (idx >= 0)
		atomic_store_explicit(&b->mine->comms[idx].calls, call, memory_order_relaxed);
	atomic_store_explicit(&b->mine->doing, doing, memory_order_relaxed);
	atomic_store_explicit(&b->mine->since_ns, t_ns, memory_order_relaxed);
}

void progress_leave(ProgressBoard *b, uint64_t t_ns)
{
	if (!b)
		return;
	atomic_store_explicit(&b->mine->doing, 0, memory_order_relaxed);
	atomic_store_explicit(&b->mine->since_ns, t_ns, memory_order_relaxed);
}

/* ---- reading ---- */

int progress_read(const ProgressBoard *b, uint64_t key, uint64_t t_ns, ProgressPeer *peers,
		  int max)
{
	int n = 0;
	for (int r = 0; b && key && r < b->size; r++) {
		Slot *s = &b->slots[r];
		int pid = atomic_load_explicit(&s->pid, memory_order_acquire);
		for (int i = 0; pid && i < PROGRESS_MAX_COMMS; i++) {
			SlotComm *c = &s->comms[i];
			if (atomic_load_explicit(&c->key, memory_order_acquire) != key)
				continue;
			if (n < max) {
				uint64_t since = atomic_load_explicit(&s->since_ns,
								      memory_order_relaxed);
				ProgressPeer *p = &peers[n];
				p->rank = r;
				p->rank_in = atomic_load_explicit(&c->rank_in,
								  memory_order_relaxed);
				p->calls = atomic_load_explicit(&c->calls, memory_order_relaxed);
				p->doing = atomic_load_explicit(&s->doing, memory_order_relaxed);
				p->for_s = since < t_ns ? (double)(t_ns - since) * 1e-9 : 0;
				/* same node, so the pid is in our namespace */
				p->gone = kill(pid, 0) && errno == ESRCH;
			}
			n++;
			break;
		}
	}
	return n;
}

/* ---- the verdict ---- */

typedef struct Out {
	char *s;
	size_t bytes, len; /* len stops at bytes - 1: what does not fit is cut */
} Out;

static void put(Out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(Out *o, const char *fmt, ...)
{
	if (o->len + 1 >= o->bytes)
		return;
	va_list ap;
	va_start(ap, fmt);
	int k = vsnprintf(o->s + o->len, o->bytes - o->len, fmt, ap);
	va_end(ap);
	if (k > 0)
		o->len += (size_t)k < o->bytes - o->len ? (size_t)k : o->bytes - o->len - 1;
}

static const char *op_name(unsigned op)
{
	if (op == PROGRESS_OP_SPLIT)
		return "comm_split";
	if (op == PROGRESS_OP_FINALIZE)
		return "finalize";
	if (op == COLL_P2P || op == COLL_P2P_RECV) /* the calls' names, not the counters' rows */
		return op == COLL_P2P ? "send" : "recv";
	return comm_kind_name((int)op);
}

/* "outside comm for 2.1 s", "in barrier on group tp for 0.3 s", "process gone" */
static void put_state(Out *o, const ProgressPeer *p)
{
	if (p->gone)
		put(o, "process gone");
	else if (!p->doing)
		put(o, "outside comm for %.1f s", p->for_s);
	else
		put(o, "in %s on group %s for %.1f s", op_name(p->doing >> 8 & 0xffu),
		    comm_tag_name((int)(p->doing >> 16)), p->for_s);
}

static void put_p2p(Out *o, const ProgressPeer *peers, int n, int peer)
{
	for (int i = 0; i < n; i++) {
		if (peers[i].rank_in != peer)
			continue;
		put(o, "; its peer, rank %d, is ", peers[i].rank);
		put_state(o, &peers[i]);
		return;
	}
	put(o, "; its peer is on another node, not visible");
}

void progress_verdict(const ProgressPeer *peers, int n, int size, int64_t call, int peer,
		      char *out, size_t bytes)
{
	Out o = {out, bytes, 0};
	if (!bytes)
		return;
	out[0] = '\0';
	if (call <= 0) {
		put_p2p(&o, peers, n, peer);
		return;
	}
	int missing = 0;
	for (int i = 0; i < n; i++) {
		if (peers[i].calls >= call)
			continue;
		if (++missing > PROGRESS_MAX_NAMED)
			continue;
		put(&o, "%s rank %d (at call %" PRId64 ", ", missing == 1 ? "; not arrived:" : ",",
		    peers[i].rank, peers[i].calls);
		put_state(&o, &peers[i]);
		put(&o, ")");
	}
	if (missing > PROGRESS_MAX_NAMED)
		put(&o, ", and %d more", missing - PROGRESS_MAX_NAMED);
	int hidden = size > n ? size - n : 0;
	if (!missing && !hidden)
		put(&o, "; all %d ranks arrived (the hang is inside the backend or the network)",
		    size);
	else if (!missing && n == 1)
		put(&o, "; the only rank on this node arrived");
	else if (!missing)
		put(&o, "; the %d ranks on this node arrived", n);
	if (hidden == 1)
		put(&o, "; 1 rank on another node not visible");
	else if (hidden)
		put(&o, "; %d ranks on other nodes not visible", hidden);
}

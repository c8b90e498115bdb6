/* progress: the board on which the ranks of one node publish how far each has got, so that a rank
 * whose call overran its deadline can name the ranks that never arrived. Owns the shared-memory
 * segment (one per node and per comm_init: a POSIX shm name, or a file in the job's own folder),
 * its layout and the wording of the verdict. It knows nothing of backends, agrees on no name by
 * itself (comm.c does) and sees no rank of another node. docs/gpu_comm.md, "Errors and hangs",
 * explains the design. */
#ifndef PX_EXEC_PROGRESS_H
#define PX_EXEC_PROGRESS_H

#include <stddef.h>
#include <stdint.h>

#include "../engine/err.h"
#include "comm.h"

enum {
	PROGRESS_MAX_COMMS = 16, /* communicators one rank can have on the board at once */
	PROGRESS_MAX_NAMED = 4,  /* ranks a verdict names before "and N more" */
};

/* What a rank is doing, as one word: 0 outside any comm call, else the call (a comm kind or
 * PROGRESS_OP_*) and the tag of its communicator. */
enum { PROGRESS_OP_SPLIT = N_COMM_KINDS, PROGRESS_OP_FINALIZE, N_PROGRESS_OPS };
#define PROGRESS_DOING(op, tag) (1u | (uint32_t)(op) << 8 | (uint32_t)(tag) << 16)

typedef struct ProgressBoard ProgressBoard; /* this process's mapping; opaque */

/* Map the segment name (a POSIX shm name, "/...", or the path of a file in a folder on a tmpfs:
 * "/dev/shm/px-run-0-77/px-board-..."), laid out for a world of size ranks, and mark this rank's
 * slot as present. create: remove whatever a crashed job left under name, then create it
 * (exclusively: one rank per node creates); otherwise open the creator's, which must have the
 * same size. A path is never opened through a symbolic link. *out is the caller's until
 * progress_close. Returns 0, or -errno with err naming the call and the file. */
int progress_open(const char *name, int size, int rank, int create, ProgressBoard **out,
		  PxError *err);
/* Remove name once every rank of the node has it mapped: the mappings stay, and a crash can no
 * longer leave the segment behind. ENOENT is not an error. Returns 0 or -errno. */
int progress_unlink(const char *name);
void progress_close(ProgressBoard *b); /* NULL is fine */

/* Publish a communicator this rank belongs to, under a key every member computes alike (non-zero),
 * with this rank's rank in it. Returns the index that progress_enter takes, or -1 when the rank
 * already has PROGRESS_MAX_COMMS (the communicator then goes untracked: its members read as not
 * visible). b NULL: -1. */
int progress_add(ProgressBoard *b, uint64_t key, int rank_in_comm);
void progress_remove(ProgressBoard *b, int idx); /* idx -1 is fine */

/* The fast path: relaxed stores to this rank's own slot, no lock, no fence. enter: the rank has
 * entered its call-th collective on communicator idx (idx -1: a call that is not counted, e.g.
 * point to point, or the wait of a started collective counted at its start) and is now doing
 * `doing`; leave: it is outside comm again. now_ns: CLOCK_MONOTONIC. b NULL: nothing. */
void progress_enter(ProgressBoard *b, int idx, int64_t call, uint32_t doing, uint64_t now_ns);
void progress_leave(ProgressBoard *b, uint64_t now_ns);

/* One member of a communicator as the board shows it. */
typedef struct ProgressPeer {
	int rank;        /* in the world */
	int rank_in;     /* in the communicator */
	int64_t calls;   /* collectives it has entered on the communicator */
	uint32_t doing;  /* PROGRESS_DOING's word; 0: outside comm */
	double for_s;    /* since it last entered or left a call */
	int gone;        /* its process no longer exists */
} ProgressPeer;

/* The members of communicator key visible on this node, by world rank, into peers (room for
 * max); returns how many there are (the count may exceed max; only max are filled). */
int progress_read(const ProgressBoard *b, uint64_t key, uint64_t now_ns, ProgressPeer *peers,
		  int max);

/* The verdict of a rank waiting for collective number `call` of a communicator of size ranks,
 * from the n members visible on its node (itself included): writes to out, for the watchdog's
 * line, "; not arrived: rank 1 (at call 56, outside comm for 2.1 s)" (up to PROGRESS_MAX_NAMED
 * ranks, then "and N more"), or "; all 4 ranks arrived (...)" when none is missing, followed by
 * "; 2 ranks on other nodes not visible" when some are. call 0: a point-to-point call with the
 * member whose rank in the communicator is peer ("; peer rank 3 is in recv on group pp for
 * 2.0 s"). Pure: reads nothing but its arguments. */
void progress_verdict(const ProgressPeer *peers, int n, int size, int64_t call, int peer,
		      char *out, size_t bytes);

#endif

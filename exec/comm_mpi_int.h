/* comm_mpi_int: what the two files of the MPI backend share, and nothing else includes:
 * comm_mpi.c (MPI's start and end, splits, point to point, barrier, the backend's table) and
 * comm_mpi_coll.c (the collectives as algorithms over point to point, their local reductions, and
 * the count of the bytes each of their messages carried). */
#ifndef PX_EXEC_COMM_MPI_INT_H
#define PX_EXEC_COMM_MPI_INT_H

#include <mpi.h>
#include <stdint.h>

#include "comm.h"

typedef struct MpiColl MpiColl; /* one collective under way (comm_mpi_coll.c) */

/* Scratch buffers kept between calls: a collective's temporaries above glibc's mmap threshold
 * would otherwise be mapped and unmapped at every call. */
enum { MPI_SCRATCH_SLOTS = 8 };
typedef struct MpiScratch {
	void *buf;
	size_t bytes;
	int busy;
} MpiScratch;

/* What one MPI start owns; MPI is per process, so there is one. */
typedef struct MpiWorld {
	int provided;            /* the thread level MPI_Init_thread granted */
	int owns_mpi;            /* this backend called MPI_Init_thread, so it calls MPI_Finalize */
	/* What the point-to-point messages of the calls completed so far carried (comm.h's
	 * CommBackend.moved): a send's bytes once MPI completed it, a receive's as MPI's status
	 * reports them; credited when the call returns (a started one: when its wait does). */
	int64_t sent_bytes, recv_bytes;
	MpiColl *active;         /* collectives under way, blocking and started, progressed together */
	MpiScratch scratch[MPI_SCRATCH_SLOTS];
} MpiWorld;

/* comm_send/comm_recv's message tag, on this layer's own duplicate of the world; the collectives
 * number theirs from 1. */
enum { MPI_P2P_TAG = 0 };

typedef struct MpiComm {
	MPI_Comm comm;
	MpiWorld *world;
	int rank, size;
	int tag; /* the last collective's message tag on this communicator (1-32766; 0 is comm_send's) */
} MpiComm;

/* ---- comm_mpi.c ---- */

/* -1 with err naming call and MPI's string for rc. */
int mpi_fail(int rc, const char *call, PxError *err);
/* 0 when rc is MPI_SUCCESS, else mpi_fail's -1. */
int mpi_check(int rc, const char *call, PxError *err);
/* count as MPI's int, or -1 with err set: bigger calls must be split by the caller. */
int mpi_count(size_t count, const char *call, PxError *err);
/* 16-bit values travel as plain 16-bit words; only the reductions look inside them. */
MPI_Datatype mpi_type(CommDtype dt);

/* ---- comm_mpi_coll.c: CommBackend's entries of the same names ---- */

int mpi_all_gather(void *h, const void *send, void *recv, size_t count, CommDtype dt,
		   PxError *err);
int mpi_reduce_scatter(void *h, const void *send, void *recv, size_t count, CommDtype dt,
		       CommRedOp op, PxError *err);
int mpi_all_reduce(void *h, const void *send, void *recv, size_t count, CommDtype dt,
		   CommRedOp op, PxError *err);
int mpi_reduce(void *h, const void *send, void *recv, size_t count, CommDtype dt, CommRedOp op,
	       int root, PxError *err);
int mpi_broadcast(void *h, const void *send, void *recv, size_t count, CommDtype dt, int root,
		  PxError *err);
int mpi_all_to_all(void *h, const void *send, void *recv, size_t count, CommDtype dt,
		   PxError *err);
int mpi_start(void *h, const CommCall *call, void *stream, void **req, PxError *err);
int mpi_wait(void *req, void *stream, int *done, PxError *err);
int mpi_test(void *req, int *done, PxError *err);
/* A started send to peer, counted as a collective's message is (at its wait). */
int mpi_send_start(void *h, const void *buf, size_t count, CommDtype dt, int peer, void **req,
		   PxError *err);

/* Release the scratch buffers (at finalize; none may be busy). */
void mpi_scratch_release(MpiWorld *w);

#endif

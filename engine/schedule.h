/* schedule: the ordered list of what one rank does, shared by the simulator and the executors.
 * Owns the op vocabulary (allocate/free with a category and a place, compute, collectives, copies,
 * a repeat block for micro-batches) and the container. Building a schedule from a plan is build.c;
 * pricing one is sim/. */
#ifndef PX_SCHEDULE_H
#define PX_SCHEDULE_H

#include <stdint.h>

#include "err.h"

typedef enum { PLACE_GPU, PLACE_CPU, PLACE_NVME, N_PLACES } Place;
typedef enum { CAT_PARAMS, CAT_GRADS, CAT_OPTIM, CAT_ACTIV, CAT_BUFFERS, CAT_OVERHEAD, N_CATS } MemCat;

typedef enum {
	OP_ALLOC,    /* buf, place, cat, what, bytes */
	OP_FREE,     /* buf */
	OP_COMPUTE,  /* sub = CompKind, unit, flops, bytes (memory traffic) */
	OP_COLL,     /* sub = CollKind, group, nranks, elems, elem_bytes, bytes = payload, buf, offset:
			the buffer it works on and the first element there (build.c says which) */
	OP_COPY,     /* sub = CopyDir, bytes */
	OP_LOOP,     /* count: run the ops up to the matching OP_END_LOOP this many times */
	OP_END_LOOP,
} OpKind;

typedef enum { COMP_FWD, COMP_BWD, COMP_RECOMPUTE, COMP_OPTIMIZER, N_COMPS } CompKind;

typedef enum {
	COLL_ALL_GATHER, COLL_REDUCE_SCATTER, COLL_ALL_REDUCE, COLL_ALL_TO_ALL, COLL_BROADCAST,
	COLL_P2P,      /* a send to the next or previous pipeline stage */
	COLL_P2P_RECV, /* its matching receive: counted apart, it puts nothing on this rank's wire */
	N_COLLS
} CollKind;

/* dp: data parallel; tp, pp, ep: tensor, pipeline, expert parallel; hpz: ZeRO++'s secondary
 * partition group; edp: data-parallel ranks holding the same experts; node and xnode: the part of
 * the dp group inside one node and the peers with the same local index on the other nodes
 * (ZeRO++'s hierarchical gradient all-to-all). */
typedef enum {
	GROUP_DP, GROUP_TP, GROUP_PP, GROUP_EP, GROUP_HPZ, GROUP_EDP, GROUP_NODE, GROUP_XNODE,
	N_GROUPS
} CommGroup;

typedef enum { COPY_H2D, COPY_D2H, COPY_NVME_READ, COPY_NVME_WRITE, N_COPIES } CopyDir;

/* What a buffer holds, so that an executor knows which tensor an ALLOC stands for. */
typedef enum {
	BUF_CUDA_CONTEXT, BUF_CUBLAS_WORKSPACE, BUF_NCCL, BUF_LOSS_SCALER,
	BUF_PARAMS,        /* full 16-bit (or fp32) parameters, stage 0-2 */
	BUF_PARAM_PART,    /* this rank's parameter partition, stage 3 */
	BUF_PERSISTENT,    /* stage 3 parameters under the persistence threshold, kept whole */
	BUF_GATHERED,      /* stage 3: a unit's parameters gathered for its compute */
	BUF_GRADS,         /* full gradients, stage 0-1 */
	BUF_GRAD_PART,     /* this rank's gradient partition, stage 2-3 */
	BUF_GRAD_FP32,     /* fp32 gradient partition the optimizer reads */
	BUF_UNIT_GRADS,    /* a unit's gradients before they are reduced (no contiguous buckets) */
	BUF_MASTER,        /* fp32 master parameters */
	BUF_OPT_STATES,    /* optimizer states (Adam m and v) */
	BUF_REDUCE_BUCKET, /* contiguous gradient bucket */
	BUF_ACTIVATIONS,   /* a block's activations kept for backward */
	BUF_CHECKPOINT,    /* a block's input under full recompute */
	BUF_ENDS,          /* embedding and output-layer activations (logits) */
	BUF_SWAP,          /* host staging buffers for NVMe offload */
	BUF_SECONDARY,     /* ZeRO++ hpZ: the parameters of this rank's secondary partition */
	BUF_PERSIST_GRADS, /* stage 3: gradients of the parameters kept whole */
	BUF_UNIT_FP32,     /* CPU backend: a unit's fp32 parameters (and gradients in backward) */
	BUF_HIDDEN,        /* CPU backend: the hidden state flowing between units and its gradient */
	BUF_SCRATCH,       /* CPU backend: the kernels' backward workspace */
	BUF_ERROR_FEEDBACK, /* 1-bit optimizers: worker and server compression errors */
	BUF_OPT_STEP_TEMP, /* what the optimizer step copies while it runs (1-bit LAMB's momenta) */
	N_BUFS
} BufWhat;

typedef struct Op {
	uint8_t kind;       /* OpKind */
	uint8_t sub;        /* CompKind, CollKind or CopyDir */
	uint8_t place;      /* Place (ALLOC) */
	uint8_t cat;        /* MemCat (ALLOC) */
	uint8_t what;       /* BufWhat (ALLOC) */
	uint8_t group;      /* CommGroup (COLL) */
	uint8_t elem_bytes; /* COLL: bytes per element on the wire */
	int32_t unit;       /* layer unit, -1 when none */
	int32_t buf;        /* ALLOC/FREE: buffer id; COLL: the buffer it works on, COPY: the one
			       it copies from (sched_copy_reduced), -1 for none */
	int32_t nranks;     /* COLL: ranks in the group */
	/* One word for the fields no kind reads together, so that an op is 48 bytes, not 64: the
	 * replays stream a pipelined stage's thousands of ops through memory several times. Each
	 * is 0 unless its kind writes it (push zeroes the op); read only for those kinds. */
	union {
		int64_t count;  /* LOOP: repetitions */
		int64_t offset; /* COLL, COPY: first element within the buffer it works on */
		double flops;   /* COMPUTE */
	};
	int64_t elems;      /* COLL, COPY of a reduced slice: elements of the whole array; ALLOC:
			       elements */
	double bytes;       /* ALLOC: size; COLL: payload (nccl-tests "size"); COPY: size;
			       COMPUTE: memory traffic */
} Op;

_Static_assert(sizeof(Op) == 48, "Op: 48 bytes, the replays' stride");

typedef struct Schedule {
	Op *ops;          /* owned */
	int n, cap;
	int step_begin;   /* ops[0..step_begin) set up the rank once; the rest is one optimizer step */
	int n_bufs;       /* buffer ids are 0..n_bufs-1 */
	int rank;
	int *step_at;     /* owned, n_steps: a pipelined stage's k-th step (pipe_order's) begins at
			     ops[step_at[k]]; none elsewhere (the time replay uses it to find the
			     1F1B steady state, docs/time_model.md) */
	int n_steps, cap_steps;
} Schedule;

void sched_init(Schedule *s, int rank);
void sched_free(Schedule *s);
/* Room for at least n ops in all, so that appending up to there does not move the ops; -1 when
 * out of memory (the schedule then stays as it was). */
int sched_reserve(Schedule *s, long long n);
/* Note that the next op begins a pipeline step; 0, or -1 when out of memory. */
int sched_mark_step(Schedule *s);

/* Appenders return 0, or -1 when out of memory (the schedule then stays as it was). */
int sched_alloc(Schedule *s, Place place, MemCat cat, BufWhat what, int unit, double bytes,
		int *buf);
int sched_free_buf(Schedule *s, int buf);
int sched_compute(Schedule *s, CompKind kind, int unit, double flops, double bytes);
int sched_coll(Schedule *s, CollKind kind, CommGroup group, int nranks, int unit, int64_t elems,
	       int elem_bytes, int buf, int64_t offset);
int sched_copy(Schedule *s, CopyDir dir, int unit, double bytes);
/* A copy of a reduced gradient slice: the reduction's unit, buffer, first element and whole
 * array (elems), so that an executor knows what it moves; the simulator needs only bytes. */
int sched_copy_reduced(Schedule *s, CopyDir dir, int unit, double bytes, int buf, int64_t offset,
		       int64_t elems);
int sched_loop(Schedule *s, int64_t count);
int sched_end_loop(Schedule *s);

const char *place_name(Place p);
const char *cat_name(MemCat c);    /* "params", "grads", "optimizer", ... (JSON key stems) */
const char *coll_name(CollKind k); /* "all_gather", ... */
const char *group_name(CommGroup g);
const char *buf_name(BufWhat w);
const char *comp_name(CompKind k);
const char *copy_name(CopyDir d);

#endif

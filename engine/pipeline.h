/* pipeline: pipeline parallelism's two decisions. Which layer units each model chunk holds
 * (partition: uniform, by parameters, or by transformer layers; embedding on the first chunk, head
 * on the last), and in which order a stage runs the forward and backward passes of its
 * micro-batches (GPipe, 1F1B, Megatron's interleaved 1F1B). The bubble and the activations in
 * flight are not computed here: they emerge when the simulator replays this order. */
#ifndef PX_PIPELINE_H
#define PX_PIPELINE_H

#include "err.h"
#include "parallel.h"

/* Model chunk j (0 .. pp*v - 1) holds units [bounds[j], bounds[j+1]) and lives on stage j % pp as
 * that stage's local chunk j / pp (Megatron's interleaved assignment; v = 1 is plain). */
int pipe_partition(PartitionMethod method, const long long *unit_params, int n_units,
		   long long n_blocks, long long pp, long long v, int *bounds, PxError *err);

typedef struct PipeStep {
	int forward; /* 1 forward, 0 backward */
	int mb;      /* micro-batch */
	int chunk;   /* the stage's local model chunk */
} PipeStep;

/* The steps of stage s (0-based) for m micro-batches: 2*m*v entries written to out. */
int pipe_order(PipeSchedule sched, long long pp, long long v, long long m, long long s,
	       PipeStep *out);

#endif

/* memory: replays a schedule's allocations and frees into per-place memory curves.
 * Owns the peak per place (GPU, CPU, NVMe), the breakdown by category at that peak, and an optional
 * timeline callback. It does not know why a buffer exists: the schedule says. */
#ifndef PX_SIM_MEMORY_H
#define PX_SIM_MEMORY_H

#include "../engine/schedule.h"

typedef struct MemPlace {
	double peak_bytes;
	double at_peak[N_CATS]; /* bytes per category when the place reached its peak */
	double cat_peak[N_CATS]; /* each category's own highest, whenever it came */
	int peak_op;            /* index of the op that reached it */
	int peak_iter;          /* the repeat block's iteration it came in (0 outside a block):
				   the first to reach it, as peaks are kept only when higher */
} MemPlace;

typedef struct MemResult {
	MemPlace place[N_PLACES];
	double end_bytes[N_PLACES]; /* live after the step: what persists between steps */
} MemResult;

/* Called after each op with the live bytes per place (iteration counts micro-batches from 0). */
typedef void (*MemTimelineFn)(void *ctx, int op_index, int iteration, const Op *op,
			      const double live[N_PLACES]);

/* Replay setup and one step. The micro-batch loop is replayed until its body leaves memory as it
 * found it (twice at most for a well-formed schedule). Fails on a malformed schedule (the walk's
 * checks, engine/schedule.h: a field out of range, blocks unpaired or nested, a buffer allocated
 * twice, freed or used while not live, an unbalanced loop), naming the op; on success the
 * schedule is marked valid (s->valid), so the traffic and time replays walk it unchecked.
 * A test hook: PARALLAX_TEST_MISPREDICT=NAME (a buf_name, e.g. optimizer_states) halves that
 * buffer's bytes in this replay only, so that a test can show a wrong prediction failing the
 * comparison with what the executor measures (tests/test_run.c). */
int sim_memory(Schedule *s, MemResult *out, MemTimelineFn fn, void *ctx, PxError *err);

#endif

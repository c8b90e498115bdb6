/* moment: names, in a user's words, when a place's memory peak came: the phase of the step
 * (forward, backward, recompute, optimizer step, ...), the unit (embedding, layer n, head), the
 * micro-batch, and the buffer whose allocation reached it. It reads the schedule and the
 * replay's peak (sim/memory.h); it does not price anything. */
#ifndef PX_SIM_MOMENT_H
#define PX_SIM_MOMENT_H

#include "../engine/plan.h"
#include "memory.h"

typedef enum {
	PHASE_SETUP,       /* before the first step: the runtime, parameters, optimizer states */
	PHASE_FORWARD,
	PHASE_RECOMPUTE,   /* a block's forward run again in backward (activation checkpointing) */
	PHASE_BACKWARD,
	PHASE_GRAD_REDUCE, /* after the last backward, reducing gradients before the update */
	PHASE_OPTIMIZER,   /* the optimizer step */
	PHASE_AFTER_STEP,  /* after the update: gathering the updated parameters */
	N_PHASES
} PeakPhase;

typedef struct PeakMoment {
	int op;            /* the schedule's op that reached the peak (an allocation) */
	PeakPhase phase;
	int unit;          /* the unit whose work it is, -1 for none (set-up, optimizer step) */
	int micro_batch;   /* from 1; 0 when outside the micro-batches (set-up, optimizer step) */
	int micro_batches; /* the step's micro-batches (gradient accumulation) */
	int repeats;       /* 1: every later micro-batch reaches the same peak (the loop's body
			      repeats it; the replay keeps the first) */
	int what;          /* BufWhat of the allocation */
} PeakMoment;

/* The moment of place pl's peak in schedule s (stage's plan p, replay result mem). */
void moment_find(const Plan *p, const Schedule *s, const MemResult *mem, Place pl,
		 PeakMoment *out);

const char *moment_phase_name(PeakPhase ph); /* "forward", "optimizer step", ... */
/* "embedding", "layer 3", "head"; buf gets the text (n bytes); "-" for none. */
const char *moment_unit_name(const Plan *p, int unit, char *buf, size_t n);
/* One line: "backward of layer 12, micro-batch 2 of 8 (each later one repeats it), allocating
 * activations". */
void moment_describe(const Plan *p, const PeakMoment *m, char *buf, size_t n);

#endif

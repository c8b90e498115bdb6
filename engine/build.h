/* build: turns a plan into one pipeline stage's schedule for one optimizer step: set-up
 * allocations, then the micro-batches (a repeat block without pipelining; otherwise the stage's
 * real order of forwards and backwards), with tensor-parallel collectives, MoE all-to-alls,
 * pipeline sends and receives, ZeRO gradient buckets and stage-3 gathers (ZeRO++ included), then
 * reduction, optimizer and parameter all-gather. The same schedule is priced by sim/ and run by
 * exec/: this file is the implementation's contract. */
#ifndef PX_BUILD_H
#define PX_BUILD_H

#include "plan.h"
#include "schedule.h"

/* The one-value fp32 all-reduces before the optimizer carry these as their unit. */
enum { BUILD_UNIT_OVERFLOW = -2, BUILD_UNIT_GRAD_NORM = -3 };

/* ZeRO++ quantizes in blocks of this many elements, each with an fp32 scale. */
#define ZPP_QUANT_BLOCK 2048

/* The schedule of every rank of pipeline stage `stage` (ranks of a stage run the same ops). */
int build_schedule(const Plan *p, int stage, Schedule *s, PxError *err);

#endif

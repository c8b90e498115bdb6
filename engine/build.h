/* build: turns a plan into one rank's schedule for one optimizer step of ZeRO stage 0-3 data
 * parallelism: set-up allocations, then micro-batches (forward, backward, gradient buckets,
 * stage-3 gathers with prefetch), reduction, optimizer and parameter all-gather.
 * The same schedule is priced by sim/ and run by exec/: this file is the implementation's contract. */
#ifndef PX_BUILD_H
#define PX_BUILD_H

#include "plan.h"
#include "schedule.h"

int build_schedule(const Plan *p, int rank, Schedule *s, PxError *err);

#endif

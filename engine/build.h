/* build: turns a plan into one pipeline stage's schedule for one optimizer step: set-up
 * allocations, then the micro-batches (a repeat block without pipelining; otherwise the stage's
 * real order of forwards and backwards), with tensor-parallel collectives, MoE all-to-alls,
 * pipeline sends and receives, ZeRO gradient buckets and stage-3 gathers (ZeRO++ included), then
 * reduction, optimizer and parameter all-gather. The same schedule is priced by sim/ and run by
 * exec/: this file is the implementation's contract. Its files: build.c and the others
 * build_priv.h names (gradients, FSDP, pipeline stages, the optimizer step). */
#ifndef PX_BUILD_H
#define PX_BUILD_H

#include "plan.h"
#include "schedule.h"

/* ZeRO++'s quantization groups, each with one fp32 scale (DeepSpeed, v0.16):
 * - qwZ (and hpZ's secondary gathers under it) quantizes the piece of elems each rank sends in
 *   build_qwz_groups(elems) equal groups: CUDAQuantizer.quantize in runtime/zero/
 *   partition_parameters.py starts from ceil(elems / 8000), takes the first count from there
 *   that 8 x count divides elems, then doubles it while 16 x count divides elems and the groups
 *   stay above 8000 elements. -1 where no count fits (elems not a multiple of 8: DeepSpeed
 *   fails an assertion).
 * - qgZ quantizes a 2-D gradient of r x c in max(r, c, world) groups (all_to_all_quant_reduce in
 *   runtime/comm/coalesced_collectives.py): a transformer's h x kh weights in groups of h
 *   elements, BUILD_QGZ_GROUP_ELEMS(p); the schedule takes each rank's slice of a reduction in
 *   groups of that size from its start (the last one shorter). */
#define BUILD_QWZ_TARGET_GROUP 8000
long long build_qwz_groups(long long elems);
#define BUILD_QGZ_GROUP_ELEMS(p) ((p)->sc->model.h)

/* How ZeRO 1-3 reduce a bucket of gradients over their data-parallel group: COLL_REDUCE_SCATTER
 * or COLL_ALL_REDUCE (DeepSpeed's rules: see build.c). */
CollKind build_zero_reduce_kind(const Plan *p);

/* The schedule of every rank of pipeline stage `stage` (ranks of a stage run the same ops). */
int build_schedule(const Plan *p, int stage, Schedule *s, PxError *err);

/* The most ops the schedules of one prediction may hold together (every stage's, which are held
 * at once): 8 million ops of 48 bytes, 366 MiB. A pipelined schedule unrolls its micro-batches,
 * so its size grows with them; the largest bundled scenario (MT-NLG 530B: pp 35, 240 micro-
 * batches) holds 414 thousand, the bundled sweeps' largest pipelined point 28 thousand. */
#define BUILD_MAX_OPS 8000000LL

/* The number of ops stage `stage`'s schedule has, found without building it whole (a schedule of
 * one micro-batch is built and the rest counted from it). */
int build_count_ops(const Plan *p, int stage, long long *n_ops, PxError *err);

/* A bound on the ops of stage `stage`'s schedule, found without building anything: each of the
 * (micro-batches + 2) passes (the micro-batches, the set-up and the optimizer step) adds at most
 * BUILD_OPS_PER_UNIT ops per unit of the stage, and the step a few hundred more (the parallel
 * suite checks the bound against built schedules of every pipeline order, recompute, tensor
 * and sequence parallelism and MoE). */
#define BUILD_OPS_PER_UNIT 64
long long build_ops_bound(const Plan *p, int stage);

/* Refuse (PX_ERR_INPUT), before any schedule is built, a plan whose schedules would hold more than
 * BUILD_MAX_OPS ops, naming the count, the limit and what to change. The count needs a small
 * schedule per stage; only a plan whose bound exceeds the limit is counted. */
int build_check_size(const Plan *p, PxError *err);

#endif

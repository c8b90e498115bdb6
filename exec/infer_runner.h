/* infer_runner: runs one rank's inference schedule (engine/infer_build.h) for real on the host:
 * it walks the schedule's ops, allocating each buffer the schedule names at its size through the
 * arena (the pool's memory, labelled with the op's place and category: what is measured), loading
 * and quantizing each unit's weights at its copy, running each unit's forward at its compute op
 * (prefill of the prompt, then the repeat block's decode steps, greedy) and matching each of the
 * schedule's collectives with the one the unit's forward issued on the tensor-parallel group. It
 * owns the GPT-2 executor's layouts for serving (kernels/infer_cpu.h computes) and the clocks of
 * time to first token and per output token. Storing and printing are cli/infer_run.c's. */
#ifndef PX_EXEC_INFER_RUNNER_H
#define PX_EXEC_INFER_RUNNER_H

#include <stdint.h>

#include "../engine/infer_scenario.h"
#include "../engine/schedule.h"
#include "arena.h"
#include "comm.h"

typedef struct InferRunner InferRunner;

/* Whether this executor runs sc (a GPT-2 of the cpu backend, weights fp32, bf16, fp16 or
 * DeepSpeed's int8 kernels with groups dividing every matrix of a rank, tensor parallelism
 * dividing the heads and the vocabulary): 0, or -1 with err (PX_ERR_INPUT) naming what not. */
int infer_runner_supported(const InferScenario *sc, PxError *err);

/* A runner for rank r of a tensor-parallel group tp (NULL with one rank) running s, built from
 * sc's plan; prompt (B, sp) tokens, copied; weights drawn from seed as the training executor
 * draws them (kernels/gpt_tp_cpu.h: the same values whatever the degree). 0, or -1 with err. */
int infer_runner_create(const InferScenario *sc, const Schedule *s, Comm *tp, const int *prompt,
			uint64_t seed, InferRunner **out, PxError *err);
void infer_runner_destroy(InferRunner *r); /* NULL is fine */

/* Walk the whole schedule once: set-up (weights, the reserved cache), prefill, the decode block.
 * 0, or -1 with err naming the op where it stopped. */
int infer_runner_run(InferRunner *r, PxError *err);

/* The generated tokens, (B, output_tokens): each sequence's, the first from prefill. */
const int *infer_runner_tokens(const InferRunner *r);
/* The logits, (B, V) fp32 in vocabulary order (gathered), of prefill's last position (last 0)
 * or of the last decode step (1): host copies, for checking against another forward. */
const float *infer_runner_logits(const InferRunner *r, int last);
const Arena *infer_runner_arena(const InferRunner *r);

/* Wall-clock seconds: prefill to its first token (time to first token), and the decode steps
 * together (each one more token of every sequence). */
typedef struct InferTimes {
	double ttft_s, decode_s;
	long decode_steps;
} InferTimes;
InferTimes infer_runner_times(const InferRunner *r);

/* The prompt of B sequences of sp tokens below V the runs use, drawn from seed (caller-owned
 * out, B x sp). */
void infer_runner_prompt(int *out, int B, int sp, int V, uint64_t seed);

#endif

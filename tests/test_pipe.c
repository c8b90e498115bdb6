/* Pipeline parallelism executed through `parallax run`: every rank runs its own stage's schedule
 * (GPipe and 1F1B over 2 and 4 stages, Megatron's interleaved 1F1B over 2, with data parallelism
 * beside), the losses are a single
 * rank's, and each rank's measured memory per category and communication equal the prediction
 * for its stage. Runs the release binary (PX_RUN_BIN), as the exec suite does. */
#include <CUnit/CUnit.h>
#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "run_checks.h"
#include "suites.h"

static char dir[256];

/* The executor suites' GPT-2 (suites.h) with 4 layers, so that 4 stages hold one each; bf16:
 * "true" or "false". */
static const char *scenario(const char *bf16)
{
	static char path[512];
	char text[2048];
	snprintf(dir, sizeof(dir), "%s", px_test_tmpdir());
	snprintf(path, sizeof(path), "%s/pipe-%s.json", dir, bf16);
	snprintf(text, sizeof(text), PX_TEST_GPT_SCENARIO, "pipe-test", bf16, 0);
	px_test_write_file(path, text);
	return path;
}

#define LAYERS "--set model.n_layer=4"
/* Megatron's interleaved 1F1B with two model chunks a stage: four chunks of one layer on pp 2 */
#define INTERLEAVED "--set parallelism.pipeline_schedule=interleaved --set parallelism.virtual_stages=2"

/* ZeRO-Offload's optimizer on the host: each stage's ranks step their partition there, as
 * without a pipeline (DeepSpeed's pipeline engine takes ZeRO-1 and its offload) */
#define OFFLOAD "--set deepspeed.zero_optimization.offload_optimizer.device=cpu"

/* `run SCN --no-db --json` with 4 layers, for px_run_losses (static buffer). */
static const char *run_base(const char *bf16)
{
	static char base[1024];
	snprintf(base, sizeof(base), "run '%s' --no-db --json " LAYERS, scenario(bf16));
	return base;
}

/* fp32: a pipeline runs the single rank's operations in the single rank's order on each
 * micro-batch (the same tokens, loaded by micro-batch index; the activations cross a stage
 * boundary unrounded), with three reassociations: the tied embedding's gradient is summed per
 * stage over the micro-batches and then across the two stages (a single rank adds head and
 * embedding contributions in turn), the squared gradient norm is summed per stage in double and
 * then across stages in fp32, and with dp 2 the gradient sums over ranks run in MPI's order.
 * Each moves a sum by a few 2^-24 relatively; AdamW's normalised update turns that into weight
 * changes of about lr x 1e-7, which move a loss near 4.8 by far less than fp32's own spacing
 * there (4.8 x 2^-23, 6e-7 relative). Over 8 steps the losses stay within 1e-6 relative
 * (measured: equal bit for bit with pp alone, 1e-7 with dp 2). The clipping that the norm
 * feeds matters: the same pipeline without it leaves the reference by more than the bound, so a
 * stage clipping by its own layers' norm alone would fail. With the optimizer offloaded each
 * stage's partition steps on the host with the same fp32 update: the same bound. */
static void test_pipe_losses_fp32(void)
{
	static const PxRunCase runs[] = {
		{2, "--set parallelism.pp=2"},
		{2, "--set parallelism.pp=2 --set parallelism.pipeline_schedule=gpipe"},
		{4, "--set parallelism.pp=4"},
		{4, "--set parallelism.pp=4 --set parallelism.pipeline_schedule=gpipe"},
		{4, "--set parallelism.pp=2 --set deepspeed.zero_optimization.stage=1"},
		{4, "--set parallelism.pp=2 --set parallelism.rank_order=tp-dp-pp"},
		{2, "--set parallelism.pp=2 " INTERLEAVED},
		{4, "--set parallelism.pp=2 --set deepspeed.zero_optimization.stage=1 " INTERLEAVED},
		{4, "--set parallelism.pp=2 --set deepspeed.zero_optimization.stage=1 " OFFLOAD},
	};
	const char *base = run_base("false");
	double ref[PX_LOSS_STEPS], got[PX_LOSS_STEPS];
	px_check_losses(base, runs, (int)(sizeof(runs) / sizeof(runs[0])), 1e-6, 0, ref);
	CU_ASSERT_EQUAL_FATAL(px_run_losses(base, 2, PX_LOSS_STEPS, "--set parallelism.pp=2 --set "
					    "deepspeed.gradient_clipping=0", got), PX_LOSS_STEPS);
	CU_ASSERT(px_worst_rel(ref, got, PX_LOSS_STEPS) > 1e-5);
}

/* Interleaved with as many micro-batches as stages (m = pp = 2, v = 2): every forward of stage 0
 * is a warm-up one, and Megatron's last warm-up batch then receives no gradient (the next stage's
 * first backward needs this stage's last forward first); posted there, as it once was, stage 0
 * waited for a gradient stage 1 could not send (the replay said the stages wait forever). The
 * losses equal a single rank's at the same batch, bit for bit as the other fp32 pipelines. */
static void test_pipe_interleaved_all_warmup(void)
{
	enum { STEPS = 3 };
	const char *base = run_base("false");
	const char *batch = "--set deepspeed.train_batch_size=4";
	char extra[512];
	double ref[STEPS], got[STEPS];
	CU_ASSERT_EQUAL_FATAL(px_run_losses(base, 1, STEPS, batch, ref), STEPS);
	snprintf(extra, sizeof(extra), "%s --set parallelism.pp=2 " INTERLEAVED, batch);
	CU_ASSERT_EQUAL_FATAL(px_run_losses(base, 2, STEPS, extra, got), STEPS);
	CU_ASSERT(px_worst_rel(ref, got, STEPS) <= 1e-6);
}

/* bf16: the activations cross a boundary in bf16, as a single rank holds them, but the gradient
 * that comes back is rounded to bf16 for the wire (DeepSpeed sends it in the activations' type)
 * where a single rank keeps it in fp32: a rounding of u = 2^-8 relative on each boundary's
 * gradient per micro-batch, of the kind and size of bf16's reordering; the exec suite's bf16
 * bound holds (5e-3 nats; measured 8e-4 over 8 steps). */
static void test_pipe_losses_bf16(void)
{
	enum { STEPS = 8 };
	const char *base = run_base("true");
	double ref[STEPS], got[STEPS], worst = 0;
	CU_ASSERT_EQUAL_FATAL(px_run_losses(base, 1, STEPS, "", ref), STEPS);
	CU_ASSERT_EQUAL_FATAL(px_run_losses(base, 2, STEPS, "--set parallelism.pp=2", got), STEPS);
	for (int s = 0; s < STEPS; s++)
		worst = fmax(worst, fabs(got[s] - ref[s]));
	if (worst > 5e-3)
		fprintf(stderr, "\nbf16 pp 2: losses differ by %g\n", worst);
	CU_ASSERT(worst <= 5e-3);
	CU_ASSERT_EQUAL(got[0], ref[0]); /* the first forward is the single rank's exactly */
}

/* Each rank's memory per category at its arena's peak and its communication per collective,
 * against the prediction for its own stage: equal. The traffic by hand (B 2, T 32, C 64: a
 * boundary tensor is bsh = 4096 elements, 16 KiB in fp32): with m micro-batches a stage with a
 * next stage sends m activations, one with a previous stage m gradients, and receives as many;
 * the first and last stage all-reduce the tied embedding's gradient (V C = 8192 fp32, 32 KiB),
 * and every stage the squared norm (4 bytes) over the stages, and over dp at ZeRO-1. The peaks
 * are the pool's (px_check_pool_peaks). */
static void test_pipe_measured_equals_predicted(void)
{
	static const struct {
		int ranks, pp, dp, zero, v;
		const char *set;
	} runs[] = {
		{2, 2, 1, 0, 1, "--set parallelism.pp=2"},
		{4, 2, 2, 1, 1, "--set parallelism.pp=2 --set deepspeed.zero_optimization.stage=1"},
		{4, 4, 1, 0, 1, "--set parallelism.pp=4 --set parallelism.pipeline_schedule=gpipe"},
		{2, 2, 1, 0, 2, "--set parallelism.pp=2 " INTERLEAVED},
		{4, 2, 2, 1, 1, "--set parallelism.pp=2 --set deepspeed.zero_optimization.stage=1 "
				OFFLOAD},
		{4, 2, 2, 1, 2, "--set parallelism.pp=2 --set deepspeed.zero_optimization.stage=1 "
				OFFLOAD " " INTERLEAVED},
	};
	const char *scn = scenario("false");
	for (size_t k = 0; k < sizeof(runs) / sizeof(runs[0]); k++) {
		char args[2048];
		snprintf(args, sizeof(args), "run '%s' --ranks %d --steps 2 " LAYERS " %s", scn,
			 runs[k].ranks, runs[k].set);
		sqlite3 *db = px_run_measured(args, runs[k].ranks);
		long long m = 16 / (2 * runs[k].dp), bsh = 2 * 32 * 64;
		for (int r = 0; r < runs[k].ranks; r++) {
			int stage = r % runs[k].pp; /* tp-pp-dp: a pipeline's stages are consecutive */
			int ends = stage == 0 || stage == runs[k].pp - 1;
			/* each of the stage's v chunks sends its activations unless it is the
			 * model's last, its gradients unless it is the first (interleaved: the
			 * first stage holds the first chunk, the last stage the last) */
			double sends = m * (2 * runs[k].v - (stage == 0) - (stage == runs[k].pp - 1));
			double reduce = (ends ? 128 * 64 * 4 : 0) + 4 + (runs[k].dp > 1 ? 4 : 0);
			CU_ASSERT_EQUAL(px_run_metric(db, "comm.p2p_bytes", "measured", r), sends * bsh * 4);
			CU_ASSERT_EQUAL(px_run_metric(db, "comm.p2p_recv_bytes", "measured", r), sends * bsh * 4);
			CU_ASSERT_EQUAL(px_run_metric(db, "comm.all_reduce_bytes", "measured", r), reduce);
			/* the wire: the norm's one float over 4 stages rings as 1, 2, 2, 1 floats
			 * sent on stages 0-3 where the formula's 2(n-1)/n gives 1.5 (comm_mpi_check
			 * --bytes); every other all-reduce here divides among its group */
			double wire = px_run_metric(db, "comm.wire_bytes", "measured", r) -
				      px_run_metric(db, "comm.wire_bytes", "predicted", r);
			double off = runs[k].pp == 4 ? (ends ? -2 : 2) : 0;
			if (wire != off)
				fprintf(stderr, "\nrun %zu rank %d: wire bytes measured - predicted %g, "
					"by hand %g\n", k, r, wire, off);
			CU_ASSERT_EQUAL(wire, off);
			/* the stage's own layers: the first stage's parameters include the
			 * embeddings, more than a middle stage's one block */
			if (stage == 0 && runs[k].pp == 4)
				CU_ASSERT(px_run_metric(db, "memory.gpu.params_bytes", "measured", r) >
					  px_run_metric(db, "memory.gpu.params_bytes", "measured", r + 1));
			/* offloaded, the stage's optimizer partition is on the host and not on
			 * the device: ZeRO-1's fp32 clone of the partition (stage_1_and_2.py
			 * single_partition_of_fp32_groups, kept in fp32 training too) and the
			 * fp32 moments, 12 bytes an element of half the stage's parameters (dp 2),
			 * the device's parameters being 4: 1.5 times those */
			if (strstr(runs[k].set, "offload")) {
				double dev = px_run_metric(db, "memory.gpu.optimizer_bytes", "measured", r);
				double host = px_run_metric(db, "memory.cpu.optimizer_bytes", "measured", r);
				double params = px_run_metric(db, "memory.gpu.params_bytes", "measured", r);
				CU_ASSERT_EQUAL(dev, 0);
				CU_ASSERT_EQUAL(host, 1.5 * params);
			}
		}
		sqlite3_close(db);
	}
}

/* What the executor does not run with pipelining is refused before anything starts, naming it,
 * with exit status 2: NVMe offload and ZeRO-2 (the simulator's own refusals), experts beside
 * tensor parallelism with sequence parallelism (pipelined MoE runs, with tensor parallelism
 * too: the moe suite). */
static void test_pipe_refuses(void)
{
	static const struct { int ranks; const char *set, *says; } runs[] = {
		{2, "--set parallelism.pp=2 --set deepspeed.zero_optimization.stage=1 --set "
		    "deepspeed.zero_optimization.offload_optimizer.device=nvme",
		 "NVMe offload (ZeRO-Infinity) needs ZeRO stage 3"},
		{2, "--set parallelism.pp=2 --set deepspeed.zero_optimization.stage=2",
		 "with pipeline parallelism"},
		{8, "--set parallelism.pp=2 --set parallelism.tp=2 --set moe.num_experts=4 --set "
		    "moe.use_rts=false --set parallelism.ep=2 --set parallelism.sequence_parallel=true",
		 "parallelism.sequence_parallel with DeepSpeed's MoE layer"},
	};
	const char *scn = scenario("false");
	for (size_t k = 0; k < sizeof(runs) / sizeof(runs[0]); k++) {
		char args[2048], text[8192];
		snprintf(args, sizeof(args), "run '%s' --no-db --ranks %d " LAYERS " %s", scn,
			 runs[k].ranks, runs[k].set);
		CU_ASSERT_EQUAL(px_test_run_release(args, 60, text, sizeof(text)), 2);
		PX_ASSERT_HAS(text, runs[k].says);
		CU_ASSERT_PTR_NULL(strstr(text, "step    1"));
	}
}

int test_pipe_register(void)
{
	return PX_ADD_SUITE("pipe", {"fp32 losses of pp 2 and 4, GPipe, 1F1B and interleaved, with dp 2",
				     test_pipe_losses_fp32, PX_RELEASE_RUN},
			    {"bf16 losses of pp 2", test_pipe_losses_bf16, PX_RELEASE_RUN},
			    {"interleaved, every forward a warm-up one", test_pipe_interleaved_all_warmup,
			     PX_RELEASE_RUN},
			    {"measured equals predicted, traffic by hand",
			     test_pipe_measured_equals_predicted, PX_RELEASE_RUN},
			    {"run refuses what it does not pipeline", test_pipe_refuses, PX_RELEASE_RUN});
}

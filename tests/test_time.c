/* Time model (issue 4): pipeline bubbles emerging from the replay, overlap hiding a reduction,
 * the collective, compute and copy formulas, repeat-block and 1F1B steady-state extrapolation
 * against the full replay, 1,000-GPU scenarios, and the hardware profiles: bundled files against
 * the built-in defaults, and bad input; held-out published runs, predicted against published.
 * Expected values are derived by hand in each test's comment; the profiles' figures are cited in
 * scenarios/hardware/ and docs/time_model.md, the published runs in their scenarios' "_source". */
#include <CUnit/CUnit.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/clock.h"
#include "../sim/timeline.h"
#include "fixtures.h"
#include "suites.h"

int test_time_register(void);

#define REL_EQ(a, b) CU_ASSERT_DOUBLE_EQUAL((a), (b), 1e-9 * fabs(b) + 1e-15)

/* A GPT-2-style model small enough to build in microseconds: h = 256, 8 heads, 8 layers. */
#define SMALL_GPT                                                                              \
	"\"model\": {\"model_type\": \"gpt2\", \"n_embd\": 256, \"n_head\": 8, \"n_layer\": 8,"  \
	" \"n_positions\": 512, \"vocab_size\": 1024}"

/* A profile on which only compute costs time, at half the peak whatever the size: no latency,
 * infinite link and host bandwidth, no elementwise traffic, no host time to issue kernels. */
static void compute_only_profile(HwProfile *hw)
{
	const HwCurve flat = {1, {1}, {0.5}}, endless = {1, {1}, {INFINITY}};
	CU_ASSERT_EQUAL(hwprofile_default(cluster_find_gpu("A100-80GB"), hw), 0);
	hw->gemm = flat;
	hw->sustained = 1;
	hw->elementwise_fwd = hw->elementwise_bwd = hw->scores_fwd = hw->scores_bwd = 0;
	hw->nvlink.alpha_s = hw->network.alpha_s = 0;
	hw->nvlink.base_s = hw->network.base_s = 0;
	hw->kernel_issue_s = 0;
	hw->nvlink.efficiency = hw->network.efficiency = endless;
	hw->pcie_efficiency = hw->nvme_efficiency = INFINITY;
}

/* The predicted schedules as the array timeline_run takes. */
static int run_prediction(const Prediction *pr, const HwProfile *hw, int full, TimeResult *r)
{
	Schedule *stages[64];
	PxError err = {0};
	TimelineOpts o = {full};
	CU_ASSERT_FATAL(pr->n_stages <= 64);
	for (int s = 0; s < pr->n_stages; s++)
		stages[s] = (Schedule *)&pr->stages[s].sched;
	int rc = timeline_run_opts(&pr->plan, stages, hw, &o, r, &err);
	if (rc)
		fprintf(stderr, "\ntimeline: %s\n", err.msg);
	CU_ASSERT_EQUAL(rc, 0);
	return rc;
}

static double breakdown_sum(const TimeBreakdown *b)
{
	double sum = b->compute_s + b->bubble_s + b->offload_stall_s;
	for (int g = 0; g < N_GROUPS; g++)
		sum += b->comm_s[g];
	return sum;
}

/* ---- pipeline bubbles ---- */

/* Stage s of a pipeline of pp stages, v chunks each, in `kind`'s order (engine/pipeline.c): each
 * chunk's forward is one op of F FLOPs, its backward one of 2F, with build_pipe.c's receive before
 * and send after (none at the model's two ends). */
static void build_pipe(Schedule *s, PipeSchedule kind, int pp, int v, int m, int stage, double F)
{
	PipeStep order[512];
	int n = pipe_order(kind, pp, v, m, stage, order);
	sched_init(s, stage);
	for (int k = 0; k < n; k++) {
		int j = order[k].chunk * pp + stage, first = j == 0, last = j == pp * v - 1;
		int recv = order[k].forward ? !first : !last, send = order[k].forward ? !last : !first;
		OpRole role = order[k].forward ? ROLE_FORWARD : ROLE_BACKWARD;
		if (recv)
			sched_coll(s, COLL_P2P_RECV, role, GROUP_PP, pp, -1, 1 << 20, 2, -1, 0);
		sched_compute(s, order[k].forward ? COMP_FWD : COMP_BWD, -1,
			      order[k].forward ? F : 2 * F, 0);
		if (send)
			sched_coll(s, COLL_P2P, role, GROUP_PP, pp, -1, 1 << 20, 2, -1, 0);
	}
}

/* Replay hand-built pipeline schedules on the compute-only profile, or with NVLink at alpha
 * 1 us and `nvlink_eff` of its peak when that is finite; returns the step. */
static double replay_pipe(PipeSchedule kind, int pp, int v, int m, double F, double nvlink_eff,
			  TimeResult *r)
{
	Scenario sc;
	Prediction pr;
	Schedule sched[8], *stages[8];
	HwProfile hw;
	PxError err = {0};
	double step = -1;

	/* a plan with pp stages (its own schedules are replaced by the hand-built ones) */
	if (fx_predictf(&sc, &pr,
			 "{" SMALL_GPT ", \"deepspeed\": {\"train_micro_batch_size_per_gpu\": 1,"
			 " \"gradient_accumulation_steps\": %d, \"bf16\": {\"enabled\": true}},"
			 " \"cluster\": {\"gpu\": \"A100-80GB\", \"nodes\": 1, \"gpus_per_node\": %d},"
			 " \"seq_length\": 512, \"parallelism\": {\"pp\": %d,"
			 " \"partition_method\": \"uniform\"}}", m, pp, pp))
		return -1;
	compute_only_profile(&hw);
	if (isfinite(nvlink_eff)) {
		hw.nvlink.alpha_s = 1e-6;
		hw.nvlink.efficiency = (HwCurve){1, {1}, {nvlink_eff}};
	}
	for (int s = 0; s < pp; s++) {
		build_pipe(&sched[s], kind, pp, v, m, s, F);
		stages[s] = &sched[s];
	}
	if (timeline_run(&pr.plan, stages, &hw, r, &err) == 0)
		step = r->step_s;
	else
		fprintf(stderr, "\ntimeline: %s\n", err.msg);
	for (int s = 0; s < pp; s++)
		sched_free(&sched[s]);
	fx_free(&sc, &pr);
	return step;
}

/* Equal stages, t_f per forward and t_b = 2 t_f per backward (F FLOPs at half of 312 TFLOP/s),
 * communication free. GPipe runs m forwards, whose last leaves the last stage after
 * (m + p - 1) t_f, then the backwards in reverse, (m + p - 1) t_b more; 1F1B keeps the same
 * critical path (the first forward down, m forward-backward pairs on the last stage, the last
 * backward up): both take (m + p - 1)(t_f + t_b). The first stage computes m (t_f + t_b) of it
 * and waits on receives for the rest, (p - 1)(t_f + t_b): the bubble fraction (p-1)/(m+p-1)
 * (Narayanan et al. 2021 §2.2; shared/reference/activations.md). */
static void test_pipeline_bubble(void)
{
	const double F = 1.56e11, tf = F / (312e12 * 0.5), tb = 2 * tf;
	static const struct { PipeSchedule kind; int pp, m; } cases[] = {
		{PIPE_1F1B, 2, 8}, {PIPE_1F1B, 4, 8}, {PIPE_1F1B, 4, 1}, {PIPE_GPIPE, 2, 8},
		{PIPE_GPIPE, 4, 6},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		int pp = cases[i].pp, m = cases[i].m;
		TimeResult r;
		double step = replay_pipe(cases[i].kind, pp, 1, m, F, INFINITY, &r);
		if (step < 0)
			continue;
		REL_EQ(step, (m + pp - 1) * (tf + tb));
		CU_ASSERT_EQUAL(r.slowest, 0);
		REL_EQ(r.stages[0].bd.bubble_s, (pp - 1) * (tf + tb));
		REL_EQ(r.stages[0].bd.bubble_s / step, (pp - 1.0) / (m + pp - 1.0));
		REL_EQ(r.stages[0].bd.compute_s, m * (tf + tb));
		for (int s = 0; s < pp; s++)
			REL_EQ(breakdown_sum(&r.stages[s].bd), r.stages[s].end_s);
		timeline_result_free(&r);
	}
}

/* Megatron's interleaved schedule with v chunks per stage, each chunk taking t_f / v forward and
 * t_b / v backward: the bubble shrinks to (p - 1)(t_f + t_b) / v (Narayanan et al. 2021 §2.2.2),
 * so the step is m (t_f + t_b) + (p - 1)(t_f + t_b) / v. Here p = 2, v = 2, m = 4 and 8, and
 * p = 4, v = 2, m = 8. */
static void test_interleaved_bubble(void)
{
	const double F = 1.56e11, tfc = F / (312e12 * 0.5);
	static const struct { int pp, v, m; } cases[] = {{2, 2, 4}, {2, 2, 8}, {4, 2, 8}};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		int pp = cases[i].pp, v = cases[i].v, m = cases[i].m;
		double tf = v * tfc, tb = 2 * tf;
		TimeResult r;
		double step = replay_pipe(PIPE_INTERLEAVED, pp, v, m, F, INFINITY, &r);
		if (step < 0)
			continue;
		REL_EQ(step, m * (tf + tb) + (pp - 1) * (tf + tb) / v);
		timeline_result_free(&r);
	}
}

/* Two stages on one node, one micro-batch, each send taking d = 1 us + S / (300 GB/s x 0.5)
 * (S = 2 MiB). Stage 0: forward [0, t_f], send until t_f + d, then waits for the gradient,
 * which stage 1 sends at 2 t_f + t_b + d and which arrives at 2 t_f + t_b + 2d; backward; end
 * 2(t_f + t_b) + 2d. Of stage 0's wait (t_f + t_b + d) the last d is the transfer (pp), the rest
 * bubble; with its own send, pp = 2d. Stage 1 waits t_f + d for the activations (bubble t_f, pp
 * d), and sends d: it ends at 2 t_f + t_b + 2d. */
static void test_pipeline_transfer(void)
{
	const double F = 1.56e11, tf = F / (312e12 * 0.5), tb = 2 * tf;
	const double d = 1e-6 + 2.0 * (1 << 20) / (300e9 * 0.5);
	TimeResult r;
	if (replay_pipe(PIPE_1F1B, 2, 1, 1, F, 0.5, &r) < 0)
		return;
	REL_EQ(r.step_s, 2 * (tf + tb) + 2 * d);
	REL_EQ(r.stages[0].bd.comm_s[GROUP_PP], 2 * d);
	REL_EQ(r.stages[0].bd.bubble_s, tf + tb);
	REL_EQ(r.stages[1].bd.comm_s[GROUP_PP], 2 * d);
	REL_EQ(r.stages[1].bd.bubble_s, tf);
	REL_EQ(r.stages[1].end_s, 2 * tf + tb + 2 * d);
	timeline_result_free(&r);
}

/* ---- overlap_comm ---- */

/* A backward of t_b, a reduce-scatter of t_c, another backward of t_b, the optimizer (no
 * FLOPs, no bytes: 0 s). With overlap_comm the reduce-scatter runs on its own stream from the
 * end of the first backward: when t_c <= t_b it ends before the second backward does and adds
 * nothing (step 2 t_b, dp exposed 0); when t_c > t_b the optimizer waits for it: step
 * t_b + t_c, exposed t_c - t_b. Without overlap it blocks the compute stream: 2 t_b + t_c. */
static void overlap_case(Scenario *sc, Prediction *pr, double tb_over_tc, int overlap)
{
	HwProfile hw;
	PxError err = {0};
	TimeResult r;
	Schedule s, *stages[1] = {&s};

	/* the A100's links, compute at half the peak whatever the size */
	CU_ASSERT_EQUAL(hwprofile_default(cluster_find_gpu("A100-80GB"), &hw), 0);
	hw.gemm = (HwCurve){1, {1}, {0.5}};
	hw.sustained = 1;
	sched_init(&s, 0);
	sched_coll(&s, COLL_REDUCE_SCATTER, ROLE_GRAD_REDUCE, GROUP_DP, 8, -1, 1 << 26, 2, -1, 0);
	double tc = opcost_coll_s(&pr->plan, &hw, &s.ops[0], 0, 0);
	double tb = tb_over_tc * tc, F2 = tb * 312e12 * 0.5;
	sched_free(&s);
	sched_init(&s, 0);
	sched_compute(&s, COMP_BWD, -1, F2, 0);
	sched_coll(&s, COLL_REDUCE_SCATTER, ROLE_GRAD_REDUCE, GROUP_DP, 8, -1, 1 << 26, 2, -1, 0);
	sched_compute(&s, COMP_BWD, -1, F2, 0);
	sched_compute(&s, COMP_OPTIMIZER, -1, 0, 0);

	sc->ds.zero.overlap_comm = overlap; /* and as it takes effect (a ZeRO-2 optimizer here) */
	pr->plan.overlap_comm = overlap;
	CU_ASSERT_EQUAL_FATAL(timeline_run(&pr->plan, stages, &hw, &r, &err), 0);
	double step = !overlap ? 2 * tb + tc : tc <= tb ? 2 * tb : tb + tc;
	REL_EQ(r.step_s, step);
	CU_ASSERT_DOUBLE_EQUAL(r.breakdown.comm_s[GROUP_DP], step - 2 * tb, 1e-9 * step);
	timeline_result_free(&r);
	sched_free(&s);
}

static void test_overlap_comm(void)
{
	Scenario sc;
	Prediction pr;
	if (fx_predictf(&sc, &pr,
			 "{" SMALL_GPT ", \"deepspeed\": {\"train_micro_batch_size_per_gpu\": 1,"
			 " \"bf16\": {\"enabled\": true}, \"zero_optimization\": {\"stage\": 2,"
			 " \"reduce_bucket_size\": 1e5}}, \"cluster\": {\"gpu\": \"A100-80GB\","
			 " \"nodes\": 1, \"gpus_per_node\": 8}, \"seq_length\": 512}"))
		return;
	overlap_case(&sc, &pr, 3, 1);   /* hidden: no time added */
	overlap_case(&sc, &pr, 3, 0);   /* blocking: its whole duration */
	overlap_case(&sc, &pr, 0.5, 1); /* longer than the backward left: the excess */
	overlap_case(&sc, &pr, 0.5, 0);

	/* the real ZeRO-2 schedule, one bucket per layer (1e5 elements): overlapping hides part of
	 * the reductions, and the step shortens by exactly what stops being exposed */
	HwProfile hw;
	TimeResult on, off;
	hwprofile_default(&sc.cluster.gpu, &hw);
	sc.ds.zero.overlap_comm = pr.plan.overlap_comm = 1;
	if (run_prediction(&pr, &hw, 0, &on) == 0) {
		sc.ds.zero.overlap_comm = pr.plan.overlap_comm = 0;
		if (run_prediction(&pr, &hw, 0, &off) == 0) {
			CU_ASSERT(on.breakdown.comm_s[GROUP_DP] < off.breakdown.comm_s[GROUP_DP]);
			CU_ASSERT(on.step_s < off.step_s);
			REL_EQ(off.step_s - on.step_s, off.breakdown.comm_s[GROUP_DP] -
							   on.breakdown.comm_s[GROUP_DP]);
			timeline_result_free(&off);
		}
		timeline_result_free(&on);
	}
	fx_free(&sc, &pr);
}

/* Plain PyTorch's DistributedDataParallel all-reduces each bucket on its own stream as soon as
 * the backward has made its last gradient (Li et al., "PyTorch Distributed", VLDB 2020: the
 * overlap is its point); DeepSpeed's engine without ZeRO after the backward, blocking. Llama-2 7B
 * in fp16 on 4 x 8 H100: each step is the one-GPU step (the same compute) plus its exposed
 * data-parallel communication, to the rounding; DDP's last bucket (the embeddings, made by the
 * backward's last unit) cannot hide, so its all-reduce is exposed in full, and DDP exposes less
 * than the engine, which exposes every bucket. */
static void test_ddp_overlap(void)
{
	const char *fmt = "{\"model\": \"%s\", \"framework\": \"%s\", \"deepspeed\": "
			  "{\"train_micro_batch_size_per_gpu\": 1, \"fp16\": {\"enabled\": true}, "
			  "\"zero_optimization\": {\"stage\": 0}}, \"cluster\": {\"gpu\": \"H100-SXM\", "
			  "\"nodes\": %d, \"gpus_per_node\": %d}, \"seq_length\": 2048, "
			  "\"activation_checkpointing\": \"full\"}";
	const char *model = px_test_path("scenarios/models/llama-2-7b.json");
	static const struct { const char *fw; int nodes, gpus; } c[] = {
		{"deepspeed", 1, 1}, {"deepspeed", 4, 8}, {"pytorch", 4, 8}};
	double step[3] = {0}, exposed[3] = {0}, last = 0;
	for (int i = 0; i < 3; i++) {
		Scenario sc;
		Prediction pr;
		HwProfile hw;
		TimeResult r;
		if (fx_predictf(&sc, &pr, fmt, model, c[i].fw, c[i].nodes, c[i].gpus))
			return;
		hwprofile_default(&sc.cluster.gpu, &hw);
		if (run_prediction(&pr, &hw, 0, &r) == 0) {
			step[i] = r.step_s;
			exposed[i] = r.breakdown.comm_s[GROUP_DP];
			timeline_result_free(&r);
		}
		const Schedule *s = &pr.stages[0].sched;
		for (int k = 0; i == 2 && k < s->n; k++)
			if (s->ops[k].kind == OP_COLL && s->ops[k].role == ROLE_GRAD_REDUCE)
				last = opcost_coll_s(&pr.plan, &hw, &s->ops[k], 0, 0);
		fx_free(&sc, &pr);
	}
	CU_ASSERT_DOUBLE_EQUAL(exposed[0], 0, 0);
	for (int i = 1; i < 3; i++)
		REL_EQ(step[i], step[0] + exposed[i]);
	CU_ASSERT(last > 0 && exposed[2] >= last * (1 - 1e-9));
	CU_ASSERT(exposed[2] < exposed[1]);
}

/* ---- single-op formulas ---- */

/* Ring collectives of S bytes over n ranks (docs/time_model.md):
 *   all-reduce  t = base + 2(n-1) alpha + 2(n-1)/n S / B
 *   all-gather  t = base +  (n-1) alpha +  (n-1)/n S / B
 * with B = the link's one-direction peak x efficiency(S) (x allreduce_scale for an all-reduce
 * inside one NVLink domain). In one node: NCCL's LL latencies, base 6.6 us and alpha 0.6 us a
 * step (src/graph/tuning.cc). A100: B = 300 GB/s x 0.70 from 256 MiB up; at 4 MiB the
 * efficiency is halfway in log(S) between 0.35 (1 MiB) and 0.56 (16 MiB): 0.455. H100: B =
 * 450 GB/s x 0.822 x 1.297 for the all-reduce (NVLink SHARP). Across two nodes (n = 16, 8 per
 * node) the ring's 2(n-1)/n S leaves the node on 2 of its 16 links: inter = wire x 2/16 at
 * 25 GB/s x 0.92 per GPU, intra = wire x 14/16 at 210 GB/s; the slower, the network, sets the
 * time, and every step costs the network's alpha = 5 us, after the base 6.6 us.
 * Latency-bound: 8 bytes all-reduced over the 8 GPUs of a node take 6.6 + 14 x 0.6 = 15 us, the
 * 8 ns of transfer aside (NCCL's own model gives the same for its ring LL protocol); over two
 * nodes 6.6 + 30 x 5 = 156.6 us. */
static void check_coll(const char *gpu, int nodes, CollKind kind, double S, double expected)
{
	Scenario sc;
	Prediction pr;
	HwProfile hw;
	Schedule s;
	int n = 8 * nodes;
	if (fx_predictf(&sc, &pr,
			 "{" SMALL_GPT ", \"deepspeed\": {\"train_micro_batch_size_per_gpu\": 1,"
			 " \"bf16\": {\"enabled\": true}}, \"cluster\": {\"gpu\": \"%s\", \"nodes\": %d,"
			 " \"gpus_per_node\": 8}, \"seq_length\": 512}", gpu, nodes))
		return;
	hwprofile_default(&sc.cluster.gpu, &hw);
	sched_init(&s, 0);
	sched_coll(&s, kind, ROLE_GRAD_REDUCE, GROUP_DP, n, -1, (int64_t)(S / 2), 2, -1, 0);
	REL_EQ(opcost_coll_s(&pr.plan, &hw, &s.ops[0], 0, 1), expected);
	sched_free(&s);
	fx_free(&sc, &pr);
}

static void test_ring_collectives(void)
{
	const double GiB = 1073741824.0, MiB = 1048576.0;
	const double lat8 = 6.6e-6 + 14 * 0.6e-6, lat8_ag = 6.6e-6 + 7 * 0.6e-6;
	check_coll("A100-80GB", 1, COLL_ALL_REDUCE, GiB, lat8 + 2 * 7.0 / 8 * GiB / (300e9 * 0.7));
	check_coll("A100-80GB", 1, COLL_ALL_GATHER, GiB, lat8_ag + 7.0 / 8 * GiB / (300e9 * 0.7));
	check_coll("A100-80GB", 1, COLL_REDUCE_SCATTER, 4 * MiB,
		   lat8_ag + 7.0 / 8 * 4 * MiB / (300e9 * 0.455));
	check_coll("H100-SXM", 1, COLL_ALL_REDUCE, GiB,
		   lat8 + 2 * 7.0 / 8 * GiB / (450e9 * 0.822 * 1.297));
	double wire = 2 * 15.0 / 16 * GiB;
	check_coll("A100-80GB", 2, COLL_ALL_REDUCE, GiB,
		   6.6e-6 + 30 * 5e-6 +
			   fmax(wire * 14 / 16 / (300e9 * 0.7), wire * 2 / 16 / (25e9 * 0.92)));
	/* latency-bound: 8 bytes (the curve flat below 1 MiB at 0.35 of the A100's NVLink) */
	check_coll("A100-80GB", 1, COLL_ALL_REDUCE, 8, 15e-6 + 2 * 7.0 / 8 * 8 / (300e9 * 0.35));
	check_coll("A100-80GB", 2, COLL_ALL_REDUCE, 8,
		   156.6e-6 + fmax(2 * 15.0 / 16 * 8 * 14 / 16 / (300e9 * 0.35),
				   2 * 15.0 / 16 * 8 * 2 / 16 / (25e9 * 0.46)));
}

/* One GEMM on the test's curve through (F/60, 0.2) and (10 F/6, 0.6), read in log(x), of the
 * A100's 312 TFLOP/s sustained at 0.897 (its profile's "sustained"), and no faster than its
 * bytes at 2039 GB/s x 0.9 (the roofline). */
#define A100_BF16_SUSTAINED (312e12 * 0.897)
static double small_gemm_s(double f, double bytes, double F)
{
	double e = 0.2 + 0.4 * log(60 * f / F) / log(100);
	return fmax(f / (A100_BF16_SUSTAINED * e), bytes / (2039e9 * 0.9));
}

/* SMALL_GPT's block (h = 256, a = 8, s = 512, b = 1, bf16) has 2^30 FLOPs of forward GEMMs
 * over M = 512 tokens, each priced at its own size: QKV (weights 256 x 768: 2 M 196608 FLOPs,
 * (M (256 + 768) + 196608) x 2 bytes), the projection (256 x 256), the MLP's two (256 x 1024),
 * and QK^T and AV (2 M s h = 2^27 FLOPs each, moving the 8 x 512^2 scores and two M x 256
 * operands, 2 bytes each). The plan's F also counts 2 M (768 + 1024) for the two long bias
 * vectors, priced at the GEMMs' average rate: their time scales by F / 2^30. Layer norms and the
 * like move 3.5 x the unit's activation bytes other than the scores, and softmax and dropout 2 x
 * the scores' 5 a s^2 b = 8 x 512^2 x 5 = 10,485,760 bytes (Korthikanti et al. 2022), at
 * 2039 GB/s x 0.9. The backward's 2F are two GEMMs of each size, moving twice the bytes. A host copy of B bytes takes B / (32 GB/s x 0.8); NVMe shares the node's
 * 25 GB/s among its 8 GPUs: B / (25/8 GB/s x 0.8). */
static void test_compute_and_copy_formulas(void)
{
	Scenario sc;
	Prediction pr;
	HwProfile hw;
	Schedule s;
	if (fx_predictf(&sc, &pr,
			 "{" SMALL_GPT ", \"deepspeed\": {\"train_micro_batch_size_per_gpu\": 1,"
			 " \"bf16\": {\"enabled\": true}}, \"cluster\": {\"gpu\": \"A100-80GB\","
			 " \"nodes\": 1, \"gpus_per_node\": 8}, \"seq_length\": 512}"))
		return;
	hwprofile_default(&sc.cluster.gpu, &hw);
	hw.kernel_issue_s = 0; /* the GPU's time; the host's bound: test_host_bound */
	const UnitPlan *u = &pr.plan.units[1];
	double F = u->fwd_flops, hbm = 2039e9 * 0.9;
	hw.gemm = (HwCurve){2, {F / 60, 10 * F / 6}, {0.2, 0.6}};
	sched_init(&s, 0);
	sched_compute(&s, COMP_FWD, 1, F, 0);
	sched_compute(&s, COMP_BWD, 1, 2 * F, 0);
	sched_copy(&s, COPY_H2D, ROLE_PREFETCH, 1, 1e9);
	sched_copy(&s, COPY_NVME_READ, ROLE_PREFETCH, 1, 1e9);
	CU_ASSERT(F == 1073741824.0 + 2 * 512 * (768 + 1024) && u->act_bytes > 0);
	const double M = 512, w[4] = {256 * 768, 256 * 256, 256 * 1024, 1024 * 256};
	double gemms = 2 * small_gemm_s(2 * M * 512 * 256, (8 * 512 * 512 + 2 * M * 256) * 2, F);
	for (int i = 0; i < 4; i++)
		gemms += small_gemm_s(2 * M * w[i], (M * (256 + w[i] / 256) + w[i]) * 2, F);
	gemms *= F / 1073741824.0;
	double scores = 8 * 512 * 512 * 5.0, rest = u->act_bytes - scores;
	CU_ASSERT_EQUAL(u->score_bytes, scores);
	REL_EQ(opcost_compute_s(&pr.plan, &hw, &s.ops[0], 0), gemms + (3.5 * rest + 2 * scores) / hbm);
	REL_EQ(opcost_compute_s(&pr.plan, &hw, &s.ops[1], 0),
	       2 * gemms + (7 * rest + 4 * scores) / hbm);
	REL_EQ(opcost_copy_s(&pr.plan, &hw, &s.ops[2]), 1e9 / (32e9 * 0.8));
	REL_EQ(opcost_copy_s(&pr.plan, &hw, &s.ops[3]), 1e9 / (25e9 / 8 * 0.8));
	sched_free(&s);
	fx_free(&sc, &pr);
}

/* The same block with FlashAttention (Dao 2022, 2023): the four weight GEMMs as above, and the
 * attention's 2 x 2^27 FLOPs as one fused kernel. GPT-2 is causal and s = 512 is 4 query tiles
 * of 128, so it computes (4 + 1)/8 of them: 2^28 x 5/8 FLOPs at the A100 profile's flash
 * forward rate, 0.60 of the sustained 312 TFLOP/s x 0.897; backward recomputes the scores,
 * 2.5 x those FLOPs at 0.50 of it. The elementwise traffic is 3.5 x the activation bytes
 * forward, 7 x backward (the profile's). The scores are not kept: per layer the 8 heads x 512 rows keep a 4-byte
 * log-sum-exp each (16,384 B) instead of the eager 8 x 512 x 512 x (2 + 1 + 2) B of softmax
 * output, dropout mask and dropout output (10,485,760 B), so the elementwise traffic shrinks
 * with them. */
static void test_flash_attention_formulas(void)
{
	Scenario sc, eager;
	Prediction pr, pe;
	HwProfile hw;
	Schedule s;
	const char *fmt = "{" SMALL_GPT ", \"deepspeed\": {\"train_micro_batch_size_per_gpu\": 1,"
			  " \"bf16\": {\"enabled\": true}}, \"cluster\": {\"gpu\": \"A100-80GB\","
			  " \"nodes\": 1, \"gpus_per_node\": 8}, \"seq_length\": 512,"
			  " \"attention\": \"%s\"}";
	if (fx_predictf(&sc, &pr, fmt, "flash"))
		return;
	if (fx_predictf(&eager, &pe, fmt, "eager")) {
		fx_free(&sc, &pr);
		return;
	}
	hwprofile_default(&sc.cluster.gpu, &hw);
	hw.kernel_issue_s = 0; /* the GPU's time; the host's bound: test_host_bound */
	const UnitPlan *u = &pr.plan.units[1];
	double F = u->fwd_flops, hbm = 2039e9 * 0.9;
	CU_ASSERT_EQUAL(F, pe.plan.units[1].fwd_flops); /* FLOP counts take the full square */
	CU_ASSERT_EQUAL(pe.plan.units[1].act_bytes - u->act_bytes, 8 * 512 * 512 * 5 - 8 * 512 * 4);
	CU_ASSERT_EQUAL(u->score_bytes, 0);
	hw.gemm = (HwCurve){2, {F / 60, 10 * F / 6}, {0.2, 0.6}};
	sched_init(&s, 0);
	sched_compute(&s, COMP_FWD, 1, F, 0);
	sched_compute(&s, COMP_BWD, 1, 2 * F, 0);
	const double M = 512, w[4] = {256 * 768, 256 * 256, 256 * 1024, 1024 * 256};
	double gemms = 0, attn = 268435456.0 * 5 / 8;
	for (int i = 0; i < 4; i++)
		gemms += small_gemm_s(2 * M * w[i], (M * (256 + w[i] / 256) + w[i]) * 2, F);
	double scale = F / 1073741824.0;
	REL_EQ(opcost_compute_s(&pr.plan, &hw, &s.ops[0], 0),
	       (gemms + attn / (A100_BF16_SUSTAINED * 0.6)) * scale + 3.5 * u->act_bytes / hbm);
	REL_EQ(opcost_compute_s(&pr.plan, &hw, &s.ops[1], 0),
	       (2 * gemms + 2.5 * attn / (A100_BF16_SUSTAINED * 0.5)) * scale +
		       7 * u->act_bytes / hbm);
	sched_free(&s);
	fx_free(&eager, &pe);
	fx_free(&sc, &pr);
}

/* One pass of block 1 of pr's plan (a backward over twice its FLOPs) priced on hw. */
static double block_pass_s(const Prediction *pr, const HwProfile *hw, CompKind sub)
{
	Schedule one;
	double f = pr->plan.units[1].fwd_flops;
	sched_init(&one, 0);
	sched_compute(&one, sub, 1, sub == COMP_BWD ? 2 * f : f, 0);
	double t = opcost_compute_s(&pr->plan, hw, &one.ops[0], 0);
	sched_free(&one);
	return t;
}

/* A small model of model_type type (h 256, 8 heads, 2 layers, bf16, micro-batch 1 of 64 tokens,
 * model_code huggingface, extra config keys in extra) on an A100: its block's forward and
 * backward take fwd and bwd kernels of hw's kernel_issue_s (10 us) each. */
static void hf_block_kernels(const HwProfile *hw, const char *type, const char *extra, int fwd,
			     int bwd)
{
	Scenario sc;
	Prediction pr;
	if (fx_predictf(&sc, &pr, "{\"model\": {\"model_type\": \"%s\", \"hidden_size\": 256,"
			" \"intermediate_size\": 688, \"num_attention_heads\": 8%s,"
			" \"num_hidden_layers\": 2, \"vocab_size\": 1024,"
			" \"max_position_embeddings\": 512}, \"model_code\": \"huggingface\","
			" \"deepspeed\": {\"train_micro_batch_size_per_gpu\": 1, \"bf16\": {\"enabled\":"
			" true}}, \"cluster\": {\"gpu\": \"A100-80GB\", \"nodes\": 1,"
			" \"gpus_per_node\": 1}, \"seq_length\": 64}", type, extra))
		return;
	REL_EQ(block_pass_s(&pr, hw, COMP_FWD), fwd * 10e-6);
	REL_EQ(block_pass_s(&pr, hw, COMP_BWD), bwd * 10e-6);
	fx_free(&sc, &pr);
}

/* Host overhead (issue 16): a framework issues a pass's kernels one by one from the host, 10 us
 * each on the bundled profiles (an assumption, scenarios/hardware/), and a pass takes no less than
 * that. The kernels, counted from Megatron-LM's ParallelTransformerLayer.forward (sim/opcost.c):
 * an eager GPT-2 block's forward runs its four weights' GEMMs and QK^T and AV (6 GEMMs), the
 * attention's norm, softmax, dropout, the context's copy and bias-dropout-add (5), the MLP's norm,
 * bias-GeLU and bias-dropout-add (3): 14 kernels, 140 us; its backward two kernels per GEMM and
 * one per other, 12 + 8 = 20, 200 us. FlashAttention's one kernel for QK^T, softmax, dropout
 * and AV leaves 5 GEMM-like kernels and 5 others: 10 forward, 15 backward. The embedding runs
 * 3 kernels each way, the head 8 forward (norm, logits, the loss's six) and 6 backward.
 * The small GPT at micro-batch 1 and s 64 computes a block in about 1 us on an A100, so every pass
 * is host-bound: on the compute-only profile with the host's 10 us the step's forward is
 * (3 + 8 x 14 + 8) x 10 us = 1.23 ms and its backward (3 + 8 x 20 + 6) x 10 us = 1.69 ms (plus
 * BF16_Optimizer's accumulation into fp32), where the GPU alone takes microseconds. At
 * micro-batch 64 and s 512 the block's GPU time is above its kernels' and the bound changes
 * nothing. */
static void test_host_bound(void)
{
	static const char *fmt = "{" SMALL_GPT ", \"deepspeed\": {\"train_micro_batch_size_per_gpu\":"
				 " %d, \"bf16\": {\"enabled\": true}}, \"cluster\": {\"gpu\":"
				 " \"A100-80GB\", \"nodes\": 1, \"gpus_per_node\": 1},"
				 " \"seq_length\": %d, \"attention\": \"%s\"}";
	Scenario sc;
	Prediction pr;
	HwProfile hw, gpu_only;
	if (fx_predictf(&sc, &pr, fmt, 1, 64, "eager"))
		return;
	hwprofile_default(&sc.cluster.gpu, &hw);
	CU_ASSERT_EQUAL(hw.kernel_issue_s, 10e-6);
	gpu_only = hw;
	gpu_only.kernel_issue_s = 0;
	Schedule s;
	sched_init(&s, 0);
	const double F = pr.plan.units[1].fwd_flops, H = pr.plan.units[9].fwd_flops;
	sched_compute(&s, COMP_FWD, 1, F, 0);
	sched_compute(&s, COMP_BWD, 1, 2 * F, 0);
	sched_compute(&s, COMP_FWD, 0, 0, 0);
	sched_compute(&s, COMP_FWD, 9, H, 0);
	sched_compute(&s, COMP_BWD, 9, 2 * H, 0);
	CU_ASSERT(opcost_compute_s(&pr.plan, &gpu_only, &s.ops[1], 0) < 20e-6);
	REL_EQ(opcost_compute_s(&pr.plan, &hw, &s.ops[0], 0), 14 * 10e-6);
	REL_EQ(opcost_compute_s(&pr.plan, &hw, &s.ops[1], 0), 20 * 10e-6);
	REL_EQ(opcost_compute_s(&pr.plan, &hw, &s.ops[2], 0), 3 * 10e-6);
	REL_EQ(opcost_compute_s(&pr.plan, &hw, &s.ops[3], 0), 8 * 10e-6);
	REL_EQ(opcost_compute_s(&pr.plan, &hw, &s.ops[4], 0), 6 * 10e-6);

	/* the whole step, every other cost 0 */
	HwProfile only;
	TimeResult r;
	compute_only_profile(&only);
	only.kernel_issue_s = 10e-6;
	/* BF16_Optimizer's one fp32 accumulation after the backward (memory-bound, no host bound
	 * modelled) is charged to the backward too */
	const Schedule *st = &pr.stages[0].sched;
	double accum = 0;
	for (int i = 0; i < st->n; i++)
		if (st->ops[i].kind == OP_COMPUTE && st->ops[i].sub == COMP_GRAD_ACCUM)
			accum += opcost_compute_s(&pr.plan, &only, &st->ops[i], 0);
	CU_ASSERT(accum > 0 && accum < 100e-6);
	TimeResult r0;
	HwProfile only0 = only;
	only0.kernel_issue_s = 0;
	if (run_prediction(&pr, &only, 1, &r) == 0 && run_prediction(&pr, &only0, 1, &r0) == 0) {
		REL_EQ(r.breakdown.fwd_s, (3 + 8 * 14 + 8) * 10e-6);
		REL_EQ(r.breakdown.bwd_s, (3 + 8 * 20 + 6) * 10e-6 + accum);
		/* every pass host-bound: the GPU waits the difference from its own time */
		CU_ASSERT_EQUAL(r0.breakdown.host_wait_s, 0);
		REL_EQ(r.breakdown.host_wait_s, r.breakdown.fwd_s + r.breakdown.bwd_s -
							r0.breakdown.fwd_s - r0.breakdown.bwd_s);
		CU_ASSERT(r.breakdown.host_wait_s > 0.9 * (r.breakdown.fwd_s + r.breakdown.bwd_s));
		timeline_result_free(&r0);
		timeline_result_free(&r);
	}
	double wait = -1;
	REL_EQ(opcost_compute_wait_s(&pr.plan, &hw, &s.ops[0], 0, &wait), 14 * 10e-6);
	REL_EQ(wait, 14 * 10e-6 - opcost_compute_s(&pr.plan, &gpu_only, &s.ops[0], 0));
	fx_free(&sc, &pr);

	if (fx_predictf(&sc, &pr, fmt, 1, 64, "flash") == 0) {
		REL_EQ(opcost_compute_s(&pr.plan, &hw, &s.ops[0], 0), 10 * 10e-6);
		REL_EQ(opcost_compute_s(&pr.plan, &hw, &s.ops[1], 0), 15 * 10e-6);
		fx_free(&sc, &pr);
	}

	/* Hugging Face's modules: GPT-2's block issues ln_1, c_attn, QK^T, the scale's division, the
	 * causal where, softmax, attn_dropout, AV, the heads' merge copy, c_proj, resid_dropout, the
	 * residual add, ln_2, c_fc, NewGELU's 8, c_proj, dropout, the add: 6 GEMMs and 19 others,
	 * 25 forward and 2 x 6 + 19 = 31 backward; Llama's (h 256, 8 heads, bf16) q, k, v, o, gate,
	 * up, down and QK^T, AV (9 GEMMs), two RMSNorms of 7, rotary 10, the scaling, mask add,
	 * fp32 softmax and its cast, the output's transpose copy, two adds, SiLU and the product
	 * (33 others): 42 forward, 51 backward */
	if (fx_predictf(&sc, &pr, "{" SMALL_GPT ", \"model_code\": \"huggingface\", \"deepspeed\":"
			" {\"train_micro_batch_size_per_gpu\": 1, \"bf16\": {\"enabled\": true}},"
			" \"cluster\": {\"gpu\": \"A100-80GB\", \"nodes\": 1, \"gpus_per_node\": 1},"
			" \"seq_length\": 64}") == 0) {
		REL_EQ(opcost_compute_s(&pr.plan, &hw, &s.ops[0], 0), 25 * 10e-6);
		REL_EQ(opcost_compute_s(&pr.plan, &hw, &s.ops[1], 0), 31 * 10e-6);
		fx_free(&sc, &pr);
	}
	hf_block_kernels(&hw, "llama", ", \"num_key_value_heads\": 8", 42, 51);
	/* Gemma-2's (h 256, 8 heads, 4 kv heads, bf16): the 9 GEMMs, four GemmaRMSNorms of 10 (to
	 * fp32, pow, mean, add eps, rsqrt, mul, the weight's cast, 1 + it, mul, type_as), rotary 10,
	 * repeat_kv's 2, the scaling, the soft-capping's divide, tanh and multiply, mask add, fp32
	 * softmax and its cast, the transpose copy, two adds, GELU and the product (64 others): 73
	 * forward, 2 x 9 + 64 = 82 backward */
	hf_block_kernels(&hw, "gemma2", ", \"head_dim\": 32, \"num_key_value_heads\": 4", 73, 82);

	sched_free(&s);

	/* the executor's CUDA backend issues its kernels from C, not through PyTorch: no bound */
	if (fx_predictf(&sc, &pr, "{" SMALL_GPT ", \"backend\": \"cuda\", \"deepspeed\":"
			" {\"train_micro_batch_size_per_gpu\": 1, \"bf16\": {\"enabled\": true}},"
			" \"cluster\": {\"gpu\": \"A100-80GB\", \"nodes\": 1, \"gpus_per_node\": 1},"
			" \"seq_length\": 64}") == 0) {
		double t = block_pass_s(&pr, &hw, COMP_FWD);
		CU_ASSERT_EQUAL(t, block_pass_s(&pr, &gpu_only, COMP_FWD));
		CU_ASSERT(t < 14 * 10e-6);
		fx_free(&sc, &pr);
	}

	/* enough work per kernel: the GPU's time */
	if (fx_predictf(&sc, &pr, fmt, 64, 512, "eager"))
		return;
	double t = block_pass_s(&pr, &gpu_only, COMP_FWD);
	CU_ASSERT(t > 14 * 10e-6);
	CU_ASSERT_EQUAL(block_pass_s(&pr, &hw, COMP_FWD), t);
	fx_free(&sc, &pr);
}

/* FlashAttention-2 runs on Ampere and newer: on a V100 (whose profile gives it no rate) a flash
 * scenario cannot be timed, and the message names the key; an unknown attention is refused when
 * the scenario is read, naming the key and the two values it takes (jobj_choice's message). */
static void test_flash_refused(void)
{
	Scenario sc;
	Prediction pr;
	PxError err = {0};
	if (fx_predictf(&sc, &pr,
			 "{" SMALL_GPT ", \"deepspeed\": {\"train_micro_batch_size_per_gpu\": 1,"
			 " \"fp16\": {\"enabled\": true}}, \"cluster\": {\"gpu\": \"V100-32GB\","
			 " \"nodes\": 1, \"gpus_per_node\": 8}, \"seq_length\": 512,"
			 " \"attention\": \"flash\"}"))
		return;
	HwProfile hw;
	TimeResult r;
	Schedule *stages[1] = {&pr.stages[0].sched};
	hwprofile_default(&sc.cluster.gpu, &hw);
	CU_ASSERT_EQUAL(timeline_run(&pr.plan, stages, &hw, &r, &err), -1);
	CU_ASSERT_EQUAL(err.code, PX_ERR_INPUT);
	CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "attention: \"flash\" cannot be timed on V100-32GB"));
	CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "compute.flash_forward"));
	fx_free(&sc, &pr);

	char path[512];
	snprintf(path, sizeof(path), "%s/attention.json", px_test_tmpdir());
	px_test_write_file(path, "{" SMALL_GPT ", \"cluster\": {\"gpu\": \"A100-80GB\", \"nodes\": 1,"
			   " \"gpus_per_node\": 1},\n \"attention\": \"sdpa\"}");
	CU_ASSERT_EQUAL(scenario_load(&sc, path, NULL, &err), -1);
	CU_ASSERT_EQUAL(err.code, PX_ERR_INPUT);
	CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "attention.json:2:"));
	CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "attention: expected one of eager, flash, got \"sdpa\""));
}

/* Selective recompute (Korthikanti et al. 2022, section 5, "selective activation recomputation":
 * only the attention core, QK^T, softmax, dropout and softmax x V, is recomputed) on SMALL_GPT,
 * one GPU, 2 micro-batches of 1 sequence. Before each block's backward one recompute op runs the
 * two attention products again, 2 x 2 s^2 h = 4 b s^2 h = 2^28 FLOPs, and rebuilds the scores,
 * 5 a s^2 b = 10,485,760 bytes (its traffic). Priced as the eager forward prices them: each
 * product at its own size on the test's curve and no faster than its bytes, (8 x 512^2 + 2 x 512
 * x 256) x 2, then softmax and dropout at 2 x the scores' bytes over 2039 GB/s x 0.9:
 *   t_rc = 2 small_gemm_s(2^27, (8 x 512^2 + 2 x 512 x 256) x 2) + 2 x 10,485,760 / (2039e9 x 0.9).
 * Forward and backward cost what they cost without recompute: the same GEMMs, 3.5 and 7 x the
 * activation bytes other than the scores and 2 and 4 x the scores (built forward, their gradient
 * backward), kept or not. So the step is exactly 2 micro-batches x 8 layers x t_rc longer than
 * without recompute, and shorter than full recompute's, which repeats every block's forward. */
static void test_selective_recompute_formulas(void)
{
	Scenario sc[3];
	Prediction pr[3];
	static const char *const modes[3] = {"none", "selective", "full"};
	const char *fmt = "{" SMALL_GPT ", \"deepspeed\": {\"train_micro_batch_size_per_gpu\": 1,"
			  " \"gradient_accumulation_steps\": 2, \"bf16\": {\"enabled\": true}},"
			  " \"cluster\": {\"gpu\": \"A100-80GB\", \"nodes\": 1, \"gpus_per_node\": 1},"
			  " \"seq_length\": 512, \"activation_checkpointing\": \"%s\"}";
	int n = 0;
	for (; n < 3; n++)
		if (fx_predictf(&sc[n], &pr[n], fmt, modes[n]))
			goto out;
	HwProfile hw;
	hwprofile_default(&sc[0].cluster.gpu, &hw);
	hw.kernel_issue_s = 0; /* the GPU's time; the host's bound: test_host_bound */
	const UnitPlan *none = &pr[0].plan.units[1], *sel = &pr[1].plan.units[1];
	double F = none->fwd_flops, hbm = 2039e9 * 0.9, scores = 8 * 512 * 512 * 5.0;
	hw.gemm = (HwCurve){2, {F / 60, 10 * F / 6}, {0.2, 0.6}};
	CU_ASSERT_EQUAL(hw.scores_fwd, 2);
	CU_ASSERT_EQUAL(sel->score_bytes, scores);
	CU_ASSERT_EQUAL(none->act_bytes - sel->act_bytes, scores); /* not kept */

	/* the recompute op of block 1, as build.c scheduled it */
	const Schedule *s = &pr[1].stages[0].sched;
	const Op *rc = NULL;
	for (int i = 0; i < s->n && !rc; i++)
		if (s->ops[i].kind == OP_COMPUTE && s->ops[i].sub == COMP_RECOMPUTE &&
		    s->ops[i].unit == 1)
			rc = &s->ops[i];
	CU_ASSERT_PTR_NOT_NULL_FATAL(rc);
	CU_ASSERT_EQUAL(rc->flops, 4.0 * 512 * 512 * 256);
	CU_ASSERT_EQUAL(rc->bytes, scores);
	CU_ASSERT_EQUAL(rc->role, ROLE_RECOMPUTE);
	double t_rc = 2 * small_gemm_s(134217728.0, (8 * 512 * 512 + 2 * 512 * 256) * 2.0, F) +
		      2 * scores / hbm;
	REL_EQ(opcost_compute_s(&pr[1].plan, &hw, rc, 0), t_rc);

	/* forward and backward as without recompute */
	Schedule fb;
	sched_init(&fb, 0);
	sched_compute(&fb, COMP_FWD, 1, F, 0);
	sched_compute(&fb, COMP_BWD, 1, 2 * F, 0);
	for (int k = 0; k < 2; k++)
		REL_EQ(opcost_compute_s(&pr[1].plan, &hw, &fb.ops[k], 0),
		       opcost_compute_s(&pr[0].plan, &hw, &fb.ops[k], 0));
	sched_free(&fb);

	TimeResult r[3];
	int ok = 0;
	for (; ok < 3; ok++)
		if (run_prediction(&pr[ok], &hw, 1, &r[ok]))
			break;
	if (ok == 3) {
		REL_EQ(r[1].step_s - r[0].step_s, 2 * 8 * t_rc);
		REL_EQ(r[1].breakdown.recompute_s, 2 * 8 * t_rc);
		CU_ASSERT(r[2].step_s > r[1].step_s);
		/* hardware FLOPs count the recompute, model FLOPs do not */
		REL_EQ(r[1].hw_flops_per_gpu - r[0].hw_flops_per_gpu, 2 * 8 * 4.0 * 512 * 512 * 256);
		REL_EQ(r[1].model_flops_per_gpu, r[0].model_flops_per_gpu);
	}
	while (ok-- > 0)
		timeline_result_free(&r[ok]);
out:
	while (n-- > 0)
		fx_free(&sc[n], &pr[n]);
}

/* Optimizer offload: a checkpoint copied in (B bytes, c = B / (32 GB/s x 0.8)) before the
 * recompute that needs it, the recompute (t), then CPU Adam over this rank's partition (P
 * elements at 6.8e8 per second on the A100 host). The compute stream waits the whole copy:
 * offload stall c, step c + t + P / 6.8e8. */
static void test_offload_stall(void)
{
	Scenario sc;
	Prediction pr;
	HwProfile hw;
	Schedule s, *stages[1] = {&s};
	TimeResult r;
	PxError err = {0};
	if (fx_predictf(&sc, &pr,
			 "{" SMALL_GPT ", \"deepspeed\": {\"train_micro_batch_size_per_gpu\": 1,"
			 " \"bf16\": {\"enabled\": true}, \"zero_optimization\": {\"stage\": 2,"
			 " \"offload_optimizer\": {\"device\": \"cpu\"}}}, \"cluster\": {\"gpu\":"
			 " \"A100-80GB\", \"nodes\": 1, \"gpus_per_node\": 8}, \"seq_length\": 512}"))
		return;
	compute_only_profile(&hw);
	hw.pcie_efficiency = 0.8;
	CU_ASSERT_EQUAL(pr.plan.opt_place, PLACE_CPU);
	double B = 4e8, c = B / (32e9 * 0.8), F = 1e12, t = F / (312e12 * 0.5);
	double P = (double)pr.plan.stages[0].part_elems;
	sched_init(&s, 0);
	sched_copy(&s, COPY_H2D, ROLE_RECOMPUTE, 3, B);
	sched_compute(&s, COMP_RECOMPUTE, 3, F, 0);
	sched_compute(&s, COMP_OPTIMIZER, -1, 10 * P, 0);
	CU_ASSERT_EQUAL_FATAL(timeline_run(&pr.plan, stages, &hw, &r, &err), 0);
	REL_EQ(r.breakdown.offload_stall_s, c);
	REL_EQ(r.breakdown.recompute_s, t);
	REL_EQ(r.breakdown.optimizer_s, P / 6.8e8);
	REL_EQ(r.step_s, c + t + P / 6.8e8);
	timeline_result_free(&r);
	sched_free(&s);
	fx_free(&sc, &pr);
}

/* ---- the repeat block and the pipeline's steady state ---- */

/* The scenario at rel with the overrides in sets ("KEY=VALUE" strings, NULL-terminated; sets may
 * be NULL) replayed in full and with the shortcuts must give the same numbers: every stage's end,
 * every breakdown field and the FLOPs; the ops not simulated were extrapolated. Adds the ops
 * extrapolated to *extrapolated. */
static void expect_shortcut_equals_full(const char *rel, const char *const *sets,
					long long *extrapolated)
{
	Scenario sc;
	Prediction pr;
	PxError err = {0};
	HwProfile hw;
	TimeResult a, b;
	JsonOverrides ov;

	jov_init(&ov);
	for (int i = 0; sets && sets[i]; i++)
		CU_ASSERT_EQUAL_FATAL(jov_add(&ov, sets[i], &err), 0);
	int rc = scenario_load(&sc, px_test_path(rel), &ov, &err);
	jov_free(&ov);
	if (rc) {
		fprintf(stderr, "\n%s\n", err.msg);
		CU_FAIL("scenario_load failed");
		return;
	}
	if (predict_run(&sc, &pr, &err)) {
		fprintf(stderr, "\n%s: %s\n", rel, err.msg);
		CU_FAIL("predict_run failed");
		scenario_free(&sc);
		return;
	}
	hwprofile_default(&sc.cluster.gpu, &hw);
	if (run_prediction(&pr, &hw, 1, &a) == 0) {
		if (run_prediction(&pr, &hw, 0, &b) == 0) {
			REL_EQ(b.step_s, a.step_s);
			for (int s = 0; s < a.n_stages; s++) {
				const TimeBreakdown *x = &a.stages[s].bd, *y = &b.stages[s].bd;
				CU_ASSERT_EQUAL(a.stages[s].ops_extrapolated, 0);
				*extrapolated += b.stages[s].ops_extrapolated;
				REL_EQ(b.stages[s].end_s, a.stages[s].end_s);
				REL_EQ(y->fwd_s, x->fwd_s);
				REL_EQ(y->bwd_s, x->bwd_s);
				REL_EQ(y->recompute_s, x->recompute_s);
				REL_EQ(y->optimizer_s, x->optimizer_s);
				REL_EQ(y->bubble_s, x->bubble_s);
				REL_EQ(y->offload_stall_s, x->offload_stall_s);
				for (int g = 0; g < N_GROUPS; g++)
					CU_ASSERT_DOUBLE_EQUAL(y->comm_s[g], x->comm_s[g],
							       1e-9 * a.step_s);
				REL_EQ(b.stages[s].model_flops, a.stages[s].model_flops);
				REL_EQ(b.stages[s].hw_flops, a.stages[s].hw_flops);
				/* what was not simulated was extrapolated */
				CU_ASSERT_EQUAL(b.stages[s].ops + b.stages[s].ops_extrapolated,
						a.stages[s].ops);
			}
			timeline_result_free(&b);
		}
		timeline_result_free(&a);
	}
	predict_free(&pr);
	scenario_free(&sc);
}

/* Extrapolating a repeat block once two iterations start from the same state must give the full
 * replay's numbers. */
static void test_extrapolation_equals_full_replay(void)
{
	static const char *const names[] = {
		"llama2-13b-zero3-h100", "llama2-7b-zero2-h100", "llama2-70b-tp8-zero1-h100",
		"mixtral-8x7b-ep8-h100", "llama2-70b-zero3-offload-h100",
		"llama2-70b-infinity-nvme-a100", "gpt2-xl-zero1-a100",
	};
	long long extrapolated = 0;
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		char rel[128];
		snprintf(rel, sizeof(rel), "scenarios/%s.json", names[i]);
		expect_shortcut_equals_full(rel, NULL, &extrapolated);
	}
	CU_ASSERT(extrapolated > 0); /* the shortcut was taken somewhere */
}

/* Extrapolating the 1F1B steady state once every stage starts a round in the state it started
 * the last one in must give the full replay's numbers too: the bundled pipelined scenarios, and
 * the GPT-3 13B sweep's base pipelined in ways its sweep covers (depth, micro-batches, tensor
 * parallelism, recompute, overlap, GPU); the shortcut must be taken on each. */
static void test_pipeline_steady_state_equals_full_replay(void)
{
	static const char *const names[] = {
		"scenarios/gpt3-175b-tp8-pp8-a100.json",
		"scenarios/published/narayanan2021-gpt-145.6b.json",
		"scenarios/published/narayanan2021-gpt-76.1b.json",
		"scenarios/published/bloom-176b-tp4-pp12-a100.json",
	};
	static const char *const sets[][8] = {
		{"parallelism.pp=2", "deepspeed.gradient_accumulation_steps=16", NULL},
		{"parallelism.pp=4", "deepspeed.gradient_accumulation_steps=32",
		 "activation_checkpointing=\"full\"", NULL},
		{"parallelism.pp=8", "parallelism.tp=2", "deepspeed.gradient_accumulation_steps=32",
		 "deepspeed.train_micro_batch_size_per_gpu=2", "cluster.gpu=\"A100-40GB\"", NULL},
		{"parallelism.pp=8", "parallelism.tp=8", "deepspeed.gradient_accumulation_steps=32",
		 "activation_checkpointing=\"selective\"", "parallelism.sequence_parallel=true",
		 "deepspeed.zero_optimization.overlap_comm=false", NULL},
		{"parallelism.pp=4", "parallelism.tp=4", "deepspeed.gradient_accumulation_steps=32",
		 "deepspeed.zero_optimization.stage=1", "seq_length=2048", NULL},
	};
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		long long extrapolated = 0;
		expect_shortcut_equals_full(names[i], NULL, &extrapolated);
		CU_ASSERT(extrapolated > 0);
	}
	for (size_t i = 0; i < sizeof(sets) / sizeof(sets[0]); i++) {
		long long extrapolated = 0;
		expect_shortcut_equals_full("scenarios/sweeps/gpt3-13b-64xa100-base.json", sets[i],
					    &extrapolated);
		CU_ASSERT(extrapolated > 0);
	}
}

/* ---- 1,000-GPU scenarios ---- */

/* GPT-3 175B on 1,024 A100 (TP 8, PP 8, 96 micro-batches) and MT-NLG 530B on 2,240 (TP 8,
 * PP 35, 240): the replay completes and accounts for every second of the step; the cost of the
 * replay is printed, not asserted. The first stage's bubble is compared loosely with the equal-
 * stage formula (p-1)/(m+p-1): these stages are not equal (embedding and head), so this is only a
 * sanity bound. */
static void check_large(const char *name, double pp, double m)
{
	char rel[128];
	Scenario sc;
	Prediction pr;
	PxError err = {0};
	HwProfile hw;
	TimeResult r;
	snprintf(rel, sizeof(rel), "scenarios/%s.json", name);
	if (scenario_load(&sc, px_test_path(rel), NULL, &err) || predict_run(&sc, &pr, &err)) {
		fprintf(stderr, "\n%s\n", err.msg);
		CU_FAIL("cannot predict the scenario");
		return;
	}
	hwprofile_default(&sc.cluster.gpu, &hw);
	double t0 = px_now_s();
	if (run_prediction(&pr, &hw, 0, &r) == 0) {
		double cost = px_now_s() - t0, seconds, gpu_hours;
		CU_ASSERT(isfinite(r.step_s) && r.step_s > 0);
		CU_ASSERT_EQUAL(r.n_stages, (int)pp);
		for (int s = 0; s < r.n_stages; s++)
			REL_EQ(breakdown_sum(&r.stages[s].bd), r.stages[s].end_s);
		double frac = r.stages[0].bd.bubble_s / r.step_s, formula = (pp - 1) / (m + pp - 1);
		CU_ASSERT(frac > 0.5 * formula && frac < 1.5 * formula);
		timeline_train_cost(&r, 300e9, pr.plan.world, &seconds, &gpu_hours);
		REL_EQ(seconds, 300e9 / r.tokens_per_s);
		REL_EQ(gpu_hours, seconds * (double)pr.plan.world / 3600);
		long long ops = 0, extrapolated = 0;
		for (int s = 0; s < r.n_stages; s++)
			ops += r.stages[s].ops, extrapolated += r.stages[s].ops_extrapolated;
		printf("\n# %s: %lld GPUs, step %.2f s, %.0f (model) / %.0f (hardware) TFLOP/s per "
		       "GPU, MFU %.3f, 300e9 tokens in %.1f days; replayed in %.1f ms (%lld of %lld "
		       "timed ops simulated) ", name, pr.plan.world, r.step_s, r.tflops_per_gpu,
		       r.hw_tflops_per_gpu, r.mfu, seconds / 86400, cost * 1e3, ops, ops + extrapolated);
		timeline_result_free(&r);
	}
	predict_free(&pr);
	scenario_free(&sc);
}

static void test_large_scenarios(void)
{
	check_large("gpt3-175b-tp8-pp8-a100", 8, 96);
	check_large("mtnlg-530b-tp8-pp35-a100", 35, 240);
}

/* ---- held-out published runs ---- */

/* A published run: its scenario file read as JSON (for "_published" and "_source") and as a
 * scenario, predicted with the default profile. */
typedef struct PublishedRun {
	JsonDoc d;
	Scenario sc;
	Prediction pr;
	const cJSON *pub, *src;
} PublishedRun;

/* 0 with *r loaded (free with published_free), else -1 with the failure recorded. */
static int published_load(PublishedRun *r, const char *path)
{
	PxError err = {0};
	if (jdoc_load_file(&r->d, path, &err)) {
		fprintf(stderr, "\n%s\n", err.msg);
		CU_FAIL("cannot read a published scenario");
		return -1;
	}
	r->pub = cJSON_GetObjectItemCaseSensitive(r->d.root, "_published");
	r->src = cJSON_GetObjectItemCaseSensitive(r->d.root, "_source");
	CU_ASSERT(cJSON_IsString(r->src) && strlen(r->src->valuestring) > 20); /* cited */
	if (!cJSON_IsString(r->src) || scenario_load(&r->sc, path, NULL, &err) ||
	    predict_run(&r->sc, &r->pr, &err)) {
		fprintf(stderr, "\n%s: %s\n", path, err.msg);
		CU_FAIL("cannot predict a published scenario");
		jdoc_free(&r->d);
		return -1;
	}
	CU_ASSERT_FATAL(r->pr.time_known);
	return 0;
}

static void published_free(PublishedRun *r)
{
	predict_free(&r->pr);
	scenario_free(&r->sc);
	jdoc_free(&r->d);
}

typedef struct ErrTally {
	int n;
	double sum_abs, max_abs, sum_log;
} ErrTally;

static double tally(ErrTally *t, double predicted, double published)
{
	double e = predicted / published - 1;
	t->n++;
	t->sum_abs += fabs(e);
	t->max_abs = fmax(t->max_abs, fabs(e));
	t->sum_log += log(predicted / published);
	return e;
}

/* The published runs and their split come from one manifest (scenarios/published/manifest.json):
 * every run there with a time metric is predicted with the default profiles and tallied by source
 * and split. Sources: Narayanan et al. 2021 (SC'21, arXiv:2104.04473) Table 1, the ten
 * weak-scaling runs from 1.7B on 32 A100 to 1T on 3,072, and its section 5.1 estimate for GPT-3
 * 175B on 1,024 (140 TFLOP/s); Smith et al. 2022 (arXiv:2201.11990) section 2.4, MT-NLG 530B on
 * 280 DGX A100, 60.1 s per step; BigScience's BLOOM 176B on 384 A100, about 150 TFLOP/s (BLOOM
 * model page; arXiv:2211.05100 for the cluster); MosaicML's llm-foundry FSDP benchmarks
 * (scripts/train/benchmarking/README.md, commit c90b9b3): MPT models from 125M to 70B, seq 2048,
 * FULL_SHARD (ZeRO-3) or SHARD_GRAD_OP (ZeRO-2), FlashAttention, on 8 to 512 A100 or H100, one
 * scenario per row. Two of MosaicML's four tables calibrated the profiles' "sustained" and the
 * elementwise traffic (scripts/fit_time_model.sh): "A100 40GB" and "H100 80GB BF16" (8-64 GPUs).
 * Everything else is held out. Throughputs count recompute, as the papers do. */

/* The papers' hardware FLOPs per step with full recompute (Narayanan et al. 2021, section 5.1):
 * 96 B s l h^2 (1 + s/6h + V/16lh), B the batch in sequences. */
static double narayanan_flops(const Scenario *sc)
{
	double B = (double)sc->ds.train_batch, s = (double)sc->seq, l = (double)sc->model.L;
	double h = (double)sc->model.h, V = (double)sc->model.V;
	return 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h));
}

/* The training-time metrics this suite judges. */
static int is_time_metric(const char *metric)
{
	return !strcmp(metric, "hw_tflops_per_gpu") || !strcmp(metric, "step_s") ||
	       !strcmp(metric, "tokens_per_s_per_gpu");
}

/* The predicted figure for a run's published metric, after the checks that make the two
 * comparable: for the papers' TFLOP/s and step times, the FLOP count must be the papers'; for
 * tokens/s, the parameter count must be MosaicML's NumParams where the table gives it (the
 * scenario is the model that ran) and the run must fit (it ran). */
static double published_predicted(const PublishedRun *r, const char *metric)
{
	const Prediction *pr = &r->pr;
	if (!strcmp(metric, "hw_tflops_per_gpu") || !strcmp(metric, "step_s")) {
		CU_ASSERT_DOUBLE_EQUAL(pr->time.hw_flops_per_gpu * (double)pr->plan.world /
					       narayanan_flops(&r->sc), 1, 0.02);
		return metric[0] == 'h' ? pr->time.hw_tflops_per_gpu : pr->time.step_s;
	}
	/* tokens_per_s_per_gpu; the parameter count where the source gives one (MosaicML's
	 * NumParams; the FSDP blog gives none: its scenarios name the configs that ran) */
	const cJSON *np = cJSON_GetObjectItemCaseSensitive(r->pub, "num_params");
	CU_ASSERT_FATAL(np == NULL || cJSON_IsNumber(np));
	if (np)
		CU_ASSERT_EQUAL(pr->plan.n_params, (long long)np->valuedouble);
	CU_ASSERT(pr->fits);
	return pr->time.tokens_per_s / (double)pr->plan.world;
}

/* One source's runs of one split (0 calibration, 1 held out, 2 held out but a near-copy of a
 * calibration source: same chip, model family and scale). */
typedef struct SourceTally {
	char source[48];
	int held_out;
	ErrTally t;
} SourceTally;

static const char *const SPLIT_NAMES[] = {"calibration", "held-out", "near-copy"};

static ErrTally *source_tally(SourceTally *st, int *n, int max, const char *source, int held_out)
{
	for (int i = 0; i < *n; i++)
		if (!strcmp(st[i].source, source) && st[i].held_out == held_out)
			return &st[i].t;
	CU_ASSERT_FATAL(*n < max);
	SourceTally *s = &st[(*n)++];
	memset(s, 0, sizeof(*s));
	snprintf(s->source, sizeof(s->source), "%s", source);
	s->held_out = held_out;
	return &s->t;
}

/* Guards against regressions at the errors of the time model when these runs were first judged
 * (docs/time_model.md), not the targets, which are not met: the papers' runs 22% each and 7% mean
 * (three of the thirteen are outside the issue's 10%: MT-NLG, the 1T and the 1.7B runs), the
 * first raised to 23% when the pipeline's sends became each tensor-parallel rank's 1/t (DeepSpeed's
 * pipe engine, pipe/engine.py PartitionedTensor; Megatron-LM's scatter_gather_tensors_in_pipeline):
 * a mechanism read off their code, which moved MT-NLG from -20.6% to -22.2%,
 * MosaicML's held-out tables 12% each and 5% mean (one run is outside 10%), and the mean over
 * every held-out run that is not a near-copy 6.5% (6.0% when the manifest first marked MosaicML's
 * "A100 80GB" table a near-copy of its "A100 40GB" one; the issue's target is 5%). */
#define PAPERS_MAX 0.23
#define PAPERS_MEAN 0.07
/* The PyTorch FSDP blog's runs (framework fsdp), first judged at -0.1% to -12.2% (7B on A100;
 * -12.1% since the gradient norm's all-reduce took FSDP's process group), 5.9% mean */
#define FSDP_BLOG_MAX 0.13
#define FSDP_BLOG_MEAN 0.06
#define MOSAIC_HELD_MAX 0.12
#define MOSAIC_HELD_MEAN 0.05
#define HELD_MEAN_GUARD 0.065

/* Every time run of the manifest predicted, printed and tallied by source and split; then the
 * guards and the calibration fit (the geometric mean of predicted over published on the
 * calibration tables must be 1 within the 3 digits the fit is rounded to, 1%, else the profiles
 * and the script disagree). The issue's targets, every held-out run under 10% and their mean
 * under 5%, are not met; the table shows which runs miss them. */
static void test_published_runs(void)
{
	JsonDoc man;
	const cJSON *runs = px_manifest_runs(&man);
	SourceTally st[16];
	int n_src = 0;
	ErrTally held = {0}, cal = {0}, near = {0}, papers = {0}, mosaic_held = {0}, fsdp_blog = {0};
	printf("\n# held-out published runs (default profiles)\n# %-40s %6s %-20s %10s %10s %8s",
	       "scenario", "GPUs", "metric", "published", "predicted", "error");
	const cJSON *run;
	cJSON_ArrayForEach(run, runs) {
		PxPublishedRun mr = px_manifest_run(&man, run);
		int held_out = mr.near_copy_of ? 2 : mr.held_out;
		if (!is_time_metric(mr.metric)) /* another suite's (inference, memory) */
			continue;
		PublishedRun r;
		if (published_load(&r, px_test_path(mr.scenario)))
			continue;
		double predicted = published_predicted(&r, mr.metric);
		const cJSON *pub = cJSON_GetObjectItemCaseSensitive(r.pub, mr.metric);
		CU_ASSERT_FATAL(cJSON_IsNumber(pub));
		ErrTally *split_t[] = {&cal, &held, &near};
		double e = tally(split_t[held_out], predicted, pub->valuedouble);
		tally(source_tally(st, &n_src, 16, mr.source, held_out), predicted,
		      pub->valuedouble);
		int mosaic = !strncmp(mr.source, "mosaicml", 8);
		int blog = !strcmp(mr.source, "ibm-fsdp-blog");
		if (held_out) {
			tally(mosaic ? &mosaic_held : blog ? &fsdp_blog : &papers, predicted,
			      pub->valuedouble);
			CU_ASSERT(fabs(e) <= (mosaic ? MOSAIC_HELD_MAX : blog ? FSDP_BLOG_MAX :
							      PAPERS_MAX));
			const char *name = strrchr(mr.scenario, '/') + 1;
			printf("\n# %-40.*s %6lld %-20s %10.1f %10.1f %+7.1f%%",
			       (int)(strlen(name) - 5), name, r.pr.plan.world, mr.metric,
			       pub->valuedouble, predicted, 100 * e);
		}
		published_free(&r);
	}
	printf("\n# by source:\n# %-22s %-12s %5s %12s %8s", "source", "split", "runs",
	       "mean |error|", "worst");
	for (int i = 0; i < n_src; i++)
		printf("\n# %-22s %-12s %5d %11.1f%% %7.1f%%", st[i].source,
		       SPLIT_NAMES[st[i].held_out], st[i].t.n,
		       100 * st[i].t.sum_abs / st[i].t.n, 100 * st[i].t.max_abs);
	printf("\n# all %d held-out runs: mean |error| %.2f%%, worst %.1f%% (target: each under 10%%, "
	       "mean under 5%%); %d near-copies apart: mean %.1f%%; calibration: %d runs, mean "
	       "|error| %.1f%%, geometric mean of predicted/published %.4f ", held.n,
	       100 * held.sum_abs / held.n, 100 * held.max_abs, near.n, 100 * near.sum_abs / near.n,
	       cal.n, 100 * cal.sum_abs / cal.n, exp(cal.sum_log / cal.n));
	CU_ASSERT_EQUAL(held.n, 37);
	CU_ASSERT_EQUAL(fsdp_blog.n, 6);
	CU_ASSERT(fsdp_blog.sum_abs / fsdp_blog.n <= FSDP_BLOG_MEAN);
	CU_ASSERT_EQUAL(near.n, 11);
	CU_ASSERT_EQUAL(papers.n, 13);
	CU_ASSERT_EQUAL(mosaic_held.n, 29);
	CU_ASSERT_EQUAL(cal.n, 59);
	CU_ASSERT(papers.sum_abs / papers.n <= PAPERS_MEAN);
	CU_ASSERT(mosaic_held.sum_abs / mosaic_held.n <= MOSAIC_HELD_MEAN);
	CU_ASSERT(fabs(cal.sum_log / cal.n) < 0.01);
	CU_ASSERT(held.sum_abs / held.n <= HELD_MEAN_GUARD);
	jdoc_free(&man);
}

/* ---- failures ---- */

/* Stage 1 waits for activations stage 0 never sends: the replay says so instead of hanging. */
static void test_unmatched_receive(void)
{
	Scenario sc;
	Prediction pr;
	HwProfile hw;
	Schedule s0, s1, *stages[2] = {&s0, &s1};
	TimeResult r;
	PxError err = {0};
	if (fx_predictf(&sc, &pr,
			 "{" SMALL_GPT ", \"deepspeed\": {\"train_micro_batch_size_per_gpu\": 1},"
			 " \"cluster\": {\"gpu\": \"A100-80GB\", \"nodes\": 1, \"gpus_per_node\": 2},"
			 " \"seq_length\": 512, \"parallelism\": {\"pp\": 2}}"))
		return;
	compute_only_profile(&hw);
	sched_init(&s0, 0);
	sched_compute(&s0, COMP_FWD, -1, 1e9, 0);
	sched_init(&s1, 1);
	sched_coll(&s1, COLL_P2P_RECV, ROLE_FORWARD, GROUP_PP, 2, -1, 1024, 2, -1, 0);
	sched_compute(&s1, COMP_FWD, -1, 1e9, 0);
	CU_ASSERT_EQUAL(timeline_run(&pr.plan, stages, &hw, &r, &err), -1);
	CU_ASSERT_EQUAL(err.code, PX_ERR_RUNTIME);
	CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "stage 1 is stuck at op 0 (p2p_recv over pp)"));
	sched_free(&s0);
	sched_free(&s1);
	fx_free(&sc, &pr);
}

/* V100 has no bf16 peak in the catalog: a bf16 step cannot be timed, and the message says which
 * key to set. */
static void test_missing_peak(void)
{
	Scenario sc;
	Prediction pr;
	HwProfile hw;
	TimeResult r;
	PxError err = {0};
	Schedule *stages[1];
	if (fx_predictf(&sc, &pr,
			 "{" SMALL_GPT ", \"deepspeed\": {\"train_micro_batch_size_per_gpu\": 1,"
			 " \"bf16\": {\"enabled\": true}}, \"cluster\": {\"gpu\": \"V100-32GB\","
			 " \"nodes\": 1, \"gpus_per_node\": 8}, \"seq_length\": 512}"))
		return;
	hwprofile_default(&sc.cluster.gpu, &hw);
	stages[0] = &pr.stages[0].sched;
	CU_ASSERT_EQUAL(timeline_run(&pr.plan, stages, &hw, &r, &err), -1);
	CU_ASSERT_EQUAL(err.code, PX_ERR_INPUT);
	CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "cluster.tflops_bf16: V100-32GB has no bf16 peak"));
	fx_free(&sc, &pr);
}

/* ---- hardware profiles ---- */

/* y is linear in log(x) between points and flat outside: (1e9, 0.2)-(1e11, 0.8) gives 0.5 at
 * 1e10 (halfway in log), 0.35 at 10^9.5, and the end values beyond. */
static void test_curve(void)
{
	HwCurve c = {2, {1e9, 1e11}, {0.2, 0.8}};
	CU_ASSERT_DOUBLE_EQUAL(hw_curve_eval(&c, 1e10), 0.5, 1e-12);
	CU_ASSERT_DOUBLE_EQUAL(hw_curve_eval(&c, pow(10, 9.5)), 0.35, 1e-12);
	CU_ASSERT_DOUBLE_EQUAL(hw_curve_eval(&c, 1e3), 0.2, 0);
	CU_ASSERT_DOUBLE_EQUAL(hw_curve_eval(&c, 1e15), 0.8, 0);
	CU_ASSERT_DOUBLE_EQUAL(hw_curve_eval(&c, 0), 0.2, 0);
}

/* Every key except comments has a "_key" string beside it: each figure cites its source. */
static void check_sources(const cJSON *obj, const char *path)
{
	const cJSON *m;
	cJSON_ArrayForEach(m, obj) {
		char src[128];
		if (m->string[0] == '_')
			continue;
		if (cJSON_IsObject(m)) { /* a section: its fields cite their sources */
			check_sources(m, path);
			continue;
		}
		snprintf(src, sizeof(src), "_%s", m->string);
		const cJSON *s = cJSON_GetObjectItemCaseSensitive(obj, src);
		if (!cJSON_IsString(s) || strlen(s->valuestring) < 10)
			fprintf(stderr, "\n%s: %s has no source\n", path, m->string);
		CU_ASSERT(cJSON_IsString(s) && strlen(s->valuestring) >= 10);
	}
}

/* The bundled scenarios/hardware/<gpu>.json of every catalog GPU spells out every field (none
 * taken from a base), equals the built-in default field for field, and cites its sources. */
static void test_bundled_profiles_equal_defaults(void)
{
	for (const GpuSpec *g = cluster_gpu_catalog; g->name; g++) {
		char rel[128], what[64] = "";
		HwProfile file, builtin;
		PxError err = {0};
		JsonDoc d = {0};
		snprintf(rel, sizeof(rel), "scenarios/hardware/%s.json", g->name);
		CU_ASSERT_EQUAL(hwprofile_default(g, &builtin), 0);
		if (hwprofile_load(px_test_path(rel), &file, &err)) {
			fprintf(stderr, "\n%s\n", err.msg);
			CU_FAIL("bundled profile does not load");
			continue;
		}
		CU_ASSERT_EQUAL(file.from_base, 0);
		int same = hwprofile_equal(&file, &builtin, what, sizeof(what));
		if (!same)
			fprintf(stderr, "\n%s: %s differs from the built-in default\n", rel, what);
		CU_ASSERT(same);
		CU_ASSERT_STRING_EQUAL(file.gpu, g->name);
		if (jdoc_load_file(&d, px_test_path(rel), &err) == 0)
			check_sources(d.root, rel);
		jdoc_free(&d);
	}
	/* a GPU without a profile gets the fallback and is told so */
	GpuSpec other = cluster_gpu_catalog[0];
	HwProfile hw;
	other.name = "B200";
	CU_ASSERT_EQUAL(hwprofile_default(&other, &hw), -1);
	CU_ASSERT_STRING_EQUAL(hw.gpu, "B200");
}

/* Naming a catalog GPU starts from its default: one field given, the other 18 from the base. */
static void test_profile_with_base(void)
{
	char path[512], what[64] = "";
	HwProfile hw, base;
	PxError err = {0};
	snprintf(path, sizeof(path), "%s/hw.json", px_test_tmpdir());
	px_test_write_file(path, "{\"gpu\": \"h100-sxm\", \"host\": {\"pcie_efficiency\": 0.5}}\n");
	CU_ASSERT_EQUAL_FATAL(hwprofile_load(path, &hw, &err), 0);
	hwprofile_default(cluster_find_gpu("H100-SXM"), &base);
	CU_ASSERT_STRING_EQUAL(hw.gpu, "H100-SXM");
	CU_ASSERT_EQUAL(hw.from_base, 21);
	CU_ASSERT_DOUBLE_EQUAL(hw.pcie_efficiency, 0.5, 0);
	CU_ASSERT_FALSE(hwprofile_equal(&hw, &base, what, sizeof(what)));
	CU_ASSERT_STRING_EQUAL(what, "host.pcie_efficiency");
	hw.pcie_efficiency = base.pcie_efficiency;
	CU_ASSERT(hwprofile_equal(&hw, &base, what, sizeof(what)));
	/* a link written before base_s existed (parallax calibrate's, or by hand) gives alpha_s
	 * alone, which held a call's whole latency: its base is 0, not the GPU's 6.6 us; a link
	 * the file leaves out takes the GPU's both */
	CU_ASSERT_DOUBLE_EQUAL(base.nvlink.base_s, 6.6e-6, 0);
	px_test_write_file(path, "{\"gpu\": \"h100-sxm\", \"nvlink\": {\"alpha_s\": 2e-6}}\n");
	CU_ASSERT_EQUAL_FATAL(hwprofile_load(path, &hw, &err), 0);
	CU_ASSERT_DOUBLE_EQUAL(hw.nvlink.alpha_s, 2e-6, 0);
	CU_ASSERT_DOUBLE_EQUAL(hw.nvlink.base_s, 0, 0);
	CU_ASSERT_DOUBLE_EQUAL(hw.network.base_s, 6.6e-6, 0);
}

/* Bad input: each error names FILE:LINE:COL (of the key, or of the array element at fault), the
 * key and what was expected. Positions are counted in the texts below (1-based). */
static void check_bad(const char *text, const char *expected)
{
	char path[512], want[1024];
	HwProfile hw;
	PxError err = {0};
	snprintf(path, sizeof(path), "%s/hw.json", px_test_tmpdir());
	px_test_write_file(path, text);
	snprintf(want, sizeof(want), "%s:%s", path, expected);
	CU_ASSERT_EQUAL(hwprofile_load(path, &hw, &err), -1);
	CU_ASSERT_EQUAL(err.code, PX_ERR_INPUT);
	if (strcmp(err.msg, want))
		fprintf(stderr, "\nexpected: %s\n     got: %s\n", want, err.msg);
	CU_ASSERT_STRING_EQUAL(err.msg, want);
}

static void test_profile_errors(void)
{
	/* line 3: the misspelt key's value at column 15 */
	check_bad("{\"gpu\": \"A100-80GB\",\n"
		  " \"nvlink\": {\n"
		  "   \"alpah_s\": 1e-6}}\n",
		  "3:15: unknown key 'nvlink.alpah_s'; did you mean 'nvlink.alpha_s'?");
	/* the second point, at line 2 column 35, is not above the first */
	check_bad("{\"gpu\": \"A100-80GB\", \"network\": {\n"
		  "  \"efficiency\": [[16777216, 0.5], [1048576, 0.6]]}}\n",
		  "2:35: network.efficiency[1]: expected message_bytes above the previous point's "
		  "1.67772e+07, got [1048576,0.6]");
	/* a fraction above 1 (its value at column 47) */
	check_bad("{\"gpu\": \"H200\", \"compute\": {\"hbm_efficiency\": 1.5}}",
		  "1:47: compute.hbm_efficiency: expected a number above 0 and at most 1, got 1.5");
	/* a point that is not a pair: the second element starts at column 61 */
	check_bad("{\"gpu\": \"H200\", \"compute\": {\"gemm_efficiency\": [[1e9, 0.5], [2e9]]}}",
		  "1:61: compute.gemm_efficiency[1]: expected a point [flops, fraction], got "
		  "[2000000000]");
	/* an unknown GPU (its name at column 9) */
	check_bad("{\"gpu\": \"B200\"}",
		  "1:9: gpu: expected one of V100-32GB, A100-40GB, A100-80GB, H100-SXM, H100-PCIe, "
		  "H200, got \"B200\"");
	/* a comment must be text (the 3 at column 28) */
	check_bad("{\"gpu\": \"H200\", \"_source\": 3}",
		  "1:28: _source: expected a string (a comment or a source), got 3");
	/* malformed JSON (jdoc's message) */
	check_bad("{\"gpu\": \"H200\",, }", "1:16: malformed JSON near ', }'");

	/* without "gpu" every field is required: the first missing one is named */
	char path[512], want[700];
	HwProfile hw;
	PxError err = {0};
	snprintf(path, sizeof(path), "%s/hw.json", px_test_tmpdir());
	px_test_write_file(path, "{\"compute\": {\"hbm_efficiency\": 0.9}}");
	CU_ASSERT_EQUAL(hwprofile_load(path, &hw, &err), -1);
	snprintf(want, sizeof(want), "%s: compute.gemm_efficiency: expected a value: the key is "
		 "missing (or name a catalog GPU in \"gpu\" to start from its profile)", path);
	CU_ASSERT_STRING_EQUAL(err.msg, want);
}

int test_time_register(void)
{
	return PX_ADD_SUITE("time",
			    {"pipeline bubble (m+p-1)(tf+tb)", test_pipeline_bubble},
			    {"interleaved bubble (p-1)(tf+tb)/v", test_interleaved_bubble},
			    {"pipeline transfer vs bubble", test_pipeline_transfer},
			    {"overlap_comm hides a reduction", test_overlap_comm},
			    {"DistributedDataParallel's buckets overlap the backward", test_ddp_overlap},
			    {"ring collective formulas, latency-bound ones too", test_ring_collectives},
			    {"compute and copy formulas", test_compute_and_copy_formulas},
			    {"offload stall and CPU Adam", test_offload_stall},
			    {"repeat block: extrapolation = full replay",
			     test_extrapolation_equals_full_replay},
			    {"1F1B steady state: extrapolation = full replay",
			     test_pipeline_steady_state_equals_full_replay},
			    {"1,000-GPU scenarios replay", test_large_scenarios},
			    {"FlashAttention's kernel and memory", test_flash_attention_formulas},
			    {"FlashAttention refused where it cannot run", test_flash_refused},
			    {"host overhead: a tiny model's passes take their kernels' issue time",
			     test_host_bound},
			    {"selective recompute: the attention core, by hand",
			     test_selective_recompute_formulas},
			    {"held-out published runs (first table, MosaicML) and the mean target",
			     test_published_runs},
			    {"unmatched pipeline receive", test_unmatched_receive},
			    {"missing dtype peak", test_missing_peak},
			    {"curve interpolation in log space", test_curve},
			    {"bundled profiles = built-in defaults", test_bundled_profiles_equal_defaults},
			    {"profile with a base GPU", test_profile_with_base},
			    {"profile errors name file:line:col", test_profile_errors});
}

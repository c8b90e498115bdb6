/* 3D parallelism, MoE and ZeRO++: Korthikanti et al. 2022 Table 2 through the planner, pipeline
 * in-flight micro-batches per schedule, Megatron's tensor-parallel traffic, DeepSpeed MoE capacity
 * and all-to-all volumes, ZeRO++'s cross-node reduction, topology splits, and the refusals.
 * Sources: shared/reference/activations.md and communication.md. */
#include <CUnit/CUnit.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "../engine/build.h"
#include "fixtures.h"
#include "suites.h"

/* A GPT-2-style model whose dimensions divide by every degree used here: h = 256, 8 heads,
 * 8 layers, V = 1024. With dropout, kv = h and I = 4h it is the layer Korthikanti assumes. */
#define SMALL_GPT                                                                              \
	"\"model\": {\"model_type\": \"gpt2\", \"n_embd\": 256, \"n_head\": 8, \"n_layer\": 8,"  \
	" \"n_positions\": 512, \"vocab_size\": 1024}"

/* An untied Llama-style model (no dropout, no biases), every tensor divisible by 16. */
#define SMALL_LLAMA                                                                            \
	"\"model\": {\"model_type\": \"llama\", \"hidden_size\": 256, \"num_hidden_layers\": 4," \
	" \"num_attention_heads\": 4, \"intermediate_size\": 1024, \"vocab_size\": 32000,"       \
	" \"max_position_embeddings\": 512}"

/* ---- activations: Korthikanti Table 2 through the planner ---- */

static void check_layer(int t, int sp, const char *ckpt, double expected_act, double expected_ckpt)
{
	Scenario sc;
	Prediction pr;
	if (fx_predictf(&sc, &pr,
			 "{" SMALL_GPT ", \"deepspeed\": {\"train_micro_batch_size_per_gpu\": 2,"
			 " \"bf16\": {\"enabled\": true}}, \"cluster\": {\"gpu\": \"H100-SXM\","
			 " \"nodes\": 1, \"gpus_per_node\": %d}, \"seq_length\": 512,"
			 " \"activation_checkpointing\": \"%s\","
			 " \"parallelism\": {\"tp\": %d, \"sequence_parallel\": %s}}",
			 t, ckpt, t, sp ? "true" : "false"))
		return;
	CU_ASSERT_DOUBLE_EQUAL(pr.plan.units[1].act_bytes, expected_act, 1e-6 * expected_act);
	if (expected_ckpt > 0)
		CU_ASSERT_DOUBLE_EQUAL(pr.plan.units[1].ckpt_bytes, expected_ckpt, 0);
	fx_free(&sc, &pr);
}

static void test_korthikanti_through_planner(void)
{
	double s = 512, b = 2, h = 256, a = 8, sbh = s * b * h, as_h = 5 * a * s / h;
	for (int t = 1; t <= 8; t *= 2) {
		/* tensor parallel: sbh(10 + 24/t + 5as/(ht)) (t = 1: sbh(34 + 5as/h)) */
		check_layer(t, 0, "none", sbh * (10 + 24.0 / t + as_h / t), 0);
		/* tensor + sequence parallel: sbh(34/t + 5as/(ht)) */
		check_layer(t, 1, "none", sbh * (34.0 / t + as_h / t), 0);
		/* selective recompute: sbh(10 + 24/t), and 34 sbh / t with sequence parallelism */
		check_layer(t, 0, "selective", sbh * (10 + 24.0 / t), 0);
		check_layer(t, 1, "selective", 34 * sbh / t, 0);
		/* full recompute keeps the layer input: 2sbh, split by t with sequence parallelism */
		check_layer(t, 0, "full", sbh * (10 + 24.0 / t + as_h / t), 2 * sbh);
		check_layer(t, 1, "full", sbh * (34.0 / t + as_h / t), 2 * sbh / t);
	}
}

/* ---- pipeline: activations in flight on the first stage ---- */

/* The most block activations live at once in stage `stage`'s schedule. */
static int max_live_blocks(const Schedule *s)
{
	return fx_live_bufs(s, 0, BUF_ACTIVATIONS, NULL, NULL);
}

/* 8 layers on pp = 4 stages, m = 8 micro-batches, no recompute: the first stage holds p
 * micro-batches under 1F1B (p x 2 layers = 8 layer activations), m under GPipe (16), and under
 * the interleaved schedule with v = 2 the paper's L(1 + (p-1)/(pv)) = 8 x 11/8 = 11. The last
 * stage of 1F1B holds one micro-batch (2). */
static void check_inflight(const char *sched, int v, int first, int last, int first_worst)
{
	Scenario sc;
	Prediction pr;
	if (fx_predictf(&sc, &pr,
			 "{" SMALL_GPT ", \"deepspeed\": {\"train_micro_batch_size_per_gpu\": 1,"
			 " \"gradient_accumulation_steps\": 8, \"bf16\": {\"enabled\": true}},"
			 " \"cluster\": {\"gpu\": \"H100-SXM\", \"nodes\": 1, \"gpus_per_node\": 4},"
			 " \"seq_length\": 256, \"parallelism\": {\"pp\": 4, \"pipeline_schedule\":"
			 " \"%s\", \"virtual_stages\": %d, \"partition_method\": \"uniform\"}}",
			 sched, v))
		return;
	CU_ASSERT_EQUAL(pr.n_stages, 4);
	CU_ASSERT_EQUAL(max_live_blocks(&pr.stages[0].sched), first);
	CU_ASSERT_EQUAL(max_live_blocks(&pr.stages[3].sched), last);
	if (first_worst) /* 1F1B's first stage is the memory worst case */
		CU_ASSERT_EQUAL(pr.worst, 0);
	fx_free(&sc, &pr);
}

static void test_inflight_counts(void)
{
	check_inflight("1f1b", 1, 8, 2, 1);
	/* GPipe: every stage holds all m; the last one, with the logits, is the worst */
	check_inflight("gpipe", 1, 16, 16, 0);
	/* interleaved: stage s warms up with (p - s - 1) * 2 + (v - 1) * p chunk forwards, so the
	 * last stage holds 0 + 4 + 1 = 5 one-layer chunks */
	check_inflight("interleaved", 2, 11, 5, 1);
}

/* The order itself: 1F1B on stage s of p runs p - s - 1 warm-up forwards, then alternates. */
static void test_1f1b_order(void)
{
	PipeStep st[16];
	int n = pipe_order(PIPE_1F1B, 4, 1, 4, 1, st); /* stage 1 of 4, 4 micro-batches */
	CU_ASSERT_EQUAL(n, 8);
	const int fwd[8] = {1, 1, 1, 0, 1, 0, 0, 0}, mb[8] = {0, 1, 2, 0, 3, 1, 2, 3};
	for (int i = 0; i < 8; i++) {
		CU_ASSERT_EQUAL(st[i].forward, fwd[i]);
		CU_ASSERT_EQUAL(st[i].mb, mb[i]);
	}
	/* p2p: stage 1 of 4 receives and sends b s h elements per micro-batch each way */
}

/* ---- Megatron tensor parallelism: 8bsh(t-1)/t elements per layer per micro-batch ---- */

static double block_tp_wire(const Schedule *s, int L)
{
	double wire = 0;
	for (int i = s->step_begin; i < s->n; i++) {
		const Op *op = &s->ops[i];
		if (op->kind == OP_COLL && op->group == GROUP_TP && op->unit >= 1 && op->unit <= L)
			wire += traffic_ring_wire_bytes(op->sub, op->bytes, op->nranks);
	}
	return wire;
}

/* Narayanan et al. 2021 count 4 all-reduces of bsh elements per layer per micro-batch, each
 * sending 2(t-1)/t of it: 8bsh(t-1)/t elements, 16bsh(t-1)/t bytes in 16-bit. With sequence
 * parallelism each all-reduce becomes a reduce-scatter and an all-gather, the same bytes
 * (Korthikanti et al. 2022, section 4.2.2), and Megatron-LM's column-split layers gather their
 * input again in backward instead of keeping it (LinearWithGradAccumulationAndAsyncCommunication
 * under sequence_parallel): 2 more all-gathers of bsh a layer, each sending (t-1)/t of it:
 * 10bsh(t-1)/t elements in all. */
static void test_megatron_tp_traffic(void)
{
	for (int sp = 0; sp <= 1; sp++)
		for (int t = 2; t <= 8; t *= 2) {
			Scenario sc;
			Prediction pr;
			if (fx_predictf(&sc, &pr,
					 "{" SMALL_GPT ", \"deepspeed\": {\"train_micro_batch_size_per_gpu\": 2,"
					 " \"bf16\": {\"enabled\": true}}, \"cluster\": {\"gpu\": \"A100-80GB\","
					 " \"nodes\": 1, \"gpus_per_node\": %d}, \"seq_length\": 512,"
					 " \"parallelism\": {\"tp\": %d, \"sequence_parallel\": %s}}",
					 t, t, sp ? "true" : "false"))
				return;
			double bsh = 2.0 * 512 * 256, L = 8;
			double elems = (sp ? 10 : 8) * bsh * (t - 1) / t;
			CU_ASSERT_DOUBLE_EQUAL(block_tp_wire(&pr.stages[0].sched, 8), L * elems * 2,
					       1e-6 * L * elems);
			fx_free(&sc, &pr);
		}
}

/* An encoder-decoder under tensor parallelism (T5 as DeepSpeed's AutoTP or Megatron's T5 split
 * it), worked by hand per micro-batch: the encoder's blocks are Megatron's (an all-reduce after
 * attention and after the MLP forward, one per input gradient backward, b s h elements each);
 * a decoder block has a third sublayer, its attention over the encoder: 3 forward and 3 backward
 * of b s_dec h, plus in backward the gradient of the encoder output its K and V read, b s h. The
 * shared embedding reduces both stacks' lookups (b s h + b s_dec h); the head reduces 3 fp32 per
 * decoder token forward and b s_dec h backward. t5-base: h 768, 12 + 12 blocks, s 512, s_dec 128,
 * b 2, bf16, t = 4, no recompute, one micro-batch per step. */
static void test_t5_tp_traffic(void)
{
	Scenario sc;
	Prediction pr;
	if (fx_predictf(&sc, &pr,
			 "{%s, \"deepspeed\": {\"train_micro_batch_size_per_gpu\": 2,"
			 " \"gradient_accumulation_steps\": 1, \"bf16\": {\"enabled\": true}},"
			 " \"cluster\": {\"gpu\": \"A100-80GB\", \"nodes\": 1, \"gpus_per_node\": 4},"
			 " \"seq_length\": 512, \"decoder_seq_length\": 128, \"parallelism\": {\"tp\": 4}}",
			 fx_model("t5-base")))
		return;
	double b = 2, s = 512, sd = 128, h = 768, L = 12;
	double enc = L * 4 * b * s * h;                       /* 2 forward + 2 backward per block */
	double dec = L * (6 * b * sd * h + b * s * h);        /* 3 + 3, plus the encoder output */
	double ends = b * s * h + b * sd * h + b * sd * h;    /* embedding twice, head backward */
	double payload = (enc + dec + ends) * 2 + 3 * b * sd * 4; /* bf16; fp32 loss terms */
	const Schedule *sch = &pr.stages[0].sched;
	double got = 0;
	for (int i = sch->step_begin; i < sch->n; i++) {
		const Op *op = &sch->ops[i];
		if (op->kind == OP_COLL && op->group == GROUP_TP)
			got += op->bytes;
	}
	CU_ASSERT_DOUBLE_EQUAL(got, payload, 1e-9 * payload);
	fx_free(&sc, &pr);
}

/* ---- MoE (deepspeed/moe/sharded_moe.py) ---- */

static void check_capacity(long long b, long long s, long long E, long long k, double cf,
			   long long min_cap, long long expected)
{
	Scenario sc;
	Prediction pr;
	if (fx_predictf(&sc, &pr,
			 "{" SMALL_GPT ", \"moe\": {\"num_experts\": %lld, \"k\": %lld,"
			 " \"capacity_factor\": %g, \"min_capacity\": %lld}, \"deepspeed\":"
			 " {\"train_micro_batch_size_per_gpu\": %lld, \"bf16\": {\"enabled\": true}},"
			 " \"cluster\": {\"gpu\": \"H100-SXM\", \"nodes\": 1, \"gpus_per_node\": 8},"
			 " \"seq_length\": %lld, \"parallelism\": {\"ep\": %lld}}",
			 E, k, cf, min_cap, b, s, E < 8 ? E : 8))
		return;
	CU_ASSERT_EQUAL(pr.plan.moe_capacity, expected);
	fx_free(&sc, &pr);
}

static void test_moe_capacity(void)
{
	/* capacity = ceil(k * capacity_factor * S / E), at least min_capacity; S = b * s tokens */
	check_capacity(2, 512, 8, 1, 1.0, 4, 128);    /* 1024 / 8 */
	check_capacity(1, 512, 8, 2, 1.25, 4, 160);   /* ceil(2 * 1.25 * 512 / 8) */
	check_capacity(1, 100, 8, 1, 1.0, 4, 13);     /* ceil(12.5) */
	check_capacity(1, 64, 64, 1, 1.0, 8, 8);      /* ceil(1) = 1, floored at 8 */
}

/* The test model with 8 experts of top-1 routing at capacity factor 1, bf16, on H100 nodes of 8:
 * printf arguments micro-batch, the ZeRO section's members (with their leading comma, or ""),
 * nodes, sequence and the parallelism section's members. */
#define MOE8_GPT                                                                               \
	"{" SMALL_GPT ", \"moe\": {\"num_experts\": 8, \"k\": 1, \"capacity_factor\": 1},"           \
	" \"deepspeed\": {\"train_micro_batch_size_per_gpu\": %d, \"bf16\": {\"enabled\": true}%s},"  \
	" \"cluster\": {\"gpu\": \"H100-SXM\", \"nodes\": %d, \"gpus_per_node\": 8},"               \
	" \"seq_length\": %d, \"parallelism\": {%s}}"
#define ZERO2 ", \"zero_optimization\": {\"stage\": 2}"

/* Each MoE layer: 2 all-to-alls forward and 2 backward of E * C * h elements per rank, of which
 * (ep-1)/ep leaves the rank. 8 experts over ep = 8, k = 1, cf = 1, S = 1024: C = 128. */
static void test_moe_all_to_all(void)
{
	Scenario sc;
	Prediction pr;
	if (fx_predictf(&sc, &pr, MOE8_GPT, 2, ZERO2, 2, 512, "\"ep\": 8"))
		return;
	const Traffic *t = &pr.stages[0].traffic;
	double per_op = 8.0 * 128 * 256 * 2; /* E C h in bf16 */
	CU_ASSERT_EQUAL(t->n_colls[COLL_ALL_TO_ALL], 8 * 4);
	CU_ASSERT_DOUBLE_EQUAL(t->payload_bytes[COLL_ALL_TO_ALL], 8 * 4 * per_op, 0);
	CU_ASSERT_DOUBLE_EQUAL(t->wire_bytes[COLL_ALL_TO_ALL], 8 * 4 * per_op * 7 / 8, 1e-6);
	/* 16 GPUs, ep 8: edp = 2; each rank holds 1 of the 8 experts of every layer */
	CU_ASSERT_EQUAL(pr.plan.edp, 2);
	CU_ASSERT_EQUAL(pr.plan.units[1].local_expert * 8, 8LL * 2 * 256 * 1024 + 8 * (1024 + 256));
	/* expert gradients are reduced over their own group only */
	CU_ASSERT(t->group_payload_bytes[GROUP_EDP] > 0);
	CU_ASSERT_DOUBLE_EQUAL(t->group_payload_bytes[GROUP_EDP],
			       2.0 * (double)pr.plan.stages[0].flat_expert * 2, 0); /* RS + AG */
	fx_free(&sc, &pr);
}

/* json written to a fresh directory's s.json, whose path goes to path, and refused as bad input
 * (fx_refused; err holds why). */
static void expect_input_error(const char *json, char *path, size_t path_size, PxError *err)
{
	snprintf(path, path_size, "%s/s.json", px_test_tmpdir());
	px_test_write_file(path, json);
	fx_refused(path, NULL, err);
}

/* DeepSpeed's MoE layer under tensor parallelism t = 2 (deepspeed/moe/sharded_moe.py
 * MOELayer.forward, moe/mappings.py): each all-to-all carries the rank's 1/t of every expert's
 * capacity (drop_tokens), and an all-gather over the tensor-parallel group (gather_tokens) makes
 * the capacity whole again after each, forward and backward (drop_tokens' gradient). The test
 * model above at b 2, s 512 (C = 128, bf16) on 32 GPUs, tp 2, ep 8 (dp 16):
 *   all-to-all: 8 layers x 4 of E C h / t = 8 x 128 x 256 / 2 elements, 262,144 B each;
 *   tensor-parallel group: 8 x 4 all-gathers of E C h (524,288 B); all-reduces: each block's
 *   attention only, forward and backward (the MoE block's MLP has none: its output is whole
 *   once gathered), the embedding's forward and the head's input gradient, b s h (524,288 B)
 *   each, and the cross-entropy's 3 of b s fp32 values (4,096 B): 18 x 524,288 + 3 x 4,096.
 * A capacity the tensor-parallel ranks cannot split (s 100: C = ceil(12.5) = 13) is refused, as
 * DeepSpeed's _drop_tokens asserts. */
static void test_moe_tensor_parallel(void)
{
	Scenario sc;
	Prediction pr;
	if (fx_predictf(&sc, &pr, MOE8_GPT, 2, ZERO2, 4, 512, "\"ep\": 8, \"tp\": 2"))
		return;
	const Traffic *t = &pr.stages[0].traffic;
	const double ech = 8.0 * 128 * 256 * 2, bsh = 2.0 * 512 * 256 * 2;
	CU_ASSERT_EQUAL(pr.plan.moe_capacity, 128);
	CU_ASSERT_EQUAL(t->n_colls[COLL_ALL_TO_ALL], 8 * 4);
	CU_ASSERT_DOUBLE_EQUAL(t->payload_bytes[COLL_ALL_TO_ALL], 8 * 4 * ech / 2, 0);
	double gathered = 0, reduced = 0;
	int n_gathers = 0, n_reduces = 0;
	const Schedule *sch = &pr.stages[0].sched;
	for (int i = sch->step_begin; i < sch->n; i++) {
		const Op *op = &sch->ops[i];
		if (op->kind != OP_COLL || op->group != GROUP_TP)
			continue;
		if (op->sub == COLL_ALL_GATHER)
			gathered += op->bytes, n_gathers++;
		else if (op->sub == COLL_ALL_REDUCE)
			reduced += op->bytes, n_reduces++;
		else
			CU_FAIL("a tensor-parallel collective other than all-gather and all-reduce");
	}
	CU_ASSERT_EQUAL(n_gathers, 8 * 4);
	CU_ASSERT_DOUBLE_EQUAL(gathered, 8 * 4 * ech, 0);
	CU_ASSERT_EQUAL(n_reduces, 18 + 3);
	CU_ASSERT_DOUBLE_EQUAL(reduced, 18 * bsh + 3 * 4096, 0);
	fx_free(&sc, &pr);

	char json[2048], path[512];
	PxError err = {0};
	snprintf(json, sizeof(json), MOE8_GPT, 1, "", 4, 100, "\"ep\": 8, \"tp\": 2");
	expect_input_error(json, path, sizeof(path), &err);
	CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "parallelism.tp = 2 does not divide the experts' "
					       "capacity, 13 tokens"));
	CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, path));

	/* under sequence parallelism the tensor-parallel ranks hold different tokens, which
	 * drop_tokens would drop: refused (Megatron-DeepSpeed passes them unchanged) */
	snprintf(json, sizeof(json), MOE8_GPT, 1, "", 4, 512,
		 "\"ep\": 8, \"tp\": 2, \"sequence_parallel\": true");
	expect_input_error(json, path, sizeof(path), &err);
	CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "parallelism.sequence_parallel with DeepSpeed's "
					       "MoE layer"));
	CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, path));
}

/* DeepSpeed's MoE layer without drop_tokens (sharded_moe.py top1gating, top2gating): the
 * capacity is the busiest expert's count, all-reduced (max) over the expert-parallel group, an
 * int64 each time the gate runs; the prediction estimates it as moe.imbalance x the mean. The
 * test model (8 experts, 8 layers each an MoE layer) at b 2, s 512: S = 1024 tokens a rank,
 * mean 128 (top-1), 256 (top-2).
 *   imbalance 1.5: 192, not raised to min_capacity 256 (dropping would: 256);
 *   imbalance 20: 2560, but no expert receives more than the rank's 1024 tokens: 1024;
 *   top-2 at 1.5: 384;
 *   tp 2 at 1.001: ceil(128.128) = 129, padded to a multiple of tp: 130.
 * One 8-byte all-reduce over the expert-parallel group per MoE layer and micro-batch forward,
 * none backward (4 all-to-alls a layer and micro-batch, 6 with recompute; 4 micro-batches at
 * 16 GPUs, 8 at tp 2); with full recompute the gate runs again: twice as many. */
static void test_moe_dropless(void)
{
	static const struct {
		const char *moe, *par, *extra;
		long long cap;
	} cases[] = {
		{"\"k\": 1, \"imbalance\": 1.5, \"min_capacity\": 256", "\"ep\": 8", "", 192},
		{"\"k\": 1, \"imbalance\": 20", "\"ep\": 8", "", 1024},
		{"\"k\": 2, \"imbalance\": 1.5", "\"ep\": 8", "", 384},
		{"\"k\": 1, \"imbalance\": 1.001", "\"ep\": 4, \"tp\": 2", "", 130},
		{"\"k\": 1, \"imbalance\": 1.5", "\"ep\": 8",
		 ", \"activation_checkpointing\": \"full\"", 192},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		Scenario sc;
		Prediction pr;
		if (fx_predictf(&sc, &pr, "{" SMALL_GPT ", \"moe\": {\"num_experts\": 8, "
				"\"drop_tokens\": false, %s}, \"deepspeed\": {\"train_batch_size\": 128, "
				"\"train_micro_batch_size_per_gpu\": 2, \"bf16\": {\"enabled\": true}, "
				"\"zero_optimization\": {\"stage\": 2}}, \"cluster\": {\"gpu\": "
				"\"H100-SXM\", \"nodes\": 2, \"gpus_per_node\": 8}, \"seq_length\": 512, "
				"\"parallelism\": {%s}%s}", cases[i].moe, cases[i].par, cases[i].extra))
			continue;
		CU_ASSERT_EQUAL(pr.plan.moe_capacity, cases[i].cap);
		int reduces = 0, fwd = 0;
		const Schedule *sch = &pr.stages[0].sched;
		for (int j = sch->step_begin; j < sch->n; j++) {
			const Op *op = &sch->ops[j];
			if (op->kind != OP_COLL || op->group != GROUP_EP || op->sub != COLL_ALL_REDUCE)
				continue;
			reduces++;
			fwd += op->role != ROLE_BACKWARD;
			CU_ASSERT(op->elems == 1 && op->bytes == 8);
		}
		/* the schedule's repeat block holds one micro-batch: 8 layers' gates */
		int want = (strstr(cases[i].extra, "full") ? 2 : 1) * 8;
		CU_ASSERT_EQUAL(reduces, want);
		CU_ASSERT_EQUAL(fwd, want);
		CU_ASSERT_EQUAL(pr.plan.m, strstr(cases[i].par, "tp") ? 8 : 4);
		CU_ASSERT_EQUAL(pr.stages[0].traffic.n_colls[COLL_ALL_TO_ALL],
				(strstr(cases[i].extra, "full") ? 6 : 4) * 8 * pr.plan.m);
		fx_free(&sc, &pr);
	}
}

/* Without drop_tokens and without moe.imbalance, the capacity is the busiest expert's count
 * expected under uniform routing, checked against a simulation: S = 1024 tokens a rank (b 2,
 * s 512), each choosing k of 8 experts uniformly (k distinct), counted per expert on each of the
 * ep ranks of a group, the largest over all E ep counts (the gate's max all-reduce) averaged
 * over 2000 trials. The prediction (a normal approximation, the counts taken as independent) is
 * held within 2.5% of that mean, a few times the approximation's own error and the simulation's
 * (its standard error about 0.1 token); the mean count is 128 (k 1) or 256 (k 2), so a
 * prediction of the mean, or of the busiest over the experts of one rank when ep is 8, misses
 * it by more. Measured: 153 against 153.83 (top-1, ep 8), 289 / 289.12 (top-2, ep 8),
 * 144 / 144.43 (top-1, ep 1), 281 / 281.47 (top-2, ep 2). */
static void test_moe_dropless_uniform(void)
{
	static const struct { int k, ep; } cases[] = {{1, 8}, {2, 8}, {1, 1}, {2, 2}};
	enum { S = 1024, E = 8, TRIALS = 2000 };
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		Scenario sc;
		Prediction pr;
		char par[64];
		snprintf(par, sizeof(par), "\"ep\": %d", cases[i].ep);
		if (fx_predictf(&sc, &pr, "{" SMALL_GPT ", \"moe\": {\"num_experts\": 8, \"k\": %d, "
				"\"drop_tokens\": false}, \"deepspeed\": {\"train_micro_batch_size_per_gpu"
				"\": 2, \"bf16\": {\"enabled\": true}}, \"cluster\": {\"gpu\": "
				"\"H100-SXM\", \"nodes\": 1, \"gpus_per_node\": 8}, \"seq_length\": 512, "
				"\"parallelism\": {%s}}", cases[i].k, par))
			continue;
		unsigned long long x = 99 + i;
		double sum = 0;
		for (int t = 0; t < TRIALS; t++) {
			int most = 0;
			for (int r = 0; r < cases[i].ep; r++) {
				int count[E] = {0};
				for (int s = 0; s < S; s++) {
					int first = -1;
					for (int j = 0; j < cases[i].k; j++) {
						int e;
						do { /* a uniform expert, another than the first */
							x = x * 6364136223846793005ULL +
							    1442695040888963407ULL;
							e = (int)((x >> 33) % E);
						} while (e == first);
						first = e;
						count[e]++;
					}
				}
				for (int e = 0; e < E; e++)
					most = count[e] > most ? count[e] : most;
			}
			sum += most;
		}
		double mean = sum / TRIALS, got = (double)pr.plan.moe_capacity;
		printf("\n# top-%d, ep %d: capacity %.0f, simulated busiest %.2f", cases[i].k,
		       cases[i].ep, got, mean);
		CU_ASSERT_DOUBLE_EQUAL(got, mean, 0.025 * mean);
		fx_free(&sc, &pr);
	}
}

/* Mixtral-8x7B's published parameter count (Hugging Face num_parameters()). */
static void test_mixtral_count(void)
{
	Scenario sc;
	Prediction pr;
	if (fx_predictf(&sc, &pr,
			 "{%s, \"deepspeed\": {\"train_micro_batch_size_per_gpu\": 1},"
			 " \"cluster\": {\"gpu\": \"H100-SXM\", \"nodes\": 1, \"gpus_per_node\": 8},"
			 " \"seq_length\": 4096, \"parallelism\": {\"ep\": 8}}",
			 fx_model("mixtral-8x7b")))
		return;
	CU_ASSERT(fabs(sc.model.n_params - 46702792704.0) / 46702792704.0 < 1e-3);
	CU_ASSERT_EQUAL(sc.model.experts, 8);
	CU_ASSERT_EQUAL(sc.model.top_k, 2);
	fx_free(&sc, &pr);
}

/* ---- ZeRO++: cross-node volume 3M -> 0.75M (arXiv 2306.10209) ---- */

/* The paper counts what crosses the network per node, M = model bytes: ZeRO-3 moves M forward
 * (all-gather), M backward (all-gather) and M of gradients (reduce-scatter); ZeRO++ 0.5M (INT8
 * gathers), 0 (hpZ gathers inside the node) and 0.25M (INT4 gradients after an intra-node
 * reduction). With finite sizes a ring over n ranks sends (n-1)/n of it, and the all-to-all
 * across N nodes (N-1)/N; both tend to 1, and the ratio to 4. */
static int zpp_predict(int zpp, long long nodes, Prediction *pr, Scenario *sc)
{
	return fx_predictf(sc, pr,
			    "{" SMALL_LLAMA ", \"deepspeed\": {\"train_micro_batch_size_per_gpu\": 1,"
			    " \"bf16\": {\"enabled\": true}, \"zero_optimization\": {\"stage\": 3,"
			    " \"stage3_param_persistence_threshold\": 0, \"reduce_bucket_size\": 1e9%s}},"
			    " \"cluster\": {\"gpu\": \"H100-SXM\", \"nodes\": %lld, \"gpus_per_node\": 8},"
			    " \"seq_length\": 128}",
			    zpp ? ", \"zero_quantized_weights\": true, \"zero_hpz_partition_size\": 8,"
				  " \"zero_quantized_gradients\": true" : "",
			    nodes);
}

/* G: the elements every gather brings in, each tensor padded to a multiple of the n ranks
 * (Ψ itself when they divide, as with 16 ranks here) */
static double gathered_elems(const Plan *p)
{
	double g = 0;
	for (int u = 0; u < p->n_units; u++)
		g += (double)p->units[u].gather_dense;
	return g;
}

static void check_zeropp(long long nodes)
{
	Scenario sc;
	Prediction pr;
	double psi = 2.0 * 32000 * 256 + 4.0 * (4 * 65536 + 3 * 262144 + 512) + 256;
	double n = 8.0 * nodes, N = (double)nodes;

	if (zpp_predict(0, nodes, &pr, &sc))
		return;
	double G = gathered_elems(&pr.plan), M = 2 * G;
	if (nodes == 2)
		CU_ASSERT_DOUBLE_EQUAL(G, psi, 0);
	double base = pr.stages[0].traffic.node_egress_bytes;
	CU_ASSERT_DOUBLE_EQUAL(base, 3 * M * (n - 1) / n, 1e-9 * M);
	fx_free(&sc, &pr);

	if (zpp_predict(1, nodes, &pr, &sc))
		return;
	double zpp = pr.stages[0].traffic.node_egress_bytes;
	/* INT8 gathers with one fp32 scale per group of each rank's piece (DeepSpeed's grouping,
	 * build_qwz_groups, hand-checked in test_zpp.c; a piece it cannot group, as a block's
	 * 2049 elements on 512 ranks, in groups of its 8000-element target), in a ring over n
	 * (untied: one piece a unit) */
	double gathers = 0;
	for (int u = 0; u < pr.plan.n_units; u++) {
		long long g = pr.plan.units[u].gather_dense, k = g / (long long)n;
		long long groups = build_qwz_groups(k) > 0 ? build_qwz_groups(k) : (k + 7999) / 8000;
		if (g > 0)
			gathers += (double)g + 4.0 * n * (double)groups;
	}
	/* each unit's gradient flat: every one of the node's 8 GPUs sends its INT4 eighth to the
	 * other nodes, (N-1)/N of it leaving the node, with one fp32 scale per 256 elements (h) of
	 * each of the N slices of n it holds */
	double grads = 0;
	for (int u = 0; u < pr.plan.n_units; u++) {
		double slice = ceil((double)pr.plan.units[u].own_gather / 8);
		double part = (double)pr.plan.units[u].own_gather / n;
		if (slice > 0)
			grads += 8 * (ceil(slice / 2) + 4 * N * ceil(part / 256)) * (N - 1) / N;
	}
	CU_ASSERT_DOUBLE_EQUAL(zpp, gathers * (n - 1) / n + grads, 1e-9 * M);
	/* hpZ keeps a secondary partition of the parameters over 8 GPUs */
	CU_ASSERT_DOUBLE_EQUAL(pr.plan.stages[0].secondary_elems, G / 8, 0);
	if (nodes >= 64) /* 3M -> 0.75M: 4x, less the scales' quarter percent */
		CU_ASSERT(fabs(base / zpp - 4) < 0.05);
	fx_free(&sc, &pr);
}

static void test_zeropp_cross_node(void)
{
	check_zeropp(2);
	check_zeropp(64);
}

/* ---- topology ---- */

static void test_topology_split(void)
{
	/* TP 8 inside a node, DP across 4 nodes, 8 GPUs a node, layout tp-pp-dp */
	ParallelSpec q;
	parallel_defaults(&q);
	q.tp = 8, q.dp = 4;
	GroupSpan tp = parallel_group_span(&q, LAYOUT_TP, 8, 1);
	GroupSpan dp = parallel_group_span(&q, LAYOUT_DP, 8, 1);
	CU_ASSERT_EQUAL(tp.nodes, 1);
	CU_ASSERT_EQUAL(dp.nodes, 4);
	CU_ASSERT_EQUAL(dp.per_node, 1);
	/* DP 16 over 2 nodes without TP: 8 members per node */
	q.tp = 1, q.dp = 16;
	dp = parallel_group_span(&q, LAYOUT_DP, 8, 1);
	CU_ASSERT_EQUAL(dp.nodes, 2);
	CU_ASSERT_EQUAL(dp.per_node, 8);

	double intra, inter, S = 1e9;
	/* a ring all-reduce over 16 ranks on 2 nodes: 2 of its 16 links cross, each rank sending
	 * 2(n-1)/n S: inter = 2 * 15/16 * S * 2/16 */
	traffic_split(COLL_ALL_REDUCE, S, dp, ALGO_RING, &intra, &inter);
	CU_ASSERT_DOUBLE_EQUAL(inter, 2.0 * 15 / 16 * S * 2 / 16, 1);
	CU_ASSERT_DOUBLE_EQUAL(intra + inter, 2.0 * 15 / 16 * S, 1);
	/* hierarchical: reduce-scatter + all-gather inside the node, 2(g-1)/g S; an all-reduce of
	 * S/g between the 2 nodes, 2(N-1)/N S/g */
	traffic_split(COLL_ALL_REDUCE, S, dp, ALGO_HIERARCHICAL, &intra, &inter);
	CU_ASSERT_DOUBLE_EQUAL(intra, 2.0 * 7 / 8 * S, 1);
	CU_ASSERT_DOUBLE_EQUAL(inter, 2.0 * (S / 8) * 1 / 2, 1);
	/* all-to-all over 16 on 2 nodes: half of each rank's data leaves its node */
	traffic_split(COLL_ALL_TO_ALL, S, dp, ALGO_RING, &intra, &inter);
	CU_ASSERT_DOUBLE_EQUAL(inter, S * 8 / 16, 1);
	CU_ASSERT_DOUBLE_EQUAL(intra, S * 7 / 16, 1);
}

/* ---- refusals ---- */

static void expect_refused(const char *parallel, const char *zero, const char *fragment)
{
	char json[2048], path[512];
	PxError err = {0};
	snprintf(json, sizeof(json),
		 "{" SMALL_GPT ", \"moe\": {\"num_experts\": 8}, \"deepspeed\":"
		 " {\"train_micro_batch_size_per_gpu\": 1, \"gradient_accumulation_steps\": 4,"
		 " \"bf16\": {\"enabled\": true}, \"zero_optimization\": %s},"
		 " \"cluster\": {\"gpu\": \"H100-SXM\", \"nodes\": 1, \"gpus_per_node\": 8},"
		 " \"seq_length\": 128, \"parallelism\": %s}", zero, parallel);
	expect_input_error(json, path, sizeof(path), &err);
	if (!strstr(err.msg, fragment))
		fprintf(stderr, "\nexpected '%s' in: %s\n", fragment, err.msg);
	CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, fragment));
}

static void test_refusals(void)
{
	expect_refused("{\"pp\": 2}", "{\"stage\": 2}",
		       "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism");
	expect_refused("{\"tp\": 3}", "{\"stage\": 0}", "does not divide into tp 3 x pp 1");
	expect_refused("{\"tp\": 16}", "{\"stage\": 0}", "world of 8 GPUs does not divide");
	expect_refused("{\"pp\": 3}", "{\"stage\": 1}", "does not divide into tp 1 x pp 3");
	expect_refused("{\"ep\": 3}", "{\"stage\": 0}", "ep = 3 does not divide the 8 experts");
	expect_refused("{\"pp\": 2, \"pipeline_schedule\": \"interleaved\"}", "{\"stage\": 1}",
		       "virtual_stages >= 2");
	expect_refused("{\"pp\": 2, \"virtual_stages\": 2}", "{\"stage\": 1}",
		       "needs pipeline_schedule \"interleaved\"");
	expect_refused("{\"pp\": 8, \"pipeline_schedule\": \"interleaved\", \"virtual_stages\": 2}",
		       "{\"stage\": 1}", "4 micro-batches to divide by pp 8");
	expect_refused("{\"pp\": 4, \"pipeline_schedule\": \"interleaved\", \"virtual_stages\": 4}",
		       "{\"stage\": 1}", "16 model chunks, but the model has only 8 layers");
	expect_refused("{\"ep\": 16}", "{\"stage\": 0}", "ep = 16 does not divide the 8 experts");
	expect_refused("{\"pp\": 2, \"ep\": 8}", "{\"stage\": 1}",
		       "ep = 8 does not divide the data-parallel size 4");
	/* ZeRO++ below stage 3 is not refused: DeepSpeed ignores it (test_dsconfig.c) */
	expect_refused("{\"tp\": 1}", "{\"stage\": 3, \"zero_hpz_partition_size\": 3}",
		       "zero_hpz_partition_size = 3 does not divide the data-parallel size 8");
	/* DeepSpeed's MoE layers at stage 3: engine.py _configure_zero_optimizer asserts "MoE not
	 * supported with Stage 3" */
	expect_refused("{\"ep\": 2}", "{\"stage\": 3}",
		       "deepspeed.zero_optimization.stage = 3 with DeepSpeed's MoE layers");
	/* and at stage 1-2, stage_1_and_2.py _configure_moe_settings asserts contiguous gradients
	 * (stage 2) and reduce_scatter (either stage) */
	expect_refused("{\"ep\": 2}", "{\"stage\": 2, \"contiguous_gradients\": false}",
		       "contiguous_gradients = false at stage 2 with DeepSpeed's MoE layers");
	expect_refused("{\"ep\": 2}", "{\"stage\": 1, \"reduce_scatter\": false}",
		       "reduce_scatter = false at stage 1 with DeepSpeed's MoE layers");
}

/* Layers that do not divide over the stages are refused under uniform partitioning (6 layers,
 * 4 stages) and split by parameters otherwise. */
static void test_layers_not_dividing(void)
{
	char json[2048], path[512];
	Scenario sc;
	Prediction pr;
	PxError err = {0};
	const char *fmt = "{\"model\": {\"model_type\": \"gpt2\", \"n_embd\": 64, \"n_head\": 4,"
			  " \"n_layer\": 6, \"n_positions\": 128, \"vocab_size\": 512},"
			  " \"deepspeed\": {\"train_micro_batch_size_per_gpu\": 1,"
			  " \"gradient_accumulation_steps\": 4}, \"cluster\": {\"gpu\": \"H100-SXM\","
			  " \"nodes\": 1, \"gpus_per_node\": 4}, \"seq_length\": 64,"
			  " \"parallelism\": {\"pp\": 4, \"partition_method\": \"%s\"}}";
	snprintf(json, sizeof(json), fmt, "uniform");
	snprintf(path, sizeof(path), "%s/s.json", px_test_tmpdir());
	px_test_write_file(path, json);
	CU_ASSERT_EQUAL_FATAL(scenario_load(&sc, path, NULL, &err), 0);
	CU_ASSERT_EQUAL(predict_run(&sc, &pr, &err), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "6 layers do not divide into 4 pipeline stages"));
	scenario_free(&sc);

	snprintf(json, sizeof(json), fmt, "parameters");
	if (fx_predict(&sc, &pr, json))
		return;
	/* every unit on exactly one stage, embedding first, head last, no stage empty */
	CU_ASSERT_EQUAL(pr.plan.chunk_bounds[0], 0);
	CU_ASSERT_EQUAL(pr.plan.chunk_bounds[4], 8);
	for (int j = 0; j < 4; j++)
		CU_ASSERT(pr.plan.chunk_bounds[j + 1] > pr.plan.chunk_bounds[j]);
	fx_free(&sc, &pr);
}

/* ---- the size of a pipelined schedule ---- */

/* The small GPT on pp stages with m micro-batches of one sequence, on pp GPUs (dp 1); extra is
 * more of the scenario's keys (", \"activation_checkpointing\": ...") and par more of parallelism's. */
static int load_pipelined(Scenario *sc, long long pp, long long m, const char *par, const char *extra)
{
	char json[2048];
	snprintf(json, sizeof(json),
		 "{" SMALL_GPT ", \"deepspeed\": {\"train_micro_batch_size_per_gpu\": 1,"
		 " \"gradient_accumulation_steps\": %lld, \"bf16\": {\"enabled\": true}},"
		 " \"cluster\": {\"gpu\": \"H100-SXM\", \"nodes\": 1, \"gpus_per_node\": %lld},"
		 " \"seq_length\": 512, \"parallelism\": {\"pp\": %lld%s}%s}", m, pp, pp, par, extra);
	return fx_load(sc, json);
}

/* All stages' ops, as built. */
static long long built_ops(const Prediction *pr)
{
	long long n = 0;
	for (int s = 0; s < pr->n_stages; s++)
		n += pr->stages[s].sched.n;
	return n;
}

/* build_count_ops equals the length of the schedule really built, every micro-batch unrolled, for
 * each pipeline order and stage, with and without recompute, tensor and sequence parallelism,
 * and MoE; and build_ops_bound is above it. */
static void test_count_ops_exact(void)
{
	static const struct {
		long long pp, m;
		const char *par, *extra;
	} cases[] = {
		{2, 6, "", ""},
		{4, 7, ", \"pipeline_schedule\": \"gpipe\"", ""},
		{2, 4, ", \"pipeline_schedule\": \"interleaved\", \"virtual_stages\": 2", ""},
		{4, 8, ", \"pipeline_schedule\": \"interleaved\", \"virtual_stages\": 2",
		 ", \"activation_checkpointing\": \"full\""},
		{2, 5, ", \"tp\": 2, \"sequence_parallel\": true", ", \"activation_checkpointing\": \"full\""},
		{8, 3, "", ", \"activation_checkpointing\": \"selective\""},
		{2, 4, "", ", \"moe\": {\"num_experts\": 4, \"k\": 2}"},
		{2, 3, ", \"tp\": 2",
		 ", \"moe\": {\"num_experts\": 4}, \"activation_checkpointing\": \"full\""},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		Scenario sc;
		Prediction pr;
		PxError err = {0};
		long long pp = cases[i].pp * (strstr(cases[i].par, "\"tp\": 2") ? 2 : 1);
		if (load_pipelined(&sc, cases[i].pp, cases[i].m, cases[i].par, cases[i].extra))
			continue;
		sc.cluster.gpus_per_node = pp; /* tp x pp GPUs */
		if (predict_memory(&sc, &pr, &err)) {
			fprintf(stderr, "\ncase %zu: %s\n", i, err.msg);
			CU_FAIL("predict_memory failed");
			scenario_free(&sc);
			continue;
		}
		for (int s = 0; s < pr.n_stages; s++) {
			long long n = -1;
			CU_ASSERT_EQUAL(build_count_ops(&pr.plan, s, &n, &err), 0);
			if (n != pr.stages[s].sched.n)
				fprintf(stderr, "\ncase %zu stage %d: counted %lld, built %d\n", i, s, n,
					pr.stages[s].sched.n);
			CU_ASSERT_EQUAL(n, pr.stages[s].sched.n);
			/* the bound that spares a sweep's points the count holds */
			if (pr.stages[s].sched.n > build_ops_bound(&pr.plan, s))
				fprintf(stderr, "\ncase %zu stage %d: built %d, bound %lld\n", i, s,
					pr.stages[s].sched.n, build_ops_bound(&pr.plan, s));
			CU_ASSERT(pr.stages[s].sched.n <= build_ops_bound(&pr.plan, s));
		}
		fx_free(&sc, &pr);
	}
}

/* The limit: pp 2 with 3 million micro-batches is refused before anything is built (the count
 * alone is built: a one-micro-batch schedule per stage); the largest number of micro-batches
 * whose schedules fit under BUILD_MAX_OPS still prices, and one more is refused. Where the limit
 * falls is found from two real builds, of 1 and 2 micro-batches: every further micro-batch adds
 * what the second added. */
static void test_schedule_limit(void)
{
	Scenario sc;
	Prediction pr;
	PxError err = {0};
	long long n1 = 0, n2 = 0;

	CU_ASSERT_EQUAL_FATAL(load_pipelined(&sc, 2, 3000000, "", ""), 0);
	CU_ASSERT_EQUAL(predict_run(&sc, &pr, &err), -1);
	CU_ASSERT_EQUAL(err.code, PX_ERR_INPUT);
	CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, ": the pipelined schedule of 3000000 micro-batches "
				      "(gradient accumulation) on 2 stages would hold "));
	CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, " ops, over the limit of 8000000 (366 MiB of "
				      "schedule); use fewer micro-batches"));
	scenario_free(&sc);

	for (int m = 1; m <= 2; m++) {
		CU_ASSERT_EQUAL_FATAL(load_pipelined(&sc, 2, m, "", ""), 0);
		CU_ASSERT_EQUAL_FATAL(predict_memory(&sc, &pr, &err), 0);
		*(m == 1 ? &n1 : &n2) = built_ops(&pr);
		fx_free(&sc, &pr);
	}
	long long per_m = n2 - n1, inside = (BUILD_MAX_OPS - n1) / per_m + 1;
	CU_ASSERT_FATAL(per_m > 0 && n1 + (inside - 1) * per_m <= BUILD_MAX_OPS &&
			n1 + inside * per_m > BUILD_MAX_OPS);
	CU_ASSERT_EQUAL_FATAL(load_pipelined(&sc, 2, inside, "", ""), 0);
	int rc = predict_run(&sc, &pr, &err);
	if (rc)
		fprintf(stderr, "\n%s\n", err.msg);
	CU_ASSERT_EQUAL(rc, 0);
	if (rc == 0) {
		CU_ASSERT_EQUAL(built_ops(&pr), n1 + (inside - 1) * per_m);
		CU_ASSERT(pr.time_known);
		predict_free(&pr);
	}
	scenario_free(&sc);
	CU_ASSERT_EQUAL_FATAL(load_pipelined(&sc, 2, inside + 1, "", ""), 0);
	CU_ASSERT_EQUAL(predict_memory(&sc, &pr, &err), -1);
	char want[256];
	snprintf(want, sizeof(want), "would hold %lld ops, over the limit", n1 + inside * per_m);
	CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, want));
	scenario_free(&sc);
}

/* Where a rank sits, by hand for tp 2 x pp 3 x dp 2 = 12 ranks. tp-pp-dp (tp innermost, then
 * pp): rank = tp + 2 (stage + 3 dp), so rank 7 = 1 + 2 (0 + 3 x 1): tp 1, stage 0, dp 1, and
 * rank 10 = 0 + 2 (2 + 3 x 1): tp 0, stage 2, dp 1. tp-dp-pp: rank = tp + 2 (dp + 2 stage),
 * so rank 7 = 1 + 2 (1 + 2 x 1): tp 1, stage 1, dp 1, and rank 10 = 0 + 2 (1 + 2 x 2): tp 0,
 * stage 2, dp 1. Every (tp, stage, dp) comes from exactly one rank either way. */
static void test_rank_coords(void)
{
	ParallelSpec q;
	parallel_defaults(&q);
	q.tp = 2, q.pp = 3, q.dp = 2;
	static const struct { RankOrder order; int rank, tp, stage, dp; } want[] = {
		{ORDER_TP_PP_DP, 7, 1, 0, 1}, {ORDER_TP_PP_DP, 10, 0, 2, 1},
		{ORDER_TP_DP_PP, 7, 1, 1, 1}, {ORDER_TP_DP_PP, 10, 0, 2, 1},
	};
	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
		q.order = want[i].order;
		RankCoords c = parallel_rank_coords(&q, want[i].rank);
		CU_ASSERT(c.tp == want[i].tp && c.stage == want[i].stage && c.dp == want[i].dp);
		CU_ASSERT_EQUAL(parallel_stage_of(&q, want[i].rank), want[i].stage);
	}
	for (int o = 0; o < 2; o++) {
		int seen[2][3][2] = {{{0}}};
		q.order = o ? ORDER_TP_DP_PP : ORDER_TP_PP_DP;
		for (int r = 0; r < 12; r++) {
			RankCoords c = parallel_rank_coords(&q, r);
			seen[c.tp][c.stage][c.dp]++;
		}
		for (int t = 0; t < 2; t++)
			for (int st = 0; st < 3; st++)
				for (int d = 0; d < 2; d++)
					CU_ASSERT_EQUAL(seen[t][st][d], 1);
	}
}

int test_parallel_register(void)
{
	return PX_ADD_SUITE("parallel",
			    {"Korthikanti Table 2 through the planner", test_korthikanti_through_planner},
			    {"pipeline in-flight micro-batches", test_inflight_counts},
			    {"1F1B order", test_1f1b_order},
			    {"Megatron TP traffic 8bsh(t-1)/t", test_megatron_tp_traffic},
			    {"T5 tensor-parallel traffic by hand", test_t5_tp_traffic},
			    {"MoE capacity", test_moe_capacity},
			    {"MoE all-to-all volumes", test_moe_all_to_all},
			    {"MoE under tensor parallelism: tokens split, then gathered",
			     test_moe_tensor_parallel},
			    {"MoE without drop_tokens: the capacity estimated, its all-reduce",
			     test_moe_dropless},
			    {"MoE without drop_tokens: uniform routing's busiest count, simulated",
			     test_moe_dropless_uniform},
			    {"Mixtral parameter count", test_mixtral_count},
			    {"ZeRO++ cross-node 3M -> 0.75M", test_zeropp_cross_node},
			    {"topology split", test_topology_split},
			    {"a rank's tp index, stage and dp index", test_rank_coords},
			    {"refused combinations", test_refusals},
			    {"layers not dividing", test_layers_not_dividing},
			    {"pipelined schedule size counted exactly", test_count_ops_exact},
			    {"pipelined schedules over the op limit refused", test_schedule_limit});
}

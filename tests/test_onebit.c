/* The 1-bit optimizers' communication (engine/onebit, build_step.c's compressed step, sim/onebit):
 * one compressed all-reduce's bytes worked by hand, the kinds of step of a run traced by hand from
 * deepspeed/runtime/fp16/onebit/{adam,zoadam}.py, the schedule's compressed ops on a GPT whose
 * tensors are counted by hand, and the 1-bit Adam paper's volume reduction (Tang et al. 2021,
 * arXiv:2102.02888) reproduced on the schedule; and the executor training a GPT with 1-bit Adam
 * and 0/1 Adam (exec/runner_onebit.c) and 1-bit LAMB (exec/runner_lamb.c): their losses
 * against the uncompressed runs', their bytes against the prediction and a count by hand, the
 * updates of 0/1 Adam's frozen-variance steps and of 1-bit LAMB by hand. */
#include <CUnit/CUnit.h>
#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../engine/build.h"
#include "../engine/onebit.h"
#include "../kernels/lamb_cpu.h"
#include "../kernels/ops_cpu.h"
#include "fixtures.h"
#include "run_checks.h"
#include "suites.h"

/* onebit/adam.py: divider = lcm(n, 8), the buffer padded to a multiple of n x divider, chunks of
 * padded / n; nccl.py: the signs packed 8 to a byte (all_to_all_single, then all_gather of the
 * server's), one fp32 scale per rank in each phase (all_gather). By hand, 1,000 elements:
 *   n 2: lcm 8, unit 16: 1,008 padded (63 x 16), chunk 504, signs 126 B, scales 2 x 4 = 8 B;
 *        sent (n-1)/n of each of the four payloads: 1/2 x 2 x (126 + 8) = 134 B;
 *        errors 4 x (1,008 + 504) = 6,048 B
 *   n 3: lcm 24, unit 72: 1,008 (14 x 72), chunk 336, signs 126 B, scales 12 B;
 *        sent 2/3 x 2 x 138 = 184 B; errors 4 x (1,008 + 336) = 5,376 B
 *   n 4: lcm 8, unit 32: 1,024 (32 x 32), chunk 256, signs 128 B, scales 16 B;
 *        sent 3/4 x 2 x 144 = 216 B; errors 4 x (1,024 + 256) = 5,120 B */
static void test_volume_by_hand(void)
{
	static const struct {
		long long n, padded, chunk, signs, scales;
		double sent, errors;
	} cases[] = {{2, 1008, 504, 126, 8, 134, 6048},
		     {3, 1008, 336, 126, 12, 184, 5376},
		     {4, 1024, 256, 128, 16, 216, 5120}};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		OneBitVolume v = onebit_volume(1000, cases[i].n);
		CU_ASSERT_EQUAL(v.padded_elems, cases[i].padded);
		CU_ASSERT_EQUAL(v.chunk_elems, cases[i].chunk);
		CU_ASSERT_EQUAL(v.sign_bytes, cases[i].signs);
		CU_ASSERT_EQUAL(v.scale_bytes, cases[i].scales);
		CU_ASSERT_DOUBLE_EQUAL(v.wire_bytes, cases[i].sent, 1e-9);
		CU_ASSERT_DOUBLE_EQUAL(v.error_bytes, cases[i].errors, 1e-9);
	}
	/* one rank has nothing to exchange */
	CU_ASSERT_EQUAL(onebit_volume(1000, 1).padded_elems, 0);
}

/* 1-bit Adam (adam.py): steps 1..freeze_step all-reduce the gradients (the switch is made after
 * the step whose count reaches freeze_step), then every step is compressed; with freeze_step 0
 * or 1 steps 1 and 2 run in full: step 1 is the initialisation step, which returns before the
 * switch is tested (`if not self.initialize: ... return loss`), and the test after step 2 makes
 * step 3 the first compressed one. Step 1 is a kind of its own (ONEBIT_INIT): its gradients are
 * all-reduced, and the still-zero momenta go through the compressed all-reduce as the error
 * buffers are set up (adam_freeze_key is set there), with no update. Over 10 steps with
 * freeze_step 3: init, 2 full (2, 3), 7 compressed. */
static void test_onebit_adam_steps(void)
{
	OneBitParams o;
	long long c[N_ONEBIT_STEPS];
	onebit_params_default(&o);
	CU_ASSERT_EQUAL(o.freeze_step, 100000);
	o.freeze_step = 3;
	CU_ASSERT_EQUAL(onebit_step_kind(&o, 0, 1), ONEBIT_INIT);
	CU_ASSERT_EQUAL(onebit_step_kind(&o, 0, 3), ONEBIT_FULL);
	CU_ASSERT_EQUAL(onebit_step_kind(&o, 0, 4), ONEBIT_COMPRESSED);
	onebit_count_steps(&o, 0, 10, c);
	CU_ASSERT(c[ONEBIT_INIT] == 1 && c[ONEBIT_FULL] == 2 && c[ONEBIT_COMPRESSED] == 7 &&
		  c[ONEBIT_LOCAL] == 0);
	for (o.freeze_step = 0; o.freeze_step <= 2; o.freeze_step++) {
		CU_ASSERT_EQUAL(onebit_step_kind(&o, 0, 1), ONEBIT_INIT);
		CU_ASSERT_EQUAL(onebit_step_kind(&o, 0, 2), ONEBIT_FULL);
		CU_ASSERT_EQUAL(onebit_step_kind(&o, 0, 3), ONEBIT_COMPRESSED);
		onebit_count_steps(&o, 0, 3, c);
		CU_ASSERT(c[ONEBIT_INIT] == 1 && c[ONEBIT_FULL] == 1 && c[ONEBIT_COMPRESSED] == 1);
	}
}

/* 0/1 Adam (zoadam.py) with var_update_scaler 2, var_freeze_step 8, local_step_scaler 2,
 * local_step_clipper 4, traced by hand (I the initialisation step, F full, C compressed, L
 * local):
 *   step 1: the initialisation step, backward all-reduce on, the idle accumulator through the
 *      compressed all-reduce (zoadam.py `if not self.initialize`): I; no counter moves.
 *   2: F (var_interval 1: 2 % 1 == 0, var_counter 1); 3: F (counter 2 = scaler: interval 2);
 *      the next step's all-reduce is on when (step + 1) % interval == 0:
 *   4: F (counter 1; 5 % 2 != 0: off); 5: C (6 % 2 == 0: on); 6: F (counter 2: interval 4;
 *      7 % 4: off); 7: C (8 % 4 == 0: on); 8: F (counter 1; 9 % 4: off); 9: C, and 9 > 8 freezes.
 *   frozen, local interval 1, doubling every 2 steps up to 4: 10: C (counter 1); 11: C
 *      (counter 2: interval 2); 12: C (12 % 2 == 0); 13: L (interval 4); 14: L; 15: L
 *      (interval min(4, 8) = 4); 16: C; 17-19: L; 20: C.
 *   So I F F F C F C F C C C C L L L C L L L C: 1 init, 5 full, 8 compressed, 6 local over
 *   20. */
static void test_zero_one_adam_steps(void)
{
	static const char trace[] = "IFFFCFCFCCCCLLLCLLLC";
	OneBitParams o;
	long long c[N_ONEBIT_STEPS];
	onebit_params_default(&o);
	CU_ASSERT(o.var_freeze_step == 100000 && o.var_update_scaler == 16 &&
		  o.local_step_scaler == 32678 && o.local_step_clipper == 16);
	o.var_update_scaler = 2, o.var_freeze_step = 8, o.local_step_scaler = 2,
	o.local_step_clipper = 4;
	for (int s = 1; s <= 20; s++) {
		OneBitStep k = onebit_step_kind(&o, 1, s);
		char got = k == ONEBIT_INIT ? 'I' : k == ONEBIT_FULL ? 'F' :
			   k == ONEBIT_COMPRESSED ? 'C' : 'L';
		if (got != trace[s - 1])
			fprintf(stderr, "\nstep %d: %c, by hand %c\n", s, got, trace[s - 1]);
		CU_ASSERT_EQUAL(got, trace[s - 1]);
	}
	onebit_count_steps(&o, 1, 20, c);
	CU_ASSERT(c[ONEBIT_INIT] == 1 && c[ONEBIT_FULL] == 5 && c[ONEBIT_COMPRESSED] == 8 &&
		  c[ONEBIT_LOCAL] == 6);
}

/* The test GPT: V 128, P 64, h 64, 2 layers, tied head. Its tensors, counted by hand: wte
 * 128 x 64 = 8,192, wpe 64 x 64 = 4,096, per layer ln_1 64 + 64, c_attn 64 x 192 + 192 = 12,480,
 * attn c_proj 64 x 64 + 64 = 4,160, ln_2 128, c_fc 64 x 256 + 256 = 16,640, mlp c_proj
 * 256 x 64 + 64 = 16,448 (49,984 a layer), ln_f 128: 8,192 + 4,096 + 2 x 49,984 + 128 =
 * 112,384 elements. Every tensor's size is a multiple of 32, so over 4 ranks (unit 4 x lcm(4,
 * 8) = 32) no tensor is padded. */
#define GPT_ELEMS 112384LL
/* GPT's bf16 switch off and fp16 on */
#define FP16 "false}, \"fp16\": {\"enabled\": true"

static const char GPT[] =
	"{\"name\": \"onebit-gpt\", \"model\": {\"model_type\": \"gpt2\", \"n_embd\": 64,"
	" \"n_layer\": 2, \"n_head\": 4, \"n_positions\": 64, \"vocab_size\": 128},"
	" \"deepspeed\": {\"train_batch_size\": %d, \"train_micro_batch_size_per_gpu\": 2,"
	" \"bf16\": {\"enabled\": %s}, \"optimizer\": {\"type\": \"%s\", \"params\": {\"lr\": 1e-3,"
	" \"freeze_step\": 10}}}, \"training_args\": {\"max_steps\": 40},"
	" \"cluster\": {\"gpu\": \"H100-SXM\", \"nodes\": 1, \"gpus_per_node\": %d},"
	" \"seq_length\": 32}";

typedef struct Tally {
	long long ops[N_ROLES], bytes[N_ROLES], dp_grad_reduces;
} Tally;

static void tally(const Schedule *s, Tally *t)
{
	memset(t, 0, sizeof(*t));
	for (int i = s->step_begin; i < s->n; i++) {
		const Op *op = &s->ops[i];
		if (op->kind != OP_COLL)
			continue;
		t->ops[op->role]++;
		t->bytes[op->role] += (long long)op->bytes;
		t->dp_grad_reduces += op->role == ROLE_GRAD_REDUCE && op->group == GROUP_DP;
	}
}

/* fp32 OneBitAdam over 4 ranks: one compressed all-reduce per tensor, signs 112,384 / 8 =
 * 14,048 B in each phase, 4 x 4 = 16 B of scales per tensor in each; the warm-up step has the
 * gradient all-reduce and none of these; the error buffer 4 x (112,384 + 28,096) B. */
static void test_schedule_fp32_per_tensor(void)
{
	Scenario sc;
	Prediction pr;
	PxError err = {0};
	Schedule s;
	Tally t;
	if (fx_predictf(&sc, &pr, GPT, 8, "false", "OneBitAdam", 4))
		return;
	tally(&pr.stages[0].sched, &t);
	CU_ASSERT(t.dp_grad_reduces > 0);
	CU_ASSERT_EQUAL(t.ops[ROLE_ONEBIT_SIGNS] + t.ops[ROLE_ONEBIT_SCALES], 0);
	CU_ASSERT_DOUBLE_EQUAL(pr.plan.stages[0].error_feedback_bytes, 4.0 * (GPT_ELEMS + GPT_ELEMS / 4),
			       1e-6);
	pr.plan.onebit_step = ONEBIT_COMPRESSED;
	CU_ASSERT_EQUAL_FATAL(build_schedule(&pr.plan, 0, &s, &err), 0);
	pr.plan.onebit_step = ONEBIT_FULL;
	CU_ASSERT_EQUAL(sched_validate(&s, &err), 0);
	tally(&s, &t);
	CU_ASSERT_EQUAL(t.dp_grad_reduces, 0);
	long long tensors = t.ops[ROLE_ONEBIT_SIGNS];
	CU_ASSERT(tensors >= 16); /* at least wte, wpe, ln_f and a layer's tensors */
	CU_ASSERT_EQUAL(t.ops[ROLE_ONEBIT_SCALES], tensors);
	CU_ASSERT_EQUAL(t.ops[ROLE_ONEBIT_SERVER_SIGNS], tensors);
	CU_ASSERT_EQUAL(t.ops[ROLE_ONEBIT_SERVER_SCALES], tensors);
	CU_ASSERT_EQUAL(t.bytes[ROLE_ONEBIT_SIGNS], GPT_ELEMS / 8);
	CU_ASSERT_EQUAL(t.bytes[ROLE_ONEBIT_SERVER_SIGNS], GPT_ELEMS / 8);
	CU_ASSERT_EQUAL(t.bytes[ROLE_ONEBIT_SCALES], 16 * tensors);
	CU_ASSERT_EQUAL(t.bytes[ROLE_ONEBIT_SERVER_SCALES], 16 * tensors);
	/* sent by one rank: 3/4 of each payload */
	CU_ASSERT_DOUBLE_EQUAL(pr.onebit.dp_wire_bytes[ONEBIT_COMPRESSED],
			       0.75 * (2.0 * GPT_ELEMS / 8 + 32.0 * tensors), 1e-6);
	sched_free(&s);
	fx_free(&sc, &pr);
}

/* fp16 over 3 ranks: FP16_Optimizer hands the optimizer one fp32 flat, so one compressed
 * all-reduce of 112,384 elements: unit 3 x lcm(3, 8) = 72, padded 1,561 x 72 = 112,392, signs
 * 14,049 B, scales 12 B; sent 2/3 x 2 x (14,049 + 12) = 18,748 B, and the loss scaler's overflow
 * all-reduce, 2/3 x 2 x 4 B, in either phase. The warm-up's engine all-reduces the 2-byte
 * gradients in one bucket of the tensors as they are (engine.py allreduce_no_retain: under 5e8
 * elements, no padding), 112,384 elements: 2/3 x 2 x 2 x 112,384 B. bf16 is refused: DeepSpeed
 * would wrap the optimizer in BF16_Optimizer, whose ranks step different partitions. */
static void test_schedule_fp16_flat(void)
{
	Scenario sc;
	Prediction pr;
	if (fx_predictf(&sc, &pr, GPT, 12, FP16, "OneBitAdam", 3))
		return;
	double overflow = 2.0 / 3 * 2 * 4;
	CU_ASSERT_DOUBLE_EQUAL(pr.onebit.dp_wire_bytes[ONEBIT_COMPRESSED], 18748.0 + overflow, 1e-6);
	CU_ASSERT_EQUAL(pr.onebit.n_colls[ONEBIT_COMPRESSED], 4 + 1); /* the exchange, the overflow */
	CU_ASSERT_DOUBLE_EQUAL(pr.onebit.dp_wire_bytes[ONEBIT_FULL],
			       2.0 / 3 * 2 * 2 * 112384 + overflow, 1e-3);
	/* worker 112,392 + server 37,464 elements of fp32 */
	CU_ASSERT_DOUBLE_EQUAL(pr.onebit.error_bytes, 4.0 * (112392 + 37464), 1e-6);
	/* the initialisation step: the warm-up's all-reduce and the exchange, both */
	CU_ASSERT_DOUBLE_EQUAL(pr.onebit.dp_wire_bytes[ONEBIT_INIT],
			       2.0 / 3 * 2 * 2 * 112384 + 18748.0 + overflow, 1e-3);
	/* the run: training_args.max_steps 40, freeze_step 10: the init step, 9 full and 30
	 * compressed */
	CU_ASSERT_EQUAL(pr.onebit.n_steps, 40);
	CU_ASSERT_STRING_EQUAL(pr.onebit.steps_source, "training_args.max_steps");
	CU_ASSERT(pr.onebit.counts[ONEBIT_INIT] == 1 && pr.onebit.counts[ONEBIT_FULL] == 9 &&
		  pr.onebit.counts[ONEBIT_COMPRESSED] == 30);
	CU_ASSERT_DOUBLE_EQUAL(pr.onebit.avg_dp_wire_bytes,
			       (10 * (2.0 / 3 * 2 * 2 * 112384) + 31 * 18748.0) / 40 + overflow, 1e-3);
	fx_free(&sc, &pr);

	/* bf16: refused, naming the optimizer and the reason */
	char path[512], json[4096];
	snprintf(path, sizeof(path), "%s/onebit-bf16.json", px_test_tmpdir());
	snprintf(json, sizeof(json), GPT, 12, "true", "OneBitAdam", 3);
	px_test_write_file(path, json);
	PxError err = {0};
	fx_refused(path, NULL, &err);
	PX_ASSERT_HAS(err.msg, "deepspeed.optimizer.type = OneBitAdam with bf16 and ZeRO stage 0: "
		      "DeepSpeed wraps it in BF16_Optimizer");
}

/* 1-bit LAMB compresses one flat of every momentum, in fp32 too: one exchange of 4 ops; 0/1 Adam
 * has local steps, which exchange nothing over the data-parallel group. */
static void test_lamb_and_zero_one(void)
{
	Scenario sc;
	Prediction pr;
	if (fx_predictf(&sc, &pr, GPT, 8, "false", "OneBitLamb", 4))
		return;
	CU_ASSERT_EQUAL(pr.onebit.n_colls[ONEBIT_COMPRESSED], 4);
	CU_ASSERT_DOUBLE_EQUAL(pr.onebit.dp_wire_bytes[ONEBIT_COMPRESSED],
			       0.75 * 2 * (GPT_ELEMS / 8 + 16), 1e-6);
	/* its copy of the momenta (lamb.py exp_avg_last_step) is taken in compressed steps only:
	 * the warm-up's schedule (the prediction's own) has none, the compressed one has it, and
	 * the optimizer's memory at its own peak is the compressed step's, with the copy */
	int copies[2] = {0, 0};
	Schedule comp;
	for (int i = 0; i < pr.stages[0].sched.n; i++)
		copies[0] += pr.stages[0].sched.ops[i].kind == OP_ALLOC &&
			     pr.stages[0].sched.ops[i].what == BUF_OPT_STEP_TEMP;
	pr.plan.onebit_step = ONEBIT_COMPRESSED;
	CU_ASSERT_FATAL(build_schedule(&pr.plan, 0, &comp, NULL) == 0);
	pr.plan.onebit_step = ONEBIT_FULL;
	for (int i = 0; i < comp.n; i++)
		copies[1] += comp.ops[i].kind == OP_ALLOC && comp.ops[i].what == BUF_OPT_STEP_TEMP;
	MemResult warm;
	CU_ASSERT_FATAL(sim_memory(&pr.stages[0].sched, &warm, NULL, NULL, NULL) == 0);
	sched_free(&comp);
	CU_ASSERT_EQUAL(copies[0], 0);
	CU_ASSERT_EQUAL(copies[1], 1);
	CU_ASSERT_DOUBLE_EQUAL(pr.stages[0].mem.place[PLACE_GPU].cat_peak[CAT_OPTIM] -
				       warm.place[PLACE_GPU].cat_peak[CAT_OPTIM],
			       pr.plan.stages[0].opt_step_temp_bytes, 0.5);
	CU_ASSERT(pr.plan.stages[0].opt_step_temp_bytes > 0);
	fx_free(&sc, &pr);
	if (fx_predictf(&sc, &pr, GPT, 8, "false", "ZeroOneAdam", 4))
		return;
	CU_ASSERT(pr.onebit.zero_one);
	CU_ASSERT_EQUAL(pr.onebit.dp_wire_bytes[ONEBIT_LOCAL], 0);
	CU_ASSERT(pr.onebit.dp_wire_bytes[ONEBIT_COMPRESSED] > 0);
	fx_free(&sc, &pr);
}

/* Tang et al. 2021 (arXiv:2102.02888), abstract and section 1: 1-bit Adam "reduces the
 * communication volume by up to 5x"; the compressed phase sends 1 bit for each 32-bit element
 * (about 32x less in fp32, 16x for fp16 gradients), and DeepSpeed's tutorial (docs/_tutorials/
 * onebit-adam.md) sets freeze_step to "15-25% of the total training steps". With the shortest
 * warm-up, 15%, and BERT's fp16 gradients the run averages 0.15 + 0.85 / 16 of the full volume:
 * 1 / 0.203125 = 4.92x, the paper's "up to 5x". Here GPT-2 XL on 4 nodes of 8 A100s (dp 32). */
static void test_paper_reduction(void)
{
	static const char XL[] =
		"{\"name\": \"onebit-xl\", %s, \"deepspeed\": {\"train_batch_size\": 512,"
		" \"train_micro_batch_size_per_gpu\": 4, \"fp16\": {\"enabled\": %s},"
		" \"optimizer\": {\"type\": \"OneBitAdam\", \"params\": {\"freeze_step\": 15000}}},"
		" \"training_args\": {\"max_steps\": 100000},"
		" \"cluster\": \"%s\", \"seq_length\": 1024, \"activation_checkpointing\": \"full\"}";
	char cluster[1024];
	snprintf(cluster, sizeof(cluster), "%s", px_test_path("scenarios/clusters/dgx-a100-40gb-4nodes.json"));
	Scenario sc;
	Prediction pr;
	if (fx_predictf(&sc, &pr, XL, fx_model("gpt2-xl"), "false", cluster))
		return;
	/* fp32: 32x less, less a little for each tensor's scales and padding */
	double r = pr.onebit.compressed_reduction;
	if (!(r > 31.0 && r <= 32.0))
		fprintf(stderr, "\nfp32 compressed reduction %.3f, expected about 32\n", r);
	CU_ASSERT(r > 31.0 && r <= 32.0);
	fx_free(&sc, &pr);
	if (fx_predictf(&sc, &pr, XL, fx_model("gpt2-xl"), "true", cluster))
		return;
	r = pr.onebit.compressed_reduction;
	CU_ASSERT(r > 15.9 && r <= 16.0);
	double run = pr.onebit.dp_volume_reduction, paper = 1 / (0.15 + 0.85 / 16);
	if (fabs(run - paper) > 0.02 * paper)
		fprintf(stderr, "\nrun reduction %.3f, paper %.3f\n", run, paper);
	CU_ASSERT(fabs(run - paper) <= 0.02 * paper);
	CU_ASSERT(run > 4.5 && run < 5.5);
	/* the compressed step is not slower than the warm-up step */
	CU_ASSERT(pr.onebit.time_known && pr.onebit.step_s[ONEBIT_COMPRESSED] <=
						   pr.onebit.step_s[ONEBIT_FULL]);
	fx_free(&sc, &pr);
}

/* parallax predict: the table's section and the JSON twin; a bad freeze_step exits 2 naming it;
 * parallax run refuses the 1-bit optimizers in bf16 (as predict does) and checkpoints of 0/1 Adam and 1-bit LAMB. */
static void test_cli(void)
{
	static char out[1 << 17];
	char path[512], json[4096];
	snprintf(path, sizeof(path), "%s/onebit.json", px_test_tmpdir());
	snprintf(json, sizeof(json), GPT, 8, "false", "OneBitAdam", 4);
	px_test_write_file(path, json);
	CU_ASSERT_EQUAL(px_test_run_clif(out, sizeof(out), "predict '%s' --no-db", path), 0);
	PX_ASSERT_HAS(out, "1-bit OneBitAdam: communication per rank per optimizer step");
	PX_ASSERT_HAS(out, "over the run's 40 steps (training_args.max_steps)");
	CU_ASSERT_EQUAL(px_test_run_clif(out, sizeof(out), "predict '%s' --no-db --json", path), 0);
	PX_ASSERT_HAS(out, "\"onebit\":");
	PX_ASSERT_HAS(out, "\"dp_volume_reduction\":");
	PX_ASSERT_HAS(out, "\"steps_from\":\t\"training_args.max_steps\"");

	/* bf16 is refused before the executor starts (exit 2): DeepSpeed's BF16_Optimizer would
	 * hand each rank its own partition */
	char other[512], ojson[4096];
	snprintf(other, sizeof(other), "%s/zoadam.json", px_test_tmpdir());
	snprintf(ojson, sizeof(ojson), GPT, 8, "true", "ZeroOneAdam", 4);
	px_test_write_file(other, ojson);
	CU_ASSERT_EQUAL(px_test_run_clif(out, sizeof(out), "run '%s' --no-db --ranks 1 --backend cpu",
					 other), 2);
	PX_ASSERT_HAS(out, "deepspeed.optimizer.type = ZeroOneAdam with bf16 and ZeRO stage 0");
	/* checkpoints of 0/1 Adam and 1-bit LAMB are refused before anything starts: their scalar
	 * state is not among the buffers a checkpoint writes */
	char ck[600];
	snprintf(ck, sizeof(ck), "%s/ck", px_test_tmpdir());
	CU_ASSERT_EQUAL(px_test_run_clif(out, sizeof(out), "run '%s' --no-db --ranks 1 --save '%s'",
					 px_test_path("scenarios/gpt2-mini-cpu-zeroone.json"), ck), 2);
	PX_ASSERT_HAS(out, "a checkpoint (--save) of ZeroOneAdam is not written or read: its step "
		      "counters and sum of learning rates are not saved");
	CU_ASSERT_NOT_EQUAL(access(ck, F_OK), 0);
	CU_ASSERT_EQUAL(px_test_run_clif(out, sizeof(out), "run '%s' --no-db --ranks 1 --resume '%s'",
					 px_test_path("scenarios/gpt2-mini-cpu-onebitlamb.json"), ck),
			2);
	PX_ASSERT_HAS(out, "a checkpoint (--resume) of OneBitLamb is not written or read");

	char *at = strstr(json, "\"freeze_step\": 10");
	CU_ASSERT_FATAL(at != NULL);
	memcpy(at, "\"freeze_step\": -1", 17);
	px_test_write_file(path, json);
	CU_ASSERT_EQUAL(px_test_run_clif(out, sizeof(out), "predict '%s' --no-db", path), 2);
	PX_ASSERT_HAS(out, "freeze_step");

	/* 1-bit LAMB's coefficients are read with their ranges: a coeff_beta above 1 is refused
	 * naming the file, line, key and range */
	static char lamb[4096];
	FILE *f = fopen(px_test_path("scenarios/gpt2-mini-cpu-onebitlamb.json"), "r");
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	size_t len = fread(lamb, 1, sizeof(lamb) - 1, f);
	fclose(f);
	lamb[len] = 0;
	char *cb = strstr(lamb, "\"coeff_beta\": 0.5");
	CU_ASSERT_PTR_NOT_NULL_FATAL(cb);
	cb[strlen("\"coeff_beta\": ")] = '2';
	px_test_write_file(path, lamb);
	CU_ASSERT_EQUAL(px_test_run_clif(out, sizeof(out), "predict '%s' --no-db", path), 2);
	PX_ASSERT_HAS(out, "onebit.json:10:");
	PX_ASSERT_HAS(out, "deepspeed.optimizer.params.coeff_beta: expected a number from 0 to 1, "
		      "got 2.5");
}

/* exec/onebit_comm.c's compressed all-reduce over Open MPI on np ranks: comm_mpi_check --onebit
 * (tests/check_onebit.c: hand-worked results and worker errors on 2 ranks over two calls, a hand
 * case and a padded case against a second computation in double on 4). */
static void onebit_mpi_on(int np)
{
	const char *env = getenv("PX_COMM_CHECK");
	char prog[4096], cmd[8192], out[1 << 14];
	snprintf(prog, sizeof(prog), "%s", env && *env ? env : px_test_path("build/rel/comm_mpi_check"));
	if (access(prog, X_OK) != 0 || system("command -v mpirun > /dev/null 2>&1") != 0) {
		fprintf(stderr, "\n%s or mpirun missing: build it (make build/rel/comm_mpi_check), "
			"install openmpi-bin\n", prog);
		CU_FAIL("comm_mpi_check or mpirun missing");
		return;
	}
	snprintf(cmd, sizeof(cmd), "timeout -k 5 60 mpirun --allow-run-as-root --oversubscribe "
		 "-np %d '%s' --onebit 2>&1", np, prog);
	FILE *p = popen(cmd, "r");
	CU_ASSERT_FATAL(p != NULL);
	size_t len = fread(out, 1, sizeof(out) - 1, p);
	out[len] = '\0';
	int st = pclose(p);
	CU_ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	PX_ASSERT_HAS(out, " passed, 0 failed");
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
		fprintf(stderr, "\n%s\n", out);
}

static void test_allreduce_2(void)
{
	onebit_mpi_on(2);
}

static void test_allreduce_4(void)
{
	onebit_mpi_on(4);
}

/* ---- the executor: parallax run with 1-bit Adam (scenarios/gpt2-mini-cpu-onebit.json) ---- */

static const char *onebit_base(void)
{
	static char base[1024];
	snprintf(base, sizeof(base), "run '%s' --no-db --json",
		 px_test_path("scenarios/gpt2-mini-cpu-onebit.json"));
	return base;
}

/* The 24 losses of 1-bit Adam's run that never leaves its warm-up (freeze_step 1000) on 2 ranks,
 * run once for the tests that compare against it; n, or -1. */
static int warm_only_losses(double out[24])
{
	static double losses[24];
	static int n;
	if (n == 0)
		n = px_run_losses(onebit_base(), 2, 24,
				  "--set deepspeed.optimizer.params.freeze_step=1000", losses);
	memcpy(out, losses, sizeof(losses));
	return n;
}

/* A compressed run's S losses got against its twin that never compresses: equal to the bit
 * before step index `same`, the last not; from there each at most 5% above ref's (the twin, or
 * another optimizer's run), all printed when one is not; and the last under 0.7 of the first. */
static void check_compressed_losses(const char *name, const double *got, const double *twin,
				    int same, const char *ref_name, const double *ref, int S)
{
	for (int s = 0; s < same; s++)
		CU_ASSERT_EQUAL(got[s], twin[s]);
	CU_ASSERT(got[S - 1] != twin[S - 1]);
	int worse = 0;
	for (int s = same; s < S; s++)
		worse += got[s] > 1.05 * ref[s];
	if (worse)
		for (int s = 0; s < S; s++)
			fprintf(stderr, "\nstep %d: %s %.4f, never compressed %.4f, %s %.4f", s + 1, name,
				got[s], twin[s], ref_name, ref[s]);
	CU_ASSERT_EQUAL(worse, 0);
	CU_ASSERT(got[S - 1] < 0.7 * got[0]);
}

/* freeze_step 8: steps 1-8 are the warm-up's (adam.py switches after the step whose count
 * reaches freeze_step) and the loss of step 9 is the last taken before a compressed update.
 * Against the same run that never leaves the warm-up (freeze_step 1000): steps 1-9 to the bit
 * (the same schedule and update until then), the last loss not (the compressed steps ran).
 * Against AdamW on the same data, from step 10 on: every loss at most 5% above AdamW's (1-bit
 * Adam converges as Adam does: Tang et al. 2021, section 5), and the last under 0.7 of the first.
 * A compressed step that averaged wrongly or dropped the update stalls above AdamW's losses. On
 * one rank (no exchange: the momentum updated locally, the variance frozen) it learns too, with
 * freeze_step 4: after fewer warm-up steps the frozen variance of a token embedding row no batch
 * has touched yet is 0, and its first gradient moves it by m / eps (DeepSpeed's too: why it
 * wants a long warm-up). */
static void test_run_losses(void)
{
	enum { S = 24, F = 8, S1 = 12 };
	double onebit[S], warm[S], adamw[S], one[S1];
	CU_ASSERT_EQUAL_FATAL(px_run_losses(onebit_base(), 2, S, "", onebit), S);
	CU_ASSERT_EQUAL_FATAL(warm_only_losses(warm), S);
	CU_ASSERT_EQUAL_FATAL(px_run_losses(onebit_base(), 2, S,
					    "--set deepspeed.optimizer.type=AdamW", adamw), S);
	check_compressed_losses("1-bit Adam", onebit, warm, F + 1, "AdamW", adamw, S);
	CU_ASSERT_EQUAL_FATAL(px_run_losses(onebit_base(), 1, S1,
					    "--set deepspeed.optimizer.params.freeze_step=4", one), S1);
	CU_ASSERT(one[S1 - 1] < 0.9 * one[0]);
}

/* `parallax run` on scenarios/gpt2-mini-cpu-onebit.json with extra (ranks, steps, --set) stored;
 * every rank's measured figures (one compressed step's all-to-all and all-gathers, one warm-up
 * step's all-reduce, the optimizer's memory) those given, and every pair equal to the prediction
 * (px_run_measured). */
static sqlite3 *run_bytes_of(const char *scenario, int ranks, const char *extra,
			     double all_to_all, double all_gather, double all_reduce,
			     double optimizer)
{
	char args[2048];
	snprintf(args, sizeof(args), "run '%s' --ranks %d %s", px_test_path(scenario), ranks, extra);
	sqlite3 *db = px_run_measured(args, ranks);
	for (int r = 0; r < ranks; r++) {
		CU_ASSERT_EQUAL(px_run_metric(db, "comm.onebit_compressed.all_to_all_bytes",
					      "measured", r), all_to_all);
		CU_ASSERT_EQUAL(px_run_metric(db, "comm.onebit_compressed.all_gather_bytes",
					      "measured", r), all_gather);
		CU_ASSERT_EQUAL(px_run_metric(db, "comm.all_reduce_bytes", "measured", r), all_reduce);
		CU_ASSERT_EQUAL(px_run_metric(db, "memory.gpu.optimizer_bytes", "measured", r),
				optimizer);
	}
	return db;
}

static void run_bytes(int ranks, const char *extra, double all_to_all, double all_gather,
		      double all_reduce, double optimizer)
{
	sqlite3_close(run_bytes_of("scenarios/gpt2-mini-cpu-onebit.json", ranks, extra, all_to_all,
				   all_gather, all_reduce, optimizer));
}

/* The compressed step's bytes by hand. The GPT (n_embd 128, 4 layers, vocab 256, 128 positions):
 * wte 256 x 128 = 32,768 and wpe 128 x 128 = 16,384; per layer 12 x 128^2 + 13 x 128 = 198,272
 * in 12 tensors; ln_f 2 x 128: 842,496 elements in 52 tensors, each a multiple of 128, so none
 * padded over 4 ranks (to a multiple of 4 lcm(4, 8) = 32). Per compressed step a rank issues the
 * signs once in each phase, 842,496 / 8 = 105,312 B (an all-to-all, then an all-gather), and two
 * all-gathers of 4 x 4 B of scales per tensor: 105,312 + 52 x 2 x 16 = 106,976 B of all-gathers.
 * The warm-up steps all-reduce the fp32 gradients, 4 x 842,496 = 3,369,984 B, and every step the
 * gradient norm's 4 B (fp32 without ZeRO the engine clips itself, engine.py clip_fp32_gradients,
 * and runtime/utils.py clip_grad_norm_ averages the ranks' norms over the data-parallel group:
 * in a compressed step they differ, each rank's gradients its own). The optimizer's
 * memory: Adam's two fp32 moments and the errors, 4 x (842,496 + 842,496 / 4): 10,952,448 B.
 * freeze_step 1: step 1 the initialisation step, 2 full, 3-4 compressed; every memory and
 * communication pair of every rank equal to the prediction (px_run_measured) and to this count.
 * The initialisation step (adam.py `if not self.initialize`) issues both: the warm-up's
 * all-reduce and the compressed all-reduce of the still-zero momenta. */
static void test_run_bytes(void)
{
	sqlite3 *db = run_bytes_of("scenarios/gpt2-mini-cpu-onebit.json", 4,
				   "--steps 4 --set deepspeed.optimizer.params.freeze_step=1", 105312,
				   106976, 3369984 + 4, 8.0 * 842496 + 4.0 * (842496 + 842496 / 4));
	for (int r = 0; r < 4; r++) {
		CU_ASSERT_EQUAL(px_run_metric(db, "comm.onebit_init.all_to_all_bytes", "measured", r),
				105312);
		CU_ASSERT_EQUAL(px_run_metric(db, "comm.onebit_init.all_gather_bytes", "measured", r),
				106976);
		CU_ASSERT_EQUAL(px_run_metric(db, "comm.onebit_init.all_reduce_bytes", "measured", r),
				3369984 + 4);
	}
	sqlite3_close(db);
}

/* fp16: DeepSpeed runs the 1-bit optimizers under FP16_Optimizer, whose one fp32 flat of all
 * 842,496 parameters is exchanged whole (16-bit gradients unscaled into fp32 first): per
 * compressed step the signs once in each phase, 105,312 B, and one pair of scale all-gathers,
 * 105,312 + 2 x 4 x 2 = 105,328 B of all-gathers on 2 ranks; the warm-up's all-reduce of the fp16
 * gradients, 2 x 842,496 = 1,684,992 B, and the overflow flag's 4 B; the optimizer's memory the
 * fp32 master weights, Adam's two moments and one pair of errors, 4 x 842,496 + 8 x 842,496 +
 * 4 x (842,496 + 421,248) = 15,164,928 B. Steps 1-4 full, 5-6 compressed; a static loss scale
 * (1024) keeps every step an update. An overflow skips the exchange with the step: with
 * freeze_step 1 the variance frozen after one update takes the loss to 11.4 after step 3, and
 * step 4 overflows. Its losses, freeze_step 8: steps 1-9 those of the run that never compresses,
 * to the bit, and it learns. With one scale for the whole flat (each rank's worker and each
 * chunk's server) it learns more slowly than per tensor: at step 24 of the fp32 case's runs,
 * 4.11 against AdamW's 3.47, which is why the 5% bound is the per-tensor case's. */
static void test_run_fp16(void)
{
	enum { S = 12, F = 8 };
	const char *fp16 = "--set deepspeed.fp16.enabled=true --set deepspeed.fp16.loss_scale=1024";
	char extra[512];
	snprintf(extra, sizeof(extra), "--steps 6 %s --set deepspeed.optimizer.params.freeze_step=4",
		 fp16);
	run_bytes(2, extra, 105312, 105328, 1684992 + 4, 15164928);
	double onebit[S], warm[S];
	CU_ASSERT_EQUAL_FATAL(px_run_losses(onebit_base(), 2, S, fp16, onebit), S);
	snprintf(extra, sizeof(extra), "%s --set deepspeed.optimizer.params.freeze_step=1000", fp16);
	CU_ASSERT_EQUAL_FATAL(px_run_losses(onebit_base(), 2, S, extra, warm), S);
	for (int s = 0; s <= F; s++)
		CU_ASSERT_EQUAL(onebit[s], warm[s]);
	CU_ASSERT(onebit[S - 1] != warm[S - 1]);
	CU_ASSERT(onebit[S - 1] < 0.9 * onebit[0]);
}

/* Beside tensor and pipeline parallelism the compressed all-reduce runs over each data-parallel
 * group, on each rank's own tensors: its shards under tensor parallelism (Megatron's mpu hands
 * DeepSpeed's NcclBackend the data-parallel group), its stage's under pipelining (the last
 * stage's copy of the tied embedding among them, a parameter of that stage). tp 2 x dp 2, bytes by
 * hand: a rank's shards of the GPT above are wte 256 x 128 / 2 = 16,384, wpe 16,384 and per layer
 * 2 x 128 + 128 x 384 / 2 + 192 + 64 x 128 + 128 + 2 x 128 + 128 x 512 / 2 + 256 + 256 x 128 +
 * 128 = 99,520, with ln_f 256: 431,104 elements in 52 tensors, none padded over 2 ranks
 * (multiples of 16). A compressed step: signs 431,104 / 8 = 53,888 B in each phase, and 52 x 2
 * scale all-gathers of 2 x 4 B: 54,720 B of all-gathers. A warm-up step all-reduces the
 * gradients, 4 x 431,104 = 1,724,416 B, the norm over dp then tp (4 + 4 B), and the
 * tensor-parallel activations of its 32 / (4 x 2) = 4 micro-batches, each 9 forward (embedding, 2
 * a layer) and 9 backward (2 a layer, the head) all-reduces of 256 x 128 fp32 and the
 * cross-entropy's 3 x 256: 4 x (18 x 131,072 + 3,072) = 9,449,472 B; 11,173,896 in all. The
 * optimizer's memory: 8 x 431,104 + 4 x (431,104 + 215,552) = 6,035,456 B.
 * Losses against the same optimizer on dp 2 alone, 12 steps, freeze_step 8: the warm-up's (steps
 * 1-9) within 1e-6 relative (the tensor-parallel sums reassociate fp32 products, the tp suite's
 * bound; pipelining changes no sum); after it each at most 5% above AdamW's and learning, as
 * check_compressed_losses holds the data-parallel runs (a shard's scale is not the whole
 * tensor's, so the compressed steps are not the same numbers). 0/1 Adam the same under tp 2.
 * 1-bit LAMB (its own scenario, against its dp-2 run): under pp 2 the same bound; under tp 2
 * each rank takes the LAMB coefficient of its shards, the norms of a shard's weights and update
 * (lamb.py computes them per parameter on the rank, and under Megatron's mpu a parameter is the
 * shard), so its warm-up's updates are not the data-parallel run's: held to 1e-3 (1.6e-5
 * measured by step 9; a momentum not exchanged, or a coefficient left out, moves the losses by
 * more than that over the compressed steps, which the bound covers too), and learning. */
static void test_run_model_parallel(void)
{
	enum { S = 12, F = 8 };
	run_bytes(4, "--steps 4 --set deepspeed.optimizer.params.freeze_step=1 --set "
		  "parallelism.tp=2", 53888, 54720, 11173896, 6035456);
	static const struct {
		int lamb;
		const char *set;
	} runs[] = {
		{0, "--set parallelism.tp=2"},
		{0, "--set parallelism.pp=2"},
		{0, "--set parallelism.tp=2 --set deepspeed.optimizer.type=ZeroOneAdam"},
		{1, "--set parallelism.pp=2"},
		{1, "--set parallelism.tp=2"},
	};
	char lamb[1024];
	snprintf(lamb, sizeof(lamb), "run '%s' --no-db --json",
		 px_test_path("scenarios/gpt2-mini-cpu-onebitlamb.json"));
	double dp[S], dp01[S], dplamb[S], adamw[S], got[S];
	CU_ASSERT_EQUAL_FATAL(px_run_losses(onebit_base(), 2, S, "", dp), S);
	CU_ASSERT_EQUAL_FATAL(px_run_losses(onebit_base(), 2, S,
					    "--set deepspeed.optimizer.type=ZeroOneAdam", dp01), S);
	CU_ASSERT_EQUAL_FATAL(px_run_losses(onebit_base(), 2, S,
					    "--set deepspeed.optimizer.type=AdamW", adamw), S);
	CU_ASSERT_EQUAL_FATAL(px_run_losses(lamb, 2, S, "", dplamb), S);
	for (size_t i = 0; i < sizeof(runs) / sizeof(runs[0]); i++) {
		const double *ref = runs[i].lamb ? dplamb : strstr(runs[i].set, "ZeroOne") ? dp01 : dp;
		int shards = runs[i].lamb && strstr(runs[i].set, "tp=2");
		CU_ASSERT_EQUAL_FATAL(px_run_losses(runs[i].lamb ? lamb : onebit_base(), 4, S,
						    runs[i].set, got), S);
		double warm = px_worst_rel(ref, got, shards ? S : F + 1);
		if (warm > (shards ? 1e-3 : 1e-6))
			fprintf(stderr, "\n%s%s: losses %g off dp 2's\n", runs[i].lamb ? "LAMB " : "",
				runs[i].set, warm);
		CU_ASSERT(warm <= (shards ? 1e-3 : 1e-6));
		int worse = 0;
		for (int k = F + 1; !runs[i].lamb && k < S; k++)
			worse += got[k] > 1.05 * adamw[k];
		CU_ASSERT_EQUAL(worse, 0);
		CU_ASSERT(got[S - 1] < 0.9 * got[0]);
	}
	/* what the executor does not run: the 1-bit optimizers beside experts */
	char out[4096];
	char args[1024];
	snprintf(args, sizeof(args), "run '%s' --no-db --ranks 2 --steps 1 --set "
		 "moe.num_experts=2 --set moe.ep_size=2 --set moe.use_rts=false",
		 px_test_path("scenarios/gpt2-mini-cpu-onebit.json"));
	CU_ASSERT_EQUAL(px_test_run_release(args, 120, out, sizeof(out)), 2);
	PX_ASSERT_HAS(out, "the 1-bit optimizers without experts");
}

/* ---- the executor: parallax run with 0/1 Adam (scenarios/gpt2-mini-cpu-zeroone.json) ---- */

/* kernels/ops_cpu's 0/1 Adam steps with the variance frozen, one weight by hand (zoadam.py's
 * update): p 1, m 0.5, v 0.04 (sqrt 0.2), u 0; lr 0.1, beta1 0.9, eps 0, no weight decay.
 *   local, g 1:   m = 0.45 + 0.1 = 0.55; d = 0.1 x 0.55 / 0.2 = 0.275; p 0.725, u -0.275
 *   local, g -1:  m = 0.495 - 0.1 = 0.395; d = 0.1975; p 0.5275, u -0.4725
 *   sync begin:   p -= u: 1 (the last synchronisation's weight); u *= 0.2: -0.0945
 *   (one rank: the average is u itself)
 *   sync end, lrs 0.2 (two steps of lr 0.1): m = -u / lrs = 0.4725; p += u / 0.2: 0.5275; u 0
 * and a weight decay of 0.5 adds lr x 0.5 x p to the first local step's d: 0.275 + 0.05. */
static void test_zero_one_kernel(void)
{
	float p = 1.0f, m = 0.5f, v = 0.04f, u = 0.0f, g = 1.0f;
	OpsAdamw h = {0.1, 0.9, 0.95, 0.0, 0.0};
	ops_zero_one_step(&p, &m, &v, &u, &g, 1, &h, OPS_ZO_LOCAL, 1.0f, 0);
	CU_ASSERT_DOUBLE_EQUAL(m, 0.55, 1e-6);
	CU_ASSERT_DOUBLE_EQUAL(p, 0.725, 1e-6);
	CU_ASSERT_DOUBLE_EQUAL(u, -0.275, 1e-6);
	g = -2.0f; /* grad_scale 0.5 makes it -1 */
	ops_zero_one_step(&p, &m, &v, &u, &g, 1, &h, OPS_ZO_LOCAL, 0.5f, 0);
	CU_ASSERT_DOUBLE_EQUAL(m, 0.395, 1e-6);
	CU_ASSERT_DOUBLE_EQUAL(p, 0.5275, 1e-6);
	CU_ASSERT_DOUBLE_EQUAL(u, -0.4725, 1e-6);
	ops_zero_one_step(&p, &m, &v, &u, NULL, 1, &h, OPS_ZO_SYNC_BEGIN, 1.0f, 0);
	CU_ASSERT_DOUBLE_EQUAL(p, 1.0, 1e-6);
	CU_ASSERT_DOUBLE_EQUAL(u, -0.0945, 1e-6);
	ops_zero_one_step(&p, &m, &v, &u, NULL, 1, &h, OPS_ZO_SYNC_END, 1.0f, 0.2);
	CU_ASSERT_DOUBLE_EQUAL(m, 0.4725, 1e-6);
	CU_ASSERT_DOUBLE_EQUAL(p, 0.5275, 1e-6);
	CU_ASSERT_EQUAL(u, 0.0f);
	p = 1.0f, m = 0.5f, u = 0.0f, g = 1.0f, h.weight_decay = 0.5;
	ops_zero_one_step(&p, &m, &v, &u, &g, 1, &h, OPS_ZO_LOCAL, 1.0f, 0);
	CU_ASSERT_DOUBLE_EQUAL(p, 1.0 - 0.325, 1e-6);
	CU_ASSERT_DOUBLE_EQUAL(u, -0.325, 1e-6);
}

static const char *zero_one_base(void)
{
	static char base[1024];
	snprintf(base, sizeof(base), "run '%s' --no-db --json",
		 px_test_path("scenarios/gpt2-mini-cpu-zeroone.json"));
	return base;
}

/* The scenario's var_update_scaler 2, var_freeze_step 12, local_step_scaler 3, local_step_clipper
 * 4 make steps 1-4 full (step 1 the initialisation's), step 5 compressed, then full at the
 * variance interval (2, then 4 after two more updates) with compressed gradients between;
 * from step 14 the variance is frozen: steps 14-16 synchronise (interval 1), 17 is local, 18
 * synchronises, ... (engine/onebit.c, traced by hand in test_zero_one_adam_steps).
 * - The same run with var_freeze_step and var_update_scaler 1000 never compresses: all its steps
 *   full, it is Adam without bias correction whose first step updates nothing, which is
 *   OneBitAdam's warm-up too: the two optimizers' runs equal to the bit.
 * - 0/1 Adam's losses 1-5 equal that run's to the bit (the loss of step 5 is taken before its
 *   compressed update), the last one not; from step 6 on each is at most 5% above the
 *   uncompressed run's (0/1 Adam converges as Adam does: Lu et al. 2022, arXiv:2202.06009, section
 *   6), and the last under 0.7 of the first. A synchronisation that averaged wrongly or lost
 *   the accumulated update would leave the losses above the bound.
 * - On one rank (no exchange) it learns too. */
static void test_run_zero_one_losses(void)
{
	enum { S = 24, C = 5 };
	double zo[S], plain[S], onebit[S], one[S];
	const char *never = "--set deepspeed.optimizer.params.var_freeze_step=1000 "
			    "--set deepspeed.optimizer.params.var_update_scaler=1000";
	CU_ASSERT_EQUAL_FATAL(px_run_losses(zero_one_base(), 2, S, "", zo), S);
	CU_ASSERT_EQUAL_FATAL(px_run_losses(zero_one_base(), 2, S, never, plain), S);
	CU_ASSERT_EQUAL_FATAL(warm_only_losses(onebit), S);
	for (int s = 0; s < S; s++)
		CU_ASSERT_EQUAL(plain[s], onebit[s]);
	check_compressed_losses("0/1 Adam", zo, plain, C, "never compressed", plain, S);
	CU_ASSERT_EQUAL_FATAL(px_run_losses(zero_one_base(), 1, S, "", one), S);
	CU_ASSERT(one[S - 1] < 0.7 * one[0]);
}

/* Bytes of 0/1 Adam's three kinds of step on 2 ranks, each per step of its kind and equal to the
 * prediction (px_run_measured). The GPT's 842,496 parameters in 52 tensors (test_run_bytes), none
 * padded over 2 ranks (to a multiple of 2 lcm(2, 8) = 16): a full step all-reduces the fp32
 * gradients, 4 x 842,496 = 3,369,984 B; a compressed one the signs once in each phase, 842,496 /
 * 8 = 105,312 B (all-to-all, then all-gather) and two all-gathers of 2 x 4 B of scales per tensor:
 * 105,312 + 52 x 16 = 106,144 B of all-gathers; every step, local ones too, the gradient norm's
 * 4 B averaged over the ranks (test_run_bytes), which a ring of 2 sends whole. The optimizer's
 * memory: three fp32 states (exp_avg, exp_avg_sq, momentum_accumulator) and the errors,
 * 4 x (3 x 842,496 + 842,496 + 421,248) = 15,164,928 B. fp16 with var_freeze_step 2: steps 1-3
 * full, 4-6 synchronise, 7 is local, 8 synchronises; FP16_Optimizer's flat exchanged whole: one
 * pair of scale all-gathers, 105,312 + 2 x 8 = 105,328 B; the full steps' fp16 gradients
 * 2 x 842,496 B and the overflow flag's 4 B, which a local step sends too (and no norm: under
 * FP16_Optimizer the engine does not clip by itself); the master weights added to the
 * optimizer's memory, 4 x 842,496 + 15,164,928 = 18,534,912 B. */
static void test_run_zero_one_bytes(void)
{
	sqlite3 *db = run_bytes_of("scenarios/gpt2-mini-cpu-zeroone.json", 2, "--steps 24", 105312,
				   106144, 3369984 + 4, 15164928);
	for (int r = 0; r < 2; r++)
		CU_ASSERT_EQUAL(px_run_metric(db, "comm.onebit_local.wire_bytes", "measured", r), 4);
	sqlite3_close(db);
	db = run_bytes_of("scenarios/gpt2-mini-cpu-zeroone.json", 2,
			  "--steps 8 --set deepspeed.fp16.enabled=true --set deepspeed.fp16.loss_scale=1024 "
			  "--set deepspeed.optimizer.params.var_freeze_step=2",
			  105312, 105328, 1684992 + 4, 18534912);
	for (int r = 0; r < 2; r++)
		CU_ASSERT_EQUAL(px_run_metric(db, "comm.onebit_local.wire_bytes", "measured", r), 4);
	sqlite3_close(db);
}

/* ---- the executor: parallax run with 1-bit LAMB (scenarios/gpt2-mini-cpu-onebitlamb.json) ---- */

/* kernels/lamb_cpu by hand (lamb.py's arithmetic), lr 0.1, beta1 0.9, eps 0, no weight decay.
 * Warm-up: w (3, 4), m v 0, g (1, -1), beta2 0.99: m (0.1, -0.1), v (0.01, 0.01), update (1, -1);
 *   coefficient ||w|| / ||update|| = 5 / sqrt(2) = 3.5355339 (under max_coeff 10), its average
 *   0.9 x 0 + 0.1 x 3.5355339; w -= 0.1 x 3.5355339 x update: (2.6464466, 4.3535534); the fresh
 *   variance copied. With max_coeff 2: coefficient 2, w (2.8, 4.2).
 * (Within 1e-5: fp32's 1 - 0.9 and 1 - 0.99 are not the decimals, 2.5e-6 off here.)
 * Compressed, after the exchange: m (0.2, -0.2) scaled by 2 -> (0.1, -0.1); m_last (0.1, 0.1):
 *   the rebuilt gradient (m - 0.9 m_last) / 0.1 = (0.1, -1.9); v_fresh (0.01, 0.01) -> 0.99 x 0.01
 *   + 0.01 r^2 = (0.01, 0.0460); frozen v (0.01, 0.04): denom (0.1, 0.2), over sqrt(v_fresh) + 0
 *   = (0.1, 0.2144761): ratios (1, 0.9325048), factor 1; last_factor 2 bounds it to [1.8, 2.2]:
 *   1.8; coefficient 0.5 x 1.8 = 0.9; w (1, 1) -= 0.1 x 0.9 x (1, -0.5): (0.91, 1.045). */
static void test_lamb_kernels(void)
{
	LambHyper h = {0.1, 0.9, 0.99, 0.0, 0.0, 10.0, 0.01, 0.9, 4.0, 0.5, 0.1};
	float w[2] = {3, 4}, m[2] = {0, 0}, v[2] = {0, 0}, vf[2] = {0, 0}, g[2] = {1, -1};
	double cf = 0;
	CU_ASSERT_DOUBLE_EQUAL(lamb_cpu_warmup(w, m, v, vf, g, 2, &h, 1.0f, 1, &cf), 3.5355339, 1e-5);
	CU_ASSERT_DOUBLE_EQUAL(cf, 0.35355339, 1e-6);
	CU_ASSERT_DOUBLE_EQUAL(w[0], 2.6464466, 1e-6);
	CU_ASSERT_DOUBLE_EQUAL(w[1], 4.3535534, 1e-6);
	CU_ASSERT_DOUBLE_EQUAL(m[1], -0.1, 1e-7);
	CU_ASSERT_DOUBLE_EQUAL(vf[0], 0.01, 1e-8);
	float w2[2] = {3, 4}, m2[2] = {0, 0}, v2[2] = {0, 0}, vf2[2] = {0, 0};
	h.max_coeff = 2.0;
	CU_ASSERT_DOUBLE_EQUAL(lamb_cpu_warmup(w2, m2, v2, vf2, g, 2, &h, 1.0f, 0, &cf), 2.0, 0);
	CU_ASSERT_DOUBLE_EQUAL(w2[0], 2.8, 1e-6);
	CU_ASSERT_DOUBLE_EQUAL(w2[1], 4.2, 1e-6);
	CU_ASSERT_EQUAL(vf2[0], 0.0f); /* not the step that reaches freeze_step */

	float cw[2] = {1, 1}, cm[2] = {0.2f, -0.2f}, last[2] = {0.1f, 0.1f}, cv[2] = {0.01f, 0.04f};
	float cvf[2] = {0.01f, 0.01f};
	double lf = 2.0;
	CU_ASSERT_DOUBLE_EQUAL(lamb_cpu_compressed(cw, cm, last, cv, cvf, 2, &h, 2.0f, 0.5, &lf), 0.9,
			       1e-6);
	CU_ASSERT_DOUBLE_EQUAL(lf, 1.8, 1e-9);
	CU_ASSERT_DOUBLE_EQUAL(cm[0], 0.1, 1e-7);
	CU_ASSERT_DOUBLE_EQUAL(cvf[0], 0.01, 1e-8);
	CU_ASSERT_DOUBLE_EQUAL(cvf[1], 0.046, 1e-7);
	CU_ASSERT_DOUBLE_EQUAL(cw[0], 0.91, 1e-6);
	CU_ASSERT_DOUBLE_EQUAL(cw[1], 1.045, 1e-6);
	/* the momentum's update and scaling before the exchange: (0.9 x 0.1 + 0.1 x 1) x 2 */
	float mm[1] = {0.1f}, gg[1] = {2.0f};
	lamb_cpu_momentum(mm, gg, 1, 0.9, 0.5f, 2.0f);
	CU_ASSERT_DOUBLE_EQUAL(mm[0], 0.38, 1e-6);
}

static const char *lamb_base(void)
{
	static char base[1024];
	snprintf(base, sizeof(base), "run '%s' --no-db --json",
		 px_test_path("scenarios/gpt2-mini-cpu-onebitlamb.json"));
	return base;
}

/* freeze_step 8 (lr 0.02, coeff_beta 0.5): steps 1-8 LAMB's warm-up, then compressed. Against the
 * run that never compresses (freeze_step 1000): steps 1-9 to the bit, then each loss at most 5%
 * above (1-bit LAMB converges as LAMB does: Li et al. 2021, arXiv:2104.06069, section 5), the last
 * under 0.7 of the first; on one rank (no exchange, the compressed update all the same) it learns.
 * Tried on purpose: a compressed step that leaves the momenta scaled diverges (the loss passes 10
 * by step 13); a wrong rebuilt gradient ends 1.9% above the never-compressed run, inside the
 * bound: test_lamb_kernels's fresh variance is what catches that one. */
static void test_run_lamb_losses(void)
{
	enum { S = 24, F = 8 };
	double lamb[S], plain[S], one[S];
	CU_ASSERT_EQUAL_FATAL(px_run_losses(lamb_base(), 2, S, "", lamb), S);
	CU_ASSERT_EQUAL_FATAL(px_run_losses(lamb_base(), 2, S,
					    "--set deepspeed.optimizer.params.freeze_step=1000", plain),
			      S);
	check_compressed_losses("1-bit LAMB", lamb, plain, F + 1, "never compressed", plain, S);
	CU_ASSERT_EQUAL_FATAL(px_run_losses(lamb_base(), 1, S, "", one), S);
	CU_ASSERT(one[S - 1] < 0.7 * one[0]);
}

/* 1-bit LAMB's bytes on 2 ranks, each equal to the prediction (px_run_measured): one exchange of
 * the fused momenta of all 842,496 parameters (a multiple of 2 lcm(2, 8) = 16: no dummy padding),
 * 105,312 B of signs in each phase and one pair of 2 x 4 B scale all-gathers: 105,328 B of
 * all-gathers; the warm-up's fp32 all-reduce 3,369,984 B and every step's gradient norm, 4 B
 * (test_run_bytes). Memory: three fp32 states (exp_avg,
 * exp_avg_sq, exp_avg_sq_fresh) and one pair of errors, 4 x (3 x 842,496 + 842,496 + 421,248) =
 * 15,164,928 B at the step's peak, and at the optimizer category's own peak the compressed
 * step's copy of the momenta on top, 4 x 842,496 = 3,369,984: 18,534,912 B. The warm-up takes no
 * copy (lamb.py: only under lamb_freeze_key): a run that never leaves it holds 15,164,928 B at
 * the optimizer's peak too, what the executor measures (the prediction, the highest kind of
 * step's, keeps the copy: the run's length does not enter it). */
static void test_run_lamb_bytes(void)
{
	sqlite3 *db = run_bytes_of("scenarios/gpt2-mini-cpu-onebitlamb.json", 2,
				   "--steps 12 --set deepspeed.optimizer.params.freeze_step=4", 105312,
				   105328, 3369984 + 4, 15164928);
	for (int r = 0; r < 2; r++)
		CU_ASSERT_EQUAL(px_run_metric(db, "memory.gpu.peak.optimizer_bytes", "measured", r),
				18534912);
	sqlite3_close(db);
	static char text[65536];
	char args[1024], db_path[512];
	snprintf(db_path, sizeof(db_path), "%s/warm.db", px_test_tmpdir());
	snprintf(args, sizeof(args), "run '%s' --ranks 2 --steps 3 --db '%s' --set "
		 "deepspeed.optimizer.params.freeze_step=1000",
		 px_test_path("scenarios/gpt2-mini-cpu-onebitlamb.json"), db_path);
	CU_ASSERT_EQUAL_FATAL(px_test_run_release(args, 180, text, sizeof(text)), 0);
	CU_ASSERT_EQUAL_FATAL(sqlite3_open(db_path, &db), SQLITE_OK);
	for (int r = 0; r < 2; r++) {
		CU_ASSERT_EQUAL(px_run_metric(db, "memory.gpu.peak.optimizer_bytes", "measured", r),
				15164928);
		CU_ASSERT_EQUAL(px_run_metric(db, "memory.gpu.peak.optimizer_bytes", "predicted", r),
				18534912);
	}
	sqlite3_close(db);
}

int test_onebit_register(void)
{
	return PX_ADD_SUITE("onebit", {"one compressed all-reduce's bytes by hand", test_volume_by_hand},
			    {"1-bit Adam's steps", test_onebit_adam_steps},
			    {"0/1 Adam's steps traced by hand", test_zero_one_adam_steps},
			    {"fp32 schedule: one exchange per tensor", test_schedule_fp32_per_tensor},
			    {"fp16 schedule: one flat, the run averaged; bf16 refused", test_schedule_fp16_flat},
			    {"1-bit LAMB's flat, 0/1 Adam's local steps", test_lamb_and_zero_one},
			    {"the paper's 32x and 5x on the schedule", test_paper_reduction},
			    {"parallax predict's section and bad input", test_cli},
			    {"compressed all-reduce on 2 ranks, by hand", test_allreduce_2, PX_RELEASE_RUN},
			    {"compressed all-reduce on 4 ranks", test_allreduce_4, PX_RELEASE_RUN},
			    {"run: losses against the warm-up's and AdamW's", test_run_losses, PX_RELEASE_RUN},
			    {"run: bytes measured equal predicted and by hand", test_run_bytes, PX_RELEASE_RUN},
			    {"run: fp16, FP16_Optimizer's flat exchanged whole", test_run_fp16, PX_RELEASE_RUN},
			    {"run: beside tensor and pipeline parallelism (1-bit LAMB too), bytes by hand",
			     test_run_model_parallel, PX_RELEASE_RUN},
			    {"0/1 Adam's frozen-variance steps by hand", test_zero_one_kernel},
			    {"run: 0/1 Adam's losses against the never-compressed run's",
			     test_run_zero_one_losses, PX_RELEASE_RUN},
			    {"run: 0/1 Adam's bytes by kind of step, measured equal predicted and by hand",
			     test_run_zero_one_bytes, PX_RELEASE_RUN},
			    {"1-bit LAMB's warm-up and compressed updates by hand", test_lamb_kernels},
			    {"run: 1-bit LAMB's losses against the never-compressed run's",
			     test_run_lamb_losses, PX_RELEASE_RUN},
			    {"run: 1-bit LAMB's bytes and memory, measured equal predicted and by hand",
			     test_run_lamb_bytes, PX_RELEASE_RUN});
}

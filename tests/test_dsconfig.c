/* DeepSpeed config: the batch rules of deepspeed/runtime/config.py (_set_batch_related_parameters
 * and _batch_assertion), "auto" resolution as transformers' integrations/deepspeed.py does it, and
 * the combinations DeepSpeed refuses. */
#include <CUnit/CUnit.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../exec/runner.h"
#include "fixtures.h"
#include "suites.h"

/* Load a deepspeed object and resolve it for dp ranks against GPT-2 small (h = 768). Returns 0,
 * or -1 with err holding the message of whichever step refused it. */
static int resolve(const char *ds_json, long long dp, DsConfig *ds, PxError *err)
{
	char json[4096];
	Scenario sc;
	snprintf(json, sizeof(json),
		 "{%s, \"deepspeed\": %s, \"cluster\": {\"gpu\": \"A100-80GB\", \"nodes\": 1,"
		 " \"gpus_per_node\": %lld}, \"seq_length\": 128}", fx_model("gpt2"), ds_json, dp);
	char path[512];
	snprintf(path, sizeof(path), "%s/scenario.json", px_test_tmpdir());
	px_test_write_file(path, json);
	if (scenario_load(&sc, path, NULL, err)) /* bad values fail here, before resolution */
		return -1;
	int rc = dsconfig_resolve(&sc.ds, &sc.model, &sc.train_args, dp, err);
	*ds = sc.ds;
	ds->source = NULL;
	scenario_free(&sc);
	return rc;
}

static void expect_batch(const char *ds_json, long long dp, long long tb, long long mb,
			 long long ga)
{
	DsConfig ds;
	PxError err = {0};
	int rc = resolve(ds_json, dp, &ds, &err);
	if (rc)
		fprintf(stderr, "\n%s: %s\n", ds_json, err.msg);
	CU_ASSERT_EQUAL_FATAL(rc, 0);
	CU_ASSERT_EQUAL(ds.train_batch, tb);
	CU_ASSERT_EQUAL(ds.micro_batch, mb);
	CU_ASSERT_EQUAL(ds.grad_accum, ga);
}

static void expect_error(const char *ds_json, long long dp, const char *fragment)
{
	DsConfig ds;
	PxError err = {0};
	CU_ASSERT_EQUAL(resolve(ds_json, dp, &ds, &err), -1);
	CU_ASSERT_EQUAL(err.code, PX_ERR_INPUT);
	if (!strstr(err.msg, fragment))
		fprintf(stderr, "\nexpected '%s' in: %s\n", fragment, err.msg);
	CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, fragment));
}

/* pipeline.pipe_partitioned and grad_partitioned (runtime/config.py get_pipeline_config): on
 * when absent, read when given, and a value that is no boolean refused naming the key. */
static void test_pipe_partitioned(void)
{
	static const struct { const char *pipeline; int pipe, grad; } c[] = {
		{"", 1, 1},
		{", \"pipeline\": {\"pipe_partitioned\": false}", 0, 1},
		{", \"pipeline\": {\"grad_partitioned\": false}", 1, 0},
	};
	for (unsigned i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
		char json[512];
		DsConfig ds;
		PxError err = {0};
		snprintf(json, sizeof(json), "{\"train_micro_batch_size_per_gpu\": 1%s}", c[i].pipeline);
		CU_ASSERT_EQUAL_FATAL(resolve(json, 1, &ds, &err), 0);
		CU_ASSERT_EQUAL(ds.pipe_partitioned, c[i].pipe);
		CU_ASSERT_EQUAL(ds.grad_partitioned, c[i].grad);
	}
	expect_error("{\"train_micro_batch_size_per_gpu\": 1, \"pipeline\": {\"pipe_partitioned\": "
		     "\"yes\"}}", 1, "deepspeed.pipeline.pipe_partitioned: expected true or false");
}

static void test_batch_rules(void)
{
	/* all three given and consistent */
	expect_batch("{\"train_batch_size\": 64, \"train_micro_batch_size_per_gpu\": 4,"
		     " \"gradient_accumulation_steps\": 2}", 8, 64, 4, 2);
	/* train and micro: accumulation = train // micro // world */
	expect_batch("{\"train_batch_size\": 64, \"train_micro_batch_size_per_gpu\": 2}", 8, 64, 2, 4);
	/* train and accumulation: micro = train // world // accumulation */
	expect_batch("{\"train_batch_size\": 64, \"gradient_accumulation_steps\": 4}", 8, 64, 2, 4);
	/* micro and accumulation: train = micro * accumulation * world */
	expect_batch("{\"train_micro_batch_size_per_gpu\": 3, \"gradient_accumulation_steps\": 5}", 4,
		     60, 3, 5);
	/* train only: accumulation 1, micro = train // world */
	expect_batch("{\"train_batch_size\": 32}", 8, 32, 4, 1);
	/* micro only: accumulation 1, train = micro * world */
	expect_batch("{\"train_micro_batch_size_per_gpu\": 6}", 2, 12, 6, 1);
}

static void test_batch_errors(void)
{
	/* DeepSpeed's _batch_assertion message, with the numbers */
	expect_error("{\"train_batch_size\": 100, \"train_micro_batch_size_per_gpu\": 4,"
		     " \"gradient_accumulation_steps\": 2}", 8,
		     "train_batch_size is not equal to micro_batch_per_gpu * gradient_acc_step * "
		     "world_size: 100 != 4 * 2 * 8");
	/* integer division makes 100 // 8 // 4 = 3, then 3 * 4 * 8 != 100 */
	expect_error("{\"train_batch_size\": 100, \"train_micro_batch_size_per_gpu\": 4}", 8,
		     "100 != 4 * 3 * 8");
	expect_error("{}", 8, "either train_batch_size or train_micro_batch_size_per_gpu");
	expect_error("{\"train_batch_size\": 4}", 8, "train_micro_batch_size_per_gpu: 0 has to be "
		     "greater than 0");
	expect_error("{\"train_batch_size\": -8}", 8, "train_batch_size: expected an integer");
	expect_error("{\"train_batch_size\": 64, \"train_micro_batch_size_per_gpu\": 16}", 8,
		     "gradient_accumulation_steps: 0 has to be greater than 0");
}

/* transformers' integrations/deepspeed.py: TrainingArguments fill the batch, precision and
 * optimizer values; reduce_bucket_size = hidden^2, stage3_prefetch_bucket_size = 0.9 hidden^2,
 * stage3_param_persistence_threshold = 10 hidden. */
static void test_auto_values(void)
{
	DsConfig ds;
	PxError err = {0};
	int rc = resolve("{\"train_batch_size\": \"auto\", \"train_micro_batch_size_per_gpu\": \"auto\","
			 " \"gradient_accumulation_steps\": \"auto\", \"gradient_clipping\": \"auto\","
			 " \"fp16\": {\"enabled\": \"auto\"}, \"optimizer\": {\"type\": \"AdamW\","
			 " \"params\": {\"lr\": \"auto\", \"betas\": \"auto\", \"eps\": \"auto\","
			 " \"weight_decay\": \"auto\"}}, \"zero_optimization\": {\"stage\": 3,"
			 " \"reduce_bucket_size\": \"auto\", \"stage3_prefetch_bucket_size\": \"auto\","
			 " \"stage3_param_persistence_threshold\": \"auto\"}}", 4, &ds, &err);
	CU_ASSERT_EQUAL_FATAL(rc, 0);
	/* TrainingArguments defaults: per-device batch 8, accumulation 1, fp16 off, lr 5e-5,
	 * max_grad_norm 1.0 */
	CU_ASSERT_EQUAL(ds.micro_batch, 8);
	CU_ASSERT_EQUAL(ds.grad_accum, 1);
	CU_ASSERT_EQUAL(ds.train_batch, 32);
	CU_ASSERT_EQUAL(ds.fp16, 0);
	CU_ASSERT_EQUAL(ds.dtype, DT_FP32);
	CU_ASSERT_DOUBLE_EQUAL(ds.gradient_clipping, 1.0, 0);
	CU_ASSERT_DOUBLE_EQUAL(ds.lr, 5e-5, 0);
	CU_ASSERT_DOUBLE_EQUAL(ds.beta2, 0.999, 0);
	CU_ASSERT_DOUBLE_EQUAL(ds.zero.reduce_bucket_elems, 768.0 * 768, 0);
	CU_ASSERT_DOUBLE_EQUAL(ds.zero.prefetch_bucket_elems, 530841, 0); /* int(0.9 * 589824) */
	CU_ASSERT_DOUBLE_EQUAL(ds.zero.persistence_threshold_elems, 7680, 0);
}

static void test_training_args_feed_autos(void)
{
	char json[2048];
	Scenario sc;
	Prediction pr;
	snprintf(json, sizeof(json),
		 "{%s, \"training_args\": {\"per_device_train_batch_size\": 16,"
		 " \"gradient_accumulation_steps\": 2, \"bf16\": true, \"gradient_checkpointing\": true},"
		 " \"deepspeed\": {\"train_batch_size\": \"auto\", \"train_micro_batch_size_per_gpu\":"
		 " \"auto\", \"gradient_accumulation_steps\": \"auto\", \"bf16\": {\"enabled\": \"auto\"}},"
		 " \"cluster\": {\"gpu\": \"H100-SXM\", \"nodes\": 2, \"gpus_per_node\": 8},"
		 " \"seq_length\": 512}", fx_model("gpt2"));
	if (fx_predict(&sc, &pr, json))
		return;
	CU_ASSERT_EQUAL(sc.ds.train_batch, 16 * 2 * 16);
	CU_ASSERT_EQUAL(sc.ds.micro_batch, 16);
	CU_ASSERT_EQUAL(sc.ds.grad_accum, 2);
	CU_ASSERT_EQUAL(sc.ds.dtype, DT_BF16);
	CU_ASSERT_EQUAL(sc.ckpt, CKPT_FULL);
	fx_free(&sc, &pr);
}

static void test_refusals(void)
{
	expect_error("{\"train_batch_size\": 8, \"fp16\": {\"enabled\": true}, \"bf16\":"
		     " {\"enabled\": true}}", 8, "bfloat16 and fp16 modes cannot be simultaneously");
}

/* Optimizer state widths: K = 4 (master) + 4 per fp32 state in mixed precision. */
static void test_optimizer_states(void)
{
	static const struct {
		const char *opt;
		int states;
	} cases[] = {{"{\"type\": \"Adam\"}", 2}, {"{\"type\": \"AdamW\"}", 2},
		     {"{\"type\": \"adamw\"}", 2}, /* DeepSpeed lower-cases its own names */
		     {"{\"type\": \"Lamb\"}", 2}, {"{\"type\": \"Adagrad\"}", 1},
		     {"{\"type\": \"Lion\"}", 1}, {"{\"type\": \"SGD\", \"params\": {\"momentum\": 0.9}}", 1},
		     {"{\"type\": \"SGD\"}", 0},
		     /* torch.optim's Adam with amsgrad keeps max_exp_avg_sq as a third */
		     {"{\"type\": \"Adam\", \"params\": {\"amsgrad\": true, \"torch_adam\": true}}", 3},
		     /* 1-bit Adam: exp_avg, exp_avg_sq; 0/1 Adam adds momentum_accumulator; 1-bit
		      * LAMB adds exp_avg_sq_fresh (their error feedback is counted apart) */
		     {"{\"type\": \"OneBitAdam\"}", 2}, {"{\"type\": \"ZeroOneAdam\"}", 3},
		     {"{\"type\": \"OneBitLamb\"}", 3},
		     /* Muon: Adam's two on what it does not update (its matrices: see the memory
		      * test); mup's optimizers as their bases */
		     {"{\"type\": \"Muon\"}", 2}, {"{\"type\": \"MuAdamW\"}", 2},
		     {"{\"type\": \"MuSGD\", \"params\": {\"momentum\": 0.9}}", 1},
		     /* torch.optim by exact name: RMSprop square_avg (+ momentum_buffer, + grad_avg
		      * when centered), Adadelta square_avg and acc_delta, NAdam exp_avg and
		      * exp_avg_sq, ASGD ax */
		     {"{\"type\": \"RMSprop\"}", 1},
		     {"{\"type\": \"RMSprop\", \"params\": {\"momentum\": 0.9, \"centered\": true}}", 3},
		     {"{\"type\": \"Adadelta\"}", 2}, {"{\"type\": \"NAdam\"}", 2},
		     {"{\"type\": \"ASGD\"}", 1}};
	for (unsigned i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char json[512];
		DsConfig ds;
		PxError err = {0};
		snprintf(json, sizeof(json), "{\"train_batch_size\": 8, \"optimizer\": %s}",
			 cases[i].opt);
		CU_ASSERT_EQUAL_FATAL(resolve(json, 8, &ds, &err), 0);
		CU_ASSERT_EQUAL(ds.optimizer_states, cases[i].states);
	}
	DsConfig ds;
	PxError err = {0};
	CU_ASSERT_EQUAL(resolve("{\"train_batch_size\": 8}", 8, &ds, &err), 0);
	CU_ASSERT_STRING_EQUAL(ds.optimizer, "AdamW"); /* the Trainer's default */
	/* names outside DeepSpeed's own list are getattr(torch.optim, name): case matters */
	expect_error("{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"sgd\"}}", 8,
		     "torch.optim has no \"sgd\"");
	expect_error("{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"sgd\"}}", 8,
		     "did you mean \"SGD\"?");
	/* FusedAdam is a class, not a type DeepSpeed's config knows */
	expect_error("{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"FusedAdam\"}}", 8,
		     "expected one of Adam, AdamW, Lamb, OneBitAdam");
	/* amsgrad on DeepSpeed's FusedAdam: its constructor raises */
	expect_error("{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"AdamW\", \"params\":"
		     " {\"amsgrad\": true}}}", 8, "FusedAdam does not support the AMSGrad variant");
}

/* deepspeed/runtime/lr_schedules.py, worked by hand: the scheduler starts at warmup_min_lr and steps
 * after each update, so update k runs at iteration k - 2. WarmupLR, log warm-up over N = 10 from 0
 * to 1e-3: updates 1 and 2 at 0, update 3 at 1e-3 log(2)/log(10) = 3.0103e-4, update 11 at
 * 1e-3 log(10)/log(10)... iteration 9: 1e-3 log(10)/log(10) = 1e-3; linear warm-up: update 7 at
 * 1e-3 * 5/10. WarmupDecayLR to total 20: update 17 (iteration 15) at 1e-3 (20 - 15)/(20 - 10). */
static void test_lr_schedules(void)
{
	DsConfig ds;
	PxError err = {0};
	CU_ASSERT_EQUAL_FATAL(resolve("{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"AdamW\","
				      " \"params\": {\"lr\": 1e-3}}, \"scheduler\": {\"type\": \"WarmupLR\","
				      " \"params\": {\"warmup_min_lr\": 0, \"warmup_max_lr\": 1e-3,"
				      " \"warmup_num_steps\": 10}}}", 8, &ds, &err), 0);
	CU_ASSERT_DOUBLE_EQUAL(dsconfig_lr(&ds, 1), 0, 0);
	CU_ASSERT_DOUBLE_EQUAL(dsconfig_lr(&ds, 2), 0, 0);
	CU_ASSERT_DOUBLE_EQUAL(dsconfig_lr(&ds, 3), 1e-3 * log(2) / log(10), 1e-15);
	CU_ASSERT_DOUBLE_EQUAL(dsconfig_lr(&ds, 11), 1e-3, 1e-15);
	CU_ASSERT_DOUBLE_EQUAL(dsconfig_lr(&ds, 500), 1e-3, 1e-15);
	ds.sched_linear = 1;
	CU_ASSERT_DOUBLE_EQUAL(dsconfig_lr(&ds, 7), 1e-3 * 5 / 10, 1e-15);
	ds.sched_linear = 0;
	ds.sched = 2;
	ds.total_num_steps = 20;
	CU_ASSERT_DOUBLE_EQUAL(dsconfig_lr(&ds, 17), 1e-3 * 5 / 10, 1e-15);
	CU_ASSERT_DOUBLE_EQUAL(dsconfig_lr(&ds, 30), 0, 1e-15);
	/* WarmupDecayLR without total_num_steps is refused */
	CU_ASSERT_EQUAL(resolve("{\"train_batch_size\": 8, \"scheduler\": {\"type\": \"WarmupDecayLR\","
				" \"params\": {\"warmup_num_steps\": 10}}}", 8, &ds, &err), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "total_num_steps"));
}

/* ---- what DeepSpeed accepts and the HF integration fills ---- */

/* Load a scenario with the given deepspeed object (and extra top-level members, such as
 * training_args) on 16 GPUs against GPT-2 small; CU_FAIL and -1 when it does not load. */
static int load(Scenario *sc, const char *ds_json, const char *extra)
{
	char json[4096], path[512];
	PxError err = {0};
	snprintf(json, sizeof(json),
		 "{%s, \"deepspeed\": %s, \"cluster\": {\"gpu\": \"H100-SXM\", \"nodes\": 2,"
		 " \"gpus_per_node\": 8}, \"seq_length\": 128%s%s}", fx_model("gpt2"), ds_json,
		 extra ? ", " : "", extra ? extra : "");
	snprintf(path, sizeof(path), "%s/scenario.json", px_test_tmpdir());
	px_test_write_file(path, json);
	if (scenario_load(sc, path, NULL, &err)) {
		fprintf(stderr, "\n%s\n", err.msg);
		CU_FAIL("scenario refused");
		return -1;
	}
	return 0;
}

/* runtime/zero/config.py: sub_group_size is an int >= 0 with no upper bound; axolotl's zero3
 * configs write 0 and 1e9, transformers' tests 1e14; "auto" is dropped to 1e9. */
static void test_sub_group_size(void)
{
	static const struct {
		const char *value;
		double elems;
	} cases[] = {{"0", 0}, {"1e9", 1e9}, {"1e14", 1e14}, {"100000000000000", 1e14},
		     {"\"auto\"", 1e9}};
	for (unsigned i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char ds[256];
		Scenario sc;
		snprintf(ds, sizeof(ds), "{\"train_micro_batch_size_per_gpu\": 1, \"zero_optimization\":"
			 " {\"stage\": 3, \"sub_group_size\": %s}}", cases[i].value);
		if (load(&sc, ds, NULL))
			continue;
		CU_ASSERT_DOUBLE_EQUAL(sc.ds.zero.sub_group_elems, cases[i].elems, 0);
		scenario_free(&sc);
	}
	expect_error("{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": 3,"
		     " \"sub_group_size\": -1}}", 8, "sub_group_size: expected a number from 0");
}

/* sub_group_size 0: stage3.py closes a sub-group as soon as it holds sub_group_size elements,
 * so every parameter is its own. NVMe optimizer offload keeps buffer_count host swap buffers
 * of the largest sub-group's fp32 partition. A params-only model of 8e6 in 8 layers is 8
 * tensors of 1e6; over 4 GPUs a tensor's partition is 250,000 elements, so the 4 default
 * buffers hold 4 x 250,000 x 4 B = 4e6 B. With the default 1e9 the sub-group is the whole
 * partition of 2e6: 4 x 2e6 x 4 B = 32e6 B. */
static void test_sub_group_zero_nvme_by_hand(void)
{
	static const char *const fmt =
		"{\"model\": {\"num_parameters\": 8e6, \"num_hidden_layers\": 8},"
		" \"deepspeed\": {\"train_micro_batch_size_per_gpu\": 1, \"fp16\": {\"enabled\": true},"
		" \"zero_optimization\": {\"stage\": 3, \"offload_optimizer\": {\"device\": \"nvme\","
		" \"nvme_path\": \"/local_nvme\"}%s}},"
		" \"cluster\": {\"gpu\": \"A100-80GB\", \"nodes\": 1, \"gpus_per_node\": 4}}";
	static const struct {
		const char *extra;
		double swap_bytes;
	} cases[] = {{", \"sub_group_size\": 0", 4e6}, {"", 32e6}};
	for (int i = 0; i < 2; i++) {
		Scenario sc;
		Prediction pr;
		if (fx_predictf(&sc, &pr, fmt, cases[i].extra))
			return;
		double swap = 0;
		for (int k = 0; k < pr.stages[0].sched.n; k++) {
			const Op *op = &pr.stages[0].sched.ops[k];
			if (op->kind == OP_ALLOC && op->what == BUF_SWAP)
				swap += op->bytes;
		}
		CU_ASSERT_DOUBLE_EQUAL(swap, cases[i].swap_bytes, 0);
		fx_free(&sc, &pr);
	}
}

/* nvme_path is kept for the executor's swap files in a 256-byte field: a longer one is refused
 * naming the key and both lengths, not cut short. */
static void test_nvme_path_too_long(void)
{
	char path[301], json[1024];
	memset(path, 'a', 300);
	path[0] = '/', path[300] = '\0';
	snprintf(json, sizeof(json), "{\"train_batch_size\": 8, \"train_micro_batch_size_per_gpu\": 1,"
		 " \"zero_optimization\": {\"stage\": 3, \"offload_optimizer\": {\"device\":"
		 " \"nvme\", \"nvme_path\": \"%s\"}}}", path);
	expect_error(json, 8, "offload_optimizer.nvme_path: expected a path of at most 255 "
			      "characters, got 300");
}

/* runtime/zero/config.py read_zero_config_deprecated: "zero_optimization": true is stage 1 with
 * the top-level allgather_size (default 5e8) as its bucket; false is stage 0. */
static void test_zero_boolean(void)
{
	Scenario sc;
	if (load(&sc, "{\"train_micro_batch_size_per_gpu\": 1, \"zero_optimization\": true,"
		 " \"allgather_size\": 2e8}", NULL))
		return;
	CU_ASSERT_EQUAL(sc.ds.zero.stage, 1);
	CU_ASSERT_DOUBLE_EQUAL(sc.ds.zero.allgather_bucket_elems, 2e8, 0);
	CU_ASSERT(fx_noted(&sc.notes, "deprecated form; read as {\"stage\": 1}"));
	CU_ASSERT_FALSE(fx_noted(&sc.notes, "unknown key"));
	scenario_free(&sc);
	if (load(&sc, "{\"train_micro_batch_size_per_gpu\": 1, \"zero_optimization\": false}", NULL))
		return;
	CU_ASSERT_EQUAL(sc.ds.zero.stage, 0);
	CU_ASSERT(fx_noted(&sc.notes, "read as {\"stage\": 0}"));
	scenario_free(&sc);
	expect_error("{\"train_batch_size\": 8, \"zero_optimization\": 3}", 8,
		     "zero_optimization: expected an object");
}

/* Only stage3.py reads offload_param; below stage 3 DeepSpeed runs as if it were absent. The
 * prediction with it equals the one without, and a warning says it is ignored. */
static void test_offload_param_below_stage3(void)
{
	static const char *const fmt =
		"{%s, \"deepspeed\": {\"train_micro_batch_size_per_gpu\": 2, \"bf16\": {\"enabled\": true},"
		" \"zero_optimization\": {\"stage\": 2%s}}, \"cluster\": {\"gpu\": \"H100-SXM\","
		" \"nodes\": 1, \"gpus_per_node\": 8}, \"seq_length\": 256}";
	Scenario a, b;
	Prediction pa, pb;
	if (fx_predictf(&a, &pa, fmt, fx_model("gpt2"),
			", \"offload_param\": {\"device\": \"cpu\", \"pin_memory\": true}"))
		return;
	if (fx_predictf(&b, &pb, fmt, fx_model("gpt2"), "")) {
		fx_free(&a, &pa);
		return;
	}
	CU_ASSERT_EQUAL(a.ds.zero.offload_param.device, DEV_NONE);
	CU_ASSERT(fx_noted(&a.notes, "offload_param: device cpu is ignored at ZeRO stage 2"));
	for (int place = 0; place < N_PLACES; place++)
		CU_ASSERT_DOUBLE_EQUAL(pa.stages[0].mem.place[place].peak_bytes,
				       pb.stages[0].mem.place[place].peak_bytes, 0);
	fx_free(&a, &pa);
	fx_free(&b, &pb);
	/* the deprecated spelling too */
	Scenario c;
	if (load(&c, "{\"train_micro_batch_size_per_gpu\": 1, \"zero_optimization\": {\"stage\": 1,"
		 " \"cpu_offload_param\": true}}", NULL))
		return;
	CU_ASSERT_EQUAL(c.ds.zero.offload_param.device, DEV_NONE);
	CU_ASSERT(fx_noted(&c.notes, "is ignored at ZeRO stage 1"));
	scenario_free(&c);
}

/* DeepSpeedConfigModel drops every "auto" before validation, so the keys the Trainer does not
 * fill take DeepSpeed's defaults (stage3_max_live_parameters and stage3_max_reuse_distance 1e9,
 * sub_group_size 1e9, overlap_comm true at stage 3); the Trainer fills the stage-3 bucket sizes
 * from hidden_size only at stage 3 (trainer_config_finalize: is_zero3()). GPT-2: h = 768. */
static void test_auto_dropped(void)
{
	Scenario sc;
	if (load(&sc, "{\"train_micro_batch_size_per_gpu\": 1, \"zero_optimization\": {\"stage\": 3,"
		 " \"stage3_max_live_parameters\": \"auto\", \"stage3_max_reuse_distance\": \"auto\","
		 " \"sub_group_size\": \"auto\", \"overlap_comm\": \"auto\","
		 " \"stage3_prefetch_bucket_size\": \"auto\", \"offload_param\": {\"device\": \"none\","
		 " \"pin_memory\": \"auto\"}}}", NULL))
		return;
	PxError err = {0};
	CU_ASSERT_EQUAL_FATAL(dsconfig_resolve(&sc.ds, &sc.model, &sc.train_args, 16, &err), 0);
	CU_ASSERT_DOUBLE_EQUAL(sc.ds.zero.max_live_elems, 1e9, 0);
	CU_ASSERT_DOUBLE_EQUAL(sc.ds.zero.max_reuse_elems, 1e9, 0);
	CU_ASSERT_DOUBLE_EQUAL(sc.ds.zero.sub_group_elems, 1e9, 0);
	CU_ASSERT_EQUAL(sc.ds.zero.overlap_comm, 1);
	CU_ASSERT_DOUBLE_EQUAL(sc.ds.zero.prefetch_bucket_elems, 530841, 0); /* int(0.9 768^2) */
	/* an "auto" is not a setting: not listed as not modelled */
	CU_ASSERT_FALSE(fx_noted(&sc.notes, "stage3_max_reuse_distance"));
	scenario_free(&sc);
	if (load(&sc, "{\"train_micro_batch_size_per_gpu\": 1, \"zero_optimization\": {\"stage\": 2,"
		 " \"stage3_prefetch_bucket_size\": \"auto\", \"stage3_param_persistence_threshold\":"
		 " \"auto\", \"reduce_bucket_size\": \"auto\"}}", NULL))
		return;
	CU_ASSERT_EQUAL_FATAL(dsconfig_resolve(&sc.ds, &sc.model, &sc.train_args, 16, &err), 0);
	CU_ASSERT_DOUBLE_EQUAL(sc.ds.zero.reduce_bucket_elems, 768.0 * 768, 0);
	CU_ASSERT_DOUBLE_EQUAL(sc.ds.zero.prefetch_bucket_elems, 5e7, 0);
	CU_ASSERT_DOUBLE_EQUAL(sc.ds.zero.persistence_threshold_elems, 1e5, 0);
	scenario_free(&sc);
}

/* pydantic's populate_by_name: DeepSpeed takes the stage-3 keys by their field names too, as
 * axolotl's zero3.json writes them (max_live_parameters 0, max_reuse_distance 0); ZeRO++'s keys,
 * read by stage3.py only, are ignored below stage 3 (OpenRLHF writes zero_hpz_partition_size 8
 * at any stage). */
static void test_stage3_field_names_and_zeropp(void)
{
	Scenario sc;
	if (load(&sc, "{\"train_micro_batch_size_per_gpu\": 1, \"zero_optimization\": {\"stage\": 3,"
		 " \"max_live_parameters\": 0, \"max_reuse_distance\": 0, \"prefetch_bucket_size\": 2e7,"
		 " \"param_persistence_threshold\": \"auto\", \"gather_16bit_weights_on_model_save\": true}}",
		 NULL))
		return;
	CU_ASSERT_DOUBLE_EQUAL(sc.ds.zero.max_live_elems, 0, 0);
	CU_ASSERT_DOUBLE_EQUAL(sc.ds.zero.max_reuse_elems, 0, 0);
	CU_ASSERT_DOUBLE_EQUAL(sc.ds.zero.prefetch_bucket_elems, 2e7, 0);
	/* the Trainer fills only stage3_param_persistence_threshold: this "auto" is dropped */
	CU_ASSERT_DOUBLE_EQUAL(sc.ds.zero.persistence_threshold_elems, 1e5, 0);
	CU_ASSERT_FALSE(fx_noted(&sc.notes, "unknown key"));
	scenario_free(&sc);
	if (load(&sc, "{\"train_micro_batch_size_per_gpu\": 1, \"zero_optimization\": {\"stage\": 2,"
		 " \"zero_hpz_partition_size\": 8, \"zero_quantized_weights\": false}}", NULL))
		return;
	Prediction pr;
	PxError err = {0};
	CU_ASSERT_EQUAL(sc.ds.zero.hpz_partition_size, 1);
	CU_ASSERT(fx_noted(&sc.notes, "ZeRO++ is ignored at ZeRO stage 2"));
	CU_ASSERT_EQUAL(predict_run(&sc, &pr, &err), 0);
	if (!err.code)
		predict_free(&pr);
	scenario_free(&sc);
}

/* DeepSpeed's AutoTP (tensor_parallel.autotp_size) spreads heads that tp does not divide over the
 * ranks (module_inject/tp_shard.py gives the first ranks one more); GPT-2 XL's 25 heads over 2 are
 * priced, noted. Megatron's tp (parallelism.tp) must divide them. */
static void test_autotp_uneven_heads(void)
{
	static const char *const fmt =
		"{%s, \"deepspeed\": {\"train_micro_batch_size_per_gpu\": 1, \"bf16\": {\"enabled\": true},"
		" \"zero_optimization\": {\"stage\": 2}%s}%s, \"cluster\": {\"gpu\": \"H100-SXM\","
		" \"nodes\": 1, \"gpus_per_node\": 8}, \"seq_length\": 256}";
	Scenario sc;
	Prediction pr;
	if (fx_predictf(&sc, &pr, fmt, fx_model("gpt2-xl"), ", \"tensor_parallel\": {\"autotp_size\": 2}",
			""))
		return;
	CU_ASSERT_EQUAL(pr.plan.par.tp, 2);
	CU_ASSERT(fx_noted(&sc.notes, "spreads the 25 heads"));
	fx_free(&sc, &pr);
	char json[2048], path[512];
	PxError err = {0};
	snprintf(json, sizeof(json), fmt, fx_model("gpt2-xl"), "", ", \"parallelism\": {\"tp\": 2}");
	snprintf(path, sizeof(path), "%s/scenario.json", px_test_tmpdir());
	px_test_write_file(path, json);
	CU_ASSERT_EQUAL_FATAL(scenario_load(&sc, path, NULL, &err), 0);
	CU_ASSERT_EQUAL(predict_run(&sc, &pr, &err), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "does not divide the 25 attention heads"));
	scenario_free(&sc);
}

/* trainer_config_process / trainer_config_finalize: warmup_min_lr = 0, warmup_max_lr =
 * learning_rate, total_num_steps = num_training_steps (max_steps when > 0), warmup_num_steps =
 * get_warmup_steps(total): warmup_steps when >= 1, else ceil(total x fraction), the fraction
 * being warmup_steps in (0, 1) or warmup_ratio. */
static void test_scheduler_autos(void)
{
	static const char *const decay =
		"{\"train_micro_batch_size_per_gpu\": 1, \"scheduler\": {\"type\": \"WarmupDecayLR\","
		" \"params\": {\"warmup_min_lr\": \"auto\", \"warmup_max_lr\": \"auto\","
		" \"warmup_num_steps\": \"auto\", \"total_num_steps\": \"auto\"}}}";
	static const struct {
		const char *args;
		long long total, warmup;
		int unresolved;
	} cases[] = {
		/* ceil(1000 x 0.1) = 100 */
		{"\"training_args\": {\"max_steps\": 1000, \"warmup_ratio\": 0.1, \"learning_rate\": 2e-5}",
		 1000, 100, 0},
		/* ceil(250 x 0.03) = ceil(7.5) = 8 */
		{"\"training_args\": {\"max_steps\": 250, \"warmup_steps\": 0.03, \"learning_rate\": 2e-5}",
		 250, 8, 0},
		{"\"training_args\": {\"max_steps\": 250, \"warmup_steps\": 40, \"learning_rate\": 2e-5}",
		 250, 40, 0},
		/* no max_steps: epochs x the dataset's steps, unknown; warm-up as a count is known */
		{"\"training_args\": {\"num_train_epochs\": 3, \"warmup_steps\": 40, \"learning_rate\":"
		 " 2e-5}", 0, 40, 1},
		/* neither known: the prediction goes on, the executor refuses */
		{"\"training_args\": {\"warmup_ratio\": 0.1, \"learning_rate\": 2e-5}", 0, 1000, 1},
	};
	for (unsigned i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		Scenario sc;
		if (load(&sc, decay, cases[i].args))
			continue;
		CU_ASSERT_EQUAL(sc.ds.sched, 2);
		CU_ASSERT_EQUAL(sc.ds.total_num_steps, cases[i].total);
		CU_ASSERT_EQUAL(sc.ds.warmup_num_steps, cases[i].warmup);
		CU_ASSERT_EQUAL(sc.ds.sched_unresolved, cases[i].unresolved);
		CU_ASSERT_DOUBLE_EQUAL(sc.ds.warmup_min_lr, 0, 0);
		CU_ASSERT_DOUBLE_EQUAL(sc.ds.warmup_max_lr, 2e-5, 0);
		CU_ASSERT_EQUAL(fx_noted(&sc.notes, "a prediction does not need it"), cases[i].unresolved);
		Prediction pr;
		PxError err = {0};
		if (cases[i].unresolved && !predict_run(&sc, &pr, &err)) { /* it prices */
			/* ...and the executor, which follows the schedule, refuses */
			CU_ASSERT_EQUAL(runner_supported(&pr.plan, &err), -1);
			CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "needs training_args.max_steps"));
			predict_free(&pr);
		}
		scenario_free(&sc);
	}
	/* WarmupLR with every value "auto" and a warm-up that comes out at 0 (the Trainer's
	 * defaults): DeepSpeed 0.19.5 refuses it, earlier versions run it; the prediction goes on
	 * and says so */
	Scenario sc;
	if (load(&sc, "{\"train_micro_batch_size_per_gpu\": 1, \"scheduler\": {\"type\": \"WarmupLR\","
		 " \"params\": {\"warmup_min_lr\": \"auto\", \"warmup_max_lr\": \"auto\","
		 " \"warmup_num_steps\": \"auto\"}}}", NULL))
		return;
	CU_ASSERT_EQUAL(sc.ds.warmup_num_steps, 0);
	CU_ASSERT_EQUAL(sc.ds.sched_unresolved, 0);
	CU_ASSERT(fx_noted(&sc.notes, "DeepSpeed 0.19.5 and later refuse it"));
	CU_ASSERT_DOUBLE_EQUAL(sc.ds.warmup_max_lr, 5e-5, 0); /* TrainingArguments' learning_rate */
	scenario_free(&sc);
	expect_error("{\"train_batch_size\": 8, \"scheduler\": {\"type\": \"WarmupDecayLR\","
		     " \"params\": {\"warmup_num_steps\": 2.5, \"total_num_steps\": 10}}}", 8,
		     "warmup_num_steps: expected an integer");
}

/* disable_allgather is read by runtime/config.py and used nowhere; allgather_bucket_size has no
 * effect where PyTorch has all_gather_into_tensor: neither is warned about or listed. Stage 1-2
 * assert the bucket size is a multiple of 2. */
static void test_allgather_keys(void)
{
	Scenario sc;
	if (load(&sc, "{\"train_micro_batch_size_per_gpu\": 1, \"disable_allgather\": true,"
		 " \"zero_optimization\": {\"stage\": 2, \"allgather_bucket_size\": 2e8,"
		 " \"allgather_partitions\": true}}", NULL))
		return;
	CU_ASSERT_EQUAL(sc.notes.n_warnings, 0);
	CU_ASSERT_EQUAL(sc.notes.n_not_modelled, 0);
	scenario_free(&sc);
	expect_error("{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": 2,"
		     " \"allgather_bucket_size\": 500000001}}", 8,
		     "allgather_bucket_size must be a multiple of nccl_start_alignment_factor, 2");
	if (load(&sc, "{\"train_micro_batch_size_per_gpu\": 1, \"zero_optimization\": {\"stage\": 3,"
		 " \"allgather_bucket_size\": 500000001}}", NULL)) /* stage 3 does not read it */
		return;
	scenario_free(&sc);
}

/* engine.py asserts "not self.zero_optimization()" for each 1-bit optimizer; stage3.py and
 * stage_1_and_2.py refuse Muon with reduce_scatter (stage 3) or with reduce_scatter and
 * optimizer offload (stage 1-2); runtime/config.py refuses 'sum' reduction at stage 3 and
 * engine.py Amp with ZeRO. */
static void test_deepspeed_refusals(void)
{
	expect_error("{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"OneBitAdam\"},"
		     " \"zero_optimization\": {\"stage\": 1}}", 8,
		     "1bit-Adam is not compatible with ZeRO");
	expect_error("{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"ZeroOneAdam\"},"
		     " \"zero_optimization\": {\"stage\": 2}}", 8, "0/1 Adam is not compatible with ZeRO");
	expect_error("{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"OneBitLamb\"},"
		     " \"zero_optimization\": {\"stage\": 3}}", 8, "1bit-Lamb is not compatible with ZeRO");
	expect_error("{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"Muon\"},"
		     " \"zero_optimization\": {\"stage\": 3}}", 8,
		     "Muon and reduce scatter cannot be used together");
	expect_error("{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"Muon\"},"
		     " \"zero_optimization\": {\"stage\": 2, \"offload_optimizer\": {\"device\": \"cpu\"}}}",
		     8, "Muon with reduce scatter does not support optimizer offload");
	expect_error("{\"train_batch_size\": 8, \"gradient_allreduce_op\": \"sum\","
		     " \"zero_optimization\": {\"stage\": 3}}", 8,
		     "gradient_allreduce_op='sum' is not supported with ZeRO stage 3");
	expect_error("{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"Adam\", \"params\":"
		     " {\"lr\": 1.5e-4, \"max_grad_norm\": 1.0}}}", 8,
		     "'max_grad_norm' is not supported as an optimizer parameter");
	expect_error("{\"train_batch_size\": 8, \"amp\": {\"enabled\": true, \"opt_level\": \"O1\"},"
		     " \"zero_optimization\": {\"stage\": 1}}", 8,
		     "Amp and ZeRO are not currently compatible");
	/* ...and what it accepts: 1-bit at stage 0, Muon at stage 3 without reduce_scatter, the
	 * Trainer's "amp": {"enabled": "auto"} (False unless fp16_backend is apex) with ZeRO */
	DsConfig ds;
	PxError err = {0};
	CU_ASSERT_EQUAL(resolve("{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"OneBitLamb\","
				" \"params\": {\"freeze_step\": 1000, \"max_coeff\": 0.3}},"
				" \"zero_optimization\": {\"stage\": 0}}", 8, &ds, &err), 0);
	CU_ASSERT_EQUAL(resolve("{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"Muon\"},"
				" \"zero_optimization\": {\"stage\": 3, \"reduce_scatter\": false}}", 8,
				&ds, &err), 0);
	CU_ASSERT_EQUAL(resolve("{\"train_batch_size\": 8, \"amp\": {\"enabled\": \"auto\","
				" \"opt_level\": \"auto\"}, \"zero_optimization\": {\"stage\": 2}}", 8,
				&ds, &err), 0);
	/* ZeRO with an optimizer outside its tested list runs only with the flag */
	Scenario sc;
	if (load(&sc, "{\"train_micro_batch_size_per_gpu\": 1, \"optimizer\": {\"type\": \"Lamb\"},"
		 " \"zero_optimization\": {\"stage\": 1}}", NULL))
		return;
	CU_ASSERT(fx_noted(&sc.notes, "needs \"zero_allow_untested_optimizer\": true"));
	scenario_free(&sc);
	if (load(&sc, "{\"train_micro_batch_size_per_gpu\": 1, \"optimizer\": {\"type\": \"Lamb\"},"
		 " \"zero_allow_untested_optimizer\": true, \"zero_optimization\": {\"stage\": 1}}",
		 NULL))
		return;
	CU_ASSERT_FALSE(fx_noted(&sc.notes, "zero_allow_untested_optimizer"));
	scenario_free(&sc);
}

/* The 1-bit optimizers' memory, from deepspeed/runtime/fp16/onebit/ (adam.py, zoadam.py, lamb.py), worked by hand for a
 * params-only model of 8e6 parameters in 8 layers (8 tensors of 1e6) at ZeRO stage 0 on N = 6
 * GPUs. The stage-0 flat holds the 8e6 padded to a multiple of 6: 8,000,004 elements, each with
 * a 4 B master copy in fp16 and 4 B per state. The compressed buffers pad to a multiple of
 * N lcm(N, 8) = 6 x 24 = 144 (corrected_tensor_size), with a worker error of that size and a
 * server error of 1/N of it, both fp32.
 * fp16: FP16_Optimizer hands the optimizer one fp32 flat of the 8e6: padded 8,000,064
 *   (55,556 x 144), server 1,333,344.
 *   OneBitAdam:  master 32,000,016 + exp_avg, exp_avg_sq 64,000,032 + worker 32,000,256
 *                + server 5,333,376 = 133,333,680 B
 *   ZeroOneAdam: + momentum_accumulator 32,000,016 = 165,333,696 B
 *   OneBitLamb:  master + 3 states (exp_avg, exp_avg_sq, exp_avg_sq_fresh) 128,000,064 + the
 *                momentum flat's dummy padding (64 x 4 B = 256) + worker and server
 *                37,333,632 = 165,333,952 B at rest; its step clones every momentum
 *                (exp_avg_last_step, 8e6 x 4 B = 32e6 B): 197,333,952 B at its peak
 *   AdamW:       master + 2 states = 96,000,048 B
 * fp32: no wrapper, one error pair per tensor: 1e6 pads to 1,000,080 (6,945 x 144), server
 *   166,680; OneBitAdam: 2 states 64,000,032 + 8 x 4 x (1,000,080 + 166,680) = 101,336,352 B. */
static void test_onebit_memory_by_hand(void)
{
	static const char *const fmt =
		"{\"model\": {\"num_parameters\": 8e6, \"num_hidden_layers\": 8},"
		" \"deepspeed\": {\"train_micro_batch_size_per_gpu\": 1, \"fp16\": {\"enabled\": %s},"
		" \"optimizer\": {\"type\": \"%s\", \"params\": {\"lr\": 1e-4, \"freeze_step\": 400}},"
		" \"zero_optimization\": {\"stage\": 0}},"
		" \"cluster\": {\"gpu\": \"A100-80GB\", \"nodes\": 1, \"gpus_per_node\": 6}}";
	static const struct {
		const char *fp16, *type;
		double optim_bytes;
	} cases[] = {{"true", "OneBitAdam", 133333680.0}, {"true", "ZeroOneAdam", 165333696.0},
		     {"true", "OneBitLamb", 197333952.0}, {"true", "AdamW", 96000048.0},
		     {"false", "OneBitAdam", 101336352.0}};
	for (unsigned i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		Scenario sc;
		Prediction pr;
		if (fx_predictf(&sc, &pr, fmt, cases[i].fp16, cases[i].type))
			return;
		const MemPlace *g = &pr.stages[0].mem.place[PLACE_GPU];
		if (fabs(g->cat_peak[CAT_OPTIM] - cases[i].optim_bytes) > 0)
			fprintf(stderr, "\n%s fp16 %s: %.0f B\n", cases[i].type, cases[i].fp16,
				g->cat_peak[CAT_OPTIM]);
		CU_ASSERT_DOUBLE_EQUAL(g->cat_peak[CAT_OPTIM], cases[i].optim_bytes, 0);
		fx_free(&sc, &pr);
	}
}

/* Muon (runtime/zero/muon) at stage 2 on 8 GPUs, bf16, for a Llama-style model whose every unit
 * divides by 8 (h = 256, I = 1024, V = 32000, 4 layers, untied): Ψ = 20,580,608, of which the
 * blocks' matrices (4 x (4 x 256^2 + 3 x 256 x 1024) = 4,194,304) are Muon's and the rest
 * (embeddings, head, norms: 16,386,304) its Adam's. A rank's partition is Ψ / 8 = 2,572,576
 * elements: 524,288 of matrices, 2,048,288 of the rest.
 *   master 4 x 2,572,576 = 10,290,304 B; Adam's two fp32 states 8 x 2,048,288 = 16,386,304 B;
 *   Muon's momentum in the gradient-accumulation dtype (bf16) 2 x 524,288 = 1,048,576 B
 *   -> 27,725,184 B, against AdamW's 12 x 2,572,576 = 30,870,912 B. */
static void test_muon_memory_by_hand(void)
{
	static const char *const fmt =
		"{\"model\": {\"model_type\": \"llama\", \"hidden_size\": 256, \"num_hidden_layers\": 4,"
		" \"num_attention_heads\": 4, \"intermediate_size\": 1024, \"vocab_size\": 32000,"
		" \"max_position_embeddings\": 512},"
		" \"deepspeed\": {\"train_micro_batch_size_per_gpu\": 1, \"bf16\": {\"enabled\": true},"
		" \"optimizer\": {\"type\": \"%s\"}, \"zero_optimization\": {\"stage\": 2}},"
		" \"cluster\": {\"gpu\": \"H100-SXM\", \"nodes\": 1, \"gpus_per_node\": 8},"
		" \"seq_length\": 128}";
	static const struct {
		const char *type;
		double optim_bytes;
	} cases[] = {{"Muon", 27725184.0}, {"AdamW", 30870912.0}};
	for (int i = 0; i < 2; i++) {
		Scenario sc;
		Prediction pr;
		if (fx_predictf(&sc, &pr, fmt, cases[i].type))
			return;
		CU_ASSERT_DOUBLE_EQUAL(sc.model.n_params, 20580608.0, 0);
		CU_ASSERT_DOUBLE_EQUAL(pr.stages[0].mem.place[PLACE_GPU].cat_peak[CAT_OPTIM],
				       cases[i].optim_bytes, 0);
		fx_free(&sc, &pr);
	}
}

int test_dsconfig_register(void)
{
	return PX_ADD_SUITE("dsconfig", {"DeepSpeed batch rules", test_batch_rules},
			    {"DeepSpeed batch errors", test_batch_errors},
			    {"pipeline.pipe_partitioned and grad_partitioned", test_pipe_partitioned},
			    {"Hugging Face auto values", test_auto_values},
			    {"training_args feed auto values", test_training_args_feed_autos},
			    {"refused combinations", test_refusals},
			    {"optimizer states", test_optimizer_states},
			    {"DeepSpeed learning-rate schedules", test_lr_schedules},
			    {"sub_group_size 0, 1e14 and auto", test_sub_group_size},
			    {"sub_group_size 0 with NVMe offload, by hand", test_sub_group_zero_nvme_by_hand},
			    {"an nvme_path too long is refused", test_nvme_path_too_long},
			    {"zero_optimization true and false", test_zero_boolean},
			    {"offload_param below stage 3 is ignored", test_offload_param_below_stage3},
			    {"auto dropped to DeepSpeed's defaults", test_auto_dropped},
			    {"scheduler auto values from training_args", test_scheduler_autos},
			    {"disable_allgather and allgather_bucket_size", test_allgather_keys},
			    {"stage-3 field names, ZeRO++ below stage 3",
			     test_stage3_field_names_and_zeropp},
			    {"AutoTP's uneven heads", test_autotp_uneven_heads},
			    {"DeepSpeed's refusals and what it accepts", test_deepspeed_refusals},
			    {"1-bit optimizers' memory by hand", test_onebit_memory_by_hand},
			    {"Muon's memory by hand", test_muon_memory_by_hand});
}

/* DeepSpeed config: the batch rules of deepspeed/runtime/config.py (_set_batch_related_parameters
 * and _batch_assertion), "auto" resolution as transformers' integrations/deepspeed.py does it, and
 * the combinations DeepSpeed refuses. */
#include <CUnit/CUnit.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

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
		     {"{\"type\": \"Lamb\"}", 2}, {"{\"type\": \"Adagrad\"}", 1},
		     {"{\"type\": \"Lion\"}", 1}, {"{\"type\": \"SGD\", \"params\": {\"momentum\": 0.9}}", 1},
		     {"{\"type\": \"SGD\"}", 0},
		     {"{\"type\": \"Adam\", \"params\": {\"amsgrad\": true}}", 3}};
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

int test_dsconfig_register(void)
{
	return PX_ADD_SUITE("dsconfig", {"DeepSpeed batch rules", test_batch_rules},
			    {"DeepSpeed batch errors", test_batch_errors},
			    {"Hugging Face auto values", test_auto_values},
			    {"training_args feed auto values", test_training_args_feed_autos},
			    {"refused combinations", test_refusals},
			    {"optimizer states", test_optimizer_states},
			    {"DeepSpeed learning-rate schedules", test_lr_schedules});
}

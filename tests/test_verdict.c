/* Usable GPU memory and the fit verdicts through the binary: the catalog's usable figures against
 * their published sources, the fits / tight / does-not-fit boundaries on hand-made cases, the JSON
 * fields, a sweep counting tight points, plan's choice with and without --accept-tight, and the
 * moment of the GPU peak on small scenarios derived by hand, and the published memory measurements
 * of scenarios/published/manifest.json against what predict says. */
#include <CUnit/CUnit.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../engine/jdoc.h"
#include "../engine/schedule.h"
#include "../sim/allocator.h"
#include "fixtures.h"
#include "suites.h"

#define GiB 1073741824.0
#define MiB 1048576.0

static char out[1 << 17];

/* The small GPT-2 (V 128, 2 layers of 64 channels, 4 heads, 64 positions), bf16 with fp32 master
 * weights, AdamW, ZeRO-0, one GPU, no CUDA runtime buffers (so that the peak is the model's own).
 * Parameters, counted by hand from GPT-2's modules: wte 128*64 = 8192, wpe 64*64 = 4096; a block:
 * 2 layer norms 2*128, c_attn 64*192+192 = 12480, attn c_proj 64*64+64 = 4160, mlp c_fc
 * 64*256+256 = 16640, mlp c_proj 256*64+64 = 16448: 49984; ln_f 128; the head is tied.
 * PSI = 8192 + 4096 + 2*49984 + 128 = 112384. */
#define PSI 112384.0
static const char BASE[] =
	"{\"name\": \"verdict\", \"model\": {\"model_type\": \"gpt2\", \"n_embd\": 64, \"n_layer\": 2,"
	" \"n_head\": 4, \"n_positions\": 64, \"vocab_size\": 128}, \"deepspeed\": {"
	"\"train_batch_size\": 16, \"train_micro_batch_size_per_gpu\": 2, \"bf16\": {\"enabled\":"
	" true}, \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 3e-3}},"
	" \"zero_optimization\": {\"stage\": 0}}, \"cluster\": {\"gpu\": \"H100-SXM\","
	" \"gpus_per_node\": 1, \"cuda_context_MiB\": 0, \"cublas_workspace_MiB\": 0},"
	" \"seq_length\": 32}";

static char dir[512]; /* the test's temporary directory, made by base_path */

/* A fresh directory holding BASE as base.json; returns its path (static buffer). */
static const char *base_path(void)
{
	static char path[1024];
	snprintf(dir, sizeof(dir), "%s", px_test_tmpdir());
	snprintf(path, sizeof(path), "%s/base.json", dir);
	px_test_write_file(path, BASE);
	return path;
}

static cJSON *at(const cJSON *o, const char *dotted)
{
	char name[256];
	snprintf(name, sizeof(name), "%s", dotted);
	const cJSON *v = o;
	for (char *seg = strtok(name, "."); seg && v; seg = strtok(NULL, "."))
		v = cJSON_GetObjectItemCaseSensitive(v, seg);
	return (cJSON *)v;
}

static double num(const cJSON *o, const char *dotted)
{
	const cJSON *v = at(o, dotted);
	return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

static const char *str(const cJSON *o, const char *dotted)
{
	const cJSON *v = at(o, dotted);
	return cJSON_IsString(v) ? v->valuestring : "";
}

/* predict --json on path with extra arguments; NULL (and a failed assertion) on failure. */
static cJSON *predict_json(const char *path, const char *extra)
{
	int rc = px_test_run_clif(out, sizeof(out), "predict '%s' --json %s", path, extra);
	CU_ASSERT_EQUAL(rc, 0);
	if (rc)
		fprintf(stderr, "\n%s\n", out);
	return rc ? NULL : cJSON_Parse(out);
}

/* ---- usable memory ---- */

/* Each catalog GPU's usable memory is the published figure its source names (engine/cluster.c):
 * torch prints GiB with two decimals, deviceQuery exact bytes. The derived ones are the listed
 * memory less the H100 SXM's reservation (81559 MiB listed against torch's 79.11 GiB). */
static void test_usable_against_sources(void)
{
	const double h100_keeps = 81559 * MiB - 79.11 * GiB; /* 550.4 MiB */
	const struct { const char *gpu; double usable, tol; const char *says; } want[] = {
		{"V100-32GB", 31.75 * GiB, 1e3, "SAM-Med3D/issues/8"},  /* "31.75 GiB total capacity" */
		{"A100-40GB", 42298834944.0, 0.5, "bottlerocket/pull/3873"}, /* deviceQuery's bytes */
		{"A100-80GB", 79.25 * GiB, 1e3, "OOTDiffusion/issues/235"}, /* "79.25 GiB total capacity" */
		{"H100-SXM", 79.11 * GiB, 1e3, "vllm/issues/27508"},     /* "total capacity of 79.11 GiB" */
		{"H100-PCIe", 81559 * MiB - h100_keeps, 1e3, "no published figure found: derived"},
		{"H200", 143771 * MiB - h100_keeps, 1e3, "no published figure found: derived"},
	};
	int rc = px_test_run_cli("gpus --json", out, sizeof(out));
	CU_ASSERT_EQUAL_FATAL(rc, 0);
	cJSON *a = cJSON_Parse(out);
	CU_ASSERT_PTR_NOT_NULL_FATAL(a);
	CU_ASSERT_EQUAL(cJSON_GetArraySize(a), 6);
	for (unsigned i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
		const cJSON *g = NULL, *e;
		cJSON_ArrayForEach(e, a)
			if (!strcmp(str(e, "gpu"), want[i].gpu))
				g = e;
		CU_ASSERT_PTR_NOT_NULL_FATAL(g);
		/* gpus --json prints GiB to 4 decimals: 0.0001 GiB = 107 KB */
		CU_ASSERT_DOUBLE_EQUAL(num(g, "gpu_usable_memory_GiB") * GiB, want[i].usable,
				       want[i].tol + 0.00005 * GiB);
		PX_ASSERT_HAS(str(g, "gpu_usable_memory_source"), want[i].says);
		CU_ASSERT(num(g, "gpu_usable_memory_GiB") < num(g, "gpu_memory_GiB"));
	}
	cJSON_Delete(a);
}

/* A usable memory above the GPU's memory is refused: exit 2 naming the key. */
static void test_usable_above_memory_refused(void)
{
	int rc = px_test_run_clif(out, sizeof(out), "predict '%s' --set "
				  "cluster.gpu_usable_memory_GiB=90", base_path());
	CU_ASSERT_EQUAL(rc, 2);
	PX_ASSERT_HAS(out, "cluster.gpu_usable_memory_GiB: expected a positive number at most "
			   "gpu_memory_GiB (79.65), got 90");
}

/* ---- verdicts ---- */

/* The peak of micro-batch 1, sequence 8 is the gradient reduction's 22 PSI bytes (see
 * test_moment_grad_reduce): 2,472,448 bytes. With usable memory U and the 10% margin: fits
 * when peak <= 0.9 U, tight when 0.9 U < peak <= U, does not fit above U. Three U around the
 * boundaries, each 0.1% from them. */
static void test_verdict_boundaries(void)
{
	const double peak = 22 * PSI;
	const struct { double usable; const char *verdict, *table, *line; } c[] = {
		{peak / 0.9 * 1.001, "fits", " yes\n", ": fits\n"},
		{peak / 0.9 * 0.999, "tight", " tight\n", ": TIGHT (within the margin"},
		{peak * 1.001, "tight", " tight\n", ": TIGHT (within the margin"},
		{peak * 0.999, "does not fit", " NO\n", ": DOES NOT FIT\n"},
	};
	const char *path = base_path();
	for (unsigned i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
		char extra[256];
		snprintf(extra, sizeof(extra), "--set deepspeed.train_micro_batch_size_per_gpu=1 "
			 "--set seq_length=8 --set cluster.gpu_usable_memory_GiB=%.12g",
			 c[i].usable / GiB);
		cJSON *j = predict_json(path, extra);
		CU_ASSERT_PTR_NOT_NULL_FATAL(j);
		CU_ASSERT_DOUBLE_EQUAL(num(j, "memory.gpu.peak_bytes"), peak, 0.5);
		CU_ASSERT_STRING_EQUAL(str(j, "verdict"), c[i].verdict);
		CU_ASSERT_STRING_EQUAL(str(j, "memory.verdict"), c[i].verdict);
		/* a tight peak still fits its memory; one above it does not */
		CU_ASSERT_EQUAL(cJSON_IsTrue(at(j, "memory.fits")), strcmp(c[i].verdict, "does not fit") != 0);
		CU_ASSERT_DOUBLE_EQUAL(num(j, "memory.gpu_capacity_bytes"), c[i].usable,
				       c[i].usable * 1e-9);
		CU_ASSERT_DOUBLE_EQUAL(num(j, "memory.gpu_margin_bytes"), 0.1 * c[i].usable,
				       c[i].usable * 1e-9);
		CU_ASSERT_DOUBLE_EQUAL(num(j, "memory.gpu_margin_fraction"), 0.1, 1e-12);
		CU_ASSERT_DOUBLE_EQUAL(num(j, "memory.gpu_memory_bytes"), 81559 * MiB, 0.5);
		PX_ASSERT_HAS(str(j, "memory.gpu_capacity_source"), "gpu_usable_memory_GiB");
		cJSON_Delete(j);
		/* the table says the same, and which figure it used */
		int rc = px_test_run_clif(out, sizeof(out), "predict '%s' %s", path, extra);
		CU_ASSERT_EQUAL(rc, 0);
		PX_ASSERT_HAS(out, c[i].line);
		PX_ASSERT_HAS(out, c[i].table);
		PX_ASSERT_HAS(out, "# GPU capacity: usable");
		PX_ASSERT_HAS(out, "the scenario's cluster.gpu_usable_memory_GiB");
	}
}

/* Without an override the catalog's usable figure is the capacity, and its source is printed. */
static void test_verdict_uses_catalog_usable(void)
{
	cJSON *j = predict_json(base_path(), "");
	CU_ASSERT_PTR_NOT_NULL_FATAL(j);
	CU_ASSERT_DOUBLE_EQUAL(num(j, "memory.gpu_capacity_bytes"), 79.11 * GiB, 1);
	PX_ASSERT_HAS(str(j, "memory.gpu_capacity_source"), "vllm-project/vllm/issues/27508");
	CU_ASSERT_STRING_EQUAL(str(j, "verdict"), "fits");
	cJSON_Delete(j);
	/* a memory of the user's own is all usable unless they say otherwise */
	j = predict_json(base_path(), "--set cluster.gpu_memory_GiB=24");
	CU_ASSERT_PTR_NOT_NULL_FATAL(j);
	CU_ASSERT_DOUBLE_EQUAL(num(j, "memory.gpu_capacity_bytes"), 24 * GiB, 1);
	PX_ASSERT_HAS(str(j, "memory.gpu_capacity_source"), "gpu_memory_GiB, taken as usable");
	cJSON_Delete(j);
}

/* ---- the peak's moment ---- */

/* bf16 without ZeRO is DeepSpeed's BF16_Optimizer (engine.py get_data_types: fp32 gradient
 * accumulation; _do_optimizer_sanity_check: BFLOAT16), on one GPU here: the set-up holds the bf16
 * parameters (2 PSI), the fp32 gradients it accumulates into (bf16_optimizer.py
 * fp32_groups_gradients_flat, 4 PSI), the backward's bf16 .grad tensors, whole from one backward
 * to the next (2 PSI), the fp32 master partition (4 PSI over dp = 1) and Adam's m and v (8 PSI):
 * 20 PSI for the whole step. Each micro-batch adds its activations and frees them in its
 * backward: micro-batch 1 of sequence 8 keeps a block's s b h (34 + 5 a s / h) = 8*1*64*(34 +
 * 2.5) = 18,688 bytes (Korthikanti et al. 2022), two blocks 37,376, and the ends (embedding
 * output, logits of 128 words) a few kB: far under 2 PSI. At the boundary the engine all-reduces
 * the fp32 gradients cast to communication_data_type, the model's bf16 by default (engine.py
 * allreduce_bucket: tensor.to(self.communication_data_type)), one GPU or not: a 2 PSI copy, so the
 * peak is the gradient reduction's 22 PSI exactly, allocating that copy. The fused update then
 * allocates nothing. */
static void test_moment_grad_reduce(void)
{
	cJSON *j = predict_json(base_path(), "--set deepspeed.train_micro_batch_size_per_gpu=1 "
				"--set seq_length=8");
	CU_ASSERT_PTR_NOT_NULL_FATAL(j);
	CU_ASSERT_DOUBLE_EQUAL(num(j, "memory.gpu.peak_bytes"), 22 * PSI, 0.5);
	CU_ASSERT_STRING_EQUAL(str(j, "memory.gpu.peak_moment.phase"), "gradient reduce");
	CU_ASSERT(cJSON_IsNull(at(j, "memory.gpu.peak_moment.unit")));
	CU_ASSERT(cJSON_IsNull(at(j, "memory.gpu.peak_moment.micro_batch")));
	CU_ASSERT_STRING_EQUAL(str(j, "memory.gpu.peak_moment.allocating"), "comm_cast");
	cJSON_Delete(j);
	int rc = px_test_run_clif(out, sizeof(out), "predict '%s' --set "
				  "deepspeed.train_micro_batch_size_per_gpu=1 --set seq_length=8",
				  base_path());
	CU_ASSERT_EQUAL(rc, 0);
	PX_ASSERT_HAS(out, "# GPU peak: gradient reduce, allocating comm_cast\n");
	PX_ASSERT_HAS(out, "# precision  bf16 params, fp32 grads, bf16 communication");
}

/* fp16 without ZeRO is FP16_Optimizer: the set-up holds fp16 parameters and gradients (2 + 2
 * PSI), the fp32 master weights (4 PSI), Adam's m and v (8 PSI) and the loss scaler's 8 bytes;
 * the all-reduce is in the gradients' own type, and the optimizer step adds the fp32 gradients
 * (4 PSI). The activations being far under 4 PSI (above), the peak is the step's 20 PSI + 8
 * bytes, allocating those fp32 gradients. */
static void test_moment_optimizer_step(void)
{
	const char *set = "--set deepspeed.train_micro_batch_size_per_gpu=1 --set seq_length=8 "
			  "--set deepspeed.bf16.enabled=false --set deepspeed.fp16.enabled=true";
	cJSON *j = predict_json(base_path(), set);
	CU_ASSERT_PTR_NOT_NULL_FATAL(j);
	CU_ASSERT_DOUBLE_EQUAL(num(j, "memory.gpu.peak_bytes"), 20 * PSI + 8, 0.5);
	CU_ASSERT_STRING_EQUAL(str(j, "memory.gpu.peak_moment.phase"), "optimizer step");
	CU_ASSERT(cJSON_IsNull(at(j, "memory.gpu.peak_moment.unit")));
	CU_ASSERT(cJSON_IsNull(at(j, "memory.gpu.peak_moment.micro_batch")));
	CU_ASSERT_STRING_EQUAL(str(j, "memory.gpu.peak_moment.allocating"), "fp32_grad_partition");
	cJSON_Delete(j);
	int rc = px_test_run_clif(out, sizeof(out), "predict '%s' %s", base_path(), set);
	CU_ASSERT_EQUAL(rc, 0);
	PX_ASSERT_HAS(out, "# GPU peak: optimizer step, allocating fp32_grad_partition\n");
}

/* The same model with micro-batch 16 of sequence 64 (train batch 64: 4 micro-batches): a block
 * keeps 64*16*64*(34 + 5*4*64/64) = 3,538,944 bytes, two blocks 7,077,888, far over the step's
 * 4 PSI. The body only adds activations in forward and frees them in backward, and every
 * micro-batch starts from the same set-up (ZeRO-0's gradients live from the start), so the peak
 * is reached at the last forward allocation, the head's, in the first micro-batch, and every
 * later one repeats it: BF16_Optimizer's states held from the start (20 PSI) and the two blocks'
 * activations, over the gradient reduction's 22 PSI. */
static void test_moment_last_forward(void)
{
	cJSON *j = predict_json(base_path(), "--set deepspeed.train_micro_batch_size_per_gpu=16 "
				"--set seq_length=64 --set deepspeed.train_batch_size=64");
	CU_ASSERT_PTR_NOT_NULL_FATAL(j);
	CU_ASSERT(num(j, "memory.gpu.peak_bytes") > 20 * PSI + 7077888);
	CU_ASSERT_STRING_EQUAL(str(j, "memory.gpu.peak_moment.phase"), "forward");
	CU_ASSERT_STRING_EQUAL(str(j, "memory.gpu.peak_moment.unit"), "head");
	CU_ASSERT_EQUAL(num(j, "memory.gpu.peak_moment.micro_batch"), 1);
	CU_ASSERT_EQUAL(num(j, "memory.gpu.peak_moment.micro_batches"), 4);
	CU_ASSERT(cJSON_IsTrue(at(j, "memory.gpu.peak_moment.later_micro_batches_repeat_it")));
	PX_ASSERT_HAS(str(j, "memory.gpu.peak_moment.text"),
		      "forward of head, micro-batch 1 of 4 (each later one repeats it)");
	cJSON_Delete(j);
}

/* ---- the optimizer step's transient tensors ---- */

/* DeepSpeed's ZeRO 1-2 optimizer makes the fp32 gradients its update reads in two copies
 * (deepspeed/runtime/zero/stage_1_and_2.py, step: single_grad_partition =
 * self.flatten(self.averaged_gradients[i]).to(torch.float32)): torch.cat's flat of the
 * partition's gradients in their own type, then its fp32 copy, the flat freed after. On the base
 * model over 4 GPUs at ZeRO-1 (no NCCL buffers; micro-batch 1 of sequence 8, whose activations
 * are far under the step's, test_moment_optimizer_step) the set-up holds the parameters and the
 * full gradients (2 + 2 PSI in bf16) and a quarter of the master weights and Adam's moments
 * (12 / 4 PSI): 7 PSI; at the step the bf16 flat (2 / 4) and the fp32 copy (4 / 4) are both
 * live: 8.5 PSI. In fp32 the flat is the copy, and the optimizer still keeps its fp32 clone of
 * the partition (single_partition_of_fp32_groups: .clone().float()): 4 + 4 + (4 + 8) / 4 + 4 / 4
 * = 12 PSI. With bf16 and
 * fp32 gradient accumulation engine.py builds BF16_Optimizer instead, whose fp32 gradients are
 * the accumulation buffer beside the backward's bf16 .grad tensors: 2 + 4 + 2 + 12 / 4 = 11 PSI
 * held; its all-reduce casts the fp32 gradients to bf16 (communication_data_type) for 2 PSI
 * more: 13 PSI at the gradient reduction, and no flat at the step. ZeRO-3 makes the same two copies a
 * sub-group at a time (stage3.py _prepare_fp32_grad_for_sub_group), each freed after its update.
 * Every tensor here is under the persistence threshold (the largest, 16,384 elements, under
 * 1e5), so the parameters and their gradients are kept whole (2 + 2 PSI) besides the partitions
 * of both (0.5 + 0.5) and the optimizer's (3 PSI); the default sub_group_size (1e9) holds the
 * whole partition, PSI / 4 = 28,096 elements (every tensor divides by 4): the flat and the copy
 * add 0.5 + 1 PSI, 9.5 PSI; and stage 3 keeps its contiguous gradient buffer from set-up to the
 * step (stage3.py __init__: __ipg_bucket_flat_buffer, reduce_bucket_size elements in bf16; no
 * unit flat is larger, every tensor being persistent): at reduce_bucket_size PSI / 4 = 28,096
 * that is 0.5 PSI more, 10 PSI. At sub_group_size 10,000 the update steps sub-groups, each closed
 * once it reaches the size (stage3.py _create_fp16_sub_groups; plan.c plan_subgroups), of the
 * tensors' quarters in order: wte 2,048 + wpe 1,024 + the first block's ln_1 32, c_attn 3,072 +
 * 48, c_proj 1,024 + 16, ln_2 32 and c_fc.weight 4,096 = 11,392; then c_fc.bias 64 + c_proj
 * 4,096 + 16 + the second block's up to its c_fc.weight = 12,496; then the rest, 4,208. The
 * largest, 12,496, is what the flat and the copy hold: 6 bytes an element less on 15,600.
 * Stage 1's contiguous gradient buffers (test_zero.c, test_stage12_buffers_by_hand) are turned
 * off here: they are freed after the reductions, before the step, but would make the backward
 * the peak. BF16_Optimizer has none whatever the setting: the third case turns it on. */
static void test_zero_step_copies(void)
{
	const char *set = "--set deepspeed.train_micro_batch_size_per_gpu=1 --set seq_length=8 "
			  "--set cluster.gpus_per_node=4 --set cluster.nccl_buffers_MiB=0 "
			  "--set deepspeed.zero_optimization.stage=1 "
			  "--set deepspeed.zero_optimization.contiguous_gradients=false";
	const struct { const char *set; double peak; const char *phase; } c[] = {
		{"", 8.5 * PSI, "optimizer step"},
		{"--set deepspeed.bf16.enabled=false", 12 * PSI, "optimizer step"},
		{"--set deepspeed.data_types.grad_accum_dtype=fp32 --set "
		 "deepspeed.zero_optimization.contiguous_gradients=true", 13 * PSI, "gradient reduce"},
		{"--set deepspeed.zero_optimization.stage=3 --set "
		 "deepspeed.zero_optimization.contiguous_gradients=true --set "
		 "deepspeed.zero_optimization.reduce_bucket_size=28096", 10 * PSI, "optimizer step"},
		{"--set deepspeed.zero_optimization.stage=3 --set "
		 "deepspeed.zero_optimization.contiguous_gradients=true --set "
		 "deepspeed.zero_optimization.reduce_bucket_size=28096 --set "
		 "deepspeed.zero_optimization.sub_group_size=10000", 10 * PSI - 6 * 15600,
		 "optimizer step"},
	};
	for (unsigned i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
		char extra[512];
		snprintf(extra, sizeof(extra), "%s %s", set, c[i].set);
		cJSON *j = predict_json(base_path(), extra);
		CU_ASSERT_PTR_NOT_NULL_FATAL(j);
		CU_ASSERT_DOUBLE_EQUAL(num(j, "memory.gpu.peak_bytes"), c[i].peak, 0.5);
		CU_ASSERT_STRING_EQUAL(str(j, "memory.gpu.peak_moment.phase"), c[i].phase);
		cJSON_Delete(j);
	}
}


/* What the update allocates while it runs, by implementation, on the base model (micro-batch 1,
 * sequence 8: BF16_Optimizer's gradient reduction peaks at 22 PSI and its update holds 20 PSI
 * before any temporary, test_moment_grad_reduce). The temporaries are fp32 copies of the second
 * moment (engine/optim.c cites each line), over what one step() holds, which under
 * BF16_Optimizer is its one fp32 flat partition of PSI elements (bf16_optimizer.py: param_group
 * ['params'] = [fp32_groups_flat_partition], the Trainer's own optimizer wrapped as DeepSpeed's):
 *   torch foreach (_multi_tensor_adam's exp_avg_sq_sqrt): 4 PSI, peak 24 PSI;
 *   torch for-loop ((exp_avg_sq.sqrt() / bias_correction2_sqrt)): two copies: 28 PSI;
 *   torch fused, DeepSpeed's own: none, the peak staying the reduction's 22 PSI;
 *   the Trainer's own optimizer (no optimizer section): transformers' AdamW one copy of its
 *     one tensor, the flat: 4 PSI; adamw_torch (foreach) 4 PSI; adamw_torch_fused and the
 *     default (today's adamw_torch_fused) none.
 * In fp32 without ZeRO nothing wraps the Trainer's optimizer, which steps the model's tensors one
 * by one: transformers' AdamW holds one copy of the largest, mlp.c_fc's (or c_proj's) 64 x 256 =
 * 16,384 elements: 65,536 bytes.
 * At ZeRO-2 over 4 GPUs the flat partition is PSI / 4 = 28,096 elements (PSI divides by 4, no
 * padding): foreach holds 112,384 bytes; with the optimizer offloaded torch loops (foreach needs
 * CUDA tensors): 2 x 28,096 x 4 = 224,768 bytes on the host. At ZeRO-3 the update steps one
 * sub-group at a time, each closed once it reaches sub_group_size (test_zero_step_copies): the
 * largest at 10,000 is 12,496 elements, the for-loop holding 2 x 12,496 x 4 = 99,968 bytes; at
 * 1,000 the largest is c_fc.bias's 64 with the next c_proj.weight's 4,096 (the tensors before
 * closing at 2,048, 1,024, 3,104, 1,072 and 4,144), 4,160: 2 x 4,160 x 4 = 33,280 bytes. And
 * foreach at ZeRO-3 holds one copy of a sub-group's flat, not of the partition (stage3.py
 * _optimizer_step calls step() with the sub-group alone): 12,496 x 4 = 49,984 bytes at
 * sub_group_size 10,000. */
static void test_step_transients(void)
{
	const char *small = "--set deepspeed.train_micro_batch_size_per_gpu=1 --set seq_length=8";
	const struct { const char *set, *impl, *by; double transient, peak; } c[] = {
		{"", "fused", "deepspeed", 0, 22 * PSI},
		{"--set deepspeed.optimizer.params.torch_adam=true", "torch foreach", "deepspeed",
		 4 * PSI, 24 * PSI},
		{"--set deepspeed.optimizer.params.torch_adam=true --set "
		 "deepspeed.optimizer.params.foreach=false", "torch for-loop", "deepspeed", 8 * PSI,
		 28 * PSI},
		{"--set deepspeed.optimizer.params.torch_adam=true --set "
		 "deepspeed.optimizer.params.fused=true", "fused", "deepspeed", 0, 22 * PSI},
		{"--set deepspeed.optimizer=null", "fused", "trainer", 0, 22 * PSI},
		{"--set deepspeed.optimizer=null --set training_args.optim=adamw_hf",
		 "transformers AdamW", "trainer", 4 * PSI, 24 * PSI},
		{"--set deepspeed.optimizer=null --set training_args.optim=adamw_torch",
		 "torch foreach", "trainer", 4 * PSI, 24 * PSI},
		{"--set deepspeed.optimizer=null --set training_args.optim=adamw_torch_fused", "fused",
		 "trainer", 0, 22 * PSI},
	};
	for (unsigned i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
		char extra[512];
		snprintf(extra, sizeof(extra), "%s %s", small, c[i].set);
		cJSON *j = predict_json(base_path(), extra);
		CU_ASSERT_PTR_NOT_NULL_FATAL(j);
		CU_ASSERT_STRING_EQUAL(str(j, "optimizer.implementation"), c[i].impl);
		CU_ASSERT_STRING_EQUAL(str(j, "optimizer.built_by"), c[i].by);
		CU_ASSERT_DOUBLE_EQUAL(num(j, "optimizer.step_transient_bytes"), c[i].transient, 0.5);
		CU_ASSERT_DOUBLE_EQUAL(num(j, "memory.gpu.peak_bytes"), c[i].peak, 0.5);
		CU_ASSERT_STRING_EQUAL(str(j, "memory.gpu.peak_moment.phase"),
				       c[i].transient > 0 ? "optimizer step" : "gradient reduce");
		CU_ASSERT_STRING_EQUAL(str(j, "memory.gpu.peak_moment.allocating"),
				       c[i].transient > 0 ? "optimizer_step_temp" : "comm_cast");
		cJSON_Delete(j);
	}
	/* fp32 without ZeRO: the Trainer's transformers AdamW over the model's own tensors */
	char fp32[512];
	snprintf(fp32, sizeof(fp32), "%s --set deepspeed.bf16.enabled=false --set "
		 "deepspeed.optimizer=null --set training_args.optim=adamw_hf", small);
	cJSON *one = predict_json(base_path(), fp32);
	CU_ASSERT_PTR_NOT_NULL_FATAL(one);
	CU_ASSERT_STRING_EQUAL(str(one, "optimizer.implementation"), "transformers AdamW");
	CU_ASSERT_DOUBLE_EQUAL(num(one, "optimizer.step_transient_bytes"), 65536, 0.5);
	cJSON_Delete(one);

	/* partitions */
	const struct { const char *set, *impl; double transient; } z[] = {
		{"--set deepspeed.zero_optimization.stage=2 --set deepspeed.optimizer.params.torch_adam="
		 "true", "torch foreach", 112384},
		{"--set deepspeed.zero_optimization.stage=2 --set deepspeed.optimizer.params.torch_adam="
		 "true --set deepspeed.zero_optimization.offload_optimizer.device=cpu", "torch for-loop",
		 224768},
		{"--set deepspeed.zero_optimization.stage=3 --set deepspeed.optimizer.params.torch_adam="
		 "true --set deepspeed.optimizer.params.foreach=false --set "
		 "deepspeed.zero_optimization.sub_group_size=10000", "torch for-loop", 99968},
		{"--set deepspeed.zero_optimization.stage=3 --set deepspeed.optimizer.params.torch_adam="
		 "true --set deepspeed.optimizer.params.foreach=false --set "
		 "deepspeed.zero_optimization.sub_group_size=1000", "torch for-loop", 33280},
		{"--set deepspeed.zero_optimization.stage=3 --set deepspeed.optimizer.params.torch_adam="
		 "true --set deepspeed.zero_optimization.sub_group_size=10000", "torch foreach", 49984},
	};
	for (unsigned i = 0; i < sizeof(z) / sizeof(z[0]); i++) {
		char extra[512];
		snprintf(extra, sizeof(extra), "%s --set cluster.gpus_per_node=4 %s", small, z[i].set);
		cJSON *j = predict_json(base_path(), extra);
		CU_ASSERT_PTR_NOT_NULL_FATAL(j);
		CU_ASSERT_DOUBLE_EQUAL(num(j, "optimizer.step_transient_bytes"), z[i].transient, 0.5);
		/* what is printed is what was priced: offloaded, torch loops */
		CU_ASSERT_STRING_EQUAL(str(j, "optimizer.implementation"), z[i].impl);
		cJSON_Delete(j);
	}

	/* the time of the update on the built-in H100 profile, memory-bound: the fused pass moves
	 * the fp32 master and moments in and out (2 x 12 PSI) and the fp32 gradients in and the
	 * bf16 parameters out (6 PSI), 30 PSI bytes; torch's eight passes move 52 bytes an element
	 * more (engine/optim.c counts them): 82 PSI */
	double t[2];
	for (int k = 0; k < 2; k++) {
		char extra[512];
		snprintf(extra, sizeof(extra), "%s%s", small,
			 k ? " --set deepspeed.optimizer.params.torch_adam=true" : "");
		cJSON *j = predict_json(base_path(), extra);
		CU_ASSERT_PTR_NOT_NULL_FATAL(j);
		t[k] = num(j, "time.breakdown.optimizer_s");
		cJSON_Delete(j);
	}
	CU_ASSERT(t[0] > 0);
	CU_ASSERT_DOUBLE_EQUAL(t[1] / t[0], 82.0 / 30.0, 1e-9);

	/* the table says which update it priced */
	int rc = px_test_run_clif(out, sizeof(out), "predict '%s' %s --set "
				  "deepspeed.optimizer.params.torch_adam=true", base_path(), small);
	CU_ASSERT_EQUAL(rc, 0);
	PX_ASSERT_HAS(out, "# optimizer  torch foreach update (optimizer.params.torch_adam): 0.000 "
			   "GiB of fp32 temporaries while it runs (torch/optim/adam.py");
	PX_ASSERT_HAS(out, "# GPU peak: optimizer step, allocating optimizer_step_temp\n");
	/* the Trainer ignores its optim when DeepSpeed builds the optimizer; it is said */
	rc = px_test_run_clif(out, sizeof(out), "predict '%s' %s --set training_args.optim=adamw_hf",
			      base_path(), small);
	CU_ASSERT_EQUAL(rc, 0);
	PX_ASSERT_HAS(out, "training_args.optim \"adamw_hf\" is not used: the DeepSpeed config's "
			   "optimizer section builds the optimizer");
	/* a name it does not price is refused, naming the key */
	rc = px_test_run_clif(out, sizeof(out), "predict '%s' --set deepspeed.optimizer=null --set "
			      "training_args.optim=adafactor", base_path());
	CU_ASSERT_EQUAL(rc, 2);
	PX_ASSERT_HAS(out, "training_args.optim: expected one of adamw_hf, adamw_torch, "
			   "adamw_torch_fused, adamw_apex_fused, got \"adafactor\"");
	/* the executor runs the fused and foreach updates (tests/test_exec.c measures the latter);
	 * the for-loop one it says it does not run rather than run another */
	rc = px_test_run_clif(out, sizeof(out), "run '%s' --set backend=cpu --set "
			      "deepspeed.optimizer.params.torch_adam=true --set "
			      "deepspeed.optimizer.params.foreach=false", base_path());
	CU_ASSERT_EQUAL(rc, 2);
	PX_ASSERT_HAS(out, "the executor runs a fused or torch foreach Adam update");
}

/* ---- sweep and plan ---- */

/* A sweep over usable memory around the peak of test_verdict_boundaries: one point fits, two are
 * tight (priced, counted apart), one does not fit. */
static void test_sweep_counts_tight(void)
{
	const double peak = 22 * PSI;
	char sw[1024], text[2048];
	base_path();
	snprintf(sw, sizeof(sw), "%s/sweep.json", dir);
	snprintf(text, sizeof(text), "{\"name\": \"tight\", \"scenario\": \"base.json\", \"set\": "
		 "{\"deepspeed.train_micro_batch_size_per_gpu\": 1, \"seq_length\": 8}, \"axes\": "
		 "{\"cluster.gpu_usable_memory_GiB\": [%.12g, %.12g, %.12g, %.12g]}}",
		 peak / 0.9 * 1.001 / GiB, peak / 0.9 * 0.999 / GiB, peak * 1.001 / GiB,
		 peak * 0.999 / GiB);
	px_test_write_file(sw, text);
	char db[1024];
	snprintf(db, sizeof(db), "%s/s.db", dir);
	for (int stored = 0; stored < 2; stored++) { /* this run's counts, then the database's */
		int rc = stored ? px_test_run_clif(out, sizeof(out), "sweep '%s' --db '%s' --jobs 1",
						   sw, db) :
				  px_test_run_clif(out, sizeof(out), "sweep '%s' --no-db --jobs 1", sw);
		CU_ASSERT_EQUAL(rc, 0);
		PX_ASSERT_HAS(out, "4 points: 3 priced (2 of them tight), 1 do not fit, 0 refused");
		PX_ASSERT_HAS(out, " tight  ");
	}
	int rc = px_test_run_clif(out, sizeof(out), "sweep '%s' --no-db --jobs 1 --json", sw);
	CU_ASSERT_EQUAL(rc, 0);
	cJSON *j = strchr(out, '{') ? cJSON_Parse(strchr(out, '{')) : NULL; /* after any notes */
	CU_ASSERT_PTR_NOT_NULL_FATAL(j);
	CU_ASSERT_EQUAL(num(j, "counts.tight"), 2);
	CU_ASSERT_EQUAL(num(j, "counts.ok"), 3);
	CU_ASSERT_EQUAL(num(j, "counts.oom"), 1);
	cJSON_Delete(j);
}

/* plan: micro-batch 16 of sequence 64 is faster than micro-batch 1 but its peak (about 10.2 MB,
 * test_moment_last_forward's) is tight in a GPU of 1.05 x that; micro-batch 1 of sequence 64
 * (a block 64*1*64*54 = 221,184 bytes: peak about 20 PSI + 2 blocks = 2.7 MB) fits with margin;
 * micro-batch 64 (four times micro-batch 16's activations) does not fit. Without --accept-tight
 * the plan takes micro-batch 1; with it, micro-batch 16; never 64. */
static void test_plan_tight_choice(void)
{
	const char *base = base_path();
	cJSON *j = predict_json(base, "--set deepspeed.train_micro_batch_size_per_gpu=16 "
				"--set seq_length=64 --set deepspeed.train_batch_size=64");
	CU_ASSERT_PTR_NOT_NULL_FATAL(j);
	double usable = num(j, "memory.gpu.peak_bytes") * 1.05;
	cJSON_Delete(j);
	char scen[1024], plan[1024], text[2048];
	snprintf(scen, sizeof(scen), "%s/plan-base.json", dir);
	snprintf(text, sizeof(text), "{\"model\": {\"model_type\": \"gpt2\", \"n_embd\": 64, "
		 "\"n_layer\": 2, \"n_head\": 4, \"n_positions\": 64, \"vocab_size\": 128}, "
		 "\"deepspeed\": {\"train_micro_batch_size_per_gpu\": 16, "
		 "\"gradient_accumulation_steps\": 4, \"bf16\": {\"enabled\": true}, \"optimizer\": "
		 "{\"type\": \"AdamW\", \"params\": {\"lr\": 3e-3}}, \"zero_optimization\": "
		 "{\"stage\": 0}}, \"cluster\": {\"gpu\": \"H100-SXM\", \"cuda_context_MiB\": 0, "
		 "\"cublas_workspace_MiB\": 0, \"nccl_buffers_MiB\": 0, \"gpu_usable_memory_GiB\": "
		 "%.12g}, \"seq_length\": 64}", usable / GiB);
	px_test_write_file(scen, text);
	snprintf(plan, sizeof(plan), "%s/plan.json", dir);
	px_test_write_file(plan, "{\"scenario\": \"plan-base.json\", \"tokens\": 1e9, \"gpus\": "
			   "[\"H100-SXM\"], \"nodes\": [1], \"gpus_per_node\": 1, \"search\": "
			   "{\"deepspeed.train_micro_batch_size_per_gpu\": [1, 16, 64]}}");
	for (int accept = 0; accept < 2; accept++) {
		int rc = px_test_run_clif(out, sizeof(out), "plan '%s' --json%s", plan,
					  accept ? " --accept-tight" : "");
		CU_ASSERT_EQUAL_FATAL(rc, 0);
		cJSON *p = cJSON_Parse(out);
		CU_ASSERT_PTR_NOT_NULL_FATAL(p);
		const cJSON *cell = cJSON_GetArrayItem(cJSON_GetObjectItem(p, "cells"), 0);
		CU_ASSERT_EQUAL(num(p, "winner"), 0);
		CU_ASSERT_EQUAL(cJSON_IsTrue(at(p, "accept_tight")), accept);
		CU_ASSERT_STRING_EQUAL(str(cell, "verdict"), accept ? "tight" : "fits");
		const cJSON *micro = cJSON_GetObjectItem(cJSON_GetObjectItem(cell, "config"),
							 "deepspeed.train_micro_batch_size_per_gpu");
		CU_ASSERT_EQUAL(cJSON_IsNumber(micro) ? micro->valuedouble : -1, accept ? 16 : 1);
		cJSON_Delete(p);
	}
}

/* PyTorch's caching allocator (c10/cuda/CUDACachingAllocator.cpp): sizes rounded up to 512 bytes
 * (round_size); a request of at most 1 MiB from the small pool's 2 MiB segments, one of up to
 * 10 MiB from a 20 MiB segment, a larger one from a segment of its size rounded up to 2 MiB
 * (get_allocation_size). */
static void test_allocator_sizes(void)
{
	CU_ASSERT_EQUAL(alloc_round_bytes(0, NULL), 512);
	CU_ASSERT_EQUAL(alloc_round_bytes(100, NULL), 512);
	CU_ASSERT_EQUAL(alloc_round_bytes(512, NULL), 512);
	CU_ASSERT_EQUAL(alloc_round_bytes(513, NULL), 1024);
	/* roundup_power2_divisions (PyTorch's "Memory management" notes: "if we need to round-up
	 * size of 1200 and if number of divisions is 4, the size 1200 lies between 1024 and 2048 ...
	 * the values are 1024, 1280, 1536, and 1792 ... 1200 will be rounded to 1280"; round_size
	 * applies it only above 512 x divisions bytes, so 1200 bytes themselves go to 1536, and the
	 * same arithmetic in MiB gives 1280 MiB) */
	AllocConf four = {0};
	for (int i = 0; i < ALLOC_CONF_INTERVALS; i++)
		four.divisions[i] = 4;
	CU_ASSERT_EQUAL(alloc_round_bytes(1200, &four), 1536);
	CU_ASSERT_EQUAL(alloc_round_bytes(1200 * (size_t)MiB, &four), 1280 * (size_t)MiB);
	CU_ASSERT_EQUAL(alloc_round_bytes(1792 * (size_t)MiB + 1, &four), 2048 * (size_t)MiB);
	CU_ASSERT_EQUAL(alloc_round_bytes(1024 * (size_t)MiB, &four), 1024 * (size_t)MiB);
	CU_ASSERT_EQUAL(alloc_round_bytes(1200 * (size_t)MiB, NULL), 1200 * (size_t)MiB);
	CU_ASSERT_EQUAL(alloc_segment_bytes(512), 2 << 20);
	CU_ASSERT_EQUAL(alloc_segment_bytes(1 << 20), 2 << 20);
	CU_ASSERT_EQUAL(alloc_segment_bytes((1 << 20) + 512), 20 << 20);
	CU_ASSERT_EQUAL(alloc_segment_bytes((10 << 20) - 512), 20 << 20);
	CU_ASSERT_EQUAL(alloc_segment_bytes(10 << 20), 10 << 20);
	CU_ASSERT_EQUAL(alloc_segment_bytes((10 << 20) + 512), 12 << 20);
}

static int gpu_alloc(Schedule *s, BufWhat what, double bytes)
{
	int id = -1;
	CU_ASSERT_EQUAL(sched_alloc(s, PLACE_GPU, CAT_ACTIV, what, -1, bytes, &id), 0);
	return id;
}

/* A sequence worked by hand with the allocator's rules (best fit, a large block split when more
 * than 1 MiB is left, a small one when at least 512 bytes are, free neighbours merged):
 *   context 500 MiB: outside the allocator (the driver's)
 *   a 3 MiB: no cached block: a 20 MiB segment, split: a [0, 3), free [3, 20)
 *   b 3 MiB: from the free 17 MiB, split: b [3, 6), free [6, 20)
 *   free a; c 1.5 MiB: best fit is a's 3 MiB block (not the 14 MiB one), split: c [0, 1.5)
 *   d 100 bytes: 512, from a new 2 MiB small segment
 *   e 30 MiB + 1 byte: 30 MiB + 512, from a new 32 MiB segment, split (2 MiB - 512 left)
 *     allocated b 3 + c 1.5 + e 30 MiB + 1024 bytes (d's and e's 512 each);
 *     reserved 20 + 2 + 32 = 54 MiB in 3 segments; nvidia-smi 54 + 500 MiB
 *   free c, free b: c's block merges with [1.5, 3), then b's with both sides: [0, 20) free
 *   f 18 MiB: fits the merged 20 MiB block, split (2 MiB left): no new segment (without merging
 *     it would map an 18 MiB one, reserving 72 MiB); allocated d + e + f = 48 MiB + 1024, the
 *     peak. */
static void test_allocator_replay(void)
{
	Schedule s;
	sched_init(&s, 0);
	int ctx = gpu_alloc(&s, BUF_CUDA_CONTEXT, 500 * MiB);
	int a = gpu_alloc(&s, BUF_ACTIVATIONS, 3 * MiB);
	int b = gpu_alloc(&s, BUF_ACTIVATIONS, 3 * MiB);
	CU_ASSERT_EQUAL(sched_free_buf(&s, a), 0);
	int c = gpu_alloc(&s, BUF_ACTIVATIONS, 1.5 * MiB);
	int d = gpu_alloc(&s, BUF_ACTIVATIONS, 100);
	int e = gpu_alloc(&s, BUF_ACTIVATIONS, 30 * MiB + 1);
	CU_ASSERT_EQUAL(sched_free_buf(&s, c), 0);
	CU_ASSERT_EQUAL(sched_free_buf(&s, b), 0);
	int f = gpu_alloc(&s, BUF_ACTIVATIONS, 18 * MiB);
	int ids[] = {f, e, d, ctx};
	for (int i = 0; i < 4; i++)
		CU_ASSERT_EQUAL(sched_free_buf(&s, ids[i]), 0);
	AllocPeaks pk;
	PxError err = {0};
	CU_ASSERT_EQUAL_FATAL(alloc_replay(&s, 0, NULL, &pk, &err), 0);
	CU_ASSERT_EQUAL(pk.allocated_bytes, 48 * MiB + 1024);
	CU_ASSERT_EQUAL(pk.reserved_bytes, 54 * MiB);
	CU_ASSERT_EQUAL(pk.segments, 3);
	CU_ASSERT_EQUAL(pk.outside_bytes, 500 * MiB);
	CU_ASSERT_EQUAL(pk.smi_bytes, 554 * MiB);
	sched_free(&s);
}

/* PYTORCH_CUDA_ALLOC_CONF's options in the model, on the sequences tests/test_pool.c works by
 * hand for the executor's allocator (the same rules, written apart):
 *   max_split_size_mb:32: a 100 MiB, freed; b 60 MiB (the 100 MiB block is 20 MiB or more
 *     larger: refused, a 60 MiB segment); c 90 MiB (the 100 MiB block, unsplit); freed; d 10
 *     MiB (the cached block is oversize for it: a 10 MiB segment): allocated 160 MiB at most,
 *     reserved 170 MiB in 3 segments (190 MiB without the option)
 *   expandable_segments:True: a 3 MiB (20 MiB mapped), b 30 MiB (20 more), c 100 bytes (a 2 MiB
 *     small segment), free a, d 5 MiB (the 7 MiB at the large segment's end), e 2 MiB (a's
 *     block): reserved 42 MiB in 2 segments, allocated 37 MiB + 512 */
static void test_allocator_conf(void)
{
	for (int on = 1; on >= 0; on--) {
		Schedule s;
		sched_init(&s, 0);
		int a = gpu_alloc(&s, BUF_ACTIVATIONS, 100 * MiB);
		CU_ASSERT_EQUAL(sched_free_buf(&s, a), 0);
		int b = gpu_alloc(&s, BUF_ACTIVATIONS, 60 * MiB);
		int c = gpu_alloc(&s, BUF_ACTIVATIONS, 90 * MiB);
		CU_ASSERT_EQUAL(sched_free_buf(&s, c), 0);
		int d = gpu_alloc(&s, BUF_ACTIVATIONS, 10 * MiB);
		CU_ASSERT(b >= 0 && d >= 0);
		AllocConf conf = {.max_split_bytes = 32 * MiB};
		AllocPeaks pk;
		PxError err = {0};
		CU_ASSERT_EQUAL_FATAL(alloc_replay(&s, 0, on ? &conf : NULL, &pk, &err), 0);
		CU_ASSERT_EQUAL(pk.reserved_bytes, (on ? 170 : 190) * MiB);
		if (on) {
			CU_ASSERT_EQUAL(pk.allocated_bytes, 160 * MiB);
			CU_ASSERT_EQUAL(pk.segments, 3);
		}
		sched_free(&s);
	}
	Schedule s;
	sched_init(&s, 0);
	int a = gpu_alloc(&s, BUF_ACTIVATIONS, 3 * MiB);
	gpu_alloc(&s, BUF_ACTIVATIONS, 30 * MiB);
	gpu_alloc(&s, BUF_ACTIVATIONS, 100);
	CU_ASSERT_EQUAL(sched_free_buf(&s, a), 0);
	gpu_alloc(&s, BUF_ACTIVATIONS, 5 * MiB);
	gpu_alloc(&s, BUF_ACTIVATIONS, 2 * MiB);
	AllocConf conf = {.expandable = 1};
	AllocPeaks pk;
	PxError err = {0};
	CU_ASSERT_EQUAL_FATAL(alloc_replay(&s, 0, &conf, &pk, &err), 0);
	CU_ASSERT_EQUAL(pk.reserved_bytes, 42 * MiB);
	CU_ASSERT_EQUAL(pk.allocated_bytes, 37 * MiB + 512);
	CU_ASSERT_EQUAL(pk.segments, 2);
	sched_free(&s);
}

/* roundup_power2_divisions and max_non_split_rounding_mb in the model, on sequences
 * tests/test_pool.c works by hand for the executor's allocator:
 *   "[256:1,512:2,1024:4,>:8]" as PyTorch's parser reads it (the key names the interval [MiB,
 *     2 MiB); '>' sets the last key's interval and above, so 1 GiB and up get 8, not 4): 300 MiB
 *     + 1 to 512 bytes; 600 MiB + 1 to 768 MiB (steps of 256 MiB); 1100 MiB to 1152 (steps of
 *     128); 3000 MiB to 3072 (256)
 *   divisions 4: a 9 MiB (10 MiB: steps of 2 MiB in [8, 16)) a segment of its own (10 MiB and
 *     more map their size), b 9.5 MiB (10) a second, free a, c 9.25 MiB (10) a's block:
 *     reserved 20 MiB in 2 segments, allocated at most 20; with 512-byte rounding b is split off the 11 MiB left, c fits neither a's 9
 *     MiB nor the 1.5 left and maps a second segment: reserved 40, allocated at most 18.75
 *   max_split_size_mb:32 with max_non_split_rounding_mb:50: a 100 MiB, freed; b 60 MiB takes
 *     the 100 MiB block (less than 50 MiB over); c 90 MiB maps 90; freed; d 10 MiB maps 10:
 *     reserved 200 MiB, allocated at most 190 (170 and 160 with the 20 MiB default) */
static void test_allocator_roundup(void)
{
	AllocConf list;
	PxNotes notes;
	PxError err = {0};
	px_notes_init(&notes);
	CU_ASSERT_EQUAL_FATAL(alloc_conf_parse("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]",
					       "t", &list, &notes, &err), 0);
	CU_ASSERT_EQUAL(alloc_round_bytes(300 * (size_t)MiB + 1, &list), 300 * (size_t)MiB + 512);
	CU_ASSERT_EQUAL(alloc_round_bytes(600 * (size_t)MiB + 1, &list), 768 * (size_t)MiB);
	CU_ASSERT_EQUAL(alloc_round_bytes(1100 * (size_t)MiB, &list), 1152 * (size_t)MiB);
	CU_ASSERT_EQUAL(alloc_round_bytes(3000 * (size_t)MiB, &list), 3072 * (size_t)MiB);
	CU_ASSERT_EQUAL(notes.n_not_modelled, 0);
	px_notes_free(&notes);

	AllocConf four = {0};
	for (int i = 0; i < ALLOC_CONF_INTERVALS; i++)
		four.divisions[i] = 4;
	for (int on = 1; on >= 0; on--) {
		Schedule s;
		sched_init(&s, 0);
		int a = gpu_alloc(&s, BUF_ACTIVATIONS, 9 * MiB);
		gpu_alloc(&s, BUF_ACTIVATIONS, 9.5 * MiB);
		CU_ASSERT_EQUAL(sched_free_buf(&s, a), 0);
		gpu_alloc(&s, BUF_ACTIVATIONS, 9.25 * MiB);
		AllocPeaks pk;
		CU_ASSERT_EQUAL_FATAL(alloc_replay(&s, 0, on ? &four : NULL, &pk, &err), 0);
		CU_ASSERT_EQUAL(pk.reserved_bytes, (on ? 20 : 40) * MiB);
		CU_ASSERT_EQUAL(pk.allocated_bytes, (on ? 20 : 18.75) * MiB);
		CU_ASSERT_EQUAL(pk.segments, 2);
		sched_free(&s);
	}
	for (int on = 1; on >= 0; on--) {
		Schedule s;
		sched_init(&s, 0);
		int a = gpu_alloc(&s, BUF_ACTIVATIONS, 100 * MiB);
		CU_ASSERT_EQUAL(sched_free_buf(&s, a), 0);
		gpu_alloc(&s, BUF_ACTIVATIONS, 60 * MiB);
		int c = gpu_alloc(&s, BUF_ACTIVATIONS, 90 * MiB);
		CU_ASSERT_EQUAL(sched_free_buf(&s, c), 0);
		gpu_alloc(&s, BUF_ACTIVATIONS, 10 * MiB);
		AllocConf conf = {.max_split_bytes = 32 * MiB, .max_non_split_bytes = on ? 50 * MiB : 0};
		AllocPeaks pk;
		CU_ASSERT_EQUAL_FATAL(alloc_replay(&s, 0, &conf, &pk, &err), 0);
		CU_ASSERT_EQUAL(pk.reserved_bytes, (on ? 200 : 170) * MiB);
		CU_ASSERT_EQUAL(pk.allocated_bytes, (on ? 190 : 160) * MiB);
		sched_free(&s);
	}
}

/* The scenario's pytorch_cuda_alloc_conf: expandable_segments reserves less than the defaults
 * for Llama-2 7B at ZeRO-2 (no less than it allocates), the verdict's peak unchanged; an option
 * PyTorch knows but Parallax does not price is noted; bad values and unknown options are refused
 * naming the file, the key and the option. */
static void test_alloc_conf_key(void)
{
	const char *scn = px_test_path("scenarios/llama2-7b-zero2-h100.json");
	double reserved[2], peak[2];
	for (int k = 0; k < 2; k++) {
		JsonOverrides ov;
		PxError err = {0};
		Scenario sc;
		Prediction pr;
		jov_init(&ov);
		CU_ASSERT_EQUAL_FATAL(jov_add_kv(&ov, "pytorch_cuda_alloc_conf", k ?
					"\"garbage_collection_threshold:0.6, expandable_segments:True\"" :
					"\"\"", &err), 0);
		CU_ASSERT_EQUAL_FATAL(scenario_load(&sc, scn, &ov, &err), 0);
		CU_ASSERT_EQUAL_FATAL(predict_run(&sc, &pr, &err), 0);
		reserved[k] = pr.stages[0].alloc.reserved_bytes;
		peak[k] = pr.stages[0].mem.place[PLACE_GPU].peak_bytes;
		if (k) {
			CU_ASSERT(reserved[k] >= pr.stages[0].alloc.allocated_bytes);
			CU_ASSERT_EQUAL(sc.notes.n_not_modelled, 1);
			PX_ASSERT_HAS(sc.notes.not_modelled[0], "garbage_collection_threshold");
		}
		fx_free(&sc, &pr);
		jov_free(&ov);
	}
	CU_ASSERT(reserved[1] < reserved[0]);
	CU_ASSERT_EQUAL(peak[1], peak[0]);
	static const char *const bad[][2] = {
		{"expandable_segments:Yes", "expandable_segments: expected True or False"},
		{"max_split_size_mb:20", "max_split_size_mb: expected a whole number of MiB above 20"},
		{"expandable_segment:True", "\"expandable_segment\" is not an option of PyTorch's"},
		{"roundup_power2_divisions:3", "roundup_power2_divisions: expected a power of two"},
		{"roundup_power2_divisions:[256:1,300:2]", "got \"300:2\""},
		{"max_non_split_rounding_mb:8", "max_non_split_rounding_mb: expected a whole number"},
	};
	for (int i = 0; i < 6; i++) {
		JsonOverrides ov;
		PxError err = {0};
		char value[128];
		jov_init(&ov);
		snprintf(value, sizeof(value), "\"%s\"", bad[i][0]);
		CU_ASSERT_EQUAL_FATAL(jov_add_kv(&ov, "pytorch_cuda_alloc_conf", value, &err), 0);
		fx_refused(scn, &ov, &err);
		PX_ASSERT_HAS(err.msg, "pytorch_cuda_alloc_conf");
		PX_ASSERT_HAS(err.msg, bad[i][1]);
		jov_free(&ov);
	}
}

/* ---- published memory measurements ---- */

/* The manifest's memory runs (scenarios/published/manifest.json, split before any was predicted:
 * its _memory_split says how) and, per kind of published figure, the predicted figure it is set
 * against: torch.cuda.max_memory_allocated against the allocator model's max_allocated, and so on.
 * A figure whose kind the source does not state (Qwen's README: "memory (GB)") is set against
 * what nvidia-smi would show, the largest of the three; a run that ran out of memory, or one known
 * only to have run (a table's "Batch Size Max" row), against the verdict. */
static const struct MemKind {
	const char *metric, *kind, *predicted;
} MEM_KINDS[] = {
	{"max_memory_allocated_bytes", "allocated", "memory.gpu.torch.max_allocated_bytes"},
	{"max_memory_reserved_bytes", "reserved", "memory.gpu.torch.max_reserved_bytes"},
	{"nvidia_smi_bytes", "nvidia-smi", "memory.gpu.smi_peak_bytes"},
	{"gpu_memory_bytes", "unstated", "memory.gpu.smi_peak_bytes"},
	{"oom", "oom", NULL},
	{"ran", "ran", NULL},
};

static const struct MemKind *mem_kind(const char *metric)
{
	for (unsigned i = 0; i < sizeof(MEM_KINDS) / sizeof(MEM_KINDS[0]); i++)
		if (!strcmp(MEM_KINDS[i].metric, metric))
			return &MEM_KINDS[i];
	return NULL;
}

/* The held-out runs that met the targets when they were first judged (peak within 10% of
 * the measured figure of the same kind; no "fits" for a run that ran out of memory; no "does not
 * fit" for a run known only to have run): asserted,
 * so that a change that breaks one fails. The other held-out runs miss a target; they are printed
 * and listed in docs/models.md ("Against published measurements") as the gap, and nothing is
 * asserted about them. Qwen 7B at sequence 1024 met the first when judged (+2.6%, though said
 * "does not fit" for a run that ran) and no longer does since the ZeRO-2 step's gradient flat
 * (stage_1_and_2.py) is scheduled: +11.4%. Its figure, 81 GiB a GPU, is below what DeepSpeed's
 * ZeRO-2 holds at the step on two GPUs even without that flat (model states and the fp32
 * gradient partition, 79.1 GiB, plus the CUDA context); docs/models.md says so. */
static const char *const MEM_HELD_MET[] = {
	"alpaca-llama-13b-fsdp-2xa100.json",    /* out of memory: "does not fit" */
	"fsdp-blog-gpt2-xl-ddp-1gpu.json",      /* out of memory: "does not fit" */
	"fsdp-blog-gpt2-xl-ddp-2gpu.json",      /* out of memory: "does not fit" */
	"fsdp-blog-gpt2-xl-ddp-fp16-1gpu.json", /* out of memory: "does not fit" */
	/* ran at their batch size: none "does not fit" (the FSDP blog's rows, added afterwards) */
	"fsdp-blog-gpt2-large-ddp-2gpu.json", "fsdp-blog-gpt2-large-ddp-fp16-2gpu.json",
	"fsdp-blog-gpt2-large-shard-grad-op-2gpu.json", "fsdp-blog-gpt2-large-full-1m-2gpu.json",
	"fsdp-blog-gpt2-large-full-2k-2gpu.json", "fsdp-blog-gpt2-large-full-1m-offload-2gpu.json",
	"fsdp-blog-gpt2-large-full-2k-offload-2gpu.json", "fsdp-blog-gpt2-xl-full-2k-2gpu.json",
	"fsdp-blog-gpt2-xl-full-2k-offload-1gpu.json", "fsdp-blog-gpt2-xl-full-2k-offload-2gpu.json",
	"megatron-gpt-7b-tp4-h100.json",       /* max_memory_allocated -3.0% */
	NULL,
};

/* 1 when name is one of MEM_HELD_MET; *count gets their number */
static int mem_held_met(const char *name, int *count)
{
	int found = 0;
	*count = 0;
	for (const char *const *m = MEM_HELD_MET; *m; m++, (*count)++)
		found |= !strcmp(*m, name);
	return found;
}

/* One source's tally of one split: the runs with a figure (mean and worst |error|) and the
 * out-of-memory runs (how many were said to fit). */
typedef struct MemTally {
	char source[48];
	int held_out, n, n_ran, n_oom, false_fits, ran_said_no;
	double sum_abs, max_abs;
} MemTally;

static MemTally *mem_tally(MemTally *t, int *n, int max, const char *source, int held_out)
{
	for (int i = 0; i < *n; i++)
		if (!strcmp(t[i].source, source) && t[i].held_out == held_out)
			return &t[i];
	CU_ASSERT_FATAL(*n < max);
	MemTally *m = &t[(*n)++];
	memset(m, 0, sizeof(*m));
	snprintf(m->source, sizeof(m->source), "%s", source);
	m->held_out = held_out;
	return m;
}

/* Every memory run of the manifest: its _published figure has a known kind and is cited; predict
 * runs on it; the measured and the predicted figure of the same kind are printed with the
 * schedule's peak beside, and the error tallied per source and split. On the held-out runs the
 * targets are asserted where they were met (MEM_HELD_MET). The calibration runs are printed for
 * whoever fits a figure later; nothing is asserted on them. A held-out run on the same GPU as a
 * calibration run with a parameter count within 1.5x of it (same family, scale and setup) must be
 * marked near_copy_of; none is. */
static void test_published_memory(void)
{
	JsonDoc man;
	PxError err = {0};
	const cJSON *runs = px_manifest_runs(&man);
	MemTally st[16];
	int n_src = 0, n_runs = 0, n_held = 0, n_met = 0, n_listed = 0;
	struct { char gpu[32]; double params; int held_out, near; } seen[48];
	printf("\n# published memory runs (GiB per GPU; predicted: the figure of the measured kind, for "
	       "a run out of memory max_allocated; peak: the schedule's; capacity: usable)\n"
	       "# %-42s %-11s %-10s %10s %10s %8s %8s %8s %-12s %s", "scenario", "split", "kind",
	       "measured", "predicted", "error", "peak", "capacity", "verdict", "target");
	const cJSON *run;
	cJSON_ArrayForEach(run, runs) {
		PxPublishedRun mr = px_manifest_run(&man, run);
		const struct MemKind *k = mem_kind(mr.metric);
		if (!k) /* another suite's run (time, inference) */
			continue;
		int held_out = mr.held_out, near = mr.near_copy_of != NULL;
		JsonDoc sc;
		CU_ASSERT_FATAL(jdoc_load_file(&sc, px_test_path(mr.scenario), &err) == 0);
		const cJSON *pub = cJSON_GetObjectItemCaseSensitive(sc.root, "_published");
		const cJSON *cite = cJSON_GetObjectItemCaseSensitive(sc.root, "_source");
		CU_ASSERT(cJSON_IsString(cite) && strlen(cite->valuestring) > 100); /* quoted, with its URL */
		CU_ASSERT_STRING_EQUAL(str(pub, "kind"), k->kind);
		double measured = k->predicted ? num(pub, k->metric) : NAN;
		CU_ASSERT(k->predicted ? measured > 0 : cJSON_IsTrue(at(pub, k->metric)));
		int rc = px_test_run_clif(out, sizeof(out), "predict '%s' --json --no-db",
					  px_test_path(mr.scenario));
		CU_ASSERT_EQUAL(rc, 0);
		cJSON *j = rc ? NULL : cJSON_Parse(strchr(out, '{') ? strchr(out, '{') : out);
		CU_ASSERT_PTR_NOT_NULL(j);
		const char *name = strrchr(mr.scenario, '/') + 1;
		if (!j) {
			fprintf(stderr, "\n%s: %s\n", name, out);
			jdoc_free(&sc);
			continue;
		}
		n_runs++;
		n_held += held_out;
		const char *verdict = str(j, "verdict");
		double peak = num(j, "memory.gpu.peak_bytes");
		double capacity = num(j, "memory.gpu_capacity_bytes");
		double predicted = k->predicted ? num(j, k->predicted) : NAN;
		double e = predicted / measured - 1;
		MemTally *t = mem_tally(st, &n_src, 16, mr.source, held_out);
		int met;
		if (k->predicted) {
			met = fabs(e) <= 0.10;
			t->n++;
			t->sum_abs += fabs(e);
			t->max_abs = fmax(t->max_abs, fabs(e));
		} else if (!strcmp(k->metric, "ran")) {
			met = strcmp(verdict, "does not fit") != 0;
			t->n_ran++;
			t->ran_said_no += !met;
		} else {
			met = strcmp(verdict, "fits") != 0;
			t->n_oom++;
			t->false_fits += !met;
		}
		if (held_out && mem_held_met(name, &n_listed)) {
			CU_ASSERT(met); /* it met the target when first judged */
			n_met++;
		}
		if (k->predicted) {
			printf("\n# %-42.*s %-11s %-10s %10.2f %10.2f %+7.1f%% %8.2f %8.2f %-12s %s",
			       (int)(strlen(name) - 5), name, mr.split, k->kind, measured / GiB,
			       predicted / GiB, 100 * e, peak / GiB, capacity / GiB, verdict,
			       !held_out ? "-" : met ? "met" : "MISSED");
		} else { /* no figure: a run that ran at its batch size, or torch's out-of-memory
			    message (allocated when it failed plus the request, a lower bound) */
			int oom = !strcmp(k->metric, "oom");
			char need[32] = "-";
			if (oom)
				snprintf(need, sizeof(need), ">%.2f",
					 (num(pub, "allocated_at_oom_bytes") + num(pub, "request_bytes")) /
						 GiB);
			printf("\n# %-42.*s %-11s %-10s %10s %10.2f %8s %8.2f %8.2f %-12s %s",
			       (int)(strlen(name) - 5), name, mr.split, oom ? "oom: alloc" : "ran: alloc",
			       need, num(j, "memory.gpu.torch.max_allocated_bytes") / GiB, "",
			       peak / GiB, capacity / GiB, verdict,
			       !held_out ? "-" : met ? "met" : "MISSED");
		}
		if (k->predicted && !strcmp(verdict, "does not fit")) { /* it ran */
			t->ran_said_no++;
			printf(" (it ran)");
		}
		/* near-copies: same GPU and a parameter count within 1.5x */
		CU_ASSERT_FATAL(n_runs <= 48);
		snprintf(seen[n_runs - 1].gpu, sizeof(seen[0].gpu), "%s", str(j, "gpu"));
		seen[n_runs - 1].params = num(j, "num_parameters");
		seen[n_runs - 1].held_out = held_out;
		seen[n_runs - 1].near = near;
		cJSON_Delete(j);
		jdoc_free(&sc);
	}
	for (int a = 0; a < n_runs; a++)
		for (int b = 0; b < n_runs; b++)
			if (seen[a].held_out && !seen[b].held_out && !strcmp(seen[a].gpu, seen[b].gpu) &&
			    fmax(seen[a].params, seen[b].params) < 1.5 * fmin(seen[a].params, seen[b].params))
				CU_ASSERT(seen[a].near);
	printf("\n# by source:\n# %-24s %-12s %5s %12s %8s %5s %12s %6s %10s", "source", "split",
	       "runs", "mean |error|", "worst", "ran", "ran, said NO", "OOM", "said fits");
	for (int i = 0; i < n_src; i++) {
		printf("\n# %-24s %-12s %5d ", st[i].source, st[i].held_out ? "held-out" : "calibration",
		       st[i].n);
		if (st[i].n)
			printf("%11.1f%% %7.1f%% ", 100 * st[i].sum_abs / st[i].n, 100 * st[i].max_abs);
		else
			printf("%12s %8s ", "-", "-");
		printf("%5d %12d %6d %10d", st[i].n_ran, st[i].ran_said_no, st[i].n_oom,
		       st[i].false_fits);
	}
	printf("\n# targets on held-out runs: within 10%% of the measured figure, no \"fits\" for a run "
	       "that ran out of memory, no \"does not fit\" for one that ran; %d of %d held-out runs "
	       "meet them (asserted; 16 did when first judged, docs/models.md)\n",
	       n_met, n_held);
	/* the manifest's memory runs: 8 calibration, 19 held out (scenarios/published/manifest.json) */
	CU_ASSERT_EQUAL(n_runs, 27);
	CU_ASSERT_EQUAL(n_held, 19);
	mem_held_met("", &n_listed);
	CU_ASSERT_EQUAL(n_met, n_listed); /* every listed run was found in the manifest */
	jdoc_free(&man);
}

int test_verdict_register(void)
{
	return PX_ADD_SUITE("verdict", {"usable memory against its sources", test_usable_against_sources},
			    {"usable above memory refused", test_usable_above_memory_refused},
			    {"verdict boundaries", test_verdict_boundaries},
			    {"catalog usable by default", test_verdict_uses_catalog_usable},
			    {"moment: gradient reduce", test_moment_grad_reduce},
			    {"moment: optimizer step", test_moment_optimizer_step},
			    {"moment: last forward", test_moment_last_forward},
			    {"the optimizer step's transient tensors", test_step_transients},
			    {"ZeRO 1-2's flat and fp32 gradient copies", test_zero_step_copies},
			    {"sweep counts tight points", test_sweep_counts_tight},
			    {"plan and --accept-tight", test_plan_tight_choice},
			    {"caching allocator: sizes", test_allocator_sizes},
			    {"caching allocator: a replay by hand", test_allocator_replay},
			    {"caching allocator: max_split_size_mb and expandable_segments by hand",
			     test_allocator_conf},
			    {"roundup_power2_divisions and max_non_split_rounding_mb, hand-worked",
			     test_allocator_roundup},
			    {"the scenario's pytorch_cuda_alloc_conf", test_alloc_conf_key},
			    {"published memory measurements", test_published_memory});
}

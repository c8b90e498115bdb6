/* FSDP (framework "fsdp"): PyTorch's FullyShardedDataParallel as the Trainer and Accelerate wrap a
 * model, worked by hand on a small Llama.
 * Sources: Rajbhandari et al., "ZeRO", SC'20 (shared/reference/zero_memory.md: model states of
 * 16 bytes a parameter over Nd ranks at stage 3; section 7.2: a Ψ all-gather in forward, another
 * in backward and a Ψ reduce-scatter, 1.5x data parallelism's 2Ψ); Zhao et al., "PyTorch FSDP:
 * Experiences on Scaling Fully Sharded Data Parallel", VLDB 2023 (FULL_SHARD and SHARD_GRAD_OP,
 * backward prefetch, the rate limiter); torch/distributed/fsdp/_runtime_utils.py (the root unit
 * kept from forward to backward, no_sync keeping each unit's unsharded gradient,
 * _should_free_in_backward) and the FullyShardedDataParallel.no_sync documentation ("gradients
 * will be accumulated in module variables ... higher memory"). */
#include <CUnit/CUnit.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/fsdp_wrap.h"
#include "../exec/runner.h"
#include "fixtures.h"
#include "suites.h"

/* A 4-layer Llama (h 256, I 688, V 1000, untied): a layer 4 h^2 + 3 h I + 2 h = 791,040
 * parameters, the root (embedding, final norm, head) 2 V h + h = 512,256; Ψ = 3,676,416. */
#define LAYER 791040LL
#define ROOT 512256LL
#define PSI (4 * LAYER + ROOT)

#define FSDP_LLAMA                                                                              \
	"{\"model\": {\"model_type\": \"llama\", \"hidden_size\": 256, \"num_hidden_layers\": 4," \
	" \"num_attention_heads\": 4, \"num_key_value_heads\": 4, \"intermediate_size\": 688,"     \
	" \"vocab_size\": 1000, \"max_position_embeddings\": 512, \"tie_word_embeddings\": false},"  \
	" \"framework\": \"fsdp\", \"fsdp\": {%s},"                                               \
	" \"training_args\": {\"fp16\": true},"                                                  \
	" \"deepspeed\": {\"train_micro_batch_size_per_gpu\": 1,"                                 \
	" \"gradient_accumulation_steps\": %d,"                                                  \
	" \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-5}}},"
/* the fsdp object's keys, the micro-batches and the GPUs of one node (two nodes: FMT_2) */
static const char *const FMT = FSDP_LLAMA
	" \"cluster\": {\"gpu\": \"A100-80GB\", \"gpus_per_node\": %d}, \"seq_length\": 128}";
static const char *const FMT_2 = FSDP_LLAMA
	" \"cluster\": {\"gpu\": \"A100-80GB\", \"nodes\": 2, \"gpus_per_node\": %d},"
	" \"seq_length\": 128}";

/* Elements of a flat of n padded to a multiple of the ranks (FSDP's FlatParameter). */
static long long padded(long long n, long long ranks)
{
	return (n + ranks - 1) / ranks * ranks;
}

/* Bytes of buffers of kind what live just before op `at`, walking the ops once (a repeat
 * block's body balanced, or run once). */
static double live_before(const Schedule *s, int at, int what)
{
	double live = 0, *bytes = calloc((size_t)s->n_bufs + 1, sizeof(*bytes));
	CU_ASSERT_PTR_NOT_NULL_FATAL(bytes);
	for (int i = 0; i < at && i < s->n; i++) {
		const Op *op = &s->ops[i];
		if (op->kind == OP_ALLOC && op->what == what)
			bytes[op->buf] = op->bytes, live += op->bytes;
		else if (op->kind == OP_FREE && op->buf >= 0)
			live -= bytes[op->buf], bytes[op->buf] = 0;
	}
	free(bytes);
	return live;
}

/* The index of the k-th op (from 0) of kind `kind`, sub-kind sub (-1 for any), or -1. */
static int nth_op(const Schedule *s, int kind, int sub, int k)
{
	for (int i = 0; i < s->n; i++)
		if (s->ops[i].kind == kind && (sub < 0 || s->ops[i].sub == sub) && k-- == 0)
			return i;
	return -1;
}

static void test_model_states(void)
{
	Scenario sc;
	Prediction pr;
	if (fx_predictf(&sc, &pr, FMT, "", 1, 4))
		return;
	const Plan *p = &pr.plan;
	CU_ASSERT_DOUBLE_EQUAL(sc.model.n_params, (double)PSI, 0);
	CU_ASSERT_EQUAL(p->stage, 3);
	CU_ASSERT_EQUAL(p->param_bytes, 2);
	CU_ASSERT_EQUAL(p->shard_bytes, 4);
	/* the shards: each unit's flat padded to 4, a quarter of it on each rank */
	long long part = 4 * (padded(LAYER, 4) / 4) + padded(256000 + 256, 4) / 4 +
			 padded(256000, 4) / 4;
	CU_ASSERT_EQUAL(p->stages[0].part_elems, part);
	/* ZeRO's stage 3: 16 bytes a parameter over the ranks (4 + 4 fp32 shard and gradient,
	 * Adam's 8) */
	IdealStates id = plan_stage_ideal(p, 0);
	CU_ASSERT_DOUBLE_EQUAL(id.total_bytes, 16.0 * (double)PSI / 4, 1e-6);
	const Schedule *s = &pr.stages[0].sched;
	int step = nth_op(s, OP_COMPUTE, COMP_OPTIMIZER, 0);
	CU_ASSERT_FATAL(step > 0);
	CU_ASSERT_DOUBLE_EQUAL(live_before(s, step, BUF_PARAM_PART), 4.0 * (double)part, 0);
	CU_ASSERT_DOUBLE_EQUAL(live_before(s, step, BUF_GRAD_PART), 4.0 * (double)part, 0);
	CU_ASSERT_DOUBLE_EQUAL(live_before(s, step, BUF_OPT_STATES), 8.0 * (double)part, 0);
	CU_ASSERT_DOUBLE_EQUAL(live_before(s, step, BUF_MASTER), 0, 0);
	CU_ASSERT_DOUBLE_EQUAL(live_before(s, step, BUF_FSDP_UNSHARDED), 0, 0);
	CU_ASSERT_DOUBLE_EQUAL(live_before(s, step, BUF_GATHERED), 0, 0);
	/* the Trainer's zero_grad drops the gradient shards after the step */
	CU_ASSERT_DOUBLE_EQUAL(live_before(s, s->n, BUF_GRAD_PART), 0, 0);
	fx_free(&sc, &pr);
}

/* Bytes sent per rank (ring) of one collective kind, in elements of 2 bytes. */
static double sent_elems(const Prediction *pr, CollKind k)
{
	return pr->stages[0].traffic.wire_bytes[k] / 2;
}

static void test_communication(void)
{
	/* ranks, micro-batches, the fsdp object; all-gathers and reduce-scatters a step, and the
	 * elements each moves in all (payload) */
	static const struct {
		const char *fsdp;
		int m;
		long long gathers, reduces, gathered, reduced;
	} c[] = {
		/* one micro-batch: the root once, each layer forward and backward; one
		 * reduce-scatter a unit (the root's two halves apart) */
		{"", 1, 2 + 4 * 2, 2 + 4, 2 * 4 * LAYER + ROOT, PSI},
		/* no_sync: every micro-batch gathers, only the last reduces */
		{"", 3, 3 * 10, 6, 3 * (2 * 4 * LAYER + ROOT), PSI},
		{"\"sync_each_batch\": true", 3, 3 * 10, 3 * 6, 3 * (2 * 4 * LAYER + ROOT), 3 * PSI},
		/* SHARD_GRAD_OP keeps what the first forward gathered: under no_sync until the
		 * last backward, else each micro-batch's forward gathers once */
		{"\"sharding_strategy\": \"SHARD_GRAD_OP\"", 3, 6, 6, PSI, PSI},
		{"\"sharding_strategy\": \"SHARD_GRAD_OP\", \"sync_each_batch\": true", 3, 3 * 6,
		 3 * 6, 3 * PSI, 3 * PSI},
	};
	for (unsigned i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
		Scenario sc;
		Prediction pr;
		if (fx_predictf(&sc, &pr, FMT, c[i].fsdp, c[i].m, 4))
			return;
		const Traffic *t = &pr.stages[0].traffic;
		CU_ASSERT_EQUAL(t->n_colls[COLL_ALL_GATHER], c[i].gathers);
		CU_ASSERT_EQUAL(t->n_colls[COLL_REDUCE_SCATTER], c[i].reduces);
		/* padding: each unit's flat to 4 ranks (the layer's and the root halves' are
		 * multiples of 4 already) */
		CU_ASSERT_DOUBLE_EQUAL(t->payload_bytes[COLL_ALL_GATHER], 2.0 * (double)c[i].gathered,
				       0);
		CU_ASSERT_DOUBLE_EQUAL(t->payload_bytes[COLL_REDUCE_SCATTER],
				       2.0 * (double)c[i].reduced, 0);
		/* a ring moves (N - 1) / N of each */
		CU_ASSERT_DOUBLE_EQUAL(sent_elems(&pr, COLL_ALL_GATHER), 0.75 * (double)c[i].gathered,
				       1e-6);
		fx_free(&sc, &pr);
	}
	/* one micro-batch against DistributedDataParallel's 2Ψ (ZeRO section 7.2: stage 3 is 1.5x;
	 * FSDP's root, kept from forward to backward, is gathered once) */
	Scenario sc;
	Prediction pr;
	if (fx_predictf(&sc, &pr, FMT, "", 1, 4))
		return;
	double fsdp = sent_elems(&pr, COLL_ALL_GATHER) + sent_elems(&pr, COLL_REDUCE_SCATTER);
	CU_ASSERT_DOUBLE_EQUAL(fsdp, 0.75 * (3.0 * PSI - ROOT), 1e-6);
	CU_ASSERT(fsdp / (2 * 0.75 * PSI) > 1.4 && fsdp / (2 * 0.75 * PSI) <= 1.5);
	fx_free(&sc, &pr);
}

static void test_no_sync_gradients(void)
{
	Scenario sc;
	Prediction pr;
	/* 3 micro-batches: the first keeps each unit's whole fp16 gradient, the last reduces */
	if (fx_predictf(&sc, &pr, FMT, "", 3, 4))
		return;
	const Schedule *s = &pr.stages[0].sched;
	int last = nth_op(s, OP_LOOP, -1, 2);
	CU_ASSERT_FATAL(last > 0);
	CU_ASSERT_EQUAL(s->ops[nth_op(s, OP_LOOP, -1, 0)].count, 1);
	CU_ASSERT_EQUAL(s->ops[nth_op(s, OP_LOOP, -1, 1)].count, 1);
	CU_ASSERT_EQUAL(s->ops[last].count, 1);
	/* before the last micro-batch: the whole model's gradients in fp16, 2Ψ bytes (each flat
	 * padded), and no gradient shard yet */
	CU_ASSERT_DOUBLE_EQUAL(live_before(s, last, BUF_FSDP_UNSHARDED), 2.0 * (double)PSI, 0);
	CU_ASSERT_DOUBLE_EQUAL(live_before(s, last, BUF_GRAD_PART), 0, 0);
	int left;
	fx_live_bufs(s, 0, BUF_FSDP_UNSHARDED, NULL, &left);
	CU_ASSERT_EQUAL(left, 0);
	/* the peak's moment is a later micro-batch's backward, its number counted over the
	 * blocks */
	const StagePrediction *st = &pr.stages[0];
	CU_ASSERT(st->mem.place[PLACE_GPU].peak_op > nth_op(s, OP_LOOP, -1, 1));
	fx_free(&sc, &pr);

	/* sync_each_batch: the shards from the first micro-batch on, no whole gradient kept */
	if (fx_predictf(&sc, &pr, FMT, "\"sync_each_batch\": true", 3, 4))
		return;
	s = &pr.stages[0].sched;
	int second = nth_op(s, OP_LOOP, -1, 1);
	CU_ASSERT_EQUAL(s->ops[second].count, 2);
	CU_ASSERT_DOUBLE_EQUAL(live_before(s, second, BUF_FSDP_UNSHARDED), 0, 0);
	CU_ASSERT_DOUBLE_EQUAL(live_before(s, second, BUF_GRAD_PART),
			       4.0 * (double)pr.plan.stages[0].part_elems, 0);
	fx_free(&sc, &pr);
}

/* The gathered 16-bit weights live at each backward compute of a layer: the root's throughout,
 * the layer's own, and under BACKWARD_PRE the next one's (prefetched before the compute); in
 * forward the host runs one unit ahead whatever the prefetch. */
static void test_prefetch(void)
{
	static const struct {
		const char *fsdp;
		long long backward, forward;
	} c[] = {
		{"", ROOT + 2 * LAYER, ROOT + 2 * LAYER},
		{"\"backward_prefetch\": \"BACKWARD_POST\"", ROOT + LAYER, ROOT + 2 * LAYER},
		{"\"backward_prefetch\": \"NO_PREFETCH\"", ROOT + LAYER, ROOT + 2 * LAYER},
		/* SHARD_GRAD_OP: every layer from its forward to its backward */
		{"\"sharding_strategy\": \"SHARD_GRAD_OP\"", PSI, ROOT + 2 * LAYER},
	};
	for (unsigned i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
		Scenario sc;
		Prediction pr;
		if (fx_predictf(&sc, &pr, FMT, c[i].fsdp, 1, 4))
			return;
		const Schedule *s = &pr.stages[0].sched;
		/* backward runs the head, then layers 4 to 1: the second backward is layer 4's */
		int bwd = nth_op(s, OP_COMPUTE, COMP_BWD, 1), fwd = nth_op(s, OP_COMPUTE, COMP_FWD, 2);
		CU_ASSERT_FATAL(bwd > 0 && fwd > 0);
		CU_ASSERT_EQUAL(s->ops[bwd].unit, 4);
		CU_ASSERT_EQUAL(s->ops[fwd].unit, 2);
		CU_ASSERT_DOUBLE_EQUAL(live_before(s, bwd, BUF_GATHERED), 2.0 * (double)c[i].backward,
				       0);
		/* layer 2's forward: SHARD_GRAD_OP still holds layer 1 */
		double fwd_want = c[i].backward == PSI ? ROOT + 3 * LAYER : c[i].forward;
		CU_ASSERT_DOUBLE_EQUAL(live_before(s, fwd, BUF_GATHERED), 2.0 * fwd_want, 0);
		fx_free(&sc, &pr);
	}
}

/* CPUOffload (offload_params): the shards (fp32), their gradients (flat_param._cpu_grad, pinned
 * at wrapping) and Adam's states on the host; each gather copies the unit's fp32 shard up first
 * (one micro-batch: the root once, each layer twice), each reduce-scatter's fp32 shard goes down
 * (Ψ / N x 4 bytes a step); the device's gradient shards live to the end of the backward. */
static void test_offload(void)
{
	Scenario sc;
	Prediction pr;
	if (fx_predictf(&sc, &pr, FMT, "\"offload_params\": true", 1, 4))
		return;
	const Plan *p = &pr.plan;
	CU_ASSERT_EQUAL(p->opt_place, PLACE_CPU);
	CU_ASSERT_EQUAL(p->param_place, PLACE_CPU);
	const Schedule *s = &pr.stages[0].sched;
	double part = (double)p->stages[0].part_elems;
	CU_ASSERT_DOUBLE_EQUAL(part, PSI / 4.0, 0);
	int step = nth_op(s, OP_COMPUTE, COMP_OPTIMIZER, 0);
	CU_ASSERT_FATAL(step > 0);
	for (int k = 0; k < s->n; k++) {
		const Op *op = &s->ops[k];
		if (op->kind != OP_ALLOC)
			continue;
		if (op->what == BUF_PARAM_PART || op->what == BUF_OPT_STATES ||
		    op->what == BUF_GRAD_FP32)
			CU_ASSERT_EQUAL(op->place, PLACE_CPU);
		if (op->what == BUF_GATHERED || op->what == BUF_FSDP_UNSHARDED ||
		    op->what == BUF_GRAD_PART)
			CU_ASSERT_EQUAL(op->place, PLACE_GPU);
	}
	CU_ASSERT_DOUBLE_EQUAL(live_before(s, step, BUF_PARAM_PART), 4 * part, 0);
	CU_ASSERT_DOUBLE_EQUAL(live_before(s, step, BUF_GRAD_FP32), 4 * part, 0);
	CU_ASSERT_DOUBLE_EQUAL(live_before(s, step, BUF_OPT_STATES), 8 * part, 0);
	CU_ASSERT_DOUBLE_EQUAL(live_before(s, step, BUF_GRAD_PART), 0, 0);
	const Traffic *t = &pr.stages[0].traffic;
	CU_ASSERT_DOUBLE_EQUAL(t->copy_bytes[COPY_H2D], 4.0 * (2 * 4 * LAYER + ROOT) / 4, 0);
	CU_ASSERT_DOUBLE_EQUAL(t->copy_bytes[COPY_D2H], 4 * part, 0);
	fx_free(&sc, &pr);
	/* the Trainer's adamw_torch on host tensors: the for-loop update (foreach is torch's default
	 * for CUDA tensors only); on the device, foreach */
	static const char *const trainer =
		"{\"model\": {\"num_parameters\": 1e8, \"num_hidden_layers\": 2}, \"framework\": "
		"\"fsdp\", \"fsdp\": {\"offload_params\": %s}, \"training_args\": {\"optim\": "
		"\"adamw_torch\"}, \"deepspeed\": {\"train_micro_batch_size_per_gpu\": 1}, "
		"\"cluster\": {\"gpu\": \"A100-80GB\", \"gpus_per_node\": 4}}";
	for (int off = 0; off < 2; off++) {
		if (fx_predictf(&sc, &pr, trainer, off ? "true" : "false"))
			return;
		CU_ASSERT_EQUAL(pr.plan.opt_impl, off ? OPT_IMPL_FOR_LOOP : OPT_IMPL_FOREACH);
		fx_free(&sc, &pr);
	}
}

/* HYBRID_SHARD on two nodes of 4: shards over a node's 4 ranks (16 bytes a parameter over 4, not
 * 8), gathers and reduce-scatters inside the node, and each reduce-scatter's shard all-reduced
 * over the 2 nodes: the only bytes that cross them, 2 (n - 1) / n x Ψ / 4 x 2 bytes a step at
 * n = 2. FULL_SHARD on the same shards over all 8. */
static void test_hybrid(void)
{
	static const struct {
		const char *fsdp;
		long long shards;
	} c[] = {{"\"sharding_strategy\": \"HYBRID_SHARD\"", 4}, {"", 8}};
	for (unsigned i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
		Scenario sc;
		Prediction pr;
		if (fx_predictf(&sc, &pr, FMT_2, c[i].fsdp, 1, 4))
			return;
		const Plan *p = &pr.plan;
		CU_ASSERT_EQUAL(p->dp, 8);
		CU_ASSERT_EQUAL(p->shards, c[i].shards);
		CU_ASSERT_EQUAL(p->stages[0].part_elems, PSI / c[i].shards);
		CU_ASSERT_DOUBLE_EQUAL(plan_stage_ideal(p, 0).total_bytes,
				       16.0 * (double)PSI / (double)c[i].shards, 1e-6);
		const Traffic *t = &pr.stages[0].traffic;
		const Schedule *s = &pr.stages[0].sched;
		int hybrid = c[i].shards == 4, across = 0;
		for (int k = 0; k < s->n; k++) /* the gradients' all-reduces (not the scalars') */
			if (s->ops[k].kind == OP_COLL && s->ops[k].sub == COLL_ALL_REDUCE &&
			    s->ops[k].role == ROLE_GRAD_REDUCE) {
				CU_ASSERT_EQUAL(s->ops[k].group, GROUP_XNODE);
				CU_ASSERT_EQUAL(s->ops[k].nranks, 2);
				across++;
			}
		CU_ASSERT_EQUAL(across, hybrid ? 6 : 0);
		double gathered = 2.0 * (2 * 4 * LAYER + ROOT), reduced = 2.0 * PSI;
		if (hybrid) {
			CU_ASSERT_DOUBLE_EQUAL(t->group_wire_bytes[GROUP_XNODE], 2 * 0.5 * 2.0 * PSI / 4,
					       1e-6);
			CU_ASSERT_DOUBLE_EQUAL(t->group_wire_bytes[GROUP_NODE],
					       0.75 * (gathered + reduced), 1e-6);
		} else {
			CU_ASSERT_DOUBLE_EQUAL(t->group_wire_bytes[GROUP_NODE], 0, 0);
			/* over the 8 ranks (the scalar all-reduces' few bytes beside) */
			CU_ASSERT_DOUBLE_EQUAL(t->group_wire_bytes[GROUP_DP],
					       0.875 * (gathered + reduced), 8);
			CU_ASSERT(t->inter_node_bytes > 0);
		}
		fx_free(&sc, &pr);
	}
}

static void test_refusals(void)
{
	static const struct {
		const char *fsdp, *framework, *extra, *says;
	} bad[] = {
		{"\"sharding_strategy\": \"NO_SHARD\"", "fsdp", "",
		 "fsdp.sharding_strategy: NO_SHARD is not modelled"},
		{"\"sharding_strategy\": \"ZERO3\"", "fsdp", "",
		 "fsdp.sharding_strategy: expected FULL_SHARD, SHARD_GRAD_OP, HYBRID_SHARD or "
		 "_HYBRID_SHARD_ZERO2, got \"ZERO3\""},
		{"\"backward_prefetch\": \"EARLY\"", "fsdp", "",
		 "fsdp.backward_prefetch: expected one of BACKWARD_PRE, BACKWARD_POST, NO_PREFETCH"},
		{"", "fsdp", ", \"backend\": \"cuda\"", "framework \"fsdp\" with backend \"cuda\""},
	};
	const char *fmt = "{\"model\": {\"num_parameters\": 1e8, \"num_hidden_layers\": 2}, "
			  "\"framework\": \"%s\", \"fsdp\": {%s}, \"deepspeed\": "
			  "{\"train_micro_batch_size_per_gpu\": 1}, \"cluster\": {\"gpu\": "
			  "\"A100-80GB\", \"gpus_per_node\": 4}%s}";
	for (unsigned i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char name[32], json[1024];
		snprintf(name, sizeof(name), "fsdp%u.json", i);
		snprintf(json, sizeof(json), fmt, bad[i].framework, bad[i].fsdp, bad[i].extra);
		fx_check_refused(name, json, bad[i].says);
	}
	/* beside another framework the object is ignored, with a warning */
	Scenario sc;
	Prediction pr;
	if (fx_predictf(&sc, &pr, FMT, "\"sharding_strategy\": \"SHARD_GRAD_OP\"", 1, 4) == 0) {
		CU_ASSERT_EQUAL(sc.fsdp.sharding, FSDP_SHARD_GRAD_OP);
		fx_free(&sc, &pr);
	}
	char path[512], out[1 << 16], fw[4096];
	snprintf(path, sizeof(path), "%s/fsdp-ignored.json", px_test_tmpdir());
	snprintf(fw, sizeof(fw), FMT, "\"sharding_strategy\": \"SHARD_GRAD_OP\"", 1, 4);
	px_test_write_file(path, fw);
	CU_ASSERT_EQUAL(px_test_run_clif(out, sizeof(out), "predict '%s' --no-db --set "
					 "framework=deepspeed --set deepspeed.zero_optimization.stage=3",
					 path), 0);
	PX_ASSERT_HAS(out, "fsdp: FSDP's options are ignored with framework \"deepspeed\"");
	PX_ASSERT_HAS(out, "# zero       stage 3");
	/* ZeRO beside it */
	char json[1024];
	snprintf(json, sizeof(json), "{\"model\": {\"num_parameters\": 1e8, \"num_hidden_layers\": "
		 "2}, \"framework\": \"fsdp\", \"deepspeed\": {\"train_micro_batch_size_per_gpu\": 1, "
		 "\"zero_optimization\": {\"stage\": 3}}, \"cluster\": {\"gpu\": \"A100-80GB\"}}");
	fx_check_refused("fsdp-zero.json", json,
		      "framework \"fsdp\" with deepspeed.zero_optimization.stage: FSDP shards by "
		      "fsdp.sharding_strategy");
}

/* FSDP2 (fsdp.version 2, torch's fully_shard; torch/distributed/fsdp/_fully_shard/
 * _fsdp_collectives.py foreach_all_gather, foreach_all_gather_copy_out; _fsdp_param_group.py
 * post_forward_mesh_info): each gather goes into the group's all-gather output, every rank's
 * shards of the unit (fp16 here: LAYER x 2 bytes), which the copy-out empties into the unsharded
 * parameters allocated then, both live at that moment; reshard_after_forward 2 on 4 ranks keeps
 * 1/2 of each layer from its forward (LAYER / 2 x 2 bytes), so the backward starts with all four
 * layers' halves live, and each backward gather runs over 2 ranks, from the kept half, which then
 * goes. */
static void test_fsdp2(void)
{
	Scenario sc;
	Prediction pr;
	if (fx_predictf(&sc, &pr, FMT, "\"version\": 2", 1, 4))
		return;
	const Schedule *s = &pr.stages[0].sched;
	int ag = -1;
	for (int i = 0; i < s->n && ag < 0; i++)
		if (s->ops[i].kind == OP_ALLOC && s->ops[i].what == BUF_FSDP_AG_OUTPUT &&
		    s->ops[i].unit == 1)
			ag = i;
	CU_ASSERT_FATAL(ag >= 0 && ag + 3 < s->n);
	CU_ASSERT_DOUBLE_EQUAL(s->ops[ag].bytes, 2.0 * LAYER, 0);
	const Op *gather = &s->ops[ag + 1], *params = &s->ops[ag + 2], *out = &s->ops[ag + 3];
	CU_ASSERT(gather->kind == OP_COLL && gather->sub == COLL_ALL_GATHER &&
		  gather->buf == s->ops[ag].buf && gather->elems == LAYER && gather->nranks == 4);
	CU_ASSERT(params->kind == OP_ALLOC && params->what == BUF_GATHERED && params->unit == 1 &&
		  params->bytes == 2.0 * LAYER);
	CU_ASSERT(out->kind == OP_FREE && out->buf == s->ops[ag].buf);
	CU_ASSERT_DOUBLE_EQUAL(live_before(s, ag + 3, BUF_FSDP_AG_OUTPUT), 2.0 * LAYER, 0);
	CU_ASSERT(pr.plan.fsdp2 && sc.fsdp.version == 2);
	fx_free(&sc, &pr);

	if (fx_predictf(&sc, &pr, FMT, "\"version\": 2, \"reshard_after_forward\": 2", 1, 4))
		return;
	s = &pr.stages[0].sched;
	int first = -1, n_hpz = 0;
	for (int i = 0; i < s->n; i++) {
		const Op *op = &s->ops[i];
		if (op->kind != OP_COLL || op->sub != COLL_ALL_GATHER || op->group != GROUP_HPZ)
			continue;
		CU_ASSERT(op->nranks == 2 && op->elems == LAYER);
		first = first < 0 ? i : first;
		n_hpz++;
	}
	CU_ASSERT_EQUAL(n_hpz, 4); /* each layer's backward gather */
	CU_ASSERT_FATAL(first > 0);
	CU_ASSERT_DOUBLE_EQUAL(live_before(s, first, BUF_FSDP_POST_FORWARD), 4.0 * LAYER, 0);
	CU_ASSERT_DOUBLE_EQUAL(live_before(s, s->n, BUF_FSDP_POST_FORWARD), 0, 0);
	fx_free(&sc, &pr);

	static const struct { const char *fsdp, *says; } bad[] = {
		{"\"version\": 3", "fsdp.version"},
		{"\"reshard_after_forward\": false",
		 "fsdp.reshard_after_forward: FSDP2's (fully_shard); with version 1 use "
		 "sharding_strategy"},
		{"\"version\": 2, \"sharding_strategy\": \"HYBRID_SHARD\"",
		 "fsdp.sharding_strategy: HYBRID_SHARD with version 2: FSDP2 shards hybrid over a 2-D "
		 "device mesh"},
		{"\"version\": 2, \"reshard_after_forward\": 3",
		 "fsdp.reshard_after_forward = 3: expected a divisor of the 4 ranks"},
		{"\"version\": 2, \"reshard_after_forward\": 4",
		 "fsdp.reshard_after_forward = 4: expected a divisor of the 4 ranks"},
		{"\"version\": 2, \"reshard_after_forward\": 1.5",
		 "fsdp.reshard_after_forward: expected true, false or a whole number"},
		{"\"version\": 2, \"reshard_after_forward\": true, \"sharding_strategy\": \"FULL_SHARD\"",
		 "fsdp.reshard_after_forward: given beside sharding_strategy"},
		{"\"version\": 2, \"reshard_after_forward\": 2, \"offload_params\": true",
		 "fsdp.reshard_after_forward = 2 with offload_params: not modelled"},
	};
	const char *fmt = "{\"model\": {\"num_parameters\": 1e8, \"num_hidden_layers\": 2}, "
			  "\"framework\": \"fsdp\", \"fsdp\": {%s}, \"deepspeed\": "
			  "{\"train_micro_batch_size_per_gpu\": 1}, \"cluster\": {\"gpu\": "
			  "\"A100-80GB\", \"gpus_per_node\": 4}}";
	for (unsigned i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char name[32], json[1024];
		snprintf(name, sizeof(name), "fsdp2-%u.json", i);
		snprintf(json, sizeof(json), fmt, bad[i].fsdp);
		fx_check_refused(name, json, bad[i].says);
	}
	/* FSDP1's prefetch options are ignored with a warning; predict's header names FSDP2 */
	char path[512], json[4096], text[1 << 16];
	snprintf(path, sizeof(path), "%s/fsdp2-ok.json", px_test_tmpdir());
	snprintf(json, sizeof(json), FMT, "\"version\": 2, \"backward_prefetch\": \"NO_PREFETCH\"", 1,
		 4);
	px_test_write_file(path, json);
	CU_ASSERT_EQUAL_FATAL(px_test_run_clif(text, sizeof(text), "predict '%s' --no-db", path),
			      0);
	PX_ASSERT_HAS(text, "warning: fsdp.backward_prefetch: FSDP1's, ignored");
	PX_ASSERT_HAS(text, "# framework  PyTorch FSDP2 (fully_shard)");
	PX_ASSERT_HAS(text, "reshard_after_forward true");
}

/* predict's header names FSDP's settings, the JSON the framework */
/* The auto-wrap policies by size and none (torch/distributed/fsdp/wrap.py _recursive_wrap and
 * size_based_auto_wrap_policy: children first, then a module whose parameters not yet in a unit
 * reach min_num_params; a ModuleList never). Hugging Face's LlamaDecoderLayer here, by hand:
 * self_attn's q, k, v, o_proj 65,536 each (262,144), mlp's gate, up, down_proj 176,128 each
 * (528,384), two RMSNorms of 256: 791,040. */
static void test_wrap_policies(void)
{
	static const struct {
		double min;
		long long wrapped, leftover;
		int pieces;
	} c[] = {
		{7e5, LAYER, 0, 1},                 /* the layer whole: TRANSFORMER_BASED_WRAP's */
		{8e5, 0, LAYER, 0},                 /* nothing: the layer the root's */
		{5e5, 528384, 262144 + 512, 1},     /* the mlp; attention and norms left */
		{1.5e5, 3 * 176128 + 262144, 512, 4}, /* gate, up, down_proj each, then self_attn */
	};
	Scenario sc;
	Prediction pr;
	if (fx_predictf(&sc, &pr, FMT, "", 1, 4))
		return;
	for (unsigned i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
		FsdpWrap w;
		CU_ASSERT_EQUAL_FATAL(fsdp_wrap_size_based(&sc.model, 2, c[i].min, &w), 0);
		CU_ASSERT_EQUAL(w.wrapped, c[i].wrapped);
		CU_ASSERT_EQUAL(w.leftover, c[i].leftover);
		CU_ASSERT_EQUAL(w.pieces, c[i].pieces);
	}
	fx_free(&sc, &pr);

	/* the schedule, one micro-batch on 4 ranks: what the layers leave joins the root's flat
	 * (unit 0's; the head's 256,256 apart), gathered once and kept, reduced once at the end;
	 * the layers' own flats gathered forward and backward */
	static const struct {
		const char *fsdp;
		long long layer, gathers, gathered, backward;
	} s[] = {
		{"\"auto_wrap_policy\": \"NO_WRAP\"", 0, 2, PSI, PSI},
		{"\"auto_wrap_policy\": \"SIZE_BASED_WRAP\", \"min_num_params\": 800000", 0, 2, PSI,
		 PSI},
		{"\"auto_wrap_policy\": \"SIZE_BASED_WRAP\", \"min_num_params\": 500000", 528384,
		 2 + 4 * 2, PSI - 4 * 528384 + 2 * 4 * 528384, PSI - 4 * 528384 + 2 * 528384},
		{"\"auto_wrap_policy\": \"SIZE_BASED_WRAP\", \"min_num_params\": 700000", LAYER,
		 2 + 4 * 2, 2 * 4 * LAYER + ROOT, ROOT + 2 * LAYER},
	};
	for (unsigned i = 0; i < sizeof(s) / sizeof(s[0]); i++) {
		if (fx_predictf(&sc, &pr, FMT, s[i].fsdp, 1, 4))
			return;
		const Plan *p = &pr.plan;
		CU_ASSERT_EQUAL(p->units[2].own_gather, s[i].layer);
		CU_ASSERT_EQUAL(p->units[2].fsdp_left, LAYER - s[i].layer);
		CU_ASSERT_EQUAL(p->units[0].own_gather + p->units[5].own_gather,
				ROOT + 4 * (LAYER - s[i].layer));
		const Traffic *t = &pr.stages[0].traffic;
		CU_ASSERT_EQUAL(t->n_colls[COLL_ALL_GATHER], s[i].gathers);
		CU_ASSERT_DOUBLE_EQUAL(t->payload_bytes[COLL_ALL_GATHER], 2.0 * (double)s[i].gathered,
				       0);
		CU_ASSERT_DOUBLE_EQUAL(t->payload_bytes[COLL_REDUCE_SCATTER], 2.0 * (double)PSI, 0);
		/* the gathered weights at layer 4's backward: the root's, layer 4's and the
		 * prefetched layer 3's own */
		const Schedule *sch = &pr.stages[0].sched;
		int bwd = nth_op(sch, OP_COMPUTE, COMP_BWD, 1);
		CU_ASSERT_EQUAL_FATAL(sch->ops[bwd].unit, 4);
		CU_ASSERT_DOUBLE_EQUAL(live_before(sch, bwd, BUF_GATHERED), 2.0 * s[i].backward, 0);
		/* when the root's hook cats its flat (its BUF_FSDP_UNSHARDED, after layer 1's
		 * backward), the layers' left gradients are still pieces: 4 x what each leaves,
		 * fp16; then none */
		int cat = -1;
		for (int k = 0; k < sch->n && cat < 0; k++)
			if (sch->ops[k].kind == OP_ALLOC && sch->ops[k].what == BUF_FSDP_UNSHARDED &&
			    sch->ops[k].unit == 0)
				cat = k;
		CU_ASSERT_FATAL(cat > 0);
		CU_ASSERT_DOUBLE_EQUAL(live_before(sch, cat, BUF_FSDP_ROOT_GRADS),
				       2.0 * 4 * (double)(LAYER - s[i].layer), 0);
		CU_ASSERT_DOUBLE_EQUAL(live_before(sch, sch->n, BUF_FSDP_ROOT_GRADS), 0, 0);
		fx_free(&sc, &pr);
	}
	/* several units a layer are priced as gathered together, and the units outside the
	 * layers as the root's: both said */
	if (fx_predictf(&sc, &pr, FMT, "\"auto_wrap_policy\": \"SIZE_BASED_WRAP\", "
			"\"min_num_params\": 150000", 1, 4))
		return;
	CU_ASSERT(fx_noted(&sc.notes, "a layer's 4 units"));
	CU_ASSERT(fx_noted(&sc.notes, "the units outside the layers"));
	fx_free(&sc, &pr);

	/* the executor runs the transformer-layer wrap only, and says so */
	static const char *const gpt = "{\"model\": {\"model_type\": \"gpt2\", \"n_embd\": 64, "
		"\"n_layer\": 2, \"n_head\": 2, \"n_positions\": 32, \"vocab_size\": 128}, "
		"\"framework\": \"fsdp\", \"fsdp\": {%s}, \"deepspeed\": "
		"{\"train_micro_batch_size_per_gpu\": 1, \"optimizer\": {\"type\": \"AdamW\", "
		"\"params\": {\"lr\": 1e-3}}}, \"cluster\": {\"gpu\": \"H100-SXM\", "
		"\"gpus_per_node\": 2}, \"backend\": \"cpu\", \"seq_length\": 32}";
	for (int policy = 0; policy < 2; policy++) {
		if (fx_predictf(&sc, &pr, gpt, policy ? "\"auto_wrap_policy\": \"NO_WRAP\"" : ""))
			return;
		PxError err = {0};
		CU_ASSERT_EQUAL(runner_supported(&pr.plan, &err), policy ? -1 : 0);
		if (policy)
			PX_ASSERT_HAS(err.msg, "auto_wrap_policy SIZE_BASED_WRAP and NO_WRAP");
		fx_free(&sc, &pr);
	}
	fx_check_refused("fsdp-wrap.json", "{\"model\": {\"num_parameters\": 1e8, "
			 "\"num_hidden_layers\": 2}, \"framework\": \"fsdp\", \"fsdp\": "
			 "{\"auto_wrap_policy\": \"SIZE_BASED\"}, \"deepspeed\": "
			 "{\"train_micro_batch_size_per_gpu\": 1}, \"cluster\": {\"gpu\": "
			 "\"A100-80GB\"}}",
			 "fsdp.auto_wrap_policy: expected one of TRANSFORMER_BASED_WRAP, "
			 "SIZE_BASED_WRAP, NO_WRAP");
}

static void test_header(void)
{
	char path[512], json[4096], out[1 << 16];
	snprintf(path, sizeof(path), "%s/fsdp-ok.json", px_test_tmpdir());
	snprintf(json, sizeof(json), FMT, "", 4, 4);
	px_test_write_file(path, json);
	CU_ASSERT_EQUAL_FATAL(px_test_run_clif(out, sizeof(out), "predict '%s' --no-db", path), 0);
	PX_ASSERT_HAS(out, "# framework  PyTorch FSDP: FULL_SHARD");
	PX_ASSERT_HAS(out, "backward_prefetch BACKWARD_PRE");
	PX_ASSERT_HAS(out, "no_sync but for the last micro-batch");
	PX_ASSERT_HAS(out, "# precision  fp32 shards and gradient shards; fp16 gathered weights");
	CU_ASSERT_PTR_NULL(strstr(out, "# zero "));
	CU_ASSERT_EQUAL_FATAL(px_test_run_clif(out, sizeof(out), "predict '%s' --no-db --json", path),
			      0);
	PX_ASSERT_HAS(out, "\"framework\":\t\"fsdp\"");
}

int test_fsdp_register(void)
{
	return PX_ADD_SUITE("fsdp", {"model states: 16 bytes a parameter over the ranks", test_model_states},
			    {"communication: gathers and reduce-scatters by strategy and no_sync",
			     test_communication},
			    {"no_sync keeps the whole 16-bit gradients until the last micro-batch",
			     test_no_sync_gradients},
			    {"gathered weights by prefetch and strategy", test_prefetch},
			    {"CPUOffload: the host's shards, gradients and states", test_offload},
			    {"FSDP2: the all-gather output, reshard_after_forward's kept shards, "
			     "refusals", test_fsdp2},
			    {"HYBRID_SHARD: a node's shards, replicas all-reduced across nodes",
			     test_hybrid},
			    {"what FSDP is not priced with is refused by name", test_refusals},
			    {"auto-wrap by size and none: what the layers leave held by the root",
			     test_wrap_policies},
			    {"predict's header and JSON", test_header});
}

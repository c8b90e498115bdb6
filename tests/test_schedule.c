/* The schedule as one statement: the walk's order and its refusals (each naming the op and why,
 * against schedules written by hand here), and what build.c states on every bundled scenario's
 * schedules: every collective and copy has a role, the one-value all-reduces are named by theirs,
 * and the slices of a stage's gradient reductions tile its partition with neither gap nor
 * overlap (an executor places each reduced slice by them). */
#include <CUnit/CUnit.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/streams.h"
#include "fixtures.h"
#include "../engine/infer_scenario.h"
#include "suites.h"

/* ---- the walk, on hand-written schedules ---- */

/* The ops a walk visits, as "index.iteration" words, into out. Returns the walk's last code. */
static int walk_trace(Schedule *s, char *out, size_t len, PxError *err)
{
	SchedWalk w;
	int i;
	out[0] = 0;
	sched_walk_init(&w, s, 0);
	for (; (i = sched_walk_op(&w, err)) >= 0; sched_walk_advance(&w)) {
		size_t n = strlen(out);
		snprintf(out + n, len - n, "%s%d.%lld", n ? " " : "", i, (long long)w.iter);
	}
	return i;
}

/* A compute, a block of 3 (alloc, compute, free) and a compute: by hand, the body's ops 2-4 come
 * three times with iterations 0, 1, 2, the markers too (the END_LOOP with the iteration that
 * ended); a block of 0 runs nothing of its body, nor its end. */
static void test_walk_order(void)
{
	Schedule s;
	PxError err = {0};
	char trace[512];
	int b;
	sched_init(&s, 0);
	sched_compute(&s, COMP_FWD, 0, 1, 0);
	sched_loop(&s, 3);
	sched_alloc(&s, PLACE_GPU, CAT_ACTIV, BUF_ACTIVATIONS, 1, 8, &b);
	sched_compute(&s, COMP_FWD, 1, 1, 0);
	sched_free_buf(&s, b);
	sched_end_loop(&s);
	sched_compute(&s, COMP_OPTIMIZER, -1, 1, 0);
	CU_ASSERT_EQUAL(walk_trace(&s, trace, sizeof(trace), &err), SCHED_WALK_END);
	CU_ASSERT_STRING_EQUAL(trace, "0.0 1.0 2.0 3.0 4.0 5.0 2.1 3.1 4.1 5.1 2.2 3.2 4.2 5.2 6.0");
	CU_ASSERT_EQUAL(sched_validate(&s, &err), 0);
	CU_ASSERT(s.valid);
	s.ops[1].count = 0;
	CU_ASSERT_EQUAL(walk_trace(&s, trace, sizeof(trace), &err), SCHED_WALK_END);
	CU_ASSERT_STRING_EQUAL(trace, "0.0 1.0 6.0");
	sched_free(&s);
}

/* A schedule sched_validate must refuse, with want in the message. */
static void expect_refused(Schedule *s, const char *want)
{
	PxError err = {0};
	CU_ASSERT_EQUAL(sched_validate(s, &err), -1);
	CU_ASSERT_FALSE(s->valid);
	if (!strstr(err.msg, want))
		fprintf(stderr, "\nwanted '%s', got '%s'\n", want, err.msg);
	CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, want));
}

static void test_walk_refusals(void)
{
	Schedule s;
	int b;

	sched_init(&s, 0); /* nested blocks */
	sched_loop(&s, 2);
	sched_loop(&s, 2);
	sched_end_loop(&s);
	sched_end_loop(&s);
	expect_refused(&s, "schedule op 1 begins a repeat block inside the one op 0 begins: "
			   "blocks do not nest");
	sched_free(&s);

	sched_init(&s, 0); /* an end without a beginning */
	sched_compute(&s, COMP_FWD, 0, 1, 0);
	sched_end_loop(&s);
	expect_refused(&s, "schedule op 1 ends a repeat block never begun");
	sched_free(&s);

	sched_init(&s, 0); /* a beginning without an end */
	sched_compute(&s, COMP_FWD, 0, 1, 0);
	sched_loop(&s, 2);
	sched_compute(&s, COMP_FWD, 0, 1, 0);
	expect_refused(&s, "schedule op 1 begins a repeat block that never ends");
	sched_free(&s);

	sched_init(&s, 0); /* a field out of range: the group */
	sched_compute(&s, COMP_FWD, 0, 1, 0);
	sched_coll(&s, COLL_ALL_REDUCE, ROLE_GRAD_REDUCE, GROUP_DP, 4, -1, 100, 2, -1, 0);
	s.ops[1].group = 200;
	expect_refused(&s, "schedule op 1 (collective) has an unknown group");
	s.ops[1].group = GROUP_DP;
	s.ops[1].nranks = 0;
	expect_refused(&s, "schedule op 1 (collective) has a group of no ranks");
	s.ops[1].nranks = 4;
	s.ops[1].buf = 7; /* no buffer 7 */
	expect_refused(&s, "schedule op 1 (collective) has a buffer id outside the schedule's "
			   "buffers");
	s.ops[1].buf = -1;
	s.ops[1].role = N_ROLES;
	expect_refused(&s, "schedule op 1 (collective) has an unknown role");
	sched_free(&s);

	sched_init(&s, 0); /* a micro-batch below 0, on a compute and on an allocation */
	sched_compute(&s, COMP_FWD, 0, 1, 0);
	sched_set_mb(&s, -1);
	expect_refused(&s, "schedule op 0 (compute) has a negative micro-batch");
	s.ops[0].mb = 0;
	sched_alloc(&s, PLACE_GPU, CAT_ACTIV, BUF_PIPE_INPUT, 1, 8, &b);
	sched_set_mb(&s, -2);
	expect_refused(&s, "schedule op 1 (alloc) has a negative micro-batch");
	sched_free(&s);

	sched_init(&s, 0); /* buffers: freed twice, used after its free, allocated again */
	sched_alloc(&s, PLACE_GPU, CAT_GRADS, BUF_REDUCE_BUCKET, -1, 400, &b);
	sched_free_buf(&s, b);
	sched_coll(&s, COLL_REDUCE_SCATTER, ROLE_GRAD_REDUCE, GROUP_DP, 4, -1, 100, 4, b, 0);
	expect_refused(&s, "schedule op 2 (collective) works on buffer 0, which is not live");
	s.ops[2] = s.ops[1];
	expect_refused(&s, "schedule op 2 frees buffer 0, which is not live");
	s.ops[2] = s.ops[0];
	expect_refused(&s, "schedule op 2 allocates buffer 0 again");
	sched_free(&s);

	sched_init(&s, 0); /* a body that keeps what it allocates cannot repeat */
	sched_loop(&s, 2);
	sched_alloc(&s, PLACE_GPU, CAT_ACTIV, BUF_ACTIVATIONS, 1, 8, &b);
	sched_end_loop(&s);
	expect_refused(&s, "schedule op 2 ends a repeat block whose body leaves 1 buffer(s) more "
			   "live than it found");
	sched_free(&s);
}

/* ---- what the builder states, on every bundled scenario ---- */

typedef struct Span {
	long long off, n;
} Span;

static int by_off(const void *a, const void *b)
{
	const Span *x = a, *y = b;
	return (x->off > y->off) - (x->off < y->off);
}

/* Whether op is a reduction of dense gradients over the data-parallel group (qgZ reduces in two
 * all-to-alls, the second, across nodes, leaving the slice). */
static int dense_reduce(const Op *op)
{
	return op->kind == OP_COLL && op->role == ROLE_GRAD_REDUCE &&
	       (op->group == GROUP_DP || op->group == GROUP_XNODE);
}

/* Stage st's reductions of dense gradients over the data-parallel group (one pass over the
 * schedule: each micro-batch's reductions reduce the same slices, so of micro-batches split into
 * blocks, as hpZ's first one apart, the first block's that reduces: under no_sync, DDP's and
 * FSDP's, the last) tile [0, part) exactly: their slices, sorted, start where the one before
 * ends, from 0 to the partition's size. */
static void check_tiling(const Prediction *pr, int st, const char *name)
{
	const Schedule *s = &pr->stages[st].sched;
	const Plan *p = &pr->plan;
	Span *sp = calloc((size_t)s->n + 1, sizeof(*sp));
	int n = 0;
	SchedWalk w;
	PxError err = {0};
	CU_ASSERT_PTR_NOT_NULL_FATAL(sp);
	int block = -1, inside = 0, reducing = -1; /* the first block that reduces */
	for (int i = s->step_begin; i < s->n && reducing < 0; i++) {
		block += s->ops[i].kind == OP_LOOP;
		if (dense_reduce(&s->ops[i]))
			reducing = block;
	}
	block = -1;
	sched_walk_init(&w, s, s->step_begin);
	for (int i; (i = sched_walk_op(&w, &err)) >= 0; sched_walk_advance(&w)) {
		const Op *op = &s->ops[i];
		if (op->kind == OP_LOOP)
			block++, inside = 1;
		if (op->kind == OP_END_LOOP)
			sched_walk_leave(&w), inside = 0;
		if (inside && block != reducing)
			continue;
		if (!dense_reduce(op))
			continue;
		CU_ASSERT(op->slice >= 0);
		if (op->slice < 0)
			continue;
		sp[n++] = (Span){s->slices[op->slice].part_off, s->slices[op->slice].part_elems};
	}
	qsort(sp, (size_t)n, sizeof(*sp), by_off);
	long long at = 0;
	for (int k = 0; k < n; k++) {
		if (sp[k].off != at)
			fprintf(stderr, "\n%s stage %d: slice %d starts at %lld, expected %lld\n", name,
				st, k, sp[k].off, at);
		CU_ASSERT_EQUAL(sp[k].off, at);
		at = sp[k].off + sp[k].n;
	}
	if (at != p->stages[st].part_elems)
		fprintf(stderr, "\n%s stage %d: slices end at %lld, the partition at %lld\n", name,
			st, at, p->stages[st].part_elems);
	CU_ASSERT_EQUAL(at, p->stages[st].part_elems);
	free(sp);
}

static void check_scenario(const char *path, int *tiled)
{
	Scenario sc;
	Prediction pr;
	PxError err = {0};
	if (scenario_load(&sc, path, NULL, &err) || predict_memory(&sc, &pr, &err)) {
		fprintf(stderr, "\n%s: %s\n", path, err.msg);
		CU_FAIL("bundled scenario does not predict");
		return;
	}
	const Plan *p = &pr.plan;
	for (int st = 0; st < pr.n_stages; st++) {
		Schedule *s = &pr.stages[st].sched;
		int overflow[3] = {0, 0, 0}, norm[3] = {0, 0, 0}, tied = 0; /* dp, tp, pp */
		CU_ASSERT_EQUAL(sched_validate(s, &err), 0);
		for (int i = 0; i < s->n; i++) {
			const Op *op = &s->ops[i];
			if (op->kind == OP_COLL || op->kind == OP_COPY || op->kind == OP_COMPUTE)
				CU_ASSERT_NOT_EQUAL(op->role, ROLE_NONE);
			int g = op->group == GROUP_PP ? 2 : op->group == GROUP_TP;
			overflow[g] += op->role == ROLE_OVERFLOW;
			norm[g] += op->role == ROLE_GRAD_NORM;
			if (op->role == ROLE_TIED_GRADS) {
				tied++;
				CU_ASSERT(op->group == GROUP_PP && op->nranks == 2 && op->buf >= 0);
			}
		}
		/* DeepSpeed's one-value all-reduces: the fp16 overflow check, and the gradient
		 * norm when clipping on a partitioned stage or (the engine clipping fp32 itself,
		 * runtime/utils.py clip_grad_norm_, which averages the ranks' norms) at stage 0 in
		 * fp32, once a step, on more than one rank of the data-parallel group; then both
		 * over the tensor-parallel group, each of whose
		 * ranks holds its shards, and over the pipeline's stages, each of which holds only its
		 * own layers */
		int several = p->dp > 1, staged = p->par.pp > 1, fp16 = sc.ds.dtype == DT_FP16;
		int clip = sc.ds.gradient_clipping > 0, split = p->par.tp > 1;
		CU_ASSERT_EQUAL(overflow[0], several && fp16);
		CU_ASSERT_EQUAL(norm[0], several && clip && (p->stage >= 1 || !p->mixed));
		CU_ASSERT_EQUAL(overflow[1], split && fp16);
		CU_ASSERT_EQUAL(norm[1], split && clip);
		CU_ASSERT_EQUAL(overflow[2], staged && fp16);
		CU_ASSERT_EQUAL(norm[2], staged && clip);
		/* the tied embedding's copies, on the first and the last stage */
		CU_ASSERT_EQUAL(tied, staged && model_tied_elems(&sc.model) > 0 &&
				      (st == 0 || st == p->par.pp - 1));
		if (p->stage >= 2 && several && p->stages[st].local_expert == 0) {
			check_tiling(&pr, st, path);
			(*tiled)++;
		}
	}
	fx_free(&sc, &pr);
}

/* A pipelined stage's statements, on GPT-3 175B's 8 stages of 1F1B over m micro-batches: every
 * unit forward and backward of the stage's units comes once per micro-batch, with its
 * micro-batch stated; every send and receive names a pipeline buffer (its received input, sent
 * output, the received gradient, the input's gradient), whose allocation states the same
 * micro-batch as the computes around it; the first stage receives no activation and the last
 * sends none. */
static void check_pipelined(const Prediction *pr, int st)
{
	const Plan *p = &pr->plan;
	const Schedule *s = &pr->stages[st].sched;
	int n = p->n_units, m = (int)p->m, mb = -1, bad_mb = 0, bad_buf = 0;
	int *seen = calloc((size_t)(2 * n * m), sizeof(int));
	const Op **alloc_of = calloc((size_t)s->n_bufs, sizeof(*alloc_of));
	long long sends[2] = {0, 0}, recvs[2] = {0, 0};
	CU_ASSERT_PTR_NOT_NULL_FATAL(seen);
	CU_ASSERT_PTR_NOT_NULL_FATAL(alloc_of);
	for (int i = 0; i < s->n; i++) { /* from the set-up: the received gradient's buffer */
		const Op *op = &s->ops[i];
		if (op->kind == OP_ALLOC)
			alloc_of[op->buf] = op;
		if (op->kind == OP_COMPUTE && (op->sub == COMP_FWD || op->sub == COMP_BWD)) {
			CU_ASSERT_FATAL(op->mb >= 0 && op->mb < m && op->unit >= 0 && op->unit < n);
			seen[(op->sub == COMP_FWD) * n * m + op->mb * n + op->unit]++;
			mb = op->mb;
		}
		if (op->kind != OP_COLL || (op->sub != COLL_P2P && op->sub != COLL_P2P_RECV))
			continue;
		const Op *a = op->buf >= 0 ? alloc_of[op->buf] : NULL;
		int fwd = op->role == ROLE_FORWARD;
		bad_buf += !a || (a->what != BUF_PIPE_INPUT && a->what != BUF_PIPE_OUTPUT &&
				  a->what != BUF_PIPE_GRAD && a->what != BUF_PIPE_INPUT_GRAD);
		/* a receive's buffer states the micro-batch of the computes after it, a send's
		 * those before it (the received gradient's buffer is the set-up's) */
		if (a && a->what != BUF_PIPE_GRAD && op->sub == COLL_P2P)
			bad_mb += a->mb != mb;
		(op->sub == COLL_P2P ? sends : recvs)[fwd]++;
	}
	for (int u = 0; u < n; u++)
		for (int k = 0; k < m; k++)
			for (int f = 0; f < 2; f++)
				CU_ASSERT_EQUAL(seen[f * n * m + k * n + u], p->units[u].stage == st);
	CU_ASSERT_EQUAL(bad_buf, 0);
	CU_ASSERT_EQUAL(bad_mb, 0);
	int first = st == 0, last = st == p->par.pp - 1;
	CU_ASSERT_EQUAL(sends[1], last ? 0 : m);
	CU_ASSERT_EQUAL(recvs[1], first ? 0 : m);
	CU_ASSERT_EQUAL(sends[0], first ? 0 : m);
	CU_ASSERT_EQUAL(recvs[0], last ? 0 : m);
	free(seen);
	free(alloc_of);
}

static void test_pipelined_statements(void)
{
	Scenario sc;
	Prediction pr;
	PxError err = {0};
	if (scenario_load(&sc, px_test_path("scenarios/gpt3-175b-tp8-pp8-a100.json"), NULL, &err) ||
	    predict_memory(&sc, &pr, &err)) {
		fprintf(stderr, "\n%s\n", err.msg);
		CU_FAIL_FATAL("the pipelined scenario does not predict");
	}
	CU_ASSERT_EQUAL_FATAL(pr.n_stages, 8);
	for (int st = 0; st < pr.n_stages; st++)
		check_pipelined(&pr, st);
	fx_free(&sc, &pr);
}

static void test_bundled_statements(void)
{
	DIR *dp = opendir(px_test_path("scenarios"));
	int n = 0, tiled = 0;
	CU_ASSERT_PTR_NOT_NULL_FATAL(dp);
	for (struct dirent *e; (e = readdir(dp));) {
		size_t len = strlen(e->d_name);
		char rel[512];
		if (len < 6 || strcmp(e->d_name + len - 5, ".json") || !strcmp(e->d_name, "prices.json"))
			continue;
		snprintf(rel, sizeof(rel), "scenarios/%s", e->d_name);
		if (infer_scenario_is(px_test_path(rel), NULL) == 1)
			continue; /* serving, not a training step (the infer suite's) */
		check_scenario(px_test_path(rel), &tiled);
		n++;
	}
	closedir(dp);
	CU_ASSERT(n >= 20);
	CU_ASSERT(tiled >= 3); /* stage 2-3 scenarios with dense gradients over several ranks */
}

/* ---- selective recompute ---- */

/* GPT-2-like blocks, h = 256, 8 heads, 4 layers, 2 sequences of 512 per micro-batch, on t
 * tensor-parallel GPUs, with `ckpt` and `attention`. */
static int small_tp(Scenario *sc, Prediction *pr, int t, const char *ckpt, const char *attention)
{
	return fx_predictf(sc, pr,
			   "{\"model\": {\"model_type\": \"gpt2\", \"n_embd\": 256, \"n_head\": 8,"
			   " \"n_layer\": 4, \"n_positions\": 512, \"vocab_size\": 1024},"
			   " \"deepspeed\": {\"train_micro_batch_size_per_gpu\": 2,"
			   " \"gradient_accumulation_steps\": 2, \"bf16\": {\"enabled\": true}},"
			   " \"cluster\": {\"gpu\": \"A100-80GB\", \"nodes\": 1, \"gpus_per_node\": %d},"
			   " \"parallelism\": {\"tp\": %d}, \"seq_length\": 512,"
			   " \"activation_checkpointing\": \"%s\", \"attention\": \"%s\"}",
			   t, t, ckpt, attention);
}

/* Korthikanti et al. 2022, section 5: selective recompute keeps everything of a block but its
 * attention core's scores and recomputes QK^T, softmax, dropout and softmax x V before the
 * block's backward. On each of t ranks (a/t heads) that is 4 b s^2 h / t FLOPs (two products of
 * 2 b s^2 h over all heads) and 5 a s^2 b / t bytes of scores (softmax output and dropout output
 * in 16 bits, the dropout mask in 1 byte: Korthikanti's 5as^2b), here b = 2, s = 512, h = 256,
 * a = 8: 2^29 / t FLOPs, 20,971,520 / t bytes. In the schedule's micro-batch body each block 1..4
 * forward holds its scores only while its compute and its collectives run, with no allocation
 * after it (Megatron computes them under checkpoint and drops them); each block 4..1 backward has: the scores allocated (GPU, activations), the
 * recompute, the block's backward, the scores freed before the next compute; no collective
 * recomputes (Q, K and V are kept on the rank). No
 * such op without recompute, under full recompute (which recomputes the whole block, its forward
 * FLOPs) or with FlashAttention (no scores kept; its backward kernel recomputes them). */
static void check_selective(int t, const char *ckpt, const char *attention, int expect)
{
	Scenario sc;
	Prediction pr;
	if (small_tp(&sc, &pr, t, ckpt, attention))
		return;
	const Schedule *s = &pr.stages[0].sched;
	const double flops = 536870912.0 / t, bytes = 20971520.0 / t;
	int found = 0, forwards = 0, next_unit = 4, scores_buf = -1, freed = 1, pending_bwd = 0;
	for (int i = s->step_begin; i < s->n; i++) {
		const Op *op = &s->ops[i];
		if (op->kind == OP_ALLOC && op->what == BUF_SCORES) {
			CU_ASSERT(expect && freed);
			CU_ASSERT_EQUAL(op->place, PLACE_GPU);
			CU_ASSERT_EQUAL(op->cat, CAT_ACTIV);
			CU_ASSERT_EQUAL(op->bytes, bytes);
			const Op *next = i + 2 < s->n ? &s->ops[i + 1] : NULL;
			CU_ASSERT_FATAL(next && next->kind == OP_COMPUTE && next->unit == op->unit);
			if (next->sub == COMP_FWD) { /* the forward's, freed right after it and
							 its collectives */
				int j = i + 2;
				while (j < s->n && s->ops[j].kind == OP_COLL)
					j++;
				CU_ASSERT(j < s->n && s->ops[j].kind == OP_FREE &&
					  s->ops[j].buf == op->buf);
				forwards++;
				i = j;
				continue;
			}
			CU_ASSERT_EQUAL(next->sub, COMP_RECOMPUTE);
			scores_buf = op->buf, freed = 0;
		} else if (op->kind == OP_FREE && op->buf == scores_buf) {
			CU_ASSERT_FALSE(pending_bwd); /* after the block's backward */
			freed = 1;
		} else if (op->kind == OP_COMPUTE && op->sub == COMP_RECOMPUTE) {
			if (!strcmp(ckpt, "full")) {
				CU_ASSERT_EQUAL(op->flops, pr.plan.units[op->unit].fwd_flops);
				continue;
			}
			CU_ASSERT_EQUAL(op->unit, next_unit);
			CU_ASSERT_EQUAL(op->flops, flops);
			CU_ASSERT_EQUAL(op->bytes, bytes);
			CU_ASSERT_EQUAL(op->role, ROLE_RECOMPUTE);
			next_unit--, found++, pending_bwd = 1;
		} else if (op->kind == OP_COMPUTE) {
			CU_ASSERT(freed || pending_bwd); /* the scores live only through the backward */
			if (pending_bwd) {
				CU_ASSERT_EQUAL(op->sub, COMP_BWD);
				CU_ASSERT_EQUAL(op->unit, next_unit + 1);
			}
			pending_bwd = 0;
		} else if (op->kind == OP_COLL) {
			CU_ASSERT(op->role != ROLE_RECOMPUTE || !strcmp(ckpt, "full"));
		}
	}
	CU_ASSERT_EQUAL(found, expect ? 4 : 0); /* once in the repeated micro-batch body */
	CU_ASSERT_EQUAL(forwards, expect ? 4 : 0);
	CU_ASSERT(freed);
	fx_free(&sc, &pr);
}

static void test_selective_recompute_ops(void)
{
	check_selective(1, "selective", "eager", 1);
	check_selective(2, "selective", "eager", 1);
	check_selective(2, "none", "eager", 0);
	check_selective(2, "full", "eager", 0);
	check_selective(2, "selective", "flash", 0);
}

int test_schedule_register(void)
{
	return PX_ADD_SUITE("schedule", {"walk order and iterations", test_walk_order},
			    {"malformed schedules refused", test_walk_refusals},
			    {"bundled schedules state roles and slices", test_bundled_statements},
			    {"pipelined schedules state micro-batches and buffers",
			     test_pipelined_statements},
			    {"selective recompute: the attention core before each backward",
			     test_selective_recompute_ops});
}

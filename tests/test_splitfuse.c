/* DeepSpeed-FastGen's Dynamic SplitFuse ("scheduler": "split_fuse"): a ragged forward's FLOPs
 * and bytes against Llama-2 7B's dimensions (its config.json: h 4096, I 11008, 32 layers of 32
 * heads of 128, V 32000, 6,738,415,616 parameters), its weights read once for the decoding
 * tokens and the prompt chunks together; a trace replayed forward by forward as DeepSpeed-MII's
 * scheduler composes them (mii/batching/ragged_batching.py: next tokens first, then prompts in
 * chunks of what the budget leaves; a decoding sequence with a full last block and no free one
 * waits; when nothing can run, the last admitted gives its cache back and is prefilled again);
 * FastGen's claim of steadier token latency than prefill-first scheduling on the bundled trace;
 * and bad input. With them vLLM V1's scheduler ("scheduler": "vllm_v1"), which forms the same
 * ragged forwards by other rules (vllm/v1/core/sched/scheduler.py: the running requests in
 * admission order, a waiting prompt admitted with its first chunk's blocks, the last admitted
 * preempted when a running request's blocks run out): a replay by hand, its batch defaults by
 * GPU, and its steady state against its replay. */
#include <CUnit/CUnit.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../sim/infer_sim.h"
#include "suites.h"

static char out[1 << 16];

/* Llama-2 7B on one H100 in fp16 serving the trace tr.csv written beside the scenario, with
 * more workload keys. The scenario's path. */
static const char *write_trace_scenario(const char *csv, const char *workload)
{
	static char path[1024];
	char dir[512], file[1024], text[2048];
	snprintf(dir, sizeof(dir), "%s", px_test_tmpdir());
	snprintf(file, sizeof(file), "%s/tr.csv", dir);
	px_test_write_file(file, csv);
	snprintf(text, sizeof(text),
		 "{\"model\": \"%s\", \"cluster\": {\"gpu\": \"H100-SXM\", \"nodes\": 1, "
		 "\"gpus_per_node\": 1}, \"inference\": {\"dtype\": \"fp16\"},\n"
		 " \"workload\": {\"batching\": \"continuous\", %s\"trace\": \"tr.csv\"}}",
		 px_test_path("scenarios/models/llama-2-7b.json"), workload);
	snprintf(path, sizeof(path), "%s/sf.json", dir);
	px_test_write_file(path, text);
	return path;
}

/* Predict the scenario write_trace_scenario writes; 0, or -1 with the error shown unless quiet. */
static int predict_quiet(const char *csv, const char *workload, int quiet, InferScenario *sc,
			 InferPrediction *pr)
{
	PxError err = {0};
	const char *path = write_trace_scenario(csv, workload);
	if (infer_scenario_load(sc, path, NULL, &err)) {
		fprintf(stderr, "\n%s\n", err.msg);
		return -1;
	}
	if (infer_predict(sc, NULL, NULL, pr, &err)) {
		if (!quiet)
			fprintf(stderr, "\n%s\n", err.msg);
		infer_predict_free(pr);
		infer_scenario_free(sc);
		return -1;
	}
	return 0;
}

static int predict_on(const char *csv, const char *workload, InferScenario *sc,
		      InferPrediction *pr)
{
	return predict_quiet(csv, workload, 0, sc, pr);
}

/* One ragged forward's time on sc's ranks (the replay's: sc as continuous batching prices it,
 * pr->paged), the GPU's built-in profile. */
static double forward_s(const InferScenario *sc, const InferRagged *g)
{
	InferPlan p;
	InferPhase ph;
	HwProfile hw;
	PxError err = {0};
	CU_ASSERT_EQUAL_FATAL(hwprofile_default(&sc->cluster.gpu, &hw), 0);
	CU_ASSERT_EQUAL_FATAL(infer_plan_make(sc, 1, 0, &p, &err), 0);
	CU_ASSERT_EQUAL(infer_price_ragged(&p, &hw, g, &ph, &err), 0);
	infer_plan_free(&p);
	return ph.s;
}

/* Causal (query, key) pairs of a chunk of c tokens after prior cached ones. */
static double pairs(long long c, long long prior)
{
	return (double)c * (double)prior + (double)c * (double)(c + 1) / 2;
}

/* A forward of 3 decoding sequences at a mean context of 1000 tokens beside a 100-token chunk
 * after 200 cached (pairs 100 x 200 + 100 x 101 / 2 = 25,050), 4 logit rows: each of the 32
 * blocks computes 2 (4 h^2 + 3 h I) FLOPs a token over 103 tokens and 2 x 32 heads x (128 + 128)
 * per pair over 3 x 1000 + 25,050 pairs, the head 2 h V per row. Its bytes are the decode-only
 * and chunk-only forwards' less one read of the weights: every parameter but the embedding's
 * (a lookup reads its rows), (6,738,415,616 - 32,000 x 4,096) x 2 bytes. With no chunk it is
 * the schedule's decode step at batch 3; with one whole prompt, its prefill at batch 1. The
 * workspace beside the cache: FastGen's reserve, or a larger forward's. */
static void test_ragged_forward_by_hand(void)
{
	InferScenario sc;
	InferPrediction pr;
	const char *csv = "arrival_s,prompt_tokens,output_tokens\n0,1000,2\n1,10,1\n";
	if (predict_on(csv, "\"scheduler\": \"split_fuse\", ", &sc, &pr)) {
		CU_FAIL("predict");
		return;
	}
	const InferScenario *ps = &pr.paged;
	InferPlan p;
	HwProfile hw;
	PxError err = {0};
	CU_ASSERT_EQUAL_FATAL(hwprofile_default(&ps->cluster.gpu, &hw), 0);
	CU_ASSERT_EQUAL_FATAL(infer_plan_make(ps, 1, 0, &p, &err), 0);
	InferRagged both = {.decode_seqs = 3, .decode_ctx = 1000, .chunk_tokens = 100,
			    .chunk_pairs = pairs(100, 200), .chunk_prior = 200, .logit_rows = 4};
	InferRagged dec = {.decode_seqs = 3, .decode_ctx = 1000, .logit_rows = 3};
	InferRagged chunk = {.chunk_tokens = 100, .chunk_pairs = pairs(100, 200),
			     .chunk_prior = 200, .logit_rows = 1};
	InferPhase fb, fd, fc;
	CU_ASSERT_EQUAL_FATAL(infer_price_ragged(&p, &hw, &both, &fb, &err), 0);
	CU_ASSERT_EQUAL_FATAL(infer_price_ragged(&p, &hw, &dec, &fd, &err), 0);
	CU_ASSERT_EQUAL_FATAL(infer_price_ragged(&p, &hw, &chunk, &fc, &err), 0);
	double h = 4096, I = 11008, V = 32000;
	double flops = 32 * 103 * 2 * (4 * h * h + 3 * h * I) + 32 * (2 * 32 * 256.0) *
		       (3 * 1000 + 25050) + 4 * 2 * h * V;
	CU_ASSERT_DOUBLE_EQUAL(fb.flops / flops, 1, 1e-12);
	double weights = (6738415616.0 - 32000 * 4096.0) * 2;
	CU_ASSERT_DOUBLE_EQUAL((fd.bytes + fc.bytes - fb.bytes) / weights, 1, 1e-12);
	CU_ASSERT(fb.s < fd.s + fc.s); /* one read of the weights saved */

	/* the schedule's own decode step (workload prompt 999, output 2: mean context 1000) and
	 * prefill (prompt 1000) */
	InferScenario one = *ps;
	one.wl.prompt_tokens = 999, one.wl.output_tokens = 2;
	InferPhase pf, dstep;
	CU_ASSERT_EQUAL_FATAL(infer_price_batch(&one, &hw, 3, &pf, &dstep, &err), 0);
	CU_ASSERT_DOUBLE_EQUAL(fd.s / dstep.s, 1, 1e-12);
	CU_ASSERT_DOUBLE_EQUAL(fd.bytes / dstep.bytes, 1, 1e-12);
	one.wl.prompt_tokens = 1000;
	CU_ASSERT_EQUAL_FATAL(infer_price_batch(&one, &hw, 1, &pf, &dstep, &err), 0);
	InferRagged prompt = {.chunk_tokens = 1000, .chunk_pairs = pairs(1000, 0),
			      .logit_rows = 1};
	InferPhase fp;
	CU_ASSERT_EQUAL_FATAL(infer_price_ragged(&p, &hw, &prompt, &fp, &err), 0);
	CU_ASSERT_DOUBLE_EQUAL(fp.s / pf.s, 1, 1e-12);
	CU_ASSERT_DOUBLE_EQUAL(fp.flops / pf.flops, 1, 1e-12);
	infer_plan_free(&p);
	/* beside the KV cache FastGen leaves its reserve, 1e9 bytes (MemoryConfig's default),
	 * more than a forward of 768 tokens needs */
	CU_ASSERT_DOUBLE_EQUAL(pr.plan.prefill_workspace_bytes, 1e9, 0);
	CU_ASSERT_DOUBLE_EQUAL(pr.plan.decode_workspace_bytes, 1e9, 0);
	infer_predict_free(&pr);
	infer_scenario_free(&sc);
	/* a forward of 65,536 tokens needs more: the stream and its normed copy beside the MLP's
	 * three intermediates, 65,536 x 2 bytes x (2 x 4096 + 3 x 11008) */
	if (predict_on(csv, "\"scheduler\": \"split_fuse\", \"max_ragged_batch_size\": 65536, ",
		       &sc, &pr)) {
		CU_FAIL("predict");
		return;
	}
	CU_ASSERT_DOUBLE_EQUAL(pr.plan.prefill_workspace_bytes, 65536 * 2.0 * (2 * 4096 + 3 * 11008),
			       0);
	infer_predict_free(&pr);
	infer_scenario_free(&sc);
}

/* Two requests at 0 s, r0 (prompt 100, output 3) and r1 (prompt 40, output 2), forwards of at
 * most 64 tokens, blocks of 16. F1: r0's first 64 tokens. F2: r0's last 36 (after 64 cached: it
 * makes r0's first token) and r1's first 28. F3: r0 decodes at context 100 beside r1's last 12
 * (after 28: r1's first token). F4: both decode, at contexts 101 and 40 (mean 70.5); both end.
 * TTFT F1 + F2 and F1 + F2 + F3; latency F1 + ... + F4 for both; TPOT (F3 + F4) / 2 and F4. At
 * the end of F4 the cache holds 102 + 41 tokens in 7 + 3 blocks. r2 (100 s, prompt 10, output
 * 1; a trace needs two arrival times) runs alone: F5, its 10 tokens, its TTFT and latency. */
static void test_replay_by_hand(void)
{
	InferScenario sc;
	InferPrediction pr;
	const char *csv = "arrival_s,prompt_tokens,output_tokens\n0,100,3\n0,40,2\n100,10,1\n";
	if (predict_on(csv, "\"scheduler\": \"split_fuse\", \"max_ragged_batch_size\": 64, "
		       "\"max_ragged_sequence_count\": 4, \"block_size\": 16, ", &sc, &pr)) {
		CU_FAIL("predict");
		return;
	}
	const InferScenario *ps = &pr.paged;
	InferRagged g1 = {.chunk_tokens = 64, .chunk_pairs = pairs(64, 0)};
	InferRagged g2 = {.chunk_tokens = 64, .chunk_pairs = pairs(36, 64) + pairs(28, 0),
			  .chunk_prior = 64, .logit_rows = 1};
	InferRagged g3 = {.decode_seqs = 1, .decode_ctx = 100, .chunk_tokens = 12,
			  .chunk_pairs = pairs(12, 28), .chunk_prior = 28, .logit_rows = 2};
	InferRagged g4 = {.decode_seqs = 2, .decode_ctx = 70.5, .logit_rows = 2};
	double f1 = forward_s(ps, &g1), f2 = forward_s(ps, &g2), f3 = forward_s(ps, &g3);
	InferRagged g5 = {.chunk_tokens = 10, .chunk_pairs = pairs(10, 0), .logit_rows = 1};
	double f4 = forward_s(ps, &g4), f5 = forward_s(ps, &g5), e = 1e-12;
	const InferReplay *r = &pr.replay;
	CU_ASSERT_EQUAL(r->block, 16);
	CU_ASSERT_EQUAL(r->forwards, 5);
	CU_ASSERT_EQUAL(r->peak_concurrency, 2);
	CU_ASSERT_EQUAL(r->peak_kv_tokens, 143);
	CU_ASSERT_EQUAL(r->peak_kv_blocks, 10);
	CU_ASSERT_EQUAL(r->preemptions, 0);
	CU_ASSERT_EQUAL(r->waited_for_room, 0);
	CU_ASSERT_DOUBLE_EQUAL(r->ttft_mean_s, (2 * f1 + 2 * f2 + f3 + f5) / 3, e);
	CU_ASSERT_DOUBLE_EQUAL(r->ttft_p99_s, f1 + f2 + f3, e);
	CU_ASSERT_DOUBLE_EQUAL(r->latency_mean_s, (2 * (f1 + f2 + f3 + f4) + f5) / 3, e);
	CU_ASSERT_DOUBLE_EQUAL(r->tpot_mean_s, ((f3 + f4) / 2 + f4) / 2, e);
	CU_ASSERT_DOUBLE_EQUAL(r->makespan_s, 100 + f5, e);
	infer_predict_free(&pr);
	infer_scenario_free(&sc);
}

/* The k at which the trace "two requests at 0 s of k prompt tokens and 2 outputs, one at 1000 s
 * of 10 and 1" gets a KV cache of exactly n blocks of k tokens for its sequences, under scheduler
 * sched (its budget key's value budget_k x k + 16, its sequence key 4), by bisection: the cache
 * shrinks as the forward's workspace, which k sets, grows. vLLM V1's holds n + 1 (its BlockPool
 * keeps the first apart, the null block). Predicted into sc and pr; 0 when none found. */
static long long block_cache(const char *sched, long long budget_k, long long n,
			     InferScenario *sc, InferPrediction *pr)
{
	int v1 = !strcmp(sched, "vllm_v1");
	char csv[256], wl[256];
	n += v1;
	long long k = 0, lo = 10000, hi = 200000; /* more than n blocks at lo, fewer at hi */
	for (int tries = 0; tries < 40 && hi - lo > 1; tries++) {
		k = (lo + hi) / 2;
		snprintf(csv, sizeof(csv), "arrival_s,prompt_tokens,output_tokens\n0,%lld,2\n"
			 "0,%lld,2\n1000,10,1\n", k, k);
		snprintf(wl, sizeof(wl), "\"scheduler\": \"%s\", \"%s\": %lld, \"%s\": 4, "
			 "\"block_size\": %lld, ", sched, v1 ? "max_num_batched_tokens" :
			 "max_ragged_batch_size", budget_k * k + 16, v1 ? "max_num_seqs" :
			 "max_ragged_sequence_count", k);
		/* too few blocks for a prompt: refused, as it should be */
		long long blocks = predict_quiet(csv, wl, 1, sc, pr) ? 0 : pr->replay.kv_blocks;
		if (blocks == n)
			return k;
		if (blocks > n)
			lo = k;
		else
			hi = k;
		if (blocks > 0) {
			infer_predict_free(pr);
			infer_scenario_free(sc);
		}
	}
	return 0;
}

/* vLLM V1 on a cache of exactly n blocks of k tokens (block_cache's k for steps of budget_k x k
 * + 16 tokens, 4 sequences), its prefix cache on or off: the workload's keys into wl; k, or 0
 * (a failure noted). */
static long long v1_block_cache(long long budget_k, long long n, int cache, char wl[256])
{
	InferScenario sc;
	InferPrediction pr;
	long long k = block_cache("vllm_v1", budget_k, n, &sc, &pr);
	CU_ASSERT(k > 0);
	if (k <= 0)
		return 0;
	infer_predict_free(&pr);
	infer_scenario_free(&sc);
	snprintf(wl, 256, "\"scheduler\": \"vllm_v1\", \"enable_prefix_caching\": %s, "
		 "\"max_num_batched_tokens\": %lld, \"max_num_seqs\": 4, \"block_size\": %lld, ",
		 cache ? "true" : "false", budget_k * k + 16, k);
	return k;
}

/* What a replay by hand expects of it (times to 1e-9 s). */
typedef struct ReplayWant {
	long long preemptions, forwards, peak_kv_blocks;
	double ttft_mean_s, latency_mean_s, tpot_mean_s, makespan_s;
} ReplayWant;

static void assert_replay(const InferReplay *r, ReplayWant w)
{
	double e = 1e-9;
	CU_ASSERT_EQUAL(r->preemptions, w.preemptions);
	CU_ASSERT_EQUAL(r->forwards, w.forwards);
	CU_ASSERT_EQUAL(r->peak_kv_blocks, w.peak_kv_blocks);
	CU_ASSERT_DOUBLE_EQUAL(r->ttft_mean_s, w.ttft_mean_s, e);
	CU_ASSERT_DOUBLE_EQUAL(r->latency_mean_s, w.latency_mean_s, e);
	CU_ASSERT_DOUBLE_EQUAL(r->tpot_mean_s, w.tpot_mean_s, e);
	CU_ASSERT_DOUBLE_EQUAL(r->makespan_s, w.makespan_s, e);
}

/* A cache of two blocks of k tokens, forwards of 2 k + 16 (k found by bisection: the cache
 * shrinks as the forward's workspace, which k sets, grows). Two requests at 0 s, each a prompt of k tokens and
 * 2 outputs. F1 prefills both (each fills one block, their first tokens). Then both need a new
 * block and none is free: nothing can run, so r1, admitted last, gives its block back and waits
 * (a preemption). F2: r0 decodes at context k, taking the free block, and ends. F3: r1 comes
 * back whole, prompt and its token (k + 1 tokens, two blocks): that prefill makes its second
 * token. TTFT F1 both; latency F1 + F2 and F1 + F2 + F3; TPOT F2 and F2 + F3. r2 (1000 s,
 * prompt 10, output 1) runs alone: F4. */
static void test_replay_flush_by_hand(void)
{
	InferScenario sc;
	InferPrediction pr;
	long long k = block_cache("split_fuse", 2, 2, &sc, &pr);
	CU_ASSERT_FATAL(k > 0);
	const InferScenario *ps = &pr.paged;
	InferRagged g1 = {.chunk_tokens = 2 * k, .chunk_pairs = 2 * pairs(k, 0), .logit_rows = 2};
	InferRagged g2 = {.decode_seqs = 1, .decode_ctx = (double)k, .logit_rows = 1};
	InferRagged g3 = {.chunk_tokens = k + 1, .chunk_pairs = pairs(k + 1, 0), .logit_rows = 1};
	InferRagged g4 = {.chunk_tokens = 10, .chunk_pairs = pairs(10, 0), .logit_rows = 1};
	double f1 = forward_s(ps, &g1), f2 = forward_s(ps, &g2), f3 = forward_s(ps, &g3);
	double f4 = forward_s(ps, &g4);
	assert_replay(&pr.replay, (ReplayWant){1, 4, 2, (2 * f1 + f4) / 3,
					       (2 * f1 + 2 * f2 + f3 + f4) / 3, (2 * f2 + f3) / 2,
					       1000 + f4});
	infer_predict_free(&pr);
	infer_scenario_free(&sc);
}

/* vLLM V1 on a cache of exactly two blocks of k tokens (block_cache), a budget of k + 16.
 * Two requests at 0 s, prompts of k tokens and 2 outputs. F1: r0's prompt whole (its first
 * token) and r1's first 16 tokens (one block: V1 admits a prompt for its first chunk's blocks).
 * F2: r0's next token needs a block and none is free: r1, admitted last, is preempted (its 16
 * tokens dropped, it waits first in line) and r0 decodes at context k and ends. F3: r1's prompt
 * again, whole (k tokens, one block: its first token). F4: r1 decodes at context k, taking the
 * second block. r2 (1000 s, prompt 10, output 1) runs alone: F5. (FastGen's replay reaches the
 * same forwards here by its own rule: with no block free, nothing runs and the last admitted
 * gives its cache back.) */
static void test_v1_replay_by_hand(void)
{
	InferScenario sc;
	InferPrediction pr;
	long long k = block_cache("vllm_v1", 1, 2, &sc, &pr);
	CU_ASSERT_FATAL(k > 0);
	const InferScenario *ps = &pr.paged;
	InferRagged g1 = {.chunk_tokens = k + 16, .chunk_pairs = pairs(k, 0) + pairs(16, 0),
			  .logit_rows = 1};
	InferRagged g2 = {.decode_seqs = 1, .decode_ctx = (double)k, .logit_rows = 1};
	InferRagged g3 = {.chunk_tokens = k, .chunk_pairs = pairs(k, 0), .logit_rows = 1};
	InferRagged g5 = {.chunk_tokens = 10, .chunk_pairs = pairs(10, 0), .logit_rows = 1};
	double f1 = forward_s(ps, &g1), f2 = forward_s(ps, &g2), f3 = forward_s(ps, &g3);
	double f4 = f2, f5 = forward_s(ps, &g5);
	assert_replay(&pr.replay, (ReplayWant){1, 5, 2, (f1 + (f1 + f2 + f3) + f5) / 3,
					       ((f1 + f2) + (f1 + f2 + f3 + f4) + f5) / 3,
					       (f2 + f4) / 2, 1000 + f5});
	infer_predict_free(&pr);
	infer_scenario_free(&sc);
}

/* csv under vLLM V1's scheduler with its prefix cache on or off; 0, or -1 (a failure noted). */
static int predict_v1(const char *csv, int cache, InferScenario *sc, InferPrediction *pr)
{
	if (!predict_on(csv, cache ? "\"scheduler\": \"vllm_v1\", " :
			"\"scheduler\": \"vllm_v1\", \"enable_prefix_caching\": false, ", sc, pr))
		return 0;
	CU_FAIL("predict");
	return -1;
}

/* vLLM V1's prefix cache (enable_prefix_caching, its default), blocks of 16, one at a time:
 * r0 (0 s: prompt 50, its first 40 tokens prefix 1's, 2 outputs) finds nothing cached: F1 its
 * prompt whole, then F2 a decode at context 50; it caches prefix 1's 2 full blocks as they fill.
 * r1 (100 s, the same) finds them, freed but kept: F3 computes its last 18 tokens after 32
 * cached (pairs(18, 32)), then F4 = F2. r2 (200 s: prompt 32, all prefix 1's, 1 output)
 * finds one block only (at most 32 - 1 tokens: vLLM computes the last token whatever is
 * cached, KVCacheManager.get_computed_blocks) and computes 16 tokens after 16: F5. r3 (300 s:
 * prompt 50, prefix 2's 40) finds none: F1. TTFT F1, F3, F5, F1; latency adds F2 to r0's and
 * r1's; 48 of 182 prompt tokens found cached. Without the cache r1 and r2 compute their prompts
 * whole. */
static void test_prefix_cache_by_hand(void)
{
	static const char *csv = "arrival_s,prompt_tokens,output_tokens,prefix_id,prefix_tokens\n"
				 "0,50,2,1,40\n100,50,2,1,40\n200,32,1,1,32\n300,50,1,2,40\n";
	InferScenario sc;
	InferPrediction pr;
	for (int on = 1; on >= 0; on--) {
		if (predict_v1(csv, on, &sc, &pr))
			return;
		const InferScenario *ps = &pr.paged;
		InferRagged g1 = {.chunk_tokens = 50, .chunk_pairs = pairs(50, 0), .logit_rows = 1};
		InferRagged g2 = {.decode_seqs = 1, .decode_ctx = 50, .logit_rows = 1};
		InferRagged g3 = {.chunk_tokens = 18, .chunk_pairs = pairs(18, 32), .chunk_prior = 32,
				  .logit_rows = 1};
		InferRagged g5 = {.chunk_tokens = 16, .chunk_pairs = pairs(16, 16), .chunk_prior = 16,
				  .logit_rows = 1};
		InferRagged g6 = {.chunk_tokens = 32, .chunk_pairs = pairs(32, 0), .logit_rows = 1};
		double f1 = forward_s(ps, &g1), f2 = forward_s(ps, &g2);
		double f3 = on ? forward_s(ps, &g3) : f1, f5 = forward_s(ps, on ? &g5 : &g6);
		assert_replay(&pr.replay, (ReplayWant){0, 6, 4, (f1 + f3 + f5 + f1) / 4,
						       ((f1 + f2) + (f3 + f2) + f5 + f1) / 4, f2,
						       300 + f1});
		CU_ASSERT_EQUAL(pr.replay.prefix_hit_tokens, on ? 48 : 0);
		CU_ASSERT_EQUAL(pr.replay.prompt_tokens, 182);
		CU_ASSERT(!on || (f3 < f1 && f5 < f1)); /* the cached tokens are not computed */
		infer_predict_free(&pr);
		infer_scenario_free(&sc);
	}
}

/* Blocks shared while both run: r0 (0 s: prompt 48, all prefix 1's, 20 outputs) caches its 3
 * full blocks. r1 (the same prompt, 2 outputs) arrives halfway through r0's third decode and
 * joins the next step: it finds 2 blocks (47 tokens at most), computes its third block's 16
 * tokens into a block of its own, then decodes into a fourth. While both run, r0 holds 4 blocks
 * (51-52 tokens) and r1 2 of its own besides the 2 it shares: 6 taken, where without the cache
 * r1 takes 4 and 8 are. r0 alone never takes more than 5 (67 tokens). */
static void test_prefix_cache_shared_blocks(void)
{
	InferScenario sc;
	InferPrediction pr;
	if (predict_v1("arrival_s,prompt_tokens,output_tokens\n0,48,20\n1000,10,1\n", 1, &sc, &pr))
		return;
	InferRagged g1 = {.chunk_tokens = 48, .chunk_pairs = pairs(48, 0), .logit_rows = 1};
	InferRagged g2 = {.decode_seqs = 1, .decode_ctx = 48, .logit_rows = 1};
	double arrive = forward_s(&pr.paged, &g1) + 2.5 * forward_s(&pr.paged, &g2);
	infer_predict_free(&pr);
	infer_scenario_free(&sc);
	char csv[256];
	snprintf(csv, sizeof(csv), "arrival_s,prompt_tokens,output_tokens,prefix_id,prefix_tokens\n"
		 "0,48,20,1,48\n%.9f,48,2,1,48\n", arrive);
	for (int on = 1; on >= 0; on--) {
		if (predict_v1(csv, on, &sc, &pr))
			return;
		CU_ASSERT_EQUAL(pr.replay.peak_concurrency, 2);
		CU_ASSERT_EQUAL(pr.replay.peak_kv_blocks, on ? 6 : 8);
		CU_ASSERT_EQUAL(pr.replay.prefix_hit_tokens, on ? 32 : 0);
		infer_predict_free(&pr);
		infer_scenario_free(&sc);
	}
}

/* Eviction, on a cache of exactly two blocks of k tokens (block_cache: steps of k + 16
 * tokens, 4 sequences). r0 (0 s: prompt k + 1 whose first k are prefix 1's, 1 output) caches
 * prefix 1's block and leaves it free but kept. r2 (2000 s, the same request) finds it: k tokens
 * found. With r1 between them (1000 s: a prompt of 2 k of its own, 1 output), r1's second block
 * takes the kept one, the only other: r2 finds nothing. */
static void test_prefix_cache_eviction(void)
{
	InferScenario sc;
	InferPrediction pr;
	char csv[512], wl[256];
	long long k = v1_block_cache(1, 2, 1, wl);
	if (!k)
		return;
	for (int between = 0; between < 2; between++) {
		int at = snprintf(csv, sizeof(csv), "arrival_s,prompt_tokens,output_tokens,prefix_id,"
				  "prefix_tokens\n0,%lld,1,1,%lld\n", k + 1, k);
		if (between)
			at += snprintf(csv + at, sizeof(csv) - (size_t)at, "1000,%lld,1,0,0\n", 2 * k);
		snprintf(csv + at, sizeof(csv) - (size_t)at, "2000,%lld,1,1,%lld\n", k + 1, k);
		if (predict_on(csv, wl, &sc, &pr)) {
			CU_FAIL("predict");
			return;
		}
		CU_ASSERT_EQUAL(pr.replay.kv_blocks, 3); /* 2 and the null block */
		CU_ASSERT_EQUAL(pr.replay.prefix_hit_tokens, between ? 0 : k);
		CU_ASSERT_EQUAL(pr.replay.preemptions, 0);
		infer_predict_free(&pr);
		infer_scenario_free(&sc);
	}
}

/* csv replayed by vLLM V1 on a cache of exactly three blocks of k tokens (block_cache's k for
 * steps of 2 k + 16 tokens, 4 sequences), each request alone: the prompt tokens found cached,
 * or -1 (a failure noted). */
static long long three_block_hits(const char *csv, const char *wl)
{
	InferScenario sc;
	InferPrediction pr;
	if (predict_on(csv, wl, &sc, &pr)) {
		CU_FAIL("predict");
		return -1;
	}
	CU_ASSERT_EQUAL(pr.replay.kv_blocks, 4); /* 3 and the null block */
	CU_ASSERT_EQUAL(pr.replay.preemptions, 0);
	long long hits = pr.replay.prefix_hit_tokens;
	infer_predict_free(&pr);
	infer_scenario_free(&sc);
	return hits;
}

/* vLLM V1 takes the least recently freed block first (BlockPool's free queue: a freed block joins
 * its back, an allocation takes its front), whatever it holds, and frees a request's blocks
 * tail first (KVCacheManager.free); a cache of three blocks B0-B2 of k tokens, requests 1000 s
 * apart. (1) r0 (prompt k + 1, its first k prefix 2's) takes B0 (prefix 2's block) and B1 and
 * frees them tail first: the queue is B2 B1 B0. r1 (the same with prefix 1) takes B2 (prefix 1's)
 * and B1: B0 B1 B2. r2 (a prompt of k of its own) takes B0, evicting prefix 2's block though B1
 * holds nothing: B1 B2 B0. r3 (as r1) finds prefix 1's block in B2: k tokens. r4 (as r0) finds
 * nothing. Found: k (a cache evicting only when no empty block is left would find 2 k).
 * (2) r0 (prompt 2 k + 1, its first 2 k prefix 1's) takes B0 B1 B2 and frees them as B2 B1 B0.
 * r1 (a prompt of 2 k of its own) takes B2 and B1, evicting prefix 1's second block. r2 (as r0)
 * finds the first: k tokens, where freeing head first would have lost it.
 * (3) A block computed twice is kept twice (vLLM's cached_block_hash_to_block holds every block
 * of a hash; a lookup takes the first left). r0 (as in (1), prefix 1's) takes B0 (prefix 1's
 * block) and B1, frees them: B2 B1 B0. r1 (a prompt of k, all prefix 1's) may find none of it
 * (at most k - 1 tokens), computes it into B2, a second copy: B1 B0 B2. r2 (a prompt of 2 k of
 * its own) takes B1 and B0, evicting the first copy. r3 (as r0) finds the second in B2: k
 * tokens, where keeping one copy finds none. */
static void test_prefix_cache_eviction_order(void)
{
	char csv[512], wl[256];
	long long k = v1_block_cache(2, 3, 1, wl);
	if (!k)
		return;
	snprintf(csv, sizeof(csv), "arrival_s,prompt_tokens,output_tokens,prefix_id,prefix_tokens\n"
		 "0,%lld,1,2,%lld\n1000,%lld,1,1,%lld\n2000,%lld,1,0,0\n3000,%lld,1,1,%lld\n"
		 "4000,%lld,1,2,%lld\n", k + 1, k, k + 1, k, k, k + 1, k, k + 1, k);
	CU_ASSERT_EQUAL(three_block_hits(csv, wl), k);
	snprintf(csv, sizeof(csv), "arrival_s,prompt_tokens,output_tokens,prefix_id,prefix_tokens\n"
		 "0,%lld,1,1,%lld\n1000,%lld,1,0,0\n2000,%lld,1,1,%lld\n", 2 * k + 1, 2 * k,
		 2 * k, 2 * k + 1, 2 * k);
	CU_ASSERT_EQUAL(three_block_hits(csv, wl), k);
	snprintf(csv, sizeof(csv), "arrival_s,prompt_tokens,output_tokens,prefix_id,prefix_tokens\n"
		 "0,%lld,1,1,%lld\n1000,%lld,1,1,%lld\n2000,%lld,1,0,0\n3000,%lld,1,1,%lld\n",
		 k + 1, k, k, k, 2 * k, k + 1, k);
	CU_ASSERT_EQUAL(three_block_hits(csv, wl), k);
}

/* A preempted request finds its own blocks again (vLLM V1 names every full block by its
 * content, outputs included). A cache of three blocks of k tokens, steps of 2 k + 16: block_cache's
 * trace, r0 and r1 at 0 s (prompts of k, 2 outputs), r2 at 1000 s (10, 1). F1: both prompts
 * whole (a block each), their first tokens. F2: r0's next token takes the third block; r1's has
 * none, and r1, admitted last, is preempted, its full block freed but kept. r0 decodes at
 * context k and ends. Never more than two blocks are taken once a forward's tokens are in. F3: r1 again, k + 1 tokens: it finds its first block (at most k tokens)
 * and computes 1 token after k, its second and last. F4: r2 alone. Without the cache F3
 * computes all k + 1. TTFT F1, F1, F4; latency F1 + F2, F1 + F2 + F3, F4; TPOT F2 and F2 + F3. */
static void test_prefix_cache_preempted_own_blocks(void)
{
	for (int on = 1; on >= 0; on--) {
		InferScenario sc;
		InferPrediction pr;
		char csv[256], wl[256];
		long long k = v1_block_cache(2, 3, on, wl);
		if (!k)
			return;
		snprintf(csv, sizeof(csv), "arrival_s,prompt_tokens,output_tokens\n0,%lld,2\n"
			 "0,%lld,2\n1000,10,1\n", k, k);
		if (predict_on(csv, wl, &sc, &pr)) {
			CU_FAIL("predict");
			return;
		}
		const InferScenario *ps = &pr.paged;
		InferRagged g1 = {.chunk_tokens = 2 * k, .chunk_pairs = 2 * pairs(k, 0),
				  .logit_rows = 2};
		InferRagged g2 = {.decode_seqs = 1, .decode_ctx = (double)k, .logit_rows = 1};
		InferRagged g3 = {.chunk_tokens = 1, .chunk_pairs = pairs(1, k),
				  .chunk_prior = (double)k, .logit_rows = 1};
		InferRagged g3_off = {.chunk_tokens = k + 1, .chunk_pairs = pairs(k + 1, 0),
				      .logit_rows = 1};
		InferRagged g4 = {.chunk_tokens = 10, .chunk_pairs = pairs(10, 0), .logit_rows = 1};
		double f1 = forward_s(ps, &g1), f2 = forward_s(ps, &g2);
		double f3 = forward_s(ps, on ? &g3 : &g3_off), f4 = forward_s(ps, &g4);
		CU_ASSERT_EQUAL(pr.replay.kv_blocks, 4); /* 3 and the null block */
		assert_replay(&pr.replay, (ReplayWant){1, 4, 2, (2 * f1 + f4) / 3,
						       ((f1 + f2) + (f1 + f2 + f3) + f4) / 3,
						       (f2 + (f2 + f3)) / 2, 1000 + f4});
		CU_ASSERT_EQUAL(pr.replay.prefix_hit_tokens, on ? k : 0);
		CU_ASSERT(!on || f3 < forward_s(ps, &g3_off));
		infer_predict_free(&pr);
		infer_scenario_free(&sc);
	}
}

/* Two requests of one prefix scheduled in the same step share its blocks: vLLM V1 names a block
 * when the step that fills it is scheduled (allocate_slots), so the second finds the first's.
 * r0 and r1 at 0 s, prompts of 48 whose first 32 are prefix 1's, 1 output, blocks of 16. F1:
 * r0's 48 tokens (3 blocks) and r1's last 16 after 32 found (1 block of its own): 4 blocks, 64
 * distinct tokens in the cache, where without the cache F1 computes 96 in 6 blocks. r2 (1000 s,
 * prompt 10, 1 output) runs alone: F2. */
static void test_prefix_cache_same_step(void)
{
	static const char *csv = "arrival_s,prompt_tokens,output_tokens,prefix_id,prefix_tokens\n"
				 "0,48,1,1,32\n0,48,1,1,32\n1000,10,1,0,0\n";
	for (int on = 1; on >= 0; on--) {
		InferScenario sc;
		InferPrediction pr;
		if (predict_v1(csv, on, &sc, &pr))
			return;
		InferRagged g_on = {.chunk_tokens = 64, .chunk_pairs = pairs(48, 0) + pairs(16, 32),
				    .chunk_prior = 32, .logit_rows = 2};
		InferRagged g_off = {.chunk_tokens = 96, .chunk_pairs = 2 * pairs(48, 0),
				     .logit_rows = 2};
		InferRagged g2 = {.chunk_tokens = 10, .chunk_pairs = pairs(10, 0), .logit_rows = 1};
		double f1 = forward_s(&pr.paged, on ? &g_on : &g_off), f2 = forward_s(&pr.paged, &g2);
		assert_replay(&pr.replay, (ReplayWant){0, 2, on ? 4 : 6, (2 * f1 + f2) / 3,
						       (2 * f1 + f2) / 3, 0, 1000 + f2});
		CU_ASSERT_EQUAL(pr.replay.prefix_hit_tokens, on ? 32 : 0);
		CU_ASSERT_EQUAL(pr.replay.peak_kv_tokens, on ? 64 : 96);
		infer_predict_free(&pr);
		infer_scenario_free(&sc);
	}
}

/* A request rate's shared prefix under vLLM V1's prefix cache (workload.prefix_tokens 1024 of
 * prompts of 2048, 128 outputs; Llama-2 7B in fp16 on one H100): its 64 full blocks are held
 * once for all the sequences. Llama-2 7B's keys and values take 2 x 32 layers x 4096 x 2 bytes
 * = 524,288 bytes a token of a sequence (its config.json), so 10 sequences of 2176 tokens hold
 * 524,288 x (10 x 2176 - 9 x 1024) bytes. Memory's most concurrent sequences at the mean context
 * (2048 + 64) then grow by about 2112 / (2112 - 1024) = 1.94 times (the cache's room over the
 * unshared tokens, the prefix once; held to 1%: the decode workspace grows with the sequences
 * too, by 0.03% of the cache). */
static void test_prefix_cache_memory(void)
{
	long long most[2] = {0, 0};
	for (int shared = 0; shared < 2; shared++) {
		char text[1024], path[512];
		snprintf(path, sizeof(path), "%s/rate.json", px_test_tmpdir());
		snprintf(text, sizeof(text),
			 "{\"model\": \"%s\", \"cluster\": {\"gpu\": \"H100-SXM\", \"nodes\": 1, "
			 "\"gpus_per_node\": 1}, \"inference\": {\"dtype\": \"fp16\"}, \"workload\": "
			 "{\"batching\": \"continuous\", \"scheduler\": \"vllm_v1\", \"request_rate\": 1, "
			 "\"prompt_tokens\": 2048, \"output_tokens\": 128%s}}",
			 px_test_path("scenarios/models/llama-2-7b.json"),
			 shared ? ", \"prefix_tokens\": 1024" : "");
		px_test_write_file(path, text);
		InferScenario sc;
		InferPrediction pr;
		InferPlan p;
		PxError err = {0};
		CU_ASSERT_EQUAL_FATAL(infer_scenario_load(&sc, path, NULL, &err), 0);
		CU_ASSERT_EQUAL_FATAL(infer_plan_make(&sc, 10, 0, &p, &err), 0);
		CU_ASSERT_EQUAL(p.kv_bytes_per_token, 524288.0);
		CU_ASSERT_EQUAL(p.kv_bytes, 524288.0 * (10 * 2176 - (shared ? 9 * 1024 : 0)));
		infer_plan_free(&p);
		CU_ASSERT_EQUAL_FATAL(infer_predict(&sc, NULL, NULL, &pr, &err), 0);
		most[shared] = pr.cb.max_concurrency;
		infer_predict_free(&pr);
		infer_scenario_free(&sc);
	}
	double ratio = (double)most[1] / (double)most[0];
	printf("\n# most concurrent sequences %lld, sharing 1024 tokens %lld (x %.4f)", most[0],
	       most[1], ratio);
	CU_ASSERT_DOUBLE_EQUAL(ratio, 2112.0 / 1088.0, 0.01 * 2112.0 / 1088.0);
}

/* A trace's prefixes in the memory table: b sequences drawn from the trace's mix hold prefix id
 * g's found tokens H_g once among the n_g ~ Binomial(b, f_g) that have it, saving
 * H_g (b f_g - 1 + (1 - f_g)^b) tokens on average. Prompts of 2048 whose first 1024 are a prefix
 * (all found: 64 full blocks, short of the last token), 128 outputs, Llama-2 7B in fp16 (524,288
 * bytes a token): with one id, 10 sequences hold 524,288 x (10 x 2176 - 9 x 1024) bytes, as the
 * request rate's prefix_tokens; with two ids, half the requests each, 2 x 1024 x (5 - 1 +
 * 2^-10) = 8194 tokens are saved; with none, nothing. */
static void test_prefix_cache_trace_memory(void)
{
	static const double saved[3] = {0, 9 * 1024, 8194};
	for (int ids = 0; ids <= 2; ids++) {
		char csv[4096];
		int at = snprintf(csv, sizeof(csv), "arrival_s,prompt_tokens,output_tokens,prefix_id,"
				  "prefix_tokens\n");
		for (int q = 0; q < 40; q++)
			at += snprintf(csv + at, sizeof(csv) - (size_t)at, "%d,2048,128,%d,%d\n", q,
				       ids ? 1 + q % ids : 0, ids ? 1024 : 0);
		InferScenario sc;
		InferPlan p;
		PxError err = {0};
		const char *path = write_trace_scenario(csv, "\"scheduler\": \"vllm_v1\", ");
		CU_ASSERT_EQUAL_FATAL(infer_scenario_load(&sc, path, NULL, &err), 0);
		CU_ASSERT_EQUAL_FATAL(infer_plan_make(&sc, 10, 0, &p, &err), 0);
		CU_ASSERT_DOUBLE_EQUAL(p.kv_bytes, 524288.0 * (10 * 2176 - saved[ids]), 1e-3);
		infer_plan_free(&p);
		infer_scenario_free(&sc);
	}
}

/* vLLM V1's batch defaults for its OpenAI server (EngineArgs.get_batch_defaults): 8192 tokens a
 * step and 1024 sequences on a GPU of 70 GiB or more that is not an A100, else 2048 and 256; no
 * watermark; blocks of 16. */
static void test_v1_defaults(void)
{
	static const struct { const char *gpu; long long tokens, seqs; } cases[] = {
		{"H100-SXM", 8192, 1024}, {"H200", 8192, 1024}, {"A100-80GB", 2048, 256},
		{"A100-40GB", 2048, 256}, {"V100-32GB", 2048, 256}};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		const char *path = write_trace_scenario("arrival_s,prompt_tokens,output_tokens\n"
							"0,100,3\n1,10,1\n",
							"\"scheduler\": \"vllm_v1\", ");
		InferScenario sc;
		PxError err = {0};
		JsonOverrides ov;
		jov_init(&ov);
		CU_ASSERT_EQUAL_FATAL(jov_add_kv(&ov, "cluster.gpu", cases[i].gpu, &err), 0);
		if (infer_scenario_load(&sc, path, &ov, &err)) {
			fprintf(stderr, "\n%s\n", err.msg);
			CU_FAIL("load");
			jov_free(&ov);
			continue;
		}
		CU_ASSERT_EQUAL(sc.wl.scheduler, SCHED_VLLM_V1);
		CU_ASSERT_EQUAL(sc.wl.token_budget, cases[i].tokens);
		CU_ASSERT_EQUAL(sc.wl.max_ragged_seqs, cases[i].seqs);
		CU_ASSERT_EQUAL(sc.wl.block, 16);
		CU_ASSERT_EQUAL(sc.wl.watermark, 0);
		infer_scenario_free(&sc);
		jov_free(&ov);
	}
}

/* The steady state's formulas (sim/infer_sim.c price_fused) against the replay of what they
 * assume: 4000 requests of fixed lengths arriving as a Poisson process (exponential gaps from a
 * fixed linear congruential sequence), Llama-2 7B on one H100, FastGen's defaults: prompts of
 * 512 tokens (one forward each) and 128 outputs at 3 a second, and prompts of 2048 (three
 * chunks) and 64 outputs at 1.5 a second; vLLM V1's scheduler on the first, and on prompts of
 * 1536 whose first 1024 every request shares, which its prefix cache finds for all but the
 * first (the steady state computes the other 512 after 1024 cached). Targets, as for vLLM's
 * scheduler (suite serve): mean TPOT and latency within 5%, TTFT within 10%. */
static void test_steady_state_against_replay(void)
{
	enum { N = 4000 };
	static const struct { int prompt, output; double rate; const char *sched; int prefix; }
	cases[] = {{512, 128, 3, "split_fuse", 0}, {2048, 64, 1.5, "split_fuse", 0},
		   {512, 128, 3, "vllm_v1", 0}, {1536, 128, 3, "vllm_v1", 1024}};
	static char csv[N * 48 + 128];
	for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
		size_t at = (size_t)snprintf(csv, sizeof(csv), "arrival_s,prompt_tokens,output_tokens%s\n",
					     cases[k].prefix ? ",prefix_id,prefix_tokens" : "");
		unsigned long long x = 2024;
		double t = 0;
		for (int i = 0; i < N; i++) {
			x = x * 6364136223846793005ULL + 1442695040888963407ULL;
			double u = ((double)(x >> 11) + 0.5) / 9007199254740992.0;
			t += -log(u) / cases[k].rate;
			at += (size_t)snprintf(csv + at, sizeof(csv) - at, "%.6f,%d,%d", t,
					       cases[k].prompt, cases[k].output);
			at += (size_t)snprintf(csv + at, sizeof(csv) - at, cases[k].prefix ?
					       ",1,%d\n" : "\n", cases[k].prefix);
		}
		InferScenario sc;
		InferPrediction pr;
		char wl[64];
		snprintf(wl, sizeof(wl), "\"scheduler\": \"%s\", ", cases[k].sched);
		if (predict_on(csv, wl, &sc, &pr)) {
			CU_FAIL("predict");
			return;
		}
		CU_ASSERT_FATAL(pr.cb.stable && pr.replayed);
		const InferReplay *r = &pr.replay;
		printf("\n# %s, %d requests of %d + %d tokens (%d shared) at %g/s: TPOT %.5f s "
		       "(steady state %.5f), latency %.4f s (%.4f), TTFT %.5f s (%.5f)\n",
		       cases[k].sched, N, cases[k].prompt, cases[k].output, cases[k].prefix,
		       cases[k].rate, r->tpot_mean_s, pr.tpot_s, r->latency_mean_s, pr.latency_s,
		       r->ttft_mean_s, pr.ttft_s);
		/* the cache found a shared prefix's blocks for every request but the first */
		CU_ASSERT_EQUAL(r->prefix_hit_tokens, (long long)(N - 1) * cases[k].prefix);
		CU_ASSERT_DOUBLE_EQUAL(r->tpot_mean_s, pr.tpot_s, 0.05 * pr.tpot_s);
		CU_ASSERT_DOUBLE_EQUAL(r->latency_mean_s, pr.latency_s, 0.05 * pr.latency_s);
		CU_ASSERT_DOUBLE_EQUAL(r->ttft_mean_s, pr.ttft_s, 0.10 * pr.ttft_s);
		infer_predict_free(&pr);
		infer_scenario_free(&sc);
	}
}

/* FastGen's blog (DeepSpeed-FastGen, 2023: "consistent" per-token latency, no decode stalled
 * behind a long prompt's prefill) on the bundled trace scenario: Dynamic SplitFuse's p99 time
 * per output token below vLLM's prefill-first scheduler's, every request served by both. */
static void test_tail_token_latency(void)
{
	const char *scen = px_test_path("scenarios/llama2-70b-infer-trace-tp4-h100.json");
	double p99[2];
	for (int fused = 0; fused < 2; fused++) {
		int rc = px_test_run_clif(out, sizeof(out), "predict '%s' --no-db --json%s", scen,
					  fused ? " --set workload.scheduler='\"split_fuse\"'" : "");
		CU_ASSERT_EQUAL_FATAL(rc, 0);
		const char *at = strstr(out, "\"infer.trace.tpot_p99_s\":");
		CU_ASSERT_PTR_NOT_NULL_FATAL(at);
		p99[fused] = atof(at + strlen("\"infer.trace.tpot_p99_s\":"));
		PX_ASSERT_HAS(out, "\"infer.trace.requests\"");
	}
	CU_ASSERT(p99[0] > 0 && p99[1] > 0);
	CU_ASSERT(p99[1] < p99[0]);
}

/* Each key where it does not belong, or out of range: exit 2 naming the file and the key. */
static void test_bad_input(void)
{
	static const struct { const char *workload, *needle; } cases[] = {
		{"\"scheduler\": \"fastgen\", ",
		 "workload.scheduler: expected one of vllm, split_fuse, vllm_v1, got \"fastgen\""},
		{"\"scheduler\": \"split_fuse\", \"max_num_batched_tokens\": 512, ",
		 "workload.max_num_batched_tokens: applies to \"scheduler\": \"vllm_v1\" only"},
		{"\"scheduler\": \"vllm_v1\", \"max_ragged_sequence_count\": 8, ",
		 "workload.max_ragged_sequence_count: applies to \"scheduler\": \"split_fuse\" only"},
		{"\"scheduler\": \"vllm_v1\", \"max_num_seqs\": 0, ", "workload.max_num_seqs"},
		{"\"scheduler\": \"vllm\", \"max_ragged_batch_size\": 512, ",
		 "workload.max_ragged_batch_size: applies to \"scheduler\": \"split_fuse\" only"},
		{"\"scheduler\": \"split_fuse\", \"max_ragged_batch_size\": 256, ",
		 "workload.max_ragged_sequence_count: larger than max_ragged_batch_size"},
		{"\"scheduler\": \"split_fuse\", \"enable_prefix_caching\": true, ",
		 "workload.enable_prefix_caching: applies to \"scheduler\": \"vllm_v1\" only"},
		{"\"enable_prefix_caching\": true, ",
		 "workload.enable_prefix_caching: applies to \"scheduler\": \"vllm_v1\" only"},
		{"\"scheduler\": \"vllm_v1\", \"prefix_tokens\": 10, ",
		 "workload.prefix_tokens: given beside trace"},
	};
	const char *csv = "arrival_s,prompt_tokens,output_tokens\n0,100,3\n";
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		const char *path = write_trace_scenario(csv, cases[i].workload);
		CU_ASSERT_EQUAL(px_test_run_clif(out, sizeof(out), "predict '%s' --no-db", path), 2);
		PX_ASSERT_HAS(out, path);
		PX_ASSERT_HAS(out, cases[i].needle);
	}
	/* on a static batch */
	const char *rate = px_test_path("scenarios/llama2-70b-infer-tp4-h100.json");
	CU_ASSERT_EQUAL(px_test_run_clif(out, sizeof(out), "predict '%s' --no-db --set "
					 "workload.scheduler='\"split_fuse\"'", rate), 2);
	PX_ASSERT_HAS(out, "workload.scheduler: applies to \"batching\": \"continuous\" only");
	/* a request rate's shared prefix: with vLLM V1's cache only, and within the prompt */
	static const char *const rated = "--set workload.batching=continuous --set "
					 "workload.request_rate=2 --set workload.batch_size=null";
	CU_ASSERT_EQUAL(px_test_run_clif(out, sizeof(out), "predict '%s' --no-db %s --set "
					 "workload.prefix_tokens=1024", rate, rated), 2);
	PX_ASSERT_HAS(out, "workload.prefix_tokens: applies with vLLM V1's prefix cache only");
	CU_ASSERT_EQUAL(px_test_run_clif(out, sizeof(out), "predict '%s' --no-db %s --set "
					 "workload.scheduler=vllm_v1 --set "
					 "workload.enable_prefix_caching=false --set "
					 "workload.prefix_tokens=1024", rate, rated), 2);
	PX_ASSERT_HAS(out, "workload.prefix_tokens: applies with vLLM V1's prefix cache only");
	CU_ASSERT_EQUAL(px_test_run_clif(out, sizeof(out), "predict '%s' --no-db %s --set "
					 "workload.scheduler=vllm_v1 --set workload.prefix_tokens=99999",
					 rate, rated), 2);
	PX_ASSERT_HAS(out, "workload.prefix_tokens");

	/* a trace the cache cannot serve, refused naming the trace and the request: a prompt
	 * longer than the empty cache, and one that fits it to within 10 tokens but whose 100
	 * outputs would outgrow it alone (the cache's size read from a replay that fits: with
	 * FastGen's reserve it does not depend on the trace) */
	InferScenario sc;
	InferPrediction pr;
	if (predict_on("arrival_s,prompt_tokens,output_tokens\n0,100,3\n1,10,1\n",
		       "\"scheduler\": \"split_fuse\", ", &sc, &pr)) {
		CU_FAIL("predict");
		return;
	}
	long long room = pr.replay.kv_blocks * pr.replay.block;
	infer_predict_free(&pr);
	infer_scenario_free(&sc);
	char big[256], says[256];
	const char *wl = "\"scheduler\": \"split_fuse\", ";
	for (int alone = 0; alone < 2; alone++) {
		long long prompt = alone ? room - 10 : room + 1;
		snprintf(big, sizeof(big), "arrival_s,prompt_tokens,output_tokens\n0,%lld,100\n"
			 "1000,10,1\n", prompt);
		const char *path = write_trace_scenario(big, wl);
		CU_ASSERT_EQUAL(px_test_run_clif(out, sizeof(out), "predict '%s' --no-db", path), 2);
		PX_ASSERT_HAS(out, "tr.csv: request 1 (prompt ");
		if (alone)
			snprintf(says, sizeof(says), "(prompt %lld, output 100 tokens): longer than the "
				 "KV cache's %lld tokens", prompt, room);
		else
			snprintf(says, sizeof(says), "(prompt %lld tokens): longer than the KV cache's "
				 "%lld tokens", prompt, room);
		PX_ASSERT_HAS(out, says);
	}
}

int test_splitfuse_register(void)
{
	return PX_ADD_SUITE("splitfuse",
			    {"a ragged forward: FLOPs and bytes by hand, the weights read once",
			     test_ragged_forward_by_hand},
			    {"a trace replayed: four forwards by hand", test_replay_by_hand},
			    {"a trace replayed: a stall and a flush by hand",
			     test_replay_flush_by_hand},
			    {"the steady state against a Poisson trace's replay",
			     test_steady_state_against_replay},
			    {"FastGen's steadier token latency on the bundled trace",
			     test_tail_token_latency},
			    {"vLLM V1: a chunk's admission and a preemption by hand",
			     test_v1_replay_by_hand},
			    {"vLLM V1: its batch defaults by GPU", test_v1_defaults},
			    {"vLLM V1's prefix cache: four requests by hand",
			     test_prefix_cache_by_hand},
			    {"vLLM V1's prefix cache: blocks shared while both run",
			     test_prefix_cache_shared_blocks},
			    {"vLLM V1's prefix cache: a kept block evicted when needed",
			     test_prefix_cache_eviction},
			    {"vLLM V1's prefix cache: least recently freed first, tail first, a "
			     "block computed twice kept twice", test_prefix_cache_eviction_order},
			    {"vLLM V1's prefix cache: a preempted request finds its own blocks",
			     test_prefix_cache_preempted_own_blocks},
			    {"vLLM V1's prefix cache: shared within the step that computes it",
			     test_prefix_cache_same_step},
			    {"vLLM V1's prefix cache: a request rate's prefix held once",
			     test_prefix_cache_memory},
			    {"vLLM V1's prefix cache: a trace's prefixes held once per id",
			     test_prefix_cache_trace_memory},
			    {"bad input", test_bad_input});
}

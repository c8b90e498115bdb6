/* The inference executor (exec/infer_runner.c, kernels/infer_cpu.c) through `parallax run`: the
 * KV-cached attention against gpt_cpu's full causal attention, the int8 group quantizer's bound,
 * the KV-cached greedy decode against a plain uncached forward of gpt_cpu's units recomputing
 * the whole sequence each step, tensor parallelism over 2 and 4 ranks against one, bf16 and int8
 * weights' agreement, each rank's measured memory and communication against the prediction (the
 * collective bytes also worked out by hand), a wrong prediction failing the comparison, and what
 * it refuses (exit 2, named). Runs the release binary (PX_RUN_BIN), as the exec suites do. */
#include <CUnit/CUnit.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/gpt_cpu.h"
#include "../kernels/infer_cpu.h"
#include "../kernels/ops_cpu.h"
#include "../kernels/rng.h"
#include "run_checks.h"
#include "suites.h"

/* scenarios/gpt2-mini-infer-cpu.json: V 256, 4 blocks of C 128, 4 heads, 128 positions; 4
 * sequences of 16 prompt tokens, 16 generated; fp32, tp 1, no kernel injection */
enum { V = 256, C = 128, L = 4, NH = 4, MAX_T = 128, B = 4, SP = 16, SO = 16, SEED = 1234 };

static const char *scn(void)
{
	static char q[1100];
	snprintf(q, sizeof(q), "'%s'", px_test_path("scenarios/gpt2-mini-infer-cpu.json"));
	return q;
}

/* ---- kernels ---- */

static void fill(float *x, size_t n, uint64_t seed)
{
	PxRng g;
	rng_init(&g, seed, 7);
	for (size_t i = 0; i < n; i++)
		x[i] = (float)rng_normal(&g);
}

/* Attention over a KV cache against ops_attention_forward's full causal attention on the same
 * q, k, v (B 2, T 12, C 32 in 4 heads): a prefill of the first 5 tokens, then one token at a
 * time, into a cache of two segments (5 and 7 tokens, as Hugging Face's grows) and into one (as
 * DeepSpeed's kernels reserve). The same products in the same order, but softmax's scaling is
 * applied to the scores before the maximum here: within 1e-6 (the values are O(1)). */
static void test_attention_cached(void)
{
	enum { b = 2, T = 12, c = 32, nh = 4, hs = c / nh, P = 5 };
	static float qkv[b * T * 3 * c], ref[b * T * c], att[b * nh * T * T], got[b * T * c];
	static float seg0[2 * b * nh * T * hs], seg1[2 * b * nh * T * hs], scores[b * nh * T];
	fill(qkv, sizeof(qkv) / 4, 3);
	ops_attention_forward(ref, att, qkv, b, T, c, nh);
	for (int split = 0; split < 2; split++) {
		InferKv kv = {{seg0, seg1}, {split ? P : T, split ? T - P : 0}, b, nh, hs, PREC_F32};
		static float qrow[b * 3 * c], orow[b * c];
		memset(got, 0, sizeof(got));
		/* prefill: the first P tokens of each sequence, contiguous per sequence */
		static float pq[b * P * 3 * c], po[b * P * c];
		for (int s = 0; s < b; s++)
			memcpy(pq + (size_t)s * P * 3 * c, qkv + (size_t)s * T * 3 * c, sizeof(float) * P * 3 * c);
		infer_cpu_attention(po, pq, &kv, PREC_F32, b, P, 0, scores, 0);
		for (int s = 0; s < b; s++)
			memcpy(got + (size_t)s * T * c, po + (size_t)s * P * c, sizeof(float) * P * c);
		for (int t = P; t < T; t++) { /* decode: one token of each sequence */
			for (int s = 0; s < b; s++)
				memcpy(qrow + (size_t)s * 3 * c, qkv + ((size_t)s * T + t) * 3 * c,
				       sizeof(float) * 3 * c);
			infer_cpu_attention(orow, qrow, &kv, PREC_F32, b, 1, t, scores, T);
			for (int s = 0; s < b; s++)
				memcpy(got + ((size_t)s * T + t) * c, orow + (size_t)s * c, sizeof(float) * c);
		}
		double worst = 0;
		for (size_t i = 0; i < sizeof(ref) / 4; i++)
			worst = fmax(worst, fabs(got[i] - ref[i]));
		if (worst > 1e-6)
			fprintf(stderr, "\nattention over the cache (%d segments): %g from the full\n",
				split + 1, worst);
		CU_ASSERT(worst <= 1e-6);
	}
}

/* The group quantizer: one group worked by hand, [0.5, -1.27, 0.01, 1.0]: max |w| 1.27, scale
 * 0.01, q = round(w / 0.01) = [50, -127, 1, 100]; then GPT-2's initial weights of a block (the
 * executor's, 8 groups per matrix), each dequantized value within its group's max |w| / 127 / 2
 * of the fp32 one (round to nearest: half a step), the largest of each group exact to fp32's
 * rounding. */
static void test_quantize_bound(void)
{
	const float w[4] = {0.5f, -1.27f, 0.01f, 1.0f};
	int8_t q[4];
	float s;
	infer_cpu_quantize(w, PREC_F32, 4, 4, q, &s);
	CU_ASSERT(fabsf(s - 0.01f) < 1e-8f);
	CU_ASSERT(q[0] == 50 && q[1] == -127 && q[2] == 1 && q[3] == 100);

	GptConfig cfg = {V, MAX_T, C, L, NH};
	GptBlockLayout lay = gpt_cpu_block_layout(&cfg);
	size_t n = gpt_cpu_unit_params(&cfg, 1);
	float *p = malloc(n * 4), *back = malloc(n * 4), *scales = malloc(64 * 4);
	int8_t *qq = malloc(n);
	CU_ASSERT_FATAL(p && back && scales && qq);
	gpt_cpu_init_unit(&cfg, 1, p, SEED);
	const size_t off[4] = {lay.qkv_w, lay.proj_w, lay.fc_w, lay.down_w};
	const size_t len[4] = {(size_t)C * 3 * C, (size_t)C * C, (size_t)C * 4 * C, (size_t)4 * C * C};
	int bad = 0, groups = 8;
	for (int m = 0; m < 4; m++) {
		size_t g = len[m] / (size_t)groups;
		infer_cpu_quantize(p + off[m], PREC_F32, len[m], g, qq, scales);
		infer_cpu_dequantize(qq, scales, len[m], g, back);
		for (int k = 0; k < groups; k++) {
			float amax = 0;
			for (size_t i = 0; i < g; i++)
				amax = fmaxf(amax, fabsf(p[off[m] + k * g + i]));
			for (size_t i = 0; i < g; i++) {
				float e = fabsf(back[k * g + i] - p[off[m] + k * g + i]);
				bad += e > amax / 127.0f / 2.0f * (1 + 1e-6f);
			}
		}
	}
	CU_ASSERT_EQUAL(bad, 0);
	free(p);
	free(back);
	free(scales);
	free(qq);
}

/* ---- runs ---- */

/* The logits a run prints: prefill's last position's and the last decode step's, (B, V) each */
static float run_logits[2][B * V];

/* `parallax run SCN --no-db --json EXTRA` on ranks: its prompt and tokens (B x SP, B x SO), its
 * logits into run_logits */
static void run_tokens(int ranks, const char *extra, int *prompt, int *tokens)
{
	char args[2048];
	snprintf(args, sizeof(args), "run %s --no-db --json --ranks %d %s", scn(), ranks, extra);
	cJSON *j = px_run_json(args);
	const cJSON *pr = cJSON_GetObjectItem(j, "prompt"), *tk = cJSON_GetObjectItem(j, "tokens");
	CU_ASSERT_FATAL(cJSON_GetArraySize(pr) == B && cJSON_GetArraySize(tk) == B);
	for (int b = 0; b < B; b++) {
		const cJSON *p = cJSON_GetArrayItem(pr, b), *t = cJSON_GetArrayItem(tk, b);
		CU_ASSERT_FATAL(cJSON_GetArraySize(p) == SP && cJSON_GetArraySize(t) == SO);
		for (int i = 0; prompt && i < SP; i++)
			prompt[b * SP + i] = cJSON_GetArrayItem(p, i)->valueint;
		for (int i = 0; i < SO; i++)
			tokens[b * SO + i] = cJSON_GetArrayItem(t, i)->valueint;
	}
	static const char *const lname[2] = {"logits_prefill", "logits_last"};
	for (int k = 0; k < 2; k++) {
		const cJSON *l = cJSON_GetObjectItem(j, lname[k]);
		CU_ASSERT_FATAL(cJSON_GetArraySize(l) == B * V);
		int i = 0;
		for (const cJSON *e = l->child; e; e = e->next)
			run_logits[k][i++] = (float)e->valuedouble;
	}
	cJSON_Delete(j);
}

/* The run's fp32 probabilities against the uncached forward's: the same products summed in
 * other orders (gpt_cpu's BLAS matmuls against plain loops, softmax's scale applied before its
 * maximum), a few 2^-24 relative in each logit (measured: 5.7e-7 at most). */
#define PROB_BOUND 1e-5

static int count_same(const int *a, const int *b, int n)
{
	int k = 0;
	for (int i = 0; i < n; i++)
		k += a[i] == b[i];
	return k;
}

/* The greedy tokens of a plain forward: every step gpt_cpu's units recompute the whole sequence
 * so far (prompt and the tokens chosen so far, no cache), from the same seed's weights, and take
 * the argmax of the last position's probabilities (softmax keeps the logits' order). */
static void reference_tokens(const int *prompt, int *out, float probs_at[2][B * V])
{
	GptConfig cfg = {V, MAX_T, C, L, NH};
	float *params = malloc(gpt_cpu_n_params(&cfg) * 4);
	int *seq = malloc((size_t)B * (SP + SO) * sizeof(int));
	CU_ASSERT_FATAL(params && seq);
	gpt_cpu_init(&cfg, params, SEED);
	for (int k = 0; k < SO; k++) {
		int T = SP + k;
		GptCpuBuffers bu;
		PxError err;
		for (int b = 0; b < B; b++)
			for (int i = 0; i < T; i++)
				seq[b * T + i] = i < SP ? prompt[b * SP + i] : out[b * SO + i - SP];
		CU_ASSERT_EQUAL_FATAL(gpt_cpu_buffers_init(&bu, &cfg, B, T, &err), 0);
		gpt_cpu_forward(&bu, params, seq, NULL);
		const float *probs = gpt_cpu_head_probs(&cfg, B, T, bu.head_acts);
		for (int b = 0; b < B; b++) {
			const float *last = probs + ((size_t)b * T + T - 1) * V;
			if (k == 0 || k == SO - 1)
				memcpy(probs_at[k > 0] + (size_t)b * V, last, V * sizeof(float));
			int best = 0;
			for (int v = 1; v < V; v++)
				if (last[v] > last[best])
					best = v;
			out[b * SO + k] = best;
		}
		gpt_cpu_buffers_free(&bu);
	}
	free(seq);
	free(params);
}

/* fp32, one rank: the KV-cached decode generates exactly the uncached forward's tokens, all
 * 4 x 16 (the randomly initialised model mostly repeats a sequence's last token, as a tied
 * embedding makes it; sequence 0 turns to another token mid-way, which both must find). */
static void test_cached_equals_uncached(void)
{
	static float probs[2][B * V];
	int prompt[B * SP], got[B * SO], ref[B * SO];
	run_tokens(1, "", prompt, got);
	reference_tokens(prompt, ref, probs);
	int same = count_same(got, ref, B * SO);
	if (same != B * SO)
		fprintf(stderr, "\ncached decode: %d of %d tokens as the uncached forward's\n", same,
			B * SO);
	CU_ASSERT_EQUAL(same, B * SO);
	/* and the distributions themselves, prefill's and the last step's (after 15 cached
	 * steps): softmax of the run's logits against the reference's probabilities */
	for (int k = 0; k < 2; k++) {
		double worst = 0;
		for (int b = 0; b < B; b++) {
			const float *l = run_logits[k] + (size_t)b * V;
			double mx = l[0], sum = 0;
			for (int v = 1; v < V; v++)
				mx = fmax(mx, l[v]);
			for (int v = 0; v < V; v++)
				sum += exp(l[v] - mx);
			for (int v = 0; v < V; v++) {
				double p = exp(l[v] - mx) / sum, q = probs[k][(size_t)b * V + v];
				worst = fmax(worst, fabs(p - q) / q);
			}
		}
		printf("\n  %s: probabilities within %.2g (relative) of the uncached forward's",
		       k ? "last step" : "prefill", worst);
		CU_ASSERT(worst <= PROB_BOUND);
	}
}

/* fp32: tensor parallel 2 and 4 (and 2 replicas of tp 2 on 4 ranks) generate one rank's tokens:
 * the row-split products summed by the all-reduce reassociate each sum by a few 2^-24, far
 * below the gaps between the largest logits here. */
static void test_tp_same_tokens(void)
{
	static const struct { int ranks; const char *set; } cases[] = {
		{2, "--set inference.tensor_parallel.tp_size=2"},
		{4, "--set inference.tensor_parallel.tp_size=4"},
		{4, "--set inference.tensor_parallel.tp_size=2"},
	};
	static float one_logits[2][B * V];
	int one[B * SO], got[B * SO];
	run_tokens(1, "", NULL, one);
	memcpy(one_logits, run_logits, sizeof(one_logits));
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		run_tokens(cases[i].ranks, cases[i].set, NULL, got);
		double worst = 0;
		for (int k = 0; k < 2; k++)
			for (int v = 0; v < B * V; v++)
				worst = fmax(worst, fabs(run_logits[k][v] - one_logits[k][v]));
		printf("\n  %d ranks %s: logits within %.2g of one rank's", cases[i].ranks,
		       cases[i].set, worst);
		CU_ASSERT(worst <= 1e-5);
		int same = count_same(one, got, B * SO);
		if (same != B * SO)
			fprintf(stderr, "\n%d ranks %s: %d of %d tokens as one rank's\n", cases[i].ranks,
				cases[i].set, same, B * SO);
		CU_ASSERT_EQUAL(same, B * SO);
	}
}

/* bf16 and int8 weights (8 groups a matrix, fp16 compute, tensor parallel 2 too): their tokens
 * against fp32's, the agreement printed. Measured: all 64 agree in each (this model's greedy
 * choices are far apart: the last token's own logit leads). A quantized run that lost its scales
 * or its groups' order would generate noise; the bound asked is 60 of 64. The last step's
 * logits: within 2% of the largest (measured 0.4% in bf16, whose rounding is 2^-9 relative per
 * stored value, 0.7-0.8% in int8 with fp16 activations). */
static void test_low_precision_agreement(void)
{
	static const struct { int ranks; const char *name, *set; } cases[] = {
		{1, "bf16", "--set inference.dtype=bf16"},
		{1, "int8", "--set inference.dtype=int8 --set inference.replace_with_kernel_inject=true "
		 "--set inference.quantization_setting=8"},
		{2, "int8 tp 2", "--set inference.dtype=int8 --set inference.replace_with_kernel_inject=true "
		 "--set inference.quantization_setting=8 --set inference.tensor_parallel.tp_size=2"},
	};
	static float fp32[2][B * V];
	int ref[B * SO], got[B * SO];
	run_tokens(1, "", NULL, ref);
	memcpy(fp32, run_logits, sizeof(fp32));
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		run_tokens(cases[i].ranks, cases[i].set, NULL, got);
		int same = count_same(ref, got, B * SO);
		double worst = 0, top = 0;
		for (int v = 0; v < B * V; v++) {
			worst = fmax(worst, fabs(run_logits[1][v] - fp32[1][v]));
			top = fmax(top, fabs(fp32[1][v]));
		}
		printf("\n  %s: %d of %d generated tokens as fp32's; last step's logits within %.2g "
		       "(largest %.2g)", cases[i].name, same, B * SO, worst, top);
		CU_ASSERT(same >= 60);
		CU_ASSERT(worst <= 0.02 * top);
	}
}

/* Each rank's memory per category and collective bytes equal the prediction (px_run_measured),
 * and the collectives worked out by hand. Tensor parallel t > 1, per rank over the generation
 * (prefill of 16 tokens, then 15 decode steps of 1): each forward all-reduces the embedding's
 * vocabulary-parallel rows once and each of the 4 blocks twice, 9 all-reduces of B x tokens x C
 * elements: 9 x 4 x 16 x 128 x 4 bytes = 294,912 in prefill and 9 x 4 x 128 x 4 x 15 = 276,480
 * in decode, 571,392 in all (fp32; half in int8's fp16); and the head all-gathers B x V fp32
 * logits, 4 x 256 x 4 x 16 forwards = 65,536. Weights, fp32 on one rank: V C + 128 C = 49,152,
 * 4 blocks of 12 C^2 + 13 C = 198,272, the final norm 2 C = 256: 842,496 x 4 = 3,369,984 bytes.
 * int8 runs at batch 8 (fp16 all-reduces of twice the rows: the same 571,392 bytes; logits
 * 131,072): at batch 4 its 0.8 MB footprint is too small for the pool's 64 KiB steps to stay
 * within px_check_pool_peaks' quarter (26% over, measured). */
static void test_measured_equals_predicted(void)
{
	static const struct { int ranks; const char *set; double ar, ag; } cases[] = {
		{1, "", 0, 0},
		{2, "--set inference.tensor_parallel.tp_size=2", 571392, 65536},
		{4, "--set inference.tensor_parallel.tp_size=4", 571392, 65536},
		{2, "--set inference.tensor_parallel.tp_size=2 --set inference.dtype=int8 --set "
		    "inference.replace_with_kernel_inject=true --set inference.quantization_setting=8 "
		    "--set workload.batch_size=8", 571392, 131072},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char args[2048];
		snprintf(args, sizeof(args), "run %s --ranks %d %s", scn(), cases[i].ranks, cases[i].set);
		sqlite3 *db = px_run_measured(args, cases[i].ranks);
		for (int r = 0; r < cases[i].ranks; r++) {
			CU_ASSERT_EQUAL(px_run_metric(db, "comm.all_reduce_bytes", "measured", r),
					cases[i].ar);
			CU_ASSERT_EQUAL(px_run_metric(db, "comm.all_gather_bytes", "measured", r),
					cases[i].ag);
		}
		if (i == 0)
			CU_ASSERT_EQUAL(px_run_metric(db, "memory.gpu.params_bytes", "measured", 0),
					3369984);
		/* the clock's figures are stored beside them */
		CU_ASSERT(px_test_query(db, "SELECT value FROM metrics WHERE name = 'infer.ttft_s' "
				       "AND rank = 0 AND run_id = (SELECT MAX(id) FROM runs)") > 0);
		sqlite3_close(db);
	}
}

/* A deliberately wrong prediction fails: with the simulator alone told to halve the KV cache
 * (PARALLAX_TEST_MISPREDICT, sim/memory.h), compare --max-error 2 of the buffers' memory exits
 * 3 naming it; without, 0. */
static void test_wrong_prediction_fails(void)
{
	char cmd[4096], text[1 << 16];
	const char *dir = px_test_tmpdir(), *bin = getenv("PX_RUN_BIN") ? getenv("PX_RUN_BIN") :
						  getenv("PX_BIN");
	const char *hook[2] = {"", "PARALLAX_TEST_MISPREDICT=kv_cache "};
	CU_ASSERT_PTR_NOT_NULL_FATAL(bin);
	for (int k = 0; k < 2; k++) {
		snprintf(cmd, sizeof(cmd), "cd '%s' && %s'%s' run %s --db w%d.db >/dev/null 2>&1; "
			 "echo run=$?; '%s' compare --db w%d.db --max-error 2 --only memory.gpu.buffers "
			 ">/dev/null; echo compare=$?", dir, hook[k], bin, scn(), k, bin, k);
		CU_ASSERT_EQUAL(px_test_run_sh(cmd, text, sizeof(text)), 0);
		PX_ASSERT_HAS(text, "run=0");
		PX_ASSERT_HAS(text, k ? "compare=3" : "compare=0");
		if (k)
			PX_ASSERT_HAS(text, "parallax compare: memory.gpu.buffers_bytes: predicted");
	}
}

/* What it does not run: exit 2 with the reason named, nothing stored. */
static void test_refusals(void)
{
	static const struct { const char *set, *says; } cases[] = {
		{"--backend cuda", "CUDA"}, /* not built with it, or its inference not written yet */
		{"--set model.model_type=llama --set model.hidden_size=128 --set "
		 "model.intermediate_size=256 --set model.num_hidden_layers=2 --set "
		 "model.num_attention_heads=4 --set model.vocab_size=256", "a GPT-2 model"},
		{"--set inference.dtype=int8 --set inference.replace_with_kernel_inject=true --set "
		 "inference.quantization_setting=7", "quantization groups dividing every weight matrix"},
		{"--set inference.quant.weight.quantized_initialization.group_size=64",
		 "quant.weight.quantized_initialization"},
		{"--save /tmp/px-never", "--save applies to training runs"},
	};
	char text[1 << 14], db[600];
	snprintf(db, sizeof(db), "%s/never.db", px_test_tmpdir());
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		int rc = px_test_run_clif(text, sizeof(text), "run %s --db '%s' %s", scn(), db,
					  cases[i].set);
		if (rc != 2)
			fprintf(stderr, "\n%s: exit %d\n%s\n", cases[i].set, rc, text);
		CU_ASSERT_EQUAL(rc, 2);
		PX_ASSERT_HAS(text, cases[i].says);
	}
	FILE *f = fopen(db, "r");
	CU_ASSERT_PTR_NULL(f);
	if (f)
		fclose(f);
}

int test_infer_exec_register(void)
{
	return PX_ADD_SUITE("infer_exec",
			    {"attention over a KV cache equals the full one", test_attention_cached},
			    {"int8 groups within max|w|/254", test_quantize_bound},
			    {"cached decode = uncached forward (fp32)", test_cached_equals_uncached},
			    {"tp 2 and 4 generate one rank's tokens", test_tp_same_tokens, PX_RELEASE_RUN},
			    {"bf16 and int8 tokens against fp32's", test_low_precision_agreement, PX_RELEASE_RUN},
			    {"measured memory and comm = predicted", test_measured_equals_predicted, PX_RELEASE_RUN},
			    {"a wrong prediction fails the comparison", test_wrong_prediction_fails},
			    {"what it does not run: exit 2", test_refusals});
}

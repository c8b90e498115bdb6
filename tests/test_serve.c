/* Serving through sweep, plan and plot, and continuous batching: a sweep over an inference
 * scenario stores each point as `parallax predict` prices it, a serving plan picks the cluster a
 * hand comparison of prices picks, the serving plot writes one data block per series, continuous
 * batching's steady state obeys Little's law against fixed-batch predictions of the same
 * scenario, and bad input (a training key on an inference scenario, an unknown key, a serving
 * flag on a training plan) exits 2 naming the file and the key. */
#include <CUnit/CUnit.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../sim/infer_sim.h"
#include "suites.h"

static char out[1 << 17];

static double q(const char *db_path, const char *sql)
{
	sqlite3 *db;
	double v = NAN;
	if (sqlite3_open_v2(db_path, &db, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK)
		v = px_test_query(db, sql);
	sqlite3_close(db);
	return v;
}

/* A number from a `predict --json` object's metrics. */
static double metric(const char *json, const char *name)
{
	cJSON *j = cJSON_Parse(json);
	const cJSON *m = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "metrics"), name);
	double v = cJSON_IsNumber(m) ? m->valuedouble : NAN;
	cJSON_Delete(j);
	return v;
}

/* dir/NAME holding text; its path in a static buffer (one at a time). */
static const char *write_tmp(const char *name, const char *text)
{
	static char path[1024];
	snprintf(path, sizeof(path), "%s/%s", px_test_tmpdir(), name);
	px_test_write_file(path, text);
	return path;
}

/* ---- sweep ---- */

/* 2 dtypes x 3 batches = 6 points of Llama-2 70B on 4 H100s (tensor parallel 4). Batch 512 does
 * not fit in either dtype: its KV cache alone is 512 sequences x 4096 tokens (max_out_tokens,
 * reserved by kernel injection) x 327,680 bytes a token / 4 GPUs = 171.8 GB a GPU, above the
 * H100's 80 GB. Point (fp16, batch 8), index 1, equals `parallax predict` of the scenario with
 * those two keys set, and its cost is the price list's 12.29 USD per GPU-hour x 4 GPUs over its
 * tokens/s. */
static void test_sweep_point_equals_predict(void)
{
	char text[2048], db[1024], sw[1024], scenario[1024];
	snprintf(db, sizeof(db), "%s/serve.db", px_test_tmpdir());
	remove(db);
	/* px_test_path's buffer is static: one at a time */
	snprintf(scenario, sizeof(scenario), "%s",
		 px_test_path("scenarios/llama2-70b-infer-tp4-h100.json"));
	snprintf(text, sizeof(text),
		 "{\"name\": \"serve\", \"scenario\": \"%s\", \"prices\": \"%s\",\n"
		 " \"axes\": {\"inference.dtype\": [\"fp16\", \"int8\"],"
		 " \"workload.batch_size\": [1, 8, 512]}}", scenario,
		 px_test_path("scenarios/prices.json"));
	snprintf(sw, sizeof(sw), "%s", write_tmp("serve-sweep.json", text));
	CU_ASSERT_EQUAL_FATAL(px_test_run_clif(out, sizeof(out), "sweep '%s' --db '%s' --jobs 1",
					       sw, db), 0);
	PX_ASSERT_HAS(out, "6 points: 4 priced");
	PX_ASSERT_HAS(out, "2 do not fit");
	CU_ASSERT_EQUAL(q(db, "SELECT count(*) FROM sweep_points"), 6);
	CU_ASSERT_EQUAL(q(db, "SELECT count(*) FROM sweep_points WHERE status = 'oom' AND config "
			  "LIKE '%\"workload.batch_size\": 512}'"), 2);
	CU_ASSERT_EQUAL(q(db, "SELECT count(*) FROM sweep_infer_points WHERE ttft_s IS NOT NULL"), 4);

	CU_ASSERT_EQUAL_FATAL(px_test_run_clif(out, sizeof(out), "predict '%s' --no-db --json "
					       "--set inference.dtype=fp16 "
					       "--set workload.batch_size=8",
					       px_test_path("scenarios/llama2-70b-infer-tp4-h100.json")),
			      0);
	const struct {
		const char *col, *metric;
	} same[] = {{"i.ttft_s", "infer.ttft_s"}, {"i.tpot_s", "infer.tpot_s"},
		    {"i.latency_s", "infer.latency_s"},
		    {"i.tokens_per_s_per_gpu", "infer.tokens_per_s_per_gpu"},
		    {"p.gpu_peak_bytes", "infer.memory.gpu.peak_bytes"},
		    {"i.max_batch", "infer.max_batch"}};
	for (size_t k = 0; k < sizeof(same) / sizeof(same[0]); k++) {
		char sql[512];
		snprintf(sql, sizeof(sql), "SELECT %s FROM sweep_points p JOIN sweep_infer_points i "
			 "USING (sweep_id, idx) WHERE idx = 1", same[k].col);
		double want = metric(out, same[k].metric), got = q(db, sql);
		CU_ASSERT_DOUBLE_EQUAL(got, want, 1e-9 * fabs(want));
	}
	double tps_gpu = metric(out, "infer.tokens_per_s_per_gpu");
	/* two shards merged hold every point and its inference row; --show lists them again */
	char shard[2][1024], merged[1024];
	snprintf(merged, sizeof(merged), "%s/serve-merged.db", px_test_tmpdir());
	remove(merged);
	for (int i = 0; i < 2; i++) {
		snprintf(shard[i], sizeof(shard[i]), "%s/serve-shard%d.db", px_test_tmpdir(), i);
		remove(shard[i]);
		CU_ASSERT_EQUAL(px_test_run_clif(out, sizeof(out), "sweep '%s' --db '%s' --shard %d/2 "
						 "--jobs 1", sw, shard[i], i), 0);
	}
	CU_ASSERT_EQUAL(px_test_run_clif(out, sizeof(out), "merge '%s' '%s' '%s'", merged, shard[0],
					 shard[1]), 0);
	CU_ASSERT_EQUAL(q(merged, "SELECT count(*) FROM sweep_infer_points"), 6);
	CU_ASSERT_EQUAL(q(merged, "SELECT count(*) FROM sweep_infer_points a JOIN sweep_points p "
			  "USING (sweep_id, idx) WHERE a.ttft_s IS NOT NULL AND p.status = 'ok'"), 4);
	CU_ASSERT_EQUAL(px_test_run_clif(out, sizeof(out), "sweep --show serve --db '%s'", merged),
			0);
	PX_ASSERT_HAS(out, "ttft_s   tpot_ms latency_s  tok/s/GPU");
	CU_ASSERT_EQUAL_FATAL(px_test_run_clif(out, sizeof(out), "predict '%s' --no-db --json "
					       "--set inference.dtype=fp16 "
					       "--set workload.batch_size=8", scenario), 0);
	CU_ASSERT_DOUBLE_EQUAL(q(db, "SELECT tokens_per_s FROM sweep_points WHERE idx = 1"),
			       tps_gpu * 4, 1e-9 * tps_gpu);
	CU_ASSERT_DOUBLE_EQUAL(q(db, "SELECT cost_per_mtoken FROM sweep_points WHERE idx = 1"),
			       12.29 * 4 / 3600 / (tps_gpu * 4) * 1e6, 1e-6);
}

/* A training key, and a misspelt inference key, on an inference base: exit 2 naming the sweep
 * file and the key, and no database made. */
static void test_sweep_refuses_bad_keys(void)
{
	char text[2048], db[1024];
	snprintf(db, sizeof(db), "%s/never.db", px_test_tmpdir());
	remove(db);
	snprintf(text, sizeof(text),
		 "{\"name\": \"bad\", \"scenario\": \"%s\",\n"
		 " \"axes\": {\"deepspeed.zero_optimization.stage\": [0, 3]}}",
		 px_test_path("scenarios/llama2-70b-infer-tp4-h100.json"));
	const char *sw = write_tmp("bad-sweep.json", text);
	CU_ASSERT_EQUAL(px_test_run_clif(out, sizeof(out), "sweep '%s' --db '%s'", sw, db), 2);
	PX_ASSERT_HAS(out, "bad-sweep.json:2:");
	PX_ASSERT_HAS(out, "axes.deepspeed.zero_optimization.stage: not a key of an inference "
		      "scenario");
	CU_ASSERT_NOT_EQUAL(access(db, F_OK), 0);

	snprintf(text, sizeof(text),
		 "{\"name\": \"bad\", \"scenario\": \"%s\",\n"
		 " \"axes\": {\"workload.batchsize\": [1, 2]}}",
		 px_test_path("scenarios/llama2-70b-infer-tp4-h100.json"));
	sw = write_tmp("bad-sweep.json", text);
	CU_ASSERT_EQUAL(px_test_run_clif(out, sizeof(out), "sweep '%s' --db '%s'", sw, db), 2);
	PX_ASSERT_HAS(out, "bad-sweep.json: axes.workload.batchsize: no scenario reader knows this "
		      "key; did you mean 'workload.batch_size'?");
	CU_ASSERT_NOT_EQUAL(access(db, F_OK), 0);
}

/* ---- plan ---- */

/* Two GPU types, 1 or 2 nodes of 8, one layout (tp 8, batch 16): a node is one replica, so two
 * nodes serve exactly twice one node's tokens/s (each replica serves its own batch). The target
 * is 1.5 x one A100 node's tokens/s (from `predict` of that layout): one A100 node falls short,
 * two serve it. With the price list's 5.12 (A100-80GB) and 12.29 (H100-SXM) USD per GPU-hour,
 * two A100 nodes cost 16 x 5.12 = 81.92 USD/h, below one H100 node's 8 x 12.29 = 98.32 and two's
 * 196.64, so two A100 nodes win whether or not H100 nodes serve too. */
static void test_plan_serving_choice(void)
{
	const char *scn = px_test_path("scenarios/llama2-70b-infer-tp4-h100.json");
	char scenario[1024], text[4096];
	snprintf(scenario, sizeof(scenario), "%s", scn);
	double tps[2];
	const char *gpu[2] = {"A100-80GB", "H100-SXM"};
	for (int g = 0; g < 2; g++) {
		CU_ASSERT_EQUAL_FATAL(px_test_run_clif(out, sizeof(out), "predict '%s' --no-db --json "
						       "--set cluster.gpu=%s --set "
						       "cluster.gpus_per_node=8 --set "
						       "inference.tensor_parallel.tp_size=8 --set "
						       "workload.batch_size=16", scenario, gpu[g]), 0);
		tps[g] = metric(out, "infer.tokens_per_s_per_node");
	}
	double target = 1.5 * tps[0];
	snprintf(text, sizeof(text),
		 "{\"scenario\": \"%s\", \"gpus\": [\"A100-80GB\", \"H100-SXM\"], \"nodes\": [1, 2],\n"
		 " \"gpus_per_node\": 8, \"prices\": \"%s\", \"min_tokens_per_s\": %.9g,\n"
		 " \"search\": {\"inference.tensor_parallel.tp_size\": [8],"
		 " \"workload.batch_size\": [16]}}", scenario,
		 px_test_path("scenarios/prices.json"), target);
	const char *plan = write_tmp("serve-plan.json", text);
	CU_ASSERT_EQUAL_FATAL(px_test_run_clif(out, sizeof(out), "plan '%s' --json", plan), 0);
	cJSON *j = cJSON_Parse(out);
	CU_ASSERT_PTR_NOT_NULL_FATAL(j);
	const cJSON *cells = cJSON_GetObjectItem(j, "cells");
	CU_ASSERT_EQUAL(cJSON_GetArraySize(cells), 4);
	int i = 0;
	for (const cJSON *c = cells ? cells->child : NULL; c; c = c->next, i++) {
		int g = i / 2, nodes = i % 2 + 1;
		double got = cJSON_GetObjectItem(c, "tokens_per_s")->valuedouble;
		CU_ASSERT_DOUBLE_EQUAL(got, tps[g] * nodes, 1e-9 * got);
		CU_ASSERT_DOUBLE_EQUAL(cJSON_GetObjectItem(c, "usd_per_hour")->valuedouble,
				       (g ? 12.29 : 5.12) * 8 * nodes, 1e-9);
		CU_ASSERT_EQUAL(cJSON_IsTrue(cJSON_GetObjectItem(c, "serves")),
				tps[g] * nodes >= target);
	}
	CU_ASSERT_EQUAL(cJSON_GetObjectItem(j, "winner")->valuedouble, 1); /* A100, 2 nodes */
	cJSON_Delete(j);
	/* the table names it and why */
	CU_ASSERT_EQUAL(px_test_run_clif(out, sizeof(out), "plan '%s'", plan), 0);
	PX_ASSERT_HAS(out, "# winner: 2 x 8 A100-80GB at 81.92 USD/h");
	/* a bound no layout meets: no winner, still exit 0 */
	CU_ASSERT_EQUAL(px_test_run_clif(out, sizeof(out), "plan '%s' --max-tpot-ms 0.001", plan), 0);
	PX_ASSERT_HAS(out, "# no cell serves the target within the bounds");
}

/* A training plan's key in a serving plan, and a serving flag on a training plan: exit 2. */
static void test_plan_refuses_other_kind(void)
{
	char text[2048];
	snprintf(text, sizeof(text),
		 "{\"scenario\": \"%s\", \"gpus\": [\"H100-SXM\"], \"nodes\": [1],\n"
		 " \"tokens\": 1e9}", px_test_path("scenarios/llama2-70b-infer-tp4-h100.json"));
	const char *plan = write_tmp("serve-plan.json", text);
	CU_ASSERT_EQUAL(px_test_run_clif(out, sizeof(out), "plan '%s'", plan), 2);
	PX_ASSERT_HAS(out, "serve-plan.json:2:12: tokens: a training plan's key");
	snprintf(text, sizeof(text),
		 "{\"scenario\": \"%s\", \"tokens\": 1e9, \"gpus\": [\"H100-SXM\"], \"nodes\": [1]}",
		 px_test_path("scenarios/sweeps/gpt3-13b-64xa100-base.json"));
	plan = write_tmp("train-plan.json", text);
	CU_ASSERT_EQUAL(px_test_run_clif(out, sizeof(out), "plan '%s' --max-tpot-ms 50", plan), 2);
	PX_ASSERT_HAS(out, "train-plan.json: --max-tpot-ms: a serving plan's flag");
}

/* ---- plot ---- */

/* Two series (fp16, int8) over batches 1, 8 and 512: two data blocks, batch 512 left out of
 * each as not fitting (see the sweep test), batch 8 fp16's tokens/s per GPU and TPOT those of
 * `predict`; a training scenario is refused. */
static void test_plot_serving(void)
{
	char prefix[1024], dat[1100];
	const char *scn = px_test_path("scenarios/llama2-70b-infer-tp4-h100.json");
	char scenario[1024];
	snprintf(scenario, sizeof(scenario), "%s", scn);
	snprintf(prefix, sizeof(prefix), "%s/serving", px_test_tmpdir());
	CU_ASSERT_EQUAL_FATAL(px_test_run_clif(out, sizeof(out), "plot serving '%s' --batches 8,1,512 "
					       "--series inference.dtype=fp16,int8 --out '%s' "
					       "--format png", scenario, prefix), 0);
	snprintf(dat, sizeof(dat), "%s.png", prefix);
	CU_ASSERT_EQUAL(access(dat, F_OK), 0);
	snprintf(dat, sizeof(dat), "%s.dat", prefix);
	FILE *f = fopen(dat, "r");
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	static char text[1 << 16];
	size_t n = fread(text, 1, sizeof(text) - 1, f);
	text[n] = '\0';
	fclose(f);
	PX_ASSERT_HAS(text, "# series 0: dtype fp16\n");
	PX_ASSERT_HAS(text, "# series 1: dtype int8\n");
	const char *s1 = strstr(text, "# series 1");
	PX_ASSERT_HAS(text, "# batch 512 left out: does not fit");
	CU_ASSERT_PTR_NOT_NULL(s1 && strstr(s1, "# batch 512 left out: does not fit"));
	CU_ASSERT_EQUAL_FATAL(px_test_run_clif(out, sizeof(out), "predict '%s' --no-db --json "
					       "--set workload.batch_size=8", scenario), 0);
	char want[128];
	snprintf(want, sizeof(want), "       8 %16.3f %10.4f ",
		 metric(out, "infer.tokens_per_s_per_gpu"), metric(out, "infer.tpot_s") * 1e3);
	PX_ASSERT_HAS(text, want);
	CU_ASSERT(strstr(text, want) < s1); /* in the fp16 block */
	/* rows by batch, ascending: 1 before 8 */
	CU_ASSERT(strstr(text, "\n       1 ") < strstr(text, "\n       8 "));

	CU_ASSERT_EQUAL(px_test_run_clif(out, sizeof(out), "plot serving '%s' --out '%s/x'",
					 px_test_path("scenarios/llama2-7b-zero2-h100.json"),
					 px_test_tmpdir()), 2);
	PX_ASSERT_HAS(out, "llama2-7b-zero2-h100.json: not an inference scenario");
}

/* ---- continuous batching ---- */

/* Llama-2 7B on one H100, kernel injection off, prompt 512 and output 128 tokens. */
static const char CB[] =
	"{\"model\": \"%s\", \"cluster\": {\"gpu\": \"H100-SXM\", \"nodes\": 1, \"gpus_per_node\":"
	" 1}, \"inference\": {\"dtype\": \"fp16\"},\n"
	" \"workload\": {%s \"prompt_tokens\": 512, \"output_tokens\": 128}}";

static int predict_cb(const char *workload, InferScenario *sc, InferPrediction *pr)
{
	char text[2048];
	snprintf(text, sizeof(text), CB, px_test_path("scenarios/models/llama-2-7b.json"), workload);
	const char *path = write_tmp("cb.json", text);
	PxError err = {0};
	if (infer_scenario_load(sc, path, NULL, &err)) {
		fprintf(stderr, "\n%s\n", err.msg);
		return -1;
	}
	int rc = infer_predict(sc, NULL, NULL, pr, &err);
	if (rc)
		fprintf(stderr, "\n%s\n", err.msg);
	return rc;
}

/* TTFT and TPOT of a static batch of b: a prefill of b prompts, a decode step of b. */
static void static_times(long long b, double *prefill_s, double *decode_s)
{
	InferScenario sc;
	InferPrediction pr;
	char wl[64];
	snprintf(wl, sizeof(wl), "\"batch_size\": %lld,", b);
	CU_ASSERT_EQUAL_FATAL(predict_cb(wl, &sc, &pr), 0);
	*prefill_s = pr.ttft_s;
	*decode_s = pr.tpot_s;
	infer_predict_free(&pr);
	infer_scenario_free(&sc);
}

/* Hand-worked steady state. Prefills (batch 1, T_pf) come first and take rho = lambda T_pf of
 * the time; decode steps of the N running sequences fill the rest, so a sequence's TPOT is
 * T_d(N) / (1 - rho) and, by Little's law over its so - 1 decode steps,
 * N = lambda (so - 1) T_d(N) / (1 - rho). T_pf and T_d come from static-batch predictions here,
 * not from the continuous code. At 0.05 requests/s N is below one: T_d = T_d(1). At 3 requests/s
 * N lies between whole batches n and n + 1, where T_d is linear: solving
 * N (1 - rho) = lambda (so - 1) (T_d(n) + (N - n) dT) gives
 * N = lambda (so - 1) (T_d(n) - n dT) / (1 - rho - lambda (so - 1) dT). Also: every request is
 * served (tokens/s = lambda x so), requests in the system = lambda x latency, TTFT = T_pf plus
 * M/D/1's wait rho T_pf / (2 (1 - rho)) plus half a decode step, the mean residual of the decode
 * steps the server takes whenever no prompt waits (an M/G/1 served exhaustively with multiple
 * vacations: Fuhrmann and Cooper's decomposition), for min(1, N) of the gaps, and a rate whose
 * prefills alone exceed the time is not served. */
static void test_continuous_little(void)
{
	const double so = 128, rates[2] = {0.05, 3};
	double t_pf, t_d1, unused;
	static_times(1, &t_pf, &t_d1);
	for (int r = 0; r < 2; r++) {
		InferScenario sc;
		InferPrediction pr;
		char wl[128];
		double lambda = rates[r], rho = lambda * t_pf;
		snprintf(wl, sizeof(wl), "\"batching\": \"continuous\", \"request_rate\": %g,", lambda);
		CU_ASSERT_EQUAL_FATAL(predict_cb(wl, &sc, &pr), 0);
		const InferContinuous *c = &pr.cb;
		CU_ASSERT_FATAL(c->stable);
		CU_ASSERT_DOUBLE_EQUAL(c->prefill_util, rho, 1e-12);
		double n_want;
		if (r == 0) {
			n_want = lambda * (so - 1) * t_d1 / (1 - rho);
			CU_ASSERT(n_want < 1);
		} else {
			long long n = (long long)floor(c->concurrency);
			double td_n, td_n1;
			CU_ASSERT_FATAL(n >= 1);
			static_times(n, &unused, &td_n);
			static_times(n + 1, &unused, &td_n1);
			double dt = td_n1 - td_n, a = lambda * (so - 1);
			n_want = a * (td_n - (double)n * dt) / (1 - rho - a * dt);
			CU_ASSERT(n_want > 1);
		}
		CU_ASSERT_DOUBLE_EQUAL(c->concurrency, n_want, 1e-9 * n_want);
		CU_ASSERT_DOUBLE_EQUAL(pr.tpot_s, c->concurrency / (lambda * (so - 1)),
				       1e-9 * pr.tpot_s);
		/* the decode steps as an exhaustive M/G/1's vacations: their mean residual, T_d / 2,
		 * whenever a prompt arrives (below one sequence, for min(1, N) of the gaps) */
		double td = c->decode_step_s, busy = fmin(1, c->concurrency);
		CU_ASSERT_DOUBLE_EQUAL(td, r ? pr.tpot_s * (1 - rho) : t_d1, 1e-12);
		CU_ASSERT_DOUBLE_EQUAL(pr.ttft_s, t_pf + rho * t_pf / (2 * (1 - rho)) + busy * td / 2,
				       1e-12);
		CU_ASSERT_DOUBLE_EQUAL(pr.tokens_per_s_gpu, lambda * so, 1e-9);
		CU_ASSERT_DOUBLE_EQUAL(c->in_system, lambda * pr.latency_s, 1e-9);
		/* the KV cache at that occupancy: N sequences of 512 + 64 tokens, 32 layers x 32
		 * heads x 128 x 2 (K, V) x 2 bytes = 524,288 bytes a token (Llama-2 7B, no GQA) */
		CU_ASSERT_DOUBLE_EQUAL(c->kv_bytes, c->concurrency * 576 * 524288.0, 1e-3);
		infer_predict_free(&pr);
		infer_scenario_free(&sc);
	}
	InferScenario sc;
	InferPrediction pr;
	char wl[128];
	snprintf(wl, sizeof(wl), "\"batching\": \"continuous\", \"request_rate\": %g,", 1.01 / t_pf);
	CU_ASSERT_EQUAL_FATAL(predict_cb(wl, &sc, &pr), 0);
	CU_ASSERT_FALSE(pr.cb.stable);
	CU_ASSERT_PTR_NOT_NULL(strstr(pr.cb.why, "overloaded: the prefills alone"));
	infer_predict_free(&pr);
	infer_scenario_free(&sc);
}

/* A request rate on a static batch, and an unknown batching, exit 2 naming file:line:col. */
static void test_continuous_bad_input(void)
{
	char text[2048];
	snprintf(text, sizeof(text), CB, px_test_path("scenarios/models/llama-2-7b.json"),
		 "\"request_rate\": 2,");
	const char *path = write_tmp("cb.json", text);
	CU_ASSERT_EQUAL(px_test_run_clif(out, sizeof(out), "predict '%s' --no-db", path), 2);
	PX_ASSERT_HAS(out, "cb.json:2:31: workload.request_rate: applies to \"batching\": "
		      "\"continuous\" only");
	snprintf(text, sizeof(text), CB, px_test_path("scenarios/models/llama-2-7b.json"),
		 "\"batching\": \"dynamic\",");
	path = write_tmp("cb.json", text);
	CU_ASSERT_EQUAL(px_test_run_clif(out, sizeof(out), "predict '%s' --no-db", path), 2);
	PX_ASSERT_HAS(out, "workload.batching: expected \"static\"");
	snprintf(text, sizeof(text), CB, px_test_path("scenarios/models/llama-2-7b.json"),
		 "\"batching\": \"continuous\",");
	path = write_tmp("cb.json", text);
	CU_ASSERT_EQUAL(px_test_run_clif(out, sizeof(out), "predict '%s' --no-db", path), 2);
	PX_ASSERT_HAS(out, "workload.request_rate: missing");
}

/* ---- a trace replayed ---- */

/* The scenario text (a format taking the model's path and more workload keys) and the trace csv
 * written side by side in a fresh folder (the scenario names the trace "tr.csv"): the scenario's
 * path. */
static const char *write_pair(const char *fmt, const char *workload, const char *csv)
{
	static char path[1024];
	char dir[512], file[1024], text[2048];
	snprintf(dir, sizeof(dir), "%s", px_test_tmpdir());
	snprintf(file, sizeof(file), "%s/tr.csv", dir);
	px_test_write_file(file, csv);
	snprintf(text, sizeof(text), fmt, px_test_path("scenarios/models/llama-2-7b.json"),
		 workload);
	snprintf(path, sizeof(path), "%s/tr.json", dir);
	px_test_write_file(path, text);
	return path;
}

/* The continuous-batching scenario over the trace file tr.csv written beside it with text;
 * workload: more keys of the workload ("" for none); usable_gib: the GPU's usable memory, 0 for
 * the catalog's. */
static const char *trace_scenario; /* the scenario predict_trace_on wrote last */

static int predict_trace_on(const char *csv, const char *workload, double usable_gib,
			    InferScenario *sc, InferPrediction *pr, PxError *err)
{
	char usable[64] = "";
	if (usable_gib > 0)
		snprintf(usable, sizeof(usable), ", \"gpu_usable_memory_GiB\": %g", usable_gib);
	char fmt[1024];
	snprintf(fmt, sizeof(fmt),
		 "{\"model\": \"%%s\", \"cluster\": {\"gpu\": \"H100-SXM\", \"nodes\": 1, "
		 "\"gpus_per_node\": 1%s}, \"inference\": {\"dtype\": \"fp16\"},\n"
		 " \"workload\": {\"batching\": \"continuous\", %%s\"trace\": \"tr.csv\"}}",
		 usable);
	const char *path = trace_scenario = write_pair(fmt, workload, csv);
	if (infer_scenario_load(sc, path, NULL, err))
		return -1;
	if (infer_predict(sc, NULL, NULL, pr, err)) {
		infer_predict_free(pr);
		infer_scenario_free(sc);
		return -1;
	}
	return 0;
}

static int predict_trace(const char *csv, const char *workload, InferScenario *sc,
			 InferPrediction *pr, PxError *err)
{
	return predict_trace_on(csv, workload, 0, sc, pr, err);
}

/* One phase's time for sc's lengths with prompt prompt at batch b (kernel injection off, as
 * continuous batching prices it; the GPU's built-in profile): the prefill's when prefill, else
 * the decode step's. */
static double phase_s(const InferScenario *sc, long long prompt, long long b, int prefill)
{
	InferScenario one = *sc;
	one.inf.kernel_inject = 0;
	one.wl.prompt_tokens = prompt;
	InferPhase pf, dec;
	PxError err = {0};
	HwProfile hw;
	CU_ASSERT_EQUAL_FATAL(hwprofile_default(&sc->cluster.gpu, &hw), 0);
	CU_ASSERT_EQUAL_FATAL(infer_price_batch(&one, &hw, b, &pf, &dec, &err), 0);
	return prefill ? pf.s : dec.s;
}

/* A decode step of n sequences holding held tokens, as the replay prices it: n sequences at
 * their mean context, held / n (the schedule's decode step: suite splitfuse checks the ragged
 * forward against it). */
static double step_s(const InferScenario *sc, long long n, long long held)
{
	InferScenario one = *sc;
	one.inf.kernel_inject = 0;
	InferPlan p;
	InferPhase ph;
	PxError err = {0};
	HwProfile hw;
	CU_ASSERT_EQUAL_FATAL(hwprofile_default(&sc->cluster.gpu, &hw), 0);
	CU_ASSERT_EQUAL_FATAL(infer_plan_make(&one, 1, 0, &p, &err), 0);
	InferRagged g = {.decode_seqs = n, .decode_ctx = (double)held / (double)n,
			 .logit_rows = (double)n};
	CU_ASSERT_EQUAL(infer_price_ragged(&p, &hw, &g, &ph, &err), 0);
	infer_plan_free(&p);
	return ph.s;
}

/* Three requests worked by hand, on one replica: r0 (arrives at 0 s, prompt 100, output 3), r1 (0
 * s, 200, 2), r2 (10 s, 100, 1). The trace's means: 2 requests over 10 s, prompts of 133 tokens
 * (400 / 3), outputs of 2. Prefills come first: r0's (P100), then r1's (P200); a decode step of
 * both, holding 300 tokens (D2, 2 sequences of 150), ends r1; one of r0, holding 101 (D1), ends
 * r0; r2's prefill at 10 s is its only token. TTFT: P100,
 * P100 + P200, P100 (mean, median P100, p99 P100 + P200); latency P100 + P200 + D2 + D1,
 * P100 + P200 + D2, P100; TPOT r0 (P200 + D2 + D1) / 2, r1 D2; the span 10 s + P100; at most 2
 * running. With batch_size 1 r1 waits for room: r0 decodes alone (holding 100, then 101 tokens:
 * D100, D1), then r1's prefill and a step holding 200 (D1'): r1's TTFT P100 + D100 + D1 + P200,
 * latency that + D1'. P and D are the schedule's prefill at batch 1 and decode step at batch n
 * (sim/infer_sim.c, as the static tests take them). The steady state's TTFT takes the trace's
 * prefills in its M/G/1 wait: lambda E[P^2] / (2 (1 - rho)), rho = lambda E[P]. */
static void test_trace_by_hand(void)
{
	const char *csv = "# three requests\narrival_s,prompt_tokens,output_tokens\n"
			  "0,100,3\n0,200,2\n\n10,100,1\n";
	for (int capped = 0; capped < 2; capped++) {
		InferScenario sc;
		InferPrediction pr;
		PxError err = {0};
		if (predict_trace(csv, capped ? "\"batch_size\": 1, " : "", &sc, &pr, &err)) {
			CU_FAIL(err.msg);
			return;
		}
		CU_ASSERT_EQUAL(sc.wl.prompt_tokens, 133);
		CU_ASSERT_EQUAL(sc.wl.output_tokens, 2);
		CU_ASSERT_DOUBLE_EQUAL(sc.wl.request_rate, 0.2, 1e-12);
		CU_ASSERT_FATAL(pr.replayed);
		double p100 = phase_s(&sc, 100, 1, 1), p200 = phase_s(&sc, 200, 1, 1);
		double d1 = step_s(&sc, 1, 101), d2 = step_s(&sc, 2, 300), d1b = step_s(&sc, 1, 200);
		double d100 = step_s(&sc, 1, 100);
		CU_ASSERT(d100 < d1 && d1 < d1b); /* a longer context, a longer step */
		const InferReplay *r = &pr.replay;
		double e = 1e-12;
		/* the steady state's M/G/1 wait takes the trace's own prefills: the mean and the mean
		 * square of P100, P200, P100 */
		const InferContinuous *cb = &pr.cb;
		double rho = 0.2 * cb->prefill_s;
		CU_ASSERT_DOUBLE_EQUAL(cb->prefill_s, (2 * p100 + p200) / 3, e);
		CU_ASSERT_DOUBLE_EQUAL(cb->prefill_sq_s2, (2 * p100 * p100 + p200 * p200) / 3, e);
		CU_ASSERT_FATAL(cb->stable);
		CU_ASSERT_DOUBLE_EQUAL(pr.ttft_s, cb->prefill_s + 0.2 * cb->prefill_sq_s2 /
				       (2 * (1 - rho)) + fmin(1, cb->concurrency) *
				       cb->decode_step_s / 2, e);
		CU_ASSERT_EQUAL(r->requests, 3);
		CU_ASSERT_DOUBLE_EQUAL(r->ttft_p50_s, p100, e);
		CU_ASSERT_DOUBLE_EQUAL(r->makespan_s, 10 + p100, e);
		if (!capped) {
			CU_ASSERT_DOUBLE_EQUAL(r->ttft_mean_s, (3 * p100 + p200) / 3, e);
			CU_ASSERT_DOUBLE_EQUAL(r->ttft_p99_s, p100 + p200, e);
			CU_ASSERT_DOUBLE_EQUAL(r->latency_mean_s,
					       (3 * p100 + 2 * p200 + 2 * d2 + d1) / 3, e);
			CU_ASSERT_DOUBLE_EQUAL(r->latency_p99_s, p100 + p200 + d2 + d1, e);
			CU_ASSERT_DOUBLE_EQUAL(r->tpot_mean_s, ((p200 + d2 + d1) / 2 + d2) / 2, e);
			CU_ASSERT_DOUBLE_EQUAL(r->tpot_p99_s, fmax((p200 + d2 + d1) / 2, d2), e);
			CU_ASSERT_EQUAL(r->peak_concurrency, 2);
			CU_ASSERT_EQUAL(r->waited_for_room, 0);
		} else {
			double ttft1 = p100 + d100 + d1 + p200;
			CU_ASSERT_DOUBLE_EQUAL(r->ttft_mean_s, (2 * p100 + ttft1) / 3, e);
			CU_ASSERT_DOUBLE_EQUAL(r->ttft_p99_s, ttft1, e);
			CU_ASSERT_DOUBLE_EQUAL(r->latency_p99_s, ttft1 + d1b, e);
			CU_ASSERT_DOUBLE_EQUAL(r->tpot_mean_s, ((d100 + d1) / 2 + d1b) / 2, e);
			CU_ASSERT_DOUBLE_EQUAL(r->tpot_p99_s, fmax((d100 + d1) / 2, d1b), e);
			CU_ASSERT_EQUAL(r->peak_concurrency, 1);
			CU_ASSERT_EQUAL(r->waited_for_room, 1);
		}
		infer_predict_free(&pr);
		infer_scenario_free(&sc);
	}
}

/* Preemption worked by hand (vLLM's recompute), the cache counted in tokens (block_size 1,
 * watermark 0: blocks are the next test's), with the GPU's usable memory cut to 14 GiB so
 * that the KV cache holds K tokens (about 2,000, read from a first replay; it depends a little on
 * the trace's mean prompt, which r2 below keeps at 1,000). With P(x) the prefill of x tokens and
 * D(x) a one-sequence decode step holding x: r0 (0 s, prompt a = K/2 rounded up, output 3) and r1
 * (1 ms, during r0's prefill; prompt b = K/2 rounded down - 1, output 3) both fit at admission
 * (a + b = K - 1 tokens, after P(a) and P(b)), but their first decode step needs 2 more: r1,
 * admitted last, is preempted (its cache freed, 1 token made) and waits first in line; r0 decodes
 * alone (D(a)), and still r1 does not fit beside it; r0's second step (D(a + 1)) ends it; r1 is
 * prefilled again over its prompt and its token (P(b + 1)), which makes its second, and one step
 * (D(b + 1)) its third. From time 0: r0's first token at P(a), its last at L0 = P(a) + P(b) +
 * D(a) + D(a + 1); r1's first at P(a) + P(b), its last at L1 = L0 + P(b + 1) + D(b + 1) (r1's
 * TTFT and latency 1 ms less); TPOTs (L0 - P(a)) / 2 and (L1 - P(a) - P(b)) / 2; one preemption,
 * at most K - 1 tokens held and 2 running. r2 (100 s, prompt c = 3,000 - a - b, output 3) comes
 * to an empty server: TTFT P(c), latency L2 = P(c) + D(c) + D(c + 1), TPOT (L2 - P(c)) / 2, the
 * last token at 100 s + L2. A prompt longer than the whole cache is refused, naming the trace and
 * the request (predict exits 2). */
static void test_trace_preemption(void)
{
	const char *cut = "\"batch_size\": null, \"block_size\": 1, \"watermark\": 0, ";
	char csv[256];
	long long k = 2000;
	InferScenario sc;
	InferPrediction pr;
	PxError err = {0};
	for (int tries = 0;; tries++) {
		snprintf(csv, sizeof(csv), "arrival_s,prompt_tokens,output_tokens\n0,%lld,3\n"
			 "0.001,%lld,3\n100,%lld,3\n", k - k / 2, k / 2 - 1, 3000 - k + 1);
		if (predict_trace_on(csv, cut, 14, &sc, &pr, &err)) {
			CU_FAIL(err.msg);
			return;
		}
		if (pr.replay.kv_tokens == k || tries == 3)
			break;
		k = pr.replay.kv_tokens;
		infer_predict_free(&pr);
		infer_scenario_free(&sc);
	}
	CU_ASSERT_EQUAL_FATAL(pr.replay.kv_tokens, k);
	CU_ASSERT_EQUAL(sc.wl.prompt_tokens, 1000);
	long long a = k - k / 2, b = k / 2 - 1, c = 3000 - k + 1;
	CU_ASSERT_FATAL(a + b <= k && a + b + 2 > k && c > 0 && c + 2 < a + b);
	double pa = phase_s(&sc, a, 1, 1), pb = phase_s(&sc, b, 1, 1), pc = phase_s(&sc, c, 1, 1);
	double e = 1e-12;
	const InferReplay *r = &pr.replay;
	CU_ASSERT_EQUAL(r->preemptions, 1);
	CU_ASSERT_EQUAL(r->peak_kv_tokens, a + b);
	CU_ASSERT_EQUAL(r->peak_concurrency, 2);
	CU_ASSERT_EQUAL(r->waited_for_room, 0);
	double pb1 = phase_s(&sc, b + 1, 1, 1);
	double l0 = pa + pb + step_s(&sc, 1, a) + step_s(&sc, 1, a + 1);
	double l1 = l0 + pb1 + step_s(&sc, 1, b + 1);
	double l2 = pc + step_s(&sc, 1, c) + step_s(&sc, 1, c + 1);
	CU_ASSERT_FATAL(l1 - 0.001 > l2);
	CU_ASSERT_DOUBLE_EQUAL(r->ttft_mean_s, (pa + pa + pb - 0.001 + pc) / 3, e);
	CU_ASSERT_DOUBLE_EQUAL(r->latency_mean_s, (l0 + l1 - 0.001 + l2) / 3, e);
	CU_ASSERT_DOUBLE_EQUAL(r->latency_p99_s, l1 - 0.001, e);
	CU_ASSERT_DOUBLE_EQUAL(r->tpot_mean_s,
			       ((l0 - pa) / 2 + (l1 - pa - pb) / 2 + (l2 - pc) / 2) / 3, e);
	CU_ASSERT_DOUBLE_EQUAL(r->makespan_s, 100 + l2, e);
	infer_predict_free(&pr);
	infer_scenario_free(&sc);
	/* a prompt the empty cache cannot hold: refused, naming the trace and the request */
	snprintf(csv, sizeof(csv), "arrival_s,prompt_tokens,output_tokens\n0,10,3\n1,%lld,3\n",
		 2 * k);
	CU_ASSERT_EQUAL(predict_trace_on(csv, cut, 14, &sc, &pr, &err), -1);
	PX_ASSERT_HAS(err.msg, "tr.csv: request 2 (prompt");
	PX_ASSERT_HAS(err.msg, "longer than the KV cache's");
	CU_ASSERT_EQUAL(px_test_run_clif(out, sizeof(out), "predict '%s' --no-db", trace_scenario),
			2);
	PX_ASSERT_HAS(out, "longer than the KV cache's");
}

/* vLLM's paged cache worked by hand (block_size 16; vLLM's BlockSpaceManager: a sequence of c
 * tokens takes ceil(c / 16) blocks, can_allocate admits a prompt only when the blocks it needs
 * leave int(watermark x all) free, can_append_slots needs a new block for each sequence whose
 * last block is full). The GPU's memory cut to 14 GiB as in the test before: T blocks (read from
 * a first replay). r0 (0 s, prompt a = 16 m + 1, m = T / 2: m + 1 blocks, its last holding one
 * token) and r1 (1 ms, prompt b = 16 (T - m - 1): whole blocks) take all T blocks; counted in
 * tokens (a + b = 16 T - 15) both would decode, but r1's next token needs a block and none is
 * free: with watermark 0, r1 (admitted last) is preempted before the first step, and the rest
 * runs as the test before's: L0 = P(a) + P(b) + D(a) + D(a + 1), L1 = L0 + P(b + 1) + D(b + 1),
 * at most T blocks taken.
 * With watermark 0.01 (int(0.01 T) = 1 block) r1 is not admitted beside r0 (0 blocks would be
 * left free): it waits for room, r0 runs alone (L0' = P(a) + D(a) + D(a + 1)), then r1 (its last
 * token at L0' + P(b) + D(b) + D(b + 1)); no preemption, and at most the largest of the three
 * requests' ceil((prompt + 2) / 16) blocks taken. r2 (100 s, prompt c = 3,000 - a - b) keeps the
 * trace's mean prompt, and so the room, fixed. */
static void test_trace_blocks(void)
{
	char csv[256];
	long long blocks = 125;
	InferScenario sc;
	InferPrediction pr;
	PxError err = {0};
	for (int wm = 0; wm < 2; wm++) {
		const char *workload = wm ? "\"watermark\": 0.01, " : "\"watermark\": 0, ";
		long long m = 0, a = 0, b = 0;
		for (int tries = 0;; tries++) {
			m = blocks / 2, a = 16 * m + 1, b = 16 * (blocks - m - 1);
			snprintf(csv, sizeof(csv), "arrival_s,prompt_tokens,output_tokens\n0,%lld,3\n"
				 "0.001,%lld,3\n100,%lld,3\n", a, b, 3000 - a - b);
			if (predict_trace_on(csv, workload, 14, &sc, &pr, &err)) {
				CU_FAIL(err.msg);
				return;
			}
			if (pr.replay.kv_blocks == blocks || tries == 3)
				break;
			blocks = pr.replay.kv_blocks;
			infer_predict_free(&pr);
			infer_scenario_free(&sc);
		}
		const InferReplay *r = &pr.replay;
		CU_ASSERT_EQUAL_FATAL(r->kv_blocks, blocks);
		CU_ASSERT_EQUAL(r->block, 16);
		CU_ASSERT_EQUAL(r->kv_blocks, r->kv_tokens / 16);
		CU_ASSERT_EQUAL(sc.wl.prompt_tokens, 1000);
		CU_ASSERT_FATAL(blocks >= 100 && blocks < 200); /* int(0.01 T) is 1 */
		double pa = phase_s(&sc, a, 1, 1), pb = phase_s(&sc, b, 1, 1), e = 1e-12;
		double da = step_s(&sc, 1, a), da1 = step_s(&sc, 1, a + 1);
		double l0 = wm ? pa + da + da1 : pa + pb + da + da1;
		double l1 = wm ? l0 + pb + step_s(&sc, 1, b) + step_s(&sc, 1, b + 1) :
				 l0 + phase_s(&sc, b + 1, 1, 1) + step_s(&sc, 1, b + 1);
		double ttft1 = wm ? l0 + pb : pa + pb;
		long long c = 3000 - a - b;
		double pc = phase_s(&sc, c, 1, 1);
		double l2 = pc + step_s(&sc, 1, c) + step_s(&sc, 1, c + 1);
		CU_ASSERT_EQUAL(r->preemptions, wm ? 0 : 1);
		CU_ASSERT_EQUAL(r->waited_for_room, wm ? 1 : 0);
		CU_ASSERT_EQUAL(r->peak_concurrency, wm ? 1 : 2);
		/* one at a time with the watermark: each takes ceil((prompt + 2) / 16) at its end */
		long long alone = (a + 2 + 15) / 16;
		alone = (b + 2 + 15) / 16 > alone ? (b + 2 + 15) / 16 : alone;
		alone = (c + 2 + 15) / 16 > alone ? (c + 2 + 15) / 16 : alone;
		CU_ASSERT_EQUAL(r->peak_kv_blocks, wm ? alone : blocks);
		CU_ASSERT_DOUBLE_EQUAL(r->ttft_mean_s, (pa + ttft1 - 0.001 + pc) / 3, e);
		CU_ASSERT_DOUBLE_EQUAL(r->latency_p99_s, l1 - 0.001, e);
		CU_ASSERT_DOUBLE_EQUAL(r->latency_mean_s, (l0 + l1 - 0.001 + l2) / 3, e);
		CU_ASSERT_DOUBLE_EQUAL(r->makespan_s, 100 + l2, e);
		infer_predict_free(&pr);
		infer_scenario_free(&sc);
	}
	/* the keys belong to continuous batching */
	char text[2048];
	snprintf(text, sizeof(text), CB, px_test_path("scenarios/models/llama-2-7b.json"),
		 "\"block_size\": 32,");
	const char *path = write_tmp("blk.json", text);
	CU_ASSERT_EQUAL(px_test_run_clif(out, sizeof(out), "predict '%s' --no-db", path), 2);
	PX_ASSERT_HAS(out, "workload.block_size: applies to \"batching\": \"continuous\" only");
}

/* A long trace of fixed lengths (prompt 512, output 128) arriving as a Poisson process at 3
 * requests/s (exponential gaps from a fixed linear congruential sequence, 4000 requests) is the
 * steady state's own assumption: replayed, its mean TPOT, latency and TTFT agree with the
 * steady state at the trace's rate within 5%, 5% and 10% (measured when written: +1.6%, +1.5%,
 * +0.2%; before the steady state counted the decode step in progress when a prompt arrives, its
 * TTFT was 28% below the replay's); the trace's tokens/s equal its offered load within 2%. */
static void test_trace_steady_state(void)
{
	enum { N = 4000 };
	static char csv[N * 32 + 64];
	size_t at = (size_t)snprintf(csv, sizeof(csv), "arrival_s,prompt_tokens,output_tokens\n");
	unsigned long long x = 12345;
	double t = 0;
	for (int i = 0; i < N; i++) {
		x = x * 6364136223846793005ULL + 1442695040888963407ULL;
		double u = ((double)(x >> 11) + 0.5) / 9007199254740992.0;
		t += -log(u) / 3.0;
		at += (size_t)snprintf(csv + at, sizeof(csv) - at, "%.6f,512,128\n", t);
	}
	InferScenario sc;
	InferPrediction pr;
	PxError err = {0};
	if (predict_trace(csv, "", &sc, &pr, &err)) {
		CU_FAIL(err.msg);
		return;
	}
	CU_ASSERT_FATAL(pr.cb.stable && pr.replayed);
	const InferReplay *r = &pr.replay;
	CU_ASSERT_DOUBLE_EQUAL(r->tpot_mean_s, pr.tpot_s, 0.05 * pr.tpot_s);
	CU_ASSERT_DOUBLE_EQUAL(r->latency_mean_s, pr.latency_s, 0.05 * pr.latency_s);
	CU_ASSERT_DOUBLE_EQUAL(r->ttft_mean_s, pr.ttft_s, 0.10 * pr.ttft_s);
	double offered = (double)N * 128 / r->makespan_s;
	CU_ASSERT_DOUBLE_EQUAL(r->tokens_per_s_gpu, offered, 1e-9 * offered);
	CU_ASSERT_DOUBLE_EQUAL(offered, sc.wl.request_rate * 128, 0.02 * offered);
	printf("\n# trace of %d requests at 3/s: TPOT %.5f s (steady state %.5f), latency %.4f s "
	       "(%.4f), TTFT %.5f s (%.5f)\n", N, r->tpot_mean_s, pr.tpot_s, r->latency_mean_s,
	       pr.latency_s, r->ttft_mean_s, pr.ttft_s);
	infer_predict_free(&pr);
	infer_scenario_free(&sc);
}

/* A bad trace names the trace file, its line and the column, under the scenario's key; a trace
 * beside the keys it replaces, or on a static batch, is refused naming the key; exit 2. */
static void test_trace_bad_input(void)
{
	static const struct { const char *csv, *workload, *says; } bad[] = {
		{"arrival_s,prompt_tokens,output_tokens\n0,10,5\n2,10,5\n1,10,5\n", "",
		 "tr.csv:4: arrival_s: earlier than the request before it"},
		{"arrival,prompt_tokens,output_tokens\n0,10,5\n", "",
		 "tr.csv:1: column 1 of the header is \"arrival\""},
		{"arrival_s,prompt_tokens,output_tokens\n0,10,0\n1,10,5\n", "",
		 "tr.csv:2: output_tokens: expected a whole number from 1 to 2^24"},
		{"arrival_s,prompt_tokens,output_tokens\n0,10\n", "",
		 "tr.csv:2: expected 3 comma-separated columns"},
		{"arrival_s,prompt_tokens,output_tokens\n0,10,5\n0,10,5\n", "",
		 "expected at least 2 requests arriving at different times"},
		{"arrival_s,prompt_tokens,output_tokens\n0,10,5\n1,10,5\n", "\"request_rate\": 2, ",
		 "workload.request_rate: given beside trace"},
		/* the prefix columns (vLLM V1's prefix cache) */
		{"arrival_s,prompt_tokens,output_tokens,prefix_id,prefix_tokens\n0,10,5,1,11\n"
		 "1,10,5,0,0\n", "",
		 "tr.csv:2: prefix_tokens: expected a whole number from 0 to the request's "
		 "prompt_tokens"},
		{"arrival_s,prompt_tokens,output_tokens,prefix_id,prefix_tokens\n0,10,5,0,4\n"
		 "1,10,5,0,0\n", "", "tr.csv:2: prefix_tokens: expected 0 with prefix_id 0"},
		{"arrival_s,prompt_tokens,output_tokens,prefix_id,prefix_tokens\n0,10,5,-1,4\n", "",
		 "tr.csv:2: prefix_id: expected a whole number, 0 for none"},
		{"arrival_s,prompt_tokens,output_tokens,prefix_id,prefix_tokens\n0,10,5\n", "",
		 "tr.csv:2: expected 5 comma-separated columns"},
		{"arrival_s,prompt_tokens,output_tokens,prefix_id\n0,10,5,1\n", "",
		 "tr.csv:1: expected 3 or 5 comma-separated columns"},
		{"arrival_s,prompt_tokens,output_tokens,prefix,prefix_tokens\n0,10,5,1,4\n", "",
		 "tr.csv:1: column 4 of the header is \"prefix\""},
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		const char *path = write_pair(
			"{\"model\": \"%s\", \"cluster\": {\"gpu\": \"H100-SXM\"}, \"inference\": "
			"{\"dtype\": \"fp16\"},\n \"workload\": {\"batching\": \"continuous\", "
			"%s\"trace\": \"tr.csv\"}}", bad[i].workload, bad[i].csv);
		CU_ASSERT_EQUAL(px_test_run_clif(out, sizeof(out), "predict '%s' --no-db", path), 2);
		PX_ASSERT_HAS(out, bad[i].says);
		PX_ASSERT_HAS(out, "tr.json:2:");
	}
	const char *path = write_pair("{\"model\": \"%s\", \"cluster\": {\"gpu\": \"H100-SXM\"}, "
				      "\"inference\": {\"dtype\": \"fp16\"},\n \"workload\": {%s"
				      "\"trace\": \"tr.csv\"}}", "", bad[0].csv);
	CU_ASSERT_EQUAL(px_test_run_clif(out, sizeof(out), "predict '%s' --no-db", path), 2);
	PX_ASSERT_HAS(out, "workload.trace: applies to \"batching\": \"continuous\" only");
}

int test_serve_register(void)
{
	return PX_ADD_SUITE("serve",
			    {"sweep: a point equals predict of its scenario",
			     test_sweep_point_equals_predict},
			    {"sweep: training and unknown keys refused", test_sweep_refuses_bad_keys},
			    {"plan: the cheaper cluster that serves the target",
			     test_plan_serving_choice},
			    {"plan: the other kind's keys and flags refused",
			     test_plan_refuses_other_kind},
			    {"plot serving: series, left-out batches, predict's figures",
			     test_plot_serving},
			    {"continuous batching: Little's law against static batches",
			     test_continuous_little},
			    {"continuous batching: bad input", test_continuous_bad_input},
			    {"a trace replayed: three requests by hand", test_trace_by_hand},
			    {"a trace replayed: a preemption by hand", test_trace_preemption},
			    {"a trace replayed: vLLM's blocks and watermark by hand", test_trace_blocks},
			    {"a trace replayed: a Poisson trace against the steady state",
			     test_trace_steady_state},
			    {"a trace replayed: bad traces", test_trace_bad_input});
}

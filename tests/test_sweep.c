/* Sweeps: every point priced and stored once, refused points kept with DeepSpeed's reason,
 * resume after an interruption without repeating or losing points, shards that merge into the
 * whole, and the ranking. Through the real binary (PX_BIN). */
#include <CUnit/CUnit.h>
#include <cjson/cJSON.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../sim/sweep.h"
#include "suites.h"

static char dir[256];

/* 4 stages x 2 tp x 3 pp = 24 points on the bundled GPT-3 13B base: pipelining with ZeRO 2-3 is
 * refused (2 stages x 2 tp x 2 pp = 8 points). */
static const char *sweep_file(void)
{
	static char path[512];
	char text[2048];
	snprintf(dir, sizeof(dir), "%s", px_test_tmpdir());
	snprintf(path, sizeof(path), "%s/sweep.json", dir);
	snprintf(text, sizeof(text),
		 "{\"name\": \"t\", \"scenario\": \"%s\", \"prices\": \"%s\", \"top\": 3,"
		 " \"axes\": {\"deepspeed.zero_optimization.stage\": [0, 1, 2, 3],"
		 " \"parallelism.tp\": [1, 8], \"parallelism.pp\": [1, 2, 4]}}",
		 px_test_path("scenarios/sweeps/gpt3-13b-64xa100-base.json"),
		 px_test_path("scenarios/prices.json"));
	px_test_write_file(path, text);
	return path;
}

static double q(const char *db_path, const char *sql)
{
	sqlite3 *db;
	sqlite3_stmt *st;
	double v = -1;
	if (sqlite3_open_v2(db_path, &db, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK &&
	    sqlite3_prepare_v2(db, sql, -1, &st, NULL) == SQLITE_OK) {
		if (sqlite3_step(st) == SQLITE_ROW)
			v = sqlite3_column_double(st, 0);
		sqlite3_finalize(st);
	}
	sqlite3_close(db);
	return v;
}

static void test_all_points_stored(void)
{
	char args[2048], out[65536], db[512];
	const char *sw = sweep_file();
	snprintf(db, sizeof(db), "%s/all.db", dir);
	snprintf(args, sizeof(args), "sweep '%s' --db '%s' --jobs 2", sw, db);
	CU_ASSERT_EQUAL_FATAL(px_test_run_cli(args, out, sizeof(out)), 0);
	CU_ASSERT_EQUAL(q(db, "SELECT count(*) FROM sweep_points"), 24);
	CU_ASSERT_EQUAL(q(db, "SELECT count(DISTINCT idx) FROM sweep_points"), 24);
	CU_ASSERT_EQUAL(q(db, "SELECT count(*) FROM sweep_points WHERE status = 'invalid' AND "
			  "note LIKE '%incompatible with pipeline parallelism%'"), 8);
	/* a priced point has its time; one that does not fit is not timed */
	CU_ASSERT_EQUAL(q(db, "SELECT count(*) FROM sweep_points WHERE status = 'ok' AND "
			  "(step_s IS NULL OR tokens_per_s <= 0)"), 0);
	CU_ASSERT_EQUAL(q(db, "SELECT count(*) FROM sweep_points WHERE status = 'oom' AND "
			  "step_s IS NOT NULL"), 0);
	/* index 0 is the first value of every axis; the last axis varies fastest */
	CU_ASSERT(q(db, "SELECT count(*) FROM sweep_points WHERE idx = 1 AND config = "
		    "'{\"deepspeed.zero_optimization.stage\": 0, \"parallelism.tp\": 1, "
		    "\"parallelism.pp\": 2}'") == 1);
	/* the printed ranking: best first by tokens/s, matching the database's own order */
	double best = q(db, "SELECT idx FROM sweep_points WHERE status = 'ok' ORDER BY "
			"tokens_per_s DESC, idx LIMIT 1");
	char want[64];
	snprintf(want, sizeof(want), "   1 %8.0f ", best);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, want));
	/* running it again adds nothing: every point is there */
	CU_ASSERT_EQUAL(px_test_run_cli(args, out, sizeof(out)), 0);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "24 points already"));
	CU_ASSERT_EQUAL(q(db, "SELECT count(*) FROM sweep_points"), 24);
	CU_ASSERT_EQUAL(q(db, "SELECT count(*) FROM sweeps"), 1);
}

/* Shards 0/3, 1/3, 2/3 into three databases; merged, they are the whole sweep, each point once,
 * equal to the unsharded run's values. A shard re-run after "losing" half its points (an
 * interruption) prices only the missing ones. */
static void test_shard_merge_resume(void)
{
	char args[4096], out[65536], db[3][512], all[512], merged[512];
	const char *sw = sweep_file();
	snprintf(all, sizeof(all), "%s/all.db", dir);
	snprintf(merged, sizeof(merged), "%s/merged.db", dir);
	snprintf(args, sizeof(args), "sweep '%s' --db '%s' --jobs 1", sw, all);
	CU_ASSERT_EQUAL_FATAL(px_test_run_cli(args, out, sizeof(out)), 0);
	for (int i = 0; i < 3; i++) {
		snprintf(db[i], sizeof(db[i]), "%s/s%d.db", dir, i);
		snprintf(args, sizeof(args), "sweep '%s' --db '%s' --shard %d/3 --jobs 1", sw, db[i], i);
		CU_ASSERT_EQUAL_FATAL(px_test_run_cli(args, out, sizeof(out)), 0);
		CU_ASSERT_EQUAL(q(db[i], "SELECT count(*) FROM sweep_points"), 8);
		char mine[128];
		snprintf(mine, sizeof(mine), "SELECT count(*) FROM sweep_points WHERE idx %% 3 != %d", i);
		CU_ASSERT_EQUAL(q(db[i], mine), 0); /* only its own points */
	}
	/* an interrupted shard: drop half, run again, only those are priced */
	char sql[1024];
	snprintf(sql, sizeof(sql), "sqlite3 '%s' 'DELETE FROM sweep_points WHERE idx %% 2 = 0'", db[0]);
	CU_ASSERT_EQUAL(system(sql), 0);
	CU_ASSERT(q(db[0], "SELECT count(*) FROM sweep_points") < 8);
	snprintf(args, sizeof(args), "sweep '%s' --db '%s' --shard 0/3 --jobs 1", sw, db[0]);
	CU_ASSERT_EQUAL_FATAL(px_test_run_cli(args, out, sizeof(out)), 0);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "resuming"));
	CU_ASSERT_EQUAL(q(db[0], "SELECT count(*) FROM sweep_points"), 8);

	snprintf(args, sizeof(args), "merge '%s' '%s' '%s' '%s'", merged, db[0], db[1], db[2]);
	CU_ASSERT_EQUAL_FATAL(px_test_run_cli(args, out, sizeof(out)), 0);
	CU_ASSERT_EQUAL(q(merged, "SELECT count(*) FROM sweep_points"), 24);
	CU_ASSERT_EQUAL(q(merged, "SELECT count(DISTINCT idx) FROM sweep_points"), 24);
	CU_ASSERT_EQUAL(q(merged, "SELECT count(*) FROM sweeps"), 1);
	/* the same values as the unsharded sweep */
	snprintf(sql, sizeof(sql), "ATTACH '%s' AS a", all);
	double same = -1;
	sqlite3 *h;
	sqlite3_stmt *st;
	if (sqlite3_open(merged, &h) == SQLITE_OK && sqlite3_exec(h, sql, NULL, NULL, NULL) == SQLITE_OK &&
	    sqlite3_prepare_v2(h, "SELECT count(*) FROM sweep_points m JOIN a.sweep_points x USING "
			       "(idx) WHERE m.status = x.status AND m.config = x.config AND "
			       "(m.step_s IS x.step_s)", -1, &st, NULL) == SQLITE_OK) {
		if (sqlite3_step(st) == SQLITE_ROW)
			same = sqlite3_column_double(st, 0);
		sqlite3_finalize(st);
	}
	sqlite3_close(h);
	CU_ASSERT_EQUAL(same, 24);
	/* merging a missing file is refused */
	snprintf(args, sizeof(args), "merge '%s' '%s/none.db'", merged, dir);
	CU_ASSERT_EQUAL(px_test_run_cli(args, out, sizeof(out)), 2);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "cannot open"));
}

static void test_bad_sweeps(void)
{
	char args[2048], out[8192], path[512];
	snprintf(dir, sizeof(dir), "%s", px_test_tmpdir());
	snprintf(path, sizeof(path), "%s/bad.json", dir);
	px_test_write_file(path, "{\"scenario\": \"nowhere.json\", \"axes\": {\"a\": [1]}}");
	snprintf(args, sizeof(args), "sweep '%s' --no-db", path);
	CU_ASSERT_EQUAL(px_test_run_cli(args, out, sizeof(out)), 2);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "nowhere.json: cannot open"));
	px_test_write_file(path, "{\"scenario\": \"x.json\", \"axes\": {\"a\": []}}");
	CU_ASSERT_EQUAL(px_test_run_cli(args, out, sizeof(out)), 2);
	snprintf(args, sizeof(args), "sweep '%s' --no-db --shard 3/3", sweep_file());
	CU_ASSERT_EQUAL(px_test_run_cli(args, out, sizeof(out)), 2);
}

/* parallax plan on a small case: 2 GPU types x 2 sizes for GPT-3 13B. Worked from its own table:
 * days = tokens / tokens_per_s / 86400, cost = USD per GPU-hour (scenarios/prices.json: A100-80GB
 * 5.12, H100-SXM 12.29) x GPUs x hours, and the winner is the cheapest cell within the deadline. */
static void test_plan_choice(void)
{
	char path[512], args[1024], out[65536];
	snprintf(dir, sizeof(dir), "%s", px_test_tmpdir());
	snprintf(path, sizeof(path), "%s/plan.json", dir);
	char text[2048], cp[1400];
	/* the price list beside the plan, as plan files name it */
	snprintf(cp, sizeof(cp), "cp '%s' '%s/prices.json'", px_test_path("scenarios/prices.json"), dir);
	CU_ASSERT_EQUAL_FATAL(system(cp), 0);
	snprintf(text, sizeof(text),
		 "{\"scenario\": \"%s\", \"tokens\": 1e11, \"deadline_days\": 20,"
		 " \"gpus\": [\"A100-80GB\", \"H100-SXM\"], \"nodes\": [4, 8],"
		 " \"prices\": \"prices.json\", \"search\": {\"deepspeed.zero_optimization.stage\":"
		 " [1, 2, 3], \"deepspeed.train_micro_batch_size_per_gpu\": [1, 2]}}",
		 px_test_path("scenarios/sweeps/gpt3-13b-64xa100-base.json"));
	px_test_write_file(path, text);
	snprintf(args, sizeof(args), "plan '%s' --json", path);
	CU_ASSERT_EQUAL_FATAL(px_test_run_cli(args, out, sizeof(out)), 0);
	cJSON *j = cJSON_Parse(out);
	CU_ASSERT_PTR_NOT_NULL_FATAL(j);
	const cJSON *cells = cJSON_GetObjectItem(j, "cells");
	CU_ASSERT_EQUAL(cJSON_GetArraySize(cells), 4);
	int best = -1, i = 0;
	double best_cost = 0;
	for (const cJSON *c = cells->child; c; c = c->next, i++) {
		const char *gpu = cJSON_GetObjectItem(c, "gpu")->valuestring;
		double gpus = cJSON_GetObjectItem(c, "gpus")->valuedouble;
		CU_ASSERT(cJSON_IsTrue(cJSON_GetObjectItem(c, "fits")));
		double tps = cJSON_GetObjectItem(c, "tokens_per_s")->valuedouble;
		double days = cJSON_GetObjectItem(c, "days")->valuedouble;
		double cost = cJSON_GetObjectItem(c, "cost_usd")->valuedouble;
		double price = !strcmp(gpu, "H100-SXM") ? 12.29 : 5.12;
		CU_ASSERT_DOUBLE_EQUAL(days, 1e11 / tps / 86400, 1e-9 * days);
		CU_ASSERT_DOUBLE_EQUAL(cost, price * gpus * 1e11 / tps / 3600, 1e-9 * cost);
		if (days <= 20 && (best < 0 || cost < best_cost))
			best = i, best_cost = cost;
	}
	CU_ASSERT_EQUAL(cJSON_GetObjectItem(j, "winner")->valuedouble, best);
	cJSON_Delete(j);
}

/* A sweep over the base 13B scenario with these axes (JSON members), priced point by point in
 * full (sweep_eval) and through the memo (sweep_eval_memo): every field equal, bit for bit; the
 * memo's counts of results taken and of those taken before a point's scenario was read. */
static void check_memo(const char *axes, long long n_points, long long taken, long long unread)
{
	char path[512], text[2048];
	Sweep sw;
	PxError err = {0};
	snprintf(path, sizeof(path), "%s/memo.json", px_test_tmpdir());
	snprintf(text, sizeof(text), "{\"name\": \"memo\", \"scenario\": \"%s\", \"prices\": \"%s\","
		 " \"axes\": {%s}}", px_test_path("scenarios/sweeps/gpt3-13b-64xa100-base.json"),
		 px_test_path("scenarios/prices.json"), axes);
	px_test_write_file(path, text);
	CU_ASSERT_EQUAL_FATAL(sweep_load(&sw, path, &err), 0);
	CU_ASSERT_EQUAL(sw.n_points, n_points);
	SweepMemo *m = sweep_memo_create();
	CU_ASSERT_PTR_NOT_NULL_FATAL(m);
	int ok = 0;
	for (long long i = 0; i < sw.n_points; i++) {
		PointResult a, b;
		CU_ASSERT_EQUAL_FATAL(sweep_eval(&sw, i, &a, &err), 0);
		CU_ASSERT_EQUAL_FATAL(sweep_eval_memo(&sw, m, i, &b, &err), 0);
		CU_ASSERT(a.idx == b.idx && a.status == b.status && a.world == b.world);
		CU_ASSERT_STRING_EQUAL(a.gpu, b.gpu);
		CU_ASSERT_STRING_EQUAL(a.note, b.note);
		CU_ASSERT_STRING_EQUAL(a.config, b.config);
		/* bit for bit */
		CU_ASSERT(!memcmp(&a.peak_bytes, &b.peak_bytes, sizeof(a.peak_bytes)));
		CU_ASSERT(!memcmp(&a.capacity_bytes, &b.capacity_bytes, sizeof(a.capacity_bytes)));
		CU_ASSERT(!memcmp(&a.step_s, &b.step_s, sizeof(a.step_s)));
		CU_ASSERT(!memcmp(&a.tokens_per_s, &b.tokens_per_s, sizeof(a.tokens_per_s)));
		CU_ASSERT(!memcmp(&a.mfu, &b.mfu, sizeof(a.mfu)));
		CU_ASSERT(!memcmp(&a.cost_per_mtoken, &b.cost_per_mtoken, sizeof(a.cost_per_mtoken)));
		ok += a.status == PT_OK;
	}
	CU_ASSERT(ok > 0); /* the shared results include timed ones */
	long long got_unread;
	CU_ASSERT_EQUAL(sweep_memo_taken(m, &got_unread), taken);
	CU_ASSERT_EQUAL(got_unread, unread);
	sweep_memo_destroy(m);
	sweep_free(&sw);
}

/* Points differing only in axes their ZeRO stage does not read take an earlier point's result
 * (sweep_eval_memo): every field equal to pricing each in full (sweep_eval). 4 stages x 2 tp x
 * 3 prefetch buckets (5e7, "auto", 5e8) x contiguous gradients on and off, 48 points, contiguous
 * gradients fastest. Counted by hand, per tp: at stage 0 the two contiguous settings share (3
 * pairs: 3 taken) and 5e8 shares with 5e7 (1 more: 4 taken), while "auto" is resolved at any
 * stage and shares only with its own pair; at stage 1 and 2 contiguous gradients are read (the
 * buffers of stage 1's reductions, build_alloc_buckets), 5e8 shares with 5e7 (2 taken each);
 * at stage 3 every axis is read. 2 x (4 + 2 + 2) = 16 taken.
 * Of those, all but two are taken before the point's scenario is read: a value is known to
 * read plainly once a point has read it unread, and at stage 0, tp 1, (5e7, false) and (5e8,
 * true) are the first to hold false and 5e8 there.
 * overlap_comm is read by the ZeRO optimizers' reductions alone (engine/streams.h; without ZeRO
 * DeepSpeed's engine reduces after the backward on the compute stream): stages 0 and 1 x 2 tp x
 * overlap_comm off and on, 8 points, overlap_comm fastest; at stage 0 the two settings share,
 * "true" taken once per tp: at tp 1 only once its scenario is read (no point had read true
 * unread yet), at tp 8 before: 2 taken, 1 of them before reading.
 * reduce_bucket_size likewise (without ZeRO DeepSpeed's engine buckets by 5e8 elements of its
 * own, build_engine_allreduce): stages 0 and 1 x 2 tp x (2e8, 5e8, "auto"), 12 points; at
 * stage 0 5e8 shares with 2e8 ("auto" is resolved from the hidden size at any stage and reads):
 * 2 taken, 1 of them before reading, as overlap_comm's. */
static void test_memo_equals_full(void)
{
	check_memo("\"deepspeed.zero_optimization.stage\": [0, 1, 2, 3],"
		   " \"parallelism.tp\": [1, 8],"
		   " \"deepspeed.zero_optimization.stage3_prefetch_bucket_size\": [5e7, \"auto\", 5e8],"
		   " \"deepspeed.zero_optimization.contiguous_gradients\": [true, false]",
		   48, 16, 14);
	check_memo("\"deepspeed.zero_optimization.stage\": [0, 1], \"parallelism.tp\": [1, 8],"
		   " \"deepspeed.zero_optimization.overlap_comm\": [false, true]", 8, 2, 1);
	check_memo("\"deepspeed.zero_optimization.stage\": [0, 1], \"parallelism.tp\": [1, 8],"
		   " \"deepspeed.zero_optimization.reduce_bucket_size\": [2e8, 5e8, \"auto\"]", 12, 2,
		   1);
}

int test_sweep_register(void)
{
	return PX_ADD_SUITE("sweep", {"every point stored once, refusals kept", test_all_points_stored},
			    {"shards merge into the whole; resume", test_shard_merge_resume},
			    {"bad sweeps", test_bad_sweeps},
			    {"plan picks the cheapest within the deadline", test_plan_choice},
			    {"results shared across unread axes equal full pricing",
			     test_memo_equals_full});
}

/* The results database as a user meets it, through the binary: pruning old runs, sweeps'
 * summaries and best points read back from what is stored (sweep --show, reruns, shards and
 * merges), and compare with time beside memory. Each test works in its own directory and
 * database. */
#include <CUnit/CUnit.h>
#include <cjson/cJSON.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../db/db.h"
#include "suites.h"

static char out[1 << 16];
static char dir[512];

#define run(...) px_test_run_clif(out, sizeof(out), __VA_ARGS__)
#define ASSERT_HAS(needle) PX_ASSERT_HAS(out, (needle))

static long long db_int(const char *path, const char *sql)
{
	sqlite3 *db = NULL;
	sqlite3_stmt *st = NULL;
	long long v = -1;
	if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK &&
	    sqlite3_prepare_v2(db, sql, -1, &st, NULL) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW)
		v = sqlite3_column_int64(st, 0);
	sqlite3_finalize(st);
	sqlite3_close(db);
	return v;
}

/* dir/name (static buffer, four in rotation) */
static const char *at(const char *name)
{
	static char bufs[4][1024];
	static int next;
	char *b = bufs[next++ % 4];
	snprintf(b, sizeof(bufs[0]), "%s/%s", dir, name);
	return b;
}

/* ---- prune ---- */

/* Three predictions stored, prune --keep 1 leaves the newest; bad arguments are refused with
 * exit 2 and nothing touched; a database that is not there is not created. */
static void test_prune_cli(void)
{
	char path[1024];
	snprintf(dir, sizeof(dir), "%s", px_test_tmpdir());
	snprintf(path, sizeof(path), "%s", px_test_path("scenarios/llama2-7b-zero2-h100.json"));
	for (int i = 0; i < 3; i++)
		CU_ASSERT_EQUAL(run("predict '%s' --db '%s'", path, at("r.db")), 0);
	CU_ASSERT_EQUAL(db_int(at("r.db"), "SELECT count(*) FROM runs"), 3);
	CU_ASSERT_EQUAL(run("prune --keep 0 --db '%s'", at("r.db")), 2);
	ASSERT_HAS("parallax prune: --keep 0: expected a number of runs (1 or more)");
	CU_ASSERT_EQUAL(run("prune --before 2026-02-30x --db '%s'", at("r.db")), 2);
	ASSERT_HAS("--before 2026-02-30x: expected a UTC date, YYYY-MM-DD or YYYY-MM-DDTHH:MM:SSZ");
	CU_ASSERT_EQUAL(run("prune --keep 1 --before 2026-01-01 --db '%s'", at("r.db")), 2);
	ASSERT_HAS("give one of --keep N and --before DATE");
	CU_ASSERT_EQUAL(db_int(at("r.db"), "SELECT count(*) FROM runs"), 3);
	CU_ASSERT_EQUAL(run("prune --keep 1 --db '%s'", at("r.db")), 0);
	ASSERT_HAS("# removed 2 run(s) from ");
	CU_ASSERT_EQUAL(db_int(at("r.db"), "SELECT id FROM runs"), 3);
	CU_ASSERT_EQUAL(run("prune --keep 1 --db '%s'", at("none.db")), 2);
	CU_ASSERT_NOT_EQUAL(access(at("none.db"), F_OK), 0);
}

/* ---- sweeps read back from the database ---- */

/* out without the lines that depend on the invocation (timing, resuming, where it was stored) */
static void stable_lines(char *buf, size_t n)
{
	char tmp[sizeof(out)];
	size_t len = 0;
	for (char *line = out, *next; line && *line; line = next) {
		next = strchr(line, '\n');
		size_t l = next ? (size_t)(next - line) + 1 : strlen(line);
		char one[4096];
		snprintf(one, sizeof(one), "%.*s", (int)l, line); /* strstr within this line only */
		if (next)
			next++;
		if (strncmp(one, "# resuming", 10) && !strstr(one, "points priced in") &&
		    strncmp(one, "# stored in", 11) && len + l < sizeof(tmp)) {
			memcpy(tmp + len, line, l);
			len += l;
		}
	}
	tmp[len] = '\0';
	snprintf(buf, n, "%s", tmp);
}

/* The bundled 384-point sweep in one run, and again as two shards into one database, a rerun and
 * a merge: every invocation prints the whole stored sweep's summary and best points, which are
 * those of the one full run (before: a rerun printed "0 priced, best 0", a shard its half). */
static void test_sweep_summary_from_store(void)
{
	static char full[sizeof(out)], got[sizeof(out)];
	char sweep[1024];
	snprintf(dir, sizeof(dir), "%s", px_test_tmpdir());
	snprintf(sweep, sizeof(sweep), "%s", px_test_path("scenarios/sweeps/small.json"));
	CU_ASSERT_EQUAL_FATAL(run("sweep '%s' --db '%s' --no-progress", sweep, at("full.db")), 0);
	stable_lines(full, sizeof(full));
	/* tight points are counted among the priced ones (tests/test_verdict.c counts them) */
	ASSERT_HAS("# gpt3-13b-small: 384 points: 226 priced (");
	ASSERT_HAS(" of them tight), 30 do not fit, 128 refused, 0 unpriced");
	CU_ASSERT_EQUAL(run("sweep '%s' --db '%s' --no-progress --shard 0/2", sweep, at("a.db")), 0);
	ASSERT_HAS("384 points, 192 stored: ");
	ASSERT_HAS("192 not priced yet");
	CU_ASSERT_EQUAL(run("sweep '%s' --db '%s' --no-progress --shard 1/2", sweep, at("a.db")), 0);
	stable_lines(got, sizeof(got));
	CU_ASSERT_STRING_EQUAL(got, full);
	CU_ASSERT_EQUAL(run("sweep '%s' --db '%s' --no-progress", sweep, at("a.db")), 0); /* rerun */
	stable_lines(got, sizeof(got));
	CU_ASSERT_STRING_EQUAL(got, full);
	/* shards in two databases, merged, then shown */
	CU_ASSERT_EQUAL(run("sweep '%s' --db '%s' --no-progress --shard 0/2", sweep, at("s0.db")), 0);
	CU_ASSERT_EQUAL(run("sweep '%s' --db '%s' --no-progress --shard 1/2", sweep, at("s1.db")), 0);
	CU_ASSERT_EQUAL(run("merge '%s' '%s' '%s'", at("m.db"), at("s0.db"), at("s1.db")), 0);
	CU_ASSERT_EQUAL(run("sweep --show gpt3-13b-small --db '%s'", at("m.db")), 0);
	stable_lines(got, sizeof(got));
	if (strcmp(got, full))
		fprintf(stderr, "\n--show:\n%s\nfull run:\n%s\n", got, full);
	CU_ASSERT_STRING_EQUAL(got, full);
	CU_ASSERT_EQUAL(run("sweep --show 1 --db '%s' --top 2 --json", at("m.db")), 0);
	cJSON *j = cJSON_Parse(out);
	CU_ASSERT_EQUAL(cJSON_GetArraySize(cJSON_GetObjectItem(j, "best")), 2);
	CU_ASSERT_EQUAL(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "counts"), "ok")->valuedouble, 226);
	cJSON_Delete(j);
	CU_ASSERT_EQUAL(run("sweep --show nope --db '%s'", at("m.db")), 2);
	ASSERT_HAS("no sweep named 'nope'; stored: gpt3-13b-small");
}

/* The best points show the settings that differ among them, a column each under its short name,
 * and the ones they share on one line; not a cut JSON text. */
static void test_sweep_differing_settings(void)
{
	char sweep[1024];
	snprintf(sweep, sizeof(sweep), "%s", px_test_path("scenarios/sweeps/small.json"));
	CU_ASSERT_EQUAL(run("sweep '%s' --no-db --no-progress --top 4", sweep), 0);
	ASSERT_HAS("free_GiB  fits  zero  micro  ckpt\n");
	ASSERT_HAS("# the same in every point shown: parallelism.tp=1 parallelism.pp=1 "
		   "cluster.gpu=H100-SXM\n");
	CU_ASSERT_PTR_NULL(strstr(out, "{\"deepspeed"));
}

/* A typo'd axis or set key is refused, naming the closest key; a whole section given as a file
 * path is read relative to the sweep file, wherever the sweep is run from. */
static void test_sweep_keys_and_paths(void)
{
	char base[1024], text[2048];
	snprintf(dir, sizeof(dir), "%s", px_test_tmpdir());
	snprintf(base, sizeof(base), "%s", px_test_path("scenarios/llama2-7b-zero2-h100.json"));
	snprintf(text, sizeof(text), "{\"name\": \"t\", \"scenario\": \"%s\", \"axes\":"
		 " {\"deepspeed.zero_optimization.stgae\": [1, 2]}}", base);
	px_test_write_file(at("typo.json"), text);
	CU_ASSERT_EQUAL(run("sweep '%s' --no-db", at("typo.json")), 2);
	ASSERT_HAS("typo.json: axes.deepspeed.zero_optimization.stgae: no scenario reader knows this "
		   "key; did you mean 'deepspeed.zero_optimization.stage'?");
	snprintf(text, sizeof(text), "{\"name\": \"t\", \"scenario\": \"%s\", \"set\":"
		 " {\"cluster.nodez\": 2}, \"axes\": {\"parallelism.tp\": [1, 2]}}", base);
	px_test_write_file(at("typo2.json"), text);
	CU_ASSERT_EQUAL(run("sweep '%s' --no-db", at("typo2.json")), 2);
	ASSERT_HAS("set.cluster.nodez: no scenario reader knows this key; did you mean "
		   "'cluster.nodes'?");
	/* models beside the sweep file, named relatively; run from the repository's root */
	px_test_write_file(at("small.json"), "{\"num_parameters\": 1e9}");
	px_test_write_file(at("large.json"), "{\"num_parameters\": 3e9}");
	snprintf(text, sizeof(text), "{\"name\": \"m\", \"scenario\": \"%s\", \"axes\":"
		 " {\"model\": [\"small.json\", \"large.json\"]}}", base);
	px_test_write_file(at("models.json"), text);
	CU_ASSERT_EQUAL(run("sweep '%s' --no-db --no-progress", at("models.json")), 0);
	ASSERT_HAS("# m: 2 points: 2 priced (0 of them tight), 0 do not fit, 0 refused, 0 unpriced");
}

/* ---- compare with time ---- */

/* A prediction (with or without a step time) and a measured run against it, written through the
 * database's own writer; returns the measured run's id. */
static long long stored_pair(const char *path, int predicted_time)
{
	const DbMetric pred_t[] = {{0, "memory.gpu.peak_bytes", 1000, "bytes"},
				   {0, "time.step_s", 0.5, "s"}};
	const DbMetric meas[] = {{0, "memory.gpu.peak_bytes", 1000, "bytes"},
				 {0, "time.step_s", 0.6, "s"}};
	PxDb *db;
	PxError err;
	long long pid = 0, mid = 0;
	CU_ASSERT_EQUAL_FATAL(db_open(path, &db, &err), 0);
	DbRun run = {.scenario_name = "t", .scenario_json = "{}", .kind = "predicted",
		     .status = "ok", .metrics = pred_t, .n_metrics = predicted_time ? 2 : 1,
		     .notes = predicted_time ? NULL : "step time not priced: backend cpu: no "
						      "CPU profile\n"};
	CU_ASSERT_EQUAL(db_write_run(db, &run, &pid, &err), 0);
	run = (DbRun){.scenario_name = "t", .scenario_json = "{}", .kind = "measured",
		      .status = "ok", .predicted_run_id = pid, .metrics = meas, .n_metrics = 2};
	CU_ASSERT_EQUAL(db_write_run(db, &run, &mid, &err), 0);
	db_close(db);
	return mid;
}

/* compare shows the step time paired with its prediction and error ((0.6 - 0.5) / 0.5 = 20%),
 * and a step time the prediction has not, with the prediction's reason; plot compare likewise
 * puts the paired time among the errors and the unpaired one in the title. */
static void test_compare_time(void)
{
	snprintf(dir, sizeof(dir), "%s", px_test_tmpdir());
	long long id = stored_pair(at("paired.db"), 1);
	CU_ASSERT_EQUAL(run("compare %lld --db '%s'", id, at("paired.db")), 0);
	ASSERT_HAS("time.step_s                                 s                0.5                "
		   "0.6    20.0000%");
	CU_ASSERT_PTR_NULL(strstr(out, "not predicted"));
	id = stored_pair(at("cpu.db"), 0);
	CU_ASSERT_EQUAL(run("compare %lld --db '%s'", id, at("cpu.db")), 0);
	ASSERT_HAS("# measured, not predicted (the prediction: step time not priced: backend cpu: "
		   "no CPU profile)");
	ASSERT_HAS("time.step_s                                 s                  -                "
		   "0.6           -");
	CU_ASSERT_EQUAL(run("compare %lld --db '%s' --json", id, at("cpu.db")), 0);
	ASSERT_HAS("\"metric\": \"time.step_s\", \"unit\": \"s\", \"predicted\": null, "
		   "\"measured\": 0.59999999999999998, \"not_predicted\": \"backend cpu: no CPU "
		   "profile\"");
	CU_ASSERT_EQUAL(run("plot compare %lld --db '%s' --out '%s' --format svg", id, at("cpu.db"),
			    at("cmp")), 0);
	ASSERT_HAS("# step time measured 0.6 s, not predicted: backend cpu: no CPU profile");
	id = stored_pair(at("paired2.db"), 1);
	CU_ASSERT_EQUAL(run("plot compare %lld --db '%s' --out '%s' --format svg", id,
			    at("paired2.db"), at("cmp2")), 0);
	ASSERT_HAS("     0    2 \"time.step_s\"");
	ASSERT_HAS("0.5              0.6           20\n");
}

/* compare --max-error: a check over the paired metrics. The stored pair's step time is 20% off
 * ((0.6 - 0.5) / 0.5) and its memory exact: a 25% bound passes, a 10% bound fails with exit 3
 * naming the step time (and only it), --only memory. checks memory alone and passes; bad
 * arguments exit 2. */
static void test_compare_max_error(void)
{
	snprintf(dir, sizeof(dir), "%s", px_test_tmpdir());
	long long id = stored_pair(at("check.db"), 1);
	CU_ASSERT_EQUAL(run("compare %lld --db '%s' --max-error 25", id, at("check.db")), 0);
	CU_ASSERT_EQUAL(run("compare %lld --db '%s' --max-error 10", id, at("check.db")), 3);
	ASSERT_HAS("parallax compare: time.step_s: predicted 0.5, measured 0.6 (rank 0): largest "
		   "error 20.00%, over --max-error 10%");
	CU_ASSERT_PTR_NULL(strstr(out, "parallax compare: memory.gpu.peak_bytes"));
	CU_ASSERT_EQUAL(run("compare %lld --db '%s' --max-error 10 --only memory.", id,
			    at("check.db")), 0);
	CU_ASSERT_EQUAL(run("compare %lld --db '%s' --max-error -1", id, at("check.db")), 2);
	ASSERT_HAS("--max-error: expected a percentage (0 or more), got '-1'");
	CU_ASSERT_EQUAL(run("compare %lld --db '%s' --only memory.", id, at("check.db")), 2);
	ASSERT_HAS("--only: goes with --max-error");
}

int test_results_register(void)
{
	return PX_ADD_SUITE("results", {"prune through the binary", test_prune_cli},
			    {"sweep: summary and best points from the whole stored sweep",
			     test_sweep_summary_from_store},
			    {"sweep: best points by the settings that differ",
			     test_sweep_differing_settings},
			    {"sweep: typo'd keys refused, section paths beside the sweep",
			     test_sweep_keys_and_paths},
			    {"compare and plot compare show the step time", test_compare_time},
			    {"compare --max-error: a check with exit 3", test_compare_max_error});
}

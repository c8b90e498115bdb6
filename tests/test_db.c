/* Tests of db/: the schema, writing runs, the predicted-vs-measured view and what is refused.
 * Everything written through db.c is read back with sqlite3 directly, so that a mistake in db.c's
 * SQL cannot hide itself. Each test works in a fresh directory from px_test_tmpdir(). */
#include <CUnit/CUnit.h>
#include <float.h>
#include <signal.h>
#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../db/db.h"
#include "../db/sweepdb.h"
#include "suites.h"
#include "version.h"

/* ---- helpers ---- */

static char test_dir[256];  /* this test's directory */
static char test_path[512]; /* this test's database, test_dir/px.db */

static void new_test_dir(void)
{
	snprintf(test_dir, sizeof(test_dir), "%s", px_test_tmpdir());
	snprintf(test_path, sizeof(test_path), "%s/px.db", test_dir);
}

static PxDb *open_fresh(void)
{
	PxDb *db = NULL;
	PxError err = {0};

	new_test_dir();
	if (db_open(test_path, &db, &err) != 0)
		fprintf(stderr, "\n%s\n", err.msg);
	CU_ASSERT_PTR_NOT_NULL_FATAL(db);
	return db;
}

static DbRun make_run(const char *json, const char *kind, const DbMetric *m, size_t n)
{
	return (DbRun){
		.scenario_name = "tiny",
		.scenario_json = json,
		.kind = kind,
		.status = "ok",
		.metrics = m,
		.n_metrics = n,
	};
}

static long long write_ok(PxDb *db, const DbRun *run)
{
	PxError err = {0};
	long long id = -1;

	if (db_write_run(db, run, &id, &err) != 0)
		fprintf(stderr, "\n%s\n", err.msg);
	CU_ASSERT_FATAL(id > 0);
	return id;
}

/* A second connection, as any other reader of the database would have. */
static sqlite3 *peek_open(void)
{
	sqlite3 *h = NULL;

	CU_ASSERT_FATAL(sqlite3_open_v2(test_path, &h, SQLITE_OPEN_READWRITE, NULL) == SQLITE_OK);
	return h;
}

static void peek_exec(const char *sql)
{
	sqlite3 *h = peek_open();

	CU_ASSERT_EQUAL(sqlite3_exec(h, sql, NULL, NULL, NULL), SQLITE_OK);
	sqlite3_close(h);
}

/* First column of the first row of sql: as an integer (-1 when there is no row), or as text into
 * buf ("" when there is no row or it is NULL). */
static long long peek_int(const char *sql)
{
	sqlite3 *h = peek_open();
	sqlite3_stmt *s = NULL;
	long long v = -1;

	CU_ASSERT_EQUAL(sqlite3_prepare_v2(h, sql, -1, &s, NULL), SQLITE_OK);
	if (s && sqlite3_step(s) == SQLITE_ROW)
		v = sqlite3_column_int64(s, 0);
	sqlite3_finalize(s);
	sqlite3_close(h);
	return v;
}

static void peek_text(const char *sql, char *buf, size_t n)
{
	sqlite3 *h = peek_open();
	sqlite3_stmt *s = NULL;

	buf[0] = '\0';
	CU_ASSERT_EQUAL(sqlite3_prepare_v2(h, sql, -1, &s, NULL), SQLITE_OK);
	if (s && sqlite3_step(s) == SQLITE_ROW && sqlite3_column_text(s, 0))
		snprintf(buf, n, "%s", (const char *)sqlite3_column_text(s, 0));
	sqlite3_finalize(s);
	sqlite3_close(h);
}

typedef struct RowCounts {
	long long scenarios, runs, metrics;
} RowCounts;

static RowCounts row_counts(void)
{
	return (RowCounts){
		.scenarios = peek_int("SELECT count(*) FROM scenarios"),
		.runs = peek_int("SELECT count(*) FROM runs"),
		.metrics = peek_int("SELECT count(*) FROM metrics"),
	};
}

static void assert_counts(RowCounts got, long long scenarios, long long runs, long long metrics)
{
	CU_ASSERT_EQUAL(got.scenarios, scenarios);
	CU_ASSERT_EQUAL(got.runs, runs);
	CU_ASSERT_EQUAL(got.metrics, metrics);
}

/* ---- schema ---- */

static void test_schema(void)
{
	PxDb *db = open_fresh();
	PxError err = {0};
	char mode[16];

	db_close(db);
	CU_ASSERT_EQUAL(peek_int("SELECT count(*) FROM schema_version"), 1);
	CU_ASSERT_EQUAL(peek_int("SELECT version FROM schema_version"), PX_DB_SCHEMA_VERSION);
	CU_ASSERT_EQUAL(peek_int("SELECT count(*) FROM sqlite_schema WHERE"
				 " (type = 'table' AND name IN"
				 "  ('schema_version', 'scenarios', 'runs', 'metrics'))"
				 " OR (type = 'view' AND name = 'predicted_vs_measured')"
				 " OR (type = 'index' AND name = 'metrics_by_name')"),
			6);
	peek_text("PRAGMA journal_mode", mode, sizeof(mode));
	CU_ASSERT_STRING_EQUAL(mode, "wal");

	/* opening again changes nothing: still one version row */
	CU_ASSERT_EQUAL(db_open(test_path, &db, &err), 0);
	db_close(db);
	CU_ASSERT_EQUAL(peek_int("SELECT count(*) FROM schema_version"), 1);
}

static void test_run_row(void)
{
	PxDb *db = open_fresh();
	DbRun run = make_run("{\"a\":1}", "predicted", NULL, 0);
	char text[256], host[256] = "";
	struct tm tm = {0};
	long long id1, id2;

	id1 = write_ok(db, &run);
	run.kind = "measured";
	run.status = "failed";
	run.predicted_run_id = id1;
	run.notes = "rank 3 ran out of memory";
	id2 = write_ok(db, &run);
	db_close(db);
	CU_ASSERT_EQUAL(id2, peek_int("SELECT max(id) FROM runs"));

	peek_text("SELECT tool_version FROM runs WHERE id = 1", text, sizeof(text));
	CU_ASSERT_STRING_EQUAL(text, PX_VERSION);
	peek_text("SELECT git_commit FROM runs WHERE id = 1", text, sizeof(text));
	CU_ASSERT_STRING_EQUAL(text, PX_GIT_COMMIT);
	gethostname(host, sizeof(host) - 1);
	peek_text("SELECT host FROM runs WHERE id = 1", text, sizeof(text));
	CU_ASSERT_STRING_EQUAL(text, host);
	CU_ASSERT_EQUAL(peek_int("SELECT predicted_run_id IS NULL AND notes IS NULL"
				 " FROM runs WHERE id = 1"),
			1);
	peek_text("SELECT kind || ' ' || status || ' ' || predicted_run_id || ' ' || notes"
		  " FROM runs WHERE id = 2",
		  text, sizeof(text));
	CU_ASSERT_STRING_EQUAL(text, "measured failed 1 rank 3 ran out of memory");

	/* "2026-11-21T08:30:00Z", and it is now (within a minute, for a slow sanitizer run) */
	peek_text("SELECT created_utc FROM runs WHERE id = 2", text, sizeof(text));
	CU_ASSERT_EQUAL(strlen(text), 20);
	CU_ASSERT_EQUAL(sscanf(text, "%4d-%2d-%2dT%2d:%2d:%2dZ", &tm.tm_year, &tm.tm_mon,
			       &tm.tm_mday, &tm.tm_hour, &tm.tm_min, &tm.tm_sec),
			6);
	tm.tm_year -= 1900;
	tm.tm_mon -= 1;
	CU_ASSERT(llabs((long long)(timegm(&tm) - time(NULL))) <= 60);
}

/* ---- writing runs ---- */

static void test_scenario_dedup(void)
{
	PxDb *db = open_fresh();
	DbRun run = make_run("{\"a\":1}", "predicted", NULL, 0);

	write_ok(db, &run);
	run.scenario_name = "renamed"; /* same JSON: the same scenario, whatever its name */
	write_ok(db, &run);
	run.scenario_json = "{\"a\": 1}"; /* other text, so another scenario */
	write_ok(db, &run);
	db_close(db);

	assert_counts(row_counts(), 2, 3, 0);
	CU_ASSERT_EQUAL(peek_int("SELECT count(DISTINCT scenario_id) FROM runs WHERE id IN (1, 2)"),
			1);
	CU_ASSERT_EQUAL(peek_int("SELECT count(DISTINCT scenario_id) FROM runs"), 2);
	/* the first name stays (documented in docs/schema.md) */
	CU_ASSERT_EQUAL(peek_int("SELECT name = 'tiny' FROM scenarios WHERE json = '{\"a\":1}'"),
			1);
}

static void test_metrics_roundtrip(void)
{
	/* values chosen to lose bits under any text or float conversion */
	const DbMetric m[] = {
		{0, "time.step_s", 0.1, "s"},
		{0, "ratio", 1.0 / 3.0, "1"},
		{1, "memory.gpu.peak_bytes", 9007199254740992.0 /* 2^53 */, "bytes"},
		{1, "tiny", DBL_TRUE_MIN, "1"},
		{2, "huge", -DBL_MAX, "1"},
		{7, "zero", 0.0, "s"},
	};
	const size_t n = sizeof(m) / sizeof(m[0]);
	PxDb *db = open_fresh();
	DbRun run = make_run("{}", "predicted", m, n);
	sqlite3 *h;
	sqlite3_stmt *s = NULL;
	size_t seen = 0;

	write_ok(db, &run);
	db_close(db);

	h = peek_open();
	CU_ASSERT_EQUAL_FATAL(sqlite3_prepare_v2(h, "SELECT value, unit FROM metrics"
						    " WHERE run_id = 1 AND rank = ?1 AND name = ?2",
						 -1, &s, NULL),
			      SQLITE_OK);
	for (size_t i = 0; i < n; i++) {
		sqlite3_bind_int(s, 1, m[i].rank);
		sqlite3_bind_text(s, 2, m[i].name, -1, SQLITE_STATIC);
		if (sqlite3_step(s) == SQLITE_ROW) {
			double v = sqlite3_column_double(s, 0);

			CU_ASSERT(memcmp(&v, &m[i].value, sizeof(v)) == 0);
			CU_ASSERT_STRING_EQUAL((const char *)sqlite3_column_text(s, 1), m[i].unit);
			seen++;
		}
		sqlite3_reset(s);
	}
	sqlite3_finalize(s);
	sqlite3_close(h);
	CU_ASSERT_EQUAL(seen, n);
	assert_counts(row_counts(), 1, 1, (long long)n);
}

static void test_many_metrics(void)
{
	enum { N_RANKS = 1000, N_NAMES = 100 };
	static char names[N_NAMES][32];
	DbMetric *m = calloc(N_RANKS * N_NAMES, sizeof(*m));
	PxDb *db = open_fresh();

	CU_ASSERT_PTR_NOT_NULL_FATAL(m);
	for (int j = 0; j < N_NAMES; j++)
		snprintf(names[j], sizeof(names[j]), "metric.%02d", j);
	for (int r = 0; r < N_RANKS; r++)
		for (int j = 0; j < N_NAMES; j++)
			m[r * N_NAMES + j] = (DbMetric){r, names[j], r * 1000.0 + j, "1"};
	DbRun run = make_run("{}", "predicted", m, (size_t)N_RANKS * N_NAMES);
	write_ok(db, &run);
	db_close(db);
	free(m);

	assert_counts(row_counts(), 1, 1, N_RANKS * N_NAMES);
	/* sum of r*1000 + j = 1000 * N_NAMES * (0+..+999) + N_RANKS * (0+..+99)
	 *                  = 100000 * 499500 + 1000 * 4950 = 49954950000, exact in a double */
	CU_ASSERT_EQUAL(peek_int("SELECT sum(value) = 49954950000.0 FROM metrics"), 1);
}

/* ---- predicted vs measured ---- */

static void test_view_error(void)
{
	const DbMetric pred[] = {
		{0, "time.step_s", 100.0, "s"},
		{0, "comm.retries", 0.0, "1"},
		{1, "time.step_s", 200.0, "s"},
		{0, "only.predicted", 1.0, "1"},
	};
	const DbMetric meas[] = {
		{0, "time.step_s", 103.0, "s"},
		{0, "comm.retries", 5.0, "1"},
		{1, "time.step_s", 190.0, "s"},
		{0, "only.measured", 7.0, "1"},
	};
	/* error = (measured - predicted) / predicted; both divisions below have exact operands, so
	 * IEEE rounding gives the same double as the literal: 3/100 = 0.03, -10/200 = -0.05 */
	const struct {
		int rank;
		const char *name, *unit;
		double predicted, measured, error;
		int error_null;
	} want[] = {
		{0, "comm.retries", "1", 0.0, 5.0, 0.0, 1},
		{0, "time.step_s", "s", 100.0, 103.0, 0.03, 0},
		{1, "time.step_s", "s", 200.0, 190.0, -0.05, 0},
	};
	PxDb *db = open_fresh();
	DbRun run = make_run("{}", "predicted", pred, 4);
	long long pid, mid;
	sqlite3 *h;
	sqlite3_stmt *s = NULL;
	size_t i = 0;

	pid = write_ok(db, &run);
	run = make_run("{}", "measured", meas, 4);
	write_ok(db, &run); /* a measured run without a twin: not in the view */
	run.predicted_run_id = pid;
	mid = write_ok(db, &run);
	db_close(db);

	h = peek_open();
	CU_ASSERT_EQUAL_FATAL(sqlite3_prepare_v2(h, "SELECT measured_run_id, predicted_run_id, rank,"
						    " name, unit, predicted, measured, error"
						    " FROM predicted_vs_measured ORDER BY rank, name",
						 -1, &s, NULL),
			      SQLITE_OK);
	while (sqlite3_step(s) == SQLITE_ROW && i < 3) {
		CU_ASSERT_EQUAL(sqlite3_column_int64(s, 0), mid);
		CU_ASSERT_EQUAL(sqlite3_column_int64(s, 1), pid);
		CU_ASSERT_EQUAL(sqlite3_column_int(s, 2), want[i].rank);
		CU_ASSERT_STRING_EQUAL((const char *)sqlite3_column_text(s, 3), want[i].name);
		CU_ASSERT_STRING_EQUAL((const char *)sqlite3_column_text(s, 4), want[i].unit);
		CU_ASSERT_EQUAL(sqlite3_column_double(s, 5), want[i].predicted);
		CU_ASSERT_EQUAL(sqlite3_column_double(s, 6), want[i].measured);
		/* braces: the CUnit macros are blocks, an else after one does not parse */
		if (want[i].error_null) {
			CU_ASSERT_EQUAL(sqlite3_column_type(s, 7), SQLITE_NULL);
		} else {
			CU_ASSERT_EQUAL(sqlite3_column_double(s, 7), want[i].error);
		}
		i++;
	}
	sqlite3_finalize(s);
	sqlite3_close(h);
	CU_ASSERT_EQUAL(i, 3);
	CU_ASSERT_EQUAL(peek_int("SELECT count(*) FROM predicted_vs_measured"), 3);
}

/* ---- failures leave nothing ---- */

static void test_atomic(void)
{
	const DbMetric good[] = {{0, "time.step_s", 1.0, "s"}, {1, "time.step_s", 1.0, "s"}};
	const DbMetric dup[] = {
		{0, "time.step_s", 1.0, "s"},
		{1, "time.step_s", 1.0, "s"},
		{0, "time.step_s", 2.0, "s"}, /* same (rank, name) as the first: PRIMARY KEY */
	};
	PxDb *db = open_fresh();
	DbRun run = make_run("{\"good\":1}", "predicted", good, 2);
	PxError err = {0};
	long long id = -7;

	write_ok(db, &run);
	assert_counts(row_counts(), 1, 1, 2);

	run = make_run("{\"bad\":1}", "predicted", dup, 3);
	CU_ASSERT_EQUAL(db_write_run(db, &run, &id, &err), -1);
	CU_ASSERT_EQUAL(err.code, PX_ERR_RUNTIME);
	CU_ASSERT_EQUAL(id, -7);
	CU_ASSERT(strncmp(err.msg, test_path, strlen(test_path)) == 0);
	CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "inserting metric 2 (rank 0, time.step_s)"));
	CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "UNIQUE constraint failed"));
	assert_counts(row_counts(), 1, 1, 2);

	/* the connection is out of the failed transaction: the next write goes through */
	run = make_run("{\"bad\":1}", "predicted", good, 2);
	write_ok(db, &run);
	db_close(db);
	assert_counts(row_counts(), 2, 2, 4);
}

static void test_foreign_key(void)
{
	const DbMetric m[] = {{0, "time.step_s", 1.0, "s"}};
	PxDb *db = open_fresh();
	DbRun run = make_run("{}", "measured", m, 1);
	PxError err = {0};

	run.predicted_run_id = 9999; /* no such run */
	CU_ASSERT_EQUAL(db_write_run(db, &run, NULL, &err), -1);
	CU_ASSERT_EQUAL(err.code, PX_ERR_RUNTIME);
	CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "FOREIGN KEY constraint failed"));
	CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "predicted_run_id 9999"));
	db_close(db);
	assert_counts(row_counts(), 0, 0, 0);
}

static void expect_input_error(PxDb *db, const DbRun *run, const char *needle)
{
	PxError err = {0};

	CU_ASSERT_EQUAL(db_write_run(db, run, NULL, &err), -1);
	CU_ASSERT_EQUAL(err.code, PX_ERR_INPUT);
	CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, needle));
	if (!strstr(err.msg, needle))
		fprintf(stderr, "\nwanted '%s' in: %s\n", needle, err.msg);
}

static void test_bad_input(void)
{
	DbMetric m[] = {{0, "time.step_s", 1.0, "s"}};
	PxDb *db = open_fresh();
	DbRun run;

	expect_input_error(db, NULL, "no run given");
	expect_input_error(NULL, NULL, "no database");
	run = make_run("{}", "guess", m, 1);
	expect_input_error(db, &run, "'predicted' or 'measured', got 'guess'");
	run = make_run("{}", NULL, m, 1);
	expect_input_error(db, &run, "got '(null)'");
	run = make_run("{}", "measured", m, 1);
	run.status = "maybe";
	expect_input_error(db, &run, "'ok' or 'failed', got 'maybe'");
	run = make_run("{}", "predicted", m, 1);
	run.predicted_run_id = 1;
	expect_input_error(db, &run, "only a measured run has a predicted twin");
	run = make_run("", "predicted", m, 1);
	expect_input_error(db, &run, "no scenario JSON");
	m[0].value = NAN;
	run = make_run("{}", "predicted", m, 1);
	expect_input_error(db, &run, "metric 0 (rank 0, time.step_s) is NaN");
	m[0].value = 1.0;
	m[0].unit = NULL;
	expect_input_error(db, &run, "has no unit");
	db_close(db);
	assert_counts(row_counts(), 0, 0, 0);
}

/* ---- what db_open refuses ---- */

static void test_newer_version(void)
{
	PxDb *db = open_fresh();
	PxError err = {0};
	char want[1024];

	db_close(db);
	peek_exec("UPDATE schema_version SET version = 4");
	db = (PxDb *)&err; /* any non-NULL value: db_open must set it to NULL */
	CU_ASSERT_EQUAL(db_open(test_path, &db, &err), -1);
	CU_ASSERT_PTR_NULL(db);
	CU_ASSERT_EQUAL(err.code, PX_ERR_RUNTIME);
	snprintf(want, sizeof(want),
		 "%s: schema_version 4 is newer than this parallax (3); upgrade parallax", test_path);
	CU_ASSERT_STRING_EQUAL(err.msg, want);
	CU_ASSERT_EQUAL(peek_int("SELECT version FROM schema_version"), 4);
}

/* Older files are migrated in place on open, their runs kept: version 1 had no sweep tables,
 * versions 1 and 2 no runs.world_size, no rank_classes and the view that reads them. The schema
 * of each is made here by undoing what the later versions added. */
static void make_older(int version)
{
	PxDb *db = open_fresh();
	const DbMetric pred[] = {{0, "time.step_s", 100.0, "s"}, {1, "time.step_s", 200.0, "s"}};
	const DbMetric meas[] = {{0, "time.step_s", 103.0, "s"}, {1, "time.step_s", 190.0, "s"}};
	DbRun run = make_run("{}", "predicted", pred, 2);
	long long pid = write_ok(db, &run);
	run = make_run("{}", "measured", meas, 2);
	run.predicted_run_id = pid;
	write_ok(db, &run);
	db_close(db);
	peek_exec("DROP VIEW predicted_vs_measured; DROP TABLE rank_classes;"
		  "ALTER TABLE runs DROP COLUMN world_size;"
		  "CREATE VIEW predicted_vs_measured AS SELECT m.id AS measured_run_id,"
		  " p.id AS predicted_run_id, mm.rank AS rank, mm.name AS name, mm.unit AS unit,"
		  " pm.value AS predicted, mm.value AS measured, NULL AS error FROM runs m"
		  " JOIN runs p ON p.id = m.predicted_run_id JOIN metrics mm ON mm.run_id = m.id"
		  " JOIN metrics pm ON pm.run_id = p.id AND pm.rank = mm.rank AND pm.name = mm.name;"
		  "UPDATE schema_version SET version = 2");
	if (version == 1)
		peek_exec("DROP TABLE sweep_points; DROP TABLE sweeps;"
			  "UPDATE schema_version SET version = 1");
}

static void test_migrates_older(void)
{
	for (int v = 1; v <= 2; v++) {
		PxDb *db;
		PxError err = {0};
		make_older(v);
		CU_ASSERT_EQUAL_FATAL(db_open(test_path, &db, &err), 0);
		db_close(db);
		CU_ASSERT_EQUAL(peek_int("SELECT version FROM schema_version"), 3);
		CU_ASSERT_EQUAL(peek_int("SELECT count(*) FROM sqlite_master WHERE name IN "
					 "('sweeps', 'sweep_points', 'rank_classes')"), 3);
		CU_ASSERT_EQUAL(peek_int("SELECT count(*) FROM runs WHERE world_size IS NULL"), 2);
		/* the new view: errors computed, (103 - 100) / 100 and (190 - 200) / 200 */
		CU_ASSERT_EQUAL(peek_int("SELECT count(*) FROM predicted_vs_measured WHERE"
					 " (rank = 0 AND error = 0.03) OR (rank = 1 AND error = -0.05)"),
				2);
	}
}

/* A compacted prediction (world_size 6, as a pipeline of 2 stages laid out 0,1,0,1,0,1 would be)
 * stores each distinct set of a rank's rows once; the other ranks are rank_classes rows naming
 * the first rank with the same rows. A rank differing only in a unit, or lacking a name, is its
 * own class. The view still pairs every measured rank with its prediction. */
static void test_compacted_prediction(void)
{
	const DbMetric pred[] = {
		{0, "a", 1.0, "s"}, {0, "b", 2.0, "1"},
		{1, "a", 5.0, "s"}, {1, "b", 6.0, "1"},
		{2, "a", 1.0, "s"}, {2, "b", 2.0, "1"},
		{3, "a", 5.0, "s"}, {3, "b", 6.0, "1"},
		{4, "a", 1.0, "bytes"}, {4, "b", 2.0, "1"}, /* another unit */
		{5, "a", 1.0, "s"},                         /* b missing */
	};
	const DbMetric meas[] = {{2, "a", 1.5, "s"}, {3, "a", 4.0, "s"}, {5, "a", 2.0, "s"}};
	PxDb *db = open_fresh();
	DbRun run = make_run("{}", "predicted", pred, 11);
	run.world_size = 6;
	long long pid = write_ok(db, &run);
	run = make_run("{}", "measured", meas, 3);
	run.predicted_run_id = pid;
	write_ok(db, &run);
	db_close(db);
	/* ranks 0, 1, 4, 5 stored (2 + 2 + 2 + 1 rows); 2 -> 0, 3 -> 1 */
	CU_ASSERT_EQUAL(peek_int("SELECT count(*) FROM metrics WHERE run_id = 1"), 7);
	CU_ASSERT_EQUAL(peek_int("SELECT count(*) FROM rank_classes WHERE run_id = 1"), 2);
	CU_ASSERT_EQUAL(peek_int("SELECT count(*) FROM rank_classes WHERE"
				 " (rank = 2 AND same_as = 0) OR (rank = 3 AND same_as = 1)"), 2);
	CU_ASSERT_EQUAL(peek_int("SELECT world_size FROM runs WHERE id = 1"), 6);
	/* (1.5 - 1) / 1 = 0.5, (4 - 5) / 5 = -0.2, (2 - 1) / 1 = 1 */
	CU_ASSERT_EQUAL(peek_int("SELECT count(*) FROM predicted_vs_measured WHERE"
				 " (rank = 2 AND predicted = 1 AND error = 0.5) OR"
				 " (rank = 3 AND predicted = 5 AND error = -0.2) OR"
				 " (rank = 5 AND predicted = 1 AND error = 1)"), 3);
	/* out of order is refused, nothing written */
	const DbMetric shuffled[] = {{1, "a", 1.0, "s"}, {0, "a", 1.0, "s"}};
	PxError err = {0};
	PxDb *db2;
	CU_ASSERT_EQUAL_FATAL(db_open(test_path, &db2, &err), 0);
	run = make_run("{}", "predicted", shuffled, 2);
	run.world_size = 2;
	CU_ASSERT_EQUAL(db_write_run(db2, &run, NULL, &err), -1);
	CU_ASSERT_EQUAL(err.code, PX_ERR_INPUT);
	CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "grouped by rank, in rank order (metric 1, rank 0)"));
	db_close(db2);
	CU_ASSERT_EQUAL(peek_int("SELECT count(*) FROM runs"), 2);
}

/* Pruning: five runs, the 4th measured against the 1st (its twin). Keeping the 2 newest keeps
 * runs 4 and 5 and, for run 4, run 1; runs 2 and 3 go with their metrics, and the scenario only
 * run 2 used. By date: the dates are set by hand, runs before the cut go. */
static void test_prune(void)
{
	const DbMetric m[] = {{0, "a", 1.0, "s"}, {1, "a", 2.0, "s"}};
	PxDb *db = open_fresh();
	PxError err = {0};
	long long removed = -1;
	DbRun run = make_run("{\"s\":1}", "predicted", m, 2);
	long long p1 = write_ok(db, &run);
	run = make_run("{\"s\":2}", "predicted", m, 2);
	write_ok(db, &run);
	run = make_run("{\"s\":1}", "predicted", m, 2);
	write_ok(db, &run);
	run = make_run("{\"s\":1}", "measured", m, 2);
	run.predicted_run_id = p1;
	write_ok(db, &run);
	run = make_run("{\"s\":3}", "predicted", m, 2);
	write_ok(db, &run);
	CU_ASSERT_EQUAL(db_prune(db, 2, NULL, &removed, &err), 0);
	CU_ASSERT_EQUAL(removed, 2);
	CU_ASSERT_EQUAL(peek_int("SELECT group_concat(id) = '1,4,5' FROM (SELECT id FROM runs"
				 " ORDER BY id)"), 1);
	CU_ASSERT_EQUAL(peek_int("SELECT count(*) FROM metrics"), 6);
	CU_ASSERT_EQUAL(peek_int("SELECT count(*) FROM scenarios"), 2); /* {"s":1}, {"s":3} */
	/* by date: runs 1 and 4 made "yesterday", 5 today; a measured run that goes takes nothing
	 * with it that stays, and its twin goes with it */
	peek_exec("UPDATE runs SET created_utc = '2026-01-01T00:00:00Z' WHERE id IN (1, 4)");
	CU_ASSERT_EQUAL(db_prune(db, 0, "2026-01-02", &removed, &err), 0);
	CU_ASSERT_EQUAL(removed, 2);
	CU_ASSERT_EQUAL(peek_int("SELECT group_concat(id) = '5' FROM runs"), 1);
	CU_ASSERT_EQUAL(peek_int("SELECT count(*) FROM scenarios"), 1);
	/* nothing to do is not an error; no criterion is */
	CU_ASSERT_EQUAL(db_prune(db, 10, NULL, &removed, &err), 0);
	CU_ASSERT_EQUAL(removed, 0);
	CU_ASSERT_EQUAL(db_prune(db, 0, NULL, &removed, &err), -1);
	CU_ASSERT_EQUAL(err.code, PX_ERR_INPUT);
	db_close(db);
}

static void test_not_a_database(void)
{
	const char *text = "# step times, one per line\n"
			   "0.512\n0.498\n0.503\n0.507\n0.501\n0.499\n0.502\n0.505\n0.500\n"
			   "this is a text file that someone passed as --db by mistake\n";
	PxDb *db = NULL;
	PxError err = {0};
	char want[1024], back[1024] = "";
	FILE *f;

	new_test_dir();
	px_test_write_file(test_path, text);
	CU_ASSERT_EQUAL(db_open(test_path, &db, &err), -1);
	CU_ASSERT_PTR_NULL(db);
	CU_ASSERT_EQUAL(err.code, PX_ERR_RUNTIME);
	snprintf(want, sizeof(want), "%s: not a parallax database: file is not a database",
		 test_path);
	CU_ASSERT_STRING_EQUAL(err.msg, want);

	/* and the file is left as it was */
	f = fopen(test_path, "r");
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	back[fread(back, 1, sizeof(back) - 1, f)] = '\0';
	fclose(f);
	CU_ASSERT_STRING_EQUAL(back, text);
}

/* ---- a sweep batch whose COMMIT fails ---- */

enum { SWEEP_BATCH = 1000 };

/* Count the sweep points in the database through a second connection; -1 on error. */
static long long count_sweep_points(void)
{
	sqlite3 *h = peek_open();
	sqlite3_stmt *s = NULL;
	long long n = -1;
	if (sqlite3_prepare_v2(h, "SELECT count(*) FROM sweep_points", -1, &s, NULL) == SQLITE_OK &&
	    sqlite3_step(s) == SQLITE_ROW)
		n = sqlite3_column_int64(s, 0);
	sqlite3_finalize(s);
	sqlite3_close(h);
	return n;
}

/* The child's side: begin a sweep, empty the WAL, then cap the size of any file this process
 * writes at 64 KiB (RLIMIT_FSIZE: the WAL cannot grow, as on a full disk) and store a batch of
 * SWEEP_BATCH points, about 250 KB, which SQLite keeps in its page cache until COMMIT writes it.
 * Then lift the cap and store the batch again. Writes "RC1\nMESSAGE\nRC2\n" to fd. */
static void commit_fails_child(int fd)
{
	PxDb *db = NULL;
	PxError err = {0}, err2 = {0};
	Sweep sw = {.name = "full", .spec = "{\"full\": 1}", .n_points = SWEEP_BATCH};
	long long id = 0;
	char buf[2048];
	PointResult *r = calloc(SWEEP_BATCH, sizeof(*r));

	if (!r || db_open(test_path, &db, &err) || sweepdb_begin(db, &sw, &id, &err) ||
	    sqlite3_exec(db_handle(db), "PRAGMA wal_checkpoint(TRUNCATE)", NULL, NULL, NULL))
		_exit(3);
	for (int i = 0; i < SWEEP_BATCH; i++) {
		r[i].idx = i;
		r[i].status = PT_INVALID;
		snprintf(r[i].config, sizeof(r[i].config), "{\"point\": %d, \"pad\": \"%0200d\"}", i, i);
	}
	signal(SIGXFSZ, SIG_IGN); /* the write fails with EFBIG instead of ending the process */
	struct rlimit lim;
	getrlimit(RLIMIT_FSIZE, &lim);
	struct rlimit cap = {64 << 10, lim.rlim_max};
	setrlimit(RLIMIT_FSIZE, &cap);
	int rc1 = sweepdb_write(db, id, r, SWEEP_BATCH, &err);
	setrlimit(RLIMIT_FSIZE, &lim);
	int rc2 = sweepdb_write(db, id, r, SWEEP_BATCH, &err2);
	if (rc2)
		fprintf(stderr, "\nsecond write: %s\n", err2.msg);
	db_close(db);
	free(r);
	int n = snprintf(buf, sizeof(buf), "%d\n%s\n%d\n", rc1, err.msg, rc2);
	_exit(write(fd, buf, (size_t)n) == n ? 0 : 4);
}

/* A batch whose COMMIT fails is one clean error naming the database and SQLite's reason, nothing
 * of it is stored, and the connection goes on to store the batch once the cause is gone. Run in a
 * child process, so that its file-size cap (and, before the fix, its crash: the statement was
 * finalized twice) stays there. */
static void test_sweep_commit_fails(void)
{
	char got[4096] = "", want[1024];
	int fds[2], status = 0;

	new_test_dir();
	CU_ASSERT_EQUAL_FATAL(pipe(fds), 0);
	fflush(NULL);
	pid_t pid = fork();
	CU_ASSERT_FATAL(pid >= 0);
	if (pid == 0) {
		close(fds[0]);
		commit_fails_child(fds[1]);
	}
	close(fds[1]);
	size_t n = 0;
	ssize_t k;
	while (n + 1 < sizeof(got) && (k = read(fds[0], got + n, sizeof(got) - 1 - n)) > 0)
		n += (size_t)k;
	got[n] = '\0';
	close(fds[0]);
	CU_ASSERT_EQUAL(waitpid(pid, &status, 0), pid);
	if (!WIFEXITED(status) || WEXITSTATUS(status))
		fprintf(stderr, "\nchild: %s %d\n", WIFSIGNALED(status) ? "signal" : "exit status",
			WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
	CU_ASSERT_FATAL(WIFEXITED(status) && WEXITSTATUS(status) == 0);

	/* "-1", the message, "0" */
	char *msg = strchr(got, '\n'), *rc2 = msg ? strchr(msg + 1, '\n') : NULL;
	CU_ASSERT_FATAL(msg && rc2);
	*msg++ = '\0';
	*rc2++ = '\0';
	CU_ASSERT_STRING_EQUAL(got, "-1");
	CU_ASSERT_STRING_EQUAL(rc2, "0\n");
	/* SQLite's words for the failed write (EFBIG: SQLITE_IOERR_WRITE) */
	snprintf(want, sizeof(want), "%s: storing %d sweep points: committing: disk I/O error",
		 test_path, SWEEP_BATCH);
	if (strcmp(msg, want))
		fprintf(stderr, "\n got  '%s'\n want '%s'\n", msg, want);
	CU_ASSERT_STRING_EQUAL(msg, want);
	/* the second batch alone is there */
	CU_ASSERT_EQUAL(count_sweep_points(), SWEEP_BATCH);
}

/* A batch that fills the database while inserting (PRAGMA max_page_count: the file may not grow,
 * SQLITE_FULL) fails on the point it reached, with SQLite's words; nothing of it is stored. */
static void test_sweep_insert_full(void)
{
	PxDb *db = open_fresh();
	PxError err = {0};
	Sweep sw = {.name = "full", .spec = "{\"full\": 2}", .n_points = SWEEP_BATCH};
	long long id = 0;
	PointResult *r = calloc(SWEEP_BATCH, sizeof(*r));
	char want[1024];

	CU_ASSERT_PTR_NOT_NULL_FATAL(r);
	CU_ASSERT_EQUAL_FATAL(sweepdb_begin(db, &sw, &id, &err), 0);
	for (int i = 0; i < SWEEP_BATCH; i++) {
		r[i].idx = i;
		r[i].status = PT_INVALID;
		snprintf(r[i].config, sizeof(r[i].config), "{\"point\": %d, \"pad\": \"%0200d\"}", i, i);
	}
	/* room for two more pages: the first few points fit, the batch does not */
	sqlite3_stmt *st = NULL;
	long long pages = 0;
	char sql[128];
	if (sqlite3_prepare_v2(db_handle(db), "PRAGMA page_count", -1, &st, NULL) == SQLITE_OK &&
	    sqlite3_step(st) == SQLITE_ROW)
		pages = sqlite3_column_int64(st, 0);
	sqlite3_finalize(st);
	CU_ASSERT_FATAL(pages > 0);
	snprintf(sql, sizeof(sql), "PRAGMA max_page_count = %lld", pages + 2);
	CU_ASSERT_EQUAL(sqlite3_exec(db_handle(db), sql, NULL, NULL, NULL), SQLITE_OK);
	CU_ASSERT_EQUAL(sweepdb_write(db, id, r, SWEEP_BATCH, &err), -1);
	CU_ASSERT_EQUAL(err.code, PX_ERR_RUNTIME);
	snprintf(want, sizeof(want), "%s: storing %d sweep points: inserting point ", test_path,
		 SWEEP_BATCH);
	CU_ASSERT(strncmp(err.msg, want, strlen(want)) == 0);
	CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, ": database or disk is full"));
	CU_ASSERT_EQUAL(count_sweep_points(), 0);
	/* with room again the batch goes in whole */
	CU_ASSERT_EQUAL(sqlite3_exec(db_handle(db), "PRAGMA max_page_count = 1000000", NULL, NULL,
				     NULL), SQLITE_OK);
	CU_ASSERT_EQUAL(sweepdb_write(db, id, r, SWEEP_BATCH, &err), 0);
	CU_ASSERT_EQUAL(count_sweep_points(), SWEEP_BATCH);
	db_close(db);
	free(r);
}

static void test_close_null(void)
{
	db_close(NULL);
	CU_PASS("db_close(NULL) returned");
}

int test_db_register(void)
{
	return PX_ADD_SUITE("db",
			    {"creates the schema", test_schema},
			    {"fills the run row", test_run_row},
			    {"deduplicates scenarios by JSON", test_scenario_dedup},
			    {"round-trips metric values exactly", test_metrics_roundtrip},
			    {"writes 100k metrics in one run", test_many_metrics},
			    {"computes predicted vs measured error", test_view_error},
			    {"leaves nothing when a metric fails", test_atomic},
			    {"enforces predicted_run_id foreign key", test_foreign_key},
			    {"refuses bad input", test_bad_input},
			    {"refuses a newer schema_version", test_newer_version},
			    {"migrates version-1 and version-2 files", test_migrates_older},
			    {"a compacted prediction stores each rank class once",
			     test_compacted_prediction},
			    {"prune by count and by date, twins kept", test_prune},
			    {"refuses a file that is not a database", test_not_a_database},
			    {"db_close(NULL) is fine", test_close_null},
			    {"a sweep batch whose COMMIT fails: one error, nothing stored",
			     test_sweep_commit_fails},
			    {"a sweep batch that fills the database: the point named",
			     test_sweep_insert_full});
}

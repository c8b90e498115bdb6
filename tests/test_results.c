/* The results database as a user meets it, through the binary: pruning old runs, sweeps'
 * summaries and best points read back from what is stored (sweep --show, reruns, shards and
 * merges), and compare with time beside memory. Each test works in its own directory and
 * database. */
#include <CUnit/CUnit.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "suites.h"

static char out[1 << 16];
static char dir[512];

static int run(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int run(const char *fmt, ...)
{
	char args[4096];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(args, sizeof(args), fmt, ap);
	va_end(ap);
	int rc = px_test_run_cli(args, out, sizeof(out));
	return rc;
}

#define ASSERT_HAS(needle) assert_has((needle), __LINE__)
static void assert_has(const char *needle, unsigned line)
{
	int ok = strstr(out, needle) != NULL;
	if (!ok)
		fprintf(stderr, "\n%s:%u: expected \"%s\" in:\n%s\n", __FILE__, line, needle, out);
	CU_assertImplementation(ok ? CU_TRUE : CU_FALSE, line, "ASSERT_HAS", __FILE__, "",
				CU_FALSE);
}

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

/* dir/name (static buffer, two in rotation) */
static const char *at(const char *name)
{
	static char bufs[2][1024];
	static int next;
	char *b = bufs[next++ % 2];
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

int test_results_register(void)
{
	return PX_ADD_SUITE("results", {"prune through the binary", test_prune_cli});
}

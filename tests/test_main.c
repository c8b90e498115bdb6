/* The test runner: registers every suite, runs them and exits non-zero when any test failed. */
#define _XOPEN_SOURCE 700 /* nftw */
#include <CUnit/Basic.h>
#include <ftw.h>
#include <math.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "suites.h"

static int n_release_skipped; /* PX_RELEASE_RUN tests left inactive in this pass */

CU_pTest px_add_case(CU_pSuite s, const PxTestCase *c)
{
	CU_pTest t = CU_add_test(s, c->name, c->fn);
	const char *v = getenv("PX_RELEASE_RUNS");
	if (t && (c->flags & PX_RELEASE_RUN) && v && strcmp(v, "skip") == 0) {
		if (CU_set_test_active(t, CU_FALSE) != CUE_SUCCESS)
			return NULL;
		CU_set_fail_on_inactive(CU_FALSE); /* else CUnit counts an inactive test failed */
		n_release_skipped++;
	}
	return t;
}

int px_add_suite(const char *name, const PxTestCase *cases, int n)
{
	CU_pSuite s = CU_add_suite(name, NULL, NULL);
	if (!s)
		return -1;
	for (int i = 0; i < n; i++)
		if (!px_add_case(s, &cases[i]))
			return -1;
	return 0;
}

const char *px_test_path(const char *rel)
{
	static char buf[4096];
	static char cwd[2048];
	const char *root = getenv("PX_ROOT");
	if (!root || !*root)
		root = getcwd(cwd, sizeof(cwd)) ? cwd : ".";
	snprintf(buf, sizeof(buf), "%s/%s", root, rel);
	return buf;
}

int px_test_run_sh(const char *cmd, char *out, size_t n)
{
	char full[8192];
	snprintf(full, sizeof(full), "(%s) 2>&1", cmd);
	FILE *p = popen(full, "r");
	if (!p)
		return -1;
	size_t len = fread(out, 1, n ? n - 1 : 0, p);
	if (n)
		out[len] = '\0';
	char sink[4096];
	while (fread(sink, 1, sizeof(sink), p) > 0)
		;
	int st = pclose(p);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* bin with args under timeout(1) when timeout_s > 0 */
static int run_bin(const char *bin, const char *args, int timeout_s, char *out, size_t n)
{
	char cmd[8192], limit[32] = "";
	if (timeout_s > 0)
		snprintf(limit, sizeof(limit), "timeout %d ", timeout_s);
	snprintf(cmd, sizeof(cmd), "%s'%s' %s", limit, bin ? bin : "build/rel/parallax", args);
	return px_test_run_sh(cmd, out, n);
}

int px_test_run_cli(const char *args, char *out, size_t n)
{
	return run_bin(getenv("PX_BIN"), args, 0, out, n);
}

int px_test_run_clif(char *out, size_t n, const char *fmt, ...)
{
	char args[4096];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(args, sizeof(args), fmt, ap);
	va_end(ap);
	return px_test_run_cli(args, out, n);
}

void px_test_assert_has(const char *text, const char *needle, const char *file, unsigned line)
{
	int ok = strstr(text, needle) != NULL;
	if (!ok)
		fprintf(stderr, "\n%s:%u: expected \"%s\" in:\n%s\n", file, line, needle, text);
	CU_assertImplementation(ok ? CU_TRUE : CU_FALSE, line, "PX_ASSERT_HAS(text, needle)", file,
				"", CU_FALSE);
}

double px_test_query(sqlite3 *db, const char *sql)
{
	sqlite3_stmt *st;
	double v = NAN;
	if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW)
		v = sqlite3_column_double(st, 0);
	sqlite3_finalize(st);
	return v;
}

int px_test_run_release(const char *args, int timeout_s, char *out, size_t n)
{
	const char *bin = getenv("PX_RUN_BIN") ? getenv("PX_RUN_BIN") : getenv("PX_BIN");
	return run_bin(bin, args, timeout_s, out, n);
}

/* Every temporary directory is removed when the runner exits. */
#define MAX_TMPDIRS 1024
static char *tmpdirs[MAX_TMPDIRS];
static int n_tmpdirs;

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
	(void)sb, (void)flag, (void)ftw;
	return remove(path);
}

static void remove_tmpdirs(void)
{
	for (int i = 0; i < n_tmpdirs; i++) {
		nftw(tmpdirs[i], remove_entry, 16, FTW_DEPTH | FTW_PHYS);
		free(tmpdirs[i]);
	}
	n_tmpdirs = 0;
}

const char *px_test_tmpdir(void)
{
	static char buf[256];
	snprintf(buf, sizeof(buf), "/tmp/px_test_XXXXXX");
	if (!mkdtemp(buf))
		CU_FAIL_FATAL("mkdtemp failed");
	if (n_tmpdirs < MAX_TMPDIRS)
		tmpdirs[n_tmpdirs++] = strdup(buf);
	return buf;
}

void px_test_write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	fputs(text, f);
	fclose(f);
}

#define PX_REGISTER(name)                                                   \
	if (test_##name##_register() != 0) {                                \
		fprintf(stderr, "cannot register suite %s: %s\n", #name,    \
			CU_get_error_msg());                                \
		return 1;                                                   \
	}

/* ---- PX_TEST_TIMES: each test's wall time ---- */

static double wall_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double test_t0;

static void time_start(const CU_pTest test, const CU_pSuite suite)
{
	(void)test, (void)suite;
	test_t0 = wall_s();
}

static void time_done(const CU_pTest test, const CU_pSuite suite, const CU_pFailureRecord fail)
{
	printf("%8.2f s  %s: %s%s\n", wall_s() - test_t0, suite->pName, test->pName,
	       fail ? "  FAILED" : "");
	for (CU_pFailureRecord f = fail; f; f = f->pNext)
		printf("            %s:%u  %s\n", f->strFileName, f->uiLineNumber, f->strCondition);
	fflush(stdout);
}

/* PX_SUITE="time,exec": run only the suites named (CUnit's names), the others reported inactive,
 * for working on one part; unset or empty: all. An unknown name is refused. PX_TEST_TIMES set:
 * one line a test with its wall time, and no summary (failures still set the exit status). */
static int run_named_suites(const char *list)
{
	if (list && *list) {
		for (CU_pSuite s = CU_get_registry()->pSuite; s; s = s->pNext)
			CU_set_suite_active(s, CU_FALSE);
		for (const char *n = list; *n;) {
			size_t len = strcspn(n, ",");
			CU_pSuite s = CU_get_registry()->pSuite;
			while (s && (strlen(s->pName) != len || strncmp(s->pName, n, len) != 0))
				s = s->pNext;
			if (!s) {
				fprintf(stderr, "PX_SUITE: no suite named '%.*s'\n", (int)len, n);
				return -1;
			}
			CU_set_suite_active(s, CU_TRUE);
			n += len + (n[len] == ',');
		}
	}
	if (getenv("PX_TEST_TIMES")) { /* for trimming the suites' time: not CUnit's basic run */
		CU_set_test_start_handler(time_start);
		CU_set_test_complete_handler(time_done);
		CU_run_all_tests();
	} else {
		CU_basic_run_tests();
	}
	return 0;
}

int main(void)
{
	if (CU_initialize_registry() != CUE_SUCCESS)
		return 1;
	atexit(remove_tmpdirs);
	/* no default CPU profile: a machine's calibration (results/cpu-profile.json) must not change
	 * what the suites expect; the tests that want one name it */
	setenv("PARALLAX_CPU_PROFILE", "", 1);
	PX_SUITES(PX_REGISTER)
	if (n_release_skipped)
		printf("PX_RELEASE_RUNS=skip: %d tests that only drive the release binary (PX_RUN_BIN, "
		       "comm_mpi_check) are inactive in this pass; the release pass runs them\n",
		       n_release_skipped);
	CU_basic_set_mode(CU_BRM_NORMAL);
	if (run_named_suites(getenv("PX_SUITE")) != 0) {
		CU_cleanup_registry();
		return 2;
	}
	unsigned failed = CU_get_number_of_tests_failed();
	unsigned asserts_failed = CU_get_number_of_failures();
	CU_cleanup_registry();
	return (failed || asserts_failed) ? 1 : 0;
}

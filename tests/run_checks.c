/* run_checks: see run_checks.h. */
#include "run_checks.h"

#include <CUnit/CUnit.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "suites.h"

void px_check_pool_peaks(sqlite3 *db, int ranks)
{
	for (int place = 0; place < 2; place++) {
		char sql[1024];
		const char *pl = place ? "cpu" : "gpu";
		snprintf(sql, sizeof(sql), "SELECT COUNT(*) FROM predicted_vs_measured v JOIN metrics r "
			 "ON r.run_id = v.measured_run_id AND r.rank = v.rank AND r.name = "
			 "'memory.%s.requested_peak_bytes' WHERE v.name = 'memory.%s.peak_bytes' AND "
			 "r.value = v.predicted AND v.measured >= v.predicted AND "
			 "v.measured <= 1.25 * v.predicted", pl, pl);
		double good = px_test_query(db, sql);
		if (good != ranks)
			fprintf(stderr, "\n%s peaks: %g of %d ranks as expected\n", pl, good, ranks);
		CU_ASSERT_EQUAL(good, ranks);
	}
}

cJSON *px_run_json(const char *args)
{
	static char text[65536];
	int rc = px_test_run_release(args, 180, text, sizeof(text));
	if (rc != 0)
		fprintf(stderr, "\nparallax %s exited %d:\n%s\n", args, rc, text);
	CU_ASSERT_EQUAL_FATAL(rc, 0);
	const char *line = strstr(text, "{\"scenario\"");
	cJSON *j = line ? cJSON_Parse(line) : NULL;
	CU_ASSERT_PTR_NOT_NULL_FATAL(j);
	return j;
}

int px_json_losses(const cJSON *j, double *out, int max)
{
	const cJSON *l = cJSON_GetObjectItem(j, "losses");
	int n = 0;
	for (const cJSON *e = l ? l->child : NULL; e && n < max; e = e->next)
		out[n++] = e->valuedouble;
	return n;
}

double px_worst_rel(const double *ref, const double *got, int n)
{
	double worst = 0;
	for (int s = 0; s < n; s++)
		worst = fmax(worst, fabs(got[s] - ref[s]) / fabs(ref[s]));
	return worst;
}

double px_run_metric(sqlite3 *db, const char *name, const char *side, int rank)
{
	char sql[512];
	snprintf(sql, sizeof(sql), "SELECT %s FROM predicted_vs_measured WHERE name = '%s' AND "
		 "rank = %d", side, name, rank);
	return px_test_query(db, sql);
}

cJSON *px_run_json_serial(const char *args)
{
	char *was = getenv("OPENBLAS_NUM_THREADS");
	was = was ? strdup(was) : NULL;
	/* OpenBLAS on one thread in every rank: its products' last bits may depend on its thread
	 * count (kernels/par_cpu.h), which follows the cores a rank may use, and so the layout */
	setenv("OPENBLAS_NUM_THREADS", "1", 1);
	cJSON *j = px_run_json(args);
	if (was)
		setenv("OPENBLAS_NUM_THREADS", was, 1);
	else
		unsetenv("OPENBLAS_NUM_THREADS");
	free(was);
	return j;
}

int px_run_losses(const char *base, int ranks, int steps, const char *extra, double *out)
{
	char args[2048];
	snprintf(args, sizeof(args), "%s --ranks %d --steps %d %s", base, ranks, steps, extra);
	cJSON *j = px_run_json_serial(args);
	int n = px_json_losses(j, out, steps);
	cJSON_Delete(j);
	return n;
}

void px_check_losses(const char *base, const PxRunCase *cases, int n, double bound,
		     int first_exact, double ref[PX_LOSS_STEPS])
{
	enum { S = PX_LOSS_STEPS };
	double got[S];
	CU_ASSERT_EQUAL_FATAL(px_run_losses(base, 1, S, "", ref), S);
	CU_ASSERT(ref[S - 1] < 0.95 * ref[0]); /* it learns */
	for (int i = 0; i < n; i++) {
		CU_ASSERT_EQUAL_FATAL(px_run_losses(base, cases[i].ranks, S, cases[i].set, got), S);
		double w = px_worst_rel(ref, got, S);
		if (w > bound)
			fprintf(stderr, "\n%d ranks %s: losses differ by %g relative\n", cases[i].ranks,
				cases[i].set, w);
		CU_ASSERT(w <= bound);
		if (first_exact)
			CU_ASSERT_EQUAL(got[0], ref[0]);
	}
}

sqlite3 *px_run_db(const char *args, int ranks)
{
	static char text[65536];
	char cmd[4096], db_path[512];
	snprintf(db_path, sizeof(db_path), "%s/run.db", px_test_tmpdir());
	snprintf(cmd, sizeof(cmd), "%s --db '%s'", args, db_path);
	int rc = px_test_run_release(cmd, 180, text, sizeof(text));
	if (rc)
		fprintf(stderr, "\nparallax %s exited %d:\n%s\n", cmd, rc, text);
	CU_ASSERT_EQUAL_FATAL(rc, 0);
	sqlite3 *db;
	CU_ASSERT_EQUAL_FATAL(sqlite3_open(db_path, &db), SQLITE_OK);
	CU_ASSERT_EQUAL(px_test_query(db, "SELECT COUNT(DISTINCT rank) FROM predicted_vs_measured"),
			ranks);
	return db;
}

sqlite3 *px_run_measured(const char *args, int ranks)
{
	sqlite3 *db = px_run_db(args, ranks);
	double pairs = px_test_query(db, "SELECT COUNT(*) FROM predicted_vs_measured WHERE "
			     PX_EXACT_PAIRS);
	double bad = px_test_query(db, "SELECT COUNT(*) FROM predicted_vs_measured WHERE "
			   PX_EXACT_PAIRS " AND measured != predicted");
	CU_ASSERT(pairs >= ranks * 20);
	if (bad != 0)
		fprintf(stderr, "\n%s: %g of %g metrics differ\n", args, bad, pairs);
	CU_ASSERT_EQUAL(bad, 0);
	px_check_pool_peaks(db, ranks);
	return db;
}

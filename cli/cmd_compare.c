/* parallax compare: a measured run beside its predicted twin, metric by metric, from the results
 * database's predicted_vs_measured view. */
#include <getopt.h>
#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../db/db.h"
#include "commands.h"

static const char USAGE[] =
	"usage: parallax compare [RUN] [--db FILE] [--json]\n"
	"\n"
	"Print predicted against measured for every metric of measured run RUN (default: the latest\n"
	"measured run): rank 0's values and the largest relative error over all ranks.\n"
	"\n"
	"  --db FILE   results database (default $PARALLAX_DB or results/parallax.db)\n"
	"  --json      one JSON object per metric, in an array\n";

static const char QUERY[] =
	"SELECT name, unit, "
	"  MAX(CASE WHEN rank = 0 THEN predicted END), MAX(CASE WHEN rank = 0 THEN measured END), "
	"  MAX(ABS(COALESCE(error, CASE WHEN measured = predicted THEN 0 ELSE 1e300 END))), "
	"  COUNT(*) "
	"FROM predicted_vs_measured WHERE measured_run_id = ?1 GROUP BY name, unit ORDER BY name";

int cmd_compare(int argc, char **argv)
{
	static const struct option longs[] = {{"db", required_argument, 0, 'd'},
					       {"json", no_argument, 0, 'j'},
					       {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
	const char *path = getenv("PARALLAX_DB");
	int json = 0, c, rc = 1;
	long long run = 0;
	if (!path || !*path)
		path = "results/parallax.db";
	optind = 1;
	while ((c = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
		if (c == 'd')
			path = optarg;
		else if (c == 'j')
			json = 1;
		else if (c == 'h')
			return fputs(USAGE, stdout), 0;
		else
			return fputs(USAGE, stderr), 2;
	}
	if (optind < argc) {
		char *end;
		run = strtoll(argv[optind], &end, 10);
		if (*end || run <= 0 || optind + 1 < argc) {
			fprintf(stderr, "parallax compare: expected one run id, got '%s'\n", argv[optind]);
			return 2;
		}
	}
	sqlite3 *db;
	sqlite3_stmt *st = NULL;
	PxError err;
	if (!(db = db_open_read(path, &err))) {
		fprintf(stderr, "parallax compare: %s\n", err.msg);
		return 2;
	}
	if (!run) {
		if (sqlite3_prepare_v2(db, "SELECT MAX(id) FROM runs WHERE kind = 'measured'", -1, &st,
				       NULL) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW)
			run = sqlite3_column_int64(st, 0);
		sqlite3_finalize(st);
		st = NULL;
	}
	if (run <= 0) {
		fprintf(stderr, "parallax compare: %s: no measured run (parallax run stores them)\n",
			path);
		rc = 2;
		goto out;
	}
	if (sqlite3_prepare_v2(db, QUERY, -1, &st, NULL) != SQLITE_OK) {
		fprintf(stderr, "parallax compare: %s: %s\n", path, sqlite3_errmsg(db));
		goto out;
	}
	sqlite3_bind_int64(st, 1, run);
	int n = 0;
	if (json)
		printf("[");
	else
		printf("# measured run %lld against its prediction (%s)\n%-36s %8s %18s %18s %11s\n",
		       run, path, "metric", "unit", "predicted r0", "measured r0", "max |err|");
	while (sqlite3_step(st) == SQLITE_ROW) {
		const char *name = (const char *)sqlite3_column_text(st, 0);
		const char *unit = (const char *)sqlite3_column_text(st, 1);
		double p = sqlite3_column_double(st, 2), m = sqlite3_column_double(st, 3);
		double e = sqlite3_column_double(st, 4);
		if (json)
			printf("%s\n  {\"metric\": \"%s\", \"unit\": \"%s\", \"predicted\": %.17g, "
			       "\"measured\": %.17g, \"max_abs_rel_error\": %.6g, \"ranks\": %d}",
			       n ? "," : "", name, unit, p, m, e >= 1e300 ? INFINITY : e,
			       sqlite3_column_int(st, 5));
		else if (e >= 1e300)
			printf("%-36s %8s %18.6g %18.6g %11s\n", name, unit, p, m, "pred. 0");
		else
			printf("%-36s %8s %18.6g %18.6g %10.4f%%\n", name, unit, p, m, 100 * e);
		n++;
	}
	if (json)
		printf("\n]\n");
	if (n == 0) {
		fprintf(stderr, "parallax compare: run %lld has no predicted twin in %s\n", run, path);
		rc = 2;
		goto out;
	}
	rc = 0;
out:
	sqlite3_finalize(st);
	sqlite3_close(db);
	return rc;
}

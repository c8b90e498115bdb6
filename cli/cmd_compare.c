/* parallax compare: a measured run beside its predicted twin, metric by metric, from the results
 * database's predicted_vs_measured view. */
#include <getopt.h>
#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <limits.h>

#include "../db/db.h"
#include "commands.h"
#include "paths.h"

static const char USAGE[] =
	"usage: parallax compare [RUN] [--db FILE] [--json] [--max-error PCT [--only PREFIX]]\n"
	"\n"
	"Print predicted against measured for every metric of measured run RUN (default: the latest\n"
	"measured run): rank 0's values and the largest relative error over all ranks; memory,\n"
	"communication and the step time (time.step_s) alike. Then the metrics measured that the\n"
	"prediction has no value for, with the prediction's reason where it gave one (a CPU\n"
	"scenario's step time: \"step time not priced: ...\"). The last column says what each\n"
	"measured figure is: the pool's high-water (bytes the CPU backend mapped from the system),\n"
	"the bytes requested by category (the schedule's labels), the rank's peak resident set\n"
	"(VmHWM), the NVMe swap files' disk blocks and the bytes pread/pwrite moved, the device's\n"
	"own reading, or the steady mean step (the first step left out).\n"
	"\n"
	"  --db FILE   results database (default $PARALLAX_DB, else results/parallax.db where\n"
	"              ./results exists, else ~/.local/share/parallax/)\n"
	"  --json      one JSON object per metric, in an array (a measured-only metric has\n"
	"              \"predicted\": null and the reason in \"not_predicted\")\n"
	"  --max-error PCT  a check: fail (exit 3) when a paired metric's largest relative error\n"
	"              over the ranks exceeds PCT percent, naming each such metric on stderr\n"
	"  --only PREFIX  with --max-error: check only the metrics whose names begin with PREFIX\n"
	"              (e.g. memory. or comm.)\n"
	"  -h, --help  this help\n"
	"Exit status: 0 ok (and every checked metric within --max-error), 1 runtime failure\n"
	"(database), 2 bad usage, no such run or no measured run, 3 a checked metric's error over\n"
	"--max-error.\n";

/* ---- what each measured figure is ---- */

/* A measured metric's source, by name: the first row whose prefix and suffix match (NULL: any);
 * cuda: the label on the CUDA backend where it differs (whose allocations are each their own
 * cudaMalloc, so that the bytes requested are the bytes obtained). docs/executor_memory.md. */
static const struct {
	const char *prefix, *suffix, *label, *cuda;
} MEASURED_AS[] = {
	{"memory.gpu.peak_bytes", NULL, "pool high-water", "requested total"},
	{"memory.cpu.peak_bytes", NULL, "pool high-water", "requested total"},
	{"memory.process.pool_peak_bytes", NULL, "pool high-water", NULL},
	{"memory.process.rss_peak_bytes", NULL, "VmHWM", NULL},
	{"memory.process.rss_before_setup_bytes", NULL, "VmRSS", NULL},
	{"memory.process.page_faults", NULL, "getrusage", NULL},
	{"memory.", "requested_peak_bytes", "requested total", NULL},
	{"memory.nvme.bytes", NULL, "file blocks", NULL},
	{"copy.nvme_", NULL, "pread/pwrite", NULL},
	{"memory.gpu.device_peak_bytes", NULL, "device reading", NULL},
	{"memory.gpu.runtime.", NULL, "device reading", NULL},
	{"memory.", "_bytes", "requested by cat.", NULL},
	{"time.first_step_s", NULL, "warm-up step", NULL},
	{"time.", "_s", "steady steps", NULL},
};

static const char *measured_as(const char *name, int cuda)
{
	size_t n = strlen(name);
	for (size_t i = 0; i < sizeof(MEASURED_AS) / sizeof(MEASURED_AS[0]); i++) {
		const char *pre = MEASURED_AS[i].prefix, *suf = MEASURED_AS[i].suffix;
		size_t k = suf ? strlen(suf) : 0;
		if (strncmp(name, pre, strlen(pre)) || (suf && (n < k || strcmp(name + n - k, suf))))
			continue;
		return cuda && MEASURED_AS[i].cuda ? MEASURED_AS[i].cuda : MEASURED_AS[i].label;
	}
	return "-";
}

/* Whether measured run `run` ran on the CUDA backend (its scenario's backend). */
static int run_on_cuda(sqlite3 *db, long long run)
{
	sqlite3_stmt *st = NULL;
	int cuda = 0;
	if (sqlite3_prepare_v2(db, "SELECT json_extract(s.json, '$.backend') FROM runs m JOIN "
			       "scenarios s ON s.id = m.scenario_id WHERE m.id = ?1", -1, &st,
			       NULL) == SQLITE_OK) {
		sqlite3_bind_int64(st, 1, run);
		if (sqlite3_step(st) == SQLITE_ROW && sqlite3_column_text(st, 0))
			cuda = !strcmp((const char *)sqlite3_column_text(st, 0), "cuda");
	}
	sqlite3_finalize(st);
	return cuda;
}

/* Rank 0's metrics of the measured run that the view pairs with nothing: measured only. */
static const char MEASURED_ONLY[] =
	"SELECT mm.name, mm.unit, mm.value FROM metrics mm WHERE mm.run_id = ?1 AND mm.rank = 0 "
	"AND NOT EXISTS (SELECT 1 FROM predicted_vs_measured v WHERE v.measured_run_id = ?1 "
	"AND v.name = mm.name) ORDER BY mm.name";

/* The predicted twin's note on its step time ("step time not priced: ..."), in buf. */
static void time_note(sqlite3 *db, long long run, char *buf, size_t n)
{
	sqlite3_stmt *st = NULL;
	buf[0] = '\0';
	if (sqlite3_prepare_v2(db, "SELECT p.notes FROM runs m JOIN runs p ON p.id = "
			       "m.predicted_run_id WHERE m.id = ?1", -1, &st, NULL) == SQLITE_OK) {
		sqlite3_bind_int64(st, 1, run);
		const char *notes = sqlite3_step(st) == SQLITE_ROW ?
			(const char *)sqlite3_column_text(st, 0) : NULL;
		const char *t = notes ? strstr(notes, "step time not priced: ") : NULL;
		if (t) {
			t += strlen("step time not priced: ");
			snprintf(buf, n, "%.*s", (int)strcspn(t, "\n"), t);
		}
	}
	sqlite3_finalize(st);
}

/* The measured-only metrics after the pairs: a table, or more objects of the JSON array. */
static int measured_only(sqlite3 *db, long long run, int json, int cuda)
{
	sqlite3_stmt *st = NULL;
	char why[1024];
	int n = 0;
	time_note(db, run, why, sizeof(why));
	if (sqlite3_prepare_v2(db, MEASURED_ONLY, -1, &st, NULL) != SQLITE_OK)
		return 0;
	sqlite3_bind_int64(st, 1, run);
	while (sqlite3_step(st) == SQLITE_ROW) {
		const char *name = (const char *)sqlite3_column_text(st, 0);
		const char *unit = (const char *)sqlite3_column_text(st, 1);
		double m = sqlite3_column_double(st, 2);
		int is_time = !strncmp(name, "time.", 5);
		if (json) {
			printf(",\n  {\"metric\": \"%s\", \"unit\": \"%s\", \"predicted\": null, "
			       "\"measured\": %.17g, \"not_predicted\": ", name, unit, m);
			cJSON *w = cJSON_CreateString(is_time && why[0] ? why : "no prediction");
			char *t = cJSON_PrintUnformatted(w);
			printf("%s, \"measured_as\": \"%s\"}", t ? t : "null", measured_as(name, cuda));
			cJSON_free(t);
			cJSON_Delete(w);
		} else {
			if (!n && why[0])
				printf("# measured, not predicted (the prediction: step time not priced: "
				       "%s)\n", why);
			else if (!n)
				printf("# measured, not predicted\n");
			printf("%-36s %8s %18s %18.6g %11s  %s\n", name, unit, "-", m, "-",
			       measured_as(name, cuda));
		}
		n++;
	}
	sqlite3_finalize(st);
	return n;
}

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
					       {"max-error", required_argument, 0, 'm'},
					       {"only", required_argument, 0, 'o'},
					       {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
	const char *path = NULL, *only = NULL;
	char dflt[PATH_MAX];
	int json = 0, c, rc = 1, over = 0;
	long long run = 0;
	double max_error = -1;
	optind = 1;
	while ((c = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
		if (c == 'd') {
			path = optarg;
		} else if (c == 'j') {
			json = 1;
		} else if (c == 'm') {
			char *end;
			max_error = strtod(optarg, &end);
			if (*end || !(max_error >= 0)) {
				fprintf(stderr, "parallax compare: --max-error: expected a percentage "
					"(0 or more), got '%s'\n", optarg);
				return 2;
			}
		} else if (c == 'o') {
			only = optarg;
		} else if (c == 'h')
			return fputs(USAGE, stdout), 0;
		else
			return fputs(USAGE, stderr), 2;
	}
	if (only && max_error < 0) {
		fprintf(stderr, "parallax compare: --only: goes with --max-error\n");
		return 2;
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
	if (!(path = paths_db(path, dflt, sizeof(dflt), 0, &err))) {
		fprintf(stderr, "parallax compare: %s\n", err.msg);
		return 1;
	}
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
	int n = 0, cuda = run_on_cuda(db, run);
	if (json)
		printf("[");
	else
		printf("# measured run %lld against its prediction (%s)\n%-36s %8s %18s %18s %11s  %s\n",
		       run, path, "metric", "unit", "predicted r0", "measured r0", "max |err|",
		       "measured as");
	while (sqlite3_step(st) == SQLITE_ROW) {
		const char *name = (const char *)sqlite3_column_text(st, 0);
		const char *unit = (const char *)sqlite3_column_text(st, 1);
		double p = sqlite3_column_double(st, 2), m = sqlite3_column_double(st, 3);
		double e = sqlite3_column_double(st, 4);
		const char *as = measured_as(name, cuda);
		if (json)
			printf("%s\n  {\"metric\": \"%s\", \"unit\": \"%s\", \"predicted\": %.17g, "
			       "\"measured\": %.17g, \"max_abs_rel_error\": %.6g, \"ranks\": %d, "
			       "\"measured_as\": \"%s\"}", n ? "," : "", name, unit, p, m,
			       e >= 1e300 ? INFINITY : e, sqlite3_column_int(st, 5), as);
		else if (e >= 1e300)
			printf("%-36s %8s %18.6g %18.6g %11s  %s\n", name, unit, p, m, "pred. 0", as);
		else
			printf("%-36s %8s %18.6g %18.6g %10.4f%%  %s\n", name, unit, p, m, 100 * e, as);
		if (max_error >= 0 && (!only || !strncmp(name, only, strlen(only))) &&
		    e * 100 > max_error) {
			if (e >= 1e300)
				fprintf(stderr, "parallax compare: %s: predicted 0, measured %.6g: over "
					"--max-error %g%%\n", name, m, max_error);
			else
				fprintf(stderr, "parallax compare: %s: predicted %.6g, measured %.6g (rank "
					"0): largest error %.2f%%, over --max-error %g%%\n", name, p, m,
					100 * e, max_error);
			over++;
		}
		n++;
	}
	if (n)
		measured_only(db, run, json, cuda);
	if (n && !json)
		printf("# predicted: the simulator's figure for the rank; measured as:\n"
		       "#   pool high-water: the bytes the CPU backend's pool mapped from the system, at "
		       "their highest\n"
		       "#   requested: the bytes the executor asked for under the schedule's labels "
		       "(without the pool's rounding and fragmentation)\n"
		       "#   VmHWM: the rank's peak resident set, as the kernel counts it\n"
		       "#   file blocks: the NVMe swap files' disk blocks (fstat), at their highest\n"
		       "#   pread/pwrite: the bytes those calls moved to and from the swap files, per "
		       "step\n"
		       "#   steady steps: the mean of steps 2-N; the first is the warm-up\n");
	if (json)
		printf("\n]\n");
	if (n == 0) {
		fprintf(stderr, "parallax compare: run %lld has no predicted twin in %s\n", run, path);
		rc = 2;
		goto out;
	}
	rc = over ? 3 : 0;
out:
	sqlite3_finalize(st);
	sqlite3_close(db);
	return rc;
}

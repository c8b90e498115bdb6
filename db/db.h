/* db: the results database (SQLite), shared by the simulator and the executors.
 * Owns the schema, its version and writing one run (scenario, run row, per-rank metrics) in one
 * transaction, so that a failure leaves nothing half-written. It does not compute any metric. */
#ifndef PX_DB_H
#define PX_DB_H

#include <stddef.h>

#include "../engine/err.h"

#define PX_DB_SCHEMA_VERSION 3 /* 2: sweeps, sweep_points; 3: runs.world_size, rank_classes */

typedef struct PxDb PxDb;

typedef struct DbMetric {
	int rank;         /* global rank the value is for */
	const char *name; /* "memory.gpu.peak_bytes" */
	double value;
	const char *unit; /* "bytes", "s", "1" */
} DbMetric;

typedef struct DbRun {
	const char *scenario_name;  /* "zero3-gpt2-xl" */
	const char *scenario_json;  /* the full resolved scenario, as compact JSON */
	const char *kind;           /* "predicted" or "measured" */
	const char *status;         /* "ok" or "failed" */
	long long predicted_run_id; /* a measured run's predicted twin; 0 for none */
	const char *notes;          /* free text (warnings, not-modelled keys), may be NULL */
	const DbMetric *metrics;
	size_t n_metrics;
	/* 0: every row is stored. N > 0 (a prediction, whose ranks mostly repeat each other): the
	 * run has ranks 0..N-1, its metrics come grouped by rank in rank order, and a rank whose
	 * rows equal an earlier rank's (names, values, units) is stored as one rank_classes row
	 * naming that rank instead (the predicted_vs_measured view reads through it). */
	long long world_size;
} DbRun;

/* Open or create the database at path (WAL, foreign keys on, schema created when new). Refuses a
 * database whose schema_version is newer than PX_DB_SCHEMA_VERSION. Owner: caller, db_close(). */
int db_open(const char *path, PxDb **out, PxError *err);
void db_close(PxDb *db); /* accepts NULL */

/* Write one run in one transaction: the scenario (deduplicated by its JSON text), the run row
 * (tool version, git commit, host, UTC time filled in here) and its metrics. On error nothing of the
 * run is left in the database. *run_id (may be NULL) receives the new run's id. */
int db_write_run(PxDb *db, const DbRun *run, long long *run_id, PxError *err);

/* Remove old runs in one transaction: all but the keep newest (keep > 0), or (keep == 0) those
 * created before `before` (UTC, "YYYY-MM-DD" or "YYYY-MM-DDTHH:MM:SSZ"), with their metrics and
 * rank classes, and the scenarios no run refers to any more. A measured run that stays keeps its
 * predicted twin. *removed (may be NULL) receives how many runs went. Sweeps are not touched. */
int db_prune(PxDb *db, long long keep, const char *before, long long *removed, PxError *err);

/* For the modules that own other tables of the same file (sweepdb.c). */
struct sqlite3;
struct sqlite3 *db_handle(PxDb *db);

/* An existing results database at path opened to read it (compare, plots), busy timeout set, or
 * NULL with a PX_ERR_INPUT error naming path. Nothing is created and nothing is written; close
 * it with sqlite3_close. */
struct sqlite3 *db_open_read(const char *path, PxError *err);
const char *db_path(const PxDb *db);

#endif

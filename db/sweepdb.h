/* sweepdb: a sweep's rows in the results database: the sweep (by its spec) and one row per point
 * it priced, written in batches of one transaction each, and which points are already there (to
 * resume); an inference sweep's figures in sweep_infer_points beside them. The points are
 * computed by sim/sweep.c. */
#ifndef PX_SWEEPDB_H
#define PX_SWEEPDB_H

#include "../sim/sweep.h"
#include "db.h"

/* The sweep's id: found by its spec, or created. */
int sweepdb_begin(PxDb *db, const Sweep *sw, long long *sweep_id, PxError *err);
/* Mark in done (n_points bits, caller-zeroed) the points stored already; returns their count. */
long long sweepdb_done(PxDb *db, long long sweep_id, unsigned char *done, long long n_points,
		       PxError *err);
/* Store n points in one transaction (all or none). A failure (a full disk, say) is PX_ERR_RUNTIME
 * "DB: storing N sweep points: STEP: <SQLite's message>", with nothing of the batch stored and the
 * connection ready for the next one. */
int sweepdb_write(PxDb *db, long long sweep_id, const PointResult *r, int n, PxError *err);
/* The same; infer: an inference sweep's points, whose figures (TTFT, TPOT, latency, tokens/s per
 * GPU...) go into sweep_infer_points in the same transaction (made by sweepdb_begin). */
int sweepdb_write_infer(PxDb *db, long long sweep_id, const PointResult *r, int n, int infer,
			PxError *err);

/* Copy every sweep and its points from the database at src into db (a sweep already there, by
 * spec, gains the points it lacks). Returns the points added, or -1. */
long long sweepdb_merge(PxDb *db, const char *src, PxError *err);

/* ---- reading a stored sweep (sqlite3 handles from db_handle or db_open_read) ---- */

typedef struct StoredSweep {
	long long id, n_points;
	char name[128];
	char *spec;            /* owned: the sweep file and its base's documents */
	long long counts[4];   /* stored points by PointStatus */
	long long stored;      /* their sum */
	long long tight;       /* of the ok and unpriced ones, those within the margin (sweepdb.c) */
	int infer;             /* an inference sweep (its points have sweep_infer_points rows) */
} StoredSweep;

/* Find a sweep by id (all digits) or by name (the newest of that name), with its counts; a
 * PX_ERR_INPUT error names what was asked for and lists the stored sweeps' names when there is
 * none. Free with sweepdb_stored_free. */
int sweepdb_find(struct sqlite3 *h, const char *dbpath, const char *name_or_id, StoredSweep *out,
		 PxError *err);
/* The same for a known id. */
int sweepdb_load(struct sqlite3 *h, const char *dbpath, long long id, StoredSweep *out,
		 PxError *err);
void sweepdb_stored_free(StoredSweep *s);

/* The k best stored points by the objective (only points priced ok with the objective's value
 * known; ties by index), best first, into out (k of them); returns how many, or -1. */
int sweepdb_best(struct sqlite3 *h, const char *dbpath, long long sweep_id, SweepObjective obj,
		 int k, PointResult *out, PxError *err);

#endif

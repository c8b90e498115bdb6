/* sweepdb: a sweep's rows in the results database: the sweep (by its spec) and one row per point
 * it priced, written in batches of one transaction each, and which points are already there (to
 * resume). The points are computed by sim/sweep.c. */
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

/* Copy every sweep and its points from the database at src into db (a sweep already there, by
 * spec, gains the points it lacks). Returns the points added, or -1. */
long long sweepdb_merge(PxDb *db, const char *src, PxError *err);

#endif

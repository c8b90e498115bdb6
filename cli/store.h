/* store: writes a prediction into the results database as a predicted run with per-rank metrics. */
#ifndef PX_CLI_STORE_H
#define PX_CLI_STORE_H

#include "../db/db.h"
#include "../sim/predict.h"

int store_prediction(PxDb *db, const Scenario *sc, const Prediction *pr, long long *run_id,
		     PxError *err);

/* Store item i of n (a training or a serving prediction) into db: its run id into *id, its
 * scenario's name into *name. */
typedef int (*StoreItem)(PxDb *db, void *items, int i, const char **name, long long *id,
			 PxError *err);
/* Store n predictions into the database at db_path (NULL: the default, found and its folder made
 * only now, when there is something to store: paths_db), saying "# stored ..." for each unless
 * quiet. 0, or -1 with err. */
int store_each(const char *db_path, int quiet, void *items, int n, StoreItem store, PxError *err);

#endif

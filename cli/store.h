/* store: writes a prediction into the results database as a predicted run with per-rank metrics. */
#ifndef PX_CLI_STORE_H
#define PX_CLI_STORE_H

#include "../db/db.h"
#include "../sim/predict.h"

int store_prediction(PxDb *db, const Scenario *sc, const Prediction *pr, long long *run_id,
		     PxError *err);

#endif

/* calib_coll: the collective half of `parallax calibrate`: the benchmark (exec/collbench) on every
 * rank, the link it fits, and what rank 0 writes of it into the profile (a link section, or a
 * labelled note where the measurement is not of a link the simulator models) and prints. Ranks,
 * devices and the rest of the profile are cmd_calibrate.c's. */
#ifndef PX_CLI_CALIB_COLL_H
#define PX_CLI_CALIB_COLL_H

#include <stdio.h>

#include <cjson/cJSON.h>

#include "../engine/cluster.h"
#include "../exec/collbench.h"

typedef struct CalibColl {
	CollBench bench;
	CollBenchFit fit;
	const char *backend; /* "nccl", "mpi-staged", "mpi": static */
	const char *link;    /* the profile section it fills, "nvlink" or "network"; NULL: none */
	double peak_Bps;     /* that link's one-direction peak per GPU (catalog) */
	int nodes;           /* the job's, from the launcher's local size */
} CalibColl;

/* Every rank: time the collectives over world (buffers from cb's device memory, or the host when
 * cb is NULL) and fit link (NULL: no link, the measurement is only reported) against spec's peak:
 * nvlink_GBps / 2 for "nvlink" (one direction), network_GBps_per_gpu for "network". spec NULL:
 * time only, no fit (ranks that write nothing). */
int calib_coll_measure(CalibColl *cc, Comm *world, const ComputeBackend *cb, void *cx, int quick,
		       const GpuSpec *spec, const char *backend, const char *link, PxError *err);

/* Into profile j: cc's link section with a comment saying how it was measured, or, without a
 * link, a "_collectives" note with the bus bandwidths. stamp: when. */
int calib_coll_json(const CalibColl *cc, cJSON *j, const char *stamp);

/* The note of a calibration that measured no collective (one GPU). */
void calib_coll_json_single(cJSON *j);

/* nccl-tests' columns (size, time, algBw, busBw per kind), then the fit. */
void calib_coll_print(const CalibColl *cc, FILE *f);

#endif

/* run_checks: what the executor suites (exec, pipe) assert on a measured run stored beside its
 * prediction, in one place. */
#ifndef PX_TESTS_RUN_CHECKS_H
#define PX_TESTS_RUN_CHECKS_H

struct sqlite3;
struct cJSON;

/* The pairs that must be equal: every memory, communication and NVMe traffic metric but the
 * peaks, which the pool measures (px_check_pool_peaks), the NVMe swap files' disk blocks (whole
 * blocks: exec suite's NVMe test), and the wire bytes (in all and per kind of 1-bit step),
 * which the transport counts and a ring splits unevenly where a group does not divide an
 * all-reduce (each suite states by how much). */
#define PX_EXACT_PAIRS "(name LIKE 'memory.%' OR name LIKE 'comm.%' OR name LIKE 'copy.%') " \
	"AND name NOT IN ('memory.gpu.peak_bytes', 'memory.cpu.peak_bytes', 'memory.nvme.bytes') " \
	"AND name NOT LIKE 'comm.%wire_bytes'"

/* The peaks of every rank: what the executor requested at its peak (the arena's labelled bytes)
 * is the prediction exactly, as the simulator models the executor's buffers; what the pool mapped
 * from the system for them is at least that, and at most a quarter more (its 64 KiB commit steps
 * and the holes best fit leaves: 1.9-3.5% on gpt2-mini-cpu-zero3 at 1-4 ranks; a pool that
 * stopped reusing memory would map every step's buffers anew). */
void px_check_pool_peaks(struct sqlite3 *db, int ranks);

/* `parallax ARGS` (the release binary; ARGS includes --json) must exit 0 (else the test stops,
 * printing its output); its JSON line, parsed (the caller deletes it). */
struct cJSON *px_run_json(const char *args);
/* px_run_json with OpenBLAS on one thread in every rank (OPENBLAS_NUM_THREADS restored after),
 * so that runs of different layouts compute their products alike. */
struct cJSON *px_run_json_serial(const char *args);
/* The first `max` losses of a run's JSON into out; how many. */
int px_json_losses(const struct cJSON *j, double *out, int max);
/* `parallax ARGS --db DB` (ARGS: "run ... --ranks R ...") must exit 0 and store every rank's
 * figures; the open database (the caller closes it). */
struct sqlite3 *px_run_db(const char *args, int ranks);
/* px_run_db; then every rank's memory
 * by category and communication per collective (PX_EXACT_PAIRS, at least 20 a rank) must equal
 * the prediction and the pool peaks be px_check_pool_peaks'. The open database (the caller
 * closes it); DB is a fresh file in a temporary folder. */
struct sqlite3 *px_run_measured(const char *args, int ranks);

/* The losses of `parallax BASE --ranks R --steps S EXTRA` (BASE: "run 'SCN' --no-db --json ..."),
 * into out; how many. OpenBLAS runs on one thread in every rank, so that runs of different
 * layouts compute their products alike. */
int px_run_losses(const char *base, int ranks, int steps, const char *extra, double *out);

/* A run to compare with a single rank: its ranks and its --set options. */
typedef struct PxRunCase {
	int ranks;
	const char *set;
} PxRunCase;
enum { PX_LOSS_STEPS = 8 };
/* Each case's PX_LOSS_STEPS losses within bound (relative) of BASE's on one rank, which must
 * learn (its last loss under 0.95 of its first); first_exact: the first loss too, to the bit.
 * The single rank's losses into ref. */
void px_check_losses(const char *base, const PxRunCase *cases, int n, double bound,
		     int first_exact, double ref[PX_LOSS_STEPS]);

/* The largest |got - ref| / |ref| over n values. */
double px_worst_rel(const double *ref, const double *got, int n);
/* One rank's figure for a metric in predicted_vs_measured, side "predicted" or "measured". */
double px_run_metric(struct sqlite3 *db, const char *name, const char *side, int rank);

#endif

/* run_checks: what the executor suites (exec, pipe) assert on a measured run stored beside its
 * prediction, in one place. */
#ifndef PX_TESTS_RUN_CHECKS_H
#define PX_TESTS_RUN_CHECKS_H

struct sqlite3;

/* The pairs that must be equal: every memory and communication metric but the peaks, which the
 * pool measures (px_check_pool_peaks), and the wire bytes, which the transport counts and a ring
 * splits unevenly where a group does not divide an all-reduce (each suite states by how much). */
#define PX_EXACT_PAIRS "(name LIKE 'memory.%' OR name LIKE 'comm.%') AND name NOT IN " \
	"('memory.gpu.peak_bytes', 'memory.cpu.peak_bytes', 'comm.wire_bytes')"

/* The peaks of every rank: what the executor requested at its peak (the arena's labelled bytes)
 * is the prediction exactly, as the simulator models the executor's buffers; what the pool mapped
 * from the system for them is at least that, and at most a quarter more (its 64 KiB commit steps
 * and the holes best fit leaves: 1.9-3.5% on gpt2-mini-cpu-zero3 at 1-4 ranks; a pool that
 * stopped reusing memory would map every step's buffers anew). */
void px_check_pool_peaks(struct sqlite3 *db, int ranks);

#endif

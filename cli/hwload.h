/* hwload: the CPU hardware profile a command prices a backend "cpu" scenario's step time with
 * when no --hw is given (this machine's, where `parallax calibrate --backend cpu` put it:
 * paths_cpu_profile), and the warnings a CPU profile of another machine, or of another OpenBLAS
 * thread count, earns. Loading --hw itself, and GPU profiles, stay the commands' own. */
#ifndef PX_CLI_HWLOAD_H
#define PX_CLI_HWLOAD_H

#include <stddef.h>

#include "../sim/predict.h"

/* After predict_run: a backend "cpu" scenario's step time priced with this machine's CPU profile
 * when there is one (and its warnings added to notes, when not NULL); with none, pr keeps
 * predict_run's note, saying where it looked. Nothing for other scenarios. 0, or -1 with err
 * (PX_ERR_INPUT) when the profile is there but unreadable. */
int hwload_cpu_default(Prediction *pr, PxNotes *notes, PxError *err);

/* A CPU profile measured on another machine (hostname or CPU model), with another number of
 * OpenBLAS threads than this process runs, or with another OPENBLAS_THREAD_TIMEOUT than a run
 * here has (the user's, or what `run` sets: PAR_CPU_BLAS_TIMEOUT): 1 with "PATH: warning: ..."
 * in msg, else 0 (and 0 for a GPU profile). */
int hwload_cpu_mismatch(const HwProfile *hw, const char *path, char *msg, size_t n);

#endif

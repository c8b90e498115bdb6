#include "hwload.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../kernels/par_cpu.h"
#include "paths.h"

/* last: OpenBLAS's header brings <complex.h>, whose I would rename model.h's field */
#include <cblas.h>

/* OPENBLAS_THREAD_TIMEOUT as a run from this environment has it: the user's, or what `run` sets */
static int run_blas_timeout(void)
{
	return getenv("OPENBLAS_THREAD_TIMEOUT") ? par_cpu_blas_timeout() : PAR_CPU_BLAS_TIMEOUT;
}

int hwload_cpu_mismatch(const HwProfile *hw, const char *path, char *msg, size_t n)
{
	char host[128] = "";
	const HwCpu *c = hw->cpu;
	if (!c)
		return 0;
	gethostname(host, sizeof(host) - 1);
	int threads = openblas_get_num_threads();
	if (c->host[0] && strcmp(c->host, host)) {
		snprintf(msg, n, "%s: warning: CPU profile measured on %s, this machine is %s: the "
			 "step time is %s's (run parallax calibrate --backend cpu here)", path, c->host,
			 host, c->host);
		return 1;
	}
	if (c->blas_threads > 0 && c->blas_threads != threads) {
		snprintf(msg, n, "%s: warning: CPU profile measured with %d OpenBLAS threads a rank, "
			 "this process has %d (OPENBLAS_NUM_THREADS): its products' rates are not "
			 "this run's", path, c->blas_threads, threads);
		return 1;
	}
	if (c->blas_thread_timeout > 0 && c->blas_thread_timeout != run_blas_timeout()) {
		snprintf(msg, n, "%s: warning: CPU profile measured with OpenBLAS's idle threads "
			 "spinning 2^%d cycles (OPENBLAS_THREAD_TIMEOUT %d), a run here spins 2^%d: "
			 "their spinning takes the cores, so its times are not this run's", path,
			 c->blas_thread_timeout, c->blas_thread_timeout, run_blas_timeout());
		return 1;
	}
	return 0;
}

int hwload_cpu_default(Prediction *pr, PxNotes *notes, PxError *err)
{
	char path[PATH_MAX], msg[1024];
	struct stat st;
	if (pr->plan.sc->backend != BACKEND_CPU || pr->time_known)
		return 0;
	int rc = paths_cpu_profile(path, sizeof(path), 0, err);
	if (rc < 0)
		return -1;
	if (rc > 0) {
		snprintf(pr->time_note, sizeof(pr->time_note), "backend cpu: no CPU hardware profile "
			 "(PARALLAX_CPU_PROFILE is empty; give --hw FILE from `parallax calibrate "
			 "--backend cpu`)");
		return 0;
	}
	if (stat(path, &st)) {
		snprintf(pr->time_note, sizeof(pr->time_note), "backend cpu: no CPU hardware profile "
			 "at %.700s (`parallax calibrate --backend cpu` measures this machine and writes "
			 "it there; or give --hw FILE)", path);
		return 0;
	}
	HwProfile hw;
	if (hwprofile_load(path, &hw, err))
		return -1;
	if (!hw.cpu) {
		hwprofile_free(&hw);
		return px_fail(err, PX_ERR_INPUT, "%s: a GPU's profile where the CPU profile belongs "
			       "(no \"cpu\" section): remove it or run parallax calibrate --backend "
			       "cpu", path);
	}
	rc = predict_time(pr, &hw, path, err);
	if (!rc && notes && hwload_cpu_mismatch(&hw, path, msg, sizeof(msg)) &&
	    px_notes_warn(notes, "%s", msg))
		rc = px_fail(err, PX_ERR_RUNTIME, "out of memory");
	hwprofile_free(&hw);
	return rc;
}

/* parallax: predict and measure what distributed training costs. Dispatches to a subcommand. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../kernels/par_cpu.h"
#include "commands.h"
#include "version.h"

static const char USAGE[] =
	"usage: parallax COMMAND [ARGS]\n"
	"\n"
	"commands:\n"
	"  predict SCENARIO...  per-GPU memory and communication of a training scenario\n"
	"                       (model x DeepSpeed config x cluster), stored in the results database\n"
	"  run SCENARIO         train it for real with the executor (CPU over MPI ranks, or\n"
	"                       CUDA GPUs) and store measured beside predicted\n"
	"  calibrate --out FILE measure this machine's GPU into a hardware profile\n"
	"  compare [RUN]        a measured run beside its prediction\n"
	"  sweep SWEEP.json     price every point of a space of scenarios on all cores\n"
	"  merge OUT.db IN.db.. merge the sweeps of sharded runs\n"
	"  plan PLAN.json       size a cluster: GPU type and node count for a token budget\n"
	"  plot KIND ...        charts with gnuplot (PNG + SVG): memory, time, scaling, compare,\n"
	"                       pareto, zero\n"
	"  gpus                 the built-in GPU catalog\n"
	"  prune --keep N       remove old runs from the results database (or --before DATE)\n"
	"\n"
	"  parallax COMMAND --help   describes a command and its flags\n"
	"  parallax --version        prints the version and the git commit it was built from\n";

/* OpenBLAS's idle threads spin after every product before they sleep: 2^28 cycles by default
 * (OPENBLAS_THREAD_TIMEOUT 28, about 0.1 s), calling sched_yield as they go. The executor
 * alternates products with its own loops on its pool's threads (kernels/par_cpu.c) and with
 * MPI's waits, so those spinners take the cores its work needs. Measured on a 2-core machine,
 * gpt2-mini-cpu-sparse at 1 rank: 0.33-0.47 s a step and 2 s of system time in 16 steps as it
 * was, 0.24-0.29 s and 0.3 s with the spin at its least (4). OpenBLAS reads the variable once,
 * when the library loads, so a command that computes (run, calibrate: the profile is measured
 * the way the runs will go) sets it and starts again as itself; one the user set is kept. If the
 * exec fails the command goes on as it was, slower. */
static void blas_quiet_spin(char **argv)
{
	char v[16];
	snprintf(v, sizeof(v), "%d", PAR_CPU_BLAS_TIMEOUT);
	if (getenv("OPENBLAS_THREAD_TIMEOUT") || setenv("OPENBLAS_THREAD_TIMEOUT", v, 1))
		return;
	execv("/proc/self/exe", argv);
}

int main(int argc, char **argv)
{
	if (argc >= 2 && (!strcmp(argv[1], "run") || !strcmp(argv[1], "calibrate")))
		blas_quiet_spin(argv);
	if (argc < 2) {
		fputs(USAGE, stderr);
		return 2;
	}
	const char *cmd = argv[1];
	if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
		fputs(USAGE, stdout);
		return 0;
	}
	if (!strcmp(cmd, "--version")) {
		printf("parallax %s (%s)\n", PX_VERSION, PX_GIT_COMMIT);
		return 0;
	}
	if (!strcmp(cmd, "predict"))
		return cmd_predict(argc - 1, argv + 1);
	if (!strcmp(cmd, "run"))
		return cmd_run(argc - 1, argv + 1);
	if (!strcmp(cmd, "sweep"))
		return cmd_sweep(argc - 1, argv + 1);
	if (!strcmp(cmd, "plot"))
		return cmd_plot(argc - 1, argv + 1);
	if (!strcmp(cmd, "plan"))
		return cmd_plan(argc - 1, argv + 1);
	if (!strcmp(cmd, "merge"))
		return cmd_merge(argc - 1, argv + 1);
	if (!strcmp(cmd, "compare"))
		return cmd_compare(argc - 1, argv + 1);
	if (!strcmp(cmd, "calibrate"))
		return cmd_calibrate(argc - 1, argv + 1);
	if (!strcmp(cmd, "gpus"))
		return cmd_gpus(argc - 1, argv + 1);
	if (!strcmp(cmd, "prune"))
		return cmd_prune(argc - 1, argv + 1);
	fprintf(stderr, "parallax: unknown command '%s'\n%s", cmd, USAGE);
	return 2;
}

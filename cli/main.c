/* parallax: predict and measure what distributed training costs. Dispatches to a subcommand. */
#include <stdio.h>
#include <string.h>

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

int main(int argc, char **argv)
{
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

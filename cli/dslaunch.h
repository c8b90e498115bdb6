/* dslaunch: DeepSpeed's launcher flags (deepspeed/launcher/runner.py) as parallax predict and run
 * take them: the hostfile ("HOST slots=N" lines, comments and blank lines allowed), the
 * --include/--exclude filters ("host:0,1@host2"), --num_nodes/--num_gpus, and the scenario that
 * they with --model, --deepspeed_config and --gpu describe, as scenario text for
 * scenario_load_text. It starts nothing (launch.c does) and prices nothing. */
#ifndef PX_CLI_DSLAUNCH_H
#define PX_CLI_DSLAUNCH_H

#include <getopt.h>
#include <stddef.h>
#include <stdint.h>

#include "../engine/err.h"

#define DSL_MAX_SLOTS 64    /* GPUs a host may list (a bit each) */
#define DSL_MAX_HOSTS 4096

typedef struct DsHost {
	char name[256];
	int slots;      /* slots=N as written */
	uint64_t active; /* bit i: slot i is used (after --include/--exclude/--num_gpus) */
	int line;       /* its line in the hostfile */
} DsHost;

/* The flags as given: NULL or -1 when absent. */
typedef struct DsLaunch {
	const char *hostfile, *include, *exclude, *model, *deepspeed_config, *gpu, *master_addr;
	long long num_nodes, num_gpus, master_port;
	DsHost *hosts; /* owned: the hostfile's hosts, filtered (dslaunch_free) */
	int n_hosts;
} DsLaunch;

/* getopt_long's entries for the flags (values from DSL_OPT, clear of any command's own), to put
 * in a command's table: { ..., DSL_LONG_OPTIONS, {0, 0, 0, 0} } */
#define DSL_OPT 1000
#define DSL_LONG_OPTIONS                                                                          \
	{"model", required_argument, 0, DSL_OPT + 0},                                             \
	{"deepspeed_config", required_argument, 0, DSL_OPT + 1},                                  \
	{"gpu", required_argument, 0, DSL_OPT + 2}, {"hostfile", required_argument, 0, DSL_OPT + 3}, \
	{"include", required_argument, 0, DSL_OPT + 4},                                           \
	{"exclude", required_argument, 0, DSL_OPT + 5},                                           \
	{"master_addr", required_argument, 0, DSL_OPT + 6},                                       \
	{"num_nodes", required_argument, 0, DSL_OPT + 7},                                         \
	{"num_gpus", required_argument, 0, DSL_OPT + 8},                                          \
	{"master_port", required_argument, 0, DSL_OPT + 9}
/* Take getopt_long's option c with its argument: 1 when it is one of the flags (stored), 0 when
 * it is not, -1 on a bad number (the message printed as "parallax CMD: ..."). */
int dslaunch_option(DsLaunch *l, int c, const char *arg, const char *cmd);
/* The cluster flags (--hostfile, --num_nodes, --num_gpus, --include, --exclude) given. */
int dslaunch_cluster_given(const DsLaunch *l);
/* An Open MPI hostfile of the resolved hosts ("HOST slots=K", K the slots in use) in a new
 * temporary file, for mpirun --hostfile; its path in buf (the caller removes it). Open MPI places
 * ranks by count, so --include's slot numbers choose how many, not which GPUs. */
int dslaunch_write_mpi_hostfile(const DsLaunch *l, char *buf, size_t n, PxError *err);

void dslaunch_init(DsLaunch *l);
void dslaunch_free(DsLaunch *l);
/* Any of the flags given (the command then builds its scenario from them). */
int dslaunch_any(const DsLaunch *l);

/* Parse hostfile text (name: its path, for messages) as DeepSpeed's _parse_hostfile: each line,
 * stripped, is blank, a '#' comment or "HOST slots=N" (N >= 1; after the digits the line may go
 * on, as DeepSpeed's regular expression allows); a host given twice, any other line, or no host
 * at all is refused, naming the file and the line. *hosts is owned by the caller (free). */
int dslaunch_parse_hostfile(const char *name, const char *text, DsHost **hosts, int *n,
			    PxError *err);
/* Keep the slots --include or --exclude names (DeepSpeed's parse_resource_filter: "NAME[:SLOT[,
 * SLOT...]]" joined by '@'; a host without slots means all of its slots; exclusive of each
 * other), then drop hosts left with none. Unknown hosts or slots are refused. */
int dslaunch_filter(DsHost *hosts, int *n, const char *include, const char *exclude,
		    PxError *err);

/* Apply the flags: the hostfile (read and filtered) or, without one, num_nodes hosts (1 by
 * default) of num_gpus slots; --num_nodes keeps the first hosts, --num_gpus the first slots of
 * each, as DeepSpeed does; num_nodes/num_gpus with include/exclude are refused as DeepSpeed
 * refuses them. for_run: num_nodes > 1 needs a hostfile (DeepSpeed's rule; a prediction may
 * describe nodes it does not have). Then *nodes and *gpus_per_node (every host the same count,
 * which the cluster model needs). */
int dslaunch_resolve(DsLaunch *l, int for_run, long long *nodes, long long *gpus_per_node,
		     PxError *err);

/* The scenario text the flags describe: {"name", "model", "deepspeed", "cluster": {"gpu",
 * "nodes", "gpus_per_node"}}, the model a config.json or a folder holding one; named after the
 * model's folder or file and the ds_config's file. Caller frees. */
char *dslaunch_scenario_text(const DsLaunch *l, long long nodes, long long gpus_per_node,
			     PxError *err);

#endif

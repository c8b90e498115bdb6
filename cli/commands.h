/* commands: the parallax subcommands, one function each, taking the arguments after their name.
 * Each returns the process exit status: 0, 1 (runtime failure) or 2 (bad input or usage). */
#ifndef PX_CLI_COMMANDS_H
#define PX_CLI_COMMANDS_H

int cmd_predict(int argc, char **argv);
int cmd_gpus(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_compare(int argc, char **argv);
int cmd_sweep(int argc, char **argv);
int cmd_merge(int argc, char **argv);
int cmd_plan(int argc, char **argv);
int cmd_plot(int argc, char **argv);
int cmd_calibrate(int argc, char **argv);
int cmd_prune(int argc, char **argv);

#endif

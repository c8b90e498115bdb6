/* launch: how parallax's multi-rank commands start and stop their processes. The supervisor runs
 * mpirun as its child, gives the job a private folder in /dev/shm for its shared-memory segments
 * and removes it on every end of the job it can see; the guardian splits each rank into a watcher
 * and the worker that does the rank's work, so that a rank killed by a signal is named and a
 * launcher's death takes its ranks with it. What a rank computes, and every MPI call, are the
 * commands' (docs/gpu_comm.md, "Errors and hangs", has the picture). */
#ifndef PX_CLI_LAUNCH_H
#define PX_CLI_LAUNCH_H

#include <stddef.h>

/* The supervisor, for a command not under any launcher that wants ranks > 1: runs mpirun -np
 * ranks with this binary and argv (argv[0] the command's name) as its child, as root and
 * oversubscribed where needed (a testbed, often a container). Before, it removes the folders of
 * earlier supervisors of this user that are gone (killed outright) and makes its own,
 * /dev/shm/px-run-UID-PID, which the ranks find in PX_RUN_DIR and Open MPI's shared-memory
 * transport uses for its segments. SIGINT, SIGTERM and SIGHUP are passed to mpirun; mpirun dies
 * with this process (a parent-death signal). After mpirun ends it waits for every rank that
 * outlived it (they are re-parented here), killing those still there after 10 s, removes the
 * folder, and returns mpirun's exit status, 128 + N when mpirun was killed by signal N (said on
 * stderr), or 1 when mpirun could not start (said). A signal this process received ends it by the
 * same signal once all that is done. cmd names the command in messages. */
int launch_mpirun(const char *cmd, int ranks, char **argv, int argc);
/* The same with mpirun --hostfile HOSTFILE (Open MPI's "HOST slots=N" lines) placing the ranks
 * on its hosts, when hostfile is not NULL. */
int launch_mpirun_hosts(const char *cmd, int ranks, const char *hostfile, char **argv, int argc);

/* The supervisor's folder as its ranks see it (PX_RUN_DIR), or NULL outside one. */
const char *launch_run_dir(void);

/* Remove the folder path and everything under it without following a symbolic link (one is
 * removed, never what it points to). 0, or -1 with errno of the first entry that would not go. */
int launch_remove_tree(const char *path);

/* A zeroed region of bytes shared by this process and the processes it forks afterwards (the
 * guardian and its worker), or NULL. It lives as long as one of them does; never freed. */
void *launch_shared(size_t bytes);

/* What the guardian saw of a worker killed by a signal it did not pass on. */
typedef struct LaunchDeath {
	int sig;
	long pid;
} LaunchDeath;

/* The guardian: fork this rank into a worker and a guardian that waits for it. In the worker it
 * returns 0 (the worker dies with SIGKILL if the guardian does). In the guardian it returns 1 only
 * when the worker was killed by a signal the guardian did not pass on (kill -9, the OOM killer, a
 * crash), *death filled in; in every other case the guardian ends the process itself: with the
 * worker's exit status, or by the signal that the guardian passed on (SIGINT, SIGTERM, SIGHUP,
 * SIGQUIT, SIGUSR1, SIGUSR2: a launcher stopping the job, Ctrl-C) and that ended the worker.
 * under_launcher: the guardian's parent is a launcher whose death must end the rank (mpirun,
 * srun); the guardian then receives SIGTERM when it dies, and passes it on. Returns -1 with errno
 * when fork fails: nothing forked, the caller goes on unguarded. stdio is flushed before. */
int launch_guard(int under_launcher, LaunchDeath *death);

/* "SIGKILL" for 9: the signal's name, or "signal N" in buf. */
const char *launch_signal_name(int sig, char *buf, size_t bytes);

#endif

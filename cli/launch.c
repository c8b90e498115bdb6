#define _GNU_SOURCE /* nftw, pipe2 */
#include "launch.h"

#include "../exec/comm.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SHM_ROOT "/dev/shm"

enum { REAP_GRACE_MS = 10000 }; /* how long ranks that outlived mpirun get before SIGKILL */

/* ---- small things ---- */

const char *launch_signal_name(int sig, char *buf, size_t bytes)
{
	static const struct { int sig; const char *name; } names[] = {
		{SIGHUP, "SIGHUP"},   {SIGINT, "SIGINT"},   {SIGQUIT, "SIGQUIT"},
		{SIGILL, "SIGILL"},   {SIGTRAP, "SIGTRAP"}, {SIGABRT, "SIGABRT"},
		{SIGBUS, "SIGBUS"},   {SIGFPE, "SIGFPE"},   {SIGKILL, "SIGKILL"},
		{SIGUSR1, "SIGUSR1"}, {SIGSEGV, "SIGSEGV"}, {SIGUSR2, "SIGUSR2"},
		{SIGPIPE, "SIGPIPE"}, {SIGALRM, "SIGALRM"}, {SIGTERM, "SIGTERM"},
		{SIGXCPU, "SIGXCPU"}, {SIGXFSZ, "SIGXFSZ"}, {SIGSYS, "SIGSYS"},
	};
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		if (names[i].sig == sig)
			return names[i].name;
	snprintf(buf, bytes, "signal %d", sig);
	return buf;
}

static void sleep_ms(long ms)
{
	struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
	while (nanosleep(&t, &t) && errno == EINTR)
		;
}

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
	(void)sb, (void)flag, (void)ftw;
	return remove(path) ? -1 : 0; /* a link (FTW_SL under FTW_PHYS) goes, never its target */
}

int launch_remove_tree(const char *path)
{
	return nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

void *launch_shared(size_t bytes)
{
	void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	return p == MAP_FAILED ? NULL : p; /* anonymous pages come zeroed */
}

const char *launch_run_dir(void)
{
	const char *d = getenv(COMM_RUN_DIR_ENV);
	return d && *d ? d : NULL;
}

/* Make the parent-death signal sig stick, or end this process when the parent it was forked by
 * (expected) is already gone: the signal is not sent for a death that came first. */
static void die_with_parent(int sig, pid_t expected)
{
	if (prctl(PR_SET_PDEATHSIG, sig) || getppid() != expected)
		_exit(128 + sig);
}

/* ---- the supervisor's folder ---- */

/* Remove what earlier supervisors of this user left in /dev/shm when they were killed outright
 * (a folder named after a process that no longer exists). A pid taken again by another process
 * keeps its folder until that one is gone too: never remove a live run's. */
static void sweep_stale_dirs(void)
{
	char prefix[64], path[512];
	int n = snprintf(prefix, sizeof(prefix), "px-run-%u-", (unsigned)getuid());
	DIR *d = opendir(SHM_ROOT);
	if (!d)
		return;
	for (struct dirent *e; (e = readdir(d));) {
		char *end;
		if (strncmp(e->d_name, prefix, (size_t)n))
			continue;
		long pid = strtol(e->d_name + n, &end, 10);
		if (*end || pid <= 0 || !(kill((pid_t)pid, 0) && errno == ESRCH))
			continue;
		snprintf(path, sizeof(path), "%s/%s", SHM_ROOT, e->d_name);
		launch_remove_tree(path);
	}
	closedir(d);
}

/* ---- the supervisor ---- */

static volatile sig_atomic_t sup_child;  /* mpirun, once forked */
static volatile sig_atomic_t sup_signal; /* the last signal this process received */

static void sup_forward(int sig)
{
	sup_signal = sig;
	if (sup_child > 0)
		kill((pid_t)sup_child, sig);
}

static const int sup_signals[] = {SIGINT, SIGTERM, SIGHUP};
enum { N_SUP_SIGNALS = sizeof(sup_signals) / sizeof(sup_signals[0]) };

/* Every child this process has (ranks re-parented here after mpirun died) gets SIGKILL. */
static void kill_children(void)
{
	char path[64], line[4096];
	snprintf(path, sizeof(path), "/proc/self/task/%ld/children", (long)getpid());
	FILE *f = fopen(path, "r");
	if (!f)
		return;
	while (fscanf(f, "%4095s", line) == 1)
		kill((pid_t)atol(line), SIGKILL);
	fclose(f);
}

/* mpirun has ended: reap the ranks that outlived it. Each dies with its guardian, which dies
 * with mpirun (parent-death signals); after the grace period whatever is left is killed. */
static void reap_orphans(void)
{
	long waited = 0;
	int killed = 0;
	for (;;) {
		int st;
		pid_t w = waitpid(-1, &st, killed ? 0 : WNOHANG);
		if (w > 0 || (w < 0 && errno == EINTR))
			continue;
		if (w < 0) /* ECHILD: nobody left */
			return;
		if (waited >= REAP_GRACE_MS && !killed) {
			kill_children();
			killed = 1;
			continue;
		}
		sleep_ms(20);
		waited += 20;
	}
}

/* The child: mpirun with the job's folder, dying with the supervisor. Reports exec's errno on
 * the close-on-exec pipe fd. */
static void exec_mpirun(char **args, const char *dir, pid_t parent, int fd, const sigset_t *old)
{
	for (int i = 0; i < N_SUP_SIGNALS; i++)
		signal(sup_signals[i], SIG_DFL);
	sigprocmask(SIG_SETMASK, old, NULL);
	die_with_parent(SIGTERM, parent); /* mpirun stops its ranks on SIGTERM */
	if (dir) {
		setenv(COMM_RUN_DIR_ENV, dir, 1);
		/* Open MPI's shared-memory transport puts its segments there (unless told
		 * otherwise): vader in 4.x, renamed sm in 5.x; each ignores the other's name */
		setenv("OMPI_MCA_btl_vader_backing_directory", dir, 0);
		setenv("OMPI_MCA_btl_sm_backing_directory", dir, 0);
	}
	execvp(args[0], args);
	int e = errno;
	if (write(fd, &e, sizeof(e)) < 0)
		_exit(127);
	_exit(127);
}

int launch_mpirun(const char *cmd, int ranks, char **argv, int argc)
{
	return launch_mpirun_hosts(cmd, ranks, NULL, argv, argc);
}

int launch_mpirun_hosts(const char *cmd, int ranks, const char *hostfile, char **argv, int argc)
{
	char np[16], self[4096], dir_buf[256];
	const char *dir = NULL;
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	if (n <= 0)
		return fprintf(stderr, "parallax %s: cannot find my own executable\n", cmd), 1;
	self[n] = '\0';
	snprintf(np, sizeof(np), "%d", ranks);
	char **args = calloc((size_t)argc + 12, sizeof(char *));
	if (!args)
		return fprintf(stderr, "parallax %s: out of memory\n", cmd), 1;
	int k = 0;
	args[k++] = "mpirun";
	args[k++] = "--allow-run-as-root";
	args[k++] = "--oversubscribe";
	if (hostfile) {
		args[k++] = "--hostfile";
		args[k++] = (char *)hostfile;
	}
	args[k++] = "-np";
	args[k++] = np;
	args[k++] = self;
	for (int i = 0; i < argc; i++)
		args[k++] = argv[i];

	sweep_stale_dirs();
	snprintf(dir_buf, sizeof(dir_buf), "%s/px-run-%u-%ld", SHM_ROOT, (unsigned)getuid(),
		 (long)getpid());
	if (!mkdir(dir_buf, 0700))
		dir = dir_buf;
	else /* no /dev/shm (or full): Open MPI's defaults, which a killed mpirun leaves behind */
		fprintf(stderr, "parallax %s: cannot create %s: %s; going on without it\n", cmd,
			dir_buf, strerror(errno));
	prctl(PR_SET_CHILD_SUBREAPER, 1);

	int pipefd[2] = {-1, -1}, rc = 1;
	sigset_t block, old;
	sigemptyset(&block);
	for (int i = 0; i < N_SUP_SIGNALS; i++)
		sigaddset(&block, sup_signals[i]);
	sigprocmask(SIG_BLOCK, &block, &old);
	for (int i = 0; i < N_SUP_SIGNALS; i++) {
		struct sigaction sa = {.sa_handler = sup_forward};
		sigemptyset(&sa.sa_mask);
		sigaction(sup_signals[i], &sa, NULL);
	}
	fflush(NULL);
	pid_t parent = getpid(), child = -1;
	if (!pipe2(pipefd, O_CLOEXEC))
		child = fork();
	if (child == 0)
		exec_mpirun(args, dir, parent, pipefd[1], &old);
	if (child < 0) {
		fprintf(stderr, "parallax %s: cannot start mpirun: %s\n", cmd, strerror(errno));
		goto out;
	}
	sup_child = child;
	sigprocmask(SIG_SETMASK, &old, NULL);
	close(pipefd[1]);
	pipefd[1] = -1;
	int e = 0;
	ssize_t got;
	while ((got = read(pipefd[0], &e, sizeof(e))) < 0 && errno == EINTR)
		;
	if (got == sizeof(e))
		fprintf(stderr, "parallax %s: cannot start mpirun (install openmpi-bin): %s\n", cmd,
			strerror(e));

	int st = 0;
	for (;;) { /* every child reaped here is a rank mpirun left behind, or mpirun */
		pid_t w = waitpid(-1, &st, 0);
		if (w == child || (w < 0 && errno != EINTR))
			break;
	}
	sup_child = 0;
	reap_orphans();
	if (got == sizeof(e))
		rc = 1;
	else if (WIFEXITED(st))
		rc = WEXITSTATUS(st);
	else if (WIFSIGNALED(st)) {
		char buf[32];
		int sig = WTERMSIG(st);
		if (sig != sup_signal)
			fprintf(stderr, "parallax %s: mpirun was killed by %s (%s); its ranks were "
				"stopped\n", cmd, launch_signal_name(sig, buf, sizeof(buf)),
				strsignal(sig));
		rc = 128 + sig;
	}
out:
	if (pipefd[0] >= 0)
		close(pipefd[0]);
	if (pipefd[1] >= 0)
		close(pipefd[1]);
	if (dir)
		launch_remove_tree(dir);
	free(args);
	sigprocmask(SIG_SETMASK, &old, NULL);
	if (sup_signal) { /* end as the signal asked, now that nothing is left behind */
		int sig = sup_signal;
		signal(sig, SIG_DFL);
		raise(sig);
	}
	return rc;
}

/* ---- the guardian ---- */

static volatile sig_atomic_t guard_worker;    /* the worker's pid */
static volatile sig_atomic_t guard_forwarded; /* the last signal passed on to it */

static void guard_forward(int sig)
{
	guard_forwarded = sig;
	if (guard_worker > 0)
		kill((pid_t)guard_worker, sig);
}

static const int guard_signals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};
enum { N_GUARD_SIGNALS = sizeof(guard_signals) / sizeof(guard_signals[0]) };

int launch_guard(int under_launcher, LaunchDeath *death)
{
	sigset_t block, old;
	sigemptyset(&block);
	for (int i = 0; i < N_GUARD_SIGNALS; i++)
		sigaddset(&block, guard_signals[i]);
	fflush(NULL);
	/* blocked across the fork: a signal that comes before the handlers are in place waits */
	sigprocmask(SIG_BLOCK, &block, &old);
	pid_t guardian = getpid(), launcher = getppid();
	pid_t worker = fork();
	if (worker < 0) {
		int e = errno;
		sigprocmask(SIG_SETMASK, &old, NULL);
		errno = e;
		return -1;
	}
	if (worker == 0) {
		sigprocmask(SIG_SETMASK, &old, NULL);
		die_with_parent(SIGKILL, guardian);
		return 0;
	}
	guard_worker = worker;
	for (int i = 0; i < N_GUARD_SIGNALS; i++) {
		struct sigaction sa = {.sa_handler = guard_forward};
		sigemptyset(&sa.sa_mask);
		sigaction(guard_signals[i], &sa, NULL);
	}
	if (under_launcher && (prctl(PR_SET_PDEATHSIG, SIGTERM) || getppid() != launcher))
		kill(getpid(), SIGTERM); /* the launcher is gone already: pass that on too */
	sigprocmask(SIG_SETMASK, &old, NULL);

	int st;
	while (waitpid(worker, &st, 0) < 0)
		if (errno != EINTR) /* cannot happen for our own child; end as it would have */
			_exit(1);
	if (WIFEXITED(st))
		_exit(WEXITSTATUS(st));
	int sig = WTERMSIG(st);
	if (sig == guard_forwarded) { /* the job was stopped, not this rank killed */
		signal(sig, SIG_DFL);
		sigprocmask(SIG_SETMASK, &old, NULL);
		raise(sig);
		_exit(128 + sig);
	}
	death->sig = sig;
	death->pid = (long)worker;
	return 1;
}

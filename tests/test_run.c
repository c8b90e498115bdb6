/* `parallax run` at its edges: a rank killed by a signal stops the job with exit 124, named, and
 * is recorded as failed; killing parallax run or its mpirun leaves no rank and no shared memory
 * behind; checkpoints are written and replaced without a shell, never through a symbolic link,
 * and a full disk is named with no partial file left; a run too large for this machine is refused
 * before anything starts. Runs the release binary (PX_RUN_BIN), as the exec suite does. */
#include <CUnit/CUnit.h>
#include <cjson/cJSON.h>
#include <dirent.h>
#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "suites.h"

/* ---- helpers ---- */

/* PX_TEST_GPT_SCENARIO (suites.h) at ZeRO-0 in bf16, in a fresh folder (*dir) whose path makes
 * every process of the run findable by its command line. */
static const char *scenario(char *dir, size_t n)
{
	static char path[512];
	char text[2048];
	snprintf(dir, n, "%s", px_test_tmpdir());
	snprintf(path, sizeof(path), "%s/run.json", dir);
	snprintf(text, sizeof(text), PX_TEST_GPT_SCENARIO, "run-test", "true", 0);
	px_test_write_file(path, text);
	return path;
}

static const char *bin(void)
{
	const char *b = getenv("PX_RUN_BIN") ? getenv("PX_RUN_BIN") : getenv("PX_BIN");
	return b ? b : "build/rel/parallax";
}


/* Live processes (not this one) whose command line holds needle. */
static int count_procs(const char *needle)
{
	DIR *d = opendir("/proc");
	int n = 0;
	for (struct dirent *e; d && (e = readdir(d));) {
		char path[300], buf[8192];
		if (e->d_name[0] < '1' || e->d_name[0] > '9' || atol(e->d_name) == (long)getpid())
			continue;
		snprintf(path, sizeof(path), "/proc/%s/cmdline", e->d_name);
		FILE *f = fopen(path, "r");
		if (!f)
			continue;
		size_t len = fread(buf, 1, sizeof(buf) - 1, f);
		fclose(f);
		for (size_t i = 0; i < len; i++)
			buf[i] = buf[i] ? buf[i] : ' ';
		buf[len] = '\0';
		n += strstr(buf, needle) != NULL;
	}
	if (d)
		closedir(d);
	return n;
}

/* How many processes holding needle are left after waiting up to limit_s for them to go. The
 * limit is for a loaded machine; they normally go within a second. */
static int procs_left(const char *needle, double limit_s)
{
	int n = count_procs(needle);
	for (double t = 0; n && t < limit_s; t += 0.1) {
		usleep(100000);
		n = count_procs(needle);
	}
	return n;
}

/* The supervisor's folder for pid: /dev/shm/px-run-UID-PID. */
static const char *run_dir(long pid)
{
	static char path[128];
	snprintf(path, sizeof(path), "/dev/shm/px-run-%u-%ld", (unsigned)getuid(), pid);
	return path;
}

/* The number after key in text ("supervisor 1234"), or -1. */
static long number_after(const char *text, const char *key)
{
	const char *p = strstr(text, key);
	return p ? strtol(p + strlen(key), NULL, 10) : -1;
}

/* ---- a killed rank ---- */

/* Rank 1 is killed with SIGKILL at the start of step 3 (--inject-kill, the worker killing itself
 * as kill -9 would): its guardian names the rank, the signal and the step, records the run as
 * failed with rank 1's measurements over the 2 steps it finished, and the job ends with 124;
 * no process of the run is left and the supervisor's shared-memory folder is gone. Before the
 * guardian, a rank killed outright ended the job with 137 (mpirun's 128 + 9) and stored nothing. */
static void test_killed_rank_recorded(void)
{
	char dir[256], cmd[4096], text[65536], db_path[512];
	const char *scn = scenario(dir, sizeof(dir));
	snprintf(db_path, sizeof(db_path), "%s/kill.db", dir);
	snprintf(cmd, sizeof(cmd), "timeout 120 sh -c '\"%s\" run \"%s\" --ranks 2 --steps 6 "
		 "--deadline 100 --inject-kill 1@3 --db \"%s\" & echo supervisor $!; wait $!; "
		 "echo rc=$?' 2>&1", bin(), scn, db_path);
	CU_ASSERT_EQUAL(px_test_run_sh(cmd, text, sizeof(text)), 0);
	CU_ASSERT_EQUAL(number_after(text, "rc="), 124);
	long sup = number_after(text, "supervisor ");
	char line[128];
	snprintf(line, sizeof(line), "parallax run: rank 1 (pid ");
	const char *l = strstr(text, line);
	CU_ASSERT_PTR_NOT_NULL_FATAL(l);
	CU_ASSERT_PTR_NOT_NULL(strstr(l, ") was killed by SIGKILL (Killed) during step 3: the job "
				     "stops (exit 124)\n"));
	if (number_after(text, "rc=") != 124)
		fprintf(stderr, "\n%s\n", text);
	CU_ASSERT_EQUAL(procs_left(dir, 30), 0);
	CU_ASSERT(sup > 0 && access(run_dir(sup), F_OK) != 0);
	sqlite3 *db;
	CU_ASSERT_EQUAL_FATAL(sqlite3_open(db_path, &db), SQLITE_OK);
	CU_ASSERT_EQUAL(px_test_query(db, "SELECT COUNT(*) FROM runs WHERE kind = 'measured' AND status = "
			      "'failed' AND notes LIKE 'parallax run --backend cpu stopped at step 3: "
			      "rank 1 (pid %) was killed by SIGKILL (Killed) during step 3'"), 1);
	/* what rank 1 had measured: its own rows only, over 2 finished steps, and the bytes it
	 * requested at its peak are its prediction, as in a run that ends well */
	CU_ASSERT_EQUAL(px_test_query(db, "SELECT COUNT(DISTINCT rank) FROM metrics JOIN runs ON runs.id = "
			      "run_id WHERE status = 'failed'"), 1);
	CU_ASSERT_EQUAL(px_test_query(db, "SELECT value FROM metrics JOIN runs ON runs.id = run_id WHERE "
			      "status = 'failed' AND name = 'steps' AND rank = 1"), 2);
	CU_ASSERT_EQUAL(px_test_query(db, "SELECT COUNT(*) FROM predicted_vs_measured v JOIN metrics r "
			      "ON r.run_id = v.measured_run_id AND r.rank = 1 AND r.name = "
			      "'memory.gpu.requested_peak_bytes' WHERE v.rank = 1 AND v.name = "
			      "'memory.gpu.peak_bytes' AND r.value = v.predicted"), 1);
	sqlite3_close(db);
}

/* One rank, no mpirun: the guardian is parallax run itself. Killed at step 2, recorded with the
 * one step it finished; --no-db: said, and nothing stored. */
static void test_killed_single_rank(void)
{
	char dir[256], args[2048], text[65536], db_path[512];
	const char *scn = scenario(dir, sizeof(dir));
	snprintf(db_path, sizeof(db_path), "%s/one.db", dir);
	snprintf(args, sizeof(args), "run '%s' --steps 4 --inject-kill 0@2 --db '%s'", scn, db_path);
	CU_ASSERT_EQUAL(px_test_run_release(args, 120, text, sizeof(text)), 124);
	CU_ASSERT_PTR_NOT_NULL(strstr(text, ") was killed by SIGKILL (Killed) during step 2"));
	CU_ASSERT_PTR_NOT_NULL(strstr(text, "recorded the failed run in"));
	sqlite3 *db;
	CU_ASSERT_EQUAL_FATAL(sqlite3_open(db_path, &db), SQLITE_OK);
	CU_ASSERT_EQUAL(px_test_query(db, "SELECT value FROM metrics JOIN runs ON runs.id = run_id WHERE "
			      "status = 'failed' AND name = 'steps' AND rank = 0"), 1);
	sqlite3_close(db);
	snprintf(args, sizeof(args), "run '%s' --steps 4 --inject-kill 0@1 --no-db", scn);
	CU_ASSERT_EQUAL(px_test_run_release(args, 120, text, sizeof(text)), 124);
	CU_ASSERT_PTR_NOT_NULL(strstr(text, ") was killed by SIGKILL (Killed) during step 1"));
	CU_ASSERT_PTR_NULL(strstr(text, "recorded"));
	CU_ASSERT_EQUAL(procs_left(dir, 30), 0);
}

/* ---- the launcher killed ---- */

/* A script that starts a 2-rank run whose rank 1 stops answering at step 2 (so that nothing ends
 * by itself), waits for step 1's line, sends signal SIG to TARGET (sup: parallax run, the
 * supervisor; mpirun: its child), waits for the supervisor and prints its pid and exit status. */
static const char KILL_SCRIPT[] =
	"BIN=$1 SCN=$2 LOG=$3 TARGET=$4 SIG=$5\n"
	"\"$BIN\" run \"$SCN\" --ranks 2 --steps 6 --deadline 100 --inject-hang 1@2 --no-db "
	"> \"$LOG\" 2>&1 &\n"
	"sup=$!\n"
	"echo supervisor $sup\n"
	"i=0\n"
	"while ! grep -q '^step    1' \"$LOG\"; do\n"
	"  i=$((i + 1)); if [ $i -gt 900 ]; then echo 'no step 1'; kill -9 $sup; exit 3; fi\n"
	"  sleep 0.1\n"
	"done\n"
	"echo segments $(ls -A /dev/shm/px-run-$(id -u)-$sup | grep -c vader_segment)\n"
	"if [ \"$TARGET\" = mpirun ]; then kill -$SIG $(cat /proc/$sup/task/$sup/children)\n"
	"else kill -$SIG $sup; fi\n"
	"wait $sup\n"
	"echo rc=$?\n";

/* Run KILL_SCRIPT for target and sig; the supervisor's pid, its exit status into *rc. While the
 * job runs, Open MPI's shared-memory segments (one per rank) are in the supervisor's folder,
 * which is what makes them removable whatever happens to mpirun. */
static long kill_launcher(const char *target, const char *sig, int *rc, char *log, size_t n)
{
	char dir[256], script[512], log_path[512], cmd[4096], text[4096];
	const char *scn = scenario(dir, sizeof(dir));
	snprintf(script, sizeof(script), "%s/kill.sh", dir);
	snprintf(log_path, sizeof(log_path), "%s/run.log", dir);
	px_test_write_file(script, KILL_SCRIPT);
	snprintf(cmd, sizeof(cmd), "timeout 200 sh '%s' '%s' '%s' '%s' %s %s", script, bin(), scn,
		 log_path, target, sig);
	CU_ASSERT_EQUAL(px_test_run_sh(cmd, text, sizeof(text)), 0);
	*rc = (int)number_after(text, "rc=");
	CU_ASSERT_EQUAL(number_after(text, "segments "), 2);
	FILE *f = fopen(log_path, "r");
	size_t len = f ? fread(log, 1, n - 1, f) : 0;
	log[len] = '\0';
	if (f)
		fclose(f);
	/* every process of the run is gone: no rank outlives its launcher */
	int left = procs_left(dir, 30);
	if (left)
		fprintf(stderr, "\n%s %s: %d processes of the run left\n%s\n", target, sig, left, text);
	CU_ASSERT_EQUAL(left, 0);
	return number_after(text, "supervisor ");
}

/* mpirun killed outright: its ranks die with it (their guardians' parent-death signal), the
 * supervisor says so, removes the job's shared memory and ends with 128 + 9. */
static void test_mpirun_killed(void)
{
	char log[65536];
	int rc;
	long sup = kill_launcher("mpirun", "KILL", &rc, log, sizeof(log));
	CU_ASSERT_EQUAL(rc, 137);
	CU_ASSERT_PTR_NOT_NULL(strstr(log, "parallax run: mpirun was killed by SIGKILL (Killed); "
					   "its ranks were stopped"));
	CU_ASSERT(sup > 0 && access(run_dir(sup), F_OK) != 0);
}

/* parallax run stopped with SIGTERM: mpirun stops the ranks, the folder goes, and parallax run
 * ends by the signal it was sent (the shell's 128 + 15). */
static void test_run_terminated(void)
{
	char log[65536];
	int rc;
	long sup = kill_launcher("sup", "TERM", &rc, log, sizeof(log));
	CU_ASSERT_EQUAL(rc, 143);
	CU_ASSERT(sup > 0 && access(run_dir(sup), F_OK) != 0);
}

/* parallax run killed outright: mpirun gets SIGTERM (its parent-death signal) and stops the
 * ranks; nothing is left to remove the folder, so the next supervisor does (its owner is gone). */
static void test_run_killed(void)
{
	char log[65536], dir[256], args[1024], text[65536];
	int rc;
	long sup = kill_launcher("sup", "KILL", &rc, log, sizeof(log));
	CU_ASSERT_EQUAL(rc, 137);
	CU_ASSERT(sup > 0);
	struct stat sb;
	if (!stat(run_dir(sup), &sb)) { /* left behind: empty, Open MPI's segments removed */
		DIR *d = opendir(run_dir(sup));
		int entries = 0;
		for (struct dirent *e; d && (e = readdir(d));)
			entries += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
		if (d)
			closedir(d);
		CU_ASSERT_EQUAL(entries, 0);
	}
	snprintf(args, sizeof(args), "run '%s' --ranks 2 --steps 1 --no-db",
		 scenario(dir, sizeof(dir)));
	CU_ASSERT_EQUAL(px_test_run_release(args, 120, text, sizeof(text)), 0);
	CU_ASSERT(access(run_dir(sup), F_OK) != 0);
}

/* ---- checkpoints on disk ---- */

/* --save DIR with a quote and a command in its name: the checkpoint is written at that literal
 * path, and the command never runs (the folder of an earlier save of the same step was removed
 * with system("rm -rf '%s'"), which ran it). A second run saving the same step replaces the
 * first's checkpoint. */
static void test_save_dir_quoted(void)
{
	char dir[256], text[65536], path[1024];
	const char *scn = scenario(dir, sizeof(dir));
	const char *save = "ck';touch pwned;'";
	/* run from dir, so that the payload's relative file would land there */
	for (int k = 0; k < 2; k++) {
		char cmd[4096];
		snprintf(cmd, sizeof(cmd), "cd '%s' && timeout 120 '%s' run '%s' --steps 2 --no-db "
			 "--save \"%s\" 2>&1", dir, bin(), scn, save);
		CU_ASSERT_EQUAL(px_test_run_sh(cmd, text, sizeof(text)), 0);
	}
	snprintf(path, sizeof(path), "%s/pwned", dir);
	CU_ASSERT_NOT_EQUAL(access(path, F_OK), 0);
	snprintf(path, sizeof(path), "%s/%s/step-00000002/rank-00000.bin", dir, save);
	CU_ASSERT_EQUAL(access(path, F_OK), 0);
	snprintf(path, sizeof(path), "%s/%s/latest", dir, save);
	CU_ASSERT_EQUAL(access(path, F_OK), 0);
}

static int read_text(const char *path, char *buf, size_t n)
{
	FILE *f = fopen(path, "r");
	size_t len = f ? fread(buf, 1, n - 1, f) : 0;
	buf[len] = '\0';
	if (f)
		fclose(f);
	return f ? 0 : -1;
}

/* Symbolic links in a checkpoint folder are never followed, and what parallax did not write is
 * never removed: a link where a crashed save left its part file (a stale step-N.tmp) would have
 * been opened with fopen("wb"), truncating and overwriting its target; a link inside an earlier
 * step-N is named and left, and so is the folder it points to. */
static void test_save_symlinks(void)
{
	char dir[256], args[2048], text[65536], target[512], ck[512], cmd[2048], buf[64];
	const char *scn = scenario(dir, sizeof(dir));
	snprintf(target, sizeof(target), "%s/target", dir);
	snprintf(ck, sizeof(ck), "%s/ck", dir);
	px_test_write_file(target, "precious\n");
	snprintf(cmd, sizeof(cmd), "mkdir -p '%s/step-00000002.tmp' && ln -s '%s' "
		 "'%s/step-00000002.tmp/rank-00000.bin.part'", ck, target, ck);
	CU_ASSERT_EQUAL_FATAL(system(cmd), 0);
	snprintf(args, sizeof(args), "run '%s' --steps 2 --no-db --save '%s'", scn, ck);
	CU_ASSERT_EQUAL(px_test_run_release(args, 120, text, sizeof(text)), 1);
	CU_ASSERT_PTR_NOT_NULL(strstr(text, "step-00000002.tmp/rank-00000.bin.part: a symbolic link "
				       "parallax did not write; nothing was removed"));
	CU_ASSERT_EQUAL(read_text(target, buf, sizeof(buf)), 0);
	CU_ASSERT_STRING_EQUAL(buf, "precious\n");

	/* an earlier step-2 holding a link to a folder outside */
	snprintf(cmd, sizeof(cmd), "rm -r '%s' && mkdir -p '%s/step-00000002' && ln -s '%s' "
		 "'%s/step-00000002/evil'", ck, ck, dir, ck);
	CU_ASSERT_EQUAL_FATAL(system(cmd), 0);
	CU_ASSERT_EQUAL(px_test_run_release(args, 120, text, sizeof(text)), 1);
	CU_ASSERT_PTR_NOT_NULL(strstr(text, "step-00000002/evil: a symbolic link parallax did not "
				       "write; nothing was removed"));
	CU_ASSERT_EQUAL(read_text(target, buf, sizeof(buf)), 0);
	CU_ASSERT_STRING_EQUAL(buf, "precious\n");
	snprintf(cmd, sizeof(cmd), "%s/step-00000002/evil", ck);
	struct stat sb;
	CU_ASSERT(lstat(cmd, &sb) == 0 && S_ISLNK(sb.st_mode));
}

/* A checkpoint that does not fit (a 64 KiB tmpfs, mounted in a mount namespace of its own): the
 * message names the file and the system's reason, and no file is left in the folder. Before, it
 * said "writing a checkpoint failed" and left the truncated part file. Needs unshare(1) and the
 * right to mount (root, or user namespaces); where neither is allowed it says so and checks
 * nothing. */
static void test_save_full_disk(void)
{
	char dir[256], cmd[4096], text[65536], mnt[512];
	const char *scn = scenario(dir, sizeof(dir));
	snprintf(mnt, sizeof(mnt), "%s/small", dir);
	CU_ASSERT_EQUAL_FATAL(mkdir(mnt, 0755), 0);
	static const char *const how[] = {"unshare -m", "unshare -rm"};
	int rc = -1;
	for (int i = 0; i < 2 && rc != 0 && rc != 1; i++) {
		snprintf(cmd, sizeof(cmd), "%s sh -c \"mount -t tmpfs -o size=64k tmpfs '%s' || exit "
			 "99; timeout 120 '%s' run '%s' --steps 2 --no-db --save '%s/ck'; echo rc=\\$?; "
			 "echo files:; find '%s' -type f; echo end\" 2>&1", how[i], mnt, bin(), scn,
			 mnt, mnt);
		px_test_run_sh(cmd, text, sizeof(text));
		rc = (int)number_after(text, "rc=");
	}
	if (rc != 0 && rc != 1) {
		fprintf(stderr, "\n  (cannot mount a small tmpfs here: the full-disk check did not "
			"run)\n%s\n", text);
		return;
	}
	CU_ASSERT_EQUAL(rc, 1);
	CU_ASSERT_PTR_NOT_NULL(strstr(text, "/ck/step-00000002.tmp/rank-00000.bin.part: writing a "
				       "checkpoint failed: No space left on device"));
	CU_ASSERT_PTR_NOT_NULL(strstr(text, "files:\nend\n")); /* find listed nothing */
}

/* ---- the size guard ---- */

/* sh -c cmd (output into out) from a process of its own, so that the largest resident size of
 * anything it ran (RUSAGE_CHILDREN of that process) is this command's; into *maxrss_kib. */
static int run_rss(const char *cmd, char *out, size_t n, long *maxrss_kib)
{
	char file[512], full[8192];
	snprintf(file, sizeof(file), "%s/out.txt", px_test_tmpdir());
	snprintf(full, sizeof(full), "%s > '%s' 2>&1", cmd, file);
	int fd[2];
	if (pipe(fd))
		return -1;
	pid_t p = fork();
	if (p == 0) {
		close(fd[0]);
		long r[2] = {system(full), 0};
		struct rusage ru;
		getrusage(RUSAGE_CHILDREN, &ru);
		r[1] = ru.ru_maxrss;
		_exit(write(fd[1], r, sizeof(r)) == sizeof(r) ? 0 : 1);
	}
	close(fd[1]);
	long r[2] = {-1, -1};
	ssize_t got = p > 0 ? read(fd[0], r, sizeof(r)) : -1;
	close(fd[0]);
	if (p > 0)
		waitpid(p, NULL, 0);
	read_text(file, out, n);
	*maxrss_kib = r[1];
	return got == sizeof(r) && WIFEXITED(r[0]) ? WEXITSTATUS(r[0]) : -1;
}

/* kB of "key:" in /proc/meminfo, or -1 */
static double meminfo_kib(const char *key)
{
	char line[256], k[64];
	double v = -1, x;
	FILE *f = fopen("/proc/meminfo", "r");
	while (f && fgets(line, sizeof(line), f))
		if (sscanf(line, "%63[^:]: %lf", k, &x) == 2 && !strcmp(k, key))
			v = x;
	if (f)
		fclose(f);
	return v;
}

/* The prediction's host memory per rank for scenario on ranks (backend cpu, 1 node), from
 * parallax predict: the figure the guard must say. */
static double predicted_rank_bytes(const char *scn, int ranks)
{
	char args[1024], text[1 << 17];
	snprintf(args, sizeof(args), "predict --no-db --json '%s' --set backend=cpu --set "
		 "cluster.nodes=1 --set cluster.gpus_per_node=%d", scn, ranks);
	if (px_test_run_cli(args, text, sizeof(text)))
		return -1;
	cJSON *j = cJSON_Parse(text);
	const cJSON *m = cJSON_GetObjectItem(j, "memory");
	double gpu = cJSON_GetNumberValue(cJSON_GetObjectItem(cJSON_GetObjectItem(m, "gpu"),
							       "peak_bytes"));
	double cpu = cJSON_GetNumberValue(cJSON_GetObjectItem(cJSON_GetObjectItem(m, "cpu"),
							       "peak_bytes"));
	cJSON_Delete(j);
	return gpu + cpu;
}

/* GPT-2 XL on CPUs is refused before anything starts: exit 2, what it needs per rank (the
 * prediction's figure, from parallax predict) and for all ranks, what this machine has and from
 * where, what to change; no database written, and the refusal itself stays small (the issue's
 * run grew to 10 GB): under 1 GiB resident. With 1 rank (29 GiB) where the machine has less than
 * that in all, and with 64 ranks (some 600 GiB) always. */
static void test_guard_refuses(void)
{
	char dir[256], cmd[4096], text[65536], want[256], db_path[512];
	const char *xl = px_test_path("scenarios/gpt2-xl-zero1-a100.json");
	snprintf(dir, sizeof(dir), "%s", px_test_tmpdir());
	snprintf(db_path, sizeof(db_path), "%s/xl.db", dir);
	double total = meminfo_kib("MemTotal") * 1024;
	static const int ranks[] = {1, 64};
	for (int k = 0; k < 2; k++) {
		double need = predicted_rank_bytes(xl, ranks[k]);
		CU_ASSERT_FATAL(need > 0);
		if (need * ranks[k] <= total) {
			fprintf(stderr, "\n  (gpt2-xl on %d rank(s) would fit this machine's %.0f GiB: "
				"not tried)\n", ranks[k], total / 0x1p30);
			continue;
		}
		long rss = -1;
		snprintf(cmd, sizeof(cmd), "timeout 120 '%s' run '%s' --ranks %d --db '%s'", bin(),
			 xl, ranks[k], db_path);
		CU_ASSERT_EQUAL(run_rss(cmd, text, sizeof(text), &rss), 2);
		snprintf(want, sizeof(want), "parallax run: gpt2-xl-zero1-a100 needs %.1f GiB of memory "
			 "per rank (the executor's buffers at their peak, as predicted for backend "
			 "cpu), %.1f GiB for %d rank%s, and this machine has ", need / 0x1p30,
			 need * ranks[k] / 0x1p30, ranks[k], ranks[k] > 1 ? "s" : "");
		CU_ASSERT_PTR_NOT_NULL(strstr(text, want));
		if (!strstr(text, want))
			fprintf(stderr, "\nwanted: %s\ngot: %s\n", want, text);
		CU_ASSERT(strstr(text, "available (MemAvailable in /proc/meminfo): nothing was "
				 "started") || strstr(text, "available (the cgroup's"));
		CU_ASSERT_PTR_NOT_NULL(strstr(text, "--ranks N"));
		CU_ASSERT_PTR_NOT_NULL(strstr(text, "--set model.n_layer=N"));
		CU_ASSERT_PTR_NULL(strstr(text, "mpirun"));
		CU_ASSERT_NOT_EQUAL(access(db_path, F_OK), 0);
		CU_ASSERT(rss > 0 && rss < 1024 * 1024);
	}
	/* a bad --inject-kill is bad input */
	snprintf(cmd, sizeof(cmd), "run '%s' --no-db --inject-kill 1", xl);
	CU_ASSERT_EQUAL(px_test_run_cli(cmd, text, sizeof(text)), 2);
	CU_ASSERT_PTR_NOT_NULL(strstr(text, "--inject-kill 1: expected"));
}

/* The test model on 2 ranks runs, having said what it needs: its buffers' peak per rank is what
 * the run then requests at its peak (2.4 MiB), twice that for both ranks, and the step estimate's FLOPs are
 * the model's. Per micro-batch of 2 x 32 = 64 tokens, forward: each block's matrices hold
 * 64 x 192 + 64 x 64 + 64 x 256 + 256 x 64 = 49152 weights (2 x 64 x 49152 FLOPs) plus the
 * attention products 4 b s^2 h = 4 x 2 x 32^2 x 64 = 524288; two blocks and the LM head's
 * 2 x 64 x 128 x 64 make 14,680,064, and backward twice that: 44,040,192 a micro-batch, 4
 * micro-batches a rank = 176,160,768. The update adds DeepSpeed-style Adam's ~10 FLOPs for each
 * of the 112,384 parameters (wte 8192, wpe 4096, 2 x 49984 per block, ln_f 128): 177,284,608.
 * The plan also counts the QKV and MLP biases (3C and 4C elements, more than C) as weights,
 * +1,376,256 (0.8%): the bound is 1%. */
static void test_guard_small_runs(void)
{
	char dir[256], args[2048], text[65536], db_path[512];
	const char *scn = scenario(dir, sizeof(dir));
	snprintf(db_path, sizeof(db_path), "%s/small.db", dir);
	snprintf(args, sizeof(args), "run '%s' --ranks 2 --steps 2 --db '%s'", scn, db_path);
	CU_ASSERT_EQUAL_FATAL(px_test_run_release(args, 120, text, sizeof(text)), 0);
	double per = -1, all = -1, mflop = -1, est = -1;
	const char *l = strstr(text, "# needs ");
	CU_ASSERT_PTR_NOT_NULL_FATAL(l);
	CU_ASSERT_EQUAL(sscanf(l, "# needs %lf MiB of host memory per rank (the executor's buffers "
			       "at their peak, as predicted for backend cpu), %lf MiB for 2 ranks;",
			       &per, &all), 2);
	l = strstr(text, "# estimated step time ");
	CU_ASSERT_PTR_NOT_NULL_FATAL(l);
	CU_ASSERT_EQUAL(sscanf(l, "# estimated step time %lf s (%lf MFLOP a step per rank;", &est,
			       &mflop), 2);
	CU_ASSERT(est > 0);
	CU_ASSERT(fabs(mflop * 1e6 - 177284608.0) <= 0.01 * 177284608.0);
	sqlite3 *db;
	CU_ASSERT_EQUAL_FATAL(sqlite3_open(db_path, &db), SQLITE_OK);
	double peak = px_test_query(db, "SELECT value FROM metrics WHERE rank = 0 AND "
			    "name = 'memory.gpu.requested_peak_bytes'");
	sqlite3_close(db);
	CU_ASSERT_DOUBLE_EQUAL(per, peak / 0x1p20, 0.05);
	CU_ASSERT_DOUBLE_EQUAL(all, 2 * peak / 0x1p20, 0.05);
	/* the estimate is printed before the run's own header */
	CU_ASSERT(strstr(text, "# needs ") < strstr(text, "# parallax run run-test"));
}

/* A deliberately wrong prediction fails the comparison with what the executor measured: a
 * 1-step 2-rank run's optimizer memory compares within 2%; the same run with the simulator alone
 * told to halve the optimizer states (PARALLAX_TEST_MISPREDICT, sim/memory.h) fails compare
 * --max-error 2 with exit 3, naming the optimizer's metric, measured at the full size. (The
 * pool's peak is not checked here: on this tiny model its 64 KiB steps put it 5% over.) */
static void test_wrong_prediction_fails(void)
{
	char dir[512], cmd[4096], text[1 << 16];
	const char *sc = scenario(dir, sizeof(dir));
	const char *hook[2] = {"", "PARALLAX_TEST_MISPREDICT=optimizer_states "};
	for (int k = 0; k < 2; k++) {
		snprintf(cmd, sizeof(cmd), "cd '%s' && %s'%s' run '%s' --ranks 2 --steps 1 --db w%d.db "
			 ">/dev/null 2>&1; echo run=$?; '%s' compare --db w%d.db --max-error 2 --only "
			 "memory.gpu.optimizer >/dev/null; echo compare=$?", dir, hook[k], bin(), sc, k, bin(), k);
		CU_ASSERT_EQUAL(px_test_run_sh(cmd, text, sizeof(text)), 0);
		PX_ASSERT_HAS(text, "run=0");
		PX_ASSERT_HAS(text, k ? "compare=3" : "compare=0");
		if (k)
			PX_ASSERT_HAS(text, "parallax compare: memory.gpu.optimizer_bytes: predicted");
	}
}

/* A failure while collectives are in flight: their buffers belong to MPI until they complete, so
 * the rank must neither free them nor call MPI_Finalize (which progressed an all-gather into
 * freed memory: SIGSEGV in mca_btl_vader, then a hang). The test hook
 * PARALLAX_TEST_FAIL_IN_FLIGHT (exec/runner.c) fails the first op of a 2-rank ZeRO-3 step that
 * finds a prefetch in flight: exit 1 within the timeout, the error named, no signal, nothing in
 * the database, and the NVMe swap directory removed. */
static void test_failure_in_flight(void)
{
	char dir[512], cmd[4096], text[1 << 16];
	const char *sc = scenario(dir, sizeof(dir));
	snprintf(cmd, sizeof(cmd), "cd '%s' && mkdir nvme && PARALLAX_TEST_FAIL_IN_FLIGHT=1 "
		 "timeout 120 '%s' run '%s' --ranks 2 --steps 1 --db f.db "
		 "--set deepspeed.zero_optimization.stage=3 "
		 "--set deepspeed.zero_optimization.offload_optimizer.device=nvme "
		 "--set deepspeed.zero_optimization.offload_optimizer.nvme_path=%s/nvme 2>&1; "
		 "echo run=$?; ls -A nvme | wc -l | sed 's/^/left=/'; ls f.db 2>&1 | grep -c 'No such' "
		 "| sed 's/^/nodb=/'", dir, bin(), sc, dir);
	CU_ASSERT_EQUAL(px_test_run_sh(cmd, text, sizeof(text)), 0);
	PX_ASSERT_HAS(text, "failed by the test hook PARALLAX_TEST_FAIL_IN_FLIGHT with 1 "
			    "collectives in flight");
	PX_ASSERT_HAS(text, "run=1\n");
	PX_ASSERT_HAS(text, "left=0\n");
	PX_ASSERT_HAS(text, "nodb=1\n");
	CU_ASSERT_PTR_NULL(strstr(text, "Segmentation"));
	CU_ASSERT_PTR_NULL(strstr(text, "signal"));
}

int test_run_register(void)
{
	return PX_ADD_SUITE("run",
			    {"a killed rank: exit 124, named, recorded", test_killed_rank_recorded,
			     PX_RELEASE_RUN},
			    {"a killed single rank: exit 124, recorded", test_killed_single_rank, PX_RELEASE_RUN},
			    {"mpirun killed: no rank left, no shared memory", test_mpirun_killed, PX_RELEASE_RUN},
			    {"parallax run terminated: no rank left", test_run_terminated, PX_RELEASE_RUN},
			    {"parallax run killed: no rank left, folder swept", test_run_killed, PX_RELEASE_RUN},
			    {"--save DIR with a quote runs no command", test_save_dir_quoted, PX_RELEASE_RUN},
			    {"--save never follows or removes a link", test_save_symlinks, PX_RELEASE_RUN},
			    {"--save on a full disk: file and reason, no part", test_save_full_disk, PX_RELEASE_RUN},
			    {"gpt2-xl on CPU refused before it starts", test_guard_refuses},
			    {"the test model runs, its needs said", test_guard_small_runs, PX_RELEASE_RUN},
			    {"a wrong prediction fails the comparison", test_wrong_prediction_fails, PX_RELEASE_RUN},
			    {"a failure mid-collective: exit 1, no signal", test_failure_in_flight,
			     PX_RELEASE_RUN});
}

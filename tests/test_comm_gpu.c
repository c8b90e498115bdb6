/* The GPU side of the executor's communication layer, as far as a machine without a GPU can check
 * it: the TCP rendezvous that bootstraps NCCL under torchrun-style launches (forked processes on
 * the loopback), gpumem's readings when NVML or the device is missing, and then, only where a CUDA
 * device is present, tests/comm_nccl_check (PX_NCCL_CHECK) under mpirun and torchrun-style
 * variables, and the staged MPI backend with several ranks on one GPU. Without a device those say
 * "skipped" and pass nothing. */
#include <CUnit/CUnit.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../exec/comm.h"
#include "../exec/gpumem.h"
#include "../exec/rendezvous.h"
#include "suites.h"

static void expect_msg(int rc, const char *got, const char *want)
{
	CU_ASSERT_EQUAL(rc, -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(got, want));
	if (rc != -1 || !strstr(got, want))
		fprintf(stderr, "\nexpected \"%s\" in \"%s\"\n", want, got);
}

/* ---- the rendezvous's address ---- */

static void test_rendezvous_env(void)
{
	char *saved[2];
	const char *names[2] = {"MASTER_ADDR", "MASTER_PORT"};
	for (int i = 0; i < 2; i++) {
		const char *v = getenv(names[i]);
		saved[i] = v ? strdup(v) : NULL;
		unsetenv(names[i]);
	}
	char host[64];
	int port = 0;
	PxError err = {0};
	expect_msg(rendezvous_addr_from_env(host, sizeof(host), &port, &err), err.msg,
		   "MASTER_ADDR is not set");
	setenv("MASTER_ADDR", "node-17", 1);
	expect_msg(rendezvous_addr_from_env(host, sizeof(host), &port, &err), err.msg,
		   "MASTER_PORT is not set");
	const char *bad[] = {"0", "65536", "29500x", "-1"};
	for (int i = 0; i < 4; i++) {
		setenv("MASTER_PORT", bad[i], 1);
		expect_msg(rendezvous_addr_from_env(host, sizeof(host), &port, &err), err.msg,
			   "MASTER_PORT must be a port number 1-65535");
	}
	setenv("MASTER_PORT", "29500", 1);
	CU_ASSERT_EQUAL(rendezvous_addr_from_env(host, sizeof(host), &port, &err), 0);
	CU_ASSERT_STRING_EQUAL(host, "node-17");
	CU_ASSERT_EQUAL(port, 29500);
	setenv("MASTER_ADDR", "a-host-name-longer-than-the-buffer-given-here", 1);
	expect_msg(rendezvous_addr_from_env(host, 16, &port, &err), err.msg,
		   "MASTER_ADDR is longer than 15 characters");
	for (int i = 0; i < 2; i++) {
		if (saved[i])
			setenv(names[i], saved[i], 1);
		else
			unsetenv(names[i]);
		free(saved[i]);
	}
}

/* ---- the rendezvous itself, between processes of this machine ---- */

/* A port that was free a moment ago (the kernel's choice for port 0). */
static int free_port(void)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t len = sizeof(a);
	if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) ||
	    getsockname(fd, (struct sockaddr *)&a, &len)) {
		if (fd >= 0)
			close(fd);
		return -1;
	}
	close(fd);
	return ntohs(a.sin_port);
}

/* Rank r's blob before the call: rank 0's is the pattern, the others' are zero. */
static void blob_fill(unsigned char *b, size_t n, int rank)
{
	for (size_t i = 0; i < n; i++)
		b[i] = rank == 0 ? (unsigned char)(i * 7 + 3) : 0;
}

/* Ranks 1..size-1 are children started before rank 0 listens (they must retry); each exits 0
 * when it received rank 0's blob exactly. */
static void test_rendezvous_bcast(void)
{
	enum { SIZE = 4, BYTES = 128 };
	int port = free_port();
	CU_ASSERT_FATAL(port > 0);
	pid_t kids[SIZE];
	for (int r = 1; r < SIZE; r++) {
		kids[r] = fork();
		CU_ASSERT_FATAL(kids[r] >= 0);
		if (kids[r] == 0) {
			unsigned char got[BYTES], want[BYTES];
			blob_fill(got, BYTES, r);
			blob_fill(want, BYTES, 0);
			int rc = rendezvous_bcast("127.0.0.1", port, r, SIZE, got, BYTES, 10, NULL);
			_exit(rc == 0 && !memcmp(got, want, BYTES) ? 0 : 1);
		}
	}
	usleep(100000); /* the children meet a closed port first */
	unsigned char blob[BYTES];
	blob_fill(blob, BYTES, 0);
	PxError err = {0};
	int rc = rendezvous_bcast("127.0.0.1", port, 0, SIZE, blob, BYTES, 10, &err);
	CU_ASSERT_EQUAL(rc, 0);
	if (rc)
		fprintf(stderr, "\n%s\n", err.msg);
	for (int r = 1; r < SIZE; r++) {
		int st = -1;
		waitpid(kids[r], &st, 0);
		CU_ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	}
}

/* Nobody comes, or nobody listens: both ends give up in time and say what they waited for. */
static void test_rendezvous_timeouts(void)
{
	int port = free_port();
	CU_ASSERT_FATAL(port > 0);
	unsigned char blob[16] = {0};
	PxError err = {0};
	expect_msg(rendezvous_bcast("127.0.0.1", port, 0, 3, blob, sizeof(blob), 0.3, &err),
		   err.msg, "rank 0 waited for 2 of 2 ranks that never connected (ranks 1, 2)");
	char want[128];
	snprintf(want, sizeof(want), "rank 2 found no rank 0 at 127.0.0.1:%d in time", port);
	expect_msg(rendezvous_bcast("127.0.0.1", port, 2, 3, blob, sizeof(blob), 0.3, &err),
		   err.msg, want);
	expect_msg(rendezvous_bcast("127.0.0.1", port, 3, 3, blob, sizeof(blob), 0.3, &err),
		   err.msg, "need 0 <= rank < size");
	CU_ASSERT_EQUAL(rendezvous_bcast("127.0.0.1", port, 0, 1, blob, sizeof(blob), 0.3, &err),
			0); /* one rank: nothing to hand over */
}

/* ---- gpumem without NVML (and, here, without a device) ---- */

static void test_gpumem_nvml_missing(void)
{
	char why[GPUMEM_WHY_BYTES];
	GpuNvml *n = gpumem_nvml_open("/nonexistent/libnvidia-ml.so.1", why, sizeof(why));
	CU_ASSERT_PTR_NULL(n);
	CU_ASSERT_PTR_NOT_NULL(strstr(why, "not available: cannot load NVML "
					   "(/nonexistent/libnvidia-ml.so.1)"));
	int64_t bytes = 0, total = 0;
	expect_msg(gpumem_nvml_process_bytes(NULL, NULL, 0, (unsigned)getpid(), &bytes, why,
					     sizeof(why)),
		   why, "not available: NVML is not loaded");
	expect_msg(gpumem_nvml_device_used(NULL, NULL, 0, &bytes, &total, why, sizeof(why)), why,
		   "not available: NVML is not loaded");
	gpumem_nvml_close(NULL);
}

/* Every reading says why it is missing; with a device, the device readings are there and
 * consistent instead (used = total - free, at most total), while NVML's stay missing. */
static void test_gpumem_snapshots(void)
{
	char why[GPUMEM_WHY_BYTES];
	int devices = gpumem_device_count(why, sizeof(why));
	GpuMem g;
	gpumem_init(&g, 0, "/nonexistent/libnvidia-ml.so.1");
	const GpuMemSnap *s0 = gpumem_snapshot(&g, "start-up");
	CU_ASSERT_PTR_NOT_NULL_FATAL(s0);
	/* before the context, the device is read through NVML, absent here */
	CU_ASSERT_FALSE(s0->device_ok);
	CU_ASSERT_PTR_NOT_NULL(strstr(s0->device_why, "not available: cannot load NVML"));
	const GpuMemSnap *s1 = gpumem_context(&g);
	CU_ASSERT_PTR_NOT_NULL_FATAL(s1);
	CU_ASSERT_FALSE(s1->process_ok);
	CU_ASSERT_PTR_NOT_NULL(strstr(s1->process_why, "not available: cannot load NVML"));
	if (devices == 0) {
		CU_ASSERT_FALSE(s1->device_ok);
		CU_ASSERT_EQUAL(strncmp(s1->device_why, "not available: ", 15), 0);
		printf("\n  (no CUDA device: %s)\n", s1->device_why);
	} else {
		CU_ASSERT(s1->device_ok && s1->used_bytes == s1->total_bytes - s1->free_bytes &&
			  s1->used_bytes > 0 && s1->used_bytes <= s1->total_bytes);
	}
	gpumem_sample(&g);
	CU_ASSERT_EQUAL(g.peak.device_ok, devices > 0);
	char out[4096] = "";
	FILE *f = fmemopen(out, sizeof(out) - 1, "w");
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	gpumem_print(&g, f);
	fclose(f);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "used_MiB"));
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "process_MiB"));
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "\nstart-up"));
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "# start-up device: not available: cannot load NVML"));
	gpumem_free(&g);
	gpumem_free(NULL);
}

/* ---- the GPU backends without a GPU: a clear refusal at start, nothing left behind ---- */

#ifdef PX_HAVE_CUDA
static void expect_no_start(const CommBackend *be)
{
	static const char *const vars[] = {"OMPI_COMM_WORLD_RANK", "SLURM_PROCID", "RANK"};
	char *saved[3];
	for (int i = 0; i < 3; i++) {
		const char *v = getenv(vars[i]);
		saved[i] = v ? strdup(v) : NULL;
		unsetenv(vars[i]);
	}
	Comm *w = NULL;
	PxError err = {0};
	expect_msg(comm_init(be, NULL, &w, &err), err.msg,
		   "rank 0: init on group world: cudaGetDeviceCount: ");
	CU_ASSERT_PTR_NULL(w);
	for (int i = 0; i < 3; i++) {
		if (saved[i])
			setenv(vars[i], saved[i], 1);
		free(saved[i]);
	}
}
#endif

static void test_backends_without_device(void)
{
#ifndef PX_HAVE_CUDA
	printf("\n  skipped: this build has no CUDA\n");
#else
	char why[GPUMEM_WHY_BYTES];
	if (gpumem_device_count(why, sizeof(why)) > 0) {
		printf("\n  skipped: a CUDA device is present (comm_nccl_check covers the start)\n");
		return;
	}
	expect_no_start(&comm_mpi_staged_backend); /* before MPI starts: nothing to leak */
#ifdef PX_HAVE_NCCL
	expect_no_start(&comm_nccl_backend);
#endif
#endif
}

/* ---- on a GPU only: comm_nccl_check ---- */

/* Devices visible, or 0 after printing why these tests are skipped. */
static int gpus_or_skip(void)
{
#ifndef PX_HAVE_NCCL
	printf("\n  skipped: this build has no NCCL\n");
	return 0;
#else
	char why[GPUMEM_WHY_BYTES];
	int n = gpumem_device_count(why, sizeof(why));
	if (n == 0)
		printf("\n  skipped: no CUDA device (%s)\n", why);
	return n;
#endif
}

static char check_out[1 << 16];

/* Run a shell command line, output into check_out; its exit status, or -1. */
static int run_shell(const char *cmd)
{
	check_out[0] = '\0';
	FILE *p = popen(cmd, "r");
	if (!p)
		return -1;
	size_t len = fread(check_out, 1, sizeof(check_out) - 1, p);
	check_out[len] = '\0';
	char sink[4096];
	while (fread(sink, 1, sizeof(sink), p) > 0)
		;
	int st = pclose(p);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static const char *nccl_check(void)
{
	const char *env = getenv("PX_NCCL_CHECK");
	return env && *env ? env : px_test_path("build/rel/comm_nccl_check");
}

/* Every rank's line says it passed everything. */
static void expect_all_passed(int rc, int ranks)
{
	int lines = 0;
	for (const char *p = check_out; (p = strstr(p, "comm_nccl_check: rank ")); p++)
		lines += strstr(p, " 0 failed") != NULL && strchr(p, '\n') > strstr(p, " 0 failed");
	CU_ASSERT_EQUAL(rc, 0);
	CU_ASSERT_EQUAL(lines, ranks);
	if (rc != 0 || lines != ranks)
		fprintf(stderr, "\nexit %d, %d of %d ranks passed:\n%s\n", rc, lines, ranks,
			check_out);
}

static void test_nccl_mpirun(void)
{
	int n = gpus_or_skip();
	if (!n)
		return;
	char cmd[8192];
	snprintf(cmd, sizeof(cmd),
		 "timeout -k 5 300 mpirun --allow-run-as-root --oversubscribe -np %d '%s' 2>&1", n,
		 nccl_check());
	expect_all_passed(run_shell(cmd), n);
}

/* The same check started as torchrun starts its workers: no MPI, the id over TCP. */
static void test_nccl_torchrun(void)
{
	int n = gpus_or_skip();
	if (!n)
		return;
	int port = free_port();
	char cmd[8192];
	snprintf(cmd, sizeof(cmd),
		 "(rc=0; pids=; for r in $(seq 0 %d); do env -u OMPI_COMM_WORLD_RANK "
		 "-u OMPI_COMM_WORLD_SIZE -u SLURM_PROCID -u SLURM_NTASKS RANK=$r WORLD_SIZE=%d "
		 "LOCAL_RANK=$r LOCAL_WORLD_SIZE=%d MASTER_ADDR=127.0.0.1 MASTER_PORT=%d "
		 "timeout -k 5 300 '%s' & pids=\"$pids $!\"; done; "
		 "for p in $pids; do wait $p || rc=1; done; exit $rc) 2>&1",
		 n - 1, n, n, port, nccl_check());
	expect_all_passed(run_shell(cmd), n);
}

/* The "N ranks on one GPU": four ranks share device 0 through the staged MPI backend. */
static void test_staged_one_gpu(void)
{
	if (!gpus_or_skip())
		return;
	char cmd[8192];
	snprintf(cmd, sizeof(cmd),
		 "CUDA_VISIBLE_DEVICES=0 timeout -k 5 300 mpirun --allow-run-as-root "
		 "--oversubscribe -np 4 '%s' --backend staged 2>&1",
		 nccl_check());
	expect_all_passed(run_shell(cmd), 4);
}

/* Rank 1 stalls; the other ranks' watchdogs abort NCCL and end the job soon after 2 s. */
static void test_nccl_fault_hang(void)
{
	int n = gpus_or_skip();
	if (!n)
		return;
	if (n < 2) {
		printf("\n  skipped: one GPU (NCCL needs one per rank; the staged backend's faults "
		       "are the MPI backend's, tested in the comm suite)\n");
		return;
	}
	char cmd[8192];
	snprintf(cmd, sizeof(cmd),
		 "timeout -k 5 60 mpirun --allow-run-as-root -np 2 '%s' --fault hang 2>&1",
		 nccl_check());
	int rc = run_shell(cmd);
	CU_ASSERT_NOT_EQUAL(rc, 0);
	CU_ASSERT_PTR_NOT_NULL(strstr(check_out, ": all_gather on group world did not complete "
						 "within 2 s"));
	CU_ASSERT_PTR_NULL(strstr(check_out, "the job was not stopped"));
}

int test_comm_gpu_register(void)
{
	return PX_ADD_SUITE("comm-gpu",
			    {"rendezvous: MASTER_ADDR and MASTER_PORT", test_rendezvous_env},
			    {"rendezvous: 4 processes on the loopback", test_rendezvous_bcast},
			    {"rendezvous: time-outs name what was missing",
			     test_rendezvous_timeouts},
			    {"gpumem: NVML missing reads 'not available'", test_gpumem_nvml_missing},
			    {"gpumem: snapshots without NVML", test_gpumem_snapshots},
			    {"GPU backends refuse to start without a device",
			     test_backends_without_device},
			    {"NCCL (GPU only): comm_nccl_check under mpirun", test_nccl_mpirun},
			    {"NCCL (GPU only): torchrun-style launch", test_nccl_torchrun},
			    {"staged MPI (GPU only): 4 ranks on one GPU", test_staged_one_gpu},
			    {"NCCL (GPU only): a stalled rank stops the job", test_nccl_fault_hang});
}

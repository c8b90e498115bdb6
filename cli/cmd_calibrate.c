/* parallax calibrate: measure the GPU this process runs on and write what the simulator needs as a
 * hardware profile (scenarios/hardware/'s format): bf16 GEMM efficiency by size, HBM and
 * host-to-device copy efficiency against the catalog's peaks, the memory the CUDA context and
 * cuBLAS take, and with more than one rank the collectives' link (calib_coll). `parallax predict
 * --hw FILE` and `parallax run --hw FILE` then use it. This file holds the options, the launch
 * and writing the file; the GPU's measurements are calib_gpu.c's. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "../engine/cluster.h"
#include "../sim/hwprofile.h"
#include "calib_coll.h"
#include "calib_cpu.h"
#include "calib_gpu.h"
#include "commands.h"
#include "launch.h"
#include "paths.h"

static const char USAGE[] =
	"usage: parallax calibrate --out FILE [--gpu NAME] [--dtype bf16|fp32] [--quick]\n"
	"                          [--ranks N] [--comm auto|nccl|mpi] [--collectives-only]\n"
	"                          [--backend cuda|cpu [--link nvlink|network]] [--deadline S]\n"
	"       parallax calibrate --backend cpu [--ranks N] [--quick] [--out FILE]\n"
	"\n"
	"Measure this machine's first CUDA GPU and write a hardware profile for the simulator:\n"
	"matrix-product efficiency at 512^3 to 8192^3, device-to-device and pinned\n"
	"host-to-device copy efficiency against the catalog's peaks, and the memory the CUDA\n"
	"context and cuBLAS (with its 32 MiB workspace) take. With more than one rank, every\n"
	"rank also times all_reduce, all_gather and reduce_scatter from 1 KiB to 256 MiB\n"
	"(nccl-tests' busBw) and rank 0 writes the link they ran over: \"nvlink\" for ranks on\n"
	"one node, \"network\" across nodes (alpha_s, the efficiency curve, allreduce_scale),\n"
	"and NCCL's memory. Ranks sharing a GPU talk MPI through host memory: that is reported\n"
	"in \"_collectives\", not written as a link. Fields it does not measure keep the\n"
	"catalog GPU's defaults. Use it with `parallax predict --hw FILE` or `parallax run --hw\n"
	"FILE`. Rank 0 writes the file, whole or not at all.\n"
	"\n"
	"With --backend cpu (and no --gpu): measure this machine for the CPU executor and write\n"
	"its CPU profile, by default where the CPU scenarios' step time is priced from without\n"
	"--hw ($PARALLAX_CPU_PROFILE, else results/cpu-profile.json where ./results exists, else\n"
	"~/.local/share/parallax/cpu-profile.json). For 1, 2, 4, ... up to N ranks (--ranks N;\n"
	"default 1), that many ranks measure at once: OpenBLAS sgemm over a grid of shapes, the\n"
	"executor's unit kernels (their time less their products, fitted per element), its\n"
	"storage and optimizer loops, memmove and memset bandwidth, and the MPI collectives by\n"
	"size. `parallax predict` and `parallax run --backend cpu` then print the predicted step\n"
	"time of a CPU scenario on as many ranks as were measured. Calibrate with --ranks as\n"
	"large as the runs to be predicted; it takes about a minute per level on an idle\n"
	"machine (--quick: seconds, coarser).\n"
	"\n"
	"  --out FILE         the profile to write (JSON)\n"
	"  --gpu NAME         the catalog GPU it describes (parallax gpus); default: from the\n"
	"                     device's name (H100 SXM/PCIe, H200, A100 40/80GB, V100)\n"
	"  --dtype T          the matrix products' precision, whose peak the efficiencies divide:\n"
	"                     bf16 (default: DeepSpeed's mixed precision, and what the executor\n"
	"                     computes in for bf16 scenarios) or fp32 (for fp32 scenarios: the\n"
	"                     executor computes in the parameters' dtype)\n"
	"  --quick            matrix products up to 4096^3, collectives up to 4 MiB, fewer\n"
	"                     repetitions (--backend cpu: a smaller grid and shorter timings)\n"
	"  --ranks N          start N ranks with mpirun (default 1); under mpirun or srun the\n"
	"                     launcher's ranks are used (--backend cpu: they measure one level)\n"
	"  --comm MODE        between GPUs: nccl (a GPU per rank), mpi (staged through host\n"
	"                     memory), or auto (default: nccl when every rank has its own GPU)\n"
	"  --collectives-only measure the collectives only (2 or more ranks)\n"
	"  --backend cpu      without --gpu: the CPU profile above; with --gpu NAME: collectives\n"
	"                     only, MPI between host buffers, no GPU needed, written as the\n"
	"                     --link section (default network) of NAME's profile, labelled as\n"
	"                     host MPI (tests the GPU calibration on CPUs; 2 or more ranks)\n"
	"  --deadline S       stop the whole job when a collective takes longer (default 60)\n"
	"  --inject-hang R    fault injection for testing: rank R stops before the collectives\n"
	"  --part FILE        internal (--backend cpu): the ranks of one level write it there for\n"
	"                     the calibrate that started them\n"
	"  -h, --help         this help\n"
	"Exit status: 0 written, 1 no device or a failure while measuring, 2 bad usage, 124 a\n"
	"rank hung.\n";

/* ---- the file ---- */

void calib_stamp(char *buf, size_t n)
{
	time_t now = time(NULL);
	strftime(buf, n, "%Y-%m-%d %H:%M UTC", gmtime(&now));
}

cJSON *calib_profile_base(const char *gpu, const char *device, const char *stamp)
{
	char note[512];
	cJSON *j = cJSON_CreateObject();
	snprintf(note, sizeof(note), "measured by parallax calibrate on %s, %s; fields not given "
		 "keep %s's built-in profile", device, stamp, gpu);
	cJSON_AddStringToObject(j, "_comment", note);
	cJSON_AddStringToObject(j, "gpu", gpu);
	return j;
}

int calib_write_profile(const char *path, const cJSON *j, PxError *err)
{
	char tmp[4096];
	HwProfile check;
	char *text = cJSON_Print(j);
	if (!text)
		return px_fail(err, PX_ERR_RUNTIME, "out of memory");
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	FILE *f = fopen(tmp, "w");
	if (!f) {
		cJSON_free(text);
		return px_fail(err, PX_ERR_RUNTIME, "%s: cannot write", tmp);
	}
	int bad = fputs(text, f) < 0 || fputc('\n', f) < 0 || fflush(f) || fsync(fileno(f));
	cJSON_free(text);
	if (fclose(f) || bad) {
		unlink(tmp);
		return px_fail(err, PX_ERR_RUNTIME, "%s: write failed", tmp);
	}
	if (hwprofile_load(tmp, &check, err) || rename(tmp, path)) {
		unlink(tmp);
		hwprofile_free(&check);
		return err->code ? -1 : px_fail(err, PX_ERR_RUNTIME, "%s: cannot rename", tmp);
	}
	hwprofile_free(&check);
	return 0;
}

void calib_maybe_hang(const CalibOpts *o, int rank)
{
	if (rank == o->hang_rank) /* fault injection: stop answering; the deadline ends the job */
		for (;;)
			sleep(60);
}

/* ---- collectives on host memory ---- */

/* --backend cpu: MPI between host buffers, the link o->link labelled as such. */
static int calibrate_host(const CalibOpts *o, PxError *err)
{
	CommConfig cfg;
	Comm *world = NULL;
	CalibColl coll;
	comm_config_init(&cfg);
	cfg.deadline_s = o->deadline;
	if (comm_init(NULL, &cfg, &world, err))
		return -1;
	int rank = comm_rank(world), rc = -1;
	calib_maybe_hang(o, rank);
	if (calib_coll_measure(&coll, world, NULL, NULL, o->quick, cluster_find_gpu(o->gpu),
			       "mpi (host memory)", o->link, err))
		goto out;
	rc = 0;
	if (rank == 0) {
		char stamp[32];
		calib_stamp(stamp, sizeof(stamp));
		cJSON *j = calib_profile_base(o->gpu, "host CPUs (no GPU: MPI between host buffers, "
					      "standing in for the link)", stamp);
		calib_coll_json(&coll, j, stamp);
		rc = calib_write_profile(o->out, j, err);
		cJSON_Delete(j);
		if (!rc) {
			printf("# parallax calibrate: collectives over MPI on host memory, written as "
			       "\"%s\" of %s -> %s\n", o->link, o->gpu, o->out);
			calib_coll_print(&coll, stdout);
		}
	}
out:;
	PxError ferr;
	if (comm_finalize(world, &ferr) && !rc)
		rc = (*err = ferr, -1);
	return rc;
}

/* ---- options ---- */

static int usage_error(const char *flag, const char *arg, const char *expected)
{
	fprintf(stderr, "parallax calibrate: %s%s%s: expected %s\n", flag, arg ? " " : "",
		arg ? arg : "", expected);
	return 2;
}

static int one_of(const char *s, const char *a, const char *b, const char *c)
{
	return !strcmp(s, a) || !strcmp(s, b) || (c && !strcmp(s, c));
}

/* -1: go on; else the exit status (help: 0, bad usage: 2). */
static int parse_opts(int argc, char **argv, CalibOpts *o)
{
	static const struct option longs[] = {
		{"out", required_argument, 0, 'o'},     {"gpu", required_argument, 0, 'g'},
		{"quick", no_argument, 0, 'q'},         {"dtype", required_argument, 0, 'd'},
		{"ranks", required_argument, 0, 'r'},   {"comm", required_argument, 0, 'c'},
		{"backend", required_argument, 0, 'b'}, {"link", required_argument, 0, 'l'},
		{"deadline", required_argument, 0, 't'}, {"inject-hang", required_argument, 0, 'H'},
		{"collectives-only", no_argument, 0, 'C'}, {"help", no_argument, 0, 'h'},
		{"part", required_argument, 0, 'P'},
		{0, 0, 0, 0},
	};
	char *end;
	int c;
	*o = (CalibOpts){.backend = "cuda", .comm = "auto", .ranks = 1, .deadline = 60,
			 .hang_rank = -1};
	optind = 1;
	while ((c = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
		switch (c) {
		case 'o': o->out = optarg; break;
		case 'P': o->part = optarg; break;
		case 'g': o->gpu = optarg; break;
		case 'q': o->quick = 1; break;
		case 'C': o->coll_only = 1; break;
		case 'd':
			if (!one_of(optarg, "bf16", "fp32", NULL))
				return usage_error("--dtype", optarg, "bf16 or fp32");
			o->fp32 = !strcmp(optarg, "fp32");
			break;
		case 'r':
			o->ranks = (int)strtol(optarg, &end, 10);
			if (*end || o->ranks < 1)
				return usage_error("--ranks", optarg, "a positive number");
			break;
		case 'c':
			if (!one_of(optarg, "auto", "nccl", "mpi"))
				return usage_error("--comm", optarg, "auto, nccl or mpi");
			o->comm = optarg;
			break;
		case 'b':
			if (!one_of(optarg, "cuda", "cpu", NULL))
				return usage_error("--backend", optarg, "cuda or cpu");
			o->backend = optarg;
			break;
		case 'l':
			if (!one_of(optarg, "nvlink", "network", NULL))
				return usage_error("--link", optarg, "nvlink or network");
			o->link = optarg;
			break;
		case 't':
			o->deadline = strtod(optarg, &end);
			if (*end || !(o->deadline >= 0))
				return usage_error("--deadline", optarg, "seconds, 0 or more");
			break;
		case 'H':
			o->hang_rank = (int)strtol(optarg, &end, 10);
			if (*end || o->hang_rank < 0)
				return usage_error("--inject-hang", optarg, "a rank");
			break;
		case 'h': fputs(USAGE, stdout); return 0;
		default: fputs(USAGE, stderr); return 2;
		}
	}
	int cpu = !strcmp(o->backend, "cpu");
	o->cpu_profile = cpu && !o->gpu;
	if (o->cpu_profile && !o->out) { /* this machine's profile, where predict looks for it */
		static char dflt[4096];
		PxError err;
		int rc = paths_cpu_profile(dflt, sizeof(dflt), 1, &err);
		if (rc < 0) {
			fprintf(stderr, "parallax calibrate: %s\n", err.msg);
			return 1;
		}
		o->out = rc == 0 ? dflt : NULL;
	}
	if (!o->out || optind != argc) {
		fprintf(stderr, "parallax calibrate: expected --out FILE and no other arguments\n%s",
			USAGE);
		return 2;
	}
	if (o->gpu && !cluster_find_gpu(o->gpu)) {
		fprintf(stderr, "parallax calibrate: --gpu %s: not a catalog GPU (parallax gpus lists "
			"them)\n", o->gpu);
		return 2;
	}
	if (o->link && !cpu)
		return usage_error("--link", o->link, "--backend cpu with it (on GPUs the link "
				   "follows the ranks: nvlink on one node, network across nodes)");
	if (o->link && o->cpu_profile)
		return usage_error("--link", o->link, "--gpu NAME with it (--backend cpu alone "
				   "measures this machine's CPU profile, which has no link)");
	if (o->cpu_profile && (o->coll_only || o->fp32 || strcmp(o->comm, "auto")))
		return usage_error("--backend cpu", NULL, "no --collectives-only, --dtype or --comm "
				   "without --gpu (the CPU profile measures both kernel flavours over "
				   "MPI)");
	o->coll_only |= cpu && !o->cpu_profile;
	if (!o->link)
		o->link = "network";
	return -1;
}

int cmd_calibrate(int argc, char **argv)
{
	CalibOpts o;
	CommEnv env;
	PxError err = {0};
	int rc = parse_opts(argc, argv, &o);
	if (rc >= 0)
		return rc;
	int launched = comm_env_probe(&env);
	if (o.cpu_profile) {
		rc = calib_cpu_main(&o, &env, launched, &err);
		if (rc && err.msg[0])
			fprintf(stderr, "parallax calibrate: rank %d: %s\n", env.rank, err.msg);
		return rc < 0 ? (err.code == PX_ERR_INPUT ? 2 : 1) : rc;
	}
	if (o.coll_only && (launched ? env.size : o.ranks) < 2)
		return usage_error(!strcmp(o.backend, "cpu") ? "--backend cpu" : "--collectives-only",
				   NULL, "2 or more ranks (--ranks N): collectives need them");
	if (!launched && o.ranks > 1)
		return launch_mpirun("calibrate", o.ranks, argv, argc);
	if (!strcmp(o.backend, "cpu")) {
		rc = calibrate_host(&o, &err);
	} else {
#ifdef PX_HAVE_CUDA
		rc = env.size > 1 ? calib_gpu_ranks(&o, &env, &err) : calib_gpu_single(&o, &err);
#else
		fprintf(stderr, "parallax calibrate: this parallax was built without CUDA (no nvcc "
			"under CUDA_HOME when it was built); --backend cpu measures collectives on "
			"host memory\n");
		return 1;
#endif
	}
	if (rc) {
		fprintf(stderr, "parallax calibrate: rank %d: %s\n", env.rank, err.msg);
		return err.code == PX_ERR_INPUT ? 2 : 1;
	}
	return 0;
}

/* Collective calibration: nccl-tests' bandwidth formulas (exec/collbench) worked by hand, the fit
 * of a link to times made from a known model, and `parallax calibrate --backend cpu` end to end
 * over 2 MPI ranks on host memory: a profile hwprofile_load and predict accept, its curve's shape,
 * the printed table's busBw against its algBw, bad usage (exit 2 naming the option) and a job
 * stopped mid-way (no file). Measured speeds are noise here: only structure and formulas are
 * asserted. */
#include <CUnit/CUnit.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../exec/collbench.h"
#include "../sim/hwprofile.h"
#include "suites.h"

#define NEAR(x, want, rel) CU_ASSERT(fabs((x) - (want)) <= (rel) * fabs(want))

/* ---- formulas ---- */

/* nccl-tests doc/PERFORMANCE.md, "Summary" (../shared/reference/communication.md): busBw = algBw
 * x 2(n-1)/n for all_reduce, x (n-1)/n for all_gather, reduce_scatter and all_to_all. By hand, 8 ranks, 256 MiB = 268435456 B in 1 ms:
 * algBw = 268.435456 GB/s; all_reduce busBw = 268.435456 x 14/8 = 469.762048 GB/s; all_gather
 * and reduce_scatter 268.435456 x 7/8 = 234.881024 GB/s. A ring takes 2(n-1) = 14 steps for an
 * all_reduce, n-1 = 7 for the others; one rank has no bus. */
static void test_busbw_formula(void)
{
	NEAR(collbench_algbw_Bps(268435456, 1e-3), 268.435456e9, 1e-12);
	NEAR(collbench_busbw_Bps(COLL_ALL_REDUCE, 8, 268435456, 1e-3), 469.762048e9, 1e-12);
	NEAR(collbench_busbw_Bps(COLL_ALL_GATHER, 8, 268435456, 1e-3), 234.881024e9, 1e-12);
	NEAR(collbench_busbw_Bps(COLL_REDUCE_SCATTER, 8, 268435456, 1e-3), 234.881024e9, 1e-12);
	CU_ASSERT_DOUBLE_EQUAL(collbench_bus_factor(COLL_ALL_REDUCE, 2), 1.0, 0);
	CU_ASSERT_DOUBLE_EQUAL(collbench_bus_factor(COLL_ALL_GATHER, 2), 0.5, 0);
	CU_ASSERT_DOUBLE_EQUAL(collbench_bus_factor(COLL_ALL_REDUCE, 1), 0.0, 0);
	CU_ASSERT_DOUBLE_EQUAL(collbench_bus_factor(COLL_BROADCAST, 8), 0.0, 0);
	CU_ASSERT_EQUAL(collbench_ring_steps(COLL_ALL_REDUCE, 8), 14);
	CU_ASSERT_EQUAL(collbench_ring_steps(COLL_ALL_GATHER, 8), 7);
	CU_ASSERT_EQUAL(collbench_ring_steps(COLL_REDUCE_SCATTER, 8), 7);
	CU_ASSERT_EQUAL(collbench_ring_steps(COLL_ALL_GATHER, 1), 0);
	/* all_to_all: as the gathers', its n-1 partners as the ring's steps */
	NEAR(collbench_busbw_Bps(COLL_ALL_TO_ALL, 8, 268435456, 1e-3), 234.881024e9, 1e-12);
	CU_ASSERT_EQUAL(collbench_ring_steps(COLL_ALL_TO_ALL, 8), 7);
}

/* The size curve a profile keeps: each size's time the least of its own and every larger
 * size's. 2 ranks' all_gather as measured on a shared 2-core machine (us, 1 KiB to 1 MiB by 4):
 * 112, 15.1, 228, 52.9, 31.6, 96.9 reads 15.1, 15.1, 31.6, 31.6, 31.6, 96.9; an increasing
 * row stays as it is. */
static void test_envelope(void)
{
	static const double ag[] = {112, 15.1, 228, 52.9, 31.6, 96.9};
	static const double want[] = {15.1, 15.1, 31.6, 31.6, 31.6, 96.9};
	CollBench b;
	double t[COLLBENCH_MAX_SIZES];
	memset(&b, 0, sizeof(b));
	b.nranks = 2;
	b.n_sizes = 6;
	for (int s = 0; s < 6; s++) {
		b.size_bytes[s] = 1024.0 * (1 << (2 * s));
		b.time_s[1][s] = ag[s] * 1e-6;
		b.time_s[0][s] = (10.0 + s) * 1e-6;
	}
	collbench_envelope(&b, 1, t);
	for (int s = 0; s < 6; s++)
		CU_ASSERT_DOUBLE_EQUAL(t[s], want[s] * 1e-6, 1e-15);
	collbench_envelope(&b, 0, t);
	for (int s = 0; s < 6; s++)
		CU_ASSERT_DOUBLE_EQUAL(t[s], (10.0 + s) * 1e-6, 1e-15);
}

/* Times made from the simulator's model of a link: 4 ranks, 5 us a step, busBw 40 GB/s for
 * all_gather and reduce_scatter and 48 GB/s for all_reduce, sizes 1 KiB, 1 MiB, 64 MiB:
 *   t_ag(S) = 3 x 5 us + S x 3/4 / 40e9,  t_ar(S) = 6 x 5 us + S x 6/4 / 48e9.
 * By hand (peak 50 GB/s):
 *   alpha = t_ag(1 KiB) / 3 = (15 us + 19.2 ns) / 3 = 5.0064 us;
 *   1 KiB: no transfer left once 3 alpha is off: latency-bound, left out;
 *   1 MiB: t = 15 + 19.6608 = 34.6608 us, transfer 34.6608 - 15.0192 = 19.6416 us,
 *          efficiency = 786432 B / 19.6416 us / 50e9 = 0.800782;
 *   64 MiB: t = 15 + 1258.2912 = 1273.2912 us, transfer 1258.2720 us,
 *          efficiency = 50331648 / 1258.2720 us / 50e9 = 0.800012;
 *   allreduce_scale = (100663296 / 2127.152 us) / (50331648 / 1273.2912 us) = 1.197179,
 *          t_ar(64 MiB) = 30 + 2097.152 = 2127.152 us. */
static void fill_model(CollBench *b, double ag_Bps)
{
	static const double sizes[] = {1024, 1048576, 67108864};
	memset(b, 0, sizeof(*b));
	b->nranks = 4;
	b->n_sizes = 3;
	for (int s = 0; s < 3; s++) {
		b->size_bytes[s] = sizes[s];
		b->time_s[0][s] = 6 * 5e-6 + sizes[s] * 1.5 / 48e9;
		b->time_s[1][s] = b->time_s[2][s] = 3 * 5e-6 + sizes[s] * 0.75 / ag_Bps;
	}
}

static void test_fit_known_model(void)
{
	CollBench b;
	CollBenchFit f;
	fill_model(&b, 40e9);
	collbench_fit(&b, 50e9, &f);
	NEAR(f.link.alpha_s, 5.0064e-6, 1e-9);
	CU_ASSERT_EQUAL_FATAL(f.link.efficiency.n, 2);
	CU_ASSERT_EQUAL(f.n_latency, 1);
	CU_ASSERT_EQUAL(f.n_clamped, 0);
	CU_ASSERT_EQUAL(f.raw, 0);
	CU_ASSERT_DOUBLE_EQUAL(f.link.efficiency.x[0], 1048576, 0);
	CU_ASSERT_DOUBLE_EQUAL(f.link.efficiency.x[1], 67108864, 0);
	NEAR(f.link.efficiency.y[0], 0.800782, 1e-6);
	NEAR(f.link.efficiency.y[1], 0.800012, 1e-6);
	NEAR(f.link.allreduce_scale, 1.197179, 1e-6);
	/* busBw of the table: all_gather at 64 MiB = 50331648 / 1273.2912 us = 39.528 GB/s */
	NEAR(f.busbw_Bps[1][2], 67108864 * 0.75 / 1273.2912e-6, 1e-12);
	/* the same times over a 30 GB/s peak: 40 GB/s is above it, recorded as 1 */
	collbench_fit(&b, 30e9, &f);
	CU_ASSERT_EQUAL(f.n_clamped, 2);
	CU_ASSERT_DOUBLE_EQUAL(f.link.efficiency.y[1], 1.0, 0);
}

/* Every size latency-bound (a 1e15 B/s link: the largest transfer, 64 MiB x 3/4 / 1e15 = 50.3 ns,
 * is under a quarter of 15 us of latency): the curve is the largest size's raw busBw,
 * 50331648 B / (15 us + 50.3 ns) = 3.3442 TB/s, over a 5 TB/s peak 0.668844. */
static void test_fit_latency_bound(void)
{
	CollBench b;
	CollBenchFit f;
	fill_model(&b, 1e15);
	collbench_fit(&b, 5e12, &f);
	CU_ASSERT_EQUAL(f.raw, 1);
	CU_ASSERT_EQUAL(f.n_latency, 3);
	CU_ASSERT_EQUAL_FATAL(f.link.efficiency.n, 1);
	CU_ASSERT_DOUBLE_EQUAL(f.link.efficiency.x[0], 67108864, 0);
	NEAR(f.link.efficiency.y[0], 50331648 / (15e-6 + 50331648 / 1e15) / 5e12, 1e-12);
	NEAR(f.link.efficiency.y[0], 0.668844, 1e-5);
}

/* ---- the command ---- */

static char out[1 << 16];

/* Runs that start ranks use the release binary (mpirun's own start-up leaks would fail a
 * sanitized one); option checks, which start none, the one under test (PX_BIN). */
static int run(const char *args)
{
	return px_test_run_release(args, 120, out, sizeof(out));
}

static int run_checked(const char *args)
{
	return px_test_run_cli(args, out, sizeof(out));
}

static void show_on_failure(int ok)
{
	if (!ok)
		fprintf(stderr, "\noutput:\n%s\n", out);
}

/* A value of column col (0-based, blank-separated) of the first table row starting with name
 * and size; NAN when absent. */
static double table_cell(const char *name, const char *size, int col)
{
	char key[64];
	snprintf(key, sizeof(key), "\n%s", name);
	for (const char *p = strstr(out, key); p; p = strstr(p + 1, key)) {
		char c[5][32];
		if (sscanf(p + 1, "%31s %31s %31s %31s %31s", c[0], c[1], c[2], c[3], c[4]) == 5 &&
		    !strcmp(c[0], name) && !strcmp(c[1], size))
			return atof(c[col]);
	}
	return NAN;
}

static cJSON *read_json(const char *path)
{
	FILE *f = fopen(path, "r");
	static char text[1 << 16];
	if (!f)
		return NULL;
	size_t n = fread(text, 1, sizeof(text) - 1, f);
	fclose(f);
	text[n] = '\0';
	return cJSON_Parse(text);
}

/* 2 ranks of MPI on host memory, written as the network link of an H100-SXM profile. */
static void test_host_profile(void)
{
	char path[512], args[2048];
	snprintf(path, sizeof(path), "%s/coll.json", px_test_tmpdir());
	snprintf(args, sizeof(args), "calibrate --backend cpu --gpu H100-SXM --ranks 2 --quick "
		 "--out '%s'", path);
	int rc = run(args);
	show_on_failure(rc == 0);
	CU_ASSERT_EQUAL_FATAL(rc, 0);

	/* the table: n = 2, so busBw = algBw for all_reduce and algBw / 2 for all_gather (printed
	 * to 3 decimals) */
	double ar_alg = table_cell("all_reduce", "1048576", 3);
	double ar_bus = table_cell("all_reduce", "1048576", 4);
	double ag_alg = table_cell("all_gather", "4194304", 3);
	double ag_bus = table_cell("all_gather", "4194304", 4);
	show_on_failure(!isnan(ar_alg) && !isnan(ag_alg));
	CU_ASSERT(ar_alg > 0 && ag_alg > 0);
	CU_ASSERT(fabs(ar_bus - ar_alg) <= 0.0011);
	CU_ASSERT(fabs(ag_bus - ag_alg / 2) <= 0.0011);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "reduce_scatter         1024"));

	/* the file: valid JSON, labelled, the network link only */
	cJSON *j = read_json(path);
	CU_ASSERT_PTR_NOT_NULL_FATAL(j);
	const cJSON *net = cJSON_GetObjectItem(j, "network");
	CU_ASSERT_PTR_NOT_NULL_FATAL(net);
	CU_ASSERT_PTR_NULL(cJSON_GetObjectItem(j, "nvlink"));
	CU_ASSERT_PTR_NULL(cJSON_GetObjectItem(j, "compute"));
	const cJSON *note = cJSON_GetObjectItem(net, "_efficiency");
	CU_ASSERT_FATAL(cJSON_IsString(note));
	CU_ASSERT_PTR_NOT_NULL(strstr(note->valuestring, "mpi (host memory), 2 ranks on 1 node"));
	CU_ASSERT_PTR_NOT_NULL(strstr(note->valuestring, "over 50 GB/s")); /* H100 network/GPU */
	cJSON_Delete(j);

	/* hwprofile_load takes it: a measured network curve of increasing sizes within (0, 1],
	 * 1 KiB to 4 MiB (quick); everything else is the H100-SXM default */
	HwProfile hw, base;
	PxError err = {0};
	CU_ASSERT_EQUAL_FATAL(hwprofile_load(path, &hw, &err), 0);
	CU_ASSERT_EQUAL(hwprofile_default(cluster_find_gpu("H100-SXM"), &base), 0);
	const HwCurve *c = &hw.network.efficiency;
	CU_ASSERT(c->n >= 1 && c->n <= 7);
	for (int i = 0; i < c->n; i++) {
		CU_ASSERT(c->y[i] > 0 && c->y[i] <= 1);
		CU_ASSERT(c->x[i] > 1024 && c->x[i] <= 4194304);
		CU_ASSERT(i == 0 || c->x[i] > c->x[i - 1]);
	}
	CU_ASSERT(hw.network.alpha_s > 0);
	CU_ASSERT(hw.network.allreduce_scale >= 0.25 && hw.network.allreduce_scale <= 4);
	CU_ASSERT_EQUAL(hw.nvlink.efficiency.n, base.nvlink.efficiency.n);
	CU_ASSERT_DOUBLE_EQUAL(hw.nvlink.efficiency.y[2], base.nvlink.efficiency.y[2], 0);
	CU_ASSERT_DOUBLE_EQUAL(hw.nvlink.alpha_s, base.nvlink.alpha_s, 0);

	/* and predict prices with it */
	snprintf(args, sizeof(args), "predict --no-db --hw '%s' '%s'", path,
		 px_test_path("scenarios/llama2-7b-zero2-h100.json"));
	rc = run(args);
	show_on_failure(rc == 0);
	CU_ASSERT_EQUAL(rc, 0);
}

/* Bad usage: exit 2, a line naming the option, nothing written, nothing launched. */
static void test_bad_usage(void)
{
	static const struct {
		const char *args, *says;
	} bad[] = {
		{"--backend cpu --dtype fp32", "--backend cpu: expected no --collectives-only, --dtype "
		 "or --comm without --gpu"},
		{"--backend cpu --link network", "--link network: expected --gpu NAME with it"},
		{"--backend cpu --gpu H100-SXM", "--backend cpu: expected 2 or more ranks"},
		{"--collectives-only", "--collectives-only: expected 2 or more ranks"},
		{"--backend cpu --gpu H100-SXM --ranks 2 --link fibre",
		 "--link fibre: expected nvlink or network"},
		{"--link nvlink --ranks 2", "--link nvlink: expected --backend cpu with it"},
		{"--backend tpu", "--backend tpu: expected cuda or cpu"},
		{"--comm gloo --ranks 2", "--comm gloo: expected auto, nccl or mpi"},
		{"--ranks 0", "--ranks 0: expected a positive number"},
		{"--backend cpu --gpu H100-SXM --ranks 2 --deadline soon",
		 "--deadline soon: expected seconds"},
	};
	const char *dir = px_test_tmpdir();
	char path[512], args[2048];
	snprintf(path, sizeof(path), "%s/bad.json", dir);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		snprintf(args, sizeof(args), "calibrate %s --out '%s'", bad[i].args, path);
		int rc = run_checked(args);
		int ok = rc == 2 && strstr(out, bad[i].says);
		if (!ok)
			fprintf(stderr, "\n%s: exit %d, expected 2 and \"%s\"", args, rc, bad[i].says);
		show_on_failure(ok);
		CU_ASSERT(ok);
		CU_ASSERT_EQUAL(access(path, F_OK), -1);
	}
}

/* Rank 1 stops answering before the collectives: rank 0's first one overruns --deadline, the
 * job stops with exit 124 (comm.h's COMM_DEADLINE_EXIT) and no profile, not even a part. */
static void test_failed_run_writes_nothing(void)
{
	char path[512], tmp[600], args[2048];
	snprintf(path, sizeof(path), "%s/hang.json", px_test_tmpdir());
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	snprintf(args, sizeof(args), "calibrate --backend cpu --gpu H100-SXM --ranks 2 --quick "
		 "--deadline 1 --inject-hang 1 --out '%s'", path);
	int rc = run(args);
	show_on_failure(rc == 124);
	CU_ASSERT_EQUAL(rc, 124);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "did not complete within 1 s"));
	CU_ASSERT_EQUAL(access(path, F_OK), -1);
	CU_ASSERT_EQUAL(access(tmp, F_OK), -1);
}

int test_calibrate_register(void)
{
	return PX_ADD_SUITE("calibrate",
			    {"a size curve's envelope", test_envelope},
			    {"busBw = algBw x 2(n-1)/n or (n-1)/n, by hand", test_busbw_formula},
			    {"link fit of a known model", test_fit_known_model},
			    {"link fit when every size is latency-bound", test_fit_latency_bound},
			    {"--backend cpu: a profile hwprofile_load and predict take",
			     test_host_profile},
			    {"bad usage exits 2 naming the option", test_bad_usage},
			    {"a stopped job writes no profile", test_failed_run_writes_nothing});
}

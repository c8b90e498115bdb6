/* The CPU executor's step time: a CPU profile read (sim/hwcpu.c) and refused with the key and
 * what was expected, its curves and sgemm grid read between points, a CPU step priced from a
 * hand-written profile against a hand derivation, collectives on the executor's one thread, the
 * notes a scenario the profile cannot price keeps, and through the binary: the default profile's
 * place, calibrate --backend cpu end to end, and run / compare pairing predicted with measured. */
#include <CUnit/CUnit.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../engine/build.h"
#include "../engine/jdoc.h"
#include "../sim/hwprofile.h"
#include "../sim/opcost.h"
#include "../sim/opcost_cpu.h"
#include "../sim/predict.h"
#include "fixtures.h"
#include "suites.h"

/* ---- a hand-written profile ---- */

/* One level; every sgemm at 100 GFLOP/s (a grid of one point), the 16-bit kernels' terms, the
 * loops the bf16 mini scenario's step runs, memmove and memset at 1e5 GB/s (the parser's most:
 * the step's copies and zeroed buffers, under 1 GB, then take under 1e-5 s). */
#define LEVEL_FMT                                                                                 \
	"{\"ranks\": %d,"                                                                         \
	" \"sgemm\": {\"nn\": [[256, 256, 256, 100]], \"nt\": [[256, 256, 256, 100]],"            \
	"   \"tn\": [[256, 256, 256, 100]]},"                                                     \
	" \"kernels\": {\"16bit\": {"                                                             \
	"   \"embed_forward\": {\"btc_s\": 1e-9}, \"embed_backward\": {\"btc_s\": 2e-9},"         \
	"   \"block_forward\": {\"btc_s\": 1e-8, \"bttc_s\": 1e-10, \"btth_s\": 1e-9},"           \
	"   \"block_backward\": {\"btc_s\": 2e-8, \"bttc_s\": 2e-10, \"btth_s\": 2e-9},"          \
	"   \"head_forward\": {\"btc_s\": 1e-9, \"btv_s\": 3e-9},"                                \
	"   \"head_backward\": {\"btc_s\": 2e-9, \"btv_s\": 4e-9}}},"                             \
	" \"elementwise_s\": {\"add.bf16.fp32\": 2e-9, \"add.bf16.bf16\": 1e-9,"                  \
	"   \"sum_squares.bf16\": 1e-9, \"convert.fp32.bf16\": 1e-9, \"convert.bf16.fp32\": 2e-9," \
	"   \"adamw.fp32\": 5e-9, \"onebit_compress.fp32\": 3e-9, \"onebit_expand.fp32\": 2e-9,"   \
	"   \"quantize.int8\": 4e-9, \"dequantize.int8\": 1.5e-9},"                                \
	" \"copy_GBps\": [[1, 100000]], \"fill_GBps\": [[1, 100000]]%s}"

/* all_reduce, all_gather, reduce_scatter, all_to_all: 10, 20, 30, 40 us at 1 KiB and 1, 2, 3,
 * 4 ms at 1 MiB */
#define MPI_2                                                                                     \
	", \"mpi\": {\"all_reduce\": [[1024, 1e-5], [1048576, 1e-3]],"                            \
	" \"all_gather\": [[1024, 2e-5], [1048576, 2e-3]],"                                       \
	" \"reduce_scatter\": [[1024, 3e-5], [1048576, 3e-3]],"                                   \
	" \"all_to_all\": [[1024, 4e-5], [1048576, 4e-3]]}"

static char profile_text[8192];

/* The profile with levels 1 and 2 measured on host, with the "cpu" keys in extra (each with a
 * leading comma) beside them and no OpenBLAS thread count to compare. */
static const char *profile_on(const char *host, const char *extra)
{
	char l1[3000], l2[3000];
	snprintf(l1, sizeof(l1), LEVEL_FMT, 1, "");
	snprintf(l2, sizeof(l2), LEVEL_FMT, 2, MPI_2);
	snprintf(profile_text, sizeof(profile_text),
		 "{\"_comment\": \"hand-written for the cputime suite\",\n"
		 " \"cpu\": {\"host\": \"%s\", \"model\": \"test cpu\", \"cores\": 2,\n"
		 "  \"blas_threads\": 0%s,\n  \"levels\": [\n%s,\n%s]}}\n", host, extra, l1, l2);
	return profile_text;
}

/* The profile of host "test-host". */
static const char *profile(void)
{
	return profile_on("test-host", "");
}

static int parse_profile(const char *text, HwProfile *hw, PxError *err)
{
	JsonDoc d = {0};
	if (jdoc_parse(&d, "cpu.json", text, err))
		return -1;
	int rc = hwprofile_parse(&d, hw, err);
	jdoc_free(&d);
	return rc;
}

/* ---- reading ---- */

static void test_parse(void)
{
	HwProfile hw;
	PxError err = {0};
	int rc = parse_profile(profile(), &hw, &err);
	if (rc)
		fprintf(stderr, "\n%s\n", err.msg);
	CU_ASSERT_EQUAL_FATAL(rc, 0);
	CU_ASSERT_STRING_EQUAL(hw.gpu, "cpu");
	CU_ASSERT_PTR_NOT_NULL_FATAL(hw.cpu);
	const HwCpu *c = hw.cpu;
	CU_ASSERT_STRING_EQUAL(c->host, "test-host");
	CU_ASSERT_EQUAL(c->cores, 2);
	CU_ASSERT_EQUAL(c->n_levels, 2);
	const HwCpuLevel *l = hwcpu_level(c, 2);
	CU_ASSERT_PTR_EQUAL(l, &c->level[1]);
	CU_ASSERT_PTR_NULL(hwcpu_level(c, 4));
	CU_ASSERT_EQUAL(l->n_m, 1);
	CU_ASSERT_DOUBLE_EQUAL(l->gemm_flops_per_s[HWCPU_TN][0][0][0], 100e9, 1);
	CU_ASSERT(l->have_kernels[HWCPU_16BIT] && !l->have_kernels[HWCPU_FP32]);
	CU_ASSERT_DOUBLE_EQUAL(l->kernel_s[HWCPU_16BIT][HWCPU_BLOCK_BWD][HWCPU_BTTH], 2e-9, 1e-20);
	CU_ASSERT_DOUBLE_EQUAL(l->kernel_s[HWCPU_16BIT][HWCPU_HEAD_FWD][HWCPU_BTV], 3e-9, 1e-20);
	CU_ASSERT_DOUBLE_EQUAL(l->kernel_s[HWCPU_16BIT][HWCPU_HEAD_FWD][HWCPU_BTTC], 0, 0);
	/* [op][dst][src]: fp32 0, bf16 1, fp16 2 */
	CU_ASSERT_DOUBLE_EQUAL(l->elem_s[HWCPU_ADD][1][0], 2e-9, 1e-20);
	CU_ASSERT_DOUBLE_EQUAL(l->elem_s[HWCPU_CONVERT][0][1], 1e-9, 1e-20);
	CU_ASSERT_DOUBLE_EQUAL(l->elem_s[HWCPU_SUMSQ][1][1], 1e-9, 1e-20);
	CU_ASSERT_DOUBLE_EQUAL(l->adamw_s, 5e-9, 1e-20);
	CU_ASSERT_DOUBLE_EQUAL(l->copy_Bps.y[0], 1e14, 1);
	CU_ASSERT_EQUAL(l->coll_s[1].n, 2);
	CU_ASSERT_DOUBLE_EQUAL(l->coll_s[1].y[1], 2e-3, 1e-15);
	CU_ASSERT_EQUAL(c->level[0].coll_s[0].n, 0);
	CU_ASSERT_EQUAL(l->coll_s[3].n, 2); /* all_to_all */
	CU_ASSERT_DOUBLE_EQUAL(l->coll_s[3].y[0], 4e-5, 1e-18);
	CU_ASSERT_DOUBLE_EQUAL(l->onebit_compress_s, 3e-9, 1e-20);
	CU_ASSERT_DOUBLE_EQUAL(l->onebit_expand_s, 2e-9, 1e-20);
	CU_ASSERT_DOUBLE_EQUAL(l->quantize_s, 4e-9, 1e-20);
	CU_ASSERT_DOUBLE_EQUAL(l->dequantize_s, 1.5e-9, 1e-20);
	hwprofile_free(&hw);
	CU_ASSERT_PTR_NULL(hw.cpu);
	hwprofile_free(&hw); /* twice, and on a zeroed profile: nothing */
}

/* Each bad profile (the valid one with one thing changed) is refused naming where, the key and
 * what was expected; nothing is held after. */
static void test_parse_refusals(void)
{
	static const struct {
		const char *from, *to, *says;
	} bad[] = {
		{"{\"ranks\": 1,", "{\"rank\": 1,", "cpu.levels[0].rank: expected a known key"},
		{"\"nn\": [[256, 256, 256, 100]]", "\"nn\": [[256, 256, 256, 100], [512, 256, 256, 90]]",
		 "cpu.levels[0].sgemm.nt: expected every (m, n, k) of the grid the forms span "
		 "together (2 m x 1 n x 1 k = 2 points), got 1"},
		{"\"nn\": [[256, 256, 256, 100]]", "\"nn\": [[256, 256, 0, 100]]",
		 "sgemm.nn: expected point 0 to be [m, n, k, GFLOP/s] with m, n, k at least 1"},
		{"\"copy_GBps\": [[1, 100000]]", "\"copy_GBps\": [[4, 1], [2, 1]]",
		 "cpu.levels[0].copy_GBps: expected point 1's bytes above 0 and above the previous "
		 "point's, got [2,1]"},
		{", \"mpi\": {\"all_reduce\"", ", \"mpx\": {\"all_reduce\"",
		 "cpu.levels[1].mpx: expected a known key"},
		{"\"adamw.fp32\": 5e-9,", "\"adamw.fp32\": 5e-9, \"mul.bf16.fp32\": 1e-9,",
		 "cpu.levels[0].elementwise_s.mul.bf16.fp32: expected a loop named OP.DST.SRC"},
		{"\"head_backward\": {\"btc_s\": 2e-9, \"btv_s\": 4e-9}", "\"head_backward\": 4",
		 "head_backward: expected an object"},
		{"\"block_backward\": {\"btc_s\": 2e-8, \"bttc_s\": 2e-10, \"btth_s\": 2e-9},", "",
		 "cpu.levels[0].kernels.16bit.block_backward: expected an object: the key is missing"},
		{"\"all_to_all\": [[1024, 4e-5]", "\"all_to_all\": [[1024, -4e-5]",
		 "cpu.levels[1].mpi.all_to_all: expected point 0's seconds above 0 and at most "
		 "10000"},
		{"\"onebit_expand.fp32\": 2e-9", "\"onebit_expand.fp16\": 2e-9",
		 "cpu.levels[0].elementwise_s.onebit_expand.fp16: expected a loop named OP.DST.SRC"},
		{"\"cores\": 2,", "\"cores\": 2, \"gpu\": \"H100-SXM\",",
		 "cpu.gpu: expected a known key"},
		{"\"cores\": 2,", "\"cores\": 2, \"blas_thread_timeout\": 31,",
		 "cpu.blas_thread_timeout: expected an integer from 0 to 30, got 31"},
		{"{\"_comment\"", "{\"gpu\": \"H100-SXM\", \"_comment\"",
		 "gpu: expected no 'gpu' beside \"cpu\""},
	};
	char text[8192];
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		const char *p = profile(), *at = strstr(p, bad[i].from);
		CU_ASSERT_PTR_NOT_NULL_FATAL(at);
		snprintf(text, sizeof(text), "%.*s%s%s", (int)(at - p), p, bad[i].to,
			 at + strlen(bad[i].from));
		HwProfile hw;
		PxError err = {0};
		int rc = parse_profile(text, &hw, &err);
		int ok = rc == -1 && err.code == PX_ERR_INPUT && strstr(err.msg, bad[i].says) &&
			 !strncmp(err.msg, "cpu.json:", 9);
		if (!ok)
			fprintf(stderr, "\ncase %zu: got \"%s\", expected \"%s\"", i, err.msg,
				bad[i].says);
		CU_ASSERT(ok);
		CU_ASSERT_PTR_NULL(hw.cpu);
	}
	/* levels: mpi where none can be, none where it must be, out of order */
	static const struct {
		const char *levels, *says;
	} lv[] = {
		{"[" LEVEL_FMT "]", "cpu.levels[0].mpi: expected no collectives at 1 rank"},
		{"[" LEVEL_FMT "]", "cpu.levels[0].mpi: expected the collectives' times over 2 ranks: "
				    "the key is missing"},
	};
	for (int i = 0; i < 2; i++) {
		char one[3000];
		snprintf(one, sizeof(one), lv[i].levels, i == 0 ? 1 : 2, i == 0 ? MPI_2 : "");
		snprintf(text, sizeof(text), "{\"cpu\": {\"levels\": %s}}", one);
		HwProfile hw;
		PxError err = {0};
		CU_ASSERT_EQUAL(parse_profile(text, &hw, &err), -1);
		PX_ASSERT_HAS(err.msg, lv[i].says);
	}
	char a[3000], b[3000];
	snprintf(a, sizeof(a), LEVEL_FMT, 2, MPI_2);
	snprintf(b, sizeof(b), LEVEL_FMT, 1, "");
	snprintf(text, sizeof(text), "{\"cpu\": {\"levels\": [%s, %s]}}", a, b);
	HwProfile hw;
	PxError err = {0};
	CU_ASSERT_EQUAL(parse_profile(text, &hw, &err), -1);
	PX_ASSERT_HAS(err.msg, "cpu.levels: expected levels in increasing ranks: level 1 has 1 "
			       "after 2");
}

/* ---- reading between points ---- */

/* A 2 x 2 x 2 grid of rates r(i, j, q) = 10 + i + 2 j + 4 q GFLOP/s at m, n, k of 100 or 400:
 * halfway in log(m), log(n), log(k) (200, 200, 200) the trilinear reading is the corners' mean,
 * 10 + 0.5 + 1 + 2 = 13.5; at m = 200, n = 400, k = 100 it is 10 + 0.5 + 2 = 12.5; beyond the
 * grid the edge's (m 1000 -> 400, n 50 -> 100, k 400: 10 + 1 + 4 = 15). */
static void test_gemm_grid(void)
{
	char pts[3][2048], text[8192];
	for (int f = 0; f < 3; f++) {
		int k = 0;
		for (int i = 0; i < 2; i++)
			for (int j = 0; j < 2; j++)
				for (int q = 0; q < 2; q++)
					k += snprintf(pts[f] + k, sizeof(pts[f]) - (size_t)k,
						      "%s[%d, %d, %d, %d]", k ? ", " : "",
						      i ? 400 : 100, j ? 400 : 100, q ? 400 : 100,
						      10 + i + 2 * j + 4 * q);
	}
	const char *p = profile(), *at = strstr(p, "\"sgemm\": {"), *end = strstr(at, "]]}") + 3;
	snprintf(text, sizeof(text), "%.*s\"sgemm\": {\"nn\": [%s], \"nt\": [%s], \"tn\": [%s]}%s",
		 (int)(at - p), p, pts[0], pts[1], pts[2], end);
	HwProfile hw;
	PxError err = {0};
	int rc = parse_profile(text, &hw, &err);
	if (rc)
		fprintf(stderr, "\n%s\n", err.msg);
	CU_ASSERT_EQUAL_FATAL(rc, 0);
	const HwCpuLevel *l = &hw.cpu->level[0];
	CU_ASSERT_EQUAL(l->n_m * l->n_n * l->n_k, 8);
	CU_ASSERT_DOUBLE_EQUAL(hwcpu_gemm_rate(l, HWCPU_NN, 200, 200, 200), 13.5e9, 1e3);
	CU_ASSERT_DOUBLE_EQUAL(hwcpu_gemm_rate(l, HWCPU_NT, 200, 400, 100), 12.5e9, 1e3);
	CU_ASSERT_DOUBLE_EQUAL(hwcpu_gemm_rate(l, HWCPU_TN, 1000, 50, 400), 15e9, 1e3);
	CU_ASSERT_DOUBLE_EQUAL(hwcpu_gemm_s(l, HWCPU_NN, 100, 100, 100), 2e6 / 10e9, 1e-15);
	CU_ASSERT_DOUBLE_EQUAL(hwcpu_gemm_peak(l), 17e9, 1e3);
	hwprofile_free(&hw);
}

/* Collectives linear in size between the measured points (exact for latency + bytes/bandwidth),
 * the smallest size's time below them, the last segment's slope beyond: all_gather 20 us at
 * 1 KiB, 2 ms at 1 MiB, so 2e-5 + (x - 1024) (2e-3 - 2e-5) / (1048576 - 1024). memmove: one
 * point, so the same bandwidth everywhere; a loop the profile leaves out, its bytes copied. */
static void test_curves(void)
{
	HwProfile hw;
	PxError err = {0};
	CU_ASSERT_EQUAL_FATAL(parse_profile(profile(), &hw, &err), 0);
	const HwCpuLevel *l = hwcpu_level(hw.cpu, 2);
	double slope = (2e-3 - 2e-5) / (1048576 - 1024);
	CU_ASSERT_DOUBLE_EQUAL(hwcpu_coll_s(l, COLL_ALL_GATHER, 524800), 2e-5 + 523776 * slope,
			       1e-12);
	CU_ASSERT_DOUBLE_EQUAL(hwcpu_coll_s(l, COLL_ALL_GATHER, 4), 2e-5, 1e-15);
	CU_ASSERT_DOUBLE_EQUAL(hwcpu_coll_s(l, COLL_ALL_GATHER, 2097152),
			       2e-3 + 1048576 * slope, 1e-12);
	CU_ASSERT_DOUBLE_EQUAL(hwcpu_coll_s(l, COLL_REDUCE_SCATTER, 1024), 3e-5, 1e-15);
	CU_ASSERT_DOUBLE_EQUAL(hwcpu_coll_s(l, COLL_ALL_TO_ALL, 1024), 4e-5, 1e-15);
	CU_ASSERT(hwcpu_coll_s(l, COLL_BROADCAST, 1024) < 0); /* not a kind the profile times */
	CU_ASSERT_DOUBLE_EQUAL(hwcpu_copy_s(l, 1e9), 1e-5, 1e-15);
	/* nonfinite.bf16 is not in the profile: 1000 elements of 2 bytes read at 1e14 B/s */
	CU_ASSERT_DOUBLE_EQUAL(hwcpu_elem_s(l, HWCPU_NONFINITE, DT_BF16, DT_BF16, 1000), 2e-11,
			       1e-20);
	CU_ASSERT_DOUBLE_EQUAL(hwcpu_elem_s(l, HWCPU_ADD, DT_BF16, DT_FP32, 1000), 2e-6, 1e-18);
	hwprofile_free(&hw);
}

/* ---- pricing a step ---- */

/* scenarios/NAME.json with the overrides sets (each "key=value"), predicted (memory only: no
 * profile). 0, or -1 having said why on stderr. */
static int load_mini(const char *name, const char *const *sets, int n, Scenario *sc,
		     Prediction *pr)
{
	JsonOverrides ov;
	PxError err = {0};
	char path[256];
	snprintf(path, sizeof(path), "scenarios/%s.json", name);
	jov_init(&ov);
	int rc = 0;
	for (int i = 0; i < n && !rc; i++)
		rc = jov_add(&ov, sets[i], &err);
	rc = rc || scenario_load(sc, px_test_path(path), &ov, &err);
	jov_free(&ov);
	if (!rc && predict_run(sc, pr, &err)) {
		scenario_free(sc);
		rc = -1;
	}
	if (rc)
		fprintf(stderr, "\n%s: %s\n", name, err.msg);
	return rc;
}

/* The bundled CPU scenario on `ranks` ranks of one machine, predicted (memory only: no profile). */
static int mini(int ranks, Scenario *sc, Prediction *pr)
{
	char kv[64];
	const char *sets[] = {kv};
	snprintf(kv, sizeof(kv), "cluster.gpus_per_node=%d", ranks);
	return load_mini("gpt2-mini-cpu-zero3", sets, 1, sc, pr);
}

/* gpt2-mini-cpu-zero3 on 1 rank, by hand: bf16, B = 4, T = 64, C = 128, H = 4, V = 256, L = 4,
 * N = B T = 256 tokens, 32 / 4 = 8 micro-batches, ZeRO-3 with nothing to gather or reduce. Terms:
 * BTC = 32768, BTTC = 2097152, BTTH = 65536, BTV = 65536. Products at 1e11 FLOP/s.
 *   embed forward: 1e-9 BTC = 32.768 us
 *   block forward: x w of (N, 3C, C), (N, C, C), (N, 4C, C), (N, C, 4C) = 2 N 12 C^2 + 2 N 4 C^2
 *     = 100663296 FLOPs = 1006.63296 us; 1e-8 BTC + 1e-10 BTTC + 1e-9 BTTH = 327.68 + 209.7152
 *     + 65.536 = 602.9312 us; 1609.56416 us each, 6438.25664 for the 4
 *   head forward: x wte^T, 2 N V C = 16777216 FLOPs = 167.77216 us; 1e-9 BTC + 3e-9 BTV =
 *     229.376 us; 397.14816 us
 *   forward: 6868.1728 us a micro-batch
 *   block backward: twice the products, 2013.26592 us; 2e-8 BTC + 2e-10 BTTC + 2e-9 BTTH =
 *     1205.8624 us; its 12 C^2 + 13 C = 198272 gradients added into bf16 at 2e-9: 396.544 us;
 *     3615.67232 us each, 14462.68928 for the 4
 *   head backward: 335.54432 + (2e-9 BTC + 4e-9 BTV = 327.68) + (2 C + V C = 33024 added at
 *     2e-9: 66.048) = 729.27232 us
 *   embed backward: 2e-9 BTC = 65.536 us + its (V + 128 positions) C = 49152 gradients at 2e-9,
 *     98.304 us + the head's share of the tied embedding, V C = 32768 bf16 += bf16 at 1e-9,
 *     32.768 us: 196.608 us
 *   backward: 15388.5696 us a micro-batch; with forward 22256.7424 us, 178053.9392 for 8
 *   optimizer over the 49152 + 4 x 198272 + 256 = 842496 parameters: squares of the bf16
 *     gradients 1e-9, to fp32 1e-9, AdamW 5e-9, back to bf16 2e-9: 9e-9 x 842496 = 7582.464 us
 *   step: 185636.4032 us, plus copies and zeroed buffers at 1e5 GB/s (under 1e-5 s). */
static void test_step_by_hand(void)
{
	Scenario sc;
	Prediction pr;
	HwProfile hw;
	PxError err = {0};
	CU_ASSERT_EQUAL_FATAL(parse_profile(profile(), &hw, &err), 0);
	if (mini(1, &sc, &pr)) {
		CU_FAIL("gpt2-mini-cpu-zero3 did not load");
		hwprofile_free(&hw);
		return;
	}
	CU_ASSERT_EQUAL(pr.time_known, 0); /* predict_run prices no CPU scenario */
	PX_ASSERT_HAS(pr.time_note, "backend cpu: no CPU hardware profile");
	CU_ASSERT_EQUAL_FATAL(predict_time(&pr, &hw, "cpu.json", &err), 0);
	if (!pr.time_known)
		fprintf(stderr, "\nnot priced: %s\n", pr.time_note);
	CU_ASSERT_EQUAL_FATAL(pr.time_known, 1);
	CU_ASSERT_DOUBLE_EQUAL(pr.time.step_s, 0.1856364032, 1e-5);
	CU_ASSERT(pr.time.step_s >= 0.1856364032);
	CU_ASSERT_DOUBLE_EQUAL(pr.time.breakdown.fwd_s, 8 * 6868.1728e-6, 1e-5);
	CU_ASSERT_DOUBLE_EQUAL(pr.time.breakdown.bwd_s, 8 * 15388.5696e-6, 1e-5);
	CU_ASSERT_DOUBLE_EQUAL(pr.time.breakdown.optimizer_s, 7582.464e-6, 1e-5);
	CU_ASSERT_DOUBLE_EQUAL(pr.time.peak_flops_per_gpu, 100e9, 1); /* MFU's: the sgemm rate */
	CU_ASSERT_PTR_NULL(pr.hw.cpu); /* the section stays the profile's */
	fx_free(&sc, &pr);
	hwprofile_free(&hw);
}

/* scenarios/gpt2-mini-cpu-sparse.json on its 2 ranks with the overrides sets (each "key=value"),
 * predicted; its first block forward op priced with the hand profile into *s. 0, or -1. */
static int sparse_block_forward_s(const char *const *sets, int n, const HwProfile *hw, double *s)
{
	Scenario sc;
	Prediction pr;
	if (load_mini("gpt2-mini-cpu-sparse", sets, n, &sc, &pr))
		return -1;
	const Schedule *sch = &pr.stages[0].sched;
	*s = -1;
	for (int i = sch->step_begin; i < sch->n && *s < 0; i++)
		if (sch->ops[i].kind == OP_COMPUTE && sch->ops[i].sub == COMP_FWD &&
		    sch->ops[i].unit == 1)
			*s = opcost_compute_s(&pr.plan, hw, &sch->ops[i], 0);
	fx_free(&sc, &pr);
	return *s < 0 ? -1 : 0;
}

/* Block-sparse attention on the CPU executor (kernels/sparse_eager_cpu.c visits only the causal
 * pairs of the kept blocks). scenarios/gpt2-mini-cpu-sparse.json, in bf16 for the hand profile's
 * 16-bit kernels: B 4, T 128, C 128, NH 4; its fixed layout (nb 8, windows of 4, one global
 * block) keeps per head 16 blocks left of the diagonal and the 8 diagonal ones: 16 x 16^2 +
 * 8 x (16 x 17 / 2) = 5,184 causal pairs, against the dense kernel's 128 x 129 / 2 = 8,256. A
 * block forward's attention terms, 1e-10 s x B T^2 C + 1e-9 s x B T^2 NH = 8.388608e-4 +
 * 2.62144e-4 = 1.1010048e-3 s dense, scale by 5,184 / 8,256: 4.0968e-4 s less than the same block
 * with dense attention (everything else alike). */
static void test_sparse_attention_terms(void)
{
	HwProfile hw;
	PxError err = {0};
	double sparse, dense;
	static const char *const bf16[] = {"deepspeed.bf16.enabled=true"};
	static const char *const none[] = {"deepspeed.bf16.enabled=true",
					   "deepspeed.sparse_attention=null"};
	CU_ASSERT_EQUAL_FATAL(parse_profile(profile(), &hw, &err), 0);
	CU_ASSERT_EQUAL_FATAL(sparse_block_forward_s(bf16, 1, &hw, &sparse), 0);
	CU_ASSERT_EQUAL_FATAL(sparse_block_forward_s(none, 2, &hw, &dense), 0);
	CU_ASSERT_DOUBLE_EQUAL(dense - sparse, 1.1010048e-3 * (1 - 5184.0 / 8256.0), 1e-9);
	hwprofile_free(&hw);
}

/* Every op of one rank's schedule in order, loops run out: the sum of their own durations. */
static double serial_sum(const Plan *p, const Schedule *s, const HwProfile *hw)
{
	double sum = 0;
	for (int i = s->step_begin; i < s->n; i++) {
		const Op *op = &s->ops[i];
		double times = 1;
		if (op->kind == OP_LOOP) {
			int end = i + 1;
			while (s->ops[end].kind != OP_END_LOOP)
				end++;
			times = (double)op->count;
			for (int j = i + 1; j < end; j++) {
				const Op *o = &s->ops[j];
				sum += times * (o->kind == OP_COMPUTE ? opcost_compute_s(p, hw, o, 0) :
						o->kind == OP_COLL ? opcost_coll_s(p, hw, o, 0, 1) :
						o->kind == OP_COPY ? opcost_copy_s(p, hw, o) :
						o->kind == OP_ALLOC ? opcost_cpu_alloc_s(p, hw, o) : 0);
			}
			i = end;
			continue;
		}
		sum += op->kind == OP_COMPUTE ? opcost_compute_s(p, hw, op, 0) :
		       op->kind == OP_COLL ? opcost_coll_s(p, hw, op, 0, 1) :
		       op->kind == OP_COPY ? opcost_copy_s(p, hw, op) :
		       op->kind == OP_ALLOC ? opcost_cpu_alloc_s(p, hw, op) : 0;
	}
	return sum;
}

/* The CPU executor has one thread: MPI moves a started collective's bytes only inside its wait,
 * so nothing overlaps and the step is the sum of its ops (the same on 1 rank, with no
 * collectives). A GPU profile's replay overlaps the ZeRO-3 gathers, so its step is shorter than
 * the same sum. */
static void test_step_is_serial(void)
{
	Scenario sc;
	Prediction pr;
	HwProfile hw;
	PxError err = {0};
	CU_ASSERT_EQUAL_FATAL(parse_profile(profile(), &hw, &err), 0);
	for (int ranks = 1; ranks <= 2; ranks++) {
		if (mini(ranks, &sc, &pr)) {
			CU_FAIL("gpt2-mini-cpu-zero3 did not load");
			break;
		}
		CU_ASSERT_EQUAL(predict_time(&pr, &hw, "cpu.json", &err), 0);
		CU_ASSERT_EQUAL(pr.time_known, 1);
		double sum = serial_sum(&pr.plan, &pr.stages[0].sched, &hw);
		CU_ASSERT_DOUBLE_EQUAL(pr.time.step_s, sum, 1e-9 * sum);
		if (ranks == 2) /* the collectives are in the step */
			CU_ASSERT(pr.time.breakdown.comm_s[GROUP_DP] > 0);
		fx_free(&sc, &pr);
	}
	hwprofile_free(&hw);
}

/* The contiguous gradient bucket is torch.empty's (DeepSpeed's stage 1-2 ipg buffer of
 * reduce_bucket_size elements; exec/runner_buf.c allocates it unzeroed): its allocation costs no
 * fill, where every other allocation is zeroed at the profile's fill rate, 1e14 B/s here. So the
 * step of gpt2-mini-cpu-sparse (ZeRO 1) does not move with reduce_bucket_size, which moves only
 * that buffer: 5e8 elements (1 GB of bf16 gradients, the default) against 5e6. Before it was
 * priced empty, a 2-core machine's profile (fill 10-30 GB/s) charged 20 ms a micro-batch for it,
 * which the runs never spent. */
static void test_empty_bucket_unfilled(void)
{
	HwProfile hw;
	PxError err = {0};
	CU_ASSERT_EQUAL_FATAL(parse_profile(profile(), &hw, &err), 0);
	double step[2] = {-1, -1};
	for (int k = 0; k < 2; k++) {
		const char *sets[] = {k ? "deepspeed.zero_optimization.reduce_bucket_size=5e6" :
					  "deepspeed.zero_optimization.reduce_bucket_size=5e8",
				      "deepspeed.bf16.enabled=true"};
		Scenario sc;
		Prediction pr;
		if (load_mini("gpt2-mini-cpu-sparse", sets, 2, &sc, &pr)) {
			CU_FAIL("gpt2-mini-cpu-sparse did not load");
			break;
		}
		CU_ASSERT_EQUAL(predict_time(&pr, &hw, "cpu.json", &err), 0);
		CU_ASSERT_EQUAL(pr.time_known, 1);
		step[k] = pr.time.step_s;
		const Schedule *s = &pr.stages[0].sched;
		int buckets = 0, others = 0;
		for (int i = s->step_begin; i < s->n; i++) {
			const Op *op = &s->ops[i];
			if (op->kind != OP_ALLOC || op->place != PLACE_GPU)
				continue;
			double t = opcost_cpu_alloc_s(&pr.plan, &hw, op);
			if (op->what == BUF_REDUCE_BUCKET) {
				buckets++;
				CU_ASSERT_DOUBLE_EQUAL(op->bytes, k ? 5e6 * 2 : 5e8 * 2, 1);
				CU_ASSERT_EQUAL(t, 0);
			} else if (op->bytes > 0) {
				others++;
				CU_ASSERT_DOUBLE_EQUAL(t, op->bytes / 1e14, 1e-6 * t);
			}
		}
		CU_ASSERT(buckets >= 1 && others >= 1);
		fx_free(&sc, &pr);
	}
	CU_ASSERT(step[0] > 0);
	CU_ASSERT_DOUBLE_EQUAL(step[0], step[1], 1e-9 * step[0]);
	hwprofile_free(&hw);
}

/* One reduce-scatter of stage 3 on 2 ranks, by hand: 600000 bf16 gradients (1200000 bytes, past
 * the last measured size) take 3e-3 + (1200000 - 1048576) (3e-3 - 3e-5) / 1047552 s of MPI; the
 * bucket is zeroed (1200000 bytes at 1e14 B/s) and this rank's 300000 added into its partition
 * at 1e-9 s each.
 *
 * A qwZ gather on 2 ranks, by hand (exec/runner_zpp.c's gather_piece): 600,000 bf16 parameters
 * as INT8 (600,000 bytes) and 100 fp32 scales (400 bytes; the op's 600,400). This rank's piece
 * of 300,000 widened to fp32 (convert.fp32.bf16, 1e-9 s each) and quantized (4e-9 s), the
 * values gathered (2e-3 + (600000 - 1024) x (2e-3 - 2e-5) / 1047552 s) and the scales (400
 * bytes: under the smallest size, 2e-5 s), the 600,000 dequantized (1.5e-9 s) and narrowed
 * back (convert.bf16.fp32, 2e-9 s). With hpZ over 2 (zero_hpz_partition_size), the forward's
 * gather over the data-parallel group also copies its node's piece, 600,000 / 2 x 2 bytes at
 * 1e14 B/s. */
static void test_reduce_scatter_by_hand(void)
{
	Scenario sc;
	Prediction pr;
	HwProfile hw;
	PxError err = {0};
	CU_ASSERT_EQUAL_FATAL(parse_profile(profile(), &hw, &err), 0);
	if (mini(2, &sc, &pr)) {
		CU_FAIL("gpt2-mini-cpu-zero3 did not load");
		hwprofile_free(&hw);
		return;
	}
	Op op = {.kind = OP_COLL, .sub = COLL_REDUCE_SCATTER, .group = GROUP_DP, .elem_bytes = 2,
		 .unit = 1, .buf = 0, .nranks = 2, .elems = 600000, .bytes = 1200000};
	double mpi = 3e-3 + (1200000 - 1048576) * (3e-3 - 3e-5) / (1048576 - 1024);
	CU_ASSERT_DOUBLE_EQUAL(opcost_coll_s(&pr.plan, &hw, &op, 0, 1),
			       mpi + 1200000 / 1e14 + 300000 * 1e-9, 1e-12);
	op.sub = COLL_ALL_GATHER; /* nothing around a gather */
	double gather = 2e-3 + (1200000 - 1048576) * (2e-3 - 2e-5) / (1048576 - 1024);
	CU_ASSERT_DOUBLE_EQUAL(opcost_coll_s(&pr.plan, &hw, &op, 0, 1), gather, 1e-12);
	op.role = ROLE_PREFETCH; /* a prefetch's gather without ZeRO++: the same */
	CU_ASSERT_DOUBLE_EQUAL(opcost_coll_s(&pr.plan, &hw, &op, 0, 1), gather, 1e-12);
	/* qwZ's INT8 gather */
	op = (Op){.kind = OP_COLL, .sub = COLL_ALL_GATHER, .role = ROLE_PREFETCH, .group = GROUP_DP,
		  .elem_bytes = 1, .unit = 1, .buf = 0, .nranks = 2, .elems = 600000,
		  .bytes = 600400};
	double slope = (2e-3 - 2e-5) / (1048576 - 1024);
	double by_hand = 300000 * 1e-9 + 300000 * 4e-9 + (2e-5 + (600000 - 1024) * slope) + 2e-5 +
			 600000 * 1.5e-9 + 600000 * 2e-9;
	CU_ASSERT_DOUBLE_EQUAL(opcost_coll_s(&pr.plan, &hw, &op, 0, 1), by_hand, 1e-12);
	pr.plan.hpz = 2;
	CU_ASSERT_DOUBLE_EQUAL(opcost_coll_s(&pr.plan, &hw, &op, 0, 1), by_hand + 600000.0 / 1e14,
			       1e-12);
	fx_free(&sc, &pr);
	hwprofile_free(&hw);
}

/* The first op of unit u's kind (and sub) in the schedule, or NULL. */
static const Op *first_op(const Schedule *s, OpKind kind, int sub, int u)
{
	for (int i = s->step_begin; i < s->n; i++)
		if (s->ops[i].kind == kind && s->ops[i].sub == sub && s->ops[i].unit == u)
			return &s->ops[i];
	return NULL;
}

/* Expert parallelism on the CPU executor, by hand: scenarios/gpt2-mini-cpu-moe.json in bf16
 * (the hand profile's kernels) on its 2 ranks, ep 2: B 4, T 64, C 128, 4 experts, top-1,
 * capacity factor 1, so S = 256 tokens a rank and a capacity of 256 / 4 = 64. Block 2 (unit 2)
 * is an MoE block, block 1 (unit 1) a dense one. Their attention and kernel terms are alike; the
 * dense MLP's products, 2 x 256 x 128 x 512 x 2 FLOPs, equal the 2 local experts' over 64 x 2
 * rows each, 2 x (2 x 128 x 128 x 512 x 2); the MoE block adds the router's 2 x 256 x 128 x 4 =
 * 262,144 FLOPs at 100 GFLOP/s (2.62144 us forward; backward twice that), and copies in its
 * local experts' extra parameters (bf16 at 1e14 B/s). Each of its all-to-alls moves the 4 x 64
 * slots of 128 bf16 channels, 65,536 bytes: 4e-5 + (65536 - 1024) x (4e-3 - 4e-5) / 1047552 s. */
static void test_moe_by_hand(void)
{
	Scenario sc;
	Prediction pr;
	HwProfile hw;
	PxError err = {0};
	static const char *const bf16[] = {"deepspeed.bf16.enabled=true"};
	CU_ASSERT_EQUAL_FATAL(parse_profile(profile(), &hw, &err), 0);
	if (load_mini("gpt2-mini-cpu-moe", bf16, 1, &sc, &pr)) {
		CU_FAIL("gpt2-mini-cpu-moe did not load");
		hwprofile_free(&hw);
		return;
	}
	CU_ASSERT_EQUAL(predict_time(&pr, &hw, "cpu.json", &err), 0);
	if (!pr.time_known)
		fprintf(stderr, "\nnot priced: %s\n", pr.time_note);
	CU_ASSERT_EQUAL_FATAL(pr.time_known, 1);
	CU_ASSERT_EQUAL_FATAL(pr.plan.units[2].moe && !pr.plan.units[1].moe, 1);
	CU_ASSERT_EQUAL(pr.plan.moe_capacity, 64);
	const Schedule *s = &pr.stages[0].sched;
	const Op *f1 = first_op(s, OP_COMPUTE, COMP_FWD, 1);
	const Op *f2 = first_op(s, OP_COMPUTE, COMP_FWD, 2);
	const Op *b1 = first_op(s, OP_COMPUTE, COMP_BWD, 1);
	const Op *b2 = first_op(s, OP_COMPUTE, COMP_BWD, 2);
	const Op *a2a = first_op(s, OP_COLL, COLL_ALL_TO_ALL, 2);
	CU_ASSERT_FATAL(f1 && f2 && b1 && b2 && a2a);
	double extra = (double)(pr.plan.units[2].params - pr.plan.units[1].params) * 2 / 1e14;
	CU_ASSERT_DOUBLE_EQUAL(opcost_compute_s(&pr.plan, &hw, f2, 0) -
			       opcost_compute_s(&pr.plan, &hw, f1, 0), 2.62144e-6 + extra, 1e-12);
	/* backward also adds the gradients into the bf16 flat: 2e-9 s an extra element */
	double extra_b = extra + (double)(pr.plan.units[2].params - pr.plan.units[1].params) * 2e-9;
	CU_ASSERT_DOUBLE_EQUAL(opcost_compute_s(&pr.plan, &hw, b2, 0) -
			       opcost_compute_s(&pr.plan, &hw, b1, 0), 2 * 2.62144e-6 + extra_b,
			       1e-12);
	CU_ASSERT_EQUAL(a2a->group, GROUP_EP);
	CU_ASSERT_DOUBLE_EQUAL(a2a->bytes, 65536, 0);
	CU_ASSERT_DOUBLE_EQUAL(opcost_coll_s(&pr.plan, &hw, a2a, 0, 1),
			       4e-5 + (65536 - 1024) * (4e-3 - 4e-5) / (1048576 - 1024), 1e-12);
	fx_free(&sc, &pr);
	hwprofile_free(&hw);
}

/* scenarios/gpt2-mini-cpu-onebit.json (1-bit Adam) in fp16 (the hand profile's kernels) on 2
 * ranks, predicted and priced with the profile text. 0, or -1. */
static int onebit_mini(const char *text, Scenario *sc, Prediction *pr, HwProfile *hw)
{
	static const char *const sets[] = {"cluster.gpus_per_node=2", "deepspeed.fp16.enabled=true"};
	PxError err = {0};
	if (load_mini("gpt2-mini-cpu-onebit", sets, 2, sc, pr))
		return -1;
	int rc = parse_profile(text, hw, &err);
	if (rc)
		fx_free(sc, pr);
	if (!rc && predict_time(pr, hw, "cpu.json", &err)) {
		fx_free(sc, pr);
		hwprofile_free(hw);
		rc = -1;
	}
	if (rc)
		fprintf(stderr, "\n%s\n", err.msg);
	return rc;
}

/* The 1-bit compressed all-reduce on the CPU executor (exec/onebit_comm.c), by hand. Its first
 * op on 2 ranks, 65,536 sign bytes of 524,288 padded elements: the all_to_all's 4e-5 +
 * (65536 - 1024) (4e-3 - 4e-5) / (1048576 - 1024) s, and the arithmetic priced with it:
 * compensating and compressing the padded buffer and the 262,144 of the rank's chunk at 3e-9 s
 * an element, reading the 2 ranks' signs of the chunk (524,288) and expanding the gathered ones
 * (524,288) at 2e-9 s. fp16 1-bit Adam on 2 ranks: every kind of step priced, the compressed
 * one the sum of its ops (the CPU executor overlaps nothing). With a profile written before
 * all_to_all was timed, the full step keeps its price and the compressed one has none, the
 * note saying why. */
static void test_onebit_by_hand(void)
{
	Scenario sc;
	Prediction pr;
	HwProfile hw;
	PxError err = {0};
	if (onebit_mini(profile(), &sc, &pr, &hw)) {
		CU_FAIL("gpt2-mini-cpu-onebit did not load or price");
		return;
	}
	Op op = {.kind = OP_COLL, .sub = COLL_ALL_TO_ALL, .role = ROLE_ONEBIT_SIGNS,
		 .group = GROUP_DP, .elem_bytes = 1, .unit = -1, .buf = 0, .nranks = 2,
		 .elems = 65536, .bytes = 65536};
	double mpi = 4e-5 + (65536 - 1024) * (4e-3 - 4e-5) / (1048576 - 1024);
	CU_ASSERT_DOUBLE_EQUAL(opcost_coll_s(&pr.plan, &hw, &op, 0, 1),
			       mpi + 3e-9 * (524288 + 262144) + 2e-9 * (524288 + 524288), 1e-12);
	op.role = ROLE_ONEBIT_SERVER_SIGNS, op.sub = COLL_ALL_GATHER; /* a gather, nothing more */
	CU_ASSERT_DOUBLE_EQUAL(opcost_coll_s(&pr.plan, &hw, &op, 0, 1),
			       2e-5 + (65536 - 1024) * (2e-3 - 2e-5) / (1048576 - 1024), 1e-12);

	const OneBitRun *o = &pr.onebit;
	CU_ASSERT_EQUAL_FATAL(o->active && o->time_known, 1);
	CU_ASSERT_DOUBLE_EQUAL(o->step_s[ONEBIT_FULL], pr.time.step_s, 0);
	Schedule c;
	pr.plan.onebit_step = ONEBIT_COMPRESSED;
	CU_ASSERT_EQUAL_FATAL(build_schedule(&pr.plan, 0, &c, &err), 0);
	double sum = serial_sum(&pr.plan, &c, &hw);
	pr.plan.onebit_step = ONEBIT_FULL;
	sched_free(&c);
	CU_ASSERT_DOUBLE_EQUAL(o->step_s[ONEBIT_COMPRESSED], sum, 1e-9 * sum);
	CU_ASSERT(o->step_s[ONEBIT_COMPRESSED] != o->step_s[ONEBIT_FULL]);
	fx_free(&sc, &pr);
	hwprofile_free(&hw);

	/* the profile without its all_to_all curve */
	char text[8192];
	const char *p = profile(), *at = strstr(p, ", \"all_to_all\"");
	CU_ASSERT_PTR_NOT_NULL_FATAL(at);
	snprintf(text, sizeof(text), "%.*s%s", (int)(at - p), p, strstr(at, "]]") + 2);
	if (onebit_mini(text, &sc, &pr, &hw)) {
		CU_FAIL("gpt2-mini-cpu-onebit did not price without all_to_all");
		return;
	}
	CU_ASSERT_EQUAL(hwcpu_coll_s(hwcpu_level(hw.cpu, 2), COLL_ALL_TO_ALL, 1024), -1);
	CU_ASSERT_EQUAL(pr.time_known, 1);
	CU_ASSERT_EQUAL(pr.onebit.time_known, 0);
	PX_ASSERT_HAS(pr.onebit.time_note, "the compressed step: ");
	PX_ASSERT_HAS(pr.onebit.time_note, "the CPU profile has no all_to_all at 2 ranks (the "
					   "1-bit compressed all-reduce's first phase; profiles "
					   "written before parallax timed it lack it): calibrate "
					   "again with this parallax");
	fx_free(&sc, &pr);
	hwprofile_free(&hw);
}

/* What a CPU profile cannot price keeps a note saying what is missing: a GPU's profile for the
 * CPU executor, a CPU profile for GPUs, ranks the profile did not measure, two machines. */
static void test_not_priced(void)
{
	Scenario sc;
	Prediction pr;
	HwProfile cpu, gpu;
	PxError err = {0};
	CU_ASSERT_EQUAL_FATAL(parse_profile(profile(), &cpu, &err), 0);
	CU_ASSERT_EQUAL_FATAL(hwprofile_default(cluster_find_gpu("H100-SXM"), &gpu), 0);
	if (mini(4, &sc, &pr)) {
		CU_FAIL("gpt2-mini-cpu-zero3 did not load");
		hwprofile_free(&cpu);
		return;
	}
	CU_ASSERT_EQUAL(predict_time(&pr, &gpu, "built-in H100-SXM", &err), 0);
	CU_ASSERT_EQUAL(pr.time_known, 0);
	PX_ASSERT_HAS(pr.time_note, "backend cpu: no CPU hardware profile (a GPU's profile cannot "
				    "time the CPU executor)");
	CU_ASSERT_EQUAL(predict_time(&pr, &cpu, "cpu.json", &err), 0);
	CU_ASSERT_EQUAL(pr.time_known, 0);
	PX_ASSERT_HAS(pr.time_note, "the CPU profile has no measurement with 4 ranks on the machine "
				    "(it has 1, 2): run `parallax calibrate --backend cpu --ranks 4`");
	fx_free(&sc, &pr);

	CU_ASSERT_EQUAL_FATAL(fx_predict(&sc, &pr, "{\"model\": {\"model_type\": \"gpt2\", "
				"\"n_embd\": 128, \"n_layer\": 2, \"n_head\": 4, \"vocab_size\": 256},"
				" \"deepspeed\": {\"train_batch_size\": 8, \"bf16\": {\"enabled\": true}},"
				" \"cluster\": {\"gpu\": \"H100-SXM\", \"nodes\": 1, "
				"\"gpus_per_node\": 2}, \"seq_length\": 64}"), 0);
	CU_ASSERT_EQUAL(pr.time_known, 1); /* a GPU scenario: the built-in profile */
	CU_ASSERT_EQUAL(predict_time(&pr, &cpu, "cpu.json", &err), 0);
	CU_ASSERT_EQUAL(pr.time_known, 0);
	PX_ASSERT_HAS(pr.time_note, "a CPU profile prices the CPU executor (backend \"cpu\"); this "
				    "scenario runs on GPUs");
	fx_free(&sc, &pr);
	CU_ASSERT_EQUAL_FATAL(fx_predict(&sc, &pr, "{\"model\": {\"model_type\": \"gpt2\", "
				"\"n_embd\": 128, \"n_layer\": 2, \"n_head\": 4, \"vocab_size\": 256},"
				" \"deepspeed\": {\"train_batch_size\": 8, \"bf16\": {\"enabled\": true}},"
				" \"cluster\": {\"gpu\": \"H100-SXM\", \"nodes\": 2, "
				"\"gpus_per_node\": 1}, \"backend\": \"cpu\", \"seq_length\": 64}"), 0);
	CU_ASSERT_EQUAL(predict_time(&pr, &cpu, "cpu.json", &err), 0);
	CU_ASSERT_EQUAL(pr.time_known, 0);
	PX_ASSERT_HAS(pr.time_note, "cluster.nodes is 2: a CPU profile describes the ranks of one "
				    "machine");
	fx_free(&sc, &pr);
	/* selective recompute: the executor has no attention-only recompute to have measured */
	CU_ASSERT_EQUAL_FATAL(fx_predict(&sc, &pr, "{\"model\": {\"model_type\": \"gpt2\", "
				"\"n_embd\": 128, \"n_layer\": 2, \"n_head\": 4, \"vocab_size\": 256},"
				" \"deepspeed\": {\"train_batch_size\": 8, \"bf16\": {\"enabled\": true}},"
				" \"cluster\": {\"gpu\": \"H100-SXM\", \"nodes\": 1, "
				"\"gpus_per_node\": 1}, \"backend\": \"cpu\", \"seq_length\": 64,"
				" \"activation_checkpointing\": \"selective\"}"), 0);
	CU_ASSERT_EQUAL(predict_time(&pr, &cpu, "cpu.json", &err), 0);
	CU_ASSERT_EQUAL(pr.time_known, 0);
	PX_ASSERT_HAS(pr.time_note, "activation_checkpointing is \"selective\": a CPU profile times "
				    "the CPU executor's kernels, which recompute whole blocks or "
				    "nothing (use \"none\" or \"full\")");
	fx_free(&sc, &pr);
	hwprofile_free(&cpu);
}

/* ---- through the binary ---- */

static char out[1 << 16];

/* parallax ARGS with PARALLAX_CPU_PROFILE=env (NULL: as the suites run, empty) */
static int run_env(const char *env, const char *args)
{
	char cmd[16384];
	const char *bin = getenv("PX_BIN");
	snprintf(cmd, sizeof(cmd), "PARALLAX_CPU_PROFILE='%.1000s' '%.1000s' %.8000s", env ? env : "",
		 bin ? bin : "build/rel/parallax", args);
	return px_test_run_sh(cmd, out, sizeof(out));
}

/* Where predict finds the CPU profile: $PARALLAX_CPU_PROFILE (else results/cpu-profile.json).
 * There: the step time, with the profile named and a warning that it was measured elsewhere; not
 * there: the note says where it looked, and plot time, which must have the time, refuses (2); a
 * GPU's profile or a broken one there: refused (2), naming the file. */
static void test_default_profile(void)
{
	char dir[512], path[600], args[2048], text[8192];
	snprintf(dir, sizeof(dir), "%s", px_test_tmpdir());
	snprintf(path, sizeof(path), "%s/cpu.json", dir);
	px_test_write_file(path, profile());
	const char *scn = px_test_path("scenarios/gpt2-mini-cpu-zero3.json");
	char scn_arg[1100];
	snprintf(scn_arg, sizeof(scn_arg), "'%s' --set cluster.gpus_per_node=2 --no-db", scn);

	snprintf(args, sizeof(args), "predict %s", scn_arg);
	CU_ASSERT_EQUAL(run_env(path, args), 0);
	PX_ASSERT_HAS(out, "step time (pipeline stage 0, the slowest; profile: ");
	PX_ASSERT_HAS(out, "/cpu.json)");
	PX_ASSERT_HAS(out, "warning: CPU profile measured on test-host, this machine is ");
	CU_ASSERT_PTR_NULL(strstr(out, "not priced"));
	snprintf(args, sizeof(args), "predict %s --json", scn_arg);
	CU_ASSERT_EQUAL(run_env(path, args), 0);
	cJSON *j = cJSON_Parse(out);
	const cJSON *t = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "time"), "step_s");
	CU_ASSERT(cJSON_IsNumber(t) && t->valuedouble > 0.05 && t->valuedouble < 1);
	cJSON_Delete(j);

	snprintf(text, sizeof(text), "%s/none.json", dir);
	snprintf(args, sizeof(args), "predict %s", scn_arg);
	CU_ASSERT_EQUAL(run_env(text, args), 0);
	PX_ASSERT_HAS(out, "# step time: not priced: backend cpu: no CPU hardware profile at ");
	PX_ASSERT_HAS(out, "/none.json (`parallax calibrate --backend cpu` measures this machine "
			   "and writes it there; or give --hw FILE)");
	CU_ASSERT_EQUAL(run_env(NULL, args), 0);
	PX_ASSERT_HAS(out, "no CPU hardware profile (PARALLAX_CPU_PROFILE is empty");
	snprintf(args, sizeof(args), "plot time '%s' --out '%s/t'", scn, dir);
	CU_ASSERT_EQUAL(run_env(text, args), 2);
	PX_ASSERT_HAS(out, "the step time is not priced: backend cpu: no CPU hardware profile at ");

	snprintf(args, sizeof(args), "predict %s", scn_arg);
	CU_ASSERT_EQUAL(run_env(px_test_path("scenarios/hardware/H100-SXM.json"), args), 2);
	PX_ASSERT_HAS(out, "H100-SXM.json: a GPU's profile where the CPU profile belongs");
	snprintf(text, sizeof(text), "%s/broken.json", dir);
	px_test_write_file(text, "{\"cpu\": {\"levels\": []}}");
	CU_ASSERT_EQUAL(run_env(text, args), 2);
	PX_ASSERT_HAS(out, "broken.json:1:20: cpu.levels: expected an array of 1 to 8 levels");
	/* --hw wins over the default */
	snprintf(args, sizeof(args), "predict %s --hw '%s'", scn_arg, path);
	CU_ASSERT_EQUAL(run_env(text, args), 0);
	PX_ASSERT_HAS(out, "/cpu.json)");
}

/* A profile measured with OpenBLAS's idle threads spinning another length than a run here has
 * (OPENBLAS_THREAD_TIMEOUT: a run without one in its environment sets 4, cli/main.c) gets a
 * warning from predict; one measured at 4 gets none. The profile says this machine's host name
 * and no OpenBLAS thread count, so that no other warning comes first. */
static void test_blas_spin_mismatch(void)
{
	char dir[512], path[600], cmd[4096], host[128] = "", extra[64];
	snprintf(dir, sizeof(dir), "%s", px_test_tmpdir());
	snprintf(path, sizeof(path), "%s/spin.json", dir);
	gethostname(host, sizeof(host) - 1);
	const char *bin = getenv("PX_BIN");
	for (int spin = 4; spin <= 28; spin += 24) {
		snprintf(extra, sizeof(extra), ", \"blas_thread_timeout\": %d", spin);
		px_test_write_file(path, profile_on(host, extra));
		snprintf(cmd, sizeof(cmd), "env -u OPENBLAS_THREAD_TIMEOUT '%.1000s' predict --no-db "
			 "'%.1000s' --set cluster.gpus_per_node=2 --hw '%.1000s'",
			 bin ? bin : "build/rel/parallax",
			 px_test_path("scenarios/gpt2-mini-cpu-zero3.json"), path);
		CU_ASSERT_EQUAL(px_test_run_sh(cmd, out, sizeof(out)), 0);
		CU_ASSERT_PTR_NULL(strstr(out, "measured on test-host"));
		if (spin == 28)
			PX_ASSERT_HAS(out, "spin.json: warning: CPU profile measured with OpenBLAS's idle "
					   "threads spinning 2^28 cycles (OPENBLAS_THREAD_TIMEOUT 28), a "
					   "run here spins 2^4");
		else
			CU_ASSERT_PTR_NULL(strstr(out, "warning: CPU profile"));
	}
}

/* calibrate --backend cpu --quick on 2 ranks: levels 1 and 2 in one profile that loads, every
 * sgemm rate and bandwidth above 0, the kernels of both flavours, collectives at 2 ranks only;
 * predict prices the mini scenario on 1 and 2 ranks with it and says it has no 4. */
static void test_calibrate_cpu(void)
{
	char dir[512], path[600], args[2048];
	snprintf(dir, sizeof(dir), "%s", px_test_tmpdir());
	snprintf(path, sizeof(path), "%s/cal.json", dir);
	snprintf(args, sizeof(args), "calibrate --backend cpu --ranks 2 --quick --out '%s'", path);
	int rc = px_test_run_release(args, 600, out, sizeof(out));
	if (rc)
		fprintf(stderr, "\nparallax %s exited %d:\n%s\n", args, rc, out);
	CU_ASSERT_EQUAL_FATAL(rc, 0);
	PX_ASSERT_HAS(out, "# level 2: 2 ranks measuring at once");
	HwProfile hw;
	PxError err = {0};
	rc = hwprofile_load(path, &hw, &err);
	if (rc)
		fprintf(stderr, "\n%s\n", err.msg);
	CU_ASSERT_EQUAL_FATAL(rc, 0);
	CU_ASSERT_EQUAL_FATAL(hw.cpu->n_levels, 2);
	for (int i = 0; i < 2; i++) {
		const HwCpuLevel *l = &hw.cpu->level[i];
		CU_ASSERT_EQUAL(l->ranks, i + 1);
		CU_ASSERT_EQUAL(l->n_m * l->n_n * l->n_k, 8); /* --quick: 2 x 2 x 2 */
		CU_ASSERT(hwcpu_gemm_rate(l, HWCPU_NT, 100, 100, 100) > 0);
		CU_ASSERT(l->have_kernels[HWCPU_FP32] && l->have_kernels[HWCPU_16BIT]);
		CU_ASSERT(l->copy_Bps.n == 2 && l->copy_Bps.y[1] > 0 && l->fill_Bps.y[1] > 0);
		CU_ASSERT(l->adamw_s > 0 && l->elem_s[HWCPU_ADD][1][0] > 0);
		CU_ASSERT_EQUAL(l->coll_s[1].n, i ? 7 : 0); /* 1 KiB to 4 MiB by 4 */
		CU_ASSERT_EQUAL(l->coll_s[3].n, i ? 7 : 0); /* all_to_all */
		CU_ASSERT(l->onebit_compress_s > 0 && l->onebit_expand_s > 0);
		CU_ASSERT(l->quantize_s > 0 && l->dequantize_s > 0);
		for (int k = 0; k < HWCPU_COLLS; k++) /* a larger size never reads faster */
			for (int s = 1; s < l->coll_s[k].n; s++)
				CU_ASSERT(l->coll_s[k].y[s] >= l->coll_s[k].y[s - 1]);
	}
	CU_ASSERT_EQUAL(hw.cpu->cores, (int)sysconf(_SC_NPROCESSORS_ONLN));
	/* measured with OpenBLAS's idle threads spinning the least: calibrate started itself again
	 * with OPENBLAS_THREAD_TIMEOUT 4 (cli/main.c), unless this environment sets its own */
	const char *spin = getenv("OPENBLAS_THREAD_TIMEOUT");
	int set = spin ? atoi(spin) : 4; /* OpenBLAS: a positive value clamped to 4-30, else 28 */
	CU_ASSERT_EQUAL(hw.cpu->blas_thread_timeout,
			set <= 0 ? 28 : set < 4 ? 4 : set > 30 ? 30 : set);
	hwprofile_free(&hw);
	CU_ASSERT_EQUAL(access(dir, F_OK), 0);
	const char *scn = px_test_path("scenarios/gpt2-mini-cpu-zero3.json");
	for (int ranks = 1; ranks <= 4; ranks *= 2) {
		snprintf(args, sizeof(args), "predict --no-db '%s' --hw '%s' --set "
			 "cluster.gpus_per_node=%d", scn, path, ranks);
		CU_ASSERT_EQUAL(run_env(NULL, args), 0);
		if (ranks < 4)
			PX_ASSERT_HAS(out, "profile: ");
		else
			PX_ASSERT_HAS(out, "has no measurement with 4 ranks on the machine (it has "
					   "1, 2)");
	}
}

/* A CPU run with a profile prints its measured step beside the predicted one and stores both:
 * compare pairs time.step_s (predicted from the profile, measured by the run) instead of
 * listing it as measured only. */
static void test_run_pairs_time(void)
{
	char dir[512], path[600], scn[600], db[600], args[4096], text[2048];
	snprintf(dir, sizeof(dir), "%s", px_test_tmpdir());
	snprintf(path, sizeof(path), "%s/cpu.json", dir);
	snprintf(scn, sizeof(scn), "%s/gpt.json", dir);
	snprintf(db, sizeof(db), "%s/r.db", dir);
	px_test_write_file(path, profile());
	snprintf(text, sizeof(text), PX_TEST_GPT_SCENARIO, "cpu-time", "true", 3);
	px_test_write_file(scn, text);
	snprintf(args, sizeof(args), "run '%s' --steps 3 --db '%s' --hw '%s'", scn, db, path);
	int rc = px_test_run_release(args, 300, out, sizeof(out));
	if (rc)
		fprintf(stderr, "\nparallax %s exited %d:\n%s\n", args, rc, out);
	CU_ASSERT_EQUAL_FATAL(rc, 0);
	PX_ASSERT_HAS(out, "# step time: measured ");
	PX_ASSERT_HAS(out, " s (the mean of steps 2-3; ");
	PX_ASSERT_HAS(out, "), predicted ");
	PX_ASSERT_HAS(out, "profile ");
	snprintf(args, sizeof(args), "compare --db '%s'", db);
	CU_ASSERT_EQUAL(run_env(NULL, args), 0);
	const char *row = strstr(out, "time.step_s ");
	CU_ASSERT_PTR_NOT_NULL_FATAL(row);
	double p = 0, m = 0;
	CU_ASSERT_EQUAL(sscanf(row, "time.step_s s %lf %lf", &p, &m), 2);
	CU_ASSERT(p > 0 && m > 0);
	CU_ASSERT_PTR_NULL(strstr(out, "not predicted (the prediction: step time not priced"));
	/* without a profile the same run keeps the note, and compare says why */
	snprintf(args, sizeof(args), "run '%s' --steps 1 --db '%s'", scn, db);
	CU_ASSERT_EQUAL(px_test_run_release(args, 300, out, sizeof(out)), 0);
	CU_ASSERT_PTR_NULL(strstr(out, "# step time: measured"));
	snprintf(args, sizeof(args), "compare --db '%s'", db);
	CU_ASSERT_EQUAL(run_env(NULL, args), 0);
	PX_ASSERT_HAS(out, "# measured, not predicted (the prediction: step time not priced: "
			   "backend cpu: no CPU hardware profile");
}

/* A 1-bit Adam run (fp16, 2 ranks, 6 steps, freeze_step 3: full steps 1-3, compressed 4-6)
 * with the hand profile: run prints each kind's measured step beside its prediction, and compare
 * pairs time.step_s (the full steps 2-3) and time.onebit_compressed.step_s (steps 4-6). With
 * a profile whose all_to_all takes 10 s, a deliberately wrong prediction of the compressed step
 * only (compare's error, (measured - predicted) / predicted, about -95%), the full step's
 * prediction is the same and compare --max-error 50 fails (exit 3) naming the compressed step's
 * time. */
static void test_run_pairs_onebit_time(void)
{
	char dir[512], path[2][600], db[2][600], args[4096], text[8192];
	snprintf(dir, sizeof(dir), "%s", px_test_tmpdir());
	const char *p = profile(), *at = strstr(p, "\"all_to_all\": ");
	CU_ASSERT_PTR_NOT_NULL_FATAL(at);
	snprintf(text, sizeof(text), "%.*s\"all_to_all\": [[1024, 10]]%s", (int)(at - p), p,
		 strstr(at, "]]") + 2);
	double full[2] = {0}, comp[2] = {0}, meas = 0;
	for (int i = 0; i < 2; i++) {
		snprintf(path[i], sizeof(path[i]), "%s/cpu%d.json", dir, i);
		snprintf(db[i], sizeof(db[i]), "%s/r%d.db", dir, i);
		px_test_write_file(path[i], i ? text : p);
		snprintf(args, sizeof(args), "run '%s' --ranks 2 --steps 6 --db '%s' --hw '%s' --set "
			 "cluster.gpus_per_node=2 --set deepspeed.fp16.enabled=true --set "
			 "deepspeed.optimizer.params.freeze_step=3",
			 px_test_path("scenarios/gpt2-mini-cpu-onebit.json"), db[i], path[i]);
		int rc = px_test_run_release(args, 300, out, sizeof(out));
		if (rc)
			fprintf(stderr, "\nparallax %s exited %d:\n%s\n", args, rc, out);
		CU_ASSERT_EQUAL_FATAL(rc, 0);
		PX_ASSERT_HAS(out, " s (the mean of the 2 full-precision steps among 2-6; ");
		PX_ASSERT_HAS(out, "# step time, compressed steps: measured ");
		PX_ASSERT_HAS(out, " s (the mean of 3), predicted ");
		snprintf(args, sizeof(args), "compare --db '%s'", db[i]);
		CU_ASSERT_EQUAL(run_env(NULL, args), 0);
		const char *rf = strstr(out, "time.step_s ");
		const char *rc1 = strstr(out, "time.onebit_compressed.step_s ");
		CU_ASSERT_PTR_NOT_NULL_FATAL(rf);
		CU_ASSERT_PTR_NOT_NULL_FATAL(rc1);
		double m = 0;
		CU_ASSERT_EQUAL(sscanf(rf, "time.step_s s %lf %lf", &full[i], &m), 2);
		CU_ASSERT(full[i] > 0 && m > 0);
		CU_ASSERT_EQUAL(sscanf(rc1, "time.onebit_compressed.step_s s %lf %lf", &comp[i],
				       &meas), 2);
		CU_ASSERT(comp[i] > 0 && meas > 0 && meas < 10);
	}
	CU_ASSERT_DOUBLE_EQUAL(full[1], full[0], 1e-6 * full[0]); /* no all_to_all in full steps */
	CU_ASSERT(comp[1] > 10 && comp[0] < 10); /* the 10 s all_to_all is the compressed step's */
	snprintf(args, sizeof(args), "compare --db '%s' --max-error 50 --only time.onebit",
		 db[1]);
	CU_ASSERT_EQUAL(run_env(NULL, args), 3);
	PX_ASSERT_HAS(out, "parallax compare: time.onebit_compressed.step_s: predicted ");
	PX_ASSERT_HAS(out, "over --max-error 50%");
}

int test_cputime_register(void)
{
	return PX_ADD_SUITE("cputime", {"a CPU profile read", test_parse},
			    {"bad CPU profiles refused naming the key", test_parse_refusals},
			    {"the sgemm grid read between points", test_gemm_grid},
			    {"collectives and bandwidths read between points", test_curves},
			    {"a CPU step priced by hand", test_step_by_hand},
			    {"the CPU executor overlaps nothing", test_step_is_serial},
			    {"a reduce-scatter and gathers priced by hand", test_reduce_scatter_by_hand},
			    {"the gradient bucket is allocated empty", test_empty_bucket_unfilled},
			    {"the 1-bit compressed all-reduce priced by hand", test_onebit_by_hand},
			    {"expert parallelism priced by hand", test_moe_by_hand},
			    {"block-sparse attention: the causal pairs kept, by hand", test_sparse_attention_terms},
			    {"what a CPU profile cannot price keeps a note", test_not_priced},
			    {"the default CPU profile's place", test_default_profile},
			    {"a profile of another OpenBLAS spin warns", test_blas_spin_mismatch},
			    {"calibrate --backend cpu end to end", test_calibrate_cpu, PX_RELEASE_RUN},
			    {"run and compare pair the CPU step time", test_run_pairs_time, PX_RELEASE_RUN},
			    {"a 1-bit run pairs each kind of step's time", test_run_pairs_onebit_time,
			     PX_RELEASE_RUN});
}

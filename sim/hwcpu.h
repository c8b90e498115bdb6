/* hwcpu: the "cpu" section of a hardware profile: how fast this machine runs the CPU executor's
 * work with k of its ranks running at once (one "level" per k calibrated): OpenBLAS sgemm rates
 * over a grid of shapes, the non-GEMM time of the executor's unit kernels as per-element
 * coefficients, its per-element storage and optimizer loops, memory copy and fill bandwidth, and
 * the MPI collectives' time by size. Owns reading the section and evaluating it; measuring it is
 * cli/calib_cpu.c's, pricing a schedule's ops with it sim/opcost_cpu.c's. The format and where
 * each figure comes from: docs/time_model.md, "CPU profiles". */
#ifndef PX_SIM_HWCPU_H
#define PX_SIM_HWCPU_H

#include <stddef.h>

#include "../engine/dsconfig.h"
#include "../engine/jdoc.h"
#include "../engine/schedule.h"

#define HWCPU_MAX_LEVELS 8
#define HWCPU_GRID 8       /* values per axis of the sgemm grid */
#define HWCPU_CURVE_MAX 16 /* points of a size curve */

/* The three ways the executor's products call sgemm (row-major, kernels/ops_cpu.c): forward
 * y = x w ("nn"), the input gradient dy w^T ("nt", also the tied head's logits), the weight
 * gradient x^T dy ("tn"). */
typedef enum { HWCPU_NN, HWCPU_NT, HWCPU_TN, HWCPU_FORMS } HwCpuForm;

/* The executor's unit kernels (exec/compute.h), forward and backward. */
typedef enum {
	HWCPU_EMBED_FWD, HWCPU_EMBED_BWD, HWCPU_BLOCK_FWD, HWCPU_BLOCK_BWD, HWCPU_HEAD_FWD,
	HWCPU_HEAD_BWD, HWCPU_KERNELS
} HwCpuKernel;

/* What a kernel's non-GEMM time is proportional to (B = micro-batch, T = sequence, C =
 * channels, H = heads, V = vocabulary, W = the unit's working parameters): BTC (norms,
 * activations, residuals, casts), B T^2 C (attention's score and context loops), B T^2 H (its
 * softmax), BTV (the loss over the vocabulary), W (the 16-bit kernels widen their weights to fp32
 * at every call). */
typedef enum { HWCPU_BTC, HWCPU_BTTC, HWCPU_BTTH, HWCPU_BTV, HWCPU_W, HWCPU_TERMS } HwCpuTerm;

/* The kernels' two flavours: fp32 (kernels/gpt_cpu.c) and 16-bit (gpt16_cpu.c, bf16 and fp16). */
enum { HWCPU_FP32, HWCPU_16BIT, HWCPU_FLAVOURS };

/* Per-element loops of the executor's storage (exec/compute.h's convert, add, sum_squares,
 * nonfinite between fp32, bf16 and fp16) and its optimizers' updates. */
typedef enum { HWCPU_CONVERT, HWCPU_ADD, HWCPU_SUMSQ, HWCPU_NONFINITE, HWCPU_ELEM_OPS } HwCpuElemOp;
#define HWCPU_DTYPES 3 /* fp32, bf16, fp16 */
#define HWCPU_COLLS 4  /* the MPI collectives timed: hwcpu_coll_kinds */

/* y at points of increasing x; see hwcpu_curve_* for how each is read between points. */
/* The value at `at` of the points (x ascending, n of them): linear in log(x) between points,
 * flat beyond the ends; 0 with none. The GPU profiles' curves use it too. */
double hw_interp_log(int n, const double *x, const double *y, double at);

typedef struct HwCpuCurve {
	int n;
	double x[HWCPU_CURVE_MAX], y[HWCPU_CURVE_MAX];
} HwCpuCurve;

typedef struct HwCpuLevel {
	int ranks;                /* ranks running at once on the machine when it was measured */
	/* sgemm rate, FLOP/s, at every (m, n, k) of the grid (m rows of the result, n columns, k
	 * the inner dimension) */
	int n_m, n_n, n_k;
	double m[HWCPU_GRID], n[HWCPU_GRID], k[HWCPU_GRID];
	double gemm_flops_per_s[HWCPU_FORMS][HWCPU_GRID][HWCPU_GRID][HWCPU_GRID];
	/* non-GEMM seconds of a kernel call per unit of each term; have: the flavour was measured */
	int have_kernels[HWCPU_FLAVOURS];
	double kernel_s[HWCPU_FLAVOURS][HWCPU_KERNELS][HWCPU_TERMS];
	/* seconds per element, [op][dst][src] (sum_squares, nonfinite: [op][x][x]); 0: not measured
	 * (priced as a copy of its bytes) */
	double elem_s[HWCPU_ELEM_OPS][HWCPU_DTYPES][HWCPU_DTYPES];
	double adamw_s, sgd_s;    /* seconds per fp32 element of an update; 0: not measured */
	/* the 1-bit compressed all-reduce's arithmetic (kernels/onebit_cpu.h), seconds per fp32
	 * element: compensating and compressing, and reading signs back (a chunk owner's average,
	 * per element times ranks; the final expansion); 0: not measured */
	double onebit_compress_s, onebit_expand_s;
	/* ZeRO++'s INT8 block quantization (kernels/quant_cpu.h), seconds per fp32 element
	 * quantized and dequantized; 0: not measured */
	double quantize_s, dequantize_s;
	HwCpuCurve copy_Bps;      /* memmove: x bytes, y bytes/s */
	HwCpuCurve fill_Bps;      /* memset */
	/* MPI all_reduce, all_gather, reduce_scatter, all_to_all (hwcpu_coll_kinds) over the
	 * level's ranks: x nccl-tests size (bytes), y seconds (the slowest rank's mean); n 0: not
	 * measured (all_to_all is optional: profiles written before it was timed lack it) */
	HwCpuCurve coll_s[HWCPU_COLLS];
} HwCpuLevel;

typedef struct HwCpu {
	char host[128];           /* the machine it was measured on (hostname) */
	char model[128];          /* its CPU model (/proc/cpuinfo) */
	int cores;                /* online cores */
	int blas_threads;         /* OpenBLAS threads per rank while measuring */
	int blas_thread_timeout;  /* OPENBLAS_THREAD_TIMEOUT while measuring (4 to 30: its idle
				     threads spin 2^this cycles); 0: not recorded (profiles written
				     before 2026-12-02: OpenBLAS's default, 28, unless the user set
				     it) */
	int n_levels;
	HwCpuLevel level[HWCPU_MAX_LEVELS]; /* increasing ranks */
} HwCpu;

/* Read o (the profile's "cpu" object) into c. Keys starting with '_' are comments; others must be
 * known. Errors (PX_ERR_INPUT) name FILE:LINE:COL, the key (cpu.levels[1].sgemm.nn[3]) and what
 * was expected. */
int hwcpu_parse(const JsonObj *o, HwCpu *c, PxError *err);

/* The level measured with exactly `ranks` ranks, or NULL. */
const HwCpuLevel *hwcpu_level(const HwCpu *c, int ranks);
/* "1, 2, 4": the levels' rank counts, for messages. */
void hwcpu_levels_text(const HwCpu *c, char *buf, size_t n);

/* Seconds of one sgemm of form f, m x n x k, at the grid's rate interpolated linearly in the
 * logarithms of m, n and k (the grid's edge rate beyond it). */
double hwcpu_gemm_s(const HwCpuLevel *l, HwCpuForm f, double m, double n, double k);
double hwcpu_gemm_rate(const HwCpuLevel *l, HwCpuForm f, double m, double n, double k);
/* The grid's highest rate: the level's peak (what MFU divides by on a CPU). */
double hwcpu_gemm_peak(const HwCpuLevel *l);

/* Non-GEMM seconds of kernel kind k (flavour: HWCPU_FP32 or HWCPU_16BIT) for those terms. */
double hwcpu_kernel_s(const HwCpuLevel *l, int flavour, HwCpuKernel k,
		      const double terms[HWCPU_TERMS]);

/* Seconds to copy (memmove) or fill (memset) bytes: bytes over the curve's bandwidth, read
 * linearly in log(bytes) between points and flat beyond them. */
double hwcpu_copy_s(const HwCpuLevel *l, double bytes);
double hwcpu_fill_s(const HwCpuLevel *l, double bytes);
/* Seconds of n elements of a storage loop, dst and src dtypes (sum_squares, nonfinite: src
 * only); an unmeasured one is priced as copying its bytes. */
double hwcpu_elem_s(const HwCpuLevel *l, HwCpuElemOp op, Dtype dst, Dtype src, double n);
/* Seconds of an MPI collective (all_reduce, all_gather, reduce_scatter, all_to_all) of `bytes`
 * (nccl-tests size): linear between the measured sizes (exact for a latency-plus-bandwidth cost),
 * the smallest size's time below them, the last segment's slope beyond. -1 for another kind or
 * one the level lacks. */
double hwcpu_coll_s(const HwCpuLevel *l, CollKind kind, double bytes);

/* Names used in the file: "nn", "block_forward", "btc", "convert", "fp32", ... */
extern const char *const hwcpu_form_names[HWCPU_FORMS];
extern const char *const hwcpu_kernel_names[HWCPU_KERNELS];
extern const char *const hwcpu_term_names[HWCPU_TERMS];
extern const char *const hwcpu_elem_names[HWCPU_ELEM_OPS];
extern const char *const hwcpu_dtype_names[HWCPU_DTYPES];
extern const char *const hwcpu_flavour_names[HWCPU_FLAVOURS];
/* The MPI collectives a level times; the "mpi" section names each by coll_name. */
extern const CollKind hwcpu_coll_kinds[HWCPU_COLLS];
/* The index of a Dtype among hwcpu_dtype_names (fp32 0, bf16 1, fp16 2; others as fp32). */
int hwcpu_dtype_index(Dtype d);

#endif

/* hwprofile: how fast a GPU, its links and its host run in practice, as fractions of the peaks in
 * the cluster's GpuSpec (engine/cluster.h) plus latencies: GEMM efficiency by work size, HBM,
 * NVLink and network efficiency by message size, PCIe, NVMe and CPU Adam throughput; or, for the
 * CPU executor, a machine's own measured rates (a "cpu" section, hwcpu.h). Owns reading a profile
 * from JSON and the built-in defaults, one per catalog GPU, each equal to its bundled file
 * scenarios/hardware/<gpu>.json. Peaks and topology stay in the cluster; timing a schedule is
 * timeline.c's. Sources and formulas: docs/time_model.md. */
#ifndef PX_SIM_HWPROFILE_H
#define PX_SIM_HWPROFILE_H

#include <stddef.h>

#include "../engine/cluster.h"
#include "../engine/jdoc.h"
#include "hwcpu.h"

#define HW_CURVE_MAX 16

/* A measured curve: y at n points of increasing x > 0, read between points by linear
 * interpolation in log(x) and flat beyond the first and last points. */
typedef struct HwCurve {
	int n;
	double x[HW_CURVE_MAX];
	double y[HW_CURVE_MAX];
} HwCurve;

/* One class of link (NVLink inside a node, the network between nodes). */
typedef struct HwLink {
	double base_s;           /* latency of one collective call over this class of link, whatever
				    its ranks (NCCL's base latency: launch and setup) */
	double alpha_s;          /* latency of one algorithm step (a ring hop), seconds */
	HwCurve efficiency;      /* x: message bytes (nccl-tests "size"); y: busBw over the link's
				    one-direction peak */
	double allreduce_scale;  /* busBw of an all-reduce inside one such domain over that of a ring
				    all-gather (NVLink SHARP on NVSwitch systems); 1 without */
} HwLink;

typedef struct HwProfile {
	char gpu[32];            /* the catalog GPU it describes */
	/* compute */
	HwCurve gemm;            /* x: FLOPs of one GEMM; y: fraction of the dtype's dense peak */
	double sustained;        /* what a training step sustains of the GEMM and FlashAttention
				    rates above, which are single-kernel benchmarks: clocks under
				    the power limit, framework overheads (calibrated on published
				    runs that are not among the held-out ones) */
	double hbm_efficiency;   /* achieved over the data-sheet HBM bandwidth */
	double elementwise_fwd;  /* bytes non-GEMM kernels move per byte of a unit's activations */
	double elementwise_bwd;  /* other than attention scores, forward (and recompute) and
				    backward (fitted with sustained on published runs) */
	double scores_fwd;       /* the same per byte of eager attention's scores, kept or */
	double scores_bwd;       /* rebuilt (softmax, dropout), which no calibration run has */
	double flash_fwd;        /* FlashAttention's kernel, FLOPs it executes over the dtype's */
	double flash_bwd;        /* dense peak, forward and backward; 0: the GPU has none */
	/* links */
	HwLink nvlink, network;
	long long nvlink_domain; /* GPUs that reach each other over NVLink (8: NVSwitch; 2: bridged
				    pairs); larger groups inside a node go over PCIe */
	/* host */
	double pcie_efficiency;  /* achieved host<->GPU copy bandwidth over the catalog's PCIe figure */
	double nvme_efficiency;  /* achieved over the node's NVMe figure */
	double cpu_adam_elems_per_s; /* optimizer offload: elements one GPU's share of the host's
					cores updates per second */
	double kernel_issue_s;   /* host time the framework takes to issue one GPU kernel (Python
				    and autograd dispatch, cudaLaunchKernel): a pass over a unit
				    takes no less than its kernels' count times this (host-bound) */
	/* memory the CUDA runtime takes, as `parallax calibrate` measured it; 0: the cluster's figure
	 * (engine/cluster.c's cuda_context_MiB, cublas_workspace_MiB, nccl_buffers_MiB) */
	double context_MiB, cublas_MiB, nccl_MiB;
	int from_base;           /* fields a loaded file left to its "gpu"'s default (0: all given) */
	/* a CPU profile (a file with a "cpu" section and nothing else; gpu reads "cpu" and the GPU
	 * fields are 0): this machine's rates for the CPU executor; owned by the profile a load
	 * filled (hwprofile_free), borrowed by copies of it; NULL for a GPU profile */
	HwCpu *cpu;
} HwProfile;

/* y at x on the curve (see HwCurve); 0 for an empty curve. */
double hw_curve_eval(const HwCurve *c, double x);

/* The built-in profile of a catalog GPU (by gpu->name, case-insensitively). Returns 0, or -1 when
 * the name has no bundled profile, in which case hw holds the generic fallback (the A100-80GB's
 * fractions, which apply to the GPU's own peaks). */
int hwprofile_default(const GpuSpec *gpu, HwProfile *hw);

/* Read a profile. Keys starting with '_' are comments (the bundled files cite a source for each
 * figure in "_<key>"); every other key must be known. With "gpu" naming a catalog GPU, absent
 * fields keep that GPU's default; without it every field is required, unless the file is a CPU
 * profile ("cpu" and nothing else). Errors (PX_ERR_INPUT) name FILE:LINE:COL, the key and what was
 * expected. A loaded profile is released with hwprofile_free (nothing is held on failure). */
int hwprofile_load(const char *path, HwProfile *hw, PxError *err);
int hwprofile_parse(const JsonDoc *d, HwProfile *hw, PxError *err);
void hwprofile_free(HwProfile *hw); /* its CPU section; accepts a zeroed or freed profile */

/* The profile's measured CUDA runtime memory into the cluster (where the profile gives it), so
 * that a prediction's memory uses the calibration too. */
void hwprofile_apply_memory(const HwProfile *hw, ClusterSpec *c);

/* A profile measured on one GPU used for a scenario on another (a file's "gpu" against the
 * scenario's cluster.gpu, case-insensitively): returns 1 with a warning naming both written to msg,
 * "PATH: warning: --hw profile measured on H100-SXM, but the scenario's GPU is A100-80GB: ...";
 * 0 when they agree or the profile names no GPU (a "custom" one, every field given). */
int hwprofile_gpu_mismatch(const HwProfile *hw, const char *path, const GpuSpec *gpu, char *msg,
			   size_t n);

/* 1 when every field is equal, else 0 with the first differing field's key written to what. */
int hwprofile_equal(const HwProfile *a, const HwProfile *b, char *what, size_t n);

#endif

/* cluster: the machines a scenario runs on. Owns the built-in GPU catalog (vendor figures, one
 * node type per GPU) and reading a cluster object whose fields override the catalog's.
 * It does not decide how ranks are laid out (plan.c) nor how fast anything runs (the time model). */
#ifndef PX_CLUSTER_H
#define PX_CLUSTER_H

#include "jdoc.h"

typedef struct GpuSpec {
	const char *name;           /* catalog name, "H100-SXM" */
	double mem_bytes;           /* device memory as listed (nvidia-smi's total, or the data
				       sheet's where the catalog has no nvidia-smi figure) */
	double tflops_fp32, tflops_tf32, tflops_fp16, tflops_bf16, tflops_fp8; /* dense peaks */
	double hbm_GBps;            /* device memory bandwidth */
	double nvlink_GBps;         /* per GPU, both directions together (vendor convention) */
	double network_GBps;        /* inter-node bandwidth per GPU, one direction */
	double pcie_GBps;           /* host link per GPU, one direction */
	double cpu_mem_bytes;       /* host memory per node of the reference system */
	double nvme_bytes;          /* NVMe capacity per node */
	double nvme_GBps;           /* NVMe read bandwidth per node */
	const char *node;           /* the reference system the node figures come from */
	/* what the framework can use: torch.cuda.get_device_properties(0).total_memory, which is
	 * cudaMemGetInfo's total, below mem_bytes by what the driver keeps; the fit checks use it */
	double usable_bytes;
	const char *usable_source;  /* where usable_bytes comes from, or how it was derived */
} GpuSpec;

typedef struct ClusterSpec {
	GpuSpec gpu;                /* the catalog entry with the scenario's overrides applied */
	long long nodes, gpus_per_node;
	/* memory the runtime takes on every GPU before the model does, by default a measured-typical
	 * CUDA context, the 32 MiB cuBLAS workspace Hopper wants and NCCL's channel buffers */
	double cuda_context_bytes, cublas_workspace_bytes, nccl_buffers_bytes;
} ClusterSpec;

/* The catalog: a NULL-name-terminated array. */
extern const GpuSpec cluster_gpu_catalog[];

/* Find a GPU by name, case-insensitively ("h100-sxm", "A100-80GB"); NULL when unknown. */
const GpuSpec *cluster_find_gpu(const char *name);

/* Read {"gpu": NAME, "nodes": N, "gpus_per_node": G, <any GpuSpec field by its JSON key>}. */
int cluster_parse(const JsonObj *o, ClusterSpec *c, PxNotes *notes, PxError *err);

static inline long long cluster_world(const ClusterSpec *c) { return c->nodes * c->gpus_per_node; }

#endif

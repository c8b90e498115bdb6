#include "cluster.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

#define GiB (1024.0 * 1024.0 * 1024.0)
#define MiB (1024.0 * 1024.0)
#define TB 1e12

/* Vendor data sheets (dense peaks, no sparsity) and the DGX/HGX reference nodes. Device memory is
 * what nvidia-smi reports (H100: 81559 MiB, modal-labs/modal-client PR #2797; H200: 143771 MiB as
 * measured on the project's GPU machine, shared/reference/hardware.md); the V100's and A100's are
 * their data sheets' 32, 40 and 80 GiB. Network: one HDR (200 Gb/s) or NDR (400 Gb/s) port per GPU
 * on DGX A100/H100; DGX-1 V100 has 4 EDR ports for 8 GPUs.
 *
 * Usable memory is what PyTorch reports as the device's total (get_device_properties().
 * total_memory, the "total capacity" of its out-of-memory message): each figure's source follows
 * it. torch prints GiB with two decimals, so such a figure is good to +-0.005 GiB (5 MiB). */
#define H100_DRIVER_KEEPS (81559 * MiB - 79.11 * GiB) /* 550.4 MiB: nvidia-smi's total less torch's */

static const char USABLE_V100_32[] =
	"torch's out-of-memory message on V100 32GB: \"31.75 GiB total capacity\" "
	"(github.com/uni-medical/SAM-Med3D/issues/8; github.com/hiyouga/LlamaFactory/issues/182)";
static const char USABLE_A100_40[] =
	"deviceQuery on A100-SXM4-40GB: \"40339 MBytes (42298834944 bytes)\", the totalGlobalMem "
	"torch reports (github.com/bottlerocket-os/bottlerocket/pull/3873)";
static const char USABLE_A100_80[] =
	"torch's out-of-memory message on A100 80GB: \"79.25 GiB total capacity\" "
	"(github.com/levihsu/OOTDiffusion/issues/235; github.com/wbfwonderful/Vad-R1/issues/11); "
	"another A100 80GB shows 79.35 GiB (github.com/Instruction-Tuning-with-GPT-4/GPT-4-LLM/"
	"issues/16): the lower is taken";
static const char USABLE_H100_SXM[] =
	"torch's out-of-memory message on H100 80GB: \"total capacity of 79.11 GiB\" "
	"(github.com/vllm-project/vllm/issues/27508)";
static const char USABLE_H100_PCIE[] =
	"no published figure found: derived, nvidia-smi's 81559 MiB less the 550.4 MiB the driver "
	"keeps on the H100 SXM (81559 MiB against torch's 79.11 GiB, vllm issue #27508)";
static const char USABLE_H200[] =
	"no published figure found: derived, nvidia-smi's 143771 MiB (measured on the project's "
	"H200) less the 550.4 MiB the driver keeps on the H100 SXM (81559 MiB against torch's "
	"79.11 GiB, vllm issue #27508)";

const GpuSpec cluster_gpu_catalog[] = {
	{"V100-32GB", 32768 * MiB, 15.7, 0, 125, 0, 0, 900, 300, 6.25, 16, 512 * GiB, 7.68 * TB, 6,
	 "DGX-1 (V100 SXM2)", 31.75 * GiB, USABLE_V100_32},
	{"A100-40GB", 40960 * MiB, 19.5, 156, 312, 312, 0, 1555, 600, 25, 32, 1024 * GiB, 15.36 * TB,
	 25, "DGX A100 320GB", 42298834944.0, USABLE_A100_40},
	{"A100-80GB", 81920 * MiB, 19.5, 156, 312, 312, 0, 2039, 600, 25, 32, 2048 * GiB, 30.72 * TB, 25,
	 "DGX A100 640GB", 79.25 * GiB, USABLE_A100_80},
	{"H100-SXM", 81559 * MiB, 67, 494, 989, 989, 1979, 3350, 900, 50, 64, 2048 * GiB, 30.72 * TB, 50,
	 "DGX H100", 79.11 * GiB, USABLE_H100_SXM},
	{"H100-PCIe", 81559 * MiB, 51, 378, 756, 756, 1513, 2000, 600, 50, 64, 1024 * GiB, 15.36 * TB, 25,
	 "HGX-style PCIe server, NVLink bridge pairs", 81559 * MiB - H100_DRIVER_KEEPS,
	 USABLE_H100_PCIE},
	{"H200", 143771 * MiB, 67, 494, 989, 989, 1979, 4800, 900, 50, 64, 2048 * GiB, 30.72 * TB, 50,
	 "HGX H200", 143771 * MiB - H100_DRIVER_KEEPS, USABLE_H200},
	{0},
};

const GpuSpec *cluster_find_gpu(const char *name)
{
	for (const GpuSpec *g = cluster_gpu_catalog; g->name; g++)
		if (!strcasecmp(g->name, name))
			return g;
	return NULL;
}

/* ---- parsing ---- */

typedef struct Field {
	const char *key;
	size_t offset; /* into GpuSpec or ClusterSpec */
	int in_cluster;
	double scale;  /* JSON unit -> stored unit */
} Field;

#define GPU_F(key, member, scale) {key, offsetof(GpuSpec, member), 0, scale}
#define CL_F(key, member, scale) {key, offsetof(ClusterSpec, member), 1, scale}

static const Field FIELDS[] = {
	GPU_F("gpu_memory_GiB", mem_bytes, GiB),
	GPU_F("gpu_usable_memory_GiB", usable_bytes, GiB),
	GPU_F("tflops_fp32", tflops_fp32, 1),
	GPU_F("tflops_tf32", tflops_tf32, 1),
	GPU_F("tflops_fp16", tflops_fp16, 1),
	GPU_F("tflops_bf16", tflops_bf16, 1),
	GPU_F("tflops_fp8", tflops_fp8, 1),
	GPU_F("hbm_GBps", hbm_GBps, 1),
	GPU_F("nvlink_GBps", nvlink_GBps, 1),
	GPU_F("network_GBps_per_gpu", network_GBps, 1),
	GPU_F("pcie_GBps", pcie_GBps, 1),
	GPU_F("cpu_memory_GiB_per_node", cpu_mem_bytes, GiB),
	GPU_F("nvme_TB_per_node", nvme_bytes, TB),
	GPU_F("nvme_GBps_per_node", nvme_GBps, 1),
	CL_F("cuda_context_MiB", cuda_context_bytes, MiB),
	CL_F("cublas_workspace_MiB", cublas_workspace_bytes, MiB),
	CL_F("nccl_buffers_MiB", nccl_buffers_bytes, MiB),
};
#define N_FIELDS (int)(sizeof(FIELDS) / sizeof(FIELDS[0]))

static int unknown_gpu(const JsonObj *o, const char *name, PxError *err)
{
	char where[512], list[512] = "";
	for (const GpuSpec *g = cluster_gpu_catalog; g->name; g++) {
		strncat(list, g->name, sizeof(list) - strlen(list) - 3);
		if (g[1].name)
			strncat(list, ", ", sizeof(list) - strlen(list) - 1);
	}
	jobj_where(o, "gpu", where, sizeof(where));
	return px_fail(err, PX_ERR_INPUT, "%s: %s.gpu: unknown GPU \"%s\"; expected one of %s", where,
		       o->name, name, list);
}

int cluster_parse(const JsonObj *o, ClusterSpec *c, PxNotes *notes, PxError *err)
{
	static const char *known[N_FIELDS + 4] = {"gpu", "nodes", "gpus_per_node"};
	const char *name;

	for (int i = 0; i < N_FIELDS; i++)
		known[3 + i] = FIELDS[i].key;
	if (jobj_check_keys(o, known, notes))
		return px_fail(err, PX_ERR_RUNTIME, "out of memory");

	memset(c, 0, sizeof(*c));
	if (jobj_str(o, "gpu", NULL, &name, err) < 0)
		return -1;
	if (!name)
		return px_fail(err, PX_ERR_INPUT, "%s: %s.gpu: missing; expected a GPU name such as "
			       "\"H100-SXM\"", o->doc->path, o->name);
	const GpuSpec *g = cluster_find_gpu(name);
	if (!g)
		return unknown_gpu(o, name, err);
	c->gpu = *g;
	if (jobj_int(o, "nodes", 1, 1 << 20, 1, &c->nodes, err) < 0 ||
	    jobj_int(o, "gpus_per_node", 1, 64, 8, &c->gpus_per_node, err) < 0)
		return -1;

	long long world = c->nodes * c->gpus_per_node;
	c->cuda_context_bytes = 450 * MiB;
	c->cublas_workspace_bytes = 32 * MiB;
	c->nccl_buffers_bytes = world > 1 ? 128 * MiB : 0;

	int set_mem = 0, set_usable = 0;
	for (int i = 0; i < N_FIELDS; i++) {
		const Field *f = &FIELDS[i];
		double *dst = (double *)((char *)(f->in_cluster ? (void *)c : (void *)&c->gpu) + f->offset);
		double v;
		int rc = jobj_num(o, f->key, 0, 1e9, *dst / f->scale, &v, err);
		if (rc < 0)
			return -1;
		if (rc == 1) { /* only what the user wrote: x / s * s need not round-trip exactly */
			*dst = v * f->scale;
			set_mem |= dst == &c->gpu.mem_bytes;
			set_usable |= dst == &c->gpu.usable_bytes;
		}
	}
	if (c->gpu.mem_bytes <= 0)
		return px_fail(err, PX_ERR_INPUT, "%s: %s.gpu_memory_GiB: expected a positive number",
			       o->doc->path, o->name);
	if (set_usable) {
		c->gpu.usable_source = "the scenario's cluster.gpu_usable_memory_GiB";
	} else if (set_mem) { /* a memory of the user's own: all of it usable unless they say */
		c->gpu.usable_bytes = c->gpu.mem_bytes;
		c->gpu.usable_source = "the scenario's cluster.gpu_memory_GiB, taken as usable "
				       "(cluster.gpu_usable_memory_GiB sets it apart)";
	}
	if (c->gpu.usable_bytes <= 0 || c->gpu.usable_bytes > c->gpu.mem_bytes) {
		char where[512];
		jobj_where(o, set_usable ? "gpu_usable_memory_GiB" : "gpu_memory_GiB", where,
			   sizeof(where));
		return px_fail(err, PX_ERR_INPUT, "%s: %s.gpu_usable_memory_GiB: expected a positive "
			       "number at most gpu_memory_GiB (%.4g), got %.4g", where, o->name,
			       c->gpu.mem_bytes / GiB, c->gpu.usable_bytes / GiB);
	}
	return 0;
}

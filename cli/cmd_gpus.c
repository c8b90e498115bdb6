/* parallax gpus: the built-in GPU catalog, as a table or JSON. */
#include <getopt.h>
#include <stdio.h>

#include "../engine/cluster.h"
#include "commands.h"

static const char USAGE[] =
	"usage: parallax gpus [--json]\n"
	"\n"
	"List the built-in GPU catalog: memory (listed, and usable: what PyTorch reports as the\n"
	"device's total, with its source), dense peak TFLOP/s per type, memory, NVLink,\n"
	"network and PCIe bandwidth, and the reference node's host memory and NVMe. Any field can\n"
	"be overridden in a scenario's cluster object (see README, \"cluster\").\n"
	"\n"
	"  --json       one JSON object per GPU, in an array\n"
	"  -h, --help   this help\n"
	"Exit status: 0 ok, 2 bad usage.\n";

/* g's usable-memory source as a JSON string's content (its quotes escaped) in buf. */
static const char *usable_source_json(const GpuSpec *g, char *buf, size_t n)
{
	size_t k = 0;
	for (const char *c = g->usable_source; *c && k + 2 < n; c++) {
		if (*c == '"' || *c == '\\')
			buf[k++] = '\\';
		buf[k++] = *c;
	}
	buf[k] = '\0';
	return buf;
}

int cmd_gpus(int argc, char **argv)
{
	char src[1024];
	static const struct option longs[] = {{"json", no_argument, 0, 'j'},
					       {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
	int json = 0, c;
	optind = 1;
	while ((c = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
		if (c == 'j')
			json = 1;
		else if (c == 'h')
			return fputs(USAGE, stdout), 0;
		else
			return fputs(USAGE, stderr), 2;
	}
	const double GiB = 1024.0 * 1024.0 * 1024.0;
	if (!json)
		printf("%-10s %8s %10s %7s %7s %7s %7s %7s %8s %7s %7s %6s %9s %8s\n", "gpu", "mem_GiB",
		       "usable_GiB",
		       "fp32", "tf32", "fp16", "bf16", "fp8", "hbm_GBps", "nvlink", "net/gpu", "pcie",
		       "cpu_GiB", "nvme_TB");
	else
		printf("[\n");
	for (const GpuSpec *g = cluster_gpu_catalog; g->name; g++) {
		if (json)
			printf("  {\"gpu\": \"%s\", \"gpu_memory_GiB\": %.4f, \"gpu_usable_memory_GiB\": "
			       "%.4f, \"gpu_usable_memory_source\": \"%s\", \"tflops_fp32\": %g, "
			       "\"tflops_tf32\": %g, \"tflops_fp16\": %g, \"tflops_bf16\": %g, "
			       "\"tflops_fp8\": %g, \"hbm_GBps\": %g, \"nvlink_GBps\": %g, "
			       "\"network_GBps_per_gpu\": %g, \"pcie_GBps\": %g, "
			       "\"cpu_memory_GiB_per_node\": %g, \"nvme_TB_per_node\": %g, "
			       "\"node\": \"%s\"}%s\n", g->name, g->mem_bytes / GiB,
			       g->usable_bytes / GiB, usable_source_json(g, src, sizeof(src)),
			       g->tflops_fp32,
			       g->tflops_tf32, g->tflops_fp16, g->tflops_bf16, g->tflops_fp8,
			       g->hbm_GBps, g->nvlink_GBps, g->network_GBps, g->pcie_GBps,
			       g->cpu_mem_bytes / GiB, g->nvme_bytes / 1e12, g->node,
			       g[1].name ? "," : "");
		else
			printf("%-10s %8.2f %10.2f %7g %7g %7g %7g %7g %8g %7g %7g %6g %9g %8g\n", g->name,
			       g->mem_bytes / GiB, g->usable_bytes / GiB, g->tflops_fp32, g->tflops_tf32, g->tflops_fp16,
			       g->tflops_bf16, g->tflops_fp8, g->hbm_GBps, g->nvlink_GBps,
			       g->network_GBps, g->pcie_GBps, g->cpu_mem_bytes / GiB, g->nvme_bytes / 1e12);
	}
	if (json)
		printf("]\n");
	else
	{
		printf("# TFLOP/s dense peaks; bandwidths GB/s (NVLink both directions together); "
		       "cpu and nvme per node of the reference system\n");
		printf("# usable: what PyTorch reports as the device's total (the fit checks use it):\n");
		for (const GpuSpec *g = cluster_gpu_catalog; g->name; g++)
			printf("#   %s: %s\n", g->name, g->usable_source);
	}
	return 0;
}

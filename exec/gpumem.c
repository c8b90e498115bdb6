#include "gpumem.h"

#include <dlfcn.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- NVML's few types, declared here: the driver ships the library, not the header ----
 * From the NVML API reference: functions return nvmlReturn_t, 0 on success; a device is an
 * opaque pointer; nvmlProcessInfo_t is the layout of the _v2 and _v3 process queries. */
typedef int nvmlReturn_t;
typedef struct nvmlDevice_st *nvmlDevice_t;
typedef struct {
	unsigned long long total, free, used;
} nvmlMemory_t;
typedef struct {
	unsigned int pid;
	unsigned long long usedGpuMemory;
	unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;
enum { NVML_SUCCESS = 0, NVML_ERROR_INSUFFICIENT_SIZE = 7 };
#define NVML_VALUE_NOT_AVAILABLE (~0ULL)

struct GpuNvml {
	void *lib;
	nvmlReturn_t (*init)(void);
	nvmlReturn_t (*shutdown)(void);
	const char *(*error_string)(nvmlReturn_t);
	nvmlReturn_t (*by_index)(unsigned int, nvmlDevice_t *);
	nvmlReturn_t (*by_bus_id)(const char *, nvmlDevice_t *);
	nvmlReturn_t (*memory)(nvmlDevice_t, nvmlMemory_t *);
	nvmlReturn_t (*processes)(nvmlDevice_t, unsigned int *, nvmlProcessInfo_t *);
};

/* Fill why (which may be NULL) with a printf-style reason; always returns -1. */
static int say_why(char *why, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int say_why(char *why, size_t n, const char *fmt, ...)
{
	if (why && n) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(why, n, fmt, ap);
		va_end(ap);
	}
	return -1;
}

/* ---- loading ---- */

/* The first of names that the library exports, or NULL. */
static void *sym_any(void *lib, const char *a, const char *b)
{
	void *s = dlsym(lib, a);
	return s || !b ? s : dlsym(lib, b);
}

static int nvml_bind(GpuNvml *n, char *why, size_t why_bytes)
{
	/* function pointers from dlsym: POSIX guarantees the conversion, ISO C does not */
	*(void **)&n->init = sym_any(n->lib, "nvmlInit_v2", NULL);
	*(void **)&n->shutdown = sym_any(n->lib, "nvmlShutdown", NULL);
	*(void **)&n->error_string = sym_any(n->lib, "nvmlErrorString", NULL);
	*(void **)&n->by_index = sym_any(n->lib, "nvmlDeviceGetHandleByIndex_v2", NULL);
	*(void **)&n->by_bus_id = sym_any(n->lib, "nvmlDeviceGetHandleByPciBusId_v2", NULL);
	*(void **)&n->memory = sym_any(n->lib, "nvmlDeviceGetMemoryInfo", NULL);
	/* _v3 and _v2 share nvmlProcessInfo_t; the unversioned v1 has a shorter struct */
	*(void **)&n->processes = sym_any(n->lib, "nvmlDeviceGetComputeRunningProcesses_v3",
					  "nvmlDeviceGetComputeRunningProcesses_v2");
	if (n->init && n->shutdown && n->error_string && n->by_index && n->by_bus_id &&
	    n->memory && n->processes)
		return 0;
	return say_why(why, why_bytes,
		       "not available: the loaded libnvidia-ml lacks an NVML entry point this code "
		       "uses (driver too old?)");
}

GpuNvml *gpumem_nvml_open(const char *path, char *why, size_t why_bytes)
{
	if (!path)
		path = "libnvidia-ml.so.1";
	GpuNvml *n = calloc(1, sizeof(*n));
	if (!n) {
		say_why(why, why_bytes, "not available: out of memory");
		return NULL;
	}
	n->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!n->lib) {
		const char *e = dlerror();
		say_why(why, why_bytes, "not available: cannot load NVML (%s): %s", path,
			e ? e : "unknown error");
		free(n);
		return NULL;
	}
	if (nvml_bind(n, why, why_bytes))
		goto out_close;
	nvmlReturn_t rc = n->init();
	if (rc != NVML_SUCCESS) {
		say_why(why, why_bytes, "not available: nvmlInit_v2: %s", n->error_string(rc));
		goto out_close;
	}
	return n;
out_close:
	dlclose(n->lib);
	free(n);
	return NULL;
}

void gpumem_nvml_close(GpuNvml *n)
{
	if (!n)
		return;
	n->shutdown();
	dlclose(n->lib);
	free(n);
}

/* ---- queries ---- */

static int nvml_device(GpuNvml *n, const char *bus_id, unsigned index, nvmlDevice_t *dev,
		       char *why, size_t why_bytes)
{
	nvmlReturn_t rc = bus_id && *bus_id ? n->by_bus_id(bus_id, dev) : n->by_index(index, dev);
	if (rc == NVML_SUCCESS)
		return 0;
	return say_why(why, why_bytes, "not available: NVML has no device %s: %s",
		       bus_id && *bus_id ? bus_id : "at this index", n->error_string(rc));
}

int gpumem_nvml_device_used(GpuNvml *n, const char *bus_id, unsigned index, int64_t *used,
			    int64_t *total, char *why, size_t why_bytes)
{
	nvmlDevice_t dev;
	nvmlMemory_t m;
	if (!n)
		return say_why(why, why_bytes, "not available: NVML is not loaded");
	if (nvml_device(n, bus_id, index, &dev, why, why_bytes))
		return -1;
	nvmlReturn_t rc = n->memory(dev, &m);
	if (rc != NVML_SUCCESS) {
		return say_why(why, why_bytes, "not available: nvmlDeviceGetMemoryInfo: %s",
			       n->error_string(rc));
	}
	*used = (int64_t)m.used;
	*total = (int64_t)m.total;
	return 0;
}

/* The device's compute processes into a malloc'ed array (*count of them); NULL with why. The
 * list can grow between the size query and the fetch, so it is asked again until it fits. */
static nvmlProcessInfo_t *nvml_processes(GpuNvml *n, nvmlDevice_t dev, unsigned *count,
					 char *why, size_t why_bytes)
{
	unsigned cap = 64;
	for (int tries = 0; tries < 4; tries++, cap *= 4) {
		nvmlProcessInfo_t *p = calloc(cap, sizeof(*p));
		if (!p)
			break;
		*count = cap;
		nvmlReturn_t rc = n->processes(dev, count, p);
		if (rc == NVML_SUCCESS)
			return p;
		free(p);
		if (rc != NVML_ERROR_INSUFFICIENT_SIZE) {
			say_why(why, why_bytes,
				"not available: nvmlDeviceGetComputeRunningProcesses: %s",
				n->error_string(rc));
			return NULL;
		}
	}
	say_why(why, why_bytes, "not available: the device's process list did not fit in memory");
	return NULL;
}

int gpumem_nvml_process_bytes(GpuNvml *n, const char *bus_id, unsigned index, unsigned pid,
			      int64_t *bytes, char *why, size_t why_bytes)
{
	nvmlDevice_t dev;
	unsigned count = 0;
	if (!n)
		return say_why(why, why_bytes, "not available: NVML is not loaded");
	if (nvml_device(n, bus_id, index, &dev, why, why_bytes))
		return -1;
	nvmlProcessInfo_t *p = nvml_processes(n, dev, &count, why, why_bytes);
	if (!p)
		return -1;
	unsigned i = 0;
	while (i < count && p[i].pid != pid)
		i++;
	int rc = 0;
	if (i == count)
		rc = say_why(why, why_bytes,
			     "not available: this process (pid %u) is not among the device's %u "
			     "compute processes (no CUDA context yet, or a container's PID namespace)",
			     pid, count);
	else if (p[i].usedGpuMemory == NVML_VALUE_NOT_AVAILABLE)
		rc = say_why(why, why_bytes,
			     "not available: NVML lists this process but reports no memory figure");
	else
		*bytes = (int64_t)p[i].usedGpuMemory;
	free(p);
	return rc;
}

/* ---- snapshots ---- */

void gpumem_init(GpuMem *g, int device, const char *nvml_path)
{
	memset(g, 0, sizeof(*g));
	g->device = device;
	char why[GPUMEM_WHY_BYTES];
	if (gpumem_cuda_bus_id(device, g->bus_id, sizeof(g->bus_id), why, sizeof(why)))
		g->bus_id[0] = '\0'; /* NVML then falls back to the index, right unless remapped */
	g->nvml = gpumem_nvml_open(nvml_path, g->nvml_why, sizeof(g->nvml_why));
	snprintf(g->peak.label, sizeof(g->peak.label), "peak");
	snprintf(g->peak.device_why, sizeof(g->peak.device_why), "not available: not sampled");
	snprintf(g->peak.process_why, sizeof(g->peak.process_why), "not available: not sampled");
}

void gpumem_free(GpuMem *g)
{
	if (!g)
		return;
	gpumem_nvml_close(g->nvml);
	g->nvml = NULL;
}

static void read_device(GpuMem *g, GpuMemSnap *s)
{
	int64_t free_b = 0, total_b = 0, used_b = 0;
	if (!g->context) {
		s->device_ok = !gpumem_nvml_device_used(g->nvml, g->bus_id, (unsigned)g->device,
						       &used_b, &total_b, s->device_why,
						       sizeof(s->device_why));
		free_b = total_b - used_b;
	} else {
		s->device_ok = !gpumem_cuda_info(&free_b, &total_b, s->device_why,
						 sizeof(s->device_why));
		used_b = total_b - free_b;
	}
	if (!s->device_ok && !g->nvml && !g->context)
		snprintf(s->device_why, sizeof(s->device_why), "%s", g->nvml_why);
	s->free_bytes = free_b;
	s->total_bytes = total_b;
	s->used_bytes = used_b;
}

static void read_process(GpuMem *g, GpuMemSnap *s)
{
	if (!g->nvml) {
		snprintf(s->process_why, sizeof(s->process_why), "%s", g->nvml_why);
		s->process_ok = 0;
		return;
	}
	s->process_ok = !gpumem_nvml_process_bytes(g->nvml, g->bus_id, (unsigned)g->device,
						   (unsigned)getpid(), &s->process_bytes,
						   s->process_why, sizeof(s->process_why));
}

const GpuMemSnap *gpumem_snapshot(GpuMem *g, const char *label)
{
	if (g->n_snaps >= GPUMEM_MAX_SNAPS)
		return NULL;
	GpuMemSnap *s = &g->snaps[g->n_snaps++];
	memset(s, 0, sizeof(*s));
	snprintf(s->label, sizeof(s->label), "%s", label);
	read_device(g, s);
	read_process(g, s);
	return s;
}

void gpumem_sample(GpuMem *g)
{
	GpuMemSnap s = {0};
	snprintf(s.label, sizeof(s.label), "peak");
	read_device(g, &s);
	if (g->peak.device_ok && (!s.device_ok || s.used_bytes <= g->peak.used_bytes))
		return;
	read_process(g, &s); /* the process's share at the moment of the device's peak */
	g->peak = s;
}

const GpuMemSnap *gpumem_context(GpuMem *g)
{
	char why[GPUMEM_WHY_BYTES];
	if (gpumem_cuda_context(g->device, why, sizeof(why)) == 0)
		g->context = 1;
	const GpuMemSnap *s = gpumem_snapshot(g, "context");
	if (s && !g->context)
		snprintf(g->snaps[g->n_snaps - 1].device_why, GPUMEM_WHY_BYTES, "%s", why);
	return s;
}

double gpumem_grown(const GpuMemSnap *a, const GpuMemSnap *b)
{
	if (b->process_ok)
		return (double)(b->process_bytes - (a->process_ok ? a->process_bytes : 0));
	if (a->device_ok && b->device_ok)
		return (double)(b->used_bytes - a->used_bytes);
	return -1;
}

/* ---- output ---- */

static void print_row(const GpuMemSnap *s, FILE *f)
{
	const double mib = 1024.0 * 1024.0;
	fprintf(f, "%-10s", s->label);
	if (s->device_ok)
		fprintf(f, " %12.1f %12.1f", (double)s->used_bytes / mib,
			(double)s->total_bytes / mib);
	else
		fprintf(f, " %12s %12s", "-", "-");
	if (s->process_ok)
		fprintf(f, " %14.1f\n", (double)s->process_bytes / mib);
	else
		fprintf(f, " %14s\n", "-");
}

/* Each distinct reason for a missing reading once, as a footer. */
static void print_reasons(const GpuMem *g, FILE *f)
{
	const char *seen[2 * GPUMEM_MAX_SNAPS + 2];
	int n_seen = 0;
	for (int i = 0; i <= g->n_snaps; i++) {
		const GpuMemSnap *s = i < g->n_snaps ? &g->snaps[i] : &g->peak;
		const char *why[2] = {s->device_ok ? NULL : s->device_why,
				      s->process_ok ? NULL : s->process_why};
		for (int k = 0; k < 2; k++) {
			int dup = !why[k];
			for (int j = 0; j < n_seen && !dup; j++)
				dup = !strcmp(seen[j], why[k]);
			if (dup)
				continue;
			seen[n_seen++] = why[k];
			fprintf(f, "# %s %s: %s\n", s->label, k ? "process" : "device", why[k]);
		}
	}
}

void gpumem_print(const GpuMem *g, FILE *f)
{
	fprintf(f, "# GPU memory of device %d (PCI %s)\n", g->device,
		g->bus_id[0] ? g->bus_id : "unknown");
	fprintf(f, "%-10s %12s %12s %14s\n", "moment", "used_MiB", "total_MiB", "process_MiB");
	for (int i = 0; i < g->n_snaps; i++)
		print_row(&g->snaps[i], f);
	print_row(&g->peak, f);
	print_reasons(g, f);
}

/* ---- without CUDA: every device reading is missing, for one reason ---- */

#ifndef PX_HAVE_CUDA
static int no_cuda(char *why, size_t why_bytes)
{
	return say_why(why, why_bytes, "not available: this build has no CUDA");
}

int gpumem_device_count(char *why, size_t why_bytes)
{
	no_cuda(why, why_bytes);
	return 0;
}

int gpumem_cuda_info(int64_t *free_bytes, int64_t *total_bytes, char *why, size_t why_bytes)
{
	*free_bytes = *total_bytes = 0;
	return no_cuda(why, why_bytes);
}

int gpumem_cuda_bus_id(int device, char *bus_id, size_t bus_bytes, char *why, size_t why_bytes)
{
	(void)device;
	if (bus_bytes)
		bus_id[0] = '\0';
	return no_cuda(why, why_bytes);
}

int gpumem_cuda_context(int device, char *why, size_t why_bytes)
{
	(void)device;
	return no_cuda(why, why_bytes);
}
#endif

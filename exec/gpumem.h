/* gpumem: what the GPU's memory holds at the moments the issue names (start-up, after the CUDA
 * context, after cuBLAS, after NCCL, at the peak), from the device's side (cudaMemGetInfo: used =
 * total - free, everyone's) and this process's (NVML, loaded at run time with dlopen; no header
 * or link-time dependency). Owns the NVML loader and the snapshot log; the tracking allocator's
 * categories are the executor's. Every reading degrades to "not available: <reason>", never a
 * crash, on machines without a GPU, a driver or NVML. */
#ifndef PX_EXEC_GPUMEM_H
#define PX_EXEC_GPUMEM_H

#include <stdint.h>
#include <stdio.h>

/* ---- NVML, loaded at run time ---- */

typedef struct GpuNvml GpuNvml; /* opaque: the library's handle and the entry points used */

/* Load NVML from path (NULL: "libnvidia-ml.so.1") and initialise it. Returns the loader, owned by
 * the caller until gpumem_nvml_close, or NULL with why ("not available: <reason>") filled. */
GpuNvml *gpumem_nvml_open(const char *path, char *why, size_t why_bytes);
void gpumem_nvml_close(GpuNvml *n); /* NULL is fine */

/* Device memory in use by process pid on the GPU whose PCI bus id is bus_id ("0000:3B:00.0", as
 * cudaDeviceGetPCIBusId gives it), or NVML's device index when bus_id is NULL. Returns 0 with
 * *bytes, or -1 with why: no such device, pid not among its compute processes (a container's PID
 * namespace hides host pids), or no figure reported. */
int gpumem_nvml_process_bytes(GpuNvml *n, const char *bus_id, unsigned index, unsigned pid,
			      int64_t *bytes, char *why, size_t why_bytes);

/* The whole device's used memory as NVML sees it, without creating a CUDA context. */
int gpumem_nvml_device_used(GpuNvml *n, const char *bus_id, unsigned index, int64_t *used,
			    int64_t *total, char *why, size_t why_bytes);

/* ---- snapshots ---- */

enum { GPUMEM_MAX_SNAPS = 16, GPUMEM_WHY_BYTES = 160 };

typedef struct GpuMemSnap {
	char label[32];     /* "start-up", "context", "cublas", "nccl", "peak" */
	int device_ok;      /* the three device fields hold a reading */
	int64_t total_bytes, free_bytes, used_bytes; /* the device's: used = total - free */
	char device_why[GPUMEM_WHY_BYTES];           /* "not available: ..." when !device_ok */
	int process_ok;
	int64_t process_bytes;                       /* this process's, from NVML */
	char process_why[GPUMEM_WHY_BYTES];
} GpuMemSnap;

/* One rank's readings on one device. gpumem_init then gpumem_free; snaps[0..n_snaps-1] in the
 * order taken; peak is the highest device reading of gpumem_sample (label "peak"). */
typedef struct GpuMem {
	int device;            /* CUDA ordinal */
	char bus_id[32];       /* its PCI bus id, "" when unknown */
	GpuNvml *nvml;         /* NULL when NVML is not available; nvml_why says why */
	char nvml_why[GPUMEM_WHY_BYTES];
	GpuMemSnap snaps[GPUMEM_MAX_SNAPS];
	int n_snaps;
	GpuMemSnap peak;
	int context;           /* gpumem_context ran: device readings come from cudaMemGetInfo */
} GpuMem;

/* Set up readings of CUDA device `device`: its bus id and NVML (nvml_path NULL: the default
 * library). Creates no CUDA context. Never fails: what is missing is recorded as its reason. */
void gpumem_init(GpuMem *g, int device, const char *nvml_path);
void gpumem_free(GpuMem *g);

/* Take a labelled snapshot and append it (the oldest are kept when the log is full). Before
 * gpumem_context the device is read through NVML, so that "start-up" does not create the context
 * it is meant to precede; afterwards through cudaMemGetInfo. Returns the snapshot (owned by g),
 * or NULL when the log is full. */
const GpuMemSnap *gpumem_snapshot(GpuMem *g, const char *label);

/* Update the peak with a cudaMemGetInfo reading now: the peak is the highest of the readings
 * taken, so the executor samples where its schedule says memory is highest. */
void gpumem_sample(GpuMem *g);

/* Create the CUDA context on g's device (cudaFree(0)) and snapshot "context". */
const GpuMemSnap *gpumem_context(GpuMem *g);

/* What memory grew by from snapshot a to b: this process's (NVML) where b has that reading (a's
 * missing counting as 0), else the device's used memory where both have it; -1 when neither. */
double gpumem_grown(const GpuMemSnap *a, const GpuMemSnap *b);

/* The snapshots as a table with a header in MiB, and the peak; lines of metadata start with '#'. */
void gpumem_print(const GpuMem *g, FILE *f);

/* ---- the device side, one call each (gpumem_cuda.c; "not available" without CUDA) ---- */

/* CUDA devices visible to this process; 0 with why when there are none or no driver. */
int gpumem_device_count(char *why, size_t why_bytes);
/* cudaMemGetInfo on the current device: 0, or -1 with why. */
int gpumem_cuda_info(int64_t *free_bytes, int64_t *total_bytes, char *why, size_t why_bytes);
/* cudaDeviceGetPCIBusId; 0, or -1 with why. */
int gpumem_cuda_bus_id(int device, char *bus_id, size_t bus_bytes, char *why, size_t why_bytes);
/* cudaSetDevice + cudaFree(0); 0, or -1 with why. */
int gpumem_cuda_context(int device, char *why, size_t why_bytes);

#endif

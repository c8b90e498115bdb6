/* gpumem's device side: the CUDA runtime calls behind gpumem.h, each turning a CUDA error into
 * "not available: <call>: <CUDA's string>". Built only where CUDA is; gpumem.c stands in
 * elsewhere. */
#include "gpumem.h"

#include <cuda_runtime_api.h>

static int cuda_why(cudaError_t rc, const char *call, char *why, size_t why_bytes)
{
	if (why && why_bytes)
		snprintf(why, why_bytes, "not available: %s: %s", call, cudaGetErrorString(rc));
	return -1;
}

int gpumem_device_count(char *why, size_t why_bytes)
{
	int n = 0;
	cudaError_t rc = cudaGetDeviceCount(&n);
	if (rc != cudaSuccess) {
		cuda_why(rc, "cudaGetDeviceCount", why, why_bytes);
		return 0;
	}
	if (n == 0 && why && why_bytes)
		snprintf(why, why_bytes, "not available: no CUDA device");
	return n;
}

int gpumem_cuda_info(int64_t *free_bytes, int64_t *total_bytes, char *why, size_t why_bytes)
{
	size_t f = 0, t = 0;
	cudaError_t rc = cudaMemGetInfo(&f, &t);
	*free_bytes = (int64_t)f;
	*total_bytes = (int64_t)t;
	return rc == cudaSuccess ? 0 : cuda_why(rc, "cudaMemGetInfo", why, why_bytes);
}

int gpumem_cuda_bus_id(int device, char *bus_id, size_t bus_bytes, char *why, size_t why_bytes)
{
	/* a device attribute: answered without creating a context */
	cudaError_t rc = cudaDeviceGetPCIBusId(bus_id, (int)bus_bytes, device);
	if (rc == cudaSuccess)
		return 0;
	if (bus_bytes)
		bus_id[0] = '\0';
	return cuda_why(rc, "cudaDeviceGetPCIBusId", why, why_bytes);
}

int gpumem_cuda_context(int device, char *why, size_t why_bytes)
{
	cudaError_t rc = cudaSetDevice(device);
	if (rc != cudaSuccess)
		return cuda_why(rc, "cudaSetDevice", why, why_bytes);
	/* freeing nothing is the customary way to make the runtime create its context now */
	rc = cudaFree(0);
	return rc == cudaSuccess ? 0 : cuda_why(rc, "cudaFree(0)", why, why_bytes);
}

/* cublas_load: see cublas_load.cuh. */
#include <dlfcn.h>
#include <pthread.h>

#include "cublas_load.cuh"
#include "cuda_check.h"

#define PX_STR_(x) #x
#define PX_STR(x) PX_STR_(x)
#define CUBLAS_SONAME "libcublas.so." PX_STR(CUBLAS_VER_MAJOR)

static CublasApi api;
static pthread_once_t api_once = PTHREAD_ONCE_INIT;

/* dlsym into the table's slot, typed as the slot; fatal when missing */
template <typename F> static void resolve(void *lib, F *slot, const char *name)
{
	void *p = dlsym(lib, name);
	CUDA_REQUIRE(p, "cuBLAS: %s has no %s (%s): built against cuBLAS %d", CUBLAS_SONAME, name,
		     dlerror(), CUBLAS_VER_MAJOR);
	*slot = reinterpret_cast<F>(p);
}

static void api_load(void)
{
	/* RTLD_LOCAL: cuBLAS's symbols stay out of the global scope, only the table reaches them */
	void *lib = dlopen(CUBLAS_SONAME, RTLD_NOW | RTLD_LOCAL);
	CUDA_REQUIRE(lib, "cuBLAS: cannot open %s (%s); install CUDA's cuBLAS %d or put its "
		     "folder on LD_LIBRARY_PATH", CUBLAS_SONAME, dlerror(), CUBLAS_VER_MAJOR);
	resolve(lib, &api.create, "cublasCreate_v2");
	resolve(lib, &api.destroy, "cublasDestroy_v2");
	resolve(lib, &api.set_stream, "cublasSetStream_v2");
	resolve(lib, &api.set_workspace, "cublasSetWorkspace_v2");
	resolve(lib, &api.set_math_mode, "cublasSetMathMode");
	resolve(lib, &api.status_name, "cublasGetStatusName");
	resolve(lib, &api.status_string, "cublasGetStatusString");
	resolve(lib, &api.gemm_ex, "cublasGemmEx");
	resolve(lib, &api.gemm_strided_batched_ex, "cublasGemmStridedBatchedEx");
	/* the library stays open for the process's life */
}

const CublasApi *cublas_api(void)
{
	pthread_once(&api_once, api_load);
	return &api;
}

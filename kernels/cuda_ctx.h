/* cuda_ctx: the one GPU a process computes on: device selection, the compute stream, the cuBLAS
 * handle with its explicitly sized workspace, a few device scalars for reductions that end on the
 * host, and device-memory helpers. It owns no model memory and launches no kernels of its own
 * (ops_cuda, gemm_cuda and optim_cuda do). The header is plain C without CUDA's headers, so C code
 * (the executor, the tests) can hold a context; the struct is defined in cuda_check.h. */
#ifndef PX_CUDA_CTX_H
#define PX_CUDA_CTX_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct CudaCtx CudaCtx;

/* Element types of device buffers: fp32, bf16 and IEEE fp16 (16-bit ones as precision.h's bits). */
typedef enum CudaDtype { CDT_F32, CDT_BF16, CDT_F16 } CudaDtype;

/* Bytes of one element of type t */
static inline size_t cuda_dtype_bytes(CudaDtype t)
{
	return t == CDT_F32 ? 4 : 2;
}

/* cuBLAS workspace: 32 MiB, what NVIDIA recommends for Hopper, and what engine/cluster.c charges
 * (cublas_workspace_bytes). Set explicitly so cuBLAS does not size it behind the model's back. */
#define CUDA_CTX_WORKSPACE_BYTES ((size_t)32 << 20)

/* 1 when cudaGetDeviceCount reports at least one device; else 0, and when reason is not NULL it
 * gets a line saying why ("cudaGetDeviceCount: CUDA driver version is insufficient ..."). Safe to
 * call without a GPU or driver: creates no context and leaks nothing. */
int cuda_ctx_available(char *reason, size_t reason_len);

/* cuBLAS's own name for a status value ("CUBLAS_STATUS_INVALID_VALUE" for 7). Opens cuBLAS, which
 * is loaded on first use rather than linked (kernels/cublas_load.cuh), and needs no device: a
 * check that the library is there and its entry points resolve. Fatal when it cannot be opened. */
const char *cuda_ctx_blas_status_name(int status);

/* Who this process is in a job ("rank 3 of 8"), printed before every fatal CUDA, cuBLAS or shape
 * message of kernels/ so that a multi-rank run's log says which rank failed; NULL or "" for none
 * (the default). The text is copied. */
void cuda_set_who(const char *who);

/* Select device (0-based, < the device count), create the compute stream, the cuBLAS handle bound
 * to it and its workspace. Fatal (file:line and CUDA's or cuBLAS's message) on any failure: call
 * cuda_ctx_available first. Caller owns the result: cuda_ctx_destroy. */
CudaCtx *cuda_ctx_create(int device);
/* Accepts NULL. Synchronises the stream first. */
void cuda_ctx_destroy(CudaCtx *ctx);
/* Wait for everything queued on the compute stream; fatal on an asynchronous error. */
void cuda_ctx_sync(CudaCtx *ctx);
/* The compute stream (a cudaStream_t) for a caller that orders other streams against it with
 * events (the executor's communication); owned by ctx. */
void *cuda_ctx_stream(const CudaCtx *ctx);
/* The device's name ("NVIDIA H100 80GB HBM3"); points into ctx. */
const char *cuda_ctx_device_name(const CudaCtx *ctx);

/* ---- device memory ---- */

/* cudaMalloc of bytes (at least 1); fatal when out of memory, naming the size. Caller frees with
 * cuda_ctx_free, which accepts NULL. */
void *cuda_ctx_alloc(size_t bytes);
void cuda_ctx_free(void *dev);
/* Copies on the compute stream, then synchronise: simple and ordered after queued kernels. */
void cuda_ctx_upload(CudaCtx *ctx, void *dev, const void *host, size_t bytes);
void cuda_ctx_download(CudaCtx *ctx, void *host, const void *dev, size_t bytes);
/* Queue a device-to-device copy or a zero fill on the compute stream (no synchronisation). */
void cuda_ctx_copy(CudaCtx *ctx, void *dst, const void *src, size_t bytes);
void cuda_ctx_zero(CudaCtx *ctx, void *dev, size_t bytes);

#ifdef __cplusplus
}
#endif

#endif

/* par_cpu: the threads the CPU kernels split their loops over, and how many. It owns one pool of
 * worker threads and the rule every caller follows: a loop over [0, n) is cut into contiguous
 * chunks that the threads claim as they come free, and no value depends on where the cuts fall
 * or who takes a chunk (each output element is computed whole within one chunk, in the order a
 * single thread would), so these loops give bit for bit the same results at any thread count.
 * It does not decide what runs in parallel: the kernels do. The matrix products are OpenBLAS's,
 * threaded by OpenBLAS, and their last bits may depend on its thread count: they do with the
 * Haswell kernels of OpenBLAS 0.3.21 (chosen on AVX2 machines and on AMD Zen 4), whose sgemm
 * rounds a row differently by where the rows a thread covers begin; its SkylakeX kernels do not.
 *
 * The count is OpenBLAS's (openblas_get_num_threads: OPENBLAS_NUM_THREADS, else the cores this
 * process may run on), which is how the executor's thread count was chosen before this module
 * existed: the matrix products and everything around them use the same number. */
#ifndef PX_PAR_CPU_H
#define PX_PAR_CPU_H

#include <stddef.h>

/* The most threads a loop is split over. */
#define PAR_CPU_MAX_THREADS 64

/* Threads a loop may use: OpenBLAS's count, 1 to PAR_CPU_MAX_THREADS. */
int par_cpu_threads(void);
/* Sets both OpenBLAS's thread count and, through it, the kernels' (n >= 1; larger than
 * PAR_CPU_MAX_THREADS means that many). For tests and benchmarks that compare thread counts. */
void par_cpu_set_threads(int n);
/* Test hook: the loops' count apart from OpenBLAS's. n >= 1 splits them over n threads (at most
 * PAR_CPU_MAX_THREADS) whatever OpenBLAS uses for its products; 0, the default, follows
 * OpenBLAS's count again. */
void par_cpu_set_loop_threads(int n);

/* fn(ctx, begin, end) over [0, n) in chunks: with nt = par_cpu_threads(), chunk c of k is
 * [n c / k, n (c + 1) / k), k = min(PAR_CPU_CHUNKS_PER_THREAD nt, n / min_items) (at least 1), so
 * a chunk holds at least min_items items; the caller and nt - 1 workers claim chunks in order as
 * they come free, and the call returns when every chunk is done. Claiming rather than one fixed
 * range per thread keeps the caller working while a worker is late to wake or shares its core
 * with another process. k = 1 runs fn(ctx, 0, n) on the caller. A call made while another is in
 * flight (from another thread, or from inside fn) runs whole on the calling thread, which gives
 * the same results. */
#define PAR_CPU_CHUNKS_PER_THREAD 8
typedef void (*ParCpuFn)(void *ctx, size_t begin, size_t end);
void par_cpu_for(size_t n, size_t min_items, ParCpuFn fn, void *ctx);
/* Calls of par_cpu_for so far that were cut into more than one chunk and offered to the workers:
 * a test's check that the loops it compares across thread counts were really split. */
unsigned long par_cpu_split_calls(void);

/* Items per chunk below which splitting costs more than it saves, by the work an item takes:
 * waking a worker costs some microseconds, about what 16K simple float operations take. */
#define PAR_CPU_GRAIN_ELEMS ((size_t)1 << 14) /* elementwise ops: an item is one element */

/* OPENBLAS_THREAD_TIMEOUT as `parallax run` and `calibrate` set it when the user has not
 * (cli/main.c): OpenBLAS's idle threads spin 2^4 cycles, its least, before they sleep, where by
 * default they spin 2^28 (about 0.1 s) and take the cores these loops and the other ranks need.
 * OpenBLAS reads the variable once, as it loads. */
#define PAR_CPU_BLAS_TIMEOUT 4
/* OPENBLAS_THREAD_TIMEOUT as this process's OpenBLAS read it: a positive value as OpenBLAS
 * clamps it (4 to 30), else (unset, 0 or not a number) OpenBLAS's default, 28. */
#define PAR_CPU_BLAS_TIMEOUT_DEFAULT 28
int par_cpu_blas_timeout(void);

/* memset and memcpy split over the threads (byte ranges; n of any size). */
void par_cpu_memset(void *dst, int value, size_t bytes);
void par_cpu_memcpy(void *dst, const void *src, size_t bytes);

#endif

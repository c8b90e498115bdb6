/* par_cpu: the threads the CPU kernels split their loops over, and how many. It owns one pool of
 * worker threads and the rule every caller follows: a loop over [0, n) is cut into one contiguous
 * range per thread, and no value depends on where the cuts fall (each output element is computed
 * whole by one thread, in the order a single thread would), so results are bit for bit the same
 * at any thread count. It does not decide what runs in parallel: the kernels do.
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

/* fn(ctx, begin, end) over [0, n): thread i of nt takes [n i / nt, n (i + 1) / nt), the caller
 * being thread 0, with nt = min(par_cpu_threads(), n / min_items) (at least 1), so a range holds
 * at least min_items items; returns when every range is done. A call made while another is in
 * flight (from another thread, or from inside fn) runs its whole range on the calling thread,
 * which gives the same results. */
typedef void (*ParCpuFn)(void *ctx, size_t begin, size_t end);
void par_cpu_for(size_t n, size_t min_items, ParCpuFn fn, void *ctx);
/* Calls of par_cpu_for so far that ran on more than one thread: a test's check that the loops it
 * compares across thread counts were really split. */
unsigned long par_cpu_split_calls(void);

/* Items per range below which splitting costs more than it saves, by the work an item takes:
 * waking a worker costs some microseconds, about what 16K simple float operations take. */
#define PAR_CPU_GRAIN_ELEMS ((size_t)1 << 14) /* elementwise ops: an item is one element */

/* memset and memcpy split over the threads (byte ranges; n of any size). */
void par_cpu_memset(void *dst, int value, size_t bytes);
void par_cpu_memcpy(void *dst, const void *src, size_t bytes);

#endif

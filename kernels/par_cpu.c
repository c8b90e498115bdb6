#include "par_cpu.h"

#include <cblas.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Why a pool of our own rather than OpenMP (gcc -fopenmp, which llm.c uses):
 * - fork: GCC's libgomp does not survive fork. Once a process has run a parallel region, the
 *   first parallel region in a forked child waits forever for pool threads the child does not
 *   have (checked with gcc 12). parallax run forks its training worker (cli/launch.c's guardian)
 *   and the tests fork too; here a pthread_atfork handler gives the child an empty pool, which it
 *   refills on first use.
 * - waiting: libgomp's idle threads spin before they sleep (GOMP_SPINCOUNT), and so do
 *   OpenBLAS's after every product; with both pools on the same cores the spinners take turns
 *   from the threads with work. Workers here sleep on a condition variable: a wake-up costs some
 *   microseconds, and a step makes a few hundred calls.
 * - nothing for the build to add: -fopenmp on every compile and link, and an uninstrumented
 *   runtime under the sanitizers.
 * What it costs is this file, and a C function per parallel loop instead of a pragma. */

/* ---- the pool ---- */

/* The job in flight. Chunks are claimed through claim, which holds the job's generation in its
 * high 32 bits and the next chunk in its low 32: a worker that wakes after its job has finished
 * (and another has started) fails the compare-and-swap on the generation instead of taking a
 * chunk of a job it has not read. */
typedef struct ParJob {
	ParCpuFn fn;
	void *ctx;
	size_t n;
	uint32_t chunks;
	uint32_t gen;
	int nt; /* threads that may take part: the caller and workers 1 .. nt - 1 */
} ParJob;

static struct {
	pthread_mutex_t mu;  /* guards the fields up to job */
	pthread_cond_t go;   /* a new job */
	pthread_cond_t done; /* the last chunk finished */
	int n_workers;       /* started; worker w is numbered 1 .. n_workers */
	int busy;            /* a job is in flight: another caller runs alone */
	unsigned long split_calls;
	ParJob job;
	_Atomic uint64_t claim;    /* gen << 32 | next chunk */
	_Atomic uint32_t finished; /* chunks of the job done */
} pool = {.mu = PTHREAD_MUTEX_INITIALIZER, .go = PTHREAD_COND_INITIALIZER,
	  .done = PTHREAD_COND_INITIALIZER};

static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

/* Claim and run chunks of j until none is left; 1 when this thread finished the last one. */
static int run_chunks(const ParJob *j)
{
	int last = 0;
	for (;;) {
		uint64_t v = atomic_load(&pool.claim);
		uint32_t c = (uint32_t)v;
		if ((uint32_t)(v >> 32) != j->gen || c >= j->chunks)
			return last;
		if (!atomic_compare_exchange_weak(&pool.claim, &v, v + 1))
			continue;
		size_t begin = j->n * c / j->chunks, end = j->n * (c + 1) / j->chunks;
		if (begin < end)
			j->fn(j->ctx, begin, end);
		last = atomic_fetch_add(&pool.finished, 1) + 1 == j->chunks;
	}
}

static void *worker_main(void *arg)
{
	int w = (int)(intptr_t)arg;
	uint32_t seen = 0;
	pthread_mutex_lock(&pool.mu);
	for (;;) {
		while (!pool.busy || pool.job.gen == seen)
			pthread_cond_wait(&pool.go, &pool.mu);
		ParJob j = pool.job;
		seen = j.gen;
		if (w >= j.nt) /* more workers than this job's thread count: sit it out */
			continue;
		pthread_mutex_unlock(&pool.mu);
		int last = run_chunks(&j);
		pthread_mutex_lock(&pool.mu);
		if (last)
			pthread_cond_signal(&pool.done);
	}
	return NULL;
}

/* In a forked child only the forking thread exists: forget the parent's workers (their memory
 * was the parent's stacks) and start afresh. The child is single-threaded here, so plain stores
 * are safe; the locks are re-made in case another thread held one at the fork. */
static void atfork_child(void)
{
	pthread_mutex_init(&pool.mu, NULL);
	pthread_cond_init(&pool.go, NULL);
	pthread_cond_init(&pool.done, NULL);
	pool.n_workers = 0;
	pool.busy = 0;
}

static void atfork_register(void)
{
	pthread_atfork(NULL, NULL, atfork_child);
}

/* Workers up to want (caller holds mu); returns how many there are, fewer when the system
 * refuses a thread (the loops then run on fewer threads, with the same results). */
static int grow_pool(int want)
{
	while (pool.n_workers < want) {
		pthread_t t;
		if (pthread_create(&t, NULL, worker_main, (void *)(intptr_t)(pool.n_workers + 1)))
			break;
		pthread_detach(t);
		pool.n_workers++;
	}
	return pool.n_workers;
}

/* ---- the interface ---- */

static _Atomic int loop_threads; /* par_cpu_set_loop_threads', 0: OpenBLAS's count */

int par_cpu_threads(void)
{
	int n = atomic_load(&loop_threads);
	if (n < 1)
		n = openblas_get_num_threads();
	return n < 1 ? 1 : n > PAR_CPU_MAX_THREADS ? PAR_CPU_MAX_THREADS : n;
}

void par_cpu_set_threads(int n)
{
	openblas_set_num_threads(n < 1 ? 1 : n);
}

int par_cpu_blas_timeout(void)
{
	const char *v = getenv("OPENBLAS_THREAD_TIMEOUT");
	int t = v ? atoi(v) : 0;
	if (t <= 0) /* unset, or not a positive number: OpenBLAS keeps its default */
		return PAR_CPU_BLAS_TIMEOUT_DEFAULT;
	return t < 4 ? 4 : t > 30 ? 30 : t;
}

void par_cpu_set_loop_threads(int n)
{
	atomic_store(&loop_threads, n < 0 ? 0 : n);
}

void par_cpu_for(size_t n, size_t min_items, ParCpuFn fn, void *ctx)
{
	size_t most = n / (min_items ? min_items : 1);
	int nt = par_cpu_threads();
	size_t chunks = (size_t)PAR_CPU_CHUNKS_PER_THREAD * (size_t)nt;
	if (chunks > most)
		chunks = most;
	if (nt <= 1 || chunks <= 1) {
		if (n)
			fn(ctx, 0, n);
		return;
	}
	pthread_once(&atfork_once, atfork_register);
	pthread_mutex_lock(&pool.mu);
	/* nested, a second caller, or no thread to be had: alone, with the same results */
	if (pool.busy || grow_pool(nt - 1) == 0) {
		pthread_mutex_unlock(&pool.mu);
		fn(ctx, 0, n);
		return;
	}
	pool.busy = 1;
	pool.split_calls++;
	ParJob j = {fn, ctx, n, (uint32_t)chunks, pool.job.gen + 1, nt};
	if (j.gen == 0) /* 0 is the workers' "seen nothing yet" */
		j.gen = 1;
	pool.job = j;
	atomic_store(&pool.finished, 0);
	atomic_store(&pool.claim, (uint64_t)j.gen << 32);
	pthread_cond_broadcast(&pool.go);
	pthread_mutex_unlock(&pool.mu);

	run_chunks(&j);

	pthread_mutex_lock(&pool.mu);
	while (atomic_load(&pool.finished) < j.chunks)
		pthread_cond_wait(&pool.done, &pool.mu);
	pool.busy = 0;
	pthread_mutex_unlock(&pool.mu);
}

unsigned long par_cpu_split_calls(void)
{
	pthread_mutex_lock(&pool.mu);
	unsigned long n = pool.split_calls;
	pthread_mutex_unlock(&pool.mu);
	return n;
}

/* ---- memory ---- */

typedef struct MemArgs {
	char *dst;
	const char *src;
	int value;
} MemArgs;

static void memset_range(void *ctx, size_t begin, size_t end)
{
	MemArgs *a = ctx;
	memset(a->dst + begin, a->value, end - begin);
}

static void memcpy_range(void *ctx, size_t begin, size_t end)
{
	MemArgs *a = ctx;
	memcpy(a->dst + begin, a->src + begin, end - begin);
}

/* a range is at least 256 KiB: below that one thread's copy is over before a worker wakes */
#define MEM_GRAIN_BYTES ((size_t)1 << 18)

void par_cpu_memset(void *dst, int value, size_t bytes)
{
	MemArgs a = {dst, NULL, value};
	par_cpu_for(bytes, MEM_GRAIN_BYTES, memset_range, &a);
}

void par_cpu_memcpy(void *dst, const void *src, size_t bytes)
{
	MemArgs a = {dst, src, 0};
	par_cpu_for(bytes, MEM_GRAIN_BYTES, memcpy_range, &a);
}

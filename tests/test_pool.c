/* The CPU backend's allocator (exec/pool.c) against hand-computed segment, commit and mapped
 * figures; its reuse (a repeated step maps nothing new and takes no page faults); zeroing and
 * alignment; and the process figures (exec/procmem.c): the peak resident set rises by what is
 * touched, and falls back for the resident set (not the peak) when the pool gives it back. */
#include <CUnit/CUnit.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/schedule.h"
#include "../exec/caching.h"
#include "../exec/pool.h"
#include "../exec/procmem.h"
#include "../kernels/rng.h"
#include "../sim/allocator.h"
#include "suites.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif

enum { KiB = 1 << 10, MiB = 1 << 20 };

/* small requests up to 4 KiB; 1 MiB of address space a segment, mapped 64 KiB at a time */
static const PoolConfig CFG = {4 * KiB, 1 * MiB, 64 * KiB};

static PoolStats stats(const Pool *p)
{
	PoolStats st;
	pool_stats(p, &st);
	return st;
}

/* Every figure below follows from CFG by hand: a request rounds up to a multiple of 64 bytes;
 * a segment's mapped front grows to the next multiple of 64 KiB past its last block. */
static void test_segments_hand_computed(void)
{
	Pool *p = pool_create(&CFG);
	CU_ASSERT_PTR_NOT_NULL_FATAL(p);
	CU_ASSERT_EQUAL(stats(p).mapped_bytes, 0);
	/* 512 small requests of 100 bytes, 128 as aligned: 512 x 128 = 65536, exactly the first
	 * small segment's first step */
	char *s[512];
	for (int i = 0; i < 512; i++)
		s[i] = pool_alloc(p, 100);
	PoolStats st = stats(p);
	CU_ASSERT_EQUAL(st.reserves, 1);
	CU_ASSERT_EQUAL(st.commits, 1);
	CU_ASSERT_EQUAL(st.mapped_bytes, 65536);
	CU_ASSERT_EQUAL(st.live_bytes, 65536);
	CU_ASSERT_EQUAL(st.asked_bytes, 51200);
	CU_ASSERT_EQUAL(s[511] - s[0], 511 * 128); /* one after the other */
	/* the 513th takes the second step: 131072 */
	char *x = pool_alloc(p, 100);
	CU_ASSERT_EQUAL(stats(p).commits, 2);
	CU_ASSERT_EQUAL(stats(p).mapped_bytes, 131072);
	/* large: 300000 rounds to 300032 (4688 x 64), in a segment of its own class whose first
	 * step is round_up(300032, 65536) = 327680: 131072 + 327680 = 458752 */
	char *b = pool_alloc(p, 300000);
	st = stats(p);
	CU_ASSERT_EQUAL(st.reserves, 2);
	CU_ASSERT_EQUAL(st.segments, 2);
	CU_ASSERT_EQUAL(st.mapped_bytes, 458752);
	/* freed and asked again smaller: the same block, nothing new */
	pool_free(p, b);
	char *c = pool_alloc(p, 200000); /* 3125 x 64 exactly */
	CU_ASSERT_PTR_EQUAL(c, b);
	CU_ASSERT_EQUAL(stats(p).mapped_bytes, 458752);
	CU_ASSERT_EQUAL(stats(p).commits, 3);
	/* 150000 (150016 aligned) does not fit the 100032 left after c: that free block, the
	 * segment's front, grows by 49984 to end at 350016, mapped to round_up(350016, 65536) =
	 * 393216: 131072 + 393216 = 524288 */
	char *d = pool_alloc(p, 150000);
	CU_ASSERT_PTR_EQUAL(d, c + 200000);
	st = stats(p);
	CU_ASSERT_EQUAL(st.mapped_bytes, 524288);
	CU_ASSERT_EQUAL(st.commits, 4);
	CU_ASSERT_EQUAL(st.reserves, 2);
	/* larger than a segment: a segment of its own, 3 MiB: 524288 + 3145728 = 3670016 */
	char *e = pool_alloc(p, 3 * MiB);
	st = stats(p);
	CU_ASSERT_EQUAL(st.reserves, 3);
	CU_ASSERT_EQUAL(st.mapped_bytes, 3670016);
	CU_ASSERT_EQUAL(st.mapped_peak_bytes, 3670016);
	/* freed, it stays mapped until a trim gives its empty segment back */
	pool_free(p, e);
	CU_ASSERT_EQUAL(stats(p).mapped_bytes, 3670016);
	pool_trim(p);
	st = stats(p);
	CU_ASSERT_EQUAL(st.mapped_bytes, 524288);
	CU_ASSERT_EQUAL(st.segments, 2);
	CU_ASSERT_EQUAL(st.releases, 1);
	/* c freed below a live d: nothing past d to give back */
	pool_free(p, c);
	pool_trim(p);
	CU_ASSERT_EQUAL(stats(p).mapped_bytes, 524288);
	CU_ASSERT_EQUAL(stats(p).releases, 1);
	pool_free(p, d);
	pool_trim(p);
	CU_ASSERT_EQUAL(stats(p).mapped_bytes, 131072);
	CU_ASSERT_EQUAL(stats(p).segments, 1);
	/* the last 256 small blocks and x freed: one free block from 256 x 128 = 32768 on, given
	 * back past round_up(32768, 65536) = 65536 */
	for (int i = 256; i < 512; i++)
		pool_free(p, s[i]);
	pool_free(p, x);
	pool_trim(p);
	st = stats(p);
	CU_ASSERT_EQUAL(st.mapped_bytes, 65536);
	CU_ASSERT_EQUAL(st.releases, 3);
	CU_ASSERT_EQUAL(st.mapped_peak_bytes, 3670016); /* until reset */
	pool_reset_peak(p);
	CU_ASSERT_EQUAL(stats(p).mapped_peak_bytes, 65536);
	for (int i = 0; i < 256; i++)
		pool_free(p, s[i]);
	pool_trim(p);
	st = stats(p);
	CU_ASSERT_EQUAL(st.mapped_bytes, 0);
	CU_ASSERT_EQUAL(st.segments, 0);
	CU_ASSERT_EQUAL(st.live_blocks, 0);
	CU_ASSERT_EQUAL(st.free_blocks, 0);
	pool_destroy(p);
}

/* One "training step" of allocations: transient buffers of several sizes, freed in another
 * order than they came, every byte written. */
static void one_step(Pool *p)
{
	static const size_t sizes[] = {5 * MiB + 100, 200 * KiB, 1000, 2 * MiB, 4 * MiB, 6 * MiB};
	char *b[6];
	b[0] = pool_alloc(p, sizes[0]);
	b[1] = pool_alloc(p, sizes[1]);
	b[2] = pool_alloc(p, sizes[2]);
	b[3] = pool_alloc(p, sizes[3]);
	for (int i = 0; i < 4; i++)
		memset(b[i], 1, sizes[i]);
	pool_free(p, b[0]);
	b[4] = pool_alloc(p, sizes[4]);
	memset(b[4], 1, sizes[4]);
	pool_free(p, b[1]);
	pool_free(p, b[2]);
	b[5] = pool_alloc(p, sizes[5]);
	memset(b[5], 1, sizes[5]);
	pool_free(p, b[3]);
	pool_free(p, b[4]);
	pool_free(p, b[5]);
}

/* After the first step the pool holds what every later step needs: 100 more steps map nothing
 * (the mapped bytes, their peak and the commit count stay those of step 1), and so take no page
 * faults: the only first touches were step 1's. A pool that mapped each step's 17 MiB anew would
 * take over 4,000 faults a step; the bound, under one a step, allows the C library's heap its
 * few (15 in 100 steps under ASan, whose quarantine hands the pool's block records fresh
 * memory; none in the release build). */
static void test_steady_steps_map_nothing(void)
{
	Pool *p = pool_create(&POOL_CONFIG_DEFAULT);
	CU_ASSERT_PTR_NOT_NULL_FATAL(p);
	char *keep = pool_alloc(p, 1 * MiB), *keep2 = pool_alloc(p, 3000);
	one_step(p);
	PoolStats first = stats(p);
	long long f0 = procmem_minor_faults();
	for (int i = 0; i < 100; i++)
		one_step(p);
	long long faults = procmem_minor_faults() - f0;
	PoolStats later = stats(p);
	CU_ASSERT_EQUAL(later.mapped_bytes, first.mapped_bytes);
	CU_ASSERT_EQUAL(later.mapped_peak_bytes, first.mapped_peak_bytes);
	CU_ASSERT_EQUAL(later.commits, first.commits);
	CU_ASSERT_EQUAL(later.reserves, first.reserves);
	if (faults >= 100)
		fprintf(stderr, "\n100 steady steps took %lld page faults\n", faults);
	CU_ASSERT(f0 >= 0 && faults < 100);
	/* what the steps needed at once is the floor of what must be mapped: 1 MiB + 3000 kept,
	 * then at most 2 MiB + 4 MiB + 6 MiB live together (b[3], b[4], b[5]) */
	CU_ASSERT(first.mapped_peak_bytes >= first.asked_peak_bytes);
	CU_ASSERT(first.asked_peak_bytes == 1 * MiB + 3000 + 12 * MiB);
	pool_free(p, keep);
	pool_free(p, keep2);
	pool_destroy(p);
}

/* Every block is aligned to 64 bytes and zero when handed out, a reused one too. */
static void test_aligned_and_zeroed(void)
{
	static const size_t sizes[] = {0, 1, 63, 64, 65, 1000, 4096, 70000, 1 << 20};
	enum { N = sizeof(sizes) / sizeof(sizes[0]) };
	Pool *p = pool_create(&CFG);
	CU_ASSERT_PTR_NOT_NULL_FATAL(p);
	for (int round = 0; round < 2; round++) {
		unsigned char *b[N];
		for (int k = 0; k < N; k++) {
			int i = round ? N - 1 - k : k; /* the second round in reverse: other blocks */
			b[i] = pool_alloc(p, sizes[i]);
			CU_ASSERT_PTR_NOT_NULL_FATAL(b[i]);
			CU_ASSERT_EQUAL((uintptr_t)b[i] % 64, 0);
			size_t nonzero = 0;
			for (size_t j = 0; j < sizes[i]; j++)
				nonzero += b[i][j] != 0;
			CU_ASSERT_EQUAL(nonzero, 0);
			memset(b[i], 0xa5, sizes[i]);
		}
		for (int i = 0; i < N; i++)
			pool_free(p, b[i]);
	}
	pool_destroy(p);
}

/* pool_alloc_empty touches nothing: a reused block keeps what the last one wrote (pool_alloc
 * would clear it), and 256 MiB of fresh ones, mapped and counted, take no page faults until
 * written. Under AddressSanitizer the pool's unpoisoning writes the block's shadow (1/8 of it),
 * whose pages fault: the release pass, without it, counts the faults. */
static void test_empty_untouched(void)
{
	Pool *p = pool_create(&POOL_CONFIG_DEFAULT);
	CU_ASSERT_PTR_NOT_NULL_FATAL(p);
	unsigned char *a = pool_alloc(p, 4096);
	CU_ASSERT_PTR_NOT_NULL_FATAL(a);
	memset(a, 0xa5, 4096);
	pool_free(p, a);
	unsigned char *b = pool_alloc_empty(p, 4096);
	CU_ASSERT_PTR_EQUAL(b, a);
	CU_ASSERT_EQUAL(b[0], 0xa5);
	CU_ASSERT_EQUAL(b[4095], 0xa5);
	pool_free(p, b);
	b = pool_alloc(p, 4096);
	CU_ASSERT_EQUAL(b[0], 0);
	pool_free(p, b);
	long long f0 = procmem_minor_faults();
	unsigned char *big = pool_alloc_empty(p, 256 * MiB);
	CU_ASSERT_PTR_NOT_NULL_FATAL(big);
	CU_ASSERT(stats(p).mapped_bytes >= 256 * MiB);
	pool_free(p, big);
	big = pool_alloc_empty(p, 256 * MiB); /* the same block again: still untouched */
	CU_ASSERT(f0 >= 0);
#if !defined(__SANITIZE_ADDRESS__)
	CU_ASSERT(procmem_minor_faults() - f0 < 64); /* not 65,536 pages' first touches */
#endif
	pool_free(p, big);
	pool_destroy(p);
}

/* A commit step that is not a whole number of pages, a small class larger than a segment, a
 * segment smaller than its commit step: refused. */
static void test_bad_config(void)
{
	const PoolConfig bad[] = {{4 * KiB, 1 * MiB, 1000}, {2 * MiB, 1 * MiB, 64 * KiB},
				  {4 * KiB, 64 * KiB, 128 * KiB}, {4 * KiB, 1 * MiB, 0}};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		CU_ASSERT_PTR_NULL(pool_create(&bad[i]));
	pool_destroy(NULL); /* NULL is fine, to both */
	Pool *p = pool_create(&CFG);
	pool_free(p, NULL);
	CU_ASSERT_EQUAL(stats(p).live_blocks, 0);
	pool_destroy(p);
}

#if defined(__SANITIZE_ADDRESS__)
/* Under ASan the pool poisons what no caller holds: the tail past what was asked, a freed block. */
static void test_poisoned(void)
{
	Pool *p = pool_create(&CFG);
	char *a = pool_alloc(p, 100);
	CU_ASSERT_FALSE(__asan_address_is_poisoned(a + 99));
	CU_ASSERT_TRUE(__asan_address_is_poisoned(a + 100));
	pool_free(p, a);
	CU_ASSERT_TRUE(__asan_address_is_poisoned(a));
	pool_destroy(p);
}
#endif

/* The kernel's figures: after a reset, touching 64 MiB raises the peak resident set by 64 MiB
 * at least (it counts every touched page) and takes page faults; touching the same block again
 * after it was freed and reused takes none; given back, the resident set falls by the 64 MiB
 * (less 1 MiB for the kernel's batched counters) and the peak stays. */
static void test_peak_rss_rises(void)
{
	CU_ASSERT_EQUAL_FATAL(procmem_reset_peak(), 0);
	double rss0 = procmem_rss_bytes(), hwm0 = procmem_peak_rss_bytes();
	long long f0 = procmem_minor_faults();
	CU_ASSERT(rss0 > 0 && hwm0 >= rss0 - 4 * KiB);
	Pool *p = pool_create(&POOL_CONFIG_DEFAULT);
	char *m = pool_alloc(p, 64 * MiB);
	CU_ASSERT_PTR_NOT_NULL_FATAL(m);
	memset(m, 1, 64 * MiB);
	double hwm1 = procmem_peak_rss_bytes();
	long long f1 = procmem_minor_faults();
	if (hwm1 - rss0 < 64.0 * MiB)
		fprintf(stderr, "\npeak resident set %.0f, before %.0f\n", hwm1, rss0);
	CU_ASSERT(hwm1 - rss0 >= 64.0 * MiB);
	CU_ASSERT(f1 > f0);
	pool_free(p, m);
	char *again = pool_alloc(p, 64 * MiB);
	CU_ASSERT_PTR_EQUAL(again, m);
	memset(again, 2, 64 * MiB);
	CU_ASSERT(procmem_minor_faults() - f1 < 64); /* not the 16384 pages' first touches */
	pool_free(p, again);
	pool_trim(p);
	CU_ASSERT_EQUAL(stats(p).mapped_bytes, 0);
	CU_ASSERT(procmem_rss_bytes() <= hwm1 - 63.0 * MiB);
	/* the kernel records the peak lazily (when a mapping goes) from counters it batches, so a
	 * later reading may lie a few pages below an earlier one: 1 MiB allowed */
	CU_ASSERT(procmem_peak_rss_bytes() >= hwm1 - 1.0 * MiB);
	pool_destroy(p);
}

/* ---- the CUDA backend's caching allocator (exec/caching.h), on host memory ---- */

#define CMiB ((size_t)1 << 20)

/* A segment source on the host: malloc'd segments, counted; the tests never touch the bytes. */
typedef struct HostSegs {
	size_t mapped;
	int maps, unmaps;
} HostSegs;

static void *host_map(void *ctx, size_t bytes)
{
	HostSegs *h = ctx;
	h->mapped += bytes, h->maps++;
	return malloc(bytes);
}

static void host_unmap(void *ctx, void *seg)
{
	((HostSegs *)ctx)->unmaps++;
	free(seg);
}

/* Expandable segments on the host: address space that is never touched (the tests only compare
 * pointers), a terabyte apart for each reservation; commits counted. */
static void *host_reserve(void *ctx, size_t bytes)
{
	(void)bytes;
	HostSegs *h = ctx;
	return (void *)(((uintptr_t)++h->maps) << 40);
}

static int host_commit(void *ctx, void *ptr, size_t bytes)
{
	(void)ptr;
	((HostSegs *)ctx)->mapped += bytes;
	return 0;
}

static void host_release(void *ctx, void *base, size_t bytes)
{
	(void)base, (void)bytes;
	((HostSegs *)ctx)->unmaps++;
}

static CachingSource host_source(HostSegs *h)
{
	return (CachingSource){host_map, host_unmap, host_reserve, host_commit, host_release,
			       (size_t)1 << 40, h};
}

/* tests/test_verdict.c's sequence, worked by hand with PyTorch's rules there, on the executor's
 * allocator: a 3 MiB, b 3 MiB (one 20 MiB segment), free a, c 1.5 MiB (a's block), d 100 bytes
 * (a 2 MiB small segment), e 30 MiB + 1 (a 32 MiB segment), free c, free b (the 20 MiB segment
 * whole again), f 18 MiB (that block, at a's address): allocated at most 48 MiB + 1024, reserved
 * 54 MiB in 3 segments, every one unmapped at the end. */
static void test_caching_hand_worked(void)
{
	HostSegs h = {0};
	CachingSource src = host_source(&h);
	Caching *c = caching_create(&src, NULL);
	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	char *a = caching_alloc(c, 3 * CMiB), *b = caching_alloc(c, 3 * CMiB);
	CU_ASSERT_PTR_EQUAL(b, a + 3 * CMiB);
	CU_ASSERT_EQUAL(caching_free(c, a), 0);
	char *cc = caching_alloc(c, 3 * CMiB / 2);
	CU_ASSERT_PTR_EQUAL(cc, a);
	char *d = caching_alloc(c, 100), *e = caching_alloc(c, 30 * CMiB + 1);
	CU_ASSERT(d && e);
	CU_ASSERT_EQUAL(caching_free(c, cc), 0);
	CU_ASSERT_EQUAL(caching_free(c, b), 0);
	char *f = caching_alloc(c, 18 * CMiB);
	CU_ASSERT_PTR_EQUAL(f, a);
	CachingStats st;
	caching_stats(c, &st);
	CU_ASSERT_EQUAL(st.allocated_peak_bytes, 48 * CMiB + 1024);
	CU_ASSERT_EQUAL(st.reserved_peak_bytes, 54 * CMiB);
	CU_ASSERT_EQUAL(st.segments, 3);
	CU_ASSERT_EQUAL(h.mapped, 54 * CMiB);
	CU_ASSERT_EQUAL(caching_free(c, d + 512), -1); /* not a block's start: refused */
	CU_ASSERT_EQUAL(caching_free(c, f), 0);
	CU_ASSERT_EQUAL(caching_free(c, f), -1); /* twice */
	caching_stats(c, &st);
	CU_ASSERT_EQUAL(st.allocated_bytes, 30 * CMiB + 1024);
	caching_destroy(c);
	CU_ASSERT_EQUAL(h.unmaps, 3);
}

/* max_split_size_mb:32 (PYTORCH_CUDA_ALLOC_CONF), worked by hand with PyTorch's rules
 * (get_free_block refuses a cached block at or above the limit for a request below it, and one
 * 20 MiB or more larger than a request at or above it; should_split never splits for a request at
 * or above it): a 100 MiB (a 100 MiB segment), freed; b 60 MiB: the cached 100 MiB block is 40
 * larger, refused: a 60 MiB segment; c 90 MiB: the 100 MiB block, whole (not split); freed;
 * d 10 MiB: the cached 100 MiB block is oversize, refused: a 10 MiB segment. Allocated at most
 * 160 MiB (b and c's whole block), reserved 170 MiB in 3 segments. Without the option b splits
 * a's block and c maps 90 MiB more: 190 MiB reserved. */
static void test_caching_max_split(void)
{
	HostSegs h = {0};
	CachingSource src = host_source(&h);
	AllocConf conf = {.max_split_bytes = 32.0 * (double)CMiB};
	for (int on = 1; on >= 0; on--) {
		Caching *c = caching_create(&src, on ? &conf : NULL);
		CU_ASSERT_PTR_NOT_NULL_FATAL(c);
		char *a = caching_alloc(c, 100 * CMiB);
		CU_ASSERT_EQUAL(caching_free(c, a), 0);
		char *b = caching_alloc(c, 60 * CMiB), *cc = caching_alloc(c, 90 * CMiB);
		CU_ASSERT_PTR_EQUAL(on ? cc : b, a);
		CU_ASSERT_EQUAL(caching_free(c, cc), 0);
		char *d = caching_alloc(c, 10 * CMiB);
		CU_ASSERT(b && d);
		CachingStats st;
		caching_stats(c, &st);
		CU_ASSERT_EQUAL(st.reserved_peak_bytes, (on ? 170 : 190) * CMiB);
		if (on) {
			CU_ASSERT_EQUAL(st.allocated_peak_bytes, 160 * CMiB);
			CU_ASSERT_EQUAL(st.segments, 3);
		}
		caching_destroy(c);
	}
}

/* roundup_power2_divisions:4 and max_non_split_rounding_mb, worked by hand with PyTorch's rules
 * (round_size: above 512 x 4 bytes, up to the next quarter of the power-of-two interval):
 * a 9 MiB is 10 MiB (steps of 2 in [8, 16)), a segment of its own (10 MiB and more map their
 * size); b 9.5 MiB (10) a second; free a; c 9.25 MiB (10) is a's block again: reserved 20 MiB,
 * allocated at most 20; then 16 MiB (a power of two, as it is) maps 16.
 * With 512-byte rounding b splits the 11 MiB left (1.5 over), c fits neither a's 9 MiB block
 * nor the 1.5 MiB one: a second segment, 40 MiB reserved, allocated at most 18.75 MiB.
 * max_split_size_mb:32 with max_non_split_rounding_mb:50 on test_caching_max_split's sequence: b
 * 60 MiB takes the cached 100 MiB block (40 over, under 50), c 90 MiB maps 90, d 10 MiB maps 10:
 * reserved 200 MiB, allocated at most 190. A size already a power of two stays as it is. */
static void test_caching_roundup(void)
{
	HostSegs h = {0};
	CachingSource src = host_source(&h);
	AllocConf four = {0};
	for (int i = 0; i < ALLOC_CONF_INTERVALS; i++)
		four.divisions[i] = 4;
	for (int on = 1; on >= 0; on--) {
		Caching *c = caching_create(&src, on ? &four : NULL);
		CU_ASSERT_PTR_NOT_NULL_FATAL(c);
		char *a = caching_alloc(c, 9 * CMiB), *b = caching_alloc(c, 9 * CMiB + CMiB / 2);
		CU_ASSERT(on || b == a + 9 * CMiB);
		CU_ASSERT_EQUAL(caching_free(c, a), 0);
		char *cc = caching_alloc(c, 9 * CMiB + CMiB / 4);
		CU_ASSERT(on ? cc == a : cc != a);
		CachingStats st;
		caching_stats(c, &st);
		CU_ASSERT_EQUAL(st.reserved_peak_bytes, (on ? 20 : 40) * CMiB);
		CU_ASSERT_EQUAL(st.allocated_peak_bytes, on ? 20 * CMiB : 18 * CMiB + 3 * CMiB / 4);
		char *p = caching_alloc(c, 16 * CMiB);
		caching_stats(c, &st);
		CU_ASSERT_EQUAL(st.allocated_bytes, (on ? 36 : 34) * CMiB + CMiB / 4 * (on ? 0 : 3));
		CU_ASSERT_PTR_NOT_NULL(p);
		caching_destroy(c);
	}
	AllocConf conf = {.max_split_bytes = 32.0 * (double)CMiB,
			  .max_non_split_bytes = 50.0 * (double)CMiB};
	Caching *c = caching_create(&src, &conf);
	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	char *a = caching_alloc(c, 100 * CMiB);
	CU_ASSERT_EQUAL(caching_free(c, a), 0);
	char *b = caching_alloc(c, 60 * CMiB), *cc = caching_alloc(c, 90 * CMiB);
	CU_ASSERT_PTR_EQUAL(b, a);
	CU_ASSERT_EQUAL(caching_free(c, cc), 0);
	CU_ASSERT_PTR_NOT_NULL(caching_alloc(c, 10 * CMiB));
	CachingStats st;
	caching_stats(c, &st);
	CU_ASSERT_EQUAL(st.reserved_peak_bytes, 200 * CMiB);
	CU_ASSERT_EQUAL(st.allocated_peak_bytes, 190 * CMiB);
	caching_destroy(c);
}

/* expandable_segments:True, worked by hand with PyTorch's rules (each pool one segment that maps
 * pages of 2 MiB (small) or 20 MiB (large) after its last block for what a request lacks, merged
 * with that block when free; any block splits where 512 bytes are left; the last block is taken
 * only when no other fits): a 3 MiB maps 20 MiB (a, then 17 free); b 30 MiB lacks 13: 20 more
 * (b after a, 7 free); c 100 bytes: a small segment of 2 MiB; free a; d 5 MiB: the 7 MiB at the
 * end (the only fit), 2 left; e 2 MiB: a's 3 MiB before the 2 at the end. Reserved at most
 * 42 MiB in 2 segments (52 MiB in 4 without the option), allocated 37 MiB + 512. */
static void test_caching_expandable(void)
{
	HostSegs h = {0};
	CachingSource src = host_source(&h);
	AllocConf conf = {.expandable = 1};
	Caching *c = caching_create(&src, &conf);
	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	char *a = caching_alloc(c, 3 * CMiB), *b = caching_alloc(c, 30 * CMiB);
	CU_ASSERT_PTR_EQUAL(b, a + 3 * CMiB);
	char *cc = caching_alloc(c, 100);
	CU_ASSERT_EQUAL(caching_free(c, a), 0);
	char *d = caching_alloc(c, 5 * CMiB), *e = caching_alloc(c, 2 * CMiB);
	CU_ASSERT_PTR_EQUAL(d, b + 30 * CMiB);
	CU_ASSERT_PTR_EQUAL(e, a);
	CU_ASSERT_PTR_NOT_NULL(cc);
	CachingStats st;
	caching_stats(c, &st);
	CU_ASSERT_EQUAL(st.reserved_peak_bytes, 42 * CMiB);
	CU_ASSERT_EQUAL(h.mapped, 42 * CMiB);
	CU_ASSERT_EQUAL(st.allocated_peak_bytes, 37 * CMiB + 512);
	CU_ASSERT_EQUAL(st.segments, 2);
	caching_destroy(c);
	CU_ASSERT_EQUAL(h.unmaps, 2); /* both reservations given back */
	/* a source without reservations cannot grow segments: refused */
	CachingSource plain = {host_map, host_unmap, NULL, NULL, NULL, 0, &h};
	CU_ASSERT_PTR_NULL(caching_create(&plain, &conf));
	/* the same sequence without the option */
	c = caching_create(&src, NULL);
	a = caching_alloc(c, 3 * CMiB), b = caching_alloc(c, 30 * CMiB), cc = caching_alloc(c, 100);
	caching_free(c, a);
	d = caching_alloc(c, 5 * CMiB), e = caching_alloc(c, 2 * CMiB);
	caching_stats(c, &st);
	CU_ASSERT_EQUAL(st.reserved_peak_bytes, 52 * CMiB);
	caching_destroy(c);
}

/* The executor's allocator and the simulator's model of the same rules (sim/allocator.c, written
 * apart) agree on a random sequence: 400 requests from 1 byte to 40 MiB, each freed after a
 * random number of later ones, replayed through both; their allocated and reserved peaks equal,
 * under PyTorch's defaults, max_split_size_mb:24, expandable_segments:True, and both. */
static void caching_matches_model(const AllocConf *conf);

static void test_caching_matches_model(void)
{
	static const AllocConf confs[] = {
		{0, 0}, {0, 24.0 * 1048576}, {1, 0}, {1, 24.0 * 1048576}};
	for (int k = 0; k < 4; k++)
		caching_matches_model(&confs[k]);
}

static void caching_matches_model(const AllocConf *conf)
{
	enum { N = 400 };
	HostSegs h = {0};
	CachingSource src = host_source(&h);
	Caching *c = caching_create(&src, conf);
	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	Schedule s;
	sched_init(&s, 0);
	PxRng rng;
	rng_init(&rng, 77, 0);
	void *ptr[N] = {0};
	int id[N], end[N];
	for (int i = 0; i < N; i++) {
		/* sizes over the three classes: small, 1-10 MiB, large */
		double u = rng_uniform(&rng);
		size_t bytes = (size_t)(u < 0.4 ? 1 + rng_uniform(&rng) * CMiB :
				u < 0.8 ? CMiB + rng_uniform(&rng) * 9 * CMiB :
					  10 * CMiB + rng_uniform(&rng) * 30 * CMiB);
		end[i] = i + 1 + (int)(rng_uniform(&rng) * 12);
		CU_ASSERT_EQUAL_FATAL(sched_alloc(&s, PLACE_GPU, CAT_ACTIV, BUF_ACTIVATIONS, -1,
						  (double)bytes, &id[i]), 0);
		ptr[i] = caching_alloc(c, bytes);
		CU_ASSERT_PTR_NOT_NULL_FATAL(ptr[i]);
		for (int j = 0; j <= i; j++)
			if (ptr[j] && end[j] == i) {
				CU_ASSERT_EQUAL(sched_free_buf(&s, id[j]), 0);
				CU_ASSERT_EQUAL(caching_free(c, ptr[j]), 0);
				ptr[j] = NULL;
			}
	}
	for (int j = 0; j < N; j++)
		if (ptr[j]) {
			CU_ASSERT_EQUAL(sched_free_buf(&s, id[j]), 0);
			CU_ASSERT_EQUAL(caching_free(c, ptr[j]), 0);
		}
	AllocPeaks pk;
	PxError err = {0};
	CU_ASSERT_EQUAL_FATAL(alloc_replay(&s, 1, conf, &pk, &err), 0);
	CachingStats st;
	caching_stats(c, &st);
	CU_ASSERT_EQUAL((double)st.allocated_peak_bytes, pk.allocated_bytes);
	CU_ASSERT_EQUAL((double)st.reserved_peak_bytes, pk.reserved_bytes);
	/* the sequence did exercise the segments (expandable: one a pool, grown) */
	CU_ASSERT(conf->expandable ? st.segments == 2 && st.maps > 5 : st.segments > 5);
	CU_ASSERT_EQUAL(st.allocated_bytes, 0);
	sched_free(&s);
	caching_destroy(c);
}

int test_pool_register(void)
{
	return PX_ADD_SUITE("pool", {"segments, commits and trims, hand-computed",
				     test_segments_hand_computed},
			    {"a repeated step maps nothing new, takes no page faults",
			     test_steady_steps_map_nothing},
			    {"blocks aligned to 64 bytes and zeroed, reused ones too",
			     test_aligned_and_zeroed},
			    {"bad configurations refused", test_bad_config},
			    {"pool_alloc_empty touches nothing", test_empty_untouched},
#if defined(__SANITIZE_ADDRESS__)
			    {"ASan: the pool poisons what no caller holds", test_poisoned},
#endif
			    {"VmHWM rises by what is touched; VmRSS falls when given back",
			     test_peak_rss_rises},
			    {"the CUDA caching allocator, hand-worked", test_caching_hand_worked},
			    {"max_split_size_mb, hand-worked", test_caching_max_split},
			    {"roundup_power2_divisions and max_non_split_rounding_mb, hand-worked",
			     test_caching_roundup},
			    {"expandable_segments, hand-worked", test_caching_expandable},
			    {"the CUDA caching allocator agrees with the model", test_caching_matches_model});
}

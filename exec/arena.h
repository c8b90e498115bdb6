/* arena: the executor's labelled allocator. Every byte the executor holds for training goes
 * through it, labelled with the schedule's place and category, so that the bytes requested per
 * place and category (current and peak) can be set beside what the simulator predicts. The
 * memory itself, and the measured figure of what it takes from the system, come from the compute
 * backend (the CPU's pool, pool.h; device memory on CUDA): arena_held_peak. On the CPU backend
 * every place is host memory; the labels say where the implementation would keep it. */
#ifndef PX_EXEC_ARENA_H
#define PX_EXEC_ARENA_H

#include <stddef.h>

#include "../engine/schedule.h"

typedef struct Arena {
	/* where the bytes come from: a compute backend's memory (device memory for PLACE_GPU on
	 * CUDA) */
	void *(*alloc)(void *ctx, Place place, size_t bytes); /* zeroed; NULL when out of memory */
	void *(*alloc_empty)(void *ctx, Place place, size_t bytes); /* not zeroed; NULL: alloc */
	void (*release)(void *ctx, Place place, void *ptr);
	void *ctx;
	/* what the source holds from the system for a place, now and at its high-water mark
	 * (compute.h's held; negative for a place it has no figure for), and its settle; NULL:
	 * each alloc is its own request to the system */
	void (*held)(void *ctx, int place, double *now_bytes, double *peak_bytes);
	void (*settle)(void *ctx);
	int held_caching; /* the device place's held figure is exec/caching.h's reserve */
	/* called when a place's peak rises, e.g. to read the device's own figure then; NULL: none */
	void (*on_peak)(void *ctx, Place place);
	void *peak_ctx;
	/* the bytes requested, by place and category: live now, at the place's peak */
	double live[N_PLACES], peak[N_PLACES];
	double cat[N_PLACES][N_CATS];
	double at_peak[N_PLACES][N_CATS]; /* the categories when the place peaked */
	double cat_peak[N_PLACES][N_CATS];
	long long n_allocs;
} Arena;

/* An empty arena taking its memory from alloc and release (a compute backend's), with ctx. */
void arena_init(Arena *a, void *(*alloc)(void *, Place, size_t),
		void (*release)(void *, Place, void *), void *ctx);
/* Zeroed memory of bytes (at least one byte), counted under place and cat; NULL when out of
 * memory. Free it with arena_free and the same size. */
void *arena_alloc(Arena *a, Place place, MemCat cat, size_t bytes);
/* The same, its contents undefined (alloc_empty's, where the source has one). */
void *arena_alloc_empty(Arena *a, Place place, MemCat cat, size_t bytes);
void arena_free(Arena *a, Place place, MemCat cat, void *ptr, size_t bytes);
/* Count bytes (negative: release them) under place and cat without allocating: memory someone
 * else allocated, such as the CUDA runtime's. */
void arena_count(Arena *a, Place place, MemCat cat, double bytes);
/* Forget the peaks so far (after initialisation, before the first step): the source settles
 * first (gives back what nothing uses), so that its high-water mark starts from what is held. */
void arena_reset_peaks(Arena *a);
/* The place's measured peak: the bytes its source held from the system at their highest since
 * the last reset (the pool's mapped segments); where the source has no such figure (held NULL),
 * the bytes requested at their peak, which are then what was obtained. N_PLACES: all places'
 * together at their highest (NAN without a source figure). */
double arena_held_peak(const Arena *a, Place place);

#endif

#include "arena.h"

#include <math.h>
#include <string.h>

void arena_init(Arena *a, void *(*alloc)(void *, Place, size_t),
		void (*release)(void *, Place, void *), void *ctx)
{
	memset(a, 0, sizeof(*a));
	a->alloc = alloc;
	a->release = release;
	a->ctx = ctx;
}

static void *take(Arena *a, Place place, MemCat cat, size_t bytes, int zeroed)
{
	void *p = zeroed || !a->alloc_empty ? a->alloc(a->ctx, place, bytes) :
					      a->alloc_empty(a->ctx, place, bytes);
	if (!p)
		return NULL;
	a->n_allocs++;
	arena_count(a, place, cat, (double)bytes);
	return p;
}

void *arena_alloc(Arena *a, Place place, MemCat cat, size_t bytes)
{
	return take(a, place, cat, bytes, 1);
}

void *arena_alloc_empty(Arena *a, Place place, MemCat cat, size_t bytes)
{
	return take(a, place, cat, bytes, 0);
}

void arena_count(Arena *a, Place place, MemCat cat, double bytes)
{
	a->live[place] += bytes;
	a->cat[place][cat] += bytes;
	if (a->cat[place][cat] > a->cat_peak[place][cat])
		a->cat_peak[place][cat] = a->cat[place][cat];
	if (a->live[place] > a->peak[place]) {
		a->peak[place] = a->live[place];
		memcpy(a->at_peak[place], a->cat[place], sizeof(a->at_peak[place]));
		if (a->on_peak)
			a->on_peak(a->peak_ctx, place);
	}
}

void arena_free(Arena *a, Place place, MemCat cat, void *ptr, size_t bytes)
{
	if (!ptr)
		return;
	a->release(a->ctx, place, ptr);
	arena_count(a, place, cat, -(double)bytes);
}

void arena_reset_peaks(Arena *a)
{
	if (a->settle)
		a->settle(a->ctx);
	memcpy(a->peak, a->live, sizeof(a->peak));
	for (int p = 0; p < N_PLACES; p++) {
		memcpy(a->at_peak[p], a->cat[p], sizeof(a->at_peak[p]));
		memcpy(a->cat_peak[p], a->cat[p], sizeof(a->cat_peak[p]));
	}
}

double arena_held_peak(const Arena *a, Place place)
{
	double now, peak = -1;
	if (a->held)
		a->held(a->ctx, place, &now, &peak);
	if (peak < 0) /* the source has no figure for this place: the requests' */
		return place < N_PLACES ? a->peak[place] : NAN;
	return peak;
}

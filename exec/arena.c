#include "arena.h"

#include <stdlib.h>
#include <string.h>

void arena_init(Arena *a)
{
	memset(a, 0, sizeof(*a));
}

void *arena_alloc(Arena *a, Place place, MemCat cat, size_t bytes)
{
	void *p = calloc(1, bytes ? bytes : 1);
	if (!p)
		return NULL;
	a->n_allocs++;
	a->live[place] += (double)bytes;
	a->cat[place][cat] += (double)bytes;
	if (a->cat[place][cat] > a->cat_peak[place][cat])
		a->cat_peak[place][cat] = a->cat[place][cat];
	if (a->live[place] > a->peak[place]) {
		a->peak[place] = a->live[place];
		memcpy(a->at_peak[place], a->cat[place], sizeof(a->at_peak[place]));
	}
	return p;
}

void arena_free(Arena *a, Place place, MemCat cat, void *ptr, size_t bytes)
{
	if (!ptr)
		return;
	free(ptr);
	a->live[place] -= (double)bytes;
	a->cat[place][cat] -= (double)bytes;
}

void arena_reset_peaks(Arena *a)
{
	memcpy(a->peak, a->live, sizeof(a->peak));
	for (int p = 0; p < N_PLACES; p++) {
		memcpy(a->at_peak[p], a->cat[p], sizeof(a->at_peak[p]));
		memcpy(a->cat_peak[p], a->cat[p], sizeof(a->cat_peak[p]));
	}
}

#include "data.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t mix(uint64_t x)
{ /* splitmix64's finaliser: a fixed, well-spread hash of the sample index */
	x += 0x9e3779b97f4a7c15ULL;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
	return x ^ (x >> 31);
}

int data_open(DataSource *d, const char *path, int vocab, int T, PxError *err)
{
	memset(d, 0, sizeof(*d));
	d->vocab = vocab;
	if (!path)
		return 0;
	snprintf(d->path, sizeof(d->path), "%s", path);
	if (vocab < 256)
		return px_fail(err, PX_ERR_INPUT, "%s: byte-level tokens need a vocabulary of at least "
			       "256, the model has %d", path, vocab);
	FILE *f = fopen(path, "rb");
	if (!f)
		return px_fail(err, PX_ERR_INPUT, "%s: cannot open: %s", path, strerror(errno));
	size_t cap = 1 << 16;
	d->text = malloc(cap);
	while (d->text) {
		size_t n = fread(d->text + d->text_len, 1, cap - d->text_len, f);
		d->text_len += n;
		if (d->text_len < cap)
			break;
		unsigned char *grown = realloc(d->text, cap * 2);
		if (!grown) {
			free(d->text);
			d->text = NULL;
		} else {
			d->text = grown;
			cap *= 2;
		}
	}
	fclose(f);
	if (!d->text)
		return px_fail(err, PX_ERR_RUNTIME, "%s: out of memory reading it", path);
	if (d->text_len < (size_t)T + 2) {
		data_close(d);
		return px_fail(err, PX_ERR_INPUT, "%s: %zu bytes is shorter than one sequence of %d "
			       "tokens", path, d->text_len, T + 1);
	}
	return 0;
}

void data_close(DataSource *d)
{
	free(d->text);
	d->text = NULL;
}

void data_sample(const DataSource *d, uint64_t sample, int T, int *tokens)
{
	uint64_t h = mix(sample);
	if (d->text) {
		size_t start = (size_t)(h % (d->text_len - (size_t)T - 1));
		for (int i = 0; i <= T; i++)
			tokens[i] = d->text[start + (size_t)i];
		return;
	}
	/* count up from a random start by a step of 1..7 that the first tokens reveal */
	int step = 1 + (int)((h >> 32) % 7), t = (int)(h % (uint64_t)d->vocab);
	for (int i = 0; i <= T; i++) {
		tokens[i] = t;
		t = (t + step) % d->vocab;
	}
}

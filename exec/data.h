/* data: the token streams the executor trains on. Either byte-level tokens of a text file, or a
 * built-in generator whose sequences follow a rule the model can learn (each sequence counts up by
 * a step it shows in its first tokens), so the loss visibly falls. A sample is identified by its
 * global index, so every rank and every parallel layout sees the same global batch. */
#ifndef PX_EXEC_DATA_H
#define PX_EXEC_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "../engine/err.h"

typedef struct DataSource {
	int vocab;
	unsigned char *text; /* owned; NULL for the generator */
	size_t text_len;
	char path[1024];
} DataSource;

/* From a text file (vocab must be at least 256) or, path NULL, the generator. */
int data_open(DataSource *d, const char *path, int vocab, int T, PxError *err);
void data_close(DataSource *d);

/* Tokens (T + 1 of them) of global sample `sample`: inputs are tokens[0..T), targets [1..T]. */
void data_sample(const DataSource *d, uint64_t sample, int T, int *tokens);

#endif

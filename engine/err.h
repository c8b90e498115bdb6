/* err: the one error type of the library (engine/, sim/, db/).
 * Library functions return 0 on success or -1 on failure with a PxError filled in; they never exit().
 * The message is one line that names the file, the key and what was expected, ready to print as is. */
#ifndef PX_ERR_H
#define PX_ERR_H

#include <stddef.h>

enum {
	PX_ERR_NONE = 0,
	PX_ERR_RUNTIME = 1, /* I/O, database, out of memory: exit status 1 */
	PX_ERR_INPUT = 2,   /* the user's input is wrong: exit status 2 */
};

typedef struct PxError {
	int code;       /* PX_ERR_* */
	char msg[1024]; /* "file:line:col: key: expected ..., got ..." */
} PxError;

/* Fill err (which may be NULL) with code and a printf-style message; always returns -1. */
int px_fail(PxError *err, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Diagnostics that do not stop the run: warnings and keys understood but not modelled. */
typedef struct PxNotes {
	char **warnings;     /* owned; "file:line:col: unknown key 'x' in deepspeed; did you mean 'y'?" */
	int n_warnings;
	char **not_modelled; /* owned; "deepspeed.zero_optimization.zero_quantized_weights" */
	int n_not_modelled;
} PxNotes;

void px_notes_init(PxNotes *n);
void px_notes_free(PxNotes *n);
/* Append a formatted line; returns 0, or -1 when out of memory. */
int px_notes_warn(PxNotes *n, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int px_notes_not_modelled(PxNotes *n, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif

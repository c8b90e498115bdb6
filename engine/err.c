#include "err.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int px_fail(PxError *err, int code, const char *fmt, ...)
{
	if (!err)
		return -1;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
	va_end(ap);
	err->code = code;
	return -1;
}

void px_notes_init(PxNotes *n)
{
	memset(n, 0, sizeof(*n));
}

static void free_lines(char **v, int n)
{
	for (int i = 0; i < n; i++)
		free(v[i]);
	free(v);
}

void px_notes_free(PxNotes *n)
{
	if (!n)
		return;
	free_lines(n->warnings, n->n_warnings);
	free_lines(n->not_modelled, n->n_not_modelled);
	px_notes_init(n);
}

static int append_line(char ***v, int *n, const char *fmt, va_list ap)
{
	char buf[1024];
	vsnprintf(buf, sizeof(buf), fmt, ap);
	for (int i = 0; i < *n; i++)
		if (strcmp((*v)[i], buf) == 0)
			return 0; /* said once is enough */
	char **grown = realloc(*v, (size_t)(*n + 1) * sizeof(**v));
	if (!grown)
		return -1;
	*v = grown;
	if (!(grown[*n] = strdup(buf)))
		return -1;
	(*n)++;
	return 0;
}

int px_notes_warn(PxNotes *n, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int rc = append_line(&n->warnings, &n->n_warnings, fmt, ap);
	va_end(ap);
	return rc;
}

int px_notes_not_modelled(PxNotes *n, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int rc = append_line(&n->not_modelled, &n->n_not_modelled, fmt, ap);
	va_end(ap);
	return rc;
}

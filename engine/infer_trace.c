#include "infer_trace.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const COLUMNS[] = {"arrival_s", "prompt_tokens", "output_tokens",
				      "prefix_id", "prefix_tokens"};
#define HEADER3 "arrival_s,prompt_tokens,output_tokens"
#define HEADER5 HEADER3 ",prefix_id,prefix_tokens"

/* s without the spaces and line ends around it (in place) */
static char *trim(char *s)
{
	while (*s == ' ' || *s == '\t')
		s++;
	size_t n = strlen(s);
	while (n && strchr(" \t\r\n", s[n - 1]))
		s[--n] = '\0';
	return s;
}

/* Split line at commas into at most 5 trimmed fields; their count, or -1 for more. */
static int fields(char *line, char *f[5])
{
	for (int k = 0;; k++) {
		char *comma = strchr(line, ',');
		if (k == 5)
			return -1;
		if (comma)
			*comma = '\0';
		f[k] = trim(line);
		if (!comma)
			return k + 1;
		line = comma + 1;
	}
}

static int bad(InferTrace *t, PxError *err, const char *path, long long line, const char *what)
{
	infer_trace_free(t);
	return px_fail(err, PX_ERR_INPUT, "%s:%lld: %s", path, line, what);
}

/* The whole number in field f into *v, within lo..hi; -1 when it is not one. */
static int whole(const char *f, long long lo, long long hi, long long *v)
{
	char *end;
	errno = 0;
	*v = strtoll(f, &end, 10);
	return !*f || *end || errno || *v < lo || *v > hi ? -1 : 0;
}

/* One request's fields (n of them: 3, or 5 with the prefix) into r; NULL, or what is wrong. */
static const char *request(char *f[5], int n, const InferRequest *prev, InferRequest *r)
{
	char *end;
	errno = 0;
	r->arrival_s = strtod(f[0], &end);
	if (!*f[0] || *end || errno || !isfinite(r->arrival_s))
		return "arrival_s: expected a number of seconds";
	if (prev && r->arrival_s < prev->arrival_s)
		return "arrival_s: earlier than the request before it; expected arrivals in order";
	if (whole(f[1], 1, 1LL << 24, &r->prompt_tokens))
		return "prompt_tokens: expected a whole number from 1 to 2^24";
	if (whole(f[2], 1, 1LL << 24, &r->output_tokens))
		return "output_tokens: expected a whole number from 1 to 2^24";
	r->prefix_id = r->prefix_tokens = 0;
	if (n < 5)
		return NULL;
	if (whole(f[3], 0, LLONG_MAX, &r->prefix_id))
		return "prefix_id: expected a whole number, 0 for none";
	if (whole(f[4], 0, r->prompt_tokens, &r->prefix_tokens))
		return "prefix_tokens: expected a whole number from 0 to the request's prompt_tokens";
	if (!r->prefix_id && r->prefix_tokens)
		return "prefix_tokens: expected 0 with prefix_id 0 (no shared prefix)";
	return NULL;
}

int infer_trace_load(const char *path, InferTrace *t, PxError *err)
{
	memset(t, 0, sizeof(*t));
	snprintf(t->path, sizeof(t->path), "%s", path);
	FILE *in = fopen(path, "r");
	if (!in)
		return px_fail(err, PX_ERR_INPUT, "%s: cannot read the trace: %s", path,
			       strerror(errno));
	char buf[4096], what[160];
	long long line = 0, cap = 0;
	int header = 0, rc = 0;
	while (!rc && fgets(buf, sizeof(buf), in)) {
		line++;
		char *s = trim(buf), *f[5];
		if (!*s || *s == '#')
			continue;
		int n = fields(s, f);
		if (header ? n != header : n != 3 && n != 5) {
			snprintf(what, sizeof(what), "expected %s comma-separated columns: %s",
				 header == 5 ? "5" : header ? "3" : "3 or 5",
				 header == 5 ? HEADER5 : header ? HEADER3 : HEADER3 " (and "
				 "prefix_id,prefix_tokens)");
			rc = bad(t, err, path, line, what);
			break;
		}
		if (!header) {
			for (int i = 0; i < n && !rc; i++)
				if (strcmp(f[i], COLUMNS[i])) {
					snprintf(what, sizeof(what), "column %d of the header is \"%s\"; "
						 "expected %s", i + 1, f[i], n == 5 ? HEADER5 : HEADER3);
					rc = bad(t, err, path, line, what);
				}
			header = n;
			t->prefixes = n == 5;
			continue;
		}
		if (t->n == INFER_TRACE_MAX_REQUESTS) {
			snprintf(what, sizeof(what), "more than %lld requests", INFER_TRACE_MAX_REQUESTS);
			rc = bad(t, err, path, line, what);
			break;
		}
		if (t->n == cap) {
			cap = cap ? 2 * cap : 1024;
			InferRequest *grown = realloc(t->req, (size_t)cap * sizeof(*grown));
			if (!grown) {
				infer_trace_free(t);
				rc = px_fail(err, PX_ERR_RUNTIME, "out of memory");
				break;
			}
			t->req = grown;
		}
		const char *why = request(f, n, t->n ? &t->req[t->n - 1] : NULL, &t->req[t->n]);
		if (why)
			rc = bad(t, err, path, line, why);
		else
			t->n++;
	}
	int read_err = ferror(in);
	fclose(in);
	if (rc)
		return rc;
	if (read_err)
		return bad(t, err, path, line, "a read error");
	if (!header)
		return bad(t, err, path, line, "no header; expected arrival_s,prompt_tokens,"
			   "output_tokens");
	if (t->n < 2 || t->req[t->n - 1].arrival_s <= t->req[0].arrival_s)
		return bad(t, err, path, line, "expected at least 2 requests arriving at different "
			   "times (the trace's rate is their count over its span)");
	return 0;
}

void infer_trace_free(InferTrace *t)
{
	if (!t)
		return;
	free(t->req);
	t->req = NULL;
	t->n = 0;
}

void infer_trace_means(const InferTrace *t, double *rate, long long *prompt, long long *output)
{
	double p = 0, o = 0;
	for (long long i = 0; i < t->n; i++)
		p += (double)t->req[i].prompt_tokens, o += (double)t->req[i].output_tokens;
	*rate = (double)(t->n - 1) / (t->req[t->n - 1].arrival_s - t->req[0].arrival_s);
	*prompt = (long long)fmax(1, llround(p / (double)t->n));
	*output = (long long)fmax(1, llround(o / (double)t->n));
}

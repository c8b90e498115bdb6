#include "infer_trace.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const COLUMNS[] = {"arrival_s", "prompt_tokens", "output_tokens"};

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

/* Split line at commas into exactly 3 trimmed fields; 0, or -1 for another count. */
static int fields(char *line, char *f[3])
{
	int k = 0;
	for (char *p = line;; k++) {
		char *comma = strchr(p, ',');
		if (k == 3)
			return -1;
		if (comma)
			*comma = '\0';
		f[k] = trim(p);
		if (!comma)
			return k == 2 ? 0 : -1;
		p = comma + 1;
	}
}

static int bad(InferTrace *t, PxError *err, const char *path, long long line, const char *what)
{
	infer_trace_free(t);
	return px_fail(err, PX_ERR_INPUT, "%s:%lld: %s", path, line, what);
}

/* One request's fields into r; NULL, or what is wrong. */
static const char *request(char *f[3], const InferRequest *prev, InferRequest *r)
{
	char *end;
	errno = 0;
	r->arrival_s = strtod(f[0], &end);
	if (!*f[0] || *end || errno || !isfinite(r->arrival_s))
		return "arrival_s: expected a number of seconds";
	if (prev && r->arrival_s < prev->arrival_s)
		return "arrival_s: earlier than the request before it; expected arrivals in order";
	long long *tok[2] = {&r->prompt_tokens, &r->output_tokens};
	for (int i = 0; i < 2; i++) {
		errno = 0;
		*tok[i] = strtoll(f[i + 1], &end, 10);
		if (!*f[i + 1] || *end || errno || *tok[i] < 1 || *tok[i] > (1LL << 24))
			return i ? "output_tokens: expected a whole number from 1 to 2^24" :
				   "prompt_tokens: expected a whole number from 1 to 2^24";
	}
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
		char *s = trim(buf), *f[3];
		if (!*s || *s == '#')
			continue;
		if (fields(s, f)) {
			rc = bad(t, err, path, line, "expected 3 comma-separated columns: arrival_s,"
				 "prompt_tokens,output_tokens");
			break;
		}
		if (!header) {
			for (int i = 0; i < 3 && !rc; i++)
				if (strcmp(f[i], COLUMNS[i])) {
					snprintf(what, sizeof(what), "column %d of the header is \"%s\"; "
						 "expected arrival_s,prompt_tokens,output_tokens", i + 1,
						 f[i]);
					rc = bad(t, err, path, line, what);
				}
			header = 1;
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
		const char *why = request(f, t->n ? &t->req[t->n - 1] : NULL, &t->req[t->n]);
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

#include "allocconf.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Options PyTorch's allocator configuration knows whose effect Parallax does not price. */
static const char *const NOTED[] = {
	"garbage_collection_threshold", "backend", "release_lock_on_cudamalloc",
	"pinned_use_cuda_host_register", "pinned_num_register_threads",
	"pinned_use_background_threads", NULL};

unsigned alloc_conf_divisions(const AllocConf *conf, size_t size)
{
	int log = 0; /* floor(log2(size)) */
	while (log < 63 && (size >> (log + 1)))
		log++;
	int i = log - 20; /* the intervals start at 1 MiB */
	return conf->divisions[i < 0 ? 0 : i >= ALLOC_CONF_INTERVALS ? ALLOC_CONF_INTERVALS - 1 : i];
}

static int power_of_two(long long v)
{
	return v > 0 && !(v & (v - 1));
}

/* The whole number s[0, n) spells, or -1 when it spells none (or one above 2^30). */
static long long whole(const char *s, size_t n)
{
	char buf[32];
	if (!n || n >= sizeof(buf))
		return -1;
	memcpy(buf, s, n);
	buf[n] = '\0';
	char *end;
	errno = 0;
	long long v = strtoll(buf, &end, 10);
	return *end || errno || v < 0 || v > (1LL << 30) ? -1 : v;
}

/* roundup_power2_divisions' value: "4", or "[256:1,512:2,>:8]" (see allocconf.h) */
static int divisions_option(const char *value, const char *where, AllocConf *out, PxError *err)
{
	size_t n = strlen(value);
	if (*value != '[') {
		long long d = whole(value, n);
		if (!power_of_two(d))
			return px_fail(err, PX_ERR_INPUT, "%s: roundup_power2_divisions: expected a "
				       "power of two or a list such as [256:1,512:2,>:8], got \"%s\"",
				       where, value);
		for (int i = 0; i < ALLOC_CONF_INTERVALS; i++)
			out->divisions[i] = (unsigned)d;
		return 0;
	}
	if (n < 2 || value[n - 1] != ']')
		return px_fail(err, PX_ERR_INPUT, "%s: roundup_power2_divisions: expected a list "
			       "closed by ']', got \"%s\"", where, value);
	int first = 1, last = 0;
	for (const char *p = value + 1; p < value + n - 1;) {
		const char *end = memchr(p, ',', (size_t)(value + n - 1 - p));
		if (!end)
			end = value + n - 1;
		const char *colon = memchr(p, ':', (size_t)(end - p));
		long long mib = colon ? whole(p, (size_t)(colon - p)) : -1;
		long long d = colon ? whole(colon + 1, (size_t)(end - colon - 1)) : -1;
		int rest = colon && colon - p == 1 && *p == '>';
		if ((!rest && !power_of_two(mib)) || (d != 0 && !power_of_two(d)))
			return px_fail(err, PX_ERR_INPUT, "%s: roundup_power2_divisions: expected "
				       "entries MiB:divisions or >:divisions, MiB a power of two and "
				       "divisions 0 or a power of two, got \"%.*s\"", where, (int)(end - p), p);
		if (rest) {
			for (int i = last; i < ALLOC_CONF_INTERVALS; i++)
				out->divisions[i] = (unsigned)d;
		} else {
			int i = 0;
			while ((mib >> (i + 1)) && i < ALLOC_CONF_INTERVALS - 1)
				i++;
			for (int j = 0; first && j < i; j++)
				out->divisions[j] = (unsigned)d;
			out->divisions[i] = (unsigned)d;
			first = 0, last = i;
		}
		p = end + 1;
	}
	return 0;
}

/* max_split_size_mb's and max_non_split_rounding_mb's value in bytes (out), above 20 MiB */
static int mib_option(const char *key, const char *value, const char *where, double *out,
		      PxError *err)
{
	long long mb = whole(value, strlen(value));
	/* CUDAAllocatorConfig: "max_split_size_mb too small, must be > 20" (kLargeBuffer) */
	if (mb <= 20)
		return px_fail(err, PX_ERR_INPUT, "%s: %s: expected a whole number of MiB above 20, "
			       "got \"%s\"", where, key, value);
	*out = (double)mb * 1048576.0;
	return 0;
}

/* One option, key and value as written (value may be empty). */
static int option(const char *key, const char *value, const char *where, AllocConf *out,
		  PxNotes *notes, PxError *err)
{
	if (!strcmp(key, "expandable_segments")) {
		if (strcmp(value, "True") && strcmp(value, "False"))
			return px_fail(err, PX_ERR_INPUT, "%s: expandable_segments: expected True or "
				       "False, got \"%s\"", where, value);
		out->expandable = !strcmp(value, "True");
		return 0;
	}
	if (!strcmp(key, "max_split_size_mb"))
		return mib_option(key, value, where, &out->max_split_bytes, err);
	if (!strcmp(key, "max_non_split_rounding_mb"))
		return mib_option(key, value, where, &out->max_non_split_bytes, err);
	if (!strcmp(key, "roundup_power2_divisions"))
		return divisions_option(value, where, out, err);
	for (int i = 0; NOTED[i]; i++)
		if (!strcmp(key, NOTED[i]))
			return px_notes_not_modelled(notes, "%s: %s (it changes nothing Parallax "
						     "prices)", where, key) ?
				       px_fail(err, PX_ERR_RUNTIME, "out of memory") :
				       0;
	return px_fail(err, PX_ERR_INPUT, "%s: \"%s\" is not an option of PyTorch's CUDA allocator; "
		       "expected expandable_segments, max_split_size_mb or another of "
		       "PYTORCH_CUDA_ALLOC_CONF's", where, key);
}

/* s[0, n) without the spaces around it, into buf */
static void trimmed(const char *s, size_t n, char *buf, size_t cap)
{
	while (n && isspace((unsigned char)*s))
		s++, n--;
	while (n && isspace((unsigned char)s[n - 1]))
		n--;
	if (n >= cap)
		n = cap - 1;
	memcpy(buf, s, n);
	buf[n] = '\0';
}

int alloc_conf_parse(const char *text, const char *where, AllocConf *out, PxNotes *notes,
		     PxError *err)
{
	*out = (AllocConf){0};
	const char *p = text;
	while (*p) {
		/* the option runs to the next comma outside brackets (roundup_power2_divisions'
		 * "[256:1,512:2]") */
		const char *end = p;
		for (int depth = 0; *end && (*end != ',' || depth); end++)
			depth += *end == '[' ? 1 : *end == ']' ? -1 : 0;
		const char *colon = memchr(p, ':', (size_t)(end - p));
		char key[64], value[256];
		trimmed(p, (size_t)((colon ? colon : end) - p), key, sizeof(key));
		trimmed(colon ? colon + 1 : end, colon ? (size_t)(end - colon - 1) : 0, value,
			sizeof(value));
		if (*key && option(key, value, where, out, notes, err))
			return -1;
		p = *end ? end + 1 : end;
	}
	return 0;
}

void alloc_conf_describe(const AllocConf *conf, char *buf, size_t n)
{
	size_t at = 0;
	buf[0] = '\0';
#define PUT(...) at += (size_t)snprintf(buf + at, at < n ? n - at : 0, __VA_ARGS__)
#define SEP (at ? ", " : " with ")
	if (conf->expandable)
		PUT("%sexpandable_segments", SEP);
	if (conf->max_split_bytes > 0)
		PUT("%smax_split_size_mb %.0f", SEP, conf->max_split_bytes / 1048576);
	if (conf->max_non_split_bytes > 0)
		PUT("%smax_non_split_rounding_mb %.0f", SEP, conf->max_non_split_bytes / 1048576);
	int same = 1;
	for (int i = 1; i < ALLOC_CONF_INTERVALS; i++)
		same &= conf->divisions[i] == conf->divisions[0];
	if (same && conf->divisions[0] > 1) {
		PUT("%sroundup_power2_divisions %u", SEP, conf->divisions[0]);
	} else if (!same) {
		PUT("%sroundup_power2_divisions [", SEP);
		for (int i = 0; i < ALLOC_CONF_INTERVALS; i++)
			if (!i || conf->divisions[i] != conf->divisions[i - 1])
				PUT("%s%lu:%u", i ? "," : "", 1UL << i, conf->divisions[i]);
		PUT("]");
	}
#undef SEP
#undef PUT
	if (at >= n && n > 0)
		buf[n - 1] = '\0';
}

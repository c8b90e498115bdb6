#include "allocconf.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* Options PyTorch's allocator configuration knows whose effect Parallax does not price. */
static const char *const NOTED[] = {
	"garbage_collection_threshold", "roundup_power2_divisions", "max_non_split_rounding_mb",
	"backend", "release_lock_on_cudamalloc", "pinned_use_cuda_host_register",
	"pinned_num_register_threads", "pinned_use_background_threads", NULL};

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
	if (!strcmp(key, "max_split_size_mb")) {
		char *end;
		errno = 0;
		long long mb = strtoll(value, &end, 10);
		/* CUDAAllocatorConfig: "max_split_size_mb too small, must be > 20" (kLargeBuffer) */
		if (!*value || *end || errno || mb <= 20 || mb > (1LL << 30))
			return px_fail(err, PX_ERR_INPUT, "%s: max_split_size_mb: expected a whole "
				       "number of MiB above 20, got \"%s\"", where, value);
		out->max_split_bytes = (double)mb * 1048576.0;
		return 0;
	}
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

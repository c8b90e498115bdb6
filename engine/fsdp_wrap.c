/* fsdp_wrap: torch's size-based auto-wrap over one block's modules (fsdp_wrap.h). */
#include "fsdp_wrap.h"

#include <stdio.h>
#include <string.h>

/* A parameter tensor under its module's path ("attn.q" for "attn.q.weight"). The routed experts'
 * tensors (one ModelTensor holds all E) sit in a ModuleList, "<first>.experts", of E identical
 * modules, one named "*" here standing for all of them (Mixtral's block_sparse_moe.experts[i]). */
typedef struct Entry {
	char path[160];
	long long numel; /* one copy's */
	long long copies;
} Entry;

/* Whether path lies at or under prefix ("" holds everything). */
static int under(const char *path, const char *prefix)
{
	size_t n = strlen(prefix);
	return !n || (!strncmp(path, prefix, n) && (path[n] == '\0' || path[n] == '.'));
}

/* The module's parameters: one copy's inside an expert ("*"), all copies' elsewhere. */
static long long total_of(const Entry *e, int n, const char *prefix, int one_copy)
{
	long long t = 0;
	for (int i = 0; i < n; i++)
		if (under(e[i].path, prefix))
			t += e[i].numel * (one_copy ? 1 : e[i].copies);
	return t;
}

/* torch's _recursive_wrap on the module at prefix: its children first, then the module itself
 * when what they left reaches min (a ModuleList never). Returns the elements wrapped at or under
 * it; *pieces counts the units made. */
static long long walk(const Entry *e, int n, const char *prefix, double min, int one_copy,
		      int *pieces)
{
	size_t len = strlen(prefix);
	long long wrapped = 0;
	char seen[MODEL_MAX_TENSORS][160];
	int n_seen = 0;
	for (int i = 0; i < n; i++) {
		if (!under(e[i].path, prefix) || strlen(e[i].path) == len)
			continue;
		const char *rest = e[i].path + (len ? len + 1 : 0);
		size_t c = strcspn(rest, ".");
		char child[160];
		snprintf(child, sizeof(child), "%s%s%.*s", prefix, len ? "." : "", (int)c, rest);
		int dup = 0;
		for (int k = 0; k < n_seen && !dup; k++)
			dup = !strcmp(seen[k], child);
		if (dup)
			continue;
		snprintf(seen[n_seen++], sizeof(seen[0]), "%s", child);
		if (c == 1 && rest[0] == '*') { /* the E experts alike: one walked, E counted */
			long long copies = e[i].copies;
			int one = 0;
			wrapped += copies * walk(e, n, child, min, 1, &one);
			*pieces += (int)copies * one;
		} else {
			wrapped += walk(e, n, child, min, one_copy, pieces);
		}
	}
	long long total = total_of(e, n, prefix, one_copy);
	const char *last = strrchr(prefix, '.');
	int list = !strcmp(last ? last + 1 : prefix, "experts");
	if (!list && (double)(total - wrapped) >= min) {
		(*pieces)++;
		return total;
	}
	return wrapped;
}

int fsdp_wrap_size_based(const ModelSpec *m, int unit, double min_num_params, FsdpWrap *out)
{
	ModelTensor t[MODEL_MAX_TENSORS];
	Entry e[MODEL_MAX_TENSORS];
	int n = model_unit_tensors(m, unit, t);
	if (n < 0 || n > MODEL_MAX_TENSORS)
		return -1;
	for (int i = 0; i < n; i++) {
		const char *dot = strrchr(t[i].name, '.');
		int mod = dot ? (int)(dot - t[i].name) : 0; /* the module's path: the name less its
							       last part */
		e[i].copies = t[i].expert && m->experts > 0 ? m->experts : 1;
		e[i].numel = t[i].numel / e[i].copies;
		if (e[i].copies > 1) { /* "mlp.gate.weight" -> "mlp.experts.*.gate" */
			size_t first = strcspn(t[i].name, ".");
			if ((int)first >= mod)
				snprintf(e[i].path, sizeof(e[i].path), "%.*s.experts.*", mod, t[i].name);
			else
				snprintf(e[i].path, sizeof(e[i].path), "%.*s.experts.*.%.*s",
					 (int)first, t[i].name, mod - (int)first - 1,
					 t[i].name + first + 1);
		} else {
			snprintf(e[i].path, sizeof(e[i].path), "%.*s", mod, t[i].name);
		}
	}
	*out = (FsdpWrap){0};
	out->wrapped = walk(e, n, "", min_num_params, 0, &out->pieces);
	out->leftover = total_of(e, n, "", 0) - out->wrapped;
	return 0;
}

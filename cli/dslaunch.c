#include "dslaunch.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void dslaunch_init(DsLaunch *l)
{
	memset(l, 0, sizeof(*l));
	l->num_nodes = l->num_gpus = l->master_port = -1;
}

void dslaunch_free(DsLaunch *l)
{
	if (!l)
		return;
	free(l->hosts);
	l->hosts = NULL;
	l->n_hosts = 0;
}

int dslaunch_any(const DsLaunch *l)
{
	return l->hostfile || l->include || l->exclude || l->model || l->deepspeed_config ||
	       l->gpu || l->master_addr || l->num_nodes >= 0 || l->num_gpus >= 0 ||
	       l->master_port >= 0;
}

int dslaunch_cluster_given(const DsLaunch *l)
{
	return l->hostfile || l->include || l->exclude || l->num_nodes >= 0 || l->num_gpus >= 0;
}

int dslaunch_option(DsLaunch *l, int c, const char *arg, const char *cmd)
{
	static const char *const numbers[] = {"num_nodes", "num_gpus", "master_port"};
	const char **strs[] = {&l->model, &l->deepspeed_config, &l->gpu, &l->hostfile, &l->include,
			       &l->exclude, &l->master_addr};
	long long *nums[] = {&l->num_nodes, &l->num_gpus, &l->master_port};
	int i = c - DSL_OPT;
	if (i < 0 || i > 9)
		return 0;
	if (i < 7) {
		*strs[i] = arg;
		return 1;
	}
	char *end;
	long long hi = i == 9 ? 65535 : 1 << 20;
	errno = 0;
	long long v = strtoll(arg, &end, 10);
	if (errno || *end || end == arg || v < 1 || v > hi) {
		fprintf(stderr, "parallax %s: --%s: expected an integer from 1 to %lld, got '%s'\n",
			cmd, numbers[i - 7], hi, arg);
		return -1;
	}
	*nums[i - 7] = v;
	return 1;
}

int dslaunch_write_mpi_hostfile(const DsLaunch *l, char *buf, size_t n, PxError *err)
{
	snprintf(buf, n, "%s/px-hostfile-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
	int fd = mkstemp(buf);
	FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
	if (!f) {
		if (fd >= 0)
			close(fd);
		return px_fail(err, PX_ERR_RUNTIME, "%s: cannot write: %s", buf, strerror(errno));
	}
	for (int i = 0; i < l->n_hosts; i++)
		fprintf(f, "%s slots=%d\n", l->hosts[i].name,
			__builtin_popcountll(l->hosts[i].active));
	if (fclose(f)) {
		remove(buf);
		return px_fail(err, PX_ERR_RUNTIME, "%s: write failed", buf);
	}
	return 0;
}

static uint64_t all_slots(int n)
{
	return n >= DSL_MAX_SLOTS ? ~0ULL : (1ULL << n) - 1;
}

/* ---- the hostfile ---- */

/* One stripped line "HOST slots=N..." into h; 0, or -1 when it is not one. */
static int parse_host_line(const char *s, DsHost *h)
{
	size_t n = 0;
	while (s[n] && !isspace((unsigned char)s[n]))
		n++;
	if (n == 0 || n >= sizeof(h->name) || !isspace((unsigned char)s[n]))
		return -1;
	memcpy(h->name, s, n);
	h->name[n] = '\0';
	s += n;
	while (isspace((unsigned char)*s))
		s++;
	if (strncmp(s, "slots=", 6) || !isdigit((unsigned char)s[6]))
		return -1;
	errno = 0;
	long v = strtol(s + 6, NULL, 10);
	h->slots = errno || v > 1 << 30 ? -1 : (int)v;
	return 0;
}

int dslaunch_parse_hostfile(const char *name, const char *text, DsHost **hosts, int *n,
			    PxError *err)
{
	DsHost *hs = calloc(DSL_MAX_HOSTS, sizeof(*hs));
	int count = 0, line = 0;
	char buf[1024];
	if (!hs)
		return px_fail(err, PX_ERR_RUNTIME, "out of memory");
	for (const char *p = text; *p;) {
		const char *eol = strchr(p, '\n');
		size_t len = eol ? (size_t)(eol - p) : strlen(p);
		line++;
		size_t b = 0, e = len;
		while (b < e && isspace((unsigned char)p[b]))
			b++;
		while (e > b && isspace((unsigned char)p[e - 1]))
			e--;
		if (e - b >= sizeof(buf)) {
			free(hs);
			return px_fail(err, PX_ERR_INPUT, "%s:%d: a line of %zu characters; expected "
				       "'HOST slots=N'", name, line, e - b);
		}
		memcpy(buf, p + b, e - b);
		buf[e - b] = '\0';
		p = eol ? eol + 1 : p + len;
		if (buf[0] == '\0' || buf[0] == '#')
			continue;
		DsHost h = {.line = line};
		const char *why = NULL;
		if (parse_host_line(buf, &h))
			why = "expected 'HOST slots=N' (DeepSpeed: \"Hostfile contains a bad entry\")";
		else if (h.slots < 1 || h.slots > DSL_MAX_SLOTS)
			why = "slots must be 1 to 64";
		else if (count == DSL_MAX_HOSTS)
			why = "more than 4096 hosts";
		if (why) {
			free(hs);
			return px_fail(err, PX_ERR_INPUT, "%s:%d: %s, got '%s'", name, line, why, buf);
		}
		for (int i = 0; i < count; i++)
			if (!strcmp(hs[i].name, h.name)) {
				int first = hs[i].line;
				free(hs);
				return px_fail(err, PX_ERR_INPUT, "%s:%d: host %s is already defined on "
					       "line %d (DeepSpeed: \"Hostfile contains multiple "
					       "entries\")", name, line, h.name, first);
			}
		h.active = all_slots(h.slots);
		hs[count++] = h;
	}
	if (!count) {
		free(hs);
		return px_fail(err, PX_ERR_INPUT, "%s: no 'HOST slots=N' line (DeepSpeed: \"Hostfile "
			       "is empty or not formatted correctly\")", name);
	}
	*hosts = hs;
	*n = count;
	return 0;
}

/* ---- --include / --exclude ---- */

static int find_host(const DsHost *hosts, int n, const char *name)
{
	for (int i = 0; i < n; i++)
		if (!strcmp(hosts[i].name, name))
			return i;
	return -1;
}

/* One "NAME[:SLOT,...]" of flag's value: the host's index and the slots named (all when none). */
static int parse_node_spec(const char *flag, char *spec, const DsHost *hosts, int n, int *idx,
			   uint64_t *slots, PxError *err)
{
	char *colon = strchr(spec, ':');
	if (colon)
		*colon = '\0';
	if ((*idx = find_host(hosts, n, spec)) < 0)
		return px_fail(err, PX_ERR_INPUT, "--%s: host '%s' is not in the hostfile", flag, spec);
	if (!colon) {
		*slots = all_slots(hosts[*idx].slots);
		return 0;
	}
	*slots = 0;
	for (char *tok = strtok(colon + 1, ","); tok; tok = strtok(NULL, ",")) {
		char *end;
		long v = strtol(tok, &end, 10);
		if (*end || end == tok || v < 0 || v >= hosts[*idx].slots)
			return px_fail(err, PX_ERR_INPUT, "--%s: host '%s' has no slot '%s' (slots 0 to "
				       "%d)", flag, spec, tok, hosts[*idx].slots - 1);
		*slots |= 1ULL << v;
	}
	if (!*slots)
		return px_fail(err, PX_ERR_INPUT, "--%s: host '%s': expected slots after ':'", flag,
			       spec);
	return 0;
}

int dslaunch_filter(DsHost *hosts, int *n, const char *include, const char *exclude,
		    PxError *err)
{
	if (include && exclude)
		return px_fail(err, PX_ERR_INPUT, "--include and --exclude exclude each other (as in "
			       "DeepSpeed)");
	const char *flag = include ? "include" : "exclude", *value = include ? include : exclude;
	if (!value)
		return 0;
	char *copy = strdup(value), *save = NULL;
	uint64_t keep[DSL_MAX_HOSTS];
	if (!copy)
		return px_fail(err, PX_ERR_RUNTIME, "out of memory");
	for (int i = 0; i < *n; i++)
		keep[i] = include ? 0 : hosts[i].active;
	for (char *spec = strtok_r(copy, "@", &save); spec; spec = strtok_r(NULL, "@", &save)) {
		int idx;
		uint64_t slots = 0;
		char one[512];
		snprintf(one, sizeof(one), "%s", spec);
		if (parse_node_spec(flag, one, hosts, *n, &idx, &slots, err)) {
			free(copy);
			return -1;
		}
		keep[idx] = include ? keep[idx] | slots : keep[idx] & ~slots;
	}
	free(copy);
	int m = 0; /* hostfile order kept, hosts with no slot left dropped */
	for (int i = 0; i < *n; i++) {
		hosts[i].active = keep[i];
		if (keep[i])
			hosts[m++] = hosts[i];
	}
	*n = m;
	if (!m)
		return px_fail(err, PX_ERR_INPUT, "--%s %s leaves no GPU", flag, value);
	return 0;
}

/* ---- resolving the cluster ---- */

static int read_text(const char *path, char **text, PxError *err)
{
	FILE *f = fopen(path, "r");
	if (!f)
		return px_fail(err, PX_ERR_INPUT, "%s: cannot open: %s", path, strerror(errno));
	size_t cap = 1 << 16, len = 0;
	char *buf = malloc(cap + 1);
	size_t got;
	while (buf && (got = fread(buf + len, 1, cap - len, f)) > 0) {
		len += got;
		if (len == cap && cap < (16u << 20)) {
			char *more = realloc(buf, 2 * cap + 1);
			if (!more)
				free(buf);
			buf = more;
			cap *= 2;
		} else if (len == cap) {
			break;
		}
	}
	fclose(f);
	if (!buf)
		return px_fail(err, PX_ERR_RUNTIME, "out of memory");
	buf[len] = '\0';
	*text = buf;
	return 0;
}

static int popcount(uint64_t x)
{
	return __builtin_popcountll(x);
}

int dslaunch_resolve(DsLaunch *l, int for_run, long long *nodes, long long *gpus_per_node,
		     PxError *err)
{
	if ((l->num_nodes >= 0 || l->num_gpus >= 0) && (l->include || l->exclude))
		return px_fail(err, PX_ERR_INPUT, "--num_nodes/--num_gpus cannot be combined with "
			       "--include/--exclude (as in DeepSpeed)");
	if (!l->hostfile) {
		if (l->include || l->exclude)
			return px_fail(err, PX_ERR_INPUT, "--%s needs --hostfile",
				       l->include ? "include" : "exclude");
		if (l->num_gpus < 0)
			return px_fail(err, PX_ERR_INPUT, "--num_gpus N (GPUs per node) or --hostfile "
				       "FILE is needed: there are no local GPUs to count");
		if (for_run && l->num_nodes > 1)
			return px_fail(err, PX_ERR_INPUT, "--num_nodes %lld needs --hostfile (DeepSpeed: "
				       "\"Num nodes is >1 but no extra nodes available via "
				       "hostfile\")", l->num_nodes);
		*nodes = l->num_nodes > 0 ? l->num_nodes : 1;
		*gpus_per_node = l->num_gpus;
		return 0;
	}
	char *text = NULL;
	if (read_text(l->hostfile, &text, err))
		return -1;
	dslaunch_free(l);
	int rc = dslaunch_parse_hostfile(l->hostfile, text, &l->hosts, &l->n_hosts, err);
	free(text);
	if (rc || dslaunch_filter(l->hosts, &l->n_hosts, l->include, l->exclude, err))
		return -1;
	if (l->num_nodes > 0 && l->num_nodes < l->n_hosts) /* the first hosts, as DeepSpeed */
		l->n_hosts = (int)l->num_nodes;
	for (int i = 0; i < l->n_hosts && l->num_gpus > 0; i++)
		l->hosts[i].active = all_slots((int)l->num_gpus);
	int per = popcount(l->hosts[0].active);
	for (int i = 1; i < l->n_hosts; i++)
		if (popcount(l->hosts[i].active) != per)
			return px_fail(err, PX_ERR_INPUT, "%s:%d: host %s has %d GPU(s) in use, %s %d: "
				       "the cluster model needs the same count on every node",
				       l->hostfile, l->hosts[i].line, l->hosts[i].name,
				       popcount(l->hosts[i].active), l->hosts[0].name, per);
	*nodes = l->n_hosts;
	*gpus_per_node = per;
	return 0;
}

/* ---- the scenario ---- */

/* the model's config.json: the path itself, or the folder's config.json */
static int model_file(const char *model, char *buf, size_t n, PxError *err)
{
	struct stat st;
	if (stat(model, &st))
		return px_fail(err, PX_ERR_INPUT, "--model %s: %s", model, strerror(errno));
	if (S_ISDIR(st.st_mode)) {
		snprintf(buf, n, "%s/config.json", model);
		if (stat(buf, &st) || !S_ISREG(st.st_mode))
			return px_fail(err, PX_ERR_INPUT, "--model %s: a folder without a config.json",
				       model);
	} else {
		snprintf(buf, n, "%s", model);
	}
	return 0;
}

/* a file's stem, or its folder's name for a config.json */
static void stem(const char *path, char *out, size_t n)
{
	char copy[4096], dir[4096];
	if (!realpath(path, copy)) /* "config.json" in the current folder: the folder's name */
		snprintf(copy, sizeof(copy), "%s", path);
	snprintf(dir, sizeof(dir), "%s", copy);
	const char *base = basename(copy);
	if (!strcmp(base, "config.json"))
		base = basename(dirname(dir));
	snprintf(out, n, "%s", base);
	char *dot = strrchr(out, '.');
	if (dot && dot != out)
		*dot = '\0';
}

char *dslaunch_scenario_text(const DsLaunch *l, long long nodes, long long gpus_per_node,
			     PxError *err)
{
	char model[1024], name[600], m_stem[256], d_stem[256];
	if (!l->model || !l->gpu) {
		px_fail(err, PX_ERR_INPUT, "the launcher flags need --model CONFIG and --gpu NAME "
			"(parallax gpus lists the names), with --deepspeed_config FILE");
		return NULL;
	}
	if (model_file(l->model, model, sizeof(model), err))
		return NULL;
	stem(model, m_stem, sizeof(m_stem));
	stem(l->deepspeed_config ? l->deepspeed_config : "default", d_stem, sizeof(d_stem));
	snprintf(name, sizeof(name), "%s-%s", m_stem, d_stem);
	cJSON *j = cJSON_CreateObject(), *c;
	if (!j || !cJSON_AddStringToObject(j, "name", name) ||
	    !cJSON_AddStringToObject(j, "model", model) ||
	    (l->deepspeed_config && !cJSON_AddStringToObject(j, "deepspeed", l->deepspeed_config)) ||
	    !(c = cJSON_AddObjectToObject(j, "cluster")) ||
	    !cJSON_AddStringToObject(c, "gpu", l->gpu) ||
	    !cJSON_AddNumberToObject(c, "nodes", (double)nodes) ||
	    !cJSON_AddNumberToObject(c, "gpus_per_node", (double)gpus_per_node)) {
		cJSON_Delete(j);
		px_fail(err, PX_ERR_RUNTIME, "out of memory");
		return NULL;
	}
	char *text = cJSON_Print(j);
	cJSON_Delete(j);
	if (!text)
		px_fail(err, PX_ERR_RUNTIME, "out of memory");
	return text;
}

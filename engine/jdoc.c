#include "jdoc.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- positions in the text ---- */

/* 1-based line and byte column of text[off]. */
static void text_line_col(const char *text, size_t off, int *line, int *col)
{
	size_t line_start = 0;

	*line = 1;
	for (size_t i = 0; i < off && text[i]; i++) {
		if (text[i] == '\n') {
			(*line)++;
			line_start = i + 1;
		}
	}
	*col = (int)(off - line_start) + 1;
}

/* ---- loading ---- */

static int fail_oom(PxError *err, const char *what)
{
	return px_fail(err, PX_ERR_RUNTIME, "%s: out of memory", what);
}

/* Report a parse error at text[off] with a short excerpt of what is there. */
/* cJSON reports a failed object key one character past it (parse_string advances before it
 * checks for the quote): `{"a": 1,}` and `{a: 1}`. Step back when the character before the
 * reported offset is what stood where a key belongs, after '{' or ','. */
static size_t key_error_offset(const char *text, size_t off)
{
	if (off == 0 || text[off - 1] == '"' || strchr(" \t\r\n", text[off - 1]))
		return off;
	size_t k = off - 1;
	while (k > 0 && strchr(" \t\r\n", text[k - 1]))
		k--;
	return k > 0 && (text[k - 1] == '{' || text[k - 1] == ',') ? off - 1 : off;
}

static int fail_malformed(const char *name, const char *text, size_t off, PxError *err)
{
	char near[16];
	size_t n = 0;
	int line, col;

	off = key_error_offset(text, off);
	text_line_col(text, off, &line, &col);
	while (n < 12 && text[off + n]) {
		char c = text[off + n];
		/* the excerpt sits inside one line of message */
		near[n++] = (c == '\n' || c == '\r' || c == '\t') ? ' ' : c;
	}
	while (n > 0 && near[n - 1] == ' ')
		n--; /* a final newline would show as a stray blank */
	near[n] = '\0';
	/* an empty excerpt would read "near ''" */
	return px_fail(err, PX_ERR_INPUT, "%s:%d:%d: malformed JSON %s%s%s", name, line, col,
		       n ? "near '" : "at the end of the file", near, n ? "'" : "");
}

/* A member's name and its place among its object's members. */
typedef struct NamedAt {
	const char *name;
	int at;
} NamedAt;

/* By name, then by place: equal names sit together, the first written first. */
static int named_at_cmp(const void *pa, const void *pb)
{
	const NamedAt *a = pa, *b = pb;
	int c = strcmp(a->name, b->name);
	return c ? c : (a->at > b->at) - (a->at < b->at);
}

/* A heap array of obj's n members' flags, 1 where a member repeats the name of an earlier one
 * (caller frees), or NULL with *oom set when out of memory. Sorting the names costs n log n where
 * comparing each with all before it cost n^2 (100,000 keys took 20 s). */
static unsigned char *mark_repeats(const cJSON *obj, int n, int *oom)
{
	NamedAt *v = malloc((size_t)n * sizeof(*v));
	unsigned char *dup = calloc((size_t)n, 1);
	int i = 0;

	*oom = !v || !dup;
	if (*oom) {
		free(v);
		free(dup);
		return NULL;
	}
	for (const cJSON *c = obj->child; c; c = c->next, i++)
		v[i] = (NamedAt){c->string ? c->string : "", i};
	qsort(v, (size_t)n, sizeof(*v), named_at_cmp);
	for (i = 1; i < n; i++)
		if (!strcmp(v[i].name, v[i - 1].name))
			dup[v[i].at] = 1;
	free(v);
	return dup;
}

/* DeepSpeed refuses a config with a key written twice, and JSON readers disagree on which one
 * wins (cJSON keeps the first, Python the last): refuse it, naming the key. The first repeat in
 * the order of the text is reported, at the first writing of its key. */
static int check_duplicates(const JsonDoc *d, const cJSON *obj, const char *path, PxError *err)
{
	unsigned char *dup = NULL;
	int n = 0, i = 0, rc = 0, oom = 0;

	for (const cJSON *c = obj ? obj->child : NULL; c; c = c->next)
		n++;
	if (cJSON_IsObject(obj) && n > 1 && !(dup = mark_repeats(obj, n, &oom)) && oom)
		return fail_oom(err, d->path);
	for (const cJSON *c = obj ? obj->child : NULL; c && !rc; c = c->next, i++) {
		char sub[512];
		if (cJSON_IsObject(obj) && c->string) {
			snprintf(sub, sizeof(sub), "%s%s%s", path, *path ? "." : "", c->string);
			if (dup && dup[i]) {
				char where[64] = "";
				int line, col;
				/* keys inside arrays have no dotted path to be found by */
				if (jdoc_locate(d, sub, &line, &col) == 0)
					snprintf(where, sizeof(where), ":%d:%d", line, col);
				rc = px_fail(err, PX_ERR_INPUT, "%s%s: duplicate key '%s': write each key "
					     "once", d->path, where, sub);
				break;
			}
		} else {
			snprintf(sub, sizeof(sub), "%s", path); /* array items: no key of their own */
		}
		if (cJSON_IsObject(c) || cJSON_IsArray(c))
			rc = check_duplicates(d, c, sub, err);
	}
	free(dup);
	return rc ? -1 : 0;
}

int jdoc_parse(JsonDoc *d, const char *name, const char *text, PxError *err)
{
	const char *end = NULL;

	memset(d, 0, sizeof(*d));
	/* blank lines are no more a document than nothing at all */
	if (!text[strspn(text, " \t\r\n")])
		return px_fail(err, PX_ERR_INPUT, "%s:1:1: malformed JSON: the file is empty",
			       name);
	d->path = strdup(name);
	d->text = strdup(text);
	if (!d->path || !d->text) {
		fail_oom(err, name);
		goto out_free;
	}
	/* null-terminated: `{"a": 1} x` is an error, not a document followed by noise */
	d->root = cJSON_ParseWithOpts(d->text, &end, 1);
	if (!d->root) {
		/* cJSON cannot tell running out of memory from bad text; bad text is likelier */
		fail_malformed(name, d->text, end ? (size_t)(end - d->text) : 0, err);
		goto out_free;
	}
	if (check_duplicates(d, d->root, "", err))
		goto out_free;
	return 0;

out_free:
	jdoc_free(d);
	return -1;
}

/* Up to max bytes of fd and one more (so that a file grown past max since its fstat is seen), as
 * a NUL-terminated heap string owned by the caller (*len bytes before the NUL), or NULL with errno
 * set. size_hint: the size fstat gave, the first guess of the buffer. */
static char *read_fd(int fd, long long size_hint, long long max, size_t *len)
{
	size_t cap = (size_t)(size_hint < max ? size_hint : max) + 2, n = 0;
	char *buf = malloc(cap), *grown;

	if (!buf)
		return NULL;
	for (;;) {
		if (n + 1 == cap) {
			size_t want = 2 * cap > (size_t)max + 2 ? (size_t)max + 2 : 2 * cap;
			if (want == cap)
				break; /* max + 1 bytes read: the caller refuses it */
			if (!(grown = realloc(buf, want)))
				goto out_free; /* errno is ENOMEM */
			buf = grown;
			cap = want;
		}
		ssize_t got = read(fd, buf + n, cap - 1 - n);
		if (got < 0 && errno == EINTR)
			continue;
		if (got < 0)
			goto out_free;
		if (got == 0)
			break;
		n += (size_t)got;
	}
	buf[n] = '\0';
	*len = n;
	return buf;

out_free:
	free(buf); /* glibc's free keeps errno */
	return NULL;
}

static int fail_too_big(const char *path, long long bytes, PxError *err)
{
	return px_fail(err, PX_ERR_INPUT, "%s: %lld bytes, over the %lld MiB a JSON input may have",
		       path, bytes, JDOC_MAX_FILE_BYTES >> 20);
}

int jdoc_load_file(JsonDoc *d, const char *path, PxError *err)
{
	struct stat st;
	size_t len = 0;
	char *text = NULL;
	int rc = -1;

	memset(d, 0, sizeof(*d));
	/* O_NONBLOCK: opening a FIFO with no writer returns at once instead of waiting for one; the
	 * descriptor is then checked for what it is before anything is read */
	int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0)
		return px_fail(err, PX_ERR_INPUT, "%s: cannot open: %s", path, strerror(errno));
	if (fstat(fd, &st)) {
		px_fail(err, PX_ERR_INPUT, "%s: cannot read: %s", path, strerror(errno));
		goto out_close;
	}
	if (!S_ISREG(st.st_mode)) {
		px_fail(err, PX_ERR_INPUT, "%s: not a regular file", path);
		goto out_close;
	}
	if (st.st_size > JDOC_MAX_FILE_BYTES) {
		fail_too_big(path, (long long)st.st_size, err);
		goto out_close;
	}
	text = read_fd(fd, (long long)st.st_size, JDOC_MAX_FILE_BYTES, &len);
	if (!text)
		px_fail(err, errno == ENOMEM ? PX_ERR_RUNTIME : PX_ERR_INPUT, "%s: cannot read: %s",
			path, strerror(errno));
	else if (len > (size_t)JDOC_MAX_FILE_BYTES) /* it grew while being read */
		fail_too_big(path, (long long)len, err);
	else
		rc = jdoc_parse(d, path, text, err);
	free(text);
out_close:
	close(fd);
	return rc;
}

void jdoc_free(JsonDoc *d)
{
	if (!d)
		return;
	free(d->path);
	free(d->text);
	cJSON_Delete(d->root);
	memset(d, 0, sizeof(*d));
}

/* ---- locating keys in the text ---- */

/* A scanner over text cJSON has accepted, which still stops cleanly on anything malformed. Keys
 * are compared as written: one spelled with escapes is not found, costing only a line:col. */
typedef struct Scan {
	const char *s;
	size_t i;          /* offset of the next byte */
	const char *want;  /* dotted key path looked for */
	size_t found;      /* offset of its value once found */
	char path[1024];   /* dotted path of the member being scanned */
} Scan;

enum { SCAN_BAD = -1, SCAN_DONE = 0, SCAN_FOUND = 1 };

static void scan_ws(Scan *sc)
{
	while (sc->s[sc->i] && strchr(" \t\r\n", sc->s[sc->i]))
		sc->i++;
}

/* At an opening quote: skip the string, giving the offset and length of its raw contents. */
static int scan_string(Scan *sc, size_t *start, size_t *len)
{
	if (sc->s[sc->i] != '"')
		return SCAN_BAD;
	*start = ++sc->i;
	while (sc->s[sc->i] != '"') {
		if (!sc->s[sc->i])
			return SCAN_BAD;
		if (sc->s[sc->i] == '\\' && sc->s[sc->i + 1])
			sc->i++; /* the escaped byte cannot end the string */
		sc->i++;
	}
	*len = sc->i - *start;
	sc->i++;
	return SCAN_DONE;
}

/* At a member's key: extend the path of its object (plen bytes of sc->path) by it and step to the
 * value. *keyed tells whether sc->path now names the member (*mlen bytes of it). */
static int scan_key(Scan *sc, size_t plen, int *keyed, size_t *mlen)
{
	size_t kstart, klen, at = plen + (plen ? 1 : 0);

	if (scan_string(sc, &kstart, &klen))
		return SCAN_BAD;
	*keyed = *keyed && at + klen < sizeof(sc->path);
	if (*keyed) {
		if (plen)
			sc->path[plen] = '.';
		memcpy(sc->path + at, sc->s + kstart, klen);
		sc->path[at + klen] = '\0';
	}
	*mlen = at + klen;
	scan_ws(sc);
	if (sc->s[sc->i] != ':')
		return SCAN_BAD;
	sc->i++;
	scan_ws(sc);
	if (*keyed && strcmp(sc->path, sc->want) == 0) {
		sc->found = sc->i;
		return SCAN_FOUND;
	}
	return SCAN_DONE;
}

static int scan_value(Scan *sc, size_t plen, int keyed, int depth);

/* At '{' or '['. plen is the length of the container's own path in sc->path; keyed is 0 inside
 * arrays, where a dotted path of keys cannot name anything. A stray comma before the close slips
 * through: rejecting bad text is cJSON's job, this only has to stay in bounds. */
static int scan_container(Scan *sc, size_t plen, int keyed, int depth)
{
	char close = sc->s[sc->i++] == '{' ? '}' : ']';

	for (;;) {
		int rc = SCAN_DONE, mkeyed = 0;
		size_t mlen = 0;

		scan_ws(sc);
		if (sc->s[sc->i] == close) {
			sc->i++;
			return SCAN_DONE;
		}
		if (close == '}') {
			mkeyed = keyed;
			rc = scan_key(sc, plen, &mkeyed, &mlen);
		}
		if (!rc)
			rc = scan_value(sc, mlen, mkeyed, depth + 1);
		if (rc)
			return rc;
		scan_ws(sc);
		if (sc->s[sc->i] == ',')
			sc->i++;
		else if (sc->s[sc->i] != close)
			return SCAN_BAD;
	}
}

static int scan_value(Scan *sc, size_t plen, int keyed, int depth)
{
	size_t start, len;

	/* cJSON refuses deeper nesting, so this only guards the stack against odd text */
	if (depth > CJSON_NESTING_LIMIT)
		return SCAN_BAD;
	scan_ws(sc);
	switch (sc->s[sc->i]) {
	case '{':
	case '[':
		return scan_container(sc, plen, keyed, depth);
	case '"':
		return scan_string(sc, &start, &len);
	default:
		/* numbers and literals: validity was cJSON's business, this only steps over */
		start = sc->i;
		while (sc->s[sc->i] && strchr("0123456789+-.eEtruefalsn", sc->s[sc->i]))
			sc->i++;
		return sc->i > start ? SCAN_DONE : SCAN_BAD;
	}
}

int jdoc_locate(const JsonDoc *d, const char *keypath, int *line, int *col)
{
	Scan sc = { .s = d->text, .want = keypath };

	if (!d->text || !keypath[0])
		return -1;
	if (strncmp(sc.s, "\xef\xbb\xbf", 3) == 0)
		sc.i = 3; /* a UTF-8 byte order mark, which cJSON skips too */
	if (scan_value(&sc, 0, 1, 0) != SCAN_FOUND)
		return -1;
	text_line_col(d->text, sc.found, line, col);
	return 0;
}

/* ---- --set overrides ---- */

void jov_init(JsonOverrides *o)
{
	memset(o, 0, sizeof(*o));
}

void jov_free(JsonOverrides *o)
{
	if (!o)
		return;
	free(o->v);
	jov_init(o);
}

/* Room for one more, growing by doubling (a sweep adds a dozen per point). */
static JsonOverride *jov_next(JsonOverrides *o, PxError *err)
{
	if (o->n == o->cap) {
		int cap = o->cap ? 2 * o->cap : 16;
		JsonOverride *grown = realloc(o->v, (size_t)cap * sizeof(*o->v));
		if (!grown) {
			fail_oom(err, "--set");
			return NULL;
		}
		o->v = grown;
		o->cap = cap;
	}
	return &o->v[o->n];
}

int jov_add(JsonOverrides *o, const char *arg, PxError *err)
{
	const char *eq = strchr(arg, '=');
	JsonOverride *v;
	size_t klen;

	if (!eq || eq == arg)
		return px_fail(err, PX_ERR_INPUT, "--set %s: expected KEY=VALUE", arg);
	klen = (size_t)(eq - arg);
	if (klen >= sizeof(o->v->key) || strlen(eq + 1) >= sizeof(o->v->value))
		return px_fail(err, PX_ERR_INPUT, "--set %s: the key and the value are limited to "
			       "%zu characters each", arg, sizeof(o->v->key) - 1);
	if (!(v = jov_next(o, err)))
		return -1;
	memcpy(v->key, arg, klen);
	v->key[klen] = '\0';
	strcpy(v->value, eq + 1);
	o->n++;
	return 0;
}

int jov_add_kv(JsonOverrides *o, const char *key, const char *value, PxError *err)
{
	size_t klen = strlen(key), vlen = strlen(value);
	JsonOverride *v;

	/* what jov_add would split or refuse: its own path and message, cut where a sweep's
	 * "KEY=VALUE" of 1,024 bytes was */
	if (klen == 0 || klen >= sizeof(v->key) || vlen >= sizeof(v->value) || strchr(key, '=')) {
		char arg[1024];
		snprintf(arg, sizeof(arg), "%s=%s", key, value);
		return jov_add(o, arg, err);
	}
	if (!(v = jov_next(o, err)))
		return -1;
	memcpy(v->key, key, klen + 1);
	memcpy(v->value, value, vlen + 1);
	o->n++;
	return 0;
}

/* Put item (owned; consumed either way) at key in obj, replacing a member of that name. */
static int put_member(cJSON *obj, const char *key, cJSON *item)
{
	if (cJSON_GetObjectItemCaseSensitive(obj, key))
		return cJSON_ReplaceItemInObjectCaseSensitive(obj, key, item) ? 0 : -1;
	if (cJSON_AddItemToObject(obj, key, item))
		return 0;
	cJSON_Delete(item);
	return -1;
}

int jdoc_set_path(cJSON *root, const char *path, const char *value, PxError *err)
{
	cJSON *item, *cur = root;
	char *copy, *seg, *dot;
	int rc = -1;

	if (!cJSON_IsObject(root))
		return px_fail(err, PX_ERR_INPUT, "--set %s: the document is not an object", path);
	/* null-terminated: `3 abc` is the string "3 abc", not the number 3 */
	item = cJSON_ParseWithOpts(value, NULL, 1);
	if (!item)
		item = cJSON_CreateString(value);
	copy = strdup(path);
	if (!item || !copy) {
		fail_oom(err, "--set");
		goto out_free;
	}
	for (seg = copy;; seg = dot + 1) {
		dot = strchr(seg, '.');
		if (dot)
			*dot = '\0';
		if (!seg[0]) {
			px_fail(err, PX_ERR_INPUT, "--set %s: the key has an empty part", path);
			goto out_free;
		}
		if (!dot)
			break;
		cJSON *next = cJSON_GetObjectItemCaseSensitive(cur, seg);
		/* null reads as absent elsewhere, so it becomes an object like a missing key */
		if (!next || cJSON_IsNull(next)) {
			next = cJSON_CreateObject();
			if (!next || put_member(cur, seg, next)) {
				fail_oom(err, "--set");
				goto out_free;
			}
		} else if (!cJSON_IsObject(next)) {
			px_fail(err, PX_ERR_INPUT, "--set %s: '%s' is not an object", path, seg);
			goto out_free;
		}
		cur = next;
	}
	rc = put_member(cur, seg, item);
	item = NULL; /* consumed by put_member */
	if (rc)
		fail_oom(err, "--set");

out_free:
	cJSON_Delete(item);
	free(copy);
	return rc;
}

/* ---- typed reads ---- */

/* a, b and c joined into buf of n bytes, cut short like snprintf's "%s%s%s" (a sweep builds
 * these names for every point, where snprintf's formatting showed in the profile) */
static void join3(char *buf, size_t n, const char *a, const char *b, const char *c)
{
	size_t at = 0;
	const char *part[3] = {a, b, c};
	for (int i = 0; i < 3; i++)
		for (const char *q = part[i]; *q && at + 1 < n; q++)
			buf[at++] = *q;
	if (n)
		buf[at] = '\0';
}

void jobj_make(JsonObj *o, const JsonDoc *doc, const cJSON *obj, const char *path, const char *name,
	       const JsonOverrides *ov)
{
	o->doc = doc;
	o->obj = obj;
	join3(o->path, sizeof(o->path), path, "", "");
	join3(o->name, sizeof(o->name), name, "", "");
	o->ov = ov;
}

/* prefix "." key, or key alone when prefix is empty */
static void join_key(char *buf, size_t n, const char *prefix, const char *key)
{
	join3(buf, n, prefix, prefix[0] ? "." : "", key);
}

void jobj_where(const JsonObj *o, const char *key, char *buf, size_t n)
{
	char full[1024];
	int line, col;

	join_key(full, sizeof(full), o->name, key);
	/* the last --set of a key is the one that holds */
	for (int i = o->ov ? o->ov->n - 1 : -1; i >= 0; i--)
		if (strcmp(o->ov->v[i].key, full) == 0) {
			snprintf(buf, n, "--set %s=%s", full, o->ov->v[i].value);
			return;
		}
	join_key(full, sizeof(full), o->path, key);
	if (jdoc_locate(o->doc, full, &line, &col) == 0)
		snprintf(buf, n, "%s:%d:%d", o->doc->path, line, col);
	else
		snprintf(buf, n, "%s", o->doc->path);
}

/* The member at key, or NULL when it is absent or JSON null. */
static const cJSON *member(const JsonObj *o, const char *key)
{
	const cJSON *item = o->obj ? cJSON_GetObjectItemCaseSensitive(o->obj, key) : NULL;

	return cJSON_IsNull(item) ? NULL : item;
}

static int fail_expected(const JsonObj *o, const char *key, const char *what, const cJSON *item,
			 PxError *err)
{
	char where[1024];
	char *got = cJSON_PrintUnformatted(item);

	jobj_where(o, key, where, sizeof(where));
	px_fail(err, PX_ERR_INPUT, "%s: %s%s%s: expected %s, got %s", where, o->name,
		o->name[0] ? "." : "", key, what, got ? got : "(unprintable)");
	cJSON_free(got);
	return -1;
}

int jobj_int(const JsonObj *o, const char *key, long long lo, long long hi, long long dflt,
	     long long *out, PxError *err)
{
	const cJSON *item = member(o, key);
	char what[128];

	*out = dflt;
	if (!item)
		return 0;
	double v = item->valuedouble;
	/* 2^63 bounds the doubles that convert to long long; (double)hi may round up past it */
	if (cJSON_IsNumber(item) && v >= -9223372036854775808.0 && v < 9223372036854775808.0 &&
	    v == (double)(long long)v && (long long)v >= lo && (long long)v <= hi) {
		*out = (long long)v;
		return 1;
	}
	snprintf(what, sizeof(what), "an integer from %lld to %lld", lo, hi);
	return fail_expected(o, key, what, item, err);
}

/* A number in [lo, hi]; what_more extends "a number from LO to HI" in the message. */
static int read_num(const JsonObj *o, const char *key, const cJSON *item, double lo, double hi,
		    const char *what_more, double *out, PxError *err)
{
	char what[128];

	if (cJSON_IsNumber(item) && item->valuedouble >= lo && item->valuedouble <= hi) {
		*out = item->valuedouble;
		return 1;
	}
	snprintf(what, sizeof(what), "a number from %g to %g%s", lo, hi, what_more);
	return fail_expected(o, key, what, item, err);
}

int jobj_num(const JsonObj *o, const char *key, double lo, double hi, double dflt, double *out,
	     PxError *err)
{
	const cJSON *item = member(o, key);

	*out = dflt;
	return item ? read_num(o, key, item, lo, hi, "", out, err) : 0;
}

int jobj_bool(const JsonObj *o, const char *key, int dflt, int *out, PxError *err)
{
	const cJSON *item = member(o, key);

	*out = dflt;
	if (!item)
		return 0;
	if (!cJSON_IsBool(item))
		return fail_expected(o, key, "true or false", item, err);
	*out = cJSON_IsTrue(item);
	return 1;
}

int jobj_str(const JsonObj *o, const char *key, const char *dflt, const char **out, PxError *err)
{
	const cJSON *item = member(o, key);

	*out = dflt;
	if (!item)
		return 0;
	if (!cJSON_IsString(item))
		return fail_expected(o, key, "a string", item, err);
	*out = item->valuestring;
	return 1;
}

int jobj_choice(const JsonObj *o, const char *key, const char *const *names, int dflt, int *out,
		PxError *err)
{
	const char *s;
	int rc = jobj_str(o, key, NULL, &s, err);
	*out = dflt;
	if (rc <= 0)
		return rc;
	for (int i = 0; names[i]; i++)
		if (!strcmp(s, names[i])) {
			*out = i;
			return 1;
		}
	char list[256] = "one of ";
	for (int i = 0; names[i]; i++)
		snprintf(list + strlen(list), sizeof(list) - strlen(list), "%s%s", i ? ", " : "",
			 names[i]);
	return fail_expected(o, key, list, member(o, key), err);
}

int jobj_num_or_auto(const JsonObj *o, const char *key, double lo, double hi, double dflt,
		     double *out, PxError *err)
{
	const cJSON *item = member(o, key);

	if (cJSON_IsString(item) && strcmp(item->valuestring, "auto") == 0)
		return 2;
	*out = dflt;
	return item ? read_num(o, key, item, lo, hi, " or \"auto\"", out, err) : 0;
}

/* On 0 the child is still filled in, with no object: reading from it gives every default, so a
 * caller may treat an absent section like an empty one. */
int jobj_child(const JsonObj *o, const char *key, JsonObj *child, PxError *err)
{
	const cJSON *item = member(o, key);
	char path[1024], name[1024];

	if (item && !cJSON_IsObject(item))
		return fail_expected(o, key, "an object", item, err);
	join_key(path, sizeof(path), o->path, key);
	join_key(name, sizeof(name), o->name, key);
	jobj_make(child, o->doc, item, path, name, o->ov);
	return item ? 1 : 0;
}

/* ---- unknown keys ---- */

/* Warn about member m of o, unknown among the n keys known (any order): the closest one by edit
 * distance, when there is one near enough. */
static int warn_unknown(const JsonObj *o, const cJSON *m, const char *const *known, int n,
			PxNotes *notes)
{
	const char *dot = o->name[0] ? "." : "", *best = NULL;
	int best_d = INT_MAX;
	char where[1024];
	for (int i = 0; i < n; i++) {
		int d = jdoc_edit_distance(m->string, known[i]);
		if (d < best_d) {
			best_d = d;
			best = known[i];
		}
	}
	jobj_where(o, m->string, where, sizeof(where));
	/* a suggestion as far away as the key is long is a rewrite, not a typo */
	if (best && best_d <= 3 && (size_t)best_d < strlen(m->string))
		return px_notes_warn(notes, "%s: warning: unknown key '%s%s%s'; did you mean '%s%s%s'?",
				     where, o->name, dot, m->string, o->name, dot, best);
	return px_notes_warn(notes, "%s: warning: unknown key '%s%s%s'", where, o->name, dot,
			     m->string);
}

int jobj_check_keys(const JsonObj *o, const char *const *known, PxNotes *notes)
{
	const cJSON *m;
	int n = 0;

	if (!cJSON_IsObject(o->obj) || !notes)
		return 0;
	while (known[n])
		n++;
	cJSON_ArrayForEach(m, o->obj) {
		int is_known = 0;
		/* keys starting with '_' are comments (a scenario's _source), as in hardware profiles */
		for (int i = 0; i < n && !is_known; i++)
			is_known = strcmp(m->string, known[i]) == 0;
		if (!is_known && m->string[0] != '_' && warn_unknown(o, m, known, n, notes))
			return -1;
	}
	return 0;
}

static int by_name(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

int jkeys_sort(JsonKeySet *ks, const char *const *known)
{
	int n = 0;
	while (known[n])
		n++;
	ks->n = 0;
	ks->keys = malloc((size_t)(n ? n : 1) * sizeof(*ks->keys));
	if (!ks->keys)
		return -1;
	memcpy(ks->keys, known, (size_t)n * sizeof(*ks->keys));
	qsort(ks->keys, (size_t)n, sizeof(*ks->keys), by_name);
	ks->n = n;
	return 0;
}

void jkeys_free(JsonKeySet *ks)
{
	if (ks) {
		free(ks->keys);
		ks->keys = NULL;
		ks->n = 0;
	}
}

int jobj_check_keyset(const JsonObj *o, const JsonKeySet *ks, PxNotes *notes)
{
	const cJSON *m;
	if (!cJSON_IsObject(o->obj) || !notes)
		return 0;
	cJSON_ArrayForEach(m, o->obj) {
		const char *key = m->string;
		if (key[0] == '_' ||
		    bsearch(&key, ks->keys, (size_t)ks->n, sizeof(*ks->keys), by_name))
			continue;
		if (warn_unknown(o, m, ks->keys, ks->n, notes))
			return -1;
	}
	return 0;
}

/* ---- edit distance ---- */

int jdoc_edit_distance(const char *a, const char *b)
{
	size_t la = strlen(a), lb = strlen(b);
	int *row = malloc((lb + 1) * sizeof(*row)); /* one row of the classic table */

	/* out of memory: the longer length is still an upper bound of the distance */
	if (!row)
		return (int)(la > lb ? la : lb);
	for (size_t j = 0; j <= lb; j++)
		row[j] = (int)j;
	for (size_t i = 1; i <= la; i++) {
		int diag = row[0];
		row[0] = (int)i;
		for (size_t j = 1; j <= lb; j++) {
			int up = row[j];
			int best = diag + (a[i - 1] != b[j - 1]);
			if (up + 1 < best)
				best = up + 1;
			if (row[j - 1] + 1 < best)
				best = row[j - 1] + 1;
			row[j] = best;
			diag = up;
		}
	}
	int d = row[lb];
	free(row);
	return d;
}

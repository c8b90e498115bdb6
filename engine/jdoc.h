/* jdoc: JSON documents read from files or strings, and typed reads that explain themselves.
 * Owns loading (cJSON), the file:line:col of any key, `--set key=value` overrides and range-checked
 * getters whose errors name the file, the key and what was expected. It does not know what any key
 * means: model.c, dsconfig.c, cluster.c and scenario.c do. */
#ifndef PX_JDOC_H
#define PX_JDOC_H

#include <cjson/cJSON.h>
#include <stddef.h>

#include "err.h"

typedef struct JsonDoc {
	char *path;  /* file name as given, or the name passed to jdoc_parse; owned */
	char *text;  /* the source text, NUL-terminated; owned */
	cJSON *root; /* owned */
} JsonDoc;

/* The largest JSON input read: real configs are a few KiB (a model's config.json, a ds_config) to
 * a few hundred KiB (a sweep, a hardware profile); 16 MiB leaves room and still bounds the memory
 * a wrong path (a log, an image, /dev/zero) can take. */
#define JDOC_MAX_FILE_BYTES (16LL << 20)

/* Read and parse a regular file of at most JDOC_MAX_FILE_BYTES. Errors (PX_ERR_INPUT):
 * "PATH: cannot open: <strerror>", "PATH: not a regular file" (a directory, a device, a FIFO:
 * refused without reading or blocking), "PATH: N bytes, over the 16 MiB a JSON input may have"
 * and "PATH:LINE:COL: malformed JSON near '<a few chars>'". */
int jdoc_load_file(JsonDoc *d, const char *path, PxError *err);
/* Parse text held in memory; name stands for the file in messages. */
int jdoc_parse(JsonDoc *d, const char *name, const char *text, PxError *err);
void jdoc_free(JsonDoc *d); /* accepts a zeroed or freed doc */

/* Line and column (1-based) of the value of a dotted key path ("zero_optimization.stage") in the
 * document's text, found by scanning the text. Returns 0 when found, -1 when the key is not there. */
int jdoc_locate(const JsonDoc *d, const char *keypath, int *line, int *col);

/* ---- --set overrides ---- */

typedef struct JsonOverride {
	char key[256];   /* logical dotted key, "deepspeed.zero_optimization.stage" */
	char value[256]; /* text after '=', as typed */
} JsonOverride;

typedef struct JsonOverrides {
	JsonOverride *v; /* owned, cap of them */
	int n, cap;
} JsonOverrides;

void jov_init(JsonOverrides *o);
void jov_free(JsonOverrides *o);
/* Append "KEY=VALUE"; error (PX_ERR_INPUT) names the argument when '=' or the key is missing. */
int jov_add(JsonOverrides *o, const char *arg, PxError *err);
/* Append KEY and VALUE given apart: the same as jov_add of "KEY=VALUE" (the same override, the
 * same errors), without building and splitting that string; a sweep adds each axis per point. */
int jov_add_kv(JsonOverrides *o, const char *key, const char *value, PxError *err);
/* Set root.<path> = value, creating objects on the way. The value is parsed as JSON when it is valid
 * JSON (3, 5e8, true, null, "auto", {"a":1}) and taken as a string otherwise (H100-SXM). Fails when a
 * step of the path exists and is not an object. */
int jdoc_set_path(cJSON *root, const char *path, const char *value, PxError *err);

/* ---- typed reads ---- */

/* An object being read: its document, where it sits in that document and its logical name. */
typedef struct JsonObj {
	const JsonDoc *doc;
	const cJSON *obj;
	char path[256]; /* dotted path inside doc, "" for the root */
	char name[256]; /* dotted logical name for messages: "deepspeed.zero_optimization" */
	const JsonOverrides *ov; /* may be NULL */
} JsonObj;

/* Make a JsonObj for obj found at `path` inside doc and known to users as `name`. */
void jobj_make(JsonObj *o, const JsonDoc *doc, const cJSON *obj, const char *path, const char *name,
	       const JsonOverrides *ov);

/* Where key (a direct member of o) comes from, for a message: "--set deepspeed.x.stage=4" when an
 * override set it, "FILE:LINE:COL" when it is in the text, "FILE" otherwise. */
void jobj_where(const JsonObj *o, const char *key, char *buf, size_t n);

/* Each getter returns 1 when the key is present and valid (value stored), 0 when absent or JSON null
 * (dflt stored) and -1 on a wrong type or range, with err (PX_ERR_INPUT) reading
 * "WHERE: NAME.KEY: expected an integer from 0 to 3, got 4" (got shows the JSON value as written). */
int jobj_int(const JsonObj *o, const char *key, long long lo, long long hi, long long dflt,
	     long long *out, PxError *err); /* integral numbers only; 5e8 is fine, 2.5 is not */
int jobj_num(const JsonObj *o, const char *key, double lo, double hi, double dflt, double *out,
	     PxError *err);
int jobj_bool(const JsonObj *o, const char *key, int dflt, int *out, PxError *err);
/* *out points into the cJSON tree (valid while the document lives). */
int jobj_str(const JsonObj *o, const char *key, const char *dflt, const char **out, PxError *err);
/* One of the NULL-terminated names: *out its index (dflt when absent); a string not among them
 * reads "WHERE: NAME.KEY: expected one of a, b, c, got "x"". */
int jobj_choice(const JsonObj *o, const char *key, const char *const *names, int dflt, int *out,
		PxError *err);
/* A number in [lo, hi] or the string "auto": returns 2 for "auto" (out untouched). */
int jobj_num_or_auto(const JsonObj *o, const char *key, double lo, double hi, double dflt,
		     double *out, PxError *err);
/* A child object: 1 and *child filled, 0 when absent or null, -1 when present but not an object. */
int jobj_child(const JsonObj *o, const char *key, JsonObj *child, PxError *err);

/* Warn (into notes) about each member of o whose key is not in known (NULL-terminated):
 * "WHERE: warning: unknown key 'NAME.KEY'; did you mean 'CLOSEST'?" with the closest known key by
 * edit distance (the "did you mean" part left out when nothing is within 3 edits). Keys starting
 * with '_' are comments and never warned about. */
int jobj_check_keys(const JsonObj *o, const char *const *known, PxNotes *notes);

/* The same check against a set of known keys sorted once (jkeys_sort), for the readers that run
 * on every point of a sweep: a key is looked up by binary search, not by a pass over the list. */
typedef struct JsonKeySet {
	const char **keys; /* sorted by strcmp; the strings are the caller's (static) ones */
	int n;
} JsonKeySet;
/* Sort the NULL-terminated known into ks (owned: jkeys_free). -1 when out of memory. */
int jkeys_sort(JsonKeySet *ks, const char *const *known);
void jkeys_free(JsonKeySet *ks);
int jobj_check_keyset(const JsonObj *o, const JsonKeySet *ks, PxNotes *notes);

/* Edit (Levenshtein) distance between two strings. */
int jdoc_edit_distance(const char *a, const char *b);

#endif

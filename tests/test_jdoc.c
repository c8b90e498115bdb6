/* Tests of engine/jdoc: loading, key positions, --set overrides, typed reads and unknown keys.
 * Every line:col below is counted by hand from the document text next to it (columns are bytes,
 * 1-based; a value's column is that of its first byte). */
#include <CUnit/CUnit.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../engine/jdoc.h"
#include "../engine/scenario.h"
#include "suites.h"

/* Compare strings, printing both on a mismatch (CU_ASSERT_STRING_EQUAL shows neither). */
#define EXPECT_STR(got, want)                                                               \
	do {                                                                                \
		const char *got_ = (got), *want_ = (want);                                  \
		if (!got_ || strcmp(got_, want_) != 0)                                      \
			fprintf(stderr, "\n%s:%d:\n  got  '%s'\n  want '%s'\n", __FILE__,   \
				__LINE__, got_ ? got_ : "(null)", want_);                   \
		CU_ASSERT(got_ && strcmp(got_, want_) == 0);                                \
	} while (0)

/* Parse text that the test knows to be valid. */
static void parse_ok(JsonDoc *d, const char *name, const char *text)
{
	PxError err = {0};
	int rc = jdoc_parse(d, name, text, &err);

	if (rc)
		fprintf(stderr, "\nparse failed: %s\n", err.msg);
	CU_ASSERT_EQUAL_FATAL(rc, 0);
}

/* ---- locate ---- */

/* line 1..12; columns counted per line in the checks below */
static const char *locate_doc =
	"{\n"
	"  \"model\": {\"name\": \"gpt\", \"layers\": [1, 2, {\"x\": 3}]},\n"
	"  \"deepspeed\": {\n"
	"    \"note\": \"a \\\"after\\\": 1 {tricky} [text]\",\n"
	"    \"zero_optimization\": {\n"
	"      \"stage\": 2,\n"
	"      \"offload\": {\"device\": \"cpu\"}\n"
	"    },\n"
	"    \"after\": 7\n"
	"  },\n"
	"  \"x\": 1\n"
	"}\n";

static void expect_at(const JsonDoc *d, const char *key, int want_line, int want_col)
{
	int line = 0, col = 0;

	CU_ASSERT_EQUAL(jdoc_locate(d, key, &line, &col), 0);
	if (line != want_line || col != want_col)
		fprintf(stderr, "\n%s: got %d:%d, want %d:%d\n", key, line, col, want_line,
			want_col);
	CU_ASSERT_EQUAL(line, want_line);
	CU_ASSERT_EQUAL(col, want_col);
}

static void test_locate(void)
{
	char dir[256], path[512];
	PxError err = {0};
	JsonDoc d;
	int line, col;

	snprintf(dir, sizeof(dir), "%s", px_test_tmpdir());
	snprintf(path, sizeof(path), "%s/loc.json", dir);
	px_test_write_file(path, locate_doc);
	CU_ASSERT_EQUAL_FATAL(jdoc_load_file(&d, path, &err), 0);

	/* line 6 "      \"stage\": 2,": 6 blanks, "stage" 7-13, ':' 14, ' ' 15, '2' 16 */
	expect_at(&d, "deepspeed.zero_optimization.stage", 6, 16);
	/* line 7: "offload" 7-15, ':' 16, '{' 18, "device" 19-26, ':' 27, '"cpu"' 29 */
	expect_at(&d, "deepspeed.zero_optimization.offload.device", 7, 29);
	/* line 2: "model" 3-9, '{' 12, "name" 13-18, "gpt" 21-25, "layers" 28-35, '[' 38 */
	expect_at(&d, "model.layers", 2, 38);
	expect_at(&d, "model.name", 2, 21);
	/* line 3: "deepspeed" 3-13, ':' 14, '{' 16 */
	expect_at(&d, "deepspeed", 3, 16);
	/* line 4: "note" 5-10, ':' 11, the string at 13; its text holds "after": 1 and brackets */
	expect_at(&d, "deepspeed.note", 4, 13);
	/* line 9: "after" 5-11, ':' 12, '7' 14 (not the "after" quoted inside the note) */
	expect_at(&d, "deepspeed.after", 9, 14);
	/* line 11: "x" 3-5, ':' 6, '1' 8: after an array that holds an object with an "x" */
	expect_at(&d, "x", 11, 8);

	/* keys inside arrays have no dotted path; partial and unrooted paths name nothing */
	CU_ASSERT_EQUAL(jdoc_locate(&d, "model.layers.x", &line, &col), -1);
	CU_ASSERT_EQUAL(jdoc_locate(&d, "zero_optimization.stage", &line, &col), -1);
	CU_ASSERT_EQUAL(jdoc_locate(&d, "deepspeed.stage", &line, &col), -1);
	CU_ASSERT_EQUAL(jdoc_locate(&d, "deepspeed.zero", &line, &col), -1);
	CU_ASSERT_EQUAL(jdoc_locate(&d, "missing", &line, &col), -1);
	CU_ASSERT_EQUAL(jdoc_locate(&d, "", &line, &col), -1);
	jdoc_free(&d);
	jdoc_free(&d); /* a freed doc may be freed again */
	unlink(path);
	rmdir(dir);
}

static void test_locate_odd_text(void)
{
	static char text[2100];
	JsonDoc d;
	int line, col;

	/* a byte order mark takes columns 1-3: '{' 4, "a" 5-7, ':' 8, '1' 10 */
	parse_ok(&d, "b.json", "\xef\xbb\xbf{\"a\": 1}");
	expect_at(&d, "a", 1, 10);
	jdoc_free(&d);

	/* a 2000-byte key is longer than any path the scanner keeps: its members cannot be named,
	 * and the "x" inside it must not pass for the top-level one. '{' 1, '"' 2, the key
	 * 3-2002, '"' 2003, ':' 2004, inner '{' 2006, "x" 2007-2009, '1' 2012, '}' 2013,
	 * ',' 2014, "x" 2016-2018, ':' 2019, '2' 2021 */
	snprintf(text, sizeof(text), "{\"%2000s\": {\"x\": 1}, \"x\": 2}", "");
	memset(text + 2, 'k', 2000);
	parse_ok(&d, "long.json", text);
	expect_at(&d, "x", 1, 2021);
	CU_ASSERT_EQUAL(jdoc_locate(&d, "kkkk", &line, &col), -1);
	jdoc_free(&d);

	/* text handed over without cJSON's check: the scanner stops, it does not run off */
	d = (JsonDoc){.path = "raw", .text = "{\"a\": [1, {\"b\": \"unterminated"};
	CU_ASSERT_EQUAL(jdoc_locate(&d, "a.b", &line, &col), -1);
	CU_ASSERT_EQUAL(jdoc_locate(&d, "c", &line, &col), -1);
	d.text = "{\"a\" 1, \"c\": 2}";
	CU_ASSERT_EQUAL(jdoc_locate(&d, "c", &line, &col), -1);
}

/* ---- malformed input ---- */

static void expect_parse_error(const char *text, const char *want)
{
	PxError err = {0};
	JsonDoc d;

	CU_ASSERT_EQUAL(jdoc_parse(&d, "s.json", text, &err), -1);
	CU_ASSERT_EQUAL(err.code, PX_ERR_INPUT);
	EXPECT_STR(err.msg, want);
	CU_ASSERT_PTR_NULL(d.root);
	CU_ASSERT_PTR_NULL(d.text);
}

static void test_malformed(void)
{
	/* the comma missing at the end of line 3 shows where "c" starts, line 4 column 3 */
	expect_parse_error("{\n  \"a\": 1,\n  \"b\": 2\n  \"c\": 3\n}\n",
			   "s.json:4:3: malformed JSON near '\"c\": 3 }'");
	/* line 3 "  \"b\": 2 \"c\": 3": "b" 3-5, ':' 6, '2' 8, '"c"' starts at 10 */
	expect_parse_error("{\n  \"a\": 1,\n  \"b\": 2 \"c\": 3\n}",
			   "s.json:3:10: malformed JSON near '\"c\": 3 }'");
	/* trailing garbage: the document ends at line 1, "extra" starts line 2 */
	expect_parse_error("{\"a\": 1}\nextra\n", "s.json:2:1: malformed JSON near 'extra'");
	/* the excerpt stops after 12 bytes: "{\"a\": 1} " is 9 bytes, so 't' is column 10 */
	expect_parse_error("{\"a\": 1} this is a long tail",
			   "s.json:1:10: malformed JSON near 'this is a lo'");
	/* line 2 "  \"a\": tru": 't' at column 8 */
	expect_parse_error("{\n  \"a\": tru\n}", "s.json:2:8: malformed JSON near 'tru }'");
	/* cut short: the error sits just past the last byte, 7 bytes in */
	expect_parse_error("{\"a\": 1", "s.json:1:8: malformed JSON at the end of the file");
	/* a bad object key: cJSON reports it one past; the message points at it.
	 * "{\"a\": 1,}": '}' is column 9; "{a: 1}": 'a' is column 2 */
	expect_parse_error("{\"a\": 1,}", "s.json:1:9: malformed JSON near '}'");
	expect_parse_error("{a: 1}", "s.json:1:2: malformed JSON near 'a: 1}'");
	/* a bad value is reported where it starts: 'x' is column 7 */
	expect_parse_error("{\"a\": x}", "s.json:1:7: malformed JSON near 'x}'");
	/* a trailing comma in an array: ']' is column 4 */
	expect_parse_error("[1,]", "s.json:1:4: malformed JSON near ']'");
	/* DeepSpeed refuses duplicate keys; the message points at the first one's value, 2:12 */
	expect_parse_error("{\"z\": {\n  \"stage\": 1,\n  \"stage\": 4}}",
			   "s.json:2:12: duplicate key 'z.stage': write each key once");
	expect_parse_error("", "s.json:1:1: malformed JSON: the file is empty");
	expect_parse_error(" \n\t\n", "s.json:1:1: malformed JSON: the file is empty");
}

/* Duplicate keys: the first repeat in the order of the text is reported, at its first writing,
 * and a 100,000-key object is checked whole (a repeat at its very end found, a clean one read). */
static void test_duplicates(void)
{
	/* 'a' repeats (third member) before 'b' does (fourth): 'a', whose first value is at 1:15
	 * ('{' 1, "b" 2-4, ':' 5, '1' 7, ',' 8, "a" 10-12, ':' 13, '1' 15) */
	expect_parse_error("{\"b\": 1, \"a\": 1, \"a\": 2, \"b\": 2}",
			   "s.json:1:15: duplicate key 'a': write each key once");
	/* a repeat inside an earlier member comes before a later one at the top: "x": {"k": 1,
	 * "k": 2} opens at 7, "k"'s first value at 13 */
	expect_parse_error("{\"x\": {\"k\": 1, \"k\": 2}, \"y\": 1, \"y\": 2}",
			   "s.json:1:13: duplicate key 'x.k': write each key once");
	/* objects in arrays are checked too; their keys have no dotted path to place them by, so
	 * the message names the file alone */
	expect_parse_error("{\"l\": [{\"q\": 1, \"q\": 2}]}",
			   "s.json: duplicate key 'l.q': write each key once");
	/* equal names that differ only in case are different keys */
	JsonDoc d;
	parse_ok(&d, "s.json", "{\"Stage\": 1, \"stage\": 2}");
	jdoc_free(&d);

	/* line 1 "{", then line i + 2 holds "  \"key_<i>\": <i>," for i = 0 .. 99,999 */
	enum { N = 100000 };
	size_t cap = (size_t)N * 32 + 64, at = 0;
	char *text = malloc(cap);
	PxError err = {0};
	CU_ASSERT_PTR_NOT_NULL_FATAL(text);
	at += (size_t)snprintf(text + at, cap - at, "{\n");
	for (int i = 0; i < N; i++)
		at += (size_t)snprintf(text + at, cap - at, "  \"key_%d\": %d%s\n", i, i,
				       i + 1 < N ? "," : "");
	snprintf(text + at, cap - at, "}\n");
	CU_ASSERT_EQUAL(jdoc_parse(&d, "big.json", text, &err), 0);
	CU_ASSERT_EQUAL(cJSON_GetArraySize(d.root), N);
	jdoc_free(&d);
	/* the same with key_54321 written again as the last member: its first writing is on line
	 * 54,323, "  \"key_54321\": 54321,", the value at column 16 (the key's quotes 3-13, ':' 14) */
	snprintf(text + at, cap - at, ",\n  \"key_54321\": 0\n}\n");
	CU_ASSERT_EQUAL(jdoc_parse(&d, "big.json", text, &err), -1);
	EXPECT_STR(err.msg, "big.json:54323:16: duplicate key 'key_54321': write each key once");
	free(text);
}

static void test_load_errors(void)
{
	char dir[256], path[512], want[1024];
	PxError err = {0};
	JsonDoc d;

	snprintf(dir, sizeof(dir), "%s", px_test_tmpdir());

	snprintf(path, sizeof(path), "%s/nope.json", dir);
	CU_ASSERT_EQUAL(jdoc_load_file(&d, path, &err), -1);
	CU_ASSERT_EQUAL(err.code, PX_ERR_INPUT);
	snprintf(want, sizeof(want), "%s: cannot open: No such file or directory", path);
	EXPECT_STR(err.msg, want);

	snprintf(path, sizeof(path), "%s/empty.json", dir);
	px_test_write_file(path, "");
	CU_ASSERT_EQUAL(jdoc_load_file(&d, path, &err), -1);
	CU_ASSERT_EQUAL(err.code, PX_ERR_INPUT);
	snprintf(want, sizeof(want), "%s:1:1: malformed JSON: the file is empty", path);
	EXPECT_STR(err.msg, want);
	jdoc_free(&d);
	unlink(path);

	/* a directory is not a file to read */
	CU_ASSERT_EQUAL(jdoc_load_file(&d, dir, &err), -1);
	CU_ASSERT_EQUAL(err.code, PX_ERR_INPUT);
	snprintf(want, sizeof(want), "%s: not a regular file", dir);
	EXPECT_STR(err.msg, want);

	snprintf(path, sizeof(path), "%s/bad.json", dir);
	px_test_write_file(path, "[1,\n 2,,\n 3]");
	CU_ASSERT_EQUAL(jdoc_load_file(&d, path, &err), -1);
	/* line 2 " 2,,": the second ',' is at column 4 */
	snprintf(want, sizeof(want), "%s:2:4: malformed JSON near ',  3]'", path);
	EXPECT_STR(err.msg, want);
	unlink(path);
	rmdir(dir);
}

/* Files that are not JSON documents on disk are refused before anything is read: /dev/zero (which
 * never ends), a FIFO with no writer (whose open and read would block for ever) and a file over
 * JDOC_MAX_FILE_BYTES (a sparse one: its size is set, no data written). */
static void test_load_refuses_non_files(void)
{
	char dir[256], path[512], want[1024];
	PxError err = {0};
	JsonDoc d;

	CU_ASSERT_EQUAL(jdoc_load_file(&d, "/dev/zero", &err), -1);
	CU_ASSERT_EQUAL(err.code, PX_ERR_INPUT);
	EXPECT_STR(err.msg, "/dev/zero: not a regular file");
	CU_ASSERT_PTR_NULL(d.root);

	snprintf(dir, sizeof(dir), "%s", px_test_tmpdir());
	snprintf(path, sizeof(path), "%s/fifo.json", dir);
	CU_ASSERT_EQUAL_FATAL(mkfifo(path, 0600), 0);
	/* a guard: were the load to block, the alarm ends the runner (SIGALRM) instead of hanging */
	alarm(10);
	CU_ASSERT_EQUAL(jdoc_load_file(&d, path, &err), -1);
	alarm(0);
	snprintf(want, sizeof(want), "%s: not a regular file", path);
	EXPECT_STR(err.msg, want);
	unlink(path);

	/* one byte over the limit; the limit itself is 16 MiB = 16,777,216 bytes */
	CU_ASSERT_EQUAL(JDOC_MAX_FILE_BYTES, 16777216);
	snprintf(path, sizeof(path), "%s/big.json", dir);
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	CU_ASSERT_FATAL(fd >= 0);
	CU_ASSERT_EQUAL(ftruncate(fd, JDOC_MAX_FILE_BYTES + 1), 0);
	close(fd);
	CU_ASSERT_EQUAL(jdoc_load_file(&d, path, &err), -1);
	CU_ASSERT_EQUAL(err.code, PX_ERR_INPUT);
	snprintf(want, sizeof(want), "%s: 16777217 bytes, over the 16 MiB a JSON input may have",
		 path);
	EXPECT_STR(err.msg, want);
	/* a file of exactly the limit is read: one object followed by blanks */
	char *text = malloc(JDOC_MAX_FILE_BYTES);
	CU_ASSERT_PTR_NOT_NULL_FATAL(text);
	memset(text, ' ', JDOC_MAX_FILE_BYTES);
	memcpy(text, "{\"a\": 1}", 8);
	FILE *f = fopen(path, "w");
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	CU_ASSERT_EQUAL(fwrite(text, 1, JDOC_MAX_FILE_BYTES, f), (size_t)JDOC_MAX_FILE_BYTES);
	fclose(f);
	free(text);
	CU_ASSERT_EQUAL(jdoc_load_file(&d, path, &err), 0);
	CU_ASSERT_PTR_NOT_NULL(cJSON_GetObjectItemCaseSensitive(d.root, "a"));
	jdoc_free(&d);
	unlink(path);
	rmdir(dir);
}

/* ---- --set ---- */

static void test_jov_add(void)
{
	char arg[400];
	PxError err = {0};
	JsonOverrides ov;

	jov_init(&ov);
	CU_ASSERT_EQUAL(jov_add(&ov, "deepspeed.zero_optimization.stage=3", &err), 0);
	CU_ASSERT_EQUAL(jov_add(&ov, "a=b=c", &err), 0);
	CU_ASSERT_EQUAL(jov_add(&ov, "empty=", &err), 0);
	CU_ASSERT_EQUAL_FATAL(ov.n, 3);
	EXPECT_STR(ov.v[0].key, "deepspeed.zero_optimization.stage");
	EXPECT_STR(ov.v[0].value, "3");
	EXPECT_STR(ov.v[1].key, "a"); /* split at the first '=' */
	EXPECT_STR(ov.v[1].value, "b=c");
	EXPECT_STR(ov.v[2].value, "");

	CU_ASSERT_EQUAL(jov_add(&ov, "stage", &err), -1);
	CU_ASSERT_EQUAL(err.code, PX_ERR_INPUT);
	EXPECT_STR(err.msg, "--set stage: expected KEY=VALUE");
	CU_ASSERT_EQUAL(jov_add(&ov, "=3", &err), -1);
	EXPECT_STR(err.msg, "--set =3: expected KEY=VALUE");

	/* 300-byte key: over the 255 a JsonOverride holds */
	memset(arg, 'k', 300);
	snprintf(arg + 300, sizeof(arg) - 300, "=1");
	CU_ASSERT_EQUAL(jov_add(&ov, arg, &err), -1);
	CU_ASSERT_EQUAL(err.code, PX_ERR_INPUT);
	CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "--set kkkk"));
	CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "limited to 255 characters"));
	CU_ASSERT_EQUAL(ov.n, 3);
	jov_free(&ov);
	CU_ASSERT_EQUAL(ov.n, 0);
	jov_free(&ov);
}

/* Key and value given apart make what jov_add makes of "KEY=VALUE": the same override, and the
 * same error where jov_add refuses or splits differently (an empty key, a key with '=', a key
 * over 255 characters). */
static void test_jov_add_kv(void)
{
	static const char *const kv[][2] = {
		{"deepspeed.zero_optimization.stage", "3"}, {"cluster.gpu", "\"A100-80GB\""},
		{"empty", ""}, {"a=b", "c"}, {"", "3"},
	};
	char key[400], arg[1024];
	JsonOverrides a, b;
	PxError ea = {0}, eb = {0};

	jov_init(&a);
	jov_init(&b);
	memset(key, 'k', 300);
	key[300] = '\0';
	for (int i = 0; i <= 5; i++) {
		const char *k = i < 5 ? kv[i][0] : key, *v = i < 5 ? kv[i][1] : "1";
		snprintf(arg, sizeof(arg), "%s=%s", k, v);
		int ra = jov_add(&a, arg, &ea), rb = jov_add_kv(&b, k, v, &eb);
		CU_ASSERT_EQUAL(rb, ra);
		CU_ASSERT_EQUAL(eb.code, ea.code);
		EXPECT_STR(eb.msg, ea.msg);
	}
	CU_ASSERT_EQUAL_FATAL(b.n, a.n);
	CU_ASSERT_EQUAL(a.n, 4);
	for (int i = 0; i < a.n; i++) {
		EXPECT_STR(b.v[i].key, a.v[i].key);
		EXPECT_STR(b.v[i].value, a.v[i].value);
	}
	jov_free(&a);
	jov_free(&b);
}

static void expect_json(const cJSON *root, const char *want)
{
	char *got = cJSON_PrintUnformatted(root);

	EXPECT_STR(got, want);
	cJSON_free(got);
}

static void test_set_path(void)
{
	PxError err = {0};
	JsonDoc d;

	parse_ok(&d, "s.json", "{\"a\": {\"b\": 1, \"n\": null}, \"arr\": [1]}");
	CU_ASSERT_EQUAL(jdoc_set_path(d.root, "a.b", "3", &err), 0);         /* replaced */
	CU_ASSERT_EQUAL(jdoc_set_path(d.root, "a.gpu", "H100-SXM", &err), 0); /* not JSON */
	CU_ASSERT_EQUAL(jdoc_set_path(d.root, "a.s", "\"auto\"", &err), 0);
	CU_ASSERT_EQUAL(jdoc_set_path(d.root, "a.t", "3 abc", &err), 0); /* not one value */
	CU_ASSERT_EQUAL(jdoc_set_path(d.root, "x.y.z", "true", &err), 0);  /* x, y created */
	CU_ASSERT_EQUAL(jdoc_set_path(d.root, "x.big", "5e8", &err), 0);
	CU_ASSERT_EQUAL(jdoc_set_path(d.root, "x.o", "{\"k\": [1, 2]}", &err), 0);
	CU_ASSERT_EQUAL(jdoc_set_path(d.root, "a.n.m", "null", &err), 0); /* null becomes {} */
	expect_json(d.root, "{\"a\":{\"b\":3,\"n\":{\"m\":null},\"gpu\":\"H100-SXM\","
			    "\"s\":\"auto\",\"t\":\"3 abc\"},\"arr\":[1],\"x\":{\"y\":{\"z\":true},"
			    "\"big\":500000000,\"o\":{\"k\":[1,2]}}}");

	CU_ASSERT_EQUAL(jdoc_set_path(d.root, "a.b.c", "1", &err), -1);
	CU_ASSERT_EQUAL(err.code, PX_ERR_INPUT);
	EXPECT_STR(err.msg, "--set a.b.c: 'b' is not an object");
	CU_ASSERT_EQUAL(jdoc_set_path(d.root, "arr.q", "1", &err), -1);
	EXPECT_STR(err.msg, "--set arr.q: 'arr' is not an object");
	CU_ASSERT_EQUAL(jdoc_set_path(d.root, "a..b", "1", &err), -1);
	EXPECT_STR(err.msg, "--set a..b: the key has an empty part");
	CU_ASSERT_EQUAL(jdoc_set_path(d.root, "a.", "1", &err), -1);
	/* failures leave the tree as it was */
	expect_json(cJSON_GetObjectItemCaseSensitive(d.root, "arr"), "[1]");
	CU_ASSERT_EQUAL(cJSON_GetObjectItemCaseSensitive(d.root, "a")->child->valuedouble, 3);
	jdoc_free(&d);

	parse_ok(&d, "s.json", "[1]");
	CU_ASSERT_EQUAL(jdoc_set_path(d.root, "a", "1", &err), -1);
	EXPECT_STR(err.msg, "--set a: the document is not an object");
	jdoc_free(&d);
}

/* ---- typed reads ---- */

/* A deepspeed file: a key at line L written "    \"KEY\": VALUE" has its value at column
 * len(KEY) + 9 (4 blanks, 2 quotes, ':' and a blank before it). */
static const char *ds_doc =
	"{\n"                                    /* 1 */
	"  \"zero_optimization\": {\n"           /* 2 */
	"    \"stage\": 4,\n"                    /* 3: 3:14 */
	"    \"ok_int\": 2,\n"                   /* 4 */
	"    \"big\": 5e8,\n"                    /* 5 */
	"    \"frac\": 2.5,\n"                   /* 6: 6:13 */
	"    \"ratio\": 0.5,\n"                  /* 7 */
	"    \"flag\": true,\n"                  /* 8 */
	"    \"flag_num\": 1,\n"                 /* 9: 9:17 */
	"    \"name\": \"cpu\",\n"               /* 10: 10:13 */
	"    \"name_num\": 7,\n"                 /* 11: 11:17 */
	"    \"nothing\": null,\n"               /* 12 */
	"    \"bucket\": \"auto\",\n"            /* 13 */
	"    \"bucket_bad\": \"big\",\n"         /* 14: 14:19 */
	"    \"bucket_num\": 3e5,\n"             /* 15 */
	"    \"sub\": {\"a\": 1},\n"             /* 16: "a" 13-15, ':' 16, '1' 18 */
	"    \"sub_bad\": [1, 2],\n"             /* 17: 17:16 */
	"    \"neg\": -1\n"                      /* 18: 18:12 */
	"  }\n"
	"}\n";

/* The deepspeed.zero_optimization object of ds_doc. */
static void ds_zero(const JsonDoc *d, const JsonOverrides *ov, JsonObj *zero)
{
	PxError err = {0};
	JsonObj root;

	jobj_make(&root, d, d->root, "", "deepspeed", ov);
	CU_ASSERT_EQUAL(jobj_child(&root, "zero_optimization", zero, &err), 1);
	EXPECT_STR(zero->path, "zero_optimization");
	EXPECT_STR(zero->name, "deepspeed.zero_optimization");
}

static void expect_err(int rc, const PxError *err, const char *want)
{
	CU_ASSERT_EQUAL(rc, -1);
	CU_ASSERT_EQUAL(err->code, PX_ERR_INPUT);
	EXPECT_STR(err->msg, want);
}

static void test_get_int(void)
{
	PxError err = {0};
	JsonDoc d;
	JsonObj z;
	long long v;

	parse_ok(&d, "ds.json", ds_doc);
	ds_zero(&d, NULL, &z);
	CU_ASSERT_EQUAL(jobj_int(&z, "ok_int", 0, 3, 9, &v, &err), 1);
	CU_ASSERT_EQUAL(v, 2);
	CU_ASSERT_EQUAL(jobj_int(&z, "big", 0, 1000000000000LL, 9, &v, &err), 1);
	CU_ASSERT_EQUAL(v, 500000000);
	CU_ASSERT_EQUAL(jobj_int(&z, "missing", 0, 3, 9, &v, &err), 0);
	CU_ASSERT_EQUAL(v, 9);
	CU_ASSERT_EQUAL(jobj_int(&z, "nothing", 0, 3, 8, &v, &err), 0); /* null is absent */
	CU_ASSERT_EQUAL(v, 8);
	expect_err(jobj_int(&z, "stage", 0, 3, 0, &v, &err), &err,
		   "ds.json:3:14: deepspeed.zero_optimization.stage: "
		   "expected an integer from 0 to 3, got 4");
	expect_err(jobj_int(&z, "frac", 0, 10, 0, &v, &err), &err,
		   "ds.json:6:13: deepspeed.zero_optimization.frac: "
		   "expected an integer from 0 to 10, got 2.5");
	expect_err(jobj_int(&z, "name", 0, 10, 0, &v, &err), &err,
		   "ds.json:10:13: deepspeed.zero_optimization.name: expected an integer from 0 to "
		   "10, got \"cpu\"");
	expect_err(jobj_int(&z, "neg", 0, 10, 0, &v, &err), &err,
		   "ds.json:18:12: deepspeed.zero_optimization.neg: "
		   "expected an integer from 0 to 10, got -1");
	/* the widest range still takes -1 and refuses 1e19, past what a long long holds */
	CU_ASSERT_EQUAL(jobj_int(&z, "neg", -9223372036854775807LL - 1, 9223372036854775807LL, 0,
				 &v, &err), 1);
	CU_ASSERT_EQUAL(v, -1);
	jdoc_free(&d);
	parse_ok(&d, "h.json", "{\"n\": 1e19}");
	jobj_make(&z, &d, d.root, "", "", NULL);
	expect_err(jobj_int(&z, "n", -9223372036854775807LL - 1, 9223372036854775807LL, 0, &v,
			    &err), &err,
		   "h.json:1:7: n: expected an integer from -9223372036854775808 to "
		   "9223372036854775807, got 1e+19");
	jdoc_free(&d);
}

static void test_get_num_bool_str(void)
{
	PxError err = {0};
	const char *s;
	JsonDoc d;
	JsonObj z;
	double x;
	int b;

	parse_ok(&d, "ds.json", ds_doc);
	ds_zero(&d, NULL, &z);
	CU_ASSERT_EQUAL(jobj_num(&z, "ratio", 0, 1, 9, &x, &err), 1);
	CU_ASSERT_DOUBLE_EQUAL(x, 0.5, 0);
	CU_ASSERT_EQUAL(jobj_num(&z, "missing", 0, 1, 0.25, &x, &err), 0);
	CU_ASSERT_DOUBLE_EQUAL(x, 0.25, 0);
	expect_err(jobj_num(&z, "neg", 0, 1e12, 0, &x, &err), &err,
		   "ds.json:18:12: deepspeed.zero_optimization.neg: expected a number from 0 to "
		   "1e+12, got -1");
	expect_err(jobj_num(&z, "name", 0, 1, 0, &x, &err), &err,
		   "ds.json:10:13: deepspeed.zero_optimization.name: "
		   "expected a number from 0 to 1, got \"cpu\"");

	CU_ASSERT_EQUAL(jobj_bool(&z, "flag", 0, &b, &err), 1);
	CU_ASSERT_EQUAL(b, 1);
	CU_ASSERT_EQUAL(jobj_bool(&z, "missing", 1, &b, &err), 0);
	CU_ASSERT_EQUAL(b, 1);
	CU_ASSERT_EQUAL(jobj_bool(&z, "nothing", 0, &b, &err), 0);
	CU_ASSERT_EQUAL(b, 0);
	expect_err(jobj_bool(&z, "flag_num", 0, &b, &err), &err,
		   "ds.json:9:17: deepspeed.zero_optimization.flag_num: expected true or false, "
		   "got 1");

	CU_ASSERT_EQUAL(jobj_str(&z, "name", "none", &s, &err), 1);
	EXPECT_STR(s, "cpu");
	CU_ASSERT_EQUAL(jobj_str(&z, "missing", "none", &s, &err), 0);
	EXPECT_STR(s, "none");
	expect_err(jobj_str(&z, "name_num", "none", &s, &err), &err,
		   "ds.json:11:17: deepspeed.zero_optimization.name_num: expected a string, got 7");
	expect_err(jobj_str(&z, "sub_bad", "none", &s, &err), &err,
		   "ds.json:17:16: deepspeed.zero_optimization.sub_bad: expected a string, "
		   "got [1,2]");
	jdoc_free(&d);
}

static void test_get_auto_child(void)
{
	PxError err = {0};
	JsonObj z, sub;
	JsonDoc d;
	long long v;
	double x;

	parse_ok(&d, "ds.json", ds_doc);
	ds_zero(&d, NULL, &z);
	x = -5;
	CU_ASSERT_EQUAL(jobj_num_or_auto(&z, "bucket", 0, 1e12, 7, &x, &err), 2);
	CU_ASSERT_DOUBLE_EQUAL(x, -5, 0); /* untouched */
	CU_ASSERT_EQUAL(jobj_num_or_auto(&z, "bucket_num", 0, 1e12, 7, &x, &err), 1);
	CU_ASSERT_DOUBLE_EQUAL(x, 300000, 0);
	CU_ASSERT_EQUAL(jobj_num_or_auto(&z, "missing", 0, 1e12, 7, &x, &err), 0);
	CU_ASSERT_DOUBLE_EQUAL(x, 7, 0);
	expect_err(jobj_num_or_auto(&z, "bucket_bad", 0, 1e12, 7, &x, &err), &err,
		   "ds.json:14:19: deepspeed.zero_optimization.bucket_bad: "
		   "expected a number from 0 to 1e+12 or \"auto\", got \"big\"");
	expect_err(jobj_num_or_auto(&z, "neg", 0, 1e12, 7, &x, &err), &err,
		   "ds.json:18:12: deepspeed.zero_optimization.neg: expected a number from 0 "
		   "to 1e+12 or \"auto\", got -1");

	CU_ASSERT_EQUAL(jobj_child(&z, "sub", &sub, &err), 1);
	EXPECT_STR(sub.path, "zero_optimization.sub");
	EXPECT_STR(sub.name, "deepspeed.zero_optimization.sub");
	CU_ASSERT_EQUAL(jobj_int(&sub, "a", 0, 3, 0, &v, &err), 1);
	CU_ASSERT_EQUAL(v, 1);
	expect_err(jobj_str(&sub, "a", "", &(const char *){NULL}, &err), &err,
		   "ds.json:16:18: deepspeed.zero_optimization.sub.a: expected a string, got 1");
	expect_err(jobj_child(&z, "sub_bad", &sub, &err), &err,
		   "ds.json:17:16: deepspeed.zero_optimization.sub_bad: expected an object, "
		   "got [1,2]");
	/* an absent child reads as an empty one: every getter gives its default */
	CU_ASSERT_EQUAL(jobj_child(&z, "offload_param", &sub, &err), 0);
	CU_ASSERT_EQUAL(jobj_child(&z, "nothing", &sub, &err), 0);
	CU_ASSERT_EQUAL(jobj_int(&sub, "x", 0, 3, 2, &v, &err), 0);
	CU_ASSERT_EQUAL(v, 2);
	jdoc_free(&d);

	/* with no name, the key alone: "{\"n\": \"x\"}" has the value at column 7 */
	parse_ok(&d, "t.json", "{\"n\": \"x\"}");
	jobj_make(&z, &d, d.root, "", "", NULL);
	expect_err(jobj_int(&z, "n", 0, 3, 0, &v, &err), &err,
		   "t.json:1:7: n: expected an integer from 0 to 3, got \"x\"");
	jdoc_free(&d);
}

/* ---- where a value comes from ---- */

static void test_where_overrides(void)
{
	PxError err = {0};
	JsonOverrides ov;
	char where[512];
	JsonDoc d;
	JsonObj z;
	long long v;

	parse_ok(&d, "ds.json", ds_doc);
	jov_init(&ov);
	CU_ASSERT_EQUAL(jov_add(&ov, "deepspeed.zero_optimization.stage=1", &err), 0);
	CU_ASSERT_EQUAL(jov_add(&ov, "deepspeed.zero_optimization.stage=5", &err), 0);
	CU_ASSERT_EQUAL(jov_add(&ov, "deepspeed.zero_optimization.new_key=true", &err), 0);
	/* the caller applies overrides to the tree with the document's own path */
	CU_ASSERT_EQUAL(jdoc_set_path(d.root, "zero_optimization.stage", "1", &err), 0);
	CU_ASSERT_EQUAL(jdoc_set_path(d.root, "zero_optimization.stage", "5", &err), 0);
	ds_zero(&d, &ov, &z);

	/* the last --set of a key wins */
	jobj_where(&z, "stage", where, sizeof(where));
	EXPECT_STR(where, "--set deepspeed.zero_optimization.stage=5");
	jobj_where(&z, "new_key", where, sizeof(where));
	EXPECT_STR(where, "--set deepspeed.zero_optimization.new_key=true");
	jobj_where(&z, "ratio", where, sizeof(where));
	EXPECT_STR(where, "ds.json:7:14");
	jobj_where(&z, "not_there", where, sizeof(where));
	EXPECT_STR(where, "ds.json");
	expect_err(jobj_int(&z, "stage", 0, 3, 0, &v, &err), &err,
		   "--set deepspeed.zero_optimization.stage=5: deepspeed.zero_optimization.stage: "
		   "expected an integer from 0 to 3, got 5");
	jov_free(&ov);
	jdoc_free(&d);
}

/* ---- whole-section --set (scenario.c applies overrides to its documents) ---- */

/* A GPT-2 of L layers as a model config (n_layer is read back as ModelSpec.L). */
static void write_model(const char *path, int layers)
{
	char text[512];
	snprintf(text, sizeof(text), "{\"model_type\": \"gpt2\", \"n_embd\": 64, \"n_layer\": %d, "
		 "\"n_head\": 4, \"n_positions\": 128, \"vocab_size\": 1000}", layers);
	px_test_write_file(path, text);
}

/* scenario.json in dir with the model section model_text (an inline object or a quoted path). */
static const char *write_scenario(const char *dir, const char *model_text)
{
	static char path[512];
	char text[1024];
	snprintf(path, sizeof(path), "%s/scenario.json", dir);
	snprintf(text, sizeof(text), "{\"model\": %s, \"deepspeed\": {\"train_batch_size\": 8}, "
		 "\"cluster\": {\"gpu\": \"H100-SXM\"}, \"seq_length\": 128}", model_text);
	px_test_write_file(path, text);
	return path;
}

/* Load path with the overrides args (NULL-terminated "KEY=VALUE"); returns scenario_load's rc. */
static int load_with(Scenario *sc, const char *path, const char *const *args, PxError *err)
{
	JsonOverrides ov;
	jov_init(&ov);
	for (int i = 0; args[i]; i++)
		CU_ASSERT_EQUAL_FATAL(jov_add(&ov, args[i], err), 0);
	int rc = scenario_load(sc, path, &ov, err);
	jov_free(&ov);
	return rc;
}

/* --set model=... replaces the whole section, whether the scenario's is inline or a file, with an
 * inline object or a file; later --set model.x apply on top of it, earlier ones go with the old
 * section. The layer counts read back are the ones the test wrote into each source. */
static void test_set_whole_section(void)
{
	char dir[256], m2[512], m4[512], arg[600], inline_model[600];
	const char *sections[2];
	PxError err = {0};
	Scenario sc;

	snprintf(dir, sizeof(dir), "%s", px_test_tmpdir());
	snprintf(m2, sizeof(m2), "%s/m2.json", dir);
	snprintf(m4, sizeof(m4), "%s/m4.json", dir);
	write_model(m2, 2);
	write_model(m4, 4);
	sections[0] = "{\"model_type\": \"gpt2\", \"n_embd\": 64, \"n_layer\": 3, \"n_head\": 4, "
		      "\"n_positions\": 128, \"vocab_size\": 1000}";
	sections[1] = "\"m2.json\""; /* relative to the scenario's folder */
	snprintf(inline_model, sizeof(inline_model), "model=%s", sections[0]);
	for (int k = 0; k < 2; k++) {
		const char *path = write_scenario(dir, sections[k]);
		int want_own = k == 0 ? 3 : 2;

		/* no override: the scenario's own section */
		CU_ASSERT_EQUAL_FATAL(load_with(&sc, path, (const char *const[]){NULL}, &err), 0);
		CU_ASSERT_EQUAL(sc.model.L, want_own);
		scenario_free(&sc);

		/* an inline object: a bare parameter count */
		if (load_with(&sc, path, (const char *const[]){"model={\"num_parameters\": 7e9}", NULL},
			      &err))
			fprintf(stderr, "\n%s\n", err.msg);
		CU_ASSERT_EQUAL(sc.model.n_params, 7e9);
		CU_ASSERT_FALSE(model_known(&sc.model));
		/* the resolved JSON holds the section that was used */
		char *json = scenario_resolved_json(&sc, 8, 8);
		CU_ASSERT_PTR_NOT_NULL(json && strstr(json, "\"model\":{\"num_parameters\":7000000000}"));
		free(json);
		scenario_free(&sc);

		/* a file (here by its absolute path), then a key on top of it */
		snprintf(arg, sizeof(arg), "model=%s", m4);
		CU_ASSERT_EQUAL_FATAL(load_with(&sc, path, (const char *const[]){arg, NULL}, &err), 0);
		CU_ASSERT_EQUAL(sc.model.L, 4);
		scenario_free(&sc);
		CU_ASSERT_EQUAL_FATAL(load_with(&sc, path, (const char *const[]){arg, "model.n_layer=6",
										 NULL}, &err), 0);
		CU_ASSERT_EQUAL(sc.model.L, 6);
		scenario_free(&sc);
		/* a key set before the section is replaced goes with the old section */
		CU_ASSERT_EQUAL_FATAL(load_with(&sc, path, (const char *const[]){"model.n_layer=6", arg,
										 NULL}, &err), 0);
		CU_ASSERT_EQUAL(sc.model.L, 4);
		scenario_free(&sc);
		/* an inline config replacing a file section, and the last whole-section --set holds */
		CU_ASSERT_EQUAL_FATAL(load_with(&sc, path, (const char *const[]){arg, inline_model,
										 NULL}, &err), 0);
		CU_ASSERT_EQUAL(sc.model.L, 3);
		scenario_free(&sc);
		/* deepspeed and cluster too */
		CU_ASSERT_EQUAL_FATAL(load_with(&sc, path, (const char *const[]){
			"deepspeed={\"train_batch_size\": 16, \"train_micro_batch_size_per_gpu\": 2}",
			"cluster={\"gpu\": \"A100-40GB\", \"nodes\": 2}", NULL}, &err), 0);
		CU_ASSERT_EQUAL(sc.ds.train_batch, 16);
		CU_ASSERT_EQUAL(sc.ds.micro_batch, 2);
		EXPECT_STR(sc.cluster.gpu.name, "A100-40GB");
		CU_ASSERT_EQUAL(sc.cluster.nodes, 2);
		scenario_free(&sc);
	}
	unlink(m2);
	unlink(m4);
}

/* A whole-section override that cannot be used names the argument; what is wrong inside an inline
 * one is placed in the argument's own text ("--set model:LINE:COL"). */
static void test_set_whole_section_errors(void)
{
	char dir[256], want[1024], arg[600];
	PxError err = {0};
	Scenario sc;

	snprintf(dir, sizeof(dir), "%s", px_test_tmpdir());
	const char *path = write_scenario(dir, "{\"num_parameters\": 1e9}");

	CU_ASSERT_EQUAL(load_with(&sc, path, (const char *const[]){"model=3", NULL}, &err), -1);
	CU_ASSERT_EQUAL(err.code, PX_ERR_INPUT);
	EXPECT_STR(err.msg, "--set model=3: expected an object or the path of a JSON file");
	CU_ASSERT_EQUAL(load_with(&sc, path, (const char *const[]){"cluster=[1, 2]", NULL}, &err),
			-1);
	EXPECT_STR(err.msg, "--set cluster=[1, 2]: expected an object or the path of a JSON file");
	CU_ASSERT_EQUAL(load_with(&sc, path, (const char *const[]){"deepspeed=", NULL}, &err), -1);
	EXPECT_STR(err.msg, "--set deepspeed=: expected an object or the path of a JSON file");

	snprintf(arg, sizeof(arg), "model=%s/none.json", dir);
	CU_ASSERT_EQUAL(load_with(&sc, path, (const char *const[]){arg, NULL}, &err), -1);
	CU_ASSERT_EQUAL(err.code, PX_ERR_INPUT);
	snprintf(want, sizeof(want), "--set %s: %s/none.json: cannot open: No such file or directory",
		 arg, dir);
	EXPECT_STR(err.msg, want);

	/* a file that holds an array, not a section */
	snprintf(arg, sizeof(arg), "%s/arr.json", dir);
	px_test_write_file(arg, "[1]");
	snprintf(arg, sizeof(arg), "deepspeed=%s/arr.json", dir);
	CU_ASSERT_EQUAL(load_with(&sc, path, (const char *const[]){arg, NULL}, &err), -1);
	snprintf(want, sizeof(want), "--set %s: %s/arr.json: expected a JSON object for the "
		 "deepspeed section", arg, dir);
	EXPECT_STR(err.msg, want);

	/* malformed inline JSON: '{"n_layer": 2' ends after 13 bytes */
	CU_ASSERT_EQUAL(load_with(&sc, path, (const char *const[]){"model={\"n_layer\": 2", NULL},
				  &err), -1);
	EXPECT_STR(err.msg, "--set model:1:14: malformed JSON at the end of the file");
	/* a bad value inside: '{"num_parameters": -1}': -1 at column 20 */
	CU_ASSERT_EQUAL(load_with(&sc, path, (const char *const[]){
		"model={\"num_parameters\": -1}", NULL}, &err), -1);
	EXPECT_STR(err.msg, "--set model:1:20: model.num_parameters: expected a number from 1 to "
			    "1e+16, got -1");
	/* a key on top of the replaced section is named as its own argument */
	CU_ASSERT_EQUAL(load_with(&sc, path, (const char *const[]){
		"model={\"num_parameters\": 1e9}", "model.num_parameters=0", NULL}, &err), -1);
	EXPECT_STR(err.msg, "--set model.num_parameters=0: model.num_parameters: expected a number "
			    "from 1 to 1e+16, got 0");
}

/* scenario_derive (a sweep's points) applies whole-section overrides too, on a base loaded without
 * them, and leaves the base as it was. */
static void test_derive_whole_section(void)
{
	char dir[256], m4[512], arg[600];
	PxError err = {0};
	JsonOverrides ov;
	Scenario base, sc;

	snprintf(dir, sizeof(dir), "%s", px_test_tmpdir());
	snprintf(m4, sizeof(m4), "%s/m4.json", dir);
	write_model(m4, 4);
	snprintf(arg, sizeof(arg), "%s/m2.json", dir);
	write_model(arg, 2);
	const char *path = write_scenario(dir, "\"m2.json\"");
	CU_ASSERT_EQUAL_FATAL(scenario_load(&base, path, NULL, &err), 0);

	jov_init(&ov);
	CU_ASSERT_EQUAL(jov_add(&ov, "model={\"num_parameters\": 7e9}", &err), 0);
	CU_ASSERT_EQUAL_FATAL(scenario_derive(&sc, &base, &ov, &err), 0);
	CU_ASSERT_EQUAL(sc.model.n_params, 7e9);
	scenario_free(&sc);
	jov_free(&ov);

	snprintf(arg, sizeof(arg), "model=%s", m4);
	CU_ASSERT_EQUAL(jov_add(&ov, arg, &err), 0);
	CU_ASSERT_EQUAL(jov_add(&ov, "model.n_layer=5", &err), 0);
	CU_ASSERT_EQUAL_FATAL(scenario_derive(&sc, &base, &ov, &err), 0);
	CU_ASSERT_EQUAL(sc.model.L, 5);
	scenario_free(&sc);
	jov_free(&ov);

	/* the base is untouched: a point derived with no overrides is the scenario as written */
	CU_ASSERT_EQUAL(base.model.L, 2);
	CU_ASSERT_EQUAL_FATAL(scenario_derive(&sc, &base, NULL, &err), 0);
	CU_ASSERT_EQUAL(sc.model.L, 2);
	scenario_free(&sc);
	scenario_free(&base);
}

/* ---- unknown keys ---- */

static void test_check_keys(void)
{
	static const char *const known[] = {"stage", "reduce_bucket_size", "offload_param", NULL};
	static const char *const known_q[] = {"stage", "xyz", "q", NULL};
	JsonDoc d;
	JsonObj o;
	PxNotes notes;

	/* line 2 "stgae" 3-9, value 12; line 3 "reduce_bucket_sise" 3-22, value 25;
	 * line 5 "zzzzqqq" 3-11, value 14 */
	parse_ok(&d, "z.json",
		 "{\n"
		 "  \"stgae\": 2,\n"
		 "  \"reduce_bucket_sise\": 5e8,\n"
		 "  \"stage\": 1,\n"
		 "  \"zzzzqqq\": 1\n"
		 "}\n");
	px_notes_init(&notes);
	jobj_make(&o, &d, d.root, "", "deepspeed.zero_optimization", NULL);
	CU_ASSERT_EQUAL(jobj_check_keys(&o, known, &notes), 0);
	CU_ASSERT_EQUAL_FATAL(notes.n_warnings, 3);
	EXPECT_STR(notes.warnings[0],
		   "z.json:2:12: warning: unknown key 'deepspeed.zero_optimization.stgae'; "
		   "did you mean 'deepspeed.zero_optimization.stage'?");
	EXPECT_STR(notes.warnings[1],
		   "z.json:3:25: warning: unknown key "
		   "'deepspeed.zero_optimization.reduce_bucket_sise'; "
		   "did you mean 'deepspeed.zero_optimization.reduce_bucket_size'?");
	EXPECT_STR(notes.warnings[2],
		   "z.json:5:14: warning: unknown key 'deepspeed.zero_optimization.zzzzqqq'");
	px_notes_free(&notes);
	jdoc_free(&d);

	/* no name: the key alone. "ab" is 2 edits from "q" but only 2 long and "a" 1 edit from
	 * "q" but 1 long: neither reads as a typo. "stagexyz" is 3 edits from "stage" (suggested),
	 * "stagewxyz" 4 (not). Values: "stag" 10; ", \"ab\": " puts "ab"'s at 19, "a"'s at 27,
	 * "stagexyz" 30-39 so its value at 42, "stagewxyz" 45-55 so its value at 58. */
	parse_ok(&d, "t.json",
		 "{\"stag\": 1, \"ab\": 2, \"a\": 3, \"stagexyz\": 4, \"stagewxyz\": 5}");
	px_notes_init(&notes);
	jobj_make(&o, &d, d.root, "", "", NULL);
	CU_ASSERT_EQUAL(jobj_check_keys(&o, known_q, &notes), 0);
	CU_ASSERT_EQUAL_FATAL(notes.n_warnings, 5);
	EXPECT_STR(notes.warnings[0], "t.json:1:10: warning: unknown key 'stag'; "
				      "did you mean 'stage'?");
	EXPECT_STR(notes.warnings[1], "t.json:1:19: warning: unknown key 'ab'");
	EXPECT_STR(notes.warnings[2], "t.json:1:27: warning: unknown key 'a'");
	EXPECT_STR(notes.warnings[3], "t.json:1:42: warning: unknown key 'stagexyz'; "
				      "did you mean 'stage'?");
	EXPECT_STR(notes.warnings[4], "t.json:1:58: warning: unknown key 'stagewxyz'");
	px_notes_free(&notes);
	jdoc_free(&d);
}

static void test_edit_distance(void)
{
	char a[301], b[201];

	CU_ASSERT_EQUAL(jdoc_edit_distance("kitten", "sitting"), 3);
	CU_ASSERT_EQUAL(jdoc_edit_distance("sitting", "kitten"), 3);
	CU_ASSERT_EQUAL(jdoc_edit_distance("saturday", "sunday"), 3);
	CU_ASSERT_EQUAL(jdoc_edit_distance("flaw", "lawn"), 2);
	CU_ASSERT_EQUAL(jdoc_edit_distance("stgae", "stage"), 2);
	CU_ASSERT_EQUAL(jdoc_edit_distance("", "abc"), 3);
	CU_ASSERT_EQUAL(jdoc_edit_distance("abc", ""), 3);
	CU_ASSERT_EQUAL(jdoc_edit_distance("", ""), 0);
	CU_ASSERT_EQUAL(jdoc_edit_distance("stage", "stage"), 0);
	/* long strings: 300 'a' against 200 'b' share nothing, so 200 substitutions and 100
	 * insertions; against 200 'a' plain deletions, 100 */
	memset(a, 'a', 300);
	a[300] = '\0';
	memset(b, 'b', 200);
	b[200] = '\0';
	CU_ASSERT_EQUAL(jdoc_edit_distance(a, b), 300);
	memset(b, 'a', 200);
	CU_ASSERT_EQUAL(jdoc_edit_distance(a, b), 100);
}

int test_jdoc_register(void)
{
	return PX_ADD_SUITE("jdoc",
			    {"locate finds nested keys", test_locate},
			    {"locate copes with odd text", test_locate_odd_text},
			    {"malformed JSON gives line:col", test_malformed},
			    {"duplicate keys: the first repeat, 100,000 keys too", test_duplicates},
			    {"load errors name the file", test_load_errors},
			    {"load refuses devices, FIFOs and huge files", test_load_refuses_non_files},
			    {"--set arguments are split and checked", test_jov_add},
			    {"--set key and value apart = KEY=VALUE", test_jov_add_kv},
			    {"set_path parses, creates and refuses", test_set_path},
			    {"integer getter", test_get_int},
			    {"number, bool and string getters", test_get_num_bool_str},
			    {"number-or-auto and child getters", test_get_auto_child},
			    {"where names overrides and positions", test_where_overrides},
			    {"--set SECTION= replaces a whole section", test_set_whole_section},
			    {"--set SECTION= errors name the argument", test_set_whole_section_errors},
			    {"derive applies whole-section overrides", test_derive_whole_section},
			    {"unknown keys get suggestions", test_check_keys},
			    {"edit distance", test_edit_distance});
}

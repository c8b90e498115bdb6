/* Black-box tests of the parallax binary (PX_BIN): what `predict` refuses and how it says so (exit
 * status 2, one line naming the file, the key and what was expected), what it only warns about, what
 * it prints and stores for a good scenario, and the help texts. The database a run may write is read
 * back with sqlite3 directly; an input error must leave it untouched. Expected line:col positions are
 * counted by hand from the texts written here (1-based, columns in bytes). Each test works in a fresh
 * directory from px_test_tmpdir(), which the runner removes when it exits. */
#include <CUnit/CUnit.h>
#include <cjson/cJSON.h>
#include <limits.h>
#include <math.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "suites.h"

/* ---- helpers ---- */

static char test_dir[256];  /* this test's directory */
static char db_path[512];   /* test_dir/x.db: passed as --db, must stay empty on errors */
static char out[1 << 16];   /* the last run's stdout and stderr */
static char err_line[2048]; /* its "parallax predict: ..." line, or "" */

/* A small GPT-2 (64 channels, 2 layers, 128 positions): fast to price, exact shape known. */
#define SMALL_MODEL                                                                            \
	"{\"model_type\": \"gpt2\", \"n_embd\": 64, \"n_layer\": 2, \"n_head\": 4, "             \
	"\"n_positions\": 128, \"vocab_size\": 1000}"

static void new_test_dir(void)
{
	snprintf(test_dir, sizeof(test_dir), "%s", px_test_tmpdir());
	snprintf(db_path, sizeof(db_path), "%s/x.db", test_dir);
}

/* test_dir/name; four rotating static buffers, so that a call can use a few at once. */
static const char *at(const char *name)
{
	static char bufs[4][1024];
	static int next;
	char *b = bufs[next++ % 4];
	snprintf(b, sizeof(bufs[0]), "%s/%s", test_dir, name);
	return b;
}

static void write_at(const char *name, const char *text)
{
	px_test_write_file(at(name), text);
}

/* Absolute path of a repository file: a section path that is not absolute would be read relative
 * to the scenario's folder (the test directory). Static buffer. */
static const char *repo_file(const char *rel)
{
	static char buf[PATH_MAX];
	if (!realpath(px_test_path(rel), buf)) {
		fprintf(stderr, "\ncannot resolve %s\n", px_test_path(rel));
		CU_FAIL_FATAL("repository file not found (is PX_ROOT set?)");
	}
	return buf;
}

/* Run parallax with printf-style arguments (quote paths with '...'); the output lands in out and
 * its error line in err_line. Returns the exit status. */
static int run(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int run(const char *fmt, ...)
{
	char args[4096];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(args, sizeof(args), fmt, ap);
	va_end(ap);
	int rc = px_test_run_cli(args, out, sizeof(out));
	const char *e = strstr(out, "parallax predict: ");
	size_t n = e ? strcspn(e, "\n") : 0;
	if (n >= sizeof(err_line))
		n = sizeof(err_line) - 1;
	memcpy(err_line, e ? e : "", n);
	err_line[n] = '\0';
	return rc;
}

/* Assert that text contains needle; on failure show both, since CUnit shows only the line. */
#define ASSERT_HAS(text, needle) assert_has((text), (needle), __LINE__)
static void assert_has(const char *text, const char *needle, unsigned line)
{
	int ok = strstr(text, needle) != NULL;
	if (!ok)
		fprintf(stderr, "\n%s:%u: expected \"%s\" in:\n%s\n", __FILE__, line, needle, text);
	CU_assertImplementation(ok ? CU_TRUE : CU_FALSE, line, "ASSERT_HAS(text, needle)", __FILE__,
				"", CU_FALSE);
}

/* Assert the exit status; on failure show what the program printed. */
#define ASSERT_RC(rc, want) assert_rc((rc), (want), __LINE__)
static void assert_rc(int rc, int want, unsigned line)
{
	if (rc != want)
		fprintf(stderr, "\n%s:%u: exit status %d, expected %d; output:\n%s\n", __FILE__, line,
			rc, want, out);
	CU_assertImplementation(rc == want ? CU_TRUE : CU_FALSE, line, "ASSERT_RC(rc, want)",
				__FILE__, "", CU_FALSE);
}

/* The first column of the first row of sql as an integer; -1 when the database is not there or the
 * query fails. Opened without SQLITE_OPEN_CREATE, so that looking creates nothing. */
static long long db_int(const char *path, const char *sql)
{
	sqlite3 *db = NULL;
	sqlite3_stmt *st = NULL;
	long long v = -1;

	if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE, NULL) != SQLITE_OK)
		goto out;
	if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK) {
		fprintf(stderr, "\n%s: %s: %s\n", path, sql, sqlite3_errmsg(db));
		goto out;
	}
	if (sqlite3_step(st) == SQLITE_ROW)
		v = sqlite3_column_int64(st, 0);
out:
	sqlite3_finalize(st);
	sqlite3_close(db);
	return v;
}

/* As db_int for a REAL; NAN when there is no value. */
static double db_double(const char *path, const char *sql)
{
	sqlite3 *db = NULL;
	sqlite3_stmt *st = NULL;
	double v = NAN;

	if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE, NULL) != SQLITE_OK)
		goto out;
	if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK) {
		fprintf(stderr, "\n%s: %s: %s\n", path, sql, sqlite3_errmsg(db));
		goto out;
	}
	if (sqlite3_step(st) == SQLITE_ROW && sqlite3_column_type(st, 0) != SQLITE_NULL)
		v = sqlite3_column_double(st, 0);
out:
	sqlite3_finalize(st);
	sqlite3_close(db);
	return v;
}

/* The database at path was not written: it does not exist, or it has no runs. */
#define ASSERT_NOTHING_STORED(path) \
	CU_ASSERT(access((path), F_OK) != 0 || db_int((path), "SELECT COUNT(*) FROM runs") == 0)

/* Write ds.json with ds_text and s.json, a scenario that reads it by path next to the small model
 * on one DGX H100 (8 GPUs): the scenario's text is fixed, so positions in it are known. */
static void write_with_ds(const char *ds_text)
{
	write_at("ds.json", ds_text);
	write_at("s.json", "{\n"
			   "  \"model\": " SMALL_MODEL ",\n"
			   "  \"deepspeed\": \"ds.json\",\n"
			   "  \"cluster\": {\"gpu\": \"H100-SXM\", \"nodes\": 1, \"gpus_per_node\": 8},\n"
			   "  \"seq_length\": 128\n"
			   "}\n");
}

/* A scenario whose whole deepspeed section is the inline object ds. */
static void write_inline(const char *name, const char *ds)
{
	char text[2048];
	snprintf(text, sizeof(text),
		 "{\n"
		 "  \"model\": " SMALL_MODEL ",\n"
		 "  \"deepspeed\": %s,\n"
		 "  \"cluster\": {\"gpu\": \"H100-SXM\"},\n"
		 "  \"seq_length\": 128\n"
		 "}\n",
		 ds);
	write_at(name, text);
}

static const cJSON *json_at(const cJSON *root, const char *dotted)
{
	char buf[256], *seg, *save = NULL;
	const cJSON *v = root;
	snprintf(buf, sizeof(buf), "%s", dotted);
	for (seg = strtok_r(buf, ".", &save); seg && v; seg = strtok_r(NULL, ".", &save))
		v = cJSON_GetObjectItemCaseSensitive(v, seg);
	return v;
}

/* The number at a dotted key; NAN (and a failed assertion naming the key) when it is not one. */
static double json_num(const cJSON *root, const char *dotted)
{
	const cJSON *v = json_at(root, dotted);
	if (!cJSON_IsNumber(v))
		fprintf(stderr, "\nJSON key %s: expected a number\n", dotted);
	CU_ASSERT(cJSON_IsNumber(v));
	return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

/* ---- malformed JSON ---- */

static void test_malformed_scenario(void)
{
	new_test_dir();
	/* the comma after the deepspeed object is missing: the parser stops at line 4, column 3,
	 * the quote that opens "cluster" (two spaces of indent before it) */
	write_at("bad.json", "{\n"
			     "  \"model\": " SMALL_MODEL ",\n"
			     "  \"deepspeed\": {\"train_batch_size\": 8}\n"
			     "  \"cluster\": {\"gpu\": \"H100-SXM\"},\n"
			     "  \"seq_length\": 128\n"
			     "}\n");
	int rc = run("predict --db '%s' '%s'", db_path, at("bad.json"));
	ASSERT_RC(rc, 2);
	char want[1100];
	snprintf(want, sizeof(want), "%s:4:3: malformed JSON", at("bad.json"));
	ASSERT_HAS(err_line, want);
	ASSERT_HAS(err_line, "\"cluster\"");
	ASSERT_NOTHING_STORED(db_path);
}

static void test_malformed_section_file(void)
{
	new_test_dir();
	/* line 5 follows "stage": 2 without a comma; its key opens at column 5 (four spaces) */
	write_with_ds("{\n"
		      "  \"train_batch_size\": 8,\n"
		      "  \"zero_optimization\": {\n"
		      "    \"stage\": 2\n"
		      "    \"overlap_comm\": true\n"
		      "  }\n"
		      "}\n");
	int rc = run("predict --db '%s' '%s'", db_path, at("s.json"));
	ASSERT_RC(rc, 2);
	char want[1100];
	snprintf(want, sizeof(want), "%s:5:5: malformed JSON", at("ds.json"));
	ASSERT_HAS(err_line, want);
	ASSERT_NOTHING_STORED(db_path);
}

/* ---- wrong types and ranges ---- */

static void test_stage_wrong_type(void)
{
	new_test_dir();
	/* `    "stage": "three"`: 4 spaces, 7 for "stage", ':' at 12, the value at column 14 */
	write_with_ds("{\n"
		      "  \"train_batch_size\": 8,\n"
		      "  \"zero_optimization\": {\n"
		      "    \"stage\": \"three\"\n"
		      "  }\n"
		      "}\n");
	int rc = run("predict --db '%s' '%s'", db_path, at("s.json"));
	ASSERT_RC(rc, 2);
	char want[1100];
	snprintf(want, sizeof(want), "%s:4:14: ", at("ds.json"));
	ASSERT_HAS(err_line, want);
	ASSERT_HAS(err_line, "deepspeed.zero_optimization.stage");
	ASSERT_HAS(err_line, "expected an integer from 0 to 3");
	ASSERT_HAS(err_line, "got \"three\"");
	ASSERT_NOTHING_STORED(db_path);
}

static void test_stage_out_of_range(void)
{
	new_test_dir();
	write_with_ds("{\n"
		      "  \"train_batch_size\": 8,\n"
		      "  \"zero_optimization\": {\n"
		      "    \"stage\": 4\n"
		      "  }\n"
		      "}\n");
	int rc = run("predict --db '%s' '%s'", db_path, at("s.json"));
	ASSERT_RC(rc, 2);
	char want[1100];
	snprintf(want, sizeof(want), "%s:4:14: deepspeed.zero_optimization.stage: expected an "
		 "integer from 0 to 3, got 4", at("ds.json"));
	ASSERT_HAS(err_line, want);
	ASSERT_NOTHING_STORED(db_path);
}

static void test_negative_batch(void)
{
	new_test_dir();
	/* `  "train_batch_size": -8`: 2 spaces, 18 for the key, ':' at 21, the value at column 23 */
	write_with_ds("{\n"
		      "  \"train_batch_size\": -8\n"
		      "}\n");
	int rc = run("predict --db '%s' '%s'", db_path, at("s.json"));
	ASSERT_RC(rc, 2);
	char want[1100];
	snprintf(want, sizeof(want), "%s:2:23: ", at("ds.json"));
	ASSERT_HAS(err_line, want);
	ASSERT_HAS(err_line, "train_batch_size");
	ASSERT_HAS(err_line, "got -8");
	ASSERT_NOTHING_STORED(db_path);
}

static void test_batch_arithmetic(void)
{
	new_test_dir();
	/* DeepSpeed's check: train_batch_size == micro * accumulation * dp; 4 * 2 * 8 = 64, not 100 */
	write_inline("s.json", "{\"train_batch_size\": 100, \"train_micro_batch_size_per_gpu\": 4, "
			       "\"gradient_accumulation_steps\": 2}");
	int rc = run("predict --db '%s' '%s'", db_path, at("s.json"));
	ASSERT_RC(rc, 2);
	ASSERT_HAS(err_line, at("s.json"));
	ASSERT_HAS(err_line, "train_batch_size");
	ASSERT_HAS(err_line, "100 != 4 * 2 * 8");
	/* it points at the batch key: line 3 of the inline scenario, after "deepspeed": { */
	ASSERT_HAS(err_line, "s.json:");
	ASSERT_NOTHING_STORED(db_path);
}

/* ---- missing files ---- */

static void test_missing_files(void)
{
	new_test_dir();
	int rc = run("predict --db '%s' '%s'", db_path, at("nope.json"));
	ASSERT_RC(rc, 2);
	ASSERT_HAS(err_line, at("nope.json"));
	ASSERT_HAS(err_line, "cannot open");
	ASSERT_NOTHING_STORED(db_path);

	/* the model by absolute path exists; the deepspeed file named next to the scenario does not */
	char text[PATH_MAX + 256];
	snprintf(text, sizeof(text),
		 "{\n"
		 "  \"model\": \"%s\",\n"
		 "  \"deepspeed\": \"no-such-ds.json\",\n"
		 "  \"cluster\": {\"gpu\": \"H100-SXM\"},\n"
		 "  \"seq_length\": 128\n"
		 "}\n",
		 repo_file("scenarios/models/gpt2.json"));
	write_at("s.json", text);
	rc = run("predict --db '%s' '%s'", db_path, at("s.json"));
	ASSERT_RC(rc, 2);
	ASSERT_HAS(err_line, at("no-such-ds.json"));
	ASSERT_HAS(err_line, "cannot open");
	ASSERT_NOTHING_STORED(db_path);

	/* a device and a FIFO are refused without reading (a FIFO's open would block: the timeout
	 * ends the run with 124 if it does), a model section from /dev/zero too */
	rc = run("predict --db '%s' /dev/zero", db_path);
	ASSERT_RC(rc, 2);
	ASSERT_HAS(err_line, "parallax predict: /dev/zero: not a regular file");
	CU_ASSERT_EQUAL_FATAL(mkfifo(at("fifo.json"), 0600), 0);
	char args[1024];
	snprintf(args, sizeof(args), "predict --db '%s' '%s'", db_path, at("fifo.json"));
	rc = px_test_run_release(args, 20, out, sizeof(out));
	ASSERT_RC(rc, 2);
	ASSERT_HAS(out, "fifo.json: not a regular file");
	write_inline("good.json", "{\"train_batch_size\": 8}");
	rc = run("predict --db '%s' --set model=/dev/zero '%s'", db_path, at("good.json"));
	ASSERT_RC(rc, 2);
	ASSERT_HAS(err_line, "--set model=/dev/zero: /dev/zero: not a regular file");
	ASSERT_NOTHING_STORED(db_path);

	/* compare reads a database that exists and creates none */
	rc = run("compare --db '%s'", at("missing.db"));
	ASSERT_RC(rc, 2);
	ASSERT_HAS(out, "parallax compare: ");
	ASSERT_HAS(out, "missing.db: cannot open");
	CU_ASSERT_EQUAL(access(at("missing.db"), F_OK), -1);
}

/* ---- the cluster ---- */

static void test_unknown_gpu(void)
{
	new_test_dir();
	/* `  "cluster": {"gpu": "Z100"},`: "Z100" opens at column 22 of line 4 */
	write_at("s.json", "{\n"
			   "  \"model\": " SMALL_MODEL ",\n"
			   "  \"deepspeed\": {\"train_batch_size\": 8},\n"
			   "  \"cluster\": {\"gpu\": \"Z100\"},\n"
			   "  \"seq_length\": 128\n"
			   "}\n");
	int rc = run("predict --db '%s' '%s'", db_path, at("s.json"));
	ASSERT_RC(rc, 2);
	char want[1100];
	snprintf(want, sizeof(want), "%s:4:22: cluster.gpu", at("s.json"));
	ASSERT_HAS(err_line, want);
	ASSERT_HAS(err_line, "Z100");
	/* the catalog of `parallax gpus`, so the user can pick one */
	static const char *const known[] = {"V100-32GB", "A100-40GB", "A100-80GB", "H100-SXM",
					    "H100-PCIe", "H200"};
	for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++)
		ASSERT_HAS(err_line, known[i]);
	ASSERT_NOTHING_STORED(db_path);
}

/* ---- --set ---- */

static void test_set_errors(void)
{
	new_test_dir();
	write_inline("s.json", "{\"train_batch_size\": 8}");
	int rc = run("predict --db '%s' --set nokey '%s'", db_path, at("s.json"));
	ASSERT_RC(rc, 2);
	ASSERT_HAS(err_line, "--set nokey");
	ASSERT_HAS(err_line, "KEY=VALUE");
	ASSERT_NOTHING_STORED(db_path);

	rc = run("predict --db '%s' --set deepspeed.zero_optimization.stage=9 '%s'", db_path,
		 at("s.json"));
	ASSERT_RC(rc, 2);
	ASSERT_HAS(err_line, "--set deepspeed.zero_optimization.stage=9: ");
	ASSERT_HAS(err_line, "deepspeed.zero_optimization.stage: expected an integer from 0 to 3, "
			     "got 9");
	ASSERT_NOTHING_STORED(db_path);

	/* the last --set of a key holds, and the message names that one */
	rc = run("predict --db '%s' --set deepspeed.zero_optimization.stage=3 "
		 "--set deepspeed.zero_optimization.stage=-1 '%s'", db_path, at("s.json"));
	ASSERT_RC(rc, 2);
	ASSERT_HAS(err_line, "--set deepspeed.zero_optimization.stage=-1: ");
	ASSERT_HAS(err_line, "got -1");
	ASSERT_NOTHING_STORED(db_path);

	/* a structural error names the argument as typed, section included */
	rc = run("predict --db '%s' --set deepspeed.train_batch_size.x=3 '%s'", db_path,
		 at("s.json"));
	ASSERT_RC(rc, 2);
	ASSERT_HAS(err_line, "--set deepspeed.train_batch_size.x=3: 'train_batch_size' is not an "
			     "object");
	ASSERT_NOTHING_STORED(db_path);
}

/* --set model.num_parameters over an architecture config: the count wins, with a warning, and
 * ZeRO-3's ideal model states follow it: 16 x 1e12 / 8 = 2e12 bytes. */
static void test_set_num_parameters(void)
{
	new_test_dir();
	int rc = run("predict --no-db --json --set model.num_parameters=1e12 "
		     "--set deepspeed.zero_optimization.stage=3 '%s'",
		     repo_file("scenarios/llama2-7b-zero2-h100.json"));
	ASSERT_RC(rc, 0);
	cJSON *j = cJSON_Parse(out);
	CU_ASSERT_PTR_NOT_NULL_FATAL(j);
	CU_ASSERT_DOUBLE_EQUAL(json_num(j, "num_parameters"), 1e12, 0);
	CU_ASSERT_DOUBLE_EQUAL(json_num(j, "memory.ideal_model_states_bytes"), 2e12, 0);
	CU_ASSERT(cJSON_IsNull(json_at(j, "memory.gpu.activations_bytes")));
	ASSERT_HAS(out, "the llama architecture is not used");
	cJSON_Delete(j);
}

/* Run parallax from dir (paths on its command line are then relative to dir), as run() does. */
static int run_in(const char *dir, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int run_in(const char *dir, const char *fmt, ...)
{
	char args[4096], cmd[8192];
	const char *bin = getenv("PX_BIN");
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(args, sizeof(args), fmt, ap);
	va_end(ap);
	snprintf(cmd, sizeof(cmd), "cd '%s' && '%s' %s", dir, bin ? bin : "parallax", args);
	return px_test_run_sh(cmd, out, sizeof(out));
}

/* The small model's parameter count with L layers (GPT-2, h = 64, V = 1000, 128 positions, tied
 * head): token and position embeddings 1000 h + 128 h = 72,192, the final LayerNorm 2h = 128, and
 * per block 12 h^2 + 13 h = 49,984 (LayerNorms 4h, QKV 3h^2 + 3h, attention projection h^2 + h, MLP
 * 8h^2 + 5h). */
static double small_model_params(int layers)
{
	return 72192 + 128 + 49984.0 * layers;
}

/* --set model=... replaces the whole section through the binary, from an inline object or from a
 * file named relative to the current directory (not the scenario's folder), whether the scenario's
 * own section is inline or a file. The inline case used freed memory before (the sanitizer build
 * runs this too). */
static void test_set_whole_section(void)
{
	new_test_dir();
	CU_ASSERT_EQUAL_FATAL(mkdir(at("sc"), 0755), 0);
	/* sc/m.json (the scenario's own, 2 layers) and m.json in the current directory (4 layers) */
	write_at("sc/m.json", SMALL_MODEL);
	write_at("m.json", "{\"model_type\": \"gpt2\", \"n_embd\": 64, \"n_layer\": 4, \"n_head\": 4, "
			   "\"n_positions\": 128, \"vocab_size\": 1000}");
	static const char *const rest = "\"deepspeed\": {\"train_batch_size\": 8}, \"cluster\": "
					"{\"gpu\": \"H100-SXM\"}, \"seq_length\": 128}";
	char text[1024];
	snprintf(text, sizeof(text), "{\"model\": \"m.json\", %s", rest);
	write_at("sc/file.json", text);
	snprintf(text, sizeof(text), "{\"model\": %s, %s", SMALL_MODEL, rest);
	write_at("sc/inline.json", text);

	static const char *const scenarios[] = {"sc/file.json", "sc/inline.json"};
	for (int k = 0; k < 2; k++) {
		int rc = run_in(test_dir, "predict --no-db --json '%s'", scenarios[k]);
		ASSERT_RC(rc, 0);
		cJSON *j = cJSON_Parse(out);
		CU_ASSERT_DOUBLE_EQUAL(json_num(j, "num_parameters"), small_model_params(2), 0);
		cJSON_Delete(j);

		rc = run_in(test_dir, "predict --no-db --json --set model=m.json '%s'", scenarios[k]);
		ASSERT_RC(rc, 0);
		j = cJSON_Parse(out);
		CU_ASSERT_DOUBLE_EQUAL(json_num(j, "num_parameters"), small_model_params(4), 0);
		cJSON_Delete(j);

		/* a key on top of the replaced section */
		rc = run_in(test_dir, "predict --no-db --json --set model=m.json --set model.n_layer=5 "
			    "'%s'", scenarios[k]);
		ASSERT_RC(rc, 0);
		j = cJSON_Parse(out);
		CU_ASSERT_DOUBLE_EQUAL(json_num(j, "num_parameters"), small_model_params(5), 0);
		cJSON_Delete(j);

		rc = run_in(test_dir, "predict --no-db --json --set 'model={\"num_parameters\": 7e9}' "
			    "'%s'", scenarios[k]);
		ASSERT_RC(rc, 0);
		j = cJSON_Parse(out);
		CU_ASSERT_DOUBLE_EQUAL(json_num(j, "num_parameters"), 7e9, 0);
		cJSON_Delete(j);

		/* a file that is not there: exit 2, the argument named, nothing stored */
		rc = run_in(test_dir, "predict --db '%s' --set model=nope.json '%s'", db_path,
			    scenarios[k]);
		ASSERT_RC(rc, 2);
		ASSERT_HAS(out, "parallax predict: --set model=nope.json: nope.json: cannot open: No "
				"such file or directory");
		ASSERT_NOTHING_STORED(db_path);
	}
}

/* A pipelined schedule over the op limit is refused at once, before anything is built: pp 2 with
 * 3 million micro-batches (the batch arithmetic allows it) took 10 s and 3.4 GB for this 2-layer
 * model and minutes for a real one. Under timeout(1), so that a regression fails instead of
 * hanging the suite. */
static void test_schedule_limit(void)
{
	char cmd[4096];
	const char *bin = getenv("PX_BIN");
	new_test_dir();
	write_at("pp2.json", "{\"model\": " SMALL_MODEL ", \"deepspeed\": "
			     "{\"train_micro_batch_size_per_gpu\": 1, \"gradient_accumulation_steps\": "
			     "3000000}, \"cluster\": {\"gpu\": \"H100-SXM\", \"gpus_per_node\": 2}, "
			     "\"parallelism\": {\"pp\": 2}, \"seq_length\": 128}");
	snprintf(cmd, sizeof(cmd), "timeout 60 '%s' predict --db '%s' '%s'", bin ? bin : "parallax",
		 db_path, at("pp2.json"));
	int rc = px_test_run_sh(cmd, out, sizeof(out));
	ASSERT_RC(rc, 2);
	ASSERT_HAS(out, "pp2.json: the pipelined schedule of 3000000 micro-batches (gradient "
			"accumulation) on 2 stages would hold ");
	ASSERT_HAS(out, " ops, over the limit of 8000000 (366 MiB of schedule); use fewer "
			"micro-batches: a larger train_micro_batch_size_per_gpu gives the same batch in "
			"fewer");
	ASSERT_NOTHING_STORED(db_path);
}

/* ---- warnings and refusals ---- */

static void test_unknown_key_warnings(void)
{
	new_test_dir();
	/* a misspelt section: the suggestion is the full logical name */
	write_inline("a.json", "{\"train_batch_size\": 8, \"zero_optimisation\": {\"stage\": 2}}");
	int rc = run("predict --no-db '%s'", at("a.json"));
	ASSERT_RC(rc, 0);
	ASSERT_HAS(out, "warning: unknown key 'deepspeed.zero_optimisation'; "
			"did you mean 'deepspeed.zero_optimization'?");

	/* a misspelt key inside a section, in a file read by path: the warning has its position,
	 * `    "stgae": 2` -> the value at line 4, column 14 */
	write_with_ds("{\n"
		      "  \"train_batch_size\": 8,\n"
		      "  \"zero_optimization\": {\n"
		      "    \"stgae\": 2\n"
		      "  }\n"
		      "}\n");
	rc = run("predict --no-db '%s'", at("s.json"));
	ASSERT_RC(rc, 0);
	char want[1100];
	snprintf(want, sizeof(want), "%s:4:14: warning: unknown key "
		 "'deepspeed.zero_optimization.stgae'; did you mean "
		 "'deepspeed.zero_optimization.stage'?", at("ds.json"));
	ASSERT_HAS(out, want);

	/* and the same line in --json, under notes.warnings */
	rc = run("predict --no-db --json '%s'", at("s.json"));
	ASSERT_RC(rc, 0);
	cJSON *j = cJSON_Parse(out);
	CU_ASSERT_PTR_NOT_NULL_FATAL(j);
	const cJSON *w = json_at(j, "notes.warnings");
	int found = 0;
	for (const cJSON *e = w ? w->child : NULL; e; e = e->next)
		found |= cJSON_IsString(e) && strcmp(e->valuestring, want) == 0;
	CU_ASSERT(found);
	cJSON_Delete(j);
}

static void test_refused_combinations(void)
{
	new_test_dir();
	/* 1-bit Adam with ZeRO: engine.py asserts "1bit-Adam is not compatible with ZeRO";
	 * `  "optimizer": {"type": "OneBitAdam"},` -> the type's value at 3:25 */
	write_with_ds("{\n"
		      "  \"train_batch_size\": 8,\n"
		      "  \"optimizer\": {\"type\": \"OneBitAdam\"},\n"
		      "  \"zero_optimization\": {\"stage\": 2}\n"
		      "}\n");
	int rc = run("predict --db '%s' '%s'", db_path, at("s.json"));
	ASSERT_RC(rc, 2);
	char want[1100];
	snprintf(want, sizeof(want), "%s:3:25: deepspeed.optimizer.type", at("ds.json"));
	ASSERT_HAS(err_line, want);
	ASSERT_HAS(err_line, "ZeRO stage 2");
	ASSERT_HAS(err_line, "1bit-Adam is not compatible with ZeRO");
	ASSERT_NOTHING_STORED(db_path);

	/* parameter offload below stage 3 is not refused: DeepSpeed ignores it, and so does the
	 * prediction, with a warning at 5:22 */
	write_with_ds("{\n"
		      "  \"train_batch_size\": 8,\n"
		      "  \"zero_optimization\": {\n"
		      "    \"stage\": 2,\n"
		      "    \"offload_param\": {\"device\": \"cpu\"}\n"
		      "  }\n"
		      "}\n");
	rc = run("predict --no-db '%s'", at("s.json"));
	ASSERT_RC(rc, 0);
	snprintf(want, sizeof(want), "%s:5:22: warning: deepspeed.zero_optimization.offload_param: "
		 "device cpu is ignored at ZeRO stage 2", at("ds.json"));
	ASSERT_HAS(out, want);

	/* DeepSpeed: "bfloat16 and fp16 modes cannot be simultaneously enabled" */
	write_with_ds("{\n"
		      "  \"train_batch_size\": 8,\n"
		      "  \"fp16\": {\"enabled\": true},\n"
		      "  \"bf16\": {\"enabled\": true}\n"
		      "}\n");
	rc = run("predict --db '%s' '%s'", db_path, at("s.json"));
	ASSERT_RC(rc, 2);
	ASSERT_HAS(err_line, at("ds.json"));
	ASSERT_HAS(err_line, "fp16 and bf16");
	ASSERT_NOTHING_STORED(db_path);
}

/* --keep-going: a refused scenario among priced ones is reported with its path and reason, the
 * others are priced all the same, and the status says something was refused (2). Without
 * --no-db it is a usage error. */
static void test_keep_going(void)
{
	new_test_dir();
	write_inline("a.json", "{\"train_micro_batch_size_per_gpu\": 1}");
	write_inline("b.json", "{\"train_micro_batch_size_per_gpu\": 1, \"optimizer\": {\"type\":"
			       " \"OneBitAdam\"}, \"zero_optimization\": {\"stage\": 1}}");
	write_inline("c.json", "{\"train_micro_batch_size_per_gpu\": 2}");
	int rc = run("predict --no-db --keep-going '%s' '%s' '%s'", at("a.json"), at("b.json"),
		     at("c.json"));
	ASSERT_RC(rc, 2);
	char want[1100];
	snprintf(want, sizeof(want), "parallax predict: refused %s: ", at("b.json"));
	ASSERT_HAS(out, want);
	ASSERT_HAS(out, "1bit-Adam is not compatible with ZeRO");
	ASSERT_HAS(out, "\na ");
	ASSERT_HAS(out, "\nc ");
	ASSERT_HAS(out, "# 3 scenarios: 2 priced, 1 refused");
	rc = run("predict --no-db --keep-going '%s' '%s'", at("a.json"), at("c.json"));
	ASSERT_RC(rc, 0);
	ASSERT_HAS(out, "# 2 scenarios: 2 priced, 0 refused");
	rc = run("predict --db '%s' --keep-going '%s'", db_path, at("a.json"));
	ASSERT_RC(rc, 2);
	ASSERT_HAS(out, "--keep-going takes --no-db");
	ASSERT_NOTHING_STORED(db_path);
}

/* The attention key through the binary: a value it does not know is refused where the scenario
 * is read (the key, both values, what was given; exit 2, nothing stored). FlashAttention on a
 * V100, whose profile gives it no rate, cannot be timed: as for any step predict cannot price,
 * the memory is still predicted and stored (exit 0) and the step time is reported as not priced,
 * with the reason. */
static void test_attention_refused(void)
{
	new_test_dir();
	write_with_ds("{\"train_batch_size\": 8, \"fp16\": {\"enabled\": true}}\n");
	int rc = run("predict --db '%s' '%s' --set attention=sdpa", db_path, at("s.json"));
	ASSERT_RC(rc, 2);
	ASSERT_HAS(err_line, "--set attention=sdpa: attention: expected one of eager, flash, "
			     "got \"sdpa\"");
	ASSERT_NOTHING_STORED(db_path);
	rc = run("predict --db '%s' '%s' --set attention=flash --set cluster.gpu=V100-32GB", db_path,
		 at("s.json"));
	ASSERT_RC(rc, 0);
	ASSERT_HAS(out, "# step time: not priced: ");
	ASSERT_HAS(out, "attention: \"flash\" cannot be timed on V100-32GB");
	ASSERT_HAS(out, "compute.flash_forward and flash_backward must be above 0");
	CU_ASSERT_EQUAL(db_int(db_path, "SELECT COUNT(*) FROM runs"), 1);
	CU_ASSERT(isnan(db_double(db_path, "SELECT value FROM metrics WHERE name = 'time.step_s'")));
}

static void test_auto_bucket_needs_hidden_size(void)
{
	new_test_dir();
	/* the Hugging Face integration fills "auto" reduce_bucket_size with hidden_size^2, which a
	 * model given only as a parameter count does not have */
	write_at("s.json", "{\n"
			   "  \"model\": {\"num_parameters\": 1e9},\n"
			   "  \"deepspeed\": {\"train_batch_size\": 8, \"zero_optimization\": "
			   "{\"stage\": 2, \"reduce_bucket_size\": \"auto\"}},\n"
			   "  \"cluster\": {\"gpu\": \"H100-SXM\"}\n"
			   "}\n");
	int rc = run("predict --db '%s' '%s'", db_path, at("s.json"));
	ASSERT_RC(rc, 2);
	ASSERT_HAS(err_line, at("s.json"));
	ASSERT_HAS(err_line, "hidden_size");
	ASSERT_HAS(err_line, "\"auto\"");
	ASSERT_NOTHING_STORED(db_path);
}

static void test_not_modelled_listed(void)
{
	new_test_dir();
	/* MiCS sharding would change what ZeRO-3 gathers; it is read but not modelled */
	const char *key = "deepspeed.zero_optimization.mics_shard_size";
	write_inline("s.json", "{\"train_batch_size\": 8, \"zero_optimization\": "
			       "{\"stage\": 3, \"mics_shard_size\": 8}}");
	int rc = run("predict --no-db '%s'", at("s.json"));
	ASSERT_RC(rc, 0);
	ASSERT_HAS(out, "not modelled");
	ASSERT_HAS(out, key);

	rc = run("predict --no-db --json '%s'", at("s.json"));
	ASSERT_RC(rc, 0);
	cJSON *j = cJSON_Parse(out);
	CU_ASSERT_PTR_NOT_NULL_FATAL(j);
	const cJSON *nm = json_at(j, "notes.not_modelled");
	CU_ASSERT(cJSON_IsArray(nm));
	int found = 0;
	for (const cJSON *e = nm ? nm->child : NULL; e; e = e->next)
		found |= cJSON_IsString(e) && strstr(e->valuestring, key) != NULL;
	CU_ASSERT(found);
	cJSON_Delete(j);
}

/* ---- good scenarios ---- */

static void test_end_to_end_json_and_db(void)
{
	new_test_dir();
	int rc = run("predict --json --db '%s' '%s'", db_path,
		     px_test_path("scenarios/gpt2-finetune-hf-zero2.json"));
	ASSERT_RC(rc, 0);
	cJSON *j = cJSON_Parse(out);
	if (!j)
		fprintf(stderr, "\nnot JSON:\n%s\n", out);
	CU_ASSERT_PTR_NOT_NULL_FATAL(j);

	static const char *const numbers[] = {
		"world_size", "dp", "tp", "pp", "ep", "memory.ideal_model_states_bytes",
		"memory.gpu.params_bytes", "memory.gpu.grads_bytes", "memory.gpu.optimizer_bytes",
		"memory.gpu.activations_bytes", "memory.gpu.buffers_bytes",
		"memory.gpu.overhead_bytes", "memory.gpu.peak_bytes", "memory.cpu.peak_bytes",
		"memory.nvme.bytes", "memory.gpu_capacity_bytes", "comm.all_gather_bytes",
		"comm.reduce_scatter_bytes", "comm.all_reduce_bytes", "comm.all_to_all_bytes",
		"comm.p2p_bytes", "comm.wire_bytes",
	};
	for (size_t i = 0; i < sizeof(numbers) / sizeof(numbers[0]); i++)
		json_num(j, numbers[i]);
	CU_ASSERT(cJSON_IsBool(json_at(j, "memory.fits")));
	CU_ASSERT_EQUAL(json_num(j, "world_size"), 8);
	CU_ASSERT_EQUAL(json_num(j, "dp"), 8);
	CU_ASSERT_EQUAL(json_num(j, "tp"), 1);
	CU_ASSERT_EQUAL(json_num(j, "pp"), 1);
	CU_ASSERT_EQUAL(json_num(j, "ep"), 1);

	/* "auto" as the Hugging Face Trainer fills it: micro = per_device_train_batch_size 16,
	 * accumulation = gradient_accumulation_steps 2, train = 16 * 2 * world 8 = 256 */
	CU_ASSERT_EQUAL(json_num(j, "train_batch_size"), 256);
	CU_ASSERT_EQUAL(json_num(j, "train_micro_batch_size_per_gpu"), 16);
	CU_ASSERT_EQUAL(json_num(j, "gradient_accumulation_steps"), 2);

	/* GPT-2 small, tied embeddings: V*C + P*C + L*(12C^2 + 13C) + 2C with V=50257, P=1024,
	 * C=768, L=12: 38597376 + 786432 + 12 * 7087872 + 1536 = 124439808 */
	CU_ASSERT_EQUAL(json_num(j, "num_parameters"), 124439808);

	/* ZeRO-2 moves gradients by reduce-scatter and parameters by all-gather; besides them, two
	 * one-value fp32 all-reduces (fp16's overflow flag, the gradient norm for clipping: 8 B).
	 * A ring puts (n-1)/n of a gather's or scatter's payload on the wire and 2(n-1)/n of an
	 * all-reduce's (nccl-tests' bus bandwidth factors), n = 8 */
	double ag = json_num(j, "comm.all_gather_bytes"), rs = json_num(j, "comm.reduce_scatter_bytes");
	CU_ASSERT_EQUAL(json_num(j, "comm.all_reduce_bytes"), 8);
	CU_ASSERT_DOUBLE_EQUAL(json_num(j, "comm.wire_bytes"), (ag + rs) * 7 / 8 + 8 * 2 * 7 / 8, 0.5);

	/* one predicted run of 8 ranks, all alike (data parallelism): rank 0's metrics stored,
	 * ranks 1-7 each a rank_classes row naming rank 0; the same peak as printed */
	CU_ASSERT_EQUAL(db_int(db_path, "SELECT COUNT(*) FROM runs"), 1);
	long long id = db_int(db_path, "SELECT id FROM runs WHERE kind = 'predicted'");
	CU_ASSERT(id > 0); /* not fatal: j would leak; the queries below then find nothing */
	char sql[256];
	snprintf(sql, sizeof(sql), "SELECT world_size FROM runs WHERE id = %lld", id);
	CU_ASSERT_EQUAL(db_int(db_path, sql), 8);
	snprintf(sql, sizeof(sql), "SELECT COUNT(DISTINCT rank) FROM metrics WHERE run_id = %lld", id);
	CU_ASSERT_EQUAL(db_int(db_path, sql), 1);
	snprintf(sql, sizeof(sql), "SELECT COUNT(*) FROM rank_classes WHERE run_id = %lld AND "
		 "same_as = 0 AND rank BETWEEN 1 AND 7", id);
	CU_ASSERT_EQUAL(db_int(db_path, sql), 7);
	double peak = json_num(j, "memory.gpu.peak_bytes");
	snprintf(sql, sizeof(sql), "SELECT MIN(value) FROM metrics WHERE run_id = %lld AND "
		 "name = 'memory.gpu.peak_bytes'", id);
	CU_ASSERT_EQUAL(db_double(db_path, sql), peak);
	snprintf(sql, sizeof(sql), "SELECT MAX(value) FROM metrics WHERE run_id = %lld AND "
		 "name = 'memory.gpu.peak_bytes'", id);
	CU_ASSERT_EQUAL(db_double(db_path, sql), peak);
	cJSON_Delete(j);
}

static void test_params_only_zero_paper(void)
{
	new_test_dir();
	/* ZeRO paper, 7.5B parameters on 64 GPUs, stage 3, mixed-precision Adam: 16 bytes per
	 * parameter, all partitioned: 7.5e9 * 16 / 64 = 1.875e9 bytes (1.88 GB in its Figure 1,
	 * shared/reference/zero_memory.md), exact in a double */
	write_at("s.json", "{\n"
			   "  \"model\": {\"num_parameters\": 7.5e9},\n"
			   "  \"deepspeed\": {\"train_micro_batch_size_per_gpu\": 1, "
			   "\"fp16\": {\"enabled\": true}, \"optimizer\": {\"type\": \"Adam\"}, "
			   "\"zero_optimization\": {\"stage\": 3}},\n"
			   "  \"cluster\": {\"gpu\": \"V100-32GB\", \"nodes\": 4, \"gpus_per_node\": 16}\n"
			   "}\n");
	int rc = run("predict --no-db --json '%s'", at("s.json"));
	ASSERT_RC(rc, 0);
	cJSON *j = cJSON_Parse(out);
	CU_ASSERT_PTR_NOT_NULL_FATAL(j);
	CU_ASSERT_EQUAL(json_num(j, "world_size"), 64);
	CU_ASSERT_EQUAL(json_num(j, "memory.ideal_model_states_bytes"), 7.5e9 * 16 / 64);
	/* without layers and widths the activations cannot be known: null, not 0 */
	CU_ASSERT(cJSON_IsNull(json_at(j, "memory.gpu.activations_bytes")));
	cJSON_Delete(j);
}

/* ---- help, commands and the timeline ---- */

static void test_help_and_commands(void)
{
	int rc = run("--help");
	ASSERT_RC(rc, 0);
	ASSERT_HAS(out, "predict");
	ASSERT_HAS(out, "gpus");
	ASSERT_HAS(out, "--help");
	ASSERT_HAS(out, "--version");

	rc = run("predict --help");
	ASSERT_RC(rc, 0);
	static const char *const flags[] = {"--set", "--json", "--db", "--no-db", "--timeline",
					    "--help"};
	for (size_t i = 0; i < sizeof(flags) / sizeof(flags[0]); i++)
		ASSERT_HAS(out, flags[i]);
	ASSERT_HAS(out, "Exit status");

	rc = run("frobnicate");
	ASSERT_RC(rc, 2);
	ASSERT_HAS(out, "unknown command 'frobnicate'");
	ASSERT_RC(run("%s", ""), 2);                   /* no command at all */
	ASSERT_RC(run("predict --no-db"), 2);          /* no scenario */
	ASSERT_RC(run("predict --bogus x.json"), 2);   /* unknown flag */
}

/* The whitespace-separated field number col (0-based) of line, copied into buf. */
static int field(const char *line, int col, char *buf, size_t n)
{
	char copy[1024], *save = NULL, *tok;
	snprintf(copy, sizeof(copy), "%s", line);
	tok = strtok_r(copy, " \t\n", &save);
	for (int i = 0; tok && i < col; i++)
		tok = strtok_r(NULL, " \t\n", &save);
	if (!tok)
		return -1;
	snprintf(buf, n, "%s", tok);
	return 0;
}

static void test_timeline(void)
{
	new_test_dir();
	write_inline("s.json", "{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": 2}}");
	int rc = run("predict --no-db --timeline '%s' '%s'", at("tl.txt"), at("s.json"));
	ASSERT_RC(rc, 0);
	CU_ASSERT(access(at("tl.txt.tmp"), F_OK) != 0); /* written to .tmp, then renamed */
	FILE *f = fopen(at("tl.txt"), "r");
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	char line[1024], header[1024] = "", last[1024] = "", tok[256];
	int gpu_col = -1, rows = 0;
	while (fgets(line, sizeof(line), f)) {
		if (line[0] == '#') {
			snprintf(header, sizeof(header), "%s", line);
		} else if (line[strspn(line, " \t\n")]) {
			snprintf(last, sizeof(last), "%s", line);
			rows++;
		}
	}
	fclose(f);
	CU_ASSERT(rows > 0);
	/* the header's columns after "#" are the rows' columns */
	for (int i = 1; field(header, i, tok, sizeof(tok)) == 0; i++)
		if (!strcmp(tok, "gpu_bytes"))
			gpu_col = i - 1;
	CU_ASSERT_FATAL(gpu_col >= 0);
	CU_ASSERT_FATAL(field(last, gpu_col, tok, sizeof(tok)) == 0);
	char *end;
	double gpu = strtod(tok, &end);
	CU_ASSERT(end != tok && *end == '\0');
	CU_ASSERT(gpu > 0);

	/* one scenario only; and a bad scenario writes no timeline at all */
	rc = run("predict --no-db --timeline '%s' '%s' '%s'", at("tl2.txt"), at("s.json"),
		 at("s.json"));
	ASSERT_RC(rc, 2);
	CU_ASSERT(access(at("tl2.txt"), F_OK) != 0);
	write_at("bad.json", "{\"model\": ");
	rc = run("predict --no-db --timeline '%s' '%s'", at("tl3.txt"), at("bad.json"));
	ASSERT_RC(rc, 2);
	CU_ASSERT(access(at("tl3.txt"), F_OK) != 0);
	CU_ASSERT(access(at("tl3.txt.tmp"), F_OK) != 0);
}

/* ---- several scenarios ---- */

static void test_all_checked_before_any_written(void)
{
	new_test_dir();
	write_inline("good.json", "{\"train_batch_size\": 8}");
	write_inline("bad.json", "{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": 4}}");
	int rc = run("predict --db '%s' '%s' '%s'", db_path, at("good.json"), at("bad.json"));
	ASSERT_RC(rc, 2);
	ASSERT_HAS(err_line, at("bad.json"));
	ASSERT_NOTHING_STORED(db_path);

	/* into a database that has a run already: still exactly that one afterwards */
	rc = run("predict --db '%s' '%s'", db_path, at("good.json"));
	ASSERT_RC(rc, 0);
	CU_ASSERT_EQUAL(db_int(db_path, "SELECT COUNT(*) FROM runs"), 1);
	rc = run("predict --db '%s' '%s' '%s'", db_path, at("good.json"), at("bad.json"));
	ASSERT_RC(rc, 2);
	CU_ASSERT_EQUAL(db_int(db_path, "SELECT COUNT(*) FROM runs"), 1);

	/* both good: both stored */
	rc = run("predict --db '%s' '%s' '%s'", db_path, at("good.json"), at("good.json"));
	ASSERT_RC(rc, 0);
	CU_ASSERT_EQUAL(db_int(db_path, "SELECT COUNT(*) FROM runs"), 3);
}

/* ---- calibration ---- */

/* A hardware profile's memory section (what parallax calibrate writes) replaces the cluster's CUDA
 * runtime figures in the prediction: 500 MiB of context and 40 MiB of cuBLAS become 524,288,000
 * and 41,943,040 bytes, NCCL's keeps the catalog's 128 MiB; a negative figure is refused naming
 * the file, its place and the key. */
static void test_profile_memory(void)
{
	new_test_dir();
	write_at("hw.json", "{\"gpu\": \"H100-SXM\", \"memory\": {\"cuda_context_MiB\": 500,\n"
			    " \"cublas_workspace_MiB\": 40, \"_comment\": \"measured\"}}");
	int rc = run("predict --no-db --json --hw '%s' '%s'", at("hw.json"),
		     repo_file("scenarios/llama2-7b-zero2-h100.json"));
	ASSERT_RC(rc, 0);
	ASSERT_HAS(out, "\"cuda_context_bytes\":\t524288000");
	ASSERT_HAS(out, "\"cublas_workspace_bytes\":\t41943040");
	ASSERT_HAS(out, "\"nccl_bytes\":\t134217728");
	write_at("bad.json", "{\"gpu\": \"H100-SXM\", \"memory\": {\"nccl_MiB\": -1}}");
	rc = run("predict --no-db --hw '%s' '%s'", at("bad.json"),
		 repo_file("scenarios/llama2-7b-zero2-h100.json"));
	ASSERT_RC(rc, 2);
	ASSERT_HAS(err_line, "bad.json:1:");
	ASSERT_HAS(err_line, "memory.nccl_MiB: expected a number from 0");
}

/* --hw with another GPU's profile: predict, plot and run warn, naming both GPUs (the profile's own
 * "gpu" against the scenario's cluster.gpu); the scenario's own GPU's profile, and a custom one
 * that names no GPU, are used without a word. Predict's warning is in the table, the JSON and the
 * stored run's notes. */
static void test_hw_other_gpu(void)
{
	static const char *const warn = "warning: --hw profile measured on A100-80GB, but the "
					"scenario's GPU is H100-SXM";
	char args[16384], text[8192];
	new_test_dir();
	char scn[PATH_MAX], a100[PATH_MAX], h100[PATH_MAX]; /* repo_file's buffer is static */
	snprintf(scn, sizeof(scn), "%s", repo_file("scenarios/llama2-7b-zero2-h100.json"));
	snprintf(a100, sizeof(a100), "%s", repo_file("scenarios/hardware/A100-80GB.json"));
	snprintf(h100, sizeof(h100), "%s", repo_file("scenarios/hardware/H100-SXM.json"));

	int rc = run("predict --db '%s' --hw '%s' '%s'", db_path, a100, scn);
	ASSERT_RC(rc, 0);
	snprintf(text, sizeof(text), "# %s: %s", a100, warn);
	ASSERT_HAS(out, text);
	ASSERT_HAS(out, "mixes the A100-80GB's efficiencies with the H100-SXM's peaks");
	CU_ASSERT_EQUAL(db_int(db_path, "SELECT COUNT(*) FROM runs WHERE notes LIKE "
			       "'%measured on A100-80GB, but the scenario''s GPU is H100-SXM%'"), 1);
	rc = run("predict --no-db --json --hw '%s' '%s'", a100, scn);
	ASSERT_RC(rc, 0);
	cJSON *j = cJSON_Parse(out);
	const cJSON *w = cJSON_GetArrayItem(json_at(j, "notes.warnings"), 0);
	CU_ASSERT(cJSON_IsString(w) && strstr(w->valuestring, warn));
	cJSON_Delete(j);

	/* the GPU's own profile, any case of its name, and a custom profile: no warning */
	rc = run("predict --no-db --hw '%s' '%s'", h100, scn);
	ASSERT_RC(rc, 0);
	CU_ASSERT_PTR_NULL(strstr(out, "--hw profile measured on"));
	write_at("lower.json", "{\"gpu\": \"h100-sxm\"}");
	rc = run("predict --no-db --hw '%s' '%s'", at("lower.json"), scn);
	ASSERT_RC(rc, 0);
	CU_ASSERT_PTR_NULL(strstr(out, "--hw profile measured on"));

	/* plot time: once, on stderr */
	snprintf(args, sizeof(args), "plot time '%s' --hw '%s' --out '%s'", scn, a100, at("t"));
	rc = px_test_run_release(args, 120, out, sizeof(out));
	ASSERT_RC(rc, 0);
	snprintf(text, sizeof(text), "parallax plot: %s: %s", a100, warn);
	ASSERT_HAS(out, text);

	/* run: rank 0 says it before training (one step of the executor's small GPT on CPUs) */
	snprintf(text, sizeof(text), PX_TEST_GPT_SCENARIO, "hw-test", "false", 0);
	write_at("gpt.json", text);
	snprintf(args, sizeof(args), "run '%s' --ranks 2 --steps 1 --no-db --hw '%s'", at("gpt.json"),
		 a100);
	rc = px_test_run_release(args, 120, out, sizeof(out));
	ASSERT_RC(rc, 0);
	snprintf(text, sizeof(text), "parallax run: %s: %s", a100, warn);
	ASSERT_HAS(out, text);
	const char *first = strstr(out, text);
	CU_ASSERT(first && !strstr(first + 1, text)); /* rank 0 only */
}

/* parallax calibrate needs a GPU: without one (CI) it says why and writes nothing; bad usage is
 * refused before any measurement. */
static void test_calibrate_without_gpu(void)
{
	new_test_dir();
	int rc = run("calibrate --quick --out '%s'", at("cal.json"));
	if (rc == 0) { /* a machine with a GPU: the profile was written and reads back */
		rc = run("predict --no-db --hw '%s' '%s'", at("cal.json"),
			 repo_file("scenarios/llama2-7b-zero2-h100.json"));
		ASSERT_RC(rc, 0);
		return;
	}
	ASSERT_RC(rc, 1);
	ASSERT_HAS(out, "parallax calibrate: ");
	CU_ASSERT_EQUAL(access(at("cal.json"), F_OK), -1);
	CU_ASSERT_EQUAL(access(at("cal.json.tmp"), F_OK), -1);
	ASSERT_RC(run("calibrate"), 2);
	ASSERT_HAS(out, "expected --out FILE");
	ASSERT_RC(run("calibrate --out '%s' --gpu B300", at("cal.json")), 2);
	ASSERT_HAS(out, "--gpu B300: not a catalog GPU");
	ASSERT_RC(run("calibrate --out '%s' --dtype fp16", at("cal.json")), 2);
	ASSERT_HAS(out, "--dtype fp16: expected bf16 or fp32");
}

/* The test runner's own input: PX_SUITE naming a suite that does not exist is refused before any
 * test runs, naming the suite, exit status 2 (this very runner, run again). */
static void test_px_suite_unknown(void)
{
	char cmd[PATH_MAX + 64], exe[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	CU_ASSERT_FATAL(n > 0);
	exe[n] = '\0';
	snprintf(cmd, sizeof(cmd), "PX_SUITE=cli,no-such-suite '%s' 2>&1", exe);
	FILE *p = popen(cmd, "r");
	CU_ASSERT_PTR_NOT_NULL_FATAL(p);
	size_t got = fread(out, 1, sizeof(out) - 1, p); /* the suite's output buffer */
	out[got] = '\0';
	int st = pclose(p);
	CU_ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 2);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "PX_SUITE: no suite named 'no-such-suite'"));
	CU_ASSERT_PTR_NULL(strstr(out, "Run Summary")); /* nothing ran */
}

int test_cli_register(void)
{
	return PX_ADD_SUITE("cli",
			    {"PX_SUITE naming no suite is refused", test_px_suite_unknown},
			    {"malformed JSON in the scenario: file:line:col", test_malformed_scenario},
			    {"malformed JSON in a section file", test_malformed_section_file},
			    {"stage of the wrong type", test_stage_wrong_type},
			    {"stage out of range", test_stage_out_of_range},
			    {"negative train_batch_size", test_negative_batch},
			    {"inconsistent batch arithmetic", test_batch_arithmetic},
			    {"missing scenario and section files", test_missing_files},
			    {"unknown GPU lists the catalog", test_unknown_gpu},
			    {"--set num_parameters over a config", test_set_num_parameters},
			    {"--set errors", test_set_errors},
			    {"--set model= replaces the section, inline or a file",
			     test_set_whole_section},
			    {"unknown keys warn with a suggestion", test_unknown_key_warnings},
			    {"combinations DeepSpeed refuses", test_refused_combinations},
			    {"predict --keep-going", test_keep_going},
			    {"a schedule over the op limit is refused at once", test_schedule_limit},
			    {"attention: unknown value refused, flash on V100 unpriced", test_attention_refused},
			    {"auto bucket size needs hidden_size",
			     test_auto_bucket_needs_hidden_size},
			    {"not-modelled keys are listed", test_not_modelled_listed},
			    {"end to end: JSON and database", test_end_to_end_json_and_db},
			    {"params-only model: ZeRO paper 7.5B on 64", test_params_only_zero_paper},
			    {"help texts and commands", test_help_and_commands},
			    {"--timeline writes a complete table", test_timeline},
			    {"all scenarios checked before any is written",
			     test_all_checked_before_any_written},
			    {"a profile's memory section feeds the prediction", test_profile_memory},
			    {"--hw with another GPU's profile warns", test_hw_other_gpu},
			    {"calibrate without a GPU writes nothing", test_calibrate_without_gpu});
}

/* Black-box tests of `parallax plot` (PX_BIN): each plot kind on bundled scenarios writes a PNG
 * (checked by its signature), an SVG (holding "<svg" and the plot's title), the gnuplot script and
 * the data file, and nothing else; the data file carries the numbers the plot shows, checked
 * against the ZeRO paper's formulas and against what `parallax predict --json` prints; bad input
 * exits 2 and a missing gnuplot 1, leaving no file behind. The compare plot reads a run made by
 * `parallax run` (PX_RUN_BIN) in a fresh database. Each test works in its own px_test_tmpdir(). */
#include <CUnit/CUnit.h>
#include <cjson/cJSON.h>
#include <dirent.h>
#include <limits.h>
#include <math.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../cli/plot.h"
#include "suites.h"

#define GiB (1024.0 * 1024.0 * 1024.0)

/* ---- helpers ---- */

static char dir[512];          /* this test's directory */
static char out[1 << 16];      /* the last run's stdout and stderr */

static void new_dir(void)
{
	snprintf(dir, sizeof(dir), "%s", px_test_tmpdir());
}

/* dir/name; four rotating static buffers */
static const char *at(const char *name)
{
	static char bufs[4][2048];
	static int next;
	char *b = bufs[next++ % 4];
	snprintf(b, sizeof(bufs[0]), "%s/%s", dir, name);
	return b;
}

/* Absolute path of a bundled scenario; static buffer. */
static const char *scenario(const char *name)
{
	static char buf[PATH_MAX];
	char rel[256];
	snprintf(rel, sizeof(rel), "scenarios/%s.json", name);
	if (!realpath(px_test_path(rel), buf)) {
		fprintf(stderr, "\ncannot resolve %s\n", px_test_path(rel));
		CU_FAIL_FATAL("bundled scenario not found (is PX_ROOT set?)");
	}
	return buf;
}

/* Run parallax with printf-style arguments; output into out; the exit status. */
static int run(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int run(const char *fmt, ...)
{
	char args[8192];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(args, sizeof(args), fmt, ap);
	va_end(ap);
	int rc = px_test_run_cli(args, out, sizeof(out));
	return rc;
}

/* The whole file, NUL-terminated (caller frees), or NULL. */
static char *slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	size_t cap = 1 << 16, n = 0;
	char *b = malloc(cap + 1);
	size_t got;
	while (b && (got = fread(b + n, 1, cap - n, f)) > 0) {
		n += got;
		if (n == cap) {
			char *bigger = realloc(b, 2 * cap + 1);
			if (!bigger) {
				free(b);
				b = NULL;
				break;
			}
			b = bigger;
			cap *= 2;
		}
	}
	fclose(f);
	if (b)
		b[n] = '\0';
	if (len)
		*len = n;
	return b;
}

static int is_png(const char *path)
{
	static const unsigned char sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
	size_t n;
	char *b = slurp(path, &n);
	int ok = b && n > 1000 && !memcmp(b, sig, 8);
	free(b);
	return ok;
}

static int file_has(const char *path, const char *text)
{
	char *b = slurp(path, NULL);
	int ok = b && strstr(b, text);
	free(b);
	return ok;
}

/* Files in dir: how many, and whether any ends in ".tmp". */
static int dir_files(int *tmps)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	int n = 0;
	*tmps = 0;
	while (d && (e = readdir(d)) != NULL) {
		if (e->d_name[0] == '.')
			continue;
		size_t len = strlen(e->d_name);
		*tmps += len > 4 && !strcmp(e->d_name + len - 4, ".tmp");
		n++;
	}
	if (d)
		closedir(d);
	return n;
}

/* The four outputs of PREFIX (in dir) are there, good, titled, and nothing else is. */
static void check_outputs(const char *prefix, const char *title, int files_expected)
{
	char name[256];
	int tmps;
	snprintf(name, sizeof(name), "%s.png", prefix);
	CU_ASSERT(is_png(at(name)));
	snprintf(name, sizeof(name), "%s.svg", prefix);
	CU_ASSERT(file_has(at(name), "<svg"));
	CU_ASSERT(file_has(at(name), title));
	snprintf(name, sizeof(name), "%s.gp", prefix);
	CU_ASSERT(file_has(at(name), "set title"));
	snprintf(name, sizeof(name), "%s.dat", prefix);
	CU_ASSERT(file_has(at(name), "# parallax plot"));
	CU_ASSERT_EQUAL(dir_files(&tmps), files_expected);
	CU_ASSERT_EQUAL(tmps, 0);
}

/* The data line of the .dat file whose first field is `key`, or NULL; static buffer. */
static const char *dat_row(const char *path, const char *key)
{
	static char line[4096];
	FILE *f = fopen(path, "r");
	while (f && fgets(line, sizeof(line), f)) {
		char first[64];
		if (line[0] != '#' && sscanf(line, "%63s", first) == 1 && !strcmp(first, key)) {
			fclose(f);
			return line;
		}
	}
	if (f)
		fclose(f);
	return NULL;
}

/* A number from `parallax predict --json --no-db ARGS`, by its dotted path. */
static double predicted(const char *key, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static double predicted(const char *key, const char *fmt, ...)
{
	char args[4096];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(args, sizeof(args), fmt, ap);
	va_end(ap);
	char cmd[4200];
	snprintf(cmd, sizeof(cmd), "predict --json --no-db %s", args);
	CU_ASSERT_EQUAL_FATAL(px_test_run_cli(cmd, out, sizeof(out)), 0);
	cJSON *j = cJSON_Parse(strchr(out, '{'));
	CU_ASSERT_PTR_NOT_NULL_FATAL(j);
	const cJSON *v = j; /* "memory.gpu.peak_bytes" is memory -> gpu -> peak_bytes */
	char part[128];
	for (const char *k = key; v && *k; k += strcspn(k, ".") + (k[strcspn(k, ".")] == '.')) {
		snprintf(part, sizeof(part), "%.*s", (int)strcspn(k, "."), k);
		v = cJSON_GetObjectItem(v, part);
	}
	double x = cJSON_IsNumber(v) ? v->valuedouble : NAN;
	cJSON_Delete(j);
	return x;
}

/* ---- memory ---- */

/* The ZeRO paper's example (Rajbhandari et al. 2020, Figure 1 and Table 1): Ψ = 7.5e9 with mixed
 * precision Adam (K = 12) over Nd = 64 GPUs. Model states per GPU: stage 0 (2 + 2 + K)Ψ,
 * stage 1 4Ψ + KΨ/Nd, stage 2 2Ψ + (2 + K)Ψ/Nd, stage 3 (2 + 2 + K)Ψ/Nd = 16 x 7.5e9 / 64 bytes
 * = 1.875e9 bytes = 1.746 GiB. */
static void test_memory_zero_paper(void)
{
	const double psi = 7.5e9, nd = 64, k = 12;
	const double ideal[4] = {(2 + 2 + k) * psi, 4 * psi + k * psi / nd,
				 2 * psi + (2 + k) * psi / nd, (2 + 2 + k) * psi / nd};
	new_dir();
	int rc = run("plot memory '%s' --out '%s'", scenario("zero-paper-7.5b-dp64"), at("m"));
	if (rc)
		fprintf(stderr, "\n%s\n", out);
	CU_ASSERT_EQUAL_FATAL(rc, 0);
	check_outputs("m", "Per-GPU memory at the peak by ZeRO stage: zero-paper-7.5b-dp64", 4);
	CU_ASSERT(file_has(at("m.svg"), "ZeRO paper's ideal model states"));
	/* the V100's usable 31.75 GiB: torch's "31.75 GiB total capacity" (engine/cluster.c) */
	CU_ASSERT(file_has(at("m.svg"), "GPU capacity 31.8 GiB (V100-32GB)"));
	for (int z = 0; z < 4; z++) {
		char key[16];
		snprintf(key, sizeof(key), "%d", z);
		const char *row = dat_row(at("m.dat"), key);
		CU_ASSERT_PTR_NOT_NULL_FATAL(row);
		int stage, pp_stage;
		double cat[7], peak_gib, ideal_gib, cap_gib, peak_bytes, ideal_bytes;
		CU_ASSERT_EQUAL_FATAL(sscanf(row, "%d %lf %lf %lf %lf %lf %lf %lf %lf %lf %lf %lf %lf "
					     "%d", &stage, &cat[0], &cat[1], &cat[2], &cat[3],
					     &cat[4], &cat[5], &cat[6], &peak_gib, &ideal_gib,
					     &cap_gib, &peak_bytes, &ideal_bytes, &pp_stage), 14);
		CU_ASSERT_EQUAL(cat[6], 0); /* no executor workspace in a GPU scenario */
		CU_ASSERT_DOUBLE_EQUAL(ideal_bytes, ideal[z], 0.5);
		CU_ASSERT_DOUBLE_EQUAL(ideal_gib, ideal[z] / GiB, 1e-4);
		/* V100-32GB: usable 31.75 GiB (torch's "31.75 GiB total capacity", engine/cluster.c) */
		CU_ASSERT_DOUBLE_EQUAL(cap_gib, 31.75, 1e-4);
		double sum = 0;
		for (int c = 0; c < 7; c++)
			sum += cat[c];
		CU_ASSERT_DOUBLE_EQUAL(sum, peak_gib, 7e-4); /* 4 decimals each */
		CU_ASSERT(peak_bytes >= ideal_bytes);         /* the peak holds at least the states */
	}
	/* stage 3: the number the brief asks for, 1.746 GiB */
	CU_ASSERT_PTR_NOT_NULL(strstr(dat_row(at("m.dat"), "3"), " 1.7462 "));
	/* the script draws it again by hand */
	char cmd[1024];
	snprintf(cmd, sizeof(cmd), "cd '%s' && rm m.png m.svg && gnuplot m.gp 2>&1", dir);
	CU_ASSERT_EQUAL(system(cmd), 0);
	CU_ASSERT(is_png(at("m.png")));
	CU_ASSERT(file_has(at("m.svg"), "<svg"));
}

/* DeepSpeed refuses ZeRO-2 and -3 with pipeline parallelism: those bars are left out and said
 * to be, and the others match parallax predict at the same stage. */
static void test_memory_pipeline(void)
{
	const char *scn = scenario("gpt3-175b-tp8-pp8-a100");
	new_dir();
	int rc = run("plot memory '%s' --out '%s'", scn, at("g"));
	CU_ASSERT_EQUAL_FATAL(rc, 0);
	check_outputs("g", "gpt3-175b-tp8-pp8-a100", 4);
	CU_ASSERT(file_has(at("g.dat"), "# ZeRO-2 left out:"));
	CU_ASSERT(file_has(at("g.dat"), "# ZeRO-3 left out:"));
	CU_ASSERT(file_has(at("g.svg"), "incompatible with pipeline parallelism"));
	CU_ASSERT_PTR_NULL(dat_row(at("g.dat"), "2"));
	CU_ASSERT_PTR_NULL(dat_row(at("g.dat"), "3"));
	for (int z = 0; z < 2; z++) {
		char key[16];
		double v[12]; /* seven categories, peak GiB, ideal GiB, capacity, peak, ideal */
		snprintf(key, sizeof(key), "%d", z);
		const char *row = dat_row(at("g.dat"), key);
		CU_ASSERT_PTR_NOT_NULL_FATAL(row);
		CU_ASSERT_EQUAL_FATAL(sscanf(row, "%*d %lf %lf %lf %lf %lf %lf %lf %lf %lf %lf %lf %lf",
					     &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7],
					     &v[8], &v[9], &v[10], &v[11]), 12);
		double peak = predicted("memory.gpu.peak_bytes", "'%s' --set "
					"deepspeed.zero_optimization.stage=%d", scn, z);
		double ideal = predicted("memory.ideal_model_states_bytes", "'%s' --set "
					 "deepspeed.zero_optimization.stage=%d", scn, z);
		CU_ASSERT_DOUBLE_EQUAL(v[10], peak, 0.5);
		CU_ASSERT_DOUBLE_EQUAL(v[11], ideal, 0.5);
	}
}

/* --format png writes no SVG; --set reaches every stage */
static void test_memory_format_and_set(void)
{
	new_dir();
	int rc = run("plot memory '%s' --format png --set cluster.gpu=A100-40GB --out '%s'",
		     scenario("llama2-7b-zero2-h100"), at("p"));
	CU_ASSERT_EQUAL_FATAL(rc, 0);
	int tmps;
	CU_ASSERT(is_png(at("p.png")));
	CU_ASSERT_EQUAL(access(at("p.svg"), F_OK), -1);
	CU_ASSERT_EQUAL(dir_files(&tmps), 3);
	CU_ASSERT(file_has(at("p.gp"), "formats = \"png\""));
	/* A100-40GB: its usable 42298834944 bytes (deviceQuery's figure, engine/cluster.c) =
	 * 39.3939 GiB in the capacity column of every row */
	for (int z = 0; z < 4; z++) {
		char key[16];
		double cap;
		snprintf(key, sizeof(key), "%d", z);
		const char *row = dat_row(at("p.dat"), key);
		CU_ASSERT_PTR_NOT_NULL_FATAL(row);
		CU_ASSERT_EQUAL(sscanf(row, "%*d %*f %*f %*f %*f %*f %*f %*f %*f %*f %lf", &cap), 1);
		CU_ASSERT_DOUBLE_EQUAL(cap, 42298834944.0 / 1073741824.0, 1e-4);
	}
}

/* ---- time ---- */

/* One bar per scenario; the parts add up to the step, and the step time, throughput and MFU are
 * what parallax predict prints for the same scenario. */
static void test_time(void)
{
	const char *names[2] = {"llama2-7b-zero2-h100", "gpt3-175b-tp8-pp8-a100"};
	char paths[2][PATH_MAX];
	for (int i = 0; i < 2; i++)
		snprintf(paths[i], sizeof(paths[i]), "%s", scenario(names[i]));
	new_dir();
	int rc = run("plot time '%s' '%s' --out '%s'", paths[0], paths[1], at("t"));
	if (rc)
		fprintf(stderr, "\n%s\n", out);
	CU_ASSERT_EQUAL_FATAL(rc, 0);
	check_outputs("t", "Where the step time goes: 2 scenarios", 4);
	for (int i = 0; i < 2; i++) {
		char key[16];
		snprintf(key, sizeof(key), "%d", 1 - i); /* the first scenario on top */
		const char *row = dat_row(at("t.dat"), key);
		CU_ASSERT_PTR_NOT_NULL_FATAL(row);
		CU_ASSERT_PTR_NOT_NULL(strstr(row, names[i]));
		const char *p = strrchr(row, '"');
		CU_ASSERT_PTR_NOT_NULL_FATAL(p);
		double v[18], sum = 0;
		int n = 0, used;
		for (p++; n < 18 && sscanf(p, "%lf%n", &v[n], &used) == 1; p += used)
			n++;
		CU_ASSERT_EQUAL_FATAL(n, 18); /* 14 parts, step, tokens/s, MFU, GPUs */
		for (int k = 0; k < 14; k++)
			sum += v[k];
		CU_ASSERT_DOUBLE_EQUAL(sum, v[14], 1e-4 + 1e-6 * v[14]);
		CU_ASSERT_DOUBLE_EQUAL(v[14], predicted("time.step_s", "'%s'", paths[i]),
				       1e-5 * v[14] + 1e-5);
		CU_ASSERT_DOUBLE_EQUAL(v[15], predicted("time.tokens_per_s", "'%s'", paths[i]),
				       0.1);
		CU_ASSERT_DOUBLE_EQUAL(v[16], predicted("time.mfu", "'%s'", paths[i]), 1e-4);
	}
	/* gpt3 has a pipeline: its bubble and its exposed tp communication are drawn */
	CU_ASSERT(file_has(at("t.svg"), "pipeline bubble"));
	CU_ASSERT(file_has(at("t.svg"), "exposed comm (tp)"));
}

/* ---- scaling ---- */

/* Per rank the micro-batch and accumulation stay; train_batch_size = micro x accumulation x dp,
 * and the point at the scenario's own node count is its own prediction. */
static void test_scaling(void)
{
	const char *scn = scenario("llama2-7b-zero2-h100");
	char path[PATH_MAX];
	snprintf(path, sizeof(path), "%s", scn);
	double micro = predicted("train_micro_batch_size_per_gpu", "'%s'", path);
	double accum = predicted("gradient_accumulation_steps", "'%s'", path);
	double tps1 = predicted("time.tokens_per_s", "'%s'", path);
	double peak1 = predicted("memory.gpu.peak_bytes", "'%s'", path);
	new_dir();
	int rc = run("plot scaling '%s' --nodes 4,1,2 --out '%s'", path, at("s"));
	if (rc)
		fprintf(stderr, "\n%s\n", out);
	CU_ASSERT_EQUAL_FATAL(rc, 0);
	check_outputs("s", "Scaling: llama2-7b-zero2-h100", 4);
	for (long long nodes = 1; nodes <= 4; nodes *= 2) {
		char key[16];
		snprintf(key, sizeof(key), "%lld", nodes);
		const char *row = dat_row(at("s.dat"), key);
		CU_ASSERT_PTR_NOT_NULL_FATAL(row);
		long long n, gpus, dp, batch;
		double tps, step, mfu, peak_gib;
		CU_ASSERT_EQUAL_FATAL(sscanf(row, "%lld %lld %lld %lld %lf %lf %lf %lf", &n, &gpus,
					     &dp, &batch, &tps, &step, &mfu, &peak_gib), 8);
		CU_ASSERT_EQUAL(gpus, 8 * nodes); /* one DGX H100 is 8 GPUs */
		CU_ASSERT_EQUAL(dp, gpus);
		CU_ASSERT_EQUAL(batch, (long long)(micro * accum) * dp);
		if (nodes == 1) {
			CU_ASSERT_DOUBLE_EQUAL(tps, tps1, 0.1);
			CU_ASSERT_DOUBLE_EQUAL(peak_gib, peak1 / GiB, 1e-4);
		}
	}
	/* 8 GPUs do not divide into tp 8 x pp 8: that point is left out and said to be */
	new_dir();
	rc = run("plot scaling '%s' --nodes 4,8 --out '%s'", scenario("gpt3-175b-tp8-pp8-a100"),
		 at("g"));
	CU_ASSERT_EQUAL_FATAL(rc, 0);
	CU_ASSERT(file_has(at("g.dat"), "# 4 node(s) left out: 32 GPUs do not divide into tp 8 x pp 8"));
	CU_ASSERT(file_has(at("g.svg"), "4 node(s) left out"));
	CU_ASSERT_PTR_NOT_NULL(dat_row(at("g.dat"), "8"));
	/* none left: an input error */
	new_dir();
	rc = run("plot scaling '%s' --nodes 1,2 --out '%s'", scenario("gpt3-175b-tp8-pp8-a100"),
		 at("g"));
	CU_ASSERT_EQUAL(rc, 2);
	int tmps;
	CU_ASSERT_EQUAL(dir_files(&tmps), 0);
}

/* ---- compare ---- */

/* The executor test's GPT-2 (tests/test_exec.c), at ZeRO-3 */


/* The executor suites' GPT-2 as "plot-test", bf16, ZeRO-3, into path. */
static void write_gpt_scenario(const char *path)
{
	char text[2048];
	snprintf(text, sizeof(text), PX_TEST_GPT_SCENARIO, "plot-test", "true", 3);
	px_test_write_file(path, text);
}

/* Run the release parallax (PX_RUN_BIN: mpirun under a sanitizer leaks) with args. */
static int run_release(const char *args)
{
	return px_test_run_release(args, 120, out, sizeof(out));
}

/* One value of the predicted_vs_measured view, read with SQL rather than through parallax. */
static double view_value(const char *db_path, long long run, int rank, const char *name,
			 const char *column)
{
	sqlite3 *db;
	sqlite3_stmt *st;
	char sql[512];
	double v = NAN;
	snprintf(sql, sizeof(sql), "SELECT %s FROM predicted_vs_measured WHERE measured_run_id = "
		 "%lld AND rank = %d AND name = '%s'", column, run, rank, name);
	CU_ASSERT_EQUAL_FATAL(sqlite3_open_v2(db_path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
	if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW)
		v = sqlite3_column_double(st, 0);
	sqlite3_finalize(st);
	sqlite3_close(db);
	return v;
}

static void test_compare(void)
{
	char work[256], scn[512], db[512];
	int tmps;
	snprintf(work, sizeof(work), "%s", px_test_tmpdir());
	snprintf(scn, sizeof(scn), "%s/plot-test.json", work);
	snprintf(db, sizeof(db), "%s/x.db", work);
	write_gpt_scenario(scn);
	snprintf(dir, sizeof(dir), "%s/plots", work); /* the plot's files, apart from the inputs */
	CU_ASSERT_EQUAL_FATAL(mkdir(dir, 0777), 0);

	/* a database with a predicted run only */
	CU_ASSERT_EQUAL_FATAL(run("predict '%s' --db '%s'", scn, db), 0);
	CU_ASSERT_EQUAL(run("plot compare --db '%s' --out '%s'", db, at("c")), 2);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "no measured run"));
	CU_ASSERT_EQUAL(run("plot compare 1 --db '%s' --out '%s'", db, at("c")), 2);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "run 1 is a predicted run"));
	CU_ASSERT_EQUAL(run("plot compare 7 --db '%s' --out '%s'", db, at("c")), 2);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "no run 7"));
	CU_ASSERT_EQUAL(dir_files(&tmps), 0);

	/* a measured run: predicted run 2 and measured run 3 (its prediction joins scenario 1's
	 * row only when the resolved JSON is the same, so ids are read from the output) */
	char args[2048];
	snprintf(args, sizeof(args), "run '%s' --ranks 2 --steps 2 --db '%s'", scn, db);
	int rc = run_release(args);
	if (rc)
		fprintf(stderr, "\nparallax %s exited %d:\n%s\n", args, rc, out);
	CU_ASSERT_EQUAL_FATAL(rc, 0);
	long long pred_id = 0, meas_id = 0;
	const char *stored = strstr(out, "# stored predicted run ");
	CU_ASSERT_PTR_NOT_NULL_FATAL(stored);
	CU_ASSERT_EQUAL_FATAL(sscanf(stored, "# stored predicted run %lld and measured run %lld",
				     &pred_id, &meas_id), 2);

	rc = run("plot compare --db '%s' --out '%s'", db, at("c"));
	if (rc)
		fprintf(stderr, "\n%s\n", out);
	CU_ASSERT_EQUAL_FATAL(rc, 0);
	check_outputs("c", "Predicted against measured: plot-test", 4);
	CU_ASSERT(file_has(at("c.svg"), "measured against predicted"));
	CU_ASSERT(file_has(at("c.svg"), "relative error per metric"));
	/* block 0: every rank's values as the view has them */
	const char *metrics[] = {"memory.gpu.peak_bytes", "memory.gpu.params_bytes",
				 "comm.all_gather_bytes", "comm.reduce_scatter_bytes"};
	char *dat = slurp(at("c.dat"), NULL);
	CU_ASSERT_PTR_NOT_NULL_FATAL(dat);
	for (int r = 0; r < 2; r++)
		for (unsigned m = 0; m < sizeof(metrics) / sizeof(metrics[0]); m++) {
			char head[128];
			snprintf(head, sizeof(head), "%d    %d \"%s\"", r, metrics[m][0] == 'm',
				 metrics[m]);
			const char *line = strstr(dat, head);
			CU_ASSERT_PTR_NOT_NULL_FATAL(line);
			double p, v;
			CU_ASSERT_EQUAL_FATAL(sscanf(line + strlen(head), "%lf %lf", &p, &v), 2);
			CU_ASSERT_DOUBLE_EQUAL(p, view_value(db, meas_id, r, metrics[m], "predicted"),
					       0.5);
			CU_ASSERT_DOUBLE_EQUAL(v, view_value(db, meas_id, r, metrics[m], "measured"),
					       0.5);
			CU_ASSERT(p > 0);
		}
	/* block 1: rank 0's memory and communication metrics, one row each */
	const char *block1 = strstr(dat, "# block 1");
	CU_ASSERT_PTR_NOT_NULL_FATAL(block1);
	int rows0 = 0, rows_all = 0;
	for (const char *l = dat; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
		if (*l != '#' && *l != '\n') {
			if (l < block1)
				rows_all++;
			else
				rows0++;
		}
	CU_ASSERT(rows0 >= 11);
	CU_ASSERT_EQUAL(rows_all, 2 * rows0);
	free(dat);
	/* the measured run by its id gives the same plot */
	CU_ASSERT_EQUAL(run("plot compare %lld --db '%s' --out '%s' --format svg", meas_id, db,
			    at("d")), 0);
	CU_ASSERT(file_has(at("d.svg"), "<svg"));
	CU_ASSERT_EQUAL(access(at("d.png"), F_OK), -1);
}

/* ZeRO's claims plot from measured runs of the CPU executor: stage 0 on 1 rank and stage 3 on 2.
 * Its table holds the database's rank-0 figures: predicted, measured (the pool's high-water) and
 * requested (equal to predicted, as the executor's buffers are modelled exactly), each from its
 * own metric, and the ideal counts the model states as ZeRO's Table 1 does for what DeepSpeed
 * holds: at stage 0 in bf16 that is BF16_Optimizer (engine.py _do_optimizer_sanity_check), bf16
 * parameters (2 bytes a parameter), fp32 gradients (4) and 12 bytes of AdamW states over N = 1:
 * 18; at stage 3 bf16 parameters and gradients and the states, all over N = 2: 16 / 2 = 8. So
 * Z3 N=2 is 8/18 of Z0 N=1. A database without measured runs, and a scenario without any, are
 * refused. */
static void test_zero(void)
{
	char work[256], scn[512], db[512], args[2048];
	snprintf(work, sizeof(work), "%s", px_test_tmpdir());
	snprintf(scn, sizeof(scn), "%s/plot-test.json", work);
	snprintf(db, sizeof(db), "%s/z.db", work);
	write_gpt_scenario(scn);
	snprintf(dir, sizeof(dir), "%s/plots", work);
	CU_ASSERT_EQUAL_FATAL(mkdir(dir, 0777), 0);
	CU_ASSERT_EQUAL_FATAL(run("predict '%s' --db '%s'", scn, db), 0); /* predicted runs only */
	CU_ASSERT_EQUAL(run("plot zero --db '%s' --out '%s'", db, at("z")), 2);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "no measured run"));
	for (int k = 0; k < 2; k++) {
		snprintf(args, sizeof(args), "run '%s' --ranks %d --steps 1 --db '%s' --set "
			 "deepspeed.zero_optimization.stage=%d", scn, k + 1, db, 3 * k);
		CU_ASSERT_EQUAL_FATAL(run_release(args), 0);
	}
	CU_ASSERT_EQUAL(run("plot zero nosuch --db '%s' --out '%s'", db, at("z")), 2);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "no measured run of scenario 'nosuch'"));
	int rc = run("plot zero --db '%s' --out '%s'", db, at("z"));
	if (rc)
		fprintf(stderr, "\n%s\n", out);
	CU_ASSERT_EQUAL_FATAL(rc, 0);
	check_outputs("z", "Per-rank memory by ZeRO stage and data-parallel ranks: plot-test", 4);
	char *dat = slurp(at("z.dat"), NULL);
	CU_ASSERT_PTR_NOT_NULL_FATAL(dat);
	double ideal[2] = {0};
	for (int k = 0; k < 2; k++) {
		char head[32];
		snprintf(head, sizeof(head), "\"Z%d N=%d\"", 3 * k, k + 1);
		const char *line = strstr(dat, head);
		CU_ASSERT_PTR_NOT_NULL_FATAL(line);
		int stage, ranks, device;
		long long id;
		double p, m, err_pct, req, rise;
		CU_ASSERT_EQUAL_FATAL(sscanf(line + strlen(head), "%d %d %lld %lf %lf %lf %lf %d %lf %lf",
					     &stage, &ranks, &id, &p, &m, &ideal[k], &err_pct, &device,
					     &req, &rise), 10);
		double want = view_value(db, id, 0, "memory.gpu.peak_bytes", "predicted") / (1 << 30);
		double pool = view_value(db, id, 0, "memory.gpu.peak_bytes", "measured") / (1 << 30);
		CU_ASSERT_DOUBLE_EQUAL(p, want, 1e-6);
		CU_ASSERT_DOUBLE_EQUAL(m, pool, 1e-6);
		CU_ASSERT_DOUBLE_EQUAL(req, want, 1e-6);
		CU_ASSERT(m >= p && device == 0 && rise > 0);
	}
	CU_ASSERT(ideal[0] > 0);
	CU_ASSERT_DOUBLE_EQUAL(ideal[1], ideal[0] * 8 / 18, 2e-6);
	free(dat);
}

/* ---- bad input, a missing gnuplot, help ---- */

/* Each exits 2 with one line naming what is wrong and writes nothing. */
static void test_bad_input(void)
{
	char good[PATH_MAX];
	snprintf(good, sizeof(good), "%s", scenario("llama2-7b-zero2-h100"));
	new_dir();
	px_test_write_file(at("file"), "not a folder\n");
	const struct {
		const char *args, *says;
	} cases[] = {
		{"plot memory '%s/missing.json' --out '%s/x'", "missing.json: cannot open"},
		{"plot memory '%s' --set deepspeed.zero_optimization.stage=9 --out '%s/x'",
		 "expected an integer from 0 to 3, got 9"},
		{"plot memory '%s' --set cluster.gpu=B300 --out '%s/x'", "unknown GPU \"B300\""},
		{"plot memory '%s' --set nokey --out '%s/x'", "--set nokey: expected KEY=VALUE"},
		{"plot memory '%s' --out '%s/no/such/folder/x'", "folder"},
		{"plot memory '%s' --out '%s/file/x'", "file/x"},
		{"plot memory '%s' --format jpeg --out '%s/x'", "--format"},
		{"plot time '%s' --nodes 1,2 --out '%s/x'", "--nodes applies to scaling only"},
		{"plot scaling '%s' --nodes 1,two --out '%s/x'", "--nodes 1,two"},
		{"plot sideways '%s' --out '%s/x'", "unknown plot 'sideways'"},
		{"plot time '%s' --hw '%s/missing-hw.json' --out '%s/x'", "missing-hw.json"},
		{"plot compare --db '%s/missing.db' --out '%s/x'", "missing.db"},
	};
	for (unsigned i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char args[4096];
		const char *first = strstr(cases[i].args, "missing.json") ||
				    strstr(cases[i].args, "missing.db") ? dir : good;
		snprintf(args, sizeof(args), cases[i].args, first, dir, dir);
		int rc = px_test_run_cli(args, out, sizeof(out));
		int tmps, lines = 0;
		for (const char *c = out; *c; c++)
			lines += *c == '\n';
		if (rc != 2 || !strstr(out, cases[i].says) || lines != 1)
			fprintf(stderr, "\nparallax %s: exit %d:\n%s", args, rc, out);
		CU_ASSERT_EQUAL(rc, 2);
		CU_ASSERT_PTR_NOT_NULL(strstr(out, cases[i].says));
		CU_ASSERT_EQUAL(lines, 1);
		CU_ASSERT_EQUAL(dir_files(&tmps), 1); /* the file made above, nothing else */
	}
}

/* Without gnuplot on PATH: exit 1 with the line that installs it, and no file. */
static void test_no_gnuplot(void)
{
	char good[PATH_MAX], *path = getenv("PATH") ? strdup(getenv("PATH")) : NULL;
	snprintf(good, sizeof(good), "%s", scenario("llama2-7b-zero2-h100"));
	new_dir();
	setenv("PATH", dir, 1); /* popen's /bin/sh needs no PATH; parallax is run by its path */
	int rc = run("plot memory '%s' --out '%s'", good, at("x"));
	if (path) {
		setenv("PATH", path, 1);
		free(path);
	} else {
		unsetenv("PATH");
	}
	int tmps;
	CU_ASSERT_EQUAL(rc, 1);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "apt-get install gnuplot-nox"));
	CU_ASSERT_EQUAL(dir_files(&tmps), 0);
}

/* Without --out the files go to results/plots/KIND-NAME when the current folder has a results/
 * folder (a checkout); without one, to $HOME/.local/share/parallax/plots, saying so, and no
 * ./results is made. */
static void test_default_prefix(void)
{
	char good[PATH_MAX], cwd[PATH_MAX], home[PATH_MAX + 16], *old_home = getenv("HOME");
	char saved_home[PATH_MAX];
	snprintf(saved_home, sizeof(saved_home), "%s", old_home ? old_home : "");
	snprintf(good, sizeof(good), "%s", scenario("zero-paper-7.5b-dp64"));
	CU_ASSERT_PTR_NOT_NULL_FATAL(getcwd(cwd, sizeof(cwd)));
	new_dir();
	CU_ASSERT_EQUAL_FATAL(mkdir(at("results"), 0777), 0);
	CU_ASSERT_EQUAL_FATAL(chdir(dir), 0);
	int rc = run("plot time '%s' --format png", good);
	CU_ASSERT_EQUAL(chdir(cwd), 0);
	CU_ASSERT_EQUAL(rc, 0);
	CU_ASSERT(is_png(at("results/plots/time-zero-paper-7.5b-dp64.png")));
	CU_ASSERT(file_has(at("results/plots/time-zero-paper-7.5b-dp64.dat"), "zero-paper-7.5b-dp64"));
	CU_ASSERT(strstr(out, "# wrote results/plots/time-zero-paper-7.5b-dp64.png") != NULL);

	new_dir(); /* no results/ here */
	snprintf(home, sizeof(home), "%s/home", dir);
	CU_ASSERT_EQUAL_FATAL(mkdir(home, 0777), 0);
	setenv("HOME", home, 1);
	unsetenv("XDG_DATA_HOME");
	CU_ASSERT_EQUAL_FATAL(chdir(dir), 0);
	rc = run("plot time '%s' --format png", good);
	CU_ASSERT_EQUAL(chdir(cwd), 0);
	if (*saved_home)
		setenv("HOME", saved_home, 1);
	else
		unsetenv("HOME");
	CU_ASSERT_EQUAL(rc, 0);
	CU_ASSERT(is_png(at("home/.local/share/parallax/plots/time-zero-paper-7.5b-dp64.png")));
	CU_ASSERT(strstr(out, "results go to ") != NULL);
	struct stat st;
	CU_ASSERT_NOT_EQUAL(stat(at("results"), &st), 0);
}

static void test_help(void)
{
	CU_ASSERT_EQUAL(run("plot --help"), 0);
	const char *words[] = {"memory", "time", "scaling", "compare", "pareto", "--out", "--format",
			       "--set", "--nodes", "--hw", "--db", "apt-get install gnuplot-nox"};
	for (unsigned i = 0; i < sizeof(words) / sizeof(words[0]); i++)
		CU_ASSERT_PTR_NOT_NULL(strstr(out, words[i]));
	CU_ASSERT_EQUAL(run("plot memory --help"), 0);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "usage: parallax plot memory"));
	CU_ASSERT_EQUAL(run("plot"), 2);
}

/* ---- pareto ---- */

/* A front worked by hand: minimise a, maximise b. (0.5, 0.5) has the lowest a; (1, 1) the best b
 * for a <= 1 (its twin at index 5 comes later); (2, 3) beats (2, 2) and (3, 3); (4, 5) has the
 * highest b. */
static void test_pareto_front(void)
{
	const double a[] = {1, 2, 2, 3, 4, 1, 0.5};
	const double b[] = {1, 3, 2, 3, 5, 1, 0.5};
	const unsigned char want[] = {1, 1, 0, 0, 1, 0, 1};
	unsigned char front[7];
	CU_ASSERT_EQUAL(plot_pareto_front(a, b, 7, front), 4);
	for (int i = 0; i < 7; i++)
		CU_ASSERT_EQUAL(front[i], want[i]);
	CU_ASSERT_EQUAL(plot_pareto_front(a, b, 0, front), 0);
}

/* The sweep indices of a front, as the SQL definition of dominance finds them in the database:
 * no other fitting point is as good on both (xcol lower or equal, tokens/s higher or equal) and
 * better on one, or equal on both and listed earlier. Ascending; the count. */
static int sql_front(const char *db_path, const char *xcol, long long *idx, int max)
{
	char sql[1024];
	snprintf(sql, sizeof(sql),
		 "SELECT p.idx FROM sweep_points p WHERE p.status = 'ok' AND NOT EXISTS ("
		 " SELECT 1 FROM sweep_points q WHERE q.status = 'ok' AND q.%s <= p.%s AND"
		 " q.tokens_per_s >= p.tokens_per_s AND (q.%s < p.%s OR q.tokens_per_s > p.tokens_per_s"
		 " OR q.idx < p.idx)) ORDER BY p.idx", xcol, xcol, xcol, xcol);
	sqlite3 *db = NULL;
	sqlite3_stmt *st = NULL;
	int n = 0;
	CU_ASSERT_EQUAL_FATAL(sqlite3_open(db_path, &db), SQLITE_OK);
	CU_ASSERT_EQUAL_FATAL(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK);
	while (sqlite3_step(st) == SQLITE_ROW && n < max)
		idx[n++] = sqlite3_column_int64(st, 0);
	sqlite3_finalize(st);
	sqlite3_close(db);
	return n;
}

static int cmp_ll(const void *x, const void *y)
{
	long long p = *(const long long *)x, q = *(const long long *)y;
	return (p > q) - (p < q);
}

/* The first column of the rows of the .dat block whose header holds `header`, ascending. */
static int dat_block(const char *path, const char *header, long long *idx, int max)
{
	char line[8192];
	int in = 0, n = 0;
	FILE *f = fopen(path, "r");
	while (f && fgets(line, sizeof(line), f)) {
		if (line[0] == '#') {
			in = strstr(line, header) != NULL;
			continue;
		}
		if (in && n < max && sscanf(line, "%lld", &idx[n]) == 1)
			n++;
	}
	if (f)
		fclose(f);
	qsort(idx, (size_t)n, sizeof(*idx), cmp_ll);
	return n;
}

/* The bundled sizing sweep (GPU types x node counts): both fronts
 * in the data file are exactly the points SQL finds undominated. */
static void test_pareto(void)
{
	long long want[256], got[256];
	char db[2048];
	new_dir();
	snprintf(db, sizeof(db), "%s", at("s.db"));
	CU_ASSERT_EQUAL_FATAL(run("sweep '%s' --db '%s' --no-progress --jobs 2",
				  px_test_path("scenarios/sweeps/gpt3-13b-sizing.json"), db), 0);
	CU_ASSERT_EQUAL_FATAL(run("plot pareto --db '%s' --out '%s'", db, at("p")), 0);
	check_outputs("p", "gpt3-13b-sizing", 5); /* and s.db */

	CU_ASSERT(file_has(at("p.dat"), "USD per million tokens"));

	int n = sql_front(db, "cost_per_mtoken", want, 256);
	CU_ASSERT(n >= 3);
	CU_ASSERT_EQUAL(dat_block(at("p.dat"), "the time-cost front", got, 256), n);
	for (int i = 0; i < n; i++)
		CU_ASSERT_EQUAL(got[i], want[i]);
	/* six node counts of 8 GPUs: one best point each, throughput rising with GPUs */
	n = sql_front(db, "world", want, 256);
	CU_ASSERT_EQUAL(n, 6);
	CU_ASSERT_EQUAL(dat_block(at("p.dat"), "the throughput-GPUs front", got, 256), n);
	for (int i = 0; i < n; i++)
		CU_ASSERT_EQUAL(got[i], want[i]);

	/* by name and by id draw the same sweep */
	CU_ASSERT_EQUAL(run("plot pareto gpt3-13b-sizing --db '%s' --out '%s' --format png", db,
			    at("q")), 0);
	CU_ASSERT_EQUAL(run("plot pareto 1 --db '%s' --out '%s' --format svg", db, at("r")), 0);
	CU_ASSERT(file_has(at("q.dat"), "sweep 1 (gpt3-13b-sizing)"));
	CU_ASSERT(file_has(at("r.dat"), "sweep 1 (gpt3-13b-sizing)"));

	/* bad input: exit 2, the database or the sweep named, nothing written */
	CU_ASSERT_EQUAL(run("plot pareto nosuch --db '%s' --out '%s'", db, at("x")), 2);
	CU_ASSERT(strstr(out, "no sweep with name 'nosuch'") != NULL);
	CU_ASSERT_EQUAL(run("plot pareto 7 --db '%s' --out '%s'", db, at("x")), 2);
	CU_ASSERT(strstr(out, "no sweep with id '7'") != NULL);
	CU_ASSERT_EQUAL(run("plot pareto --db '%s' --out '%s'", at("missing.db"), at("x")), 2);
	CU_ASSERT(strstr(out, "missing.db: cannot open") != NULL);
	CU_ASSERT_EQUAL(run("plot pareto --db '%s' --set a=1 --out '%s'", db, at("x")), 2);
	CU_ASSERT(strstr(out, "--set does not apply") != NULL);
	CU_ASSERT_EQUAL(access(at("x.png"), F_OK), -1);
	CU_ASSERT_EQUAL(access(at("x.dat"), F_OK), -1);
}

int test_plot_register(void)
{
	return PX_ADD_SUITE("plot",
			    {"memory: the ZeRO paper's 7.5B over 64 GPUs", test_memory_zero_paper},
			    {"memory: ZeRO-2/3 refused with pipelines", test_memory_pipeline},
			    {"memory: --format png and --set", test_memory_format_and_set},
			    {"time: parts, step, tokens/s, MFU", test_time},
			    {"scaling: batch arithmetic and skipped points", test_scaling},
			    {"compare: a measured run of parallax run", test_compare},
			    {"zero: measured runs by stage and ranks, ZeRO's ideal", test_zero},
			    {"pareto: a front worked by hand", test_pareto_front},
			    {"pareto: both fronts of a sizing sweep against SQL", test_pareto},
			    {"bad input exits 2 and writes nothing", test_bad_input},
			    {"no gnuplot: exit 1 and the install line", test_no_gnuplot},
			    {"default prefix results/plots/KIND-NAME", test_default_prefix},
			    {"help", test_help});
}

/* The fresh-machine set-up (scripts/deps.sh), run against a stand-in dpkg-query so that the
 * verdict does not depend on what this machine happens to have installed. In dry-run mode the
 * script names what it would install and installs nothing. And the corpus check
 * (scripts/corpus_check.sh), fed pairs that must be refused, so that it can fail. */
#include <CUnit/CUnit.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "suites.h"

static char out[1 << 14];

/* A directory holding a dpkg-query that reports every package installed except those named in
 * `absent` (space-separated); returns the directory (static buffer). */
static const char *fake_dpkg(const char *absent)
{
	static char dir[512];
	char path[1024], script[2048];
	snprintf(dir, sizeof(dir), "%s", px_test_tmpdir());
	snprintf(path, sizeof(path), "%s/dpkg-query", dir);
	/* called as: dpkg-query -W -f=FORMAT PACKAGE */
	snprintf(script, sizeof(script),
		 "#!/bin/sh\n"
		 "for p in %s; do [ \"$p\" = \"$3\" ] && { echo \"dpkg-query: no packages found "
		 "matching $3\" >&2; exit 1; }; done\n"
		 "printf 'install ok installed'\n",
		 absent);
	px_test_write_file(path, script);
	snprintf(script, sizeof(script), "chmod +x '%s'", path);
	CU_ASSERT_EQUAL_FATAL(px_test_run_sh(script, out, sizeof(out)), 0);
	return dir;
}

static int run_deps(const char *absent)
{
	char cmd[2048];
	snprintf(cmd, sizeof(cmd), "PX_DEPS_DRY_RUN=1 PATH='%s':\"$PATH\" sh '%s'", fake_dpkg(absent),
		 px_test_path("scripts/deps.sh"));
	return px_test_run_sh(cmd, out, sizeof(out));
}

/* The defect of issue 13: Debian's netlib libblas-dev ships /usr/include/.../cblas.h too, and the
 * old script took that file for OpenBLAS; the build then failed at link time. The package is what
 * counts: with libopenblas-dev not installed (libblas-dev installed or not), it must be named. */
static void test_deps_names_missing_openblas(void)
{
	CU_ASSERT_EQUAL(run_deps("libopenblas-dev"), 1);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "missing Debian packages: libopenblas-dev"));
	CU_ASSERT_PTR_NULL(strstr(out, "libcjson-dev"));
}

static void test_deps_names_every_missing_package(void)
{
	CU_ASSERT_EQUAL(run_deps("libcunit1-dev openmpi-bin gnuplot-nox"), 1);
	CU_ASSERT_PTR_NOT_NULL(
		strstr(out, "missing Debian packages: libcunit1-dev gnuplot-nox openmpi-bin"));
}

/* Everything installed: the link probe runs for real (this build linked, so it must link too). */
static void test_deps_all_present_links(void)
{
	int rc = run_deps("");
	if (rc != 0)
		fprintf(stderr, "\n%s\n", out);
	CU_ASSERT_EQUAL(rc, 0);
}

/* An installed binary (make install's layout: PREFIX/bin/parallax, PREFIX/share/parallax/
 * scenarios, PREFIX/share/doc/parallax) run from an empty folder finds a bundled scenario by its
 * name or its path in the source tree, stores into ~/.local/share/parallax saying so, and leaves
 * no ./results behind; its plot --help points at the installed document. */
static void test_installed_binary(void)
{
	char cmd[4096], scenarios[1024], doc[1024];
	const char *t = px_test_tmpdir();
	/* px_test_path's buffer is static: one call per copy */
	snprintf(scenarios, sizeof(scenarios), "%s", px_test_path("scenarios"));
	snprintf(doc, sizeof(doc), "%s", px_test_path("docs/plots.md"));
	snprintf(cmd, sizeof(cmd),
		 "mkdir -p '%s/usr/bin' '%s/usr/share/parallax' '%s/usr/share/doc/parallax' "
		 "'%s/cwd' '%s/home' && cp '%s' '%s/usr/bin/parallax' && "
		 "cp -R '%s' '%s/usr/share/parallax/' && cp '%s' '%s/usr/share/doc/parallax/'",
		 t, t, t, t, t, getenv("PX_BIN"), t, scenarios, t, doc, t);
	CU_ASSERT_EQUAL_FATAL(px_test_run_sh(cmd, out, sizeof(out)), 0);
	snprintf(cmd, sizeof(cmd),
		 "cd '%s/cwd' && env -u PARALLAX_DB -u XDG_DATA_HOME -u PARALLAX_PATH HOME='%s/home' "
		 "'%s/usr/bin/parallax' predict llama2-7b-zero2-h100.json "
		 "scenarios/llama2-13b-zero3-h100.json",
		 t, t, t);
	int rc = px_test_run_sh(cmd, out, sizeof(out));
	if (rc)
		fprintf(stderr, "\n%s\n", out);
	CU_ASSERT_EQUAL(rc, 0);
	char want[1024];
	snprintf(want, sizeof(want), "results go to %s/home/.local/share/parallax (made now", t);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, want));
	snprintf(want, sizeof(want), "stored llama2-13b-zero3-h100 as predicted run 2 in "
		 "%s/home/.local/share/parallax/parallax.db", t);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, want));
	snprintf(cmd, sizeof(cmd), "ls -A '%s/cwd'", t);
	CU_ASSERT_EQUAL(px_test_run_sh(cmd, out, sizeof(out)), 0);
	CU_ASSERT_STRING_EQUAL(out, ""); /* no ./results, nothing else */
	snprintf(cmd, sizeof(cmd), "'%s/usr/bin/parallax' plot --help", t);
	CU_ASSERT_EQUAL(px_test_run_sh(cmd, out, sizeof(out)), 0);
	snprintf(want, sizeof(want), "More: %s/usr/share/doc/parallax/plots.md", t);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, want));
}

/* ---- the ds_config corpus check ---- */

/* A corpus of one small GPT-2 and two DeepSpeed configs in a fresh directory: "good" (ZeRO-2) and
 * "onebit-zero2" (1-bit Adam with ZeRO, which DeepSpeed refuses: engine.py asserts "1bit-Adam is
 * not compatible with ZeRO"); expected is the expected-refusals file's text. Runs the script on it
 * and returns its exit status, its output in out. */
static int run_corpus(const char *expected)
{
	const char *dir = px_test_tmpdir();
	char path[1024], cmd[4096];
	snprintf(cmd, sizeof(cmd), "mkdir -p '%s/models' '%s/ds'", dir, dir);
	CU_ASSERT_EQUAL_FATAL(px_test_run_sh(cmd, out, sizeof(out)), 0);
	snprintf(path, sizeof(path), "%s/models/tiny-gpt2.json", dir);
	px_test_write_file(path, "{\"model_type\": \"gpt2\", \"n_embd\": 64, \"n_layer\": 2,"
			   " \"n_head\": 4, \"n_positions\": 64, \"vocab_size\": 128}\n");
	snprintf(path, sizeof(path), "%s/ds/good.json", dir);
	px_test_write_file(path, "{\"train_micro_batch_size_per_gpu\": \"auto\","
			   " \"zero_optimization\": {\"stage\": 2}}\n");
	snprintf(path, sizeof(path), "%s/ds/onebit-zero2.json", dir);
	px_test_write_file(path, "{\"train_micro_batch_size_per_gpu\": 1, \"optimizer\":"
			   " {\"type\": \"OneBitAdam\"}, \"zero_optimization\": {\"stage\": 2}}\n");
	snprintf(path, sizeof(path), "%s/expected.txt", dir);
	px_test_write_file(path, expected);
	const char *bin = getenv("PX_BIN");
	snprintf(cmd, sizeof(cmd), "sh '%s' --bin '%s' --models '%s/models' --deepspeed '%s/ds'"
		 " --expected '%s/expected.txt'", px_test_path("scripts/corpus_check.sh"),
		 bin ? bin : "build/rel/parallax", dir, dir, dir);
	return px_test_run_sh(cmd, out, sizeof(out));
}

static void assert_out_has(const char *needle)
{
	if (!strstr(out, needle))
		fprintf(stderr, "\nexpected \"%s\" in:\n%s\n", needle, out);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, needle));
}

/* A refusal nobody listed fails the check, naming the pair and DeepSpeed's reason. */
static void test_corpus_unexpected_refusal_fails(void)
{
	CU_ASSERT_EQUAL(run_corpus("# nothing expected\n"), 1);
	assert_out_has("UNEXPECTED tiny-gpt2 x onebit-zero2:");
	assert_out_has("1bit-Adam is not compatible with ZeRO");
	assert_out_has("# 2 scenarios: 1 priced, 1 refused (0 expected, 1 not expected)");
}

/* Listed, the same refusal passes, with its reason; a listed refusal that no pair produces
 * fails (the list cannot go stale). */
static void test_corpus_expected_and_stale(void)
{
	CU_ASSERT_EQUAL(run_corpus("onebit-zero2 * 1bit-Adam is not compatible with ZeRO (engine.py)\n"),
			0);
	assert_out_has("expected   onebit-zero2 x 1 model(s) matching '*':");
	assert_out_has("reason: (engine.py)");
	assert_out_has("(1 expected, 0 not expected); 0 expected refusals that did not happen");
	CU_ASSERT_EQUAL(run_corpus("onebit-zero2 * 1bit-Adam is not compatible with ZeRO (engine.py)\n"
				   "good * anything (never happens)\n"), 1);
	assert_out_has("STALE");
	assert_out_has("good * anything (never happens): no pair was refused so");
}

/* The README's quoted outputs are what the current binary prints (scripts/readme_examples.sh
 * --check reruns each marked command; a stale number fails here, and `make readme` mends it). */
static void test_readme_examples_current(void)
{
	static char big[1 << 16];
	char cmd[2048];
	const char *bin = getenv("PX_RUN_BIN") ? getenv("PX_RUN_BIN") : getenv("PX_BIN");
	snprintf(cmd, sizeof(cmd), "PARALLAX_BIN='%s' sh '%s' --check", bin,
		 px_test_path("scripts/readme_examples.sh"));
	int rc = px_test_run_sh(cmd, big, sizeof(big));
	if (rc)
		fprintf(stderr, "\n%s\n", big);
	CU_ASSERT_EQUAL(rc, 0);
}

int test_setup_register(void)
{
	return PX_ADD_SUITE("setup",
			    {"deps: libopenblas-dev missing is named (cblas.h is no proof)",
			     test_deps_names_missing_openblas},
			    {"deps: every missing package is named, in order",
			     test_deps_names_every_missing_package},
			    {"deps: all installed, the link probe passes", test_deps_all_present_links},
			    {"install: bundled scenarios found from any folder, no ./results",
			     test_installed_binary},
			    {"README: every quoted example output is current",
			     test_readme_examples_current, PX_RELEASE_RUN},
			    {"corpus check: an unexpected refusal fails it",
			     test_corpus_unexpected_refusal_fails},
			    {"corpus check: expected refusals pass, stale ones fail",
			     test_corpus_expected_and_stale});
}

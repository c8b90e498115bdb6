/* The fresh-machine set-up (scripts/deps.sh), run against a stand-in dpkg-query so that the
 * verdict does not depend on what this machine happens to have installed. In dry-run mode the
 * script names what it would install and installs nothing. */
#include <CUnit/CUnit.h>
#include <stdio.h>
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

int test_setup_register(void)
{
	return PX_ADD_SUITE("setup",
			    {"deps: libopenblas-dev missing is named (cblas.h is no proof)",
			     test_deps_names_missing_openblas},
			    {"deps: every missing package is named, in order",
			     test_deps_names_every_missing_package},
			    {"deps: all installed, the link probe passes", test_deps_all_present_links});
}

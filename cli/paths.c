#include "paths.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int is_file(const char *p)
{
	struct stat st;
	return stat(p, &st) == 0 && !S_ISDIR(st.st_mode);
}

static int is_dir(const char *p)
{
	struct stat st;
	return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* The folder holding the running binary, in buf ("" when /proc cannot tell). */
static void exe_dir(char *buf, size_t n)
{
	char exe[PATH_MAX];
	ssize_t len = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	buf[0] = '\0';
	if (len <= 0)
		return;
	exe[len] = '\0';
	char *slash = strrchr(exe, '/');
	if (slash) {
		*slash = '\0';
		snprintf(buf, n, "%s", exe);
	}
}

/* The i-th built-in data folder (0: the source tree, 1: PREFIX/share/parallax) in buf, made
 * absolute; "" when there is no such folder holding a scenarios/ folder; NULL past the last. */
static const char *builtin_dir(int i, char *buf, size_t n)
{
	char dir[PATH_MAX];
	exe_dir(dir, sizeof(dir));
	if (!*dir)
		return NULL;
	static const char *const up[] = {"/../..", /* build/rel/parallax */
					  "/../share/parallax"}; /* PREFIX/bin/parallax */
	char joined[PATH_MAX + 32], real[PATH_MAX];
	if (i < 0 || i > 1)
		return NULL;
	snprintf(joined, sizeof(joined), "%s%s", dir, up[i]);
	if (!realpath(joined, real) || strlen(real) >= n)
		return "";
	memcpy(buf, real, strlen(real) + 1);
	char probe[PATH_MAX + 16];
	snprintf(probe, sizeof(probe), "%s/scenarios", buf);
	return is_dir(probe) ? buf : "";
}

/* Try DIR/arg and DIR/scenarios/arg; the one found, made absolute, in buf. */
static int try_dir(const char *dir, size_t dir_len, const char *arg, char *buf, size_t n)
{
	static const char *const subs[] = {"", "scenarios/"};
	char path[PATH_MAX], real[PATH_MAX];
	for (int s = 0; s < 2; s++) {
		snprintf(path, sizeof(path), "%.*s/%s%s", (int)dir_len, dir, subs[s], arg);
		if (is_file(path) && realpath(path, real) && strlen(real) < n) {
			memcpy(buf, real, strlen(real) + 1);
			return 1;
		}
	}
	return 0;
}

const char *paths_find_input(const char *arg, char *buf, size_t n)
{
	if (arg[0] == '/' || is_file(arg))
		return arg;
	const char *env = getenv("PARALLAX_PATH");
	for (const char *p = env; p && *p;) {
		size_t len = strcspn(p, ":");
		if (len && try_dir(p, len, arg, buf, n))
			return buf;
		p += len + (p[len] == ':');
	}
	char dir[PATH_MAX];
	for (int i = 0; i < 2; i++) {
		const char *d = builtin_dir(i, dir, sizeof(dir));
		if (d && *d && try_dir(d, strlen(d), arg, buf, n))
			return buf;
	}
	return arg;
}

const char *paths_doc(const char *name, char *buf, size_t n)
{
	char dir[PATH_MAX];
	const char *tree = builtin_dir(0, dir, sizeof(dir));
	if (tree && *tree) {
		snprintf(buf, n, "%s/docs/%s", tree, name);
		if (is_file(buf))
			return buf;
	}
	exe_dir(dir, sizeof(dir));
	char installed[PATH_MAX + 64], real[PATH_MAX];
	snprintf(installed, sizeof(installed), "%s/../share/doc/parallax/%s", dir, name);
	if (*dir && realpath(installed, real) && is_file(real) && strlen(real) < n) {
		memcpy(buf, real, strlen(real) + 1);
		return buf;
	}
	snprintf(buf, n, "docs/%s", name);
	return buf;
}

/* mkdir -p for a path of a few levels: 1 when this call made the last folder, 0 when it was
 * there (another process may have made it meanwhile), -1 on failure */
static int make_dirs(char *path)
{
	for (char *s = path + 1; *s; s++) {
		if (*s != '/')
			continue;
		*s = '\0';
		int rc = mkdir(path, 0777);
		*s = '/';
		if (rc && errno != EEXIST)
			return -1;
	}
	if (mkdir(path, 0777) == 0)
		return 1;
	return errno == EEXIST ? 0 : -1;
}

int paths_results_dir(char *buf, size_t n, int create, PxError *err)
{
	if (is_dir("results")) {
		snprintf(buf, n, "results");
		return 0;
	}
	const char *xdg = getenv("XDG_DATA_HOME"), *home = getenv("HOME");
	if (xdg && *xdg)
		snprintf(buf, n, "%s/parallax", xdg);
	else if (home && *home)
		snprintf(buf, n, "%s/.local/share/parallax", home);
	else
		return px_fail(err, PX_ERR_RUNTIME, "no results/ folder here and neither "
			       "XDG_DATA_HOME nor HOME is set: give --db (or --out) or set "
			       "PARALLAX_DB");
	if (!create || is_dir(buf))
		return 0;
	int made = make_dirs(buf);
	if (made < 0)
		return px_fail(err, PX_ERR_RUNTIME, "%s: cannot create: %s", buf, strerror(errno));
	if (made)
		fprintf(stderr, "parallax: no results/ folder here: results go to %s (made now; set "
		"PARALLAX_DB or give --db, or make ./results, to choose)\n", buf);
	return 0;
}

int paths_default_db(char *buf, size_t n, int create, PxError *err)
{
	const char *env = getenv("PARALLAX_DB");
	if (env && *env) {
		snprintf(buf, n, "%s", env);
		return 0;
	}
	char dir[PATH_MAX];
	if (paths_results_dir(dir, sizeof(dir), create, err))
		return -1;
	snprintf(buf, n, "%s/parallax.db", dir);
	return 0;
}

const char *paths_db(const char *given, char *buf, size_t n, int create, PxError *err)
{
	if (given)
		return given;
	return paths_default_db(buf, n, create, err) ? NULL : buf;
}

int paths_cpu_profile(char *buf, size_t n, int create, PxError *err)
{
	const char *env = getenv("PARALLAX_CPU_PROFILE");
	buf[0] = '\0';
	if (env) {
		snprintf(buf, n, "%s", env);
		return *env ? 0 : 1;
	}
	char dir[PATH_MAX];
	if (paths_results_dir(dir, sizeof(dir), create, err))
		return -1;
	snprintf(buf, n, "%s/cpu-profile.json", dir);
	return 0;
}

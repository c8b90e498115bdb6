/* Every command's --help is complete: each long option a command accepts (read from its source's
 * `struct option` table, the list getopt_long really obeys) is named as --NAME in the text that
 * `parallax COMMAND --help` prints, and the text ends with the exit statuses. The list of
 * commands comes from the top-level usage, so a new command is checked without editing this
 * file. `merge` is a command of cmd_sweep.c's and has its own text. */
#include <CUnit/CUnit.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "suites.h"

static char help[1 << 16];

/* The source file holding command cmd's option table; NULL for merge, which takes none (its
 * code lives in cmd_sweep.c, whose table is sweep's). */
static const char *source_of(const char *cmd)
{
	static char path[256];
	if (!strcmp(cmd, "merge"))
		return NULL;
	snprintf(path, sizeof(path), "cli/cmd_%s.c", cmd);
	return px_test_path(path);
}

static char *read_all(const char *path)
{
	FILE *f = fopen(path, "r");
	if (!f)
		return NULL;
	static char buf[1 << 18];
	size_t n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	return buf;
}

/* Check each {"name", ...} entry of each `struct option` table in src against help; returns the
 * number of options checked. */
static int check_options(const char *cmd, const char *src)
{
	int n = 0;
	for (const char *t = strstr(src, "struct option"); t; t = strstr(t + 1, "struct option")) {
		const char *end = strstr(t, "{0, 0, 0, 0}");
		CU_ASSERT_PTR_NOT_NULL_FATAL(end);
		for (const char *p = strstr(t, "{\""); p && p < end; p = strstr(p + 1, "{\"")) {
			char name[64], flag[80];
			size_t len = strcspn(p + 2, "\"");
			if (len >= sizeof(name))
				continue;
			memcpy(name, p + 2, len);
			name[len] = '\0';
			snprintf(flag, sizeof(flag), "--%s", name);
			n++;
			/* --NAME followed by something that ends a flag's name */
			const char *h = help;
			int found = 0;
			while ((h = strstr(h, flag))) {
				char next = h[strlen(flag)];
				if (!isalnum((unsigned char)next) && next != '-') {
					found = 1;
					break;
				}
				h++;
			}
			if (!found) {
				fprintf(stderr, "\nparallax %s --help does not mention %s\n", cmd, flag);
				CU_FAIL("an accepted option is missing from --help");
			}
		}
	}
	return n;
}

static void test_help_names_every_option(void)
{
	char usage[1 << 14];
	CU_ASSERT_EQUAL_FATAL(px_test_run_cli("--help", usage, sizeof(usage)), 0);
	const char *cmds = strstr(usage, "commands:\n");
	CU_ASSERT_PTR_NOT_NULL_FATAL(cmds);
	int n_cmds = 0;
	/* each command line of the usage: two spaces, the command's name */
	for (const char *l = strchr(cmds, '\n') + 1; *l && *l != '\n'; l = strchr(l, '\n') + 1) {
		char cmd[32], args[64];
		if (sscanf(l, "  %31[a-z] ", cmd) == 1 && l[2] != ' ') {
			n_cmds++;
			snprintf(args, sizeof(args), "%s --help", cmd);
			int rc = px_test_run_cli(args, help, sizeof(help));
			CU_ASSERT_EQUAL(rc, 0);
			if (strncmp(help, "usage: parallax ", 16)) {
				fprintf(stderr, "\nparallax %s --help: no usage line\n", cmd);
				CU_FAIL("no usage line");
			}
			if (!strstr(help, "Exit status")) {
				fprintf(stderr, "\nparallax %s --help does not give the exit status\n", cmd);
				CU_FAIL("no exit status in --help");
			}
			if (!strstr(help, "--help")) {
				fprintf(stderr, "\nparallax %s --help does not mention --help\n", cmd);
				CU_FAIL("no --help in --help");
			}
			if (source_of(cmd)) {
				const char *src = read_all(source_of(cmd));
				CU_ASSERT_PTR_NOT_NULL_FATAL(src);
				CU_ASSERT(check_options(cmd, src) > 0);
			}
		}
		if (!strchr(l, '\n'))
			break;
	}
	CU_ASSERT(n_cmds >= 10); /* predict run calibrate compare sweep merge plan plot gpus prune */
}

/* merge is not sweep: its help describes merging, not pricing. */
static void test_help_merge_own_text(void)
{
	CU_ASSERT_EQUAL(px_test_run_cli("merge --help", help, sizeof(help)), 0);
	CU_ASSERT_EQUAL(strncmp(help, "usage: parallax merge ", 22), 0);
}

int test_help_register(void)
{
	return PX_ADD_SUITE("help",
			    {"help: every command names every option it accepts",
			     test_help_names_every_option},
			    {"help: merge has its own text", test_help_merge_own_text});
}

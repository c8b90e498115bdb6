/* parallax prune: remove old runs from the results database, in one transaction. */
#include <getopt.h>
#include <limits.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../db/db.h"
#include "commands.h"
#include "paths.h"

static const char USAGE[] =
	"usage: parallax prune (--keep N | --before DATE) [--db FILE]\n"
	"\n"
	"Remove old predicted and measured runs from the results database, with their metrics,\n"
	"in one transaction (all or nothing); a measured run that stays keeps the prediction it\n"
	"is compared with, and scenarios no run refers to any more go too. Sweeps are kept.\n"
	"\n"
	"  --keep N      keep the N newest runs\n"
	"  --before DATE remove the runs made before DATE (UTC: 2026-11-01 or\n"
	"                2026-11-01T12:00:00Z)\n"
	"  --db FILE     results database (default $PARALLAX_DB, else results/parallax.db where\n"
	"                ./results exists, else ~/.local/share/parallax/)\n"
	"  -h, --help    this help\n"
	"Exit status: 0 ok, 1 runtime failure (database), 2 bad usage.\n";

/* YYYY-MM-DD, optionally followed by THH:MM:SSZ: the form runs.created_utc is written in, so
 * that comparing the texts compares the times. */
static int valid_date(const char *d)
{
	int y, mo, da, h, mi, se;
	char z, end;
	size_t n = strlen(d);
	if (n == 10)
		return sscanf(d, "%4d-%2d-%2d%c", &y, &mo, &da, &end) == 3 && mo >= 1 && mo <= 12 &&
		       da >= 1 && da <= 31;
	return n == 20 &&
	       sscanf(d, "%4d-%2d-%2dT%2d:%2d:%2d%c%c", &y, &mo, &da, &h, &mi, &se, &z, &end) == 7 &&
	       z == 'Z' && mo >= 1 && mo <= 12 && da >= 1 && da <= 31 && h < 24 && mi < 60 &&
	       se < 61;
}

int cmd_prune(int argc, char **argv)
{
	static const struct option longs[] = {
		{"keep", required_argument, 0, 'k'}, {"before", required_argument, 0, 'b'},
		{"db", required_argument, 0, 'd'},   {"help", no_argument, 0, 'h'},
		{0, 0, 0, 0}};
	const char *db_path = NULL, *before = NULL;
	long long keep = 0;
	char *end;
	int c;
	optind = 1;
	while ((c = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
		switch (c) {
		case 'k':
			keep = strtoll(optarg, &end, 10);
			if (*end || keep < 1) {
				fprintf(stderr, "parallax prune: --keep %s: expected a number of runs "
					"(1 or more)\n", optarg);
				return 2;
			}
			break;
		case 'b':
			if (!valid_date(optarg)) {
				fprintf(stderr, "parallax prune: --before %s: expected a UTC date, "
					"YYYY-MM-DD or YYYY-MM-DDTHH:MM:SSZ\n", optarg);
				return 2;
			}
			before = optarg;
			break;
		case 'd': db_path = optarg; break;
		case 'h': fputs(USAGE, stdout); return 0;
		default: fputs(USAGE, stderr); return 2;
		}
	}
	if (optind != argc || (!keep) == (!before)) {
		fprintf(stderr, "parallax prune: give one of --keep N and --before DATE\n%s", USAGE);
		return 2;
	}
	char dflt[PATH_MAX];
	PxError err = {0};
	PxDb *db = NULL;
	long long removed = 0;
	if (!(db_path = paths_db(db_path, dflt, sizeof(dflt), 0, &err)))
		goto fail;
	/* an existing database only: pruning must not create one */
	sqlite3 *probe = db_open_read(db_path, &err);
	if (!probe)
		goto fail;
	sqlite3_close(probe);
	if (db_open(db_path, &db, &err) || db_prune(db, keep, before, &removed, &err))
		goto fail;
	db_close(db);
	printf("# removed %lld run(s) from %s\n", removed, db_path);
	return 0;
fail:
	db_close(db);
	fprintf(stderr, "parallax prune: %s\n", err.msg);
	return err.code ? err.code : 1;
}

/* paths: where the parallax command looks for what a user names and puts what it writes by
 * default. Owns the search path for bundled inputs (so that an installed binary finds
 * `scenarios/llama2-13b-zero3-h100.json` from any folder), the documents' location and the
 * default results folder. It reads no input and writes no result itself. */
#ifndef PX_CLI_PATHS_H
#define PX_CLI_PATHS_H

#include <stddef.h>

#include "../engine/err.h"

/* An input file as the user named it when it exists there (or is absolute); else the first of
 * DIR/arg and DIR/scenarios/arg that exists, DIR running over the data folders: $PARALLAX_PATH
 * (colon-separated), the source tree the binary was built in (build/rel/parallax's ../..), and
 * PREFIX/share/parallax for a binary installed in PREFIX/bin. Returns buf, or arg itself when
 * found nowhere (its error then names it as typed). */
const char *paths_find_input(const char *arg, char *buf, size_t n);

/* A document (e.g. "plots.md"): DIR/docs/NAME in the source tree, else
 * PREFIX/share/doc/parallax/NAME; "docs/NAME" when neither exists. Returns buf. */
const char *paths_doc(const char *name, char *buf, size_t n);

/* The folder results go to by default: ./results when it exists (a checkout, or a folder the
 * user made), else $XDG_DATA_HOME/parallax (~/.local/share/parallax); with create, made when
 * missing, with a line on stderr saying so: never a new ./results in whatever folder the
 * command runs from. Commands that only read pass create = 0. */
int paths_results_dir(char *buf, size_t n, int create, PxError *err);

/* The results database when neither --db nor --no-db is given: $PARALLAX_DB, else
 * paths_results_dir()/parallax.db. */
int paths_default_db(char *buf, size_t n, int create, PxError *err);
/* The database to use: given (--db) when not NULL, else the default, written into buf; NULL on
 * error. */
const char *paths_db(const char *given, char *buf, size_t n, int create, PxError *err);

/* This machine's CPU hardware profile: where `parallax calibrate --backend cpu` writes it and
 * where a backend "cpu" scenario's step time is priced from without --hw:
 * $PARALLAX_CPU_PROFILE, else paths_results_dir()/cpu-profile.json. Returns 0 with the path in
 * buf, 1 when PARALLAX_CPU_PROFILE is set but empty (no default profile: buf ""), -1 on error. */
int paths_cpu_profile(char *buf, size_t n, int create, PxError *err);

#endif

/* run_ckpt: `parallax run`'s checkpoints on disk: every rank's state in DIR/step-N/rank-R.bin and
 * DIR/latest naming the newest whole step. Owns the layout, writing under temporary names and
 * renaming, and removing only what it wrote (never through a symbolic link). The state's bytes
 * are the runner's (runner_save, runner_load). */
#ifndef PX_CLI_RUN_CKPT_H
#define PX_CLI_RUN_CKPT_H

#include "../exec/comm.h"
#include "../exec/runner.h"

/* Collective over world. Every rank writes DIR/step-N.tmp/rank-R.bin (written as .part, synced,
 * renamed); once all have, rank 0 puts the folder in place as DIR/step-N and points DIR/latest at
 * it (written and renamed), so that a crash leaves the previous checkpoint and DIR/latest whole.
 * A DIR/step-N or DIR/step-N.tmp from an earlier run is replaced only when it holds nothing but
 * rank files; anything else in it (a symbolic link, a file of another name) stops the save,
 * named, with nothing removed. A failed write names the file and the system's reason and leaves
 * no partial file. 0, or -1 with err. */
int ckpt_save(const char *dir, long step, Runner *run, Comm *world, PxError *err);

/* Load this rank's state from DIR/latest's step; returns that step, or -1 with err. */
long ckpt_load(const char *dir, Runner *run, Comm *world, PxError *err);

#endif

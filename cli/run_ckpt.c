#define _GNU_SOURCE /* renameat2 */
#include "run_ckpt.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "launch.h"

/* ---- what a checkpoint folder may hold ---- */

/* "rank-00003.bin" or "rank-00003.bin.part": the names ckpt_save writes. */
static int ckpt_name(const char *name)
{
	size_t len = strlen(name);
	if (strncmp(name, "rank-", 5) || len < 14 || strspn(name + 5, "0123456789") != 5)
		return 0;
	return !strcmp(name + 10, ".bin") || !strcmp(name + 10, ".bin.part");
}

static const char *kind_name(mode_t m)
{
	return S_ISLNK(m) ? "symbolic link" : S_ISDIR(m) ? "folder" : S_ISREG(m) ? "file" :
	       "special file";
}

/* Whether path is a folder holding only rank files (an earlier save's): 0, or -1 with err naming
 * what else is there. Nothing there (ENOENT) is fine. */
static int check_step(const char *path, PxError *err)
{
	struct stat sb;
	if (lstat(path, &sb))
		return errno == ENOENT ? 0 : px_fail(err, PX_ERR_RUNTIME, "%s: %s", path,
						    strerror(errno));
	if (!S_ISDIR(sb.st_mode))
		return px_fail(err, PX_ERR_RUNTIME, "%s is a %s, not a checkpoint folder parallax "
			       "wrote: move it away or save elsewhere", path,
			       kind_name(sb.st_mode));
	DIR *d = opendir(path);
	if (!d)
		return px_fail(err, PX_ERR_RUNTIME, "%s: %s", path, strerror(errno));
	int rc = 0;
	for (struct dirent *e; !rc && (e = readdir(d));) {
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		if (fstatat(dirfd(d), e->d_name, &sb, AT_SYMLINK_NOFOLLOW))
			rc = px_fail(err, PX_ERR_RUNTIME, "%s/%s: %s", path, e->d_name,
				     strerror(errno));
		else if (!S_ISREG(sb.st_mode) || !ckpt_name(e->d_name))
			rc = px_fail(err, PX_ERR_RUNTIME, "%s/%s: a %s parallax did not write; "
				     "nothing was removed: move it away or save elsewhere", path,
				     e->d_name, kind_name(sb.st_mode));
	}
	closedir(d);
	return rc;
}

/* Remove path when check_step finds it ours; refused otherwise, with nothing removed. */
static int remove_step(const char *path, PxError *err)
{
	if (check_step(path, err))
		return -1;
	if (launch_remove_tree(path) && errno != ENOENT)
		return px_fail(err, PX_ERR_RUNTIME, "%s: cannot remove: %s", path, strerror(errno));
	return 0;
}

/* ---- writing ---- */

/* err's message behind "path: " */
static int fail_at(PxError *err, const char *path)
{
	char inner[sizeof(err->msg)];
	snprintf(inner, sizeof(inner), "%s", err->msg);
	return px_fail(err, PX_ERR_RUNTIME, "%s: %.900s", path, inner);
}

/* This rank's file, written under part and renamed to file; on failure no part is left. */
static int write_rank(const char *part, const char *file, const Runner *run, PxError *err)
{
	/* a fresh name in a folder made for this save: O_EXCL | O_NOFOLLOW never writes through
	 * a link somebody left there */
	int fd = open(part, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
	if (fd < 0)
		return px_fail(err, PX_ERR_RUNTIME, "%s: cannot create: %s", part, strerror(errno));
	FILE *f = fdopen(fd, "wb");
	if (!f) {
		int e = errno;
		close(fd);
		unlink(part);
		return px_fail(err, PX_ERR_RUNTIME, "%s: %s", part, strerror(e));
	}
	int rc = runner_save(run, f, err);
	if (!rc && (fflush(f) || fsync(fileno(f))))
		rc = px_fail(err, PX_ERR_RUNTIME, "writing a checkpoint failed: %s",
			     strerror(errno));
	if (fclose(f) && !rc)
		rc = px_fail(err, PX_ERR_RUNTIME, "writing a checkpoint failed: %s",
			     strerror(errno));
	if (!rc && rename(part, file))
		rc = px_fail(err, PX_ERR_RUNTIME, "cannot rename it to %s: %s", file,
			     strerror(errno));
	if (rc) {
		unlink(part);
		fail_at(err, part);
	}
	return rc;
}

/* DIR/latest = step, written under latest.tmp (fresh, never through a link) and renamed. */
static int write_latest(const char *dir, long step, PxError *err)
{
	char tmp[4200], latest[4200], text[32];
	snprintf(tmp, sizeof(tmp), "%s/latest.tmp", dir);
	snprintf(latest, sizeof(latest), "%s/latest", dir);
	int len = snprintf(text, sizeof(text), "%ld\n", step);
	unlink(tmp); /* our name: an earlier crash's, or a link, which goes without its target */
	int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
	if (fd < 0)
		return px_fail(err, PX_ERR_RUNTIME, "%s: cannot create: %s", tmp, strerror(errno));
	int bad = write(fd, text, (size_t)len) != len || fsync(fd);
	int e = errno;
	if (close(fd) && !bad)
		bad = 1, e = errno;
	if (!bad && rename(tmp, latest))
		bad = 1, e = errno;
	if (bad) {
		unlink(tmp);
		return px_fail(err, PX_ERR_RUNTIME, "%s: cannot write: %s", latest, strerror(e));
	}
	return 0;
}

/* Rank 0, every rank's file written: DIR/step-N.tmp becomes DIR/step-N. An earlier DIR/step-N
 * (an earlier run's save of the same step) is swapped out in one rename where the file system
 * can, so that DIR/latest never names a missing step, and then removed. */
static int put_in_place(const char *tmp, const char *final, PxError *err)
{
	struct stat sb;
	if (lstat(final, &sb)) {
		if (errno != ENOENT)
			return px_fail(err, PX_ERR_RUNTIME, "%s: %s", final, strerror(errno));
	} else {
		if (check_step(final, err))
			return -1;
		if (!renameat2(AT_FDCWD, tmp, AT_FDCWD, final, RENAME_EXCHANGE))
			return remove_step(tmp, err); /* tmp holds the earlier step now */
		if (remove_step(final, err)) /* no exchange on this file system */
			return -1;
	}
	if (rename(tmp, final))
		return px_fail(err, PX_ERR_RUNTIME, "%s: cannot rename it to %s: %s", tmp, final,
			       strerror(errno));
	return 0;
}

int ckpt_save(const char *dir, long step, Runner *run, Comm *world, PxError *err)
{
	char tmp[4096], final[4096], file[4200], part[4300];
	int rank = comm_rank(world), rc = 0;
	snprintf(tmp, sizeof(tmp), "%s/step-%08ld.tmp", dir, step);
	snprintf(final, sizeof(final), "%s/step-%08ld", dir, step);
	if (rank == 0) { /* a fresh folder for this save: what a crashed save left goes first */
		if (mkdir(dir, 0777) && errno != EEXIST)
			return px_fail(err, PX_ERR_RUNTIME, "%s: cannot create: %s", dir,
				       strerror(errno));
		if (remove_step(tmp, err))
			return -1;
		if (mkdir(tmp, 0777))
			return px_fail(err, PX_ERR_RUNTIME, "%s: cannot create: %s", tmp,
				       strerror(errno));
	}
	if (comm_barrier(world, err))
		return -1;
	snprintf(file, sizeof(file), "%s/rank-%05d.bin", tmp, rank);
	snprintf(part, sizeof(part), "%s.part", file);
	rc = write_rank(part, file, run, err);
	if (rc && rank == 0)
		rmdir(tmp); /* goes where no other rank's file is in it */
	if (rc || comm_barrier(world, err))
		return -1;
	if (rank == 0 && (put_in_place(tmp, final, err) || write_latest(dir, step, err)))
		return -1;
	return comm_barrier(world, err);
}

/* ---- reading ---- */

long ckpt_load(const char *dir, Runner *run, Comm *world, PxError *err)
{
	char path[4200];
	long step = -1;
	snprintf(path, sizeof(path), "%s/latest", dir);
	FILE *l = fopen(path, "r");
	if (!l)
		return px_fail(err, PX_ERR_INPUT, "%s: cannot open: %s (no checkpoint to resume)",
			       path, strerror(errno));
	if (fscanf(l, "%ld", &step) != 1 || step < 1) {
		fclose(l);
		return px_fail(err, PX_ERR_INPUT, "%s: expected a step number", path);
	}
	fclose(l);
	snprintf(path, sizeof(path), "%s/step-%08ld/rank-%05d.bin", dir, step, comm_rank(world));
	FILE *f = fopen(path, "rb");
	if (!f)
		return px_fail(err, PX_ERR_INPUT, "%s: cannot open: %s", path, strerror(errno));
	int rc = runner_load(run, f, path, err);
	fclose(f);
	return rc ? -1 : step;
}

#include "swapfile.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int swap_open(SwapDir *d, const char *root, const char *tag, const char *key, int rank,
	      PxError *err)
{
	memset(d, 0, sizeof(*d));
	struct stat st;
	if (!root[0])
		return px_fail(err, PX_ERR_INPUT, "%s: expected the directory the swap files go in "
			       "(DeepSpeed needs it for device \"nvme\"), got none", key);
	int bad = stat(root, &st), e = errno;
	if (bad || !S_ISDIR(st.st_mode)) {
		const char *why = bad ? strerror(e) : "not a directory";
		return px_fail(err, PX_ERR_INPUT, "%s: expected an existing directory, got \"%s\" (%s)",
			       key, root, why);
	}
	int n = snprintf(d->path, sizeof(d->path), "%s/parallax-%s-%ld-r%d", root, tag,
			 (long)getpid(), rank);
	if (n < 0 || (size_t)n >= sizeof(d->path))
		return px_fail(err, PX_ERR_INPUT, "%s: \"%s\" is too long a path", key, root);
	if (mkdir(d->path, 0700)) {
		e = errno;
		d->path[0] = '\0';
		return px_fail(err, PX_ERR_RUNTIME, "%s: cannot create a swap directory in \"%s\": %s",
			       key, root, strerror(e));
	}
	return 0;
}

/* The files' allocated blocks now, in bytes; the peak follows. */
static void note_blocks(SwapDir *d)
{
	double b = 0;
	struct stat st;
	for (int i = 0; i < d->n; i++)
		if (d->fd[i] >= 0 && !fstat(d->fd[i], &st))
			b += (double)st.st_blocks * 512.0;
	if (b > d->blocks_peak)
		d->blocks_peak = b;
}

int swap_create(SwapDir *d, size_t bytes, PxError *err)
{
	if (d->n == SWAP_MAX_FILES) {
		px_fail(err, PX_ERR_RUNTIME, "more than %d swap files", SWAP_MAX_FILES);
		return -1;
	}
	int i = d->n;
	char dir[sizeof(d->path)];
	memcpy(dir, d->path, sizeof(dir));
	snprintf(d->name[i], sizeof(d->name[i]), "%s/%d.swp", dir, i);
	d->fd[i] = open(d->name[i], O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (d->fd[i] < 0) {
		px_fail(err, PX_ERR_RUNTIME, "cannot create swap file %s: %s", d->name[i],
			strerror(errno));
		return -1;
	}
	d->n++;
	int rc = bytes ? posix_fallocate(d->fd[i], 0, (off_t)bytes) : 0;
	if (rc) {
		px_fail(err, PX_ERR_RUNTIME, "cannot allocate %zu bytes for swap file %s: %s", bytes,
			d->name[i], strerror(rc));
		return -1;
	}
	note_blocks(d);
	return i;
}

/* bytes between buf and file f from byte off, written or read, counted as they move. */
static int transfer(SwapDir *d, int write, int f, size_t off, void *buf, size_t bytes,
		    PxError *err)
{
	char *p = buf;
	size_t done = 0;
	while (done < bytes) {
		ssize_t k = write ? pwrite(d->fd[f], p + done, bytes - done, (off_t)(off + done)) :
				    pread(d->fd[f], p + done, bytes - done, (off_t)(off + done));
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			return px_fail(err, PX_ERR_RUNTIME, "%s swap file %s: %s",
				       write ? "writing" : "reading", d->name[f],
				       k < 0 ? strerror(errno) : write ? "no progress" : "it ends early");
		done += (size_t)k;
		*(write ? &d->write_bytes : &d->read_bytes) += (double)k;
	}
	return 0;
}

int swap_write(SwapDir *d, int f, size_t off, const void *src, size_t bytes, PxError *err)
{
	if (transfer(d, 1, f, off, (void *)src, bytes, err)) /* written from, not to */
		return -1;
	note_blocks(d);
	return 0;
}

int swap_read(SwapDir *d, int f, size_t off, void *dst, size_t bytes, PxError *err)
{
	return transfer(d, 0, f, off, dst, bytes, err);
}

void swap_close(SwapDir *d)
{
	for (int i = 0; i < d->n; i++) {
		if (d->fd[i] >= 0)
			close(d->fd[i]);
		unlink(d->name[i]);
		d->fd[i] = -1;
	}
	d->n = 0;
	if (d->path[0])
		rmdir(d->path);
	d->path[0] = '\0';
}

/* swapfile: ZeRO-Infinity's NVMe place on this machine: one file for each buffer the schedule
 * keeps on NVMe, in a directory of this rank's own under the configured nvme_path, moved with
 * pread and pwrite. What it measures is the kernel's: the bytes its calls moved (their return
 * values) and the disk blocks the files hold (fstat's st_blocks), never a schedule's sizes. Which
 * buffer goes where, and when, is the runner's (runner_nvme.c). */
#ifndef PX_EXEC_SWAPFILE_H
#define PX_EXEC_SWAPFILE_H

#include <stddef.h>

#include "../engine/err.h"

#define SWAP_MAX_FILES 8

typedef struct SwapDir {
	char path[512];           /* the rank's directory, created by swap_open */
	int fd[SWAP_MAX_FILES];   /* each file's descriptor (-1: closed) */
	char name[SWAP_MAX_FILES][600];
	int n;                    /* files created */
	double read_bytes, write_bytes; /* moved by the calls, since swap_open */
	double blocks_peak;       /* the files' disk blocks in bytes at their highest */
} SwapDir;

/* Create root/parallax-TAG-PID-rRANK (root must exist: DeepSpeed's nvme_path), empty; the tag
 * keeps apart what shares a root (DeepSpeed's optimizer and fp16params folders). On
 * failure err names key (the configuration key that gave root) and the system's reason. */
int swap_open(SwapDir *d, const char *root, const char *tag, const char *key, int rank,
	      PxError *err);
/* A new file of bytes, its blocks allocated (posix_fallocate, as a swap file's are before use);
 * its index, or -1 with err. */
int swap_create(SwapDir *d, size_t bytes, PxError *err);
/* Write bytes from src into file f from byte off / read them into dst; -1 with err when the
 * system moves fewer. */
int swap_write(SwapDir *d, int f, size_t off, const void *src, size_t bytes, PxError *err);
int swap_read(SwapDir *d, int f, size_t off, void *dst, size_t bytes, PxError *err);
/* Close and remove every file and the directory. Accepts a SwapDir never opened (zeroed). */
void swap_close(SwapDir *d);

#endif

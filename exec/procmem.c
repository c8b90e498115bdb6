#include "procmem.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

/* A "Key:   123 kB" line of /proc/self/status in bytes; NAN when absent. */
static double status_kib(const char *key)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	size_t k = strlen(key);
	double v = NAN;
	if (!f)
		return NAN;
	while (fgets(line, sizeof(line), f)) {
		long long kib;
		if (!strncmp(line, key, k) && line[k] == ':' &&
		    sscanf(line + k + 1, "%lld kB", &kib) == 1) {
			v = (double)kib * 1024;
			break;
		}
	}
	fclose(f);
	return v;
}

double procmem_peak_rss_bytes(void)
{
	double v = status_kib("VmHWM");
	struct rusage u;
	if (isnan(v) && !getrusage(RUSAGE_SELF, &u))
		v = (double)u.ru_maxrss * 1024; /* Linux: kibibytes */
	return v;
}

double procmem_rss_bytes(void)
{
	return status_kib("VmRSS");
}

int procmem_reset_peak(void)
{
	int fd = open("/proc/self/clear_refs", O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	int rc = write(fd, "5", 1) == 1 ? 0 : -errno;
	close(fd);
	return rc;
}

long long procmem_minor_faults(void)
{
	struct rusage u;
	return getrusage(RUSAGE_SELF, &u) ? -1 : (long long)u.ru_minflt;
}

#include "check_report.h"

#include <stdarg.h>
#include <stdio.h>

int check_rank;
int check_passed, check_failed;

void check_at(int ok, const char *file, int line, const char *fmt, ...)
{
	if (ok) {
		check_passed++;
		return;
	}
	check_failed++;
	char msg[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	fprintf(stderr, "rank %d: %s:%d: %s\n", check_rank, file, line, msg);
}

int check_modulus(CommDtype dt, int n)
{
	long limit = dt == COMM_BF16 ? 256 : dt == COMM_FP16 ? 2048 : 1L << 24;
	long m = limit / ((long)n * (n + 1) / 2);
	return m > 97 ? 97 : m < 1 ? 1 : (int)m;
}

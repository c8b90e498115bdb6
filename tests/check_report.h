/* check_report: what the standalone check programs run under a launcher (comm_mpi_check,
 * comm_nccl_check) share: the pass/fail tally of this rank, a failure line naming the rank and
 * file:line, and the modulus of their verifiable data. Not part of px_tests (CUnit's suites). */
#ifndef PX_TEST_CHECK_REPORT_H
#define PX_TEST_CHECK_REPORT_H

#include "../exec/comm.h"

extern int check_rank;                /* printed with every failure; set once known */
extern int check_passed, check_failed; /* this rank's tally */

/* Count ok; when it is false, print "rank R: FILE:LINE: message" to stderr. */
void check_at(int ok, const char *file, int line, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
#define CHECK(ok, ...) check_at((ok), __FILE__, __LINE__, __VA_ARGS__)

/* A call that must succeed, with a PxError named err in scope; its message is the failure's. */
#define CALL(expr) CHECK((expr) == 0, "%s: %s", #expr, err.msg)

/* Verifiable data: rank r's element k is (r + 1) x (k mod m + 1), so every rank can compute any
 * rank's data. m (1 to 97) keeps every sum over a group of n ranks (at most n(n+1)/2 x m) an
 * integer dt holds exactly, so every order of addition gives the same bits: bf16 holds the
 * integers to 256, fp16 to 2048, fp32 to 2^24. */
int check_modulus(CommDtype dt, int n);

#endif

/* check_onebit: comm_mpi_check --onebit, exec/onebit_comm.c's compressed all-reduce over Open
 * MPI against its definition (DeepSpeed's compressed_allreduce, runtime/comm/nccl.py): on 2
 * ranks, two calls on data whose results are worked by hand (the second showing the worker error
 * carried over); on 4 ranks, a hand case and a padded one against a second computation in double
 * that holds every rank's data. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/onebit.h"
#include "../exec/onebit_comm.h"
#include "check_onebit.h"
#include "check_report.h"

static void expect(const float *got, const double *want, size_t n, const char *what)
{
	for (size_t k = 0; k < n; k++)
		CHECK(fabs(got[k] - want[k]) <= 1e-5 * (1 + fabs(want[k])),
		      "%s: element %zu is %.9g, expected %.9g", what, k, got[k], want[k]);
}

/* 2 ranks, 16 elements (padded 16, chunks of 8). Rank 0: 1 at even k, 7 at odd; rank 1: -2.
 * Call 1: rank 0's scale sqrt((1 + 49) / 2) = 5, worker error 1 - 5 = -4 (even), 7 - 5 = 2 (odd);
 * rank 1's scale 2, error 0. Each chunk's server: (5 x +1 + 2 x -1) / 2 = 1.5 everywhere, scale
 * 1.5, error 0: the result is 1.5 everywhere.
 * Call 2 (same momenta): rank 0's buffer -3 (even), 9 (odd), scale sqrt((9 + 81) / 2) = sqrt(45);
 * server: (-sqrt(45) - 2) / 2 (even), (sqrt(45) - 2) / 2 (odd), whose scale with a = sqrt(45) / 2
 * is sqrt(((a + 1)^2 + (a - 1)^2) / 2) = sqrt(a^2 + 1) = sqrt(49 / 4) = 3.5: the result is -3.5
 * (even), 3.5 (odd). */
static void hand_two(Comm *c)
{
	PxError err = {0};
	int r = comm_rank(c);
	float m[16], we[16] = {0}, se[8] = {0};
	double want[16], want_we[16];
	for (int call = 1; call <= 2; call++) {
		for (int k = 0; k < 16; k++)
			m[k] = r == 0 ? (k % 2 ? 7.0f : 1.0f) : -2.0f;
		CALL(onebit_comm_allreduce(c, m, 16, 16, we, se, &err));
		for (int k = 0; k < 16; k++)
			want[k] = call == 1 ? 1.5 : (k % 2 ? 3.5 : -3.5);
		expect(m, want, 16, call == 1 ? "2 ranks, call 1" : "2 ranks, call 2");
		if (call == 1) {
			for (int k = 0; k < 16; k++)
				want_we[k] = r == 0 ? (k % 2 ? 2.0 : -4.0) : 0.0;
			expect(we, want_we, 16, "2 ranks, worker error after call 1");
		}
	}
}

/* 4 ranks, 32 elements (chunks of 8): rank r holds +1, -2, +3, -4 everywhere, its scale |v|
 * and no error; every chunk's server (1 - 2 + 3 - 4) / 4 = -0.5: the result is -0.5. */
static void hand_four(Comm *c)
{
	PxError err = {0};
	int r = comm_rank(c);
	float m[32], we[32] = {0}, se[8] = {0};
	double want[32];
	for (int k = 0; k < 32; k++)
		m[k] = (float)((r + 1) * (r % 2 ? -1 : 1)), want[k] = -0.5;
	comm_counters_reset(c);
	CALL(onebit_comm_allreduce(c, m, 32, 32, we, se, &err));
	expect(m, want, 32, "4 ranks, hand");
	/* the bytes this rank sent, as the transport counted them, against the schedule's
	 * (engine/onebit.c onebit_volume: 2 x 3/4 x (4 sign bytes + 16 scale bytes) = 30 B) */
	const CommCounters *k = comm_counters(c);
	double sent = 0;
	for (int i = 0; i < N_COMM_KINDS; i++)
		for (int t = 0; t < N_COMM_TAGS; t++)
			sent += k->wire_bytes[i][t];
	CHECK(k->wire_counted && sent == onebit_volume(32, 4).wire_bytes && sent == 30,
	      "4 ranks: sent %.0f B (counted %d), onebit_volume says %.0f", sent, k->wire_counted,
	      onebit_volume(32, 4).wire_bytes);
}

/* Rank r's element k of the padded case: away from zero, of mixed signs and sizes. */
static double val(int r, int k)
{
	return (r + 1) * ((k * 7 + r * 3) % 11 - 5) + 0.25 * (r - 1.5);
}

static double sgn(double x)
{
	return x < 0 ? -1.0 : 1.0;
}

/* The definition in double for every rank at once: n ranks, elems padded to P, chunk P / n. */
static void reference(int n, int elems, int P, double *we, double *se, double *out)
{
	int C = P / n;
	double *buf = calloc((size_t)(n * P), sizeof(double)), *scale = calloc((size_t)n, sizeof(double));
	double *res = calloc((size_t)P, sizeof(double));
	for (int r = 0; r < n; r++) {
		double ss = 0;
		for (int k = 0; k < P; k++) {
			buf[r * P + k] = (k < elems ? val(r, k) : 0) + we[r * P + k];
			ss += buf[r * P + k] * buf[r * P + k];
		}
		scale[r] = sqrt(ss / P);
		for (int k = 0; k < P; k++)
			we[r * P + k] = buf[r * P + k] - scale[r] * sgn(buf[r * P + k]);
	}
	for (int j = 0; j < n; j++) { /* chunk j, on rank j */
		double ss = 0, *srv = res + j * C;
		for (int k = 0; k < C; k++) {
			srv[k] = se[j * C + k];
			for (int r = 0; r < n; r++)
				srv[k] += sgn(buf[r * P + j * C + k]) * scale[r] / n;
			ss += srv[k] * srv[k];
		}
		double s = sqrt(ss / C);
		for (int k = 0; k < C; k++) {
			se[j * C + k] = srv[k] - s * sgn(srv[k]);
			srv[k] = s * sgn(srv[k]);
		}
	}
	memcpy(out, res, (size_t)elems * sizeof(double));
	free(buf), free(scale), free(res);
}

/* 30 elements padded to 32 on 4 ranks (the padding's zeros count +1, as DeepSpeed's), three
 * calls, against reference(). */
static void padded_four(Comm *c)
{
	PxError err = {0};
	int r = comm_rank(c), n = comm_size(c);
	enum { E = 30, P = 32 };
	float m[P], we[P] = {0}, se[P] = {0};
	double rwe[4 * P] = {0}, rse[P] = {0}, want[P];
	for (int call = 1; call <= 3; call++) {
		for (int k = 0; k < E; k++)
			m[k] = (float)val(r, k);
		reference(n, E, P, rwe, rse, want);
		CALL(onebit_comm_allreduce(c, m, E, P, we, se, &err));
		char what[64];
		snprintf(what, sizeof(what), "4 ranks, padded, call %d", call);
		expect(m, want, E, what);
		expect(we, rwe + r * P, P, "4 ranks, padded, worker error");
		expect(se, rse + r * (P / n), P / n, "4 ranks, padded, server error");
	}
}

void check_onebit(Comm *world)
{
	PxError err = {0};
	int n = comm_size(world);
	float m[16] = {0}, we[16] = {0}, se[8] = {0};
	CHECK(onebit_comm_allreduce(world, m, 16, 12, we, se, &err) == -1 &&
		      strstr(err.msg, "padded to 12: the padding must be a multiple of 8"),
	      "a padding below the elements refused: %s", err.msg);
	if (n == 2)
		hand_two(world);
	if (n == 4) {
		hand_four(world);
		padded_four(world);
	}
}

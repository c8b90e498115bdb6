/* run_checks: see run_checks.h. */
#include "run_checks.h"

#include <CUnit/CUnit.h>
#include <sqlite3.h>
#include <stdio.h>

#include "suites.h"

void px_check_pool_peaks(sqlite3 *db, int ranks)
{
	for (int place = 0; place < 2; place++) {
		char sql[1024];
		const char *pl = place ? "cpu" : "gpu";
		snprintf(sql, sizeof(sql), "SELECT COUNT(*) FROM predicted_vs_measured v JOIN metrics r "
			 "ON r.run_id = v.measured_run_id AND r.rank = v.rank AND r.name = "
			 "'memory.%s.requested_peak_bytes' WHERE v.name = 'memory.%s.peak_bytes' AND "
			 "r.value = v.predicted AND v.measured >= v.predicted AND "
			 "v.measured <= 1.25 * v.predicted", pl, pl);
		double good = px_test_query(db, sql);
		if (good != ranks)
			fprintf(stderr, "\n%s peaks: %g of %d ranks as expected\n", pl, good, ranks);
		CU_ASSERT_EQUAL(good, ranks);
	}
}

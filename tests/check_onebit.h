/* check_onebit: the 1-bit compressed all-reduce's checks that comm_mpi_check --onebit runs (2 or
 * 4 ranks), on the check_report tally. */
#ifndef PX_TEST_CHECK_ONEBIT_H
#define PX_TEST_CHECK_ONEBIT_H

#include "../exec/comm.h"

void check_onebit(Comm *world);

#endif

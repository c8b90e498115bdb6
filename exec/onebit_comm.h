/* onebit_comm: DeepSpeed's 1-bit compressed all-reduce with error feedback (runtime/comm/nccl.py
 * compressed_allreduce) over a Comm, on host fp32 arrays: each rank's error-compensated buffer
 * compressed to packed signs and one scale, an all-to-all of the sign chunks and an all-gather
 * of the scales, each chunk's owner averaging and recompressing it (server error), an all-gather
 * of the server signs and scales, every rank decompressing. It does not decide which tensors are
 * exchanged or when (exec/runner_onebit.c reads that from the schedule). */
#ifndef PX_EXEC_ONEBIT_COMM_H
#define PX_EXEC_ONEBIT_COMM_H

#include <stddef.h>

#include "../kernels/onebit_cpu.h"
#include "comm.h"

/* m (elems) <- the compressed average of every rank's m over c. worker_err: padded_elems fp32
 * (padded_elems >= elems, a multiple of 8 comm_size(c), as optim_onebit_padded_elems makes it);
 * server_err: padded_elems / n fp32, this rank's chunk; both carried from call to call (zero at
 * first). 0, or -1 with err (a collective failed, out of memory, a padding that is not a
 * multiple of 8 n). */
int onebit_comm_allreduce(Comm *c, float *m, size_t elems, size_t padded_elems, float *worker_err,
			  float *server_err, PxError *err);

#endif

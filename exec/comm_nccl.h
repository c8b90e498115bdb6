/* comm_nccl: the NCCL backend of comm.h (comm_nccl_backend, declared there), one process per GPU,
 * on device buffers. This header adds what only an NCCL run has: the stream every collective of
 * the process runs on, for the executor to order its compute streams against with events. */
#ifndef PX_EXEC_COMM_NCCL_H
#define PX_EXEC_COMM_NCCL_H

#include <cuda_runtime_api.h>

#include "comm.h"

/* The communication stream of this process's NCCL world (one for the world and all its splits),
 * or NULL before comm_init with comm_nccl_backend or after comm_finalize. Owned by the backend.
 * Every blocking call has completed on it by the time it returns; started ones (comm.h's
 * comm_*_start) are ordered against the compute stream of comm_set_stream with events. */
cudaStream_t comm_nccl_stream(void);

/* The CUDA device comm_nccl_backend's init chose for this process: LOCAL_RANK's, or 0 where the
 * launcher left one device visible per process. -1 before init. */
int comm_nccl_device(void);

#endif

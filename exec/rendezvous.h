/* rendezvous: hands a small blob (NCCL's unique id) from rank 0 to every other rank over TCP, for
 * jobs started torchrun-style (MASTER_ADDR, MASTER_PORT) where there is no MPI to broadcast it.
 * Owns the sockets and their time limits; knows nothing of NCCL. IPv4 only. */
#ifndef PX_EXEC_RENDEZVOUS_H
#define PX_EXEC_RENDEZVOUS_H

#include <stddef.h>

#include "../engine/err.h"

enum { RENDEZVOUS_MAX_BYTES = 4096 };

/* MASTER_ADDR (a host name or IPv4 address) into host, MASTER_PORT (1-65535) into *port. Returns 0,
 * or -1 with err naming the missing or malformed variable. */
int rendezvous_addr_from_env(char *host, size_t host_bytes, int *port, PxError *err);

/* Collective over size processes: rank 0 listens on port (every interface) and sends blob to each
 * other rank, which connects to host:port, retrying while rank 0 is not yet listening, and
 * receives it into blob. bytes (at most RENDEZVOUS_MAX_BYTES) must agree everywhere. Gives up
 * after timeout_s with a message saying which ranks or which address it waited for. Returns 0 or
 * -1 with err set. */
int rendezvous_bcast(const char *host, int port, int rank, int size, void *blob, size_t bytes,
		     double timeout_s, PxError *err);

#endif

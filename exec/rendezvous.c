#include "rendezvous.h"

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "../engine/clock.h"

/* What a connecting rank says first, in network byte order: who it is and what it expects, so
 * that a stray connection or a rank of another build is told apart from a real one. */
enum { HELLO_MAGIC = 0x50585256u /* "PXRV" */, HELLO_WORDS = 3 };

/* ---- environment ---- */

int rendezvous_addr_from_env(char *host, size_t host_bytes, int *port, PxError *err)
{
	const char *h = getenv("MASTER_ADDR"), *p = getenv("MASTER_PORT");
	if (!h || !*h)
		return px_fail(err, PX_ERR_INPUT,
			       "MASTER_ADDR is not set: a torchrun-style launch needs rank 0's "
			       "address in MASTER_ADDR and a free port in MASTER_PORT");
	if (strlen(h) >= host_bytes)
		return px_fail(err, PX_ERR_INPUT, "MASTER_ADDR is longer than %zu characters",
			       host_bytes - 1);
	if (!p || !*p)
		return px_fail(err, PX_ERR_INPUT,
			       "MASTER_PORT is not set: give a free TCP port on rank 0's host");
	char *end;
	errno = 0;
	long v = strtol(p, &end, 10);
	if (errno || *end || v < 1 || v > 65535)
		return px_fail(err, PX_ERR_INPUT,
			       "MASTER_PORT must be a port number 1-65535, got '%s'", p);
	snprintf(host, host_bytes, "%s", h);
	*port = (int)v;
	return 0;
}

/* ---- time and sockets ---- */

/* Both directions of fd give up after s seconds (at least 1 ms: 0 would mean never). */
static void set_timeouts(int fd, double s)
{
	if (s < 1e-3)
		s = 1e-3;
	struct timeval tv = {.tv_sec = (time_t)s,
			     .tv_usec = (suseconds_t)((s - (double)(time_t)s) * 1e6)};
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

/* All n bytes, or -1 (error, time-out or the peer closed). */
static int read_full(int fd, void *buf, size_t n)
{
	char *p = buf;
	while (n) {
		ssize_t got = recv(fd, p, n, 0);
		if (got < 0 && errno == EINTR)
			continue;
		if (got <= 0)
			return -1;
		p += got;
		n -= (size_t)got;
	}
	return 0;
}

static int write_full(int fd, const void *buf, size_t n)
{
	const char *p = buf;
	while (n) {
		ssize_t put = send(fd, p, n, MSG_NOSIGNAL);
		if (put < 0 && errno == EINTR)
			continue;
		if (put <= 0)
			return -1;
		p += put;
		n -= (size_t)put;
	}
	return 0;
}

/* ---- rank 0 ---- */

static int listen_on(int port, PxError *err)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return px_fail(err, PX_ERR_RUNTIME, "rendezvous: socket: %s", strerror(errno));
	int one = 1;
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
				.sin_addr.s_addr = htonl(INADDR_ANY)};
	if (bind(fd, (struct sockaddr *)&a, sizeof(a)) || listen(fd, 128)) {
		int e = errno;
		close(fd);
		return px_fail(err, PX_ERR_RUNTIME,
			       "rendezvous: rank 0 cannot listen on port %d: %s (choose another "
			       "MASTER_PORT)",
			       port, strerror(e));
	}
	return fd;
}

/* Serve one connection: read its hello, send the blob. Returns the rank served, -1 for a
 * connection that was not a rank of this job (ignored), -2 with err for a rank that expects
 * another size of blob. */
static int serve_one(int fd, int size, const void *blob, size_t bytes, double left_s,
		     PxError *err)
{
	uint32_t hello[HELLO_WORDS];
	set_timeouts(fd, left_s);
	if (read_full(fd, hello, sizeof(hello)) || ntohl(hello[0]) != HELLO_MAGIC)
		return -1;
	uint32_t rank = ntohl(hello[1]), want = ntohl(hello[2]);
	if (rank == 0 || rank >= (uint32_t)size)
		return -1;
	if (want != bytes) {
		px_fail(err, PX_ERR_RUNTIME,
			"rendezvous: rank %u expects %u bytes, rank 0 has %zu: the ranks run "
			"different builds",
			rank, want, bytes);
		return -2;
	}
	return write_full(fd, blob, bytes) ? -1 : (int)rank;
}

/* Name the first few ranks that never connected, for the time-out message. */
static void missing_ranks(const unsigned char *seen, int size, char *out, size_t n)
{
	size_t len = 0;
	int shown = 0, left = 0;
	out[0] = '\0';
	for (int r = 1; r < size; r++) {
		if (seen[r])
			continue;
		if (shown < 8 && len < n)
			len += (size_t)snprintf(out + len, n - len, "%s%d", shown ? ", " : "", r);
		else
			left++;
		shown++;
	}
	if (left && len < n)
		snprintf(out + len, n - len, " and %d more", left);
}

static int serve_all(int lfd, int size, const void *blob, size_t bytes, double deadline,
		     PxError *err)
{
	unsigned char *seen = calloc((size_t)size, 1);
	if (!seen)
		return px_fail(err, PX_ERR_RUNTIME, "rendezvous: out of memory");
	int served = 0, rc = -1;
	while (served < size - 1) {
		double left = deadline - px_now_s();
		struct pollfd p = {.fd = lfd, .events = POLLIN};
		int ready = left > 0 ? poll(&p, 1, (int)(left * 1000) + 1) : 0;
		if (ready < 0 && errno == EINTR)
			continue;
		if (ready <= 0) {
			char miss[128];
			missing_ranks(seen, size, miss, sizeof(miss));
			px_fail(err, PX_ERR_RUNTIME,
				"rendezvous: rank 0 waited for %d of %d ranks that never connected "
				"(ranks %s): are they started, with the same MASTER_ADDR and "
				"MASTER_PORT?",
				size - 1 - served, size - 1, miss);
			goto out;
		}
		int fd = accept(lfd, NULL, NULL);
		if (fd < 0)
			continue;
		int r = serve_one(fd, size, blob, bytes, deadline - px_now_s(), err);
		close(fd);
		if (r == -2)
			goto out;
		if (r > 0 && !seen[r]) {
			seen[r] = 1;
			served++;
		}
	}
	rc = 0;
out:
	free(seen);
	return rc;
}

/* ---- the other ranks ---- */

static int resolve(const char *host, int port, struct sockaddr_in *a, PxError *err)
{
	struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res;
	int rc = getaddrinfo(host, NULL, &hints, &res);
	if (rc)
		return px_fail(err, PX_ERR_RUNTIME, "rendezvous: MASTER_ADDR '%s': %s", host,
			       gai_strerror(rc));
	memcpy(a, res->ai_addr, sizeof(*a));
	a->sin_port = htons((uint16_t)port);
	freeaddrinfo(res);
	return 0;
}

/* One try: connect, say hello, read the blob. 1 when nobody listens yet, -1 on other errors. */
static int fetch_once(const struct sockaddr_in *a, int rank, void *blob, size_t bytes,
		      double left_s)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	set_timeouts(fd, left_s); /* Linux's connect honours the send time-out */
	int rc = 0;
	if (connect(fd, (const struct sockaddr *)a, sizeof(*a))) {
		rc = errno == ECONNREFUSED || errno == EINTR || errno == ETIMEDOUT ||
				     errno == EINPROGRESS
			     ? 1
			     : -1;
	} else {
		uint32_t hello[HELLO_WORDS] = {htonl(HELLO_MAGIC), htonl((uint32_t)rank),
					       htonl((uint32_t)bytes)};
		/* rank 0 closes without a reply when it refuses us: try again until the end */
		if (write_full(fd, hello, sizeof(hello)) || read_full(fd, blob, bytes))
			rc = 1;
	}
	int e = errno;
	close(fd);
	errno = e; /* for the caller's message */
	return rc;
}

static int fetch(const char *host, int port, int rank, void *blob, size_t bytes, double deadline,
		 PxError *err)
{
	struct sockaddr_in a;
	if (resolve(host, port, &a, err))
		return -1;
	for (;;) {
		double left = deadline - px_now_s();
		if (left <= 0)
			return px_fail(err, PX_ERR_RUNTIME,
				       "rendezvous: rank %d found no rank 0 at %s:%d in time: is rank "
				       "0 started, with MASTER_ADDR naming its host?",
				       rank, host, port);
		int rc = fetch_once(&a, rank, blob, bytes, left);
		if (rc == 0)
			return 0;
		if (rc < 0)
			return px_fail(err, PX_ERR_RUNTIME,
				       "rendezvous: rank %d: connect to %s:%d: %s", rank, host, port,
				       strerror(errno));
		nanosleep(&(struct timespec){0, 20000000}, NULL); /* 20 ms between tries */
	}
}

/* ---- both ---- */

int rendezvous_bcast(const char *host, int port, int rank, int size, void *blob, size_t bytes,
		     double timeout_s, PxError *err)
{
	if (size < 1 || rank < 0 || rank >= size || bytes > RENDEZVOUS_MAX_BYTES || port < 1 ||
	    port > 65535)
		return px_fail(err, PX_ERR_RUNTIME,
			       "rendezvous: need 0 <= rank < size, at most %d bytes and a port "
			       "1-65535; got rank %d size %d, %zu bytes, port %d",
			       RENDEZVOUS_MAX_BYTES, rank, size, bytes, port);
	if (size == 1)
		return 0;
	double deadline = px_now_s() + timeout_s;
	if (rank != 0)
		return fetch(host, port, rank, blob, bytes, deadline, err);
	int lfd = listen_on(port, err);
	if (lfd < 0)
		return -1;
	int rc = serve_all(lfd, size, blob, bytes, deadline, err);
	close(lfd);
	return rc;
}

/* comm_nccl_check: every call of exec/comm.h on device buffers, through the NCCL backend (one
 * process per GPU) or the staged MPI backend (many ranks on one GPU), in fp32, fp16 and bf16, on
 * the world and on a split; nccl-tests' verifiable data (every rank can compute every rank's
 * input, so the exact result is known); the byte counters worked by hand; the GPU memory readings
 * (gpumem).
 * Run: mpirun -np N comm_nccl_check [--backend nccl|staged] [--fault hang], or N processes with
 * torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT).
 * Each rank prints "comm_nccl_check: rank R ...: P passed, F failed"; exit status 1 on failures. */
#include <cuda_runtime_api.h>
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../exec/comm.h"
#include "../exec/comm_nccl.h"
#include "../exec/gpumem.h"
#include "check_report.h"

/* C: elements per rank per block; BIG: elements of the one large all-reduce (64 MiB in fp32),
 * large enough for NCCL to split it into many chunks. */
enum { C = 1035, BIG = 1 << 24 };

/* A CUDA call that must work, or the program ends: file:line, the call, CUDA's string, rank. */
#define CUDA(expr)                                                                          \
	do {                                                                                \
		cudaError_t rc_ = (expr);                                                   \
		if (rc_ != cudaSuccess) {                                                   \
			fprintf(stderr, "rank %d: %s:%d: %s: %s\n", check_rank, __FILE__,  \
				__LINE__, #expr, cudaGetErrorString(rc_));                  \
			exit(2);                                                            \
		}                                                                           \
	} while (0)

/* ---- verifiable data (check_report.h: check_modulus) ---- */

static float val(int r, size_t k, int m)
{
	return (float)(r + 1) * (float)(k % (size_t)m + 1);
}

/* Exact small integers only (no rounding, no subnormals): the test's own encoder, independent of
 * the code under test. fp16: 1 sign, 5 exponent (bias 15), 10 fraction bits. */
static uint16_t f32_bits_to_half(float f, CommDtype dt)
{
	uint32_t b;
	memcpy(&b, &f, sizeof(b));
	if (dt == COMM_BF16)
		return (uint16_t)(b >> 16);
	if ((b & 0x7fffffffu) == 0)
		return (uint16_t)(b >> 16);
	uint32_t e = ((b >> 23) & 0xff) - 127 + 15;
	return (uint16_t)(((b >> 16) & 0x8000) | (e << 10) | ((b >> 13) & 0x3ff));
}

static float half_bits_to_f32(uint16_t h, CommDtype dt)
{
	uint32_t b;
	if (dt == COMM_BF16) {
		b = (uint32_t)h << 16;
	} else if ((h & 0x7fff) == 0) {
		b = (uint32_t)h << 16;
	} else {
		uint32_t e = ((h >> 10) & 0x1f) + 127 - 15;
		b = ((uint32_t)(h & 0x8000) << 16) | (e << 23) | ((uint32_t)(h & 0x3ff) << 13);
	}
	float f;
	memcpy(&f, &b, sizeof(f));
	return f;
}

static void put(void *buf, CommDtype dt, size_t i, float v)
{
	if (dt == COMM_FP32)
		((float *)buf)[i] = v;
	else
		((uint16_t *)buf)[i] = f32_bits_to_half(v, dt);
}

static float get(const void *buf, CommDtype dt, size_t i)
{
	return dt == COMM_FP32 ? ((const float *)buf)[i]
			       : half_bits_to_f32(((const uint16_t *)buf)[i], dt);
}

/* ---- one communicator, one data type ---- */

typedef struct Case {
	Comm *c;
	const char *group;
	CommDtype dt;
	int r, n, m;
	size_t esz;
	char *dev_a, *dev_b; /* device, n x C elements each */
	char *host;          /* n x C elements */
} Case;

/* The device's buffer (n_elems elements at dev) against want(k) for each element k. */
static void expect(const Case *t, const char *what, const char *dev, size_t n_elems,
		   float (*want)(const Case *, size_t), const char *file, int line)
{
	CUDA(cudaMemcpy(t->host, dev, n_elems * t->esz, cudaMemcpyDeviceToHost));
	size_t k = 0;
	while (k < n_elems && get(t->host, t->dt, k) == want(t, k))
		k++;
	check_at(k == n_elems, file, line,
		 "%s %s on %s (%d ranks): element %zu is %g, expected %g", what,
		 comm_dtype_name(t->dt), t->group, t->n, k,
		 k < n_elems ? (double)get(t->host, t->dt, k) : 0.0,
		 k < n_elems ? (double)want(t, k) : 0.0);
}
#define EXPECT(t, what, dev, n_elems, want) expect(t, what, dev, n_elems, want, __FILE__, __LINE__)

/* Write f(k) for k < n_elems to the device at dev; elements past them are set to -1 (poison). */
static void fill(const Case *t, char *dev, size_t n_elems, size_t poison_to,
		 float (*f)(const Case *, size_t))
{
	for (size_t k = 0; k < poison_to; k++)
		put(t->host, t->dt, k, k < n_elems ? f(t, k) : -1.0f);
	CUDA(cudaMemcpy(dev, t->host, poison_to * t->esz, cudaMemcpyHostToDevice));
}

static float mine(const Case *t, size_t k) { return val(t->r, k, t->m); }
static float root0(const Case *t, size_t k) { return val(0, k, t->m); }
static float gathered(const Case *t, size_t k) { return val((int)(k / C), k % C, t->m); }
/* sum over ranks of (r + 1) x (k mod m + 1), for this rank's block of the whole array */
static float summed_block(const Case *t, size_t k)
{
	return (float)(t->n * (t->n + 1) / 2) * (float)((t->r * (size_t)C + k) % (size_t)t->m + 1);
}
static float summed(const Case *t, size_t k)
{
	return (float)(t->n * (t->n + 1) / 2) * (float)(k % (size_t)t->m + 1);
}
static float maxed(const Case *t, size_t k) { return val(t->n - 1, k, t->m); }
/* all_to_all: block j of rank r's send is val(r, j x C + k); r receives block r of every j */
static float swapped(const Case *t, size_t k)
{
	size_t j = k / C;
	return val((int)j, t->r * (size_t)C + k % C, t->m);
}
static float peer_of(const Case *t, size_t k) { return val(t->r ^ 1, k, t->m); }

static void run_gathers(Case *t)
{
	PxError err = {0};
	size_t nc = (size_t)t->n * C, part = C * t->esz;
	fill(t, t->dev_a, C, C, mine);
	fill(t, t->dev_b, 0, nc, mine);
	CALL(comm_all_gather(t->c, t->dev_a, t->dev_b, C, t->dt, &err));
	EXPECT(t, "all_gather", t->dev_b, nc, gathered);
	/* in place: this rank's block already sits in recv; the rest is poison */
	fill(t, t->dev_b, 0, nc, mine);
	CUDA(cudaMemcpy(t->dev_b + t->r * part, t->dev_a, part, cudaMemcpyDeviceToDevice));
	CALL(comm_all_gather(t->c, t->dev_b + t->r * part, t->dev_b, C, t->dt, &err));
	EXPECT(t, "all_gather in place", t->dev_b, nc, gathered);

	fill(t, t->dev_a, nc, nc, mine);
	CALL(comm_reduce_scatter(t->c, t->dev_a, t->dev_b, C, t->dt, COMM_SUM, &err));
	EXPECT(t, "reduce_scatter", t->dev_b, C, summed_block);
	CALL(comm_reduce_scatter(t->c, t->dev_a, t->dev_a + t->r * part, C, t->dt, COMM_SUM, &err));
	EXPECT(t, "reduce_scatter in place", t->dev_a + t->r * part, C, summed_block);
}

static void run_reductions(Case *t)
{
	PxError err = {0};
	fill(t, t->dev_a, C, C, mine);
	CALL(comm_all_reduce(t->c, t->dev_a, t->dev_b, C, t->dt, COMM_SUM, &err));
	EXPECT(t, "all_reduce", t->dev_b, C, summed);
	CALL(comm_all_reduce(t->c, t->dev_a, t->dev_a, C, t->dt, COMM_MAX, &err));
	EXPECT(t, "all_reduce max in place", t->dev_a, C, maxed);
	fill(t, t->dev_a, C, C, mine);
	CALL(comm_all_reduce(t->c, t->dev_a, t->dev_a, C, t->dt, COMM_SUM, &err));
	EXPECT(t, "all_reduce in place", t->dev_a, C, summed);

	int root = t->n - 1;
	fill(t, t->dev_a, C, C, mine);
	fill(t, t->dev_b, 0, C, mine);
	CALL(comm_reduce(t->c, t->dev_a, t->r == root ? t->dev_b : NULL, C, t->dt, COMM_SUM, root,
			 &err));
	if (t->r == root)
		EXPECT(t, "reduce", t->dev_b, C, summed);

	fill(t, t->dev_a, C, C, mine);
	fill(t, t->dev_b, 0, C, mine);
	CALL(comm_broadcast(t->c, t->r == 0 ? t->dev_a : NULL, t->dev_b, C, t->dt, 0, &err));
	EXPECT(t, "broadcast", t->dev_b, C, root0);
	CALL(comm_broadcast(t->c, t->dev_a, t->dev_a, C, t->dt, 0, &err));
	EXPECT(t, "broadcast in place", t->dev_a, C, root0);
}

static void run_exchanges(Case *t)
{
	PxError err = {0};
	size_t nc = (size_t)t->n * C;
	fill(t, t->dev_a, nc, nc, mine);
	fill(t, t->dev_b, 0, nc, mine);
	CALL(comm_all_to_all(t->c, t->dev_a, t->dev_b, C, t->dt, &err));
	EXPECT(t, "all_to_all", t->dev_b, nc, swapped);
	CALL(comm_all_to_all(t->c, t->dev_a, t->dev_a, C, t->dt, &err));
	EXPECT(t, "all_to_all in place", t->dev_a, nc, swapped);

	/* pairs (0,1), (2,3)...: the even rank sends first, so no pair waits on itself */
	if (t->n % 2 == 0) {
		int peer = t->r ^ 1;
		fill(t, t->dev_a, C, C, mine);
		fill(t, t->dev_b, 0, C, mine);
		if (t->r % 2 == 0) {
			CALL(comm_send(t->c, t->dev_a, C, t->dt, peer, &err));
			CALL(comm_recv(t->c, t->dev_b, C, t->dt, peer, &err));
		} else {
			CALL(comm_recv(t->c, t->dev_b, C, t->dt, peer, &err));
			CALL(comm_send(t->c, t->dev_a, C, t->dt, peer, &err));
		}
		EXPECT(t, "send/recv", t->dev_b, C, peer_of);
	}
	CALL(comm_barrier(t->c, &err));
}

/* ---- started collectives: on the communication stream, ordered against a compute stream ----
 * The inputs are copied in on the compute stream (cudaMemcpyAsync), so a start that did not wait
 * for that stream could read the poison before them; the results are copied out on the compute
 * stream right after the waits, so a wait that did not order that stream after the transfer
 * could read stale bytes (a race: it may also pass by luck when broken, never fail when right).
 * An in-place all_gather, reduce_scatter and all_reduce are in flight at once and waited for in
 * reverse order; nothing is counted before the waits, each call once after them. */
static void fill_on(const Case *t, cudaStream_t cs, char *dev, size_t n_elems, size_t poison_to,
		    float (*f)(const Case *, size_t))
{
	CUDA(cudaMemsetAsync(dev, 0xff, poison_to * t->esz, cs)); /* NaN until the copy lands */
	for (size_t k = 0; k < poison_to; k++)
		put(t->host, t->dt, k, k < n_elems ? f(t, k) : -1.0f);
	/* pageable source: the call returns once the bytes are staged, so host is free again */
	CUDA(cudaMemcpyAsync(dev, t->host, poison_to * t->esz, cudaMemcpyHostToDevice, cs));
}

static void run_started(Case *t, cudaStream_t cs)
{
	PxError err = {0};
	size_t nc = (size_t)t->n * C, part = C * t->esz;
	char *ar;
	CUDA(cudaMalloc((void **)&ar, part));
	comm_set_stream(t->c, cs);
	fill_on(t, cs, t->dev_a, 0, nc, mine); /* all_gather in place: own block, poison around */
	fill_on(t, cs, t->dev_a + t->r * part, C, C, mine);
	fill_on(t, cs, t->dev_b, nc, nc, mine); /* reduce_scatter in place */
	fill_on(t, cs, ar, C, C, mine);         /* all_reduce in place */
	comm_counters_reset(t->c);
	CommRequest *q[3] = {NULL, NULL, NULL};
	CALL(comm_all_gather_start(t->c, t->dev_a + t->r * part, t->dev_a, C, t->dt, &q[0], &err));
	CALL(comm_reduce_scatter_start(t->c, t->dev_b, t->dev_b + t->r * part, C, t->dt, COMM_SUM,
				       &q[1], &err));
	CALL(comm_all_reduce_start(t->c, ar, ar, C, t->dt, COMM_SUM, &q[2], &err));
	CHECK(comm_in_flight(t->c) == 3, "started on %s: %d in flight, expected 3", t->group,
	      comm_in_flight(t->c));
	CHECK(comm_counters(t->c)->calls[COLL_ALL_GATHER][comm_tag(t->c)] == 0,
	      "started on %s: counted before its wait", t->group);
	for (int i = 2; i >= 0; i--)
		CALL(comm_wait(q[i], &err));
	/* read back on the compute stream, then let the host see it */
	char *out = malloc(nc * t->esz + part);
	if (!out) {
		CHECK(0, "out of memory");
		CUDA(cudaFree(ar));
		return;
	}
	CUDA(cudaMemcpyAsync(out, t->dev_a, nc * t->esz, cudaMemcpyDeviceToHost, cs));
	CUDA(cudaMemcpyAsync(out + nc * t->esz, ar, part, cudaMemcpyDeviceToHost, cs));
	CUDA(cudaStreamSynchronize(cs));
	CALL(comm_sync(t->c, &err));
	CHECK(comm_in_flight(t->c) == 0, "started: %d still in flight", comm_in_flight(t->c));
	CHECK(comm_counters(t->c)->calls[COLL_ALL_GATHER][comm_tag(t->c)] == 1 &&
		      comm_counters(t->c)->calls[COLL_REDUCE_SCATTER][comm_tag(t->c)] == 1 &&
		      comm_counters(t->c)->calls[COLL_ALL_REDUCE][comm_tag(t->c)] == 1,
	      "started on %s: each call not counted once", t->group);
	size_t k = 0;
	while (k < nc && get(out, t->dt, k) == gathered(t, k))
		k++;
	CHECK(k == nc, "started all_gather %s on %s: element %zu wrong", comm_dtype_name(t->dt),
	      t->group, k);
	for (k = 0; k < C && get(out + nc * t->esz, t->dt, k) == summed(t, k);)
		k++;
	CHECK(k == C, "started all_reduce %s on %s: element %zu wrong", comm_dtype_name(t->dt),
	      t->group, k);
	free(out);
	EXPECT(t, "started reduce_scatter", t->dev_b + t->r * part, C, summed_block);
	comm_set_stream(t->c, NULL);
	CUDA(cudaFree(ar));
}

static void run_case(Comm *c, const char *group, CommDtype dt, char *dev_a, char *dev_b,
		     char *host)
{
	Case t = {.c = c, .group = group, .dt = dt, .r = comm_rank(c), .n = comm_size(c),
		  .esz = comm_dtype_bytes(dt), .dev_a = dev_a, .dev_b = dev_b, .host = host};
	t.m = check_modulus(dt, t.n);
	run_gathers(&t);
	run_reductions(&t);
	run_exchanges(&t);
}

/* ---- counters: one fp32 case on the world, every call's bytes by hand ---- */

static void check_counters(Comm *w)
{
	const CommCounters *k = comm_counters(w);
	int n = comm_size(w), T = COMM_TAG_WORLD;
	int64_t whole = (int64_t)n * C * 4, one = (int64_t)C * 4;
	int p2p = n % 2 == 0;
	struct {
		int kind;
		long long calls;
		int64_t payload;
	} want[] = {
		{COLL_ALL_GATHER, 2, 2 * whole},    {COLL_REDUCE_SCATTER, 2, 2 * whole},
		{COLL_ALL_REDUCE, 3, 3 * one},      {COMM_KIND_REDUCE, 1, one},
		{COLL_BROADCAST, 2, 2 * one},       {COLL_ALL_TO_ALL, 2, 2 * whole},
		{COLL_P2P, p2p, p2p * one},         {COLL_P2P_RECV, p2p, p2p * one},
		{COMM_KIND_BARRIER, 1, 0},
	};
	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
		CHECK(k->calls[want[i].kind][T] == want[i].calls &&
			      k->payload_bytes[want[i].kind][T] == want[i].payload,
		      "counters of %s: %lld calls, %lld bytes; expected %lld, %lld",
		      comm_kind_name(want[i].kind), k->calls[want[i].kind][T],
		      (long long)k->payload_bytes[want[i].kind][T], want[i].calls,
		      (long long)want[i].payload);
}

/* ---- one large all-reduce: many chunks, and the memory peak ---- */

static void run_big(Comm *w, GpuMem *g)
{
	PxError err = {0};
	float *dev, *host = malloc((size_t)BIG * sizeof(float));
	int n = comm_size(w), r = comm_rank(w), m = check_modulus(COMM_FP32, n);
	if (!host) {
		CHECK(0, "out of memory");
		return;
	}
	CUDA(cudaMalloc((void **)&dev, (size_t)BIG * sizeof(float)));
	for (size_t k = 0; k < BIG; k++)
		host[k] = val(r, k, m);
	CUDA(cudaMemcpy(dev, host, (size_t)BIG * sizeof(float), cudaMemcpyHostToDevice));
	gpumem_sample(g);
	CALL(comm_all_reduce(w, dev, dev, BIG, COMM_FP32, COMM_SUM, &err));
	CUDA(cudaMemcpy(host, dev, (size_t)BIG * sizeof(float), cudaMemcpyDeviceToHost));
	size_t k = 0;
	float s = (float)(n * (n + 1) / 2);
	while (k < BIG && host[k] == s * (float)(k % (size_t)m + 1))
		k++;
	CHECK(k == BIG, "all_reduce of %d fp32 elements: element %zu is %g", BIG, k,
	      k < BIG ? (double)host[k] : 0.0);
	CUDA(cudaFree(dev));
	free(host);
}

/* ---- fault: rank 1 stalls past the others' 2 s deadline ---- */

static int run_fault(const CommBackend *be)
{
	PxError err = {0};
	CommConfig cfg;
	comm_config_init(&cfg);
	cfg.deadline_s = 2;
	Comm *w;
	if (comm_init(be, &cfg, &w, &err)) {
		fprintf(stderr, "%s\n", err.msg);
		return 2;
	}
	float *dev;
	CUDA(cudaMalloc((void **)&dev, 64 * sizeof(float)));
	if (comm_size(w) < 2 || comm_size(w) > 16) {
		fprintf(stderr, "comm_nccl_check: --fault needs 2-16 ranks\n");
		return 2;
	}
	if (comm_rank(w) == 1)
		sleep(30);
	comm_all_gather(w, dev, dev, 4, COMM_FP32, &err);
	fprintf(stderr, "rank %d: comm_nccl_check --fault hang: the job was not stopped (%s)\n",
		check_rank, err.msg);
	return 1;
}

/* ---- main ---- */

static void usage(FILE *f)
{
	fprintf(f, "usage: mpirun -np N comm_nccl_check [--backend nccl|staged] [--fault hang]\n"
		   "  checks every collective of exec/comm.h on device buffers; staged: many ranks\n"
		   "  on one GPU through the MPI backend; --fault hang: rank 1 stalls past a 2 s\n"
		   "  deadline before an all_gather\n");
}

/* The device this rank's backend will take (comm_nccl.c's and comm_mpi_staged_cuda.c's rule),
 * for the memory readings taken before the backend starts. */
static int my_device(const CommEnv *env)
{
	int n = 0;
	if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1)
		return 0;
	return n == 1 ? 0 : env->local_rank % n;
}

static int run_all(const CommBackend *be, const CommEnv *env)
{
	GpuMem g;
	gpumem_init(&g, my_device(env), NULL);
	gpumem_snapshot(&g, "start-up");
	gpumem_context(&g);
	PxError err = {0};
	CommConfig cfg;
	comm_config_init(&cfg);
	cfg.deadline_s = 60;
	Comm *w, *half = NULL;
	if (comm_init(be, &cfg, &w, &err)) {
		fprintf(stderr, "%s\n", err.msg);
		gpumem_free(&g);
		return 2;
	}
	gpumem_snapshot(&g, be == &comm_nccl_backend ? "nccl" : "mpi");
	int r = comm_rank(w), n = comm_size(w);
	if (r == 0)
		printf("# comm_nccl_check: %d ranks (launcher %s), backend %s, %d elements per rank\n",
		       n, comm_env(w)->launcher, be->name, C);
	/* half: even and odd ranks, two groups of about n/2 */
	CALL(comm_split(w, r % 2, r, GROUP_DP, &half, &err));
	size_t bytes = (size_t)n * C * sizeof(float);
	char *dev_a, *dev_b, *host = malloc(bytes);
	CUDA(cudaMalloc((void **)&dev_a, bytes));
	CUDA(cudaMalloc((void **)&dev_b, bytes));
	comm_counters_reset(w);
	run_case(w, "world", COMM_FP32, dev_a, dev_b, host);
	check_counters(w);
	/* the types collectives reduce (INT8, ZeRO++'s, is moved only: comm_mpi_check's run_int8) */
	for (CommDtype dt = 0; dt < COMM_INT8; dt++) {
		if (dt != COMM_FP32)
			run_case(w, "world", dt, dev_a, dev_b, host);
		if (half)
			run_case(half, "dp", dt, dev_a, dev_b, host);
	}
	cudaStream_t cs; /* the compute stream that started collectives order against */
	CUDA(cudaStreamCreate(&cs));
	for (CommDtype dt = 0; dt < COMM_INT8; dt++) {
		Comm *on[2] = {w, half};
		for (int i = 0; i < 2 && on[i]; i++) {
			Case t = {.c = on[i], .group = i ? "dp" : "world", .dt = dt,
				  .r = comm_rank(on[i]), .n = comm_size(on[i]),
				  .esz = comm_dtype_bytes(dt), .dev_a = dev_a, .dev_b = dev_b,
				  .host = host};
			t.m = check_modulus(dt, t.n);
			run_started(&t, cs);
		}
	}
	CUDA(cudaStreamDestroy(cs));
	run_big(w, &g);
	gpumem_sample(&g);
	CUDA(cudaFree(dev_a));
	CUDA(cudaFree(dev_b));
	free(host);
	comm_destroy(half);
	if (r == 0)
		gpumem_print(&g, stdout);
	gpumem_free(&g);
	if (comm_finalize(w, &err)) {
		fprintf(stderr, "rank %d: %s\n", r, err.msg);
		check_failed++;
	}
	printf("comm_nccl_check: rank %d (device %d, backend %s): %d passed, %d failed\n", r,
	       g.device, be->name, check_passed, check_failed);
	return check_failed ? 1 : 0;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{"backend", required_argument, NULL, 'b'},
		{"fault", required_argument, NULL, 'f'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	const CommBackend *be = &comm_nccl_backend;
	int fault = 0;
	for (int o; (o = getopt_long(argc, argv, "h", opts, NULL)) != -1;) {
		if (o == 'b' && !strcmp(optarg, "nccl")) {
			be = &comm_nccl_backend;
		} else if (o == 'b' && !strcmp(optarg, "staged")) {
			be = &comm_mpi_staged_backend;
		} else if (o == 'f' && !strcmp(optarg, "hang")) {
			fault = 1;
		} else {
			usage(o == 'h' ? stdout : stderr);
			return o == 'h' ? 0 : 2;
		}
	}
	CommEnv env;
	comm_env_probe(&env);
	check_rank = env.rank;
	char why[GPUMEM_WHY_BYTES];
	if (gpumem_device_count(why, sizeof(why)) == 0) {
		if (check_rank == 0)
			printf("comm_nccl_check: skipped: no CUDA device (%s)\n", why);
		return 0;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	return fault ? run_fault(be) : run_all(be, &env);
}

/* comm_mpi_coll: the MPI backend's collectives, run by this file as ring, pairwise and chain
 * algorithms over MPI point to point (MPI_Isend/MPI_Irecv), with the local reductions they apply
 * (fp16 and bf16 summed in fp32, rounded to nearest even) and the count of the bytes every message
 * carried. MPI's start, splits, comm_send/comm_recv and the backend's table are comm_mpi.c's.
 *
 * Why the backend runs its own algorithms: the executor's measured communication must be what the
 * transport moved, counted, never sim/traffic's wire formula applied to the issued count. Open MPI
 * can count inside its own collectives only through its software performance counters (SPC:
 * OMPI_SPC_BYTES_SENT_USER, _MPI, OMPI_SPC_BYTES_RECEIVED_*, read as MPI_T performance variables,
 * switched on with the MCA parameter mpi_spc_attach=all), and only in a build configured with
 * --enable-spc (SPC_ENABLE; ompi/runtime/ompi_spc.c compiles the counters out otherwise). Debian's
 * Open MPI 4.1.4 is not: ompi_info lists mpi_spc_attach and mpi_spc_dump_enabled, but its configure
 * line has no --enable-spc, MPI_T lists 33 performance variables (mpool_hugepage_*, osc_rdma_*,
 * pml_ob1_*queue lengths) and no runtime_spc_* one with mpi_spc_attach=all, and
 * mpi_spc_dump_enabled=true prints nothing at MPI_Finalize. A PMPI wrapper cannot see inside
 * MPI_Allreduce either (Open MPI's collectives call its PML directly, not MPI_Send). So each
 * collective here is a sequence of point-to-point steps, and every message goes through one place
 * (post_step) that records its size; a step's bytes are credited once MPI completed it: a send's
 * as posted, a receive's as MPI's status reports them (MPI_Get_count, which also refuses a message
 * of another length). Nothing here knows sim/traffic's formula; the tests derive each algorithm's
 * bytes by hand (tests/comm_mpi_check.c --bytes). A PMPI layer would count the same calls; doing it
 * here attributes each message to its collective without interposing on MPI's symbols.
 *
 * The algorithms (n ranks, r this one, chunks and blocks as below; rank r sends):
 *   all_gather      ring, n-1 steps, a block each:                 (n-1) x block
 *   reduce_scatter  ring, n-1 steps, a partial sum of a block each: (n-1) x block
 *   all_reduce      ring reduce-scatter then ring all-gather over n chunks of the array (sizes
 *                   count/n, the first count mod n one larger): every chunk but r's, then every
 *                   chunk but r+1's: 2 x count - chunk r - chunk (r+1) mod n elements. Only when n
 *                   divides count is that 2(n-1)/n of the array on every rank; a 1-element
 *                   all-reduce over 4 ranks sends 0+1, 1+1, 1+1 and 1+0 elements on ranks 0-3.
 *   all_to_all      pairwise, n steps (partner (s - r) mod n; itself once): (n-1) x block
 *   broadcast       chain root, root+1, ... in segments of 256 KiB: the whole array, except the
 *                   chain's last rank, which sends nothing
 *   reduce          the same chain run backwards: the whole array, except the root
 * Against Open MPI's own collectives (coll/tuned) on the 2-core development machine, 2 and 4 ranks
 * oversubscribed, under other jobs' load: from 1 MiB up neither wins consistently (either was up
 * to 2x faster from run to run); below 64 KiB the ring's 2(n-1) latency-bound steps cost 1.5-3x
 * MPI's recursive doubling (4 ranks, one float: 11 us against 4 us for the bare algorithms). The
 * executor's small messages are its one-value all-reduces, one or two a step, so MPI's own
 * collectives, which could not be counted, are not kept. */
#include "comm_mpi_int.h"

#include <stdlib.h>
#include <string.h>

/* ---- 16-bit floats ----
 * Sums are formed in fp32 and rounded once to nearest even. That is the correctly rounded sum of
 * the two 16-bit inputs: fp32's 24 bits are at least 2p + 2 for p = 11 (fp16) and p = 8 (bf16),
 * so rounding twice cannot go wrong (Figueroa, "When is double rounding innocuous?", 1995). */

static float bits_to_f32(uint32_t b)
{
	float f;
	memcpy(&f, &b, sizeof(f));
	return f;
}

static uint32_t f32_to_bits(float f)
{
	uint32_t b;
	memcpy(&b, &f, sizeof(b));
	return b;
}

static float bf16_to_f32(uint16_t h)
{
	return bits_to_f32((uint32_t)h << 16);
}

static uint16_t f32_to_bf16(float f)
{
	uint32_t b = f32_to_bits(f);
	if ((b & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((b >> 16) | 0x40); /* a NaN stays a (quiet) NaN */
	/* adding just under half a unit, plus the kept part's lowest bit, rounds ties to even;
	 * a carry into the exponent is the right answer, up to infinity */
	b += 0x7fffu + ((b >> 16) & 1);
	return (uint16_t)(b >> 16);
}

static float fp16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000) << 16;
	uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff;
	if (exp == 0x1f)
		return bits_to_f32(sign | 0x7f800000u | (man << 13));
	if (exp == 0) {
		/* subnormal or zero: man x 2^-24, exact in fp32 */
		float v = (float)man * (1.0f / 16777216.0f);
		return sign ? -v : v;
	}
	return bits_to_f32(sign | ((exp + 127 - 15) << 23) | (man << 13));
}

/* Round the low `drop` bits of m away, to nearest with ties to even. */
static uint32_t round_shift(uint32_t m, int drop)
{
	uint32_t kept = m >> drop, rest = m & ((1u << drop) - 1), half = 1u << (drop - 1);
	return kept + (rest > half || (rest == half && (kept & 1)));
}

static uint16_t f32_to_fp16(float f)
{
	uint32_t b = f32_to_bits(f);
	uint16_t sign = (uint16_t)((b >> 16) & 0x8000);
	uint32_t a = b & 0x7fffffffu;
	if (a > 0x7f800000u)
		return sign | 0x7e00; /* NaN */
	if (a >= 0x477ff000u)
		return sign | 0x7c00; /* 65520 and up round past 65504, the largest half */
	if (a >= 0x38800000u) {
		/* normal (2^-14 and up): rebias the exponent; a mantissa carry moves it up one */
		uint32_t e = (a >> 23) - 127 + 15;
		return sign | (uint16_t)((e << 10) + round_shift(a & 0x7fffffu, 13));
	}
	if (a <= 0x33000000u)
		return sign; /* 2^-25 and below round to zero (2^-25 is the tie: zero is even) */
	/* subnormal: count units of 2^-24; rounding up from 0x3ff gives 0x400, the smallest normal */
	uint32_t m = (a & 0x7fffffu) | 0x800000u;
	return sign | (uint16_t)round_shift(m, 126 - (int)(a >> 23));
}

/* ---- local reductions: out[i] = a[i] op b[i]; out may be a or b ---- */

#define HALF_REDUCE(name, to_f32, from_f32, combine)                                      \
	static void name(void *out, const void *a, const void *b, size_t n)               \
	{                                                                                  \
		const uint16_t *pa = a, *pb = b;                                           \
		uint16_t *po = out;                                                        \
		for (size_t i = 0; i < n; i++) {                                           \
			float x = to_f32(pa[i]), y = to_f32(pb[i]);                        \
			po[i] = from_f32(combine);                                         \
		}                                                                          \
	}
HALF_REDUCE(fp16_sum, fp16_to_f32, f32_to_fp16, x + y)
HALF_REDUCE(bf16_sum, bf16_to_f32, f32_to_bf16, x + y)
/* max is exact: one of the two inputs, converted back unchanged */
HALF_REDUCE(fp16_max, fp16_to_f32, f32_to_fp16, x > y ? x : y)
HALF_REDUCE(bf16_max, bf16_to_f32, f32_to_bf16, x > y ? x : y)

/* fp32 and int64: computed in their own type */
#define PLAIN_REDUCE(name, type, combine)                                                 \
	static void name(void *out, const void *a, const void *b, size_t n)               \
	{                                                                                  \
		const type *pa = a, *pb = b;                                               \
		type *po = out;                                                            \
		for (size_t i = 0; i < n; i++) {                                           \
			type x = pa[i], y = pb[i];                                         \
			po[i] = combine;                                                   \
		}                                                                          \
	}
PLAIN_REDUCE(fp32_sum, float, x + y)
PLAIN_REDUCE(fp32_max, float, x > y ? x : y)
PLAIN_REDUCE(int64_sum, int64_t, x + y)
PLAIN_REDUCE(int64_max, int64_t, x > y ? x : y)

typedef void (*ReduceFn)(void *out, const void *a, const void *b, size_t n);
static const ReduceFn REDUCE[N_COMM_DTYPES][N_COMM_REDOPS] = {
	[COMM_FP32] = {fp32_sum, fp32_max},
	[COMM_FP16] = {fp16_sum, fp16_max},
	[COMM_BF16] = {bf16_sum, bf16_max},
	[COMM_INT64] = {int64_sum, int64_max},
};

/* ---- scratch ---- */

/* A buffer of at least bytes (NULL when out of memory), for scratch_put with *slot: the smallest
 * free slot that holds it, else the largest free one grown, else (every slot busy: more
 * collectives under way than slots) one of its own. */
static void *scratch_get(MpiWorld *w, size_t bytes, int *slot)
{
	int fit = -1, big = -1;
	for (int i = 0; i < MPI_SCRATCH_SLOTS; i++) {
		const MpiScratch *s = &w->scratch[i];
		if (s->busy)
			continue;
		if (s->bytes >= bytes && (fit < 0 || s->bytes < w->scratch[fit].bytes))
			fit = i;
		if (big < 0 || s->bytes > w->scratch[big].bytes)
			big = i;
	}
	*slot = fit >= 0 ? fit : big;
	if (*slot < 0)
		return malloc(bytes);
	MpiScratch *s = &w->scratch[*slot];
	if (s->bytes < bytes) {
		void *b = realloc(s->buf, bytes);
		if (!b)
			return NULL;
		s->buf = b;
		s->bytes = bytes;
	}
	s->busy = 1;
	return s->buf;
}

static void scratch_put(MpiWorld *w, void *buf, int slot)
{
	if (slot < 0)
		free(buf);
	else
		w->scratch[slot].busy = 0;
}

void mpi_scratch_release(MpiWorld *w)
{
	for (int i = 0; i < MPI_SCRATCH_SLOTS; i++) {
		free(w->scratch[i].buf);
		w->scratch[i] = (MpiScratch){0};
	}
}

/* ---- one step of an algorithm ----
 * Before posting, an optional local copy; then at most one receive and one send, concurrent;
 * once both completed, an optional reduction out = a op b. Counts are elements of the call's
 * type; a side with no elements is not posted (both ends of a message agree on its size). */
typedef struct Step {
	void *copy_to;
	const void *copy_from;
	size_t copy_elems;
	void *recv;
	size_t recv_elems;
	int from;
	const void *send;
	size_t send_elems;
	int to;
	void *out;
	const void *a, *b;
	size_t red_elems;
} Step;

struct MpiColl {
	MpiComm *m;
	int kind;        /* COLL_ALL_GATHER, ... or COMM_KIND_REDUCE */
	const char *send;
	char *recv;
	size_t count;    /* as the call's */
	CommDtype dt;
	CommRedOp op;
	int root;
	size_t esz;      /* bytes per element, as MPI sizes the type */
	int tag;
	int step, n_steps, posted;
	int pos;         /* chain algorithms: place after the root, (rank - root) mod n */
	size_t seg_elems;
	char *scratch;
	int scratch_slot;
	size_t send_bytes; /* the posted send's */
	Step cur;
	MPI_Request rq[2]; /* [0] the receive, [1] the send */
	int64_t sent, recvd;
	int done, failed;
	MpiColl *next;    /* in MpiWorld.active */
};

static int mod(int x, int n)
{
	return ((x % n) + n) % n;
}

/* base + elems elements; NULL stays NULL (an empty call's buffers may be NULL) */
static char *at(const void *base, size_t elems, size_t esz)
{
	return base ? (char *)(uintptr_t)base + elems * esz : NULL;
}

/* all_reduce's chunk j of the array: count/n elements, the first count mod n one more. */
static void chunk(const MpiColl *q, int j, size_t *off, size_t *len)
{
	size_t n = (size_t)q->m->size, base = q->count / n, extra = q->count % n, uj = (size_t)j;
	*len = base + (uj < extra);
	*off = uj * base + (uj < extra ? uj : extra);
}

/* ---- the algorithms: steps and each step's messages ---- */

static int steps_ring(const MpiColl *q)
{
	return q->m->size - 1;
}

/* Block mod(r - s) goes right, block mod(r - s - 1) comes from the left, into recv. */
static void plan_all_gather(const MpiColl *q, int s, Step *st)
{
	int r = q->m->rank, n = q->m->size;
	size_t c = q->count;
	st->send = at(q->recv, (size_t)mod(r - s, n) * c, q->esz);
	st->send_elems = c;
	st->to = mod(r + 1, n);
	st->recv = at(q->recv, (size_t)mod(r - s - 1, n) * c, q->esz);
	st->recv_elems = c;
	st->from = mod(r - 1, n);
}

/* Step s sends the partial sum of block mod(r - 1 - s) (at s = 0 this rank's own block) and
 * receives that of block mod(r - 2 - s), adding this rank's block to it: at the last step block
 * r, summed over all ranks, into recv. Two scratch blocks alternate: one sent, one received. */
static void plan_reduce_scatter(const MpiColl *q, int s, Step *st)
{
	int r = q->m->rank, n = q->m->size;
	size_t c = q->count;
	char *in = at(q->scratch, (size_t)(s % 2) * c, q->esz);
	int j = mod(r - 2 - s, n);
	st->send = s == 0 ? at(q->send, (size_t)mod(r - 1, n) * c, q->esz)
			  : at(q->scratch, (size_t)((s - 1) % 2) * c, q->esz);
	st->send_elems = c;
	st->to = mod(r + 1, n);
	st->recv = in;
	st->recv_elems = c;
	st->from = mod(r - 1, n);
	st->out = s == n - 2 ? q->recv : in;
	st->a = in;
	st->b = at(q->send, (size_t)j * c, q->esz);
	st->red_elems = c;
}

static int steps_all_reduce(const MpiColl *q)
{
	return 2 * (q->m->size - 1);
}

/* In recv (send copied in at the start): steps 0..n-2 reduce-scatter the chunks (send chunk
 * mod(r - 1 - s), receive chunk mod(r - 2 - s) into scratch, add it in place), steps n-1..
 * all-gather them (send chunk mod(r - s'), receive chunk mod(r - 1 - s') into place). */
static void plan_all_reduce(const MpiColl *q, int s, Step *st)
{
	int r = q->m->rank, n = q->m->size;
	size_t so, sl, ro, rl;
	st->to = mod(r + 1, n);
	st->from = mod(r - 1, n);
	if (s < n - 1) {
		chunk(q, mod(r - 1 - s, n), &so, &sl);
		chunk(q, mod(r - 2 - s, n), &ro, &rl);
		st->recv = q->scratch;
		st->out = at(q->recv, ro, q->esz);
		st->a = q->scratch;
		st->b = st->out;
		st->red_elems = rl;
	} else {
		s -= n - 1;
		chunk(q, mod(r - s, n), &so, &sl);
		chunk(q, mod(r - 1 - s, n), &ro, &rl);
		st->recv = at(q->recv, ro, q->esz);
	}
	st->send = at(q->recv, so, q->esz);
	st->send_elems = sl;
	st->recv_elems = rl;
}

static int steps_all_to_all(const MpiColl *q)
{
	return q->m->size;
}

/* Step s pairs this rank with p = (s - r) mod n (p's partner is then r): block p of send goes to
 * p, p's block r comes into block p of recv. In place the outgoing block is copied to scratch
 * first, since the incoming one lands where it was. p = r: a copy, no message. */
static void plan_all_to_all(const MpiColl *q, int s, Step *st)
{
	int r = q->m->rank, n = q->m->size, p = mod(s - r, n);
	size_t c = q->count;
	char *mine = at(q->send, (size_t)p * c, q->esz), *into = at(q->recv, (size_t)p * c, q->esz);
	if (p == r) {
		st->copy_to = into;
		st->copy_from = mine;
		st->copy_elems = mine == into ? 0 : c;
		return;
	}
	if (q->send == q->recv) {
		st->copy_to = q->scratch;
		st->copy_from = mine;
		st->copy_elems = c;
		mine = q->scratch;
	}
	st->send = mine;
	st->send_elems = c;
	st->to = p;
	st->recv = into;
	st->recv_elems = c;
	st->from = p;
}

/* Segments of the chain algorithms. */
static size_t n_segs(const MpiColl *q)
{
	return (q->count + q->seg_elems - 1) / q->seg_elems;
}

static size_t seg_len(const MpiColl *q, size_t k)
{
	size_t left = q->count - k * q->seg_elems;
	return left < q->seg_elems ? left : q->seg_elems;
}

/* The root and the chain's last rank take one step a segment; a rank between them one more,
 * since it passes segment k - 1 on while segment k arrives. */
static int steps_chain(const MpiColl *q)
{
	int n = q->m->size;
	size_t segs = n_segs(q);
	if (n == 1 || segs == 0)
		return 0;
	return (int)segs + (q->pos > 0 && q->pos < n - 1);
}

/* Down the chain root, root + 1, ...: receive segment s from the previous rank (not the root),
 * send segment s - 1 on (s at the root) to the next (not the last). In recv throughout. */
static void plan_broadcast(const MpiColl *q, int s, Step *st)
{
	int r = q->m->rank, n = q->m->size;
	size_t segs = n_segs(q), k = (size_t)s;
	if (q->pos > 0 && k < segs) {
		st->recv = at(q->recv, k * q->seg_elems, q->esz);
		st->recv_elems = seg_len(q, k);
		st->from = mod(r - 1, n);
	}
	size_t out = q->pos == 0 ? k : k - 1;
	if (q->pos < n - 1 && (q->pos == 0 || k >= 1)) {
		st->send = at(q->recv, out * q->seg_elems, q->esz);
		st->send_elems = seg_len(q, out);
		st->to = mod(r + 1, n);
	}
}

/* Up the chain root + n - 1, ..., root + 1, root: segment s of the partial sum comes from the
 * next rank (not at the chain's start) into scratch half s mod 2 and this rank's segment is
 * added to it (at the root into recv); segment s - 1 goes on to the previous rank (segment s
 * of send itself at the chain's start). */
static void plan_reduce(const MpiColl *q, int s, Step *st)
{
	int r = q->m->rank, n = q->m->size;
	size_t segs = n_segs(q), k = (size_t)s;
	int first = q->pos == n - 1;
	if (!first && k < segs) {
		char *in = at(q->scratch, (k % 2) * q->seg_elems, q->esz);
		st->recv = in;
		st->recv_elems = seg_len(q, k);
		st->from = mod(r + 1, n);
		st->out = q->pos == 0 ? at(q->recv, k * q->seg_elems, q->esz) : in;
		st->a = in;
		st->b = at(q->send, k * q->seg_elems, q->esz);
		st->red_elems = seg_len(q, k);
	}
	if (q->pos > 0 && (first || k >= 1)) {
		size_t out = first ? k : k - 1;
		st->send = first ? at(q->send, out * q->seg_elems, q->esz)
				 : at(q->scratch, (out % 2) * q->seg_elems, q->esz);
		st->send_elems = seg_len(q, out);
		st->to = mod(r - 1, n);
	}
}

/* What each kind needs: its steps, its scratch (bytes), each step's messages. */
typedef struct Algo {
	const char *name;
	int (*steps)(const MpiColl *q);
	size_t (*scratch)(const MpiColl *q);
	void (*plan)(const MpiColl *q, int s, Step *st);
} Algo;

static size_t scratch_none(const MpiColl *q)
{
	(void)q;
	return 0;
}

static size_t scratch_two_blocks(const MpiColl *q)
{
	return q->m->size > 1 ? 2 * q->count * q->esz : 0;
}

static size_t scratch_chunk(const MpiColl *q)
{
	size_t off, len;
	chunk(q, 0, &off, &len); /* the largest */
	return q->m->size > 1 ? len * q->esz : 0;
}

static size_t scratch_in_place_block(const MpiColl *q)
{
	return q->send == q->recv && q->m->size > 1 ? q->count * q->esz : 0;
}

static size_t scratch_two_segs(const MpiColl *q)
{
	int n = q->m->size;
	size_t seg = q->count < q->seg_elems ? q->count : q->seg_elems;
	return n > 1 && q->pos < n - 1 ? 2 * seg * q->esz : 0;
}

/* A started send (comm_send_start): one step, one message to q->root on comm_send's tag, so that
 * the peer's comm_recv matches it. */
static int steps_one(const MpiColl *q)
{
	(void)q;
	return 1;
}

static void plan_send(const MpiColl *q, int s, Step *st)
{
	(void)s;
	st->send = q->send;
	st->send_elems = q->count;
	st->to = q->root;
}

static const Algo ALGOS[N_COMM_KINDS] = {
	[COLL_ALL_GATHER] = {"ring all_gather", steps_ring, scratch_none, plan_all_gather},
	[COLL_REDUCE_SCATTER] = {"ring reduce_scatter", steps_ring, scratch_two_blocks,
				 plan_reduce_scatter},
	[COLL_ALL_REDUCE] = {"ring all_reduce", steps_all_reduce, scratch_chunk, plan_all_reduce},
	[COLL_ALL_TO_ALL] = {"pairwise all_to_all", steps_all_to_all, scratch_in_place_block,
			     plan_all_to_all},
	[COLL_BROADCAST] = {"chain broadcast", steps_chain, scratch_none, plan_broadcast},
	[COMM_KIND_REDUCE] = {"chain reduce", steps_chain, scratch_two_segs, plan_reduce},
	[COLL_P2P] = {"send", steps_one, scratch_none, plan_send},
};

/* The chain algorithms' segment: 256 KiB, long enough for the copy to dwarf a message's
 * latency, short enough that a 4-rank chain overlaps its hops on a few-MiB array. */
enum { SEG_BYTES = 256 << 10 };

/* ---- running the steps ---- */

/* Post step q->step: its copy, then its receive and its send. Every message of the backend is
 * posted here, and nowhere else. */
static int post_step(MpiColl *q, PxError *err)
{
	Step *st = &q->cur;
	*st = (Step){.from = -1, .to = -1};
	ALGOS[q->kind].plan(q, q->step, st);
	if (st->copy_elems && st->copy_to != st->copy_from)
		memmove(st->copy_to, st->copy_from, st->copy_elems * q->esz);
	MPI_Datatype t = mpi_type(q->dt);
	MPI_Comm comm = q->m->comm;
	int n;
	q->send_bytes = 0;
	if (st->recv_elems && st->from >= 0) {
		if ((n = mpi_count(st->recv_elems, "MPI_Irecv", err)) < 0 ||
		    mpi_check(MPI_Irecv(st->recv, n, t, st->from, q->tag, comm, &q->rq[0]),
			      "MPI_Irecv", err))
			return -1;
	}
	if (st->send_elems && st->to >= 0) {
		if ((n = mpi_count(st->send_elems, "MPI_Isend", err)) < 0 ||
		    mpi_check(MPI_Isend(st->send, n, t, st->to, q->tag, comm, &q->rq[1]),
			      "MPI_Isend", err))
			return -1;
		q->send_bytes = st->send_elems * q->esz;
	}
	q->posted = 1;
	return 0;
}

/* Request i of q completed with status: credit its bytes; a receive of another length than the
 * step expects is an error (ranks that disagree about the call). */
static int complete_one(MpiColl *q, int i, MPI_Status *status, PxError *err)
{
	q->rq[i] = MPI_REQUEST_NULL;
	if (i == 1) {
		q->sent += (int64_t)q->send_bytes;
		return 0;
	}
	int got = 0;
	if (mpi_check(MPI_Get_count(status, mpi_type(q->dt), &got), "MPI_Get_count", err))
		return -1;
	if (got < 0 || (size_t)got != q->cur.recv_elems)
		return px_fail(err, PX_ERR_RUNTIME,
			       "MPI_Irecv: %s expected %zu elements from rank %d, got %d",
			       ALGOS[q->kind].name, q->cur.recv_elems, q->cur.from, got);
	q->recvd += (int64_t)got * (int64_t)q->esz;
	return 0;
}

/* Run q's steps while nothing is in flight: reduce after the step that completed, post the
 * next (some have no messages: a copy, a skipped empty chunk), until a message is in flight or
 * the last step is done. */
static int advance(MpiColl *q, PxError *err)
{
	while (!q->done && q->rq[0] == MPI_REQUEST_NULL && q->rq[1] == MPI_REQUEST_NULL) {
		if (q->posted) {
			const Step *st = &q->cur;
			if (st->red_elems)
				REDUCE[q->dt][q->op](st->out, st->a, st->b, st->red_elems);
			q->step++;
			q->posted = 0;
		}
		if (q->step == q->n_steps) {
			q->done = 1;
			break;
		}
		if (post_step(q, err)) {
			q->failed = 1;
			q->done = 1;
			return -1;
		}
	}
	return 0;
}

/* Progress every collective under way on this process, q's first (started collectives waited
 * in another order than their peers wait them must not hang): wait for any one message to
 * complete, then advance its collective. MPI itself progresses all the messages meanwhile. */
enum { MAX_WAITED = 64 };

static int waited_add(MpiColl *o, MPI_Request *rq, MpiColl **owner, int *which, int k)
{
	for (int i = 0; i < 2 && !o->done && k < MAX_WAITED; i++)
		if (o->rq[i] != MPI_REQUEST_NULL) {
			rq[k] = o->rq[i];
			owner[k] = o;
			which[k++] = i;
		}
	return k;
}

static int progress(MpiColl *q, PxError *err)
{
	MPI_Request rq[MAX_WAITED];
	MpiColl *owner[MAX_WAITED];
	int which[MAX_WAITED];
	int k = waited_add(q, rq, owner, which, 0);
	for (MpiColl *o = q->m->world->active; o; o = o->next)
		if (o != q)
			k = waited_add(o, rq, owner, which, k);
	if (k == 0)
		return advance(q, err);
	int idx = MPI_UNDEFINED;
	MPI_Status status;
	int rc = MPI_Waitany(k, rq, &idx, &status);
	if (rc != MPI_SUCCESS || idx == MPI_UNDEFINED) {
		if (idx != MPI_UNDEFINED) {
			owner[idx]->failed = 1;
			owner[idx]->done = 1;
		}
		return mpi_fail(rc != MPI_SUCCESS ? rc : MPI_ERR_REQUEST, "MPI_Waitany", err);
	}
	MpiColl *o = owner[idx];
	if (complete_one(o, which[idx], &status, err)) {
		o->failed = 1;
		o->done = 1;
		return -1;
	}
	return advance(o, err);
}

static void unlink_coll(MpiWorld *w, MpiColl *q)
{
	for (MpiColl **p = &w->active; *p; p = &(*p)->next)
		if (*p == q) {
			*p = q->next;
			return;
		}
}

/* The copy an algorithm starts from, before its first step: this rank's block into place
 * (all_gather), the array into recv (all_reduce, the broadcast's root), or, on one rank, the
 * whole call (reduce, reduce_scatter). all_to_all copies block by block in its steps. */
static void first_copy(const MpiColl *q)
{
	int n = q->m->size, k = q->kind;
	void *to = q->recv;
	if (k == COLL_ALL_GATHER)
		to = at(q->recv, (size_t)q->m->rank * q->count, q->esz);
	else if (!(k == COLL_ALL_REDUCE || (k == COLL_BROADCAST && q->pos == 0) ||
		   (n == 1 && (k == COMM_KIND_REDUCE || k == COLL_REDUCE_SCATTER))))
		return;
	if (q->count && to != q->send)
		memmove(to, q->send, q->count * q->esz);
}

/* Start q: number it, take its scratch, make its first copy, put it on w's list (until finish)
 * and post its first step. */
static int begin(MpiComm *m, MpiColl *q, PxError *err)
{
	MpiWorld *w = m->world;
	int size = 0;
	q->m = m;
	q->rq[0] = q->rq[1] = MPI_REQUEST_NULL;
	q->scratch_slot = -1;
	if (mpi_check(MPI_Type_size(mpi_type(q->dt), &size), "MPI_Type_size", err))
		return -1;
	q->esz = (size_t)size;
	q->pos = mod(m->rank - q->root, m->size);
	q->seg_elems = SEG_BYTES / q->esz;
	if (q->kind == COLL_P2P) { /* one rank's message: no number on the communicator */
		q->tag = MPI_P2P_TAG;
	} else {
		m->tag = m->tag % 32766 + 1; /* every rank numbers a communicator's collectives alike */
		q->tag = m->tag;
	}
	q->n_steps = ALGOS[q->kind].steps(q);
	size_t bytes = ALGOS[q->kind].scratch(q);
	if (bytes && !(q->scratch = scratch_get(w, bytes, &q->scratch_slot)))
		return px_fail(err, PX_ERR_RUNTIME, "mpi backend: out of memory (%zu bytes of "
			       "scratch for a %s)", bytes, ALGOS[q->kind].name);
	first_copy(q);
	q->next = w->active;
	w->active = q;
	return advance(q, err);
}

/* Take q off the list and give its scratch back; unless it failed, credit its bytes to the world
 * (comm.h's moved: a call counts once its caller has it back). Returns -1 when it failed. */
static int finish(MpiColl *q)
{
	MpiWorld *w = q->m->world;
	unlink_coll(w, q);
	if (q->scratch)
		scratch_put(w, q->scratch, q->scratch_slot);
	q->scratch = NULL;
	if (q->failed)
		return -1;
	w->sent_bytes += q->sent;
	w->recv_bytes += q->recvd;
	return 0;
}

/* Block until q is done, progressing every collective under way, and finish it. */
static int run_to_end(MpiColl *q, PxError *err)
{
	int rc = 0;
	while (!q->done && !rc)
		rc = progress(q, err);
	if (rc)
		q->failed = 1;
	if (!finish(q))
		return 0;
	/* q broke inside another call's progress, which reported why */
	return rc ? -1 : px_fail(err, PX_ERR_RUNTIME, "%s: failed during an earlier call",
				 ALGOS[q->kind].name);
}

/* Start q, or undo what its start did. */
static int start(void *h, MpiColl *q, PxError *err)
{
	if (!begin(h, q, err))
		return 0;
	q->failed = 1;
	finish(q);
	return -1;
}

/* ---- CommBackend's entries ---- */

int mpi_all_gather(void *h, const void *send, void *recv, size_t count, CommDtype dt,
		   PxError *err)
{
	MpiColl q = {.kind = COLL_ALL_GATHER, .send = send, .recv = recv, .count = count,
		     .dt = dt};
	return start(h, &q, err) ? -1 : run_to_end(&q, err);
}

/* NCCL's in place (recv is this rank's block of send) needs nothing special: block r of send is
 * read only by the last step, which writes the sum over it. */
int mpi_reduce_scatter(void *h, const void *send, void *recv, size_t count, CommDtype dt,
		       CommRedOp op, PxError *err)
{
	MpiColl q = {.kind = COLL_REDUCE_SCATTER, .send = send, .recv = recv, .count = count,
		     .dt = dt, .op = op};
	return start(h, &q, err) ? -1 : run_to_end(&q, err);
}

int mpi_all_reduce(void *h, const void *send, void *recv, size_t count, CommDtype dt,
		   CommRedOp op, PxError *err)
{
	MpiColl q = {.kind = COLL_ALL_REDUCE, .send = send, .recv = recv, .count = count,
		     .dt = dt, .op = op};
	return start(h, &q, err) ? -1 : run_to_end(&q, err);
}

int mpi_reduce(void *h, const void *send, void *recv, size_t count, CommDtype dt, CommRedOp op,
	       int root, PxError *err)
{
	MpiColl q = {.kind = COMM_KIND_REDUCE, .send = send, .recv = recv, .count = count,
		     .dt = dt, .op = op, .root = root};
	return start(h, &q, err) ? -1 : run_to_end(&q, err);
}

int mpi_broadcast(void *h, const void *send, void *recv, size_t count, CommDtype dt, int root,
		  PxError *err)
{
	MpiColl q = {.kind = COLL_BROADCAST, .send = send, .recv = recv, .count = count,
		     .dt = dt, .root = root};
	return start(h, &q, err) ? -1 : run_to_end(&q, err);
}

int mpi_all_to_all(void *h, const void *send, void *recv, size_t count, CommDtype dt,
		   PxError *err)
{
	MpiColl q = {.kind = COLL_ALL_TO_ALL, .send = send, .recv = recv, .count = count,
		     .dt = dt};
	return start(h, &q, err) ? -1 : run_to_end(&q, err);
}

/* ---- started collectives: the same algorithms, their steps progressed by later calls ----
 * The start posts the first step; each later wait (and blocking call) of this process
 * progresses every collective under way, so steps move on inside MPI calls, as Open MPI's own
 * non-blocking collectives do on the host. */

int mpi_start(void *h, const CommCall *k, void *stream, void **req, PxError *err)
{
	(void)stream; /* host memory: nothing queued anywhere to wait for */
	MpiColl *q = calloc(1, sizeof(*q));
	if (!q)
		return px_fail(err, PX_ERR_RUNTIME, "mpi backend: out of memory");
	*q = (MpiColl){.kind = k->kind, .send = k->send, .recv = k->recv, .count = k->count,
		       .dt = k->dt, .op = k->op};
	if (start(h, q, err)) {
		free(q);
		return -1;
	}
	*req = q;
	return 0;
}

int mpi_send_start(void *h, const void *buf, size_t count, CommDtype dt, int peer, void **req,
		   PxError *err)
{
	MpiColl *q = calloc(1, sizeof(*q));
	if (!q)
		return px_fail(err, PX_ERR_RUNTIME, "mpi backend: out of memory");
	*q = (MpiColl){.kind = COLL_P2P, .send = buf, .count = count, .dt = dt, .root = peer};
	if (start(h, q, err)) {
		free(q);
		return -1;
	}
	*req = q;
	return 0;
}

/* On the host the results are there only once the last step is: always blocks. */
int mpi_wait(void *req, void *stream, int *done, PxError *err)
{
	MpiColl *q = req;
	(void)stream;
	*done = 1;
	int rc = run_to_end(q, err);
	free(q);
	return rc;
}

/* Complete whatever of q's step has arrived, and advance it, without blocking. */
int mpi_test(void *req, int *done, PxError *err)
{
	MpiColl *q = req;
	int rc = 0, moved = 1;
	while (!q->done && moved && !rc) {
		moved = 0;
		for (int i = 0; i < 2 && !rc; i++) {
			int flag = 0;
			MPI_Status status;
			if (q->rq[i] == MPI_REQUEST_NULL)
				continue;
			rc = mpi_check(MPI_Test(&q->rq[i], &flag, &status), "MPI_Test", err);
			if (!rc && flag) {
				rc = complete_one(q, i, &status, err);
				moved = 1;
			}
		}
		if (!rc && moved)
			rc = advance(q, err);
	}
	if (rc)
		q->failed = q->done = 1;
	*done = q->done;
	if (!q->done)
		return 0;
	int bad = finish(q);
	free(q);
	return rc ? -1 : bad ? px_fail(err, PX_ERR_RUNTIME, "failed during an earlier call") : 0;
}

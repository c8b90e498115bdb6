/* Tensor-parallel kernels (kernels/gpt_tp_cpu): the shard layout against engine/model.c's split
 * flags and against index arithmetic written here; the sharded init against gpt_cpu's; the saved
 * activations against engine/activ.c; and t ranks run as t threads with an in-process
 * communicator against the unsplit units of kernels/gpt_cpu: a block, the embeddings with the
 * tied head, and a whole two-block model, with and without sequence parallelism.
 *
 * Tolerance of the split units against the unsplit ones (fp32, u = 2^-24). Splitting reorders
 * sums and nothing else: a row-split layer's product (K = C or 4C terms) becomes t partial GEMMs
 * added in rank order, a column-split layer's input gradient (K = 3C or 4C) likewise, and under
 * sequence parallelism the replicated tensors' gradients sum over rows in t pieces; every other
 * operation sees the same operands (the gathers and the sum with zeros of the vocabulary-parallel
 * embedding are exact). Two fp32 sums of the same K terms in different orders differ by at most
 * 2 gamma_K sum |terms|, gamma_K = K u / (1 - K u) (Higham, Accuracy and Stability of Numerical
 * Algorithms, section 3.1): with K <= 128 here that is 1.5e-5 of sum |terms|. Sums of random
 * signed terms keep sum |terms| within a few sqrt(K) of max |result| of a tensor, and the chain
 * (layer norm, attention, GELU, the next product) passes a perturbation on at condition O(1)
 * for these O(1) inputs, so each compared tensor is held to
 *   max |got - want| <= TP_TOL * max |want|,  TP_TOL = 1e-4,
 * the bound with room for the chain (measured: about 1e-6). A wrong shard, head or offset moves
 * a tensor by O(1) of its scale. Where nothing is reordered the test asks for equality bit for
 * bit: every unit at t = 1 (the row-split bias goes into rank 0's partial product, so t = 1 runs
 * gpt_cpu's operations in gpt_cpu's order; the head's sum of exponentials is the exception, see
 * test_ends) and the embeddings' output at every t. The loss: the
 * reference's sum of exponentials is a double, the split one rounds each rank's double to fp32
 * and adds t of them in fp32, (t + 1) u relative, which moves log(sum) by as much absolutely;
 * held to 8 (t + 1) u + 2 u |loss| (a few logits' ulps on top). */
#include <CUnit/CUnit.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/activ.h"
#include "../engine/model.h"
#include "../engine/schedule.h"
#include "../kernels/gpt16_cpu.h"
#include "../kernels/gpt_cpu.h"
#include "../kernels/gpt_tp_cpu.h"
#include "../kernels/ops16_cpu.h"
#include "../kernels/rng.h"
#include "fixtures.h"
#include "suites.h"

#define TP_TOL 1e-4
#define MAX_T 4
#define U 0x1p-24

/* The model of these tests: V = 64, C = 32, NH = 4 (so t = 1, 2, 4 hold whole heads), 16
 * positions; B = 2 sequences of T = 8 tokens, N = 16 rows (t divides them under sp). */
static const GptConfig CFG = {.V = 64, .max_T = 16, .C = 32, .L = 2, .NH = 4};
enum { B = 2, T = 8, N = B * T };

/* ---- helpers ---- */

static float *alloc_floats(size_t n)
{
	float *x = calloc(n ? n : 1, sizeof(float));
	CU_ASSERT_PTR_NOT_NULL_FATAL(x);
	return x;
}

/* in a rank's thread, where CUnit may not be called */
static float *rank_alloc(size_t bytes)
{
	float *x = calloc(bytes ? bytes : 1, 1);
	if (!x) {
		fprintf(stderr, "test_tp_kernels: out of memory\n");
		abort();
	}
	return x;
}

static void fill_random(float *x, size_t n, float std, uint64_t seed)
{
	PxRng r;
	rng_init(&r, seed, 0);
	for (size_t i = 0; i < n; i++)
		x[i] = (float)(std * rng_normal(&r));
}

static void random_tokens(int *t, size_t n, int V, uint64_t seed)
{
	PxRng r;
	rng_init(&r, seed, 0);
	for (size_t i = 0; i < n; i++)
		t[i] = (int)(rng_next_u64(&r) % (uint64_t)V);
}

/* max |got - want| / max |want|, reported by name when above tol (or not bit for bit, tol 0) */
static int close_to(const char *what, int t, int sp, const float *got, const float *want,
		    size_t n, double tol)
{
	double err = 0, scale = 0;
	for (size_t i = 0; i < n; i++) {
		double d = fabs((double)got[i] - want[i]);
		err = d > err ? d : err;
		scale = fabs(want[i]) > scale ? fabs(want[i]) : scale;
	}
	int ok = tol == 0 ? !memcmp(got, want, n * sizeof(float)) : err <= tol * scale;
	if (!ok)
		fprintf(stderr, "\n%s at t = %d, sp = %d: max error %.3g of max %.3g (%s)", what, t,
			sp, err, scale, tol == 0 ? "wanted bit for bit" : "over tolerance");
	CU_ASSERT(ok);
	return ok;
}

/* GPT-2 as the engine reads its config.json, without dropout (the kernels have none). */
static int engine_gpt2(const GptConfig *c, ModelSpec *m)
{
	return fx_modelf(m, "{\"model_type\": \"gpt2\", \"n_embd\": %d, \"n_layer\": %d, "
			 "\"n_head\": %d, \"vocab_size\": %d, \"n_positions\": %d, "
			 "\"attn_pdrop\": 0, \"resid_pdrop\": 0, \"embd_pdrop\": 0}",
			 c->C, c->L, c->NH, c->V, c->max_T);
}

/* ---- an in-process group: t threads, sums in rank order ---- */

typedef struct SimGroup {
	int t;
	pthread_barrier_t bar;
	const void *in[MAX_T];
} SimGroup;

enum { K_SUM, K_MAX, K_GATHER, K_SCATTER, N_KINDS };

typedef struct SimRank {
	SimGroup *g;
	int r;
	long calls[N_KINDS];
	size_t elems[N_KINDS]; /* as the callback is given n */
	int unit, bwd;         /* what the rank runs now (set by the whole-model test) */
	size_t payload[8][2];  /* by unit and direction: elements of the whole buffer (t n for a
				  gather or a scatter), as a schedule's collective states them */
	size_t bytes[8][2];    /* the same in bytes, at the type each call moved */
} SimRank;

static void count(SimRank *s, int kind, size_t n, PrecisionType dt)
{
	size_t whole = kind == K_GATHER || kind == K_SCATTER ? n * s->g->t : n;
	s->calls[kind]++;
	s->elems[kind] += n;
	s->payload[s->unit][s->bwd] += whole;
	s->bytes[s->unit][s->bwd] += whole * precision_bytes(dt);
}

/* element i summed (or maxed) over the ranks' bufs from rank 0 up, each partial result rounded to
 * dt as a reduction in dt stores it (exact in fp32: the fp32 sum itself) */
static float reduce_at(const SimGroup *g, const void *const *bufs, size_t i, PrecisionType dt,
		       GptTpOp op)
{
	float v = precision_load(bufs[0], i, dt);
	for (int k = 1; k < g->t; k++) {
		float x = precision_load(bufs[k], i, dt);
		v = precision_round(op == GPT_TP_SUM ? v + x : fmaxf(v, x), dt);
	}
	return v;
}

static void sim_all_reduce(void *ctx, void *buf, size_t n, PrecisionType dt, GptTpOp op)
{
	SimRank *s = ctx;
	SimGroup *g = s->g;
	float *sum = rank_alloc(n * sizeof(float));
	g->in[s->r] = buf;
	pthread_barrier_wait(&g->bar);
	for (size_t i = 0; i < n; i++)
		sum[i] = reduce_at(g, g->in, i, dt, op);
	pthread_barrier_wait(&g->bar); /* every rank has read every buf */
	for (size_t i = 0; i < n; i++)
		precision_store(buf, i, sum[i], dt);
	free(sum);
	count(s, op == GPT_TP_SUM ? K_SUM : K_MAX, n, dt);
}

static void sim_all_gather(void *ctx, const void *in, void *out, size_t n, PrecisionType dt)
{
	SimRank *s = ctx;
	SimGroup *g = s->g;
	size_t e = precision_bytes(dt);
	g->in[s->r] = in;
	pthread_barrier_wait(&g->bar);
	for (int k = 0; k < g->t; k++)
		memcpy((char *)out + (size_t)k * n * e, g->in[k], n * e);
	pthread_barrier_wait(&g->bar);
	count(s, K_GATHER, n, dt);
}

static void sim_reduce_scatter(void *ctx, const void *in, void *out, size_t n, PrecisionType dt)
{
	SimRank *s = ctx;
	SimGroup *g = s->g;
	g->in[s->r] = in;
	pthread_barrier_wait(&g->bar);
	for (size_t i = 0; i < n; i++)
		precision_store(out, i, reduce_at(g, g->in, (size_t)s->r * n + i, dt, GPT_TP_SUM), dt);
	pthread_barrier_wait(&g->bar);
	count(s, K_SCATTER, n, dt);
}

typedef struct Group Group;
typedef void (*RankBody)(Group *grp, const GptTp *tp);

typedef struct Rank {
	Group *grp;
	SimRank sim;
	GptTp tp;
} Rank;

struct Group {
	int t, sp;
	SimGroup sim;
	Rank ranks[MAX_T];
	RankBody body;
	void *data;
};

static void *rank_main(void *arg)
{
	Rank *k = arg;
	k->grp->body(k->grp, &k->tp);
	return NULL;
}

/* Run body on t ranks at once (each checked by gpt_tp_check first); the ranks' counters stay in
 * grp for the caller to read. */
static void run_group(Group *grp, int t, int sp, RankBody body, void *data)
{
	pthread_t th[MAX_T];
	memset(grp, 0, sizeof(*grp));
	grp->t = t;
	grp->sp = sp;
	grp->body = body;
	grp->data = data;
	grp->sim.t = t;
	CU_ASSERT_EQUAL_FATAL(pthread_barrier_init(&grp->sim.bar, NULL, (unsigned)t), 0);
	for (int r = 0; r < t; r++) {
		Rank *k = &grp->ranks[r];
		PxError err = {0};
		k->grp = grp;
		k->sim = (SimRank){.g = &grp->sim, .r = r};
		k->tp = (GptTp){r, t, sp, &k->sim, sim_all_reduce, sim_all_gather, sim_reduce_scatter};
		if (gpt_tp_check(&CFG, &k->tp, B, T, &err))
			CU_FAIL_FATAL(err.msg);
	}
	for (int r = 0; r < t; r++)
		CU_ASSERT_EQUAL_FATAL(pthread_create(&th[r], NULL, rank_main, &grp->ranks[r]), 0);
	for (int r = 0; r < t; r++)
		pthread_join(th[r], NULL);
	pthread_barrier_destroy(&grp->sim.bar);
}

/* Every rank made the calls want lists (calls and elements, by kind). */
static void expect_colls(const Group *grp, const char *what, const long want_calls[N_KINDS],
			 const size_t want_elems[N_KINDS])
{
	static const char *kind[N_KINDS] = {"all_reduce sum", "all_reduce max", "all_gather",
					    "reduce_scatter"};
	for (int r = 0; r < grp->t; r++)
		for (int k = 0; k < N_KINDS; k++) {
			const SimRank *s = &grp->ranks[r].sim;
			long want_c = grp->t > 1 ? want_calls[k] : 0;
			size_t want_e = grp->t > 1 ? want_elems[k] : 0;
			if (s->calls[k] != want_c || s->elems[k] != want_e)
				fprintf(stderr, "\n%s, t = %d, sp = %d, rank %d: %ld %s of %zu "
					"elements, want %ld of %zu", what, grp->t, grp->sp, r,
					s->calls[k], kind[k], s->elems[k], want_c, want_e);
			CU_ASSERT_EQUAL(s->calls[k], want_c);
			CU_ASSERT_EQUAL(s->elems[k], want_e);
		}
}

/* ---- gradients reassembled from the shards ---- */

/* The whole unit's gradient from the t ranks' shards: split tensors from their ranks; replicated
 * tensors (engine/model.c's tp_split 0) summed over the ranks under sp (each holds its rows'
 * share), else rank 0's after checking that every rank holds the same bits. */
static void assemble(const GptConfig *c, int t, int sp, int unit, float *const shards[],
		     float *whole)
{
	ModelSpec m;
	ModelTensor e[MODEL_MAX_TENSORS];
	if (engine_gpt2(c, &m))
		return;
	int ne = model_unit_tensors(&m, unit, e);
	size_t n = gpt_cpu_unit_params(c, unit);
	float *part = alloc_floats(n);
	memset(whole, 0, n * sizeof(float));
	for (int r = 0; r < t; r++) {
		memset(part, 0, n * sizeof(float));
		gpt_tp_unshard_unit(c, t, r, unit, shards[r], part);
		size_t off = 0;
		for (int i = 0; i < ne; off += (size_t)e[i].numel, i++) {
			int add = e[i].tp_split || sp || r == 0;
			for (size_t j = 0; j < (size_t)e[i].numel; j++)
				if (add)
					whole[off + j] += part[off + j];
			if (!e[i].tp_split && !sp && r > 0) {
				const float *mine = part + off, *first = whole + off;
				CU_ASSERT_EQUAL(memcmp(mine, first, (size_t)e[i].numel * sizeof(float)), 0);
			}
		}
	}
	free(part);
}

/* ---- layout ---- */

/* Element (i, j) of a whole (rows, cols) tensor as this file reads Megatron's split (the hand
 * derivation the library's copy loops are held to): column split of g groups, rank r takes
 * columns [g0 cols/g + r cols/(g t), + cols/(g t)) of each group g0; row split, rows
 * [r rows/t, (r+1) rows/t). Returns where the value sits in rank r's (rows', cols') shard, or -1. */
static long expect_at(int how, int groups, size_t rows, size_t cols, int t, int r, size_t i,
		      size_t j)
{
	if (how == 0)
		return (long)(i * cols + j);
	if (how == 'R') {
		size_t per = rows / t;
		return i >= r * per && i < (r + 1) * per ? (long)((i - r * per) * cols + j) : -1;
	}
	size_t width = cols / groups / t, g0 = j / (cols / groups), k = j % (cols / groups);
	if (k < r * width || k >= (r + 1) * width)
		return -1;
	return (long)(i * (cols / t) + g0 * width + (k - r * width));
}

/* Every tensor's shard: its size is engine/model.c's numel / t exactly when model.c marks it
 * tp_split (and whole otherwise), every value sits where the split says (the whole tensors are
 * filled with their own indices, exact in fp32), and t unshards rebuild the unit. The rank's
 * q, k and v columns are its heads': head h owns columns [h hs, (h+1) hs) of each. */
static void test_shard_layout(void)
{
	ModelSpec m;
	CU_ASSERT_EQUAL_FATAL(engine_gpt2(&CFG, &m), 0);
	static const struct {
		const char *name;
		int how, groups, cols_per_C;
	} want[] = {{"embed.tokens", 'R', 1, 1},       {"attn.c_attn.weight", 'C', 3, 3},
		    {"attn.c_attn.bias", 'C', 3, 3},   {"attn.o.weight", 'R', 1, 1},
		    {"mlp.fc.weight", 'C', 1, 4},      {"mlp.fc.bias", 'C', 1, 4},
		    {"mlp.down.weight", 'R', 1, 1}};
	for (int t = 1; t <= MAX_T; t *= 2)
		for (int u = 0; u < gpt_cpu_n_units(&CFG); u++) {
			GptTensor g[GPT_CPU_MAX_TENSORS];
			ModelTensor e[MODEL_MAX_TENSORS];
			int ng = gpt_tp_unit_tensors(&CFG, t, u, g), ne = model_unit_tensors(&m, u, e);
			CU_ASSERT_EQUAL(ng, ne);
			size_t n = gpt_cpu_unit_params(&CFG, u), sum = 0;
			for (int i = 0; i < ng && i < ne; i++) {
				CU_ASSERT_STRING_EQUAL(g[i].name, e[i].name);
				long long local = e[i].tp_split ? e[i].numel / t : e[i].numel;
				CU_ASSERT_EQUAL((long long)g[i].numel, local);
				sum += g[i].numel;
			}
			CU_ASSERT_EQUAL(gpt_tp_unit_params(&CFG, t, u), sum);
			float *whole = alloc_floats(n), *back = alloc_floats(n);
			float *shard = alloc_floats(sum);
			for (size_t i = 0; i < n; i++)
				whole[i] = (float)i;
			for (int r = 0; r < t; r++) {
				gpt_tp_shard_unit(&CFG, t, r, u, whole, shard);
				size_t woff = 0, soff = 0;
				int bad = 0;
				for (int i = 0; i < ng; woff += (size_t)e[i].numel, soff += g[i].numel, i++) {
					int how = 0, groups = 1;
					size_t cols = (size_t)e[i].numel;
					for (size_t w = 0; w < sizeof(want) / sizeof(want[0]); w++)
						if (!strcmp(want[w].name, g[i].name)) {
							how = want[w].how;
							groups = want[w].groups;
							cols = (size_t)want[w].cols_per_C * CFG.C;
						}
					CU_ASSERT_EQUAL(how != 0, e[i].tp_split);
					size_t rows = (size_t)e[i].numel / cols;
					for (size_t a = 0; a < rows; a++)
						for (size_t b = 0; b < cols; b++) {
							long at = expect_at(how, groups, rows, cols, t, r, a, b);
							if (at >= 0)
								bad += shard[soff + at] != whole[woff + a * cols + b];
						}
				}
				CU_ASSERT_EQUAL(bad, 0);
				gpt_tp_unshard_unit(&CFG, t, r, u, shard, back);
			}
			CU_ASSERT_EQUAL(memcmp(back, whole, n * sizeof(float)), 0);
			free(whole), free(back), free(shard);
		}
	/* heads: at t = 2, rank 1's q columns of row 0 are whole columns 16..31 (heads 2 and 3 of
	 * hs = 8), its k columns 48..63, its v columns 80..95 */
	size_t n = gpt_cpu_unit_params(&CFG, 1);
	float *whole = alloc_floats(n), *shard = alloc_floats(gpt_tp_unit_params(&CFG, 2, 1));
	for (size_t i = 0; i < n; i++)
		whole[i] = (float)i;
	gpt_tp_shard_unit(&CFG, 2, 1, 1, whole, shard);
	GptBlockLayout w = gpt_cpu_block_layout(&CFG), s = gpt_tp_block_layout(&CFG, 2);
	CU_ASSERT_EQUAL(shard[s.qkv_w + 0], whole[w.qkv_w + 16]);
	CU_ASSERT_EQUAL(shard[s.qkv_w + 16], whole[w.qkv_w + 48]);
	CU_ASSERT_EQUAL(shard[s.qkv_w + 47], whole[w.qkv_w + 95]);
	CU_ASSERT_EQUAL(shard[s.qkv_w + 48], whole[w.qkv_w + 96 + 16]); /* row 1 */
	CU_ASSERT_EQUAL(shard[s.proj_w], whole[w.proj_w + 16 * 32]);    /* attn.o row 16 */
	CU_ASSERT_EQUAL(s.proj_b - s.proj_w, 16 * 32);
	free(whole), free(shard);
}

/* The same seed draws the same model whatever t: each rank's gpt_tp_init_unit is the shard of
 * gpt_cpu_init_unit, bit for bit, on every unit; another seed differs. */
static void test_shard_init(void)
{
	for (int t = 1; t <= MAX_T; t *= 2)
		for (int u = 0; u < gpt_cpu_n_units(&CFG); u++) {
			size_t n = gpt_cpu_unit_params(&CFG, u), local = gpt_tp_unit_params(&CFG, t, u);
			float *whole = alloc_floats(n), *want = alloc_floats(local);
			float *got = alloc_floats(local);
			gpt_cpu_init_unit(&CFG, u, whole, 42);
			for (int r = 0; r < t; r++) {
				gpt_tp_shard_unit(&CFG, t, r, u, whole, want);
				gpt_tp_init_unit(&CFG, t, r, u, got, 42);
				CU_ASSERT_EQUAL(memcmp(got, want, local * sizeof(float)), 0);
				if (u >= 1 && u <= CFG.L) {
					gpt_tp_init_unit(&CFG, t, r, u, got, 43);
					CU_ASSERT_NOT_EQUAL(memcmp(got, want, local * sizeof(float)), 0);
				}
			}
			free(whole), free(want), free(got);
		}
}

/* A rank's saved activations against engine/activ.c's per-rank figure (fp32 and bf16, no dropout,
 * nothing recomputed), for the test model and GPT-2 124M (12 heads: t = 2, 4 divide them) at B = 4,
 * T = 64, with and without sequence parallelism. By hand for the test model at t = 2, B = 2,
 * T = 8 (N = 16): 4 N (4 C + 12 C / 2) + 4 B (NH / 2) T^2 = 4 * 16 * 320 + 4 * 256 = 21504 bytes,
 * under sp 4 N (4 C / 2 + 12 C / 2) + 1024 = 17408. The head under sp keeps 4 (2 (N / t) C + N V / t)
 * = activ.c's (2 h d + 4 V) s b / t; without sp its norm's input and output are whole on every
 * rank, 4 (2 N C + N V / t), where activ.c divides them by t too (its ends follow Korthikanti's,
 * which assume sequence parallelism): the figures below are by hand. */
static void test_activation_bytes(void)
{
	GptConfig gpt2 = {.V = 50304, .max_T = 1024, .C = 768, .L = 12, .NH = 12};
	const GptConfig *cfgs[2] = {&CFG, &gpt2};
	int shapes[2][2] = {{B, T}, {4, 64}};
	for (int k = 0; k < 2; k++) {
		ModelSpec m;
		CU_ASSERT_EQUAL_FATAL(engine_gpt2(cfgs[k], &m), 0);
		int b = shapes[k][0], s = shapes[k][1];
		for (int t = 1; t <= MAX_T; t *= 2)
			for (int sp = 0; sp <= 1; sp++)
				for (int bf = 0; bf <= 1; bf++) {
					GptTp tp = {.r = 0, .t = t, .sp = sp};
					PrecisionType dt = bf ? PREC_BF16 : PREC_F32;
					ActivShape x = {.s = s, .b = b, .t = t, .sp = sp,
							.elem_bytes = bf ? 2 : 4};
					CU_ASSERT_EQUAL((double)gpt_tp_block_act_bytes(cfgs[k], &tp, dt, b, s),
							activ_block_bytes(&m, &x, CKPT_NONE));
					if (sp)
						CU_ASSERT_EQUAL((double)gpt_tp_head_act_bytes(cfgs[k], &tp, dt,
											      b, s),
								activ_head_bytes(&m, &x));
				}
	}
	GptTp t2 = {.r = 1, .t = 2}, t2sp = {.r = 1, .t = 2, .sp = 1};
	CU_ASSERT_EQUAL(gpt_tp_block_act_bytes(&CFG, &t2, PREC_F32, B, T), 21504);
	CU_ASSERT_EQUAL(gpt_tp_block_act_bytes(&CFG, &t2sp, PREC_F32, B, T), 17408);
	/* 4 (2 * 16 * 32 + 16 * 32) = 6144; under sp 4 (2 * 8 * 32 + 16 * 32) = 4096 */
	CU_ASSERT_EQUAL(gpt_tp_head_act_bytes(&CFG, &t2, PREC_F32, B, T), 6144);
	CU_ASSERT_EQUAL(gpt_tp_head_act_bytes(&CFG, &t2sp, PREC_F32, B, T), 4096);
	/* in bf16 the head's streams halve and its fp32 probabilities do not: 2 (2 * 16 * 32) +
	 * 4 (16 * 32) = 4096; the block's every field halves: 10752 */
	CU_ASSERT_EQUAL(gpt_tp_head_act_bytes(&CFG, &t2, PREC_BF16, B, T), 4096);
	CU_ASSERT_EQUAL(gpt_tp_block_act_bytes(&CFG, &t2, PREC_BF16, B, T), 10752);
	/* t = 1 is gpt_cpu's */
	GptTp one = {.r = 0, .t = 1};
	CU_ASSERT_EQUAL(gpt_tp_block_act_bytes(&CFG, &one, PREC_F32, B, T), gpt_cpu_block_act_bytes(&CFG, B, T));
	CU_ASSERT_EQUAL(gpt_tp_head_act_bytes(&CFG, &one, PREC_F32, B, T), gpt_cpu_head_act_bytes(&CFG, B, T));
	CU_ASSERT_EQUAL(gpt_tp_scratch_bytes(&CFG, &one, B, T), gpt_cpu_scratch_bytes(&CFG, B, T));
}

/* Refusals, each naming what is wrong. */
static void test_check(void)
{
	PxError err = {0};
	GptTp tp = {.r = 0, .t = 2, .all_reduce = sim_all_reduce};
	CU_ASSERT_EQUAL(gpt_tp_check(&CFG, &tp, B, T, &err), 0);
	tp.t = 8; /* NH = 4 */
	CU_ASSERT_EQUAL(gpt_tp_check(&CFG, &tp, B, T, &err), -1);
	PX_ASSERT_HAS(err.msg, "t = 8 must divide NH = 4");
	GptConfig odd = CFG;
	odd.V = 65;
	tp.t = 2;
	CU_ASSERT_EQUAL(gpt_tp_check(&odd, &tp, B, T, &err), -1);
	PX_ASSERT_HAS(err.msg, "t = 2 must divide V = 65; pad the vocabulary");
	tp.r = 2;
	CU_ASSERT_EQUAL(gpt_tp_check(&CFG, &tp, B, T, &err), -1);
	PX_ASSERT_HAS(err.msg, "0 <= r < t, got r = 2, t = 2");
	tp.r = 1;
	tp.sp = 1;
	CU_ASSERT_EQUAL(gpt_tp_check(&CFG, &tp, B, T, &err), -1);
	PX_ASSERT_HAS(err.msg, "needs all_gather and reduce_scatter");
	tp.all_gather = sim_all_gather;
	tp.reduce_scatter = sim_reduce_scatter;
	CU_ASSERT_EQUAL(gpt_tp_check(&CFG, &tp, B, T, &err), 0);
	tp.t = 4;
	CU_ASSERT_EQUAL(gpt_tp_check(&CFG, &tp, 1, 7, &err), -1);
	PX_ASSERT_HAS(err.msg, "t = 4 must divide B * T = 7");
	tp.all_reduce = NULL;
	tp.sp = 0;
	CU_ASSERT_EQUAL(gpt_tp_check(&CFG, &tp, B, T, &err), -1);
	PX_ASSERT_HAS(err.msg, "t = 4 needs an all_reduce");
	GptTp one = {.r = 0, .t = 1, .sp = 1}; /* a group of one needs no callbacks */
	CU_ASSERT_EQUAL(gpt_tp_check(&CFG, &one, B, T, &err), 0);
}

/* ---- one block ---- */

/* n fp32 values as a new dt array (rounded; a copy at fp32) */
static void *as_type(const float *x, size_t n, PrecisionType dt)
{
	void *y = rank_alloc(n * precision_bytes(dt));
	ops16_round(dt, y, x, n);
	return y;
}

/* n dt values back to fp32, into y */
static void widen_into(float *y, const void *x, size_t n, PrecisionType dt)
{
	for (size_t i = 0; i < n; i++)
		y[i] = precision_load(x, i, dt);
}

typedef struct BlockCase {
	PrecisionType dt;
	const float *whole, *x, *dy; /* fp32; the units see them rounded to dt */
	float *y[MAX_T], *dx[MAX_T], *grads[MAX_T];
} BlockCase;

/* Odd ranks run in place (y = x, dx = dy), even ranks out of place: both paths are compared. */
static void block_body(Group *grp, const GptTp *tp)
{
	BlockCase *k = grp->data;
	const GptConfig *c = &CFG;
	PrecisionType dt = k->dt;
	int r = tp->r, R = gpt_tp_rows(tp, B, T);
	size_t rc = (size_t)R * c->C, row0 = tp->sp ? (size_t)r * rc : 0;
	size_t np = gpt_tp_unit_params(c, tp->t, 1);
	float *shard = rank_alloc(np * sizeof(float));
	void *acts = rank_alloc(gpt_tp_block_act_bytes(c, tp, dt, B, T));
	float *scratch = rank_alloc(gpt_tp_scratch_bytes(c, tp, B, T));
	gpt_tp_shard_unit(c, tp->t, r, 1, k->whole, shard);
	void *p = as_type(shard, np, dt), *x = as_type(k->x + row0, rc, dt);
	void *y = r % 2 ? x : rank_alloc(rc * precision_bytes(dt));
	gpt_tp_block_forward(c, tp, dt, B, T, p, x, y, acts, scratch);
	widen_into(k->y[r], y, rc, dt);
	if (r % 2) {
		memcpy(k->dx[r], k->dy + row0, rc * sizeof(float));
		gpt_tp_block_backward(c, tp, dt, B, T, p, k->grads[r], acts, k->dx[r], k->dx[r],
				      scratch);
	} else {
		gpt_tp_block_backward(c, tp, dt, B, T, p, k->grads[r], acts, k->dy + row0, k->dx[r],
				      scratch);
		free(y);
	}
	free(shard), free(acts), free(scratch), free(p), free(x);
}

/* The unsplit block in dt on the whole tensors: gpt_cpu's in fp32, gpt16_cpu's in 16-bit (on the
 * same values rounded to dt). */
static void block_reference(PrecisionType dt, const float *whole, const float *x, const float *dy,
			    float *y, float *dx, float *grads)
{
	const GptConfig *c = &CFG;
	size_t nc = (size_t)N * c->C, np = gpt_cpu_unit_params(c, 1);
	float *scratch = alloc_floats(gpt_cpu_scratch_bytes(c, B, T) / sizeof(float));
	if (dt == PREC_F32) {
		float *acts = alloc_floats(gpt_cpu_block_acts(c, B, T).total_elems);
		gpt_cpu_block_forward(c, B, T, whole, x, y, acts);
		gpt_cpu_block_backward(c, B, T, whole, grads, acts, dy, dx, scratch);
		free(acts);
	} else {
		void *p = as_type(whole, np, dt), *x16 = as_type(x, nc, dt);
		void *y16 = rank_alloc(nc * precision_bytes(dt));
		void *acts = rank_alloc(gpt16_block_act_bytes(c, dt, B, T));
		gpt16_block_forward(c, dt, B, T, p, x16, y16, acts);
		widen_into(y, y16, nc, dt);
		gpt16_block_backward(c, dt, B, T, p, grads, acts, dy, dx, scratch);
		free(p), free(x16), free(y16), free(acts);
	}
	free(scratch);
}

/* How far a split block in bf16 may sit from the unsplit one, relative to each tensor's largest
 * value (u = 2^-8). Splitting now also rounds: each rank's partial product of a row-split layer
 * is rounded to bf16 before the reduction, which rounds again at each of its t - 1 additions (the
 * unsplit layer rounds its sum once), and so does each column-split layer's input-gradient
 * partial sum: 2t - 1 roundings, each within u of a partial sum no larger than a few times the
 * result (random signed terms), against 1. The block's output carries that through one
 * residual addition (rounded), its input gradient through the norms' backward (condition O(1) on
 * these O(1) inputs): 4 t u, twice the 2t roundings. A parameter gradient is a product of a
 * perturbed gradient and an activation, summed over N = 16 rows with cancellation up to
 * sqrt(N) = 4: 16 t u. A wrong shard, head or offset moves a tensor by O(1) of its scale, which
 * even t = 4's 0.25 catches. Measured: at most 3.8 u on outputs, 1.4 u on parameter gradients. */
static double bf16_tol(int t, int params)
{
	return (params ? 16.0 : 4.0) * t * 0x1p-8;
}

/* One block on t = 1, 2, 4 ranks, with and without sp, against the unsplit block on the whole
 * tensors (block_reference): outputs, input gradients and every parameter gradient
 * (reassembled), bit for bit at t = 1 (in bf16 too: a group of one rounds nothing to cross it, so
 * it runs gpt16_block's operations in its order), else within TP_TOL in fp32 and bf16_tol in
 * bf16. The collectives each rank makes are the header's list: per branch forward one all-reduce
 * of N C (sp: an all-gather of N C / t and a reduce-scatter to N C / t), backward one all-reduce
 * (sp: two all-gathers, dy's and the norm output's, and a reduce-scatter), every one in dt. */
static void test_block(void)
{
	const GptConfig *c = &CFG;
	size_t nc = (size_t)N * c->C, np = gpt_cpu_unit_params(c, 1);
	float *whole = alloc_floats(np), *x = alloc_floats(nc), *dy = alloc_floats(nc);
	/* random everything, biases and norms too, so that each carries a gradient */
	fill_random(whole, np, 0.1f, 1);
	fill_random(x, nc, 1.0f, 2);
	fill_random(dy, nc, 1.0f, 3);

	for (int bf = 0; bf <= 1; bf++) {
		PrecisionType dt = bf ? PREC_BF16 : PREC_F32;
		float *y = alloc_floats(nc), *dx = alloc_floats(nc), *grads = alloc_floats(np);
		block_reference(dt, whole, x, dy, y, dx, grads);
		for (int t = 1; t <= MAX_T; t *= 2)
			for (int sp = 0; sp <= 1; sp++) {
				BlockCase k = {.dt = dt, .whole = whole, .x = x, .dy = dy};
				size_t rc = sp ? nc / t : nc;
				for (int r = 0; r < t; r++) {
					k.y[r] = alloc_floats(rc);
					k.dx[r] = alloc_floats(rc);
					k.grads[r] = alloc_floats(gpt_tp_unit_params(c, t, 1));
				}
				Group grp;
				run_group(&grp, t, sp, block_body, &k);
				double tol = t == 1 ? 0 : bf ? bf16_tol(t, 0) : TP_TOL;
				double ptol = t == 1 ? 0 : bf ? bf16_tol(t, 1) : TP_TOL;
				for (int r = 0; r < t; r++) {
					size_t row0 = sp ? r * rc : 0;
					close_to(bf ? "bf16 block y" : "block y", t, sp, k.y[r], y + row0,
						 rc, tol);
					close_to(bf ? "bf16 block dx" : "block dx", t, sp, k.dx[r],
						 dx + row0, rc, tol);
				}
				float *g = alloc_floats(np);
				assemble(c, t, sp, 1, k.grads, g);
				GptTensor tn[GPT_CPU_MAX_TENSORS];
				int nt = gpt_cpu_unit_tensors(c, 1, tn);
				size_t off = 0;
				for (int i = 0; i < nt; off += tn[i].numel, i++)
					close_to(tn[i].name, t, sp, g + off, grads + off, tn[i].numel,
						 ptol);
				long calls[N_KINDS] = {sp ? 0 : 4, 0, sp ? 6 : 0, sp ? 4 : 0};
				size_t elems[N_KINDS] = {sp ? 0 : 4 * nc, 0, sp ? 6 * rc : 0,
							 sp ? 4 * rc : 0};
				expect_colls(&grp, "block", calls, elems);
				for (int r = 0; t > 1 && r < t; r++) /* every element in dt */
					CU_ASSERT_EQUAL(grp.ranks[r].sim.bytes[0][0],
							(sp ? 10 * nc : 4 * nc) * precision_bytes(dt));
				free(g);
				for (int r = 0; r < t; r++)
					free(k.y[r]), free(k.dx[r]), free(k.grads[r]);
			}
		free(y), free(dx), free(grads);
	}
	free(whole), free(x), free(dy);
}

/* ---- embeddings and the tied head ---- */

typedef struct EndsCase {
	const float *emb, *head; /* whole units 0 and L+1 */
	const int *tok, *tgt;
	float loss[MAX_T];
	float *y[MAX_T], *probs[MAX_T], *dx[MAX_T], *g_emb[MAX_T], *g_head[MAX_T];
} EndsCase;

static void ends_body(Group *grp, const GptTp *tp)
{
	EndsCase *k = grp->data;
	const GptConfig *c = &CFG;
	int r = tp->r, t = tp->t, R = gpt_tp_rows(tp, B, T);
	size_t rc = (size_t)R * c->C, nv = (size_t)N * (c->V / t);
	float *emb = rank_alloc(gpt_tp_unit_params(c, t, 0) * sizeof(float));
	float *head = rank_alloc(gpt_tp_unit_params(c, t, c->L + 1) * sizeof(float));
	float *acts = rank_alloc(gpt_tp_head_act_bytes(c, tp, PREC_F32, B, T));
	float *scratch = rank_alloc(gpt_tp_scratch_bytes(c, tp, B, T));
	gpt_tp_shard_unit(c, t, r, 0, k->emb, emb);
	gpt_tp_shard_unit(c, t, r, c->L + 1, k->head, head);
	gpt_tp_embed_forward(c, tp, PREC_F32, B, T, emb, k->tok, k->y[r], scratch);
	k->loss[r] = gpt_tp_head_forward(c, tp, PREC_F32, B, T, head, emb, k->y[r], k->tgt, acts, scratch);
	memcpy(k->probs[r], gpt_tp_head_probs(c, tp, PREC_F32, B, T, acts), nv * sizeof(float));
	gpt_tp_head_backward(c, tp, PREC_F32, B, T, head, emb, k->g_head[r], k->g_emb[r], acts, k->tgt, 1.0f,
			     k->dx[r], scratch);
	/* the head's input gradient goes to the embeddings directly: dwte gets both uses */
	float *dy = rank_alloc(rc * sizeof(float));
	memcpy(dy, k->dx[r], rc * sizeof(float));
	gpt_tp_embed_backward(c, tp, PREC_F32, B, T, k->g_emb[r], k->tok, dy, scratch);
	free(emb), free(head), free(acts), free(scratch), free(dy);
}

/* The embeddings straight into the head (no block between, so the tied wte's gradient has both
 * uses), on t = 1, 2, 4 ranks with and without sp, against gpt_cpu's: the embeddings' output bit
 * for bit at every t (a sum of one value and zeros); the loss (the tolerance in the file's
 * comment) and the probabilities (each rank's V/t columns); the head's input gradient and every
 * parameter gradient. The head's sum of exponentials is rounded to fp32 to cross the group, so
 * even t = 1 is held to the tolerance rather than to the bits. Collectives: forward, the
 * embeddings' all-reduce of N C (sp: a reduce-scatter), the head's max over N and sum over 2N
 * values (sp: after an all-gather of the final norm's output); backward, an all-reduce of the
 * head's input gradient (sp: an all-gather of the norm output again, a reduce-scatter, and the
 * embeddings' all-gather of dy). */
static void test_ends(void)
{
	const GptConfig *c = &CFG;
	int head_u = c->L + 1;
	size_t nc = (size_t)N * c->C, ne = gpt_cpu_unit_params(c, 0);
	size_t nh = gpt_cpu_unit_params(c, head_u);
	float *emb = alloc_floats(ne), *head = alloc_floats(nh), *y = alloc_floats(nc);
	float *acts = alloc_floats(gpt_cpu_head_act_bytes(c, B, T) / sizeof(float));
	float *scratch = alloc_floats(gpt_cpu_scratch_bytes(c, B, T) / sizeof(float));
	float *probs = alloc_floats((size_t)N * c->V), *dx = alloc_floats(nc);
	float *g_emb = alloc_floats(ne), *g_head = alloc_floats(nh);
	int tok[N], tgt[N];
	fill_random(emb, ne, 0.5f, 11);
	fill_random(head, nh, 0.5f, 12);
	for (int i = 0; i < c->C; i++)
		head[i] += 1.0f; /* norm weights near 1 */
	random_tokens(tok, N, c->V, 13);
	random_tokens(tgt, N, c->V, 14);
	gpt_cpu_embed_forward(c, B, T, emb, tok, y);
	float loss = gpt_cpu_head_forward(c, B, T, head, emb, y, tgt, acts);
	memcpy(probs, gpt_cpu_head_probs(c, B, T, acts), (size_t)N * c->V * sizeof(float));
	gpt_cpu_head_backward(c, B, T, head, emb, g_head, g_emb, acts, tgt, 1.0f, dx, scratch);
	float *dy = alloc_floats(nc);
	memcpy(dy, dx, nc * sizeof(float));
	gpt_cpu_embed_backward(c, B, T, g_emb, tok, dy);

	for (int t = 1; t <= MAX_T; t *= 2)
		for (int sp = 0; sp <= 1; sp++) {
			EndsCase k = {.emb = emb, .head = head, .tok = tok, .tgt = tgt};
			size_t rc = sp ? nc / t : nc, vt = (size_t)c->V / t;
			for (int r = 0; r < t; r++) {
				k.y[r] = alloc_floats(rc);
				k.dx[r] = alloc_floats(rc);
				k.probs[r] = alloc_floats((size_t)N * vt);
				k.g_emb[r] = alloc_floats(gpt_tp_unit_params(c, t, 0));
				k.g_head[r] = alloc_floats(gpt_tp_unit_params(c, t, head_u));
			}
			Group grp;
			run_group(&grp, t, sp, ends_body, &k);
			double loss_tol = 8 * (t + 1) * U + 2 * U * fabs(loss);
			for (int r = 0; r < t; r++) {
				size_t row0 = sp ? r * rc : 0;
				close_to("embeddings y", t, sp, k.y[r], y + row0, rc, 0);
				if (fabs(k.loss[r] - loss) > loss_tol)
					fprintf(stderr, "\nloss at t = %d, sp = %d, rank %d: %.9g, want "
						"%.9g", t, sp, r, k.loss[r], loss);
				CU_ASSERT(fabs(k.loss[r] - loss) <= loss_tol);
				float *want = alloc_floats((size_t)N * vt);
				for (int i = 0; i < N; i++)
					memcpy(want + i * vt, probs + (size_t)i * c->V + r * vt,
					       vt * sizeof(float));
				close_to("head probs", t, sp, k.probs[r], want, (size_t)N * vt, TP_TOL);
				free(want);
				close_to("head dx", t, sp, k.dx[r], dx + row0, rc, TP_TOL);
			}
			float *g = alloc_floats(ne);
			assemble(c, t, sp, 0, k.g_emb, g);
			close_to("embed.tokens grad", t, sp, g, g_emb, (size_t)c->V * c->C, TP_TOL);
			close_to("embed.positions grad", t, sp, g + (size_t)c->V * c->C,
				 g_emb + (size_t)c->V * c->C, ne - (size_t)c->V * c->C, TP_TOL);
			free(g);
			g = alloc_floats(nh);
			assemble(c, t, sp, head_u, k.g_head, g);
			close_to("final_norm grads", t, sp, g, g_head, nh, TP_TOL);
			free(g);
			long calls[N_KINDS] = {sp ? 2 : 4, 1, sp ? 3 : 0, sp ? 2 : 0};
			size_t elems[N_KINDS] = {sp ? 2 * N : 2 * nc + 2 * N, N, sp ? 3 * rc : 0,
						 sp ? 2 * rc : 0};
			expect_colls(&grp, "embeddings and head", calls, elems);
			for (int r = 0; r < t; r++)
				free(k.y[r]), free(k.dx[r]), free(k.probs[r]), free(k.g_emb[r]),
					free(k.g_head[r]);
		}
	free(emb), free(head), free(y), free(acts), free(scratch), free(probs), free(dx);
	free(g_emb), free(g_head), free(dy);
}

/* ---- the whole model ---- */

typedef struct ModelCase {
	PrecisionType dt;
	const float *params; /* whole, gpt_cpu's flat layout, fp32: the units see them in dt */
	const int *tok, *tgt;
	float loss[MAX_T];
	float *grads[MAX_T][8]; /* per rank, per unit: the shard's gradient */
} ModelCase;

/* The executor's order on one rank: embeddings, blocks, head; then back. */
static void model_body(Group *grp, const GptTp *tp)
{
	ModelCase *k = grp->data;
	const GptConfig *c = &CFG;
	PrecisionType dt = k->dt;
	int r = tp->r, t = tp->t, nu = gpt_cpu_n_units(c), R = gpt_tp_rows(tp, B, T);
	size_t rc = (size_t)R * c->C, na = gpt_tp_block_act_bytes(c, tp, dt, B, T);
	void *p[8];
	for (int u = 0; u < nu; u++) {
		size_t n = gpt_tp_unit_params(c, t, u);
		float *shard = rank_alloc(n * sizeof(float));
		gpt_tp_shard_unit(c, t, r, u, k->params + gpt_cpu_unit_offset(c, u), shard);
		p[u] = as_type(shard, n, dt);
		free(shard);
	}
	char *acts = (char *)rank_alloc(c->L * na);
	void *hacts = rank_alloc(gpt_tp_head_act_bytes(c, tp, dt, B, T));
	float *scratch = rank_alloc(gpt_tp_scratch_bytes(c, tp, B, T));
	void *x = rank_alloc(rc * precision_bytes(dt));
	float *dx = rank_alloc(rc * sizeof(float));
	SimRank *sim = tp->ctx;
	gpt_tp_embed_forward(c, tp, dt, B, T, p[0], k->tok, x, scratch);
	for (int l = 0; l < c->L; l++) {
		sim->unit = l + 1;
		gpt_tp_block_forward(c, tp, dt, B, T, p[l + 1], x, x, acts + l * na, scratch);
	}
	sim->unit = nu - 1;
	k->loss[r] = gpt_tp_head_forward(c, tp, dt, B, T, p[nu - 1], p[0], x, k->tgt, hacts,
					 scratch);
	sim->bwd = 1;
	gpt_tp_head_backward(c, tp, dt, B, T, p[nu - 1], p[0], k->grads[r][nu - 1],
			     k->grads[r][0], hacts, k->tgt, 1.0f, dx, scratch);
	for (int l = c->L - 1; l >= 0; l--) {
		sim->unit = l + 1;
		gpt_tp_block_backward(c, tp, dt, B, T, p[l + 1], k->grads[r][l + 1], acts + l * na,
				      dx, dx, scratch);
	}
	sim->unit = 0;
	gpt_tp_embed_backward(c, tp, dt, B, T, k->grads[r][0], k->tok, dx, scratch);
	for (int u = 0; u < nu; u++)
		free(p[u]);
	free(acts), free(hacts), free(scratch), free(x), free(dx);
}

/* The tensor-parallel collectives engine/build.c's schedule states for this model at the group's
 * t (one micro-batch of B sequences of T tokens, no recompute; bf16 training when dt is), in
 * elements and bytes by unit and direction, against what every rank of grp made. The head's
 * three all-reduces of N values are Megatron's (the max, the target logits, the sums), fp32 in
 * either type; every other collective moves dt. Compared without sequence parallelism here;
 * under it the executor matches every kernel call to the schedule's op, kind, size and element
 * size, or stops (exec/runner_tp.c), which the tp suite runs at t = 2 and 4. */
static void expect_schedule(const Group *grp, PrecisionType dt)
{
	Scenario sc;
	Prediction pr;
	if (fx_predictf(&sc, &pr, "{\"name\": \"tp\", \"model\": {\"model_type\": \"gpt2\", "
			"\"n_embd\": %d, \"n_layer\": %d, \"n_head\": %d, \"n_positions\": %d, "
			"\"vocab_size\": %d, \"attn_pdrop\": 0, \"resid_pdrop\": 0, "
			"\"embd_pdrop\": 0}, \"deepspeed\": {\"train_batch_size\": %d, "
			"\"train_micro_batch_size_per_gpu\": %d, \"bf16\": {\"enabled\": %s}, "
			"\"zero_optimization\": {\"stage\": 0}}, \"cluster\": {\"gpu\": \"H100-SXM\", "
			"\"gpus_per_node\": %d, \"nodes\": 1}, \"seq_length\": %d, "
			"\"parallelism\": {\"tp\": %d}}", CFG.C, CFG.L, CFG.NH, CFG.max_T, CFG.V, B,
			B, dt == PREC_BF16 ? "true" : "false", grp->t, T, grp->t))
		return;
	size_t want[8][2] = {{0}}, want_bytes[8][2] = {{0}};
	const Schedule *s = &pr.stages[0].sched;
	for (int i = s->step_begin; i < s->n; i++) {
		const Op *op = &s->ops[i];
		CU_ASSERT(op->kind != OP_LOOP || op->count == 1); /* one micro-batch: each op once */
		if (op->kind != OP_COLL || op->group != GROUP_TP)
			continue;
		CU_ASSERT(op->role == ROLE_FORWARD || op->role == ROLE_BACKWARD);
		CU_ASSERT_EQUAL(op->sub, COLL_ALL_REDUCE);
		want[op->unit][op->role == ROLE_BACKWARD] += (size_t)op->elems;
		want_bytes[op->unit][op->role == ROLE_BACKWARD] += (size_t)op->elems * op->elem_bytes;
	}
	/* by hand: N C = 512 each block all-reduce (2 a direction), the embeddings' N C forward,
	 * the head's 3 N = 48 forward and N C backward; in bytes, d N C each and 4 bytes each of
	 * the head's 48 */
	size_t d = precision_bytes(dt);
	CU_ASSERT_EQUAL(want[1][0], 2 * N * CFG.C);
	CU_ASSERT_EQUAL(want[3][0], 3 * N);
	CU_ASSERT_EQUAL(want_bytes[1][1], 2 * N * CFG.C * d);
	CU_ASSERT_EQUAL(want_bytes[3][0], 3 * N * 4);
	CU_ASSERT_EQUAL(want_bytes[3][1], N * CFG.C * d);
	for (int r = 0; r < grp->t; r++)
		for (int u = 0; u < gpt_cpu_n_units(&CFG); u++)
			for (int k = 0; k < 2; k++) {
				const SimRank *sim = &grp->ranks[r].sim;
				if (sim->payload[u][k] != want[u][k] || sim->bytes[u][k] != want_bytes[u][k])
					fprintf(stderr, "\nt = %d rank %d unit %d %s: %zu elements in %zu "
						"bytes, the schedule %zu in %zu", grp->t, r, u,
						k ? "backward" : "forward", sim->payload[u][k],
						sim->bytes[u][k], want[u][k], want_bytes[u][k]);
				CU_ASSERT_EQUAL(sim->payload[u][k], want[u][k]);
				CU_ASSERT_EQUAL(sim->bytes[u][k], want_bytes[u][k]);
			}
	fx_free(&sc, &pr);
}

/* One model's loss and gradients (ModelCase's, on ranks of t) */
static void run_model(ModelCase *k, Group *grp, int t, int sp)
{
	for (int r = 0; r < t; r++)
		for (int u = 0; u < gpt_cpu_n_units(&CFG); u++)
			k->grads[r][u] = alloc_floats(gpt_tp_unit_params(&CFG, t, u));
	run_group(grp, t, sp, model_body, k);
}

static void free_model(ModelCase *k, int t)
{
	for (int r = 0; r < t; r++)
		for (int u = 0; u < gpt_cpu_n_units(&CFG); u++)
			free(k->grads[r][u]);
}

/* Two blocks between the embeddings and the tied head, at GPT-2's init plus noise, on t = 2 and 4
 * ranks with and without sp. In fp32 against gpt_cpu_forward and _backward: the loss (the file's
 * bound) and every unit's gradient, reassembled, within TP_TOL. In bf16 against the same units
 * on one rank (which the block test holds to gpt16_cpu's bits): the loss within 8 t u_bf16
 * absolute (each of the 2 t roundings of a split sum moves the logits by u of their O(1) scale,
 * and the loss by as much; measured at most 0.46 u) and the gradients within bf16_tol's parameter
 * bound (measured at most 3.4 u).
 * Without sp, every collective against engine/build.c's schedule in elements and bytes. */
static void test_whole_model(void)
{
	const GptConfig *c = &CFG;
	int nu = gpt_cpu_n_units(c);
	size_t n = gpt_cpu_n_params(c);
	float *params = alloc_floats(n), *noise = alloc_floats(n);
	int tok[N], tgt[N];
	gpt_cpu_init(c, params, 5);
	fill_random(noise, n, 0.1f, 6);
	for (size_t i = 0; i < n; i++)
		params[i] += noise[i];
	random_tokens(tok, N, c->V, 7);
	random_tokens(tgt, N, c->V, 8);

	for (int bf = 0; bf <= 1; bf++) {
		PrecisionType dt = bf ? PREC_BF16 : PREC_F32;
		float *grads = alloc_floats(n), loss;
		ModelCase ref = {.dt = dt, .params = params, .tok = tok, .tgt = tgt};
		Group grp;
		if (bf) { /* the unsplit units in bf16: t = 1 */
			run_model(&ref, &grp, 1, 0);
			loss = ref.loss[0];
			for (int u = 0; u < nu; u++)
				memcpy(grads + gpt_cpu_unit_offset(c, u), ref.grads[0][u],
				       gpt_cpu_unit_params(c, u) * sizeof(float));
			free_model(&ref, 1);
		} else {
			GptCpuBuffers buf;
			PxError err = {0};
			CU_ASSERT_EQUAL_FATAL(gpt_cpu_buffers_init(&buf, c, B, T, &err), 0);
			loss = gpt_cpu_forward(&buf, params, tok, tgt);
			gpt_cpu_backward(&buf, params, grads, tok, tgt, 1.0f);
			gpt_cpu_buffers_free(&buf);
		}
		for (int t = 2; t <= MAX_T; t *= 2)
			for (int sp = 0; sp <= 1; sp++) {
				ModelCase k = {.dt = dt, .params = params, .tok = tok, .tgt = tgt};
				run_model(&k, &grp, t, sp);
				double tol = bf ? 8 * t * 0x1p-8 : 8 * (t + 1) * U + 2 * U * fabs(loss);
				for (int r = 0; r < t; r++) {
					if (fabs(k.loss[r] - loss) > tol)
						fprintf(stderr, "\nmodel loss (%s) at t = %d, sp = %d: "
							"%.9g, want %.9g", bf ? "bf16" : "fp32", t, sp,
							k.loss[r], loss);
					CU_ASSERT(fabs(k.loss[r] - loss) <= tol);
				}
				for (int u = 0; u < nu; u++) {
					float *shards[MAX_T];
					for (int r = 0; r < t; r++)
						shards[r] = k.grads[r][u];
					size_t nun = gpt_cpu_unit_params(c, u);
					size_t off = gpt_cpu_unit_offset(c, u);
					float *g = alloc_floats(nun);
					assemble(c, t, sp, u, shards, g);
					GptTensor tn[GPT_CPU_MAX_TENSORS];
					int nt = gpt_cpu_unit_tensors(c, u, tn);
					size_t o = 0;
					for (int i = 0; i < nt; o += tn[i].numel, i++)
						close_to(tn[i].name, t, sp, g + o, grads + off + o,
							 tn[i].numel, bf ? bf16_tol(t, 1) : TP_TOL);
					free(g);
				}
				if (!sp)
					expect_schedule(&grp, dt);
				free_model(&k, t);
			}
		free(grads);
	}
	free(params), free(noise);
}

int test_tp_kernels_register(void)
{
	return PX_ADD_SUITE("tp_kernels", {"shard layout against engine/model.c", test_shard_layout},
			    {"sharded init equals the whole init's shard", test_shard_init},
			    {"saved activations against engine/activ.c", test_activation_bytes},
			    {"refusals", test_check},
			    {"block on 1, 2, 4 ranks, fp32 and bf16", test_block},
			    {"embeddings and tied head against gpt_cpu", test_ends},
			    {"two-block model on 2, 4 ranks, fp32 and bf16", test_whole_model});
}

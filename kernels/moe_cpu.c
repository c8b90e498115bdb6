#include "moe_cpu.h"

#include <float.h>
#include <math.h>
#include <string.h>

#include "gpt16_cpu.h"
#include "ops16_cpu.h"
#include "ops_cpu.h"
#include "par_cpu.h"
#include "rng.h"

/* ---- gating ---- */

long long moe_cpu_capacity(long long S, long long E, int k, double capacity_factor,
			   long long min_capacity)
{
	long long cap = (long long)ceil((double)S / (double)E * (capacity_factor * k));
	return cap < min_capacity ? min_capacity : cap;
}

static int argmax_except(const float *x, int E, int skip)
{
	int best = -1;
	for (int e = 0; e < E; e++)
		if (e != skip && (best < 0 || x[e] > x[best]))
			best = e;
	return best;
}

float moe_cpu_rts_priority(uint64_t stream, uint64_t token)
{
	PxRng g;
	rng_init(&g, stream, token + 1); /* stream 0 of rng_init is the seed's own sequence */
	return (float)(rng_next_u64(&g) >> 40) * 0x1.0p-24f;
}

float moe_cpu_gumbel(uint64_t stream, uint64_t token, int e)
{
	PxRng g; /* its own streams: 64 a token (E <= 64), past random token selection's */
	rng_init(&g, stream ^ 0x6a09e667f3bcc909ULL, token * 64 + (uint64_t)e + 1);
	double u = ((double)(rng_next_u64(&g) >> 40) + 0.5) * 0x1.0p-24; /* (0, 1) */
	return (float)-log(-log(u));
}

/* idx[0, n) sorted by key[idx] descending, the lower index first on ties (Shell's sort with
 * Ciura's gaps: no allocation, and the experts' lists are a few thousand tokens at most). */
static void sort_by_key_desc(int *idx, int n, const float *key)
{
	static const int gaps[] = {701, 301, 132, 57, 23, 10, 4, 1};
	for (size_t g = 0; g < sizeof(gaps) / sizeof(gaps[0]); g++)
		for (int i = gaps[g]; i < n; i++) {
			int v = idx[i], j = i;
			for (; j >= gaps[g]; j -= gaps[g]) {
				int w = idx[j - gaps[g]];
				if (key[w] > key[v] || (key[w] == key[v] && w < v))
					break;
				idx[j] = w;
			}
			idx[j] = v;
		}
}

/* Top-1's random token selection over the first choices in rt->expert, the priorities in
 * rt->weight: of the tokens of an expert over capacity, those after its cap highest priorities
 * are marked (priority -1) and the rest numbered in token order. rt->slot first lists each
 * expert's tokens (a counting sort by expert), then holds the slots. */
static void rts_select(int S, int E, int cap, MoeRoute *rt)
{
	int off[65] = {0}, fill[64], count[64] = {0};
	for (int s = 0; s < S; s++)
		off[rt->expert[s] + 1]++;
	for (int e = 0; e < E; e++) {
		off[e + 1] += off[e];
		fill[e] = off[e];
	}
	for (int s = 0; s < S; s++)
		rt->slot[fill[rt->expert[s]]++] = s;
	for (int e = 0; e < E; e++) {
		int n = off[e + 1] - off[e], *list = rt->slot + off[e];
		if (n <= cap)
			continue;
		sort_by_key_desc(list, n, rt->weight);
		for (int i = cap; i < n; i++)
			rt->weight[list[i]] = -1.0f;
	}
	for (int s = 0; s < S; s++)
		rt->slot[s] = rt->weight[s] < 0 ? -1 : count[rt->expert[s]]++;
}

double moe_cpu_route(const float *logits, const float *probs, int S, int E, int k, int cap,
		     const float *prio, MoeRoute *rt)
{
	int count1[64], count2[64]; /* first and second choices per expert so far */
	double me[64] = {0}, ce[64] = {0};
	int E_n = E < 64 ? E : 64;  /* moe_cpu_check bounds E */
	memset(count1, 0, sizeof(count1));
	memset(count2, 0, sizeof(count2));
	for (int s = 0; s < S; s++) {
		int e1 = argmax_except(probs + (size_t)s * E, E, -1);
		rt->expert[(size_t)s * k] = e1;
		rt->slot[(size_t)s * k] = count1[e1]++;
		ce[e1] += 1;
		for (int e = 0; e < E_n; e++)
			me[e] += probs[(size_t)s * E + e];
		if (k == 2) {
			int e2 = argmax_except(logits + (size_t)s * E, E, e1);
			rt->expert[(size_t)s * k + 1] = e2;
			rt->slot[(size_t)s * k + 1] = count2[e2]++;
		}
	}
	double l_aux = 0;
	for (int e = 0; e < E_n; e++)
		l_aux += (me[e] / S) * (ce[e] / S);
	if (prio && k == 1) {
		if (prio != rt->weight)
			memcpy(rt->weight, prio, (size_t)S * sizeof(float));
		rts_select(S, E, cap, rt);
	}
	for (int s = 0; s < S; s++) {
		float g[2] = {0, 0};
		for (int j = 0; j < k; j++) {
			size_t i = (size_t)s * k + j;
			int e = rt->expert[i];
			if (j == 1) /* after every first choice of its expert */
				rt->slot[i] += count1[e];
			if (rt->slot[i] >= cap)
				rt->slot[i] = -1;
			g[j] = rt->slot[i] >= 0 ? probs[(size_t)s * E + e] : 0.0f;
		}
		if (k == 1) {
			rt->weight[s] = g[0];
			continue;
		}
		float denom = g[0] + g[1];
		if (denom < FLT_EPSILON)
			denom = FLT_EPSILON;
		rt->weight[(size_t)s * 2] = g[0] / denom;
		rt->weight[(size_t)s * 2 + 1] = g[1] / denom;
	}
	return l_aux * E;
}

/* The tensor-parallel degree, 1 without. */
static int tp_t(const MoeCpu *m)
{
	return m->tp ? m->tp->t : 1;
}

int moe_cpu_check(const GptConfig *c, const MoeCpu *m, int B, int T, PxError *err)
{
	if (m->t == PREC_F32 ? gpt_cpu_check(c, B, T, err) : gpt16_check(c, m->t, B, T, err))
		return -1;
	if (m->k < 1 || m->k > 2 || m->k > m->E || m->E > 64)
		return px_fail(err, PX_ERR_INPUT, "moe: top-%d of %d experts: the CPU kernels gate "
			       "top-1 or top-2 of 1-64 experts", m->k, m->E);
	if (m->rts && m->k != 1)
		return px_fail(err, PX_ERR_INPUT, "moe: random token selection with top-%d: "
			       "DeepSpeed's use_rts is top-1's (top1gating)", m->k);
	if (m->gumbel && m->k != 2)
		return px_fail(err, PX_ERR_INPUT, "moe: second-expert sampling with top-%d: "
			       "DeepSpeed's top2_2nd_expert_sampling is top-2's (top2gating)", m->k);
	if (m->ep < 1 || m->E % m->ep || m->r < 0 || m->r >= m->ep)
		return px_fail(err, PX_ERR_INPUT, "moe: rank %d of an expert-parallel group of %d "
			       "over %d experts: ep must divide E", m->r, m->ep, m->E);
	if (m->cap < 1 || m->I != 4 * c->C)
		return px_fail(err, PX_ERR_INPUT, "moe: capacity %d must be positive and the experts' "
			       "intermediate size %d GPT-2's 4 x %d channels", m->cap, m->I, c->C);
	if (m->ep > 1 && !m->all_to_all)
		return px_fail(err, PX_ERR_INPUT, "moe: expert parallelism of %d without an "
			       "all-to-all", m->ep);
	if (tp_t(m) > 1) {
		if (gpt_tp_check(c, m->tp, B, T, err))
			return -1;
		if (m->tp->sp || m->cap % m->tp->t || !m->all_to_all)
			return px_fail(err, PX_ERR_INPUT, "moe: tensor parallelism of %d needs no "
				       "sequence parallelism, a capacity (%d) it divides and an "
				       "all-to-all", m->tp->t, m->cap);
	}
	return 0;
}

/* ---- parameter layout ---- */

static int add(GptTensor *t, int n, const char *name, size_t numel)
{
	t[n].name = name;
	t[n].numel = numel;
	return n + 1;
}

int moe_cpu_unit_tensors(const GptConfig *c, const MoeCpu *m, GptTensor out[MOE_CPU_MAX_TENSORS])
{
	GptTensor dense[GPT_CPU_MAX_TENSORS];
	size_t C = (size_t)c->C, I = (size_t)m->I, El = (size_t)(m->E / m->ep);
	gpt_tp_unit_tensors(c, tp_t(m), 1, dense); /* at t = 1 gpt_cpu's */
	int n = 0;
	for (; n < 8; n++) /* norm1 .. norm2 */
		out[n] = dense[n];
	n = add(out, n, "mlp.router.weight", C * (size_t)m->E);
	n = add(out, n, "mlp.fc.weight", El * C * I);
	n = add(out, n, "mlp.fc.bias", El * I);
	n = add(out, n, "mlp.down.weight", El * I * C);
	return add(out, n, "mlp.down.bias", El * C);
}

size_t moe_cpu_unit_params(const GptConfig *c, const MoeCpu *m)
{
	GptTensor t[MOE_CPU_MAX_TENSORS];
	size_t sum = 0;
	int n = moe_cpu_unit_tensors(c, m, t);
	for (int i = 0; i < n; i++)
		sum += t[i].numel;
	return sum;
}

/* Offsets of the tensors of moe_cpu_unit_tensors, in its order. */
typedef struct MoeLayout {
	GptBlockLayout d; /* the shared part's (its fc and down fields unused) */
	size_t router, fc_w, fc_b, down_w, down_b;
} MoeLayout;

static MoeLayout moe_layout(const GptConfig *c, const MoeCpu *m)
{
	GptTensor t[MOE_CPU_MAX_TENSORS];
	size_t off[MOE_CPU_MAX_TENSORS], sum = 0;
	int n = moe_cpu_unit_tensors(c, m, t);
	for (int i = 0; i < n; i++) {
		off[i] = sum;
		sum += t[i].numel;
	}
	MoeLayout L = {.router = off[8], .fc_w = off[9], .fc_b = off[10], .down_w = off[11],
		       .down_b = off[12]};
	L.d = (GptBlockLayout){off[0], off[1], off[2], off[3], off[4], off[5], off[6], off[7],
			       0, 0, 0, 0};
	return L;
}

static void fill_normal(float *x, size_t n, float std, uint64_t seed, uint64_t stream)
{
	PxRng r;
	rng_init(&r, seed, stream);
	for (size_t i = 0; i < n; i++)
		x[i] = (float)(std * rng_normal(&r));
}

/* The streams of the router and the experts' tensors: apart from gpt_cpu's (unit x 12 + tensor
 * + 1, below 2^32 for any model here), one per (unit, tensor, global expert). */
static uint64_t moe_stream(int unit, int tensor, int expert)
{
	return (1ull << 40) + ((uint64_t)unit * MOE_CPU_MAX_TENSORS + (uint64_t)tensor) * 65536u +
	       (uint64_t)expert;
}

void moe_cpu_init_unit(const GptConfig *c, const MoeCpu *m, int unit, float *params,
		       uint64_t seed)
{
	size_t C = (size_t)c->C, I = (size_t)m->I;
	int El = m->E / m->ep;
	MoeLayout L = moe_layout(c, m);
	float resid_std = GPT_CPU_INIT_STD / sqrtf(2.0f * (float)c->L);
	/* the shared tensors: a dense block's first eight (this rank's shards of them; at t = 1
	 * gpt_cpu_init_unit's values), at the same offsets, from the same streams; its MLP tensors
	 * land where the router and experts go and are drawn over (an MoE unit of one local expert
	 * already outsizes a dense block, 12 C^2 + 13 C + C E, and a tensor-parallel rank's shard) */
	gpt_tp_init_unit(c, tp_t(m), m->tp ? m->tp->r : 0, unit, params, seed);
	fill_normal(params + L.router, C * (size_t)m->E, GPT_CPU_INIT_STD, seed,
		    moe_stream(unit, 8, 0));
	for (int j = 0; j < El; j++) {
		int e = m->r * El + j;
		fill_normal(params + L.fc_w + (size_t)j * C * I, C * I, GPT_CPU_INIT_STD, seed,
			    moe_stream(unit, 9, e));
		memset(params + L.fc_b + (size_t)j * I, 0, I * sizeof(float));
		fill_normal(params + L.down_w + (size_t)j * I * C, I * C, resid_std, seed,
			    moe_stream(unit, 11, e));
		memset(params + L.down_b + (size_t)j * C, 0, C * sizeof(float));
	}
}

/* ---- saved activations and scratch ---- */

MoeBlockActs moe_cpu_block_acts(const GptConfig *c, const MoeCpu *m, int B, int T)
{
	size_t N = (size_t)B * T, C = (size_t)c->C, btc = N * C, e = precision_bytes(m->t);
	size_t slots = (size_t)m->E * m->cap, I = (size_t)m->I, E = (size_t)m->E;
	size_t t = (size_t)tp_t(m);
	MoeBlockActs a = {0};
	a.logits = 0; /* fp32 */
	a.probs = N * E;
	size_t floats = 2 * N * E;
	if (m->t != PREC_F32) {
		a.gate_x = floats;
		a.gate_w = floats + btc;
		floats += btc + C * E;
	}
	size_t base = floats * sizeof(float) / e; /* type t from here */
	a.x_in = base;
	a.ln1 = base + btc;
	a.qkv = base + 2 * btc;
	a.atty = a.qkv + 3 * btc / t;
	a.res2 = a.atty + btc / t;
	a.att = a.res2 + btc;
	a.ln2 = a.att + (m->scores_apart ? 0 :
			 m->ix ? sparse_eager_probs_elems(m->ix, B) :
				 (size_t)B * (size_t)(c->NH / (int)t) * T * T);
	a.disp = m->dropless ? 0 : a.ln2 + btc; /* dropless: in slot_acts */
	a.fc = a.disp + slots * C;
	a.gelu = a.fc + slots * I;
	a.eout = a.gelu + slots * I;
	a.slot_bytes = slots * (2 * C + 2 * I) * e;
	a.total_bytes = (a.ln2 + btc) * e + (m->dropless ? 0 : a.slot_bytes);
	return a;
}

size_t moe_cpu_block_act_bytes(const GptConfig *c, const MoeCpu *m, int B, int T)
{
	return moe_cpu_block_acts(c, m, B, T).total_bytes;
}

static size_t route_elems(const MoeCpu *m, int B, int T)
{
	return 3 * (size_t)B * T * m->k;
}

/* The MLP's backward scratch (floats), before the route. */
static size_t mlp_scratch_elems(const GptConfig *c, const MoeCpu *m, int B, int T)
{
	size_t N = (size_t)B * T, C = (size_t)c->C, slots = (size_t)m->E * m->cap;
	return 2 * slots * C + 2 * (size_t)m->cap * m->I + N * C + 2 * N * m->E;
}

size_t moe_cpu_scratch_bytes(const GptConfig *c, const MoeCpu *m, int B, int T)
{
	size_t dense = 8 * (size_t)B * T * c->C, mlp = mlp_scratch_elems(c, m, B, T);
	return ((dense > mlp ? dense : mlp) + route_elems(m, B, T)) * sizeof(float);
}

/* The route's arrays at the scratch's end, past what either pass uses otherwise. */
static MoeRoute route_in(const GptConfig *c, const MoeCpu *m, int B, int T, float *scratch)
{
	size_t S = (size_t)B * T * m->k;
	float *at = scratch + moe_cpu_scratch_bytes(c, m, B, T) / sizeof(float) - 3 * S;
	return (MoeRoute){(int *)at, (int *)(at + S), at + 2 * S};
}

/* The gating of the N tokens from their logits and probs into rt, with m's token selection. */
static void gate(const MoeCpu *m, const float *logits, const float *probs, int N, MoeRoute *rt)
{
	if (m->rts)
		for (int s = 0; s < N; s++)
			rt->weight[s] = moe_cpu_rts_priority(m->rts_stream, m->rts_first + (uint64_t)s);
	moe_cpu_route(logits, probs, N, m->E, m->k, m->cap, m->rts ? rt->weight : NULL, rt);
}

/* Where the saved activations' slot part lies: slot_acts when dropless, else acts. */
static void *slot_base(const MoeCpu *m, const void *acts)
{
	return m->dropless ? m->slot_acts : (void *)acts;
}

/* total elements of type m->t; in may be overwritten */
static void exchange(const MoeCpu *m, void *in, void *out, size_t total)
{
	if (m->ep == 1 && tp_t(m) == 1)
		par_cpu_memcpy(out, in, total * precision_bytes(m->t));
	else
		m->all_to_all(m->ctx, in, out, total / (size_t)m->ep);
}

/* gpt16's view of the block's attention part: its offsets, with the MLP's unused */
static GptBlockActs attention_acts(const MoeBlockActs *a)
{
	return (GptBlockActs){.x_in = a->x_in, .ln1 = a->ln1, .qkv = a->qkv, .atty = a->atty,
			      .res2 = a->res2, .ln2 = a->ln2, .att = a->att};
}

/* ---- the block ---- */

/* probs (N, E) = softmax of each row of logits, summed in double and rounded once. */
static void softmax_rows(float *probs, const float *logits, int N, int E)
{
	for (int s = 0; s < N; s++) {
		const float *l = logits + (size_t)s * E;
		float *q = probs + (size_t)s * E;
		float mx = l[0];
		for (int e = 1; e < E; e++)
			mx = l[e] > mx ? l[e] : mx;
		double sum = 0;
		for (int e = 0; e < E; e++)
			sum += exp((double)l[e] - mx);
		for (int e = 0; e < E; e++)
			q[e] = (float)(exp((double)l[e] - mx) / sum);
	}
}

#define P(f) precision_at(params, f, t)
#define A(f) precision_at(acts, a.f, t)
#define F(f) ((float *)acts + a.f)
#define S(f) precision_at(sa, a.f, t)

/* The router's fp32 operands: TopKGate's copies in 16-bit, the tensors themselves in fp32. */
static const float *gate_input(const MoeCpu *m, const MoeBlockActs *a, const void *acts)
{
	return (const float *)acts + (m->t == PREC_F32 ? a->ln2 : a->gate_x);
}

static const float *gate_weight(const MoeCpu *m, const MoeBlockActs *a, const MoeLayout *L,
				const void *params, const void *acts)
{
	return m->t == PREC_F32 ? (const float *)params + L->router :
				  (const float *)acts + a->gate_w;
}

/* y = rn(res2 + rn(sum over the kept choices of rn(w) eout)), the sum in fp32 */
static void combine(const MoeCpu *m, int N, int C, const MoeRoute *rt, const void *acts,
		    const MoeBlockActs *ap, void *y)
{
	PrecisionType t = m->t;
	MoeBlockActs a = *ap;
	const void *sa = slot_base(m, acts);
	for (int s = 0; s < N; s++) {
		float w[2]; /* each choice's weight in t (top-1 or top-2: moe_cpu_check) */
		for (int j = 0; j < m->k; j++)
			w[j] = precision_round(rt->weight[(size_t)s * m->k + j], t);
		for (int ch = 0; ch < C; ch++) {
			float v = 0;
			for (int j = 0; j < m->k; j++) {
				size_t i = (size_t)s * m->k + j;
				if (rt->slot[i] < 0)
					continue;
				size_t o = ((size_t)rt->expert[i] * m->cap + rt->slot[i]) * C + ch;
				v += w[j] * precision_load(sa, a.eout + o, t);
			}
			size_t at = (size_t)s * C + ch;
			v = precision_round(v, t) + precision_load(acts, a.res2 + at, t);
			precision_store(y, at, v, t);
		}
	}
}

long long moe_cpu_busiest(const float *logits, const float *probs, int S, int E, int k)
{
	long long count[64] = {0}, most = 0;
	for (int s = 0; s < S; s++) {
		int e1 = argmax_except(probs + (size_t)s * E, E, -1);
		count[e1]++;
		if (k == 2)
			count[argmax_except(logits + (size_t)s * E, E, e1)]++;
	}
	for (int e = 0; e < E && e < 64; e++)
		most = count[e] > most ? count[e] : most;
	return most;
}

long long moe_cpu_block_gate(const GptConfig *c, const MoeCpu *m, int B, int T, const void *params,
			     const void *x, void *acts, void *att, float *scratch)
{
	PrecisionType t = m->t;
	int N = B * T, C = c->C, E = m->E;
	size_t btc = (size_t)N * C, e = precision_bytes(t);
	MoeLayout L = moe_layout(c, m);
	MoeBlockActs a = moe_cpu_block_acts(c, m, B, T);
	GptBlockActs ga = attention_acts(&a);

	par_cpu_memcpy(A(x_in), x, btc * e);
	if (tp_t(m) > 1)
		gpt_tp_attention_forward(c, m->tp, t, B, T, &L.d, &ga, params, acts, att, m->ix,
					 scratch);
	else
		gpt16_attention_forward(c, t, B, T, &L.d, &ga, params, acts, att, m->ix);
	ops16_layernorm_forward(t, A(ln2), A(res2), P(L.d.ln2_w), P(L.d.ln2_b), N, C);
	if (t != PREC_F32) { /* TopKGate's fp32 copies */
		ops16_widen(t, F(gate_x), A(ln2), btc);
		ops16_widen(t, F(gate_w), P(L.router), (size_t)C * E);
	}
	ops_matmul_forward(F(logits), gate_input(m, &a, acts), gate_weight(m, &a, &L, params, acts),
			   NULL, N, C, E);
	softmax_rows(F(probs), F(logits), N, E);
	for (int s = 0; m->gumbel && s < N; s++) /* top2gating: logits += gumbel_rsample(...) */
		for (int j = 0; j < E; j++)
			F(logits)[(size_t)s * E + j] +=
				moe_cpu_gumbel(m->rts_stream, m->rts_first + (uint64_t)s, j);
	return m->dropless ? moe_cpu_busiest(F(logits), F(probs), N, E, m->k) : 0;
}

void moe_cpu_block_experts(const GptConfig *c, const MoeCpu *m, int B, int T, const void *params,
			   void *y, void *acts, float *scratch)
{
	PrecisionType t = m->t;
	int N = B * T, C = c->C, E = m->E, I = m->I, cap = m->cap, El = m->E / m->ep;
	size_t slots_c = (size_t)E * cap * C, e = precision_bytes(t);
	MoeLayout L = moe_layout(c, m);
	MoeBlockActs a = moe_cpu_block_acts(c, m, B, T);
	MoeRoute rt = route_in(c, m, B, T, scratch);
	void *send = scratch; /* (E, cap, C) out, then (ep, E_l, cap, C) back, of type t */
	void *sa = slot_base(m, acts);
	gate(m, F(logits), F(probs), N, &rt);

	/* dispatch: each kept choice's ln2 row to its expert's slot; empty slots stay 0 */
	par_cpu_memset(send, 0, slots_c * e);
	for (int s = 0; s < N; s++)
		for (int j = 0; j < m->k; j++) {
			size_t i = (size_t)s * m->k + j;
			if (rt.slot[i] >= 0)
				memcpy(precision_at(send, ((size_t)rt.expert[i] * cap + rt.slot[i]) * C,
						    t),
				       precision_at(acts, a.ln2 + (size_t)s * C, t), (size_t)C * e);
		}
	exchange(m, send, S(disp), slots_c);

	/* the local experts over what each source rank sent them, every slot (DeepSpeed's experts
	 * run on the whole capacity buffer, empty slots included) */
	for (int q = 0; q < m->ep; q++)
		for (int j = 0; j < El; j++) {
			size_t blk = (size_t)q * El + j;
			void *in = S(disp + blk * cap * C);
			void *fc = S(fc + blk * cap * I);
			void *ge = S(gelu + blk * cap * I);
			ops16_matmul_forward(t, fc, in, P(L.fc_w + (size_t)j * C * I),
					     P(L.fc_b + (size_t)j * I), cap, C, I);
			ops16_gelu_forward(t, ge, fc, (size_t)cap * I);
			ops16_matmul_forward(t, precision_at(send, blk * cap * C, t), ge,
					     P(L.down_w + (size_t)j * I * C),
					     P(L.down_b + (size_t)j * C), cap, I, C);
		}
	exchange(m, send, S(eout), slots_c);
	combine(m, N, C, &rt, acts, &a, y);
}

void moe_cpu_block_forward(const GptConfig *c, const MoeCpu *m, int B, int T, const void *params,
			   const void *x, void *y, void *acts, void *att, float *scratch)
{
	moe_cpu_block_gate(c, m, B, T, params, x, acts, att, scratch);
	moe_cpu_block_experts(c, m, B, T, params, y, acts, scratch);
}

/* d probs from the combine weights' gradients dw (N k), through top-1's w = p[e1] or top-2's
 * normalisation w_j = g_j / max(g_1 + g_2, eps), g_j = p[e_j] when kept, else 0. */
static void weights_backward(const MoeCpu *m, int N, const float *probs, const MoeRoute *rt,
			     const float *dw, float *dprobs)
{
	int E = m->E, k = m->k;
	par_cpu_memset(dprobs, 0, (size_t)N * E * sizeof(float));
	for (int s = 0; s < N; s++) {
		size_t i = (size_t)s * k;
		if (k == 1) {
			if (rt->slot[i] >= 0)
				dprobs[(size_t)s * E + rt->expert[i]] += dw[i];
			continue;
		}
		float g[2], sum = 0;
		for (int j = 0; j < 2; j++) {
			g[j] = rt->slot[i + j] >= 0 ? probs[(size_t)s * E + rt->expert[i + j]] : 0.0f;
			sum += g[j];
		}
		float dot = dw[i] * rt->weight[i] + dw[i + 1] * rt->weight[i + 1];
		for (int j = 0; j < 2; j++) {
			if (rt->slot[i + j] < 0)
				continue; /* g_j = 0 whatever the probability */
			float dg = sum < FLT_EPSILON ? dw[i + j] / FLT_EPSILON : (dw[i + j] - dot) / sum;
			dprobs[(size_t)s * E + rt->expert[i + j]] += dg;
		}
	}
}

/* The combine's backward: d eout = rn(rn(w) dy) at each kept choice's slot of send (type t,
 * zeroed first), dw = dy . eout there, in double. */
static void combine_backward(const MoeCpu *m, int N, int C, const MoeRoute *rt, const float *dy,
			     const void *acts, const MoeBlockActs *ap, void *send, float *dw)
{
	PrecisionType t = m->t;
	MoeBlockActs a = *ap;
	const void *sa = slot_base(m, acts);
	par_cpu_memset(send, 0, (size_t)m->E * m->cap * C * precision_bytes(t));
	for (int s = 0; s < N; s++) {
		const float *d = dy + (size_t)s * C;
		for (int j = 0; j < m->k; j++) {
			size_t i = (size_t)s * m->k + j;
			dw[i] = 0;
			if (rt->slot[i] < 0)
				continue;
			size_t at = ((size_t)rt->expert[i] * m->cap + rt->slot[i]) * C;
			float w = precision_round(rt->weight[i], t);
			double dot = 0;
			for (int ch = 0; ch < C; ch++) {
				precision_store(send, at + ch, w * d[ch], t);
				dot += (double)d[ch] * precision_load(sa, a.eout + at + ch, t);
			}
			dw[i] = (float)dot;
		}
	}
}

/* Scratch in the MLP's backward (floats): buf_a and buf_b (slots C each) hold what the
 * all-to-alls move, in t; dge and dfc (cap I each) an expert's fp32 gradients, and in 16-bit dge
 * then rn(dfc) (cap I elements of t: its first half) and the expert's fp32 input gradient (cap C
 * floats from 2 cap C, I being 4 C) before it is rounded into buf_a; dln2 (N, C), dlogits and
 * dprobs (N, E) fp32; the route at the end. */
void moe_cpu_block_scores(const GptConfig *c, const MoeCpu *m, int B, int T, void *acts,
			  void *att)
{
	PrecisionType t = m->t;
	MoeBlockActs a = moe_cpu_block_acts(c, m, B, T);
	/* the forward's arithmetic on the same kept q, k, v of this rank's heads: the same bits */
	if (m->ix)
		ops16_sparse_attention_forward(t, A(atty), att, A(qkv), m->ix, B, T, c->C / tp_t(m));
	else
		ops16_attention_forward(t, A(atty), att, A(qkv), B, T, c->C / tp_t(m),
					c->NH / tp_t(m));
}

void moe_cpu_block_backward(const GptConfig *c, const MoeCpu *m, int B, int T,
			    const void *params, float *grads, const void *acts, const void *att,
			    const float *dy, float *dx, float *scratch)
{
	PrecisionType t = m->t;
	int N = B * T, C = c->C, E = m->E, I = m->I, cap = m->cap, El = m->E / m->ep, k = m->k;
	size_t btc = (size_t)N * C, slots_c = (size_t)E * cap * C, capc = (size_t)cap * C;
	MoeLayout L = moe_layout(c, m);
	MoeBlockActs a = moe_cpu_block_acts(c, m, B, T);
	GptBlockActs ga = attention_acts(&a);
	MoeRoute rt = route_in(c, m, B, T, scratch);
	float *buf_a = scratch, *buf_b = scratch + slots_c;           /* slots C each */
	float *dge = buf_b + slots_c, *dfc = dge + (size_t)cap * I;   /* cap I each */
	float *dln2 = dfc + (size_t)cap * I, *dlogits = dln2 + btc;   /* (N, C), (N, E) */
	float *dprobs = dlogits + (size_t)N * E;                      /* (N, E) */
	float *dw = dlogits; /* the weights' gradients (N k <= N E) until the router's backward */
	float *din = dge + 2 * capc; /* an expert's input gradient, dge's second half */
	const void *sa = slot_base(m, acts);

	gate(m, F(logits), F(probs), N, &rt);
	combine_backward(m, N, C, &rt, dy, acts, &a, buf_a, dw);
	weights_backward(m, N, F(probs), &rt, dw, dprobs);

	/* the combine's gradient back to the experts, their backward, the dispatch's back */
	exchange(m, buf_a, buf_b, slots_c);
	for (int q = 0; q < m->ep; q++)
		for (int j = 0; j < El; j++) {
			size_t blk = (size_t)q * El + j;
			const void *dout = precision_at(buf_b, blk * capc, t);
			par_cpu_memset(dge, 0, (size_t)cap * I * sizeof(float));
			ops16_matmul_backward(t, dge, grads + L.down_w + (size_t)j * I * C,
					      grads + L.down_b + (size_t)j * C, dout,
					      S(gelu + blk * cap * I),
					      P(L.down_w + (size_t)j * I * C), cap, I, C);
			par_cpu_memset(dfc, 0, (size_t)cap * I * sizeof(float));
			ops16_gelu_backward(t, dfc, dge, S(fc + blk * cap * I), (size_t)cap * I);
			const void *dfc_t = dfc;
			if (t != PREC_F32) {
				ops16_round(t, dge, dfc, (size_t)cap * I);
				dfc_t = dge;
			}
			par_cpu_memset(din, 0, capc * sizeof(float));
			ops16_matmul_backward(t, din, grads + L.fc_w + (size_t)j * C * I,
					      grads + L.fc_b + (size_t)j * I, dfc_t,
					      S(disp + blk * capc), P(L.fc_w + (size_t)j * C * I),
					      cap, C, I);
			ops16_round(t, precision_at(buf_a, blk * capc, t), din, capc);
		}
	exchange(m, buf_a, buf_b, slots_c);
	par_cpu_memset(dln2, 0, btc * sizeof(float));
	for (int s = 0; s < N; s++)
		for (int j = 0; j < k; j++) {
			size_t i = (size_t)s * k + j;
			if (rt.slot[i] < 0)
				continue;
			size_t g = ((size_t)rt.expert[i] * cap + rt.slot[i]) * C;
			float *d = dln2 + (size_t)s * C;
			for (int ch = 0; ch < C; ch++)
				d[ch] += precision_load(buf_b, g + ch, t);
		}

	/* the router: softmax's backward, then logits = ln2 wg on the fp32 operands */
	for (int s = 0; s < N; s++) {
		const float *p = F(probs) + (size_t)s * E;
		const float *dp = dprobs + (size_t)s * E;
		double dot = 0;
		for (int e = 0; e < E; e++)
			dot += (double)p[e] * dp[e];
		for (int e = 0; e < E; e++)
			dlogits[(size_t)s * E + e] = (float)(p[e] * (dp[e] - dot));
	}
	ops_matmul_backward(dln2, grads + L.router, NULL, dlogits, gate_input(m, &a, acts),
			    gate_weight(m, &a, &L, params, acts), N, C, E);

	/* norm2, then the attention branch, as gpt16_block_backward; the route's arrays sit at
	 * the scratch's end, which the attention's 7 N C do not reach */
	if (dx != dy)
		par_cpu_memcpy(dx, dy, btc * sizeof(float));
	ops16_layernorm_backward(t, dx, grads + L.d.ln2_w, grads + L.d.ln2_b, dln2, A(res2),
				 P(L.d.ln2_w), N, C);
	if (tp_t(m) > 1)
		gpt_tp_attention_backward(c, m->tp, t, B, T, &L.d, &ga, params, grads, acts, att,
					  m->ix, dx, scratch);
	else
		gpt16_attention_backward(c, t, B, T, &L.d, &ga, params, grads, acts, att, m->ix, dx,
					 scratch);
}
#undef P
#undef A
#undef F
#undef S

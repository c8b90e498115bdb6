#include "infer_replay.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "infer_sim.h"
#include "kv_blocks.h"

/* Costs: a prefill by prompt length, priced once each (the trace's lengths; a preempted
 * sequence's longer one each time); a decode step as it comes, from the plan's per-unit parts. */
typedef struct Costs {
	const InferScenario *sc;
	const HwProfile *hw;
	const InferPlan *plan;
	long long *lengths; /* the trace's distinct prompt lengths, ascending */
	double *prefill_s;  /* each one's prefill, < 0 until priced */
	long long n_lengths;
	long long priced;
} Costs;

static int cmp_ll(const void *a, const void *b)
{
	long long x = *(const long long *)a, y = *(const long long *)b;
	return (x > y) - (x < y);
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static double price_prefill(Costs *c, long long tokens, PxError *err)
{
	InferScenario one = *c->sc; /* shallow: only the workload's prompt differs */
	one.wl.prompt_tokens = tokens;
	InferPhase pf, dec;
	if (infer_price_batch(&one, c->hw, 1, &pf, &dec, err))
		return -1;
	c->priced++;
	return pf.s;
}

static double prefill_of(Costs *c, long long tokens, PxError *err)
{
	long long lo = 0, hi = c->n_lengths - 1;
	while (lo < hi) {
		long long mid = (lo + hi) / 2;
		if (c->lengths[mid] < tokens)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (c->lengths[lo] != tokens) /* a preempted sequence's prompt and output so far */
		return price_prefill(c, tokens, err);
	if (c->prefill_s[lo] < 0)
		c->prefill_s[lo] = price_prefill(c, tokens, err);
	return c->prefill_s[lo];
}

/* A decode step of n sequences holding held tokens in all: one ragged forward of n decoding
 * tokens at their mean context, which prices the sum of their contexts exactly (attention and
 * the cache's traffic are linear in each one's), and is the schedule's decode step
 * (infer_build_ragged). */
static double step_of(Costs *c, long long n, long long held, PxError *err)
{
	InferRagged g = {.decode_seqs = n, .decode_ctx = (double)held / (double)n,
			 .logit_rows = (double)n};
	InferPhase ph;
	return infer_price_ragged(c->plan, c->hw, &g, &ph, err) ? -1 : ph.s;
}

/* A request in flight on a replica, in admission order. */
typedef struct Live {
	long long req, made; /* its index; tokens it has generated */
	double first_s;      /* when its first token came */
	long long pending;   /* split_fuse: prompt tokens (and recomputed ones) still to prefill;
				0 once it decodes */
	long long held;      /* split_fuse: tokens it holds in the cache */
	long long step;      /* split_fuse: tokens this forward gives it (0: none) */
	long long nblk;      /* vllm_v1: the blocks of its table it references (V1Cache) */
	long long named;     /* vllm_v1, prefix caching: its leading blocks whose content is
				named (full, cached) */
} Live;

/* vLLM V1's KV cache (KVCacheManager over a BlockPool: kv_blocks.h), block by block. A request
 * holds a table of blocks; each full block is named by its content when the step that fills it
 * is scheduled (allocate_slots' cache_blocks), and with prefix caching (enable_prefix_caching) a
 * request admitted finds the leading blocks whose content is still in the cache, short of its last
 * token (get_computed_blocks). Content is a trace's prefix group's leading blocks (the full
 * blocks of a request's prefix_tokens, the same for every request of its prefix id) or a
 * request's own (the rest of its prompt, its outputs: found again only by the request itself,
 * after a preemption). Blocks are freed tail first (KVCacheManager.free), so that an evicted
 * chain loses its end before its start, and taken least recently freed first. The pool's first
 * block is BlockPool's null block, a placeholder no request gets. */
typedef struct V1Cache {
	KvBlocks pool;
	int caching;          /* enable_prefix_caching */
	long long *grp;       /* by request: its prefix group, -1 without (NULL: no groups) */
	long long n_grp;
	long long *off;       /* (n_grp + 1) group g's block b has key off[g] + b */
	long long *gwhere;    /* (off[n_grp]) by group key: the first block holding it, -1 none */
	long long *same;      /* (blocks) by block: the next block holding its group key, -1
				 none (two requests may compute one block: vLLM keeps both under
				 its hash, and a lookup takes the first there) */
	long long own_stride; /* request q's own block b has key off[n_grp] + q own_stride + b */
	long long **tab;      /* by request: its block table (-1: none yet), while it runs or
				 waits preempted; NULL otherwise */
	long long dup_tokens; /* tokens of full blocks that more than one running request holds,
				 counted once per holder after the first */
} V1Cache;

typedef struct Replica {
	const InferTrace *t;
	const InferReplayRoom *room;
	Costs *c;
	Live *live;
	long long n_live, used;       /* running sequences; tokens in their cache */
	long long blocks, total, keep; /* blocks they take; the cache's; the watermark's */
	long long *again, n_again;    /* preempted requests, waiting first (oldest first) */
	long long *made;              /* by request: tokens made before a preemption */
	double *first;                /* by request: its first token's time, < 0 before */
	double *ttft, *latency, *tpot; /* tpot: one per request that made more than one token */
	long long tpot_n;
	InferReplay *out;
	long long *wait, n_wait;      /* split_fuse: arrived requests not running, in order */
	int v1;                       /* vllm_v1: blocks counted in vc, taken at scheduling */
	V1Cache vc;
} Replica;

/* The tokens a running sequence holds in the cache: its prompt and every token it made but the
 * newest, which the next step writes. */
static long long context(const Replica *r, const Live *l)
{
	return r->t->req[l->req].prompt_tokens + l->made - 1;
}

/* The blocks `tokens` cached tokens take. */
static long long blocks_of(const Replica *r, long long tokens)
{
	return (tokens + r->room->block - 1) / r->room->block;
}

static void note_peaks(Replica *r)
{
	long long used = r->used - r->vc.dup_tokens; /* a shared block's tokens once */
	if (used > r->out->peak_kv_tokens)
		r->out->peak_kv_tokens = used;
	if (r->blocks > r->out->peak_kv_blocks)
		r->out->peak_kv_blocks = r->blocks;
}

/* A sequence's tokens (and their blocks) into the cache, or out of it (tokens < 0). */
static void hold(Replica *r, long long tokens)
{
	long long b = blocks_of(r, tokens < 0 ? -tokens : tokens);
	r->used += tokens;
	r->blocks += tokens < 0 ? -b : b;
	note_peaks(r);
}

/* Admit request q (made tokens made before a preemption): prefill its prompt and those tokens,
 * alone, which makes one more. */
static int admit(Replica *r, long long q, double *now, PxError *err)
{
	const InferRequest *x = &r->t->req[q];
	long long cached = x->prompt_tokens + r->made[q];
	double pf = prefill_of(r->c, cached, err);
	if (pf < 0)
		return -1;
	*now += pf;
	r->out->forwards++;
	hold(r, cached);
	r->made[q]++;
	if (r->first[q] < 0) {
		r->first[q] = *now;
		r->ttft[q] = *now - x->arrival_s;
	}
	if (r->made[q] >= x->output_tokens) {
		r->latency[q] = *now - x->arrival_s;
		hold(r, -cached);
		return 0;
	}
	r->live[r->n_live++] = (Live){q, r->made[q], r->first[q], 0, 0, 0, 0, 0};
	if (r->n_live > r->out->peak_concurrency)
		r->out->peak_concurrency = r->n_live;
	return 0;
}

/* The blocks request q's prompt (and what it made) takes when admitted. */
static long long needs(const Replica *r, long long q)
{
	return blocks_of(r, r->t->req[q].prompt_tokens + r->made[q]);
}

/* Whether request q fits beside the running sequences, leaving the watermark's blocks free
 * (vLLM's BlockSpaceManager.can_allocate). */
static int fits(const Replica *r, long long q)
{
	return r->n_live < r->room->max_seqs && r->total - r->blocks - needs(r, q) >= r->keep;
}

/* The running sequences whose next token needs a new block: their last one is full. */
static long long new_blocks(const Replica *r)
{
	long long n = 0;
	for (long long k = 0; k < r->n_live; k++)
		n += context(r, &r->live[k]) % r->room->block == 0;
	return n;
}

/* One decode step: first make room for each sequence's token, preempting the last admitted
 * (vLLM's can_append_slots, then _preempt by recompute). */
static int decode(Replica *r, double *now, PxError *err)
{
	while (r->n_live > 1 && new_blocks(r) > r->total - r->blocks) {
		Live *l = &r->live[--r->n_live];
		hold(r, -context(r, l));
		r->made[l->req] = l->made;
		r->again[r->n_again++] = l->req;
		r->out->preemptions++;
	}
	double step = step_of(r->c, r->n_live, r->used, err);
	if (step < 0)
		return -1;
	*now += step;
	r->out->forwards++;
	r->blocks += new_blocks(r); /* each sequence's newest token written */
	r->used += r->n_live;
	note_peaks(r);
	long long kept = 0;
	for (long long k = 0; k < r->n_live; k++) {
		Live *l = &r->live[k];
		const InferRequest *x = &r->t->req[l->req];
		if (++l->made < x->output_tokens) {
			r->live[kept++] = *l;
			continue;
		}
		r->latency[l->req] = *now - x->arrival_s;
		r->tpot[r->tpot_n++] = (*now - l->first_s) / (double)(x->output_tokens - 1);
		hold(r, -context(r, l));
	}
	r->n_live = kept;
	return 0;
}

/* Request q's prompt (and what it made before a preemption) does not fit the empty cache: refused,
 * naming the trace and the request. */
static int too_long(const Replica *r, long long q, PxError *err)
{
	long long usable = r->total - r->v1; /* vLLM V1's null block aside */
	return px_fail(err, PX_ERR_INPUT, "%s: request %lld (prompt %lld tokens): longer than the KV "
		       "cache's %lld tokens (%lld blocks of %lld, %lld of them kept free at admission)",
		       r->t->path, q + 1, r->t->req[q].prompt_tokens, usable * r->room->block,
		       usable, r->room->block, r->keep);
}

/* One replica's requests (every replicas-th from first) through the loop. */
static int run_replica(Replica *r, long long first, PxError *err)
{
	const InferTrace *t = r->t;
	long long step = r->room->replicas, next = first, queued = first;
	double now = t->req[first].arrival_s;
	r->n_live = r->used = r->blocks = r->n_again = 0;
	while (queued < t->n || r->n_live > 0 || r->n_again > 0) {
		while (next < t->n && t->req[next].arrival_s <= now)
			next += step;
		if (r->n_again > 0 && fits(r, r->again[0])) {
			long long q = r->again[0];
			memmove(r->again, r->again + 1, (size_t)--r->n_again * sizeof(*r->again));
			if (admit(r, q, &now, err))
				return -1;
			continue;
		}
		if (!r->n_again && queued < next) {
			if (fits(r, queued)) {
				if (admit(r, queued, &now, err))
					return -1;
				queued += step;
				continue;
			}
			if (r->ttft[queued] == -2) /* counted once */
				r->ttft[queued] = -3, r->out->waited_for_room++;
		}
		if (r->n_live > 0) {
			if (decode(r, &now, err))
				return -1;
			continue;
		}
		if (r->n_again > 0 || queued < next) /* nothing runs, and the first in line does
							not fit an empty cache */
			return too_long(r, r->n_again ? r->again[0] : queued, err);
		now = t->req[queued].arrival_s; /* idle until the next arrival */
	}
	if (now - t->req[0].arrival_s > r->out->makespan_s)
		r->out->makespan_s = now - t->req[0].arrival_s;
	return 0;
}

/* ---- Dynamic SplitFuse (InferWorkload.split_fuse), as DeepSpeed-MII's RaggedBatchBase
 * schedules FastGen's forwards (mii/batching/ragged_batching.py, schedule_requests): each forward
 * first gives every decoding sequence its next token (_schedule_token_gen: one whose last block
 * is full needs a free one, else it waits this forward), then fills what is left of
 * max_ragged_batch_size with prompt tokens (_schedule_prompts), in order: the running prompts'
 * remainders, then the waiting requests; a prompt goes ahead only while the free blocks hold all
 * it has left, and takes as much of it as the budget leaves (a chunk; the rest waits for the next
 * forward), the blocks its chunk fills taken as it goes. A prompt whose last chunk runs makes its
 * first token. When nothing can run, the request admitted last gives its cache back and waits
 * again behind every request already arrived, to be prefilled over its prompt and what it had
 * made (reset_request_status). The forward is priced as one ragged batch (infer_price_ragged).
 * ---- */

/* The blocks a sequence's next `tokens` would take. */
static long long more_blocks(const Replica *r, const Live *l, long long tokens)
{
	return blocks_of(r, l->held + tokens) - blocks_of(r, l->held);
}

/* Request q's prefix group, -1 for none (or no prefix caching). */
static long long group_of(const Replica *r, long long q)
{
	return r->vc.grp ? r->vc.grp[q] : -1;
}

/* The full blocks of request q's own prefix. */
static long long prefix_blocks(const Replica *r, long long q)
{
	return r->t->req[q].prefix_tokens / r->room->block;
}

/* The key of the content of request q's block b: its group's, within its prefix's full blocks,
 * else its own. */
static long long v1_key(const Replica *r, long long q, long long b)
{
	const V1Cache *x = &r->vc;
	long long g = group_of(r, q);
	if (g >= 0 && b < prefix_blocks(r, q))
		return x->off[g] + b;
	return x->off[x->n_grp] + q * x->own_stride + b;
}

/* The block that holds the content of request q's block b, -1 when none does. */
static long long v1_find(const Replica *r, long long q, long long b)
{
	const V1Cache *x = &r->vc;
	long long k = v1_key(r, q, b);
	if (k < x->off[x->n_grp])
		return x->gwhere[k];
	long long id = x->tab[q] ? x->tab[q][b] : -1;
	return id >= 0 && x->pool.key[id] == k ? id : -1;
}

/* Block id, evicted, out of the blocks that hold group key k. */
static void unlist(V1Cache *x, long long k, long long id)
{
	long long *at = &x->gwhere[k];
	while (*at != id)
		at = &x->same[*at];
	*at = x->same[id];
}

/* Sequence l's blocks for its next c tokens, taken from the free queue (evicting what they
 * held), and with prefix caching the blocks those tokens fill named by their content (a group's
 * block another holds already: listed after it). */
static void v1_allocate(Replica *r, Live *l, long long c)
{
	V1Cache *x = &r->vc;
	long long q = l->req, *tab = x->tab[q], dropped;
	for (long long need = blocks_of(r, l->held + c); l->nblk < need; l->nblk++) {
		tab[l->nblk] = kv_blocks_take(&x->pool, &dropped);
		if (dropped >= 0 && dropped < x->off[x->n_grp])
			unlist(x, dropped, tab[l->nblk]);
	}
	for (long long full = (l->held + c) / r->room->block; x->caching && l->named < full;
	     l->named++) {
		long long k = v1_key(r, q, l->named), id = tab[l->named];
		x->pool.key[id] = k;
		if (k >= x->off[x->n_grp])
			continue;
		long long *at = &x->gwhere[k]; /* the last of the blocks holding k */
		while (*at >= 0)
			at = &x->same[*at];
		*at = id, x->same[id] = -1;
	}
	r->blocks = x->pool.n - x->pool.n_free - 1; /* the null block aside */
}

/* A sequence's next `tokens` into the cache, the blocks they fill taken as they come (vLLM V1's
 * already, by v1_allocate). */
static void grow(Replica *r, Live *l, long long tokens)
{
	if (!r->v1)
		r->blocks += more_blocks(r, l, tokens);
	r->used += tokens;
	l->held += tokens;
	note_peaks(r);
}

/* Sequence l's tokens out of the cache: its blocks freed (vLLM V1's tail first, kept in its
 * table for a preempted request to find its own again). */
static void release(Replica *r, Live *l)
{
	r->used -= l->held;
	if (!r->v1) {
		r->blocks -= blocks_of(r, l->held);
		return;
	}
	V1Cache *x = &r->vc;
	for (long long b = l->nblk - 1; b >= 0; b--) {
		long long id = x->tab[l->req][b];
		if (x->pool.ref[id] > 1)
			x->dup_tokens -= r->room->block;
		kv_blocks_drop(&x->pool, id);
	}
	l->nblk = l->named = 0;
	r->blocks = x->pool.n - x->pool.n_free - 1; /* the null block aside */
}

/* Finished sequence l's own blocks unnamed: no one finds them now (its group's stay). */
static void v1_forget(Replica *r, const Live *l)
{
	V1Cache *x = &r->vc;
	for (long long b = 0; b < l->nblk; b++) {
		long long id = x->tab[l->req][b];
		if (x->pool.key[id] >= x->off[x->n_grp])
			x->pool.key[id] = -1;
	}
}

/* Live entry k leaves the cache and the running list. */
static void leave(Replica *r, long long k)
{
	Live *l = &r->live[k];
	release(r, l);
	memmove(l, l + 1, (size_t)(r->n_live - k - 1) * sizeof(*l));
	r->n_live--;
}

/* The first waiting request joins the running list, all its prompt (and what it had made before
 * a preemption) to prefill. */
static Live *join(Replica *r)
{
	long long q = r->wait[0];
	memmove(r->wait, r->wait + 1, (size_t)--r->n_wait * sizeof(*r->wait));
	Live *l = &r->live[r->n_live++];
	*l = (Live){q, r->made[q], r->first[q], r->t->req[q].prompt_tokens + r->made[q], 0, 0, 0, 0};
	if (r->n_live > r->out->peak_concurrency)
		r->out->peak_concurrency = r->n_live;
	return l;
}

/* The next prompt in line from live entry *k on, joining a waiting request when no running one
 * is left; NULL when none may go ahead (its blocks: it waits for room). */
static Live *next_prompt(Replica *r, long long *k, long long free)
{
	while (*k < r->n_live && r->live[*k].pending == 0)
		(*k)++;
	if (*k < r->n_live)
		return &r->live[(*k)++];
	if (!r->n_wait || r->n_live >= r->room->max_seqs)
		return NULL;
	long long q = r->wait[0];
	if (needs(r, q) > free - r->keep) {
		if (r->ttft[q] == -2) /* counted once */
			r->ttft[q] = -3, r->out->waited_for_room++;
		return NULL;
	}
	*k = r->n_live + 1;
	return join(r);
}

/* Compose one forward into g: the decoding sequences' tokens, then the prompts' chunks. */
static void compose(Replica *r, InferRagged *g)
{
	const InferWorkload *wl = &r->c->sc->wl;
	long long budget = wl->token_budget, seqs = 0, free = r->total - r->blocks;
	double ctx = 0;
	memset(g, 0, sizeof(*g));
	for (long long k = 0; k < r->n_live; k++) {
		Live *l = &r->live[k];
		l->step = 0;
		if (l->pending || seqs >= wl->max_ragged_seqs || seqs >= budget)
			continue;
		if (l->held % r->room->block == 0) { /* its last block is full */
			if (free == 0)
				continue;
			free--;
		}
		l->step = 1, seqs++, budget--;
		g->decode_seqs++;
		ctx += (double)l->held;
	}
	g->decode_ctx = g->decode_seqs ? ctx / (double)g->decode_seqs : 0;
	g->logit_rows = g->decode_seqs;
	long long k = 0;
	while (budget > 0 && free > 0 && seqs < wl->max_ragged_seqs) {
		Live *l = next_prompt(r, &k, free);
		if (!l || more_blocks(r, l, l->pending) > free)
			break;
		long long c = l->pending < budget ? l->pending : budget;
		free -= more_blocks(r, l, c);
		l->step = c, seqs++, budget -= c;
		g->chunk_tokens += c;
		g->chunk_prior += (double)l->held;
		g->chunk_pairs += (double)c * (double)l->held + (double)c * (double)(c + 1) / 2;
		g->logit_rows += c == l->pending;
	}
}

/* After the forward that ended at now: each sequence's tokens cached (all at once, the peak's
 * moment), those that made a token noted, the finished ones gone. */
static void advance(Replica *r, double now)
{
	for (long long k = 0; k < r->n_live; k++)
		if (r->live[k].step > 0)
			grow(r, &r->live[k], r->live[k].step);
	long long kept = 0;
	for (long long k = 0; k < r->n_live; k++) {
		Live *l = &r->live[k];
		const InferRequest *x = &r->t->req[l->req];
		long long q = l->req, c = l->step;
		if (c > 0 && l->pending > 0)
			l->pending -= c;
		if (c == 0 || l->pending > 0) { /* nothing made this forward */
			r->live[kept++] = *l;
			continue;
		}
		l->made++;
		if (r->first[q] < 0) {
			r->first[q] = l->first_s = now;
			r->ttft[q] = now - x->arrival_s;
		}
		if (l->made < x->output_tokens) {
			r->live[kept++] = *l;
			continue;
		}
		r->latency[q] = now - x->arrival_s;
		if (x->output_tokens > 1)
			r->tpot[r->tpot_n++] = (now - l->first_s) / (double)(x->output_tokens - 1);
		if (r->v1)
			v1_forget(r, l);
		release(r, l);
		if (r->v1)
			free(r->vc.tab[q]), r->vc.tab[q] = NULL;
	}
	r->n_live = kept;
}

/* Nothing could run: the last admitted sequence holding cache gives it back and waits again. */
static void flush_last(Replica *r)
{
	long long k = r->n_live - 1;
	while (k > 0 && r->live[k].held == 0)
		k--;
	r->made[r->live[k].req] = r->live[k].made;
	r->wait[r->n_wait++] = r->live[k].req;
	leave(r, k);
	r->out->preemptions++;
}

/* ---- vLLM V1's scheduler (InferWorkload.scheduler SCHED_VLLM_V1), as vllm/v1/core/sched/
 * scheduler.py's Scheduler.schedule forms a step under FCFS (to v0.11): the running requests in
 * admission order, each given what it has left to compute (a prompt's rest, chunked to what the
 * budget of max_num_batched_tokens leaves, or one token to decode) and the blocks those tokens
 * fill (KVCacheManager.allocate_slots: while any are free); where they do not fit, the request
 * admitted last is preempted (its blocks freed, it waits first in line, to be computed again over
 * its prompt and what it had made), until they fit or the request itself is the one preempted,
 * which ends the running pass. Then, in a step that preempted none, the waiting requests in
 * order, while the budget lasts and fewer than max_num_seqs run, each with its first chunk's
 * blocks (not its whole prompt's: a later chunk may preempt); the first that does not fit ends
 * the pass. One ragged forward, as FastGen's (infer_price_ragged). ---- */

/* The running request admitted last gives its blocks back and waits first in line
 * (Scheduler._preempt_request: waiting.prepend_request). */
static void preempt_last(Replica *r)
{
	long long k = r->n_live - 1;
	memmove(r->wait + 1, r->wait, (size_t)r->n_wait * sizeof(*r->wait));
	r->wait[0] = r->live[k].req;
	r->n_wait++;
	r->made[r->live[k].req] = r->live[k].made;
	leave(r, k);
	r->out->preemptions++;
}

/* Sequence l's c tokens into forward g: a decoding token, or a chunk of its prompt. */
static void take_tokens(InferRagged *g, Live *l, long long c, double *ctx)
{
	l->step = c;
	if (l->pending == 0) {
		g->decode_seqs++;
		*ctx += (double)l->held;
		return;
	}
	g->chunk_tokens += c;
	g->chunk_prior += (double)l->held;
	g->chunk_pairs += (double)c * (double)l->held + (double)c * (double)(c + 1) / 2;
	g->logit_rows += c == l->pending;
}

/* The leading blocks request q finds cached when admitted with all tokens to compute, at most
 * all - 1 tokens' (get_computed_blocks: the last token is computed whatever is cached): its
 * group's, then its own from before a preemption, up to the first not there. *reuse: how many
 * of them no request references (free but kept: admitting q takes them from the free). */
static long long cache_hits(const Replica *r, long long q, long long all, long long *reuse)
{
	long long hit = 0, lim = (all - 1) / r->room->block, id;
	*reuse = 0;
	while (r->vc.caching && hit < lim && (id = v1_find(r, q, hit)) >= 0) {
		*reuse += r->vc.pool.ref[id] == 0;
		hit++;
	}
	return hit;
}

/* Request q joins the running list with the hit leading blocks it found (each one more
 * reference, off the free queue if none had one), its table made on its first admission. NULL
 * out of memory. */
static Live *v1_join(Replica *r, long long q, long long hit)
{
	V1Cache *x = &r->vc;
	long long nb = blocks_of(r, r->t->req[q].prompt_tokens + r->t->req[q].output_tokens);
	if (!x->tab[q]) {
		if (!(x->tab[q] = malloc((size_t)nb * sizeof(**x->tab))))
			return NULL;
		for (long long b = 0; b < nb; b++)
			x->tab[q][b] = -1;
	}
	for (long long b = 0; b < hit; b++) { /* the same blocks v1_find gave cache_hits */
		long long id = v1_find(r, q, b);
		if (x->pool.ref[id] > 0)
			x->dup_tokens += r->room->block;
		kv_blocks_touch(&x->pool, id);
		x->tab[q][b] = id;
	}
	Live *l = join(r);
	l->held = hit * r->room->block, l->nblk = l->named = hit;
	l->pending -= l->held;
	r->used += l->held;
	r->out->prefix_hit_tokens += l->held;
	return l;
}

/* Compose one vLLM V1 step into g, each request's blocks taken as it is scheduled; 1 when the
 * only running request outgrows the cache (it preempted itself alone), 0, or -1 out of
 * memory. */
static int compose_v1(Replica *r, InferRagged *g)
{
	long long budget = r->c->sc->wl.token_budget;
	const long long *free = &r->vc.pool.n_free;
	double ctx = 0;
	int preempted = 0;
	memset(g, 0, sizeof(*g));
	for (long long k = 0; k < r->n_live; k++)
		r->live[k].step = 0;
	for (long long k = 0; k < r->n_live && budget > 0; k++) {
		Live *l = &r->live[k];
		long long c = l->pending == 0 ? 1 : l->pending < budget ? l->pending : budget;
		while (more_blocks(r, l, c) > *free && k < r->n_live) {
			if (r->n_live == 1)
				return 1;
			preempt_last(r);
			preempted = 1;
		}
		if (k >= r->n_live) /* it was the one preempted */
			break;
		budget -= c;
		take_tokens(g, l, c, &ctx);
		v1_allocate(r, l, c);
	}
	while (!preempted && budget > 0 && r->n_wait && r->n_live < r->room->max_seqs) {
		long long q = r->wait[0], all = r->t->req[q].prompt_tokens + r->made[q];
		long long reuse, hit = cache_hits(r, q, all, &reuse);
		long long rest = all - hit * r->room->block, c = rest < budget ? rest : budget;
		if (blocks_of(r, c) + reuse > *free - r->keep) {
			if (r->ttft[q] == -2) /* counted once */
				r->ttft[q] = -3, r->out->waited_for_room++;
			break;
		}
		Live *l = v1_join(r, q, hit);
		if (!l)
			return -1;
		budget -= c;
		take_tokens(g, l, c, &ctx);
		v1_allocate(r, l, c);
	}
	g->decode_ctx = g->decode_seqs ? ctx / (double)g->decode_seqs : 0;
	g->logit_rows += g->decode_seqs;
	return 0;
}

/* Request q, running alone, outgrows the cache with its outputs: refused, naming it. */
static int outgrows(const Replica *r, long long q, PxError *err)
{
	const InferTrace *t = r->t;
	long long usable = r->total - r->v1; /* vLLM V1's null block aside */
	return px_fail(err, PX_ERR_INPUT, "%s: request %lld (prompt %lld, output %lld tokens): "
		       "longer than the KV cache's %lld tokens (%lld blocks of %lld)", t->path, q + 1,
		       t->req[q].prompt_tokens, t->req[q].output_tokens, usable * r->room->block,
		       usable, r->room->block);
}

/* One replica's requests (every replicas-th from first) through FastGen's forwards, or vLLM
 * V1's steps. */
static int run_replica_fused(Replica *r, long long first, PxError *err)
{
	const InferTrace *t = r->t;
	int v1 = r->c->sc->wl.scheduler == SCHED_VLLM_V1;
	long long step = r->room->replicas, next = first;
	double now = t->req[first].arrival_s;
	r->n_live = r->used = r->blocks = r->n_wait = 0;
	if (v1) { /* each replica's cache starts empty, but for BlockPool's null block (its
		     first, a placeholder no request gets) */
		long long none;
		kv_blocks_reset(&r->vc.pool);
		kv_blocks_take(&r->vc.pool, &none);
		for (long long k = 0; k < r->vc.off[r->vc.n_grp]; k++)
			r->vc.gwhere[k] = -1;
		r->vc.dup_tokens = 0;
	}
	for (;;) {
		for (; next < t->n && t->req[next].arrival_s <= now; next += step)
			r->wait[r->n_wait++] = next;
		if (!r->n_live && !r->n_wait) {
			if (next >= t->n)
				break;
			now = t->req[next].arrival_s; /* idle until the next arrival */
			continue;
		}
		InferRagged g;
		InferPhase ph;
		int rc = v1 ? compose_v1(r, &g) : 0;
		if (rc < 0)
			return px_fail(err, PX_ERR_RUNTIME, "out of memory");
		if (rc)
			return outgrows(r, r->live[0].req, err);
		if (!v1)
			compose(r, &g);
		if (g.decode_seqs + g.chunk_tokens == 0) {
			if (r->n_live > 1) {
				flush_last(r);
				continue;
			}
			if (r->n_live == 1) /* alone, and still no room */
				return outgrows(r, r->live[0].req, err);
			return too_long(r, r->wait[0], err); /* nor an empty cache the first */
		}
		if (infer_price_ragged(r->c->plan, r->c->hw, &g, &ph, err))
			return -1;
		now += ph.s;
		r->out->forwards++;
		advance(r, now);
	}
	if (now - t->req[0].arrival_s > r->out->makespan_s)
		r->out->makespan_s = now - t->req[0].arrival_s;
	if (v1)
		r->out->prefix_evicted_blocks += r->vc.pool.evicted;
	return 0;
}

/* The trace's distinct prompt lengths into c (allocated; the caller frees c->lengths and
 * c->prefill_s), none priced yet. */
static int distinct_lengths(const InferTrace *t, Costs *c)
{
	long long n = t->n;
	c->lengths = malloc((size_t)n * sizeof(*c->lengths));
	c->prefill_s = malloc((size_t)n * sizeof(*c->prefill_s));
	if (!c->lengths || !c->prefill_s)
		return -1;
	for (long long i = 0; i < n; i++)
		c->lengths[i] = t->req[i].prompt_tokens;
	qsort(c->lengths, (size_t)n, sizeof(*c->lengths), cmp_ll);
	c->n_lengths = 0;
	for (long long i = 0; i < n; i++)
		if (!i || c->lengths[i] != c->lengths[c->n_lengths - 1])
			c->lengths[c->n_lengths++] = c->lengths[i];
	for (long long i = 0; i < c->n_lengths; i++)
		c->prefill_s[i] = -1;
	return 0;
}

/* The trace's prefix groups into x->grp, x->n_grp and x->off (allocated): its distinct prefix
 * ids other than 0, each with room for the longest prefix of its requests in blocks of
 * `block`. 0, or -1 out of memory. */
static int groups_make(const InferTrace *t, long long block, V1Cache *x)
{
	long long n = t->n, *ids = malloc((size_t)n * sizeof(*ids)), k = 0;
	x->grp = malloc((size_t)n * sizeof(*x->grp));
	if (!ids || !x->grp) {
		free(ids);
		return -1;
	}
	for (long long i = 0; i < n; i++)
		if (t->req[i].prefix_id)
			ids[k++] = t->req[i].prefix_id;
	qsort(ids, (size_t)k, sizeof(*ids), cmp_ll);
	for (long long i = 0; i < k; i++)
		if (!i || ids[i] != ids[x->n_grp - 1])
			ids[x->n_grp++] = ids[i];
	if (!(x->off = calloc((size_t)x->n_grp + 1, sizeof(*x->off)))) {
		free(ids);
		return -1;
	}
	for (long long i = 0; i < n; i++) { /* each group's longest prefix, in off[g + 1] */
		x->grp[i] = -1;
		if (!t->req[i].prefix_id)
			continue;
		long long lo = 0, hi = x->n_grp - 1, nb = t->req[i].prefix_tokens / block;
		while (lo < hi) {
			long long mid = (lo + hi) / 2;
			if (ids[mid] < t->req[i].prefix_id)
				lo = mid + 1;
			else
				hi = mid;
		}
		x->grp[i] = lo;
		if (nb > x->off[lo + 1])
			x->off[lo + 1] = nb;
	}
	free(ids);
	for (long long g = 0; g < x->n_grp; g++)
		x->off[g + 1] += x->off[g];
	return 0;
}

/* vLLM V1's cache of `blocks` blocks for trace t into x (allocated; v1_cache_free frees it),
 * with the trace's prefix groups when caching and the trace names them. 0, or -1 out of
 * memory. */
static int v1_cache_make(const InferTrace *t, long long block, long long blocks, int caching,
			 V1Cache *x)
{
	memset(x, 0, sizeof(*x));
	x->caching = caching;
	if (caching && t->prefixes ? groups_make(t, block, x) :
	    !(x->off = calloc(1, sizeof(*x->off))))
		return -1;
	for (long long q = 0; q < t->n; q++) {
		long long nb = (t->req[q].prompt_tokens + t->req[q].output_tokens + block - 1) / block;
		if (nb > x->own_stride)
			x->own_stride = nb;
	}
	x->gwhere = malloc(((size_t)x->off[x->n_grp] + 1) * sizeof(*x->gwhere));
	x->same = malloc((size_t)blocks * sizeof(*x->same));
	x->tab = calloc((size_t)t->n, sizeof(*x->tab));
	return !x->gwhere || !x->same || !x->tab || kv_blocks_init(&x->pool, blocks) ? -1 : 0;
}

static void v1_cache_free(V1Cache *x, long long requests)
{
	for (long long q = 0; x->tab && q < requests; q++)
		free(x->tab[q]);
	free(x->tab);
	free(x->grp);
	free(x->off);
	free(x->gwhere);
	free(x->same);
	kv_blocks_free(&x->pool);
	memset(x, 0, sizeof(*x));
}

/* The q-quantile of n sorted values (nearest rank). */
static double quantile(const double *v, long long n, double q)
{
	long long k = (long long)ceil(q * (double)n) - 1;
	return v[k < 0 ? 0 : k >= n ? n - 1 : k];
}

/* The statistics, and the requests' own prefills' mean and mean square (each priced when the
 * request was admitted). */
static int summarise(const InferTrace *t, Replica *r, const InferReplayRoom *room, PxError *err)
{
	long long n = t->n;
	InferReplay *out = r->out;
	double gen = 0, sum_ttft = 0, sum_lat = 0, pf = 0, pf_sq = 0;
	for (long long i = 0; i < n; i++) {
		double s = prefill_of(r->c, t->req[i].prompt_tokens, err);
		if (s < 0)
			return -1;
		gen += (double)t->req[i].output_tokens, sum_ttft += r->ttft[i],
			sum_lat += r->latency[i], pf += s, pf_sq += s * s;
	}
	out->prefill_mean_s = pf / (double)n;
	out->prefill_sq_mean_s2 = pf_sq / (double)n;
	qsort(r->ttft, (size_t)n, sizeof(*r->ttft), cmp_d);
	qsort(r->latency, (size_t)n, sizeof(*r->latency), cmp_d);
	out->ttft_mean_s = sum_ttft / (double)n;
	out->ttft_p50_s = quantile(r->ttft, n, 0.5);
	out->ttft_p99_s = quantile(r->ttft, n, 0.99);
	out->latency_mean_s = sum_lat / (double)n;
	out->latency_p99_s = quantile(r->latency, n, 0.99);
	double sum_tpot = 0;
	for (long long i = 0; i < r->tpot_n; i++)
		sum_tpot += r->tpot[i];
	qsort(r->tpot, (size_t)r->tpot_n, sizeof(*r->tpot), cmp_d);
	out->tpot_mean_s = r->tpot_n ? sum_tpot / (double)r->tpot_n : 0;
	out->tpot_p99_s = r->tpot_n ? quantile(r->tpot, r->tpot_n, 0.99) : 0;
	out->tokens_per_s_gpu = gen / out->makespan_s / (double)(room->replicas * room->tp);
	out->prefills_priced = r->c->priced;
	return 0;
}

int infer_replay(const InferScenario *sc, const HwProfile *hw, const InferReplayRoom *room,
		 InferReplay *out, PxError *err)
{
	const InferTrace *t = &sc->wl.trace;
	memset(out, 0, sizeof(*out));
	out->requests = t->n;
	out->kv_tokens = room->kv_tokens;
	out->block = room->block;
	out->kv_blocks = room->block > 0 ? room->kv_tokens / room->block : 0;
	if (room->replicas < 1 || out->kv_blocks < 1 || room->max_seqs < 1 || t->n < 1)
		return px_fail(err, PX_ERR_INPUT, "%s: no replica, or no room for one sequence, to "
			       "replay the trace on", t->path);
	long long n = t->n;
	Costs c = {.sc = sc, .hw = hw};
	/* vLLM's watermark_blocks = int(watermark * num_gpu_blocks) */
	Replica r = {.t = t, .room = room, .c = &c, .out = out, .total = out->kv_blocks,
		     .keep = (long long)(room->watermark * (double)out->kv_blocks)};
	int no_room = distinct_lengths(t, &c);
	r.live = malloc((size_t)n * sizeof(*r.live));
	r.again = malloc((size_t)n * sizeof(*r.again));
	r.made = calloc((size_t)n, sizeof(*r.made));
	r.first = malloc((size_t)n * sizeof(*r.first));
	r.ttft = malloc((size_t)n * sizeof(*r.ttft));
	r.latency = malloc((size_t)n * sizeof(*r.latency));
	r.tpot = malloc((size_t)n * sizeof(*r.tpot));
	r.wait = malloc((size_t)n * sizeof(*r.wait));
	InferPlan plan = {0};
	int rc = 0, fused = infer_sched_ragged(&sc->wl);
	r.v1 = sc->wl.scheduler == SCHED_VLLM_V1;
	if (r.v1 && v1_cache_make(t, room->block, r.total, sc->wl.prefix_caching, &r.vc))
		no_room = 1;
	if (no_room || !r.live || !r.again || !r.made || !r.tpot ||
	    !r.first || !r.ttft || !r.latency || !r.wait) {
		rc = px_fail(err, PX_ERR_RUNTIME, "out of memory");
		goto done;
	}
	if (infer_plan_make(sc, 1, 0, &plan, err)) { /* its units' parts */
		rc = -1;
		goto done;
	}
	c.plan = &plan;
	for (long long i = 0; i < n; i++) {
		r.ttft[i] = -2, r.latency[i] = -1, r.first[i] = -1;
		out->prompt_tokens += t->req[i].prompt_tokens;
	}
	for (long long k = 0; k < room->replicas && k < n && !rc; k++)
		rc = fused ? run_replica_fused(&r, k, err) : run_replica(&r, k, err);
	if (!rc)
		rc = summarise(t, &r, room, err);
done:
	infer_plan_free(&plan);
	v1_cache_free(&r.vc, n);
	free(r.wait);
	free(c.lengths);
	free(c.prefill_s);
	free(r.live);
	free(r.again);
	free(r.made);
	free(r.first);
	free(r.ttft);
	free(r.latency);
	free(r.tpot);
	return rc;
}

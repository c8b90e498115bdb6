#include "infer_replay.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "infer_sim.h"

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
	long long shared;    /* vllm_v1, prefix caching: its prefix group's blocks [0, shared)
				are among its held ones (Prefixes) */
} Live;

/* vLLM V1's prefix cache (KVCacheManager with enable_prefix_caching) over the trace's prefix
 * groups: a full block of a prompt is cached by its tokens, so requests of one prefix id share
 * the leading blocks of its prefix. Per group, its leading blocks in the cache, cached[g] of
 * them, each referenced by ref[off[g] + b] running requests (a request references a leading
 * run of them, so the counts do not rise along the chain); a block no request references is
 * free but keeps its content until taken (evictable), and is found again by the next request of
 * its group. A request's blocks past its group's (the rest of its prompt, its outputs) are its
 * own, freed when it leaves; a preempted request finds only its group's blocks again. */
typedef struct Prefixes {
	long long *grp;       /* by request: its group, -1 without a prefix */
	long long n_grp;
	long long *cached, *off, *ref;
	long long evictable;  /* cached blocks no request references */
	long long cursor;     /* the group evict_one looks at first */
} Prefixes;

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
	Prefixes px;                  /* vllm_v1 with prefix caching (grp NULL: none) */
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
	if (r->used > r->out->peak_kv_tokens)
		r->out->peak_kv_tokens = r->used;
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
	r->live[r->n_live++] = (Live){q, r->made[q], r->first[q], 0, 0, 0, 0};
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
	return px_fail(err, PX_ERR_INPUT, "%s: request %lld (prompt %lld tokens): longer than the KV "
		       "cache's %lld tokens (%lld blocks of %lld, %lld of them kept free at admission)",
		       r->t->path, q + 1, r->t->req[q].prompt_tokens, r->total * r->room->block,
		       r->total, r->room->block, r->keep);
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
	return r->px.grp ? r->px.grp[q] : -1;
}

/* The full blocks of request q's own prefix. */
static long long prefix_blocks(const Replica *r, long long q)
{
	return r->t->req[q].prefix_tokens / r->room->block;
}

/* One evictable block taken from the cache: the last of a group whose last no request
 * references, the groups looked at in turn from where the last eviction was (not vLLM's least
 * recently freed first; a trace of many ids is not scanned from the start each time). 0 when
 * none is. */
static int evict_one(Replica *r)
{
	Prefixes *x = &r->px;
	for (long long k = 0; k < x->n_grp; k++) {
		long long g = (x->cursor + k) % x->n_grp;
		if (x->cached[g] > 0 && x->ref[x->off[g] + x->cached[g] - 1] == 0) {
			x->cached[g]--, x->evictable--;
			x->cursor = g;
			return 1;
		}
	}
	return 0;
}

/* A sequence's next `tokens` into the cache, its blocks taken as they fill (evicting cached
 * blocks no request references when no other is free); with prefix caching, its prefix's
 * blocks that come next in its group's chain are cached as they fill. */
static void grow(Replica *r, Live *l, long long tokens)
{
	r->blocks += more_blocks(r, l, tokens);
	r->used += tokens;
	l->held += tokens;
	while (r->blocks + r->px.evictable > r->total && evict_one(r))
		;
	long long g = group_of(r, l->req);
	if (g >= 0) {
		Prefixes *x = &r->px;
		long long full = l->held / r->room->block, lim = prefix_blocks(r, l->req);
		for (full = full < lim ? full : lim; l->shared < full && l->shared == x->cached[g];
		     l->shared++, x->cached[g]++)
			x->ref[x->off[g] + l->shared] = 1;
	}
	note_peaks(r);
}

/* The blocks sequence l would free by leaving: its own, and its group's that only it
 * references (evictable then, which counts as free). */
static long long released(const Replica *r, const Live *l)
{
	long long n = blocks_of(r, l->held) - l->shared, g = group_of(r, l->req);
	for (long long b = 0; b < l->shared; b++)
		n += r->px.ref[r->px.off[g] + b] == 1;
	return n;
}

/* Sequence l's tokens out of the cache: its own blocks freed, its group's given up. */
static void release(Replica *r, Live *l)
{
	long long g = group_of(r, l->req);
	r->used -= l->held;
	r->blocks -= blocks_of(r, l->held) - l->shared;
	for (long long b = 0; b < l->shared; b++)
		if (--r->px.ref[r->px.off[g] + b] == 0)
			r->blocks--, r->px.evictable++;
	l->shared = 0;
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
	*l = (Live){q, r->made[q], r->first[q], r->t->req[q].prompt_tokens + r->made[q], 0, 0, 0};
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
		release(r, l);
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

/* The blocks of request q's group that it finds cached when admitted with all tokens to
 * compute: the group's leading ones, as many as infer_prefix_found allows its prefix. */
static long long cache_hits(const Replica *r, long long q, long long all)
{
	long long g = group_of(r, q);
	if (g < 0)
		return 0;
	long long block = r->room->block;
	long long lim = infer_prefix_found(r->t->req[q].prefix_tokens, all, block) / block;
	return r->px.cached[g] < lim ? r->px.cached[g] : lim;
}

/* Compose one vLLM V1 step into g; 1 when the only running request outgrows the cache (it
 * preempted itself alone), else 0. */
static int compose_v1(Replica *r, InferRagged *g)
{
	long long budget = r->c->sc->wl.token_budget, free = r->total - r->blocks;
	double ctx = 0;
	int preempted = 0;
	memset(g, 0, sizeof(*g));
	for (long long k = 0; k < r->n_live; k++)
		r->live[k].step = 0;
	for (long long k = 0; k < r->n_live && budget > 0; k++) {
		Live *l = &r->live[k];
		long long c = l->pending == 0 ? 1 : l->pending < budget ? l->pending : budget;
		while (more_blocks(r, l, c) > free && k < r->n_live) {
			long long last = r->n_live - 1;
			if (last == 0)
				return 1;
			free += released(r, &r->live[last]);
			preempt_last(r);
			preempted = 1;
		}
		if (k >= r->n_live) /* it was the one preempted */
			break;
		free -= more_blocks(r, l, c);
		budget -= c;
		take_tokens(g, l, c, &ctx);
	}
	while (!preempted && budget > 0 && r->n_wait && r->n_live < r->room->max_seqs) {
		long long q = r->wait[0], all = r->t->req[q].prompt_tokens + r->made[q];
		long long hit = cache_hits(r, q, all), reuse = 0, gq = group_of(r, q);
		for (long long b = 0; b < hit; b++) /* evictable ones: taken from the free */
			reuse += r->px.ref[r->px.off[gq] + b] == 0;
		long long rest = all - hit * r->room->block, c = rest < budget ? rest : budget;
		if (blocks_of(r, c) + reuse > free - r->keep) {
			if (r->ttft[q] == -2) /* counted once */
				r->ttft[q] = -3, r->out->waited_for_room++;
			break;
		}
		Live *l = join(r);
		for (long long b = 0; b < hit; b++)
			if (r->px.ref[r->px.off[gq] + b]++ == 0)
				r->blocks++, r->px.evictable--;
		l->held = hit * r->room->block, l->pending = rest, l->shared = hit;
		r->used += l->held;
		r->out->prefix_hit_tokens += l->held;
		free -= blocks_of(r, c) + reuse;
		budget -= c;
		take_tokens(g, l, c, &ctx);
	}
	g->decode_ctx = g->decode_seqs ? ctx / (double)g->decode_seqs : 0;
	g->logit_rows += g->decode_seqs;
	return 0;
}

/* Request q, running alone, outgrows the cache with its outputs: refused, naming it. */
static int outgrows(const Replica *r, long long q, PxError *err)
{
	const InferTrace *t = r->t;
	return px_fail(err, PX_ERR_INPUT, "%s: request %lld (prompt %lld, output %lld tokens): "
		       "longer than the KV cache's %lld tokens (%lld blocks of %lld)", t->path, q + 1,
		       t->req[q].prompt_tokens, t->req[q].output_tokens, r->total * r->room->block,
		       r->total, r->room->block);
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
	if (r->px.grp) { /* each replica's cache starts empty */
		memset(r->px.cached, 0, (size_t)r->px.n_grp * sizeof(*r->px.cached));
		memset(r->px.ref, 0, (size_t)r->px.off[r->px.n_grp] * sizeof(*r->px.ref));
		r->px.evictable = r->px.cursor = 0;
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
		if (v1 && compose_v1(r, &g))
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

/* The trace's prefix groups into x (allocated; prefixes_free frees them): its distinct
 * prefix ids other than 0, each with room for the longest prefix of its requests in blocks of
 * `block`, nothing cached. 0, or -1 out of memory. */
static int prefixes_make(const InferTrace *t, long long block, Prefixes *x)
{
	long long n = t->n, *ids = malloc((size_t)n * sizeof(*ids)), k = 0;
	memset(x, 0, sizeof(*x));
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
	x->cached = calloc((size_t)x->n_grp + 1, sizeof(*x->cached));
	x->off = calloc((size_t)x->n_grp + 1, sizeof(*x->off));
	if (!x->cached || !x->off) {
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
	x->ref = calloc((size_t)x->off[x->n_grp] + 1, sizeof(*x->ref));
	return x->ref ? 0 : -1;
}

static void prefixes_free(Prefixes *x)
{
	free(x->grp);
	free(x->cached);
	free(x->off);
	free(x->ref);
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
	if (sc->wl.prefix_caching && t->prefixes && prefixes_make(t, room->block, &r.px))
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
	prefixes_free(&r.px);
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

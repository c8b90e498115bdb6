/* parallax sweep and parallax merge: price every point of a sweep on all cores, stream the points
 * into the results database in batched transactions (resumable, shardable), and rank them. */
#include <getopt.h>
#include <limits.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>
#include <sqlite3.h>

#include "../db/sweepdb.h"
#include "../engine/clock.h"
#include "commands.h"
#include "paths.h"
#include "sweep_report.h"

static const char USAGE[] =
	"usage: parallax sweep SWEEP.json [--db FILE | --no-db] [--jobs N] [--shard I/N]\n"
	"                      [--top K] [--objective throughput|cost|headroom] [--json]\n"
	"                      [--no-progress]\n"
	"       parallax sweep --show NAME|ID [--db FILE] [--top K] [--objective O] [--json]\n"
	"\n"
	"Price every point of a sweep: a base scenario and axes of --set values, e.g.\n"
	"  {\"name\": \"13b\", \"scenario\": \"base.json\", \"prices\": \"prices.json\",\n"
	"   \"axes\": {\"deepspeed.zero_optimization.stage\": [0, 1, 2, 3],\n"
	"            \"parallelism.tp\": [1, 2, 4, 8], \"cluster.nodes\": [4, 8]}}\n"
	"Points DeepSpeed refuses are stored as invalid, those that do not fit as oom (not timed),\n"
	"the rest with their step time. Over an inference scenario (an \"inference\" object) the\n"
	"axes are its keys (inference.tensor_parallel.tp_size, inference.dtype,\n"
	"workload.batch_size, workload.prompt_tokens, workload.request_rate, cluster.gpu, ...)\n"
	"and each point stores TTFT, TPOT, latency, tokens/s per GPU and whether it fits; a\n"
	"training key there is refused. Points stream into the database in batches; an interrupted\n"
	"sweep run again resumes where it stopped. Then it prints the summary and the best points\n"
	"of the whole stored sweep (every run, resume and merged shard of it), each best point's\n"
	"settings in a column per axis that differs among them. An axis or set key that no\n"
	"scenario reader knows is refused with the closest known key; a section replaced by a\n"
	"file path (an axis \"model\": [\"a.json\", ...]) is read relative to the sweep file.\n"
	"\n"
	"  --show NAME|ID  print a stored sweep's summary and best points, pricing nothing\n"
	"  --db FILE       results database (default $PARALLAX_DB, else results/parallax.db\n"
	"                  where ./results exists, else ~/.local/share/parallax/)\n"
	"  --no-db         keep nothing (benchmarks): the summary covers this run only\n"
	"  --jobs N        worker threads (default: the machine's cores)\n"
	"  --shard I/N     price only the points with index % N == I (one Slurm array task or\n"
	"                  MPI rank each; then parallax merge the databases)\n"
	"  --top K         how many best points to print (default: the sweep's top, or 10)\n"
	"  --objective O   throughput (tokens/s), cost (USD per million tokens: needs prices) or\n"
	"                  headroom (free GPU memory); default: the sweep's, or throughput\n"
	"  --json          the summary and best points as one JSON object\n"
	"  --no-progress   no progress bar (it is shown only on a terminal anyway)\n"
	"  -h, --help      this help\n"
	"Exit status: 0 ok, 1 runtime failure (database, memory), 2 bad input, 130 interrupted\n"
	"(run it again to resume).\n";

static const char MERGE_USAGE[] =
	"usage: parallax merge OUT.db IN.db...\n"
	"\n"
	"Copy the sweeps of results databases into OUT.db (made when missing): the databases of a\n"
	"sweep's shards (parallax sweep --shard I/N) become one sweep, a point already in OUT.db\n"
	"is kept; then `parallax sweep --show NAME --db OUT.db` lists the whole sweep's best\n"
	"points. Sweeps only: predicted and measured runs are not copied. All of one IN.db's\n"
	"points go in one transaction.\n"
	"\n"
	"  -h, --help   this help\n"
	"Exit status: 0 ok, 1 runtime failure (database), 2 bad usage or an IN.db that cannot be\n"
	"read.\n";

#define BATCH 256
#define CLAIM 64 /* consecutive indices a worker takes at a time */

typedef struct Batch {
	PointResult r[BATCH];
	int n;
	struct Batch *next;
} Batch;

typedef struct Job {
	const Sweep *sw;
	const unsigned char *done;
	long long shard_i, shard_n;
	atomic_llong next;       /* the next index to hand out */
	pthread_mutex_t mu;
	pthread_cond_t cv;
	Batch *head, *tail;      /* finished batches for the main thread */
	int queued, workers_left;
	PxError err;
	int failed;
} Job;

static volatile sig_atomic_t interrupted;

static void on_sigint(int sig)
{
	(void)sig;
	interrupted = 1;
}

static void push(Job *j, Batch *b)
{
	pthread_mutex_lock(&j->mu);
	while (j->queued >= 64 && !interrupted) /* memory stays bounded if the writer is slow */
		pthread_cond_wait(&j->cv, &j->mu);
	b->next = NULL;
	if (j->tail)
		j->tail->next = b;
	else
		j->head = b;
	j->tail = b;
	j->queued++;
	pthread_cond_broadcast(&j->cv);
	pthread_mutex_unlock(&j->mu);
}

static void *worker(void *arg)
{
	Job *j = arg;
	Batch *b = calloc(1, sizeof(*b));
	SweepMemo *memo = sweep_memo_create(); /* NULL: every point priced in full */
	PxError err;
	while (b && !interrupted) {
		/* runs of consecutive points, so that points sharing a result (sweep.c's memo: they
		 * differ only in the last axes) meet in one worker */
		long long first = atomic_fetch_add(&j->next, CLAIM);
		if (first >= j->sw->n_points)
			break;
		for (long long i = first; b && !interrupted && i < first + CLAIM &&
		     i < j->sw->n_points; i++) {
			if (i % j->shard_n != j->shard_i ||
			    (j->done && (j->done[i / 8] & (1 << (i % 8)))))
				continue;
			if (sweep_eval_memo(j->sw, memo, i, &b->r[b->n], &err)) {
				pthread_mutex_lock(&j->mu);
				j->failed = 1;
				j->err = err;
				pthread_mutex_unlock(&j->mu);
				interrupted = 1;
				break;
			}
			if (++b->n == BATCH) {
				push(j, b);
				b = calloc(1, sizeof(*b));
			}
		}
	}
	if (b && b->n)
		push(j, b);
	else
		free(b);
	sweep_memo_destroy(memo);
	pthread_mutex_lock(&j->mu);
	j->workers_left--;
	pthread_cond_broadcast(&j->cv);
	pthread_mutex_unlock(&j->mu);
	return NULL;
}

/* ---- the best points ---- */

typedef struct Top {
	PointResult *r;
	int n, cap;
} Top;

static void top_add(Top *t, const Sweep *sw, const PointResult *p)
{
	double s = sweep_score(sw, p);
	if (!isfinite(s))
		return;
	int pos = t->n;
	while (pos > 0 && sweep_score(sw, &t->r[pos - 1]) < s)
		pos--;
	if (pos >= t->cap)
		return;
	int last = t->n < t->cap ? t->n : t->cap - 1;
	memmove(&t->r[pos + 1], &t->r[pos], (size_t)(last - pos) * sizeof(*p));
	t->r[pos] = *p;
	if (t->n < t->cap)
		t->n++;
}

/* Print (or, with json, write as JSON) the report r. */
static void emit(const SweepReport *r, int json)
{
	if (!json) {
		sweep_report_print(stdout, r);
		return;
	}
	cJSON *j = sweep_report_json(r);
	char *t = j ? cJSON_Print(j) : NULL;
	if (t)
		puts(t);
	cJSON_free(t);
	cJSON_Delete(j);
}

/* The whole stored sweep's summary and k best points by obj, from the database h. */
static int report_stored(sqlite3 *h, const char *dbpath, long long sweep_id, SweepObjective obj,
			 int k, int json, PxError *err)
{
	StoredSweep st;
	PointResult *best = calloc((size_t)k, sizeof(*best));
	int rc = -1;
	if (!best)
		return px_fail(err, PX_ERR_RUNTIME, "out of memory");
	if (sweepdb_load(h, dbpath, sweep_id, &st, err))
		goto out;
	int n = sweepdb_best(h, dbpath, sweep_id, obj, k, best, err);
	if (n >= 0) {
		SweepReport r = {.name = st.name, .n_points = st.n_points, .covered = st.stored,
				 .scope = "stored", .objective = obj, .best = best, .n_best = n,
				 .infer = st.infer};
		memcpy(r.counts, st.counts, sizeof(r.counts));
		r.tight = st.tight;
		emit(&r, json);
		rc = 0;
	}
	sweepdb_stored_free(&st);
out:
	free(best);
	return rc;
}

static void progress(long long done, long long total, double t0, double now)
{
	double rate = done / fmax(now - t0, 1e-9), frac = total ? (double)done / total : 1;
	char bar[41];
	int fill = (int)(frac * 40);
	for (int i = 0; i < 40; i++)
		bar[i] = i < fill ? '#' : '.';
	bar[40] = '\0';
	fprintf(stderr, "\r[%s] %5.1f%% %lld/%lld  %.0f points/s  ETA %.0f s   ", bar, 100 * frac,
		done, total, rate, rate > 0 ? (total - done) / rate : 0);
}

/* ---- the command ---- */

typedef struct SweepOpts {
	const char *path, *db_path, *show;
	int no_db, jobs, top, no_progress, objective, json;
	long long shard_i, shard_n;
	char db_buf[PATH_MAX], path_buf[PATH_MAX];
} SweepOpts;

static int parse_opts(int argc, char **argv, SweepOpts *o)
{
	static const struct option longs[] = {
		{"db", required_argument, 0, 'd'}, {"no-db", no_argument, 0, 'n'},
		{"jobs", required_argument, 0, 'j'}, {"shard", required_argument, 0, 's'},
		{"top", required_argument, 0, 't'}, {"objective", required_argument, 0, 'o'},
		{"no-progress", no_argument, 0, 'p'}, {"show", required_argument, 0, 'S'},
		{"json", no_argument, 0, 'J'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
	int c;
	o->shard_n = 1, o->objective = -1;
	optind = 1;
	while ((c = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
		switch (c) {
		case 'd': o->db_path = optarg; break;
		case 'n': o->no_db = 1; break;
		case 'j': o->jobs = atoi(optarg); if (o->jobs < 1) goto bad; break;
		case 't': o->top = atoi(optarg); if (o->top < 1) goto bad; break;
		case 'p': o->no_progress = 1; break;
		case 'S': o->show = optarg; break;
		case 'J': o->json = 1; break;
		case 's':
			if (sscanf(optarg, "%lld/%lld", &o->shard_i, &o->shard_n) != 2 ||
			    o->shard_n < 1 || o->shard_i < 0 || o->shard_i >= o->shard_n)
				goto bad;
			break;
		case 'o':
			o->objective = !strcmp(optarg, "throughput") ? OBJ_THROUGHPUT :
				       !strcmp(optarg, "cost") ? OBJ_COST :
				       !strcmp(optarg, "headroom") ? OBJ_HEADROOM : -2;
			if (o->objective == -2)
				goto bad;
			break;
		case 'h': fputs(USAGE, stdout); return 0;
		default: fputs(USAGE, stderr); return 2;
		}
	}
	if (o->show ? optind != argc : optind != argc - 1) {
		fprintf(stderr, "parallax sweep: expected %s\n%s",
			o->show ? "no sweep file with --show" : "one sweep file", USAGE);
		return 2;
	}
	if (o->show && o->no_db) {
		fprintf(stderr, "parallax sweep: --show reads the database: not with --no-db\n");
		return 2;
	}
	o->path = o->show ? NULL : paths_find_input(argv[optind], o->path_buf, sizeof(o->path_buf));
	if (!o->db_path && !o->no_db) {
		PxError err;
		if (paths_default_db(o->db_buf, sizeof(o->db_buf), !o->show, &err)) {
			fprintf(stderr, "parallax sweep: %s\n", err.msg);
			return 1;
		}
		o->db_path = o->db_buf;
	}
	if (!o->jobs)
		o->jobs = (int)sysconf(_SC_NPROCESSORS_ONLN);
	return -1;
bad:
	fprintf(stderr, "parallax sweep: --%s %s: not a valid value\n%s", argv[optind - 1] + 2,
		optarg, USAGE);
	return 2;
}

static int run_sweep(SweepOpts *o, Sweep *sw, PxError *err)
{
	PxDb *db = NULL;
	long long sweep_id = 0, counts[4] = {0}, tight = 0, stored = 0, already = 0, todo;
	unsigned char *done = NULL;
	Top top = {0};
	int rc = -1;
	Job job = {.sw = sw, .shard_i = o->shard_i, .shard_n = o->shard_n, .workers_left = o->jobs};
	pthread_t *th = calloc((size_t)o->jobs, sizeof(*th));

	top.cap = o->top ? o->top : sw->top;
	top.r = calloc((size_t)top.cap + 1, sizeof(*top.r));
	if (!th || !top.r)
		goto oom;
	if (!o->no_db) {
		if (!(done = calloc((size_t)(sw->n_points / 8 + 1), 1)))
			goto oom;
		if (db_open(o->db_path, &db, err) || sweepdb_begin(db, sw, &sweep_id, err) ||
		    (already = sweepdb_done(db, sweep_id, done, sw->n_points, err)) < 0)
			goto out;
	}
	todo = sw->n_points / o->shard_n + (o->shard_i < sw->n_points % o->shard_n) - already;
	if (already)
		fprintf(stderr, "# resuming %s: %lld points already in %s\n", sw->name, already,
			o->db_path);
	pthread_mutex_init(&job.mu, NULL);
	pthread_cond_init(&job.cv, NULL);
	job.done = done;
	signal(SIGINT, on_sigint);
	double t0 = px_now_s(), shown = 0;
	int bar = !o->no_progress && isatty(2);
	for (int i = 0; i < o->jobs; i++)
		pthread_create(&th[i], NULL, worker, &job);
	for (;;) { /* the main thread stores and ranks what the workers finish */
		pthread_mutex_lock(&job.mu);
		while (!job.head && job.workers_left > 0)
			pthread_cond_wait(&job.cv, &job.mu);
		Batch *b = job.head;
		if (b) {
			job.head = b->next;
			if (!job.head)
				job.tail = NULL;
			job.queued--;
			pthread_cond_broadcast(&job.cv);
		}
		int finished = !b && job.workers_left == 0;
		pthread_mutex_unlock(&job.mu);
		if (finished)
			break;
		if (db && sweepdb_write_infer(db, sweep_id, b->r, b->n, sw->infer, err)) {
			interrupted = 1;
			job.failed = 1, job.err = *err;
		}
		for (int i = 0; i < b->n; i++) {
			counts[b->r[i].status]++;
			tight += b->r[i].status != PT_INVALID && b->r[i].status != PT_OOM &&
				 b->r[i].verdict == VERDICT_TIGHT;
			top_add(&top, sw, &b->r[i]);
		}
		stored += b->n;
		free(b);
		double t = px_now_s();
		if (bar && t - shown > 0.2)
			progress(stored, todo, t0, t), shown = t;
	}
	for (int i = 0; i < o->jobs; i++)
		pthread_join(th[i], NULL);
	double dt = px_now_s() - t0;
	if (bar)
		progress(stored, todo, t0, px_now_s()), fputc('\n', stderr);
	signal(SIGINT, SIG_DFL);
	if (job.failed) {
		*err = job.err;
		goto out;
	}
	if (db) {
		if (report_stored(db_handle(db), o->db_path, sweep_id, sw->objective, top.cap,
				  o->json, err))
			goto out;
	} else {
		SweepReport r = {.name = sw->name, .n_points = sw->n_points, .covered = stored,
				 .scope = "this run", .objective = sw->objective, .best = top.r,
				 .n_best = top.n, .tight = tight, .infer = sw->infer};
		memcpy(r.counts, counts, sizeof(r.counts));
		emit(&r, o->json);
	}
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	/* CPU time too: on a shared machine it is the rate per core that wall time cannot show */
	double cpu_s = (double)ru.ru_utime.tv_sec + 1e-6 * (double)ru.ru_utime.tv_usec;
	fprintf(o->json ? stderr : stdout,
		"# %lld points priced in %.2f s: %.0f points/s on %d thread(s)%s; %.2f s of user CPU: "
	       "%.0f points per CPU-second; peak memory %.1f MiB\n", stored, dt,
	       stored / fmax(dt, 1e-9), o->jobs, db ? "" : " (not stored)", cpu_s,
	       stored / fmax(cpu_s, 1e-9), ru.ru_maxrss / 1024.0);
	if (db)
		fprintf(o->json ? stderr : stdout, "# stored in %s as sweep %lld (table sweep_points)\n",
			o->db_path, sweep_id);
	if (interrupted) {
		fprintf(stderr, "parallax sweep: interrupted after %lld of %lld points; run it again "
			"to resume\n", stored + already, sw->n_points);
		rc = 130;
		goto out;
	}
	rc = 0;
	goto out;
oom:
	px_fail(err, PX_ERR_RUNTIME, "out of memory");
out:
	db_close(db);
	free(done);
	free(th);
	free(top.r);
	return rc;
}

/* The stored sweep's own objective and top (its file is the spec's first JSON value), unless the
 * command line gave them. */
static void spec_defaults(const char *spec, SweepOpts *o, SweepObjective *obj, int *top)
{
	const char *end = NULL;
	cJSON *j = cJSON_ParseWithOpts(spec, &end, 0);
	const cJSON *ob = cJSON_GetObjectItemCaseSensitive(j, "objective");
	const cJSON *tp = cJSON_GetObjectItemCaseSensitive(j, "top");
	*obj = OBJ_THROUGHPUT;
	if (cJSON_IsString(ob))
		*obj = !strcmp(ob->valuestring, "cost") ? OBJ_COST :
		       !strcmp(ob->valuestring, "headroom") ? OBJ_HEADROOM : OBJ_THROUGHPUT;
	*top = cJSON_IsNumber(tp) && tp->valuedouble >= 1 ? (int)tp->valuedouble : 10;
	if (o->objective >= 0)
		*obj = (SweepObjective)o->objective;
	if (o->top)
		*top = o->top;
	cJSON_Delete(j);
}

static int show_sweep(SweepOpts *o)
{
	PxError err = {0};
	StoredSweep st = {0};
	SweepObjective obj;
	int top, rc = 1;
	sqlite3 *h = db_open_read(o->db_path, &err);
	if (!h || sweepdb_find(h, o->db_path, o->show, &st, &err))
		goto fail;
	spec_defaults(st.spec, o, &obj, &top);
	if (report_stored(h, o->db_path, st.id, obj, top, o->json, &err))
		goto fail;
	rc = 0;
	goto out;
fail:
	fprintf(stderr, "parallax sweep: %s\n", err.msg);
	rc = err.code ? err.code : 1;
out:
	sweepdb_stored_free(&st);
	sqlite3_close(h);
	return rc;
}

int cmd_sweep(int argc, char **argv)
{
	SweepOpts o = {0};
	Sweep sw;
	PxError err = {0};
	int rc = parse_opts(argc, argv, &o);
	if (rc >= 0)
		return rc;
	if (o.show)
		return show_sweep(&o);
	if (sweep_load(&sw, o.path, &err)) {
		fprintf(stderr, "parallax sweep: %s\n", err.msg);
		return err.code ? err.code : 1;
	}
	if (o.objective >= 0)
		sw.objective = (SweepObjective)o.objective;
	if (sw.objective == OBJ_COST && !sw.n_prices) {
		fprintf(stderr, "parallax sweep: %s: objective cost needs prices\n", o.path);
		sweep_free(&sw);
		return 2;
	}
	interrupted = 0;
#ifdef __GLIBC__
	/* every point allocates and frees schedules of up to a few MiB: keep them in the heap rather
	 * than mapping and unmapping (and zeroing) fresh pages per point; the next point reuses what
	 * the last one freed, so memory still does not grow with the number of points */
	mallopt(M_MMAP_THRESHOLD, 64 << 20);
	mallopt(M_TRIM_THRESHOLD, 256 << 20);
#endif
	rc = run_sweep(&o, &sw, &err);
	if (rc && rc != 130)
		fprintf(stderr, "parallax sweep: %s\n", err.msg);
	sweep_free(&sw);
	return rc == -1 ? (err.code ? err.code : 1) : rc;
}

int cmd_merge(int argc, char **argv)
{
	PxDb *db;
	PxError err = {0};
	if (argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
		fputs(MERGE_USAGE, stdout);
		return 0;
	}
	if (argc < 3 || argv[1][0] == '-') {
		fputs(MERGE_USAGE, stderr);
		return 2;
	}
	if (db_open(argv[1], &db, &err)) {
		fprintf(stderr, "parallax merge: %s\n", err.msg);
		return err.code ? err.code : 1;
	}
	for (int i = 2; i < argc; i++) {
		long long n = sweepdb_merge(db, argv[i], &err);
		if (n < 0) {
			fprintf(stderr, "parallax merge: %s\n", err.msg);
			db_close(db);
			return err.code ? err.code : 1;
		}
		printf("# %s: %lld sweep points added to %s\n", argv[i], n, argv[1]);
	}
	db_close(db);
	return 0;
}

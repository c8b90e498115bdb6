#include "sweepdb.h"

#include "../sim/infer_sim.h"

#include <errno.h>
#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int fail(PxDb *db, PxError *err, const char *what)
{
	return px_fail(err, PX_ERR_RUNTIME, "%s: %s: %s", db_path(db), what,
		       sqlite3_errmsg(db_handle(db)));
}

static void utc_now(char *buf, size_t n)
{
	time_t t = time(NULL);
	struct tm tm;
	gmtime_r(&t, &tm);
	strftime(buf, n, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

/* An inference sweep's figures beside its points (schema.md): made by the first inference
 * sweep a database stores, so that a database of training sweeps keeps its schema. */
static const char INFER_TABLE_SQL[] =
	"CREATE TABLE IF NOT EXISTS sweep_infer_points (\n"
	"  sweep_id INTEGER NOT NULL, idx INTEGER NOT NULL,\n"
	"  ttft_s REAL, tpot_s REAL, latency_s REAL, tokens_per_s_per_gpu REAL,\n"
	"  max_batch INTEGER, output_tokens INTEGER, decode_bound TEXT, concurrency REAL,\n"
	"  PRIMARY KEY (sweep_id, idx),\n"
	"  FOREIGN KEY (sweep_id, idx) REFERENCES sweep_points(sweep_id, idx) ON DELETE CASCADE\n"
	") WITHOUT ROWID;\n";

/* Whether the database (schema name, "main" or "src") holds the inference table: 1, 0. */
static int has_infer_table(sqlite3 *h, const char *schema)
{
	char sql[160];
	sqlite3_stmt *s = NULL;
	int has = 0;
	snprintf(sql, sizeof(sql), "SELECT 1 FROM %s.sqlite_master WHERE type = 'table' AND "
		 "name = 'sweep_infer_points'", schema);
	if (sqlite3_prepare_v2(h, sql, -1, &s, NULL) == SQLITE_OK)
		has = sqlite3_step(s) == SQLITE_ROW;
	sqlite3_finalize(s);
	return has;
}

int sweepdb_begin(PxDb *db, const Sweep *sw, long long *sweep_id, PxError *err)
{
	sqlite3 *h = db_handle(db);
	sqlite3_stmt *s = NULL;
	char now[32];
	int rc = -1;
	utc_now(now, sizeof(now));
	if (sw->infer && sqlite3_exec(h, INFER_TABLE_SQL, NULL, NULL, NULL) != SQLITE_OK)
		return fail(db, err, "creating sweep_infer_points");
	if (sqlite3_prepare_v2(h, "INSERT OR IGNORE INTO sweeps (name, spec, n_points, created_utc) "
			       "VALUES (?1, ?2, ?3, ?4)", -1, &s, NULL) != SQLITE_OK)
		return fail(db, err, "preparing the sweep");
	sqlite3_bind_text(s, 1, sw->name, -1, SQLITE_STATIC);
	sqlite3_bind_text(s, 2, sw->spec, -1, SQLITE_STATIC);
	sqlite3_bind_int64(s, 3, sw->n_points);
	sqlite3_bind_text(s, 4, now, -1, SQLITE_STATIC);
	if (sqlite3_step(s) != SQLITE_DONE) {
		fail(db, err, "storing the sweep");
		goto out;
	}
	sqlite3_finalize(s);
	if (sqlite3_prepare_v2(h, "SELECT id FROM sweeps WHERE spec = ?1", -1, &s, NULL) != SQLITE_OK)
		return fail(db, err, "finding the sweep");
	sqlite3_bind_text(s, 1, sw->spec, -1, SQLITE_STATIC);
	if (sqlite3_step(s) != SQLITE_ROW) {
		fail(db, err, "finding the sweep");
		goto out;
	}
	*sweep_id = sqlite3_column_int64(s, 0);
	rc = 0;
out:
	sqlite3_finalize(s);
	return rc;
}

long long sweepdb_done(PxDb *db, long long sweep_id, unsigned char *done, long long n_points,
		       PxError *err)
{
	sqlite3_stmt *s = NULL;
	long long n = 0;
	if (sqlite3_prepare_v2(db_handle(db), "SELECT idx FROM sweep_points WHERE sweep_id = ?1", -1,
			       &s, NULL) != SQLITE_OK)
		return fail(db, err, "reading the sweep's points");
	sqlite3_bind_int64(s, 1, sweep_id);
	while (sqlite3_step(s) == SQLITE_ROW) {
		long long i = sqlite3_column_int64(s, 0);
		if (i >= 0 && i < n_points && !(done[i / 8] & (1 << (i % 8)))) {
			done[i / 8] |= (unsigned char)(1 << (i % 8));
			n++;
		}
	}
	sqlite3_finalize(s);
	return n;
}

static void bind_real(sqlite3_stmt *s, int i, double v, int known)
{
	if (known && !isnan(v))
		sqlite3_bind_double(s, i, v);
	else
		sqlite3_bind_null(s, i);
}

/* One point's row into the prepared INSERT s. */
static int insert_point(sqlite3_stmt *s, long long sweep_id, const PointResult *p)
{
	int timed = p->status == PT_OK, sized = p->status != PT_INVALID;
	sqlite3_reset(s);
	sqlite3_bind_int64(s, 1, sweep_id);
	sqlite3_bind_int64(s, 2, p->idx);
	sqlite3_bind_text(s, 3, p->config, -1, SQLITE_STATIC);
	sqlite3_bind_text(s, 4, sweep_status_name(p->status), -1, SQLITE_STATIC);
	if (sized) {
		sqlite3_bind_int64(s, 5, p->world);
		sqlite3_bind_text(s, 6, p->gpu, -1, SQLITE_STATIC);
	} else {
		sqlite3_bind_null(s, 5);
		sqlite3_bind_null(s, 6);
	}
	bind_real(s, 7, p->peak_bytes, sized);
	bind_real(s, 8, p->capacity_bytes, sized);
	bind_real(s, 9, p->step_s, timed);
	bind_real(s, 10, p->tokens_per_s, timed);
	bind_real(s, 11, p->mfu, timed);
	bind_real(s, 12, p->cost_per_mtoken, timed);
	if (p->note[0])
		sqlite3_bind_text(s, 13, p->note, -1, SQLITE_STATIC);
	else
		sqlite3_bind_null(s, 13);
	return sqlite3_step(s) == SQLITE_DONE ? 0 : -1;
}

/* An inference point's figures into the prepared INSERT s (priced points only). */
static int insert_infer(sqlite3_stmt *s, long long sweep_id, const PointResult *p)
{
	int timed = p->status == PT_OK, sized = p->status != PT_INVALID;
	sqlite3_reset(s);
	sqlite3_bind_int64(s, 1, sweep_id);
	sqlite3_bind_int64(s, 2, p->idx);
	bind_real(s, 3, p->ttft_s, timed);
	bind_real(s, 4, p->tpot_s, timed);
	bind_real(s, 5, p->latency_s, timed);
	bind_real(s, 6, p->tokens_per_s_gpu, timed);
	if (sized) {
		sqlite3_bind_int64(s, 7, p->max_batch);
		sqlite3_bind_int64(s, 8, p->output_tokens);
	} else {
		sqlite3_bind_null(s, 7);
		sqlite3_bind_null(s, 8);
	}
	if (timed)
		sqlite3_bind_text(s, 9, infer_bound_name((InferBound)p->decode_bound), -1,
				  SQLITE_STATIC);
	else
		sqlite3_bind_null(s, 9);
	bind_real(s, 10, p->concurrency, timed);
	return sqlite3_step(s) == SQLITE_DONE ? 0 : -1;
}

/* A failed batch: "DB: storing N sweep points: STEP: SQLite's message" ("database or disk is full"
 * on a full disk). */
static int fail_batch(PxDb *db, int n, const char *step, PxError *err)
{
	return px_fail(err, PX_ERR_RUNTIME, "%s: storing %d sweep points: %s: %s", db_path(db), n,
		       step, sqlite3_errmsg(db_handle(db)));
}

int sweepdb_write(PxDb *db, long long sweep_id, const PointResult *r, int n, PxError *err)
{
	return sweepdb_write_infer(db, sweep_id, r, n, 0, err);
}

int sweepdb_write_infer(PxDb *db, long long sweep_id, const PointResult *r, int n, int infer,
			PxError *err)
{
	sqlite3 *h = db_handle(db);
	sqlite3_stmt *s = NULL, *si = NULL;
	int rc = -1;

	if (sqlite3_exec(h, "BEGIN IMMEDIATE", NULL, NULL, NULL) != SQLITE_OK)
		return fail_batch(db, n, "starting the transaction", err);
	if (sqlite3_prepare_v2(h, "INSERT OR REPLACE INTO sweep_points (sweep_id, idx, config, status, "
			       "world, gpu, gpu_peak_bytes, capacity_bytes, step_s, tokens_per_s, mfu, "
			       "cost_per_mtoken, note) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, "
			       "?11, ?12, ?13)", -1, &s, NULL) != SQLITE_OK) {
		fail_batch(db, n, "preparing the insert", err);
		goto out_rollback;
	}
	if (infer && sqlite3_prepare_v2(h, "INSERT OR REPLACE INTO sweep_infer_points (sweep_id, "
					"idx, ttft_s, tpot_s, latency_s, tokens_per_s_per_gpu, "
					"max_batch, output_tokens, decode_bound, concurrency) VALUES "
					"(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)", -1, &si,
					NULL) != SQLITE_OK) {
		fail_batch(db, n, "preparing the inference insert", err);
		goto out_rollback;
	}
	for (int i = 0; i < n; i++)
		if (insert_point(s, sweep_id, &r[i]) || (si && insert_infer(si, sweep_id, &r[i]))) {
			char step[64];
			snprintf(step, sizeof(step), "inserting point %lld", r[i].idx);
			fail_batch(db, n, step, err);
			goto out_rollback;
		}
	/* the statements go before COMMIT, which a pending statement would hold up; the one
	 * cleanup path below finalizes what is left (NULL is a no-op) */
	sqlite3_finalize(s);
	sqlite3_finalize(si);
	s = si = NULL;
	if (sqlite3_exec(h, "COMMIT", NULL, NULL, NULL) != SQLITE_OK) {
		fail_batch(db, n, "committing", err);
		goto out_rollback;
	}
	return 0;

out_rollback:
	sqlite3_finalize(s);
	sqlite3_finalize(si);
	/* SQLite may have rolled back already (a failed COMMIT's I/O error does); then this one
	 * only says there is no transaction, and the connection is ready for the next batch */
	sqlite3_exec(h, "ROLLBACK", NULL, NULL, NULL);
	return rc;
}

long long sweepdb_merge(PxDb *db, const char *src, PxError *err)
{
	sqlite3 *h = db_handle(db);
	sqlite3_stmt *s = NULL;
	long long before = 0, after = 0;
	/* a file that is not there is an error, not a new database */
	if (access(src, R_OK))
		return px_fail(err, PX_ERR_INPUT, "%s: cannot open: %s", src, strerror(errno));
	if (sqlite3_prepare_v2(h, "ATTACH DATABASE ?1 AS src", -1, &s, NULL) != SQLITE_OK)
		return fail(db, err, "attaching");
	sqlite3_bind_text(s, 1, src, -1, SQLITE_STATIC);
	int ok = sqlite3_step(s) == SQLITE_DONE;
	sqlite3_finalize(s);
	if (!ok)
		return px_fail(err, PX_ERR_INPUT, "%s: cannot open: %s", src, sqlite3_errmsg(h));
	if (sqlite3_prepare_v2(h, "SELECT count(*) FROM sweep_points", -1, &s, NULL) == SQLITE_OK &&
	    sqlite3_step(s) == SQLITE_ROW)
		before = sqlite3_column_int64(s, 0);
	sqlite3_finalize(s);
	const char *copy =
		"BEGIN IMMEDIATE;"
		"INSERT OR IGNORE INTO main.sweeps (name, spec, n_points, created_utc)"
		"  SELECT name, spec, n_points, created_utc FROM src.sweeps;"
		"INSERT OR IGNORE INTO main.sweep_points"
		"  SELECT m.id, p.idx, p.config, p.status, p.world, p.gpu, p.gpu_peak_bytes,"
		"    p.capacity_bytes, p.step_s, p.tokens_per_s, p.mfu, p.cost_per_mtoken, p.note"
		"  FROM src.sweep_points p JOIN src.sweeps s ON s.id = p.sweep_id"
		"  JOIN main.sweeps m ON m.spec = s.spec;"
		"COMMIT;";
	int infer = has_infer_table(h, "src");
	const char *copy_infer =
		"BEGIN IMMEDIATE;"
		"INSERT OR IGNORE INTO main.sweep_infer_points"
		"  SELECT m.id, p.idx, p.ttft_s, p.tpot_s, p.latency_s, p.tokens_per_s_per_gpu,"
		"    p.max_batch, p.output_tokens, p.decode_bound, p.concurrency"
		"  FROM src.sweep_infer_points p JOIN src.sweeps s ON s.id = p.sweep_id"
		"  JOIN main.sweeps m ON m.spec = s.spec;"
		"COMMIT;";
	if (sqlite3_exec(h, copy, NULL, NULL, NULL) != SQLITE_OK ||
	    (infer && (sqlite3_exec(h, INFER_TABLE_SQL, NULL, NULL, NULL) != SQLITE_OK ||
		       sqlite3_exec(h, copy_infer, NULL, NULL, NULL) != SQLITE_OK))) {
		px_fail(err, PX_ERR_INPUT, "%s: merging its sweeps: %s", src, sqlite3_errmsg(h));
		sqlite3_exec(h, "ROLLBACK", NULL, NULL, NULL);
		sqlite3_exec(h, "DETACH DATABASE src", NULL, NULL, NULL);
		return -1;
	}
	if (sqlite3_prepare_v2(h, "SELECT count(*) FROM sweep_points", -1, &s, NULL) == SQLITE_OK &&
	    sqlite3_step(s) == SQLITE_ROW)
		after = sqlite3_column_int64(s, 0);
	sqlite3_finalize(s);
	sqlite3_exec(h, "DETACH DATABASE src", NULL, NULL, NULL);
	return after - before;
}

/* ---- reading ---- */

static int read_fail(sqlite3 *h, const char *dbpath, const char *what, PxError *err)
{
	return px_fail(err, PX_ERR_RUNTIME, "%s: %s: %s", dbpath, what, sqlite3_errmsg(h));
}

void sweepdb_stored_free(StoredSweep *s)
{
	if (s) {
		free(s->spec);
		s->spec = NULL;
	}
}

int sweepdb_load(sqlite3 *h, const char *dbpath, long long id, StoredSweep *out, PxError *err)
{
	sqlite3_stmt *s = NULL;
	memset(out, 0, sizeof(*out));
	if (sqlite3_prepare_v2(h, "SELECT name, spec, n_points FROM sweeps WHERE id = ?1", -1, &s,
			       NULL) != SQLITE_OK)
		return read_fail(h, dbpath, "reading sweeps", err);
	sqlite3_bind_int64(s, 1, id);
	if (sqlite3_step(s) != SQLITE_ROW) {
		sqlite3_finalize(s);
		return px_fail(err, PX_ERR_INPUT, "%s: no sweep %lld", dbpath, id);
	}
	out->id = id;
	snprintf(out->name, sizeof(out->name), "%s", (const char *)sqlite3_column_text(s, 0));
	out->spec = strdup((const char *)sqlite3_column_text(s, 1));
	out->n_points = sqlite3_column_int64(s, 2);
	sqlite3_finalize(s);
	if (!out->spec)
		return px_fail(err, PX_ERR_RUNTIME, "out of memory");
	if (sqlite3_prepare_v2(h, "SELECT status, count(*) FROM sweep_points WHERE sweep_id = ?1"
			       " GROUP BY status", -1, &s, NULL) != SQLITE_OK) {
		sweepdb_stored_free(out);
		return read_fail(h, dbpath, "counting the sweep's points", err);
	}
	sqlite3_bind_int64(s, 1, id);
	while (sqlite3_step(s) == SQLITE_ROW) {
		const char *st = (const char *)sqlite3_column_text(s, 0);
		for (int k = 0; k < 4; k++)
			if (!strcmp(st, sweep_status_name((PointStatus)k))) {
				out->counts[k] = sqlite3_column_int64(s, 1);
				out->stored += out->counts[k];
			}
	}
	sqlite3_finalize(s);
	/* a tight point is stored as priced; its verdict follows from its peak and capacity by
	 * predict_gpu_verdict's arithmetic */
	if (sqlite3_prepare_v2(h, "SELECT count(*) FROM sweep_points WHERE sweep_id = ?1 AND status"
			       " IN ('ok', 'unpriced') AND gpu_peak_bytes <= capacity_bytes AND"
			       " gpu_peak_bytes > capacity_bytes - capacity_bytes * ?2", -1, &s,
			       NULL) != SQLITE_OK) {
		sweepdb_stored_free(out);
		return read_fail(h, dbpath, "counting the sweep's tight points", err);
	}
	sqlite3_bind_int64(s, 1, id);
	sqlite3_bind_double(s, 2, PREDICT_TIGHT_MARGIN);
	if (sqlite3_step(s) == SQLITE_ROW)
		out->tight = sqlite3_column_int64(s, 0);
	sqlite3_finalize(s);
	if (has_infer_table(h, "main") &&
	    sqlite3_prepare_v2(h, "SELECT 1 FROM sweep_infer_points WHERE sweep_id = ?1 LIMIT 1", -1,
			       &s, NULL) == SQLITE_OK) {
		sqlite3_bind_int64(s, 1, id);
		out->infer = sqlite3_step(s) == SQLITE_ROW;
		sqlite3_finalize(s);
	}
	return 0;
}

int sweepdb_find(sqlite3 *h, const char *dbpath, const char *name_or_id, StoredSweep *out,
		 PxError *err)
{
	sqlite3_stmt *s = NULL;
	long long id = -1;
	int digits = *name_or_id != '\0';
	for (const char *c = name_or_id; *c; c++)
		digits &= *c >= '0' && *c <= '9';
	if (sqlite3_prepare_v2(h, digits ? "SELECT id FROM sweeps WHERE id = ?1" :
				"SELECT id FROM sweeps WHERE name = ?1 ORDER BY id DESC LIMIT 1",
			       -1, &s, NULL) != SQLITE_OK)
		return read_fail(h, dbpath, "reading sweeps", err);
	if (digits)
		sqlite3_bind_int64(s, 1, atoll(name_or_id));
	else
		sqlite3_bind_text(s, 1, name_or_id, -1, SQLITE_STATIC);
	if (sqlite3_step(s) == SQLITE_ROW)
		id = sqlite3_column_int64(s, 0);
	sqlite3_finalize(s);
	if (id >= 0)
		return sweepdb_load(h, dbpath, id, out, err);
	/* say what there is */
	char names[512] = "";
	size_t len = 0;
	if (sqlite3_prepare_v2(h, "SELECT DISTINCT name FROM sweeps ORDER BY name", -1, &s,
			       NULL) == SQLITE_OK)
		while (sqlite3_step(s) == SQLITE_ROW && len + 64 < sizeof(names))
			len += (size_t)snprintf(names + len, sizeof(names) - len, "%s%s",
						len ? ", " : "", sqlite3_column_text(s, 0));
	sqlite3_finalize(s);
	return px_fail(err, PX_ERR_INPUT, "%s: no sweep named '%s'; stored: %s", dbpath, name_or_id,
		       len ? names : "none");
}

static double column_or_nan(sqlite3_stmt *s, int i)
{
	return sqlite3_column_type(s, i) == SQLITE_NULL ? NAN : sqlite3_column_double(s, i);
}

int sweepdb_best(sqlite3 *h, const char *dbpath, long long sweep_id, SweepObjective obj, int k,
		 PointResult *out, PxError *err)
{
	/* the same order as sweep_score: larger tokens/s, smaller cost, larger headroom */
	static const char *const order[] = {
		[OBJ_THROUGHPUT] = "tokens_per_s IS NOT NULL ORDER BY tokens_per_s DESC, idx",
		[OBJ_COST] = "cost_per_mtoken IS NOT NULL ORDER BY cost_per_mtoken ASC, idx",
		[OBJ_HEADROOM] = "capacity_bytes IS NOT NULL AND gpu_peak_bytes IS NOT NULL"
				 " ORDER BY capacity_bytes - gpu_peak_bytes DESC, idx",
	};
	char sql[1024];
	sqlite3_stmt *s = NULL;
	int n = 0, infer = has_infer_table(h, "main");
	snprintf(sql, sizeof(sql), "SELECT idx, config, world, gpu, gpu_peak_bytes, capacity_bytes,"
		 " step_s, tokens_per_s, mfu, cost_per_mtoken%s FROM sweep_points%s WHERE"
		 " sweep_id = ?1 AND status = 'ok' AND %s LIMIT ?2",
		 infer ? ", i.ttft_s, i.tpot_s, i.latency_s, i.tokens_per_s_per_gpu, i.max_batch,"
			 " i.output_tokens, i.decode_bound, i.concurrency" : "",
		 infer ? " LEFT JOIN sweep_infer_points i USING (sweep_id, idx)" : "", order[obj]);
	if (sqlite3_prepare_v2(h, sql, -1, &s, NULL) != SQLITE_OK)
		return read_fail(h, dbpath, "reading the best points", err);
	sqlite3_bind_int64(s, 1, sweep_id);
	sqlite3_bind_int(s, 2, k);
	while (n < k && sqlite3_step(s) == SQLITE_ROW) {
		PointResult *p = &out[n++];
		memset(p, 0, sizeof(*p));
		p->status = PT_OK;
		p->idx = sqlite3_column_int64(s, 0);
		snprintf(p->config, sizeof(p->config), "%s", (const char *)sqlite3_column_text(s, 1));
		p->world = sqlite3_column_int64(s, 2);
		snprintf(p->gpu, sizeof(p->gpu), "%s",
			 sqlite3_column_text(s, 3) ? (const char *)sqlite3_column_text(s, 3) : "");
		p->peak_bytes = column_or_nan(s, 4);
		p->capacity_bytes = column_or_nan(s, 5);
		p->step_s = column_or_nan(s, 6);
		p->tokens_per_s = column_or_nan(s, 7);
		p->mfu = column_or_nan(s, 8);
		p->cost_per_mtoken = column_or_nan(s, 9);
		p->verdict = predict_gpu_verdict(p->peak_bytes, p->capacity_bytes);
		if (infer) {
			p->ttft_s = column_or_nan(s, 10);
			p->tpot_s = column_or_nan(s, 11);
			p->latency_s = column_or_nan(s, 12);
			p->tokens_per_s_gpu = column_or_nan(s, 13);
			p->max_batch = sqlite3_column_int64(s, 14);
			p->output_tokens = sqlite3_column_int64(s, 15);
			const char *b = (const char *)sqlite3_column_text(s, 16);
			for (int bd = 0; b && bd < N_BOUNDS; bd++)
				if (!strcmp(b, infer_bound_name((InferBound)bd)))
					p->decode_bound = bd;
			p->concurrency = column_or_nan(s, 17);
		}
	}
	sqlite3_finalize(s);
	return n;
}

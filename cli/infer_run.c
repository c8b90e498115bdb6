/* infer_run: see infer_run.h. */
#include "infer_run.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../db/db.h"
#include "../exec/infer_runner.h"
#include "../sim/infer_sim.h"
#include "infer_report.h"
#include "launch.h"

/* ---- the figures, predicted and measured, under one naming ---- */

/* Per rank, in this order: memory by category at the peak and each category's own peak (the
 * arena's labels: what the executor asked for), the peaks (the pool's mapped bytes; the
 * requests'), the host place's (none: an inference schedule places everything on the device),
 * the payload of each collective kind over the whole generation, the wire bytes, then the
 * clock's figures (measured only). */
enum {
	F_CAT = 0, F_CAT_PEAK = N_CATS, F_PEAK = 2 * N_CATS, F_REQ_PEAK, F_CPU_PEAK, F_CPU_REQ_PEAK,
	F_COLL, F_WIRE = F_COLL + N_COLLS, F_TTFT, F_TPOT, F_LATENCY, F_TOK_S, F_TOK_S_GPU, F_N
};

static void figure_names(char (*names)[64])
{
	for (int c = 0; c < N_CATS; c++) {
		snprintf(names[F_CAT + c], 64, "memory.gpu.%s_bytes", cat_name(c));
		snprintf(names[F_CAT_PEAK + c], 64, "memory.gpu.peak.%s_bytes", cat_name(c));
	}
	snprintf(names[F_PEAK], 64, "memory.gpu.peak_bytes");
	snprintf(names[F_REQ_PEAK], 64, "memory.gpu.requested_peak_bytes");
	snprintf(names[F_CPU_PEAK], 64, "memory.cpu.peak_bytes");
	snprintf(names[F_CPU_REQ_PEAK], 64, "memory.cpu.requested_peak_bytes");
	for (int k = 0; k < N_COLLS; k++)
		snprintf(names[F_COLL + k], 64, "comm.%s_bytes", coll_name(k));
	snprintf(names[F_WIRE], 64, "comm.wire_bytes");
	snprintf(names[F_TTFT], 64, "infer.ttft_s");
	snprintf(names[F_TPOT], 64, "infer.tpot_s");
	snprintf(names[F_LATENCY], 64, "infer.latency_s");
	snprintf(names[F_TOK_S], 64, "infer.tokens_per_s_per_replica");
	snprintf(names[F_TOK_S_GPU], 64, "infer.tokens_per_s_per_gpu");
}

static const char *figure_unit(int i)
{
	return i >= F_TTFT && i <= F_LATENCY ? "s" : i >= F_TOK_S ? "1/s" : "bytes";
}

/* The prediction's: the memory replay's categories at the peak, the collectives of the whole
 * schedule (prefill once, the decode block output_tokens - 1 times) and their ring wire bytes;
 * no time (the inference time model prices GPUs: NaN, not stored). */
static int predicted_figures(const InferPrediction *pr, double *v, PxError *err)
{
	const MemPlace *g = &pr->mem.place[PLACE_GPU];
	SchedWalk w;
	int i;
	for (int k = 0; k < F_N; k++)
		v[k] = k >= F_TTFT ? NAN : 0;
	for (int c = 0; c < N_CATS; c++) {
		v[F_CAT + c] = g->at_peak[c];
		v[F_CAT_PEAK + c] = g->cat_peak[c];
	}
	v[F_PEAK] = g->peak_bytes;
	v[F_REQ_PEAK] = NAN; /* the pool's figure is compared with the peak: no twin */
	v[F_CPU_PEAK] = pr->mem.place[PLACE_CPU].peak_bytes;
	v[F_CPU_REQ_PEAK] = NAN;
	sched_walk_init(&w, &pr->sched, 0);
	for (; (i = sched_walk_op(&w, err)) >= 0; sched_walk_advance(&w)) {
		const Op *op = &pr->sched.ops[i];
		if (op->kind != OP_COLL)
			continue;
		double n = op->nranks;
		v[F_COLL + op->sub] += op->bytes;
		v[F_WIRE] += op->bytes * (op->sub == COLL_ALL_REDUCE ? 2 * (n - 1) / n : (n - 1) / n);
	}
	return i == SCHED_WALK_ERROR ? -1 : 0;
}

static void measured_figures(const InferScenario *sc, const InferRunner *run, const Comm *world,
			     double *v)
{
	const Arena *a = infer_runner_arena(run);
	const CommCounters *c = comm_counters(world);
	InferTimes t = infer_runner_times(run);
	for (int k = 0; k < N_CATS; k++) {
		v[F_CAT + k] = a->at_peak[PLACE_GPU][k];
		v[F_CAT_PEAK + k] = a->cat_peak[PLACE_GPU][k];
	}
	v[F_PEAK] = arena_held_peak(a, PLACE_GPU);
	v[F_REQ_PEAK] = a->peak[PLACE_GPU];
	v[F_CPU_PEAK] = arena_held_peak(a, PLACE_CPU);
	v[F_CPU_REQ_PEAK] = a->peak[PLACE_CPU];
	v[F_WIRE] = 0;
	for (int k = 0; k < N_COLLS; k++) {
		v[F_COLL + k] = (double)c->payload_bytes[k][GROUP_TP];
		v[F_WIRE] += c->wire_bytes[k][GROUP_TP];
	}
	double so = (double)sc->wl.output_tokens, latency = t.ttft_s + t.decode_s;
	v[F_TTFT] = t.ttft_s;
	v[F_TPOT] = t.decode_steps > 0 ? t.decode_s / (double)t.decode_steps : NAN;
	v[F_LATENCY] = latency;
	v[F_TOK_S] = (double)sc->wl.batch * so / latency;
	v[F_TOK_S_GPU] = v[F_TOK_S] / (double)sc->inf.tp;
}

/* ---- storing ---- */

/* rows of n ranks' figures (F_N each), NaN left out; extra (predicted only) first */
static size_t figure_rows(const double *all, int n, char (*names)[64], const Metric *extra,
			  int n_extra, DbMetric *rows)
{
	size_t k = 0;
	for (int r = 0; r < n; r++) {
		for (int i = 0; i < n_extra; i++)
			rows[k++] = (DbMetric){r, extra[i].name, extra[i].value, extra[i].unit};
		for (int i = 0; i < F_N; i++)
			if (!isnan(all[(size_t)r * F_N + i]))
				rows[k++] = (DbMetric){r, names[i], all[(size_t)r * F_N + i],
						       figure_unit(i)};
	}
	return k;
}

static int store_runs(const InferRunOpts *o, const InferScenario *sc, const InferPrediction *pr,
		      const double *pred, const double *meas, int world, long long *ids,
		      PxError *err)
{
	char names[F_N][64];
	Metric m[METRICS_MAX], keep[METRICS_MAX];
	int n = infer_metrics_collect(sc, pr, m), nk = 0, rc = -1;
	for (int i = 0; i < n; i++) /* the GPU time model's figures are not a CPU run's */
		if (strncmp(m[i].name, "infer.ttft", 10) && strncmp(m[i].name, "infer.tpot", 10) &&
		    strncmp(m[i].name, "infer.latency", 13) && strncmp(m[i].name, "infer.tokens", 12))
			keep[nk++] = m[i];
	figure_names(names);
	DbMetric *rows = calloc((size_t)world * (F_N + METRICS_MAX), sizeof(*rows));
	double *predall = calloc((size_t)world * F_N, sizeof(double));
	char *json = infer_scenario_resolved_json(sc);
	PxDb *db = NULL;
	if (!rows || !predall || !json) {
		px_fail(err, PX_ERR_RUNTIME, "out of memory");
		goto out;
	}
	for (int r = 0; r < world; r++) /* every rank runs the same schedule */
		memcpy(predall + (size_t)r * F_N, pred, F_N * sizeof(double));
	if (db_open(o->db_path, &db, err))
		goto out;
	DbRun p = {.scenario_name = sc->name, .scenario_json = json, .kind = "predicted",
		   .status = "ok", .notes = "inference on backend cpu: memory and communication "
		   "predicted; the inference time model prices GPUs, so no time is predicted",
		   .metrics = rows, .world_size = world};
	p.n_metrics = figure_rows(predall, world, names, keep, nk, rows);
	if (db_write_run(db, &p, &ids[0], err))
		goto out;
	DbRun mr = {.scenario_name = sc->name, .scenario_json = json, .kind = "measured",
		    .status = "ok", .predicted_run_id = ids[0], .metrics = rows,
		    .notes = "parallax run --backend cpu, inference: memory as the executor requested "
		    "it (the pool's mapped bytes for the peaks), bytes counted by the MPI transport, "
		    "times from the wall clock"};
	mr.n_metrics = figure_rows(meas, world, names, NULL, 0, rows);
	rc = db_write_run(db, &mr, &ids[1], err);
out:
	db_close(db);
	cJSON_free(json);
	free(predall);
	free(rows);
	return rc;
}

/* ---- printing ---- */

static void print_table(const InferScenario *sc, const double *pred, const double *meas,
			const int *tokens, int world)
{
	char names[F_N][64];
	figure_names(names);
	printf("# generated (sequence 0):");
	for (long long i = 0; i < sc->wl.output_tokens; i++)
		printf(" %d", tokens[i]);
	printf("\n\n%-38s %14s %14s %9s\n", "metric (rank 0)", "predicted", "measured", "error");
	for (int i = 0; i < F_N; i++) {
		if (i >= F_CAT_PEAK && i < F_PEAK)
			continue; /* each category's own peak: stored, not shown */
		if (isnan(meas[i]) || (pred[i] == 0 && meas[i] == 0 && i < F_TTFT))
			continue;
		if (isnan(pred[i]))
			printf("%-38s %14s %14.6g %9s\n", names[i], "-", meas[i], "-");
		else
			printf("%-38s %14.0f %14.0f %8.3f%%\n", names[i], pred[i], meas[i],
			       pred[i] ? (meas[i] - pred[i]) / pred[i] * 100 : 0.0);
	}
	printf("# memory: requested = the schedule's buffers as the executor allocated them; "
	       "memory.gpu.peak_bytes measured:\n# the pool's mapped bytes. Communication over the "
	       "whole generation (prefill and %lld decode steps),\n# counted by the transport. "
	       "Times: wall clock of rank 0 (%d rank(s)); the prediction's time is a GPU's\n",
	       sc->wl.output_tokens - 1, world);
}

static void print_json(const InferScenario *sc, const double *pred, const double *meas,
		       const int *prompt, const InferRunner *run, int world)
{
	const int *tokens = infer_runner_tokens(run);
	char names[F_N][64];
	cJSON *j = cJSON_CreateObject(), *pj = cJSON_CreateObject(), *mj = cJSON_CreateObject();
	cJSON *tk = cJSON_CreateArray(), *pr = cJSON_CreateArray();
	figure_names(names);
	cJSON_AddStringToObject(j, "scenario", sc->name);
	cJSON_AddNumberToObject(j, "ranks", world);
	for (long long b = 0; b < sc->wl.batch; b++) {
		cJSON *row = cJSON_CreateArray(), *prow = cJSON_CreateArray();
		for (long long i = 0; i < sc->wl.output_tokens; i++)
			cJSON_AddItemToArray(row, cJSON_CreateNumber(tokens[b * sc->wl.output_tokens + i]));
		for (long long i = 0; i < sc->wl.prompt_tokens; i++)
			cJSON_AddItemToArray(prow, cJSON_CreateNumber(prompt[b * sc->wl.prompt_tokens + i]));
		cJSON_AddItemToArray(tk, row);
		cJSON_AddItemToArray(pr, prow);
	}
	cJSON_AddItemToObject(j, "prompt", pr);
	cJSON_AddItemToObject(j, "tokens", tk);
	static const char *const lname[2] = {"logits_prefill", "logits_last"};
	for (int k = 0; k < 2; k++) { /* rank 0's, every sequence's (B, V) */
		cJSON *l = cJSON_CreateArray();
		const float *v = infer_runner_logits(run, k);
		for (long long i = 0; i < sc->wl.batch * sc->model.V; i++)
			cJSON_AddItemToArray(l, cJSON_CreateNumber(v[i]));
		cJSON_AddItemToObject(j, lname[k], l);
	}
	for (int i = 0; i < F_N; i++) {
		if (!isnan(pred[i]))
			cJSON_AddNumberToObject(pj, names[i], pred[i]);
		if (!isnan(meas[i]))
			cJSON_AddNumberToObject(mj, names[i], meas[i]);
	}
	cJSON_AddItemToObject(j, "predicted", pj);
	cJSON_AddItemToObject(j, "measured", mj);
	char *text = cJSON_PrintUnformatted(j);
	puts(text);
	cJSON_free(text);
	cJSON_Delete(j);
}

/* ---- the run ---- */

/* Load, check and predict; the exit status (0 to go on), the message printed when speak. */
static int prepare(const InferRunOpts *o, InferScenario *sc, InferPrediction *pr, int speak)
{
	PxError err = {0};
	memset(pr, 0, sizeof(*pr));
	if (o->training_only) {
		if (speak)
			fprintf(stderr, "parallax run: %s: %s is an inference scenario; %s applies to "
				"training runs\n", o->scenario, o->scenario, o->training_only);
		return 2;
	}
	if (infer_scenario_load(sc, o->scenario, o->ov, &err))
		goto fail_loaded;
	if (infer_runner_supported(sc, &err) || infer_predict(sc, NULL, NULL, pr, &err))
		goto fail;
	return 0;
fail:
	infer_predict_free(pr);
	infer_scenario_free(sc);
fail_loaded:
	if (speak)
		fprintf(stderr, "parallax run: %s\n", err.msg);
	return err.code == PX_ERR_INPUT ? 2 : 1;
}

/* This rank's part: its replica's tensor-parallel group, the walk, the figures gathered to
 * rank 0, which prints and stores. */
static int serve(const InferRunOpts *o, const InferScenario *sc, const InferPrediction *pr,
		 Comm *world, PxError *err)
{
	int rank = comm_rank(world), size = comm_size(world), t = (int)sc->inf.tp, rc = -1;
	int B = (int)sc->wl.batch, sp = (int)sc->wl.prompt_tokens;
	Comm *tp = NULL;
	InferRunner *run = NULL;
	int *prompt = malloc((size_t)B * sp * sizeof(int));
	double *all = calloc((size_t)size * F_N, sizeof(double)), mine[F_N], pred[F_N];
	if (!prompt || !all) {
		px_fail(err, PX_ERR_RUNTIME, "out of memory");
		goto out;
	}
	/* replica k: ranks k t .. k t + t - 1, each serving the same prompts */
	if (t > 1 && comm_split(world, rank / t, rank % t, GROUP_TP, &tp, err))
		goto out;
	infer_runner_prompt(prompt, B, sp, (int)sc->model.V, (uint64_t)o->seed);
	if (infer_runner_create(sc, &pr->sched, tp, prompt, (uint64_t)o->seed, &run, err))
		goto out;
	comm_counters_reset(world);
	if (infer_runner_run(run, err))
		goto out;
	measured_figures(sc, run, world, mine);
	/* doubles carried as pairs of 16-bit elements: an all-gather moves them bit for bit */
	if (comm_all_gather(world, mine, all, F_N * 4, COMM_FP16, err) ||
	    predicted_figures(pr, pred, err))
		goto out;
	rc = 0;
	if (rank != 0)
		goto out;
	if (o->json)
		print_json(sc, pred, all, prompt, run, size);
	else
		print_table(sc, pred, all, infer_runner_tokens(run), size);
	long long ids[2];
	if (!o->no_db) {
		rc = store_runs(o, sc, pr, pred, all, size, ids, err);
		if (!rc && !o->json)
			printf("# stored predicted run %lld and measured run %lld in %s\n", ids[0], ids[1],
			       o->db_path);
	}
out:
	infer_runner_destroy(run);
	comm_destroy(tp);
	free(all);
	free(prompt);
	return rc;
}

int infer_run(const InferRunOpts *o, int launched, char **argv, int argc)
{
	InferScenario sc;
	InferPrediction pr;
	PxError err = {0};
	CommEnv env;
	int rank0 = !launched || (comm_env_probe(&env) && env.rank == 0);
	/* the supervisor checks before it starts ranks; under a launcher, rank 0 speaks */
	int rc = prepare(o, &sc, &pr, !launched || rank0);
	if (rc)
		return rc;
	if (!launched && o->ranks > 1) {
		infer_predict_free(&pr);
		infer_scenario_free(&sc);
		return launch_mpirun("run", o->ranks, argv, argc);
	}
	CommConfig cfg;
	Comm *world = NULL;
	comm_config_init(&cfg);
	cfg.deadline_s = o->deadline;
	if (comm_init(NULL, &cfg, &world, &err)) {
		fprintf(stderr, "parallax run: %s\n", err.msg);
		rc = 1;
		goto out;
	}
	if (comm_rank(world) == 0 && !o->json)
		printf("# parallax run %s: inference, %d rank(s), tensor parallel %lld, %s, batch %lld, "
		       "prompt %lld tokens, %lld generated (greedy)\n", sc.name, comm_size(world),
		       sc.inf.tp, sc.inf.quant == IQ_INT8_KERNEL ? "int8 weights, fp16 compute" :
		       infer_dtype_name(sc.inf.dtype), sc.wl.batch, sc.wl.prompt_tokens,
		       sc.wl.output_tokens);
	if (serve(o, &sc, &pr, world, &err)) {
		fprintf(stderr, "parallax run: rank %d: %s\n", comm_rank(world), err.msg);
		rc = err.code ? err.code : 1;
	}
	PxError ferr;
	if (comm_finalize(world, &ferr) && !rc)
		rc = 1;
out:
	infer_predict_free(&pr);
	infer_scenario_free(&sc);
	return rc;
}

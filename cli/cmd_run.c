/* parallax run: train the scenario's model for real with the CPU executor across MPI ranks, then
 * store what it measured beside what the simulator predicts for the same resolved scenario. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdatomic.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../db/db.h"
#include "../engine/build.h"
#include "../engine/clock.h"
#include "../engine/infer_scenario.h"
#include "../exec/procmem.h"
#include "../exec/runner.h"
#include "../sim/hwprofile.h"
#include "../sim/metrics.h"
#include "commands.h"
#include "dslaunch.h"
#include "hwload.h"
#include "infer_run.h"
#include "launch.h"
#include "run_ckpt.h"
#include "run_gpu.h"
#include "run_measure.h"
#include "paths.h"
#include "run_guard.h"
#include "store.h"

static const char USAGE[] =
	"usage: parallax run SCENARIO.json [--backend cpu|cuda] [--comm auto|nccl|mpi]\n"
	"                    [--ranks N | --num_gpus G [--num_nodes N] | --hostfile FILE\n"
	"                    [--include SPEC | --exclude SPEC]] [--steps S]\n"
	"                    [--data FILE] [--seed N] [--set KEY=VALUE]... [--json]\n"
	"                    [--db FILE | --no-db] [--deadline SECONDS]\n"
	"\n"
	"Train the scenario's GPT-2 model for real with the executor: ZeRO stage 0-3 data\n"
	"parallelism, tensor parallelism (fp32, ZeRO 0-3), pipeline parallelism (GPipe and\n"
	"1F1B, ZeRO 0-1) and Mixture-of-Experts blocks with expert parallelism (fp32, ZeRO\n"
	"0-2), alone or together, over N ranks, every rank running its own stage's schedule, the one the simulator\n"
	"prices. Rank 0 prints one line per step, then predicted against measured memory and\n"
	"communication, and stores both runs (linked) in the results database. The bytes sent\n"
	"are counted message by message on MPI; on NCCL, which keeps no count, they are the ring\n"
	"formula's, and it says so.\n"
	"\n"
	"An inference scenario (an \"inference\" object, docs/inference.md) of backend cpu is\n"
	"served instead: its GPT-2 prefills the prompt and decodes greedily with a KV cache, tensor\n"
	"parallel over tensor_parallel.tp_size ranks (each group of them a replica), in fp32, bf16,\n"
	"fp16 or int8 weights; rank 0 prints the tokens, memory and communication against the\n"
	"prediction, time to first token, time per output token and tokens/s (--json adds the\n"
	"prompt, every sequence's tokens and the first and last logits). --steps, --comm and\n"
	"--backend cuda do not apply; --save, --resume, --data, --hw and --inject-* are refused.\n"
	"\n"
	"Before a training run starts it prints the host memory the run will need (the executor's\n"
	"buffers at their peak as predicted, per rank and for all ranks) and an estimated step\n"
	"time; when the memory exceeds what this machine has available (MemAvailable, or the\n"
	"control group's limit) it refuses with exit status 2, naming both and what to change,\n"
	"having started and stored nothing.\n"
	"\n"
	"  --backend cpu       the executor on CPUs, MPI between ranks (default; the scenario runs\n"
	"                      as backend cpu)\n"
	"  --backend cuda      the executor on CUDA GPUs, one device per rank (ranks share devices\n"
	"                      round-robin when there are fewer); the scenario runs as backend cuda\n"
	"  --hw FILE           predict with this hardware profile (parallax calibrate's): its CUDA\n"
	"                      runtime memory and its step-time figures (warned about when it\n"
	"                      was measured on another GPU than the scenario's). Backend cpu: a\n"
	"                      CPU profile (parallax calibrate --backend cpu) prices the step,\n"
	"                      by default this machine's ($PARALLAX_CPU_PROFILE, else\n"
	"                      results/cpu-profile.json or ~/.local/share/parallax/); with one,\n"
	"                      the run prints its measured step (the mean of the steps after the\n"
	"                      first) beside the predicted one\n"
	"  --comm MODE         with cuda: nccl (a GPU per rank), mpi (MPI staged through host\n"
	"                      memory: many ranks on one GPU, for correctness and memory only), or\n"
	"                      auto (default: nccl when 2+ ranks each have a GPU)\n"
	"  --ranks N           start N ranks with mpirun (default 1); under mpirun or srun the\n"
	"                      launcher's ranks are used. The cluster becomes 1 node x N ranks.\n"
	"  --num_gpus G, --num_nodes N, --hostfile FILE, --include SPEC, --exclude SPEC\n"
	"                      DeepSpeed's launcher flags, in place of --ranks: G ranks on this\n"
	"                      machine, or the hostfile's hosts ('HOST slots=N' lines, as\n"
	"                      parallax predict --help describes) started by mpirun --hostfile\n"
	"                      (a filtered copy: Open MPI places ranks by count, so --include's\n"
	"                      slot numbers choose how many, not which); --num_nodes N > 1 needs\n"
	"                      a hostfile; the cluster becomes the hosts x their GPUs\n"
	"  --model CONFIG --deepspeed_config FILE --gpu NAME  the scenario from these instead of\n"
	"                      a file, as for parallax predict; --master_addr/--master_port are\n"
	"                      accepted and unused (mpirun wires the ranks)\n"
	"  --steps S           optimizer steps (default 10)\n"
	"  --data FILE         train on FILE's bytes as tokens (vocabulary >= 256); default: a\n"
	"                      built-in generator of learnable sequences\n"
	"  --seed N            initialisation seed (default 1234)\n"
	"  --set KEY=VALUE     override a scenario key, as for predict\n"
	"  --json              print per-step losses and both sets of metrics as JSON\n"
	"  --db FILE, --no-db  results database (default $PARALLAX_DB, else results/parallax.db\n"
	"                      where ./results exists, else ~/.local/share/parallax/)\n"
	"  --deadline SECONDS  stop the whole job when a collective takes longer (default 60)\n"
	"  --save DIR          save every rank's state to DIR/step-N (atomically: a crash while\n"
	"                      saving leaves the previous checkpoint and DIR/latest valid). An\n"
	"                      earlier DIR/step-N is replaced only when it holds nothing but rank\n"
	"                      files; anything else there (a link, another file) stops the run,\n"
	"                      named, with nothing removed. A failed write (a full disk) names the\n"
	"                      file and the reason and leaves no partial file.\n"
	"  --save-every K      save every K steps (default: only after the last step)\n"
	"  --resume DIR        continue from DIR/latest, with the same ranks and scenario, up to\n"
	"                      step --steps (the losses continue as if never stopped)\n"
	"  --inject-hang R@S   fault injection for testing: rank R stops responding at step S\n"
	"  --inject-kill R@S   fault injection for testing: rank R is killed (SIGKILL) at step S\n"
	"  --inject-alloc R@BYTES  for testing: rank R holds BYTES more of the device place's\n"
	"                      memory through the steps, outside the schedule (its measured memory\n"
	"                      rises, the prediction does not)\n"
	"  -h, --help          this help\n"
	"\n"
	"A rank that hangs (a collective overruns --deadline) or is killed by a signal (kill -9,\n"
	"the OOM killer, a crash) stops the whole job with a line naming the rank and the call or\n"
	"the signal, and the run is stored as failed with what was measured up to the last\n"
	"finished step. Killing parallax run or its mpirun stops every rank; the job's shared\n"
	"memory (in /dev/shm/px-run-UID-PID) is removed, by the next run when this one was\n"
	"killed outright.\n"
	"Exit status: 0 ok, 1 runtime failure, 2 bad input or too large for this machine,\n"
	"124 a rank hung or died, 128+N mpirun was killed by signal N.\n";

typedef struct RunOpts {
	JsonOverrides ov;
	DsLaunch launch;            /* DeepSpeed's launcher flags */
	char *launch_text;          /* the scenario --model etc. make (owned), or NULL */
	long long nodes, per_node;  /* the cluster the launcher flags give (0: 1 x ranks) */
	int ranks_set;
	const char *scenario, *data, *db_path, *save, *resume;
	const char *backend, *comm; /* "cpu" or "cuda"; "auto", "nccl" or "mpi" */
	const char *hw;             /* --hw: a hardware profile, or NULL */
	RunGpu *gpu;                /* backend cuda: the device side; NULL for cpu */
	int ranks, steps, json, no_db, save_every, hang_rank, hang_step, kill_rank, kill_step;
	int alloc_rank;             /* --inject-alloc: this rank holds alloc_bytes more */
	size_t alloc_bytes;
	long long seed;
	double deadline;
} RunOpts;

static int parse_opts(int argc, char **argv, RunOpts *o)
{
	static const struct option longs[] = {
		{"backend", required_argument, 0, 'b'}, {"ranks", required_argument, 0, 'r'},
		{"steps", required_argument, 0, 's'},   {"data", required_argument, 0, 'd'},
		{"seed", required_argument, 0, 'S'},    {"set", required_argument, 0, 'o'},
		{"json", no_argument, 0, 'j'},          {"db", required_argument, 0, 'D'},
		{"no-db", no_argument, 0, 'n'},         {"deadline", required_argument, 0, 't'},
		{"save", required_argument, 0, 'v'},    {"save-every", required_argument, 0, 'e'},
		{"resume", required_argument, 0, 'R'},  {"inject-hang", required_argument, 0, 'H'},
		{"inject-kill", required_argument, 0, 'K'},
		{"inject-alloc", required_argument, 0, 'A'},
		{"comm", required_argument, 0, 'c'},     {"hw", required_argument, 0, 'w'},
		{"help", no_argument, 0, 'h'}, DSL_LONG_OPTIONS,
		{0, 0, 0, 0},
	};
	PxError err;
	char *end;
	const char *flag = "";
	int c;
	o->ranks = 1, o->steps = 10, o->seed = 1234, o->deadline = 60, o->hang_rank = -1;
	o->kill_rank = -1, o->alloc_rank = -1;
	o->backend = "cpu", o->comm = "auto";
	optind = 1;
	while ((c = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
		switch (c) {
		case 'b':
			if (strcmp(optarg, "cpu") && strcmp(optarg, "cuda")) {
				fprintf(stderr, "parallax run: --backend %s: expected cpu or cuda\n", optarg);
				return 2;
			}
			if (!compute_backend_find(optarg)) {
				fprintf(stderr, "parallax run: --backend %s: this parallax was built without "
					"CUDA (no nvcc under CUDA_HOME when it was built)\n", optarg);
				return 2;
			}
			o->backend = optarg;
			break;
		case 'c': o->comm = optarg; break;
		case 'w': o->hw = optarg; break;
		case 'r':
			flag = "--ranks", o->ranks = (int)strtol(optarg, &end, 10), o->ranks_set = 1;
			if (*end || o->ranks < 1)
				goto bad;
			break;
		case 's':
			flag = "--steps", o->steps = (int)strtol(optarg, &end, 10);
			if (*end || o->steps < 1)
				goto bad;
			break;
		case 'S':
			flag = "--seed", o->seed = strtoll(optarg, &end, 10);
			if (*end)
				goto bad;
			break;
		case 't':
			flag = "--deadline", o->deadline = strtod(optarg, &end);
			if (*end || o->deadline < 0)
				goto bad;
			break;
		case 'e':
			flag = "--save-every", o->save_every = (int)strtol(optarg, &end, 10);
			if (*end || o->save_every < 1)
				goto bad;
			break;
		case 'H':
			flag = "--inject-hang";
			if (sscanf(optarg, "%d@%d", &o->hang_rank, &o->hang_step) != 2 || o->hang_step < 1)
				goto bad;
			break;
		case 'K':
			flag = "--inject-kill";
			if (sscanf(optarg, "%d@%d", &o->kill_rank, &o->kill_step) != 2 || o->kill_step < 1)
				goto bad;
			break;
		case 'A': {
			long long bytes;
			flag = "--inject-alloc";
			if (sscanf(optarg, "%d@%lld", &o->alloc_rank, &bytes) != 2 || o->alloc_rank < 0 ||
			    bytes < 1)
				goto bad;
			o->alloc_bytes = (size_t)bytes;
			break;
		}
		case 'v': o->save = optarg; break;
		case 'R': o->resume = optarg; break;
		case 'd': o->data = optarg; break;
		case 'o':
			if (jov_add(&o->ov, optarg, &err)) {
				fprintf(stderr, "parallax run: %s\n", err.msg);
				return 2;
			}
			break;
		case 'j': o->json = 1; break;
		case 'D': o->db_path = optarg; break;
		case 'n': o->no_db = 1; break;
		case 'h': fputs(USAGE, stdout); return 0;
		default:
			switch (dslaunch_option(&o->launch, c, optarg, "run")) {
			case 1: break;
			case 0: fputs(USAGE, stderr); return 2;
			default: return 2;
			}
		}
	}
	if (optind == argc && o->launch.model) {
		o->scenario = "./(launcher flags)"; /* scenario_load_text's name; its folder is "." */
	} else if (optind != argc - 1) {
		fprintf(stderr, "parallax run: expected one scenario\n%s", USAGE);
		return 2;
	}
	static char found[PATH_MAX];
	if (!o->scenario)
		o->scenario = paths_find_input(argv[optind], found, sizeof(found));
	if (!o->db_path && !o->no_db) {
		static char dflt[PATH_MAX];
		PxError perr;
		if (paths_default_db(dflt, sizeof(dflt), 1, &perr)) {
			fprintf(stderr, "parallax run: %s\n", perr.msg);
			return 1;
		}
		o->db_path = dflt;
	}
	return -1;
bad:
	fprintf(stderr, "parallax run: %s %s: expected a positive number\n", flag, optarg);
	return 2;
}

/* ---- a run the watchdog stops ---- */

/* What rank 0's watchdog needs to record the run as failed: set once training starts. */
static struct FailCtx {
	RunOpts *o;
	Scenario *sc;
	Prediction *pr;
	Runner *run;
	Comm *world;
	long step;
	const RunMarks *clk;
} fail_ctx;

static int store_runs(RunOpts *o, Scenario *sc, Prediction *pr, const double *all, int rank0,
		      int size, int steps, const char *status, const char *notes, PxError *err);

/* The watchdog thread of rank 0, the main thread blocked in the overdue collective: store what
 * was measured up to the last finished step as a failed run, with the watchdog's line. */
static void record_failure(void *ctx, const char *line)
{
	struct FailCtx *f = ctx;
	double mine[MEAS_N];
	char notes[512];
	PxError err;
	if (!f->run || comm_rank(f->world) != 0 || f->o->no_db)
		return;
	long done = f->clk->steps > 0 ? f->clk->steps : 1;
	run_measure(f->o->gpu, f->run, f->world, f->clk, mine);
	snprintf(notes, sizeof(notes), "parallax run --backend %s stopped at step %ld: %s",
		 f->o->backend, f->step, line);
	if (store_runs(f->o, f->sc, f->pr, mine, 0, 1, (int)done, "failed", notes, &err))
		fprintf(stderr, "parallax run: could not record the failed run: %s\n", err.msg);
	else
		fprintf(stderr, "parallax run: recorded the failed run in %s\n", f->o->db_path);
}

/* The predicted run and the measured one linked to it; size ranks' measurements in all (none:
 * a run that stopped before its first step ended), the first of them rank rank0. */
static int store_runs(RunOpts *o, Scenario *sc, Prediction *pr, const double *all, int rank0,
		      int size, int steps, const char *status, const char *notes, PxError *err)
{
	PxDb *db = NULL;
	long long pid, mid;
	char names[MEAS_N][64];
	DbMetric *rows = calloc((size_t)size * MEAS_N + 1, sizeof(*rows));
	char *json = scenario_resolved_json(sc, pr->plan.world, pr->plan.dp);
	int rc = -1;
	if (!rows || !json) {
		px_fail(err, PX_ERR_RUNTIME, "out of memory");
		goto out;
	}
	int n = run_measured_rows(all, rank0, size, steps, rows, names);
	DbRun m = {.scenario_name = sc->name, .scenario_json = json, .kind = "measured",
		   .status = status, .metrics = rows, .n_metrics = (size_t)n, .notes = notes};
	if (db_open(o->db_path, &db, err) || store_prediction(db, sc, pr, &pid, err))
		goto out;
	m.predicted_run_id = pid;
	if (db_write_run(db, &m, &mid, err))
		goto out;
	if (!o->json && !strcmp(status, "ok"))
		printf("# stored predicted run %lld and measured run %lld in %s\n", pid, mid, o->db_path);
	rc = 0;
out:
	db_close(db);
	cJSON_free(json);
	free(rows);
	return rc;
}

/* ---- the run ---- */

/* One JSON object on one line: the losses and the global gradient norms before clipping (step by
 * step, from first), and rank 0's predicted and measured metrics. */
static void print_json(const Scenario *sc, const Prediction *pr, const double *all, int size,
		       long first, int steps, const double *losses, const double *norms,
		       double step_s)
{
	Metric m[METRICS_MAX];
	char names[MEAS_N][64];
	DbMetric *rows = calloc((size_t)MEAS_N, sizeof(*rows));
	cJSON *j = cJSON_CreateObject(), *l = cJSON_CreateArray(), *g = cJSON_CreateArray();
	cJSON *pj = cJSON_CreateObject(), *mj = cJSON_CreateObject();
	int n = metrics_collect(pr, 0, m);
	for (int i = 0; i < n; i++)
		if (m[i].known)
			cJSON_AddNumberToObject(pj, m[i].name, m[i].value);
	int k = rows ? run_measured_rows(all, 0, 1, steps, rows, names) : 0;
	for (int i = 0; i < k; i++)
		cJSON_AddNumberToObject(mj, rows[i].name, rows[i].value);
	for (long s = first; s <= steps; s++) {
		cJSON_AddItemToArray(l, cJSON_CreateNumber(losses[s - 1]));
		cJSON_AddItemToArray(g, cJSON_CreateNumber(norms[s - 1]));
	}
	cJSON_AddStringToObject(j, "scenario", sc->name);
	cJSON_AddNumberToObject(j, "ranks", size);
	cJSON_AddNumberToObject(j, "first_step", (double)first);
	cJSON_AddNumberToObject(j, "steps", steps);
	cJSON_AddItemToObject(j, "losses", l);
	cJSON_AddItemToObject(j, "grad_norms", g);
	cJSON_AddNumberToObject(j, "step_s", step_s);
	cJSON_AddItemToObject(j, "predicted", pj);
	cJSON_AddItemToObject(j, "measured", mj);
	char *text = cJSON_PrintUnformatted(j);
	puts(text);
	cJSON_free(text);
	cJSON_Delete(j);
	free(rows);
}

/* Predicted against measured, rank 0. A row's measured figure may have another name: the
 * device's own peak reading (backend cuda) sits beside the predicted peak. */
/* Rank 0's overlap of compute with started collectives (docs/gpu_comm.md), per step. */
static void print_overlap(const RunnerOverlap *ov, int steps)
{
	printf("# overlap (rank 0, per step): %lld collectives started on the prefetch and reduction "
	       "streams; %lld of %lld computes ran while one was in flight\n",
	       ov->started / steps, ov->computes_overlapped / steps, ov->computes / steps);
}

/* A 1-bit optimizer's compressed and local steps: their measured mean beside the prediction's
 * step of that kind (sim/onebit.h), where there were such steps. */
static void print_kind_speed(const Prediction *pr, const RunMarks *clk)
{
	const OneBitRun *o = &pr->onebit;
	for (int k = ONEBIT_COMPRESSED; k < N_ONEBIT_STEPS; k++) {
		double s = run_clock_kind_s(clk, k);
		if (!(s > 0))
			continue;
		printf("# step time, %s steps: measured %.4f s (the mean of %ld)", onebit_step_name(k),
		       s, clk->steady_n[k]);
		if (o->active && o->time_known)
			printf(", predicted %.4f s (%+.1f%%)", o->step_s[k],
			       (o->step_s[k] - s) / s * 100);
		else if (pr->time_known && o->time_note[0])
			printf(", not predicted: %s", o->time_note);
		printf("\n");
	}
}

/* Measured throughput beside the prediction: the same model FLOPs a step (the plan's, counted
 * as the time model counts them), so MFU scales with the step time. The measured step is the
 * mean of the steps after the first (its warm-up: first touches of memory, the BLAS's threads
 * starting) when there are more than one; of them, a 1-bit optimizer's full-precision steps,
 * whose schedule the prediction's step time prices (its other kinds follow, apart). */
static void print_speed(const Prediction *pr, const RunMarks *clk)
{
	char how[160];
	double step_s = run_clock_step_s(clk);
	long other = clk->steady_n[ONEBIT_COMPRESSED] + clk->steady_n[ONEBIT_LOCAL];
	if (!(step_s > 0)) {
		print_kind_speed(pr, clk);
		return;
	}
	if (clk->steps > 1 && other)
		snprintf(how, sizeof(how), "the mean of the %ld full-precision steps among 2-%ld; "
			 "the first, %.4f s, the warm-up, left out", clk->steady_n[ONEBIT_FULL],
			 clk->steps, clk->first_s);
	else if (clk->steps > 1)
		snprintf(how, sizeof(how), "the mean of steps 2-%ld; the first, %.4f s, the warm-up, "
			 "left out", clk->steps, clk->first_s);
	else
		snprintf(how, sizeof(how), "one step, its warm-up included");
	if (!pr->time_known) { /* the prediction's note is stored with it: compare shows it */
		printf("# step time: %.4f s (%s)\n", step_s, how);
		print_kind_speed(pr, clk);
		return;
	}
	const TimeResult *t = &pr->time;
	double ratio = t->step_s / step_s; /* measured rate over predicted */
	printf("# step time: measured %.4f s (%s), predicted %.4f s (%+.1f%%; profile %s)\n", step_s,
	       how, t->step_s, (t->step_s - step_s) / step_s * 100, pr->hw_source);
	printf("# speed: measured %.4f s a step, %.0f tokens/s, %.3g TFLOP/s per GPU of model FLOPs, "
	       "MFU %.4f; predicted %.4f s, %.0f tokens/s, MFU %.4f\n", step_s,
	       t->tokens_per_s * ratio, t->tflops_per_gpu * ratio, t->mfu * ratio, t->step_s,
	       t->tokens_per_s, t->mfu);
	print_kind_speed(pr, clk);
}

/* counted: CommCounters.wire_counted (the transport's count, or the ring formula's figure) */
static void print_compare(const Prediction *pr, const double *meas, int steps, int counted)
{
	Metric m[METRICS_MAX];
	int n = metrics_collect(pr, 0, m);
	/* the predicted figure, the measured one beside it (NULL: of the same name), and what the
	 * measured one is */
	static const struct { const char *pred, *meas, *as; } rows_shown[] = {
		{"memory.gpu.params_bytes", NULL, "requested"},
		{"memory.gpu.grads_bytes", NULL, "requested"},
		{"memory.gpu.optimizer_bytes", NULL, "requested"},
		{"memory.gpu.activations_bytes", NULL, "requested"},
		{"memory.gpu.buffers_bytes", NULL, "requested"},
		{"memory.gpu.overhead_bytes", NULL, "requested"},
		{"memory.gpu.workspace_bytes", NULL, "requested"},
		{"memory.gpu.runtime.cuda_context_bytes", NULL, "device reading"},
		{"memory.gpu.runtime.cublas_workspace_bytes", NULL, "device reading"},
		{"memory.gpu.runtime.nccl_bytes", NULL, "device reading"},
		{"memory.gpu.peak_bytes", "memory.gpu.requested_peak_bytes", "requested"},
		{"memory.gpu.peak_bytes", NULL, "allocator"},
		{"memory.gpu.torch.max_reserved_bytes", NULL, "caching alloc."},
		{"memory.gpu.peak_bytes", "memory.gpu.device_peak_bytes", "device reading"},
		{"memory.cpu.params_bytes", NULL, "requested"},
		{"memory.cpu.grads_bytes", NULL, "requested"},
		{"memory.cpu.optimizer_bytes", NULL, "requested"},
		{"memory.cpu.peak_bytes", "memory.cpu.requested_peak_bytes", "requested"},
		{"memory.cpu.peak_bytes", NULL, "allocator"},
		{"comm.all_gather_bytes", NULL, "issued"}, {"comm.reduce_scatter_bytes", NULL, "issued"},
		{"comm.all_reduce_bytes", NULL, "issued"}, {"comm.all_to_all_bytes", NULL, "issued"},
		{"comm.wire_bytes", NULL, "sent"},
		{"comm.onebit_compressed.all_to_all_bytes", NULL, "issued"},
		{"comm.onebit_compressed.all_gather_bytes", NULL, "issued"},
		{"comm.onebit_compressed.wire_bytes", NULL, "sent"},
		{"comm.onebit_local.wire_bytes", NULL, "sent"},
	};
	char names[MEAS_N][64];
	DbMetric rows[MEAS_N];
	run_measured_rows(meas, 0, 1, steps, rows, names);
	printf("\n%-38s %14s %14s %9s  %s\n", "metric (rank 0, per step)", "predicted", "measured",
	       "error", "measured as");
	for (size_t i = 0; i < sizeof(rows_shown) / sizeof(rows_shown[0]); i++) {
		const char *pk = rows_shown[i].pred, *mk = rows_shown[i].meas ? rows_shown[i].meas : pk;
		double pv = NAN, mv = NAN;
		for (int j = 0; j < n; j++)
			if (!strcmp(m[j].name, pk))
				pv = m[j].value;
		for (int j = 0; j < MEAS_N; j++)
			if (!strcmp(names[j], mk))
				mv = meas[j];
		if (isnan(mv) || isnan(pv))
			continue; /* a figure this backend does not measure or predict */
		if (!strncmp(pk, "memory.cpu.", 11) && pv == 0 && mv == 0)
			continue; /* host memory: shown when something is offloaded to it */
		if (!strcmp(pk, "comm.all_to_all_bytes") && pv == 0 && mv == 0)
			continue; /* an MoE model's: shown when it has experts */
		double e = pv != 0 ? (mv - pv) / pv * 100 : (mv == 0 ? 0 : NAN);
		printf("%-38s %14.0f %14.0f %8.3f%%  %s\n", mk, pv, mv, e, rows_shown[i].as);
	}
	double rss = NAN;
	for (int j = 0; j < MEAS_N; j++)
		if (!strcmp(names[j], "memory.process.rss_peak_bytes"))
			rss = meas[j];
	if (!isnan(rss))
		printf("%-38s %14s %14.0f %9s  VmHWM\n", "memory.process.rss_peak_bytes", "-", rss, "-");
	if (pr->onebit.active)
		printf("# 1-bit %s: comm.* are the full-precision steps' (warm-up), "
		       "comm.onebit_compressed.* the compressed steps'%s, each per step of its kind\n",
		       pr->plan.sc->ds.optimizer,
		       pr->onebit.zero_one ? ", comm.onebit_local.* the local steps'" : "");
	printf("# memory in bytes at its peak, measured as: requested = what the executor asked for "
	       "under the schedule's\n# labels; allocator = what its allocator held from the system "
	       "(the CPU backend's pool: mapped\n# segments; CUDA: its pool's reserve, or what it asked "
	       "of cudaMalloc: PX_CUDA_ALLOC); VmHWM = the\n# whole process's peak resident set. "
	       "Communication per optimizer step: issued = the calls'\n# payloads; sent: wire bytes "
	       "%s\n",
	       counted ? "counted message by message by the transport" :
			 "computed from the ring formula (NCCL keeps no byte count)");
}

static void sample_peak(void *gpumem)
{
	gpumem_sample(gpumem);
}

/* The executor's own scenario, once per process: its backend on a hostfile's nodes, else on one
 * node of size ranks, or, with ZeRO++'s hpZ or qgZ or FSDP's HYBRID_SHARD (whose groups are a
 * node's: exec/runner_zpp.c), on nodes of the scenario's gpus_per_node ranks where that divides
 * size. */
static int run_overrides(RunOpts *o, int size, PxError *err)
{
	char arg[64], nodes[64], backend[32];
	int gpn = size, n_nodes = 1;
	if (o->nodes) { /* a hostfile's: its nodes and slots */
		gpn = (int)o->per_node, n_nodes = (int)o->nodes;
	} else {
		Scenario sc;
		if (o->launch_text ? scenario_load_text(&sc, o->scenario, o->launch_text, &o->ov, err) :
				     scenario_load(&sc, o->scenario, &o->ov, err))
			return -1;
		const DsZero *z = &sc.ds.zero;
		long long g = sc.cluster.gpus_per_node;
		int by_node = (z->stage == 3 && (z->hpz_partition_size > 1 ||
						 z->quantized_gradients)) ||
			      (sc.framework == FRAMEWORK_FSDP &&
			       scenario_fsdp_hybrid(sc.fsdp.sharding));
		if (by_node && g > 0 && g < size && size % g == 0)
			gpn = (int)g;
		scenario_free(&sc);
		n_nodes = size / gpn;
	}
	snprintf(arg, sizeof(arg), "cluster.gpus_per_node=%d", gpn);
	snprintf(nodes, sizeof(nodes), "cluster.nodes=%d", n_nodes);
	snprintf(backend, sizeof(backend), "backend=%s", o->backend);
	return jov_add(&o->ov, backend, err) || jov_add(&o->ov, nodes, err) ||
	       jov_add(&o->ov, arg, err) ? -1 : 0;
}

/* The executor's scenario (run_overrides) loaded and predicted into sc and pr, priced with
 * --hw's profile when given (warned about, when speak, if it was measured on another GPU). On
 * success the caller frees both; on failure nothing is left. */
static int run_predict(RunOpts *o, Scenario *sc, Prediction *pr, int speak, PxError *err)
{
	if (o->launch_text ? scenario_load_text(sc, o->scenario, o->launch_text, &o->ov, err) :
			     scenario_load(sc, o->scenario, &o->ov, err))
		return -1;
	HwProfile hw = {0};
	char warn[1024];
	if (o->hw && hwprofile_load(o->hw, &hw, err))
		goto out_scenario;
	if (o->hw && speak && (hwprofile_gpu_mismatch(&hw, o->hw, &sc->cluster.gpu, warn,
						      sizeof(warn)) ||
			       hwload_cpu_mismatch(&hw, o->hw, warn, sizeof(warn))))
		fprintf(stderr, "parallax run: %s\n", warn);
	if (o->hw)
		hwprofile_apply_memory(&hw, &sc->cluster);
	/* ranks that communicate through host memory (--comm mpi, or auto where ranks share a GPU
	 * or run alone: run_gpu_setup) hold no NCCL buffers on the device; before the GPU is set up
	 * (the launcher's memory guard) a lone rank under auto is known to be one of them */
	if (o->gpu ? strcmp(o->gpu->comm_name, "nccl") != 0 :
		     !strcmp(o->comm, "mpi") || (!strcmp(o->comm, "auto") && o->ranks == 1))
		sc->cluster.nccl_buffers_bytes = 0;
	if (predict_run(sc, pr, err))
		goto out_scenario;
	/* the step time: a CUDA run's with --hw; a CPU run's with a CPU profile, --hw's or this
	 * machine's (a GPU's profile gives a CPU run its memory figures only) */
	int cpu = sc->backend == BACKEND_CPU, rc = 0;
	PxNotes said;
	px_notes_init(&said);
	if (o->hw && (!cpu || hw.cpu))
		rc = predict_time(pr, &hw, o->hw, err);
	else if (!o->hw && cpu)
		rc = hwload_cpu_default(pr, &said, err);
	else if (cpu)
		snprintf(pr->time_note, sizeof(pr->time_note), "backend cpu: %.700s is a GPU's "
			 "profile; the CPU executor's step time needs a CPU profile (`parallax "
			 "calibrate --backend cpu`)", o->hw);
	for (int k = 0; speak && k < said.n_warnings; k++)
		fprintf(stderr, "parallax run: %s\n", said.warnings[k]);
	px_notes_free(&said);
	if (rc) {
		predict_free(pr);
		goto out_scenario;
	}
	hwprofile_free(&hw);
	return 0;
out_scenario:
	hwprofile_free(&hw);
	scenario_free(sc);
	return -1;
}

/* ---- what the guardian learns from its worker ---- */

/* Pages shared with the guardian (launch_shared), written by the worker as it goes, read by the
 * guardian once the worker was killed: the step it was in and its measurements over the steps it
 * finished. Two copies, so that a worker killed while writing one leaves the other whole. */
typedef struct RunBeacon {
	_Atomic long step;         /* the step in progress; 0 before the first */
	_Atomic int cur;           /* the copy last written in full */
	long done[2];              /* steps finished in this run */
	double meas[2][MEAS_N];    /* run_measure()'s vector over them */
} RunBeacon;

static RunBeacon *beacon; /* NULL: no guardian */

static void beacon_put(const RunOpts *o, const Runner *run, Comm *world, const RunMarks *clk)
{
	if (!beacon)
		return;
	int next = !atomic_load(&beacon->cur);
	run_measure(o->gpu, run, world, clk, beacon->meas[next]);
	beacon->done[next] = clk->steps;
	atomic_store(&beacon->cur, next);
}

/* --inject-alloc: bytes of the device place's memory held through the steps outside the
 * schedule, every page touched; NULL with err when it cannot be had. */
static void *inject_alloc(const ComputeBackend *cb, void *cx, size_t bytes, PxError *err)
{
	void *p = cb->alloc(cx, PLACE_GPU, bytes);
	if (!p) {
		px_fail(err, PX_ERR_RUNTIME, "--inject-alloc: out of memory for %zu bytes", bytes);
		return NULL;
	}
	char one = 1;
	for (size_t i = 0; i < bytes; i += 4096) /* resident, not only mapped */
		cb->from_host(cx, (char *)p + i, &one, 1);
	return p;
}

/* The measured run's notes: how it ran, and what its figures cover. */
static void run_notes(const RunOpts *o, int ran, int rss_reset, int wire_counted, char *out,
		      size_t n)
{
	int k = snprintf(out, n, "parallax run --backend %s%s", o->backend, wire_counted ? "" :
			 "; comm.wire_bytes computed from the ring formula (NCCL keeps no byte "
			 "count), not counted");
	if (ran == 1 && k >= 0 && (size_t)k < n)
		k += snprintf(out + k, n - (size_t)k, "\ntime.step_s: one step only, the warm-up "
			      "included (time.step_includes_warmup = 1)");
	if (rss_reset && k >= 0 && (size_t)k < n)
		snprintf(out + k, n - (size_t)k, "\nmemory.process.rss_peak_bytes: from the process's "
			 "start, set-up included (/proc/self/clear_refs: %s)", strerror(-rss_reset));
}

/* "pp 2, 1F1B" (static buffer) */
static const char *pipe_label(const Plan *p)
{
	static char text[64];
	snprintf(text, sizeof(text), "pp %lld, %s", p->par.pp, pipe_schedule_name(p->par.schedule));
	return text;
}

/* --save and --resume where the checkpoint holds the optimizer's whole state: 0/1 Adam's step
 * counters and sum of learning rates and 1-bit LAMB's per-tensor coefficients live outside the
 * buffers a checkpoint writes (runner_save), so they are refused (exit 2); 1-bit Adam's error
 * buffers are not written either, as DeepSpeed's load_state_dict drops them. */
static int ckpt_supported(const RunOpts *o, const Scenario *sc, PxError *err)
{
	const OptimKind *k = sc->ds.opt;
	if ((o->save || o->resume) && k && (optim_zero_one(k) || k->error_feedback == EF_FLAT))
		return px_fail(err, PX_ERR_INPUT, "%s: a checkpoint (%s) of %s is not written or read: "
			       "its %s are not saved", sc->name, o->save ? "--save" : "--resume",
			       k->name, optim_zero_one(k) ? "step counters and sum of learning rates" :
			       "per-tensor LAMB coefficients");
	return 0;
}

static int train(RunOpts *o, Comm *world, PxError *err)
{
	Scenario sc;
	Prediction pr;
	Runner *run = NULL;
	Schedule kind_sched[N_ONEBIT_STEPS] = {{0}}; /* a 1-bit optimizer's other step kinds' */
	RunnerComms comms = {.world = world};
	int stage = 0;
	DataSource data = {0};
	int rank = comm_rank(world), size = comm_size(world), rc = -1;
	double *losses = calloc((size_t)o->steps, sizeof(double));
	double *norms = calloc((size_t)o->steps, sizeof(double));
	const ComputeBackend *cb = compute_backend_find(o->backend);
	void *cx = NULL, *extra = NULL;
	RunMarks clk = {0};
	char notes[512];

	if (!losses || !norms) {
		px_fail(err, PX_ERR_RUNTIME, "out of memory");
		goto out_free;
	}
	if (run_predict(o, &sc, &pr, 0, err))
		goto out_free;
	if (runner_supported(&pr.plan, err) || ckpt_supported(o, &sc, err) ||
	    data_open(&data, o->data, (int)sc.model.vocab_size, (int)sc.seq, err))
		goto out_predict;
	ComputeShape shape = runner_shape(&pr.plan, o->gpu ? o->gpu->device : 0);
	if (cb->create(&shape, &cx, err))
		goto out_data;
	RunnerRuntime rt = {0};
	if (o->gpu) { /* what the CUDA runtime took, read before the executor allocates */
		run_gpu_snapshot(o->gpu, "cublas");
		run_gpu_runtime(o->gpu, &rt);
		rt.on_gpu_peak = sample_peak;
		rt.peak_ctx = &o->gpu->mem;
	}
	clk.rss_setup_bytes = procmem_rss_bytes();
	/* every rank runs its own pipeline stage's schedule */
	if (runner_comms_split(world, &pr.plan, &comms, &stage, err) ||
	    runner_create(&pr.plan, &pr.stages[stage].sched, &comms, (uint64_t)o->seed, cb, cx, &rt,
			  &run, err))
		goto out_run;
	const OptimKind *ok = pr.plan.sc->ds.opt;
	int onebit = ok && ok->error_feedback != EF_NONE;
	for (int kind = ONEBIT_COMPRESSED; onebit && kind < N_ONEBIT_STEPS; kind++) {
		if (!onebit_has_kind(optim_zero_one(ok), kind))
			continue;
		pr.plan.onebit_step = kind;
		int bad = build_schedule(&pr.plan, stage, &kind_sched[kind], err);
		pr.plan.onebit_step = ONEBIT_FULL;
		if (bad || runner_set_onebit(run, kind, &kind_sched[kind], err))
			goto out_run;
	}
	long first = 1;
	if (o->resume) {
		long saved = ckpt_load(o->resume, run, world, err);
		if (saved < 0)
			goto out_run;
		first = saved + 1;
		if (first > o->steps) {
			px_fail(err, PX_ERR_INPUT, "%s: already at step %ld; --steps %d asks for no more",
				o->resume, saved, o->steps);
			goto out_run;
		}
	}
	comm_counters_reset(world);
	/* the process's peak resident set from here, as the allocator's high-water (the set-up's
	 * scratch is given back by then: runner_create) */
	int rss_reset = procmem_reset_peak();
	if (rank == o->alloc_rank && !(extra = inject_alloc(cb, cx, o->alloc_bytes, err)))
		goto out_run;
	clk.faults0 = procmem_minor_faults();
	fail_ctx = (struct FailCtx){o, &sc, &pr, run, world, first, &clk};
	const char *wrapper = plan_optimizer_wrapper(&pr.plan);
	char layout[96];
	if (pr.plan.fsdp)
		snprintf(layout, sizeof(layout), "FSDP %s%s",
			 scenario_fsdp_sharding_name(sc.fsdp.sharding), pr.plan.m > 1 &&
			 !sc.fsdp.sync_each_batch ? " (no_sync but for the last micro-batch)" : "");
	else
		snprintf(layout, sizeof(layout), "ZeRO-%d (%s)", sc.ds.zero.stage,
			 strcmp(wrapper, "none") ? wrapper : "no optimizer wrapper");
	if (rank == 0 && !o->json)
		printf("# parallax run %s: %d rank(s), %s, %s, micro-batch %lld x %lld x dp "
		       "%lld, seq %lld%s%s\n", sc.name, size, layout,
		       dtype_name(sc.ds.dtype),
		       sc.ds.micro_batch, sc.ds.grad_accum, pr.plan.dp, sc.seq,
		       pr.plan.par.pp > 1 ? ", pipeline " : "",
		       pr.plan.par.pp > 1 ? pipe_label(&pr.plan) : "");
	/* PX_CUDA_PROFILE_STEP=S: step S alone inside the profiler's range (run_gpu_profile), e.g.
	 * a steady step under `ncu --profile-from-start off` (scripts/gpu_session.sh) */
	const char *prof_env = getenv("PX_CUDA_PROFILE_STEP");
	long prof_step = prof_env ? atol(prof_env) : 0;
	for (long s = first; s <= o->steps; s++) {
		StepResult res;
		if (s == prof_step)
			run_gpu_profile(o->gpu, 1);
		double t0 = px_now_s();
		fail_ctx.step = s;
		if (beacon)
			atomic_store(&beacon->step, s);
		if (rank == o->hang_rank && s == o->hang_step) /* fault injection: stop answering */
			for (;;)
				sleep(60);
		if (rank == o->kill_rank && s == o->kill_step) /* fault injection: kill -9 */
			kill(getpid(), SIGKILL);
		double pay0[N_COLLS], wire0[N_COLLS];
		run_comm_totals(world, pay0, wire0);
		if (runner_step(run, s, &data, &res, err))
			goto out_run;
		double dt = px_now_s() - t0;
		if (s == prof_step)
			run_gpu_profile(o->gpu, 0);
		if (res.onebit_step != ONEBIT_FULL)
			run_clock_onebit(&clk, res.onebit_step, world, pay0, wire0);
		run_clock_step(&clk, run, dt, res.onebit_step);
		losses[s - 1] = res.loss;
		norms[s - 1] = res.grad_norm;
		beacon_put(o, run, world, &clk);
		if (rank == 0 && !o->json)
			printf("step %4ld  loss %.4f  lr %.3g  %8.1f ms  %9.0f tokens/s%s\n", s, res.loss,
			       res.lr, dt * 1e3, (double)(sc.ds.train_batch * sc.seq) / dt,
			       res.skipped ? "  (skipped, fp16 overflow)" : "");
		if (o->save && ((o->save_every && s % o->save_every == 0) || s == o->steps) &&
		    ckpt_save(o->save, s, run, world, err))
			goto out_run;
	}
	int ran = o->steps - (int)first + 1;
	double mine[MEAS_N], *all = calloc((size_t)size * MEAS_N, sizeof(double));
	if (!all)
		goto out_run;
	run_measure(o->gpu, run, world, &clk, mine);
	if (run_gpu_gather(world, cb, cx, mine, all, MEAS_N, err)) {
		free(all);
		goto out_run;
	}
	rc = 0;
	if (rank == 0) {
		if (!o->json) {
			print_compare(&pr, all, ran, comm_counters(world)->wire_counted);
			print_overlap(runner_overlap(run), ran);
			print_speed(&pr, &clk);
		}
		if (!o->json && o->gpu) {
			printf("# rank 0's device memory readings (communication: %s)\n",
			       o->gpu->comm_name);
			gpumem_print(&o->gpu->mem, stdout);
		}
		run_notes(o, ran, rss_reset, comm_counters(world)->wire_counted, notes, sizeof(notes));
		if (!o->no_db)
			rc = store_runs(o, &sc, &pr, all, 0, size, ran, "ok", notes, err);
		if (o->json)
			print_json(&sc, &pr, all, size, first, o->steps, losses, norms,
				   run_clock_step_s(&clk));
	}
	free(all);
out_run:
	fail_ctx.run = NULL;
	if (rc && comm_in_flight(world)) {
		/* the started collectives own their buffers until the job ends: main aborts it */
		runner_abandon(run);
		return rc;
	}
	if (extra)
		cb->release(cx, PLACE_GPU, extra);
	runner_destroy(run);
	for (int i = 0; i < N_ONEBIT_STEPS; i++)
		sched_free(&kind_sched[i]);
	runner_comms_free(&comms);
	if (cx)
		cb->destroy(cx);
out_data:
	data_close(&data);
out_predict:
	predict_free(&pr);
	scenario_free(&sc);
out_free:
	free(losses);
	free(norms);
	return rc;
}

/* ---- before the run, and after a killed rank ---- */

/* What the run will need against what this machine has, said before anything starts; the
 * refusal (2) when it does not fit. ranks_here: the ranks on this machine; speak: this process
 * prints (rank 0, or the first rank of a node under a launcher). 0 to go on, else the exit
 * status. */
static int run_guard(RunOpts *o, int ranks_here, int speak)
{
	Scenario sc;
	Prediction pr;
	PxError err = {0};
	RunNeed need;
	char source[128], how[1400];
	double avail, est_s = 0;
	if (run_predict(o, &sc, &pr, speak, &err)) {
		if (speak)
			fprintf(stderr, "parallax run: %s\n", err.msg);
		return err.code == PX_ERR_INPUT ? 2 : 1;
	}
	int rc = 0;
	if (runner_supported(&pr.plan, &err) || ckpt_supported(o, &sc, &err)) {
		/* what it cannot run at all comes first */
		if (speak)
			fprintf(stderr, "parallax run: %s\n", err.msg);
		rc = err.code == PX_ERR_INPUT ? 2 : 1;
		goto out;
	}
	run_need(&pr, ranks_here, &need);
	if (run_mem_available(&avail, source, sizeof(source))) {
		if (speak)
			fprintf(stderr, "parallax run: cannot read the memory available (no "
				"/proc/meminfo): starting without checking that the run fits\n");
		goto out;
	}
	if (need.total_bytes > avail) {
		rc = run_guard_report(sc.name, o->backend, &need, avail, source, 0, "", NULL);
		goto out;
	}
	if (!speak)
		goto out;
	if (pr.time_known) {
		est_s = pr.time.step_s;
		snprintf(how, sizeof(how), "the time model with the %.256s profile", pr.hw_source);
	} else if (sc.backend == BACKEND_CPU) {
		/* the MLP's first product, the model's largest; the ranks share the machine's
		 * cores, which the probe had all of */
		int tokens = (int)(pr.plan.shape.b * pr.plan.shape.s), h = (int)sc.model.h;
		double rate = run_cpu_gemm_flops_per_s(tokens, h, 4 * h);
		est_s = rate > 0 ? need.flops_per_step * ranks_here / rate : 0;
		snprintf(how, sizeof(how), "a lower bound: the FLOPs of %d rank%s at this machine's best "
			 "rate for the model's matrix products, %.3g GFLOP/s measured just now; the "
			 "rest of the executor's work comes on top", ranks_here,
			 ranks_here == 1 ? "" : "s", rate / 1e9);
	} else {
		snprintf(how, sizeof(how), "%s", pr.time_note);
	}
	run_guard_report(sc.name, o->backend, &need, avail, source, est_s, how,
			 o->json ? stderr : stdout);
out:
	predict_free(&pr);
	scenario_free(&sc);
	return rc;
}

/* The guardian of a worker killed by a signal it did not pass on: say so, record the run as
 * failed with what the worker had measured over the steps it finished, and end the job as a
 * rank that died ends it (COMM_DEADLINE_EXIT). */
static int record_killed(RunOpts *o, int rank, const LaunchDeath *d)
{
	Scenario sc;
	Prediction pr;
	PxError err = {0};
	char name[32], line[256], notes[512];
	long step = atomic_load(&beacon->step);
	int cur = atomic_load(&beacon->cur);
	long done = beacon->done[cur];
	int n = snprintf(line, sizeof(line), "rank %d (pid %ld) was killed by %s (%s)", rank, d->pid,
			 launch_signal_name(d->sig, name, sizeof(name)), strsignal(d->sig));
	if (step > 0)
		snprintf(line + n, sizeof(line) - (size_t)n, " during step %ld", step);
	else
		snprintf(line + n, sizeof(line) - (size_t)n, " before its first step");
	fprintf(stderr, "parallax run: %s: the job stops (exit %d)\n", line, COMM_DEADLINE_EXIT);
	if (o->no_db)
		return COMM_DEADLINE_EXIT;
	snprintf(notes, sizeof(notes), "parallax run --backend %s stopped at step %ld: %s",
		 o->backend, step, line);
	int bad = run_predict(o, &sc, &pr, 0, &err);
	if (!bad) {
		bad = store_runs(o, &sc, &pr, beacon->meas[cur], rank, done > 0, (int)done, "failed",
				 notes, &err);
		predict_free(&pr);
		scenario_free(&sc);
	}
	if (bad)
		fprintf(stderr, "parallax run: could not record the failed run: %s\n", err.msg);
	else
		fprintf(stderr, "parallax run: recorded the failed run in %s\n", o->db_path);
	return COMM_DEADLINE_EXIT;
}

/* DeepSpeed's launcher flags: the ranks and the cluster (nodes x GPUs per node) from --num_gpus,
 * --num_nodes or the hostfile, as the supervisor resolves them; a rank under mpirun takes its
 * launcher's (every rank of a node, local_size, on each of size / local_size nodes); the scenario
 * from --model etc. when no file is given. 0, or the exit status with the message printed. */
static int run_launch_flags(RunOpts *o, int launched, const CommEnv *env)
{
	PxError err = {0};
	if (dslaunch_cluster_given(&o->launch)) {
		if (o->ranks_set) {
			fprintf(stderr, "parallax run: --ranks and --num_gpus/--num_nodes/--hostfile "
				"exclude each other\n");
			return 2;
		}
		if (launched) {
			o->per_node = env->local_size > 0 ? env->local_size : env->size;
			o->nodes = env->size % o->per_node ? 1 : env->size / o->per_node;
			if (o->nodes == 1)
				o->per_node = env->size;
		} else if (dslaunch_resolve(&o->launch, 1, &o->nodes, &o->per_node, &err)) {
			fprintf(stderr, "parallax run: %s\n", err.msg);
			return err.code ? err.code : 1;
		}
		if (o->nodes * o->per_node > 1 << 20) {
			fprintf(stderr, "parallax run: %lld ranks: too many\n", o->nodes * o->per_node);
			return 2;
		}
		o->ranks = (int)(o->nodes * o->per_node);
	}
	if (o->launch_text || !o->launch.model || strcmp(o->scenario, "./(launcher flags)"))
		return 0;
	if (!(o->launch_text = dslaunch_scenario_text(&o->launch, o->nodes ? o->nodes : 1,
						      o->nodes ? o->per_node : o->ranks, &err))) {
		fprintf(stderr, "parallax run: %s\n", err.msg);
		return err.code ? err.code : 1;
	}
	return 0;
}

int cmd_run(int argc, char **argv)
{
	RunOpts o = {0};
	PxError err = {0};
	CommEnv env;
	CommConfig cfg;
	Comm *world = NULL;
	jov_init(&o.ov);
	dslaunch_init(&o.launch);
	int rc = parse_opts(argc, argv, &o);
	if (rc >= 0)
		goto out;
	/* under a launcher its ranks count; otherwise --ranks or the launcher flags', started below */
	int launched = comm_env_probe(&env);
	if (dslaunch_any(&o.launch) && (rc = run_launch_flags(&o, launched, &env)) != 0)
		goto out;
	int size = launched ? env.size : o.ranks;
	if (run_overrides(&o, size, &err)) {
		fprintf(stderr, "parallax run: %s\n", err.msg);
		rc = 2;
		goto out;
	}
	/* an inference scenario is served, not trained (cli/infer_run.c) */
	if (infer_scenario_is(o.scenario, &err) == 1) {
		const char *only = o.save ? "--save" : o.resume ? "--resume" : o.data ? "--data" :
				   o.hw ? "--hw" : o.hang_rank >= 0 ? "--inject-hang" :
				   o.kill_rank >= 0 ? "--inject-kill" :
				   o.alloc_rank >= 0 ? "--inject-alloc" : NULL;
		InferRunOpts io = {&o.ov, o.scenario, o.db_path, size, o.json, o.no_db, o.seed,
				   o.deadline, only};
		rc = infer_run(&io, launched, argv, argc);
		goto out;
	}
	/* the supervisor checked before starting its ranks; another launcher's ranks check each
	 * for its node, its first rank speaking */
	if (!launch_run_dir()) {
		int here = !launched ? size : env.local_size > 0 ? env.local_size : size;
		rc = run_guard(&o, here, !launched || env.local_rank == 0);
		if (rc)
			goto out;
	}
	if (!launched && o.ranks > 1) {
		char hosts[PATH_MAX];
		if (o.launch.hostfile &&
		    dslaunch_write_mpi_hostfile(&o.launch, hosts, sizeof(hosts), &err)) {
			fprintf(stderr, "parallax run: %s\n", err.msg);
			rc = 1;
			goto out;
		}
		rc = launch_mpirun_hosts("run", o.ranks, o.launch.hostfile ? hosts : NULL, argv, argc);
		if (o.launch.hostfile)
			remove(hosts);
		goto out;
	}
	LaunchDeath death;
	beacon = launch_shared(sizeof(*beacon));
	int guarded = beacon ? launch_guard(launched, &death) : -1;
	if (guarded == 1) {
		rc = record_killed(&o, env.rank, &death);
		goto out;
	}
	if (guarded < 0) {
		fprintf(stderr, "parallax run: rank %d: no guardian (%s): a killed rank will not be "
			"named or recorded\n", env.rank, strerror(errno));
		beacon = NULL;
	}
	RunGpu gpu;
	if (!strcmp(o.backend, "cuda")) { /* the device first: NCCL starts on the chosen one */
		if (run_gpu_setup(&gpu, &env, o.comm, &err)) {
			fprintf(stderr, "parallax run: rank %d: %s\n", env.rank, err.msg);
			rc = err.code == PX_ERR_INPUT ? 2 : 1;
			goto out;
		}
		o.gpu = &gpu;
	}
	comm_config_init(&cfg);
	cfg.deadline_s = o.deadline;
	cfg.on_deadline = record_failure;
	cfg.ctx = &fail_ctx;
	if (comm_init(o.gpu ? o.gpu->comm : NULL, &cfg, &world, &err)) {
		fprintf(stderr, "parallax run: %s\n", err.msg);
		rc = 1;
		goto out;
	}
	if (o.gpu)
		run_gpu_snapshot(o.gpu, o.gpu->comm_name);
	rc = train(&o, world, &err) ? (err.code ? err.code : 1) : 0;
	if (rc)
		fprintf(stderr, "parallax run: rank %d: %s\n", comm_rank(world), err.msg);
	if (rc && comm_in_flight(world)) /* a failure mid-collective: finalizing is not safe */
		comm_abort(world, rc);
	PxError ferr;
	if (comm_finalize(world, &ferr) && !rc)
		rc = 1;
out:
	run_gpu_free(o.gpu);
	jov_free(&o.ov);
	dslaunch_free(&o.launch);
	free(o.launch_text);
	return rc;
}

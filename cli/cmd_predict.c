/* parallax predict: scenarios in, memory/communication tables (or JSON) and database rows out. */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../db/db.h"
#include "commands.h"
#include "dslaunch.h"
#include "hwload.h"
#include "infer_report.h"
#include "paths.h"
#include "report.h"
#include "store.h"

static const char USAGE[] =
	"usage: parallax predict SCENARIO.json... [--set KEY=VALUE]... [--json]\n"
	"                        [--db FILE | --no-db] [--timeline FILE] [--hw FILE]\n"
	"       parallax predict --model CONFIG --deepspeed_config FILE --gpu NAME\n"
	"                        [--num_nodes N] [--num_gpus G | --hostfile FILE\n"
	"                        [--include SPEC | --exclude SPEC]] [options above]\n"
	"\n"
	"Predict per-GPU memory (by place and category), communication per optimizer step and the\n"
	"step time for each scenario, print them, and store them as predicted runs in the results\n"
	"database.\n"
	"\n"
	"  --set KEY=VALUE  override any scenario key before it is read, e.g.\n"
	"                   --set deepspeed.zero_optimization.stage=3 --set cluster.nodes=16\n"
	"                   --set model.num_parameters=1e12 (VALUE is JSON, or else a string)\n"
	"  --json           print one JSON object per scenario (an array for several)\n"
	"  --db FILE        results database to write (default: $PARALLAX_DB, else\n"
	"                   results/parallax.db where ./results exists, else\n"
	"                   ~/.local/share/parallax/parallax.db)\n"
	"  --no-db          do not write any database\n"
	"  --timeline FILE  write rank 0's memory after every schedule op as a table\n"
	"                   (one scenario only)\n"
	"  --keep-going     with --no-db: price every scenario even when some are refused,\n"
	"                   printing each line as it is priced (nothing is held) and each\n"
	"                   refusal as \"parallax predict: refused SCENARIO: reason\" on\n"
	"                   stderr; exit 2 when any was refused\n"
	"  --hw FILE        price the step time with this hardware profile (JSON, as in\n"
	"                   scenarios/hardware/ or written by parallax calibrate) instead of the\n"
	"                   GPU's built-in one; its CUDA runtime memory, where it gives it, too;\n"
	"                   a profile of another GPU than the scenario's is warned about. A\n"
	"                   backend \"cpu\" scenario takes a CPU profile (parallax calibrate\n"
	"                   --backend cpu); without --hw, this machine's: $PARALLAX_CPU_PROFILE,\n"
	"                   else results/cpu-profile.json where ./results exists, else\n"
	"                   ~/.local/share/parallax/cpu-profile.json (none there: the step time\n"
	"                   is not priced, and the note says where it looked)\n"
	"  -h, --help       this help\n"
	"\n"
	"DeepSpeed's launcher flags, instead of a scenario file (or, beside one, in place of\n"
	"its model, deepspeed and cluster sections):\n"
	"  --model CONFIG   a Hugging Face config.json, or a folder holding one\n"
	"  --deepspeed_config FILE  the ds_config.json (default: DeepSpeed's defaults)\n"
	"  --gpu NAME       the GPU (parallax gpus lists them), e.g. H100-SXM\n"
	"  --num_nodes N    nodes (default 1; with --hostfile: its first N hosts)\n"
	"  --num_gpus G     GPUs per node (with --hostfile: the first G slots of each host)\n"
	"  --hostfile FILE  DeepSpeed's hostfile: one 'HOST slots=N' a line, '#' comments and\n"
	"                   blank lines allowed; a bad line is refused by its line number;\n"
	"                   every host must end up with the same number of GPUs\n"
	"  --include SPEC, --exclude SPEC  hosts and slots of the hostfile to use or leave out,\n"
	"                   DeepSpeed's syntax: worker-0@worker-1:0,2\n"
	"  --master_addr A, --master_port P  accepted for DeepSpeed's command lines; a\n"
	"                   prediction does not use them\n"
	"The scenario they make is named MODEL-DSCONFIG; --set applies to it (e.g.\n"
	"--set seq_length=8192).\n"
	"\n"
	"With one scenario the full report is printed; with several, one line each. A scenario\n"
	"not found as given is looked for in $PARALLAX_PATH and the bundled scenarios (an\n"
	"installed binary's share/parallax), so `parallax predict llama2-13b-zero3-h100.json`\n"
	"works from any folder.\n"
	"An inference scenario (one with an \"inference\" object: DeepSpeed-Inference's keys, a\n"
	"workload of batch, prompt and output tokens) is predicted as serving: memory per GPU,\n"
	"the largest batch and context that fit, time to first token, time per output token,\n"
	"latency and tokens/s (docs/inference.md); all the scenarios given must then be\n"
	"inference ones, and --timeline and --keep-going do not apply.\n"
	"Exit status: 0 ok, 1 runtime failure (database, memory), 2 bad input.\n";

typedef struct PredictOpts {
	JsonOverrides ov;
	DsLaunch launch;      /* DeepSpeed's launcher flags */
	char *launch_text;    /* the scenario they make when no scenario file is given (owned) */
	int json, no_db, keep_going;
	const char *db_path, *timeline, *hw;
} PredictOpts;

static int launch_flags(PredictOpts *o, int have_files);

static int parse_opts(int argc, char **argv, PredictOpts *o)
{
	static const struct option longs[] = {
		{"set", required_argument, 0, 's'}, {"json", no_argument, 0, 'j'},
		{"db", required_argument, 0, 'd'},  {"no-db", no_argument, 0, 'n'},
		{"timeline", required_argument, 0, 't'}, {"hw", required_argument, 0, 'w'},
		{"keep-going", no_argument, 0, 'k'}, {"help", no_argument, 0, 'h'},
		DSL_LONG_OPTIONS,
		{0, 0, 0, 0},
	};
	PxError err;
	int c;

	optind = 1;
	while ((c = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
		switch (c) {
		case 's':
			if (jov_add(&o->ov, optarg, &err)) {
				fprintf(stderr, "parallax predict: %s\n", err.msg);
				return 2;
			}
			break;
		case 'j': o->json = 1; break;
		case 'd': o->db_path = optarg; break;
		case 'n': o->no_db = 1; break;
		case 't': o->timeline = optarg; break;
		case 'w': o->hw = optarg; break;
		case 'k': o->keep_going = 1; break;
		case 'h': fputs(USAGE, stdout); return 0;
		default:
			switch (dslaunch_option(&o->launch, c, optarg, "predict")) {
			case 1: break;
			case 0: fputs(USAGE, stderr); return 2;
			default: return 2;
			}
		}
	}
	if (optind >= argc && !dslaunch_any(&o->launch)) {
		fprintf(stderr, "parallax predict: no scenario given\n%s", USAGE);
		return 2;
	}
	if (o->db_path && o->no_db) {
		fprintf(stderr, "parallax predict: --db and --no-db exclude each other\n");
		return 2;
	}
	if (o->keep_going && (!o->no_db || o->json || o->timeline)) {
		fprintf(stderr, "parallax predict: --keep-going takes --no-db, without --json or "
			"--timeline\n");
		return 2;
	}
	if (dslaunch_any(&o->launch) && launch_flags(o, optind < argc))
		return 2;
	if (o->timeline && argc - optind > 1) {
		fprintf(stderr, "parallax predict: --timeline takes one scenario, got %d\n",
			argc - optind);
		return 2;
	}
	return -1;
}

/* ---- DeepSpeed's launcher flags ---- */

/* what the flags' scenario is called in messages; its folder, ".", is what relative paths in it
 * are relative to: the current directory, as typed */
#define LAUNCH_PATH "./(launcher flags)"

/* The flags as the scenario they describe (o->launch_text) or, beside scenario files, as
 * overrides of their sections, after the user's --set. 0, or 1 with the message printed. */
static int launch_flags(PredictOpts *o, int have_files)
{
	PxError err = {0};
	long long nodes = 0, per = 0;
	char num[32];
	DsLaunch *l = &o->launch;
	int rc = 0;
	int cluster = dslaunch_cluster_given(l);
	if ((cluster || !have_files) && dslaunch_resolve(l, 0, &nodes, &per, &err))
		rc = -1;
	else if (!have_files && !(o->launch_text = dslaunch_scenario_text(l, nodes, per, &err)))
		rc = -1;
	else if (have_files) {
		if (l->model && jov_add_kv(&o->ov, "model", l->model, &err))
			rc = -1;
		if (!rc && l->deepspeed_config && jov_add_kv(&o->ov, "deepspeed", l->deepspeed_config,
							      &err))
			rc = -1;
		if (!rc && l->gpu && jov_add_kv(&o->ov, "cluster.gpu", l->gpu, &err))
			rc = -1;
		snprintf(num, sizeof(num), "%lld", nodes);
		if (!rc && cluster && jov_add_kv(&o->ov, "cluster.nodes", num, &err))
			rc = -1;
		snprintf(num, sizeof(num), "%lld", per);
		if (!rc && cluster && jov_add_kv(&o->ov, "cluster.gpus_per_node", num, &err))
			rc = -1;
	}
	if (rc)
		fprintf(stderr, "parallax predict: %s\n", err.msg);
	return rc ? 1 : 0;
}

/* ---- timeline ---- */

static void timeline_row(void *ctx, int i, int iteration, const Op *op, const double live[N_PLACES])
{
	static const char *const kinds[] = {"alloc", "free", "compute", "collective", "copy", "loop",
					    "end_loop"};
	const char *what = "-";
	if (op->kind == OP_ALLOC)
		what = buf_name(op->what);
	else if (op->kind == OP_COMPUTE)
		what = comp_name(op->sub);
	else if (op->kind == OP_COLL)
		what = coll_name(op->sub);
	else if (op->kind == OP_COPY)
		what = copy_name(op->sub);
	fprintf(ctx, "%8d %6d %-10s %-20s %6d %16.0f %16.0f %16.0f\n", i, iteration, kinds[op->kind],
		what, op->unit, live[PLACE_GPU], live[PLACE_CPU], live[PLACE_NVME]);
}

/* Written to PATH.tmp and renamed, so a failure leaves no truncated file. */
static int write_timeline(const char *path, const Prediction *pr, PxError *err)
{
	char tmp[4096];
	MemResult mr;
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	FILE *f = fopen(tmp, "w");
	if (!f)
		return px_fail(err, PX_ERR_RUNTIME, "%s: cannot write: %s", tmp, strerror(errno));
	fprintf(f, "# rank 0 memory after each schedule op (bytes); iteration = micro-batch\n");
	fprintf(f, "# %6s %6s %-10s %-20s %6s %16s %16s %16s\n", "op", "iter", "kind", "what", "unit",
		"gpu_bytes", "cpu_bytes", "nvme_bytes");
	int rc = sim_memory(&pr->stages[0].sched, &mr, timeline_row, f, err);
	if (fclose(f) || rc) {
		remove(tmp);
		return rc ? -1 : px_fail(err, PX_ERR_RUNTIME, "%s: write failed", tmp);
	}
	if (rename(tmp, path))
		return px_fail(err, PX_ERR_RUNTIME, "%s: cannot rename: %s", path, strerror(errno));
	return 0;
}

/* ---- the command ---- */

typedef struct Item {
	Scenario sc;
	Prediction pr;
	int loaded, predicted;
} Item;

static void print_all(const PredictOpts *o, Item *items, int n)
{
	if (o->json) {
		cJSON *out = n == 1 ? report_json(&items[0].sc, &items[0].pr) : cJSON_CreateArray();
		for (int i = 0; n > 1 && i < n; i++)
			cJSON_AddItemToArray(out, report_json(&items[i].sc, &items[i].pr));
		char *text = cJSON_Print(out);
		puts(text);
		cJSON_free(text);
		cJSON_Delete(out);
	} else if (n == 1) {
		report_table(stdout, &items[0].sc, &items[0].pr);
	} else {
		report_summary_header(stdout);
		for (int i = 0; i < n; i++)
			report_summary_line(stdout, &items[i].sc, &items[i].pr);
		for (int i = 0; i < n; i++) {
			const PxNotes *notes = &items[i].sc.notes;
			for (int k = 0; k < notes->n_not_modelled; k++)
				printf("# %s: not modelled: %s\n", items[i].sc.name,
				       notes->not_modelled[k]);
			for (int k = 0; k < notes->n_warnings; k++)
				printf("# %s\n", notes->warnings[k]);
		}
		printf("# GiB = 2^30 bytes per GPU; ideal = ZeRO paper's model states; peak = this "
		       "implementation's GPU peak; comm = collective payload per step\n");
	}
}

static int store_item(PxDb *db, void *items, int i, const char **name, long long *id,
		      PxError *err)
{
	Item *it = (Item *)items + i;
	*name = it->sc.name;
	return store_prediction(db, &it->sc, &it->pr, id, err);
}

/* --keep-going: each scenario is read, priced, printed and freed in turn; a refusal is reported
 * and the next one goes on. Only a runtime failure (memory) stops it. */
static int predict_each(const PredictOpts *o, char **paths, int n)
{
	int refused = 0;
	HwProfile hw;
	PxError err = {0};
	if (o->hw && hwprofile_load(o->hw, &hw, &err)) {
		fprintf(stderr, "parallax predict: %s\n", err.msg);
		return err.code ? err.code : 1;
	}
	report_summary_header(stdout);
	for (int i = 0; i < n; i++) {
		Scenario sc;
		Prediction pr;
		int loaded = 0, predicted = 0, ok = 0;
		if (!scenario_load(&sc, paths[i], &o->ov, &err)) {
			loaded = 1;
			if (o->hw)
				hwprofile_apply_memory(&hw, &sc.cluster);
			predicted = !predict_run(&sc, &pr, &err);
			ok = predicted && !(o->hw ? predict_time(&pr, &hw, o->hw, &err) :
					    hwload_cpu_default(&pr, &sc.notes, &err));
		}
		if (ok) {
			report_summary_line(stdout, &sc, &pr);
			for (int k = 0; k < sc.notes.n_not_modelled; k++)
				printf("# %s: not modelled: %s\n", sc.name, sc.notes.not_modelled[k]);
			for (int k = 0; k < sc.notes.n_warnings; k++)
				printf("# %s\n", sc.notes.warnings[k]);
		}
		if (predicted)
			predict_free(&pr);
		if (loaded)
			scenario_free(&sc);
		if (!ok && err.code != PX_ERR_INPUT) {
			fprintf(stderr, "parallax predict: %s\n", err.msg);
			if (o->hw)
				hwprofile_free(&hw);
			return 1;
		}
		if (!ok) {
			fflush(stdout);
			fprintf(stderr, "parallax predict: refused %s: %s\n", paths[i], err.msg);
			refused++;
		}
	}
	printf("# %d scenarios: %d priced, %d refused\n", n, n - refused, refused);
	if (o->hw)
		hwprofile_free(&hw);
	return refused ? 2 : 0;
}

/* The item's scenario, predicted and priced with the profile at path: its warnings (another GPU's,
 * another machine's) in the scenario's notes, its CUDA runtime memory in the cluster. 0, or the
 * exit status with err. */
static int predict_with_hw(const char *path, Item *it, PxError *err)
{
	HwProfile hw;
	char warn[1024];
	int rc = 0;
	if (hwprofile_load(path, &hw, err))
		return err->code ? err->code : 1;
	if ((hwprofile_gpu_mismatch(&hw, path, &it->sc.cluster.gpu, warn, sizeof(warn)) ||
	     hwload_cpu_mismatch(&hw, path, warn, sizeof(warn))) &&
	    px_notes_warn(&it->sc.notes, "%s", warn))
		rc = px_fail(err, PX_ERR_RUNTIME, "out of memory");
	if (!rc) /* a calibrated profile's CUDA runtime memory */
		hwprofile_apply_memory(&hw, &it->sc.cluster);
	if (!rc && predict_run(&it->sc, &it->pr, err))
		rc = -1;
	it->predicted = !rc;
	if (!rc && predict_time(&it->pr, &hw, path, err))
		rc = -1;
	hwprofile_free(&hw);
	return rc ? (err->code ? err->code : 1) : 0;
}

int cmd_predict(int argc, char **argv)
{
	PredictOpts o = {0};
	PxError err = {0};
	jov_init(&o.ov);
	dslaunch_init(&o.launch);
	int rc = parse_opts(argc, argv, &o);
	if (rc >= 0)
		goto out;
	int n = o.launch_text ? 1 : argc - optind;
	if (!o.launch_text) {
		char first[PATH_MAX];
		int infer = infer_scenario_is(paths_find_input(argv[optind], first, sizeof(first)),
					      &err);
		if (infer > 0) { /* serving: its own flow (cli/infer_report.c) */
			InferPredictOpts io = {&o.ov, o.json, o.no_db, o.db_path, o.hw};
			if (o.keep_going || o.timeline) {
				fprintf(stderr, "parallax predict: --keep-going and --timeline are for "
					"training scenarios; %s is an inference one\n", argv[optind]);
				rc = 2;
			} else {
				rc = infer_predict_command(&io, argv + optind, n);
			}
			goto out;
		}
	}
	if (o.keep_going && !o.launch_text) {
		rc = predict_each(&o, argv + optind, n);
		goto out;
	}
	Item *items = calloc((size_t)n, sizeof(*items));
	if (!items) {
		fprintf(stderr, "parallax predict: out of memory\n");
		rc = 1;
		goto out;
	}
	rc = 0;
	/* everything is read and priced before anything is written */
	for (int i = 0; i < n && !rc; i++) {
		char found[PATH_MAX];
		const char *file = o.launch_text ? LAUNCH_PATH :
				   paths_find_input(argv[optind + i], found, sizeof(found));
		if (o.launch_text ? scenario_load_text(&items[i].sc, file, o.launch_text, &o.ov, &err) :
				    scenario_load(&items[i].sc, file, &o.ov, &err)) {
			rc = err.code ? err.code : 1;
			break;
		}
		items[i].loaded = 1;
		if (o.hw) {
			rc = predict_with_hw(o.hw, &items[i], &err);
			if (rc)
				break;
			continue;
		}
		if (predict_run(&items[i].sc, &items[i].pr, &err)) {
			rc = err.code ? err.code : 1;
			break;
		}
		items[i].predicted = 1;
		/* a CPU scenario: this machine's CPU profile, where calibrate put it */
		if (hwload_cpu_default(&items[i].pr, &items[i].sc.notes, &err)) {
			rc = err.code ? err.code : 1;
			break;
		}
	}
	if (!rc) {
		print_all(&o, items, n);
		if (!o.no_db && store_each(o.db_path, o.json, items, n, store_item, &err))
			rc = err.code ? err.code : 1;
	}
	if (!rc && o.timeline && write_timeline(o.timeline, &items[0].pr, &err))
		rc = err.code;
	if (rc)
		fprintf(stderr, "parallax predict: %s\n", err.msg);
	for (int i = 0; i < n; i++) {
		if (items[i].predicted)
			predict_free(&items[i].pr);
		if (items[i].loaded)
			scenario_free(&items[i].sc);
	}
	free(items);
out:
	jov_free(&o.ov);
	dslaunch_free(&o.launch);
	free(o.launch_text);
	return rc;
}

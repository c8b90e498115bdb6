/* parallax plot: charts of predictions and measurements, drawn by gnuplot into PNG and SVG. This
 * file owns the options, the output files and running gnuplot; the plot kinds are plot_*.c. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdarg.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "commands.h"
#include "paths.h"
#include "plot.h"

static const char USAGE[] =
	"usage: parallax plot memory SCENARIO [--set KEY=VALUE]... [OPTIONS]\n"
	"       parallax plot time SCENARIO... [--set KEY=VALUE]... [--hw FILE] [OPTIONS]\n"
	"       parallax plot scaling SCENARIO [--nodes N,N,...] [--set KEY=VALUE]... [--hw FILE]\n"
	"                             [OPTIONS]\n"
	"       parallax plot compare [RUN] [--db FILE] [OPTIONS]\n"
	"       parallax plot pareto [SWEEP] [--db FILE] [OPTIONS]\n"
	"       parallax plot zero [SCENARIO_NAME] [--db FILE] [OPTIONS]\n"
	"       parallax plot serving INFERENCE_SCENARIO [--batches N,N,...] [--series KEY=V,V,...]\n"
	"                             [--set KEY=VALUE]... [--hw FILE] [OPTIONS]\n"
	"\n"
	"Draw a chart with gnuplot and write PREFIX.png and PREFIX.svg, with the data it plots\n"
	"(PREFIX.dat) and the script that plots it (PREFIX.gp) beside them, so that\n"
	"`cd DIR && gnuplot NAME.gp` draws it again. Every file is written as NAME.tmp and renamed\n"
	"once gnuplot has succeeded: a failure leaves no new file behind.\n"
	"\n"
	"plots:\n"
	"  memory   per-GPU memory at the peak by category (params, grads, optimizer, activations,\n"
	"           buffers, overhead) for ZeRO stages 0-3 of the scenario as stacked bars, with\n"
	"           the GPU's capacity and the ZeRO paper's ideal model states; a stage DeepSpeed\n"
	"           refuses (ZeRO-2/3 with pipeline parallelism, parameter offload below ZeRO-3)\n"
	"           is left out and marked\n"
	"  time     where the step time goes (forward, backward, recompute, optimizer, pipeline\n"
	"           bubble, offload stall, exposed communication per group), one bar per scenario,\n"
	"           with MFU and tokens/s\n"
	"  scaling  tokens/s and per-GPU memory peak against the number of GPUs, one point per\n"
	"           node count; micro-batch and gradient accumulation stay as the scenario has\n"
	"           them and train_batch_size follows the data-parallel size\n"
	"  compare  a measured run against its prediction (predicted_vs_measured view): measured\n"
	"           against predicted for every memory.* and comm.* metric of every rank, and rank\n"
	"           0's relative error per metric\n"
	"  pareto   a stored sweep (parallax sweep): time against cost (hours per billion tokens\n"
	"           against USD, or GPU-hours without prices, per million tokens) and tokens/s\n"
	"           against GPUs, points coloured by GPU type, each with its Pareto front; SWEEP\n"
	"           is a sweep id or name (default the newest); the fronts' configurations are\n"
	"           listed in PREFIX.dat\n"
	"  zero     ZeRO's memory claims as measured: for one scenario (default that of the\n"
	"           newest measured run), rank 0's peak memory predicted, measured (the device's\n"
	"           own reading on backend cuda, else the executor's arena) and the ZeRO paper's\n"
	"           ideal, for the newest run of each ZeRO stage and data-parallel size\n"
	"  serving  an inference scenario's latency against throughput: time per output token\n"
	"           against generated tokens/s per GPU over batch sizes, one line per value of\n"
	"           --series (a dtype, a tp), with what bounds a decode step labelled where it\n"
	"           changes; batches that do not fit are left out and named\n"
	"\n"
	"options:\n"
	"  --out PREFIX          write PREFIX.png, PREFIX.svg, PREFIX.gp and PREFIX.dat (default\n"
	"                        results/plots/KIND-NAME, NAME the (first) scenario's name;\n"
	"                        without a ./results folder, ~/.local/share/parallax/plots)\n"
	"  --format png|svg|both which images to draw (default both)\n"
	"  --set KEY=VALUE       memory, time, scaling: override a scenario key before it is read,\n"
	"                        as in parallax predict (VALUE is JSON, or else a string)\n"
	"  --nodes N,N,...       scaling: the node counts (cluster.nodes) to plot (default\n"
	"                        1,2,4,8,16,32,64)\n"
	"  --batches N,N,...     serving: the batch sizes (default 1,2,4,...,512)\n"
	"  --series KEY=V,V,...  serving: one line per value of KEY, e.g. inference.dtype=fp16,int8\n"
	"                        or inference.tensor_parallel.tp_size=2,4,8 (default: one line)\n"
	"  --hw FILE             time, scaling, serving: price with this hardware profile\n"
	"                        (warned about when measured on another GPU than the scenario's)\n"
	"  --db FILE             compare, pareto, zero: the results database (default $PARALLAX_DB,\n"
	"                        else results/parallax.db, else ~/.local/share/parallax/);\n"
	"                        RUN defaults to the latest measured run\n"
	"  -h, --help            this help\n"
	"\n"
	"Needs gnuplot with the pngcairo and svg terminals (Debian: apt-get install gnuplot-nox).\n"
	"Exit status: 0 ok, 1 runtime failure (gnuplot, files, database), 2 bad input.\n";

/* The usage, and where docs/plots.md is (in the source tree or the installed share/doc). */
static void usage(FILE *f)
{
	char doc[PATH_MAX];
	fputs(USAGE, f);
	fprintf(f, "More: %s\n", paths_doc("plots.md", doc, sizeof(doc)));
}

/* ---- options ---- */

static const struct {
	const char *name;
	int (*fn)(const PlotOpts *, PlotSpec *, PxError *);
	int min_args, max_args; /* positional arguments after the kind; -1: any number */
	const char *takes;      /* what they are, for the error when there are too many */
} KINDS[] = {
	{"memory", plot_memory, 1, 1, "one scenario"},
	{"time", plot_time, 1, -1, "scenarios"},
	{"scaling", plot_scaling, 1, 1, "one scenario"},
	{"compare", plot_compare, 0, 1, "at most one run id"},
	{"pareto", plot_pareto, 0, 1, "at most one sweep"},
	{"zero", plot_zero, 0, 1, "at most one scenario name"},
	{"serving", plot_serving, 1, 1, "one inference scenario"},
};
#define N_KINDS ((int)(sizeof(KINDS) / sizeof(KINDS[0])))

static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int usage_error(const char *fmt, ...)
{
	va_list ap;
	fprintf(stderr, "parallax plot: ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, " (parallax plot --help lists the plots and their flags)\n");
	return 2;
}

/* Returns -1 to go on, else the exit status. argv[0] is the kind. */
static int parse_opts(int argc, char **argv, PlotOpts *o, int *kind)
{
	static const struct option longs[] = {
		{"out", required_argument, 0, 'o'},   {"format", required_argument, 0, 'f'},
		{"set", required_argument, 0, 's'},   {"nodes", required_argument, 0, 'n'},
		{"db", required_argument, 0, 'd'},    {"hw", required_argument, 0, 'w'},
		{"batches", required_argument, 0, 'b'}, {"series", required_argument, 0, 'S'},
		{"help", no_argument, 0, 'h'},        {0, 0, 0, 0},
	};
	PxError err;
	int c, k;

	for (k = 0; k < N_KINDS && strcmp(argv[0], KINDS[k].name); k++)
		;
	if (k == N_KINDS)
		return usage_error("unknown plot '%s'; expected memory, time, scaling, compare, pareto, "
				   "zero or serving",
				   argv[0]);
	*kind = k;
	o->kind = KINDS[k].name;
	o->png = o->svg = 1;
	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
		switch (c) {
		case 'o':
			if (!*optarg)
				return usage_error("--out: expected a path prefix, got ''");
			o->out = optarg;
			break;
		case 'f':
			o->png = !strcmp(optarg, "png") || !strcmp(optarg, "both");
			o->svg = !strcmp(optarg, "svg") || !strcmp(optarg, "both");
			if (!o->png && !o->svg)
				return usage_error("--format: expected png, svg or both, got '%s'",
						   optarg);
			break;
		case 's':
			if (jov_add(&o->ov, optarg, &err))
				return usage_error("%s", err.msg);
			break;
		case 'n': o->nodes = optarg; break;
		case 'd': o->db = optarg; break;
		case 'w': o->hw = optarg; break;
		case 'b': o->batches = optarg; break;
		case 'S': o->series = optarg; break;
		case 'h': usage(stdout); return 0;
		default:
			for (int i = 0; optopt && longs[i].name; i++)
				if (longs[i].val == optopt)
					return usage_error("--%s needs a value", longs[i].name);
			return usage_error("unknown option '%s'", argv[optind - 1]);
		}
	}
	o->args = argv + optind;
	o->n_args = argc - optind;
	const char *kn = o->kind;
	if (o->n_args < KINDS[k].min_args)
		return usage_error("%s: no scenario given", kn);
	if (KINDS[k].max_args >= 0 && o->n_args > KINDS[k].max_args)
		return usage_error("%s takes %s, got %d arguments", kn, KINDS[k].takes,
				   o->n_args);
	if (o->nodes && strcmp(kn, "scaling"))
		return usage_error("%s: --nodes applies to scaling only", kn);
	if (o->db && strcmp(kn, "compare") && strcmp(kn, "pareto") && strcmp(kn, "zero"))
		return usage_error("%s: --db applies to compare, pareto and zero only", kn);
	if (o->hw && strcmp(kn, "time") && strcmp(kn, "scaling") && strcmp(kn, "serving"))
		return usage_error("%s: --hw applies to time, scaling and serving only", kn);
	if ((o->batches || o->series) && strcmp(kn, "serving"))
		return usage_error("%s: --%s applies to serving only", kn,
				   o->batches ? "batches" : "series");
	if (o->ov.n && (!strcmp(kn, "compare") || !strcmp(kn, "pareto") || !strcmp(kn, "zero")))
		return usage_error("%s: --set does not apply to stored results", kn);
	return -1;
}

/* ---- gnuplot ---- */

/* Full path of gnuplot found on PATH into buf; 0, or -1 when there is none. */
static int find_gnuplot(char *buf, size_t n)
{
	const char *path = getenv("PATH");
	while (path && *path) {
		size_t len = strcspn(path, ":");
		snprintf(buf, n, "%.*s/gnuplot", (int)(len ? len : 1), len ? path : ".");
		if (access(buf, X_OK) == 0)
			return 0;
		path += len + (path[len] == ':');
	}
	return -1;
}

/* Run `gnuplot -e SETUP SCRIPT` in dir; stderr is kept, and on failure its last line goes into
 * err. On success what gnuplot said (warnings) is passed on to our stderr. */
static int run_gnuplot(const char *gnuplot, const char *dir, const char *setup, const char *script,
		       PxError *err)
{
	int fds[2];
	if (pipe(fds))
		return px_fail(err, PX_ERR_RUNTIME, "cannot run gnuplot: pipe: %s", strerror(errno));
	pid_t pid = fork();
	if (pid < 0) {
		close(fds[0]);
		close(fds[1]);
		return px_fail(err, PX_ERR_RUNTIME, "cannot run gnuplot: fork: %s", strerror(errno));
	}
	if (pid == 0) {
		int null = open("/dev/null", O_RDWR);
		if (null >= 0) {
			dup2(null, 0);
			dup2(null, 1);
		}
		dup2(fds[1], 2);
		close(fds[0]);
		if (chdir(dir) == 0)
			execl(gnuplot, "gnuplot", "-e", setup, script, (char *)NULL);
		_exit(127);
	}
	close(fds[1]);
	char said[8192];
	size_t len = 0;
	ssize_t got;
	while ((got = read(fds[0], said + len, sizeof(said) - 1 - len)) > 0 ||
	       (got < 0 && errno == EINTR))
		if (got > 0 && (len += (size_t)got) == sizeof(said) - 1) {
			char sink[4096]; /* keep the first 8 KiB; drain the rest */
			while (read(fds[0], sink, sizeof(sink)) > 0)
				;
			break;
		}
	said[len] = '\0';
	close(fds[0]);
	int st;
	while (waitpid(pid, &st, 0) < 0)
		if (errno != EINTR)
			return px_fail(err, PX_ERR_RUNTIME, "waiting for gnuplot: %s",
				       strerror(errno));
	while (len && (said[len - 1] == '\n' || said[len - 1] == ' '))
		said[--len] = '\0';
	if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
		if (len)
			fprintf(stderr, "parallax plot: gnuplot said:\n%s\n", said);
		return 0;
	}
	const char *last = strrchr(said, '\n');
	last = last ? last + 1 : said;
	if (WIFEXITED(st) && WEXITSTATUS(st) == 127 && !len)
		return px_fail(err, PX_ERR_RUNTIME, "cannot run %s in %s", gnuplot, dir);
	return px_fail(err, PX_ERR_RUNTIME, "gnuplot failed (%s %d) on %s/%s: %s",
		       WIFEXITED(st) ? "exit status" : "signal",
		       WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st), dir, script,
		       *last ? last : "no message");
}

/* ---- output files ---- */

enum { F_DAT, F_GP, F_PNG, F_SVG, N_FILES };
static const char *const EXT[N_FILES] = {".dat", ".gp", ".png", ".svg"};

typedef struct Outputs {
	char dir[2048], base[512];
	char final[N_FILES][4096], tmp[N_FILES][4096];
	int want[N_FILES];
} Outputs;

/* Split prefix into its folder and file name; the folder must exist and take new files. */
static int outputs_init(Outputs *w, const char *prefix, const PlotOpts *o, PxError *err)
{
	const char *slash = strrchr(prefix, '/');
	if (slash)
		snprintf(w->dir, sizeof(w->dir), "%.*s", (int)(slash == prefix ? 1 : slash - prefix),
			 prefix);
	else
		snprintf(w->dir, sizeof(w->dir), ".");
	snprintf(w->base, sizeof(w->base), "%s", slash ? slash + 1 : prefix);
	if (!*w->base)
		return px_fail(err, PX_ERR_INPUT, "--out %s: expected a path prefix, not a folder",
			       prefix);
	struct stat st;
	if (stat(w->dir, &st) || !S_ISDIR(st.st_mode))
		return px_fail(err, PX_ERR_INPUT, "--out %s: folder %s: %s", prefix, w->dir,
			       stat(w->dir, &st) ? strerror(errno) : "not a folder");
	if (access(w->dir, W_OK | X_OK))
		return px_fail(err, PX_ERR_INPUT, "--out %s: cannot write in %s: %s", prefix, w->dir,
			       strerror(errno));
	w->want[F_DAT] = w->want[F_GP] = 1;
	w->want[F_PNG] = o->png;
	w->want[F_SVG] = o->svg;
	for (int f = 0; f < N_FILES; f++) {
		snprintf(w->final[f], sizeof(w->final[f]), "%s%s", prefix, EXT[f]);
		snprintf(w->tmp[f], sizeof(w->tmp[f]), "%s%s.tmp", prefix, EXT[f]);
	}
	return 0;
}

static int write_text(const char *path, const PlotBuf *b, PxError *err)
{
	if (b->oom)
		return px_fail(err, PX_ERR_RUNTIME, "out of memory");
	FILE *f = fopen(path, "w");
	if (!f) /* a folder that takes no files is the --out the user gave; a full disk is not */
		return px_fail(err, errno == EACCES || errno == EPERM || errno == EROFS ||
				   errno == ENOENT || errno == ENOTDIR || errno == EISDIR
				   ? PX_ERR_INPUT : PX_ERR_RUNTIME,
			       "%s: cannot write: %s", path, strerror(errno));
	size_t n = b->len ? fwrite(b->s, 1, b->len, f) : 0;
	if (fclose(f) | (n != b->len))
		return px_fail(err, PX_ERR_RUNTIME, "%s: write failed", path);
	return 0;
}

/* The script: how it was made, defaults a user may override with -e, then per format a reset,
 * the terminal and the kind's own commands. */
static void script_text(PlotBuf *gp, const Outputs *w, const PlotSpec *ps, const char *cmdline)
{
	pb_printf(gp, "# made by: %s\n", cmdline);
	pb_printf(gp, "# draw again: cd %s && gnuplot %s.gp (reads %s.dat; override with -e, e.g.\n"
		  "#   gnuplot -e \"formats='png'; png_out='other.png'\" %s.gp)\n", w->dir, w->base,
		  w->base, w->base);
	const char *vars[] = {"datafile", "png_out", "svg_out"};
	const int files[] = {F_DAT, F_PNG, F_SVG};
	for (int i = 0; i < 3; i++) {
		char name[600];
		snprintf(name, sizeof(name), "%s%s", w->base, EXT[files[i]]);
		pb_printf(gp, "if (!exists(\"%s\")) %s = ", vars[i], vars[i]);
		pb_gp_string(gp, name);
		pb_printf(gp, "\n");
	}
	pb_printf(gp, "if (!exists(\"formats\")) formats = \"%s%s%s\"\n", w->want[F_PNG] ? "png" : "",
		  w->want[F_PNG] && w->want[F_SVG] ? " " : "", w->want[F_SVG] ? "svg" : "");
	pb_printf(gp, "do for [fmt in formats] {\n"
		  "reset\n"
		  "if (fmt eq \"png\") {\n"
		  "\tset terminal pngcairo size %d,%d noenhanced font \"DejaVu Sans,11\"\n"
		  "\tset output png_out\n"
		  "} else {\n"
		  "\tset terminal svg size %d,%d dynamic noenhanced font \"DejaVu Sans,11\" "
		  "background \"#ffffff\"\n"
		  "\tset output svg_out\n"
		  "}\n", ps->width_px, ps->height_px, ps->width_px, ps->height_px);
	if (ps->gp.len)
		pb_printf(gp, "%s", ps->gp.s);
	pb_printf(gp, "set output\n}\n");
}

static void remove_tmps(const Outputs *w)
{
	for (int f = 0; f < N_FILES; f++)
		if (w->want[f])
			remove(w->tmp[f]);
}

static int write_outputs(const Outputs *w, const PlotSpec *ps, const char *gnuplot,
			 const char *cmdline, PxError *err)
{
	PlotBuf gp, setup;
	int rc = -1;
	pb_init(&gp);
	pb_init(&setup);
	script_text(&gp, w, ps, cmdline);
	pb_printf(&setup, "datafile = ");
	pb_gp_string(&setup, strrchr(w->tmp[F_DAT], '/') ? strrchr(w->tmp[F_DAT], '/') + 1
							 : w->tmp[F_DAT]);
	pb_printf(&setup, "; png_out = ");
	pb_gp_string(&setup, strrchr(w->tmp[F_PNG], '/') ? strrchr(w->tmp[F_PNG], '/') + 1
							 : w->tmp[F_PNG]);
	pb_printf(&setup, "; svg_out = ");
	pb_gp_string(&setup, strrchr(w->tmp[F_SVG], '/') ? strrchr(w->tmp[F_SVG], '/') + 1
							 : w->tmp[F_SVG]);
	char script[600];
	snprintf(script, sizeof(script), "%s.gp.tmp", w->base);
	if (setup.oom) {
		px_fail(err, PX_ERR_RUNTIME, "out of memory");
		goto out;
	}
	if (write_text(w->tmp[F_DAT], &ps->dat, err) || write_text(w->tmp[F_GP], &gp, err) ||
	    run_gnuplot(gnuplot, w->dir, setup.s, script, err))
		goto out;
	for (int f = F_PNG; f <= F_SVG; f++) {
		struct stat st;
		if (w->want[f] && (stat(w->tmp[f], &st) || st.st_size == 0)) {
			px_fail(err, PX_ERR_RUNTIME, "gnuplot wrote no %s", w->tmp[f]);
			goto out;
		}
	}
	for (int f = 0; f < N_FILES; f++)
		if (w->want[f] && rename(w->tmp[f], w->final[f])) {
			px_fail(err, PX_ERR_RUNTIME, "%s: cannot rename: %s", w->final[f],
				strerror(errno));
			for (int g = 0; g < f; g++) /* all or nothing */
				if (w->want[g])
					remove(w->final[g]);
			goto out;
		}
	rc = 0;
out:
	if (rc)
		remove_tmps(w);
	pb_free(&gp);
	pb_free(&setup);
	return rc;
}

/* ---- the command ---- */

/* "parallax plot ARGS", each argument that needs it in single quotes. */
static void command_line(PlotBuf *b, int argc, char **argv)
{
	pb_printf(b, "parallax");
	for (int i = 0; i < argc; i++) {
		const char *a = argv[i];
		if (*a && strspn(a, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
				    "0123456789-_./=,:+@%") == strlen(a)) {
			pb_printf(b, " %s", a);
			continue;
		}
		pb_printf(b, " '");
		for (; *a; a++)
			pb_printf(b, *a == '\'' ? "'\\''" : "%c", *a);
		pb_printf(b, "'");
	}
}

/* RESULTS/plots/KIND-NAME (RESULTS: paths_results_dir, ./results in a checkout), with the
 * folder made; NAME keeps only characters safe in a file name */
static int default_prefix(const char *kind, const char *name, char *buf, size_t n, PxError *err)
{
	char dir[PATH_MAX], plots[PATH_MAX + 8];
	if (paths_results_dir(dir, sizeof(dir), 1, err))
		return -1;
	snprintf(plots, sizeof(plots), "%s/plots", dir);
	if (mkdir(plots, 0777) && errno != EEXIST)
		return px_fail(err, PX_ERR_RUNTIME, "cannot create %s/: %s", plots, strerror(errno));
	int len = snprintf(buf, n, "%s/%s-", plots, kind);
	for (const char *c = name; *c && (size_t)len + 1 < n; c++, len++)
		buf[len] = strchr("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.+",
				  *c) ? *c : '_';
	buf[len] = '\0';
	return 0;
}

int cmd_plot(int argc, char **argv)
{
	PlotOpts o = {0};
	PlotSpec ps;
	PxError err = {0};
	PlotBuf cmdline;
	Outputs w;
	char gnuplot[4096], prefix[4096];
	int kind = 0, rc;

	if (argc < 2)
		return usage(stderr), 2;
	if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help"))
		return usage(stdout), 0;
	jov_init(&o.ov);
	plot_spec_init(&ps);
	pb_init(&cmdline);
	command_line(&cmdline, argc, argv); /* before getopt_long reorders argv */
	rc = parse_opts(argc - 1, argv + 1, &o, &kind);
	if (rc >= 0)
		goto out;
	rc = 2;
	if (o.out && outputs_init(&w, o.out, &o, &err))
		goto fail;
	if (find_gnuplot(gnuplot, sizeof(gnuplot))) {
		fprintf(stderr, "parallax plot: gnuplot not found on PATH; install it (as root): "
			"apt-get install gnuplot-nox\n");
		rc = 1;
		goto out;
	}
	if (KINDS[kind].fn(&o, &ps, &err))
		goto fail;
	if (!o.out && (default_prefix(o.kind, ps.name, prefix, sizeof(prefix), &err) ||
		       outputs_init(&w, prefix, &o, &err)))
		goto fail;
	if (cmdline.oom) {
		px_fail(&err, PX_ERR_RUNTIME, "out of memory");
		goto fail;
	}
	if (write_outputs(&w, &ps, gnuplot, cmdline.s, &err))
		goto fail;
	if (ps.dat.len)
		fputs(ps.dat.s, stdout);
	for (int f = 0; f < N_FILES; f++)
		if (w.want[f])
			printf("# wrote %s\n", w.final[f]);
	rc = 0;
	goto out;
fail:
	rc = err.code ? err.code : 1;
	fprintf(stderr, "parallax plot %s: %s\n", o.kind, err.msg);
out:
	pb_free(&cmdline);
	plot_spec_free(&ps);
	jov_free(&o.ov);
	return rc;
}

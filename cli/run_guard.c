#include "run_guard.h"

#include <stdlib.h>
#include <string.h>

#include "../engine/clock.h"
#include "../kernels/ops_cpu.h"

/* ---- what the ranks need ---- */

/* One optimizer step's compute FLOPs on a rank: forward, recompute, backward and optimizer ops,
 * a loop body counted as often as it runs (loops do not nest). */
static double step_flops(const Schedule *s)
{
	double sum = 0, times = 1;
	for (int i = s->step_begin; i < s->n; i++) {
		const Op *op = &s->ops[i];
		if (op->kind == OP_LOOP)
			times = (double)op->count;
		else if (op->kind == OP_END_LOOP)
			times = 1;
		else if (op->kind == OP_COMPUTE)
			sum += times * op->flops;
	}
	return sum;
}

void run_need(const Prediction *pr, int ranks, RunNeed *need)
{
	const StagePrediction *sp = &pr->stages[pr->worst];
	double gpu = sp->mem.place[PLACE_GPU].peak_bytes, cpu = sp->mem.place[PLACE_CPU].peak_bytes;
	int on_host = pr->plan.sc->backend == BACKEND_CPU; /* the "device" is host memory too */
	*need = (RunNeed){.rank_bytes = on_host ? gpu + cpu : cpu,
			  .device_bytes = on_host ? 0 : gpu,
			  .ranks = ranks,
			  .flops_per_step = step_flops(&sp->sched)};
	need->total_bytes = need->rank_bytes * ranks;
}

/* ---- what the machine has ---- */

/* The first number in file path, or -1 ("max", absent, unreadable). */
static double read_number(const char *path)
{
	FILE *f = fopen(path, "r");
	double v = -1;
	if (f) {
		if (fscanf(f, "%lf", &v) != 1)
			v = -1;
		fclose(f);
	}
	return v;
}

/* The control group's limit less its usage, or -1 where no limit is set. */
static double cgroup_left(const char **which)
{
	static const struct { const char *limit, *usage, *name; } files[] = {
		{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current",
		 "the cgroup's memory.max less memory.current"},
		{"/sys/fs/cgroup/memory/memory.limit_in_bytes",
		 "/sys/fs/cgroup/memory/memory.usage_in_bytes",
		 "the cgroup's memory.limit_in_bytes less memory.usage_in_bytes"},
	};
	for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
		double limit = read_number(files[i].limit), used = read_number(files[i].usage);
		/* no limit reads "max" (v2) or a page-rounded 2^63 (v1) */
		if (limit > 0 && limit < 0x1p60 && used >= 0) {
			*which = files[i].name;
			return limit > used ? limit - used : 0;
		}
	}
	return -1;
}

int run_mem_available(double *bytes, char *source, size_t source_bytes)
{
	char line[256];
	double kib = -1;
	const char *which = "MemAvailable in /proc/meminfo";
	FILE *f = fopen("/proc/meminfo", "r");
	while (f && fgets(line, sizeof(line), f))
		if (sscanf(line, "MemAvailable: %lf kB", &kib) == 1)
			break;
	if (f)
		fclose(f);
	double avail = kib >= 0 ? kib * 1024 : -1;
	const char *cg_which = NULL;
	double left = cgroup_left(&cg_which);
	if (left >= 0 && (avail < 0 || left < avail))
		avail = left, which = cg_which;
	if (avail < 0)
		return -1;
	*bytes = avail;
	snprintf(source, source_bytes, "%s", which);
	return 0;
}

double run_cpu_gemm_flops_per_s(int n, int c_in, int c_out)
{
	n = n < 1 ? 1 : n > 1024 ? 1024 : n;
	c_in = c_in < 1 ? 1 : c_in > 1024 ? 1024 : c_in;
	c_out = c_out < 1 ? 1 : c_out > 4096 ? 4096 : c_out;
	float *x = calloc((size_t)n * c_in, sizeof(float));
	float *w = calloc((size_t)c_in * c_out, sizeof(float));
	float *y = calloc((size_t)n * c_out, sizeof(float));
	double rate = 0;
	if (x && w && y) {
		for (int i = 0; i < n * c_in; i++)
			x[i] = (float)(i % 7) * 0.125f;
		for (int i = 0; i < c_in * c_out; i++)
			w[i] = (float)(i % 5) * 0.25f;
		ops_matmul_forward(y, x, w, NULL, n, c_in, c_out); /* the BLAS starts its threads */
		/* the fastest call: what the machine does when nothing else runs on it, which a
		 * loaded machine's other calls fall short of */
		double t0 = px_now_s(), best = 1e30;
		for (int reps = 0; reps < 3 || px_now_s() - t0 < 0.05; reps++) {
			double t1 = px_now_s();
			ops_matmul_forward(y, x, w, NULL, n, c_in, c_out);
			double t = px_now_s() - t1;
			best = t < best ? t : best;
		}
		rate = best > 0 ? 2.0 * n * c_in * c_out / best : 0;
	}
	free(x), free(w), free(y);
	return rate;
}

/* ---- saying it ---- */

/* "12.3 MiB", "29.0 GiB" */
static const char *size_text(double bytes, char *buf, size_t n)
{
	if (bytes >= 0x1p30)
		snprintf(buf, n, "%.1f GiB", bytes / 0x1p30);
	else
		snprintf(buf, n, "%.1f MiB", bytes / 0x1p20);
	return buf;
}

/* "0.21 s", "3.4 min", "2.1 h" */
static const char *time_text(double s, char *buf, size_t n)
{
	if (s < 120)
		snprintf(buf, n, "%.3g s", s);
	else if (s < 7200)
		snprintf(buf, n, "%.1f min", s / 60);
	else
		snprintf(buf, n, "%.1f h", s / 3600);
	return buf;
}

int run_guard_report(const char *scenario, const char *backend, const RunNeed *need,
		     double avail_bytes, const char *avail_source, double est_s,
		     const char *est_how, FILE *out)
{
	char per[32], all[32], avail[32], dev[32], t[32];
	size_text(need->rank_bytes, per, sizeof(per));
	size_text(need->total_bytes, all, sizeof(all));
	size_text(avail_bytes, avail, sizeof(avail));
	const char *s = need->ranks == 1 ? "" : "s";
	if (need->total_bytes > avail_bytes) {
		fprintf(stderr,
			"parallax run: %s needs %s of memory per rank (the executor's buffers "
			"at their peak, as predicted for backend %s), %s for %d rank%s, and this "
			"machine has %s available (%s): nothing was started. The ranks share this "
			"machine's memory: make the model smaller (--set model.n_layer=N, --set "
			"model.n_embd=N), the micro-batch or the sequence shorter (--set "
			"deepspeed.train_micro_batch_size_per_gpu=1, --set seq_length=N), or use "
			"fewer ranks (--ranks N: each holds its own activations and, below ZeRO-3, "
			"a whole copy of the parameters; --set deepspeed.zero_optimization.stage=3 "
			"partitions them)\n",
			scenario, per, backend, all, need->ranks, s, avail, avail_source);
		return 2;
	}
	if (!out)
		return 0;
	fprintf(out, "# needs %s of host memory per rank (the executor's buffers at their peak, as "
		"predicted for backend %s), %s for %d rank%s; %s available (%s)\n", per, backend,
		all, need->ranks, s, avail, avail_source);
	if (need->device_bytes > 0)
		fprintf(out, "# needs %s of device memory per rank\n",
			size_text(need->device_bytes, dev, sizeof(dev)));
	if (est_s > 0)
		fprintf(out, "# estimated step time %s (%.1f MFLOP a step per rank; %s)\n",
			time_text(est_s, t, sizeof(t)), need->flops_per_step / 1e6, est_how);
	else
		fprintf(out, "# no step-time estimate (%s)\n", est_how);
	return 0;
}

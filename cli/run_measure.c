#include "run_measure.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../exec/procmem.h"

void run_comm_totals(Comm *world, double pay[N_COLLS], double wire[N_COLLS])
{
	const CommCounters *c = comm_counters(world);
	for (int kind = 0; kind < N_COLLS; kind++) {
		pay[kind] = wire[kind] = 0;
		for (int g = 0; g < N_GROUPS; g++)
			pay[kind] += (double)c->payload_bytes[kind][g], wire[kind] += c->wire_bytes[kind][g];
	}
}

void run_clock_onebit(RunMarks *k, int step, Comm *world, const double *pay0,
		      const double *wire0)
{
	double pay[N_COLLS], wire[N_COLLS];
	run_comm_totals(world, pay, wire);
	k->kind_steps[step]++;
	for (int kind = 0; kind < N_COLLS; kind++)
		k->kind_payload[step][kind] += pay[kind] - pay0[kind],
			k->kind_wire[step][kind] += wire[kind] - wire0[kind];
}

void run_clock_step(RunMarks *k, const Runner *run, double dt, int kind)
{
	if (k->steps++ == 0) {
		k->first_s = dt;
		memcpy(k->op_first, runner_op_times(run), sizeof(k->op_first));
		k->faults1 = procmem_minor_faults();
	} else {
		k->steady_n[kind]++;
		k->steady_s[kind] += dt;
	}
}

double run_clock_kind_s(const RunMarks *k, int kind)
{
	return k->steady_n[kind] > 0 ? k->steady_s[kind] / (double)k->steady_n[kind] : NAN;
}

double run_clock_step_s(const RunMarks *k)
{
	return k->steps > 1 ? run_clock_kind_s(k, ONEBIT_FULL) : k->first_s;
}

/* A 1-bit optimizer's steps of kind `kind`, per such step (NaN when none ran): what they issued
 * per collective kind (payload) and what they sent in all, into v from k; the next k. */
static int put_kind(const RunMarks *clk, int kind, int payload, double *v, int k)
{
	double per = clk->kind_steps[kind] > 0 ? (double)clk->kind_steps[kind] : NAN, wire = 0;
	for (int c = 0; c < N_COLLS; c++) {
		if (payload)
			v[k++] = clk->kind_payload[kind][c] / per;
		wire += clk->kind_wire[kind][c] / per;
	}
	v[k++] = wire;
	return k;
}

/* This rank's measurements as a vector every rank fills alike (for one all-gather); what a run
 * does not measure (the device's readings on the CPU backend) is NaN. Per step: communication
 * over all the steps (they move the same bytes), but a 1-bit optimizer's, whose full-precision
 * steps and compressed ones are counted apart (comm.onebit_compressed.*, NaN for a kind no step
 * was of); times and page faults over the steady ones. */
void run_measure(RunGpu *gpu, const Runner *run, Comm *world, const RunMarks *clk, double *v)
{
	const Arena *a = runner_arena(run);
	int k = 0;
	long steady = clk->steps > 1 ? clk->steps - 1 : 1;
	for (int cat = 0; cat < N_CATS; cat++)
		v[k++] = a->at_peak[PLACE_GPU][cat];
	for (int cat = 0; cat < N_CATS; cat++)
		v[k++] = a->cat_peak[PLACE_GPU][cat];
	for (int cat = 0; cat < N_CATS; cat++) /* the host's: optimizer offload's place */
		v[k++] = a->at_peak[PLACE_CPU][cat];
	v[k++] = arena_held_peak(a, PLACE_GPU); /* the allocator's, not the requests' */
	v[k++] = arena_held_peak(a, PLACE_CPU);
	double nv_blocks, nv_read, nv_write;
	runner_nvme_measured(run, &nv_blocks, &nv_read, &nv_write);
	v[k++] = nv_blocks; /* the files' disk blocks (fstat), not the requests */
	v[k++] = a->peak[PLACE_GPU];
	v[k++] = a->peak[PLACE_CPU];
	v[k++] = arena_held_peak(a, N_PLACES);
	v[k++] = procmem_peak_rss_bytes();
	v[k++] = clk->rss_setup_bytes;
	long long faults = procmem_minor_faults();
	v[k++] = faults < 0 || clk->faults0 < 0 || !clk->steps ? NAN :
		 clk->steps > 1 ? (double)(faults - clk->faults1) / (double)steady :
		 (double)(clk->faults1 - clk->faults0);
	/* the device place's segments under exec/caching.h, the figure the model of PyTorch's
	 * allocator predicts; NaN for another allocator, whose figure it is not */
	v[k++] = a->held_caching ? arena_held_peak(a, PLACE_GPU) : NAN;
	for (int cat = 0; cat < N_CATS; cat++)
		v[k++] = a->at_peak[PLACE_NVME][cat];
	v[k++] = clk->steps ? nv_read / (double)clk->steps : 0; /* every step moves the same */
	v[k++] = clk->steps ? nv_write / (double)clk->steps : 0;
	double wire = 0, pay[N_COLLS], w[N_COLLS];
	/* the schedule's groups; the loss's mean travels on the world and is not counted */
	run_comm_totals(world, pay, w);
	long full = clk->steps; /* none finished: the partial one's, as one */
	for (int s = 0; s < N_ONEBIT_STEPS; s++)
		full -= s == ONEBIT_FULL ? 0 : clk->kind_steps[s];
	double per = clk->steps == 0 ? 1.0 : full > 0 ? (double)full : NAN;
	for (int kind = 0; kind < N_COLLS; kind++) {
		double p = pay[kind], wk = w[kind];
		for (int s = 0; s < N_ONEBIT_STEPS; s++)
			if (s != ONEBIT_FULL)
				p -= clk->kind_payload[s][kind], wk -= clk->kind_wire[s][kind];
		v[k++] = p / per;
		v[k++] = wk / per;
		wire += wk / per;
	}
	v[k++] = wire;
	k = put_kind(clk, ONEBIT_COMPRESSED, 1, v, k);
	k = put_kind(clk, ONEBIT_LOCAL, 0, v, k);
	k = put_kind(clk, ONEBIT_INIT, 1, v, k);
	const double *t = runner_op_times(run); /* each kind of op, per steady step */
	for (int i = 0; i < RUNNER_N_TIMES; i++)
		v[k++] = clk->steps > 1 ? (t[i] - clk->op_first[i]) / (double)steady : t[i];
	RunnerRuntime rt;
	double peak = NAN;
	if (gpu) {
		run_gpu_runtime(gpu, &rt);
		peak = run_gpu_peak_bytes(gpu);
	}
	v[k++] = peak >= 0 ? peak : NAN;
	v[k++] = gpu ? rt.cuda_context_bytes : NAN;
	v[k++] = gpu ? rt.cublas_workspace_bytes : NAN;
	v[k++] = gpu ? rt.nccl_bytes : NAN;
	v[k++] = run_clock_step_s(clk);
	v[k++] = clk->steps ? clk->first_s : NAN;
	v[k++] = clk->steps <= 1;
	v[k++] = run_clock_kind_s(clk, ONEBIT_COMPRESSED);
	v[k++] = run_clock_kind_s(clk, ONEBIT_LOCAL);
	v[k++] = 0;
}

/* put_kind's names: comm.onebit_<kind>.<collective>_bytes (payload) and .wire_bytes. */
static int kind_names(int kind, int payload, char (*names)[64], int k)
{
	for (int c = 0; payload && c < N_COLLS; c++)
		snprintf(names[k++], 64, "comm.onebit_%s.%s_bytes", onebit_step_name(kind),
			 coll_name(c));
	snprintf(names[k++], 64, "comm.onebit_%s.wire_bytes", onebit_step_name(kind));
	return k;
}

int run_measured_rows(const double *all, int rank0, int world, int steps, DbMetric *rows,
		      char (*names)[64])
{
	int k = 0, n = 0;
	for (int cat = 0; cat < N_CATS; cat++)
		snprintf(names[k++], 64, "memory.gpu.%s_bytes", cat_name(cat));
	for (int cat = 0; cat < N_CATS; cat++)
		snprintf(names[k++], 64, "memory.gpu.peak.%s_bytes", cat_name(cat));
	for (int cat = 0; cat < N_CATS; cat++)
		snprintf(names[k++], 64, "memory.cpu.%s_bytes", cat_name(cat));
	snprintf(names[k++], 64, "memory.gpu.peak_bytes");
	snprintf(names[k++], 64, "memory.cpu.peak_bytes");
	snprintf(names[k++], 64, "memory.nvme.bytes");
	snprintf(names[k++], 64, "memory.gpu.requested_peak_bytes");
	snprintf(names[k++], 64, "memory.cpu.requested_peak_bytes");
	snprintf(names[k++], 64, "memory.process.pool_peak_bytes");
	snprintf(names[k++], 64, "memory.process.rss_peak_bytes");
	snprintf(names[k++], 64, "memory.process.rss_before_setup_bytes");
	snprintf(names[k++], 64, "memory.process.page_faults_per_step");
	snprintf(names[k++], 64, "memory.gpu.torch.max_reserved_bytes");
	for (int cat = 0; cat < N_CATS; cat++)
		snprintf(names[k++], 64, "memory.nvme.%s_bytes", cat_name(cat));
	snprintf(names[k++], 64, "copy.%s_bytes", copy_name(COPY_NVME_READ));
	snprintf(names[k++], 64, "copy.%s_bytes", copy_name(COPY_NVME_WRITE));
	for (int kind = 0; kind < N_COLLS; kind++) {
		snprintf(names[k++], 64, "comm.%s_bytes", coll_name(kind));
		snprintf(names[k++], 64, "comm.%s_wire_bytes", coll_name(kind));
	}
	snprintf(names[k++], 64, "comm.wire_bytes");
	k = kind_names(ONEBIT_COMPRESSED, 1, names, k);
	k = kind_names(ONEBIT_LOCAL, 0, names, k);
	k = kind_names(ONEBIT_INIT, 1, names, k);
	for (int i = 0; i < N_COMPS; i++)
		snprintf(names[k++], 64, "time.measured.%s_s", comp_name(i));
	for (int i = 0; i < N_COLLS; i++)
		snprintf(names[k++], 64, "time.measured.%s_s", coll_name(i));
	for (int i = 0; i < N_COPIES; i++)
		snprintf(names[k++], 64, "time.measured.copy_%s_s", copy_name(i));
	snprintf(names[k++], 64, "memory.gpu.device_peak_bytes");
	snprintf(names[k++], 64, "memory.gpu.runtime.cuda_context_bytes");
	snprintf(names[k++], 64, "memory.gpu.runtime.cublas_workspace_bytes");
	snprintf(names[k++], 64, "memory.gpu.runtime.nccl_bytes");
	snprintf(names[k++], 64, "time.step_s");
	snprintf(names[k++], 64, "time.first_step_s");
	snprintf(names[k++], 64, "time.step_includes_warmup");
	for (int kind = ONEBIT_COMPRESSED; kind <= ONEBIT_LOCAL; kind++)
		snprintf(names[k++], 64, "time.onebit_%s.step_s", onebit_step_name(kind));
	snprintf(names[k++], 64, "steps");
	for (int r = 0; r < world; r++)
		for (int i = 0; i < MEAS_N; i++) {
			double val = i == MEAS_N - 1 ? steps : all[r * MEAS_N + i];
			if (isnan(val))
				continue; /* not measured by this backend */
			if (strstr(names[i], "_wire_bytes") && strncmp(names[i], "comm.wire", 9))
				continue; /* per-kind wire bytes: printed, not stored (no twin) */
			size_t len = strlen(names[i]);
			const char *unit = len > 2 && !strcmp(names[i] + len - 2, "_s") ? "s" :
					   len > 5 && !strcmp(names[i] + len - 5, "bytes") ? "bytes" :
					   "1"; /* steps, page faults, the warm-up flag */
			rows[n++] = (DbMetric){rank0 + r, names[i], val, unit};
		}
	return n;
}

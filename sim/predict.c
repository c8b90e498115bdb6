#include "predict.h"

#include <string.h>

int predict_run(Scenario *sc, Prediction *pr, PxError *err)
{
	memset(pr, 0, sizeof(*pr));
	long long world = cluster_world(&sc->cluster);
	if (dsconfig_resolve(&sc->ds, &sc->model, &sc->train_args, world, err))
		return -1;
	if (plan_build(&pr->plan, sc, err))
		return -1;
	if (build_schedule(&pr->plan, 0, &pr->sched, err) ||
	    sim_memory(&pr->sched, &pr->mem, NULL, NULL, err) ||
	    sim_traffic(&pr->sched, &pr->traffic, err)) {
		predict_free(pr);
		return -1;
	}
	const Plan *p = &pr->plan;
	pr->ideal = plan_ideal_states((double)p->n_params, p->dp, p->stage, p->param_bytes,
				      p->grad_bytes, p->master_bytes + p->state_bytes);

	const ClusterSpec *c = &sc->cluster;
	pr->gpu_capacity_bytes = c->gpu.mem_bytes;
	pr->cpu_capacity_bytes = c->gpu.cpu_mem_bytes / (double)c->gpus_per_node;
	pr->nvme_capacity_bytes = c->gpu.nvme_bytes / (double)c->gpus_per_node;
	pr->fits_gpu = pr->mem.place[PLACE_GPU].peak_bytes <= pr->gpu_capacity_bytes;
	pr->fits_cpu = pr->mem.place[PLACE_CPU].peak_bytes <= pr->cpu_capacity_bytes;
	pr->fits_nvme = pr->mem.place[PLACE_NVME].peak_bytes <= pr->nvme_capacity_bytes;
	pr->fits = pr->fits_gpu && pr->fits_cpu && pr->fits_nvme;
	return 0;
}

void predict_free(Prediction *pr)
{
	if (!pr)
		return;
	sched_free(&pr->sched);
	plan_free(&pr->plan);
}

/* comm_env: where the launcher put this process (mpirun's, srun's or torchrun's variables, read
 * before any backend starts) and the name of the job's per-node progress board, from the
 * launcher's job id. The communicators themselves are comm.c's. */
#include "comm.h"

#include <errno.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A non-negative decimal integer from the environment; 0 when absent or malformed. */
static int env_int(const char *name, int *out)
{
	const char *s = getenv(name);
	if (!s || !*s)
		return 0;
	char *end;
	errno = 0;
	long v = strtol(s, &end, 10);
	if (errno || *end || v < 0 || v > INT_MAX)
		return 0;
	*out = (int)v;
	return 1;
}

/* torchrun's variables: RANK and WORLD_SIZE make a launch, LOCAL_RANK and LOCAL_WORLD_SIZE place
 * it on its node. Returns 1 when RANK is set, 0 when it is not, -1 with err when a value is not a
 * non-negative integer or the numbers contradict each other. */
static int env_torchrun(CommEnv *env, PxError *err)
{
	static const char *const names[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"};
	int v[4] = {0, 0, 0, 0};
	const char *s = getenv("RANK");
	if (!s || !*s)
		return 0;
	for (int i = 0; i < 4; i++) {
		s = getenv(names[i]);
		if (!s || !*s)
			return px_fail(err, PX_ERR_INPUT,
				       "RANK is set but %s is not: a torchrun-style launch needs RANK, "
				       "WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE",
				       names[i]);
		if (!env_int(names[i], &v[i]))
			return px_fail(err, PX_ERR_INPUT,
				       "%s must be a non-negative integer, got '%s'", names[i], s);
	}
	if (v[1] < 1 || v[0] >= v[1])
		return px_fail(err, PX_ERR_INPUT, "RANK must be below WORLD_SIZE, got RANK=%d "
			       "WORLD_SIZE=%d", v[0], v[1]);
	if (v[3] < 1 || v[2] >= v[3] || v[3] > v[1])
		return px_fail(err, PX_ERR_INPUT,
			       "LOCAL_RANK must be below LOCAL_WORLD_SIZE, itself at most WORLD_SIZE, "
			       "got LOCAL_RANK=%d LOCAL_WORLD_SIZE=%d WORLD_SIZE=%d", v[2], v[3], v[1]);
	*env = (CommEnv){.rank = v[0], .size = v[1], .local_rank = v[2], .local_size = v[3],
			 .launcher = "torchrun"};
	return 1;
}

int comm_env_read(CommEnv *env, PxError *err)
{
	*env = (CommEnv){.rank = 0, .size = 1, .local_rank = 0, .local_size = 1, .launcher = "none"};
	int rank, size;
	/* Open MPI first: an mpirun inside a Slurm allocation also inherits SLURM_* variables */
	if (env_int("OMPI_COMM_WORLD_RANK", &rank) && env_int("OMPI_COMM_WORLD_SIZE", &size)) {
		env->launcher = "mpirun";
		env->local_size = 0;
		env_int("OMPI_COMM_WORLD_LOCAL_RANK", &env->local_rank);
		env_int("OMPI_COMM_WORLD_LOCAL_SIZE", &env->local_size);
	} else if (env_int("SLURM_PROCID", &rank) && env_int("SLURM_NTASKS", &size)) {
		/* srun gives tasks per node only as a pattern ("2(x3),1"): local_size stays unknown */
		env->launcher = "srun";
		env->local_size = 0;
		env_int("SLURM_LOCALID", &env->local_rank);
	} else {
		/* last: torchrun's names are generic enough for other tools to set as well */
		return env_torchrun(env, err);
	}
	env->rank = rank;
	env->size = size;
	return 1;
}

int comm_env_probe(CommEnv *env)
{
	int rc = comm_env_read(env, NULL);
	if (rc < 0)
		*env = (CommEnv){.rank = 0, .size = 1, .local_rank = 0, .local_size = 1,
				 .launcher = "none"};
	return rc > 0;
}

/* ---- the progress board's name ---- */

/* getenv, with "" for unset. */
static const char *env_or_empty(const char *name)
{
	const char *v = getenv(name);
	return v ? v : "";
}

/* The launcher's id for this job, into job: the same on every rank, and no other running job's.
 * Returns -1 when the launcher gave none. (A value broadcast by rank 0 would do as well, but the
 * NCCL backend's calls take device memory only, and comm.c has none.) */
static int board_job(const CommEnv *env, char *job, size_t bytes)
{
	const char *id = "";
	if (!strcmp(env->launcher, "none")) { /* nobody else on this node */
		snprintf(job, bytes, "pid%ld", (long)getpid());
		return 0;
	}
	if (!strcmp(env->launcher, "mpirun")) { /* PMIx's namespace, then Open MPI's job id */
		static const char *const names[] = {"PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid",
						    "OMPI_MCA_orte_ess_jobid"};
		for (int i = 0; i < 3 && !*id; i++)
			id = env_or_empty(names[i]);
		snprintf(job, bytes, "%s", id);
	} else if (!strcmp(env->launcher, "srun")) { /* a job runs its steps one after another */
		id = env_or_empty("SLURM_JOB_ID");
		snprintf(job, bytes, "%s.%s", id, env_or_empty("SLURM_STEP_ID"));
	} else if (!strcmp(env->launcher, "torchrun")) {
		/* the rendezvous port tells apart jobs started without --rdzv-id; the restart
		 * count, one incarnation of the workers from the next */
		id = env_or_empty("MASTER_PORT");
		snprintf(job, bytes, "%s.%s.%s", env_or_empty("TORCHELASTIC_RUN_ID"), id,
			 env_or_empty("TORCHELASTIC_RESTART_COUNT"));
	}
	return *id ? 0 : -1;
}

int comm_env_board_name(const CommEnv *env, char *name, size_t bytes)
{
	static atomic_uint seq;
	char job[128];
	if (board_job(env, job, sizeof(job)))
		return -1;
	const char *dir = getenv(COMM_RUN_DIR_ENV);
	int n = dir && *dir ? snprintf(name, bytes, "%s", dir) : 0;
	if (n < 0 || (size_t)n >= bytes)
		return -1;
	int k = snprintf(name + n, bytes - (size_t)n, "/px-board-%u-%s-%u", (unsigned)getuid(), job,
			 atomic_fetch_add(&seq, 1));
	if (k < 0 || (size_t)k >= bytes - (size_t)n)
		return -1;
	for (char *p = name + n + 1; *p; p++) /* the board's own name, not the folder's */
		if (!(*p >= 'a' && *p <= 'z') && !(*p >= 'A' && *p <= 'Z') &&
		    !(*p >= '0' && *p <= '9') && *p != '.' && *p != '-' && *p != '_')
			*p = '_';
	return 0;
}


/* DeepSpeed's launcher flags (cli/dslaunch): the hostfile as deepspeed/launcher/runner.py's
 * _parse_hostfile reads it (each kind of bad line refused by file and line number), --include /
 * --exclude as its parse_resource_filter applies them, and parallax predict with --model,
 * --deepspeed_config, --num_nodes, --num_gpus, --hostfile and --gpu giving the same prediction,
 * bit for bit, as a scenario file with the same model, ds_config and cluster; parallax run with
 * a hostfile starting its ranks through mpirun --hostfile. */
#include <CUnit/CUnit.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../cli/dslaunch.h"
#include "suites.h"

/* ---- the hostfile ---- */

static void test_hostfile_good(void)
{
	DsHost *h = NULL;
	int n = 0;
	PxError err = {0};
	const char *text = "# two DGX nodes\n"
			   "\n"
			   "worker-0 slots=8\n"
			   "   worker-1\tslots=4   # trailing words, as DeepSpeed's pattern allows\n";
	CU_ASSERT_EQUAL_FATAL(dslaunch_parse_hostfile("hosts", text, &h, &n, &err), 0);
	CU_ASSERT_EQUAL(n, 2);
	CU_ASSERT_STRING_EQUAL(h[0].name, "worker-0");
	CU_ASSERT_EQUAL(h[0].slots, 8);
	CU_ASSERT_EQUAL(h[0].active, 0xffULL);
	CU_ASSERT_EQUAL(h[0].line, 3);
	CU_ASSERT_STRING_EQUAL(h[1].name, "worker-1");
	CU_ASSERT_EQUAL(h[1].slots, 4);
	CU_ASSERT_EQUAL(h[1].line, 4);
	free(h);
}

static void expect_bad(const char *text, const char *msg)
{
	DsHost *h = NULL;
	int n = 0;
	PxError err = {0};
	CU_ASSERT_EQUAL(dslaunch_parse_hostfile("hosts", text, &h, &n, &err), -1);
	CU_ASSERT_EQUAL(err.code, PX_ERR_INPUT);
	PX_ASSERT_HAS(err.msg, msg);
	CU_ASSERT_PTR_NULL(h);
}

/* each kind of bad line, by its line number (comments and blank lines count as lines) */
static void test_hostfile_bad_lines(void)
{
	expect_bad("w0 slots=8\n# c\nw1 slots=eight\n", "hosts:3: expected 'HOST slots=N'");
	expect_bad("w0 slots=8\nw1\n", "hosts:2: expected 'HOST slots=N' (DeepSpeed: \"Hostfile "
		   "contains a bad entry\"), got 'w1'");
	expect_bad("\n\nw0 slot=8\n", "hosts:3: expected 'HOST slots=N'");
	expect_bad("slots=8\n", "hosts:1: expected 'HOST slots=N'");
	expect_bad("w0 slots=0\n", "hosts:1: slots must be 1 to 64, got 'w0 slots=0'");
	expect_bad("w0 slots=65\n", "hosts:1: slots must be 1 to 64");
	expect_bad("w0 slots=8\nw1 slots=8\n\nw0 slots=4\n",
		   "hosts:4: host w0 is already defined on line 1");
	expect_bad("# nothing\n\n", "hosts: no 'HOST slots=N' line");
}

/* ---- --include / --exclude ---- */

static int three_hosts(DsHost **h, int *n)
{
	PxError err = {0};
	return dslaunch_parse_hostfile("hosts", "w0 slots=4\nw1 slots=4\nw2 slots=4\n", h, n, &err);
}

/* DeepSpeed's examples (parse_resource_filter's docstring): include "worker-0@worker-1:0,2" uses
 * all of worker-0 and slots 0 and 2 of worker-1; exclude "worker-1:0" all but slot 0 of
 * worker-1; a host without slots means all of them; hosts keep the hostfile's order. */
static void test_include_exclude(void)
{
	DsHost *h;
	int n;
	PxError err = {0};
	CU_ASSERT_EQUAL_FATAL(three_hosts(&h, &n), 0);
	CU_ASSERT_EQUAL(dslaunch_filter(h, &n, "w1:0,2@w0", NULL, &err), 0);
	CU_ASSERT_EQUAL(n, 2);
	CU_ASSERT_STRING_EQUAL(h[0].name, "w0");
	CU_ASSERT_EQUAL(h[0].active, 0xfULL);
	CU_ASSERT_STRING_EQUAL(h[1].name, "w1");
	CU_ASSERT_EQUAL(h[1].active, 0x5ULL);
	free(h);
	CU_ASSERT_EQUAL_FATAL(three_hosts(&h, &n), 0);
	CU_ASSERT_EQUAL(dslaunch_filter(h, &n, NULL, "w1:0", &err), 0);
	CU_ASSERT_EQUAL(n, 3);
	CU_ASSERT_EQUAL(h[1].active, 0xeULL);
	free(h);
	CU_ASSERT_EQUAL_FATAL(three_hosts(&h, &n), 0);
	CU_ASSERT_EQUAL(dslaunch_filter(h, &n, NULL, "w1", &err), 0);
	CU_ASSERT_EQUAL(n, 2);
	CU_ASSERT_STRING_EQUAL(h[1].name, "w2");
	free(h);
	/* refusals */
	CU_ASSERT_EQUAL_FATAL(three_hosts(&h, &n), 0);
	CU_ASSERT_EQUAL(dslaunch_filter(h, &n, "w9", NULL, &err), -1);
	PX_ASSERT_HAS(err.msg, "--include: host 'w9' is not in the hostfile");
	CU_ASSERT_EQUAL(dslaunch_filter(h, &n, NULL, "w0:4", &err), -1);
	PX_ASSERT_HAS(err.msg, "--exclude: host 'w0' has no slot '4' (slots 0 to 3)");
	CU_ASSERT_EQUAL(dslaunch_filter(h, &n, "w0", "w1", &err), -1);
	PX_ASSERT_HAS(err.msg, "--include and --exclude exclude each other");
	CU_ASSERT_EQUAL(dslaunch_filter(h, &n, NULL, "w0@w1@w2", &err), -1);
	PX_ASSERT_HAS(err.msg, "leaves no GPU");
	free(h);
}

/* ---- parallax predict with the flags ---- */

static char out1[1 << 17], out2[1 << 17];
static char dir[512];

/* dir/llama/config.json (the bundled Llama-2 7B), dir/ds_config.json (the bundled ZeRO-3 bf16) */
static void write_inputs(void)
{
	char cmd[4096], model[1024], ds[1024]; /* px_test_path's buffer is static: one at a time */
	snprintf(dir, sizeof(dir), "%s", px_test_tmpdir());
	snprintf(model, sizeof(model), "%s", px_test_path("scenarios/models/llama-2-7b.json"));
	snprintf(ds, sizeof(ds), "%s", px_test_path("scenarios/deepspeed/zero3_bf16.json"));
	snprintf(cmd, sizeof(cmd), "mkdir -p '%s/llama' && cp '%s' '%s/llama/config.json' && "
		 "cp '%s' '%s/ds_config.json'", dir, model, dir, ds, dir);
	CU_ASSERT_EQUAL_FATAL(px_test_run_sh(cmd, out1, sizeof(out1)), 0);
}

/* the output without its "path" line, the one place the two may differ */
static void drop_path(char *text)
{
	char *p = strstr(text, "\"path\":");
	if (!p)
		return;
	char *eol = strchr(p, '\n');
	memmove(p, eol ? eol + 1 : p + strlen(p), strlen(eol ? eol + 1 : p + strlen(p)) + 1);
}

static void test_flags_equal_scenario_file(void)
{
	char scen[1024], text[2048];
	write_inputs();
	snprintf(scen, sizeof(scen), "%s/same.json", dir);
	snprintf(text, sizeof(text), "{\"name\": \"llama-ds_config\", \"model\": "
		 "\"llama/config.json\", \"deepspeed\": \"ds_config.json\", \"cluster\": "
		 "{\"gpu\": \"H100-SXM\", \"nodes\": 4, \"gpus_per_node\": 8}, \"seq_length\": 4096}");
	px_test_write_file(scen, text);
	int rc1 = px_test_run_clif(out1, sizeof(out1), "predict --no-db --json '%s'", scen);
	int rc2 = px_test_run_clif(out2, sizeof(out2), "predict --no-db --json --model '%s/llama' "
				   "--deepspeed_config '%s/ds_config.json' --num_nodes 4 "
				   "--num_gpus 8 --gpu H100-SXM --set seq_length=4096", dir, dir);
	CU_ASSERT_EQUAL(rc1, 0);
	CU_ASSERT_EQUAL(rc2, 0);
	PX_ASSERT_HAS(out2, "\"scenario\":\t\"llama-ds_config\"");
	drop_path(out1);
	drop_path(out2);
	CU_ASSERT_STRING_EQUAL(out1, out2);
	/* a hostfile of 4 hosts x 8 slots is the same cluster; --num_nodes 2 its first two */
	char hosts[1024];
	snprintf(hosts, sizeof(hosts), "%s/hostfile", dir);
	px_test_write_file(hosts, "# four nodes\nn0 slots=8\nn1 slots=8\n\nn2 slots=8\nn3 slots=8\n");
	rc2 = px_test_run_clif(out2, sizeof(out2), "predict --no-db --json --model '%s/llama' "
			       "--deepspeed_config '%s/ds_config.json' --hostfile '%s' "
			       "--gpu H100-SXM --set seq_length=4096", dir, dir, hosts);
	CU_ASSERT_EQUAL(rc2, 0);
	drop_path(out2);
	CU_ASSERT_STRING_EQUAL(out1, out2);
	rc2 = px_test_run_clif(out2, sizeof(out2), "predict --no-db --model '%s/llama/config.json' "
			       "--deepspeed_config '%s/ds_config.json' --hostfile '%s' "
			       "--num_nodes 2 --num_gpus 4 --gpu H100-SXM", dir, dir, hosts);
	CU_ASSERT_EQUAL(rc2, 0);
	PX_ASSERT_HAS(out2, "# cluster    2 x 4 H100-SXM");
	/* beside a scenario file the flags replace its cluster */
	rc2 = px_test_run_clif(out2, sizeof(out2), "predict --no-db '%s' --num_nodes 2 --num_gpus 2",
			       scen);
	CU_ASSERT_EQUAL(rc2, 0);
	PX_ASSERT_HAS(out2, "# cluster    2 x 2 H100-SXM");
}

static void test_flags_refused(void)
{
	char hosts[1024];
	write_inputs();
	snprintf(hosts, sizeof(hosts), "%s/uneven", dir);
	px_test_write_file(hosts, "a slots=8\nb slots=4\n");
	int rc = px_test_run_clif(out1, sizeof(out1), "predict --no-db --model '%s/llama' --gpu "
				  "H100-SXM --hostfile '%s'", dir, hosts);
	CU_ASSERT_EQUAL(rc, 2);
	PX_ASSERT_HAS(out1, "uneven:2: host b has 4 GPU(s) in use, a 8: the cluster model needs the "
			    "same count on every node");
	px_test_write_file(hosts, "a slots=8\nb slots=8\nb slots=8\n");
	rc = px_test_run_clif(out1, sizeof(out1), "predict --no-db --model '%s/llama' --gpu "
			      "H100-SXM --hostfile '%s'", dir, hosts);
	CU_ASSERT_EQUAL(rc, 2);
	PX_ASSERT_HAS(out1, "uneven:3: host b is already defined on line 2");
	rc = px_test_run_clif(out1, sizeof(out1), "predict --no-db --model '%s/llama' --gpu "
			      "H100-SXM --hostfile '%s' --num_gpus 4 --include a", dir, hosts);
	CU_ASSERT_EQUAL(rc, 2);
	PX_ASSERT_HAS(out1, "--num_nodes/--num_gpus cannot be combined with --include/--exclude");
	rc = px_test_run_clif(out1, sizeof(out1), "predict --no-db --model '%s/llama' --num_gpus 8",
			      dir);
	CU_ASSERT_EQUAL(rc, 2);
	PX_ASSERT_HAS(out1, "need --model CONFIG and --gpu NAME");
	rc = px_test_run_clif(out1, sizeof(out1), "predict --no-db --model '%s' --gpu H100-SXM "
			      "--num_gpus 8", dir);
	CU_ASSERT_EQUAL(rc, 2);
	PX_ASSERT_HAS(out1, "a folder without a config.json");
	rc = px_test_run_clif(out1, sizeof(out1), "predict --no-db --model '%s/llama' --gpu H100-SXM "
			      "--num_gpus 0", dir);
	CU_ASSERT_EQUAL(rc, 2);
	PX_ASSERT_HAS(out1, "--num_gpus: expected an integer from 1 to 1048576, got '0'");
	rc = px_test_run_clif(out1, sizeof(out1), "predict --no-db --model '%s/llama' --gpu "
			      "H100-SXM", dir);
	CU_ASSERT_EQUAL(rc, 2);
	PX_ASSERT_HAS(out1, "--num_gpus N (GPUs per node) or --hostfile FILE is needed");
}

/* ---- parallax run with the flags ---- */

/* A hostfile drives mpirun: "localhost slots=2" starts 2 ranks through mpirun --hostfile (on one
 * machine: a hostfile of several hosts needs those hosts, which a test machine does not have). */
static void test_run_hostfile(void)
{
	char hosts[1024], args[2048];
	write_inputs();
	snprintf(hosts, sizeof(hosts), "%s/local", dir);
	px_test_write_file(hosts, "# this machine\nlocalhost slots=2\n");
	snprintf(args, sizeof(args), "run '%s' --hostfile '%s' --steps 2 --no-db",
		 px_test_path("scenarios/gpt2-mini-cpu-zero3.json"), hosts);
	CU_ASSERT_EQUAL(px_test_run_release(args, 300, out1, sizeof(out1)), 0);
	PX_ASSERT_HAS(out1, "# parallax run gpt2-mini-cpu-zero3: 2 rank(s)");
}

static void test_run_flags_refused(void)
{
	char hosts[1024];
	const char *scen = px_test_path("scenarios/gpt2-mini-cpu-zero3.json");
	write_inputs();
	snprintf(hosts, sizeof(hosts), "%s/twice", dir);
	px_test_write_file(hosts, "localhost slots=2\nlocalhost slots=2\n");
	CU_ASSERT_EQUAL(px_test_run_clif(out1, sizeof(out1), "run '%s' --hostfile '%s' --no-db", scen,
					 hosts), 2);
	PX_ASSERT_HAS(out1, "twice:2: host localhost is already defined on line 1");
	scen = px_test_path("scenarios/gpt2-mini-cpu-zero3.json");
	CU_ASSERT_EQUAL(px_test_run_clif(out1, sizeof(out1), "run '%s' --num_gpus 2 --num_nodes 2 "
					 "--no-db", scen), 2);
	PX_ASSERT_HAS(out1, "--num_nodes 2 needs --hostfile");
	scen = px_test_path("scenarios/gpt2-mini-cpu-zero3.json");
	CU_ASSERT_EQUAL(px_test_run_clif(out1, sizeof(out1), "run '%s' --num_gpus 2 --ranks 2 --no-db",
					 scen), 2);
	PX_ASSERT_HAS(out1, "--ranks and --num_gpus/--num_nodes/--hostfile exclude each other");
}

static void test_help_names_flags(void)
{
	CU_ASSERT_EQUAL(px_test_run_clif(out1, sizeof(out1), "predict --help"), 0);
	PX_ASSERT_HAS(out1, "--deepspeed_config FILE");
	PX_ASSERT_HAS(out1, "--hostfile FILE  DeepSpeed's hostfile");
	PX_ASSERT_HAS(out1, "worker-0@worker-1:0,2");
	CU_ASSERT_EQUAL(px_test_run_clif(out1, sizeof(out1), "run --help"), 0);
	PX_ASSERT_HAS(out1, "--num_gpus G, --num_nodes N, --hostfile FILE");
	PX_ASSERT_HAS(out1, "started by mpirun --hostfile");
}

int test_dslaunch_register(void)
{
	return PX_ADD_SUITE("dslaunch", {"hostfile: good lines", test_hostfile_good},
			    {"hostfile: each bad line by number", test_hostfile_bad_lines},
			    {"--include / --exclude", test_include_exclude},
			    {"predict: flags equal a scenario file, bit for bit",
			     test_flags_equal_scenario_file},
			    {"predict: bad flags refused", test_flags_refused},
			    {"predict --help names the flags", test_help_names_flags},
			    {"run: a hostfile drives mpirun (one machine)", test_run_hostfile, PX_RELEASE_RUN},
			    {"run: bad flags refused", test_run_flags_refused});
}

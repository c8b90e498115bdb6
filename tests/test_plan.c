/* parallax plan through the binary: what a plan file may say and how a bad one is refused (exit
 * 2, one line naming the file, the key and what was expected), the warnings, and the table's
 * short layouts. The choice itself is tested in tests/test_sweep.c (test_plan_choice). Line:col
 * positions are counted by hand from the texts written here. */
#include <CUnit/CUnit.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "suites.h"

static char out[1 << 16];
static char dir[512];

/* dir/plan.json holding text, with the small GPT-2 base scenario beside it; returns the plan's
 * path (static buffer). */
static const char *write_plan(const char *text)
{
	static char path[1024];
	char base[1024];
	snprintf(dir, sizeof(dir), "%s", px_test_tmpdir());
	snprintf(base, sizeof(base), "%s/base.json", dir);
	px_test_write_file(base,
			   "{\"model\": {\"model_type\": \"gpt2\", \"n_embd\": 64, \"n_layer\": 2, "
			   "\"n_head\": 4, \"n_positions\": 128, \"vocab_size\": 1000}, "
			   "\"deepspeed\": {\"train_micro_batch_size_per_gpu\": 2, "
			   "\"gradient_accumulation_steps\": 1, \"bf16\": {\"enabled\": true}}, "
			   "\"cluster\": {\"gpu\": \"A100-80GB\"}, \"seq_length\": 128}");
	snprintf(path, sizeof(path), "%s/plan.json", dir);
	px_test_write_file(path, text);
	return path;
}

static int plan(const char *text)
{
	char args[2048];
	snprintf(args, sizeof(args), "plan '%s'", write_plan(text));
	return px_test_run_cli(args, out, sizeof(out));
}

#define SMALL_SEARCH "\"search\": {\"deepspeed.zero_optimization.stage\": [1, 3], " \
		     "\"activation_checkpointing\": [\"none\", \"full\"]}"

/* A good plan prints its table with short layouts ("zero 3 ... ckpt full"), not JSON. */
static void test_plan_table_short_layouts(void)
{
	int rc = plan("{\"scenario\": \"base.json\", \"tokens\": 1e9, \"gpus\": [\"A100-80GB\"], "
		      "\"nodes\": [1], \"prices\": {\"A100-80GB\": 2.0}, " SMALL_SEARCH "}");
	CU_ASSERT_EQUAL(rc, 0);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "A100-80GB       1      8"));
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "zero "));
	CU_ASSERT_PTR_NOT_NULL(strstr(out, " ckpt "));
	CU_ASSERT_PTR_NULL(strstr(out, "{\"deepspeed"));
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "# winner: 1 x 8 A100-80GB"));
}

/* The scenario path is resolved against the plan's folder even when the plan is run from
 * elsewhere, and a typo'd key is warned about with the closest one. */
static void test_plan_warns_unknown_key(void)
{
	int rc = plan("{\"scenario\": \"base.json\", \"tokens\": 1e9, \"gpus\": [\"A100-80GB\"],\n"
		      " \"nodes\": [1], \"deadline_day\": 3, " SMALL_SEARCH "}");
	CU_ASSERT_EQUAL(rc, 0);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "plan.json:2:32: warning: unknown key 'deadline_day'; "
					   "did you mean 'deadline_days'?"));
}

static void test_plan_refuses_unknown_gpu(void)
{
	int rc = plan("{\"scenario\": \"base.json\", \"tokens\": 1e9,\n"
		      " \"gpus\": [\"A100-80GB\", \"B300\"], \"nodes\": [1]}");
	CU_ASSERT_EQUAL(rc, 2);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "plan.json:2:10: gpus: expected GPU names from "
					   "`parallax gpus`, got \"B300\""));
}

static void test_plan_refuses_bad_nodes(void)
{
	int rc = plan("{\"scenario\": \"base.json\", \"tokens\": 1e9, \"gpus\": [\"H100-SXM\"],\n"
		      "\"nodes\": [4, 0]}");
	CU_ASSERT_EQUAL(rc, 2);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "plan.json:2:10: nodes: expected node counts "
					   "(integers from 1 to 1000000)"));
}

static void test_plan_refuses_missing_scenario(void)
{
	int rc = plan("{\"scenario\": \"nowhere.json\", \"tokens\": 1e9, \"gpus\": [\"H100-SXM\"], "
		      "\"nodes\": [1]}");
	CU_ASSERT_EQUAL(rc, 2);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "plan.json:1:14: scenario: cannot open "));
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "nowhere.json: No such file or directory"));
}

/* --help names every key the reader knows and the flags. */
static void test_plan_help_complete(void)
{
	static const char *const keys[] = {"scenario", "tokens", "gpus", "nodes", "gpus_per_node",
					   "deadline_days", "budget_usd", "prices", "search",
					   "--json", "Exit status", NULL};
	CU_ASSERT_EQUAL(px_test_run_cli("plan --help", out, sizeof(out)), 0);
	for (int i = 0; keys[i]; i++)
		if (!strstr(out, keys[i])) {
			fprintf(stderr, "\nplan --help lacks %s\n", keys[i]);
			CU_FAIL("plan --help incomplete");
		}
}

int test_plan_register(void)
{
	return PX_ADD_SUITE("plan", {"plan: table with short layouts", test_plan_table_short_layouts},
			    {"plan: unknown key warned with the closest", test_plan_warns_unknown_key},
			    {"plan: unknown GPU refused", test_plan_refuses_unknown_gpu},
			    {"plan: node count 0 refused", test_plan_refuses_bad_nodes},
			    {"plan: missing base scenario refused", test_plan_refuses_missing_scenario},
			    {"plan: --help names every key", test_plan_help_complete});
}

/* The CUnit suites of the test runner: each test_*.c file registers its own suite. */
#ifndef PX_TEST_SUITES_H
#define PX_TEST_SUITES_H

#include <CUnit/CUnit.h>

/* Each adds one suite to the registry; returns 0 or -1. */
#define PX_SUITES(X) \
	X(jdoc)      \
	X(db)        \
	X(zero)        \
	X(model)       \
	X(family)      \
	X(dsconfig)    \
	X(parallel)    \
	X(time)        \
	X(cputime)     \
	X(sweep)       \
	X(kernels)     \
	X(kernels16)   \
	X(kernels_par) \
	X(tp_kernels)  \
	X(moe)         \
	X(kernels_cuda) \
	X(gpt_cuda)     \
	X(comm)        \
	X(comm_mpi)    \
	X(comm_gpu)    \
	X(pool)        \
	X(exec)        \
	X(pipe)        \
	X(tp)          \
	X(zpp)         \
	X(run)         \
	X(exec_cuda)   \
	X(cli)         \
	X(calibrate)   \
	X(plot)        \
	X(setup)       \
	X(plan)        \
	X(results)     \
	X(help)        \
	X(schedule)    \
	X(verdict)     \
	X(infer)       \
	X(onebit)      \
	X(sparse)      \
	X(dslaunch)    \
	X(serve)       \
	X(infer_exec)  \
	X(fsdp)        \
	X(splitfuse)

#define PX_DECLARE_SUITE(name) int test_##name##_register(void);
PX_SUITES(PX_DECLARE_SUITE)

/* Add a suite of tests: PX_ADD_SUITE("name", {"test a", fn_a}, {"test b", fn_b, PX_RELEASE_RUN}).
 * PX_RELEASE_RUN marks a test whose work is the release binary's (PX_RUN_BIN, comm_mpi_check):
 * its product code runs unsanitized in every pass. A pass run with PX_RELEASE_RUNS=skip (`make
 * test-san`, after `make test-rel` ran them) registers such tests inactive, counts them in
 * CUnit's summary and names how many at the start, rather than run the same commands twice. */
enum { PX_RELEASE_RUN = 1 };
/* a case written {"name", fn} leaves its flags 0, as C says; -Wextra would call that an error */
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
typedef struct PxTestCase {
	const char *name;
	CU_TestFunc fn;
	int flags; /* 0 or PX_RELEASE_RUN */
} PxTestCase;
int px_add_suite(const char *name, const PxTestCase *cases, int n);
/* Add one case to suite s (inactive when PX_RELEASE_RUNS=skip skips it); NULL on error. */
CU_pTest px_add_case(CU_pSuite s, const PxTestCase *c);
#define PX_ADD_SUITE(name, ...)                                                        \
	px_add_suite(name, (const PxTestCase[]){__VA_ARGS__},                          \
		     (int)(sizeof((const PxTestCase[]){__VA_ARGS__}) / sizeof(PxTestCase)))

/* Path of a file under the repository root (PX_ROOT, or "." when unset); static buffer. */
const char *px_test_path(const char *rel);

/* Run the parallax binary (PX_BIN) with a shell-quoted argument string; capture stdout+stderr into
 * out (NUL-terminated, truncated to n). Returns the exit status, or -1 when it could not run. */
int px_test_run_cli(const char *args, char *out, size_t n);
/* px_test_run_cli with printf-style arguments (quote paths with '...'). */
int px_test_run_clif(char *out, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Assert that text contains needle; on failure show both (CUnit shows only the line). */
#define PX_ASSERT_HAS(text, needle) px_test_assert_has((text), (needle), __FILE__, __LINE__)
void px_test_assert_has(const char *text, const char *needle, const char *file, unsigned line);

/* The first column of the first row of sql on db as a number; NAN when there is none. */
struct sqlite3;
double px_test_query(struct sqlite3 *db, const char *sql);

/* Run a shell command line (sh -c), capturing stdout+stderr as px_test_run_cli does. */
int px_test_run_sh(const char *cmd, char *out, size_t n);
/* The same with the release binary (PX_RUN_BIN, else PX_BIN: mpirun's own start-up leaks would
 * fail a sanitized one), stopped by timeout(1) after timeout_s seconds (exit 124). */
int px_test_run_release(const char *args, int timeout_s, char *out, size_t n);

/* The executor suites' GPT-2, small enough for 2 cores: V 128, 2 layers of 64 channels, 4 heads,
 * 32 tokens, 16 sequences a step in micro-batches of 2, AdamW. The persistence threshold of 100
 * elements leaves the matrices partitioned at stage 3. A printf format taking the name, "true"
 * (bf16) or "false" (fp32), and the ZeRO stage (--set can change it later). */
#define PX_TEST_GPT_SCENARIO                                                                    \
	"{\"name\": \"%s\", \"model\": {\"model_type\": \"gpt2\", \"n_embd\": 64, \"n_layer\": 2," \
	" \"n_head\": 4, \"n_positions\": 64, \"vocab_size\": 128},"                           \
	" \"deepspeed\": {\"train_batch_size\": 16, \"train_micro_batch_size_per_gpu\": 2,"     \
	" \"bf16\": {\"enabled\": %s}, \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 3e-3," \
	" \"weight_decay\": 0.01}}, \"zero_optimization\": {\"stage\": %d,"                    \
	" \"stage3_param_persistence_threshold\": 100, \"reduce_bucket_size\": 20000},"        \
	" \"gradient_clipping\": 1.0},"                                                         \
	" \"cluster\": {\"gpu\": \"H100-SXM\"}, \"seq_length\": 32}"

/* A fresh temporary directory for this test (mkdtemp); static buffer. */
const char *px_test_tmpdir(void);

/* Write text to path; CU_FAIL on error. */
void px_test_write_file(const char *path, const char *text);

#endif

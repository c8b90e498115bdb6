# Parallax build. `make run` builds and predicts the bundled scenarios; `make test` runs the suites
# twice, plain and under AddressSanitizer + UndefinedBehaviorSanitizer.

CC      ?= cc
PREFIX  ?= /usr/local
VERSION := 0.1.0
BUILD   := build

CSTD     := -std=c11 -D_POSIX_C_SOURCE=200809L -D_DEFAULT_SOURCE
WARN     := -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes
CFLAGS   ?= -O2 -g
SANFLAGS := -O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all
# OpenMPI's flags as its mpicc wrapper passes them; "=" so they are read when a recipe runs,
# after scripts/deps.sh has installed OpenMPI on a fresh machine
MPI_CFLAGS = $(shell mpicc --showme:compile 2>/dev/null)
MPI_LIBS   = $(shell mpicc --showme:link 2>/dev/null)
LDLIBS   = -lcjson -lsqlite3 -lopenblas $(MPI_LIBS) $(GPU_LIBS) -ldl -lpthread -lm
TESTLIBS := -lcunit

# CUDA and NCCL are optional: where $(CUDA_HOME) has nvcc (and nccl.h), the binary gains the GPU
# backend (-DPX_HAVE_CUDA, -DPX_HAVE_NCCL); elsewhere it is built CPU-only. Sources that need CUDA
# are kernels/*.cu and files named *_cuda.c; those that need NCCL are named *_nccl.c.
CUDA_HOME ?= /usr/local/cuda
NVCC      ?= $(wildcard $(CUDA_HOME)/bin/nvcc)
HAVE_CUDA := $(if $(NVCC),$(if $(wildcard $(CUDA_HOME)/include/cuda_runtime.h),1))
HAVE_NCCL := $(if $(HAVE_CUDA),$(if $(wildcard $(CUDA_HOME)/include/nccl.h),1))
CUDA_ARCH ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90
NVFLAGS   := -O2 -g -std=c++17 $(CUDA_ARCH) -Xcompiler -Wall,-Wextra
C_SRC    := $(sort $(wildcard engine/*.c sim/*.c db/*.c kernels/*.c exec/*.c))
CU_SRC   := $(if $(HAVE_CUDA),$(sort $(wildcard kernels/*.cu exec/*.cu)))
C_SRC    := $(if $(HAVE_CUDA),$(C_SRC),$(filter-out %_cuda.c,$(C_SRC)))
C_SRC    := $(if $(HAVE_NCCL),$(C_SRC),$(filter-out %_nccl.c,$(C_SRC)))
GPU_DEFS := $(if $(HAVE_CUDA),-DPX_HAVE_CUDA -I$(CUDA_HOME)/include) $(if $(HAVE_NCCL),-DPX_HAVE_NCCL)
# cuBLAS is not linked: kernels/cublas_load.cu opens it when a CUDA context is made
CUDA_LIBS = -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart \
	$(if $(HAVE_NCCL),-lnccl) -lstdc++
GPU_LIBS  = $(if $(HAVE_CUDA),$(CUDA_LIBS))
LIB_SRC  := $(C_SRC) $(CU_SRC)
CLI_SRC  := $(sort $(wildcard cli/*.c))
# tests/*_check.c are standalone programs (their own main), run by the suites under mpirun; they
# share tests/check_report.c, which px_tests does not link
CHECK_SHARED := tests/check_report.c tests/check_onebit.c
TEST_SRC := $(sort $(filter-out tests/%_check.c $(CHECK_SHARED),$(wildcard tests/*.c)))

# objects for one flavour: $(call objs,DIR,SOURCES)
objs = $(patsubst %.cu,$(1)/%.o,$(patsubst %.c,$(1)/%.o,$(2)))

REL := $(BUILD)/rel
SAN := $(BUILD)/san
BIN := $(REL)/parallax
DB  := results/parallax.db

# every bundled scenario; the price list beside them is an input of sweep and plan, not a scenario
SCENARIOS := $(sort $(filter-out scenarios/prices.json,$(wildcard scenarios/*.json)))
# inference scenarios (an "inference" object) are predicted apart: predict takes one kind at a time
INFER_SCENARIOS := $(sort $(wildcard scenarios/*-infer-*.json))
SCENARIOS := $(filter-out $(INFER_SCENARIOS),$(SCENARIOS))

.PHONY: all run test test-rel test-san test-run test-corpus install clean deps bench
all: $(BIN)

deps: $(BUILD)/.deps
$(BUILD)/.deps: scripts/deps.sh
	@mkdir -p $(BUILD)
	@sh scripts/deps.sh
	@touch $@

# version.h changes only when the commit does, so a commit rebuilds one file, not the tree
$(BUILD)/gen/version.h: FORCE
	@mkdir -p $(dir $@)
	@printf '#define PX_VERSION "%s"\n#define PX_GIT_COMMIT "%s"\n' "$(VERSION)" \
		"$$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)$$(git diff --quiet HEAD 2>/dev/null || echo -dirty)" > $@.tmp
	@cmp -s $@.tmp $@ && rm -f $@.tmp || mv $@.tmp $@
FORCE:

$(REL)/%.o: %.c | $(BUILD)/.deps $(BUILD)/gen/version.h
	@mkdir -p $(dir $@)
	$(CC) $(CSTD) $(WARN) $(CFLAGS) -I$(BUILD)/gen $(MPI_CFLAGS) $(GPU_DEFS) -MMD -MP -c $< -o $@
$(SAN)/%.o: %.c | $(BUILD)/.deps $(BUILD)/gen/version.h
	@mkdir -p $(dir $@)
	$(CC) $(CSTD) $(WARN) $(SANFLAGS) -I$(BUILD)/gen $(MPI_CFLAGS) $(GPU_DEFS) -MMD -MP -c $< -o $@
# device code is not instrumented: the sanitizer build links the release build's CUDA objects
# (SAN_LIB_OBJS), so nvcc runs once per file, not twice
$(REL)/%.o: %.cu | $(BUILD)/.deps
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) $(GPU_DEFS) -MMD -MP -c $< -o $@
SAN_LIB_OBJS = $(call objs,$(SAN),$(C_SRC)) $(call objs,$(REL),$(CU_SRC))

$(REL)/db/db.o $(SAN)/db/db.o: $(BUILD)/gen/version.h

$(BIN): $(call objs,$(REL),$(LIB_SRC) $(CLI_SRC))
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)
$(SAN)/parallax: $(SAN_LIB_OBJS) $(call objs,$(SAN),$(CLI_SRC))
	$(CC) $(SANFLAGS) $^ -o $@ $(LDLIBS)

# the test runner links the library and the CLI's command code (not its main)
CLI_LIB := $(filter-out cli/main.c,$(CLI_SRC))
$(REL)/px_tests: $(call objs,$(REL),$(LIB_SRC) $(CLI_LIB) $(TEST_SRC))
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS) $(TESTLIBS)
$(SAN)/px_tests: $(SAN_LIB_OBJS) $(call objs,$(SAN),$(CLI_LIB) $(TEST_SRC))
	$(CC) $(SANFLAGS) $^ -o $@ $(LDLIBS) $(TESTLIBS)

# the comm suite runs this under mpirun; one release build serves both runs, since OpenMPI's
# own start-up leaks would fail LeakSanitizer
$(REL)/comm_mpi_check: $(call objs,$(REL),tests/comm_mpi_check.c $(CHECK_SHARED) $(LIB_SRC))
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)
# ...and this one, on device buffers, where there is a GPU; it is built wherever NCCL is
NCCL_CHECK := $(if $(HAVE_NCCL),$(REL)/comm_nccl_check)
$(REL)/comm_nccl_check: $(call objs,$(REL),tests/comm_nccl_check.c $(CHECK_SHARED) $(LIB_SRC))
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

# make test: every binary the passes use first, as many compilers at once as there are cores
# (scripts/deps.sh runs before any: the objects' order-only prerequisite), then the passes one
# after another
TEST_BINS = $(REL)/px_tests $(BIN) $(REL)/comm_mpi_check $(NCCL_CHECK) $(SAN)/px_tests $(SAN)/parallax
test:
	@$(MAKE) --no-print-directory -j$(shell nproc 2>/dev/null || echo 1) $(TEST_BINS)
	@$(MAKE) --no-print-directory -j1 test-rel test-san test-run test-corpus
# the main job's own scenario list, priced without a database: `make run` must not break unseen
test-run: $(BIN)
	@echo "== make run's scenarios (no database)"
	@$(BIN) predict --no-db $(SCENARIOS) > /dev/null
	@$(BIN) predict --no-db $(INFER_SCENARIOS) > /dev/null
	@echo "all $(words $(SCENARIOS)) bundled training and $(words $(INFER_SCENARIOS)) inference scenarios priced"
# every model config x every DeepSpeed config of the corpus: none refused that DeepSpeed accepts
test-corpus: $(BIN)
	@echo "== the model x ds_config corpus (scripts/corpus_check.sh)"
	@PX_BIN=$(abspath $(BIN)) sh scripts/corpus_check.sh
test-rel: $(REL)/px_tests $(BIN) $(REL)/comm_mpi_check $(NCCL_CHECK)
	@echo "== tests (release build)"
	PX_BIN=$(abspath $(BIN)) PX_RUN_BIN=$(abspath $(BIN)) PX_ROOT=$(CURDIR) \
		PX_COMM_CHECK=$(abspath $(REL)/comm_mpi_check) \
		PX_NCCL_CHECK=$(abspath $(REL)/comm_nccl_check) $(REL)/px_tests
# protect_shadow_gap=0: with the gap protected, the CUDA driver cannot map device memory into the
# sanitized process and every CUDA call fails (harmless where there is no GPU); the suppressions
# cover NVIDIA's libraries' process-lifetime allocations, not ours. PX_RELEASE_RUNS=skip leaves
# inactive the tests whose work is the release binary's (they ran in test-rel; tests/suites.h)
test-san: $(SAN)/px_tests $(SAN)/parallax $(REL)/comm_mpi_check $(NCCL_CHECK) $(BIN)
	@echo "== tests (AddressSanitizer + UndefinedBehaviorSanitizer)"
	PX_RELEASE_RUNS=skip ASAN_OPTIONS=detect_leaks=1:protect_shadow_gap=0 \
		UBSAN_OPTIONS=print_stacktrace=1 \
		LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan_cuda.supp \
		PX_BIN=$(abspath $(SAN)/parallax) PX_RUN_BIN=$(abspath $(BIN)) PX_ROOT=$(CURDIR) \
		PX_COMM_CHECK=$(abspath $(REL)/comm_mpi_check) \
		PX_NCCL_CHECK=$(abspath $(REL)/comm_nccl_check) $(SAN)/px_tests

run: $(BIN)
	@mkdir -p results
	$(BIN) predict --db $(DB) $(SCENARIOS)
	$(BIN) predict --db $(DB) $(INFER_SCENARIOS)

# Sweep throughput on one core over the GPT-3 13B / 64 A100 space (1.1M points), and again on a
# tenth of it: points/s and peak memory side by side show the rate and that memory does not grow
# with the number of points. The tenth's stride splits the groups of points that share a result
# (docs/time_model.md, "Sweep speed"), so it prices every point and runs slower per point. Then how
# fast a large JSON input loads (scripts/bench_jdoc.sh: 100,000 keys, in keys/s); the CPU
# executor's step time predicted against measured at 1, 2 and 4 ranks, each 3 times (scripts/bench_cpu_time.sh:
# it calibrates results/cpu-profile.json first when there is none). Last, the CPU executor's
# tokens/s training GPT-2 124M in fp32 (B 4, T 64) at 1 and 2 threads, beside llm.c's CPU trainer
# when LLMC names a directory where its train_gpt2 is built (scripts/bench_llmc.sh).
LLMC ?=
bench: $(BIN)
	@echo "== sweep, 1 thread, 110,592 points (shard 0/10: every tenth point)"
	@$(BIN) sweep scenarios/sweeps/gpt3-13b-64xa100.json --no-db --jobs 1 --no-progress \
		--shard 0/10 | tail -1
	@echo "== sweep, 1 thread, all 1,105,920 points"
	@$(BIN) sweep scenarios/sweeps/gpt3-13b-64xa100.json --no-db --jobs 1 --no-progress | tail -1
	@echo "# target (issue 4): 50,000 points/s per core; a widely used Python model: about 220"
	@echo "== JSON input: a scenario carrying a 100,000-key object, loaded (parse, duplicate keys)"
	@PX_BIN=$(BIN) sh scripts/bench_jdoc.sh 100000
	@echo "== the CPU executor's step time, predicted from this machine's CPU profile against measured"
	@PX_BIN=$(BIN) sh scripts/bench_cpu_time.sh
	@echo "== executor: GPT-2 124M fp32 training, B 4 x T 64, tokens/s at 1 and 2 threads"
	@PX_BIN=$(BIN) sh scripts/bench_llmc.sh $(LLMC)

# the binary finds share/parallax (bundled scenarios) and share/doc/parallax beside its bin/
# regenerate the README's example outputs from the current binary (the setup suite checks them)
readme: $(BIN)
	@sh scripts/readme_examples.sh

install: $(BIN)
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/share/parallax \
		$(DESTDIR)$(PREFIX)/share/doc/parallax
	install -m 755 $(BIN) $(DESTDIR)$(PREFIX)/bin/parallax
	install -m 644 README.md docs/*.md $(DESTDIR)$(PREFIX)/share/doc/parallax/
	cp -R scenarios $(DESTDIR)$(PREFIX)/share/parallax/

clean:
	rm -rf $(BUILD)

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)

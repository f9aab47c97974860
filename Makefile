# flatshard — one GNU Makefile.
#
#   make                  build build/flatshard, the library and the test programs
#   make test             build and run the whole test suite, the long tier included
#                         (ends with "N passed, M failed, K skipped"; FLATSHARD_LONG=0 omits
#                         the soak test)
#   make SANITIZER=address+undefined test   the same under ASan and UBSan together (also:
#                         thread, for TSan); objects go to build-<sanitizer>/ so they never mix
#                         with the plain build
#   make SANITIZER=fuzz   clang libFuzzer targets of the file parsers, in build-fuzz/fuzz/
#   make DEBUG=1          -O0 -g3 with FS_DEBUG: the debug-only FS_DEBUG_ASSERT checks (core.h) on
#   make WERROR=1         warnings are errors (CI sets this)
#   make CUDA=0           without the CUDA device (default: built when nvcc is on PATH, see below)
#   make NCCL=0           without the NCCL backend (default: built with CUDA when nccl.h is found)
#   make ONEDNN=0         without oneDNN's bf16 GEMM path (default: built when libdnnl-dev is in)
#   make clean
#
# Sources are found by wildcard: a new file under src/<module>/ joins the library, a new
# tests/test_*.c becomes a test program, without editing this file.

CC       ?= gcc
SANITIZER ?=
DEBUG    ?= 0
WERROR   ?= 0

# ---- MPI, part 1: the build directory -------------------------------------------------
# MPI selects the MPI the mpi backend of src/comm links against:
#   make               OpenMPI (Debian openmpi-bin libopenmpi-dev; flags from mpicc --showme)
#   make MPI=mpich     MPICH (Debian mpich libmpich-dev; flags from mpicc.mpich -show), built
#                      into build-mpich/ (build-mpich-<sanitizer>/) so objects never mix
#   make MPI=none      no MPI at all, into build-nompi/: fs_comm_mpi_init returns an error
# MPI is initialised only when the mpi backend is used, so build/flatshard runs without mpirun.
MPI      ?= openmpi
ifneq ($(MPI),openmpi)
ifeq ($(SANITIZER),)
BUILD    ?= build-$(subst none,nompi,$(MPI))
else
BUILD    ?= build-$(subst none,nompi,$(MPI))-$(SANITIZER)
endif
endif

ifeq ($(SANITIZER),)
BUILD    ?= build
else
BUILD    ?= build-$(SANITIZER)
endif

WARN     := -Wall -Wextra -Wpedantic -Wshadow -Wstrict-prototypes -Wmissing-prototypes \
            -Wformat=2 -Wvla -Wfloat-conversion -Wundef -Wno-unused-parameter
ifeq ($(WERROR),1)
WARN     += -Werror
endif

ifeq ($(DEBUG),1)
OPT      := -O0 -g3 -DFS_DEBUG=1
else
OPT      := -O3 -g
endif

SANFLAGS :=
# ASan and UBSan in one build: they instrument different things and combine without conflict,
# and CI's one pass under both saves the ~6 minutes a separate UBSan pass took (TSan cannot be
# combined with ASan)
ifeq ($(SANITIZER),address+undefined)
SANFLAGS := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
else ifeq ($(SANITIZER),thread)
SANFLAGS := -fsanitize=thread
else ifeq ($(SANITIZER),fuzz)
# libFuzzer targets (tests/fuzz/fuzz_*.c) and the library under ASan+UBSan, built with clang
CC       := clang
SANFLAGS := -fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer
else ifneq ($(SANITIZER),)
$(error SANITIZER must be address+undefined, thread or fuzz, not '$(SANITIZER)')
endif

CPPFLAGS := -Iinclude -D_POSIX_C_SOURCE=200809L
# which build this is, for the this-machine calibration's cache key (src/shard/calibrate.c):
# a sanitized or -O0 build's figures must never stand for the release build's
BUILD_FLAVOR := $(if $(filter 1,$(DEBUG)),debug,release)$(if $(SANITIZER),+$(SANITIZER))
CPPFLAGS += -DFS_BUILD_FLAVOR='"$(BUILD_FLAVOR)"'
# -ffp-contract=off: no silent a*b+c -> fma fusion, so kernels give the same bits with any
# compiler or -march (tests compare AdamW bit for bit with PyTorch). Kernels that want FMA
# call it explicitly.
CFLAGS   := -std=c11 -ffp-contract=off $(OPT) $(WARN) $(SANFLAGS) -pthread -MMD -MP
LDFLAGS  := $(SANFLAGS) -pthread
# -lpcre2-8: the tokenizer's pre-tokenizer regexes (src/data/bpe.c: Unicode properties, lookahead)
LDLIBS   := -lopenblas -lcjson -lpcre2-8 -lz -lm -ldl

# ---- MPI, part 2: compile and link flags --------------------------------------------------
# FS_HAVE_MPI tells src/comm/mpi.c whether to build the backend. The MPI test programs
# (tests/mpi/test_*.c) are built to $(BUILD)/mpi_tests/, outside $(BUILD)/tests/, because
# they run under mpirun (the scripts tests/cli/test_*_mpi.sh do that), not directly.
ifeq ($(MPI),openmpi)
MPI_CPPFLAGS := $(shell mpicc --showme:compile 2>/dev/null) -DFS_HAVE_MPI=1
MPI_LDLIBS   := $(shell mpicc --showme:link 2>/dev/null)
else ifeq ($(MPI),mpich)
MPI_CPPFLAGS := $(filter -I% -D%,$(shell mpicc.mpich -show 2>/dev/null)) -DFS_HAVE_MPI=1
MPI_LDLIBS   := $(filter -L% -l% -Wl%,$(shell mpicc.mpich -show 2>/dev/null))
else ifeq ($(MPI),none)
MPI_CPPFLAGS := -DFS_HAVE_MPI=0
MPI_LDLIBS   :=
else
$(error MPI must be openmpi, mpich or none, not '$(MPI)')
endif
ifneq ($(MPI),none)
ifeq ($(filter -DFS_HAVE_MPI=1,$(MPI_CPPFLAGS)),$(strip $(MPI_CPPFLAGS)))
$(error MPI=$(MPI): the MPI compiler wrapper gave no flags; install the MPI development package or build with MPI=none)
endif
MPI_TEST_BIN := $(patsubst tests/mpi/%.c,$(BUILD)/mpi_tests/%,$(wildcard tests/mpi/test_*.c))
endif
CPPFLAGS += $(MPI_CPPFLAGS)
LDLIBS   += $(MPI_LDLIBS)

# ---- oneDNN: the bf16 GEMM on AMX (src/kernels/cpu/gemm_onednn.c) -----------------------
# ONEDNN=1 links Debian's oneDNN (libdnnl-dev: the matmul primitive, brgemm on AMX tiles)
# for the bf16 GEMM's oneDNN path, and libgomp, whose omp_set_num_threads caps the OpenMP
# threads Debian's libdnnl uses at one per caller (kernels.h, "bf16 GEMM paths"). The default
# is 1 when its header is installed; ONEDNN=0 builds the flatshard and sgemm GEMM paths only.
ONEDNN   ?= $(if $(wildcard /usr/include/oneapi/dnnl/dnnl.h),1,0)
ifeq ($(ONEDNN),1)
CPPFLAGS += -DFS_HAVE_ONEDNN=1
LDLIBS   += -ldnnl -lgomp
else ifeq ($(ONEDNN),0)
CPPFLAGS += -DFS_HAVE_ONEDNN=0
else
$(error ONEDNN must be 0 or 1, not '$(ONEDNN)')
endif

# ---- CUDA: the GPU device (src/device/cuda.c, src/kernels/cuda/*.cu) ----------------------
# CUDA=1 builds the CUDA device with nvcc (sm_90: H100/H200) into its own shared library,
# $(BUILD)/libflatshard-cuda.so, which links cudart and cuBLASLt and which the program loads
# (dlopen) only when a GPU is asked for: the program itself never maps the CUDA libraries
# (src/device/device_internal.h says why), and exports its functions to the library
# (-rdynamic). CUDA=0 leaves it out, and --device cuda then says that this build has no
# CUDA. The default is 1 when nvcc is found, except under a sanitizer: the CUDA runtime is
# not instrumented (compute-sanitizer is the GPU's checker), so sanitized builds are
# CPU-only. FS_HAVE_CUDA tells the C code which it is.
# nvcc: on PATH, else where NVIDIA's installer puts it
NVCC      ?= $(or $(shell command -v nvcc 2>/dev/null),$(wildcard /usr/local/cuda/bin/nvcc))
ifeq ($(SANITIZER),)
CUDA      ?= $(if $(NVCC),1,0)
else
CUDA      ?= 0
endif
CUDA_ARCH ?= 90
ifeq ($(CUDA),1)
ifeq ($(NVCC),)
$(error CUDA=1 but nvcc is not on PATH: install the CUDA toolkit or build with CUDA=0)
endif
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(realpath $(NVCC)))
CU_SRC    := $(sort $(wildcard src/*/*/*.cu))
CUDA_C_SRC := src/device/cuda.c
CPPFLAGS  += -DFS_HAVE_CUDA=1 -I$(CUDA_HOME)/include
# -fmad=false: like -ffp-contract=off for the C code, no silent a*b+c -> fma
NVCCFLAGS := -std=c++17 -O3 -g -arch=sm_$(CUDA_ARCH) -fmad=false -Iinclude -Xcompiler -fPIC \
             -Xcompiler -Wall,-Wextra,-Wno-unused-parameter -MMD -MP
ifeq ($(WERROR),1)
NVCCFLAGS += -Werror all-warnings -Xcompiler -Werror
endif
CUDA_LIBS := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublasLt -lcudart -lstdc++
CUDA_SO   := $(BUILD)/libflatshard-cuda.so
LDFLAGS_EXE := -rdynamic
else ifeq ($(CUDA),0)
CU_SRC    :=
CUDA_C_SRC :=
CUDA_SO   :=
LDFLAGS_EXE :=
CPPFLAGS  += -DFS_HAVE_CUDA=0
else
$(error CUDA must be 0 or 1, not '$(CUDA)')
endif

# ---- NCCL: the GPU collectives (src/comm/nccl.c) ----------------------------------------
# NCCL=1 builds the NCCL comm backend into its own library, $(BUILD)/libflatshard-nccl.so,
# which links libnccl and cudart and which the program loads (dlopen) only when a GPU run
# under an MPI launcher asks for it (src/comm/nccl_load.c): like the CUDA device's library,
# it keeps the program itself free of CUDA and NCCL. The default is 1 when CUDA=1 and nccl.h
# is found (in the toolkit's include/, /usr/local/include or /usr/include); NCCL=0 leaves it
# out, and --device cuda then refuses more than one rank. FS_HAVE_NCCL tells the C code.
comma     := ,
NCCL_INC  := $(firstword $(foreach d,$(if $(filter 1,$(CUDA)),$(CUDA_HOME)/include) /usr/local/include /usr/include,$(if $(wildcard $(d)/nccl.h),$(d))))
NCCL      ?= $(if $(and $(filter 1,$(CUDA)),$(NCCL_INC)),1,0)
ifeq ($(NCCL),1)
ifneq ($(CUDA),1)
$(error NCCL=1 needs the CUDA device (CUDA=1))
endif
ifeq ($(NCCL_INC),)
$(error NCCL=1 but nccl.h is not found: install NCCL or build with NCCL=0)
endif
NCCL_LIBDIR := $(firstword $(foreach d,$(CUDA_HOME)/lib64 $(CUDA_HOME)/lib /usr/local/lib /usr/lib/x86_64-linux-gnu,$(if $(wildcard $(d)/libnccl.so*),$(d))))
CPPFLAGS  += -DFS_HAVE_NCCL=1
NCCL_SO   := $(BUILD)/libflatshard-nccl.so
NCCL_OBJ  := $(BUILD)/obj/src/comm/nccl.o
# a host may have the runtime's libnccl.so.2 without the development symlink libnccl.so:
# then link that file by name (-l:libnccl.so.2)
NCCL_LIB  := $(if $(NCCL_LIBDIR),$(if $(wildcard $(NCCL_LIBDIR)/libnccl.so),nccl,:$(notdir \
             $(firstword $(sort $(wildcard $(NCCL_LIBDIR)/libnccl.so.[0-9]*))))),nccl)
NCCL_LIBS := $(if $(NCCL_LIBDIR),-L$(NCCL_LIBDIR) -Wl$(comma)-rpath$(comma)$(NCCL_LIBDIR)) -l$(NCCL_LIB) \
             -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart
else ifeq ($(NCCL),0)
CPPFLAGS  += -DFS_HAVE_NCCL=0
NCCL_SO   :=
NCCL_OBJ  :=
else
$(error NCCL must be 0 or 1, not '$(NCCL)')
endif

# ThreadSanitizer's default options (src/core/sanitizer_defaults.c: huge pages for its shadow
# memory, ~2x faster on a model's weights), linked into every program of a TSan build as an
# object of its own: from libflatshard.a the linker would take the runtime's weak definition
SAN_DEFAULTS_OBJ := $(if $(filter thread,$(SANITIZER)),$(BUILD)/obj/src/core/sanitizer_defaults.o)
LDFLAGS_EXE += $(SAN_DEFAULTS_OBJ)

# the CUDA device's and the NCCL backend's C files go into their libraries, not libflatshard.a
LIB_SRC  := $(filter-out src/device/cuda.c src/comm/nccl.c src/core/sanitizer_defaults.c,$(sort $(wildcard src/*/*.c src/*/*/*.c)))
CLI_SRC  := $(sort $(wildcard cli/*.c))
TEST_SRC := $(sort $(wildcard tests/test_*.c))

LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/obj/%.o)
CUDA_OBJ := $(CUDA_C_SRC:%.c=$(BUILD)/obj/%.o) $(CU_SRC:%.cu=$(BUILD)/obj/%.o)
CLI_OBJ  := $(CLI_SRC:%.c=$(BUILD)/obj/%.o)
TEST_BIN := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
FUZZ_BIN :=
ifeq ($(SANITIZER),fuzz)
FUZZ_BIN := $(patsubst tests/fuzz/%.c,$(BUILD)/fuzz/%,$(wildcard tests/fuzz/fuzz_*.c))
endif

LIB      := $(BUILD)/libflatshard.a
BIN      := $(BUILD)/flatshard

.PHONY: all test check bench clean
# test objects are intermediate files of the pattern rules; keep them between builds
.SECONDARY:
all: $(BIN) $(TEST_BIN) $(MPI_TEST_BIN) $(FUZZ_BIN) $(CUDA_SO) $(NCCL_SO)

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	@echo "  CC    $<"
	@$(CC) $(CPPFLAGS) $(CFLAGS) -c $< -o $@

$(BUILD)/obj/%.o: %.cu
	@mkdir -p $(dir $@)
	@echo "  NVCC  $<"
	@$(NVCC) $(NVCCFLAGS) -DFS_HAVE_CUDA=1 -c $< -o $@

# the CUDA device's C file is position-independent: it goes into a shared library
$(BUILD)/obj/src/device/cuda.o: CFLAGS += -fPIC

$(CUDA_SO): $(CUDA_OBJ)
	@echo "  LD    $@"
	@$(CC) -shared $(LDFLAGS) $^ $(CUDA_LIBS) -o $@

# the NCCL backend's C file is position-independent too; nccl.h (and the CUDA headers it
# includes) are a system header there, so that our warnings are not applied to them
$(BUILD)/obj/src/comm/nccl.o: CFLAGS += -fPIC
$(BUILD)/obj/src/comm/nccl.o: CPPFLAGS += -isystem $(NCCL_INC)

$(NCCL_SO): $(NCCL_OBJ)
	@echo "  LD    $@"
	@$(CC) -shared $(LDFLAGS) $^ $(NCCL_LIBS) -o $@

# every program of a TSan build links the runtime's defaults (SAN_DEFAULTS_OBJ above)
$(BIN) $(TEST_BIN) $(MPI_TEST_BIN): $(SAN_DEFAULTS_OBJ)

# the Makefile too: a source it drops from LIB_SRC must leave the archive as well
$(LIB): $(LIB_OBJ) Makefile
	@rm -f $@
	@echo "  AR    $@"
	@ar rcs $@ $(filter %.o,$^)

$(BIN): $(CLI_OBJ) $(LIB)
	@echo "  LD    $@"
	@$(CC) $(LDFLAGS) $(LDFLAGS_EXE) $(CLI_OBJ) $(LIB) $(LDLIBS) -o $@

$(BUILD)/tests/%: $(BUILD)/obj/tests/%.o $(LIB)
	@mkdir -p $(dir $@)
	@echo "  LD    $@"
	@$(CC) $(LDFLAGS) $(LDFLAGS_EXE) $< $(LIB) $(LDLIBS) -o $@

# the GPU test program calls the CUDA kernels and cudart itself: it links their library, and
# all of libflatshard.a, whose functions the library resolves against the program
ifeq ($(CUDA),1)
$(BUILD)/tests/test_cuda: $(BUILD)/obj/tests/test_cuda.o $(LIB) $(CUDA_SO)
	@mkdir -p $(dir $@)
	@echo "  LD    $@"
	@$(CC) $(LDFLAGS) $(LDFLAGS_EXE) $< -Wl,--whole-archive $(LIB) -Wl,--no-whole-archive $(CUDA_SO) \
	    -Wl,-rpath,'$$ORIGIN/..' $(LDLIBS) $(CUDA_LIBS) -o $@
endif

# the NCCL test programs load libflatshard-nccl.so, which resolves flatshard's functions
# (fs_now, ...) against the program: they link all of libflatshard.a, not only what they call
# (test_nccl also calls cudart itself, in its watchdog test, when NCCL=1)
$(BUILD)/tests/test_nccl: $(BUILD)/obj/tests/test_nccl.o $(LIB)
	@mkdir -p $(dir $@)
	@echo "  LD    $@"
	@$(CC) $(LDFLAGS) $(LDFLAGS_EXE) $< -Wl,--whole-archive $(LIB) -Wl,--no-whole-archive $(LDLIBS) \
	    $(if $(filter 1,$(NCCL)),-L$(CUDA_HOME)/lib64 -Wl$(comma)-rpath$(comma)$(CUDA_HOME)/lib64 -lcudart) -o $@

$(BUILD)/mpi_tests/test_nccl_mpi: $(BUILD)/obj/tests/mpi/test_nccl_mpi.o $(LIB)
	@mkdir -p $(dir $@)
	@echo "  LD    $@"
	@$(CC) $(LDFLAGS) $(LDFLAGS_EXE) $< -Wl,--whole-archive $(LIB) -Wl,--no-whole-archive $(LDLIBS) -o $@

# MPI, part 3: the test program that tests/cli/test_comm_mpi.sh runs under mpirun.
$(BUILD)/fuzz/%: $(BUILD)/obj/tests/fuzz/%.o $(LIB)
	@mkdir -p $(dir $@)
	@echo "  LD    $@"
	@$(CC) -fsanitize=fuzzer,address,undefined $< $(LIB) $(LDLIBS) -o $@

$(BUILD)/mpi_tests/%: $(BUILD)/obj/tests/mpi/%.o $(LIB)
	@mkdir -p $(dir $@)
	@echo "  LD    $@"
	@$(CC) $(LDFLAGS) $(LDFLAGS_EXE) $< $(LIB) $(LDLIBS) -o $@

# The whole suite: every test program, then the end-to-end CLI tests, the long tier
# (tests/cli/test_soak.sh) too unless FLATSHARD_LONG=0 is set; tests/run.sh prints the totals
# and exits non-zero on any failure.
test: all
	@FLATSHARD_LONG=$${FLATSHARD_LONG:-1} FLATSHARD_BUILD=$(BUILD) FLATSHARD_SANITIZER=$(SANITIZER) tests/run.sh

# What CI runs (./quickstart.sh test): the suite on the plain build, under ASan+UBSan and
# under TSan, then the MPI=none and DEBUG=1 builds with a smoke run of each, with one final
# "N passed, M failed, K skipped" line over all of them.
check:
	@WERROR=$(WERROR) tests/check.sh

# Every figure of BENCHMARKS.md, script by script (about an hour on the 2-core machine; each
# prints its table). bench/pytorch.sh installs its peer, a current torch, into .venv-bench
# from PyPI the first time (~5 GB); a facility that is missing — root for the network
# namespaces, a GPU and a CUDA torch for bench/gpu.sh, llm.c for bench/llmc.sh — is skipped
# with a line saying so.
bench: all
	bench/single_process.sh
	bench/kernels.sh
	bench/strategies.sh
	bench/planner.sh
	bench/checkpoint.sh
	bench/tokenize.sh
	bench/comm_mpi_configs.sh
	bench/pytorch.sh
	bench/llmc.sh   # a "skip:" line unless LLMC names an llm.c checkout with train_gpt2 built
	bench/interconnect.sh
	-bench/gpu.sh   # one line and exit 1 where there is no GPU; make goes on

clean:
	rm -rf build build-* 

-include $(LIB_OBJ:.o=.d) $(CUDA_OBJ:.o=.d) $(NCCL_OBJ:.o=.d) $(CLI_OBJ:.o=.d) $(TEST_BIN:$(BUILD)/tests/%=$(BUILD)/obj/tests/%.d)
-include $(MPI_TEST_BIN:$(BUILD)/mpi_tests/%=$(BUILD)/obj/tests/mpi/%.d)
# the fuzz targets too: a header change (a struct that grew) must rebuild them, or the library
# writes past a stale target's smaller struct
-include $(FUZZ_BIN:$(BUILD)/fuzz/%=$(BUILD)/obj/tests/fuzz/%.d)

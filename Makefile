# flatshard — one GNU Makefile.
#
#   make                  build build/flatshard, the library and the test programs
#   make test             build and run the whole test suite (ends with "N passed, M failed")
#   make SANITIZER=address test     the same under ASan (also: undefined, thread); objects go
#                                   to build-<sanitizer>/ so they never mix with the plain build
#   make DEBUG=1          -O0, extra assertions in debug-only checks
#   make WERROR=1         warnings are errors (CI sets this)
#   make clean
#
# Sources are found by wildcard: a new file under src/<module>/ joins the library, a new
# tests/test_*.c becomes a test program, without editing this file.

CC       ?= gcc
SANITIZER ?=
DEBUG    ?= 0
WERROR   ?= 0

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
ifeq ($(SANITIZER),address)
SANFLAGS := -fsanitize=address -fno-omit-frame-pointer
else ifeq ($(SANITIZER),undefined)
SANFLAGS := -fsanitize=undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
else ifeq ($(SANITIZER),thread)
SANFLAGS := -fsanitize=thread
else ifneq ($(SANITIZER),)
$(error SANITIZER must be address, undefined or thread, not '$(SANITIZER)')
endif

CPPFLAGS := -Iinclude -D_POSIX_C_SOURCE=200809L
CFLAGS   := -std=c11 $(OPT) $(WARN) $(SANFLAGS) -pthread -MMD -MP
LDFLAGS  := $(SANFLAGS) -pthread
LDLIBS   := -lopenblas -lcjson -lm

LIB_SRC  := $(sort $(wildcard src/*/*.c src/*/*/*.c))
CLI_SRC  := $(sort $(wildcard cli/*.c))
TEST_SRC := $(sort $(wildcard tests/test_*.c))

LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/obj/%.o)
CLI_OBJ  := $(CLI_SRC:%.c=$(BUILD)/obj/%.o)
TEST_BIN := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)

LIB      := $(BUILD)/libflatshard.a
BIN      := $(BUILD)/flatshard

.PHONY: all test clean
all: $(BIN) $(TEST_BIN)

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -c $< -o $@

$(LIB): $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BIN): $(CLI_OBJ) $(LIB)
	$(CC) $(LDFLAGS) $(CLI_OBJ) $(LIB) $(LDLIBS) -o $@

$(BUILD)/tests/%: $(BUILD)/obj/tests/%.o $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $< $(LIB) $(LDLIBS) -o $@

# The suite: every test program, then the end-to-end CLI tests; tests/run.sh prints the
# totals and exits non-zero on any failure.
test: all
	@FLATSHARD_BUILD=$(BUILD) FLATSHARD_SANITIZER=$(SANITIZER) tests/run.sh

clean:
	rm -rf build build-address build-undefined build-thread

-include $(LIB_OBJ:.o=.d) $(CLI_OBJ:.o=.d) $(TEST_BIN:$(BUILD)/tests/%=$(BUILD)/obj/tests/%.d)

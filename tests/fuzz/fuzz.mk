# tests/fuzz/fuzz.mk - libFuzzer harnesses and the soak test.
#
# Included by the main Makefile (-include tests/fuzz/fuzz.mk); uses its
# BUILD, PKG_CFLAGS, PKG_LIBS, LIBS, DAEMON_SRC, PROTO_SRC, Q and msg.
#
#   make fuzz               build every harness into $(BUILD)/fuzz/
#   make check-fuzz         run each for FUZZ_SECONDS (default 60) over its
#                           seed corpus, then print the executions it made
#   make fuzz-smoke         the same, FUZZ_SMOKE_SECONDS (default 10) each: CI
#   make fuzz-corpus        regenerate tests/fuzz/corpus/ with make_corpus
#   make soak               build $(BUILD)/soak (tests/soak/soak.c)
#
# libFuzzer comes with clang, so the harnesses and every source they link are
# compiled by FUZZ_CC (clang) with their own flags and objects, never mixed
# with the gcc objects of $(BUILD)/obj.  The protocol code is generated again
# into $(BUILD)/fuzz/proto so this tree does not depend on the main one.
#
# FUZZ_SAN holds the sanitizer flags; to fuzz on past a known crash while it
# waits for its fix, build a separate tree with a check left out, e.g.
#   make BUILD=build/xp FUZZ_SAN='-fsanitize=address,undefined
#        -fno-sanitize=nonnull-attribute -DFUZZ_TOLERATE_ZEROING_RACE' fuzz
#
# Each run starts from a copy of the checked-in seeds in
# $(BUILD)/fuzz/work/<harness> (libFuzzer adds what it finds there, the tree
# stays clean); crashes land in $(BUILD)/fuzz/artifacts/.  Files in
# tests/fuzz/regressions/<harness>/ (crashes found earlier) are replayed
# first, one by one: each is a regression test, and the run fails at its end
# while one of them still crashes.

FUZZ_CC ?= clang
FUZZ_SECONDS ?= 60
FUZZ_SMOKE_SECONDS ?= 10
FUZZ_FLAGS ?=
FUZZ_DIR := $(BUILD)/fuzz
FUZZ_HARNESSES := fuzz_frame fuzz_dispatch fuzz_config fuzz_exec \
	fuzz_module_image
FUZZ_BINS := $(addprefix $(FUZZ_DIR)/,$(FUZZ_HARNESSES))

FUZZ_SAN ?= -fsanitize=address,undefined -fno-sanitize-recover=undefined \
	-fno-omit-frame-pointer
FUZZ_WARN := -Wall -Wextra -Wno-unused-parameter -Wshadow \
	-Wstrict-prototypes -Wpointer-arith -Wformat=2 -Wvla \
	-Wimplicit-fallthrough
FUZZ_BASE_CFLAGS := -std=c11 -D_GNU_SOURCE -g -O1 $(FUZZ_WARN) \
	-Iinclude -Iproto -Idaemon -I$(FUZZ_DIR)/proto $(PKG_CFLAGS)
FUZZ_CFLAGS := $(FUZZ_BASE_CFLAGS) -fsanitize=fuzzer-no-link $(FUZZ_SAN)
FUZZ_LDFLAGS := -fsanitize=fuzzer $(FUZZ_SAN)

FUZZ_PROTO_GEN := $(FUZZ_DIR)/proto/gpucmd.pb-c.c
# The daemon without main.c and without the CUDA backend (cuda.c then only
# says "not built"), so the harnesses run the host backend everywhere.
FUZZ_LIB_SRC := $(PROTO_SRC) $(DAEMON_SRC)
fuzz_obj = $(patsubst %.c,$(FUZZ_DIR)/obj/%.o,$(1))
FUZZ_LIB_OBJ := $(call fuzz_obj,$(FUZZ_LIB_SRC)) $(FUZZ_DIR)/obj/gpucmd.pb-c.o
FUZZ_LIB := $(FUZZ_DIR)/libgpucmdd-fuzz.a

.PHONY: fuzz check-fuzz fuzz-smoke fuzz-corpus soak

fuzz: $(FUZZ_BINS)

$(FUZZ_DIR)/proto/gpucmd.pb-c.c $(FUZZ_DIR)/proto/gpucmd.pb-c.h: proto/gpucmd.proto
	$(call msg,PROTOC,$<)
	$(Q)mkdir -p $(FUZZ_DIR)/proto
	$(Q)protoc-c --proto_path=proto --c_out=$(FUZZ_DIR)/proto $<

$(FUZZ_DIR)/obj/%.o: %.c | $(FUZZ_DIR)/proto/gpucmd.pb-c.h
	$(call msg,FUZZCC,$<)
	$(Q)mkdir -p $(dir $@)
	$(Q)$(FUZZ_CC) $(FUZZ_CFLAGS) -MMD -MP -c $< -o $@

$(FUZZ_DIR)/obj/gpucmd.pb-c.o: $(FUZZ_PROTO_GEN)
	$(call msg,FUZZCC,$<)
	$(Q)mkdir -p $(dir $@)
	$(Q)$(FUZZ_CC) $(FUZZ_CFLAGS) -c $< -o $@

$(FUZZ_LIB): $(FUZZ_LIB_OBJ)
	$(call msg,AR,$@)
	$(Q)rm -f $@ && ar rcs $@ $^

$(FUZZ_DIR)/fuzz_%: tests/fuzz/fuzz_%.c $(FUZZ_LIB)
	$(call msg,FUZZLD,$@)
	$(Q)$(FUZZ_CC) $(FUZZ_CFLAGS) -MMD -MP -o $@ $< $(FUZZ_LIB) \
		$(FUZZ_LDFLAGS) $(PKG_LIBS) $(LIBS)

# fuzz_exec is the tool's exec script parser: the harness #includes
# client/cmd_exec.c (its parser is static) and links, instead of the daemon,
# the client library and the tool's other files, gpucmd.c with its main
# renamed so that libFuzzer's runs.  cmd_exec.c is not in the archive: the
# harness holds it.
FUZZ_TOOL_SRC := $(LIB_SRC) $(PROTO_SRC) \
	$(filter-out client/gpucmd.c client/cmd_exec.c,$(TOOL_SRC))
FUZZ_TOOL_OBJ := $(call fuzz_obj,$(FUZZ_TOOL_SRC)) \
	$(FUZZ_DIR)/obj/gpucmd.pb-c.o $(FUZZ_DIR)/obj/client/gpucmd-nomain.o
FUZZ_TOOL_LIB := $(FUZZ_DIR)/libgpucmd-tool-fuzz.a

$(FUZZ_DIR)/obj/client/gpucmd-nomain.o: client/gpucmd.c | $(FUZZ_DIR)/proto/gpucmd.pb-c.h
	$(call msg,FUZZCC,$<)
	$(Q)mkdir -p $(dir $@)
	$(Q)$(FUZZ_CC) $(FUZZ_CFLAGS) -Dmain=gpucmd_tool_main -MMD -MP -c $< -o $@

$(FUZZ_TOOL_LIB): $(FUZZ_TOOL_OBJ)
	$(call msg,AR,$@)
	$(Q)rm -f $@ && ar rcs $@ $^

$(FUZZ_DIR)/fuzz_exec: tests/fuzz/fuzz_exec.c $(FUZZ_TOOL_LIB)
	$(call msg,FUZZLD,$@)
	$(Q)$(FUZZ_CC) $(FUZZ_CFLAGS) -MMD -MP -o $@ $< $(FUZZ_TOOL_LIB) \
		$(FUZZ_LDFLAGS) $(shell pkg-config --libs libprotobuf-c) $(LIBS)

# One run: replay the regressions, then fuzz from a copy of the seeds for
# $(1) seconds each, and say how many inputs every harness executed.
define fuzz_run
	$(Q)mkdir -p $(FUZZ_DIR)/artifacts
	$(Q)set -e; total=0; bad=0; for h in $(FUZZ_HARNESSES); do \
		for r in tests/fuzz/regressions/$$h/*; do \
			[ -f "$$r" ] || continue; \
			if $(FUZZ_DIR)/$$h -artifact_prefix=$(FUZZ_DIR)/artifacts/ \
				"$$r" > $(FUZZ_DIR)/replay.log 2>&1; then \
				echo "  REPLAY $$r: ok"; \
			else \
				echo "  REPLAY $$r: FAILS"; \
				grep -m 3 -E '^fuzz_[a-z]+: |runtime error|ERROR:' \
					$(FUZZ_DIR)/replay.log | sed 's/^/      /'; \
				bad=$$((bad + 1)); \
			fi; \
		done; \
	done; \
	for h in $(FUZZ_HARNESSES); do \
		mkdir -p $(FUZZ_DIR)/work/$$h; \
		echo "  FUZZ   $$h for $(1) s"; \
		if ! $(FUZZ_DIR)/$$h -max_total_time=$(1) -print_final_stats=1 \
			-timeout=10 -rss_limit_mb=4096 \
			-artifact_prefix=$(FUZZ_DIR)/artifacts/$$h- $(FUZZ_FLAGS) \
			$(FUZZ_DIR)/work/$$h tests/fuzz/corpus/$$h \
			> $(FUZZ_DIR)/$$h.log 2>&1; then \
			tail -n 60 $(FUZZ_DIR)/$$h.log; \
			echo "$$h: CRASH, reproducer in $(FUZZ_DIR)/artifacts/"; \
			exit 1; \
		fi; \
		n=$$(sed -n 's/^stat::number_of_executed_units: *//p' \
			$(FUZZ_DIR)/$$h.log); \
		cov=$$(grep -E '^#[0-9]+' $(FUZZ_DIR)/$$h.log | tail -n 1 | \
			sed -nE 's/.*cov: ([0-9]+).*/\1/p'); \
		printf '  %-14s %s executions without a crash (%s s, cov %s)\n' \
			$$h "$$n" $(1) "$$cov"; \
		total=$$((total + n)); \
	done; \
	echo "  fuzz: $$total executions in all, no crash"; \
	[ "$$bad" -eq 0 ] || { echo "  fuzz: $$bad regression(s) fail"; exit 1; }
endef

check-fuzz: fuzz
	$(call fuzz_run,$(FUZZ_SECONDS))

fuzz-smoke: fuzz
	$(call fuzz_run,$(FUZZ_SMOKE_SECONDS))

# The seeds are checked in; this regenerates them (valid frames, batches of
# the dispatch harness's op language, config files).
$(FUZZ_DIR)/make_corpus: tests/fuzz/make_corpus.c $(FUZZ_PROTO_GEN) proto/frame.c
	$(call msg,CC,$<)
	$(Q)mkdir -p $(dir $@)
	$(Q)$(FUZZ_CC) $(FUZZ_BASE_CFLAGS) -o $@ $< proto/frame.c \
		$(FUZZ_PROTO_GEN) $(shell pkg-config --libs libprotobuf-c)

fuzz-corpus: $(FUZZ_DIR)/make_corpus
	$(Q)$(FUZZ_DIR)/make_corpus tests/fuzz/corpus

# ---- soak ----------------------------------------------------------------
# A plain C program (no Check) built with the main tree's compiler and flags
# against the client library; tests/integration/soak_short.sh runs it.

$(BUILD)/soak: tests/soak/soak.c $(BUILD)/libgpucmd.a
	$(call msg,CC,$<)
	$(Q)$(CC) $(ALL_CFLAGS) -Wno-missing-prototypes -o $@ $< \
		$(BUILD)/libgpucmd.a $(ALL_LDFLAGS) \
		$(shell pkg-config --libs libprotobuf-c) $(LIBS)

soak: $(BUILD)/soak

-include $(shell find $(FUZZ_DIR) -name '*.d' 2>/dev/null)

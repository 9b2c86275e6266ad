# tests/bench/bench.mk - gpucmd-bench, included by the top-level Makefile.
#
#   make bench          build everything and run gpucmd-bench (a few minutes)
#   make bench-quick    the same with --quick (under a minute)
#
# gpucmd-bench is a client (libgpucmd.a) that also drives the daemon's memory
# manager and host backend directly for its allocator scenario, so it links
# the daemon's archive too; its objects are built by the Makefile's generic
# rule with ALL_CFLAGS, which already has -Idaemon for the daemon headers.
# Regenerate BENCHMARKS.md with tests/bench/bench_results.sh.
#
# The gpu scenario (bench_gpu.c) calls the CUDA driver API itself: with
# HAVE_CUDA (CUDA=auto finding cuda.h, or CUDA=yes) it gets the toolkit's
# headers, and the embedded built-in PTX comes from libgpucmdd.a, which
# already holds cuda.mk's object; libcuda is opened at run time, never
# linked.  Without HAVE_CUDA the file compiles to a stub that says so.

BENCH_OBJ := $(call obj,$(BENCH_SRC))

ifeq ($(HAVE_CUDA),1)
$(BUILD)/obj/tests/bench/bench_gpu.o: ALL_CFLAGS += -I$(CUDA_HOME)/include
endif

.PHONY: bench bench-quick

# make check runs tests/integration/bench_smoke.sh, which needs the bench.
tests: $(BUILD)/gpucmd-bench

$(BUILD)/gpucmd-bench: $(BENCH_OBJ) $(BUILD)/libgpucmd.a $(BUILD)/libgpucmdd.a
	$(call msg,LD,$@)
	$(Q)$(CC) $(ALL_LDFLAGS) -o $@ $(BENCH_OBJ) $(BUILD)/libgpucmd.a \
		$(BUILD)/libgpucmdd.a $(PKG_LIBS) $(LIBS)

bench: all $(BUILD)/gpucmd-bench
	$(Q)$(BUILD)/gpucmd-bench

bench-quick: all $(BUILD)/gpucmd-bench
	$(Q)$(BUILD)/gpucmd-bench --quick

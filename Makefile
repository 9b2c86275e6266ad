# gpucmd - hand-written GNU Makefile.
#
#   make                 build daemon, tool, libraries into build/
#   make run             install missing deps, build, run the daemon in the foreground
#   make check           every test that needs no GPU; ends with "N passed, N failed"
#   make check-gpu       the integration suite on the CUDA backend (77 without a GPU)
#   make bench           build and run gpucmd-bench
#   make examples        the client examples of examples/ into build/examples/
#   make lint            cppcheck, and the layout of .clang-format (format-check)
#   make format          lay the code out as .clang-format says (clang-format-19)
#   make install         PREFIX=/usr/local DESTDIR=
#
# Switches: V=1 (show commands), SANITIZER=address,undefined | thread,
#           CUDA=auto|yes|no, WERROR=1 (CI), CC=gcc|clang.

CC ?= cc
SANITIZER ?=
comma := ,
# Sanitized builds get their own tree so objects never mix.
BUILD ?= build$(if $(SANITIZER),/san-$(subst $(comma),-,$(SANITIZER)))
PREFIX ?= /usr/local
DESTDIR ?=
CUDA ?= auto
CUDA_HOME ?= /usr/local/cuda
V ?= 0

ifeq ($(V),1)
Q :=
msg = @true
else
Q := @
msg = @printf '  %-6s %s\n' $(1) $(2)
endif

SOVERSION := 0
LIBVERSION := 0.1.0

PKGS := libuv libprotobuf-c libsystemd inih libzstd
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS := $(shell pkg-config --libs $(PKGS) 2>/dev/null)
CHECK_CFLAGS := $(shell pkg-config --cflags check 2>/dev/null)
CHECK_LIBS := $(shell pkg-config --libs check 2>/dev/null)

WARN := -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes \
	-Wpointer-arith -Wformat=2 -Wundef -Wvla -Wno-unused-parameter \
	-Wnull-dereference -Wimplicit-fallthrough -Wno-format-truncation
ifneq ($(findstring clang,$(shell $(CC) --version 2>/dev/null)),)
WARN += -Wno-unknown-warning-option
endif
ifeq ($(WERROR),1)
WARN += -Werror
endif

OPT ?= -O2
CFLAGS ?= $(OPT) -g
ALL_CFLAGS := -std=c11 -D_GNU_SOURCE -fPIC -fvisibility=hidden -fno-common \
	$(WARN) $(CFLAGS) -MMD -MP \
	-Iinclude -Iproto -I$(BUILD)/proto -Idaemon -Iclient $(PKG_CFLAGS)
ALL_LDFLAGS := $(LDFLAGS)
LIBS := -lpthread -ldl -lm

ifneq ($(SANITIZER),)
ALL_CFLAGS += -fsanitize=$(SANITIZER) -fno-omit-frame-pointer
ALL_LDFLAGS += -fsanitize=$(SANITIZER)
endif

# CUDA backend: always built (daemon/driver/cuda_api.h declares what it
# uses of the driver API, which it opens at run time), unless CUDA=no.  The
# toolkit, when found, only compiles the built-in kernels afresh (nvcc) and
# checks cuda_api.h against NVIDIA's cuda.h (check_cuda_api).
CUDA_H := $(wildcard $(CUDA_HOME)/include/cuda.h)
ifeq ($(CUDA),no)
HAVE_CUDA :=
else
HAVE_CUDA := 1
endif

# ---- sources -------------------------------------------------------------

PROTO_GEN := $(BUILD)/proto/gpucmd.pb-c.c
PROTO_SRC := proto/frame.c proto/error.c
TOOL_SRC := $(wildcard client/gpucmd.c client/cmd_*.c)
LIB_SRC := $(filter-out $(TOOL_SRC),$(wildcard client/*.c))
DAEMON_MAIN := daemon/main.c
DAEMON_SRC := $(filter-out $(DAEMON_MAIN),$(wildcard daemon/*.c)) \
	$(wildcard daemon/memory/*.c) daemon/driver/host.c \
	$(wildcard daemon/driver/kernels/*.c) daemon/driver/cuda.c

ifeq ($(HAVE_CUDA),1)
ALL_CFLAGS += -DGPUCMD_HAVE_CUDA=1
-include daemon/driver/cuda.mk
endif

obj = $(patsubst %.c,$(BUILD)/obj/%.o,$(1))
PROTO_OBJ := $(BUILD)/obj/proto/gpucmd.pb-c.o $(call obj,$(PROTO_SRC))
LIB_OBJ := $(call obj,$(LIB_SRC)) $(PROTO_OBJ)
TOOL_OBJ := $(call obj,$(TOOL_SRC))
DAEMON_OBJ := $(call obj,$(DAEMON_SRC)) $(CUDA_EXTRA_OBJ)
DAEMON_MAIN_OBJ := $(call obj,$(DAEMON_MAIN))

# check_cuda_api compares daemon/driver/cuda_api.h with NVIDIA's cuda.h.
UNIT_SRC := $(filter-out $(if $(CUDA_H),,tests/unit/check_cuda_api.c),\
	$(wildcard tests/unit/check_*.c))
UNIT_BIN := $(patsubst tests/unit/%.c,$(BUILD)/tests/%,$(UNIT_SRC))
INTEG_SRC := $(wildcard tests/integration/*.c)
INTEG_BIN := $(patsubst tests/integration/%.c,$(BUILD)/tests/%,$(filter-out tests/integration/harness.c,$(INTEG_SRC)))
BENCH_SRC := $(wildcard tests/bench/*.c)

EXAMPLE_SRC := $(wildcard examples/*.c)
EXAMPLE_BIN := $(patsubst examples/%.c,$(BUILD)/examples/%,$(EXAMPLE_SRC))

BINS := $(BUILD)/gpucmdd $(BUILD)/gpucmd $(BUILD)/libgpucmd.so $(BUILD)/libgpucmd.a

.PHONY: all run check check-unit check-integration check-gpu check-valgrind lint format format-check install uninstall clean deps tests examples
.DEFAULT_GOAL := all

all: $(BINS)

deps:
	@sh packaging/deps.sh

# ---- generated protocol code ----------------------------------------------

# One protoc-c run writes both files.  Named as two targets of one rule,
# a parallel make ran it twice at once (each target its own run), and a
# compile could read a half-written file; the header follows the source.
$(BUILD)/proto/gpucmd.pb-c.c: proto/gpucmd.proto
	$(call msg,PROTOC,$<)
	$(Q)mkdir -p $(BUILD)/proto
	$(Q)protoc-c --proto_path=proto --c_out=$(BUILD)/proto $<

$(BUILD)/proto/gpucmd.pb-c.h: $(BUILD)/proto/gpucmd.pb-c.c
	$(Q)test -f $@ || protoc-c --proto_path=proto --c_out=$(BUILD)/proto \
		proto/gpucmd.proto
	$(Q)touch $@

# Every object may include the generated header.
$(BUILD)/obj/%.o: %.c | $(BUILD)/proto/gpucmd.pb-c.h
	$(call msg,CC,$<)
	$(Q)mkdir -p $(dir $@)
	$(Q)$(CC) $(ALL_CFLAGS) -c $< -o $@

$(BUILD)/obj/proto/gpucmd.pb-c.o: $(BUILD)/proto/gpucmd.pb-c.c
	$(call msg,CC,$<)
	$(Q)mkdir -p $(dir $@)
	$(Q)$(CC) $(ALL_CFLAGS) -Wno-missing-prototypes -c $< -o $@

# ---- libraries and programs -----------------------------------------------

$(BUILD)/libgpucmd.a: $(LIB_OBJ)
	$(call msg,AR,$@)
	$(Q)rm -f $@ && ar rcs $@ $^

$(BUILD)/libgpucmd.so: $(LIB_OBJ)
	$(call msg,LD,$@)
	$(Q)$(CC) -shared -Wl,-soname,libgpucmd.so.$(SOVERSION) $(ALL_LDFLAGS) \
		-o $(BUILD)/libgpucmd.so.$(LIBVERSION) $^ $(shell pkg-config --libs libprotobuf-c) $(LIBS)
	$(Q)ln -sf libgpucmd.so.$(LIBVERSION) $(BUILD)/libgpucmd.so.$(SOVERSION)
	$(Q)ln -sf libgpucmd.so.$(LIBVERSION) $@

# The daemon's objects as one archive: the daemon and the unit tests link it.
$(BUILD)/libgpucmdd.a: $(DAEMON_OBJ) $(PROTO_OBJ)
	$(call msg,AR,$@)
	$(Q)rm -f $@ && ar rcs $@ $^

$(BUILD)/gpucmdd: $(DAEMON_MAIN_OBJ) $(BUILD)/libgpucmdd.a
	$(call msg,LD,$@)
	$(Q)$(CC) $(ALL_LDFLAGS) -o $@ $^ $(PKG_LIBS) $(LIBS)

$(BUILD)/gpucmd: $(TOOL_OBJ) $(BUILD)/libgpucmd.a
	$(call msg,LD,$@)
	$(Q)$(CC) $(ALL_LDFLAGS) -o $@ $^ $(shell pkg-config --libs libprotobuf-c) $(LIBS)

# ---- examples -------------------------------------------------------------

# Built as a user builds a client: the public header only (no daemon or
# client internals on the include path, no _GNU_SOURCE), the static library
# and what it needs.  tests/integration/examples.sh runs them.
EXAMPLE_CFLAGS := -std=c11 $(WARN) $(CFLAGS) -Iinclude \
	$(if $(SANITIZER),-fsanitize=$(SANITIZER) -fno-omit-frame-pointer)

examples: $(EXAMPLE_BIN)

$(BUILD)/examples/%: examples/%.c include/gpucmd.h $(BUILD)/libgpucmd.a
	$(call msg,CC,$<)
	$(Q)mkdir -p $(dir $@)
	$(Q)$(CC) $(EXAMPLE_CFLAGS) -o $@ $< $(BUILD)/libgpucmd.a $(ALL_LDFLAGS) \
		$(shell pkg-config --libs libprotobuf-c) -lpthread

# ---- tests ----------------------------------------------------------------

# Link flags of one unit suite.  check_executor fails the daemon's response
# encodings on demand, as a host out of memory would (there is no malloc
# fault injection): its own __wrap_frame_encode_buf stands in for the
# archive's frame_encode_buf.
UNIT_LDFLAGS :=
$(BUILD)/tests/check_cuda_api: CHECK_CFLAGS += -I$(CUDA_HOME)/include
$(BUILD)/tests/check_executor: UNIT_LDFLAGS += -Wl,--wrap=frame_encode_buf
# ... and its own accept4 and pthread_create stand in for libc's in libuv,
# which --wrap cannot reach (a shared library): exported, they come first
# for libuv's calls too.
$(BUILD)/tests/check_executor: UNIT_LDFLAGS += -Wl,--export-dynamic-symbol=accept4
$(BUILD)/tests/check_executor: UNIT_LDFLAGS += -Wl,--export-dynamic-symbol=pthread_create
# calloc is wrapped to fail one struct session (no memory to accept with).
$(BUILD)/tests/check_executor: UNIT_LDFLAGS += -Wl,--wrap=calloc
# check_host refuses the backend's threads on demand (__wrap_pthread_create),
# as a daemon at its RLIMIT_NPROC or TasksMax= would be.
$(BUILD)/tests/check_host: UNIT_LDFLAGS += -Wl,--wrap=pthread_create

$(BUILD)/tests/check_%: tests/unit/check_%.c $(BUILD)/libgpucmdd.a $(BUILD)/libgpucmd.a
	$(call msg,CC,$<)
	$(Q)mkdir -p $(dir $@)
	$(Q)$(CC) $(ALL_CFLAGS) $(CHECK_CFLAGS) -Wno-missing-prototypes -o $@ $< \
		$(BUILD)/libgpucmdd.a $(BUILD)/libgpucmd.a $(ALL_LDFLAGS) $(UNIT_LDFLAGS) \
		$(CHECK_LIBS) $(PKG_LIBS) $(LIBS)

$(BUILD)/tests/%: tests/integration/%.c tests/integration/harness.h $(BUILD)/libgpucmd.a
	$(call msg,CC,$<)
	$(Q)mkdir -p $(dir $@)
	$(Q)$(CC) $(ALL_CFLAGS) $(CHECK_CFLAGS) -Wno-missing-prototypes -Itests/integration -o $@ $< \
		$(BUILD)/libgpucmd.a $(ALL_LDFLAGS) $(CHECK_LIBS) $(shell pkg-config --libs libprotobuf-c) $(LIBS)

# An LD_PRELOAD shim whose Nth listen(2) fails (socket_path.sh).
$(BUILD)/tests/listen_fail.so: tests/integration/preload/listen_fail.c
	$(call msg,LD,$@)
	$(Q)mkdir -p $(dir $@)
	$(Q)$(CC) $(ALL_CFLAGS) -MF $(BUILD)/tests/listen_fail.d -shared \
		$(ALL_LDFLAGS) -o $@ $< -ldl

tests: all $(UNIT_BIN) $(INTEG_BIN) $(BUILD)/soak $(EXAMPLE_BIN) \
	$(BUILD)/tests/listen_fail.so

check: deps
	$(Q)$(MAKE) --no-print-directory tests
	$(Q)BUILD=$(BUILD) sh tests/run.sh

check-unit: deps
	$(Q)$(MAKE) --no-print-directory tests
	$(Q)BUILD=$(BUILD) sh tests/run.sh unit

check-integration: deps
	$(Q)$(MAKE) --no-print-directory tests
	$(Q)BUILD=$(BUILD) sh tests/run.sh integration

# Static analysis at the warning level, and the layout of .clang-format;
# any finding fails.
lint: $(BUILD)/proto/gpucmd.pb-c.h format-check
	$(Q)cppcheck -q --error-exitcode=1 -Iinclude -Iproto -Idaemon -Iclient \
		-I$(BUILD)/proto daemon client proto

# The code follows .clang-format as clang-format 19 writes it (another
# version lays some lines out otherwise): `make format` rewrites what
# differs, format-check lists it.  Not the device-code fixtures of the
# tests, which are nvcc's input as they were compiled.
CLANG_FORMAT ?= clang-format-19
FORMAT_SRC := $(sort $(wildcard include/*.h proto/*.[ch] client/*.[ch] \
	daemon/*.[ch] daemon/*/*.[ch] daemon/driver/kernels/*.cu \
	examples/*.c tests/*/*.[ch]))

format:
	$(Q)$(CLANG_FORMAT) -i $(FORMAT_SRC)

format-check:
	$(Q)command -v $(CLANG_FORMAT) >/dev/null || { echo "format-check: $(CLANG_FORMAT) is missing: apt-get install clang-format-19"; exit 1; }
	$(Q)out=$$($(CLANG_FORMAT) --dry-run --Werror $(FORMAT_SRC) 2>&1) || \
		{ printf '%s\n' "$$out" | grep 'error:' | head -n 20; \
		  echo "format-check: these lines differ from .clang-format: make format"; exit 1; }

# The integration suites with the daemon under valgrind (memory errors and
# definite leaks fail the test).
check-valgrind: deps
	$(Q)$(MAKE) --no-print-directory tests
	$(Q)command -v valgrind >/dev/null || { echo "check-valgrind: skipped: valgrind is not installed"; exit 77; }
	$(Q)BUILD=$(BUILD) sh tests/run.sh valgrind

# Skips (exit 77) with the reason when no CUDA device answers.
check-gpu: deps
	$(Q)$(MAKE) --no-print-directory tests
	$(Q)if ! $(BUILD)/gpucmdd --backend cuda --probe; then \
		echo "check-gpu: skipped: no usable CUDA device (see the line above)"; \
		exit 77; \
	fi
	$(Q)BUILD=$(BUILD) GPUCMD_TEST_BACKEND=cuda sh tests/run.sh integration

# ---- fragments owned by their areas ---------------------------------------
# tests/bench/bench.mk:     bench, $(BUILD)/gpucmd-bench
# tests/fuzz/fuzz.mk:       fuzz, check-fuzz
# tests/fakecuda/fakecuda.mk: $(BUILD)/fakecuda/libcuda.so.1 (CUDA backend in CI)
# packaging/packaging.mk:   INSTALL_EXTRA / UNINSTALL_EXTRA targets, deb
-include tests/bench/bench.mk
-include tests/fuzz/fuzz.mk
-include tests/fakecuda/fakecuda.mk
-include packaging/packaging.mk

# ---- running --------------------------------------------------------------

RUN_SOCKET ?= $(CURDIR)/$(BUILD)/gpucmd.sock
run: deps
	$(Q)$(MAKE) --no-print-directory all
	@echo "gpucmdd: serving on $(RUN_SOCKET) (Ctrl-C stops it)"
	@echo "try:     $(BUILD)/gpucmd --socket $(RUN_SOCKET) status"
	$(Q)$(BUILD)/gpucmdd --socket $(RUN_SOCKET) --backend auto

# ---- install --------------------------------------------------------------

BINDIR := $(PREFIX)/bin
SBINDIR := $(PREFIX)/sbin
LIBDIR := $(PREFIX)/lib
INCDIR := $(PREFIX)/include
MANDIR := $(PREFIX)/share/man

install: all $(INSTALL_EXTRA)
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(SBINDIR) $(DESTDIR)$(LIBDIR) \
		$(DESTDIR)$(INCDIR) $(DESTDIR)$(LIBDIR)/pkgconfig
	install -m 0755 $(BUILD)/gpucmdd $(DESTDIR)$(SBINDIR)/gpucmdd
	install -m 0755 $(BUILD)/gpucmd $(DESTDIR)$(BINDIR)/gpucmd
	install -m 0644 $(BUILD)/libgpucmd.so.$(LIBVERSION) $(DESTDIR)$(LIBDIR)/
	ln -sf libgpucmd.so.$(LIBVERSION) $(DESTDIR)$(LIBDIR)/libgpucmd.so.$(SOVERSION)
	ln -sf libgpucmd.so.$(SOVERSION) $(DESTDIR)$(LIBDIR)/libgpucmd.so
	install -m 0644 $(BUILD)/libgpucmd.a $(DESTDIR)$(LIBDIR)/
	install -m 0644 include/gpucmd.h $(DESTDIR)$(INCDIR)/
	for m in man/*.[1-8]; do \
		[ -f "$$m" ] || continue; s=$${m##*.}; \
		install -d $(DESTDIR)$(MANDIR)/man$$s; \
		install -m 0644 $$m $(DESTDIR)$(MANDIR)/man$$s/; \
	done
ifeq ($(DESTDIR),)
	@# Onto this system: the loader's cache, and what the units need.
	-@[ "$$(id -u)" != 0 ] || ldconfig
	@echo "installed. For the daemon's units (as root):"
	@echo "  systemd-sysusers $(SYSUSERSDIR)/gpucmd.conf"
	@echo "  systemd-tmpfiles --create $(TMPFILESDIR)/gpucmd.conf"
	@echo "  systemctl daemon-reload && systemctl enable --now gpucmdd.socket"
endif

uninstall: $(UNINSTALL_EXTRA)
	rm -f $(DESTDIR)$(SBINDIR)/gpucmdd $(DESTDIR)$(BINDIR)/gpucmd \
		$(DESTDIR)$(LIBDIR)/libgpucmd.so* $(DESTDIR)$(LIBDIR)/libgpucmd.a \
		$(DESTDIR)$(INCDIR)/gpucmd.h
	for m in man/*.[1-8]; do \
		[ -f "$$m" ] || continue; s=$${m##*.}; \
		rm -f $(DESTDIR)$(MANDIR)/man$$s/$${m##*/}; \
	done

clean:
	rm -rf $(BUILD)

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)

# kvpool - build, run and test.
#
#   make run     install missing Debian packages, build, start kvpoold with defaults
#   make test    install, build, run every test (unit, integration, python, fuzz smoke)
#   make         build only (binaries in build/bin, libraries in build/lib)
#   make test SANITIZE=address,undefined    the same under sanitizers (build in build/san-*)
#   make install PREFIX=/usr/local
#   make wheel   dist/kvpool-*.whl and dist/mooncake_kvpool-*.whl (docs/engines.md)
#
# Libraries are composed of folders, never of hand-picked files (docs/architecture.md):
#   protocol/ shm/ transfer/   shared by the client and the node: the wire contract, the shared
#                              memory both map, the copy pool
#   client/                    libkvpool (with the shared folders)
#   alloc/ messages/ infra/ rdma/ tier/ dataplane/ lookup_server/ actors/ master/
#                              the daemon, every role (with the shared folders)
# Folders are layers: a folder includes only from folders below it (tests/extra/layers.sh).
# A new .c file joins its folder's library; each tests/test_*.c is an integration test
# program (with tests/testutil.c and infra/ready_file.c); each bench/*.c joins kvpool-bench
# (with infra/ready_file.c). Header dependencies are tracked (-MMD).

PREFIX ?= /usr/local
SANITIZE ?=
comma := ,
CC ?= cc

ifeq ($(SANITIZE),)
BUILD := build
OPT := -O2
else
BUILD := build/san-$(subst $(comma),-,$(SANITIZE))
OPT := -O1 -fno-omit-frame-pointer -fsanitize=$(SANITIZE) -fno-sanitize-recover=all
endif

GEN := $(BUILD)/gen
OBJ := $(BUILD)/obj
BIN := $(BUILD)/bin
LIB := $(BUILD)/lib

CFLAGS_BASE := -std=gnu11 -g -Wall -Wextra -fPIC -pthread -MMD -MP \
	-Iinclude -I. -I$(GEN) -D_GNU_SOURCE
CFLAGS += $(OPT) $(CFLAGS_BASE)
LDFLAGS += $(if $(SANITIZE),-fsanitize=$(SANITIZE)) -pthread
LIBS := -lczmq -lzmq -lprotobuf-c -lmsgpackc -lrt -ldl
SERVER_LIBS := $(LIBS) -ljemalloc -lpcre2-8 -luring -lxxhash -lmicrohttpd -lcurl -lcjson $(if $(wildcard rdma/*.c),-libverbs)

# Debian packages the build, the tests and the benchmark need.
DEB_PACKAGES := build-essential pkg-config libzmq3-dev libczmq-dev libprotobuf-c-dev \
	protobuf-c-compiler protobuf-compiler libjemalloc-dev libibverbs-dev libmsgpack-dev \
	libhiredis-dev libpcre2-dev liburing-dev libxxhash-dev libmicrohttpd-dev libcurl4-openssl-dev \
	libcjson-dev etcd-server etcd-client prometheus tmux help2man gnuplot-nox redis-server clang libclang-rt-14-dev python3 python3-zmq python3-msgpack \
	python3-pytest python3-numpy python3-protobuf python3-dev python3-venv procps iperf3

PROTO := protocol/kvpool.proto
PROTO_C := $(GEN)/protocol/kvpool.pb-c.c
PROTO_H := $(GEN)/protocol/kvpool.pb-c.h
CLUSTER_PROTO := protocol/cluster.proto
CLUSTER_PROTO_C := $(GEN)/protocol/cluster.pb-c.c
CLUSTER_PROTO_H := $(GEN)/protocol/cluster.pb-c.h
#  C headers made from the proto (protocol/gen_header.awk): the status codes and the stats
#  fields, written once there. include/kvpool.h includes them; they are installed beside it.
CONTRACT_H := $(GEN)/kvpool_status.h $(GEN)/kvpool_stats.h

SHARED_DIRS := protocol shm transfer
CLIENT_DIRS := client $(SHARED_DIRS)
SERVER_DIRS := alloc actors master infra messages lookup_server rdma tier dataplane $(SHARED_DIRS)
sources_in = $(filter-out %_fuzz.c,$(wildcard $(addsuffix /*.c,$(1))))
SERVER_SRC := $(call sources_in,$(SERVER_DIRS))
CLIENT_SRC := $(call sources_in,$(CLIENT_DIRS))
TEST_SRC := $(wildcard tests/test_*.c)
BENCH_SRC := $(wildcard bench/*.c)
#  bench/soak.c is a program of its own (kvpool-soak, below), not a section of kvpool-bench.
BENCH_SRC := $(filter-out bench/soak.c,$(BENCH_SRC))

SERVER_OBJ := $(patsubst %.c,$(OBJ)/%.o,$(SERVER_SRC)) $(OBJ)/gen/kvpool.pb-c.o \
	$(OBJ)/gen/cluster.pb-c.o
CLIENT_OBJ := $(patsubst %.c,$(OBJ)/%.o,$(sort $(CLIENT_SRC))) $(OBJ)/gen/kvpool.pb-c.o
ALL_OBJ := $(sort $(SERVER_OBJ) $(CLIENT_OBJ))

TEST_BINS := $(patsubst tests/%.c,$(BIN)/%,$(TEST_SRC))
PROGRAMS := $(BIN)/kvpoold $(BIN)/kvpool $(BIN)/kvpool-bench $(BIN)/kvpool-selftest
#  The stand-in CUDA runtime the tests load (tests/fake_cudart.c), and the check of the real
#  GPU path, run by hand on a machine with a GPU (tests/gpu/gpu_check.c); neither is installed.
FAKE_CUDART := $(LIB)/libfake_cudart.so
GPU_CHECK := $(BIN)/kvpool-gpu-check

#  kvpool._batch (python/kvpool/_batch.c): the binding's key arrays and result lists built in
#  C, a CPython extension for Debian's python3 (the interpreter the tests and the package
#  use). Built only where its headers are; without it the binding does the same in Python,
#  slower for large batches.
PYTHON := /usr/bin/python3
PY_INCLUDE := $(shell $(PYTHON) -c 'import sysconfig; print(sysconfig.get_paths()["include"])' 2>/dev/null)
PY_SUFFIX := $(shell $(PYTHON) -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))' 2>/dev/null)
PY_BATCH := $(if $(wildcard $(PY_INCLUDE)/Python.h),$(LIB)/kvpool_batch$(PY_SUFFIX))

.PHONY: all deps run test check unit integration python-test install man clean format fuzz \
	readme-settings docs-metrics gpu-bundle wheel
all: $(PROGRAMS) $(LIB)/libkvpool.a $(LIB)/libkvpool.so $(TEST_BINS) python-proto $(FAKE_CUDART) \
	$(GPU_CHECK) $(PY_BATCH)

# ---- packages ------------------------------------------------------------------------
deps:
	@missing=""; for p in $(DEB_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q $$missing; \
	fi

# ---- generated protocol code ---------------------------------------------------------
$(PROTO_C) $(PROTO_H): $(PROTO)
	@mkdir -p $(GEN)
	protoc-c --c_out=$(GEN) $(PROTO)

$(CLUSTER_PROTO_C) $(CLUSTER_PROTO_H): $(CLUSTER_PROTO)
	@mkdir -p $(GEN)
	protoc-c --c_out=$(GEN) $(CLUSTER_PROTO)

$(GEN)/kvpool_%.h: $(PROTO) protocol/gen_header.awk
	@mkdir -p $(GEN)
	awk -v what=$* -f protocol/gen_header.awk $(PROTO) > $@.tmp && mv $@.tmp $@

python-proto: python/kvpool/kvpool_pb2.py python/kvpool/_status_text.py
python/kvpool/_status_text.py: $(PROTO) protocol/gen_header.awk
	awk -v what=python -f protocol/gen_header.awk $(PROTO) > $@.tmp && mv $@.tmp $@
python/kvpool/kvpool_pb2.py: $(PROTO)
	@mkdir -p python/kvpool
	protoc --python_out=$(GEN) $(PROTO)
	cp $(GEN)/protocol/kvpool_pb2.py $@

# ---- objects and libraries -----------------------------------------------------------
#  Every object waits for the generated protocol header; -MMD writes what else it includes.
$(OBJ)/%.o: %.c | $(PROTO_H) $(CLUSTER_PROTO_H) $(CONTRACT_H)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(OBJ)/gen/kvpool.pb-c.o: $(PROTO_C) | $(CONTRACT_H)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(OBJ)/gen/cluster.pb-c.o: $(CLUSTER_PROTO_C)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

#  libkvpool's objects (the shared folders' too: the node links them statically, where
#  visibility does not matter) keep every name inside the library; include/kvpool.h marks
#  the API with KVPOOL_EXPORT, the only names libkvpool.so exports.
$(CLIENT_OBJ): CFLAGS += -fvisibility=hidden

$(LIB)/libkvpool.a: $(CLIENT_OBJ)
	@mkdir -p $(LIB)
	rm -f $@ && ar rcs $@ $^

#  Exports only the API: KVPOOL_EXPORT names, and client/libkvpool.map as a second fence.
$(LIB)/libkvpool.so: $(CLIENT_OBJ) client/libkvpool.map
	@mkdir -p $(LIB)
	$(CC) -shared $(LDFLAGS) -Wl,-soname,libkvpool.so.1 \
	  -Wl,--version-script=client/libkvpool.map -o $@ $(CLIENT_OBJ) $(LIBS)

#  The name programs linked with libkvpool.so look for (its soname).
$(LIB)/libkvpool.so.1: $(LIB)/libkvpool.so
	ln -sf libkvpool.so $@

#  The extension links nothing of kvpool's: it only builds arrays the ctypes calls take.
$(OBJ)/python/kvpool/_batch.o: python/kvpool/_batch.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -fvisibility=hidden -I$(PY_INCLUDE) -c $< -o $@

$(LIB)/kvpool_batch$(PY_SUFFIX): $(OBJ)/python/kvpool/_batch.o
	@mkdir -p $(LIB)
	$(CC) -shared $(LDFLAGS) -o $@ $^

# Everything, for the daemon and the tests.
$(LIB)/libkvpool-all.a: $(ALL_OBJ)
	@mkdir -p $(LIB)
	rm -f $@ && ar rcs $@ $^

# ---- programs ------------------------------------------------------------------------
$(BIN)/kvpoold: $(OBJ)/tools/kvpoold.o $(LIB)/libkvpool-all.a
	@mkdir -p $(BIN)
	$(CC) $(LDFLAGS) -o $@ $^ $(SERVER_LIBS)

$(BIN)/kvpool: $(OBJ)/tools/kvpool.o $(OBJ)/tools/kvpool_top.o $(LIB)/libkvpool.a
	@mkdir -p $(BIN)
	$(CC) $(LDFLAGS) -o $@ $^ $(LIBS) -lm

$(BIN)/kvpool-selftest: $(OBJ)/tests/selftest.o $(LIB)/libkvpool-all.a
	@mkdir -p $(BIN)
	$(CC) $(LDFLAGS) -o $@ $^ $(SERVER_LIBS)

# The benchmark is a plain client: libkvpool and glibc's malloc, as an application has. It
# starts kvpoold as the tests do, and reads its ready file with the tests' reader; its master
# section speaks the cluster protocol to a master, with the generated codec.
$(BIN)/kvpool-bench: $(patsubst %.c,$(OBJ)/%.o,$(BENCH_SRC)) $(OBJ)/infra/ready_file.o \
		$(OBJ)/gen/cluster.pb-c.o $(LIB)/libkvpool.a
	@mkdir -p $(BIN)
	$(CC) $(LDFLAGS) -o $@ $^ $(LIBS) -lhiredis -lm

# The soak and chaos driver (issue #15, docs/soak.md): a plain client as the benchmark is,
# with its process helpers. make soak / make chaos run it for 10 minutes; neither is part of
# make test. Arguments go through SOAK_ARGS / CHAOS_ARGS (e.g. SOAK_ARGS=--disk).
$(BIN)/kvpool-soak: $(OBJ)/bench/soak.o $(OBJ)/bench/bench_proc.o $(OBJ)/bench/bench_values.o \
		$(OBJ)/bench/bench_verdict.o \
		$(OBJ)/infra/ready_file.o $(LIB)/libkvpool.a
	@mkdir -p $(BIN)
	$(CC) $(LDFLAGS) -o $@ $^ $(LIBS) -lm

.PHONY: soak chaos
soak: $(BIN)/kvpool-soak $(BIN)/kvpoold
	$(BIN)/kvpool-soak --kvpoold $(BIN)/kvpoold --out $(BUILD)/soak $(SOAK_ARGS)
chaos: $(BIN)/kvpool-soak $(BIN)/kvpoold
	$(BIN)/kvpool-soak --chaos --kvpoold $(BIN)/kvpoold --out $(BUILD)/chaos $(CHAOS_ARGS)

$(BIN)/test_%: $(OBJ)/tests/test_%.o $(OBJ)/tests/testutil.o $(OBJ)/infra/ready_file.o \
		$(LIB)/libkvpool-all.a
	@mkdir -p $(BIN)
	$(CC) $(LDFLAGS) -o $@ $^ $(SERVER_LIBS)

#  A shared library that stands in for libcudart in the tests (KVPOOL_CUDART=its path).
$(FAKE_CUDART): $(OBJ)/tests/fake_cudart.o
	@mkdir -p $(LIB)
	$(CC) -shared $(LDFLAGS) -o $@ $^

#  A plain client of libkvpool.so: the CUDA runtime is loaded at run time (dlopen), kvpoold
#  is started from beside it (tests/testutil.c).
$(GPU_CHECK): $(OBJ)/tests/gpu/gpu_check.o $(OBJ)/tests/testutil.o $(OBJ)/infra/ready_file.o \
		$(LIB)/libkvpool.so.1
	@mkdir -p $(BIN)
	$(CC) $(LDFLAGS) -o $@ $(filter %.o,$^) -L$(LIB) -l:libkvpool.so.1 \
	  -Wl,-rpath,'$$ORIGIN/../lib' -ldl

#  kvpool-gpu-check, kvpoold, libkvpool.so and the shared libraries they need beyond the C
#  library, in one folder to copy to a GPU machine (tests/gpu/bundle.sh).
gpu-bundle: $(GPU_CHECK) $(BIN)/kvpoold
	bash tests/gpu/bundle.sh $(BIN) $(LIB) $(BUILD)/gpu-bundle

#  The wheels (tools/make_wheel.py, standard library only): dist/kvpool-*.whl, the package with
#  a libkvpool linked to find its dependencies in the wheel's kvpool/_libs (DT_RPATH, which
#  covers their own dependencies too) and those libraries; dist/mooncake_kvpool-*.whl, the
#  opt-in `mooncake` package whose mooncake.store is kvpool's drop-in. docs/engines.md.
WHEEL_LIB := $(BUILD)/wheel/libkvpool.so
$(WHEEL_LIB): $(CLIENT_OBJ) client/libkvpool.map
	@mkdir -p $(dir $@)
	$(CC) -shared $(LDFLAGS) -Wl,-soname,libkvpool.so.1 \
	  -Wl,--disable-new-dtags,-rpath,'$$ORIGIN/_libs' \
	  -Wl,--version-script=client/libkvpool.map -o $@ $(CLIENT_OBJ) $(LIBS)
WHEEL_DIR ?= dist
wheel: $(WHEEL_LIB) python-proto
	$(PYTHON) tools/make_wheel.py --lib $(WHEEL_LIB) --python python --version $(VERSION) \
	  --out $(WHEEL_DIR)

# ---- running -------------------------------------------------------------------------
# deps runs to completion before anything is compiled (the build needs its packages).
run: deps
	$(MAKE) all
	$(BIN)/kvpoold --segment-size 1GiB

test: deps
	$(MAKE) all
	BIN=$(BIN) SANITIZE=$(SANITIZE) bash tests/run.sh

check: test

# ---- man pages: the programs' own --help (help2man), with the SYNOPSIS, FILES, EXAMPLES
#  and SEE ALSO of man/NAME.h2m ------------------------------------------------------------
VERSION := $(shell sed -n 's/^\#define KVP_VERSION "\(.*\)"/\1/p' protocol/contract.h)
MAN := $(BUILD)/man/kvpoold.8 $(BUILD)/man/kvpool.1 $(BUILD)/man/kvpool-bench.1
$(BUILD)/man/kvpoold.8: $(BIN)/kvpoold man/kvpoold.h2m
	@mkdir -p $(dir $@)
	help2man -N -s 8 -n "a node of kvpool, the KV-cache store for LLM inference" \
	  --include=man/kvpoold.h2m --version-string=$(VERSION) -o $@ $<
$(BUILD)/man/kvpool.1: $(BIN)/kvpool man/kvpool.h2m
	@mkdir -p $(dir $@)
	help2man -N -s 1 -n "put, get, inspect and watch a kvpool node" \
	  --include=man/kvpool.h2m --version-string=$(VERSION) -o $@ $<
$(BUILD)/man/kvpool-bench.1: $(BIN)/kvpool-bench man/kvpool-bench.h2m
	@mkdir -p $(dir $@)
	help2man -N -s 1 -n "measure kvpool against Redis, memcpy and iperf3 on this machine" \
	  --include=man/kvpool-bench.h2m --version-string=$(VERSION) -o $@ $<
man: $(MAN)

#  systemd's unit directory under PREFIX (/usr/local/lib/systemd/system is on its path).
SYSTEMD_DIR ?= $(PREFIX)/lib/systemd/system
install: all man
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib $(DESTDIR)$(PREFIX)/include
	install -m 755 $(PROGRAMS) $(DESTDIR)$(PREFIX)/bin/
	install -m 644 $(LIB)/libkvpool.a $(DESTDIR)$(PREFIX)/lib/
	install -m 755 $(LIB)/libkvpool.so $(DESTDIR)$(PREFIX)/lib/libkvpool.so.1
	ln -sf libkvpool.so.1 $(DESTDIR)$(PREFIX)/lib/libkvpool.so
	install -m 644 include/kvpool.h $(CONTRACT_H) $(DESTDIR)$(PREFIX)/include/
	install -d $(DESTDIR)$(PREFIX)/lib/pkgconfig
	sed 's|@PREFIX@|$(PREFIX)|; s|@VERSION@|$(VERSION)|' packaging/kvpool.pc.in \
	  >$(DESTDIR)$(PREFIX)/lib/pkgconfig/kvpool.pc
	@pydir=$(DESTDIR)$(PREFIX)/lib/python3/dist-packages; install -d $$pydir/kvpool && \
	  cp -r python/kvpool/*.py $$pydir/kvpool/ && echo "python package installed in $$pydir"
	$(if $(PY_BATCH),install -m 644 $(PY_BATCH) \
	  $(DESTDIR)$(PREFIX)/lib/python3/dist-packages/kvpool/_batch$(PY_SUFFIX))
	install -d $(DESTDIR)$(PREFIX)/share/man/man1 $(DESTDIR)$(PREFIX)/share/man/man8
	install -m 644 $(BUILD)/man/kvpool.1 $(BUILD)/man/kvpool-bench.1 \
	  $(DESTDIR)$(PREFIX)/share/man/man1/
	install -m 644 $(BUILD)/man/kvpoold.8 $(DESTDIR)$(PREFIX)/share/man/man8/
	install -d $(DESTDIR)$(SYSTEMD_DIR) $(DESTDIR)/etc/kvpool
	sed 's|@BINDIR@|$(PREFIX)/bin|' packaging/kvpoold.service.in \
	  >$(DESTDIR)$(SYSTEMD_DIR)/kvpoold.service
	@# The settings file is the administrator's once it is there.
	@[ -e $(DESTDIR)/etc/kvpool/kvpoold.conf ] || \
	  install -m 644 packaging/kvpoold.conf $(DESTDIR)/etc/kvpool/kvpoold.conf
	@# The service's user, on a real install (not into a staging DESTDIR).
	@if [ -z "$(DESTDIR)" ] && ! id kvpool >/dev/null 2>&1; then \
	  useradd --system --no-create-home --shell /usr/sbin/nologin kvpool && \
	  echo "created the system user kvpool"; fi
	@echo "installed; as a service: systemctl daemon-reload && systemctl enable --now kvpoold"

format:
	clang-format -i $$(git ls-files '*.c' '*.h')

#  Tables kvpoold prints from its own tables, written between markers in the documentation:
#  README.md's settings table (infra/config_options.c) and docs/metrics.md's metric table
#  (infra/metrics.c); tests/extra/generated_tables.sh fails when they differ.
#  $(call write_table,FILE,MARKER,OPTION)
define write_table
	@grep -q '^<!-- $(2):begin -->$$' $(1) && grep -q '^<!-- $(2):end -->$$' $(1) || \
	  { echo "$(1) lacks the $(2) markers"; exit 1; }
	$(BIN)/kvpoold $(3) >$(BUILD)/$(2).md
	awk -v table=$(BUILD)/$(2).md \
	  '/^<!-- $(2):end -->$$/ { skip = 0 } \
	   !skip { print } \
	   /^<!-- $(2):begin -->$$/ { while ((getline line < table) > 0) print line; skip = 1 }' \
	  $(1) >$(1).tmp && mv $(1).tmp $(1)
endef
readme-settings: $(BIN)/kvpoold
	$(call write_table,README.md,settings-table,--help-markdown)
	$(call write_table,docs/settings.md,settings-table,--help-markdown)
docs-metrics: $(BIN)/kvpoold
	$(call write_table,docs/metrics.md,metrics-table,--metrics-markdown)

clean:
	rm -rf build

-include tests/fuzz/fuzz.mk
-include $(shell find $(OBJ) -name '*.d' 2>/dev/null)

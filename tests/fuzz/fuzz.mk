# tests/fuzz/fuzz.mk - the libFuzzer targets and `make fuzz`. Included by the top-level Makefile.
#
#   make fuzz                       fuzz each target for FUZZ_SECONDS (default 60) on a copy of
#                                   its seed corpus in build/fuzz-corpus/NAME; crashes go to
#                                   build/fuzz-crashes/NAME
#   make build/bin/NAME-fuzz        only build one target
#
# Targets (NAME: source; seed corpus tests/fuzz/NAME/):
#   lookup   lookup_server/lookup_request_fuzz.c: the lookup/reset admin channel's decoder
#   config   infra/config_fuzz.c: kvpoold's size parser and command-line parser
#   request  messages/request_check_fuzz.c: a client message, decoded by protobuf-c and
#            checked as the api does (messages/request_check.c)
#   rdma     rdma/rdma_wire_fuzz.c: the RDMA connection data two nodes exchange
#
# The committed seed corpora are only read: libFuzzer writes the inputs it finds into the
# first corpus directory, which is the copy. An input that once crashed a target is added to
# its seed corpus, so tests/extra/fuzz.sh replays it in every `make test`. Built with clang
# and Debian's libclang-rt (libclang-rt-14-dev), always in build/ whatever SANITIZE says.

FUZZ_CC ?= clang
FUZZ_SECONDS ?= 60
FUZZ_TARGETS := lookup config request rdma
FUZZ_FLAGS := -std=gnu11 -g -O1 -fno-omit-frame-pointer -Wall -Wextra -Wno-unused-parameter \
	-fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
	-Iinclude -I. -D_GNU_SOURCE

LOOKUP_FUZZ_SRC := lookup_server/lookup_request_fuzz.c lookup_server/lookup_request.c \
	lookup_server/lookup_keys.c
LOOKUP_FUZZ_HDR := lookup_server/lookup_request.h lookup_server/lookup_keys.h \
	infra/lookup_config.h
CONFIG_FUZZ_SRC := infra/config_fuzz.c infra/config.c infra/config_options.c infra/endpoints.c infra/log.c \
	infra/etcd.c
CONFIG_FUZZ_HDR := infra/config.h infra/config_options.h infra/endpoints.h infra/log.h infra/lookup_config.h \
	infra/etcd.h

#  The request target needs the generated Request decoder, made here so that it does not
#  depend on which build (SANITIZE) the top-level Makefile is in.
REQUEST_FUZZ_GEN := build/fuzz-gen/protocol/kvpool.pb-c.c
REQUEST_FUZZ_SRC := messages/request_check_fuzz.c messages/request_check.c messages/ops.c \
	messages/kvp_job.c $(REQUEST_FUZZ_GEN)
REQUEST_FUZZ_CONTRACT := build/fuzz-gen/kvpool_status.h build/fuzz-gen/kvpool_stats.h
REQUEST_FUZZ_HDR := messages/request_check.h messages/ops.h messages/kvp_job.h \
	protocol/contract.h $(REQUEST_FUZZ_CONTRACT)

$(REQUEST_FUZZ_GEN): protocol/kvpool.proto
	@mkdir -p build/fuzz-gen
	protoc-c --c_out=build/fuzz-gen protocol/kvpool.proto

build/fuzz-gen/kvpool_%.h: protocol/kvpool.proto protocol/gen_header.awk
	@mkdir -p build/fuzz-gen
	awk -v what=$* -f protocol/gen_header.awk protocol/kvpool.proto > $@

build/bin/request-fuzz: $(REQUEST_FUZZ_SRC) $(REQUEST_FUZZ_HDR)
	@mkdir -p build/bin
	$(FUZZ_CC) $(FUZZ_FLAGS) -Ibuild/fuzz-gen -o $@ $(REQUEST_FUZZ_SRC) -lprotobuf-c -lczmq -lzmq

build/bin/lookup-fuzz: $(LOOKUP_FUZZ_SRC) $(LOOKUP_FUZZ_HDR)
	@mkdir -p build/bin
	$(FUZZ_CC) $(FUZZ_FLAGS) -o $@ $(LOOKUP_FUZZ_SRC) -lmsgpackc

RDMA_FUZZ_SRC := rdma/rdma_wire_fuzz.c rdma/rdma_wire.c rdma/rdma_regs.c
RDMA_FUZZ_HDR := rdma/rdma_wire.h rdma/rdma_regs.h

build/bin/rdma-fuzz: $(RDMA_FUZZ_SRC) $(RDMA_FUZZ_HDR)
	@mkdir -p build/bin
	$(FUZZ_CC) $(FUZZ_FLAGS) -o $@ $(RDMA_FUZZ_SRC)

build/bin/config-fuzz: $(CONFIG_FUZZ_SRC) $(CONFIG_FUZZ_HDR)
	@mkdir -p build/bin
	$(FUZZ_CC) $(FUZZ_FLAGS) -o $@ $(CONFIG_FUZZ_SRC) -lczmq -lzmq -lm -lcurl -lcjson

fuzz: $(patsubst %,build/bin/%-fuzz,$(FUZZ_TARGETS))
	@set -e; for t in $(FUZZ_TARGETS); do \
	  rm -rf build/fuzz-corpus/$$t && mkdir -p build/fuzz-corpus/$$t build/fuzz-crashes/$$t; \
	  cp tests/fuzz/$$t/* build/fuzz-corpus/$$t/; \
	  echo "fuzz: $$t for $(FUZZ_SECONDS) s"; \
	  build/bin/$$t-fuzz -max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=2048 -close_fd_mask=1 \
	    -artifact_prefix=build/fuzz-crashes/$$t/ build/fuzz-corpus/$$t; \
	done

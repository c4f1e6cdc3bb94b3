# lookup_server/fuzz.mk - the libFuzzer target of the lookup/reset admin channel's decoder.
# Included by the top-level Makefile.
#
#   make fuzz                       fuzz for FUZZ_SECONDS (default 60) on a copy of the seed
#                                   corpus in build/fuzz-corpus; crashes go to build/fuzz-crashes
#   make build/bin/lookup-fuzz      only build the target
#
# The committed seed corpus lookup_server/fuzz-corpus/ is only read: libFuzzer writes the
# inputs it finds into the first corpus directory, which is the copy. Built with clang and
# Debian's libclang-rt (libclang-rt-14-dev), always in build/ whatever SANITIZE says.

FUZZ_CC ?= clang
FUZZ_SECONDS ?= 60
FUZZ_SRC := lookup_server/lookup_request_fuzz.c lookup_server/lookup_request.c \
	lookup_server/lookup_keys.c
FUZZ_HDR := lookup_server/lookup_request.h lookup_server/lookup_keys.h \
	lookup_server/lookup_config.h

build/bin/lookup-fuzz: $(FUZZ_SRC) $(FUZZ_HDR)
	@mkdir -p build/bin
	$(FUZZ_CC) -std=gnu11 -g -O1 -fno-omit-frame-pointer -Wall -Wextra -Wno-unused-parameter \
	  -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
	  -Iinclude -I. -D_GNU_SOURCE -o $@ $(FUZZ_SRC) -lmsgpackc

fuzz: build/bin/lookup-fuzz
	rm -rf build/fuzz-corpus && mkdir -p build/fuzz-corpus build/fuzz-crashes
	cp lookup_server/fuzz-corpus/* build/fuzz-corpus/
	build/bin/lookup-fuzz -max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=2048 \
	  -artifact_prefix=build/fuzz-crashes/ build/fuzz-corpus

# agentenv — see README.md. Everything here runs as root on Debian 12.
SHELL := /bin/bash
GO ?= go
DATA_DIR ?= /var/lib/agentenv

.PHONY: setup build demo test test-short soak fuzz bench clean gen

setup:
	@scripts/setup.sh

build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags="-s -w" -o bin/envd ./cmd/envd
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags="-s -w" -o bin/codeinterp ./cmd/codeinterp
	$(GO) build -o bin/agentenv ./cmd/agentenv

# Set up, start the server, build the Debian demo template if absent,
# create a sandbox, run Python in it, print the result.
demo: setup build
	@scripts/demo.sh

# The whole test suite, including the tests that start real gVisor
# sandboxes and the official e2b SDK test (needs root and `make setup`).
test: setup build
	AGENTENV_REQUIRE_ROOT=1 $(GO) test -count=1 -timeout 30m ./...
	@scripts/test-unprivileged.sh
	@FUZZTIME=$(FUZZTIME) scripts/fuzz.sh

# The load test (TestLoad: create → exec → kill at 16 in flight, forks and
# snapshots mixed in, then a leak check) for DURATION instead of 2 minutes.
DURATION ?= 30m
soak: setup build
	AGENTENV_REQUIRE_ROOT=1 AGENTENV_SOAK_DURATION=$(DURATION) $(GO) test -count=1 -run TestLoad -timeout 0 ./internal/server/

# Every fuzz target (parsers of client input) for FUZZTIME each.
FUZZTIME ?= 10s
fuzz:
	@FUZZTIME=$(FUZZTIME) scripts/fuzz.sh

# The unprivileged test tier: the sandbox lifecycle (timeouts, races,
# crash recovery, the proxy) on the fake runtime, run as nobody; prints its
# wall time. RACE= turns the race detector off.
.PHONY: test-unprivileged
test-unprivileged:
	@scripts/test-unprivileged.sh

# Regenerate the protobuf services' Go and Connect code (api/ → internal/);
# TestGeneratedCodeIsCurrent checks it is committed as generated.
gen:
	@scripts/gen.sh

# Unit tests only (no root, no runsc).
test-short:
	$(GO) test -short ./...

# Every group but density, with fewer samples (--quick), against a server
# the bench starts and stops (--serve), so that its CPU is counted too.
bench: build
	bin/agentenv bench --serve --quick

# The rollout benchmark alone at 1, 2, 4, 8 and 16 agents, plotted into
# docs/rollout.svg; churn alone, at 1, 2, 4, 8 and 16 in flight; and the
# density group with the limits probe (DENSITY idle sandboxes per target:
# minutes, so not in `make bench`). The last two measure the server the
# environment names (AGENTENV_SERVER, AGENTENV_PROXY, AGENTENV_API_KEY).
DENSITY ?= 1000
.PHONY: bench-rollout bench-churn bench-density bench-rl
bench-rollout: build
	bin/agentenv bench --serve rollout --plot docs/rollout.svg

bench-churn: build
	bin/agentenv bench --only churn

bench-density: build
	bin/agentenv bench --only density --density-sandboxes $(DENSITY)

# E2B's runCode and SandboxFusion's run_code (beside python3 on the host and
# a sandbox per call), on a server the bench starts: it builds
# code-interpreter-v1 and the runner template first (minutes), so not in
# `make bench`.
bench-rl: build
	bin/agentenv bench --serve --only rl

clean:
	rm -rf bin

# `make gate` is the one command that says the tree is good; `.ci/run` calls it.
# Each step stops the gate with a non-zero exit when it fails; the last line is `gate: ok`.

CARGO ?= cargo

.PHONY: fuzz gate gate-fresh gate-load fmt clippy peers test runbook nix-check package-check twin skips demo bench injbench honcho synapse

# Every skip of the run is logged here (bxtest::skip, check-offline.sh, package-check.sh,
# twin.sh) and summed up before the gate's last line; one that .ci/allowed-skips does not list
# fails the gate.
export BXTEST_SKIP_LOG := $(CURDIR)/target/gate-skips.log

gate: fmt clippy test fuzz runbook nix-check package-check twin skips
	@echo "gate: ok"

fmt:
	$(CARGO) fmt --all --check

clippy: fmt
	$(CARGO) clippy --workspace --all-targets -- -D warnings

# The real peers the tests talk to (.ci/peers: fakellm, Honcho, Honcho with auth, llama-cpp-python's
# server), brought up and named in target/peers.env; a peer that cannot be brought up fails here,
# saying which.
PEERS_ENV := target/peers.env
peers:
	@mkdir -p target && rm -f $(BXTEST_SKIP_LOG)
	.ci/peers > $(PEERS_ENV).new && mv $(PEERS_ENV).new $(PEERS_ENV)

# The whole suite under a watchdog: every wait in a test has its own deadline, and this ends a
# run that hangs anyway (docs/testing.md). It builds every binary first: the end-to-end tests
# run the workspace's own daemons.
TEST_LIMIT ?= 45m
test: clippy peers
	set -a && . ./$(PEERS_ENV) && set +a && \
		$(CARGO) build --workspace --bins && \
		timeout --kill-after=60 $(TEST_LIMIT) $(CARGO) test --workspace

# The fuzz targets (fuzz/: the frame decoder and every daemon's configuration parser), each run
# for FUZZ_SECONDS from its seeds; a finding fails the gate and leaves its input in target/fuzz.
FUZZ_SECONDS ?= 20
fuzz: test
	FUZZ_SECONDS=$(FUZZ_SECONDS) fuzz/run

# What skipped in this run, and whether .ci/allowed-skips lists it (the gate's last step).
skips:
	.ci/skips $(BXTEST_SKIP_LOG)

# The Honcho tests (crates/honcho, memoryd's Honcho store) need a real Honcho server named by
# HONCHO_URL (and one with its auth on, HONCHO_AUTH_URL with HONCHO_AUTH_TOKEN_FILE, for the
# bearer token's), and say `skipped:` without (a failure under CI=true, where .ci/run brings them
# up). `make honcho` brings both up on loopback (root, apt; ../shared/peers or $BOXMAKER_PEERS)
# and prints the lines to paste before `make gate` (docs/testing.md).
HONCHO_AUTH_STATE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/honcho-peer-auth
honcho:
	@url=$$(.ci/honcho-up) && echo "export HONCHO_URL=$$url HONCHO_DB=postgresql://postgres@127.0.0.1:$${HONCHO_PG_PORT:-55432}/honcho"
	@url=$$(HONCHO_AUTH_STATE=$(HONCHO_AUTH_STATE) .ci/honcho-up --auth) && \
		echo "export HONCHO_AUTH_URL=$$url HONCHO_AUTH_TOKEN_FILE=$(HONCHO_AUTH_STATE)/admin.jwt"

# The Matrix channel's tests (tests/matrix.rs) need a real Synapse named by SYNAPSE_URL (with
# SYNAPSE_SHARED_SECRET, SYNAPSE_REGISTER and SYNAPSE_VENV), and say `skipped:` without (a
# failure under CI=true, where .ci/run brings it up). `make synapse` brings it up on loopback
# (matrix-synapse from PyPI into target/synapse-venv) and prints the lines to paste before
# `make gate` (docs/testing.md).
synapse:
	@.ci/synapse-up

# Every runbook pointer in the source has its entry, and every entry is pointed at.
runbook: test
	$(CARGO) test -q -p bxcore --test runbook -- --nocapture the_runbook_and_the_source_agree

# The Nix checks that run offline (nix.md): parse every .nix file, render every unit from
# nixos-module/units.nix, systemd-analyze verify and security on each, the design's
# hardening lines, and the check's own test; `skipped: <why>` for what cannot run here.
nix-check: runbook
	nixos-module/check-offline.sh

# The package built as Nix builds it (nix/package-check.sh): nix/package.nix's attributes read by
# evaluating it, its source copied as its file set declares it, and buildRustPackage's build,
# check and install phases run as a user made for the run, without network, with
# HOME=/homeless-shelter; then the installed programs' --version. Its own target directory
# (target/package-check) is kept between runs. It says `skipped: <why>` without root (a failure
# under CI=true). Runs after nix-check in the gate.
package-check: nix-check
	nix/package-check.sh

# The device twin (nixos-module/twin.sh): the module's units, tmpfiles.d and sysusers.d under a
# real systemd in systemd-nspawn, with the package package-check built and installed; the device
# check inside it, the owner's first boot, the units' egress rules, kills, socket activation, a
# refused configuration that fails the switch, two chat turns; ends `twin: ok`. It says
# `skipped: <why>` where systemd-nspawn cannot run (a failure under CI=true). Runs after
# package-check in the gate, whose install it boots, with the peers' Synapse (target/peers.env)
# for its Matrix channel.
twin: package-check
	if [ -f $(PEERS_ENV) ]; then set -a && . ./$(PEERS_ENV) && set +a; fi && nixos-module/twin.sh

# The gate as CI runs it on a fresh machine: first remove what earlier runs left behind (the dev
# box users, venvs under target/, old temporary homes), then `.ci/run` with CI=true, where a
# skip not listed in .ci/allowed-skips fails. Developers run it, and gate-load, before submitting.
gate-fresh:
	.ci/fresh
	CI=true .ci/run

# The test suite with two bounded CPU hogs beside it, which .ci/load stops itself.
gate-load: peers
	$(CARGO) build --workspace --all-targets
	set -a && . ./$(PEERS_ENV) && set +a && .ci/load $(CARGO) test --workspace

# The dev box demo: build every binary, then one scripted conversation that shows the broker at
# work on a temporary home (docs/devbox.md).
demo:
	$(CARGO) build --release --workspace --bins
	target/release/bxctl demo

# The benchmarks (docs/performance.md): release binaries, then each benchmark prints its table.
bench:
	$(CARGO) build --release --workspace --bins
	$(CARGO) bench --workspace

# AgentDojo's four suites (949 pairs, three owner models) through the real box, each suite on a
# dev box of its own with the release daemons (bench/injbench/run.py, docs/injection.md). Prints
# the table and writes target/injbench/result.json. INJBENCH_ARGS="--sample 5" runs fewer.
INJBENCH_ARGS ?=
injbench:
	$(CARGO) build --release --workspace --bins
	py="$$(bench/injbench/venv)" && "$$py" bench/injbench/run.py --bxctl target/release/bxctl $(INJBENCH_ARGS)

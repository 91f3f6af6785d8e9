# `make gate` is the one command that says the tree is good; `.ci/run` calls it.
# Each step stops the gate with a non-zero exit when it fails; the last line is `gate: ok`.

CARGO ?= cargo

.PHONY: gate fmt clippy test runbook nix-check demo bench

gate: fmt clippy test runbook nix-check
	@echo "gate: ok"

fmt:
	$(CARGO) fmt --all --check

clippy: fmt
	$(CARGO) clippy --workspace --all-targets -- -D warnings

test: clippy
	$(CARGO) test --workspace

# Every runbook pointer in the source has its entry, and every entry is pointed at.
runbook: test
	$(CARGO) test -q -p bxcore --test runbook -- --nocapture the_runbook_and_the_source_agree

# The Nix checks that run offline (nix.md): parse every .nix file, render every unit from
# nixos-module/units.nix, systemd-analyze verify and security on each, the design's
# hardening lines, and the check's own test; `skipped: <why>` for what cannot run here.
nix-check: runbook
	nixos-module/check-offline.sh

# The dev box demo: build every binary, then one scripted conversation that shows the broker at
# work on a temporary home (docs/devbox.md).
demo:
	$(CARGO) build --release --workspace --bins
	target/release/bxctl demo

# The benchmarks (docs/performance.md): release binaries, then each benchmark prints its table.
bench:
	$(CARGO) build --release --workspace --bins
	$(CARGO) bench --workspace

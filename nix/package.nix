# The whole workspace in one build: every daemon and bxctl, with `cargo test` in the
# check phase (tests that need root, a Python peer or systemd-socket-activate print a
# `skipped:` line there). The flake's per-daemon packages pick single binaries out of it,
# so the dependencies compile once.
#
# `make package-check` (nix/package-check.sh, in the gate) builds this derivation here as Nix
# builds it: the attributes below, read by evaluating this file (nix/package-attrs.nix), the
# source copied as the file set declares it, the hooks' phases as an unprivileged user
# without network and with HOME=/homeless-shelter.
{
  lib,
  stdenv,
  rustPlatform,
  installShellFiles,
}:
let
  workspace = lib.importTOML ../Cargo.toml;
  # The environment every cargo build of the repository has (.cargo/config.toml's [env]:
  # SQLite's compile-time options for memoryd; docs/performance.md), read from the one file,
  # so the device builds the same program the gate tests.
  cargoEnv = (lib.importTOML ../.cargo/config.toml).env;
in
rustPlatform.buildRustPackage (
  cargoEnv
  // {
    pname = "boxmaker";
    inherit (workspace.workspace.package) version;

    src = lib.fileset.toSource {
      root = ../.;
      fileset = lib.fileset.unions [
        ../Cargo.toml
        ../Cargo.lock
        ../crates
        # What the check phase's tests read besides the crates: the runbook (every pointer has
        # its entry), the architecture's socket table and the protocol's examples (bxcore's
        # layout and messages tests), the module's files (layout.json, the runbook pointers in
        # its scripts), the skips CI accepts (bxtest), and the end-to-end tests' crate, which
        # the workspace lists. Editing any other doc rebuilds nothing.
        ../docs/runbook.md
        ../docs/architecture.md
        ../docs/protocol.md
        ../nixos-module
        ../.ci/allowed-skips
        ../tests
      ];
    };

    # No vendor hash to keep in step: the lock file pins every crate and its checksum.
    cargoLock.lockFile = ../Cargo.lock;

    # Shell completions and the man page, generated from bxctl's own command line.
    nativeBuildInputs = [ installShellFiles ];

    # The device's bxctl has no dev box and no demo (bxctl's `devbox` feature, on by default for
    # development). The end-to-end tests need them, and a check phase that built them would
    # rebuild bxctl with the feature over the binary about to be installed: they are left out
    # here and run by the gate (`make gate`).
    buildNoDefaultFeatures = true;
    cargoBuildFlags = [
      "--workspace"
      "--exclude"
      "boxmaker-e2e"
    ];
    cargoTestFlags = [
      "--workspace"
      "--exclude"
      "boxmaker-e2e"
    ];
    # The tests are built with the dev profile, not the release profile the binaries are
    # (buildRustPackage's default checkType is the buildType): the release profile links every
    # one of some ninety test programs with whole-program LTO in one codegen unit, which takes
    # tens of minutes on two cores for no test that release code would change; the dev
    # profile adds overflow checks and debug assertions besides.
    checkType = "debug";

    # bxctl's completions and man page come from running it, which a cross build cannot.
    postInstall =
      lib.optionalString (stdenv.buildPlatform.canExecute stdenv.hostPlatform) ''
        installShellCompletion --cmd bxctl \
          --bash <($out/bin/bxctl completions bash) \
          --zsh <($out/bin/bxctl completions zsh) \
          --fish <($out/bin/bxctl completions fish)
        $out/bin/bxctl man > bxctl.1
        installManPage bxctl.1
      ''
      + ''
        # Every runbook pointer a daemon logs names docs/runbook.md: ship it beside them.
        install -Dm0644 docs/runbook.md $out/share/doc/boxmaker/runbook.md
        # The script provider's default script: the module's inferproxy.toml names it when the
        # owner sets no provider (the same file inferproxy::script::DEFAULT is built from).
        install -Dm0644 crates/inferproxy/scripts/default.toml \
          $out/share/boxmaker/inferproxy-default-script.toml
      '';

    meta = {
      description = "A hardened, on-device personal AI agent: sandboxed daemons behind one broker";
      license = lib.licenses.asl20;
      platforms = lib.platforms.linux;
      maintainers = import ./maintainers.nix;
      mainProgram = "bxctl";
    };
  }
)

# The whole workspace in one build: every daemon and bxctl, with `cargo test` in the
# check phase (tests that need root, a Python peer or systemd-socket-activate print a
# `skipped:` line there). The flake's per-daemon packages pick single binaries out of it,
# so the dependencies compile once.
{
  lib,
  rustPlatform,
  installShellFiles,
}:
let
  workspace = lib.importTOML ../Cargo.toml;
  # The environment every cargo build of the repository has (SQLite's compile-time options for
  # memoryd; docs/performance.md): read from the one file, so the device builds the same.
  cargoEnv = (lib.importTOML ../.cargo/config.toml).env;
in
rustPlatform.buildRustPackage {
  pname = "boxmaker";
  inherit (workspace.workspace.package) version;

  src = lib.fileset.toSource {
    root = ../.;
    fileset = lib.fileset.unions [
      ../Cargo.toml
      ../Cargo.lock
      ../crates
      # The runbook test reads docs/runbook.md and the module's files for pointers; the
      # end-to-end tests live in tests/. No other doc: editing one rebuilds nothing.
      ../docs/runbook.md
      ../nixos-module
      ../tests
    ];
  };

  inherit (cargoEnv) LIBSQLITE3_FLAGS;

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

  postInstall = ''
    installShellCompletion --cmd bxctl \
      --bash <($out/bin/bxctl completions bash) \
      --zsh <($out/bin/bxctl completions zsh) \
      --fish <($out/bin/bxctl completions fish)
    $out/bin/bxctl man > bxctl.1
    installManPage bxctl.1
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
    mainProgram = "bxctl";
  };
}

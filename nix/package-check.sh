#!/usr/bin/env bash
# The package built here as Nix builds it (`make package-check`, part of `make gate`):
#
#   1. nix/package.nix's attributes, by evaluating it with builtins only (nix/package-attrs.nix,
#      a stand-in for the nixpkgs names it uses): the source's file set, the features, flags,
#      build and check types, the environment (.cargo/config.toml's [env]) and postInstall;
#   2. the source copied into a fresh directory exactly as that file set declares it: the
#      tracked files under its paths (a flake's source is the git tree's; an untracked file is
#      left out, and said so), nothing else;
#   3. its Cargo.lock's crates vendored beside it (`cargo vendor`, as importCargoLock does from
#      the lock), and the source's .cargo/config.toml written as cargoSetupHook writes it;
#   4. the build, check and install phases of buildRustPackage's hooks (nix/package-phases.sh)
#      run as a user made for this run and removed after it (as a nixbld user), in a network
#      namespace with only loopback and a PID namespace (as Nix's sandbox), with a fresh /tmp,
#      HOME=/homeless-shelter,
#      TMPDIR the build directory, the stdenv's tools on PATH and no others (no python3, no
#      systemd-socket-activate, no nix: the check-phase tests that need them skip, as in Nix);
#   5. the installed bxctl's and every daemon's `--version`, run the same way.
#
# What it installed stays in target/package-check/out, owned by root once the run is over: the
# device twin (nixos-module/twin.sh) installs that, so the twin runs the programs Nix would.
#
# A check-phase test that reads a file outside the source set, needs root or the network and
# does not skip, or a postInstall step that fails, fails this check, as it fails `nix build`.
# What stays unlike Nix: the toolchain is this machine's (rustup's rustc and cargo, Debian's C
# compiler) rather than the pinned nixpkgs', and the host's /usr and /etc stay visible.
#
# The target directory (target/package-check/target) and the vendored crates are kept between
# runs, so a second run rebuilds only what changed. Needs root, cargo, nix-instantiate, jq,
# unshare, setpriv, ip, useradd and dpkg (the stdenv's tools are taken from Debian's packages);
# without one it says `skipped: <why>` (a failure under CI=true unless .ci/allowed-skips lists
# it). Usage: nix/package-check.sh
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
work="$repo/target/package-check"

say() { echo "package-check: $*"; }
fail() {
  echo "package-check: FAILED: $*" >&2
  exit 1
}
skip() {
  echo "skipped: package-check: $*"
  # The gate lists every skip before its last line (Makefile, BXTEST_SKIP_LOG).
  if [[ -n "${BXTEST_SKIP_LOG:-}" ]]; then printf 'package-check: %s\n' "$*" >>"$BXTEST_SKIP_LOG"; fi
  if [[ "${CI:-}" == true || "${CI:-}" == 1 ]]; then
    local line
    while IFS= read -r line; do
      line="${line#"${line%%[![:space:]]*}"}"
      [[ -z "$line" || "$line" == \#* ]] && continue
      [[ "package-check: $*" == "$line"* ]] && exit 0
    done <"$repo/.ci/allowed-skips"
    fail "skipped on CI: $*; CI must provide it (.ci/run), or the reason goes into .ci/allowed-skips with why"
  fi
  exit 0
}
have() { command -v "$1" >/dev/null 2>&1; }

[[ "$(id -u)" == 0 ]] || skip "needs root (it makes the build user and the network namespace)"
for tool in cargo rustc nix-instantiate jq unshare setpriv ip useradd userdel dpkg; do
  have "$tool" || skip "$tool is not installed (.ci/run installs it)"
done

started=$SECONDS
nixeval() { nix-instantiate --option build-users-group '' --eval --strict --json "$@"; }

# --- 1. the derivation's attributes -------------------------------------------------------
mkdir -p "$work"
attrs="$work/attrs.json"
nixeval "$here/package-attrs.nix" --arg canExecute true >"$attrs" 2>"$work/attrs.err" ||
  fail "evaluating nix/package.nix (nix/package-attrs.nix): $(cat "$work/attrs.err")"
[[ "$(jq -r .src.root "$attrs")" == . ]] || fail "nix/package.nix's source root is not the repository"
mapfile -t paths < <(jq -r '.src.paths[]' "$attrs")
say "nix/package.nix: source ${paths[*]}; $(jq -r '"build \(.buildType), check \(.checkType), no default features: \(.buildNoDefaultFeatures)"' "$attrs")"

# The variables every cargo build of the repository has (.cargo/config.toml's [env]) are the
# derivation's too, or the device would build another program than the gate tests.
cargo_env="$(nixeval -E "(builtins.fromTOML (builtins.readFile $repo/.cargo/config.toml)).env or { }")"
missing="$(jq -r -n --argjson cfg "$cargo_env" --slurpfile a "$attrs" \
  '[$cfg | to_entries[] | select(.value != ($a[0].env[.key] // null)) | .key] | join(" ")')"
[[ -z "$missing" ]] || fail "nix/package.nix does not pass .cargo/config.toml's [env] ${missing} as it is"

# --- 2. the source, as the flake copies it --------------------------------------------------
top="$work/build"     # NIX_BUILD_TOP
src="$top/source"
# $out: what the install phase installs, kept after the run (the twin installs it: twin.sh).
out="$work/out"
rm -rf "$top" "$out"
mkdir -p "$src" "$top/tmp"
if have git && git -C "$repo" rev-parse --git-dir >/dev/null 2>&1; then
  # Tracked files as they are in the working tree: what Nix copies from a (dirty) git flake.
  (cd "$repo" && git ls-files -z --cached -- "${paths[@]}" |
    while IFS= read -r -d '' f; do [[ -e "$f" ]] && printf '%s\0' "$f"; done |
    xargs -0 -r cp --parents --preserve=mode,timestamps -t "$src")
  untracked="$(cd "$repo" && git ls-files --others --exclude-standard -- "${paths[@]}" | tr '\n' ' ')"
  [[ -z "$untracked" ]] || say "left out, as the flake leaves out files git does not track: $untracked"
else
  (cd "$repo" && cp -a --parents -t "$src" "${paths[@]}")
fi
for p in "${paths[@]}"; do
  [[ -e "$src/$p" ]] || fail "nix/package.nix's source names $p, which is not in the repository (lib.fileset.toSource would refuse it)"
done
say "copied $(find "$src" -type f | wc -l) files into a fresh $src"

# --- 3. the crates of Cargo.lock, vendored (cargoDeps), and cargoSetupHook's config ---------
vendor="$work/vendor"
if ! cmp -s "$vendor/Cargo.lock" "$src/Cargo.lock"; then
  say "vendoring the crates of Cargo.lock into $vendor"
  rm -rf "$vendor.new"
  (cd "$src" && cargo vendor --locked --versioned-dirs "$vendor.new" >"$work/vendor.log" 2>&1) ||
    fail "cargo vendor: the crates of Cargo.lock could not be vendored: $(tail -n 5 "$work/vendor.log")"
  cp "$src/Cargo.lock" "$vendor.new/Cargo.lock"
  rm -rf "$vendor"
  mv "$vendor.new" "$vendor"
  chmod -R a+rX "$vendor"
fi
# cargoSetupPostPatchHook: the source's lock and the vendored one agree.
cmp -s "$src/Cargo.lock" "$vendor/Cargo.lock" || fail "Cargo.lock differs from the vendored crates' lock"
triple="$(rustc -vV | sed -n 's/^host: //p')"
mkdir -p "$src/.cargo"
cat >>"$src/.cargo/config.toml" <<EOF
[source.crates-io]
replace-with = "vendored-sources"

[source.vendored-sources]
directory = "$vendor"

[target."$triple"]
"linker" = "cc"
"rustflags" = [ "-C", "target-feature=-crt-static" ]
EOF

# --- 4. the phases, as an unprivileged user without network ----------------------------------
# The stdenv's tools (coreutils, findutils, diffutils, sed, grep, awk, tar and the compressors,
# make, patch, bash, the C toolchain), the Rust toolchain, and nothing else.
tools="$top/tools"
mkdir -p "$tools"
for pkg in coreutils findutils diffutils sed grep gawk tar gzip bzip2 xz-utils make patch bash; do
  dpkg -L "$pkg" 2>/dev/null | grep -E '^/(usr/)?s?bin/[^/]+$' || true
done | while read -r exe; do
  [[ -x "$exe" && ! -e "$tools/$(basename "$exe")" ]] && ln -s "$exe" "$tools/$(basename "$exe")"
done
for exe in sh cc gcc c++ g++ cpp ar as ld nm objcopy objdump ranlib readelf strip file patchelf; do
  if have "$exe" && [[ ! -e "$tools/$exe" ]]; then ln -s "$(command -v "$exe")" "$tools/$exe"; fi
done
# The toolchain lives under root's home, which the build user cannot pass: bind-mounted
# inside the namespace at a path of its own.
sysroot="$(rustc --print sysroot)"
toolchain="$top/toolchain"
mkdir -p "$toolchain"

{
  jq -r '
    def arr(n): "\(n)=(" + ([.[n][] | @sh] | join(" ")) + ")";
    def flag(n): "\(n)=" + (if .[n] then "1" else "" end | @sh);
    arr("cargoBuildFlags"), arr("cargoTestFlags"), arr("checkFlags"),
    arr("buildFeatures"), arr("checkFeatures"),
    flag("buildNoDefaultFeatures"), flag("checkNoDefaultFeatures"), flag("doCheck"),
    "buildType=\(.buildType | @sh)", "checkType=\(.checkType | @sh)",
    "postInstall=\(.postInstall | @sh)",
    (.env | to_entries[] | "export \(.key)=\(.value | @sh)")
  ' "$attrs"
  printf 'triple=%q\nout=%q\n' "$triple" "$out"
} >"$top/attrs.sh"
cp "$here/package-phases.sh" "$top/phases.sh"

target="$work/target"
mkdir -p "$target"
user="bxpkg$$"
cleanup() {
  if id "$user" >/dev/null 2>&1; then
    userdel "$user" >/dev/null 2>&1 || true
    getent group "$user" >/dev/null && groupdel "$user" >/dev/null 2>&1 || true
  fi
}
trap cleanup EXIT
useradd --system --user-group --no-create-home --home-dir /homeless-shelter \
  --shell /usr/sbin/nologin "$user" || fail "useradd $user"
[[ ! -e /homeless-shelter ]] || fail "/homeless-shelter exists on this machine: Nix's HOME must not"
uid="$(id -u "$user")"
gid="$(id -g "$user")"
mkdir -p "$out"
chown -R "$uid:$gid" "$top" "$target" "$out"

# as_builder CMD...: CMD as the build user in a network namespace with only loopback, a PID
# namespace whose first process (the builder, as in Nix's sandbox) reaps what is left to it, a
# mount namespace with its own /proc, a fresh /tmp and the toolchain, and the environment Nix
# gives a builder.
as_builder() {
  local env=(
    HOME=/homeless-shelter
    PATH="$toolchain/bin:$tools"
    NIX_BUILD_TOP="$top" NIX_BUILD_CORES="$(nproc)" NIX_STORE=/nix/store
    TMPDIR="$top/tmp" TEMPDIR="$top/tmp" TMP="$top/tmp" TEMP="$top/tmp"
    SOURCE_DATE_EPOCH=315532800 PKG_CONFIG_ALLOW_CROSS=0 RUST_LOG=
    CC=cc CXX=c++ CARGO_TARGET_DIR="$target" TERM="${TERM:-dumb}"
  )
  unshare --net --mount --pid --fork --mount-proc -- bash -c '
    set -e
    ip link set lo up
    mount -t tmpfs -o mode=1777 tmpfs /tmp
    mount --bind -o ro "$1" "$2"
    shift 2
    exec "$@"' bash "$sysroot" "$toolchain" \
    setpriv --reuid="$uid" --regid="$gid" --clear-groups --inh-caps=-all --no-new-privs \
    env -i "${env[@]}" "$@"
}

say "building as $user (uid $uid) without network: build, check and install phases"
log="$work/phases.log"
if ! as_builder bash --noprofile --norc "$top/phases.sh" "$top/attrs.sh" >"$log" 2>&1; then
  grep -E '^(package-check:|test result:|---- |failures:|error|thread .* panicked|  [a-z_:]+$)' "$log" | tail -n 60 >&2 || true
  fail "the package does not build, check and install as Nix builds it; the whole log: $log"
fi
grep -E '^package-check: (Executing|cargo|[a-z]+ phase: [0-9]+ s)' "$log" || true
passed="$(grep -Eo 'test result: ok\. [0-9]+ passed' "$log" | awk '{s += $4} END {print s + 0}')"
skips="$(grep -c 'skipped: ' "$log" || true)"
say "tests: $passed passed; $skips skip lines, each saying why (grep 'skipped: ' $log)"

# --- 5. the installed programs ------------------------------------------------------------
version="$(jq -r .version "$attrs")"
mapfile -t programs < <(nixeval -E "(import $repo/nixos-module/units.nix).daemonNames ++ [ \"bxctl\" ]" | jq -r '.[]')
for p in "${programs[@]}"; do
  [[ -x "$out/bin/$p" ]] || fail "the package installs no bin/$p"
  # The answer is stdout's; stderr holds the daemon's log (a descriptor it closed, say), kept
  # for the failure's text.
  said="$(as_builder "$out/bin/$p" --version 2>"$work/version.err")" ||
    fail "$p --version as installed: $said $(cat "$work/version.err")"
  [[ "$said" == "$p $version" ]] ||
    fail "$p --version said '$said', not '$p $version' (stderr: $(cat "$work/version.err"))"
done
for f in share/doc/boxmaker/runbook.md share/boxmaker/inferproxy-default-script.toml \
  share/man/man1/bxctl.1 share/bash-completion/completions/bxctl.bash; do
  [[ -s "$out/$f" ]] || fail "the package installs no $f"
done
say "installed: ${programs[*]} each answer --version with $version; the runbook, the default script, the man page and completions are in place"
chown -R root:root "$out"
say "ok ($((SECONDS - started)) s)"

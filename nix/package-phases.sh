# The build, check and install phases of nix/package.nix, as rustPlatform.buildRustPackage's
# hooks run them (nixpkgs' pkgs/build-support/rust/hooks: cargoBuildHook, cargoCheckHook,
# cargoInstallPostBuildHook and cargoInstallHook; the installShellFiles functions postInstall
# calls). nix/package-check.sh runs this as an unprivileged user without network, with the
# derivation's attributes (nix/package-attrs.nix) in the file named by $1, in the source's copy.
#
# Where it differs from the hooks, and why:
#   - the target directory is $CARGO_TARGET_DIR (kept between runs under target/) instead of
#     the source's target/, and the install step copies only its top level (the hook copies
#     the whole release directory to <dir>-tmp first, then takes the same files from its top);
#   - cargo-auditable's wrapper (which only embeds the dependency list) is not here.
# shellcheck shell=bash disable=SC2154 # the variables come from the attributes' file
set -euo pipefail
# shellcheck source=/dev/null
source "$1"

cd "$NIX_BUILD_TOP/source"
step() { echo "package-check: $*"; }

# --- buildPhase: cargoBuildHook ----------------------------------------------------------
started=$SECONDS
step "Executing cargoBuildHook"
# Let stdenv handle stripping (the hook's own words): cargo's strip is off for the build type.
export "CARGO_PROFILE_${buildType^^}_STRIP"=false
flags=(-j "$NIX_BUILD_CORES" --target "$triple" --offline)
if [[ "$buildType" != debug ]]; then flags+=(--profile "$buildType"); fi
if [[ -n "$buildNoDefaultFeatures" ]]; then flags+=(--no-default-features); fi
if ((${#buildFeatures[@]})); then flags+=("--features=$(IFS=,; echo "${buildFeatures[*]}")"); fi
flags+=("${cargoBuildFlags[@]}")
step "cargoBuildHook flags: ${flags[*]}"
cargo build "${flags[@]}"

# postBuild: cargoInstallPostBuildHook, the executables at the top of the release directory.
releaseDir="$CARGO_TARGET_DIR/$triple/$buildType"
tmpDir="$releaseDir-tmp"
rm -rf "$tmpDir"
mkdir -p "$tmpDir"
find "$releaseDir" -maxdepth 1 -type f -exec cp -t "$tmpDir/" {} +
bins="$(find "$tmpDir" -maxdepth 1 -type f -executable ! \( -regex ".*\.\(so.[0-9.]+\|so\|a\|dylib\)" \))"

step "build phase: $((SECONDS - started)) s"

# --- checkPhase: cargoCheckHook ----------------------------------------------------------
started=$SECONDS
if [[ -n "$doCheck" ]]; then
  step "Executing cargoCheckHook"
  threads="$NIX_BUILD_CORES"
  args=()
  if [[ "$checkType" != debug ]]; then args+=(--profile "$checkType"); fi
  if [[ -n "$checkNoDefaultFeatures" ]]; then args+=(--no-default-features); fi
  if ((${#checkFeatures[@]})); then args+=("--features=$(IFS=,; echo "${checkFeatures[*]}")"); fi
  args+=(--target "$triple" --frozen "${cargoTestFlags[@]}")
  step "cargo test -j $NIX_BUILD_CORES ${args[*]} -- --test-threads=$threads ${checkFlags[*]}"
  cargo test -j "$NIX_BUILD_CORES" "${args[@]}" -- --test-threads="$threads" "${checkFlags[@]}"
fi

step "check phase: $((SECONDS - started)) s"

# --- installPhase: cargoInstallHook, then postInstall --------------------------------------
started=$SECONDS
step "Executing cargoInstallHook"
mkdir -p "$out/bin" "$out/lib"
xargs -r cp -t "$out/bin" <<<"$bins"
find "$tmpDir" -maxdepth 1 -regex ".*\.\(so.[0-9.]+\|so\|a\|dylib\)" -print0 | xargs -r -0 cp -t "$out/lib"
rmdir --ignore-fail-on-non-empty "$out/lib" "$out/bin"

# installShellFiles' two functions postInstall calls, with the places they install to. Each
# refuses an empty file, which the real ones would install without a word.
installShellCompletion() {
  local cmd="" shell file
  if [[ "${1:-}" == --cmd ]]; then
    cmd="$2"
    shift 2
  fi
  while (($#)); do
    shell="${1#--}"
    file="$2"
    shift 2
    local content
    content="$(cat "$file")"
    [[ -n "$content" ]] || { echo "installShellCompletion: $shell completion for $cmd is empty" >&2; return 1; }
    case "$shell" in
      bash) install -Dm0644 /dev/stdin "$out/share/bash-completion/completions/$cmd.bash" <<<"$content" ;;
      zsh) install -Dm0644 /dev/stdin "$out/share/zsh/site-functions/_$cmd" <<<"$content" ;;
      fish) install -Dm0644 /dev/stdin "$out/share/fish/vendor_completions.d/$cmd.fish" <<<"$content" ;;
      *) echo "installShellCompletion: unknown shell $shell" >&2; return 1 ;;
    esac
  done
}
installManPage() {
  local page section
  for page in "$@"; do
    [[ -s "$page" ]] || { echo "installManPage: $page is empty" >&2; return 1; }
    section="${page##*.}"
    install -Dm0644 "$page" "$out/share/man/man$section/$(basename "$page")"
  done
}

step "Executing postInstall"
eval "$postInstall"
step "installed into $out: $(cd "$out" && find . -type f | sort | tr '\n' ' ')"
step "install phase: $((SECONDS - started)) s"

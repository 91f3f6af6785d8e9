# validate-config.sh DAEMON FILE: run `DAEMON check --config` on FILE, a daemon's configuration
# as nixos-module/validation.nix prepares it, in a build's sandbox: the derivation of each
# generated configuration runs it (default.nix, `validated`), so a configuration the daemon
# refuses fails `nixos-rebuild build` (and `switch`) before anything is installed, as nginx's
# module runs `nginx -t`. tests/nix_configs.rs runs it on the module's configurations too.
#
# From the environment: fakeDirs, fakeFiles (device paths, one a line, made under a stand-in
# root that replaces FILE's @device@) and fakeCredentials (credential names, one a line, made
# in a stand-in $CREDENTIALS_DIRECTORY); DAEMON is found on PATH.
# shellcheck shell=bash
set -euo pipefail
daemon="$1"
file="$2"
work="$(mktemp -d "${TMPDIR:-/tmp}/boxmaker-validate.XXXXXX")"
root="$work/device"
creds="$work/credentials"
mkdir -p "$root" "$creds"
chmod 0700 "$creds"
while IFS= read -r d; do
  [[ -n "$d" ]] && mkdir -p "$root$d"
done <<<"${fakeDirs:-}"
while IFS= read -r f; do
  if [[ -n "$f" ]]; then
    mkdir -p "$(dirname "$root$f")"
    printf 'placeholder-for-the-build-time-check\n' >"$root$f"
    chmod 0600 "$root$f"
  fi
done <<<"${fakeFiles:-}"
while IFS= read -r c; do
  if [[ -n "$c" ]]; then
    printf 'placeholder-for-the-build-time-check\n' >"$creds/$c"
    chmod 0600 "$creds/$c"
  fi
done <<<"${fakeCredentials:-}"
sed "s|@device@|$root|g" "$file" >"$work/$daemon.toml"
if ! out="$(CREDENTIALS_DIRECTORY="$creds" "$daemon" check --config "$work/$daemon.toml" 2>&1)"; then
  printf '%s\n' "$out" >&2
  echo "boxmaker: $daemon refuses the configuration services.boxmaker.settings.$daemon makes (above): nothing is built or switched to; see docs/runbook.md#module-config-refused" >&2
  rm -rf "$work"
  exit 1
fi
printf '%s\n' "$out"
rm -rf "$work"

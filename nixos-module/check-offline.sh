#!/usr/bin/env bash
# The Nix checks that run without a network or a current Nix (nix.md, "How it is checked"):
#
#   1. `nix-instantiate --parse` on every .nix file in the repository
#   2. render every unit from units.nix with builtins only (offline.nix), in two variants,
#      with ExecStart= pointed at placeholder programs that exist, then on each unit:
#        - `systemd-analyze verify`: any output at all (an "Unknown key" included) fails
#        - `systemd-analyze security --offline=true --threshold=15` on every service
#        - the design's hardening lines, checked here against an independent list: every
#          service has each of them and none of the forbidden keys; every socket is 0600
#          in a 0700 directory that the tmpfiles rules make, owned by the socket's client
#   3. the check's own test: broken copies of the units (a misspelled key, a removed
#      hardening line, a forbidden key, a widened socket, a gutted sandbox) must each fail
#      the step meant to catch them
#   4. `nix flake metadata` / `nix flake show` with --offline where they can run
#   5. what a nixpkgs reviewer asks of the module and the package (step_conventions): the
#      units through nixpkgs' own options (after/wants/requires, startLimit*,
#      notSocketActivated, listenStreams), path types for paths and key files, the layout's
#      keys read-only, meta.maintainers, no bxctl run in postInstall when cross-compiling, a
#      source that holds every file its check-phase tests read, every configuration checked
#      by its daemon at build time, a warning for gatewayd without name servers, keys placed
#      by hand in a directory that survives a reboot, the runbook readable by the owner, no
#      polkit, no document naming an option that does not exist; each with a self-test that
#      feeds it the old form, which must fail
#
# What cannot run here prints `skipped: <why>`. Exit status 0 only if every step that ran
# passed. Usage: nixos-module/check-offline.sh [--keep DIR]
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
if [[ "${1:-}" == "--keep" && -n "${2:-}" ]]; then
  work="$2"
  trap - EXIT
  mkdir -p "$work"
fi

failures=0
fail() {
  echo "nix-check: FAILED: $*" >&2
  failures=$((failures + 1))
}
have() { command -v "$1" >/dev/null 2>&1; }
# What cannot run here. Under CI=true a skip fails the check unless its reason starts with a
# line of .ci/allowed-skips (the same rule as the tests' bxtest::skip).
skipped() {
  echo "skipped: $*"
  # The gate lists every skip before its last line (Makefile, BXTEST_SKIP_LOG).
  if [[ -n "${BXTEST_SKIP_LOG:-}" ]]; then printf '%s\n' "$*" >>"$BXTEST_SKIP_LOG"; fi
  if [[ "${CI:-}" == "true" || "${CI:-}" == "1" ]]; then
    local line
    while IFS= read -r line; do
      line="${line#"${line%%[![:space:]]*}"}"
      [[ -z "$line" || "$line" == \#* ]] && continue
      [[ "$*" == "$line"* ]] && return 0
    done <"$repo/.ci/allowed-skips"
    fail "skipped on CI: $*; CI must provide it (.ci/run), or the reason goes into .ci/allowed-skips with why"
  fi
}

# --- the design's hardening set, written out independently of units.nix -----------------
# Every .service line that must appear exactly as written.
required_service_lines=(
  "CapabilityBoundingSet="
  "AmbientCapabilities="
  "NoNewPrivileges=true"
  "ProtectSystem=strict"
  "PrivateTmp=true"
  "PrivateDevices=true"
  "ProtectProc=invisible"
  "ProcSubset=pid"
  "ProtectKernelTunables=true"
  "ProtectKernelModules=true"
  "ProtectKernelLogs=true"
  "ProtectClock=true"
  "ProtectHostname=true"
  "ProtectControlGroups=true"
  "RestrictNamespaces=true"
  "RestrictRealtime=true"
  "RestrictSUIDSGID=true"
  "LockPersonality=true"
  "MemoryDenyWriteExecute=true"
  "RemoveIPC=true"
  "PrivateIPC=true"
  "SocketBindDeny=any"
  "NoExecPaths=/"
  "ExecPaths=/nix/store"
  "DevicePolicy=closed"
  "UMask=0077"
  "SystemCallArchitectures=native"
  "SystemCallFilter=@system-service landlock_create_ruleset landlock_add_rule landlock_restrict_self seccomp"
  "SystemCallFilter=~@privileged @resources @setuid @keyring"
)
# Every .service must have a line matching each of these.
required_service_patterns=(
  '^ProtectHome=(true|read-only)$'
  '^RestrictAddressFamilies=AF_UNIX( AF_INET AF_INET6)?$'
  '^User=bx-[a-z]+$'
  '^Group=bx-[a-z]+$'
  '^ReadWritePaths=/'
  '^SyslogIdentifier=[a-z]+$'
  '^ExecStart=/'
)
# A service that serves sockets (Sockets=) must be one switch-to-configuration starts itself:
# READY=1 awaited (a refused configuration fails the start job) and not treated as
# socket-activated (which would stop it and restart only its sockets: nixpkgs'
# switch-to-configuration-ng, handle_modified_unit).
socket_service_lines=(
  "Type=notify"
  "X-NotSocketActivated=true"
)
# No unit may have a line matching any of these. PrivateUsers= breaks the peer checks
# (SO_PEERCRED reports unmapped uids as 65534); DynamicUser= gives no stable uid.
forbidden_patterns=(
  '^PrivateUsers='
  '^DynamicUser='
  '^User=root$'
  '^AmbientCapabilities=.+'
  '^CapabilityBoundingSet=.+'
)
# Every .socket must have these lines.
required_socket_lines=(
  "SocketMode=0600"
  "DirectoryMode=0700"
)
required_socket_patterns=(
  '^ListenStream=/run/boxmaker/[a-z]+-[a-z]+/[a-z]+\.sock$'
  '^SocketUser=[a-z_][a-z0-9_-]*$'
  '^FileDescriptorName=[a-z]+$'
  '^Service=boxmaker-[a-z]+\.service$'
)
# Every unit's file name: the boxmaker- prefix (generic names like loopd.service collide); the
# owner's on-demand services are templates (boxmaker-<name>@.service, one per connection).
unit_name_pattern='^boxmaker-[a-z]+@?\.(service|socket)$'
# The device check's unit, the one that runs as root (units.nix's checkHardening): its own
# lines, checked here against an independent list, instead of the daemons' sandbox.
check_unit=boxmaker-check@.service
check_unit_lines=(
  "CapabilityBoundingSet=CAP_SETUID CAP_SETGID CAP_DAC_OVERRIDE CAP_DAC_READ_SEARCH"
  "AmbientCapabilities="
  "NoNewPrivileges=true"
  "ProtectSystem=strict"
  "ProtectHome=true"
  "PrivateTmp=true"
  "PrivateDevices=true"
  "PrivateNetwork=true"
  "IPAddressDeny=any"
  "RestrictAddressFamilies=AF_UNIX"
  "SocketBindDeny=any"
  "RestrictNamespaces=true"
  "RestrictSUIDSGID=true"
  "MemoryDenyWriteExecute=true"
  "LockPersonality=true"
  "SystemCallArchitectures=native"
  "SystemCallFilter=@system-service"
  "StandardInput=null"
  "StandardOutput=socket"
)
# Every on-demand socket (Accept=yes: the owner starts one instance per connection).
ondemand_socket_lines=(
  "Accept=true"
  "MaxConnections=1"
  "SocketUser=boxowner"
)


# --- 1. parse ---------------------------------------------------------------------------
step_parse() {
  local f n=0
  while IFS= read -r -d '' f; do
    n=$((n + 1))
    if ! nix-instantiate --parse "$f" >/dev/null 2>"$work/parse.err"; then
      fail "nix-instantiate --parse $f: $(cat "$work/parse.err")"
    fi
  done < <(find "$repo" \( -name target -o -name .git -o -name result -o -name 'result-*' \) -prune -o -name '*.nix' -type f -print0)
  if [[ $n -eq 0 ]]; then
    fail "no .nix file found under $repo"
  fi
  echo "nix-check: parsed $n .nix files"
}

# --- 2. render --------------------------------------------------------------------------
# render VARIANT DIR: the unit files of VARIANT, placeholder programs and configs in DIR.
render() {
  local variant="$1" dir="$2" name d
  mkdir -p "$dir/units" "$dir/bin" "$dir/etc"
  for d in $(nix-instantiate --eval --strict --json -E "(import $here/units.nix).daemonNames ++ [ \"bxctl\" ]" | jq -r '.[]'); do
    printf '#!/bin/sh\nexit 0\n' >"$dir/bin/$d"
    chmod 0755 "$dir/bin/$d"
    : >"$dir/etc/$d.toml"
  done
  # The full variant's system prompt and the coreutils `install` loopd's unit copies it with.
  printf '#!/bin/sh\nexit 0\n' >"$dir/bin/install"
  chmod 0755 "$dir/bin/install"
  : >"$dir/etc/system.md"
  : >"$dir/etc/runbook.md"
  nix-instantiate --eval --strict --json "$here/offline.nix" \
    --argstr bindir "$dir/bin" --argstr confdir "$dir/etc" --argstr variant "$variant" \
    >"$dir/units.json"
  for name in $(jq -r 'keys[]' "$dir/units.json"); do
    jq -r --arg n "$name" '.[$n]' "$dir/units.json" >"$dir/units/$name"
  done
  nix-instantiate --eval --strict --json -E "
    (import $here/units.nix).directories {
      home = \"/var/lib/boxmaker\"; ownerUser = \"boxowner\"; ownerGroup = \"users\";
    }" | jq -r '.[] | "d \(.path) \(.mode) \(.user) \(.group) -"' >"$dir/tmpfiles.conf"
}

# --- the checks on one directory of units; each prints its failures and returns 1 -------
check_verify() {
  local dir="$1" out
  # Run from inside the directory so Service=/Sockets= references resolve to the units
  # rendered beside them. Any line of output is a warning: fail on it.
  out="$(cd "$dir/units" && systemd-analyze verify ./*.service ./*.socket 2>&1)" || true
  if [[ -n "$out" ]]; then
    echo "systemd-analyze verify: $out"
    return 1
  fi
}

check_security() {
  local dir="$1" f rc=0 out
  for f in "$dir"/units/*.service; do
    if ! out="$(systemd-analyze security --offline=true --threshold=15 "$f" 2>&1)"; then
      echo "systemd-analyze security: $(basename "$f") is over the exposure target 1.5: $(tail -n 1 <<<"$out")"
      rc=1
    fi
  done
  return $rc
}

check_lines() {
  local dir="$1" f line pat rc=0 path sockdir user
  for f in "$dir"/units/*.service; do
    if [[ "$(basename "$f")" == "$check_unit" ]]; then
      for line in "${check_unit_lines[@]}"; do
        grep -qxF -- "$line" "$f" || {
          echo "$(basename "$f"): missing line '$line'"
          rc=1
        }
      done
      if grep -qE '^(User|Group|DynamicUser|PrivateUsers|AmbientCapabilities)=.+' "$f"; then
        echo "$(basename "$f"): sets a user or capabilities beyond its own list"
        rc=1
      fi
      continue
    fi
    for line in "${required_service_lines[@]}"; do
      grep -qxF -- "$line" "$f" || {
        echo "$(basename "$f"): missing hardening line '$line'"
        rc=1
      }
    done
    for pat in "${required_service_patterns[@]}"; do
      grep -qE -- "$pat" "$f" || {
        echo "$(basename "$f"): no line matching '$pat'"
        rc=1
      }
    done
    # No IP at all unless the unit may use AF_INET: then no network namespace either.
    if ! grep -qE '^RestrictAddressFamilies=.*AF_INET' "$f"; then
      for line in "PrivateNetwork=true" "IPAddressDeny=any"; do
        grep -qxF -- "$line" "$f" || {
          echo "$(basename "$f"): uses no IP but lacks '$line'"
          rc=1
        }
      done
    fi
    if grep -q '^Sockets=' "$f"; then
      for line in "${socket_service_lines[@]}"; do
        grep -qxF -- "$line" "$f" || {
          echo "$(basename "$f"): serves sockets but lacks '$line'"
          rc=1
        }
      done
    fi
    # Everything it may write must be made by the tmpfiles rules or be a workspace root, and
    # a workspace root is optional for the namespace ("-"): a missing one must not fail the
    # unit at namespace setup with no reason (brokerd says which root and why).
    while IFS= read -r path; do
      if [[ "$path" != /var/lib/boxmaker/* && "$path" != /run/boxmaker/* && "$path" != -* ]]; then
        echo "$(basename "$f"): ReadWritePaths=$path is a workspace root without the '-' prefix"
        rc=1
        continue
      fi
      [[ "$path" == /var/lib/boxmaker/* || "$path" == /run/boxmaker/* ]] || continue
      grep -qE "^d $path 0700 " "$dir/tmpfiles.conf" || {
        echo "$(basename "$f"): ReadWritePaths=$path has no 0700 tmpfiles rule"
        rc=1
      }
    done < <(sed -n 's/^ReadWritePaths=//p' "$f")
  done
  for f in "$dir"/units/*.service "$dir"/units/*.socket; do
    [[ "$(basename "$f")" =~ $unit_name_pattern ]] || {
      echo "$(basename "$f"): unit name without the boxmaker- prefix"
      rc=1
    }
    for pat in "${forbidden_patterns[@]}"; do
      # The check's unit holds exactly its own capability line (check_unit_lines).
      if [[ "$(basename "$f")" == "$check_unit" && "$pat" == '^CapabilityBoundingSet=.+' ]]; then
        continue
      fi
      if grep -qE -- "$pat" "$f"; then
        echo "$(basename "$f"): forbidden line matching '$pat'"
        rc=1
      fi
    done
  done
  for f in "$dir"/units/*.socket; do
    for line in "${required_socket_lines[@]}"; do
      grep -qxF -- "$line" "$f" || {
        echo "$(basename "$f"): missing '$line'"
        rc=1
      }
    done
    if grep -qxF "Accept=true" "$f"; then
      # An on-demand socket: the owner's, one instance of its template at a time.
      local name template
      name="$(basename "$f" .socket)"
      template="$dir/units/$name@.service"
      for line in "${ondemand_socket_lines[@]}"; do
        grep -qxF -- "$line" "$f" || {
          echo "$(basename "$f"): an on-demand socket without '$line'"
          rc=1
        }
      done
      grep -qE "^ListenStream=/run/boxmaker/owner-[a-z]+/${name#boxmaker-}\.sock$" "$f" || {
        echo "$(basename "$f"): an on-demand socket outside /run/boxmaker/owner-*"
        rc=1
      }
      if [[ ! -f "$template" ]] || ! grep -qxF "StandardOutput=socket" "$template"; then
        echo "$(basename "$f"): no template $(basename "$template") writing its report on the connection"
        rc=1
      fi
    else
      for pat in "${required_socket_patterns[@]}"; do
        grep -qE -- "$pat" "$f" || {
          echo "$(basename "$f"): no line matching '$pat'"
          rc=1
        }
      done
    fi
    # Its directory exists before it starts, 0700, owned by the socket's client.
    sockdir="$(dirname "$(sed -n 's/^ListenStream=//p' "$f")")"
    user="$(sed -n 's/^SocketUser=//p' "$f")"
    grep -qxE "d $sockdir 0700 $user [^ ]+ -" "$dir/tmpfiles.conf" || {
      echo "$(basename "$f"): no tmpfiles rule 'd $sockdir 0700 $user'"
      rc=1
    }
  done
  return $rc
}

# check_all DIR: every check on DIR's units; prints what failed.
check_all() {
  local dir="$1" rc=0
  check_verify "$dir" || rc=1
  check_security "$dir" || rc=1
  check_lines "$dir" || rc=1
  return $rc
}

# --- 3. the check's own test ------------------------------------------------------------
# expect_caught NAME CHECK EXPECT SED FILE: apply SED to FILE in a copy of the rendered
# units; CHECK must now fail and say EXPECT.
expect_caught() {
  local name="$1" check="$2" expect="$3" script="$4" file="$5" copy out
  copy="$work/broken-$name"
  rm -rf "$copy"
  cp -a "$work/full" "$copy"
  sed -i -e "$script" "$copy/units/$file"
  if cmp -s "$work/full/units/$file" "$copy/units/$file"; then
    fail "self-test $name: the edit '$script' changed nothing in $file"
    return
  fi
  if out="$("$check" "$copy" 2>&1)"; then
    fail "self-test $name: $check passed a broken $file"
  elif ! grep -qF -- "$expect" <<<"$out"; then
    fail "self-test $name: $check failed without saying '$expect': $out"
  else
    echo "nix-check: self-test $name: caught by $check"
  fi
}

# expect_renamed_caught FROM TO: a unit renamed from FROM to TO (the old generic names) in a
# copy of the rendered units must fail check_lines.
expect_renamed_caught() {
  local copy="$work/broken-renamed" out
  rm -rf "$copy"
  cp -a "$work/full" "$copy"
  mv "$copy/units/$1" "$copy/units/$2"
  if out="$(check_lines "$copy" 2>&1)"; then
    fail "self-test unprefixed-unit-name: check_lines passed a unit named $2"
  elif ! grep -qF -- "$2: unit name without the boxmaker- prefix" <<<"$out"; then
    fail "self-test unprefixed-unit-name: check_lines failed without naming $2: $out"
  else
    echo "nix-check: self-test unprefixed-unit-name: caught by check_lines"
  fi
}

self_test() {
  expect_caught misspelled-key check_verify "Unknown key" 's/^RestartSec=/RestartSecs=/' boxmaker-brokerd.service
  expect_caught misspelled-socket-key check_verify "Unknown key" 's/^SocketMode=/SocketMod=/' boxmaker-broker.socket
  expect_caught removed-hardening-line check_lines "missing hardening line 'NoNewPrivileges=true'" '/^NoNewPrivileges=/d' boxmaker-loopd.service
  expect_caught removed-syscall-deny check_lines "missing hardening line 'SystemCallFilter=~@privileged" '/^SystemCallFilter=~/d' boxmaker-inferproxy.service
  expect_caught private-users check_lines "forbidden line matching '^PrivateUsers='" 's/^\[Service\]$/[Service]\nPrivateUsers=true/' boxmaker-brokerd.service
  expect_caught network-without-namespace check_lines "lacks 'PrivateNetwork=true'" '/^PrivateNetwork=/d' boxmaker-loopd.service
  expect_caught socket-activated-service check_lines "serves sockets but lacks 'X-NotSocketActivated=true'" '/^X-NotSocketActivated=/d' boxmaker-brokerd.service
  expect_caught simple-service check_lines "serves sockets but lacks 'Type=notify'" 's/^Type=notify$/Type=simple/' boxmaker-loopd.service
  expect_caught socket-among-state check_lines "no line matching '^ListenStream=/run/boxmaker/" 's|^ListenStream=/run/boxmaker/|ListenStream=/var/lib/boxmaker/run/|' boxmaker-broker.socket
  expect_caught unprefixed-service-name check_lines "no line matching '^Service=boxmaker-" 's/^Service=boxmaker-/Service=/' boxmaker-infer.socket
  expect_renamed_caught boxmaker-loopd.service loopd.service
  expect_caught required-workspace-root check_lines "workspace root without the '-' prefix" 's|^ReadWritePaths=-/home/|ReadWritePaths=/home/|' boxmaker-brokerd.service
  expect_caught wide-socket check_lines "missing 'SocketMode=0600'" 's/^SocketMode=0600$/SocketMode=0666/' boxmaker-admin.socket
  expect_caught ondemand-without-limit check_lines "an on-demand socket without 'MaxConnections=1'" '/^MaxConnections=/d' boxmaker-check.socket
  expect_caught ondemand-not-the-owners check_lines "an on-demand socket without 'SocketUser=boxowner'" 's/^SocketUser=.*/SocketUser=bx-loop/' boxmaker-selftest.socket
  expect_caught check-unit-with-network check_lines "missing line 'PrivateNetwork=true'" '/^PrivateNetwork=/d' boxmaker-check@.service
  expect_caught check-unit-more-capabilities check_lines "missing line 'CapabilityBoundingSet=CAP_SETUID" 's/^CapabilityBoundingSet=.*/CapabilityBoundingSet=CAP_SYS_ADMIN/' boxmaker-check@.service
  expect_caught gutted-sandbox check_security "over the exposure target" \
    '/^\(SystemCallFilter\|RestrictNamespaces\|ProtectSystem\|ProtectHome\|PrivateDevices\|CapabilityBoundingSet\|RestrictAddressFamilies\|PrivateNetwork\|IPAddressDeny\)=/d' boxmaker-loopd.service
}

# --- the module's own refusals, and the flake's shape, with builtins only ------------------
# expect_eval NAME EXPR WANT: EXPR (evaluated with --strict --json) must print WANT exactly.
expect_eval() {
  local name="$1" expr="$2" want="$3" out
  if ! out="$(nix-instantiate --eval --strict --json -E "$expr" 2>&1 | grep -v "^warning: ")"; then
    fail "$name: the expression did not evaluate: $out"
  elif [[ "$out" != "$want" ]]; then
    fail "$name: got $out, want $want"
  else
    echo "nix-check: $name: ok"
  fi
}

step_module() {
  local checks="import $here/checks.nix"
  local alice='alice = { home = "/home/alice"; homeMode = "700"; createHome = true; };'
  # The assertions default.nix makes from checks.nix: none for a good configuration, one
  # naming the cause for each broken form (the owner not declared, a root the broker cannot
  # reach), so the module's evaluation fails on them.
  expect_eval "module accepts a declared owner and a root outside the homes" \
    "$checks { owner = \"alice\"; users = { $alice }; roots = [ { path = \"/srv/boxmaker/projects\"; writable = true; } ]; }" \
    '[]'
  expect_eval "module refuses an owner who is not a declared user" \
    "map (m: builtins.match \".*owner .alice. is not an account of this configuration.*\" m != null) ($checks { owner = \"alice\"; users = { }; })" \
    '[true]'
  expect_eval "module refuses a workspace root in a 0700 home (install.md's old example)" \
    "map (m: builtins.match \".*root /home/alice/projects lies in /home/alice.*700.*\" m != null) ($checks { owner = \"alice\"; users = { $alice }; roots = [ { path = \"/home/alice/projects\"; writable = true; } ]; })" \
    '[true]'
  expect_eval "module accepts a root in a home others may pass (homeMode 711)" \
    "$checks { owner = \"alice\"; users = { alice = { home = \"/home/alice\"; homeMode = \"711\"; createHome = true; }; }; roots = [ { path = \"/home/alice/projects\"; } ]; }" \
    '[]'
  # The flake's module sets no nixpkgs.overlays (a configuration's own nixpkgs.pkgs would
  # ignore them) and defaults the package itself; the flake has a formatter. Evaluated with
  # a stand-in for nixpkgs: only the names these outputs touch.
  local stub='let
      flake = import '"$repo"'/flake.nix;
      lib = { mkDefault = v: { default = v; }; genAttrs = names: f: builtins.listToAttrs (map (n: { name = n; value = f n; }) names); };
      pkgs = { callPackage = f: args: "callPackage ${toString f}"; };
      self = flake.outputs { inherit self; nixpkgs = { inherit lib; }; };
      m = self.nixosModules.default { inherit lib pkgs; config = { }; };
    in'
  expect_eval "flake: nixosModules.default sets no nixpkgs.overlays and defaults the package" \
    "$stub { overlays = m ? nixpkgs; package = m.services.boxmaker.package.default; }" \
    '{"overlays":false,"package":"callPackage '"$repo"'/nix/package.nix"}'
  expect_eval "flake: a formatter output" "$stub builtins.elem \"formatter\" (builtins.attrNames self)" 'true'
  # The device images: mkDevice puts the module, device.nix and the system together, and the
  # flake has both configurations.
  expect_eval "flake: lib.mkDevice composes the module, device.nix and the system" \
    "let
      flake = import $repo/flake.nix;
      lib = { nixosSystem = a: a; };
      self = flake.outputs { inherit self; nixpkgs = { inherit lib; }; };
      d = self.lib.mkDevice { system = \"aarch64-linux\"; modules = [ \"mine\" ]; };
    in { n = builtins.length d.modules; device = toString (builtins.elemAt d.modules 1);
         system = (builtins.elemAt d.modules 2).nixpkgs.hostPlatform; last = builtins.elemAt d.modules 3;
         configurations = builtins.attrNames self.nixosConfigurations; }" \
    '{"configurations":["device","device-aarch64","example"],"device":"'"$here"'/device.nix","last":"mine","n":4,"system":"aarch64-linux"}'
  # device.nix with a stand-in for the NixOS module system's arguments: no password anywhere,
  # SSH by key only, the API key a provisioned file outside the store, and nothing on the
  # image's ESP under boxmaker/ but the README (no key baked in).
  expect_eval "device.nix: no password, SSH by key, no secret in the image" \
    "let
      r = import $here/device.nix {
        config = {
          services.boxmaker = { owner = \"alice\"; settings.inferproxy.provider.kind = \"openai\"; };
          system.build = { toplevel = \"/nix/store/t\"; initialRamdisk = \"/nix/store/i\"; };
          system.boot.loader = { kernelFile = \"bzImage\"; initrdFile = \"initrd\"; };
          boot = { kernelParams = [ ]; kernelPackages.kernel = \"/nix/store/k\"; };
          nix.package.out = \"/nix/store/n\";
        };
        lib = { mkDefault = v: v; mkIf = c: v: if c then v else null; toUpper = s: s; };
        pkgs = { stdenv.hostPlatform.efiArch = \"x64\"; systemd = \"/nix/store/s\";
                 writeText = n: t: \"/nix/store/\${n}\"; closureInfo = a: \"/nix/store/c\"; };
        modulesPath = \"/m\";
      };
      esp = builtins.attrNames r.image.repart.partitions.\"10-esp\".contents;
      ssh = r.services.openssh.settings;
    in {
      passwords = [ r.users.users.alice.hashedPassword (r.users.users.root.hashedPassword or \"!\") r.users.mutableUsers ];
      ssh = [ r.services.openssh.enable ssh.PasswordAuthentication ssh.KbdInteractiveAuthentication ssh.PermitRootLogin ];
      key = r.services.boxmaker.inference.apiKeyFile;
      drop = builtins.filter (p: builtins.match \"/boxmaker/.*\" p != null) esp;
      root = r.image.repart.partitions.\"20-root\".storePaths;
      # Generations on the 512 MiB ESP: a limit, and one that fits (device.nix says why).
      limit = let l = r.boot.loader.systemd-boot.configurationLimit or null; in
        l != null && l >= 1 && l <= 8 && r.image.repart.partitions.\"10-esp\".repartConfig.SizeMinBytes == \"512M\";
    }" \
    '{"drop":["/boxmaker/README.txt"],"key":"/var/lib/boxmaker-provision/secrets/api-key","limit":true,"passwords":["!","!",false],"root":["/nix/store/t"],"ssh":[true,false,false,"prohibit-password"]}'
  # default.nix's own wiring, with a stand-in for lib (offline-module.nix): the units it
  # declares carry the prefix and the switch keys, the sockets' directories are under
  # /run/boxmaker, and its assertions fire on an undeclared owner and an unreachable root.
  local om="nix-instantiate --eval --strict --json $here/offline-module.nix --argstr owner alice"
  local got
  got="$($om 2>/dev/null | jq -c '{services, sockets, switch: (.switch | map_values("\(.type) \(.notSocketActivated)")),
      run: (.tmpfiles | map(select(startswith("/run/")))), failedAssertions}')" || got="did not evaluate"
  local want='{"services":["boxmaker-brokerd","boxmaker-check@","boxmaker-gatewayd","boxmaker-inferproxy","boxmaker-loopd","boxmaker-memoryd","boxmaker-selftest@"],"sockets":["boxmaker-admin","boxmaker-bridge","boxmaker-broker","boxmaker-check","boxmaker-decide","boxmaker-gateway","boxmaker-infer","boxmaker-loop","boxmaker-memories","boxmaker-memory","boxmaker-selftest","boxmaker-state"],"switch":{"boxmaker-brokerd":"notify true","boxmaker-check@":"simple false","boxmaker-gatewayd":"notify true","boxmaker-inferproxy":"notify true","boxmaker-loopd":"notify true","boxmaker-memoryd":"notify true","boxmaker-selftest@":"simple false"},"run":["/run/boxmaker","/run/boxmaker/bridge-broker","/run/boxmaker/bridge-loop","/run/boxmaker/broker-gateway","/run/boxmaker/channel-loop","/run/boxmaker/loop-broker","/run/boxmaker/loop-infer","/run/boxmaker/loop-memory","/run/boxmaker/memory-broker","/run/boxmaker/owner-broker","/run/boxmaker/owner-channel","/run/boxmaker/owner-check","/run/boxmaker/owner-memory","/run/boxmaker/owner-selftest"],"failedAssertions":[]}'
  if [[ "$got" == "$want" ]]; then
    echo "nix-check: default.nix: units, switch keys, /run/boxmaker and no failed assertion: ok"
  else
    fail "default.nix (offline-module.nix): got $got, want $want"
  fi
  # With the Matrix channel: channeld's unit, its owner socket, its configuration, its token as
  # the credential and its IP reach the homeserver's address alone.
  local matrix='{ channels.matrix = { enable = true; homeserver = "http://127.0.0.1:8008"; user = "@box:localhost"; tokenFile = "/var/lib/boxmaker-keys/matrix-token"; owners = [ "@alice:localhost" ]; rooms = [ "!abc:localhost" ]; }; }'
  got="$($om --arg boxmaker "$matrix" 2>/dev/null | jq -S -c '{channel: (.services | index("boxmaker-channeld") != null), socket: (.sockets | index("boxmaker-channel") != null),
      channeld, matrix: .toml.channeld.matrix, failedAssertions}')" || got="did not evaluate"
  want='{"channel":true,"channeld":{"IPAddressAllow":["127.0.0.1","localhost"],"LoadCredential":["matrix_token:/var/lib/boxmaker-keys/matrix-token"],"User":"bx-channel"},"failedAssertions":[],"matrix":{"homeserver":"http://127.0.0.1:8008","owners":["@alice:localhost"],"rooms":["!abc:localhost"],"user":"@box:localhost"},"socket":true}'
  if [[ "$got" == "$want" ]]; then
    echo "nix-check: default.nix: channels.matrix gives channeld its unit, socket, config, credential and IP reach: ok"
  else
    fail "default.nix with channels.matrix: got $got, want $want"
  fi
  # channeld's configuration is checked at build time as every daemon's: its token the
  # credential stood in for, an https homeserver checked against the store's CA bundle (the
  # build's sandbox has no /etc/ssl, and channeld check refuses https without a bundle).
  local https='{ channels.matrix = { enable = true; homeserver = "https://matrix.example.org"; user = "@box:example.org"; tokenFile = "/var/lib/boxmaker-keys/matrix-token"; rooms = [ "!abc:example.org" ]; }; }'
  got="$($om --arg boxmaker "$https" 2>/dev/null | jq -S -c '{validated: .validated.channeld, ca: .checked.channeld.tls.ca_file, written: (.toml.channeld | has("tls")),
      credentials: .standIns.channeld.fakeCredentials, ip: .systemd.services."boxmaker-channeld".serviceConfig.IPAddressDeny}')" || got="did not evaluate"
  want='{"ca":"/nix/store/cacert/etc/ssl/certs/ca-bundle.crt","credentials":"matrix_token","ip":"link-local","validated":true,"written":false}'
  if [[ "$got" == "$want" ]]; then
    echo "nix-check: default.nix: channeld check runs at build time, the token and the CA bundle stood in for: ok"
  else
    fail "default.nix with an https homeserver: got $got, want $want"
  fi
  got="$($om --arg declareOwner false 2>/dev/null | jq -r '.failedAssertions[]')" || got="did not evaluate"
  if grep -q "owner .alice. is not an account of this configuration" <<<"$got"; then
    echo "nix-check: default.nix: refuses an undeclared owner: ok"
  else
    fail "default.nix does not refuse an undeclared owner: $got"
  fi
  got="$($om --arg boxmaker '{ settings.brokerd.workspace.roots = [ { path = "/home/alice/projects"; writable = true; } ]; }' 2>/dev/null | jq -r '.failedAssertions[]')" || got="did not evaluate"
  if grep -q "root /home/alice/projects lies in /home/alice" <<<"$got"; then
    echo "nix-check: default.nix: refuses a workspace root in a 0700 home: ok"
  else
    fail "default.nix does not refuse a workspace root in a 0700 home: $got"
  fi
  check_settings_options "$om"
  if [[ -f "$repo/LICENSE" ]] && grep -q "Apache License" "$repo/LICENSE"; then
    echo "nix-check: LICENSE: the Apache-2.0 text the package's meta.license names"
  else
    fail "LICENSE: missing, or not the Apache-2.0 text that Cargo.toml and nix/package.nix name"
  fi
}

# settings.<daemon> as RFC 42 has it: the typed options inside it, beside it only what is no
# configuration key, and what default.nix writes equal to what configs.nix renders for
# tests/nix_configs.rs (which runs each daemon's `check` on it).
# options_in_settings JSON: fails (naming them) on options declared beside settings.<daemon>
# that belong inside it, or a settings.<daemon> that is not a free-form TOML submodule.
options_in_settings() {
  local shape="$1"
  jq -e '.beside == ["channels","enable","gateway","home","inference","memory","owner","ownerReadsJournal","package","systemPrompt","validateConfigs"] and .inference == ["apiKeyFile"]
      and .gateway == ["credentialFiles"] and .memory == ["honcho"] and .channels == ["matrix"]
      and ([.settings[] | select(.type == "submodule" and .freeform == "toml")] | length) == 6' \
    <<<"$shape" >/dev/null || {
    echo "typed options beside settings.<daemon> (only channels.matrix, enable, gateway.credentialFiles, home, inference.apiKeyFile, memory.honcho, owner, ownerReadsJournal, package, systemPrompt and validateConfigs belong there), or a settings.<daemon> that is not a free-form TOML submodule: $shape"
    return 1
  }
}

# compare_configs OM NAME BOXMAKER CONFIGS: offline-module.nix with services.boxmaker
# BOXMAKER writes exactly what the expression CONFIGS (configs.nix) renders, with no warning
# and no failed assertion.
compare_configs() {
  local om="$1" name="$2" box="$3" expr="$4" got want
  got="$($om --arg boxmaker "$box" 2>/dev/null | jq -S -c '{toml, warnings, failedAssertions}')" || got="did not evaluate"
  want="$(nix-instantiate --eval --strict --json -E "$expr" 2>/dev/null | jq -S -c '{toml: ., warnings: [], failedAssertions: []}')" || want="configs.nix did not evaluate"
  if [[ "$got" == "$want" ]]; then
    echo "nix-check: default.nix writes what configs.nix renders ($name): ok"
  else
    fail "default.nix writes other than configs.nix renders ($name): got $got, want $want"
  fi
}

check_settings_options() {
  local om="$1" got want out
  got="$($om 2>/dev/null | jq -c .options)" || got="did not evaluate"
  if out="$(options_in_settings "$got")"; then
    echo "nix-check: default.nix: the typed options live inside settings.<daemon>: ok"
  else
    fail "default.nix: $out"
  fi
  # Self-test: the old form (inference.* and tools beside settings) is caught.
  if options_in_settings '{"beside":["enable","home","inference","owner","package","tools"],"inference":["apiKeyFile","baseUrl","provider","script","slots"],"settings":{"brokerd":{"type":"submodule","freeform":"toml"},"inferproxy":{"type":"submodule","freeform":"toml"},"loopd":{"type":"submodule","freeform":"toml"}}}' >/dev/null; then
    fail "self-test options-beside-settings: the old form passed"
  else
    echo "nix-check: self-test options-beside-settings: caught"
  fi
  # What default.nix writes equals configs.nix's rendering: the defaults, and a fuller
  # configuration (new names); the old names give the same files, each with a warning.
  local configs="let d = import $here/defaults.nix; in import $here/configs.nix"
  local script="/nix/store/boxmaker/share/boxmaker/inferproxy-default-script.toml"
  local full='{ inference.apiKeyFile = "/run/keys/k";
      settings.inferproxy = { provider = { kind = "openai"; base_url = "http://127.0.0.1:8080/v1"; };
        slots.main = { model = "m"; context_tokens = 32768; };
        slots.small = { model = "s"; max_tokens = 512; temperature = 0.5; }; };
      settings.brokerd.tools = { web_fetch.enabled = false; workspace_write.approval = "always"; }; }'
  local old='{ inference = { apiKeyFile = "/run/keys/k"; provider = "openai"; baseUrl = "http://127.0.0.1:8080/v1";
        slots.main = { model = "m"; contextTokens = 32768; };
        slots.small = { model = "s"; maxTokens = 512; temperature = 0.5; }; };
      tools = { web_fetch.enabled = false; workspace_write.approval = "always"; }; }'
  compare_configs "$om" defaults '{ }' \
    "$configs { inherit (d) home inference tools; ownerUser = \"alice\"; defaultScript = \"$script\"; }"
  compare_configs "$om" "a fuller device" "$full" \
    "$configs { inherit (d) home; ownerUser = \"alice\"; defaultScript = \"$script\";
        inference = d.inference // { provider = \"openai\"; baseUrl = \"http://127.0.0.1:8080/v1\";
          slots = { main = d.slot // { model = \"m\"; contextTokens = 32768; };
                    small = d.slot // { model = \"s\"; maxTokens = 512; temperature = 0.5; }; }; };
        tools = { web_fetch.enabled = false; workspace_write.approval = \"always\"; }; }"
  compare_configs "$om" "the Matrix channel" \
    '{ channels.matrix = { enable = true; homeserver = "https://matrix.example.org"; user = "@box:example.org"; tokenFile = "/var/lib/boxmaker-keys/matrix-token"; owners = [ "@alice:example.org" ]; rooms = [ "!abc:example.org" ]; }; }' \
    "$configs { inherit (d) home inference tools; ownerUser = \"alice\"; defaultScript = \"$script\";
        matrix = { homeserver = \"https://matrix.example.org\"; user = \"@box:example.org\"; owners = [ \"@alice:example.org\" ]; rooms = [ \"!abc:example.org\" ]; }; }"
  local newer
  newer="$($om --arg boxmaker "$full" 2>/dev/null | jq -S -c .toml)" || newer="did not evaluate"
  got="$($om --arg boxmaker "$old" 2>/dev/null | jq -S -c '{toml, n: (.warnings | length), w: .warnings[0]}')" || got="did not evaluate"
  want="$(jq -S -c --argjson t "$newer" -n '{toml: $t, n: 4, w: "The option `services.boxmaker.inference.provider'"'"' has been renamed to `services.boxmaker.settings.inferproxy.provider.kind'"'"'."}')"
  if [[ "$got" == "$want" ]]; then
    echo "nix-check: default.nix: the old option names still work, with a warning each: ok"
  else
    fail "default.nix: the old option names: got $got, want $want"
  fi
}

# --- 5. what a nixpkgs reviewer asks of the module and the package -----------------------------
# Each *_problems function prints one line per problem of what it is given; step_conventions
# runs each on the module and the package as they are, then on the old form of each (the
# breakers of issue 26), which must give a problem.

# conventions_problems JSON: the module's {services, sockets} (NixOS's systemd options).
conventions_problems() {
  jq -r '
    (.services | to_entries[] | .key as $n | .value |
      (((.unitConfig // {}) | keys[]) as $k
        | select($k | IN("Requires", "Wants", "After", "Before", "Description", "Documentation", "StartLimitIntervalSec", "StartLimitBurst"))
        | "\($n): unitConfig.\($k) instead of its option"),
      (if (.serviceConfig // {}) | has("X-NotSocketActivated") then "\($n): serviceConfig.X-NotSocketActivated instead of notSocketActivated" else empty end),
      (if ((.serviceConfig.Sockets // []) != []) and (.notSocketActivated != true) then "\($n): serves sockets but is not notSocketActivated" else empty end),
      (if ((.serviceConfig.Sockets // []) != []) and ((has("startLimitBurst") and has("startLimitIntervalSec")) | not) then "\($n): serves sockets without startLimitBurst and startLimitIntervalSec" else empty end)),
    (.sockets | to_entries[] | .key as $n | .value |
      (if (.socketConfig // {}) | has("ListenStream") then "\($n): socketConfig.ListenStream instead of listenStreams" else empty end),
      (if (.listenStreams // []) == [] then "\($n): no listenStreams" else empty end),
      (((.unitConfig // {}) | keys[]) as $k | select($k | IN("After", "Requires", "Wants", "Description"))
        | "\($n): unitConfig.\($k) instead of its option"))
  ' <<<"$1"
}

# path_type_problems JSON: {option: type name} of the options that name paths.
path_type_problems() {
  jq -r 'to_entries[] | select(.value | test("absolute path not in the Nix store") | not)
    | "\(.key) is of type \(.value), not types.externalPath"' <<<"$1"
}

# cross_problems POSTINSTALL: the package's postInstall when the build cannot run the host's
# programs (a cross build) must run none of what it built.
cross_problems() {
  if grep -qF '$out/bin/' <<<"$1"; then
    echo "postInstall runs \$out/bin/... in a cross build: $(grep -F '$out/bin/' <<<"$1" | head -n 1)"
  fi
}

# source_problems PATH...: every repository file a crate's code or tests read relative to its
# manifest (`Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/x.md")`, as the check-phase
# tests do) lies in the package's source, the file set PATH... (nix/package.nix). Benches are
# not built by the check phase. The package check (nix/package-check.sh) finds the rest.
source_problems() {
  local f rel inside p
  while IFS= read -r rel; do
    [[ -n "$rel" ]] || continue
    inside=false
    for p in "$@"; do
      if [[ "$rel" == "$p" || "$rel" == "$p/"* ]]; then inside=true; fi
    done
    $inside || echo "$rel is read by a crate's code (../../$rel) but is not in nix/package.nix's source"
  done < <(cd "$repo" && git ls-files 'crates/*.rs' 2>/dev/null | grep -v '/benches/' | tr '\n' '\0' |
    xargs -0 -r grep -ohE 'CARGO_MANIFEST_DIR.*join\("\.\./\.\./[^"]+"\)' |
    sed -E 's|.*join\("\.\./\.\./||; s|"\)$||; s|/$||' | sort -u)
}

# key_problems FILE...: no document or option example puts a key in /run/keys by hand, nor
# sets a key file option to one there (a ramfs on NixOS: the key is gone at the next boot and
# the daemon that needs it does not start).
key_problems() {
  grep -nE '(install|cp|tee|mv|cat >).*/run/keys|example = .*"/run/keys|[A-Za-z]Files?(\.[A-Za-z0-9_]+)? = "/run/keys' "$@" 2>/dev/null |
    sed 's/^/a key placed by hand in \/run\/keys: /' || true
}

# prompt_problems JSON: services.boxmaker.systemPrompt as the module renders it ({pre, user,
# text}: loopd's ExecStartPre=, its User=, and the text's file in the store, boxmaker-system.md)
# installs that file as <home>/loop/system.md, loopd's user's and 0600, before loopd starts.
prompt_problems() {
  jq -r '. as $o |
    if .pre == null then "loopd'"'"'s unit installs no system prompt (no ExecStartPre=)"
    elif (.pre | test("^/nix/store/[^ ]+/bin/install -m 0600 -T /nix/store/[^ ]+ /var/lib/boxmaker/loop/system\\.md$") | not)
      then "loopd'"'"'s ExecStartPre= is not an install of the prompt as /var/lib/boxmaker/loop/system.md, 0600: \(.pre)"
    elif ($o.pre | contains($o.text // "no text") | not) then "loopd'"'"'s ExecStartPre= installs another file than the prompt'"'"'s: \(.pre)"
    elif .user != "bx-loop" then "the system prompt is installed as \(.user), not bx-loop"
    else empty end' <<<"$1"
}

# option_problems TREE FILE...: every `services.boxmaker.<path>` the files name is an option of
# the module (TREE: offline-module.nix's optionTree, whose leaves are options; past a leaf,
# its value's own keys: settings.<daemon> is free-form TOML, credentialFiles a set of names).
option_problems() {
  local tree="$1"
  shift
  grep -ohE 'services\.boxmaker\.[A-Za-z0-9_.]+' "$@" 2>/dev/null | sed 's/\.$//' | sort -u |
    while IFS= read -r name; do
      jq -r --arg n "$name" '
        def walk(t; ps): if (ps | length) == 0 or t == true then true
          elif (t | type) == "object" and (t | has(ps[0])) then walk(t[ps[0]]; ps[1:])
          else false end;
        if walk(.; $n | ltrimstr("services.boxmaker.") | split(".")) then empty
        else "\($n) is named in the tree but is no option of the module" end' <<<"$tree"
    done
}

# expect_problem NAME FUNCTION ARGS...: FUNCTION on the old form ARGS must report a problem.
expect_problem() {
  local name="$1" out
  shift
  out="$("$@" 2>&1)"
  if [[ -z "$out" ]]; then
    fail "self-test $name: the old form passed $1"
  else
    echo "nix-check: self-test $name: caught ($(head -n 1 <<<"$out"))"
  fi
}

# report NAME OUTPUT: OUTPUT of a *_problems function on the tree as it is, which must be empty.
report() {
  if [[ -n "$2" ]]; then
    fail "$1:"$'\n'"$2"
  else
    echo "nix-check: $1: ok"
  fi
}

step_conventions() {
  local om="nix-instantiate --eval --strict --json $here/offline-module.nix --argstr owner alice"
  local mod pkg out tracked
  mod="$($om 2>/dev/null)" || {
    fail "offline-module.nix did not evaluate"
    return
  }
  pkg="$(nix-instantiate --eval --strict --json "$repo/nix/package-attrs.nix" --arg canExecute true 2>/dev/null)" || {
    fail "nix/package-attrs.nix did not evaluate"
    return
  }

  # The units through nixpkgs' options.
  report "the module's units use after, wants, requires, startLimit*, notSocketActivated and listenStreams" \
    "$(conventions_problems "$(jq -c .systemd <<<"$mod")")"
  expect_problem raw-unit-keys conventions_problems \
    '{"services":{"boxmaker-loopd":{"unitConfig":{"After":["boxmaker-loop.socket"],"Requires":["boxmaker-loop.socket"],"StartLimitBurst":5,"StartLimitIntervalSec":300},"serviceConfig":{"X-NotSocketActivated":true,"Sockets":["boxmaker-loop.socket"]}}},"sockets":{"boxmaker-loop":{"unitConfig":{"After":["systemd-tmpfiles-setup.service"]},"socketConfig":{"ListenStream":"/run/boxmaker/channel-loop/loop.sock"}}}}'

  # Paths and key files typed as paths.
  report "home and the key files are types.externalPath" "$(path_type_problems "$(jq -c .pathTypes <<<"$mod")")"
  expect_problem string-paths path_type_problems '{"home":"string","inference.apiKeyFile":"null or string","gateway.credentialFiles":"attribute set of string"}'

  # The layout's keys are read-only; seccomp_log stays a choice.
  if out="$($om --arg boxmaker '{ settings.loopd.paths.home = "/srv/elsewhere"; }' 2>&1)"; then
    fail "settings.loopd.paths.home can be set: the layout's keys are not read-only"
  elif grep -q "is read-only" <<<"$out"; then
    echo "nix-check: settings.<daemon>.paths and the other layout keys are read-only: ok"
  else
    fail "setting settings.loopd.paths.home failed, but not as a read-only option: $out"
  fi
  out="$($om --arg boxmaker '{ settings.loopd.sandbox.seccomp_log = true; }' 2>/dev/null | jq -c '.toml.loopd.sandbox')" || out="did not evaluate"
  if [[ "$out" == '{"group":"bx-loop","require":true,"seccomp_log":true,"user":"bx-loop"}' ]]; then
    echo "nix-check: settings.<daemon>.sandbox.seccomp_log stays settable: ok"
  else
    fail "settings.loopd.sandbox.seccomp_log = true gave [sandbox] $out"
  fi

  # meta.maintainers of the module and the package.
  if jq -e '.meta.maintainers | length > 0' <<<"$mod" >/dev/null && jq -e '.meta.maintainers | length > 0' <<<"$pkg" >/dev/null; then
    echo "nix-check: meta.maintainers of the module and the package: ok"
  else
    fail "meta.maintainers is empty in the module or in nix/package.nix"
  fi

  # No bxctl run in postInstall when cross-compiling (and the native build still runs it).
  out="$(nix-instantiate --eval --strict --json "$repo/nix/package-attrs.nix" --arg canExecute false 2>/dev/null | jq -r .postInstall)"
  report "postInstall of a cross build runs nothing it built" "$(cross_problems "$out")"
  grep -qF '$out/bin/bxctl' <<<"$(jq -r .postInstall <<<"$pkg")" || fail "the native postInstall no longer makes bxctl's completions and man page"
  expect_problem cross-postinstall cross_problems 'installShellCompletion --cmd bxctl --bash <($out/bin/bxctl completions bash)
$out/bin/bxctl man > bxctl.1''

  # The source holds every file the crates' tests read.
  mapfile -t src < <(jq -r '.src.paths[]' <<<"$pkg")
  report "nix/package.nix's source holds every repository file the crates name" "$(source_problems "${src[@]}")"
  expect_problem source-without-docs source_problems Cargo.toml Cargo.lock crates docs/runbook.md nixos-module tests

  # Every generated configuration is checked by its daemon when the system is built.
  if jq -e '.validated | length == 5 and all(.[]; . == true)' <<<"$mod" >/dev/null; then
    echo "nix-check: every /etc/boxmaker/<daemon>.toml is the derivation that runs <daemon> check on it: ok"
  else
    fail "a configuration is not checked at build time: $(jq -c .validated <<<"$mod")"
  fi
  out="$($om --arg boxmaker '{ validateConfigs = false; }' 2>/dev/null | jq -c '[.validated[]] | unique')"
  [[ "$out" == "[false]" ]] || fail "validateConfigs = false still checks the configurations: $out"
  grep -q ' check --config ' "$here/validate-config.sh" || fail "validate-config.sh does not run <daemon> check --config"

  # The owner's system prompt: its text written into the store and installed for loopd, the
  # default's empty one too; a changed text a changed unit (so the switch restarts loopd);
  # `null` leaves system.md alone; over loopd's 256 KiB refused.
  local prompt_of='.systemd.services."boxmaker-loopd".serviceConfig | {pre: .ExecStartPre, user: .User, text: ([(.ExecStartPre // "") | capture("(?<t>/nix/store/[^ ]*-boxmaker-system\\.md)")] | .[0].t // null)}'
  local brief default_prompt
  brief="$($om --arg boxmaker '{ systemPrompt = "Be brief."; }' 2>/dev/null | jq -c "$prompt_of")" || brief='{"pre":null}'
  report "services.boxmaker.systemPrompt is installed as loopd's system.md, bx-loop's, 0600" "$(prompt_problems "$brief")"
  default_prompt="$($om 2>/dev/null | jq -c "$prompt_of")" || default_prompt='{"pre":null}'
  report "the default, empty systemPrompt is installed the same way" "$(prompt_problems "$default_prompt")"
  if [[ "$(jq -r .pre <<<"$brief")" != "$(jq -r .pre <<<"$default_prompt")" ]]; then
    echo "nix-check: a changed systemPrompt changes loopd's unit: ok"
  else
    fail "systemPrompt = \"Be brief.\" and the default give the same ExecStartPre=: $brief"
  fi
  expect_problem no-system-prompt prompt_problems '{"pre":null,"user":"bx-loop","text":"/nix/store/x"}'
  expect_problem system-prompt-world-readable prompt_problems \
    '{"pre":"/nix/store/c/bin/install -m 0644 -T /nix/store/x /var/lib/boxmaker/loop/system.md","user":"bx-loop","text":"/nix/store/x"}'
  out="$($om --arg boxmaker '{ systemPrompt = null; }' 2>/dev/null | jq -c '.systemd.services."boxmaker-loopd".serviceConfig.ExecStartPre // null')"
  [[ "$out" == null ]] || fail "with systemPrompt = null loopd's unit still installs one: $out"
  out="$($om --arg boxmaker '{ systemPrompt = let d = s: s + s; in d (d (d (d (d (d (d (d (d (d (d (d (d (d (d (d (d (d "x"))))))))))))))))) + "y"; }' 2>/dev/null |
    jq -r '.failedAssertions[]')"
  if grep -q "systemPrompt is 262145 bytes: loopd refuses" <<<"$out"; then
    echo "nix-check: a systemPrompt over 256 KiB is refused: ok"
  else
    fail "a systemPrompt of 262145 bytes was not refused: $out"
  fi

  # gatewayd and its name servers.
  out="$($om --arg boxmaker '{ settings.gatewayd.hosts = [ { name = "example.org"; } ]; }' 2>/dev/null | jq -r '.warnings[]')"
  if grep -q "settings.gatewayd.dns.servers is unset" <<<"$out"; then
    echo "nix-check: hosts without settings.gatewayd.dns.servers: warned: ok"
  else
    fail "no warning for gatewayd hosts without settings.gatewayd.dns.servers: $out"
  fi
  out="$($om --arg boxmaker '{ settings.gatewayd.hosts = [ { name = "example.org"; } ]; settings.gatewayd.dns.servers = [ "192.168.1.1:53" ]; }' 2>/dev/null |
    jq -c '{w: .warnings, s: .toml.gatewayd.dns.servers, allow: .systemd.services."boxmaker-gatewayd".serviceConfig.IPAddressAllow}')"
  if [[ "$out" == '{"w":[],"s":["192.168.1.1:53"],"allow":["192.168.1.1"]}' ]]; then
    echo "nix-check: settings.gatewayd.dns.servers: written, allowed past IPAddressDeny=, no warning: ok"
  else
    fail "settings.gatewayd.dns.servers = [ \"192.168.1.1:53\" ] gave $out"
  fi

  # Keys placed by hand: a root-only directory under /var/lib, never /run/keys.
  out="$(nix-instantiate --eval --strict --json -E "
    builtins.filter (d: d.path == (import $here/units.nix).keysDir)
      ((import $here/units.nix).directories { home = \"/var/lib/boxmaker\"; ownerUser = \"alice\"; ownerGroup = \"users\"; })" 2>/dev/null)"
  if [[ "$out" == '[{"group":"root","mode":"0700","path":"/var/lib/boxmaker-keys","user":"root"}]' ]]; then
    echo "nix-check: /var/lib/boxmaker-keys: 0700 root, made by tmpfiles and checked by bxctl check: ok"
  else
    fail "no 0700 root directory for keys placed by hand: $out"
  fi
  mapfile -t tracked < <(cd "$repo" && git ls-files -- '*.md' '*.nix' 2>/dev/null | sed "s|^|$repo/|")
  report "no key placed by hand in /run/keys (docs, option examples)" "$(key_problems "${tracked[@]}")"
  printf 'sudo install -m 0400 /dev/stdin /run/keys/boxmaker-api-key\n' >"$work/old-keys.md"
  expect_problem keys-in-run key_problems "$work/old-keys.md"
  printf '  tokenFile = "/run/keys/box-matrix-token";\n' >"$work/old-matrix.md"
  expect_problem matrix-token-in-run key_problems "$work/old-matrix.md"

  # The runbook's lines readable by the owner, and no polkit.
  if jq -e '.users.groups["systemd-journal"] == ["alice"]' <<<"$mod" >/dev/null; then
    echo "nix-check: the owner reads the journal (systemd-journal): ok"
  else
    fail "the owner is not in systemd-journal: $(jq -c .users.groups <<<"$mod")"
  fi
  out="$($om --arg boxmaker '{ ownerReadsJournal = false; }' 2>/dev/null | jq -c '.users.groups["systemd-journal"] // []')"
  [[ "$out" == "[]" ]] || fail "ownerReadsJournal = false still puts the owner in systemd-journal: $out"
  report "no polkit: the owner starts the selftest and the check by their sockets" \
    "$(grep -nE 'security\.polkit|polkit\.addRule' "$here"/*.nix | sed 's/^/polkit: /')"
  printf '    security.polkit.enable = true;\n' >"$work/old-test.nix"
  expect_problem polkit-in-test grep -nE 'security\.polkit' "$work/old-test.nix"

  # No document names an option that does not exist.
  mapfile -t tracked < <(cd "$repo" && git ls-files 2>/dev/null | grep -vE '^(Cargo\.lock|flake\.lock)$' | sed "s|^|$repo/|")
  report "every services.boxmaker.* the tree names is an option" "$(option_problems "$(jq -c .optionTree <<<"$mod")" "${tracked[@]}")"
  # The old docs' names, written so that this file does not name them itself.
  printf 'allow it with `services.boxmaker.%s`; hosts are `services.boxmaker.%s`\n' \
    gateway.allowAddresses gateway.hosts >"$work/old-gateway.md"
  expect_problem options-that-do-not-exist option_problems "$(jq -c .optionTree <<<"$mod")" "$work/old-gateway.md"

  # What the flake pins is what docs/install.md says it pins.
  local ref rev
  ref="$(jq -r .nodes.nixpkgs.original.ref "$repo/flake.lock")"
  rev="$(jq -r .nodes.nixpkgs.locked.rev "$repo/flake.lock")"
  if grep -qF "$ref" "$repo/docs/install.md" && grep -qF "$rev" "$repo/docs/install.md"; then
    echo "nix-check: docs/install.md names the pinned $ref at $rev: ok"
  else
    fail "docs/install.md does not name flake.lock's pin ($ref at $rev)"
  fi
}

# --- 4. the flake, offline ----------------------------------------------------------------
step_flake() {
  local src="$work/flake" out
  local nixflags=(--extra-experimental-features 'nix-command flakes' --offline)
  if ! have nix; then
    skipped "nix flake metadata/show: no nix command"
    return
  fi
  if ! have git || ! git -C "$repo" rev-parse --git-dir >/dev/null 2>&1; then
    skipped "nix flake metadata/show: $repo is not a git checkout (the flake's files are the tracked ones)"
    return
  fi
  # The tracked and unignored files only: a path flake of the whole tree would copy target/.
  mkdir -p "$src"
  (cd "$repo" && git ls-files -z --cached --others --exclude-standard | xargs -0 -I{} cp --parents {} "$src/")
  # The lock pins what flake.nix asks for, fully: offline, a mismatch would only show as a
  # download that cannot happen, so compare them here.
  local url want
  url="$(nix-instantiate --eval --strict --json -E "(import $repo/flake.nix).inputs.nixpkgs.url" | jq -r .)"
  want="$(jq -r '.nodes.nixpkgs.original | "\(.type):\(.owner)/\(.repo)/\(.ref)"' "$repo/flake.lock")"
  if [[ "$url" != "$want" ]]; then
    fail "flake.nix asks for nixpkgs $url but flake.lock pins $want"
  fi
  jq -e '.nodes.nixpkgs.locked
      | (.rev | test("^[0-9a-f]{40}$")) and (.narHash | test("^sha256-[A-Za-z0-9+/]{43}=$"))
        and (.lastModified | type == "number") and .type == "github"' "$repo/flake.lock" >/dev/null ||
    fail "flake.lock: the nixpkgs node is not a full github pin (rev, narHash, lastModified)"
  # The lock must match flake.nix as it is: a lock that needs rewriting is an error.
  if out="$(nix "${nixflags[@]}" flake metadata --no-update-lock-file "path:$src" 2>&1)"; then
    local rev
    rev="$(jq -r '.nodes.nixpkgs.locked.rev' "$repo/flake.lock")"
    if grep -qF "github:NixOS/nixpkgs/$rev" <<<"$out"; then
      echo "nix-check: nix flake metadata: ok (nixpkgs at $rev)"
    else
      fail "nix flake metadata does not show the locked nixpkgs revision $rev: $out"
    fi
  elif offline_error "$out" >/dev/null; then
    skipped "nix flake metadata --offline: $(offline_error "$out")"
  else
    fail "nix flake metadata: $out"
  fi
  if out="$(nix "${nixflags[@]}" flake show --no-update-lock-file "path:$src" 2>&1)"; then
    echo "nix-check: nix flake show: ok"
  elif offline_error "$out" >/dev/null; then
    skipped "nix flake show --offline (it needs the nixpkgs source, which is not in this store): $(offline_error "$out")"
  else
    fail "nix flake show: $out"
  fi
}

# offline_error OUTPUT: prints the line saying a download was needed, if that is the error.
offline_error() {
  grep -m1 -E "unable to download|Couldn't resolve host|cannot fetch|in offline mode" <<<"$1"
}

# --- run ----------------------------------------------------------------------------------
if ! have nix-instantiate; then
  skipped "nix checks: nix-instantiate not installed (apt-get install nix-bin)"
  exit $((failures > 0))
fi
if ! have jq; then
  fail "jq is needed to write the rendered units (apt-get install jq)"
  exit 1
fi

step_parse

# The layout itself: names that refer to each other must agree.
problems="$(nix-instantiate --eval --strict --json -E "(import $here/units.nix).problems" | jq -r '.[]')"
if [[ -n "$problems" ]]; then
  fail "nixos-module/layout.json:"$'\n'"$problems"
else
  echo "nix-check: layout.json: consistent"
fi
# ... and that check can fail: a socket whose server does not serve it, a shared directory.
broken="$(nix-instantiate --eval --strict --json -E "
  let u = import $here/units.nix; l = builtins.fromJSON (builtins.readFile $here/layout.json);
  in u.problemsOf (l // { sockets = l.sockets // {
    infer = l.sockets.infer // { server = \"brokerd\"; dir = \"loop-broker\"; }; }; })" | jq -r '.[]')"
# shellcheck disable=SC2016 # the backticks are literal, as units.nix writes them
if grep -q 'infer: its server `brokerd` is not a daemon that serves it' <<<"$broken" &&
  grep -q 'directory `loop-broker` is shared' <<<"$broken"; then
  echo "nix-check: self-test broken-layout: caught"
else
  fail "self-test broken-layout: a wrong server and a shared directory were not both caught: $broken"
fi

step_module
step_conventions

render default "$work/default"
render full "$work/full"
echo "nix-check: rendered $(find "$work/full/units" -type f | wc -l) units in two variants"

if have systemd-analyze; then
  for variant in default full; do
    if out="$(check_all "$work/$variant" 2>&1)"; then
      echo "nix-check: $variant units: verify, security (exposure <= 1.5) and hardening lines ok"
    else
      fail "$variant units:"$'\n'"$out"
    fi
  done
  self_test
else
  skipped "systemd-analyze verify/security: systemd-analyze not installed"
  if out="$(check_lines "$work/full" 2>&1)"; then
    echo "nix-check: hardening lines ok"
  else
    fail "hardening lines:"$'\n'"$out"
  fi
fi

step_flake

if [[ $failures -ne 0 ]]; then
  echo "nix-check: $failures failure(s)" >&2
  exit 1
fi
echo "nix-check: ok"

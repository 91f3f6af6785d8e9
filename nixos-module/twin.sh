#!/usr/bin/env bash
# The device twin (`make twin`): the module's own units, tmpfiles.d and sysusers.d lines and
# configurations, rendered by nixos-module/twin.nix with builtins only, installed into a Debian
# root with the package as nix/package-check.sh built and installed it (target/package-check/out:
# the programs, runbook and default script nix/package.nix installs), and booted under its real
# systemd in systemd-nspawn, in a network namespace with only loopback. Then, inside it:
#
#   1. the device check (`bxctl check`) passes, every line `ok`, and it fails when a unit's
#      hardening is removed (a drop-in) or a directory's mode is loosened;
#   2. each daemon's refused configuration makes the switch fail (a start that fails, as
#      nixos-rebuild's switch-to-configuration starts a changed unit), its fail-closed line is
#      found with `journalctl RUNBOOK=<anchor> SYSLOG_IDENTIFIER=<daemon>`, and the good
#      configuration brings it back;
#   3. each daemon, killed with SIGKILL, is brought back by systemd, the audit chain verified;
#   4. loopd, stopped, is started again by the first connection on loop.sock;
#   5. two chat turns as the owner through `bxctl chat`;
#   6. a workspace root and the run tool, configured as an owner would: workspace_read reads
#      the root under brokerd's unit, and run starts a program from the store that reads it
#      and is refused /etc by its own sandbox; the chain verifies;
#   7. with a Synapse on the host's loopback (SYNAPSE_URL, .ci/synapse-up), the Matrix channel:
#      channeld's unit with its token as the credential (from /var/lib/boxmaker-keys), paired
#      by `bxctl channel pair`, a message of the owner answered in the room (channeld is in
#      steps 1 to 3 as every daemon; the twin's loopback reaches the host's Synapse through a
#      forwarder, nothing else of the host's network); without SYNAPSE_URL the twin has no
#      channeld and says so;
#   8. the device check passes again, and its output is kept in target/twin/check.txt;
# and, after step 1: the owner's first boot (the device check and the selftest as the owner,
# through their on-demand units; the runbook's lines in the journal as the owner; a visitor
# refused the check's socket; the owner's system prompt installed as loopd's, 0600), and
# egress: gatewayd's and inferproxy's units refuse their own processes what their
# IPAddressDeny= forbids (nixos-module/egress-probe.py in each unit's cgroup; SocketBindDeny=
# where the twin's systemd can enforce it).
#
# The Debian root (debootstrap minbase bookworm, Debian's own packages) is made once under
# target/twin/base and copied for each run. It needs root, systemd-nspawn, nsenter, debootstrap
# (the first time), nix-instantiate, jq, patchelf and python3; without one it says `skipped:`
# (a failure under CI=true). Usage: nixos-module/twin.sh (after nix/package-check.sh).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
twin="$repo/target/twin"
package="$repo/target/package-check/out"
base="$twin/base"
root="$twin/root"

# Where the package and its C libraries live in the twin: under /nix/store, the one place the
# units' NoExecPaths=/ + ExecPaths=/nix/store let a program (and its loader) run from.
pkg=/nix/store/twin00000000000000000000000000000-boxmaker
libs=/nix/store/twin00000000000000000000000000000-glibc
owner=boxowner

say() { echo "twin: $*"; }
leader=""
fail() {
  echo "twin: FAILED: $*" >&2
  # What the twin's systemd says of the box, to see why without booting it again.
  if [[ -n "$leader" ]]; then
    nsenter -t "$leader" -a systemctl status --no-pager --lines=15 'boxmaker-*' >&2 2>&1 || true
  fi
  exit 1
}
skip() {
  if [[ "${CI:-}" == true || "${CI:-}" == 1 ]]; then
    fail "cannot run under CI: $*"
  fi
  echo "skipped: twin: $*"
  # The gate lists every skip before its last line (Makefile, BXTEST_SKIP_LOG).
  if [[ -n "${BXTEST_SKIP_LOG:-}" ]]; then printf 'twin: %s\n' "$*" >>"$BXTEST_SKIP_LOG"; fi
  exit 0
}
have() { command -v "$1" >/dev/null 2>&1; }
# skip_part WHY: one part of the twin cannot run here; the rest goes on. Under CI=true it fails
# unless WHY starts with a line of .ci/allowed-skips (the rule of the tests' bxtest::skip).
skip_part() {
  echo "skipped: $*"
  # The gate lists every skip before its last line (Makefile, BXTEST_SKIP_LOG).
  if [[ -n "${BXTEST_SKIP_LOG:-}" ]]; then printf '%s\n' "$*" >>"$BXTEST_SKIP_LOG"; fi
  if [[ "${CI:-}" == true || "${CI:-}" == 1 ]]; then
    local line
    while IFS= read -r line; do
      line="${line#"${line%%[![:space:]]*}"}"
      [[ -z "$line" || "$line" == \#* ]] && continue
      [[ "$*" == "$line"* ]] && return 0
    done <"$repo/.ci/allowed-skips"
    fail "skipped under CI: $*"
  fi
}

[[ "$(id -u)" == 0 ]] || skip "needs root (systemd-nspawn boots the twin)"
for tool in systemd-nspawn nsenter nix-instantiate jq patchelf python3; do
  have "$tool" || skip "$tool is not installed (.ci/run installs it)"
done
[[ -x "$package/bin/bxctl" ]] || fail "no package in $package: run nix/package-check.sh (make package-check)"

# --- the Debian root, made once ----------------------------------------------------------
if [[ ! -x "$base/usr/lib/systemd/systemd" ]]; then
  have debootstrap || skip "debootstrap is not installed (.ci/run installs it)"
  say "making the Debian root (debootstrap, a few minutes, once)"
  mkdir -p "$twin"
  rm -rf "$base.tmp"
  debootstrap --variant=minbase --include=systemd,systemd-sysv,dbus bookworm "$base.tmp" \
    >"$twin/debootstrap.log" 2>&1 || fail "debootstrap failed: see $twin/debootstrap.log"
  mv "$base.tmp" "$base"
fi

# --- the twin's root: a fresh copy, and the box installed from the module's definitions -----
machine="boxmaker-twin-$$"
nspawn_pid=""
cleanup() {
  if [[ -n "${forward_pid:-}" ]]; then kill "$forward_pid" 2>/dev/null || true; fi
  if [[ -n "$nspawn_pid" ]] && kill -0 "$nspawn_pid" 2>/dev/null; then
    kill -TERM "$nspawn_pid" 2>/dev/null || true
    for _ in $(seq 1 100); do
      kill -0 "$nspawn_pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL "$nspawn_pid" 2>/dev/null || true
  fi
}
trap cleanup EXIT

rm -rf "$root"
cp -a "$base" "$root"

# The Matrix channel, when a Synapse is on the host's loopback (the twin reaches it through
# forward.py below, from its own loopback): a bot and an owner registered with its shared
# secret, a room of the owner's with the bot invited. matrix.py speaks the client-server API for
# this script.
matrix_json=""
matrix_py="$twin/matrix.py"
cat >"$matrix_py" <<'EOF'
import json, sys, time, urllib.parse, urllib.request
url = sys.argv[1]
def call(method, path, token=None, body=None):
    req = urllib.request.Request(url + "/_matrix/client/v3" + path, method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"content-type": "application/json", **({"authorization": "Bearer " + token} if token else {})})
    return json.load(urllib.request.urlopen(req, timeout=30))
q = lambda s: urllib.parse.quote(s, safe="")
cmd = sys.argv[2]
if cmd == "login":
    v = call("POST", "/login", body={"type": "m.login.password", "identifier": {"type": "m.id.user", "user": sys.argv[3]}, "password": sys.argv[4]})
    print(v["user_id"], v["access_token"])
elif cmd == "room":
    print(call("POST", "/createRoom", sys.argv[3], {"preset": "private_chat", "invite": [sys.argv[4]]})["room_id"])
elif cmd == "say":
    print(call("PUT", f"/rooms/{q(sys.argv[4])}/send/m.room.message/twin{time.time_ns()}", sys.argv[3], {"msgtype": "m.text", "body": sys.argv[5]})["event_id"])
elif cmd == "bodies":
    v = call("GET", f"/rooms/{q(sys.argv[4])}/messages?dir=b&limit=100", sys.argv[3])
    for e in v["chunk"]:
        c = e.get("content", {})
        print(e.get("sender"), (c.get("m.new_content") or c).get("body", "").replace("\n", " "))
elif cmd == "member":
    v = call("GET", f"/rooms/{q(sys.argv[4])}/members", sys.argv[3])
    print(" ".join(e["content"]["membership"] for e in v["chunk"] if e["state_key"] == sys.argv[5]))
EOF
if [[ -n "${SYNAPSE_URL:-}" && -n "${SYNAPSE_REGISTER:-}" && -n "${SYNAPSE_SHARED_SECRET:-}" ]]; then
  tag="twin$$$(date +%s)"
  for who in bot owner; do
    "$SYNAPSE_REGISTER" -u "$tag$who" -p "pw-$tag$who" --no-admin -k "$SYNAPSE_SHARED_SECRET" "$SYNAPSE_URL" >/dev/null ||
      fail "cannot register $tag$who on $SYNAPSE_URL"
  done
  read -r bot_id bot_token < <(python3 "$matrix_py" "$SYNAPSE_URL" login "${tag}bot" "pw-${tag}bot")
  read -r mx_owner mx_owner_token < <(python3 "$matrix_py" "$SYNAPSE_URL" login "${tag}owner" "pw-${tag}owner")
  mx_room="$(python3 "$matrix_py" "$SYNAPSE_URL" room "$mx_owner_token" "$bot_id")"
  matrix_json="$(jq -c -n --arg hs "$SYNAPSE_URL" --arg u "$bot_id" --arg o "$mx_owner" --arg r "$mx_room" \
    '{homeserver: $hs, user: $u, owners: [$o], rooms: [$r]}')"
fi

# The owner's system prompt (services.boxmaker.systemPrompt), a file in the store as the module
# writes it, and the coreutils `install` loopd's unit copies it with.
prompt_store=/nix/store/twin00000000000000000000000000000-system-prompt
coreutils=/nix/store/twin00000000000000000000000000000-coreutils
prompt_text="The owner of this twin speaks English and likes short answers."

render="$twin/render.json"
nix-instantiate --eval --strict --json "$here/twin.nix" --argstr package "$pkg" --argstr matrix "$matrix_json" \
  --argstr systemPrompt "$prompt_store/system.md" --argstr install "$coreutils/bin/install" \
  >"$render" 2>"$twin/render.err" || fail "nix-instantiate twin.nix: $(cat "$twin/render.err")"

# The package as its install phase made it, its programs' loader and libraries beside it in the
# store (as Nix links them).
mkdir -p "$root$pkg" "$root$libs/lib"
cp -a "$package/." "$root$pkg/"
for exe in "$package"/bin/*; do
  [[ -f "$exe" && -x "$exe" ]] || continue
  while read -r lib; do
    [[ -n "$lib" && -e "$lib" ]] && cp -L "$lib" "$root$libs/lib/$(basename "$lib")"
  done < <(ldd "$exe" | sed -n 's/.*=> \(\/[^ ]*\) .*/\1/p; s/^\s*\(\/[^ ]*\) .*/\1/p')
done
interp="$(patchelf --print-interpreter "$package/bin/bxctl")"
cp -L "$interp" "$root$libs/lib/$(basename "$interp")"
for exe in "$root$pkg"/bin/*; do
  patchelf --set-interpreter "$libs/lib/$(basename "$interp")" --set-rpath "$libs/lib" "$exe"
done
for f in share/doc/boxmaker/runbook.md share/boxmaker/inferproxy-default-script.toml; do
  [[ -s "$root$pkg/$f" ]] || fail "the package installs no $f"
done
ln -sf "$pkg/bin/bxctl" "$root/usr/local/bin/bxctl"
mkdir -p "$root$prompt_store" "$root$coreutils/bin"
printf '%s\n' "$prompt_text" >"$root$prompt_store/system.md"
chmod 0444 "$root$prompt_store/system.md"
cp "$root/usr/bin/install" "$root$coreutils/bin/install"
while read -r lib; do
  [[ -n "$lib" && -e "$lib" ]] && cp -L "$lib" "$root$libs/lib/$(basename "$lib")"
done < <(ldd "$root/usr/bin/install" | sed -n 's/.*=> \(\/[^ ]*\) .*/\1/p')
# DT_RPATH, not RUNPATH: its libraries' own (libselinux's libpcre2) are looked up there too, not
# in the Debian root's /lib, which the unit's NoExecPaths=/ keeps from being mapped.
patchelf --set-interpreter "$libs/lib/$(basename "$interp")" --force-rpath --set-rpath "$libs/lib" "$root$coreutils/bin/install"

# Units, tmpfiles.d, sysusers.d, configurations and the device check's manifest.
mkdir -p "$root/etc/boxmaker" "$root/etc/tmpfiles.d" "$root/etc/sysusers.d"
for name in $(jq -r '.units | keys[]' "$render"); do
  jq -r --arg n "$name" '.units[$n]' "$render" >"$root/etc/systemd/system/$name"
done
jq -r .tmpfiles "$render" >"$root/etc/tmpfiles.d/boxmaker.conf"
jq -r .sysusers "$render" >"$root/etc/sysusers.d/boxmaker.conf"
jq .manifest "$render" >"$root/etc/boxmaker/device.json"
cp "$repo/docs/runbook.md" "$root/etc/boxmaker/runbook.md"
# TOML from the JSON of configs.nix, as pkgs.formats.toml writes it for the module.
python3 - "$render" "$root/etc/boxmaker" <<'EOF'
import json, sys

def value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(value(x) for x in v) + "]"
    raise SystemExit(f"no TOML for {v!r}")

def table(path, t, out):
    plain = {k: v for k, v in t.items() if not isinstance(v, dict)}
    subs = {k: v for k, v in t.items() if isinstance(v, dict)}
    if path and (plain or not subs):
        out.append("[" + ".".join(json.dumps(p) for p in path) + "]")
    for k, v in plain.items():
        out.append(f"{json.dumps(k)} = {value(v)}")
    if plain:
        out.append("")
    for k, v in subs.items():
        table(path + [k], v, out)

configs = json.load(open(sys.argv[1]))["configs"]
for daemon, conf in configs.items():
    out = []
    table([], conf, out)
    with open(f"{sys.argv[2]}/{daemon}.toml", "w") as f:
        f.write("\n".join(out) + "\n")
EOF

# The bot's token where a key placed by hand goes, root's alone, and where the unit's
# LoadCredential= reads it (tmpfiles makes the directory 0700 root at boot, as on the device).
keys="$(jq -r '.manifest.directories[] | select(.path | endswith("-keys")) | .path' "$render")"
[[ "$keys" == /var/lib/boxmaker-keys ]] || fail "the manifest names no keys directory: $keys"
if [[ -n "$matrix_json" ]]; then
  install -d -m 0700 "$root$keys"
  install -m 0600 /dev/stdin "$root$keys/matrix-token" <<<"$bot_token"
fi

# The system users, as the module declares them; the owner's login account, which the module
# leaves to the device's own configuration.
systemd-sysusers --root="$root" >/dev/null 2>&1 || fail "systemd-sysusers: $(systemd-sysusers --root="$root" 2>&1)"
groups="$(jq -r '.ownerGroups | join(",")' "$render")"
chroot "$root" useradd --create-home --gid users ${groups:+--groups "$groups"} --shell /bin/bash "$owner"
# Someone who is not the owner, to knock on the owner's sockets.
chroot "$root" useradd --create-home --gid users --shell /bin/bash visitor
# Enable every unit with an [Install] section, as NixOS's wantedBy does.
mapfile -t installable < <(cd "$root/etc/systemd/system" && grep -l '^\[Install\]' ./*.service ./*.socket | sed 's|^\./||')
systemctl --root="$root" enable "${installable[@]}" >/dev/null 2>&1 ||
  fail "systemctl enable in the twin's root: $(systemctl --root="$root" enable "${installable[@]}" 2>&1)"
# The console of a container is not a terminal: no getty on it.
systemctl --root="$root" mask console-getty.service >/dev/null 2>&1 || true

# --- boot --------------------------------------------------------------------------------
mkdir -p /run/systemd/nspawn
say "booting the twin (systemd $("$root/usr/lib/systemd/systemd" --version | head -1 | cut -d' ' -f2))"
# A network namespace with only loopback (--private-network: also the CAP_NET_ADMIN the unit's
# IP rules need), and bpf(), which the twin's systemd attaches IPAddressDeny= with: without
# it systemd says nothing and runs every unit without its IP rules.
systemd-nspawn --quiet --register=no --keep-unit --machine="$machine" -D "$root" --boot \
  --private-network \
  --system-call-filter='landlock_create_ruleset landlock_add_rule landlock_restrict_self bpf' \
  >"$twin/console.log" 2>&1 </dev/null &
nspawn_pid=$!

# The twin's PID 1: the process below nspawn that is PID 1 in its own namespace.
find_leader() {
  local p
  for p in $(pgrep -x systemd); do
    grep -qE '^NSpid:\s+[0-9]+\s+1$' "/proc/$p/status" 2>/dev/null || continue
    local a="$p"
    for _ in 1 2 3; do
      a="$(awk '/^PPid:/ {print $2}' "/proc/$a/status" 2>/dev/null)" || break
      if [[ "$a" == "$nspawn_pid" ]]; then
        echo "$p"
        return 0
      fi
    done
  done
  return 1
}
# wait_for WHAT SECONDS CMD...: run CMD until it succeeds, or fail saying WHAT was awaited.
wait_for() {
  local what="$1" secs="$2"
  shift 2
  local until=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= until)); then
      fail "waited ${secs}s for $what"
    fi
    sleep 0.2
  done
}
wait_for "the twin's PID 1" 30 find_leader
leader="$(find_leader)"
in_twin() { nsenter -t "$leader" -a "$@"; }
as_owner() { in_twin runuser -u "$owner" -- "$@"; }

# The host's Synapse on the twin's loopback: forward.py listens on the twin's 127.0.0.1 at
# Synapse's port (a socket made inside the twin's network namespace, setns(2)) and carries each
# connection to the host's, and nothing else of the host's network. channeld's unit allows
# 127.0.0.1 alone (its homeserver's address), as on a device whose homeserver is local.
forward_pid=""
if [[ -n "$matrix_json" ]]; then
  cat >"$twin/forward.py" <<'EOF'
import ctypes, os, socket, sys, threading
leader, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNET = 0x40000000
own = os.open("/proc/self/ns/net", os.O_RDONLY)
twin = os.open(f"/proc/{leader}/ns/net", os.O_RDONLY)
if libc.setns(twin, CLONE_NEWNET) != 0:
    raise OSError(ctypes.get_errno(), "setns into the twin's network namespace")
listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind(("127.0.0.1", port))
listener.listen(64)
if libc.setns(own, CLONE_NEWNET) != 0:
    raise OSError(ctypes.get_errno(), "setns back")
def pipe(a, b):
    try:
        while True:
            data = a.recv(65536)
            if not data:
                break
            b.sendall(data)
    except OSError:
        pass
    finally:
        for s in (a, b):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
print("ready", flush=True)
while True:
    inner, _ = listener.accept()
    try:
        outer = socket.create_connection((host, port), timeout=10)
        outer.settimeout(None)
    except OSError:
        inner.close()
        continue
    threading.Thread(target=pipe, args=(inner, outer), daemon=True).start()
    threading.Thread(target=pipe, args=(outer, inner), daemon=True).start()
EOF
  mx_port="$(sed -E 's|^https?://[^:/]+:([0-9]+).*|\1|' <<<"$SYNAPSE_URL")"
  [[ "$mx_port" =~ ^[0-9]+$ ]] || fail "SYNAPSE_URL $SYNAPSE_URL names no port"
  python3 "$twin/forward.py" "$leader" 127.0.0.1 "$mx_port" >"$twin/forward.log" 2>&1 &
  forward_pid=$!
  forwarding() { grep -q '^ready$' "$twin/forward.log"; }
  wait_for "the forwarder to the host's Synapse" 10 forwarding
fi

booted() {
  local state
  state="$(in_twin systemctl is-system-running 2>/dev/null)" || true
  [[ "$state" == running || "$state" == degraded ]]
}
wait_for "the twin to boot (systemctl is-system-running)" 60 booted
if [[ "$(in_twin systemctl is-system-running 2>/dev/null || true)" == degraded ]]; then
  say "booted, degraded by units outside the box: $(in_twin systemctl --failed --no-legend --plain | awk '{print $1}' | tr '\n' ' ')"
fi
manifest="$root/etc/boxmaker/device.json"
mapfile -t services < <(jq -r '.services[].unit' "$manifest")
mapfile -t daemons < <(jq -r '.services[].daemon' "$manifest")
for u in "${services[@]}"; do
  wait_for "$u to be active" 30 in_twin systemctl is-active "$u"
done
say "booted; ${#services[@]} services active"

# --- 1. the device check, and that it can fail ----------------------------------------
check() { in_twin bxctl check "$@"; }
if ! out="$(check 2>&1)"; then
  fail "the device check failed in the twin:"$'\n'"$out"
fi
grep -qE '^(FAIL|skip)' <<<"$out" && fail "the device check passed with lines not ok:"$'\n'"$out"
say "device check: $(tail -n 1 <<<"$out")"

# The owner's first boot: the owner, without root, sudo or polkit, runs the device check (its
# unit runs it as root and sends the report back on the owner's socket) and the selftest (loopd's,
# as bx-loop), and reads the runbook's lines in the journal (the systemd-journal group).
if ! out="$(as_owner bxctl check 2>&1)"; then
  fail "the device check as the owner failed:"$'\n'"$out"
fi
grep -qE '^(FAIL|skip)' <<<"$out" && fail "the owner's device check has lines not ok:"$'\n'"$out"
n_owner="$(grep -c '^ok ' <<<"$out")"
if ! out="$(as_owner bxctl check --json 2>&1)" || ! jq -e '.ok and all(.checks[]; .result == "ok")' <<<"$out" >/dev/null; then
  fail "bxctl check --json as the owner: $out"
fi
if out="$(in_twin runuser -u visitor -- bxctl check 2>&1)"; then
  fail "someone not the owner ran the device check's unit: $out"
fi
grep -q "is not yours to open" <<<"$out" || fail "a visitor's bxctl check failed without saying the socket is not theirs: $out"
if ! out="$(as_owner bxctl selftest 2>&1)"; then
  fail "bxctl selftest as the owner failed:"$'\n'"$out"
fi
grep -q '^selftest: ok' <<<"$out" || fail "bxctl selftest as the owner did not say ok:"$'\n'"$out"
grep -qE "loopd's own sockets +ok: boxmaker-selftest@\.service, as loopd's user" <<<"$out" ||
  fail "the owner's selftest did not run loopd's selftest through its unit:"$'\n'"$out"
grep -qE '^  loopd finds inferproxy +ok' <<<"$out" || fail "the owner's selftest did not ask loopd's health on loop.sock:"$'\n'"$out"
runbook_lines="$(as_owner journalctl --no-pager -o cat RUNBOOK=socket-peer-refused | wc -l)"
((runbook_lines > 0)) || fail "the owner reads no RUNBOOK=socket-peer-refused line in the journal"
# The owner's system prompt, as loopd's unit installed it before loopd started.
prompt_path="$(jq -r '.manifest.home' "$render")/loop/system.md"
got="$(in_twin stat -c '%U %G %a' "$prompt_path" 2>&1)" || fail "no system prompt at $prompt_path: $got"
[[ "$got" == "bx-loop bx-loop 600" ]] || fail "$prompt_path is $got, not bx-loop's and 0600"
[[ "$(in_twin cat "$prompt_path")" == "$prompt_text" ]] || fail "$prompt_path does not hold the owner's system prompt"
say "the owner's first boot: bxctl check ($n_owner lines ok, run as root by boxmaker-check@.service), bxctl selftest (loopd's through boxmaker-selftest@.service), $runbook_lines runbook lines in the journal; a visitor is refused the check's socket; the system prompt at $prompt_path, bx-loop's, 0600"

# --- egress: each network daemon's unit refuses what its IPAddressDeny= forbids -------------
# egress-probe.py, in the twin's network namespace (loopback only), listens on 127.0.0.1,
# connects there itself (allowed: it is in no unit), then from inside the unit's own cgroup,
# where systemd attached the unit's IP rules: a datagram and a connection to loopback, which
# both units deny (gatewayd every local range, inferproxy with the script provider everything).
cgmnt="$(awk '$3 == "cgroup2" {print $2; exit}' /proc/self/mounts)"
cgroot="$(awk -F: '$1 == "0" {print $3}' "/proc/$leader/cgroup")"
cgroot="${cgroot%/init.scope}"
bpf_framework="$(in_twin systemctl --version | grep -oE '[+-]BPF_FRAMEWORK' || echo '-BPF_FRAMEWORK')"
for d in gatewayd inferproxy; do
  u="$(jq -r --arg d "$d" '.services[] | select(.daemon == $d) | .unit' "$manifest")"
  deny="$(in_twin systemctl show -p IPAddressDeny --value "$u")"
  [[ -n "$deny" ]] || fail "$u has no IPAddressDeny="
  cg="$cgmnt$cgroot$(in_twin systemctl show -p ControlGroup --value "$u")"
  [[ -f "$cg/cgroup.procs" ]] || fail "no cgroup $cg for $u"
  got="$(nsenter -t "$leader" -n python3 "$here/egress-probe.py" "$cg" 2>&1)" || fail "egress-probe.py for $u: $got"
  jq -e '.control == {"tcp": "ok", "udp": "ok"}' <<<"$got" >/dev/null ||
    fail "the probe's own connections to loopback failed, so nothing is shown: $got"
  jq -e '.unit.udp == "EPERM" and .unit.tcp != "ok"' <<<"$got" >/dev/null ||
    fail "$u let a process of its own reach 127.0.0.1 past IPAddressDeny=$deny: $got"
  if [[ "$bpf_framework" == +BPF_FRAMEWORK ]]; then
    jq -e '.unit.bind == "EPERM"' <<<"$got" >/dev/null || fail "$u let a process of its own bind TCP past SocketBindDeny=any: $got"
  fi
  say "$u: IPAddressDeny=$deny refuses its own processes 127.0.0.1 (udp $(jq -r .unit.udp <<<"$got"), tcp $(jq -r .unit.tcp <<<"$got")); the probe outside the unit reaches it"
done
if [[ "$bpf_framework" != +BPF_FRAMEWORK ]]; then
  skip_part "twin: SocketBindDeny= needs a systemd built with BPF_FRAMEWORK, and the twin's ($bpf_framework) is not; the NixOS VM test shows it refusing a bind"
fi

# A unit's hardening removed (a drop-in, as an override would): systemd-analyze security
# scores it over the target, and the check fails on it.
unit="${services[0]}"
dropin="$root/etc/systemd/system/$unit.d"
mkdir -p "$dropin"
printf '[Service]\nSystemCallFilter=\nRestrictNamespaces=false\nProtectSystem=false\nPrivateDevices=false\nCapabilityBoundingSet=~\nRestrictAddressFamilies=\nPrivateNetwork=false\nIPAddressDeny=\nProtectKernelTunables=false\nProtectKernelModules=false\n' >"$dropin/weaken.conf"
in_twin systemctl daemon-reload
if out="$(check 2>&1)"; then
  fail "the device check passed with $unit's hardening removed:"$'\n'"$out"
fi
grep -qE "^FAIL security $unit: exposure [0-9.]+, over" <<<"$out" ||
  fail "the device check failed without naming $unit's exposure:"$'\n'"$out"
rm -rf "$dropin"
in_twin systemctl daemon-reload
say "device check: fails when $unit's hardening is removed"

# A directory's mode loosened.
dir="$(jq -r '[.directories[] | select(.mode == "0700")][0].path' "$manifest")"
in_twin chmod 0755 "$dir"
if out="$(check 2>&1)"; then
  fail "the device check passed with $dir at 0755:"$'\n'"$out"
fi
grep -qF "FAIL directory $dir: mode 0755, not 0700" <<<"$out" ||
  fail "the device check failed without naming $dir's mode:"$'\n'"$out"
in_twin chmod 0700 "$dir"
say "device check: fails when $dir is loosened to 0755"

# --- 2. a refused configuration fails the switch, and says so in the journal --------------
# As switch-to-configuration does for a changed unit: a unit with Sockets= and without
# X-NotSocketActivated=true is stopped and only its sockets restarted; any other is restarted,
# and a start that fails fails the switch.
switch_unit() {
  local unit="$1" text
  text="$(in_twin systemctl cat "$unit")"
  in_twin systemctl daemon-reload
  if grep -q '^Sockets=' <<<"$text" && ! grep -q '^X-NotSocketActivated=true' <<<"$text"; then
    in_twin systemctl stop "$unit"
    # shellcheck disable=SC2046 # one word per socket unit
    in_twin systemctl restart $(sed -n 's/^Sockets=//p' <<<"$text")
  else
    in_twin systemctl restart "$unit"
  fi
}
anchor_of() {
  case "$1" in
    brokerd) echo broker-config-invalid ;;
    inferproxy) echo inferproxy-config-invalid ;;
    gatewayd) echo gateway-config-invalid ;;
    loopd) echo loopd-config-refused ;;
    memoryd) echo memoryd-config-invalid ;;
    channeld) echo channel-config-invalid ;;
    *) fail "no configuration anchor known for $1" ;;
  esac
}
for i in "${!daemons[@]}"; do
  d="${daemons[$i]}"
  u="${services[$i]}"
  conf="$(jq -r --arg d "$d" '.services[] | select(.daemon == $d) | .config' "$manifest")"
  cp "$root$conf" "$twin/$d.toml.good"
  since="$(in_twin date +%s)"
  printf '\n[no_such_table]\nkey = 1\n' >>"$root$conf"
  if switch_unit "$u" >/dev/null 2>&1; then
    fail "a switch to a configuration $d refuses succeeded; $u is $(in_twin systemctl is-active "$u" || true)"
  fi
  anchor="$(anchor_of "$d")"
  journal() { in_twin journalctl --no-pager -o cat --since="@$since" "RUNBOOK=$anchor" "SYSLOG_IDENTIFIER=$d" | grep -q .; }
  wait_for "journalctl RUNBOOK=$anchor SYSLOG_IDENTIFIER=$d" 15 journal
  cp "$twin/$d.toml.good" "$root$conf"
  in_twin systemctl reset-failed "$u" || true
  switch_unit "$u" || fail "the switch back to $d's good configuration failed"
  wait_for "$u to be active again" 30 in_twin systemctl is-active "$u"
  say "$d: a refused configuration fails the switch; journalctl RUNBOOK=$anchor finds it; the good one brings it back"
done

# --- 3. SIGKILL: systemd brings each daemon back, the chain verified -------------------------
for u in "${services[@]}"; do
  pid="$(in_twin systemctl show -p MainPID --value "$u")"
  [[ "$pid" != 0 ]] || fail "$u has no main process"
  in_twin systemctl kill --signal=SIGKILL "$u"
  back() {
    local now
    now="$(in_twin systemctl show -p MainPID --value "$u")"
    [[ "$now" != 0 && "$now" != "$pid" ]] && in_twin systemctl is-active "$u"
  }
  wait_for "$u to come back after SIGKILL" 30 back
  as_owner bxctl audit verify >/dev/null || fail "after $u was killed the audit chain does not verify: $(as_owner bxctl audit verify 2>&1)"
  say "$u: killed with SIGKILL, back as pid $(in_twin systemctl show -p MainPID --value "$u"), the chain verified"
done

# --- 4. socket activation: loopd starts on its first connection -----------------------------
loop_unit="$(jq -r '.services[] | select(.daemon == "loopd") | .unit' "$manifest")"
loop_sock="$(jq -r '.sockets[] | select(.name == "loop") | .path' "$manifest")"
in_twin systemctl stop "$loop_unit"
[[ "$(in_twin systemctl is-active "$loop_unit" || true)" != active ]] || fail "$loop_unit still active after stop"
in_twin test -S "$loop_sock" || fail "$loop_sock is gone with $loop_unit stopped"
out="$(as_owner bxctl chat --new --session twin-activation "hello" 2>&1)" ||
  fail "the first connection on loop.sock did not start $loop_unit: $out"
in_twin systemctl is-active "$loop_unit" >/dev/null || fail "$loop_unit is not active after a connection on loop.sock"
say "loopd: stopped, then started by its first connection on loop.sock"

# --- 5. two chat turns as the owner ---------------------------------------------------------
t1="$(as_owner bxctl chat --new --session twin-chat "hello" 2>&1)" || fail "chat turn 1: $t1"
grep -q "Hello!" <<<"$t1" || fail "chat turn 1 did not answer hello: $t1"
t2="$(as_owner bxctl chat --session twin-chat "What time is it?" 2>&1)" || fail "chat turn 2: $t2"
grep -q "time_now" <<<"$t2" || fail "chat turn 2 made no time_now call: $t2"
say "two chat turns as $owner through bxctl chat"

# Each session ran in a worker of its own under loopd's unit: a child of the monitor, as
# bx-loop, with no new privileges and its own seccomp filter on the monitor's (and systemd's).
monitor="$(in_twin systemctl show -p MainPID --value "$loop_unit")"
workers="$(in_twin sh -c "for p in /proc/[0-9]*; do [ \"\$(awk '/^PPid:/ {print \$2}' \$p/status 2>/dev/null)\" = $monitor ] && tr '\\0' ' ' <\$p/cmdline | grep -q ' worker ' && echo \${p#/proc/}; done; true")"
n_workers="$(wc -w <<<"$workers")"
[ "$n_workers" -ge 2 ] || fail "loopd ($monitor) runs $n_workers session workers after two sessions' turns, not 2: [$workers]"
loop_uid="$(in_twin id -u bx-loop)"
monitor_filters="$(in_twin awk '/^Seccomp_filters:/ {print $2}' "/proc/$monitor/status")"
for w in $workers; do
  st="$(in_twin cat "/proc/$w/status")"
  grep -qE "^Uid:\s+$loop_uid\s" <<<"$st" || fail "loopd's worker $w does not run as bx-loop: $(grep ^Uid: <<<"$st")"
  grep -qE '^NoNewPrivs:\s+1$' <<<"$st" || fail "loopd's worker $w may gain privileges"
  grep -qE '^Seccomp:\s+2$' <<<"$st" || fail "loopd's worker $w has no seccomp filter"
  f="$(awk '/^Seccomp_filters:/ {print $2}' <<<"$st")"
  [ "$f" -gt "$monitor_filters" ] || fail "loopd's worker $w has $f seccomp filters, no more than the monitor's $monitor_filters"
  in_twin grep -q "$loop_unit" "/proc/$w/cgroup" || fail "loopd's worker $w is not in $loop_unit"
done
say "loopd: $n_workers session workers under $loop_unit, each as bx-loop, NoNewPrivs, $((monitor_filters + 1))+ seccomp filters (the monitor has $monitor_filters)"

# --- 6. a workspace root and the run tool under brokerd's unit -------------------------------
# `services.boxmaker.settings.brokerd.run` with a workspace root, as an owner would set them: a
# program from the store (the unit lets nothing else execute), run by a scripted turn. It reads
# the root and is refused /etc by its own Landlock; the unit's RestrictNamespaces= leaves it
# without a network namespace of its own, which brokerd says once (seccomp still refuses it
# every network socket); the chain verifies.
tools=/nix/store/twin00000000000000000000000000000-run-tools
mkdir -p "$root$tools/bin" "$root/srv/twin-notes"
cp "$root/usr/bin/cat" "$root$tools/bin/cat"
patchelf --set-interpreter "$libs/lib/$(basename "$interp")" --set-rpath "$libs/lib" "$root$tools/bin/cat"
echo "twin notes: hello from the owner" >"$root/srv/twin-notes/hello.txt"
brokerd_conf="$(jq -r '.services[] | select(.daemon == "brokerd") | .config' "$manifest")"
cp "$root$brokerd_conf" "$twin/brokerd.toml.before-run"
printf '\n[run]\npath = ["%s/bin"]\nprograms = ["cat"]\n\n[[workspace.roots]]\npath = "/srv/twin-notes"\nclass = "private"\n' \
  "$tools" >>"$root$brokerd_conf"
script="$pkg/share/boxmaker/twin-run-script.toml"
python3 - "$repo/crates/inferproxy/scripts/default.toml" "$root$script" <<'EOF2'
import sys
text = open(sys.argv[1]).read()
first = text.index("[[rule]]")
second = text.index("[[rule]]", first + 1)
rule = r"""[[rule]]
user = "(?i)\\brun cat\\b"
text = "Let me run cat."
tool_calls = [{ tool = "run", args = { argv = ["cat", "/srv/twin-notes/hello.txt", "/etc/boxmaker/brokerd.toml"], cwd = "/srv/twin-notes" } }]

[[rule]]
user = "(?i)\\bread the notes\\b"
text = "Let me read them."
tool_calls = [{ tool = "workspace_read", args = { path = "/srv/twin-notes/hello.txt" } }]

"""
open(sys.argv[2], "w").write(text[:second] + rule + text[second:])
EOF2
infer_conf="$(jq -r '.services[] | select(.daemon == "inferproxy") | .config' "$manifest")"
sed -i "s|^\"script\" = .*|\"script\" = \"$script\"|" "$root$infer_conf"
grep -qF "$script" "$root$infer_conf" || fail "the twin's inferproxy.toml names no script to replace"
since="$(in_twin date +%s)"
for d in brokerd inferproxy; do
  u="$(jq -r --arg d "$d" '.services[] | select(.daemon == $d) | .unit' "$manifest")"
  switch_unit "$u" || fail "$u did not start with the run tool configured: $(in_twin journalctl --no-pager -o cat -u "$u" -n 20)"
  wait_for "$u to be active with the run tool configured" 30 in_twin systemctl is-active "$u"
done
# The unit's RestrictSUIDSGID= refuses openat2 (ENOSYS): brokerd walks beneath the root itself.
t3="$(as_owner bxctl chat --new --session twin-read "read the notes" 2>&1)" || fail "the read turn: $t3"
grep -qF "twin notes: hello from the owner" <<<"$t3" || fail "workspace_read did not read the root under brokerd's unit: $t3"
t3="$(as_owner bxctl chat --new --session twin-run "run cat" 2>&1)" || fail "the run turn: $t3"
grep -qF "twin notes: hello from the owner" <<<"$t3" || fail "the run tool did not read the workspace root: $t3"
grep -qF "/etc/boxmaker/brokerd.toml: Permission denied" <<<"$t3" ||
  fail "the run tool's program was not refused /etc by its sandbox: $t3"
namespace() {
  in_twin journalctl --no-pager -o cat --since="@$since" RUNBOOK=run-no-network-namespace SYSLOG_IDENTIFIER=brokerd | grep -q .
}
wait_for "journalctl RUNBOOK=run-no-network-namespace SYSLOG_IDENTIFIER=brokerd" 15 namespace
as_owner bxctl audit verify >/dev/null || fail "after the run turn the audit chain does not verify: $(as_owner bxctl audit verify 2>&1)"
say "workspace_read read a root under brokerd's unit (openat2 refused by RestrictSUIDSGID=; the walk beneath the root instead)"
say "run: a program from the store ran under brokerd's unit, read its root, was refused /etc; no network namespace of its own (said once, RUNBOOK=run-no-network-namespace); the chain verified"

# --- 7. the Matrix channel, when the host has a Synapse ---------------------------------------
if [[ -n "$matrix_json" ]]; then
  mx() { python3 "$matrix_py" "$SYNAPSE_URL" "$@"; }
  joined() { [[ "$(mx member "$mx_owner_token" "$mx_room" "$bot_id")" == join ]]; }
  wait_for "channeld to join the owner's room" 60 joined
  syncing() { as_owner bxctl channel status | grep -q "syncing with"; }
  wait_for "bxctl channel status to say channeld syncs" 60 syncing
  code="$(as_owner bxctl channel pair --room "$mx_room" --json | jq -r .code)"
  mx say "$mx_owner_token" "$mx_room" "$code" >/dev/null
  paired() { mx bodies "$mx_owner_token" "$mx_room" | grep -q "^$bot_id Paired:"; }
  wait_for "the pairing to be confirmed in the room" 60 paired
  mx say "$mx_owner_token" "$mx_room" "hello from the phone" >/dev/null
  answered() { mx bodies "$mx_owner_token" "$mx_room" | grep -q "^$bot_id Hello!"; }
  wait_for "the owner's message to be answered in the room" 60 answered
  if grep -rqF "$bot_token" "$root/etc/boxmaker"/*.toml; then fail "the Matrix token is in a configuration file"; fi
  pid="$(in_twin systemctl show -p MainPID --value boxmaker-channeld.service)"
  if in_twin cat "/proc/$pid/environ" | tr '\0' '\n' | grep -qF "$bot_token"; then
    fail "the Matrix token is in channeld's environment"
  fi
  if in_twin cat "/proc/$pid/cmdline" | tr '\0' ' ' | grep -qF "$bot_token"; then
    fail "the Matrix token is in channeld's command line"
  fi
  if in_twin journalctl --no-pager -o cat | grep -qF "$bot_token"; then fail "the Matrix token is in the journal"; fi
  say "matrix: channeld under its unit, paired by bxctl channel pair, the owner's message answered in the room; the token in no config, command line, environment or journal"
else
  say "matrix: no SYNAPSE_URL, so the twin has no channeld (.ci/synapse-up brings a Synapse up)"
fi

# --- 8. the device check once more, kept for docs/install.md -------------------------------
out="$(check 2>&1)" || fail "the device check failed at the end:"$'\n'"$out"
printf '%s\n' "$out" >"$twin/check.txt"
check --json >"$twin/check.json" || fail "bxctl check --json failed"
say "device check again: $(tail -n 1 <<<"$out") (kept in target/twin/check.txt)"
say "ok"

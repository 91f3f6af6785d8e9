# The VM test (`nix flake check` runs it as checks.<system>.vm): boot a machine with the
# module and check what nix.md and hardening.md promise on a real device.
#
#   - every socket unit listens; every directory and socket has its mode and owner
#   - each socket answers `ping` for its client; another user cannot even connect (file
#     modes), and root, who passes the file modes, is refused by the daemon's peer check
#   - every daemon's main process runs with no capabilities, no_new_privs and seccomp
#   - `bxctl selftest` as the owner, and the selftest unit itself
#   - `systemd-analyze security --threshold=15` for every service unit (exposure <= 1.5)
#   - the serving notices in the journal
#   - a configuration loopd refuses fails `switch-to-configuration` and names the unit, and
#     the good one comes back (units.nix: Type=notify, X-NotSocketActivated=true)
#   - bxharden's sandbox cases as root on the VM's kernel, including those the Nix build
#     sandbox skips on an older builder kernel (Landlock ABI 6)
#
# Called from the flake with the module itself (not nixosModules.default: runNixOSTest gives
# the node the flake's pkgs, which already carry the overlay) and those pkgs.
{
  boxmakerModule,
  pkgs,
  # bxharden's sandbox test binary (the flake's packages.<system>.sandbox-tests).
  sandboxTests,
}:
let
  units = import ./units.nix;
  home = "/var/lib/boxmaker";
  owner = "alice";
  ownerGroup = "users";
  client = units.clientOf {
    ownerUser = owner;
    inherit ownerGroup;
  };

  socketFacts = map (name: {
    inherit name;
    unit = units.socketUnit name;
    path = units.socketPath name;
    server = units.sockets.${name}.server;
    inherit (client name) user group;
  }) units.socketNames;

  directoryFacts = units.directories {
    inherit home ownerGroup;
    ownerUser = owner;
  };

  serviceUnits = map units.serviceUnit units.daemonNames ++ [ "boxmaker-selftest.service" ];

  # One `ping` frame (protocol.md: 4-byte big-endian length, then the JSON envelope);
  # prints the reply's `msg`.
  ping = pkgs.writeText "bxping.py" ''
    import json, socket, struct, sys

    def read_exact(s, n):
        buf = b""
        while len(buf) < n:
            chunk = s.recv(n - len(buf))
            if not chunk:
                sys.exit("closed after %d of %d bytes" % (len(buf), n))
            buf += chunk
        return buf

    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(sys.argv[1])
    body = json.dumps({"v": 1, "id": 1, "final": True, "msg": {"kind": "ping"}}).encode()
    s.sendall(struct.pack(">I", len(body)) + body)
    (n,) = struct.unpack(">I", read_exact(s, 4))
    print(json.dumps(json.loads(read_exact(s, n))["msg"]))
  '';
in
{
  name = "boxmaker";

  nodes.machine = {
    imports = [ boxmakerModule ];

    users.users.${owner} = {
      isNormalUser = true;
      group = ownerGroup;
    };
    users.users.mallory.isNormalUser = true;

    security.polkit.enable = true;

    services.boxmaker = {
      enable = true;
      inherit owner;
    };

    environment.systemPackages = [ pkgs.python3 ];

    # The same machine with a key loopd does not know: its start must fail, and the switch.
    system.switch.enable = true;
    specialisation.refused.configuration = {
      services.boxmaker.settings.loopd.loop.no_such_key = true;
    };
  };

  testScript = ''
    import json

    sockets = json.loads('${builtins.toJSON socketFacts}')
    directories = json.loads('${builtins.toJSON directoryFacts}')
    services = json.loads('${builtins.toJSON serviceUnits}')
    daemons = json.loads('${builtins.toJSON units.daemonNames}')

    def ping(user, path):
        prefix = "" if user == "root" else f"runuser -u {user} -- "
        return machine.execute(f"{prefix}python3 ${ping} {path} 2>&1")

    start_all()
    machine.wait_for_unit("multi-user.target")

    with subtest("every socket listens, 0600, owned by its client, in a 0700 directory"):
        for s in sockets:
            machine.wait_for_unit(s["unit"])
            machine.wait_for_file(s["path"])
            got = machine.succeed(f"stat -c '%a %U %G %F' {s['path']}").strip()
            assert got == f"600 {s['user']} {s['group']} socket", f"{s['path']}: {got}"

    with subtest("every directory has its mode and owner"):
        for d in directories:
            got = machine.succeed(f"stat -c '%a %U %G' {d['path']}").strip()
            want = f"{int(d['mode'], 8):o} {d['user']} {d['group']}"
            assert got == want, f"{d['path']}: {got}, want {want}"

    with subtest("every daemon is running"):
        for d in daemons:
            machine.wait_for_unit(f"boxmaker-{d}.service")

    with subtest("each socket answers its client"):
        for s in sockets:
            status, out = ping(s["user"], s["path"])
            assert status == 0 and '"pong"' in out and s["server"] in out, f"{s['path']} as {s['user']}: {out}"

    with subtest("another user cannot connect: the file modes refuse"):
        for s in sockets:
            status, out = ping("mallory", s["path"])
            assert status != 0 and "Permission denied" in out, f"{s['path']} as mallory: {out}"

    with subtest("root passes the file modes and the daemon's peer check refuses it"):
        for s in sockets:
            status, out = ping("root", s["path"])
            assert "forbidden" in out and '"pong"' not in out, f"{s['path']} as root: {out}"
        machine.wait_until_succeeds("journalctl RUNBOOK=socket-peer-refused --grep 'refused a connection from uid 0'", timeout=30)

    with subtest("every daemon runs with no capabilities, no_new_privs and seccomp"):
        for d in daemons:
            pid = machine.succeed(f"systemctl show -p MainPID --value boxmaker-{d}.service").strip()
            status = machine.succeed(f"cat /proc/{pid}/status")
            for line in ["NoNewPrivs:\t1", "Seccomp:\t2", "CapEff:\t0000000000000000",
                         "CapPrm:\t0000000000000000", "CapBnd:\t0000000000000000",
                         "CapAmb:\t0000000000000000"]:
                assert line in status, f"{d}: no '{line}' in /proc/{pid}/status"

    with subtest("the selftest passes, as its unit and through bxctl as the owner"):
        machine.succeed("systemctl start boxmaker-selftest.service")
        machine.succeed("runuser -u ${owner} -- bxctl selftest")

    with subtest("every service unit's exposure is at most 1.5"):
        for u in services:
            machine.succeed(f"systemd-analyze security --threshold=15 {u}")

    with subtest("a configuration loopd refuses fails the switch, and the good one comes back"):
        status, out = machine.execute("/run/booted-system/specialisation/refused/bin/switch-to-configuration test 2>&1")
        assert status != 0 and "boxmaker-loopd.service" in out, f"switch to the refused configuration: status {status}: {out}"
        # Its restarts while refused count against StartLimitBurst; start afresh.
        machine.succeed("systemctl reset-failed boxmaker-loopd.service")
        machine.succeed("/run/booted-system/bin/switch-to-configuration test")
        machine.wait_for_unit("boxmaker-loopd.service")
        machine.wait_for_file("${units.socketPath "loop"}")

    with subtest("bxharden's sandbox cases run as root on this kernel, none skipped for its Landlock ABI"):
        out = machine.succeed("cd /tmp && ${sandboxTests}/bin/bxharden-sandbox-tests 2>&1")
        assert "needs Landlock ABI" not in out and "test result: ok" in out, out

    with subtest("the serving notices are in the journal"):
        machine.wait_until_succeeds("journalctl -u boxmaker-brokerd.service --grep 'serving tools on .*broker.sock and approvals on .*admin.sock'", timeout=30)
        machine.wait_until_succeeds("journalctl -u boxmaker-brokerd.service --grep 'serving session state on .*state.sock'", timeout=30)
        for d in daemons:
            machine.wait_until_succeeds(f"journalctl SYSLOG_IDENTIFIER={d} --grep 'serving'", timeout=30)
  '';
}

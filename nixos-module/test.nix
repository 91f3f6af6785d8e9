# The VM test (`nix flake check` runs it as checks.<system>.vm): boot a machine with the
# module and run the device check the owner runs after each switch, `bxctl check` (docs/
# install.md), rather than a second copy of it here. The check reads what the module installed
# (/etc/boxmaker/device.json) and proves, one line each: every unit active; every daemon's
# every thread under seccomp, no_new_privs, no capabilities, its own uid; every directory and
# socket with its mode and owner, nothing writable by another user; another user refused by the
# file modes and root by each daemon's peer check, the refusal in the journal; ping on every
# socket, tools_list, one scripted turn, the audit chain; `systemd-analyze security` of every
# unit within the module's target. Then what only this test covers: the check fails when a
# directory is loosened; the owner's first boot as NixOS gives it, without polkit (this test
# does not enable it) and without sudo: `bxctl check` and `bxctl selftest` as the owner through
# their on-demand units, the owner reading the runbook's lines in the journal, the owner's
# system prompt installed by loopd's unit as loopd's 0600 system.md; a unit's
# IPAddressDeny= and SocketBindDeny= refusing its own processes (egress-probe.py in the unit's
# cgroup); a configuration loopd refuses at start fails `switch-to-configuration` and names the
# unit and the good one comes back (units.nix: Type=notify, notSocketActivated); bxharden's
# sandbox cases as root on the VM's kernel (including those the Nix build sandbox skips on an
# older builder kernel, Landlock ABI 6); and the serving notices. A configuration refused at
# build time is the flake's `config-refused-at-build` check.
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
  owner = "alice";
  ownerGroup = "users";
  # The machine has no Matrix channel, so no channeld (default.nix's `without`).
  running = units.runningDaemons [ "channeld" ];
  services = map units.serviceUnit running;
  stateDir = units.stateDir "/var/lib/boxmaker" "loopd";
  systemPrompt = "The owner of this machine likes short answers.";
in
{
  name = "boxmaker";

  nodes.machine = {
    imports = [ boxmakerModule ];

    users.users.${owner} = {
      isNormalUser = true;
      group = ownerGroup;
    };

    services.boxmaker = {
      enable = true;
      inherit owner systemPrompt;
    };

    # The same machine with a key loopd does not know: its start must fail, and the switch. The
    # build-time check would refuse it before that (validateConfigs); it is off here so that the
    # switch is what refuses it, as it does for a configuration only the device can refuse.
    system.switch.enable = true;
    specialisation.refused.configuration = {
      services.boxmaker.validateConfigs = false;
      services.boxmaker.settings.loopd.loop.no_such_key = true;
    };
  };

  testScript = ''
    import json

    services = json.loads('${builtins.toJSON services}')

    start_all()
    machine.wait_for_unit("multi-user.target")
    for u in services:
        machine.wait_for_unit(u)

    with subtest("the device check passes, every line ok"):
        out = machine.succeed("bxctl check")
        print(out)
        bad = [l for l in out.splitlines() if l.startswith("FAIL") or l.startswith("skip")]
        assert not bad, f"lines not ok: {bad}"
        report = json.loads(machine.succeed("bxctl check --json"))
        assert report["ok"] and all(c["result"] == "ok" for c in report["checks"]), report

    with subtest("the device check fails when a directory is loosened"):
        machine.succeed("chmod 0755 ${stateDir}")
        status, out = machine.execute("bxctl check")
        assert status == 1, f"bxctl check exited {status} with ${stateDir} at 0755"
        assert "FAIL directory ${stateDir}: mode 0755, not 0700" in out, out
        machine.succeed("chmod 0700 ${stateDir}")
        machine.succeed("bxctl check")

    with subtest("the owner's first boot: the check and the selftest as the owner, the journal"):
        out = machine.succeed("runuser -u ${owner} -- bxctl check")
        print(out)
        bad = [l for l in out.splitlines() if l.startswith("FAIL") or l.startswith("skip")]
        assert not bad, f"the owner's check has lines not ok: {bad}"
        status, out = machine.execute("runuser -u nobody -- bxctl check 2>&1")
        assert status != 0 and "is not yours to open" in out, f"someone not the owner ran the check: {status}: {out}"
        out = machine.succeed("runuser -u ${owner} -- bxctl selftest")
        assert "selftest: ok" in out and "boxmaker-selftest@.service, as loopd's user" in out, out
        assert "loopd finds inferproxy" in out, out
        machine.succeed("runuser -u ${owner} -- journalctl --no-pager RUNBOOK=socket-peer-refused --grep refused")
        assert machine.succeed("stat -c '%a %U %G' ${units.keysDir}").strip() == "700 root root"
        prompt = "${units.systemPromptPath "/var/lib/boxmaker"}"
        assert machine.succeed(f"stat -c '%a %U' {prompt}").strip() == "600 bx-loop", prompt
        assert machine.succeed(f"cat {prompt}").strip() == "${systemPrompt}", prompt

    with subtest("egress: a unit's IPAddressDeny= and SocketBindDeny= refuse its own processes"):
        for d in ["gatewayd", "inferproxy"]:
            cg = machine.succeed(f"systemctl show -p ControlGroup --value boxmaker-{d}.service").strip()
            got = json.loads(machine.succeed(f"${pkgs.python3}/bin/python3 ${./egress-probe.py} /sys/fs/cgroup{cg}"))
            assert got["control"] == {"tcp": "ok", "udp": "ok"}, got
            u = got["unit"]
            assert u["udp"] == "EPERM" and u["tcp"] != "ok" and u["bind"] == "EPERM", f"boxmaker-{d}.service: {got}"

    with subtest("a configuration loopd refuses fails the switch, and the good one comes back"):
        status, out = machine.execute("/run/booted-system/specialisation/refused/bin/switch-to-configuration test 2>&1")
        assert status != 0 and "boxmaker-loopd.service" in out, f"switch to the refused configuration: status {status}: {out}"
        # Its restarts while refused count against StartLimitBurst; start afresh.
        machine.succeed("systemctl reset-failed boxmaker-loopd.service")
        machine.succeed("/run/booted-system/bin/switch-to-configuration test")
        machine.wait_for_unit("boxmaker-loopd.service")
        machine.wait_for_file("${units.socketPath "loop"}")
        machine.succeed("bxctl check")

    with subtest("bxharden's sandbox cases run as root on this kernel, none skipped for its Landlock ABI"):
        out = machine.succeed("cd /tmp && ${sandboxTests}/bin/bxharden-sandbox-tests 2>&1")
        assert "needs Landlock ABI" not in out and "test result: ok" in out, out

    with subtest("the serving notices are in the journal"):
        for d in json.loads('${builtins.toJSON running}'):
            machine.wait_until_succeeds(f"journalctl SYSLOG_IDENTIFIER={d} --grep 'serving'", timeout=30)
  '';
}

# Everything the device twin (`make twin`, tests/twin/run.sh) installs into its Debian root,
# rendered from the module's own definitions with builtins only (Debian's Nix 2.8, no
# nixpkgs): the unit files (offline.nix's rendering of units.nix), the tmpfiles.d and
# sysusers.d lines (units.nix's directories and users), each daemon's configuration
# (configs.nix with the module's option defaults) and the device check's manifest (what the
# module installs as /etc/boxmaker/device.json). Nothing here is a second copy of a unit.
#
#   nix-instantiate --eval --strict --json twin.nix --argstr package /nix/store/...-boxmaker
#
# The owner is `boxowner` (group `users`), as in the offline check; the package is the
# twin's installed binaries; configurations live where the module puts them, /etc/boxmaker.
#
# `matrix` (a JSON string, empty for none): { homeserver, user, owners, rooms } of a Matrix
# channel on a homeserver the twin reaches (the host's Synapse, through the twin's loopback),
# whose token twin.sh puts where a key placed by hand goes (/var/lib/boxmaker-keys/matrix-token);
# without it the twin has no channeld. `systemPrompt` and `install` (twin.sh gives both; empty:
# offline.nix's placeholders): the owner's system prompt as a file in the twin's store and the
# coreutils `install` loopd's unit copies it with.
{
  package,
  matrix ? "",
  systemPrompt ? "",
  install ? "",
}:
let
  channel = if matrix == "" then null else builtins.fromJSON matrix;
  units = import ./units.nix;
  defaults = import ./defaults.nix;
  confdir = "/etc/boxmaker";
  ownerUser = "boxowner";
  ownerGroup = "users";
  inherit (defaults) home;

  defaultScript = "${package}/share/boxmaker/inferproxy-default-script.toml";

  # The units exactly as the module renders them (offline.nix: units.nix's renderDevice on the
  # configurations below, as NixOS's options, written as systemd-lib writes them).
  unitTexts = import ./offline.nix {
    bindir = "${package}/bin";
    inherit confdir defaultScript;
    matrix = channel;
    systemPrompt = if systemPrompt == "" then null else systemPrompt;
    install = if install == "" then null else install;
  };

  lines = builtins.concatStringsSep "";

  tmpfiles = lines (
    map (d: "d ${d.path} ${d.mode} ${d.user} ${d.group} -\n") (
      units.directories { inherit home ownerUser ownerGroup; }
    )
  );

  # Static system users, each with its own group, no shell and no home (nix.md).
  sysusers = lines (
    map (u: "u ${u} - \"${units.userDescription u}\" - -\n") (builtins.attrNames units.users)
  );

  configs = import ./configs.nix {
    inherit home ownerUser;
    inherit (defaults) inference tools;
    inherit defaultScript;
    matrix = channel;
  };
  # The owner's groups the module adds (default.nix's ownerReadsJournal).
  ownerGroups = if defaults.ownerReadsJournal then [ "systemd-journal" ] else [ ];
in
{
  units = unitTexts;
  inherit tmpfiles sysusers configs ownerGroups;
  manifest = units.deviceManifest {
    inherit home ownerUser ownerGroup;
    configFile = d: "${confdir}/${d}.toml";
    without = if channel == null then [ "channeld" ] else [ ];
  };
}

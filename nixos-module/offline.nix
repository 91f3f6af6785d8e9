# Renders every unit of units.nix to unit-file text with builtins only, for the offline
# check (check-offline.sh): no nixpkgs needed, so it runs on Debian's Nix 2.8 in CI.
#
# The text follows NixOS's own rendering of serviceConfig / socketConfig / unitConfig
# (systemd-lib's attrsToSection): keys sorted, a list gives one line per item, booleans
# are "true"/"false". What NixOS adds on top (Environment=PATH, X-Restart-Triggers)
# carries no hardening.
#
#   nix-instantiate --eval --strict --json offline.nix --argstr bindir D --argstr confdir C \
#     --argstr variant default|full
#
# `default` is the module with only `enable` and `owner` set; `full` adds an API key
# credential and broker workspace roots, one of them writable and under /home.
#
# `matrix` (the twin's, a JSON object { homeserver }) gives channeld its token as the
# credential and its IP reach; without it the twin renders no channeld unit (`twin = true`), as
# the module does without services.boxmaker.channels.matrix.
{
  bindir,
  confdir,
  variant ? "default",
  twin ? false,
  matrix ? null,
}:
let
  units = import ./units.nix;
  home = "/var/lib/boxmaker";

  full = variant == "full";

  value =
    v:
    if builtins.isBool v then
      (if v then "true" else "false")
    else
      toString v;

  section =
    name: keys:
    let
      lines = builtins.concatLists (
        map (
          k:
          let
            v = keys.${k};
          in
          map (x: "${k}=${value x}\n") (if builtins.isList v then v else [ v ])
        ) (builtins.attrNames keys)
      );
    in
    if lines == [ ] then "" else "[${name}]\n" + builtins.concatStringsSep "" lines + "\n";

  text =
    unit:
    section "Unit" (unit.Unit or { })
    + section "Service" (unit.Service or { })
    + section "Socket" (unit.Socket or { })
    + section "Install" (unit.Install or { });

  rendered = units.render {
    inherit home;
    runbook = "${confdir}/runbook.md";
    ownerUser = "boxowner";
    ownerGroup = "users";
    exe = daemon: "${bindir}/${daemon}";
    configFile = daemon: "${confdir}/${daemon}.toml";
    without = if twin && matrix == null then [ "channeld" ] else [ ];
    credentials =
      (if full then { inferproxy = [ "api_key:/run/keys/boxmaker-api-key" ]; } else { })
      // (if matrix == null then { } else { channeld = [ "matrix_token:${confdir}/matrix-token" ]; });
    extraReadWritePaths = if full then { brokerd = [ "/home/boxowner/projects" ]; } else { };
    readOnlyHome = if full then { brokerd = true; } else { };
    # The full variant's provider names an address: inferproxy's unit allows it alone.
    ipAddresses =
      (if full then { inferproxy = units.ipAddressesOfProvider "http://192.168.1.5:8080/v1"; } else { })
      // (if matrix == null then { } else { channeld = units.ipAddressesOfProvider matrix.homeserver; });
  };
in
builtins.mapAttrs (_: text) rendered

# The module's `config` (default.nix) evaluated with builtins only, for the offline check
# (check-offline.sh): a stand-in for the few nixpkgs `lib` functions default.nix calls, and a
# configuration as the module system would hand it over (the options at their defaults, the
# owner declared). Not NixOS: no merging, priorities or types; what it catches is a wrong
# name or shape in default.nix's wiring (unit names, serviceConfig, tmpfiles, assertions),
# which nothing else here evaluates. `nix flake check` evaluates the real thing.
#
#   nix-instantiate --eval --strict --json offline-module.nix --argstr owner NAME \
#     [--arg declareOwner false] [--arg roots '[ { path = "/home/NAME/p"; } ]']
{
  owner ? "alice",
  declareOwner ? true,
  # brokerd's [[workspace.roots]], as settings.brokerd.workspace.roots would hold them.
  roots ? [ ],
}:
let
  defaults = import ./defaults.nix;

  lib = rec {
    mkOption = x: x;
    mkEnableOption = x: x;
    mkPackageOption = _: _: _: null;
    literalExpression = x: x;
    types = { };
    mkIf = cond: v: if cond then v else { };
    mkDefault = v: v;
    any = builtins.any;
    filter = builtins.filter;
    concatStringsSep = builtins.concatStringsSep;
    listToAttrs = builtins.listToAttrs;
    mapAttrs = builtins.mapAttrs;
    optional = c: v: if c then [ v ] else [ ];
    nameValuePair = name: value: { inherit name value; };
    genAttrs = names: f: listToAttrs (map (n: nameValuePair n (f n)) names);
    filterAttrs =
      pred: set:
      listToAttrs (
        map (n: nameValuePair n set.${n}) (builtins.filter (n: pred n set.${n}) (builtins.attrNames set))
      );
    mapAttrs' = f: set: listToAttrs (map (n: f n set.${n}) (builtins.attrNames set));
    mapAttrsRecursive =
      f: set:
      builtins.mapAttrs (n: v: if builtins.isAttrs v then mapAttrsRecursive f v else f [ n ] v) set;
    hasPrefix = p: s: builtins.substring 0 (builtins.stringLength p) s == p;
    hasSuffix =
      x: s:
      let
        ls = builtins.stringLength s;
        lx = builtins.stringLength x;
      in
      ls >= lx && builtins.substring (ls - lx) lx s == x;
    removeSuffix =
      x: s:
      if hasSuffix x s then builtins.substring 0 (builtins.stringLength s - builtins.stringLength x) s else s;
    getExe' = pkg: name: "${pkg}/bin/${name}";
  };

  pkgs = {
    formats.toml = _: {
      type = null;
      generate = name: value: "/nix/store/generated-${name}";
    };
  };

  package = "/nix/store/boxmaker";

  # What the module system would make of services.boxmaker with only enable and owner set:
  # every option at its default, settings.<daemon> the generated values (mkDefault).
  boxmaker = {
    enable = true;
    inherit owner package;
    inherit (defaults) home tools;
    inference = defaults.inference;
    settings = generated // {
      brokerd = generated.brokerd // {
        workspace.roots = roots;
      };
    };
  };
  generated = import ./configs.nix {
    inherit (defaults) home tools;
    ownerUser = owner;
    inference = defaults.inference;
    defaultScript = "${package}/share/boxmaker/inferproxy-default-script.toml";
  };

  config = {
    services.boxmaker = boxmaker;
    users.users =
      (
        if declareOwner then
          {
            ${owner} = {
              group = "users";
              home = "/home/${owner}";
              homeMode = "700";
              createHome = true;
            };
          }
        else
          { }
      )
      // {
        root = {
          group = "root";
          home = "/root";
          homeMode = "700";
          createHome = true;
        };
      };
    security.polkit.enable = true;
  };

  module = import ./default.nix { inherit config lib pkgs; };
  c = module.config;
in
{
  services = builtins.attrNames c.systemd.services;
  sockets = builtins.attrNames c.systemd.sockets;
  # [Service] keys switch-to-configuration reads, per service.
  switch = builtins.mapAttrs (_: s: {
    type = s.serviceConfig.Type;
    notSocketActivated = s.serviceConfig.X-NotSocketActivated or false;
  }) c.systemd.services;
  tmpfiles = builtins.attrNames c.systemd.tmpfiles.settings."10-boxmaker";
  failedAssertions = map (a: a.message) (builtins.filter (a: !a.assertion) c.assertions);
  etc = builtins.attrNames c.environment.etc;
}

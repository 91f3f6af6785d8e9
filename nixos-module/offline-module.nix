# The module (default.nix) evaluated with builtins only, for the offline check
# (check-offline.sh): a stand-in for the nixpkgs `lib` functions default.nix calls, and a
# small evaluator of services.boxmaker's options that follows lib/modules.nix where
# default.nix relies on it:
#
#   - an option's definitions: `mkIf` discharged, then only those of the highest priority
#     kept (a plain value 100, `mkDefault` 1000, the option's default 1500), at every level
#     where lib merges (an option, an element of `attrsOf`, a free-form value);
#   - between options (an option set, not an option) `mkIf` and `mkOverride` are pushed down
#     to the attributes, as lib's pushDownProperties does;
#   - `types.submodule` with `freeformType`: keys with an option are merged by it, every other
#     key by the free-form type (TOML: tables merged key by key, lists joined, other values
#     equal or an error), and an unknown key without a free-form type is an error;
#   - `mkRenamedOptionModule` / `mkChangedOptionModule`: a definition of the old option is
#     moved to the new one (through the change function) with the warning lib gives.
#
# Types are checked only as far as the leaf types default.nix uses (str, bool, path, enum,
# nullOr, listOf, positive ints, numbers between). Not NixOS: no other module, no `nix flake check`.
#
#   nix-instantiate --eval --strict --json offline-module.nix --argstr owner NAME \
#     [--arg declareOwner false] [--arg boxmaker '{ settings.inferproxy.provider.kind = "openai"; }']
{
  owner ? "alice",
  declareOwner ? true,
  # More of services.boxmaker, as a configuration would define it.
  boxmaker ? { },
}:
let
  inherit (builtins)
    all
    attrNames
    concatMap
    elem
    filter
    foldl'
    head
    isAttrs
    isFunction
    isList
    length
    mapAttrs
    toJSON
    ;

  leaf = name: check: {
    kind = "leaf";
    inherit name check;
  };

  lib = rec {
    mkOption = o: o // { _type = "option"; };
    mkEnableOption = _: mkOption {
      type = types.bool;
      default = false;
    };
    mkPackageOption = _: _: _: mkOption {
      type = types.package;
      default = package;
    };
    literalExpression = text: {
      _type = "literalExpression";
      inherit text;
    };
    literalMD = text: {
      _type = "literalMD";
      inherit text;
    };
    types = {
      str = leaf "string" builtins.isString;
      bool = leaf "boolean" builtins.isBool;
      package = leaf "package" (_: true);
      path = leaf "path" (v: builtins.substring 0 1 (toString v) == "/");
      # lib.types.externalPath: an absolute path, as a string, not in the Nix store.
      externalPath = leaf "absolute path not in the Nix store" (
        v:
        builtins.isString v
        && builtins.substring 0 1 v == "/"
        && builtins.substring 0 (builtins.stringLength builtins.storeDir + 1) v != "${builtins.storeDir}/"
      );
      lines = leaf "strings concatenated with \"\\n\"" builtins.isString;
      enum = vs: leaf "one of ${toJSON vs}" (v: elem v vs);
      nullOr = t: leaf "null or ${t.name}" (v: v == null || t.check v);
      # A list is one value here (the module defines each list option once), not merged.
      listOf = t: leaf "list of ${t.name}" (v: builtins.isList v && builtins.all t.check v);
      ints.positive = leaf "positive integer" (v: builtins.isInt v && v > 0);
      numbers.between = lo: hi: leaf "number between ${toString lo} and ${toString hi}" (
        v: (builtins.isInt v || builtins.isFloat v) && v >= lo && v <= hi
      );
      attrsOf = elemType: {
        kind = "attrsOf";
        name = "attribute set of ${elemType.name}";
        inherit elemType;
      };
      submodule = module: {
        kind = "submodule";
        name = "submodule";
        inherit module;
      };
    };
    mkIf = condition: content: {
      _type = "if";
      inherit condition content;
    };
    mkOverride = priority: content: {
      _type = "override";
      inherit priority content;
    };
    mkDefault = mkOverride 1000;
    mkRenamedOptionModule = from: to: {
      _rename = {
        inherit from to;
        change = v: v;
      };
    };
    mkChangedOptionModule = from: to: f: {
      _rename = {
        inherit from to;
        change = v: f (setAttrByPath from v);
      };
    };
    isOption = v: isAttrs v && (v._type or "") == "option";
    recursiveUpdateUntil =
      pred: lhs: rhs:
      lhs
      // mapAttrs (
        n: r:
        let
          l = lhs.${n};
        in
        if lhs ? ${n} && isAttrs l && isAttrs r && !(pred [ n ] l r) then
          recursiveUpdateUntil pred l r
        else
          r
      ) rhs;
    recursiveUpdate = recursiveUpdateUntil (_: _: _: false);
    isFunction = builtins.isFunction;
    any = builtins.any;
    filter = builtins.filter;
    concatStringsSep = builtins.concatStringsSep;
    listToAttrs = builtins.listToAttrs;
    mapAttrs = builtins.mapAttrs;
    optional = c: v: if c then [ v ] else [ ];
    optionalAttrs = c: v: if c then v else { };
    nameValuePair = name: value: { inherit name value; };
    genAttrs = names: f: listToAttrs (map (n: nameValuePair n (f n)) names);
    filterAttrs =
      pred: set:
      listToAttrs (
        map (n: nameValuePair n set.${n}) (builtins.filter (n: pred n set.${n}) (builtins.attrNames set))
      );
    filterAttrsRecursive =
      pred: set:
      listToAttrs (
        concatMap (
          n:
          let
            v = set.${n};
          in
          if pred n v then [ (nameValuePair n (if isAttrs v then filterAttrsRecursive pred v else v)) ] else [ ]
        ) (attrNames set)
      );
    mapAttrs' = f: set: listToAttrs (map (n: f n set.${n}) (builtins.attrNames set));
    mapAttrsRecursive =
      f: set:
      builtins.mapAttrs (n: v: if builtins.isAttrs v then mapAttrsRecursive f v else f [ n ] v) set;
    setAttrByPath =
      path: v: if path == [ ] then v else { ${head path} = setAttrByPath (builtins.tail path) v; };
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

  # pkgs.formats.toml: its type is the free-form TOML value; `generate` keeps the value so the
  # check can read what would be written.
  tomlType = {
    kind = "toml";
    name = "TOML value";
  };
  pkgs.formats.toml = _: {
    type = tomlType;
    generate = name: value: {
      outPath = "/nix/store/generated-${name}";
      inherit name value;
    };
  };
  pkgs.cacert = "/nix/store/cacert";
  pkgs.coreutils = "/nix/store/coreutils";
  # pkgs.writeText: a store path that changes with the text, as the real one's does.
  pkgs.writeText =
    name: text: "/nix/store/${builtins.substring 0 32 (builtins.hashString "sha256" text)}-${name}";
  # pkgs.runCommand: what would be built, kept for the check to read.
  pkgs.runCommand = name: env: script: {
    outPath = "/nix/store/runcommand-${name}";
    inherit name env script;
  };
  pkgs.stdenv = {
    buildPlatform.canExecute = _: true;
    hostPlatform = { };
  };

  package = "/nix/store/boxmaker";

  isOption = v: isAttrs v && (v._type or "") == "option";
  typeOf = v: if isAttrs v then v._type or "" else "";

  # lib's dischargeProperties + filterOverrides: the values of one location's definitions.
  discharge =
    defs:
    let
      unwrap =
        prio: v:
        if typeOf v == "if" then
          (if v.condition then unwrap prio v.content else [ ])
        else if typeOf v == "override" then
          unwrap v.priority v.content
        else
          [
            {
              inherit prio;
              value = v;
            }
          ];
      ds = concatMap (unwrap 100) defs;
      best = foldl' (m: d: if d.prio < m then d.prio else m) 10000 ds;
    in
    map (d: d.value) (filter (d: d.prio == best) ds);

  # lib's pushDownProperties at an option set: mkIf and mkOverride moved into the attributes.
  # The condition stays unevaluated (lib's laziness: `config = mkIf cfg.enable` reads cfg).
  pushDown =
    v:
    if typeOf v == "if" then
      mapAttrs (_: lib.mkIf v.condition) (pushDown v.content)
    else if typeOf v == "override" then
      mapAttrs (_: lib.mkOverride v.priority) (pushDown v.content)
    else
      v;

  defsOf = n: defs: map (d: d.${n}) (filter (d: d ? ${n}) defs);
  keysOf = defs: attrNames (foldl' (a: d: a // d) { } defs);

  mergeOption =
    loc: opt: defs:
    let
      all' = defs ++ (if opt ? default then [ (lib.mkOverride 1500 opt.default) ] else [ ]);
    in
    if (opt.readOnly or false) && defs != [ ] then
      # lib/modules.nix: the default and one more definition are two.
      throw "The option `${loc}' is read-only, but it's set multiple times."
    else if all' == [ ] then
      throw "The option `${loc}' is used but not defined."
    else
      mergeType loc opt.type all';

  mergeType =
    loc: type: defs:
    let
      vs = discharge defs;
    in
    if vs == [ ] then
      throw "The option `${loc}' has no definition left after mkIf."
    else if type.kind == "submodule" then
      evalSubmodule loc type.module vs
    else if type.kind == "attrsOf" then
      mergeAttrs loc (n: mergeType "${loc}.${n}" type.elemType) vs
    else if type.kind == "toml" then
      (
        if all isAttrs vs then
          mergeAttrs loc (n: mergeType "${loc}.${n}" tomlType) vs
        else if all isList vs then
          builtins.concatLists vs
        else
          mergeEqual loc vs
      )
    else
      let
        v = mergeEqual loc vs;
      in
      if type.check v then v else throw "The option `${loc}' is not a ${type.name}: ${toJSON v}.";

  mergeEqual =
    loc: vs:
    let
      v = head vs;
    in
    if all (x: x == v) vs then v else throw "The option `${loc}' has conflicting definitions: ${toJSON vs}.";

  mergeAttrs =
    loc: f: vs:
    if all isAttrs vs then
      builtins.listToAttrs (
        map (n: {
          name = n;
          value = f n (defsOf n vs);
        }) (keysOf vs)
      )
    else
      throw "The option `${loc}' is not an attribute set.";

  # A submodule: its options (the module may be a function of its own config) and its
  # free-form type for everything else.
  evalSubmodule =
    loc: module: defs:
    let
      m = if isFunction module then module { config = value; } else module;
      value = evalOptionSet loc (m.options or { }) (m.freeformType or null) (map pushDown defs);
    in
    value;

  evalOptionSet =
    loc: options: freeform: defs:
    let
      names = attrNames options;
      declared = mapAttrs (
        n: o:
        if isOption o then
          mergeOption "${loc}.${n}" o (defsOf n defs)
        else
          evalOptionSet "${loc}.${n}" o freeform (map pushDown (defsOf n defs))
      ) options;
      rest = filter (d: d != { }) (map (d: removeAttrs d names) defs);
      free =
        if rest == [ ] then
          { }
        else if freeform == null then
          throw "The option `${loc}.${head (keysOf rest)}' does not exist."
        else
          mergeType loc freeform rest;
    in
    free // declared;

  # --- the configuration ---------------------------------------------------------------
  module = import ./default.nix { inherit config lib pkgs; };
  renames = map (i: i._rename) module.imports;

  hasPath =
    path: v: path == [ ] || (isAttrs v && v ? ${head path} && hasPath (builtins.tail path) v.${head path});
  getPath = path: v: if path == [ ] then v else getPath (builtins.tail path) v.${head path};
  removePath =
    path: v:
    if length path == 1 then
      removeAttrs v path
    else
      v // { ${head path} = removePath (builtins.tail path) v.${head path}; };
  showPath = builtins.concatStringsSep ".";

  # What the configuration defines under services.boxmaker, renamed options moved.
  userDefined = {
    services.boxmaker = {
      enable = true;
      inherit owner;
    } // boxmaker;
  };
  moved = filter (r: hasPath r.from userDefined) renames;
  userDefs = foldl' (acc: r: removePath r.from acc) userDefined moved;
  renamedDefs = map (r: lib.setAttrByPath r.to (r.change (getPath r.from userDefined))) moved;
  warnings = map (
    r: "The option `${showPath r.from}' has been renamed to `${showPath r.to}'."
  ) moved;

  # The module's own definitions: `config = mkIf cfg.enable { ... }`.
  moduleDefs = pushDown module.config;

  at =
    path: d:
    if path == [ ] then
      [ d ]
    else
      let
        p = pushDown d;
      in
      if p ? ${head path} then at (builtins.tail path) p.${head path} else [ ];
  boxmakerDefs = concatMap (at [
    "services"
    "boxmaker"
  ]) ([ userDefs ] ++ renamedDefs ++ [ moduleDefs ]);
  cfg = evalOptionSet "services.boxmaker" module.options.services.boxmaker null (map pushDown boxmakerDefs);

  config = {
    services.boxmaker = cfg;
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
  };

  c =
    let
      m = module.config;
    in
    if typeOf m != "if" then m else if m.condition then m.content else { };
  opts = module.options.services.boxmaker;
  settingsOf = d: opts.settings.${d}.type;
in
{
  services = builtins.attrNames c.systemd.services;
  sockets = builtins.attrNames c.systemd.sockets;
  # [Service] keys switch-to-configuration reads, per service.
  switch = builtins.mapAttrs (_: s: {
    type = s.serviceConfig.Type or "simple";
    notSocketActivated = s.notSocketActivated or false;
  }) c.systemd.services;
  # The units as the module hands them to NixOS's systemd options.
  systemd = {
    inherit (c.systemd) services sockets;
  };
  users = {
    groups = builtins.mapAttrs (_: g: g.members or [ ]) c.users.groups;
  };
  inherit (module) meta;
  tmpfiles = builtins.attrNames c.systemd.tmpfiles.settings."10-boxmaker";
  # The Matrix channel's unit keys that carry its token and its network.
  channeld =
    if c.systemd.services ? boxmaker-channeld then
      {
        inherit (c.systemd.services.boxmaker-channeld.serviceConfig) LoadCredential User;
        IPAddressAllow = c.systemd.services.boxmaker-channeld.serviceConfig.IPAddressAllow or null;
      }
    else
      null;
  failedAssertions = map (a: a.message) (builtins.filter (a: !a.assertion) c.assertions);
  etc = builtins.attrNames c.environment.etc;
  # The old option names' warnings (lib's renames), then the module's own.
  warnings = warnings ++ (c.warnings or [ ]);
  # What each configuration file would hold, and whether it is the daemon's own check's
  # derivation (its script runs validate-config.sh on it) or the TOML file itself.
  validated = mapAttrs (_: e: e.source ? script && builtins.match ".*validate-config.sh.*" e.source.script != null) (
    lib.mapAttrs' (n: v: lib.nameValuePair (lib.removeSuffix ".toml" (builtins.baseNameOf n)) v) (
      lib.filterAttrs (n: _: lib.hasSuffix ".toml" n) c.environment.etc
    )
  );
  checked = mapAttrs (_: e: if e.source ? env then e.source.env.checked.value else null) (
    lib.mapAttrs' (n: v: lib.nameValuePair (lib.removeSuffix ".toml" (builtins.baseNameOf n)) v) (
      lib.filterAttrs (n: _: lib.hasSuffix ".toml" n) c.environment.etc
    )
  );
  # The stand-ins the build-time check makes for each daemon's device-only files and credentials.
  standIns = mapAttrs (_: e: if e.source ? env then { inherit (e.source.env) fakeDirs fakeFiles fakeCredentials; } else null) (
    lib.mapAttrs' (n: v: lib.nameValuePair (lib.removeSuffix ".toml" (builtins.baseNameOf n)) v) (
      lib.filterAttrs (n: _: lib.hasSuffix ".toml" n) c.environment.etc
    )
  );
  toml = mapAttrs (_: e: e.source.value or e.source.env.raw.value) (
    lib.mapAttrs' (n: v: lib.nameValuePair (lib.removeSuffix ".toml" (builtins.baseNameOf n)) v) (
      lib.filterAttrs (n: _: lib.hasSuffix ".toml" n) c.environment.etc
    )
  );
  # Every option of services.boxmaker, as a tree whose leaves (the options, the renamed old
  # ones among them) are `true`: what a document may name (check-offline.sh).
  optionTree =
    let
      walk = mapAttrs (_: v: if lib.isOption v then true else walk v);
      renamed = foldl' (t: r: lib.recursiveUpdate t (lib.setAttrByPath (builtins.tail (builtins.tail r.from)) true)) { } renames;
    in
    lib.recursiveUpdate (walk opts) renamed;
  # The types of the options that name paths.
  pathTypes = {
    home = opts.home.type.name;
    "inference.apiKeyFile" = opts.inference.apiKeyFile.type.name;
    "memory.honcho.apiKeyFile" = opts.memory.honcho.apiKeyFile.type.name;
    "gateway.credentialFiles" = opts.gateway.credentialFiles.type.name;
    "channels.matrix.tokenFile" = opts.channels.matrix.tokenFile.type.name;
  };
  # The option tree's shape: what sits beside settings, and each settings.<daemon>'s type.
  options = {
    beside = filter (n: n != "settings") (attrNames opts);
    inference = attrNames opts.inference;
    memory = attrNames opts.memory;
    gateway = attrNames opts.gateway;
    channels = attrNames opts.channels;
    settings = mapAttrs (d: _: {
      type = (settingsOf d).kind or null;
      freeform = ((settingsOf d).module.freeformType or { }).kind or null;
    }) opts.settings;
    renamed = map (r: showPath r.from) renames;
  };
}

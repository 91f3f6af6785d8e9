# services.boxmaker: the box on a NixOS device.
#
# Users, directories, sockets and units come from units.nix (plain data, shared with the
# offline check); this file adds the options, the TOML configurations and the NixOS
# wiring. Secrets are only ever paths, handed to the units with LoadCredential=.
#
# As RFC 42 (and nixpkgs' kanidm module) has it, each daemon's configuration is one option,
# settings.<daemon>: free-form TOML with typed, documented options for the keys this module
# sets or reads. Beside it stay only what is no configuration key: enable, the package, the
# owner (a login the units and directories use), the home (the directories', and every
# daemon's `[paths] home`), and the secrets (the API key, gatewayd's host credentials: paths
# handed over by systemd).
{
  config,
  lib,
  pkgs,
  ...
}:
let
  inherit (lib)
    mkOption
    mkEnableOption
    mkPackageOption
    mkIf
    mkDefault
    mkRenamedOptionModule
    mkChangedOptionModule
    types
    literalExpression
    ;

  cfg = config.services.boxmaker;
  units = import ./units.nix;
  defaults = import ./defaults.nix;
  format = pkgs.formats.toml { };

  ownerUser = cfg.owner;
  # The owner's primary group (the account must be declared: checks.nix asserts it).
  ownerGroup =
    let
      g = config.users.users.${cfg.owner}.group or "";
    in
    if g == "" then "users" else g;

  # The keys that follow from layout.json, the home and the owner (layout-configs.nix,
  # builtins only, shared with the test that runs each daemon's `check`).
  fixed = import ./layout-configs.nix {
    inherit (cfg) home;
    inherit ownerUser;
  };
  defaultScript = "${cfg.package}/share/boxmaker/inferproxy-default-script.toml";

  # settings.<daemon> as TOML: an option left null is no key (TOML has no null), and
  # brokerd's `[tools]` is written only when it tightens something.
  tomlOf =
    daemon:
    let
      s = lib.filterAttrsRecursive (_: v: v != null) cfg.settings.${daemon};
    in
    if (s.tools or null) == { } then removeAttrs s [ "tools" ] else s;
  configFile = daemon: format.generate "${daemon}.toml" (tomlOf daemon);

  # brokerd's workspace roots: writable ones join its ReadWritePaths=, and one under a
  # home directory turns ProtectHome= from true to read-only.
  roots = cfg.settings.brokerd.workspace.roots or [ ];
  underHome = p: lib.any (h: p == h || lib.hasPrefix "${h}/" p) [ "/home" "/root" "/run/user" ];

  matrix = cfg.channels.matrix;
  # channeld and its channel.sock exist on the device only with the Matrix channel.
  without = lib.optional (!matrix.enable) "channeld";
  runningDaemons = units.runningDaemons without;

  rendered = units.render {
    inherit without;
    home = cfg.home;
    runbook = "${cfg.package}/share/doc/boxmaker/runbook.md";
    inherit ownerUser ownerGroup configFile;
    exe = daemon: lib.getExe' cfg.package daemon;
    credentials = {
      inferproxy = lib.optional (cfg.inference.apiKeyFile != null) "api_key:${cfg.inference.apiKeyFile}";
      memoryd = lib.optional (honcho.apiKeyFile != null) "honcho_key:${honcho.apiKeyFile}";
      gatewayd = map (n: "${n}:${cfg.gateway.credentialFiles.${n}}") (builtins.attrNames cfg.gateway.credentialFiles);
      channeld = lib.optional (matrix.tokenFile != null) "matrix_token:${matrix.tokenFile}";
    };
    ipAddresses = {
      inferproxy = units.ipAddressesOfProvider provider.base_url;
      gatewayd = units.ipAddressesOfGateway (units.gatewayAllows cfg.settings.gatewayd);
      # memoryd has no network (layout.json) unless Honcho is configured; then IP to it only,
      # as inferproxy to its provider.
      # The homeserver only: its address when the URL names one, else all but link-local.
      channeld = if matrix.enable then units.ipAddressesOfProvider matrix.homeserver else { };
      memoryd =
        if honcho.url == null then
          { }
        else
          {
            RestrictAddressFamilies = "AF_UNIX AF_INET AF_INET6";
            PrivateNetwork = false;
          }
          // units.ipAddressesOfProvider honcho.url;
    };
    extraReadWritePaths = {
      brokerd = map (r: r.path) (lib.filter (r: r.writable or false) roots);
    };
    readOnlyHome = {
      brokerd = lib.any (r: underHome r.path) roots;
    };
  };

  unitsWithSuffix =
    suffix: toOptions:
    lib.mapAttrs' (name: u: lib.nameValuePair (lib.removeSuffix suffix name) (toOptions u)) (
      lib.filterAttrs (name: _: lib.hasSuffix suffix name) rendered
    );

  slotType = types.submodule {
    freeformType = format.type;
    options = {
      model = mkOption {
        type = types.str;
        description = "The provider's model name this slot asks for.";
      };
      max_tokens = mkOption {
        type = types.ints.positive;
        default = defaults.slot.maxTokens;
        description = "The most tokens one reply may have.";
      };
      context_tokens = mkOption {
        type = types.ints.positive;
        default = defaults.slot.contextTokens;
        description = "The model's context window, in tokens.";
      };
      temperature = mkOption {
        type = types.nullOr (types.numbers.between 0 2);
        default = defaults.slot.temperature;
        description = "Sampling temperature; null leaves it to the provider.";
      };
    };
  };

  # settings.<daemon>: free-form TOML for the daemon, with the keys this module sets or
  # reads declared as options inside it.
  settingsOption =
    daemon: options:
    mkOption {
      type = types.submodule {
        freeformType = format.type;
        inherit options;
      };
      default = { };
      example = literalExpression ''{ sandbox.seccomp_log = true; }'';
      description = ''
        {command}`${daemon}`'s configuration, written as TOML to
        `/etc/boxmaker/${daemon}.toml`. Free-form: any key the daemon knows may be set (it
        refuses one it does not). `[paths]`, `[sockets]`, `[peers]` and `[sandbox]` follow
        from the home, the owner and nixos-module/layout.json, set as defaults (a value
        here wins). See docs/install.md.
      '';
    };

  # The slot loopd's sessions run on; its window is loopd's budget.
  mainSlot = cfg.settings.inferproxy.slots.main or null;

  inferproxyOptions = {
    provider = {
      kind = mkOption {
        type = types.enum [
          "openai"
          "anthropic"
          "script"
        ];
        default = defaults.inference.provider;
        description = ''
          The model API inferproxy talks to: an OpenAI-compatible server, Anthropic, or
          `script` (fixed scripted replies, no model: the default until one is configured).
        '';
      };
      base_url = mkOption {
        type = types.nullOr types.str;
        default = defaults.inference.baseUrl;
        example = "http://127.0.0.1:8080/v1";
        description = ''
          The provider's base URL (for OpenAI-compatible servers it ends in `/v1`).
          Needed unless `kind` is `script`, refused with it.
        '';
      };
      script = mkOption {
        type = types.nullOr types.path;
        default = defaults.inference.script;
        defaultText = literalExpression ''
          if kind == "script" then "''${package}/share/boxmaker/inferproxy-default-script.toml" else null
        '';
        description = ''
          For the `script` provider: the file of scripted turns (a Nix path is copied into
          the store). Unset, the default script the package ships.
        '';
      };
    };
    slots = mkOption {
      type = types.attrsOf slotType;
      default = lib.mapAttrs (_: s: {
        inherit (s) model;
        max_tokens = s.maxTokens;
        context_tokens = s.contextTokens;
        inherit (s) temperature;
      }) defaults.inference.slots;
      example = literalExpression ''{ main = { model = "gpt-4o"; context_tokens = 128000; }; }'';
      description = ''
        Named model slots; loopd names a slot (`main` for new sessions), never a model.
      '';
    };
  };

  brokerdOptions = {
    tools = mkOption {
      type = types.attrsOf format.type;
      default = defaults.tools;
      example = literalExpression ''{ web_fetch.enabled = false; workspace_write.approval = "always"; }'';
      description = ''
        Per-tool settings (`[tools.<name>]`). They can only tighten a tool's built-in
        policy: brokerd refuses to start on a setting that loosens one.
      '';
    };
    run = mkOption {
      type = types.nullOr (
        types.submodule {
          freeformType = format.type;
          options.programs = mkOption {
            type = types.nullOr (types.listOf types.str);
            default = null;
            example = [
              "git"
              "rg"
            ];
            description = ''
              The owner's allow-list of programs the `run` tool may start: names looked up on
              its fixed PATH (`/run/current-system/sw/bin` first) or absolute paths. `null`:
              any program its sandbox can reach.
            '';
          };
        }
      );
      default = null;
      example = literalExpression ''{ programs = [ "git" "rg" ]; memory_mb = 512; }'';
      description = ''
        The `run` tool (`[run]` in brokerd.toml): `null` does not offer it, and brokerd's
        seccomp list then has no `execve`. Its other keys (`path`, `system_paths`,
        `memory_mb`, `file_size_mb`, `processes`, `open_files`, `max_output_bytes`,
        `network_namespace`) pass through as they are; see docs/policy.md.
      '';
    };
  };

  loopdOptions = {
    loop.context_tokens = mkOption {
      type = types.ints.positive;
      default = if mainSlot == null then defaults.slot.contextTokens else mainSlot.context_tokens;
      defaultText = literalExpression "config.services.boxmaker.settings.inferproxy.slots.main.context_tokens";
      description = ''
        A session's token budget: by default the window of the `main` slot, which new
        sessions run on.
      '';
    };
  };

  # The options that were declared beside settings.<daemon> before they moved inside it.
  old = [
    "services"
    "boxmaker"
  ];
  new = old ++ [ "settings" ];

  absolute = p: lib.hasPrefix "/" p;
  inherit (cfg.settings.inferproxy) provider;
  honcho = cfg.memory.honcho;
  # settings.memoryd's [honcho], from memory.honcho.
  honchoTable =
    if honcho.url == null then
      { }
    else
      {
        honcho = {
          inherit (honcho) url;
        }
        // (if honcho.workspace == null then { } else { inherit (honcho) workspace; });
      };
in
{
  imports = [
    (mkRenamedOptionModule (old ++ [ "inference" "provider" ]) (new ++ [ "inferproxy" "provider" "kind" ]))
    (mkRenamedOptionModule (old ++ [ "inference" "baseUrl" ]) (new ++ [ "inferproxy" "provider" "base_url" ]))
    (mkRenamedOptionModule (old ++ [ "inference" "script" ]) (new ++ [ "inferproxy" "provider" "script" ]))
    (mkRenamedOptionModule (old ++ [ "tools" ]) (new ++ [ "brokerd" "tools" ]))
    # The slots' keys changed case with the move (maxTokens is max_tokens, as in the TOML).
    (mkChangedOptionModule (old ++ [ "inference" "slots" ]) (new ++ [ "inferproxy" "slots" ]) (
      config:
      lib.mapAttrs (
        _: s:
        removeAttrs s [
          "maxTokens"
          "contextTokens"
        ]
        // lib.optionalAttrs (s ? maxTokens) { max_tokens = s.maxTokens; }
        // lib.optionalAttrs (s ? contextTokens) { context_tokens = s.contextTokens; }
      ) config.services.boxmaker.inference.slots
    ))
  ];

  options.services.boxmaker = {
    enable = mkEnableOption "boxmaker, the hardened on-device AI agent";

    package = mkPackageOption pkgs "boxmaker" { };

    home = mkOption {
      type = types.str;
      default = defaults.home;
      description = ''
        The box's home: state directories, and `run/` with one 0700 directory per socket.
      '';
    };

    owner = mkOption {
      type = types.str;
      example = "alice";
      description = ''
        The owner's login account: the only user who may talk to the agent (loop.sock)
        and approve or deny tool calls (admin.sock).
      '';
    };

    # A secret, so no configuration key: systemd hands the file to inferproxy alone.
    inference.apiKeyFile = mkOption {
      type = types.nullOr types.str;
      default = defaults.inference.apiKeyFile;
      example = "/run/keys/boxmaker-api-key";
      description = ''
        A file holding the provider's API key, outside the Nix store. systemd hands it
        to inferproxy alone as the credential `api_key`; no other unit can read it.
      '';
    };

    # memoryd's remote store (docs/memory.md), the options issue #18 names. They fill
    # settings.memoryd.honcho (a value there wins); the key is a secret, so no configuration
    # key: systemd hands the file to memoryd alone as the credential `honcho_key`.
    memory.honcho = {
      url = mkOption {
        type = types.nullOr types.str;
        default = null;
        example = "http://127.0.0.1:8765";
        description = ''
          The Honcho server's base (`http://host:port`; memoryd adds `/v3`): main memory and
          quarantine are filed there, a secret session's turns stay in the embedded store.
          Unset: the embedded store alone, and memoryd has no network at all.
        '';
      };
      workspace = mkOption {
        type = types.nullOr types.str;
        default = null;
        example = "boxmaker";
        description = "The Honcho workspace of the owner's main memory; null: memoryd's default.";
      };
      apiKeyFile = mkOption {
        type = types.nullOr types.str;
        default = null;
        example = "/run/keys/honcho-key";
        description = ''
          A file holding Honcho's bearer token, outside the Nix store. systemd hands it to
          memoryd alone as the credential `honcho_key`; no other unit can read it.
        '';
      };
    };

    # Secrets, so no configuration key: systemd hands each file to gatewayd alone.
    gateway.credentialFiles = mkOption {
      type = types.attrsOf types.str;
      default = { };
      example = literalExpression ''{ example = "/run/keys/example-token"; }'';
      description = ''
        Files holding the credentials gatewayd adds to the requests of one host each, outside
        the Nix store, by credential name. systemd hands each to gatewayd alone
        (LoadCredential=); a host of `settings.gatewayd.hosts` names it with
        `credential = "<name>"` beside its `header`. The value reaches neither the model nor
        any other daemon, and a request that carries it is refused (docs/gateway.md).
      '';
    };

    # The Matrix channel (docs/channels.md): channeld, its user and unit, only when enabled.
    # They fill settings.channeld.matrix (a value there wins); the token is a secret, so no
    # configuration key: systemd hands the file to channeld alone as the credential
    # `matrix_token`.
    channels.matrix = {
      enable = mkEnableOption "the Matrix channel: the owner talks to the box, and answers its approvals, from their Matrix rooms";
      homeserver = mkOption {
        type = types.str;
        default = "";
        example = "https://matrix.example.org";
        description = "The homeserver's base URL: https://, or http:// to a loopback address only.";
      };
      user = mkOption {
        type = types.str;
        default = "";
        example = "@box:example.org";
        description = "The box's own Matrix account; its events are never turns.";
      };
      tokenFile = mkOption {
        type = types.nullOr types.str;
        default = null;
        example = "/run/keys/box-matrix-token";
        description = ''
          A file holding the box account's access token, outside the Nix store. systemd hands
          it to channeld alone as the credential `matrix_token`; no other unit can read it.
        '';
      };
      owners = mkOption {
        type = types.listOf types.str;
        default = [ ];
        example = [ "@alice:example.org" ];
        description = ''
          The Matrix ids that may be paired as the owner (`bxctl channel pair`) and whose
          invites to a configured room are taken. Nobody is the owner before pairing.
        '';
      };
      rooms = mkOption {
        type = types.listOf types.str;
        default = [ ];
        example = [ "!abcdef:example.org" ];
        description = "The room ids the channel serves; a message anywhere else is never a turn.";
      };
    };

    settings = {
      channeld = settingsOption "channeld" { };
      loopd = settingsOption "loopd" loopdOptions;
      brokerd = settingsOption "brokerd" brokerdOptions;
      inferproxy = settingsOption "inferproxy" inferproxyOptions;
      memoryd = settingsOption "memoryd" { };
      # The hosts the tools may reach: `hosts = [ { name = "*.wikipedia.org"; } ]` (the
      # allow-list, empty by default), with `[dns]`, `[tls]` and `[limits]` (docs/gateway.md).
      gatewayd = settingsOption "gatewayd" { };
    };
  };

  config = mkIf cfg.enable {
    assertions =
      # The owner's account and the workspace roots (checks.nix, shared with the offline check).
      map (message: {
        assertion = false;
        inherit message;
      }) (
        import ./checks.nix {
          inherit (cfg) owner;
          users = config.users.users;
          inherit roots;
        }
      )
      ++ [
        {
          assertion = units.problems == [ ];
          message = "nixos-module/layout.json: " + lib.concatStringsSep "; " units.problems;
        }
        {
          assertion = builtins.match "[a-z_][a-z0-9_-]*" cfg.owner != null;
          message = "services.boxmaker.owner must be a login name, not `${cfg.owner}`.";
        }
        {
          assertion = cfg.owner != "root" && !(units.users ? ${cfg.owner});
          message = "services.boxmaker.owner must be a person's account, not root or a bx-* daemon user.";
        }
        {
          assertion = absolute cfg.home && cfg.home != "/" && !(lib.hasSuffix "/" cfg.home);
          message = "services.boxmaker.home must be an absolute directory path without a trailing slash.";
        }
        {
          assertion =
            cfg.inference.apiKeyFile == null
            || (absolute cfg.inference.apiKeyFile && !(lib.hasPrefix builtins.storeDir cfg.inference.apiKeyFile));
          message = "services.boxmaker.inference.apiKeyFile must be an absolute path outside the Nix store (the store is world-readable).";
        }
        {
          assertion = provider.kind == "script" || provider.base_url != null;
          message = "services.boxmaker.settings.inferproxy.provider.base_url is needed for the ${provider.kind} provider.";
        }
        {
          assertion = provider.kind == "script" || cfg.inference.apiKeyFile != null;
          message = "services.boxmaker.inference.apiKeyFile is needed for the ${provider.kind} provider: inferproxy refuses to start without a key.";
        }
        {
          assertion =
            provider.kind != "script"
            || (provider.base_url == null && cfg.inference.apiKeyFile == null);
          message = "services.boxmaker.settings.inferproxy.provider.base_url and services.boxmaker.inference.apiKeyFile do not apply to the script provider (inferproxy refuses them).";
        }
        {
          assertion = provider.kind == "script" || provider.script == null;
          message = "services.boxmaker.settings.inferproxy.provider.script applies only to the script provider (inferproxy refuses it for ${provider.kind}).";
        }
        {
          assertion = honcho.url != null || (honcho.workspace == null && honcho.apiKeyFile == null);
          message = "services.boxmaker.memory.honcho.workspace and apiKeyFile need services.boxmaker.memory.honcho.url.";
        }
        {
          assertion =
            honcho.apiKeyFile == null
            || (absolute honcho.apiKeyFile && !(lib.hasPrefix builtins.storeDir honcho.apiKeyFile));
          message = "services.boxmaker.memory.honcho.apiKeyFile must be an absolute path outside the Nix store (the store is world-readable).";
        }
        {
          assertion = builtins.all (
            f: absolute f && !(lib.hasPrefix builtins.storeDir f)
          ) (builtins.attrValues cfg.gateway.credentialFiles);
          message = "services.boxmaker.gateway.credentialFiles must be absolute paths outside the Nix store (the store is world-readable).";
        }
        {
          assertion =
            !matrix.enable
            || (
              matrix.homeserver != ""
              && matrix.user != ""
              && matrix.rooms != [ ]
              && matrix.tokenFile != null
              && absolute matrix.tokenFile
              && !(lib.hasPrefix builtins.storeDir matrix.tokenFile)
            );
          message = "services.boxmaker.channels.matrix needs homeserver, user, rooms and tokenFile (an absolute path outside the Nix store, which is world-readable).";
        }
        {
          assertion = cfg.settings.inferproxy.slots ? main;
          message = "services.boxmaker.settings.inferproxy.slots needs a `main` slot: new sessions use it.";
        }
      ];

    # What follows from the layout is a default: a value in settings.<daemon> wins.
    services.boxmaker.settings = lib.mapAttrs (_: lib.mapAttrsRecursive (_: mkDefault)) fixed // {
      memoryd = lib.mapAttrsRecursive (_: mkDefault) (fixed.memoryd // honchoTable);
      channeld = lib.mapAttrsRecursive (_: mkDefault) (
        fixed.channeld
        // {
          matrix = {
            inherit (matrix)
              homeserver
              user
              owners
              rooms
              ;
          };
        }
      );
      inferproxy = lib.mapAttrsRecursive (_: mkDefault) fixed.inferproxy // {
        # The script provider without a script of its own runs the one the package ships.
        provider.script = mkIf (provider.kind == "script") (mkDefault defaultScript);
      };
    };

    users.users = lib.mapAttrs (name: _: {
      isSystemUser = true;
      group = name;
      description = units.userDescription name;
    }) units.users;
    users.groups = lib.mapAttrs (_: _: { }) units.users;

    systemd.tmpfiles.settings."10-boxmaker" = lib.listToAttrs (
      map (
        d:
        lib.nameValuePair d.path {
          d = {
            inherit (d) mode user group;
          };
        }
      ) (units.directories { inherit (cfg) home; inherit ownerUser ownerGroup; })
    );

    systemd.sockets = unitsWithSuffix ".socket" (u: {
      description = u.Unit.Description;
      unitConfig = removeAttrs u.Unit [ "Description" ];
      socketConfig = u.Socket;
      wantedBy = u.Install.WantedBy or [ ];
    });

    systemd.services = unitsWithSuffix ".service" (u: {
      description = u.Unit.Description;
      unitConfig = removeAttrs u.Unit [ "Description" ];
      # Includes X-NotSocketActivated=true, which switch-to-configuration reads from [Service]
      # (units.nix says why).
      serviceConfig = u.Service;
      wantedBy = u.Install.WantedBy or [ ];
    });

    # The owner may start the selftest (`bxctl selftest`) without being root.
    security.polkit.extraConfig = mkIf config.security.polkit.enable ''
      polkit.addRule(function (action, subject) {
        if (action.id == "org.freedesktop.systemd1.manage-units" &&
            action.lookup("unit") == "boxmaker-selftest.service" &&
            action.lookup("verb") == "start" &&
            subject.user == "${cfg.owner}") {
          return polkit.Result.YES;
        }
      });
    '';

    environment.systemPackages = [ cfg.package ];
    environment.etc =
      lib.listToAttrs (
        map (d: lib.nameValuePair "boxmaker/${d}.toml" { source = configFile d; }) runningDaemons
      )
      // {
        # What `bxctl check` (the device check) expects: units, sockets, directories, owners.
        "boxmaker/device.json".text = builtins.toJSON (
          units.deviceManifest {
            inherit (cfg) home;
            inherit ownerUser ownerGroup configFile without;
          }
        );
      };
  };
}

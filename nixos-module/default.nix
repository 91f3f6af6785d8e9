# services.boxmaker: the box on a NixOS device.
#
# Users, directories, sockets and units come from units.nix (plain data, shared with the
# offline check); this file adds the options, the TOML configurations and the NixOS
# wiring. Secrets are only ever paths, handed to the units with LoadCredential=.
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

  # What the typed options produce (configs.nix, builtins only, shared with the test that
  # runs each daemon's `check` on it); settings.<daemon> is merged over it.
  generated = import ./configs.nix {
    inherit (cfg) home tools;
    inherit ownerUser;
    inference = cfg.inference // {
      # A script given as a Nix path is copied into the store; a string path stays as is.
      script = if cfg.inference.script == null then null else "${cfg.inference.script}";
    };
    defaultScript = "${cfg.package}/share/boxmaker/inferproxy-default-script.toml";
  };

  configFile = daemon: format.generate "${daemon}.toml" cfg.settings.${daemon};

  # brokerd's workspace roots: writable ones join its ReadWritePaths=, and one under a
  # home directory turns ProtectHome= from true to read-only.
  roots = cfg.settings.brokerd.workspace.roots or [ ];
  underHome = p: lib.any (h: p == h || lib.hasPrefix "${h}/" p) [ "/home" "/root" "/run/user" ];

  rendered = units.render {
    home = cfg.home;
    runbook = "${cfg.package}/share/doc/boxmaker/runbook.md";
    inherit ownerUser ownerGroup configFile;
    exe = daemon: lib.getExe' cfg.package daemon;
    credentials = {
      inferproxy = lib.optional (cfg.inference.apiKeyFile != null) "api_key:${cfg.inference.apiKeyFile}";
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
    options = {
      model = mkOption {
        type = types.str;
        description = "The provider's model name this slot asks for.";
      };
      maxTokens = mkOption {
        type = types.ints.positive;
        default = defaults.slot.maxTokens;
        description = "The most tokens one reply may have.";
      };
      contextTokens = mkOption {
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

  settingsOption =
    daemon:
    mkOption {
      type = types.submodule { freeformType = format.type; };
      default = { };
      example = literalExpression ''{ sandbox.seccomp_log = true; }'';
      description = ''
        Free-form TOML for {command}`${daemon}`, merged over what the typed options
        produce (a value set here wins). See docs/install.md.
      '';
    };

  absolute = p: lib.hasPrefix "/" p;
in
{
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

    inference = {
      provider = mkOption {
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
      baseUrl = mkOption {
        type = types.nullOr types.str;
        default = defaults.inference.baseUrl;
        example = "http://127.0.0.1:8080/v1";
        description = ''
          The provider's base URL (for OpenAI-compatible servers it ends in `/v1`).
        '';
      };
      apiKeyFile = mkOption {
        type = types.nullOr types.str;
        default = defaults.inference.apiKeyFile;
        example = "/run/keys/boxmaker-api-key";
        description = ''
          A file holding the provider's API key, outside the Nix store. systemd hands it
          to inferproxy alone as the credential `api_key`; no other unit can read it.
        '';
      };
      script = mkOption {
        type = types.nullOr types.path;
        default = defaults.inference.script;
        description = ''
          For the `script` provider: the file of scripted turns. Null uses the default
          script the package ships (`share/boxmaker/inferproxy-default-script.toml`).
        '';
      };
      slots = mkOption {
        type = types.attrsOf slotType;
        default = defaults.inference.slots;
        example = literalExpression ''{ main = { model = "gpt-4o"; contextTokens = 128000; }; }'';
        description = ''
          Named model slots; loopd names a slot (`main` for new sessions), never a model.
        '';
      };
    };

    tools = mkOption {
      type = types.attrsOf format.type;
      default = defaults.tools;
      example = literalExpression ''{ web_fetch.enabled = false; workspace_write.approval = "always"; }'';
      description = ''
        Per-tool settings for brokerd (`[tools.<name>]`). They can only tighten a tool's
        built-in policy: brokerd refuses to start on a setting that loosens one.
      '';
    };

    settings = lib.genAttrs units.daemonNames settingsOption;
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
          assertion = cfg.inference.provider == "script" || cfg.inference.baseUrl != null;
          message = "services.boxmaker.inference.baseUrl is needed for the ${cfg.inference.provider} provider.";
        }
        {
          assertion = cfg.inference.provider == "script" || cfg.inference.apiKeyFile != null;
          message = "services.boxmaker.inference.apiKeyFile is needed for the ${cfg.inference.provider} provider: inferproxy refuses to start without a key.";
        }
        {
          assertion =
            cfg.inference.provider != "script"
            || (cfg.inference.baseUrl == null && cfg.inference.apiKeyFile == null);
          message = "services.boxmaker.inference.baseUrl and apiKeyFile do not apply to the script provider (inferproxy refuses them).";
        }
        {
          assertion = cfg.inference.provider == "script" || cfg.inference.script == null;
          message = "services.boxmaker.inference.script applies only to the script provider (inferproxy refuses it for ${cfg.inference.provider}).";
        }
        {
          assertion = cfg.inference.slots ? main;
          message = "services.boxmaker.inference.slots needs a `main` slot: new sessions use it.";
        }
      ];

    # Every value the typed options produce is a default: settings.<daemon> wins.
    services.boxmaker.settings = lib.mapAttrs (_: lib.mapAttrsRecursive (_: lib.mkDefault)) generated;

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
        map (d: lib.nameValuePair "boxmaker/${d}.toml" { source = configFile d; }) units.daemonNames
      )
      // {
        # What `bxctl check` (the device check) expects: units, sockets, directories, owners.
        "boxmaker/device.json".text = builtins.toJSON (
          units.deviceManifest {
            inherit (cfg) home;
            inherit ownerUser ownerGroup configFile;
          }
        );
      };
  };
}

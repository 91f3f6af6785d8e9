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
# daemon's `[paths] home`), the owner's system prompt (a file in loopd's directory, not a
# key of loopd.toml), the channels (channels.matrix, which fills settings.channeld) and the
# secrets (the API key, gatewayd's host credentials, Honcho's key, the Matrix token: paths
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

  # settings.<daemon> as TOML: an option left null is no key (TOML has no null), and a table
  # made only of such options (brokerd's `[tools]` that tightens nothing, gatewayd's `[dns]`
  # without servers) is not written.
  tomlOf =
    daemon:
    let
      s = lib.filterAttrsRecursive (_: v: v != null) cfg.settings.${daemon};
    in
    removeAttrs s (builtins.filter (t: (s.${t} or null) == { }) [ "tools" "dns" ]);

  matrix = cfg.channels.matrix;
  # channeld and its channel.sock exist on the device only with the Matrix channel.
  without = lib.optional (!matrix.enable) "channeld";
  runningDaemons = units.runningDaemons without;

  # The credentials each daemon's unit loads (LoadCredential=), by name.
  credentialNames = {
    inferproxy = lib.optional (cfg.inference.apiKeyFile != null) "api_key";
    memoryd = lib.optional (honcho.apiKeyFile != null) "honcho_key";
    gatewayd = builtins.attrNames cfg.gateway.credentialFiles;
    channeld = lib.optional (matrix.tokenFile != null) "matrix_token";
  };

  # Each daemon's configuration file, checked by the daemon itself at build time (as nginx's
  # module runs `nginx -t`): `<daemon> check --config` on it (validation.nix says what stands in
  # for the files that exist only on the device), so a configuration a daemon refuses fails
  # `nixos-rebuild build` and is never switched to.
  rawConfigFile = daemon: format.generate "boxmaker-${daemon}.toml" (tomlOf daemon);
  validated =
    daemon:
    let
      v = import ./validation.nix {
        inherit daemon defaultScript;
        settings = tomlOf daemon;
        credentials = credentialNames.${daemon} or [ ];
        caBundle = "${pkgs.cacert}/etc/ssl/certs/ca-bundle.crt";
      };
    in
    pkgs.runCommand "boxmaker-${daemon}.toml"
      {
        nativeBuildInputs = [ cfg.package ];
        raw = rawConfigFile daemon;
        checked = format.generate "boxmaker-${daemon}-checked.toml" v.settings;
        fakeDirs = lib.concatStringsSep "\n" v.dirs;
        fakeFiles = lib.concatStringsSep "\n" v.files;
        fakeCredentials = lib.concatStringsSep "\n" v.credentials;
      }
      ''
        bash ${./validate-config.sh} ${daemon} "$checked"
        cp "$raw" $out
      '';
  configFile = daemon: if cfg.validateConfigs then validated daemon else rawConfigFile daemon;

  # Every unit, as units.nix renders it for the module's values (the offline check and the
  # twin call the same function), as NixOS's options.
  rendered = units.nixos (
    units.renderDevice {
      home = cfg.home;
      runbook = "${cfg.package}/share/doc/boxmaker/runbook.md";
      inherit ownerUser ownerGroup configFile;
      exe = daemon: lib.getExe' cfg.package daemon;
      settings = lib.genAttrs runningDaemons tomlOf;
      inherit (cfg.inference) apiKeyFile;
      inherit honcho;
      inherit (cfg.gateway) credentialFiles;
      matrixTokenFile = matrix.tokenFile;
      inherit without systemPrompt;
      install = "${pkgs.coreutils}/bin/install";
    }
  );

  # brokerd's workspace roots (checks.nix refuses one brokerd cannot reach).
  roots = cfg.settings.brokerd.workspace.roots or [ ];

  # services.boxmaker.systemPrompt, written into the store for loopd's unit to install as
  # <home>/loop/system.md (null: the module leaves that file alone).
  systemPrompt =
    if cfg.systemPrompt == null then null else pkgs.writeText "boxmaker-system.md" cfg.systemPrompt;
  # loopd refuses every new session while system.md is over 256 KiB (crates/loopd/src/baseline.rs).
  promptMax = 256 * 1024;

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

  # The keys that follow from layout.json, the home and the owner (`[paths]`, `[sockets]`,
  # `[peers]`, `[sandbox]` but `seccomp_log`, loopd's and brokerd's client sockets), as
  # read-only options of settings.<daemon>: set here, listed in the option documentation, and
  # refused when a configuration sets them, since the units, directories and peer checks are
  # built from the same layout and would no longer agree.
  layoutOptions =
    daemon:
    let
      leaf =
        v:
        mkOption {
          type =
            if builtins.isBool v then
              types.bool
            else if builtins.isList v then
              types.listOf types.str
            else
              types.str;
          default = v;
          readOnly = true;
          defaultText = lib.literalMD "from `nixos-module/layout.json`, the home and the owner";
          description = ''
            Follows from nixos-module/layout.json, {option}`services.boxmaker.home` and
            {option}`services.boxmaker.owner`; read-only.
          '';
        };
      walk = lib.mapAttrs (_: v: if builtins.isAttrs v then walk v else leaf v);
      d = fixed.${daemon};
    in
    walk (d // { sandbox = removeAttrs d.sandbox [ "seccomp_log" ]; });

  # `[sandbox] seccomp_log`: the one `[sandbox]` key that is a choice (hardening.md: kill, or
  # EPERM and a log line while tuning a seccomp list).
  sandboxOptions.sandbox.seccomp_log = mkOption {
    type = types.bool;
    default = false;
    description = ''
      Log a system call the daemon's seccomp list does not allow and fail it with EPERM,
      instead of killing the daemon: for tuning a list, never for a device in use.
    '';
  };

  # settings.<daemon>: free-form TOML for the daemon, with the keys this module sets or
  # reads declared as options inside it.
  settingsOption =
    daemon: options:
    mkOption {
      type = types.submodule {
        freeformType = format.type;
        options = lib.recursiveUpdateUntil (_: l: r: lib.isOption l || lib.isOption r) (
          lib.recursiveUpdate (layoutOptions daemon) sandboxOptions
        ) options;
      };
      default = { };
      example = literalExpression ''{ serve.write_ms = 60000; }'';
      description = ''
        {command}`${daemon}`'s configuration, written as TOML to
        `/etc/boxmaker/${daemon}.toml` and checked by `${daemon} check` when the system is
        built ({option}`services.boxmaker.validateConfigs`). Free-form: any key the daemon
        knows may be set (it refuses one it does not). `[paths]`, `[sockets]`, `[peers]` and
        `[sandbox]` (but `seccomp_log`) follow from the home, the owner and
        nixos-module/layout.json and are read-only. See docs/install.md.
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

  gatewaydOptions = {
    dns.servers = mkOption {
      type = types.nullOr (types.listOf types.str);
      default = null;
      example = [
        "9.9.9.9:53"
        "[2620:fe::fe]:53"
      ];
      description = ''
        The name servers gatewayd asks, over TCP (`address:port`). Unset, it asks those of
        /etc/resolv.conf, which on a typical network is the router (a private address) or
        systemd-resolved's stub (`127.0.0.53`): both are addresses its unit's
        `IPAddressDeny=` refuses. So set this when `hosts` opens any host: the addresses here
        are let past `IPAddressDeny=` (a name server on the owner's network too), and the
        module warns while hosts are open and this is unset (docs/gateway.md, "DNS").
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
  meta.maintainers = import ../nix/maintainers.nix;

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
      type = types.externalPath;
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
      type = types.nullOr types.externalPath;
      default = defaults.inference.apiKeyFile;
      example = "${units.keysDir}/api-key";
      description = ''
        A file holding the provider's API key, outside the Nix store. systemd hands it
        to inferproxy alone as the credential `api_key`; no other unit can read it. A key put
        in place by hand belongs in `${units.keysDir}` (root only, made by the module, kept
        across reboots); `/run/keys` is a ramfs, empty after every boot, and only for a tool
        that puts the file there at each boot (docs/install.md, "Secrets").
      '';
    };

    ownerReadsJournal = mkOption {
      type = types.bool;
      default = defaults.ownerReadsJournal;
      description = ''
        Put the owner in the `systemd-journal` group, so that the owner reads the box's
        lines without root: `journalctl RUNBOOK=<anchor>` and `journalctl -u boxmaker-*`,
        which every runbook entry says to run. The group reads the whole system journal,
        not only the box's; set this to false to keep the journal root's, and read it with
        `ssh root@<device> journalctl ...`.
      '';
    };

    systemPrompt = mkOption {
      type = types.nullOr types.lines;
      default = "";
      example = literalExpression "builtins.readFile ./system.md";
      description = ''
        The owner's own words in the system message every new session starts with, under
        `# From the owner`. They follow the box's own part, which loopd writes itself from what
        brokerd lists (what the box is, every workspace root by name, path and class, how a
        path names a file, the tools offered, the broker's rules), and come before core memory
        (docs/loopd.md, "The system message"). The default, empty, leaves the box's own part
        alone, so the model always knows where the workspace is.

        Written into the Nix store and installed by loopd's unit before loopd starts as
        `<home>/loop/system.md`, loopd's user's and 0600. A change restarts loopd at the switch
        that makes it; the sessions begun after it have the new text, a session keeps the
        system message it began with. At most 256 KiB, which loopd refuses beyond. The store is
        world-readable: put nothing here a local user may not read. `null`: the module does not
        touch `<home>/loop/system.md` (docs/install.md, "The owner's system prompt").
      '';
    };

    validateConfigs = mkOption {
      type = types.bool;
      default = pkgs.stdenv.buildPlatform.canExecute pkgs.stdenv.hostPlatform;
      defaultText = literalExpression "pkgs.stdenv.buildPlatform.canExecute pkgs.stdenv.hostPlatform";
      description = ''
        Check each daemon's generated configuration with `<daemon> check --config` when the
        system is built, so that a configuration a daemon refuses fails
        {command}`nixos-rebuild build` (and `switch`) before anything is installed. Off by
        default only where the build machine cannot run the device's programs.
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
        type = types.nullOr types.externalPath;
        default = null;
        example = "${units.keysDir}/honcho-key";
        description = ''
          A file holding Honcho's bearer token, outside the Nix store. systemd hands it to
          memoryd alone as the credential `honcho_key`; no other unit can read it.
        '';
      };
    };

    # Secrets, so no configuration key: systemd hands each file to gatewayd alone.
    gateway.credentialFiles = mkOption {
      type = types.attrsOf types.externalPath;
      default = { };
      example = literalExpression ''{ example = "${units.keysDir}/example-token"; }'';
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
        type = types.nullOr types.externalPath;
        default = null;
        example = "${units.keysDir}/matrix-token";
        description = ''
          A file holding the box account's access token, outside the Nix store. systemd hands
          it to channeld alone as the credential `matrix_token`; no other unit can read it. A
          token put in place by hand belongs in `${units.keysDir}` (root only, made by the
          module, kept across reboots); `/run/keys` is a ramfs, empty after every boot, and only
          for a tool that puts the file there at each boot (docs/install.md, "Secrets").
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
      gatewayd = settingsOption "gatewayd" gatewaydOptions;
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
            !matrix.enable
            || (matrix.homeserver != "" && matrix.user != "" && matrix.rooms != [ ] && matrix.tokenFile != null);
          message = "services.boxmaker.channels.matrix needs homeserver, user, rooms and tokenFile.";
        }
        {
          assertion = cfg.systemPrompt == null || builtins.stringLength cfg.systemPrompt <= promptMax;
          message = "services.boxmaker.systemPrompt is ${toString (builtins.stringLength cfg.systemPrompt)} bytes: loopd refuses every new session while system.md is over ${toString promptMax} bytes.";
        }
        {
          assertion = cfg.settings.inferproxy.slots ? main;
          message = "services.boxmaker.settings.inferproxy.slots needs a `main` slot: new sessions use it.";
        }
      ];

    # gatewayd resolves names over TCP with the name servers it is given, else those of
    # /etc/resolv.conf, which its unit's IPAddressDeny= refuses on a typical network.
    warnings = lib.optional (
      (cfg.settings.gatewayd.hosts or [ ]) != [ ] && (cfg.settings.gatewayd.dns.servers or null) == null
    ) "services.boxmaker.settings.gatewayd.hosts opens hosts, but services.boxmaker.settings.gatewayd.dns.servers is unset: gatewayd then asks the name servers of /etc/resolv.conf, and its unit's IPAddressDeny= refuses a router's private address and systemd-resolved's 127.0.0.53, so no name resolves. Set settings.gatewayd.dns.servers to name servers that answer over TCP (e.g. [ \"9.9.9.9:53\" ], or the router's, which is then let past IPAddressDeny=); docs/gateway.md, \"DNS\".";

    # What the module itself sets in the daemons' configurations, beside the read-only
    # layout keys: memoryd's [honcho] from memory.honcho, and the script provider's default
    # script (a value in settings.<daemon> wins).
    services.boxmaker.settings = {
      memoryd = lib.mapAttrsRecursive (_: mkDefault) honchoTable;
      inferproxy.provider.script = mkIf (provider.kind == "script") (mkDefault defaultScript);
      channeld = lib.mapAttrsRecursive (_: mkDefault) {
        matrix = {
          inherit (matrix)
            homeserver
            user
            owners
            rooms
            ;
        };
      };
    };

    users.users = lib.mapAttrs (name: _: {
      isSystemUser = true;
      group = name;
      description = units.userDescription name;
    }) units.users;
    users.groups =
      lib.mapAttrs (_: _: { }) units.users
      # The runbook's lines are the owner's to read (ownerReadsJournal), without declaring the
      # owner's account here (checks.nix refuses an owner the configuration does not declare).
      // lib.optionalAttrs cfg.ownerReadsJournal { systemd-journal.members = [ cfg.owner ]; };

    # The state, socket and on-demand directories, and the root-only one for keys placed by
    # hand (units.nix's directories; the device check reads the same list).
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

    # Every unit with nixpkgs' options for what it has options for (units.nix's nixos): the
    # dependencies, the start limit, notSocketActivated, the socket's listenStreams; only the
    # rest in unitConfig, serviceConfig and socketConfig.
    systemd.services = rendered.services;
    systemd.sockets = rendered.sockets;

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

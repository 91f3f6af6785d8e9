# The box's users, directories, sockets and systemd units as plain data.
#
# Builtins only (no nixpkgs, no lib): the NixOS module (default.nix) and the offline
# check (check-offline.sh, through offline.nix) both import this file, so the keys the
# gate verifies and scores are the keys the device runs. A daemon is added by one entry in
# `daemons` and one per socket it serves in `sockets`.
let
  # The hardening every boxmaker unit carries (nix.md, hardening.md). Never `PrivateUsers=`:
  # in a private user namespace SO_PEERCRED reports other users as 65534 and every peer
  # check would refuse. Never `DynamicUser=`: peer checks need stable uids.
  hardening = {
    CapabilityBoundingSet = "";
    AmbientCapabilities = "";
    NoNewPrivileges = true;
    ProtectSystem = "strict";
    ProtectHome = true;
    PrivateTmp = true;
    PrivateDevices = true;
    PrivateMounts = true;
    ProtectProc = "invisible";
    ProcSubset = "pid";
    ProtectKernelTunables = true;
    ProtectKernelModules = true;
    ProtectKernelLogs = true;
    ProtectClock = true;
    ProtectHostname = true;
    ProtectControlGroups = true;
    RestrictNamespaces = true;
    RestrictRealtime = true;
    RestrictSUIDSGID = true;
    LockPersonality = true;
    MemoryDenyWriteExecute = true;
    RemoveIPC = true;
    KeyringMode = "private";
    DevicePolicy = "closed";
    UMask = "0077";
    SystemCallArchitectures = "native";
    # systemd before 257 leaves the Landlock and seccomp calls out of @system-service; the
    # daemons install their own inner sandbox with them and would die of SIGSYS without.
    SystemCallFilter = [
      "@system-service landlock_create_ruleset landlock_add_rule landlock_restrict_self seccomp"
      "~@privileged @resources @setuid @keyring"
    ];
  };

  # Keys no boxmaker unit may carry; the offline check fails when one appears.
  forbidden = [
    "PrivateUsers"
    "DynamicUser"
  ];

  # One system user and group each, static. bx-gateway and bx-memory exist before their
  # daemons do: bx-memory is already the client of brokerd's state.sock.
  users = {
    bx-loop = "the agent loop (loopd)";
    bx-broker = "the tool broker (brokerd)";
    bx-infer = "the inference proxy (inferproxy)";
    bx-gateway = "the network gateway for tools (gatewayd)";
    bx-memory = "the memory filer (memoryd)";
  };

  # The client named "@owner" is the owner's login account (services.boxmaker.owner).
  owner = "@owner";

  # Every socket: its directory under <home>/run (0700, owned by the client), its
  # client (who alone may connect) and its server. The systemd FileDescriptorName is the
  # socket's name, which is also its file name without ".sock".
  sockets = {
    loop = {
      dir = "channel-loop";
      client = owner;
      server = "loopd";
    };
    broker = {
      dir = "loop-broker";
      client = "bx-loop";
      server = "brokerd";
    };
    state = {
      dir = "memory-broker";
      client = "bx-memory";
      server = "brokerd";
    };
    admin = {
      dir = "owner-broker";
      client = owner;
      server = "brokerd";
    };
    infer = {
      dir = "loop-infer";
      client = "bx-loop";
      server = "inferproxy";
    };
    # Later, with their daemons:
    #   memory  = { dir = "loop-memory";    client = "bx-loop";   server = "memoryd"; };
    #   gateway = { dir = "broker-gateway"; client = "bx-broker"; server = "gatewayd"; };
  };

  # Every daemon: its user, its state directory under <home>, the sockets it serves (in
  # the order it binds them) and those it connects to, and whether it may use IP at all.
  daemons = {
    loopd = {
      user = "bx-loop";
      stateDir = "loop";
      serves = [ "loop" ];
      uses = [
        "broker"
        "infer"
      ];
      network = false;
      description = "boxmaker agent loop";
    };
    brokerd = {
      user = "bx-broker";
      stateDir = "broker";
      serves = [
        "state"
        "broker"
        "admin"
      ];
      uses = [ ];
      network = false;
      description = "boxmaker tool broker";
    };
    inferproxy = {
      user = "bx-infer";
      stateDir = "infer";
      serves = [ "infer" ];
      uses = [ ];
      network = true;
      description = "boxmaker inference proxy";
    };
    # Later:
    #   gatewayd = { user = "bx-gateway"; stateDir = "gateway"; serves = [ "gateway" ];
    #                uses = [ ]; network = true; description = "boxmaker network gateway"; };
    #   memoryd  = { user = "bx-memory"; stateDir = "memory"; serves = [ "memory" ];
    #                uses = [ "state" ]; network = <Honcho is remote>; description = ...; };
  };

  daemonNames = builtins.attrNames daemons;
  socketNames = builtins.attrNames sockets;

  socketUnit = name: "boxmaker-${name}.socket";
  socketDir = home: name: "${home}/run/${sockets.${name}.dir}";
  socketPath = home: name: "${socketDir home name}/${name}.sock";
  stateDir = home: daemon: "${home}/${daemons.${daemon}.stateDir}";

  # The user and group a socket belongs to, with "@owner" resolved.
  clientOf =
    { ownerUser, ownerGroup }:
    name:
    let
      c = sockets.${name}.client;
    in
    if c == owner then
      {
        user = ownerUser;
        group = ownerGroup;
      }
    else
      {
        user = c;
        group = c;
      };

  # The directories of daemons.md: path, mode, user, group. systemd-tmpfiles makes them
  # (and tightens them when they exist) before any socket unit starts, so a socket unit's
  # DirectoryMode= never makes one owned by root.
  directories =
    {
      home,
      ownerUser,
      ownerGroup,
    }:
    [
      {
        path = home;
        mode = "0711";
        user = "root";
        group = "root";
      }
      {
        path = "${home}/run";
        mode = "0711";
        user = "root";
        group = "root";
      }
    ]
    ++ map (d: {
      path = stateDir home d;
      mode = "0700";
      user = daemons.${d}.user;
      group = daemons.${d}.user;
    }) daemonNames
    ++ map (
      s:
      let
        c = clientOf { inherit ownerUser ownerGroup; } s;
      in
      {
        path = socketDir home s;
        mode = "0700";
        inherit (c) user group;
      }
    ) socketNames;

  # What a daemon's unit may write: its own state directory and the directories of the
  # sockets it is the client of (the same set its Landlock ruleset allows).
  readWritePaths = home: daemon: [ (stateDir home daemon) ] ++ map (socketDir home) daemons.${daemon}.uses;

  # The network part of the hardening: no IP at all unless the daemon needs it.
  networkKeys =
    daemon:
    if daemons.${daemon}.network then
      {
        RestrictAddressFamilies = "AF_UNIX AF_INET AF_INET6";
      }
    else
      {
        RestrictAddressFamilies = "AF_UNIX";
        IPAddressDeny = "any";
        PrivateNetwork = true;
      };

  # The [Service] keys a daemon's process runs under, shared by its serve unit and (for
  # loopd) the selftest unit.
  sandboxKeys =
    {
      home,
      daemon,
      extraReadWritePaths ? [ ],
      readOnlyHome ? false,
      credentials ? [ ],
    }:
    hardening
    // networkKeys daemon
    // {
      User = daemons.${daemon}.user;
      Group = daemons.${daemon}.user;
      ReadWritePaths = readWritePaths home daemon ++ extraReadWritePaths;
      SyslogIdentifier = daemon;
    }
    // (if readOnlyHome then { ProtectHome = "read-only"; } else { })
    // (if credentials == [ ] then { } else { LoadCredential = credentials; });

  # Every unit of the box as { Unit, Service | Socket, Install } sections of systemd keys.
  # Values: strings, integers, booleans ("true"/"false"), or lists (one line per item),
  # as NixOS's serviceConfig takes them.
  #   exe daemon        -> the daemon's executable
  #   configFile daemon -> its generated TOML configuration
  #   runbook           -> the installed docs/runbook.md every refusal line points at
  #   credentials, extraReadWritePaths, readOnlyHome: per daemon, from the module's options
  render =
    {
      home,
      runbook,
      ownerUser,
      ownerGroup,
      exe,
      configFile,
      credentials ? { },
      extraReadWritePaths ? { },
      readOnlyHome ? { },
    }:
    let
      sandbox =
        daemon:
        sandboxKeys {
          inherit home daemon;
          credentials = credentials.${daemon} or [ ];
          extraReadWritePaths = extraReadWritePaths.${daemon} or [ ];
          readOnlyHome = readOnlyHome.${daemon} or false;
        };

      usedSocketUnits = daemon: map socketUnit daemons.${daemon}.uses;
      servedSocketUnits = daemon: map socketUnit daemons.${daemon}.serves;

      serviceUnit = daemon: {
        name = "${daemon}.service";
        value = {
          Unit = {
            Description = daemons.${daemon}.description;
            Documentation = "file:${runbook}";
            Requires = servedSocketUnits daemon;
            After = servedSocketUnits daemon ++ usedSocketUnits daemon;
            Wants = usedSocketUnits daemon;
            StartLimitIntervalSec = 300;
            StartLimitBurst = 5;
          };
          Service = sandbox daemon // {
            Type = "simple";
            ExecStart = "${exe daemon} serve --config ${configFile daemon}";
            Sockets = servedSocketUnits daemon;
            Restart = "on-failure";
            RestartSec = 5;
          };
          Install = {
            WantedBy = [ "multi-user.target" ];
          };
        };
      };

      socketUnitOf =
        name:
        let
          s = sockets.${name};
          c = clientOf { inherit ownerUser ownerGroup; } name;
        in
        {
          name = socketUnit name;
          value = {
            Unit = {
              Description = "boxmaker ${name}.sock (${c.user} to ${s.server})";
              After = [
                "systemd-tmpfiles-setup.service"
                "systemd-tmpfiles-resetup.service"
              ];
            };
            Socket = {
              ListenStream = socketPath home name;
              SocketUser = c.user;
              SocketGroup = c.group;
              SocketMode = "0600";
              DirectoryMode = "0700";
              FileDescriptorName = name;
              Service = "${s.server}.service";
              RemoveOnStop = true;
            };
            Install = {
              WantedBy = [ "sockets.target" ];
            };
          };
        };

      # `loopd selftest` as bx-loop: check the config, ping every socket loopd uses. No
      # model request. `bxctl selftest` starts it on the device.
      selftestUnit = {
        name = "boxmaker-selftest.service";
        value = {
          Unit = {
            Description = "boxmaker selftest (loopd selftest)";
            Documentation = "file:${runbook}";
            Wants = usedSocketUnits "loopd";
            After = usedSocketUnits "loopd";
          };
          Service = sandbox "loopd" // {
            Type = "oneshot";
            ExecStart = "${exe "loopd"} selftest --config ${configFile "loopd"}";
          };
          Install = { };
        };
      };
    in
    builtins.listToAttrs (map serviceUnit daemonNames ++ map socketUnitOf socketNames ++ [ selftestUnit ]);
in
{
  inherit
    hardening
    forbidden
    users
    owner
    sockets
    daemons
    daemonNames
    socketNames
    socketUnit
    socketDir
    socketPath
    stateDir
    clientOf
    directories
    readWritePaths
    render
    ;
}

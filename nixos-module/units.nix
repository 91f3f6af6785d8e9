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
    PrivateIPC = true;
    # No IP socket may bind (hardening.md: TCP bind is refused to all); AF_UNIX is unaffected.
    SocketBindDeny = "any";
    # Nothing written at run time can be executed: only the store is executable, and the
    # directories a daemon's tools work in (sandboxKeys adds them to ExecPaths=).
    NoExecPaths = "/";
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

  # The device check's unit (boxmaker-check@.service), the one unit that runs as root: it
  # takes each socket's client's ids (setresuid/setresgid per thread: CAP_SETUID, CAP_SETGID),
  # connects as root where the peer check must refuse root and reads the 0700 directories
  # (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH), and reads every daemon's /proc (so no
  # ProtectProc=). It writes nothing and uses no IP. It runs systemctl, journalctl and
  # systemd-analyze, wherever the system keeps them, so it has no NoExecPaths=.
  checkHardening = {
    CapabilityBoundingSet = "CAP_SETUID CAP_SETGID CAP_DAC_OVERRIDE CAP_DAC_READ_SEARCH";
    AmbientCapabilities = "";
    NoNewPrivileges = true;
    ProtectSystem = "strict";
    ProtectHome = true;
    PrivateTmp = true;
    PrivateDevices = true;
    PrivateMounts = true;
    PrivateNetwork = true;
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
    KeyringMode = "private";
    PrivateIPC = true;
    RestrictAddressFamilies = "AF_UNIX";
    IPAddressDeny = "any";
    SocketBindDeny = "any";
    DevicePolicy = "closed";
    UMask = "0077";
    SystemCallArchitectures = "native";
    SystemCallFilter = [
      "@system-service"
      "~@resources @keyring @chown @memlock"
    ];
    TasksMax = 32;
    MemoryMax = "128M";
  };

  # Keys no boxmaker unit may carry; the offline check fails when one appears.
  forbidden = [
    "PrivateUsers"
    "DynamicUser"
  ];

  # Who is who: the system users, the sockets (directory under <home>/run, client, server)
  # and the daemons (user, state directory under <home>, the sockets it serves in the order
  # it binds them and those it connects to, whether it may use IP). Plain JSON, so the
  # daemons' tests can read the very same file: one source of truth for socket names, paths
  # and users.
  #
  #   - A socket's FileDescriptorName is its key, and its file name is "<key>.sock".
  #   - The client "@owner" is the owner's login account (services.boxmaker.owner).
  #   - Every user gets its own group of the same name. bx-gateway and bx-memory exist
  #     before their daemons do: bx-memory is already the client of brokerd's state.sock.
  #   - gatewayd and memoryd come with their daemons: one entry each in "daemons", and the
  #     sockets "gateway" (broker-gateway, client bx-broker) and "memory" (loop-memory,
  #     client bx-loop) in "sockets".
  #   - "ondemand": what the owner starts by connecting to a socket of their own (no sudo, no
  #     polkit): "selftest" runs `loopd selftest` as bx-loop, "check" the device check (`bxctl
  #     check`) as root, each instance's output sent back on the connection.
  #   - "device.keys": the root-only directory for keys placed by hand (docs/install.md,
  #     "Secrets"); /run/keys is a ramfs on NixOS, gone at the next boot.
  layout = builtins.fromJSON (builtins.readFile ./layout.json);

  # What is wrong with a layout, as sentences; the module asserts and the offline check
  # fails on any. Every name a socket or daemon refers to must exist, every socket has one
  # server that lists it, and no two sockets share a directory.
  problemsOf =
    l:
    let
      socketNames = builtins.attrNames l.sockets;
      daemonNames = builtins.attrNames l.daemons;
      isName = re: n: builtins.match re n != null;
      userKnown = u: u == l.owner || l.users ? ${u};
      dirs = map (s: l.sockets.${s}.dir) socketNames;
      perSocket = builtins.concatMap (
        s:
        let
          sock = l.sockets.${s};
        in
        (if isName "[a-z]+" s then [ ] else [ "socket name `${s}` is not lowercase letters" ])
        ++ (if isName "[a-z]+-[a-z]+" sock.dir then [ ] else [ "socket ${s}: directory `${sock.dir}` is not <client>-<server>" ])
        ++ (if userKnown sock.client then [ ] else [ "socket ${s}: client `${sock.client}` is not a known user" ])
        ++ (
          if l.daemons ? ${sock.server} && builtins.elem s l.daemons.${sock.server}.serves then
            [ ]
          else
            [ "socket ${s}: its server `${sock.server}` is not a daemon that serves it" ]
        )
        ++ (
          if builtins.length (builtins.filter (d: d == sock.dir) dirs) == 1 then
            [ ]
          else
            [ "socket ${s}: directory `${sock.dir}` is shared" ]
        )
      ) socketNames;
      perDaemon = builtins.concatMap (
        d:
        let
          dm = l.daemons.${d};
        in
        (if l.users ? ${dm.user} then [ ] else [ "daemon ${d}: user `${dm.user}` is not in users" ])
        ++ map (s: "daemon ${d}: serves the unknown socket `${s}`") (
          builtins.filter (s: !(l.sockets ? ${s}) || l.sockets.${s}.server != d) dm.serves
        )
        ++ map (s: "daemon ${d}: uses the unknown socket `${s}`") (builtins.filter (s: !(l.sockets ? ${s})) dm.uses)
      ) daemonNames;
    in
    perSocket ++ perDaemon;

  problems = problemsOf layout;

  inherit (layout)
    users
    owner
    sockets
    daemons
    ;

  # Where the sockets live on the device: /run/boxmaker, not among the state under <home>
  # (bxcore::layout::DEVICE_RUN says the same; its test reads this file).
  runDir = layout.device.run;
  keysDir = layout.device.keys;
  inherit (layout) ondemand;

  daemonNames = builtins.attrNames daemons;
  socketNames = builtins.attrNames sockets;

  # Every unit carries the boxmaker- prefix: generic names (loopd.service) would collide.
  socketUnit = name: "boxmaker-${name}.socket";
  serviceUnit = daemon: "boxmaker-${daemon}.service";
  socketDir = name: "${runDir}/${sockets.${name}.dir}";
  socketPath = name: "${socketDir name}/${name}.sock";
  stateDir = home: daemon: "${home}/${daemons.${daemon}.state_dir}";
  # The owner's own part of the system message, which loopd reads at each new session
  # (crates/loopd/src/baseline.rs).
  systemPromptPath = home: "${stateDir home "loopd"}/system.md";
  ondemandSocketUnit = name: "boxmaker-${name}.socket";
  ondemandService = name: "boxmaker-${name}@.service";
  ondemandDir = name: "${runDir}/${ondemand.${name}.dir}";
  ondemandSocketPath = name: "${ondemandDir name}/${name}.sock";

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
  # DirectoryMode= never makes one owned by root. The state under <home>, the sockets under
  # runDir (a tmpfs: tmpfiles makes it again at every boot).
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
        path = runDir;
        mode = "0711";
        user = "root";
        group = "root";
      }
      {
        path = keysDir;
        mode = "0700";
        user = "root";
        group = "root";
      }
    ]
    ++ builtins.concatMap (
      d:
      map
        (path: {
          inherit path;
          mode = "0700";
          user = daemons.${d}.user;
          group = daemons.${d}.user;
        })
        ([ (stateDir home d) ] ++ map (x: "${stateDir home d}/${x}") (daemons.${d}.exec_dirs or [ ]))
    ) daemonNames
    ++ map (
      s:
      let
        c = clientOf { inherit ownerUser ownerGroup; } s;
      in
      {
        path = socketDir s;
        mode = "0700";
        inherit (c) user group;
      }
    ) socketNames
    ++ map (n: {
      path = ondemandDir n;
      mode = "0700";
      user = ownerUser;
      group = ownerGroup;
    }) (builtins.attrNames ondemand);

  # A system user's description (its GECOS field): no `:`, which NixOS's passwdEntry type
  # and systemd-sysusers both refuse.
  userDescription = u: "boxmaker, ${users.${u}}";

  # The exposure `systemd-analyze security` may give each service unit at most, times ten
  # (its `--threshold=` takes it so): 1.5 on the 0 to 10 scale (nix.md).
  securityThreshold = 15;

  # What the device check (`bxctl check`) reads to know the box it checks: the module
  # installs it as /etc/boxmaker/device.json, the twin the same rendering. Every fact in it
  # comes from this file, so the check expects what the units and tmpfiles rules make.
  #   configFile daemon -> its generated TOML configuration
  deviceManifest =
    {
      home,
      ownerUser,
      ownerGroup,
      configFile,
      without ? [ ],
    }:
    {
      inherit home securityThreshold;
      owner = {
        user = ownerUser;
        group = ownerGroup;
      };
      services = map (d: {
        daemon = d;
        unit = serviceUnit d;
        user = daemons.${d}.user;
        group = daemons.${d}.user;
        config = configFile d;
      }) (runningDaemons without);
      sockets = map (
        s:
        let
          c = clientOf { inherit ownerUser ownerGroup; } s;
        in
        {
          name = s;
          unit = socketUnit s;
          path = socketPath s;
          server = sockets.${s}.server;
          inherit (c) user group;
        }
      ) (runningSockets without);
      directories = directories { inherit home ownerUser ownerGroup; };
      # The sockets the owner starts the selftest and the device check on.
      ondemand = builtins.mapAttrs (n: _: ondemandSocketPath n) ondemand;
    };

  # The daemons a device runs: all of layout.json's but those left `without` (channeld when
  # no Matrix channel is configured), and the sockets those serve.
  runningDaemons = without: builtins.filter (d: !(builtins.elem d without)) daemonNames;
  runningSockets =
    without: builtins.filter (s: !(builtins.elem sockets.${s}.server without)) socketNames;

  # What a daemon's unit may write: its own state directory and the directories of the
  # sockets it is the client of (the same set its Landlock ruleset allows).
  readWritePaths = home: daemon: [ (stateDir home daemon) ] ++ map socketDir daemons.${daemon}.uses;

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

  # inferproxy's IP reach from its provider's base URL (hardening.md, "inferproxy's egress"):
  # no provider (the script) no IP at all; a URL that names an address, that address and
  # loopback only; a URL that names a host (whose addresses systemd cannot know) everything
  # but link-local, where the cloud metadata service answers.
  ipAddressesOfProvider =
    baseUrl:
    let
      v4 = builtins.match "https?://([0-9]+[.][0-9]+[.][0-9]+[.][0-9]+)([:/].*)?" baseUrl;
      v6 = builtins.match "https?://[[]([0-9a-fA-F:.]+)[]]([:/].*)?" baseUrl;
      address =
        if v4 != null then
          builtins.head v4
        else if v6 != null then
          builtins.head v6
        else
          null;
    in
    if baseUrl == null then
      { IPAddressDeny = "any"; }
    else if address != null then
      {
        IPAddressDeny = "any";
        IPAddressAllow = [
          address
          "localhost"
        ];
      }
    else
      { IPAddressDeny = "link-local"; };

  # gatewayd's IP reach (hardening.md, "gatewayd's egress"): the web, but no local range,
  # denied for every packet below the process; `allow` re-allows the internal addresses its
  # hosts list (`addresses`) and its name servers (`[dns] servers`), which the module
  # collects from settings.gatewayd.
  ipAddressesOfGateway =
    allow:
    {
      IPAddressDeny = [
        "localhost"
        "link-local"
        "multicast"
        "0.0.0.0/8"
        "10.0.0.0/8"
        "100.64.0.0/10"
        "172.16.0.0/12"
        "192.168.0.0/16"
        "192.0.0.0/24"
        "198.18.0.0/15"
        "240.0.0.0/4"
        "::ffff:0:0/96"
        "64:ff9b:1::/48"
        "fc00::/7"
        "fec0::/10"
      ];
    }
    // (if allow == [ ] then { } else { IPAddressAllow = allow; });

  # The addresses (no port) of `[dns] servers` entries: "9.9.9.9:53", "[2620:fe::fe]:53".
  addressOfServer =
    s:
    let
      v6 = builtins.match "[[]([0-9a-fA-F:.]+)[]]:[0-9]+" s;
      v4 = builtins.match "([0-9.]+):[0-9]+" s;
    in
    if v6 != null then builtins.head v6 else if v4 != null then builtins.head v4 else s;

  # What gatewayd's configuration lets it reach inside the denied ranges.
  gatewayAllows =
    settings:
    builtins.concatMap (h: h.addresses or [ ]) (settings.hosts or [ ])
    ++ map addressOfServer ((settings.dns or { }).servers or [ ]);

  # The [Service] keys a daemon's process runs under, shared by its serve unit and (for
  # loopd) the selftest unit.
  sandboxKeys =
    {
      home,
      daemon,
      extraReadWritePaths ? [ ],
      readOnlyHome ? false,
      credentials ? [ ],
      ipAddresses ? { },
    }:
    hardening
    // networkKeys daemon
    // ipAddresses
    // {
      User = daemons.${daemon}.user;
      Group = daemons.${daemon}.user;
      # A workspace root is optional for the namespace ("-"): a missing one is then reported
      # by brokerd itself (its Landlock rule cannot open it), with a runbook pointer, instead
      # of the unit failing at namespace setup (status 226/NAMESPACE) with no reason given.
      ReadWritePaths = readWritePaths home daemon ++ map (p: "-${p}") extraReadWritePaths;
      # The store, plus where the daemon's tools build and run things: its exec_dirs (made
      # by tmpfiles with its state directory) and the writable workspace roots.
      ExecPaths =
        [ "/nix/store" ]
        ++ map (d: "${stateDir home daemon}/${d}") (daemons.${daemon}.exec_dirs or [ ])
        ++ map (p: "-${p}") extraReadWritePaths;
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
  #   ipAddresses: per daemon, IPAddressAllow=/IPAddressDeny= narrowed from the module's
  #     options (inferproxy: the provider's address, ipAddressesOfProvider below; gatewayd:
  #     the local ranges denied, ipAddressesOfGateway)
  #   without: the daemons the device does not run (their units and sockets left out)
  #   systemPrompt, install: the owner's system prompt file in the store (null: the module
  #     leaves systemPromptPath alone) and the `install` program that copies it there in
  #     loopd's unit (ExecStartPre=)
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
      ipAddresses ? { },
      without ? [ ],
      systemPrompt ? null,
      install ? null,
    }:
    let
      # The owner's system prompt (services.boxmaker.systemPrompt), copied into loopd's own
      # directory as loopd's user before loopd starts: bx-loop's, 0600, replaced at each start
      # (so at each switch that changes it, which restarts loopd).
      systemPromptKeys =
        daemon:
        if daemon == "loopd" && systemPrompt != null then
          { ExecStartPre = "${install} -m 0600 -T ${systemPrompt} ${systemPromptPath home}"; }
        else
          { };

      sandbox =
        daemon:
        sandboxKeys {
          inherit home daemon;
          # gatewayd never runs without its deny list, whatever the caller passes.
          ipAddresses =
            ipAddresses.${daemon} or (if daemon == "gatewayd" then ipAddressesOfGateway [ ] else { });
          credentials = credentials.${daemon} or [ ];
          extraReadWritePaths = extraReadWritePaths.${daemon} or [ ];
          readOnlyHome = readOnlyHome.${daemon} or false;
        };

      usedSocketUnits = daemon: map socketUnit daemons.${daemon}.uses;
      servedSocketUnits = daemon: map socketUnit daemons.${daemon}.serves;

      serviceUnitOf = daemon: {
        name = serviceUnit daemon;
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
          Service = sandbox daemon // systemPromptKeys daemon // {
            # READY=1 comes once every socket is served: a start (at boot, at switch) waits
            # for it, so a daemon that refuses its configuration fails the start job.
            Type = "notify";
            # switch-to-configuration stops a changed service that has Sockets= and restarts
            # only its sockets, so a broken configuration would show only at the next
            # connect. Not socket-activated: it restarts the sockets and starts the service,
            # and a start that fails fails the switch (nixpkgs' switch-to-configuration-ng,
            # handle_modified_unit, reads this key from [Service]).
            X-NotSocketActivated = true;
            ExecStart = "${exe daemon} serve --config ${configFile daemon}";
            Sockets = servedSocketUnits daemon;
            Restart = "on-failure";
            RestartSec = 5;
            # The kernel's line behind the daemon's own bounds (docs/architecture.md): each
            # socket's connection cap (at most 56 connections over brokerd's three sockets,
            # each a thread) plus the accept threads, and the frame budget (4 MiB of frames
            # being read) with room for the heap at rest. loopd runs a worker process per live
            # session besides (`[workers] max`, 16): each is a few tasks (its main thread, a
            # turn, its cancel watch, its outbox sender) and a listener in the monitor, and
            # a few MB.
            TasksMax = if daemon == "loopd" then 256 else 96;
            MemoryMax = if daemon == "loopd" then "256M" else "128M";
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
              ListenStream = socketPath name;
              SocketUser = c.user;
              SocketGroup = c.group;
              SocketMode = "0600";
              DirectoryMode = "0700";
              FileDescriptorName = name;
              Service = serviceUnit s.server;
              RemoveOnStop = true;
            };
            Install = {
              WantedBy = [ "sockets.target" ];
            };
          };
        };

      # What the owner starts (layout.json's "ondemand"): a socket of theirs, 0600 in a 0700
      # directory of theirs, with Accept=yes. Each connection starts one instance of the
      # template service, at most one at a time, whose standard output is the connection:
      # `bxctl selftest` and `bxctl check` (as the owner) connect and read the report. No sudo
      # and no polkit: systemd starts the unit because the owner may open the socket.
      ondemandSocketOf = name: {
          name = ondemandSocketUnit name;
          value = {
            Unit = {
              Description = "boxmaker ${name}.sock (${ownerUser} starts ${ondemand.${name}.description})";
              After = [
                "systemd-tmpfiles-setup.service"
                "systemd-tmpfiles-resetup.service"
              ];
            };
            Socket = {
              ListenStream = ondemandSocketPath name;
              SocketUser = ownerUser;
              SocketGroup = ownerGroup;
              SocketMode = "0600";
              DirectoryMode = "0700";
              Accept = true;
              MaxConnections = 1;
              RemoveOnStop = true;
            };
            Install = {
              WantedBy = [ "sockets.target" ];
            };
          };
        };

      # `loopd selftest` as bx-loop, in loopd's own sandbox: check the config, ping every
      # socket loopd uses, ask brokerd for its tools. No model request.
      selftestService = {
        name = ondemandService "selftest";
        value = {
          Unit = {
            Description = "boxmaker selftest (loopd selftest), started by the owner";
            Documentation = "file:${runbook}";
            Wants = usedSocketUnits "loopd";
            After = usedSocketUnits "loopd";
          };
          Service = sandbox "loopd" // {
            ExecStart = "${exe "loopd"} selftest --config ${configFile "loopd"}";
            StandardInput = "null";
            StandardOutput = "socket";
            StandardError = "journal";
          };
          Install = { };
        };
      };

      # `bxctl check --json` as root: the device check reads every daemon's /proc and talks to
      # each socket as its client and as a refused peer, which needs root's ids and these
      # capabilities (checkHardening); its report goes back to the owner on the connection.
      checkService = {
        name = ondemandService "check";
        value = {
          Unit = {
            Description = "boxmaker device check (bxctl check), started by the owner";
            Documentation = "file:${runbook}";
          };
          Service = checkHardening // {
            ExecStart = "${exe "bxctl"} check --json";
            StandardInput = "null";
            StandardOutput = "socket";
            StandardError = "journal";
            SyslogIdentifier = "bxctl-check";
          };
          Install = { };
        };
      };
    in
    builtins.listToAttrs (
      map serviceUnitOf (runningDaemons without)
      ++ map socketUnitOf (runningSockets without)
      ++ map ondemandSocketOf (builtins.attrNames ondemand)
      ++ [
        selftestService
        checkService
      ]
    );

  hasPrefix = p: str: builtins.substring 0 (builtins.stringLength p) str == p;
  hasSuffix =
    x: str:
    let
      ls = builtins.stringLength str;
      lx = builtins.stringLength x;
    in
    ls >= lx && builtins.substring (ls - lx) lx str == x;

  # Every unit of the box as the module renders it, from what the module's options hold: the
  # module (default.nix), the offline check (offline.nix) and the twin (twin.nix) all call
  # this, so no caller decides a unit's keys on its own.
  #   settings        each daemon's configuration as the module writes it (settings.<daemon>)
  #   apiKeyFile      services.boxmaker.inference.apiKeyFile (null: none)
  #   honcho          services.boxmaker.memory.honcho ({ url, apiKeyFile })
  #   credentialFiles services.boxmaker.gateway.credentialFiles (name -> file)
  #   matrixTokenFile services.boxmaker.channels.matrix.tokenFile (null: none)
  #   without         the daemons the device does not run (channeld without the Matrix channel)
  #   systemPrompt    services.boxmaker.systemPrompt's text as a file in the store (null: the
  #                   module leaves system.md alone), and install the coreutils `install` that
  #                   copies it for loopd
  # and home, runbook, ownerUser, ownerGroup, exe, configFile as `render` takes them.
  renderDevice =
    {
      home,
      runbook,
      ownerUser,
      ownerGroup,
      exe,
      configFile,
      settings,
      apiKeyFile ? null,
      honcho ? { },
      credentialFiles ? { },
      matrixTokenFile ? null,
      without ? [ ],
      systemPrompt ? null,
      install ? null,
    }:
    let
      roots = ((settings.brokerd or { }).workspace or { }).roots or [ ];
      underHome = p: builtins.any (h: p == h || hasPrefix "${h}/" p) [ "/home" "/root" "/run/user" ];
      honchoUrl = honcho.url or null;
      honchoKey = honcho.apiKeyFile or null;
      homeserver = ((settings.channeld or { }).matrix or { }).homeserver or "";
    in
    render {
      inherit
        home
        runbook
        ownerUser
        ownerGroup
        exe
        configFile
        without
        systemPrompt
        install
        ;
      credentials = {
        inferproxy = if apiKeyFile == null then [ ] else [ "api_key:${apiKeyFile}" ];
        memoryd = if honchoKey == null then [ ] else [ "honcho_key:${honchoKey}" ];
        gatewayd = map (n: "${n}:${credentialFiles.${n}}") (builtins.attrNames credentialFiles);
        channeld = if matrixTokenFile == null then [ ] else [ "matrix_token:${matrixTokenFile}" ];
      };
      ipAddresses = {
        inferproxy = ipAddressesOfProvider (((settings.inferproxy or { }).provider or { }).base_url or null);
        gatewayd = ipAddressesOfGateway (gatewayAllows (settings.gatewayd or { }));
        # channeld reaches its homeserver only: its address when the URL names one, else all
        # but link-local; no homeserver configured, no IP at all.
        channeld = ipAddressesOfProvider (if homeserver == "" then null else homeserver);
        # memoryd has no network (layout.json) unless Honcho is configured; then IP to it only,
        # as inferproxy to its provider.
        memoryd =
          if honchoUrl == null then
            { }
          else
            {
              RestrictAddressFamilies = "AF_UNIX AF_INET AF_INET6";
              PrivateNetwork = false;
            }
            // ipAddressesOfProvider honchoUrl;
      };
      extraReadWritePaths.brokerd = map (r: r.path) (builtins.filter (r: r.writable or false) roots);
      readOnlyHome.brokerd = builtins.any (r: underHome r.path) roots;
    };

  # A rendered unit as NixOS's options for it (systemd.services.<name>, systemd.sockets.<name>),
  # each key where nixpkgs has an option for it: description, documentation, requires, wants,
  # after, startLimitIntervalSec, startLimitBurst, notSocketActivated, listenStreams and
  # wantedBy; unitConfig, serviceConfig and socketConfig hold only what has none.
  #   nixos rendered -> { services = { <name> = ...; }; sockets = { <name> = ...; }; }
  unitOptionKeys = {
    Requires = "requires";
    Wants = "wants";
    After = "after";
    Before = "before";
  };
  toNixos =
    u:
    let
      unit = u.Unit or { };
      listed = builtins.listToAttrs (
        map (k: {
          name = unitOptionKeys.${k};
          value = unit.${k};
        }) (builtins.filter (k: unit ? ${k}) (builtins.attrNames unitOptionKeys))
      );
      rest = removeAttrs unit (
        builtins.attrNames unitOptionKeys
        ++ [
          "Description"
          "Documentation"
          "StartLimitIntervalSec"
          "StartLimitBurst"
        ]
      );
    in
    {
      description = unit.Description;
      wantedBy = (u.Install or { }).WantedBy or [ ];
    }
    // listed
    // (if unit ? Documentation then { documentation = [ unit.Documentation ]; } else { })
    // (if unit ? StartLimitIntervalSec then { startLimitIntervalSec = unit.StartLimitIntervalSec; } else { })
    // (if unit ? StartLimitBurst then { startLimitBurst = unit.StartLimitBurst; } else { })
    // (if rest == { } then { } else { unitConfig = rest; })
    // (
      if u ? Service then
        { serviceConfig = removeAttrs u.Service [ "X-NotSocketActivated" ]; }
        // (if u.Service.X-NotSocketActivated or false then { notSocketActivated = true; } else { })
      else
        {
          listenStreams = [ u.Socket.ListenStream ];
          socketConfig = removeAttrs u.Socket [ "ListenStream" ];
        }
    );
  nixos =
    rendered:
    let
      of =
        suffix:
        builtins.listToAttrs (
          map (n: {
            name = builtins.substring 0 (builtins.stringLength n - builtins.stringLength suffix) n;
            value = toNixos rendered.${n};
          }) (builtins.filter (hasSuffix suffix) (builtins.attrNames rendered))
        );
    in
    {
      services = of ".service";
      sockets = of ".socket";
    };

  # A unit's file from its NixOS options, as nixpkgs' systemd-lib writes it (serviceToUnit,
  # socketToUnit, commonUnitText; the [Unit] keys of the typed options as its unitConfig
  # adds them): one section per kind, keys sorted, a list one line per item except the
  # dependency lists, which systemd-lib joins with spaces; booleans "true"/"false". What NixOS
  # adds on top (Environment=PATH, X-Restart-Triggers) carries no hardening and is left out.
  unitText =
    kind: o:
    let
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
      joined = k: opt: if (o.${opt} or [ ]) == [ ] then { } else { ${k} = toString o.${opt}; };
      unitKeys =
        (o.unitConfig or { })
        // { Description = o.description; }
        // joined "Requires" "requires"
        // joined "Wants" "wants"
        // joined "After" "after"
        // joined "Before" "before"
        // (if (o.documentation or [ ]) == [ ] then { } else { Documentation = toString o.documentation; })
        // (if o ? startLimitIntervalSec then { StartLimitIntervalSec = o.startLimitIntervalSec; } else { })
        // (if o ? startLimitBurst then { StartLimitBurst = o.startLimitBurst; } else { });
    in
    section "Unit" unitKeys
    + (
      if kind == "service" then
        section "Service" (
          (if o.notSocketActivated or false then { X-NotSocketActivated = true; } else { })
          // o.serviceConfig
        )
      else
        section "Socket" (o.socketConfig // { ListenStream = o.listenStreams; })
    )
    + (if o.wantedBy == [ ] then "" else "[Install]\nWantedBy=${toString o.wantedBy}\n");

  # Every unit's file, by file name, from `nixos`'s options.
  unitFiles =
    n:
    builtins.listToAttrs (
      map (k: {
        name = "${k}.service";
        value = unitText "service" n.services.${k};
      }) (builtins.attrNames n.services)
      ++ map (k: {
        name = "${k}.socket";
        value = unitText "socket" n.sockets.${k};
      }) (builtins.attrNames n.sockets)
    );
in
{
  inherit
    hardening
    forbidden
    problemsOf
    problems
    users
    owner
    sockets
    daemons
    daemonNames
    socketNames
    socketUnit
    serviceUnit
    runDir
    socketDir
    socketPath
    stateDir
    systemPromptPath
    clientOf
    directories
    securityThreshold
    userDescription
    deviceManifest
    readWritePaths
    runningDaemons
    runningSockets
    ipAddressesOfProvider
    ipAddressesOfGateway
    gatewayAllows
    render
    renderDevice
    nixos
    unitFiles
    keysDir
    ondemand
    ondemandSocketPath
    checkHardening
    ;
}

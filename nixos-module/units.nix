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

  daemonNames = builtins.attrNames daemons;
  socketNames = builtins.attrNames sockets;

  # Every unit carries the boxmaker- prefix: generic names (loopd.service) would collide.
  socketUnit = name: "boxmaker-${name}.socket";
  serviceUnit = daemon: "boxmaker-${daemon}.service";
  socketDir = name: "${runDir}/${sockets.${name}.dir}";
  socketPath = name: "${socketDir name}/${name}.sock";
  stateDir = home: daemon: "${home}/${daemons.${daemon}.state_dir}";

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
    ) socketNames;

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
    }:
    let
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
          Service = sandbox daemon // {
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
            # being read) with room for the heap at rest.
            TasksMax = 96;
            MemoryMax = "128M";
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
    builtins.listToAttrs (
      map serviceUnitOf (runningDaemons without)
      ++ map socketUnitOf (runningSockets without)
      ++ [ selftestUnit ]
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
    ;
}

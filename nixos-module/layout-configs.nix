# The keys of each daemon's configuration that follow from layout.json, the home and the
# owner alone, and from no option: `[paths]`, `[sockets]`, `[peers]`, `[sandbox]`, and loopd's
# `[broker]` and `[inference]` sockets. Builtins only: default.nix sets them in
# settings.<daemon> (as defaults, so a value there wins), and configs.nix adds what the
# typed options produce, for the test that runs each daemon's `check` (tests/nix_configs.rs).
#
#   - `[sockets]` per daemon: loopd `channel`, `bridge`; brokerd `broker`, `admin`, `state`,
#     `decide`; channeld `channel` and the `bridge` and `decide` it uses;
#     inferproxy `infer`; memoryd `memory`, `memories` and the `state` it asks (the socket
#     paths of layout.json); gatewayd `gateway`; loopd's `[memory] socket`; brokerd's
#     `[gateway] socket`;
#   - `[peers]` keyed by socket FILE name ("loop.sock"), each the socket's one client.
{
  home,
  ownerUser,
}:
let
  units = import ./units.nix;
  inherit (units) daemons;

  clientOf = units.clientOf {
    inherit ownerUser;
    ownerGroup = ownerUser;
  };

  # `[sockets]` key of each socket a daemon serves, where the daemon's name for it is not
  # the socket's own name.
  socketKey = {
    loop = "channel";
  };
  keyOf = s: socketKey.${s} or s;

  # [paths], [sockets], [peers] and [sandbox], the same for every daemon: each socket it
  # serves, and the one user (its client) allowed to connect to it.
  common =
    daemon:
    let
      d = daemons.${daemon};
    in
    {
      paths.home = home;
      sockets = builtins.listToAttrs (
        map (s: {
          name = keyOf s;
          value = units.socketPath s;
        }) d.serves
      );
      peers = builtins.listToAttrs (
        map (s: {
          name = "${s}.sock";
          value = [ (clientOf s).user ];
        }) d.serves
      );
      sandbox = {
        inherit (d) user;
        group = d.user;
        require = true;
        seccomp_log = false;
      };
    };

in
{
  loopd = common "loopd" // {
    broker.socket = units.socketPath "broker";
    inference.socket = units.socketPath "infer";
    memory.socket = units.socketPath "memory";
  };
  # memoryd asks brokerd's state.sock, which lives under the run directory whatever the home.
  memoryd =
    let
      c = common "memoryd";
    in
    c // { sockets = c.sockets // { state = units.socketPath "state"; }; };
  brokerd = common "brokerd" // {
    gateway.socket = units.socketPath "gateway";
  };
  inferproxy = common "inferproxy";
  gatewayd = common "gatewayd";
  # channeld connects to loopd's bridge.sock and brokerd's decide.sock, under the run
  # directory whatever the home.
  channeld =
    let
      c = common "channeld";
    in
    c
    // {
      sockets = c.sockets // {
        bridge = units.socketPath "bridge";
        decide = units.socketPath "decide";
      };
    };
}

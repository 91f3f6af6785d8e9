# Each daemon's configuration as an attribute set, from plain values: builtins only (no
# nixpkgs, no lib), so the NixOS module (default.nix, which writes them with
# pkgs.formats.toml) and the workspace's test (tests/nix_configs.rs, which runs the real
# `<daemon> check` on each) evaluate the very same function. Keys follow the daemons'
# config.rs, which refuse any key they do not know:
#
#   - `[sockets]` per daemon: loopd `channel`; brokerd `broker`, `admin`, `state`;
#     inferproxy `infer` (the socket paths of layout.json);
#   - `[peers]` keyed by socket FILE name ("loop.sock"), each the socket's one client;
#   - inferproxy's key is never named here: systemd hands it over as the credential
#     `api_key` (LoadCredential=), which inferproxy reads from $CREDENTIALS_DIRECTORY.
#
#   home          the box's home (services.boxmaker.home)
#   ownerUser     the owner's login (services.boxmaker.owner)
#   inference     { provider, baseUrl, script, slots } as the module's options hold them;
#                 slots.<name> = { model, maxTokens, contextTokens, temperature }
#   defaultScript the shipped default script, used when provider = "script" and script = null
#   tools         brokerd's [tools.<name>] tightenings ({} for none)
{
  home,
  ownerUser,
  inference,
  defaultScript,
  tools ? { },
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

  optional = name: value: if value == null then { } else { ${name} = value; };

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

  script = inference.provider == "script";
in
{
  loopd = common "loopd" // {
    broker.socket = units.socketPath "broker";
    inference.socket = units.socketPath "infer";
  }
  # A session's budget is the window of the slot it runs on (loopd's [slots] main = "main").
  // (
    if inference.slots ? main then
      { loop.context_tokens = inference.slots.main.contextTokens; }
    else
      { }
  );

  brokerd = common "brokerd" // (if tools == { } then { } else { inherit tools; });

  inferproxy = common "inferproxy" // {
    provider = {
      kind = inference.provider;
    }
    // (
      if script then
        { script = if inference.script or null == null then defaultScript else inference.script; }
      else
        optional "base_url" (inference.baseUrl or null)
    );
    slots = builtins.mapAttrs (
      _: s:
      {
        inherit (s) model;
        max_tokens = s.maxTokens;
        context_tokens = s.contextTokens;
      }
      // optional "temperature" (s.temperature or null)
    ) inference.slots;
  };
}

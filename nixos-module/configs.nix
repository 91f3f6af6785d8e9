# Each daemon's configuration as an attribute set, from plain values: builtins only (no
# nixpkgs, no lib), so the NixOS module (default.nix, which writes them with
# pkgs.formats.toml) and the workspace's test (tests/nix_configs.rs, which runs the real
# `<daemon> check` on each) evaluate the very same values. Keys follow the daemons'
# config.rs, which refuse any key they do not know:
#
#   - `[paths]`, `[sockets]`, `[peers]`, `[sandbox]` come from layout-configs.nix;
#   - `[provider]`, `[slots]`, `[tools]` and `[loop] context_tokens` are what default.nix's
#     typed options inside settings.<daemon> hold (check-offline.sh evaluates default.nix
#     and compares its settings with this function's result);
#   - inferproxy's key is never named here: systemd hands it over as the credential
#     `api_key` (LoadCredential=), which inferproxy reads from $CREDENTIALS_DIRECTORY.
#
#   home          the box's home (services.boxmaker.home)
#   ownerUser     the owner's login (services.boxmaker.owner)
#   inference     { provider, baseUrl, script, slots } (the shape of defaults.nix);
#                 slots.<name> = { model, maxTokens, contextTokens, temperature }
#   defaultScript the shipped default script, used when provider = "script" and script = null
#   tools         brokerd's [tools.<name>] tightenings ({} for none)
#   honcho        { url, workspace } of services.boxmaker.memory.honcho (url null: memoryd's
#                 embedded store, no [honcho]); its key is the credential `honcho_key`
{
  home,
  ownerUser,
  inference,
  defaultScript,
  tools ? { },
  honcho ? {
    url = null;
    workspace = null;
  },
  # services.boxmaker.channels.matrix: { homeserver, user, owners, rooms } (null: no Matrix
  # channel, and no channeld configuration); its token is the credential `matrix_token`.
  matrix ? null,
}:
let
  layout = import ./layout-configs.nix { inherit home ownerUser; };

  optional = name: value: if value == null then { } else { ${name} = value; };

  script = inference.provider == "script";
in
{
  loopd = layout.loopd
  # A session's budget is the window of the slot it runs on (loopd's [slots] main = "main").
  // (
    if inference.slots ? main then
      { loop.context_tokens = inference.slots.main.contextTokens; }
    else
      { }
  );

  brokerd = layout.brokerd // (if tools == { } then { } else { inherit tools; });

  memoryd =
    layout.memoryd
    // (
      if honcho.url or null == null then
        { }
      else
        { honcho = { inherit (honcho) url; } // optional "workspace" (honcho.workspace or null); }
    );

  # The allow-list is empty until settings.gatewayd.hosts opens a host (docs/gateway.md).
  gatewayd = layout.gatewayd;
}
// (
  if matrix == null then
    { }
  else
    {
      channeld = layout.channeld // {
        matrix = {
          inherit (matrix)
            homeserver
            user
            owners
            rooms
            ;
        };
      };
    }
)
// {

  inferproxy = layout.inferproxy // {
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

# Renders every unit of the box to unit-file text with builtins only, for the offline check
# (check-offline.sh) and the twin (twin.nix): no nixpkgs needed, so it runs on Debian's Nix 2.8
# in CI. The units are the module's own: units.nix's renderDevice (what default.nix calls) on
# the configuration the module writes (configs.nix with the option defaults), turned into
# NixOS's options (units.nix's nixos, what default.nix assigns to systemd.services and
# systemd.sockets) and written as nixpkgs' systemd-lib writes them (units.nix's unitFiles).
#
#   nix-instantiate --eval --strict --json offline.nix --argstr bindir D --argstr confdir C \
#     --argstr variant default|full
#
# `default` is the module with only `enable` and `owner` set (no Matrix channel, so no
# channeld, as the module renders it; the owner's system prompt the default's empty text,
# `${confdir}/system.md`, installed by `${bindir}/install`); `full` adds an OpenAI-compatible
# provider at an address with its API key, a broker workspace root, writable and under /home,
# and the Matrix channel on an https homeserver with its token (channels.matrix).
#
# `matrix` (the twin's: { homeserver, user, owners, rooms }, as channels.matrix holds them)
# gives either variant the Matrix channel: channeld's configuration, its token as the
# credential, its IP reach; `systemPrompt` and `install` (the twin's) the owner's system prompt.
{
  bindir,
  confdir,
  variant ? "default",
  # The script provider's default script, which the package installs.
  defaultScript ? "${bindir}/../share/boxmaker/inferproxy-default-script.toml",
  matrix ? null,
  systemPrompt ? null,
  install ? null,
}:
let
  units = import ./units.nix;
  defaults = import ./defaults.nix;
  inherit (defaults) home;

  full = variant == "full";
  ownerUser = "boxowner";

  inference =
    if full then
      defaults.inference
      // {
        provider = "openai";
        baseUrl = "http://192.168.1.5:8080/v1";
      }
    else
      defaults.inference;

  channel =
    if matrix != null then
      matrix
    else if full then
      {
        homeserver = "https://matrix.example.org";
        user = "@box:example.org";
        owners = [ "@boxowner:example.org" ];
        rooms = [ "!abcdef:example.org" ];
      }
    else
      null;

  configs = import ./configs.nix {
    inherit home ownerUser inference;
    inherit (defaults) tools;
    inherit defaultScript;
    matrix = channel;
  };

  settings =
    if full then
      configs
      // {
        brokerd = configs.brokerd // {
          workspace.roots = [
            {
              path = "/home/boxowner/projects";
              class = "private";
              writable = true;
            }
          ];
        };
      }
    else
      configs;

  rendered = units.renderDevice {
    inherit home ownerUser settings;
    runbook = "${confdir}/runbook.md";
    ownerGroup = "users";
    exe = daemon: "${bindir}/${daemon}";
    configFile = daemon: "${confdir}/${daemon}.toml";
    apiKeyFile = if full then "${units.keysDir}/api-key" else null;
    # As default.nix: channeld only with the Matrix channel, its token a key placed by hand.
    without = if channel == null then [ "channeld" ] else [ ];
    matrixTokenFile = if channel == null then null else "${units.keysDir}/matrix-token";
    systemPrompt = if systemPrompt != null then systemPrompt else "${confdir}/system.md";
    install = if install != null then install else "${bindir}/install";
  };
in
units.unitFiles (units.nixos rendered)

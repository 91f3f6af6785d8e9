# What a daemon's configuration is checked as at build time (default.nix's validated
# configurations; validate-config.sh runs `<daemon> check --config` on it in the build's
# sandbox), with builtins only: tests/nix_configs.rs runs the same on the configurations
# configs.nix renders.
#
# `<daemon> check` reads every file the configuration names, and some of those exist only on
# the device (as nginx's module gives `nginx -t` stand-in certificates, this gives the check
# stand-ins for them):
#   - a workspace root (brokerd's workspace.roots[].path) and a secret file (inferproxy's
#     provider.api_key_file, gatewayd's hosts[].secret_file, memoryd's honcho.key_file,
#     channeld's matrix.token_file) outside the store are made under the stand-in root
#     `@device@` (validate-config.sh puts it in the build directory): directories, and files
#     holding one placeholder line, 0600;
#   - a file whose content the check parses and that lies outside the store cannot be stood in
#     for: gatewayd's tls.ca_file is left out of the copy checked (gatewayd then trusts its
#     built-in roots), inferproxy's provider.ca_file and channeld's tls.ca_file are `caBundle`
#     instead (a CA bundle in the store; an https provider or homeserver without one is
#     refused, and the build's sandbox has no /etc/ssl), inferproxy's provider.script
#     `defaultScript` (the one the package ships); the device reads the real file at start;
#   - the systemd credentials the unit loads (`credentials`, their names) are placeholder files
#     in a stand-in $CREDENTIALS_DIRECTORY.
# Everything else is checked as written: every key, value, table, and every file in the store.
#
#   daemon        the daemon's name
#   settings      its configuration as the module writes it
#   credentials   the names of the credentials its unit loads (LoadCredential=)
#   caBundle      a CA bundle in the store, for an https provider or homeserver (the module:
#                 pkgs.cacert's)
#   defaultScript the script provider's default script (the package's)
{
  daemon,
  settings,
  credentials ? [ ],
  caBundle ? null,
  defaultScript ? null,
}:
let
  marker = "@device@";
  storeDir = builtins.storeDir;
  inStore = p: builtins.substring 0 (builtins.stringLength storeDir + 1) p == "${storeDir}/";
  onDevice = p: builtins.isString p && builtins.substring 0 1 p == "/" && !inStore p;
  moved = p: if onDevice p then marker + p else p;

  # A table's key naming a device file: moved under the marker (and listed), or left out.
  fileKey =
    list: key: t:
    if onDevice (t.${key} or null) then
      {
        table = t // {
          ${key} = moved t.${key};
        };
        ${list} = [ t.${key} ];
      }
    else
      { table = t; };
  dropKey = key: t: if onDevice (t.${key} or null) then removeAttrs t [ key ] else t;

  collect = name: results: builtins.concatMap (r: r.${name} or [ ]) results;

  perDaemon = {
    brokerd =
      let
        roots = ((settings.workspace or { }).roots or [ ]);
        rs = map (fileKey "dirs" "path") roots;
      in
      {
        settings =
          if settings ? workspace then
            settings // { workspace = settings.workspace // { roots = map (r: r.table) rs; }; }
          else
            settings;
        dirs = collect "dirs" rs;
        files = [ ];
      };

    inferproxy =
      let
        p = fileKey "files" "api_key_file" (settings.provider or { });
        https = builtins.substring 0 8 (p.table.base_url or "") == "https://";
        replaced =
          key: by: t:
          if onDevice (t.${key} or null) then
            (if by == null then removeAttrs t [ key ] else t // { ${key} = by; })
          else
            t;
        withCa =
          t: if https && !(t ? ca_file) && caBundle != null then t // { ca_file = caBundle; } else t;
        provider = withCa (replaced "script" defaultScript (replaced "ca_file" caBundle p.table));
      in
      {
        settings = if settings ? provider then settings // { inherit provider; } else settings;
        dirs = [ ];
        files = p.files or [ ];
      };

    gatewayd =
      let
        hs = map (fileKey "files" "secret_file") (settings.hosts or [ ]);
        tls = dropKey "ca_file" (settings.tls or { });
      in
      {
        settings =
          settings
          // (if settings ? hosts then { hosts = map (h: h.table) hs; } else { })
          // (if settings ? tls then { inherit tls; } else { });
        dirs = [ ];
        files = collect "files" hs;
      };

    memoryd =
      let
        h = fileKey "files" "key_file" (settings.honcho or { });
      in
      {
        settings = if settings ? honcho then settings // { honcho = h.table; } else settings;
        dirs = [ ];
        files = h.files or [ ];
      };

    channeld =
      let
        m = fileKey "files" "token_file" (settings.matrix or { });
        https = builtins.substring 0 8 (m.table.homeserver or "") == "https://";
        t = settings.tls or { };
        tls =
          if onDevice (t.ca_file or null) then
            (if caBundle == null then removeAttrs t [ "ca_file" ] else t // { ca_file = caBundle; })
          else if https && !(t ? ca_file) && caBundle != null then
            t // { ca_file = caBundle; }
          else
            t;
      in
      {
        settings =
          settings
          // (if settings ? matrix then { matrix = m.table; } else { })
          // (if tls == { } then { } else { inherit tls; });
        dirs = [ ];
        files = m.files or [ ];
      };

    loopd = {
      inherit settings;
      dirs = [ ];
      files = [ ];
    };
  };
in
(
  perDaemon.${daemon} or {
    inherit settings;
    dirs = [ ];
    files = [ ];
  }
)
// {
  inherit credentials marker;
}

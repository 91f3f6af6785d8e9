# What nix/package.nix hands to rustPlatform.buildRustPackage, evaluated with builtins only:
# a stand-in for the few nixpkgs names package.nix uses, so Debian's Nix 2.8 (no nixpkgs, no
# builtins.readFileType, which lib.fileset needs) reads the very attributes the device's build
# gets. nix/package-check.sh (`make package-check`) builds the package from them as
# buildRustPackage's hooks would, and nixos-module/check-offline.sh checks them.
#
#   nix-instantiate --eval --strict --json nix/package-attrs.nix [--arg canExecute false]
#
# `src` comes back as the paths of its file set, relative to the repository. A lib.fileset
# function this stand-in does not know fails the evaluation, saying which: add it here, with
# the meaning nixpkgs gives it, before package.nix uses it.
{
  # stdenv.buildPlatform.canExecute stdenv.hostPlatform: false for a cross build.
  canExecute ? true,
}:
let
  root = toString ../.;
  relative =
    p:
    let
      s = toString p;
      n = builtins.stringLength root;
    in
    if s == root then
      "."
    else if builtins.substring 0 (n + 1) s == "${root}/" then
      builtins.substring (n + 1) (builtins.stringLength s - n - 1) s
    else
      throw "nix/package.nix: the source names ${s}, outside the repository";

  unknown = name: _: throw "nix/package-attrs.nix: nix/package.nix uses lib.fileset.${name}, which this stand-in does not know";

  lib = {
    importTOML = f: builtins.fromTOML (builtins.readFile f);
    optionalString = c: s: if c then s else "";
    optionals = c: l: if c then l else [ ];
    licenses.asl20 = "asl20";
    platforms.linux = [ "linux" ];
    fileset = {
      # A file set here is the list of the paths it was made of.
      toSource =
        { root, fileset }:
        {
          root = relative root;
          paths = map relative (if builtins.isList fileset then fileset else [ fileset ]);
        };
      unions = builtins.concatMap (x: if builtins.isList x then x else [ x ]);
      maybeMissing = p: if builtins.pathExists p then [ p ] else [ ];
      difference = unknown "difference";
      intersection = unknown "intersection";
      gitTracked = unknown "gitTracked";
      fileFilter = unknown "fileFilter";
      fromSource = unknown "fromSource";
    };
  };

  stdenv = {
    buildPlatform.canExecute = _: canExecute;
    hostPlatform = { };
  };

  attrs = import ./package.nix {
    inherit lib stdenv;
    rustPlatform.buildRustPackage = a: if builtins.isFunction a then a attrs else a;
    installShellFiles = "installShellFiles";
  };

  # The derivation's environment variables: the attributes buildRustPackage and mkDerivation
  # pass through as they are, written in capitals (LIBSQLITE3_FLAGS).
  isEnvName = n: builtins.match "[A-Z][A-Z0-9_]*" n != null;
  env = builtins.listToAttrs (
    map (n: {
      name = n;
      value = attrs.${n};
    }) (builtins.filter isEnvName (builtins.attrNames attrs))
  );
  # buildRustPackage's defaults (pkgs/build-support/rust/build-rust-package/default.nix).
  buildType = attrs.buildType or "release";
  buildNoDefaultFeatures = attrs.buildNoDefaultFeatures or false;
  buildFeatures = attrs.buildFeatures or [ ];
in
{
  inherit (attrs) pname version;
  src = attrs.src;
  inherit env buildType buildNoDefaultFeatures buildFeatures;
  checkType = attrs.checkType or buildType;
  checkNoDefaultFeatures = attrs.checkNoDefaultFeatures or buildNoDefaultFeatures;
  checkFeatures = attrs.checkFeatures or buildFeatures;
  cargoBuildFlags = attrs.cargoBuildFlags or [ ];
  cargoTestFlags = attrs.cargoTestFlags or [ ];
  checkFlags = attrs.checkFlags or [ ];
  doCheck = attrs.doCheck or true;
  cargoLock = relative attrs.cargoLock.lockFile;
  nativeBuildInputs = attrs.nativeBuildInputs or [ ];
  postInstall = attrs.postInstall or "";
  meta = {
    inherit (attrs.meta) description license mainProgram;
    maintainers = attrs.meta.maintainers or [ ];
  };
}

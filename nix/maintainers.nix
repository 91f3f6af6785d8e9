# Who maintains the package and the NixOS module: meta.maintainers of both (nix/package.nix,
# nixos-module/default.nix), in the shape of nixpkgs' maintainer-list.nix entries. Outside
# nixpkgs there is no handle to name; a submission to nixpkgs replaces this list with its
# maintainers' entries of lib.maintainers.
[
  {
    name = "the boxmaker project";
  }
]

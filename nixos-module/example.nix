# A minimal device using the module: `nixos-rebuild build --flake .#example`.
# Only `enable` and `owner` are needed; everything else has a default (docs/install.md).
{ ... }:
{
  nixpkgs.hostPlatform = "x86_64-linux";

  boot.loader.grub.devices = [ "/dev/vda" ];
  fileSystems."/" = {
    device = "/dev/disk/by-label/nixos";
    fsType = "ext4";
  };

  users.users.alice = {
    isNormalUser = true;
    description = "the box's owner";
  };

  services.boxmaker = {
    enable = true;
    owner = "alice";
  };

  system.stateVersion = "25.11";
}

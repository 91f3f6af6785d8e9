# The box as a headless appliance: the configuration behind the flake's device images
# (`nixosConfigurations.device`, `packages.<system>.image`; docs/install.md, "Build an image").
#
#   - the box (services.boxmaker) with its owner, who logs in over SSH by key only; no
#     account has a password, and root logs in by the same keys only;
#   - the model's API key and the owner's SSH keys are never in the image: the owner puts
#     them on the image's EFI system partition (`boxmaker/api-key`, `boxmaker/authorized_keys`)
#     after writing it, and boxmaker-provision.service moves them at first boot into root-only
#     files (the key reaches inferproxy as its systemd credential, through apiKeyFile);
#   - an image built by systemd-repart (nixpkgs' image/repart.nix): a FAT EFI system partition
#     with systemd-boot, and an ext4 root with the system's closure, grown to the disk at first
#     boot. The first boot registers the closure with Nix, so `nixos-rebuild` works on it.
#
# The same file serves every system: the flake sets nixpkgs.hostPlatform.
{
  config,
  lib,
  pkgs,
  modulesPath,
  ...
}:
let
  cfg = config.services.boxmaker;
  efiArch = pkgs.stdenv.hostPlatform.efiArch;

  # What the owner puts on the EFI system partition, and where first boot keeps it.
  esp = "/boot";
  drop = "${esp}/boxmaker";
  keep = "/var/lib/boxmaker-provision";
  authorizedKeys = "${keep}/authorized_keys";
  apiKeyFile = "${keep}/secrets/api-key";

  toplevel = config.system.build.toplevel;

  # The first boot entry, written as systemd-boot's NixOS builder names its entries, so the
  # first `nixos-rebuild switch` replaces it and collects the kernel and initrd it names.
  bootEntry = pkgs.writeText "nixos-generation-1.conf" ''
    title NixOS (boxmaker)
    version Generation 1
    linux /EFI/nixos/image-kernel.efi
    initrd /EFI/nixos/image-initrd.efi
    options init=${toplevel}/init ${toString config.boot.kernelParams}
  '';

  dropReadme = pkgs.writeText "README.txt" ''
    Put here, before the first boot (docs/install.md, "First boot"):

      authorized_keys   the owner's SSH public keys, one a line
      api-key           the model provider's API key (only for a provider other than script)

    The first boot moves both into root-only files on the root partition and deletes them here.
    To change either later, put the new file here again and reboot.
  '';
in
{
  # With the module (nixosModules.default), which the flake adds beside this file.
  imports = [ "${modulesPath}/image/repart.nix" ];

  # --- the box -------------------------------------------------------------------------------
  services.boxmaker = {
    enable = true;
    owner = lib.mkDefault "owner";
    # The provisioned key, for any provider that needs one (the script provider refuses it).
    inference.apiKeyFile = lib.mkIf (cfg.settings.inferproxy.provider.kind != "script") (lib.mkDefault apiKeyFile);
  };

  users.mutableUsers = false;
  # No account has a password, and the SSH keys arrive at first boot (boxmaker-provision), so
  # NixOS cannot see a way in at evaluation: it would refuse the configuration without this.
  users.allowNoPasswordLogin = true;
  users.users.${cfg.owner} = {
    isNormalUser = true;
    description = "the box's owner";
    # "!" is a locked password: no password login, on the console or anywhere else.
    hashedPassword = "!";
  };
  # root keeps NixOS's default, a locked password ("!"): it logs in over SSH by key only.

  # --- SSH by key, for the owner and root only -----------------------------------------------
  services.openssh = {
    enable = true;
    openFirewall = true;
    # The provisioned keys, beside NixOS's own (users.users.<name>.openssh.authorizedKeys).
    authorizedKeysFiles = [ authorizedKeys ];
    settings = {
      PasswordAuthentication = false;
      KbdInteractiveAuthentication = false;
      PermitRootLogin = "prohibit-password";
      AllowUsers = [
        cfg.owner
        "root"
      ];
    };
  };

  # First boot (and any boot that finds new files on the ESP): move what the owner put there.
  systemd.services.boxmaker-provision = {
    description = "boxmaker: take the owner's SSH keys and the model's API key from the EFI system partition";
    wantedBy = [ "multi-user.target" ];
    before = [
      "sshd.service"
      "boxmaker-inferproxy.service"
    ];
    unitConfig.RequiresMountsFor = [ esp ];
    serviceConfig = {
      Type = "oneshot";
      RemainAfterExit = true;
      UMask = "0077";
    };
    script = ''
      install -d -m 0755 ${keep}
      install -d -m 0700 ${keep}/secrets
      # sshd reads authorized keys as the user who logs in: world-readable, root-owned.
      if [ -f ${drop}/authorized_keys ]; then
        install -m 0644 ${drop}/authorized_keys ${authorizedKeys}.new
        sync ${authorizedKeys}.new
        mv ${authorizedKeys}.new ${authorizedKeys}
        rm -f ${drop}/authorized_keys
        echo "boxmaker-provision: installed the owner's SSH keys from ${drop}/authorized_keys"
      fi
      if [ -f ${drop}/api-key ]; then
        install -m 0400 ${drop}/api-key ${apiKeyFile}.new
        sync ${apiKeyFile}.new
        mv ${apiKeyFile}.new ${apiKeyFile}
        shred -u ${drop}/api-key 2>/dev/null || rm -f ${drop}/api-key
        echo "boxmaker-provision: installed the model's API key from ${drop}/api-key"
      fi
      sync ${esp}
    '';
  };
  systemd.services.boxmaker-inferproxy = {
    wants = [ "boxmaker-provision.service" ];
    after = [ "boxmaker-provision.service" ];
  };

  # --- headless ------------------------------------------------------------------------------
  networking.hostName = lib.mkDefault "boxmaker";
  networking.useDHCP = lib.mkDefault true;
  documentation.enable = lib.mkDefault false;
  # Enough to boot on common machines and in a virtual machine (the VM steps of install.md).
  boot.initrd.availableKernelModules = [
    "virtio_pci"
    "virtio_blk"
    "virtio_scsi"
  ];

  # --- boot and file systems: what the image below makes ---------------------------------
  boot.loader.grub.enable = false;
  boot.loader.systemd-boot.enable = true;
  # systemd-boot copies every generation's kernel and initrd onto the ESP (about 40 to 60 MiB
  # a pair for this system, shared between generations of the same kernel); the image's ESP is
  # 512 MiB and holds the first boot's pair as well. Five generations fit with room to spare
  # even when each brings a new kernel; without a limit every `nixos-rebuild switch` adds one
  # until the ESP is full and the next switch fails to install the boot loader.
  boot.loader.systemd-boot.configurationLimit = lib.mkDefault 5;
  boot.loader.efi.canTouchEfiVariables = false;
  boot.growPartition = true;
  fileSystems."/" = {
    device = "/dev/disk/by-label/nixos";
    fsType = "ext4";
    autoResize = true;
  };
  fileSystems.${esp} = {
    device = "/dev/disk/by-label/ESP";
    fsType = "vfat";
    # Root only: the API key waits here until the first boot moves it.
    options = [
      "fmask=0077"
      "dmask=0077"
    ];
  };

  # The image's store paths are on disk but unknown to Nix until registered: once, at the
  # first boot (as nixpkgs' SD images do), then the system profile points at this system.
  boot.postBootCommands = ''
    if [ -f /nix-path-registration ]; then
      ${config.nix.package.out}/bin/nix-store --load-db < /nix-path-registration &&
        touch /etc/NIXOS &&
        ${config.nix.package.out}/bin/nix-env -p /nix/var/nix/profiles/system --set /run/current-system &&
        rm -f /nix-path-registration
    fi
  '';

  image.repart = {
    name = "boxmaker-device";
    partitions = {
      "10-esp" = {
        contents = {
          "/EFI/BOOT/BOOT${lib.toUpper efiArch}.EFI".source =
            "${pkgs.systemd}/lib/systemd/boot/efi/systemd-boot${efiArch}.efi";
          "/EFI/systemd/systemd-boot${efiArch}.efi".source =
            "${pkgs.systemd}/lib/systemd/boot/efi/systemd-boot${efiArch}.efi";
          "/loader/entries/nixos-generation-1.conf".source = bootEntry;
          "/EFI/nixos/image-kernel.efi".source =
            "${config.boot.kernelPackages.kernel}/${config.system.boot.loader.kernelFile}";
          "/EFI/nixos/image-initrd.efi".source =
            "${config.system.build.initialRamdisk}/${config.system.boot.loader.initrdFile}";
          "/boxmaker/README.txt".source = dropReadme;
        };
        repartConfig = {
          Type = "esp";
          Format = "vfat";
          Label = "ESP";
          SizeMinBytes = "512M";
        };
      };
      "20-root" = {
        storePaths = [ toplevel ];
        contents."/nix-path-registration".source =
          "${pkgs.closureInfo { rootPaths = [ toplevel ]; }}/registration";
        repartConfig = {
          Type = "root";
          Format = "ext4";
          Label = "nixos";
          Minimize = "guess";
        };
      };
    };
  };

  system.stateVersion = lib.mkDefault "25.11";
}

{
  description = "boxmaker: a hardened, on-device personal AI agent";

  # A NixOS release branch and nothing else: the build needs no other input.
  inputs.nixpkgs.url = "github:NixOS/nixpkgs/nixos-25.11";

  outputs =
    { self, nixpkgs }:
    let
      inherit (nixpkgs) lib;

      systems = [
        "x86_64-linux"
        "aarch64-linux"
      ];

      pkgsFor =
        system:
        import nixpkgs {
          inherit system;
          overlays = [ self.overlays.default ];
        };

      forAllSystems = f: lib.genAttrs systems (system: f (pkgsFor system));

      # The daemons that have units (units.nix), and bxctl.
      binaries = (import ./nixos-module/units.nix).daemonNames ++ [ "bxctl" ];

      deviceFor =
        system:
        {
          x86_64-linux = self.nixosConfigurations.device;
          aarch64-linux = self.nixosConfigurations.device-aarch64;
        }
        .${system};

      # A file holding a derivation's path, without the derivation as a dependency: a check
      # that the derivation (an image, a configuration) evaluates, without building it.
      evaluates =
        pkgs: name: drv:
        pkgs.writeText "boxmaker-eval-${name}" (builtins.unsafeDiscardStringContext drv.drvPath);

      # bxharden's sandbox test binary, for the VM test to run as root on the VM's kernel.
      sandboxTests =
        pkgs:
        pkgs.boxmaker.overrideAttrs (old: {
          pname = "boxmaker-sandbox-tests";
          nativeBuildInputs = (old.nativeBuildInputs or [ ]) ++ [ pkgs.jq ];
          buildPhase = ''
            runHook preBuild
            cargo test --release --offline -p bxharden --test sandbox --no-run \
              --message-format=json >build.json
            runHook postBuild
          '';
          doCheck = false;
          installPhase = ''
            runHook preInstall
            exe="$(jq -r 'select(.reason == "compiler-artifact" and .target.name == "sandbox")
              | .executable // empty' build.json)"
            install -Dm0755 "$exe" $out/bin/bxharden-sandbox-tests
            runHook postInstall
          '';
          postInstall = "";
        });

      # One binary out of the workspace build; fails when the workspace does not make it.
      single =
        pkgs: name:
        pkgs.runCommand "${name}-${pkgs.boxmaker.version}"
          {
            meta = pkgs.boxmaker.meta // {
              mainProgram = name;
            };
          }
          ''
            test -x ${pkgs.boxmaker}/bin/${name}
            mkdir -p $out/bin
            ln -s ${pkgs.boxmaker}/bin/${name} $out/bin/${name}
          '';
    in
    {
      overlays.default = final: _prev: {
        boxmaker = final.callPackage ./nix/package.nix { };
      };

      packages = forAllSystems (
        pkgs:
        lib.genAttrs binaries (single pkgs)
        // {
          boxmaker = pkgs.boxmaker;
          default = pkgs.boxmaker;
          # The device's disk image (nixos-module/device.nix, systemd-repart): `nix build .#image`.
          image = (deviceFor pkgs.stdenv.hostPlatform.system).config.system.build.image;
          sandbox-tests = sandboxTests pkgs;
        }
      );

      # The module, with services.boxmaker.package defaulting to this flake's package built
      # with the configuration's own pkgs. No nixpkgs.overlays: a configuration that brings its
      # own nixpkgs.pkgs would ignore them (check-offline.sh holds this).
      nixosModules.default =
        { lib, pkgs, ... }:
        {
          imports = [ ./nixos-module ];
          services.boxmaker.package = lib.mkDefault (pkgs.callPackage ./nix/package.nix { });
        };

      # The headless device (nixos-module/device.nix) for one system, with more modules on top
      # (the owner's name, public keys, provider): docs/install.md, "A device from an image".
      lib.mkDevice =
        {
          system,
          modules ? [ ],
        }:
        lib.nixosSystem {
          modules = [
            self.nixosModules.default
            ./nixos-module/device.nix
            { nixpkgs.hostPlatform = system; }
          ]
          ++ modules;
        };

      # `nix fmt`: nixfmt (the RFC 166 style nixpkgs uses) over every .nix file.
      formatter = forAllSystems (pkgs: pkgs.nixfmt-tree);

      checks = forAllSystems (
        pkgs:
        # The image is evaluated below, not built: `nix build .#image` builds it.
        removeAttrs self.packages.${pkgs.stdenv.hostPlatform.system} [ "image" ]
        // {
          clippy = pkgs.boxmaker.overrideAttrs (old: {
            pname = "boxmaker-clippy";
            nativeBuildInputs = (old.nativeBuildInputs or [ ]) ++ [ pkgs.clippy ];
            buildPhase = ''
              runHook preBuild
              cargo clippy --workspace --all-targets --offline -- -D warnings
              runHook postBuild
            '';
            doCheck = false;
            installPhase = ''
              touch $out
            '';
            postInstall = "";
          });

          fmt =
            pkgs.runCommand "boxmaker-fmt"
              {
                nativeBuildInputs = [
                  pkgs.cargo
                  pkgs.rustfmt
                ];
              }
              ''
                export HOME=$TMPDIR
                cp -r ${pkgs.boxmaker.src} src
                chmod -R u+w src
                cd src
                cargo fmt --all --check
                touch $out
              '';

          # A configuration a daemon refuses fails the build of its /etc/boxmaker file (the
          # module's validated configurations), with the daemon's line and the module's.
          config-refused-at-build =
            let
              refused = lib.nixosSystem {
                modules = [
                  self.nixosModules.default
                  {
                    nixpkgs.pkgs = pkgs;
                    boot.loader.grub.enable = false;
                    fileSystems."/".device = "/dev/disk/by-label/nixos";
                    users.users.alice.isNormalUser = true;
                    services.boxmaker = {
                      enable = true;
                      owner = "alice";
                      settings.loopd.loop.no_such_key = true;
                    };
                    system.stateVersion = "25.11";
                  }
                ];
              };
              failed = pkgs.testers.testBuildFailure refused.config.environment.etc."boxmaker/loopd.toml".source;
            in
            pkgs.runCommand "boxmaker-config-refused-at-build" { } ''
              grep -F "loopd refuses the configuration" ${failed}/testBuildFailure.log
              grep -F "no_such_key" ${failed}/testBuildFailure.log
              touch $out
            '';

          vm = pkgs.testers.runNixOSTest (
            import ./nixos-module/test.nix {
              boxmakerModule = ./nixos-module;
              inherit pkgs;
              sandboxTests = sandboxTests pkgs;
            }
          );

          # The device configuration and its image evaluate (what is built is a file holding
          # the image's derivation path); so do the example and the module under a ready-made
          # nixpkgs.pkgs without the overlay.
          image-eval = evaluates pkgs "image" (deviceFor pkgs.stdenv.hostPlatform.system).config.system.build.image;
          example-eval = evaluates pkgs "example" self.nixosConfigurations.example.config.system.build.toplevel;
          module-without-overlay = evaluates pkgs "module-without-overlay"
            (lib.nixosSystem {
              modules = [
                self.nixosModules.default
                ./nixos-module/example.nix
                # example.nix is an x86_64-linux machine; evaluating it needs no such builder.
                { nixpkgs.pkgs = import nixpkgs { system = "x86_64-linux"; }; }
              ];
            }).config.system.build.toplevel;
        }
      );

      # A minimal device, for `nixos-rebuild build --flake .#example` and as documentation.
      nixosConfigurations.example = lib.nixosSystem {
        modules = [
          self.nixosModules.default
          ./nixos-module/example.nix
        ];
      };

      # The headless appliance of the images (`nix build .#image` on each system).
      nixosConfigurations.device = self.lib.mkDevice { system = "x86_64-linux"; };
      nixosConfigurations.device-aarch64 = self.lib.mkDevice { system = "aarch64-linux"; };

      devShells = forAllSystems (pkgs: {
        default = pkgs.mkShell {
          inputsFrom = [ pkgs.boxmaker ];
          # The toolchain and what `make gate` runs: clippy, rustfmt, jq, systemd-analyze,
          # Nix itself, and Python for the peers some tests start.
          packages = with pkgs; [
            clippy
            rustfmt
            rust-analyzer
            gnumake
            jq
            systemd
            nix
            python3
            strace
          ];
        };
      });
    };
}

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

      # `nix fmt`: nixfmt (the RFC 166 style nixpkgs uses) over every .nix file.
      formatter = forAllSystems (pkgs: pkgs.nixfmt-tree);

      checks = forAllSystems (
        pkgs:
        self.packages.${pkgs.stdenv.hostPlatform.system}
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

          vm = pkgs.testers.runNixOSTest (
            import ./nixos-module/test.nix {
              boxmakerModule = ./nixos-module;
              inherit pkgs;
            }
          );
        }
      );

      # A minimal device, for `nixos-rebuild build --flake .#example` and as documentation.
      nixosConfigurations.example = lib.nixosSystem {
        modules = [
          self.nixosModules.default
          ./nixos-module/example.nix
        ];
      };

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

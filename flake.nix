{
  description = "polar-hpc: token-exact RL rollouts of unmodified LLM agent harnesses on Slurm";

  # A release branch; flake.lock pins the exact revision (refresh: `nix flake update`).
  inputs.nixpkgs.url = "github:NixOS/nixpkgs/nixos-25.11";

  outputs = { self, nixpkgs }:
    let
      systems = [ "x86_64-linux" "aarch64-linux" ];
      # Built from builtins only, so the output names can be listed without nixpkgs (tests/nix).
      forAllSystems = f:
        builtins.listToAttrs (map (system: { name = system; value = f system; }) systems);
      pkgsFor = forAllSystems (system:
        import nixpkgs { inherit system; overlays = [ self.overlays.default ]; });
    in
    {
      overlays.default = import ./nix/overlay.nix;

      packages = forAllSystems (system:
        let pkgs = pkgsFor.${system}; in {
          default = pkgs.polar-hpc;
          gateway-root = pkgs.polar-hpc-gateway.root;
          gateway-closure = pkgs.polar-hpc-gateway.closure;
          gateway-image = pkgs.polar-hpc-gateway.image;
        });

      devShells = forAllSystems (system: {
        default = import ./nix/devshell.nix { pkgs = pkgsFor.${system}; };
      });

      apps = forAllSystems (system: {
        default = {
          type = "app";
          program = "${self.packages.${system}.default}/bin/polar-hpc";
          meta.description = "The polar-hpc command line";
        };
      });
    };
}

# Adds polar-hpc to a nixpkgs package set:
#   import nixpkgs { overlays = [ polar-hpc.overlays.default ]; }  =>  pkgs.polar-hpc, pkgs.polar-hpc-gateway
final: _prev: {
  polar-hpc = import ./polar-hpc.nix { pkgs = final; };
  polar-hpc-gateway = import ./gateway.nix { pkgs = final; inherit (final) polar-hpc; };
}

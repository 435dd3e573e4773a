# Adds polar-hpc to a nixpkgs package set (the flake's `overlays.default`):
#   import nixpkgs { overlays = [ polar-hpc.overlays.default ]; }
#   => pkgs.polar-hpc (./polar-hpc.nix), pkgs.polar-hpc-gateway (./gateway.nix)
final: _prev: {
  polar-hpc = import ./polar-hpc.nix { pkgs = final; };
  polar-hpc-gateway = import ./gateway.nix { pkgs = final; inherit (final) polar-hpc; };
}

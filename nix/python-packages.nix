# The locked runtime closure of polar-hpc as nixpkgs Python packages, one per uv.lock entry,
# each installed from the very wheel (URL and sha256 from uv.lock) that `uv sync` installs.
#
#   import ./python-packages.nix { pkgs; python; lockFile; }
#   => { direct = [ <derivation> ... ]; packages = { <name> = <derivation>; ... }; }
#
# Manylinux wheels carry binaries linked for a generic glibc system; autoPatchelfHook points
# them at libraries from the Nix store (libstdc++/libgcc_s from stdenv; the rest they bundle).
{ pkgs, python, lockFile }:
let
  lock = import ./uv-lock.nix {
    inherit lockFile;
    inherit (pkgs.stdenv.hostPlatform) system;
    pythonVersion = python.version;
    glibcVersion = pkgs.glibc.version;
  };
  packages = builtins.mapAttrs (_: p:
    python.pkgs.buildPythonPackage {
      pname = p.name;
      inherit (p) version;
      format = "wheel";
      src = pkgs.fetchurl { inherit (p.wheel) url sha256; name = p.wheel.filename; };
      dependencies = map (d: packages.${d}) p.deps;
      nativeBuildInputs = pkgs.lib.optionals p.wheel.native [ pkgs.autoPatchelfHook ];
      buildInputs = pkgs.lib.optionals p.wheel.native [ pkgs.stdenv.cc.cc.lib ];
      doCheck = false; # wheels carry no tests; polar-hpc's import check exercises the closure
    })
    lock.packages;
in
{
  inherit packages;
  direct = map (d: packages.${d}) lock.direct;
}

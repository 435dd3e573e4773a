# polar-hpc itself, built from pyproject.toml with its build backend (hatchling); its runtime
# dependencies come from uv.lock through ./python-packages.nix, so `nix build` and `uv sync`
# install the same versions from the same files.
#
# The result is a Python environment (bin/polar-hpc, bin/python) rather than the bare
# application: polar-hpc starts its child processes as `sys.executable -m polar_hpc ...`, and
# only an environment's interpreter can import polar_hpc and its dependencies.
{ pkgs, python ? pkgs.python311 }:
let
  src = ../.;
  project = (builtins.fromTOML (builtins.readFile (src + "/pyproject.toml"))).project;
  locked = import ./python-packages.nix { inherit pkgs python; lockFile = src + "/uv.lock"; };

  app = python.pkgs.buildPythonPackage {
    pname = project.name;
    inherit (project) version;
    pyproject = true;
    # Only what the wheel is built from: editing tests or docs does not rebuild the package.
    # slurm/ and containers/ go into the wheel (pyproject: force-include) for `polar-hpc sbatch`
    # and `polar-hpc image build`.
    src = pkgs.lib.fileset.toSource {
      root = src;
      fileset = pkgs.lib.fileset.unions [
        (src + "/pyproject.toml") (src + "/README.md") (src + "/polar_hpc")
        (src + "/slurm") (src + "/containers")
      ];
    };
    # pyproject pins the backend exactly for pip/uv builds; here nixpkgs' hatchling builds it.
    postPatch = ''
      sed -i 's/"hatchling==[^"]*"/"hatchling"/' pyproject.toml
    '';
    build-system = [ python.pkgs.hatchling ];
    dependencies = locked.direct;
    # Import the CLI (and so what it loads) at build time: a missing or broken dependency fails
    # `nix build`, not the first run on the cluster.
    pythonImportsCheck = [ "polar_hpc" "polar_hpc.cli" ];
    # ...and a package without the templates the CLI renders fails the build too.
    postInstall = ''
      test -f $out/${python.sitePackages}/polar_hpc/_assets/slurm/hetjob.sbatch.j2
      test -f $out/${python.sitePackages}/polar_hpc/_assets/containers/gateway.def
    '';
    # The test suite starts processes and sandboxes; CI runs it through uv (.ci/run).
    doCheck = false;
    meta = {
      inherit (project) description;
      license = pkgs.lib.licenses.asl20;
      mainProgram = "polar-hpc";
      platforms = [ "x86_64-linux" "aarch64-linux" ];
    };
  };
in
python.withPackages (_: [ app ])

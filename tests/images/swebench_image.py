"""An image shaped like SWE-bench's instance images, built without Docker: rootfs.py's programs,
the row's repository at /testbed (at its base commit), a `testbed` environment reached as the eval
script reaches it (`source /opt/miniconda3/bin/activate; conda activate testbed`), and the image
config SWE-bench's Dockerfiles give (WORKDIR /testbed, /opt/miniconda3/bin on PATH, root).

Test scaffolding, not Miniconda: `activate` defines a `conda` shell function whose `activate ENV`
puts /opt/miniconda3/envs/ENV/bin first on PATH, and the env is a venv of the image's python3 with
this checkout's pytest (and what it imports) copied into its site-packages. There is no pip: the
eval script's `python -m pip install -e .` fails and the script goes on (it runs without `set -e`);
a .pth file stands for the editable install a real image has."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path

from images import rootfs
from suites.swebench_rows import make_repo

ENV = "opt/miniconda3/envs/testbed"
PATH = "/opt/miniconda3/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
PYTEST_MODULES = ("pytest", "_pytest", "py", "pluggy", "iniconfig", "packaging", "pygments")
PYTEST_DISTRIBUTIONS = ("pytest", "pluggy", "iniconfig", "packaging", "pygments")  # their metadata: versions
ACTIVATE = """# test scaffolding standing for Miniconda's activate: `conda activate ENV` puts ENV's bin first
conda() {
  if [ "$1" = activate ]; then
    export CONDA_DEFAULT_ENV="$2" PATH="/opt/miniconda3/envs/$2/bin:$PATH"
  fi
}
"""
PYTEST = "#!/opt/miniconda3/envs/testbed/bin/python\nimport sys\nimport pytest\nsys.exit(pytest.main())\n"


def build(folder: Path) -> tuple[Path, dict[str, str]]:
    """The image's root filesystem under `folder`/root and the row's commits (base, patch, test_patch)."""
    root = rootfs.build(folder / "root", {"opt/miniconda3/bin/activate": ACTIVATE})
    [stdlib] = (root / "usr" / "lib").glob("python3.*")  # rootfs.py leaves unittest out; pytest imports it
    shutil.copytree(Path("/") / stdlib.relative_to(root) / "unittest", stdlib / "unittest")
    commits = make_repo(root / "testbed")
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(root / ENV)], check=True)
    [site] = (root / ENV / "lib").glob("python3*/site-packages")
    for name in PYTEST_MODULES:
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.origin, name
        source = Path(spec.origin)
        if source.name == "__init__.py":
            shutil.copytree(source.parent, site / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, site / source.name)
    here = Path(importlib.util.find_spec("pytest").origin).parents[1]  # type: ignore[union-attr, arg-type]
    for dist in PYTEST_DISTRIBUTIONS:
        [info] = here.glob(f"{dist}-*.dist-info")
        shutil.copytree(info, site / info.name)
    (site / "testbed.pth").write_text("/testbed\n")
    (root / ENV / "bin" / "pytest").write_text(PYTEST)
    (root / ENV / "bin" / "pytest").chmod(0o755)
    return root, commits


def push(root: Path, folder: Path, reference: str) -> None:
    """`root` as a one-layer OCI image with SWE-bench's config, pushed to `reference` on loopback."""
    layout = f"{folder / 'oci'}:1"
    for argv in (["umoci", "init", "--layout", str(folder / "oci")], ["umoci", "new", "--image", layout],
                 ["umoci", "insert", "--rootless", "--image", layout, str(root), "/"],
                 ["umoci", "config", "--image", layout, "--config.workingdir", "/testbed", "--config.env", f"PATH={PATH}"]):
        subprocess.run(argv, check=True, capture_output=True)
    subprocess.run(["skopeo", "copy", "--quiet", "--dest-tls-verify=false", f"oci:{layout}", f"docker://{reference}"],
                   check=True, capture_output=True)

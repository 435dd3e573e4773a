"""Every environment variable polar_hpc reads or sets is in docs/configuration.md's table.

A variable is found where the code names it: a string literal `POLAR_*`, `SLURM_*` or `SLURMD_*`
(whole or as an f-string's prefix), or the literal first argument of `os.environ.get`,
`os.getenv` or `os.environ[...]`.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NAMED = re.compile(r"^(POLAR|SLURMD?)_[A-Z0-9_]*$")


def _environ(node: ast.expr) -> bool:
    return ast.unparse(node) in ("os.environ", "environ")


def _variables(tree: ast.AST) -> set[str]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and NAMED.match(node.value):
            found.add(node.value)
        elif isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
            head = str(node.values[0].value)
            if NAMED.match(head):
                found.add(head)
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            f = node.func
            if isinstance(f, ast.Attribute) and ((f.attr == "get" and _environ(f.value)) or
                                                 ast.unparse(f) == "os.getenv"):
                found.add(str(node.args[0].value))
        elif isinstance(node, ast.Subscript) and _environ(node.value) and isinstance(node.slice, ast.Constant):
            found.add(str(node.slice.value))
    return found


def test_every_environment_variable_is_documented() -> None:
    doc = (ROOT / "docs" / "configuration.md").read_text()
    table = doc[doc.index("## Environment variables"):]
    missing: dict[str, str] = {}
    for path in sorted((ROOT / "polar_hpc").rglob("*.py")):
        for name in _variables(ast.parse(path.read_text())):
            if f"`{name}" not in table:
                missing.setdefault(name, str(path.relative_to(ROOT)))
    assert not missing, f"not in docs/configuration.md's environment table: {missing}"


def test_the_scan_finds_each_way_code_names_a_variable() -> None:
    code = ('import os\nA = "POLAR_X"\nos.environ.get("HOME")\nos.getenv("LANG")\n'
            'os.environ["TERM"]\nf"SLURM_JOB_NODELIST_HET_GROUP_{g}"\n"not_one"\n')
    assert _variables(ast.parse(code)) == {"POLAR_X", "HOME", "LANG", "TERM", "SLURM_JOB_NODELIST_HET_GROUP_"}

"""One base for polar-hpc's errors: every exception class a module of polar_hpc defines derives from
`errors.PolarError`, and the CLI turns each kind into its documented exit code, one line, no
traceback."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest
import typer

import polar_hpc
from polar_hpc import cli, errors


NOT_IMPORTED = ("__main__", "build")  # CLI entries run at import; tiny.build needs torch (the tiny extra)


def _modules():
    for info in pkgutil.walk_packages(polar_hpc.__path__, "polar_hpc."):
        if info.name.rsplit(".", 1)[1] not in NOT_IMPORTED:
            yield importlib.import_module(info.name)


def test_every_error_class_derives_from_polar_error() -> None:
    defined = {obj for module in _modules() for _, obj in inspect.getmembers(module, inspect.isclass)
               if issubclass(obj, BaseException) and obj.__module__.startswith("polar_hpc.")}
    assert len(defined) >= 12
    assert [c.__qualname__ for c in defined if not issubclass(c, errors.PolarError)] == []


@pytest.mark.parametrize(("kind", "code"), [
    (errors.ConfigError, 2), (errors.SubmissionError, 2), (errors.RequestRefused, 2),
    (errors.ChildFailed, 1), (errors.ToolFailed, 1), (errors.WeightUpdateFailed, 1),
])
def test_the_cli_guard_gives_each_kind_its_exit_code(kind, code, capsys) -> None:
    def fail():
        raise kind("what went wrong, and where")
    with pytest.raises(typer.Exit) as exited:
        cli._guard(fail)
    assert exited.value.exit_code == code
    assert capsys.readouterr().err == "error: what went wrong, and where\n"

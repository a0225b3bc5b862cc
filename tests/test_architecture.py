"""The layers of DESIGN.md, enforced: import-linter's contracts hold, and a wrong import fails."""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("pump", "channels", "rdv", "brokermgr", "replay", "rdvpump")
LINT = ("import sys; from importlinter.cli import lint_imports; "
        "sys.exit(lint_imports(no_cache=True, no_logo=True))")


def _lint(where: pathlib.Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", LINT], cwd=where, capture_output=True,
                          text=True, timeout=120)


def test_the_import_contracts_hold() -> None:
    result = _lint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_an_import_up_the_layers_breaks_the_contract(tmp_path: pathlib.Path) -> None:
    for name in PACKAGES:
        shutil.copytree(ROOT / name, tmp_path / name,
                        ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    (tmp_path / "channels" / "_upward.py").write_text("import brokermgr\n")
    (tmp_path / "replay" / "_upward.py").write_text("from rdv import Address\n")
    result = _lint(tmp_path)
    assert result.returncode == 1, result.stdout
    assert "channels._upward -> brokermgr" in result.stdout
    assert "replay._upward -> rdv" in result.stdout


def test_installed_import_names_are_the_design_cards() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    top = {p.split(".")[0] for p in config["tool"]["setuptools"]["packages"]}
    assert top == set(PACKAGES)
    assert config["project"]["scripts"]["rdvpump"] == "rdvpump.cli:main"
    layers = next(c for c in config["tool"]["importlinter"]["contracts"] if c["id"] == "layers")
    assert layers["layers"] == ["rdvpump", "(mq)", "brokermgr", "rdv", "channels", "pump"]

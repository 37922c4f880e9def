"""`pip install .` ships every module inside the tracekit namespace and nothing bare at the top level."""

import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Source folder -> the package name it ships as (pyproject.toml's package-dir mapping).
SHIPPED_ROOTS = {"tracekit": "tracekit", "recorders": "tracekit.recorders", "cli": "tracekit.cli",
                 "schemas": "tracekit.schemas"}


def source_modules() -> set[str]:
    names = set()
    for folder, package in SHIPPED_ROOTS.items():
        for dirpath, dirnames, files in os.walk(os.path.join(REPO, folder)):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            if "__init__.py" not in files:
                continue
            rel = os.path.relpath(dirpath, os.path.join(REPO, folder))
            pkg = package if rel == "." else f"{package}.{rel.replace(os.sep, '.')}"
            names.update(f"{pkg}.{f[:-3]}" if f != "__init__.py" else pkg for f in files if f.endswith(".py"))
    return names


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    target = tmp_path_factory.mktemp("site")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--target", str(target), REPO], check=True, capture_output=True, timeout=300)
    return target


def test_no_bare_top_level_modules(installed):
    top = {p.name for p in installed.iterdir() if not p.name.endswith((".dist-info", ".egg-info"))}
    assert top - {"bin"} == {"tracekit"}


def test_every_source_module_is_installed_and_imports_outside_the_repo(installed):
    modules = sorted(m for m in source_modules() if not m.endswith("sitecustomize"))
    code = "import importlib, sys\nfor m in sys.argv[1:]: importlib.import_module(m)\nimport tracekit; print(tracekit.__file__)"
    out = subprocess.run([sys.executable, "-c", code, *modules], cwd=str(installed.parent), capture_output=True,
                         text=True, env={**os.environ, "PYTHONPATH": str(installed)}, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().startswith(str(installed))


def test_schemas_ship_as_package_data(installed):
    shipped = {p.name for p in (installed / "tracekit" / "schemas").iterdir()}
    assert {"store-metadata.schema.json", "diff-report.schema.json"} <= shipped

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


@pytest.fixture(scope="module")
def editable(tmp_path_factory):
    """A new virtual environment with this checkout installed editable (`pip install -e`), as the README does.

    The dependencies come from this environment's site-packages as a plain path (a .pth line), so that
    folder's own .pth files, among them the editable finder of this environment's tracekit, stay unused.
    """
    import site

    venv = tmp_path_factory.mktemp("editable") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    own_site = subprocess.run([python, "-c", "import site; print(site.getsitepackages()[0])"], check=True,
                              capture_output=True, text=True).stdout.strip()
    with open(os.path.join(own_site, "deps.pth"), "w") as f:
        f.write("\n".join(site.getsitepackages()) + "\n")
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "-e", REPO],
                   check=True, capture_output=True, timeout=300)
    return python


def _run(python, code, cwd):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([python, "-c", code], cwd=cwd, capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.parametrize("where", ["checkout", "elsewhere"])
def test_editable_install_maps_recorders_and_cli_without_path_patching(editable, where, tmp_path):
    cwd = REPO if where == "checkout" else str(tmp_path)
    out = _run(editable, "import tracekit, tracekit.cli.main, tracekit.launch.launcher, tracekit.recorders, tracekit.schemas\n"
                         "print(tracekit.__path__, tracekit.cli.__file__, tracekit.recorders.__file__)", cwd)
    assert out.returncode == 0, out.stderr[-3000:]
    paths, cli_file, rec_file = out.stdout.rsplit(" ", 2)
    assert paths == repr([os.path.join(REPO, "tracekit")])  # the package path is the package folder only
    assert cli_file == os.path.join(REPO, "cli", "__init__.py")
    assert rec_file.strip() == os.path.join(REPO, "recorders", "__init__.py")


@pytest.mark.parametrize("name", ["tracekit.tests", "tracekit.bench", "tracekit.samples", "cli", "recorders"])
def test_editable_install_exposes_nothing_else(editable, name, tmp_path):
    out = _run(editable, f"import {name}", str(tmp_path))
    assert out.returncode == 1 and "ModuleNotFoundError" in out.stderr, out.stderr[-2000:]
    # from the checkout, repository folders are importable as themselves (cwd is on sys.path), never in tracekit
    if name.startswith("tracekit."):
        out = _run(editable, f"import {name}", REPO)
        assert out.returncode == 1 and "ModuleNotFoundError" in out.stderr, out.stderr[-2000:]


@pytest.mark.parametrize("folder", ["cli", "recorders"])
def test_checkout_folders_are_no_second_identity(folder):
    """From a checkout (cwd on sys.path), `import recorders` would load a second copy of the same
    files beside tracekit.recorders, with its own module state; it fails and names the real one."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    bare = subprocess.run([sys.executable, "-c", f"import {folder}"], cwd=REPO, capture_output=True, text=True,
                          env=env, timeout=120)
    assert bare.returncode == 1 and "ImportError" in bare.stderr, bare.stderr[-2000:]
    assert f"import tracekit.{folder}" in bare.stderr.splitlines()[-1]
    shipped = subprocess.run([sys.executable, "-c", f"import tracekit.{folder}"], cwd=REPO, capture_output=True,
                             text=True, env=env, timeout=120)
    assert shipped.returncode == 0, shipped.stderr[-2000:]

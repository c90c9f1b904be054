"""The package on a broken numpy/h5py pairing: `import touchstone` explains it in one line.

Debian's h5py 3.7 is built against Debian's numpy 1.24; a numpy 2 earlier on the path (what `pip
install --user torch` brings) breaks it deep inside h5py ("numpy.dtype size changed"). The pairing is
made here from the two stacks tools/install-deps.sh installs: Debian's /usr/bin/python3 and h5py, with
the numpy 2 of the venv (TOUCHSTONE_VENV) first on the path.
"""
import glob
import os
import shutil
import subprocess
import sys

import pytest


def venv_site_packages():
    venv = os.environ.get("TOUCHSTONE_VENV")
    if not venv:
        pytest.fail("set TOUCHSTONE_VENV to the venv of tools/install-deps.sh (CTest does)")
    found = glob.glob(os.path.join(venv, "lib", "python3*", "site-packages"))
    if len(found) != 1 or not os.path.isdir(os.path.join(found[0], "numpy")):
        pytest.fail(f"{venv} holds no numpy (run tools/install-deps.sh)")
    return found[0]


def test_a_numpy_that_debian_h5py_was_not_built_against_is_named(tmp_path):
    # Only numpy (and its bundled libraries) of the venv, so that Debian's h5py is the one found.
    site = venv_site_packages()
    for name in ("numpy", "numpy.libs"):
        if os.path.exists(os.path.join(site, name)):
            os.symlink(os.path.join(site, name), tmp_path / name)
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    result = subprocess.run(["/usr/bin/python3", "-c", "import touchstone"], capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": f"{tmp_path}:{package}"}, timeout=120)
    assert result.returncode != 0, "Debian's h5py imported beside numpy 2: the pairing this test needs is gone"
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: touchstone: h5py from /usr/lib/python3/dist-packages does not "
                           "import beside numpy 2."), last
    assert f"from {tmp_path}" in last and "numpy.dtype size changed" in last, last
    assert "same source" in last, last


def test_the_installed_pairing_imports():
    # The interpreter running this test (Debian's or the venv's) has a working pairing.
    result = subprocess.run([sys.executable, "-c", "import touchstone, h5py, numpy; print(numpy.__version__)"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_pip_install_puts_every_module_of_the_package_in_place(tmp_path):
    # `pip install ./python` on the running stack (no build isolation: the stack's own setuptools and
    # wheel, nothing fetched), then the installed copy alone imports and holds every module of the tree.
    # From a copy: pip builds in the source tree (build/, *.egg-info), which the other stack's run of this
    # test may be doing at the same time.
    package = tmp_path / "python"
    shutil.copytree(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), package,
                    ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info", "tests"))
    target = tmp_path / "site"
    result = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                             "--no-index", "--disable-pip-version-check", "--target", str(target), str(package)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    source = os.path.join(package, "touchstone")
    expected = sorted(os.path.relpath(os.path.join(d, f), source) for d, _, files in os.walk(source)
                      for f in files if f.endswith(".py"))
    installed_root = target / "touchstone"
    installed = sorted(os.path.relpath(os.path.join(d, f), installed_root) for d, _, files in os.walk(installed_root)
                       for f in files if f.endswith(".py"))
    assert installed == expected
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(target)
    imported = subprocess.run([sys.executable, "-c", "import touchstone; print(touchstone.__file__)"],
                              capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.strip().startswith(str(target)), imported.stdout

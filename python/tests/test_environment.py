"""The package on a broken numpy/h5py pairing: `import touchstone` explains it in one line.

Debian's h5py 3.7 is built against Debian's numpy 1.24; a numpy 2 earlier on the path (what `pip
install --user torch` brings) breaks it deep inside h5py ("numpy.dtype size changed"). The pairing is
made here from the two stacks tools/install-deps.sh installs: Debian's /usr/bin/python3 and h5py, with
the numpy 2 of the venv (TOUCHSTONE_VENV) first on the path.
"""
import glob
import os
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

"""h5py, imported once for the whole package, with a one-line explanation when it cannot be.

h5py's compiled part is built against one numpy. When another numpy comes first on the path (a
`pip install torch` into the user's site-packages brings numpy 2 over Debian's numpy 1.24, which
Debian's h5py 3.7 is built against) the import dies deep inside h5py with "numpy.dtype size changed,
may indicate binary incompatibility". That says nothing about what to do, so the failure is reported
as the pairing it is: which h5py, which numpy, from where, and the two pairings that work.
"""

import importlib.util
import os
import sys


def _numpy_origin() -> str:
    """'<version> from <folder>' of the numpy h5py met: the one imported (h5py imports it first)."""
    numpy = sys.modules.get("numpy")
    if numpy is None:
        return "(not imported)"
    return f"{getattr(numpy, '__version__', '?')} from {os.path.dirname(os.path.dirname(numpy.__file__))}"


def _h5py_origin() -> str:
    """'from <folder>' of the h5py that failed (its version is in a module that did not import)."""
    try:
        spec = importlib.util.find_spec("h5py")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.origin:
        return "(not found)"
    return f"from {os.path.dirname(os.path.dirname(spec.origin))}"


def import_h5py():
    """The h5py module; ImportError with one line naming both packages when h5py and numpy do not pair."""
    try:
        import h5py  # noqa: F401  (imported here so that the failure is explained once)
    except (ImportError, ValueError) as error:
        cause = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ImportError(
            f"touchstone: h5py {_h5py_origin()} does not import beside numpy {_numpy_origin()}: {cause}; "
            "h5py must be built against the numpy that is imported: use numpy and h5py from the same "
            "source (both from PyPI, as the venv of tools/install-deps.sh has them, or Debian's "
            "python3-numpy with python3-h5py, with no other numpy on the path)") from error
    return h5py

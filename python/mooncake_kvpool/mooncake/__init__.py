"""mooncake - Mooncake's import path served by kvpool (the mooncake-kvpool wheel).

An engine's unchanged `from mooncake.store import MooncakeDistributedStore, ReplicateConfig`
gets kvpool's drop-in: `mooncake.store` is kvpool.mooncake itself (the same module object that
kvpool.mooncake.install() puts there), with every name it exports. Nothing else of Mooncake's
package is provided (no mooncake.engine: kvpool has no transfer engine to share).

It never shadows a real Mooncake silently. At import it asks importlib.metadata whether another
distribution ships a `mooncake` package (Mooncake's wheels: mooncake-transfer-engine,
mooncake-transfer-engine-non-cuda and their variants; or any distribution whose files or
top_level.txt name `mooncake`). If one does, the two wheels share one folder and overwrite each
other's files, so neither can be trusted, and the import fails with ImportError saying which
distributions are installed and how to choose:
  - Mooncake:  pip uninstall mooncake-kvpool   (and reinstall Mooncake's wheel)
  - kvpool:    pip uninstall <Mooncake's distribution>, then pip install --force-reinstall
               the mooncake-kvpool wheel
  - kvpool anyway, for this process: KVPOOL_MOONCAKE=force in the environment (a warning is
    still printed, once).
Without this wheel, kvpool.mooncake.install() does the same for one process, from code.
"""

import os
import re
import sys
import warnings

SHIM_DISTRIBUTION = "mooncake-kvpool"
#  Mooncake's own wheels (mooncake-wheel/ in kvcache-ai/Mooncake), known by name so that the
#  check does not depend on their file lists.
MOONCAKE_DISTRIBUTIONS = ("mooncake-transfer-engine", "mooncake-transfer-engine-non-cuda",
                          "mooncake-transfer-engine-cuda13", "mooncake")


class MooncakeConflictWarning(UserWarning):
    """kvpool's mooncake package loaded beside a real Mooncake (KVPOOL_MOONCAKE=force)."""


def _canonical(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def _ships_mooncake(dist):
    try:
        top = dist.read_text("top_level.txt")
    except Exception:          # an unreadable distribution says nothing either way
        top = None
    if top is not None:
        return "mooncake" in top.split()
    for path in dist.files or ():
        parts = path.parts
        if parts and parts[0] == "mooncake":
            return True
    return False


def other_mooncakes():
    """Names of the installed distributions, other than this one, that ship `mooncake`."""
    from importlib import metadata
    found = set()
    for dist in metadata.distributions():
        name = dist.metadata["Name"] or ""
        canonical = _canonical(name)
        if canonical == SHIM_DISTRIBUTION or not canonical:
            continue
        if canonical in MOONCAKE_DISTRIBUTIONS or _ships_mooncake(dist):
            found.add(name)
    return sorted(found)


def _check():
    others = other_mooncakes()
    if not others:
        return
    message = ("the mooncake-kvpool wheel (kvpool's mooncake.store) is installed beside %s, "
               "which also provides the `mooncake` package; the two overwrite each other's "
               "files. Choose one: `pip uninstall mooncake-kvpool` to use Mooncake, or `pip "
               "uninstall %s` and `pip install --force-reinstall` the mooncake-kvpool wheel to "
               "use kvpool (KVPOOL_MOONCAKE=force uses kvpool anyway)."
               % (", ".join(others), " ".join(others)))
    if os.environ.get("KVPOOL_MOONCAKE", "").strip().lower() != "force":
        raise ImportError(message)
    warnings.warn(message, MooncakeConflictWarning, stacklevel=3)
    print("mooncake (kvpool): warning: " + message, file=sys.stderr)


_check()

from kvpool import mooncake as store  # noqa: E402 (after the check, on purpose)

sys.modules[__name__ + ".store"] = store
__all__ = ["store"]

"""Where the package finds libkvpool: next to the installed package first (make install's
layout: PREFIX/lib/python3/dist-packages/kvpool and PREFIX/lib/libkvpool.so), then $KVPOOL_LIB,
then the source tree's build/lib. Each case imports a copy of the package in a fresh
interpreter."""

import glob
import os
import shutil
import subprocess
import sys

from conftest import REPO

BUILT = os.path.join(REPO, "build", "lib", "libkvpool.so")


def copy_package(dest):
    os.makedirs(dest)
    for path in glob.glob(os.path.join(REPO, "python", "kvpool", "*.py")):
        shutil.copy(path, dest)


def library_path(pythonpath, env_lib=None, cwd="/"):
    env = dict(os.environ, PYTHONPATH=pythonpath)
    env.pop("KVPOOL_LIB", None)
    if env_lib is not None:
        env["KVPOOL_LIB"] = env_lib
    return subprocess.run([sys.executable, "-c", "import kvpool; print(kvpool.library_path)"],
                          env=env, cwd=cwd, capture_output=True, text=True, timeout=60)


def test_installed_layout(tmp_path):
    prefix = tmp_path / "prefix"
    copy_package(str(prefix / "lib" / "python3" / "dist-packages" / "kvpool"))
    shutil.copy(BUILT, str(prefix / "lib" / "libkvpool.so.1"))
    os.symlink("libkvpool.so.1", str(prefix / "lib" / "libkvpool.so"))
    elsewhere = tmp_path / "elsewhere"
    os.makedirs(str(elsewhere))
    shutil.copy(BUILT, str(elsewhere / "libkvpool.so"))
    result = library_path(str(prefix / "lib" / "python3" / "dist-packages"),
                          env_lib=str(elsewhere))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(prefix / "lib" / "libkvpool.so")


def test_kvpool_lib_environment(tmp_path):
    copy_package(str(tmp_path / "site" / "kvpool"))
    os.makedirs(str(tmp_path / "libdir"))
    shutil.copy(BUILT, str(tmp_path / "libdir" / "libkvpool.so"))
    as_dir = library_path(str(tmp_path / "site"), env_lib=str(tmp_path / "libdir"))
    assert as_dir.returncode == 0, as_dir.stderr
    assert as_dir.stdout.strip() == str(tmp_path / "libdir" / "libkvpool.so")
    as_file = library_path(str(tmp_path / "site"),
                           env_lib=str(tmp_path / "libdir" / "libkvpool.so"))
    assert as_file.stdout.strip() == str(tmp_path / "libdir" / "libkvpool.so")


def test_source_tree_build():
    result = library_path(os.path.join(REPO, "python"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == BUILT


def test_missing_library_says_what_to_do(tmp_path):
    copy_package(str(tmp_path / "site" / "kvpool"))
    result = library_path(str(tmp_path / "site"), env_lib=str(tmp_path / "nothing-here"))
    if "cannot load" not in result.stderr:
        # A system-wide install (ldconfig path) may satisfy the last fallback.
        assert result.returncode == 0 and "libkvpool" in result.stdout
        return
    assert result.returncode != 0
    assert "KVPOOL_LIB" in result.stderr and "make" in result.stderr

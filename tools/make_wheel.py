#!/usr/bin/env python3
"""make_wheel.py - builds kvpool's two wheels with the standard library alone (`make wheel`).

    make_wheel.py --lib build/wheel/libkvpool.so --python python --version 0.1.0 --out dist

writes
  dist/kvpool-VERSION-py3-none-linux_<arch>.whl
      the package python/kvpool (its .py files, the generated ones included), libkvpool.so
      beside them, and in kvpool/_libs every shared library libkvpool loads beyond the C
      library, its loader and the compiler's runtime (the list tests/gpu/bundle.sh keeps):
      libczmq, libzmq, libsodium, ... copied from where the build machine's loader finds them.
      The libkvpool given is linked for the wheel with DT_RPATH $ORIGIN/_libs (make's
      build/wheel/libkvpool.so): DT_RPATH, unlike DT_RUNPATH, is also searched for the
      dependencies of its dependencies, so libczmq's libzmq, libzmq's libsodium and so on all
      come from _libs with no LD_LIBRARY_PATH. The bundled libraries must not carry a
      DT_RUNPATH of their own (it would replace that search for their dependencies): checked.
      "py3-none": the package is pure Python over ctypes and runs on every CPython >= 3.9;
      the optional C extension kvpool._batch is left out (it is built per Python version;
      without it the package builds its batch arrays in Python, and answers the same).
      "linux_<arch>": the libraries are this machine's (Debian 12, glibc 2.36); pip accepts
      the tag on any Linux of that architecture, and the wheel needs glibc 2.36 or newer.
  dist/mooncake_kvpool-VERSION-py3-none-any.whl
      python/mooncake_kvpool/mooncake: a `mooncake` package whose `mooncake.store` is
      kvpool's drop-in (kvpool.mooncake), requiring kvpool of the same version. Opt-in: it
      takes Mooncake's import name, and refuses to load beside a real Mooncake (see its
      __init__.py).

A wheel is a zip: the files, then NAME-VERSION.dist-info/{METADATA,WHEEL,top_level.txt,RECORD}
(RECORD lists every file with its sha256 and size). Entries are written in sorted order with a
fixed timestamp, so the same inputs give the same bytes.
"""

import argparse
import base64
import hashlib
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile

#  What every Linux machine has (a newer one is fine: they keep old symbols), as
#  tests/gpu/bundle.sh skips them.
SYSTEM_LIBS = re.compile(r"^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libresolv|"
                         r"libutil|libgcc_s|libstdc\+\+)\.so")
TIMESTAMP = (2020, 1, 1, 0, 0, 0)
SUMMARY = "Python client of kvpool, a distributed KV-cache store for LLM inference"


def run(*command):
    return subprocess.run(command, check=True, capture_output=True, text=True).stdout


def needed_libraries(library):
    """[(soname, path)] of what the loader maps for library, beyond the system's."""
    env = dict(os.environ)
    env.pop("LD_LIBRARY_PATH", None)
    out = subprocess.run(["ldd", library], check=True, capture_output=True, text=True,
                         env=env).stdout
    found = []
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[1] == "=>" and parts[2].startswith("/"):
            if not SYSTEM_LIBS.match(parts[0]):
                found.append((parts[0], parts[2]))
            continue
        if "not found" in line:
            sys.exit("make_wheel: %s: %s" % (library, line.strip()))
    return sorted(set(found))


def dynamic_tags(path):
    return run("readelf", "-d", path)


def record_line(arcname, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return "%s,sha256=%s,%d" % (arcname, digest, len(data))


def write_wheel(path, files, dist_info, metadata, wheel, top_level):
    """files: {arcname: (bytes, mode)}. Writes the zip with the dist-info and RECORD."""
    files = dict(files)
    files[dist_info + "/METADATA"] = (metadata.encode(), 0o644)
    files[dist_info + "/WHEEL"] = (wheel.encode(), 0o644)
    files[dist_info + "/top_level.txt"] = ((top_level + "\n").encode(), 0o644)
    record = [record_line(name, files[name][0]) for name in sorted(files)]
    record.append(dist_info + "/RECORD,,")
    files[dist_info + "/RECORD"] = (("\n".join(record) + "\n").encode(), 0o644)
    tmp = path + ".tmp"
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as archive:
        # dist-info last, RECORD at the very end, as wheels are usually laid out.
        order = sorted(files, key=lambda n: (n.startswith(dist_info), n == dist_info + "/RECORD",
                                             n))
        for name in order:
            data, mode = files[name]
            info = zipfile.ZipInfo(name, TIMESTAMP)
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, data)
    os.replace(tmp, path)
    return path


def python_files(folder, package):
    """{package/NAME.py: (bytes, 0o644)} for the .py files of folder."""
    out = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".py"):
            with open(os.path.join(folder, name), "rb") as file:
                out["%s/%s" % (package, name)] = (file.read(), 0o644)
    return out


def stripped(path, workdir):
    """The bytes of a copy of path without symbols (strip --strip-unneeded), or as is."""
    copy = os.path.join(workdir, os.path.basename(path))
    shutil.copy(path, copy)
    os.chmod(copy, 0o755)
    if shutil.which("strip"):
        subprocess.run(["strip", "--strip-unneeded", copy], check=True)
    with open(copy, "rb") as file:
        return file.read()


def metadata_text(name, version, summary, requires=(), description=""):
    lines = ["Metadata-Version: 2.1", "Name: " + name, "Version: " + version,
             "Summary: " + summary, "Requires-Python: >=3.9"]
    lines += ["Requires-Dist: " + r for r in requires]
    text = "\n".join(lines) + "\n"
    if description:
        text += "Description-Content-Type: text/plain\n\n" + description
    return text


def wheel_text(tag, purelib):
    return ("Wheel-Version: 1.0\nGenerator: kvpool tools/make_wheel.py\n"
            "Root-Is-Purelib: %s\nTag: %s\n" % ("true" if purelib else "false", tag))


def package_version(init_path):
    with open(init_path) as file:
        match = re.search(r'^__version__ = "([^"]+)"', file.read(), re.M)
    return match.group(1) if match else None


def build_kvpool(args, workdir):
    package_dir = os.path.join(args.python, "kvpool")
    files = python_files(package_dir, "kvpool")
    for generated in ("kvpool/_status_text.py",):
        if generated not in files:
            sys.exit("make_wheel: %s missing: run make python-proto" % generated)
    tags = dynamic_tags(args.lib)
    if "$ORIGIN/_libs" not in tags or "(RPATH)" not in tags:
        sys.exit("make_wheel: %s lacks DT_RPATH $ORIGIN/_libs (link it with "
                 "-Wl,--disable-new-dtags,-rpath,'$ORIGIN/_libs')" % args.lib)
    files["kvpool/libkvpool.so"] = (stripped(args.lib, workdir), 0o755)
    bundled = []
    for soname, path in needed_libraries(args.lib):
        if "(RUNPATH)" in dynamic_tags(path):
            sys.exit("make_wheel: %s has a DT_RUNPATH: its dependencies would not be looked "
                     "for in kvpool/_libs" % path)
        files["kvpool/_libs/" + soname] = (stripped(path, workdir), 0o755)
        bundled.append(soname)
    arch = platform.machine()
    tag = "py3-none-linux_%s" % arch
    description = ("kvpool's Python client (kvpool.Client) and its drop-in for Mooncake "
                   "Store's MooncakeDistributedStore (kvpool.mooncake), with libkvpool and "
                   "the libraries it needs: %s.\n" % ", ".join(bundled))
    path = os.path.join(args.out, "kvpool-%s-%s.whl" % (args.version, tag))
    write_wheel(path, files, "kvpool-%s.dist-info" % args.version,
                metadata_text("kvpool", args.version, SUMMARY, description=description),
                wheel_text(tag, purelib=False), "kvpool")
    return path, bundled


def build_shim(args):
    package_dir = os.path.join(args.python, "mooncake_kvpool", "mooncake")
    files = python_files(package_dir, "mooncake")
    tag = "py3-none-any"
    path = os.path.join(args.out, "mooncake_kvpool-%s-%s.whl" % (args.version, tag))
    description = ("A `mooncake` package whose `mooncake.store` is kvpool's drop-in "
                   "(kvpool.mooncake), so that `from mooncake.store import "
                   "MooncakeDistributedStore` gets kvpool. It refuses to load beside a real "
                   "Mooncake distribution.\n")
    write_wheel(path, files, "mooncake_kvpool-%s.dist-info" % args.version,
                metadata_text("mooncake-kvpool", args.version,
                              "Mooncake's import path (mooncake.store) served by kvpool",
                              requires=["kvpool (==%s)" % args.version],
                              description=description),
                wheel_text(tag, purelib=True), "mooncake")
    return path


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lib", required=True, help="libkvpool.so linked for the wheel")
    parser.add_argument("--python", required=True, help="the python/ folder of the tree")
    parser.add_argument("--version", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    declared = package_version(os.path.join(args.python, "kvpool", "__init__.py"))
    if declared != args.version:
        sys.exit("make_wheel: kvpool.__version__ is %s, the build's version %s" %
                 (declared, args.version))
    os.makedirs(args.out, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="kvpool-wheel-") as workdir:
        kvpool_wheel, bundled = build_kvpool(args, workdir)
    shim_wheel = build_shim(args)
    for path in (kvpool_wheel, shim_wheel):
        print("%s (%.1f MiB)" % (path, os.path.getsize(path) / (1 << 20)))
    print("bundled in kvpool/_libs: " + " ".join(bundled))


if __name__ == "__main__":
    main()

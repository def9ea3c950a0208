# clusterctl setup network, on one host (POSIX sh, BSD userland). setup/network.py puts the values first: MODE
# (gather or apply) and, for apply, CMDS: the commands to run, one per line, each already quoted for the shell
# (`sudo -n ifconfig en2 inet 10.99.0.1 netmask 255.255.255.252`). gather prints "key value" lines, then each
# tool's output after a "== tool" line; apply prints "run COMMAND" before each command and "error TEXT" at the
# first that fails, then stops.
say() { printf '%s\n' "$*"; }

gather() {
  os=$(uname -s)
  say "os $os"
  # SSH_CONNECTION: client address, client port, this host's address, port: where this machine reached it
  set -f; set -- ${SSH_CONNECTION:-}; set +f
  say "ssh_ip ${3:-}"
  if command -v sudo >/dev/null 2>&1 && sudo -n true >/dev/null 2>&1; then say "sudo yes"; else say "sudo no"; fi
  [ "$os" = Darwin ] || return 0
  say "macos $(sw_vers -productVersion 2>/dev/null)"
  if command -v rdma_ctl >/dev/null 2>&1; then say "rdma_ctl $(rdma_ctl status 2>&1 | head -n 1)"; fi
  say "== system_profiler"; system_profiler SPThunderboltDataType -json 2>/dev/null
  say "== networksetup"; networksetup -listallhardwareports 2>/dev/null
  say "== ifconfig"; ifconfig -a 2>/dev/null
  say "== ibv_devices"; if command -v ibv_devices >/dev/null 2>&1; then ibv_devices 2>/dev/null; fi
  say "== end"
}

apply() {
  while IFS= read -r c; do
    [ -n "$c" ] || continue
    say "run $c"
    if ! out=$(eval "$c" 2>&1); then
      say "error $c: $(printf '%s\n' "$out" | tail -n 1)"
      return 1
    fi
  done <<END
$CMDS
END
}

case $MODE in
  gather) gather;;
  apply) apply || exit 1;;
  *) say "error unknown MODE $MODE"; exit 1;;
esac

# clusterctl's probe (POSIX sh: python may be the very thing that is broken). probe_script() puts the
# values first: PY WD LIBDIR LIBNAME SSH_CONFIG FULL RDMA MARKER PYTHON_INFO MESH_CONFIG_TEXT MESH_CONFIG, the
# function find_mpirun, and the peers as "$@". One JSON object per line; the parser ignores anything else a chatty shell profile prints.
esc() { case "$1" in
  *[\"\\]*|*[[:cntrl:]]*) printf '%s' "$1" | tr '\n\t\r' '   ' | tr -d '\000-\037' | sed -e 's/\\/\\\\/g' -e 's/"/\\"/g';;
  *) printf '%s' "$1";;
esac; }
# a value that needs no escaping is printed as it is: no command substitution, so no fork per line
j() { case "$2" in
  *[\"\\]*|*[[:cntrl:]]*) printf '{"key":"%s","value":"%s"}\n' "$1" "$(esc "$2")";;
  *) printf '{"key":"%s","value":"%s"}\n' "$1" "$2";;
esac; }
OS=$(uname -s)
j time "$(date +%s)"
j home "$HOME"
# memory in bytes, for the bundled trainer's memory plan (docs/trainer.md#memory-planning); Linux: a cgroup's limit too
if [ "$OS" = Darwin ]; then j mem_total "$(sysctl -n hw.memsize 2>/dev/null)"
else
  j mem_total "$(awk '/^MemTotal:/ { printf "%.0f", $2 * 1024 }' /proc/meminfo 2>/dev/null)"
  j mem_limit "$(cat /sys/fs/cgroup/memory.max 2>/dev/null)"
fi
# this host's rendering of the inventory for OpenSSH: installed (atomically) unless it is there already
if [ -n "$MESH_CONFIG_TEXT" ]; then
  if [ "$(cat "$MESH_CONFIG" 2>/dev/null)" = "$MESH_CONFIG_TEXT" ]; then j mesh_config current
  elif mkdir -p "$(dirname "$MESH_CONFIG")" && printf '%s\n' "$MESH_CONFIG_TEXT" >"$MESH_CONFIG.tmp.$$" \
       && chmod 600 "$MESH_CONFIG.tmp.$$" && mv -f "$MESH_CONFIG.tmp.$$" "$MESH_CONFIG"; then j mesh_config written
  else rm -f "$MESH_CONFIG.tmp.$$"; j mesh_config "could not write $MESH_CONFIG"; fi
fi
mesh_ssh() { ssh -F "$MESH_CONFIG" -- "$1" echo "$MARKER"; }
# SSH to every peer in the background, as mpirun's daemons would (the all-to-all check), keeping ssh's own
# stderr for doctor's diagnosis (docs/facts/ssh.md#show-ssh-stderr). Every background result is printed the moment
# it is known, as one line (one write, shorter than a pipe's atomic size), so that a probe cut off by its
# budget still hands back everything it finished.
# At most MESH_AT_ONCE logins at a time from one host: N hosts each starting N-1 at once would be N(N-1)
# handshakes together, a load doctor made itself (16 hosts: 240), under which a banner can wait past the
# connect timeout. The first batch goes at once; `wait` here only waits for mesh logins (nothing else is in
# the background yet).
n=0
for peer in "$@"; do
  if [ "$n" -ge "$MESH_AT_ONCE" ]; then wait; n=0; fi
  ( o=$(mesh_ssh "$peer" 2>&1 </dev/null); rc=$?
    printf '{"key":"mesh","peer":"%s","rc":%d,"value":"%s"}\n' "$(esc "$peer")" "$rc" "$(esc "$o" | cut -c1-2000)" ) &
  n=$((n + 1))
done
j os "$OS"
j arch "$(uname -m)"
j release "$(uname -r)"
# the non-interactive PATH mpirun and the ranks will get (docs/facts/ssh.md#non-interactive-path)
j path "$PATH"
p=$(command -v "$PY" 2>/dev/null)
j python_path "$p"
if [ -n "$p" ] && [ "$FULL" = yes ]; then ( j python_info "$("$PY" -c "$PYTHON_INFO" 2>&1 </dev/null | cut -c1-2000)" ) & fi
# mpirun: on the PATH a session gets, else where Homebrew and MacPorts put it (not on sshd's PATH on a Mac:
# docs/facts/macos.md#homebrew-path-in-non-login-zsh)
find_mpirun      # sets m (hosts/probe.py find_mpirun_sh, shared with a launch from the first host)
j mpirun "$m"
mdir=
if [ -n "$m" ]; then
  # follow the symlinks by hand: `readlink -f` is GNU's (macOS before 12.3 has none: docs/facts/macos.md#bsd-userland)
  mr=$m; n=0
  while [ -L "$mr" ] && [ $n -lt 20 ]; do
    t=$(readlink "$mr"); case $t in /*) mr=$t;; *) mr=$(dirname "$mr")/$t;; esac; n=$((n+1))
  done
  j mpirun_real "$mr"
  if [ "$FULL" = yes ]; then ( j mpirun_version "$(mpirun --version 2>&1 </dev/null | head -n 3)" ) & fi
  mdir=$(dirname "$(dirname "$mr")")/lib
fi
r=$(command -v rsync 2>/dev/null)
j rsync "$r"
if [ -n "$r" ]; then j rsync_version "$(rsync --version 2>&1 | head -n 1)"; fi
# libmpi: the inventory's mpi_lib_dir, beside mpirun, then Homebrew, conda, Debian and RPM directories
# (what run exports for MLX to load it: docs/facts/mlx-distributed.md#mlx-mpi-libname)
for d in "$LIBDIR" "$mdir" /opt/homebrew/lib /opt/homebrew/opt/open-mpi/lib /usr/local/lib \
         "${CONDA_PREFIX:-/nonexistent}/lib" /usr/lib/x86_64-linux-gnu/openmpi/lib /usr/lib/aarch64-linux-gnu/openmpi/lib \
         /usr/lib64/openmpi/lib /usr/lib/x86_64-linux-gnu /usr/lib/aarch64-linux-gnu /usr/lib64; do
  [ -n "$d" ] || continue
  for n in libmpi.dylib libmpi.40.dylib libmpi.so libmpi.so.40 libmpi.so.12; do
    if [ -e "$d/$n" ]; then j libmpi "$d/$n"; fi
  done
done
if [ -n "$LIBNAME" ]; then
  if [ -e "$LIBNAME" ]; then j libname_exists yes; else j libname_exists no; fi
fi
# can this session write in the workdir? (on a Mac, privacy controls (TCC) stop sshd under ~/Documents,
# ~/Desktop, iCloud and /Volumes without Full Disk Access: docs/facts/macos.md#tcc-blocks-sshd)
if [ "$FULL" = yes ]; then
  t="$WD/.clusterctl-write-test.$$"
  if e=$( { mkdir -p "$WD" && : >"$t" && rm -f "$t"; } 2>&1 ); then j workdir_write yes; else rm -f "$t" 2>/dev/null; j workdir_write "$e"; fi
fi
# the interpreter itself, or the script a shim runs it through (#!/usr/bin/env ...: SIP, docs/facts/macos.md#sip-strips-dyld)
if [ -n "$p" ] && [ "$(head -c 2 "$p" 2>/dev/null)" = "#!" ]; then j python_shebang "$(head -n 1 "$p")"; fi
d=$WD
while [ ! -d "$d" ]; do d=$(dirname "$d"); done
j disk "$(df -Pk "$d" 2>/dev/null | tail -n 1)"
# a Mac: ifconfig even when iproute2mac's `ip` exists, whose listing has no bridge members
# (docs/facts/macos.md#ifconfig-not-ip-on-macos)
if [ "$OS" = Darwin ]; then ifconfig -a 2>/dev/null
else ip -o -4 addr show 2>/dev/null || ifconfig -a 2>/dev/null; fi | while IFS= read -r line; do j iface "$line"; done
# SIP strips DYLD_* variables (docs/facts/macos.md#sip-strips-dyld)
if [ "$OS" = Darwin ]; then
  j sip "$(csrutil status 2>&1)"
  j macos_version "$(sw_vers -productVersion 2>/dev/null)"
  # will it sleep? sleep settings per power source, and whether it has a battery (a laptop: its lid sleeps it)
  # (docs/facts/macos.md#pmset-sleep-settings)
  if [ "$FULL" = yes ]; then
    pmset -g custom 2>&1 </dev/null | while IFS= read -r line; do j pmset_custom "$line"; done
    pmset -g batt 2>&1 </dev/null | while IFS= read -r line; do j pmset_batt "$line"; done
  fi
  # jaccl: RDMA over Thunderbolt 5, enabled from Recovery; its devices as ibv_devices lists them (docs/facts/macos.md#jaccl)
  if [ "$RDMA" = yes ]; then
    j rdma_ctl "$(command -v rdma_ctl 2>/dev/null)"
    if command -v rdma_ctl >/dev/null 2>&1; then j rdma_status "$(rdma_ctl status 2>&1 </dev/null)"; fi
    j ibv_devices "$(command -v ibv_devices 2>/dev/null)"
    if command -v ibv_devices >/dev/null 2>&1; then
      ibv_devices 2>&1 </dev/null | while IFS= read -r line; do j ibv_line "$line"; done
    fi
  fi
fi
if [ -n "$SSH_CONFIG" ]; then
  if [ -r "$SSH_CONFIG" ]; then j ssh_config yes; else j ssh_config no; fi
fi
wait
j done 1

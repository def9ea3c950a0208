# The watchdog behind every command clusterctl runs on a host (docs/inventory.md#remote-commands), and behind
# every local stream too (hosts/local.py). POSIX sh, ps and awk only: dash, bash in POSIX mode (macOS's
# /bin/sh), zsh's sh emulation; BSD ps and awk as on Linux. hosts/remote.py sends this text as it is, less its
# comment and blank lines (so no quoted text in it may hold either), in one `exec /bin/sh -c TEXT sh ARGS`:
#
#     sh watchdog.sh GRACE STDIN SCRIPT [ALIVE]
#
# GRACE: seconds between the TERM and the KILL round; STDIN: `null` (the command's stdin is /dev/null) or
# `frames` (the channel's data is the command's stdin, in frames: below); SCRIPT: what /bin/sh runs. The
# channel is this shell's stdin, which ends only when the channel closes. The exit status is SCRIPT's;
# 125 when the watchdog itself cannot start it.
#
# ALIVE (whole seconds, 0 or none: off): a channel that goes silent is taken as closed. A controller that
# vanishes without closing its connection (its power cut, a Mac asleep, the network between gone silent) leaves
# the channel open for as long as TCP does not give up, which may be hours. With ALIVE, once a line `k` (a
# pulse) came on the channel, a watcher counts the seconds since the last one and, at ALIVE, kills the command's
# tree as when the channel closes. Pulses come only after the command's stdin has ended (the `e` frame) or on a
# `null` channel: data the command has not read yet may hold the frames' relay, never the drain. The pulses
# mark a file (its name from this shell's pid), removed each second by the watcher; the watcher ends with this
# shell.
#
# The command runs in the background; a watcher reads the channel (kept on fd 3: a background job's stdin
# would otherwise be /dev/null). The watcher ends with its command: when the command exits, this shell TERMs
# it (its pid confirmed, by ps, to still be this shell's child) and reaps it, so nothing of ours is left on
# the host. When the channel closes first, the watcher (now ignoring TERM) signals only the command's tree as
# one ps listing shows it while the command's pid still has this shell `$$` as its parent; after the grace
# period it SIGKILLs only those of them that are still the same processes (pid and start time, `lstart`,
# from a new listing: a pid reused in the meantime is spared, a descendant orphaned when the command died is
# not), and their new children. dash has no job control, so no process groups without a tty. `;`, not `&&`,
# between the steps of a round: a pid that exited after ps listed it makes `kill` return non-zero
# (docs/facts/macos.md#kill-status-with-a-gone-pid).
case $2 in null|frames) ;; *) echo "usage: watchdog.sh GRACE null|frames SCRIPT [ALIVE]" >&2; exit 125;; esac
case ${4:-0} in *[!0-9]*) echo "usage: watchdog.sh GRACE null|frames SCRIPT [ALIVE]" >&2; exit 125;; esac
g=$1
a=${4:-0}
m=
[ "$a" -gt 0 ] && m=${TMPDIR:-/tmp}/.clusterctl-alive.$$

# The command's tree, one `pid start-time` line each. With t empty: the command $c and its descendants,
# provided $c is still this shell's child; else the processes of the listing t that are still the same
# (pid and start time) and their descendants. The lists go through ENVIRON: an awk -v value may not hold a
# newline (BSD awk).
our_tree() {
  ps -A -o pid= -o ppid= -o lstart= | T=$t C=$c M=$$ awk '{p[$1]=$2; s[$1]=$3" "$4" "$5" "$6" "$7}
    END{n=split(ENVIRON["T"], l, "\n"); for (i=1; i<=n; i++) {split(l[i], f, " "); w[f[1]]=substr(l[i], length(f[1])+2)}
      if (n == 0) {if (!(ENVIRON["C"] in p) || p[ENVIRON["C"]] != ENVIRON["M"]) exit; d[ENVIRON["C"]]=1}
      else for (x in w) if ((x in s) && s[x] == w[x]) d[x]=1
      m=1; while (m) {m=0; for (x in p) if (!(x in d) && (p[x] in d)) {d[x]=1; m=1}}
      for (x in d) print x " " s[x]}'
}

# The channel has closed: TERM the command's tree, wait the grace period, KILL what is still the same.
kill_tree() {
  trap '' TERM
  t=; t=$(our_tree)
  [ -n "$t" ] || exit 0
  kill -TERM $(printf '%s\n' "$t" | awk '{print $1}')
  sleep "$g"
  t=$(our_tree)
  [ -n "$t" ] && kill -KILL $(printf '%s\n' "$t" | awk '{print $1}')
}

# Read the channel to its end, each pulse marked.
drain() {
  while IFS= read -r l <&3; do [ "$l" = k ] && [ -n "$m" ] && : >"$m"; done
}

# ALIVE: every second, a pulse marked since the last look resets the count; once armed by the first pulse,
# ALIVE seconds without one is a channel closed. Ends when this shell has.
alive() {
  n=0; p=
  while sleep 1; do
    kill -0 $$ 2>/dev/null || exit 0
    if [ -e "$m" ]; then rm -f "$m"; n=0; p=1; continue; fi
    [ -n "$p" ] || continue
    n=$((n + 1))
    [ "$n" -ge "$a" ] && break
  done
  kill_tree
}

# STDIN `frames` (docs/run.md#standard-input): frames of one line each, `d<text>` (the text and a newline),
# `p<text>` (the text alone: a last line without one), and `e` (the end: the command's stdin closes, the
# channel stays open); in a text, a NUL byte and a backslash come as printf %b's octal escapes `\0000` and
# `\0134` (scripts/frames.py encodes them), so every byte passes. The watcher decodes them into a FIFO the
# command reads (the one pipe both the command, started first so that its pid is known, and the watcher can
# be given), under LC_ALL=C, its own: in a UTF-8 locale bash mangles `${l#d}` on a text that is not UTF-8
# (docs/facts/macos.md#bash-locale-bytes); it ignores SIGPIPE, so a command that stops reading only ends the
# data.
relay() {
  trap '' PIPE
  LC_ALL=C
  while IFS= read -r l <&3; do case $l in d*) printf '%b\n' "${l#d}" || break;; p*) printf '%b' "${l#p}" || break;;
    k) [ -n "$m" ] && : >"$m";; *) break;; esac; done
  exec >/dev/null
}

exec 3<&0
if [ "$2" = frames ]; then
  f=${TMPDIR:-/tmp}/.clusterctl-stdin.$$
  rm -f "$f"; mkfifo -m 600 "$f" || exit 125
  /bin/sh -c "$3" <"$f" 3<&- &
  c=$!
  exec 4>"$f"; rm -f "$f"
  { relay; drain; kill_tree; } >&4 4>&- 2>/dev/null &
  exec 3<&- 4>&-
else
  /bin/sh -c "$3" </dev/null 3<&- &
  c=$!
  { drain; kill_tree; } >/dev/null 2>&1 &
  exec 3<&-
fi
w=$!
v=
if [ -n "$m" ]; then alive >/dev/null 2>&1 & v=$!; fi
wait $c; s=$?
x=$(ps -A -o pid= -o ppid= | awk -v w="$w" -v v="$v" -v m="$$" '($1 == w || $1 == v) && $2 == m {print $1}')
[ -n "$x" ] && kill -TERM $x 2>/dev/null
wait "$w" 2>/dev/null
[ -n "$v" ] && wait "$v" 2>/dev/null
[ -n "$m" ] && rm -f "$m"
exit $s

# Sourced by the stand-ins: refuse GNU-only usage as BSD does, else run this machine's tool.
me=${0##*/}
refuse() {   # $1: what BSD would not take; then the whole command line
  what=$1; shift
  [ -n "$FAKE_DARWIN_LOG" ] && printf '%s: refused %s in: %s %s\n' "$me" "$what" "$me" "$*" >>"$FAKE_DARWIN_LOG"
  printf '%s: illegal option -- %s\nusage: %s (fake-Darwin stand-in: BSD %s has no %s)\n' "$me" "$what" "$me" "$me" "$what" >&2
  exit 64
}
real() { for d in /usr/bin /bin /usr/sbin /sbin; do [ -x "$d/$me" ] && exec "$d/$me" "$@"; done; echo "$me: not found" >&2; exit 127; }
# A canned output of this fake Mac's telemetry tools (vm_stat, memory_pressure, sysctl, ioreg, pmset -g therm):
# tests/fixtures/macos/$1.<variant>.txt, the variant named in $FAKE_DARWIN_STATE/telemetry (swapping, throttled; a
# test writes it, no restart needed), else and where that variant has no file of its own, normal.
canned() {
  v=normal
  [ -r "${FAKE_DARWIN_STATE:-/nonexistent}/telemetry" ] && read -r v <"$FAKE_DARWIN_STATE/telemetry"
  f=${FAKE_DARWIN_FIXTURES:?}/$1.${v:-normal}.txt
  [ -f "$f" ] || f=$FAKE_DARWIN_FIXTURES/$1.normal.txt
  cat "$f"
}

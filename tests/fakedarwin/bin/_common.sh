# Sourced by the stand-ins: refuse GNU-only usage as BSD does, else run this machine's tool.
me=${0##*/}
refuse() {   # $1: what BSD would not take; then the whole command line
  what=$1; shift
  [ -n "$FAKE_DARWIN_LOG" ] && printf '%s: refused %s in: %s %s\n' "$me" "$what" "$me" "$*" >>"$FAKE_DARWIN_LOG"
  printf '%s: illegal option -- %s\nusage: %s (fake-Darwin stand-in: BSD %s has no %s)\n' "$me" "$what" "$me" "$me" "$what" >&2
  exit 64
}
real() { for d in /usr/bin /bin /usr/sbin /sbin; do [ -x "$d/$me" ] && exec "$d/$me" "$@"; done; echo "$me: not found" >&2; exit 127; }

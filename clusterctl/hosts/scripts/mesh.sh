# clusterctl setup mesh, on one host (POSIX sh: no python needed yet). setup/mesh.py puts the values first:
# MODE (prepare, apply or undo), DRY (yes: say what would change, change nothing), KEY (this host's mesh key),
# NAME (this host's inventory name), AUTH and KNOWN (for apply: lines for ~/.ssh/authorized_keys and
# ~/.ssh/known_hosts, one per line). Every line it adds ends with a ` clusterctl-mesh:HOST` comment, so undo finds
# exactly those; what else it did (a directory, a key, a file it created, a newline it put at a file's end) is
# noted in ~/.ssh/clusterctl_mesh.setup, and undo puts each file back byte for byte. One line out per change:
# "change TEXT", "would TEXT", "pub KEY", "error TEXT".
S="$HOME/.ssh"; STATE="$S/clusterctl_mesh.setup"; A="$S/authorized_keys"; K="$S/known_hosts"
MARK=' clusterctl-mesh:[^ ]*$'
say() { printf '%s\n' "$*"; }
note() { printf '%s\n' "$1" >> "$STATE"; }
noted() { [ -f "$STATE" ] && grep -qxF -- "$1" "$STATE"; }

prepare() {
  if [ ! -d "$S" ]; then
    if [ "$DRY" = yes ]; then say "would create $S (0700)"
    else mkdir -m 700 "$S" || { say "error cannot create $S"; exit 1; }; note created-dir; say "change created $S"; fi
  fi
  if [ ! -f "$KEY" ]; then
    if [ "$DRY" = yes ]; then say "would create the key pair $KEY (ed25519, no passphrase; it never leaves this host)"; return; fi
    if mkdir -p "$(dirname "$KEY")" && ssh-keygen -q -t ed25519 -N '' -C "clusterctl-mesh@$NAME" -f "$KEY" </dev/null >/dev/null 2>&1; then
      note "created-key $KEY"; say "change created the key pair $KEY"
    elif [ ! -f "$KEY" ]; then      # (a home shared with another host: that one made it at the same moment)
      say "error ssh-keygen could not create $KEY"; exit 1
    fi
  fi
  if [ -f "$KEY.pub" ]; then p=$(cat "$KEY.pub"); else p=$(ssh-keygen -y -f "$KEY" </dev/null 2>/dev/null); fi
  [ -n "$p" ] || { say "error cannot read the public key of $KEY (a passphrase? the mesh key must have none)"; exit 1; }
  say "pub $p"
}

# add FILE CREATED-TAG NEWLINE-TAG LINES: each line not in FILE already is appended
add() {
  f=$1; created=$2; nl=$3
  printf '%s\n' "$4" | while IFS= read -r line; do
    [ -n "$line" ] || continue
    if [ -f "$f" ] && grep -qxF -- "$line" "$f"; then continue; fi
    peer=${line##* clusterctl-mesh:}
    if [ "$DRY" = yes ]; then say "would add $peer's line to $f"; continue; fi
    if [ ! -f "$f" ]; then
      (umask 077; : > "$f") || { say "error cannot create $f"; exit 1; }; note "$created"
    elif [ -n "$(tail -c 1 "$f")" ]; then      # the file does not end with a newline: give it one first
      printf '\n' >> "$f"; noted "$nl" || note "$nl"
    fi
    printf '%s\n' "$line" >> "$f" || { say "error cannot write $f"; exit 1; }
    say "change added $peer's line to $f"
  done
}

# strip FILE CREATED-TAG NEWLINE-TAG: FILE without the lines add() put there, as it was before
strip() {
  f=$1; [ -f "$f" ] || return 0
  grep -q -- "$MARK" "$f" || return 0
  if [ "$DRY" = yes ]; then say "would remove $(grep -c -- "$MARK" "$f") line(s) from $f"; return 0; fi
  t="$f.clusterctl.$$"
  cp -p "$f" "$t" && { grep -v -- "$MARK" "$f" > "$t"; [ $? -le 1 ]; } || { rm -f "$t"; say "error cannot rewrite $f"; exit 1; }
  if noted "$3" && [ -s "$t" ]; then printf '%s' "$(cat "$t")" > "$t.n" && cat "$t.n" > "$t"; rm -f "$t.n"; fi
  if noted "$2" && [ ! -s "$t" ]; then rm -f "$t" "$f"; say "change removed $f"
  else mv -f "$t" "$f"; say "change restored $f"; fi
}

undo() {
  strip "$A" created-auth newline-auth
  strip "$K" created-known newline-known
  if [ -f "$STATE" ]; then
    grep '^created-key ' "$STATE" | while IFS= read -r l; do
      k=${l#created-key }
      if [ "$DRY" = yes ]; then say "would remove the key pair $k"; else rm -f "$k" "$k.pub"; say "change removed the key pair $k"; fi
    done
    if [ "$DRY" != yes ]; then
      d=no; noted created-dir && d=yes
      rm -f "$STATE"
      if [ "$d" = yes ]; then rmdir "$S" 2>/dev/null && say "change removed $S"; fi
    fi
  fi
}

case $MODE in
  prepare) prepare;;
  apply) add "$A" created-auth newline-auth "$AUTH"; add "$K" created-known newline-known "$KNOWN";;
  undo) undo;;
  *) say "error unknown mode $MODE"; exit 2;;
esac

# clusterctl setup python, on one host (POSIX sh: the host's Python is what it looks for). setup/python.py puts
# the values first: WD (the host's workdir), WANT (the Python minor version wanted, "3.11"), PYTHON (a python the
# inventory names, tried first), REQS (the requirements, one per line), DIGEST (a digest of WANT and REQS), DRY,
# CHECK (yes: only say whether the venv holds REQS already), WHEELS (a folder inside WD: install from it alone).
# Lines out: "step TEXT" (what it is doing), "change TEXT", "would TEXT", "python PATH", "error TEXT".
VENV="$WD/.clusterctl/venv"; MARKFILE="$VENV/.clusterctl-setup"
say() { printf '%s\n' "$*"; }
minor() { "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null </dev/null; }

# the venv is there, of the wanted Python, and holds what was asked (the same digest): nothing to do
if [ -x "$VENV/bin/python" ] && [ "$(minor "$VENV/bin/python")" = "$WANT" ] && [ -f "$MARKFILE" ] \
   && [ "$(cat "$MARKFILE")" = "$DIGEST" ]; then
  say "python $VENV/bin/python"; exit 0
fi
[ "$CHECK" = yes ] && { say "needed"; exit 0; }

# a Python WANT: the inventory's, then by name on the PATH a session gets, then where installers put one
found=
uvbin=$(command -v uv 2>/dev/null)
for c in "$PYTHON" "python$WANT" python3 /opt/homebrew/bin/python$WANT /usr/local/bin/python$WANT \
         "/Library/Frameworks/Python.framework/Versions/$WANT/bin/python3" /usr/bin/python$WANT "$HOME/.local/bin/python$WANT"; do
  [ -n "$c" ] || continue
  p=$(command -v "$c" 2>/dev/null) || continue
  case $p in "$VENV"/*) continue;; esac         # the venv's own python cannot make the venv
  if [ "$(minor "$p")" = "$WANT" ]; then found=$p; break; fi
done
if [ -z "$found" ] && [ -n "$uvbin" ]; then found=$("$uvbin" python find "$WANT" 2>/dev/null); fi
if [ -z "$found" ]; then
  case $(uname -s) in
    Darwin) how="brew install python@$WANT, or python.org's installer, or uv python install $WANT";;
    *) how="your package manager (python$WANT, python$WANT-venv), or uv python install $WANT";;
  esac
  say "error no Python $WANT here (this machine runs $WANT): install it ($how)"; exit 1
fi

if [ "$DRY" = yes ]; then
  [ -x "$VENV/bin/python" ] || say "would create the virtual environment $VENV with $found"
  say "would install into it: $(printf '%s' "$REQS" | tr '\n' ' ')"; exit 0
fi

if [ ! -x "$VENV/bin/python" ] || [ "$(minor "$VENV/bin/python")" != "$WANT" ]; then
  say "step creating $VENV with $found"
  rm -rf "$VENV"; mkdir -p "$WD/.clusterctl" || { say "error cannot create $WD/.clusterctl"; exit 1; }
  if [ -n "$uvbin" ]; then o=$("$uvbin" venv --quiet --python "$found" "$VENV" 2>&1)
  else o=$("$found" -m venv "$VENV" 2>&1); fi
  [ $? -eq 0 ] || { say "error cannot create a virtual environment with $found: $(printf '%s' "$o" | tail -n 2 | tr '\n' ' ')"; rm -rf "$VENV"; exit 1; }
  say "change created the virtual environment $VENV ($found)"
fi
printf '%s\n' "$REQS" > "$VENV/.clusterctl-requirements.txt"
say "step installing $(printf '%s' "$REQS" | tr '\n' ' ')"
set --        # offline: from the wheels sent, never an index
[ -n "$WHEELS" ] && set -- --no-index --find-links "$WD/$WHEELS"
if [ -n "$uvbin" ]; then
  o=$("$uvbin" pip install --quiet --python "$VENV/bin/python" "$@" -r "$VENV/.clusterctl-requirements.txt" 2>&1 </dev/null)
else          # --no-compile, as uv: a module is compiled when first imported, not every file at install (2.2x faster)
  o=$("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-compile "$@" -r "$VENV/.clusterctl-requirements.txt" 2>&1 </dev/null)
fi
[ $? -eq 0 ] || { say "error installing failed: $(printf '%s' "$o" | grep -v '^ *$' | tail -n 3 | tr '\n' ' ' | cut -c1-600)"; exit 1; }
printf '%s\n' "$DIGEST" > "$MARKFILE"
say "change installed $(printf '%s' "$REQS" | tr '\n' ' ')"
say "python $VENV/bin/python"

#!/bin/sh
# wheel.sh PYTHON DIR - the fabpool-torch wheel, built offline and installed into a fresh virtual environment:
#   DIR/venv   PYTHON -m venv --system-site-packages: PYTHON's packages (torch where it has it) stay visible, and
#              where PYTHON is itself a virtual environment, a .pth file adds its site-packages too (where venv
#              cannot install pip, Debian's or Ubuntu's python3 without python3-venv: a venv without pip, served
#              by PYTHON's pip --python)
#   DIR/dist   the wheel: the documented command, DIR/venv/bin/python -m pip wheel . --no-build-isolation
#              --no-index --no-deps from the repository root (docs/pytorch.md), or, where the venv has no pip of
#              its own, PYTHON -m build --no-isolation --wheel, or without `build` either, setuptools' build hook
#              (PEP 517) called directly; each uses the installed setuptools and downloads nothing.  The venv sees
#              PYTHON's torch, so the wheel holds the C++ allocator where PYTHON imports torch
#   then pip install --no-index DIR/dist/fabpool_torch-*.whl into DIR/venv, and a check that DIR/venv imports it
# Prints how long each step took.  Used by CI (.ci/run) and on the H200 (adapters/torch/h200-wheel.sh).
set -eu
py=$1 dir=$2
root=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
rm -rf "$dir/venv" "$dir/dist"
t0=$(date +%s)
if ! "$py" -m venv --system-site-packages "$dir/venv"; then
  echo "wheel.sh: $py -m venv failed: a venv without pip instead"
  rm -rf "$dir/venv"
  "$py" -m venv --system-site-packages --without-pip "$dir/venv"
fi
vpy=$dir/venv/bin/python
vpip() {
  if "$vpy" -m pip --version >/dev/null 2>&1; then "$vpy" -m pip "$@"; else "$py" -m pip --python "$vpy" "$@"; fi
}
parent=$("$py" -c 'import site, sys; print(":".join(site.getsitepackages()) if sys.prefix != sys.base_prefix else "")')
if [ -n "$parent" ]; then
  site=$("$vpy" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "$parent" | tr ':' '\n' > "$site/fabpool-parent-venv.pth"
  echo "wheel.sh: $py is a virtual environment: its site-packages ($parent) are visible in $dir/venv"
fi
t1=$(date +%s)
if "$vpy" -m pip --version >/dev/null 2>&1; then
  (cd "$root" && "$vpy" -m pip wheel . --no-build-isolation --no-index --no-deps -w "$dir/dist")
elif "$py" -c 'import build' 2>/dev/null; then
  echo "wheel.sh: $dir/venv has no pip of its own: $py -m build --no-isolation instead"
  (cd "$root" && "$py" -m build --no-isolation --wheel --outdir "$dir/dist")
else
  echo "wheel.sh: neither 'build' nor pip: setuptools' PEP 517 hook, called directly"
  mkdir -p "$dir/dist"
  (cd "$root" && "$vpy" -c 'import sys, setuptools.build_meta as m; print(m.build_wheel(sys.argv[1]))' "$dir/dist")
fi
t2=$(date +%s)
# --ignore-installed: into this venv, whatever fabpool-torch the visible site-packages may already have
vpip install --no-index --ignore-installed "$dir"/dist/fabpool_torch-*.whl
got=$(cd / && "$vpy" -c 'import fabpool_torch; print(fabpool_torch.__file__)')
case $got in "$dir/venv/"*) ;; *) echo "wheel.sh: $dir/venv imports fabpool_torch from $got, not its own" >&2; exit 1 ;; esac
t3=$(date +%s)
echo "wheel.sh: venv $((t1 - t0)) s, wheel $((t2 - t1)) s, install $((t3 - t2)) s: $(ls "$dir"/dist)"

#!/bin/sh
# wheel.sh PYTHON DIR - the fabpool-torch wheel, built offline and installed into a fresh virtual environment:
#   DIR/venv   PYTHON -m venv --system-site-packages: PYTHON's packages (torch where it has it) stay visible, and
#              where PYTHON is itself a virtual environment, a .pth file adds its site-packages too
#   DIR/dist   the wheel: PYTHON -m build --no-isolation --wheel from the repository root, or, where PYTHON has no
#              `build`, pip wheel --no-index --no-build-isolation by the venv's pip; either uses the installed
#              setuptools and downloads nothing
#   then DIR/venv/bin/python -m pip install --no-index DIR/dist/fabpool_torch-*.whl
# Prints how long each step took.  Used by CI (.ci/run) and on the H200 (adapters/torch/h200-wheel.sh).
set -eu
py=$1 dir=$2
root=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
rm -rf "$dir/venv" "$dir/dist"
t0=$(date +%s)
"$py" -m venv --system-site-packages "$dir/venv"
parent=$("$py" -c 'import site, sys; print(":".join(site.getsitepackages()) if sys.prefix != sys.base_prefix else "")')
if [ -n "$parent" ]; then
  site=$("$dir/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "$parent" | tr ':' '\n' > "$site/fabpool-parent-venv.pth"
  echo "wheel.sh: $py is a virtual environment: its site-packages ($parent) are visible in $dir/venv"
fi
t1=$(date +%s)
if "$py" -c 'import build' 2>/dev/null; then
  (cd "$root" && "$py" -m build --no-isolation --wheel --outdir "$dir/dist")
else
  echo "wheel.sh: $py has no 'build' module: pip wheel --no-build-isolation instead"
  (cd "$root" && "$dir/venv/bin/python" -m pip wheel --no-index --no-build-isolation --no-deps -w "$dir/dist" .)
fi
t2=$(date +%s)
"$dir/venv/bin/python" -m pip install --no-index "$dir"/dist/fabpool_torch-*.whl
t3=$(date +%s)
echo "wheel.sh: venv $((t1 - t0)) s, wheel $((t2 - t1)) s, install $((t3 - t2)) s: $(ls "$dir"/dist)"

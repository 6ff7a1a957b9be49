#!/usr/bin/env bash
# The dashboard as an operator's laptop installs it: `pip install .` with no extras, so no
# torch, in a venv of its own; then tests/tui/test_no_torch.py opens it, edits a run and
# relaunches it. The trainer it watches runs with the repository's venv (it needs torch).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
trainer_python=${TRACKSIDE_TRAINER_PYTHON:-$repo/.venv/bin/python}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

python3 -m venv "$tmp/venv"
pip=("$tmp/venv/bin/python" -m pip --disable-pip-version-check)

# The wheel's own requirements first: a bare torch among them would make the install
# below download gigabytes before any test could fail.
"${pip[@]}" wheel --quiet --no-deps --wheel-dir "$tmp/wheel" "$repo"
wheel=("$tmp"/wheel/trackside-*.whl)
"$tmp/venv/bin/python" - "${wheel[0]}" <<'EOF'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel:
    metadata = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    required = [line for line in wheel.read(metadata).decode().splitlines()
                if line.startswith("Requires-Dist:") and "extra ==" not in line]
if any("torch" in line.lower() for line in required):
    sys.exit(f"the trackside wheel requires torch without the train extra: {required}")
EOF

# What `pip install .` installs: the wheel just built from this tree, and its dependencies.
"${pip[@]}" install "${wheel[0]}" pytest pytest-asyncio pytest-timeout > "$tmp/pip.log" 2>&1 \
  || { cat "$tmp/pip.log" >&2; exit 1; }
if grep -iE '^(Collecting|Downloading) .*torch' "$tmp/pip.log"; then
  echo "pip fetched torch for the dashboard" >&2
  exit 1
fi
if "$tmp/venv/bin/python" -c 'import torch' 2>/dev/null; then
  echo "torch is importable in the no-extras venv" >&2
  exit 1
fi

# The tests run from a copy outside the tree, so that `import tui` finds the installed
# package, not this checkout.
mkdir "$tmp/work"
cp -r "$repo/tests" "$repo/scripts" "$repo/pyproject.toml" "$tmp/work/"
cd "$tmp/work"
TRACKSIDE_TRAINER_PYTHON=$trainer_python \
  "$tmp/venv/bin/python" -m pytest -p no:cacheprovider -q tests/tui/test_no_torch.py "$@"

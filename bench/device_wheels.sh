# Sourced by a device call's script (bench/results/h200-*.sh), from the tree's root: the
# wheels the device's python lacks, carried beside the tree (`.whl`: the trainer's and
# the benches'; `.whl-tui`: the dashboard's, which the tests' conftest imports), each
# installed once into /tmp/site, and PYTHONPATH set to it and the tree. bench/fetch_wheels.sh
# downloads them here.
tui=(); for w in ../.whl-tui/*.whl; do [ -e "../.whl/${w##*/}" ] || tui+=("$w"); done
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site ../.whl/*.whl "${tui[@]}" || return 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1

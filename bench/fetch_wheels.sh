#!/usr/bin/env bash
# Here, before a device call (bench/results/h200-*.sh): download the wheels the device's
# python 3.12 lacks into the tree's ignored .whl (speculators 0.9.0, the benches' rival,
# and what it imports) and .whl-tui (the dashboard's, which the tests' conftest imports;
# the versions .venv holds), for bench/device_wheels.sh to install there. Run from the
# tree's root, after scripts/setup.sh.
set -euo pipefail
platforms=(manylinux_2_34_x86_64 manylinux_2_28_x86_64 manylinux_2_27_x86_64
           manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64 any)
fetch() {  # fetch DIR NAME==VERSION…
  local dir=$1; shift
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${platforms[@]/#/--platform=}" -d "$dir" "$@" 2>&1 \
    | { grep -v '^WARNING: Location' || true; }
}
for dir in .whl .whl-tui; do
  grep -qx "/$dir/" .git/info/exclude 2>/dev/null || echo "/$dir/" >> .git/info/exclude
done
fetch .whl speculators==0.9.0 pydantic==2.14.4 pydantic-core==2.50.5 pydantic-settings==2.16.3 \
  typing-inspection==0.4.5 annotated-types==0.8.0 typing-extensions==4.16.0 \
  python-dotenv==1.2.4 loguru==0.7.3 openai==3.57.0 httpx2==2.16.2 httpcore2==2.16.2 \
  truststore==0.10.5 idna==3.20 jiter==0.19.0 distro==1.9.0 sniffio==1.3.1 datasets==5.2.0 \
  dill==0.4.1 multiprocess==0.70.19 hs-connectors==0.9.0
# The dashboard's and the tests' own, at the versions the suite passes with here.
mapfile -t pins < <(.venv/bin/python -m pip freeze | grep -iE '^(textual|asyncssh|plotext|platformdirs|cryptography|cffi|pycparser|mdit-py-plugins|linkify-it-py|uc-micro-py|rich|markdown-it-py|pytest-asyncio)==')
fetch .whl-tui "${pins[@]}"
echo "$(ls .whl | wc -l) wheels in .whl, $(ls .whl-tui | wc -l) in .whl-tui ($(du -sh .whl .whl-tui | cut -f1 | paste -sd+))"

#!/usr/bin/env bash
# A non-editable install works: build volta-ml from a clean copy of the checkout, `pip install` it (not -e)
# into a fresh virtual environment, and from another folder run the installed commands against the configs
# shipped inside the package. Dependencies (torch, ...) are reused from the interpreter that runs this script
# ($PYTHON, default python3), which must already have them (e.g. after `pip install -e ".[test]"`); volta_ml
# itself must come from the wheel, and the check fails if it does not.
#   usage: scripts/check_wheel_install.sh            (exit 0 when every check passes)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
python="${PYTHON:-python3}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# 1. the files git tracks (or would track), copied: building writes build/ and *.egg-info beside the sources
mkdir "$work/src" "$work/elsewhere"
(cd "$repo" && git ls-files -z --cached --others --exclude-standard \
   | while IFS= read -r -d '' f; do [ -f "$f" ] && printf '%s\0' "$f"; done \
   | tar --null -T - -cf -) | tar -xf - -C "$work/src"

# 2. a fresh venv that sees the dependencies of $python (plain path entries: an editable volta_ml there is not
#    activated, and the venv's own site-packages, where the wheel goes, comes first)
"$python" -m venv --system-site-packages "$work/venv"
site_dir="$("$work/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
"$python" -c 'import site, sys; print("\n".join(p for p in site.getsitepackages() if "site-packages" in p))' \
  > "$site_dir/_volta_ml_deps.pth"
# the wheel is built with $python's setuptools when it can (no download; needs setuptools >= 70.1 or the
# `wheel` package), else in pip's isolated build environment; then it is pip-installed like any wheel
"$python" -m pip wheel --quiet --no-deps --no-build-isolation --wheel-dir "$work/dist" "$work/src" \
  > "$work/build.log" 2>&1 \
  || "$python" -m pip wheel --quiet --no-deps --wheel-dir "$work/dist" "$work/src"
"$work/venv/bin/python" -m pip install --quiet --no-deps "$work"/dist/volta_ml-*.whl

# 3. from another folder, with nothing of the checkout on the path
cd "$work/elsewhere"
export PATH="$work/venv/bin:$PATH"
unset PYTHONPATH
py="$work/venv/bin/python"
"$py" - "$site_dir" <<'EOF'
import sys
import volta_ml
if not volta_ml.__file__.startswith(sys.argv[1]):
    sys.exit(f"volta_ml was imported from {volta_ml.__file__}, not from the installed wheel in {sys.argv[1]}")
EOF
listed="$("$work/venv/bin/volta-ml" models list | awk '{print $1}' | sort)"
shipped="$(cd "$repo/config_models" && ls *.json | sed 's/\.json$//' | grep -v '_weight_name$' | sort)"
if [ "$listed" != "$shipped" ]; then
  echo "volta-ml models list does not show the shipped configs:" >&2
  diff <(echo "$shipped") <(echo "$listed") >&2 || true
  exit 1
fi
for file in "$repo"/config_tasks/*.yml; do
  "$py" -c 'import sys; from volta_ml.tasks.config import load_task_config; load_task_config(sys.argv[1])' \
    "config_tasks/$(basename "$file")"
done
for entry in train_task.py eval_task.py eval_retrieval.py; do   # users drop the entry points in place
  cp "$repo/$entry" .
  "$py" "$entry" --help > /dev/null
done
"$work/venv/bin/volta-ml" --help > /dev/null
echo "wheel install OK: $(echo "$listed" | wc -l) model configs, $(ls "$repo"/config_tasks/*.yml | wc -l) task configs, entry points run"

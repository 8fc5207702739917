#!/usr/bin/env bash
# The served translator on a borrowed GPU machine (bench/gpu_serving.py: CUDA with and without IO binding vs
# CPU tokens, tokens/s at batch 1, 32 and 128), in remote calls that each carry at most ~60 MB.
# onnxruntime-gpu's wheel alone is 255 MB and the machine has no internet, so everything it needs travels as
# parts of one archive, one part a call.
#
#   bench/gpu_serving.sh pack [PART_MB]   # here: .gpu/serve/part.NN from the ORT GPU wheel (Python 3.12),
#                                         # this package's wheel, the newest translator and the test split
#   bench/gpu_serving.sh receive          # there, one call per part but the last (carry that part): keeps it
#                                         # in /tmp/gpu-serve, outside the copied working tree
#   bench/gpu_serving.sh check OUT        # there, the last call (carry the last part): joins, installs into
#                                         # /tmp/gpu-serve/site, runs the comparison, writes OUT/gpu_serving.json
#
# Calls must follow each other within the machine's idle time (30 s), or it is given back with the parts.
# Rehearse here with STAGE=/tmp/gpu-serve-r SITE_PYTHON=.venv/bin/python bash bench/gpu_serving.sh check /tmp/o
# after `receive` of each part: it installs nothing that the venv has and runs CPU against CPU with IO binding.
set -euo pipefail

STAGE=${STAGE:-/tmp/gpu-serve}
PARTS=.gpu/serve
ORT_GPU=onnxruntime-gpu==1.31.1

case ${1:-} in
pack)
    part_mb=${2:-48}
    build=.gpu/serve-build
    rm -rf "$build" "$PARTS"
    mkdir -p "$build/payload/models" "$PARTS"
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 -d "$build/payload" "$ORT_GPU"
    ${PY:-.venv/bin/python} -m attnserve.export.common.gpu_upload wheel  # into .gpu/wheels
    cp .gpu/wheels/attnserve-*.whl "$build/payload/"
    newest=$(ls -d models/translate-zh-en/*/ | sort -t/ -k3 -n | tail -1)
    mkdir -p "$build/payload/models/translate-zh-en"
    cp -r "$newest" "$build/payload/models/translate-zh-en/"
    cp data/corpus/test.tsv "$build/payload/test.tsv"
    tar -C "$build/payload" -cf "$build/payload.tar" .
    split -b "${part_mb}M" -d -a 2 "$build/payload.tar" "$PARTS/part."
    ls -l "$PARTS"
    echo "carry each of these in its own call, in order; the working tree must not carry models/ (docs/gpu-training.md)"
    ;;
receive)
    mkdir -p "$STAGE/parts"
    for part in "$PARTS"/part.*; do
        mv "$part" "$STAGE/parts/"
    done
    ls -l "$STAGE/parts"
    ;;
check)
    out=${2:?usage: check OUT}
    bash "$0" receive
    rm -rf "$STAGE/payload"
    mkdir -p "$STAGE/payload" "$out"
    cat "$STAGE"/parts/part.* | tar -C "$STAGE/payload" -xf -
    python=${SITE_PYTHON:-python3}
    if [[ -z ${SITE_PYTHON:-} ]]; then
        # The machine's Python has numpy, protobuf, grpcio and tokenizers; only these two are new.
        python3 -m pip install -q --no-index --no-deps --no-compile --target "$STAGE/site" "$STAGE"/payload/*.whl
        export PYTHONPATH=$STAGE/site
        nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
        devices="cpu cuda-host cuda"
    else
        devices="cpu cpu-bound"  # rehearsal on a machine without a GPU
    fi
    PYTHONUNBUFFERED=1 $python bench/gpu_serving.py --models "$STAGE/payload/models" --split "$STAGE/payload/test.tsv" \
        --devices $devices --out "$out/gpu_serving.json" ${GPU_SERVING_ARGS:-}
    ;;
*)
    sed -n '2,16p' "$0"
    exit 2
    ;;
esac

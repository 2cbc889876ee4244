#!/usr/bin/env bash
# The Table-2 Fashion-MNIST recipes of one model, seed-major (every cell gets seed s before any gets s+1), one
# thread per run, each recipe into its own results folder; finished points are skipped, interrupted ones resume.
# Usage: bench/table2_sweeps.sh MODEL RESULTS_ROOT SEED...   e.g. bench/table2_sweeps.sh hcnn-small runs 0 1 2 3 4
set -u
cd "$(dirname "$0")/.."
model=$1 root=$2; shift 2
tmp=$(mktemp -d)
for seed in "$@"; do
  for eps in 3 1; do
    for arm in baseline rs; do
      name=rs-t2-fashionmnist-$model-eps$eps-$arm
      sed "s/^seeds: .*/seeds: [$seed]/" "configs/papers/$name.yaml" > "$tmp/$name-s$seed.yaml"
      OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 .venv/bin/dpeval sweep "$tmp/$name-s$seed.yaml" --results "$root/$name" \
        --quiet --wait
      echo "$(date +%T) $name seed $seed exit $?"
    done
  done
done

#!/usr/bin/env bash
# dpeval's benchmark on Fashion-MNIST (docs/benchmark.md): every defense of configs/benchmark/fashionmnist/ under
# every attack at seed 0, and its utility at seeds 1 and 2 (the same recipe with no attack), into one results
# folder; resumable (run it again after an interruption: finished points are skipped). Then the page:
#   bench/benchmark.sh [RESULTS]            # default runs/benchmark-fashionmnist; one thread per run
#   python bench/benchmark_page.py RESULTS  # docs/benchmark.md, its CSV and figures
set -euo pipefail
cd "$(dirname "$0")/.."
results=${1:-runs/benchmark-fashionmnist}
mkdir -p "$results/utility-recipes"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
DPEVAL=${DPEVAL:-dpeval}
defenses="none dpsgd rs random-freeze adaclip groupwise-all groupwise-layer gep"  # cheapest first, GEP last
for d in $defenses; do  # the membership and gradient attacks, seed 0
    $DPEVAL sweep "configs/benchmark/fashionmnist/$d.yaml" --results "$results" --quiet
done
for d in $defenses; do  # utility at two more seeds: the same recipe, no attack
    sed -e 's/^attacks: .*/attacks: []/' -e '/^attack: /d' -e 's/^seeds: .*/seeds: [1, 2]/' \
        "configs/benchmark/fashionmnist/$d.yaml" > "$results/utility-recipes/$d.yaml"
    $DPEVAL sweep "$results/utility-recipes/$d.yaml" --results "$results" --quiet
done

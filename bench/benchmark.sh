#!/usr/bin/env bash
# dpeval's benchmark on Fashion-MNIST (docs/benchmark.md): every defense of configs/benchmark/fashionmnist/ under
# every attack at seed 0, its utility at seeds 1 and 2 (the same recipe with no attack), and the one-run audit of
# each private row (dpeval audit --scope run: the recipe trained once more with 1,000 canaries; one JSON per
# defense and ε under RESULTS/audits), into one results folder; resumable (run it again after an interruption:
# finished points and audits are skipped). Then the page:
#   bench/benchmark.sh [RESULTS]            # default runs/benchmark-fashionmnist; one thread per run
#   WORKERS=2 bench/benchmark.sh [RESULTS]  # two runs at a time (each sweep's points in parallel), one thread each
#   python bench/benchmark_page.py RESULTS  # docs/benchmark.md, its CSV and figures
set -euo pipefail
cd "$(dirname "$0")/.."
results=${1:-runs/benchmark-fashionmnist}
mkdir -p "$results/utility-recipes"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
DPEVAL=${DPEVAL:-dpeval}
WORKERS=${WORKERS:-1}
defenses="none dpsgd rs random-freeze adaclip groupwise-all groupwise-layer gep"  # cheapest first, GEP last
for d in $defenses; do  # the membership and gradient attacks, seed 0
    $DPEVAL sweep "configs/benchmark/fashionmnist/$d.yaml" --results "$results" --workers "$WORKERS" --quiet
done
for d in $defenses; do  # utility at two more seeds: the same recipe, no attack
    sed -e 's/^attacks: .*/attacks: []/' -e '/^attack: /d' -e 's/^seeds: .*/seeds: [1, 2]/' \
        "configs/benchmark/fashionmnist/$d.yaml" > "$results/utility-recipes/$d.yaml"
    $DPEVAL sweep "$results/utility-recipes/$d.yaml" --results "$results" --workers "$WORKERS" --quiet
done
for d in $defenses; do  # the one-run audit of every private row at every ε
    [ "$d" = none ] && continue
    mkdir -p "$results/audits"
    for eps in 1.0 3.0 8.0; do
        out="$results/audits/$d-eps$eps.json"
        [ -s "$out" ] && continue
        sed -e '/^attacks: /d' -e '/^attack: /d' -e '/^seeds: /d' -e "s/epsilon: \[[^]]*\]/epsilon: $eps/" \
            "configs/benchmark/fashionmnist/$d.yaml" > "$results/audits/$d-eps$eps.yaml"
        name=$(sed -n 's/^defense: {name: \([a-z-]*\).*/\1/p' "$results/audits/$d-eps$eps.yaml")
        # exit 1 is a failed audit (its result still printed and kept); anything else is an error
        $DPEVAL audit --defense "$name" --scope run --config "$results/audits/$d-eps$eps.yaml" --json --quiet \
            > "$out.part" || [ $? -eq 1 ]
        mv "$out.part" "$out"
    done
done

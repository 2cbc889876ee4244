#!/usr/bin/env bash
# dpeval's benchmark on Fashion-MNIST (docs/benchmark.md): every defense of configs/benchmark/fashionmnist/ under
# every attack at seed 0 and its utility at seeds 1 and 2 (the same recipe with no attack), a defense's row done
# before the next begins, cheapest first, then the one-run audit of
# each private row (dpeval audit --scope run: the recipe trained once more with 1,000 canaries; one JSON per
# defense and ε under RESULTS/audits), into one results folder; resumable (run it again after an interruption:
# finished points and audits are skipped). Then the page:
#   bench/benchmark.sh [RESULTS [PHASES]]   # default runs/benchmark-fashionmnist, all three phases; one thread per run
#   WORKERS=2 bench/benchmark.sh [RESULTS]  # two runs at a time, one thread each (an attack point's offline twin
#                                           # follows it in the same worker, below)
#   bench/benchmark.sh RESULTS audits       # one phase (attacks, utility or audits) or several ("attacks utility"):
#                                           # the audits write no results folder, so they can run beside the sweeps
#   bench/benchmark.sh RESULTS audits-input # not among the defaults: DP-SGD's one-run audit with black-box input
#                                           # canaries (--canary-kind input) at every ε, under RESULTS/audits-input
#   bench/benchmark.sh RESULTS informed     # not among the defaults: the informed reconstruction game
#                                           # (informed-recon, docs/informed-reconstruction.md) on every private row
#   DEFENSES="dpsgd rs" bench/benchmark.sh RESULTS informed   # only these rows (default: all, cheapest first)
#   python bench/benchmark_page.py --export RESULTS  # docs/benchmark.md, its CSVs and figures
set -euo pipefail
cd "$(dirname "$0")/.."
results=${1:-runs/benchmark-fashionmnist}
phases=${2:-attacks utility audits}
for phase in $phases; do
    case $phase in attacks | utility | audits | audits-input | informed) ;;
        *) echo "unknown phase '$phase' (attacks, utility, audits, audits-input, informed)" >&2; exit 2 ;; esac
done
runs() { [[ " $phases " == *" $1 "* ]]; }
mkdir -p "$results/utility-recipes"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
DPEVAL=${DPEVAL:-dpeval}
WORKERS=${WORKERS:-1}
defenses="${DEFENSES:-none dpsgd rs random-freeze adaclip groupwise-all groupwise-layer gep}"  # cheapest first, GEP last
attacks() {  # the membership and gradient attacks of defense $1, seed 0: a point's offline twin (attack.online
    # false) plays the same game and reuses its 16 shadows from the memory of the worker that trained them, so the
    # sweep runs the twins one after the other in one worker, and different ε side by side
    $DPEVAL sweep "configs/benchmark/fashionmnist/$1.yaml" --results "$results" --workers "$WORKERS" --quiet
}
utility() {  # the utility of defense $1 at two more seeds: the same recipe, no attack
    sed -e 's/^attacks: .*/attacks: []/' -e '/^attack: /d' -e 's/^seeds: .*/seeds: [1, 2]/' \
        "configs/benchmark/fashionmnist/$1.yaml" > "$results/utility-recipes/$1.yaml"
    $DPEVAL sweep "$results/utility-recipes/$1.yaml" --results "$results" --workers "$WORKERS" --quiet
}
informed() {  # the informed reconstruction game on defense $1's private rows at seed 0: the attack sweep's victims
    # (the same recipe and seed train the same model), trained once more with only informed-recon (200 games each)
    [ "$1" = none ] && return 0
    mkdir -p "$results/informed-recipes"
    sed -e 's/^attacks: .*/attacks: [informed-recon]/' -e '/^attack: /d' -e 's/^seeds: .*/seeds: [0]/' \
        "configs/benchmark/fashionmnist/$1.yaml" > "$results/informed-recipes/$1.yaml"
    $DPEVAL sweep "$results/informed-recipes/$1.yaml" --results "$results" --workers "$WORKERS" --quiet
}
audits() {  # the one-run audit of every private row at every ε
    for d in $defenses; do
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
                --save-scores "$results/audits/$d-eps$eps-scores.csv" > "$out.part" || [ $? -eq 1 ]
            mv "$out.part" "$out"
        done
    done
}
audits_input() {  # DP-SGD's one-run audit with black-box input canaries, scored by the final model's loss
    mkdir -p "$results/audits-input"
    for eps in 1.0 3.0 8.0; do
        out="$results/audits-input/dpsgd-eps$eps.json"
        [ -s "$out" ] && continue
        sed -e '/^attacks: /d' -e '/^attack: /d' -e '/^seeds: /d' -e "s/epsilon: \[[^]]*\]/epsilon: $eps/" \
            "configs/benchmark/fashionmnist/dpsgd.yaml" > "$results/audits-input/dpsgd-eps$eps.yaml"
        $DPEVAL audit --defense dpsgd --scope run --canary-kind input --config "$results/audits-input/dpsgd-eps$eps.yaml" \
            --json --quiet --save-scores "$results/audits-input/dpsgd-eps$eps-scores.csv" > "$out.part" || [ $? -eq 1 ]
        mv "$out.part" "$out"
    done
}
for d in $defenses; do  # a defense's row complete (attacks, then utility) before the next, whatever PHASES' order
    if runs attacks; then attacks "$d"; fi
    if runs utility; then utility "$d"; fi
    if runs informed; then informed "$d"; fi
done
if runs audits; then audits; fi
if runs audits-input; then audits_input; fi

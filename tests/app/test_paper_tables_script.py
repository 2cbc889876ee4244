"""bench/paper_tables.py chooses a row's point by the seeds every point ran: after a two-stage grid (every point
at seed 0, the chosen one at seeds 1 and 2 as well), a point run once never wins for having fewer, luckier seeds."""

from tests.helpers import load_bench_script


def test_a_point_is_chosen_by_the_seeds_every_point_ran():
    tables = load_bench_script("paper_tables")
    group = [{"group_key": "a", "utility.test_accuracy": 0.9107}, {"group_key": "b", "utility.test_accuracy": 0.913}]
    per_seed = {"a": {0: 0.914, 1: 0.909, 2: 0.909}, "b": {0: 0.913}}
    scores = {r["group_key"]: tables.choice_score(r, group, per_seed) for r in group}
    assert scores == {"a": 0.914, "b": 0.913}  # seed 0 decides: a, though b's one-seed mean is higher
    assert max(group, key=lambda r: tables.choice_score(r, group, per_seed))["group_key"] == "a"
    every_seed = {"a": {0: 0.90, 1: 0.92}, "b": {0: 0.91, 1: 0.90}}
    assert tables.choice_score(group[0], group, every_seed) == 0.91  # all shared seeds averaged

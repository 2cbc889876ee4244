"""The terminal view of an audit result: both numbers, the verdict, and one line per test."""

from __future__ import annotations

from typing import Any


def format_audit(result: dict[str, Any]) -> str:
    """The terminal view: both numbers, the verdict, and one line per test."""
    r = result
    head = (f"audit of {r['defense']} ({r['dataset']} / {r['model']}, seed {r['seed']}): "
            f"{r['privacy.steps']} step(s) at sample rate 1, "
            f"accounted σ = {r['privacy.accounted_noise_multiplier']:.4g} "
            f"(the defense adds σ = {r['privacy.noise_multiplier']:.4g})")
    numbers = (f"  ε_LB = {r['audit.epsilon_lower_bound']:.3f}   ε = {r['privacy.epsilon']:.3f}   "
               f"δ = {r['privacy.delta']:.3g}   ({r['privacy.accountant']} accountant, "
               f"{r['audit.confidence']:.0%} confidence)")
    trials = (f"  statistic {r['audit.statistic']}; accountant's Gaussian μ = √T/σ = {r['privacy.mu']:.3f}; "
              f"{r['audit.trials']} trials per neighbour "
              f"(up to {r['audit.canaries']} canaries per release); {r['time.audit_s']:.1f} s")
    lines = [head, numbers, trials]
    for t in r["audit.tests"]:
        lines.append(f"    {t['name']:<22} ε_LB {t['epsilon_lower_bound']:.3f}  TPR {t['tpr']:.4f} "
                     f"[{t['tpr_ci'][0]:.4f}, {t['tpr_ci'][1]:.4f}]  FPR {t['fpr']:.4f} "
                     f"[{t['fpr_ci'][0]:.4f}, {t['fpr_ci'][1]:.4f}]  μ̂ {t['separation']:.3f}  "
                     f"({t['canaries']} canaries × {t['releases']} releases)")
    for variant in r["audit.skipped"]:
        lines.append(f"    {variant + '/*':<22} skipped: no such coordinates at an audited step")
    if r["audit.passed"]:
        lines.append("  PASS: ε_LB ≤ ε")
    else:
        lines.append("  FAIL: ε_LB > ε: the release leaks more than the accountant's ε allows")
    return "\n".join(lines)


def format_run_audit(result: dict[str, Any]) -> str:
    """The terminal view of a whole-run audit: the headline bound and its estimator, every estimator's bound
    (valid or refused, and why), the counting bound's guesses, the canary design and the best guessing rule of
    each statistic."""
    r = result
    mu = r.get("audit.mu_lower_bound")
    lines = [
        f"one-run audit of {r['defense']} ({r['dataset']} / {r['model']}, seed {r['seed']}): {r['privacy.steps']} "
        f"steps at sample rate {r['privacy.sample_rate']:.4g} ({r['privacy.sampling']} sampling), "
        f"σ = {r['privacy.noise_multiplier']:.4g}",
        f"  ε_LB = {r['audit.epsilon_lower_bound']:.3f}   ε = {r['privacy.epsilon']:.3f}   δ = {r['privacy.delta']:.3g}"
        f"   (the run's {r['privacy.accountant']} accountant; {r['audit.confidence']:.0%} confidence; "
        f"estimator {r['audit.estimator']}" + (f", μ_LB = {mu:.3f}" if mu is not None else "") + ")",
    ]
    for name, b in r["audit.bounds"].items():
        how = (f"{b['correct']}/{b['guesses_in'] + b['guesses_out']} correct, statistic {b['statistic']}"
               if name != "gaussian-pair" else f"every score of statistic {b['statistic']}")
        mu_text = f"μ_LB {b['mu_lower_bound']:.3f}  " if b["mu_lower_bound"] is not None else ""
        state = "" if b["valid"] else f"  — refused: {b['refused']}"
        lines.append(f"    {name:<14} ε_LB {b['epsilon_lower_bound']:.3f}  {mu_text}({how}; "
                     f"{b['confidence']:.1%}){state}")
        lines.append(f"    {'':<14} assumes: {b['assumption']}")
    lines += [
        f"  counting guesses: statistic {r['audit.statistic']}, {r['audit.correct']} correct of {r['audit.guesses']} "
        f"guesses ({r['audit.guesses_in']} \"in\", {r['audit.guesses_out']} \"out\", "
        f"{r['audit.canaries'] - r['audit.guesses']} abstentions); "
        f"{r['audit.canaries_included']} of {r['audit.canaries']} canaries included",
        f"  canaries: {r['audit.canary_design']}",
        f"  test accuracy {r['utility.test_accuracy']:.4f}; {r['time.audit_s']:.1f} s",
    ]
    best: dict[str, dict[str, Any]] = {}
    for t in r["audit.tests"]:
        if t["estimator"] != "counting":
            continue
        if t["statistic"] not in best or t["epsilon_lower_bound"] > best[t["statistic"]]["epsilon_lower_bound"]:
            best[t["statistic"]] = t
    for name, t in best.items():
        lines.append(f"    {name:<10} ε_LB {t['epsilon_lower_bound']:.3f}  {t['correct']}/{t['guesses']} correct "
                     f"(k+ = {t['k_in']}, k− = {t['k_out']}; counting)")
    if r["audit.passed"]:
        lines.append("  PASS: ε_LB ≤ ε")
    else:
        lines.append("  FAIL: ε_LB > ε: the run leaks more than its accounted ε allows")
    return "\n".join(lines)


def format_model_audit(result: dict[str, Any]) -> str:
    """The terminal view of a final-model audit: the headline and its estimator, the game (models, θ₀, target,
    sampling), one line per statistic × estimator test, the verdict."""
    r = result
    s, init, target = r["audit.sampling"], r["audit.init"], r["audit.target"]
    init_text = init["kind"] + (f" ({init['epochs']} epochs {init['optimizer']} lr {init['lr']:g} batch "
                                f"{init['batch_size']} on the {init['records']}-record public split; test accuracy "
                                f"{init['test_accuracy']:.3f})" if init["kind"] == "crafted" else
                                f" ({init['path']})" if init["kind"] == "file" else "")
    target_text = target["kind"] + (f" #{target['index']}" if target["kind"] == "index" else
                                    f" ({target['path']})" if target["kind"] == "file" else "")
    lines = [
        f"final-model audit of {r['defense']} ({r['dataset']} / {r['model']}, seed {r['seed']}): {r['audit.models']} "
        f"models ({r['audit.models_with_target']} with the target), {s['steps']} steps at sample rate "
        f"{s['sample_rate']:.4g} ({s['mode']} sampling), σ = {r['privacy.noise_multiplier']:.4g}",
        f"  ε_LB = {r['audit.epsilon_lower_bound']:.3f}   ε = {r['privacy.epsilon']:.3f}   δ = {r['privacy.delta']:.3g}"
        f"   ({r['privacy.accountant']} accountant at q = {s['sample_rate']:.4g}, T = {s['steps']}; "
        f"{r['audit.confidence']:.0%} confidence; estimator {r['audit.estimator']}, statistic {r['audit.statistic']})",
        f"  μ_LB = {r['audit.mu_lower_bound']:.3f}   μ̂ = {r['audit.mu_hat']:.3f} "
        f"[{r['audit.mu_hat_ci'][0]:.3f}, {r['audit.mu_hat_ci'][1]:.3f}]   (gdp, statistic {r['audit.mu_statistic']})",
        f"  θ₀ {init_text}; target {target_text}, label {target['label']}; release ÷ {s['release_divides_by']}, "
        f"{s['optimizer']} lr {s['effective_lr']:.4g} ({s['gradient']}); thresholds chosen on models "
        f"[0, {r['audit.models'] // 2}), judged on the rest; {r['time.audit_s']:.1f} s",
    ]
    for t in r["audit.tests"]:
        mu = f"  μ_LB {t['mu_lower_bound']:.3f}" if t["mu_lower_bound"] is not None else ""
        lines.append(f"    {t['statistic'] + '/' + t['estimator']:<27} ε_LB {t['epsilon_lower_bound']:.3f}{mu}  "
                     f"TPR {t['tpr']:.3f} [{t['tpr_ci'][0]:.3f}, {t['tpr_ci'][1]:.3f}]  FPR {t['fpr']:.3f} "
                     f"[{t['fpr_ci'][0]:.3f}, {t['fpr_ci'][1]:.3f}]  threshold {t['threshold']:.4g}  "
                     f"({t['confidence']:.2%})")
    if "audit.anchor_reading" in r:
        readings = ", ".join(f"{name} ε {a['epsilon']:.2f} (μ {a['mu']:.2f})"
                             for name, a in r["audit.anchor_reading"].items())
        lines.append(f"  for comparison only, the anchor's reading (threshold chosen on all {r['audit.models']} "
                     f"models, the scores it is judged on; not a bound): {readings}")
    if r["audit.passed"]:
        lines.append("  PASS: ε_LB ≤ ε")
    else:
        lines.append("  FAIL: ε_LB > ε: the final model leaks more than its accounted ε allows")
    return "\n".join(lines)

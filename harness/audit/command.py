"""``dpeval audit``: which scope's audit the flags ask for, the flags each scope refuses, and one line for whatever
stops an audit once it has started. The command line itself (flags, exit codes, printing) is ``dpeval.cli``."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpeval.core.errors import ConfigError, RunFailure, printable


@dataclass(frozen=True)
class AuditFlags:
    """The scope-specific flags of ``dpeval audit`` as given (None: not given)."""

    trials: int | None = None
    noise_multiplier: float | None = None
    steps: int | None = None
    canaries: int | None = None
    canary_kind: str | None = None
    save_scores: str | None = None
    models: int | None = None
    init: str | None = None
    target: str | None = None
    sampling: str | None = None
    training: str | None = None
    keep_models: str | None = None


def audit_scope(scope: str, raw: dict[str, Any], flags: AuditFlags, progress: bool) -> tuple[dict[str, Any], str]:
    """Run the audit of ``scope`` (release, run or model) on the configuration ``raw``: its result keys and its
    printed text. A flag of another scope is a ConfigError naming it, before anything runs."""
    from dpeval.config import build_spec

    f = flags
    if scope != "model":
        for flag, value in (("--models", f.models), ("--init", f.init), ("--target", f.target),
                            ("--sampling", f.sampling), ("--training", f.training), ("--keep-models", f.keep_models)):
            if value is not None:
                raise ConfigError(f"{flag}: only with --scope model")
    if scope == "model":
        from dpeval.audit.format import format_model_audit
        from dpeval.audit.model import ModelAuditOptions, run_model_audit

        for flag, value in (("--trials", f.trials), ("--noise-multiplier", f.noise_multiplier), ("--steps", f.steps),
                            ("--canaries", f.canaries), ("--canary-kind", f.canary_kind),
                            ("--save-scores", f.save_scores)):
            if value is not None:
                raise ConfigError(f"{flag}: not with --scope model (it trains --models models; set σ or ε with "
                                  "--set privacy.…, the steps with --set train.epochs=…)")
        spec = build_spec(raw)
        given = {k: v for k, v in (("models", f.models), ("init", f.init), ("target", f.target),
                                   ("sampling", f.sampling), ("training", f.training),
                                   ("keep", f.keep_models and Path(f.keep_models))) if v is not None}
        options = ModelAuditOptions(**given, progress=progress)
        options.validate()
        with audit_failures(spec.defense_name):
            result = run_model_audit(spec, options)
        return result, format_model_audit(result)
    if scope == "run":
        from dpeval.audit.format import format_run_audit
        from dpeval.audit.run import RunAuditOptions, run_scope_audit

        for flag, value in (("--trials", f.trials), ("--noise-multiplier", f.noise_multiplier), ("--steps", f.steps)):
            if value is not None:
                raise ConfigError(f"{flag}: only with --scope release (the run scope audits the configured run: "
                                  "set its σ or ε with --set privacy.…)")
        spec = build_spec(raw)
        chosen = {k: v for k, v in (("canaries", f.canaries), ("kind", f.canary_kind),
                                    ("scores_path", f.save_scores and Path(f.save_scores))) if v is not None}
        with audit_failures(spec.defense_name):
            result = run_scope_audit(spec, RunAuditOptions(**chosen, progress=progress))
        return result, format_run_audit(result)
    from dpeval.audit.driver import AuditOptions, run_audit
    from dpeval.audit.format import format_audit

    for flag, value in (("--canary-kind", f.canary_kind), ("--save-scores", f.save_scores)):
        if value is not None:
            raise ConfigError(f"{flag}: only with --scope run")
    privacy = raw.get("privacy")
    for key in ("epsilon", "noise_multiplier"):
        if isinstance(privacy, dict) and key in privacy:
            raise ConfigError(f"privacy.{key}: the audit runs at a fixed σ; use --noise-multiplier")
    spec = build_spec(raw)
    fixed = {"trials": f.trials, "noise_multiplier": f.noise_multiplier, "steps": f.steps, "canaries": f.canaries}
    with audit_failures(spec.defense_name):
        result = run_audit(spec, AuditOptions(**{k: v for k, v in fixed.items() if v is not None}, progress=progress))
    return result, format_audit(result)


@contextmanager
def audit_failures(defense: str) -> Iterator[None]:
    """Whatever stops an audit once it has started — the defense's own code raising (a plug-in's bug), a release
    of NaN, training that diverges in the run scope — is one line and exit 1 (RunFailure), never a traceback;
    bad input stays exit 2 (ConfigError)."""
    try:
        yield
    except (ConfigError, RunFailure):
        raise
    except Exception as exc:
        said = printable(" ".join(str(exc).split()), 300)
        raise RunFailure(f"audit of {defense} failed: {type(exc).__name__}: {said}") from exc

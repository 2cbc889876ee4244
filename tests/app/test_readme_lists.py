"""The README's lists name everything ``dpeval list`` shows."""

import re
from pathlib import Path

from dpeval.core.registry import MODELS

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_model_list_names_every_built_in_model():
    text = README.read_text()
    models = re.search(r"^- \*\*Models\*\*(.*?)^- \*\*", text, re.S | re.M)
    assert models, "README: no '- **Models**' bullet"
    named = set(re.findall(r"`([a-z0-9-]+)`", models.group(1)))
    builtin = {n for n in MODELS.names() if MODELS.declared()[n].module.startswith("dpeval.")}
    assert builtin - named == set(), f"README's model list lacks {sorted(builtin - named)}"

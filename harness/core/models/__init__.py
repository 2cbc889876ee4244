"""Model zoo, registered by name (one module per family; the next commit splits ``zoo``)."""

from harness.core.models.zoo import DEFAULT_MODELS, Normalize, SelfAttention, build_model, num_params

__all__ = ["DEFAULT_MODELS", "Normalize", "SelfAttention", "build_model", "num_params"]

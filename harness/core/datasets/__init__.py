"""Dataset loaders, registered by name (one module per family; the next commit splits ``loaders``)."""

from harness.core.datasets.loaders import SYSTEM_FOLDERS, load_task, read_idx, validate_data_config

__all__ = ["SYSTEM_FOLDERS", "load_task", "read_idx", "validate_data_config"]

import os
import tempfile

import pytest
import torch

from dpeval.core.datasets import packaged

# The data sets `dpeval data install` put in this machine's data folder, for the real-data tests (tests/helpers.py);
# every other test, and every command a test starts, sees an empty data folder instead, so that a test of what a
# missing data set says does not find the machine's copy.
REAL_DATA_HOME = packaged.data_home()
os.environ["DPEVAL_DATA"] = tempfile.mkdtemp(prefix="dpeval-test-data-")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def real_data_home(monkeypatch):
    """This machine's data folder, for a test that reads the installed MNIST or CIFAR-10 (tests/helpers.py:
    ``needs_mnist``, ``needs_cifar10``)."""
    monkeypatch.setenv("DPEVAL_DATA", str(REAL_DATA_HOME))
    return REAL_DATA_HOME

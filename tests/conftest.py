import os
import tempfile
from pathlib import Path

import pytest
import torch

from dpeval.core.datasets import packaged

# The data sets `dpeval data install` put in this machine's data folder, for the real-data tests (tests/helpers.py);
# every other test, and every command a test starts, sees an empty data folder instead, so that a test of what a
# missing data set says does not find the machine's copy.
# The machine's folder is read once, by the first process (pytest-xdist's workers inherit it through the environment:
# by the time they start, DPEVAL_DATA already names the controller's empty folder).
os.environ.setdefault("DPEVAL_TEST_REAL_DATA", str(packaged.data_home()))
REAL_DATA_HOME = Path(os.environ["DPEVAL_TEST_REAL_DATA"])
os.environ["DPEVAL_DATA"] = tempfile.mkdtemp(prefix="dpeval-test-data-")

# The suite runs in parallel (pytest-xdist, one worker per core: `make test`); each worker and every command a
# test starts uses one torch thread, so workers do not oversubscribe the cores (a test's own choice, or the
# user's OMP_NUM_THREADS, still wins).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]) if os.environ["OMP_NUM_THREADS"].isdigit() else 1)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def real_data_home(monkeypatch):
    """This machine's data folder, for a test that reads the installed MNIST or CIFAR-10 (tests/helpers.py:
    ``needs_mnist``, ``needs_cifar10``)."""
    monkeypatch.setenv("DPEVAL_DATA", str(REAL_DATA_HOME))
    return REAL_DATA_HOME


def pytest_collection_modifyitems(items):
    """The slow tests first (a stable sort: each group keeps its order). `make test` has pytest-xdist hand the tests
    out in this order one at a time to whichever worker is free (``--maxschedchunk 1``), so the longest ones start
    early, on every worker, and the short ones fill in around them. (By default xdist first gives each worker a
    quarter of its share in one consecutive block: the first worker would get every slow test.)"""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)

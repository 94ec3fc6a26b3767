"""Shared fixtures: the path of the measured data in ../shared/data (beside the checkout, also in CI)."""
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """Directory of the shared measured data sets (nccl-tests logs, runs CSV, traces)."""
    if not SHARED_DATA.is_dir():
        pytest.fail(f"shared data not found at {SHARED_DATA}; clone flowsim next to the shared/ folder")
    return SHARED_DATA

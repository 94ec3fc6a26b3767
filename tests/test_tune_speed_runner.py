"""run_configs leaves the caller's objects out of the garbage collector's walks while it runs (gc.freeze), and the
collector as it found it afterwards."""
import gc

import pytest

import flowsim
from flowsim.explore import runner

CFG = dict(model="llama3-8b", cluster="dgx-h100", gpus=8, tp=8, gbs=8)


@pytest.fixture
def frozen_during(monkeypatch):
    seen = []

    def evaluate(batch, *args):
        seen.append(gc.get_freeze_count())
        return [runner.Outcome(i, "memory", f"k{i}", memory_bytes=1.0) for i, _ in batch]

    monkeypatch.setattr(runner, "evaluate", evaluate)
    return seen


def test_the_heap_is_frozen_while_configs_run_and_thawed_after(frozen_during):
    assert gc.get_freeze_count() == 0
    report = runner.run_configs([flowsim.build_config(**CFG)] * 3, jobs=1, progress=False)
    assert report.memory_pruned == 3 and frozen_during and all(n > 1000 for n in frozen_during)
    assert gc.get_freeze_count() == 0


def test_a_heap_frozen_by_the_caller_stays_frozen(frozen_during):
    gc.freeze()
    try:
        before = gc.get_freeze_count()
        runner.run_configs([flowsim.build_config(**CFG)], jobs=1, progress=False)
        assert gc.get_freeze_count() == before and frozen_during == [before]
    finally:
        gc.unfreeze()

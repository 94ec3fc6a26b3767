"""The flow engine's threads (flowsim.network.parallel): the same answers on any number of threads."""
import threading

import pytest

import flowsim
from flowsim.config import build_config
from flowsim.network import parallel
from flowsim.network.lru import BytesLRU

# one NIC per 4-GPU node: the reduction, the gather and the all-to-alls of each stage share the NICs
# (tests/test_cross_kind.py)
MIXTRAL = dict(model="mixtral-8x7b", cluster="dgx-h100", gpus=32, gpus_per_node=4, nics_per_node=1, pp=2, ep=8,
               gbs=32, seq=4096, moe_imbalance_factor=1.0, comm_engine="flow")


@pytest.fixture
def two_threads(monkeypatch):
    monkeypatch.setattr(parallel, "THREADS", 2)


def test_map_ordered_keeps_the_order_and_runs_nested_calls_in_the_worker(two_threads):
    def inner(x):
        # from a thread of the pool: one thread, so the work runs here, not queued behind the caller
        assert parallel.threads() == 1
        return [threading.current_thread().name] + parallel.map_ordered(lambda y: y * x, [1, 2, 3])

    got = parallel.map_ordered(inner, [1, 2, 3, 4])
    assert [g[1:] for g in got] == [[1, 2, 3], [2, 4, 6], [3, 6, 9], [4, 8, 12]]
    assert all(g[0].startswith("flowsim-netsim") for g in got)
    assert parallel.threads() == 2


def test_map_ordered_raises_the_first_error(two_threads):
    def f(x):
        if x >= 2:
            raise ValueError(f"bad {x}")
        return x

    with pytest.raises(ValueError, match="bad 2"):
        parallel.map_ordered(f, [0, 1, 2, 3])


def test_one_thread_runs_in_the_caller(monkeypatch):
    monkeypatch.setattr(parallel, "THREADS", 1)
    assert parallel.map_ordered(lambda x: threading.current_thread().name, [0, 1]) == [
        threading.current_thread().name] * 2


@pytest.mark.parametrize("extra", [dict(distributed_optimizer=True, overlap_param_gather=True), dict(zero_stage=3)])
def test_step_on_two_threads_equals_one_thread(monkeypatch, extra):
    # the stages' cross-kind windows (reduction and gather; ZeRO-3's layer windows) simulated at once give the
    # same step, bit for bit, as one after another, the report of calls included
    from flowsim.step import flows as step_flows

    results = []
    for n in (1, 2):
        monkeypatch.setattr(parallel, "THREADS", n)
        step_flows._flow.cache_clear()
        step_flows._together_s.cache_clear()
        results.append(flowsim.simulate(build_config(**MIXTRAL, **extra)).to_dict())
    assert results[0] == results[1]


def test_bytes_lru_stays_consistent_under_threads():
    cache = BytesLRU(1000)
    barrier = threading.Barrier(4)

    def hammer(seed):
        barrier.wait()
        for i in range(3000):
            k = (seed * 7919 + i * 104729) % 50
            if cache.get(k) is None:
                cache.put(k, k, 10 + k)

    threads = [threading.Thread(target=hammer, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert cache.bytes == sum(n for _, n in cache.items.values()) <= 1000
    assert all(v == k for k, (v, _) in cache.items.items())

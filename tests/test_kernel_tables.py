"""The kernel tables read with the csv module (flowsim.kernels.tables) hold what pandas' read_csv reads, cell for
cell and bit for bit, so the estimate path can price steps without importing pandas."""
import numpy as np
import pandas as pd
import pytest

from flowsim.errors import ConfigError
from flowsim.kernels.stack import RELEASES_FILE
from flowsim.kernels.tables import DATA_DIR, TABLES, Table, read_measurement_csv, table


def _same_column(ours: np.ndarray, theirs: pd.Series) -> None:
    assert ours.dtype.kind == theirs.dtype.kind, (theirs.name, ours.dtype, theirs.dtype)
    if ours.dtype.kind == "f":
        ref = theirs.to_numpy(dtype=np.float64)
        assert np.array_equal(np.isnan(ours), np.isnan(ref))
        assert np.array_equal(ours.view(np.int64)[~np.isnan(ours)], ref.view(np.int64)[~np.isnan(ref)]), theirs.name
    elif ours.dtype.kind == "O":
        ref = theirs.to_numpy(dtype=object)
        assert [type(v) for v in ours] == [type(v) for v in ref], theirs.name
        assert all(a == b or (a != a and b != b) for a, b in zip(ours, ref)), theirs.name
    else:
        assert np.array_equal(ours, theirs.to_numpy()), theirs.name


@pytest.mark.parametrize("path", [DATA_DIR / f"{n}.csv" for n in TABLES] + [DATA_DIR / RELEASES_FILE],
                         ids=lambda p: p.name)
def test_every_cell_as_pandas_reads_it(path):
    ours = read_measurement_csv(path)
    theirs = pd.read_csv(path, keep_default_na=False, na_values=[""])
    assert list(ours.columns) == list(theirs.columns) and len(ours) == len(theirs)
    for col in theirs.columns:
        _same_column(ours[col], theirs[col])


def test_column_types_follow_pandas(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("i,f,mixed,gap,text,flag,none,source\n"
                    "1,1.5,2,,a,True,,s\n"
                    "-3,2e3,2.25,7,,false,,s\n"
                    "+4, 0.1 ,1e-7,8,\"c, d\",TRUE,,s\n")
    ours = read_measurement_csv(path)
    theirs = pd.read_csv(path, keep_default_na=False, na_values=[""])
    for col in theirs.columns:
        _same_column(ours[col], theirs[col])
    assert ours["text"][2] == "c, d"


def test_table_views():
    t = table("gemm_latency")
    assert isinstance(t, Table) and len(t) == len(t.frame())
    sub = t[t["gpu"] == "h200"]
    assert len(sub) == 1 and sub.gpu[0] == "h200" and sub["time_us"][0] == 4.384
    with pytest.raises(ValueError):
        t["gpu"][0] = "x"  # shared between callers: read-only
    with pytest.raises(ConfigError, match="table: must be one of"):
        table("nosuch")

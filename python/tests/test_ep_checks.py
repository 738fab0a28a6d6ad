"""The decisions of expert parallelism's collective checks (moeblaze._ep_checks) on host
values, without processes: which layout value differs, which error a rank raises after the
counts exchange, the status column, and that ids outside [0, E) travel nowhere.
test_ep_gloo.py runs the same checks over gloo between processes."""
import pytest

torch = pytest.importorskip("torch")

from moeblaze import InvalidArgument  # noqa: E402
from moeblaze._dispatch import leave_out_bad_ids, plan_dispatch  # noqa: E402
from moeblaze._ep_checks import (STATUS_ARGUMENTS, counts_with_status, layout_mismatch, layout_values,  # noqa: E402
                                 status_error, status_of_error)

EXCHANGES = ("all_to_all", "symm_mem")


def test_layout_values_read_what_the_exchanges_depend_on():
    x, ids, w1 = torch.zeros(5, 16), torch.zeros(5, 3, dtype=torch.int32), torch.zeros(4, 8, 16)
    assert layout_values(x, ids, w1, 8, 2, 0) == (8, 4, 3, 2, 16, 0)
    # malformed arguments still give a value (-1), so that every rank can take part
    assert layout_values(x, torch.zeros(5), None, "8", True, -1) == (-1, -1, -1, -1, 16, -1)


def test_agreeing_layouts_raise_nothing():
    row = (8, 4, 3, 1, 16, 0)
    assert layout_mismatch([row, row, row], EXCHANGES) is None


@pytest.mark.parametrize("column,argument", [(0, "num_experts"), (1, "w1"), (2, "topk_ids"), (3, "chunks"),
                                             (4, "x"), (5, "exchange")])
def test_a_differing_layout_value_is_named_with_every_ranks_value(column, argument):
    rows = [[8, 4, 3, 1, 16, 0] for _ in range(3)]
    rows[2][column] = 1 if column == 5 else 99
    err = layout_mismatch(rows, EXCHANGES)
    assert isinstance(err, InvalidArgument) and err.argument == argument
    msg = str(err)
    assert "disagree" in msg and "rank 0" in msg and "rank 2" in msg
    assert ("'symm_mem'" if column == 5 else "99") in msg


def test_the_first_differing_value_is_named():
    err = layout_mismatch([[8, 4, 3, 1, 16, 0], [16, 8, 2, 1, 16, 0]], EXCHANGES)
    assert err.argument == "num_experts" and "rank 0: 8, rank 1: 16" in str(err)


def test_status_codes_round_trip_every_argument_name():
    for i, name in enumerate(STATUS_ARGUMENTS):
        code = status_of_error(InvalidArgument(name, f"{name}: bad"))
        assert code == -(1 + i)
        err = status_error([0, code], 0, 8, 10, None)
        assert err.argument == name and "rank 1" in str(err)
    assert status_of_error(InvalidArgument("something_else", "bad")) == -1  # reported as x


def test_status_error_picks_what_each_rank_raises():
    own = InvalidArgument("topk_weights", "topk_weights: has shape [4, 2], expected [5, 2]")
    assert status_error([0, 0], 0, 8, 10, None) is None
    assert status_error([0, status_of_error(own)], 1, 8, 10, own) is own  # the rank at fault: its own error
    err = status_error([3, 0], 0, 8, 10, None)  # this rank's bad ids
    assert err.argument == "topk_ids" and "3 of 10 expert ids are outside [0, 8)" in str(err)
    err = status_error([0, 2], 0, 8, 10, None)  # another rank's
    assert err.argument == "topk_ids" and "rank 1" in str(err) and "2 expert ids" in str(err)


def test_counts_with_status_carries_the_bad_id_count_to_every_rank():
    ids = torch.tensor([[0, 5], [8, 3], [-1, 7]], dtype=torch.int32)  # two of six ids outside [0, 8)
    plan = plan_dispatch(ids, 8, 2)
    out = counts_with_status(plan, None, 2, 4, torch.device("cpu"))
    assert out.shape == (2, 5)
    assert torch.equal(out[:, :4], plan.send_counts)
    assert out[:, 4].tolist() == [2, 2]  # the same status in the row for each destination
    own = InvalidArgument("x", "x: bad")
    out = counts_with_status(None, own, 2, 4, torch.device("cpu"))
    assert out[:, :4].abs().sum() == 0 and out[:, 4].tolist() == [status_of_error(own)] * 2


def test_ids_outside_the_experts_sort_after_every_counted_slot():
    ids = torch.tensor([[-1, 3], [6, 9], [1, -7], [2**31 - 1, 0]], dtype=torch.int32)
    for chunks in (1, 2):
        plan = plan_dispatch(ids, 8, 2, chunks)
        counted = int(plan.send_counts.sum())
        assert counted == 4
        bad_slots = {0, 3, 5, 6}
        assert set(plan.order[counted:].tolist()) == bad_slots  # the rows that do not travel
        assert not bad_slots & set(plan.order[:counted].tolist())


def test_leave_out_bad_ids_for_the_exchange_without_host_sync():
    ids = torch.tensor([[0, 9], [-1, 3]], dtype=torch.int32)
    w = torch.tensor([[0.5, 0.25], [0.125, 0.75]], requires_grad=True)
    new_ids, new_w = leave_out_bad_ids(ids, w, 8, stand_in=4)
    assert new_ids.tolist() == [[0, 4], [4, 3]]
    assert new_w.tolist() == [[0.5, 0.0], [0.0, 0.75]]
    new_w.sum().backward()
    assert w.grad.tolist() == [[1.0, 0.0], [0.0, 1.0]]  # the left-out gates get no gradient

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

ROW = (8, 4, 3, 1, 16, 0, 0, 2)  # E, experts on the rank, K, chunks, d, all_to_all, bf16 x, f32 gates


def test_layout_values_read_what_the_exchanges_depend_on():
    x, ids, w1 = torch.zeros(5, 16, dtype=torch.bfloat16), torch.zeros(5, 3, dtype=torch.int32), torch.zeros(4, 8, 16)
    assert layout_values(x, ids, torch.zeros(5, 3), w1, 8, 1, "all_to_all") == ROW
    assert layout_values(x, ids, torch.zeros(5, 3, dtype=torch.int8), w1, 8, 1, "symm_mem")[5:] == (1, 0, 4)
    # malformed arguments still give a value, so that every rank can take part
    assert layout_values(x, torch.zeros(5), None, None, "8", True, "nvlink") == (-1, -1, -1, -1, 16, 2, 0, -1)


def test_agreeing_layouts_raise_nothing():
    assert layout_mismatch([ROW, ROW, ROW]) is None


@pytest.mark.parametrize("column,argument,shown", [
    (0, "num_experts", "99"), (1, "w1", "99"), (2, "topk_ids", "99"), (3, "chunks", "99"), (4, "x", "99"),
    (5, "exchange", "symm_mem"), (6, "x", "float16"), (7, "topk_weights", "another")])
def test_a_differing_layout_value_is_named_with_every_ranks_value(column, argument, shown):
    rows = [list(ROW) for _ in range(3)]
    rows[2][column] = {5: 1, 6: 1, 7: 4}.get(column, 99)
    err = layout_mismatch(rows)
    assert isinstance(err, InvalidArgument) and err.argument == argument
    msg = str(err)
    assert "disagree" in msg and "rank 0" in msg and f"rank 2: {shown}" in msg, msg


def test_the_first_differing_value_is_named():
    err = layout_mismatch([ROW, (16, 8, 2) + ROW[3:]])
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

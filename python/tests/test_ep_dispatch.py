"""Expert-parallel dispatch bookkeeping on the CPU (no process group): send order, counts,
split sizes, the permutation and its inverse, the received expert ids, the fixed combine
order, and a simulated all-to-all over several ranks that checks where every row lands."""
import pytest

torch = pytest.importorskip("torch")

from moeblaze import InvalidArgument  # noqa: E402
from moeblaze._dispatch import (chunk_counts, check_layout, gather_sum, host_splits, padded_expert_ids,  # noqa: E402
                                plan_dispatch, received_expert_ids, scatter_slots, sent_bytes)


def random_ids(T, K, E, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)]).int()


def test_worked_example():
    # E = 4 over 2 ranks (experts 0,1 on rank 0; 2,3 on rank 1), K = 2, 5 tokens
    ids = torch.tensor([[2, 3], [0, 1], [0, 3], [1, 2], [0, 3]], dtype=torch.int32)
    p = plan_dispatch(ids, 4, 2, chunks=1)
    # slots sorted by expert, (token, k) order inside: e0 {2,4,8} e1 {3,6} e2 {0,7} e3 {1,5,9}
    assert p.order.tolist() == [2, 4, 8, 3, 6, 0, 7, 1, 5, 9]
    assert p.send_tokens().tolist() == [1, 2, 4, 1, 3, 0, 3, 0, 2, 4]
    assert p.send_counts.tolist() == [[3, 2], [2, 3]]
    assert p.position.tolist() == [[5, 7], [0, 3], [1, 8], [4, 6], [2, 9]]
    # two chunks of one local expert each: chunk 0 = experts {0, 2}, chunk 1 = {1, 3}
    p2 = plan_dispatch(ids, 4, 2, chunks=2)
    assert p2.order.tolist() == [2, 4, 8, 0, 7, 3, 6, 1, 5, 9]
    assert p2.send_counts.tolist() == [[3, 2], [2, 3]]
    assert chunk_counts(p2.send_counts, 2).tolist() == [[3, 2], [2, 3]]


@pytest.mark.parametrize("W,E,K,chunks", [(1, 8, 2, 1), (2, 8, 2, 2), (4, 16, 4, 2), (2, 6, 3, 3)])
def test_order_is_a_stable_sort_and_position_its_inverse(W, E, K, chunks):
    T = 37
    ids = random_ids(T, K, E, seed=W * 100 + E)
    p = plan_dispatch(ids, E, W, chunks)
    S = T * K
    assert sorted(p.order.tolist()) == list(range(S))
    assert torch.equal(p.order[p.position.reshape(-1)], torch.arange(S))
    local, per_chunk = E // W, E // W // chunks
    e = ids.reshape(-1).long()[p.order]
    key = ((e % local) // per_chunk) * E + e
    assert bool((key[1:] >= key[:-1]).all())
    same = key[1:] == key[:-1]
    assert bool((p.order[1:][same] > p.order[:-1][same]).all())  # (token, k) order inside an expert
    assert torch.equal(p.send_counts.reshape(-1), torch.bincount(ids.reshape(-1).long(), minlength=E))


def test_host_splits_and_bad_ids():
    ids = random_ids(20, 2, 8, seed=3)
    p = plan_dispatch(ids, 8, 2, chunks=2)
    s = host_splits(p.send_counts, p.send_counts.flip(0), 2, p.slots)
    cc = chunk_counts(p.send_counts, 2)
    assert s.send == cc.tolist() and s.recv == chunk_counts(p.send_counts.flip(0), 2).tolist()
    assert s.send_range(0) == (0, sum(s.send[0])) and s.send_range(1) == (sum(s.send[0]), 40)
    assert sent_bytes(s, 0, 10) == 10 * (s.send[0][1] + s.send[1][1])
    bad = ids.clone()
    bad[3, 1] = 8
    pb = plan_dispatch(bad, 8, 2)
    with pytest.raises(InvalidArgument) as e:
        host_splits(pb.send_counts, pb.send_counts, 1, pb.slots)
    assert e.value.argument == "topk_ids" and "1 of 40" in str(e.value)


def test_layout_errors_name_the_argument():
    for args, name in (((7, 2, 1), "num_experts"), ((8, 2, 3), "chunks"), ((8, 0, 1), "world")):
        with pytest.raises(InvalidArgument) as e:
            check_layout(*args)
        assert e.value.argument == name
    with pytest.raises(InvalidArgument) as e:
        plan_dispatch(torch.zeros(4, 2), 8, 2)
    assert e.value.argument == "topk_ids"


def test_gather_sum_adds_in_k_order_once_rounded():
    # float32: 1e8 + 1 rounds back to 1e8, so only the j order 0, 1, 2 gives 0 here
    rows = torch.tensor([[1e8], [1.0], [-1e8]], dtype=torch.float32)
    assert gather_sum(rows, torch.tensor([[0, 1, 2]]), torch.float32).item() == 0.0
    assert gather_sum(rows, torch.tensor([[0, 2, 1]]), torch.float32).item() == 1.0
    # bf16 rows: accumulated in float32 and rounded once (adding in bf16, 1 + 2^-8 would round
    # back to 1 twice)
    r = torch.tensor([[1.0], [2 ** -8], [2 ** -8]], dtype=torch.bfloat16)
    assert gather_sum(r, torch.tensor([[0, 1, 2]]), torch.bfloat16).item() == 1.0 + 2 ** -7
    assert gather_sum(r, torch.tensor([[0, 1, 2]]), torch.bfloat16).dtype == torch.bfloat16
    assert gather_sum(rows, torch.zeros(0, 3, dtype=torch.long), torch.float32).shape == (0, 1)


def test_scatter_slots_inverts_the_send_order():
    ids = random_ids(9, 3, 6, seed=5)
    p = plan_dispatch(ids, 6, 3)
    slot_values = torch.arange(27, dtype=torch.float32)
    sent = slot_values[p.order]
    assert torch.equal(scatter_slots(sent, p.position), slot_values.view(9, 3))


def simulate(ids_per_rank, E, chunks):
    """Runs the dispatch of every rank, moves the rows as all_to_all_single would, and returns
    per rank and chunk the received (global token, global expert) pairs and the local ids."""
    W = len(ids_per_rank)
    plans = [plan_dispatch(ids, E, W, chunks) for ids in ids_per_rank]
    recv_counts = [torch.stack([plans[src].send_counts[dst] for src in range(W)]) for dst in range(W)]
    splits = [host_splits(plans[r].send_counts, recv_counts[r], chunks, plans[r].slots) for r in range(W)]
    base = [sum(ids.shape[0] for ids in ids_per_rank[:r]) for r in range(W)]
    # what each rank sends: (global token, global expert) per send row
    payload = []
    for r, (ids, p) in enumerate(zip(ids_per_rank, plans)):
        tok = p.send_tokens() + base[r]
        exp = ids.reshape(-1).long()[p.order]
        payload.append(torch.stack([tok, exp], 1))
    received = [[None] * chunks for _ in range(W)]
    for c in range(chunks):
        for dst in range(W):
            parts = []
            for src in range(W):
                s0, _ = splits[src].send_range(c)
                off = s0 + sum(splits[src].send[c][:dst])
                parts.append(payload[src][off:off + splits[src].send[c][dst]])
                assert parts[-1].shape[0] == splits[dst].recv[c][src]
            rows = torch.cat(parts)
            local = received_expert_ids(recv_counts[dst], c, chunks, rows.shape[0])
            received[dst][c] = (rows, local)
    return plans, splits, received


@pytest.mark.parametrize("W,E,K,chunks", [(2, 8, 2, 1), (2, 8, 2, 4), (3, 12, 3, 2), (4, 8, 1, 1)])
def test_simulated_exchange_puts_rows_in_global_token_order(W, E, K, chunks):
    T = [13, 0, 21, 8][:W]
    ids_per_rank = [random_ids(t, K, E, seed=10 * r + 1) if t else torch.zeros(0, K, dtype=torch.int32)
                    for r, t in enumerate(T)]
    plans, splits, received = simulate(ids_per_rank, E, chunks)
    local, per_chunk = E // W, E // W // chunks
    all_ids = torch.cat(ids_per_rank)
    for dst in range(W):
        for c in range(chunks):
            rows, lid = received[dst][c]
            # every row is for one of this chunk's experts on this rank, and its local id says which
            assert torch.equal(rows[:, 1], dst * local + c * per_chunk + lid.long())
            # per expert: the global tokens that picked it, ascending (= the EP = 1 order)
            for e in range(c * per_chunk, (c + 1) * per_chunk):
                g = dst * local + e
                got = rows[rows[:, 1] == g, 0]
                want = (all_ids == g).any(1).nonzero().view(-1)
                assert torch.equal(got, want), (dst, c, e)


def test_simulated_round_trip_and_combine():
    W, E, K, chunks = 2, 8, 3, 2
    ids_per_rank = [random_ids(11, K, E, seed=7), random_ids(6, K, E, seed=8)]
    plans, splits, received = simulate(ids_per_rank, E, chunks)
    # the expert side answers each row with token * 100 + expert; rows return by the reverse splits
    for r, p in enumerate(plans):
        back = torch.empty(p.slots, dtype=torch.float64)
        for c in range(chunks):
            s0, _ = splits[r].send_range(c)
            for dst in range(W):
                rows, _ = received[dst][c]
                start = sum(splits[dst].recv[c][:r])
                mine = rows[start:start + splits[dst].recv[c][r]]
                off = s0 + sum(splits[r].send[c][:dst])
                back[off:off + mine.shape[0]] = (mine[:, 0] * 100 + mine[:, 1]).double()
        base = 11 * r
        tok = torch.arange(p.tokens, dtype=torch.float64) + base
        want_slots = tok[:, None] * 100 + ids_per_rank[r].double()
        assert torch.equal(scatter_slots(back, p.position), want_slots)
        assert torch.equal(gather_sum(back[:, None], p.position, torch.float64)[:, 0], want_slots.sum(1))


def test_padded_expert_ids_mark_the_rows_past_the_received_ones():
    recv = torch.tensor([[2, 0, 1], [0, 3, 1]])  # from 2 ranks, 3 local experts
    ids = padded_expert_ids(recv, 10)
    assert ids.tolist() == [0, 0, 2, 1, 1, 1, 2, 3, 3, 3]
    assert ids.dtype == torch.int32
    assert torch.equal(ids[:7], received_expert_ids(recv, 0, 1, 7))
    assert padded_expert_ids(torch.zeros(2, 3, dtype=torch.long), 4).tolist() == [3] * 4

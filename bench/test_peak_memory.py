"""CPU tests of the trace replay behind the suite's peak-memory column."""
from peak_memory import peak_from_trace


def ev(action, addr, size):
    return {"action": action, "addr": addr, "size": size}


def test_peak_is_the_highest_live_sum():
    t = [ev("alloc", 0, 100), ev("alloc", 100, 50), ev("free_completed", 0, 100), ev("alloc", 200, 30)]
    assert peak_from_trace(t, []) == 150


def test_frees_of_older_blocks_do_not_lower_the_base():
    t = [ev("free_completed", 999, 500), ev("alloc", 0, 100)]
    assert peak_from_trace(t, []) == 100


def test_gradients_are_excluded_for_their_whole_life():
    # Activations 300, freed as gradients 200 + 200 appear (autograd's order): the old
    # subtraction would say max(300, 300+200, 200+200+...) - 400; the replay says 300.
    t = [ev("alloc", 0, 300), ev("alloc", 1000, 200), ev("free_completed", 0, 300), ev("alloc", 2000, 200),
         ev("alloc", 3000, 40)]
    assert peak_from_trace(t, [(1000, 200), (2000, 200)]) == 300


def test_a_gradient_inside_a_larger_block_only_removes_its_bytes():
    t = [ev("alloc", 0, 1000)]
    assert peak_from_trace(t, [(512, 256)]) == 744


def test_free_requested_alone_keeps_the_block_live():
    t = [ev("alloc", 0, 100), ev("free_requested", 0, 100), ev("alloc", 100, 100)]
    assert peak_from_trace(t, []) == 200


def test_a_freed_block_at_a_gradient_address_counts_in_full():
    # A temporary at 1000 dies, then the gradient is allocated at the same address.
    t = [ev("alloc", 1000, 200), ev("alloc", 0, 100), ev("free_completed", 1000, 200),
         ev("free_completed", 0, 100), ev("alloc", 1000, 200)]
    assert peak_from_trace(t, [(1000, 200)]) == 300

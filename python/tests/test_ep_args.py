"""The EP layer in one process (a one-rank gloo group, on the CPU): bad arguments are rejected
naming the argument, and EPMoE with its router matches moeblaze.reference's layer."""
import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("needs torch.distributed with gloo", allow_module_level=True)

from moeblaze import InvalidArgument  # noqa: E402
from moeblaze.ep import EPMoE, ep_moe  # noqa: E402
from moeblaze.ep_experts import TorchExperts  # noqa: E402
from moeblaze.reference import moe as ref_moe, route as ref_route  # noqa: E402


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory):
    if dist.is_initialized():
        pytest.skip("a process group already exists in this process")
    path = tmp_path_factory.mktemp("pg") / "init"
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def args(T=6, K=2, E=4, d=8, n=8):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(T, d, generator=g, dtype=torch.float64)
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)]).int()
    gates = torch.rand(T, K, generator=g, dtype=torch.float64)
    w1 = torch.randn(E, n, d, generator=g, dtype=torch.float64)
    w3 = torch.randn(E, n, d, generator=g, dtype=torch.float64)
    w2 = torch.randn(E, d, n, generator=g, dtype=torch.float64)
    return x, w1, w3, w2, ids, gates


@pytest.mark.parametrize("change,argument", [
    (lambda a: dict(a, x=a["x"][None]), "x"),
    (lambda a: dict(a, topk_ids=a["topk_ids"][:-1]), "topk_ids"),
    (lambda a: dict(a, topk_weights=a["topk_weights"][:, :1]), "topk_weights"),
    (lambda a: dict(a, topk_weights=a["topk_weights"].long()), "topk_weights"),
    (lambda a: dict(a, w1=a["w1"][:3]), "w1"),
    (lambda a: dict(a, w3=a["w3"][:, :4]), "w3"),
    (lambda a: dict(a, w2=a["w2"].transpose(1, 2)[:, :4]), "w2"),
    (lambda a: dict(a, num_experts=0), "num_experts"),
    (lambda a: dict(a, num_experts=6), "w1"),  # 6 experts on this one rank, w1 holds 4
    (lambda a: dict(a, chunks=3), "chunks"),
    (lambda a: dict(a, exchange="nvlink"), "exchange"),
    (lambda a: dict(a, topk_ids=a["topk_ids"] + 2), "topk_ids"),  # ids past E
])
def test_bad_arguments_name_the_argument(one_rank, change, argument):
    x, w1, w3, w2, ids, gates = args()
    a = change(dict(x=x, w1=w1, w3=w3, w2=w2, topk_ids=ids, topk_weights=gates, num_experts=4, chunks=1,
                    engine=TorchExperts("silu")))
    with pytest.raises(InvalidArgument) as e:
        ep_moe(a.pop("x"), a.pop("w1"), a.pop("w3"), a.pop("w2"), a.pop("topk_ids"), a.pop("topk_weights"), **a)
    assert e.value.argument == argument, str(e.value)


def test_module_with_router_matches_reference(one_rank):
    torch.manual_seed(3)
    m = EPMoE(8, 2, 16, 8, activation="swiglu", router="softmax", renormalize=True, chunks=2, dtype=torch.float64)
    assert m.expert_range == (0, 8)
    x = torch.randn(2, 5, 16, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(2, 5, 16, dtype=torch.float64)
    out = m(x)
    out.y.backward(dy)
    got = [x.grad.clone(), m.gate.weight.grad.clone(), m.experts.w1.grad.clone(), m.experts.w2.grad.clone()]
    assert out.y.shape == (2, 5, 16) and int(out.expert_counts.sum()) == 20
    x.grad = None
    for p in m.parameters():
        p.grad = None
    xf = x.reshape(-1, 16)
    ids, gates = ref_route(xf, m.gate.weight, 2, "softmax", True)
    y = ref_moe(xf, ids, gates, m.experts.w1, m.experts.w3, m.experts.w2, "swiglu")
    y.backward(dy.reshape(-1, 16).float())
    want = [x.grad, m.gate.weight.grad, m.experts.w1.grad, m.experts.w2.grad]
    assert torch.allclose(out.y.reshape(-1, 16), y.double(), rtol=1e-5, atol=1e-5)
    for a, b in zip(got, want):
        assert torch.allclose(a, b.double(), rtol=1e-4, atol=1e-5)
        assert b.abs().sum() > 0


def test_backward_twice_is_refused(one_rank):
    x, w1, w3, w2, ids, gates = args()
    w1.requires_grad_()
    out = ep_moe(x, w1, w3, w2, ids, gates, num_experts=4, engine=TorchExperts("silu"))
    out.y.sum().backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="already backpropagated"):
        out.y.sum().backward()

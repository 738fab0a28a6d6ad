"""moeblaze.torchtitan without a GPU: the override and apply() swap torchtitan's RoutedExperts
with the parameters, names and checkpoints unchanged, and the swapped layer hands moeblaze
exactly torchtitan's routing: with the pure-PyTorch reference standing in for the kernels
(float32 math on the CPU), loss and every gradient (router, shared experts, experts, input)
match torchtitan's stock experts. Unsupported experts and expert parallelism are refused.
Skipped without torch or torchtitan."""
import copy
from dataclasses import dataclass

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchtitan")

import moeblaze  # noqa: E402
import moeblaze.torch as mbt  # noqa: E402
import moeblaze.torchtitan as mtt  # noqa: E402
from torchtitan.config.override import OverrideConfig, apply_overrides  # noqa: E402
from torchtitan.models.common.moe import GroupedExperts, RoutedExperts  # noqa: E402

from titan_configs import ROUTERS, ReferenceKernels, build_moe, moe_config  # noqa: E402


def rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


@pytest.fixture
def kernels(monkeypatch):
    k = ReferenceKernels()
    monkeypatch.setattr(mbt, "moe", k)
    return k


def _overridden(cfg, **kwargs):
    entry = "moeblaze.torchtitan.moeblaze_routed_experts"
    lines = apply_overrides(OverrideConfig(imports=[(entry, kwargs) if kwargs else entry]), cfg)
    return cfg, lines


def test_override_swaps_the_config_and_checkpoints_load_unchanged():
    stock = build_moe(moe_config("deepseek_v3"))
    cfg, lines = _overridden(moe_config("deepseek_v3"), checkpoint="recompute")
    assert len(lines) == 1 and "MoeblazeRoutedExperts" in lines[0], lines
    swapped = build_moe(cfg, seed=1)
    assert type(swapped.routed_experts) is mtt.MoeblazeRoutedExperts
    assert swapped.routed_experts.checkpoint == "recompute"
    assert type(swapped.routed_experts.inner_experts) is GroupedExperts
    assert swapped.state_dict().keys() == stock.state_dict().keys()
    swapped.load_state_dict(stock.state_dict(), strict=True)
    for (n, p), (_, q) in zip(swapped.named_parameters(), stock.named_parameters()):
        assert torch.equal(p, q), n


def test_apply_swaps_built_modules_keeping_their_parameters():
    model = torch.nn.ModuleDict({"0": build_moe(moe_config("qwen3")), "1": build_moe(moe_config("qwen3"), seed=2)})
    before = {n: p for n, p in model.named_parameters()}
    names = mtt.apply(model)
    assert names == ["0.routed_experts", "1.routed_experts"]
    assert all(type(m.routed_experts) is mtt.MoeblazeRoutedExperts for m in model.values())
    after = dict(model.named_parameters())
    assert after.keys() == before.keys() and all(after[n] is before[n] for n in before)
    with pytest.raises(moeblaze.InvalidArgument, match="no torchtitan RoutedExperts"):
        mtt.apply(torch.nn.Linear(4, 4))


def _loss_and_grads(moe, x, r):
    moe.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_()
    y = moe(x)
    loss = (y.float() * r).sum()
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in moe.named_parameters() if p.grad is not None}
    return y.detach(), loss.detach(), grads, x.grad


@pytest.mark.parametrize("router", ROUTERS)
def test_matches_the_stock_experts_loss_and_gradients(router, kernels):
    stock = build_moe(moe_config(router))
    swapped = copy.deepcopy(stock)
    mtt.apply(swapped)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 48, 128, generator=g)
    r = torch.randn(2, 48, 128, generator=g)
    ys, ls, gs, dxs = _loss_and_grads(stock, x, r)
    ym, lm, gm, dxm = _loss_and_grads(swapped, x, r)
    (call,) = kernels.calls
    # torchtitan's own routing reaches the layer: its router's picks and scores, int32 and fp32 [T, K].
    scores, ids, _ = stock.router(x, stock.expert_bias_E)
    assert call["ids"].dtype == torch.int32 and torch.equal(call["ids"].long(), ids.reshape(96, 4))
    assert call["weights"].dtype == torch.float32 and torch.allclose(call["weights"], scores.reshape(96, 4))
    assert call["w1"].dtype == torch.bfloat16 and call["activation"] == "swiglu"
    assert set(gm) == set(gs) and len(gs) == len(list(stock.parameters()))
    # Stock experts run bf16 grouped GEMMs, the reference fp32 math on the same bf16 operands.
    assert abs(lm.item() - ls.item()) < 1e-2 * abs(ls.item())
    bad = [f"{n}: {rel(gm[n], gs[n]):.2e}" for n in sorted(gs) if not rel(gm[n], gs[n]) < 2e-2]
    assert not bad, bad
    assert rel(ym, ys) < 1e-2 and rel(dxm, dxs) < 2e-2
    for n in gm:
        assert gm[n].abs().max() > 0, n
    assert swapped.router.gate.weight.grad.abs().max() > 0  # the score gradient reaches the router


def test_token_counts_for_the_expert_bias_stay_torchtitans(kernels):
    stock = build_moe(moe_config("deepseek_v3"))
    swapped = copy.deepcopy(stock)
    mtt.apply(swapped)
    x = torch.randn(2, 16, 128)
    for m in (stock, swapped):
        m.train()
        m.tokens_per_expert_E.zero_()
        with torch.no_grad():
            m(x)
    assert torch.equal(stock.tokens_per_expert_E, swapped.tokens_per_expert_E)
    assert stock.tokens_per_expert_E.sum() == 2 * 16 * 4


def test_bf16_parameters_are_read_in_place(kernels):
    moe = build_moe(moe_config("qwen3"), dtype=torch.bfloat16)
    mtt.apply(moe)
    moe(torch.randn(1, 8, 128, dtype=torch.bfloat16))
    (call,) = kernels.calls
    inner = moe.routed_experts.inner_experts
    assert call["w1"] is inner.w1_EFD and call["w3"] is inner.w3_EFD and call["w2"] is inner.w2_EDF


def test_without_a_gpu_the_layer_refuses_cpu_tensors():
    """Nothing falls back to another implementation: the real layer names the CPU tensor."""
    moe = build_moe(moe_config("qwen3"))
    mtt.apply(moe)
    with pytest.raises(moeblaze.InvalidArgument) as e:
        moe(torch.randn(1, 8, 128))
    assert "CUDA" in str(e.value) or "cuda" in str(e.value)


class Scaled(GroupedExperts):
    """Experts with other math (as GPT-OSS's, or a quantized _grouped_mm) under the same names."""

    @dataclass(kw_only=True, slots=True)
    class Config(GroupedExperts.Config):
        pass

    def _grouped_mm(self, *, A, B_t, offs):
        return 2 * super()._grouped_mm(A=A, B_t=B_t, offs=offs)


def test_other_experts_and_expert_parallelism_are_refused(kernels):
    cfg = moe_config("qwen3")
    inner = cfg.routed_experts.inner_experts
    cfg.routed_experts.inner_experts = Scaled.Config(dim=inner.dim, hidden_dim=inner.hidden_dim,
                                                     num_experts=inner.num_experts)
    with pytest.raises(mtt.UnsupportedExperts, match="Scaled"):
        _overridden(cfg)
    moe = build_moe(moe_config("qwen3"))
    moe.routed_experts.inner_experts.__class__ = Scaled
    with pytest.raises(mtt.UnsupportedExperts, match="Scaled"):
        mtt.apply(moe)

    class Mesh:
        def size(self):
            return 4

    moe = build_moe(moe_config("qwen3"))
    mtt.apply(moe)
    moe.routed_experts.token_dispatcher.ep_mesh = Mesh()
    with pytest.raises(mtt.UnsupportedExperts, match="expert parallelism"):
        moe(torch.randn(1, 8, 128))
    assert not kernels.calls


def test_checkpoint_mode_is_checked():
    with pytest.raises(moeblaze.InvalidArgument) as e:
        mtt.apply(build_moe(moe_config("qwen3")), checkpoint="fast")
    assert e.value.argument == "checkpoint"
    with pytest.raises(moeblaze.InvalidArgument):
        _overridden(moe_config("qwen3"), checkpoint="fast")


def test_stock_routed_experts_is_what_the_adapter_subclasses():
    # The adapter relies on RoutedExperts.forward's signature (x, scores, ids, counts) and its
    # children's names; a torchtitan that changed them must fail here, not in a training run.
    import inspect
    params = list(inspect.signature(RoutedExperts.forward).parameters)
    assert params == ["self", "x_BLD", "topk_scores_BLK", "topk_expert_ids_BLK", "num_local_tokens_per_expert_E"]
    assert set(dict(build_moe(moe_config("qwen3")).routed_experts.named_children())) == {"inner_experts"}

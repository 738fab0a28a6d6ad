"""moeblaze.torchtitan on a GPU: torchtitan MoE layers (a Qwen3-style softmax router; a
DeepSeek-V3-style sigmoid router with node-limited groups, expert bias, route scale and a
shared expert) with the moeblaze kernels against the same layers with torchtitan's stock
experts: loss and every gradient, each within twice the stock bf16 experts' own distance from
the float32 reference (plus a floor) and within 3e-2 of the stock experts directly. Skipped
without a CUDA GPU or torchtitan."""
import copy

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchtitan")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

import moeblaze.torch as mbt  # noqa: E402
import moeblaze.torchtitan as mtt  # noqa: E402

from titan_configs import ROUTERS, ReferenceKernels, build_moe, moe_config  # noqa: E402

DEV = "cuda"


def rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def loss_and_grads(moe, x, r):
    moe.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_()
    terms = moe(x).float() * r
    loss = terms.sum()
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in moe.named_parameters() if p.grad is not None}
    grads["x"] = x.grad.detach().clone()
    grads["_scale"] = terms.detach().norm()  # the loss's size before its terms cancel (see _compare)
    return loss.detach(), grads


def _compare(stock, swapped, x, r, monkeypatch):
    loss_s, g_s = loss_and_grads(stock, x, r)
    loss_m, g_m = loss_and_grads(swapped, x, r)
    with monkeypatch.context() as m:
        m.setattr(mbt, "moe", ReferenceKernels())  # float32 math on the same bf16 operands
        loss_f, g_f = loss_and_grads(swapped, x, r)
    assert set(g_m) == set(g_s) == set(g_f), set(g_m) ^ set(g_s)
    bad = []
    for name in sorted(g_s):
        if name == "_scale":
            continue
        m, s, f = g_m[name], g_s[name], g_f[name]
        assert m.abs().max() > 0, f"{name}: moeblaze gradient is zero"
        r_ms, r_mf, r_sf = rel(m, s), rel(m, f), rel(s, f)
        if not (r_ms < 3e-2 and r_mf <= max(2 * r_sf, 1e-2)):
            bad.append(f"{name}: moeblaze-stock {r_ms:.2e}, moeblaze-fp32 {r_mf:.2e}, stock-fp32 {r_sf:.2e}")
    assert not bad, "\n".join(bad)
    # The loss is a sum of terms of both signs (r is random): their bf16 rounding adds up like a
    # random walk, about ||r * y|| 2^-9, while the sum itself cancels to far less. With float32
    # parameters the stock experts run in float32 and land next to the reference, so their
    # distance alone is no bound for bf16 kernels; the floor is 1e-2 ||r * y||, two to three
    # times bf16's rounding of every output.
    floor = 1e-2 * g_f["_scale"].item()
    assert abs(loss_m.item() - loss_f.item()) <= max(2 * abs(loss_s.item() - loss_f.item()), floor), (
        loss_m.item(), loss_s.item(), loss_f.item(), floor)


@pytest.mark.parametrize("checkpoint", ["save-h", "recompute"])
@pytest.mark.parametrize("router", ROUTERS)
def test_matches_the_stock_experts(router, checkpoint, monkeypatch):
    stock = build_moe(moe_config(router), device=DEV)
    swapped = copy.deepcopy(stock)
    assert mtt.apply(swapped, checkpoint=checkpoint) == ["routed_experts"]
    g = torch.Generator(device=DEV).manual_seed(1)
    x = torch.randn(4, 256, 128, device=DEV, generator=g)
    r = torch.randn(4, 256, 128, device=DEV, generator=g)
    _compare(stock, swapped, x, r, monkeypatch)


def test_bf16_parameters_and_the_override_path(monkeypatch):
    """bf16 parameters (as under FSDP2's bf16 mixed precision) are read in place; the model is
    built through torchtitan's override mechanism."""
    from torchtitan.config.override import OverrideConfig, apply_overrides
    cfg = moe_config("deepseek_v3")
    apply_overrides(OverrideConfig(imports=["moeblaze.torchtitan.moeblaze_routed_experts"]), cfg)
    swapped = build_moe(cfg, device=DEV, dtype=torch.bfloat16)
    stock = build_moe(moe_config("deepseek_v3"), device=DEV, dtype=torch.bfloat16)
    swapped.load_state_dict(stock.state_dict())
    assert type(swapped.routed_experts) is mtt.MoeblazeRoutedExperts
    g = torch.Generator(device=DEV).manual_seed(2)
    x = torch.randn(2, 512, 128, device=DEV, dtype=torch.bfloat16, generator=g)
    r = torch.randn(2, 512, 128, device=DEV, generator=g)
    _compare(stock, swapped, x, r, monkeypatch)


def test_trains_like_the_stock_experts():
    """Twenty AdamW steps from the same weights: the loss curves agree."""
    curves = []
    for use_moeblaze in (False, True):
        moe = build_moe(moe_config("qwen3"), device=DEV)
        if use_moeblaze:
            mtt.apply(moe)
        opt = torch.optim.AdamW(moe.parameters(), lr=3e-3)
        g = torch.Generator(device=DEV).manual_seed(3)
        x = torch.randn(4, 128, 128, device=DEV, generator=g)
        target = torch.randn(4, 128, 128, device=DEV, generator=g)
        losses = []
        for _ in range(20):
            loss = (moe(x) - target).pow(2).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        curves.append(torch.tensor(losses))
    stock, mb = curves
    assert mb[-1] < 0.95 * mb[0]
    assert ((mb - stock).abs() / stock.abs()).max() < 2e-2, (stock, mb)

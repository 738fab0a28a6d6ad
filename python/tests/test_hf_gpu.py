"""The transformers backend on a GPU: per-family parity with the models' own eager experts
(logits and every parameter gradient), FSDP2, torch.compile (fullgraph for the MoE block), a
whole training step of the MoE block in a CUDA graph, and gradient accumulation in the
weight-gradient epilogues (bf16 .grad and fp32 main_grad). Skipped without a CUDA GPU."""
import copy
import os
import warnings

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

import moeblaze.hf as mhf  # noqa: E402,F401  (registers the backend)
import moeblaze.torch as mbt  # noqa: E402

from hf_configs import FAMILIES, experts_modules, small_config  # noqa: E402

DEV = "cuda"


def rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def one_layer_config(family):
    """One decoder layer whose MLP is the family's MoE block (its router and shared experts
    included), so that both implementations route every token identically."""
    over = dict(num_hidden_layers=1)
    if family == "deepseek_v3":
        over["first_k_dense_replace"] = 0
    if family == "gpt_oss":
        over["layer_types"] = ["full_attention"]
    if family == "qwen3_next":
        over["layer_types"] = ["full_attention"]
    return small_config(family, **over)


def build(family, impl, dtype=torch.bfloat16, seed=0, cfg=None):
    torch.manual_seed(seed)
    cfg = cfg or one_layer_config(family)
    model = transformers.AutoModelForCausalLM.from_config(cfg, experts_implementation=impl, dtype=torch.float32)
    with torch.no_grad():  # expert weights at a scale where the activations are O(1)
        for m in experts_modules(model):
            for name, p in m.named_parameters():
                p.normal_(0, 0.5 if "bias" in name else p.shape[-1] ** -0.5)
    return model.to(device=DEV, dtype=dtype)


def same_weights(dst, src):
    dst.load_state_dict(src.state_dict())
    return dst


def loss_and_grads(model, ids):
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.logits.detach().float(), out.loss.detach().float(), grads


@pytest.mark.parametrize("family", FAMILIES)
def test_family_matches_its_eager_experts(family):
    """Logits and every parameter gradient of experts_implementation="moeblaze" against the
    model's eager experts, both bf16; each within twice the eager bf16 model's own distance from
    an fp32 model (plus a floor), and within 3e-2 of the eager bf16 model directly."""
    ref32 = build(family, "eager", torch.float32)
    eager = same_weights(build(family, "eager"), ref32)
    mb = same_weights(build(family, "moeblaze"), ref32)
    g = torch.Generator(device=DEV).manual_seed(1)
    ids = torch.randint(0, 256, (4, 128), device=DEV, generator=g)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # GPT-OSS's one-time copy warning
        l32, loss32, g32 = loss_and_grads(ref32, ids)
        le, losse, ge = loss_and_grads(eager, ids)
        lm, lossm, gm = loss_and_grads(mb, ids)
    assert set(gm) == set(ge) == set(g32), set(gm) ^ set(ge)
    expert_params = [n for n in gm if "experts." in n and "shared" not in n]
    assert expert_params, "the model has expert parameters with gradients"
    rows = [("logits", lm, le, l32)] + [(n, gm[n], ge[n], g32[n]) for n in sorted(gm)]
    bad = []
    for name, m, e, f in rows:
        r_me, r_mf, r_ef = rel(m, e), rel(m, f), rel(e, f)
        if not (r_me < 3e-2 and r_mf <= max(2 * r_ef, 1e-2)):
            bad.append(f"{name}: moeblaze-eager {r_me:.2e}, moeblaze-fp32 {r_mf:.2e}, eager-fp32 {r_ef:.2e}")
    assert not bad, "\n".join(bad)
    assert abs(lossm.item() - losse.item()) < 1e-2 * abs(losse.item())


def test_fused_gate_up_equals_the_separate_layout_bitwise():
    """The fused [E,2n,d] layout is storage only: outputs and gradients are those of the separate
    W1/W3 layout, bit for bit (same kernels' math, same order)."""
    E, K, d, n, T = 16, 4, 256, 192, 700
    torch.manual_seed(3)
    gate_up = (torch.randn(E, 2 * n, d, device=DEV) * d ** -0.5).bfloat16()
    w2 = (torch.randn(E, d, n, device=DEV) * n ** -0.5).bfloat16()
    x = torch.randn(T, d, device=DEV, dtype=torch.bfloat16)
    ids = torch.stack([torch.randperm(E, device=DEV)[:K] for _ in range(T)]).int()
    wts = torch.rand(T, K, device=DEV).softmax(-1)
    dy = torch.randn(T, d, device=DEV, dtype=torch.bfloat16)
    results = []
    for fused in (True, False):
        gu = gate_up.clone().requires_grad_()
        w1, w3 = (gu, None) if fused else (gu[:, :n].contiguous().detach().requires_grad_(),
                                           gu[:, n:].contiguous().detach().requires_grad_())
        xx, ww, w2_ = x.clone().requires_grad_(), wts.clone().requires_grad_(), w2.clone().requires_grad_()
        out = mbt.moe(xx, w1, w3, w2_, topk_ids=ids, topk_weights=ww)
        out.y.backward(dy)
        dgu = gu.grad if fused else torch.cat([w1.grad, w3.grad], dim=1)
        results.append((out.y, xx.grad, ww.grad, dgu, w2_.grad))
    for a, b, name in zip(*results, ["y", "dx", "d_topk_weights", "d_gate_up", "dw2"]):
        assert torch.equal(a, b), name


def _micro_batches(model, n_batches, seed=2):
    g = torch.Generator(device=DEV).manual_seed(seed)
    return [torch.randint(0, 256, (2, 64), device=DEV, generator=g) for _ in range(n_batches)]


def _ops_in(fn):
    """Names of the operators `fn` dispatches (torch.profiler, CPU side)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return {e.name for e in prof.events()}


def test_gradient_accumulation_adds_in_the_epilogue():
    """Micro-batches: the second backward adds into the bf16 .grad in place: the accumulating
    backward op runs (not the one returning fresh gradients), the .grad tensors stay the same
    tensors, and the sum matches the sum of the separate gradients."""
    model = build("qwen3_moe", "moeblaze")
    experts = experts_modules(model)[0]
    batches = _micro_batches(model, 2)
    single = []
    for ids in batches:
        model.zero_grad(set_to_none=True)
        model(input_ids=ids, labels=ids).loss.backward()
        single.append({n: p.grad.clone() for n, p in experts.named_parameters()})
    model.zero_grad(set_to_none=True)
    model(input_ids=batches[0], labels=batches[0]).loss.backward()
    ptrs = {n: p.grad.data_ptr() for n, p in experts.named_parameters()}
    loss = model(input_ids=batches[1], labels=batches[1]).loss
    ops = _ops_in(loss.backward)
    assert "moeblaze::backward_accumulate" in ops and "moeblaze::backward" not in ops, ops
    for n, p in experts.named_parameters():
        assert p.grad.data_ptr() == ptrs[n], n  # added in place
        want = single[0][n].float() + single[1][n].float()
        assert rel(p.grad, want) < 1e-2, (n, rel(p.grad, want))
    # The first micro-batch (no .grad yet) takes the storing backward.
    model.zero_grad(set_to_none=True)
    loss = model(input_ids=batches[0], labels=batches[0]).loss
    assert "moeblaze::backward" in _ops_in(loss.backward)


def test_main_grad_fp32_accumulation():
    """Megatron's convention: an fp32 main_grad per weight; the backward adds into it and leaves
    .grad alone (grad_added_to_main_grad is set)."""
    model = build("qwen3_moe", "moeblaze")
    experts = experts_modules(model)[0]
    ids_a, ids_b = _micro_batches(model, 2, seed=4)
    model.zero_grad(set_to_none=True)
    model(input_ids=ids_a, labels=ids_a).loss.backward()
    g_a = {n: p.grad.float().clone() for n, p in experts.named_parameters()}
    model.zero_grad(set_to_none=True)
    model(input_ids=ids_b, labels=ids_b).loss.backward()
    g_b = {n: p.grad.float().clone() for n, p in experts.named_parameters()}
    model.zero_grad(set_to_none=True)
    for p in experts.parameters():
        p.main_grad = torch.zeros(p.shape, dtype=torch.float32, device=DEV)
        p.grad_added_to_main_grad = False
    for ids in (ids_a, ids_b):
        model(input_ids=ids, labels=ids).loss.backward()
    for n, p in experts.named_parameters():
        assert p.grad is None, n
        assert p.grad_added_to_main_grad, n
        assert rel(p.main_grad, g_a[n] + g_b[n]) < 1e-2, n


def test_torch_compile_fullgraph_moe_block_and_compiled_training():
    model = build("qwen3_moe", "moeblaze")
    block = model.model.layers[0].mlp
    x = torch.randn(2, 64, 128, device=DEV, dtype=torch.bfloat16)
    want = block(x)
    compiled = torch.compile(block, fullgraph=True)
    got = compiled(x)
    assert rel(got, want) < 1e-2  # the router's softmax/top-k are Inductor's here
    # Forward and backward of the compiled block equal eager, gradients included.
    xe, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
    dy = torch.randn_like(x)
    block.zero_grad(set_to_none=True)
    block(xe).backward(dy)
    eager_grads = {n: p.grad.clone() for n, p in block.named_parameters()}
    block.zero_grad(set_to_none=True)
    compiled(xc).backward(dy)
    for n, p in block.named_parameters():
        assert rel(p.grad, eager_grads[n]) < 1e-2, n
    assert rel(xc.grad, xe.grad) < 1e-2
    # The whole model compiled (graph breaks allowed outside the MoE block) trains.
    m2 = torch.compile(build("qwen3_moe", "moeblaze"))
    opt = torch.optim.AdamW(m2.parameters(), lr=1e-3)
    ids = torch.randint(0, 256, (4, 64), device=DEV)
    losses = []
    for _ in range(20):
        loss = m2(input_ids=ids, labels=ids).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


def test_cuda_graph_whole_training_step_of_the_moe_block():
    """Forward, backward and AdamW of the MoE block captured once and replayed: every replay
    equals the same step run eagerly (bitwise: every kernel is deterministic), so nothing in the
    step synchronises with the host or allocates outside the graph's pool."""
    def make():
        model = build("qwen3_moe", "moeblaze", seed=5)
        block = model.model.layers[0].mlp
        opt = torch.optim.AdamW(block.parameters(), lr=1e-3, capturable=True)
        return block, opt
    g = torch.Generator(device=DEV).manual_seed(6)
    xs = [torch.randn(4, 64, 128, device=DEV, dtype=torch.bfloat16, generator=g) for _ in range(6)]

    def step(block, opt, x):
        opt.zero_grad(set_to_none=True)
        y = block(x)
        loss = y.float().pow(2).mean()
        loss.backward()
        opt.step()
        return loss

    eager_block, eager_opt = make()
    eager_losses = [step(eager_block, eager_opt, x).detach().clone() for x in xs]

    block, opt = make()
    static_x = xs[0].clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up on a side stream: kernels loaded, optimizer state made
        step(block, opt, static_x)
    torch.cuda.current_stream().wait_stream(s)
    # The warm-up took one step: back to the initial weights and a fresh optimizer state, in
    # place (the graph will hold these addresses).
    block.load_state_dict(make()[0].state_dict())
    for st in opt.state.values():
        for v in st.values():
            if torch.is_tensor(v):
                v.zero_()
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        static_loss = step(block, opt, static_x)
    graph_losses = []
    for x in xs:
        static_x.copy_(x)
        graph.replay()
        graph_losses.append(static_loss.clone())
    torch.cuda.synchronize()
    for i, (a, b) in enumerate(zip(graph_losses, eager_losses)):
        assert torch.equal(a, b), (i, a.item(), b.item())
    for (n, p), (_, q) in zip(block.named_parameters(), eager_block.named_parameters()):
        assert torch.equal(p, q), n


def _fsdp_group():
    import torch.distributed as dist
    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
        dist.init_process_group("nccl", rank=0, world_size=1)
    return dist


def test_fsdp2_fully_shard_trains_like_the_unsharded_model():
    """fully_shard on a one-process group: the experts see the all-gathered weights inside
    forward (the DTensor path), their gradients go back through FSDP's reduce-scatter, and the
    losses follow the unwrapped moeblaze model's."""
    _fsdp_group()
    from torch.distributed.fsdp import fully_shard
    cfg = small_config("qwen3_moe")
    plain = build("qwen3_moe", "moeblaze", cfg=cfg)
    sharded = same_weights(build("qwen3_moe", "moeblaze", cfg=cfg), plain)
    for layer in sharded.model.layers:
        fully_shard(layer)
    fully_shard(sharded)
    assert type(experts_modules(sharded)[0].gate_up_proj).__name__ == "DTensor"
    ids = torch.randint(0, 256, (4, 64), device=DEV)
    curves = []
    for model in (plain, sharded):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        losses = []
        for _ in range(10):
            loss = model(input_ids=ids, labels=ids).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        curves.append(losses)
    a, b = torch.tensor(curves[0]), torch.tensor(curves[1])
    assert ((a - b).abs() / a.abs()).max() < 1e-2, (a, b)
    assert b[-1] < b[0]
    # Outside forward the weights are sharded DTensors: the backend says so instead of computing on a shard.
    m = experts_modules(sharded)[0]
    x = torch.randn(8, 128, device=DEV, dtype=torch.bfloat16)
    with pytest.raises(mhf.UnsupportedExperts, match="DTensor"):
        mhf.experts_forward(m, x, torch.zeros(8, 4, dtype=torch.long, device=DEV), torch.ones(8, 4, device=DEV))

"""The transformers experts backend without a GPU: it registers, every family's experts map
onto moeblaze's layouts (checked against the models' own eager experts with the pure-PyTorch
reference, float32 on the CPU), and bad or unsupported inputs raise errors that name them.
Skipped without torch or transformers."""
import warnings

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import moeblaze  # noqa: E402
import moeblaze.hf as mhf  # noqa: E402
from moeblaze.reference import moe as ref_moe  # noqa: E402

from hf_configs import FAMILIES, experts_modules, small_config  # noqa: E402


def test_backend_registers_in_the_experts_interface():
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS, ExpertsInterface
    assert "moeblaze" in ALL_EXPERTS_FUNCTIONS
    assert ExpertsInterface().get_interface("moeblaze", None) is mhf.experts_forward


@pytest.mark.parametrize("family", FAMILIES)
def test_model_builds_with_the_backend(family):
    model = transformers.AutoModelForCausalLM.from_config(small_config(family), experts_implementation="moeblaze")
    assert model.config._experts_implementation == "moeblaze"
    mods = experts_modules(model)
    assert mods, "the model has experts modules"
    for m in mods:
        spec = mhf.experts_spec(m)
        assert spec.experts == m.num_experts


def test_unknown_backend_name_is_refused_by_transformers():
    with pytest.raises(ValueError, match="moeblazer"):
        transformers.AutoModelForCausalLM.from_config(small_config("qwen3_moe"), experts_implementation="moeblazer")


def _routing(T, E, K, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
    w = torch.rand(T, K, generator=g).softmax(-1)
    return ids, w


@pytest.mark.parametrize("family", FAMILIES)
def test_layout_mapping_matches_the_models_eager_experts(family):
    """What the backend hands the kernels (fused gate_up read in place; GPT-OSS reordered, with
    biases and the clamped SwiGLU) computes what the model's own eager experts compute."""
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(small_config(family), experts_implementation="eager")
    m = experts_modules(model)[0]
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.5)
    spec = mhf.experts_spec(m)
    T, K = 37, 2
    x = torch.randn(T, spec.hidden)
    ids, w = _routing(T, spec.experts, K, 1)
    want = m(x, ids, w)
    if spec.layout == "gate_up":
        got = ref_moe(x, ids, w, m.gate_up_proj, None, m.down_proj, spec.activation)
    elif spec.layout == "up":
        got = ref_moe(x, ids, w, m.up_proj, None, m.down_proj, spec.activation)
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            w13, w2, b13, b2 = mhf._gpt_oss_weights(m, spec)
        got = ref_moe(x, ids, w, w13, None, w2, spec.activation, bias_up=b13, bias_down=b2)
    assert torch.allclose(got, want.float(), rtol=1e-4, atol=1e-4), (got - want).abs().max()


def test_gpt_oss_copy_warns_once_and_names_what_it_copies():
    model = transformers.AutoModelForCausalLM.from_config(small_config("gpt_oss"), experts_implementation="eager")
    m = experts_modules(model)[0]
    spec = mhf.experts_spec(m)
    mhf._warned.discard("gpt_oss_copy")
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        mhf._gpt_oss_weights(m, spec)
        mhf._gpt_oss_weights(m, spec)
    msgs = [str(r.message) for r in rec]
    assert len(msgs) == 1 and "GptOssExperts" in msgs[0] and "[E, d, 2n]" in msgs[0], msgs


def _experts_of(family, dtype=torch.bfloat16):
    model = transformers.AutoModelForCausalLM.from_config(small_config(family), experts_implementation="moeblaze",
                                                          dtype=dtype)
    return experts_modules(model)[0]


def test_bad_inputs_name_the_argument():
    m = _experts_of("qwen3_moe")
    spec = mhf.experts_spec(m)
    T, K = 5, 2
    x = torch.randn(T, spec.hidden, dtype=torch.bfloat16)
    ids, w = _routing(T, spec.experts, K, 2)
    with pytest.raises(moeblaze.InvalidArgument) as e:  # no GPU here: the CPU tensor is refused
        m(x, ids, w.bfloat16())
    assert e.value.argument == "hidden_states" and "CUDA" in str(e.value)
    with pytest.raises(moeblaze.InvalidArgument) as e:
        m(x.float(), ids, w)
    assert e.value.argument == "hidden_states" and "bfloat16" in str(e.value)
    with pytest.raises(moeblaze.InvalidArgument) as e:
        m(x[:, :8], ids, w)
    assert e.value.argument == "hidden_states"
    with pytest.raises(moeblaze.InvalidArgument) as e:
        m(x, ids[:3], w)
    assert e.value.argument == "top_k_index"
    with pytest.raises(moeblaze.InvalidArgument) as e:
        m(x, ids, w[:, :1])
    assert e.value.argument == "top_k_weights"
    with pytest.raises(moeblaze.InvalidArgument) as e:
        m(x, ids.float(), w)
    assert e.value.argument == "top_k_index"


def test_float32_weights_are_refused_with_the_fix():
    m = _experts_of("mixtral", dtype=torch.float32)
    spec = mhf.experts_spec(m)
    x = torch.randn(4, spec.hidden, dtype=torch.bfloat16)
    ids, w = _routing(4, spec.experts, 2, 3)
    with pytest.raises(moeblaze.InvalidArgument, match="dtype=torch.bfloat16") as e:
        m(x, ids, w)
    assert e.value.argument == "weights"


def test_unsupported_math_raises_naming_the_module_and_reason():
    cfg = small_config("qwen3_moe")
    cfg.hidden_act = "gelu"  # exact GELU: moeblaze's is the tanh approximation
    model = transformers.AutoModelForCausalLM.from_config(cfg, experts_implementation="moeblaze")
    m = experts_modules(model)[0]
    with pytest.raises(mhf.UnsupportedExperts, match="Qwen3MoeExperts.*'gelu'"):
        mhf.experts_spec(m)
    cfg.hidden_act = "gelu_pytorch_tanh"
    model = transformers.AutoModelForCausalLM.from_config(cfg, experts_implementation="moeblaze")
    assert mhf.experts_spec(experts_modules(model)[0]).activation == "geglu"


def test_a_custom_gate_is_refused():
    m = _experts_of("qwen3_moe")

    class Odd(type(m)):
        def _apply_gate(self, gate_up):
            return gate_up[..., ::2]

    m.__class__ = Odd
    with pytest.raises(mhf.UnsupportedExperts, match="_apply_gate"):
        mhf.experts_spec(m)


def test_checkpoint_mode_is_checked():
    with pytest.raises(moeblaze.InvalidArgument) as e:
        mhf.set_checkpoint("fast")
    assert e.value.argument == "checkpoint"
    mhf.set_checkpoint("recompute")
    mhf.set_checkpoint("save-h")


def test_functional_fused_gate_up_shape_checks(monkeypatch):
    import moeblaze.torch as mbt
    monkeypatch.setattr(mbt, "_check_devices", lambda **tensors: None)  # CPU tensors here: the shape check is the subject
    E, n, d = 4, 16, 32
    gate_up = torch.zeros(E, 2 * n, d, dtype=torch.bfloat16)
    with pytest.raises(moeblaze.InvalidArgument) as e:  # w1 [E, n, d] with w3=None: not a gate_up
        mbt.moe(torch.zeros(3, d, dtype=torch.bfloat16), gate_up[:, :n], None, torch.zeros(E, d, n),
                topk_ids=torch.zeros(3, 2, dtype=torch.int32), topk_weights=torch.zeros(3, 2))
    assert e.value.argument == "w1" and "fused gate_up" in str(e.value)


@pytest.mark.parametrize("family", FAMILIES)
def test_moe_block_compiles_in_one_graph_with_its_backward(family, monkeypatch):
    """torch.compile(fullgraph=True) of each family's MoE block (router, experts, shared experts)
    traces in one graph, and AOTAutograd's joint graph holds moeblaze's forward and backward
    ops. Traced on the CPU: the CUDA check is lifted and nothing runs (the custom ops' fake
    implementations give the shapes; the compiled graph is recorded, not executed)."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.partitioners import default_partition
    import moeblaze.torch as mbt
    monkeypatch.setattr(mhf, "_check_inputs", lambda *args: None)
    monkeypatch.setattr(mbt, "_check_devices", lambda **tensors: None)
    joint = []

    class Traced(Exception):
        pass

    def partition(graph, *args, **kwargs):
        joint.append(graph)
        return default_partition(graph, *args, **kwargs)

    def compiler(gm, inputs):
        def run(*args):
            raise Traced()
        return run

    model = transformers.AutoModelForCausalLM.from_config(small_config(family), experts_implementation="moeblaze",
                                                          dtype=torch.bfloat16)
    block = model.model.layers[-1].mlp
    x = torch.randn(2, 8, model.config.hidden_size, dtype=torch.bfloat16, requires_grad=True)
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(Traced):
            torch.compile(block, fullgraph=True, backend=aot_autograd(fw_compiler=compiler, bw_compiler=compiler,
                                                                      partition_fn=partition))(x)
    assert len(joint) == 1
    ops = {str(n.target) for n in joint[0].graph.nodes if n.op == "call_function"}
    assert {"moeblaze.forward.default", "moeblaze.backward.default"} <= ops, sorted(o for o in ops if "moe" in o)

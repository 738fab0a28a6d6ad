"""CPU tests of bench/kernel_families.py: kernel -> family mapping for moeblaze and SonicMoE,
per-step sums, the comparison rows and the rendered table."""
import re
from pathlib import Path

import kernel_families as kf

# Kernel names as the generator writes them (generator/kernel_spec.cpp KernelSpec::name).
MB = "mb_{}_E128_K8_d2048_n768"
# QuACK's SM90 GEMM kernels as the SonicMoE payload's precompiled cache names them.
Q_GATED = ("kernel_cutlass_kernel_quackgemm_actGemmGatedSm90_object_at__TiledMMA_ThrLayoutVMNK128211112800_"
           "PermutationMNK____MMAAtom_ThrID1281_ShapeMNK6419216_TVLayoutA12864160164_TVLayoutB1281921601_0")
Q_DGATED = ("kernel_cutlass_kernel_quackgemm_dactGemmDGatedSm90_object_at__TiledMMA_ThrLayoutVMNK1281111000_"
            "PermutationMNK____MMAAtom_ThrID1281_ShapeMNK6416016_TVLayoutA12864160164_TVLayoutB1281601601_0")
Q_PLAIN = ("kernel_cutlass_kernel_quackgemm_default_epiGemmDefaultSm90_object_at__TiledMMA_ThrLayoutVMNK1281111000_"
           "PermutationMNK____MMAAtom_ThrID1281_ShapeMNK6412816_TVLayoutA12864160164_TVLayoutB12_0")


def rec(name, us, phase="forward", step=0, ops=()):
    return {"name": name, "us": us, "phase": phase, "step": step, "ops": list(ops), "shapes": None}


def test_moeblaze_families_come_from_the_generated_names():
    cases = {
        (MB.format("router_logits") + "_128x64x64_w8x1_s4_ws", "forward"): "router",
        (MB.format("router_topk") + "_softmax_renorm", "forward"): "router",
        (MB.format("index_scan"), "forward"): "index_build",
        (MB.format("gate_up") + "_swiglu_128x256x64_w8x1_s4_persist_tmacontig", "forward"): "gate_up",
        (MB.format("gate_up") + "_swiglu_128x256x64_w8x1_s4_persist_tmacontig", "backward"): "recompute",
        (MB.format("down_proj") + "_128x128x64_w8x1_s4_persist", "forward"): "down_proj",
        (MB.format("combine"), "forward"): "combine",
        (MB.format("combine"), "backward"): "dx_combine",
        (MB.format("down_dgrad") + "_swiglu_128x256x64_w8x1_s4_persist", "backward"): "down_dgrad",
        (MB.format("gate_grad") + "_128x128x64_w2x4_s4", "backward"): "gate_grad",
        (MB.format("down_wgrad") + "_128x256x64_w8x1_s4_persist_tmastore", "backward"): "down_wgrad",
        (MB.format("gate_up_wgrad") + "_swiglu_128x256x64_w8x1_s4_persist", "backward"): "gate_up_wgrad",
        (MB.format("gate_up_dgrad") + "_swiglu_128x128x64_w8x1_s4_persist_tmacontig", "backward"): "gate_up_dgrad",
        (MB.format("router_backward") + "_sigmoid_renorm", "backward"): "router_backward",
        (MB.format("router_dgrad") + "_128x64x64_w8x1_s4_ws", "backward"): "router_backward",
        (MB.format("router_wgrad") + "_128x64x64_w8x1_s4_ws", "backward"): "router_backward",
        ("Memset (Device)", "forward"): "other",
        ("void at::native::vectorized_elementwise_kernel<4, ...>", "backward"): "other",
    }
    for (name, phase), want in cases.items():
        got, how = kf.moeblaze_family(name, phase)
        assert got == want, (name, phase, got)
        assert how == ("none" if want == "other" else "name")


def test_moeblaze_kernels_of_an_older_revision_keep_their_families():
    cases = {
        (MB.format("up_proj") + "_swiglu_128x256x64_w8x1_s4_wsp_tma", "forward"): "gate_up",
        (MB.format("up_proj") + "_swiglu_128x256x64_w8x1_s4_wsp_tma", "backward"): "recompute",
        (MB.format("up_wgrad") + "_swiglu_128x256x64_w8x1_s4_wsp", "backward"): "gate_up_wgrad",
        (MB.format("up_dgrad") + "_swiglu_128x128x64_w8x1_s4_wsp_tma", "backward"): "gate_up_dgrad",
    }
    for (name, phase), want in cases.items():
        assert kf.moeblaze_family(name, phase) == (want, "name"), (name, phase)


def test_sonicmoe_custom_ops_decide_the_family():
    fwd = [("sonicmoe::_up_projection_forward", "gate_up"), ("sonicmoe::_down_projection_forward", "down_proj"),
           ("sonicmoe::_router_forward", "combine"), ("triton_kernels::TC_topk_router_metadata", "index_build"),
           ("sonicmoe::_softmax_topk_fwd", "router")]
    for op, want in fwd:
        assert kf.sonicmoe_family("anything", ["quack::inner_op", op, "_UpProjection"], "forward", 0) == (want, "op")
    bwd = [("sonicmoe::_down_projection_backward_weight", "down_wgrad"),
           ("sonicmoe::_up_projection_backward_act", "gate_up_dgrad"),
           ("sonicmoe::_up_projection_backward_weight", "gate_up_wgrad"),
           ("sonicmoe::_token_broadcast_backward", "dx_combine"), ("sonicmoe::_topk_softmax_bwd", "router_backward")]
    for op, want in bwd:
        assert kf.sonicmoe_family(Q_PLAIN, [op], "backward", 7) == (want, "op")


def test_the_dswiglu_op_splits_gemm_from_gate_gradient_work():
    op = ["sonicmoe::_down_projection_backward_act"]
    assert kf.sonicmoe_family(Q_DGATED, op, "backward", 0) == ("down_dgrad", "op")
    assert kf.sonicmoe_family("void at::native::index_elementwise_kernel<...>", ["aten::index"] + op,
                              "backward", 0) == ("gate_grad", "op")


def test_router_gemms_and_autograd_function_kernels():
    assert kf.sonicmoe_family("nvjet_tst_128x64_64x8_1x1_v_bz_TNT", ["aten::mm", "aten::linear"], "forward", 0) == \
        ("router", "op")
    assert kf.sonicmoe_family("nvjet_tst_128x64", ["aten::mm", "MmBackward0"], "backward", 0) == \
        ("router_backward", "op")
    zeros = ["aten::fill_", "aten::zero_", "aten::zeros",
             "autograd::engine::evaluate_function: TC_Softmax_Topk_Router_FunctionBackward"]
    assert kf.sonicmoe_family("Memset (Device)", zeros, "backward", 0) == ("router_backward", "op")


def test_without_ops_the_names_and_the_order_decide():
    assert kf.sonicmoe_family(Q_GATED, [], "forward", 0) == ("gate_up", "name")
    assert kf.sonicmoe_family(Q_DGATED, [], "backward", 0) == ("down_dgrad", "name")
    assert kf.sonicmoe_family(Q_PLAIN, [], "forward", 0) == ("down_proj", "order")
    assert [kf.sonicmoe_family(Q_PLAIN, [], "backward", i)[0] for i in range(4)] == \
        ["down_wgrad", "gate_up_dgrad", "gate_up_wgrad", "other"]
    assert kf.sonicmoe_family("token_gather_sum_kernel", [], "forward", 0) == ("combine", "name")
    assert kf.sonicmoe_family("token_gather_sum_kernel", [], "backward", 0) == ("dx_combine", "name")
    assert kf.sonicmoe_family("_softmax_over_topk_bwd_kernel", [], "backward", 0) == ("router_backward", "name")
    assert kf.sonicmoe_family("_compute_col_partial_sum_kernel", [], "forward", 0) == ("index_build", "name")
    assert kf.sonicmoe_family("mystery", [], "forward", 0) == ("other", "none")
    cublas = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_kernel__5x_cublas"
    assert not kf.is_quack_gemm(cublas)
    assert kf.sonicmoe_family(cublas, [], "backward", 0) == ("router_backward", "name")


def test_assign_counts_plain_gemms_per_step_and_phase():
    records = [rec(Q_DGATED, 10, "backward", 0), rec(Q_PLAIN, 10, "backward", 0), rec(Q_PLAIN, 10, "backward", 0),
               rec(Q_PLAIN, 10, "backward", 0), rec(Q_PLAIN, 10, "backward", 1), rec(Q_PLAIN, 10, "forward", 1)]
    fams = [r["family"] for r in kf.assign(records, "sonicmoe")]
    assert fams == ["down_dgrad", "down_wgrad", "gate_up_dgrad", "gate_up_wgrad", "down_wgrad", "down_proj"]


def test_family_ms_is_the_median_over_steps_with_absent_families_as_zero():
    records = []
    for step, up_us in enumerate([1000, 3000, 2000]):
        records.append(rec(MB.format("gate_up") + "_swiglu_t", up_us, "forward", step))
        records.append(rec(MB.format("down_wgrad") + "_t", 500, "backward", step))
    records.append(rec("Memset (Device)", 900, "forward", 2))  # in one step only: median 0
    fams = kf.family_ms(kf.assign(records, "moeblaze"))
    assert fams["gate_up"] == 2.0 and fams["down_wgrad"] == 0.5
    assert fams["other"] == 0.0
    assert fams["gemms"] == 2.5
    assert abs(fams["total"] - 3.4) < 1e-9  # the median of the step totals 1.5, 3.5 and 3.4 ms


def test_comparison_ratio_is_theirs_over_ours_and_skips_empty_families():
    rows = {r["family"]: r for r in kf.comparison({"gate_up": 3.0, "down_dgrad": 2.0, "gemms": 5.0, "total": 6.0},
                                                  {"gate_up": 2.4, "down_dgrad": 1.65, "gemms": 4.05, "total": 5.0})}
    assert abs(rows["gate_up"]["ratio"] - 0.8) < 1e-12
    assert abs(rows["gemms"]["ratio"] - 0.81) < 1e-12
    assert "router" not in rows
    alone = kf.comparison({"gate_up": 3.0, "gemms": 3.0, "total": 3.0}, None)
    assert all(r["sonicmoe_ms"] is None and r["ratio"] is None for r in alone)


def test_render_lists_families_raw_kernels_and_errors():
    ours = kf.assign([rec(MB.format("gate_up") + "_swiglu_t", 3000), rec(MB.format("down_dgrad") + "_swiglu_t", 2000,
                                                                         "backward")], "moeblaze")
    theirs = kf.assign([rec(Q_GATED, 2440, ops=["quack::gemm_gated", "sonicmoe::_up_projection_forward"]),
                        rec(Q_DGATED, 1650, "backward", ops=["sonicmoe::_down_projection_backward_act"])], "sonicmoe")
    result = {"shape": {"name": "qwen3-30b-a3b", "E": 128, "K": 8, "d": 2048, "n": 768}, "tokens": 32768, "steps": 1,
              "device": "H200", "errors": {"megablocks": "peer folder .peers/megablocks not found"}, "impls": {}}
    for impl, recs in (("moeblaze", ours), ("sonicmoe", theirs)):
        top = kf.top_kernels(recs)
        result["impls"][impl] = {"family_ms": kf.family_ms(recs), "top": top, "kernels": top,
                                 "kernels_per_step": len(recs), "step_ms": 1.0}
    md = kf.render(result)
    assert "| gate_up | " in md and "| 3.000 | 2.440 | 0.81x |" in md
    assert "| down_dgrad | " in md and "| 2.000 | 1.650 | 0.82x |" in md
    assert "megablocks did not run:** peer folder" in md
    assert "## sonicmoe: top kernels" in md and "quackgemm_actGemmGated" in md
    assert "| forward | gate_up | op | sonicmoe::_up_projection_forward |" in md
    assert "|" not in kf.short("a|b").replace("/", "")


def test_every_generator_family_has_a_row():
    # The generator's family table (generator/kernel_spec.cpp kFamilies): none may fall to
    # "other", so a family added there without a row here fails this test.
    source = (Path(__file__).resolve().parent.parent / "generator" / "kernel_spec.cpp").read_text()
    generator = re.findall(r'\{KernelFamily::\w+, "(\w+)"', source)
    assert len(generator) >= 16
    for fam in generator:
        for phase in ("forward", "backward"):
            assert kf.moeblaze_family(MB.format(fam) + "_x", phase)[0] in kf.FAMILIES[:-1], fam

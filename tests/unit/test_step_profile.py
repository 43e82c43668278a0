"""The framework-free parts of benchmarks/step_profile.py: what an XLA-compiled instruction is (read from the HLO
text XLA dumps), a torch operator's kind, events summed by name, and the settings' ratios.

No timing is asserted (benchmarks/README.md): the readings are made up here, and what is checked is what is done
with them."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import step_profile
from benchmarks.profilers import OpTime, compiled_kinds, kind_of, summed

# XLA's optimized HLO for jnp.tanh(a @ b).sum() + jnp.exp(a).mean(), as jax 0.10's CPU compiler dumps it (trimmed),
# shortened (layouts, stack frames, backend configs), and a loop whose body holds a dot.
MODULE = """HloModule jit_f, is_scheduled=true, entry_computation_layout={(f32[256,256])->f32[]}

%region_0.1 (reduce_sum.3: f32[], reduce_sum.4: f32[]) -> f32[] {
  %reduce_sum.3 = f32[] parameter(0), metadata={op_name="reduce_sum"}
  ROOT %reduce_sum.5 = f32[] add(%reduce_sum.3, %reduce_sum.4), metadata={op_name="jit(f)/reduce_sum"}
}

%fused_computation.1 (param_1.4: f32[256,256], param_2: f32[256,256]) -> f32[] {
  %param_1.4 = f32[256,256] parameter(1)
  %dot_general.0 = f32[256,256] dot(%param_1.4, %param_2), metadata={op_name="jit(f)/dot_general"}
  ROOT %reduce_sum.1 = f32[] reduce(%tanh.0, %p), dimensions={0,1}, to_apply=%region_0.1, metadata={op_name="jit(f)/reduce_sum"}
}

%fused_computation (param_1.1: f32[256,256]) -> f32[] {
  %exp.0 = f32[256,256] exponential(%param_1.1), metadata={op_name="jit(f)/exp"}
  ROOT %reduce_sum.0 = f32[] reduce(%exp.0, %param_0.1), dimensions={0,1}, to_apply=%region_1.2
}

%body (p: (s32[], f32[8,8])) -> (s32[], f32[8,8]) {
  %dot.7 = f32[8,8]{1,0} dot(%x, %x), metadata={op_name="jit(f)/while/body/dot_general"}
  ROOT %tuple.2 = (s32[], f32[8,8]) tuple(%i, %dot.7)
}

ENTRY %main.3 (a.1: f32[256,256], b.1: f32[256,256]) -> f32[] {
  %ynn_fusion.1 = f32[] fusion(%c, %a.1, %b.1), kind=kCustom, calls=%fused_computation.1, metadata={op_name="jit(f)/reduce_sum"}
  %ynn_fusion = f32[] fusion(%c, %a.1), kind=kCustom, calls=%fused_computation, metadata={op_name="jit(f)/reduce_sum"}
  %while.1 = (s32[], f32[8,8]) while(%tuple.1), condition=%cond, body=%body, metadata={op_name="jit(f)/while"}
  ROOT %multiply_add_fusion = f32[] fusion(%ynn_fusion.1, %ynn_fusion), kind=kLoop, calls=%fused_computation.2, metadata={op_name="jit(f)/add"}
}
"""  # noqa: E501


def test_a_fusion_holding_a_dot_is_a_matmul_named_for_the_dot_and_a_loop_is_control_flow(tmp_path: Path) -> None:
    (tmp_path / "module_0004.jit_f.cpu_after_optimizations.txt").write_text(MODULE)
    (tmp_path / "module_0004.jit_f.before_optimizations.txt").write_text(MODULE.replace("jit_f", "ignored"))
    kinds = compiled_kinds(tmp_path)
    assert kinds["jit_f", "ynn_fusion.1"] == ("matmul", "jit(f)/dot_general")
    assert kinds["jit_f", "ynn_fusion"] == ("other", "jit(f)/reduce_sum")  # YNNPACK fuses reductions too
    assert kinds["jit_f", "multiply_add_fusion"] == ("other", "jit(f)/add")
    assert kinds["jit_f", "dot.7"] == ("matmul", "jit(f)/while/body/dot_general")
    assert kinds["jit_f", "while.1"] == ("control flow", "jit(f)/while")
    assert not any(module == "ignored" for module, _ in kinds)
    assert kind_of(OpTime("ynn_fusion.1", 1.0, 1, "jit_f"), kinds) == ("matmul", "jit(f)/dot_general")
    assert kind_of(OpTime("fusion.9", 1.0, 1, "jit_other"), kinds) == ("other", "?")


@pytest.mark.parametrize(("name", "kind"), [("aten::mm", "matmul"), ("aten::addmm", "matmul"), ("aten::bmm", "matmul"),
                                            ("aten::mkldnn_convolution", "matmul"), ("aten::mul", "other"),
                                            ("aten::_softmax", "other"), ("aten::mmx", "other")])
def test_a_torch_operator_is_a_matmul_by_its_name(name: str, kind: str) -> None:
    assert kind_of(OpTime(name, 1.0, 1), {}) == (kind, name)


def test_events_are_summed_by_module_and_name_longest_first() -> None:
    ops = summed([("m", "dot.1", 0.5), ("m", "fusion", 0.25), ("m", "dot.1", 0.5), ("n", "dot.1", 0.1)])
    assert [(op.module, op.name, op.seconds, op.calls) for op in ops] == \
        [("m", "dot.1", 1.0, 2), ("m", "fusion", 0.25, 1), ("n", "dot.1", 0.1, 1)]


def timed(setting: str, seconds: list[float]) -> dict:
    return {"setting": setting, "cases": [{"model": "attention", "steps_per_epoch": 10, "epoch_seconds": seconds}]}


def test_each_setting_is_its_steady_step_against_the_pipelines_repeat_by_repeat() -> None:
    one = "1 thread"
    results = [timed(step_profile.PIPELINE, [9.0, 1.0, 1.2, 1.1]), timed(one, [9.0, 2.0, 2.2, 2.0]),
               timed(one, [9.0, 3.0, 3.0, 3.0]), timed(step_profile.PIPELINE, [9.0, 2.0, 2.0, 2.0])]
    rows = {row["setting"]: row for row in step_profile.setting_rows({"torch": results})}
    assert rows[step_profile.PIPELINE]["ratio_to_pipeline"] == 1.0
    assert rows[one]["per_repeat_ms"] == pytest.approx([200.0, 300.0])  # the first epoch left out: median / steps
    assert rows[one]["ratio_range"] == pytest.approx([1.5, 2.0 / 1.1])
    assert rows[one]["ms_per_step"] == pytest.approx(250.0)

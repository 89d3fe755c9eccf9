"""FLOPs read from compiled HLO: convolutions as XLA's own cost analysis counts them, every loop
iteration counted (XLA counts a loop body once), Pallas calls by their cost estimate."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from wanjax.tools.hlo_flops import UnknownTripCount, program_flops


def _compiled(f, *shapes):
    return jax.jit(f).lower(*(jnp.ones(s) for s in shapes)).compile()


@pytest.mark.parametrize(
    ("x", "w", "options"),
    [
        ((2, 3, 9, 11), (4, 3, 3, 3), dict(window_strides=(1, 1), padding="SAME")),
        ((2, 3, 9, 11), (4, 3, 3, 3), dict(window_strides=(2, 3), padding=((2, 1), (0, 2)))),
        ((1, 4, 8, 8), (6, 2, 3, 3), dict(window_strides=(1, 1), padding="SAME", feature_group_count=2)),
        (
            (1, 2, 7, 5),
            (3, 2, 3, 2),
            dict(window_strides=(1, 1), padding=((0, 0), (1, 1)), lhs_dilation=(2, 1), rhs_dilation=(1, 2)),
        ),
    ],
    ids=["same", "strided-padded", "grouped", "dilated"],
)
def test_a_convolution_counts_as_xlas_cost_analysis_counts_it(x, w, options):
    """Only the taps that land on real input elements count (not padding, not dilation holes)."""
    compiled = _compiled(lambda a, b: jax.lax.conv_general_dilated(a, b, **options), x, w)
    assert program_flops(compiled.as_text()) == compiled.cost_analysis()["flops"]


def test_every_iteration_of_a_scan_counts():
    def f(x, layers, q, k):
        y = jax.lax.scan(lambda c, w: (jnp.tanh(c @ w), None), x, layers)[0]
        return y, jnp.einsum("bhqd,bhkd->bhqk", q, k)

    compiled = _compiled(f, (8, 16), (5, 16, 16), (2, 3, 7, 4), (2, 3, 9, 4))
    expected = 5 * 2 * 8 * 16 * 16 + 2 * 2 * 3 * 7 * 9 * 4
    assert program_flops(compiled.as_text()) == expected
    assert compiled.cost_analysis()["flops"] < 2 * 8 * 16 * 16 + 2 * 2 * 3 * 7 * 9 * 4 + 1000  # once


_PALLAS = """HloModule m

%body (p: (s32[], f32[4,4])) -> (s32[], f32[4,4]) {
  %p = (s32[], f32[4,4]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %x = f32[4,4] get-tuple-element(%p), index=1
  %k = f32[4,4] custom-call(%x), custom_call_target="tpu_custom_call", frontend_attributes={kernel_metadata={
"xprof_metadata":"{\\"block_q\\": 128}"
}}, metadata={op_name="jit(step)/while/body/OP_NAME/pallas_call"}, backend_config={CONFIG}
  %one = s32[] constant(1)
  %next = s32[] add(%i, %one)
  ROOT %t = (s32[], f32[4,4]) tuple(%next, %k)
}

%cond (c: (s32[], f32[4,4])) -> pred[] {
  %c = (s32[], f32[4,4]) parameter(0)
  %n = s32[] get-tuple-element(%c), index=0
  %stop = s32[] constant(7)
  ROOT %lt = pred[] compare(%n, %stop), direction=LT
}

ENTRY %main (a: f32[4,4]) -> (s32[], f32[4,4]) {
  %a = f32[4,4] parameter(0)
  %zero = s32[] constant(2)
  %init = (s32[], f32[4,4]) tuple(%zero, %a)
  ROOT %w = (s32[], f32[4,4]) while(%init), condition=%cond, body=%body
}
"""


def _kernel(op_name: str, config: str) -> str:
    return _PALLAS.replace("OP_NAME", op_name).replace("CONFIG", config)


def test_pallas_calls_count_their_estimate_or_their_attention_label_per_iteration():
    """A kernel's metadata spans lines (one starting ``}}``); the loop runs 7 - 2 = 5 times."""
    estimated = _kernel("wanjax_kernel", '"custom_call_config":{"cost_estimate":{"flops":"1000","x":"0"}}')
    assert program_flops(estimated) == 5 * 1000
    labelled = _kernel("attention_splash_B1_Lq32_Lk16_H2_D8_bfloat16/splash", '"flag_configs":[]')
    assert program_flops(labelled) == 5 * 2 * 2 * (2 * 32 * 8 * 16)
    unbounded = labelled.replace("compare(%n, %stop), direction=LT", "compare(%n, %n), direction=NE")
    with pytest.raises(UnknownTripCount):
        program_flops(unbounded)


def test_int8_by_int8_products_are_counted_apart_in_a_tpu_program():
    """W8A8's ``s8 x s8`` dots in the TPU's compiled program (written as convolutions there), each
    iteration of the layer loop counted, beside a bf16 product that is not one of them."""
    from jax.experimental import topologies
    from jax.sharding import SingleDeviceSharding

    from wanjax.tools.hlo_flops import count_flops

    topology = topologies.get_topology_desc(
        topology_name="v6e:1x1", platform="tpu", chips_per_host_bounds=(1, 1, 1)
    )
    on_chip = SingleDeviceSharding(topology.devices[0])

    def f(x, layers, y, w):
        def layer(c, k):
            return (jnp.matmul(c, k, preferred_element_type=jnp.int32) >> 8).astype(jnp.int8), None

        return jax.lax.scan(layer, x, layers)[0], y @ w

    shapes = [
        ((256, 512), jnp.int8),
        ((3, 512, 512), jnp.int8),
        ((256, 512), jnp.bfloat16),
        ((512, 256), jnp.bfloat16),
    ]
    args = [jax.ShapeDtypeStruct(s, d, sharding=on_chip) for s, d in shapes]
    count = count_flops(jax.jit(f).lower(*args).compile().as_text())
    assert count.int8_products == 3
    assert count.int8_flops == 3 * 2 * 256 * 512 * 512
    assert count.flops == count.int8_flops + 2 * 256 * 512 * 256

"""``wanjax tune-attention``: candidate grids, timing, and the cache that attention then reads."""

from __future__ import annotations

import json

import pytest

from wanjax.errors import ConfigError
from wanjax.kernels import tuning
from wanjax.kernels.attention import AttentionSpec
from wanjax.models.registry import transformer_preset
from wanjax.tools.tune_attention import candidates, main, model_problems

pytestmark = pytest.mark.filterwarnings("ignore::wanjax.kernels.attention.InterpretModeWarning")


def test_model_problems_are_the_dit_shapes():
    self_attn, cross = model_problems(transformer_preset("1.3B"), 480, 832, 81)
    assert (self_attn.q_len, self_attn.k_len, self_attn.heads, self_attn.head_dim) == (32760, 32760, 12, 128)
    assert (cross.q_len, cross.k_len) == (32760, 512)
    assert model_problems(transformer_preset("14B"), 720, 1280, 81)[0].q_len == 75600


def test_candidates_nest_and_fit_the_problem():
    _, cross = model_problems(transformer_preset("1.3B"), 480, 832, 81)
    found = candidates(cross)
    assert len(found) == len(set(found)) > 4
    for bq, bkv, compute, inner in found:
        assert bkv == 512 and bkv % compute == 0 and compute % inner == 0 and bq % 128 == 0


def test_refused_off_tpu_without_allow_interpret():
    with pytest.raises(ConfigError, match="run it on a TPU"):
        main(["--model", "tiny"])


@pytest.mark.slow
def test_tunes_stores_and_is_used(tmp_path, capsys):
    path = tmp_path / "tune.json"
    argv = ["--model", "tiny", "--height", "32", "--width", "32", "--frames", "5", "--dtype", "float32"]
    assert main([*argv, "--quick", "--repeats", "1", "--tune_file", str(path), "--allow_interpret"]) == 0
    stored = json.loads(path.read_text())[tuning.device_kind()]
    self_key = tuning.shape_key("splash_exp2", 8, 8, 12, "float32")
    cross_key = tuning.shape_key("splash_exp2", 8, 512, 12, "float32")
    assert set(stored) == {self_key, cross_key}
    assert stored[self_key] == [128, 128, 128, 128]  # the only candidate for 8 tokens
    assert AttentionSpec("splash_exp2", tune_file=str(path)).blocks(cross_key) == tuple(stored[cross_key])
    assert "best" in capsys.readouterr().out

"""Prompt cleaning and tokenisation equal diffusers' prompt_clean and transformers' T5Tokenizer.

The tokenizers are built here: a tiny SentencePiece Unigram model (nmt_nfkc normalisation, T5 ids
<pad>=0, </s>=1, <unk>=2) is trained on a generated corpus and written as a ``tokenizer/`` folder in
two styles: ``legacy`` as the Wan repos ship it (tokenizer.json from transformers 4's T5Converter,
whose pipeline transformers 5 does not use as is) and ``v5`` as transformers 5 saves it.
"""

from __future__ import annotations

import json
import random
import sys
import warnings

import numpy as np
import pytest
from diffusers.pipelines.wan import pipeline_wan
from helpers.tokenizer import LONG, make_tokenizer_dir
from transformers import AutoTokenizer

from wanjax.errors import CheckpointError, ConfigError, WanjaxError
from wanjax.models.tokenizer import basic_clean, load_tokenizer, prompt_clean, whitespace_clean

PROMPTS = {
    "ascii": ["the cat jumps over the lazy dog", "Hello World, running fish!", "kato rise ve zo"],
    "unicode": [
        "東京の猫 写真",
        "café naïve über",
        "ﬁsh ① \uff46\uff55\uff4c\uff4c ωμέγα снег",
        "e\u0301 Å ß İ ǅ 🎉 ✨",
    ],
    "html": [
        "fish &amp; chips",
        "&lt;b&gt;bold&lt;/b&gt; &quot;q&quot; &#39;s&#39;",
        "a &amp;amp; b",
        "cafÃ© Ã¼ber",
    ],
    "whitespace": [
        "  the\t\tcat \n\n dog  ",
        "\u3000fox\u00a0\u2028over\u2009 lazy\x85",
        "a\x1c b\x1f",
        " \t\n ",
    ],
    "empty": ["", "   "],
    "special": ["</s> the <extra_id_0> cat", "x</s>y <pad>", "<unk><extra_id_9>"],
}


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("tokenizers")
    return {style: make_tokenizer_dir(root / style, style) for style in ("legacy", "v5")}


@pytest.fixture(scope="module", params=["legacy", "v5"])
def pair(request, dirs):
    """(ours, transformers' tokenizer) on the same folder."""
    path = dirs[request.param]
    return load_tokenizer(path), AutoTokenizer.from_pretrained(path)


def reference(ref, texts, max_length):
    out = ref(
        texts,
        padding="max_length",
        max_length=max_length,
        truncation=True,
        add_special_tokens=True,
        return_attention_mask=True,
    )
    return np.array(out["input_ids"]), np.array(out["attention_mask"])


def test_reference_pipeline_uses_ftfy():
    assert pipeline_wan.is_ftfy_available()  # otherwise the reference silently skips fix_text


def test_prompt_clean_matches_diffusers():
    spaces = [chr(c) for c in range(sys.maxunicode + 1) if chr(c).isspace() or chr(c) in "\u200b\u180e\ufeff"]
    texts = [f"{s}a{s}{s}b {s}" for s in spaces] + [s for group in PROMPTS.values() for s in group] + [LONG]
    for text in texts:
        assert whitespace_clean(text) == pipeline_wan.whitespace_clean(text), repr(text)
        assert basic_clean(text) == pipeline_wan.basic_clean(text), repr(text)
        assert prompt_clean(text) == pipeline_wan.prompt_clean(text), repr(text)


@pytest.mark.parametrize("kind", list(PROMPTS))
@pytest.mark.parametrize("max_length", [512, 12])
def test_ids_and_mask_match_transformers(pair, kind, max_length):
    ours, ref = pair
    texts = PROMPTS[kind]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # some prompts exceed 12 tokens
        tokens = ours(texts, max_length)
    ids, mask = reference(ref, [pipeline_wan.prompt_clean(t) for t in texts], max_length)
    assert tokens.ids.dtype == np.int32 and tokens.ids.shape == (len(texts), max_length)
    np.testing.assert_array_equal(tokens.ids, ids)
    np.testing.assert_array_equal(tokens.mask, mask)
    np.testing.assert_array_equal(tokens.lengths, mask.sum(-1))


def test_uncleaned_random_text_matches_transformers(pair):
    """Without cleaning, whitespace and normalisation differences of the pipeline show up."""
    ours, ref = pair
    rng = random.Random(1)
    alphabet = [*"abcdefg tkrsoneqzu ", "café", "東京", "猫", "  ", "\t", "\n", "\r\n", "\u00a0", "\u3000",
                "\u2028", "\u200b", "\ufeff", "\u180e", "¨", "\u00b4", "ﬁ", "①", "\uff46", "🎉", "</s>", "<extra_id_3>",
                "&amp;", "\x1c", "\x85", "e\u0301", "\x00", "\x7f"]  # fmt: skip
    texts = ["".join(rng.choices(alphabet, k=rng.randint(0, 30))) for _ in range(300)]
    tokens = ours(texts, 64, clean=False)
    ids, mask = reference(ref, texts, 64)
    np.testing.assert_array_equal(tokens.ids, ids)
    np.testing.assert_array_equal(tokens.mask, mask)


def test_long_prompt_keeps_eos_last_and_warns(pair):
    ours, ref = pair
    full = len(ref(pipeline_wan.prompt_clean(LONG))["input_ids"])
    assert full > 100
    with pytest.warns(
        UserWarning, match=rf"is {full} tokens long.*last {full - 100} token\(s\) were dropped"
    ):
        tokens = ours([LONG, "cat"], 100)
    ids, mask = reference(ref, [pipeline_wan.prompt_clean(LONG), "cat"], 100)
    np.testing.assert_array_equal(tokens.ids, ids)
    np.testing.assert_array_equal(tokens.mask, mask)
    assert tokens.ids[0, -1] == 1 and tokens.mask[0].all()


def test_length_is_transformers_token_count_of_the_cleaned_prompt(pair):
    ours, ref = pair
    for text in (LONG, "cat", "", "  A cat &amp; a dog  "):
        assert ours.length(text) == len(ref(pipeline_wan.prompt_clean(text))["input_ids"]), text


def test_prompt_of_exactly_max_length_does_not_warn(pair):
    ours, ref = pair
    exact = len(ref(pipeline_wan.prompt_clean(LONG))["input_ids"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tokens = ours(LONG, exact)
    assert tokens.mask.all() and tokens.ids[0, -1] == 1


def test_load_from_root_folder_or_file(dirs, tmp_path):
    root = tmp_path / "model"
    (root / "tokenizer").mkdir(parents=True)
    for f in dirs["v5"].iterdir():
        (root / "tokenizer" / f.name).write_bytes(f.read_bytes())
    expected = load_tokenizer(dirs["v5"])("the cat", 8).ids
    for path in (root, root / "tokenizer", root / "tokenizer" / "tokenizer.json"):
        np.testing.assert_array_equal(load_tokenizer(path)("the cat", 8).ids, expected)


def test_errors(dirs, tmp_path):
    only_spm = tmp_path / "spm"
    only_spm.mkdir()
    (only_spm / "spiece.model").write_bytes((dirs["legacy"] / "spiece.model").read_bytes())
    with pytest.raises(CheckpointError, match=r"spiece\.model but no tokenizer\.json"):
        load_tokenizer(only_spm)
    with pytest.raises(CheckpointError, match="does not exist"):
        load_tokenizer(tmp_path / "missing")
    with pytest.raises(CheckpointError, match=r"no tokenizer\.json"):
        load_tokenizer(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    (other / "tokenizer.json").write_bytes((dirs["v5"] / "tokenizer.json").read_bytes())
    (other / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "CLIPTokenizer"}))
    with pytest.raises(ConfigError, match="CLIPTokenizer"):
        load_tokenizer(other)
    tok = load_tokenizer(dirs["v5"])
    with pytest.raises(WanjaxError, match="no prompts"):
        tok([], 8)
    with pytest.raises(WanjaxError, match="at least 1"):
        tok("cat", 0)
    with pytest.raises(TypeError, match="strings"):
        tok(["cat", None], 8)

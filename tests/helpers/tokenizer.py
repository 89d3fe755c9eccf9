"""A T5-style tokenizer folder built here: a tiny SentencePiece Unigram model (nmt_nfkc normalisation, T5
ids <pad>=0, </s>=1, <unk>=2) trained on a generated corpus, written in two styles: ``legacy`` as the Wan
repos ship it (tokenizer.json from transformers 4's T5Converter) and ``v5`` as transformers 5 saves it."""

from __future__ import annotations

import io
import json
import random

from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import Unigram
from transformers import AutoTokenizer

EXTRA_IDS = 10


WORDS = [
    "the", "cat", "dog", "video", "café", "naïve", "über", "東京", "猫", "写真", "снег", "город", "ωμέγα",
    "fish", "running", "jumps", "over", "lazy", "fox", "Hello", "World", "ﬁsh", "①", "\uff46\uff55\uff4c\uff4c", "A",
]  # fmt: skip


SYLLABLES = ["ka", "to", "ri", "sen", "mo", "la", "pre", "ing", "ed", "th", "qu", "zo", "ve", "ne", "st", "er"]  # fmt: skip


def _protobuf_fields(buf: bytes):
    """(field number, value) pairs of one protobuf message (enough to read a SentencePiece model)."""

    def varint(i: int) -> tuple[int, int]:
        value, shift = 0, 0
        while True:
            byte = buf[i]
            i += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                return value, i

    i = 0
    while i < len(buf):
        key, i = varint(i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = varint(i)
        elif wire == 2:
            n, i = varint(i)
            value, i = buf[i : i + n], i + n
        else:
            n = 4 if wire == 5 else 8
            value, i = buf[i : i + n], i + n
        yield number, value


def train_sentencepiece() -> tuple[bytes, list[tuple[str, float]], bytes]:
    """A tiny Unigram model: (serialized proto, [(piece, score)], precompiled charsmap)."""
    import sentencepiece as spm

    rng = random.Random(0)
    words = WORDS + ["".join(rng.choices(SYLLABLES, k=rng.randint(1, 4))) for _ in range(400)]
    lines = [" ".join(rng.choices(words, k=rng.randint(3, 12))) for _ in range(3000)]
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_writer=model,
        vocab_size=300,
        hard_vocab_limit=False,
        model_type="unigram",
        pad_id=0,
        eos_id=1,
        unk_id=2,
        bos_id=-1,
        character_coverage=1.0,
        normalization_rule_name="nmt_nfkc",
        minloglevel=2,
    )
    proto = model.getvalue()
    sp = spm.SentencePieceProcessor(model_proto=proto)
    vocab = [(sp.id_to_piece(i), sp.get_score(i)) for i in range(sp.get_piece_size())]
    normalizer_spec = next(v for n, v in _protobuf_fields(proto) if n == 3)
    charsmap = bytes(next(v for n, v in _protobuf_fields(normalizer_spec) if n == 2))
    return proto, vocab, charsmap


def make_tokenizer_dir(path, style: str = "legacy"):
    """Write a T5-style ``tokenizer/`` folder at ``path`` (see the module docstring); return ``path``."""
    proto, vocab, charsmap = train_sentencepiece()
    extra = [f"<extra_id_{i}>" for i in range(EXTRA_IDS)]
    tok = Tokenizer(Unigram(vocab + [(t, 0.0) for t in reversed(extra)], unk_id=2, byte_fallback=False))
    tok.normalizer = normalizers.Sequence(
        [
            normalizers.Precompiled(charsmap),
            normalizers.Strip(left=False, right=True),
            normalizers.Replace(Regex(" {2,}"), "▁"),
        ]
    )
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    tok.post_processor = processors.TemplateProcessing(
        single=["$A", "</s>"], pair=["$A", "</s>", "$B", "</s>"], special_tokens=[("</s>", 1)]
    )
    specials = ["<pad>", "</s>", "<unk>", *extra]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    (path / "spiece.model").write_bytes(proto)
    added = {
        str(tok.token_to_id(t)): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                                  "single_word": False, "special": True}
        for t in specials
    }  # fmt: skip
    config = {
        "added_tokens_decoder": added,
        "additional_special_tokens": extra,
        "clean_up_tokenization_spaces": True,
        "eos_token": "</s>",
        "extra_ids": EXTRA_IDS,
        "legacy": True,
        "model_max_length": 512,
        "pad_token": "<pad>",
        "sp_model_kwargs": {},
        "tokenizer_class": "T5Tokenizer",
        "unk_token": "<unk>",
    }
    (path / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    if style == "v5":
        tmp = path.parent / (path.name + "_legacy")
        path.rename(tmp)
        AutoTokenizer.from_pretrained(tmp).save_pretrained(path)
    return path


LONG = " ".join(["the cat jumps over the lazy dog", "東京の猫", "café"] * 40)

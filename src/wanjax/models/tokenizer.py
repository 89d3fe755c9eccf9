"""Prompt cleaning and UMT5 tokenisation, exactly as diffusers' ``WanPipeline`` does them.

Cleaning is ``pipeline_wan.prompt_clean``: ``ftfy.fix_text``, HTML-unescape twice, strip, collapse
runs of Unicode whitespace (the ``regex`` module's ``\\s``) to one space, strip again.

Tokenisation reads ``tokenizer/tokenizer.json`` with the ``tokenizers`` library and assembles the
pipeline that transformers 5's ``T5Tokenizer`` builds from that file, which is not the pipeline the
file itself describes: the Unigram vocabulary, added tokens and the SentencePiece ``Precompiled``
normaliser come from the file; the other normalisers are dropped; the pre-tokeniser is
``WhitespaceSplit`` + ``Metaspace("▁", prepend always)``; ``</s>`` is appended. Sequences are
truncated to ``max_length - 1`` tokens before ``</s>`` (so ``</s>`` stays last) and right-padded
with ``<pad>``; the mask is 1 on real tokens, ``</s>`` included.
"""

from __future__ import annotations

import dataclasses
import html
import json
import re
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import ftfy
import numpy as np
import tokenizers
from tokenizers import normalizers, pre_tokenizers, processors

from wanjax.errors import CheckpointError, ConfigError, WanjaxError
from wanjax.io.component import Component
from wanjax.models.defaults import TEXT_LENGTH

# Unicode White_Space, which is what the `regex` module's \s matches (Python's `re` \s also matches
# U+001C..U+001F; str.strip() does strip those, as in the reference).
_WHITESPACE = re.compile("[\t\n\v\f\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]+")

# tokenizer_config.json classes whose transformers implementation this module reproduces.
_T5_CLASSES = (None, "T5Tokenizer", "T5TokenizerFast")


def basic_clean(text: str) -> str:
    """``ftfy.fix_text``, then HTML-unescape twice, then strip."""
    return html.unescape(html.unescape(ftfy.fix_text(text))).strip()


def whitespace_clean(text: str) -> str:
    """Collapse each run of Unicode whitespace to one space, then strip."""
    return _WHITESPACE.sub(" ", text).strip()


def prompt_clean(text: str) -> str:
    """The reference pipeline's prompt cleaning (``whitespace_clean(basic_clean(text))``)."""
    return whitespace_clean(basic_clean(text))


@dataclasses.dataclass(frozen=True)
class TokenBatch:
    """Token ids and attention mask, both ``(B, max_length)`` int32, right-padded."""

    ids: np.ndarray
    mask: np.ndarray

    @property
    def lengths(self) -> np.ndarray:
        """True sequence length of each row (``</s>`` included)."""
        return self.mask.sum(axis=-1)


class Tokenizer:
    """A T5-family SentencePiece (Unigram) tokenizer, equal to transformers' ``T5Tokenizer``.

    ``tokenizer(prompts, max_length)`` cleans each prompt like the pipeline (unless ``clean=False``),
    tokenises, truncates with a warning and pads. Build it with :func:`load_tokenizer`; the
    ``backend`` given here is reconfigured in place (normaliser, pre-tokeniser, post-processor).
    """

    def __init__(self, backend: tokenizers.Tokenizer, eos_token: str = "</s>", pad_token: str = "<pad>"):
        eos_id, pad_id = backend.token_to_id(eos_token), backend.token_to_id(pad_token)
        if eos_id is None or pad_id is None:
            missing = eos_token if eos_id is None else pad_token
            raise CheckpointError(f"tokenizer has no {missing!r} token")
        backend.normalizer = _precompiled_normalizer(backend.normalizer)
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.WhitespaceSplit(),
                pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True),
            ]
        )
        backend.post_processor = processors.TemplateProcessing(
            single=["$A", eos_token], special_tokens=[(eos_token, eos_id)]
        )
        backend.no_truncation()
        backend.no_padding()
        self.backend = backend
        self.eos_id = eos_id
        self.pad_id = pad_id

    @property
    def vocab_size(self) -> int:
        """Number of ids the tokenizer can produce (added tokens included)."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    def length(self, text: str, *, clean: bool = True) -> int:
        """How many tokens ``text`` takes (``</s>`` included), cleaned as :meth:`__call__` cleans it:
        more than the ``max_length`` it is encoded to, and :meth:`__call__` drops the rest."""
        text = prompt_clean(text) if clean else text
        return len(
            self.backend.encode(text, add_special_tokens=False).ids
        ) + self.backend.num_special_tokens_to_add(False)

    def __call__(
        self, texts: str | Sequence[str], max_length: int = TEXT_LENGTH, *, clean: bool = True
    ) -> TokenBatch:
        """Tokenise ``texts`` to ``max_length`` ids each (``</s>`` last, then ``<pad>``)."""
        texts = _as_prompt_list(texts)
        if max_length < 1:
            raise WanjaxError(f"max_sequence_length must be at least 1, got {max_length}")
        if clean:
            texts = [prompt_clean(t) for t in texts]
        specials = self.backend.num_special_tokens_to_add(False)
        budget = max_length - specials
        ids = np.full((len(texts), max_length), self.pad_id, np.int32)
        mask = np.zeros((len(texts), max_length), np.int32)
        for row, (text, enc) in enumerate(
            zip(texts, self.backend.encode_batch(texts, add_special_tokens=False), strict=True)
        ):
            if len(enc.ids) > budget:
                _warn_truncated(row, text, enc, budget, specials)
                enc.truncate(budget)
            seq = self.backend.post_process(enc, add_special_tokens=True).ids
            ids[row, : len(seq)] = seq
            mask[row, : len(seq)] = 1
        return TokenBatch(ids, mask)


def _warn_truncated(row: int, text: str, enc: tokenizers.Encoding, budget: int, specials: int) -> None:
    dropped = len(enc.ids) - budget
    cut = text[enc.offsets[budget][0] :]
    shown = cut if len(cut) <= 80 else cut[:77] + "..."
    warnings.warn(
        f"prompt {row} is {len(enc.ids) + specials} tokens long, more than max_sequence_length="
        f"{budget + specials}: the last {dropped} token(s) were dropped ({shown!r})",
        UserWarning,
        stacklevel=3,
    )


def _as_prompt_list(texts: str | Sequence[str]) -> list[str]:
    texts = [texts] if isinstance(texts, str) else list(texts)
    if not texts:
        raise WanjaxError("no prompts given")
    bad = [type(t).__name__ for t in texts if not isinstance(t, str)]
    if bad:
        raise TypeError(f"prompts must be strings, got {', '.join(sorted(set(bad)))}")
    return texts


def _precompiled_normalizer(normalizer: Any) -> normalizers.Normalizer | None:
    """The SentencePiece ``Precompiled`` normaliser inside ``normalizer`` (``None`` when there is none)."""
    if isinstance(normalizer, normalizers.Precompiled):
        return normalizer
    if isinstance(normalizer, normalizers.Sequence):
        for i in range(len(normalizer)):
            found = _precompiled_normalizer(normalizer[i])
            if found is not None:
                return found
    return None


def _token_name(value: Any, default: str) -> str:
    """A special token from tokenizer_config.json: a string or an AddedToken dict."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else default


TOKENIZER = Component("tokenizer", files=("tokenizer.json",))


def resolve_tokenizer_dir(path: str | Path) -> Path:
    """``path`` may be a model root (with ``tokenizer/``), the tokenizer folder, or its tokenizer.json."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: tokenizer path does not exist")
    if path.is_file():
        return path.parent
    for directory in (path / "tokenizer", path):
        if (directory / "tokenizer.json").exists():
            return directory
        if (directory / "spiece.model").exists():
            raise CheckpointError(
                f"{directory}: has spiece.model but no tokenizer.json; wanjax reads tokenizer.json. Write one "
                "with transformers (needs protobuf): AutoTokenizer.from_pretrained(dir).save_pretrained(dir)"
            )
    raise CheckpointError(f"{path}: no tokenizer.json (expected in {path / 'tokenizer'} or {path})")


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Load the UMT5 tokenizer of a diffusers model (root, ``tokenizer/`` folder or tokenizer.json)."""
    path = Path(path)
    file = path if path.is_file() else resolve_tokenizer_dir(path) / "tokenizer.json"
    config_file = file.parent / "tokenizer_config.json"
    config: dict[str, Any] = {}
    if config_file.exists():
        try:
            config = json.loads(config_file.read_text())
        except json.JSONDecodeError as e:
            raise ConfigError(f"{config_file}: not valid JSON ({e.msg} at line {e.lineno})") from None
    cls = config.get("tokenizer_class")
    if cls not in _T5_CLASSES:
        raise ConfigError(
            f"{config_file}: tokenizer_class {cls!r} is not supported; the UMT5 encoder uses T5Tokenizer"
        )
    try:
        backend = tokenizers.Tokenizer.from_file(str(file))
    except Exception as e:  # the Rust side raises a bare Exception
        raise CheckpointError(f"{file}: cannot read tokenizer ({e})") from None
    if type(backend.model).__name__ != "Unigram":
        raise CheckpointError(
            f"{file}: a {type(backend.model).__name__} model; T5Tokenizer needs a SentencePiece Unigram model"
        )
    return Tokenizer(
        backend,
        eos_token=_token_name(config.get("eos_token"), "</s>"),
        pad_token=_token_name(config.get("pad_token"), "<pad>"),
    )

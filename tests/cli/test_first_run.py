"""What a newcomer meets first: damaged files, Ctrl-C while loading, help, progress, the cache command.

Every failure must be one line naming the file (or the command) and what to do, a non-zero exit
code, no traceback, and nothing half-written left in the cache.
"""
import io
import json

import numpy as np
import pytest
import torch

from jetspec_chat import cli
from jetspec_chat.cli import LoadProgressPrinter, main
from jetspec_chat.engine.draft_head import DraftHeadConfig, build_head
from jetspec_chat.engine.model_config import ModelConfig
from jetspec_chat.engine.models import embedded, model_sources
from jetspec_chat.engine.models.model_sources import resolve_model


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv(embedded.CACHE_ENV, str(root))
    return root


def one_line_error(capsys, argv, code=2) -> str:
    assert main(argv) == code
    err = capsys.readouterr().err
    assert "Traceback" not in err
    *progress, last = err.strip().splitlines()
    assert all(line.startswith("[") and line.endswith("]") for line in progress), err  # phase lines only
    return last


def tiny_gguf(path):
    """A small but well-formed GGUF (qwen2 architecture) written with the gguf package."""
    import gguf

    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_block_count(1)
    w.add_array("tokenizer.ggml.tokens", [f"t{i}" for i in range(256)])
    for i in range(3):
        w.add_tensor(f"blk.0.w{i}", np.random.default_rng(i).random((64, 64), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def nothing_left_in(cache):
    models = cache / "models"
    return not models.exists() or not any(models.iterdir())


def tiny_head_dir(path):
    target = ModelConfig.from_hf(json.loads((model_sources.Path(model_sources.__file__).parent / "configs" /
                                             "tiny-qwen3.json").read_text()))
    head = build_head(DraftHeadConfig.for_target(target, num_layers=1, block_size=8), torch.device("cpu"),
                      torch.float32)
    head.init_random(0)
    head.save(path)
    return path


# --- damaged files ---------------------------------------------------------------------------------


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_corrupt_head_safetensors_is_one_sentence(tmp_path, capsys, damage):
    head = tiny_head_dir(tmp_path / "head")
    weights = head / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2] if damage == "truncated" else b"\x00" * 64)
    line = one_line_error(capsys, ["generate", "random:tiny-qwen3", "--prompt", "x", "--draft-head", str(head)])
    assert str(weights) in line and "truncated or corrupt" in line and "--draft-head none" in line


def test_truncated_gguf_is_one_sentence_and_leaves_nothing(tmp_path, cache, capsys):
    path = tiny_gguf(tmp_path / "model.gguf")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])  # the header is intact, the tensor data is cut short
    line = one_line_error(capsys, ["generate", str(path), "--prompt", "x"])
    assert str(path) in line and "truncated or corrupt" in line and "download or copy it again" in line
    assert nothing_left_in(cache)


def test_gguf_cut_inside_its_header(tmp_path, cache, capsys):
    path = tiny_gguf(tmp_path / "model.gguf")
    path.write_bytes(path.read_bytes()[:20])
    line = one_line_error(capsys, ["generate", str(path), "--prompt", "x"])
    assert str(path) in line and "truncated" in line
    assert nothing_left_in(cache)


def fake_converted_cache(cache, alias="qwen2.5-coder-0.5b") -> embedded.Path:
    """A converted-model cache entry (marker and all) with the tiny qwen2 config and damaged weights."""
    dest = cache / "models" / alias
    dest.mkdir(parents=True)
    config = json.loads((model_sources.Path(model_sources.__file__).parent / "configs" / "tiny-qwen2.json").read_text())
    config.pop("jetspec_random_head")
    (dest / "config.json").write_text(json.dumps(config))
    (dest / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{\"a\": ")  # cut mid-header
    (dest / embedded.MARKER).write_text(json.dumps({"format": embedded.CACHE_FORMAT,
                                                    "source": embedded.EMBEDDED[alias].sha256}))
    return dest


def test_corrupt_converted_cache_names_the_file_and_the_cache_command(cache, capsys):
    dest = fake_converted_cache(cache)
    line = one_line_error(capsys, ["generate", "qwen2.5-coder-0.5b", "--prompt", "x", "--draft-head", "none"])
    assert str(dest / "model.safetensors") in line and "truncated or corrupt" in line
    assert "jetspec-chat cache remove qwen2.5-coder-0.5b" in line


def test_the_app_shows_the_loaders_sentence(cache, tmp_path):
    """The app's loading path (the engine worker on the real engine) shows the same sentences,
    not 'unexpected engine error'."""
    import queue

    from jetspec_chat.ui import engine_worker as ew

    fake_converted_cache(cache)
    truncated = tiny_gguf(tmp_path / "model.gguf")
    truncated.write_bytes(truncated.read_bytes()[:3000])
    for model, expected in (("qwen2.5-coder-0.5b", "model.safetensors is truncated or corrupt"),
                            (str(truncated), "model.gguf is truncated or corrupt")):
        outbox = queue.SimpleQueue()
        worker = ew.EngineWorker(ew.real_backend(), outbox)
        worker._load(ew.LoadCommand(ew.EngineSetup(model, "none", "cpu")))
        items = []
        while not outbox.empty():
            items.append(outbox.get())
        failed = [i for i in items if isinstance(i, ew.EngineLoadFailed)]
        assert len(failed) == 1 and expected in failed[0].message and not failed[0].details, items
        if model.endswith(".gguf"):  # no internal exception names (IndexError, ...)
            assert "Error" not in failed[0].message, failed[0].message


# --- Ctrl-C while loading --------------------------------------------------------------------------


def test_ctrl_c_while_loading_is_one_line_and_exit_130(monkeypatch, capsys):
    from jetspec_chat.engine.models import loader

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(loader, "load_target", interrupted)
    line = one_line_error(capsys, ["generate", "random:tiny-qwen3", "--prompt", "x"], code=130)
    assert line == "[interrupted]"


def test_ctrl_c_during_conversion_leaves_no_staging_dir(tmp_path, cache, monkeypatch, capsys):
    path = tiny_gguf(tmp_path / "model.gguf")

    def half_converted(gguf, out, label, progress):
        (out / "model.safetensors").write_bytes(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(model_sources, "convert_gguf", half_converted)
    assert one_line_error(capsys, ["generate", str(path), "--prompt", "x"], code=130) == "[interrupted]"
    assert nothing_left_in(cache)


def test_a_missing_package_is_one_line(monkeypatch, capsys):
    from jetspec_chat.engine.models import loader

    def missing(*args, **kwargs):
        raise ModuleNotFoundError("No module named 'gguf'", name="gguf")

    monkeypatch.setattr(loader, "load_target", missing)
    line = one_line_error(capsys, ["generate", "random:tiny-qwen3", "--prompt", "x"])
    assert line == "error: the Python package 'gguf' is missing: install it (pip install gguf), then start again"


def test_python_m_ui_has_the_clis_ctrl_c_and_model_check(monkeypatch, capsys):
    """`python -m jetspec_chat.ui` (what --web serves) starts the app through the CLI's entry."""
    from jetspec_chat.ui import __main__ as ui_main
    from jetspec_chat.ui import launch

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(launch, "run", interrupted)
    assert ui_main.main(["--demo"]) == 130
    assert capsys.readouterr().err.strip() == "[interrupted]"
    assert ui_main.main(["genrate"]) == 2  # refused before the app opens, as `jetspec-chat genrate`
    assert "unknown command 'genrate'" in capsys.readouterr().err


# --- help, version, typos --------------------------------------------------------------------------


@pytest.mark.parametrize("argv", [["help"], ["--help"], ["-h"]])
def test_help_prints_the_commands(capsys, argv):
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "usage: jetspec-chat" in out
    for command in ("generate", "bench", "train-head", "cache"):
        assert f"  {command}" in out


def test_help_of_a_command(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["help", "generate"])
    assert exit_.value.code == 0 and "--max-new-tokens" in capsys.readouterr().out


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"jetspec-chat {cli.version()}"


@pytest.mark.parametrize("word,expected", [("genrate", "generate"), ("cahce", "cache"), ("bnech", "bench")])
def test_mistyped_command_is_not_a_model(capsys, word, expected):
    line = one_line_error(capsys, [word])
    assert f"unknown command {word!r}" in line and f"jetspec-chat {expected}" in line


def test_unknown_model_is_refused_before_the_app_opens(capsys):
    line = one_line_error(capsys, ["qwen2.5-coder-05b"])
    assert "Unknown model" in line and "did you mean qwen2.5-coder-0.5b" in line


def test_a_hub_id_or_path_is_never_taken_for_a_command():
    cli.check_model_argument("Qwen/Qwen3-8B")  # no network: only the form is checked
    cli.check_model_argument("random:tiny-qwen3")
    cli.check_model_argument("./genrate")  # a missing path: the app says so (and can retry)


# --- progress --------------------------------------------------------------------------------------


class Stream(io.StringIO):
    def __init__(self, tty):
        super().__init__()
        self.tty = tty

    def isatty(self):
        return self.tty


def feed(progress):
    for i in range(100):
        progress("Assembling m", i / 99)
    progress("Reading the m tokenizer", None)
    progress("ready", 1.0)
    progress.close()


def test_progress_off_a_terminal_is_one_line_per_phase():
    stream = Stream(tty=False)
    feed(LoadProgressPrinter(stream))
    assert stream.getvalue().splitlines() == ["[Assembling m]", "[Reading the m tokenizer]", "[ready in 0 s]"]


def test_progress_on_a_terminal_updates_one_line_with_fraction_and_time():
    stream = Stream(tty=True)
    feed(LoadProgressPrinter(stream))
    lines = stream.getvalue().split("\n")
    assert len([line for line in lines if line]) == 3  # one (rewritten) line per phase
    assert lines[0].endswith("[Assembling m] 100% 0 s") and "\r" in lines[0]
    assert lines[1].endswith("[Reading the m tokenizer] 0 s")
    assert lines[2].endswith("[ready in 0 s]")


def test_a_phase_without_a_fraction_turns_a_spinner():
    stream = Stream(tty=True)
    progress = LoadProgressPrinter(stream)
    progress("Checking m", None)
    drawn = stream.getvalue()
    assert drawn.rstrip()[-1] in LoadProgressPrinter.SPINNER and "%" not in drawn
    progress.close()


# --- the cache command -----------------------------------------------------------------------------


def test_cache_lists_and_removes(cache, capsys, monkeypatch):
    fake_converted_cache(cache)
    stale = cache / "models" / ".tmp-999999999-x-abc"
    stale.mkdir()
    (stale / "x.gguf").write_bytes(b"\x00" * 2000)
    assert main(["cache"]) == 0
    out = capsys.readouterr().out
    assert str(cache / "models") in out and "qwen2.5-coder-0.5b" in out and "converted" in out
    assert ".tmp-999999999-x-abc" in out and "2.0 kB" in out and "interrupted conversion" in out
    assert "weight packages" in out

    monkeypatch.setattr("sys.stdin", io.StringIO(""))  # not a terminal: --yes is needed
    line = one_line_error(capsys, ["cache", "remove", "qwen2.5-coder-0.5b"])
    assert "--yes" in line and (cache / "models" / "qwen2.5-coder-0.5b").exists()
    assert "not in the cache" in one_line_error(capsys, ["cache", "remove", "nope", "--yes"])

    assert main(["cache", "remove", "--all", "--yes"]) == 0
    assert nothing_left_in(cache)

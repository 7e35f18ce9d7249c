"""The generation options are declared once (jetspec_chat/options.py): the app, `generate` and
`bench` agree on every default and range, and an out-of-range value is refused while parsing,
before any model loads."""
import argparse

import pytest

from jetspec_chat import bench_cli, cli
from jetspec_chat.engine.errors import ConfigError
from jetspec_chat.options import OPTIONS
from jetspec_chat.settings import Settings
from jetspec_chat.ui.launch import add_arguments as add_app_arguments

SHARED = ("width", "depth", "tree_algo", "max_new_tokens", "temperature", "top_p", "top_k", "seed", "draft_head",
          "device", "dtype", "max_context", "budget")


def parsers() -> dict[str, argparse.ArgumentParser]:
    app = argparse.ArgumentParser()
    add_app_arguments(app)
    bench = argparse.ArgumentParser()
    bench_cli.add_arguments(bench)
    return {"app": app, "generate": cli.generate_parser(), "bench": bench}


def actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {a.dest: a for a in parser._actions}


def test_every_entry_point_declares_the_shared_options_alike():
    found = {name: actions(p) for name, p in parsers().items()}
    for dest in SHARED:
        have = {name: acts[dest] for name, acts in found.items() if dest in acts}
        assert ({"generate"} if dest == "top_k" else {"app", "generate"}) <= set(have), dest  # no top-k in the app
        option = OPTIONS[dest]
        for name, action in have.items():
            assert action.type is option.type and action.choices == option.choices and action.help == option.help, (
                dest, name)
            # the app keeps unset options None (its saved settings apply); the others use the default
            assert action.default == (None if name == "app" else option.default), (dest, name)
    bench = found["bench"]
    assert {"width", "depth", "tree_algo", "max_new_tokens", "temperature", "top_p", "top_k", "seed"} <= set(bench)


def test_the_apps_settings_default_to_the_declared_defaults():
    s = Settings()
    for dest in ("width", "tree_algo", "temperature", "top_p", "max_new_tokens"):
        assert getattr(s, dest) == OPTIONS[dest].default, dest


@pytest.mark.parametrize("args", [
    ["--depth", "99"], ["--depth", "0"], ["--budget", "0"], ["--budget", "5000"], ["--width", "65"],
    ["--temperature", "-1"], ["--top-p", "0"], ["--top-p", "1.5"], ["--top-k", "-1"], ["--max-new-tokens", "0"],
    ["--tree-algo", "bogus"], ["--dtype", "int3"], ["--max-context", "2"],
])
def test_out_of_range_is_refused_before_loading(args, capsys, monkeypatch):
    def no_load(*a, **k):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr("jetspec_chat.engine.load_engine", no_load)
    for name, parser in parsers().items():
        if args[0].lstrip("-").replace("-", "_") not in actions(parser):
            continue
        with pytest.raises((SystemExit, ConfigError)):
            parser.parse_args(["random:tiny-qwen3", *args])
    capsys.readouterr()
    assert cli.main(["generate", "random:tiny-qwen3", "--prompt", "hi", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1 and err.startswith("error: "), err
    assert args[0] in err


def test_depth_full_means_the_heads_block():
    args = cli.generate_parser().parse_args(["--depth", "full"])
    assert cli.generation_params(args).spec.depth is None
    assert cli.generation_params(cli.generate_parser().parse_args(["--depth", "3"])).spec.depth == 3


def test_no_spec_loads_no_draft_head(monkeypatch, capsys):
    seen = {}
    from jetspec_chat.engine.models import loader

    real = loader.load_engine

    def spy(model, draft_head=None, **kw):
        seen["draft_head"] = draft_head
        return real(model, draft_head, **kw)

    monkeypatch.setattr(loader, "load_engine", spy)
    assert cli.main(["generate", "random:tiny-qwen3", "--no-spec", "--prompt", "hi", "--max-new-tokens", "3",
                     "--device", "cpu", "--json"]) == 0
    assert seen["draft_head"] == "none"

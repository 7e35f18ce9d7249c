"""The generation options are declared once (jetspec_chat/options.py): the app, `generate`,
`bench` and `train-head` agree on every default and range, and an out-of-range value is refused
while parsing, before any model loads."""
import argparse

import pytest

from jetspec_chat import bench_cli, cli, train_cli
from jetspec_chat.engine.errors import ConfigError
from jetspec_chat.options import OPTIONS
from jetspec_chat.settings import Settings
from jetspec_chat.ui.launch import add_arguments as add_app_arguments

SHARED = tuple(OPTIONS)  # every declared option: the app and `generate` take them all (but top-k, not in the app)
# train-head's flags of the same name that mean something else there, each declared apart
TRAIN_OWN = {"dtype": "the frozen target's, no float16", "seed": "the training run's",
             "max_new_tokens": "the data's answers, default 256"}


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


def test_train_head_declares_the_shared_options_alike_or_says_what_it_means():
    p = argparse.ArgumentParser()
    train_cli.add_arguments(p)
    acts = actions(p)
    assert {"device", "temperature", *TRAIN_OWN} <= set(acts)
    for dest, option in OPTIONS.items():
        if dest not in acts or dest in TRAIN_OWN:
            continue
        a = acts[dest]
        assert (a.type, a.choices, a.help, a.default) == (option.type, option.choices, option.help, option.default), dest
    assert acts["max_new_tokens"].type is OPTIONS["max_new_tokens"].type  # its own default, the declared range
    assert set(acts["dtype"].choices) < set(OPTIONS["dtype"].choices)
    assert acts["eval_width"].type is OPTIONS["width"].type


def test_the_apps_settings_default_to_the_declared_defaults():
    s = Settings()
    shared = [dest for dest in OPTIONS if hasattr(s, dest)]
    assert {"width", "depth", "tree_algo", "temperature", "top_p", "seed", "max_new_tokens", "budget"} <= set(shared)
    for dest in shared:
        if dest == "budget":  # None: the device picks it; Settings holds a number and says it is automatic
            assert OPTIONS[dest].default is None and s.budget_auto
            continue
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

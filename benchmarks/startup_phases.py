"""Where a start goes: time each loading phase of MODEL in a fresh process.

    JETSPEC_CHAT_CACHE=DIR python benchmarks/startup_phases.py qwen2.5-coder-0.5b [--device cpu] [--dtype auto]

Run it twice: the first run converts an embedded model (the one-time cost), the second shows a
cached start. The phases are load_engine's, timed one by one.
"""
from __future__ import annotations

import argparse
import time

T0 = time.perf_counter()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    args = p.parse_args()
    last = [T0]

    def lap(name: str) -> None:
        now = time.perf_counter()
        print(f"{name:<34} {now - last[0]:6.2f} s", flush=True)
        last[0] = now

    import torch  # noqa: F401 - timed on its own

    lap("import torch")
    from jetspec_chat.engine.models import loader, model_sources

    lap("import the engine")
    dev = loader.resolve_device(args.device)
    dt = loader.resolve_dtype(args.dtype, dev)
    source = model_sources.resolve_model(args.model)
    lap("resolve (convert on first use)")
    target = loader.load_target(source, dev, dt)
    lap(f"build + load weights ({str(dt).removeprefix('torch.')})")
    model_sources.load_tokenizer(source)
    lap("tokenizer")
    loader.load_draft_head(None, source, target.cfg, dev, dt)
    lap("draft head")
    print(f"{'total':<34} {time.perf_counter() - T0:6.2f} s")


if __name__ == "__main__":
    main()

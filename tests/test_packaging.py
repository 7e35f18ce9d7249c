"""The wheel installs engine/ and kernels/ inside jetspec_chat, nothing generic at top level."""
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_layout(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path),
                    str(ROOT)], check=True, timeout=600)
    wheel = next(tmp_path.glob("jetspec_chat-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert not {"engine", "kernels", "themes", "tests"} & tops, tops
    for module in ("jetspec_chat/engine/engine.py", "jetspec_chat/kernels/reference.py", "jetspec_chat/cli.py",
                   "jetspec_chat/engine/models/configs/tiny-qwen3.json",
                   "jetspec_chat/engine/models/heads/qwen2.5-coder-1.5b/model.safetensors",
                   "jetspec_chat/engine/models/heads/qwen2.5-coder-0.5b/config.json"):
        assert module in names, module
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert "jetspec-chat = jetspec_chat.cli:main" in zipfile.ZipFile(wheel).read(entry).decode()
    # every package of the source tree is listed in pyproject.toml's packages
    for folder, prefix in (("jetspec_chat", "jetspec_chat"), ("engine", "jetspec_chat/engine"),
                           ("kernels", "jetspec_chat/kernels")):
        for init in (ROOT / folder).rglob("__init__.py"):
            assert f"{prefix}/{init.relative_to(ROOT / folder).as_posix()}" in names, init

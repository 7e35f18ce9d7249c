"""jetspec-chat: a terminal chat on a lossless tree speculative decoding engine."""
import os as _os
import sys as _sys

__version__ = "0.1.0"

# Run from a source checkout (`python -m jetspec_chat` in its root puts that root on sys.path), the
# checkout's top-level kernels/ folder, installed as jetspec_chat.kernels, would shadow the
# `kernels` distribution that transformers imports (transformers 5.25 depends on it). Our
# own modules never import from the checkout's root, so it leaves sys.path here.
_root = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if _os.path.isfile(_os.path.join(_root, "kernels", "tree_attention.py")):
    _sys.path[:] = [p for p in _sys.path if _os.path.abspath(p or _os.curdir) != _root]

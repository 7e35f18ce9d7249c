"""jetspec-chat: a terminal chat on a lossless tree speculative decoding engine."""
__version__ = "0.1.0"

"""Benchmarks (jetspec-chat bench): end to end and engine only; the method is in BENCH.md here."""

"""Model loading: what a MODEL argument names (hub, local, .gguf, embedded, random), the
embedded models and their shipped heads, tokenizers, and the transformers oracle."""

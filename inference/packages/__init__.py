"""Model packages as files: reading, rewriting, dequantizing and quantizing GGUF files."""

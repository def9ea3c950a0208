"""The bundled MLX trainer: a small Llama-style LM trained data-parallel (DP) or fully sharded (FSDP)."""

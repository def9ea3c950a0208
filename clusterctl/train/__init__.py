"""The bundled MLX trainer: data-parallel and fully sharded (FSDP) training."""

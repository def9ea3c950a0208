"""The bundled MLX trainer: a small Llama-style model of its own or an mlx-lm model (--model), trained data-parallel
(dp, or balanced by speed), fully sharded (fsdp) or ZeRO-3 (zero3); trainer.py for launch commands."""

"""`clusterctl serve`: one model served by mlx-lm across the hosts (docs/serve.md). service.py is the use case;
rank.py is what every rank runs on its host (standard library and mlx-lm only)."""

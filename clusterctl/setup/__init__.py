"""`clusterctl setup`: what a user would otherwise do by hand on every host before a first job: mesh.py
(passwordless SSH between every pair of hosts), python.py (this machine's Python and MLX on every host)."""

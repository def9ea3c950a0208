"""clusterctl bench: collective bandwidth over the real launcher (see measure.py, worker.py, tune.py)."""

"""Detached runs (docs/run.md#close-the-lid-detached-runs): `run --detach` stages the job from here, then hands
it to a supervisor on one of its hosts, which is `clusterctl run` itself, started there detached from any
terminal; `attach` follows it from anywhere with the inventory, and brings its run directory home once it ended.

    handoff.py      what the supervisor is given: the inventory as resolved here, seen from its host, the
                    staged environment and the run's own command line (pure)
    supervisor.py   starting the supervisor on a host (hosts/scripts/detach.py keeps it) and asking how it is
    follow.py       attach: its output from the start, live, then its run directory home
"""

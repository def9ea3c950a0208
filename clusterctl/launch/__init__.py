"""Starting a job on every rank: backends, hostfiles, the launch plan, launchers, supervision, the rank bootstrap."""

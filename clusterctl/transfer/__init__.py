"""Moving files to and from hosts: what ships, rsync, host-side file operations, sync, shards, staging."""

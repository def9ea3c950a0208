"""Raise the open-file soft limit towards the hard one; part of the rank bootstrap (bootstrap.py). launchd gives
a Mac's sshd sessions 256 open files; Open MPI's btl_tcp_links 8 x 31 peers needs ~250 sockets
(docs/facts/macos.md#open-file-limit-256)."""


def raise_nofile():
    # macOS refuses more than kern.maxfilesperproc (often 10240) even under an unlimited hard limit, hence the
    # smaller tries
    try:
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):      # no such limit here: nothing to raise
        return
    for want in (65536, 10240, 4096):
        want = want if hard == resource.RLIM_INFINITY else min(hard, want)
        if soft != resource.RLIM_INFINITY and soft >= want:
            return
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            return
        except (OSError, ValueError):               # above what the kernel allows: try a smaller one
            continue

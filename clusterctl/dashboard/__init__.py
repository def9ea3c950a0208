"""`clusterctl dashboard`: a local web page of the hosts, the runs and the serve endpoints (docs/observe.md).

    state.py      what the page shows (Board), read from what clusterctl keeps (telemetry, run records, rank logs,
                  the index); Board puts together rooms with one job each: HostSamples, CurvesCache, EndedRuns
    sampler.py    the dashboard's one thread: the jobs that fetch (hosts, endpoints' health, detached runs) while a
                  page is open
    endpoints.py  the HTTP client of the running serves' endpoints: which are running, their health, the chat proxy
    app.py        the Starlette application: the token's guard, the JSON and event-stream routes
    server.py     the socket, the token and uvicorn running the application
    static/       the page (index.html, dashboard.js, dashboard.css) and uPlot, the chart library, shipped with the
                  package (MIT, uPlot.LICENSE): no build step, nothing fetched from the internet
"""

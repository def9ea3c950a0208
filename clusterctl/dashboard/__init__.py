"""`clusterctl dashboard`: a local web page of the hosts, the runs and the serve endpoints (docs/observe.md).

    state.py    what the page shows, read from what clusterctl keeps (telemetry, run records, rank logs, the index)
    app.py      the Starlette application: the token's guard, the JSON and event-stream routes, the chat proxy
    server.py   the socket, the token and uvicorn running the application
    static/     the page (index.html, dashboard.js, dashboard.css) and uPlot, the chart library, shipped with the
                package (MIT, uPlot.LICENSE): no build step, nothing fetched from the internet
"""
